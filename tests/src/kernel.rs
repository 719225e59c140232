//! Reading links, addresses, routes and sysctls of a namespace from `ip -j` output, so
//! tests assert on the kernel's state rather than on what the plugin claims.

use std::net::IpAddr;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::netns::Netns;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: &IpAddr) -> Self {
        if ip.is_ipv4() {
            Self::V4
        } else {
            Self::V6
        }
    }

    fn flag(self) -> &'static str {
        match self {
            Self::V4 => "-4",
            Self::V6 => "-6",
        }
    }

    /// Prefix length of a host route.
    pub fn host_prefix(self) -> u8 {
        match self {
            Self::V4 => 32,
            Self::V6 => 128,
        }
    }
}

/// One entry of `ip -j link`.
#[derive(Debug, Clone, Deserialize)]
pub struct Link {
    pub ifindex: u32,
    pub ifname: String,
    #[serde(default)]
    pub flags: Vec<String>,
    pub mtu: u32,
    #[serde(default)]
    pub operstate: String,
    #[serde(default)]
    pub link_type: String,
    /// MAC address.
    #[serde(default)]
    pub address: Option<String>,
    /// Set when the peer (veth) lives in another namespace.
    #[serde(default)]
    pub link_netnsid: Option<i64>,
    #[serde(default)]
    pub addr_info: Vec<AddrInfo>,
}

impl Link {
    /// Administratively up (`UP` flag).
    pub fn is_up(&self) -> bool {
        self.flags.iter().any(|f| f == "UP")
    }

    /// Addresses of one family (only filled by [`addrs`]).
    pub fn addrs(&self, family: Family) -> impl Iterator<Item = &AddrInfo> {
        let name = match family {
            Family::V4 => "inet",
            Family::V6 => "inet6",
        };
        self.addr_info.iter().filter(move |a| a.family == name)
    }

    /// Whether `ip/prefix` is configured on this link (only with [`addrs`] output).
    pub fn has_addr(&self, ip: IpAddr, prefix: u8) -> bool {
        self.addr_info
            .iter()
            .any(|a| a.ip() == Some(ip) && a.prefixlen == prefix)
    }
}

/// One address from `ip -j addr`.
#[derive(Debug, Clone, Deserialize)]
pub struct AddrInfo {
    pub family: String,
    pub local: String,
    pub prefixlen: u8,
    #[serde(default)]
    pub scope: String,
    #[serde(default)]
    pub tentative: bool,
}

impl AddrInfo {
    pub fn ip(&self) -> Option<IpAddr> {
        self.local.parse().ok()
    }
}

/// One route of the main table (`ip -j route`).
#[derive(Debug, Clone, Deserialize)]
pub struct Route {
    /// `default`, a bare address for host routes, or `addr/len`.
    pub dst: String,
    #[serde(default)]
    pub gateway: Option<String>,
    #[serde(default)]
    pub dev: Option<String>,
    #[serde(default)]
    pub scope: Option<String>,
    #[serde(default)]
    pub protocol: Option<String>,
    #[serde(default)]
    pub prefsrc: Option<String>,
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub flags: Vec<String>,
    #[serde(skip)]
    pub family: Option<Family>,
}

impl Route {
    /// The destination as (network, prefix length).
    pub fn dst_net(&self) -> Option<(IpAddr, u8)> {
        let family = self.family?;
        if self.dst == "default" {
            let any: IpAddr = match family {
                Family::V4 => "0.0.0.0".parse().ok()?,
                Family::V6 => "::".parse().ok()?,
            };
            return Some((any, 0));
        }
        match self.dst.split_once('/') {
            Some((a, l)) => Some((a.parse().ok()?, l.parse().ok()?)),
            None => Some((self.dst.parse().ok()?, family.host_prefix())),
        }
    }

    pub fn gateway_ip(&self) -> Option<IpAddr> {
        self.gateway.as_deref()?.parse().ok()
    }

    pub fn is_default(&self) -> bool {
        self.dst_net().is_some_and(|(_, l)| l == 0)
    }

    /// A host route (/32, /128) to exactly `ip`.
    pub fn is_host_route_to(&self, ip: IpAddr) -> bool {
        self.dst_net() == Some((ip, Family::of(&ip).host_prefix()))
    }

    pub fn dev_is(&self, dev: &str) -> bool {
        self.dev.as_deref() == Some(dev)
    }

    /// `dst [via gw] dev d [scope s]`, like `ip route`, for messages.
    pub fn describe(&self) -> String {
        let mut s = self.dst.clone();
        if let Some(g) = &self.gateway {
            s += &format!(" via {g}");
        }
        if let Some(d) = &self.dev {
            s += &format!(" dev {d}");
        }
        if let Some(sc) = &self.scope {
            s += &format!(" scope {sc}");
        }
        s
    }
}

fn ip_json<T: for<'de> Deserialize<'de>>(ns: &Netns, args: &[&str]) -> Result<T> {
    let mut full = vec!["-j"];
    full.extend_from_slice(args);
    let out = ns.ip(&full)?;
    if !out.status.success() {
        bail!(
            "`ip -n {} {}` failed: {}",
            ns.name(),
            full.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // `ip -j` prints nothing at all for an empty list on some versions.
    let text = if text.trim().is_empty() {
        "[]"
    } else {
        text.trim()
    };
    serde_json::from_str(text).with_context(|| {
        format!(
            "parsing `ip -j {}` in {}: {text}",
            args.join(" "),
            ns.name()
        )
    })
}

/// All links of the namespace (without addresses).
pub fn links(ns: &Netns) -> Result<Vec<Link>> {
    ip_json(ns, &["link", "show"])
}

/// One link by name, if it exists.
pub fn link(ns: &Netns, name: &str) -> Result<Option<Link>> {
    Ok(links(ns)?.into_iter().find(|l| l.ifname == name))
}

/// The queues a link was created with, `(transmit, receive)` (`ip -d -j link`:
/// `num_tx_queues`, `num_rx_queues`, what the device allocated, not how many it uses).
pub fn link_queues(ns: &Netns, name: &str) -> Result<(u32, u32)> {
    #[derive(Deserialize)]
    struct Queues {
        num_tx_queues: u32,
        num_rx_queues: u32,
    }
    let links: Vec<Queues> = ip_json(ns, &["-d", "link", "show", "dev", name])?;
    let q = links
        .first()
        .with_context(|| format!("no link {name} in {}", ns.name()))?;
    Ok((q.num_tx_queues, q.num_rx_queues))
}

/// All links with their addresses (`ip -j addr`).
pub fn addrs(ns: &Netns) -> Result<Vec<Link>> {
    ip_json(ns, &["addr", "show"])
}

/// One link with its addresses.
pub fn link_addrs(ns: &Netns, name: &str) -> Result<Option<Link>> {
    Ok(addrs(ns)?.into_iter().find(|l| l.ifname == name))
}

/// Names of the links that carry a `clsact` qdisc (`tc -j qdisc show`), sorted.
pub fn clsact_links(ns: &Netns) -> Result<Vec<String>> {
    let out = ns.exec(&["tc", "-j", "qdisc", "show"])?;
    if !out.status.success() {
        bail!(
            "`tc -j qdisc show` in {} failed: {}",
            ns.name(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let text = if text.trim().is_empty() {
        "[]"
    } else {
        text.trim()
    };
    let qdiscs: Vec<serde_json::Value> = serde_json::from_str(text)
        .with_context(|| format!("parsing `tc -j qdisc show` in {}: {text}", ns.name()))?;
    let mut v: Vec<String> = qdiscs
        .iter()
        .filter(|q| q["kind"] == "clsact")
        .filter_map(|q| q["dev"].as_str().map(str::to_owned))
        .collect();
    v.sort();
    Ok(v)
}

/// The main routing table of one family.
pub fn routes(ns: &Netns, family: Family) -> Result<Vec<Route>> {
    let mut routes: Vec<Route> = ip_json(ns, &[family.flag(), "route", "show"])?;
    for r in &mut routes {
        r.family = Some(family);
    }
    Ok(routes)
}

/// Both families' main tables.
pub fn all_routes(ns: &Netns) -> Result<Vec<Route>> {
    let mut r = routes(ns, Family::V4)?;
    r.extend(routes(ns, Family::V6)?);
    Ok(r)
}
