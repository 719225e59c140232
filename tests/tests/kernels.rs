//! What each kernel gets (issue 14, docs/kernels.md "Kernel requirements"): below the minimum (5.10)
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
    let (sockets, degraded) = mode("host ports from the node's own processes");
    assert_eq!(degraded, !bpf::kernel_has_so_netns_cookie(), "{sockets}");
    let (pacing, degraded) = mode("egress TCP pacing");
    assert_eq!(degraded, !bpf::kernel_paces_tcp(), "{pacing}");

    let out = p.run(&node, CniCommand::Status, &status_env(&p), conf.to_string());
    out.expect_success("STATUS");
    for (part, degraded) in [
        (
            "host ports from the node's own processes",
            !bpf::kernel_has_so_netns_cookie(),
        ),
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
