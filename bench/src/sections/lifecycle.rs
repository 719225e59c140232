//! ADD, CHECK and DEL latency over many coexisting pods, the cost of one ADD (CPU time and
//! peak RSS of the plugin processes and their children), the first ADD on a fresh node
//! against the later ones, and a burst of concurrent ADDs and DELs.
//!
//! Each repeat builds one fresh node per CNI subject and interleaves them pod by pod
//! (reference pod i, ebpf-cni pod i, reference pod i+1, …), so machine noise hits both.
//! Every pod carries one hostPort and a bandwidth limit in `runtimeConfig`; all pods of a
//! repeat exist at once (ADD all, CHECK all, DEL all).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::log::progress;
use crate::metric::Metric;
use crate::model::{Cell, Repeats, Subject, Table};
use crate::params::Params;
use crate::rig::exec::OpCost;
use crate::rig::topo::{self, BenchNode, Binaries, Pod, Stack};
use crate::stats::{median, percentile};

/// The bandwidth limit every lifecycle pod carries (both directions).
const POD_RATE_BPS: u64 = 100_000_000;
const FIRST_HOST_PORT: u16 = 30_000;
const CONCURRENT_FIRST_HOST_PORT: u16 = 32_000;

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
         ebpf-cni this is the load-strategy figure of issue 3: the first ADD pays for \
         whatever per-node work the plugin does once."
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

    for i in 0..n_pods {
        for node in &nodes {
            let s = node.subject;
            if broken.contains(&s) {
                continue;
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
            match node.del(pod) {
                Ok(c) => rs.entry(s).or_default().del.push(ms(c.wall)),
                Err(e) => {
                    f.del_p50.set_instead(s, Cell::failed(&e));
                    f.del_p95.set_instead(s, Cell::failed(&e));
                }
            }
        }
    }
    drop(pods);

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
