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

/// [`sweep`] with the node lock held.
pub(super) fn sweep_locked(root: &PinRoot, node: &NodeId) -> Vec<String> {
    if walk(&root.node_dir(node)).exists() {
        return Vec::new();
    }
    let Ok(links) = nix::net::if_::if_nameindex() else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    for link in links.iter() {
        let Ok(name) = link.name().to_str() else {
            continue;
        };
        for hook in Hook::ALL {
            // Removes the filters running this program, if any (by program name).
            if aya::programs::tc::qdisc_detach_program(name, hook.tc_attach_type(), hook.program())
                .is_ok()
            {
                let line = format!(
                    "removed {} from {name}: attached, but node {node} has no pinned state (its pins were removed)",
                    hook.program()
                );
                log::warn!("{line}");
                lines.push(line);
            }
        }
    }
    lines
}
