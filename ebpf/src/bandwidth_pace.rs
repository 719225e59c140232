//! TCP pacing for pods with an egress limit. Traffic from a pod is policed at its host
//! veth's ingress whatever the kernel (a qdisc only holds traffic leaving a device, and the
//! `fq` of paced pods, where the kernel has `sch_fq`, holds traffic towards them: see
//! `bpf/bandwidth.rs` in the plugin), and a TCP sender that bursts into a policer loses packets
//! and backs off far below the rate. TCP paces itself when a socket has
//! `SO_MAX_PACING_RATE` (the stack's internal pacing, no qdisc needed): this sockops
//! program, attached to the cgroup v2 root, sets it on every TCP socket of a limited pod's
//! network namespace when the connection is made or accepted, at 1448/1514 (about 95.6%) of
//! the policer's rate, the payload share of a full frame (see `pacing_rate` in the plugin's
//! `bpf/capability/bandwidth.rs`). The policer stays for everything else (UDP, sockets opened before the
//! limit).

use aya_ebpf::{
    bindings::{
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB,
        BPF_SOCK_OPS_TCP_CONNECT_CB,
    },
    helpers::{bpf_get_netns_cookie, bpf_setsockopt},
    programs::SockOpsContext,
    EbpfContext,
};

use crate::maps::ECNI_PACING;

const SOL_SOCKET: i32 = 1;
const SO_MAX_PACING_RATE: i32 = 47;

const AF_INET: u32 = 2;

/// The connection's peer address, IPv4 mapped into IPv6 (as a dual-stack socket's IPv4
/// peer already is).
#[inline(always)]
fn peer(ctx: &SockOpsContext) -> [u8; 16] {
    // The fields hold the address in network order. Every field is read, by a volatile
    // load at its constant offset, before the family picks: loads in two branches get
    // merged into one through a computed context pointer, which the verifier refuses. No
    // slices: their bounds checks would leave a panic path.
    let ops = ctx.ops;
    // SAFETY: reads of the program's own context fields.
    let (family, v4, w0, w1, w2, w3) = unsafe {
        (
            core::ptr::read_volatile(&(*ops).family),
            core::ptr::read_volatile(&(*ops).remote_ip4),
            core::ptr::read_volatile(&(*ops).remote_ip6[0]),
            core::ptr::read_volatile(&(*ops).remote_ip6[1]),
            core::ptr::read_volatile(&(*ops).remote_ip6[2]),
            core::ptr::read_volatile(&(*ops).remote_ip6[3]),
        )
    };
    if family == AF_INET {
        let [a, b, c, d] = v4.to_ne_bytes();
        return [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d];
    }
    let ([a0, a1, a2, a3], [b0, b1, b2, b3]) = (w0.to_ne_bytes(), w1.to_ne_bytes());
    let ([c0, c1, c2, c3], [d0, d1, d2, d3]) = (w2.to_ne_bytes(), w3.to_ne_bytes());
    [
        a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3,
    ]
}

/// Always 1: a sockops program's return value is not a verdict for these callbacks.
#[inline(always)]
pub fn on_sock_op(ctx: &SockOpsContext) -> u32 {
    let op = ctx.op();
    if op != BPF_SOCK_OPS_TCP_CONNECT_CB
        && op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB
        && op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB
    {
        return 1;
    }
    // SAFETY: plain helper call on the program's context.
    let cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    // SAFETY: the value is copied out before the map could change it.
    let Some(p) = (unsafe { ECNI_PACING.get(&cookie) }) else {
        return 1;
    };
    let mut rate: u32 = p.rate_bytes;
    // A peer the pod's `unshapedSubnets`/`shapedSubnets` exempt from its egress limit:
    // the socket is not held to it either.
    if p.shape_ifindex != 0 && crate::bandwidth::egress_exempts(p.shape_ifindex, peer(ctx)) {
        return 1;
    }
    // SAFETY: `rate` is a valid int of the size passed; the kernel copies it.
    // A failure leaves the socket unpaced, held by the policer as before.
    let _ = unsafe {
        bpf_setsockopt(
            ctx.as_ptr(),
            SOL_SOCKET,
            SO_MAX_PACING_RATE,
            (&mut rate as *mut u32).cast(),
            core::mem::size_of::<u32>() as i32,
        )
    };
    1
}
