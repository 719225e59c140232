//! What a pod → pod connection pays, part by part: TCP_RR and TCP_CRR
//! between two pods of one ebpf-cni node next to a plain veth pair, in short slices that
//! alternate the two, in three states of the node: bare (no host port, no limit: the
//! pods' programs only), with a third pod that has a host port (the socket programs on the
//! cgroup root and the TC programs' host port lookups), and with a fourth pod that has a
//! limit (the pacing program on the cgroup root too). Every repeat builds the states in
//! turn and deletes the two extra pods at its end, so the bare state of the next repeat
//! also proves the node took its cgroup programs off with their last user.
//!
//! Right after the bare state, the same node with the routing floor `ecni_floor_pod` (a
//! netlink filter in front of `ecni_from_pod` on both pods' host veths, detached after):
//! the least a TC program must do to route pod → pod (destination lookup, TTL and MACs,
//! `bpf_redirect_peer`), with `ecni_from_pod`'s own code for those steps and none of its
//! features. Against the veth pair it says what the TC hook and the redirect into the
//! receiver's namespace cost by themselves; the bare state's gap over it is the features.
//!
//! With the kernel's BPF statistics on (`kernel.bpf_stats_enabled`, only while the slices
//! run: they add two clock reads to every program run of the machine) each state also
//! gives `ecni_from_pod`'s run time per packet and the node's cgroup programs' run time
//! per TCP_CRR connection (all of the node's socket and sockops programs, whoever's
//! socket ran them: they sit on the cgroup root, so the veth pair's connections pay them
//! too; the programs of other nodes on the same machine are not counted).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::{Context as _, Result};

use crate::log::progress;
use crate::metric::{Metric, PathFigure, PathPart};
use crate::model::{Cell, Repeats, Subject, Summary, Table};
use crate::params::Params;
use crate::rig::floor::Floor;
use crate::rig::load::{self, EchoServer};
use crate::rig::topo::{self, BenchNode, Binaries, Pod, VethPair};
use crate::sections::source_check::BpfStats;
use crate::stats::percentile;

const ECHO_PORT: u16 = 7000;
const HOST_PORT: u16 = 28_090;
/// Request/response time per state and repeat is split into this many alternating slices.
const RR_SLICES: u32 = 4;
/// The limit of the paced pod (it sends nothing here: its limit only attaches pacing).
const LIMIT_BPS: u64 = 1_000_000_000;

pub struct Output {
    pub table: Table,
}

struct Setup {
    // Servers first: they must stop before their namespaces go.
    _echo: EchoServer,
    _veth_echo: EchoServer,
    floor: Floor,
    a: Pod,
    b_ip: Ipv4Addr,
    _b: Pod,
    pair: VethPair,
    node: BenchNode,
}

impl Setup {
    fn new(bins: &Binaries) -> Result<Self> {
        let node = BenchNode::new(Subject::EbpfCni, bins)?;
        let (a, _) = node.add_pod("path-a", topo::caps(&[], None))?;
        let (b, _) = node.add_pod("path-b", topo::caps(&[], None))?;
        let b_ip = b.ip4()?;
        let echo = EchoServer::start(&b.netns, ECHO_PORT)?;
        // A few tries: the probe's connect waits 1 s, and on this loaded machine the first
        // SYN of a fresh pod sometimes needs its retransmission (the base build too).
        let target = SocketAddr::from((b_ip, ECHO_PORT));
        let mut probe = load::probe_echo(&a.netns, target);
        for _ in 0..4 {
            if probe.is_ok() {
                break;
            }
            probe = load::probe_echo(&a.netns, target);
        }
        probe.context("pod → pod echo")?;
        let pair = VethPair::new()?;
        let veth_echo = EchoServer::start(&pair.b, ECHO_PORT)?;
        let floor = Floor::load(bins, &node, &a, &b)?;
        Ok(Self {
            _echo: echo,
            _veth_echo: veth_echo,
            floor,
            a,
            b_ip,
            _b: b,
            pair,
            node,
        })
    }

    /// Run time (ns) and count of this node's programs by name, from the kernel's
    /// statistics (`bpftool prog show` of each pinned program).
    fn prog_stats(&self) -> Result<BTreeMap<String, (u64, u64)>> {
        let mut m = BTreeMap::new();
        for path in ebpf_cni_tests::dataplane::pinned_programs(&self.node.node) {
            // A program bpftool cannot show is left out.
            let Ok(st) = crate::rig::progstats::pinned(&path) else {
                continue;
            };
            let e = m.entry(st.name).or_insert((0, 0));
            e.0 += st.run_time_ns;
            e.1 += st.run_cnt;
        }
        Ok(m)
    }
}

/// The node's cgroup programs: run on the cgroup root for the machine's sockets.
fn is_cgroup_prog(name: &str) -> bool {
    name.starts_with("ecni_connect")
        || name.starts_with("ecni_sendmsg")
        || name.starts_with("ecni_recvmsg")
        || name.starts_with("ecni_peername")
        || name == "ecni_sockops"
}

/// What one state's slices measured.
#[derive(Default)]
struct Slices {
    lat: BTreeMap<Subject, Vec<f64>>,
    conns: BTreeMap<Subject, (usize, f64)>,
}

fn measure(s: &Setup, slice: Duration, out: &mut Slices) -> Result<()> {
    let targets = [
        (
            Subject::EbpfCni,
            &s.a.netns,
            SocketAddr::from((s.b_ip, ECHO_PORT)),
        ),
        (
            Subject::Veth,
            &s.pair.a,
            SocketAddr::from((topo::VETH_B_IP, ECHO_PORT)),
        ),
    ];
    for _ in 0..RR_SLICES {
        for (subject, ns, target) in targets {
            out.lat
                .entry(subject)
                .or_default()
                .extend(load::tcp_rr(ns, target, slice)?);
            let c = load::tcp_crr(ns, target, slice, usize::MAX)?;
            let e = out.conns.entry(subject).or_default();
            e.0 += c.connect_us.len();
            e.1 += c.secs;
        }
    }
    Ok(())
}

pub fn run(p: &Params, bins: &Binaries) -> Output {
    let mut fig: BTreeMap<(PathFigure, PathPart), Repeats> = BTreeMap::new();
    let fail_all = |fig: &mut BTreeMap<(PathFigure, PathPart), Repeats>, e: &anyhow::Error| {
        for f in PathFigure::ALL {
            for part in PathPart::ALL {
                for s in [Subject::EbpfCni, Subject::Veth] {
                    fig.entry((f, part))
                        .or_default()
                        .set_instead(s, Cell::failed(e));
                }
            }
        }
    };
    let mut setup = match Setup::new(bins) {
        Ok(s) => s,
        Err(e) => {
            progress(&format!("pod path: setting up failed: {e:#}"));
            fail_all(&mut fig, &e);
            return Output {
                table: table(p, fig),
            };
        }
    };
    let slice = Duration::from_secs_f64(p.rr_secs) / RR_SLICES;
    for rep in 0..p.repeats {
        progress(&format!(
            "pod path: repeat {}/{}: RR/CRR {} s per state, pod → pod and veth alternating",
            rep + 1,
            p.repeats,
            p.rr_secs
        ));
        let mut extra: Vec<Pod> = Vec::new();
        for part in PathPart::ALL {
            let added = match part {
                PathPart::Bare => Ok(None),
                PathPart::Floor => setup.floor.attach(&setup.node, true).map(|()| None),
                PathPart::HostPort => setup
                    .node
                    .add_pod("path-hostport", topo::caps(&[(HOST_PORT, 80)], None))
                    .map(|(pod, _)| Some(pod)),
                PathPart::Paced => setup
                    .node
                    .add_pod("path-paced", topo::caps(&[], Some(LIMIT_BPS)))
                    .map(|(pod, _)| Some(pod)),
            };
            match added {
                Ok(pod) => extra.extend(pod),
                Err(e) => {
                    let _ = setup.floor.attach(&setup.node, false);
                    fail_all(&mut fig, &e);
                    break;
                }
            }
            let stats = BpfStats::on();
            let before = setup.prog_stats();
            let floor_before = setup.floor.stats();
            let mut got = Slices::default();
            let r = measure(&setup, slice, &mut got);
            let after = setup.prog_stats();
            let floor_after = setup.floor.stats();
            drop(stats);
            if part == PathPart::Floor {
                if let Err(e) = setup.floor.attach(&setup.node, false) {
                    progress(&format!("pod path: {e:#}"));
                }
            }
            if let Err(e) = r {
                for f in PathFigure::ALL {
                    for s in [Subject::EbpfCni, Subject::Veth] {
                        fig.entry((f, part))
                            .or_default()
                            .set_instead(s, Cell::failed(&e));
                    }
                }
                continue;
            }
            for (s, l) in &got.lat {
                fig.entry((PathFigure::RrP50, part))
                    .or_default()
                    .push(*s, percentile(l, 50.0));
            }
            for (s, (n, secs)) in &got.conns {
                fig.entry((PathFigure::Crr, part))
                    .or_default()
                    .push(*s, *n as f64 / secs);
            }
            let (Ok(before), Ok(after)) = (before, after) else {
                continue;
            };
            let delta = |name: &str| {
                let (t1, c1) = after.get(name).copied().unwrap_or_default();
                let (t0, c0) = before.get(name).copied().unwrap_or_default();
                (t1.saturating_sub(t0), c1.saturating_sub(c0))
            };
            let (t, c) = match (part, floor_before, floor_after) {
                (PathPart::Floor, Ok((t0, c0)), Ok((t1, c1))) => {
                    (t1.saturating_sub(t0), c1.saturating_sub(c0))
                }
                (PathPart::Floor, ..) => (0, 0),
                _ => delta(ebpf_cni_maps_names::FROM_POD),
            };
            if c > 0 {
                fig.entry((PathFigure::FromPodNs, part))
                    .or_default()
                    .push(Subject::EbpfCni, t as f64 / c as f64);
            }
            let cgroup_ns: u64 = after
                .keys()
                .filter(|n| is_cgroup_prog(n))
                .map(|n| delta(n).0)
                .sum();
            let conns: usize = got.conns.values().map(|(n, _)| n).sum();
            if conns > 0 {
                fig.entry((PathFigure::CgroupNsPerConn, part))
                    .or_default()
                    .push(Subject::EbpfCni, cgroup_ns as f64 / conns as f64);
            }
        }
        for pod in extra.iter().rev() {
            if let Err(e) = setup.node.del(pod) {
                progress(&format!("pod path: DEL of an extra pod failed: {e:#}"));
            }
        }
    }
    drop(setup);
    match program_cost(bins) {
        Ok(costs) => {
            for (part, ns) in costs {
                fig.entry((PathFigure::TestRunNs, part))
                    .or_default()
                    .push(Subject::EbpfCni, ns);
            }
        }
        Err(e) => {
            for part in [PathPart::Bare, PathPart::Floor, PathPart::HostPort] {
                fig.entry((PathFigure::TestRunNs, part))
                    .or_default()
                    .set_instead(Subject::EbpfCni, Cell::failed(&e));
            }
        }
    }
    Output {
        table: table(p, fig),
    }
}

/// `ecni_from_pod`'s own run time (and the routing floor's) for one pod → pod TCP segment (1 byte of payload), in
/// the program tests' lab (`progtest`: the object loaded into maps of its own, nothing of
/// a node touched): the kernel's mean over 200 runs of one `BPF_PROG_TEST_RUN`, the median
/// of 40 such calls; with the source check on, on a node without host ports or limits (its
/// switches as the plugin sets them) and then with the node's host port switch on. The frame's source MAC is the one the program writes,
/// so every run passes the check and takes the whole path.
fn program_cost(bins: &Binaries) -> Result<Vec<(PathPart, f64)>> {
    use ebpf_cni_maps::{SourceKey, SourceRule, SOURCE_FAMILY_V4, SOURCE_HEAD_BITS, SOURCE_PASS};
    use ebpf_cni_tests::packet::{Pkt, L4, TCP_ACK};
    // The benchmark's object: the plugin's programs and the routing floor.
    let obj = xtask::build::staged_prototypes(&bins.ebpf_cni);
    let mut lab = ebpf_cni_tests::progtest::Lab::with_object(&obj)
        .with_context(|| format!("the program lab with {}", obj.display()))?;
    let (a, b) = (lab.a.clone(), lab.b.clone());
    let frame = Pkt::new(a.addr(true), b.addr(true), L4::tcp(40_000, 80, TCP_ACK))
        .macs(b.host_mac, a.host_mac)
        .ttl(255)
        .payload(1)
        .frame();
    let mut v4 = [0u8; 16];
    v4[..4].copy_from_slice(&a.v4.octets());
    lab.progs.set_source(
        SOURCE_HEAD_BITS + 32,
        SourceKey {
            ifindex: a.ifindex,
            family: SOURCE_FAMILY_V4,
            addr: v4,
        },
        SourceRule {
            attachment_id: a.attachment_id,
            mac: b.host_mac,
            verdict: SOURCE_PASS,
        },
    );
    let time = |lab: &ebpf_cni_tests::progtest::Lab, prog: &str| -> Result<f64> {
        let mut v = Vec::with_capacity(40);
        for _ in 0..40 {
            v.push(
                lab.time(prog, a.ifindex, &frame, 200)
                    .map_err(|e| anyhow::anyhow!("{e}"))?,
            );
        }
        Ok(percentile(&v, 50.0))
    };
    // As the plugin writes a node without limits: the programs look no limit up.
    lab.no_limits();
    let bare = time(&lab, ebpf_cni_maps_names::FROM_POD)?;
    lab.progs.load_tc(ebpf_cni_maps::PROG_FLOOR_POD)?;
    let floor = time(&lab, ebpf_cni_maps::PROG_FLOOR_POD)?;
    lab.host_ports();
    let host_port = time(&lab, ebpf_cni_maps_names::FROM_POD)?;
    Ok(vec![
        (PathPart::Bare, bare),
        (PathPart::Floor, floor),
        (PathPart::HostPort, host_port),
    ])
}

/// pod → pod's figure over the veth pair's, per repeat (the slices alternate, so each
/// repeat's pair saw the same moment of the machine).
fn of_veth(r: &Repeats, scale: f64) -> Cell {
    let (pod, veth) = (r.values(Subject::EbpfCni), r.values(Subject::Veth));
    if pod.is_empty() || pod.len() != veth.len() {
        return Cell::NotApplicable;
    }
    let ratios: Vec<f64> = pod.iter().zip(veth).map(|(a, b)| a / b * scale).collect();
    Summary::of(&ratios).map_or(Cell::NotApplicable, Cell::Value)
}

fn table(p: &Params, mut fig: BTreeMap<(PathFigure, PathPart), Repeats>) -> Table {
    let mut table = Table::new(
        "Pod → pod against a plain veth pair, part by part",
        format!("median [min–max] over {} repeat(s)", p.repeats),
    );
    for part in PathPart::ALL {
        for f in PathFigure::ALL {
            let metric = Metric::PodPath { figure: f, part };
            let row = match f {
                PathFigure::CrrOfVeth => {
                    let mut row = crate::model::Row::new(metric);
                    let crr = fig.entry((PathFigure::Crr, part)).or_default();
                    row.cells.insert(Subject::EbpfCni, of_veth(crr, 100.0));
                    row
                }
                PathFigure::RrOfVeth => {
                    let mut row = crate::model::Row::new(metric);
                    let rr = fig.entry((PathFigure::RrP50, part)).or_default();
                    row.cells.insert(Subject::EbpfCni, of_veth(rr, 1.0));
                    row
                }
                _ => fig.entry((f, part)).or_default().row(metric),
            };
            table.rows.push(row);
        }
    }
    table.notes = vec![
        format!(
            "One ebpf-cni node, pods a → b (IPv4, no masquerade, source check on), and a plain \
             veth pair, measured in turn: TCP_RR and TCP_CRR as in the dataplane section, {} s \
             per state and repeat in {RR_SLICES} slices alternating pod → pod and the veth \
             pair, client and server pinned to CPU {}. States: bare (no host port, no \
             limit on the node); the routing floor, ecni_floor_pod (the destination's \
             endpoint, TTL and MACs, bpf_redirect_peer, with ecni_from_pod's code for each \
             and nothing else), as a filter in front of both pods' ecni_from_pod on the bare \
             node; + a pod with host port {HOST_PORT}; + a pod limited to {} Mbit/s (its TCP \
             paced). The ratios are per repeat.",
            p.rr_secs,
            load::rr_cpu(),
            LIMIT_BPS / 1_000_000
        ),
        "Run times from the kernel's BPF statistics (run_time_ns / run_cnt), on for the \
         slices only; they include the statistics' own two clock reads per run. \
         ecni_from_pod (ecni_floor_pod in the floor's state) per packet of both TCP_RR \
         and TCP_CRR; the cgroup programs (the \
         node's socket programs and ecni_sockops) summed over every connection of the \
         slices, the veth pair's included, since programs on the cgroup root run for every \
         socket of the machine. Programs other nodes of this machine attached are not \
         counted, but their runs slow both columns alike. BPF_PROG_TEST_RUN: the \
         program alone on one pod → pod TCP segment in the program tests' lab (mean of 200 \
         runs, median of 40 calls; no statistics' clock reads), source check on, on a node \
         without host ports (ecni_from_pod, then the floor) and with."
            .to_owned(),
    ];
    table
}

/// The program names this section reads.
mod ebpf_cni_maps_names {
    pub const FROM_POD: &str = "ecni_from_pod";
}
