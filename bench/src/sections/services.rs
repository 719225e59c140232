//! Services next to kube-proxy: what its rules cost the paths they do not touch, and what
//! a Service flow costs against the reference chain. Three IPv4 nodes are set up alike: an
//! ebpf-cni node without kube-proxy's rules, an ebpf-cni node and a reference node with a
//! kube-proxy-shaped rule set of [`SERVICES`] Services of [`ENDPOINTS`] endpoints each (the
//! iptables proxier's rules, through iptables-nft, as `ebpf_cni_tests::kube_proxy` writes
//! them), and four Services more: two whose endpoint is each node's server pod, two whose
//! endpoint is the servers of the node's external host (behind its uplink, routing the pod
//! network via the node). Every repeat measures, alternating the nodes, single-stream TCP
//! throughput, TCP_RR and TCP_CRR on four paths:
//!
//! - pod → pod, ebpf-cni with and without the rules (the fast path kept);
//! - pod → the external host, untranslated and no Service, ebpf-cni with and without the
//!   rules (the fast path kept) and the reference with them;
//! - pod → ClusterIP with the endpoint a pod of the node, and
//! - pod → ClusterIP with the endpoint the external host, both from another client pod,
//!   ebpf-cni against the reference (both through netfilter);
//!
//! then an ADD and a DEL of one more pod on each node, and ebpf-cni's STATUS (which reads
//! the rules) with and without them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use ebpf_cni_tests::kube_proxy::{self as kp, Backend, Proto, Service};

use crate::log::progress;
use crate::metric::{Metric, ServicesFigure, ServicesPath};
use crate::model::{Cell, Repeats, Subject, Table};
use crate::params::Params;
use crate::rig::load::{self, EchoServer, Iperf3Server};
use crate::rig::topo::{self, BenchNode, Binaries, Pod, EXT_IP, POD_SUBNET_V4};
use crate::stats::percentile;

/// The rule set's size: Services, and endpoints each.
pub const SERVICES: usize = 1_000;
pub const ENDPOINTS: usize = 3;
const IPERF_PORT: u16 = 5201;
const ECHO_PORT: u16 = 7000;
/// The measured Services' ClusterIPs (the rule set's are 10.96.0.0/16 below them): to the
/// server pod, and to the external host.
const VIP_ECHO: Ipv4Addr = Ipv4Addr::new(10, 97, 0, 1);
const VIP_IPERF: Ipv4Addr = Ipv4Addr::new(10, 97, 0, 2);
const VIP_EXT_ECHO: Ipv4Addr = Ipv4Addr::new(10, 97, 0, 3);
const VIP_EXT_IPERF: Ipv4Addr = Ipv4Addr::new(10, 97, 0, 4);
const RR_SLICES: u32 = 4;

pub struct Output {
    pub table: Table,
}

/// The variants, in the order they alternate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Variant {
    /// ebpf-cni without kube-proxy's rules.
    Plain,
    /// ebpf-cni with them.
    EbpfRules,
    /// The reference chain with them.
    RefRules,
}

const VARIANTS: [Variant; 3] = [Variant::Plain, Variant::EbpfRules, Variant::RefRules];

impl Variant {
    fn subject(self) -> Subject {
        match self {
            Variant::RefRules => Subject::Reference,
            _ => Subject::EbpfCni,
        }
    }

    fn rules(self) -> bool {
        self != Variant::Plain
    }
}

struct Setup {
    // Servers first: they must stop before their namespaces go.
    _iperf: Iperf3Server,
    _echo: EchoServer,
    /// The same servers on the node's external host.
    _ext_iperf: Iperf3Server,
    _ext_echo: EchoServer,
    /// The client of the paths through no Service: pod → pod and pod → external host.
    a: Pod,
    /// The pod → ClusterIP client (both Services): a pod of its own, so that the other
    /// client's ports are held by no Service flow (a port a live Service flow holds sends
    /// its other flows through the stack too).
    c: Pod,
    b_ip: Ipv4Addr,
    _b: Pod,
    node: BenchNode,
}

/// kube-proxy's rules for [`SERVICES`] Services of [`ENDPOINTS`] endpoints (addresses of
/// the pod network no pod has), and the measured Services: two to `server`, two to the
/// external host.
fn rule_set(server: Ipv4Addr) -> String {
    let mut svcs = Vec::with_capacity(SERVICES + 4);
    for i in 0..SERVICES {
        let vip = Ipv4Addr::new(10, 96, (i / 250) as u8, (i % 250 + 1) as u8);
        let mut s = Service::new(&format!("bench/svc-{i}:http"), vip.into(), 80, Proto::Tcp);
        for e in 0..ENDPOINTS {
            let ep = Ipv4Addr::new(10, 88, 200 + e as u8, (i % 250 + 1) as u8);
            s = s.endpoint(SocketAddr::new(ep.into(), 8080));
        }
        svcs.push(s);
    }
    for (name, vip, ep, port) in [
        ("measured", VIP_ECHO, server, ECHO_PORT),
        ("measured", VIP_IPERF, server, IPERF_PORT),
        ("outside", VIP_EXT_ECHO, EXT_IP, ECHO_PORT),
        ("outside", VIP_EXT_IPERF, EXT_IP, IPERF_PORT),
    ] {
        svcs.push(
            Service::new(
                &format!("bench/{name}-{port}:p"),
                vip.into(),
                port,
                Proto::Tcp,
            )
            .endpoint(SocketAddr::new(ep.into(), port)),
        );
    }
    kp::iptables_rules(&svcs, POD_SUBNET_V4)
}

impl Setup {
    fn new(bins: &Binaries, v: Variant) -> Result<Self> {
        // STATUS is CNI 1.1's; the reference chain's plugins speak 1.0.
        let node = BenchNode::with_list(
            v.subject(),
            bins,
            topo::Stack::V4,
            topo::Egress::Routed,
            |l| {
                if v.subject() == Subject::EbpfCni {
                    l.cni_version = "1.1.0".to_owned();
                }
            },
        )?;
        let (a, _) = node.add_pod("svc-a", topo::caps(&[], None))?;
        let (c, _) = node.add_pod("svc-c", topo::caps(&[], None))?;
        let (b, _) = node.add_pod("svc-b", topo::caps(&[], None))?;
        let b_ip = b.ip4()?;
        if v.rules() {
            kp::load_iptables(node.node.netns(), true, Backend::Nft, &rule_set(b_ip))
                .context("loading kube-proxy's rules")?;
        }
        let iperf = Iperf3Server::start(&b.netns, b_ip, IPERF_PORT)?;
        let echo = EchoServer::start(&b.netns, ECHO_PORT)?;
        let ext_iperf = Iperf3Server::start(node.ext(), EXT_IP, IPERF_PORT)?;
        let ext_echo = EchoServer::start(node.ext(), ECHO_PORT)?;
        let s = Self {
            _iperf: iperf,
            _echo: echo,
            _ext_iperf: ext_iperf,
            _ext_echo: ext_echo,
            a,
            c,
            b_ip,
            _b: b,
            node,
        };
        if v.subject() == Subject::EbpfCni {
            // The node learns the Service addresses (the agent's or the runtime's STATUS).
            s.status()?;
        }
        for path in paths(v) {
            let (echo, _) = s.targets(*path);
            load::probe_echo(&s.client(*path).netns, echo)
                .with_context(|| format!("{} echo", path.label()))?;
        }
        Ok(s)
    }

    fn status(&self) -> Result<Duration> {
        let t = Instant::now();
        self.node
            .chain
            .runtime
            .status(&self.node.node, &self.node.chain.list)
            .map_err(|e| anyhow::anyhow!("STATUS: {e}"))?;
        Ok(t.elapsed())
    }

    /// The client of `path`.
    fn client(&self, path: ServicesPath) -> &Pod {
        match path {
            ServicesPath::PodToPod | ServicesPath::PodToExternal => &self.a,
            ServicesPath::PodToClusterIp | ServicesPath::PodToClusterIpExternal => &self.c,
        }
    }

    /// The targets of `path` on this node: the echo server's, the iperf3 server's.
    fn targets(&self, path: ServicesPath) -> (SocketAddr, SocketAddr) {
        let (echo, iperf) = match path {
            ServicesPath::PodToPod => (self.b_ip, self.b_ip),
            ServicesPath::PodToExternal => (EXT_IP, EXT_IP),
            ServicesPath::PodToClusterIp => (VIP_ECHO, VIP_IPERF),
            ServicesPath::PodToClusterIpExternal => (VIP_EXT_ECHO, VIP_EXT_IPERF),
        };
        (
            SocketAddr::from((echo, ECHO_PORT)),
            SocketAddr::from((iperf, IPERF_PORT)),
        )
    }
}

/// The paths each variant measures: the fast paths on both ebpf-cni nodes (and pod →
/// external host on the reference too, beside), the Services on the nodes with the rules.
fn paths(v: Variant) -> &'static [ServicesPath] {
    use ServicesPath::*;
    match v {
        Variant::Plain => &[PodToPod, PodToExternal],
        Variant::EbpfRules => &[
            PodToPod,
            PodToExternal,
            PodToClusterIp,
            PodToClusterIpExternal,
        ],
        Variant::RefRules => &[PodToExternal, PodToClusterIp, PodToClusterIpExternal],
    }
}

type Key = (ServicesFigure, ServicesPath, bool);

pub fn run(p: &Params, bins: &Binaries) -> Output {
    let mut fig: BTreeMap<Key, Repeats> = BTreeMap::new();
    let mut setups: Vec<(Variant, Setup)> = Vec::new();
    for v in VARIANTS {
        match Setup::new(bins, v) {
            Ok(s) => setups.push((v, s)),
            Err(e) => {
                progress(&format!("services: setting up {v:?} failed: {e:#}"));
                for f in ServicesFigure::ALL {
                    for path in paths(v) {
                        fig.entry((f, *path, v.rules()))
                            .or_default()
                            .set_instead(v.subject(), Cell::failed(&e));
                    }
                }
            }
        }
    }
    let slice = Duration::from_secs_f64(p.rr_secs) / RR_SLICES;
    for rep in 0..p.repeats {
        progress(&format!(
            "services: repeat {}/{}: iperf3 {} s, RR/CRR {} s, ADD/DEL and STATUS, {} nodes",
            rep + 1,
            p.repeats,
            p.iperf_secs,
            p.rr_secs,
            setups.len()
        ));
        for (v, s) in &setups {
            for path in paths(*v) {
                let (_, iperf) = s.targets(*path);
                let r = fig
                    .entry((ServicesFigure::Throughput, *path, v.rules()))
                    .or_default();
                match load::iperf3(
                    &s.client(*path).netns,
                    iperf,
                    p.iperf_secs,
                    p.iperf_omit,
                    false,
                    load::Proto::Tcp,
                ) {
                    Ok(res) => r.push(v.subject(), res.receiver_bps / 1e9),
                    Err(e) => r.set_instead(v.subject(), Cell::failed(&e)),
                }
            }
        }
        let mut lat: BTreeMap<(Variant, ServicesPath), Vec<f64>> = BTreeMap::new();
        let mut conns: BTreeMap<(Variant, ServicesPath), (usize, f64)> = BTreeMap::new();
        for _ in 0..RR_SLICES {
            for (v, s) in &setups {
                for path in paths(*v) {
                    let (echo, _) = s.targets(*path);
                    let client = &s.client(*path).netns;
                    let r = load::tcp_rr(client, echo, slice).and_then(|l| {
                        lat.entry((*v, *path)).or_default().extend(l);
                        load::tcp_crr(client, echo, slice, usize::MAX)
                    });
                    match r {
                        Ok(c) => {
                            let e = conns.entry((*v, *path)).or_default();
                            e.0 += c.connect_us.len();
                            e.1 += c.secs;
                        }
                        Err(e) => {
                            for f in [ServicesFigure::RrP50, ServicesFigure::Crr] {
                                fig.entry((f, *path, v.rules()))
                                    .or_default()
                                    .set_instead(v.subject(), Cell::failed(&e));
                            }
                        }
                    }
                }
            }
        }
        for ((v, path), l) in lat {
            fig.entry((ServicesFigure::RrP50, path, v.rules()))
                .or_default()
                .push(v.subject(), percentile(&l, 50.0));
        }
        for ((v, path), (n, secs)) in conns {
            fig.entry((ServicesFigure::Crr, path, v.rules()))
                .or_default()
                .push(v.subject(), n as f64 / secs);
        }
        for (v, s) in &setups {
            let path = ServicesPath::PodToPod;
            let add = s
                .node
                .add_pod(&format!("svc-extra-{rep}"), topo::caps(&[], None))
                .and_then(|(pod, cost)| {
                    s.node.del(&pod)?;
                    Ok(cost.wall)
                });
            let r = fig
                .entry((ServicesFigure::AddMs, path, v.rules()))
                .or_default();
            match add {
                Ok(w) => r.push(v.subject(), w.as_secs_f64() * 1e3),
                Err(e) => r.set_instead(v.subject(), Cell::failed(&e)),
            }
            if v.subject() == Subject::EbpfCni {
                let r = fig
                    .entry((ServicesFigure::StatusMs, path, v.rules()))
                    .or_default();
                match s.status() {
                    Ok(w) => r.push(v.subject(), w.as_secs_f64() * 1e3),
                    Err(e) => r.set_instead(v.subject(), Cell::failed(&e)),
                }
            }
        }
    }
    drop(setups);

    let mut table = Table::new(
        "Services next to kube-proxy",
        format!("median [min–max] over {} repeat(s)", p.repeats),
    );
    // Each path's rows without the rules, then with them (the order ServicesPath declares).
    let traffic: BTreeSet<(ServicesPath, bool)> = VARIANTS
        .iter()
        .flat_map(|v| paths(*v).iter().map(|p| (*p, v.rules())))
        .collect();
    let node = BTreeSet::from([
        (ServicesPath::PodToPod, false),
        (ServicesPath::PodToPod, true),
    ]);
    for f in ServicesFigure::ALL {
        let keys = match f {
            ServicesFigure::AddMs | ServicesFigure::StatusMs => &node,
            _ => &traffic,
        };
        for (path, rules) in keys {
            table.rows.push(
                fig.entry((f, *path, *rules))
                    .or_default()
                    .row(Metric::Services {
                        figure: f,
                        path: *path,
                        rules: *rules,
                    }),
            );
        }
    }
    table.notes = vec![
        format!(
            "Three IPv4 nodes: ebpf-cni without kube-proxy's rules, ebpf-cni and the reference \
             chain with the iptables proxier's rules for {SERVICES} Services of {ENDPOINTS} \
             endpoints each (iptables-nft) and four more: two whose endpoint is the node's \
             server pod ({VIP_ECHO}, {VIP_IPERF}), two whose endpoint is the node's external \
             host {EXT_IP} behind its uplink ({VIP_EXT_ECHO}, {VIP_EXT_IPERF}; the host \
             routes the pod network via the node, so nothing is masqueraded). Pod → pod and \
             pod → external host from one client pod, both ClusterIPs from another. iperf3 \
             -t {} -O {}, one TCP stream; TCP_RR and TCP_CRR {} s per figure and repeat in \
             {RR_SLICES} slices alternating the nodes; ADD is one more pod's, its DEL right \
             after; STATUS is ebpf-cni's, which reads the rules.",
            p.iperf_secs, p.iperf_omit, p.rr_secs
        ),
        "Goals: pod → pod and pod → external host with the rules within the run's spread of \
         the node without them (the fast path is kept; the tests prove no pod → pod packet \
         passes netfilter's FORWARD); the reference's pod → external host is shown beside, \
         with no goal; pod → ClusterIP, the endpoint a local pod or the external host, at \
         least the reference's on the same rules within the run's spread (both through \
         netfilter); ADD with the rules within 1.1× of ADD without (ADD reads no rules)."
            .to_owned(),
    ];
    Output { table }
}
