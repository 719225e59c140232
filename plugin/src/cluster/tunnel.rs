//! The overlay's device: one `external` (collect_md) VXLAN device per node
//! ([`TUNNEL_DEVICE`]), without learning or ARP, which the programs give each packet's
//! tunnel key (`ebpf/src/tunnel.rs`); its routes, one per peer subnet behind a gateway, go
//! via the peer's node address `onlink` (`super::routes`), and the programs' maps follow
//! those routes at each convergence (`bpf::tunnel`). The device holds the first address of
//! the node's IPv4 subnet as a /32, as flannel's does, so the node's own packets to peer
//! pods leave from an address the peers take from it.

use std::net::IpAddr;

use ipnetwork::IpNetwork;

use crate::bpf::tunnel::TUNNEL_DEVICE;
use crate::netlink::{Netlink, NetlinkError};

/// VXLAN's overhead on an IPv4 underlay: outer IPv4 (20), UDP (8), VXLAN (8), the inner
/// Ethernet header (14).
pub const OVERHEAD: u32 = 50;
/// The same on an IPv6 underlay (an outer IPv6 header is 40 bytes).
pub const OVERHEAD_V6: u32 = 70;

/// The tunnel's settings, from the network config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TunnelSpec {
    pub port: u16,
    pub udp_csum: bool,
    /// The MTU of the device the node's address is on.
    pub underlay_mtu: u32,
    /// The node has an IPv6 address in the cluster: it may tunnel over IPv6, whose
    /// overhead the MTU allows for.
    pub ipv6_underlay: bool,
    /// The device's addresses: the network address of the node's subnet of each family,
    /// alone (`/32`, `/128`).
    pub addresses: [Option<IpNetwork>; 2],
}

#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error("the VXLAN port {port} is held by {holder}: set \"vxlanPort\" in the network config to another port, or remove {holder}")]
    PortHeld { port: u16, holder: String },
    #[error("{TUNNEL_DEVICE} exists and is not the cluster network's VXLAN device (external, port {port}): remove it")]
    Foreign { port: u16 },
}

impl TunnelSpec {
    /// The device's MTU, and the most a pod may have: the underlay's less the overhead.
    pub fn mtu(&self) -> u32 {
        let overhead = if self.ipv6_underlay {
            OVERHEAD_V6
        } else {
            OVERHEAD
        };
        self.underlay_mtu.saturating_sub(overhead).max(576)
    }
}

/// The MTU of the link holding `addr` (1500 when none does).
pub async fn mtu_of(nl: &Netlink, addr: Option<IpAddr>) -> u32 {
    let Some(addr) = addr else { return 1500 };
    let Ok(all) = crate::netlink::addrs::global_addresses() else {
        return 1500;
    };
    for (index, a) in all {
        if a == addr {
            if let Ok(Some(l)) = nl.link_by_index(index).await {
                return l.mtu;
            }
        }
    }
    1500
}

/// The tunnel device as `spec` says, made or kept; its index. Made down and brought up
/// last, so a port another VXLAN device holds is an error naming that device.
pub async fn ensure(nl: &Netlink, spec: &TunnelSpec) -> Result<u32, TunnelError> {
    let mtu = spec.mtu();
    let link = match nl.link_by_name(TUNNEL_DEVICE).await? {
        Some(l) => {
            let ours = l.vxlan.is_some_and(|v| {
                v.external && v.vni == 0 && v.port == spec.port && v.udp_csum == spec.udp_csum
            });
            if !ours {
                if l.vxlan.is_some_and(|v| v.external) {
                    // Ours with other settings (the network config changed): made again.
                    nl.delete_link(l.index).await?;
                    create(nl, spec, mtu).await?
                } else {
                    return Err(TunnelError::Foreign { port: spec.port });
                }
            } else {
                l
            }
        }
        None => create(nl, spec, mtu).await?,
    };
    for addr in spec.addresses.into_iter().flatten() {
        nl.ensure_address(link.index, addr).await?;
    }
    if !link.up {
        if let Err(e) = nl.set_up(link.index).await {
            if e.errno() == Some(libc::EADDRINUSE) {
                let holder = holder_of(nl, spec.port, link.index)
                    .await
                    .unwrap_or_else(|| format!("another socket on UDP {}", spec.port));
                let _ = nl.delete_link(link.index).await;
                return Err(TunnelError::PortHeld {
                    port: spec.port,
                    holder,
                });
            }
            return Err(e.into());
        }
    }
    Ok(link.index)
}

async fn create(
    nl: &Netlink,
    spec: &TunnelSpec,
    mtu: u32,
) -> Result<crate::netlink::Link, TunnelError> {
    nl.create_vxlan(TUNNEL_DEVICE, spec.port, spec.udp_csum, mtu)
        .await?;
    // No IPv6 link-local address (`addr_gen_mode` none), set before the device comes up:
    // the stack's own IPv6 packets from one (router solicitations, neighbour discovery)
    // would be sent into the tunnel and dropped there for want of a peer. A kernel
    // without IPv6 has no such setting.
    let _ = std::fs::write(
        format!("/proc/sys/net/ipv6/conf/{TUNNEL_DEVICE}/addr_gen_mode"),
        "1",
    );
    nl.link_by_name(TUNNEL_DEVICE).await?.ok_or_else(|| {
        TunnelError::Netlink(NetlinkError::Request {
            op: format!("find {TUNNEL_DEVICE} after creating it"),
            source: std::io::Error::from_raw_os_error(libc::ENODEV),
        })
    })
}

/// The VXLAN device other than `own` listening on `port`, by name.
async fn holder_of(nl: &Netlink, port: u16, own: u32) -> Option<String> {
    nl.links()
        .await
        .ok()?
        .into_iter()
        .find(|l| l.index != own && l.vxlan.is_some_and(|v| v.port == port))
        .map(|l| format!("the VXLAN device {}", l.name))
}

/// [`TunnelSpec::addresses`] for the node's `subnets`: each family's first subnet's
/// network address, alone.
pub fn addresses_of(subnets: &[IpNetwork]) -> [Option<IpNetwork>; 2] {
    let first = |v6: bool| {
        let s = subnets.iter().find(|s| s.is_ipv6() == v6)?;
        IpNetwork::new(s.network(), if v6 { 128 } else { 32 }).ok()
    };
    [first(false), first(true)]
}
