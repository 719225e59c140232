//! Kubernetes Services next to kube-proxy: with kube-proxy's rules in the node (written as
//! its iptables and nftables proxiers write them: `ebpf_cni_tests::kube_proxy`), pods reach
//! a ClusterIP whose endpoint is a pod of the node, the pod itself (hairpin) or a host
//! outside, over TCP and UDP, IPv4 and IPv6, and every answer comes back from the Service's
//! address; a Service without endpoints refuses at once; hosts outside reach NodePorts
//! over TCP, UDP and (where the kernel has it) SCTP, with externalTrafficPolicy Cluster and
//! Local, the answers from the node's address; and flows no rule touches keep the
//! programs' redirect path (netfilter's FORWARD hook sees none of their packets).
//! ebpf-cni's masquerade, bandwidth limits and chained mode are each tested on their own
//! over those paths. The programs learn the Service addresses when STATUS (or the agent)
//! reads the rules, so rules written after the pods, and taken away, are followed without
//! a new ADD.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ebpf_cni_tests::config::{Stack, V4_SUBNET, V6_SUBNET};
use ebpf_cni_tests::dataplane as dp;
use ebpf_cni_tests::external::ExternalHost;
use ebpf_cni_tests::kernel::Family;
use ebpf_cni_tests::kube_proxy::{self as kp, Backend, Proto, Service};
use ebpf_cni_tests::net::tcp_echo;
use ebpf_cni_tests::netfilter;
use ebpf_cni_tests::{
    require_root, unique_container_id, Attachment, CniCommand, ContainerEnv, NetConfList, Netns,
    Node, PluginUnderTest, Pod,
};
use serde_json::Value;

const VIP4: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const VIP4_DNS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 53);
const VIP4_OUT: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 20);
const VIP4_EMPTY: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 30);
const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x10);
const VIP6_DNS: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x53);
const VIP6_OUT: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x20);
const VIP6_EMPTY: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x30);
const NODE_PORT: u16 = 30_080;
const NODE_PORT_UDP: u16 = 30_053;
const NODE_PORT_SCTP: u16 = 30_090;

fn add(p: &PluginUnderTest, node: &Node, conf: &Value) -> Pod {
    dual_stack(Pod::add_direct(p, node, conf))
}

/// `pod`, which must have an address of each family.
fn dual_stack(pod: Pod) -> Pod {
    assert!(
        pod.r.ip4().is_some() && pod.r.ip6().is_some(),
        "an IPv4 and an IPv6 address: {}",
        pod.result
    );
    pod
}

/// `pod`'s address of IPv4 when `v4`, else of IPv6.
fn addr(pod: &Pod, v4: bool) -> IpAddr {
    pod.addr(if v4 { Family::V4 } else { Family::V6 })
}

/// STATUS, as the runtime sends it: the node learns kube-proxy's rules.
fn status(p: &PluginUnderTest, node: &Node, conf: &Value) {
    let env = ContainerEnv::none().with_cni_path(&p.runtime.cni_path_env());
    p.run(node, CniCommand::Status, &env, conf.to_string())
        .expect_success("STATUS");
}

/// inspect's Services part.
fn services(p: &PluginUnderTest, node: &Node) -> Value {
    let r = dp::inspect(&p.bin, node).unwrap();
    r["services"].clone()
}

/// Binds a server socket in `ns`: `bind` again for a while where the address is in use. A
/// listener of an earlier exchange on the same address can outlive its close by a moment
/// when another test thread forks meanwhile (the child holds a copy of every descriptor
/// until it execs), which the kernel matrix's emulated guests make long enough to meet.
fn bind_in<T: Send>(ns: &Netns, bind: impl Fn() -> std::io::Result<T> + Send + Sync) -> T {
    let deadline = Instant::now() + Duration::from_secs(5);
    ns.run_in(|| loop {
        match bind() {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            r => return r,
        }
    })
    .unwrap()
    .unwrap_or_else(|e| panic!("binding a server in {}: {e}", ns.name()))
}

/// One TCP exchange: a server in `server_ns` on `bind`, a client in `from` dialling `dial`;
/// the client's address as the server saw it. The client's connected socket proves the
/// answer came from `dial`.
fn tcp_via(
    from: &Netns,
    dial: SocketAddr,
    server_ns: &Netns,
    bind: SocketAddr,
) -> Result<SocketAddr> {
    let listener = bind_in(server_ns, || TcpListener::bind(bind));
    listener.set_nonblocking(true)?;
    std::thread::scope(|s| {
        let server = s.spawn(|| -> Result<SocketAddr> {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match listener.accept() {
                    Ok((mut c, peer)) => {
                        c.set_nonblocking(false)?;
                        c.set_read_timeout(Some(Duration::from_secs(3)))?;
                        let mut buf = [0u8; 64];
                        let n = std::io::Read::read(&mut c, &mut buf)?;
                        std::io::Write::write_all(&mut c, &buf[..n])?;
                        return Ok(peer);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if Instant::now() > deadline {
                            bail!("no connection reached {bind}");
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        });
        let client = from.run_in(|| -> Result<()> {
            let mut c = TcpStream::connect_timeout(&dial, Duration::from_secs(3))
                .with_context(|| format!("TCP {} -> {dial}", from.name()))?;
            c.set_read_timeout(Some(Duration::from_secs(3)))?;
            std::io::Write::write_all(&mut c, b"ecni-service")?;
            let mut buf = [0u8; 64];
            let n = std::io::Read::read(&mut c, &mut buf)?;
            if &buf[..n] != b"ecni-service" {
                bail!("TCP {dial}: echo {:?}", &buf[..n]);
            }
            Ok(())
        });
        let peer = server.join().expect("server thread");
        client??;
        peer
    })
}

/// One UDP exchange: the server in `server_ns` on `bind` echoes one datagram; the client
/// in `from`, unconnected, checks the answer's source is `dial` (what a DNS resolver
/// checks).
fn udp_via(
    from: &Netns,
    dial: SocketAddr,
    server_ns: &Netns,
    bind: SocketAddr,
) -> Result<SocketAddr> {
    let server = bind_in(server_ns, || UdpSocket::bind(bind));
    server.set_read_timeout(Some(Duration::from_secs(5)))?;
    std::thread::scope(|s| {
        let srv = s.spawn(|| -> Result<SocketAddr> {
            let mut buf = [0u8; 64];
            let (n, peer) = server
                .recv_from(&mut buf)
                .context("no datagram reached the endpoint")?;
            server.send_to(&buf[..n], peer)?;
            Ok(peer)
        });
        let client = from.run_in(|| -> Result<()> {
            let any: SocketAddr = if dial.is_ipv4() {
                (Ipv4Addr::UNSPECIFIED, 0).into()
            } else {
                (Ipv6Addr::UNSPECIFIED, 0).into()
            };
            let c = UdpSocket::bind(any)?;
            c.set_read_timeout(Some(Duration::from_secs(3)))?;
            c.send_to(b"ecni-dns", dial)?;
            let mut buf = [0u8; 64];
            let (n, src) = c
                .recv_from(&mut buf)
                .with_context(|| format!("UDP {dial}: no answer"))?;
            if src != dial {
                bail!("UDP {dial}: the answer came from {src}");
            }
            if &buf[..n] != b"ecni-dns" {
                bail!("UDP {dial}: echo {:?}", &buf[..n]);
            }
            Ok(())
        });
        let peer = srv.join().expect("server thread");
        client??;
        peer
    })
}

fn sa(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

/// The node, its pods A and B, a host outside with routes to the pods, and the rule set of
/// `mode` for the Services of both families: `web` (TCP 80 → B:8080, NodePort 30080),
/// `dns` (UDP 53 → B:5353, NodePort 30053), `outside` (TCP 81 → the outside host's 9090)
/// and `empty` (TCP 82, no endpoints).
struct Cluster {
    p: PluginUnderTest,
    node: Node,
    conf: Value,
    a: Pod,
    b: Pod,
    ext: ExternalHost,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Iptables(Backend),
    Nftables,
}

fn services_of(v4: bool, b: &Pod, ext: &ExternalHost, local: bool) -> Vec<Service> {
    let (vip, dns, out, empty) = Cluster::vips(v4);
    let ext_addr = ext.addr_like(vip);
    let mut web =
        Service::new("default/web:http", vip, 80, Proto::Tcp).endpoint(sa(addr(b, v4), 8080));
    web.node_port = Some(NODE_PORT);
    web.local = local;
    let mut dns =
        Service::new("kube-system/dns:dns", dns, 53, Proto::Udp).endpoint(sa(addr(b, v4), 5353));
    dns.node_port = Some(NODE_PORT_UDP);
    dns.local = local;
    vec![
        web,
        dns,
        Service::new("default/outside:http", out, 81, Proto::Tcp).endpoint(sa(ext_addr, 9090)),
        Service::new("default/empty:http", empty, 82, Proto::Tcp),
    ]
}

fn load(c: &Cluster, mode: Mode, local: bool) {
    for v4 in [true, false] {
        let svcs = services_of(v4, &c.b, &c.ext, local);
        let cidr = if v4 { V4_SUBNET } else { V6_SUBNET };
        match mode {
            Mode::Iptables(backend) => kp::load_iptables(
                c.node.netns(),
                v4,
                backend,
                &kp::iptables_rules(&svcs, cidr),
            )
            .unwrap(),
            Mode::Nftables => {
                kp::load_nftables(c.node.netns(), &kp::nftables_rules(&svcs, cidr)).unwrap()
            }
        }
    }
}

fn cluster(mode: Option<(Mode, bool)>) -> Cluster {
    cluster_with(mode, Setup::Plain(&|_| {}))
}

/// How the cluster's pods are made.
enum Setup<'a> {
    /// ebpf-cni alone, its config changed by the function.
    Plain(&'a dyn Fn(&mut Value)),
    /// The reference bridge plugin, then ebpf-cni chained after it.
    Chained,
}

fn cluster_with(mode: Option<(Mode, bool)>, setup: Setup) -> Cluster {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "up0", 71).unwrap();
    // A node has a default route; ClusterIPs are routed by it (their DNAT happens first).
    node.netns()
        .ip_ok(&["-4", "route", "add", "default", "via", &ext.v4.to_string()])
        .unwrap();
    node.netns()
        .ip_ok(&["-6", "route", "add", "default", "via", &ext.v6.to_string()])
        .unwrap();
    let mut conf = p.conf("1.1.0", &node, Stack::Dual);
    let (a, b) = match setup {
        Setup::Plain(tweak) => {
            tweak(&mut conf);
            (add(&p, &node, &conf), add(&p, &node, &conf))
        }
        Setup::Chained => {
            let mut bridge = conf.clone();
            bridge["cniVersion"] = serde_json::json!("1.0.0");
            bridge["type"] = serde_json::json!("bridge");
            bridge["bridge"] = serde_json::json!("ecnisvc0");
            bridge["isGateway"] = serde_json::json!(true);
            bridge["ipMasq"] = serde_json::json!(false);
            // A pod reaching itself through its Service leaves and enters by the same
            // bridge port (what Kubernetes' bridge users turn on).
            bridge["hairpinMode"] = serde_json::json!(true);
            let list =
                NetConfList::chain(&bridge, vec![serde_json::json!({"type": p.plugin_type})]);
            conf = list.exec_config(1, &Default::default(), None);
            // STATUS is 1.1's; the reference bridge speaks 1.0.
            conf["cniVersion"] = serde_json::json!("1.1.0");
            let chained = |p: &PluginUnderTest| {
                dual_stack(
                    Pod::try_add(&p.runtime, &node, &list, |att| att)
                        .unwrap_or_else(|e| panic!("ADD of bridge + ebpf-cni: {e}")),
                )
            };
            (chained(&p), chained(&p))
        }
    };
    let c = Cluster {
        p,
        node,
        conf,
        a,
        b,
        ext,
    };
    if let Some((mode, local)) = mode {
        load(&c, mode, local);
        status(&c.p, &c.node, &c.conf);
    }
    c
}

impl Cluster {
    fn vips(v4: bool) -> (IpAddr, IpAddr, IpAddr, IpAddr) {
        if v4 {
            (
                VIP4.into(),
                VIP4_DNS.into(),
                VIP4_OUT.into(),
                VIP4_EMPTY.into(),
            )
        } else {
            (
                VIP6.into(),
                VIP6_DNS.into(),
                VIP6_OUT.into(),
                VIP6_EMPTY.into(),
            )
        }
    }

    /// The paths every mode must carry, both families.
    fn check_cluster_ip_paths(&self) {
        self.check_paths(false);
    }

    /// [`Self::check_cluster_ip_paths`]; `masq`: pod A masquerades (`ipMasq`), so its
    /// Service flows reach every endpoint from the node's addresses.
    fn check_paths(&self, masq: bool) {
        for v4 in [true, false] {
            let (web, dns, out, empty) = Self::vips(v4);
            let (a, b) = (&self.a, &self.b);
            let fam = if v4 { "IPv4" } else { "IPv6" };
            let peer = tcp_via(&a.netns, sa(web, 80), &b.netns, sa(addr(b, v4), 8080))
                .unwrap_or_else(|e| {
                    panic!("{fam} pod A -> ClusterIP:80/tcp, endpoint pod B: {e:#}")
                });
            if !masq {
                assert_eq!(peer.ip(), addr(a, v4), "{fam}: the endpoint sees pod A");
            }
            udp_via(&a.netns, sa(dns, 53), &b.netns, sa(addr(b, v4), 5353)).unwrap_or_else(|e| {
                panic!("{fam} pod A -> ClusterIP:53/udp, endpoint pod B: {e:#}")
            });
            tcp_via(&b.netns, sa(web, 80), &b.netns, sa(addr(b, v4), 8080))
                .unwrap_or_else(|e| panic!("{fam} pod B -> its own ClusterIP (hairpin): {e:#}"));
            let ext_addr = self.ext.addr_like(web);
            let peer = tcp_via(&a.netns, sa(out, 81), self.ext.netns(), sa(ext_addr, 9090))
                .unwrap_or_else(|e| {
                    panic!("{fam} pod A -> ClusterIP:81/tcp, endpoint outside: {e:#}")
                });
            let want = if masq {
                self.node_addr(v4)
            } else {
                addr(a, v4)
            };
            assert_eq!(
                peer.ip(),
                want,
                "{fam}: the outside endpoint's client (masquerade {masq})"
            );
            tcp_via(
                self.node.netns(),
                sa(web, 80),
                &b.netns,
                sa(addr(b, v4), 8080),
            )
            .unwrap_or_else(|e| panic!("{fam} node -> ClusterIP:80/tcp: {e:#}"));
            // No endpoints: kube-proxy's REJECT reaches the pod at once.
            let started = Instant::now();
            let err = a
                .netns
                .run_in(|| TcpStream::connect_timeout(&sa(empty, 82), Duration::from_secs(5)))
                .unwrap()
                .expect_err("a Service without endpoints answered");
            assert_eq!(
                err.kind(),
                std::io::ErrorKind::ConnectionRefused,
                "{fam}: a Service without endpoints: {err}"
            );
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "{fam}: refused after {:?}",
                started.elapsed()
            );
        }
    }

    /// The node's address of IPv4 when `v4`, else of IPv6, on the link to the host outside.
    fn node_addr(&self, v4: bool) -> IpAddr {
        if v4 {
            self.ext.node_v4.into()
        } else {
            self.ext.node_v6.into()
        }
    }

    /// kube-proxy's rules (iptables, nft backend) written again, the NodePorts'
    /// externalTrafficPolicy Local where `local`, else Cluster; then STATUS.
    fn rewrite_rules(&self, local: bool) {
        for v4 in [true, false] {
            kp::flush_iptables(self.node.netns(), v4, Backend::Nft).unwrap();
        }
        load(self, Mode::Iptables(Backend::Nft), local);
        status(&self.p, &self.node, &self.conf);
    }

    /// The host outside → a NodePort of the node → pod B, over TCP (`web`) and UDP (`dns`),
    /// both families, each answer from the node's address (TCP's connected socket; UDP's
    /// unconnected one checks the source). Policy Local (`local`): pod B sees the client's
    /// own address; Cluster: the node masquerades it.
    fn check_node_ports(&self, local: bool) {
        let policy = if local { "Local" } else { "Cluster" };
        for v4 in [true, false] {
            let fam = if v4 { "IPv4" } else { "IPv6" };
            let node = self.node_addr(v4);
            let client = self.ext.addr_like(node);
            let b = addr(&self.b, v4);
            let ext = self.ext.netns();
            let tcp =
                tcp_via(ext, sa(node, NODE_PORT), &self.b.netns, sa(b, 8080)).unwrap_or_else(|e| {
                    panic!("{fam} outside -> {node}:{NODE_PORT}/tcp (policy {policy}): {e:#}")
                });
            let udp = udp_via(ext, sa(node, NODE_PORT_UDP), &self.b.netns, sa(b, 5353))
                .unwrap_or_else(|e| {
                    panic!("{fam} outside -> {node}:{NODE_PORT_UDP}/udp (policy {policy}): {e:#}")
                });
            for (peer, proto) in [(tcp, "tcp"), (udp, "udp")] {
                if local {
                    assert_eq!(
                        peer.ip(),
                        client,
                        "{fam} NodePort/{proto}: Local keeps the client's address"
                    );
                } else {
                    assert_ne!(
                        peer.ip(),
                        client,
                        "{fam} NodePort/{proto}: Cluster masquerades the client"
                    );
                }
            }
        }
    }

    /// [`Self::check_node_ports`] under each traffic policy, the rules written for each.
    fn check_node_ports_under_either_policy(&self) {
        for local in [false, true] {
            self.rewrite_rules(local);
            self.check_node_ports(local);
        }
    }

    /// Pod A → pod B directly, over TCP both families: none of it passes netfilter's
    /// FORWARD hook (the programs' redirect), and the Services counters do not move.
    fn check_fast_path_kept(&self) {
        let before = services(&self.p, &self.node);
        let fwd = |f| netfilter::forward_packets(self.node.netns(), f).unwrap();
        let (f4, f6) = (fwd(Family::V4), fwd(Family::V6));
        for v4 in [true, false] {
            tcp_echo(&self.a.netns, &self.b.netns, addr(&self.b, v4), 0).unwrap();
        }
        assert_eq!(
            (fwd(Family::V4), fwd(Family::V6)),
            (f4, f6),
            "pod -> pod traffic passed FORWARD"
        );
        let after = services(&self.p, &self.node);
        for k in ["to_service", "replies", "from_outside"] {
            assert_eq!(
                after[k], before[k],
                "pod -> pod counted as Service traffic ({k}): {after}"
            );
        }
    }
}

fn node_netfilter_counts(c: &Cluster) {
    for f in [Family::V4, Family::V6] {
        netfilter::add_forward_counter(c.node.netns(), f).unwrap();
    }
}

#[test]
fn cluster_ips_work_next_to_kube_proxy_in_iptables_mode() {
    let c = cluster(Some((Mode::Iptables(Backend::Nft), false)));
    let s = services(&c.p, &c.node);
    assert_eq!(s["in_force"], true, "{s}");
    assert_eq!(s["source"], "kube-proxy-iptables-nft", "{s}");
    assert_eq!(s["addresses"], 8, "four Services of each family: {s}");
    c.check_cluster_ip_paths();
    let s = services(&c.p, &c.node);
    assert!(
        s["to_service"].as_u64().unwrap() > 0 && s["replies"].as_u64().unwrap() > 0,
        "{s}"
    );
    assert!(
        s["from_outside"].as_u64().unwrap() > 0,
        "the outside endpoint's answers: {s}"
    );
    node_netfilter_counts(&c);
    c.check_fast_path_kept();
}

/// The DaemonSet's image holds only the binary, and a node may have no iptables or nft
/// installed: STATUS run with no netfilter tool on the machine learns kube-proxy's rules
/// from the kernel all the same, in each backend, and pod A reaches a ClusterIP.
#[test]
fn kube_proxys_rules_are_learned_with_no_netfilter_tool_on_the_machine() {
    for (mode, source) in [
        (Mode::Iptables(Backend::Nft), "kube-proxy-iptables-nft"),
        (
            Mode::Iptables(Backend::Legacy),
            "kube-proxy-iptables-legacy",
        ),
        (Mode::Nftables, "kube-proxy-nftables"),
    ] {
        let c = cluster(None);
        load(&c, mode, false);
        let env = ContainerEnv::none().with_cni_path(&c.p.runtime.cni_path_env());
        c.node
            .run_without_host_tools(&c.p.bin, CniCommand::Status, &env, c.conf.to_string())
            .unwrap()
            .expect_success("STATUS with no netfilter tool");
        let s = services(&c.p, &c.node);
        assert_eq!(s["source"], source, "{s}");
        assert_eq!(s["addresses"], 8, "four Services of each family: {s}");
        for v4 in [true, false] {
            let (web, ..) = Cluster::vips(v4);
            tcp_via(
                &c.a.netns,
                sa(web, 80),
                &c.b.netns,
                sa(addr(&c.b, v4), 8080),
            )
            .unwrap_or_else(|e| panic!("{source}: pod A -> {web}:80, endpoint pod B: {e:#}"));
        }
    }
}

#[test]
fn cluster_ips_work_next_to_kube_proxy_in_iptables_legacy_mode() {
    let c = cluster(Some((Mode::Iptables(Backend::Legacy), false)));
    let s = services(&c.p, &c.node);
    assert_eq!(s["source"], "kube-proxy-iptables-legacy", "{s}");
    c.check_cluster_ip_paths();
}

#[test]
fn cluster_ips_work_next_to_kube_proxy_in_nftables_mode() {
    let c = cluster(Some((Mode::Nftables, false)));
    let s = services(&c.p, &c.node);
    assert_eq!(s["source"], "kube-proxy-nftables", "{s}");
    assert_eq!(s["addresses"], 8, "{s}");
    c.check_cluster_ip_paths();
}

/// Hosts outside reach a pod of the node through its NodePorts, TCP and UDP, both families,
/// with externalTrafficPolicy Cluster and Local.
#[test]
fn node_ports_reach_a_local_pod_with_either_traffic_policy() {
    let c = cluster(None);
    c.check_node_ports_under_either_policy();
}

#[test]
fn services_follow_kube_proxy_rules_written_after_the_pods_and_taken_away() {
    let c = cluster(None);
    status(&c.p, &c.node, &c.conf);
    let s = services(&c.p, &c.node);
    assert_eq!(s["in_force"], false, "no kube-proxy yet: {s}");
    assert_eq!(s["source"], "none", "{s}");

    load(&c, Mode::Iptables(Backend::Nft), false);
    status(&c.p, &c.node, &c.conf);
    let s = services(&c.p, &c.node);
    assert_eq!(
        s["in_force"], true,
        "kube-proxy's rules after the pods: {s}"
    );
    c.check_cluster_ip_paths();

    for v4 in [true, false] {
        kp::flush_iptables(c.node.netns(), v4, Backend::Nft).unwrap();
    }
    status(&c.p, &c.node, &c.conf);
    let s = services(&c.p, &c.node);
    assert_eq!(s["in_force"], false, "kube-proxy's rules gone: {s}");
    assert_eq!(s["addresses"], 0, "{s}");
    assert_eq!(
        s["flows"], 0,
        "the flows through the stack are forgotten: {s}"
    );
    // Pods still reach each other.
    tcp_echo(&c.a.netns, &c.b.netns, addr(&c.b, true), 0).unwrap();
}

/// A DNS Service whose endpoint pod is replaced: kube-proxy points the rules at the new pod
/// and flushes the Service's UDP conntrack entries; the client's socket, unchanged, gets its
/// next answer from the new pod, from the Service's address.
#[test]
fn a_dns_service_keeps_answering_after_its_endpoint_is_replaced() {
    let c = cluster(None);
    let new = add(&c.p, &c.node, &c.conf);
    let dns = |ep: &Pod, v4: bool| {
        let vip = if v4 {
            IpAddr::V4(VIP4_DNS)
        } else {
            IpAddr::V6(VIP6_DNS)
        };
        vec![Service::new("kube-system/dns:dns", vip, 53, Proto::Udp)
            .endpoint(sa(addr(ep, v4), 5353))]
    };
    let write = |ep: &Pod| {
        for v4 in [true, false] {
            let cidr = if v4 { V4_SUBNET } else { V6_SUBNET };
            kp::flush_iptables(c.node.netns(), v4, Backend::Nft).unwrap();
            kp::load_iptables(
                c.node.netns(),
                v4,
                Backend::Nft,
                &kp::iptables_rules(&dns(ep, v4), cidr),
            )
            .unwrap();
        }
    };
    write(&c.b);
    status(&c.p, &c.node, &c.conf);
    for v4 in [true, false] {
        let vip = sa(
            if v4 {
                IpAddr::V4(VIP4_DNS)
            } else {
                IpAddr::V6(VIP6_DNS)
            },
            53,
        );
        let any: SocketAddr = if v4 {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let client = bind_in(&c.a.netns, || UdpSocket::bind(any));
        client
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let ask = |endpoint: &Pod| {
            let server = bind_in(&endpoint.netns, || {
                UdpSocket::bind(sa(addr(endpoint, v4), 5353))
            });
            server
                .set_read_timeout(Some(Duration::from_secs(3)))
                .unwrap();
            client.send_to(b"query", vip).unwrap();
            let mut buf = [0u8; 16];
            let (n, peer) = server
                .recv_from(&mut buf)
                .expect("the query reached the endpoint");
            server.send_to(&buf[..n], peer).unwrap();
            let (_, from) = client.recv_from(&mut buf).expect("an answer");
            assert_eq!(from, vip, "the answer comes from the Service");
        };
        ask(&c.b);
        // The endpoint replaced, as kube-proxy does it: rules, then its UDP flows flushed.
        write(&new);
        let out = c
            .node
            .netns()
            .exec(&[
                "conntrack",
                "-D",
                "-p",
                "udp",
                "--orig-dst",
                &vip.ip().to_string(),
            ])
            .unwrap();
        assert!(
            out.status.success() || out.status.code() == Some(1),
            "conntrack -D: {out:?}"
        );
        ask(&new);
        write(&c.b);
    }
}

/// The agent follows kube-proxy within 5 s, each event without a new ADD or a STATUS:
/// kube-proxy starting after the pods, a Service added, kube-proxy restarting (its rules
/// flushed and written again) and kube-proxy changing mode (iptables to nftables).
#[test]
fn the_agent_follows_kube_proxy_within_five_seconds() {
    let c = cluster(None);
    let conf_path = c.node.scratch_dir().join("agent.conf");
    std::fs::write(&conf_path, c.conf.to_string()).unwrap();
    let mut agent = ebpf_cni_tests::agent::AgentProcess::start(
        &c.p.bin,
        c.node.netns().path(),
        Some(&conf_path),
        None,
    )
    .unwrap();
    const BOUND: Duration = Duration::from_secs(5);
    let changed = |n: usize, source: &str| format!("{n} Service addresses from {source}");
    let web = |v4: bool, vip: IpAddr| {
        tcp_via(
            &c.a.netns,
            sa(vip, 80),
            &c.b.netns,
            sa(addr(&c.b, v4), 8080),
        )
        .unwrap_or_else(|e| panic!("pod A -> {vip}:80: {e:#}"));
    };
    let iptables = |extra: bool| {
        for v4 in [true, false] {
            let mut svcs = services_of(v4, &c.b, &c.ext, false);
            if extra {
                let vip: IpAddr = if v4 {
                    Ipv4Addr::new(10, 96, 0, 11).into()
                } else {
                    "fd00:96::11".parse().unwrap()
                };
                svcs.push(
                    Service::new("default/more:http", vip, 80, Proto::Tcp)
                        .endpoint(sa(addr(&c.b, v4), 8080)),
                );
            }
            let cidr = if v4 { V4_SUBNET } else { V6_SUBNET };
            kp::flush_iptables(c.node.netns(), v4, Backend::Nft).unwrap();
            kp::load_iptables(
                c.node.netns(),
                v4,
                Backend::Nft,
                &kp::iptables_rules(&svcs, cidr),
            )
            .unwrap();
        }
    };

    // kube-proxy starts after the pods.
    iptables(false);
    agent
        .wait_for(&changed(8, "kube-proxy-iptables-nft"), BOUND)
        .expect("kube-proxy starting after the pods");
    web(true, VIP4.into());
    web(false, VIP6.into());

    // A Service added.
    iptables(true);
    agent
        .wait_for(&changed(10, "kube-proxy-iptables-nft"), BOUND)
        .expect("a Service added");
    web(true, Ipv4Addr::new(10, 96, 0, 11).into());
    web(false, "fd00:96::11".parse().unwrap());

    // kube-proxy restarts: its rules gone a moment, then written again.
    for v4 in [true, false] {
        kp::flush_iptables(c.node.netns(), v4, Backend::Nft).unwrap();
    }
    agent
        .wait_for("Service flows: none", BOUND)
        .expect("kube-proxy's rules gone");
    assert_eq!(services(&c.p, &c.node)["in_force"], false);
    iptables(false);
    agent
        .wait_for(&changed(8, "kube-proxy-iptables-nft"), BOUND)
        .expect("kube-proxy restarted");
    web(true, VIP4.into());

    // kube-proxy changes mode: iptables to nftables.
    for v4 in [true, false] {
        kp::flush_iptables(c.node.netns(), v4, Backend::Nft).unwrap();
        let svcs = services_of(v4, &c.b, &c.ext, false);
        let cidr = if v4 { V4_SUBNET } else { V6_SUBNET };
        kp::load_nftables(c.node.netns(), &kp::nftables_rules(&svcs, cidr)).unwrap();
    }
    agent
        .wait_for(&changed(8, "kube-proxy-nftables"), BOUND)
        .expect("kube-proxy in nftables mode");
    assert_eq!(services(&c.p, &c.node)["source"], "kube-proxy-nftables");
    web(true, VIP4.into());
    web(false, VIP6.into());
    agent.still_running().unwrap();
}

/// ebpf-cni's masquerade on (`ipMasq`): the base paths, and the outside endpoint sees the
/// node's address (kube-proxy's masquerade rule takes the pod's marked Service packets);
/// the NodePorts under either traffic policy (pod B's answers to the client, Local's
/// unmasqueraded too, leave translated back by the stack, not masqueraded by the programs).
#[test]
fn cluster_ips_work_with_masquerade_on() {
    let masq = |c: &mut Value| c["ipMasq"] = serde_json::json!(true);
    let c = cluster_with(
        Some((Mode::Iptables(Backend::Nft), false)),
        Setup::Plain(&masq),
    );
    c.check_paths(true);
    // A second connection from the same port to the same Service is masqueraded too: its
    // packets carry kube-proxy's mark although the first flow's answers left a record.
    for v4 in [true, false] {
        let (_, _, out, _) = Cluster::vips(v4);
        let l = bind_in(c.ext.netns(), || {
            TcpListener::bind(sa(c.ext.addr_like(out), 9090))
        });
        let from = sa(addr(&c.a, v4), 40_310);
        for i in 1..=2 {
            let peer = exchange_from(&c.a.netns, from, sa(out, 81), &l)
                .unwrap_or_else(|e| panic!("v4 {v4}: connection {i} from {from}: {e:#}"));
            assert_eq!(
                peer.ip(),
                c.node_addr(v4),
                "v4 {v4}: connection {i} from {from} reached the outside endpoint unmasqueraded"
            );
        }
    }
    c.check_node_ports_under_either_policy();
    node_netfilter_counts(&c);
    c.check_fast_path_kept();
}

/// kube-proxy's masquerade keeps off ebpf-cni's masquerade ports (61000–65535 here), in
/// iptables mode (legacy backend) and nftables mode (5.13 and later), both families: a masquerading pod
/// makes 200 connections to the Service whose endpoint is the outside host, and each
/// reaches it from the node's address and a port below 61000. kube-proxy's own
/// `MASQUERADE --random-fully` picks from 1024–65535, so about 14 of 200 would land in
/// ebpf-cni's range, where a reply can be taken for one of ebpf-cni's flows. The table that
/// holds the rule (`inet ebpf-cni`) goes when kube-proxy's rules go, and when the node's
/// last masquerading pod is deleted.
#[test]
fn kube_proxys_masquerade_keeps_off_the_masquerade_ports() {
    const CONNECTIONS: usize = 200;
    let masq = |c: &mut Value| c["ipMasq"] = serde_json::json!(true);
    let table = |c: &Cluster| {
        let out = c
            .node
            .netns()
            .exec(&["nft", "list", "table", "inet", "ebpf-cni"])
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let mut modes = vec![Mode::Iptables(Backend::Legacy)];
    // kube-proxy's nftables mode needs 5.13 (see the kernel matrix).
    if ebpf_cni_tests::bpf::kernel_version() >= (5, 13) {
        modes.push(Mode::Nftables);
    } else {
        eprintln!("nftables mode not run: kube-proxy refuses it below 5.13");
    }
    for mode in modes {
        let c = cluster_with(Some((mode, false)), Setup::Plain(&masq));
        let listed = table(&c).expect("STATUS wrote table inet ebpf-cni");
        assert!(
            listed.contains("masquerade to :1024-60999 fully-random"),
            "{listed}"
        );
        let shown = dp::inspect(&c.p.bin, &c.node).unwrap();
        assert_eq!(
            shown["masquerade"]["kube_proxy_ports"], "1024-60999",
            "inspect: {shown}"
        );
        // Another pod's ADD keeps the table (its handle), never removes and makes it again.
        let handle = |c: &Cluster| {
            let out = c
                .node
                .netns()
                .exec(&["nft", "-a", "list", "table", "inet", "ebpf-cni"])
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.lines().next().unwrap_or_default().to_owned()
        };
        let before = handle(&c);
        assert!(before.contains("# handle"), "{before}");
        let extra = ebpf_cni_tests::Pod::add_direct(&c.p, &c.node, &c.conf);
        assert_eq!(handle(&c), before, "an ADD made the table again");
        extra.del_direct(&c.p, &c.node, &c.conf);
        for v4 in [true, false] {
            let fam = if v4 { "IPv4" } else { "IPv6" };
            let (_, _, out, _) = Cluster::vips(v4);
            let l = bind_in(c.ext.netns(), || {
                TcpListener::bind(sa(c.ext.addr_like(out), 9090))
            });
            let mut ports = Vec::with_capacity(CONNECTIONS);
            for i in 0..CONNECTIONS {
                let peer = exchange_from(&c.a.netns, sa(addr(&c.a, v4), 0), sa(out, 81), &l)
                    .unwrap_or_else(|e| panic!("{fam}: connection {i}: {e:#}"));
                assert_eq!(peer.ip(), c.node_addr(v4), "{fam}: connection {i}");
                ports.push(peer.port());
            }
            let ours: Vec<u16> = ports.iter().copied().filter(|p| *p >= 61_000).collect();
            assert!(
                ours.is_empty(),
                "{fam}: kube-proxy masqueraded {} of {CONNECTIONS} connections into ebpf-cni's ports: {ours:?}",
                ours.len()
            );
            // Its randomness is kept: the ports spread over the range left.
            ports.sort_unstable();
            ports.dedup();
            assert!(ports.len() > CONNECTIONS * 9 / 10, "{fam}: {ports:?}");
        }
        match mode {
            Mode::Iptables(backend) => {
                for v4 in [true, false] {
                    kp::flush_iptables(c.node.netns(), v4, backend).unwrap();
                }
                status(&c.p, &c.node, &c.conf);
                assert_eq!(table(&c), None, "the table outlived kube-proxy's rules");
            }
            Mode::Nftables => {
                c.a.del_direct(&c.p, &c.node, &c.conf);
                assert!(table(&c).is_some(), "pod B still masquerades");
                c.b.del_direct(&c.p, &c.node, &c.conf);
                assert_eq!(table(&c), None, "the table outlived the masquerading pods");
            }
        }
    }
}

/// Pods with both limits (policed here; paced where the kernel has `sch_fq`, whose
/// deliveries the programs make through the host veth's egress and do not record): the
/// base paths, and the NodePorts under either traffic policy.
#[test]
fn cluster_ips_work_for_pods_with_bandwidth_limits() {
    let limits = |c: &mut Value| {
        c["ingressRate"] = serde_json::json!(200_000_000u64);
        c["ingressBurst"] = serde_json::json!(4_294_967_295u64);
        c["egressRate"] = serde_json::json!(200_000_000u64);
        c["egressBurst"] = serde_json::json!(4_294_967_295u64);
    };
    let c = cluster_with(
        Some((Mode::Iptables(Backend::Nft), false)),
        Setup::Plain(&limits),
    );
    c.check_cluster_ip_paths();
    c.check_node_ports_under_either_policy();
    node_netfilter_counts(&c);
    c.check_fast_path_kept();
}

/// Chained after the reference bridge: the bridge's pods reach Services, and hosts outside
/// reach them through NodePorts under either traffic policy, as the bridge alone gives
/// them (the chained program leaves their forwarding to the bridge).
#[test]
fn cluster_ips_work_for_chained_pods() {
    let c = cluster_with(Some((Mode::Iptables(Backend::Nft), false)), Setup::Chained);
    c.check_cluster_ip_paths();
    c.check_node_ports_under_either_policy();
}

/// A Service's external IP from a host outside and from a pod, a pod reaching a NodePort
/// of its own node, and session affinity (ClientIP) keeping a client on one endpoint.
#[test]
fn external_ips_own_node_ports_and_session_affinity() {
    let c = cluster(None);
    for v4 in [true, false] {
        let (vip, ext_ip, sticky): (IpAddr, IpAddr, IpAddr) = if v4 {
            (
                Ipv4Addr::new(10, 96, 0, 40).into(),
                Ipv4Addr::new(198, 51, 100, 80).into(),
                Ipv4Addr::new(10, 96, 0, 50).into(),
            )
        } else {
            (
                "fd00:96::40".parse().unwrap(),
                "2001:db8:80::80".parse().unwrap(),
                "fd00:96::50".parse().unwrap(),
            )
        };
        let b = addr(&c.b, v4);
        let mut ext = Service::new("default/ext:http", vip, 80, Proto::Tcp).endpoint(sa(b, 8080));
        ext.external_ips = vec![ext_ip];
        ext.node_port = Some(30_081);
        let mut sticky_svc = Service::new("default/sticky:http", sticky, 80, Proto::Tcp)
            .endpoint(sa(b, 8080))
            .endpoint(sa(b, 8081));
        sticky_svc.affinity = true;
        let cidr = if v4 { V4_SUBNET } else { V6_SUBNET };
        kp::load_iptables(
            c.node.netns(),
            v4,
            Backend::Nft,
            &kp::iptables_rules(&[ext, sticky_svc], cidr),
        )
        .unwrap();
    }
    status(&c.p, &c.node, &c.conf);
    for v4 in [true, false] {
        let fam = if v4 { "IPv4" } else { "IPv6" };
        let (ext_ip, sticky): (IpAddr, IpAddr) = if v4 {
            (
                Ipv4Addr::new(198, 51, 100, 80).into(),
                Ipv4Addr::new(10, 96, 0, 50).into(),
            )
        } else {
            (
                "2001:db8:80::80".parse().unwrap(),
                "fd00:96::50".parse().unwrap(),
            )
        };
        let b = addr(&c.b, v4);
        tcp_via(c.ext.netns(), sa(ext_ip, 80), &c.b.netns, sa(b, 8080))
            .unwrap_or_else(|e| panic!("{fam} outside -> external IP {ext_ip}: {e:#}"));
        tcp_via(&c.a.netns, sa(ext_ip, 80), &c.b.netns, sa(b, 8080))
            .unwrap_or_else(|e| panic!("{fam} pod A -> external IP {ext_ip}: {e:#}"));
        let node_addr = c.node_addr(v4);
        tcp_via(&c.a.netns, sa(node_addr, 30_081), &c.b.netns, sa(b, 8080))
            .unwrap_or_else(|e| panic!("{fam} pod A -> its node's NodePort: {e:#}"));
        // Affinity: every connection of pod A goes to the endpoint its first one took.
        let listeners: Vec<TcpListener> = [8080, 8081]
            .iter()
            .map(|p| bind_in(&c.b.netns, || TcpListener::bind(sa(b, *p))))
            .collect();
        let mut first = None;
        for i in 0..12 {
            c.a.netns
                .run_in(|| TcpStream::connect_timeout(&sa(sticky, 80), Duration::from_secs(3)))
                .unwrap()
                .unwrap_or_else(|e| panic!("{fam} connection {i} to the sticky Service: {e}"));
            let took: Vec<usize> = listeners
                .iter()
                .enumerate()
                // connect() returned once the handshake completed: the connection
                // waits in its listener's queue.
                .filter(|(_, l)| {
                    l.set_nonblocking(true).unwrap();
                    l.accept().is_ok()
                })
                .map(|(k, _)| k)
                .collect();
            assert_eq!(took.len(), 1, "{fam} connection {i} reached {took:?}");
            let first = *first.get_or_insert(took[0]);
            assert_eq!(took[0], first, "{fam}: connection {i} left its endpoint");
        }
    }
}

/// kube-proxy's IPVS mode: the ClusterIPs are addresses of `kube-ipvs0`, which the node
/// takes for Service addresses (learned as such, no device program on the dummy). Where
/// the kernel has IPVS (the kernel matrix's guests; not this machine's), its virtual
/// servers carry pod A → ClusterIP → pod B and B's hairpin, both families, the answers
/// from the Service's address.
#[test]
fn cluster_ips_work_next_to_kube_proxy_in_ipvs_mode() {
    let c = cluster(None);
    let ipvs = kp::kernel_has_ipvs(c.node.netns());
    let mut svcs = Vec::new();
    for v4 in [true, false] {
        let vip: IpAddr = if v4 { VIP4.into() } else { VIP6.into() };
        svcs.push(
            Service::new("default/web:http", vip, 80, Proto::Tcp)
                .endpoint(sa(addr(&c.b, v4), 8080)),
        );
    }
    kp::load_ipvs(c.node.netns(), &svcs, (V4_SUBNET, V6_SUBNET), ipvs).unwrap();
    status(&c.p, &c.node, &c.conf);
    let report = dp::inspect(&c.p.bin, &c.node).unwrap();
    let s = &report["services"];
    assert_eq!(s["in_force"], true, "{s}");
    assert!(
        s["source"].as_str().unwrap().contains("kube-proxy-ipvs"),
        "{s}"
    );
    assert!(
        !report["devices"].to_string().contains("kube-ipvs0"),
        "kube-ipvs0 got the device program: {}",
        report["devices"]
    );
    if !ipvs {
        assert!(
            !ebpf_cni_tests::rate::in_vm(),
            "the kernel matrix's guests have IPVS"
        );
        eprintln!("this kernel has no IPVS: its virtual servers are tested in the kernel matrix");
        return;
    }
    for v4 in [true, false] {
        let fam = if v4 { "IPv4" } else { "IPv6" };
        let vip: IpAddr = if v4 { VIP4.into() } else { VIP6.into() };
        let b = addr(&c.b, v4);
        let peer = tcp_via(&c.a.netns, sa(vip, 80), &c.b.netns, sa(b, 8080))
            .unwrap_or_else(|e| panic!("{fam} pod A -> ClusterIP (IPVS): {e:#}"));
        assert_eq!(peer.ip(), addr(&c.a, v4), "{fam}");
        tcp_via(&c.b.netns, sa(vip, 80), &c.b.netns, sa(b, 8080))
            .unwrap_or_else(|e| panic!("{fam} pod B -> its own ClusterIP (IPVS): {e:#}"));
    }
}

/// SCTP Services (kube-proxy writes them as TCP's, `-p sctp`), where the kernel has SCTP
/// (the guests; this machine's has none, which the test checks rather than assumes), both
/// families, under each externalTrafficPolicy: pod A → ClusterIP → pod B, and the host
/// outside → NodePort → pod B (Local: pod B sees the client's address; Cluster: the node
/// masquerades it), each association's answers from the address dialled.
#[test]
fn sctp_cluster_ips_and_node_ports_work_where_the_kernel_has_sctp() {
    let c = cluster(None);
    let vip = |v4: bool| -> IpAddr {
        if v4 {
            VIP4.into()
        } else {
            VIP6.into()
        }
    };
    let write = |local: bool| {
        for v4 in [true, false] {
            let mut svc = Service::new("default/sctp:s", vip(v4), 90, Proto::Sctp)
                .endpoint(sa(addr(&c.b, v4), 9090));
            svc.node_port = Some(NODE_PORT_SCTP);
            svc.local = local;
            let cidr = if v4 { V4_SUBNET } else { V6_SUBNET };
            kp::flush_iptables(c.node.netns(), v4, Backend::Nft).unwrap();
            kp::load_iptables(
                c.node.netns(),
                v4,
                Backend::Nft,
                &kp::iptables_rules(&[svc], cidr),
            )
            .unwrap();
        }
        status(&c.p, &c.node, &c.conf);
    };
    write(false);
    let s = services(&c.p, &c.node);
    assert_eq!(
        (s["in_force"].clone(), s["addresses"].clone()),
        (true.into(), 2.into()),
        "{s}"
    );
    if !c.a.netns.run_in(sctp::available).unwrap() {
        assert!(
            !ebpf_cni_tests::rate::in_vm(),
            "the kernel matrix's guests have SCTP"
        );
        eprintln!("this kernel has no SCTP: SCTP Services are tested in the kernel matrix");
        return;
    }
    for local in [false, true] {
        let policy = if local { "Local" } else { "Cluster" };
        write(local);
        for v4 in [true, false] {
            let fam = if v4 { "IPv4" } else { "IPv6" };
            let b = sa(addr(&c.b, v4), 9090);
            let peer = sctp_via(&c.a.netns, sa(vip(v4), 90), &c.b.netns, b)
                .unwrap_or_else(|e| panic!("{fam} SCTP pod A -> ClusterIP ({policy}): {e:#}"));
            assert_eq!(peer.ip(), addr(&c.a, v4), "{fam}: the endpoint sees pod A");
            let node = c.node_addr(v4);
            let client = c.ext.addr_like(node);
            let peer = sctp_via(c.ext.netns(), sa(node, NODE_PORT_SCTP), &c.b.netns, b)
                .unwrap_or_else(|e| {
                    panic!("{fam} SCTP outside -> {node}:{NODE_PORT_SCTP} ({policy}): {e:#}")
                });
            if local {
                assert_eq!(peer.ip(), client, "{fam}: Local keeps the client's address");
            } else {
                assert_ne!(peer.ip(), client, "{fam}: Cluster masquerades the client");
            }
        }
    }
}

/// One SCTP exchange: a server in `server_ns` on `bind` echoes a message, a client in
/// `from` dialling `dial` checks it; the client's address as the server saw it. The
/// client's association is with `dial` (an answer from another address would not join it).
fn sctp_via(
    from: &Netns,
    dial: SocketAddr,
    server_ns: &Netns,
    bind: SocketAddr,
) -> Result<SocketAddr> {
    let listener = bind_in(server_ns, || sctp::listen(bind));
    let mut client = from
        .run_in(|| sctp::connect(dial))?
        .with_context(|| format!("SCTP {} -> {dial}", from.name()))?;
    let (mut server, peer) = listener.accept()?;
    std::io::Write::write_all(&mut client, b"sctp")?;
    let mut buf = [0u8; 4];
    std::io::Read::read_exact(&mut server, &mut buf)?;
    std::io::Write::write_all(&mut server, &buf)?;
    std::io::Read::read_exact(&mut client, &mut buf).context("the echo")?;
    if &buf != b"sctp" {
        bail!("SCTP {dial}: echo {buf:?}");
    }
    let to = client.peer_addr()?;
    if to != dial {
        bail!("SCTP {dial}: the association is with {to}");
    }
    Ok(peer)
}

/// One-to-one SCTP sockets (`SOCK_STREAM`, `IPPROTO_SCTP`), used through std's TCP types,
/// whose calls (connect, accept, read, write) are the same system calls.
mod sctp {
    use std::io;
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::os::fd::FromRawFd;

    fn socket(addr: &SocketAddr) -> io::Result<i32> {
        let fam = if addr.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        // SAFETY: a plain system call; the fd is owned by the caller.
        let fd = unsafe { libc::socket(fam, libc::SOCK_STREAM, libc::IPPROTO_SCTP) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    }

    fn sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
        // SAFETY: all-zero is a valid sockaddr_storage.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let len = match addr {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as u16,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(a.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
                unsafe { std::ptr::write(std::ptr::addr_of_mut!(ss).cast(), sin) };
                std::mem::size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as u16,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: 0,
                    sin6_addr: libc::in6_addr {
                        s6_addr: a.ip().octets(),
                    },
                    sin6_scope_id: 0,
                };
                // SAFETY: as above, for sockaddr_in6.
                unsafe { std::ptr::write(std::ptr::addr_of_mut!(ss).cast(), sin6) };
                std::mem::size_of::<libc::sockaddr_in6>()
            }
        };
        (ss, len as libc::socklen_t)
    }

    /// Whether this thread's kernel makes SCTP sockets.
    pub fn available() -> bool {
        match socket(&SocketAddr::from(([127, 0, 0, 1], 0))) {
            Ok(fd) => {
                // SAFETY: our own fd.
                unsafe { libc::close(fd) };
                true
            }
            Err(_) => false,
        }
    }

    pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
        let fd = socket(&addr)?;
        // SAFETY: the fd is ours; the listener owns it from here.
        let l = unsafe { TcpListener::from_raw_fd(fd) };
        let (ss, len) = sockaddr(&addr);
        // SAFETY: a valid address of `len` bytes.
        if unsafe { libc::bind(fd, std::ptr::addr_of!(ss).cast(), len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a plain system call on our own fd.
        if unsafe { libc::listen(fd, 8) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(l)
    }

    pub fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
        let fd = socket(&addr)?;
        // SAFETY: the fd is ours; the stream owns it from here.
        let s = unsafe { TcpStream::from_raw_fd(fd) };
        s.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
        let (ss, len) = sockaddr(&addr);
        // SAFETY: a valid address of `len` bytes.
        if unsafe { libc::connect(fd, std::ptr::addr_of!(ss).cast(), len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(s)
    }
}

/// A host firewall on the forward hook (here a FORWARD policy of DROP and a ufw-like
/// REJECT, as Docker and ufw leave them): the node's first ADD warns once, naming them, the
/// next ADD does not, `inspect` lists them, and pods still reach each other (the programs'
/// forwarding skips the hook, on purpose).
#[test]
fn a_forward_firewall_is_named_once_by_add_and_by_inspect() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    netfilter::set_forward_policy(node.netns(), Family::V4, "DROP").unwrap();
    netfilter::iptables(
        node.netns(),
        Family::V4,
        &["-A", "FORWARD", "-s", "10.99.0.0/16", "-j", "REJECT"],
    )
    .unwrap();
    let conf = p.conf("1.1.0", &node, Stack::Dual);
    let adds: Vec<(Pod, String)> = (0..2)
        .map(|_| {
            let ns = node.new_pod().unwrap();
            let att = Attachment::new(&unique_container_id(), ns.path(), "eth0");
            let out = p.run(
                &node,
                CniCommand::Add,
                &p.runtime.env(&att),
                conf.to_string(),
            );
            out.expect_success("ADD");
            let result = out.json.clone().unwrap();
            (
                dual_stack(Pod::attached(ns, att, result)),
                out.stderr.clone(),
            )
        })
        .collect();
    let warning = "drop or reject forwarded traffic";
    assert!(adds[0].1.contains(warning), "the first ADD: {}", adds[0].1);
    assert!(
        adds[0].1.contains("FORWARD policy DROP")
            && adds[0].1.contains("-A FORWARD -s 10.99.0.0/16 -j REJECT"),
        "{}",
        adds[0].1
    );
    assert!(
        !adds[1].1.contains(warning),
        "the second ADD warned again: {}",
        adds[1].1
    );
    let s = services(&p, &node);
    let listed = s["forward_firewall"].to_string();
    assert!(
        listed.contains("FORWARD policy DROP") && listed.contains("REJECT"),
        "{s}"
    );
    let (a, b) = (&adds[0].0, &adds[1].0);
    tcp_echo(&a.netns, &b.netns, addr(b, true), 0).unwrap();
}

/// A client that reuses its port: pod A reaches the Service (pod B the endpoint) from a
/// fixed port, then pod B directly from the same port, over TCP and UDP, both families. The
/// direct flow's answers come from B, not from the Service's address: the Service flow's
/// record (and its conntrack entry, still in TIME_WAIT or its UDP timeout) must not take
/// them for its own.
#[test]
fn a_port_reused_from_a_service_flow_to_the_endpoint_directly_gets_the_endpoints_answers() {
    let c = cluster(Some((Mode::Iptables(Backend::Nft), false)));
    for v4 in [true, false] {
        let fam = if v4 { "IPv4" } else { "IPv6" };
        let (web, dns, _, _) = Cluster::vips(v4);
        let b = addr(&c.b, v4);
        let a_port = |port: u16| SocketAddr::new(addr(&c.a, v4), port);
        // TCP: a socket bound to one port, once to the Service, once to B.
        let listener = bind_in(&c.b.netns, || TcpListener::bind(sa(b, 8080)));
        for (i, dial) in [sa(web, 80), sa(b, 8080)].into_iter().enumerate() {
            let conn = connect_from(&c.a.netns, a_port(40_123), dial)
                .unwrap_or_else(|e| panic!("{fam} TCP {i} to {dial}: {e}"));
            let (_, peer) = listener.accept().unwrap();
            // While the Service flow's conntrack entry lives, the direct flow from its port
            // goes through the stack too, whose NAT gives it another source port where the
            // tuples would clash (as on a node without the programs).
            assert_eq!(peer.ip(), addr(&c.a, v4), "{fam} TCP {i}");
            assert_eq!(conn.peer_addr().unwrap(), dial, "{fam} TCP {i}");
            drop(conn);
        }
        // UDP: one socket, the Service first, then B directly.
        let server = bind_in(&c.b.netns, || UdpSocket::bind(sa(b, 5353)));
        server
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let client = bind_in(&c.a.netns, || UdpSocket::bind(a_port(40_124)));
        client
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        for dial in [sa(dns, 53), sa(b, 5353)] {
            client.send_to(b"q", dial).unwrap();
            let mut buf = [0u8; 4];
            let (n, peer) = server.recv_from(&mut buf).unwrap();
            server.send_to(&buf[..n], peer).unwrap();
            let (_, from) = client
                .recv_from(&mut buf)
                .unwrap_or_else(|e| panic!("{fam} UDP to {dial}: no answer: {e}"));
            assert_eq!(from, dial, "{fam}: the answer to {dial} came from {from}");
        }
    }
}

/// A TCP connection from `ns` bound to `from` (with `SO_REUSEADDR`, as a client reusing its
/// port) to `dial`, given up after two SYN retransmissions.
fn connect_from(ns: &Netns, from: SocketAddr, dial: SocketAddr) -> std::io::Result<TcpStream> {
    use nix::sys::socket as s;
    ns.run_in(|| -> std::io::Result<TcpStream> {
        let fam = if from.is_ipv4() {
            s::AddressFamily::Inet
        } else {
            s::AddressFamily::Inet6
        };
        let fd = s::socket(fam, s::SockType::Stream, s::SockFlag::empty(), None)?;
        s::setsockopt(&fd, s::sockopt::ReuseAddr, &true)?;
        // Two SYN retransmissions: a connection that cannot be made fails in 7 s, not 2 min.
        let syn_count: libc::c_int = 2;
        // SAFETY: a plain setsockopt on our own descriptor, with an int of its size.
        let rc = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                libc::IPPROTO_TCP,
                libc::TCP_SYNCNT,
                (&syn_count as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        s::bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &s::SockaddrStorage::from(from),
        )?;
        let t = TcpStream::from(fd);
        s::connect(
            std::os::fd::AsRawFd::as_raw_fd(&t),
            &s::SockaddrStorage::from(dial),
        )?;
        Ok(t)
    })
    .map_err(std::io::Error::other)?
}

/// The same reuse towards a host outside: pod A reaches the Service whose endpoint is the
/// outside host from a fixed port, then the outside host directly, on another port of it,
/// from the same port, over TCP, both families, while the first connection is still open.
/// Both connections work: the direct one's answers, arriving at the node's device for A's
/// port, are not taken for the Service flow's (kube-proxy's forward chain drops what
/// conntrack finds invalid).
#[test]
fn a_port_shared_by_a_service_flow_and_a_direct_flow_to_the_outside_serves_both() {
    let c = cluster(Some((Mode::Iptables(Backend::Nft), false)));
    for v4 in [true, false] {
        let fam = if v4 { "IPv4" } else { "IPv6" };
        let (_, _, out, _) = Cluster::vips(v4);
        let ext = c.ext.addr_like(out);
        let a_port = SocketAddr::new(addr(&c.a, v4), 40_200);
        let l1 = bind_in(c.ext.netns(), || TcpListener::bind(sa(ext, 9090)));
        let l2 = bind_in(c.ext.netns(), || TcpListener::bind(sa(ext, 9091)));
        let connect = |dial: SocketAddr| connect_from(&c.a.netns, a_port, dial);
        let via_service =
            connect(sa(out, 81)).unwrap_or_else(|e| panic!("{fam} to the Service: {e}"));
        let (mut s1, _) = l1.accept().unwrap();
        let direct = connect(sa(ext, 9091)).unwrap_or_else(|e| {
            panic!("{fam} directly to the outside host from the same port: {e}")
        });
        let (mut s2, _) = l2.accept().unwrap();
        for (conn, server, what) in [
            (&via_service, &mut s1, "Service"),
            (&direct, &mut s2, "direct"),
        ] {
            let mut conn = conn;
            std::io::Write::write_all(&mut conn, b"ping").unwrap();
            let mut buf = [0u8; 4];
            std::io::Read::read_exact(server, &mut buf).unwrap();
            std::io::Write::write_all(server, b"pong").unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            std::io::Read::read_exact(&mut conn, &mut buf)
                .unwrap_or_else(|e| panic!("{fam} {what} connection's answer: {e}"));
            assert_eq!(&buf, b"pong", "{fam} {what}");
        }
    }
}

/// One exchange over a TCP connection from `from` in `ns` (bound with `SO_REUSEADDR`) to
/// `dial`, accepted by `listener`; returns the peer address the server saw. The server
/// closes first, then the client: the client's port is left without a TIME_WAIT, free for
/// the next connection, as a busy client's ports are.
fn exchange_from(
    ns: &Netns,
    from: SocketAddr,
    dial: SocketAddr,
    listener: &TcpListener,
) -> Result<SocketAddr> {
    use std::io::{Read, Write};
    let mut conn = connect_from(ns, from, dial).with_context(|| format!("{from} -> {dial}"))?;
    listener.set_nonblocking(false)?;
    let (mut server, peer) = listener.accept()?;
    conn.set_read_timeout(Some(Duration::from_secs(3)))?;
    server.set_read_timeout(Some(Duration::from_secs(3)))?;
    conn.write_all(b"ping")?;
    let mut buf = [0u8; 4];
    server.read_exact(&mut buf)?;
    server.write_all(b"pong")?;
    conn.read_exact(&mut buf)
        .with_context(|| format!("{from} -> {dial}: the answer"))?;
    drop(server);
    let _ = conn.read(&mut buf);
    Ok(peer)
}

/// A pod reaching a Service whose endpoint is beyond the node from a port it used for the
/// same Service before, over TCP, both families: the endpoint's answers go to the stack,
/// which translates them back to the Service's address,
/// - after the earlier flow's record ended (TCP: 120 s after its close, as conntrack's
///   TIME_WAIT). A DNS client's random ports meet this all day, towards a DNS Service whose
///   endpoints are on other nodes. Before, the record the stack's delivery left for the
///   earlier flow sent the new flow to the stack without a record of its own, so the
///   endpoint's answers took the redirect path, reached the pod from the endpoint's
///   address and were refused: every connection from that port timed out;
/// - at once after the earlier flow's close, the new connection then idle for longer than
///   a closed flow's 120 s, and the endpoint speaking first (a server push): the new flow's
///   record does not inherit the earlier flow's close.
#[test]
fn a_port_reused_for_a_service_reaches_it_again_at_once_and_after_its_flow_ended() {
    use std::io::{Read, Write};
    let c = cluster(Some((Mode::Iptables(Backend::Nft), false)));
    let mut cases = Vec::new();
    for v4 in [true, false] {
        let fam = if v4 { "IPv4" } else { "IPv6" };
        let (_, _, out, _) = Cluster::vips(v4);
        let ext = c.ext.addr_like(out);
        let l = bind_in(c.ext.netns(), || TcpListener::bind(sa(ext, 9090)));
        let (expired, reused) = (sa(addr(&c.a, v4), 40_300), sa(addr(&c.a, v4), 40_302));
        for from in [expired, reused] {
            let peer = exchange_from(&c.a.netns, from, sa(out, 81), &l)
                .unwrap_or_else(|e| panic!("{fam}: the first connection from {from}: {e:#}"));
            assert_eq!(peer, from, "{fam}: the endpoint sees the pod's port");
        }
        // The port used again at once, the connection kept open.
        // (At once: as soon as the earlier socket has let the port go, within a second.)
        let mut last = None;
        let mut conn = (0..10)
            .find_map(|_| match connect_from(&c.a.netns, reused, sa(out, 81)) {
                Ok(conn) => Some(conn),
                Err(e) => {
                    last = Some(e);
                    std::thread::sleep(Duration::from_millis(100));
                    None
                }
            })
            .unwrap_or_else(|| panic!("{fam}: {reused} again at once: {last:?}"));
        let (mut server, _) = l.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        conn.write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        server.read_exact(&mut buf).unwrap();
        cases.push((fam, expired, sa(out, 81), l, conn, server));
    }
    // The first flows' records end 120 s after their close.
    std::thread::sleep(Duration::from_secs(125));
    for (fam, expired, dial, l, mut conn, mut server) in cases {
        server.write_all(b"push").unwrap();
        let mut buf = [0u8; 4];
        conn.read_exact(&mut buf).unwrap_or_else(|e| {
            panic!("{fam}: the endpoint's push after 125 s idle, on a port reused at once: {e}")
        });
        assert_eq!(&buf, b"push", "{fam}");
        let peer = exchange_from(&c.a.netns, expired, dial, &l).unwrap_or_else(|e| {
            panic!("{fam}: {expired} to the same Service 125 s after its flow's close: {e:#}")
        });
        assert_eq!(peer, expired, "{fam}");
    }
}
