//! Dataplane speed: single-stream TCP throughput (iperf3), request/response latency
//! (TCP_RR-style) and connections per second (TCP_CRR-style), pod→pod, node→pod and from an
//! external client through a hostPort, for each CNI subject next to a plain veth pair.
//!
//! The setups are built once; every repeat then measures each path on each subject in turn
//! (reference, ebpf-cni, veth), so a noisy moment hits all of them. Pods carry no bandwidth
//! limit here. The hostPort path is measured only where a probe shows the hostPort works.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::{Context as _, Result};
use ebpf_cni_tests::Netns;

use crate::log::progress;
use crate::metric::{Metric, PathKind};
use crate::model::{Cell, Repeats, Row, Subject, Summary, Table};
use crate::params::Params;
use crate::rig::load::{self, EchoServer, Iperf3Server, Proto};
use crate::rig::topo::{self, BenchNode, Binaries, Pod, VethPair};
use crate::stats::percentile;
use crate::turns::in_turn;

const IPERF_PORT: u16 = 5201;
const ECHO_PORT: u16 = 7000;
const IPERF_HOST_PORT: u16 = 28_080;
const ECHO_HOST_PORT: u16 = 28_081;
/// Request/response time per repeat is split into this many alternating slices.
const RR_SLICES: u32 = 4;

/// Whether a subject's hostPort worked, with what the probe saw.
pub type HostPortProbe = BTreeMap<Subject, std::result::Result<(), String>>;

pub struct Output {
    pub throughput: Table,
    pub rr: Table,
    pub hostport: HostPortProbe,
}

struct CniSetup {
    // Servers first: they must stop before their namespaces go.
    _iperf: Iperf3Server,
    _echo: EchoServer,
    a: Pod,
    b_ip: Ipv4Addr,
    _b: Pod,
    node: BenchNode,
    hostport_ok: bool,
}

struct VethSetup {
    _iperf: Iperf3Server,
    _echo: EchoServer,
    pair: VethPair,
}

enum Setup {
    Cni(Box<CniSetup>),
    Veth(VethSetup),
}

impl Setup {
    fn cni(subject: Subject, bins: &Binaries) -> Result<Self> {
        let node = BenchNode::new(subject, bins)?;
        let (a, _) = node.add_pod("traffic-a", topo::caps(&[], None))?;
        let (b, _) = node.add_pod(
            "traffic-b",
            topo::caps(
                &[(IPERF_HOST_PORT, IPERF_PORT), (ECHO_HOST_PORT, ECHO_PORT)],
                None,
            ),
        )?;
        let b_ip = b.ip4()?;
        let iperf = Iperf3Server::start(&b.netns, b_ip, IPERF_PORT)?;
        let echo = EchoServer::start(&b.netns, ECHO_PORT)?;
        // The pod→pod path must work; the hostPort path may legitimately not exist yet.
        load::probe_echo(&a.netns, SocketAddr::from((b_ip, ECHO_PORT)))
            .context("pod → pod echo")?;
        Ok(Setup::Cni(Box::new(CniSetup {
            _iperf: iperf,
            _echo: echo,
            a,
            b_ip,
            _b: b,
            node,
            hostport_ok: false,
        })))
    }

    fn veth() -> Result<Self> {
        let pair = VethPair::new()?;
        let iperf = Iperf3Server::start(&pair.b, topo::VETH_B_IP, IPERF_PORT)?;
        let echo = EchoServer::start(&pair.b, ECHO_PORT)?;
        Ok(Setup::Veth(VethSetup {
            _iperf: iperf,
            _echo: echo,
            pair,
        }))
    }

    /// The client namespace and the iperf3 and echo targets for `path`, if it applies.
    fn client(&self, path: PathKind) -> Option<(&Netns, SocketAddr, SocketAddr)> {
        match (self, path) {
            (Setup::Veth(v), PathKind::PodToPod) => Some((
                &v.pair.a,
                (topo::VETH_B_IP, IPERF_PORT).into(),
                (topo::VETH_B_IP, ECHO_PORT).into(),
            )),
            (Setup::Veth(_), _) => None,
            (Setup::Cni(c), PathKind::PodToPod) => Some((
                &c.a.netns,
                (c.b_ip, IPERF_PORT).into(),
                (c.b_ip, ECHO_PORT).into(),
            )),
            (Setup::Cni(c), PathKind::NodeToPod) => Some((
                c.node.node.netns(),
                (c.b_ip, IPERF_PORT).into(),
                (c.b_ip, ECHO_PORT).into(),
            )),
            (Setup::Cni(c), PathKind::ExtToHostPort) => c.hostport_ok.then(|| {
                (
                    c.node.ext(),
                    (topo::NODE_UPLINK_IP, IPERF_HOST_PORT).into(),
                    (topo::NODE_UPLINK_IP, ECHO_HOST_PORT).into(),
                )
            }),
        }
    }
}

pub fn run(p: &Params, bins: &Binaries) -> Output {
    let mut setups: Vec<(Subject, Setup)> = Vec::new();
    let mut tput: BTreeMap<PathKind, Repeats> = BTreeMap::new();
    let mut rr_p50: BTreeMap<PathKind, Repeats> = BTreeMap::new();
    let mut rr_p99: BTreeMap<PathKind, Repeats> = BTreeMap::new();
    let mut crr: BTreeMap<PathKind, Repeats> = BTreeMap::new();
    let mut hostport = HostPortProbe::new();

    for s in Subject::ALL {
        let setup = match s {
            Subject::Veth => Setup::veth(),
            _ => Setup::cni(s, bins),
        };
        match setup {
            Ok(mut setup) => {
                if let Setup::Cni(c) = &mut setup {
                    let target = SocketAddr::from((topo::NODE_UPLINK_IP, ECHO_HOST_PORT));
                    let probe = load::probe_echo(c.node.ext(), target);
                    c.hostport_ok = probe.is_ok();
                    hostport.insert(s, probe.map_err(|e| e.root_cause().to_string()));
                }
                setups.push((s, setup));
            }
            Err(e) => {
                progress(&format!("traffic: setting up {} failed: {e:#}", s.label()));
                for path in PathKind::ALL {
                    for r in [&mut tput, &mut rr_p50, &mut rr_p99, &mut crr] {
                        r.entry(path).or_default().set_instead(s, Cell::failed(&e));
                    }
                }
            }
        }
    }
    // Why a subject has no figure on a path.
    for (s, setup) in &setups {
        for path in PathKind::ALL {
            if setup.client(path).is_none() {
                let cell = match (s, &hostport.get(s)) {
                    (Subject::Veth, _) => Cell::NotApplicable,
                    (_, Some(Err(e))) => Cell::not_implemented(&format!(
                        "hostPort not provided; probe from the external client: {}",
                        crate::model::first_line(e)
                    )),
                    _ => Cell::NotApplicable,
                };
                for r in [&mut tput, &mut rr_p50, &mut rr_p99, &mut crr] {
                    r.entry(path).or_default().set_instead(*s, cell.clone());
                }
            }
        }
    }

    let rr_paths = [PathKind::PodToPod, PathKind::ExtToHostPort];
    let rr_time = Duration::from_secs_f64(p.rr_secs);
    for rep in 0..p.repeats {
        progress(&format!(
            "traffic: repeat {}/{}: iperf3 {} s per path and subject, RR/CRR {} s each",
            rep + 1,
            p.repeats,
            p.iperf_secs,
            p.rr_secs
        ));
        for path in PathKind::ALL {
            for (s, setup) in in_turn(&setups, rep) {
                let Some((ns, target, _)) = setup.client(path) else {
                    continue;
                };
                let r = tput.entry(path).or_default();
                match load::iperf3(ns, target, p.iperf_secs, p.iperf_omit, false, Proto::Tcp) {
                    Ok(res) => r.push(*s, res.receiver_bps / 1e9),
                    Err(e) => r.set_instead(*s, Cell::failed(&e)),
                }
            }
        }
        // Short slices, subjects alternating within each, so a noisy moment does not land
        // on one subject's whole figure.
        let slice = rr_time / RR_SLICES;
        for path in rr_paths {
            let mut lat: BTreeMap<Subject, Vec<f64>> = BTreeMap::new();
            let mut conns: BTreeMap<Subject, (usize, f64)> = BTreeMap::new();
            let mut failed: BTreeMap<Subject, anyhow::Error> = BTreeMap::new();
            for _ in 0..RR_SLICES {
                for (s, setup) in &setups {
                    let Some((ns, _, target)) = setup.client(path) else {
                        continue;
                    };
                    if failed.contains_key(s) {
                        continue;
                    }
                    let r = load::tcp_rr(ns, target, slice).and_then(|l| {
                        lat.entry(*s).or_default().extend(l);
                        load::tcp_crr(ns, target, slice, usize::MAX)
                    });
                    match r {
                        Ok(c) => {
                            let e = conns.entry(*s).or_default();
                            e.0 += c.connect_us.len();
                            e.1 += c.secs;
                        }
                        Err(e) => {
                            failed.insert(*s, e);
                        }
                    }
                }
            }
            for (s, e) in failed {
                for r in [&mut rr_p50, &mut rr_p99, &mut crr] {
                    r.entry(path).or_default().set_instead(s, Cell::failed(&e));
                }
            }
            for (s, l) in lat {
                rr_p50
                    .entry(path)
                    .or_default()
                    .push(s, percentile(&l, 50.0));
                rr_p99
                    .entry(path)
                    .or_default()
                    .push(s, percentile(&l, 99.0));
            }
            for (s, (n, secs)) in conns {
                crr.entry(path).or_default().push(s, n as f64 / secs);
            }
        }
    }
    drop(setups);

    let over = format!("median [min–max] over {} repeat(s)", p.repeats);
    let mut throughput = Table::new("TCP throughput, single stream (iperf3)", over.clone());
    for path in PathKind::ALL {
        throughput
            .rows
            .push(tput.entry(path).or_default().row(Metric::Throughput(path)));
    }
    if let Some(row) = percent_of_veth(tput.entry(PathKind::PodToPod).or_default()) {
        throughput.rows.insert(1, row);
    }
    throughput.notes = vec![
        format!(
            "iperf3 -t {} -O {} (the first {} s are not counted), one TCP stream (bbr, the \
             kernel default here), MTU {}; the receiver's rate. The subjects take turns, in the \
             reverse order every other repeat.",
            p.iperf_secs,
            p.iperf_omit,
            p.iperf_omit,
            topo::MTU
        ),
        "pod → pod: two pods of one node; node → pod: from the node namespace; external → \
         hostPort: from a client namespace behind the node's uplink veth to \
         192.168.77.1:28080, DNATed to the pod. The plain veth pair has one path only: it is \
         the physical limit for all of them."
            .into(),
    ];

    let mut rr = Table::new("Request/response latency and connection rate", over);
    for path in rr_paths {
        rr.rows
            .push(rr_p50.entry(path).or_default().row(Metric::RrP50(path)));
        rr.rows
            .push(rr_p99.entry(path).or_default().row(Metric::RrP99(path)));
        rr.rows
            .push(crr.entry(path).or_default().row(Metric::Crr(path)));
    }
    rr.notes = vec![
        format!(
            "In-process, {} s per figure and repeat, in {RR_SLICES} slices that alternate the \
             subjects: TCP_RR sends 1 byte and waits for its echo on one connection \
             (TCP_NODELAY), p50/p99 of the per-transaction times; TCP_CRR connects, exchanges \
             1 byte, the server closes, then the client.",
            p.rr_secs
        ),
        format!(
            "Client and server are threads in their namespaces, both pinned to CPU {}: the \
             figure is then the path's own cost. Unpinned, the scheduler's choice between \
             same-CPU and cross-CPU wakeups (an IPI through the hypervisor) moved TCP_RR p50 \
             between ≈ 8 and ≈ 34 µs from one run to the next on this machine.",
            load::rr_cpu()
        ),
    ];

    Output {
        throughput,
        rr,
        hostport,
    }
}

/// pod → pod of each CNI subject as a share of the plain veth's figure measured right
/// after it in the same repeat (per-repeat ratios cancel the machine's slow drifts); when
/// the repeats do not pair up (a failure), the medians'.
fn percent_of_veth(r: &Repeats) -> Option<Row> {
    let veth = r.values(Subject::Veth);
    let veth_median = r.cell(Subject::Veth).value()?.median;
    let mut row = Row::new(Metric::PodToPodOfVeth);
    for s in Subject::CNI {
        let v = r.values(s);
        let cell = if !v.is_empty() && v.len() == veth.len() {
            let ratios: Vec<f64> = v.iter().zip(veth).map(|(a, b)| a / b * 100.0).collect();
            Summary::of(&ratios).map_or(Cell::NotApplicable, Cell::Value)
        } else {
            match r.cell(s) {
                Cell::Value(x) => Cell::Value(Summary {
                    n: x.n,
                    median: x.median / veth_median * 100.0,
                    min: x.min / veth_median * 100.0,
                    max: x.max / veth_median * 100.0,
                }),
                other => other,
            }
        };
        row.cells.insert(s, cell);
    }
    Some(row)
}
