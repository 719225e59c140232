//! Pod endpoints: where each local pod address lives, which the programs route pod → pod
//! and node → pod by, and each pod's traffic counters.

/// Node-wide hash of every local pod address: [`EndpointKey`] → [`EndpointInfo`].
pub const ENDPOINTS_MAP: &str = "ECNI_ENDPOINTS";

/// Node-wide per-CPU hash of per-pod traffic counters: host veth ifindex (`u32`) →
/// [`PodCounters`].
pub const POD_COUNTERS_MAP: &str = "ECNI_POD_CNT";

/// Capacity of [`ENDPOINTS_MAP`] (pod addresses per node) and [`POD_COUNTERS_MAP`].
pub const MAX_ENDPOINTS: u32 = 65_536;

/// [`EndpointInfo::flags`]: a pod whose interface ebpf-cni made (standalone mode).
pub const EP_FLAGS_NONE: u32 = 0;
/// [`EndpointInfo::flags`]: another plugin made the pod's interface and forwards its traffic
/// (chained mode). The programs deliver into such a pod only packets they translated for a
/// host port; everything else for it takes the stack, as that plugin set it up.
pub const EP_FLAG_CHAINED: u32 = 1;
/// [`EndpointInfo::flags`]: the pod's traffic to destinations outside the skip trie is
/// masqueraded (`ipMasq`). Masquerade's, kept here with the other flags of an endpoint.
pub const EP_FLAG_MASQ: u32 = 2;

/// Key of [`ENDPOINTS_MAP`]: an IPv6 address, or an IPv4 address mapped into IPv6
/// (`::ffff:a.b.c.d`), in network byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EndpointKey {
    pub addr: [u8; 16],
}

const _: () = assert!(core::mem::size_of::<EndpointKey>() == 16);

impl EndpointKey {
    pub const fn v4(octets: [u8; 4]) -> Self {
        let [a, b, c, d] = octets;
        Self {
            addr: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d],
        }
    }

    pub const fn v6(octets: [u8; 16]) -> Self {
        Self { addr: octets }
    }
}

/// Value of [`ENDPOINTS_MAP`]: where a local pod address lives.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndpointInfo {
    /// Hash of (network, container id, ifname): lets DEL find the entries of an attachment
    /// without knowing its addresses or its (maybe deleted) host veth.
    pub attachment_id: u64,
    /// The pod's host-side veth; `bpf_redirect_peer` to it lands in the pod.
    pub host_ifindex: u32,
    /// `EP_FLAGS_*`.
    pub flags: u32,
    /// Source MAC of frames delivered to the pod (its gateway, the host veth).
    pub host_mac: [u8; 6],
    /// Destination MAC of frames delivered to the pod.
    pub pod_mac: [u8; 6],
    /// For an IPv4 address of a pod whose interface ebpf-cni made: its gateway, whose ARP
    /// requests `ecni_from_pod` answers (the node holds the address once, not on the host
    /// veth). All zero: none (IPv6, chained pods, no gateway, entries of older releases).
    pub gateway4: [u8; 4],
}

const _: () = assert!(core::mem::size_of::<EndpointInfo>() == 32);

/// One direction's counts on one CPU. `bytes` counts `skb->len` (from the Ethernet header).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirCounters {
    pub packets: u64,
    pub bytes: u64,
    /// Packets the dataplane dropped on purpose (the rate limiter).
    pub drops: u64,
    /// Packets a helper or a translation failed on: dropped when a redirect was refused or
    /// a host-port rewrite failed; left to the stack unchanged when the FIB lookup failed.
    pub errors: u64,
    /// Packets the rate limiter marked ECN CE instead of dropping.
    pub marks: u64,
    /// From the pod only: frames the source check dropped because their source address
    /// (IPv4, IPv6, ARP's sender) is not one the pod may send from, or cannot be read.
    /// The check runs after the limiter and the packet count: these frames are in
    /// `packets` and `bytes`, not in `drops`. (Spare room, always 0, before the check.)
    pub source_drops: u64,
    /// From the pod only: frames the source check dropped because their source MAC (or
    /// ARP's sender MAC) is not the pod interface's.
    pub mac_drops: u64,
    /// Not a count: written by ADD into every CPU's slot, never by the programs, and not
    /// summed. In `to_pod`: [`COUNTERS_NO_INGRESS_LIMIT`] or 0; in `from_pod`:
    /// [`COUNTERS_NO_HOST_PORTS`] and [`COUNTERS_NO_EGRESS_LIMIT`], or 0. Releases before
    /// it wrote 0 here (the field was spare room).
    pub flags: u64,
}

/// [`DirCounters::flags`] of `to_pod`: the pod has no ingress limit, so a program
/// delivering to it skips the lookup of its limit (it reads these counters anyway, to
/// count the packet). A flag that says "nothing to do": 0, which every earlier release
/// writes, keeps the lookup, so a pod whose counters an earlier release wrote (with or
/// without a limit) is limited as that release set it up. Written with the counters, at
/// ADD, where the pod's limits are known; CHECK fails if it is set on a pod with an
/// ingress limit.
pub const COUNTERS_NO_INGRESS_LIMIT: u64 = 1;

/// [`DirCounters::flags`] of `from_pod`: no host port mapping leads to the pod, so none of
/// its packets can be a reply in a host port flow, and `ecni_from_pod` (or
/// `ecni_from_chain`) skips the reverse translation's flow lookup for them (it reads these
/// counters anyway, to count the packet). "Nothing to do", as
/// [`COUNTERS_NO_INGRESS_LIMIT`]: 0, which earlier releases write, keeps the lookup. The
/// pod's mappings are its own, installed by its ADD, which writes the flag; CHECK fails if
/// it is set on a pod with a mapping.
pub const COUNTERS_NO_HOST_PORTS: u64 = 2;

/// [`DirCounters::flags`] of `from_pod`: the pod has no egress limit, so `ecni_from_pod`
/// (or `ecni_from_chain`) skips the lookup of its limit on a node where some pod has one
/// (where none has, [`NODE_FLAG_NO_LIMITS`](crate::NODE_FLAG_NO_LIMITS) skips it for every
/// pod). "Nothing to do", as [`COUNTERS_NO_INGRESS_LIMIT`], and written with it; CHECK
/// fails if it is set on a pod with an egress limit.
pub const COUNTERS_NO_EGRESS_LIMIT: u64 = 4;

const _: () = assert!(core::mem::size_of::<DirCounters>() == 64);
const _: () = assert!(core::mem::offset_of!(DirCounters, flags) == 56);
const _: () = assert!(core::mem::offset_of!(DirCounters, source_drops) == 40);
const _: () = assert!(core::mem::offset_of!(DirCounters, mac_drops) == 48);

/// Value of [`POD_COUNTERS_MAP`] on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodCounters {
    /// Sent by the pod (seen at its host veth's ingress).
    pub from_pod: DirCounters,
    /// Delivered to the pod, by redirect or through the stack.
    pub to_pod: DirCounters,
}

const _: () = assert!(core::mem::size_of::<PodCounters>() == 128);

plain_old_data!(EndpointKey, EndpointInfo, DirCounters, PodCounters);

const _: () = assert!(crate::names::fits_bpf_obj_name(ENDPOINTS_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(POD_COUNTERS_MAP));
