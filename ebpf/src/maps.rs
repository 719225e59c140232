//! The node-wide maps, shared by every program and pinned by user space under the node's
//! directory (the loader reuses the pins, so every loaded revision sees the same entries).

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, PerCpuHashMap},
};
use ebpf_cni_maps::{
    str_eq, DirCounters, EndpointInfo, EndpointKey, PodCounters, RateLimit, MAX_ENDPOINTS,
};

#[map]
pub static ECNI_ENDPOINTS: HashMap<EndpointKey, EndpointInfo> =
    HashMap::with_max_entries(MAX_ENDPOINTS, 0);

#[map]
pub static ECNI_POD_CNT: PerCpuHashMap<u32, PodCounters> =
    PerCpuHashMap::with_max_entries(MAX_ENDPOINTS, 0);

#[map]
pub static ECNI_TRACE: Array<u32> = Array::with_max_entries(1, 0);

#[map]
pub static ECNI_RATES: HashMap<u32, RateLimit> = HashMap::with_max_entries(MAX_ENDPOINTS, 0);

const _: () = assert!(str_eq(
    ebpf_cni_maps::RATE_LIMITS_MAP,
    stringify!(ECNI_RATES)
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

#[inline(always)]
pub fn endpoint(key: &EndpointKey) -> Option<EndpointInfo> {
    // SAFETY: the value is copied out at once; a concurrent update can at worst give a mix
    // of old and new fields of one entry, which the next packet corrects.
    unsafe { ECNI_ENDPOINTS.get(key).copied() }
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
    /// A helper failed; the packet went to the stack.
    Error,
}

/// Counts on the pod whose host veth is `ifindex`. A pod without an entry (one being set
/// up or torn down) is simply not counted.
#[inline(always)]
pub fn count(ifindex: u32, dir: Dir, event: Event, len: u32) {
    let Some(c) = ECNI_POD_CNT.get_ptr_mut(&ifindex) else {
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
    }
}
