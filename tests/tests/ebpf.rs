//! ebpf-cni's dataplane attachment: after ADD the host veth carries TCX program(s) whose
//! links are pinned under `/sys/fs/bpf/ebpf-cni/v1/netns-<node inode>/attachments/
//! <network>/<containerid>/<ifname>/` (so they outlive the plugin process, which has exited
//! by the time we look); DEL removes them for that attachment only.

use std::collections::BTreeSet;

use ebpf_cni_tests::bpf::{self, Mechanism, PinnedObject};
use ebpf_cni_tests::config::{Stack, NETWORK};
use ebpf_cni_tests::{
    fsutil, require_root, unique_container_id, AddResult, Attachment, NetConfList, Netns, Node,
    PluginUnderTest, ResultExpectation,
};

/// Problems with one attachment's programs and pins.
fn attachment_bpf_problems(node: &Node, cid: &str, r: &AddResult) -> Vec<String> {
    let mut p = Vec::new();
    let progs = match bpf::attached_programs(node.netns(), &r.host_ifname) {
        Ok(progs) => progs,
        Err(e) => return vec![format!("reading programs on {}: {e:#}", r.host_ifname)],
    };
    if progs.is_empty() {
        p.push(format!(
            "no eBPF program attached to host veth {}",
            r.host_ifname
        ));
    }
    for prog in &progs {
        if prog.mechanism != Mechanism::Tcx {
            p.push(format!("{prog:?} is attached by netlink tc, not TCX"));
        }
    }

    let dir = node.attachment_pin_dir(NETWORK, cid, "eth0");
    let files = fsutil::list_files(&dir).unwrap_or_default();
    if files.is_empty() {
        p.push(format!("nothing pinned under {}", dir.display()));
    }
    let ifindex = bpf::ifindex_in(node.netns(), &r.host_ifname).unwrap_or(0);
    let mut pinned_links = BTreeSet::new();
    for f in &files {
        match bpf::pinned_object(&dir.join(f)) {
            Ok(PinnedObject::Link(info)) => {
                if info.tcx.map(|t| t.0) != Some(ifindex) {
                    p.push(format!(
                        "pinned link {} is not a TCX link on {} ({info:?})",
                        f.display(),
                        r.host_ifname
                    ));
                }
                pinned_links.insert(info.id);
            }
            Ok(_) => {}
            Err(e) => p.push(format!("pin {} unreadable: {e:#}", f.display())),
        }
    }
    // Every TCX link holding a program on the veth is one the plugin pinned: otherwise it
    // would have been detached when the plugin exited, or cannot be found by DEL.
    for prog in &progs {
        match prog.link_id {
            Some(id) if pinned_links.contains(&id) => {}
            Some(id) => p.push(format!(
                "TCX link {id} ({}) on {} is not pinned under {}",
                prog.name,
                r.host_ifname,
                dir.display()
            )),
            None => p.push(format!(
                "program {} is attached without a link (cannot be pinned)",
                prog.name
            )),
        }
    }
    p
}

fn add(
    p: &PluginUnderTest,
    node: &Node,
    list: &NetConfList,
    pod: &Netns,
) -> (Attachment, serde_json::Value, AddResult) {
    let att = Attachment::new(&unique_container_id(), pod.path(), "eth0");
    let res = p
        .runtime
        .add(node, list, &att)
        .unwrap_or_else(|e| panic!("ADD: {e}"));
    let parsed =
        ResultExpectation::standard("1.0.0", "eth0", &pod.path().to_string_lossy(), Stack::Dual)
            .ebpf_cni_host_names()
            .assert_valid(&res);
    (att, res, parsed)
}

/// Programs are attached (TCX) and pinned per attachment after ADD; DEL of one pod removes
/// its pins and leaves the other pod's programs in place; after the last DEL no attachment
/// pins remain for the node.
#[test]
fn programs_attached_and_pinned_per_attachment() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let (pod_a, pod_b) = (node.new_pod().unwrap(), node.new_pod().unwrap());
    let list = NetConfList::single(&p.conf("1.0.0", &node, Stack::Dual));
    let (att_a, res_a, a) = add(&p, &node, &list, &pod_a);
    let (att_b, res_b, b) = add(&p, &node, &list, &pod_b);

    for (att, r) in [(&att_a, &a), (&att_b, &b)] {
        let problems = attachment_bpf_problems(&node, &att.container_id, r);
        assert!(
            problems.is_empty(),
            "eBPF state after ADD:\n  - {}",
            problems.join("\n  - ")
        );
    }
    let prog_ids_b: BTreeSet<u32> = bpf::attached_programs(node.netns(), &b.host_ifname)
        .unwrap()
        .iter()
        .map(|p| p.prog_id)
        .collect();

    p.runtime
        .del(&node, &list, &att_a, Some(&res_a))
        .unwrap_or_else(|e| panic!("DEL a: {e}"));
    let dir_a = node.attachment_pin_dir(NETWORK, &att_a.container_id, "eth0");
    assert!(
        !dir_a.exists(),
        "DEL left pins: {:?}",
        fsutil::list_files(&dir_a)
    );
    assert!(
        !node
            .pin_root()
            .join("attachments")
            .join(NETWORK)
            .join(&att_a.container_id)
            .exists(),
        "DEL left the container's pin directory"
    );
    let problems = attachment_bpf_problems(&node, &att_b.container_id, &b);
    assert!(
        problems.is_empty(),
        "DEL of pod a disturbed pod b:\n  - {}",
        problems.join("\n  - ")
    );
    let still: BTreeSet<u32> = bpf::attached_programs(node.netns(), &b.host_ifname)
        .unwrap()
        .iter()
        .map(|p| p.prog_id)
        .collect();
    assert_eq!(
        still, prog_ids_b,
        "pod b's programs changed when pod a was deleted"
    );

    p.runtime
        .del(&node, &list, &att_b, Some(&res_b))
        .unwrap_or_else(|e| panic!("DEL b: {e}"));
    let left = fsutil::list_files(&node.pin_root().join("attachments")).unwrap();
    assert!(
        left.is_empty(),
        "attachment pins left after the last DEL: {left:?}"
    );
}

/// A DEL that cannot enter the pod (`CNI_NETNS=""`, no prevResult) still finds and removes
/// the attachment's pins: they are located from the attachment's identity alone.
#[test]
fn late_del_removes_pins() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let pod = node.new_pod().unwrap();
    let list = NetConfList::single(&p.conf("1.0.0", &node, Stack::Dual));
    let (att, _res, r) = add(&p, &node, &list, &pod);
    let problems = attachment_bpf_problems(&node, &att.container_id, &r);
    assert!(
        problems.is_empty(),
        "eBPF state after ADD:\n  - {}",
        problems.join("\n  - ")
    );

    let mut late = att.clone();
    late.netns = String::new();
    p.runtime
        .del(&node, &list, &late, None)
        .unwrap_or_else(|e| panic!("late DEL: {e}"));
    let dir = node.attachment_pin_dir(NETWORK, &att.container_id, "eth0");
    assert!(
        !dir.exists(),
        "late DEL left pins: {:?}",
        fsutil::list_files(&dir)
    );
    assert!(ebpf_cni_tests::kernel::link(node.netns(), &r.host_ifname)
        .unwrap()
        .is_none());
}
