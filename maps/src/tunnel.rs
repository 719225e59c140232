//! The cluster network's overlay: a pod's packet to a peer's pod subnet that no direct
//! route reaches leaves through the node's one `external` (collect_md) VXLAN device, whose
//! egress program sets the tunnel key (the peer's node address) from [`TUNNEL_PEERS_MAP`];
//! what arrives on that device is accepted only from a member's node address with an inner
//! source inside that member's pod subnet or its node address itself.

/// Node-wide LPM trie of the peers' pod subnets reached through the tunnel: an LPM key of a
/// 16-byte address (IPv4 mapped into IPv6, its prefix length counting the 96 mapping bits)
/// → [`TunnelPeer`].
pub const TUNNEL_PEERS_MAP: &str = "ECNI_TUN_PEERS";
/// Node-wide hash of the members' node addresses the tunnel takes packets from:
/// [`EndpointKey`](crate::EndpointKey) → `u32` (unused, 0).
pub const TUNNEL_NODES_MAP: &str = "ECNI_TUN_NODES";
/// Node-wide array with one [`TunnelConfig`].
pub const TUNNEL_CONFIG_MAP: &str = "ECNI_TUN_CFG";
/// Node-wide per-CPU array with one [`TunnelStats`].
pub const TUNNEL_STATS_MAP: &str = "ECNI_TUN_STAT";
/// Node-wide per-CPU hash of what the tunnel carried for each member: its node address as
/// an [`EndpointKey`](crate::EndpointKey) → [`TunnelPeerStats`]. User space adds and removes
/// the entries with the members of [`TUNNEL_NODES_MAP`]; the programs count into them.
pub const TUNNEL_PEER_STATS_MAP: &str = "ECNI_TUN_PSTAT";
/// Capacity of [`TUNNEL_PEERS_MAP`], [`TUNNEL_NODES_MAP`] and [`TUNNEL_PEER_STATS_MAP`]:
/// pod subnets (and nodes) of the peers behind the tunnel.
pub const MAX_TUNNEL_PEERS: u32 = 16_384;

/// [`TunnelConfig::flags`]: the outer UDP header carries a checksum (off by default on
/// IPv4, as flannel's `vxlan` backend and the kernel's VXLAN device do).
pub const TUNNEL_FLAG_UDP_CSUM: u32 = 1;

/// Value of [`TUNNEL_CONFIG_MAP`]: the node's tunnel device. `ifindex` 0: no tunnel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TunnelConfig {
    pub ifindex: u32,
    /// The VXLAN network identifier every node's device uses.
    pub vni: u32,
    /// `TUNNEL_FLAG_*`.
    pub flags: u32,
    pub _pad: u32,
}

const _: () = assert!(core::mem::size_of::<TunnelConfig>() == 16);

/// Value of [`TUNNEL_PEERS_MAP`]: the node holding a pod subnet.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TunnelPeer {
    /// Its node address, network order: an IPv4 underlay's mapped into IPv6, or an IPv6 one.
    pub node: [u8; 16],
    pub _pad: u64,
}

const _: () = assert!(core::mem::size_of::<TunnelPeer>() == 24);

/// What the tunnel's programs did, per CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TunnelStats {
    /// Packets (and their inner bytes) given a tunnel key towards a peer.
    pub encap_packets: u64,
    pub encap_bytes: u64,
    /// Packets that arrived through the tunnel and were accepted.
    pub decap_packets: u64,
    pub decap_bytes: u64,
    /// Dropped on the way out: no peer holds the destination.
    pub drop_no_peer: u64,
    /// Dropped on arrival: the outer source is no member's node address.
    pub drop_not_member: u64,
    /// Dropped on arrival: a member's packet whose inner source is neither in that
    /// member's pod subnets nor its node address.
    pub drop_forged_source: u64,
    /// Dropped on arrival: no tunnel key (not from the VXLAN socket), or not IP inside.
    pub drop_malformed: u64,
    /// Dropped on the way out: the kernel refused the tunnel key.
    pub errors: u64,
}

const _: () = assert!(core::mem::size_of::<TunnelStats>() == 72);

/// What the tunnel carried for one member node, per CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TunnelPeerStats {
    /// Packets (and their inner bytes) given a tunnel key towards the member.
    pub encap_packets: u64,
    pub encap_bytes: u64,
    /// Packets from the member that were accepted.
    pub decap_packets: u64,
    pub decap_bytes: u64,
    /// Packets from the member dropped: the inner source is neither in its pod subnets nor
    /// its node address.
    pub drop_forged_source: u64,
}

const _: () = assert!(core::mem::size_of::<TunnelPeerStats>() == 40);

plain_old_data!(TunnelConfig, TunnelPeer, TunnelStats, TunnelPeerStats);

const _: () = assert!(crate::names::fits_bpf_obj_name(TUNNEL_PEERS_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(TUNNEL_NODES_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(TUNNEL_CONFIG_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(TUNNEL_STATS_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(TUNNEL_PEER_STATS_MAP));
