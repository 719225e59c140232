//! Programs left attached without their pins. An operator (or a script) that removes a
//! node's pin tree under bpffs by hand leaves the netlink filters of the pods' host veths and
//! of the node's devices in place (TCX links go with their pins): they keep running with maps
//! no pin names any more, and the next ADD would load new programs and maps beside them, so
//! the old pods' programs would work from stale tables. When a node has no pin tree, nothing
//! of ebpf-cni's may be attached in it: the next STATUS, agent pass, ADD or GC finds such
//! filters on every device of the node and removes them, each logged. The pods they served
//! keep their routes, so their traffic goes on through the stack (without host ports or
//! masquerade) until their DEL.

use super::{lock::NodeLock, pin::walk, Hook, NodeId, PinRoot};

/// Removes every filter of ebpf-cni's from every device of the calling thread's namespace
/// when `node` has no pin tree (checked again under the node lock, so a concurrent ADD that
/// just created it keeps its filters). One line per filter removed.
pub fn sweep(node: &NodeId) -> Vec<String> {
    let root = PinRoot::from_env();
    if walk(&root.node_dir(node)).exists() {
        return Vec::new();
    }
    let Ok(_lock) = NodeLock::take(&root) else {
        return Vec::new();
    };
    sweep_locked(&root, node)
}

/// One filter of ebpf-cni's on a device of a node that has no pin tree.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct UnpinnedFilter {
    pub device: String,
    /// `ingress` or `egress`.
    pub hook: &'static str,
    pub program: String,
}

/// The filters of ebpf-cni's programs on the devices of the calling thread's namespace,
/// when `node` has no pin tree (else none: every filter then has its record); read only.
pub fn find(root: &PinRoot, node: &NodeId) -> Vec<UnpinnedFilter> {
    if walk(&root.node_dir(node)).exists() {
        return Vec::new();
    }
    let Ok(links) = nix::net::if_::if_nameindex() else {
        return Vec::new();
    };
    let ours: Vec<&str> = Hook::ALL.iter().map(|h| h.program()).collect();
    let mut out = Vec::new();
    for link in links.iter() {
        let Ok(device) = link.name().to_str() else {
            continue;
        };
        let filters = match crate::netlink::tc::bpf_filter_names(link.index()) {
            Ok(f) => f,
            Err(e) => {
                log::debug!("listing the tc filters of {device}: {e}");
                continue;
            }
        };
        for (ingress, program) in filters {
            if ours.contains(&program.as_str()) {
                out.push(UnpinnedFilter {
                    device: device.to_owned(),
                    hook: if ingress { "ingress" } else { "egress" },
                    program,
                });
            }
        }
    }
    out
}

/// [`sweep`] with the node lock held: nothing when `node` has a pin tree. (Every ADD calls
/// it: the nf_tables request alone, a transaction the kernel aborts, cost each ADD 15 ms of
/// waiting, and it took a masquerading node's table away until the ADD's convergence put it
/// back.)
pub(super) fn sweep_locked(root: &PinRoot, node: &NodeId) -> Vec<String> {
    if walk(&root.node_dir(node)).exists() {
        return Vec::new();
    }
    let mut lines = Vec::new();
    // Nothing masquerades without pins: kube-proxy's masquerade gets its whole range back.
    match crate::netfilter::masq_ports::remove() {
        Ok(true) => {
            let line = format!(
                "removed table inet {}: node {node} has no pinned state",
                crate::netfilter::masq_ports::TABLE
            );
            log::warn!("{line}");
            lines.push(line);
        }
        Ok(false) => {}
        Err(e) => log::warn!("table inet {}: {e}", crate::netfilter::masq_ports::TABLE),
    }
    let found = find(root, node);
    for f in &found {
        let Some(hook) = Hook::ALL.into_iter().find(|h| h.program() == f.program) else {
            continue;
        };
        match aya::programs::tc::qdisc_detach_program(
            &f.device,
            hook.tc_attach_type(),
            hook.program(),
        ) {
            Ok(()) => {
                let line = format!(
                    "removed {} from {} ({}): attached, but node {node} has no pinned state (its pins were removed)",
                    f.program, f.device, f.hook
                );
                log::warn!("{line}");
                lines.push(line);
            }
            Err(e) => log::warn!("removing {} from {}: {e}", f.program, f.device),
        }
    }
    // The record of who created each device's `clsact` went with the pins: one left empty
    // by the removal held only ebpf-cni's filters, and goes too.
    let mut devices: Vec<&str> = Vec::new();
    for f in &found {
        if !devices.contains(&f.device.as_str()) {
            devices.push(&f.device);
        }
    }
    for device in devices {
        let Ok(index) = nix::net::if_::if_nametoindex(device) else {
            continue;
        };
        if crate::netlink::tc::clsact_filter_count(index).is_ok_and(|n| n == 0) {
            if let Err(e) = crate::netlink::tc::delete_clsact(index) {
                log::warn!("removing the clsact qdisc of {device}: {e}");
            }
        }
    }
    lines
}

/// [`find`] for `inspect`: in the calling thread's namespace, which must be `node`'s.
pub fn unpinned_filters(node: &NodeId) -> Vec<UnpinnedFilter> {
    find(&PinRoot::from_env(), node)
}
