//! Pod → pod over netkit: whether netkit devices (Linux 6.7+) take a pod
//! → pod connection past the floor of routing at TC on veth.
//!
//! On veth, a packet from pod a leaves through a's veth into the node's backlog, runs a TC
//! program at the host veth's ingress, and `bpf_redirect_peer` sends it through the receive
//! path a second time in pod b's namespace; a plain veth pair has only the first hop. The
//! pod-path section measures the least any TC program must do there (`ecni_floor_pod`) and
//! finds the goals beyond it. On netkit the program runs in pod a's own transmit, and its
//! redirect out of b's primary device hands the packet to b's side, which takes it through
//! the backlog once, as a veth pair does.
//!
//! One ebpf-cni node, four ways to join two pods, measured in alternating slices (the order
//! reversed every other repeat): a plain veth pair; two of the node's pods as the product
//! runs them; two more with the routing floor at TC in front of their programs; and two
//! pods behind netkit pairs with the same floor as the pairs' peer-side program
//! ([`crate::rig::netkit`]). TCP_RR p50 and TCP_CRR, each as a ratio to the veth pair per
//! repeat, and the two floors' run time per packet.
//!
//! Then traffic leaving the node, where netkit should matter most: on veth a packet for
//! outside crosses the veth's backlog before the host veth's program sends it to the uplink;
//! on netkit the program in the pod's transmit sends it there directly. Three pods reach the
//! node's external host, untranslated, in alternating turns: one the node's kernel forwards
//! (a veth pod with no program, the reference's dataplane without its rules), one of the
//! node's own pods, and a netkit pod running `ecni_from_pod` itself on its pair. Single
//! stream TCP throughput, TCP_RR p50 and TCP_CRR, each as a ratio to the kernel's forwarding
//! per repeat.
//!
//! This machine's kernel is built without netkit, so the run module sends the section to a
//! guest booting [`GUEST_KERNEL`] there.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::{Context as _, Result};
use ebpf_cni_tests::Netns;

use crate::log::progress;
use crate::metric::{ExtFigure, ExtLink, Metric, PathFigure, PodLink};
use crate::model::{Cell, Repeats, Subject, Summary, Table};
use crate::params::Params;
use crate::rig::floor::Floor;
use crate::rig::load::{self, EchoServer, Iperf3Server, Proto};
use crate::rig::netkit::NetkitPods;
use crate::rig::topo::{self, BenchNode, Binaries, Pod, RoutedPod, VethPair};
use crate::sections::source_check::BpfStats;
use crate::stats::percentile;
use crate::turns::in_turn;

/// The kernel of the guest the section runs in where this machine's has no netkit.
pub const GUEST_KERNEL: &str = "6.12";

const ECHO_PORT: u16 = 7000;
const IPERF_PORT: u16 = 5201;
/// The netkit pods' addresses (a and b pod → pod, c to the external host) and the routed
/// pod's with its gateway: outside every pool the benchmark's nodes hand out.
const NETKIT_A_IP: Ipv4Addr = Ipv4Addr::new(10, 251, 0, 2);
const NETKIT_B_IP: Ipv4Addr = Ipv4Addr::new(10, 251, 0, 3);
const NETKIT_C_IP: Ipv4Addr = Ipv4Addr::new(10, 251, 0, 4);
const ROUTED_IP: Ipv4Addr = Ipv4Addr::new(10, 251, 1, 2);
const ROUTED_GW: Ipv4Addr = Ipv4Addr::new(10, 251, 1, 1);
/// Each repeat's time per path is split into this many alternating slices.
const SLICES: u32 = 4;

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Output {
    /// Pod → pod.
    pub table: Table,
    /// Pod → the external host.
    pub ext: Table,
}

struct Setup {
    // Servers first: they must stop before their namespaces go; the netkit pods before the
    // node whose maps hold their entries.
    _echoes: Vec<EchoServer>,
    _iperf: Iperf3Server,
    netkit: NetkitPods,
    floor: Floor,
    /// Each pod → pod path and its server's address (its client: [`Setup::client`]).
    targets: Vec<(PodLink, SocketAddr)>,
    routed: RoutedPod,
    pods: Vec<Pod>,
    pair: VethPair,
    node: BenchNode,
}

impl Setup {
    fn new(bins: &Binaries) -> Result<Self> {
        let node = BenchNode::new(Subject::EbpfCni, bins)?;
        let mut pods = Vec::new();
        for name in ["nk-a", "nk-b", "nk-floor-a", "nk-floor-b"] {
            pods.push(node.add_pod(name, topo::caps(&[], None))?.0);
        }
        let mut floor = Floor::load(bins, &node, &pods[2], &pods[3])?;
        floor.attach(&node, true)?;
        let netkit = NetkitPods::new(
            bins,
            &node,
            &[
                (NETKIT_A_IP, ebpf_cni_maps::PROG_FLOOR_NETKIT),
                (NETKIT_B_IP, ebpf_cni_maps::PROG_FLOOR_NETKIT),
                (NETKIT_C_IP, ebpf_cni_maps::PROG_FROM_POD),
            ],
        )
        .context("the netkit pods")?;
        let routed = RoutedPod::new(node.node.netns(), "kfwd0", ROUTED_IP, ROUTED_GW)
            .context("the kernel-routed pod")?;
        let pair = VethPair::new()?;
        let mut echoes = Vec::new();
        for ns in [
            &pods[1].netns,
            &pods[3].netns,
            &netkit.pods[1],
            &pair.b,
            node.ext(),
        ] {
            echoes.push(EchoServer::start(ns, ECHO_PORT)?);
        }
        let iperf = Iperf3Server::start(node.ext(), topo::EXT_IP, IPERF_PORT)?;
        let at = |ip: Ipv4Addr| SocketAddr::from((ip, ECHO_PORT));
        let targets = vec![
            (PodLink::Veth, at(topo::VETH_B_IP)),
            (PodLink::Product, at(pods[1].ip4()?)),
            (PodLink::TcFloor, at(pods[3].ip4()?)),
            (PodLink::Netkit, at(NETKIT_B_IP)),
        ];
        let s = Self {
            _echoes: echoes,
            _iperf: iperf,
            netkit,
            floor,
            targets,
            routed,
            pods,
            pair,
            node,
        };
        let ext = at(topo::EXT_IP);
        let probes = s
            .targets
            .iter()
            .map(|(link, target)| (link.label(), s.client(*link), *target))
            .chain(
                ExtLink::ALL
                    .iter()
                    .map(|link| (link.label(), s.ext_client(*link), ext)),
            );
        for (what, ns, target) in probes {
            // A few tries: the probe's connect waits 1 s, and a fresh pod's first SYN
            // sometimes needs its retransmission.
            let mut probe = load::probe_echo(ns, target);
            for _ in 0..4 {
                if probe.is_ok() {
                    break;
                }
                probe = load::probe_echo(ns, target);
            }
            probe.with_context(|| format!("{what}: echo"))?;
        }
        Ok(s)
    }

    fn client(&self, link: PodLink) -> &Netns {
        match link {
            PodLink::Veth => &self.pair.a,
            PodLink::Product => &self.pods[0].netns,
            PodLink::TcFloor => &self.pods[2].netns,
            PodLink::Netkit => &self.netkit.pods[0],
        }
    }

    fn ext_client(&self, link: ExtLink) -> &Netns {
        match link {
            ExtLink::Kernel => &self.routed.netns,
            ExtLink::Product => &self.pods[0].netns,
            ExtLink::Netkit => &self.netkit.pods[2],
        }
    }
}

/// Each path's TCP_RR times (µs) and TCP_CRR count and seconds, over one repeat's slices.
struct Slices<L> {
    lat: BTreeMap<L, Vec<f64>>,
    conns: BTreeMap<L, (usize, f64)>,
}

/// TCP_RR and TCP_CRR from each path's client to its echo server, in [`SLICES`] slices of
/// `slice` each, the paths taking turns (in repeat `rep`'s order).
fn rr_and_crr<L: Ord + Copy>(
    paths: &[(L, &Netns, SocketAddr)],
    rep: usize,
    slice: Duration,
) -> Result<Slices<L>> {
    let mut out = Slices {
        lat: BTreeMap::new(),
        conns: BTreeMap::new(),
    };
    for _ in 0..SLICES {
        for (link, ns, target) in in_turn(paths, rep) {
            out.lat
                .entry(*link)
                .or_default()
                .extend(load::tcp_rr(ns, *target, slice)?);
            let c = load::tcp_crr(ns, *target, slice, usize::MAX)?;
            let e = out.conns.entry(*link).or_default();
            e.0 += c.connect_us.len();
            e.1 += c.secs;
        }
    }
    Ok(out)
}

fn measure_repeat(s: &Setup, rep: usize, slice: Duration) -> Result<Slices<PodLink>> {
    let paths: Vec<_> = s
        .targets
        .iter()
        .map(|(link, target)| (*link, s.client(*link), *target))
        .collect();
    rr_and_crr(&paths, rep, slice)
}

/// Each pod → external host path's throughput (Gbit/s), and its TCP_RR and TCP_CRR over
/// alternating slices, over one repeat.
fn measure_ext(
    s: &Setup,
    p: &Params,
    rep: usize,
    slice: Duration,
) -> Result<(BTreeMap<ExtLink, f64>, Slices<ExtLink>)> {
    let iperf = SocketAddr::from((topo::EXT_IP, IPERF_PORT));
    let echo = SocketAddr::from((topo::EXT_IP, ECHO_PORT));
    let mut gbps = BTreeMap::new();
    for link in in_turn(&ExtLink::ALL, rep) {
        let r = load::iperf3(
            s.ext_client(*link),
            iperf,
            p.iperf_secs,
            p.iperf_omit,
            false,
            Proto::Tcp,
        )?;
        gbps.insert(*link, r.receiver_bps / 1e9);
    }
    let paths: Vec<_> = ExtLink::ALL
        .iter()
        .map(|link| (*link, s.ext_client(*link), echo))
        .collect();
    Ok((gbps, rr_and_crr(&paths, rep, slice)?))
}

type PathFigs = BTreeMap<(PathFigure, PodLink), Repeats>;
type ExtFigs = BTreeMap<(ExtFigure, ExtLink), Repeats>;

/// On a machine whose kernel has netkit: the section's figures.
pub fn measure(p: &Params, bins: &Binaries) -> Output {
    let mut fig = PathFigs::new();
    let mut ext = ExtFigs::new();
    let mut setup = match Setup::new(bins) {
        Ok(s) => s,
        Err(e) => {
            progress(&format!("netkit: setting up failed: {e:#}"));
            fail_all(&mut fig, &mut ext, &e);
            return output(p, fig, ext);
        }
    };
    let slice = Duration::from_secs_f64(p.rr_secs) / SLICES;
    for rep in 0..p.repeats {
        progress(&format!(
            "netkit: repeat {}/{}: RR/CRR {} s per path, the four pod → pod paths alternating, \
             then iperf3 {} s and RR/CRR {} s per path to the external host",
            rep + 1,
            p.repeats,
            p.rr_secs,
            p.iperf_secs,
            p.rr_secs
        ));
        let nk = ebpf_cni_maps::PROG_FLOOR_NETKIT;
        let stats = BpfStats::on();
        let before = (setup.floor.stats(), setup.netkit.stats(nk));
        let got = measure_repeat(&setup, rep, slice);
        let after = (setup.floor.stats(), setup.netkit.stats(nk));
        drop(stats);
        match got {
            Ok(got) => {
                record(&mut fig, &got, PathFigure::RrP50, PathFigure::Crr);
                for (link, b, a) in [
                    (PodLink::TcFloor, &before.0, &after.0),
                    (PodLink::Netkit, &before.1, &after.1),
                ] {
                    if let (Ok((t0, c0)), Ok((t1, c1))) = (b, a) {
                        let (t, c) = (t1.saturating_sub(*t0), c1.saturating_sub(*c0));
                        if c > 0 {
                            fig.entry((PathFigure::FromPodNs, link))
                                .or_default()
                                .push(Subject::EbpfCni, t as f64 / c as f64);
                        }
                    }
                }
            }
            Err(e) => {
                progress(&format!("netkit: repeat {}, pod → pod: {e:#}", rep + 1));
                for link in PodLink::ALL {
                    for f in [PathFigure::RrP50, PathFigure::Crr] {
                        fig.entry((f, link))
                            .or_default()
                            .set_instead(Subject::EbpfCni, Cell::failed(&e));
                    }
                }
            }
        }
        match measure_ext(&setup, p, rep, slice) {
            Ok((gbps, got)) => {
                for (link, g) in gbps {
                    ext.entry((ExtFigure::Throughput, link))
                        .or_default()
                        .push(Subject::EbpfCni, g);
                }
                record(&mut ext, &got, ExtFigure::RrP50, ExtFigure::Crr);
            }
            Err(e) => {
                progress(&format!(
                    "netkit: repeat {}, to the external host: {e:#}",
                    rep + 1
                ));
                for link in ExtLink::ALL {
                    for f in [ExtFigure::Throughput, ExtFigure::RrP50, ExtFigure::Crr] {
                        ext.entry((f, link))
                            .or_default()
                            .set_instead(Subject::EbpfCni, Cell::failed(&e));
                    }
                }
            }
        }
    }
    if let Err(e) = setup.floor.attach(&setup.node, false) {
        progress(&format!("netkit: {e:#}"));
    }
    for pod in setup.pods.iter().rev() {
        if let Err(e) = setup.node.del(pod) {
            progress(&format!("netkit: DEL of a pod failed: {e:#}"));
        }
    }
    drop(setup);
    output(p, fig, ext)
}

fn fail_all(fig: &mut PathFigs, ext: &mut ExtFigs, e: &anyhow::Error) {
    for link in PodLink::ALL {
        for f in link.figures() {
            fig.entry((*f, link))
                .or_default()
                .set_instead(Subject::EbpfCni, Cell::failed(e));
        }
    }
    for link in ExtLink::ALL {
        for f in link.figures() {
            ext.entry((*f, link))
                .or_default()
                .set_instead(Subject::EbpfCni, Cell::failed(e));
        }
    }
}

/// One repeat's TCP_RR p50 and TCP_CRR rate of each path into `fig`, as figures `rr` and
/// `crr`.
fn record<F: Ord + Copy, L: Ord + Copy>(
    fig: &mut BTreeMap<(F, L), Repeats>,
    got: &Slices<L>,
    rr: F,
    crr: F,
) {
    for (link, l) in &got.lat {
        fig.entry((rr, *link))
            .or_default()
            .push(Subject::EbpfCni, percentile(l, 50.0));
    }
    for (link, (n, secs)) in &got.conns {
        fig.entry((crr, *link))
            .or_default()
            .push(Subject::EbpfCni, *n as f64 / secs);
    }
}

/// `this` over `base`, per repeat (the paths take turns within a repeat, so each repeat's
/// pair saw the same moment of the machine), times `scale`.
fn per_repeat(this: &[f64], base: &[f64], scale: f64) -> Cell {
    if this.is_empty() || this.len() != base.len() {
        return Cell::NotApplicable;
    }
    let ratios: Vec<f64> = this.iter().zip(base).map(|(a, b)| a / b * scale).collect();
    Summary::of(&ratios).map_or(Cell::NotApplicable, Cell::Value)
}

/// `link`'s rows of `figures`: `row_of` names each figure's metric and, for a ratio, the
/// figure it is taken of and its scale; a ratio is `link`'s over `base`'s, per repeat.
fn rows<F: Ord + Copy, L: Ord + Copy>(
    fig: &mut BTreeMap<(F, L), Repeats>,
    link: L,
    base: L,
    figures: &[F],
    row_of: impl Fn(F) -> (Metric, Option<(F, f64)>),
) -> Vec<crate::model::Row> {
    figures
        .iter()
        .map(|&f| match row_of(f) {
            (metric, Some((of, scale))) => {
                let base = fig.entry((of, base)).or_default().clone();
                let this = fig.entry((of, link)).or_default();
                let mut row = crate::model::Row::new(metric);
                let cell = per_repeat(
                    this.values(Subject::EbpfCni),
                    base.values(Subject::EbpfCni),
                    scale,
                );
                row.cells.insert(Subject::EbpfCni, cell);
                row
            }
            (metric, None) => fig.entry((f, link)).or_default().row(metric),
        })
        .collect()
}

fn output(p: &Params, mut fig: PathFigs, mut ext: ExtFigs) -> Output {
    let cells = format!("median [min–max] over {} repeat(s)", p.repeats);
    let mut table = Table::new("Pod → pod over veth and over netkit", cells.clone());
    for link in PodLink::ALL {
        table
            .rows
            .extend(rows(&mut fig, link, PodLink::Veth, link.figures(), |f| {
                let base = match f {
                    PathFigure::RrOfVeth => Some((PathFigure::RrP50, 1.0)),
                    PathFigure::CrrOfVeth => Some((PathFigure::Crr, 100.0)),
                    _ => None,
                };
                (Metric::Netkit { figure: f, link }, base)
            }));
    }
    table.notes = vec![format!(
        "One ebpf-cni node (IPv4, no host port, no limit) and a plain veth pair: TCP_RR and \
         TCP_CRR as in the pod-path section, {} s per path and repeat in {SLICES} slices, the \
         four paths taking turns (the order reversed every other repeat), client and server \
         pinned to CPU {}. The netkit pods are netkit pairs in L3 mode, primary devices in \
         the node's namespace, their addresses in the node's endpoint map; ecni_floor_nk is \
         ecni_floor_pod's code with bpf_redirect out of the destination's primary device in \
         place of bpf_redirect_peer, attached as each pair's peer-side program \
         (BPF_NETKIT_PEER). Run times per packet from the kernel's BPF statistics, on for the \
         slices only, of both TCP_RR and TCP_CRR. The ratios are per repeat.",
        p.rr_secs,
        load::rr_cpu(),
    )];
    let mut out_ext = Table::new("Pod → external host over veth and over netkit", cells);
    for link in ExtLink::ALL {
        out_ext
            .rows
            .extend(rows(&mut ext, link, ExtLink::Kernel, link.figures(), |f| {
                let base = match f {
                    ExtFigure::ThroughputOfKernel => Some((ExtFigure::Throughput, 1.0)),
                    ExtFigure::RrOfKernel => Some((ExtFigure::RrP50, 1.0)),
                    ExtFigure::CrrOfKernel => Some((ExtFigure::Crr, 1.0)),
                    _ => None,
                };
                (Metric::NetkitExt { figure: f, link }, base)
            }));
    }
    out_ext.notes = vec![format!(
        "The same node's external host (192.168.77.2, behind the node's uplink veth, where \
         ecni_from_dev runs), untranslated: from a veth pod with no program that the node's \
         kernel forwards, from one of the node's ebpf-cni pods, and from a netkit pod running \
         ecni_from_pod on its pair (the FIB lookup and bpf_redirect_neigh in the pod's \
         transmit; its replies delivered by ecni_from_dev with bpf_redirect_peer to its \
         primary device). Per repeat: single-stream iperf3 for {} s each ({} s omitted), then \
         TCP_RR and TCP_CRR {} s per path in {SLICES} slices; the paths take turns, the order \
         reversed every other repeat. The ratios are per repeat.",
        p.iperf_secs, p.iperf_omit, p.rr_secs,
    )];
    Output {
        table,
        ext: out_ext,
    }
}
