//! Host ports for the node's own processes, at the socket: `connect()` and unconnected
//! `sendmsg()` to a host port (on a node address, 127.0.0.0/8 or ::1) are sent to the pod
//! instead, and `getpeername()` / `recvmsg()` show the host port again. Packets then travel
//! between the node and the pod untranslated, so loopback destinations work (the reference
//! plugin needs `route_localnet` for 127.0.0.1 and cannot do ::1 at all).
//!
//! These programs are attached to the cgroup v2 root, so they see every socket of the
//! machine; they act only on sockets of the node's network namespace (its cookie is in
//! `ECNI_CONFIG`), and only while the node has host port mappings. A mapping flagged
//! `PORT_FLAG_NO_LOOPBACK` (`hostPortsOnLoopback: false`) leaves loopback destinations to
//! the node's own listeners.
//!
//! On a kernel without `SO_NETNS_COOKIE` (before 5.14) the plugin learns the node's cookie
//! through `connect4` itself: see [`netns_probe`].

use aya_ebpf::{
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie},
    programs::SockAddrContext,
    EbpfContext,
};
use ebpf_cni_maps::{
    EndpointKey, PortKey, PortTarget, SockKey, SockOrig, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP,
    PORT_FLAG_NO_LOOPBACK,
};

use crate::maps::{
    count_hit, is_node_addr, is_v4_mapped, port_target, portmap_netns_cookie, ECNI_NS_PROBE,
    ECNI_SOCK_REV,
};

/// What socket-address programs return to let the call proceed.
pub const ALLOW: i32 = 1;
/// What they return to fail the call with `EPERM`.
pub const DENY: i32 = 0;

/// connect4: whether this is the plugin's armed probe socket (`ECNI_NS_PROBE`: its socket
/// cookie and its random destination both match), in which case its network namespace's
/// cookie is recorded there and the probe disarmed; the caller then refuses the connection,
/// which tells the plugin that its own socket was the one recorded. Any other socket costs
/// one array lookup and a compare.
#[inline(always)]
pub fn netns_probe(ctx: &SockAddrContext) -> bool {
    let Some(p) = ECNI_NS_PROBE.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: `p` points into the array's only entry, valid for the whole run; the context
    // fields are checked by the kernel. A concurrent probe is excluded by the plugin (it
    // arms the map under the node lock), and a torn read only fails to match.
    unsafe {
        let armed = (*p).sock_cookie;
        if armed == 0
            || (*ctx.sock_addr).user_ip4.to_ne_bytes() != (*p).addr_be
            || read_port(ctx) != (*p).port
            || bpf_get_socket_cookie(ctx.as_ptr()) != armed
        {
            return false;
        }
        (*p).netns_cookie = bpf_get_netns_cookie(ctx.as_ptr());
        (*p).sock_cookie = 0;
    }
    true
}

#[inline(always)]
fn on_node(ctx: &SockAddrContext) -> bool {
    let Some(cookie) = portmap_netns_cookie() else {
        return false;
    };
    // SAFETY: plain helper call on the program's context.
    unsafe { bpf_get_netns_cookie(ctx.as_ptr()) == cookie }
}

#[inline(always)]
fn is_loopback(a: &[u8; 16]) -> bool {
    (is_v4_mapped(a) && a[12] == 127) || is_v6_loopback(a)
}

#[inline(always)]
fn is_v6_loopback(a: &[u8; 16]) -> bool {
    a[..15] == [0; 15] && a[15] == 1
}

#[inline(always)]
fn protocol(ctx: &SockAddrContext) -> Option<u8> {
    // SAFETY: the context is valid for the whole run; the kernel checks field accesses.
    let p = unsafe { (*ctx.sock_addr).protocol };
    let p = p as u8;
    (p == IPPROTO_TCP || p == IPPROTO_UDP || p == IPPROTO_SCTP).then_some(p)
}

/// The destination (connect/sendmsg) or peer (recvmsg/getpeername) in `EndpointKey` form.
#[inline(always)]
fn read_addr(ctx: &SockAddrContext, v6: bool) -> [u8; 16] {
    // SAFETY: as in `protocol`.
    unsafe {
        let sa = ctx.sock_addr;
        if v6 {
            let w = [
                (*sa).user_ip6[0],
                (*sa).user_ip6[1],
                (*sa).user_ip6[2],
                (*sa).user_ip6[3],
            ];
            let mut a = [0u8; 16];
            let mut i = 0;
            while i < 4 {
                let b = w[i].to_ne_bytes();
                a[i * 4] = b[0];
                a[i * 4 + 1] = b[1];
                a[i * 4 + 2] = b[2];
                a[i * 4 + 3] = b[3];
                i += 1;
            }
            a
        } else {
            EndpointKey::v4((*sa).user_ip4.to_ne_bytes()).addr
        }
    }
}

#[inline(always)]
fn write_addr(ctx: &SockAddrContext, v6: bool, a: &[u8; 16]) {
    let word = |i: usize| u32::from_ne_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]]);
    // SAFETY: as in `protocol`; these fields are writable in these program types.
    unsafe {
        let sa = ctx.sock_addr;
        if v6 {
            (*sa).user_ip6[0] = word(0);
            (*sa).user_ip6[1] = word(4);
            (*sa).user_ip6[2] = word(8);
            (*sa).user_ip6[3] = word(12);
        } else {
            (*sa).user_ip4 = word(12);
        }
    }
}

#[inline(always)]
fn read_port(ctx: &SockAddrContext) -> u16 {
    // SAFETY: as in `protocol`. The port is in network order in the low 16 bits.
    u16::from_be(unsafe { (*ctx.sock_addr).user_port } as u16)
}

#[inline(always)]
fn write_port(ctx: &SockAddrContext, port: u16) {
    // SAFETY: as in `write_addr`.
    unsafe { (*ctx.sock_addr).user_port = u32::from(port.to_be()) };
}

/// connect() and sendmsg(): a host port becomes the pod.
#[inline(always)]
pub fn to_pod(ctx: &SockAddrContext, v6: bool) -> i32 {
    if !on_node(ctx) {
        return ALLOW;
    }
    let Some(proto) = protocol(ctx) else {
        return ALLOW;
    };
    let addr = read_addr(ctx, v6);
    if !is_loopback(&addr) && !is_node_addr(&addr) {
        return ALLOW;
    }
    let port = read_port(ctx);
    // A loopback destination answers for every address of its family.
    let lookup = if is_loopback(&addr) {
        if is_v6_loopback(&addr) {
            [0; 16]
        } else {
            EndpointKey::v4([0; 4]).addr
        }
    } else {
        addr
    };
    let mut key = PortKey::default();
    let mut t = PortTarget::default();
    if !port_target(&lookup, port, proto, &mut key, &mut t) {
        return ALLOW;
    }
    // `hostPortsOnLoopback: false`: loopback stays the node's.
    if t.flags & PORT_FLAG_NO_LOOPBACK != 0 && is_loopback(&addr) {
        return ALLOW;
    }
    // An IPv4 socket cannot reach an IPv6 pod and vice versa (a v6 socket reaches IPv4
    // pods through mapped addresses).
    if !v6 && !is_v4_mapped(&t.pod_addr) {
        return ALLOW;
    }
    // SAFETY: plain helper call on the program's context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let k = SockKey {
        cookie,
        pod_addr: t.pod_addr,
        pod_port: t.pod_port,
        _pad: [0; 6],
    };
    let orig = SockOrig {
        addr,
        port,
        _pad: [0; 6],
    };
    if ECNI_SOCK_REV.insert(&k, &orig, 0).is_err() {
        return ALLOW;
    }
    write_addr(ctx, v6, &t.pod_addr);
    write_port(ctx, t.pod_port);
    count_hit(&key, 0, true);
    ALLOW
}

/// getpeername() and recvmsg(): the pod shows as the host port it was reached through.
#[inline(always)]
pub fn from_pod(ctx: &SockAddrContext, v6: bool) -> i32 {
    if !on_node(ctx) {
        return ALLOW;
    }
    // SAFETY: plain helper call on the program's context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let k = SockKey {
        cookie,
        pod_addr: read_addr(ctx, v6),
        pod_port: read_port(ctx),
        _pad: [0; 6],
    };
    // SAFETY: copied out at once.
    if let Some(orig) = unsafe { ECNI_SOCK_REV.get(&k) }.copied() {
        write_addr(ctx, v6, &orig.addr);
        write_port(ctx, orig.port);
    }
    ALLOW
}
