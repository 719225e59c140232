//! Masquerade (`ipMasq`): what a masquerading pod sends to a destination outside the skip
//! trie leaves with the node's address on the egress device and a port from the masquerade
//! range (ICMP echo: an identifier), and the replies are translated back at the device's
//! ingress and delivered straight into the pod. Nothing of it passes netfilter.
//!
//! Each flow has two entries, the pod's view (`ECNI_MASQ_FWD`) and the node's
//! (`ECNI_MASQ_REV`), in hash maps the kernel never evicts from: a live flow is never
//! broken to make room. A new flow probes `MASQ_PROBES` ports from the node's cursor (ports
//! are handed out in turn) for one no flow holds towards the same remote end, or whose flow
//! has been idle past its timeout (its node-side entry, same key, rewritten in place).
//! Host ports are never taken. A flow that takes a port from an old one towards the same
//! remote end gets its TCP timestamps shifted past the old flow's (`MASQ_TS_LAST`); a
//! port that needs no shift is preferred. When every probe fails, or the table is full, the new flow's
//! packet is dropped and counted, and established flows go on.
//!
//! `ecni_masq_snat` and `ecni_masq_take` are global functions (exported by the linker, see
//! xtask's `BPF_GLOBAL_FUNCTIONS`; so are the host port translations and the source check):
//! the verifier checks each once, on its own, where it walked a static one again for each
//! call and each state its caller reached it in. That took `ecni_from_pod` from 235,000
//! verified instructions (0.5 s) to 95,000. Their
//! arguments are the context and scalars (what 5.10 accepts); the flow travels in this
//! CPU's scratch slot.
//!
//! Only plain headers are translated: IPv4 without options, IPv6 with TCP, UDP or ICMPv6
//! right after the fixed header, and of ICMP only echo requests and replies. A datagram in
//! fragments is translated by its first fragment, which carries the transport header and
//! finds the flow, and leaves a record (`ECNI_MASQ_FRAG`, IPv6's `ECNI_MASQ_FRAG6`) that
//! its later fragments are translated by. IPv6's fragment header must follow the fixed
//! header, and carry UDP or ICMPv6 (TCP sizes its segments to the path: no stack sends it
//! in fragments). Anything else a masquerading pod sends out of its network is dropped
//! and counted: it would otherwise leave with the pod's address.

use aya_ebpf::{
    bindings::{
        __sk_buff, bpf_fib_lookup, BPF_ANY, BPF_FIB_LKUP_RET_FRAG_NEEDED,
        BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS, BPF_F_NO_PREALLOC, BPF_NOEXIST,
    },
    helpers::{bpf_ktime_get_ns, generated::bpf_fib_lookup as fib_lookup},
    macros::map,
    maps::{lpm_trie::Key, Array, HashMap, LpmTrie, LruHashMap, PerCpuArray},
    programs::TcContext,
    EbpfContext,
};
use ebpf_cni_maps::{
    masq_src_key, masq_timeout_ns, str_eq, EndpointKey, MasqFlow, MasqFrag, MasqFrag6,
    MasqFrag6Key, MasqFragKey, MasqKey, MasqStats, PortKey, EP_FLAG_MASQ, IPPROTO_ICMP,
    IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP, MASQ_FIN_IN, MASQ_FIN_OUT, MASQ_FRAG_IN,
    MASQ_FRAG_OUT, MASQ_FRAG_TTL_NS, MASQ_INBOUND, MASQ_PORT_MAX, MASQ_PORT_MIN, MASQ_PROBES,
    MASQ_REPLIED, MASQ_RST, MASQ_TS_LAST, MAX_MASQ_FLOWS, MAX_MASQ_FRAGS, MAX_MASQ_SKIP,
    MAX_NODE_ADDRS, NODE_FLAG_MASQ,
};

use crate::{
    maps::{endpoint_in_map, portmap_enabled, ECNI_CONFIG, ECNI_PORTMAP},
    packet::{
        self, copy16, icmp_is_error, parse_quote, ptr_at, quote_l4_off, Ipv4Hdr, Ipv6Hdr, ETH_HLEN,
    },
    rewrite::{self, End},
    tcp_ts,
};

#[map]
pub static ECNI_MASQ_FWD: HashMap<MasqKey, MasqFlow> =
    HashMap::with_max_entries(MAX_MASQ_FLOWS, BPF_F_NO_PREALLOC);

#[map]
pub static ECNI_MASQ_REV: HashMap<MasqKey, MasqFlow> =
    HashMap::with_max_entries(MAX_MASQ_FLOWS, BPF_F_NO_PREALLOC);

#[map]
pub static ECNI_MASQ_SKIP: LpmTrie<[u8; 16], u32> = LpmTrie::with_max_entries(MAX_MASQ_SKIP, 0);

#[map]
pub static ECNI_MASQ_SRC: HashMap<u64, EndpointKey> = HashMap::with_max_entries(MAX_NODE_ADDRS, 0);

#[map]
pub static ECNI_MASQ_STAT: PerCpuArray<MasqStats> = PerCpuArray::with_max_entries(1, 0);

#[map]
pub static ECNI_MASQ_FRAG: LruHashMap<MasqFragKey, MasqFrag> =
    LruHashMap::with_max_entries(MAX_MASQ_FRAGS, 0);

#[map]
pub static ECNI_MASQ_FRAG6: LruHashMap<MasqFrag6Key, MasqFrag6> =
    LruHashMap::with_max_entries(MAX_MASQ_FRAGS, 0);

const _: () = assert!(str_eq(
    ebpf_cni_maps::MASQ_FWD_MAP,
    stringify!(ECNI_MASQ_FWD)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::MASQ_REV_MAP,
    stringify!(ECNI_MASQ_REV)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::MASQ_SKIP_MAP,
    stringify!(ECNI_MASQ_SKIP)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::MASQ_SRC_MAP,
    stringify!(ECNI_MASQ_SRC)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::MASQ_STATS_MAP,
    stringify!(ECNI_MASQ_STAT)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::MASQ_FRAG_MAP,
    stringify!(ECNI_MASQ_FRAG)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::MASQ_FRAG6_MAP,
    stringify!(ECNI_MASQ_FRAG6)
));

const ICMP_ECHO_REQUEST: u8 = 8;
const ICMP_ECHO_REPLY: u8 = 0;
const ICMPV6_ECHO_REQUEST: u8 = 128;
const ICMPV6_ECHO_REPLY: u8 = 129;
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;
/// A direction's `last_ns` is refreshed at most this often (fewer writes to shared lines).
const REFRESH_NS: u64 = 1_000_000_000;

/// One packet's flow and the entries built from it, in a per-CPU slot (the BPF stack is
/// too small for these keys and their copies).
#[repr(C)]
pub struct Scratch {
    /// The pod's view of the flow (leaving), or the node's (replies).
    fwd: MasqKey,
    /// The node's view of a new flow, or an older flow's pod view when its port is reclaimed.
    rev: MasqKey,
    other: MasqKey,
    val: MasqFlow,
    port_key: PortKey,
    csum_from: [u8; 16],
    csum_to: [u8; 16],
    skip: Key<[u8; 16]>,
    v4: u8,
    proto: u8,
    tcp_flags: u8,
    /// 1: the packet is an ICMP error the pod sends about a packet of one of its flows.
    icmp_err: u8,
    /// A new TCP flow's SYN: where its timestamp value lies (0: it has none), and the value.
    syn_ts_at: u32,
    syn_ts: u32,
    /// 1: the route lookup also chose the node's source address (a TCP SYN's, on 6.8+),
    /// which is in `csum_to`.
    src_known: u8,
    /// 1: `ecni_masq_take` may reclaim a port that needs a timestamp shift.
    shift_ok: u8,
    /// What follows the IP header: `PLAIN`, `FIRST`, `LATER` or `OTHER`.
    shape: u8,
    /// 1: IPv6 with a fragment header, which a first fragment's transport header follows.
    frag6: u8,
    /// A fragmented datagram's record: its key and its value (IPv6's in `frag6_key` and
    /// `frag6_val`); the identification read with the header, for the key.
    frag_key: MasqFragKey,
    frag_id: [u8; 4],
    frag_val: MasqFrag,
    frag6_key: MasqFrag6Key,
    frag6_val: MasqFrag6,
}

/// What follows the IP header (`Scratch::shape`): the transport header of a whole packet;
/// that of a datagram's first fragment; a later fragment's payload; anything else (IPv4
/// options), which is not translated.
const PLAIN: u8 = 0;
const FIRST: u8 = 1;
const LATER: u8 = 2;
const OTHER: u8 = 3;

/// Where the next allocation starts in the port range, for the whole node: ports are handed
/// out in turn, so the first one tried is the one given out longest ago, the likeliest to
/// be free or idle past its timeout. (A cursor per CPU pointed each CPU at ports the other
/// had just given out: a new flow found none idle and was dropped.) Two CPUs that read the
/// same value race for the same port; the map insert decides, and the loser probes on.
#[map]
static ECNI_MASQ_NEXT: Array<u32> = Array::with_max_entries(1, 0);

#[map]
static ECNI_MASQ_TMP: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// What `wanted` found.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Want {
    /// Not masqueraded: route it as it is.
    No,
    /// Masquerade it after the route lookup (`snat`).
    Yes,
    /// It must be masqueraded and cannot be: drop it.
    Untranslatable,
}

#[inline(always)]
fn scratch() -> Option<&'static mut Scratch> {
    let f = ECNI_MASQ_TMP.get_ptr_mut(0)?;
    // SAFETY: this CPU's scratch slot, ours for the program run (bottom halves are off).
    Some(unsafe { &mut *f })
}

#[derive(Clone, Copy)]
enum Stat {
    Out,
    In,
    Flow,
    Reclaimed,
    Exhausted,
    TableFull,
    Untranslatable,
}

#[inline(always)]
fn count(stat: Stat) {
    let Some(s) = ECNI_MASQ_STAT.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot of a per-CPU array.
    let s = unsafe { &mut *s };
    let c = match stat {
        Stat::Out => &mut s.out_packets,
        Stat::In => &mut s.in_packets,
        Stat::Flow => &mut s.flows,
        Stat::Reclaimed => &mut s.reclaimed,
        Stat::Exhausted => &mut s.exhausted,
        Stat::TableFull => &mut s.table_full,
        Stat::Untranslatable => &mut s.untranslatable,
    };
    *c = c.wrapping_add(1);
}

/// Whether some pod on the node masquerades.
#[inline(always)]
fn enabled() -> bool {
    ECNI_CONFIG
        .get(0)
        .is_some_and(|c| c.flags & NODE_FLAG_MASQ != 0)
}

/// Reads the addresses into `f.fwd.local` (source) and `f.fwd.remote` (destination), and
/// `f.v4`, `f.proto`, `f.shape` (returned too) and a fragment's identification. `None` if
/// the IP header is not there.
#[inline(always)]
fn parse_ip(ctx: &TcContext, f: &mut Scratch) -> Option<u8> {
    let mut ip = packet::parse_ip(ctx, &mut f.fwd.local, &mut f.fwd.remote)?;
    packet::parse_frag6(ctx, &mut ip);
    f.v4 = u8::from(ip.v4);
    f.proto = ip.proto;
    f.shape = if ip.plain {
        PLAIN
    } else if ip.frag == packet::FRAG_FIRST {
        FIRST
    } else if ip.frag == packet::FRAG_LATER {
        LATER
    } else {
        OTHER
    };
    f.frag6 = u8::from(ip.frag6);
    f.frag_id = ip.id;
    Some(f.shape)
}

/// The key of the datagram `f` holds, in direction `dir`: its addresses as the packet
/// carries them (leaving, the pod's is the source; arriving, the node's is the
/// destination).
#[inline(always)]
fn frag_key(f: &mut Scratch, dir: u8) {
    let (src, dst) = if dir == MASQ_FRAG_OUT {
        (&f.fwd.local, &f.fwd.remote)
    } else {
        (&f.fwd.remote, &f.fwd.local)
    };
    if f.v4 == 1 {
        f.frag_key.src = [src[12], src[13], src[14], src[15]];
        f.frag_key.dst = [dst[12], dst[13], dst[14], dst[15]];
        f.frag_key.id = [f.frag_id[0], f.frag_id[1]];
        f.frag_key.proto = f.proto;
        f.frag_key.dir = dir;
    } else {
        copy16(&mut f.frag6_key.src, src);
        copy16(&mut f.frag6_key.dst, dst);
        f.frag6_key.id = f.frag_id;
        f.frag6_key.proto = f.proto;
        f.frag6_key.dir = dir;
        f.frag6_key._pad = [0; 2];
    }
}

/// Records the address the later fragments of the datagram whose first fragment `f` holds
/// take: the one in `f.csum_to`.
#[inline(always)]
fn record_frag(dir: u8, now: u64) {
    ecni_masq_frag_record(u32::from(dir), now);
}

/// `record_frag` as a global function (see the module's doc), for the datagram in this
/// CPU's scratch slot.
#[no_mangle]
#[inline(never)]
pub extern "C" fn ecni_masq_frag_record(dir: u32, now: u64) -> u32 {
    let Some(f) = scratch() else {
        return 0;
    };
    frag_key(f, dir as u8);
    // A full table evicts its oldest record: the datagrams of the moment keep theirs.
    if f.v4 == 1 {
        let addr = &f.csum_to;
        f.frag_val.addr = [addr[12], addr[13], addr[14], addr[15]];
        f.frag_val._pad = [0; 4];
        f.frag_val.at_ns = now;
        let _ = ECNI_MASQ_FRAG.insert(&f.frag_key, &f.frag_val, u64::from(BPF_ANY));
    } else {
        copy16(&mut f.frag6_val.addr, &f.csum_to);
        f.frag6_val.at_ns = now;
        let _ = ECNI_MASQ_FRAG6.insert(&f.frag6_key, &f.frag6_val, u64::from(BPF_ANY));
    }
    1
}

/// Finds the record of the datagram whose later fragment `f` holds, made by its first
/// fragment within `MASQ_FRAG_TTL_NS`; its address goes to `f.csum_to` (IPv4 mapped into
/// IPv6).
#[inline(always)]
fn find_frag(dir: u8) -> bool {
    ecni_masq_frag_find(u32::from(dir)) == 1
}

/// `find_frag` as a global function, for the datagram in this CPU's scratch slot: 1 when
/// found.
#[no_mangle]
#[inline(never)]
pub extern "C" fn ecni_masq_frag_find(dir: u32) -> u32 {
    let Some(f) = scratch() else {
        return 0;
    };
    frag_key(f, dir as u8);
    let at_ns = if f.v4 == 1 {
        // SAFETY: copied out at once.
        let Some(rec) = (unsafe { ECNI_MASQ_FRAG.get(&f.frag_key) }) else {
            return 0;
        };
        f.csum_to = [0; 16];
        f.csum_to[10] = 0xff;
        f.csum_to[11] = 0xff;
        f.csum_to[12..].copy_from_slice(&rec.addr);
        rec.at_ns
    } else {
        // SAFETY: copied out at once.
        let Some(rec) = (unsafe { ECNI_MASQ_FRAG6.get(&f.frag6_key) }) else {
            return 0;
        };
        copy16(&mut f.csum_to, &rec.addr);
        rec.at_ns
    };
    // SAFETY: plain helper call.
    u32::from(unsafe { bpf_ktime_get_ns() }.wrapping_sub(at_ns) <= MASQ_FRAG_TTL_NS)
}

/// Whether two 16-byte addresses are the same (byte by byte: no `bcmp` in BPF).
#[inline(always)]
fn same16(a: &[u8; 16], b: &[u8; 16]) -> bool {
    let mut d = 0;
    let mut i = 0;
    while i < 16 {
        d |= a[i] ^ b[i];
        i += 1;
    }
    d == 0
}

/// A later fragment (no transport header) of a datagram whose first fragment was
/// translated: its `end` address becomes the one in `f.csum_to` (IPv4: the header
/// checksum patched; the transport checksum travels in the first fragment).
#[inline(always)]
fn translate_later(ctx: &TcContext, f: &mut Scratch, end: End) -> bool {
    // The address rewritten: the pod's source leaving, the node's destination arriving
    // (`reply` has turned the addresses round).
    copy16(&mut f.csum_from, &f.fwd.local);
    let v4 = f.v4 == 1;
    rewrite::set_addr(ctx, v4, 0, end, &mut f.csum_from, &mut f.csum_to)
}

/// Where the transport header lies, for code that reads or rewrites it (a const generic:
/// each mode gets its own code, so the offset is a constant for the verifier).
/// `FIXED`: right after the fixed IP header of either family (whole packets, IPv4
/// fragments). `FRAG6`: after IPv6's fragment header (an IPv6 first fragment, handled by
/// global functions of its own, so that no path of the rest is walked twice for it).
const FIXED: u8 = 0;
const FRAG6: u8 = 1;

/// An IPv6 first fragment's transport header.
const FRAG6_L4_OFF: usize = ETH_HLEN + 40 + packet::FRAG6_HLEN;

/// The family (true: IPv4) and how far past the fixed IP header the transport header
/// lies, by `MODE`.
#[inline(always)]
fn layout<const MODE: u8>(f: &Scratch) -> (bool, usize) {
    match MODE {
        FRAG6 => (false, packet::FRAG6_HLEN),
        _ => (f.v4 == 1, 0),
    }
}

/// A TCP header without options. The whole of it must be there: a segment cut short
/// inside it (a pod's raw socket can send one) is not translated, so it neither takes a
/// port nor leaves half-rewritten (its checksum lies in the last bytes).
#[repr(C)]
struct TcpHead {
    sport: [u8; 2],
    dport: [u8; 2],
    _seq_ack: [u8; 8],
    /// Data offset, flags.
    _off: u8,
    flags: u8,
    /// Window, checksum, urgent pointer.
    _rest: [u8; 6],
}

const _: () = assert!(core::mem::size_of::<TcpHead>() == 20);

/// Reads the ports (ICMP echo: the identifier as the local port, 0 remote) into `f.fwd`,
/// with `echo` the ICMP type that may pass (request leaving, reply returning). False if
/// the transport is not one that is translated.
/// `MODE`: where the transport header lies (`FIXED`, `FRAG6`).
#[inline(always)]
fn parse_l4<const MODE: u8>(ctx: &TcContext, f: &mut Scratch, leaving: bool) -> bool {
    // TCP in IPv6 fragments: its timestamp handling reads the options at the fixed
    // header's offset (and no stack fragments TCP).
    if MODE != FIXED && f.frag6 == 1 && f.proto == IPPROTO_TCP {
        return false;
    }
    let (v4, extra) = layout::<MODE>(f);
    let off = rewrite::l4_off(v4) + extra;
    f.tcp_flags = 0;
    match f.proto {
        IPPROTO_TCP => {
            let Some(h) = ptr_at::<TcpHead>(ctx, off) else {
                return false;
            };
            // SAFETY: bounds checked by `ptr_at`.
            let h = unsafe { &*h };
            f.fwd.local_port = u16::from_be_bytes(if leaving { h.sport } else { h.dport });
            f.fwd.remote_port = u16::from_be_bytes(if leaving { h.dport } else { h.sport });
            f.tcp_flags = h.flags;
        }
        IPPROTO_UDP => {
            let Some(h) = ptr_at::<[[u8; 2]; 4]>(ctx, off) else {
                return false;
            };
            // SAFETY: bounds checked by `ptr_at`.
            let h = unsafe { &*h };
            f.fwd.local_port = u16::from_be_bytes(if leaving { h[0] } else { h[1] });
            f.fwd.remote_port = u16::from_be_bytes(if leaving { h[1] } else { h[0] });
        }
        IPPROTO_ICMP | IPPROTO_ICMPV6 => {
            if (f.proto == IPPROTO_ICMP) != v4 {
                return false;
            }
            let Some(h) = ptr_at::<[[u8; 2]; 4]>(ctx, off) else {
                return false;
            };
            // SAFETY: bounds checked by `ptr_at`.
            let h = unsafe { &*h };
            let want = match (v4, leaving) {
                (true, true) => ICMP_ECHO_REQUEST,
                (true, false) => ICMP_ECHO_REPLY,
                (false, true) => ICMPV6_ECHO_REQUEST,
                (false, false) => ICMPV6_ECHO_REPLY,
            };
            if h[0][0] != want || h[0][1] != 0 {
                return false;
            }
            f.fwd.local_port = u16::from_be_bytes(h[2]);
            f.fwd.remote_port = 0;
        }
        _ => return false,
    }
    f.fwd.proto = f.proto;
    f.fwd._pad = [0; 3];
    true
}

/// The transport field that carries the local port: where the pod's port is rewritten
/// leaving (source port, echo identifier) and the node's returning (destination port).
#[inline(always)]
fn local_port_field(proto: u8, leaving: bool) -> usize {
    match proto {
        IPPROTO_ICMP | IPPROTO_ICMPV6 => rewrite::ECHO_ID,
        _ if leaving => rewrite::SPORT,
        _ => rewrite::DPORT,
    }
}

/// What the source check's rule told about the sending pod's masquerade.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum MasqHint {
    /// Nothing (no rule, an extra prefix, a pod that does not masquerade, a rule of an
    /// earlier release): the source's endpoint says.
    LookUp = 0,
    /// The source is the pod's own address and the pod masquerades (`SOURCE_PASS_MASQ`).
    Yes = 1,
}

/// A packet a pod sends to a destination that is not a local pod: whether it is to be
/// masqueraded (its pod masquerades, the destination is outside the skip trie), and if so
/// whether it can be. The flow is left in the scratch slot for `snat`. `hint` is the
/// source check's word on the pod: with `Yes`, its endpoint is not looked up again.
#[inline(never)]
pub fn wanted(ctx: &TcContext, hint: MasqHint) -> Want {
    if !enabled() {
        return Want::No;
    }
    let Some(f) = scratch() else {
        return Want::No;
    };
    f.src_known = 0;
    let Some(shape) = parse_ip(ctx, f) else {
        return Want::No;
    };
    if hint != MasqHint::Yes {
        match endpoint_in_map(&EndpointKey { addr: f.fwd.local }) {
            Some(ep) if ep.flags & EP_FLAG_MASQ != 0 => {}
            _ => return Want::No,
        }
    }
    f.skip.prefix_len = 128;
    copy16(&mut f.skip.data, &f.fwd.remote);
    if ECNI_MASQ_SKIP.get(&f.skip).is_some() {
        return Want::No;
    }
    f.icmp_err = 0;
    if f.frag6 == 1 {
        return match ecni_masq_wanted_frag6(ctx.skb.skb) {
            v if v == Want::Yes as u32 => Want::Yes,
            v if v == Want::No as u32 => Want::No,
            _ => Want::Untranslatable,
        };
    }
    if shape == LATER {
        // Translated as its datagram's first fragment was; without its record it would
        // leave with the pod's address.
        f.tcp_flags = 0;
        if find_frag(MASQ_FRAG_OUT) {
            return Want::Yes;
        }
        count(Stat::Untranslatable);
        return Want::Untranslatable;
    }
    if (shape == PLAIN || shape == FIRST) && (f.proto == IPPROTO_ICMP || f.proto == IPPROTO_ICMPV6)
    {
        let v4 = f.v4 == 1;
        if let Some(h) = ptr_at::<[u8; 2]>(ctx, rewrite::l4_off(v4)) {
            // SAFETY: bounds checked by `ptr_at`.
            let t = unsafe { (*h)[0] };
            // An error quotes a packet of at most the minimum MTU: never in fragments.
            if shape == PLAIN && icmp_is_error(v4, t) {
                f.icmp_err = 1;
                return Want::Yes;
            }
            // An echo reply answers a ping to the pod's own address: it keeps it, in
            // every fragment of a large one.
            if t == ICMP_ECHO_REPLY && v4 || t == ICMPV6_ECHO_REPLY && !v4 {
                if shape == FIRST {
                    keep_frag(f);
                }
                return Want::No;
            }
        }
    }
    if (shape != PLAIN && shape != FIRST) || !parse_l4::<FIXED>(ctx, f, true) {
        count(Stat::Untranslatable);
        return Want::Untranslatable;
    }
    Want::Yes
}

/// Records that the later fragments of the datagram whose first fragment `f` holds keep
/// the pod's address.
#[inline(always)]
fn keep_frag(f: &mut Scratch) {
    copy16(&mut f.csum_to, &f.fwd.local);
    // SAFETY: plain helper call.
    record_frag(MASQ_FRAG_OUT, unsafe { bpf_ktime_get_ns() });
}

/// `wanted` for an IPv6 fragment (the packet `wanted` parsed into this CPU's scratch
/// slot), as a global function (see the module's doc), verified once with its constant
/// offsets: a `Want`.
#[no_mangle]
#[inline(never)]
pub extern "C" fn ecni_masq_wanted_frag6(skb: *mut __sk_buff) -> u32 {
    let ctx = TcContext::new(skb);
    let Some(f) = scratch() else {
        return Want::No as u32;
    };
    if f.shape == LATER {
        f.tcp_flags = 0;
        if find_frag(MASQ_FRAG_OUT) {
            return Want::Yes as u32;
        }
        count(Stat::Untranslatable);
        return Want::Untranslatable as u32;
    }
    if f.proto == IPPROTO_ICMPV6 {
        if let Some(h) = ptr_at::<[u8; 2]>(&ctx, FRAG6_L4_OFF) {
            // SAFETY: bounds checked by `ptr_at`.
            if unsafe { (*h)[0] } == ICMPV6_ECHO_REPLY {
                keep_frag(f);
                return Want::No as u32;
            }
        }
    }
    if f.shape != FIRST || !parse_l4::<FRAG6>(&ctx, f, true) {
        count(Stat::Untranslatable);
        return Want::Untranslatable as u32;
    }
    Want::Yes as u32
}

/// The state bits a TCP segment adds, in the direction `fin` names.
#[inline(always)]
fn tcp_state(f: &Scratch, fin: u16) -> u16 {
    let mut s = 0;
    if f.tcp_flags & TCP_FIN != 0 {
        s |= fin;
    }
    if f.tcp_flags & TCP_RST != 0 {
        s |= MASQ_RST;
    }
    s
}

/// Notes a packet of a known flow in its entry of this direction.
#[inline(always)]
fn touch(v: &mut MasqFlow, state: u16, now: u64) {
    if v.state | state != v.state || now.wrapping_sub(v.last_ns) > REFRESH_NS {
        v.state |= state;
        v.last_ns = now;
    }
}

/// The key of the other entry of the flow whose key is `key`: its local end `addr` and
/// `port` (what `key`'s entry holds), the same remote end and protocol.
#[inline(always)]
fn counterpart(other: &mut MasqKey, addr: &[u8; 16], port: u16, key: &MasqKey) {
    copy16(&mut other.local, addr);
    copy16(&mut other.remote, &key.remote);
    other.local_port = port;
    other.remote_port = key.remote_port;
    other.proto = key.proto;
    other._pad = [0; 3];
}

/// A new entry: the other side's `addr` and `port`, no timestamp shift.
#[inline(always)]
fn fresh(v: &mut MasqFlow, addr: &[u8; 16], port: u16, state: u16, now: u64) {
    copy16(&mut v.addr, addr);
    v.port = port;
    v.state = state;
    v.ts_shift = 0;
    v.last_ns = now;
    v.ts_last = 0;
    v._pad = 0;
}

/// Whether a flow whose two entries are `a` and `b` has been idle past its timeout.
#[inline(always)]
fn expired(proto: u8, a: &MasqFlow, b: &MasqFlow, now: u64) -> bool {
    let last = if a.last_ns > b.last_ns {
        a.last_ns
    } else {
        b.last_ns
    };
    now.saturating_sub(last) > masq_timeout_ns(proto, a.state | b.state)
}

const TAKEN: u32 = 0;
const GOT: u32 = 1;
const FULL: u32 = 2;
/// Reclaimable, but only with a timestamp shift (which costs each of the flow's segments
/// an option scan and a checksum patch, both ways): taken only when no probe finds better.
const SHIFTED: u32 = 3;
/// What a map update returns when `BPF_NOEXIST` finds the key there.
const EEXIST: i32 = 17;

/// Whether `port` of the node's address `f.rev.local` is a host port.
#[inline(always)]
fn host_port(f: &mut Scratch, port: u16) -> bool {
    if !portmap_enabled() || f.proto == IPPROTO_ICMP || f.proto == IPPROTO_ICMPV6 {
        return false;
    }
    copy16(&mut f.port_key.addr, &f.rev.local);
    f.port_key.port = port;
    f.port_key.proto = f.proto;
    f.port_key._pad = 0;
    // SAFETY: only presence is read.
    if unsafe { ECNI_PORTMAP.get(&f.port_key) }.is_some() {
        return true;
    }
    f.port_key.addr = if f.v4 == 1 {
        PortKey::WILDCARD_V4
    } else {
        PortKey::WILDCARD_V6
    };
    // SAFETY: as above.
    unsafe { ECNI_PORTMAP.get(&f.port_key) }.is_some()
}

/// Tries to give the new flow `port` (`f.rev`, its node view, and `f.val`, the pod's end,
/// are filled in): a port no flow holds towards the same remote end, or one whose flow has
/// been idle past its timeout (that flow's entries go). Every probe may reclaim: with only
/// the first, a port a reopened connection had touched out of turn stopped a new flow.
/// Unless `f.shift_ok`, a port whose old flow would make the new one shift its timestamps
/// is left (`SHIFTED`), for a later probe to find one that needs no shift. (A flag in the
/// scratch slot rather than an argument: each byte of this frame counts towards the
/// deepest call chain's 512, which 5.10 and 6.1 reach.)
/// A global function (see the module's doc): the flow is in this CPU's scratch slot.
#[no_mangle]
#[inline(never)]
pub extern "C" fn ecni_masq_take(port: u32, now: u64) -> u32 {
    let Some(f) = scratch() else {
        return FULL;
    };
    let port = port as u16;
    if host_port(f, port) {
        return TAKEN;
    }
    f.rev.local_port = port;
    // Looked up first: once the range has gone round, most ports are held, and a held
    // port's entry is reused in place (no failed insert, no allocation, no free).
    let Some(held) = ECNI_MASQ_REV.get_ptr_mut(&f.rev) else {
        return match ECNI_MASQ_REV.insert(&f.rev, &f.val, u64::from(BPF_NOEXIST)) {
            Ok(()) => GOT,
            // Another CPU took it since the lookup: probe on.
            Err(e) if e == -EEXIST => TAKEN,
            Err(_) => FULL,
        };
    };
    // SAFETY: a map value; read here, written below only if it is reclaimed.
    let held = unsafe { &mut *held };
    counterpart(&mut f.other, &held.addr, held.port, &f.rev);
    // SAFETY: read at once.
    let (idle, last) = match unsafe { ECNI_MASQ_FWD.get(&f.other) } {
        Some(fwd) => (
            expired(f.proto, fwd, held, now),
            (fwd.state & MASQ_TS_LAST != 0).then_some(fwd.ts_last),
        ),
        None => (true, None),
    };
    if !idle {
        return TAKEN;
    }
    // The remote end may still hold the old flow in TIME_WAIT: the new SYN's timestamp
    // must be newer than the last one the old flow sent.
    let mut shift = 0;
    if let Some(last) = last {
        let behind = last.wrapping_sub(f.syn_ts);
        if f.syn_ts_at != 0 && behind as i32 >= 0 {
            shift = behind.wrapping_add(1);
        }
    }
    if shift != 0 && f.shift_ok == 0 {
        return SHIFTED;
    }
    f.val.ts_shift = shift;
    let _ = ECNI_MASQ_FWD.remove(&f.other);
    // The node-side entry keeps its key (this port towards the same remote end): it is
    // rewritten in place. A CPU racing for the same idle port writes it too, as a replacing
    // insert would have let it; the old flow's late replies find the new flow's entry, as
    // they did.
    *held = f.val;
    count(Stat::Reclaimed);
    GOT
}

/// Finds a port for the flow in `f.fwd` from the node's address in `f.csum_to`; records
/// both entries and leaves the port in `f.val.port`. False (counted) when the flow cannot
/// have one. A subprogram returning a bare verdict: the verifier then walks the rest of the
/// program once, not once for each probe the loops below may leave from.
#[inline(never)]
fn allocate(f: &mut Scratch, now: u64) -> bool {
    copy16(&mut f.rev.local, &f.csum_to);
    copy16(&mut f.rev.remote, &f.fwd.remote);
    f.rev.remote_port = f.fwd.remote_port;
    f.rev.proto = f.fwd.proto;
    f.rev._pad = [0; 3];
    fresh(&mut f.val, &f.fwd.local, f.fwd.local_port, 0, now);
    let (mut lo, mut hi) = (MASQ_PORT_MIN, MASQ_PORT_MAX);
    if let Some(c) = ECNI_CONFIG.get(0) {
        if c.masq_port_min != 0 && c.masq_port_min <= c.masq_port_max {
            (lo, hi) = (c.masq_port_min, c.masq_port_max);
        }
    }
    let span = u32::from(hi - lo) + 1;
    let start = ECNI_MASQ_NEXT.get(0).copied().unwrap_or(0) % span;
    let mut got = None;
    // The first port that would need a timestamp shift, should no probe find one free, or
    // idle without (a pod whose TCP keeps a timestamp clock per 4-tuple, as 6.18's does,
    // sends a new SYN behind the old flow's last value half the time).
    let mut shifted = None;
    f.shift_ok = 0;
    for i in 0..MASQ_PROBES {
        if i >= span {
            break;
        }
        let port = lo + ((start + i) % span) as u16;
        match ecni_masq_take(u32::from(port), now) {
            GOT => {
                got = Some(port);
                break;
            }
            FULL => {
                count(Stat::TableFull);
                return false;
            }
            SHIFTED if shifted.is_none() => shifted = Some(port),
            _ => {}
        }
    }
    if got.is_none() {
        if let Some(port) = shifted {
            f.shift_ok = 1;
            match ecni_masq_take(u32::from(port), now) {
                GOT => got = Some(port),
                FULL => {
                    count(Stat::TableFull);
                    return false;
                }
                _ => {}
            }
        }
    }
    let Some(port) = got else {
        count(Stat::Exhausted);
        return false;
    };
    if let Some(next) = ECNI_MASQ_NEXT.get_ptr_mut(0) {
        // SAFETY: the map's one value; a racing CPU's write only moves the hint.
        unsafe { *next = u32::from(port - lo) + 1 };
    }
    // The pod's view: the node's end.
    copy16(&mut f.val.addr, &f.csum_to);
    f.val.port = port;
    if ECNI_MASQ_FWD
        .insert(&f.fwd, &f.val, u64::from(BPF_ANY))
        .is_err()
    {
        f.rev.local_port = port;
        let _ = ECNI_MASQ_REV.remove(&f.rev);
        count(Stat::TableFull);
        return false;
    }
    count(Stat::Flow);
    true
}

/// A SYN on a known flow (node-side entry `v`): the pod opens a new connection on the same
/// 4-tuple, its last one there closed. Both entries start over, or the new connection would
/// keep the closed one's 100 ms timeout and lose its port to the next new flow.
#[inline(never)]
fn reopen(f: &mut Scratch, v: &mut MasqFlow) {
    v.state &= MASQ_TS_LAST;
    counterpart(&mut f.rev, &v.addr, v.port, &f.fwd);
    if let Some(r) = ECNI_MASQ_REV.get_ptr_mut(&f.rev) {
        // SAFETY: a map value; written in place.
        unsafe { (*r).state = 0 };
    }
}

/// A segment the pod sends in a known flow (node-side entry `v`): its timestamp moves by
/// the flow's shift, and a closing one's is recorded for the port's next flow. False if the
/// rewrite failed half-way.
#[inline(never)]
fn stamp_out(ctx: &TcContext, v4: bool, v: &mut MasqFlow) -> bool {
    let closing = v.state & MASQ_FIN_OUT != 0;
    if v.ts_shift == 0 && !closing {
        return true;
    }
    let at = tcp_ts::value_at(ctx, v4);
    if at == 0 {
        return true;
    }
    let Some(ts) = tcp_ts::read(ctx, at) else {
        return true;
    };
    let shifted = ts.wrapping_add(v.ts_shift);
    if !tcp_ts::write(ctx, v4, at, ts, shifted) {
        return false;
    }
    if closing {
        v.ts_last = shifted;
        v.state |= MASQ_TS_LAST;
    }
    true
}

/// A segment the remote end sends in a flow whose pod-side clock is shifted by `shift`:
/// the value it echoes goes back to the pod's own clock. False if the rewrite failed.
#[inline(never)]
fn unstamp_in(ctx: &TcContext, v4: bool, shift: u32) -> bool {
    let at = tcp_ts::value_at(ctx, v4);
    if at == 0 {
        return true;
    }
    match tcp_ts::read(ctx, at + 4) {
        Some(echo) if echo != 0 => tcp_ts::write(ctx, v4, at + 4, echo, echo.wrapping_sub(shift)),
        _ => true,
    }
}

/// Counts a packet that must be masqueraded and cannot be, which the caller drops.
#[inline(always)]
pub fn untranslatable() {
    count(Stat::Untranslatable);
}

/// The node's address for a new flow leaving by `out_ifindex` when the FIB did not tell
/// which it chose (before 6.8): the device's address user space recorded.
#[inline(always)]
fn source(f: &mut Scratch, out_ifindex: u32) -> bool {
    // SAFETY: copied out at once.
    match unsafe { ECNI_MASQ_SRC.get(&masq_src_key(out_ifindex, f.v4 == 1)) } {
        Some(a) => {
            copy16(&mut f.csum_to, &a.addr);
            true
        }
        None => false,
    }
}

/// What `snat` did.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Snat {
    /// Masqueraded.
    Done,
    /// Left as it is: a reply in a flow the remote end opened to the pod's address.
    Keep,
    /// It cannot be masqueraded (counted): the caller drops it.
    Drop,
}

/// Masquerades the packet `wanted` accepted, leaving by `out_ifindex` (the FIB's answer
/// for it).
#[inline(always)]
pub fn snat(ctx: &TcContext, out_ifindex: u32) -> Snat {
    match ecni_masq_snat(ctx.skb.skb, out_ifindex) {
        v if v == Snat::Done as u32 => Snat::Done,
        v if v == Snat::Keep as u32 => Snat::Keep,
        _ => Snat::Drop,
    }
}

/// `snat` as a global function (see the module's doc): the flow is in this CPU's scratch
/// slot; returns a `Snat`.
#[no_mangle]
#[inline(never)]
pub extern "C" fn ecni_masq_snat(skb: *mut __sk_buff, out_ifindex: u32) -> u32 {
    let Some(f) = scratch() else {
        return Snat::Drop as u32;
    };
    translate_out(&TcContext::new(skb), f, out_ifindex) as u32
}

/// `BPF_FIB_LOOKUP_SRC` (6.8+): the lookup also tells the source address the node would
/// use on the route.
pub const FIB_LOOKUP_SRC: u32 = 1 << 4;

/// Whether the packet `wanted` accepted is a TCP SYN, which opens a flow when none is
/// there: its route lookup may as well ask for the node's source address
/// (`FIB_LOOKUP_SRC`), saving `new_flow_source` a second lookup. Other packets do not ask:
/// the selection would cost every packet of an established flow (IPv6's above all).
#[inline(always)]
pub fn opens_tcp_flow() -> bool {
    scratch().is_some_and(|f| {
        f.icmp_err == 0 && f.proto == IPPROTO_TCP && f.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN
    })
}

/// Records the source address a route lookup asked with `FIB_LOOKUP_SRC` chose, for a new
/// flow of the packet `wanted` accepted.
#[inline(always)]
pub fn fib_source(fib: &bpf_fib_lookup) {
    let Some(f) = scratch() else {
        return;
    };
    set_source(f, fib);
    f.src_known = 1;
}

/// The source address a lookup with `FIB_LOOKUP_SRC` wrote into `fib`, into `f.csum_to`.
#[inline(always)]
fn set_source(f: &mut Scratch, fib: &bpf_fib_lookup) {
    // SAFETY: union fields of plain integers, written by the lookup for this family.
    unsafe {
        if f.v4 == 1 {
            f.csum_to = [0; 16];
            f.csum_to[10] = 0xff;
            f.csum_to[11] = 0xff;
            f.csum_to[12..].copy_from_slice(&fib.__bindgen_anon_3.ipv4_src.to_ne_bytes());
        } else {
            f.csum_to = core::mem::transmute::<[u32; 4], [u8; 16]>(fib.__bindgen_anon_3.ipv6_src);
        }
    }
}
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// The node's address for a new flow in `f.fwd`, into `f.csum_to`: the one the FIB chooses
/// for the route (`BPF_FIB_LOOKUP_SRC`, 6.8+: the lookup the caller routed by, asked again
/// with the flag), else the one user space recorded for the egress device. Only a new flow
/// asks: the selection (IPv6's `ipv6_dev_get_saddr` above all, 1.7 µs of a packet's run
/// when every packet asked) is not paid for on an established flow's packets.
#[inline(never)]
fn new_flow_source(ctx: &TcContext, f: &mut Scratch, out_ifindex: u32) -> bool {
    if f.src_known == 1 {
        return true;
    }
    // SAFETY: an all-zero bpf_fib_lookup is a valid (empty) request.
    let mut fib: bpf_fib_lookup = unsafe { core::mem::zeroed() };
    // SAFETY: the context pointer is the program's `__sk_buff`, readable for the whole run.
    fib.ifindex = unsafe { (*ctx.skb.skb).ifindex };
    fib.l4_protocol = f.proto;
    // tot_len stays 0: the caller's lookup judged the packet's size.
    if f.v4 == 1 {
        let Some(ip) = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN) else {
            return source(f, out_ifindex);
        };
        // SAFETY: bounds checked by `ptr_at`.
        let ip = unsafe { &*ip };
        fib.family = AF_INET;
        fib.__bindgen_anon_2.tos = ip.tos;
        fib.__bindgen_anon_3.ipv4_src = u32::from_ne_bytes(ip.saddr);
        fib.__bindgen_anon_4.ipv4_dst = u32::from_ne_bytes(ip.daddr);
    } else {
        let Some(ip) = ptr_at::<Ipv6Hdr>(ctx, ETH_HLEN) else {
            return source(f, out_ifindex);
        };
        // SAFETY: bounds checked by `ptr_at`.
        let ip = unsafe { &*ip };
        fib.family = AF_INET6;
        fib.__bindgen_anon_2.flowinfo =
            u32::from_ne_bytes(ip.ver_tc_flow) & u32::from_ne_bytes([0x0f, 0xff, 0xff, 0xff]);
        // SAFETY: [u8; 16] and [u32; 4] have the same size; unaligned reads copy them.
        unsafe {
            fib.__bindgen_anon_3.ipv6_src = core::ptr::read_unaligned(ip.saddr.as_ptr().cast());
            fib.__bindgen_anon_4.ipv6_dst = core::ptr::read_unaligned(ip.daddr.as_ptr().cast());
        }
    }
    // SAFETY: `fib` is a valid, writable bpf_fib_lookup of the size passed.
    let rc = unsafe {
        fib_lookup(
            ctx.as_ptr(),
            &mut fib,
            core::mem::size_of::<bpf_fib_lookup>() as i32,
            FIB_LOOKUP_SRC,
        )
    };
    // A kernel before 6.8 refuses the flag (rc < 0, before reading anything else).
    let chosen = rc == i64::from(BPF_FIB_LKUP_RET_SUCCESS)
        || rc == i64::from(BPF_FIB_LKUP_RET_NO_NEIGH)
        || rc == i64::from(BPF_FIB_LKUP_RET_FRAG_NEEDED);
    if !chosen {
        return source(f, out_ifindex);
    }
    set_source(f, &fib);
    true
}

#[inline(always)]
fn translate_out(ctx: &TcContext, f: &mut Scratch, out_ifindex: u32) -> Snat {
    if f.icmp_err == 1 {
        if icmp_error_out(ctx, f) {
            return Snat::Done;
        }
        count(Stat::Untranslatable);
        return Snat::Drop;
    }
    if f.shape == LATER {
        // `wanted` found its datagram's record. One that kept the pod's address (a flow
        // the remote end opened) keeps it for every fragment, as for a whole packet.
        if same16(&f.csum_to, &f.fwd.local) {
            return Snat::Keep;
        }
        if !translate_later(ctx, f, End::Src) {
            count(Stat::Untranslatable);
            return Snat::Drop;
        }
        count(Stat::Out);
        return Snat::Done;
    }
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let port = match ECNI_MASQ_FWD.get_ptr_mut(&f.fwd) {
        Some(v) => {
            // SAFETY: a map value; written in place, as every CPU does for its flows.
            let v = unsafe { &mut *v };
            if f.proto == IPPROTO_TCP && f.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN {
                reopen(f, v);
            }
            touch(v, tcp_state(f, MASQ_FIN_OUT), now);
            if v.state & MASQ_INBOUND != 0 {
                if f.shape == FIRST {
                    // Its later fragments keep the pod's address too.
                    copy16(&mut f.csum_to, &f.fwd.local);
                    record_frag(MASQ_FRAG_OUT, now);
                }
                return Snat::Keep;
            }
            if f.proto == IPPROTO_TCP && !stamp_out(ctx, f.v4 == 1, v) {
                count(Stat::Untranslatable);
                return Snat::Drop;
            }
            copy16(&mut f.csum_to, &v.addr);
            v.port
        }
        None => {
            // Only a SYN opens a TCP flow: any other segment without a flow belongs to a
            // connection the remote end opened to the pod's address.
            if f.proto == IPPROTO_TCP && f.tcp_flags & (TCP_SYN | TCP_ACK) != TCP_SYN {
                return Snat::Keep;
            }
            if !new_flow_source(ctx, f, out_ifindex) {
                count(Stat::Untranslatable);
                return Snat::Drop;
            }
            f.syn_ts_at = 0;
            f.syn_ts = 0;
            if f.proto == IPPROTO_TCP {
                let at = tcp_ts::value_at(ctx, f.v4 == 1);
                if let Some(ts) = tcp_ts::read(ctx, at).filter(|_| at != 0) {
                    (f.syn_ts_at, f.syn_ts) = (at, ts);
                }
            }
            if !allocate(f, now) {
                return Snat::Drop;
            }
            if f.val.ts_shift != 0 {
                let shifted = f.syn_ts.wrapping_add(f.val.ts_shift);
                if !tcp_ts::write(ctx, f.v4 == 1, f.syn_ts_at, f.syn_ts, shifted) {
                    count(Stat::Untranslatable);
                    return Snat::Drop;
                }
            }
            f.val.port
        }
    };
    if f.shape == FIRST {
        record_frag(MASQ_FRAG_OUT, now);
    }
    copy16(&mut f.csum_from, &f.fwd.local);
    // An IPv6 fragment's rewrite is a global function: a second copy of the rewrite here
    // would have the verifier walk it again on the flow's every path.
    let rewritten = if f.frag6 == 1 {
        ecni_masq_out_frag6(ctx.skb.skb, u32::from(port)) == 1
    } else {
        rewrite_local::<FIXED>(ctx, f, End::Src, port)
    };
    if !rewritten {
        count(Stat::Untranslatable);
        return Snat::Drop;
    }
    count(Stat::Out);
    Snat::Done
}

/// Rewrites the node's end of the flow in `f` (`End::Src` leaving, the pod's address and
/// port becoming the node's; `End::Dst` arriving, the other way round): the address from
/// `f.csum_from` to `f.csum_to`, the local port field from `f.fwd.local_port` to `port`.
/// `translate_out`'s rewrite of an IPv6 first fragment (in this CPU's scratch slot) to the
/// node's address and `port`, as a global function with its constant offsets: 1 when done.
#[no_mangle]
#[inline(never)]
pub extern "C" fn ecni_masq_out_frag6(skb: *mut __sk_buff, port: u32) -> u32 {
    let ctx = TcContext::new(skb);
    let Some(f) = scratch() else {
        return 0;
    };
    u32::from(rewrite_local::<FRAG6>(&ctx, f, End::Src, port as u16))
}

/// `MODE`: where the transport header lies (`FIXED`, `FRAG6`).
#[inline(always)]
fn rewrite_local<const MODE: u8>(ctx: &TcContext, f: &mut Scratch, end: End, port: u16) -> bool {
    let (v4, extra) = layout::<MODE>(f);
    let field = local_port_field(f.proto, matches!(end, End::Src));
    rewrite::set_addr_at(
        ctx,
        v4,
        extra,
        f.proto,
        end,
        &mut f.csum_from,
        &mut f.csum_to,
    ) && rewrite::set_l4_u16_at(ctx, v4, extra, f.proto, field, f.fwd.local_port, port)
}

/// A UDP packet arriving from a node device for a masquerading pod's own address, outside
/// any masqueraded flow: the flow is recorded as the remote end's, so the pod's replies
/// keep the pod's address (TCP needs no record: only a SYN opens a masqueraded flow; ICMP
/// echo replies are never masqueraded).
#[inline(never)]
pub fn inbound(ctx: &TcContext) {
    let Some(f) = scratch() else {
        return;
    };
    if parse_ip(ctx, f) != Some(PLAIN) || f.proto != IPPROTO_UDP {
        return;
    }
    // Seen from the pod: the local end is the destination.
    let src = f.fwd.local;
    copy16(&mut f.fwd.local, &f.fwd.remote);
    f.fwd.remote = src;
    if !parse_l4::<FIXED>(ctx, f, false) {
        return;
    }
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(v) = ECNI_MASQ_FWD.get_ptr_mut(&f.fwd) {
        // SAFETY: a map value; written in place.
        touch(unsafe { &mut *v }, 0, now);
        return;
    }
    fresh(
        &mut f.val,
        &f.fwd.local,
        f.fwd.local_port,
        MASQ_INBOUND,
        now,
    );
    if ECNI_MASQ_FWD
        .insert(&f.fwd, &f.val, u64::from(BPF_NOEXIST))
        .is_err()
    {
        count(Stat::TableFull);
    }
}

/// What `reply` did.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Reply {
    /// Not a reply in a masqueraded flow.
    None,
    /// Translated back: the packet is now addressed to the pod.
    Done,
    /// A helper failed half-way: the packet is unusable.
    Failed,
}

/// A packet arriving at a node device: if it answers a masqueraded flow, its destination
/// becomes the pod's address and port again.
#[inline(never)]
pub fn reply(ctx: &TcContext) -> Reply {
    if !enabled() {
        return Reply::None;
    }
    let Some(f) = scratch() else {
        return Reply::None;
    };
    let Some(shape) = parse_ip(ctx, f) else {
        return Reply::None;
    };
    if shape == OTHER {
        return Reply::None;
    }
    // Seen from the node: the local end is the destination.
    let (src, dst) = (f.fwd.local, f.fwd.remote);
    f.fwd.local = dst;
    f.fwd.remote = src;
    if f.frag6 == 1 {
        return match ecni_masq_reply_frag6(ctx.skb.skb) {
            v if v == Reply::Done as u32 => Reply::Done,
            v if v == Reply::Failed as u32 => Reply::Failed,
            _ => Reply::None,
        };
    }
    if shape == LATER {
        if !find_frag(MASQ_FRAG_IN) {
            return Reply::None;
        }
        if !translate_later(ctx, f, End::Dst) {
            return Reply::Failed;
        }
        count(Stat::In);
        return Reply::Done;
    }
    if !parse_l4::<FIXED>(ctx, f, false) {
        if shape == PLAIN && (f.proto == IPPROTO_ICMP || f.proto == IPPROTO_ICMPV6) {
            return icmp_error(ctx, f);
        }
        return Reply::None;
    }
    reply_flow::<FIXED>(ctx, f)
}

/// `reply` for an IPv6 fragment (in this CPU's scratch slot, its addresses turned round),
/// as a global function (see `ecni_masq_wanted_frag6`), verified once with its constant
/// offsets: a `Reply`.
#[no_mangle]
#[inline(never)]
pub extern "C" fn ecni_masq_reply_frag6(skb: *mut __sk_buff) -> u32 {
    let ctx = TcContext::new(skb);
    let Some(f) = scratch() else {
        return Reply::None as u32;
    };
    if f.shape == LATER {
        if !find_frag(MASQ_FRAG_IN) {
            return Reply::None as u32;
        }
        if !translate_later(&ctx, f, End::Dst) {
            return Reply::Failed as u32;
        }
        count(Stat::In);
        return Reply::Done as u32;
    }
    if !parse_l4::<FRAG6>(&ctx, f, false) {
        return Reply::None as u32;
    }
    reply_flow::<FRAG6>(&ctx, f) as u32
}

/// A reply's flow looked up and the packet translated back to the pod; a first fragment
/// leaves its record for the later ones. `MODE`: where the transport header lies.
#[inline(always)]
fn reply_flow<const MODE: u8>(ctx: &TcContext, f: &mut Scratch) -> Reply {
    let Some(v) = ECNI_MASQ_REV.get_ptr_mut(&f.fwd) else {
        return Reply::None;
    };
    // SAFETY: a map value; written in place.
    let v = unsafe { &mut *v };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    touch(v, tcp_state(f, MASQ_FIN_IN) | MASQ_REPLIED, now);
    if MODE == FIXED
        && f.proto == IPPROTO_TCP
        && v.ts_shift != 0
        && f.tcp_flags & TCP_ACK != 0
        && !unstamp_in(ctx, f.v4 == 1, v.ts_shift)
    {
        return Reply::Failed;
    }
    copy16(&mut f.csum_to, &v.addr);
    let pod_port = v.port;
    if MODE == FRAG6 || f.shape == FIRST {
        record_frag(MASQ_FRAG_IN, now);
    }
    copy16(&mut f.csum_from, &f.fwd.local);
    if !rewrite_local::<MODE>(ctx, f, End::Dst, pod_port) {
        return Reply::Failed;
    }
    count(Stat::In);
    Reply::Done
}

/// An ICMP error arriving for a masqueraded flow (fragmentation needed, packet too big,
/// port unreachable...): it is addressed to the node and quotes the packet as it left, from
/// the node's address and port. Both become the pod's again, so the pod's stack learns the
/// path MTU or the error of its own flow. The IPv4 quote's header checksum is patched with
/// its address (which leaves the ICMP checksum's sum over it unchanged); the quoted
/// transport checksum is left as it is (the pod's stack does not verify a quote's).
#[inline(never)]
fn icmp_error(ctx: &TcContext, f: &mut Scratch) -> Reply {
    let v4 = f.v4 == 1;
    let Some(h) = ptr_at::<[u8; 2]>(ctx, rewrite::l4_off(v4)) else {
        return Reply::None;
    };
    // SAFETY: bounds checked by `ptr_at`.
    if !icmp_is_error(v4, unsafe { (*h)[0] }) {
        return Reply::None;
    }
    // The outer destination (the node's address), for the rewrite below.
    copy16(&mut f.csum_from, &f.fwd.local);
    let outer_proto = f.proto;
    let Some(proto) = parse_quote(ctx, v4, &mut f.fwd.local, &mut f.fwd.remote) else {
        return Reply::None;
    };
    f.fwd.proto = proto;
    let Some(q) = ptr_at::<[[u8; 2]; 4]>(ctx, quote_l4_off(v4)) else {
        return Reply::None;
    };
    // SAFETY: bounds checked by `ptr_at`.
    let q = unsafe { &*q };
    let field = match f.fwd.proto {
        IPPROTO_TCP | IPPROTO_UDP => {
            f.fwd.local_port = u16::from_be_bytes(q[0]);
            f.fwd.remote_port = u16::from_be_bytes(q[1]);
            rewrite::SPORT
        }
        IPPROTO_ICMP | IPPROTO_ICMPV6 => {
            f.fwd.local_port = u16::from_be_bytes(q[2]);
            f.fwd.remote_port = 0;
            rewrite::ECHO_ID
        }
        _ => return Reply::None,
    };
    f.fwd._pad = [0; 3];
    // SAFETY: copied out at once.
    let Some(v) = (unsafe { ECNI_MASQ_REV.get(&f.fwd) }) else {
        return Reply::None;
    };
    copy16(&mut f.csum_to, &v.addr);
    let pod_port = v.port;
    // The outer destination: the node's address becomes the pod's.
    if !rewrite::set_addr(
        ctx,
        v4,
        outer_proto,
        End::Dst,
        &mut f.csum_from,
        &mut f.csum_to,
    ) {
        return Reply::Failed;
    }
    // The quote's source and port (or echo identifier), likewise.
    if !rewrite::set_quote(
        ctx,
        v4,
        End::Src,
        &mut f.fwd.local,
        &mut f.csum_to,
        field,
        f.fwd.local_port,
        pod_port,
    ) {
        return Reply::Failed;
    }
    count(Stat::In);
    Reply::Done
}

/// An ICMP error a masquerading pod sends about a packet of one of its flows (port
/// unreachable for a late reply, say): it leaves from the node's address, and the packet
/// it quotes, which the pod received translated, is quoted as it arrived (to the node's
/// address and port). False if it is not about a masqueraded flow.
#[inline(never)]
fn icmp_error_out(ctx: &TcContext, f: &mut Scratch) -> bool {
    let v4 = f.v4 == 1;
    // The outer source (the pod's address), for the rewrite below.
    copy16(&mut f.csum_from, &f.fwd.local);
    let outer_proto = f.proto;
    // The quote runs from the remote end to the pod: its destination is the pod's end.
    let Some(proto) = parse_quote(ctx, v4, &mut f.fwd.remote, &mut f.fwd.local) else {
        return false;
    };
    f.fwd.proto = proto;
    if f.fwd.proto != IPPROTO_TCP && f.fwd.proto != IPPROTO_UDP {
        return false;
    }
    let Some(q) = ptr_at::<[[u8; 2]; 2]>(ctx, quote_l4_off(v4)) else {
        return false;
    };
    // SAFETY: bounds checked by `ptr_at`.
    let q = unsafe { &*q };
    f.fwd.local_port = u16::from_be_bytes(q[1]);
    f.fwd.remote_port = u16::from_be_bytes(q[0]);
    f.fwd._pad = [0; 3];
    // SAFETY: copied out at once.
    let Some(v) = (unsafe { ECNI_MASQ_FWD.get(&f.fwd) }) else {
        return false;
    };
    copy16(&mut f.csum_to, &v.addr);
    let node_port = v.port;
    rewrite::set_addr(
        ctx,
        v4,
        outer_proto,
        End::Src,
        &mut f.csum_from,
        &mut f.csum_to,
    ) && rewrite::set_quote(
        ctx,
        v4,
        End::Dst,
        &mut f.fwd.local,
        &mut f.csum_to,
        rewrite::DPORT,
        f.fwd.local_port,
        node_port,
    )
}
