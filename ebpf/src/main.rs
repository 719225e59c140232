//! Kernel side of ebpf-cni: the TC programs of the pod dataplane.
//!
//! - `ecni_from_pod`, at each pod's host veth ingress, drops what the pod sends from an
//!   address or MAC not its own (see `source`) and forwards the rest: to another local pod
//!   straight into its namespace with `bpf_redirect_peer`; elsewhere by a FIB lookup and
//!   `bpf_redirect_neigh`; anything else goes to the stack unchanged.
//! - `ecni_from_dev`, at the ingress of the node's external devices, delivers packets for
//!   local pods with `bpf_redirect_peer`, and leaves the rest to the stack.
//! - `ecni_from_chain` replaces `ecni_from_pod` on a pod whose interface another plugin made
//!   (ebpf-cni chained after bridge or ptp): it checks sources as `ecni_from_pod` does,
//!   limits, counts and translates host-port flows, and leaves every other packet to that
//!   plugin's bridge or routes.
//! - `ecni_to_pod`, at the host veth egress, counts what the stack sends into the pod.
//! - `ecni_to_tunnel`, at the egress of the cluster network's VXLAN device, sets the
//!   tunnel key towards the peer holding the destination (see `tunnel`).
//! - `ecni_connect4/6`, `ecni_sendmsg4/6`, `ecni_recvmsg4/6`, `ecni_peername4/6`, cgroup
//!   socket-address programs, send the node's own connections to a host port to the pod
//!   (see `sock`); `nat` does the same for packets at the TC hooks above.
//! - `ecni_sockops`, a sockops program on the cgroup v2 root, paces the TCP sockets of pods
//!   with an egress limit (see `pace`).
//!
//! Entry points are thin: they return what the `try_*` function decided, and every path has
//! a verdict chosen on purpose. Under TCX, -1 (`TCX_NEXT`) means "no verdict: continue to
//! the next program, then the stack", so a packet we cannot handle is never lost.
#![no_std]
#![no_main]
// aya-ebpf's map methods take `impl Borrow<K>`: handing them a key by value, as this lint
// asks, copies it into a new stack slot first. Done throughout, it grew the object's
// global functions by 24% (14285 to 17753 instructions), the XDP program by 30% and the
// deepest stack slot any function uses from 280 to 328 bytes (the verifier allows 512).
#![allow(
    clippy::needless_borrows_for_generic_args,
    reason = "a key passed by value costs instructions and stack (see above)"
)]

mod bandwidth;
mod bandwidth_pace;
#[cfg(feature = "prototypes")]
mod floor;
mod forward;
mod host_ports;
mod host_ports_sock;
mod maps;
mod masquerade;
mod packet;
mod rewrite;
mod services;
mod source_check;
mod tcp_ts;
mod trace;
mod tunnel;
#[cfg(feature = "prototypes")]
mod xdp;

#[cfg(feature = "prototypes")]
use aya_ebpf::{macros::xdp, programs::XdpContext};
use aya_ebpf::{
    macros::{cgroup_sock_addr, classifier, sock_ops},
    programs::{SockAddrContext, SockOpsContext, TcContext},
};
use ebpf_cni_maps::str_eq;

// The entry points' identifiers become the program names user space pins and checks.
const _: () = assert!(str_eq(
    ebpf_cni_maps::PROG_FROM_POD,
    stringify!(ecni_from_pod)
));
const _: () = assert!(str_eq(ebpf_cni_maps::PROG_TO_POD, stringify!(ecni_to_pod)));
const _: () = assert!(str_eq(
    ebpf_cni_maps::PROG_FROM_DEV,
    stringify!(ecni_from_dev)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::PROG_FROM_CHAIN,
    stringify!(ecni_from_chain)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::PROG_TO_TUNNEL,
    stringify!(ecni_to_tunnel)
));

/// Host veth ingress: the pod sent this packet.
#[classifier]
pub fn ecni_from_pod(ctx: TcContext) -> i32 {
    forward::from_pod(&ctx)
}

/// Host veth ingress of a pod another plugin created (chained mode).
#[classifier]
pub fn ecni_from_chain(ctx: TcContext) -> i32 {
    forward::from_chained_pod(&ctx)
}

/// Host veth egress: the node's stack sends this packet into the pod.
#[classifier]
pub fn ecni_to_pod(ctx: TcContext) -> i32 {
    forward::to_pod(&ctx)
}

/// Ingress of a node device: the packet may be for a local pod.
#[classifier]
pub fn ecni_from_dev(ctx: TcContext) -> i32 {
    forward::from_dev(&ctx)
}

/// Egress of the cluster network's VXLAN device: the packet is for a peer's pod.
#[classifier]
pub fn ecni_to_tunnel(ctx: TcContext) -> i32 {
    tunnel::to_tunnel(&ctx)
}

// The benchmark's prototypes, in its object only (the `prototypes` feature, which the
// object the plugin embeds is built without; `cargo xtask dist` checks).

/// A measurement prototype of `ecni_from_dev`'s host-port path at XDP, not loaded by the
/// plugin (see `xdp`).
#[cfg(feature = "prototypes")]
#[xdp]
pub fn ecni_xdp_dev(ctx: XdpContext) -> u32 {
    xdp::from_dev(&ctx)
}

#[cfg(feature = "prototypes")]
const _: () = assert!(str_eq(
    ebpf_cni_maps::PROG_XDP_DEV,
    stringify!(ecni_xdp_dev)
));

/// The floor of routing pod → pod at TC, for the benchmark; not loaded by the plugin (see
/// `floor`).
#[cfg(feature = "prototypes")]
#[classifier]
pub fn ecni_floor_pod(ctx: TcContext) -> i32 {
    floor::route(&ctx)
}

#[cfg(feature = "prototypes")]
const _: () = assert!(str_eq(
    ebpf_cni_maps::PROG_FLOOR_POD,
    stringify!(ecni_floor_pod)
));

/// The same floor for pods behind netkit devices; for the benchmark only (see `floor`).
#[cfg(feature = "prototypes")]
#[classifier]
pub fn ecni_floor_nk(ctx: TcContext) -> i32 {
    floor::route_netkit(&ctx)
}

#[cfg(feature = "prototypes")]
const _: () = assert!(str_eq(
    ebpf_cni_maps::PROG_FLOOR_NETKIT,
    stringify!(ecni_floor_nk)
));

/// TCP sockets of a pod with an egress limit pace themselves at it (see `pace`).
#[sock_ops]
pub fn ecni_sockops(ctx: SockOpsContext) -> u32 {
    bandwidth_pace::on_sock_op(&ctx)
}

const _: () = assert!(str_eq(
    ebpf_cni_maps::PROG_SOCKOPS,
    stringify!(ecni_sockops)
));

/// The node's own connections to a host port go to the pod (see `sock`); the plugin's probe
/// socket learns the node's namespace cookie here (see `host_ports_sock::netns_probe`).
#[cgroup_sock_addr(connect4)]
pub fn ecni_connect4(ctx: SockAddrContext) -> i32 {
    if host_ports_sock::netns_probe(&ctx) {
        return host_ports_sock::DENY;
    }
    host_ports_sock::to_pod(&ctx, false)
}

#[cgroup_sock_addr(connect6)]
pub fn ecni_connect6(ctx: SockAddrContext) -> i32 {
    host_ports_sock::to_pod(&ctx, true)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn ecni_sendmsg4(ctx: SockAddrContext) -> i32 {
    host_ports_sock::to_pod(&ctx, false)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn ecni_sendmsg6(ctx: SockAddrContext) -> i32 {
    host_ports_sock::to_pod(&ctx, true)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn ecni_recvmsg4(ctx: SockAddrContext) -> i32 {
    host_ports_sock::from_pod(&ctx, false)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn ecni_recvmsg6(ctx: SockAddrContext) -> i32 {
    host_ports_sock::from_pod(&ctx, true)
}

#[cgroup_sock_addr(getpeername4)]
pub fn ecni_peername4(ctx: SockAddrContext) -> i32 {
    host_ports_sock::from_pod(&ctx, false)
}

#[cgroup_sock_addr(getpeername6)]
pub fn ecni_peername6(ctx: SockAddrContext) -> i32 {
    host_ports_sock::from_pod(&ctx, true)
}

const _: () = assert!(str_eq(
    ebpf_cni_maps::PROG_CONNECT4,
    stringify!(ecni_connect4)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::PROG_CONNECT6,
    stringify!(ecni_connect6)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::PROG_SENDMSG4,
    stringify!(ecni_sendmsg4)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::PROG_SENDMSG6,
    stringify!(ecni_sendmsg6)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::PROG_RECVMSG4,
    stringify!(ecni_recvmsg4)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::PROG_RECVMSG6,
    stringify!(ecni_recvmsg6)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::PROG_PEERNAME4,
    stringify!(ecni_peername4)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::PROG_PEERNAME6,
    stringify!(ecni_peername6)
));

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// GPL-compatible: `bpf_fib_lookup` and the redirect helpers are GPL-only.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
