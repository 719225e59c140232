//! Host ports: the pod's mappings in the node's port map, the attachment's list of them
//! (pinned, so DEL finds what to remove without the request), the node's addresses the
//! wildcard mappings answer on, and the socket programs on the cgroup root that take the
//! node's own connections to them (`maps/host_ports.rs`, `cgroup.rs`).

use super::{
    spec::{PodSpec, Veth},
    unit::{Capability, Check, Install, Removal},
};
use crate::bpf::{
    cgroup, cookie,
    maps::host_ports::{self, PortMaps, RemovedMapping},
    pin::walk,
    BpfError,
};

pub(super) struct HostPorts;

impl Capability for HostPorts {
    fn name(&self) -> &'static str {
        "host ports"
    }

    fn install(&self, pod: &PodSpec, veth: &Veth, cx: &mut Install<'_>) -> Result<(), BpfError> {
        if pod.ports.is_empty() {
            return Ok(());
        }
        let (root, node, id) = (cx.root, cx.node, cx.key.id());
        let pm = PortMaps::opened(cx.ports, root, node)?;
        pm.ensure_free(id, &pod.ports)?;
        // Attached first: without SO_NETNS_COOKIE (before 5.14) `ecni_connect4` itself
        // tells the node's cookie. Until the config holds it, the programs act on no socket.
        cgroup::ensure_sock_links(root, node)?;
        let cookie = cookie::node_netns_cookie(root, node, pm.netns_cookie())?;
        pm.enable(cookie)?;
        pm.sync_node_addrs(&cx.view.addrs)?;
        // The list first: whatever happens next, DEL finds what to remove.
        let keys: Vec<_> = pod.ports.iter().map(host_ports::port_key).collect();
        host_ports::pin_attachment_ports(&cx.pins.ports(), &keys)?;
        pm.install(id, veth.host_ifindex, &pod.ports)
    }

    fn check(&self, pod: &PodSpec, veth: &Veth, cx: &Check<'_>) -> Result<(), BpfError> {
        if pod.ports.is_empty() {
            return Ok(());
        }
        let pm = PortMaps::open(cx.root, cx.node)?;
        pm.check(cx.key.id(), veth.host_ifindex, &pod.ports)?;
        let listed = host_ports::attachment_ports(&cx.pins.ports())?;
        if !pod
            .ports
            .iter()
            .all(|e| listed.contains(&host_ports::port_key(e)))
        {
            return Err(BpfError::PinMissing {
                what: "attachment port list entry",
                path: cx.pins.ports(),
            });
        }
        if !pm.enabled() {
            return Err(BpfError::PortMappingMissing {
                mapping: "(node switch: port mappings are turned off in ECNI_CONFIG)".to_owned(),
            });
        }
        // A node whose mappings an older build installed on a kernel without
        // SO_NETNS_COOKIE has no cookie and no socket programs until its next ADD with
        // mappings.
        if pm.netns_cookie() != 0 {
            cgroup::check_sock_links(cx.root, cx.node)?;
        }
        Ok(())
    }

    /// The mappings listed in the attachment's pinned port list go (the list itself with
    /// the attachment's directory). The node's own sockets connected through them to the
    /// pod are destroyed (see `netlink::sockets`): they would keep sending to the pod's
    /// address, whoever takes the host port next.
    fn remove(&self, cx: &mut Removal<'_>) -> Result<bool, BpfError> {
        let (root, node) = (cx.root, cx.node);
        let keys = host_ports::attachment_ports(&cx.pins.ports())?;
        if keys.is_empty() || !walk(&root.map(node, ebpf_cni_maps::PORTMAP_MAP)).exists() {
            return Ok(false);
        }
        let removed = PortMaps::open(root, node)?.remove(cx.key.id(), &keys)?;
        for RemovedMapping {
            key,
            target,
            node_sockets,
        } in &removed
        {
            if key.proto != ebpf_cni_maps::IPPROTO_TCP && key.proto != ebpf_cni_maps::IPPROTO_UDP {
                continue;
            }
            // No socket of the node ever went through this mapping: nothing to close, and
            // no dump (each walks the kernel's whole established hash, every namespace's,
            // milliseconds on a large machine).
            if *node_sockets == 0 {
                continue;
            }
            let pod = crate::bpf::keys::key_ip(&ebpf_cni_maps::EndpointKey {
                addr: target.pod_addr,
            });
            match crate::netlink::sockets::destroy_connected(key.proto, pod, target.pod_port) {
                Ok(0) => {}
                Ok(n) => log::info!(
                    "closed {n} socket(s) of the node connected to {pod} port {} through host port {}",
                    target.pod_port,
                    host_ports::describe_key(key)
                ),
                // Not a failure of the teardown: those sockets only keep talking to nothing.
                Err(e) => log::warn!(
                    "cannot close the node's sockets connected to {pod} port {} (host port {}): {e}",
                    target.pod_port,
                    host_ports::describe_key(key)
                ),
            }
        }
        Ok(!removed.is_empty())
    }
}
