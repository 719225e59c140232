//! The cluster network with its membership from a real etcd (three members of Debian's
//! etcd-server in namespaces of their own, started by the test): nodes are network
//! namespaces on one LAN with the etcd members, each with its own plugin state, each
//! running `ebpf-cni agent --cluster etcd`. An agent takes one subnet of the network config
//! for its node (never one another node's key holds), writes it into its conflist, keeps
//! it across a restart and gives it back on `--leave`; a node that dies loses it when its
//! lease expires. Pods on two nodes reach each other over the routes each agent keeps to
//! its peers' subnets; with `ipMasq` they keep their addresses towards each other.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ebpf_cni_tests::agent::AgentProcess;
use ebpf_cni_tests::config::Stack;
use ebpf_cni_tests::etcd::{EtcdCluster, LAN_BRIDGE_IP};
use ebpf_cni_tests::kube_api::{self, KubeApi};
use ebpf_cni_tests::lan::Lan;
use ebpf_cni_tests::net::{tcp_echo, tcp_transfer};
use ebpf_cni_tests::{require_root, Node, PluginUnderTest, Pod};
use ipnetwork::IpNetwork;
use serde_json::{json, Value};

const PREFIX: &str = "/ebpf-cni/network";

/// A node on the etcd cluster's LAN (its `lan0`, 10.250.0.`host`), with the test's
/// standard config written where its agent's `--conf` points.
struct ClusterNode {
    node: Node,
    name: String,
    addr: Ipv4Addr,
    conf: PathBuf,
}

impl ClusterNode {
    fn new(p: &PluginUnderTest, etcd: &EtcdCluster, name: &str, host: u8) -> Self {
        Self::attached(p, name, Stack::V4, |ns| etcd.attach(ns, "lan0", host))
    }

    /// A node on a LAN without etcd (the Kubernetes source's tests).
    fn on_lan(p: &PluginUnderTest, lan: &Lan, name: &str, host: u8) -> Self {
        Self::attached(p, name, Stack::V4, |ns| lan.attach(ns, "lan0", host))
    }

    /// Its agent with the Kubernetes source: the stand-in API server `api` (its CA and a
    /// token in `creds`), the network config `net_conf`; once it runs.
    fn kube_agent(&self, p: &PluginUnderTest, api: &KubeApi, creds: &KubeCreds) -> AgentProcess {
        let mut agent = self.spawn_kube_agent(p, api, creds);
        agent
            .wait_for(ebpf_cni_tests::agent::STARTED, Duration::from_secs(20))
            .unwrap();
        agent
    }

    /// [`Self::kube_agent`] without waiting for it to run.
    fn spawn_kube_agent(
        &self,
        p: &PluginUnderTest,
        api: &KubeApi,
        creds: &KubeCreds,
    ) -> AgentProcess {
        let port = api.addr().port().to_string();
        let (ca, token, net_conf) = (
            creds.ca.to_string_lossy(),
            creds.token.to_string_lossy(),
            creds.net_conf.to_string_lossy(),
        );
        let args = [
            "--cluster",
            "kubernetes",
            "--node-name",
            &self.name,
            "--kube-host",
            &api.addr().ip().to_string(),
            "--kube-port",
            &port,
            "--kube-ca-file",
            &ca,
            "--kube-token-file",
            &token,
            "--network-config",
            &net_conf,
        ];
        AgentProcess::spawn_with(&p.bin, self.node.netns().path(), Some(&self.conf), &args).unwrap()
    }

    /// A node behind the LAN namespace, which routes to it (`10.251.<host>.2`): the nodes on
    /// the LAN reach it only through a gateway, so their agents tunnel to it.
    fn behind_router(
        p: &PluginUnderTest,
        etcd: &EtcdCluster,
        name: &str,
        host: u8,
        stack: Stack,
    ) -> Self {
        Self::attached(p, name, stack, |ns| etcd.attach_routed(ns, "wan0", host))
    }

    /// A node whose namespace `attach` connects, returning its address, its pods of
    /// `stack`.
    fn attached(
        p: &PluginUnderTest,
        name: &str,
        stack: Stack,
        attach: impl FnOnce(&ebpf_cni_tests::Netns) -> anyhow::Result<Ipv4Addr>,
    ) -> Self {
        let node = Node::new().unwrap();
        let addr = attach(node.netns()).unwrap();
        let conf = node.scratch_dir().join("10-ebpf-cni.conf");
        std::fs::write(&conf, p.conf("1.0.0", &node, stack).to_string()).unwrap();
        Self {
            node,
            name: name.to_owned(),
            addr,
            conf,
        }
    }

    /// Whether its agent routes `subnet` through the tunnel to the node `via` (an IPv6
    /// subnet via `fe80::<via>`, its stand-in for the IPv4 address).
    fn tunnels_to(&self, subnet: IpNetwork, via: Ipv4Addr) -> bool {
        if subnet.is_ipv4() {
            return self
                .peer_routes()
                .contains(&format!("{subnet} via {via} dev ecni-vxlan"));
        }
        let [a, b, c, d] = via.octets();
        let gw = std::net::Ipv6Addr::new(
            0xfe80,
            0,
            0,
            0,
            0,
            0,
            u16::from_be_bytes([a, b]),
            u16::from_be_bytes([c, d]),
        );
        self.node
            .netns()
            .ip_ok(&["-6", "route", "show", "proto", "236"])
            .unwrap()
            .contains(&format!("{subnet} via {gw} dev ecni-vxlan"))
    }

    /// What the operator CLI's `command` (`inspect`, `metrics`) prints for the node.
    fn operator(&self, p: &PluginUnderTest, command: &str) -> String {
        let out = std::process::Command::new(&p.bin)
            .env_remove("CNI_COMMAND")
            .args([command, "--netns"])
            .arg(self.node.netns().path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{command}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    /// `inspect --json`'s tunnel part.
    fn tunnel_report(&self, p: &PluginUnderTest) -> Value {
        ebpf_cni_tests::dataplane::inspect(&p.bin, &self.node).unwrap()["tunnel"].clone()
    }

    /// Its agent with the etcd source (a lease of `ttl` seconds) and `extra` arguments.
    fn agent(
        &self,
        p: &PluginUnderTest,
        etcd: &EtcdCluster,
        ttl: u64,
        extra: &[&str],
    ) -> anyhow::Result<AgentProcess> {
        let mut args = self.agent_args(etcd, ttl);
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        AgentProcess::start_with(&p.bin, self.node.netns().path(), Some(&self.conf), &args)
    }

    /// [`Self::agent`] without waiting for its start (no extra arguments).
    fn spawn_agent(&self, p: &PluginUnderTest, etcd: &EtcdCluster, ttl: u64) -> AgentProcess {
        let args = self.agent_args(etcd, ttl);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        AgentProcess::spawn_with(&p.bin, self.node.netns().path(), Some(&self.conf), &args).unwrap()
    }

    fn agent_args(&self, etcd: &EtcdCluster, ttl: u64) -> Vec<String> {
        [
            "--cluster",
            "etcd",
            "--etcd-endpoints",
            &etcd.endpoints_arg(),
            "--node-name",
            &self.name,
            "--subnet-ttl",
            &ttl.to_string(),
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// `agent --leave`: its output.
    fn leave(&self, p: &PluginUnderTest, etcd: &EtcdCluster) -> std::process::Output {
        std::process::Command::new(&p.bin)
            .env_remove("CNI_COMMAND")
            .args(["agent", "--netns"])
            .arg(self.node.netns().path())
            .args([
                "--cluster",
                "etcd",
                "--etcd-endpoints",
                &etcd.endpoints_arg(),
            ])
            .args(["--node-name", &self.name, "--leave"])
            .output()
            .unwrap()
    }

    /// The subnets its conflist gives pods.
    fn subnets(&self) -> Vec<IpNetwork> {
        let conf = self.conf_value();
        conf["ipam"]["ranges"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|set| set[0]["subnet"].as_str()?.parse().ok())
            .collect()
    }

    /// The subnets etcd's records give the node.
    fn subnets_in_etcd(&self, etcd: &EtcdCluster) -> Vec<IpNetwork> {
        let mut out: Vec<IpNetwork> = subnet_keys(etcd)
            .into_iter()
            .filter(|(_, r)| r["node"] == self.name)
            .filter_map(|(k, _)| {
                let (net, len) = k.rsplit('/').next()?.rsplit_once('-')?;
                format!("{net}/{len}").parse().ok()
            })
            .collect();
        out.sort();
        out
    }

    /// Sets `key` of its conflist    /// Sets `key` of its conflist (before its agent starts: the agent keeps it).
    fn set_conf(&self, key: &str, value: Value) {
        let mut conf = self.conf_value();
        conf[key] = value;
        std::fs::write(&self.conf, conf.to_string()).unwrap();
    }

    fn conf_value(&self) -> Value {
        serde_json::from_slice(&std::fs::read(&self.conf).unwrap()).unwrap()
    }

    /// Whether its agent routes `subnet` via `via` on the LAN.
    fn routes_to(&self, subnet: IpNetwork, via: Ipv4Addr) -> bool {
        self.peer_routes()
            .contains(&format!("{subnet} via {via} dev lan0"))
    }

    /// The routes its agent keeps to peers (`proto 236`).
    fn peer_routes(&self) -> String {
        self.node
            .netns()
            .ip_ok(&["-4", "route", "show", "proto", "236"])
            .unwrap()
    }
}

/// The subnet keys with their records.
fn subnet_keys(etcd: &EtcdCluster) -> Vec<(String, Value)> {
    etcd.get_prefix(&format!("{PREFIX}/subnets/"))
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, serde_json::from_str(&v).unwrap()))
        .collect()
}

fn key_of(subnet: IpNetwork) -> String {
    format!("{PREFIX}/subnets/{}-{}", subnet.network(), subnet.prefix())
}

/// Polls `ok` until it holds, for at most `bound`.
fn eventually(what: &str, bound: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + bound;
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: not within {bound:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A real etcd with the network config `10.244.0.0/16` and two nodes on its LAN, their
/// conflists given `conf`'s keys (no agent started yet).
fn two_nodes(
    p: &PluginUnderTest,
    conf: &[(&str, Value)],
) -> (EtcdCluster, ClusterNode, ClusterNode) {
    let etcd = EtcdCluster::start(3).unwrap();
    etcd.put(
        &format!("{PREFIX}/config"),
        r#"{"network": "10.244.0.0/16"}"#,
    )
    .unwrap();
    let a = ClusterNode::new(p, &etcd, "node-a", 1);
    let b = ClusterNode::new(p, &etcd, "node-b", 2);
    for n in [&a, &b] {
        for (key, value) in conf {
            n.set_conf(key, value.clone());
        }
    }
    (etcd, a, b)
}

#[test]
fn nodes_take_subnets_from_etcd_keep_them_and_give_them_back() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let etcd = EtcdCluster::start(3).unwrap();
    let a = ClusterNode::new(&p, &etcd, "node-a", 1);
    let b = ClusterNode::new(&p, &etcd, "node-b", 2);

    // Without a network config the agent stops at once, naming the key.
    let err = a.agent(&p, &etcd, 60, &[]).unwrap_err().to_string();
    assert!(
        err.contains(&format!("no network config at {PREFIX}/config")),
        "{err}"
    );

    etcd.put(
        &format!("{PREFIX}/config"),
        r#"{"network": "10.244.0.0/22", "subnetLen": 24}"#,
    )
    .unwrap();
    let network: IpNetwork = "10.244.0.0/22".parse().unwrap();
    let mut agent_a = a.agent(&p, &etcd, 60, &[]).unwrap();
    let agent_b = b.agent(&p, &etcd, 60, &[]).unwrap();
    let (sa, sb) = (a.subnets(), b.subnets());
    assert_eq!((sa.len(), sb.len()), (1, 1), "{sa:?} {sb:?}");
    assert_ne!(sa, sb, "two nodes got one subnet");
    for s in sa.iter().chain(&sb) {
        assert!(network.contains(s.network()) && s.prefix() == 24, "{s}");
    }
    // Each key holds its node's name and address; the conflists keep their other keys.
    let keys = subnet_keys(&etcd);
    assert_eq!(keys.len(), 2, "{keys:?}");
    for (node, subnet) in [(&a, sa[0]), (&b, sb[0])] {
        let (_, record) = keys.iter().find(|(k, _)| *k == key_of(subnet)).unwrap();
        assert_eq!(
            record,
            &json!({"node": node.name, "publicIP": node.addr.to_string()}),
            "{keys:?}"
        );
        assert!(node.conf_value()["ipam"]["dataDir"].is_string());
    }

    // A restarted agent keeps its subnet (its key found by the node's name).
    agent_a.kill().unwrap();
    let agent_a = a.agent(&p, &etcd, 60, &[]).unwrap();
    assert_eq!(a.subnets(), sa);
    assert_eq!(subnet_keys(&etcd).len(), 2);

    // A third and a fourth node fill the /22; a fifth finds nothing free and says so.
    let c = ClusterNode::new(&p, &etcd, "node-c", 3);
    let d = ClusterNode::new(&p, &etcd, "node-d", 4);
    let e = ClusterNode::new(&p, &etcd, "node-e", 5);
    let _agent_c = c.agent(&p, &etcd, 60, &[]).unwrap();
    let mut agent_d = d.agent(&p, &etcd, 60, &[]).unwrap();
    let err = e.agent(&p, &etcd, 60, &[]).unwrap_err().to_string();
    assert!(
        err.contains("every /24 subnet of 10.244.0.0/22 is held by another node"),
        "{err}"
    );

    // A node that leaves frees its subnet at once: the waiting node gets it.
    drop(agent_a);
    let out = a.leave(&p, &etcd);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&sa[0].to_string()),
        "{out:?}"
    );
    assert!(!subnet_keys(&etcd).iter().any(|(k, _)| *k == key_of(sa[0])));
    let _agent_e = e.agent(&p, &etcd, 60, &[]).unwrap();
    assert_eq!(e.subnets(), sa, "the freed subnet goes to the next node");

    // A node that dies keeps its subnet until its lease expires (3 s here).
    agent_d.kill().unwrap();
    let sd = d.subnets();
    let mut agent_d = d.agent(&p, &etcd, 3, &[]).unwrap();
    assert_eq!(d.subnets(), sd, "the restarted node keeps its subnet");
    agent_d.kill().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        subnet_keys(&etcd).iter().any(|(k, _)| *k == key_of(sd[0])),
        "gone before its lease"
    );
    eventually(
        "the dead node's key expires",
        Duration::from_secs(15),
        || !subnet_keys(&etcd).iter().any(|(k, _)| *k == key_of(sd[0])),
    );
    drop(agent_b);
}

/// etcd behind TLS with client certificates, and etcd with a password: the agent joins
/// each with the flags that name its credentials, and without them (the CA alone; a wrong
/// password) it joins neither and says why, trying again.
#[test]
fn the_agent_joins_an_etcd_over_tls_and_one_with_a_password() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let config = r#"{"network": "10.244.0.0/16"}"#;
    // Up to the agent's connect (5 s) and request (10 s) timeouts pass before it says why:
    // a member that refuses the certificate after TLS 1.3's handshake may leave the first
    // request unanswered.
    let said_within = |agent: &mut AgentProcess, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let said = agent.said();
            if said.contains(what) {
                return said;
            }
            if let Err(e) = agent.still_running() {
                panic!("waiting for {what:?}: {e:#}");
            }
            assert!(
                Instant::now() < deadline,
                "the agent did not say {what:?}:\n{said}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };

    let etcd = EtcdCluster::start_tls(1).unwrap();
    etcd.put(&format!("{PREFIX}/config"), config).unwrap();
    let tls = etcd.client_tls().unwrap().clone();
    assert!(etcd.endpoints_arg().starts_with("https://"));
    let a = ClusterNode::new(&p, &etcd, "node-a", 1);
    let path = |p: &PathBuf| p.to_string_lossy().into_owned();
    let (ca, cert, key) = (path(&tls.ca), path(&tls.cert), path(&tls.key));
    // The CA alone: the member asks for a certificate the agent does not have.
    let mut args = a.agent_args(&etcd, 60);
    args.extend(["--etcd-ca-file".to_owned(), ca.clone()]);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut agent =
        AgentProcess::spawn_with(&p.bin, a.node.netns().path(), Some(&a.conf), &argv).unwrap();
    // (What the member's refusal looks like depends on when TLS 1.3 delivers its alert:
    // "BadCertificate", or a connection cut short.)
    let said = said_within(
        &mut agent,
        "joining the cluster network: connecting to etcd",
    );
    assert!(a.subnets_in_etcd(&etcd).is_empty(), "{said}");
    // A member that hangs up on the refused certificate while the agent writes must cost a
    // failed write, not the agent (it had died of SIGPIPE now and then, saying nothing).
    assert!(agent.ignores_sigpipe().unwrap(), "{said}");
    agent.kill().unwrap();
    let _agent = a
        .agent(
            &p,
            &etcd,
            60,
            &[
                "--etcd-ca-file",
                &ca,
                "--etcd-cert-file",
                &cert,
                "--etcd-key-file",
                &key,
            ],
        )
        .unwrap();
    assert_eq!(a.subnets_in_etcd(&etcd), a.subnets(), "over TLS");
    drop(etcd);

    let mut etcd = EtcdCluster::start(1).unwrap();
    etcd.put(&format!("{PREFIX}/config"), config).unwrap();
    etcd.enable_auth("s3cret").unwrap();
    let b = ClusterNode::new(&p, &etcd, "node-b", 2);
    let mut args = b.agent_args(&etcd, 60);
    args.extend(["--etcd-username", "root", "--etcd-password", "wrong"].map(str::to_owned));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut agent =
        AgentProcess::spawn_with(&p.bin, b.node.netns().path(), Some(&b.conf), &argv).unwrap();
    let said = said_within(&mut agent, "authentication failed");
    assert!(b.subnets_in_etcd(&etcd).is_empty(), "{said}");
    agent.kill().unwrap();
    let _agent = b
        .agent(
            &p,
            &etcd,
            60,
            &["--etcd-username", "root", "--etcd-password", "s3cret"],
        )
        .unwrap();
    assert_eq!(b.subnets_in_etcd(&etcd), b.subnets(), "with the password");
}

#[test]
fn pods_on_two_nodes_reach_each_other_over_direct_routes() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let (etcd, a, b) = two_nodes(&p, &[]);
    let mut agent_a = a.agent(&p, &etcd, 60, &[]).unwrap();
    let agent_b = b.agent(&p, &etcd, 60, &[]).unwrap();
    let (sa, sb) = (a.subnets()[0], b.subnets()[0]);
    let pod_a = Pod::add_direct(&p, &a.node, &a.conf_value());
    let pod_b = Pod::add_direct(&p, &b.node, &b.conf_value());
    assert!(sa.contains(pod_a.v4()) && sb.contains(pod_b.v4()));

    // Each agent routes to the other's subnet via its LAN address.
    eventually(
        "node a's route to b's subnet",
        Duration::from_secs(5),
        || a.routes_to(sb, b.addr),
    );
    eventually(
        "node b's route to a's subnet",
        Duration::from_secs(5),
        || b.routes_to(sa, a.addr),
    );
    tcp_echo(&pod_a.netns, &pod_b.netns, pod_b.v4(), 0).expect("pod a -> pod b");
    tcp_echo(&pod_b.netns, &pod_a.netns, pod_a.v4(), 0).expect("pod b -> pod a");
    tcp_echo(a.node.netns(), &pod_b.netns, pod_b.v4(), 0).expect("node a -> pod b");

    // A route deleted by hand comes back; an agent restarted changes nothing.
    a.node
        .netns()
        .ip_ok(&["route", "del", &sb.to_string(), "proto", "236"])
        .unwrap();
    eventually("the deleted route back", Duration::from_secs(15), || {
        a.routes_to(sb, b.addr)
    });
    agent_a.kill().unwrap();
    assert!(
        a.routes_to(sb, b.addr),
        "the routes stay while the agent is down"
    );
    tcp_echo(&pod_a.netns, &pod_b.netns, pod_b.v4(), 0).expect("pod a -> pod b, agent down");
    let _agent_a = a.agent(&p, &etcd, 60, &[]).unwrap();
    assert_eq!(a.peer_routes().lines().count(), 1, "{}", a.peer_routes());

    // A node that leaves takes its route with it; back, it gets it again.
    drop(agent_b);
    assert!(b.leave(&p, &etcd).status.success());
    eventually("a's route to b removed", Duration::from_secs(5), || {
        a.peer_routes().trim().is_empty()
    });
    let _agent_b = b.agent(&p, &etcd, 60, &[]).unwrap();
    assert_eq!(b.subnets()[0], sb, "b asks for the subnet its pods use");
    eventually("a's route to b back", Duration::from_secs(5), || {
        a.routes_to(sb, b.addr)
    });
    tcp_echo(&pod_a.netns, &pod_b.netns, pod_b.v4(), 0).expect("pod a -> pod b again");

    pod_a.del_direct(&p, &a.node, &a.conf_value());
    pod_b.del_direct(&p, &b.node, &b.conf_value());
}

/// A node that already has pods joins: its agent takes the subnet the conflist gives them
/// (free in etcd), so they keep their addresses, and they reach the peer's pods at once;
/// the node's next pods come from the same subnet.
#[test]
fn a_node_with_pods_joins_and_its_pods_keep_their_addresses() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let (etcd, a, b) = two_nodes(&p, &[]);
    let own: IpNetwork = "10.244.77.0/24".parse().unwrap();
    a.set_conf("ipam", {
        let mut ipam = a.conf_value()["ipam"].clone();
        ipam["ranges"] = json!([[{ "subnet": own.to_string() }]]);
        ipam
    });
    let before = Pod::add_direct(&p, &a.node, &a.conf_value());
    assert!(own.contains(before.v4()), "{}", before.v4());

    let _agent_a = a.agent(&p, &etcd, 60, &[]).unwrap();
    let _agent_b = b.agent(&p, &etcd, 60, &[]).unwrap();
    assert_eq!(a.subnets(), vec![own], "the subnet its pods use");
    let keys = subnet_keys(&etcd);
    let (_, record) = keys
        .iter()
        .find(|(k, _)| *k == key_of(own))
        .unwrap_or_else(|| panic!("no key for {own}: {keys:?}"));
    assert_eq!(record["node"], "node-a", "{keys:?}");
    let sb = b.subnets()[0];
    assert_ne!(sb, own);

    let pod_b = Pod::add_direct(&p, &b.node, &b.conf_value());
    eventually(
        "node b's route to the pods' subnet",
        Duration::from_secs(5),
        || b.routes_to(own, a.addr),
    );
    eventually(
        "node a's route to b's subnet",
        Duration::from_secs(5),
        || a.routes_to(sb, b.addr),
    );
    tcp_echo(&before.netns, &pod_b.netns, pod_b.v4(), 0).expect("the earlier pod -> pod b");
    tcp_echo(&pod_b.netns, &before.netns, before.v4(), 0).expect("pod b -> the earlier pod");
    let after = Pod::add_direct(&p, &a.node, &a.conf_value());
    assert!(own.contains(after.v4()), "{}", after.v4());
    assert_ne!(after.v4(), before.v4());
    tcp_echo(&pod_b.netns, &after.netns, after.v4(), 0).expect("pod b -> the later pod");

    for pod in [before, after] {
        pod.del_direct(&p, &a.node, &a.conf_value());
    }
    pod_b.del_direct(&p, &b.node, &b.conf_value());
}

#[test]
fn masquerading_pods_keep_their_address_towards_the_cluster_network() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let (etcd, a, b) = two_nodes(&p, &[("ipMasq", json!(true))]);
    let _agent_a = a.agent(&p, &etcd, 60, &[]).unwrap();
    let _agent_b = b.agent(&p, &etcd, 60, &[]).unwrap();
    // The agent names the cluster's pod network in the conflist, beside the operator's keys.
    for n in [&a, &b] {
        let conf = n.conf_value();
        assert_eq!(conf["clusterNetworks"], json!(["10.244.0.0/16"]), "{conf}");
        assert_eq!(conf["ipMasq"], json!(true), "{conf}");
    }
    let pod_a = Pod::add_direct(&p, &a.node, &a.conf_value());
    let pod_b = Pod::add_direct(&p, &b.node, &b.conf_value());
    let sb = b.subnets()[0];
    eventually(
        "node a's route to b's subnet",
        Duration::from_secs(5),
        || {
            a.peer_routes()
                .contains(&format!("{sb} via {} dev lan0", b.addr))
        },
    );

    // To a pod on the other node the pod's own address; to the other node itself (outside
    // the cluster's pod network) the node's address: masquerade is on, and skips the pods.
    let to_pod = tcp_echo(&pod_a.netns, &pod_b.netns, pod_b.v4(), 0).expect("pod a -> pod b");
    assert_eq!(to_pod.client_addr.ip(), pod_a.v4(), "pod b saw {to_pod:?}");
    let to_node =
        tcp_echo(&pod_a.netns, b.node.netns(), b.addr.into(), 0).expect("pod a -> node b");
    assert_eq!(
        to_node.client_addr.ip(),
        std::net::IpAddr::from(a.addr),
        "node b saw {to_node:?}"
    );
    let back = tcp_echo(&pod_b.netns, &pod_a.netns, pod_a.v4(), 0).expect("pod b -> pod a");
    assert_eq!(back.client_addr.ip(), pod_b.v4(), "pod a saw {back:?}");

    pod_a.del_direct(&p, &a.node, &a.conf_value());
    pod_b.del_direct(&p, &b.node, &b.conf_value());
}

/// etcd on a bad day, with leases of 30 s:
/// - the leader killed, then a second member (no quorum): a node whose agent starts then
///   waits for etcd and joins once a member is back, both nodes route to it, and the
///   nodes' leases are kept (node b's key outlives its 30 s after the kill);
/// - node a cut off from etcd for 20 s (longer than the client's keep-alive gives a silent
///   connection), while node c leaves, node d joins and the history is compacted: a's
///   routes stay as they were meanwhile (nothing is flushed), and once etcd is back it
///   lists the members again and follows them: a route to d, none to c, its own subnet kept,
///   b's route to a in place, the pods talking.
#[test]
fn the_routes_outlive_an_etcd_outage_and_follow_through_leader_loss_and_compaction() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let (mut etcd, a, b) = two_nodes(&p, &[]);
    let _agent_a = a.agent(&p, &etcd, 30, &[]).unwrap();
    let _agent_b = b.agent(&p, &etcd, 30, &[]).unwrap();
    let (sa, sb) = (a.subnets()[0], b.subnets()[0]);
    let pod_a = Pod::add_direct(&p, &a.node, &a.conf_value());
    let pod_b = Pod::add_direct(&p, &b.node, &b.conf_value());
    eventually("a's route to b", Duration::from_secs(5), || {
        a.routes_to(sb, b.addr)
    });
    eventually("b's route to a", Duration::from_secs(5), || {
        b.routes_to(sa, a.addr)
    });

    // The leader goes, then a second member: no quorum. A node whose agent starts now
    // waits for etcd, and joins once a member is back; both nodes route to it.
    let leader = etcd.leader().unwrap();
    etcd.kill(leader).unwrap();
    let killed_at = Instant::now();
    let second = etcd.leader().unwrap();
    etcd.kill(second).unwrap();
    let c = ClusterNode::new(&p, &etcd, "node-c", 3);
    let mut agent_c = c.spawn_agent(&p, &etcd, 30);
    agent_c
        .wait_for("joining the cluster network", Duration::from_secs(30))
        .unwrap();
    etcd.restart(second).unwrap();
    agent_c
        .wait_for(ebpf_cni_tests::agent::STARTED, Duration::from_secs(45))
        .unwrap();
    let sc = c.subnets()[0];
    for n in [&a, &b] {
        eventually(
            &format!("{}'s route to c, the leader down", n.name),
            Duration::from_secs(15),
            || n.routes_to(sc, c.addr),
        );
    }
    etcd.restart(leader).unwrap();

    // Node a cut off from every member (its packets to and from etcd's port dropped).
    let cut = |on: bool| {
        let script = if on {
            "add table inet cutoff\n\
             add chain inet cutoff out { type filter hook output priority 0; }\n\
             add rule inet cutoff out tcp dport 2379 drop\n\
             add chain inet cutoff in { type filter hook input priority 0; }\n\
             add rule inet cutoff in tcp sport 2379 drop\n"
        } else {
            "delete table inet cutoff\n"
        };
        let mut child = std::process::Command::new("nsenter")
            .arg(format!("--net={}", a.node.netns().path().display()))
            .args(["--", "nft", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), script.as_bytes()).unwrap();
        assert!(child.wait().unwrap().success(), "nft: {script}");
    };
    cut(true);
    let cut_at = Instant::now();
    drop(agent_c);
    assert!(c.leave(&p, &etcd).status.success());
    let d = ClusterNode::new(&p, &etcd, "node-d", 4);
    let _agent_d = d.agent(&p, &etcd, 30, &[]).unwrap();
    let sd = d.subnets()[0];
    etcd.compact().unwrap();
    eventually(
        "b follows c's leave and d's join",
        Duration::from_secs(5),
        || b.routes_to(sd, d.addr) && !b.routes_to(sc, c.addr),
    );
    std::thread::sleep(Duration::from_secs(20).saturating_sub(cut_at.elapsed()));
    assert!(
        a.routes_to(sb, b.addr) && a.routes_to(sc, c.addr),
        "a's routes changed while etcd was away:\n{}",
        a.peer_routes()
    );
    tcp_echo(&pod_a.netns, &pod_b.netns, pod_b.v4(), 0).expect("pod a -> pod b, etcd away");
    cut(false);

    eventually(
        "a follows the members again",
        Duration::from_secs(45),
        || a.routes_to(sd, d.addr) && !a.routes_to(sc, c.addr) && a.routes_to(sb, b.addr),
    );
    eventually("b's route to a", Duration::from_secs(45), || {
        b.routes_to(sa, a.addr)
    });
    assert_eq!(a.subnets(), vec![sa], "a keeps its subnet");
    assert!(
        killed_at.elapsed() > Duration::from_secs(30),
        "b's lease has not been through a whole TTL since the leader went"
    );
    let keys = subnet_keys(&etcd);
    for (n, s) in [(&a, sa), (&b, sb)] {
        assert!(
            keys.iter().any(|(k, _)| *k == key_of(s)),
            "{}'s key is gone: {keys:?}",
            n.name
        );
    }
    tcp_echo(&pod_a.netns, &pod_b.netns, pod_b.v4(), 0).expect("pod a -> pod b");
    tcp_echo(&pod_b.netns, &pod_a.netns, pod_a.v4(), 0).expect("pod b -> pod a");
    pod_a.del_direct(&p, &a.node, &a.conf_value());
    pod_b.del_direct(&p, &b.node, &b.conf_value());
}

/// A node whose address on the LAN changes (the new one added, the old one taken away, as a
/// DHCP renewal with a new lease does): its agent notices within a second, rewrites its
/// keys' records, and the peer routes its subnet via the new address; the pods talk again.
#[test]
fn a_node_whose_address_changes_is_routed_to_at_its_new_address() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let (etcd, a, b) = two_nodes(&p, &[]);
    let _agent_a = a.agent(&p, &etcd, 60, &[]).unwrap();
    let _agent_b = b.agent(&p, &etcd, 60, &[]).unwrap();
    let sb = b.subnets()[0];
    let pod_a = Pod::add_direct(&p, &a.node, &a.conf_value());
    let pod_b = Pod::add_direct(&p, &b.node, &b.conf_value());
    eventually("a's route to b", Duration::from_secs(5), || {
        a.routes_to(sb, b.addr)
    });
    tcp_echo(&pod_a.netns, &pod_b.netns, pod_b.v4(), 0).expect("pod a -> pod b");

    let new = Ipv4Addr::new(10, 250, 0, 50);
    let ns = b.node.netns();
    // The new address stays when the old, primary one goes.
    ns.exec(&["sysctl", "-qw", "net.ipv4.conf.lan0.promote_secondaries=1"])
        .unwrap();
    ns.ip_ok(&["addr", "add", &format!("{new}/24"), "dev", "lan0"])
        .unwrap();
    ns.ip_ok(&["addr", "del", &format!("{}/24", b.addr), "dev", "lan0"])
        .unwrap();
    let moved = Instant::now();
    eventually(
        "a's route to b's subnet via b's new address",
        Duration::from_secs(30),
        || a.routes_to(sb, new),
    );
    eprintln!(
        "a routes to b's new address {:?} after the change",
        moved.elapsed()
    );
    assert!(!a.routes_to(sb, b.addr), "{}", a.peer_routes());
    let keys = subnet_keys(&etcd);
    let (_, record) = keys.iter().find(|(k, _)| *k == key_of(sb)).unwrap();
    assert_eq!(record["publicIP"], json!(new.to_string()), "{keys:?}");
    tcp_echo(&pod_a.netns, &pod_b.netns, pod_b.v4(), 0).expect("pod a -> pod b, moved");
    eventually("pod b reaches pod a", Duration::from_secs(15), || {
        tcp_echo(&pod_b.netns, &pod_a.netns, pod_a.v4(), 0).is_ok()
    });
    pod_a.del_direct(&p, &a.node, &a.conf_value());
    pod_b.del_direct(&p, &b.node, &b.conf_value());
}

/// A Service on node a (kube-proxy's iptables rules, nft backend, learned by a's agent)
/// whose endpoint is a pod on node b: pod a reaches it through the ClusterIP over the
/// route to b, the endpoint sees pod a's own address, and the answer comes back from the
/// ClusterIP (the endpoint's reply, arriving from the LAN, goes through the stack); a host
/// outside reaches it through node a's NodePort (externalTrafficPolicy Cluster).
#[test]
fn a_remote_pod_serves_a_cluster_ip_and_a_node_port() {
    use ebpf_cni_tests::kube_proxy::{self as kp, Backend, Proto, Service};
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let (etcd, a, b) = two_nodes(&p, &[]);
    let _agent_a = a.agent(&p, &etcd, 60, &[]).unwrap();
    let _agent_b = b.agent(&p, &etcd, 60, &[]).unwrap();
    let (sa, sb) = (a.subnets()[0], b.subnets()[0]);
    // A host outside, behind node a's second link, for the NodePort.
    let ext = ebpf_cni_tests::external::ExternalHost::attach(a.node.netns(), "up0", 72).unwrap();
    let pod_a = Pod::add_direct(&p, &a.node, &a.conf_value());
    let pod_b = Pod::add_direct(&p, &b.node, &b.conf_value());
    eventually("the routes between a and b", Duration::from_secs(5), || {
        a.routes_to(sb, b.addr) && b.routes_to(sa, a.addr)
    });
    let vip = Ipv4Addr::new(10, 96, 0, 10);
    let endpoint = SocketAddr::new(pod_b.v4(), 8080);
    let mut svc = Service::new("default/web:http", vip.into(), 80, Proto::Tcp).endpoint(endpoint);
    svc.node_port = Some(30_080);
    kp::load_iptables(
        a.node.netns(),
        true,
        Backend::Nft,
        &kp::iptables_rules(&[svc], "10.244.0.0/16"),
    )
    .unwrap();
    let listener = pod_b
        .netns
        .run_in(|| TcpListener::bind(endpoint))
        .unwrap()
        .unwrap();
    listener.set_nonblocking(true).unwrap();
    let dial = SocketAddr::new(vip.into(), 80);
    // The agent reads kube-proxy's rules every 3 s. In the 6.12 guest (one vCPU, two tests at
    // a time) the endpoint once read EOF from the connection it accepted: an attempt given
    // up on after 1 s can complete at the endpoint after its client closed. So an attempt
    // has 3 s, and the endpoint takes only this client's connection (by its port).
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut client, (mut server, from)) = 'connected: loop {
        let c = pod_a
            .netns
            .run_in(|| TcpStream::connect_timeout(&dial, Duration::from_secs(3)))
            .unwrap();
        if let Ok(c) = c {
            let port = c.local_addr().unwrap().port();
            let deadline = Instant::now() + Duration::from_secs(3);
            loop {
                match listener.accept() {
                    Ok((s, peer)) if peer.port() == port => break 'connected (c, (s, peer)),
                    Ok((_, peer)) => eprintln!("an earlier attempt's connection from {peer}"),
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(e) => panic!("the connection to {dial} reached no endpoint: {e}"),
                }
            }
        } else {
            assert!(Instant::now() < deadline, "pod a -> {dial}: {c:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    assert_eq!(from.ip(), pod_a.v4(), "the endpoint saw {from}");
    assert_eq!(client.peer_addr().unwrap(), dial);
    server.set_nonblocking(false).unwrap();
    server
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    client.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    server.read_exact(&mut buf).unwrap();
    server.write_all(b"pong").unwrap();
    client
        .read_exact(&mut buf)
        .expect("the endpoint's answer through the ClusterIP");
    assert_eq!(&buf, b"pong");
    drop((client, server));

    // The NodePort on node a (externalTrafficPolicy Cluster): the host outside reaches the
    // pod on node b, which sees node a's address (kube-proxy masquerades it), and the
    // answer comes back from the NodePort.
    let node_port = SocketAddr::new(ext.node_v4.into(), 30_080);
    let mut client = ext
        .netns()
        .run_in(|| TcpStream::connect_timeout(&node_port, Duration::from_secs(3)))
        .unwrap()
        .unwrap_or_else(|e| panic!("the outside host -> {node_port}: {e}"));
    listener.set_nonblocking(false).unwrap();
    let (mut server, from) = listener.accept().unwrap();
    assert_eq!(
        from.ip(),
        std::net::IpAddr::V4(a.addr),
        "the endpoint saw {from}"
    );
    client
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    client.write_all(b"ping").unwrap();
    server.read_exact(&mut buf).unwrap();
    server.write_all(b"pong").unwrap();
    client
        .read_exact(&mut buf)
        .expect("the endpoint's answer through the NodePort");
    assert_eq!(&buf, b"pong");
    drop((client, server));
    pod_a.del_direct(&p, &a.node, &a.conf_value());
    pod_b.del_direct(&p, &b.node, &b.conf_value());
}

/// Mode `direct` with a peer behind a router: the peer gets no route (no tunnel either),
/// the agent goes on, and the node reports the subnet and why in `inspect` and the metrics;
/// once the mode allows the tunnel, the report goes.
#[test]
fn a_peer_behind_a_gateway_in_mode_direct_gets_no_route_and_is_reported() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let etcd = EtcdCluster::start(1).unwrap();
    let config = |mode: &str| {
        etcd.put(
            &format!("{PREFIX}/config"),
            &format!(r#"{{"network": "10.244.0.0/16", "mode": "{mode}"}}"#),
        )
        .unwrap();
    };
    config("direct");
    let a = ClusterNode::new(&p, &etcd, "node-a", 1);
    EtcdCluster::route_to_routed(a.node.netns()).unwrap();
    let c = ClusterNode::behind_router(&p, &etcd, "node-c", 3, Stack::V4);
    let agent_a = a.agent(&p, &etcd, 60, &[]).unwrap();
    let _agent_c = c.agent(&p, &etcd, 60, &[]).unwrap();
    let sc = c.subnets()[0];
    let pod_a = Pod::add_direct(&p, &a.node, &a.conf_value());
    let unrouted =
        || ebpf_cni_tests::dataplane::inspect(&p.bin, &a.node).unwrap()["unrouted_peers"].clone();
    eventually(
        "node a reports node c's subnet without a route",
        Duration::from_secs(15),
        || unrouted().as_array().is_some_and(|a| !a.is_empty()),
    );
    let list = unrouted();
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list[0]["subnet"], sc.to_string(), "{list}");
    assert_eq!(list[0]["node"], "node-c", "{list}");
    let why = list[0]["why"].as_str().unwrap();
    assert!(
        why.contains(&c.addr.to_string()) && why.contains("gateway"),
        "{why}"
    );
    assert_eq!(a.peer_routes().trim(), "", "a route in mode direct");
    assert!(
        a.node
            .netns()
            .ip_ok(&["link", "show", "ecni-vxlan"])
            .is_err(),
        "a tunnel device in mode direct"
    );
    let text = a.operator(&p, "inspect");
    assert!(
        text.contains(&format!("  {sc} of node node-c: {why}")),
        "{text}"
    );
    let text = a.operator(&p, "metrics");
    assert!(
        text.lines()
            .any(|l| l == "ebpf_cni_cluster_unrouted_peer_subnets 1"),
        "{text}"
    );

    // Mode auto (the agent restarted with it): the peer goes through the tunnel, and the
    // node no longer reports it.
    drop(agent_a);
    config("auto");
    let _agent_a = a.agent(&p, &etcd, 60, &[]).unwrap();
    eventually(
        "node a's tunnel route to node c",
        Duration::from_secs(15),
        || a.tunnels_to(sc, c.addr),
    );
    eventually("the report gone", Duration::from_secs(15), || {
        unrouted().as_array().is_some_and(Vec::is_empty)
    });
    pod_a.del_direct(&p, &a.node, &a.conf_value());
}

/// In mode `overlay` every peer goes through the tunnel, even one on the node's link, on
/// the configured port and with outer UDP checksums when asked; a packet over the
/// tunnel's MTU with DF is refused with "fragmentation needed".
#[test]
fn mode_overlay_tunnels_to_every_peer_on_its_port_with_checksums() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    // The pods' MTU as an operator leaves it, the underlay's: the agents lower it to the
    // tunnel's, so pod b takes the datagram at the tunnel's limit below (5.10's
    // `bpf_redirect_peer` drops a packet longer than the receiving pod's MTU:
    // docs/kernels.md).
    let (etcd, a, b) = two_nodes(&p, &[("mtu", json!(1500))]);
    etcd.put(
        &format!("{PREFIX}/config"),
        r#"{"network": "10.244.0.0/16", "mode": "overlay", "vxlanPort": 4789, "vxlanUdpChecksum": true}"#,
    )
    .unwrap();
    let _agent_a = a.agent(&p, &etcd, 60, &[]).unwrap();
    let _agent_b = b.agent(&p, &etcd, 60, &[]).unwrap();
    let (sa, sb) = (a.subnets()[0], b.subnets()[0]);
    eventually(
        "a's tunnel route to b's subnet",
        Duration::from_secs(5),
        || a.tunnels_to(sb, b.addr),
    );
    eventually(
        "b's tunnel route to a's subnet",
        Duration::from_secs(5),
        || b.tunnels_to(sa, a.addr),
    );
    assert!(!a.routes_to(sb, b.addr), "a direct route in mode overlay");
    let link = a
        .node
        .netns()
        .ip_ok(&["-d", "link", "show", "ecni-vxlan"])
        .unwrap();
    assert!(
        link.contains("dstport 4789") && link.contains(" udpcsum"),
        "{link}"
    );
    let pod_a = Pod::add_direct(&p, &a.node, &a.conf_value());
    let pod_b = Pod::add_direct(&p, &b.node, &b.conf_value());
    let eth0 = pod_b.netns.ip_ok(&["link", "show", "eth0"]).unwrap();
    assert!(eth0.contains("mtu 1450"), "pod b: {eth0}");
    tcp_echo(&pod_a.netns, &pod_b.netns, pod_b.v4(), 0).expect("pod a -> pod b");
    tcp_transfer(&pod_b.netns, &pod_a.netns, pod_a.v4(), 1 << 20).expect("pod b => pod a");
    for (n, what) in [(&a, "a"), (&b, "b")] {
        let t = n.tunnel_report(&p);
        assert!(
            t["encap_packets"].as_u64().unwrap() > 0 && t["decap_packets"].as_u64().unwrap() > 0,
            "node {what}: {t}"
        );
    }

    // A pod that kept the underlay's MTU (one added before the agent lowered it): a
    // datagram with DF at the tunnel's limit (1,450 bytes of IP) crosses; one byte more is
    // refused by node a with "fragmentation needed" (counted: IpFragFails), from which the
    // pod learns the path's MTU.
    let mut conf = a.conf_value();
    conf["mtu"] = 1500.into();
    let wide = Pod::add_direct(&p, &a.node, &conf);
    let server = pod_b
        .netns
        .run_in(|| std::net::UdpSocket::bind((pod_b.v4(), 0)))
        .unwrap()
        .unwrap();
    server
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let to = server.local_addr().unwrap();
    let send = |len: usize| {
        wide.netns
            .run_in(|| {
                use std::os::fd::AsRawFd;
                let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
                let df: libc::c_int = libc::IP_PMTUDISC_DO;
                // SAFETY: setsockopt(2) on an open socket with an int option it reads.
                let rc = unsafe {
                    libc::setsockopt(
                        s.as_raw_fd(),
                        libc::IPPROTO_IP,
                        libc::IP_MTU_DISCOVER,
                        (&df as *const libc::c_int).cast(),
                        std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                    )
                };
                assert_eq!(rc, 0, "IP_MTU_DISCOVER");
                s.send_to(&vec![b'x'; len], to).unwrap();
            })
            .unwrap()
    };
    let mut buf = [0u8; 2048];
    send(1450 - 28);
    let (n, _) = server
        .recv_from(&mut buf)
        .expect("the datagram at the limit");
    assert_eq!(n, 1450 - 28);
    let refused = snmp(a.node.netns(), "IpFragFails");
    send(1450 - 28 + 1);
    assert!(
        server.recv_from(&mut buf).is_err(),
        "a datagram over the tunnel's MTU with DF crossed"
    );
    assert_eq!(snmp(a.node.netns(), "IpFragFails"), refused + 1);
    let route = wide
        .netns
        .ip_ok(&["route", "get", &pod_b.v4().to_string()])
        .unwrap();
    assert!(route.contains("mtu 1450"), "the pod's route cache: {route}");
    wide.del_direct(&p, &a.node, &conf);

    pod_a.del_direct(&p, &a.node, &a.conf_value());
    pod_b.del_direct(&p, &b.node, &b.conf_value());
}

/// A node behind a router is reached through the tunnel: the agents on both sides route to
/// each other's subnet via the peer's address on `ecni-vxlan`, the programs give each
/// packet its tunnel key (counted on both nodes), pods and the node reach the pods across,
/// VXLAN from a host that is no member, or from a member with another subnet's source,
/// is dropped and counted, never delivered; a port another device holds stops the agent.
#[test]
fn pods_reach_a_node_behind_a_router_through_the_tunnel() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let etcd = EtcdCluster::start(3).unwrap();
    etcd.put(
        &format!("{PREFIX}/config"),
        r#"{"network": "10.244.0.0/16", "ipv6Network": "fd00:10:244::/56"}"#,
    )
    .unwrap();
    let a = ClusterNode::attached(&p, "node-a", Stack::Dual, |ns| etcd.attach(ns, "lan0", 1));
    EtcdCluster::route_to_routed(a.node.netns()).unwrap();
    let c = ClusterNode::behind_router(&p, &etcd, "node-c", 3, Stack::Dual);
    // The pods' MTU as an operator leaves it, the underlay's: the agents lower it.
    for n in [&a, &c] {
        n.set_conf("mtu", 1500.into());
    }
    // flannel's device on the port: the agent stops, naming it, and leaves no device.
    let ns = a.node.netns();
    ns.ip_ok(&[
        "link",
        "add",
        "flannel.1",
        "type",
        "vxlan",
        "id",
        "1",
        "dstport",
        "8472",
        "dev",
        "lan0",
        "nolearning",
    ])
    .unwrap();
    ns.ip_ok(&["link", "set", "flannel.1", "up"]).unwrap();
    let err = a.agent(&p, &etcd, 60, &[]).unwrap_err().to_string();
    assert!(
        err.contains("the VXLAN port 8472 is held by the VXLAN device flannel.1")
            && err.contains("vxlanPort"),
        "{err}"
    );
    assert!(
        ns.ip_ok(&["link", "show", "ecni-vxlan"]).is_err(),
        "a device left"
    );
    ns.ip_ok(&["link", "del", "flannel.1"]).unwrap();

    let _agent_a = a.agent(&p, &etcd, 60, &[]).unwrap();
    let _agent_c = c.agent(&p, &etcd, 60, &[]).unwrap();
    let family = |n: &ClusterNode, v6: bool| {
        n.subnets()
            .into_iter()
            .find(|s| s.is_ipv6() == v6)
            .unwrap_or_else(|| panic!("{}: no subnet of the family", n.name))
    };
    let (sa, sc) = (family(&a, false), family(&c, false));
    let (sa6, sc6) = (family(&a, true), family(&c, true));
    let pod_a = Pod::add_direct(&p, &a.node, &a.conf_value());
    let pod_c = Pod::add_direct(&p, &c.node, &c.conf_value());

    for (subnet, from, to) in [(sc, &a, &c), (sa, &c, &a), (sc6, &a, &c), (sa6, &c, &a)] {
        eventually(
            &format!("{}'s tunnel route to {subnet}", from.name),
            Duration::from_secs(5),
            || from.tunnels_to(subnet, to.addr),
        );
    }
    // The overhead taken off the underlay's MTU.
    let link = a
        .node
        .netns()
        .ip_ok(&["-d", "link", "show", "ecni-vxlan"])
        .unwrap();
    assert!(
        link.contains("mtu 1450") && link.contains("external") && link.contains("dstport 8472"),
        "{link}"
    );
    tcp_echo(&pod_a.netns, &pod_c.netns, pod_c.v4(), 0).expect("pod a -> pod c");
    tcp_echo(&pod_c.netns, &pod_a.netns, pod_a.v4(), 0).expect("pod c -> pod a");
    tcp_echo(a.node.netns(), &pod_c.netns, pod_c.v4(), 0).expect("node a -> pod c");
    // IPv6 pods across the IPv4 underlay.
    tcp_echo(&pod_a.netns, &pod_c.netns, pod_c.v6(), 0).expect("pod a -> pod c, IPv6");
    tcp_echo(&pod_c.netns, &pod_a.netns, pod_a.v6(), 0).expect("pod c -> pod a, IPv6");
    tcp_echo(a.node.netns(), &pod_c.netns, pod_c.v6(), 0).expect("node a -> pod c, IPv6");
    // Full-sized segments: the agent gave the pods the tunnel's MTU (the underlay's, 50
    // bytes less), so the encapsulated packets fit the underlay and the router between
    // the nodes fragments none of them.
    for (pod, what) in [(&pod_a, "a"), (&pod_c, "c")] {
        let eth0 = pod.netns.ip_ok(&["link", "show", "eth0"]).unwrap();
        assert!(eth0.contains("mtu 1450"), "pod {what}: {eth0}");
    }
    // What says a packet was too big: the router fragmenting one, a node refusing one
    // (answering "fragmentation needed").
    let too_big = || {
        [
            (etcd.lan(), "IpFragCreates"),
            (a.node.netns(), "IpFragFails"),
            (c.node.netns(), "IpFragFails"),
        ]
        .map(|(ns, counter)| (ns.name().to_owned(), counter, snmp(ns, counter)))
    };
    let before = too_big();
    tcp_transfer(&pod_a.netns, &pod_c.netns, pod_c.v4(), 4 << 20).expect("pod a => pod c");
    tcp_transfer(&pod_c.netns, &pod_a.netns, pod_a.v4(), 4 << 20).expect("pod c => pod a");
    tcp_transfer(&pod_a.netns, &pod_c.netns, pod_c.v6(), 4 << 20).expect("pod a => pod c, IPv6");
    assert_eq!(too_big(), before, "a packet did not fit the tunnel");
    for (n, what, peer, peer6, via) in [(&a, "a", sc, sc6, c.addr), (&c, "c", sa, sa6, a.addr)] {
        let t = n.tunnel_report(&p);
        assert_eq!(t["peers"], 2, "node {what}: {t}");
        assert_eq!(t["nodes"], 1, "node {what}: {t}");
        let mut listed: Vec<Value> = t["peer_subnets"].as_array().unwrap().clone();
        listed.sort_by_key(|v| v["subnet"].to_string());
        let mut want = vec![
            json!({"subnet": peer.to_string(), "node": via.to_string()}),
            json!({"subnet": peer6.to_string(), "node": via.to_string()}),
        ];
        want.sort_by_key(|v| v["subnet"].to_string());
        assert_eq!(listed, want, "node {what}");
        assert_eq!(
            t["drop_no_peer"], 0,
            "node {what}: nothing sent into it unrouted: {t}"
        );
        assert!(
            t["encap_packets"].as_u64().unwrap() > 0 && t["decap_packets"].as_u64().unwrap() > 0,
            "node {what}: the programs carried the packets both ways: {t}"
        );
        // The same, counted for the one member: its 4 MiB (and the 4 MiB back) in it.
        let members = t["peer_nodes"].as_array().unwrap();
        assert_eq!(members.len(), 1, "node {what}: {t}");
        let m = &members[0];
        assert_eq!(m["node"], via.to_string(), "node {what}: {t}");
        for field in ["encap_bytes", "decap_bytes"] {
            assert!(
                m[field].as_u64().unwrap() >= 4 << 20,
                "node {what}: {field} of the peer: {t}"
            );
        }
        assert_eq!(m["drop_forged_source"], 0, "node {what}: {t}");
    }

    // VXLAN from the LAN namespace (on the underlay, no member) to node a's port, with an
    // inner source in no member's subnet: dropped and counted, never delivered.
    let lan = etcd.lan();
    lan.ip_ok(&[
        "link",
        "add",
        "forge",
        "type",
        "vxlan",
        "id",
        "1",
        "dstport",
        "8472",
        "remote",
        &a.addr.to_string(),
        "local",
        "10.250.0.254",
        "nolearning",
    ])
    .unwrap();
    lan.ip_ok(&["addr", "add", "10.244.250.1/24", "dev", "forge"])
        .unwrap();
    lan.ip_ok(&["link", "set", "forge", "up"]).unwrap();
    lan.ip_ok(&[
        "neigh",
        "add",
        &pod_a.v4().to_string(),
        "lladdr",
        "02:00:00:00:00:01",
        "dev",
        "forge",
        "nud",
        "permanent",
    ])
    .unwrap();
    lan.ip_ok(&[
        "route",
        "add",
        &format!("{}/32", pod_a.v4()),
        "dev",
        "forge",
    ])
    .unwrap();
    let before = a.tunnel_report(&p)["drop_not_member"].as_u64().unwrap();
    let ping = lan
        .exec(&[
            "ping",
            "-c",
            "3",
            "-i",
            "0.2",
            "-W",
            "1",
            &pod_a.v4().to_string(),
        ])
        .unwrap();
    assert!(!ping.status.success(), "a non-member's VXLAN reached pod a");
    let after = a.tunnel_report(&p)["drop_not_member"].as_u64().unwrap();
    assert!(
        after >= before + 3,
        "non-member drops counted: {before} -> {after}"
    );
    lan.ip_ok(&["link", "del", "forge"]).unwrap();

    // A member's VXLAN whose inner source is outside its subnet is dropped and counted;
    // the same datagram from the member's own pod address goes on to pod a.
    let forged = IpAddr::V4(Ipv4Addr::new(10, 244, 250, 1));
    // (Node-wide and for member c, whose address the datagrams come from.)
    let counts = || {
        let t = a.tunnel_report(&p);
        let m = t["peer_nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["node"] == c.addr.to_string())
            .unwrap_or_else(|| panic!("no counters of member c: {t}"))
            .clone();
        [
            t["drop_forged_source"].as_u64().unwrap(),
            t["decap_packets"].as_u64().unwrap(),
            m["drop_forged_source"].as_u64().unwrap(),
            m["decap_packets"].as_u64().unwrap(),
        ]
    };
    let before = counts();
    vxlan_from(&c, a.addr, forged, pod_a.v4());
    eventually("the forged source counted", Duration::from_secs(2), || {
        counts()[0] == before[0] + 1
    });
    let after = counts();
    assert_eq!(after[2], before[2] + 1, "member c's forged sources");
    assert_eq!(
        [after[1], after[3]],
        [before[1], before[3]],
        "a forged source went on"
    );
    vxlan_from(&c, a.addr, pod_c.v4(), pod_a.v4());
    eventually(
        "the member's own source accepted",
        Duration::from_secs(2),
        || counts()[1] > before[1],
    );
    let after = counts();
    assert!(after[3] > before[3], "member c's accepted packets");
    assert_eq!([after[0], after[2]], [before[0] + 1, before[2] + 1]);
    // The same per member in the Prometheus exposition.
    let text = a.operator(&p, "metrics");
    let sample = format!(
        "ebpf_cni_tunnel_peer_drops_total{{peer=\"{}\",reason=\"forged_source\"}} {}",
        c.addr, after[2]
    );
    assert!(text.lines().any(|l| l == sample), "{sample} in:\n{text}");
    let sample = format!(
        "ebpf_cni_tunnel_peer_packets_total{{peer=\"{}\",direction=\"in\"}} ",
        c.addr
    );
    assert!(
        text.lines().any(|l| l.starts_with(&sample)),
        "{sample} in:\n{text}"
    );

    pod_a.del_direct(&p, &a.node, &a.conf_value());
    pod_c.del_direct(&p, &c.node, &c.conf_value());
}

/// Two nodes whose only common underlay is IPv6 (their agents given IPv6 addresses alone,
/// node c behind the LAN namespace routing IPv6): each tunnels both pod families over
/// IPv6, the IPv4 subnet's route via the peer's IPv6 address (RFC 5549); the device
/// leaves room for IPv6's 70 bytes; the pods reach each other both ways in both families,
/// the router forwards the outer packets as IPv6, and each node counts the other under its
/// IPv6 address.
#[test]
fn pods_reach_a_node_over_an_ipv6_underlay_through_the_tunnel() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let etcd = EtcdCluster::start(1).unwrap();
    etcd.put(
        &format!("{PREFIX}/config"),
        r#"{"network": "10.244.0.0/16", "ipv6Network": "fd00:10:244::/56"}"#,
    )
    .unwrap();
    let a = ClusterNode::attached(&p, "node-a", Stack::Dual, |ns| etcd.attach(ns, "lan0", 1));
    let c = ClusterNode::behind_router(&p, &etcd, "node-c", 3, Stack::Dual);
    for n in [&a, &c] {
        n.set_conf("mtu", 1500.into());
    }
    // The IPv6 underlay: the LAN namespace routes between fd00:250::/64 and fd00:251:3::/64.
    let (a6, c6) = ("fd00:250::1", "fd00:251:3::2");
    let lan = etcd.lan();
    for (ns, args) in [
        (
            lan,
            vec!["addr", "add", "fd00:250::fe/64", "dev", "br0", "nodad"],
        ),
        (
            lan,
            vec!["addr", "add", "fd00:251:3::1/64", "dev", "r3", "nodad"],
        ),
        (
            a.node.netns(),
            vec!["addr", "add", "fd00:250::1/64", "dev", "lan0", "nodad"],
        ),
        (
            a.node.netns(),
            vec!["route", "add", "fd00:251::/32", "via", "fd00:250::fe"],
        ),
        (
            c.node.netns(),
            vec!["addr", "add", "fd00:251:3::2/64", "dev", "wan0", "nodad"],
        ),
        (
            c.node.netns(),
            vec!["route", "add", "default", "via", "fd00:251:3::1"],
        ),
    ] {
        let mut argv = vec!["-6"];
        argv.extend(args);
        ns.ip_ok(&argv).unwrap();
    }
    let out = lan
        .exec(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"])
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let ping = a
        .node
        .netns()
        .exec(&["ping", "-6", "-c", "1", "-W", "5", c6])
        .unwrap();
    assert!(
        ping.status.success(),
        "node a -> node c over IPv6: {ping:?}"
    );

    let _agent_a = a.agent(&p, &etcd, 60, &["--node-ip", a6]).unwrap();
    let _agent_c = c.agent(&p, &etcd, 60, &["--node-ip", c6]).unwrap();
    let keys = subnet_keys(&etcd);
    for (name, addr) in [("node-a", a6), ("node-c", c6)] {
        assert!(
            keys.iter()
                .any(|(_, r)| *r == json!({"node": name, "publicIPv6": addr})),
            "{keys:?}"
        );
    }
    let family = |n: &ClusterNode, v6: bool| {
        n.subnets()
            .into_iter()
            .find(|s| s.is_ipv6() == v6)
            .unwrap_or_else(|| panic!("{}: no subnet of the family", n.name))
    };
    // While a route other than the default covers node c's address, the kernel refuses
    // node a an onlink IPv6 gateway there: c's subnets are reported, not routed, and the
    // agent goes on.
    let pod_a = Pod::add_direct(&p, &a.node, &a.conf_value());
    let unrouted = || {
        let r =
            ebpf_cni_tests::dataplane::inspect(&p.bin, &a.node).unwrap()["unrouted_peers"].clone();
        let mut subnets: Vec<String> = r
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["subnet"].as_str().unwrap().to_owned())
            .collect();
        subnets.sort();
        (subnets, r)
    };
    let mut want = vec![family(&c, false).to_string(), family(&c, true).to_string()];
    want.sort();
    eventually(
        "node a reports node c's subnets",
        Duration::from_secs(5),
        || unrouted().0 == want,
    );
    let (_, r) = unrouted();
    assert!(
        r[0]["why"]
            .as_str()
            .unwrap()
            .contains("a route other than the default"),
        "{r}"
    );
    // Through the default route, as a node behind a gateway usually is, it is routed (at
    // the agent's next pass).
    a.node
        .netns()
        .ip_ok(&["-6", "route", "del", "fd00:251::/32"])
        .unwrap();
    a.node
        .netns()
        .ip_ok(&["-6", "route", "add", "default", "via", "fd00:250::fe"])
        .unwrap();
    for (from, to, via) in [(&a, &c, c6), (&c, &a, a6)] {
        let (v4, v6) = (family(to, false), family(to, true));
        eventually(
            &format!("{}'s tunnel routes to {v4} and {v6} via {via}", from.name),
            Duration::from_secs(15),
            || {
                let ns = from.node.netns();
                let r4 = ns.ip_ok(&["-4", "route", "show", "proto", "236"]).unwrap();
                let r6 = ns.ip_ok(&["-6", "route", "show", "proto", "236"]).unwrap();
                r4.contains(&format!("{v4} via inet6 {via} dev ecni-vxlan"))
                    && r6.contains(&format!("{v6} via {via} dev ecni-vxlan"))
            },
        );
        let link = from
            .node
            .netns()
            .ip_ok(&["-d", "link", "show", "ecni-vxlan"])
            .unwrap();
        assert!(link.contains("mtu 1430"), "{link}");
    }
    assert_eq!(unrouted().0, Vec::<String>::new());
    let pod_c = Pod::add_direct(&p, &c.node, &c.conf_value());
    let forwarded = || snmp(lan, "Ip6OutForwDatagrams");
    let before = forwarded();
    for (from, to) in [(&pod_a, &pod_c), (&pod_c, &pod_a)] {
        for addr in [to.v4(), to.v6()] {
            tcp_echo(&from.netns, &to.netns, addr, 0)
                .unwrap_or_else(|e| panic!("{} -> {addr}: {e:#}", from.v4()));
        }
    }
    tcp_transfer(&pod_a.netns, &pod_c.netns, pod_c.v4(), 1 << 20).expect("pod a => pod c");
    assert!(
        forwarded() >= before + 20,
        "the outer packets crossed the router as IPv6: {before} -> {}",
        forwarded()
    );
    for (n, what, via) in [(&a, "a", c6), (&c, "c", a6)] {
        let t = n.tunnel_report(&p);
        assert_eq!(t["drop_no_peer"], 0, "node {what}: {t}");
        let members = t["peer_nodes"].as_array().unwrap();
        assert_eq!(members.len(), 1, "node {what}: {t}");
        assert_eq!(members[0]["node"], via, "node {what}: {t}");
        for field in ["encap_packets", "decap_packets"] {
            assert!(
                members[0][field].as_u64().unwrap() > 0,
                "node {what}: {field}: {t}"
            );
        }
    }
    pod_a.del_direct(&p, &a.node, &a.conf_value());
    pod_c.del_direct(&p, &c.node, &c.conf_value());
}

/// One VXLAN datagram (VNI 1) from `node`'s address to `to`'s port 8472, carrying an ICMP
/// echo request from `src` to `dst`.
fn vxlan_from(node: &ClusterNode, to: Ipv4Addr, src: IpAddr, dst: IpAddr) {
    use ebpf_cni_tests::packet::{Pkt, ETH_P_IP, L4};
    let frame = Pkt::new(src, dst, L4::echo_request(7))
        .macs([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1])
        .payload(32)
        .frame();
    assert_eq!(u16::from_be_bytes([frame[12], frame[13]]), ETH_P_IP);
    let mut datagram = vec![0x08, 0, 0, 0, 0, 0, 1, 0];
    datagram.extend_from_slice(&frame);
    let from = node.addr;
    node.node
        .netns()
        .run_in(|| {
            let s = std::net::UdpSocket::bind((from, 0))?;
            s.send_to(&datagram, (to, 8472))
        })
        .unwrap()
        .unwrap();
}

/// The namespace's SNMP counter `name` (`nstat`'s absolute value).
fn snmp(ns: &ebpf_cni_tests::Netns, name: &str) -> u64 {
    let out = ns.exec(&["nstat", "-az", name]).unwrap();
    let out = String::from_utf8_lossy(&out.stdout).to_string();
    out.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{name} in {}: {out}", ns.name()))
}

/// What an agent with the Kubernetes source reads: the API server's CA, its token, the
/// network config.
struct KubeCreds {
    ca: PathBuf,
    token: PathBuf,
    net_conf: PathBuf,
    _dir: tempfile::TempDir,
}

impl KubeCreds {
    fn new(api: &KubeApi, net_conf: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (ca, token) = api.write_credentials(dir.path()).unwrap();
        let path = dir.path().join("net-conf.json");
        std::fs::write(&path, net_conf).unwrap();
        Self {
            ca,
            token,
            net_conf: path,
            _dir: dir,
        }
    }
}

/// The members from the Kubernetes API (a stand-in server on the LAN, serving LIST, WATCH
/// with bookmarks, 410 Gone and the status PATCH): each agent takes its Node's pod CIDR,
/// routes to the others' by their InternalIP, and follows the Nodes: a node whose pod CIDR
/// comes late, an address that changes, a node deleted and added again, the watch dropped,
/// and its history expired (a re-list that removes no route). The node's
/// NetworkUnavailable condition is cleared once its routes are in place; a refused patch is
/// logged and tried again, not fatal.
#[test]
fn nodes_and_their_routes_follow_the_kubernetes_node_objects() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let lan = Lan::new().unwrap();
    let api = KubeApi::start(Some(lan.netns()), (LAN_BRIDGE_IP, 0).into(), "token-1").unwrap();
    let creds = KubeCreds::new(&api, r#"{"network": "10.244.0.0/16", "mode": "auto"}"#);
    let a = ClusterNode::on_lan(&p, &lan, "node-a", 1);
    let b = ClusterNode::on_lan(&p, &lan, "node-b", 2);
    let (sa, sb): (IpNetwork, IpNetwork) = (
        "10.244.1.0/24".parse().unwrap(),
        "10.244.2.0/24".parse().unwrap(),
    );
    api.set_node(kube_api::node(
        "node-a",
        &["10.244.1.0/24"],
        &["10.250.0.1"],
        &[],
    ));
    api.set_node(kube_api::node(
        "node-b",
        &["10.244.2.0/24"],
        &["10.250.0.2"],
        &[],
    ));

    // A refused status patch is said and tried again; the agent goes on.
    api.refuse_status_patch(true);
    let mut agent_a = a.kube_agent(&p, &api, &creds);
    let _agent_b = b.kube_agent(&p, &api, &creds);
    assert_eq!(a.subnets(), vec![sa], "the Node's pod CIDR in the conflist");
    assert_eq!(b.subnets(), vec![sb]);
    agent_a
        .wait_for("NetworkUnavailable condition", Duration::from_secs(15))
        .unwrap();
    agent_a.still_running().unwrap();
    eventually("a's route to b", Duration::from_secs(10), || {
        a.routes_to(sb, b.addr)
    });
    eventually("b's route to a", Duration::from_secs(10), || {
        b.routes_to(sa, a.addr)
    });
    let pod_a = Pod::add_direct(&p, &a.node, &a.conf_value());
    let pod_b = Pod::add_direct(&p, &b.node, &b.conf_value());
    assert!(sa.contains(pod_a.v4()) && sb.contains(pod_b.v4()));
    tcp_echo(&pod_a.netns, &pod_b.netns, pod_b.v4(), 0).expect("pod a -> pod b");
    tcp_echo(&pod_b.netns, &pod_a.netns, pod_a.v4(), 0).expect("pod b -> pod a");

    // Taken at the next pass (every 10 s) once the API server allows it.
    api.refuse_status_patch(false);
    let unavailable = |name: &str| {
        api.node(name).and_then(|n| {
            n["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "NetworkUnavailable")
                .map(|c| c["status"].as_str().unwrap_or("").to_owned())
        })
    };
    eventually(
        "a's NetworkUnavailable cleared",
        Duration::from_secs(25),
        || unavailable("node-a").as_deref() == Some("False"),
    );
    let patch = api
        .requests()
        .into_iter()
        .find(|r| {
            r.method == "PATCH" && r.status == 200 && r.target.starts_with("/api/v1/nodes/node-a/")
        })
        .expect("node-a's status patch among the requests");
    assert!(
        patch.target.starts_with("/api/v1/nodes/node-a/status")
            && patch.content_type == "application/strategic-merge-patch+json"
            && patch.token == "token-1",
        "{patch:?}"
    );

    // A node without a pod CIDR is skipped, saying so; its CIDR set late gives a route.
    api.set_node(kube_api::node("node-c", &[], &["10.250.0.3"], &[]));
    agent_a
        .wait_for(
            "node node-c skipped: no spec.podCIDRs",
            Duration::from_secs(10),
        )
        .unwrap();
    let sc: IpNetwork = "10.244.3.0/24".parse().unwrap();
    let c_at = |ip: &str, cidrs: &[&str]| kube_api::node("node-c", cidrs, &[ip], &[]);
    api.set_node(c_at("10.250.0.3", &["10.244.3.0/24"]));
    eventually("a's route to c", Duration::from_secs(10), || {
        a.routes_to(sc, "10.250.0.3".parse().unwrap())
    });
    // Its address changes: the route follows; the annotation wins over the InternalIP.
    api.set_node(c_at("10.250.0.33", &["10.244.3.0/24"]));
    eventually(
        "a's route to c's new address",
        Duration::from_secs(10),
        || a.routes_to(sc, "10.250.0.33".parse().unwrap()),
    );
    api.set_node(kube_api::node(
        "node-c",
        &["10.244.3.0/24"],
        &["10.250.0.33"],
        &[("ebpf-cni.io/node-ip", "10.250.0.34")],
    ));
    eventually(
        "a's route to c's annotated address",
        Duration::from_secs(10),
        || a.routes_to(sc, "10.250.0.34".parse().unwrap()),
    );

    // The watch dropped: resumed, the next change still arrives.
    api.drop_watches();
    api.delete_node("node-c");
    eventually("a's route to c removed", Duration::from_secs(15), || {
        !a.peer_routes().contains(&sc.to_string())
    });
    api.set_node(c_at("10.250.0.3", &["10.244.3.0/24"]));
    eventually("a's route to c back", Duration::from_secs(15), || {
        a.routes_to(sc, "10.250.0.3".parse().unwrap())
    });

    // 410 Gone: the agent lists again; nothing is flushed meanwhile, and a node deleted
    // while the history was lost goes with the new listing.
    let lists = |api: &KubeApi| {
        api.requests()
            .iter()
            .filter(|r| {
                r.method == "GET"
                    && r.target.starts_with("/api/v1/nodes?")
                    && !r.target.contains("watch=")
            })
            .count()
    };
    let before = lists(&api);
    // The watch goes, and with it the history past the agent's last resource version.
    api.drop_watches();
    api.delete_node("node-c");
    api.expire_history();
    eventually(
        "a's route to c removed after the re-list",
        Duration::from_secs(20),
        || !a.peer_routes().contains(&sc.to_string()),
    );
    assert!(lists(&api) > before, "no LIST after 410 Gone");
    assert!(
        a.routes_to(sb, b.addr),
        "b's route stays through the re-list"
    );
    let said = agent_a.said();
    assert!(
        !said.contains(&format!("route to {sb} removed")),
        "b's route went during a re-list:\n{said}"
    );
    tcp_echo(&pod_a.netns, &pod_b.netns, pod_b.v4(), 0).expect("pod a -> pod b at the end");
    pod_a.del_direct(&p, &a.node, &a.conf_value());
    pod_b.del_direct(&p, &b.node, &b.conf_value());
}

/// The service-account token rotated under a running agent (the old one refused at once,
/// the new one written with a trailing newline) is read again at the next request and
/// used, and changes reach the routes again; an API server whose
/// certificate the CA file does not accept is named with why, and tried again.
#[test]
fn the_kubernetes_source_follows_a_rotated_token_and_names_a_wrong_ca() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let lan = Lan::new().unwrap();
    let api = KubeApi::start(Some(lan.netns()), (LAN_BRIDGE_IP, 0).into(), "token-1").unwrap();
    let creds = KubeCreds::new(&api, r#"{"network": "10.244.0.0/16", "mode": "direct"}"#);
    let a = ClusterNode::on_lan(&p, &lan, "node-a", 1);
    api.set_node(kube_api::node(
        "node-a",
        &["10.244.1.0/24"],
        &["10.250.0.1"],
        &[],
    ));

    // A CA that did not sign the server's certificate.
    let other = KubeApi::start(None, (std::net::Ipv4Addr::LOCALHOST, 0).into(), "x").unwrap();
    let wrong = KubeCreds::new(&other, r#"{"network": "10.244.0.0/16"}"#);
    let wrong = KubeCreds {
        ca: wrong.ca.clone(),
        token: creds.token.clone(),
        net_conf: creds.net_conf.clone(),
        _dir: wrong._dir,
    };
    let before = a.subnets();
    let mut agent = a.spawn_kube_agent(&p, &api, &wrong);
    agent
        .wait_for("reading node node-a", Duration::from_secs(20))
        .unwrap();
    let said = agent.said();
    assert!(said.to_lowercase().contains("certificate"), "{said}");
    agent.still_running().unwrap();
    assert_eq!(a.subnets(), before, "nothing taken without the API");
    agent.kill().unwrap();

    let mut agent = a.kube_agent(&p, &api, &creds);
    assert_eq!(
        a.subnets(),
        vec!["10.244.1.0/24".parse::<IpNetwork>().unwrap()]
    );
    // kubelet writes the new token into a new file and moves it into place (here with the
    // newline a hand-written token file has); the API server takes only it from now on,
    // and the open watch goes.
    api.accept_token("token-2");
    let new = creds.token.with_extension("new");
    std::fs::write(&new, "token-2\n").unwrap();
    std::fs::rename(&new, &creds.token).unwrap();
    api.refuse_token("token-1");
    api.drop_watches();
    let rotated = api.requests().len();
    api.set_node(kube_api::node(
        "node-b",
        &["10.244.2.0/24"],
        &["10.250.0.2"],
        &[],
    ));
    // The file changed: the next request reads it (kube's own reading would wait up to a
    // minute, and would send the newline).
    eventually(
        "a's route to b, with the new token",
        Duration::from_secs(20),
        || {
            a.routes_to(
                "10.244.2.0/24".parse().unwrap(),
                "10.250.0.2".parse().unwrap(),
            )
        },
    );
    let requests = api.requests();
    let last = requests.last().unwrap();
    assert_eq!(last.token, "token-2", "{last:?}");
    let since: Vec<_> = requests[rotated..].iter().collect();
    assert!(
        since
            .iter()
            .all(|r| r.token == "token-2" || r.status == 401),
        "only the new token since the rotation: {since:?}"
    );
    agent.still_running().unwrap();
}

/// The Kubernetes source through the tunnel: a dual-stack Node behind a router (its pod
/// CIDRs of both families, its InternalIP reachable only through a gateway) is tunnelled
/// to in mode auto, in both families over the IPv4 underlay, the pods given the tunnel's
/// MTU; and back.
#[test]
fn the_kubernetes_source_tunnels_to_a_dual_stack_node_behind_a_router() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let lan = Lan::new().unwrap();
    let api = KubeApi::start(Some(lan.netns()), (LAN_BRIDGE_IP, 0).into(), "token-1").unwrap();
    let creds = KubeCreds::new(
        &api,
        r#"{"network": "10.244.0.0/16", "ipv6Network": "fd00:10:244::/56", "mode": "auto"}"#,
    );
    let a = ClusterNode::attached(&p, "node-a", Stack::Dual, |ns| lan.attach(ns, "lan0", 1));
    EtcdCluster::route_to_routed(a.node.netns()).unwrap();
    let c = ClusterNode::attached(&p, "node-c", Stack::Dual, |ns| {
        lan.attach_routed(ns, "wan0", 3)
    });
    for n in [&a, &c] {
        n.set_conf("mtu", 1500.into());
    }
    let subnets = |host: u8| -> [IpNetwork; 2] {
        [
            format!("10.244.{host}.0/24").parse().unwrap(),
            format!("fd00:10:244:{host}::/64").parse().unwrap(),
        ]
    };
    for (n, host) in [(&a, 1), (&c, 3)] {
        let [v4, v6] = subnets(host);
        api.set_node(kube_api::node(
            &n.name,
            &[&v4.to_string(), &v6.to_string()],
            &[&n.addr.to_string()],
            &[],
        ));
    }
    let _agent_a = a.kube_agent(&p, &api, &creds);
    let _agent_c = c.kube_agent(&p, &api, &creds);
    let ([sa, sa6], [sc, sc6]) = (subnets(1), subnets(3));
    let mut own = a.subnets();
    own.sort();
    assert_eq!(
        own,
        vec![sa, sa6],
        "both of the Node's pod CIDRs in the conflist"
    );
    for (subnet, from, to) in [(sc, &a, &c), (sa, &c, &a), (sc6, &a, &c), (sa6, &c, &a)] {
        eventually(
            &format!("{}'s tunnel route to {subnet}", from.name),
            Duration::from_secs(10),
            || from.tunnels_to(subnet, to.addr),
        );
    }
    let pod_a = Pod::add_direct(&p, &a.node, &a.conf_value());
    let pod_c = Pod::add_direct(&p, &c.node, &c.conf_value());
    for (pod, what) in [(&pod_a, "a"), (&pod_c, "c")] {
        let eth0 = pod.netns.ip_ok(&["link", "show", "eth0"]).unwrap();
        assert!(eth0.contains("mtu 1450"), "pod {what}: {eth0}");
    }
    tcp_echo(&pod_a.netns, &pod_c.netns, pod_c.v4(), 0).expect("pod a -> pod c");
    tcp_echo(&pod_c.netns, &pod_a.netns, pod_a.v4(), 0).expect("pod c -> pod a");
    tcp_echo(&pod_a.netns, &pod_c.netns, pod_c.v6(), 0).expect("pod a -> pod c, IPv6");
    tcp_echo(&pod_c.netns, &pod_a.netns, pod_a.v6(), 0).expect("pod c -> pod a, IPv6");
    tcp_echo(a.node.netns(), &pod_c.netns, pod_c.v4(), 0).expect("node a -> pod c");
    // A full-sized segment each way, in both families.
    tcp_transfer(&pod_a.netns, &pod_c.netns, pod_c.v4(), 256 * 1024).expect("bulk a -> c");
    tcp_transfer(&pod_c.netns, &pod_a.netns, pod_a.v6(), 256 * 1024).expect("bulk c -> a, IPv6");
}
