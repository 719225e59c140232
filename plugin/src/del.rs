//! DEL: removes the host veth (and with it the container side and host routes), the eBPF
//! attachment and the IPAM reservation. Idempotent: works twice, with an empty or deleted
//! `CNI_NETNS` and without `prevResult`, because every name is derived from the attachment.
//! It keeps going past errors and reports them all at the end. In chained mode (no ipam)
//! there is no veth or lease of ebpf-cni's: the same path removes only its eBPF state.
//!
//! GC removes each stale attachment with the same [`remove_attachment`], so whatever DEL
//! removes, GC removes too.

use crate::{
    bpf::{self, AttachmentKey, NodeId},
    cni::{config::NetConf, env::CniEnv, CniError},
    ipam::backend::Ipam,
    netlink::Netlink,
    netns::Netns,
    veth,
};

pub async fn del(env: &CniEnv, conf: &NetConf, stdin: &[u8]) -> Result<(), CniError> {
    let ipam = Ipam::from_conf(conf)?;
    let mut errors = remove_attachment(conf, ipam.as_ref(), &env.container_id, &env.ifname).await;

    // Normally gone with its peer; a container-side veth left alone by an interrupted ADD
    // or a deleted host side is removed here. In chained mode the interface is the previous
    // plugin's, which removes it after this DEL.
    if let Some(path) = env
        .netns
        .as_ref()
        .filter(|_| !crate::attachment::is_chained(conf))
    {
        match Netns::open(path) {
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
    collect("DEL", errors)
}

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

    if let Some(ipam) = ipam {
        if let Err(e) = ipam.release_host_local(conf, container_id, ifname) {
            errors.push(e.into());
        }
    }
    errors
}

/// The outcome of a command that kept going past failures: success, the one failure, or
/// all of them under the first one's code.
pub fn collect(command: &str, mut errors: Vec<CniError>) -> Result<(), CniError> {
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => {
            // Merges errors already converted at the edge (they come from every module DEL
            // and GC touch), so it builds the CniError itself.
            let first = errors[0].clone();
            let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
            Err(CniError::new(
                first.code,
                format!("{command} failed in {} steps", all.len()),
            )
            .with_details(all.join("; ")))
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::code;

    #[test]
    fn collect_reports_every_failure_under_the_first_code() {
        assert!(collect("DEL", Vec::new()).is_ok());
        let one = CniError::new(code::KERNEL, "a");
        assert_eq!(collect("DEL", vec![one.clone()]).unwrap_err(), one);
        let e = collect(
            "GC",
            vec![
                CniError::new(code::BPF, "x").with_details("why"),
                CniError::new(code::IO_FAILURE, "y"),
            ],
        )
        .unwrap_err();
        assert_eq!(e.code, code::BPF);
        assert_eq!(e.msg, "GC failed in 2 steps");
        assert_eq!(e.details, "x: why (code 101); y (code 5)");
    }
}
