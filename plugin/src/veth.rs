//! The pod's veth pair, set up much as the reference `ptp` plugin does it: the container
//! side holds the pod's addresses and reaches its gateway on-link; the host side holds the
//! IPv6 gateway as /128 and a host route to each pod address. The IPv4 gateway is held once
//! per node, on `lo` (see `gateway`).

use std::net::IpAddr;

use ipnetwork::IpNetwork;

use crate::{
    bpf::AttachmentKey,
    cni::types::Route,
    netlink::{disable_dad, disable_ipv6, Link, Netlink, NetlinkError, RouteSpec},
    netns::Netns,
};

const HOST_VETH_PREFIX: &str = "ecni";

/// The host-side name, derived from the attachment so DEL finds it without saved state:
/// `ecni` + the top 44 bits of the attachment id in hex (15 characters, the kernel's limit).
pub fn host_veth_name(key: &AttachmentKey<'_>) -> String {
    host_veth_name_of(key.id())
}

/// [`host_veth_name`] of the attachment whose id is `id` (as the node's records name it).
pub fn host_veth_name_of(id: u64) -> String {
    format!("{HOST_VETH_PREFIX}{:011x}", id >> 20)
}

/// One of our pods' host ends (as opposed to a node device).
pub fn is_host_veth(link: &Link) -> bool {
    link.kind.as_deref() == Some("veth")
        && link.name.starts_with(HOST_VETH_PREFIX)
        && link.name.len() == 15
}

/// One address of the pod with the gateway it uses.
#[derive(Debug, Clone)]
pub struct PodAddress {
    pub address: IpNetwork,
    pub gateway: Option<IpAddr>,
}

pub struct VethPair {
    pub host: Link,
    pub container: Link,
}

fn host_prefix(ip: IpAddr) -> IpNetwork {
    IpNetwork::new(ip, if ip.is_ipv4() { 32 } else { 128 }).expect("full-length prefix is valid")
}

/// Creates the pair with the container side named `ifname` directly inside `pod_ns`. With
/// `ipv6` false (the pod gets no IPv6 address), the host side has IPv6 turned off: on a
/// node of thousands of pods that makes each new veth's link-up several times cheaper.
#[allow(
    clippy::too_many_arguments,
    reason = "the two namespaces' handles and the pair's names and settings: one call site, each argument used once"
)]
pub async fn create(
    host_nl: &Netlink,
    pod_nl: &Netlink,
    pod_ns: &Netns,
    host_name: &str,
    ifname: &str,
    mtu: Option<u32>,
    mac: Option<[u8; 6]>,
    ipv6: bool,
) -> Result<VethPair, NetlinkError> {
    // The pod side's MAC is chosen here when the request names none, as the kernel chooses
    // one (random, unicast, locally administered): with the peer's index in the kernel's
    // echo, the pod side is then known without asking for it.
    let mac = mac.or_else(random_mac);
    let echoed = host_nl
        .create_veth(host_name, ifname, pod_ns, mtu, mac)
        .await?;
    // Both ends are still down: no link-local address has been generated yet.
    let dad = |e: std::io::Error| NetlinkError::Sysctl {
        what: format!("disable DAD on {ifname}/{host_name}"),
        source: e,
    };
    if ipv6 {
        disable_dad(host_name).map_err(dad)?;
        // The link-local address's DAD (the pod's own addresses are added with NODAD). Only
        // for IPv6 pods: every pod names its interface alike (eth0), and the kernel finds
        // /proc/sys/net/ipv6/conf/eth0 of this namespace among those of every namespace
        // (~0.5 ms on a node of 2,500 pods).
        let _in_pod = pod_ns.enter()?;
        disable_dad(ifname).map_err(dad)?;
    } else {
        disable_ipv6(host_name).map_err(|e| NetlinkError::Sysctl {
            what: format!("turn IPv6 off on {host_name}"),
            source: e,
        })?;
    }
    // The kernel's echo of the new link is the host side as created (index, MAC, peer);
    // a kernel before 6.1 echoes nothing, and it is asked.
    let host = match echoed {
        Some(l) => l,
        None => host_nl
            .link_by_name(host_name)
            .await?
            .ok_or_else(|| missing(host_name))?,
    };
    let container = match (host.peer_index, mac) {
        (Some(index), Some(mac)) => Link {
            index,
            name: ifname.to_owned(),
            mac: Some(mac),
            mtu: host.mtu,
            up: false,
            oper_up: false,
            kind: host.kind.clone(),
            peer_index: Some(host.index),
            vxlan: None,
        },
        _ => pod_nl
            .link_by_name(ifname)
            .await?
            .ok_or_else(|| missing(ifname))?,
    };
    Ok(VethPair { host, container })
}

/// A random unicast, locally administered MAC (what the kernel's `eth_random_addr` makes);
/// `None` if the kernel gives no random bytes (the kernel then chooses one itself).
fn random_mac() -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    // SAFETY: `mac` is writable for its 6 bytes.
    let n = unsafe { libc::getrandom(mac.as_mut_ptr().cast(), mac.len(), 0) };
    if n != mac.len() as isize {
        return None;
    }
    mac[0] = (mac[0] & 0xfe) | 0x02;
    Some(mac)
}

fn missing(name: &str) -> NetlinkError {
    NetlinkError::Request {
        op: format!("find link {name} right after creating it"),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such link"),
    }
}

/// Container side: addresses, link up, the gateway on-link, the subnet and `routes` via
/// the gateway of the same family.
pub async fn configure_container(
    pod_nl: &Netlink,
    index: u32,
    addrs: &[PodAddress],
    routes: &[Route],
) -> Result<(), NetlinkError> {
    for a in addrs {
        pod_nl.add_address(index, a.address, false).await?;
    }
    pod_nl.set_up(index).await?;
    for a in addrs {
        let Some(gw) = a.gateway else { continue };
        pod_nl
            .add_route(&RouteSpec {
                dst: host_prefix(gw),
                gw: None,
                oif: index,
                scope_link: true,
                src: None,
                options: Default::default(),
            })
            .await?;
        let subnet = IpNetwork::new(a.address.network(), a.address.prefix())
            .expect("prefix from a valid network");
        pod_nl
            .add_route(&RouteSpec {
                dst: subnet,
                gw: Some(gw),
                oif: index,
                scope_link: false,
                src: Some(a.address.ip()),
                options: Default::default(),
            })
            .await?;
    }
    for r in routes {
        let gw = r.gw.or_else(|| {
            addrs
                .iter()
                .find(|a| a.address.is_ipv4() == r.dst.is_ipv4())
                .and_then(|a| a.gateway)
        });
        pod_nl
            .add_route(&RouteSpec {
                dst: r.dst,
                gw,
                oif: index,
                scope_link: false,
                src: None,
                options: r.options,
            })
            .await?;
    }
    Ok(())
}

/// Host side, still down: each IPv6 gateway as a /128 (the node holds IPv4 gateways once,
/// on `lo`: see `gateway`). Before the node's addresses are read, which include them. A
/// STATUS may have put one there first, from the ADD's record of it (`gateway::restore`).
pub async fn add_host_gateways(
    host_nl: &Netlink,
    index: u32,
    addrs: &[PodAddress],
) -> Result<(), NetlinkError> {
    for a in addrs {
        if let Some(gw @ IpAddr::V6(_)) = a.gateway {
            host_nl.ensure_address(index, host_prefix(gw)).await?;
        }
    }
    Ok(())
}

/// Host side, once the programs are on it: link up, a host route to each pod address with
/// its gateway as the source.
pub async fn bring_up_host(
    host_nl: &Netlink,
    index: u32,
    addrs: &[PodAddress],
) -> Result<(), NetlinkError> {
    host_nl.set_up(index).await?;
    for a in addrs {
        host_nl
            .ensure_route(&host_route(a.address.ip(), index, a.gateway))
            .await?;
    }
    Ok(())
}

/// The node's route to pod address `addr`: on-link out of its host veth `oif`, with the
/// pod's gateway `src` as source (ADD's, and STATUS's when it puts one back).
pub fn host_route(addr: IpAddr, oif: u32, src: Option<IpAddr>) -> RouteSpec {
    RouteSpec {
        dst: host_prefix(addr),
        gw: None,
        oif,
        scope_link: true,
        src,
        options: Default::default(),
    }
}

/// Returns once the pod side can send. The side brought up first (the pod's) gets its
/// carrier only when the host side comes up, and the kernel activates its transmit queue
/// later, from its link-watch worker: until then whatever the pod sends is dropped, the
/// ARP reply to the node's first request among them (the node asks again a second later).
/// Asking for the link runs that pending work at once on Linux 6.8+; an older kernel is
/// asked until the worker has run, for at most [`SETTLE_LIMIT`] (then ADD goes on).
pub async fn await_container_side(pod_nl: &Netlink, index: u32) -> Result<(), NetlinkError> {
    let started = std::time::Instant::now();
    while !pod_nl
        .link_by_index(index)
        .await?
        .ok_or_else(|| missing(&format!("{index}")))?
        .oper_up
    {
        if started.elapsed() >= SETTLE_LIMIT {
            log::warn!(
                "the pod side (link {index}) is still not operationally up after {SETTLE_LIMIT:?}; going on"
            );
            break;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    Ok(())
}

/// How long ADD waits for the kernel to activate the pod side (see
/// [`await_container_side`]).
const SETTLE_LIMIT: std::time::Duration = std::time::Duration::from_millis(250);

#[cfg(test)]
mod tests {
    use super::*;

    fn name(network: &str, container_id: &str, ifname: &str) -> String {
        host_veth_name(&AttachmentKey {
            network,
            container_id,
            ifname,
        })
    }

    #[test]
    fn host_names_are_deterministic_and_distinct() {
        let a = name("net", "c1", "eth0");
        assert_eq!(a, name("net", "c1", "eth0"));
        assert_eq!(a.len(), 15);
        assert!(a.starts_with("ecni"));
        assert_ne!(a, name("net", "c1", "eth1"));
        assert_ne!(a, name("net2", "c1", "eth0"));
        // The separator keeps ("ab","c") and ("a","bc") apart.
        assert_ne!(name("ab", "c", "e"), name("a", "bc", "e"));
    }

    #[test]
    fn chosen_macs_are_unicast_locally_administered_and_random() {
        let macs: Vec<[u8; 6]> = (0..64).map(|_| random_mac().expect("getrandom")).collect();
        for m in &macs {
            assert_eq!(m[0] & 0x01, 0, "{m:02x?} is multicast");
            assert_eq!(m[0] & 0x02, 0x02, "{m:02x?} is not locally administered");
        }
        let mut distinct = macs.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), macs.len(), "64 random MACs repeat one");
    }
}
