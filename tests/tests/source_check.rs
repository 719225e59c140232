//! The source check (a pod cannot send with an address that is not its own): a pod that
//! puts another pod's address, or a made-up one, on its interface and sends from it reaches
//! neither another pod nor a host outside the node; a pod that changes its MAC reaches
//! nobody; an ARP request claiming another pod's address is neither answered nor learnt by
//! the node. Each drop is counted per pod under its own reason, and shows in `inspect`,
//! `metrics` and `trace`. The pod's own traffic, neighbour discovery (ARP, ND with
//! link-local sources, DAD from `::`) and the prefixes the config lists pass; `sourceCheck:
//! false` restores the behaviour before the check; CHECK fails when the allowed sources
//! differ from the config and the pod's addresses, DEL removes them from the pins alone,
//! and a failed or refused ADD leaves none.
//!
//! Each test has a part that only the check makes true (a datagram that must not arrive, a
//! counter that must move, a report field that must be there), next to positive controls,
//! so it fails on a build without the check and cannot pass by a broken path.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use ebpf_cni_tests::config::{Stack, V4_GATEWAY};
use ebpf_cni_tests::dataplane::{self as dp, DirCounts};
use ebpf_cni_tests::external::ExternalHost;
use ebpf_cni_tests::source_check::{arp_ask, assert_udp_arrives, assert_udp_blocked, mac_of};
use ebpf_cni_tests::state::{assert_node_clean, eventually};
use ebpf_cni_tests::{
    require_root, unique_container_id, Attachment, ListError, NetConfList, Netns, Node,
    PluginUnderTest, Pod,
};
use serde_json::{json, Value};

/// How long a datagram that must not arrive is given.
const BLOCKED: Duration = Duration::from_millis(1500);
/// Addresses no pod of the tests holds and no config lists.
const MADE_UP_V4: &str = "198.51.100.7";
const MADE_UP_V6: &str = "fd99:9::7";

/// Puts `addr` on the pod's eth0 (IPv6 without duplicate address detection).
fn add_address(pod: &Pod, addr: &str) {
    let ip: IpAddr = addr.parse().unwrap();
    let (fam, len) = if ip.is_ipv4() {
        ("-4", "32")
    } else {
        ("-6", "128")
    };
    let cidr = format!("{ip}/{len}");
    let mut args = vec![fam, "addr", "add", &cidr, "dev", "eth0"];
    if ip.is_ipv6() {
        args.push("nodad");
    }
    pod.netns.ip_ok(&args).unwrap();
}

fn list_with(p: &PluginUnderTest, node: &Node, extra: Value) -> NetConfList {
    let mut conf = p.conf("1.0.0", node, Stack::Dual);
    for (k, v) in extra.as_object().unwrap() {
        conf[k] = v.clone();
    }
    NetConfList::single(&conf)
}

/// The pod's inspect entry.
fn inspected(p: &PluginUnderTest, node: &Node, pod: &Pod) -> Value {
    let report = dp::inspect(&p.bin, node).unwrap();
    dp::inspect_attachment(&report, pod.id())
        .unwrap_or_else(|| panic!("inspect lists no attachment {}: {report}", pod.id()))
        .clone()
}

/// The counters of what the pod sent, from `inspect --json`, checked against the pinned
/// counter map read with bpftool.
fn sent(p: &PluginUnderTest, node: &Node, pod: &Pod) -> DirCounts {
    let a = inspected(p, node, pod);
    let shown = DirCounts::from_json(&a["from_pod"])
        .unwrap_or_else(|| panic!("inspect has no from_pod counters: {a}"));
    let raw = dp::pod_counters(node).unwrap()[&pod.host_ifindex(node)].from_pod;
    assert!(
        raw.source_drops >= shown.source_drops && raw.mac_drops >= shown.mac_drops,
        "the counter map ({raw:?}) is behind inspect ({shown:?})"
    );
    shown
}

/// inspect's `source_check` of the pod.
fn source_check(p: &PluginUnderTest, node: &Node, pod: &Pod) -> Value {
    inspected(p, node, pod)["source_check"].clone()
}

/// `ebpf-cni metrics` of the node: the value of the sample of `family` for the pod
/// `container_id` whose labels include `label`.
fn metric(bin: &Path, node: &Node, family: &str, container_id: &str, label: &str) -> Option<f64> {
    let out = Command::new(bin)
        .env_remove("CNI_COMMAND")
        .args(["metrics", "--netns"])
        .arg(node.netns().path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "metrics: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .filter(|l| l.contains(&format!("container_id=\"{container_id}\"")) && l.contains(label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// `ebpf-cni trace` on the node while `f` runs: its output.
fn traced(bin: &Path, node: &Node, f: impl FnOnce()) -> String {
    let child = Command::new(bin)
        .env_remove("CNI_COMMAND")
        .args(["trace", "--seconds", "8", "--netns"])
        .arg(node.netns().path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The trace sets the node's flag once it listens.
    std::thread::sleep(Duration::from_millis(700));
    f();
    let out = child.wait_with_output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn spoofed_sources_are_dropped_and_counted() {
    require_root();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "up0", 61).unwrap();
    let p = PluginUnderTest::ebpf_cni();
    let list = list_with(&p, &node, json!({}));
    let a = Pod::add(&p, &node, &list, Stack::Dual);
    let b = Pod::add(&p, &node, &list, Stack::Dual);
    let c = Pod::add(&p, &node, &list, Stack::Dual);

    // Controls: the pods' own addresses reach the other pod and the outside host (and the
    // sender learns its gateway's MAC, so what follows is about the datagrams).
    for (src, dst_c, dst_ext) in [
        (a.v4(), c.v4(), IpAddr::V4(ext.v4)),
        (a.v6(), c.v6(), IpAddr::V6(ext.v6)),
    ] {
        assert_udp_arrives(&a.netns, src, &c.netns, dst_c);
        assert_udp_arrives(&a.netns, src, ext.netns(), dst_ext);
    }
    let before = sent(&p, &node, &a);
    assert_eq!(
        (before.source_drops, before.mac_drops),
        (0, 0),
        "the pod's own traffic is never dropped by the check"
    );
    assert_eq!(
        source_check(&p, &node, &a),
        json!({
            "mode": "on",
            "mac": a.r.container_mac,
            "allowed": [format!("{}/32", a.v4()), format!("{}/128", a.v6())],
        })
    );
    assert_eq!(
        a.result["sourceCheck"],
        json!({
            "enabled": true,
            "mac": a.r.container_mac,
            "allowedPrefixes": [format!("{}/32", a.v4()), format!("{}/128", a.v6())],
        }),
        "the result says which check is in force"
    );

    // Pod A takes pod B's addresses and made-up ones.
    let spoofed: Vec<IpAddr> = vec![
        b.v4(),
        MADE_UP_V4.parse().unwrap(),
        b.v6(),
        MADE_UP_V6.parse().unwrap(),
    ];
    for ip in &spoofed {
        add_address(&a, &ip.to_string());
    }
    let mut sends = 0;
    let out = traced(&p.bin, &node, || {
        for src in &spoofed {
            let (to_c, to_ext) = if src.is_ipv4() {
                (c.v4(), IpAddr::V4(ext.v4))
            } else {
                (c.v6(), IpAddr::V6(ext.v6))
            };
            assert_udp_blocked(&a.netns, *src, &c.netns, to_c, BLOCKED);
            assert_udp_blocked(&a.netns, *src, ext.netns(), to_ext, BLOCKED);
            sends += 2;
        }
    });
    let after = sent(&p, &node, &a);
    assert!(
        after.source_drops >= before.source_drops + sends,
        "each of the {sends} blocked sends is counted as a source drop: {before:?} -> {after:?}"
    );
    assert_eq!(after.mac_drops, 0, "nothing here forged a MAC");
    assert!(
        out.contains("dropped: source address not the pod's"),
        "trace shows the drops: {out}"
    );
    let m = metric(
        &p.bin,
        &node,
        "ebpf_cni_pod_source_drops_total",
        a.id(),
        "reason=\"address\"",
    );
    assert!(
        m.is_some_and(|v| v >= after.source_drops as f64),
        "metrics count the drops: {m:?}, {after:?}"
    );

    // The owner of the addresses is untouched, and so is A's own traffic.
    assert_udp_arrives(&b.netns, b.v4(), &c.netns, c.v4());
    assert_udp_arrives(&b.netns, b.v6(), &c.netns, c.v6());
    assert_udp_arrives(&a.netns, a.v4(), &c.netns, c.v4());
    assert_eq!(sent(&p, &node, &b).source_drops, 0);

    for pod in [&a, &b, &c] {
        pod.del(&p, &node, &list);
    }
    assert_node_clean(&node, "after the DELs");
}

#[test]
fn a_forged_mac_is_dropped_and_counted() {
    require_root();
    let node = Node::new().unwrap();
    let p = PluginUnderTest::ebpf_cni();
    let list = list_with(&p, &node, json!({}));
    let a = Pod::add(&p, &node, &list, Stack::Dual);
    let c = Pod::add(&p, &node, &list, Stack::Dual);
    assert_udp_arrives(&a.netns, a.v4(), &c.netns, c.v4());
    assert_udp_arrives(&a.netns, a.v6(), &c.netns, c.v6());
    let before = sent(&p, &node, &a);

    // Its own addresses, another MAC: frames and ARP alike are refused.
    let own = a.r.container_mac.clone();
    a.netns
        .ip_ok(&["link", "set", "dev", "eth0", "address", "02:00:5e:00:be:ef"])
        .unwrap();
    let out = traced(&p.bin, &node, || {
        assert_udp_blocked(&a.netns, a.v4(), &c.netns, c.v4(), BLOCKED);
        assert_udp_blocked(&a.netns, a.v6(), &c.netns, c.v6(), BLOCKED);
    });
    let after = sent(&p, &node, &a);
    assert!(
        after.mac_drops >= before.mac_drops + 2,
        "the forged frames are counted as MAC drops: {before:?} -> {after:?}"
    );
    assert_eq!(
        after.source_drops, before.source_drops,
        "the addresses were the pod's own"
    );
    assert!(
        out.contains("dropped: source MAC not the pod's"),
        "trace shows the drops: {out}"
    );
    let m = metric(
        &p.bin,
        &node,
        "ebpf_cni_pod_source_drops_total",
        a.id(),
        "reason=\"mac\"",
    );
    assert!(m.is_some_and(|v| v >= 2.0), "metrics count them: {m:?}");

    // Its own MAC back: through again.
    a.netns
        .ip_ok(&["link", "set", "dev", "eth0", "address", &own])
        .unwrap();
    assert_udp_arrives(&a.netns, a.v4(), &c.netns, c.v4());
    assert_udp_arrives(&a.netns, a.v6(), &c.netns, c.v6());

    a.del(&p, &node, &list);
    c.del(&p, &node, &list);
    assert_node_clean(&node, "after the DELs");
}

#[test]
fn arp_claiming_another_address_is_neither_answered_nor_learnt() {
    require_root();
    let node = Node::new().unwrap();
    let p = PluginUnderTest::ebpf_cni();
    let list = list_with(&p, &node, json!({}));
    let a = Pod::add(&p, &node, &list, Stack::Dual);
    let b = Pod::add(&p, &node, &list, Stack::Dual);
    let gw: Ipv4Addr = V4_GATEWAY.parse().unwrap();
    let mac = mac_of(&a.netns, "eth0").unwrap();
    let IpAddr::V4(a4) = a.v4() else {
        unreachable!()
    };
    let IpAddr::V4(b4) = b.v4() else {
        unreachable!()
    };

    // Control: asked with its own address, the pod gets its gateway's MAC.
    let answer = arp_ask(&a.netns, "eth0", mac, a4, gw, Duration::from_secs(3)).unwrap();
    assert!(answer.is_some(), "the gateway answers the pod's own ARP");
    let before = sent(&p, &node, &a);

    // Claiming pod B's address: no answer, and the node learns nothing.
    let answer = arp_ask(&a.netns, "eth0", mac, b4, gw, BLOCKED).unwrap();
    assert_eq!(answer, None, "ARP claiming {b4} from pod A was answered");
    let learnt = node
        .netns()
        .ip_ok(&[
            "neigh",
            "show",
            "dev",
            &a.r.host_ifname,
            "to",
            &b4.to_string(),
        ])
        .unwrap();
    assert!(
        learnt.trim().is_empty(),
        "the node learnt {b4} behind pod A's veth: {learnt}"
    );
    let after = sent(&p, &node, &a);
    assert!(
        after.source_drops > before.source_drops,
        "the ARP requests are counted: {before:?} -> {after:?}"
    );

    // Pod B still reaches pod A, with its own ARP.
    assert_udp_arrives(&b.netns, b.v4(), &a.netns, a.v4());

    a.del(&p, &node, &list);
    b.del(&p, &node, &list);
    assert_node_clean(&node, "after the DELs");
}

#[test]
fn own_traffic_neighbour_discovery_and_listed_prefixes_pass() {
    require_root();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "up0", 62).unwrap();
    let p = PluginUnderTest::ebpf_cni();
    let list = list_with(
        &p,
        &node,
        json!({
            "allowedSourcePrefixes": ["10.99.0.0/16", "fd99:1::/64"],
            "capabilities": {"allowedSourcePrefixes": true},
        }),
    );
    let a = Pod::add(&p, &node, &list, Stack::Dual);
    let c = Pod::add(&p, &node, &list, Stack::Dual);
    let rc = Pod::add_with(&p, &node, &list, Stack::Dual, |att| {
        att.with_capability("allowedSourcePrefixes", json!(["10.98.0.0/24"]))
    });
    let args = Pod::add_with(&p, &node, &list, Stack::Dual, |att| {
        att.with_args("IgnoreUnknown=1;ECNI_ALLOWED_SOURCES=10.97.0.0/24,fd97::/64")
    });

    // Neighbour discovery from scratch: ARP, ND (with the pod's global and link-local
    // sources), and ping over both.
    for fam in ["-4", "-6"] {
        a.netns
            .ip_ok(&[fam, "neigh", "flush", "dev", "eth0"])
            .unwrap();
    }
    for target in [c.v4(), c.v6()] {
        let out = a
            .netns
            .exec(&["ping", "-n", "-c", "2", "-W", "2", &target.to_string()])
            .unwrap();
        assert!(
            out.status.success(),
            "ping {target}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let host_ll = link_local(node.netns(), &a.r.host_ifname);
    let out = a
        .netns
        .exec(&[
            "ping",
            "-n",
            "-c",
            "2",
            "-W",
            "2",
            &format!("{host_ll}%eth0"),
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "ping the host veth's link-local {host_ll} from the pod's: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Duplicate address detection sends from `::`: an address added with it becomes
    // usable, and nothing of it is dropped.
    a.netns
        .exec(&["sysctl", "-qw", "net.ipv6.conf.eth0.accept_dad=1"])
        .unwrap();
    a.netns
        .ip_ok(&["-6", "addr", "add", "fd99:1::5/128", "dev", "eth0"])
        .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || {
            a.netns
                .ip_ok(&["-6", "addr", "show", "dev", "eth0", "tentative"])
                .is_ok_and(|s| s.trim().is_empty())
        }),
        "DAD of fd99:1::5 did not finish"
    );
    assert_eq!(
        (
            sent(&p, &node, &a).source_drops,
            sent(&p, &node, &a).mac_drops
        ),
        (0, 0),
        "ARP, ND, DAD and the pod's own traffic are never dropped"
    );

    // The network's prefixes, to the other pod and out of the node.
    add_address(&a, "10.99.0.5");
    for (src, to_c, to_ext) in [
        ("10.99.0.5", c.v4(), IpAddr::V4(ext.v4)),
        ("fd99:1::5", c.v6(), IpAddr::V6(ext.v6)),
    ] {
        let src: IpAddr = src.parse().unwrap();
        assert_udp_arrives(&a.netns, src, &c.netns, to_c);
        assert_udp_arrives(&a.netns, src, ext.netns(), to_ext);
    }
    assert_eq!(sent(&p, &node, &a).source_drops, 0);
    // Another pod's own prefix is not the network's: A may not use it.
    add_address(&a, "10.98.0.5");
    assert_udp_blocked(
        &a.netns,
        "10.98.0.5".parse().unwrap(),
        &c.netns,
        c.v4(),
        BLOCKED,
    );
    assert!(sent(&p, &node, &a).source_drops > 0);

    // The per-pod prefixes (runtimeConfig, CNI_ARGS) on top of the network's.
    add_address(&rc, "10.98.0.5");
    add_address(&rc, "10.99.0.6");
    for src in ["10.98.0.5", "10.99.0.6"] {
        assert_udp_arrives(&rc.netns, src.parse().unwrap(), &c.netns, c.v4());
    }
    add_address(&args, "10.97.0.5");
    add_address(&args, "fd97::5");
    assert_udp_arrives(&args.netns, "10.97.0.5".parse().unwrap(), &c.netns, c.v4());
    assert_udp_arrives(&args.netns, "fd97::5".parse().unwrap(), &c.netns, c.v6());
    assert_eq!(sent(&p, &node, &rc).source_drops, 0);
    assert_eq!(sent(&p, &node, &args).source_drops, 0);

    // What is in force, as inspect and the result say.
    let set = |v: &Value| -> BTreeSet<String> {
        v.as_array()
            .unwrap_or_else(|| panic!("not a list: {v}"))
            .iter()
            .map(|s| s.as_str().unwrap().to_owned())
            .collect()
    };
    let want_rc: BTreeSet<String> = [
        format!("{}/32", rc.v4()),
        format!("{}/128", rc.v6()),
        "10.98.0.0/24".into(),
        "10.99.0.0/16".into(),
        "fd99:1::/64".into(),
    ]
    .into();
    assert_eq!(set(&source_check(&p, &node, &rc)["allowed"]), want_rc);
    assert_eq!(set(&rc.result["sourceCheck"]["allowedPrefixes"]), want_rc);
    let got_args = set(&source_check(&p, &node, &args)["allowed"]);
    for want in ["10.97.0.0/24", "fd97::/64", "10.99.0.0/16", "fd99:1::/64"] {
        assert!(
            got_args.contains(want),
            "CNI_ARGS' {want} missing: {got_args:?}"
        );
    }
    assert!(
        !set(&source_check(&p, &node, &a)["allowed"]).contains("10.98.0.0/24"),
        "one pod's runtimeConfig prefix is not another's"
    );
    p.runtime
        .check(&node, &list, &rc.att, &rc.result)
        .unwrap_or_else(|e| panic!("CHECK of the pod with runtimeConfig prefixes: {e}"));

    for pod in [&a, &c, &rc, &args] {
        pod.del(&p, &node, &list);
    }
    assert_node_clean(&node, "after the DELs");
}

/// The link-local address of `dev` in `ns`.
fn link_local(ns: &Netns, dev: &str) -> String {
    let out = ns
        .ip_ok(&["-6", "-j", "addr", "show", "dev", dev, "scope", "link"])
        .unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    v[0]["addr_info"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|a| a["local"].as_str())
        .unwrap_or_else(|| panic!("{dev} has no link-local address: {out}"))
        .to_owned()
}

#[test]
fn turning_the_check_off_restores_todays_behaviour() {
    require_root();
    let node = Node::new().unwrap();
    let p = PluginUnderTest::ebpf_cni();
    let list = list_with(&p, &node, json!({"sourceCheck": false}));
    let a = Pod::add(&p, &node, &list, Stack::Dual);
    let b = Pod::add(&p, &node, &list, Stack::Dual);
    let c = Pod::add(&p, &node, &list, Stack::Dual);
    assert_eq!(a.result["sourceCheck"], json!({"enabled": false}));
    assert_eq!(source_check(&p, &node, &a)["mode"], "off");
    assert!(
        dp::sources(&node).unwrap().is_empty(),
        "pods whose check is off have no entries (their lookups find an empty map)"
    );

    add_address(&a, &b.v4().to_string());
    add_address(&a, MADE_UP_V6);
    assert_udp_arrives(&a.netns, b.v4(), &c.netns, c.v4());
    assert_udp_arrives(&a.netns, MADE_UP_V6.parse().unwrap(), &c.netns, c.v6());
    a.netns
        .ip_ok(&["link", "set", "dev", "eth0", "address", "02:00:5e:00:be:ef"])
        .unwrap();
    assert_udp_arrives(&a.netns, a.v4(), &c.netns, c.v4());
    let counts = sent(&p, &node, &a);
    assert_eq!((counts.source_drops, counts.mac_drops), (0, 0));
    a.netns
        .ip_ok(&["link", "set", "dev", "eth0", "address", &a.r.container_mac])
        .unwrap();
    p.runtime
        .check(&node, &list, &a.att, &a.result)
        .unwrap_or_else(|e| panic!("CHECK with the check off: {e}"));

    for pod in [&a, &b, &c] {
        pod.del(&p, &node, &list);
    }
    assert_node_clean(&node, "after the DELs");
}

/// CHECK's expected failure: code 105 naming each of `words`.
fn assert_check_fails(
    p: &PluginUnderTest,
    node: &Node,
    list: &NetConfList,
    pod: &Pod,
    cached: &Value,
    words: &[&str],
    what: &str,
) {
    match p.runtime.check(node, list, &pod.att, cached) {
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

/// The source entries of the attachment of `pod` (by the id they carry, as DEL finds them).
fn entries_of(node: &Node, pod_id: u64) -> Vec<dp::SourceEntry> {
    dp::sources(node)
        .unwrap()
        .into_iter()
        .filter(|e| e.attachment_id == pod_id)
        .collect()
}

/// The attachment id the plugin tags a pod's entries with: every entry of the pod's host
/// veth carries it.
fn attachment_id(node: &Node, pod: &Pod) -> u64 {
    let ifindex = pod.host_ifindex(node);
    let ids: Vec<u64> = dp::sources(node)
        .unwrap()
        .iter()
        .filter(|e| e.ifindex == ifindex)
        .map(|e| e.attachment_id)
        .collect();
    assert!(!ids.is_empty(), "no source entries for ifindex {ifindex}");
    assert!(ids.iter().all(|i| *i == ids[0]), "{ids:?}");
    ids[0]
}

#[test]
fn check_compares_the_allowed_sources_and_del_and_failures_leave_none() {
    require_root();
    let node = Node::new().unwrap();
    let p = PluginUnderTest::ebpf_cni();
    let list = list_with(&p, &node, json!({}));
    let a = Pod::add(&p, &node, &list, Stack::Dual);
    let keep = Pod::add(&p, &node, &list, Stack::Dual);
    p.runtime.check(&node, &list, &a.att, &a.result).unwrap();
    let id = attachment_id(&node, &a);
    let entries = entries_of(&node, id);
    assert_eq!(
        entries.len(),
        3,
        "the catch-all and the pod's two addresses: {entries:?}"
    );

    // The config now lists a prefix the kernel does not hold.
    let wider = list_with(
        &p,
        &node,
        json!({"allowedSourcePrefixes": ["10.99.0.0/16"]}),
    );
    let mut cached = a.result.clone();
    cached["sourceCheck"]["allowedPrefixes"] = json!([
        format!("{}/32", a.v4()),
        "10.99.0.0/16",
        format!("{}/128", a.v6())
    ]);
    assert_check_fails(
        &p,
        &node,
        &wider,
        &a,
        &cached,
        &["source check", "10.99.0.0/16"],
        "config with a prefix ADD did not install",
    );
    // The result names another check than the config gives.
    let mut stale = a.result.clone();
    stale["sourceCheck"] = json!({"enabled": false});
    assert_check_fails(
        &p,
        &node,
        &list,
        &a,
        &stale,
        &["sourceCheck"],
        "a result that says the check is off",
    );
    // An address entry gone, then back.
    let own = entries
        .iter()
        .find(|e| e.prefix.is_some_and(|(ip, _)| ip == a.v4()))
        .expect("the pod's IPv4 entry")
        .clone();
    dp::delete_raw(&node, dp::SOURCES_MAP, &own.raw_key).unwrap();
    assert_check_fails(
        &p,
        &node,
        &list,
        &a,
        &a.result,
        &["source check", &a.v4().to_string()],
        "the pod's own address removed from the source map",
    );
    dp::update_raw(&node, dp::SOURCES_MAP, &own.raw_key, &own.raw_value).unwrap();
    p.runtime.check(&node, &list, &a.att, &a.result).unwrap();
    // An entry the config does not give.
    let mut extra_key = own.raw_key.clone();
    extra_key[0..4].copy_from_slice(&(64u32 + 8).to_le_bytes());
    extra_key[12..16].copy_from_slice(&[10, 0, 0, 0]);
    dp::update_raw(&node, dp::SOURCES_MAP, &extra_key, &own.raw_value).unwrap();
    assert_check_fails(
        &p,
        &node,
        &list,
        &a,
        &a.result,
        &["source check", "10.0.0.0/8"],
        "a prefix added behind the plugin's back",
    );
    dp::delete_raw(&node, dp::SOURCES_MAP, &extra_key).unwrap();
    // The catch-all removed: the pod would not be checked.
    let all = entries.iter().find(|e| e.prefix.is_none()).unwrap().clone();
    dp::delete_raw(&node, dp::SOURCES_MAP, &all.raw_key).unwrap();
    assert_check_fails(
        &p,
        &node,
        &list,
        &a,
        &a.result,
        &["source check", "without a catch-all"],
        "the pod's catch-all removed from the map",
    );
    dp::update_raw(&node, dp::SOURCES_MAP, &all.raw_key, &all.raw_value).unwrap();
    p.runtime.check(&node, &list, &a.att, &a.result).unwrap();
    // The check turned on in the config of a pod ADDed with it off, and the other way.
    let off = list_with(&p, &node, json!({"sourceCheck": false}));
    let mut off_result = a.result.clone();
    off_result["sourceCheck"] = json!({"enabled": false});
    assert_check_fails(
        &p,
        &node,
        &off,
        &a,
        &off_result,
        &["source check", "expected off"],
        "sourceCheck false for a pod ADDed with the check on",
    );

    // DEL from the pins alone (no namespace, no prevResult), twice.
    let late = Attachment::new(&a.att.container_id, "", "eth0");
    p.runtime.del(&node, &list, &late, None).unwrap();
    assert!(entries_of(&node, id).is_empty(), "DEL left source entries");
    p.runtime.del(&node, &list, &late, None).unwrap();

    // A failed ADD, and a refused one, leave no entries.
    let before = dp::sources(&node).unwrap();
    let failing = node.new_pod().unwrap();
    let mut att = Attachment::new(&unique_container_id(), failing.path(), "eth0");
    att.extra_env
        .push(("EBPF_CNI_FAILPOINT".into(), "before-result".into()));
    assert!(
        p.runtime.add(&node, &list, &att).is_err(),
        "the failpoint fails ADD"
    );
    assert_eq!(
        dp::sources(&node).unwrap(),
        before,
        "a failed ADD left entries"
    );
    for (bad, needle) in [
        (
            json!({"allowedSourcePrefixes": ["10.0.0.0/33"]}),
            "\"10.0.0.0/33\"",
        ),
        (json!({"sourceCheck": "yes"}), "sourceCheck \"yes\""),
    ] {
        let refused = node.new_pod().unwrap();
        let att = Attachment::new(&unique_container_id(), refused.path(), "eth0");
        match p
            .runtime
            .add(&node, &list_with(&p, &node, bad.clone()), &att)
        {
            Err(ListError::Plugin { output, .. }) => {
                let e = output.expect_error(7, "invalid source check config");
                assert!(
                    e.text_lower().contains(&needle.to_lowercase()),
                    "{bad}: {e:?}"
                );
            }
            other => panic!("{bad}: ADD must fail with 7: {other:?}"),
        }
    }
    let bad_args = node.new_pod().unwrap();
    let att = Attachment::new(&unique_container_id(), bad_args.path(), "eth0")
        .with_args("IgnoreUnknown=1;ECNI_ALLOWED_SOURCES=10.1.0.0/16,nope");
    match p.runtime.add(&node, &list, &att) {
        Err(ListError::Plugin { output, .. }) => {
            let e = output.expect_error(7, "invalid ECNI_ALLOWED_SOURCES");
            assert!(e.text_lower().contains("ecni_allowed_sources"), "{e:?}");
            assert!(e.text_lower().contains("\"nope\""), "{e:?}");
        }
        other => panic!("ADD must fail with 7: {other:?}"),
    }
    assert_eq!(
        dp::sources(&node).unwrap(),
        before,
        "a refused ADD left entries"
    );

    // GC removes entries no attachment owns (a DEL by a release without the map).
    let mut orphan_key = own.raw_key.clone();
    orphan_key[4..8].copy_from_slice(&999_999u32.to_le_bytes());
    let mut orphan_value = own.raw_value.clone();
    orphan_value[0..8].copy_from_slice(&0x0bad_0bad_0bad_0badu64.to_le_bytes());
    dp::update_raw(&node, dp::SOURCES_MAP, &orphan_key, &orphan_value).unwrap();
    let gc_list = NetConfList::single(&p.conf("1.1.0", &node, Stack::Dual));
    p.runtime
        .gc(&node, &gc_list, &[(keep.id(), "eth0")])
        .unwrap_or_else(|e| panic!("GC: {e}"));
    assert!(
        dp::sources(&node)
            .unwrap()
            .iter()
            .all(|e| e.ifindex != 999_999),
        "GC left the orphaned entry"
    );
    p.runtime
        .check(&node, &list, &keep.att, &keep.result)
        .unwrap();

    keep.del(&p, &node, &list);
    assert_node_clean(&node, "after the DELs");
}
