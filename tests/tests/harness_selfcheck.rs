//! The harness checked against Debian's reference plugins (ptp + host-local, v1.1.1), which
//! set up the same ptp-style attachment the ebpf-cni contract describes. These tests prove
//! that the namespaces, runtime emulation, result and state checks, connectivity helpers
//! and eBPF readers work (and can fail), independent of the plugin under test; they also
//! validate the reference chain the benchmark compares against.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use ebpf_cni_tests::bpf::{self, Direction, Mechanism, PinnedObject};
use ebpf_cni_tests::config::{self, Stack, NETWORK};
use ebpf_cni_tests::net::{tcp_echo, tcp_echo_with, udp_echo};
use ebpf_cni_tests::state::{assert_attachment, assert_gone};
use ebpf_cni_tests::{
    kernel, unique_container_id, Attachment, CniCommand, CniRuntime, ContainerEnv, ListError,
    NetConfList, Netns, Node, ResultExpectation, REFERENCE_HOST_LOCAL,
};
use serde_json::json;

/// ptp + tuning: the tuning plugin is chained to exercise `prevResult` passing and the
/// `runtimeConfig` derivation (it applies the `mac` capability argument).
fn reference_list(version: &str, node: &Node) -> NetConfList {
    let ptp = config::standard(version, NETWORK, "ptp", node.data_dir(), Stack::Dual);
    let tuning = json!({
        "type": "tuning",
        "capabilities": { "mac": true },
        "sysctl": { "net.core.somaxconn": "512" }
    });
    NetConfList::chain(&ptp, vec![tuning])
}

/// Spec section 3 (ADD in order with prevResult, CHECK and DEL with the cached result, DEL
/// in reverse) and section 5 (result format per version), plus pod↔pod and node→pod
/// traffic, run against ptp + host-local + tuning.
fn reference_chain_lifecycle(version: &str) {
    ebpf_cni_tests::require_root();
    let node = Node::new().expect("node");
    let pod_a = node.new_pod().expect("pod a");
    let pod_b = node.new_pod().expect("pod b");
    let rt = CniRuntime::reference();
    let list = reference_list(version, &node);
    let mac = "0a:58:0a:0a:00:aa";

    let cid_a = unique_container_id();
    let cid_b = unique_container_id();
    let att_a = Attachment::new(&cid_a, pod_a.path(), "eth0").with_capability("mac", json!(mac));
    let att_b = Attachment::new(&cid_b, pod_b.path(), "eth0");

    let res_a = rt
        .add(&node, &list, &att_a)
        .unwrap_or_else(|e| panic!("ADD a: {e}"));
    let res_b = rt
        .add(&node, &list, &att_b)
        .unwrap_or_else(|e| panic!("ADD b: {e}"));

    let sandbox_a = pod_a.path().to_string_lossy();
    let sandbox_b = pod_b.path().to_string_lossy();
    let a = ResultExpectation::standard(version, "eth0", &sandbox_a, Stack::Dual)
        .with_container_mac(mac)
        .assert_valid(&res_a);
    let b =
        ResultExpectation::standard(version, "eth0", &sandbox_b, Stack::Dual).assert_valid(&res_b);
    assert!(
        a.host_ifname.starts_with("veth"),
        "ptp names host veths veth*: {}",
        a.host_ifname
    );
    assert_ne!(a.ip4().unwrap().addr, b.ip4().unwrap().addr);
    assert_ne!(a.ip6().unwrap().addr, b.ip6().unwrap().addr);

    assert_attachment(&node, &pod_a, "eth0", &a, Some(config::MTU));
    assert_attachment(&node, &pod_b, "eth0", &b, Some(config::MTU));
    // The second plugin ran on the first one's interface.
    assert_eq!(pod_a.sysctl("net.core.somaxconn").unwrap(), "512");
    assert_eq!(
        node.leases(NETWORK).len(),
        4,
        "one lease per IP: {:?}",
        node.leases(NETWORK)
    );
    let lease = node
        .leases(NETWORK)
        .into_iter()
        .find(|l| l.ip == a.ip4().unwrap().addr)
        .unwrap();
    assert_eq!(lease.container_id, cid_a);
    assert_eq!(lease.ifname.as_deref(), Some("eth0"));

    match rt.check(&node, &list, &att_a, &res_a) {
        Ok(()) => assert!(version >= "0.4.0", "CHECK ran for {version}"),
        Err(ListError::CheckUnsupported(_)) => assert!(version < "0.4.0"),
        Err(e) => panic!("CHECK right after ADD: {e}"),
    }

    let (a4, a6) = (a.ip4().unwrap().addr, a.ip6().unwrap().addr);
    let (b4, b6) = (b.ip4().unwrap().addr, b.ip6().unwrap().addr);
    for (to, src) in [(b4, a4), (b6, a6)] {
        let echo = tcp_echo(&pod_a, &pod_b, to, 0).expect("pod a -> pod b TCP");
        assert_eq!(echo.client_addr.ip(), src, "pod traffic is not NATed");
        udp_echo(&pod_a, &pod_b, to, 0).expect("pod a -> pod b UDP");
    }
    tcp_echo(node.netns(), &pod_a, a4, 0).expect("node -> pod a TCP v4");
    tcp_echo(node.netns(), &pod_a, a6, 0).expect("node -> pod a TCP v6");

    if version >= "0.4.0" {
        // CHECK notices a missing address; the harness reads the error result.
        pod_b
            .ip_ok(&["addr", "del", &format!("{b4}/24"), "dev", "eth0"])
            .unwrap();
        let err = rt
            .check(&node, &list, &att_b, &res_b)
            .expect_err("CHECK after address removal");
        let out = err.output().expect("a plugin failed");
        assert!(
            out.error().is_some(),
            "error JSON parsed: {}",
            out.describe()
        );
    }

    rt.del(&node, &list, &att_a, Some(&res_a))
        .unwrap_or_else(|e| panic!("DEL a: {e}"));
    rt.del(&node, &list, &att_b, Some(&res_b))
        .unwrap_or_else(|e| panic!("DEL b: {e}"));
    assert_gone(
        &node,
        Some(&pod_a),
        "eth0",
        &a,
        NETWORK,
        &cid_a,
        "after DEL a",
    );
    assert_gone(
        &node,
        Some(&pod_b),
        "eth0",
        &b,
        NETWORK,
        &cid_b,
        "after DEL b",
    );
    rt.del(&node, &list, &att_a, Some(&res_a))
        .unwrap_or_else(|e| panic!("second DEL a: {e}"));
    assert!(node.leases(NETWORK).is_empty());
}

#[test]
fn reference_chain_lifecycle_0_3_0() {
    reference_chain_lifecycle("0.3.0");
}

#[test]
fn reference_chain_lifecycle_0_3_1() {
    reference_chain_lifecycle("0.3.1");
}

#[test]
fn reference_chain_lifecycle_0_4_0() {
    reference_chain_lifecycle("0.4.0");
}

#[test]
fn reference_chain_lifecycle_1_0_0() {
    reference_chain_lifecycle("1.0.0");
}

/// host-local run directly as an IPAM plugin (section 4: it gets the whole network
/// configuration): the harness reads its leases and sees DEL release them.
#[test]
fn host_local_leases_are_read_back() {
    ebpf_cni_tests::require_root();
    let node = Node::new().unwrap();
    let pod = node.new_pod().unwrap();
    let conf = config::standard("1.0.0", NETWORK, "ptp", node.data_dir(), Stack::Dual);
    let cid = unique_container_id();
    let env = ContainerEnv::new(&cid, pod.path(), "eth1").with_cni_path("/usr/lib/cni");
    let hl = Path::new(REFERENCE_HOST_LOCAL);
    let out = node
        .run(hl, CniCommand::Add, &env, conf.to_string())
        .unwrap();
    let res = out.expect_success("host-local ADD");
    let ips: Vec<IpAddr> = res["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            i["address"]
                .as_str()
                .unwrap()
                .split('/')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    let leases = node.leases(NETWORK);
    assert_eq!(leases.iter().map(|l| l.ip).collect::<Vec<_>>(), ips);
    assert!(leases
        .iter()
        .all(|l| l.container_id == cid && l.ifname.as_deref() == Some("eth1")));
    assert!(node.data_dir_files().iter().any(|f| f.ends_with("lock")));
    node.run(hl, CniCommand::Del, &env, conf.to_string())
        .unwrap()
        .expect_success("host-local DEL");
    assert!(node.leases(NETWORK).is_empty());
    // An error result is recognised as one (missing CNI_PATH is code 4 in the Go skel,
    // which reports environment errors without cniVersion, so not via expect_error).
    let bad = ContainerEnv::new(&cid, pod.path(), "eth1");
    let out = node
        .run(hl, CniCommand::Add, &bad, conf.to_string())
        .unwrap();
    assert!(!out.success());
    let err = out
        .error()
        .unwrap_or_else(|| panic!("no error JSON\n{}", out.describe()));
    assert_eq!(err.code, 4);
    assert!(err.msg.contains("CNI_PATH"), "{}", err.msg);
}

/// The TCX reader sees a program attached by a TCX link, the pin reader identifies the
/// pinned link, and dropping the node removes its pin directory (and so the attachment).
#[test]
fn tcx_readers_and_pin_cleanup() {
    ebpf_cni_tests::require_root();
    let node = Node::new().unwrap();
    let ns = node.netns();
    ns.ip_ok(&[
        "link", "add", "selfa", "type", "veth", "peer", "name", "selfb",
    ])
    .unwrap();
    ns.ip_ok(&["link", "set", "selfa", "up"]).unwrap();
    assert!(bpf::attached_programs(ns, "selfa").unwrap().is_empty());

    let pin = node
        .attachment_pin_dir("selfcheck", "cid", "eth0")
        .join("tcx_ingress");
    let link_id = bpf::fixture::attach_pinned_tcx(ns, "selfa", Direction::Ingress, &pin).unwrap();
    let progs = bpf::attached_programs(ns, "selfa").unwrap();
    assert_eq!(progs.len(), 1, "{progs:?}");
    assert_eq!(progs[0].mechanism, Mechanism::Tcx);
    assert_eq!(progs[0].direction, Direction::Ingress);
    assert_eq!(progs[0].link_id, Some(link_id));
    assert_eq!(progs[0].name, "ecni_selftst");
    assert!(bpf::tcx_programs(ns, "selfb").unwrap().is_empty());

    match bpf::pinned_object(&pin).unwrap() {
        PinnedObject::Link(info) => {
            assert_eq!(info.id, link_id);
            assert_eq!(info.prog_id, progs[0].prog_id);
            assert_eq!(
                info.tcx.map(|t| t.0),
                Some(bpf::ifindex_in(ns, "selfa").unwrap())
            );
            assert_eq!(info.tcx_direction(), Some(Direction::Ingress));
        }
        other => panic!("expected a TCX link pin, got {other:?}"),
    }
    assert_eq!(
        node.pinned_files(),
        vec![Path::new("attachments/selfcheck/cid/eth0/tcx_ingress")]
    );
    // bpftool runs in the node namespace and its JSON parses. (Debian's bpftool 7.1 predates
    // TCX and lists nothing for this device, which is why TCX is queried directly.)
    let shown = bpf::bpftool_net_show(ns, "selfa").unwrap();
    assert!(shown.as_array().is_some_and(|a| !a.is_empty()), "{shown}");

    // A classic cls_bpf filter (what the plugin must not use, but must be seen if it did).
    let prog_pin = node.pin_root().join("selfcheck-prog");
    let prog_id = bpf::fixture::pin_tc_prog(&prog_pin).unwrap();
    ns.ip_ok(&["link", "set", "selfb", "up"]).unwrap();
    let tc = |args: &[&str]| {
        // nsenter, not `ip netns exec`: tc must see the host bpffs to open the pin.
        let out = ns.nsenter(&[&["tc"], args].concat()).unwrap();
        assert!(
            out.status.success(),
            "tc {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    tc(&["qdisc", "add", "dev", "selfb", "clsact"]);
    let pinned = prog_pin.to_string_lossy();
    tc(&[
        "filter",
        "add",
        "dev",
        "selfb",
        "egress",
        "bpf",
        "da",
        "object-pinned",
        &pinned,
    ]);
    let progs = bpf::attached_programs(ns, "selfb").unwrap();
    assert_eq!(progs.len(), 1, "{progs:?}");
    assert_eq!(progs[0].mechanism, Mechanism::NetlinkTc);
    assert_eq!(progs[0].direction, Direction::Egress);
    assert_eq!(progs[0].prog_id, prog_id);
    assert!(
        matches!(bpf::pinned_object(&prog_pin).unwrap(), PinnedObject::Prog { id, .. } if id == prog_id)
    );

    let root = node.pin_root().to_path_buf();
    drop(node);
    assert!(!root.exists(), "node drop left {}", root.display());
}

/// A panicking test still tears down its namespaces and directories.
#[test]
fn node_teardown_runs_on_panic() {
    ebpf_cni_tests::require_root();
    let mut seen = None;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let node = Node::new().unwrap();
        let pod = node.new_pod().unwrap();
        seen = Some((
            node.netns().path().to_path_buf(),
            pod.path().to_path_buf(),
            node.scratch_dir().to_path_buf(),
        ));
        panic!("deliberate panic inside a test body");
    }));
    assert!(r.is_err());
    let (node_ns, pod_ns, scratch) = seen.unwrap();
    assert!(!node_ns.exists(), "{} left", node_ns.display());
    assert!(!pod_ns.exists(), "{} left", pod_ns.display());
    assert!(!scratch.exists(), "{} left", scratch.display());
}

/// The connectivity helpers fail (within their bound) when there is no path, and the
/// kernel readers see an unconfigured namespace as empty.
#[test]
fn connectivity_checks_can_fail() {
    ebpf_cni_tests::require_root();
    let a = Netns::create("p").unwrap();
    let b = Netns::create("p").unwrap();
    a.ip_ok(&["addr", "add", "10.77.0.1/32", "dev", "lo"])
        .unwrap();
    b.ip_ok(&["addr", "add", "10.77.0.2/32", "dev", "lo"])
        .unwrap();
    let to: IpAddr = "10.77.0.2".parse().unwrap();
    let err = tcp_echo_with(&a, &b, to, 0, Duration::from_secs(1)).unwrap_err();
    assert!(err.to_string().contains("failed"), "{err:#}");
    // Loopback inside one namespace works, so the helper itself is sound.
    tcp_echo(&b, &b, to, 0).unwrap();
    udp_echo(&b, &b, to, 0).unwrap();
    assert!(kernel::routes(&a, kernel::Family::V6)
        .unwrap()
        .iter()
        .all(|r| !r.is_default()));
    assert_eq!(kernel::links(&a).unwrap().len(), 1, "only lo");
}

/// The etcd harness (tests/src/etcd.rs) runs a real cluster: its members elect a leader, a
/// namespace attached to its LAN (and only once attached) reads and writes through any
/// member, the cluster survives its leader killed (a new one is elected, the data stays
/// readable and writable), the killed member comes back on its data and catches up, and
/// dropping the cluster leaves no namespace, process or directory behind.
#[test]
fn etcd_cluster_elects_a_leader_and_survives_one_member_killed() {
    use ebpf_cni_tests::etcd::EtcdCluster;
    use std::net::Ipv4Addr;
    use std::process::Command;

    ebpf_cni_tests::require_root();
    let mut cluster = EtcdCluster::start(3).expect("etcd cluster");
    assert_eq!(cluster.len(), 3);
    let eps = [
        "http://10.250.0.10:2379",
        "http://10.250.0.11:2379",
        "http://10.250.0.12:2379",
    ];
    assert_eq!(cluster.endpoints(), eps);
    assert_eq!(cluster.endpoints_arg(), eps.join(","));
    let health = cluster
        .etcdctl(&["endpoint", "health", "-w", "json"])
        .unwrap();
    let health: serde_json::Value = serde_json::from_str(&health).unwrap();
    let healthy = health
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["health"].as_bool() == Some(true))
        .count();
    assert_eq!(healthy, 3, "{health}");

    // A node outside the LAN reaches no member; attached, it does.
    let node = Netns::create("n").unwrap();
    let err = cluster
        .etcdctl_in(&node, &["get", "/ecni/selfcheck"])
        .unwrap_err();
    assert!(format!("{err:#}").contains("failed"), "{err:#}");
    let addr = cluster.attach(&node, "lan0", 100).unwrap();
    assert_eq!(addr, Ipv4Addr::new(10, 250, 0, 100));
    let shown = node.ip_ok(&["-4", "addr", "show", "dev", "lan0"]).unwrap();
    assert!(shown.contains("10.250.0.100/24"), "{shown}");
    assert!(
        cluster.attach(&node, "lan1", 11).is_err(),
        "a member's address"
    );
    assert_eq!(
        cluster
            .etcdctl_in(&node, &["put", "/ecni/selfcheck", "before"])
            .unwrap()
            .trim(),
        "OK"
    );
    assert_eq!(
        cluster.get("/ecni/selfcheck").unwrap().as_deref(),
        Some("before")
    );
    cluster.put("/ecni/selfcheck/other", "-x y\nz").unwrap();
    assert_eq!(
        cluster.get_prefix("/ecni/").unwrap(),
        [
            ("/ecni/selfcheck".to_owned(), "before".to_owned()),
            ("/ecni/selfcheck/other".to_owned(), "-x y\nz".to_owned()),
        ]
    );
    assert_eq!(cluster.get("/ecni/none").unwrap(), None);

    // The leader dies: another is elected, and the data stays readable and writable from
    // the node.
    let old = cluster.leader().unwrap();
    assert!(old < 3);
    cluster.kill(old).unwrap();
    assert!(!cluster.is_running(old));
    assert!(
        cluster
            .etcdctl_member(old, &["get", "/ecni/selfcheck"])
            .is_err(),
        "the killed member m{old} still answers"
    );
    let new = cluster.leader().unwrap();
    assert_ne!(new, old);
    assert!(cluster.is_running(new));
    let read = cluster
        .etcdctl_in(&node, &["get", "--print-value-only", "/ecni/selfcheck"])
        .unwrap();
    assert_eq!(read, "before\n");
    cluster
        .etcdctl_in(&node, &["put", "/ecni/selfcheck", "after"])
        .unwrap();
    assert_eq!(
        cluster.get("/ecni/selfcheck").unwrap().as_deref(),
        Some("after")
    );
    assert_eq!(cluster.del("/ecni/selfcheck/other").unwrap(), 1);
    assert_eq!(cluster.del("/ecni/selfcheck/other").unwrap(), 0);

    // Back on its data, the killed member catches up with what it missed.
    cluster.restart(old).unwrap();
    assert!(cluster.is_running(old));
    let read = cluster
        .etcdctl_member(old, &["get", "--print-value-only", "/ecni/selfcheck"])
        .unwrap();
    assert_eq!(read, "after\n");
    assert!(cluster.log(old).unwrap().contains("existing"));
    let leader = cluster.leader().unwrap();
    assert!(leader < 3);

    // Compaction drops the history: the first write's revision is gone.
    let rev = cluster.compact().unwrap();
    assert!(rev >= 5, "revision {rev}");
    assert_eq!(cluster.compact().unwrap(), rev, "compacting twice");
    let err = cluster
        .etcdctl(&["get", "--rev", "2", "/ecni/selfcheck"])
        .unwrap_err();
    assert!(format!("{err:#}").contains("compacted"), "{err:#}");

    // Nothing is left behind.
    let namespaces: Vec<String> = std::iter::once(cluster.lan().name().to_owned())
        .chain((0..3).map(|i| cluster.member_netns(i).name().to_owned()))
        .collect();
    let dir = cluster.dir().to_path_buf();
    drop(cluster);
    let listed = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    for ns in &namespaces {
        assert!(
            !listed
                .lines()
                .any(|l| l.split_whitespace().next() == Some(ns.as_str())),
            "{ns} left: {listed}"
        );
    }
    assert!(!dir.exists(), "{} left", dir.display());
    let etcds = Command::new("pgrep")
        .args(["-f", &dir.to_string_lossy()])
        .output()
        .unwrap();
    assert!(
        !etcds.status.success(),
        "etcd left: {}",
        String::from_utf8_lossy(&etcds.stdout)
    );
    // The kernel destroys a deleted namespace, and with it the veth, asynchronously.
    let gone = (0..50).any(|_| {
        let link = node.ip(&["link", "show", "lan0"]).unwrap();
        !link.status.success() || {
            std::thread::sleep(Duration::from_millis(100));
            false
        }
    });
    assert!(gone, "lan0 outlived the LAN by 5 s");
}

/// The stand-in for the Kubernetes API server (tests/src/kube_api.rs), driven with curl over
/// HTTPS with its CA and token: the list and its resourceVersion, connections kept alive, a
/// watch that replays the history, follows changes made meanwhile, sends bookmarks and ends
/// cleanly at `timeoutSeconds`, a watch dropped mid-stream, the 410 event once the history
/// expired, status patches (strategic merge by condition type, JSON merge, refused with 403),
/// the 401 of a wrong or missing token, 404 and 405; and dropping it stops it.
#[test]
fn kube_api_stand_in_lists_watches_expires_and_patches() {
    use ebpf_cni_tests::kube_api::{self, KubeApi};
    use serde_json::Value;
    use std::process::{Command, Output, Stdio};
    use std::time::{Instant, SystemTime, UNIX_EPOCH};

    let api = KubeApi::start(None, "127.0.0.1:0".parse().unwrap(), "t0ken").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (ca, token_file) = api.write_credentials(dir.path()).unwrap();
    assert_eq!(std::fs::read_to_string(&token_file).unwrap(), "t0ken");
    assert_eq!(std::fs::read_to_string(&ca).unwrap(), api.ca_pem());
    let base = format!("https://{}", api.addr());
    // curl with the CA, and the token when not "".
    let curl = |token: &str, args: &[&str]| -> Command {
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--cacert"]).arg(&ca).stdin(Stdio::null());
        if !token.is_empty() {
            cmd.args(["-H", &format!("Authorization: Bearer {token}")]);
        }
        cmd.args(args);
        cmd
    };
    // One request: its status and JSON body.
    let call = |token: &str, args: &[&str], path: &str| -> (u16, Value) {
        let url = format!("{base}{path}");
        let out = curl(token, args)
            .args(["--max-time", "10", "-w", "\n%{http_code}", &url])
            .output()
            .unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(
            out.status.success(),
            "curl {args:?} {url}: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (body, code) = stdout.rsplit_once('\n').unwrap();
        (code.parse().unwrap(), serde_json::from_str(body).unwrap())
    };
    let patch = |token: &str, content_type: &str, name: &str, body: &str| {
        let content_type = format!("Content-Type: {content_type}");
        let args = ["-X", "PATCH", "-H", &content_type, "--data-binary", body];
        call(token, &args, &format!("/api/v1/nodes/{name}/status"))
    };
    // A watch streamed with `curl -N`: curl's output and the events.
    let watch = |query: &str, max_time: &str| -> (Output, Vec<Value>) {
        let url = format!("{base}/api/v1/nodes?{query}");
        let out = curl("t0ken", &["-N", "--max-time", max_time, &url])
            .output()
            .unwrap();
        let events = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
            .collect();
        (out, events)
    };
    let rv = |v: &Value| {
        v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let kinds = |events: &[Value]| -> Vec<String> {
        events
            .iter()
            .map(|e| e["type"].as_str().unwrap().to_owned())
            .collect()
    };

    // The list: both nodes, at the resourceVersion of the last change (100 before any).
    let n1 = kube_api::node(
        "n1",
        &["10.1.0.0/24", "fd00:1::/64"],
        &["192.168.50.1"],
        &[("ebpf-cni.io/example", "one")],
    );
    assert_eq!(api.set_node(n1.clone()), 101);
    assert_eq!(api.set_node(kube_api::node("n2", &[], &[], &[])), 102);
    let (status, list) = call("t0ken", &[], "/api/v1/nodes?limit=500");
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["kind"], "NodeList");
    assert_eq!(rv(&list), "102");
    let items = list["items"].as_array().unwrap();
    let names: Vec<&str> = items
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["n1", "n2"]);
    let first = &items[0];
    assert_eq!(rv(first), "101");
    assert_eq!(first["spec"]["podCIDR"], "10.1.0.0/24");
    assert_eq!(first["spec"]["podCIDRs"][1], "fd00:1::/64");
    assert_eq!(first["status"]["addresses"][0]["address"], "192.168.50.1");
    assert_eq!(first["status"]["addresses"][1]["type"], "Hostname");
    assert_eq!(
        first["metadata"]["annotations"]["ebpf-cni.io/example"],
        "one"
    );
    assert_eq!(first["status"]["conditions"][0]["type"], "Ready");
    assert_eq!(items[1]["spec"], serde_json::json!({}));
    let uid = first["metadata"]["uid"].as_str().unwrap().to_owned();
    assert_ne!(uid, items[1]["metadata"]["uid"].as_str().unwrap());
    // creationTimestamp is RFC 3339 UTC, and now.
    let created = first["metadata"]["creationTimestamp"].as_str().unwrap();
    let date = Command::new("date")
        .args(["-u", "-d", created, "+%s"])
        .output()
        .unwrap();
    let created_secs: u64 = String::from_utf8_lossy(&date.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{created}: {e}"));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(now.abs_diff(created_secs) < 120, "{created} vs {now}");

    // Two requests in one curl: the second reuses the first's connection.
    let node_url = format!("{base}/api/v1/nodes/n1");
    let out = curl("t0ken", &["-o", "/dev/null", "-o", "/dev/null"])
        .args(["-w", "%{http_code}:%{num_connects} ", &node_url, &node_url])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200:1 200:0 ");

    // A watch from the list's resourceVersion: a change made meanwhile, bookmarks, and a
    // clean end (the terminating chunk: curl succeeds) at timeoutSeconds.
    api.set_bookmark_every(Duration::from_millis(300));
    let mut modified = n1.clone();
    modified["metadata"]["annotations"]["ebpf-cni.io/example"] = "two".into();
    let started = Instant::now();
    let (out, events) = std::thread::scope(|s| {
        // Half a second into the watch: after its first bookmark.
        let changer = s.spawn(|| {
            let opened = (0..100).any(|_| {
                api.open_watches() == 1 || {
                    std::thread::sleep(Duration::from_millis(20));
                    false
                }
            });
            std::thread::sleep(Duration::from_millis(500));
            (opened, api.set_node(modified))
        });
        let watched = watch(
            "watch=true&timeoutSeconds=2&allowWatchBookmarks=true&resourceVersion=102",
            "5",
        );
        assert_eq!(changer.join().unwrap(), (true, 103));
        watched
    });
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "{:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(5),
        "{took:?}"
    );
    let changes: Vec<&Value> = events.iter().filter(|e| e["type"] != "BOOKMARK").collect();
    assert_eq!(changes.len(), 1, "{events:?}");
    assert_eq!(changes[0]["type"], "MODIFIED");
    assert_eq!(rv(&changes[0]["object"]), "103");
    assert_eq!(changes[0]["object"]["metadata"]["uid"], uid.as_str());
    assert_eq!(
        changes[0]["object"]["metadata"]["annotations"]["ebpf-cni.io/example"],
        "two"
    );
    let bookmarks: Vec<String> = events
        .iter()
        .filter(|e| e["type"] == "BOOKMARK")
        .map(|e| rv(&e["object"]))
        .collect();
    assert!(bookmarks.len() >= 3, "{events:?}");
    assert_eq!(bookmarks.last().unwrap(), "103", "{events:?}");
    assert_eq!(events[0]["type"], "BOOKMARK", "{events:?}");
    assert_eq!(rv(&events[0]["object"]), "102");
    assert_eq!(api.open_watches(), 0);

    // From an older resourceVersion the history is replayed; without allowWatchBookmarks no
    // bookmark comes.
    let (out, events) = watch("watch=1&resourceVersion=101&timeoutSeconds=1", "3");
    assert!(out.status.success());
    assert_eq!(kinds(&events), ["ADDED", "MODIFIED"], "{events:?}");
    assert_eq!(events[0]["object"]["metadata"]["name"], "n2");
    assert_eq!(rv(&events[1]["object"]), "103");

    // drop_watches closes an open watch's connection mid-body: curl fails.
    let url = format!("{base}/api/v1/nodes?watch=true&resourceVersion=103");
    let child = curl("t0ken", &["-N", "--max-time", "10", &url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let opened = (0..100).any(|_| {
        api.open_watches() == 1 || {
            std::thread::sleep(Duration::from_millis(50));
            false
        }
    });
    assert!(opened, "the watch did not open");
    let dropped_at = Instant::now();
    api.drop_watches();
    let out = child.wait_with_output().unwrap();
    assert!(dropped_at.elapsed() < Duration::from_secs(2));
    assert!(
        !out.status.success(),
        "curl took a dropped watch for a complete response"
    );
    assert_eq!(api.open_watches(), 0);

    // After expire_history, a watch from an older resourceVersion gets the 410 event alone;
    // one from the current resourceVersion goes on.
    assert_eq!(api.expire_history(), 104);
    let (out, events) = watch(
        "watch=true&resourceVersion=103&allowWatchBookmarks=true",
        "3",
    );
    assert!(out.status.success());
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "ERROR");
    let status = &events[0]["object"];
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["code"], 410);
    assert_eq!(status["reason"], "Expired");
    assert_eq!(status["message"], "too old resource version: 103 (104)");
    let (out, events) = watch("watch=true&resourceVersion=104&timeoutSeconds=1", "3");
    assert!(out.status.success());
    assert!(events.is_empty(), "{events:?}");
    // Without a resourceVersion, a watch starts with every node ADDED.
    let (out, events) = watch("watch=true&timeoutSeconds=1", "3");
    assert!(out.status.success());
    assert_eq!(kinds(&events), ["ADDED", "ADDED"], "{events:?}");
    assert_eq!(events[1]["object"]["metadata"]["name"], "n2");

    // Single nodes.
    let (status, got) = call("t0ken", &[], "/api/v1/nodes/n1");
    assert_eq!((status, rv(&got)), (200, "103".to_owned()));
    let (status, missing) = call("t0ken", &[], "/api/v1/nodes/nope");
    assert_eq!(status, 404);
    assert_eq!(missing["reason"], "NotFound");
    assert_eq!(missing["message"], "nodes \"nope\" not found");
    assert_eq!(missing["details"]["name"], "nope");

    // A strategic merge patch of the status merges the condition by type: added, then
    // changed (the fields not given kept); a patch changing nothing makes no new version.
    let unavailable = r#"{"status":{"conditions":[{"type":"NetworkUnavailable","status":"False","reason":"EbpfCniReady","message":"ebpf-cni is up"}]}}"#;
    let smp = "application/strategic-merge-patch+json";
    let (status, patched) = patch("t0ken", smp, "n1", unavailable);
    assert_eq!(status, 200, "{patched}");
    assert_eq!(rv(&patched), "105");
    let condition_types = |node: &Value| -> Vec<String> {
        node["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(condition_types(&patched), ["Ready", "NetworkUnavailable"]);
    assert_eq!(api.node("n1").unwrap(), patched);
    let down = r#"{"status":{"conditions":[{"type":"NetworkUnavailable","status":"True","reason":"EbpfCniDown"}]}}"#;
    let (status, patched) = patch("t0ken", smp, "n1", down);
    assert_eq!((status, rv(&patched)), (200, "106".to_owned()));
    assert_eq!(condition_types(&patched), ["Ready", "NetworkUnavailable"]);
    let network = &patched["status"]["conditions"][1];
    assert_eq!(network["status"], "True");
    assert_eq!(network["reason"], "EbpfCniDown");
    assert_eq!(network["message"], "ebpf-cni is up");
    let (status, again) = patch("t0ken", smp, "n1", down);
    assert_eq!((status, rv(&again)), (200, "106".to_owned()));
    // A JSON merge patch replaces the list whole.
    let (status, merged) = patch("t0ken", "application/merge-patch+json", "n2", unavailable);
    assert_eq!((status, rv(&merged)), (200, "107".to_owned()));
    assert_eq!(condition_types(&merged), ["NetworkUnavailable"]);
    let recorded: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .collect();
    assert_eq!(recorded.len(), 4);
    assert_eq!(recorded[0].target, "/api/v1/nodes/n1/status");
    assert_eq!(recorded[0].content_type, smp);
    assert_eq!(recorded[0].body, unavailable);
    assert_eq!(recorded[0].token, "t0ken");
    assert_eq!(recorded[0].status, 200);
    let (status, refused) = patch("t0ken", "application/json-patch+json", "n1", "[]");
    assert_eq!(
        (status, refused["reason"].as_str()),
        (415, Some("UnsupportedMediaType"))
    );

    // Refused: 403, and the node stays as it was.
    api.refuse_status_patch(true);
    let (status, forbidden) = patch("t0ken", smp, "n1", unavailable);
    assert_eq!(status, 403);
    assert_eq!(forbidden["reason"], "Forbidden");
    assert_eq!(forbidden["code"], 403);
    let message = forbidden["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "nodes \"n1\" is forbidden: User \"system:serviceaccount:kube-system:ebpf-cni\" cannot patch resource \"nodes/status\""
        ),
        "{message}"
    );
    assert_eq!(rv(&api.node("n1").unwrap()), "106");
    api.refuse_status_patch(false);

    // Tokens: a wrong one, none, a refused one are 401; another accepted one works.
    for token in ["wrong", ""] {
        let (status, unauthorized) = call(token, &[], "/api/v1/nodes");
        assert_eq!(status, 401, "{token:?}");
        assert_eq!(unauthorized["reason"], "Unauthorized");
        assert_eq!(unauthorized["code"], 401);
    }
    api.accept_token("other");
    api.refuse_token("t0ken");
    assert_eq!(call("t0ken", &[], "/api/v1/nodes").0, 401);
    assert_eq!(call("other", &[], "/api/v1/nodes").0, 200);
    api.accept_token("t0ken");
    let last = api.requests();
    let last: Vec<(&str, u16)> = last[last.len() - 4..]
        .iter()
        .map(|r| (r.token.as_str(), r.status))
        .collect();
    assert_eq!(
        last,
        [("wrong", 401), ("", 401), ("t0ken", 401), ("other", 200)]
    );

    // Other methods and paths.
    let (status, denied) = call("t0ken", &["-X", "DELETE"], "/api/v1/nodes/n1");
    assert_eq!(
        (status, denied["reason"].as_str()),
        (405, Some("MethodNotAllowed"))
    );
    let (status, unknown) = call("t0ken", &[], "/api/v1/pods");
    assert_eq!(
        (status, unknown["reason"].as_str()),
        (404, Some("NotFound"))
    );

    // Deleted, and added again with a new uid.
    assert_eq!(api.delete_node("n1"), 108);
    assert_eq!(api.delete_node("n1"), 108);
    assert!(api.node("n1").is_none());
    assert_eq!(call("t0ken", &[], "/api/v1/nodes/n1").0, 404);
    assert_eq!(api.set_node(n1), 109);
    let readded = api.node("n1").unwrap();
    assert_ne!(readded["metadata"]["uid"], uid.as_str());

    // Dropped, it stops at once and listens no more.
    let addr = api.addr();
    let dropping = Instant::now();
    drop(api);
    assert!(dropping.elapsed() < Duration::from_secs(2));
    assert!(std::net::TcpStream::connect(addr).is_err());
}
