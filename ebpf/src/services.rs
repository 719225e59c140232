//! Kubernetes Services next to kube-proxy (see `ebpf_cni_maps::services`): the packets of
//! flows that netfilter translates go to the stack both ways, so its NAT rules (iptables,
//! nftables) or IPVS see every packet of them, as they would on a node without these
//! programs; every other flow keeps the redirect path.
//!
//! - A pod's packet to a Service address (`ECNI_SVC_NETS`) goes to the stack, its flow
//!   recorded from the pod's side without a peer: a reply from an endpoint beyond the node
//!   arrives at a node device for the pod's address and port, and goes to the stack too.
//! - A packet the stack forwards into a pod (the translated side of a Service flow, a
//!   NodePort, an IPVS virtual server) records its flow from the pod's side with the peer:
//!   the pod's replies in that flow go to the stack, which translates them back.
//!
//! A flow recorded that netfilter did not translate (the node's own connection to a pod,
//! say) only takes the stack's path, which forwards it as it would without the programs.
//! All three are global functions: verified once on their own, their locals in their own
//! frames (see `nat`), and looked at only while the node has Services
//! (`NODE_FLAG_SERVICES`).

use aya_ebpf::{
    bindings::{__sk_buff, BPF_NOEXIST},
    helpers::bpf_ktime_get_ns,
    macros::map,
    maps::{lpm_trie::Key, LpmTrie, LruHashMap, PerCpuArray},
    programs::TcContext,
};
use ebpf_cni_maps::{
    str_eq, EndpointKey, ServicesFlow, ServicesFlowKey, ServicesStats, EP_FLAG_MASQ, IPPROTO_SCTP,
    IPPROTO_TCP, IPPROTO_UDP, MAX_SERVICES_FLOWS, MAX_SERVICES_NETS, NODE_FLAG_SERVICES,
    SERVICES_FLOW_CLIENT, SERVICES_FLOW_DELIVERED, SERVICES_IDLE_NS, SERVICES_MARK_PACED,
    SERVICES_TCP_CLOSED_NS, SERVICES_TCP_IDLE_NS,
};

use crate::{
    maps::{endpoint_in_map, ECNI_CONFIG},
    packet::{copy16, parse_ip, ptr_at, ETH_HLEN},
};

#[map]
static ECNI_SVC_NETS: LpmTrie<[u8; 16], u32> = LpmTrie::with_max_entries(MAX_SERVICES_NETS, 0);

#[map]
static ECNI_SVC_FLOWS: LruHashMap<ServicesFlowKey, ServicesFlow> =
    LruHashMap::with_max_entries(MAX_SERVICES_FLOWS, 0);

#[map]
static ECNI_SVC_STAT: PerCpuArray<ServicesStats> = PerCpuArray::with_max_entries(1, 0);

const _: () = assert!(str_eq(
    ebpf_cni_maps::SERVICES_NETS_MAP,
    stringify!(ECNI_SVC_NETS)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::SERVICES_FLOWS_MAP,
    stringify!(ECNI_SVC_FLOWS)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::SERVICES_STATS_MAP,
    stringify!(ECNI_SVC_STAT)
));

/// The packet as these functions read it: built in a per-CPU slot, as the BPF stack has no
/// room for two keys of 40 bytes under `ecni_from_pod`'s frames.
#[repr(C)]
struct Scratch {
    key: ServicesFlowKey,
    /// `key` from the other end.
    rev: ServicesFlowKey,
    /// The destination address, for the Service lookup.
    net: Key<[u8; 16]>,
    /// TCP: FIN or RST set.
    closing: u8,
    /// TCP: SYN set without ACK (a new flow: whatever an earlier flow of the same port
    /// closed no longer counts).
    opening: u8,
    _pad: [u8; 2],
}

#[map]
static ECNI_SVC_TMP: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// Whether the node has Services (else nothing here is looked at).
#[inline(always)]
pub fn enabled() -> bool {
    ECNI_CONFIG
        .get(0)
        .is_some_and(|c| c.flags & NODE_FLAG_SERVICES != 0)
}

/// What a lookup decided.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Services {
    /// Not a Service flow: the programs forward it as usual.
    Fast,
    /// A Service flow: the stack takes it.
    Stack,
}

impl Services {
    #[inline(always)]
    fn from_u32(v: u32) -> Self {
        if v == Self::Stack as u32 {
            Self::Stack
        } else {
            Self::Fast
        }
    }
}

/// A pod sent this packet (host veth ingress): the stack takes it when it is to a Service
/// address or a reply in a flow the stack delivered to the pod.
#[inline(always)]
pub fn from_pod(ctx: &TcContext) -> Services {
    if !enabled() {
        return Services::Fast;
    }
    Services::from_u32(ecni_svc_from_pod(ctx.skb.skb))
}

/// A node device received this packet for a local pod: the stack takes it when it is a
/// reply in one of the pod's flows to a Service address.
#[inline(always)]
pub fn from_dev(ctx: &TcContext) -> Services {
    if !enabled() {
        return Services::Fast;
    }
    Services::from_u32(ecni_svc_from_dev(ctx.skb.skb))
}

/// The stack sends this packet into a pod (host veth egress): its flow is recorded, unless
/// the programs themselves redirected it here for pacing.
#[inline(always)]
pub fn to_pod(ctx: &TcContext) {
    // SAFETY: a read of the context's own field.
    let mark = unsafe { (*ctx.skb.skb).mark };
    if mark == SERVICES_MARK_PACED {
        ctx.set_mark(0);
        return;
    }
    if enabled() {
        ecni_svc_to_pod(ctx.skb.skb);
    }
}

/// Marks a packet the programs redirect to a paced pod's host veth egress (see
/// [`to_pod`]); the pod's namespace never sees the mark.
#[inline(always)]
pub fn mark_paced(ctx: &TcContext) {
    if enabled() {
        ctx.set_mark(SERVICES_MARK_PACED);
    }
}

#[repr(C)]
struct Ports {
    src: [u8; 2],
    dst: [u8; 2],
}

/// Which end of the packet is the pod.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pod {
    Source,
    Destination,
}

/// Fills `f.key` from the packet with the pod at `pod`'s end and the peer at the other, and
/// `f.net` with the destination; `Some(true)` when the transport has ports (TCP, UDP, SCTP
/// in a plain header), `Some(false)` for any other IP packet, `None` for anything else.
#[inline(always)]
fn parse(ctx: &TcContext, f: &mut Scratch, pod: Pod) -> Option<bool> {
    let k = &mut f.key;
    let ip = match pod {
        Pod::Source => parse_ip(ctx, &mut k.pod, &mut k.peer)?,
        Pod::Destination => parse_ip(ctx, &mut k.peer, &mut k.pod)?,
    };
    f.net.prefix_len = 128;
    match pod {
        Pod::Source => copy16(&mut f.net.data, &k.peer),
        Pod::Destination => copy16(&mut f.net.data, &k.pod),
    }
    k.proto = ip.proto;
    k._pad = [0; 3];
    k.pod_port = 0;
    k.peer_port = 0;
    if !ip.plain
        || !(ip.proto == IPPROTO_TCP || ip.proto == IPPROTO_UDP || ip.proto == IPPROTO_SCTP)
    {
        return Some(false);
    }
    let l4 = ETH_HLEN + if ip.v4 { 20 } else { 40 };
    f.closing = 0;
    f.opening = 0;
    if ip.proto == IPPROTO_TCP {
        // Byte 13 of the TCP header: FIN 0x01, RST 0x04.
        if let Some(flags) = ptr_at::<u8>(ctx, l4 + 13) {
            // SAFETY: bounds checked by `ptr_at`.
            let flags = unsafe { *flags };
            f.closing = u8::from(flags & 0x05 != 0);
            // SYN 0x02, ACK 0x10.
            f.opening = u8::from(flags & 0x12 == 0x02);
        }
    }
    let ports = ptr_at::<Ports>(ctx, l4)?;
    // SAFETY: bounds checked by `ptr_at`.
    let (src, dst) = unsafe {
        (
            u16::from_be_bytes((*ports).src),
            u16::from_be_bytes((*ports).dst),
        )
    };
    match pod {
        Pod::Source => {
            k.pod_port = src;
            k.peer_port = dst;
        }
        Pod::Destination => {
            k.pod_port = dst;
            k.peer_port = src;
        }
    }
    Some(true)
}

/// Whether the local pod with address `pod` masquerades (`ipMasq`).
#[inline(always)]
fn masquerades(pod: &[u8; 16]) -> bool {
    endpoint_in_map(&EndpointKey { addr: *pod }).is_some_and(|ep| ep.flags & EP_FLAG_MASQ != 0)
}

#[inline(always)]
fn stats() -> Option<&'static mut ServicesStats> {
    // SAFETY: this CPU's slot, valid during the program run; TC programs run with bottom
    // halves off, so nothing else on this CPU touches it meanwhile.
    ECNI_SVC_STAT.get_ptr_mut(0).map(|s| unsafe { &mut *s })
}

#[inline(always)]
fn scratch() -> Option<&'static mut Scratch> {
    // SAFETY: this CPU's scratch slot, ours for the program run (bottom halves are off).
    ECNI_SVC_TMP.get_ptr_mut(0).map(|s| unsafe { &mut *s })
}

/// Records `key` as a flow of kind `kind` seen `now` (`closing`: a FIN or RST in it;
/// `opening`: a TCP SYN, a new flow); an entry already there is kept, a client flow's time
/// and closing brought up to date (the lookup refreshes its place in the LRU too): a new
/// flow, or one from a port whose earlier flow's record has ended, starts with its own
/// closing, not the earlier flow's.
#[inline(always)]
fn record(key: &ServicesFlowKey, kind: u32, now: u64, closing: u8, opening: u8) {
    if let Some(v) = ECNI_SVC_FLOWS.get_ptr_mut(key) {
        if kind == SERVICES_FLOW_CLIENT {
            // SAFETY: a map value, valid for the run; concurrent writers only move the
            // time forward, or set the flag (or reset it, for a new flow).
            unsafe {
                if opening != 0 || !client_alive(&*v, key.proto, now) {
                    (*v).closing = u32::from(closing);
                } else {
                    (*v).closing |= u32::from(closing);
                }
                (*v).seen_ns = now;
            }
        }
        return;
    }
    let v = ServicesFlow {
        seen_ns: now,
        kind,
        closing: u32::from(closing),
    };
    let ok = ECNI_SVC_FLOWS
        .insert(key, &v, u64::from(BPF_NOEXIST))
        .is_ok();
    if let Some(s) = stats() {
        if ok {
            s.recorded = s.recorded.wrapping_add(1);
        } else {
            s.record_failed = s.record_failed.wrapping_add(1);
        }
    }
}

/// Whether the client flow `v` (protocol `proto`) is alive at `now` (see
/// `ebpf_cni_maps::SERVICES_TCP_CLOSED_NS`).
#[inline(always)]
fn client_alive(v: &ServicesFlow, proto: u8, now: u64) -> bool {
    let idle = now.saturating_sub(v.seen_ns);
    let limit = if proto != IPPROTO_TCP {
        SERVICES_IDLE_NS
    } else if v.closing != 0 {
        SERVICES_TCP_CLOSED_NS
    } else {
        SERVICES_TCP_IDLE_NS
    };
    idle <= limit
}

/// The pod's live client flow of `key` (no peer), refreshed (`refresh`) with the packet's
/// time; a dead one is dropped.
#[inline(always)]
fn live_client(key: &ServicesFlowKey, now: u64, closing: u8, refresh: bool) -> bool {
    let Some(v) = ECNI_SVC_FLOWS.get_ptr_mut(key) else {
        return false;
    };
    // SAFETY: a map value, valid for the run.
    let v = unsafe { &mut *v };
    if v.kind != SERVICES_FLOW_CLIENT {
        return false;
    }
    if !client_alive(v, key.proto, now) {
        let _ = ECNI_SVC_FLOWS.remove(key);
        return false;
    }
    if refresh {
        v.seen_ns = now;
        v.closing |= u32::from(closing);
    }
    true
}

/// A flow the programs forward themselves whose tuple a dead Service flow recorded (a
/// client reusing its port towards the endpoint directly): the record would send the
/// endpoint's replies to the stack, where the dead flow's conntrack entry, in its TIME_WAIT
/// or UDP timeout, would translate them back to the Service's address. `f.key` is the
/// packet as its sender sees it; the record is the other end's (`f.rev`).
#[inline(always)]
fn forget_reverse(f: &mut Scratch) {
    copy16(&mut f.rev.pod, &f.key.peer);
    copy16(&mut f.rev.peer, &f.key.pod);
    f.rev.pod_port = f.key.peer_port;
    f.rev.peer_port = f.key.pod_port;
    f.rev.proto = f.key.proto;
    f.rev._pad = [0; 3];
    forget_stale(&f.rev);
}

/// Drops `key`'s record of a flow the stack delivered, if there is one.
#[inline(always)]
fn forget_stale(key: &ServicesFlowKey) {
    // SAFETY: the value is copied out at once.
    if unsafe { ECNI_SVC_FLOWS.get(key) }.is_some_and(|v| v.kind == SERVICES_FLOW_DELIVERED) {
        let _ = ECNI_SVC_FLOWS.remove(key);
        if let Some(s) = stats() {
            s.forgotten = s.forgotten.wrapping_add(1);
        }
    }
}

/// [`from_pod`] as a global function; returns a [`Services`].
#[no_mangle]
#[inline(never)]
pub extern "C" fn ecni_svc_from_pod(skb: *mut __sk_buff) -> u32 {
    let ctx = TcContext::new(skb);
    let Some(f) = scratch() else {
        return Services::Fast as u32;
    };
    let Some(ports) = parse(&ctx, f, Pod::Source) else {
        return Services::Fast as u32;
    };
    // SAFETY: a plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    // To a Service address first: a flow the stack delivered to this pod may hold the same
    // tuple (an earlier flow from this port to the same Service, whose answers the stack
    // delivered), and the new flow still needs its own record and mark.
    let Some(&masq_mark) = ECNI_SVC_NETS.get(&f.net) else {
        if !ports {
            return Services::Fast as u32;
        }
        // A reply in a flow the stack delivered to this pod.
        // SAFETY: the value is not read, only its presence.
        if unsafe { ECNI_SVC_FLOWS.get(&f.key) }.is_some() {
            if let Some(s) = stats() {
                s.replies = s.replies.wrapping_add(1);
            }
            return Services::Stack as u32;
        }
        // From a port a live Service flow of the pod holds: the stack too, so that conntrack
        // sees this flow and forwards its answers, which come for the same port.
        copy16(&mut f.rev.pod, &f.key.pod);
        f.rev.peer = [0; 16];
        f.rev.pod_port = f.key.pod_port;
        f.rev.peer_port = 0;
        f.rev.proto = f.key.proto;
        f.rev._pad = [0; 3];
        if live_client(&f.rev, now, 0, false) {
            if let Some(s) = stats() {
                s.shared_port = s.shared_port.wrapping_add(1);
            }
            return Services::Stack as u32;
        }
        forget_reverse(f);
        return Services::Fast as u32;
    };
    // A masquerading pod's flow to a Service leaves with the node's address wherever its
    // endpoint is: kube-proxy's own masquerade rule takes packets with its mark, so an
    // endpoint beyond the node answers the node, as it would answer the reference
    // plugin's masquerade. (The value is kube-proxy's mark, 0 where none was learned.)
    if masq_mark != 0 && masquerades(&f.key.pod) {
        // SAFETY: a read of the context's own field.
        let mark = unsafe { (*skb).mark };
        ctx.set_mark(mark | masq_mark);
    }
    if ports {
        f.key.peer = [0; 16];
        f.key.peer_port = 0;
        record(&f.key, SERVICES_FLOW_CLIENT, now, f.closing, f.opening);
    }
    if let Some(s) = stats() {
        s.to_service = s.to_service.wrapping_add(1);
    }
    Services::Stack as u32
}

/// [`from_dev`] as a global function; returns a [`Services`].
#[no_mangle]
#[inline(never)]
pub extern "C" fn ecni_svc_from_dev(skb: *mut __sk_buff) -> u32 {
    let ctx = TcContext::new(skb);
    let Some(f) = scratch() else {
        return Services::Fast as u32;
    };
    if parse(&ctx, f, Pod::Destination) != Some(true) {
        return Services::Fast as u32;
    }
    // The packet's own flow, seen from the pod (a record of it is a dead flow's, see
    // `forget_reverse`), and then the pod's flows to a Service, which have no peer.
    copy16(&mut f.rev.pod, &f.key.pod);
    copy16(&mut f.rev.peer, &f.key.peer);
    f.rev.pod_port = f.key.pod_port;
    f.rev.peer_port = f.key.peer_port;
    f.rev.proto = f.key.proto;
    f.rev._pad = [0; 3];
    f.key.peer = [0; 16];
    f.key.peer_port = 0;
    // SAFETY: a plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    if !live_client(&f.key, now, f.closing, true) {
        forget_stale(&f.rev);
        return Services::Fast as u32;
    }
    if let Some(s) = stats() {
        s.from_outside = s.from_outside.wrapping_add(1);
    }
    Services::Stack as u32
}

/// [`to_pod`]'s recording as a global function; returns 0.
#[no_mangle]
#[inline(never)]
pub extern "C" fn ecni_svc_to_pod(skb: *mut __sk_buff) -> u32 {
    let ctx = TcContext::new(skb);
    let Some(f) = scratch() else {
        return 0;
    };
    if parse(&ctx, f, Pod::Destination) == Some(true) {
        record(&f.key, SERVICES_FLOW_DELIVERED, 0, 0, 0);
    }
    0
}
