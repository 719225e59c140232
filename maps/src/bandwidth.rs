//! Bandwidth: each pod's rate limits (policed or paced buckets), the subnets its limits
//! exempt or cover, and the pacing of its TCP sockets.

/// Node-wide hash of per-pod rate limits: host veth ifindex (`u32`) → [`RateLimit`]. A pod
/// without limits has no entry, and its packets skip the limiter after one failed lookup.
pub const RATE_LIMITS_MAP: &str = "ECNI_RATES";

/// Node-wide hash of TCP pacing for pods with an egress limit: the pod's network namespace
/// cookie (`u64`) → [`Pacing`]. The sockops program caps each TCP socket of such a pod at
/// the rate, so TCP sends at the limit instead of bouncing off the policer.
pub const PACING_MAP: &str = "ECNI_PACING";

/// Node-wide LPM trie of the subnets a limited pod's `unshapedSubnets` / `shapedSubnets`
/// name: [`ShapeSubnetKey`] (host veth ifindex, then a 16-byte address, IPv4 mapped into
/// IPv6) → `u32` (unused, 1). The programs look here only for a pod whose limit carries
/// [`LIMIT_SUBNETS_UNSHAPED`] or [`LIMIT_SUBNETS_SHAPED`].
pub const SHAPE_SUBNETS_MAP: &str = "ECNI_SHAPE_NET";

/// One direction's limit. `rate_bytes` 0: no limit in this direction.
///
/// `mode` says how the programs hold it ([`LIMIT_POLICE`] and its variants, or
/// [`LIMIT_EDT`]). Releases before it had a `u64` burst here; bursts are below 4 GiB, so on
/// little-endian machines their entries read as a burst with mode 0 (police), which is what
/// they did.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    /// Rate in bytes per second.
    pub rate_bytes: u64,
    /// The burst in bytes: the policer's bucket size, or how far the pacer may fall behind
    /// "now" after an idle time (burst / rate).
    pub burst_bytes: u32,
    /// `LIMIT_*`.
    pub mode: u32,
    /// Policer: bytes that may pass now (updated by the programs). Pacer: unused.
    pub tokens: u64,
    /// `bpf_ktime_get_ns()`: the policer's last refill, or the pacer's last departure time
    /// (updated by the programs).
    pub last_ns: u64,
}

impl Bucket {
    /// Whether it limits its direction (`rate_bytes` 0: no limit).
    pub const fn limits(&self) -> bool {
        self.rate_bytes > 0
    }
}

const _: () = assert!(core::mem::size_of::<Bucket>() == 32);
const _: () = assert!(core::mem::offset_of!(Bucket, mode) == 12);
const _: () = assert!(core::mem::offset_of!(Bucket, tokens) == 16);

/// [`Bucket::mode`]: a token bucket at the packet's path drops what exceeds rate and burst
/// (the egress limit's mode; the ingress limit's where no pacing is possible).
pub const LIMIT_POLICE: u32 = 0;
/// An ingress limit that is policed because the kernel has no `sch_fq`.
pub const LIMIT_POLICE_NO_FQ: u32 = 2;
/// An ingress limit that is policed because the pod's host veth carries a root qdisc of
/// another kind (chained mode: the first plugin's or an operator's), which ebpf-cni leaves
/// alone.
pub const LIMIT_POLICE_FOREIGN_QDISC: u32 = 3;
/// An ingress limit paced: packets towards the pod go through its host veth's egress, where
/// `ecni_to_pod` stamps each with its departure time (EDT) and the veth's `fq` qdisc
/// releases it then. Packets whose departure lies beyond the horizon are dropped.
pub const LIMIT_EDT: u32 = 1;
/// The bits of [`Bucket::mode`] that hold the `LIMIT_*` mode; the bits above are flags.
pub const LIMIT_MODE_MASK: u32 = 0xff;
/// [`Bucket::mode`] flag: packets whose remote address (towards the pod: the source; from
/// the pod: the destination) is in one of the pod's [`SHAPE_SUBNETS_MAP`] subnets are not
/// limited (`unshapedSubnets`).
pub const LIMIT_SUBNETS_UNSHAPED: u32 = 1 << 8;
/// [`Bucket::mode`] flag: only packets whose remote address is in one of the pod's
/// [`SHAPE_SUBNETS_MAP`] subnets are limited (`shapedSubnets`).
pub const LIMIT_SUBNETS_SHAPED: u32 = 1 << 9;
/// Capacity of [`SHAPE_SUBNETS_MAP`], for the whole node.
pub const MAX_SHAPE_SUBNETS: u32 = 16_384;

/// The data of a [`SHAPE_SUBNETS_MAP`] key (after the LPM prefix length): the pod's host
/// veth ifindex, always matched whole (its 32 bits count in the prefix length), then the
/// address, IPv4 mapped into IPv6 (`::ffff:a.b.c.d`, the prefix counting the 96 bits
/// before it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ShapeSubnetKey {
    pub ifindex: u32,
    pub addr: [u8; 16],
}

const _: () = assert!(core::mem::size_of::<ShapeSubnetKey>() == 20);

/// Root qdisc handle (`ecf0:`) of the `fq` ebpf-cni adds to a paced pod's host veth: how
/// CHECK and DEL tell it from one another plugin or the operator added.
pub const EDT_QDISC_HANDLE: u32 = 0xecf0_0000;
/// The pacer's horizon: at least this long...
pub const EDT_HORIZON_MIN_NS: u64 = 20_000_000;
/// ...and at least the time two of the largest GSO packets (64 KiB) take at the rate, so
/// one always fits behind another.
pub const EDT_HORIZON_GSO_BYTES: u64 = 2 * 65_536;

/// Key of the pacer's flow table (the programs' own, not pinned): the host veth of a paced
/// pod and a flow's hash (`skb->hash`). The value is the pod's clock (ns) after that flow's
/// last packet: until it has passed, the flow has packets waiting in the queue.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PaceFlowKey {
    pub ifindex: u32,
    pub hash: u32,
}

const _: () = assert!(core::mem::size_of::<PaceFlowKey>() == 8);

/// Flows the pacer remembers, on the whole node (LRU: the least recently seen goes).
pub const MAX_PACE_FLOWS: u32 = 65_536;

/// How far ahead of "now" the pacer may schedule a packet towards a pod paced at
/// `rate_bytes` (bytes/s > 0); a packet that would leave later is dropped, which bounds the
/// queue (and the delay it adds) to this time.
#[inline(always)]
pub const fn edt_horizon_ns(rate_bytes: u64) -> u64 {
    // No panicking division: the verifier rejects a program with a panic path.
    let gso = match (EDT_HORIZON_GSO_BYTES * 1_000_000_000).checked_div(rate_bytes) {
        Some(t) => t,
        None => 0,
    };
    if gso > EDT_HORIZON_MIN_NS {
        gso
    } else {
        EDT_HORIZON_MIN_NS
    }
}

/// Value of [`RATE_LIMITS_MAP`]: "ingress" is traffic towards the pod, "egress" from it (the
/// CNI bandwidth convention).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateLimit {
    pub ingress: Bucket,
    pub egress: Bucket,
}

const _: () = assert!(core::mem::size_of::<RateLimit>() == 64);

/// Value of [`PACING_MAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pacing {
    /// `SO_MAX_PACING_RATE` for the pod's TCP sockets, bytes per second (the socket option
    /// takes 32 bits: at most 4 GB/s).
    pub rate_bytes: u32,
    /// The pod's host veth ifindex when its limits have `unshapedSubnets`/`shapedSubnets`
    /// (a socket whose peer they exempt is not paced), else 0. Releases before them had
    /// padding here, always 0.
    pub shape_ifindex: u32,
    /// The attachment it belongs to (DEL finds the entry by it, without the pod's netns).
    pub attachment_id: u64,
}

const _: () = assert!(core::mem::size_of::<Pacing>() == 16);

plain_old_data!(RateLimit, ShapeSubnetKey, Pacing);

const _: () = assert!(crate::names::fits_bpf_obj_name(RATE_LIMITS_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(PACING_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(SHAPE_SUBNETS_MAP));
