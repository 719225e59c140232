//! Host ports at the TC hooks: packets to a node address and mapped port get their
//! destination rewritten to the pod (DNAT), and the pod's replies get their source rewritten
//! back to what the client dialled (reverse NAT), so the client sees the host port answer.
//!
//! The forward translation is looked up in `ECNI_PORTMAP` for every packet, never cached,
//! so a pod deleted and re-added with a new address is reached by the very next packet of
//! an existing flow (no stale conntrack entry, as with the reference plugin's UDP flows).
//! The reverse translation is recorded per flow in the LRU map `ECNI_NAT_REV`, keyed by what
//! the pod's reply carries, so entries of dead flows simply age out; a reply is translated
//! only while the host port still leads to the pod and port that sends it, so an entry that
//! outlived its pod never touches the replies of the next pod given that address.
//!
//! A pod reaching its own host port (hairpin) would receive a packet from its own address,
//! which its stack drops; its source becomes the pod's gateway instead, which the pod routes
//! back through its host veth, where the reverse translation restores both ends.
//!
//! ICMP errors about a translated flow are translated too, both ways: the network's error
//! about a pod's reply (path MTU discovery) reaches the pod as about its own packet, and the
//! pod's error about a client's packet leaves as about the packet the client sent.
//!
//! UDP datagrams in fragments are translated both ways too: the first fragment with its
//! flow, the later ones (which carry no ports) by the record the first left in
//! `ECNI_NAT_FRAG`.
//!
//! Only plain headers are translated: IPv4 without options, IPv6 with TCP, UDP or SCTP right
//! after the fixed header or UDP after one fragment header (ICMP errors: ICMP right after
//! it, quoting such a packet). Anything else goes to the stack untranslated.
//! SCTP's CRC32c covers the ports but is not updated here: a port-changing SCTP mapping
//! relies on the CRC being computed after us (checksum offload, as on veth).

use aya_ebpf::{
    bindings::{__sk_buff, BPF_ANY},
    helpers::bpf_ktime_get_ns,
    macros::map,
    maps::{LruHashMap, PerCpuArray},
    programs::TcContext,
};
use ebpf_cni_maps::{
    str_eq, NatFrag, NatFragKey, NatKey, NatOrig, PortKey, PortTarget, IPPROTO_ICMP,
    IPPROTO_ICMPV6, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP, MASQ_FRAG_TTL_NS, MAX_MASQ_FRAGS,
    NAT_FLAG_HAIRPIN, NAT_FRAG_IN, NAT_FRAG_OUT,
};

use crate::{
    maps::{count_hit, is_node_addr, port_target, portmap_enabled, ECNI_NAT_REV},
    packet::{
        self, copy16, icmp_is_error, parse_ip, parse_quote, ptr_at, quote_l4_off, FRAG_FIRST,
        FRAG_LATER, FRAG_NONE, IPPROTO_FRAGMENT,
    },
    rewrite::{self, End},
};

/// The parts of a packet a translation reads, and the map keys and values it builds. They
/// live in a per-CPU scratch slot: on the BPF stack (512 bytes for the whole call chain)
/// these 16-byte addresses and their copies do not fit.
#[repr(C)]
pub struct Scratch {
    target: PortTarget,
    /// Both addresses in `EndpointKey` form (IPv4 mapped into IPv6).
    src: [u8; 16],
    dst: [u8; 16],
    /// Checksum helper input.
    csum_from: [u8; 16],
    csum_to: [u8; 16],
    port_key: PortKey,
    rev: NatKey,
    orig: NatOrig,
    sport: u16,
    dport: u16,
    /// 1: IPv4.
    v4: u8,
    proto: u8,
    /// Nonzero: a fragment, which [`parse`] leaves to `ecni_nat_frag_in`/`_out` (it sets
    /// 1, [`parse_fragment`] the fragment's place: [`FRAG_FIRST`] or [`FRAG_LATER`]).
    frag: u8,
    _pad: u8,
    /// The identification of a fragment's datagram (IPv4: its first two bytes).
    frag_id: [u8; 4],
    frag_key: NatFragKey,
    frag_val: NatFrag,
}

const _: () = assert!(core::mem::size_of::<Scratch>() == 48 + 16 * 4 + 20 + 40 + 24 + 12 + 40 + 24);

#[inline(always)]
fn l4_off(f: &Scratch) -> usize {
    rewrite::l4_off(f.v4 == 1)
}

#[map]
static ECNI_NAT_TMP: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

#[map]
static ECNI_NAT_FRAG: LruHashMap<NatFragKey, NatFrag> =
    LruHashMap::with_max_entries(MAX_MASQ_FRAGS, 0);

const _: () = assert!(str_eq(
    ebpf_cni_maps::NAT_FRAG_MAP,
    stringify!(ECNI_NAT_FRAG)
));

#[repr(C)]
struct Ports {
    src: [u8; 2],
    dst: [u8; 2],
}

#[inline(always)]
fn translatable(proto: u8) -> bool {
    proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP
}

/// Fills the scratch slot's flow fields from the packet; false if it is not translatable.
#[inline(always)]
fn parse(ctx: &TcContext, f: &mut Scratch) -> bool {
    // Read after a false return (an ICMP error may be about a translated flow, a fragment
    // belong to a translated datagram).
    f.proto = 0;
    f.frag = 0;
    let Some(ip) = parse_ip(ctx, &mut f.src, &mut f.dst) else {
        return false;
    };
    if ip.frag != FRAG_NONE || (!ip.v4 && ip.proto == IPPROTO_FRAGMENT) {
        f.frag = 1;
        return false;
    }
    if !ip.plain {
        return false;
    }
    f.v4 = u8::from(ip.v4);
    f.proto = ip.proto;
    if !translatable(f.proto) {
        return false;
    }
    let Some(ports) = ptr_at::<Ports>(ctx, l4_off(f)) else {
        return false;
    };
    // SAFETY: bounds checked by `ptr_at`.
    unsafe {
        f.sport = u16::from_be_bytes((*ports).src);
        f.dport = u16::from_be_bytes((*ports).dst);
    }
    true
}

/// Rewrites one address from `f.csum_from` to `f.csum_to` (a subprogram, so its locals
/// get their own stack frame).
#[inline(never)]
fn set_addr(ctx: &TcContext, f: &mut Scratch, end: End) -> bool {
    rewrite::set_addr(
        ctx,
        f.v4 == 1,
        f.proto,
        end,
        &mut f.csum_from,
        &mut f.csum_to,
    )
}

#[inline(always)]
fn set_port(ctx: &TcContext, f: &Scratch, end: End, old: u16, new: u16) -> bool {
    let field = match end {
        End::Src => rewrite::SPORT,
        End::Dst => rewrite::DPORT,
    };
    rewrite::set_l4_u16(ctx, f.v4 == 1, f.proto, field, old, new)
}

/// What a translation did.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Nat {
    /// Nothing to translate.
    None,
    /// Translated; the packet now goes to its new destination.
    Done,
    /// Translated, and the new destination is the pod that sent it (hairpin).
    Hairpin,
    /// A translation was due but a helper failed half-way: the packet is unusable.
    Failed,
    /// Not translated: an ICMP message a device delivered to a node address, which may be
    /// an error about a host-port flow (see [`forward_from_dev`]).
    IcmpToNode,
    /// Not translated: a fragment a device delivered, which may belong to a datagram to a
    /// host port (see [`forward_from_dev`]).
    Fragment,
}

impl Nat {
    #[inline(always)]
    fn from_u32(v: u32) -> Self {
        match v {
            v if v == Self::None as u32 => Self::None,
            v if v == Self::Done as u32 => Self::Done,
            v if v == Self::Hairpin as u32 => Self::Hairpin,
            v if v == Self::IcmpToNode as u32 => Self::IcmpToNode,
            v if v == Self::Fragment as u32 => Self::Fragment,
            _ => Self::Failed,
        }
    }
}

/// A packet to a host port: rewrites its destination to the pod. `from_pod` is the host
/// veth the packet came from when a pod sent it (a hairpin needs to know); 0 for a device.
///
/// Both translations are global functions (see `masq`'s module doc): the verifier checks
/// each once, on its own, where as static subprograms it walked them again for every state
/// `ecni_from_pod` reached them in (up to three calls per packet: 61,075 verified
/// instructions for that program, 43,490 now). Their locals get their own stack frames,
/// not the caller's.
#[inline(always)]
pub fn forward(ctx: &TcContext, from_pod: u32) -> Nat {
    match Nat::from_u32(ecni_nat_forward(ctx.skb.skb, from_pod)) {
        Nat::IcmpToNode | Nat::Fragment => Nat::None,
        nat => nat,
    }
}

/// [`forward`] for a packet a node device received: an ICMP error about a host-port flow's
/// reply (`ecni_nat_icmp_in`) and the fragments of a datagram to a host port
/// (`ecni_nat_frag_in`) are translated too, which pods' packets never need (so
/// `ecni_from_pod` is verified without them).
#[inline(always)]
pub fn forward_from_dev(ctx: &TcContext) -> Nat {
    match Nat::from_u32(ecni_nat_forward(ctx.skb.skb, 0)) {
        Nat::IcmpToNode => Nat::from_u32(ecni_nat_icmp_in(ctx.skb.skb)),
        Nat::Fragment => Nat::from_u32(ecni_nat_frag_in(ctx.skb.skb)),
        nat => nat,
    }
}

/// [`forward`] as a global function; returns a [`Nat`].
#[no_mangle]
#[inline(never)]
pub extern "C" fn ecni_nat_forward(skb: *mut __sk_buff, from_pod: u32) -> u32 {
    translate_forward(&TcContext::new(skb), from_pod) as u32
}

#[inline(always)]
fn translate_forward(ctx: &TcContext, from_pod: u32) -> Nat {
    if !portmap_enabled() {
        return Nat::None;
    }
    let Some(f) = ECNI_NAT_TMP.get_ptr_mut(0) else {
        return Nat::None;
    };
    // SAFETY: this CPU's scratch slot, ours for the program run (bottom halves are off).
    let f = unsafe { &mut *f };
    if !parse(ctx, f) {
        if from_pod == 0 && is_icmp(f) {
            return Nat::IcmpToNode;
        }
        if from_pod == 0 && f.frag == 1 {
            return Nat::Fragment;
        }
        return Nat::None;
    }
    if !is_node_addr(&f.dst) {
        return Nat::None;
    }
    if !port_target(&f.dst, f.dport, f.proto, &mut f.port_key, &mut f.target) {
        return Nat::None;
    }
    let hairpin = from_pod != 0 && from_pod == f.target.host_ifindex;
    if hairpin && f.target.gateway == [0; 16] {
        return Nat::None;
    }
    if !note_flow(f, hairpin) {
        return Nat::None;
    }
    count_hit(&f.port_key, ctx.len(), false);
    copy16(&mut f.csum_from, &f.dst);
    copy16(&mut f.csum_to, &f.target.pod_addr);
    if !set_addr(ctx, f, End::Dst) || !set_port(ctx, f, End::Dst, f.dport, f.target.pod_port) {
        return Nat::Failed;
    }
    if hairpin {
        copy16(&mut f.csum_from, &f.src);
        copy16(&mut f.csum_to, &f.target.gateway);
        if !set_addr(ctx, f, End::Src) {
            return Nat::Failed;
        }
        return Nat::Hairpin;
    }
    Nat::Done
}

/// Records the flow of the packet in `f`, to the host port `f.target` leads to, for its
/// replies (`ECNI_NAT_REV`, as the replies will carry it); false if the table refused it.
#[inline(always)]
fn note_flow(f: &mut Scratch, hairpin: bool) -> bool {
    copy16(&mut f.rev.pod_addr, &f.target.pod_addr);
    if hairpin {
        copy16(&mut f.rev.peer_addr, &f.target.gateway);
    } else {
        copy16(&mut f.rev.peer_addr, &f.src);
    }
    f.rev.pod_port = f.target.pod_port;
    f.rev.peer_port = f.sport;
    f.rev.proto = f.proto;
    f.rev._pad = [0; 3];
    copy16(&mut f.orig.addr, &f.dst);
    f.orig.port = f.dport;
    f.orig.flags = if hairpin { NAT_FLAG_HAIRPIN } else { 0 };
    f.orig._pad = [0; 4];
    // Written only when new or changed, so a busy flow costs one lookup per packet.
    // SAFETY: the value is compared at once.
    let same = match unsafe { ECNI_NAT_REV.get(&f.rev) } {
        Some(v) => v.addr == f.orig.addr && v.port == f.orig.port && v.flags == f.orig.flags,
        None => false,
    };
    same || ECNI_NAT_REV.insert(&f.rev, &f.orig, 0).is_ok()
}

/// A pod's reply in a translated flow: its source becomes what the client dialled (and a
/// hairpin's destination the pod again). `host_ports` false: the sending pod's counters say
/// no host port leads to it, so none of its packets is such a reply (nothing is looked
/// up). The caller passes it in rather than branching around the call: one path for the
/// verifier to walk after it, not two.
#[inline(always)]
pub fn reverse(ctx: &TcContext, host_ports: bool) -> Nat {
    Nat::from_u32(ecni_nat_reverse(ctx.skb.skb, u32::from(host_ports)))
}

/// [`reverse`] as a global function; returns a [`Nat`].
#[no_mangle]
#[inline(never)]
pub extern "C" fn ecni_nat_reverse(skb: *mut __sk_buff, host_ports: u32) -> u32 {
    if host_ports == 0 {
        return Nat::None as u32;
    }
    translate_reverse(&TcContext::new(skb)) as u32
}

#[inline(always)]
fn translate_reverse(ctx: &TcContext) -> Nat {
    if !portmap_enabled() {
        return Nat::None;
    }
    let Some(f) = ECNI_NAT_TMP.get_ptr_mut(0) else {
        return Nat::None;
    };
    // SAFETY: as in `forward`.
    let f = unsafe { &mut *f };
    if !parse(ctx, f) {
        if is_icmp(f) {
            return Nat::from_u32(ecni_nat_icmp_out(ctx.skb.skb));
        }
        if f.frag == 1 {
            return Nat::from_u32(ecni_nat_frag_out(ctx.skb.skb));
        }
        return Nat::None;
    }
    if !reply_flow(f) {
        return Nat::None;
    }
    let hairpin = f.orig.flags & NAT_FLAG_HAIRPIN != 0;
    copy16(&mut f.csum_from, &f.src);
    copy16(&mut f.csum_to, &f.orig.addr);
    if !set_addr(ctx, f, End::Src) || !set_port(ctx, f, End::Src, f.sport, f.orig.port) {
        return Nat::Failed;
    }
    if hairpin {
        copy16(&mut f.csum_from, &f.dst);
        copy16(&mut f.csum_to, &f.src);
        if !set_addr(ctx, f, End::Dst) {
            return Nat::Failed;
        }
        return Nat::Hairpin;
    }
    Nat::Done
}

/// Finds the flow of the pod's reply in `f` (`f.src`, `f.sport` the pod's): what the client
/// dialled goes to `f.orig`. False if the reply is in no translated flow.
#[inline(always)]
fn reply_flow(f: &mut Scratch) -> bool {
    copy16(&mut f.rev.pod_addr, &f.src);
    copy16(&mut f.rev.peer_addr, &f.dst);
    f.rev.pod_port = f.sport;
    f.rev.peer_port = f.dport;
    f.rev.proto = f.proto;
    f.rev._pad = [0; 3];
    // SAFETY: copied out at once.
    let Some(orig) = (unsafe { ECNI_NAT_REV.get(&f.rev) }) else {
        return false;
    };
    copy16(&mut f.orig.addr, &orig.addr);
    f.orig.port = orig.port;
    f.orig.flags = orig.flags;
    // Only while the host port still leads to this pod and port: the entry outlives its
    // pod, and a pod given that address next, reached by the same client port without a
    // host port, would otherwise answer from the old host port (which its client drops).
    if !port_target(
        &f.orig.addr,
        f.orig.port,
        f.proto,
        &mut f.port_key,
        &mut f.target,
    ) || f.target.pod_addr != f.src
        || f.target.pod_port != f.sport
    {
        let _ = ECNI_NAT_REV.remove(&f.rev);
        return false;
    }
    true
}

/// ICMP in the packet's own family (ICMPv4 in IPv4, ICMPv6 in IPv6), as [`parse`] left it.
#[inline(always)]
fn is_icmp(f: &Scratch) -> bool {
    f.proto
        == if f.v4 == 1 {
            IPPROTO_ICMP
        } else {
            IPPROTO_ICMPV6
        }
}

/// Whether a packet [`parse`] found ICMP is an error, which quotes the packet it is about.
#[inline(always)]
fn is_icmp_error(ctx: &TcContext, v4: bool) -> bool {
    match ptr_at::<[u8; 2]>(ctx, rewrite::l4_off(v4)) {
        // SAFETY: bounds checked by `ptr_at`.
        Some(h) => icmp_is_error(v4, unsafe { (*h)[0] }),
        None => false,
    }
}

/// An ICMP error arriving at a node device about a host-port flow's reply (fragmentation
/// needed, packet too big, unreachable...), in this CPU's scratch slot as [`parse`] left
/// it: addressed to the node, it quotes the reply as it left, from the host port to the
/// client. Both become the pod's address and port, so the pod's stack learns the path's MTU
/// (or the error) of its own connection; the packet then goes to the pod. A global function
/// (a [`Nat`]): only ICMP errors reach it, and the verifier checks it once.
#[no_mangle]
#[inline(never)]
pub extern "C" fn ecni_nat_icmp_in(skb: *mut __sk_buff) -> u32 {
    // One copy per family, its offsets constants: fewer paths for older verifiers (6.1
    // walks `ecni_from_dev` in 20,205 instructions this way, 20,854 with one copy).
    on_scratch(skb, |ctx, f| {
        if f.v4 == 1 {
            icmp_in::<true>(ctx, f)
        } else {
            icmp_in::<false>(ctx, f)
        }
    })
}

/// Runs `translate` on the packet and this CPU's scratch slot (as the program's earlier
/// calls left it), for the global functions: its [`Nat`] as a number.
#[inline(always)]
fn on_scratch(skb: *mut __sk_buff, translate: impl FnOnce(&TcContext, &mut Scratch) -> Nat) -> u32 {
    let ctx = TcContext::new(skb);
    let Some(f) = ECNI_NAT_TMP.get_ptr_mut(0) else {
        return Nat::None as u32;
    };
    // SAFETY: this CPU's scratch slot, ours for the program run (bottom halves are off).
    translate(&ctx, unsafe { &mut *f }) as u32
}

#[inline(always)]
fn icmp_in<const V4: bool>(ctx: &TcContext, f: &mut Scratch) -> Nat {
    let v4 = V4;
    if !is_icmp_error(ctx, v4) {
        return Nat::None;
    }
    // The quote, from the node's address and host port to the client.
    let Some(proto) = parse_quote(ctx, v4, &mut f.csum_from, &mut f.rev.peer_addr) else {
        return Nat::None;
    };
    if !translatable(proto) || f.csum_from != f.dst {
        return Nat::None;
    }
    let Some(q) = ptr_at::<Ports>(ctx, quote_l4_off(v4)) else {
        return Nat::None;
    };
    // SAFETY: bounds checked by `ptr_at`.
    let (host_port, peer_port) =
        unsafe { (u16::from_be_bytes((*q).src), u16::from_be_bytes((*q).dst)) };
    if !port_target(&f.dst, host_port, proto, &mut f.port_key, &mut f.target) {
        return Nat::None;
    }
    // Only about a flow translated to this pod: its entry says the client dialled this
    // address and host port (not a hairpin, which never leaves the node). That also makes
    // the error's destination a node address, without a lookup of the node's addresses.
    copy16(&mut f.rev.pod_addr, &f.target.pod_addr);
    f.rev.pod_port = f.target.pod_port;
    f.rev.peer_port = peer_port;
    f.rev.proto = proto;
    f.rev._pad = [0; 3];
    // SAFETY: compared at once.
    match unsafe { ECNI_NAT_REV.get(&f.rev) } {
        Some(o) if o.addr == f.dst && o.port == host_port && o.flags & NAT_FLAG_HAIRPIN == 0 => {}
        _ => return Nat::None,
    }
    count_hit(&f.port_key, ctx.len(), false);
    copy16(&mut f.csum_to, &f.target.pod_addr);
    let pod_port = f.target.pod_port;
    // The outer destination, then the quote's source and port.
    if !rewrite::set_addr(ctx, v4, f.proto, End::Dst, &mut f.csum_from, &mut f.csum_to)
        || !rewrite::set_quote(
            ctx,
            v4,
            End::Src,
            &mut f.csum_from,
            &mut f.csum_to,
            rewrite::SPORT,
            host_port,
            pod_port,
        )
    {
        return Nat::Failed;
    }
    Nat::Done
}

/// An ICMP error a pod sends about a packet it received through a host port (port
/// unreachable when nothing listens on the container port): it leaves from the address
/// the client dialled, quoting the packet as the client sent it (to that address and host
/// port), so the client's socket sees the error. `Nat::None` if it is about no such flow.
/// A global function, as [`ecni_nat_icmp_in`].
#[no_mangle]
#[inline(never)]
pub extern "C" fn ecni_nat_icmp_out(skb: *mut __sk_buff) -> u32 {
    on_scratch(skb, icmp_out)
}

#[inline(always)]
fn icmp_out(ctx: &TcContext, f: &mut Scratch) -> Nat {
    let v4 = f.v4 == 1;
    if !is_icmp_error(ctx, v4) {
        return Nat::None;
    }
    // The quote, from the client to the pod's address and port. (Not shared with
    // `icmp_in` as a function returning the protocol and ports: that costs this program
    // ~700 more verified instructions.)
    let Some(proto) = parse_quote(ctx, v4, &mut f.rev.peer_addr, &mut f.csum_from) else {
        return Nat::None;
    };
    if !translatable(proto) || f.csum_from != f.src {
        return Nat::None;
    }
    let Some(q) = ptr_at::<Ports>(ctx, quote_l4_off(v4)) else {
        return Nat::None;
    };
    // SAFETY: bounds checked by `ptr_at`.
    let (peer_port, pod_port) =
        unsafe { (u16::from_be_bytes((*q).src), u16::from_be_bytes((*q).dst)) };
    copy16(&mut f.rev.pod_addr, &f.src);
    f.rev.pod_port = pod_port;
    f.rev.peer_port = peer_port;
    f.rev.proto = proto;
    f.rev._pad = [0; 3];
    // SAFETY: copied out at once.
    let Some(orig) = (unsafe { ECNI_NAT_REV.get(&f.rev) }) else {
        return Nat::None;
    };
    copy16(&mut f.orig.addr, &orig.addr);
    f.orig.port = orig.port;
    f.orig.flags = orig.flags;
    // As for a reply: only while the host port still leads to this pod and port.
    if f.orig.flags & NAT_FLAG_HAIRPIN != 0
        || !port_target(
            &f.orig.addr,
            f.orig.port,
            proto,
            &mut f.port_key,
            &mut f.target,
        )
        || f.target.pod_addr != f.src
        || f.target.pod_port != pod_port
    {
        return Nat::None;
    }
    copy16(&mut f.csum_to, &f.orig.addr);
    // The outer source, then the quote's destination and port.
    if !rewrite::set_addr(ctx, v4, f.proto, End::Src, &mut f.csum_from, &mut f.csum_to)
        || !rewrite::set_quote(
            ctx,
            v4,
            End::Dst,
            &mut f.csum_from,
            &mut f.csum_to,
            rewrite::DPORT,
            pod_port,
            f.orig.port,
        )
    {
        return Nat::Failed;
    }
    Nat::Done
}

/// A fragment a node device delivered (this CPU's scratch slot as [`parse`] left it): a
/// UDP datagram to a host port in fragments, as a client's stack cuts one larger than the
/// path MTU. Only the first fragment carries the ports: it is translated as a whole
/// datagram is, and leaves a record (`ECNI_NAT_FRAG`: the datagram as it arrived → the
/// pod's address) by which the later ones, which carry none, are translated. A later
/// fragment without a record (its first not seen yet, or not for a host port) goes to the
/// stack as it is. A global function: only fragments reach it, verified once.
#[no_mangle]
#[inline(never)]
pub extern "C" fn ecni_nat_frag_in(skb: *mut __sk_buff) -> u32 {
    on_scratch(skb, |ctx, f| match parse_fragment(ctx, f) {
        // One copy per family: the transport header's offset is a constant in each.
        Some(true) => frag_in::<true>(ctx, f),
        Some(false) => frag_in::<false>(ctx, f),
        None => Nat::None,
    })
}

/// The pod's reply in a host-port flow, in fragments (its stack cut a datagram larger than
/// its MTU): the first fragment is translated as a whole reply is and leaves a record
/// (the datagram as the pod sent it → the address the client dialled) for the later ones.
/// A later fragment without a record is left as it is (a hairpin's fragments among them).
/// A global function, as [`ecni_nat_frag_in`].
#[no_mangle]
#[inline(never)]
pub extern "C" fn ecni_nat_frag_out(skb: *mut __sk_buff) -> u32 {
    on_scratch(skb, |ctx, f| match parse_fragment(ctx, f) {
        Some(true) => frag_out::<true>(ctx, f),
        Some(false) => frag_out::<false>(ctx, f),
        None => Nat::None,
    })
}

/// Reads a fragment of a UDP datagram into `f` (`f.frag`: [`FRAG_FIRST`] or
/// [`FRAG_LATER`]; the identification; a first fragment's ports): `Some(true)` for IPv4,
/// `Some(false)` for IPv6 (its fragment header right after the fixed one), `None` for
/// anything else (another protocol, IPv4 options, other extension headers).
#[inline(always)]
fn parse_fragment(ctx: &TcContext, f: &mut Scratch) -> Option<bool> {
    let mut ip = parse_ip(ctx, &mut f.src, &mut f.dst)?;
    packet::parse_frag6(ctx, &mut ip);
    if ip.proto != IPPROTO_UDP || (!ip.v4 && !ip.frag6) {
        return None;
    }
    f.v4 = u8::from(ip.v4);
    f.proto = ip.proto;
    f.frag = ip.frag;
    f.frag_id = ip.id;
    if ip.frag == FRAG_FIRST {
        let at = if ip.v4 {
            rewrite::l4_off(true)
        } else {
            rewrite::l4_off(false) + packet::FRAG6_HLEN
        };
        let q = ptr_at::<Ports>(ctx, at)?;
        // SAFETY: bounds checked by `ptr_at`.
        unsafe {
            f.sport = u16::from_be_bytes((*q).src);
            f.dport = u16::from_be_bytes((*q).dst);
        }
    } else if ip.frag != FRAG_LATER {
        return None;
    }
    Some(ip.v4)
}

/// How far past the fixed IP header a first fragment's transport header lies: IPv6's
/// fragment header comes first.
#[inline(always)]
const fn frag_extra(v4: bool) -> usize {
    if v4 {
        0
    } else {
        packet::FRAG6_HLEN
    }
}

#[inline(always)]
fn frag_in<const V4: bool>(ctx: &TcContext, f: &mut Scratch) -> Nat {
    if f.frag == FRAG_LATER {
        return frag_later::<V4>(ctx, f, NAT_FRAG_IN, End::Dst);
    }
    if !is_node_addr(&f.dst)
        || !port_target(&f.dst, f.dport, f.proto, &mut f.port_key, &mut f.target)
        || !note_flow(f, false)
    {
        return Nat::None;
    }
    count_hit(&f.port_key, ctx.len(), false);
    copy16(&mut f.csum_from, &f.dst);
    copy16(&mut f.csum_to, &f.target.pod_addr);
    let pod_port = f.target.pod_port;
    if !rewrite::set_addr_at(
        ctx,
        V4,
        frag_extra(V4),
        f.proto,
        End::Dst,
        &mut f.csum_from,
        &mut f.csum_to,
    ) || !rewrite::set_l4_u16_at(
        ctx,
        V4,
        frag_extra(V4),
        f.proto,
        rewrite::DPORT,
        f.dport,
        pod_port,
    ) {
        return Nat::Failed;
    }
    // Keyed as the later fragments arrive (`f.src`, `f.dst` as parsed).
    record_frag(f, NAT_FRAG_IN);
    Nat::Done
}

#[inline(always)]
fn frag_out<const V4: bool>(ctx: &TcContext, f: &mut Scratch) -> Nat {
    if f.frag == FRAG_LATER {
        return frag_later::<V4>(ctx, f, NAT_FRAG_OUT, End::Src);
    }
    if !reply_flow(f) || f.orig.flags & NAT_FLAG_HAIRPIN != 0 {
        return Nat::None;
    }
    copy16(&mut f.csum_from, &f.src);
    copy16(&mut f.csum_to, &f.orig.addr);
    if !rewrite::set_addr_at(
        ctx,
        V4,
        frag_extra(V4),
        f.proto,
        End::Src,
        &mut f.csum_from,
        &mut f.csum_to,
    ) || !rewrite::set_l4_u16_at(
        ctx,
        V4,
        frag_extra(V4),
        f.proto,
        rewrite::SPORT,
        f.sport,
        f.orig.port,
    ) {
        return Nat::Failed;
    }
    record_frag(f, NAT_FRAG_OUT);
    Nat::Done
}

/// The key of the datagram whose fragment `f` holds, as its fragments carry it.
#[inline(always)]
fn frag_key(f: &mut Scratch, dir: u8) {
    copy16(&mut f.frag_key.src, &f.src);
    copy16(&mut f.frag_key.dst, &f.dst);
    f.frag_key.id = f.frag_id;
    f.frag_key.proto = f.proto;
    f.frag_key.dir = dir;
    f.frag_key._pad = [0; 2];
}

/// Records that the later fragments of `f`'s datagram take the address `f.csum_to`. A
/// full table evicts its oldest record: the datagrams of the moment keep theirs.
#[inline(always)]
fn record_frag(f: &mut Scratch, dir: u8) {
    frag_key(f, dir);
    copy16(&mut f.frag_val.addr, &f.csum_to);
    // SAFETY: plain helper call.
    f.frag_val.at_ns = unsafe { bpf_ktime_get_ns() };
    let _ = ECNI_NAT_FRAG.insert(&f.frag_key, &f.frag_val, u64::from(BPF_ANY));
}

/// A later fragment: its `end` address becomes the one its datagram's record says, if its
/// first fragment left one within `MASQ_FRAG_TTL_NS` (an identification that came round
/// never follows another datagram's record).
#[inline(always)]
fn frag_later<const V4: bool>(ctx: &TcContext, f: &mut Scratch, dir: u8, end: End) -> Nat {
    frag_key(f, dir);
    // SAFETY: copied out at once.
    let Some(rec) = (unsafe { ECNI_NAT_FRAG.get(&f.frag_key) }) else {
        return Nat::None;
    };
    copy16(&mut f.csum_to, &rec.addr);
    // SAFETY: plain helper call.
    if unsafe { bpf_ktime_get_ns() }.wrapping_sub(rec.at_ns) > MASQ_FRAG_TTL_NS {
        return Nat::None;
    }
    match end {
        End::Src => copy16(&mut f.csum_from, &f.src),
        End::Dst => copy16(&mut f.csum_from, &f.dst),
    }
    // No transport header: only IPv4's header checksum follows the address.
    if rewrite::set_addr(ctx, V4, 0, end, &mut f.csum_from, &mut f.csum_to) {
        Nat::Done
    } else {
        Nat::Failed
    }
}
