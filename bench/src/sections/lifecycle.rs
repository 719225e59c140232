//! ADD, CHECK and DEL latency over many coexisting pods, the cost of one ADD (CPU time and
//! peak RSS of the plugin processes and their children), the first ADD on a fresh node
//! against the later ones, and a burst of concurrent ADDs and DELs.
//!
//! Each repeat builds one fresh node per CNI subject and interleaves them pod by pod
//! (reference pod i, ebpf-cni pod i, reference pod i+1, …), so machine noise hits both.
//! The IPv4 repeats also build a node for ebpf-cni's kernel floor (`bench/floor`: the
//! kernel work of one ADD alone, on ebpf-cni's programs and maps loaded by a first ebpf-cni
//! pod there), whose pods take turns with ebpf-cni's: right after ebpf-cni pod i for even
//! i, right before it (so right after the reference's) for odd i, and their DELs the same.
//! Whatever runs right after the reference chain's ADD (tens of milliseconds of iptables
//! and forks) finds the CPU's caches cold and pays for it; in a fixed order that was always
//! ebpf-cni. ADD and DEL are reported as multiples of the floor.
//! Every pod carries one hostPort and a bandwidth limit in `runtimeConfig`; all pods of a
//! repeat exist at once (ADD all, CHECK all, DEL all).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use ebpf_cni_tests::Netns;

use crate::log::progress;
use crate::metric::Metric;
use crate::model::{Cell, Repeats, Subject, Table};
use crate::params::Params;
use crate::rig::exec::{self, OpCost};
use crate::rig::topo::{self, BenchNode, Binaries, Pod, Stack};
use crate::stats::{median, percentile};

/// The bandwidth limit every lifecycle pod carries (both directions).
const POD_RATE_BPS: u64 = 100_000_000;
const FIRST_HOST_PORT: u16 = 30_000;
const CONCURRENT_FIRST_HOST_PORT: u16 = 32_000;
const FLOOR_FIRST_HOST_PORT: u16 = 31_000;

/// Raw samples for the charts and results.json, pooled over repeats (ms).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Samples {
    pub add_ms: BTreeMap<Subject, Vec<f64>>,
    pub check_ms: BTreeMap<Subject, Vec<f64>>,
    pub del_ms: BTreeMap<Subject, Vec<f64>>,
}

pub struct Output {
    pub latency: Table,
    pub dual_stack: Table,
    pub cost: Table,
    pub concurrency: Table,
    pub samples: Samples,
}

#[derive(Default)]
struct Figures {
    add_p50: Repeats,
    add_p95: Repeats,
    check_p50: Repeats,
    check_p95: Repeats,
    del_p50: Repeats,
    del_p95: Repeats,
    first_add: Repeats,
    later_add: Repeats,
    floor_add: Repeats,
    floor_add_in_process: Repeats,
    add_over_floor: Repeats,
    floor_del: Repeats,
    del_over_floor: Repeats,
    cpu: Repeats,
    rss: Repeats,
    per_plugin: BTreeMap<String, Repeats>,
    conc_add: Repeats,
    conc_del: Repeats,
    conc_ips: Repeats,
    conc_failed: Repeats,
}

pub fn run(p: &Params, bins: &Binaries) -> Output {
    let mut f = Figures::default();
    let mut samples = Samples::default();
    let mut dual = Figures::default();
    let mut dual_samples = Samples::default();
    for rep in 0..p.repeats {
        progress(&format!(
            "lifecycle: repeat {}/{}: {} IPv4 pods per subject, then {} concurrent",
            rep + 1,
            p.repeats,
            p.pods,
            p.concurrent
        ));
        repeat(p, bins, &mut f, &mut samples, Stack::V4, p.pods);
        progress(&format!(
            "lifecycle: repeat {}/{}: {} dual-stack pods per subject",
            rep + 1,
            p.repeats,
            p.dual_pods
        ));
        repeat(
            p,
            bins,
            &mut dual,
            &mut dual_samples,
            Stack::Dual,
            p.dual_pods,
        );
    }

    let n = p.repeats;
    let over = format!("median [min–max] over {n} repeat(s) of the per-repeat figure");
    let mut latency = Table::new("ADD, CHECK, DEL latency", over.clone());
    latency.rows = vec![
        f.add_p50.row(Metric::AddP50),
        f.add_p95.row(Metric::AddP95),
        f.check_p50.row(Metric::CheckP50),
        f.check_p95.row(Metric::CheckP95),
        f.del_p50.row(Metric::DelP50),
        f.del_p95.row(Metric::DelP95),
        f.first_add.row(Metric::FirstAdd),
        f.later_add.row(Metric::LaterAdds),
        f.floor_add.row(Metric::FloorAdd),
        f.floor_add_in_process.row(Metric::FloorAddInProcess),
        f.add_over_floor.row(Metric::AddOverFloor),
        f.floor_del.row(Metric::FloorDel),
        f.del_over_floor.row(Metric::DelOverFloor),
    ];
    latency.notes = vec![
        format!(
            "{} pods per subject and repeat, added one after another and all coexisting; each \
             with one hostPort ({}+i → 80/tcp) and {} Mbit/s ingress and egress in \
             runtimeConfig (containerd's spelling), IPv4 only (dual-stack: next table).",
            p.pods,
            FIRST_HOST_PORT,
            POD_RATE_BPS / 1_000_000
        ),
        "Latency is the runtime's view: from starting the first plugin of the list to the \
         exit of the last one (each plugin forked and reaped with wait4, no polling)."
            .into(),
        "\"first ADD on a fresh node\" is ADD #1 after the node namespace was created (nothing \
         of the subject pinned or installed yet); \"later ADDs\" the p50 of the rest. For \
         ebpf-cni this is the load-strategy figure: the first ADD pays for \
         whatever per-node work the plugin does once."
            .into(),
        "The kernel floor (ebpf-cni's column) is `bench/floor`, a small program that does \
         only the kernel work of one of these ADDs on ebpf-cni's programs and maps, already \
         loaded on its node by a first ebpf-cni pod: the veth pair with its peer created in \
         the pod's namespace (one queue each way on both ends), the pod's address, link up \
         and default route via the gateway (on-link), the endpoint, rate, host port and \
         source check entries, the clsact qdisc with the two bpf filters on the host side \
         while it is down, then the host side up and its host route; one netlink \
         request per message, each acknowledged, as ebpf-cni sends them. It is linked as the \
         released plugin is (statically, against musl) and run as a plugin is (forked into \
         the node namespace, reaped with wait4). Its pods take turns with ebpf-cni's: right \
         after ebpf-cni's pod on even pods, right before it (so right after the reference \
         chain's ADD, which leaves the CPU's caches cold) on odd ones; its DELs (the map \
         entries, then the veth) the same. \"timed inside its process\" leaves out fork, exec and the process \
         start. The IPv4 gateway is the node's, held once on lo: no per-pod work. Not in \
         it: the IPAM lease (a file), ebpf-cni's records (pins), the checks before any \
         change."
            .into(),
    ];

    let mut dual_stack = Table::new("Dual-stack pods (IPv4 + IPv6)", over.clone());
    dual_stack.rows = vec![
        dual.add_p50.row(Metric::AddP50),
        dual.add_p95.row(Metric::AddP95),
        dual.check_p50.row(Metric::CheckP50),
        dual.del_p50.row(Metric::DelP50),
        dual.cpu.row(Metric::AddCpuDualStack),
    ];
    for (plugin, r) in &dual.per_plugin {
        dual_stack.rows.push(r.row(Metric::PluginAdd {
            plugin: plugin.clone(),
        }));
    }
    dual_stack.notes = vec![format!(
        "The same, with an IPv6 range beside the IPv4 one: {} pods per subject and repeat. \
         Wall time well above CPU time is waiting, e.g. for IPv6 duplicate address detection \
         to finish before the plugin returns.",
        p.dual_pods
    )];

    let mut cost = Table::new("Resources of one ADD", over.clone());
    cost.rows = vec![f.cpu.row(Metric::AddCpu), f.rss.row(Metric::AddPeakRss)];
    for (plugin, r) in &f.per_plugin {
        cost.rows.push(r.row(Metric::PluginAdd {
            plugin: plugin.clone(),
        }));
    }
    cost.notes = vec![
        "CPU time and peak RSS come from wait4's rusage of each plugin process, which includes \
         every child it reaped (host-local under ptp, iptables under portmap); CPU is summed \
         over the list's plugins, RSS is the largest single process."
            .into(),
    ];

    let mut concurrency = Table::new(
        &format!(
            "{} concurrent ADDs, then {} concurrent DELs",
            p.concurrent, p.concurrent
        ),
        over,
    );
    concurrency.rows = vec![
        f.conc_add.row(Metric::ConcurrentAdds {
            concurrent: p.concurrent,
        }),
        f.conc_del.row(Metric::ConcurrentDels),
        f.conc_ips.row(Metric::DistinctAddresses),
        f.conc_failed.row(Metric::FailedOperations),
    ];
    concurrency.notes = vec![format!(
        "{} threads released by one barrier each run the whole list for their own pod \
         (hostPort {}+j, same bandwidth limit), on a node that has no other pods.",
        p.concurrent, CONCURRENT_FIRST_HOST_PORT
    )];

    Output {
        latency,
        dual_stack,
        cost,
        concurrency,
        samples,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Per-subject samples of one repeat.
#[derive(Default)]
struct RepeatSamples {
    add: Vec<OpCost>,
    check: Vec<f64>,
    del: Vec<f64>,
}

fn repeat(
    p: &Params,
    bins: &Binaries,
    f: &mut Figures,
    samples: &mut Samples,
    stack: Stack,
    n_pods: usize,
) {
    let mut nodes: Vec<BenchNode> = Vec::new();
    for s in Subject::CNI {
        match BenchNode::with_stack(s, bins, stack) {
            Ok(n) => nodes.push(n),
            Err(e) => fail_all(f, s, &e),
        }
    }
    let mut pods: BTreeMap<Subject, Vec<Pod>> = BTreeMap::new();
    let mut rs: BTreeMap<Subject, RepeatSamples> = BTreeMap::new();
    let mut broken: BTreeSet<Subject> = BTreeSet::new();
    let mut floor = match (&bins.floor, stack) {
        (Some(bin), Stack::V4) => match FloorNode::new(bins, bin) {
            Ok(n) => Some(n),
            Err(e) => {
                fail_floor(f, &e);
                None
            }
        },
        _ => None,
    };
    let mut floor_samples = FloorSamples::default();

    for i in 0..n_pods {
        for node in &nodes {
            let s = node.subject;
            if broken.contains(&s) {
                continue;
            }
            if s == Subject::EbpfCni && FloorTurn::of(i) == FloorTurn::Before {
                floor_add(&mut floor, &mut floor_samples, f, i);
            }
            let caps = topo::caps(&[(FIRST_HOST_PORT + i as u16, 80)], Some(POD_RATE_BPS));
            match node.add_pod(&format!("pod-{i}"), caps) {
                Ok((pod, cost)) => {
                    rs.entry(s).or_default().add.push(cost);
                    pods.entry(s).or_default().push(pod);
                }
                Err(e) => {
                    fail_all(f, s, &e);
                    broken.insert(s);
                }
            }
            if s == Subject::EbpfCni && FloorTurn::of(i) == FloorTurn::After {
                floor_add(&mut floor, &mut floor_samples, f, i);
            }
        }
    }
    for i in 0..n_pods {
        for node in &nodes {
            let s = node.subject;
            let Some(pod) = pods.get(&s).and_then(|v| v.get(i)) else {
                continue;
            };
            match node.check(pod) {
                Ok(c) => rs.entry(s).or_default().check.push(ms(c.wall)),
                Err(e) => {
                    // A subject whose CHECK fails has no CHECK figure; say why once.
                    f.check_p50.set_instead(s, Cell::failed(&e));
                    f.check_p95.set_instead(s, Cell::failed(&e));
                }
            }
        }
    }
    for i in 0..n_pods {
        for node in &nodes {
            let s = node.subject;
            let Some(pod) = pods.get(&s).and_then(|v| v.get(i)) else {
                continue;
            };
            if s == Subject::EbpfCni && FloorTurn::of(i) == FloorTurn::Before {
                floor_del(&mut floor, &mut floor_samples, f, i);
            }
            match node.del(pod) {
                Ok(c) => rs.entry(s).or_default().del.push(ms(c.wall)),
                Err(e) => {
                    f.del_p50.set_instead(s, Cell::failed(&e));
                    f.del_p95.set_instead(s, Cell::failed(&e));
                }
            }
            if s == Subject::EbpfCni && FloorTurn::of(i) == FloorTurn::After {
                floor_del(&mut floor, &mut floor_samples, f, i);
            }
        }
    }
    drop(pods);
    if let Some(fl) = floor.take() {
        if let Err(e) = fl.finish() {
            progress(&format!(
                "lifecycle: kernel floor: DEL of its first pod: {e:#}"
            ));
        }
    }
    floor_samples.summarize(f, rs.get(&Subject::EbpfCni));

    for (s, r) in &rs {
        let s = *s;
        let add: Vec<f64> = r.add.iter().map(|c| ms(c.wall)).collect();
        if !add.is_empty() {
            f.add_p50.push(s, percentile(&add, 50.0));
            f.add_p95.push(s, percentile(&add, 95.0));
            f.first_add.push(s, add[0]);
            if add.len() > 1 {
                f.later_add.push(s, median(&add[1..]));
            }
            let cpu: Vec<f64> = r.add.iter().map(|c| ms(c.cpu)).collect();
            let rss: Vec<f64> = r
                .add
                .iter()
                .map(|c| c.max_rss_kib as f64 / 1024.0)
                .collect();
            f.cpu.push(s, median(&cpu));
            f.rss.push(s, median(&rss));
            let mut per: BTreeMap<String, Vec<f64>> = BTreeMap::new();
            for c in &r.add {
                for (plugin, d) in &c.per_plugin {
                    per.entry(plugin.clone()).or_default().push(ms(*d));
                }
            }
            if per.len() > 1 {
                for (plugin, v) in per {
                    f.per_plugin.entry(plugin).or_default().push(s, median(&v));
                }
            }
            samples.add_ms.entry(s).or_default().extend(&add);
        }
        if !r.check.is_empty() {
            f.check_p50.push(s, percentile(&r.check, 50.0));
            f.check_p95.push(s, percentile(&r.check, 95.0));
            samples.check_ms.entry(s).or_default().extend(&r.check);
        }
        if !r.del.is_empty() {
            f.del_p50.push(s, percentile(&r.del, 50.0));
            f.del_p95.push(s, percentile(&r.del, 95.0));
            samples.del_ms.entry(s).or_default().extend(&r.del);
        }
    }

    for node in nodes.iter().filter(|_| stack == Stack::V4) {
        let s = node.subject;
        if broken.contains(&s) {
            continue;
        }
        if let Err(e) = concurrent(p, node, f) {
            for r in [
                &mut f.conc_add,
                &mut f.conc_del,
                &mut f.conc_ips,
                &mut f.conc_failed,
            ] {
                r.set_instead(s, Cell::failed(&e));
            }
        }
    }
}

/// Where a floor pod's ADD or DEL goes beside ebpf-cni's pod of the same number.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum FloorTurn {
    Before,
    After,
}

impl FloorTurn {
    /// After ebpf-cni's pod on even pods, before it on odd ones (see the module docs).
    fn of(pod: usize) -> Self {
        if pod % 2 == 1 {
            Self::Before
        } else {
            Self::After
        }
    }
}

/// ADD of floor pod `i`; a failure is reported and ends the floor's repeat.
fn floor_add(floor: &mut Option<FloorNode>, samples: &mut FloorSamples, f: &mut Figures, i: usize) {
    let Some(fl) = floor.as_mut() else { return };
    match fl.add(i) {
        Ok(a) => samples.add.push(a),
        Err(e) => {
            fail_floor(f, &e);
            *floor = None;
        }
    }
}

/// DEL of floor pod `i`; a failure is reported and ends the floor's repeat.
fn floor_del(floor: &mut Option<FloorNode>, samples: &mut FloorSamples, f: &mut Figures, i: usize) {
    let Some(fl) = floor.as_mut() else { return };
    match fl.del(i) {
        Ok(Some(d)) => samples.del.push(d),
        Ok(None) => {}
        Err(e) => {
            fail_floor(f, &e);
            *floor = None;
        }
    }
}

/// The kernel floor's samples of one repeat (ms).
#[derive(Default)]
struct FloorSamples {
    add: Vec<FloorAdd>,
    del: Vec<f64>,
}

impl FloorSamples {
    /// The repeat's floor figures, and ebpf-cni's ADD and DEL p50 (`ebpf`) over them.
    fn summarize(&self, f: &mut Figures, ebpf: Option<&RepeatSamples>) {
        let s = Subject::EbpfCni;
        if !self.add.is_empty() {
            let wall: Vec<f64> = self.add.iter().map(|a| a.wall_ms).collect();
            let inside: Vec<f64> = self.add.iter().map(|a| a.in_process_ms).collect();
            let floor = percentile(&wall, 50.0);
            f.floor_add.push(s, floor);
            f.floor_add_in_process.push(s, percentile(&inside, 50.0));
            if let Some(r) = ebpf.filter(|r| !r.add.is_empty()) {
                let add: Vec<f64> = r.add.iter().map(|c| ms(c.wall)).collect();
                f.add_over_floor.push(s, percentile(&add, 50.0) / floor);
            }
        }
        if !self.del.is_empty() {
            let floor = percentile(&self.del, 50.0);
            f.floor_del.push(s, floor);
            if let Some(r) = ebpf.filter(|r| !r.del.is_empty()) {
                f.del_over_floor.push(s, percentile(&r.del, 50.0) / floor);
            }
        }
    }
}

/// One ADD of the kernel floor (ms).
struct FloorAdd {
    wall_ms: f64,
    in_process_ms: f64,
}

/// A pod of the kernel floor: its namespace and what its DEL needs.
struct FloorPod {
    netns: Netns,
    input: String,
    host_ifindex: u32,
}

/// The kernel floor's node: an ebpf-cni node whose programs and maps ebpf-cni's own ADD of
/// a first pod loaded and pinned, where `bench/floor` adds and deletes its pods.
struct FloorNode {
    node: BenchNode,
    seed: Pod,
    bin: PathBuf,
    maps: PathBuf,
    programs: PathBuf,
    pods: BTreeMap<usize, FloorPod>,
    /// The namespaces of deleted floor pods, kept until the repeat ends as the subjects'
    /// pods are: the kernel tears a namespace down in the background, and that work would
    /// land on whichever DEL comes next.
    deleted: Vec<Netns>,
}

impl FloorNode {
    fn new(bins: &Binaries, bin: &Path) -> Result<Self> {
        let node = BenchNode::with_stack(Subject::EbpfCni, bins, Stack::V4)
            .context("kernel floor: its node")?;
        // The first pod loads the programs; it has neither host port nor limit.
        let (seed, _) = node
            .add_pod("floor-first", topo::caps(&[], None))
            .context("kernel floor: ebpf-cni's ADD of its first pod")?;
        let root = ebpf_cni_tests::pin_root_for(node.node.netns().inode());
        let revisions: Vec<PathBuf> = std::fs::read_dir(root.join("programs"))
            .with_context(|| format!("kernel floor: {}", root.display()))?
            .flatten()
            .map(|e| e.path())
            .collect();
        let [programs] = revisions.as_slice() else {
            bail!("kernel floor: not one program revision pinned: {revisions:?}");
        };
        Ok(Self {
            programs: programs.clone(),
            maps: root.join("maps"),
            bin: bin.to_path_buf(),
            seed,
            node,
            pods: BTreeMap::new(),
            deleted: Vec::new(),
        })
    }

    /// Floor pod `i`: 10.88.200.(2 + i), outside what host-local gives the node's one pod.
    fn add(&mut self, i: usize) -> Result<FloorAdd> {
        ensure!(i < 250, "kernel floor: at most 250 pods");
        let netns = self.node.node.new_pod()?;
        let ip = Ipv4Addr::new(10, 88, 200, 2 + i as u8);
        let input = format!(
            "netns={}\nhost=ecnif{i:010x}\nifname={}\nmtu={}\nip={ip}\nprefix=16\n\
             gateway=10.88.0.1\nhost_port={}\npod_port=80\nrate_bps={POD_RATE_BPS}\n\
             burst_bits={}\nmaps={}\nprograms={}\nattachment_id={}\n",
            netns.path().display(),
            topo::IFNAME,
            topo::MTU,
            FLOOR_FIRST_HOST_PORT + i as u16,
            topo::burst_for(POD_RATE_BPS),
            self.maps.display(),
            self.programs.display(),
            0xf100_0000_0000_0000u64 | i as u64,
        );
        let out = self.run("add", &input)?;
        let host_ifindex = value(&out.stdout, "host_ifindex")?;
        let kernel_us: f64 = value(&out.stdout, "kernel_us")?;
        self.pods.insert(
            i,
            FloorPod {
                netns,
                input,
                host_ifindex,
            },
        );
        Ok(FloorAdd {
            wall_ms: ms(out.wall),
            in_process_ms: kernel_us / 1e3,
        })
    }

    /// DEL of floor pod `i` (ms), `None` if it has none.
    fn del(&mut self, i: usize) -> Result<Option<f64>> {
        let Some(pod) = self.pods.remove(&i) else {
            return Ok(None);
        };
        let input = format!("{}host_ifindex={}\n", pod.input, pod.host_ifindex);
        let wall = ms(self.run("del", &input)?.wall);
        self.deleted.push(pod.netns);
        Ok(Some(wall))
    }

    fn run(&self, op: &str, input: &str) -> Result<exec::Exit> {
        let out = exec::run(
            &self.bin,
            &[OsStr::new(op)],
            Some(self.node.node.netns().path()),
            &[],
            input.as_bytes(),
        )?;
        if out.code != Some(0) {
            bail!(
                "kernel floor {op} failed: {}",
                crate::model::first_line(&out.stderr)
            );
        }
        Ok(out)
    }

    /// ebpf-cni's DEL of the first pod: the node's pins go with it.
    fn finish(self) -> Result<()> {
        self.node.del(&self.seed).map(|_| ())
    }
}

/// `key=value` from the floor's output.
fn value<T: std::str::FromStr>(stdout: &str, key: &str) -> Result<T> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("kernel floor printed no {key}: {stdout:?}"))
}

fn fail_floor(f: &mut Figures, e: &anyhow::Error) {
    for r in [
        &mut f.floor_add,
        &mut f.floor_add_in_process,
        &mut f.add_over_floor,
        &mut f.floor_del,
        &mut f.del_over_floor,
    ] {
        r.set_instead(Subject::EbpfCni, Cell::failed(e));
    }
    progress(&format!("lifecycle: kernel floor failed: {e:#}"));
}

fn fail_all(f: &mut Figures, s: Subject, e: &anyhow::Error) {
    for r in [
        &mut f.add_p50,
        &mut f.add_p95,
        &mut f.check_p50,
        &mut f.check_p95,
        &mut f.del_p50,
        &mut f.del_p95,
        &mut f.first_add,
        &mut f.later_add,
        &mut f.cpu,
        &mut f.rss,
        &mut f.conc_add,
        &mut f.conc_del,
        &mut f.conc_ips,
        &mut f.conc_failed,
    ] {
        r.set_instead(s, Cell::failed(e));
    }
    progress(&format!("lifecycle: {} failed: {e:#}", s.label()));
}

fn concurrent(p: &Params, node: &BenchNode, f: &mut Figures) -> Result<()> {
    let s = node.subject;
    let mut pods = Vec::with_capacity(p.concurrent);
    for j in 0..p.concurrent {
        let caps = topo::caps(
            &[(CONCURRENT_FIRST_HOST_PORT + j as u16, 80)],
            Some(POD_RATE_BPS),
        );
        pods.push(node.new_pod(&format!("conc-{j}"), caps)?);
    }

    let barrier = Barrier::new(p.concurrent + 1);
    let (wall_add, results) = std::thread::scope(|sc| {
        let handles: Vec<_> = pods
            .iter()
            .map(|pod| {
                let barrier = &barrier;
                sc.spawn(move || {
                    barrier.wait();
                    node.chain.add(&pod.att)
                })
            })
            .collect();
        barrier.wait();
        let started = Instant::now();
        let results: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("ADD thread panicked"))
            .collect();
        (started.elapsed(), results)
    });
    let mut failed = 0usize;
    let mut first_error = None;
    for (pod, r) in pods.iter_mut().zip(results) {
        match r {
            Ok((v, _)) => pod.cached = Some(v),
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e);
            }
        }
    }
    let ips: BTreeSet<_> = pods.iter().filter_map(|p| p.ip4().ok()).collect();

    let barrier = Barrier::new(p.concurrent + 1);
    let (wall_del, del_results) = std::thread::scope(|sc| {
        let handles: Vec<_> = pods
            .iter()
            .map(|pod| {
                let barrier = &barrier;
                sc.spawn(move || {
                    barrier.wait();
                    node.del(pod)
                })
            })
            .collect();
        barrier.wait();
        let started = Instant::now();
        let results: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("DEL thread panicked"))
            .collect();
        (started.elapsed(), results)
    });
    for r in del_results {
        if let Err(e) = r {
            failed += 1;
            first_error.get_or_insert(e);
        }
    }
    if let Some(e) = &first_error {
        progress(&format!(
            "lifecycle: {}: {failed} concurrent operation(s) failed, first: {e:#}",
            s.label()
        ));
    }
    f.conc_add.push(s, ms(wall_add));
    f.conc_del.push(s, ms(wall_del));
    f.conc_ips.push(s, ips.len() as f64);
    f.conc_failed.push(s, failed as f64);
    Ok(())
}
