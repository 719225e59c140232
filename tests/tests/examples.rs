//! The example conflists the release ships (`deploy/examples/`, in the tarballs' and the
//! .deb's `examples/`) work as written: each is read from its file, only the IPAM
//! `dataDir` pointed at the test node's own directory, and run by the runtime emulation
//! with the capability arguments a runtime sends, against the plugin under test
//! (`EBPF_CNI_BIN`). A shape the plugin refuses, a capability it does not honour or a key
//! it ignores fails here:
//!
//! - `standalone.conflist` (ebpf-cni alone, `ipMasq`, portMappings and bandwidth): two pods
//!   get addresses from the example's ranges and reach each other over both families; a
//!   host outside the node reaches a pod through its host port; a pod reaches a host that
//!   has no route to the pods, seen from the node's address (masquerade); CHECK passes
//!   with the limits given; DEL leaves nothing.
//! - `chained-bridge.conflist` (the reference bridge, then ebpf-cni without ipam): a host
//!   outside the node reaches the pod through its host port, which only ebpf-cni serves
//!   (no portmap in the list); CHECK passes; DEL removes ebpf-cni's pins.

use std::net::IpAddr;
use std::path::Path;

use ebpf_cni_tests::external::ExternalHost;
use ebpf_cni_tests::host_ports::{sa, tag_of, tcp_ask, PodServer};
use ebpf_cni_tests::net::tcp_echo;
use ebpf_cni_tests::release::deploy_dir;
use ebpf_cni_tests::result::in_subnet;
use ebpf_cni_tests::state::{assert_attachment, assert_gone};
use ebpf_cni_tests::{require_root, Attachment, NetConfList, Node, PluginUnderTest, Pod};
use serde_json::{json, Value};

const HOST_PORT: u16 = 8080;
const POD_PORT: u16 = 80;

/// The example `name` as shipped, its IPAM `dataDir` (on whichever plugin has `ipam`) set
/// to the node's.
fn example(name: &str, node: &Node) -> (Value, NetConfList) {
    let path = deploy_dir().join("examples").join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading the example {}: {e}", path.display()));
    let shipped: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("the example {} is not JSON: {e}", path.display()));
    let mut conf = shipped.clone();
    for plugin in conf["plugins"].as_array_mut().expect("plugins") {
        if let Some(ipam) = plugin.get_mut("ipam") {
            ipam["dataDir"] = json!(node.data_dir().to_string_lossy());
        }
    }
    let list = NetConfList::from_value(&conf).unwrap();
    (shipped, list)
}

/// What a runtime passes for the two capabilities: host port `host_port` to the pod's
/// [`POD_PORT`], limits far above what the checks send.
fn capability_args(att: Attachment, host_port: u16) -> Attachment {
    att.with_capability(
        "portMappings",
        json!([{ "hostPort": host_port, "containerPort": POD_PORT, "protocol": "tcp" }]),
    )
    .with_capability(
        "bandwidth",
        json!({ "ingressRate": 1_000_000_000u64, "ingressBurst": 100_000_000u64,
                "egressRate": 1_000_000_000u64, "egressBurst": 100_000_000u64 }),
    )
}

/// External host `n` behind the node's `up0` without any route to the pods: only
/// translated traffic (a host port's answers, masqueraded flows) gets back to it.
fn unrouted_host(node: &Node, n: u8) -> ExternalHost {
    let ext = ExternalHost::attach(node.netns(), "up0", n).unwrap();
    for family in ["-4", "-6"] {
        ext.netns()
            .ip_ok(&[family, "route", "del", "default"])
            .unwrap();
    }
    ext
}

/// The example's `ranges`, as (network, prefix length).
fn ranges(plugin: &Value) -> Vec<(IpAddr, u8)> {
    plugin["ipam"]["ranges"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|set| set.as_array().unwrap().clone())
        .map(|r| {
            ebpf_cni_tests::result::parse_cidr(r["subnet"].as_str().unwrap()).expect("a subnet")
        })
        .collect()
}

fn add(p: &PluginUnderTest, node: &Node, list: &NetConfList, host_port: u16) -> Pod {
    Pod::try_add(&p.runtime, node, list, |att| {
        capability_args(att, host_port)
    })
    .unwrap_or_else(|e| panic!("ADD with the example {}: {e}", list.name))
}

#[test]
fn standalone_example_serves_pods() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let (shipped, list) = example("standalone.conflist", &node);
    assert_eq!(list.plugins.len(), 1);
    let plugin = &shipped["plugins"][0];
    assert_eq!(plugin["type"], json!(p.plugin_type));
    let ext = unrouted_host(&node, 2);
    let a = add(&p, &node, &list, HOST_PORT);
    let b = add(&p, &node, &list, HOST_PORT + 1);

    for pod in [&a, &b] {
        assert_eq!(pod.r.ips.len(), 2, "one address per family: {}", pod.result);
        for ip in &pod.r.ips {
            assert!(
                ranges(plugin)
                    .iter()
                    .any(|(net, len)| in_subnet(ip.addr, *net, *len)),
                "{} is in none of the example's ranges",
                ip.addr
            );
        }
        let mtu = plugin["mtu"].as_u64().map(|m| m as u32);
        assert_attachment(&node, &pod.netns, "eth0", &pod.r, mtu);
        assert_eq!(pod.result["dns"], plugin["dns"]);
    }
    for ip in &b.r.ips {
        tcp_echo(&a.netns, &b.netns, ip.addr, 0)
            .unwrap_or_else(|e| panic!("pod to pod over {}: {e:#}", ip.addr));
    }

    // portMappings: the host port on the node's uplink address reaches the pod.
    let server = PodServer::start(&a.netns, POD_PORT, "pod-a");
    let answer = tcp_ask(ext.netns(), sa(ext.node_v4, HOST_PORT))
        .unwrap_or_else(|e| panic!("the host port {HOST_PORT} from outside the node: {e:#}"));
    assert_eq!(tag_of(&answer), "pod-a", "answered by {answer:?}");
    drop(server);

    // ipMasq: the host outside answers the pod although it has no route to the pods.
    let echo = tcp_echo(&a.netns, ext.netns(), ext.v4.into(), 0)
        .unwrap_or_else(|e| panic!("the masqueraded pod to a host outside: {e:#}"));
    assert_eq!(
        echo.client_addr.ip(),
        IpAddr::from(ext.node_v4),
        "the host outside sees the node's address"
    );

    for pod in [&a, &b] {
        p.runtime
            .check(&node, &list, &pod.att, &pod.result)
            .unwrap_or_else(|e| panic!("CHECK with the example: {e}"));
    }
    for pod in [&a, &b] {
        p.runtime
            .del(&node, &list, &pod.att, Some(&pod.result))
            .unwrap_or_else(|e| panic!("DEL with the example: {e}"));
        assert_gone(
            &node,
            Some(&pod.netns),
            "eth0",
            &pod.r,
            &list.name,
            &pod.att.container_id,
            "DEL with the example",
        );
    }
}

#[test]
fn chained_example_serves_host_ports_after_bridge() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let (shipped, list) = example("chained-bridge.conflist", &node);
    let types: Vec<&str> = shipped["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pl| pl["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["bridge", p.plugin_type.as_str()]);
    assert!(
        shipped["plugins"][1].get("ipam").is_none(),
        "chained mode is ebpf-cni without ipam"
    );
    let ext = unrouted_host(&node, 3);
    let pod = add(&p, &node, &list, HOST_PORT);

    let server = PodServer::start(&pod.netns, POD_PORT, "chained");
    let answer = tcp_ask(ext.netns(), sa(ext.node_v4, HOST_PORT))
        .unwrap_or_else(|e| panic!("the host port {HOST_PORT} through the chain: {e:#}"));
    assert_eq!(tag_of(&answer), "chained", "answered by {answer:?}");
    drop(server);

    p.runtime
        .check(&node, &list, &pod.att, &pod.result)
        .unwrap_or_else(|e| panic!("CHECK with the chained example: {e}"));
    p.runtime
        .del(&node, &list, &pod.att, Some(&pod.result))
        .unwrap_or_else(|e| panic!("DEL with the chained example: {e}"));
    let pins = node.attachment_pin_dir(&list.name, &pod.att.container_id, "eth0");
    assert!(
        !Path::new(&pins).exists(),
        "DEL left ebpf-cni's pins at {}",
        pins.display()
    );
}
