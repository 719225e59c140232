//! Hosts outside a test node: each is its own namespace wired to the node by a veth pair
//! whose node end is an ordinary node device with global addresses (this kernel has no
//! `dummy` links), like an uplink. The host routes everything through the node, so traffic
//! between it and the pods — or another external host — crosses the node.
//!
//! Host number `n` (2..=254) gets `192.168.<n>.0/24` and `fd<n>::/64`: the node end is `.1`
//! / `::1`, the host `.2` / `::2`. Addresses are added without duplicate address detection so
//! IPv6 works at once. Dropping the host deletes its namespace, and with it the veth pair.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{ensure, Context, Result};

use crate::netns::Netns;

/// The host's end of the veth pair.
pub const HOST_IFNAME: &str = "eth0";

#[derive(Debug)]
pub struct ExternalHost {
    netns: Netns,
    node_dev: String,
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
    pub node_v4: Ipv4Addr,
    pub node_v6: Ipv6Addr,
}

impl ExternalHost {
    /// Creates the host and its link `node_dev` in `node` (see the module docs).
    pub fn attach(node: &Netns, node_dev: &str, n: u8) -> Result<Self> {
        ensure!(
            (2..=254).contains(&n),
            "external host number {n} out of 2..=254"
        );
        let netns = Netns::create("p")?;
        let v4 = |h: u8| Ipv4Addr::new(192, 168, n, h);
        let v6 = |h: &str| -> Result<Ipv6Addr> {
            format!("fd{n}::{h}")
                .parse()
                .context("external IPv6 address")
        };
        let host = Self {
            node_dev: node_dev.to_owned(),
            v4: v4(2),
            v6: v6("2")?,
            node_v4: v4(1),
            node_v6: v6("1")?,
            netns,
        };
        node.ip_ok(&[
            "link",
            "add",
            node_dev,
            "type",
            "veth",
            "peer",
            "name",
            HOST_IFNAME,
            "netns",
            host.netns.name(),
        ])?;
        for (ns, dev, a4, a6) in [
            (node, node_dev, host.node_v4, host.node_v6),
            (&host.netns, HOST_IFNAME, host.v4, host.v6),
        ] {
            ns.ip_ok(&["addr", "add", &format!("{a4}/24"), "dev", dev])?;
            ns.ip_ok(&["addr", "add", &format!("{a6}/64"), "dev", dev, "nodad"])?;
            ns.ip_ok(&["link", "set", dev, "up"])?;
        }
        let gw4 = host.node_v4.to_string();
        let gw6 = host.node_v6.to_string();
        host.netns
            .ip_ok(&["-4", "route", "add", "default", "via", &gw4])?;
        host.netns
            .ip_ok(&["-6", "route", "add", "default", "via", &gw6])?;
        Ok(host)
    }

    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// The node device leading to this host.
    pub fn node_dev(&self) -> &str {
        &self.node_dev
    }

    /// The host's address of the same family as `like`.
    pub fn addr_like(&self, like: IpAddr) -> IpAddr {
        if like.is_ipv4() {
            self.v4.into()
        } else {
            self.v6.into()
        }
    }
}
