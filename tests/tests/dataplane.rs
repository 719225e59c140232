//! The eBPF dataplane against the real kernel: traffic between pods, and between node
//! devices and pods, is forwarded by ebpf-cni's TC programs (`bpf_redirect_peer` into the
//! pod, FIB lookup + `bpf_redirect_neigh` out of it), not by the node's stack and its
//! netfilter FORWARD chain; the per-pod counters account for it; the node-wide state is
//! pinned under `/sys/fs/bpf/ebpf-cni/v1/netns-<node inode>/` and goes with the last pod;
//! CHECK notices each kind of damage: a program detached, a pin gone, an endpoint entry
//! missing or stale.
//!
//! Every claim is read back from the kernel independently of the plugin (bpftool on the
//! pinned maps, BPF_PROG_QUERY on each device, iptables counters), and every negative
//! check has a positive control next to it, so a test cannot pass by accident.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use ebpf_cni_tests::bpf::{self, Direction, Mechanism, ObjectKind, PinnedObject};
use ebpf_cni_tests::config::{Stack, NETWORK};
use ebpf_cni_tests::dataplane::{self as dp, DirCounts};
use ebpf_cni_tests::external::ExternalHost;
use ebpf_cni_tests::kernel::{self, Family};
use ebpf_cni_tests::net::{self, tcp_echo, tcp_echo_with};
use ebpf_cni_tests::state::{assert_node_clean, eventually, RELEASE_BOUND};
use ebpf_cni_tests::strace::Traced;
use ebpf_cni_tests::{
    fsutil, netfilter, require_root, unique_container_id, Attachment, CniCommand, ListError,
    NetConfList, Netns, Node, PluginUnderTest, Pod,
};
use serde_json::Value;

/// How long a connection that must fail is given (the node drops silently).
const BLOCKED_BOUND: Duration = Duration::from_millis(1500);

fn dual_list(p: &PluginUnderTest, node: &Node) -> NetConfList {
    NetConfList::single(&p.conf("1.0.0", node, Stack::Dual))
}

/// [`dual_list`] with `tcAttachMode` set (`"tcx"`: TCX links on the pods' veths too, where
/// the default puts netlink filters).
fn dual_list_in(p: &PluginUnderTest, node: &Node, mode: &str) -> NetConfList {
    let mut conf = p.conf("1.0.0", node, Stack::Dual);
    conf["tcAttachMode"] = Value::from(mode);
    NetConfList::single(&conf)
}

/// Names of the TCX programs on `dev` in the node, e.g. `["ecni_from_dev"]`.
fn tcx_names(node: &Node, dev: &str) -> Vec<String> {
    sorted_names(bpf::tcx_programs(node.netns(), dev), dev)
}

/// Names of the programs on `dev` in the node, however attached.
fn prog_names(node: &Node, dev: &str) -> Vec<String> {
    sorted_names(bpf::attached_programs(node.netns(), dev), dev)
}

fn sorted_names(progs: anyhow::Result<Vec<bpf::AttachedProg>>, dev: &str) -> Vec<String> {
    let mut v: Vec<String> = progs
        .unwrap_or_else(|e| panic!("listing programs on {dev}: {e:#}"))
        .into_iter()
        .map(|p| p.name)
        .collect();
    v.sort();
    v
}

/// `dev` carries exactly the device program, as an ingress TCX link pinned at
/// `devices/<dev>/link_from_dev`; on a kernel without TCX, as a netlink filter whose
/// program is pinned at `devices/<dev>/netlink_from_dev` as the record.
fn assert_device_program(node: &Node, dev: &str) {
    if bpf::device_mechanism(None) == Mechanism::NetlinkTc {
        let progs = bpf::attached_programs(node.netns(), dev).unwrap();
        assert!(
            progs.len() == 1
                && progs[0].name == dp::PROG_FROM_DEV
                && progs[0].direction == Direction::Ingress
                && progs[0].mechanism == Mechanism::NetlinkTc,
            "node device {dev} must carry exactly {} at ingress as a filter, has {progs:?}",
            dp::PROG_FROM_DEV
        );
        let record = dp::device_link_pin(node, dev).with_file_name(dp::NETLINK_FROM_DEV);
        match bpf::pinned_object(&record) {
            Ok(PinnedObject::Prog { id, .. }) => assert_eq!(id, progs[0].prog_id),
            other => panic!("{} is not a pinned program: {other:?}", record.display()),
        }
        return;
    }
    let progs = bpf::tcx_programs(node.netns(), dev).unwrap();
    assert!(
        progs.len() == 1
            && progs[0].name == dp::PROG_FROM_DEV
            && progs[0].direction == Direction::Ingress
            && progs[0].mechanism == Mechanism::Tcx,
        "node device {dev} must carry exactly {} at ingress (node devices -> pod), \
         has {progs:?}",
        dp::PROG_FROM_DEV
    );
    let pin = dp::device_link_pin(node, dev);
    match bpf::pinned_object(&pin) {
        Ok(PinnedObject::Link(l)) => {
            assert_eq!(
                Some(l.id),
                progs[0].link_id,
                "the link on {dev} is not the one pinned at {}",
                pin.display()
            );
            assert_eq!(
                l.tcx.map(|t| t.0),
                Some(bpf::ifindex_in(node.netns(), dev).unwrap())
            );
        }
        other => panic!("{} is not a pinned link: {other:?}", pin.display()),
    }
}

/// Kernel ids of everything pinned under the node (programs, maps, links).
fn pinned_ids(node: &Node) -> Vec<(ObjectKind, u32, String)> {
    let mut out = Vec::new();
    for f in fsutil::list_files(node.pin_root()).unwrap() {
        let path = node.pin_root().join(&f);
        let what = f.display().to_string();
        match bpf::pinned_object(&path).unwrap_or_else(|e| panic!("{what}: {e:#}")) {
            PinnedObject::Prog { id, .. } => out.push((ObjectKind::Prog, id, what)),
            PinnedObject::Map { id, .. } => out.push((ObjectKind::Map, id, what)),
            PinnedObject::Link(l) => out.push((ObjectKind::Link, l.id, what)),
            PinnedObject::Other(s) => panic!("{what} is an unexpected object: {s}"),
        }
    }
    out
}

/// Sets the node's FORWARD policy to DROP in both families, with a counting rule in front.
fn drop_forwarding(node: &Node) {
    for fam in [Family::V4, Family::V6] {
        netfilter::add_forward_counter(node.netns(), fam).unwrap();
        netfilter::set_forward_policy(node.netns(), fam, "DROP").unwrap();
        assert_eq!(netfilter::forward_packets(node.netns(), fam).unwrap(), 0);
    }
}

fn forwarded(node: &Node) -> (u64, u64) {
    (
        netfilter::forward_packets(node.netns(), Family::V4).unwrap(),
        netfilter::forward_packets(node.netns(), Family::V6).unwrap(),
    )
}

fn echo(from: &Netns, to: &Netns, addr: IpAddr, what: &str) {
    tcp_echo(from, to, addr, 0).unwrap_or_else(|e| panic!("{what}: TCP to {addr}: {e:#}"));
}

fn assert_blocked(from: &Netns, to: &Netns, addr: IpAddr, what: &str) {
    let r = tcp_echo_with(from, to, addr, 0, BLOCKED_BOUND);
    assert!(r.is_err(), "{what}: TCP to {addr} must fail, got {r:?}");
}

/// Datagrams in one burst of [`udp_burst`].
const BURST: u64 = 50;

/// Sends `n` datagrams from `from` to a socket on `to_addr` in `to` and returns how many
/// arrived (the receiver reads only after the burst, so nothing answers meanwhile).
fn udp_burst(from: &Netns, to: &Netns, to_addr: IpAddr, n: u64) -> u64 {
    use std::net::{Ipv4Addr, Ipv6Addr, UdpSocket};
    let rx = to
        .run_in(|| UdpSocket::bind((to_addr, 0)))
        .unwrap()
        .unwrap_or_else(|e| panic!("bind {to_addr}: {e}"));
    let target = rx.local_addr().unwrap();
    from.run_in(|| {
        let any: IpAddr = if to_addr.is_ipv4() {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            Ipv6Addr::UNSPECIFIED.into()
        };
        let tx = UdpSocket::bind((any, 0)).unwrap();
        for i in 0..n {
            tx.send_to(format!("burst {i}").as_bytes(), target).unwrap();
        }
    })
    .unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut buf = [0u8; 64];
    let mut got = 0;
    while got < n && rx.recv_from(&mut buf).is_ok() {
        got += 1;
    }
    got
}

/// The bypass is proven, not assumed: with the node's FORWARD chain dropping everything
/// (and counting it), pod<->pod and uplink<->pod TCP over IPv4 and IPv6 still works, the
/// FORWARD chain sees none of it, and the pods' counters (read with bpftool from the pinned
/// per-CPU map, and through `inspect --json`) account for every segment known to have
/// crossed, and count a burst of datagrams exactly once. Traffic between the node itself
/// and a pod keeps working through the stack. Control: traffic between two external hosts,
/// which does take the node's forwarding path, is blocked and counted by the same chain —
/// and passes once the policy is ACCEPT.
#[test]
fn forwarding_bypasses_netfilter_and_is_counted() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "up0", 77).unwrap();
    let ext2 = ExternalHost::attach(node.netns(), "up1", 78).unwrap();
    let list = dual_list(&p, &node);
    let a = Pod::add(&p, &node, &list, Stack::Dual);
    let b = Pod::add(&p, &node, &list, Stack::Dual);
    // Both uplinks hold global addresses: both get the device program.
    assert_device_program(&node, "up0");
    assert_device_program(&node, "up1");
    drop_forwarding(&node);

    let before = dp::pod_counters(&node).unwrap();
    let (ia, ib) = (a.host_ifindex(&node), b.host_ifindex(&node));
    for i in [ia, ib] {
        assert!(
            before.contains_key(&i),
            "no counters for host veth ifindex {i} after ADD: {before:?}"
        );
    }

    // Each TCP echo, with the counters read before and after it: at least SYN, handshake
    // ACK and data go towards the server, SYN-ACK and the echo towards the client, and each
    // pod of the pair (when it is one) counts them in the matching direction.
    let accounted = |from: &Netns,
                     to: &Netns,
                     addr: IpAddr,
                     what: &str,
                     client: Option<u32>,
                     server: Option<u32>| {
        let c0 = dp::pod_counters(&node).unwrap();
        echo(from, to, addr, what);
        let c1 = dp::pod_counters(&node).unwrap();
        let delta = |i: u32| -> (u64, u64) {
            (
                c1[&i].from_pod.packets - c0[&i].from_pod.packets,
                c1[&i].to_pod.packets - c0[&i].to_pod.packets,
            )
        };
        if let Some(i) = client {
            let (sent, got) = delta(i);
            assert!(
                sent >= 3 && got >= 2,
                "{what} to {addr}: the client pod's counters rose by from_pod {sent} / to_pod \
                 {got}, at least 3 / 2 segments crossed"
            );
        }
        if let Some(i) = server {
            let (sent, got) = delta(i);
            assert!(
                sent >= 2 && got >= 3,
                "{what} to {addr}: the server pod's counters rose by from_pod {sent} / to_pod \
                 {got}, at least 2 / 3 segments crossed"
            );
        }
    };
    for fam in [Family::V4, Family::V6] {
        let ext_addr = ext.addr_like(a.addr(fam));
        let node_addr: IpAddr = match fam {
            Family::V4 => ext.node_v4.into(),
            Family::V6 => ext.node_v6.into(),
        };
        // (client, server, address, what, client pod's ifindex, server pod's ifindex)
        let paths = [
            // FIB lookup + redirect_neigh out of the pod; first, so the node has no
            // neighbour entry for the external host yet and redirect_neigh must resolve it.
            (
                &a.netns,
                ext.netns(),
                ext_addr,
                "pod -> uplink",
                Some(ia),
                None,
            ),
            // redirect_peer from one pod's host veth into the other.
            (
                &a.netns,
                &b.netns,
                b.addr(fam),
                "pod a -> pod b",
                Some(ia),
                Some(ib),
            ),
            (
                &b.netns,
                &a.netns,
                a.addr(fam),
                "pod b -> pod a",
                Some(ib),
                Some(ia),
            ),
            // redirect_peer from the uplink's ingress.
            (
                ext.netns(),
                &a.netns,
                a.addr(fam),
                "uplink -> pod a",
                None,
                Some(ia),
            ),
            (
                ext.netns(),
                &b.netns,
                b.addr(fam),
                "uplink -> pod b",
                None,
                Some(ib),
            ),
            // Node addresses are the stack's: the node's own traffic reaches the pod
            // through the host veth's egress (counted by ecni_to_pod), and a pod reaches
            // the node's uplink address (the FIB says "local": left to the stack).
            (
                node.netns(),
                &b.netns,
                b.addr(fam),
                "node -> pod",
                None,
                Some(ib),
            ),
            (
                &b.netns,
                node.netns(),
                node_addr,
                "pod -> node address",
                Some(ib),
                None,
            ),
        ];
        for (from, to, addr, what, client, server) in paths {
            accounted(from, to, addr, what, client, server);
        }
    }

    // Exact accounting: a burst of datagrams a -> b is counted once on each side (a double
    // count, e.g. by the redirect and again at the veth, would show up as 2x).
    for fam in [Family::V4, Family::V6] {
        let c0 = dp::pod_counters(&node).unwrap();
        let got = udp_burst(&a.netns, &b.netns, b.addr(fam), BURST);
        assert_eq!(got, BURST, "{fam:?}: b received {got} of {BURST} datagrams");
        let c1 = dp::pod_counters(&node).unwrap();
        let sent = c1[&ia].from_pod.packets - c0[&ia].from_pod.packets;
        let delivered = c1[&ib].to_pod.packets - c0[&ib].to_pod.packets;
        // A few neighbour probes may cross meanwhile.
        let range = BURST..=BURST + 6;
        assert!(
            range.contains(&sent) && range.contains(&delivered),
            "{fam:?}: {BURST} datagrams a -> b counted as from_pod {sent} on a, to_pod \
             {delivered} on b"
        );
    }
    assert_eq!(
        forwarded(&node),
        (0, 0),
        "pod traffic crossed the node's FORWARD chain (v4, v6 packets): it was not bypassed"
    );

    let after = dp::pod_counters(&node).unwrap();
    for (pod, i) in [("a", ia), ("b", ib)] {
        let (b0, b1) = (before[&i], after[&i]);
        let (to, from) = (
            b1.to_pod.packets - b0.to_pod.packets,
            b1.from_pod.packets - b0.from_pod.packets,
        );
        // Minimal Ethernet + IPv4 + UDP/TCP frame: 42 bytes.
        assert!(
            b1.to_pod.bytes - b0.to_pod.bytes >= 42 * to
                && b1.from_pod.bytes - b0.from_pod.bytes >= 42 * from,
            "pod {pod}: byte counters do not cover the packets: before {b0:?}, after {b1:?}"
        );
        assert_eq!(
            (b1.to_pod.errors, b1.from_pod.errors),
            (0, 0),
            "pod {pod}: redirect helpers failed: {b1:?}"
        );
    }

    // inspect agrees with the independent read (counters only grow: stray neighbour
    // probes may add a few between the reads).
    let report = dp::inspect(&p.bin, &node).unwrap();
    let later = dp::pod_counters(&node).unwrap();
    for (pod, i) in [(&a, ia), (&b, ib)] {
        let entry = dp::inspect_attachment(&report, pod.id())
            .unwrap_or_else(|| panic!("inspect lists no attachment {}: {report:#}", pod.id()));
        assert_eq!(entry["network"], NETWORK);
        assert_eq!(entry["ifname"], "eth0");
        assert_eq!(entry["host_ifindex"].as_u64(), Some(u64::from(i)));
        let mut addrs: Vec<String> = entry["addresses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect();
        addrs.sort();
        let mut want = vec![pod.v4().to_string(), pod.v6().to_string()];
        want.sort();
        assert_eq!(addrs, want, "inspect's addresses for {}", pod.id());
        let mut hooks: Vec<(&str, &str)> = entry["links"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| (l["program"].as_str().unwrap(), l["hook"].as_str().unwrap()))
            .collect();
        hooks.sort();
        assert_eq!(
            hooks,
            vec![(dp::PROG_FROM_POD, "from_pod"), (dp::PROG_TO_POD, "to_pod")]
        );
        for (dir, lo, hi) in [
            ("from_pod", after[&i].from_pod, later[&i].from_pod),
            ("to_pod", after[&i].to_pod, later[&i].to_pod),
        ] {
            let seen = DirCounts::from_json(&entry[dir])
                .unwrap_or_else(|| panic!("inspect {dir} of {}: {entry:#}", pod.id()));
            assert!(
                seen.at_least(&lo) && hi.at_least(&seen),
                "inspect's {dir} for {} is {seen:?}, bpftool read {lo:?} before and {hi:?} after",
                pod.id()
            );
        }
    }
    let devices: Vec<(&str, &str)> = report["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["name"].as_str().unwrap(),
                d["link"]["program"].as_str().unwrap_or("(no link)"),
            )
        })
        .collect();
    assert_eq!(
        devices,
        vec![("up0", dp::PROG_FROM_DEV), ("up1", dp::PROG_FROM_DEV)]
    );

    // Control: ext -> ext2 is forwarded by the node's stack, so the DROP policy stops it,
    // and the counting rule sees it.
    for fam in [Family::V4, Family::V6] {
        let to = ext2.addr_like(a.addr(fam));
        assert_blocked(
            ext.netns(),
            ext2.netns(),
            to,
            "ext -> ext2 with FORWARD DROP",
        );
    }
    let (f4, f6) = forwarded(&node);
    assert!(
        f4 > 0 && f6 > 0,
        "the FORWARD chain did not count the blocked ext -> ext2 traffic ({f4}, {f6}): \
         its zero count for pod traffic proves nothing"
    );
    for fam in [Family::V4, Family::V6] {
        netfilter::set_forward_policy(node.netns(), fam, "ACCEPT").unwrap();
        let to = ext2.addr_like(a.addr(fam));
        echo(
            ext.netns(),
            ext2.netns(),
            to,
            "ext -> ext2 with FORWARD ACCEPT",
        );
    }
}

/// IPv4 and IPv6, 20 pods all reaching each other, and DEL of one pod leaves the others
/// working. Every ordered pair over both families, then again without the deleted pod,
/// whose addresses then answer nobody (a wildcard listener left in its namespace answered
/// before the DEL) and are gone from the endpoint map.
#[test]
fn twenty_pods_reach_each_other_and_survive_a_del() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let list = dual_list(&p, &node);
    let pods: Vec<Pod> = (0..20)
        .map(|_| Pod::add(&p, &node, &list, Stack::Dual))
        .collect();
    let eps = dp::endpoints(&node).unwrap();
    assert_eq!(eps.len(), 40, "one endpoint per pod address: {eps:?}");
    for pod in &pods {
        for fam in [Family::V4, Family::V6] {
            let e = eps[&pod.addr(fam)];
            assert_eq!(
                (
                    e.host_ifindex,
                    dp::format_mac(&e.host_mac),
                    dp::format_mac(&e.pod_mac)
                ),
                (
                    pod.host_ifindex(&node),
                    pod.r.host_mac.to_lowercase(),
                    pod.r.container_mac.to_lowercase()
                ),
                "endpoint of {} (host ifindex, host MAC, pod MAC)",
                pod.addr(fam)
            );
        }
    }

    // Every ordered pair, both families: a server on each pod address (bound to that exact
    // address, so it proves where the address lives), each pod a client of all the others.
    let mesh = |alive: &[&Pod]| {
        let mut servers = Vec::new();
        for pod in alive {
            for fam in [Family::V4, Family::V6] {
                let server = net::EchoServer::start(&pod.netns, pod.addr(fam)).unwrap();
                servers.push((pod.id(), server));
            }
        }
        let mut failed = Vec::new();
        for from in alive {
            let targets: Vec<SocketAddr> = servers
                .iter()
                .filter(|(id, _)| *id != from.id())
                .map(|(_, s)| s.addr())
                .collect();
            assert_eq!(targets.len(), 2 * (alive.len() - 1));
            for (to, why) in net::echo_each(&from.netns, &targets).unwrap() {
                failed.push(format!("{} -> {to}: {why}", from.v4()));
            }
        }
        assert!(
            failed.is_empty(),
            "{} of {} pod -> pod connections failed:\n  {}",
            failed.len(),
            alive.len() * (alive.len() - 1) * 2,
            failed.join("\n  ")
        );
    };
    let all: Vec<&Pod> = pods.iter().collect();
    mesh(&all);

    let gone = &pods[7];
    let listener = net::tcp_listen_any(&gone.netns).unwrap();
    let port = listener.local_addr().unwrap().port();
    let witness = &pods[3];
    for fam in [Family::V4, Family::V6] {
        let target = SocketAddr::new(gone.addr(fam), port);
        net::tcp_connect(&witness.netns, target, Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("control: the listener must answer before DEL: {e:#}"));
    }

    gone.del(&p, &node, &list);
    let eps = dp::endpoints(&node).unwrap();
    assert_eq!(eps.len(), 38, "endpoints after one DEL: {eps:?}");
    for fam in [Family::V4, Family::V6] {
        assert!(
            !eps.contains_key(&gone.addr(fam)),
            "DEL left {}'s endpoint",
            gone.addr(fam)
        );
    }
    let rest: Vec<&Pod> = pods.iter().filter(|q| q.id() != gone.id()).collect();
    // All at once: an IPv6 SYN towards a missing route only times out (TCP treats ICMPv6
    // "no route" as a soft error, RFC 6069), which would cost 0.5 s per pod in sequence.
    let answered: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = rest
            .iter()
            .flat_map(|from| [Family::V4, Family::V6].map(|fam| (from, fam)))
            .map(|(from, fam)| {
                s.spawn(move || {
                    let target = SocketAddr::new(gone.addr(fam), port);
                    net::tcp_connect(&from.netns, target, Duration::from_millis(500))
                        .ok()
                        .map(|()| format!("{} -> {target}", from.v4()))
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().expect("connect thread"))
            .collect()
    });
    assert!(
        answered.is_empty(),
        "the deleted pod's addresses still answer: {answered:?}"
    );
    mesh(&rest);
    drop(listener);
}

/// After DEL of every pod nothing of the pods remains pinned or attached (bpffs and the
/// attached programs listed). The shared state (programs, maps, device links) stays while
/// any pod does; with the last DEL the node's pin directory is gone, no program is attached
/// to any node device, and the kernel has released every program, map and link that was
/// pinned. A later ADD loads everything again and works; a repeated DEL on the empty node
/// recreates nothing.
#[test]
fn nothing_left_after_the_last_del_and_add_works_again() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "up0", 77).unwrap();
    // Every object pinned as a link here (the default's netlink filters: see
    // `netlink_filters_on_pods_run_the_same_dataplane`); filters everywhere on a kernel
    // without TCX, whose records are pinned programs.
    let (mode, links) = if bpf::kernel_has_tcx() {
        ("tcx", 7)
    } else {
        ("netlink", 0)
    };
    let list = dual_list_in(&p, &node, mode);
    let pods: Vec<Pod> = (0..3)
        .map(|_| Pod::add(&p, &node, &list, Stack::Dual))
        .collect();
    assert_device_program(&node, "up0");
    let ids = pinned_ids(&node);
    let pinned = |k: ObjectKind| -> Vec<String> {
        let mut v: Vec<String> = ids
            .iter()
            .filter(|(kind, _, _)| *kind == k)
            .map(|(_, _, f)| f.rsplit('/').next().unwrap_or_default().to_owned())
            .collect();
        v.sort();
        v
    };
    // The contract's pieces (further maps, e.g. for tracing, may come with newer revisions).
    let progs = pinned(ObjectKind::Prog);
    let maps = pinned(ObjectKind::Map);
    for name in [dp::PROG_FROM_DEV, dp::PROG_FROM_POD, dp::PROG_TO_POD] {
        assert!(
            progs.iter().any(|p| p == name),
            "{name} not pinned: {ids:?}"
        );
    }
    for name in [dp::ENDPOINTS_MAP, dp::POD_COUNTERS_MAP] {
        assert!(maps.iter().any(|m| m == name), "{name} not pinned: {ids:?}");
    }
    assert_eq!(
        pinned(ObjectKind::Link).len(),
        links,
        "2 links per pod and 1 device link pinned in {mode} mode: {ids:?}"
    );

    // The node's programs (in netlink mode `progs` also holds the filters' records).
    let node_programs = dp::pinned_programs(&node).len();
    for (i, pod) in pods.iter().enumerate() {
        pod.del(&p, &node, &list);
        if i + 1 < pods.len() {
            // Shared state stays while pods remain, and keeps working.
            assert_eq!(
                dp::pinned_programs(&node).len(),
                node_programs,
                "after DEL {i}"
            );
            assert_device_program(&node, "up0");
            let next = &pods[i + 1];
            echo(
                ext.netns(),
                &next.netns,
                next.v4(),
                "uplink -> remaining pod",
            );
        }
    }
    assert_node_clean(&node, "after the last DEL");
    let mut alive = Vec::new();
    let released = eventually(RELEASE_BOUND, || {
        alive = ids
            .iter()
            .filter(|(k, id, _)| bpf::object_exists(*k, *id).unwrap())
            .cloned()
            .collect();
        alive.is_empty()
    });
    assert!(
        released,
        "objects still held by the kernel after the last DEL: {alive:?}"
    );

    // inspect on the empty node: nothing to report, and it creates nothing.
    let report = dp::inspect(&p.bin, &node).unwrap();
    for list in ["attachments", "devices"] {
        assert_eq!(
            report[list].as_array().map(Vec::len),
            Some(0),
            "inspect of an empty node: {report:#}"
        );
    }
    assert!(!node.pin_root().exists(), "inspect created pins");

    // DEL again on an empty node: succeeds, recreates nothing.
    pods[0].del(&p, &node, &list);
    assert!(!node.pin_root().exists(), "a repeated DEL recreated pins");

    let again = Pod::add(&p, &node, &list, Stack::Dual);
    assert_eq!(
        dp::pinned_programs(&node).len(),
        node_programs,
        "programs reloaded"
    );
    assert_device_program(&node, "up0");
    let progs = prog_names(&node, &again.r.host_ifname);
    assert_eq!(progs, vec![dp::PROG_FROM_POD, dp::PROG_TO_POD]);
    drop_forwarding(&node);
    for fam in [Family::V4, Family::V6] {
        echo(
            ext.netns(),
            &again.netns,
            again.addr(fam),
            "uplink -> new pod",
        );
    }
    assert_eq!(forwarded(&node), (0, 0));
    again.del(&p, &node, &list);
    assert_node_clean(&node, "after DEL of the re-added pod");
}

/// CHECK's expected failure: code 105 with a message naming each of `words`.
fn assert_check_fails(
    p: &PluginUnderTest,
    node: &Node,
    list: &NetConfList,
    pod: &Pod,
    words: &[&str],
    what: &str,
) {
    match p.runtime.check(node, list, &pod.att, &pod.result) {
        Ok(()) => panic!("{what}: CHECK succeeded"),
        Err(ListError::Plugin { output, .. }) => {
            let err = output.expect_error(105, what);
            let text = err.text_lower();
            for w in words {
                assert!(
                    text.contains(&w.to_lowercase()),
                    "{what}: CHECK's message does not name {w:?}: {err:?}"
                );
            }
        }
        Err(e) => panic!("{what}: {e}"),
    }
}

fn assert_check_ok(p: &PluginUnderTest, node: &Node, list: &NetConfList, pod: &Pod, what: &str) {
    p.runtime
        .check(node, list, &pod.att, &pod.result)
        .unwrap_or_else(|e| panic!("{what}: CHECK must succeed: {e}"));
}

fn pinned_link_id(path: &Path) -> u32 {
    match bpf::pinned_object(path) {
        Ok(PinnedObject::Link(l)) => l.id,
        other => panic!("{} is not a pinned link: {other:?}", path.display()),
    }
}

/// CHECK fails, naming the missing piece, when a program is detached, a link pin is gone,
/// or the endpoint entry is missing or stale (wrong ifindex/MAC). One pod per kind of
/// damage, done from outside the plugin (rm, bpftool); an untouched pod keeps passing, a
/// repaired entry passes again, and DEL still removes everything.
#[test]
fn check_names_each_kind_of_damage() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    // Links and their pins are TCX's; the default's netlink filters: see
    // `netlink_filters_on_pods_run_the_same_dataplane`.
    let list = dual_list_in(&p, &node, "tcx");
    let pods: Vec<Pod> = (0..6)
        .map(|_| Pod::add(&p, &node, &list, Stack::Dual))
        .collect();
    for pod in &pods {
        assert_check_ok(&p, &node, &list, pod, "right after ADD");
    }
    let [unpinned, detached, missing, wrong_ifindex, wrong_mac, witness] = &pods[..] else {
        unreachable!()
    };
    let pin_dir = |pod: &Pod| node.attachment_pin_dir(NETWORK, pod.id(), "eth0");

    // A link pin is gone: removing the pin also detaches the program.
    std::fs::remove_file(pin_dir(unpinned).join(dp::LINK_FROM_POD)).unwrap();
    assert!(
        eventually(RELEASE_BOUND, || tcx_names(&node, &unpinned.r.host_ifname)
            == vec![dp::PROG_TO_POD]),
        "removing the pin did not detach ecni_from_pod: {:?}",
        tcx_names(&node, &unpinned.r.host_ifname)
    );
    assert_check_fails(
        &p,
        &node,
        &list,
        unpinned,
        &[dp::LINK_FROM_POD],
        "link_from_pod pin removed",
    );

    // A program detached while its pin remains.
    let pin = pin_dir(detached).join(dp::LINK_TO_POD);
    dp::detach_link(pinned_link_id(&pin)).unwrap();
    assert!(pin.exists(), "bpftool link detach removed the pin");
    assert_eq!(
        tcx_names(&node, &detached.r.host_ifname),
        vec![dp::PROG_FROM_POD],
        "bpftool link detach left ecni_to_pod attached"
    );
    assert_check_fails(
        &p,
        &node,
        &list,
        detached,
        &["to_pod", "attached"],
        "link_to_pod detached, pin kept",
    );

    // The endpoint entry of one address is missing.
    dp::delete_endpoint(&node, missing.v6()).unwrap();
    assert_check_fails(
        &p,
        &node,
        &list,
        missing,
        &["endpoint", &missing.v6().to_string()],
        "IPv6 endpoint entry deleted",
    );

    // Stale entries: another pod's ifindex, a wrong pod MAC, a wrong host MAC. Each time the
    // original value written back passes again: CHECK reads the live entry.
    let eps = dp::endpoints(&node).unwrap();
    let orig = eps[&wrong_ifindex.v4()];
    let mut bad = orig;
    bad.host_ifindex = witness.host_ifindex(&node);
    dp::update_endpoint(&node, wrong_ifindex.v4(), &bad.encode()).unwrap();
    assert_check_fails(
        &p,
        &node,
        &list,
        wrong_ifindex,
        &["ifindex", &wrong_ifindex.v4().to_string()],
        "IPv4 endpoint entry with another pod's ifindex",
    );
    dp::update_endpoint(&node, wrong_ifindex.v4(), &orig.raw).unwrap();
    assert_check_ok(&p, &node, &list, wrong_ifindex, "ifindex entry restored");

    let orig = eps[&wrong_mac.v6()];
    assert_eq!(dp::format_mac(&orig.pod_mac), wrong_mac.r.container_mac);
    assert_eq!(dp::format_mac(&orig.host_mac), wrong_mac.r.host_mac);
    for (field, patch) in [
        (
            "pod mac",
            (|e: &mut dp::Endpoint| e.pod_mac[5] ^= 0xff) as fn(&mut dp::Endpoint),
        ),
        ("host mac", |e: &mut dp::Endpoint| e.host_mac[5] ^= 0xff),
    ] {
        let mut bad = orig;
        patch(&mut bad);
        dp::update_endpoint(&node, wrong_mac.v6(), &bad.encode()).unwrap();
        assert_check_fails(
            &p,
            &node,
            &list,
            wrong_mac,
            &[field, &wrong_mac.v6().to_string()],
            &format!("IPv6 endpoint entry with a wrong {field}"),
        );
        dp::update_endpoint(&node, wrong_mac.v6(), &orig.raw).unwrap();
        assert_check_ok(&p, &node, &list, wrong_mac, "MAC entry restored");
    }

    assert_check_ok(&p, &node, &list, witness, "the untouched pod");
    for pod in &pods {
        pod.del(&p, &node, &list);
    }
    assert_node_clean(&node, "DEL after tampering");
}

/// Device coverage is re-evaluated at each ADD, so a device that appears later is covered,
/// and a `devices` list in the config restricts it. Traffic from behind a device reaches
/// pods with FORWARD dropping only when that device carries the program.
#[test]
fn device_programs_follow_the_node_devices_and_the_config() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();

    // Default: every device with a global address that is not a pod veth.
    let node = Node::new().unwrap();
    let _ext = ExternalHost::attach(node.netns(), "up0", 77).unwrap();
    let list = dual_list(&p, &node);
    let first = Pod::add(&p, &node, &list, Stack::Dual);
    assert_device_program(&node, "up0");
    assert_eq!(
        prog_names(&node, &first.r.host_ifname),
        vec![dp::PROG_FROM_POD, dp::PROG_TO_POD],
        "a pod veth is not a node device"
    );
    assert!(prog_names(&node, "lo").is_empty());

    let late = ExternalHost::attach(node.netns(), "up1", 78).unwrap();
    drop_forwarding(&node);
    assert!(prog_names(&node, "up1").is_empty());
    // Control: before the next ADD, traffic from behind up1 takes the stack and is dropped.
    assert_blocked(
        late.netns(),
        &first.netns,
        first.v4(),
        "up1 before the next ADD",
    );

    let second = Pod::add(&p, &node, &list, Stack::Dual);
    assert_device_program(&node, "up1");
    assert_device_program(&node, "up0");
    for pod in [&first, &second] {
        for fam in [Family::V4, Family::V6] {
            echo(
                late.netns(),
                &pod.netns,
                pod.addr(fam),
                "behind the late device -> pod",
            );
        }
    }
    first.del(&p, &node, &list);
    second.del(&p, &node, &list);
    assert_node_clean(&node, "after DEL");

    // `devices: ["up1"]`: only up1, although up0 has a global address too.
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "up0", 77).unwrap();
    let ext2 = ExternalHost::attach(node.netns(), "up1", 78).unwrap();
    let mut conf = p.conf("1.0.0", &node, Stack::Dual);
    conf["devices"] = serde_json::json!(["up1"]);
    let list = NetConfList::single(&conf);
    let pod = Pod::add(&p, &node, &list, Stack::Dual);
    assert_device_program(&node, "up1");
    assert!(
        prog_names(&node, "up0").is_empty(),
        "up0 is not in devices but got {:?}",
        prog_names(&node, "up0")
    );
    let dirs = std::fs::read_dir(node.pin_root().join(dp::DEVICES_DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect::<Vec<_>>();
    assert_eq!(dirs, vec!["up1"]);
    drop_forwarding(&node);
    for fam in [Family::V4, Family::V6] {
        echo(
            ext2.netns(),
            &pod.netns,
            pod.addr(fam),
            "behind a listed device -> pod",
        );
    }
    assert_blocked(
        ext.netns(),
        &pod.netns,
        pod.v4(),
        "behind an unlisted device",
    );
    pod.del(&p, &node, &list);
    assert_node_clean(&node, "after DEL (devices list)");
}

/// The fast path decrements the TTL / hop limit exactly once per pass through the node, pod
/// -> pod, uplink -> pod and pod -> uplink, IPv4 and IPv6 — and leave an expiring TTL to
/// the stack (which answers with ICMP time exceeded and delivers nothing). With FORWARD
/// dropping, so this is the eBPF path.
#[test]
fn ttl_is_decremented_once_and_expiry_left_to_the_stack() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "up0", 77).unwrap();
    let list = dual_list(&p, &node);
    let a = Pod::add(&p, &node, &list, Stack::Dual);
    let b = Pod::add(&p, &node, &list, Stack::Dual);
    drop_forwarding(&node);
    let bound = Duration::from_secs(3);
    for fam in [Family::V4, Family::V6] {
        let ext_addr = ext.addr_like(a.addr(fam));
        for (from, to, addr, what) in [
            (&a.netns, &b.netns, b.addr(fam), "pod -> pod"),
            (ext.netns(), &a.netns, a.addr(fam), "uplink -> pod"),
            (&a.netns, ext.netns(), ext_addr, "pod -> uplink"),
        ] {
            for sent in [64u8, 2] {
                let got = net::udp_received_ttl(from, to, addr, sent, bound).unwrap();
                assert_eq!(
                    got,
                    Some(sent - 1),
                    "{what} ({fam:?}): sent with TTL {sent}, received {got:?}"
                );
            }
        }
        let got = net::udp_received_ttl(&a.netns, &b.netns, b.addr(fam), 1, Duration::from_secs(1))
            .unwrap();
        assert_eq!(got, None, "pod -> pod ({fam:?}) with TTL 1 was delivered");
    }
    assert_eq!(forwarded(&node), (0, 0), "datagrams crossed FORWARD");
}

/// The endpoint map is keyed by address alone, so a second network whose subnet overlaps
/// the first on one node would silently take over the first pod's address. ADD refuses it
/// (code 7, naming the address) and rolls back completely; the first pod keeps working.
#[test]
fn overlapping_networks_on_one_node_are_refused() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let (pod_a, pod_b) = (node.new_pod().unwrap(), node.new_pod().unwrap());
    let conf_a = p.conf("1.0.0", &node, Stack::V4);
    let env_a = p.env(&unique_container_id(), pod_a.path(), "eth0");
    p.run(&node, CniCommand::Add, &env_a, conf_a.to_string())
        .expect_success("ADD on the first network");

    // Same subnet, other network name, its own IPAM directory: host-local hands out the
    // same first address again.
    let mut conf_b = conf_a.clone();
    conf_b["name"] = Value::from("othernet");
    conf_b["ipam"]["dataDir"] =
        Value::from(node.scratch_dir().join("ipam-b").display().to_string());
    let before = node.snapshot(Some(&pod_b));
    let env_b = p.env(&unique_container_id(), pod_b.path(), "eth0");
    let out = p.run(&node, CniCommand::Add, &env_b, conf_b.to_string());
    let err = out.expect_error(7, "ADD on an overlapping network");
    assert!(
        err.msg.contains("10.10.0.2") && err.msg.contains("already used"),
        "{err:?}"
    );
    let after = node.snapshot(Some(&pod_b));
    assert_eq!(
        after.node_links, before.node_links,
        "no host veth left behind"
    );
    assert_eq!(
        after.pod_links, before.pod_links,
        "no pod interface left behind"
    );
    let leases_b: Vec<_> = fsutil::list_files(&node.scratch_dir().join("ipam-b"))
        .unwrap_or_default()
        .into_iter()
        .filter(|f| {
            f.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("10."))
        })
        .collect();
    assert!(
        leases_b.is_empty(),
        "the refused ADD's lease was released: {leases_b:?}"
    );

    // The first pod still owns its address in the dataplane and answers from the node.
    let a = dp::endpoints(&node).unwrap();
    let ip: IpAddr = "10.10.0.2".parse().unwrap();
    assert!(a.contains_key(&ip), "entry of the first pod kept: {a:?}");
    tcp_echo(node.netns(), &pod_a, ip, 0).expect("node -> first pod still works");
    p.run(&node, CniCommand::Del, &env_a, conf_a.to_string())
        .expect_success("DEL on the first network");
    p.run(&node, CniCommand::Del, &env_b, conf_b.to_string())
        .expect_success("DEL of the refused attachment is a no-op");
}

/// Netlink clsact filters where TCX is missing, a config that forces that mode so it is
/// tested, and ADD p50 ≤ 10 ms with the programs attached, which TCX cannot give (two RCU
/// grace periods per hook under the RTNL lock). By default the pods' veths carry netlink
/// `bpf` filters and the node's device a TCX link; with `tcAttachMode: netlink` the device
/// gets a filter too. Either way no TCX attachment appears on a pod, forwarding still
/// bypasses netfilter, `inspect` reports the filters and notices a removed one, CHECK names
/// it, and the last DEL leaves no program on the device and nothing pinned.
#[test]
fn netlink_filters_on_pods_run_the_same_dataplane() {
    require_root();
    for mode in [None, Some("netlink")] {
        netlink_filters_on_pods(mode);
    }
}

fn netlink_filters_on_pods(mode: Option<&str>) {
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "up0", 77).unwrap();
    let list = match mode {
        Some(m) => dual_list_in(&p, &node, m),
        None => dual_list(&p, &node),
    };
    let a = Pod::add(&p, &node, &list, Stack::Dual);
    let b = Pod::add(&p, &node, &list, Stack::Dual);
    drop_forwarding(&node);

    let dev_mechanism = bpf::device_mechanism(mode);
    for (dev, names, mechanism) in [
        (
            a.r.host_ifname.as_str(),
            &[dp::PROG_FROM_POD, dp::PROG_TO_POD][..],
            Mechanism::NetlinkTc,
        ),
        ("up0", &[dp::PROG_FROM_DEV][..], dev_mechanism),
    ] {
        let progs = bpf::attached_programs(node.netns(), dev).unwrap();
        let mut got: Vec<(&str, Mechanism)> = progs
            .iter()
            .map(|q| (q.name.as_str(), q.mechanism))
            .collect();
        got.sort();
        let want: Vec<(&str, Mechanism)> = names.iter().map(|n| (*n, mechanism)).collect();
        assert_eq!(got, want, "{dev} ({mode:?}): {progs:?}");
    }
    echo(&a.netns, &b.netns, b.v4(), "pod a -> pod b v4");
    echo(&a.netns, &b.netns, b.v6(), "pod a -> pod b v6");
    echo(ext.netns(), &a.netns, a.v4(), "uplink -> pod a");
    for fam in [Family::V4, Family::V6] {
        assert_eq!(
            netfilter::forward_packets(node.netns(), fam).unwrap(),
            0,
            "{fam:?} crossed FORWARD ({mode:?})"
        );
    }

    let inspect_links = || -> Vec<(String, String, bool)> {
        let report = dp::inspect(&p.bin, &node).unwrap();
        let entry = dp::inspect_attachment(&report, a.id())
            .cloned()
            .unwrap_or_else(|| panic!("inspect lists no {}: {report:#}", a.id()));
        let mut v: Vec<(String, String, bool)> = entry["links"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    l["program"].as_str().unwrap().to_owned(),
                    l["mode"].as_str().unwrap().to_owned(),
                    l["attached"].as_bool().unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let link = |prog: &str, attached: bool| (prog.to_owned(), "netlink".to_owned(), attached);
    assert_eq!(
        inspect_links(),
        vec![link(dp::PROG_FROM_POD, true), link(dp::PROG_TO_POD, true)]
    );

    let check = |pod: &Pod| p.runtime.check(&node, &list, &pod.att, &pod.result);
    check(&a).unwrap_or_else(|e| panic!("CHECK a: {e}"));
    node.netns()
        .exec(&["tc", "filter", "del", "dev", &a.r.host_ifname, "egress"])
        .unwrap();
    let err = check(&a).expect_err("CHECK after removing the egress filter");
    assert!(err.to_string().contains(dp::PROG_TO_POD), "{err}");
    assert_eq!(
        inspect_links(),
        vec![link(dp::PROG_FROM_POD, true), link(dp::PROG_TO_POD, false)],
        "inspect after removing the egress filter"
    );
    check(&b).unwrap_or_else(|e| panic!("CHECK b: {e}"));

    for pod in [&a, &b] {
        p.runtime
            .del(&node, &list, &pod.att, Some(&pod.result))
            .unwrap_or_else(|e| panic!("DEL: {e}"));
    }
    assert!(
        bpf::attached_programs(node.netns(), "up0")
            .unwrap()
            .is_empty(),
        "the device program outlived the last pod ({mode:?})"
    );
    assert!(
        !node.pin_root().exists(),
        "pins left after the last DEL ({mode:?})"
    );
}

/// Netlink mode (what kernels before 6.6 get for node devices in `auto` mode too): the
/// last DEL (or GC) removes the `clsact` qdisc ebpf-cni added to a node device, and only
/// that one.
/// A `clsact` that was there before the first ADD stays (someone else's, even empty), and
/// so does ebpf-cni's own when another tc user's filter sits on it by then.
#[test]
fn netlink_mode_removes_only_its_own_clsact_on_node_devices() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let tc = |node: &Node, args: &[&str]| {
        // nsenter, not `ip netns exec`: tc must see the host bpffs to open a pin.
        let out = node.netns().nsenter(&[&["tc"], args].concat()).unwrap();
        assert!(
            out.status.success(),
            "tc {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // The pods' host veths carry a clsact of their own, which goes with them.
    let clsact = |node: &Node| -> bool {
        kernel::clsact_links(node.netns())
            .unwrap()
            .iter()
            .any(|l| l == "up0")
    };
    let one_pod_and_del = |node: &Node, between: &dyn Fn()| {
        let list = dual_list_in(&p, node, "netlink");
        let pod = Pod::add(&p, node, &list, Stack::Dual);
        assert_eq!(prog_names(node, "up0"), vec![dp::PROG_FROM_DEV.to_owned()]);
        assert!(clsact(node), "no clsact on up0 after ADD");
        between();
        pod.del(&p, node, &list);
        assert!(
            !node.pin_root().exists(),
            "pins left after the last DEL: {:?}",
            fsutil::list_files(node.pin_root())
        );
    };

    // (a) ebpf-cni's own clsact goes with the last pod.
    let node = Node::new().unwrap();
    let _ext = ExternalHost::attach(node.netns(), "up0", 77).unwrap();
    assert!(!clsact(&node), "a fresh node has no clsact");
    one_pod_and_del(&node, &|| {});
    assert_node_clean(&node, "netlink mode, after the last DEL");
    drop((_ext, node));

    // (a') GC of the last pod goes through the same teardown.
    let node = Node::new().unwrap();
    let _ext = ExternalHost::attach(node.netns(), "up0", 77).unwrap();
    let mut conf = p.conf("1.1.0", &node, Stack::Dual);
    conf["tcAttachMode"] = Value::from("netlink");
    let list = NetConfList::single(&conf);
    let _pod = Pod::add(&p, &node, &list, Stack::Dual);
    assert!(clsact(&node), "no clsact on up0 after ADD");
    p.runtime
        .gc(&node, &list, &[])
        .unwrap_or_else(|e| panic!("GC: {e}"));
    assert_node_clean(&node, "netlink mode, after GC of the last pod");
    drop((_pod, _ext, node));

    // (b) A clsact that was there before the first ADD is someone else's: it stays.
    let node = Node::new().unwrap();
    let _ext = ExternalHost::attach(node.netns(), "up0", 77).unwrap();
    tc(&node, &["qdisc", "add", "dev", "up0", "clsact"]);
    one_pod_and_del(&node, &|| {});
    assert!(clsact(&node), "the pre-existing clsact of up0 was removed");
    assert!(prog_names(&node, "up0").is_empty(), "device filter left");
    drop((_ext, node));

    // (c) Another tc user's filter on ebpf-cni's clsact keeps the qdisc and the filter.
    let node = Node::new().unwrap();
    let _ext = ExternalHost::attach(node.netns(), "up0", 77).unwrap();
    let foreign = std::path::PathBuf::from(format!(
        "/sys/fs/bpf/ecni-test-foreign-{}",
        unique_container_id()
    ));
    let foreign_id = std::cell::Cell::new(0);
    one_pod_and_del(&node, &|| {
        foreign_id.set(bpf::fixture::pin_tc_prog(&foreign).unwrap());
        let pinned = foreign.to_string_lossy();
        tc(
            &node,
            &[
                "filter",
                "add",
                "dev",
                "up0",
                "egress",
                "bpf",
                "da",
                "object-pinned",
                &pinned,
            ],
        );
        // The filter holds the program now.
        std::fs::remove_file(&foreign).unwrap();
    });
    assert!(
        clsact(&node),
        "the clsact holding another tc user's filter was removed"
    );
    let left: Vec<u32> = bpf::attached_programs(node.netns(), "up0")
        .unwrap()
        .iter()
        .map(|q| q.prog_id)
        .collect();
    assert_eq!(
        left,
        vec![foreign_id.get()],
        "only the foreign filter stays on up0"
    );
}

/// `ebpf-cni trace` streams the programs' decisions while it runs, and the programs log
/// nothing once it has stopped (the trace flag is cleared).
#[test]
fn trace_streams_decisions_only_while_it_runs() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let list = dual_list(&p, &node);
    let a = Pod::add(&p, &node, &list, Stack::Dual);
    let b = Pod::add(&p, &node, &list, Stack::Dual);
    let child = std::process::Command::new(&p.bin)
        .env_remove("CNI_COMMAND")
        .args(["trace", "--seconds", "3", "--netns"])
        .arg(node.netns().path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    echo(&a.netns, &b.netns, b.v4(), "traffic while tracing");
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "trace failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!(
            "redirect_peer to pod behind if {}",
            b.host_ifindex(&node)
        )),
        "no redirect line for pod b in the trace:\n{text}"
    );
    let flag = dp::map_entries(&node, dp::TRACE_MAP).unwrap();
    let value = &flag[0]["value"];
    assert!(
        value
            .as_array()
            .is_some_and(|v| v.iter().all(|b| b.as_str() == Some("0x00"))),
        "trace flag still set after the trace ended: {flag:?}"
    );
    for pod in [&a, &b] {
        p.runtime
            .del(&node, &list, &pod.att, Some(&pod.result))
            .unwrap();
    }
}

/// A pod without an IPv6 address gets a host veth with IPv6 turned off (no link-local
/// address, no per-device IPv6 routes whose upkeep grows with the node's pods), and
/// IPv4 still works both ways; a dual-stack pod's host veth keeps IPv6.
#[test]
fn ipv4_only_pods_have_no_ipv6_on_the_host_veth() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let v4 = NetConfList::single(&p.conf("1.0.0", &node, Stack::V4));
    let (a, b) = (
        Pod::add(&p, &node, &v4, Stack::V4),
        Pod::add(&p, &node, &v4, Stack::V4),
    );
    for pod in [&a, &b] {
        let host = &pod.r.host_ifname;
        let key = format!("net.ipv6.conf.{host}.disable_ipv6");
        assert_eq!(node.netns().sysctl(&key).unwrap(), "1", "{key}");
        let out = node
            .netns()
            .exec(&["ip", "-6", "-o", "addr", "show", "dev", host])
            .unwrap();
        assert!(
            out.status.success() && out.stdout.is_empty(),
            "IPv6 addresses on {host}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    echo(
        &a.netns,
        &b.netns,
        b.v4(),
        "pod a -> pod b (IPv4-only pods)",
    );
    echo(
        node.netns(),
        &a.netns,
        a.v4(),
        "node -> pod a (IPv4-only pod)",
    );

    let dual = Pod::add(&p, &node, &dual_list(&p, &node), Stack::Dual);
    let key = format!("net.ipv6.conf.{}.disable_ipv6", dual.r.host_ifname);
    assert_eq!(node.netns().sysctl(&key).unwrap(), "0", "{key}");
    echo(
        node.netns(),
        &dual.netns,
        dual.v6(),
        "node -> dual-stack pod v6",
    );
    dual.del(&p, &node, &dual_list(&p, &node));
    for pod in [&a, &b] {
        pod.del(&p, &node, &v4);
    }
}

/// The `<ifname> <address>/<prefix>` entries of `ip` in the node (see `NodeSnapshot`).
fn holders_of(node: &Node, ip: IpAddr) -> Vec<String> {
    let want = ip.to_string();
    kernel::addrs(node.netns())
        .unwrap()
        .into_iter()
        .flat_map(|l| {
            l.addr_info
                .iter()
                .filter(|a| a.local == want)
                .map(|a| format!("{} {}/{}", l.ifname, a.local, a.prefixlen))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The container ids `inspect` lists as users of gateway `gw`.
fn gateway_users(
    p: &PluginUnderTest,
    node: &Node,
    gw: IpAddr,
) -> std::collections::BTreeSet<String> {
    let report = dp::inspect(&p.bin, node).unwrap();
    let gws = report["gateways"]
        .as_array()
        .expect("inspect lists gateways");
    let g = gws
        .iter()
        .find(|g| g["address"].as_str() == Some(gw.to_string().as_str()))
        .unwrap_or_else(|| panic!("inspect does not list {gw}: {gws:?}"));
    g["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u.as_str().unwrap().split('/').nth(1).unwrap().to_owned())
        .collect()
}

/// The node holds a pod network's IPv4 gateway once, on `lo`, not on every host veth (the
/// kernel's per-device address and local-route lists no longer grow with the pods), and
/// `ecni_from_pod` answers the pods' ARP requests for it. The node here runs with
/// `arp_ignore = 2`, under which the kernel answers only for addresses of the receiving
/// device: the host veths hold none, so every packet a pod sends proves the programs'
/// answer. The gateway stays while a pod uses it and leaves with the last one; CHECK names
/// it when it is gone.
#[test]
fn ipv4_gateway_is_held_once_on_lo_and_answered_by_the_programs() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let out = node
        .netns()
        .exec(&[
            "sh",
            "-c",
            "echo 2 > /proc/sys/net/ipv4/conf/all/arp_ignore && \
             echo 2 > /proc/sys/net/ipv4/conf/default/arp_ignore",
        ])
        .unwrap();
    assert!(out.status.success(), "setting arp_ignore: {out:?}");
    let v4 = NetConfList::single(&p.conf("1.0.0", &node, Stack::V4));
    let (a, b) = (
        Pod::add(&p, &node, &v4, Stack::V4),
        Pod::add(&p, &node, &v4, Stack::V4),
    );
    let gw =
        a.r.ip4()
            .unwrap()
            .gateway
            .expect("the result names a gateway");
    assert_eq!(b.r.ip4().unwrap().gateway, Some(gw));
    assert_eq!(
        holders_of(&node, gw),
        vec![format!("lo {gw}/32")],
        "the gateway, once, on lo"
    );
    for pod in [&a, &b] {
        let host = kernel::link_addrs(node.netns(), &pod.r.host_ifname)
            .unwrap()
            .expect("host veth");
        assert_eq!(
            host.addrs(Family::V4).count(),
            0,
            "{} holds IPv4 addresses: {:?}",
            pod.r.host_ifname,
            host.addr_info
        );
    }

    echo(&a.netns, &b.netns, b.v4(), "pod a -> pod b");
    echo(
        &b.netns,
        node.netns(),
        gw,
        "pod b -> its gateway on the node",
    );
    echo(node.netns(), &a.netns, a.v4(), "node -> pod a");
    // The answer carried the host veth's MAC.
    for pod in [&a, &b] {
        let neigh = pod
            .netns
            .ip_ok(&["neigh", "show", &gw.to_string(), "dev", "eth0"])
            .unwrap();
        assert!(
            neigh
                .to_lowercase()
                .contains(&pod.r.host_mac.to_lowercase()),
            "pod's neighbour entry for {gw} is not the host veth {}: {neigh:?}",
            pod.r.host_mac
        );
    }
    assert_check_ok(&p, &node, &v4, &a, "gateway on lo");
    assert_eq!(
        gateway_users(&p, &node, gw),
        vec![a.id().to_owned(), b.id().to_owned()]
            .into_iter()
            .collect::<std::collections::BTreeSet<_>>()
    );

    // Pod a goes: b still uses the gateway.
    a.del(&p, &node, &v4);
    assert_eq!(holders_of(&node, gw), vec![format!("lo {gw}/32")]);
    assert_eq!(
        gateway_users(&p, &node, gw),
        std::iter::once(b.id().to_owned()).collect()
    );
    echo(
        &b.netns,
        node.netns(),
        gw,
        "pod b -> gateway after pod a's DEL",
    );

    // Damage: the gateway taken off lo.
    node.netns()
        .ip_ok(&["addr", "del", &format!("{gw}/32"), "dev", "lo"])
        .unwrap();
    assert_check_fails(
        &p,
        &node,
        &v4,
        &b,
        &["gateway", &gw.to_string(), "lo"],
        "gateway removed",
    );
    b.del(&p, &node, &v4);
    assert!(holders_of(&node, gw).is_empty());

    // Undamaged, the last pod's DEL takes the gateway away, and nothing else stays.
    let before = node.snapshot(None);
    let c = Pod::add(&p, &node, &v4, Stack::V4);
    assert_eq!(holders_of(&node, gw), vec![format!("lo {gw}/32")]);
    echo(&c.netns, node.netns(), gw, "pod c -> gateway");
    c.del(&p, &node, &v4);
    assert!(
        holders_of(&node, gw).is_empty(),
        "the last pod's DEL leaves {gw} on {:?}",
        holders_of(&node, gw)
    );
    let after = node.snapshot(None);
    assert_eq!(after.node_addrs, before.node_addrs);
}

/// An ADD whose IPv4 gateway other pods use already does not ask the kernel for it again
/// (it was an `RTM_NEWADDR` on `lo` the kernel answered `EEXIST`, each ADD): it finds the
/// gateway among `lo`'s addresses in its dump of the node's addresses. The node's first pod
/// adds it (control: the trace shows that request). When someone took the gateway off `lo`,
/// the next ADD puts it back, before the pod's host route that takes it as source: the new
/// pod reaches it and passes CHECK. The requests are read from `strace -e trace=sendto` of
/// the plugin.
#[test]
fn a_later_add_finds_its_gateway_on_lo_or_puts_it_back() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let traced = Traced::new(&p.bin, "sendto").unwrap();
    let t = PluginUnderTest::at(traced.wrapper.clone());
    let node = Node::new().unwrap();
    let v4 = NetConfList::single(&p.conf("1.0.0", &node, Stack::V4));
    // The gateway's own request: an address on lo (strace names the link by its name).
    let gateway_requests = || {
        traced
            .log()
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                l.contains("sendto(")
                    && l.contains("RTM_NEWADDR")
                    && l.contains("if_nametoindex(\"lo\")")
            })
            .count()
    };
    let a = Pod::add(&t, &node, &v4, Stack::V4);
    let gw =
        a.r.ip4()
            .unwrap()
            .gateway
            .expect("the result names a gateway");
    assert_eq!(
        gateway_requests(),
        1,
        "control: the node's first pod asks for its gateway on lo:\n{}",
        traced.log().unwrap()
    );
    // The trace holds the last run only.
    let b = Pod::add(&t, &node, &v4, Stack::V4);
    assert_eq!(
        gateway_requests(),
        0,
        "the second pod's ADD asked for the gateway again:\n{}",
        traced.log().unwrap()
    );
    assert_eq!(holders_of(&node, gw), vec![format!("lo {gw}/32")]);

    node.netns()
        .ip_ok(&["addr", "del", &format!("{gw}/32"), "dev", "lo"])
        .unwrap();
    let c = Pod::add(&t, &node, &v4, Stack::V4);
    assert_eq!(
        gateway_requests(),
        1,
        "the gateway was put back by another request"
    );
    assert_eq!(
        holders_of(&node, gw),
        vec![format!("lo {gw}/32")],
        "the ADD after the gateway was taken off lo did not put it back"
    );
    // The kernel took the older pods' host routes with the address (their source): CHECK
    // names those; the new pod's route came after the address was back.
    echo(
        &c.netns,
        node.netns(),
        gw,
        "the new pod -> its gateway, put back",
    );
    echo(node.netns(), &c.netns, c.v4(), "node -> the new pod");
    assert_check_ok(&p, &node, &v4, &c, "gateway put back");
    for pod in [&a, &b, &c] {
        pod.del(&p, &node, &v4);
    }
    assert!(
        holders_of(&node, gw).is_empty(),
        "the gateway outlived its pods"
    );
}

/// A dual-stack pod's IPv6 gateway is held by its host veth (the IPv4 one by `lo`). Deleted
/// there, the kernel keeps the node's host route to the pod (it only drops the route's
/// source), but the pod can no longer reach the gateway: CHECK must say so (105), naming the
/// gateway and the host veth, where it used to pass.
#[test]
fn check_names_an_ipv6_gateway_missing_from_the_host_veth() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let dual = dual_list(&p, &node);
    let a = Pod::add(&p, &node, &dual, Stack::Dual);
    let gw6 =
        a.r.ip6()
            .unwrap()
            .gateway
            .expect("the result names an IPv6 gateway");
    echo(
        &a.netns,
        node.netns(),
        gw6,
        "control: the pod -> its IPv6 gateway",
    );
    assert_check_ok(&p, &node, &dual, &a, "control");

    let host = a.r.host_ifname.clone();
    node.netns()
        .ip_ok(&["addr", "del", &format!("{gw6}/128"), "dev", &host])
        .unwrap();
    assert_blocked(
        &a.netns,
        node.netns(),
        gw6,
        "the pod -> its IPv6 gateway, deleted",
    );
    let route = node
        .netns()
        .ip_ok(&["-6", "route", "show", &format!("{}/128", a.v6())])
        .unwrap();
    assert!(
        route.contains(&host),
        "the kernel kept the host route to the pod: {route}"
    );
    let err = p
        .runtime
        .check(&node, &dual, &a.att, &a.result)
        .expect_err("CHECK with the IPv6 gateway gone from the host veth");
    let msg = err.to_string();
    assert!(msg.contains("\"code\":105"), "CHECK's code: {msg}");
    assert!(
        msg.contains(&format!("gateway {gw6} is missing from host veth {host}")),
        "CHECK does not name the gateway and the veth: {msg}"
    );
    a.del(&p, &node, &dual);
}

/// The last user's DEL and another pod's ADD of the same network, at the same time: the
/// node lock makes dropping the gateway and taking it atomic, so the new pod always ends
/// up with its gateway on `lo` (a DEL that removed the address after the ADD had found it
/// there would leave the new pod without it, and without its host route).
#[test]
fn gateway_survives_a_concurrent_last_del_and_add() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let v4 = NetConfList::single(&p.conf("1.0.0", &node, Stack::V4));
    for round in 0..8 {
        let old = Pod::add(&p, &node, &v4, Stack::V4);
        let gw = old.r.ip4().unwrap().gateway.unwrap();
        let netns = node.new_pod().unwrap();
        let att = Attachment::new(&unique_container_id(), netns.path(), "eth0");
        let (del, add) = std::thread::scope(|s| {
            let d = s.spawn(|| p.runtime.del(&node, &v4, &old.att, Some(&old.result)));
            let a = s.spawn(|| p.runtime.add(&node, &v4, &att));
            (d.join().unwrap(), a.join().unwrap())
        });
        del.unwrap_or_else(|e| panic!("round {round}: DEL: {e}"));
        let result = add.unwrap_or_else(|e| panic!("round {round}: ADD: {e}"));
        assert_eq!(
            holders_of(&node, gw),
            vec![format!("lo {gw}/32")],
            "round {round}: the new pod's gateway"
        );
        echo(
            &netns,
            node.netns(),
            gw,
            &format!("round {round}: new pod -> gateway"),
        );
        p.runtime
            .del(&node, &v4, &att, Some(&result))
            .unwrap_or_else(|e| panic!("round {round}: DEL of the new pod: {e}"));
        assert!(
            holders_of(&node, gw).is_empty(),
            "round {round}: gateway left"
        );
    }
}

/// A pod attached by an earlier release holds its IPv4 gateway on its host veth, has no
/// gateway use recorded and no gateway in its endpoint entry. Such a pod (made here by
/// rewriting a new one into that layout) still passes CHECK, reaches its gateway (the
/// kernel answers ARP for the veth's own address), and its DEL leaves nothing behind.
#[test]
fn a_pod_of_the_earlier_gateway_layout_still_checks_and_deletes() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let v4 = NetConfList::single(&p.conf("1.0.0", &node, Stack::V4));
    let before = node.snapshot(None);
    let pod = Pod::add(&p, &node, &v4, Stack::V4);
    let gw = pod.r.ip4().unwrap().gateway.unwrap();
    let IpAddr::V4(gw4) = gw else {
        panic!("IPv4 gateway expected, got {gw}")
    };
    let ip = pod.v4();
    let mut ep = dp::endpoints(&node).unwrap()[&ip];
    assert_eq!(
        ep.gateway4,
        gw4.octets(),
        "the endpoint entry names the gateway"
    );

    // The earlier layout: the gateway on the veth first (the host route keeps its source
    // address), then off lo; no use record; no gateway in the endpoint entry.
    let host_gw = format!("{gw}/32");
    node.netns()
        .ip_ok(&["addr", "add", &host_gw, "dev", &pod.r.host_ifname])
        .unwrap();
    node.netns()
        .ip_ok(&["addr", "del", &host_gw, "dev", "lo"])
        .unwrap();
    fsutil::remove_tree(&node.pin_root().join(dp::GATEWAYS_DIR)).unwrap();
    ep.gateway4 = [0; 4];
    dp::update_endpoint(&node, ip, &ep.encode()).unwrap();

    assert_check_ok(&p, &node, &v4, &pod, "a pod of the earlier gateway layout");
    echo(
        &pod.netns,
        node.netns(),
        gw,
        "pod -> its gateway on its host veth",
    );
    pod.del(&p, &node, &v4);
    let after = node.snapshot(None);
    assert_eq!(after.node_addrs, before.node_addrs, "addresses left");
    assert_eq!(after.node_links, before.node_links, "links left");
    assert!(
        after.pinned_files.is_empty(),
        "pins left: {:?}",
        after.pinned_files
    );
}
