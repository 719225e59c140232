//! Per-pod rate limits: a token bucket per pod and direction, checked by the program that
//! sees the packet (the pod's host veth ingress for egress; the delivering program or the
//! host veth egress for ingress, since `bpf_redirect_peer` skips the latter).
//!
//! This kernel has no `sch_fq`, so there is no queue to pace into (EDT): the bucket polices.
//! Packets beyond the burst are dropped; while the bucket runs low, ECN-capable packets are
//! marked CE first, so ECN-aware TCP slows down before it loses packets. Updates from two
//! CPUs may race; the error is a few packets' worth of tokens, not a leak.

use aya_ebpf::{helpers::bpf_ktime_get_ns, programs::TcContext};
use ebpf_cni_maps::Bucket;

use crate::{
    maps::ECNI_RATES,
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

/// Applies the limit of the pod behind host veth `ifindex` in direction `way`.
#[inline(always)]
pub fn police(ctx: &TcContext, ifindex: u32, way: Way) -> Verdict {
    let Some(limit) = ECNI_RATES.get_ptr_mut(&ifindex) else {
        return Verdict::Pass;
    };
    // SAFETY: a map value pointer, valid during the run; concurrent CPUs may race on the
    // plain fields, which costs accuracy, never safety.
    let b: &mut Bucket = unsafe {
        match way {
            Way::Ingress => &mut (*limit).ingress,
            Way::Egress => &mut (*limit).egress,
        }
    };
    if b.rate_bytes == 0 {
        return Verdict::Pass;
    }
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    // A long idle time only refills to the burst; capping it keeps the product in range.
    let elapsed = now.saturating_sub(b.last_ns).min(NSEC_PER_SEC);
    let refill = elapsed * b.rate_bytes / NSEC_PER_SEC;
    if refill > 0 {
        b.tokens = (b.tokens + refill).min(b.burst_bytes);
        b.last_ns = now;
    }
    let len = u64::from(ctx.len());
    if b.tokens < len {
        return Verdict::Drop;
    }
    b.tokens -= len;
    if b.tokens < b.burst_bytes / 4 && mark_ce(ctx) {
        return Verdict::Mark;
    }
    Verdict::Pass
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
