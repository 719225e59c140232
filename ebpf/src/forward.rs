//! Forwarding decisions. A packet is either delivered into a local pod
//! (`bpf_redirect_peer`; through its host veth's egress and `fq` with `bpf_redirect` when
//! traffic towards it is paced), forwarded by the FIB's answer (`bpf_redirect_neigh`), or handed to
//! the stack unchanged (`TCX_NEXT`), which is also what happens to anything malformed,
//! unusual or out of reach of these programs.

use aya_ebpf::{
    bindings::{
        bpf_fib_lookup, bpf_redir_neigh, tcx_action_base::TCX_NEXT, BPF_FIB_LKUP_RET_FRAG_NEEDED,
        BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS,
    },
    helpers::generated::{
        bpf_fib_lookup as fib_lookup, bpf_redirect, bpf_redirect_neigh, bpf_redirect_peer,
    },
    programs::TcContext,
    EbpfContext,
};
use ebpf_cni_maps::{EndpointInfo, EndpointKey, EP_FLAG_CHAINED, EP_FLAG_MASQ};

use crate::{
    bandwidth::{header_len, pace, police, towards, Towards, Verdict, Way},
    host_ports::{self, Nat},
    maps::{
        count, count_in, endpoint, endpoint_in_map, no_egress_limit, no_host_ports,
        no_ingress_limit, no_limits, pod_counters, AlignedKey, Dir, Event,
    },
    masquerade::{self, MasqHint, Reply, Snat, Want},
    packet::{
        ipv4_decrement_ttl, ipv4_is_special, ipv6_is_special, ptr_at, ArpEth4, EthHdr, Ipv4Hdr,
        Ipv6Hdr, ARP_REPLY, ARP_REQUEST, ETH_HLEN, ETH_P_ARP, ETH_P_IP, ETH_P_IPV6,
    },
    services::{self, Services},
    source_check::{self, Source},
    trace::{note, Note},
    tunnel,
};

pub(crate) const PASS: i32 = TCX_NEXT;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
/// `TC_ACT_SHOT`: what the redirect helpers return when they refuse.
const TC_ACT_SHOT: i64 = 2;

#[inline(always)]
fn ifindex(ctx: &TcContext) -> u32 {
    // SAFETY: the context pointer is the program's `__sk_buff`, readable for the whole run.
    unsafe { (*ctx.skb.skb).ifindex }
}

/// Where a packet's destination address leads. A plain struct whose every field each path
/// writes, where an `Option<(u16, enum)>` left the enum's payload unwritten on the paths
/// without one: LLVM then read the payload from the stack before testing which variant it
/// was, harmless to LLVM and refused by 5.10's verifier ("invalid read from stack").
#[derive(Clone, Copy)]
pub(crate) struct Dest {
    /// A local pod's entry, read in place: the pod the packet is for.
    pub pod: Option<&'static EndpointInfo>,
    /// The frame's EtherType (0 when the frame is too short to have one).
    pub proto: u16,
    /// Not a local pod, and the FIB may route it (false: leave it to the stack).
    pub routed: bool,
}

impl Dest {
    /// Leave it to the stack.
    #[inline(always)]
    const fn stack(proto: u16) -> Self {
        Self {
            pod: None,
            proto,
            routed: false,
        }
    }

    /// The local pod the address is, else a destination for the FIB.
    #[inline(always)]
    fn looked_up(proto: u16, pod: Option<&'static EndpointInfo>) -> Self {
        Self {
            pod,
            proto,
            routed: pod.is_none(),
        }
    }
}

/// Looks at the IP header: TTL handling, and which destination. Rewrites nothing.
#[inline(always)]
pub(crate) fn classify(ctx: &TcContext) -> Dest {
    let Some(eth) = ptr_at::<EthHdr>(ctx, 0) else {
        return Dest::stack(0);
    };
    // SAFETY: `ptr_at` checked the whole header is inside the packet.
    let proto = u16::from_be_bytes(unsafe { (*eth).proto });
    match proto {
        ETH_P_IP => {
            let Some(ip) = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN) else {
                return Dest::stack(proto);
            };
            // SAFETY: bounds checked by `ptr_at`.
            let ip = unsafe { &*ip };
            // The stack answers an expiring TTL with ICMP time exceeded.
            if ip.ver_ihl >> 4 != 4 || ipv4_is_special(&ip.daddr) || ip.ttl <= 1 {
                return Dest::stack(proto);
            }
            Dest::looked_up(proto, endpoint_in_map(&AlignedKey::v4(ip.daddr).0))
        }
        ETH_P_IPV6 => {
            let Some(ip) = ptr_at::<Ipv6Hdr>(ctx, ETH_HLEN) else {
                return Dest::stack(proto);
            };
            // SAFETY: bounds checked by `ptr_at`.
            let ip = unsafe { &*ip };
            if ip.ver_tc_flow[0] >> 4 != 6 || ipv6_is_special(&ip.daddr) || ip.hop_limit <= 1 {
                return Dest::stack(proto);
            }
            Dest::looked_up(proto, endpoint_in_map(&EndpointKey::v6(ip.daddr)))
        }
        _ => Dest::stack(proto),
    }
}

/// Decrements TTL / hop limit: we are routing the packet.
#[inline(always)]
pub(crate) fn hop(ctx: &TcContext, proto: u16) -> Option<()> {
    if proto == ETH_P_IP {
        let ip: *mut Ipv4Hdr = ptr_at(ctx, ETH_HLEN)?;
        // SAFETY: bounds checked; TC programs may write packet data.
        ipv4_decrement_ttl(unsafe { &mut *ip });
    } else {
        let ip: *mut Ipv6Hdr = ptr_at(ctx, ETH_HLEN)?;
        // SAFETY: bounds checked; TC programs may write packet data.
        unsafe { (*ip).hop_limit -= 1 };
    }
    Some(())
}

#[inline(always)]
pub(crate) fn set_macs(ctx: &TcContext, src: &[u8; 6], dst: &[u8; 6]) -> Option<()> {
    let eth: *mut EthHdr = ptr_at(ctx, 0)?;
    // SAFETY: bounds checked; TC programs may write packet data.
    unsafe {
        (*eth).src = *src;
        (*eth).dst = *dst;
    }
    Some(())
}

/// `skb->pkt_type` of a frame for this host (linux/if_packet.h).
const PACKET_HOST: u32 = 0;

/// Delivers into a local pod's namespace, as if its gateway had sent the frame, within the
/// pod's ingress limit: straight in, or, when traffic towards it is paced, through its host
/// veth's egress, where `to_pod` stamps and counts the packet and the veth's `fq` holds it.
#[inline(always)]
fn deliver(ctx: &TcContext, proto: u16, ep: &EndpointInfo) -> i32 {
    let len = ctx.len();
    // The pod's counters, looked up once: they say whether it has no ingress limit to look
    // up (most pods), and take the count.
    let counters = pod_counters(ep.host_ifindex);
    let limit = if no_ingress_limit(counters) {
        Towards::Direct(Verdict::Pass)
    } else {
        towards(ctx, ep.host_ifindex)
    };
    match limit {
        Towards::Paced => {
            if hop(ctx, proto).is_none() || set_macs(ctx, &ep.host_mac, &ep.pod_mac).is_none() {
                return PASS;
            }
            // Not the stack's: `to_pod` records no flow for it.
            services::mark_paced(ctx);
            // SAFETY: plain helper call; egress of the pod's host veth.
            let rc = unsafe { bpf_redirect(ep.host_ifindex, 0) };
            if rc == TC_ACT_SHOT {
                count_in(counters, Dir::ToPod, Event::Error, len);
            }
            return rc as i32;
        }
        Towards::Direct(Verdict::Drop) => {
            count_in(counters, Dir::ToPod, Event::Drop, len);
            return TC_ACT_SHOT as i32;
        }
        Towards::Direct(Verdict::Mark) => count_in(counters, Dir::ToPod, Event::Mark, len),
        Towards::Direct(Verdict::Pass) => {}
    }
    // Re-derive packet pointers after the checks: a failed bounds check leaves it to the stack.
    if hop(ctx, proto).is_none() || set_macs(ctx, &ep.host_mac, &ep.pod_mac).is_none() {
        return PASS;
    }
    // A frame that came in addressed to another device's MAC (a bridge's, when a chained
    // pod sends to its gateway) is marked PACKET_OTHERHOST. Newer kernels scrub that on a
    // peer redirect; 5.10 keeps it, and the pod's IP stack drops such packets. The frame
    // is now addressed to the pod, so it is the pod's.
    // SAFETY: a read of the context's own field.
    if unsafe { (*ctx.skb.skb).pkt_type } != PACKET_HOST {
        let _ = ctx.change_type(PACKET_HOST);
    }
    // SAFETY: plain helper call; it only records the target for after the program returns.
    let rc = unsafe { bpf_redirect_peer(ep.host_ifindex, 0) };
    note(Note::RedirectPeer(ifindex(ctx), ep.host_ifindex, rc));
    if rc == TC_ACT_SHOT {
        count_in(counters, Dir::ToPod, Event::Error, len);
    } else {
        count_in(counters, Dir::ToPod, Event::Packet, len);
    }
    rc as i32
}

/// Host veth ingress.
#[inline(always)]
pub fn from_pod(ctx: &TcContext) -> i32 {
    leave_pod::<false>(ctx)
}

/// Host veth ingress in chained mode: the interface plugin in front of ebpf-cni (a bridge,
/// ptp) owns forwarding, so only translated host-port packets are delivered or routed here;
/// every other packet goes on to the stack, limited and counted.
#[inline(always)]
pub fn from_chained_pod(ctx: &TcContext) -> i32 {
    leave_pod::<true>(ctx)
}

#[inline(always)]
fn leave_pod<const CHAINED: bool>(ctx: &TcContext) -> i32 {
    let me = ifindex(ctx);
    let len = ctx.len();
    // The pod's counters, looked up once for the limiter's verdict and the packet's count,
    // and what they say: whether the pod has an egress limit (else its limit is not looked
    // up, on a node where other pods have one), whether a host port leads to it (else no
    // packet of it is a host port reply). They are not held past that: a pointer that may
    // be null, kept alive, would have the verifier walk the rest of the program twice; the
    // rare counts below look them up again.
    let counters = pod_counters(me);
    let host_ports = !no_host_ports(counters);
    let verdict = if no_limits() || no_egress_limit(counters) {
        Verdict::Pass
    } else {
        police(ctx, me, Way::Egress)
    };
    match verdict {
        Verdict::Drop => {
            count_in(counters, Dir::FromPod, Event::Drop, len);
            return TC_ACT_SHOT as i32;
        }
        Verdict::Mark => count_in(counters, Dir::FromPod, Event::Mark, len),
        Verdict::Pass => {}
    }
    count_in(counters, Dir::FromPod, Event::Packet, len);
    // After the limiter and the count: every frame of the pod spends its tokens and is
    // counted, spoofed or not, and the verifier walks the limiter once, not once per
    // verdict of the check.
    let src_masq = match source_check::check(ctx, me) {
        Source::BadAddress => {
            count(me, Dir::FromPod, Event::SourceDrop, len);
            note(Note::SourceDropped(me));
            return TC_ACT_SHOT as i32;
        }
        Source::BadMac => {
            count(me, Dir::FromPod, Event::MacDrop, len);
            note(Note::MacDropped(me));
            return TC_ACT_SHOT as i32;
        }
        // Link-local and unspecified sources: the stack's, never forwarded.
        Source::Stack => return PASS,
        Source::Pass => MasqHint::LookUp,
        Source::PassMasq => MasqHint::Yes,
    };
    if !CHAINED {
        if let Some(rc) = answer_arp(ctx, me) {
            return rc;
        }
        // A Service flow: netfilter translates it, both ways (a chained pod's traffic
        // takes the stack anyway).
        if services::from_pod(ctx) == Services::Stack {
            note(Note::Services(me));
            return PASS;
        }
    }
    // A reply in a host port flow, else maybe a packet to a host port. A host port is a
    // node address, never a local pod's: a packet to a pod skips the host port lookups
    // (the pod → pod path). A pod no host port leads to sends no replies in such flows.
    // In chained mode the destination is looked up only for the translated packets the
    // programs deliver themselves.
    let mut nat = host_ports::reverse(ctx, host_ports);
    let mut dest = Dest::stack(0);
    if CHAINED {
        if nat == Nat::None {
            nat = host_ports::forward(ctx, me);
        }
    } else {
        dest = classify(ctx);
        if nat == Nat::None && dest.pod.is_none() {
            nat = host_ports::forward(ctx, me);
            if nat == Nat::Done || nat == Nat::Hairpin {
                dest = classify(ctx);
            }
        }
    }
    if nat == Nat::Failed {
        count(me, Dir::FromPod, Event::Error, len);
        return TC_ACT_SHOT as i32;
    }
    if CHAINED {
        if nat == Nat::None {
            return PASS;
        }
        dest = classify(ctx);
    }
    if let Some(ep) = dest.pod {
        // Back into the sending pod only for a hairpin (the pod reached its own host port).
        if (ep.host_ifindex != me || nat == Nat::Hairpin) && ours(ep, nat) {
            return deliver(ctx, dest.proto, ep);
        }
    } else if dest.routed {
        let masq = if CHAINED || nat != Nat::None {
            Want::No
        } else {
            masquerade::wanted(ctx, src_masq)
        };
        if masq == Want::Untranslatable {
            count(me, Dir::FromPod, Event::Drop, len);
            return TC_ACT_SHOT as i32;
        }
        return route(ctx, dest.proto, me, masq == Want::Yes);
    }
    note(Note::ToStack(me));
    PASS
}

/// The pod asks for its gateway's MAC address: the reply, with the host veth's, goes
/// straight back into the pod. The node holds each gateway once (on `lo`), not on every host
/// veth, so the kernel would answer only where `arp_ignore` allows replies for addresses of
/// other devices; this answer does not depend on the node's settings. Anything else (other
/// targets, probes from 0.0.0.0, replies) goes to the stack.
#[inline(always)]
fn answer_arp(ctx: &TcContext, me: u32) -> Option<i32> {
    let eth: *mut EthHdr = ptr_at(ctx, 0)?;
    // SAFETY: bounds checked by `ptr_at`.
    if u16::from_be_bytes(unsafe { (*eth).proto }) != ETH_P_ARP {
        return None;
    }
    let arp: *mut ArpEth4 = ptr_at(ctx, ETH_HLEN)?;
    // SAFETY: bounds checked by `ptr_at`; TC programs may write packet data.
    let a = unsafe { &mut *arp };
    if a.htype != [0, 1]
        || u16::from_be_bytes(a.ptype) != ETH_P_IP
        || a.hlen != 6
        || a.plen != 4
        || a.oper != ARP_REQUEST
    {
        return None;
    }
    let ep = endpoint(&EndpointKey::v4(a.spa))?;
    if ep.host_ifindex != me
        || ep.flags & EP_FLAG_CHAINED != 0
        || ep.gateway4 == [0; 4]
        || ep.gateway4 != a.tpa
    {
        return None;
    }
    a.oper = ARP_REPLY;
    a.tha = a.sha;
    a.tpa = a.spa;
    a.sha = ep.host_mac;
    a.spa = ep.gateway4;
    // SAFETY: `eth` was bounds checked above and the packet has not changed size since.
    unsafe {
        (*eth).dst = (*eth).src;
        (*eth).src = ep.host_mac;
    }
    note(Note::ArpAnswered(me));
    // SAFETY: plain helper call; egress of the device the request came in on.
    Some(unsafe { bpf_redirect(me, 0) } as i32)
}

/// Host veth egress: what the stack sends into the pod, and what `deliver` sends to a paced
/// pod (packets redirected into the pod never come this way): counted, and held to the
/// pod's ingress limit.
#[inline(always)]
pub fn to_pod(ctx: &TcContext) -> i32 {
    let (me, len) = (ifindex(ctx), ctx.len());
    services::to_pod(ctx);
    match pace(ctx, me) {
        Verdict::Drop => {
            count(me, Dir::ToPod, Event::Drop, len);
            return TC_ACT_SHOT as i32;
        }
        Verdict::Mark => count(me, Dir::ToPod, Event::Mark, len),
        Verdict::Pass => {}
    }
    count(me, Dir::ToPod, Event::Packet, len);
    PASS
}

/// Node device ingress.
#[inline(always)]
pub fn from_dev(ctx: &TcContext) -> i32 {
    if tunnel::is_tunnel(ifindex(ctx)) && !tunnel::from_tunnel(ctx) {
        return TC_ACT_SHOT as i32;
    }
    let nat = match masquerade::reply(ctx) {
        Reply::Done => Nat::Done,
        Reply::Failed => Nat::Failed,
        Reply::None => host_ports::forward_from_dev(ctx),
    };
    if nat == Nat::Failed {
        return TC_ACT_SHOT as i32;
    }
    let dest = classify(ctx);
    match dest.pod {
        // A reply in a pod's flow to a Service: netfilter translates it back.
        Some(_) if nat == Nat::None && services::from_dev(ctx) == Services::Stack => PASS,
        Some(ep) if ours(ep, nat) => {
            if nat == Nat::None && ep.flags & EP_FLAG_MASQ != 0 {
                masquerade::inbound(ctx);
            }
            deliver(ctx, dest.proto, ep)
        }
        _ => PASS,
    }
}

/// Whether the programs deliver this packet to the pod themselves: always for a pod whose
/// interface ebpf-cni made; for a chained pod only a translated host-port packet (the rest
/// takes the path its interface plugin set up).
#[inline(always)]
fn ours(ep: &EndpointInfo, nat: Nat) -> bool {
    ep.flags & EP_FLAG_CHAINED == 0 || nat != Nat::None
}

/// The IP length the FIB checks against the egress device's MTU: a GSO packet's segments'
/// (its header length says the whole packet's, which the FIB would answer "fragmentation
/// needed" for, sending every GSO packet through the stack). 0, "let the kernel judge the
/// packet", when the headers cannot be read.
#[inline(always)]
fn fib_len(ctx: &TcContext, ip_len: u16) -> u16 {
    // SAFETY: a read of the context's own field.
    let gso_size = unsafe { (*ctx.skb.skb).gso_size };
    if gso_size == 0 {
        return ip_len;
    }
    match header_len(ctx) {
        Some(h) => (h - ETH_HLEN as u64 + u64::from(gso_size)).min(u64::from(ip_len)) as u16,
        None => 0,
    }
}

/// The IPv4 "don't fragment" flag, in the host-order flags and offset field.
const IP_DF: u16 = 0x4000;

/// Fills the route lookup's request for the packet (`fib` all zero, or as a lookup left
/// it: every field the request reads is written). `None` if the IP header is not there;
/// else whether an IPv4 packet may be fragmented (no DF).
#[inline(always)]
fn fib_request(ctx: &TcContext, proto: u16, me: u32, fib: &mut bpf_fib_lookup) -> Option<bool> {
    fib.ifindex = me;
    // IPv6 is never fragmented on the way.
    let mut may_fragment = false;
    if proto == ETH_P_IP {
        let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)?;
        // SAFETY: bounds checked by `ptr_at`.
        let ip = unsafe { &*ip };
        fib.family = AF_INET;
        fib.l4_protocol = ip.protocol;
        may_fragment = u16::from_be_bytes(ip.frag_off) & IP_DF == 0;
        fib.__bindgen_anon_1.tot_len = fib_len(ctx, u16::from_be_bytes(ip.tot_len));
        fib.__bindgen_anon_2.tos = ip.tos;
        fib.__bindgen_anon_3.ipv4_src = u32::from_ne_bytes(ip.saddr);
        fib.__bindgen_anon_4.ipv4_dst = u32::from_ne_bytes(ip.daddr);
    } else {
        let ip = ptr_at::<Ipv6Hdr>(ctx, ETH_HLEN)?;
        // SAFETY: bounds checked by `ptr_at`.
        let ip = unsafe { &*ip };
        fib.family = AF_INET6;
        fib.l4_protocol = ip.nexthdr;
        fib.__bindgen_anon_1.tot_len =
            fib_len(ctx, u16::from_be_bytes(ip.payload_len).wrapping_add(40));
        fib.__bindgen_anon_2.flowinfo =
            u32::from_ne_bytes(ip.ver_tc_flow) & u32::from_ne_bytes([0x0f, 0xff, 0xff, 0xff]);
        // SAFETY: [u8; 16] and [u32; 4] have the same size; unaligned reads copy them.
        unsafe {
            fib.__bindgen_anon_3.ipv6_src = core::ptr::read_unaligned(ip.saddr.as_ptr().cast());
            fib.__bindgen_anon_4.ipv6_dst = core::ptr::read_unaligned(ip.daddr.as_ptr().cast());
        }
    }
    Some(may_fragment)
}

/// Forwards by the FIB's answer, bypassing the stack's forwarding path (and netfilter);
/// with `masq`, the packet leaves masqueraded (`masquerade::snat`) or not at all.
/// Local destinations, unreachable ones, those needing fragmentation and everything the
/// FIB does not resolve go to the stack, which knows how to answer them; but a masqueraded
/// IPv4 packet that the stack would fragment is dropped and counted.
#[inline(always)]
fn route(ctx: &TcContext, proto: u16, me: u32, masq: bool) -> i32 {
    // SAFETY: an all-zero bpf_fib_lookup is a valid (empty) request.
    let mut fib: bpf_fib_lookup = unsafe { core::mem::zeroed() };
    let Some(may_fragment) = fib_request(ctx, proto, me, &mut fib) else {
        return PASS;
    };
    let lookup = |fib: &mut bpf_fib_lookup, flags: u32| {
        // SAFETY: `fib` is a valid, writable bpf_fib_lookup of the size passed.
        unsafe {
            fib_lookup(
                ctx.as_ptr(),
                fib,
                core::mem::size_of::<bpf_fib_lookup>() as i32,
                flags,
            )
        }
    };
    // A masqueraded TCP SYN asks for the node's source address in the same lookup (6.8+;
    // an older kernel refuses the flag before reading anything, and the lookup is asked
    // again without it).
    // Any other answer (no source address for the route, say) is asked again without
    // the flag, from the request as it was, and the new flow chooses as before.
    // (Made again in place rather than kept in a copy: 64 bytes more of `ecni_from_pod`'s
    // frame took the deepest call chain past 512 bytes on 5.10 and 6.1.)
    let mut rc = -1;
    if masq && masquerade::opens_tcp_flow() {
        let r = lookup(&mut fib, masquerade::FIB_LOOKUP_SRC);
        if r == i64::from(BPF_FIB_LKUP_RET_SUCCESS) || r == i64::from(BPF_FIB_LKUP_RET_NO_NEIGH) {
            masquerade::fib_source(&fib);
            rc = r;
        } else if fib_request(ctx, proto, me, &mut fib).is_none() {
            return PASS;
        }
    }
    if rc < 0 {
        rc = lookup(&mut fib, 0);
    }
    note(Note::Fib(me, rc, fib.ifindex));
    if rc < 0 {
        count(me, Dir::FromPod, Event::Error, ctx.len());
        return PASS;
    }
    let rc = rc as u32;
    if masq && may_fragment && rc == BPF_FIB_LKUP_RET_FRAG_NEEDED {
        // The stack would fragment it and forward the fragments with the pod's address
        // (the stack's fragments never pass the programs). Without DF it gets no ICMP
        // error either way.
        masquerade::untranslatable();
        count(me, Dir::FromPod, Event::Drop, ctx.len());
        return TC_ACT_SHOT as i32;
    }
    if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH) || fib.ifindex == me {
        return PASS;
    }
    if masq {
        // A new flow asks the FIB for the node's source address itself: an established
        // one keeps its own, and the address selection (IPv6's above all) is not paid
        // for on every packet.
        if masquerade::snat(ctx, fib.ifindex) == Snat::Drop {
            count(me, Dir::FromPod, Event::Drop, ctx.len());
            return TC_ACT_SHOT as i32;
        }
    }
    if hop(ctx, proto).is_none() {
        return PASS;
    }
    // SAFETY: an all-zero bpf_redir_neigh is valid; the fields are filled below.
    let mut nh: bpf_redir_neigh = unsafe { core::mem::zeroed() };
    // After the lookup, the FIB's `*_dst` holds the next hop (the gateway, or the
    // destination itself when it is on-link).
    // SAFETY: union fields of plain integers, written by the lookup for this family.
    unsafe {
        if proto == ETH_P_IP {
            nh.nh_family = u32::from(AF_INET);
            nh.__bindgen_anon_1.ipv4_nh = fib.__bindgen_anon_4.ipv4_dst;
        } else {
            nh.nh_family = u32::from(AF_INET6);
            nh.__bindgen_anon_1.ipv6_nh = fib.__bindgen_anon_4.ipv6_dst;
        }
    }
    // SAFETY: `nh` is valid for the size passed; the helper resolves the neighbour.
    let rc = unsafe {
        bpf_redirect_neigh(
            fib.ifindex,
            &mut nh,
            core::mem::size_of::<bpf_redir_neigh>() as i32,
            0,
        )
    };
    if rc == TC_ACT_SHOT {
        count(me, Dir::FromPod, Event::Error, ctx.len());
    }
    rc as i32
}
