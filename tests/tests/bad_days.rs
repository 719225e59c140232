//! What real runtimes, hand-run commands and broken nodes do to a CNI plugin, each as it
//! happens on a node: names bpffs refuses, a node device that cannot get its program.
//! docs/operations.md ("Bad days") says what the plugin does on each.

use ebpf_cni_tests::config::Stack;
use ebpf_cni_tests::dataplane as dp;
use ebpf_cni_tests::external::ExternalHost;
use ebpf_cni_tests::state::{assert_gone, assert_node_clean};
use ebpf_cni_tests::{fsutil, require_root, AddResult, CniCommand, Node, PluginUnderTest};
use serde_json::json;

/// bpffs refuses every name holding a `.` (the kernel keeps them for itself), and CNI allows
/// one in network names and container ids, Linux in interface names. A network `lab.net`,
/// a container `pod.1.a` and an interface `net.1` get their pins (each `.` written `%2e`),
/// CHECK proves them, `inspect` names them as they are, and DEL leaves nothing.
#[test]
fn dotted_network_container_and_interface_names_get_their_pins() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let pod = node.new_pod().unwrap();
    let (network, cid, ifname) = ("lab.net", "pod.1.a", "net.1");
    let mut conf = p.conf("1.0.0", &node, Stack::Dual);
    conf["name"] = json!(network);
    let env = p.env(cid, pod.path(), ifname);
    let res = p
        .run(&node, CniCommand::Add, &env, conf.to_string())
        .expect_success("ADD with dotted names");
    let r = AddResult::parse(&res).expect("an ADD result");
    let dir = node.attachment_pin_dir(network, cid, ifname);
    assert!(
        dir.ends_with("lab%2enet/pod%2e1%2ea/net%2e1"),
        "{}",
        dir.display()
    );
    let pins = fsutil::list_files(&dir).unwrap_or_default();
    assert!(
        !pins.is_empty(),
        "no pins under {}: the attachment's state was not pinned",
        dir.display()
    );

    let mut checked = conf.clone();
    checked["prevResult"] = res.clone();
    p.run(&node, CniCommand::Check, &env, checked.to_string())
        .expect_success("CHECK with dotted names");
    let report = dp::inspect(&p.bin, &node).unwrap();
    let att = dp::inspect_attachment(&report, cid).expect("inspect lists the attachment");
    assert_eq!(
        (&att["network"], &att["ifname"]),
        (&json!(network), &json!(ifname)),
        "inspect does not name the attachment as it is: {att}"
    );

    del_leaves_nothing(
        &p,
        &node,
        &env,
        &checked,
        Some(&pod),
        &r,
        "DEL with dotted names",
    );
    assert_node_clean(&node, "after the last DEL");
}

/// A node device the device program cannot be attached to leaves the pods on it
/// half-configured (no host port or masqueraded reply arriving on it reaches them): the ADD
/// fails naming the device and leaves nothing, not a warning and a pod that works in part.
/// The attach is made to fail by what blocks it on a real node: something else already
/// holding the path its link is pinned at.
#[test]
fn an_add_whose_device_program_cannot_be_attached_fails_and_leaves_nothing() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let _ext = ExternalHost::attach(node.netns(), "up0", 81).unwrap();
    let conf = p.conf("1.0.0", &node, Stack::Dual);
    // Warm the node once, so what a first ADD keeps in the IPAM store is in the baseline.
    let warm = node.new_pod().unwrap();
    let warm_env = p.env("warm", warm.path(), "eth0");
    p.run(&node, CniCommand::Add, &warm_env, conf.to_string())
        .expect_success("warm-up ADD");
    p.run(&node, CniCommand::Del, &warm_env, conf.to_string())
        .expect_success("warm-up DEL");
    let pod = node.new_pod().unwrap();
    let before = node.snapshot(Some(&pod)).without_lock();
    // Under the node's pin root, a directory where the uplink's link would be pinned.
    std::fs::create_dir_all(dp::device_link_pin(&node, "up0")).unwrap();

    let env = p.env("blocked", pod.path(), "eth0");
    let out = p.run(&node, CniCommand::Add, &env, conf.to_string());
    let err = out.expect_error(101, "ADD on a node whose uplink cannot get the program");
    assert!(
        err.msg.contains("up0") && err.msg.contains("device program"),
        "the error does not name the device: {}",
        out.describe()
    );
    // The failed ADD's rollback takes the node's state with it, the blocking directory too.
    assert_node_clean(&node, "after the failed ADD");
    assert_eq!(
        node.snapshot(Some(&pod)).without_lock(),
        before,
        "the failed ADD left state behind"
    );

    // Nothing in the way: the same ADD succeeds.
    p.run(&node, CniCommand::Add, &env, conf.to_string())
        .expect_success("ADD once the path is free");
    assert!(
        dp::device_link_pin(&node, "up0").is_file(),
        "the uplink's link is not pinned"
    );
    p.run(&node, CniCommand::Del, &env, conf.to_string())
        .expect_success("DEL");
    assert_node_clean(&node, "after DEL");
}

/// DEL of the pod `env` names, with `conf` (the network's name, as the runtime cached it),
/// succeeds and leaves nothing of it: no veth, route, lease or pin.
fn del_leaves_nothing(
    p: &PluginUnderTest,
    node: &Node,
    env: &ebpf_cni_tests::ContainerEnv,
    conf: &serde_json::Value,
    pod: Option<&ebpf_cni_tests::Netns>,
    r: &AddResult,
    what: &str,
) {
    p.run(node, CniCommand::Del, env, conf.to_string())
        .expect_success(what);
    let (cid, ifname) = (
        env.container_id
            .as_deref()
            .expect("a DEL names its container"),
        env.ifname.as_deref().expect("a DEL names its interface"),
    );
    let network = conf["name"].as_str().expect("a config names its network");
    assert_gone(node, pod, ifname, r, network, cid, what);
}

/// Trying the plugin by hand: `ip netns exec <node> ebpf-cni` runs it in a mount namespace
/// of its own whose `/sys` is a fresh sysfs, without the host's bpffs. The plugin pins in
/// the host's bpffs all the same, so the programs loaded by the first ADD serve the second,
/// CHECK finds what ADD made, and DEL leaves nothing (a bpffs of its own would vanish with
/// each command, pins and all).
#[test]
fn the_plugin_run_by_hand_under_ip_netns_exec_pins_in_the_hosts_bpffs() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let conf = p.conf("1.0.0", &node, Stack::Dual);
    let by_hand = |cmd, env: &ebpf_cni_tests::ContainerEnv, conf: &serde_json::Value| {
        node.run_by_hand(&p.bin, cmd, env, conf.to_string())
            .unwrap_or_else(|e| panic!("ip netns exec {} {cmd}: {e:#}", node.netns().name()))
    };
    let (pod_a, pod_b) = (node.new_pod().unwrap(), node.new_pod().unwrap());
    let (env_a, env_b) = (
        p.env("by-hand-a", pod_a.path(), "eth0"),
        p.env("by-hand-b", pod_b.path(), "eth0"),
    );
    let res_a = by_hand(CniCommand::Add, &env_a, &conf).expect_success("ADD a by hand");
    assert!(
        node.pin_root().exists(),
        "the ADD pinned nothing in the host's bpffs at {}",
        node.pin_root().display()
    );
    let programs = dp::pinned_programs(&node);
    assert!(!programs.is_empty(), "no programs pinned");
    let res_b = by_hand(CniCommand::Add, &env_b, &conf).expect_success("ADD b by hand");
    assert_eq!(
        dp::pinned_programs(&node),
        programs,
        "the second ADD did not find the first one's programs"
    );
    let (a, b) = (
        AddResult::parse(&res_a).expect("a's result"),
        AddResult::parse(&res_b).expect("b's result"),
    );
    ebpf_cni_tests::state::assert_attachment(&node, &pod_a, "eth0", &a, None);
    ebpf_cni_tests::state::assert_attachment(&node, &pod_b, "eth0", &b, None);
    for (env, res, what) in [(&env_a, &res_a, "a"), (&env_b, &res_b, "b")] {
        let mut with_prev = conf.clone();
        with_prev["prevResult"] = res.clone();
        by_hand(CniCommand::Check, env, &with_prev)
            .expect_success(&format!("CHECK {what} by hand"));
    }
    by_hand(CniCommand::Del, &env_a, &conf).expect_success("DEL a by hand");
    assert_gone(
        &node,
        Some(&pod_a),
        "eth0",
        &a,
        ebpf_cni_tests::config::NETWORK,
        "by-hand-a",
        "DEL a",
    );
    // The last DEL, run the usual way, finds the node as the hand-run commands left it.
    del_leaves_nothing(&p, &node, &env_b, &conf, Some(&pod_b), &b, "DEL b");
    assert_node_clean(&node, "after the last DEL");
}

/// A `CNI_NETNS` that is the node's own namespace: `/proc/self/ns/net`, or a
/// `/proc/<pid>/ns/net` whose pid a host process now has (containernetworking/plugins#714:
/// a DEL took the host's interface down). The node has an interface named as the pod's
/// (`eth0`, a veth as on a node that is itself a container) and a device program on its
/// uplink. ADD and CHECK refuse it (code 106, the path named) before anything changes;
/// `CNI_NETNS_OVERRIDE` lets CHECK look there. DEL exits 0 and deletes no node interface:
/// a DEL of a pod that is not there changes nothing; a DEL of a live pod removes that pod
/// (its host veth, lease and pins) and nothing of the node's.
#[test]
fn a_cni_netns_that_is_the_nodes_own_changes_nothing_of_the_node() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let _ext = ExternalHost::attach(node.netns(), "up0", 82).unwrap();
    node.netns()
        .ip_ok(&[
            "link", "add", "eth0", "type", "veth", "peer", "name", "eth0peer",
        ])
        .unwrap();
    node.netns().ip_ok(&["link", "set", "eth0", "up"]).unwrap();
    let conf = p.conf("1.0.0", &node, Stack::Dual);
    let (pod, other) = (node.new_pod().unwrap(), node.new_pod().unwrap());
    let (env, other_env) = (
        p.env("live-pod", pod.path(), "eth0"),
        p.env("other-pod", other.path(), "eth0"),
    );
    let res = p
        .run(&node, CniCommand::Add, &env, conf.to_string())
        .expect_success("ADD of the live pod");
    let other_res = p
        .run(&node, CniCommand::Add, &other_env, conf.to_string())
        .expect_success("ADD of the other pod");
    let uplink = || ebpf_cni_tests::bpf::attached_programs(node.netns(), "up0").unwrap();
    let uplink_progs = uplink();
    assert!(!uplink_progs.is_empty(), "the uplink has no device program");

    let node_path = node.netns().path().to_path_buf();
    let own_paths = [
        node_path.as_path(),
        std::path::Path::new("/proc/self/ns/net"),
    ];
    for own in own_paths {
        let before = node.snapshot(None);
        let add = p.run(
            &node,
            CniCommand::Add,
            &p.env("host-ns-add", own, "eth1"),
            conf.to_string(),
        );
        let err = add.expect_error(106, &format!("ADD with CNI_NETNS={}", own.display()));
        assert!(
            err.msg.contains("node's own network namespace"),
            "{}",
            add.describe()
        );

        let mut with_prev = conf.clone();
        with_prev["prevResult"] = res.clone();
        let check = p.run(
            &node,
            CniCommand::Check,
            &p.env("live-pod", own, "eth0"),
            with_prev.to_string(),
        );
        let err = check.expect_error(106, &format!("CHECK with CNI_NETNS={}", own.display()));
        assert!(
            err.msg.contains(&own.display().to_string()),
            "{}",
            check.describe()
        );
        let overridden = p.run(
            &node,
            CniCommand::Check,
            &p.env("live-pod", own, "eth0")
                .with_env("CNI_NETNS_OVERRIDE", "1"),
            with_prev.to_string(),
        );
        assert!(
            overridden.error().is_some_and(|e| e.code != 106),
            "CHECK with CNI_NETNS_OVERRIDE must look at the namespace (and find no pod there)\n{}",
            overridden.describe()
        );

        p.run(
            &node,
            CniCommand::Del,
            &p.env("never-added", own, "eth0"),
            conf.to_string(),
        )
        .expect_success(&format!("DEL of no pod with CNI_NETNS={}", own.display()));
        assert_eq!(
            node.snapshot(None),
            before,
            "ADD, CHECK or DEL with CNI_NETNS={} changed the node",
            own.display()
        );
        assert_eq!(uplink(), uplink_progs, "the uplink's program changed");
    }

    // The live pod's DEL, replayed with a recycled pid's namespace: the pod goes, the
    // node's eth0 and the other pod stay.
    p.run(
        &node,
        CniCommand::Del,
        &p.env("live-pod", &node_path, "eth0"),
        conf.to_string(),
    )
    .expect_success("DEL of the live pod with the node's namespace");
    let r = AddResult::parse(&res).unwrap();
    let other_r = AddResult::parse(&other_res).unwrap();
    assert_gone(
        &node,
        None,
        "eth0",
        &r,
        ebpf_cni_tests::config::NETWORK,
        "live-pod",
        "DEL",
    );
    assert!(
        ebpf_cni_tests::kernel::link(node.netns(), "eth0")
            .unwrap()
            .is_some(),
        "the DEL deleted the node's eth0"
    );
    ebpf_cni_tests::state::assert_attachment(&node, &other, "eth0", &other_r, None);
    assert_eq!(uplink(), uplink_progs, "the uplink's program changed");
    p.run(&node, CniCommand::Del, &other_env, conf.to_string())
        .expect_success("DEL of the other pod");
    p.run(&node, CniCommand::Del, &env, conf.to_string())
        .expect_success("DEL of the live pod, its own namespace");
    assert_node_clean(&node, "after the last DEL");
}

/// A DEL for a pod's old sandbox arriving after its new sandbox was ADDed (kubelet retries,
/// containerd/cri#948, kubernetes#44100): same pod name and namespace, old container id,
/// the old prevResult. The network has one address per family, so the new sandbox holds
/// the very addresses the old one's prevResult names; it has the old one's host port and
/// limits too. The stale DEL exits 0 and touches nothing of the new sandbox: its addresses,
/// lease, host port, limits and source entries stay (CHECK proves them) and its host port
/// still answers.
#[test]
fn a_stale_del_of_an_old_sandbox_leaves_the_new_one_alone() {
    use ebpf_cni_tests::host_ports::{sa, tag_of, tcp_ask, PodServer};
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let mut conf = p.conf("1.0.0", &node, Stack::Dual);
    conf["ipam"]["ranges"] = json!([
        [{"subnet": "10.10.0.0/24", "rangeStart": "10.10.0.7", "rangeEnd": "10.10.0.7"}],
        [{"subnet": "fd00:10::/64", "rangeStart": "fd00:10::7", "rangeEnd": "fd00:10::7"}]
    ]);
    conf["runtimeConfig"] = json!({
        "portMappings": [{"hostPort": 8084, "containerPort": 80, "protocol": "tcp"}],
        "bandwidth": {"ingressRate": 50_000_000, "ingressBurst": 1_000_000,
                      "egressRate": 50_000_000, "egressBurst": 1_000_000}
    });
    let args = |cid: &str| {
        format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID={cid}")
    };
    let old_pod = node.new_pod().unwrap();
    let old_env = p
        .env("old-sandbox", old_pod.path(), "eth0")
        .with_args(&args("old-sandbox"));
    let old = p
        .run(&node, CniCommand::Add, &old_env, conf.to_string())
        .expect_success("ADD of the old sandbox");
    p.run(&node, CniCommand::Del, &old_env, conf.to_string())
        .expect_success("DEL of the old sandbox");
    old_pod.delete().unwrap();

    let new_pod = node.new_pod().unwrap();
    let new_env = p
        .env("new-sandbox", new_pod.path(), "eth0")
        .with_args(&args("new-sandbox"));
    let new = p
        .run(&node, CniCommand::Add, &new_env, conf.to_string())
        .expect_success("ADD of the new sandbox");
    assert_eq!(
        old["ips"], new["ips"],
        "the new sandbox must hold the old one's addresses"
    );
    let before = node.snapshot(Some(&new_pod));
    let pins_before = node.pinned_files();

    let mut stale = conf.clone();
    stale["prevResult"] = old.clone();
    p.run(&node, CniCommand::Del, &old_env, stale.to_string())
        .expect_success("the stale DEL of the old sandbox");

    assert_eq!(
        node.snapshot(Some(&new_pod)),
        before,
        "the stale DEL changed the node"
    );
    assert_eq!(
        node.pinned_files(),
        pins_before,
        "the stale DEL changed the pins"
    );
    let r = AddResult::parse(&new).unwrap();
    let leases = node.leases(ebpf_cni_tests::config::NETWORK);
    assert_eq!(leases.len(), 2, "{leases:?}");
    assert!(
        leases.iter().all(|l| l.container_id == "new-sandbox"),
        "{leases:?}"
    );
    let mut checked = conf.clone();
    checked["prevResult"] = new.clone();
    p.run(&node, CniCommand::Check, &new_env, checked.to_string())
        .expect_success("CHECK of the new sandbox after the stale DEL");
    let _server = PodServer::start(&new_pod, 80, "new");
    let node_addr = std::net::Ipv4Addr::LOCALHOST;
    assert_eq!(
        tag_of(&tcp_ask(node.netns(), sa(node_addr, 8084)).unwrap()),
        "new",
        "the host port no longer reaches the new sandbox"
    );
    del_leaves_nothing(
        &p,
        &node,
        &new_env,
        &checked,
        Some(&new_pod),
        &r,
        "DEL of the new sandbox",
    );
    assert_node_clean(&node, "after the last DEL");
}

/// CRI-O replays the DELs of the pods it had after a reboot: the namespaces are gone, bpffs
/// came back empty, only the IPAM store kept the leases. A replayed DEL before any ADD
/// exits 0 and releases the dead pod's lease, creating nothing; replayed again after a new
/// pod's ADD it exits 0 and leaves the new pod alone.
#[test]
fn a_del_replayed_after_a_reboot_releases_the_lease_and_nothing_else() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let conf = p.conf("1.0.0", &node, Stack::Dual);
    let boot_file = node.scratch_dir().join("boot_id");
    let boot = |id: &str| std::fs::write(&boot_file, format!("{id}\n")).unwrap();
    let env_of = |cid: &str, pod: &std::path::Path| {
        p.env(cid, pod, "eth0")
            .with_env("EBPF_CNI_BOOT_ID_FILE", &boot_file.to_string_lossy())
    };
    boot("boot-1");
    let dead_pod = node.new_pod().unwrap();
    let dead_path = dead_pod.path().to_path_buf();
    let dead_env = env_of("before-reboot", &dead_path);
    let dead = p
        .run(&node, CniCommand::Add, &dead_env, conf.to_string())
        .expect_success("ADD before the reboot");
    let dead_r = AddResult::parse(&dead).unwrap();

    // The reboot: the namespace and its veth go without a DEL, bpffs is emptied.
    dead_pod.delete().unwrap();
    assert!(
        ebpf_cni_tests::state::eventually(std::time::Duration::from_secs(10), || {
            ebpf_cni_tests::kernel::link(node.netns(), &dead_r.host_ifname)
                .unwrap()
                .is_none()
        }),
        "the dead pod's host veth outlived its namespace"
    );
    fsutil::remove_tree(node.pin_root()).unwrap();
    boot("boot-2");

    let mut replayed = conf.clone();
    replayed["prevResult"] = dead.clone();
    del_leaves_nothing(
        &p,
        &node,
        &dead_env,
        &replayed,
        None,
        &dead_r,
        "the DEL replayed after the reboot",
    );
    assert!(
        !node.pin_root().exists(),
        "the replayed DEL created pins: {:?}",
        node.pinned_files()
    );

    let pod = node.new_pod().unwrap();
    let env = env_of("after-reboot", pod.path());
    let added = p
        .run(&node, CniCommand::Add, &env, conf.to_string())
        .expect_success("ADD after the reboot");
    let before = node.snapshot(Some(&pod));
    p.run(&node, CniCommand::Del, &dead_env, replayed.to_string())
        .expect_success("the DEL replayed again, after a new pod's ADD");
    assert_eq!(
        node.snapshot(Some(&pod)),
        before,
        "the replayed DEL changed the node"
    );
    let mut checked = conf.clone();
    checked["prevResult"] = added.clone();
    p.run(&node, CniCommand::Check, &env, checked.to_string())
        .expect_success("CHECK of the new pod");
    p.run(&node, CniCommand::Del, &env, conf.to_string())
        .expect_success("DEL of the new pod");
    assert_node_clean(&node, "after the last DEL");
}

/// What holds a plugin run at one step of its ADD: the IPAM store's lock (the lease step),
/// the test build's hook before the veth is created (`EBPF_CNI_HOLD_BEFORE_VETH`), or the
/// node lock (the gateway, map and attach steps).
#[derive(Clone, Copy, Debug)]
enum Hold {
    Lease,
    Veth,
    Node,
}

/// The file ADD and DEL serialize one attachment's runs on (one byte per attachment).
const ATTACHMENT_LOCKS: &str = "/run/ebpf-cni/attachments.lock";

/// Lines of `/proc/locks` on the attachment lock file: `(held, waiting)`.
fn attachment_locks() -> (usize, usize) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(ATTACHMENT_LOCKS) else {
        return (0, 0);
    };
    let needle = format!(":{} ", meta.ino());
    let locks = std::fs::read_to_string("/proc/locks").unwrap();
    let ours: Vec<&str> = locks.lines().filter(|l| l.contains(&needle)).collect();
    let waiting = ours.iter().filter(|l| l.contains("->")).count();
    (ours.len() - waiting, waiting)
}

/// containerd retries an ADD that timed out with the same container id and interface while
/// the first still runs (cilium/cilium#7701). Two identical ADDs, the first held at a
/// step (by the lock that step takes, held by the test), the second started while it is
/// held: one veth, one lease per family, one pin set, one host-port entry; the second ADD
/// returns the same result or a clear error (107) and never undoes the first's work; one DEL
/// leaves nothing.
fn duplicate_adds_make_one_attachment(hold: Hold) {
    use ebpf_cni_tests::host_ports::{sa, tag_of, tcp_ask, PodServer};
    use std::os::fd::AsRawFd;
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let mut conf = p.conf("1.0.0", &node, Stack::Dual);
    conf["runtimeConfig"] =
        json!({"portMappings": [{"hostPort": 8085, "containerPort": 80, "protocol": "tcp"}]});
    let pod = node.new_pod().unwrap();
    let cid = format!("dup-{hold:?}").to_lowercase();
    let veth_hold = node.scratch_dir().join("hold-before-veth");
    std::fs::write(&veth_hold, "").unwrap();
    let mut env = p.env(&cid, pod.path(), "eth0");
    if let Hold::Veth = hold {
        env = env.with_env("EBPF_CNI_HOLD_BEFORE_VETH", &veth_hold.to_string_lossy());
    }

    // Warm the node (its programs loaded) so the held ADD reaches the step quickly.
    let warm = node.new_pod().unwrap();
    let warm_env = p.env("warm", warm.path(), "eth0");
    let mut warm_conf = conf.clone();
    warm_conf["runtimeConfig"] = json!({});
    p.run(&node, CniCommand::Add, &warm_env, warm_conf.to_string())
        .expect_success("warm-up ADD");

    let held_path = match hold {
        Hold::Lease => {
            let dir = node.data_dir().join(ebpf_cni_tests::config::NETWORK);
            std::fs::create_dir_all(&dir).unwrap();
            dir.join("lock")
        }
        Hold::Veth => veth_hold.clone(),
        Hold::Node => node.pin_root().parent().unwrap().to_path_buf(),
    };
    let held = std::fs::File::open(&held_path).unwrap();
    // SAFETY: flock on a descriptor this test owns.
    assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX) }, 0);

    let (held_before, _) = attachment_locks();
    let run_add = || {
        let (p, node, env, conf) = (&p, &node, &env, &conf);
        move || p.run(node, CniCommand::Add, env, conf.to_string())
    };
    // Each wait is bounded: without the serialization the runs go on, and the checks
    // below show what the second did to the first.
    let until = |what: &dyn Fn((usize, usize)) -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !what(attachment_locks()) {
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        true
    };
    let (outs, first_locked, second_waited) = std::thread::scope(|s| {
        let first = s.spawn(run_add());
        let first_locked = until(&|(held, _)| held > held_before);
        let second = s.spawn(run_add());
        let second_waited = until(&|(_, waiting)| waiting > 0);
        drop(held);
        (
            [first.join().unwrap(), second.join().unwrap()],
            first_locked,
            second_waited,
        )
    });
    let ok: Vec<&ebpf_cni_tests::PluginOutput> = outs.iter().filter(|o| o.success()).collect();
    assert!(
        !ok.is_empty(),
        "neither ADD succeeded:\n{}\n{}",
        outs[0].describe(),
        outs[1].describe()
    );
    let res = ok[0].json.clone().unwrap();
    for out in &outs {
        if out.success() {
            assert_eq!(out.json.as_ref(), Some(&res), "two different results");
        } else {
            out.expect_error(107, "the duplicate ADD");
        }
    }
    let r = AddResult::parse(&res).unwrap();
    let leases: Vec<_> = node
        .leases(ebpf_cni_tests::config::NETWORK)
        .into_iter()
        .filter(|l| l.container_id == cid)
        .collect();
    assert_eq!(leases.len(), 2, "one lease per family: {leases:?}");
    for ip in &r.ips {
        assert!(
            leases.iter().any(|l| l.ip == ip.addr),
            "{} has no lease: {leases:?}",
            ip.addr
        );
    }
    let veths: Vec<String> = ebpf_cni_tests::kernel::links(node.netns())
        .unwrap()
        .into_iter()
        .map(|l| l.ifname)
        .filter(|n| n.starts_with("ecni"))
        .collect();
    assert_eq!(veths.len(), 2, "the warm pod's and one more: {veths:?}");
    ebpf_cni_tests::state::assert_attachment(&node, &pod, "eth0", &r, None);
    let mut checked = conf.clone();
    checked["prevResult"] = res.clone();
    p.run(&node, CniCommand::Check, &env, checked.to_string())
        .expect_success("CHECK after the duplicate ADDs");
    let _server = PodServer::start(&pod, 80, "dup");
    assert_eq!(
        tag_of(&tcp_ask(node.netns(), sa(std::net::Ipv4Addr::LOCALHOST, 8085)).unwrap()),
        "dup"
    );
    del_leaves_nothing(&p, &node, &env, &checked, Some(&pod), &r, "DEL");
    assert!(
        first_locked && second_waited,
        "the held ADD took its attachment's lock: {first_locked}; the second waited for it: \
         {second_waited}"
    );
    p.run(&node, CniCommand::Del, &warm_env, warm_conf.to_string())
        .expect_success("DEL of the warm pod");
    assert_node_clean(&node, "after the last DEL");
}

#[test]
fn duplicate_adds_held_at_the_lease_make_one_attachment() {
    duplicate_adds_make_one_attachment(Hold::Lease);
}

#[test]
fn duplicate_adds_held_before_the_veth_make_one_attachment() {
    duplicate_adds_make_one_attachment(Hold::Veth);
}

#[test]
fn duplicate_adds_held_at_the_node_lock_make_one_attachment() {
    duplicate_adds_make_one_attachment(Hold::Node);
}

/// One container on two networks: another interface name is a second attachment (its own
/// veth, lease and pins); the same interface name on the second network is refused (107,
/// the name given) without touching the first. Each DEL removes its own attachment only.
#[test]
fn one_container_on_two_networks() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let pod = node.new_pod().unwrap();
    let first = p.conf("1.0.0", &node, Stack::Dual);
    let mut second = first.clone();
    second["name"] = json!("second");
    second["ipam"]["ranges"] = json!([[{"subnet": "10.30.0.0/24"}], [{"subnet": "fd00:30::/64"}]]);
    // A second network routes its own prefixes (the pod's default route is the first's).
    second["ipam"]["routes"] = json!([{"dst": "10.31.0.0/16"}, {"dst": "fd00:31::/64"}]);
    let env0 = p.env("two-nets", pod.path(), "eth0");
    let env1 = p.env("two-nets", pod.path(), "net1");
    let r0 = p
        .run(&node, CniCommand::Add, &env0, first.to_string())
        .expect_success("ADD eth0");
    let r1 = p
        .run(&node, CniCommand::Add, &env1, second.to_string())
        .expect_success("ADD net1");
    let before = node.snapshot(Some(&pod));
    let clash = p.run(&node, CniCommand::Add, &env0, second.to_string());
    let err = clash.expect_error(107, "ADD of eth0 on the second network");
    assert!(err.msg.contains("eth0"), "{}", clash.describe());
    assert_eq!(
        node.snapshot(Some(&pod)),
        before,
        "the refused ADD changed something"
    );
    for (env, conf, res) in [(&env0, &first, &r0), (&env1, &second, &r1)] {
        let mut c = conf.clone();
        c["prevResult"] = res.clone();
        p.run(&node, CniCommand::Check, env, c.to_string())
            .expect_success("CHECK");
    }
    let (a0, a1) = (
        AddResult::parse(&r0).unwrap(),
        AddResult::parse(&r1).unwrap(),
    );
    del_leaves_nothing(&p, &node, &env1, &second, None, &a1, "DEL net1");
    ebpf_cni_tests::state::assert_attachment(&node, &pod, "eth0", &a0, None);
    del_leaves_nothing(&p, &node, &env0, &first, Some(&pod), &a0, "DEL eth0");
    assert_node_clean(&node, "after the last DEL");
}

/// Host ports take only traffic addressed to the node (GHSA-jv3w-x3r3-g6rm: the reference's
/// nftables backend caught DNS to any address). Pod 1 holds host port 53, TCP and UDP, on
/// every node address; pod 2 holds 53 on a `hostIP` that is no address of the node. An
/// outside host owns 8.8.8.8, 9.9.9.9 and that `hostIP`. Queries from a third pod to
/// 8.8.8.8:53 and to the `hostIP`, and queries a host behind the node sends through it to
/// 9.9.9.9:53 and the `hostIP`, reach the outside host, neither pod; the node's own
/// addresses, 127.0.0.2, and a VIP the node gets later (once STATUS converged the node)
/// reach pod 1.
#[test]
fn host_ports_take_only_traffic_addressed_to_the_node() {
    use ebpf_cni_tests::host_ports::{sa, tag_of, tcp_ask, udp_ask, PodServer};
    use std::net::{IpAddr, Ipv4Addr};
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let outside = ExternalHost::attach(node.netns(), "up0", 83).unwrap();
    let behind = ExternalHost::attach(node.netns(), "up1", 84).unwrap();
    let (dns_a, dns_b, foreign) = (
        Ipv4Addr::new(8, 8, 8, 8),
        Ipv4Addr::new(9, 9, 9, 9),
        Ipv4Addr::new(203, 0, 113, 7),
    );
    for a in [dns_a, dns_b, foreign] {
        outside
            .netns()
            .ip_ok(&["addr", "add", &format!("{a}/32"), "dev", "lo"])
            .unwrap();
        node.netns()
            .ip_ok(&[
                "route",
                "add",
                &format!("{a}/32"),
                "via",
                &outside.v4.to_string(),
            ])
            .unwrap();
    }
    let _outside_dns: Vec<PodServer> = [dns_a, dns_b, foreign]
        .into_iter()
        .map(|a| PodServer::start_on(outside.netns(), a.into(), 53, "outside"))
        .collect();

    let conf = p.conf("1.1.0", &node, Stack::V4);
    let add = |name: &str, mappings: serde_json::Value| {
        let pod = node.new_pod().unwrap();
        let mut c = conf.clone();
        c["runtimeConfig"] = json!({ "portMappings": mappings });
        let env = p.env(name, pod.path(), "eth0");
        p.run(&node, CniCommand::Add, &env, c.to_string())
            .expect_success(&format!("ADD of {name}"));
        (pod, env, c)
    };
    let both = |host_ip: Option<Ipv4Addr>| {
        let m = |proto: &str| match host_ip {
            Some(ip) => {
                json!({"hostPort": 53, "containerPort": 53, "protocol": proto, "hostIP": ip.to_string()})
            }
            None => json!({"hostPort": 53, "containerPort": 53, "protocol": proto}),
        };
        json!([m("tcp"), m("udp")])
    };
    let (pod1, env1, conf1) = add("wildcard-53", both(None));
    let (pod2, env2, conf2) = add("foreign-ip-53", both(Some(foreign)));
    let (client, env3, conf3) = add("client", json!([]));
    let _pod1_dns = PodServer::start(&pod1, 53, "pod1");
    let _pod2_dns = PodServer::start(&pod2, 53, "pod2");

    let answers = |from: &ebpf_cni_tests::Netns, to: IpAddr| {
        let tag = |r: anyhow::Result<String>| match r {
            Ok(a) => tag_of(&a).to_owned(),
            Err(e) => format!("error: {e:#}"),
        };
        let target = sa(to, 53);
        (tag(tcp_ask(from, target)), tag(udp_ask(from, target)))
    };
    let mut failures = Vec::new();
    let mut expect = |what: &str, from: &ebpf_cni_tests::Netns, to: IpAddr, want: &str| {
        let (tcp, udp) = answers(from, to);
        if (tcp.as_str(), udp.as_str()) != (want, want) {
            failures.push(format!("{what} {to}:53: TCP {tcp}, UDP {udp}, want {want}"));
        }
    };
    for to in [dns_a, foreign] {
        expect("a pod ->", &client, to.into(), "outside");
    }
    for to in [dns_b, foreign] {
        expect(
            "a host behind the node ->",
            behind.netns(),
            to.into(),
            "outside",
        );
    }
    expect(
        "outside -> the node",
        outside.netns(),
        outside.node_v4.into(),
        "pod1",
    );
    expect(
        "behind -> the node",
        behind.netns(),
        behind.node_v4.into(),
        "pod1",
    );
    expect(
        "the node ->",
        node.netns(),
        Ipv4Addr::new(127, 0, 0, 2).into(),
        "pod1",
    );

    // A VIP the node gets later, once STATUS brought the node in line with its addresses.
    let vip = Ipv4Addr::new(192, 0, 2, 99);
    node.netns()
        .ip_ok(&["addr", "add", &format!("{vip}/32"), "dev", "up0"])
        .unwrap();
    outside
        .netns()
        .ip_ok(&[
            "route",
            "add",
            &format!("{vip}/32"),
            "via",
            &outside.node_v4.to_string(),
        ])
        .unwrap();
    p.run(
        &node,
        CniCommand::Status,
        &ebpf_cni_tests::ContainerEnv::none().with_cni_path(&p.runtime.cni_path_env()),
        conf.to_string(),
    )
    .expect_success("STATUS");
    expect(
        "outside -> a later VIP",
        outside.netns(),
        vip.into(),
        "pod1",
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    for (env, c) in [(&env1, &conf1), (&env2, &conf2), (&env3, &conf3)] {
        p.run(&node, CniCommand::Del, env, c.to_string())
            .expect_success("DEL");
    }
    assert_node_clean(&node, "after the last DEL");
}

/// A TCP session that stays open: each `exchange` sends a line and reads its echo.
struct Session {
    stream: std::net::TcpStream,
}

impl Session {
    fn open(from: &ebpf_cni_tests::Netns, to: std::net::SocketAddr) -> Self {
        let stream = from
            .run_in(|| std::net::TcpStream::connect_timeout(&to, std::time::Duration::from_secs(5)))
            .unwrap()
            .unwrap_or_else(|e| panic!("connecting to {to}: {e}"));
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(3)))
            .unwrap();
        Self { stream }
    }

    fn exchange(&mut self, what: &str) -> Result<(), String> {
        use std::io::{Read, Write};
        let line = format!("{what}\n");
        self.stream
            .write_all(line.as_bytes())
            .map_err(|e| format!("{what}: send: {e}"))?;
        let mut buf = vec![0u8; line.len()];
        self.stream
            .read_exact(&mut buf)
            .map_err(|e| format!("{what}: echo: {e}"))?;
        (buf == line.as_bytes())
            .then_some(())
            .ok_or_else(|| format!("{what}: echo differs"))
    }
}

/// An echo server on `addr` in `ns` that keeps each connection open.
fn echo_server(ns: &ebpf_cni_tests::Netns, addr: std::net::SocketAddr) {
    let listener = ns
        .run_in(|| std::net::TcpListener::bind(addr))
        .unwrap()
        .unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming().map_while(Result::ok) {
            std::thread::spawn(move || {
                let mut conn = conn;
                let mut copy = conn.try_clone().unwrap();
                let _ = std::io::copy(&mut conn, &mut copy);
            });
        }
    });
}

/// The agent and the conflist on a bad day. The agent is SIGKILLed while it converges the
/// node (an address just added), then restarted; the conflist is deleted while the pod runs.
/// The node's own long-lived TCP session over the uplink (an SSH session's stand-in) and
/// the pod's established flow to the outside never stop; the pod's DEL, sent with the
/// config the runtime cached, leaves nothing.
#[test]
fn the_agent_killed_and_the_conflist_deleted_stop_no_traffic() {
    use std::net::{IpAddr, SocketAddr};
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "up0", 85).unwrap();
    let server = SocketAddr::new(IpAddr::V4(ext.v4), 2222);
    echo_server(ext.netns(), server);

    let mut conf = p.conf("1.1.0", &node, Stack::V4);
    conf["runtimeConfig"] =
        json!({"portMappings": [{"hostPort": 8087, "containerPort": 80, "protocol": "tcp"}]});
    let conflist = node.scratch_dir().join("10-ebpf-cni.conflist");
    let list = ebpf_cni_tests::NetConfList::single(&conf);
    std::fs::write(
        &conflist,
        list.exec_config(0, &Default::default(), None).to_string(),
    )
    .unwrap();
    let pod = node.new_pod().unwrap();
    let env = p.env("bad-day-pod", pod.path(), "eth0");
    let res = p
        .run(&node, CniCommand::Add, &env, conf.to_string())
        .expect_success("ADD");
    let r = AddResult::parse(&res).unwrap();

    let mut node_session = Session::open(node.netns(), server);
    let mut pod_session = Session::open(&pod, server);
    let mut check = |when: &str| {
        for (who, s) in [
            ("the node's session", &mut node_session),
            ("the pod's flow", &mut pod_session),
        ] {
            if let Err(e) = s.exchange(when) {
                panic!("{who} stopped {when}: {e}");
            }
        }
    };
    check("before the agent");

    let agent = ebpf_cni_tests::agent::AgentProcess::start(
        &p.bin,
        node.netns().path(),
        Some(&conflist),
        None,
    )
    .unwrap();
    node.netns()
        .ip_ok(&["addr", "add", "192.168.85.100/32", "dev", "up0"])
        .unwrap();
    // SIGKILL as it converges (dropping the process kills it).
    drop(agent);
    check("after the agent was killed mid-convergence");

    let agent = ebpf_cni_tests::agent::AgentProcess::start(
        &p.bin,
        node.netns().path(),
        Some(&conflist),
        None,
    )
    .unwrap();
    // The killed agent may have converged the node before it died; either way the host
    // port answers on the new address once the restarted agent ran.
    let _web = ebpf_cni_tests::host_ports::PodServer::start(&pod, 80, "pod");
    ext.netns()
        .ip_ok(&[
            "route",
            "add",
            "192.168.85.100/32",
            "via",
            &ext.node_v4.to_string(),
        ])
        .unwrap();
    let vip = ebpf_cni_tests::host_ports::sa(std::net::Ipv4Addr::new(192, 168, 85, 100), 8087);
    assert!(
        ebpf_cni_tests::state::eventually(std::time::Duration::from_secs(10), || {
            ebpf_cni_tests::host_ports::tcp_ask(ext.netns(), vip)
                .is_ok_and(|a| ebpf_cni_tests::host_ports::tag_of(&a) == "pod")
        }),
        "the restarted agent did not bring the node in line with its new address"
    );
    check("after the agent's restart converged the node");
    drop(agent);

    std::fs::remove_file(&conflist).unwrap();
    check("after the conflist was deleted");
    del_leaves_nothing(
        &p,
        &node,
        &env,
        &conf,
        Some(&pod),
        &r,
        "DEL with the runtime's cached config",
    );
    assert_node_clean(&node, "after DEL");
    node_session
        .exchange("after the pod's DEL")
        .expect("the node's session after the pod's DEL");
}

/// The node's pin tree removed by hand while pods run (calico#6739: programs left attached
/// without their state dropped a node's traffic). The pods' netlink filters (and, on
/// kernels without TCX, the uplink's) outlive their pins; the next STATUS finds them and
/// removes them, so nothing of ebpf-cni's runs on maps no pin names. The pods keep their
/// routes: their traffic to the outside goes on through the stack. A new pod is added with
/// fresh programs; the old pod's DEL and the new pod's leave nothing.
#[test]
fn programs_left_attached_without_their_pins_are_removed() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "up0", 86).unwrap();
    let conf = p.conf("1.1.0", &node, Stack::V4);
    let old_pod = node.new_pod().unwrap();
    let old_env = p.env("pinless-old", old_pod.path(), "eth0");
    let old = p
        .run(&node, CniCommand::Add, &old_env, conf.to_string())
        .expect_success("ADD of the old pod");
    let old_r = AddResult::parse(&old).unwrap();
    let ours = |dev: &str| -> Vec<String> {
        ebpf_cni_tests::bpf::attached_programs(node.netns(), dev)
            .unwrap()
            .into_iter()
            .map(|p| p.name)
            .filter(|n| n.starts_with("ecni_"))
            .collect()
    };
    assert!(
        !ours(&old_r.host_ifname).is_empty(),
        "the pod's veth has no programs"
    );

    fsutil::remove_tree(node.pin_root()).unwrap();
    let report = dp::inspect(&p.bin, &node).unwrap();
    let unpinned: Vec<(String, String)> = report["unpinned"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["device"].as_str().unwrap().to_owned(),
                f["program"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for prog in ["ecni_from_pod", "ecni_to_pod"] {
        assert!(
            unpinned.contains(&(old_r.host_ifname.clone(), prog.to_owned())),
            "inspect does not list {prog} on {} as attached without pins: {unpinned:?}",
            old_r.host_ifname
        );
    }
    let status = p.run(
        &node,
        CniCommand::Status,
        &ebpf_cni_tests::ContainerEnv::none().with_cni_path(&p.runtime.cni_path_env()),
        conf.to_string(),
    );
    status.expect_success("STATUS after the pins were removed");
    for dev in [old_r.host_ifname.as_str(), "up0"] {
        assert!(
            ebpf_cni_tests::state::eventually(ebpf_cni_tests::state::RELEASE_BOUND, || ours(dev)
                .is_empty()),
            "{dev} still runs {:?} without pins\n{}",
            ours(dev),
            status.describe()
        );
    }
    let after = dp::inspect(&p.bin, &node).unwrap();
    assert_eq!(
        after["unpinned"],
        json!([]),
        "inspect after STATUS: {after}"
    );
    let e = ebpf_cni_tests::net::tcp_echo(&old_pod, ext.netns(), ext.v4.into(), 0)
        .expect("the old pod reaches the outside through the stack");
    assert_eq!(e.client_addr.ip(), old_r.ip4().unwrap().addr);

    let new_pod = node.new_pod().unwrap();
    let new_env = p.env("pinless-new", new_pod.path(), "eth0");
    let new = p
        .run(&node, CniCommand::Add, &new_env, conf.to_string())
        .expect_success("ADD after the pins were removed");
    let new_r = AddResult::parse(&new).unwrap();
    let mut checked = conf.clone();
    checked["prevResult"] = new.clone();
    p.run(&node, CniCommand::Check, &new_env, checked.to_string())
        .expect_success("CHECK of the new pod");
    del_leaves_nothing(
        &p,
        &node,
        &old_env,
        &conf,
        Some(&old_pod),
        &old_r,
        "DEL of the old pod",
    );
    del_leaves_nothing(
        &p,
        &node,
        &new_env,
        &conf,
        Some(&new_pod),
        &new_r,
        "DEL of the new pod",
    );
    assert_node_clean(&node, "after the last DEL");
}

/// glibc sends a name's A and AAAA queries at once from one UDP socket (kubernetes#56903:
/// under conntrack, the second datagram of a new flow lost the race to create its entry and
/// was dropped, a 5 s stall). A masquerading pod sends two datagrams from one connected
/// socket from two threads at once, 10,000 times, each a new flow (a new source port): both
/// answers arrive every time. (On this host the two threads run on two CPUs; the guests
/// have one.)
#[test]
fn parallel_datagrams_of_a_new_masqueraded_flow_both_get_answers() {
    use std::net::{SocketAddr, UdpSocket};
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "up0", 87).unwrap();
    let mut conf = p.conf("1.0.0", &node, Stack::V4);
    conf["ipMasq"] = json!(true);
    // Every try is a new flow to one destination, which holds its masquerade port for the
    // UDP lifetime: the default range (4,536 ports) would run out before 10,000 tries, a
    // case of its own (counted as `exhausted`), not this one.
    conf["ipMasqPortRange"] = json!("20000-65535");
    let pod = node.new_pod().unwrap();
    let env = p.env("parallel-dns", pod.path(), "eth0");
    p.run(&node, CniCommand::Add, &env, conf.to_string())
        .expect_success("ADD");
    let server_addr = SocketAddr::new(ext.v4.into(), 5353);
    let server = ext
        .netns()
        .run_in(|| UdpSocket::bind(server_addr))
        .unwrap()
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stop.clone();
    server
        .set_read_timeout(Some(std::time::Duration::from_millis(100)))
        .unwrap();
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok((n, peer)) = server.recv_from(&mut buf) {
                let _ = server.send_to(&buf[..n], peer);
            }
        }
    });
    const TRIES: usize = 10_000;
    let mut lost = Vec::new();
    for i in 0..TRIES {
        let sock = pod
            .run_in(|| {
                let s = UdpSocket::bind("0.0.0.0:0")?;
                s.connect(server_addr)?;
                Ok::<_, std::io::Error>(s)
            })
            .unwrap()
            .unwrap();
        sock.set_read_timeout(Some(std::time::Duration::from_millis(500)))
            .unwrap();
        let barrier = std::sync::Barrier::new(2);
        std::thread::scope(|sc| {
            for q in [b'A', b'B'] {
                let (sock, barrier) = (&sock, &barrier);
                sc.spawn(move || {
                    barrier.wait();
                    let _ = sock.send(&[q]);
                });
            }
        });
        let mut got = Vec::new();
        let mut buf = [0u8; 8];
        while got.len() < 2 {
            match sock.recv(&mut buf) {
                Ok(n) if n > 0 => got.push(buf[0]),
                _ => break,
            }
        }
        if got.len() < 2 {
            lost.push(format!(
                "try {i}: answers {:?}",
                String::from_utf8_lossy(&got)
            ));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    echo.join().unwrap();
    let report = dp::inspect(&p.bin, &node).unwrap();
    assert!(
        lost.is_empty(),
        "{} of {TRIES} pairs lost an answer ({:?}…); masquerade: {}",
        lost.len(),
        &lost[..lost.len().min(5)],
        report["masquerade"]
    );
    p.run(&node, CniCommand::Del, &env, conf.to_string())
        .expect_success("DEL");
    assert_node_clean(&node, "after DEL");
}

/// Immediate address reuse (cilium/cilium#29571): pod A, masquerading, with a host port and
/// a masqueraded UDP flow to an outside server, is deleted, and pod B gets A's address at
/// once (a new MAC) while an outside client keeps asking for it. Within a second B answers
/// on its address; the outside server's next datagram in A's flow (to the node's masquerade
/// port) does not reach B, though B listens on the port A sent from; and A's host port does
/// not lead to B.
#[test]
fn a_pod_given_a_deleted_pods_address_gets_nothing_of_its_flows() {
    use ebpf_cni_tests::host_ports::{sa, tag_of, tcp_ask, udp_ask, PodServer};
    use std::net::{SocketAddr, UdpSocket};
    use std::time::{Duration, Instant};
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "up0", 88).unwrap();
    let mut conf = p.conf("1.0.0", &node, Stack::V4);
    conf["ipMasq"] = json!(true);
    let mut with_port = conf.clone();
    with_port["runtimeConfig"] =
        json!({"portMappings": [{"hostPort": 8088, "containerPort": 80, "protocol": "tcp"}]});
    let addr = "10.10.0.50";
    let pod_a = node.new_pod().unwrap();
    let env_a = p
        .env("reuse-a", pod_a.path(), "eth0")
        .with_args(&format!("IgnoreUnknown=1;IP={addr}"));
    p.run(&node, CniCommand::Add, &env_a, with_port.to_string())
        .expect_success("ADD of pod A");
    let _a_web = PodServer::start(&pod_a, 80, "A");
    let target = sa(ext.node_v4, 8088);
    assert_eq!(tag_of(&tcp_ask(ext.netns(), target).unwrap()), "A");

    // A's masqueraded UDP flow: from its port 40000 to the outside server.
    let server_addr = SocketAddr::new(ext.v4.into(), 7001);
    let server = ext
        .netns()
        .run_in(|| UdpSocket::bind(server_addr))
        .unwrap()
        .unwrap();
    server
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let a_sock = pod_a
        .run_in(|| UdpSocket::bind("0.0.0.0:40000"))
        .unwrap()
        .unwrap();
    a_sock.send_to(b"from A", server_addr).unwrap();
    let mut buf = [0u8; 64];
    let (_, a_flow) = server.recv_from(&mut buf).unwrap();
    assert_eq!(
        a_flow.ip(),
        std::net::IpAddr::from(ext.node_v4),
        "A's flow is masqueraded"
    );

    // A goes; B takes its address at once.
    drop(_a_web);
    drop(a_sock);
    p.run(&node, CniCommand::Del, &env_a, with_port.to_string())
        .expect_success("DEL of pod A");
    let pod_b = node.new_pod().unwrap();
    let env_b = p
        .env("reuse-b", pod_b.path(), "eth0")
        .with_args(&format!("IgnoreUnknown=1;IP={addr}"));
    let res_b = p
        .run(&node, CniCommand::Add, &env_b, conf.to_string())
        .expect_success("ADD of pod B");
    let t = Instant::now();
    let r_b = AddResult::parse(&res_b).unwrap();
    assert_eq!(r_b.ip4().unwrap().addr.to_string(), addr);
    let b_sock = pod_b
        .run_in(|| UdpSocket::bind("0.0.0.0:40000"))
        .unwrap()
        .unwrap();
    b_sock
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let _b_servers = PodServer::start(&pod_b, 9000, "B");

    let b_target = sa(r_b.ip4().unwrap().addr, 9000);
    let answered = loop {
        let (tcp, udp) = (
            tcp_ask(ext.netns(), b_target),
            udp_ask(ext.netns(), b_target),
        );
        if tcp.as_deref().is_ok_and(|a| tag_of(a) == "B")
            && udp.as_deref().is_ok_and(|a| tag_of(a) == "B")
        {
            break t.elapsed();
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "B does not answer: TCP {tcp:?}, UDP {udp:?}"
        );
    };
    assert!(
        answered < Duration::from_secs(1),
        "B answered only after {answered:?}"
    );

    server.send_to(b"to A's flow", a_flow).unwrap();
    match b_sock.recv_from(&mut buf) {
        Ok((n, from)) => panic!(
            "B got {:?} from {from}, meant for A's masqueraded flow",
            String::from_utf8_lossy(&buf[..n])
        ),
        Err(e) => assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "{e}"
        ),
    }
    assert!(
        tcp_ask(ext.netns(), target).is_err(),
        "A's host port still leads somewhere after A's DEL"
    );
    del_leaves_nothing(&p, &node, &env_b, &conf, Some(&pod_b), &r_b, "DEL of pod B");
    assert_node_clean(&node, "after the last DEL");
}
