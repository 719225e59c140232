//! `ecni_floor_pod`: the floor of routing pod → pod at TC, for the benchmark (never loaded
//! by the plugin). It does what any program on a pod's host veth must do to deliver a
//! packet to another local pod, with `ecni_from_pod`'s own code for each step: look the
//! destination's endpoint up, take one hop off the TTL (or hop limit), address the frame
//! to the pod from its gateway, and `bpf_redirect_peer` it into the pod's namespace.
//! Everything else `ecni_from_pod` does per packet is left out: the counters, the rate
//! limits, the source check, ARP, host ports, masquerade, the FIB. Anything that is not
//! for a local pod goes on to the stack.
//!
//! The benchmark attaches it in front of `ecni_from_pod` on two pods' host veths and
//! measures pod → pod against a plain veth pair, so the figure says what the TC hook and
//! the redirect cost by themselves, apart from the features.

use aya_ebpf::{
    helpers::generated::{bpf_redirect, bpf_redirect_peer},
    programs::TcContext,
};

use crate::forward::{classify, hop, set_macs, PASS};

#[inline(always)]
pub fn route(ctx: &TcContext) -> i32 {
    route_with(ctx, |ifindex| {
        // SAFETY: plain helper call; it only records the target for after the program
        // returns.
        unsafe { bpf_redirect_peer(ifindex, 0) as i32 }
    })
}

/// The same floor for pods behind netkit devices (Linux 6.7+), for the benchmark's netkit
/// section: attached to a pod's netkit pair as its peer-side program, it runs in the
/// sending pod's transmit, with the frame already handed to the node's side (the primary
/// device). There `bpf_redirect_peer` is refused (it works at TC ingress only), so the
/// frame is sent out of the destination pod's primary device (the endpoint's
/// `host_ifindex`), which hands it to that pod's side in one step.
#[inline(always)]
pub fn route_netkit(ctx: &TcContext) -> i32 {
    route_with(ctx, |ifindex| {
        // SAFETY: as above.
        unsafe { bpf_redirect(ifindex, 0) as i32 }
    })
}

/// The floor's steps, then `redirect` to the destination's host-side device (a generic,
/// so each program gets its helper inlined: BPF has no indirect calls).
#[inline(always)]
fn route_with(ctx: &TcContext, redirect: impl Fn(u32) -> i32) -> i32 {
    let dest = classify(ctx);
    let (Some(ep), proto) = (dest.pod, dest.proto) else {
        return PASS;
    };
    if hop(ctx, proto).is_none() || set_macs(ctx, &ep.host_mac, &ep.pod_mac).is_none() {
        return PASS;
    }
    redirect(ep.host_ifindex)
}
