//! Host ports: the port mappings, the translation of their flows (the reverse flow map,
//! fragments) and of the node's own connections and datagrams to them at the socket.

use crate::endpoints::EndpointKey;
use crate::masquerade::{MasqFrag6, MasqFrag6Key};

/// Node-wide hash of the host port mappings: [`PortKey`] → [`PortTarget`].
pub const PORTMAP_MAP: &str = "ECNI_PORTMAP";

/// Node-wide per-CPU hash of each mapping's hit counters: [`PortKey`] → [`PortHits`].
pub const PORTMAP_HITS_MAP: &str = "ECNI_PM_HITS";

/// Node-wide LRU hash of translated flows, keyed as the pod's replies look:
/// [`NatKey`] → [`NatOrig`] (what the client had dialled).
pub const NAT_REV_MAP: &str = "ECNI_NAT_REV";

/// Node-wide LRU hash of socket-level translations (connections and datagrams of the node's
/// own processes): [`SockKey`] → [`SockOrig`].
pub const SOCK_REV_MAP: &str = "ECNI_SOCK_REV";

/// Node-wide LRU hash of the UDP datagrams of host-port flows that travel in fragments,
/// both families: [`NatFragKey`] (the datagram as its fragments carry it, IPv4 addresses
/// mapped into IPv6, and the direction) → [`NatFrag`] (the address its fragments take: the
/// pod's arriving, the dialled node address leaving), of
/// [`MAX_MASQ_FRAGS`](crate::MAX_MASQ_FRAGS) records kept
/// [`MASQ_FRAG_TTL_NS`](crate::MASQ_FRAG_TTL_NS), as masquerade's. The first fragment is
/// translated with its flow and recorded here; the later ones, which carry no ports, by the
/// record.
pub const NAT_FRAG_MAP: &str = "ECNI_NAT_FRAG";
/// [`NatFragKey::dir`]: a client's datagram to a host port (the key holds the node's
/// address it dialled).
pub const NAT_FRAG_IN: u8 = 1;
/// [`NatFragKey::dir`]: a pod's reply in a host-port flow (the key holds the pod's address).
pub const NAT_FRAG_OUT: u8 = 2;

/// Capacity of [`PORTMAP_MAP`] and [`PORTMAP_HITS_MAP`].
pub const MAX_PORT_MAPPINGS: u32 = 65_536;
/// Capacity of [`NAT_REV_MAP`] and [`SOCK_REV_MAP`] (least recently used entries go first).
pub const MAX_NAT_FLOWS: u32 = 65_536;

/// Name of the per-attachment array map (pinned in the attachment's directory) that lists
/// the [`PortKey`]s the attachment installed: DEL removes exactly those, with or without
/// `portMappings` in its input.
pub const ATTACHMENT_PORTS_MAP: &str = "ecni_att_ports";

/// [`NatOrig::flags`]: the flow is a pod reaching its own host port; its source was
/// rewritten to the pod's gateway, so the reply's destination goes back to the pod.
pub const NAT_FLAG_HAIRPIN: u16 = 1;

/// Key of [`PORTMAP_MAP`]: which host address, port and protocol. `addr` is an
/// [`EndpointKey`](crate::EndpointKey)-style address; the wildcard of a family ("every node
/// address") is all zeroes for IPv6 and `::ffff:0.0.0.0` for IPv4.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PortKey {
    pub addr: [u8; 16],
    /// Host byte order.
    pub port: u16,
    /// `IPPROTO_*`.
    pub proto: u8,
    pub _pad: u8,
}

const _: () = assert!(core::mem::size_of::<PortKey>() == 20);

impl PortKey {
    pub const WILDCARD_V4: [u8; 16] = EndpointKey::v4([0; 4]).addr;
    pub const WILDCARD_V6: [u8; 16] = [0; 16];
}

/// Value of [`PORTMAP_MAP`]: the pod a host port leads to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortTarget {
    /// The attachment that installed the mapping.
    pub attachment_id: u64,
    /// The pod's address (same family as the key).
    pub pod_addr: [u8; 16],
    /// The pod's gateway in that family: the source of hairpin packets (the pod reaching
    /// its own host port), which the pod routes back to us. All zeroes: none.
    pub gateway: [u8; 16],
    /// The pod's host veth.
    pub host_ifindex: u32,
    /// Host byte order.
    pub pod_port: u16,
    /// `PORT_FLAG_*`. Was padding: an older binary's entries read as 0 (the defaults).
    pub flags: u8,
    pub _pad: u8,
}

const _: () = assert!(core::mem::size_of::<PortTarget>() == 48);

/// [`PortTarget::flags`]: the node's own connections to loopback (`127.0.0.0/8`, `::1`) are
/// not sent to the pod (`hostPortsOnLoopback: false`); they reach the node's own listener.
pub const PORT_FLAG_NO_LOOPBACK: u8 = 1;

/// Value of [`PORTMAP_HITS_MAP`] on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortHits {
    /// Packets translated by the TC programs (clients outside the node, pods).
    pub packets: u64,
    pub bytes: u64,
    /// Connections and datagrams of the node's own processes translated at the socket.
    pub socket: u64,
    pub _spare: u64,
}

const _: () = assert!(core::mem::size_of::<PortHits>() == 32);

/// Key of [`NAT_REV_MAP`]: a translated flow as the pod's replies carry it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NatKey {
    pub pod_addr: [u8; 16],
    pub peer_addr: [u8; 16],
    /// Host byte order.
    pub pod_port: u16,
    pub peer_port: u16,
    pub proto: u8,
    pub _pad: [u8; 3],
}

const _: () = assert!(core::mem::size_of::<NatKey>() == 40);

/// Value of [`NAT_REV_MAP`]: the address and port the client dialled, which replies carry
/// as their source.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatOrig {
    pub addr: [u8; 16],
    /// Host byte order.
    pub port: u16,
    /// `NAT_FLAG_*`.
    pub flags: u16,
    pub _pad: [u8; 4],
}

const _: () = assert!(core::mem::size_of::<NatOrig>() == 24);

/// Key of [`SOCK_REV_MAP`]: a socket and the pod address it was sent to instead.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockKey {
    pub cookie: u64,
    pub pod_addr: [u8; 16],
    /// Host byte order.
    pub pod_port: u16,
    pub _pad: [u8; 6],
}

const _: () = assert!(core::mem::size_of::<SockKey>() == 32);

/// Value of [`SOCK_REV_MAP`]: what the socket had asked for.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockOrig {
    pub addr: [u8; 16],
    /// Host byte order.
    pub port: u16,
    pub _pad: [u8; 6],
}

const _: () = assert!(core::mem::size_of::<SockOrig>() == 24);

/// Key of [`NAT_FRAG_MAP`]: a datagram as its fragments carry it, before their
/// translation. Masquerade's IPv6 record layout, with a direction of its own
/// ([`NAT_FRAG_IN`], [`NAT_FRAG_OUT`]) and IPv4 addresses mapped into IPv6.
pub type NatFragKey = MasqFrag6Key;
/// Value of [`NAT_FRAG_MAP`]: the address the datagram's fragments take, and when its first
/// fragment was translated.
pub type NatFrag = MasqFrag6;

plain_old_data!(PortKey, PortTarget, PortHits, NatKey, NatOrig, SockKey, SockOrig);

const _: () = assert!(crate::names::fits_bpf_obj_name(PORTMAP_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(PORTMAP_HITS_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(NAT_REV_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(SOCK_REV_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(NAT_FRAG_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(ATTACHMENT_PORTS_MAP));
