//! Masquerade in eBPF (`ipMasq` as ptp and bridge spell it): a pod reaches a host beyond
//! the node that has no route to the pod network, over TCP, UDP and ICMP echo, IPv4 and
//! IPv6, and that host sees the node's address and a port of the masquerade range. Nothing
//! of it touches netfilter: the node's FORWARD policy is DROP throughout, its rulesets are
//! unchanged, and its conntrack table holds none of these flows. A pod without `ipMasq` on
//! the same node is not reached back (so the test fails without the feature), and a host
//! that routes to the pods still reaches the masquerading pod's own address. DEL removes
//! the pod's flows and gives back the reserved ports; chained mode refuses it.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use ebpf_cni_tests::config::Stack;
use ebpf_cni_tests::dataplane as dp;
use ebpf_cni_tests::external::ExternalHost;
use ebpf_cni_tests::net::{tcp_echo, tcp_echo_with, udp_echo, udp_echo_with, udp_error_after_send};
use ebpf_cni_tests::{
    require_root, unique_container_id, CniCommand, Netns, Node, PluginUnderTest, Pod,
};
use serde_json::{json, Value};

/// The masquerade port range when the config names none (`ebpf_cni_maps::MASQ_PORT_MIN`).
const PORTS: std::ops::RangeInclusive<u16> = 61_000..=65_535;

/// External host number `n` behind the node's `up0`: it knows its own link and nothing of
/// the pods (no default route, either family), so only the node's address gets answers.
fn unrouted_host(node: &Node, n: u8) -> ExternalHost {
    let ext = ExternalHost::attach(node.netns(), "up0", n).unwrap();
    for family in ["-4", "-6"] {
        ext.netns()
            .ip_ok(&[family, "route", "del", "default"])
            .unwrap();
    }
    ext
}

/// A node with external host `n` behind it (see `unrouted_host`) and one masquerading IPv4
/// pod, with the masquerade range `ports` when given; the config the pod was added with.
fn masquerading_pod(
    p: &PluginUnderTest,
    n: u8,
    ports: Option<&str>,
) -> (Node, ExternalHost, Value, Pod) {
    masquerading_pod_on(p, n, ports, Stack::V4)
}

/// [`masquerading_pod`] with the addresses of `stack`.
fn masquerading_pod_on(
    p: &PluginUnderTest,
    n: u8,
    ports: Option<&str>,
    stack: Stack,
) -> (Node, ExternalHost, Value, Pod) {
    let node = Node::new().unwrap();
    let ext = unrouted_host(&node, n);
    let mut conf = p.conf("1.0.0", &node, stack);
    conf["ipMasq"] = json!(true);
    if let Some(ports) = ports {
        conf["ipMasqPortRange"] = json!(ports);
    }
    let pod = Pod::add_direct(p, &node, &conf);
    (node, ext, conf, pod)
}

/// A TCP listener of `ext` on `port` of its IPv4 address.
fn tcp_server(ext: &ExternalHost, port: u16) -> (std::net::SocketAddr, std::net::TcpListener) {
    let server = std::net::SocketAddr::new(IpAddr::V4(ext.v4), port);
    let listener = ext
        .netns()
        .run_in(|| std::net::TcpListener::bind(server))
        .unwrap()
        .unwrap();
    (server, listener)
}

/// What the node's netfilter holds: both rulesets, and conntrack's table (empty when the
/// module is not loaded).
fn netfilter(node: &Node) -> (String, String) {
    let save = |cmd: &str| {
        let out = node.netns().exec(&[cmd]).unwrap();
        assert!(out.status.success(), "{cmd}: {out:?}");
        // Comment lines carry the time of the dump.
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let rules = format!("{}\n{}", save("iptables-save"), save("ip6tables-save"));
    let conntrack = node
        .netns()
        .exec(&["cat", "/proc/net/nf_conntrack"])
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    (rules, conntrack)
}

fn ping_ok(from: &Netns, to: IpAddr) -> bool {
    from.exec(&[
        "ping",
        "-n",
        "-c",
        "2",
        "-i",
        "0.2",
        "-W",
        "2",
        &to.to_string(),
    ])
    .unwrap()
    .status
    .success()
}

#[test]
fn pods_reach_a_host_without_a_route_back_through_the_node_address() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = unrouted_host(&node, 81);
    let routed = ExternalHost::attach(node.netns(), "up1", 86).unwrap();
    for cmd in ["iptables", "ip6tables"] {
        let out = node.netns().exec(&[cmd, "-P", "FORWARD", "DROP"]).unwrap();
        assert!(out.status.success(), "{cmd}: {out:?}");
    }
    let before = netfilter(&node);
    let reserved_before = node.reserved_ports();

    let mut conf = p.conf("1.0.0", &node, Stack::Dual);
    conf["ipMasq"] = json!(true);
    let pod = Pod::add_direct(&p, &node, &conf);
    assert_eq!(pod.ips().len(), 2, "{}", pod.result);
    let plain = Pod::add_direct(&p, &node, &p.conf("1.0.0", &node, Stack::Dual));
    assert!(
        node.reserved_ports().contains("61000-65535"),
        "the masquerade range is reserved for the node's sockets: {:?}",
        node.reserved_ports()
    );

    for node_addr in [IpAddr::V4(ext.node_v4), IpAddr::V6(ext.node_v6)] {
        let dst = ext.addr_like(node_addr);
        let tcp = tcp_echo(&pod.netns, ext.netns(), dst, 0)
            .unwrap_or_else(|e| panic!("TCP from the masquerading pod to {dst}: {e:#}"));
        assert_eq!(tcp.client_addr.ip(), node_addr, "TCP source seen by {dst}");
        assert!(PORTS.contains(&tcp.client_addr.port()), "{tcp:?}");
        let udp = udp_echo(&pod.netns, ext.netns(), dst, 0)
            .unwrap_or_else(|e| panic!("UDP from the masquerading pod to {dst}: {e:#}"));
        assert_eq!(udp.client_addr.ip(), node_addr, "UDP source seen by {dst}");
        assert!(PORTS.contains(&udp.client_addr.port()), "{udp:?}");
        assert!(
            ping_ok(&pod.netns, dst),
            "ICMP echo from the masquerading pod to {dst}"
        );

        // Without ipMasq the host cannot answer: the pod's address is not routable there.
        assert!(
            tcp_echo_with(&plain.netns, ext.netns(), dst, 0, Duration::from_secs(3)).is_err(),
            "a pod without ipMasq reached {dst}, which has no route to it"
        );
    }

    // A host that routes to the pod network opens flows to the pod's own address: the
    // pod's replies keep it (TCP: only a SYN opens a masqueraded flow; UDP: the flow is
    // recorded arriving; ICMP: echo replies are never masqueraded).
    for ip in &pod.ips() {
        let from = routed.addr_like(*ip);
        let tcp = tcp_echo(routed.netns(), &pod.netns, *ip, 0)
            .unwrap_or_else(|e| panic!("TCP from {from} to the pod's {ip}: {e:#}"));
        assert_eq!(tcp.client_addr.ip(), from);
        let udp = udp_echo(routed.netns(), &pod.netns, *ip, 0)
            .unwrap_or_else(|e| panic!("UDP from {from} to the pod's {ip}: {e:#}"));
        assert_eq!(udp.client_addr.ip(), from);
        assert!(
            ping_ok(routed.netns(), *ip),
            "ICMP echo from {from} to the pod's {ip}"
        );
    }

    let report = dp::inspect(Path::new(&p.bin), &node).unwrap();
    let m = &report["masquerade"];
    assert_eq!(m["enabled"], json!(true), "{m}");
    assert_eq!(m["ports"], json!("61000-65535"), "{m}");
    for ip in &pod.ips() {
        assert!(
            m["flows_by_pod"][ip.to_string()].as_u64().unwrap_or(0) >= 3,
            "TCP, UDP and ICMP flows of {ip}: {m}"
        );
    }
    assert!(m["in_packets"].as_u64().unwrap() > 0, "{m}");
    assert_eq!(m["exhausted"], json!(0), "{m}");
    assert_eq!(m["table_full"], json!(0), "{m}");
    // The same in the Prometheus exposition.
    let out = std::process::Command::new(&p.bin)
        .env_remove("CNI_COMMAND")
        .arg("metrics")
        .arg("--netns")
        .arg(node.netns().path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for ip in &pod.ips() {
        let sample = format!("ebpf_cni_masquerade_flows{{pod_address=\"{ip}\"}} ");
        let line = text.lines().find(|l| l.starts_with(&sample));
        let n: u64 = line
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("{sample} missing from the metrics:\n{text}"));
        assert!(n >= 3, "{line:?}");
    }
    assert!(
        text.contains("ebpf_cni_masquerade_failures_total{reason=\"exhausted\"} 0"),
        "{text}"
    );

    // CHECK proves the pod's masquerade state.
    let env = pod.env(&p);
    let mut check_conf = conf.clone();
    check_conf["prevResult"] = pod.result.clone();
    p.run(&node, CniCommand::Check, &env, check_conf.to_string())
        .expect_success("CHECK of a masquerading pod");

    let after = netfilter(&node);
    assert_eq!(before.0, after.0, "the node's rulesets changed");
    let ours: Vec<&str> = after
        .1
        .lines()
        .filter(|l| l.contains(&ext.v4.to_string()) || l.contains(&ext.v6.to_string()))
        .collect();
    assert!(ours.is_empty(), "netfilter conntrack tracked: {ours:?}");

    // DEL takes the pod's flows, and the last masquerading pod the reserved range.
    p.run(&node, CniCommand::Del, &env, conf.to_string())
        .expect_success("DEL");
    assert!(
        dp::map_entries(&node, "ECNI_MASQ_FWD").unwrap().is_empty(),
        "flows left after DEL"
    );
    assert!(dp::map_entries(&node, "ECNI_MASQ_REV").unwrap().is_empty());
    assert_eq!(node.reserved_ports(), reserved_before);
    p.run(&node, CniCommand::Del, &env, conf.to_string())
        .expect_success("a repeated DEL");
    let plain_env = plain.env(&p);
    p.run(
        &node,
        CniCommand::Del,
        &plain_env,
        p.conf("1.0.0", &node, Stack::Dual).to_string(),
    )
    .expect_success("DEL of the plain pod");
}

#[test]
fn chained_mode_refuses_ip_masq() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ns = node.new_pod().unwrap();
    let cid = unique_container_id();
    let mut conf = p.conf("1.0.0", &node, Stack::V4);
    conf.as_object_mut().unwrap().remove("ipam");
    conf["ipMasq"] = json!(true);
    conf["prevResult"] = json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": ns.path()}],
        "ips": [{"address": "10.10.0.9/24", "interface": 0}]
    });
    let err = p
        .run(
            &node,
            CniCommand::Add,
            &p.env(&cid, ns.path(), "eth0"),
            conf.to_string(),
        )
        .expect_error(7, "ADD of a chained config with ipMasq");
    assert!(err.msg.contains("ipMasq"), "{err:?}");
}

/// The masquerade range inside the node's own ephemeral range, so that without the
/// reservation the node's sockets would take masquerade ports: with the node holding 40
/// connections to a server and a host port inside the range, every pod flow to the same
/// server gets its own port (never the host port), the node's connections all work, and
/// the flow that finds every port taken fails alone and is counted.
#[test]
fn masquerade_ports_never_collide_with_node_sockets_or_host_ports() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = unrouted_host(&node, 82);
    let out = node
        .netns()
        .exec(&["sysctl", "-w", "net.ipv4.ip_local_port_range=40000 40063"])
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    const HOST_PORT: u16 = 40_005;
    let range = 40_000..=40_007u16;

    let mut conf = p.conf("1.0.0", &node, Stack::V4);
    conf["ipMasq"] = json!(true);
    conf["ipMasqPortRange"] = json!("40000-40007");
    let pod = Pod::add_direct(&p, &node, &conf);
    let mut mapped_conf = conf.clone();
    mapped_conf["runtimeConfig"] = json!({"portMappings": [
        {"hostPort": HOST_PORT, "containerPort": 80, "protocol": "tcp"}
    ]});
    let mapped = Pod::add_direct(&p, &node, &mapped_conf);

    // A different range while masquerading pods exist is refused, naming both.
    let mut other = conf.clone();
    other["ipMasqPortRange"] = json!("50000-50010");
    let ns = node.new_pod().unwrap();
    let err = p
        .run(
            &node,
            CniCommand::Add,
            &p.env(&unique_container_id(), ns.path(), "eth0"),
            other.to_string(),
        )
        .expect_error(7, "ADD with another port range");
    assert!(
        err.msg.contains("50000-50010") && err.msg.contains("40000-40007"),
        "{err:?}"
    );

    let (server_addr, listener) = tcp_server(&ext, 7000);
    let accepted = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let acc = accepted.clone();
    let serving = listener.try_clone().unwrap();
    // Records each peer and echoes what each connection sends.
    std::thread::spawn(move || {
        while let Ok((mut s, peer)) = serving.accept() {
            acc.lock().unwrap().push(peer);
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let mut b = [0u8; 16];
                while let Ok(n) = s.read(&mut b) {
                    if n == 0 || s.write_all(&b[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    let connect = |ns: &Netns| {
        ns.run_in(|| std::net::TcpStream::connect_timeout(&server_addr, Duration::from_secs(3)))
            .unwrap()
    };
    let node_conns: Vec<_> = (0..40)
        .map(|i| connect(node.netns()).unwrap_or_else(|e| panic!("node connection {i}: {e}")))
        .collect();
    for c in &node_conns {
        let port = c.local_addr().unwrap().port();
        assert!(
            !range.contains(&port),
            "the node's kernel handed out masquerade port {port}"
        );
    }
    // 8 ports, one of them a host port: 7 flows towards the one server.
    let pod_conns: Vec<_> = (0..7)
        .map(|i| connect(&pod.netns).unwrap_or_else(|e| panic!("pod flow {i}: {e}")))
        .collect();
    assert!(
        connect(&pod.netns).is_err(),
        "an 8th flow found a port in a range of 7"
    );
    std::thread::sleep(Duration::from_millis(200));
    let node_ip = IpAddr::V4(ext.node_v4);
    let seen: Vec<u16> = accepted
        .lock()
        .unwrap()
        .iter()
        .map(|peer| {
            assert_eq!(peer.ip(), node_ip);
            peer.port()
        })
        .collect();
    let masq_ports: std::collections::BTreeSet<u16> =
        seen.iter().copied().filter(|p| range.contains(p)).collect();
    assert_eq!(masq_ports.len(), 7, "each pod flow its own port: {seen:?}");
    assert!(
        !masq_ports.contains(&HOST_PORT),
        "a pod flow took the host port"
    );
    assert_eq!(
        seen.len(),
        47,
        "every node connection and pod flow arrived: {seen:?}"
    );

    // Every connection still carries data both ways.
    for (i, mut c) in node_conns.into_iter().chain(pod_conns).enumerate() {
        use std::io::{Read, Write};
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut b = [0u8; 1];
        let echoed = c.write_all(b"x").and_then(|()| c.read_exact(&mut b));
        assert!(
            echoed.is_ok() && b == *b"x",
            "connection {i} (40 node, then pod): {echoed:?}"
        );
    }
    let report = dp::inspect(Path::new(&p.bin), &node).unwrap();
    let m = &report["masquerade"];
    assert_eq!(m["ports"], json!("40000-40007"), "{m}");
    assert!(m["exhausted"].as_u64().unwrap() >= 1, "{m}");

    for (pod, conf) in [(&pod, &conf), (&mapped, &mapped_conf)] {
        pod.del_direct(&p, &node, conf);
    }
}

/// Path MTU discovery through masquerade: a link beyond the node's uplink carries 1000
/// bytes, the far host advertises a 1460-byte MSS, so the pod's full-size segments meet a
/// router that answers "fragmentation needed" to the node's address. Translated back (the
/// quoted packet's source and port become the pod's), it reaches the pod's stack, which
/// lowers its segments: the transfer completes. Left untranslated it would be a black hole.
#[test]
fn fragmentation_needed_reaches_the_pod_and_a_transfer_completes() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = unrouted_host(&node, 83);
    // The far host, behind the external host (a router) on a link of MTU 1000 on the
    // router's side.
    let far = ext.far_host(node.netns(), 1000).unwrap();
    let far_addr = far.v4;
    let far = far.netns;

    let mut conf = p.conf("1.0.0", &node, Stack::V4);
    conf["ipMasq"] = json!(true);
    let pod = Pod::add_direct(&p, &node, &conf);

    let server = std::net::SocketAddr::from((far_addr, 7001));
    let listener = far
        .run_in(|| std::net::TcpListener::bind(server))
        .unwrap()
        .unwrap();
    const SIZE: usize = 2 << 20;
    let receiver = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut s, peer) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut got = 0usize;
        let mut buf = vec![0u8; 65536];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) => panic!("far host reading after {got} bytes: {e}"),
            }
        }
        s.write_all(&(got as u64).to_be_bytes()).unwrap();
        (peer, got)
    });
    let sent = pod
        .netns
        .run_in(|| -> std::io::Result<u64> {
            use std::io::{Read, Write};
            let mut c = std::net::TcpStream::connect_timeout(&server, Duration::from_secs(3))?;
            c.set_write_timeout(Some(Duration::from_secs(15)))?;
            c.set_read_timeout(Some(Duration::from_secs(15)))?;
            c.write_all(&vec![7u8; SIZE])?;
            c.shutdown(std::net::Shutdown::Write)?;
            let mut n = [0u8; 8];
            c.read_exact(&mut n)?;
            Ok(u64::from_be_bytes(n))
        })
        .unwrap();
    let (peer, got) = receiver.join().unwrap();
    assert_eq!(
        peer.ip(),
        IpAddr::V4(ext.node_v4),
        "the far host saw the node's address"
    );
    assert_eq!(got, SIZE);
    assert_eq!(
        sent.unwrap_or_else(|e| panic!("the pod's transfer: {e}")),
        SIZE as u64
    );
    // The pod's stack learnt the path's MTU from the translated error.
    let route = pod
        .netns
        .exec(&["ip", "route", "get", &far_addr.to_string()])
        .unwrap();
    let route = String::from_utf8_lossy(&route.stdout);
    assert!(route.contains("mtu 1000"), "the pod's route cache: {route}");

    pod.del_direct(&p, &node, &conf);
}

/// ICMP errors the pod sends about a masqueraded flow leave translated too: a reply that
/// reaches the pod after its UDP socket closed draws "port unreachable", which must reach
/// the remote end quoting what it sent (to the node's address and port), so its connected
/// socket sees ECONNREFUSED, over IPv4 and IPv6.
#[test]
fn the_pods_port_unreachable_reaches_the_remote_end() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = unrouted_host(&node, 84);
    let mut conf = p.conf("1.0.0", &node, Stack::Dual);
    conf["ipMasq"] = json!(true);
    let pod = Pod::add_direct(&p, &node, &conf);

    for node_addr in [IpAddr::V4(ext.node_v4), IpAddr::V6(ext.node_v6)] {
        let remote = std::net::SocketAddr::new(ext.addr_like(node_addr), 7002);
        let server = ext
            .netns()
            .run_in(|| std::net::UdpSocket::bind(remote))
            .unwrap()
            .unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        pod.netns
            .run_in(|| {
                let unspecified: IpAddr = if remote.is_ipv4() {
                    std::net::Ipv4Addr::UNSPECIFIED.into()
                } else {
                    std::net::Ipv6Addr::UNSPECIFIED.into()
                };
                let s = std::net::UdpSocket::bind((unspecified, 0)).unwrap();
                s.send_to(b"hello", remote).unwrap();
                // Closed at once: what comes back finds no socket.
            })
            .unwrap();
        let mut buf = [0u8; 16];
        let (_, peer) = server.recv_from(&mut buf).unwrap();
        assert_eq!(peer.ip(), node_addr);
        server.connect(peer).unwrap();
        // A late reply draws the pod's port unreachable.
        let err = udp_error_after_send(&server, b"late reply");
        assert_eq!(
            err.kind(),
            std::io::ErrorKind::ConnectionRefused,
            "towards {peer}: {err}"
        );
    }
    pod.del_direct(&p, &node, &conf);
}

/// A pod sending from source port P while another pod holds host port P (cilium/cilium#34041:
/// the replies to the first pod's SNATed flow went to the host-port pod): the masquerading
/// pod's TCP connection and UDP datagrams from port 8090 get their answers, while the other
/// pod's host port 8090 (TCP and UDP) still answers from outside.
#[test]
fn a_pod_sending_from_another_pods_host_port_gets_its_replies() {
    use ebpf_cni_tests::host_ports::{sa, tag_of, tcp_ask, udp_ask, udp_ask_from, PodServer};
    const P: u16 = 8090;
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let (node, ext, conf, pod) = masquerading_pod(&p, 90, None);
    let mut mapped_conf = conf.clone();
    mapped_conf["runtimeConfig"] = json!({"portMappings": [
        {"hostPort": P, "containerPort": 80, "protocol": "tcp"},
        {"hostPort": P, "containerPort": 80, "protocol": "udp"},
    ]});
    let mapped = Pod::add_direct(&p, &node, &mapped_conf);
    let _mapped_server = PodServer::start(&mapped.netns, 80, "host-port-pod");
    let _ext_server = PodServer::start(ext.netns(), 9000, "ext");
    let target = sa(ext.v4, 9000);

    let answer = tcp_from_port(&pod.netns, P, target).expect("TCP from port 8090");
    assert_eq!(tag_of(&answer), "ext", "{answer}");
    let answer = udp_ask_from(&pod.netns, sa(std::net::Ipv4Addr::UNSPECIFIED, P), target)
        .expect("UDP from port 8090");
    assert_eq!(tag_of(&answer), "ext", "{answer}");
    // The server saw the node's address and a masquerade port, never P.
    let seen: std::net::SocketAddr = answer.split(' ').nth(1).unwrap().parse().unwrap();
    assert_eq!(seen.ip(), IpAddr::V4(ext.node_v4), "{answer}");
    assert!(PORTS.contains(&seen.port()), "{answer}");
    // The host port is still the other pod's.
    let node_p = sa(ext.node_v4, P);
    for answer in [tcp_ask(ext.netns(), node_p), udp_ask(ext.netns(), node_p)] {
        let answer = answer.expect("the host port from outside");
        assert_eq!(tag_of(&answer), "host-port-pod", "{answer}");
    }
    for (pod, conf) in [(&pod, &conf), (&mapped, &mapped_conf)] {
        pod.del_direct(&p, &node, conf);
    }
}

/// TCP from `from`'s source port `port` to `target`: the server's answer to "hello".
fn tcp_from_port(from: &Netns, port: u16, target: std::net::SocketAddr) -> anyhow::Result<String> {
    use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    let std::net::SocketAddr::V4(v4) = target else {
        anyhow::bail!("IPv4 only: {target}");
    };
    from.run_in(|| -> anyhow::Result<String> {
        let fd = socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::empty(),
            None,
        )?;
        bind(fd.as_raw_fd(), &SockaddrIn::new(0, 0, 0, 0, port))?;
        connect(fd.as_raw_fd(), &SockaddrIn::from(v4))?;
        let mut c = std::net::TcpStream::from(fd);
        c.set_read_timeout(Some(Duration::from_secs(3)))?;
        c.write_all(b"hello")?;
        let mut s = String::new();
        c.read_to_string(&mut s)?;
        Ok(s)
    })?
}

/// A flow entry as the maps hold it (`ebpf_cni_maps::MasqKey`, `MasqFlow`).
fn flow_entry(local: IpAddr, remote: IpAddr, port: u16, last_ns: u64) -> (Vec<u8>, Vec<u8>) {
    let mut key = dp::endpoint_key(local).to_vec();
    key.extend(dp::endpoint_key(remote));
    key.extend(port.to_ne_bytes());
    key.extend(53u16.to_ne_bytes());
    key.extend([17, 0, 0, 0]);
    let mut value = dp::endpoint_key("192.0.2.1".parse().unwrap()).to_vec();
    value.extend(61_999u16.to_ne_bytes());
    // state, ts_shift
    value.extend([0u8; 6]);
    value.extend(last_ns.to_ne_bytes());
    // ts_last, padding
    value.extend([0u8; 8]);
    (key, value)
}

/// CNI GC sweeps the flow table: a flow idle past its timeout and one of an address no pod
/// holds go, the live flow of the pod stays.
#[test]
fn gc_sweeps_idle_and_orphaned_flows_and_keeps_live_ones() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = unrouted_host(&node, 85);
    let mut conf = p.conf("1.1.0", &node, Stack::V4);
    conf["ipMasq"] = json!(true);
    let pod = Pod::add_direct(&p, &node, &conf);
    // UDP: its two minutes of idle time outlast the test (a closed TCP flow's ten seconds
    // might not, on a slow machine).
    udp_echo(&pod.netns, ext.netns(), IpAddr::V4(ext.v4), 0).unwrap();
    let live = dp::map_entries(&node, "ECNI_MASQ_FWD").unwrap().len();
    assert_eq!(live, 1, "the pod's UDP flow");
    let remote: IpAddr = "198.51.100.7".parse().unwrap();
    let (idle_key, idle_value) = flow_entry(pod.ips()[0], remote, 5000, 0);
    dp::update_raw(&node, "ECNI_MASQ_FWD", &idle_key, &idle_value).unwrap();
    let (orphan_key, orphan_value) =
        flow_entry("10.10.0.250".parse().unwrap(), remote, 5001, u64::MAX / 2);
    dp::update_raw(&node, "ECNI_MASQ_FWD", &orphan_key, &orphan_value).unwrap();
    assert_eq!(dp::map_entries(&node, "ECNI_MASQ_FWD").unwrap().len(), 3);

    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": pod.id(), "ifname": "eth0"}]);
    let env = ebpf_cni_tests::ContainerEnv::none().with_cni_path(&p.runtime.cni_path_env());
    p.run(&node, CniCommand::Gc, &env, gc.to_string())
        .expect_success("GC");
    let left = dp::map_entries(&node, "ECNI_MASQ_FWD").unwrap();
    assert_eq!(left.len(), 1, "GC left {left:?}");
    let key = dp::hex_bytes(&left[0]["key"]).unwrap();
    assert_eq!(
        &key[..16],
        &dp::endpoint_key(pod.ips()[0])[..],
        "the live flow stays"
    );
    assert_ne!(key, idle_key);

    pod.del_direct(&p, &node, &conf);
}

/// A masquerading pod's ADD that fails after every step (the failpoint) leaves the node as
/// it was: the reserved ports given back, the programs' switch off, no flow; DEL of it then
/// succeeds twice, with an empty CNI_NETNS and no prevResult, as containerd sends it.
#[test]
fn a_failed_masquerading_add_leaves_nothing_and_del_succeeds_twice() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let _ext = unrouted_host(&node, 87);
    // A pod without ipMasq keeps the node's maps, so their state can be read afterwards.
    let plain_conf = p.conf("1.0.0", &node, Stack::V4);
    let plain = Pod::add_direct(&p, &node, &plain_conf);
    let reserved_before = node.reserved_ports();

    let mut conf = p.conf("1.0.0", &node, Stack::V4);
    conf["ipMasq"] = json!(true);
    let ns = node.new_pod().unwrap();
    let cid = unique_container_id();
    let env = p
        .env(&cid, ns.path(), "eth0")
        .with_env("EBPF_CNI_FAILPOINT", "before-result");
    let out = p.run(&node, CniCommand::Add, &env, conf.to_string());
    assert!(
        !out.success() && out.error().is_some(),
        "failpoint ADD must fail with an error result\n{}",
        out.describe()
    );
    assert_eq!(
        node.reserved_ports(),
        reserved_before,
        "reserved ports left"
    );
    let report = dp::inspect(Path::new(&p.bin), &node).unwrap();
    assert_eq!(report["masquerade"]["enabled"], json!(false), "{report}");
    assert!(dp::map_entries(&node, "ECNI_MASQ_FWD").unwrap().is_empty());
    assert!(dp::map_entries(&node, "ECNI_MASQ_SKIP").unwrap().is_empty());

    let late = p.env(&cid, "", "eth0");
    for what in ["DEL after the failed ADD", "a repeated DEL"] {
        p.run(&node, CniCommand::Del, &late, conf.to_string())
            .expect_success(what);
    }
    plain.del_direct(&p, &node, &plain_conf);
}

/// A datagram without DF larger than the node's uplink MTU: the node's stack would
/// fragment it and forward the fragments with the pod's address, where masquerade does not
/// reach (the stack's fragments never pass the programs). It is dropped and counted
/// instead; a datagram that fits leaves masqueraded.
#[test]
fn a_datagram_the_node_would_fragment_never_leaves_with_the_pods_address() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let (node, ext, conf, pod) = masquerading_pod(&p, 86, None);
    // After the ADD, so the pod keeps its MTU and sends the datagram whole (with the
    // device's MTU at ADD, the pod would fragment it itself, and its fragments would be
    // masqueraded: `fragmented_datagrams_are_masqueraded_both_ways`).
    node.netns()
        .ip_ok(&["link", "set", "up0", "mtu", "1000"])
        .unwrap();
    let server = std::net::SocketAddr::new(IpAddr::V4(ext.v4), 7002);
    let listener = ext
        .netns()
        .run_in(|| std::net::UdpSocket::bind(server))
        .unwrap()
        .unwrap();
    listener
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let send = |len: usize| {
        pod.netns
            .run_in(|| {
                use std::os::fd::AsRawFd;
                let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
                // No DF: the kernel sends it whole and a router may fragment it.
                let dont: libc::c_int = libc::IP_PMTUDISC_DONT;
                // SAFETY: setsockopt(2) on an open socket with an int option it reads.
                let rc = unsafe {
                    libc::setsockopt(
                        s.as_raw_fd(),
                        libc::IPPROTO_IP,
                        libc::IP_MTU_DISCOVER,
                        (&dont as *const libc::c_int).cast(),
                        std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                    )
                };
                assert_eq!(rc, 0, "IP_MTU_DISCOVER");
                s.send_to(&vec![b'x'; len], server).unwrap();
            })
            .unwrap()
    };
    // 1,328 bytes of IP: within the pod's MTU (1,400 in these tests), beyond the uplink's.
    send(1300);
    let mut buf = [0u8; 2048];
    match listener.recv_from(&mut buf) {
        Ok((n, from)) => panic!("{n} bytes of the oversize datagram arrived, from {from}"),
        Err(e) => assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "{e}"
        ),
    }
    let report = dp::inspect(Path::new(&p.bin), &node).unwrap();
    assert!(
        report["masquerade"]["untranslatable"].as_u64().unwrap() >= 1,
        "{}",
        report["masquerade"]
    );
    send(500);
    let (n, from) = listener
        .recv_from(&mut buf)
        .expect("the datagram that fits");
    assert_eq!((n, from.ip()), (500, IpAddr::V4(ext.node_v4)));
    pod.del_direct(&p, &node, &conf);
}

/// Datagrams larger than the path's MTU travel in fragments, both ways, IPv4 and IPv6: a
/// pod sends a 4,000-byte UDP datagram to a host beyond the node (the pod's stack cuts it
/// into three fragments) and the host gets it whole, from the node's address and a port of
/// the range; the host answers that address and port with 6,000 bytes (its stack cuts them
/// into five), and the pod gets them whole, from the host. Only each datagram's first
/// fragment carries the ports: the later ones are translated by the record it left.
/// (Before, the pod's fragments were dropped as untranslatable, and the host's went to the
/// node's stack and were lost: IPv4's until the IPv4 records, IPv6's until IPv6's.)
#[test]
fn fragmented_datagrams_are_masqueraded_both_ways() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let (node, ext, conf, pod) = masquerading_pod_on(&p, 87, None, Stack::Dual);
    // The host's link carries what the pod's does, so its fragments fit the pod's device:
    // 5.10's `bpf_redirect_peer` drops a packet longer than the receiving device's MTU.
    ext.netns()
        .ip_ok(&[
            "link",
            "set",
            ebpf_cni_tests::external::HOST_IFNAME,
            "mtu",
            &ebpf_cni_tests::config::MTU.to_string(),
        ])
        .unwrap();
    let families = [
        (IpAddr::V4(ext.v4), IpAddr::V4(ext.node_v4), "0.0.0.0:0"),
        (IpAddr::V6(ext.v6), IpAddr::V6(ext.node_v6), "[::]:0"),
    ];
    for (host_addr, node_addr, any) in families {
        let server = std::net::SocketAddr::new(host_addr, 7003);
        let host = ext
            .netns()
            .run_in(|| std::net::UdpSocket::bind(server))
            .unwrap()
            .unwrap();
        let sock = pod
            .netns
            .run_in(|| std::net::UdpSocket::bind(any))
            .unwrap()
            .unwrap();
        for s in [&host, &sock] {
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        }
        let mut buf = vec![0u8; 65_536];
        for round in 0..3 {
            let out: Vec<u8> = (0..4000).map(|i| ((i + round) % 251) as u8).collect();
            sock.send_to(&out, server).unwrap();
            let (n, from) = host.recv_from(&mut buf).unwrap_or_else(|e| {
                panic!("{host_addr}, round {round}: the pod's datagram, whole: {e}")
            });
            assert_eq!((n, from.ip()), (4000, node_addr), "round {round}");
            assert!(
                buf[..n] == out[..],
                "{host_addr}, round {round}: the pod's bytes"
            );
            assert!(PORTS.contains(&from.port()), "round {round}: port {from}");

            let back: Vec<u8> = (0..6000).map(|i| ((i + round) % 239) as u8).collect();
            host.send_to(&back, from).unwrap();
            let (n, src) = sock.recv_from(&mut buf).unwrap_or_else(|e| {
                panic!("{host_addr}, round {round}: the host's answer, whole: {e}")
            });
            assert_eq!((n, src.ip()), (6000, host_addr), "round {round}");
            assert_eq!(src.port(), 7003, "{host_addr}, round {round}");
            assert!(
                buf[..n] == back[..],
                "{host_addr}, round {round}: the host's bytes"
            );
        }
    }
    let report = dp::inspect(Path::new(&p.bin), &node).unwrap();
    assert_eq!(
        report["masquerade"]["untranslatable"].as_u64(),
        Some(0),
        "{}",
        report["masquerade"]
    );
    pod.del_direct(&p, &node, &conf);
}

/// A counter of the kernel's statistics in `ns`, by `nstat`'s name (`TcpOutRsts`,
/// `TcpExtPAWSTimewait`: the table's prefix and the field), read from /proc/net/snmp and
/// /proc/net/netstat (a test's namespace starts at zero); None where the kernel has no such
/// counter (`PAWSTimewait` came with 6.16).
fn tcp_counter(ns: &Netns, name: &str) -> Option<u64> {
    let out = ns
        .exec(&["cat", "/proc/net/snmp", "/proc/net/netstat"])
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    // Each table is two lines: "Prefix: names…" and "Prefix: values…".
    lines.windows(2).find_map(|pair| {
        let (prefix, names) = pair[0].split_once(": ")?;
        let (again, values) = pair[1].split_once(": ")?;
        let field = name.strip_prefix(prefix).filter(|_| again == prefix)?;
        let i = names.split_whitespace().position(|n| n == field)?;
        values.split_whitespace().nth(i)?.parse().ok()
    })
}

/// Short connections to one server that closes first (so it holds each in TIME_WAIT),
/// three times as many as the masquerade range has ports: every port goes to new flows
/// towards the same server while that server still holds the last one. The server takes
/// each new SYN (its timestamp is made newer than the old flow's last, RFC 7323's PAWS
/// check in TIME_WAIT), the pod never resets one, and each connection succeeds at once.
/// (On a kernel whose TCP keeps a timestamp clock per 4-tuple — 6.18 — a third of the SYNs
/// met the old TIME_WAIT's ACK without the shift, and waited for the pod's 1 s retransmit.)
#[test]
fn ports_reused_towards_a_server_in_time_wait_connect_at_once() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let (node, ext, conf, pod) = masquerading_pod(&p, 84, Some("40000-40499"));
    let (server, listener) = tcp_server(&ext, 7000);
    // Echoes one byte and closes first.
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        while let Ok((mut s, _)) = listener.accept() {
            let mut b = [0u8; 1];
            if s.read_exact(&mut b).is_ok() {
                let _ = s.write_all(&b);
            }
        }
    });
    const CONNECTIONS: usize = 1500;
    pod.netns
        .run_in(|| {
            use std::io::{Read, Write};
            for i in 0..CONNECTIONS {
                let mut c = std::net::TcpStream::connect_timeout(&server, Duration::from_secs(5))
                    .unwrap_or_else(|e| panic!("connection {i}: {e}"));
                c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut b = [0u8; 1];
                c.write_all(b"x").unwrap();
                c.read_exact(&mut b)
                    .unwrap_or_else(|e| panic!("connection {i}: no echo: {e}"));
                // The server's FIN: the pod closes second.
                let _ = c.read(&mut b);
            }
        })
        .unwrap();
    let report = dp::inspect(Path::new(&p.bin), &node).unwrap();
    let m = &report["masquerade"];
    eprintln!("after {CONNECTIONS} connections: {m}");
    assert!(
        m["reclaimed"].as_u64().unwrap() >= (CONNECTIONS - 500) as u64 / 2,
        "ports were reused: {m}"
    );
    // A SYN the server's TIME_WAIT refused costs the pod a reset (its answer to the
    // server's ACK) and a SYN retransmitted 1 s later, on every kernel; 6.16+ count the
    // refusals too. Without the shift, 6.18 retransmitted about 500 SYNs here. A few are
    // allowed: under emulation a SYN-ACK can be late (and a FIN retransmitted after the
    // pod closed draws a reset of its own, seen once on 6.1 under TCG).
    let retransmitted = tcp_counter(&pod.netns, "TcpExtTCPSynRetrans").unwrap();
    assert!(
        retransmitted <= (CONNECTIONS / 100) as u64,
        "SYNs the pod retransmitted: {retransmitted}; its resets: {:?}, the server's \
         retransmitted segments: {:?}",
        tcp_counter(&pod.netns, "TcpOutRsts"),
        tcp_counter(ext.netns(), "TcpRetransSegs"),
    );
    assert!(
        matches!(
            tcp_counter(ext.netns(), "TcpExtPAWSTimewait"),
            None | Some(0)
        ),
        "SYNs the server's TIME_WAIT refused for an old timestamp"
    );
    assert_eq!(
        tcp_counter(&pod.netns, "TcpExtPAWSActive"),
        Some(0),
        "SYN-ACKs the pod refused for their echoed timestamp"
    );
    pod.del_direct(&p, &node, &conf);
}

/// A connection the pod opens on the 4-tuple of one that closed (same pod port, same
/// server) reuses that flow's entries and its node port; it is a live connection again, not
/// the closed one's leftovers: idle past the closed flow's 100 ms, it keeps its port when
/// new flows want every port of the range.
#[test]
fn a_connection_reopened_on_a_closed_flows_tuple_keeps_its_port() {
    use std::io::{Read, Write};
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let (node, ext, conf, pod) = masquerading_pod(&p, 85, Some("40000-40001"));
    let (server, listener) = tcp_server(&ext, 7000);
    // Echoes each byte; closes first after a "q".
    std::thread::spawn(move || {
        while let Ok((mut s, _)) = listener.accept() {
            std::thread::spawn(move || {
                let mut b = [0u8; 1];
                while s.read_exact(&mut b).is_ok() && s.write_all(&b).is_ok() && b != *b"q" {}
            });
        }
    });
    // A client socket bound to the pod's port 33333.
    let connect_from_33333 = || -> std::io::Result<std::net::TcpStream> {
        use nix::sys::socket::{
            bind, connect, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType,
            SockaddrIn,
        };
        let fd = socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::empty(),
            None,
        )?;
        setsockopt(&fd, sockopt::ReuseAddr, &true)?;
        let IpAddr::V4(pod_v4) = pod.ips()[0] else {
            unreachable!("an IPv4 pod")
        };
        bind(
            fd.as_raw_fd(),
            &SockaddrIn::from(std::net::SocketAddrV4::new(pod_v4, 33_333)),
        )?;
        let std::net::SocketAddr::V4(to) = server else {
            unreachable!()
        };
        connect(fd.as_raw_fd(), &SockaddrIn::from(to))?;
        let s = std::net::TcpStream::from(fd);
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        Ok(s)
    };
    let echo = |s: &mut std::net::TcpStream, b: u8| -> std::io::Result<()> {
        let mut got = [0u8; 1];
        s.write_all(&[b])?;
        s.read_exact(&mut got)?;
        assert_eq!(got[0], b);
        Ok(())
    };
    use std::os::fd::AsRawFd;
    let reopened = pod
        .netns
        .run_in(|| {
            // The first connection: the server closes it, then the pod.
            let mut first = connect_from_33333().expect("the first connection");
            echo(&mut first, b'q').unwrap();
            let mut rest = Vec::new();
            first.read_to_end(&mut rest).unwrap();
            drop(first);
            // Until the server's last ACK reaches the pod, its socket holds the 4-tuple
            // (LAST_ACK) and connect says EADDRNOTAVAIL: slow guests take a while.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let mut again = loop {
                std::thread::sleep(Duration::from_millis(50));
                match connect_from_33333() {
                    Err(e)
                        if e.raw_os_error() == Some(libc::EADDRNOTAVAIL)
                            && std::time::Instant::now() < deadline => {}
                    r => break r.expect("the connection on the same 4-tuple"),
                }
            };
            echo(&mut again, b'a').unwrap();
            again
        })
        .unwrap();
    // Idle past the closed flow's timeout; then new flows want both ports of the range.
    std::thread::sleep(Duration::from_millis(300));
    let newcomers: Vec<_> = (0..2)
        .map(|_| {
            pod.netns
                .run_in(|| std::net::TcpStream::connect_timeout(&server, Duration::from_secs(1)))
                .unwrap()
        })
        .collect();
    assert!(
        newcomers.iter().any(Result::is_err),
        "two new flows found ports in a range of two, one held by a live connection: {newcomers:?}"
    );
    let mut reopened = reopened;
    echo(&mut reopened, b'b').expect("the reopened connection after new flows wanted its port");
    pod.del_direct(&p, &node, &conf);
}

/// When every port of the masquerade range is taken towards one destination, a new flow to
/// it is dropped and counted (`exhausted`, in `inspect` and the metrics), the flows holding
/// the ports keep working, and a port freed by a closed flow goes to the next new flow once
/// that flow's short timeout has passed. Ports are per destination, and the range here is
/// small (8 ports, the ports a new flow probes), so 8 connections fill it.
#[test]
fn a_destination_with_every_port_taken_drops_new_flows_counted_and_recovers() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let (node, ext, conf, pod) = masquerading_pod(&p, 89, Some("40000-40007"));
    let (server, listener) = tcp_server(&ext, 7000);
    // Echoes every byte until the client closes, then closes too.
    std::thread::spawn(move || {
        while let Ok((mut s, _)) = listener.accept() {
            std::thread::spawn(move || {
                let mut b = [0u8; 1];
                while s.read_exact(&mut b).is_ok() && s.write_all(&b).is_ok() {}
            });
        }
    });
    let connect = |timeout: Duration| {
        pod.netns
            .run_in(|| TcpStream::connect_timeout(&server, timeout))
            .unwrap()
    };
    let echoes = |c: &mut TcpStream| {
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 1];
        c.write_all(b"x").is_ok() && c.read_exact(&mut b).is_ok() && &b == b"x"
    };
    let exhausted = || {
        dp::inspect(Path::new(&p.bin), &node).unwrap()["masquerade"]["exhausted"]
            .as_u64()
            .unwrap()
    };
    let mut held: Vec<TcpStream> = (0..8)
        .map(|i| connect(Duration::from_secs(5)).unwrap_or_else(|e| panic!("connection {i}: {e}")))
        .collect();
    for (i, c) in held.iter_mut().enumerate() {
        assert!(echoes(c), "connection {i} echoes");
    }
    assert_eq!(exhausted(), 0, "no flow dropped while ports were free");

    // The ninth: every port towards the server is taken, its SYNs are dropped and counted.
    let ninth = connect(Duration::from_millis(1500));
    assert!(ninth.is_err(), "a ninth connection got through: {ninth:?}");
    assert!(exhausted() >= 1, "the dropped SYN was counted as exhausted");
    for (i, c) in held.iter_mut().enumerate() {
        assert!(
            echoes(c),
            "connection {i} still echoes after the dropped flow"
        );
    }

    // One flow closes both ways; after its 100 ms the next new flow takes its port.
    let closed = held.pop().unwrap();
    closed.shutdown(std::net::Shutdown::Both).unwrap();
    drop(closed);
    std::thread::sleep(Duration::from_millis(500));
    let mut next = connect(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("no new flow after a port was freed: {e}"));
    assert!(echoes(&mut next), "the new flow echoes");
    for (i, c) in held.iter_mut().enumerate() {
        assert!(
            echoes(c),
            "connection {i} still echoes after the port went to a new flow"
        );
    }
    drop((held, next));
    pod.del_direct(&p, &node, &conf);
}

/// `ebpf-cni inspect` (the table, as `inspect --json` and the metrics) shows masquerade:
/// on, its port range reserved by ebpf-cni, and the flows of the masquerading pod's
/// address, with the same count as the JSON report. The table once had no masquerade at
/// all: this fails if it loses it again.
#[test]
fn inspect_shows_the_masquerade_state() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let (node, ext, conf, pod) = masquerading_pod(&p, 88, None);
    let dst = IpAddr::V4(ext.v4);
    let udp = udp_echo(&pod.netns, ext.netns(), dst, 0)
        .unwrap_or_else(|e| panic!("UDP from the masquerading pod to {dst}: {e:#}"));
    assert_eq!(udp.client_addr.ip(), IpAddr::V4(ext.node_v4), "{udp:?}");

    let out = std::process::Command::new(&p.bin)
        .env_remove("CNI_COMMAND")
        .arg("inspect")
        .arg("--netns")
        .arg(node.netns().path())
        .output()
        .unwrap();
    assert!(out.status.success(), "inspect: {out:?}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("masquerade: on, ports 61000-65535 (reserved by ebpf-cni), ")),
        "no masquerade state in inspect:\n{table}"
    );
    let json = dp::inspect(Path::new(&p.bin), &node).unwrap();
    let ip = pod.ips()[0];
    let flows = json["masquerade"]["flows_by_pod"][ip.to_string()]
        .as_u64()
        .unwrap_or(0);
    assert!(flows >= 1, "the UDP flow of {ip}: {}", json["masquerade"]);
    let line = format!("  {:<32} {flows} flows", ip.to_string());
    assert!(
        table.lines().any(|l| l == line),
        "{line:?} missing from inspect:\n{table}"
    );
    pod.del_direct(&p, &node, &conf);
}

/// DEL removes a pod's masqueraded flows by walking the node's whole flow table (a large
/// hash: about 0.5 ms even empty). A node that does not masquerade holds no flow of a live
/// pod (the flag goes on with its first masquerading pod and off with its last, after that
/// pod's flows), so there DEL does not walk it; on a masquerading node it does, and the
/// pod's flows go.
#[test]
fn del_walks_the_flow_table_only_on_a_masquerading_node() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    for masquerading in [false, true] {
        let traced = ebpf_cni_tests::strace::Traced::new(&p.bin, "bpf,close").unwrap();
        let t = PluginUnderTest::at(traced.wrapper.clone());
        let node = Node::new().unwrap();
        let ext = unrouted_host(&node, 86);
        let mut conf = p.conf("1.0.0", &node, Stack::V4);
        conf["ipMasq"] = json!(masquerading);
        let pod = Pod::add_direct(&p, &node, &conf);
        // A second pod keeps the node (and its maps) when the first goes.
        let other = Pod::add_direct(&p, &node, &conf);
        if masquerading {
            udp_echo(&pod.netns, ext.netns(), IpAddr::V4(ext.v4), 0).unwrap();
            assert_eq!(
                dp::map_entries(&node, "ECNI_MASQ_FWD").unwrap().len(),
                1,
                "control: the pod's UDP flow"
            );
        }
        pod.del_direct(&t, &node, &conf);
        let trace = traced.log().unwrap();
        assert!(
            trace.contains("/ECNI_MASQ_FWD\""),
            "control: the DEL opened the flow table; its bpf calls:\n{trace}"
        );
        assert_eq!(
            ebpf_cni_tests::strace::walks(&trace, "ECNI_MASQ_FWD") > 0,
            masquerading,
            "masquerading node: {masquerading}; the DEL's bpf and close calls:\n{trace}"
        );
        if masquerading {
            assert!(
                dp::map_entries(&node, "ECNI_MASQ_FWD").unwrap().is_empty(),
                "the pod's flow goes with it"
            );
        }
        other.del_direct(&p, &node, &conf);
    }
}

/// The source map's entry of a masquerading pod's own address says that the pod
/// masquerades (`SOURCE_PASS_MASQ`), and the pod program decides from that entry, which
/// its source check has just found: it does not look the pod's endpoint up a second time.
/// An extra prefix, and the own address of a pod that does not masquerade, keep
/// `SOURCE_PASS`. Entries written by an earlier release also say `SOURCE_PASS`: CHECK
/// accepts them, and the programs then look the endpoint up.
#[test]
fn a_masquerading_pods_source_entries_say_it_masquerades() {
    use ebpf_cni_maps::{SOURCE_PASS, SOURCE_PASS_MASQ};
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = unrouted_host(&node, 87);
    let mut conf = p.conf("1.0.0", &node, Stack::V4);
    conf["ipMasq"] = json!(true);
    conf["allowedSourcePrefixes"] = json!(["10.99.0.0/16"]);
    let pod = Pod::add_direct(&p, &node, &conf);
    let plain_conf = p.conf("1.0.0", &node, Stack::V4);
    let plain = Pod::add_direct(&p, &node, &plain_conf);
    let entry = |ip: IpAddr, bits: u8| {
        dp::sources(&node)
            .unwrap()
            .into_iter()
            .find(|e| e.prefix == Some((ip, bits)))
            .unwrap_or_else(|| panic!("no source entry for {ip}/{bits}"))
    };
    let set_verdict = |e: &dp::SourceEntry, verdict: u16| {
        let mut value = e.raw_value.clone();
        value[14..16].copy_from_slice(&verdict.to_le_bytes());
        dp::update_raw(&node, dp::SOURCES_MAP, &e.raw_key, &value).unwrap();
    };
    let check = |pod: &Pod, conf: &Value| p.check(&node, &pod.env(&p), conf, &pod.result);
    let (own, plain_own) = (entry(pod.ips()[0], 32), entry(plain.ips()[0], 32));
    assert_eq!(own.verdict, SOURCE_PASS_MASQ, "{own:?}");
    let extra = entry("10.99.0.0".parse().unwrap(), 16);
    assert_eq!(extra.verdict, SOURCE_PASS, "an extra prefix: {extra:?}");
    assert_eq!(plain_own.verdict, SOURCE_PASS, "{plain_own:?}");
    check(&pod, &conf).expect_success("CHECK of the masquerading pod");
    check(&plain, &plain_conf).expect_success("CHECK of the other pod");

    let dst = IpAddr::V4(ext.v4);
    let seen_from = |from: &Pod| {
        udp_echo_with(&from.netns, ext.netns(), dst, 0, Duration::from_secs(3))
            .map(|e| e.client_addr.ip())
    };
    let node_addr = IpAddr::V4(ext.node_v4);
    assert_eq!(seen_from(&pod).unwrap(), node_addr, "the masquerading pod");
    assert!(
        seen_from(&plain).is_err(),
        "control: a pod without ipMasq reached {dst}, which has no route to it"
    );

    // As an earlier release wrote it: CHECK passes, the endpoint decides.
    set_verdict(&own, SOURCE_PASS);
    check(&pod, &conf).expect_success("CHECK of an entry an earlier release wrote");
    assert_eq!(
        seen_from(&pod).unwrap(),
        node_addr,
        "the masquerading pod, its entry as an earlier release wrote it"
    );

    // The entry decides: the other pod's, made to say it masquerades, sends its packets
    // out masqueraded although its endpoint does not; CHECK finds the entry is not ADD's.
    set_verdict(&plain_own, SOURCE_PASS_MASQ);
    let err = check(&plain, &plain_conf).expect_error(105, "CHECK of a tampered entry");
    let text = err.text_lower();
    for w in [
        "source check",
        &format!("{}/32", plain.ips()[0]),
        "verdict 3",
    ] {
        assert!(
            text.contains(w),
            "CHECK's message does not name {w:?}: {err:?}"
        );
    }
    assert_eq!(
        seen_from(&plain).expect("the other pod, its entry saying it masquerades"),
        node_addr,
        "the other pod, its entry saying it masquerades"
    );
    set_verdict(&plain_own, SOURCE_PASS);
    check(&plain, &plain_conf).expect_success("CHECK of the entry put back");

    pod.del_direct(&p, &node, &conf);
    plain.del_direct(&p, &node, &plain_conf);
    assert!(
        dp::sources(&node).unwrap().is_empty(),
        "DEL left source entries"
    );
}

/// DEL finds the pod's endpoint entries by its placement record and removes them by
/// address, with no walk of the endpoint map (a hash: each walk scans all its buckets,
/// whatever it holds). Whether another pod masquerades, which decides whether the node
/// stops masquerading, takes a walk on a masquerading node only: on the others the node's
/// flag already says no pod does.
#[test]
fn del_walks_the_endpoint_map_only_on_a_masquerading_node() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    for masquerading in [false, true] {
        let traced = ebpf_cni_tests::strace::Traced::new(&p.bin, "bpf,close").unwrap();
        let t = PluginUnderTest::at(traced.wrapper.clone());
        let node = Node::new().unwrap();
        let mut conf = p.conf("1.0.0", &node, Stack::V4);
        conf["ipMasq"] = json!(masquerading);
        let pod = Pod::add_direct(&p, &node, &conf);
        let other = Pod::add_direct(&p, &node, &conf);
        pod.del_direct(&t, &node, &conf);
        let trace = traced.log().unwrap();
        assert_eq!(
            ebpf_cni_tests::strace::walks(&trace, "ECNI_ENDPOINTS"),
            usize::from(masquerading),
            "masquerading node: {masquerading}; the DEL's bpf and close calls:\n{trace}"
        );
        assert!(
            dp::map_entries(&node, "ECNI_ENDPOINTS").unwrap().len() == other.ips().len(),
            "the DEL left the other pod's entries alone and removed its own"
        );
        other.del_direct(&p, &node, &conf);
    }
}
