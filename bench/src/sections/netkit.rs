//! Pod → pod over netkit (issue 26, item 1): whether netkit devices (Linux 6.7+) take a pod
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
//! This machine's kernel is built without netkit, so the run module sends the section to a
//! guest booting [`GUEST_KERNEL`] there.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::{Context as _, Result};
use ebpf_cni_tests::Netns;

use crate::log::progress;
use crate::metric::{Metric, PathFigure, PodLink};
use crate::model::{Cell, Repeats, Subject, Summary, Table};
use crate::params::Params;
use crate::rig::floor::Floor;
use crate::rig::load::{self, EchoServer};
use crate::rig::netkit::{NetkitPods, NETKIT_B_IP};
use crate::rig::topo::{self, BenchNode, Binaries, Pod, VethPair};
use crate::sections::source_check::BpfStats;
use crate::stats::percentile;
use crate::turns::in_turn;

/// The kernel of the guest the section runs in where this machine's has no netkit.
pub const GUEST_KERNEL: &str = "6.12";

const ECHO_PORT: u16 = 7000;
/// Each repeat's time per path is split into this many alternating slices.
const SLICES: u32 = 4;

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Output {
    pub table: Table,
}

struct Setup {
    // Servers first: they must stop before their namespaces go; the netkit pods before the
    // node whose maps hold their entries.
    _echoes: Vec<EchoServer>,
    netkit: NetkitPods,
    floor: Floor,
    /// Each path and its server's address (its client: [`Setup::client`]).
    targets: Vec<(PodLink, SocketAddr)>,
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
        let netkit = NetkitPods::new(bins, &node).context("the netkit pods")?;
        let pair = VethPair::new()?;
        let mut echoes = Vec::new();
        for ns in [&pods[1].netns, &pods[3].netns, &netkit.b, &pair.b] {
            echoes.push(EchoServer::start(ns, ECHO_PORT)?);
        }
        let at = |ip: Ipv4Addr| SocketAddr::from((ip, ECHO_PORT));
        let targets = vec![
            (PodLink::Veth, at(topo::VETH_B_IP)),
            (PodLink::Product, at(pods[1].ip4()?)),
            (PodLink::TcFloor, at(pods[3].ip4()?)),
            (PodLink::Netkit, at(NETKIT_B_IP)),
        ];
        let s = Self {
            _echoes: echoes,
            netkit,
            floor,
            targets,
            pods,
            pair,
            node,
        };
        for (link, target) in &s.targets {
            // A few tries: the probe's connect waits 1 s, and a fresh pod's first SYN
            // sometimes needs its retransmission.
            let ns = s.client(*link);
            let mut probe = load::probe_echo(ns, *target);
            for _ in 0..4 {
                if probe.is_ok() {
                    break;
                }
                probe = load::probe_echo(ns, *target);
            }
            probe.with_context(|| format!("{} echo", link.label()))?;
        }
        Ok(s)
    }

    fn client(&self, link: PodLink) -> &Netns {
        match link {
            PodLink::Veth => &self.pair.a,
            PodLink::Product => &self.pods[0].netns,
            PodLink::TcFloor => &self.pods[2].netns,
            PodLink::Netkit => &self.netkit.a,
        }
    }
}

/// Each path's TCP_RR times (µs) and TCP_CRR count and seconds, over one repeat's slices.
#[derive(Default)]
struct Slices {
    lat: BTreeMap<PodLink, Vec<f64>>,
    conns: BTreeMap<PodLink, (usize, f64)>,
}

fn measure_repeat(s: &Setup, rep: usize, slice: Duration) -> Result<Slices> {
    let mut out = Slices::default();
    for _ in 0..SLICES {
        for (link, target) in in_turn(&s.targets, rep) {
            let ns = s.client(*link);
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

/// On a machine whose kernel has netkit: the section's figures.
pub fn measure(p: &Params, bins: &Binaries) -> Output {
    let mut fig: BTreeMap<(PathFigure, PodLink), Repeats> = BTreeMap::new();
    let mut setup = match Setup::new(bins) {
        Ok(s) => s,
        Err(e) => {
            progress(&format!("netkit: setting up failed: {e:#}"));
            for link in PodLink::ALL {
                for f in link.figures() {
                    fig.entry((*f, link))
                        .or_default()
                        .set_instead(Subject::EbpfCni, Cell::failed(&e));
                }
            }
            return Output {
                table: table(p, fig),
            };
        }
    };
    let slice = Duration::from_secs_f64(p.rr_secs) / SLICES;
    for rep in 0..p.repeats {
        progress(&format!(
            "netkit: repeat {}/{}: RR/CRR {} s per path, the four paths alternating",
            rep + 1,
            p.repeats,
            p.rr_secs
        ));
        let stats = BpfStats::on();
        let before = (setup.floor.stats(), setup.netkit.stats());
        let got = measure_repeat(&setup, rep, slice);
        let after = (setup.floor.stats(), setup.netkit.stats());
        drop(stats);
        let got = match got {
            Ok(g) => g,
            Err(e) => {
                progress(&format!("netkit: repeat {}: {e:#}", rep + 1));
                for link in PodLink::ALL {
                    for f in [PathFigure::RrP50, PathFigure::Crr] {
                        fig.entry((f, link))
                            .or_default()
                            .set_instead(Subject::EbpfCni, Cell::failed(&e));
                    }
                }
                continue;
            }
        };
        for (link, l) in &got.lat {
            fig.entry((PathFigure::RrP50, *link))
                .or_default()
                .push(Subject::EbpfCni, percentile(l, 50.0));
        }
        for (link, (n, secs)) in &got.conns {
            fig.entry((PathFigure::Crr, *link))
                .or_default()
                .push(Subject::EbpfCni, *n as f64 / secs);
        }
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
    if let Err(e) = setup.floor.attach(&setup.node, false) {
        progress(&format!("netkit: {e:#}"));
    }
    for pod in setup.pods.iter().rev() {
        if let Err(e) = setup.node.del(pod) {
            progress(&format!("netkit: DEL of a pod failed: {e:#}"));
        }
    }
    drop(setup);
    Output {
        table: table(p, fig),
    }
}

/// `link`'s figure over the veth pair's, per repeat (the slices alternate, so each
/// repeat's pair saw the same moment of the machine).
fn of_veth(
    fig: &mut BTreeMap<(PathFigure, PodLink), Repeats>,
    f: PathFigure,
    link: PodLink,
    scale: f64,
) -> Cell {
    let veth = fig
        .entry((f, PodLink::Veth))
        .or_default()
        .values(Subject::EbpfCni)
        .to_vec();
    let this = fig.entry((f, link)).or_default().values(Subject::EbpfCni);
    if this.is_empty() || this.len() != veth.len() {
        return Cell::NotApplicable;
    }
    let ratios: Vec<f64> = this.iter().zip(&veth).map(|(a, b)| a / b * scale).collect();
    Summary::of(&ratios).map_or(Cell::NotApplicable, Cell::Value)
}

fn table(p: &Params, mut fig: BTreeMap<(PathFigure, PodLink), Repeats>) -> Table {
    let mut table = Table::new(
        "Pod → pod over veth and over netkit",
        format!("median [min–max] over {} repeat(s)", p.repeats),
    );
    for link in PodLink::ALL {
        for &f in link.figures() {
            let metric = Metric::Netkit { figure: f, link };
            let row = match f {
                PathFigure::RrOfVeth | PathFigure::CrrOfVeth => {
                    let (base, scale) = match f {
                        PathFigure::RrOfVeth => (PathFigure::RrP50, 1.0),
                        _ => (PathFigure::Crr, 100.0),
                    };
                    let mut row = crate::model::Row::new(metric);
                    row.cells
                        .insert(Subject::EbpfCni, of_veth(&mut fig, base, link, scale));
                    row
                }
                _ => fig.entry((f, link)).or_default().row(metric),
            };
            table.rows.push(row);
        }
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
    table
}
