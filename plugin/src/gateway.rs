//! The pods' IPv4 gateways, held once per node on `lo`.
//!
//! The reference `ptp` plugin puts a pod's gateway on its host veth, so a node of N pods
//! holds the same address N times. The kernel then keeps N aliases of one local route, and
//! every ADD's address dump returns N entries more: both grow with the pods. Here the node
//! holds each gateway once, on `lo` (a local address, so the pods reach the node through
//! it as before, and routes to the pods keep it as their source), and `ecni_from_pod`
//! answers the pods' ARP requests for it with the host veth's MAC, whatever the node's
//! `arp_ignore`. IPv6 gateways stay on the host veth (neighbour discovery is left to the
//! kernel).
//!
//! Which attachments use a gateway is recorded in bpffs (`bpf::gateways`); the last one's
//! DEL removes the address. Changes to the records and the address happen under the node
//! lock. Which host veths hold an IPv6 gateway is recorded the same way, so that STATUS can
//! put one back ([`restore`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;

use crate::{
    bpf::{
        gateways::{self, CreatedDirs},
        BpfError, ConvergedBy, NodeId, NodeView,
    },
    cni::{code, CniError},
    netlink::Netlink,
};

/// CHECK found a pod's gateway unlike ADD left it (code 105).
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The attachment's use of the gateway is not recorded; the cause says how.
    #[error("gateway {gw}")]
    NotRecorded {
        gw: Ipv4Addr,
        #[source]
        source: BpfError,
    },
    #[error("the node does not hold the pod's gateway {gw}/32 on lo")]
    NotOnLo { gw: Ipv4Addr },
}

impl GatewayError {
    pub fn cni_code(&self) -> u32 {
        code::CHECK_FAILED
    }
}

pub use crate::netlink::LOOPBACK_IFINDEX;

fn host_prefix(gw: Ipv4Addr) -> IpNetwork {
    IpNetwork::new(IpAddr::V4(gw), 32).expect("/32 is valid")
}

/// The IPv4 gateways among `gateways`.
pub fn ipv4(gateways: impl IntoIterator<Item = Option<IpAddr>>) -> Vec<Ipv4Addr> {
    of_family(gateways, |g| match g {
        IpAddr::V4(g) => Some(g),
        IpAddr::V6(_) => None,
    })
}

/// The IPv6 gateways among `gateways`.
pub fn ipv6(gateways: impl IntoIterator<Item = Option<IpAddr>>) -> Vec<Ipv6Addr> {
    of_family(gateways, |g| match g {
        IpAddr::V6(g) => Some(g),
        IpAddr::V4(_) => None,
    })
}

/// The gateways `pick` takes, once each, in order.
fn of_family<A: Ord>(
    gateways: impl IntoIterator<Item = Option<IpAddr>>,
    pick: fn(IpAddr) -> Option<A>,
) -> Vec<A> {
    let mut v: Vec<A> = gateways.into_iter().flatten().filter_map(pick).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The IPv4 gateway of an IPv4 pod address (what its endpoint entry names).
pub fn of_address(address: IpAddr, gateway: Option<IpAddr>) -> Option<Ipv4Addr> {
    match (address, gateway) {
        (IpAddr::V4(_), Some(IpAddr::V4(g))) => Some(g),
        _ => None,
    }
}

/// ADD: attachment `id` uses `gws`, and its host veth will hold `gws6`. An IPv4 gateway no
/// other attachment uses is added to `lo` here; the ones in use already are returned, held
/// by the node since their first user's ADD: ADD finds them in its dump of the node's
/// addresses ([`ensure_held`]) rather than asking for each again (an `RTM_NEWADDR` the
/// kernel answered `EEXIST`). The IPv6 ones are only recorded (ADD puts them on the host
/// veth). The record directories it had to create are added to `created`, also when it
/// fails, for [`release_after_failed_add`].
pub async fn acquire(
    host_nl: &Netlink,
    node: &NodeId,
    id: u64,
    gws: &[Ipv4Addr],
    gws6: &[Ipv6Addr],
    created: &mut CreatedDirs,
) -> Result<Vec<Ipv4Addr>, CniError> {
    let mut held = Vec::new();
    if gws.is_empty() && gws6.is_empty() {
        return Ok(held);
    }
    let lock = gateways::GatewayLock::take()?;
    for gw in gws6 {
        lock.add_user6(node, *gw, id, created)?;
    }
    for gw in gws {
        if lock.add_user(node, *gw, id, created)? {
            held.push(*gw);
        } else {
            host_nl
                .ensure_address(LOOPBACK_IFINDEX, host_prefix(*gw))
                .await?;
        }
    }
    Ok(held)
}

/// ADD, after [`acquire`]: each gateway of `held` is among the global addresses `lo`
/// holds (`view`, from ADD's dump of the node's addresses), or is added again, to
/// `lo` and to `view` (someone took it off; the pods' host routes take it as their source
/// address, so this runs before them). The lock is not needed: this ADD's own use keeps
/// every DEL from removing it.
pub async fn ensure_held(
    host_nl: &Netlink,
    held: &[Ipv4Addr],
    view: &mut NodeView,
) -> Result<(), CniError> {
    for gw in held {
        if !view.on_loopback(IpAddr::V4(*gw)) {
            log::warn!("gateway {gw} was not on lo: added again");
            host_nl
                .ensure_address(LOOPBACK_IFINDEX, host_prefix(*gw))
                .await?;
            view.add_loopback(IpAddr::V4(*gw));
        }
    }
    Ok(())
}

/// STATUS and the agent: each IPv4 gateway in use that `lo` no longer holds
/// (`view`, from the node's address dump) is added again, to `lo` and to `view`,
/// and with it the host routes of the pods behind it, which the kernel removed with the
/// address (they take it as their source). Each IPv6 gateway fewer host veths hold than
/// are recorded as holding it is added again where it is missing, and the host routes to
/// that veth's pod get it back as their source (the kernel kept them, without it). A node
/// whose gateways are all in place costs a directory read per family and one per IPv6
/// gateway. Returns what changed, one line per gateway and veth, recorded as the node's
/// last convergence.
pub async fn restore(
    host_nl: &Netlink,
    node: &NodeId,
    view: &mut NodeView,
    by: ConvergedBy,
) -> Result<Vec<String>, CniError> {
    let root = crate::bpf::PinRoot::from_env();
    let missing: Vec<Ipv4Addr> = gateways::in_use_list(&root, node)
        .into_iter()
        .filter(|gw| !view.on_loopback(IpAddr::V4(*gw)))
        .collect();
    let short6: Vec<Ipv6Addr> = gateways::users6(&root, node)
        .into_iter()
        .filter(|(gw, ids)| view.holders(IpAddr::V6(*gw)) < ids.len())
        .map(|(gw, _)| gw)
        .collect();
    if missing.is_empty() && short6.is_empty() {
        return Ok(Vec::new());
    }
    // Under the lock no DEL drops a gateway's last user, and no pod leaves the endpoint map.
    let lock = gateways::GatewayLock::take()?;
    let mut lines = restore_on_lo(host_nl, node, view, &lock, missing).await?;
    lines.extend(restore_on_veths(host_nl, node, view, &lock, short6).await?);
    if !lines.is_empty() {
        crate::bpf::record_change(node, by)?;
        for l in &lines {
            log::info!("node {node} converged ({}): {l}", by.as_str());
        }
    }
    Ok(lines)
}

/// [`restore`]'s IPv4 part: `missing` back on `lo`, with their pods' host routes.
async fn restore_on_lo(
    host_nl: &Netlink,
    node: &NodeId,
    view: &mut NodeView,
    lock: &gateways::GatewayLock,
    missing: Vec<Ipv4Addr>,
) -> Result<Vec<String>, CniError> {
    let mut lines = Vec::new();
    for gw in missing {
        if !lock.is_used(node, gw) {
            continue;
        }
        host_nl
            .ensure_address(LOOPBACK_IFINDEX, host_prefix(gw))
            .await?;
        view.add_loopback(IpAddr::V4(gw));
        let pods = lock.pods_behind(node, gw)?;
        let mut routed = 0;
        for (addr, oif) in &pods {
            let route = crate::veth::host_route(IpAddr::V4(*addr), *oif, Some(IpAddr::V4(gw)));
            match host_nl.ensure_route(&route).await {
                Ok(added) => routed += usize::from(added),
                // The pod's veth is gone: its DEL removes the endpoint after the link.
                Err(e) if link_gone(&e) => {
                    log::debug!("no host route to {addr}: its veth (link {oif}) is gone");
                }
                Err(e) => return Err(e.into()),
            }
        }
        lines.push(format!(
            "gateway {gw} on lo again, with {routed} host route(s) to its {} pod address(es)",
            pods.len()
        ));
    }
    Ok(lines)
}

/// The link a request named is gone (a pod's veth, which its DEL removes before its
/// records).
fn link_gone(e: &crate::netlink::NetlinkError) -> bool {
    e.errno() == Some(libc::ENODEV)
}

/// [`restore`]'s IPv6 part: each gateway of `short` back on the recorded host veths that
/// no longer hold it, and the host routes to those veths' pods with it as their source.
/// The veths that hold it are named from the view's links (no request); only the others
/// are looked up. A recorded veth that does not exist is an ADD between its record and its
/// veth, or a pod whose veth went before its DEL: left alone.
async fn restore_on_veths(
    host_nl: &Netlink,
    node: &NodeId,
    view: &mut NodeView,
    lock: &gateways::GatewayLock,
    short: Vec<Ipv6Addr>,
) -> Result<Vec<String>, CniError> {
    let mut lines = Vec::new();
    for gw in short {
        let holding: Vec<String> = view
            .by_link
            .iter()
            .filter(|(_, a)| *a == IpAddr::V6(gw))
            .filter_map(|(i, _)| crate::netlink::ifname::name_of(*i))
            .collect();
        for id in lock.users6_of(node, gw) {
            let name = crate::veth::host_veth_name_of(id);
            if holding.contains(&name) {
                continue;
            }
            let Some(link) = host_nl.link_by_name(&name).await? else {
                continue;
            };
            if view.holds(link.index, IpAddr::V6(gw)) {
                continue;
            }
            let prefix = IpNetwork::new(IpAddr::V6(gw), 128).expect("/128 is valid");
            match host_nl.ensure_address(link.index, prefix).await {
                Ok(_) => {}
                Err(e) if link_gone(&e) => continue,
                Err(e) => return Err(e.into()),
            }
            view.add_held(link.index, IpAddr::V6(gw));
            let pods = lock.pods_on6(node, link.index)?;
            for a in &pods {
                let route = crate::veth::host_route(IpAddr::V6(*a), link.index, Some(gw.into()));
                match host_nl.replace_route(&route).await {
                    Ok(()) => {}
                    Err(e) if link_gone(&e) => break,
                    Err(e) => return Err(e.into()),
                }
            }
            lines.push(format!(
                "gateway {gw} on {name} again, with the source of its {} host route(s)",
                pods.len()
            ));
        }
    }
    Ok(lines)
}

/// DEL, GC and a failed ADD: attachment `id` uses no gateway any more; the ones nobody
/// uses leave `lo`. Idempotent.
pub async fn release(host_nl: &Netlink, node: &NodeId, id: u64) -> Result<(), CniError> {
    release_after_failed_add(host_nl, node, id, &CreatedDirs::default()).await
}

/// A failed ADD: as [`release`], then the record directories its [`acquire`] created go
/// too while they are empty, under the same lock, so the ADD leaves no empty directory
/// and never touches what another ADD recorded meanwhile.
pub async fn release_after_failed_add(
    host_nl: &Netlink,
    node: &NodeId,
    id: u64,
    created: &CreatedDirs,
) -> Result<(), CniError> {
    if created.is_empty() && !gateways::any_recorded(&crate::bpf::PinRoot::from_env(), node) {
        return Ok(());
    }
    let lock = gateways::GatewayLock::take()?;
    let unused = lock.remove_user(node, id);
    lock.remove_created(created);
    for gw in unused? {
        host_nl
            .delete_address(LOOPBACK_IFINDEX, host_prefix(gw))
            .await?;
    }
    Ok(())
}

/// CHECK: the use is recorded and the node holds the address on `lo`.
pub async fn check(
    host_nl: &Netlink,
    node: &NodeId,
    id: u64,
    gws: &[Ipv4Addr],
) -> Result<(), CniError> {
    if gws.is_empty() {
        return Ok(());
    }
    let held = host_nl.addresses(LOOPBACK_IFINDEX).await?;
    for gw in gws {
        gateways::check_user(node, *gw, id)
            .map_err(|source| GatewayError::NotRecorded { gw: *gw, source })?;
        if !held.contains(&host_prefix(*gw)) {
            return Err(GatewayError::NotOnLo { gw: *gw }.into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_familys_gateways_once_each() {
        let a: IpAddr = "10.1.0.1".parse().unwrap();
        let b: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(
            ipv4([Some(a), None, Some(b), Some(a)]),
            vec!["10.1.0.1".parse::<Ipv4Addr>().unwrap()]
        );
        assert_eq!(
            ipv6([Some(b), Some(a), None, Some(b)]),
            vec!["fd00::1".parse::<Ipv6Addr>().unwrap()]
        );
    }

    #[test]
    fn an_ipv4_address_names_its_ipv4_gateway_only() {
        let (v4, gw4): (IpAddr, IpAddr) =
            ("10.1.0.2".parse().unwrap(), "10.1.0.1".parse().unwrap());
        let (v6, gw6): (IpAddr, IpAddr) = ("fd00::2".parse().unwrap(), "fd00::1".parse().unwrap());
        assert_eq!(of_address(v4, Some(gw4)), Some("10.1.0.1".parse().unwrap()));
        assert_eq!(of_address(v4, None), None);
        assert_eq!(of_address(v6, Some(gw6)), None);
    }
}
