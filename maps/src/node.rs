//! The node: its config (namespace cookie, `NODE_FLAG_*`, masquerade port range), its own
//! addresses, and the probe that learns its network namespace cookie.

/// Node-wide hash of the node's own addresses (any of which a wildcard host port answers
/// on): [`EndpointKey`](crate::EndpointKey) → `u32` (unused, 0).
pub const NODE_ADDRS_MAP: &str = "ECNI_NODE_ADDR";

/// Node-wide array with one [`NodeConfig`].
pub const CONFIG_MAP: &str = "ECNI_CONFIG";

/// Node-wide array with one [`NsProbe`]: how the plugin learns the node's network namespace
/// cookie on a kernel without `SO_NETNS_COOKIE` (before 5.14). `ecni_connect4` records the
/// cookie of one armed socket's namespace there.
pub const NS_PROBE_MAP: &str = "ECNI_NS_PROBE";

/// Capacity of [`NODE_ADDRS_MAP`].
pub const MAX_NODE_ADDRS: u32 = 1_024;

/// [`NodeConfig::flags`]: some host port mapping exists on the node, so the programs look
/// packets up in the port-mapping maps (without it they skip those lookups).
pub const NODE_FLAG_PORTMAP: u32 = 1;

/// [`NodeConfig::flags`]: some pod on the node masquerades, so the device program looks
/// replies up in the masquerade table.
pub const NODE_FLAG_MASQ: u32 = 2;

/// [`NodeConfig::flags`]: the node's rate map is empty, so `ecni_from_pod` skips the
/// lookup of the sending pod's egress limit. Set by the binary that loads a revision or
/// removes the node's last limit, cleared by the binary that writes a limit, before the
/// pod's programs attach. A flag that says "nothing to do": a node whose config predates
/// it keeps every lookup. Safe across releases because a pod's egress limit is applied by
/// its own programs, which the binary that wrote the limit attached: an older release that
/// writes a limit while the flag is on attaches its own programs, which ignore the flag.
/// The limit towards a pod is still looked up on every delivery: that lookup runs in the
/// sender's programs, and an older release writing a receiver's limit would not turn the
/// flag off for them.
pub const NODE_FLAG_NO_LIMITS: u32 = 8;

/// [`NodeConfig::flags`]: the node runs Services (user space found kube-proxy's
/// rules, or the config names `serviceCIDRs`): the programs look packets up in the two
/// Services maps. Without it they skip both lookups.
pub const NODE_FLAG_SERVICES: u32 = 16;

/// Value of [`CONFIG_MAP`]: node-wide settings the programs read.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeConfig {
    /// Cookie of the node's network namespace: the socket programs, attached machine-wide,
    /// act only on sockets of this namespace.
    pub netns_cookie: u64,
    /// `NODE_FLAG_*`.
    pub flags: u32,
    /// The masquerade port range (0, 0:
    /// [`MASQ_PORT_MIN`](crate::MASQ_PORT_MIN)..=[`MASQ_PORT_MAX`](crate::MASQ_PORT_MAX)).
    pub masq_port_min: u16,
    pub masq_port_max: u16,
}

const _: () = assert!(core::mem::size_of::<NodeConfig>() == 16);

/// Value of [`NS_PROBE_MAP`]. The plugin arms a probe by writing the socket cookie of a UDP
/// socket it opened in the node's namespace and a random destination; when that socket
/// connects to that destination, `ecni_connect4` writes the socket's network namespace
/// cookie, disarms the probe (`sock_cookie` 0) and refuses the connection. Only a holder of
/// the map (root) can arm it, and only a socket with both the armed cookie and the random
/// destination is recorded.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NsProbe {
    /// The armed socket's cookie; 0: no probe armed.
    pub sock_cookie: u64,
    /// Written by the program: the armed socket's network namespace cookie.
    pub netns_cookie: u64,
    /// The probe's destination address, as `bpf_sock_addr.user_ip4` holds it (network order
    /// bytes).
    pub addr_be: [u8; 4],
    /// The probe's destination port, host byte order.
    pub port: u16,
    pub _pad: u16,
    pub _spare: u64,
}

const _: () = assert!(core::mem::size_of::<NsProbe>() == 32);

plain_old_data!(NodeConfig, NsProbe);

const _: () = assert!(crate::names::fits_bpf_obj_name(NODE_ADDRS_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(CONFIG_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(NS_PROBE_MAP));
