//! Typed netlink calls (links, addresses, routes), one socket per namespace; the node's
//! addresses and `clsact` qdiscs also hand-parsed (`addrs`, `tc`).
//!
//! The messages are rtnetlink's types (its builders, netlink-packet-route's codec); each
//! request goes out on the namespace's raw socket and its answer is read at once, in the
//! calling thread (`raw`). rtnetlink's own connection (a task on the async runtime, its
//! socket polled through the runtime's reactor) cost an ADD more CPU than the requests'
//! encoding and decoding. The calls stay `async` for their callers.
//!
//! A socket belongs to the namespace it was created in, so `Netlink::connect_in` enters the
//! target namespace only for the socket's creation. Every request asks for an ACK; deleting
//! something already gone is `Ok(false)`, so DEL stays idempotent.

use std::net::IpAddr;

use std::sync::atomic::{AtomicU32, Ordering};

use ipnetwork::IpNetwork;
use rtnetlink::{
    packet_core::{
        NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP,
        NLM_F_ECHO, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST,
    },
    packet_route::{
        address::{AddressAttribute, AddressFlags, AddressMessage},
        link::{
            InfoData, InfoKind, InfoVeth, InfoVxlan, LinkAttribute, LinkExtentMask, LinkFlags,
            LinkInfo, LinkMessage, State,
        },
        route::{
            RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteMetric, RouteProtocol,
            RouteScope, RouteVia,
        },
        tc::TcMessage,
        AddressFamily, RouteNetlinkMessage,
    },
    AddressMessageBuilder, LinkMessageBuilder, LinkUnspec, LinkVxlan, RouteMessageBuilder,
};

use crate::netns::{Netns, NetnsError};

/// The kernel gives the loopback device index 1 in every namespace.
pub const LOOPBACK_IFINDEX: u32 = 1;

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
    /// The kernel's answer was an error (its errno), or the answer could not be read.
    #[error("netlink: failed to {op}")]
    Request {
        op: String,
        #[source]
        source: std::io::Error,
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
            Self::Request { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// What we read back about a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mac: Option<[u8; 6]>,
    pub mtu: u32,
    pub up: bool,
    /// IFLA_OPERSTATE is up. Asking for one link runs its pending link-watch work first
    /// (Linux 6.8+), so this is the state the kernel honours now.
    pub oper_up: bool,
    pub kind: Option<String>,
    /// IFLA_LINK: for a veth, the peer's index (in the peer's namespace).
    pub peer_index: Option<u32>,
    /// A VXLAN device's settings.
    pub vxlan: Option<Vxlan>,
}

/// What a VXLAN device's link message says of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Vxlan {
    /// The UDP port it listens on.
    pub port: u16,
    /// `external` (collect_md): the tunnel key comes with each packet.
    pub external: bool,
    /// The outer UDP header carries a checksum (IPv4).
    pub udp_csum: bool,
    /// The device's own VXLAN network identifier.
    pub vni: u32,
}

impl Link {
    fn from_msg(m: &LinkMessage) -> Self {
        let mut l = Link {
            index: m.header.index,
            name: String::new(),
            mac: None,
            mtu: 0,
            up: m.header.flags.contains(LinkFlags::Up),
            oper_up: false,
            kind: None,
            peer_index: None,
            vxlan: None,
        };
        for a in &m.attributes {
            match a {
                LinkAttribute::IfName(n) => l.name = n.clone(),
                LinkAttribute::Address(b) if b.len() == 6 => {
                    l.mac = Some(b[..6].try_into().expect("6 bytes"))
                }
                LinkAttribute::Mtu(v) => l.mtu = *v,
                LinkAttribute::Link(i) => l.peer_index = Some(*i),
                LinkAttribute::OperState(State::Up) => l.oper_up = true,
                LinkAttribute::LinkInfo(infos) => {
                    for i in infos {
                        match i {
                            LinkInfo::Kind(k) => l.kind = Some(k.to_string()),
                            LinkInfo::Data(InfoData::Vxlan(v)) => {
                                // The kernel's defaults where an attribute is missing.
                                let mut x = Vxlan {
                                    port: 8472,
                                    external: false,
                                    udp_csum: true,
                                    vni: 0,
                                };
                                for a in v {
                                    match a {
                                        InfoVxlan::Port(p) => x.port = *p,
                                        InfoVxlan::CollectMetadata(b) => x.external = *b,
                                        InfoVxlan::UDPCsum(b) => x.udp_csum = *b,
                                        InfoVxlan::Id(n) => x.vni = *n,
                                        _ => {}
                                    }
                                }
                                l.vxlan = Some(x);
                            }
                            _ => {}
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
    /// Who wrote it (`rtm_protocol`: 2 the kernel, 3 boot, 4 static, …).
    pub protocol: u8,
}

/// A route to install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    pub dst: IpNetwork,
    pub gw: Option<IpAddr>,
    pub oif: u32,
    pub scope_link: bool,
    pub src: Option<IpAddr>,
    /// CNI 1.1's route fields (a config's `ipam.routes`); unset for the plugin's own routes.
    pub options: crate::cni::types::RouteOptions,
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
    sock: raw::Socket,
    /// The last request's sequence number.
    seq: AtomicU32,
}

impl Netlink {
    /// A socket in the calling thread's namespace. In the thread's own namespace, the
    /// socket tells it its cookie where the kernel can ([`crate::netns::learn_home_cookie`]).
    pub fn connect() -> Result<Self, NetlinkError> {
        let sock = raw::Socket::open(libc::NETLINK_ROUTE).map_err(NetlinkError::Connect)?;
        if crate::netns::at_home() && crate::netns::home_cookie().is_none() {
            if let Ok(cookie) = sock.netns_cookie() {
                crate::netns::learn_home_cookie(cookie);
            }
        }
        Ok(Self {
            sock,
            seq: AtomicU32::new(0),
        })
    }

    /// A socket in `ns`; the calling thread stays where it was. The socket tells `ns` its
    /// cookie where the kernel can ([`Netns::learn_cookie`]).
    pub fn connect_in(ns: &Netns) -> Result<Self, NetlinkError> {
        let nl = {
            let _guard = ns.enter()?;
            Self::connect()?
        };
        if let Ok(cookie) = nl.sock.netns_cookie() {
            ns.learn_cookie(cookie);
        }
        Ok(nl)
    }

    /// Sends `payload` with `flags` (`NLM_F_REQUEST` added) and hands each message of the
    /// answer to `each`; `op` says what failed. A request that is not a dump asks for the
    /// kernel's acknowledgement, which ends its answer.
    fn request(
        &self,
        payload: RouteNetlinkMessage,
        flags: u16,
        op: impl FnOnce() -> String,
        mut each: impl FnMut(RouteNetlinkMessage),
    ) -> Result<(), NetlinkError> {
        let mut msg = NetlinkMessage::from(payload);
        msg.header.flags = NLM_F_REQUEST | flags;
        if flags & NLM_F_DUMP != NLM_F_DUMP {
            msg.header.flags |= NLM_F_ACK;
        }
        msg.header.sequence_number = self.seq.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        msg.finalize();
        let mut bytes = vec![0; msg.buffer_len()];
        msg.serialize(&mut bytes);
        let mut undecodable = None;
        let sent = self.sock.exchange(&bytes, "the rtnetlink answer", |m| {
            let mut header = NetlinkHeader::default();
            header.length = (raw::NLMSG_HDRLEN + m.body.len()) as u32;
            header.message_type = m.kind;
            header.flags = m.flags;
            match RouteNetlinkMessage::deserialize(&header, m.body) {
                Ok(answer) => each(answer),
                Err(e) => {
                    undecodable.get_or_insert(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("undecodable answer of type {}: {e}", m.kind),
                    ));
                }
            }
        });
        match sent.err().or(undecodable) {
            None => Ok(()),
            Some(source) => Err(NetlinkError::Request { op: op(), source }),
        }
    }

    /// The one link a request asked for; `None` when the kernel answers `ENODEV`. Its
    /// statistics, which `Link` does not hold, are left out of the answer.
    fn get_link(
        &self,
        mut message: LinkMessage,
        op: impl FnOnce() -> String,
    ) -> Result<Option<Link>, NetlinkError> {
        message
            .attributes
            .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
        let mut found = None;
        match self.request(RouteNetlinkMessage::GetLink(message), 0, op, |m| {
            if let RouteNetlinkMessage::NewLink(l) = m {
                found.get_or_insert_with(|| Link::from_msg(&l));
            }
        }) {
            Ok(()) => Ok(found),
            Err(e) if e.errno() == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn link_by_name(&self, name: &str) -> Result<Option<Link>, NetlinkError> {
        let mut m = LinkMessage::default();
        m.attributes.push(LinkAttribute::IfName(name.to_owned()));
        self.get_link(m, || format!("get link {name}"))
    }

    pub async fn link_by_index(&self, index: u32) -> Result<Option<Link>, NetlinkError> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        self.get_link(m, || format!("get link {index}"))
    }

    /// Names of the programs of the `bpf` filters on a link's ingress or egress hook.
    pub async fn bpf_filters(
        &self,
        index: u32,
        ingress: bool,
    ) -> Result<Vec<String>, NetlinkError> {
        use rtnetlink::packet_route::tc::{TcAttribute, TcFilterBpfOption, TcHandle, TcOption};
        let mut m = TcMessage::with_index(index as i32);
        m.header.parent = TcHandle {
            major: 0xffff,
            minor: if ingress {
                TcHandle::MIN_INGRESS
            } else {
                TcHandle::MIN_EGRESS
            },
        };
        let mut out = Vec::new();
        self.request(
            RouteNetlinkMessage::GetTrafficFilter(m),
            NLM_F_DUMP,
            || format!("list tc filters of link {index}"),
            |m| {
                let RouteNetlinkMessage::NewTrafficFilter(m) = m else {
                    return;
                };
                for a in &m.attributes {
                    if let TcAttribute::Options(opts) = a {
                        for o in opts {
                            if let TcOption::Bpf(TcFilterBpfOption::ProgName(n)) = o {
                                // The kernel reports "<prog name>" or "<prog name>:[…]" by
                                // loader.
                                out.push(n.split(':').next().unwrap_or(n).to_owned());
                            }
                        }
                    }
                }
            },
        )?;
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
        let mut echoed = None;
        self.request(
            RouteNetlinkMessage::NewLink(h.build()),
            NLM_F_EXCL | NLM_F_CREATE | NLM_F_ECHO,
            || format!("create veth pair {host} / {peer}"),
            |m| match m {
                RouteNetlinkMessage::NewLink(l)
                    if l.attributes
                        .iter()
                        .any(|a| matches!(a, LinkAttribute::IfName(n) if n == host)) =>
                {
                    echoed = Some(Link::from_msg(&l));
                }
                _ => {}
            },
        )?;
        Ok(echoed)
    }

    /// Creates an `external` (collect_md) VXLAN device without learning, ARP or multicast
    /// (the programs set each packet's tunnel key, which only a unicast destination has;
    /// nothing resolves neighbours or joins groups through it), listening on UDP `port`,
    /// down. Its own identifier is 0: the kernel looks a
    /// received packet's flow-based device up under VNI 0 whatever the packet carries, so
    /// a device with any other identifier receives nothing.
    pub async fn create_vxlan(
        &self,
        name: &str,
        port: u16,
        udp_csum: bool,
        mtu: u32,
    ) -> Result<(), NetlinkError> {
        let m = LinkVxlan::new(name, 0)
            .port(port)
            .collect_metadata(true)
            .learning(false)
            .udp_csum(udp_csum)
            .mtu(mtu)
            .arp(false)
            .multicast(false)
            .build();
        self.request(
            RouteNetlinkMessage::NewLink(m),
            NLM_F_EXCL | NLM_F_CREATE,
            || format!("create vxlan device {name} (external, port {port})"),
            |_| {},
        )
    }

    /// Every link of the namespace.
    pub async fn links(&self) -> Result<Vec<Link>, NetlinkError> {
        let mut m = LinkMessage::default();
        m.attributes
            .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
        let mut out = Vec::new();
        self.request(
            RouteNetlinkMessage::GetLink(m),
            NLM_F_DUMP,
            || "list links".to_owned(),
            |m| {
                if let RouteNetlinkMessage::NewLink(l) = m {
                    out.push(Link::from_msg(&l));
                }
            },
        )?;
        Ok(out)
    }

    pub async fn set_up(&self, index: u32) -> Result<(), NetlinkError> {
        self.request(
            RouteNetlinkMessage::SetLink(LinkUnspec::new_with_index(index).up().build()),
            NLM_F_EXCL | NLM_F_CREATE,
            || format!("set link {index} up"),
            |_| {},
        )
    }

    /// `Ok(false)` when the link was already gone.
    pub async fn delete_link(&self, index: u32) -> Result<bool, NetlinkError> {
        let mut m = LinkMessage::default();
        m.header.index = index;
        self.delete(RouteNetlinkMessage::DelLink(m), &[libc::ENODEV], || {
            format!("delete link {index}")
        })
    }

    /// Sends the delete request `payload`: `Ok(true)` when the kernel deleted the object,
    /// `Ok(false)` when it answered one of `absent` (there was none to delete).
    fn delete(
        &self,
        payload: RouteNetlinkMessage,
        absent: &[i32],
        op: impl FnOnce() -> String,
    ) -> Result<bool, NetlinkError> {
        match self.request(payload, 0, op, |_| {}) {
            Ok(()) => Ok(true),
            Err(e) if e.errno().is_some_and(|n| absent.contains(&n)) => Ok(false),
            Err(e) => Err(e),
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
        let mut m = match addr {
            IpNetwork::V4(a) => AddressMessageBuilder::<std::net::Ipv4Addr>::new()
                .index(index)
                .address(a.ip(), a.prefix())
                .build(),
            IpNetwork::V6(a) => AddressMessageBuilder::<std::net::Ipv6Addr>::new()
                .index(index)
                .address(a.ip(), a.prefix())
                .build(),
        };
        let mut flags = AddressFlags::Nodad;
        if !prefix_route {
            flags |= AddressFlags::Noprefixroute;
        }
        m.attributes.push(AddressAttribute::Flags(flags));
        self.request(
            RouteNetlinkMessage::NewAddress(m),
            NLM_F_EXCL | NLM_F_CREATE,
            || format!("add address {addr} to link {index}"),
            |_| {},
        )
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
        self.delete(
            RouteNetlinkMessage::DelAddress(m),
            &[libc::EADDRNOTAVAIL, libc::ENOENT],
            || format!("delete address {addr} from link {index}"),
        )
    }

    pub async fn addresses(&self, index: u32) -> Result<Vec<IpNetwork>, NetlinkError> {
        let m = AddressMessage::default();
        let mut out = Vec::new();
        self.request(
            RouteNetlinkMessage::GetAddress(m),
            NLM_F_DUMP,
            || format!("list addresses of link {index}"),
            |m| {
                let RouteNetlinkMessage::NewAddress(m) = m else {
                    return;
                };
                if m.header.index != index {
                    return;
                }
                for a in &m.attributes {
                    if let AddressAttribute::Address(ip) = a {
                        if let Ok(n) = IpNetwork::new(*ip, m.header.prefix_len) {
                            out.push(n);
                        }
                    }
                }
            },
        )?;
        Ok(out)
    }

    pub async fn add_route(&self, r: &RouteSpec) -> Result<(), NetlinkError> {
        self.put_route(r, NLM_F_EXCL | NLM_F_CREATE)
    }

    /// Adds `r`, or replaces the route to `r.dst` of the same priority (STATUS giving a
    /// host route back the source address the kernel dropped with the address).
    pub async fn replace_route(&self, r: &RouteSpec) -> Result<(), NetlinkError> {
        self.put_route(r, NLM_F_CREATE | NLM_F_REPLACE)
    }

    fn put_route(&self, r: &RouteSpec, flags: u16) -> Result<(), NetlinkError> {
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
        let o = &r.options;
        if let Some(scope) = o.scope {
            b = b.scope(RouteScope::from(scope));
        }
        if let Some(priority) = o.priority {
            b = b.priority(priority);
        }
        if let Some(table) = o.table {
            b = b.table_id(table);
        }
        let mut msg = b.build();
        let metrics: Vec<RouteMetric> = [
            o.mtu.map(RouteMetric::Mtu),
            o.advmss.map(RouteMetric::Advmss),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !metrics.is_empty() {
            msg.attributes.push(RouteAttribute::Metrics(metrics));
        }
        self.request(
            RouteNetlinkMessage::NewRoute(msg),
            flags,
            || match r.gw {
                Some(gw) => format!("add route {} via {gw} dev {}", r.dst, r.oif),
                None => format!("add route {} dev {}", r.dst, r.oif),
            },
            |_| {},
        )
    }

    /// Adds or replaces the main table's route to `dst` via `gw` out of `oif`, marked as
    /// written by `protocol` (so its writer can find its own routes again); with `onlink`,
    /// the gateway is taken as on the link (a peer's node address behind the tunnel
    /// device, which holds no address of its subnet).
    pub async fn replace_owned_route(
        &self,
        dst: IpNetwork,
        gw: IpAddr,
        oif: u32,
        protocol: u8,
        onlink: bool,
    ) -> Result<(), NetlinkError> {
        let invalid = |e: &dyn std::fmt::Display| NetlinkError::InvalidRoute {
            dst,
            reason: e.to_string(),
        };
        let mut msg = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(dst.network(), dst.prefix())
            .map_err(|e| invalid(&e))?
            .output_interface(oif)
            .gateway(gw)
            .map_err(|e| invalid(&e))?
            .protocol(RouteProtocol::from(protocol));
        if onlink {
            msg = msg.onlink();
        }
        self.request(
            RouteNetlinkMessage::NewRoute(msg.build()),
            NLM_F_CREATE | NLM_F_REPLACE,
            || {
                format!(
                    "replace route {dst} via {gw} dev {oif}{}",
                    if onlink { " onlink" } else { "" }
                )
            },
            |_| {},
        )
    }

    /// Deletes the main table's route to `dst` written by `protocol`; `Ok(false)` when
    /// there is none.
    pub async fn delete_owned_route(
        &self,
        dst: IpNetwork,
        protocol: u8,
    ) -> Result<bool, NetlinkError> {
        let invalid = |e: &dyn std::fmt::Display| NetlinkError::InvalidRoute {
            dst,
            reason: e.to_string(),
        };
        let msg = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(dst.network(), dst.prefix())
            .map_err(|e| invalid(&e))?
            .protocol(RouteProtocol::from(protocol))
            .build();
        self.delete(
            RouteNetlinkMessage::DelRoute(msg),
            &[libc::ESRCH, libc::ENOENT],
            || format!("delete route {dst}"),
        )
    }

    /// [`Self::add_route`] where the same route may be there already: `Ok(false)` when the
    /// kernel has a route to `r.dst` out of `r.oif` (another writer, STATUS putting a
    /// pod's host route back, came first); a route to `r.dst` elsewhere is still an error.
    pub async fn ensure_route(&self, r: &RouteSpec) -> Result<bool, NetlinkError> {
        match self.add_route(r).await {
            Ok(()) => Ok(true),
            Err(e) if e.errno() == Some(libc::EEXIST) => {
                let same = self
                    .routes(r.dst.is_ipv6())
                    .await?
                    .iter()
                    .any(|have| have.dst == r.dst && have.oif == Some(r.oif));
                if same {
                    Ok(false)
                } else {
                    Err(e)
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Routes of the main table for one family.
    pub async fn routes(&self, v6: bool) -> Result<Vec<RouteEntry>, NetlinkError> {
        self.routes_in(v6, u32::from(RouteHeader::RT_TABLE_MAIN))
            .await
    }

    /// Routes of routing table `table` for one family.
    pub async fn routes_in(
        &self,
        v6: bool,
        table_id: u32,
    ) -> Result<Vec<RouteEntry>, NetlinkError> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = if v6 {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        };
        let mut out = Vec::new();
        self.request(
            RouteNetlinkMessage::GetRoute(msg),
            NLM_F_DUMP,
            || "list routes".to_owned(),
            |m| {
                let RouteNetlinkMessage::NewRoute(m) = m else {
                    return;
                };
                let mut table = u32::from(m.header.table);
                let (mut dst, mut gw, mut oif) = (None, None, None);
                for a in &m.attributes {
                    match a {
                        RouteAttribute::Table(t) => table = *t,
                        RouteAttribute::Destination(d) => dst = route_addr(d),
                        RouteAttribute::Gateway(g) => gw = route_addr(g),
                        // An IPv4 route via an IPv6 gateway (RFC 5549).
                        RouteAttribute::Via(RouteVia::Inet6(g)) => gw = Some(IpAddr::V6(*g)),
                        RouteAttribute::Oif(i) => oif = Some(*i),
                        _ => {}
                    }
                }
                if table != table_id {
                    return;
                }
                let dst = dst.unwrap_or(if v6 {
                    IpAddr::from([0u16; 8])
                } else {
                    IpAddr::from([0u8; 4])
                });
                let Ok(dst) = IpNetwork::new(dst, m.header.destination_prefix_length) else {
                    return;
                };
                out.push(RouteEntry {
                    dst,
                    gw,
                    oif,
                    scope_link: m.header.scope == RouteScope::Link,
                    protocol: u8::from(m.header.protocol),
                });
            },
        )?;
        Ok(out)
    }
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
