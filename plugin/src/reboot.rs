//! The first ADD after a reboot reclaims this network's leases whose attachment did not
//! survive it. A hard reboot empties bpffs and takes every pod's veth, and the runtime
//! never DELs the pods it lost; containerd sends no GC either. So ADD, before it allocates,
//! asks the built-in host-local whether the network's records were checked in this boot
//! (two small reads when they were) and, once per boot, releases each lease of ours whose
//! attachment is gone: no pinned attachment directory and no host veth on the node. A
//! lease of another plugin sharing the directory has no record of ours and stays; a
//! delegated IPAM's leases are its own. The node lock is held throughout, so no ADD or DEL
//! of this node runs its eBPF steps meanwhile, and an ADD of the new boot that finds the
//! boot changed waits here before it allocates anything.

use std::collections::BTreeSet;

use crate::{
    bpf::{self, AttachmentKey, NodeId},
    cni::{config::NetConf, CniError},
    ipam::{backend::Ipam, boot, OwnLease},
    netlink::Netlink,
    veth,
};

/// Releases the network's leases a reboot orphaned; nothing when the boot is unchanged or
/// the IPAM is delegated. Each release is logged.
pub async fn reclaim_leases(
    conf: &NetConf,
    ipam: &Ipam,
    host_nl: &Netlink,
    node: &NodeId,
) -> Result<(), CniError> {
    let Ipam::HostLocal(hl) = ipam else {
        return Ok(());
    };
    let current = boot::current()?;
    if !boot::needs_check(hl, &conf.name, &current)? {
        return Ok(());
    }
    let _lock = bpf::lock_node()?;
    let Some(found) = boot::leases_of_another_boot(hl, &conf.name, &current)? else {
        return Ok(());
    };
    let pinned: BTreeSet<(String, String)> = bpf::network_attachments(node, &conf.name)?
        .into_iter()
        .collect();
    let mut dead: Vec<OwnLease> = Vec::new();
    for lease in found.leases {
        if pinned.contains(&(lease.container_id.clone(), lease.ifname.clone())) {
            continue;
        }
        let key = AttachmentKey {
            network: &conf.name,
            container_id: &lease.container_id,
            ifname: &lease.ifname,
        };
        if host_nl
            .link_by_name(&veth::host_veth_name(&key))
            .await?
            .is_none()
        {
            dead.push(lease);
        }
    }
    let released = boot::reclaim(hl, &conf.name, &dead, &found.current)?;
    let was = found.recorded.as_deref().unwrap_or("unknown");
    for l in &released {
        log::warn!(
            "reclaimed lease {} of container {} ifname {} in network {}: its attachment did not survive the reboot (boot {was}, now {})",
            l.ip,
            l.container_id,
            l.ifname,
            conf.name,
            found.current
        );
    }
    Ok(())
}
