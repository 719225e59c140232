//! The cluster network with its members from the Kubernetes API: `ebpf-cni agent
//! --cluster kubernetes` on a node of a cluster of `cluster_nodes` Node objects, served by
//! the tests' stand-in API server (`ebpf_cni_tests::kube_api`: LIST, then a streaming
//! WATCH). Measured: how long after its start the agent routes to every other node, its
//! resident memory once it watches them all, and, between two real nodes whose agents both
//! run, how long after a Node object appears (the peer's Node deleted, then created again)
//! a pod on one node gets its first reply from a pod on the other. Then pod → pod across
//! nodes ([`cross_node`]): ebpf-cni direct and overlay against the reference chain with
//! host-gw routes and with flannel's VXLAN device, node → node as the ceiling.
//!
//! The reference chain has no membership (its users route between nodes by hand or with
//! another component): it has a column only across nodes, set up by hand.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use ebpf_cni_tests::agent::{AgentProcess, STARTED};
use ebpf_cni_tests::config::Stack;
use ebpf_cni_tests::etcd::LAN_BRIDGE_IP;
use ebpf_cni_tests::kube_api::{self, KubeApi};
use ebpf_cni_tests::lan::Lan;
use ebpf_cni_tests::{Netns, Node, PluginUnderTest, Pod};
use serde_json::Value;

use crate::log::progress;
use crate::metric::{CrossFigure, CrossPath, Metric};
use crate::model::{Cell, Repeats, Subject, Table};
use crate::params::Params;
use crate::rig::load::{self, EchoServer, Iperf3Server};
use crate::rig::topo::Binaries;
use crate::stats::percentile;

/// The cluster's pod network; the two real nodes hold its `172.16.1.0/24` and
/// `172.16.2.0/24`, the other Nodes /24s from `172.17.0.0` up.
const NETWORK: &str = r#"{"network": "172.16.0.0/12", "mode": "auto"}"#;
const ECHO_PORT: u16 = 7000;
/// How long one attempt to reach the other pod may take before the next starts.
const ATTEMPT: Duration = Duration::from_millis(5);

pub struct Output {
    pub table: Table,
    pub nodes: usize,
    /// Pod → pod across nodes, by way.
    pub traffic: Table,
    /// The members from etcd.
    pub etcd: Table,
}

/// What either source's table measures: the agent's start to every peer routed, its
/// memory then, and a peer's appearance to the first reply between pods.
#[derive(Default)]
struct Figures {
    all_routed: Repeats,
    rss: Repeats,
    first_reply: Repeats,
}

impl Figures {
    /// Each figure failed with `e`, said as `what` failed.
    fn fail(&mut self, what: &str, e: &anyhow::Error) {
        progress(&format!("cluster: {what} failed: {e:#}"));
        for r in [&mut self.all_routed, &mut self.rss, &mut self.first_reply] {
            r.set_instead(Subject::EbpfCni, Cell::failed(e));
        }
    }

    /// Their rows, as `metrics` (routed, memory, first reply) name them.
    fn rows(&self, metrics: [Metric; 3]) -> Vec<crate::model::Row> {
        let [routed, rss, reply] = metrics;
        vec![
            self.all_routed.row(routed),
            self.rss.row(rss),
            self.first_reply.row(reply),
        ]
    }
}

pub fn run(p: &Params, bins: &Binaries) -> Output {
    let mut f = Figures::default();
    if let Err(e) = measure(p, bins, &mut f) {
        f.fail("the Kubernetes source", &e);
    }
    let n = p.cluster_nodes;
    let mut table = Table::new(
        &format!("The cluster network from the Kubernetes API, {n} Nodes"),
        format!(
            "median [min–max] over 1 agent start and {} Node event(s)",
            p.cluster_events
        ),
    );
    table.rows = f.rows([
        Metric::ClusterAllRouted { nodes: n },
        Metric::ClusterAgentRss { nodes: n },
        Metric::ClusterFirstReply,
    ]);
    let half = (n - 2) / 2;
    table.notes = vec![
        format!(
            "Two ebpf-cni nodes (network namespaces on one bridge) and {} more Node objects \
             in a stand-in API server (the tests' `kube_api`: TLS, a bearer token, LIST, a \
             streaming WATCH with bookmarks), each with a /24 of the pod network \
             172.16.0.0/12 (mode auto) and an InternalIP: {half} on a subnet the node reaches on its link (direct routes), \
             the others behind a gateway (routes through the VXLAN tunnel); nothing answers \
             at those addresses, no traffic goes to them.",
            n - 2
        ),
        "Every peer routed: from the agent's start (`ebpf-cni agent --cluster kubernetes`) \
         to its routes (`proto 236`) covering every other Node's subnet; its VmRSS then, \
         watching them all."
            .to_owned(),
        format!(
            "First reply: the peer node's Node object deleted (its route gone), then created \
             again; from the create to the first TCP echo between a pod on the measuring node \
             and a pod on the peer, tried every {} ms (the agent's WATCH event, its pass, the \
             route, one connection: a SYN sent before the route is lost, and the attempt \
             waits out its {} ms). Goal p50 ≤ 1 s.",
            ATTEMPT.as_millis(),
            ATTEMPT.as_millis()
        ),
        "The reference chain has no column: it has no membership; its users route between \
         nodes by hand or with another component."
            .to_owned(),
    ];
    Output {
        table,
        nodes: n,
        traffic: cross_node(p, bins),
        etcd: from_etcd(p, bins),
    }
}

/// A node on the LAN (`lan0`, 10.250.0.`host`) with the plugin's config where its agent's
/// `--conf` points.
struct ClusterNode {
    node: Node,
    name: String,
    addr: Ipv4Addr,
    conf: PathBuf,
}

impl ClusterNode {
    fn new(p: &PluginUnderTest, lan: &Lan, name: &str, host: u8) -> Result<Self> {
        let node = Node::new()?;
        let addr = lan.attach(node.netns(), "lan0", host)?;
        let conf = node.scratch_dir().join("10-ebpf-cni.conf");
        std::fs::write(&conf, p.conf("1.0.0", &node, Stack::V4).to_string())?;
        Ok(Self {
            node,
            name: name.to_owned(),
            addr,
            conf,
        })
    }

    fn spawn_agent(
        &self,
        p: &PluginUnderTest,
        api: &KubeApi,
        creds: &Creds,
    ) -> Result<AgentProcess> {
        let Creds { ca, token, net } = creds;
        let port = api.addr().port().to_string();
        let host = api.addr().ip().to_string();
        let args = [
            "--cluster",
            "kubernetes",
            "--node-name",
            &self.name,
            "--kube-host",
            &host,
            "--kube-port",
            &port,
            "--kube-ca-file",
            &ca.to_string_lossy(),
            "--kube-token-file",
            &token.to_string_lossy(),
            "--network-config",
            &net.to_string_lossy(),
        ];
        AgentProcess::spawn_with(&p.bin, self.node.netns().path(), Some(&self.conf), &args)
    }

    /// Its routes to peers (`proto 236`), one per line.
    fn peer_routes(&self) -> Result<String> {
        self.node
            .netns()
            .ip_ok(&["-4", "route", "show", "proto", "236"])
    }

    fn conf_value(&self) -> Result<Value> {
        Ok(serde_json::from_slice(&std::fs::read(&self.conf)?)?)
    }
}

/// What an agent reads besides its conflist: the API server's CA and token, the network
/// config.
struct Creds {
    ca: PathBuf,
    token: PathBuf,
    net: PathBuf,
}

impl Creds {
    fn write(api: &KubeApi, dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let (ca, token) = api.write_credentials(dir)?;
        let net = dir.join("net-conf.json");
        std::fs::write(&net, NETWORK)?;
        Ok(Self { ca, token, net })
    }
}

/// Peer `i`'s Node: its /24 from 172.17.0.0 up, its InternalIP on 10.252.0.0/16 (on the
/// node's link) for even `i`, on 10.253.0.0/16 (behind the LAN's gateway) for odd.
fn peer(i: usize) -> Value {
    let cidr = format!("172.{}.{}.0/24", 17 + i / 256, i % 256);
    let net = if i.is_multiple_of(2) { 252 } else { 253 };
    let ip = format!("10.{net}.{}.{}", i / 250, i % 250 + 1);
    kube_api::node(&format!("peer-{i:04}"), &[&cidr], &[&ip], &[])
}

/// Tries `ok` every millisecond until it holds, for at most `bound`: how long it took.
fn wait(what: &str, bound: Duration, mut ok: impl FnMut() -> Result<bool>) -> Result<Duration> {
    let t = Instant::now();
    while !ok()? {
        if t.elapsed() > bound {
            bail!("{what}: not within {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(t.elapsed())
}

/// Times `events` appearances of pod b's node to node a: each time `remove` takes it away
/// (until `gone` says node a's route to it went, and pod a no longer reaches pod b), then
/// `restore` brings it back; from the instant `restore` returns (when the event began) to
/// pod a's first echo from pod b, ms, into `out`.
fn first_replies(
    events: usize,
    (pod_a, pod_b): (&Pod, &Pod),
    mut remove: impl FnMut() -> Result<()>,
    mut gone: impl FnMut() -> Result<bool>,
    mut restore: impl FnMut() -> Result<Instant>,
    out: &mut Repeats,
) -> Result<()> {
    let _echo = EchoServer::start(&pod_b.netns, ECHO_PORT)?;
    let target = SocketAddr::new(pod_b.v4(), ECHO_PORT);
    wait("pod a → pod b", Duration::from_secs(30), || {
        echo_once(&pod_a.netns, target)
    })?;
    for _ in 0..events {
        remove()?;
        wait(
            "node a's route to b gone",
            Duration::from_secs(30),
            &mut gone,
        )?;
        if echo_once(&pod_a.netns, target)? {
            bail!("pod a still reaches pod b without a route to it");
        }
        std::thread::sleep(Duration::from_millis(200));
        let began = restore()?;
        wait("pod a → pod b again", Duration::from_secs(30), || {
            echo_once(&pod_a.netns, target)
        })?;
        out.push(Subject::EbpfCni, began.elapsed().as_secs_f64() * 1e3);
    }
    Ok(())
}

/// One echo exchange with `target` from `ns`, within [`ATTEMPT`].
fn echo_once(ns: &ebpf_cni_tests::Netns, target: SocketAddr) -> Result<bool> {
    use std::io::{Read as _, Write as _};
    ns.run_in(|| {
        let Ok(mut s) = TcpStream::connect_timeout(&target, ATTEMPT) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(ATTEMPT));
        let mut b = [0u8; 1];
        s.write_all(&[load::ECHO_CLOSE]).is_ok() && s.read_exact(&mut b).is_ok()
    })
}

fn measure(p: &Params, bins: &Binaries, f: &mut Figures) -> Result<()> {
    let plugin = PluginUnderTest::at(bins.ebpf_cni.clone());
    let lan = Lan::new()?;
    let api = KubeApi::start(Some(lan.netns()), (LAN_BRIDGE_IP, 0).into(), "bench-token")?;
    let a = ClusterNode::new(&plugin, &lan, "node-a", 1)?;
    let b = ClusterNode::new(&plugin, &lan, "node-b", 2)?;
    let creds = Creds::write(&api, &a.node.scratch_dir().join("kube"))?;
    // Node a reaches 10.252.0.0/16 on its link, 10.253.0.0/16 through the LAN's gateway.
    a.node
        .netns()
        .ip_ok(&["route", "add", "10.252.0.0/16", "dev", "lan0"])?;
    a.node.netns().ip_ok(&[
        "route",
        "add",
        "10.253.0.0/16",
        "via",
        &LAN_BRIDGE_IP.to_string(),
    ])?;
    let node_b = || kube_api::node("node-b", &["172.16.2.0/24"], &[&b.addr.to_string()], &[]);
    api.set_node(kube_api::node(
        "node-a",
        &["172.16.1.0/24"],
        &[&a.addr.to_string()],
        &[],
    ));
    api.set_node(node_b());
    let others = p.cluster_nodes.saturating_sub(2);
    for i in 0..others {
        api.set_node(peer(i));
    }

    // Every peer routed, from the agent's start.
    crate::rig::machine::settle(Duration::from_secs(2));
    progress(&format!("cluster: agent on {} Nodes", p.cluster_nodes));
    let started = Instant::now();
    let mut agent_a = a.spawn_agent(&plugin, &api, &creds)?;
    let routes = others + 1;
    wait(
        &format!("{routes} routes on node a"),
        Duration::from_secs(120),
        || Ok(a.peer_routes()?.lines().count() >= routes),
    )
    .with_context(|| format!("the agent said: {}", agent_a.said()))?;
    f.all_routed
        .push(Subject::EbpfCni, started.elapsed().as_secs_f64() * 1e3);
    let listed = a.peer_routes()?;
    let (tunnelled, direct) = (
        listed
            .lines()
            .filter(|l| l.contains("dev ecni-vxlan"))
            .count(),
        listed.lines().filter(|l| l.contains("dev lan0")).count(),
    );
    if tunnelled != others / 2 || direct != routes - others / 2 {
        bail!("node a routes {direct} peers directly and {tunnelled} through the tunnel, not {} and {}:\n{listed}", routes - others / 2, others / 2);
    }
    agent_a.wait_for(STARTED, Duration::from_secs(20))?;
    // Its memory once it has settled (the listing's buffers given back).
    std::thread::sleep(Duration::from_secs(2));
    f.rss.push(Subject::EbpfCni, agent_a.rss_mib()?);

    // A Node event → the first reply between pods on two nodes.
    let mut agent_b = b.spawn_agent(&plugin, &api, &creds)?;
    agent_b.wait_for(STARTED, Duration::from_secs(60))?;
    let pod_a = Pod::add_direct(&plugin, &a.node, &a.conf_value()?);
    let pod_b = Pod::add_direct(&plugin, &b.node, &b.conf_value()?);
    let route_to_b = format!("172.16.2.0/24 via {} dev lan0", b.addr);
    first_replies(
        p.cluster_events,
        (&pod_a, &pod_b),
        || {
            api.delete_node("node-b");
            Ok(())
        },
        || Ok(!a.peer_routes()?.contains(&route_to_b)),
        || {
            let t = Instant::now();
            api.set_node(node_b());
            Ok(t)
        },
        &mut f.first_reply,
    )?;
    agent_a.still_running()?;
    agent_b.still_running()?;
    Ok(())
}

// Pod → pod between two nodes.

const IPERF_PORT: u16 = 5201;
/// The Nodes of the overlay's cluster while the paths are compared, and after.
const FEW_NODES: usize = 10;
const MANY_NODES: usize = 1_000;
/// The VXLAN overhead over IPv4 (outer IPv4, UDP, VXLAN and inner Ethernet headers).
const VXLAN_OVERHEAD: u32 = 50;

/// The ways pod → pod crosses between two nodes, in the order they alternate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    /// Node → node over the LAN, no pod, no program: the ceiling.
    NodeToNode,
    EbpfDirect,
    HostGw,
    EbpfOverlay,
    FlannelVxlan,
}

const WAYS: [Way; 5] = [
    Way::NodeToNode,
    Way::EbpfDirect,
    Way::HostGw,
    Way::EbpfOverlay,
    Way::FlannelVxlan,
];

impl Way {
    /// Its column and row: the ceiling is the plain veth column of both paths.
    fn placed(self) -> (Subject, &'static [CrossPath]) {
        match self {
            Way::NodeToNode => (Subject::Veth, &[CrossPath::Direct, CrossPath::Overlay]),
            Way::EbpfDirect => (Subject::EbpfCni, &[CrossPath::Direct]),
            Way::HostGw => (Subject::Reference, &[CrossPath::Direct]),
            Way::EbpfOverlay => (Subject::EbpfCni, &[CrossPath::Overlay]),
            Way::FlannelVxlan => (Subject::Reference, &[CrossPath::Overlay]),
        }
    }
}

/// One way's client and the servers it reaches: the servers first, so they stop before
/// their namespaces go.
struct Ends {
    _iperf: Iperf3Server,
    _echo: EchoServer,
    client: Client,
    server: Ipv4Addr,
    /// What keeps the other namespaces and pods alive.
    _keep: Vec<Box<dyn std::any::Any>>,
}

/// Where the client runs: a pod, or a node's own namespace.
enum Client {
    Pod(Pod),
    Node(Node),
}

impl Client {
    fn ns(&self) -> &Netns {
        match self {
            Client::Pod(p) => &p.netns,
            Client::Node(n) => n.netns(),
        }
    }
}

fn v4(ip: std::net::IpAddr) -> Result<Ipv4Addr> {
    match ip {
        std::net::IpAddr::V4(a) => Ok(a),
        std::net::IpAddr::V6(a) => bail!("{a} is no IPv4 address"),
    }
}

/// Servers in `server_ns` on `server`, the client in `client`.
fn ends(
    server_ns: &Netns,
    server: Ipv4Addr,
    client: Client,
    keep: Vec<Box<dyn std::any::Any>>,
) -> Result<Ends> {
    Ok(Ends {
        _iperf: Iperf3Server::start(server_ns, server, IPERF_PORT)?,
        _echo: EchoServer::start(server_ns, ECHO_PORT)?,
        client,
        server,
        _keep: keep,
    })
}

/// Two ebpf-cni nodes (LAN hosts `hosts`) with their agents, on a stand-in API server of
/// their own in `mode` (with `extra` Node objects more), a pod on each.
struct EbpfPair {
    api: KubeApi,
    a: ClusterNode,
    _agents: (AgentProcess, AgentProcess),
}

fn ebpf_pair(
    plugin: &PluginUnderTest,
    lan: &Lan,
    hosts: (u8, u8),
    mode: &str,
) -> Result<(EbpfPair, Ends)> {
    let api = KubeApi::start(Some(lan.netns()), (LAN_BRIDGE_IP, 0).into(), "bench-token")?;
    let a = ClusterNode::new(plugin, lan, &format!("node-{}", hosts.0), hosts.0)?;
    let b = ClusterNode::new(plugin, lan, &format!("node-{}", hosts.1), hosts.1)?;
    let dir = a.node.scratch_dir().join("kube");
    std::fs::create_dir_all(&dir)?;
    let (ca, token) = api.write_credentials(&dir)?;
    let net = dir.join("net-conf.json");
    std::fs::write(
        &net,
        format!(r#"{{"network": "172.16.0.0/12", "mode": "{mode}"}}"#),
    )?;
    let creds = Creds { ca, token, net };
    for (n, host) in [(&a, hosts.0), (&b, hosts.1)] {
        api.set_node(kube_api::node(
            &n.name,
            &[&format!("172.16.{host}.0/24")],
            &[&n.addr.to_string()],
            &[],
        ));
    }
    let mut agent_a = a.spawn_agent(plugin, &api, &creds)?;
    let mut agent_b = b.spawn_agent(plugin, &api, &creds)?;
    agent_a.wait_for(STARTED, Duration::from_secs(30))?;
    agent_b.wait_for(STARTED, Duration::from_secs(30))?;
    let client = Pod::add_direct(plugin, &a.node, &a.conf_value()?);
    let server = Pod::add_direct(plugin, &b.node, &b.conf_value()?);
    let addr = v4(server.v4())?;
    let e = ends(&server.netns, addr, Client::Pod(client), vec![])?;
    let e = Ends {
        _keep: vec![Box::new(server), Box::new(b)],
        ..e
    };
    Ok((
        EbpfPair {
            api,
            a,
            _agents: (agent_a, agent_b),
        },
        e,
    ))
}

/// Two reference-chain nodes (ptp + host-local, LAN hosts `hosts`, each the subnet
/// 172.16.<host>.0/24) routed to each other as their users do it: host-gw routes, or with
/// `vxlan` flannel's VXLAN device (`flannel.1`: a route, a permanent neighbour and an FDB
/// entry per peer, the pods' MTU 50 bytes less).
fn reference_pair(lan: &Lan, hosts: (u8, u8), vxlan: bool) -> Result<Ends> {
    let plugin = PluginUnderTest::reference_ptp();
    let mut nodes = Vec::new();
    for host in [hosts.0, hosts.1] {
        let node = Node::new()?;
        let addr = lan.attach(node.netns(), "lan0", host)?;
        nodes.push((node, addr, host));
    }
    let mac = |host: u8| format!("0e:00:00:00:00:{host:02x}");
    for (i, (node, addr, host)) in nodes.iter().enumerate() {
        let (_, peer_addr, peer) = &nodes[1 - i];
        let ns = node.netns();
        let subnet = format!("172.16.{peer}.0/24");
        if !vxlan {
            ns.ip_ok(&[
                "route",
                "add",
                &subnet,
                "via",
                &peer_addr.to_string(),
                "dev",
                "lan0",
            ])?;
            continue;
        }
        ns.ip_ok(&[
            "link",
            "add",
            "flannel.1",
            "address",
            &mac(*host),
            "type",
            "vxlan",
            "id",
            "1",
            "local",
            &addr.to_string(),
            "dev",
            "lan0",
            "dstport",
            "8472",
            "nolearning",
        ])?;
        ns.ip_ok(&[
            "link",
            "set",
            "flannel.1",
            "mtu",
            &(1500 - VXLAN_OVERHEAD).to_string(),
            "up",
        ])?;
        ns.ip_ok(&[
            "addr",
            "add",
            &format!("172.16.{host}.0/32"),
            "dev",
            "flannel.1",
        ])?;
        let vtep = format!("172.16.{peer}.0");
        ns.ip_ok(&[
            "route",
            "add",
            &subnet,
            "via",
            &vtep,
            "dev",
            "flannel.1",
            "onlink",
        ])?;
        ns.ip_ok(&[
            "neigh",
            "add",
            &vtep,
            "lladdr",
            &mac(*peer),
            "dev",
            "flannel.1",
            "nud",
            "permanent",
        ])?;
        let out = ns.exec(&[
            "bridge",
            "fdb",
            "append",
            &mac(*peer),
            "dev",
            "flannel.1",
            "dst",
            &peer_addr.to_string(),
        ])?;
        if !out.status.success() {
            bail!(
                "bridge fdb append: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let mut pods = Vec::new();
    for (node, _, host) in &nodes {
        let mut conf = ebpf_cni_tests::config::with_v4_subnet(
            plugin.conf("1.0.0", node, Stack::V4),
            &format!("172.16.{host}.0/24"),
        );
        if vxlan {
            conf["mtu"] = Value::from(1500 - VXLAN_OVERHEAD);
        }
        pods.push(Pod::add_direct(&plugin, node, &conf));
    }
    let server = pods.pop().context("two pods")?;
    let client = pods.pop().context("two pods")?;
    let addr = v4(server.v4())?;
    let e = ends(&server.netns, addr, Client::Pod(client), vec![])?;
    Ok(Ends {
        _keep: vec![Box::new(server), Box::new(nodes)],
        ..e
    })
}

/// Two plain namespaces on the LAN (hosts `hosts`): node → node, the ceiling.
fn node_pair(lan: &Lan, hosts: (u8, u8)) -> Result<Ends> {
    let a = Node::new()?;
    let b = Node::new()?;
    lan.attach(a.netns(), "lan0", hosts.0)?;
    let server = lan.attach(b.netns(), "lan0", hosts.1)?;
    let e = ends(b.netns(), server, Client::Node(a), vec![])?;
    Ok(Ends {
        _keep: vec![Box::new(b)],
        ..e
    })
}

#[derive(Default)]
struct Cross {
    figures: std::collections::BTreeMap<(CrossFigure, CrossPath), Repeats>,
}

impl Cross {
    fn push(&mut self, figure: CrossFigure, path: CrossPath, subject: Subject, v: f64) {
        self.figures
            .entry((figure, path))
            .or_default()
            .push(subject, v);
    }
}

const FIGURES: [CrossFigure; 4] = [
    CrossFigure::Throughput { streams: 1 },
    CrossFigure::Throughput { streams: 4 },
    CrossFigure::RrP50,
    CrossFigure::Crr,
];

/// `figure` of one way's ends.
fn figure(p: &Params, e: &Ends, figure: CrossFigure) -> Result<f64> {
    let target = |port| SocketAddr::new(e.server.into(), port);
    let rr = Duration::from_secs_f64(p.rr_secs);
    Ok(match figure {
        CrossFigure::Throughput { streams } => {
            load::iperf3_streams(
                e.client.ns(),
                target(IPERF_PORT),
                p.iperf_secs,
                p.iperf_omit,
                false,
                load::Proto::Tcp,
                streams,
            )?
            .receiver_bps
                / 1e9
        }
        CrossFigure::RrP50 => {
            percentile(&load::tcp_rr(e.client.ns(), target(ECHO_PORT), rr)?, 50.0)
        }
        CrossFigure::Crr => {
            let r = load::tcp_crr(e.client.ns(), target(ECHO_PORT), rr, usize::MAX)?;
            r.connect_us.len() as f64 / r.secs
        }
    })
}

/// The cross-node table (see [`run`]).
fn cross_node(p: &Params, bins: &Binaries) -> Table {
    let mut cross = Cross::default();
    if let Err(e) = measure_cross(p, bins, &mut cross) {
        progress(&format!("cluster: pod → pod across nodes failed: {e:#}"));
        for f in FIGURES {
            for path in [CrossPath::Direct, CrossPath::Overlay] {
                cross
                    .figures
                    .entry((f, path))
                    .or_default()
                    .set_instead(Subject::EbpfCni, Cell::failed(&e));
            }
        }
    }
    let mut table = Table::new(
        "Pod → pod across nodes",
        format!("median [min–max] over {} repeat(s)", p.repeats),
    );
    let mut keys: Vec<_> = cross.figures.keys().copied().collect();
    keys.sort_by_key(|(f, path)| (*path, *f));
    table.rows = keys
        .into_iter()
        .map(|(figure, path)| {
            cross.figures[&(figure, path)].row(Metric::CrossNode { figure, path })
        })
        .collect();
    table.notes = vec![
        format!(
            "Pairs of nodes on one bridge (network namespaces joined by veths), a client pod \
             on one and a server pod on the other, one pair per way, all on the LAN at once: \
             ebpf-cni in mode direct (routes to the peer's pod subnet via its address, the \
             programs' FIB path) and in mode overlay (its VXLAN device, tunnel keys set by \
             its programs, pods' MTU {} from ADD), each pair with its agents on a stand-in \
             API server of its own with {FEW_NODES} Nodes; the reference chain (ptp + \
             host-local) with host-gw routes made by hand, and with flannel's VXLAN device \
             made by hand as flannel makes it (`flannel.1`, port 8472, a route, a permanent \
             neighbour and an FDB entry for the peer; pods' MTU {}). The plain veth column \
             is node → node over the same LAN, no pod and no program: the ceiling of both \
             paths.",
            1500 - VXLAN_OVERHEAD,
            1500 - VXLAN_OVERHEAD
        ),
        format!(
            "iperf3 -t {} -O {} with 1 and 4 streams; TCP_RR and TCP_CRR {} s per figure; \
             the ways alternate within every figure of every repeat. Then {MANY_NODES} Nodes \
             more in the overlay pair's cluster (their /24s routed through the tunnel): \
             TCP_RR and TCP_CRR again, the per-packet cost against {FEW_NODES} Nodes.",
            p.iperf_secs, p.iperf_omit, p.rr_secs
        ),
        "Goals: ebpf-cni direct ≥ 1.0× host-gw and overlay ≥ 1.0× flannel's VXLAN on each \
         figure; the overlay with 1,000 Nodes within the run's spread of 10."
            .to_owned(),
    ];
    table
}

fn measure_cross(p: &Params, bins: &Binaries, cross: &mut Cross) -> Result<()> {
    let plugin = PluginUnderTest::at(bins.ebpf_cni.clone());
    let lan = Lan::new()?;
    progress("cluster: setting up the pairs of nodes");
    let ceiling = node_pair(&lan, (9, 10))?;
    let (direct, direct_ends) = ebpf_pair(&plugin, &lan, (1, 2), "direct")?;
    let host_gw = reference_pair(&lan, (3, 4), false)?;
    let (overlay, overlay_ends) = ebpf_pair(&plugin, &lan, (5, 6), "overlay")?;
    let flannel = reference_pair(&lan, (7, 8), true)?;
    // The overlay's cluster: FEW_NODES Nodes, the others' addresses behind the LAN's gateway.
    for i in 0..FEW_NODES - 2 {
        overlay.api.set_node(peer(i));
    }
    let tunnelled = |a: &ClusterNode| -> Result<usize> {
        Ok(a.peer_routes()?
            .lines()
            .filter(|l| l.contains("dev ecni-vxlan"))
            .count())
    };
    wait("the overlay's routes", Duration::from_secs(30), || {
        Ok(tunnelled(&overlay.a)? >= FEW_NODES - 1)
    })?;
    if direct.a.peer_routes()?.contains("ecni-vxlan") {
        bail!("mode direct routes through the tunnel");
    }
    let ends_of = |w: Way| match w {
        Way::NodeToNode => &ceiling,
        Way::EbpfDirect => &direct_ends,
        Way::HostGw => &host_gw,
        Way::EbpfOverlay => &overlay_ends,
        Way::FlannelVxlan => &flannel,
    };
    for w in WAYS {
        load::probe_echo(
            ends_of(w).client.ns(),
            SocketAddr::new(ends_of(w).server.into(), ECHO_PORT),
        )
        .with_context(|| format!("{w:?}: the server pod does not answer"))?;
    }
    crate::rig::machine::settle(Duration::from_secs(5));
    for r in 0..p.repeats {
        progress(&format!(
            "cluster: pod → pod across nodes, repeat {}/{}",
            r + 1,
            p.repeats
        ));
        for f in FIGURES {
            for w in WAYS {
                let v =
                    figure(p, ends_of(w), f).with_context(|| format!("{w:?}: {}", f.label()))?;
                let (subject, paths) = w.placed();
                for path in paths {
                    cross.push(f, *path, subject, v);
                }
            }
        }
    }
    // The per-packet cost with MANY_NODES Nodes.
    for i in FEW_NODES - 2..MANY_NODES - 2 {
        overlay.api.set_node(peer(i));
    }
    wait(
        "the overlay's routes to every Node",
        Duration::from_secs(60),
        || Ok(tunnelled(&overlay.a)? >= MANY_NODES - 1),
    )?;
    let many = CrossPath::OverlayNodes { nodes: MANY_NODES };
    for r in 0..p.repeats {
        progress(&format!(
            "cluster: the overlay with {MANY_NODES} Nodes, repeat {}/{}",
            r + 1,
            p.repeats
        ));
        for f in [CrossFigure::RrP50, CrossFigure::Crr] {
            let v = figure(p, &overlay_ends, f)?;
            cross.push(f, many, Subject::EbpfCni, v);
        }
    }
    Ok(())
}

// The members from etcd.

const ETCD_PREFIX: &str = "/ebpf-cni/network";

#[derive(Default)]
struct EtcdFigures {
    figures: Figures,
    /// One `etcdctl put` alone, ms.
    put_ms: Vec<f64>,
}

/// The etcd table (see [`run`]).
fn from_etcd(p: &Params, bins: &Binaries) -> Table {
    let mut f = EtcdFigures::default();
    if let Err(e) = measure_etcd(p, bins, &mut f) {
        f.figures.fail("the etcd source", &e);
    }
    let n = p.cluster_nodes;
    let mut table = Table::new(
        &format!("The cluster network from etcd, {n} nodes"),
        format!(
            "median [min–max] over 1 agent start and {} join(s)",
            p.cluster_events
        ),
    );
    table.rows = f.figures.rows([
        Metric::EtcdAllRouted { nodes: n },
        Metric::EtcdAgentRss { nodes: n },
        Metric::EtcdFirstReply,
    ]);
    table.notes = vec![
        format!(
            "A real etcd (three members of Debian's etcd-server in namespaces on the nodes' \
             LAN), the network config 172.16.0.0/12 (subnetLen 24), and {} subnet records of \
             other nodes written first (`{ETCD_PREFIX}/subnets/…`, their addresses as in the \
             Kubernetes table: half on the node's link, half behind a gateway). Every peer \
             routed: from the start of `ebpf-cni agent --cluster etcd` on a new node (its \
             lease, its subnet taken in a transaction, the listing, the routes) to its routes \
             covering every other subnet; its VmRSS then.",
            n - 2
        ),
        format!(
            "First reply: a second node whose routes and record are made by hand (no agent): \
             its record deleted (the agent's route to it gone), then written again with \
             `etcdctl put`; from etcdctl's start to the first TCP echo between a pod on each \
             node, tried every 5 ms. It includes etcdctl's own start and exit: a put alone \
             took {} ms (median) in this run. Goal p50 ≤ 1 s.",
            if f.put_ms.is_empty() {
                "—".to_owned()
            } else {
                crate::format::short_num(percentile(&f.put_ms, 50.0))
            }
        ),
    ];
    table
}

fn etcd_record(name: &str, ip: &str) -> String {
    format!(r#"{{"node": "{name}", "publicIP": "{ip}"}}"#)
}

fn etcd_key(subnet: &str) -> String {
    format!("{ETCD_PREFIX}/subnets/{}", subnet.replace('/', "-"))
}

fn measure_etcd(p: &Params, bins: &Binaries, f: &mut EtcdFigures) -> Result<()> {
    use ebpf_cni_tests::etcd::EtcdCluster;
    let plugin = PluginUnderTest::at(bins.ebpf_cni.clone());
    progress("cluster: a real etcd");
    let etcd = EtcdCluster::start(3)?;
    etcd.put(
        &format!("{ETCD_PREFIX}/config"),
        r#"{"network": "172.16.0.0/12", "subnetLen": 24}"#,
    )?;
    let a_node = Node::new()?;
    let a_addr = etcd.attach(a_node.netns(), "lan0", 1)?;
    let b_node = Node::new()?;
    let b_addr = etcd.attach(b_node.netns(), "lan0", 2)?;
    a_node
        .netns()
        .ip_ok(&["route", "add", "10.252.0.0/16", "dev", "lan0"])?;
    a_node.netns().ip_ok(&[
        "route",
        "add",
        "10.253.0.0/16",
        "via",
        &LAN_BRIDGE_IP.to_string(),
    ])?;
    // b: the subnet 172.16.2.0/24, its record and its route to a by hand.
    let b_subnet = "172.16.2.0/24";
    let b_key = etcd_key(b_subnet);
    let b_record = etcd_record("node-b", &b_addr.to_string());
    etcd.put(&b_key, &b_record)?;
    let others = p.cluster_nodes.saturating_sub(2);
    progress(&format!("cluster: {others} subnet records in etcd"));
    for i in 0..others {
        let node = peer(i);
        let cidr = node["spec"]["podCIDRs"][0]
            .as_str()
            .context("a peer's CIDR")?
            .to_owned();
        let ip = node["status"]["addresses"][0]["address"]
            .as_str()
            .context("a peer's address")?
            .to_owned();
        etcd.put(&etcd_key(&cidr), &etcd_record(&format!("peer-{i:04}"), &ip))?;
    }
    let conf = a_node.scratch_dir().join("10-ebpf-cni.conf");
    std::fs::write(&conf, plugin.conf("1.0.0", &a_node, Stack::V4).to_string())?;
    crate::rig::machine::settle(Duration::from_secs(2));
    let routes = others + 1;
    let started = Instant::now();
    let mut agent = AgentProcess::spawn_with(
        &plugin.bin,
        a_node.netns().path(),
        Some(&conf),
        &[
            "--cluster",
            "etcd",
            "--etcd-endpoints",
            &etcd.endpoints_arg(),
            "--node-name",
            "node-a",
        ],
    )?;
    let peer_routes = || {
        a_node
            .netns()
            .ip_ok(&["-4", "route", "show", "proto", "236"])
    };
    wait(
        &format!("{routes} routes on node a"),
        Duration::from_secs(120),
        || Ok(peer_routes()?.lines().count() >= routes),
    )
    .with_context(|| format!("the agent said: {}", agent.said()))?;
    f.figures
        .all_routed
        .push(Subject::EbpfCni, started.elapsed().as_secs_f64() * 1e3);
    agent.wait_for(STARTED, Duration::from_secs(20))?;
    std::thread::sleep(Duration::from_secs(2));
    f.figures.rss.push(Subject::EbpfCni, agent.rss_mib()?);

    // a's subnet, as its agent wrote it into the conflist.
    let a_conf: Value = serde_json::from_slice(&std::fs::read(&conf)?)?;
    let a_subnet = a_conf["ipam"]["ranges"][0][0]["subnet"]
        .as_str()
        .context("no subnet in node a's conflist")?
        .to_owned();
    b_node.netns().ip_ok(&[
        "route",
        "add",
        &a_subnet,
        "via",
        &a_addr.to_string(),
        "dev",
        "lan0",
    ])?;
    let b_conf =
        ebpf_cni_tests::config::with_v4_subnet(plugin.conf("1.0.0", &b_node, Stack::V4), b_subnet);
    let pod_a = Pod::add_direct(&plugin, &a_node, &a_conf);
    let pod_b = Pod::add_direct(&plugin, &b_node, &b_conf);
    let route_to_b = format!("{b_subnet} via {b_addr} dev lan0");
    let EtcdFigures { figures, put_ms } = f;
    first_replies(
        p.cluster_events,
        (&pod_a, &pod_b),
        || etcd.del(&b_key).map(drop),
        || Ok(!peer_routes()?.contains(&route_to_b)),
        || {
            // Timed from etcdctl's start: by its return the agent has already routed
            // (the watch event leaves etcd with the write's reply). A put of another key
            // alone, right before, says what etcdctl's own start and exit add.
            let t = Instant::now();
            etcd.put(&format!("{ETCD_PREFIX}-bench/probe"), "x")?;
            put_ms.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            etcd.put(&b_key, &b_record)?;
            Ok(t)
        },
        &mut figures.first_reply,
    )?;
    agent.still_running()?;
    Ok(())
}
