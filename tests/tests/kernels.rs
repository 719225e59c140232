//! What each kernel gets (docs/kernels.md "Kernel requirements"): below the minimum (5.10)
//! ADD and STATUS fail naming what the kernel lacks, never with a verifier dump; a config
//! that forces TCX is refused on a kernel without it; `inspect` and STATUS say how each
//! part runs on this kernel.
//!
//! Kernels the matrix cannot boot (older than 5.10) are shown through the plugin's test
//! hook `EBPF_CNI_TEST_KERNEL_RELEASE`, which replaces `uname -r` in its kernel decisions;
//! the real kernels run these tests in `cargo xtask vmtest`.

use ebpf_cni_tests::config::Stack;
use ebpf_cni_tests::dataplane as dp;
use ebpf_cni_tests::{
    bpf, require_root, unique_container_id, CniCommand, ContainerEnv, NetConfList, Node,
    PluginUnderTest,
};
use serde_json::{json, Value};

const RELEASE_ENV: &str = "EBPF_CNI_TEST_KERNEL_RELEASE";

fn conf(p: &PluginUnderTest, node: &Node) -> Value {
    p.conf("1.1.0", node, Stack::Dual)
}

fn status_env(p: &PluginUnderTest) -> ContainerEnv {
    ContainerEnv::none().with_cni_path(&p.runtime.cni_path_env())
}

/// Spec 1.1 STATUS code 50 and ADD's error on a kernel below 5.10: both name the minimum
/// and the helpers it lacks, and ADD leaves the node as it was (no veth, lease or pin).
#[test]
fn below_the_minimum_add_and_status_fail_naming_what_is_missing() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let conf = conf(&p, &node);
    let pod = node.new_pod().unwrap();
    let before = node.snapshot(Some(&pod));

    let status = p
        .run(
            &node,
            CniCommand::Status,
            &status_env(&p).with_env(RELEASE_ENV, "5.4.0-150-generic"),
            conf.to_string(),
        )
        .expect_error(50, "STATUS below the minimum");
    let add_env = p
        .env(&unique_container_id(), pod.path(), "eth0")
        .with_env(RELEASE_ENV, "5.4.0-150-generic");
    let add = p
        .run(&node, CniCommand::Add, &add_env, conf.to_string())
        .expect_error(101, "ADD below the minimum");
    for (what, err) in [("STATUS", &status), ("ADD", &add)] {
        let text = err.text_lower();
        for word in ["5.4.0-150-generic", "5.10", "bpf_redirect_peer"] {
            assert!(
                text.contains(word),
                "{what} does not name {word:?}: {err:?}"
            );
        }
        assert!(
            !text.contains("verifier"),
            "{what} shows the verifier: {err:?}"
        );
    }
    assert_eq!(
        node.snapshot(Some(&pod)),
        before,
        "the failed ADD changed the node"
    );
    assert!(node.pinned_files().is_empty(), "{:?}", node.pinned_files());
}

/// `tcAttachMode: "tcx"` on a kernel without TCX (here a 6.1 release; on the matrix's 5.10
/// and 6.1 for real, see tests/ebpf.rs): STATUS 50 and ADD 7, each naming the mode, TCX
/// and 6.6; nothing is made. `auto` on the same kernel works with filters everywhere.
#[test]
fn forced_tcx_is_refused_where_the_kernel_has_none() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let mut tcx = conf(&p, &node);
    tcx["tcAttachMode"] = json!("tcx");
    let pod = node.new_pod().unwrap();
    let before = node.snapshot(Some(&pod));
    let status = p
        .run(
            &node,
            CniCommand::Status,
            &status_env(&p).with_env(RELEASE_ENV, "6.1.0-56-amd64"),
            tcx.to_string(),
        )
        .expect_error(50, "STATUS with tcx forced");
    let cid = unique_container_id();
    let add = p
        .run(
            &node,
            CniCommand::Add,
            &p.env(&cid, pod.path(), "eth0")
                .with_env(RELEASE_ENV, "6.1.0-56-amd64"),
            tcx.to_string(),
        )
        .expect_error(7, "ADD with tcx forced");
    for (what, err) in [("STATUS", &status), ("ADD", &add)] {
        let text = err.text_lower();
        for word in ["tcattachmode", "tcx", "6.6", "6.1.0-56-amd64"] {
            assert!(
                text.contains(word),
                "{what} does not name {word:?}: {err:?}"
            );
        }
    }
    assert_eq!(
        node.snapshot(Some(&pod)),
        before,
        "the refused ADD changed the node"
    );

    // auto on the same (pretended) kernel: filters on the node device too.
    let ext = ebpf_cni_tests::external::ExternalHost::attach(node.netns(), "up0", 79).unwrap();
    let auto = conf(&p, &node);
    let env = p
        .env(&cid, pod.path(), "eth0")
        .with_env(RELEASE_ENV, "6.1.0-56-amd64");
    p.run(&node, CniCommand::Add, &env, auto.to_string())
        .expect_success("ADD in auto mode on 6.1");
    let dev = bpf::attached_programs(node.netns(), "up0").unwrap();
    assert!(
        dev.len() == 1
            && dev[0].name == dp::PROG_FROM_DEV
            && dev[0].mechanism == bpf::Mechanism::NetlinkTc,
        "6.1 gets a filter on the node device: {dev:?}"
    );
    drop(ext);
    p.run(&node, CniCommand::Del, &env, auto.to_string())
        .expect_success("DEL");
    assert!(node.pinned_files().is_empty(), "{:?}", node.pinned_files());
}

/// `inspect` names the kernel and how each part runs on it, as the harness finds the
/// kernel by its own probes; STATUS succeeds and warns (stderr) about each degraded part
/// only.
#[test]
fn inspect_and_status_say_how_each_part_runs() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let conf = conf(&p, &node);
    let list = NetConfList::single(&conf);
    let pod = node.new_pod().unwrap();
    let att = ebpf_cni_tests::Attachment::new(&unique_container_id(), pod.path(), "eth0");
    p.runtime.add(&node, &list, &att).unwrap();

    let report = dp::inspect(&p.bin, &node).unwrap();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(report["kernel"], json!(release.trim()), "{report:#}");
    let modes = report["modes"].as_array().expect("modes");
    let mode = |part: &str| -> (String, bool) {
        let m = modes
            .iter()
            .find(|m| m["part"] == part)
            .unwrap_or_else(|| panic!("no mode of {part:?}: {report:#}"));
        (
            m["mode"].as_str().unwrap().to_owned(),
            m["degraded"].as_bool().unwrap(),
        )
    };
    let (attach, _) = mode("tc attach");
    assert_eq!(attach.starts_with("TCX"), bpf::kernel_has_tcx(), "{attach}");
    // Served on every kernel: before 5.14 the node's namespace is learned by a probe.
    let (sockets, degraded) = mode("host ports from the node's own processes");
    assert!(!degraded, "{sockets}");
    assert_eq!(
        sockets.contains("SO_NETNS_COOKIE before 5.14"),
        !bpf::kernel_has_so_netns_cookie(),
        "{sockets}"
    );
    let (pacing, degraded) = mode("egress TCP pacing");
    assert_eq!(degraded, !bpf::kernel_paces_tcp(), "{pacing}");

    let out = p.run(&node, CniCommand::Status, &status_env(&p), conf.to_string());
    out.expect_success("STATUS");
    for (part, degraded) in [
        ("host ports from the node's own processes", false),
        ("egress TCP pacing", !bpf::kernel_paces_tcp()),
    ] {
        assert_eq!(
            out.stderr.contains(part),
            degraded,
            "STATUS's warnings about {part:?}: {}",
            out.stderr
        );
    }
    p.runtime.del(&node, &list, &att, None).unwrap();
}

/// A node whose kernel has no `SO_NETNS_COOKIE` (a 5.10 release through the test hook here;
/// the 5.10 guest runs the port-mapping tests for real) learns its namespace's cookie from
/// a probe through `ecni_connect4`: the cookie the node config holds is exactly the one
/// `SO_NETNS_COOKIE` gives in the node's namespace, the node's own `127.0.0.1:<hostPort>`
/// reaches the pod, and another namespace's `127.0.0.1:<hostPort>` stays its own.
#[test]
fn without_so_netns_cookie_the_node_learns_its_cookie_from_a_probe() {
    use ebpf_cni_tests::host_ports::{sa, tag_of, tcp_ask, PodServer};
    use std::net::Ipv4Addr;
    require_root();
    if !bpf::kernel_has_so_netns_cookie() {
        // The guests before 5.14 prove the same through the port-mapping tests; here the
        // cookie could not be compared.
        return;
    }
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let mut conf = conf(&p, &node);
    conf["runtimeConfig"] = json!({"portMappings": [{"hostPort": 8083, "containerPort": 80}]});
    let pod = node.new_pod().unwrap();
    let _server = PodServer::start(&pod, 80, "pod");
    let env = p
        .env(&unique_container_id(), pod.path(), "eth0")
        .with_env(RELEASE_ENV, "5.10.0-32-amd64")
        .with_env("EBPF_CNI_LOG", "info");
    let add = p.run(&node, CniCommand::Add, &env, conf.to_string());
    add.expect_success("ADD on a pretended 5.10");
    assert!(
        add.stderr.contains("through ecni_connect4"),
        "ADD logs the cookie it learned: {}",
        add.stderr
    );

    let config = node
        .pin_root()
        .join(ebpf_cni_maps::pin::MAPS_DIR)
        .join(ebpf_cni_maps::CONFIG_MAP);
    let dump = std::process::Command::new("bpftool")
        .args(["-j", "map", "dump", "pinned"])
        .arg(&config)
        .output()
        .unwrap();
    let dump: Value = serde_json::from_slice(&dump.stdout).unwrap();
    let bytes: Vec<u8> = dump[0]["value"]
        .as_array()
        .unwrap_or_else(|| panic!("{dump:#}"))
        .iter()
        .map(|b| u8::from_str_radix(b.as_str().unwrap().trim_start_matches("0x"), 16).unwrap())
        .collect();
    let learned = u64::from_ne_bytes(bytes[..8].try_into().unwrap());
    let actual = node.netns().run_in(netns_cookie).unwrap();
    assert_eq!(
        learned, actual,
        "the node config's cookie is the node namespace's (SO_NETNS_COOKIE)"
    );

    assert_eq!(
        tag_of(&tcp_ask(node.netns(), sa(Ipv4Addr::LOCALHOST, 8083)).unwrap()),
        "pod",
        "the node's own 127.0.0.1:8083 reaches the pod"
    );
    let other = node.new_pod().unwrap();
    let _local = PodServer::start(&other, 8083, "local");
    assert_eq!(
        tag_of(&tcp_ask(&other, sa(Ipv4Addr::LOCALHOST, 8083)).unwrap()),
        "local",
        "another namespace's 127.0.0.1:8083 stays its own"
    );
    p.run(&node, CniCommand::Del, &env, conf.to_string())
        .expect_success("DEL");
}

/// `SO_NETNS_COOKIE` of the calling thread's namespace.
fn netns_cookie() -> u64 {
    use std::os::fd::AsRawFd;
    const SO_NETNS_COOKIE: libc::c_int = 71;
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    let mut cookie = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt into a u64 of the length passed, on a socket we own.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    cookie
}
