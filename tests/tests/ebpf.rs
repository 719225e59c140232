//! ebpf-cni's dataplane attachment: after ADD the host veth carries the pod programs, and
//! `/sys/fs/bpf/ebpf-cni/v1/netns-<node inode>/attachments/<network>/<containerid>/
//! <ifname>/` pins what holds them (so it outlives the plugin process, which has exited by
//! the time we look); DEL removes them for that attachment only.
//!
//! Two attach modes (TCX links where the kernel has them, netlink clsact filters where not,
//! and a config that forces either): with `tcAttachMode: "tcx"` the programs hang on TCX
//! links pinned there; by default (`auto`) ebpf-cni's own host veths get netlink `bpf`
//! filters (a TCX attach waits out RCU grace periods under the RTNL lock, see
//! docs/dataplane.md), the directory pins each program as the record, and the node's
//! devices keep TCX links.

use std::collections::BTreeSet;

use ebpf_cni_tests::bpf::{self, Mechanism, PinnedObject};
use ebpf_cni_tests::config::{Stack, NETWORK};
use ebpf_cni_tests::dataplane as dp;
use ebpf_cni_tests::external::ExternalHost;
use ebpf_cni_tests::{
    fsutil, require_root, unique_container_id, AddResult, Attachment, ListError, NetConfList,
    Netns, Node, PluginUnderTest, ResultExpectation,
};

/// Problems with one attachment's programs and pins, when `want` attaches them.
fn attachment_bpf_problems(node: &Node, cid: &str, r: &AddResult, want: Mechanism) -> Vec<String> {
    let mut p = Vec::new();
    let progs = match bpf::attached_programs(node.netns(), &r.host_ifname) {
        Ok(progs) => progs,
        Err(e) => return vec![format!("reading programs on {}: {e:#}", r.host_ifname)],
    };
    let mut names: Vec<&str> = progs.iter().map(|q| q.name.as_str()).collect();
    names.sort();
    if names != [dp::PROG_FROM_POD, dp::PROG_TO_POD] {
        p.push(format!(
            "host veth {} carries {names:?}, not ecni_from_pod and ecni_to_pod",
            r.host_ifname
        ));
    }
    for prog in &progs {
        if prog.mechanism != want {
            p.push(format!("{prog:?} is not attached by {want:?}"));
        }
    }

    let dir = node.attachment_pin_dir(NETWORK, cid, "eth0");
    let files = fsutil::list_files(&dir).unwrap_or_default();
    if files.is_empty() {
        p.push(format!("nothing pinned under {}", dir.display()));
    }
    let ifindex = bpf::ifindex_in(node.netns(), &r.host_ifname).unwrap_or(0);
    let (mut pinned_links, mut pinned_progs) = (BTreeSet::new(), BTreeSet::new());
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
            Ok(PinnedObject::Prog { id, .. }) => {
                pinned_progs.insert(id);
            }
            Ok(_) => {}
            Err(e) => p.push(format!("pin {} unreadable: {e:#}", f.display())),
        }
    }
    for prog in &progs {
        match (want, prog.link_id) {
            // Every TCX link holding a program on the veth is one the plugin pinned:
            // otherwise it would have been detached when the plugin exited, or cannot be
            // found by DEL.
            (Mechanism::Tcx, Some(id)) if pinned_links.contains(&id) => {}
            (Mechanism::Tcx, Some(id)) => p.push(format!(
                "TCX link {id} ({}) on {} is not pinned under {}",
                prog.name,
                r.host_ifname,
                dir.display()
            )),
            (Mechanism::Tcx, None) => p.push(format!(
                "program {} is attached without a link (cannot be pinned)",
                prog.name
            )),
            // A filter holds its program by itself; the record is the program's pin.
            (Mechanism::NetlinkTc, _) if pinned_progs.contains(&prog.prog_id) => {}
            (Mechanism::NetlinkTc, _) => p.push(format!(
                "filter program {} ({}) on {} has no record under {}",
                prog.prog_id,
                prog.name,
                r.host_ifname,
                dir.display()
            )),
        }
    }
    if want == Mechanism::NetlinkTc && !pinned_links.is_empty() {
        p.push(format!("netlink mode pinned links: {pinned_links:?}"));
    }
    p
}

/// The config of `mode` (`None`: the default), and the mechanism it puts on the host veth.
fn conf_of(p: &PluginUnderTest, node: &Node, mode: Option<&str>) -> (NetConfList, Mechanism) {
    let mut conf = p.conf("1.0.0", node, Stack::Dual);
    if let Some(m) = mode {
        conf["tcAttachMode"] = serde_json::Value::from(m);
    }
    let want = match mode {
        Some("tcx") => Mechanism::Tcx,
        _ => Mechanism::NetlinkTc,
    };
    (NetConfList::single(&conf), want)
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

/// Programs are attached and pinned per attachment after ADD (netlink filters by default,
/// TCX links with `tcAttachMode: "tcx"`; the node's device by TCX either way); DEL of one
/// pod removes its pins and leaves the other pod's programs in place; after the last DEL no
/// attachment pins remain for the node.
#[test]
fn programs_attached_and_pinned_per_attachment() {
    require_root();
    for mode in [None, Some("tcx")] {
        attached_and_pinned(mode);
    }
}

fn attached_and_pinned(mode: Option<&str>) {
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let _ext = ExternalHost::attach(node.netns(), "up0", 78).unwrap();
    let (pod_a, pod_b) = (node.new_pod().unwrap(), node.new_pod().unwrap());
    let (list, want) = conf_of(&p, &node, mode);
    if want == Mechanism::Tcx && !bpf::kernel_has_tcx() {
        tcx_refused(&p, &node, &list, &pod_a);
        return;
    }
    let (att_a, res_a, a) = add(&p, &node, &list, &pod_a);
    let (att_b, res_b, b) = add(&p, &node, &list, &pod_b);

    for (att, r) in [(&att_a, &a), (&att_b, &b)] {
        let problems = attachment_bpf_problems(&node, &att.container_id, r, want);
        assert!(
            problems.is_empty(),
            "eBPF state after ADD ({mode:?}):\n  - {}",
            problems.join("\n  - ")
        );
    }
    let dev = bpf::attached_programs(node.netns(), "up0").unwrap();
    let dev_want = bpf::device_mechanism(mode);
    assert!(
        dev.len() == 1 && dev[0].name == dp::PROG_FROM_DEV && dev[0].mechanism == dev_want,
        "the node device's program is not one {dev_want:?} attachment ({mode:?}): {dev:?}"
    );
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
            .join(ebpf_cni_maps::pin::ATTACHMENTS_DIR)
            .join(NETWORK)
            .join(&att_a.container_id)
            .exists(),
        "DEL left the container's pin directory"
    );
    let problems = attachment_bpf_problems(&node, &att_b.container_id, &b, want);
    assert!(
        problems.is_empty(),
        "DEL of pod a disturbed pod b ({mode:?}):\n  - {}",
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
    let left =
        fsutil::list_files(&node.pin_root().join(ebpf_cni_maps::pin::ATTACHMENTS_DIR)).unwrap();
    assert!(
        left.is_empty(),
        "attachment pins left after the last DEL: {left:?}"
    );
}

/// The node's hashes that only user space fills (at ADD) are allocated entry by entry: the
/// node's first ADD created four of 65,536 preallocated entries each, 26 MiB of kernel
/// memory (56.5 against 30.4 MiB for the node's maps) and ~9 ms of that ADD, however few
/// pods the node would have. The LRU hashes, which the programs fill and the kernel evicts
/// from, stay preallocated (the kernel requires it).
#[test]
fn the_hashes_only_user_space_fills_are_not_preallocated() {
    require_root();
    const NO_PREALLOC: u32 = 1;
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let pod = node.new_pod().unwrap();
    let (list, _) = conf_of(&p, &node, None);
    let (att, res, _) = add(&p, &node, &list, &pod);
    for (map, preallocated) in [
        (ebpf_cni_maps::ENDPOINTS_MAP, false),
        (ebpf_cni_maps::RATE_LIMITS_MAP, false),
        (ebpf_cni_maps::PORTMAP_MAP, false),
        (ebpf_cni_maps::PACING_MAP, false),
        (ebpf_cni_maps::NAT_REV_MAP, true),
        (ebpf_cni_maps::SOCK_REV_MAP, true),
    ] {
        let flags = bpf::pinned_map_flags(&dp::map_pin(&node, map)).unwrap();
        assert_eq!(
            flags & NO_PREALLOC == 0,
            preallocated,
            "{map}: map_flags {flags:#x}, preallocated expected {preallocated}"
        );
    }
    p.runtime
        .del(&node, &list, &att, Some(&res))
        .unwrap_or_else(|e| panic!("DEL: {e}"));
}

/// On a kernel without TCX (before 6.6), `tcAttachMode: "tcx"` is refused before anything
/// is made: error 7 naming the mode and the kernel, no veth, no lease, no pin.
fn tcx_refused(p: &PluginUnderTest, node: &Node, list: &NetConfList, pod: &Netns) {
    let att = Attachment::new(&unique_container_id(), pod.path(), "eth0");
    let before = node.snapshot(Some(pod));
    let err = match p.runtime.add(node, list, &att) {
        Err(ListError::Plugin { output, .. }) => output.error().expect("an error result"),
        other => panic!("tcAttachMode tcx on a kernel without TCX: {other:?}"),
    };
    assert_eq!(err.code, 7, "{err:?}");
    let text = err.text_lower();
    assert!(
        text.contains("tcattachmode") && text.contains("tcx") && text.contains("6.6"),
        "the error does not name the mode and what it needs: {err:?}"
    );
    assert_eq!(
        node.snapshot(Some(pod)),
        before,
        "the refused ADD changed the node"
    );
}

/// A DEL that cannot enter the pod (`CNI_NETNS=""`, no prevResult) still finds and removes
/// the attachment's pins: they are located from the attachment's identity alone.
#[test]
fn late_del_removes_pins() {
    require_root();
    for mode in [None, Some("tcx")] {
        late_del(mode);
    }
}

fn late_del(mode: Option<&str>) {
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let pod = node.new_pod().unwrap();
    let (list, want) = conf_of(&p, &node, mode);
    if want == Mechanism::Tcx && !bpf::kernel_has_tcx() {
        return; // refused before anything is made: `tcx_refused`
    }
    let (att, _res, r) = add(&p, &node, &list, &pod);
    let problems = attachment_bpf_problems(&node, &att.container_id, &r, want);
    assert!(
        problems.is_empty(),
        "eBPF state after ADD ({mode:?}):\n  - {}",
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
