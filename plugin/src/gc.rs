//! GC (spec 1.1): removes every attachment of this network that the runtime does not list
//! in `cni.dev/valid-attachments`, and leaves the listed ones alone.
//!
//! The inventory is what DEL's names are derived from, read back: the attachment
//! directories pinned for this network on this node, and the built-in host-local's leases.
//! Each stale attachment is removed by [`removal::remove_attachment`] (host veth, eBPF
//! attachment and map entries, leases), which DEL uses too, so GC removes exactly what DEL
//! would. Then the
//! address store is collected as a whole: host-local drops any lease still not listed
//! (old-format files that name no interface), a delegated IPAM gets GC itself. Like DEL,
//! GC keeps going past failures and reports them all.

use std::collections::BTreeSet;

use crate::{
    bpf::{self, NodeId},
    cni::{
        config::NetConf,
        env::{validate_container_id, validate_ifname, NetworkEnv},
        error::collect,
        gc::valid_attachments,
        CniError,
    },
    ipam::backend::Ipam,
    removal,
};

pub async fn gc(env: &NetworkEnv, conf: &NetConf, stdin: &[u8]) -> Result<(), CniError> {
    let valid = valid_attachments(&conf.raw)?;
    let ipam = Ipam::from_conf(conf)?;
    let mut errors: Vec<CniError> = Vec::new();

    let mut found: BTreeSet<(String, String)> = BTreeSet::new();
    match NodeId::current().and_then(|node| bpf::network_attachments(&node, &conf.name)) {
        Ok(pinned) => found.extend(pinned),
        Err(e) => errors.push(e.into()),
    }
    if let Some(ipam) = &ipam {
        match ipam.holders(conf) {
            Ok(holders) => found.extend(holders),
            Err(e) => errors.push(e.into()),
        }
    }

    let keep: BTreeSet<(&str, &str)> = valid
        .iter()
        .map(|(id, ifname)| (id.as_str(), ifname.as_str()))
        .collect();
    for (container_id, ifname) in &found {
        if keep.contains(&(container_id.as_str(), ifname.as_str())) {
            continue;
        }
        // A lease file may hold anything; what cannot be an attachment of ours has no veth
        // or pins, and its lease goes with the store's own GC below.
        if validate_container_id(container_id).is_err() || validate_ifname(ifname).is_err() {
            log::warn!("GC: skipping {container_id:?}/{ifname:?}: not a valid attachment key");
            continue;
        }
        log::info!(
            "GC: removing attachment {container_id}/{ifname} of {}",
            conf.name
        );
        for e in removal::remove_attachment(conf, ipam.as_ref(), container_id, ifname).await {
            errors.push(CniError {
                msg: format!("attachment {container_id}/{ifname}: {}", e.msg),
                ..e
            });
        }
    }

    match NodeId::current().and_then(|node| bpf::sweep_sources(&node)) {
        Ok(0) => {}
        Ok(n) => log::info!("GC: removed {n} source-check entries of attachments gone"),
        Err(e) => errors.push(e.into()),
    }
    if let Ok(node) = NodeId::current() {
        for line in bpf::sweep_orphans(&node) {
            log::info!("GC: {line}");
        }
    }
    match NodeId::current().and_then(|node| bpf::sweep_masq(&node)) {
        Ok(0) => {}
        Ok(n) => log::info!("GC: removed {n} idle or orphaned masqueraded flows"),
        Err(e) => errors.push(e.into()),
    }
    if let Some(ipam) = &ipam {
        if let Err(e) = ipam.gc(conf, &env.path, &valid, stdin) {
            errors.push(e.into());
        }
    }
    collect(errors, |all| CniError::merged("GC", all))
}
