//! Host ports against the real kernel: `runtimeConfig.portMappings` (CNI conventions, "Port
//! mappings" capability) served by ebpf-cni's programs — TC DNAT and reverse NAT for
//! traffic arriving on node devices and from pods, socket-address programs for the node's
//! own connections — with no iptables or nftables rule.
//!
//! Every path to a host port sends real traffic to a server in the pod that answers with
//! its own tag and the peer address it saw, and every client checks the reply came from the
//! address it dialled (TCP: the connection's peer; UDP: the datagram's source).

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::Duration;

use anyhow::Result;

use ebpf_cni_tests::config::Stack;
use ebpf_cni_tests::dataplane as dp;
use ebpf_cni_tests::external::ExternalHost;
use ebpf_cni_tests::host_ports::{ask_each, ruleset, sa, tag_of, tcp_ask, udp_ask_from, PodServer};
use ebpf_cni_tests::net::udp_error_after_send;
use ebpf_cni_tests::{
    bpf, require_root, unique_container_id, Attachment, CniCommand, NetConfList, Netns, Node,
    PluginUnderTest, Pod,
};
use serde_json::{json, Value};

fn list(p: &PluginUnderTest, node: &Node) -> NetConfList {
    let mut conf = p.conf("1.0.0", node, Stack::Dual);
    conf["capabilities"] = json!({"portMappings": true});
    NetConfList::single(&conf)
}

fn attachment(netns: &Netns, mappings: Value) -> Attachment {
    Attachment::new(&unique_container_id(), netns.path(), "eth0")
        .with_capability("portMappings", mappings)
}

/// A dual-stack pod with `mappings` as its `portMappings`.
fn add(p: &PluginUnderTest, node: &Node, l: &NetConfList, mappings: Value) -> Pod {
    Pod::add_with(p, node, l, Stack::Dual, |att| {
        att.with_capability("portMappings", mappings)
    })
}

/// Every path to a host port (numbered below: from outside the node, from the node itself,
/// from another pod, hairpin), TCP and UDP, IPv4 and IPv6; the re-add is its own test.
#[test]
fn every_path_reaches_the_pod_and_replies_come_from_the_dialled_address() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "uplink0", 31).unwrap();
    let l = list(&p, &node);
    let before = ruleset(&node);
    // containerd's Capitalized keys for the UDP entry, camelCase for TCP.
    let a = add(
        &p,
        &node,
        &l,
        json!([
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": ""},
            {"HostPort": 8080, "ContainerPort": 80, "Protocol": "udp", "HostIP": ""}
        ]),
    );
    let b = add(&p, &node, &l, json!([]));
    let _server = PodServer::start(&a.netns, 80, "podA");
    assert_eq!(
        before,
        ruleset(&node),
        "host ports create no iptables/nftables rule"
    );

    let node4: IpAddr = ext.node_v4.into();
    let node6: IpAddr = ext.node_v6.into();
    let cases: Vec<(&str, &Netns, SocketAddr)> = vec![
        // 1. A client outside the node, through a node device, to node addresses.
        ("external -> node IPv4", ext.netns(), sa(node4, 8080)),
        ("external -> node IPv6", ext.netns(), sa(node6, 8080)),
        // 2. The node itself: loopback and its own addresses.
        (
            "node -> 127.0.0.1",
            node.netns(),
            sa(Ipv4Addr::LOCALHOST, 8080),
        ),
        ("node -> ::1", node.netns(), sa(Ipv6Addr::LOCALHOST, 8080)),
        ("node -> node IPv4", node.netns(), sa(node4, 8080)),
        ("node -> node IPv6", node.netns(), sa(node6, 8080)),
        // 3. Another pod on the node.
        ("pod B -> node IPv4", &b.netns, sa(node4, 8080)),
        ("pod B -> node IPv6", &b.netns, sa(node6, 8080)),
        // 4. Hairpin: the pod to its own host port.
        ("hairpin IPv4", &a.netns, sa(node4, 8080)),
        ("hairpin IPv6", &a.netns, sa(node6, 8080)),
    ];
    // 2. is served on every kernel: before 5.14 (no SO_NETNS_COOKIE) the socket programs
    // learn the node's namespace through a probe of their own.
    let failures = ask_each(&cases, "podA");
    assert!(
        failures.is_empty(),
        "paths through hostPort 8080 failed:\n{}",
        failures.join("\n")
    );

    // The pod sees real clients (no masquerade) except for the hairpin, whose source must
    // be rewritten for the pod's stack to accept it.
    let ans = tcp_ask(ext.netns(), sa(node4, 8080)).unwrap();
    assert!(
        ans.starts_with(&format!("podA {}:", ext.v4)),
        "the pod must see the external client's own address: {ans}"
    );
    let ans = tcp_ask(&b.netns, sa(node4, 8080)).unwrap();
    assert!(
        ans.starts_with(&format!("podA {}:", b.v4())),
        "the pod must see pod B's address: {ans}"
    );

    // Per-mapping hit counters in inspect: TC packets and socket-level translations.
    let report = dp::inspect(&p.bin, &node).unwrap();
    let maps = report["port_mappings"].as_array().expect("port_mappings");
    let tcp4 = maps
        .iter()
        .find(|m| m["host"] == "0.0.0.0:8080/tcp")
        .unwrap_or_else(|| panic!("inspect lists 0.0.0.0:8080/tcp: {report:#}"));
    assert_eq!(tcp4["pod"], format!("{}:80", a.v4()));
    assert!(tcp4["packets"].as_u64().unwrap() > 0, "{tcp4}");
    assert!(tcp4["socket"].as_u64().unwrap() > 0, "{tcp4}");
    assert_eq!(maps.len(), 4, "tcp+udp x v4+v6: {report:#}");
    assert_eq!(
        before,
        ruleset(&node),
        "still no netfilter rule after traffic"
    );
}

/// The socket programs are attached machine-wide but act only in the node's namespace:
/// another namespace's own 127.0.0.1:8080 stays its own.
#[test]
fn socket_translation_is_scoped_to_the_node_namespace() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let l = list(&p, &node);
    let a = add(
        &p,
        &node,
        &l,
        json!([{"hostPort": 8081, "containerPort": 80}]),
    );
    let _server = PodServer::start(&a.netns, 80, "podA");
    assert_eq!(
        tag_of(&tcp_ask(node.netns(), sa(Ipv4Addr::LOCALHOST, 8081)).unwrap()),
        "podA",
        "control: the node's own 127.0.0.1:8081 reaches the pod"
    );
    let other = node.new_pod().unwrap();
    let _local = PodServer::start(&other, 8081, "local");
    assert_eq!(
        tag_of(&tcp_ask(&other, sa(Ipv4Addr::LOCALHOST, 8081)).unwrap()),
        "local",
        "another namespace's 127.0.0.1:8081 must not be redirected to the node's pod"
    );
}

/// Two nodes on one machine, each with a pod on host port 8082: both nodes' socket programs
/// run for every socket of the machine (one cgroup v2 root), yet each node's own
/// `127.0.0.1:8082` and `[::1]:8082` reach its own pod, never the other node's. On a kernel
/// without `SO_NETNS_COOKIE` (before 5.14) this is what proves each node learned its own
/// namespace's cookie from its probe: a cookie learned from the wrong namespace would send
/// one node's connections to the other's pod, or leave them untranslated (refused).
#[test]
fn each_node_of_a_machine_reaches_its_own_pod_through_loopback() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let nodes = [Node::new().unwrap(), Node::new().unwrap()];
    let mut keep = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let l = list(&p, node);
        let pod = add(
            &p,
            node,
            &l,
            json!([{"hostPort": 8082, "containerPort": 80}]),
        );
        let server = PodServer::start(&pod.netns, 80, &format!("pod{i}"));
        keep.push((server, pod));
    }
    for (i, node) in nodes.iter().enumerate() {
        for to in [sa(Ipv4Addr::LOCALHOST, 8082), sa(Ipv6Addr::LOCALHOST, 8082)] {
            let got = tcp_ask(node.netns(), to);
            assert_eq!(
                got.as_deref().map(tag_of).ok(),
                Some(format!("pod{i}").as_str()),
                "node {i}'s own connection to {to}: {got:?}"
            );
        }
    }
}

/// A mapping on one host address answers there only.
#[test]
fn a_specific_host_ip_answers_only_on_that_address() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "uplink0", 32).unwrap();
    let ext2 = ExternalHost::attach(node.netns(), "uplink1", 33).unwrap();
    let l = list(&p, &node);
    let a = add(
        &p,
        &node,
        &l,
        json!([{"hostPort": 9090, "containerPort": 80, "hostIP": ext.node_v4.to_string()}]),
    );
    let _server = PodServer::start(&a.netns, 80, "podA");
    assert_eq!(
        tag_of(&tcp_ask(ext.netns(), sa(ext.node_v4, 9090)).unwrap()),
        "podA"
    );
    let other = tcp_ask(ext2.netns(), sa(ext2.node_v4, 9090));
    assert!(
        other.is_err(),
        "hostIP {} must not answer on {}: {other:?}",
        ext.node_v4,
        ext2.node_v4
    );
    assert!(
        tcp_ask(node.netns(), sa(Ipv4Addr::LOCALHOST, 9090)).is_err(),
        "a specific hostIP does not answer on loopback"
    );
}

/// Re-add: a long UDP flow keeps its translation, and when the pod is deleted and re-added
/// with a new address the same client flow reaches the new pod at once.
#[test]
fn udp_flow_survives_and_follows_a_readded_pod() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "uplink0", 34).unwrap();
    let l = list(&p, &node);
    let mappings = json!([{"hostPort": 5353, "containerPort": 53, "protocol": "udp"}]);
    let target = sa(ext.node_v4, 5353);
    let a = add(&p, &node, &l, mappings.clone());
    let server_a = PodServer::start(&a.netns, 53, "old");
    let (answers, sent) = ext
        .netns()
        .run_in(|| -> Result<(Vec<String>, usize)> {
            let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 40000))?;
            s.set_read_timeout(Some(Duration::from_millis(500)))?;
            let mut got = Vec::new();
            let mut buf = [0u8; 512];
            // A long transfer: 2,000 request/answer rounds on one flow.
            let n = 2000;
            for i in 0..n {
                // Nothing through the host port at all: fail now, not after n timeouts.
                if i == 20 && got.is_empty() {
                    break;
                }
                s.send_to(&[0u8; 1200], target)?;
                if let Ok((len, src)) = s.recv_from(&mut buf) {
                    if src == target {
                        got.push(String::from_utf8_lossy(&buf[..len]).into_owned());
                    }
                }
            }
            Ok((got, n))
        })
        .unwrap()
        .unwrap();
    assert!(
        answers.len() >= sent * 99 / 100 && answers.iter().all(|a| tag_of(a) == "old"),
        "a long UDP flow through the host port: {} of {sent} answered",
        answers.len()
    );
    drop(server_a);
    p.runtime.del(&node, &l, &a.att, Some(&a.result)).unwrap();
    // Hold the old address so the new pod gets another one.
    let hold = add(&p, &node, &l, json!([]));
    let b = add(&p, &node, &l, mappings);
    assert_ne!(a.v4(), b.v4(), "the re-added pod has a new address");
    let _server_b = PodServer::start(&b.netns, 53, "new");
    // The very same client flow (source port 40000), right away.
    let ans = udp_ask_from(ext.netns(), sa(Ipv4Addr::UNSPECIFIED, 40000), target).unwrap();
    assert_eq!(
        tag_of(&ans),
        "new",
        "the old flow must reach the re-added pod at once (no stale translation)"
    );
    let _ = hold;
}

/// Path MTU discovery through a host port: a client beyond a router whose link to it
/// carries 1280 bytes downloads from the pod, whose full-size replies (from the node's
/// address and host port) meet that router. Its "fragmentation needed" (IPv4) or "packet
/// too big" (IPv6) goes to the node's address and quotes the reply as it left; translated
/// back (quoted source and port become the pod's, as the reference plugin's conntrack
/// does) it reaches the pod's stack, which lowers its segments and the transfer completes.
/// Untranslated, the error finds no socket on the node: a black hole, and the client's read
/// times out.
#[test]
fn fragmentation_needed_about_a_host_port_reply_reaches_the_pod() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "uplink0", 36).unwrap();
    let far = ext.far_host(node.netns(), 1280).unwrap();
    let (far4, far6) = (IpAddr::V4(far.v4), IpAddr::V6(far.v6.unwrap()));
    let far = far.netns;
    let l = list(&p, &node);
    let a = add(
        &p,
        &node,
        &l,
        json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]),
    );
    const SIZE: usize = 2 << 20;
    let listener = a
        .netns
        .run_in(|| std::net::TcpListener::bind((Ipv6Addr::UNSPECIFIED, 80)))
        .unwrap()
        .unwrap();
    // Each connection gets SIZE bytes, then the end of the stream.
    let server = std::thread::spawn(move || {
        use std::io::Write;
        for _ in 0..2 {
            let (mut c, _) = listener.accept().unwrap();
            c.set_write_timeout(Some(Duration::from_secs(15))).unwrap();
            let sent = c.write_all(&vec![7u8; SIZE]);
            let _ = c.shutdown(std::net::Shutdown::Write);
            sent.unwrap_or_else(|e| panic!("the pod's write: {e}"));
        }
    });
    for (node_addr, far_addr) in [
        (IpAddr::V4(ext.node_v4), far4),
        (IpAddr::V6(ext.node_v6), far6),
    ] {
        let got = far
            .run_in(|| -> std::io::Result<usize> {
                use std::io::Read;
                let mut c = std::net::TcpStream::connect_timeout(
                    &sa(node_addr, 8080),
                    Duration::from_secs(3),
                )?;
                c.set_read_timeout(Some(Duration::from_secs(15)))?;
                let mut buf = Vec::with_capacity(SIZE);
                c.read_to_end(&mut buf)?;
                Ok(buf.len())
            })
            .unwrap();
        let got = got.unwrap_or_else(|e| panic!("the far host's download from {node_addr}: {e}"));
        assert_eq!(got, SIZE, "bytes the far host got through {node_addr}:8080");
        // The pod's stack learnt the path's MTU from the translated error.
        let route = a
            .netns
            .exec(&["ip", "route", "get", &far_addr.to_string()])
            .unwrap();
        let route = String::from_utf8_lossy(&route.stdout);
        assert!(
            route.contains("mtu 1280"),
            "the pod's route cache to {far_addr}: {route}"
        );
    }
    server.join().unwrap();
    let report = dp::inspect(&p.bin, &node).unwrap();
    assert!(
        report["port_mappings"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["packets"].as_u64().unwrap() > 0),
        "{report:#}"
    );
    p.runtime.del(&node, &l, &a.att, Some(&a.result)).unwrap();
}

/// The pod's own ICMP errors about a packet that came through a host port leave as the
/// client expects them: from the address it dialled, quoting its packet to the host port.
/// Nothing listens on the UDP container port, so the pod answers "port unreachable", which
/// must fail the client's connected socket (ECONNREFUSED), over IPv4 and IPv6.
#[test]
fn a_pods_port_unreachable_reaches_the_host_port_client() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "uplink0", 37).unwrap();
    let l = list(&p, &node);
    let a = add(
        &p,
        &node,
        &l,
        json!([{"hostPort": 5354, "containerPort": 54, "protocol": "udp"}]),
    );
    for node_addr in [IpAddr::V4(ext.node_v4), IpAddr::V6(ext.node_v6)] {
        let err = ext
            .netns()
            .run_in(|| -> std::io::Error {
                let unspecified: IpAddr = if node_addr.is_ipv4() {
                    Ipv4Addr::UNSPECIFIED.into()
                } else {
                    Ipv6Addr::UNSPECIFIED.into()
                };
                let s = UdpSocket::bind((unspecified, 0)).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                s.connect(sa(node_addr, 5354)).unwrap();
                udp_error_after_send(&s, b"anyone?")
            })
            .unwrap();
        assert_eq!(
            err.kind(),
            std::io::ErrorKind::ConnectionRefused,
            "the client of {node_addr}:5354: {err}"
        );
    }
    p.runtime.del(&node, &l, &a.att, Some(&a.result)).unwrap();
}

/// UDP datagrams larger than the path MTU through a host port, both ways, IPv4 and IPv6: a
/// client sends the pod 4,000 bytes (its stack cuts them into fragments) and the pod gets
/// them whole, from the client; the pod answers 6,000 bytes (its stack cuts them too) and
/// the client gets them whole, from the address and port it dialled. Only each datagram's
/// first fragment carries the ports: the later ones are translated by the record it left.
/// (Before, the client's fragments went to the node's stack, which found no socket on the
/// host port, and the pod's later fragments left with the pod's address.)
#[test]
fn datagrams_in_fragments_cross_a_host_port_both_ways() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "uplink0", 38).unwrap();
    // The client's link carries what the pod's does, so its fragments fit the pod's device:
    // 5.10's `bpf_redirect_peer` drops a packet longer than the receiving device's MTU.
    let mtu = ebpf_cni_tests::config::MTU.to_string();
    ext.netns()
        .ip_ok(&["link", "set", ext.host_dev(), "mtu", &mtu])
        .unwrap();
    let l = list(&p, &node);
    let a = add(
        &p,
        &node,
        &l,
        json!([{"hostPort": 5355, "containerPort": 53, "protocol": "udp"}]),
    );
    let pod = a
        .netns
        .run_in(|| UdpSocket::bind((Ipv6Addr::UNSPECIFIED, 53)))
        .unwrap()
        .unwrap();
    let clients = [
        (IpAddr::V4(ext.v4), IpAddr::V4(ext.node_v4), "0.0.0.0:0"),
        (IpAddr::V6(ext.v6), IpAddr::V6(ext.node_v6), "[::]:0"),
    ];
    let mut buf = vec![0u8; 65_536];
    for (client_addr, node_addr, any) in clients {
        let client = ext
            .netns()
            .run_in(|| UdpSocket::bind(any))
            .unwrap()
            .unwrap();
        for s in [&client, &pod] {
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        }
        let target = sa(node_addr, 5355);
        for round in 0..3 {
            let out: Vec<u8> = (0..4000).map(|i| ((i + round) % 251) as u8).collect();
            client.send_to(&out, target).unwrap();
            let (n, from) = pod.recv_from(&mut buf).unwrap_or_else(|e| {
                panic!("{target}, round {round}: the client's datagram, whole: {e}")
            });
            assert_eq!(
                (n, ebpf_cni_tests::host_ports::unmap(from).ip()),
                (4000, client_addr),
                "{target}, round {round}"
            );
            assert!(
                buf[..n] == out[..],
                "{target}, round {round}: the client's bytes"
            );

            let back: Vec<u8> = (0..6000).map(|i| ((i + round) % 239) as u8).collect();
            pod.send_to(&back, from).unwrap();
            let (n, src) = client.recv_from(&mut buf).unwrap_or_else(|e| {
                panic!("{target}, round {round}: the pod's answer, whole: {e}")
            });
            assert_eq!((n, src), (6000, target), "{target}, round {round}");
            assert!(
                buf[..n] == back[..],
                "{target}, round {round}: the pod's bytes"
            );
        }
    }
    p.runtime.del(&node, &l, &a.att, Some(&a.result)).unwrap();
}

/// A host port already mapped to another pod is refused with a clear error (code 108), and
/// the refused ADD leaves nothing behind; another protocol on the same port is fine.
#[test]
fn a_colliding_host_port_is_refused_and_rolled_back() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let l = list(&p, &node);
    let _a = add(
        &p,
        &node,
        &l,
        json!([{"hostPort": 8080, "containerPort": 80}]),
    );
    let files_before = node.data_dir_files();
    let netns = node.new_pod().unwrap();
    let att = attachment(&netns, json!([{"hostPort": 8080, "containerPort": 8080}]));
    let err = p.runtime.add(&node, &l, &att).unwrap_err();
    let out = err.output().expect("the plugin ran").clone();
    let j = out.json.clone().unwrap_or_default();
    assert_eq!(j["code"], 108, "{}", out.describe());
    let msg = j["msg"].as_str().unwrap_or_default();
    assert!(
        msg.contains("0.0.0.0:8080/tcp") && msg.contains("already mapped"),
        "the error names the host port: {msg}"
    );
    assert_eq!(
        node.data_dir_files(),
        files_before,
        "the refused ADD released its lease"
    );
    let links = ebpf_cni_tests::kernel::links(node.netns()).unwrap();
    assert_eq!(
        links
            .iter()
            .filter(|l| l.ifname.starts_with("ecni"))
            .count(),
        1,
        "the refused ADD removed its veth: {links:?}"
    );
    let same_port_udp = attachment(
        &netns,
        json!([{"hostPort": 8080, "containerPort": 80, "protocol": "udp"}]),
    );
    p.runtime
        .add(&node, &l, &same_port_udp)
        .expect("udp 8080 is free");
}

/// A host port whose pod's veth is gone without a DEL (a runtime that crashed and removed
/// the namespace) is stale: the next pod that asks for it gets it and is reached through
/// it. (nix's if_indextoname took "no such interface" for a name, "": the port stayed
/// "already mapped" to the vanished pod, error 108.)
#[test]
fn a_host_port_whose_pods_veth_is_gone_goes_to_the_next_pod() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let l = list(&p, &node);
    let gone = add(
        &p,
        &node,
        &l,
        json!([{"hostPort": 8080, "containerPort": 80}]),
    );
    let out = node
        .netns()
        .exec(&["ip", "link", "del", &gone.r.host_ifname])
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let next = add(
        &p,
        &node,
        &l,
        json!([{"hostPort": 8080, "containerPort": 80}]),
    );
    let _server = PodServer::start(&next.netns, 80, "next");
    let target = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 8080);
    assert_eq!(tag_of(&tcp_ask(node.netns(), target).unwrap()), "next");
    p.runtime
        .check(&node, &l, &next.att, &next.result)
        .expect("CHECK of the pod that took the port");
    // The vanished pod's DEL still comes, late, and leaves the new owner's port alone.
    p.runtime
        .del(&node, &l, &gone.att, Some(&gone.result))
        .expect("DEL of the vanished pod");
    assert_eq!(tag_of(&tcp_ask(node.netns(), target).unwrap()), "next");
}

/// Invalid entries get error 7 naming the entry, before anything is created.
#[test]
fn invalid_entries_get_error_7_naming_the_entry() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let l = list(&p, &node);
    for (pm, needle) in [
        (
            json!([{"hostPort": 0, "containerPort": 80}]),
            "portMappings[0]",
        ),
        (json!([{"hostPort": 70000, "containerPort": 80}]), "70000"),
        (
            json!([{"hostPort": 80, "containerPort": 80, "protocol": "icmp"}]),
            "icmp",
        ),
        (
            json!([{"hostPort": 80, "containerPort": 80, "hostIP": "10.0.0.300"}]),
            "10.0.0.300",
        ),
    ] {
        let netns = node.new_pod().unwrap();
        let err = p
            .runtime
            .add(&node, &l, &attachment(&netns, pm.clone()))
            .unwrap_err();
        let out = err.output().expect("the plugin ran");
        let j = out.json.clone().unwrap_or_default();
        assert_eq!(j["code"], 7, "{pm}: {}", out.describe());
        assert!(
            j["msg"].as_str().unwrap_or_default().contains(needle),
            "{pm}: the message names the entry: {j}"
        );
        assert!(node.data_dir_files().is_empty(), "{pm}: no lease taken");
    }
}

/// DEL without `portMappings` still removes the pod's mappings (its pinned port list is
/// the source of truth); CHECK fails when a mapping is missing or points elsewhere.
#[test]
fn del_without_port_mappings_cleans_up_and_check_sees_tampering() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let l = list(&p, &node);
    let keep = add(
        &p,
        &node,
        &l,
        json!([{"hostPort": 7000, "containerPort": 70}]),
    );
    let a = add(
        &p,
        &node,
        &l,
        json!([{"hostPort": 8080, "containerPort": 80}, {"hostPort": 8443, "containerPort": 443}]),
    );
    p.runtime
        .check(&node, &l, &a.att, &a.result)
        .expect("CHECK of a fresh pod");
    let entries = dp::port_mappings(&node).unwrap();
    let mine: Vec<_> = entries
        .iter()
        .filter(|e| e.pod == a.v4() || e.pod == a.v6())
        .collect();
    assert_eq!(mine.len(), 4, "two ports x two families: {entries:?}");

    // CHECK's error once the state is damaged.
    let check_err = || {
        p.runtime
            .check(&node, &l, &a.att, &a.result)
            .unwrap_err()
            .to_string()
    };

    // Missing.
    let victim = mine
        .iter()
        .find(|e| e.host_port == 8443 && e.pod == a.v4())
        .unwrap();
    dp::delete_raw(&node, dp::PORTMAP_MAP, &victim.raw_key).unwrap();
    let msg = check_err();
    assert!(
        msg.contains("0.0.0.0:8443/tcp") && msg.contains("missing"),
        "CHECK names the missing mapping: {msg}"
    );
    dp::update_raw(&node, dp::PORTMAP_MAP, &victim.raw_key, &victim.raw_value).unwrap();
    p.runtime
        .check(&node, &l, &a.att, &a.result)
        .expect("restored");

    // Points elsewhere: the other pod's address.
    let mut wrong = victim.raw_value.clone();
    let keep_key = dp::endpoint_key(keep.v4());
    wrong[8..24].copy_from_slice(&keep_key);
    dp::update_raw(&node, dp::PORTMAP_MAP, &victim.raw_key, &wrong).unwrap();
    let msg = check_err();
    assert!(
        msg.contains("0.0.0.0:8443/tcp") && msg.contains("points to"),
        "CHECK names the misdirected mapping: {msg}"
    );
    dp::update_raw(&node, dp::PORTMAP_MAP, &victim.raw_key, &victim.raw_value).unwrap();

    // The pod's counters let its program skip the host port replies' lookup only where
    // no host port leads to it: ADD left that flag off here (on for a pod without ports,
    // see the bandwidth suite; the pod has no egress limit, which its counters say), and
    // CHECK refuses it on.
    let ifindex = bpf::ifindex_in(
        node.netns(),
        a.result["interfaces"][0]["name"].as_str().unwrap(),
    )
    .unwrap();
    let flags = dp::pod_counter_flags(&node).unwrap();
    let no_egress = ebpf_cni_maps::COUNTERS_NO_EGRESS_LIMIT;
    assert!(
        flags[&ifindex].iter().all(|(from, _)| *from == no_egress),
        "the counters of a pod with host ports: {flags:?}"
    );
    dp::set_pod_counter_flags(
        &node,
        ifindex,
        ebpf_cni_maps::COUNTERS_NO_HOST_PORTS | no_egress,
        0,
    )
    .unwrap();
    let msg = check_err();
    assert!(
        msg.contains(&format!("counters of host veth ifindex {ifindex}"))
            && msg.contains("no host port"),
        "CHECK names the counters: {msg}"
    );
    dp::set_pod_counter_flags(&node, ifindex, 0, 0).unwrap();
    p.runtime
        .check(&node, &l, &a.att, &a.result)
        .expect("the counters as an earlier release wrote them");

    // DEL as a runtime that lost the capability args (and the cached result).
    let bare = Attachment::new(&a.att.container_id, a.netns.path(), "eth0");
    p.runtime.del(&node, &l, &bare, None).unwrap();
    let left = dp::port_mappings(&node).unwrap();
    assert!(
        left.iter()
            .all(|e| e.pod == keep.v4() || e.pod == keep.v6())
            && left.len() == 2,
        "DEL without portMappings removes exactly the pod's mappings: {left:?}"
    );
    p.runtime
        .del(&node, &l, &bare, None)
        .expect("DEL again is fine");
    // The ports are free again.
    let c = add(
        &p,
        &node,
        &l,
        json!([{"hostPort": 8080, "containerPort": 80}]),
    );
    p.runtime.check(&node, &l, &c.att, &c.result).unwrap();
    p.runtime.del(&node, &l, &c.att, Some(&c.result)).unwrap();
    p.runtime
        .del(&node, &l, &keep.att, Some(&keep.result))
        .unwrap();
    assert!(
        node.pinned_files().is_empty(),
        "nothing pinned after the last DEL (cgroup links included): {:?}",
        node.pinned_files()
    );
}

/// Teardown goes on past a failure: when the pod's pinned port list cannot be read, DEL
/// still removes the pod's endpoint entries, reports the failure naming the list, and keeps
/// the attachment's pins (the list among them) for a retry; the DEL after the repair
/// removes the mappings and, the node's last pod gone, everything pinned.
#[test]
fn a_del_that_cannot_read_the_port_list_removes_the_rest_and_says_so() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let l = list(&p, &node);
    let a = add(
        &p,
        &node,
        &l,
        json!([{"hostPort": 8080, "containerPort": 80}]),
    );
    let suffix = format!("{}/eth0/ecni_att_ports", a.att.container_id);
    let port_list = node.pin_root().join(
        node.pinned_files()
            .into_iter()
            .find(|f| f.ends_with(&suffix))
            .expect("the attachment's port list is pinned"),
    );
    // bpffs takes renames and symlinks: the list moves aside, and a symlink to nowhere,
    // which opens as no map, takes its place.
    let aside = port_list.with_file_name("aside");
    std::fs::rename(&port_list, &aside).unwrap();
    std::os::unix::fs::symlink("/nonexistent", &port_list).unwrap();

    let msg = p
        .runtime
        .del(&node, &l, &a.att, Some(&a.result))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(&*port_list.to_string_lossy()),
        "DEL names the port list it could not read: {msg}"
    );
    let eps = dp::endpoints(&node).unwrap();
    assert!(
        !eps.contains_key(&a.v4()) && !eps.contains_key(&a.v6()),
        "the pod's endpoint entries went despite the failure: {eps:?}"
    );
    assert_eq!(
        dp::port_mappings(&node).unwrap().len(),
        2,
        "the mappings wait for the retry"
    );

    std::fs::remove_file(&port_list).unwrap();
    std::fs::rename(&aside, &port_list).unwrap();
    p.runtime
        .del(&node, &l, &a.att, Some(&a.result))
        .expect("DEL after the repair");
    assert!(
        node.pinned_files().is_empty(),
        "nothing pinned after the retry: {:?}",
        node.pinned_files()
    );
}

/// A cgroup2 mount that mountinfo lists but that is hidden from the plugin (here: a mount
/// namespace with a fresh sysfs over `/sys`, as `ip netns exec` makes, so the listed
/// mount point leads to sysfs or nowhere) is skipped: ADD with a host port, which attaches the
/// socket programs to the cgroup v2 root, still succeeds, CHECK finds the socket programs'
/// links live, the node's own connections reach the pod, and DEL leaves nothing.
#[test]
fn a_hidden_cgroup2_mount_is_skipped() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    // The host's bpffs stays reachable through a bind mount made before /sys is covered.
    let bpffs = node.scratch_dir().join("bpffs");
    std::fs::create_dir(&bpffs).unwrap();
    let wrapper = node.scratch_dir().join("ebpf-cni-hidden-sys");
    // Runs itself again in a private mount namespace, covers /sys there and checks the
    // premise (the first cgroup2 line of mountinfo names a path that is hidden now).
    let script = r#"#!/bin/sh
if [ -z "$ECNI_TEST_HIDDEN" ]; then
    ECNI_TEST_HIDDEN=1 exec unshare --mount --propagation private -- "$0"
fi
set -e
mount --bind /sys/fs/bpf "$EBPF_CNI_BPFFS_ROOT"
mount -t sysfs ecni-fresh-sysfs /sys
mp=$(awk '/ - cgroup2 / {print $5; exit}' /proc/self/mountinfo)
case "$mp" in
/sys/*) ;;
*) echo "premise: the first cgroup2 mount ($mp) is not under /sys" >&2; exit 1 ;;
esac
if [ "$(stat -f -c %T "$mp" 2>/dev/null)" = cgroup2fs ]; then
    echo "premise: $mp is still a reachable cgroup2" >&2; exit 1
fi
exec PLUGIN
"#;
    std::fs::write(
        &wrapper,
        script.replace("PLUGIN", &format!("'{}'", p.bin.display())),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();

    // The plugin's fallback mounts its own cgroup2 in the private mount namespace; the
    // directory it creates for that is on the host's /run, and goes if this test made it.
    let fallback = std::path::Path::new("/run/ebpf-cni/cgroup2");
    let fallback_existed = fallback.exists();

    let pod = node.new_pod().unwrap();
    let mut conf = p.conf("1.0.0", &node, Stack::Dual);
    conf["runtimeConfig"] = json!({"portMappings": [{"hostPort": 8082, "containerPort": 80}]});
    let env = p.env(&unique_container_id(), pod.path(), "eth0");
    let hidden_env = env
        .clone()
        .with_env("EBPF_CNI_BPFFS_ROOT", &bpffs.to_string_lossy());
    let out = node
        .run(&wrapper, CniCommand::Add, &hidden_env, conf.to_string())
        .unwrap();
    let result = out.expect_success("ADD with the cgroup2 mount hidden");

    conf["prevResult"] = result;
    p.run(&node, CniCommand::Check, &env, conf.to_string())
        .expect_success("CHECK after ADD with the cgroup2 mount hidden");
    let _server = PodServer::start(&pod, 80, "hidden");
    assert_eq!(
        tag_of(&tcp_ask(node.netns(), sa(Ipv4Addr::LOCALHOST, 8082)).unwrap()),
        "hidden",
        "the node's own 127.0.0.1:8082 reaches the pod"
    );
    p.run(&node, CniCommand::Del, &env, conf.to_string())
        .expect_success("DEL");
    assert!(
        !node.pin_root().exists(),
        "pins left after the last DEL: {:?}",
        node.pinned_files()
    );
    if !fallback_existed {
        // Fails harmlessly while anything is mounted there or inside.
        let _ = std::fs::remove_dir(fallback);
        let _ = fallback.parent().map(std::fs::remove_dir);
    }
}

/// A program on the cgroup v2 root runs for every socket of the machine, pods' included,
/// whether or not it acts on it. A node attaches its socket programs only while it has a
/// host port mapping and its pacing program only while a pod's sockets are paced, and
/// detaches each when its last user is deleted: a node with neither has none there.
#[test]
fn cgroup_programs_are_attached_only_while_a_pod_needs_them() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let mut l = list(&p, &node);
    l.plugins[0]["capabilities"] = json!({"portMappings": true, "bandwidth": true});
    let attached = || bpf::node_cgroup_programs(node.pin_root()).unwrap();
    let sock: BTreeSet<String> = [
        "ecni_connect4",
        "ecni_connect6",
        "ecni_sendmsg4",
        "ecni_sendmsg6",
        "ecni_recvmsg4",
        "ecni_recvmsg6",
        "ecni_peername4",
        "ecni_peername6",
    ]
    .map(String::from)
    .into();
    let pacing: BTreeSet<String> = ["ecni_sockops".to_owned()].into();
    let cgroup_pins = node.pin_root().join(ebpf_cni_maps::pin::CGROUP_DIR);

    let plain = add(&p, &node, &l, json!([]));
    assert_eq!(
        attached(),
        BTreeSet::new(),
        "no host port, no limit: nothing on the root"
    );
    assert!(!cgroup_pins.exists(), "no cgroup link pinned");

    let mapped = add(
        &p,
        &node,
        &l,
        json!([{"hostPort": 8093, "containerPort": 80}]),
    );
    assert_eq!(
        attached(),
        sock,
        "a host port: the socket programs, no pacing"
    );

    let paces = bpf::kernel_paces_tcp();
    let limited = {
        let netns = node.new_pod().unwrap();
        let att = Attachment::new(&unique_container_id(), netns.path(), "eth0").with_capability(
            "bandwidth",
            json!({"ingressRate": 100_000_000, "ingressBurst": 1_000_000,
                   "egressRate": 100_000_000, "egressBurst": 1_000_000}),
        );
        let result = p
            .runtime
            .add(&node, &l, &att)
            .unwrap_or_else(|e| panic!("ADD of the limited pod: {e}"));
        (netns, att, result)
    };
    if paces {
        assert_eq!(
            attached(),
            sock.union(&pacing).cloned().collect(),
            "a paced pod: the pacing program too"
        );
    }
    p.runtime
        .del(&node, &l, &mapped.att, Some(&mapped.result))
        .unwrap();
    let want = if paces {
        pacing.clone()
    } else {
        BTreeSet::new()
    };
    assert_eq!(
        attached(),
        want,
        "the last host port deleted: its programs go"
    );
    p.runtime
        .del(&node, &l, &limited.1, Some(&limited.2))
        .unwrap();
    assert_eq!(
        attached(),
        BTreeSet::new(),
        "the last paced pod deleted: pacing goes"
    );
    assert!(
        !cgroup_pins.exists(),
        "no cgroup link pinned: {:?}",
        node.pinned_files()
    );
    // The node's switch for the host port lookups went with the last mapping; a new one
    // turns it on again, with the socket programs.
    let again = add(
        &p,
        &node,
        &l,
        json!([{"hostPort": 8093, "containerPort": 80}]),
    );
    assert_eq!(
        attached(),
        sock,
        "a host port again: the socket programs again"
    );
    let _server = PodServer::start(&again.netns, 80, "again");
    assert_eq!(
        tag_of(&tcp_ask(node.netns(), sa(Ipv4Addr::LOCALHOST, 8093)).unwrap()),
        "again",
        "the node's own connection through the re-attached programs"
    );
    p.runtime
        .del(&node, &l, &again.att, Some(&again.result))
        .unwrap();
    p.runtime
        .del(&node, &l, &plain.att, Some(&plain.result))
        .unwrap();
    assert!(node.pinned_files().is_empty(), "{:?}", node.pinned_files());
}
