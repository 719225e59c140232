//! ebpf-cni's CNI 1.1 commands against the real kernel (spec 1.1 summary in
//! SPEC-1.1-ADDITIONS.md): GC removes every attachment of the network the runtime no
//! longer lists — host veth, leases, pins, endpoint-map entries — and leaves the listed
//! ones working; STATUS says whether the node can serve ADD (exit 0, or error 50/51 naming
//! what is wrong); VERSION lists 1.1.0.

use std::net::IpAddr;

use ebpf_cni_tests::config::{self, Stack, NETWORK};
use ebpf_cni_tests::dataplane as dp;
use ebpf_cni_tests::kernel::Family;
use ebpf_cni_tests::net::tcp_echo;
use ebpf_cni_tests::state::{assert_attachment, assert_gone};
use ebpf_cni_tests::{
    bpf, fsutil, require_root, unique_container_id, AddResult, Attachment, CniCommand,
    ContainerEnv, ListError, NetConfList, Node, PluginUnderTest, Pod,
};
use serde_json::{json, Value};

const V1_1: &str = "1.1.0";

/// Dual stack, cniVersion 1.1.0, with the port mapping capability (used by the pods that
/// pass `host_port`).
fn dual_list(p: &PluginUnderTest, node: &Node) -> NetConfList {
    let mut conf = p.conf(V1_1, node, Stack::Dual);
    conf["capabilities"] = json!({ "portMappings": true });
    NetConfList::single(&conf)
}

/// A pod, with `host_port` -> 80/tcp mapped when given.
fn add_pod_with_port(p: &PluginUnderTest, node: &Node, list: &NetConfList, host_port: u16) -> Pod {
    Pod::add_with(p, node, list, Stack::Dual, |att| {
        att.with_capability(
            "portMappings",
            json!([{ "hostPort": host_port, "containerPort": 80, "protocol": "tcp" }]),
        )
    })
}

/// `CNI_PATH` only: GC and STATUS get no attachment parameters (spec 1.1).
fn network_env(p: &PluginUnderTest) -> ContainerEnv {
    ContainerEnv::none().with_cni_path(&p.runtime.cni_path_env())
}

fn pinned_under(node: &Node, container_id: &str) -> Vec<String> {
    fsutil::list_files(node.pin_root())
        .unwrap_or_default()
        .into_iter()
        .map(|f| f.display().to_string())
        .filter(|f| f.contains(container_id))
        .collect()
}

/// Spec 1.1 GC: "The plugin removes every resource of this network whose attachment is not
/// in the list (IP reservations, host devices, programs, maps, rules) and leaves listed ones
/// alone." Three pods, each with a host port, GC listing one: the other two lose their
/// host veth (and with it the pod end and the node routes), leases, attachment pins,
/// endpoint-map entries, counters and host port mappings (their ports are free again);
/// the listed one still passes CHECK (spec 1.0 section 2, CHECK) and carries TCP, also to
/// a pod added after the GC. GC listing every attachment is a no-op.
#[test]
fn gc_removes_unlisted_attachments_and_keeps_the_listed_one() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let list = dual_list(&p, &node);
    let pods: Vec<Pod> = (0..3u16)
        .map(|i| add_pod_with_port(&p, &node, &list, 7000 + i))
        .collect();
    let (gone, kept) = (&pods[..2], &pods[2]);
    assert_eq!(
        dp::port_mappings(&node).unwrap().len(),
        6,
        "control: one host port x two families x three pods"
    );
    let counters_before = dp::pod_counters(&node).unwrap();
    let gone_ifindexes: Vec<u32> = gone
        .iter()
        .map(|pod| bpf::ifindex_in(node.netns(), &pod.r.host_ifname).unwrap())
        .collect();
    for i in &gone_ifindexes {
        assert!(
            counters_before.contains_key(i),
            "control: counters exist for ifindex {i} before GC"
        );
    }
    assert_eq!(
        dp::endpoints(&node).unwrap().len(),
        6,
        "control: 2 addresses x 3 pods"
    );

    p.runtime
        .gc(&node, &list, &[(kept.id(), "eth0")])
        .unwrap_or_else(|e| panic!("GC listing one pod: {e}"));

    let eps = dp::endpoints(&node).unwrap();
    let counters = dp::pod_counters(&node).unwrap();
    for (pod, ifindex) in gone.iter().zip(&gone_ifindexes) {
        assert_gone(
            &node,
            Some(&pod.netns),
            "eth0",
            &pod.r,
            NETWORK,
            pod.id(),
            "GC of an unlisted attachment",
        );
        for ip in pod.ips() {
            assert!(
                !eps.contains_key(&ip),
                "GC left the endpoint of {ip}: {eps:?}"
            );
        }
        assert!(
            !counters.contains_key(ifindex),
            "GC left the counters of ifindex {ifindex}"
        );
        let pins = pinned_under(&node, pod.id());
        assert!(pins.is_empty(), "GC left pins of {}: {pins:?}", pod.id());
    }

    // The listed pod is untouched and working.
    assert_attachment(&node, &kept.netns, "eth0", &kept.r, Some(config::MTU));
    let mut kept_ips: Vec<IpAddr> = eps.keys().copied().collect();
    kept_ips.sort();
    let mut expected = kept.ips();
    expected.sort();
    assert_eq!(
        kept_ips, expected,
        "endpoint map after GC holds the kept pod only"
    );
    assert_eq!(
        node.leases(NETWORK)
            .iter()
            .map(|l| (l.container_id.as_str(), l.ifname.as_deref()))
            .collect::<Vec<_>>(),
        [(kept.id(), Some("eth0")), (kept.id(), Some("eth0"))],
        "leases after GC"
    );
    let mut mapped: Vec<(u16, IpAddr)> = dp::port_mappings(&node)
        .unwrap()
        .iter()
        .map(|e| (e.host_port, e.pod))
        .collect();
    mapped.sort();
    let mut expected: Vec<(u16, IpAddr)> = kept.ips().into_iter().map(|ip| (7002, ip)).collect();
    expected.sort();
    assert_eq!(
        mapped, expected,
        "host port mappings after GC: the kept pod's only"
    );
    p.runtime
        .check(&node, &list, &kept.att, &kept.result)
        .unwrap_or_else(|e| panic!("CHECK of the listed pod after GC: {e}"));
    for fam in [Family::V4, Family::V6] {
        tcp_echo(node.netns(), &kept.netns, kept.addr(fam), 0)
            .unwrap_or_else(|e| panic!("node -> kept pod {}: {e:#}", kept.addr(fam)));
    }
    // The node's shared state survived: a new pod, on a host port a removed pod held, and
    // the kept one reach each other.
    let newer = add_pod_with_port(&p, &node, &list, 7000);
    for fam in [Family::V4, Family::V6] {
        tcp_echo(&newer.netns, &kept.netns, kept.addr(fam), 0)
            .unwrap_or_else(|e| panic!("new pod -> kept pod {}: {e:#}", kept.addr(fam)));
        tcp_echo(&kept.netns, &newer.netns, newer.addr(fam), 0)
            .unwrap_or_else(|e| panic!("kept pod -> new pod {}: {e:#}", newer.addr(fam)));
    }

    // Listing every attachment: nothing changes.
    let before = node.snapshot(None);
    let eps_before = dp::endpoints(&node).unwrap();
    p.runtime
        .gc(&node, &list, &[(kept.id(), "eth0"), (newer.id(), "eth0")])
        .unwrap_or_else(|e| panic!("GC listing every pod: {e}"));
    assert_eq!(
        node.snapshot(None),
        before,
        "GC listing every attachment changed the node"
    );
    assert_eq!(dp::endpoints(&node).unwrap(), eps_before);
    p.runtime
        .check(&node, &list, &newer.att, &newer.result)
        .unwrap_or_else(|e| panic!("CHECK after a no-op GC: {e}"));

    for pod in [kept, &newer] {
        p.runtime
            .del(&node, &list, &pod.att, Some(&pod.result))
            .unwrap_or_else(|e| panic!("DEL: {e}"));
    }
    assert!(node.leases(NETWORK).is_empty());
    assert!(
        !node.pin_root().exists(),
        "the last DEL after GC leaves no pins"
    );
}

/// GC with an empty list removes everything of the network, including the node's shared
/// eBPF state once its last pod is gone (what the last DEL does), and only this network:
/// a pod of another network on the node stays.
#[test]
fn gc_with_an_empty_list_empties_the_network_only() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let list = dual_list(&p, &node);
    let pods: Vec<Pod> = (0..2)
        .map(|_| Pod::add(&p, &node, &list, Stack::Dual))
        .collect();

    let mut other_conf = p.conf(V1_1, &node, Stack::V4);
    other_conf["name"] = json!("othernet");
    other_conf = config::with_v4_subnet(other_conf, "10.20.0.0/24");
    let other_list = NetConfList::single(&other_conf);
    let other_ns = node.new_pod().unwrap();
    let other_att = Attachment::new(&unique_container_id(), other_ns.path(), "eth0");
    let other_res = p
        .runtime
        .add(&node, &other_list, &other_att)
        .unwrap_or_else(|e| panic!("ADD on othernet: {e}"));
    // Not the template's subnet, so parsed rather than checked against it.
    let other = AddResult::parse(&other_res).expect("a parsable ADD result");

    p.runtime
        .gc(&node, &list, &[])
        .unwrap_or_else(|e| panic!("GC with an empty list: {e}"));
    for pod in &pods {
        assert_gone(
            &node,
            Some(&pod.netns),
            "eth0",
            &pod.r,
            NETWORK,
            pod.id(),
            "GC []",
        );
    }
    assert_attachment(&node, &other_ns, "eth0", &other, Some(config::MTU));
    p.runtime
        .check(&node, &other_list, &other_att, &other_res)
        .unwrap_or_else(|e| panic!("CHECK of the other network's pod: {e}"));

    p.runtime
        .gc(&node, &other_list, &[])
        .unwrap_or_else(|e| panic!("GC of othernet: {e}"));
    assert_gone(
        &node,
        Some(&other_ns),
        "eth0",
        &other,
        "othernet",
        &other_att.container_id,
        "GC []",
    );
    assert!(
        !node.pin_root().exists(),
        "GC of the node's last pods left {:?}",
        fsutil::list_files(node.pin_root())
    );
}

/// Spec 1.1 GC on a network with nothing: success, nothing printed, nothing created — also
/// when the list names attachments that do not exist.
#[test]
fn gc_of_an_empty_network_succeeds() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let list = dual_list(&p, &node);
    let before = node.snapshot(None);
    for valid in [vec![], vec![("f00d", "eth0")]] {
        let out = p.run(
            &node,
            CniCommand::Gc,
            &network_env(&p),
            list.gc_config(0, &valid).to_string(),
        );
        assert_eq!(out.expect_success("GC of an empty network"), Value::Null);
        assert!(out.stdout.trim().is_empty(), "GC printed {}", out.stdout);
    }
    assert_eq!(
        node.snapshot(None),
        before,
        "GC of an empty network changed the node"
    );
    assert!(!node.pin_root().exists());
}

/// GC deletes what is not listed, so a request it cannot read deletes nothing: without
/// `cni.dev/valid-attachments` (code 7, naming the field) or with a config older than
/// 1.1.0 (code 1, as the reference `skel` answers; libcni never sends one). The pod stays.
#[test]
fn gc_refuses_requests_without_the_list_or_below_1_1_0() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let list = dual_list(&p, &node);
    let pod = Pod::add(&p, &node, &list, Stack::Dual);
    let before = node.snapshot(Some(&pod.netns));

    let mut no_list = list.gc_config(0, &[]);
    no_list
        .as_object_mut()
        .unwrap()
        .remove("cni.dev/valid-attachments");
    let mut malformed = list.gc_config(0, &[]);
    malformed["cni.dev/valid-attachments"] = json!([{"containerID": pod.id()}]);
    let mut old = list.gc_config(0, &[]);
    old["cniVersion"] = json!("1.0.0");
    let cases = [
        (no_list, 7, "cni.dev/valid-attachments"),
        (malformed, 7, "cni.dev/valid-attachments[0].ifname"),
        (old, 1, "1.1.0"),
    ];
    for (conf, code, needle) in cases {
        let out = p.run(&node, CniCommand::Gc, &network_env(&p), conf.to_string());
        let err = out.expect_error(code, needle);
        assert!(
            err.text_lower().contains(&needle.to_lowercase()),
            "the message must name {needle}: {err:?}"
        );
        assert_eq!(
            node.snapshot(Some(&pod.netns)),
            before,
            "a refused GC changed the node"
        );
    }
    let old_list = NetConfList::single(&p.conf("1.0.0", &node, Stack::Dual));
    assert!(
        matches!(
            p.runtime.gc(&node, &old_list, &[]),
            Err(ListError::GcStatusUnsupported(_))
        ),
        "the harness runtime refuses GC below 1.1.0 like libcni"
    );
    p.runtime
        .check(&node, &list, &pod.att, &pod.result)
        .unwrap_or_else(|e| panic!("CHECK after refused GCs: {e}"));
    p.runtime
        .del(&node, &list, &pod.att, Some(&pod.result))
        .unwrap_or_else(|e| panic!("DEL: {e}"));
}

/// Spec 1.1 STATUS: exit 0 with nothing printed when the plugin can serve ADD — on a node
/// without pods (nothing pinned yet: the programs must load) and with pods (pinned
/// programs and maps) — and STATUS changes nothing.
#[test]
fn status_succeeds_on_a_healthy_node() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let list = dual_list(&p, &node);
    let conf = list.exec_config(0, &Default::default(), None).to_string();

    let before = node.snapshot(None);
    let out = p.run(&node, CniCommand::Status, &network_env(&p), &conf);
    assert_eq!(out.expect_success("STATUS on an empty node"), Value::Null);
    assert!(
        out.stdout.trim().is_empty(),
        "STATUS printed {}",
        out.stdout
    );
    assert_eq!(node.snapshot(None), before, "STATUS changed the node");
    assert!(!node.pin_root().exists(), "STATUS pinned something");

    let pod = Pod::add(&p, &node, &list, Stack::Dual);
    p.runtime
        .status(&node, &list)
        .unwrap_or_else(|e| panic!("STATUS with a pod: {e}"));
    p.runtime
        .del(&node, &list, &pod.att, Some(&pod.result))
        .unwrap_or_else(|e| panic!("DEL: {e}"));
    p.runtime
        .status(&node, &list)
        .unwrap_or_else(|e| panic!("STATUS after the last DEL: {e}"));
}

/// Spec 1.1 STATUS, code 50 "the plugin is not available (cannot serve ADD requests)": a
/// /30 has one address besides the gateway; once it is leased STATUS fails with 50 naming
/// the exhausted range, and the failing ADD agrees (102). After DEL, STATUS is 0 again.
#[test]
fn status_is_50_naming_the_exhausted_range() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let conf = config::with_v4_subnet(p.conf(V1_1, &node, Stack::V4), "10.10.0.0/30");
    let list = NetConfList::single(&conf);
    p.runtime
        .status(&node, &list)
        .unwrap_or_else(|e| panic!("STATUS with a free address: {e}"));

    let pod = node.new_pod().unwrap();
    let att = Attachment::new(&unique_container_id(), pod.path(), "eth0");
    let res = p
        .runtime
        .add(&node, &list, &att)
        .unwrap_or_else(|e| panic!("ADD of the only address: {e}"));

    let out = p.run(
        &node,
        CniCommand::Status,
        &network_env(&p),
        conf.to_string(),
    );
    let err = out.expect_error(50, "STATUS with the range full");
    let text = err.text_lower();
    for needle in ["10.10.0.0/30", "10.10.0.2", "exhausted", "ipam.ranges[0]"] {
        assert!(
            text.contains(needle),
            "STATUS message must name {needle}: {err:?}"
        );
    }
    assert_eq!(err.cni_version.as_deref(), Some(V1_1));

    let other = node.new_pod().unwrap();
    p.run(
        &node,
        CniCommand::Add,
        &p.env(&unique_container_id(), other.path(), "eth0"),
        conf.to_string(),
    )
    .expect_error(102, "ADD agrees with STATUS");

    p.runtime
        .del(&node, &list, &att, Some(&res))
        .unwrap_or_else(|e| panic!("DEL: {e}"));
    p.runtime
        .status(&node, &list)
        .unwrap_or_else(|e| panic!("STATUS after the address was freed: {e}"));
}

/// Spec 1.1 STATUS, code 51 "not available, and existing containers in the network may
/// have limited connectivity": the node's pinned maps vanish while a pod is attached (its
/// programs still look addresses up in them, and an ADD would start new maps). The message
/// names the maps. DEL still cleans up.
#[test]
fn status_is_51_when_the_node_maps_are_gone_under_a_pod() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let list = dual_list(&p, &node);
    let pod = Pod::add(&p, &node, &list, Stack::Dual);
    std::fs::remove_file(dp::map_pin(&node, dp::ENDPOINTS_MAP)).unwrap();

    let conf = list.exec_config(0, &Default::default(), None).to_string();
    let out = p.run(&node, CniCommand::Status, &network_env(&p), &conf);
    let err = out.expect_error(51, "STATUS with the maps gone");
    let text = err.text_lower();
    assert!(
        text.contains("maps") && text.contains(&node.pin_root().display().to_string()),
        "STATUS message must name the missing maps: {err:?}"
    );

    p.runtime
        .del(&node, &list, &pod.att, Some(&pod.result))
        .unwrap_or_else(|e| panic!("DEL: {e}"));
    assert_gone(
        &node,
        Some(&pod.netns),
        "eth0",
        &pod.r,
        NETWORK,
        pod.id(),
        "DEL",
    );
    p.runtime
        .status(&node, &list)
        .unwrap_or_else(|e| panic!("STATUS after the node was emptied: {e}"));
}

/// STATUS needs a 1.1.0 config (code 1 below, as the reference `skel`), and a config ADD
/// would refuse is refused the same way (code 7).
#[test]
fn status_refuses_old_and_invalid_configs() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let old = p.conf("1.0.0", &node, Stack::V4);
    p.run(&node, CniCommand::Status, &network_env(&p), old.to_string())
        .expect_error(1, "STATUS with cniVersion 1.0.0");
    let mut bad = p.conf(V1_1, &node, Stack::V4);
    bad["ipam"]["ranges"] = json!([[{ "subnet": "10.10.0.0/33" }]]);
    let err = p
        .run(&node, CniCommand::Status, &network_env(&p), bad.to_string())
        .expect_error(7, "STATUS with an invalid subnet");
    assert!(err.text_lower().contains("10.10.0.0/33"), "{err:?}");
}

/// Spec 1.1: "VERSION of a 1.1 plugin lists \"1.1.0\" among supportedVersions".
#[test]
fn version_lists_1_1_0() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let out = p.run(
        &node,
        CniCommand::Version,
        &ContainerEnv::none(),
        json!({ "cniVersion": V1_1 }).to_string(),
    );
    let v = out.expect_success("VERSION 1.1.0");
    assert_eq!(v["cniVersion"], V1_1);
    assert!(
        v["supportedVersions"]
            .as_array()
            .is_some_and(|l| l.iter().any(|s| s == V1_1)),
        "{v}"
    );
}
