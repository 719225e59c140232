//! Chained mode: ebpf-cni after the reference `bridge` plugin in a conflist, with only the
//! `portMappings` and `bandwidth` capabilities, in place of `portmap` and `bandwidth`. The
//! bridge makes and addresses the pod's interface; ebpf-cni finds the host end of its veth
//! from `prevResult`, serves the pod's host ports and limits there, passes the result
//! through, and DEL/CHECK work as in standalone mode. Spec 1.0 section 3 ("prevResult",
//! chained plugins) and the conventions' portMappings/bandwidth capabilities.
//!
//! Real traffic only: every host-port path (from outside the node, from the node itself,
//! from another pod, hairpin) through the bridge's pod, the limits measured with iperf3,
//! and the bridge's own forwarding left alone.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

use ebpf_cni_tests::bpf::{attached_programs, tcx_programs, Direction};
use ebpf_cni_tests::config::Stack;
use ebpf_cni_tests::dataplane as dp;
use ebpf_cni_tests::external::ExternalHost;
use ebpf_cni_tests::host_ports::{ask_each, ruleset, sa, tag_of, tcp_ask, PodServer};
use ebpf_cni_tests::kernel::Family;
use ebpf_cni_tests::rate::{self, floor, iperf};
use ebpf_cni_tests::{
    require_root, unique_container_id, Attachment, CniCommand, NetConfList, Netns, Node,
    PluginUnderTest, Pod,
};
use serde_json::{json, Value};

const BRIDGE: &str = "cni-chain0";
/// The limit the tests set: 40 Mbit/s, or 4 Mbit/s in a matrix guest, whose emulated senders
/// may not offer twice 40 Mbit/s (`rate::VM_ENV`).
fn limit_bps() -> u64 {
    if rate::in_vm() {
        4_000_000
    } else {
        40_000_000
    }
}

/// `bridge` (isGateway, no masquerade) with the harness's host-local IPAM, then ebpf-cni
/// without ipam: the "replace portmap and bandwidth" conflist of docs/chained-mode.md.
fn chain(p: &PluginUnderTest, node: &Node) -> NetConfList {
    let mut bridge = p.conf("1.0.0", node, Stack::Dual);
    bridge["type"] = json!("bridge");
    bridge["bridge"] = json!(BRIDGE);
    bridge["isGateway"] = json!(true);
    bridge["ipMasq"] = json!(false);
    let ebpf = json!({
        "type": p.plugin_type,
        "capabilities": {"portMappings": true, "bandwidth": true},
    });
    NetConfList::chain(&bridge, vec![ebpf])
}

/// The bridge's host veth, as its result names it (the interface without sandbox that is
/// not the bridge).
fn host_veth(pod: &Pod) -> String {
    pod.result["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i.get("sandbox").is_none() && i["name"] != BRIDGE)
        .and_then(|i| i["name"].as_str())
        .expect("the bridge's result names the host veth")
        .to_owned()
}

fn add(p: &PluginUnderTest, node: &Node, l: &NetConfList, caps: &[(&str, Value)]) -> Pod {
    Pod::try_add(&p.runtime, node, l, |att| att.with_capabilities(caps))
        .unwrap_or_else(|e| panic!("ADD of the bridge + ebpf-cni chain: {e}"))
}

/// The result is the bridge's, passed through: its interfaces (the bridge, the host veth,
/// eth0 in the pod's namespace) and both addresses, in the list's version; ebpf-cni adds no
/// interface of its own.
fn assert_passed_through(result: &Value, pod: &Netns) {
    let ifaces = result["interfaces"].as_array().expect("interfaces");
    let names: Vec<&str> = ifaces.iter().filter_map(|i| i["name"].as_str()).collect();
    assert!(
        names.contains(&BRIDGE) && names.contains(&"eth0"),
        "the bridge's interfaces must pass through ebpf-cni unchanged: {result}"
    );
    assert!(
        !names.iter().any(|n| n.starts_with("ecni")),
        "chained ebpf-cni must not create interfaces of its own: {result}"
    );
    let sandbox = pod.path().to_string_lossy();
    assert!(
        ifaces
            .iter()
            .any(|i| i["name"] == "eth0" && i["sandbox"] == *sandbox),
        "{result}"
    );
    assert_eq!(result["ips"].as_array().map(Vec::len), Some(2), "{result}");
    assert_eq!(result["cniVersion"], "1.0.0", "{result}");
}

/// The bridge's pod gets host ports (every path to them) and rate limits from ebpf-cni;
/// CHECK passes and fails on tampering; DEL removes ebpf-cni's state and the bridge's DEL
/// still works after it.
#[test]
fn after_bridge_serves_host_ports_and_limits_and_deletes_cleanly() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "uplink0", 41).unwrap();
    let l = chain(&p, &node);
    let before = ruleset(&node);

    let bw = json!({"IngressRate": limit_bps(), "IngressBurst": 4294967295u64,
                    "EgressRate": limit_bps(), "EgressBurst": 4294967295u64});
    let a = add(
        &p,
        &node,
        &l,
        &[
            (
                "portMappings",
                json!([
                    {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
                    {"HostPort": 8080, "ContainerPort": 80, "Protocol": "udp", "HostIP": ""}
                ]),
            ),
            ("bandwidth", bw),
        ],
    );
    let b = add(&p, &node, &l, &[]);
    assert_passed_through(&a.result, &a.netns);
    assert_eq!(
        before,
        ruleset(&node),
        "neither the bridge (ipMasq false) nor ebpf-cni may add netfilter rules"
    );

    // The chained programs sit on the bridge's host veth (TCX links, or filters on a
    // kernel without TCX).
    let veth = host_veth(&a);
    let progs = attached_programs(node.netns(), &veth).unwrap();
    let on = |d: Direction| -> Vec<&str> {
        progs
            .iter()
            .filter(|p| p.direction == d)
            .map(|p| p.name.as_str())
            .collect()
    };
    assert_eq!(on(Direction::Ingress), vec![dp::PROG_FROM_CHAIN], "{veth}");
    assert_eq!(on(Direction::Egress), vec![dp::PROG_TO_POD], "{veth}");

    // Every path to a host port, TCP and UDP, IPv4 and IPv6, through the bridge's pod.
    let _server = PodServer::start(&a.netns, 80, "podA");
    let (node4, node6): (IpAddr, IpAddr) = (ext.node_v4.into(), ext.node_v6.into());
    let cases: Vec<(&str, &Netns, SocketAddr)> = vec![
        ("external -> node IPv4", ext.netns(), sa(node4, 8080)),
        ("external -> node IPv6", ext.netns(), sa(node6, 8080)),
        (
            "node -> 127.0.0.1",
            node.netns(),
            sa(Ipv4Addr::LOCALHOST, 8080),
        ),
        ("node -> ::1", node.netns(), sa(Ipv6Addr::LOCALHOST, 8080)),
        ("node -> node IPv4", node.netns(), sa(node4, 8080)),
        ("pod B -> node IPv4", &b.netns, sa(node4, 8080)),
        ("pod B -> node IPv6", &b.netns, sa(node6, 8080)),
        ("hairpin IPv4", &a.netns, sa(node4, 8080)),
    ];
    // The node's own connections go through the socket programs, on every kernel (before
    // 5.14 they learn the node's namespace through a probe instead of SO_NETNS_COOKIE).
    let failures = ask_each(&cases, "podA");
    assert!(
        failures.is_empty(),
        "host port 8080 of the bridge's pod, chained ebpf-cni:\n{}\ninspect: {:#}",
        failures.join("\n"),
        dp::inspect(Path::new(&p.bin), &node).unwrap_or_default()
    );
    // The pod sees the real client; the bridge still switches pod to pod itself.
    let ans = tcp_ask(ext.netns(), sa(node4, 8080)).unwrap();
    assert!(ans.starts_with(&format!("podA {}:", ext.v4)), "{ans}");
    let direct = tcp_ask(&b.netns, sa(a.v4(), 80)).unwrap();
    assert!(direct.starts_with(&format!("podA {}:", b.v4())), "{direct}");

    // Rate limits in both directions (generous tolerance; the benchmark measures).
    let limit = limit_bps() as f64;
    let ext_ip = IpAddr::V4(ext.v4);
    let offered = format!("{}", 2 * limit_bps());
    let out = iperf(&a.netns, ext.netns(), ext_ip, &["-u", "-b", &offered]);
    let inn = iperf(&a.netns, ext.netns(), ext_ip, &["-u", "-b", &offered, "-R"]);
    // Above: a guest's emulated receiver can report over the 3 s run's budget (the limit's
    // rate plus its burst, 1.09x here); seen once on 6.12: 1.257x.
    let ceiling = if rate::in_vm() { 1.4 } else { 1.25 };
    for (what, rate) in [("egress", out), ("ingress", inn)] {
        assert!(
            (floor(0.75, 0.05) * limit..=ceiling * limit).contains(&rate),
            "UDP {what} of the limited bridge pod at 2x the limit: {rate:.0} bit/s"
        );
    }
    let free = iperf(&b.netns, ext.netns(), ext_ip, &[]);
    assert!(
        free > floor(10.0, 1.5) * limit,
        "TCP from the bridge pod without limits: {free:.0} bit/s"
    );
    // In a matrix guest the emulated sender may not reach the limit at all (`rate::VM_ENV`;
    // seen on 6.1: no drop in either direction): there 2 MiB offered at once overruns the
    // policer's 128 KiB burst, unless the loop took nearly 4 s at its 500 kB/s.
    if rate::in_vm() {
        rate::burst(&a.netns, sa(ext_ip, 9), 2 << 20).unwrap();
    }
    let report = dp::inspect(Path::new(&p.bin), &node).unwrap();
    let ra = dp::inspect_attachment(&report, &a.att.container_id).expect("pod A in inspect");
    assert_eq!(
        ra["egress_limit"]["rate_bytes"],
        json!(limit_bps() / 8),
        "{ra}"
    );
    let (drops_in, drops_out) = (
        ra["to_pod"]["drops"].as_u64() > Some(0),
        ra["from_pod"]["drops"].as_u64() > Some(0),
    );
    // In a matrix guest iperf3 may overrun neither direction: the burst's drops are counted.
    assert!(
        if rate::in_vm() {
            drops_out
        } else {
            drops_in && drops_out
        },
        "drops of the limited pod are counted: {ra}"
    );

    // CHECK of the whole list passes, then fails once the chained link is gone.
    p.runtime
        .check(&node, &l, &a.att, &a.result)
        .unwrap_or_else(|e| panic!("CHECK of the chain: {e}"));
    // The link's pin, or on a kernel without TCX the filter's record.
    let pin = node
        .attachment_pin_dir(&l.name, &a.att.container_id, "eth0")
        .join(if ebpf_cni_tests::bpf::kernel_has_tcx() {
            dp::LINK_FROM_CHAIN
        } else {
            dp::NETLINK_FROM_CHAIN
        });
    assert!(pin.exists(), "{}", pin.display());
    std::fs::remove_file(&pin).unwrap();
    let err = p
        .runtime
        .check(&node, &l, &a.att, &a.result)
        .expect_err("CHECK with the chained program detached");
    let out = err.output().expect("the plugin's error");
    let e = out.expect_error(105, "CHECK after detaching ecni_from_chain");
    let text = format!("{} {}", e.msg, e.details.unwrap_or_default());
    assert!(
        text.contains("from_chain"),
        "the error names the missing link: {text}"
    );

    // DEL of the chain (ebpf-cni first, then the bridge): both succeed, twice, also as a
    // late DEL without netns or prevResult; host port and ebpf-cni's pins are gone.
    p.runtime.del(&node, &l, &a.att, Some(&a.result)).unwrap();
    let mut late = a.att.clone();
    late.netns = String::new();
    p.runtime.del(&node, &l, &late, None).unwrap();
    assert!(
        !node
            .attachment_pin_dir(&l.name, &a.att.container_id, "eth0")
            .exists(),
        "the attachment's pins go with DEL"
    );
    assert!(
        tcp_ask(node.netns(), sa(Ipv4Addr::LOCALHOST, 8080)).is_err()
            && tcp_ask(ext.netns(), sa(node4, 8080)).is_err(),
        "host port 8080 must be gone after DEL"
    );
    // Pod B is unaffected.
    p.runtime
        .check(&node, &l, &b.att, &b.result)
        .unwrap_or_else(|e| panic!("CHECK of pod B after pod A's DEL: {e}"));
    p.runtime.del(&node, &l, &b.att, Some(&b.result)).unwrap();
    assert_eq!(
        node.pinned_files(),
        Vec::<std::path::PathBuf>::new(),
        "nothing of ebpf-cni stays pinned after the last DEL"
    );
    assert!(
        node.leases(&l.name).is_empty(),
        "the bridge's DEL released its leases"
    );
}

/// Chained mode leaves forwarding to the bridge: with the node's FORWARD chain dropping
/// everything, a host-port flow (translated by ebpf-cni) still reaches the pod, while the
/// pod's own address is not reached from outside (its traffic takes the stack, as the bridge
/// set it up, and the stack drops it).
#[test]
fn only_host_port_traffic_bypasses_the_stack() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "uplink0", 42).unwrap();
    let l = chain(&p, &node);
    let a = add(
        &p,
        &node,
        &l,
        &[(
            "portMappings",
            json!([{"hostPort": 9090, "containerPort": 90, "protocol": "tcp"}]),
        )],
    );
    let _server = PodServer::start(&a.netns, 90, "podA");
    let node4: IpAddr = ext.node_v4.into();
    // Before the drop rule both work (so the failure below is the rule's doing).
    assert_eq!(
        tag_of(&tcp_ask(ext.netns(), sa(node4, 9090)).unwrap()),
        "podA"
    );
    assert_eq!(
        tag_of(&tcp_ask(ext.netns(), sa(a.v4(), 90)).unwrap()),
        "podA"
    );
    let fw = node
        .netns()
        .exec(&["iptables", "-I", "FORWARD", "-j", "DROP"])
        .unwrap();
    assert!(fw.status.success(), "iptables: {fw:?}");
    assert_eq!(
        tag_of(&tcp_ask(ext.netns(), sa(node4, 9090)).unwrap()),
        "podA",
        "the host-port flow is forwarded by ebpf-cni's programs"
    );
    assert!(
        tcp_ask(ext.netns(), sa(a.v4(), 90)).is_err(),
        "the pod's own address must take the stack (and its FORWARD drop) in chained mode"
    );
    p.runtime.del(&node, &l, &a.att, Some(&a.result)).unwrap();
}

/// Chained-mode input errors, each refused with code 7 naming the problem, changing nothing.
#[test]
fn chained_mode_input_errors() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let pod = node.new_pod().unwrap();
    let env = p.env(&unique_container_id(), pod.path(), "eth0");
    let bare = json!({"cniVersion": "1.0.0", "name": "chainnet", "type": p.plugin_type});

    // No ipam and no prevResult: neither mode applies.
    let out = p.run(&node, CniCommand::Add, &env, bare.to_string());
    let e = out.expect_error(7, "ADD without ipam or prevResult");
    assert!(
        e.msg.contains("ipam") && e.msg.contains("prevResult"),
        "{e:?}"
    );

    // ipam and a prevResult: ebpf-cni with ipam must come first.
    let mut both = p.conf("1.0.0", &node, Stack::V4);
    both["prevResult"] = json!({"cniVersion": "1.0.0", "interfaces": [], "ips": []});
    let out = p.run(&node, CniCommand::Add, &env, both.to_string());
    let e = out.expect_error(7, "ADD with ipam and prevResult");
    assert!(e.msg.contains("first"), "{e:?}");

    // A prevResult without the pod's interface.
    let mut no_iface = bare.clone();
    no_iface["prevResult"] = json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "other0", "sandbox": pod.path()}],
        "ips": [{"address": "10.99.0.2/24", "interface": 0}],
    });
    let out = p.run(&node, CniCommand::Add, &env, no_iface.to_string());
    let e = out.expect_error(7, "ADD with prevResult lacking eth0");
    assert!(e.msg.contains("\"eth0\""), "{e:?}");

    // The interface listed but absent from the namespace.
    let mut absent = bare.clone();
    absent["prevResult"] = json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": pod.path()}],
        "ips": [{"address": "10.99.0.2/24", "interface": 0}],
    });
    let out = p.run(&node, CniCommand::Add, &env, absent.to_string());
    let e = out.expect_error(7, "ADD with eth0 missing from the namespace");
    assert!(e.msg.contains("missing"), "{e:?}");

    // Nothing pinned for the node by any of them.
    assert_eq!(node.pinned_files(), Vec::<std::path::PathBuf>::new());
}

/// GC (CNI 1.1) of ebpf-cni in chained mode removes ebpf-cni's state of every attachment
/// not listed — links, endpoint entries, host ports — and nothing of the bridge's: the
/// stale pod's veth and lease stay for the bridge to collect. The listed pod keeps working.
#[test]
fn gc_removes_only_ebpf_cni_state_of_unlisted_chained_pods() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let l = chain(&p, &node);
    let map = |port: u16| {
        (
            "portMappings",
            json!([{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]),
        )
    };
    let stale = add(&p, &node, &l, &[map(8081)]);
    let kept = add(&p, &node, &l, &[map(8082)]);
    let _s1 = PodServer::start(&stale.netns, 80, "stale");
    let _s2 = PodServer::start(&kept.netns, 80, "kept");
    let lo = |port| sa(Ipv4Addr::LOCALHOST, port);
    assert_eq!(tag_of(&tcp_ask(node.netns(), lo(8081)).unwrap()), "stale");

    // ebpf-cni's entry of the list as a 1.1.0 config, as libcni builds it for GC.
    let gc_conf = json!({
        "cniVersion": "1.1.0",
        "name": l.name,
        "type": p.plugin_type,
        "cni.dev/valid-attachments": [
            {"containerID": kept.att.container_id, "ifname": "eth0"}
        ],
    });
    let env = ebpf_cni_tests::ContainerEnv::none().with_cni_path(&p.runtime.cni_path_env());
    p.run(&node, CniCommand::Gc, &env, gc_conf.to_string())
        .expect_success("GC in chained mode");

    assert!(
        !node
            .attachment_pin_dir(&l.name, &stale.att.container_id, "eth0")
            .exists(),
        "GC removes the unlisted attachment's pins"
    );
    assert!(
        tcp_ask(node.netns(), lo(8081)).is_err(),
        "the unlisted pod's host port is gone"
    );
    let veth = host_veth(&stale);
    assert!(
        ebpf_cni_tests::kernel::link(node.netns(), &veth)
            .unwrap()
            .is_some(),
        "the bridge's veth {veth} is the bridge's to remove"
    );
    assert!(
        attached_programs(node.netns(), &veth).unwrap().is_empty(),
        "no program of ebpf-cni stays on {veth}"
    );
    assert_eq!(tag_of(&tcp_ask(node.netns(), lo(8082)).unwrap()), "kept");
    p.runtime
        .check(&node, &l, &kept.att, &kept.result)
        .unwrap_or_else(|e| panic!("CHECK of the listed pod after GC: {e}"));

    for pod in [&stale, &kept] {
        p.runtime
            .del(&node, &l, &pod.att, Some(&pod.result))
            .unwrap();
    }
    assert_eq!(node.pinned_files(), Vec::<std::path::PathBuf>::new());
}

/// A chained ADD that fails after attaching (the failpoint fires once every step succeeded)
/// leaves nothing of ebpf-cni behind: no pin, no program on the bridge's veth, the host
/// port not answered; the bridge's interface stays for the runtime's DEL of the list.
#[test]
fn a_failed_chained_add_leaves_nothing_of_ebpf_cni() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let l = chain(&p, &node);
    let bridge_only = NetConfList {
        plugins: vec![l.plugins[0].clone()],
        ..l.clone()
    };
    let netns = node.new_pod().unwrap();
    let att = Attachment::new(&unique_container_id(), netns.path(), "eth0");
    let prev = p.runtime.add(&node, &bridge_only, &att).unwrap();

    let mut conf = l.exec_config(
        1,
        &serde_json::Map::from_iter([(
            "portMappings".to_owned(),
            json!([{"hostPort": 8083, "containerPort": 80, "protocol": "tcp"}]),
        )]),
        Some(&prev),
    );
    conf["runtimeConfig"]["bandwidth"] =
        json!({"egressRate": 10_000_000, "egressBurst": 1_000_000});
    let env = p
        .env(&att.container_id, netns.path(), "eth0")
        .with_env("EBPF_CNI_FAILPOINT", "before-result");
    p.run(&node, CniCommand::Add, &env, conf.to_string())
        .expect_error(199, "chained ADD with the failpoint");

    assert_eq!(
        node.pinned_files(),
        Vec::<std::path::PathBuf>::new(),
        "a failed chained ADD leaves no pin"
    );
    let pod = Pod::attached(netns, att, prev);
    let veth = host_veth(&pod);
    assert!(
        attached_programs(node.netns(), &veth).unwrap().is_empty(),
        "{veth}"
    );
    let _server = PodServer::start(&pod.netns, 80, "pod");
    assert!(tcp_ask(node.netns(), sa(Ipv4Addr::LOCALHOST, 8083)).is_err());
    // The runtime then DELs the whole list: both plugins succeed.
    p.runtime
        .del(&node, &l, &pod.att, Some(&pod.result))
        .unwrap();
    assert!(node.leases(&l.name).is_empty());
}

/// With `tcAttachMode: netlink` the chained programs are `bpf` filters on the bridge's
/// veth, which outlives ebpf-cni's DEL: that DEL must take its filters off (the default's
/// TCX links go with their pins). Only ebpf-cni's DEL runs here, so the veth stays and can
/// be looked at; then the list's DEL still succeeds.
#[test]
fn netlink_mode_del_takes_the_filters_off_the_bridges_veth() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let mut l = chain(&p, &node);
    l.plugins[1]["tcAttachMode"] = json!("netlink");
    let pod = add(&p, &node, &l, &[]);
    let veth = host_veth(&pod);
    let names = |what: &str| -> Vec<String> {
        let mut v: Vec<String> = ebpf_cni_tests::bpf::attached_programs(node.netns(), &veth)
            .unwrap_or_else(|e| panic!("programs on {veth} {what}: {e:#}"))
            .into_iter()
            .map(|q| q.name)
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        names("after ADD"),
        vec![dp::PROG_FROM_CHAIN, dp::PROG_TO_POD],
        "netlink filters on the bridge's veth"
    );
    assert!(tcx_programs(node.netns(), &veth).unwrap().is_empty());

    let conf = l.exec_config(1, &serde_json::Map::new(), Some(&pod.result));
    let env = p.env(&pod.att.container_id, pod.netns.path(), "eth0");
    p.run(&node, CniCommand::Del, &env, conf.to_string())
        .expect_success("ebpf-cni's DEL alone");
    assert!(
        names("after ebpf-cni's DEL").is_empty(),
        "ebpf-cni's DEL left its filters on {veth}"
    );
    assert_eq!(node.pinned_files(), Vec::<std::path::PathBuf>::new());
    p.runtime
        .del(&node, &l, &pod.att, Some(&pod.result))
        .unwrap();
    assert!(node.leases(&l.name).is_empty());
}

/// `unshapedSubnets` in ebpf-cni's entry of the chain, the rates from the `bandwidth`
/// capability: traffic of the bridge's pod with host A (in the subnet) passes above the
/// limit in both directions, traffic with host B is held to it; CHECK passes; DEL leaves no
/// subnet entry.
#[test]
fn after_bridge_unshaped_subnets_exempt_their_traffic() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let a_host = ExternalHost::attach(node.netns(), "uplink0", 51).unwrap();
    let b_host = ExternalHost::attach(node.netns(), "uplink1", 52).unwrap();
    let mut bridge = p.conf("1.0.0", &node, Stack::Dual);
    bridge["type"] = json!("bridge");
    bridge["bridge"] = json!(BRIDGE);
    bridge["isGateway"] = json!(true);
    bridge["ipMasq"] = json!(false);
    let ebpf = json!({
        "type": p.plugin_type,
        "capabilities": {"portMappings": true, "bandwidth": true},
        "unshapedSubnets": ["192.168.51.0/24"],
    });
    let l = NetConfList::chain(&bridge, vec![ebpf]);
    let bw = json!({"IngressRate": limit_bps(), "IngressBurst": 4294967295u64,
                    "EgressRate": limit_bps(), "EgressBurst": 4294967295u64});
    let pod = add(&p, &node, &l, &[("bandwidth", bw)]);
    let limit = limit_bps() as f64;
    for reverse in [false, true] {
        let dir = if reverse { "towards" } else { "from" };
        let udp = |host: &ExternalHost, times: u64| {
            let b = format!("{}", times * limit_bps());
            let mut args = vec!["-u", "-b", b.as_str()];
            if reverse {
                args.push("-R");
            }
            iperf(&pod.netns, host.netns(), IpAddr::V4(host.v4), &args)
        };
        let exempt = udp(&a_host, 5);
        assert!(
            exempt >= floor(3.0, 1.5) * limit,
            "UDP {dir} the bridge's pod, host A in unshapedSubnets: {exempt:.0} bit/s"
        );
        let held = udp(&b_host, 2);
        assert!(
            held <= 1.25 * limit,
            "UDP {dir} the bridge's pod, host B: {held:.0} bit/s"
        );
    }
    p.runtime
        .check(&node, &l, &pod.att, &pod.result)
        .expect("CHECK of the chained pod with unshapedSubnets");
    assert_eq!(
        dp::map_entries(&node, dp::SHAPE_SUBNETS_MAP).unwrap().len(),
        1
    );
    p.runtime
        .del(&node, &l, &pod.att, Some(&pod.result))
        .unwrap();
    let left = dp::map_entries(&node, dp::SHAPE_SUBNETS_MAP).unwrap_or_default();
    assert!(left.is_empty(), "subnet entries left: {left:?}");
}

/// The source check on the bridge's veths: with the addresses the bridge gave
/// (`prevResult`), a pod cannot send to another pod of the bridge with a third pod's
/// address, a made-up one or a forged MAC; its own traffic is switched by the bridge as
/// before. The result passed on says what is in force, CHECK compares it, DEL removes it.
#[test]
fn the_bridges_pods_send_only_from_their_own_addresses_and_macs() {
    use ebpf_cni_tests::source_check::{assert_udp_arrives, assert_udp_blocked};
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let l = chain(&p, &node);
    let a = add(&p, &node, &l, &[]);
    let b = add(&p, &node, &l, &[]);
    let c = add(&p, &node, &l, &[]);
    assert_passed_through(&a.result, &a.netns);
    let own = |pod: &Pod| json!([format!("{}/32", pod.v4()), format!("{}/128", pod.v6())]);
    assert_eq!(a.result["sourceCheck"]["enabled"], true);
    assert_eq!(a.result["sourceCheck"]["allowedPrefixes"], own(&a));
    for fam in [Family::V4, Family::V6] {
        assert_udp_arrives(&a.netns, a.addr(fam), &c.netns, c.addr(fam));
    }
    let drops = |pod: &Pod| -> (u64, u64) {
        let report = dp::inspect(&p.bin, &node).unwrap();
        let entry = dp::inspect_attachment(&report, &pod.att.container_id).unwrap();
        let c = dp::DirCounts::from_json(&entry["from_pod"]).unwrap();
        (c.source_drops, c.mac_drops)
    };
    assert_eq!(drops(&a), (0, 0));

    let bounded = std::time::Duration::from_millis(1500);
    let spoofed: [IpAddr; 3] = [b.v4(), b.v6(), "198.51.100.9".parse().unwrap()];
    for ip in spoofed {
        let (fam, cidr) = if ip.is_ipv4() {
            ("-4", format!("{ip}/32"))
        } else {
            ("-6", format!("{ip}/128"))
        };
        let mut args = vec![fam, "addr", "add", cidr.as_str(), "dev", "eth0"];
        if ip.is_ipv6() {
            args.push("nodad");
        }
        a.netns.ip_ok(&args).unwrap();
        assert_udp_blocked(&a.netns, ip, &c.netns, c.addr(Family::of(&ip)), bounded);
    }
    let (by_addr, by_mac) = drops(&a);
    assert!(by_addr >= 3 && by_mac == 0, "({by_addr}, {by_mac})");
    let mac = ebpf_cni_tests::source_check::mac_of(&a.netns, "eth0").unwrap();
    let mac = dp::format_mac(&mac);
    let set_mac = |m: &str| {
        a.netns
            .ip_ok(&["link", "set", "dev", "eth0", "address", m])
            .unwrap()
    };
    set_mac("02:00:5e:00:ca:fe");
    assert_udp_blocked(&a.netns, a.v4(), &c.netns, c.v4(), bounded);
    assert!(drops(&a).1 >= 1, "the forged MAC is counted");
    set_mac(&mac);
    // B, whose address A tried, is untouched.
    assert_udp_arrives(&b.netns, b.v4(), &c.netns, c.v4());

    for pod in [&a, &b, &c] {
        p.runtime
            .check(&node, &l, &pod.att, &pod.result)
            .unwrap_or_else(|e| panic!("CHECK: {e}"));
    }
    for pod in [&a, &b, &c] {
        p.runtime
            .del(&node, &l, &pod.att, Some(&pod.result))
            .unwrap();
    }
    assert!(dp::sources(&node).unwrap().is_empty());
    assert_eq!(node.pinned_files(), Vec::<std::path::PathBuf>::new());
}
