//! An upgrade (a node attached by the previous release keeps working): the previous
//! release's binary (`EBPF_CNI_PREVIOUS_BIN`, see `cargo xtask build-previous`) attaches
//! pods to a node with every kind of state it pins — plain routing (the pods' programs as
//! netlink filters, the default, and as TCX links), host ports, a bandwidth limit,
//! masquerade, and the node-wide state they share (maps, programs, the device program on
//! the uplink, the pods' gateway on `lo`, the socket programs) — then the binary is
//! replaced by the current build (`EBPF_CNI_BIN`), which must CHECK those pods, keep their
//! traffic flowing as configured (connections opened before the upgrade included), ADD a
//! new pod beside them that works with the old ones, read the node with `inspect`, and DEL
//! every pod, old and new, leaving nothing behind. A rollback too: the previous binary
//! CHECKs and DELs pods the current one ADDed. The source check of the current build
//! applies to its own pods only: the old pods, unchecked, keep sending as before until
//! their next ADD.
//!
//! What it catches, and how:
//! - A pin renamed (a map, a program, a link, a directory of the layout): the current
//!   binary does not find what the old one pinned. CHECK of an old pod fails (its links or
//!   its endpoint are missing), or the current ADD creates a second, empty map under the
//!   new name that the old pods' programs never see (pod↔pod traffic between old and new
//!   pods breaks, the new pod's host port is not served on old pods' paths), or DEL leaves
//!   the old pins (the node is not clean at the end).
//! - A map's key or value layout changed: the current binary opens the old pinned map and
//!   refuses its sizes (CHECK, ADD or `inspect` fail), or reads its entries wrongly (CHECK
//!   compares them with the config and fails; `inspect` shows other rates and addresses
//!   than configured, asserted below); programs of one build reading entries the other
//!   wrote misroute traffic (the traffic checks, both ways: old pods' programs look up the
//!   new pod's entries, the new programs the old pods'), and a connection opened through
//!   the old programs stops when the new ones no longer find its flow.
//!
//! Both binaries being the same file would make all of this vacuous: the test refuses it.
//! When the two builds come from the same sources (right after the pin is bumped), it
//! still runs and passes, checking little; it bites once the code moves on.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use ebpf_cni_tests::bpf;
use ebpf_cni_tests::config::{Stack, NETWORK};
use ebpf_cni_tests::dataplane as dp;
use ebpf_cni_tests::external::ExternalHost;
use ebpf_cni_tests::host_ports::{ask_each, sa, PodServer};
use ebpf_cni_tests::net::{tcp_echo, udp_echo};
use ebpf_cni_tests::rate::{floor, iperf};
use ebpf_cni_tests::source_check::{assert_udp_arrives, assert_udp_blocked};
use ebpf_cni_tests::state::{assert_gone, assert_node_clean};
use ebpf_cni_tests::{require_root, NetConfList, Node, PluginUnderTest, Pod};
use serde_json::{json, Value};

/// The limited pods' rates towards them and from them: different, so a build that reads
/// one direction's limit for the other fails.
const INGRESS_BPS: u64 = 40_000_000;
const EGRESS_BPS: u64 = 20_000_000;
/// The masquerade port range when the config names none.
const MASQ_PORTS: std::ops::RangeInclusive<u16> = 61_000..=65_535;

/// A pod and what the failure messages call it.
struct Named {
    what: &'static str,
    pod: Pod,
}

impl std::ops::Deref for Named {
    type Target = Pod;
    fn deref(&self) -> &Pod {
        &self.pod
    }
}

/// The network's list: dual-stack, host ports and limits as capabilities, masquerade when
/// `masq`. Both binaries are named `ebpf-cni`, so one list serves both.
fn list(p: &PluginUnderTest, node: &Node, masq: bool) -> NetConfList {
    list_in(p, node, masq, None)
}

/// [`list`] with `tcAttachMode` (`"tcx"`: the pods' programs as pinned TCX links, where
/// the default puts netlink filters with pinned records).
fn list_in(p: &PluginUnderTest, node: &Node, masq: bool, mode: Option<&str>) -> NetConfList {
    let mut conf = p.conf("1.0.0", node, Stack::Dual);
    if let Some(mode) = mode {
        conf["tcAttachMode"] = json!(mode);
    }
    conf["capabilities"] = json!({"portMappings": true, "bandwidth": true});
    if masq {
        conf["ipMasq"] = json!(true);
    }
    NetConfList::single(&conf)
}

fn add(
    p: &PluginUnderTest,
    node: &Node,
    l: &NetConfList,
    what: &'static str,
    caps: &[(&str, Value)],
) -> Named {
    let pod = Pod::try_add(&p.runtime, node, l, |att| att.with_capabilities(caps))
        .unwrap_or_else(|e| panic!("ADD of {what} by {}: {e}", p.bin.display()))
        .assert_standard("1.0.0", Stack::Dual);
    Named { what, pod }
}

fn check(p: &PluginUnderTest, node: &Node, l: &NetConfList, pod: &Named, by: &str) {
    p.runtime
        .check(node, l, &pod.att, &pod.result)
        .unwrap_or_else(|e| panic!("CHECK of {} by the {by} build: {e}", pod.what));
}

fn del(p: &PluginUnderTest, node: &Node, l: &NetConfList, pod: &Named, by: &str) {
    p.runtime
        .del(node, l, &pod.att, Some(&pod.result))
        .unwrap_or_else(|e| panic!("DEL of {} by the {by} build: {e}", pod.what));
    assert_gone(
        node,
        Some(&pod.netns),
        "eth0",
        &pod.r,
        NETWORK,
        &pod.att.container_id,
        &format!("DEL of {} by the {by} build", pod.what),
    );
}

/// TCP and UDP echo from each pod to each address of the other, both ways.
fn pods_talk(a: &Named, b: &Named) {
    for (from, to) in [(a, b), (b, a)] {
        for ip in to.ips() {
            tcp_echo(&from.netns, &to.netns, ip, 0)
                .unwrap_or_else(|e| panic!("TCP {} -> {} {ip}: {e:#}", from.what, to.what));
            udp_echo(&from.netns, &to.netns, ip, 0)
                .unwrap_or_else(|e| panic!("UDP {} -> {} {ip}: {e:#}", from.what, to.what));
        }
    }
}

/// Host port `port` of the node answers with `tag` from outside (both node addresses) and
/// from `pod`, over TCP and UDP.
fn host_port_serves(ext: &ExternalHost, pod: &Named, port: u16, tag: &str) {
    let (v4, v6) = (IpAddr::V4(ext.node_v4), IpAddr::V6(ext.node_v6));
    let failures = ask_each(
        &[
            ("external -> node IPv4", ext.netns(), sa(v4, port)),
            ("external -> node IPv6", ext.netns(), sa(v6, port)),
            (pod.what, &pod.netns, sa(v4, port)),
        ],
        tag,
    );
    assert!(
        failures.is_empty(),
        "host port {port} ({tag}):\n{}",
        failures.join("\n")
    );
}

/// The masquerading pod reaches `ext`, which has no route to the pods, over TCP and UDP in
/// both families, seen from the node's address and a port of the masquerade range.
fn masquerades(pod: &Named, ext: &ExternalHost) {
    for node_addr in [IpAddr::V4(ext.node_v4), IpAddr::V6(ext.node_v6)] {
        let dst = ext.addr_like(node_addr);
        for (proto, echo) in [
            ("TCP", tcp_echo(&pod.netns, ext.netns(), dst, 0)),
            ("UDP", udp_echo(&pod.netns, ext.netns(), dst, 0)),
        ] {
            let echo = echo.unwrap_or_else(|e| panic!("{proto} {} -> {dst}: {e:#}", pod.what));
            assert_eq!(echo.client_addr.ip(), node_addr, "{proto} source at {dst}");
            assert!(
                MASQ_PORTS.contains(&echo.client_addr.port()),
                "{proto} source port at {dst}: {echo:?}"
            );
        }
    }
}

/// UDP at twice the limit towards the limited pod (from `from`) and from it: about the
/// direction's limit arrives each way (the bandwidth suite's tolerance).
fn limited(from: &Named, pod: &Named) {
    for (what, limit, client, server, addr) in [
        ("towards", INGRESS_BPS, &from.netns, &pod.netns, pod.v4()),
        ("from", EGRESS_BPS, &pod.netns, &from.netns, from.v4()),
    ] {
        let got = iperf(
            client,
            server,
            addr,
            &["-u", "-b", &format!("{}", 2 * limit)],
        );
        let limit = limit as f64;
        assert!(
            (floor(0.75, 0.05) * limit..=1.25 * limit).contains(&got),
            "UDP {what} {} at twice its limit of {limit:.0} bit/s: {got:.0} bit/s arrived",
            pod.what
        );
    }
}

/// A TCP connection from `pod` to `ext` (masqueraded), kept open across the upgrade.
struct Conn {
    client: TcpStream,
    server: TcpStream,
    seen_as: SocketAddr,
}

impl Conn {
    fn open(pod: &Named, ext: &ExternalHost) -> Self {
        let at = SocketAddr::new(IpAddr::V4(ext.v4), 7007);
        let listener = ext
            .netns()
            .run_in(|| TcpListener::bind(at))
            .unwrap()
            .unwrap();
        let client = pod
            .netns
            .run_in(|| TcpStream::connect_timeout(&at, Duration::from_secs(3)))
            .unwrap()
            .unwrap_or_else(|e| panic!("TCP {} -> {at}: {e}", pod.what));
        let (server, seen_as) = listener.accept().unwrap();
        for s in [&client, &server] {
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        }
        let conn = Self {
            client,
            server,
            seen_as,
        };
        conn.round_trip("before the upgrade");
        conn
    }

    /// One message each way; the server still sees the same peer.
    fn round_trip(&self, when: &str) {
        let (mut c, mut s) = (&self.client, &self.server);
        let mut buf = [0u8; 4];
        c.write_all(b"ping").unwrap();
        s.read_exact(&mut buf)
            .unwrap_or_else(|e| panic!("{when}: the open connection's request: {e}"));
        s.write_all(b"pong").unwrap();
        c.read_exact(&mut buf)
            .unwrap_or_else(|e| panic!("{when}: the open connection's answer: {e}"));
        assert_eq!(&buf, b"pong", "{when}");
        assert_eq!(self.server.peer_addr().unwrap(), self.seen_as, "{when}");
    }
}

/// inspect's attachment of `pod`.
fn inspected<'a>(report: &'a Value, pod: &Named) -> &'a Value {
    dp::inspect_attachment(report, &pod.att.container_id)
        .unwrap_or_else(|| panic!("inspect lists {}: {report:#}", pod.what))
}

#[test]
fn a_node_attached_by_the_previous_release_keeps_working_after_the_upgrade() {
    require_root();
    let old = PluginUnderTest::previous_ebpf_cni();
    let new = PluginUnderTest::ebpf_cni();
    assert_ne!(
        old.bin.canonicalize().unwrap(),
        new.bin.canonicalize().unwrap(),
        "the previous and the current build are the same file: the test would check nothing"
    );
    let node = Node::new().unwrap();
    // Knows only its own link, like a host beyond the node: masquerade's and host ports'
    // replies must come back to the node's address.
    let ext = ExternalHost::attach(node.netns(), "up0", 91).unwrap();
    for family in ["-4", "-6"] {
        ext.netns()
            .ip_ok(&[family, "route", "del", "default"])
            .unwrap();
    }
    let before = node.snapshot(None);
    let reserved_before = node.reserved_ports();
    let plain = list(&old, &node, false);
    let masq = list(&old, &node, true);
    // TCX links where the kernel has them (6.6+), else netlink filters as the default.
    let tcx = list_in(
        &old,
        &node,
        false,
        Some(if bpf::kernel_has_tcx() {
            "tcx"
        } else {
            "netlink"
        }),
    );
    let limit = json!({"ingressRate": INGRESS_BPS, "ingressBurst": 4294967295u64,
                       "egressRate": EGRESS_BPS, "egressBurst": 4294967295u64});
    let mapping = |port: u16| {
        json!([{"hostPort": port, "containerPort": 80, "protocol": "tcp"},
               {"hostPort": port, "containerPort": 80, "protocol": "udp"}])
    };

    // The previous release attaches every kind of pod.
    let a = add(&old, &node, &plain, "old plain pod", &[]);
    let b = add(
        &old,
        &node,
        &plain,
        "old pod with host port 8080",
        &[("portMappings", mapping(8080))],
    );
    let c = add(
        &old,
        &node,
        &plain,
        "old limited pod",
        &[("bandwidth", limit.clone())],
    );
    let d = add(&old, &node, &masq, "old masquerading pod", &[]);
    let g = add(&old, &node, &tcx, "old pod in tcx mode", &[]);
    let _b_server = PodServer::start(&b.netns, 80, "old-b");
    // Control: the checks below pass on the previous release's own node.
    pods_talk(&a, &b);
    host_port_serves(&ext, &a, 8080, "old-b");
    masquerades(&d, &ext);
    let conn = Conn::open(&d, &ext);

    // The binary is replaced: the current build CHECKs the old pods and ADDs new ones.
    for (pod, l) in [
        (&a, &plain),
        (&b, &plain),
        (&c, &plain),
        (&d, &masq),
        (&g, &tcx),
    ] {
        check(&new, &node, l, pod, "current");
    }
    let e = add(
        &new,
        &node,
        &plain,
        "new pod with host port 8081",
        &[("portMappings", mapping(8081))],
    );
    let f = add(
        &new,
        &node,
        &plain,
        "new limited pod with host port 8082",
        &[
            ("portMappings", mapping(8082)),
            ("bandwidth", limit.clone()),
        ],
    );
    let _e_server = PodServer::start(&e.netns, 80, "new-e");
    check(&new, &node, &plain, &e, "current");
    check(&new, &node, &plain, &f, "current");

    // Everything works as configured, old and new side by side.
    conn.round_trip("after the current build's ADDs");
    pods_talk(&a, &b);
    pods_talk(&a, &e);
    pods_talk(&b, &e);
    pods_talk(&d, &e);
    pods_talk(&g, &e);
    host_port_serves(&ext, &e, 8080, "old-b");
    host_port_serves(&ext, &a, 8081, "new-e");
    masquerades(&d, &ext);
    limited(&a, &c);

    // inspect (current) reads the old node, and reads back what each pod was given.
    let report = dp::inspect(&new.bin, &node).unwrap();
    for pod in [&a, &b, &c, &d, &e, &f, &g] {
        inspected(&report, pod);
    }
    for pod in [&c, &f] {
        let att = inspected(&report, pod);
        for (dir, bps) in [("ingress_limit", INGRESS_BPS), ("egress_limit", EGRESS_BPS)] {
            assert_eq!(
                att[dir]["rate_bytes"],
                json!(bps / 8),
                "{} {dir}: {att}",
                pod.what
            );
        }
    }
    assert!(
        inspected(&report, &a)["ingress_limit"].is_null(),
        "{report:#}"
    );
    let maps = report["port_mappings"].as_array().expect("port_mappings");
    for (port, pod) in [(8080, &b), (8081, &e), (8082, &f)] {
        let host = format!("0.0.0.0:{port}/tcp");
        let m = maps
            .iter()
            .find(|m| m["host"] == host)
            .unwrap_or_else(|| panic!("inspect lists {host}: {report:#}"));
        assert_eq!(m["pod"], format!("{}:80", pod.v4()), "{m}");
    }
    assert_eq!(maps.len(), 12, "3 pods x tcp+udp x v4+v6: {report:#}");
    let m = &report["masquerade"];
    assert_eq!(m["enabled"], json!(true), "{m}");
    assert!(
        d.ips()
            .iter()
            .all(|ip| m["flows_by_pod"][ip.to_string()].as_u64().unwrap_or(0) > 0),
        "the masquerading pod's flows: {m}"
    );

    // The source check: the previous release's pods have no allow-list and run its
    // programs, so they keep their behaviour until their next ADD; the current build's pods
    // are checked from their ADD on.
    for pod in [&a, &b, &c, &d, &g] {
        assert_eq!(
            inspected(&report, pod)["source_check"]["mode"],
            "unchecked",
            "{}",
            pod.what
        );
    }
    for pod in [&e, &f] {
        assert_eq!(
            inspected(&report, pod)["source_check"]["mode"],
            "on",
            "{}",
            pod.what
        );
    }
    for (pod, made_up) in [(&a, "198.51.100.21"), (&e, "198.51.100.22")] {
        pod.netns
            .ip_ok(&["addr", "add", &format!("{made_up}/32"), "dev", "eth0"])
            .unwrap();
    }
    assert_udp_arrives(&a.netns, "198.51.100.21".parse().unwrap(), &b.netns, b.v4());
    assert_udp_blocked(
        &e.netns,
        "198.51.100.22".parse().unwrap(),
        &b.netns,
        b.v4(),
        Duration::from_millis(1500),
    );

    // A rollback: the previous build CHECKs and DELs pods the current one ADDed. Not CHECK
    // of the limited one: 167c4dc's CHECK expects no TCP pacing unless its own revision of
    // the programs is pinned (fixed since, `Programs::pacing_available`); check `f` too once
    // PREVIOUS_RELEASE has the fix.
    check(&old, &node, &plain, &e, "previous");
    del(&old, &node, &plain, &f, "previous");
    // The previous build knows no lease records: its DEL leaves `f`'s behind (links to the
    // lease files it unlinked). The current build drops them at its next release.
    let records = node.data_dir().join(NETWORK).join("ebpf-cni");
    for ip in f.ips() {
        assert!(
            records.join(ip.to_string()).exists(),
            "the rollback's DEL was expected to leave the record of {ip}"
        );
    }

    // The current build DELs every other pod; the node is left as it was.
    drop(conn);
    for (pod, l) in [
        (&a, &plain),
        (&b, &plain),
        (&c, &plain),
        (&d, &masq),
        (&e, &plain),
        (&g, &tcx),
    ] {
        del(&new, &node, l, pod, "current");
    }
    assert_node_clean(&node, "after the last DEL");
    let after = node.snapshot(None);
    assert_eq!(after.node_links, before.node_links, "links left");
    assert_eq!(after.node_addrs, before.node_addrs, "addresses left");
    assert_eq!(after.node_routes, before.node_routes, "routes left");
    assert!(
        node.leases(NETWORK).is_empty(),
        "{:?}",
        node.leases(NETWORK)
    );
    // Nothing of ebpf-cni's is left in the network's IPAM directory, the rollback's records
    // included: only what the reference host-local leaves (its lock and round robin).
    let files = ebpf_cni_tests::fsutil::list_files(&node.data_dir().join(NETWORK)).unwrap();
    assert!(
        files.iter().all(|f| f == std::path::Path::new("lock")
            || f.to_string_lossy().starts_with("last_reserved_ip.")),
        "files left in the network's directory: {files:?}"
    );
    assert_eq!(
        node.reserved_ports(),
        reserved_before,
        "reserved ports left"
    );
}
