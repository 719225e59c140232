//! The node-wide maps, shared by every program and pinned by user space under the node's
//! directory (the loader reuses the pins, so every loaded revision sees the same entries).

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    macros::map,
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuHashMap},
};
use ebpf_cni_maps::{
    str_eq, DirCounters, EndpointInfo, EndpointKey, NatKey, NatOrig, NodeConfig, NsProbe, Pacing,
    PodCounters, PortHits, PortKey, PortTarget, RateLimit, ShapeSubnetKey, SockKey, SockOrig,
    COUNTERS_NO_EGRESS_LIMIT, COUNTERS_NO_HOST_PORTS, COUNTERS_NO_INGRESS_LIMIT, MAX_ENDPOINTS,
    MAX_NAT_FLOWS, MAX_NODE_ADDRS, MAX_PORT_MAPPINGS, MAX_SHAPE_SUBNETS, NODE_FLAG_NO_LIMITS,
    NODE_FLAG_PORTMAP,
};

// The hashes whose entries only user space inserts (at ADD; the programs read them or
// update them in place) are not preallocated. Preallocating 65,536 entries of each per-CPU
// hash on every CPU took ~190 ms of a node's first ADD (seconds in an emulated guest); the
// four plain ones of 65,536 entries (endpoints, limits, host ports, pacing) took ~9 ms of
// the maps' 35 ms and 26 MiB of kernel memory on every node (56.5 against 30.4 MiB for the
// node's maps), however few pods it has.
// Only the LRU hashes, which the programs fill and the kernel must evict from, are.
#[map]
pub static ECNI_ENDPOINTS: HashMap<EndpointKey, EndpointInfo> =
    HashMap::with_max_entries(MAX_ENDPOINTS, BPF_F_NO_PREALLOC);

#[map]
pub static ECNI_POD_CNT: PerCpuHashMap<u32, PodCounters> =
    PerCpuHashMap::with_max_entries(MAX_ENDPOINTS, BPF_F_NO_PREALLOC);

#[map]
pub static ECNI_TRACE: Array<u32> = Array::with_max_entries(1, 0);

#[map]
pub static ECNI_RATES: HashMap<u32, RateLimit> =
    HashMap::with_max_entries(MAX_ENDPOINTS, BPF_F_NO_PREALLOC);

/// The subnets of limited pods' `unshapedSubnets` / `shapedSubnets` (see `bandwidth.rs`).
#[map]
pub static ECNI_SHAPE_NET: LpmTrie<ShapeSubnetKey, u32> =
    LpmTrie::with_max_entries(MAX_SHAPE_SUBNETS, 0);

#[map]
pub static ECNI_PORTMAP: HashMap<PortKey, PortTarget> =
    HashMap::with_max_entries(MAX_PORT_MAPPINGS, BPF_F_NO_PREALLOC);

#[map]
pub static ECNI_PM_HITS: PerCpuHashMap<PortKey, PortHits> =
    PerCpuHashMap::with_max_entries(MAX_PORT_MAPPINGS, BPF_F_NO_PREALLOC);

#[map]
pub static ECNI_NAT_REV: LruHashMap<NatKey, NatOrig> =
    LruHashMap::with_max_entries(MAX_NAT_FLOWS, 0);

#[map]
pub static ECNI_SOCK_REV: LruHashMap<SockKey, SockOrig> =
    LruHashMap::with_max_entries(MAX_NAT_FLOWS, 0);

#[map]
pub static ECNI_NODE_ADDR: HashMap<EndpointKey, u32> = HashMap::with_max_entries(MAX_NODE_ADDRS, 0);

#[map]
pub static ECNI_CONFIG: Array<NodeConfig> = Array::with_max_entries(1, 0);

#[map]
pub static ECNI_PACING: HashMap<u64, Pacing> =
    HashMap::with_max_entries(MAX_ENDPOINTS, BPF_F_NO_PREALLOC);

const _: () = assert!(str_eq(ebpf_cni_maps::PACING_MAP, stringify!(ECNI_PACING)));

#[map]
pub static ECNI_NS_PROBE: Array<NsProbe> = Array::with_max_entries(1, 0);

const _: () = assert!(str_eq(
    ebpf_cni_maps::NS_PROBE_MAP,
    stringify!(ECNI_NS_PROBE)
));

const _: () = assert!(str_eq(ebpf_cni_maps::PORTMAP_MAP, stringify!(ECNI_PORTMAP)));
const _: () = assert!(str_eq(
    ebpf_cni_maps::PORTMAP_HITS_MAP,
    stringify!(ECNI_PM_HITS)
));
const _: () = assert!(str_eq(ebpf_cni_maps::NAT_REV_MAP, stringify!(ECNI_NAT_REV)));
const _: () = assert!(str_eq(
    ebpf_cni_maps::SOCK_REV_MAP,
    stringify!(ECNI_SOCK_REV)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::NODE_ADDRS_MAP,
    stringify!(ECNI_NODE_ADDR)
));
const _: () = assert!(str_eq(ebpf_cni_maps::CONFIG_MAP, stringify!(ECNI_CONFIG)));

/// Whether the node has host port mappings (else their lookups are skipped).
#[inline(always)]
pub fn portmap_enabled() -> bool {
    ECNI_CONFIG
        .get(0)
        .is_some_and(|c| c.flags & NODE_FLAG_PORTMAP != 0)
}

/// Whether no pod of the node has a rate limit (see [`NODE_FLAG_NO_LIMITS`]).
#[inline(always)]
pub fn no_limits() -> bool {
    ECNI_CONFIG
        .get(0)
        .is_some_and(|c| c.flags & NODE_FLAG_NO_LIMITS != 0)
}

/// The node's netns cookie, when the node has host port mappings.
#[inline(always)]
pub fn portmap_netns_cookie() -> Option<u64> {
    let c = ECNI_CONFIG.get(0)?;
    (c.flags & NODE_FLAG_PORTMAP != 0).then_some(c.netns_cookie)
}

#[inline(always)]
pub fn is_node_addr(addr: &[u8; 16]) -> bool {
    // SAFETY: the value is not used, only its presence.
    unsafe { ECNI_NODE_ADDR.get(&EndpointKey { addr: *addr }).is_some() }
}

/// The mapping for `addr:port/proto`, a wildcard of the address's family if there is no
/// mapping for the address itself: the more specific one wins. Fills in the key that
/// matched and the target.
#[inline(always)]
pub fn port_target(
    addr: &[u8; 16],
    port: u16,
    proto: u8,
    key: &mut PortKey,
    target: &mut PortTarget,
) -> bool {
    key.addr = *addr;
    key.port = port;
    key.proto = proto;
    key._pad = 0;
    // SAFETY: values are copied out at once.
    if let Some(t) = unsafe { ECNI_PORTMAP.get(&*key) } {
        *target = *t;
        return true;
    }
    key.addr = if is_v4_mapped(addr) {
        PortKey::WILDCARD_V4
    } else {
        PortKey::WILDCARD_V6
    };
    // SAFETY: as above.
    match unsafe { ECNI_PORTMAP.get(&*key) } {
        Some(t) => {
            *target = *t;
            true
        }
        None => false,
    }
}

#[inline(always)]
pub fn is_v4_mapped(a: &[u8; 16]) -> bool {
    // Word compares: a slice compare is a byte compare per byte at best (unaligned), and
    // was memset and bcmp calls, byte loops the verifier walks one byte at a time, under
    // the linker's default (see xtask's `BPF_RUSTFLAGS`).
    u64::from_ne_bytes([a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]]) == 0
        && u32::from_ne_bytes([a[8], a[9], a[10], a[11]]) == u32::from_ne_bytes([0, 0, 0xff, 0xff])
}

/// Counts a translation on the mapping `key`.
#[inline(always)]
pub fn count_hit(key: &PortKey, len: u32, socket: bool) {
    let Some(h) = ECNI_PM_HITS.get_ptr_mut(key) else {
        return;
    };
    // SAFETY: this CPU's slot (see `count`).
    let h = unsafe { &mut *h };
    if socket {
        h.socket = h.socket.wrapping_add(1);
    } else {
        h.packets = h.packets.wrapping_add(1);
        h.bytes = h.bytes.wrapping_add(u64::from(len));
    }
}

const _: () = assert!(str_eq(
    ebpf_cni_maps::RATE_LIMITS_MAP,
    stringify!(ECNI_RATES)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::SHAPE_SUBNETS_MAP,
    stringify!(ECNI_SHAPE_NET)
));

const _: () = assert!(str_eq(
    ebpf_cni_maps::ENDPOINTS_MAP,
    stringify!(ECNI_ENDPOINTS)
));
const _: () = assert!(str_eq(ebpf_cni_maps::TRACE_MAP, stringify!(ECNI_TRACE)));

/// Whether `ebpf-cni trace` is listening: log lines are only produced then.
#[inline(always)]
pub fn tracing() -> bool {
    ECNI_TRACE.get(0).is_some_and(|v| *v != 0)
}
const _: () = assert!(str_eq(
    ebpf_cni_maps::POD_COUNTERS_MAP,
    stringify!(ECNI_POD_CNT)
));

/// An [`EndpointKey`] on an 8-byte boundary: built by word stores, where the unaligned
/// 16-byte array alone is zeroed by 16 byte stores.
#[repr(C, align(8))]
pub struct AlignedKey(pub EndpointKey);

impl AlignedKey {
    /// An IPv4 address, mapped into IPv6 as the maps key it.
    #[inline(always)]
    pub fn v4(a: [u8; 4]) -> Self {
        let low = u64::from_ne_bytes([0, 0, 0xff, 0xff, a[0], a[1], a[2], a[3]]);
        // SAFETY: two u64 are 16 plain bytes, as the key's array.
        Self(unsafe { core::mem::transmute::<[u64; 2], EndpointKey>([0, low]) })
    }
}

#[inline(always)]
pub fn endpoint(key: &EndpointKey) -> Option<EndpointInfo> {
    // SAFETY: the value is copied out at once; a concurrent update can at worst give a mix
    // of old and new fields of one entry, which the next packet corrects.
    unsafe { ECNI_ENDPOINTS.get(key).copied() }
}

/// The endpoint's entry in place, for reading the fields a packet needs: no copy of the
/// whole entry on the stack. (A copy made LLVM read an unwritten stack slot on the path
/// where the lookup found nothing, which 5.10's verifier refuses.)
#[inline(always)]
pub fn endpoint_in_map(key: &EndpointKey) -> Option<&'static EndpointInfo> {
    // SAFETY: a map value, valid for the whole run; a concurrent update can at worst give
    // a mix of old and new fields of one entry, which the next packet corrects.
    unsafe { ECNI_ENDPOINTS.get(key) }
}

/// Which half of a pod's counters.
#[derive(Clone, Copy)]
pub enum Dir {
    FromPod,
    ToPod,
}

#[derive(Clone, Copy)]
pub enum Event {
    /// Forwarded or passed on: counts packets and bytes.
    Packet,
    /// Dropped by the rate limiter.
    Drop,
    /// Marked ECN CE by the rate limiter.
    Mark,
    /// A helper or a translation failed: a refused redirect or a failed host-port
    /// rewrite drops the packet; a failed FIB lookup leaves it to the stack unchanged.
    Error,
    /// Dropped by the source check: a source address the pod may not send from.
    SourceDrop,
    /// Dropped by the source check: a source MAC other than the pod's.
    MacDrop,
}

/// Counts on the pod whose host veth is `ifindex`. A pod without an entry (one being set
/// up or torn down) is simply not counted.
#[inline(always)]
pub fn count(ifindex: u32, dir: Dir, event: Event, len: u32) {
    count_in(pod_counters(ifindex), dir, event, len);
}

/// This CPU's counters of the pod whose host veth is `ifindex`, looked up once where a
/// program reads their flags (see [`no_ingress_limit`], [`no_egress_limit`],
/// [`no_host_ports`]) and counts into them.
#[inline(always)]
pub fn pod_counters(ifindex: u32) -> Option<*mut PodCounters> {
    ECNI_POD_CNT.get_ptr_mut(&ifindex)
}

/// Whether the pod's counters say it has no ingress limit
/// ([`ebpf_cni_maps::COUNTERS_NO_INGRESS_LIMIT`]; no counters: not known).
#[inline(always)]
pub fn no_ingress_limit(c: Option<*mut PodCounters>) -> bool {
    // SAFETY: this CPU's slot, valid during the program run; only user space writes flags.
    c.is_some_and(|c| unsafe { (*c).to_pod.flags } & COUNTERS_NO_INGRESS_LIMIT != 0)
}

/// Whether the pod's counters say no host port leads to it
/// ([`ebpf_cni_maps::COUNTERS_NO_HOST_PORTS`]; no counters: not known).
#[inline(always)]
pub fn no_host_ports(c: Option<*mut PodCounters>) -> bool {
    // SAFETY: as in `no_ingress_limit`.
    c.is_some_and(|c| unsafe { (*c).from_pod.flags } & COUNTERS_NO_HOST_PORTS != 0)
}

/// Whether the pod's counters say it has no egress limit
/// ([`ebpf_cni_maps::COUNTERS_NO_EGRESS_LIMIT`]; no counters: not known).
#[inline(always)]
pub fn no_egress_limit(c: Option<*mut PodCounters>) -> bool {
    // SAFETY: as in `no_ingress_limit`.
    c.is_some_and(|c| unsafe { (*c).from_pod.flags } & COUNTERS_NO_EGRESS_LIMIT != 0)
}

/// [`count`] into counters already looked up.
#[inline(always)]
pub fn count_in(c: Option<*mut PodCounters>, dir: Dir, event: Event, len: u32) {
    let Some(c) = c else {
        return;
    };
    // SAFETY: this CPU's slot, valid during the program run; TC programs run with bottom
    // halves off, so nothing else on this CPU touches it meanwhile.
    let d: &mut DirCounters = unsafe {
        match dir {
            Dir::FromPod => &mut (*c).from_pod,
            Dir::ToPod => &mut (*c).to_pod,
        }
    };
    match event {
        Event::Packet => {
            d.packets = d.packets.wrapping_add(1);
            d.bytes = d.bytes.wrapping_add(u64::from(len));
        }
        Event::Error => d.errors = d.errors.wrapping_add(1),
        Event::Drop => d.drops = d.drops.wrapping_add(1),
        Event::Mark => d.marks = d.marks.wrapping_add(1),
        Event::SourceDrop => d.source_drops = d.source_drops.wrapping_add(1),
        Event::MacDrop => d.mac_drops = d.mac_drops.wrapping_add(1),
    }
}
