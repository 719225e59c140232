//! DEL: removes the host veth (and with it the container side and host routes), the eBPF
//! attachment and the IPAM reservation. Idempotent: works twice, with an empty or deleted
//! `CNI_NETNS` and without `prevResult`, because every name is derived from the attachment.
//! It keeps going past errors and reports them all at the end. In chained mode (no ipam)
//! there is no veth or lease of ebpf-cni's: the same path removes only its eBPF state.
//!
//! The attachment's own state goes by [`removal::remove_attachment`], which GC uses for each
//! stale attachment too, so whatever DEL removes, GC removes too.

use crate::{
    cni::{config::NetConf, env::CniEnv, error::collect, CniError},
    ipam::backend::Ipam,
    netlink::Netlink,
    netns::Netns,
    removal,
};

pub async fn del(env: &CniEnv, conf: &NetConf, stdin: &[u8]) -> Result<(), CniError> {
    let ipam = Ipam::from_conf(conf)?;
    let mut errors =
        removal::remove_attachment(conf, ipam.as_ref(), &env.container_id, &env.ifname).await;

    // Normally gone with its peer; a container-side veth left alone by an interrupted ADD
    // or a deleted host side is removed here. In chained mode the interface is the previous
    // plugin's, which removes it after this DEL.
    if let Some(path) = env
        .netns
        .as_ref()
        .filter(|_| !crate::attachment::is_chained(conf))
    {
        match Netns::open(path) {
            // The node's own (a runtime's stale `/proc/<pid>/ns/net` whose pid now is a host
            // process's): its `CNI_IFNAME` is a node interface, never the pod's.
            Ok(ns) if ns.is_callers().unwrap_or(true) && !crate::netns::netns_override() => {
                log::warn!(
                    "CNI_NETNS {} is the node's own network namespace: no interface in it is deleted",
                    path.display()
                );
            }
            Ok(ns) => {
                if let Err(e) = delete_container_veth(&ns, &env.ifname).await {
                    errors.push(e);
                }
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => errors.push(e.into()),
        }
    }

    if let Some(ipam @ Ipam::Delegated { .. }) = &ipam {
        if let Err(e) = ipam.del(conf, env, stdin) {
            errors.push(e.into());
        }
    }
    collect(errors, |all| CniError::merged("DEL", all))
}

async fn delete_container_veth(ns: &Netns, ifname: &str) -> Result<(), CniError> {
    let nl = Netlink::connect_in(ns)?;
    if let Some(link) = nl.link_by_name(ifname).await? {
        if link.kind.as_deref() == Some("veth") {
            nl.delete_link(link.index).await?;
        }
    }
    Ok(())
}
