//! The node follows its devices and addresses between ADDs (see `bpf/converge.rs` for what
//! is brought in line, and `gateway::restore` for the pods' gateways on `lo`): STATUS runs
//! this each time the runtime asks (containerd 2.x every 5 s), `ebpf-cni agent` on each
//! address or link event. A node without pods has nothing to
//! converge and costs one `stat`; a node in line costs one address dump and a few map
//! reads, and writes nothing.

use crate::{
    bpf::{self, ConvergedBy, NodeId, PinRoot},
    cni::{config::NetConf, CniError},
    ipam::backend::Ipam,
    netlink::Netlink,
};

/// Converges the node of the calling thread's namespace for `conf` (its `devices` and
/// attach mode); returns what changed, one line each.
pub async fn converge(conf: &NetConf, by: ConvergedBy) -> Result<Vec<String>, CniError> {
    let node = NodeId::current()?;
    if !PinRoot::from_env().node_dir(&node).exists() {
        // Nothing pinned: nothing of ebpf-cni's may be attached either.
        return Ok(bpf::sweep_orphans(&node));
    }
    let host_nl = Netlink::connect()?;
    let mut view = crate::node::node_view(&host_nl, conf, &gateways(conf)).await?;
    let learned = crate::services::learn(&conf.service_cidrs, &view.ipvs);
    view.services = Some(bpf::ServicesView {
        source: learned.describe(),
        masq_mark: learned.masq_mark,
        translated: learned.translated,
        nets: learned.nets,
    });
    let mut lines = crate::gateway::restore(&host_nl, &node, &mut view, by).await?;
    lines.extend(bpf::converge(&node, &view, by)?);
    Ok(lines)
}

/// The gateways of `conf`'s host-local ranges: the IPv6 ones are held by every host veth,
/// and knowing them spares a link lookup per pod (see `node::node_view`). Other networks'
/// pods are told apart by those lookups.
fn gateways(conf: &NetConf) -> Vec<std::net::IpAddr> {
    match Ipam::from_conf(conf) {
        Ok(Some(Ipam::HostLocal(c))) => c
            .range_sets
            .iter()
            .flat_map(|s| s.ranges.iter().map(|r| r.gateway))
            .collect(),
        _ => Vec::new(),
    }
}
