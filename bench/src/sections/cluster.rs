//! The cluster network with its members from the Kubernetes API: `ebpf-cni agent
//! --cluster kubernetes` on a node of a cluster of `cluster_nodes` Node objects, served by
//! the tests' stand-in API server (`ebpf_cni_tests::kube_api`: LIST, then a streaming
//! WATCH). Measured: how long after its start the agent routes to every other node, its
//! resident memory once it watches them all, and, between two real nodes whose agents both
//! run, how long after a Node object appears (the peer's Node deleted, then created again)
//! a pod on one node gets its first reply from a pod on the other.
//!
//! Only ebpf-cni has this: the reference chain has no membership, its users route between
//! nodes by hand or with another component.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use ebpf_cni_tests::agent::{AgentProcess, STARTED};
use ebpf_cni_tests::config::Stack;
use ebpf_cni_tests::etcd::LAN_BRIDGE_IP;
use ebpf_cni_tests::kube_api::{self, KubeApi};
use ebpf_cni_tests::lan::Lan;
use ebpf_cni_tests::{Node, PluginUnderTest, Pod};
use serde_json::Value;

use crate::log::progress;
use crate::metric::Metric;
use crate::model::{Cell, Repeats, Subject, Table};
use crate::params::Params;
use crate::rig::load::{self, EchoServer};
use crate::rig::topo::Binaries;

/// The cluster's pod network; the two real nodes hold its `172.16.1.0/24` and
/// `172.16.2.0/24`, the other Nodes /24s from `172.17.0.0` up.
const NETWORK: &str = r#"{"network": "172.16.0.0/12", "mode": "auto"}"#;
const ECHO_PORT: u16 = 7000;
/// How long one attempt to reach the other pod may take before the next starts.
const ATTEMPT: Duration = Duration::from_millis(5);

pub struct Output {
    pub table: Table,
    pub nodes: usize,
}

#[derive(Default)]
struct Figures {
    all_routed: Repeats,
    rss: Repeats,
    first_reply: Repeats,
}

pub fn run(p: &Params, bins: &Binaries) -> Output {
    let mut f = Figures::default();
    if let Err(e) = measure(p, bins, &mut f) {
        progress(&format!("cluster: failed: {e:#}"));
        for r in [&mut f.all_routed, &mut f.rss, &mut f.first_reply] {
            r.set_instead(Subject::EbpfCni, Cell::failed(&e));
        }
    }
    let n = p.cluster_nodes;
    let mut table = Table::new(
        &format!("The cluster network from the Kubernetes API, {n} Nodes"),
        format!(
            "median [min–max] over 1 agent start and {} Node event(s)",
            p.cluster_events
        ),
    );
    table.rows = vec![
        f.all_routed.row(Metric::ClusterAllRouted { nodes: n }),
        f.rss.row(Metric::ClusterAgentRss { nodes: n }),
        f.first_reply.row(Metric::ClusterFirstReply),
    ];
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
    Output { table, nodes: n }
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
    let _echo = EchoServer::start(&pod_b.netns, ECHO_PORT)?;
    let target = SocketAddr::new(pod_b.v4(), ECHO_PORT);
    wait("pod a → pod b", Duration::from_secs(30), || {
        echo_once(&pod_a.netns, target)
    })?;
    let route_to_b = format!("172.16.2.0/24 via {} dev lan0", b.addr);
    for _ in 0..p.cluster_events {
        api.delete_node("node-b");
        wait("node a's route to b gone", Duration::from_secs(30), || {
            Ok(!a.peer_routes()?.contains(&route_to_b))
        })?;
        if echo_once(&pod_a.netns, target)? {
            bail!("pod a still reaches pod b without a route to it");
        }
        std::thread::sleep(Duration::from_millis(200));
        api.set_node(node_b());
        let took = wait("pod a → pod b again", Duration::from_secs(30), || {
            echo_once(&pod_a.netns, target)
        })?;
        f.first_reply
            .push(Subject::EbpfCni, took.as_secs_f64() * 1e3);
    }
    agent_a.still_running()?;
    agent_b.still_running()?;
    Ok(())
}
