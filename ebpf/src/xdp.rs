//! `ecni_xdp_dev`: a prototype of `ecni_from_dev`'s host-port path at XDP, to measure what
//! delivering host-port traffic before the stack builds its skb would save. Not loaded by
//! the plugin: the benchmark's `xdp` section attaches it to a node's uplink in native mode
//! to compare it with the TC path, and the program tests check its translation.
//! docs/dataplane.md says why the product stays on TC.
//!
//! For an IPv4 TCP or UDP packet without options or fragments, to a node address and a
//! mapped host port, of a pod without an ingress limit, it does what `host_ports::forward` and
//! `forward::deliver` do at TC: records the reverse translation in `ECNI_NAT_REV`, rewrites
//! the destination address and port (IPv4 header and transport checksums patched
//! incrementally, RFC 1624), decrements the TTL, sets the pod's MACs, counts the packet and
//! the mapping's hit, and redirects the frame to the pod's host veth (`bpf_redirect`), whose
//! peer in the pod receives it as an XDP frame. Everything else, masquerade's replies and
//! IPv6 included, is `XDP_PASS`: the TC program behind it on the same device handles it.
//!
//! XDP cannot see an skb's checksum state: the transport checksum is patched as a full
//! checksum, which is what a frame from a wire carries. A frame from a local socket on a
//! veth whose sender offloads its checksum (`CHECKSUM_PARTIAL`) carries the pseudo header's
//! sum instead, which this patch would break; the benchmark's external client sends with
//! full checksums for that reason, as a NIC's peer does.

use aya_ebpf::{
    bindings::xdp_action::{XDP_ABORTED, XDP_PASS},
    helpers::generated::bpf_redirect,
    programs::XdpContext,
};
use ebpf_cni_maps::{EndpointKey, NatKey, NatOrig, PortKey, PortTarget, IPPROTO_TCP, IPPROTO_UDP};

use crate::{
    bandwidth::has_ingress_limit,
    maps::{
        count, count_hit, endpoint, is_node_addr, port_target, portmap_enabled, AlignedKey, Dir,
        Event, ECNI_NAT_REV,
    },
    packet::{copy16, EthHdr, Ipv4Hdr, ETH_HLEN, ETH_P_IP},
    rewrite::fold,
};

const L4_OFF: usize = ETH_HLEN + 20;
/// `bpf_redirect`'s answer when it refuses (the XDP verdict `XDP_ABORTED` is 0).
const REDIRECT_REFUSED: i64 = XDP_ABORTED as i64;

#[inline(always)]
fn ptr_at<T>(ctx: &XdpContext, offset: usize) -> Option<*mut T> {
    let (start, end) = (ctx.data(), ctx.data_end());
    if start + offset + core::mem::size_of::<T>() > end {
        return None;
    }
    Some((start + offset) as *mut T)
}

/// A checksum field (network order bytes) after 16-bit words `old` became `new`
/// (RFC 1624: HC' = ~(~HC + ~m + m')), each pair given as host-order values of the words.
#[inline(always)]
fn patch(check: [u8; 2], old: &[u16; 3], new: &[u16; 3]) -> [u8; 2] {
    let mut sum = u32::from(!u16::from_be_bytes(check));
    let mut i = 0;
    while i < 3 {
        sum += u32::from(!old[i]) + u32::from(new[i]);
        i += 1;
    }
    (!fold(sum)).to_be_bytes()
}

#[inline(always)]
fn words(addr: [u8; 4], port: u16) -> [u16; 3] {
    [
        u16::from_be_bytes([addr[0], addr[1]]),
        u16::from_be_bytes([addr[2], addr[3]]),
        port,
    ]
}

/// The scratch of one run: map keys and values (on the BPF stack: about 170 bytes, and this
/// program calls no subprogram that needs more).
#[repr(C)]
struct Flow {
    target: PortTarget,
    rev: NatKey,
    orig: NatOrig,
    key: PortKey,
}

#[inline(always)]
pub fn from_dev(ctx: &XdpContext) -> u32 {
    try_from_dev(ctx).unwrap_or(XDP_PASS)
}

#[inline(always)]
fn try_from_dev(ctx: &XdpContext) -> Option<u32> {
    if !portmap_enabled() {
        return None;
    }
    let eth: *mut EthHdr = ptr_at(ctx, 0)?;
    // SAFETY: bounds checked by `ptr_at`.
    if u16::from_be_bytes(unsafe { (*eth).proto }) != ETH_P_IP {
        return None;
    }
    let ip: *mut Ipv4Hdr = ptr_at(ctx, ETH_HLEN)?;
    // SAFETY: bounds checked by `ptr_at`; XDP programs may write packet data.
    let ip = unsafe { &mut *ip };
    let proto = ip.protocol;
    if ip.ver_ihl != 0x45
        || u16::from_be_bytes(ip.frag_off) & 0x3fff != 0
        || ip.ttl <= 1
        || (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
    {
        return None;
    }
    let l4: *mut [u8; 8] = ptr_at(ctx, L4_OFF)?;
    // SAFETY: bounds checked by `ptr_at`.
    let l4 = unsafe { &mut *l4 };
    let (sport, dport) = (
        u16::from_be_bytes([l4[0], l4[1]]),
        u16::from_be_bytes([l4[2], l4[3]]),
    );
    let dst = AlignedKey::v4(ip.daddr);
    if !is_node_addr(&dst.0.addr) {
        return None;
    }
    // SAFETY: an all-zero `Flow` is valid (plain integers and byte arrays).
    let mut f: Flow = unsafe { core::mem::zeroed() };
    if !port_target(&dst.0.addr, dport, proto, &mut f.key, &mut f.target) {
        return None;
    }
    // Limited pods keep the TC path (its policer and pacer work on skbs).
    if has_ingress_limit(f.target.host_ifindex) {
        return None;
    }
    let ep = endpoint(&EndpointKey {
        addr: f.target.pod_addr,
    })?;
    if ep.host_ifindex != f.target.host_ifindex {
        return None;
    }
    let src = AlignedKey::v4(ip.saddr);
    copy16(&mut f.rev.pod_addr, &f.target.pod_addr);
    copy16(&mut f.rev.peer_addr, &src.0.addr);
    f.rev.pod_port = f.target.pod_port;
    f.rev.peer_port = sport;
    f.rev.proto = proto;
    copy16(&mut f.orig.addr, &dst.0.addr);
    f.orig.port = dport;
    // As `host_ports::forward`: written only when new or changed.
    // SAFETY: the value is compared at once.
    let same = match unsafe { ECNI_NAT_REV.get(&f.rev) } {
        Some(v) => v.addr == f.orig.addr && v.port == f.orig.port && v.flags == f.orig.flags,
        None => false,
    };
    if !same && ECNI_NAT_REV.insert(&f.rev, &f.orig, 0).is_err() {
        return None;
    }
    let len = (ctx.data_end() - ctx.data()) as u32;
    count_hit(&f.key, len, false);
    let t = &f.target.pod_addr;
    let new_addr = [t[12], t[13], t[14], t[15]];
    let old = words(ip.daddr, dport);
    let new = words(new_addr, f.target.pod_port);
    // The IPv4 header sum covers the address (and the TTL, below), not the port.
    let ip_old = [old[0], old[1], u16::from_be_bytes([ip.ttl, proto])];
    let ip_new = [new[0], new[1], u16::from_be_bytes([ip.ttl - 1, proto])];
    ip.check = patch(ip.check, &ip_old, &ip_new);
    ip.daddr = new_addr;
    ip.ttl -= 1;
    // The transport checksum covers the address (pseudo header) and the port; a zero UDP
    // checksum means "none" and stays zero, a computed zero is sent as 0xffff.
    let off = if proto == IPPROTO_TCP { 16 } else { 6 };
    let sum: *mut [u8; 2] = ptr_at(ctx, L4_OFF + off)?;
    // SAFETY: bounds checked by `ptr_at`.
    let sum = unsafe { &mut *sum };
    if proto == IPPROTO_TCP || *sum != [0, 0] {
        let mut s = patch(*sum, &old, &new);
        if proto == IPPROTO_UDP && s == [0, 0] {
            s = [0xff, 0xff];
        }
        *sum = s;
    }
    l4[2..4].copy_from_slice(&f.target.pod_port.to_be_bytes());
    // SAFETY: `eth` was bounds checked and the packet has not changed size.
    unsafe {
        (*eth).src = ep.host_mac;
        (*eth).dst = ep.pod_mac;
    }
    // SAFETY: plain helper call; the frame goes out of the pod's host veth, to its peer.
    let rc = unsafe { bpf_redirect(ep.host_ifindex, 0) };
    if rc == REDIRECT_REFUSED {
        count(ep.host_ifindex, Dir::ToPod, Event::Error, len);
    } else {
        count(ep.host_ifindex, Dir::ToPod, Event::Packet, len);
    }
    Some(rc as u32)
}
