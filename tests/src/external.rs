//! Hosts outside a test node: each is its own namespace wired to the node by a veth pair
//! whose node end is an ordinary node device with global addresses (this kernel has no
//! `dummy` links), like an uplink. The host routes everything through the node, so traffic
//! between it and the pods — or another external host — crosses the node.
//!
//! Host number `n` (2..=254) gets `192.168.<n>.0/24` and `fd<n>::/64`: the node end is `.1`
//! / `::1`, the host `.2` / `::2`. Addresses are added without duplicate address detection so
//! IPv6 works at once. Dropping the host deletes its namespace, and with it the veth pair.
//!
//! [`ExternalHost::builder`] puts the node's addresses on the kinds of uplink nodes have
//! instead of the veth itself: a bond (802.3ad, the veth its one port), a bridge (the veth
//! its one port), a VLAN (on the veth, or on the bond), each matched on the host's side
//! (a bond of its own, the same VLAN id; behind a bridge the host is a plain end).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use crate::netns::Netns;

/// The host's end of the veth pair.
pub const HOST_IFNAME: &str = "eth0";

#[derive(Debug)]
pub struct ExternalHost {
    netns: Netns,
    node_dev: String,
    host_dev: String,
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
    pub node_v4: Ipv4Addr,
    pub node_v6: Ipv6Addr,
}

/// The device under the node's addresses (see [`ExternalHost::builder`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Master {
    /// A bond in 802.3ad (LACP) mode, the host's end a bond too.
    Bond,
    /// A bridge; the host's end stays a plain device.
    Bridge,
}

impl Master {
    fn kind(self) -> &'static str {
        match self {
            Self::Bond => "bond",
            Self::Bridge => "bridge",
        }
    }
}

/// How an [`ExternalHost`] is wired to the node: by default a plain veth pair.
#[derive(Debug, Clone)]
pub struct ExternalHostBuilder {
    node_dev: String,
    n: u8,
    master: Option<Master>,
    vlan: Option<u16>,
}

impl ExternalHostBuilder {
    /// The node's end (and the host's) is a bond with the veth as its port.
    pub fn bond(mut self) -> Self {
        self.master = Some(Master::Bond);
        self
    }

    /// The node's end is a bridge with the veth as its port.
    pub fn bridge(mut self) -> Self {
        self.master = Some(Master::Bridge);
        self
    }

    /// The addresses are on VLAN `id` (over the bond or bridge if any), on both ends.
    pub fn vlan(mut self, id: u16) -> Self {
        self.vlan = Some(id);
        self
    }

    /// Creates the host and its link in `node`; the node's addressed device is named
    /// `node_dev` whatever it is.
    pub fn attach(self, node: &Netns) -> Result<ExternalHost> {
        let n = self.n;
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
        // The node's and the host's stacks, bottom up: the veth ends, then a master, then a
        // VLAN; the last of each holds the addresses.
        let plain = self.master.is_none() && self.vlan.is_none();
        let node_veth = if plain {
            self.node_dev.clone()
        } else {
            format!("ext{n}")
        };
        node.ip_ok(&[
            "link",
            "add",
            &node_veth,
            "type",
            "veth",
            "peer",
            "name",
            HOST_IFNAME,
            "netns",
            netns.name(),
        ])?;
        let mut node_top = node_veth.clone();
        let mut host_top = HOST_IFNAME.to_owned();
        if let Some(m) = self.master {
            let name = if self.vlan.is_some() {
                format!("{}{n}", m.kind())
            } else {
                self.node_dev.clone()
            };
            add_master(node, m, &name, &node_veth)?;
            node_top = name;
            if m == Master::Bond {
                add_master(&netns, m, "bond0", HOST_IFNAME)?;
                host_top = "bond0".to_owned();
            }
        }
        if let Some(id) = self.vlan {
            let id = id.to_string();
            for (ns, lower, name) in [
                (node, node_top.clone(), self.node_dev.clone()),
                (&netns, host_top.clone(), format!("{host_top}.{id}")),
            ] {
                ns.ip_ok(&[
                    "link", "add", "link", &lower, "name", &name, "type", "vlan", "id", &id,
                ])?;
                ns.ip_ok(&["link", "set", &lower, "up"])?;
            }
            node_top = self.node_dev.clone();
            host_top = format!("{host_top}.{id}");
        }
        ensure!(
            node_top == self.node_dev,
            "the node's addressed device is {node_top}"
        );
        let host = ExternalHost {
            node_dev: self.node_dev,
            host_dev: host_top,
            v4: v4(2),
            v6: v6("2")?,
            node_v4: v4(1),
            node_v6: v6("1")?,
            netns,
        };
        for (ns, dev, a4, a6) in [
            (node, host.node_dev.as_str(), host.node_v4, host.node_v6),
            (&host.netns, host.host_dev.as_str(), host.v4, host.v6),
        ] {
            ns.ip_ok(&["addr", "add", &format!("{a4}/24"), "dev", dev])?;
            ns.ip_ok(&["addr", "add", &format!("{a6}/64"), "dev", dev, "nodad"])?;
            ns.ip_ok(&["link", "set", dev, "up"])?;
        }
        if !plain {
            node.ip_ok(&["link", "set", &node_veth, "up"])?;
            host.netns.ip_ok(&["link", "set", HOST_IFNAME, "up"])?;
        }
        let gw4 = host.node_v4.to_string();
        let gw6 = host.node_v6.to_string();
        host.netns
            .ip_ok(&["-4", "route", "add", "default", "via", &gw4])?;
        host.netns
            .ip_ok(&["-6", "route", "add", "default", "via", &gw6])?;
        if !plain {
            host.wait_until_it_carries()?;
        }
        Ok(host)
    }
}

/// A bond (802.3ad, fast LACP) or bridge `name` in `ns` with `port` as its one port.
fn add_master(ns: &Netns, m: Master, name: &str, port: &str) -> Result<()> {
    match m {
        Master::Bond => ns.ip_ok(&[
            "link",
            "add",
            name,
            "type",
            "bond",
            "mode",
            "802.3ad",
            "lacp_rate",
            "fast",
            "miimon",
            "100",
        ])?,
        Master::Bridge => ns.ip_ok(&["link", "add", name, "type", "bridge"])?,
    };
    ns.ip_ok(&["link", "set", port, "down"])?;
    ns.ip_ok(&["link", "set", port, "master", name])?;
    ns.ip_ok(&["link", "set", name, "up"])?;
    Ok(())
}

/// Whether this kernel can make uplinks of `kind` (`bond`, `bridge`, `vlan`): the host
/// kernel of a machine may have neither bonding nor 802.1Q (and no modules to load).
pub fn kernel_has_link_kind(kind: &str) -> bool {
    let Ok(ns) = Netns::create("p") else {
        return false;
    };
    let made = if kind == "vlan" {
        ns.ip_ok(&[
            "link", "add", "probe0", "type", "veth", "peer", "name", "probe1",
        ])
        .and_then(|_| {
            ns.ip_ok(&[
                "link", "add", "link", "probe0", "name", "probe0.9", "type", "vlan", "id", "9",
            ])
        })
    } else {
        ns.ip_ok(&["link", "add", "probe0", "type", kind])
    };
    made.is_ok()
}

impl ExternalHost {
    /// Creates the host and its link `node_dev` in `node` (see the module docs).
    pub fn attach(node: &Netns, node_dev: &str, n: u8) -> Result<Self> {
        Self::builder(node_dev, n).attach(node)
    }

    /// Host number `n` behind the node's device `node_dev`, a plain veth unless the
    /// builder says otherwise.
    pub fn builder(node_dev: &str, n: u8) -> ExternalHostBuilder {
        ExternalHostBuilder {
            node_dev: node_dev.to_owned(),
            n,
            master: None,
            vlan: None,
        }
    }

    /// Waits until the host reaches the node over both families (a bond's LACP must agree
    /// first: ports that are not yet collecting and distributing drop what they get).
    fn wait_until_it_carries(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        for node in [self.node_v4.to_string(), self.node_v6.to_string()] {
            loop {
                let ok = self
                    .netns
                    .exec(&["ping", "-c", "1", "-W", "1", &node])
                    .is_ok_and(|o| o.status.success());
                if ok {
                    break;
                }
                if Instant::now() > deadline {
                    bail!(
                        "external host: {node} not reachable over {} after 60 s",
                        self.node_dev
                    );
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Ok(())
    }

    /// The host's device holding its addresses (`eth0`, or its bond or VLAN).
    pub fn host_dev(&self) -> &str {
        &self.host_dev
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

    /// A host behind this one, which routes for it (forwarding on) over a link of MTU
    /// `mtu` on its own side, as a router towards a narrower network: the far host gets
    /// `172.31.<n>.2/24` and, where the link can carry IPv6 (`mtu` ≥ 1280),
    /// `fd31:<n>::2/64`, this host `.1` / `::1` on that link; `node` routes both prefixes
    /// through this host. Returns once the far host reaches the node's addresses (until the
    /// new links' own IPv6 addresses pass duplicate address detection, the router's
    /// neighbour solicitations towards the node go unanswered).
    pub fn far_host(&self, node: &Netns, mtu: u16) -> Result<FarHost> {
        let n = self.v4.octets()[2];
        let far = Netns::create("p")?;
        let v6 = mtu >= 1280;
        let r = &self.netns;
        let mtu = mtu.to_string();
        r.ip_ok(&[
            "link",
            "add",
            "r1",
            "mtu",
            &mtu,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            far.name(),
        ])?;
        let (router4, far4) = (Ipv4Addr::new(172, 31, n, 1), Ipv4Addr::new(172, 31, n, 2));
        let (router6, far6): (Ipv6Addr, Ipv6Addr) = (
            format!("fd31:{n}::1").parse()?,
            format!("fd31:{n}::2").parse()?,
        );
        r.ip_ok(&["addr", "add", &format!("{router4}/24"), "dev", "r1"])?;
        far.ip_ok(&["addr", "add", &format!("{far4}/24"), "dev", "eth0"])?;
        if v6 {
            r.ip_ok(&[
                "addr",
                "add",
                &format!("{router6}/64"),
                "dev",
                "r1",
                "nodad",
            ])?;
            far.ip_ok(&["addr", "add", &format!("{far6}/64"), "dev", "eth0", "nodad"])?;
        }
        r.ip_ok(&["link", "set", "r1", "up"])?;
        for key in ["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"] {
            let out = r.exec(&["sysctl", "-w", key])?;
            ensure!(out.status.success(), "{key}: {out:?}");
        }
        for dev in ["eth0", "lo"] {
            far.ip_ok(&["link", "set", dev, "up"])?;
        }
        far.ip_ok(&["-4", "route", "add", "default", "via", &router4.to_string()])?;
        node.ip_ok(&[
            "route",
            "add",
            &format!("172.31.{n}.0/24"),
            "via",
            &self.v4.to_string(),
        ])?;
        let mut node_addrs = vec![self.node_v4.to_string()];
        if v6 {
            far.ip_ok(&["-6", "route", "add", "default", "via", &router6.to_string()])?;
            node.ip_ok(&[
                "route",
                "add",
                &format!("fd31:{n}::/64"),
                "via",
                &self.v6.to_string(),
            ])?;
            node_addrs.push(self.node_v6.to_string());
        }
        for to in node_addrs {
            let reached = (0..20).any(|_| {
                far.exec(&["ping", "-c1", "-W1", &to])
                    .is_ok_and(|o| o.status.success())
            });
            ensure!(reached, "the far host never reached the node's {to}");
        }
        Ok(FarHost {
            netns: far,
            v4: far4,
            v6: v6.then_some(far6),
        })
    }
}

/// A host behind an external host (see [`ExternalHost::far_host`]).
#[derive(Debug)]
pub struct FarHost {
    pub netns: Netns,
    pub v4: Ipv4Addr,
    /// None where the link to it is too narrow for IPv6.
    pub v6: Option<Ipv6Addr>,
}
