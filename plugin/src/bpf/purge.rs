//! `ebpf-cni uninstall --purge`: an operator removes a node's pinned state (maps, programs,
//! device links, socket links) once no pod uses it. A node's last DEL does this by itself;
//! what is left for the operator is the state of a node whose last DEL failed part-way, or
//! whose pods were never deleted. Who counts as a user is what DEL's own test counts: an
//! attachment directory, or a recorded use of an IPv4 gateway (an ADD records it before its
//! attachment exists). While any is left the purge is refused, so a pod never loses its
//! dataplane under it; the check is repeated under the node lock, as DEL does.

use std::{fmt, net::Ipv4Addr, path::PathBuf};

use super::{
    gateways,
    lock::NodeLock,
    pin::{NodeId, PinRoot},
    pod::teardown_node,
    tree::{self, AttachmentDir},
    BpfError,
};

/// What still uses a node's pinned state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeUsers {
    pub attachments: Vec<AttachmentDir>,
    /// Each IPv4 gateway held for pods, with the attachment ids recorded as its users.
    pub gateways: Vec<(Ipv4Addr, Vec<u64>)>,
}

impl NodeUsers {
    pub fn is_empty(&self) -> bool {
        self.attachments.is_empty() && self.gateways.is_empty()
    }
}

/// "container 0123… ifname eth0 (network podnet)", one per attachment, then the gateways.
impl fmt::Display for NodeUsers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut items: Vec<String> = self
            .attachments
            .iter()
            .map(|a| {
                format!(
                    "container {} ifname {} (network {})",
                    a.container_id, a.ifname, a.network
                )
            })
            .collect();
        items.extend(self.gateways.iter().map(|(gw, ids)| {
            let ids: Vec<String> = ids.iter().map(|id| format!("{id:016x}")).collect();
            format!("gateway {gw} recorded for attachment id {}", ids.join(", "))
        }));
        f.write_str(&items.join("; "))
    }
}

/// What [`purge`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Purge {
    /// The node has no pin directory.
    NothingPinned { path: PathBuf },
    /// The node's pin directory is gone.
    Removed { path: PathBuf },
    /// Refused: these still use the node; nothing was changed.
    InUse(NodeUsers),
}

/// Who uses `node`'s pinned state now, read without the lock (a preview for the caller,
/// which [`purge`] repeats under it).
pub fn users(node: &NodeId) -> Result<NodeUsers, BpfError> {
    users_at(&PinRoot::from_env(), node)
}

fn users_at(root: &PinRoot, node: &NodeId) -> Result<NodeUsers, BpfError> {
    Ok(NodeUsers {
        attachments: tree::attachments(root, node)?,
        gateways: gateways::list_at(root, node),
    })
}

/// Removes `node`'s pin directory, with its device links (netlink filters and the `clsact`
/// qdiscs ebpf-cni created, as a last DEL removes them), unless anything uses it. Device
/// filters are found by name in the calling thread's network namespace: the caller runs
/// this in the node's.
pub fn purge(node: &NodeId) -> Result<Purge, BpfError> {
    purge_at(&PinRoot::from_env(), node)
}

fn purge_at(root: &PinRoot, node: &NodeId) -> Result<Purge, BpfError> {
    let path = root.node_dir(node);
    if !path.exists() {
        // Programs left attached without their pins go too (see `orphans.rs`).
        if root == &PinRoot::from_env() {
            super::orphans::sweep(node);
        }
        return Ok(Purge::NothingPinned { path });
    }
    let _lock = NodeLock::take(root)?;
    let users = users_at(root, node)?;
    if !users.is_empty() {
        return Ok(Purge::InUse(users));
    }
    log::info!("purging {node}: removing {}", path.display());
    teardown_node(root, node)?;
    Ok(Purge::Removed { path })
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    #[test]
    fn a_node_is_purged_only_when_nothing_uses_it() {
        let tmp = tempfile::tempdir().unwrap();
        let root = PinRoot::new(tmp.path());
        let node = NodeId::from_netns_inode(42);
        let dir = root.node_dir(&node);
        assert_eq!(
            purge_at(&root, &node).unwrap(),
            Purge::NothingPinned { path: dir.clone() }
        );

        fs::create_dir_all(root.map(&node, "ECNI_ENDPOINTS").parent().unwrap()).unwrap();
        fs::write(root.map(&node, "ECNI_ENDPOINTS"), b"").unwrap();
        let att = root.attachments_dir(&node).join("podnet/c0ffee/eth0");
        fs::create_dir_all(&att).unwrap();
        match purge_at(&root, &node).unwrap() {
            Purge::InUse(users) => {
                assert_eq!(users.attachments.len(), 1);
                assert_eq!(
                    users.to_string(),
                    "container c0ffee ifname eth0 (network podnet)"
                );
            }
            other => panic!("purged a node with an attachment: {other:?}"),
        }
        assert!(att.is_dir(), "a refused purge changes nothing");

        // A recorded gateway use without its attachment (an ADD between its two steps).
        fs::remove_dir_all(root.attachments_dir(&node)).unwrap();
        let gw = root.gateways_dir(&node).join("0a580001/00000000000000ab");
        fs::create_dir_all(&gw).unwrap();
        match purge_at(&root, &node).unwrap() {
            Purge::InUse(users) => assert_eq!(
                users.to_string(),
                "gateway 10.88.0.1 recorded for attachment id 00000000000000ab"
            ),
            other => panic!("purged a node with a gateway user: {other:?}"),
        }

        fs::remove_dir_all(root.gateways_dir(&node)).unwrap();
        assert_eq!(
            purge_at(&root, &node).unwrap(),
            Purge::Removed { path: dir.clone() }
        );
        assert!(!dir.exists());
        assert!(root.layout_dir().is_dir(), "the lock's directory stays");
    }
}
