//! The source check's cost: pod → pod single-stream TCP throughput (iperf3),
//! TCP_RR and TCP_CRR on two ebpf-cni nodes built alike but for the check, on (the
//! default) on one and `sourceCheck: false` on the other. Both nodes are set up first;
//! every repeat then measures the check on and off in turn, and the request/response time
//! alternates between them in short slices, so a noisy moment hits both.
//!
//! With the check on, `ecni_from_pod` looks every frame up in the source map (one LPM
//! lookup in a trie of the node's pods' entries) and compares its MAC and verdict; off, the
//! pods have no entries, and the same lookup finds the node's trie empty. So the on/off
//! difference is the check's whole cost on this path, less a helper call on an empty map.
//! The traffic figures are end to end, where it drowns in the veth's and the stack's cost;
//! the program's own run time per packet, from the kernel's BPF statistics
//! (`kernel.bpf_stats_enabled`, switched on for the section and back after: it adds two
//! clock reads to every BPF program run on the machine meanwhile), shows it directly.
//!
//! Only ebpf-cni has the check; the reference chain has no column here.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use ebpf_cni_tests::dataplane as dp;
use serde_json::json;

use crate::log::progress;
use crate::metric::{Metric, SourceFigure};
use crate::model::{Cell, Repeats, Subject, Table};
use crate::params::Params;
use crate::rig::load::{self, EchoServer, Iperf3Server, Proto};
use crate::rig::topo::{self, BenchNode, Binaries, Egress, Pod, Stack};
use crate::stats::percentile;

const IPERF_PORT: u16 = 5201;
const ECHO_PORT: u16 = 7000;
/// Request/response time per repeat is split into this many alternating slices.
const RR_SLICES: u32 = 4;
/// The two variants, in the order they alternate.
const VARIANTS: [bool; 2] = [true, false];

pub struct Output {
    pub table: Table,
}

/// One node with two pods, `a` the client and `b` the servers, among `idle` others (their
/// entries fill the source map as a node's pods do).
struct Setup {
    // Servers first: they must stop before their namespaces go.
    _iperf: Iperf3Server,
    _echo: EchoServer,
    a: Pod,
    b_ip: Ipv4Addr,
    _b: Pod,
    _idle: Vec<Pod>,
    node: BenchNode,
}

impl Setup {
    fn new(bins: &Binaries, on: bool, idle: usize) -> Result<Self> {
        let node = BenchNode::with_list(Subject::EbpfCni, bins, Stack::V4, Egress::Routed, |l| {
            l.plugins[0]["sourceCheck"] = json!(on);
        })?;
        let mut others = Vec::with_capacity(idle);
        for i in 0..idle / 2 {
            others.push(
                node.add_pod(&format!("srccheck-idle-{i}"), topo::caps(&[], None))?
                    .0,
            );
        }
        let (a, _) = node.add_pod("srccheck-a", topo::caps(&[], None))?;
        let (b, _) = node.add_pod("srccheck-b", topo::caps(&[], None))?;
        for i in idle / 2..idle {
            others.push(
                node.add_pod(&format!("srccheck-idle-{i}"), topo::caps(&[], None))?
                    .0,
            );
        }
        // What the result says is in force is what this variant measures.
        for pod in [&a, &b] {
            let enabled = pod
                .cached
                .as_ref()
                .and_then(|r| r["sourceCheck"]["enabled"].as_bool());
            ensure!(
                enabled == Some(on),
                "the pod's result says sourceCheck enabled {enabled:?}, the variant is {on}"
            );
        }
        let b_ip = b.ip4()?;
        let iperf = Iperf3Server::start(&b.netns, b_ip, IPERF_PORT)?;
        let echo = EchoServer::start(&b.netns, ECHO_PORT)?;
        load::probe_echo(&a.netns, SocketAddr::from((b_ip, ECHO_PORT)))
            .context("pod → pod echo")?;
        Ok(Self {
            _iperf: iperf,
            _echo: echo,
            a,
            b_ip,
            _b: b,
            _idle: others,
            node,
        })
    }

    /// `ecni_from_pod`'s run time (ns) and run count so far, from the kernel's statistics.
    fn prog_stats(&self) -> Result<(u64, u64)> {
        crate::rig::progstats::of(&self.node, dp::PROG_FROM_POD)
    }
}

/// The kernel's BPF run-time statistics on while it lives, then as they were.
pub(crate) struct BpfStats {
    before: String,
}

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStats {
    pub(crate) fn on() -> Result<Self> {
        let before = std::fs::read_to_string(BPF_STATS).context(BPF_STATS)?;
        std::fs::write(BPF_STATS, "1").context(BPF_STATS)?;
        Ok(Self { before })
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(BPF_STATS, self.before.trim());
    }
}

pub fn run(p: &Params, bins: &Binaries) -> Output {
    let mut fig: BTreeMap<(SourceFigure, bool), Repeats> = BTreeMap::new();
    let mut setups: Vec<(bool, Setup)> = Vec::new();
    for on in VARIANTS {
        match Setup::new(bins, on, p.pods) {
            Ok(s) => setups.push((on, s)),
            Err(e) => {
                progress(&format!(
                    "source check: setting up check {on} failed: {e:#}"
                ));
                for f in SourceFigure::ALL {
                    fig.entry((f, on))
                        .or_default()
                        .set_instead(Subject::EbpfCni, Cell::failed(&e));
                }
            }
        }
    }
    let rr_time = Duration::from_secs_f64(p.rr_secs);
    for rep in 0..p.repeats {
        progress(&format!(
            "source check: repeat {}/{}: iperf3 {} s, RR/CRR {} s, check on and off",
            rep + 1,
            p.repeats,
            p.iperf_secs,
            p.rr_secs
        ));
        for (on, s) in &setups {
            let target = SocketAddr::from((s.b_ip, IPERF_PORT));
            let r = fig.entry((SourceFigure::Throughput, *on)).or_default();
            match load::iperf3(
                &s.a.netns,
                target,
                p.iperf_secs,
                p.iperf_omit,
                false,
                Proto::Tcp,
            ) {
                Ok(res) => r.push(Subject::EbpfCni, res.receiver_bps / 1e9),
                Err(e) => r.set_instead(Subject::EbpfCni, Cell::failed(&e)),
            }
        }
        let slice = rr_time / RR_SLICES;
        let stats = BpfStats::on();
        let before: BTreeMap<bool, Result<(u64, u64)>> =
            setups.iter().map(|(on, s)| (*on, s.prog_stats())).collect();
        let mut lat: BTreeMap<bool, Vec<f64>> = BTreeMap::new();
        let mut conns: BTreeMap<bool, (usize, f64)> = BTreeMap::new();
        for _ in 0..RR_SLICES {
            for (on, s) in &setups {
                let target = SocketAddr::from((s.b_ip, ECHO_PORT));
                let r = load::tcp_rr(&s.a.netns, target, slice).and_then(|l| {
                    lat.entry(*on).or_default().extend(l);
                    load::tcp_crr(&s.a.netns, target, slice, usize::MAX)
                });
                match r {
                    Ok(c) => {
                        let e = conns.entry(*on).or_default();
                        e.0 += c.connect_us.len();
                        e.1 += c.secs;
                    }
                    Err(e) => {
                        for f in [SourceFigure::RrP50, SourceFigure::RrP99, SourceFigure::Crr] {
                            fig.entry((f, *on))
                                .or_default()
                                .set_instead(Subject::EbpfCni, Cell::failed(&e));
                        }
                    }
                }
            }
        }
        for (on, s) in &setups {
            let r = fig.entry((SourceFigure::ProgNs, *on)).or_default();
            let per_packet = stats
                .as_ref()
                .map_err(|e| anyhow::anyhow!("{e:#}"))
                .and_then(|_| {
                    let (ns0, n0) = before[on].as_ref().map_err(|e| anyhow::anyhow!("{e:#}"))?;
                    let (ns1, n1) = s.prog_stats()?;
                    ensure!(n1 > *n0, "ecni_from_pod did not run (statistics off?)");
                    Ok((ns1 - ns0) as f64 / (n1 - n0) as f64)
                });
            match per_packet {
                Ok(ns) => r.push(Subject::EbpfCni, ns),
                Err(e) => r.set_instead(Subject::EbpfCni, Cell::failed(&e)),
            }
        }
        drop(stats);
        for (on, l) in lat {
            for (f, q) in [(SourceFigure::RrP50, 50.0), (SourceFigure::RrP99, 99.0)] {
                fig.entry((f, on))
                    .or_default()
                    .push(Subject::EbpfCni, percentile(&l, q));
            }
        }
        for (on, (n, secs)) in conns {
            fig.entry((SourceFigure::Crr, on))
                .or_default()
                .push(Subject::EbpfCni, n as f64 / secs);
        }
    }
    drop(setups);

    let mut table = Table::new(
        "Source check: cost on the pod → pod path",
        format!("median [min–max] over {} repeat(s)", p.repeats),
    );
    for f in SourceFigure::ALL {
        for on in VARIANTS {
            table.rows.push(
                fig.entry((f, on))
                    .or_default()
                    .row(Metric::SourceCheck { figure: f, on }),
            );
        }
    }
    table.notes = vec![
        format!(
            "Two ebpf-cni nodes alike but for `sourceCheck` (on: the default; off: \
             `sourceCheck: false`), each with the two IPv4 pods measured among {} idle ones \
             (on: {} entries in the source map); iperf3 -t {} -O {}, one TCP stream, MTU {}; \
             TCP_RR and TCP_CRR as in the dataplane section, {} s per figure and repeat in \
             {RR_SLICES} slices alternating the two nodes, client and server pinned to CPU {}.",
            p.pods,
            2 * (p.pods + 2),
            p.iperf_secs,
            p.iperf_omit,
            topo::MTU,
            p.rr_secs,
            load::rr_cpu()
        ),
        "On: one LPM lookup per frame in a trie of the node's entries, then the MAC and \
         address verdict; off: the pods have no entries, the lookup finds the trie empty. The \
         run time per packet is `ecni_from_pod`'s mean over the TCP_RR and TCP_CRR slices \
         (run_time_ns / run_cnt of the kernel's BPF statistics, on for those slices only). \
         The reference chain has no source check, so it has no column here."
            .to_owned(),
    ];
    Output { table }
}
