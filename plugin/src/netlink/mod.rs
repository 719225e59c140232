//! Typed netlink calls (links, addresses, routes) over rtnetlink, one socket per namespace;
//! the node's addresses and `clsact` qdiscs also synchronously (`addrs`, `tc`).
//!
//! A socket belongs to the namespace it was created in, so `Netlink::connect_in` enters the
//! target namespace only for the socket's creation. Every request asks for an ACK; deleting
//! something already gone is `Ok(false)`, so DEL stays idempotent.

use std::net::IpAddr;

use futures::TryStreamExt;
use ipnetwork::IpNetwork;
use rtnetlink::{
    packet_route::{
        address::{AddressAttribute, AddressFlags, AddressMessage},
        link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage},
        route::{RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteScope},
        AddressFamily,
    },
    Handle, LinkMessageBuilder, LinkUnspec, RouteMessageBuilder,
};

use crate::netns::{Netns, NetnsError};

pub mod addrs;
pub mod events;
pub mod ifname;
mod raw;
pub mod sockets;
pub mod tc;

#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("failed to open a netlink socket")]
    Connect(#[source] std::io::Error),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("netlink: failed to {op}")]
    Request {
        op: String,
        #[source]
        source: rtnetlink::Error,
    },
    #[error("netlink: failed to list the addresses")]
    Addresses(#[source] std::io::Error),
    #[error("failed to {what}")]
    Sysctl {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid route {dst}: {reason}")]
    InvalidRoute { dst: IpNetwork, reason: String },
}

impl NetlinkError {
    /// The kernel's errno for a failed request, if it sent one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Request {
                source: rtnetlink::Error::NetlinkError(m),
                ..
            } => m.code.map(|c| -c.get()),
            _ => None,
        }
    }
}

fn req(op: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetlinkError {
    let op = op.into();
    move |source| NetlinkError::Request { op, source }
}

/// What we read back about a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mac: Option<[u8; 6]>,
    pub mtu: u32,
    pub up: bool,
    pub kind: Option<String>,
    /// IFLA_LINK: for a veth, the peer's index (in the peer's namespace).
    pub peer_index: Option<u32>,
}

impl Link {
    fn from_msg(m: &LinkMessage) -> Self {
        let mut l = Link {
            index: m.header.index,
            name: String::new(),
            mac: None,
            mtu: 0,
            up: m.header.flags.contains(LinkFlags::Up),
            kind: None,
            peer_index: None,
        };
        for a in &m.attributes {
            match a {
                LinkAttribute::IfName(n) => l.name = n.clone(),
                LinkAttribute::Address(b) if b.len() == 6 => {
                    l.mac = Some(b[..6].try_into().expect("6 bytes"))
                }
                LinkAttribute::Mtu(v) => l.mtu = *v,
                LinkAttribute::Link(i) => l.peer_index = Some(*i),
                LinkAttribute::LinkInfo(infos) => {
                    for i in infos {
                        if let LinkInfo::Kind(k) = i {
                            l.kind = Some(k.to_string());
                        }
                    }
                }
                _ => {}
            }
        }
        l
    }
}

/// A route as read from the kernel (main table only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteEntry {
    pub dst: IpNetwork,
    pub gw: Option<IpAddr>,
    pub oif: Option<u32>,
    pub scope_link: bool,
}

/// A route to install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    pub dst: IpNetwork,
    pub gw: Option<IpAddr>,
    pub oif: u32,
    pub scope_link: bool,
    pub src: Option<IpAddr>,
}

pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn route_addr(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v) => Some(IpAddr::V4(*v)),
        RouteAddress::Inet6(v) => Some(IpAddr::V6(*v)),
        _ => None,
    }
}

pub struct Netlink {
    handle: Handle,
}

impl Netlink {
    /// A socket in the calling thread's namespace. Must run inside the tokio runtime.
    pub fn connect() -> Result<Self, NetlinkError> {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(NetlinkError::Connect)?;
        tokio::spawn(conn);
        Ok(Self { handle })
    }

    /// A socket in `ns`; the calling thread stays where it was.
    pub fn connect_in(ns: &Netns) -> Result<Self, NetlinkError> {
        let _guard = ns.enter()?;
        Self::connect()
    }

    pub async fn link_by_name(&self, name: &str) -> Result<Option<Link>, NetlinkError> {
        let mut s = self
            .handle
            .link()
            .get()
            .match_name(name.to_owned())
            .execute();
        match s.try_next().await {
            Ok(m) => Ok(m.as_ref().map(Link::from_msg)),
            Err(e) if is_errno(&e, libc::ENODEV) => Ok(None),
            Err(e) => Err(req(format!("get link {name}"))(e)),
        }
    }

    pub async fn link_by_index(&self, index: u32) -> Result<Option<Link>, NetlinkError> {
        let mut s = self.handle.link().get().match_index(index).execute();
        match s.try_next().await {
            Ok(m) => Ok(m.as_ref().map(Link::from_msg)),
            Err(e) if is_errno(&e, libc::ENODEV) => Ok(None),
            Err(e) => Err(req(format!("get link {index}"))(e)),
        }
    }

    /// Names of the programs of the `bpf` filters on a link's ingress or egress hook.
    pub async fn bpf_filters(
        &self,
        index: u32,
        ingress: bool,
    ) -> Result<Vec<String>, NetlinkError> {
        use rtnetlink::packet_route::tc::{TcAttribute, TcFilterBpfOption, TcOption};
        let mut h = self.handle.traffic_filter(index as i32);
        let r = h.get();
        let r = if ingress { r.ingress() } else { r.egress() };
        let mut s = r.execute();
        let mut out = Vec::new();
        while let Some(m) = s
            .try_next()
            .await
            .map_err(req(format!("list tc filters of link {index}")))?
        {
            for a in &m.attributes {
                if let TcAttribute::Options(opts) = a {
                    for o in opts {
                        if let TcOption::Bpf(TcFilterBpfOption::ProgName(n)) = o {
                            // The kernel reports "<prog name>" or "<prog name>:[…]" by loader.
                            out.push(n.split(':').next().unwrap_or(n).to_owned());
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Creates a veth pair: `host` here, `peer` created straight inside `peer_ns`. Asks the
    /// kernel to echo the new link (`NLM_F_ECHO`, honoured for a new link since Linux 6.1):
    /// the host side as created, or `None` from a kernel that does not echo it.
    pub async fn create_veth(
        &self,
        host: &str,
        peer: &str,
        peer_ns: &Netns,
        mtu: Option<u32>,
        peer_mac: Option<[u8; 6]>,
    ) -> Result<Option<Link>, NetlinkError> {
        use rtnetlink::packet_core::{
            NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_ECHO, NLM_F_EXCL,
            NLM_F_REQUEST,
        };
        use rtnetlink::packet_route::RouteNetlinkMessage;
        // One queue each way on both ends, asked for at creation: the one queue a veth
        // uses by default. Unasked, a recent kernel allocates one per possible CPU, then
        // cuts each end to one, and each cut waits for an expedited RCU grace period with
        // the RTNL lock held (two per ADD, every other link change of the node waiting).
        let one_queue = [LinkAttribute::NumTxQueues(1), LinkAttribute::NumRxQueues(1)];
        let mut p = LinkUnspec::new_with_name(peer).setns_by_fd(peer_ns.raw_fd());
        for a in &one_queue {
            p = p.append_extra_attribute(a.clone());
        }
        if let Some(m) = mtu {
            p = p.mtu(m);
        }
        if let Some(mac) = peer_mac {
            p = p.address(mac.to_vec());
        }
        let mut h = LinkMessageBuilder::<LinkUnspec>::new_with_info_kind(InfoKind::Veth)
            .name(host.to_owned())
            .set_info_data(InfoData::Veth(InfoVeth::Peer(p.build())));
        for a in one_queue {
            h = h.append_extra_attribute(a);
        }
        if let Some(m) = mtu {
            h = h.mtu(m);
        }
        let err = |e| req(format!("create veth pair {host} / {peer}"))(e);
        let mut msg = NetlinkMessage::from(RouteNetlinkMessage::NewLink(h.build()));
        msg.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE | NLM_F_ECHO;
        let mut answers = self.handle.clone().request(msg).map_err(err)?;
        let mut echoed = None;
        while let Some(m) = futures::StreamExt::next(&mut answers).await {
            match m.payload {
                NetlinkPayload::Error(e) => return Err(err(rtnetlink::Error::NetlinkError(e))),
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l))
                    if l.attributes
                        .iter()
                        .any(|a| matches!(a, LinkAttribute::IfName(n) if n == host)) =>
                {
                    echoed = Some(Link::from_msg(&l));
                }
                _ => {}
            }
        }
        Ok(echoed)
    }

    pub async fn set_up(&self, index: u32) -> Result<(), NetlinkError> {
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(index).up().build())
            .execute()
            .await
            .map_err(req(format!("set link {index} up")))
    }

    /// `Ok(false)` when the link was already gone.
    pub async fn delete_link(&self, index: u32) -> Result<bool, NetlinkError> {
        match self.handle.link().del(index).execute().await {
            Ok(()) => Ok(true),
            Err(e) if is_errno(&e, libc::ENODEV) => Ok(false),
            Err(e) => Err(req(format!("delete link {index}"))(e)),
        }
    }

    /// Adds an address without duplicate address detection (the pod's addresses are
    /// allocated, not guessed) and without the automatic prefix route (we install the
    /// routes we want ourselves).
    pub async fn add_address(
        &self,
        index: u32,
        addr: IpNetwork,
        prefix_route: bool,
    ) -> Result<(), NetlinkError> {
        let mut r = self.handle.address().add(index, addr.ip(), addr.prefix());
        let mut flags = AddressFlags::Nodad;
        if !prefix_route {
            flags |= AddressFlags::Noprefixroute;
        }
        r.message_mut()
            .attributes
            .push(AddressAttribute::Flags(flags));
        r.execute()
            .await
            .map_err(req(format!("add address {addr} to link {index}")))
    }

    /// [`Self::add_address`] where the address may be there already (`Ok(false)` then).
    pub async fn ensure_address(&self, index: u32, addr: IpNetwork) -> Result<bool, NetlinkError> {
        match self.add_address(index, addr, false).await {
            Ok(()) => Ok(true),
            Err(e) if e.errno() == Some(libc::EEXIST) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Removes an address from a link; `Ok(false)` when it was not there.
    pub async fn delete_address(&self, index: u32, addr: IpNetwork) -> Result<bool, NetlinkError> {
        let mut m = AddressMessage::default();
        m.header.family = if addr.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        m.header.prefix_len = addr.prefix();
        m.header.index = index;
        if addr.is_ipv4() {
            m.attributes.push(AddressAttribute::Local(addr.ip()));
        }
        m.attributes.push(AddressAttribute::Address(addr.ip()));
        match self.handle.address().del(m).execute().await {
            Ok(()) => Ok(true),
            Err(e) if is_errno(&e, libc::EADDRNOTAVAIL) || is_errno(&e, libc::ENOENT) => Ok(false),
            Err(e) => Err(req(format!("delete address {addr} from link {index}"))(e)),
        }
    }

    pub async fn addresses(&self, index: u32) -> Result<Vec<IpNetwork>, NetlinkError> {
        let mut s = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute();
        let mut out = Vec::new();
        while let Some(m) = s
            .try_next()
            .await
            .map_err(req(format!("list addresses of link {index}")))?
        {
            if m.header.index != index {
                continue;
            }
            for a in &m.attributes {
                if let AddressAttribute::Address(ip) = a {
                    if let Ok(n) = IpNetwork::new(*ip, m.header.prefix_len) {
                        out.push(n);
                    }
                }
            }
        }
        Ok(out)
    }

    pub async fn add_route(&self, r: &RouteSpec) -> Result<(), NetlinkError> {
        fn invalid(dst: IpNetwork) -> impl Fn(&dyn std::fmt::Display) -> NetlinkError {
            move |e| NetlinkError::InvalidRoute {
                dst,
                reason: e.to_string(),
            }
        }
        let mut b = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(r.dst.network(), r.dst.prefix())
            .map_err(|e| invalid(r.dst)(&e))?
            .output_interface(r.oif);
        if let Some(gw) = r.gw {
            b = b.gateway(gw).map_err(|e| invalid(r.dst)(&e))?;
        }
        if let Some(src) = r.src {
            b = b.pref_source(src).map_err(|e| invalid(r.dst)(&e))?;
        }
        if r.scope_link {
            b = b.scope(RouteScope::Link);
        }
        let what = match r.gw {
            Some(gw) => format!("add route {} via {gw} dev {}", r.dst, r.oif),
            None => format!("add route {} dev {}", r.dst, r.oif),
        };
        self.handle
            .route()
            .add(b.build())
            .execute()
            .await
            .map_err(req(what))
    }

    /// Routes of the main table for one family.
    pub async fn routes(&self, v6: bool) -> Result<Vec<RouteEntry>, NetlinkError> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = if v6 {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        };
        let mut s = self.handle.route().get(msg).execute();
        let mut out = Vec::new();
        while let Some(m) = s.try_next().await.map_err(req("list routes"))? {
            let mut table = u32::from(m.header.table);
            let (mut dst, mut gw, mut oif) = (None, None, None);
            for a in &m.attributes {
                match a {
                    RouteAttribute::Table(t) => table = *t,
                    RouteAttribute::Destination(d) => dst = route_addr(d),
                    RouteAttribute::Gateway(g) => gw = route_addr(g),
                    RouteAttribute::Oif(i) => oif = Some(*i),
                    _ => {}
                }
            }
            if table != u32::from(RouteHeader::RT_TABLE_MAIN) {
                continue;
            }
            let dst = dst.unwrap_or(if v6 {
                IpAddr::from([0u16; 8])
            } else {
                IpAddr::from([0u8; 4])
            });
            let Ok(dst) = IpNetwork::new(dst, m.header.destination_prefix_length) else {
                continue;
            };
            out.push(RouteEntry {
                dst,
                gw,
                oif,
                scope_link: m.header.scope == RouteScope::Link,
            });
        }
        Ok(out)
    }
}

fn is_errno(e: &rtnetlink::Error, errno: i32) -> bool {
    matches!(e, rtnetlink::Error::NetlinkError(m) if m.code.map(|c| -c.get()) == Some(errno))
}

/// Makes a link's IPv6 addresses usable at once, link-local included: its addresses are
/// allocated, not guessed, and a tentative link-local address stalls neighbour discovery
/// for the first second of the pod's life. Runs in the calling thread's namespace; a
/// kernel without IPv6 has nothing to do.
/// Turns IPv6 off on `ifname` (no link-local address, no per-device routes, no MLD): for a
/// host veth whose pod has no IPv6 address. Bringing up an IPv6 device costs the kernel
/// walks of the whole IPv6 routing table and of every device's `fe80::/64` and `ff00::/8`
/// routes, which grow with the pods. A kernel without IPv6 has nothing to turn off.
pub fn disable_ipv6(ifname: &str) -> std::io::Result<()> {
    match std::fs::write(
        format!("/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6"),
        "1",
    ) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

pub fn disable_dad(ifname: &str) -> std::io::Result<()> {
    match std::fs::write(format!("/proc/sys/net/ipv6/conf/{ifname}/accept_dad"), "0") {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Writes a sysctl under /proc/sys (in the calling thread's network namespace, for net.*).
pub fn write_sysctl(path: &str, value: &str) -> std::io::Result<()> {
    let full = format!("/proc/sys/{}", path.replace('.', "/"));
    let current = std::fs::read_to_string(&full)?;
    if current.trim() == value {
        return Ok(());
    }
    std::fs::write(&full, value)
}
