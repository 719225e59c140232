//! Per-pod rate limits, checked by the program that sees the packet: the pod's host veth
//! ingress for egress (from the pod); for ingress (towards the pod) the delivering program
//! or the host veth egress, since `bpf_redirect_peer` skips the latter.
//!
//! Two ways to hold a limit (`Bucket::mode`):
//! - Police: a token bucket drops what exceeds rate and burst; while it runs low,
//!   ECN-capable packets are marked CE first, so ECN-aware TCP slows down before it loses
//!   packets. Egress limits, and ingress limits where the kernel has no `sch_fq`.
//! - Pace (EDT): towards a pod whose host veth has an `fq` qdisc, every packet goes through
//!   that veth's egress, where `pace` gives it a departure time (`skb->tstamp`) that keeps
//!   the pod's traffic at the rate; fq releases it then. A sender that is not ours (a host
//!   behind the node, another pod) sees delay instead of loss, as behind a real link of that
//!   rate, and gets the rate. Packets beyond the horizon are dropped, bounding the queue.
//!   A sparse flow's small packet (at most `SPARSE_BYTES`, its flow has nothing waiting in
//!   the queue: a ping, a DNS query, the ACKs of an upload) is charged to the pod's clock
//!   like any other but leaves at once instead of behind the other flows' backlog, as
//!   fq_codel serves sparse flows first; every packet, small or not, updates its flow's
//!   state (one LRU lookup per paced packet). fq keeps each flow's packets in departure order, so a flow is never reordered:
//!   its packets count as waiting until the pod's clock after its last one has passed. The
//!   rate holds, since every packet is charged and none may push the clock past the
//!   horizon.
//!
//! A pod with `unshapedSubnets` or `shapedSubnets` has a flag in its buckets' `mode`; only
//! then is the packet's remote address (towards the pod: the source; from it: the
//! destination) looked up in `ECNI_SHAPE_NET` under the pod's host veth, and a packet the
//! subnets exempt passes unlimited and uncharged. Other pods pay nothing for this.
//!
//! Updates from two CPUs may race; the error is a few packets' worth of tokens or time, not
//! a leak.

use aya_ebpf::{
    helpers::{bpf_get_hash_recalc, bpf_ktime_get_ns},
    macros::map,
    maps::{lpm_trie::Key, LruHashMap},
    programs::TcContext,
};
use ebpf_cni_maps::{
    edt_horizon_ns, Bucket, PaceFlowKey, ShapeSubnetKey, LIMIT_EDT, LIMIT_MODE_MASK,
    LIMIT_SUBNETS_SHAPED, LIMIT_SUBNETS_UNSHAPED, MAX_PACE_FLOWS,
};

use crate::{
    maps::{ECNI_RATES, ECNI_SHAPE_NET},
    packet::{ptr_at, EthHdr, Ipv4Hdr, Ipv6Hdr, ETH_HLEN, ETH_P_IP, ETH_P_IPV6},
};

pub enum Verdict {
    Pass,
    /// Passed, marked ECN CE.
    Mark,
    Drop,
}

#[derive(Clone, Copy)]
pub enum Way {
    /// Towards the pod.
    Ingress,
    /// From the pod.
    Egress,
}

const NSEC_PER_SEC: u64 = 1_000_000_000;
/// The largest packet of a sparse flow that leaves at once: a ping, a DNS query, a TCP
/// segment without data or with little.
const SPARSE_BYTES: u64 = 256;

/// The pacer's flows (see the module's doc); the programs' own, so not pinned.
#[map]
static ECNI_PACE_FLOW: LruHashMap<PaceFlowKey, u64> =
    LruHashMap::with_max_entries(MAX_PACE_FLOWS, 0);

/// The limit of the pod behind host veth `ifindex` in direction `way`, if it has one.
#[inline(always)]
fn bucket(ifindex: u32, way: Way) -> Option<&'static mut Bucket> {
    let limit = ECNI_RATES.get_ptr_mut(&ifindex)?;
    // SAFETY: a map value pointer, valid during the run; concurrent CPUs may race on the
    // plain fields, which costs accuracy, never safety.
    let b: &mut Bucket = unsafe {
        match way {
            Way::Ingress => &mut (*limit).ingress,
            Way::Egress => &mut (*limit).egress,
        }
    };
    (b.rate_bytes != 0).then_some(b)
}

/// Whether the packet is exempt from the limit `b` of the pod behind `ifindex` by the pod's
/// `unshapedSubnets` (its remote address is in one) or `shapedSubnets` (it is in none). A
/// packet that is not IP matches no subnet, as the reference's u32 filters match none.
///
/// Not inlined: its subnet key and address stay out of the calling program's frame, which
/// the call chains under it (masquerade, the source check) share with it within the
/// verifier's 512-byte stack.
#[inline(never)]
fn exempt(ctx: &TcContext, ifindex: u32, way: Way, b: &Bucket) -> bool {
    let flags = b.mode & (LIMIT_SUBNETS_UNSHAPED | LIMIT_SUBNETS_SHAPED);
    if flags == 0 {
        return false;
    }
    exempt_addr(ifindex, flags, remote(ctx, way))
}

/// Whether the subnets of the pod behind `ifindex` (`flags`: its bucket's subnet flags,
/// not 0) exempt remote address `addr` (`None`: not IP, in no subnet).
#[inline(always)]
fn exempt_addr(ifindex: u32, flags: u32, addr: Option<[u8; 16]>) -> bool {
    let hit = addr.is_some_and(|addr| {
        let key = Key::new(32 + 128, ShapeSubnetKey { ifindex, addr });
        ECNI_SHAPE_NET.get(&key).is_some()
    });
    if flags & LIMIT_SUBNETS_UNSHAPED != 0 {
        hit
    } else {
        !hit
    }
}

/// For TCP pacing: whether the egress limit of the pod behind `ifindex` does not apply to
/// a connection with peer `addr` (IPv4 mapped into IPv6), by the pod's subnets.
#[inline(always)]
pub fn egress_exempts(ifindex: u32, addr: [u8; 16]) -> bool {
    let Some(b) = bucket(ifindex, Way::Egress) else {
        return false;
    };
    let flags = b.mode & (LIMIT_SUBNETS_UNSHAPED | LIMIT_SUBNETS_SHAPED);
    flags != 0 && exempt_addr(ifindex, flags, Some(addr))
}

/// The packet's remote address, IPv4 mapped into IPv6: the source of a packet towards the
/// pod, the destination of one from it.
#[inline(always)]
fn remote(ctx: &TcContext, way: Way) -> Option<[u8; 16]> {
    let eth = ptr_at::<EthHdr>(ctx, 0)?;
    // SAFETY: bounds checked by `ptr_at`.
    match u16::from_be_bytes(unsafe { (*eth).proto }) {
        ETH_P_IP => {
            let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)?;
            // SAFETY: bounds checked by `ptr_at`.
            let a = unsafe {
                match way {
                    Way::Ingress => (*ip).saddr,
                    Way::Egress => (*ip).daddr,
                }
            };
            Some([
                0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a[0], a[1], a[2], a[3],
            ])
        }
        ETH_P_IPV6 => {
            let ip = ptr_at::<Ipv6Hdr>(ctx, ETH_HLEN)?;
            // SAFETY: bounds checked by `ptr_at`.
            Some(unsafe {
                match way {
                    Way::Ingress => (*ip).saddr,
                    Way::Egress => (*ip).daddr,
                }
            })
        }
        _ => None,
    }
}

/// How a packet towards the pod behind a host veth is to be delivered.
pub enum Towards {
    /// The pod's ingress limit is paced: deliver through the host veth's egress (its
    /// `fq`), where [`pace`] stamps it, not straight into the pod.
    Paced,
    /// Straight into the pod, after policing (a pod without a limit: [`Verdict::Pass`]).
    Direct(Verdict),
}

/// The ingress limit of the pod behind host veth `ifindex`, for a packet a program is about
/// to deliver into it: one lookup of the pod's limits, which answers both whether the
/// packet is paced and, when not, the policer's verdict.
#[inline(always)]
pub fn towards(ctx: &TcContext, ifindex: u32) -> Towards {
    let Some(b) = bucket(ifindex, Way::Ingress) else {
        return Towards::Direct(Verdict::Pass);
    };
    if b.mode & LIMIT_MODE_MASK == LIMIT_EDT {
        return Towards::Paced;
    }
    Towards::Direct(police_bucket(ctx, ifindex, Way::Ingress, b))
}

/// Whether the pod behind host veth `ifindex` has an ingress limit (the XDP prototype
/// leaves such pods to the TC path).
#[cfg(feature = "prototypes")]
#[inline(always)]
pub fn has_ingress_limit(ifindex: u32) -> bool {
    bucket(ifindex, Way::Ingress).is_some()
}

/// Applies the limit of the pod behind host veth `ifindex` in direction `way` by policing;
/// an ingress limit that is paced is left to [`pace`] at the host veth egress.
#[inline(always)]
pub fn police(ctx: &TcContext, ifindex: u32, way: Way) -> Verdict {
    let Some(b) = bucket(ifindex, way) else {
        return Verdict::Pass;
    };
    police_bucket(ctx, ifindex, way, b)
}

/// [`police`] with the pod's bucket in hand.
#[inline(always)]
fn police_bucket(ctx: &TcContext, ifindex: u32, way: Way, b: &mut Bucket) -> Verdict {
    if b.mode & LIMIT_MODE_MASK == LIMIT_EDT || exempt(ctx, ifindex, way, b) {
        return Verdict::Pass;
    }
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    // A long idle time only refills to the burst; capping it keeps the product in range.
    let elapsed = now.saturating_sub(b.last_ns).min(NSEC_PER_SEC);
    let refill = elapsed * b.rate_bytes / NSEC_PER_SEC;
    if refill > 0 {
        b.tokens = (b.tokens + refill).min(u64::from(b.burst_bytes));
        b.last_ns = now;
    }
    let len = u64::from(ctx.len());
    if b.tokens < len {
        return Verdict::Drop;
    }
    b.tokens -= len;
    if b.tokens < u64::from(b.burst_bytes) / 4 && mark_ce(ctx) {
        return Verdict::Mark;
    }
    Verdict::Pass
}

/// At the host veth egress of the pod behind `ifindex`: when its ingress limit is paced,
/// stamps the packet with its departure time, `max(last departure, now - burst / rate) +
/// len / rate`, or drops it when that lies beyond the horizon. Anything else passes as is
/// (a policed limit was applied where the packet was delivered, or is applied by `police`).
#[inline(always)]
pub fn pace(ctx: &TcContext, ifindex: u32) -> Verdict {
    let Some(b) = bucket(ifindex, Way::Ingress) else {
        return Verdict::Pass;
    };
    if b.mode & LIMIT_MODE_MASK != LIMIT_EDT {
        return police_bucket(ctx, ifindex, Way::Ingress, b);
    }
    if exempt(ctx, ifindex, Way::Ingress, b) {
        // Leaves now, uncharged; a receive timestamp would look like the far future to fq.
        // SAFETY: tc programs may write `tstamp` of their own context.
        unsafe { (*ctx.skb.skb).tstamp = 0 };
        return Verdict::Pass;
    }
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let rate = b.rate_bytes;
    // Checked again on the value in hand, so no division can panic (the verifier refuses a
    // program with a panic path).
    if rate == 0 {
        return Verdict::Pass;
    }
    let cost = wire_len(ctx) * NSEC_PER_SEC / rate;
    // After an idle time the pod may take its burst at once, no more.
    let credit = u64::from(b.burst_bytes) * NSEC_PER_SEC / rate;
    let start = b.last_ns.max(now.saturating_sub(credit));
    let depart = start + cost;
    if depart > now && depart - now > edt_horizon_ns(rate) {
        return Verdict::Drop;
    }
    b.last_ns = depart;
    // Every packet keeps its flow's state; only a small one may leave at once.
    let idle = sparse(ctx, ifindex, now, depart);
    let stamp = if idle && u64::from(ctx.len()) <= SPARSE_BYTES {
        now
    } else {
        depart
    };
    // A departure in the past leaves now. Writing it always also replaces whatever the
    // packet carried (a receive timestamp would look like the far future to fq).
    // SAFETY: tc programs may write `tstamp` of their own context.
    unsafe { (*ctx.skb.skb).tstamp = stamp };
    Verdict::Pass
}

/// Whether the packet's flow has nothing waiting in the queue of the pod behind `ifindex`
/// (see the module's doc); `clock` is the pod's clock after this packet, which the flow's
/// next packet is compared with.
#[inline(always)]
fn sparse(ctx: &TcContext, ifindex: u32, now: u64, clock: u64) -> bool {
    let key = PaceFlowKey {
        ifindex,
        // SAFETY: plain helper call on our own context.
        hash: unsafe { bpf_get_hash_recalc(ctx.skb.skb) },
    };
    match ECNI_PACE_FLOW.get_ptr_mut(&key) {
        Some(last) => {
            // SAFETY: a map value pointer, valid during the run; a race between two CPUs
            // costs one packet its place, never safety.
            unsafe {
                let idle = *last <= now;
                *last = clock;
                idle
            }
        }
        None => {
            let _ = ECNI_PACE_FLOW.insert(&key, &clock, 0);
            true
        }
    }
}

/// The bytes the packet takes as Ethernet frames, as a limit counts them (and tbf does): a
/// GSO packet becomes `gso_segs` frames, each with its own headers, where `len` counts one
/// set. Headers it cannot read count as IPv4 + TCP with timestamps (66 bytes).
#[inline(always)]
fn wire_len(ctx: &TcContext) -> u64 {
    let len = u64::from(ctx.len());
    // SAFETY: a read of the context's own field.
    let segs = u64::from(unsafe { (*ctx.skb.skb).gso_segs });
    if segs <= 1 {
        return len;
    }
    len + (segs - 1) * header_len(ctx).unwrap_or(66)
}

const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

/// Ethernet, IP and TCP/UDP header bytes of a frame (IPv6: without extension headers).
#[inline(always)]
pub fn header_len(ctx: &TcContext) -> Option<u64> {
    let eth = ptr_at::<EthHdr>(ctx, 0)?;
    // SAFETY: bounds checked by `ptr_at`.
    let (l3, proto) = match u16::from_be_bytes(unsafe { (*eth).proto }) {
        ETH_P_IP => {
            let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)?;
            // SAFETY: bounds checked by `ptr_at`.
            let ip = unsafe { &*ip };
            (usize::from(ip.ver_ihl & 0x0f) * 4, ip.protocol)
        }
        ETH_P_IPV6 => {
            let ip = ptr_at::<Ipv6Hdr>(ctx, ETH_HLEN)?;
            // SAFETY: bounds checked by `ptr_at`.
            (40, unsafe { (*ip).nexthdr })
        }
        _ => return None,
    };
    let l4 = match proto {
        IPPROTO_TCP => {
            // The data offset: the high nibble of the TCP header's byte 12.
            let off = ptr_at::<u8>(ctx, ETH_HLEN + l3 + 12)?;
            // SAFETY: bounds checked by `ptr_at`.
            usize::from(unsafe { *off } >> 4) * 4
        }
        IPPROTO_UDP => 8,
        _ => return None,
    };
    Some((ETH_HLEN + l3 + l4) as u64)
}

/// Sets ECN CE on an ECN-capable IP packet; false if it is not one.
#[inline(always)]
fn mark_ce(ctx: &TcContext) -> bool {
    let Some(eth) = ptr_at::<EthHdr>(ctx, 0) else {
        return false;
    };
    // SAFETY: bounds checked by `ptr_at`; TC programs may write packet data.
    match u16::from_be_bytes(unsafe { (*eth).proto }) {
        ETH_P_IP => {
            let Some(ip) = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN) else {
                return false;
            };
            // SAFETY: bounds checked by `ptr_at`; TC programs may write packet data.
            let ip = unsafe { &mut *ip };
            let ecn = ip.tos & 0x03;
            if ecn == 0 || ecn == 0x03 {
                return false;
            }
            // The 16-bit word (ver_ihl, tos) grows by (3 - ecn); the checksum shrinks by it.
            let old = u32::from(ip.tos);
            ip.tos |= 0x03;
            let diff = u32::from(ip.tos) - old;
            let mut sum = u32::from(!u16::from_be_bytes(ip.check)) + diff;
            sum = (sum & 0xffff) + (sum >> 16);
            ip.check = (!(sum as u16)).to_be_bytes();
            true
        }
        ETH_P_IPV6 => {
            let Some(ip) = ptr_at::<Ipv6Hdr>(ctx, ETH_HLEN) else {
                return false;
            };
            // SAFETY: bounds checked by `ptr_at`; TC programs may write packet data.
            let ip = unsafe { &mut *ip };
            // ECN is bits 4-5 of the second byte (the low bits of the traffic class).
            let ecn = (ip.ver_tc_flow[1] >> 4) & 0x03;
            if ecn == 0 || ecn == 0x03 {
                return false;
            }
            ip.ver_tc_flow[1] |= 0x30;
            true
        }
        _ => false,
    }
}
