//! ebpf-cni's attachment lifecycle against the real kernel: ADD/CHECK/DEL per spec version
//! as a runtime runs them (section 3), the ptp-style kernel state, dual-stack traffic, DEL
//! idempotence and late DELs, CHECK noticing damage, rollback of failed ADDs, concurrent
//! ADD/DEL, sharing the IPAM store with the reference host-local, and the store rewriting
//! the round robin's file in place.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::Path;

use ebpf_cni_tests::config::{self, Stack, NETWORK};
use ebpf_cni_tests::net::{tcp_echo, udp_echo};
use ebpf_cni_tests::rtevents::{Event, RtEvents};
use ebpf_cni_tests::state::{assert_attachment, assert_gone, leftover_problems};
use ebpf_cni_tests::strace::Traced;
use ebpf_cni_tests::{
    kernel, require_root, unique_container_id, AddResult, Attachment, CniCommand, ListError,
    NetConfList, Netns, Node, PluginUnderTest, Pod, ResultExpectation, REFERENCE_HOST_LOCAL,
};
use serde_json::{json, Value};

fn expectation(version: &str, pod: &Path, stack: Stack) -> ResultExpectation {
    ResultExpectation::standard(version, "eth0", &pod.to_string_lossy(), stack)
        .ebpf_cni_host_names()
}

/// A one-plugin list whose plugin accepts the `mac` capability (CONVENTIONS.md).
fn list_with_mac_capability(p: &PluginUnderTest, version: &str, node: &Node) -> NetConfList {
    let mut conf = p.conf(version, node, Stack::Dual);
    conf["capabilities"] = json!({ "mac": true });
    NetConfList::single(&conf)
}

/// Sections 3 and 5 for one version: ADD through the runtime (MAC from `runtimeConfig.mac`
/// for one pod, from `CNI_ARGS MAC=` for the other), the versioned result format, the
/// kernel state, CHECK with the cached result (0.4.0+; libcni refuses CHECK before), DEL
/// with it, and a second DEL succeeding (section 2: "Plugins MUST accept multiple DEL
/// calls").
fn add_check_del(version: &str) {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let (pod_a, pod_b) = (node.new_pod().unwrap(), node.new_pod().unwrap());
    let list = list_with_mac_capability(&p, version, &node);
    let (mac_a, mac_b) = ("0a:58:0a:0a:00:aa", "0a:58:0a:0a:00:bb");
    let (cid_a, cid_b) = (unique_container_id(), unique_container_id());
    let att_a = Attachment::new(&cid_a, pod_a.path(), "eth0").with_capability("mac", json!(mac_a));
    let att_b = Attachment::new(&cid_b, pod_b.path(), "eth0").with_args(&format!("MAC={mac_b}"));

    let res_a = p
        .runtime
        .add(&node, &list, &att_a)
        .unwrap_or_else(|e| panic!("ADD a: {e}"));
    let res_b = p
        .runtime
        .add(&node, &list, &att_b)
        .unwrap_or_else(|e| panic!("ADD b: {e}"));
    let a = expectation(version, pod_a.path(), Stack::Dual)
        .with_container_mac(mac_a)
        .assert_valid(&res_a);
    let b = expectation(version, pod_b.path(), Stack::Dual)
        .with_container_mac(mac_b)
        .assert_valid(&res_b);
    assert_ne!(a.host_ifname, b.host_ifname);
    assert_eq!(
        a.ip4().unwrap().addr.to_string(),
        "10.10.0.2",
        "first free address after the gateway"
    );
    assert_attachment(&node, &pod_a, "eth0", &a, Some(config::MTU));
    assert_attachment(&node, &pod_b, "eth0", &b, Some(config::MTU));

    // One reservation per IP, recorded for the right container and interface.
    let leases = node.leases(NETWORK);
    assert_eq!(leases.len(), 4, "{leases:?}");
    for (cid, r) in [(&cid_a, &a), (&cid_b, &b)] {
        for ip in &r.ips {
            let l = leases
                .iter()
                .find(|l| l.ip == ip.addr)
                .unwrap_or_else(|| panic!("no lease for {}", ip.addr));
            assert_eq!(&l.container_id, cid);
            assert_eq!(l.ifname.as_deref(), Some("eth0"));
        }
    }

    match p.runtime.check(&node, &list, &att_a, &res_a) {
        Ok(()) => assert!(version >= "0.4.0"),
        Err(ListError::CheckUnsupported(_)) => assert!(version < "0.4.0"),
        Err(e) => panic!("CHECK right after ADD must succeed (section 2 CHECK): {e}"),
    }

    p.runtime
        .del(&node, &list, &att_a, Some(&res_a))
        .unwrap_or_else(|e| panic!("DEL a: {e}"));
    assert_gone(&node, Some(&pod_a), "eth0", &a, NETWORK, &cid_a, "DEL a");
    assert_attachment(&node, &pod_b, "eth0", &b, Some(config::MTU));
    p.runtime
        .del(&node, &list, &att_a, Some(&res_a))
        .unwrap_or_else(|e| panic!("second DEL a: {e}"));
    p.runtime
        .del(&node, &list, &att_b, Some(&res_b))
        .unwrap_or_else(|e| panic!("DEL b: {e}"));
    assert_gone(&node, Some(&pod_b), "eth0", &b, NETWORK, &cid_b, "DEL b");
    assert!(node.leases(NETWORK).is_empty());
}

#[test]
fn add_check_del_0_3_0() {
    add_check_del("0.3.0");
}

#[test]
fn add_check_del_0_3_1() {
    add_check_del("0.3.1");
}

#[test]
fn add_check_del_0_4_0() {
    add_check_del("0.4.0");
}

#[test]
fn add_check_del_1_0_0() {
    add_check_del("1.0.0");
}

/// Spec 1.1 changes no ADD/CHECK/DEL behaviour and keeps 1.0.0's result layout.
#[test]
fn add_check_del_1_1_0() {
    add_check_del("1.1.0");
}

/// ADD twice, returning the attachments and parsed results (1.0.0, dual stack).
fn add_pods(
    p: &PluginUnderTest,
    node: &Node,
    list: &NetConfList,
    pods: &[&ebpf_cni_tests::Netns],
) -> Vec<(Attachment, Value, AddResult)> {
    pods.iter()
        .map(|pod| {
            let att = Attachment::new(&unique_container_id(), pod.path(), "eth0");
            let res = p
                .runtime
                .add(node, list, &att)
                .unwrap_or_else(|e| panic!("ADD: {e}"));
            let parsed = expectation(&list.cni_version, pod.path(), Stack::Dual).assert_valid(&res);
            (att, res, parsed)
        })
        .collect()
}

/// Pod↔pod on one node and node→pod, TCP and UDP, IPv4 and IPv6, with the pod's source
/// address preserved (no NAT between pods).
#[test]
fn dual_stack_connectivity() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let (pod_a, pod_b) = (node.new_pod().unwrap(), node.new_pod().unwrap());
    let list = NetConfList::single(&p.conf("1.0.0", &node, Stack::Dual));
    let added = add_pods(&p, &node, &list, &[&pod_a, &pod_b]);
    let (a, b) = (&added[0].2, &added[1].2);

    let mut failures = Vec::new();
    let pairs = [
        (a.ip4().unwrap().addr, b.ip4().unwrap().addr),
        (a.ip6().unwrap().addr, b.ip6().unwrap().addr),
    ];
    for (from_ip, to_ip) in pairs {
        match tcp_echo(&pod_a, &pod_b, to_ip, 0) {
            Ok(e) if e.client_addr.ip() == from_ip => {}
            Ok(e) => failures.push(format!(
                "pod a -> {to_ip}: source seen as {}, not {from_ip}",
                e.client_addr
            )),
            Err(e) => failures.push(format!("TCP pod a -> pod b {to_ip}: {e:#}")),
        }
        if let Err(e) = tcp_echo(&pod_b, &pod_a, from_ip, 0) {
            failures.push(format!("TCP pod b -> pod a {from_ip}: {e:#}"));
        }
        if let Err(e) = udp_echo(&pod_a, &pod_b, to_ip, 0) {
            failures.push(format!("UDP pod a -> pod b {to_ip}: {e:#}"));
        }
        if let Err(e) = tcp_echo(node.netns(), &pod_a, from_ip, 0) {
            failures.push(format!("TCP node -> pod a {from_ip}: {e:#}"));
        }
    }
    for (att, res, _) in &added {
        p.runtime
            .del(&node, &list, att, Some(res))
            .unwrap_or_else(|e| panic!("DEL: {e}"));
    }
    assert!(
        failures.is_empty(),
        "connectivity failures:\n  - {}",
        failures.join("\n  - ")
    );
}

/// Section 2 DEL: succeeds and cleans up the same when `CNI_NETNS` is empty and there is
/// no prevResult (what containerd sends on later DELs), when the pod netns is already
/// gone, and for an attachment that never existed.
#[test]
fn del_without_netns_or_prev_result() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let (pod1, pod2) = (node.new_pod().unwrap(), node.new_pod().unwrap());
    let conf = p.conf("1.0.0", &node, Stack::Dual);
    let stdin = conf.to_string();

    // CNI_NETNS="" and no prevResult.
    let cid1 = unique_container_id();
    let env1 = p.env(&cid1, pod1.path(), "eth0");
    let r1 = p
        .run(&node, CniCommand::Add, &env1, &stdin)
        .expect_success("ADD 1");
    let a1 = expectation("1.0.0", pod1.path(), Stack::Dual).assert_valid(&r1);
    let late = p.env(&cid1, "", "eth0");
    p.run(&node, CniCommand::Del, &late, &stdin)
        .expect_success("DEL with CNI_NETNS=\"\", no prevResult");
    assert_gone(
        &node,
        Some(&pod1),
        "eth0",
        &a1,
        NETWORK,
        &cid1,
        "DEL with empty CNI_NETNS",
    );
    p.run(&node, CniCommand::Del, &late, &stdin)
        .expect_success("repeated late DEL");

    // The runtime deleted the pod netns before DEL.
    let cid2 = unique_container_id();
    let env2 = p.env(&cid2, pod2.path(), "eth0");
    let r2 = p
        .run(&node, CniCommand::Add, &env2, &stdin)
        .expect_success("ADD 2");
    let a2 = expectation("1.0.0", pod2.path(), Stack::Dual).assert_valid(&r2);
    pod2.delete().unwrap();
    let mut with_prev = conf.clone();
    with_prev["prevResult"] = r2.clone();
    p.run(&node, CniCommand::Del, &env2, with_prev.to_string())
        .expect_success("DEL after the pod netns is gone");
    assert_gone(
        &node,
        None,
        "eth0",
        &a2,
        NETWORK,
        &cid2,
        "DEL after netns removal",
    );

    // Never added.
    let env3 = p.env(&unique_container_id(), "", "eth0");
    p.run(&node, CniCommand::Del, &env3, &stdin)
        .expect_success("DEL of an unknown attachment");
    assert!(node.leases(NETWORK).is_empty());
}

/// Section 2 CHECK: "should return an error if a resource ... is missing". Each attachment
/// is damaged one way; CHECK fails with 105 and the message names what is wrong. DEL
/// still cleans up each damaged attachment.
#[test]
fn check_detects_damage() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let list = NetConfList::single(&p.conf("1.0.0", &node, Stack::Dual));

    type Damage = fn(&Node, &ebpf_cni_tests::Netns, &AddResult);
    let cases: [(&str, Damage, Vec<&str>); 5] = [
        (
            "container address deleted",
            |_, pod, r| {
                let ip = r.ip4().unwrap();
                pod.ip_ok(&[
                    "addr",
                    "del",
                    &format!("{}/{}", ip.addr, ip.prefix),
                    "dev",
                    "eth0",
                ])
                .unwrap();
            },
            vec!["address", "10.10.0."],
        ),
        (
            "container default route deleted",
            |_, pod, _| {
                pod.ip_ok(&["-4", "route", "del", "default"]).unwrap();
            },
            vec!["route"],
        ),
        (
            "host route to the pod deleted",
            |node, _, r| {
                let ip = r.ip4().unwrap().addr;
                node.netns()
                    .ip_ok(&["route", "del", &format!("{ip}/32"), "dev", &r.host_ifname])
                    .unwrap();
            },
            vec!["route"],
        ),
        (
            "host veth deleted",
            |node, _, r| {
                node.netns()
                    .ip_ok(&["link", "del", &r.host_ifname])
                    .unwrap();
            },
            vec!["veth", "interface", "link", "ecni"],
        ),
        (
            "IPAM reservation file deleted",
            |node, _, r| {
                let f = node
                    .data_dir()
                    .join(NETWORK)
                    .join(r.ip4().unwrap().addr.to_string());
                std::fs::remove_file(&f)
                    .unwrap_or_else(|e| panic!("removing {}: {e}", f.display()));
            },
            vec!["lease", "reserv", "ipam", "alloc", "10.10.0."],
        ),
    ];

    let mut failures = Vec::new();
    let mut pods = Vec::new();
    for (what, damage, needles) in &cases {
        let pod = node.new_pod().unwrap();
        let att = Attachment::new(&unique_container_id(), pod.path(), "eth0");
        let res = p
            .runtime
            .add(&node, &list, &att)
            .unwrap_or_else(|e| panic!("ADD: {e}"));
        let parsed = expectation("1.0.0", pod.path(), Stack::Dual).assert_valid(&res);
        if let Err(e) = p.runtime.check(&node, &list, &att, &res) {
            failures.push(format!("{what}: CHECK before damage failed: {e}"));
        }
        damage(&node, &pod, &parsed);
        match p.runtime.check(&node, &list, &att, &res) {
            Ok(()) => failures.push(format!("{what}: CHECK succeeded")),
            Err(e) => match e.output().and_then(|o| o.error().map(|err| (o, err))) {
                None => failures.push(format!("{what}: no error result: {e}")),
                Some((o, err)) => {
                    if err.code != 105 {
                        failures.push(format!(
                            "{what}: code {} (expected 105)\n{}",
                            err.code,
                            o.describe()
                        ));
                    }
                    let text = err.text_lower();
                    if !needles.iter().any(|n| text.contains(n)) {
                        failures.push(format!(
                            "{what}: message names none of {needles:?}: {:?}",
                            err.msg
                        ));
                    }
                }
            },
        }
        pods.push((pod, att, res, parsed));
    }
    for (pod, att, res, parsed) in &pods {
        if let Err(e) = p.runtime.del(&node, &list, att, Some(res)) {
            failures.push(format!("DEL of a damaged attachment failed: {e}"));
            continue;
        }
        let left = leftover_problems(&node, Some(pod), "eth0", parsed, NETWORK, &att.container_id);
        if !left.is_empty() {
            failures.push(format!("after DEL of a damaged attachment: {left:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "CHECK/DEL failures:\n  - {}",
        failures.join("\n  - ")
    );
}

/// STYLE.md "ADD rolls back" and section 4 ("If, on ADD, a delegated plugin fails, the
/// upper plugin should execute again with DEL"): a failure after everything was set up
/// (failpoint before the result is printed) and a natural failure after the veth exists
/// (a route whose gateway is unreachable) leave no link, route, lease or pin.
#[test]
fn failed_add_rolls_back_everything() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let conf = p.conf("1.0.0", &node, Stack::Dual);

    // Warm the node once, so node-wide state created by a first ADD (shared maps, the
    // store directory) is part of the baseline and not mistaken for a leak.
    let warm = node.new_pod().unwrap();
    let env = p.env(&unique_container_id(), warm.path(), "eth0");
    p.run(&node, CniCommand::Add, &env, conf.to_string())
        .expect_success("warm-up ADD");
    p.run(&node, CniCommand::Del, &env, conf.to_string())
        .expect_success("warm-up DEL");

    let pod = node.new_pod().unwrap();
    let before = node.snapshot(Some(&pod)).without_lock();
    let cid = unique_container_id();
    let env = p
        .env(&cid, pod.path(), "eth0")
        .with_env("EBPF_CNI_FAILPOINT", "before-result");
    let out = p.run(&node, CniCommand::Add, &env, conf.to_string());
    assert!(
        !out.success() && out.error().is_some(),
        "failpoint ADD must fail with an error result\n{}",
        out.describe()
    );
    assert_eq!(
        node.snapshot(Some(&pod)).without_lock(),
        before,
        "failpoint before-result left state behind"
    );
    assert!(!node.attachment_pin_dir(NETWORK, &cid, "eth0").exists());

    let mut bad_route = conf.clone();
    bad_route["ipam"]["routes"] =
        json!([{ "dst": "0.0.0.0/0" }, { "dst": "10.99.0.0/16", "gw": "192.0.2.1" }]);
    let cid = unique_container_id();
    let env = p.env(&cid, pod.path(), "eth0");
    let out = p.run(&node, CniCommand::Add, &env, bad_route.to_string());
    assert!(
        !out.success() && out.error().is_some(),
        "ADD with an unreachable route gateway must fail\n{}",
        out.describe()
    );
    assert_eq!(
        node.snapshot(Some(&pod)).without_lock(),
        before,
        "failed route setup left state behind"
    );
    assert!(!node.attachment_pin_dir(NETWORK, &cid, "eth0").exists());
}

/// A failed ADD whose `CNI_NETNS` is not a usable pod namespace (a regular file, a file
/// in procfs, a directory, a missing path, the node's own namespace) fails with code 106
/// and changes nothing: on an empty node no pin directory (not even an empty one) and no
/// lease appear; on a node with a pod its pin tree, directories included, stays as it was.
#[test]
fn add_with_a_bad_netns_fails_with_106_and_leaves_nothing() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let conf = p.conf("1.0.0", &node, Stack::Dual);
    let file = node.scratch_dir().join("not-a-netns");
    std::fs::write(&file, b"").unwrap();
    let dir = node.scratch_dir().join("a-directory");
    std::fs::create_dir(&dir).unwrap();
    let cases: [(&str, &Path); 5] = [
        ("a regular file", &file),
        ("a file in procfs", Path::new("/proc/version")),
        ("a directory", &dir),
        ("a missing path", &node.scratch_dir().join("missing")),
        ("the node's own netns", node.netns().path()),
    ];
    let try_all = |what: &str| {
        for (kind, netns) in cases {
            let before = node.snapshot(None).without_lock();
            let cid = unique_container_id();
            let env = p.env(&cid, netns, "eth0");
            let out = p.run(&node, CniCommand::Add, &env, conf.to_string());
            let err = out.expect_error(106, &format!("ADD with CNI_NETNS {kind} ({what})"));
            assert!(
                err.msg.contains(&netns.display().to_string()),
                "{kind}: the message names the path: {}",
                err.msg
            );
            assert_eq!(
                node.snapshot(None).without_lock(),
                before,
                "ADD with CNI_NETNS {kind} ({what}) changed the node"
            );
        }
    };
    try_all("empty node");
    assert!(node.leases(NETWORK).is_empty(), "failed ADDs left leases");
    assert!(
        !node.pin_root().exists(),
        "failed ADDs left {}: {:?}",
        node.pin_root().display(),
        ebpf_cni_tests::fsutil::list_dirs(node.pin_root())
    );

    let pod = node.new_pod().unwrap();
    let env = p.env(&unique_container_id(), pod.path(), "eth0");
    p.run(&node, CniCommand::Add, &env, conf.to_string())
        .expect_success("ADD of a real pod");
    try_all("node with a pod");
    p.run(&node, CniCommand::Del, &env, conf.to_string())
        .expect_success("DEL of the real pod");
    assert!(!node.pin_root().exists(), "the last DEL left pins");
}

/// Section 3: "Plugins must handle being executed concurrently across different
/// containers" — 32 parallel ADDs get 32 distinct addresses and leases, 32 parallel DELs
/// release them all.
#[test]
fn concurrent_adds_and_dels() {
    require_root();
    const N: usize = 32;
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let list = NetConfList::single(&p.conf("1.0.0", &node, Stack::V4));
    let pods: Vec<_> = (0..N).map(|_| node.new_pod().unwrap()).collect();
    let atts: Vec<Attachment> = pods
        .iter()
        .map(|pod| Attachment::new(&unique_container_id(), pod.path(), "eth0"))
        .collect();

    let results: Vec<Result<Value, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = atts
            .iter()
            .map(|att| s.spawn(|| p.runtime.add(&node, &list, att).map_err(|e| e.to_string())))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("ADD thread"))
            .collect()
    });
    let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {N} concurrent ADDs failed; first: {}",
        failed.len(),
        failed[0]
    );
    let ips: BTreeSet<IpAddr> = results
        .iter()
        .map(|r| {
            AddResult::parse(r.as_ref().unwrap())
                .unwrap()
                .ip4()
                .unwrap()
                .addr
        })
        .collect();
    assert_eq!(ips.len(), N, "addresses are not distinct");
    let leases = node.leases(NETWORK);
    assert_eq!(leases.len(), N, "{leases:?}");
    assert_eq!(leases.iter().map(|l| l.ip).collect::<BTreeSet<_>>(), ips);

    let dels: Vec<Result<(), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = atts
            .iter()
            .zip(&results)
            .map(|(att, res)| {
                let (list, node, p) = (&list, &node, &p);
                s.spawn(move || {
                    p.runtime
                        .del(node, list, att, res.as_ref().ok())
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("DEL thread"))
            .collect()
    });
    let failed: Vec<&String> = dels.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {N} concurrent DELs failed; first: {}",
        failed.len(),
        failed[0]
    );
    assert!(
        node.leases(NETWORK).is_empty(),
        "leases left: {:?}",
        node.leases(NETWORK)
    );
    let links: Vec<String> = kernel::links(node.netns())
        .unwrap()
        .into_iter()
        .map(|l| l.ifname)
        .collect();
    assert_eq!(links, ["lo"], "host veths left");
}

/// The IPAM store is host-local's format (CLIENTS.md): allocating alternately through
/// ebpf-cni and through the reference host-local (section 4: run as a delegated plugin
/// with the whole configuration) never hands out an address twice, and DEL through each
/// releases only its own reservations.
#[test]
fn shares_data_dir_with_reference_host_local() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let conf = p.conf("1.0.0", &node, Stack::V4);
    let host_local = Path::new(REFERENCE_HOST_LOCAL);
    let pods: Vec<_> = (0..6).map(|_| node.new_pod().unwrap()).collect();

    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    let mut ips = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let cid = unique_container_id();
        let env = p.env(&cid, pod.path(), "eth0");
        let res = if i % 2 == 0 {
            let r = p
                .run(&node, CniCommand::Add, &env, conf.to_string())
                .expect_success("ebpf-cni ADD");
            ours.push((cid.clone(), env));
            r
        } else {
            let out = node
                .run(host_local, CniCommand::Add, &env, conf.to_string())
                .unwrap();
            let r = out.expect_success("host-local ADD");
            theirs.push((cid.clone(), env));
            r
        };
        let ip = res["ips"][0]["address"]
            .as_str()
            .expect("an address")
            .to_owned();
        ips.push(ip);
    }
    let distinct: BTreeSet<&String> = ips.iter().collect();
    assert_eq!(
        distinct.len(),
        ips.len(),
        "an address was handed out twice: {ips:?}"
    );
    assert_eq!(node.leases(NETWORK).len(), 6);

    for (_, env) in &ours {
        p.run(&node, CniCommand::Del, env, conf.to_string())
            .expect_success("ebpf-cni DEL");
    }
    let left: BTreeSet<String> = node
        .leases(NETWORK)
        .into_iter()
        .map(|l| l.container_id)
        .collect();
    let expected: BTreeSet<String> = theirs.iter().map(|(c, _)| c.clone()).collect();
    assert_eq!(
        left, expected,
        "ebpf-cni DEL must release exactly its own reservations"
    );
    for (_, env) in &theirs {
        node.run(host_local, CniCommand::Del, env, conf.to_string())
            .unwrap()
            .expect_success("host-local DEL");
    }
    assert!(node.leases(NETWORK).is_empty());
}

/// Two pods on `node` with a host port (from `base_port`) and a paced egress limit, so an
/// ADD reaches every node map, the socket programs' links and each socket: the first added
/// by `p` (the node's programs load), the second through `traced`'s wrapper.
fn two_pods_the_second_traced(
    p: &PluginUnderTest,
    traced: &Traced,
    node: &Node,
    base_port: u16,
) -> (NetConfList, Vec<(Attachment, Value, Netns)>) {
    let t = PluginUnderTest::at(traced.wrapper.clone());
    let mut conf = p.conf("1.0.0", node, Stack::V4);
    conf["capabilities"] = json!({"portMappings": true, "bandwidth": true});
    let list = NetConfList::single(&conf);
    let mut added = Vec::new();
    for (port, plugin) in (base_port..).zip([p, &t]) {
        let pod = node.new_pod().unwrap();
        let att = Attachment::new(&unique_container_id(), pod.path(), "eth0")
            .with_capability(
                "portMappings",
                json!([{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]),
            )
            .with_capability(
                "bandwidth",
                json!({"egressRate": 100_000_000, "egressBurst": 1_000_000}),
            );
        let result = plugin
            .runtime
            .add(node, &list, &att)
            .unwrap_or_else(|e| panic!("ADD with {}: {e}", plugin.bin.display()));
        added.push((att, result, pod));
    }
    (list, added)
}

/// An ADD opens each socket it needs in the node's namespace once: the netlink requests
/// the plugin builds by hand (the node's address dump, the pod's `clsact` qdisc and its two
/// filters) share one `NETLINK_ROUTE` socket, the two dumps of the node's listeners one
/// `NETLINK_SOCK_DIAG` socket, and the node's netns cookie (read for the host ports and the
/// pacing entry) one socket; the pod's cookie (the pacing map's key) is read from the
/// netlink socket ADD opened in the pod's namespace, which it then enters once, not twice.
/// The second pod's ADD (a host port and a paced egress limit, so every one of these
/// requests runs) runs under `strace -e trace=socket,setns`: besides the typed netlink
/// sockets of the node and the pod (one each, and each tells its namespace's cookie), at
/// most one more `NETLINK_ROUTE` and one `NETLINK_SOCK_DIAG` socket, and no `AF_INET` one
/// (before 5.14, one: the node's cookie is learned through a probe connection). Before:
/// six, two and three.
#[test]
fn add_opens_each_socket_of_the_node_once() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let traced = Traced::new(&p.bin, "socket,setns").unwrap();
    let node = Node::new().unwrap();
    let (list, added) = two_pods_the_second_traced(&p, &traced, &node, 28_600);
    let trace = traced.log().unwrap();
    let count = |kind: &str| trace.lines().filter(|l| l.contains(kind)).count();
    let route = count("NETLINK_ROUTE");
    let diag = count("NETLINK_SOCK_DIAG");
    let inet = count("socket(AF_INET,");
    let inet_max = usize::from(ebpf_cni_tests::bpf::kernel_version() < (5, 14));
    assert!(
        route <= 3 && diag <= 1 && inet <= inet_max,
        "sockets of the second ADD: {route} NETLINK_ROUTE (at most 3), {diag} NETLINK_SOCK_DIAG \
         (at most 1), {inet} AF_INET (at most {inet_max}):\n{trace}"
    );
    assert!(
        route >= 1 && diag == 1,
        "control: the ADD made the requests this test counts the sockets of:\n{trace}"
    );
    for (att, result, _pod) in &added {
        p.runtime
            .del(&node, &list, att, Some(result))
            .unwrap_or_else(|e| panic!("DEL: {e}"));
    }
}

/// A later ADD of a node records its use of the network's gateway, which the node holds
/// already, with one `mkdir` of its record (ADD brought towards its floor, the kernel work
/// alone): the second pod's ADD runs under `strace` of the calls that make or look at a
/// path, and names the gateways' records in one call. Before: four `stat`s of the record's
/// parents, then the `mkdir`.
#[test]
fn a_later_add_records_its_gateway_use_with_one_mkdir() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let traced = Traced::new(&p.bin, "mkdir,mkdirat,stat,lstat,newfstatat,statx,access").unwrap();
    let node = Node::new().unwrap();
    let (list, added) = two_pods_the_second_traced(&p, &traced, &node, 28_700);
    let trace = traced.log().unwrap();
    let calls: Vec<&str> = trace.lines().filter(|l| l.contains("gateways")).collect();
    assert_eq!(
        calls.len(),
        1,
        "the second ADD's calls on the gateways' records:\n{trace}"
    );
    assert!(
        calls[0].contains("mkdir") && calls[0].ends_with("= 0"),
        "{}",
        calls[0]
    );
    for (att, result, _pod) in &added {
        p.runtime
            .del(&node, &list, att, Some(result))
            .unwrap_or_else(|e| panic!("DEL: {e}"));
    }
}

/// A later ADD of a node asks the kernel for each pinned object once (ADD brought towards
/// its floor, the kernel work alone): the second pod's ADD (a host port and a paced egress
/// limit, so it reaches every node map and the socket programs' links) runs under `strace
/// -e trace=bpf`.
///
/// - Each pinned map is opened once (`BPF_OBJ_GET`), but the node's config, which the node
///   maps and the host-port maps each hold (twice): the check of the pod's addresses
///   against the other attachments is made once, under the node lock, where it opened the
///   endpoint map a first time before the lock.
/// - Each map opened has its info read once, by aya (type, key and value sizes): its name
///   is not read back as well.
/// - The socket programs' links the first ADD pinned are found by one read of their
///   directory: no link is opened (each was opened and its info read).
///
/// Before: the endpoint map opened twice, 32 info reads for 12 maps and 8 links, 8 link
/// opens.
#[test]
fn a_later_add_opens_each_pinned_object_once() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let traced = Traced::new(&p.bin, "bpf").unwrap();
    let node = Node::new().unwrap();
    let (list, added) = two_pods_the_second_traced(&p, &traced, &node, 28_650);
    let trace = traced.log().unwrap();
    let opened: Vec<&str> = trace
        .lines()
        .filter_map(|l| l.split("BPF_OBJ_GET, {pathname=\"").nth(1))
        .filter_map(|rest| rest.split('"').next())
        .collect();
    let maps: Vec<&str> = opened
        .iter()
        .filter(|p| p.contains("/maps/"))
        .filter_map(|p| p.rsplit('/').next())
        .collect();
    let mut twice: Vec<&str> = maps
        .iter()
        .copied()
        .filter(|m| maps.iter().filter(|n| *n == m).count() > 1)
        .filter(|m| *m != ebpf_cni_maps::CONFIG_MAP)
        .collect();
    twice.dedup();
    let config = maps
        .iter()
        .filter(|m| **m == ebpf_cni_maps::CONFIG_MAP)
        .count();
    assert!(
        twice.is_empty() && config <= 2,
        "maps opened more than once: {twice:?}, {} {config} times (at most 2):\n{trace}",
        ebpf_cni_maps::CONFIG_MAP
    );
    let infos = trace
        .lines()
        .filter(|l| l.contains("BPF_OBJ_GET_INFO_BY_FD"))
        .count();
    assert!(
        infos <= maps.len(),
        "{infos} info reads for {} maps opened (one each):\n{trace}",
        maps.len()
    );
    let links: Vec<&&str> = opened
        .iter()
        .filter(|p| p.contains(&format!("/{}/", ebpf_cni_maps::pin::CGROUP_DIR)))
        .collect();
    assert!(
        links.is_empty(),
        "the ADD opened the pinned links {links:?}:\n{trace}"
    );
    // Control: the ADD reached the maps this test counts the opens of.
    for name in [
        ebpf_cni_maps::ENDPOINTS_MAP,
        ebpf_cni_maps::PORTMAP_MAP,
        ebpf_cni_maps::PACING_MAP,
    ] {
        assert!(
            maps.contains(&name),
            "control: the ADD opened no {name}:\n{trace}"
        );
    }
    let pins = node.pin_root().join(ebpf_cni_maps::pin::CGROUP_DIR);
    assert!(
        pins.join("ecni_connect4").exists(),
        "control: the socket programs' links are pinned in {}",
        pins.display()
    );
    for (att, result, _pod) in &added {
        p.runtime
            .del(&node, &list, att, Some(result))
            .unwrap_or_else(|e| panic!("DEL: {e}"));
    }
}

/// An ADD rewrites the round robin's `last_reserved_ip.<N>` in place rather than opening it
/// with `O_TRUNC`: on ext4, cutting the file to zero bytes and writing it again cost
/// 0.3–0.5 ms of an ADD of 5–6 ms (the block is freed, and at close ext4 writes the new
/// data out at once). The second pod's ADD runs under `strace -e trace=open,openat` (the
/// static musl build calls `open`); the file must be opened for writing without `O_TRUNC`
/// and hold exactly the new address after.
#[test]
fn add_rewrites_last_reserved_in_place() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let traced = Traced::new(&p.bin, "open,openat").unwrap();

    let node = Node::new().unwrap();
    let mut added = Vec::new();
    for plugin in [p.clone(), PluginUnderTest::at(traced.wrapper.clone())] {
        let pod = node.new_pod().unwrap();
        let list = NetConfList::single(&plugin.conf("1.0.0", &node, Stack::V4));
        let att = Attachment::new(&unique_container_id(), pod.path(), "eth0");
        let result = plugin
            .runtime
            .add(&node, &list, &att)
            .unwrap_or_else(|e| panic!("ADD with {}: {e}", plugin.bin.display()));
        added.push((list, att, result, pod));
    }
    let trace = traced.log().unwrap();
    let writes: Vec<&str> = trace
        .lines()
        .filter(|l| l.contains("/last_reserved_ip.0\"") && l.contains("O_WRONLY"))
        .collect();
    assert_eq!(
        writes.len(),
        1,
        "the second ADD should write last_reserved_ip.0 once; open and openat calls:\n{trace}"
    );
    assert!(
        !writes[0].contains("O_TRUNC"),
        "last_reserved_ip.0 is opened with O_TRUNC: {}",
        writes[0]
    );
    let second = added[1].2["ips"][0]["address"]
        .as_str()
        .and_then(|a| a.split_once('/'))
        .map(|(ip, _)| ip.to_owned())
        .expect("the second ADD's address");
    let last =
        std::fs::read_to_string(node.data_dir().join(NETWORK).join("last_reserved_ip.0")).unwrap();
    assert_eq!(last, second, "last_reserved_ip.0 after the second ADD");
    for (list, att, result, _pod) in &added {
        p.runtime
            .del(&node, list, att, Some(result))
            .unwrap_or_else(|e| panic!("DEL: {e}"));
    }
}

/// While a run holds the node lock (and while CHECK reads), bpffs's layout directory
/// (`/sys/fs/bpf/ebpf-cni/v1`, the lock's) is its working directory, and the system calls
/// on pin paths are given the paths below it: the kernel then skips the walk of the prefix,
/// a sysfs directory and a mount crossing (docs/design-decisions.md, "Pin paths below
/// the lock's directory"). The plugin runs from a directory of the test's, under
/// `strace -e trace=bpf,fchdir`, for ADD (a host port and a limit, so every map and the
/// socket programs' links are opened), CHECK and DEL of one pod: the pins it opens and
/// makes are named below the layout directory (none by its absolute name: ADD's check of
/// the pod's addresses, which opened the endpoint map before the lock, is made under it
/// now), and each run comes back to its own directory. The
/// IPAM's `dataDir` is relative, as a runtime may give it: the lease is where that names
/// from the directory the plugin was started in, and DEL removes it from there. The ADD
/// opens the node's config map at most twice.
#[test]
fn pin_paths_are_walked_from_the_lock_directory_and_the_run_comes_back() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let dir = tempfile::tempdir().unwrap();
    let (bin_dir, work, log) = (
        dir.path().join("bin"),
        dir.path().join("work"),
        dir.path().join("strace.log"),
    );
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let wrapper = bin_dir.join(p.bin.file_name().unwrap());
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\ncd {} && exec strace -f -qq -A -e trace=bpf,fchdir -o {} {} \"$@\"\n",
            work.display(),
            log.display(),
            p.bin.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let t = PluginUnderTest::at(wrapper);

    let node = Node::new().unwrap();
    let mut conf = t.conf("1.0.0", &node, Stack::V4);
    conf["ipam"]["dataDir"] = json!("leases");
    conf["capabilities"] = json!({"portMappings": true, "bandwidth": true});
    let list = NetConfList::single(&conf);
    let attachment = |pod: &Path, port: u16| {
        Attachment::new(&unique_container_id(), pod, "eth0")
            .with_capability(
                "portMappings",
                json!([{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]),
            )
            .with_capability(
                "bandwidth",
                json!({"egressRate": 100_000_000, "egressBurst": 1_000_000}),
            )
    };
    let add = |port: u16| {
        let pod = node.new_pod().unwrap();
        let att = attachment(pod.path(), port);
        let result = t
            .runtime
            .add(&node, &list, &att)
            .unwrap_or_else(|e| panic!("ADD of the pod with host port {port}: {e}"));
        (pod, att, result)
    };
    // The node's first ADD (the programs' load, which aya pins by whole paths) is not
    // counted: the trace starts after it.
    let (_first_pod, first, first_result) = add(28_700);
    std::fs::remove_file(&log).unwrap();

    let (_pod, att, result) = add(28_701);
    let ip = result["ips"][0]["address"]
        .as_str()
        .and_then(|a| a.split_once('/'))
        .map(|(ip, _)| ip.to_owned())
        .expect("the ADD's address");
    let lease = work.join("leases").join(NETWORK).join(&ip);
    assert!(
        lease.is_file(),
        "the lease of {ip} is not at {} (the relative dataDir from the plugin's own directory)",
        lease.display()
    );
    // The node's config map is opened with the node maps (its limits' switch) and with the
    // host-port maps (the convergence reads its masquerade flag there): twice, where the
    // convergence and the limits' switch each opened it once more.
    let add_trace = std::fs::read_to_string(&log).unwrap();
    let config_opens = add_trace
        .lines()
        .filter(|l| l.contains("BPF_OBJ_GET, {pathname=") && l.contains("/ECNI_CONFIG\""))
        .count();
    assert!(
        (1..=2).contains(&config_opens),
        "the ADD opened ECNI_CONFIG {config_opens} times (at most 2):\n{add_trace}"
    );
    t.runtime
        .check(&node, &list, &att, &result)
        .unwrap_or_else(|e| panic!("CHECK: {e}"));
    t.runtime
        .del(&node, &list, &att, Some(&result))
        .unwrap_or_else(|e| panic!("DEL: {e}"));
    assert!(!lease.exists(), "DEL left the lease at {}", lease.display());
    let trace = std::fs::read_to_string(&log).unwrap();
    let named: Vec<&str> = trace
        .lines()
        .filter(|l| l.contains("BPF_OBJ_GET, {pathname=") || l.contains("BPF_OBJ_PIN, {pathname="))
        .collect();
    let absolute: Vec<&&str> = named
        .iter()
        .filter(|l| l.contains("pathname=\"/"))
        .collect();
    let below = named.len() - absolute.len();
    assert!(
        below >= 30 && absolute.is_empty(),
        "{below} pins named below the layout directory (at least 30 expected over ADD, CHECK \
         and DEL), {} by absolute path (none expected):\n{}",
        absolute.len(),
        absolute
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Into the directory and back, once per lock taken (and per CHECK).
    let fchdirs = trace.lines().filter(|l| l.contains("fchdir(")).count();
    assert!(
        fchdirs >= 6 && fchdirs % 2 == 0,
        "{fchdirs} fchdir calls: each run should enter the layout directory and come back:\n{trace}"
    );
    t.runtime
        .del(&node, &list, &first, Some(&first_result))
        .unwrap_or_else(|e| panic!("DEL of the first pod: {e}"));
}

/// The veth pair is created with the one queue each way a veth uses, asked for in the
/// request: unasked, a recent kernel allocates one per possible CPU, then cuts each end to
/// one, and each cut waits out an expedited RCU grace period with the RTNL lock held. Both
/// ends report the queues they were created with; a veth made here without asking is shown
/// for contrast (one queue per possible CPU: more than one on a machine of two or more).
#[test]
fn add_creates_the_veth_with_one_queue_each_way() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let pod = node.new_pod().unwrap();
    node.netns()
        .ip_ok(&[
            "link", "add", "qref0", "type", "veth", "peer", "name", "qref1",
        ])
        .unwrap();
    let unasked = kernel::link_queues(node.netns(), "qref0").unwrap();
    let list = NetConfList::single(&p.conf("1.0.0", &node, Stack::Dual));
    let att = Attachment::new(&unique_container_id(), pod.path(), "eth0");
    let result = p
        .runtime
        .add(&node, &list, &att)
        .unwrap_or_else(|e| panic!("ADD: {e}"));
    let host = result["interfaces"][0]["name"].as_str().expect("host side");
    for (side, ns, name) in [("host", node.netns(), host), ("pod", &pod, "eth0")] {
        assert_eq!(
            kernel::link_queues(ns, name).unwrap(),
            (1, 1),
            "{side} side {name}: queues (transmit, receive) as created; a veth made \
             without asking has {unasked:?}"
        );
    }
    p.runtime
        .del(&node, &list, &att, Some(&result))
        .unwrap_or_else(|e| panic!("DEL: {e}"));
}

/// The pod's programs are on the host side before it comes up: the kernel announces the
/// clsact qdisc and both filters on the host veth before the link goes up, so no packet of
/// the pod crosses the node unfiltered (and the qdisc goes on a device that is down, which
/// the kernel does not deactivate first: no RCU grace period for it).
#[test]
fn add_attaches_the_programs_before_the_host_side_comes_up() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let list = NetConfList::single(&p.conf("1.0.0", &node, Stack::Dual));
    // The node's first pod (programs loaded, node set up) and a second one.
    for round in ["first", "second"] {
        let pod = node.new_pod().unwrap();
        let events = RtEvents::subscribe(node.netns()).unwrap();
        let att = Attachment::new(&unique_container_id(), pod.path(), "eth0");
        let result = p
            .runtime
            .add(&node, &list, &att)
            .unwrap_or_else(|e| panic!("ADD of the {round} pod: {e}"));
        let seen = events.drain().unwrap();
        let host = result["interfaces"][0]["name"].as_str().expect("host side");
        let index = kernel::link(node.netns(), host)
            .unwrap()
            .expect("the host side exists")
            .ifindex;
        let up = seen
            .iter()
            .position(|e| *e == Event::Link { index, up: true })
            .unwrap_or_else(|| panic!("{round} pod: {host} never came up: {seen:?}"));
        let before = &seen[..up];
        assert!(
            before.contains(&Event::Qdisc {
                index,
                kind: "clsact".into()
            }),
            "{round} pod: {host} came up before its clsact qdisc was added: {seen:?}"
        );
        assert_eq!(
            before
                .iter()
                .filter(|e| **e == Event::Filter { index })
                .count(),
            2,
            "{round} pod: {host} came up before both its filters were attached: {seen:?}"
        );
        p.runtime
            .del(&node, &list, &att, Some(&result))
            .unwrap_or_else(|e| panic!("DEL of the {round} pod: {e}"));
    }
}

/// DEL finds a pod's entries in the node maps by the placement record ADD leaves in its pin
/// directory (`placed-…`): by key, with no walk of the endpoint, pacing or source maps (a
/// walk costs a system call per entry of every pod of the node, and a scan of the map's
/// buckets). A pod with extra source prefixes has its source entries found by a walk; a
/// pod without the record (attached by a release before it) has all of them found by
/// walks. Each DEL removes its pod's entries and nobody else's.
#[test]
fn del_finds_a_pods_entries_by_its_placement_record() {
    use ebpf_cni_tests::dataplane as dp;
    use ebpf_cni_tests::strace::{next_key_calls, walks};
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let traced = Traced::new(&p.bin, "bpf,close").unwrap();
    let t = PluginUnderTest::at(traced.wrapper.clone());
    let node = Node::new().unwrap();
    let mut paced = p.conf("1.0.0", &node, Stack::V4);
    paced["runtimeConfig"] =
        json!({"bandwidth": {"egressRate": 100_000_000, "egressBurst": 1_000_000}});
    let mut extra = paced.clone();
    extra["allowedSourcePrefixes"] = json!(["10.99.0.0/16"]);
    let plain = p.conf("1.0.0", &node, Stack::V4);

    // A pod, its attachment id and the config it was added with.
    struct Added {
        pod: Pod,
        id: u64,
        conf: Value,
    }
    let add = |conf: &Value| {
        let pod = Pod::add_direct(&p, &node, conf);
        let id = dp::endpoints(&node).unwrap()[&pod.v4()].attachment_id;
        Added {
            pod,
            id,
            conf: conf.clone(),
        }
    };
    // (endpoint, source, pacing) entries of attachment `id`.
    let owned = |id: u64| {
        let pacing = dp::map_entries(&node, dp::PACING_MAP)
            .unwrap()
            .iter()
            .filter(|e| {
                let v = dp::hex_bytes(&e["value"]).unwrap();
                u64::from_le_bytes(v[8..16].try_into().unwrap()) == id
            })
            .count();
        (
            dp::endpoints(&node)
                .unwrap()
                .values()
                .filter(|e| e.attachment_id == id)
                .count(),
            dp::sources(&node)
                .unwrap()
                .iter()
                .filter(|e| e.attachment_id == id)
                .count(),
            pacing,
        )
    };
    let pin_dir = |pod: &Added| {
        node.pin_root()
            .join(ebpf_cni_maps::pin::ATTACHMENTS_DIR)
            .join(NETWORK)
            .join(pod.pod.id())
            .join("eth0")
    };
    let record = |pod: &Added| {
        std::fs::read_dir(pin_dir(pod))
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|e| {
                e.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(ebpf_cni_maps::pin::PLACEMENT_RECORD_PREFIX))
            })
    };
    let del = |p: &PluginUnderTest, added: &Added| {
        added.pod.del_direct(p, &node, &added.conf);
        traced.log().unwrap_or_default()
    };

    let (a, b, c) = (add(&paced), add(&extra), add(&paced));
    // Keeps the node (and its maps) when the others go.
    let anchor = add(&plain);
    for (pod, want) in [
        (&a, (1, 2, 1)),
        (&b, (1, 3, 1)),
        (&c, (1, 2, 1)),
        (&anchor, (1, 2, 0)),
    ] {
        assert_eq!(
            owned(pod.id),
            want,
            "control: the entries of {}",
            pod.pod.id()
        );
        assert!(
            record(pod).is_some(),
            "ADD left no placement record in {}",
            pin_dir(pod).display()
        );
    }

    let trace = del(&t, &a);
    assert_eq!(
        walks(&trace, dp::ENDPOINTS_MAP),
        0,
        "endpoint map walked:\n{trace}"
    );
    assert_eq!(
        walks(&trace, dp::SOURCES_MAP),
        0,
        "source map walked:\n{trace}"
    );
    // Only whether any pod is still paced: one first key.
    assert_eq!(
        next_key_calls(&trace, dp::PACING_MAP),
        vec![true],
        "{trace}"
    );
    assert_eq!(owned(a.id), (0, 0, 0), "the DEL left entries of its pod");
    for (pod, want) in [(&b, (1, 3, 1)), (&c, (1, 2, 1)), (&anchor, (1, 2, 0))] {
        assert_eq!(
            owned(pod.id),
            want,
            "the DEL of {} took entries of {}",
            a.pod.id(),
            pod.pod.id()
        );
    }

    // Extra prefixes: the source map is walked for them.
    let trace = del(&t, &b);
    assert_eq!(
        walks(&trace, dp::ENDPOINTS_MAP),
        0,
        "endpoint map walked:\n{trace}"
    );
    assert_eq!(walks(&trace, dp::SOURCES_MAP), 1, "{trace}");
    assert_eq!(owned(b.id), (0, 0, 0), "the DEL left entries of its pod");

    // No record, as a release before it left the pod: every map is walked.
    std::fs::remove_dir(record(&c).unwrap()).unwrap();
    let trace = del(&t, &c);
    assert_eq!(walks(&trace, dp::ENDPOINTS_MAP), 1, "{trace}");
    assert_eq!(walks(&trace, dp::SOURCES_MAP), 1, "{trace}");
    assert_eq!(
        walks(&trace, dp::PACING_MAP),
        2,
        "the removal's walk, then the first key:\n{trace}"
    );
    assert_eq!(owned(c.id), (0, 0, 0), "the DEL left entries of its pod");
    assert_eq!(owned(anchor.id), (1, 2, 0));
    del(&p, &anchor);
}
