//! DEL: removes the host veth (and with it the container side and host routes), the eBPF
//! attachment and the IPAM reservation. Idempotent: works twice, with an empty or deleted
//! `CNI_NETNS` and without `prevResult`, because every name is derived from the attachment.
//! It keeps going past errors and reports them all at the end.

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
    let mut errors: Vec<CniError> = Vec::new();

    let host_nl = Netlink::connect()?;
    let key = AttachmentKey {
        network: &conf.name,
        container_id: &env.container_id,
        ifname: &env.ifname,
    };
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

    // Normally gone with its peer; a container-side veth left alone by an interrupted ADD
    // or a deleted host side is removed here.
    if let Some(path) = &env.netns {
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

    if let Err(e) = NodeId::current().and_then(|node| bpf::del_pod(&node, &key)) {
        errors.push(e.into());
    }

    if let Some(ipam) = ipam {
        if let Err(e) = ipam.del(conf, env, stdin) {
            errors.push(e);
        }
    }

    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => {
            let first = errors[0].clone();
            let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
            Err(
                CniError::new(first.code, format!("DEL failed in {} steps", all.len()))
                    .with_details(all.join("; ")),
            )
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
