//! Removing one attachment found from its key alone (no netns, no prevResult), as DEL does
//! for its attachment and GC for each stale one: one function, so GC removes exactly what
//! DEL would.

use crate::{
    bpf::{self, AttachmentKey, NodeId},
    cni::{config::NetConf, CniError},
    ipam::backend::Ipam,
    netlink::Netlink,
    veth,
};

/// Removes what one attachment of `conf`'s network holds on this node, found from its key
/// alone (no netns, no prevResult): the host veth (the pod end and the routes go with it),
/// the eBPF attachment (links, endpoint-map entries and whatever else `bpf::del_pod`
/// owns; the node's programs and maps with the last pod) and the host-local leases. A
/// delegated IPAM is left to the caller (DEL passes DEL on, GC passes GC). Keeps going past
/// failures and returns them all; nothing there is not a failure.
pub async fn remove_attachment(
    conf: &NetConf,
    ipam: Option<&Ipam>,
    container_id: &str,
    ifname: &str,
) -> Vec<CniError> {
    let mut errors: Vec<CniError> = Vec::new();
    let key = AttachmentKey {
        network: &conf.name,
        container_id,
        ifname,
    };

    match Netlink::connect() {
        Ok(host_nl) => {
            let host_name = veth::host_veth_name(&key);
            match host_nl.link_by_name(&host_name).await {
                Ok(Some(link)) => {
                    if let Err(e) = host_nl.delete_link(link.index).await {
                        errors.push(e.into());
                    }
                }
                Ok(None) => {}
                Err(e) => errors.push(e.into()),
            }
            // Before the node's eBPF state, which goes with the node's last pod.
            match NodeId::current() {
                Ok(node) => {
                    if let Err(e) = crate::gateway::release(&host_nl, &node, key.id()).await {
                        errors.push(e);
                    }
                }
                Err(e) => errors.push(e.into()),
            }
        }
        Err(e) => errors.push(e.into()),
    }

    if let Err(e) = NodeId::current().and_then(|node| bpf::del_pod(&node, &key)) {
        errors.push(e.into());
    }
    // The node's programs on the cgroup root go with their last user (the last host port,
    // the last paced pod): they would run for every socket of the machine.
    if let Err(e) = NodeId::current().and_then(|node| bpf::settle_cgroup_links(&node)) {
        errors.push(e.into());
    }

    if let Some(ipam) = ipam {
        if let Err(e) = ipam.release_host_local(conf, container_id, ifname) {
            errors.push(e.into());
        }
    }
    errors
}
