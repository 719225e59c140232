//! The cluster network's overlay (see `ebpf_cni_maps::tunnel`): the node's `external`
//! VXLAN device carries a packet to the peer holding its destination, which its egress
//! program names in the tunnel key (`bpf_skb_set_tunnel_key`), and `ecni_from_dev` on the
//! same device checks what arrives through it before delivering it like anything else
//! that arrives on a node device.
//!
//! The tunnel key is read and written with its 28-byte layout (up to `tunnel_label`),
//! which every kernel from 5.10 takes; the `local_ipv4` field after it came in 6.0.

use aya_ebpf::{
    bindings::{
        __sk_buff, bpf_tunnel_key, BPF_F_NO_PREALLOC, BPF_F_TUNINFO_IPV6, BPF_F_ZERO_CSUM_TX,
    },
    helpers::generated::{bpf_skb_change_type, bpf_skb_get_tunnel_key, bpf_skb_set_tunnel_key},
    macros::map,
    maps::{lpm_trie::Key, Array, HashMap, LpmTrie, PerCpuArray, PerCpuHashMap},
    programs::TcContext,
};
use ebpf_cni_maps::{
    str_eq, EndpointKey, TunnelConfig, TunnelPeer, TunnelPeerStats, TunnelStats, MAX_TUNNEL_PEERS,
    TUNNEL_FLAG_UDP_CSUM,
};

use crate::packet::parse_ip;

#[map]
static ECNI_TUN_PEERS: LpmTrie<[u8; 16], TunnelPeer> =
    LpmTrie::with_max_entries(MAX_TUNNEL_PEERS, 0);

#[map]
static ECNI_TUN_NODES: HashMap<EndpointKey, u32> = HashMap::with_max_entries(MAX_TUNNEL_PEERS, 0);

#[map]
static ECNI_TUN_CFG: Array<TunnelConfig> = Array::with_max_entries(1, 0);

#[map]
static ECNI_TUN_STAT: PerCpuArray<TunnelStats> = PerCpuArray::with_max_entries(1, 0);

#[map]
static ECNI_TUN_PSTAT: PerCpuHashMap<EndpointKey, TunnelPeerStats> =
    PerCpuHashMap::with_max_entries(MAX_TUNNEL_PEERS, BPF_F_NO_PREALLOC);

const _: () = assert!(str_eq(
    ebpf_cni_maps::TUNNEL_PEER_STATS_MAP,
    stringify!(ECNI_TUN_PSTAT)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::TUNNEL_PEERS_MAP,
    stringify!(ECNI_TUN_PEERS)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::TUNNEL_NODES_MAP,
    stringify!(ECNI_TUN_NODES)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::TUNNEL_CONFIG_MAP,
    stringify!(ECNI_TUN_CFG)
));
const _: () = assert!(str_eq(
    ebpf_cni_maps::TUNNEL_STATS_MAP,
    stringify!(ECNI_TUN_STAT)
));

/// The size of the tunnel key the programs pass: `offsetof(struct bpf_tunnel_key,
/// local_ipv4)`, which 5.10 (whose struct ends there) and later kernels take.
const KEY_SIZE: u32 = 28;
const _: () = assert!(core::mem::size_of::<bpf_tunnel_key>() >= KEY_SIZE as usize);
/// `PACKET_HOST`.
const PACKET_HOST: u32 = 0;
/// The outer header's TTL.
const OUTER_TTL: u8 = 64;

#[inline(always)]
fn stats() -> Option<&'static mut TunnelStats> {
    // SAFETY: this CPU's slot, valid during the program run; TC programs run with bottom
    // halves off, so nothing else on this CPU touches it meanwhile.
    ECNI_TUN_STAT.get_ptr_mut(0).map(|s| unsafe { &mut *s })
}

#[inline(always)]
fn skb_len(ctx: &TcContext) -> u64 {
    // SAFETY: a read of the context's own field.
    u64::from(unsafe { (*ctx.skb.skb).len })
}

/// This CPU's counters of the member at `node`, if user space has added them.
#[inline(always)]
fn peer_stats(node: &EndpointKey) -> Option<&'static mut TunnelPeerStats> {
    // SAFETY: this CPU's value, valid during the program run (as `stats`); an entry user
    // space removes meanwhile is freed after an RCU grace period, which the run is inside.
    ECNI_TUN_PSTAT.get_ptr_mut(node).map(|s| unsafe { &mut *s })
}

/// The IPv4 address of a 16-byte mapped one, in host order (as the tunnel key holds it).
#[inline(always)]
fn v4_host(a: &[u8; 16]) -> u32 {
    u32::from_be_bytes([a[12], a[13], a[14], a[15]])
}

/// Whether a 16-byte address is an IPv4 one mapped into IPv6 (`::ffff:a.b.c.d`).
#[inline(always)]
fn is_mapped_v4(a: &[u8; 16]) -> bool {
    a[..10] == [0; 10] && a[10] == 0xff && a[11] == 0xff
}

/// The tunnel key's IPv6 address words from 16 bytes in network order (the key holds
/// them as the packet does).
#[inline(always)]
fn v6_words(a: &[u8; 16]) -> [u32; 4] {
    [
        u32::from_ne_bytes([a[0], a[1], a[2], a[3]]),
        u32::from_ne_bytes([a[4], a[5], a[6], a[7]]),
        u32::from_ne_bytes([a[8], a[9], a[10], a[11]]),
        u32::from_ne_bytes([a[12], a[13], a[14], a[15]]),
    ]
}

/// [`v6_words`] undone.
#[inline(always)]
fn v6_bytes(w: &[u32; 4]) -> [u8; 16] {
    let mut a = [0u8; 16];
    for (i, word) in w.iter().enumerate() {
        let b = word.to_ne_bytes();
        a[i * 4] = b[0];
        a[i * 4 + 1] = b[1];
        a[i * 4 + 2] = b[2];
        a[i * 4 + 3] = b[3];
    }
    a
}

/// Egress of the tunnel device: the tunnel key towards the peer holding the destination
/// (`TC_ACT_OK`), or a drop when no peer does. The mark goes: nothing on the node may
/// take the outer packet for the inner one's (kube-proxy's masquerade mark, k8s#92035).
#[inline(always)]
pub fn to_tunnel(ctx: &TcContext) -> i32 {
    const TC_ACT_OK: i32 = 0;
    const TC_ACT_SHOT: i32 = 2;
    let mut src = [0u8; 16];
    let mut dst = Key::new(128, [0u8; 16]);
    if parse_ip(ctx, &mut src, &mut dst.data).is_none() {
        if let Some(s) = stats() {
            s.drop_no_peer = s.drop_no_peer.wrapping_add(1);
        }
        return TC_ACT_SHOT;
    }
    let Some(peer) = ECNI_TUN_PEERS.get(&dst) else {
        if let Some(s) = stats() {
            s.drop_no_peer = s.drop_no_peer.wrapping_add(1);
        }
        return TC_ACT_SHOT;
    };
    let Some(cfg) = ECNI_TUN_CFG.get(0) else {
        return TC_ACT_SHOT;
    };
    // SAFETY: all-zero is a valid `bpf_tunnel_key` (integers only).
    let mut key: bpf_tunnel_key = unsafe { core::mem::zeroed() };
    key.tunnel_id = cfg.vni;
    key.tunnel_ttl = OUTER_TTL;
    // An IPv4 underlay leaves the outer UDP checksum out unless asked; an IPv6 one must
    // carry it (RFC 8200 §8.1), which the device's socket computes.
    let flags = if !is_mapped_v4(&peer.node) {
        key.__bindgen_anon_1.remote_ipv6 = v6_words(&peer.node);
        u64::from(BPF_F_TUNINFO_IPV6)
    } else {
        key.__bindgen_anon_1.remote_ipv4 = v4_host(&peer.node);
        if cfg.flags & TUNNEL_FLAG_UDP_CSUM != 0 {
            0
        } else {
            u64::from(BPF_F_ZERO_CSUM_TX)
        }
    };
    // SAFETY: the program's own `__sk_buff` and a key of at least `KEY_SIZE` bytes.
    let rc = unsafe { bpf_skb_set_tunnel_key(ctx.skb.skb, &mut key, KEY_SIZE, flags) };
    if rc != 0 {
        if let Some(s) = stats() {
            s.errors = s.errors.wrapping_add(1);
        }
        return TC_ACT_SHOT;
    }
    ctx.set_mark(0);
    let len = skb_len(ctx);
    if let Some(s) = stats() {
        s.encap_packets = s.encap_packets.wrapping_add(1);
        s.encap_bytes = s.encap_bytes.wrapping_add(len);
    }
    if let Some(s) = peer_stats(&EndpointKey { addr: peer.node }) {
        s.encap_packets = s.encap_packets.wrapping_add(1);
        s.encap_bytes = s.encap_bytes.wrapping_add(len);
    }
    TC_ACT_OK
}

/// Whether `ifindex` is the node's tunnel device.
#[inline(always)]
pub fn is_tunnel(ifindex: u32) -> bool {
    matches!(ECNI_TUN_CFG.get(0), Some(c) if c.ifindex != 0 && c.ifindex == ifindex)
}

/// Ingress of the tunnel device: whether the packet may go on (`ecni_from_dev` then
/// handles it as from any node device); a packet from a node that is no member, or a
/// member's whose inner source is not its own, is counted here and dropped by the caller.
/// An accepted packet is marked as addressed to the node: its inner destination MAC is
/// the sending node's device's, never this one's.
#[inline(always)]
pub fn from_tunnel(ctx: &TcContext) -> bool {
    ecni_tun_from_dev(ctx.skb.skb) != 0
}

/// [`from_tunnel`] as a global function (1: the packet may go on). The verifier checks it
/// once: inlined, it nearly doubled the states the rest of `ecni_from_dev` was walked in on
/// 6.1 (33,518 instructions; 23,166 this way, and 21,492 either way on 6.18).
#[no_mangle]
#[inline(never)]
pub extern "C" fn ecni_tun_from_dev(skb: *mut __sk_buff) -> u32 {
    u32::from(check_from_tunnel(&TcContext::new(skb)))
}

#[inline(always)]
fn check_from_tunnel(ctx: &TcContext) -> bool {
    // SAFETY: all-zero is a valid `bpf_tunnel_key` (integers only).
    let mut key: bpf_tunnel_key = unsafe { core::mem::zeroed() };
    // The key's family must be asked for: an IPv4 underlay's first, the kernel refuses the
    // other (`EPROTO`).
    // SAFETY: the program's own `__sk_buff` and a key of at least `KEY_SIZE` bytes.
    let mut rc = unsafe { bpf_skb_get_tunnel_key(ctx.skb.skb, &mut key, KEY_SIZE, 0) };
    let mut v6 = false;
    if rc != 0 {
        v6 = true;
        // SAFETY: as above.
        rc = unsafe {
            bpf_skb_get_tunnel_key(
                ctx.skb.skb,
                &mut key,
                KEY_SIZE,
                u64::from(BPF_F_TUNINFO_IPV6),
            )
        };
    }
    let mut src = Key::new(128, [0u8; 16]);
    let mut dst = [0u8; 16];
    if rc != 0 || parse_ip(ctx, &mut src.data, &mut dst).is_none() {
        if let Some(s) = stats() {
            s.drop_malformed = s.drop_malformed.wrapping_add(1);
        }
        return false;
    }
    let node = if v6 {
        // SAFETY: the union's IPv6 member, which an IPv6 underlay's key fills.
        EndpointKey::v6(v6_bytes(unsafe { &key.__bindgen_anon_1.remote_ipv6 }))
    } else {
        // SAFETY: the union's IPv4 member, which an IPv4 underlay's key fills.
        EndpointKey::v4(unsafe { key.__bindgen_anon_1.remote_ipv4 }.to_be_bytes())
    };
    // SAFETY: the value is not read, only its presence.
    if unsafe { ECNI_TUN_NODES.get(&node) }.is_none() {
        if let Some(s) = stats() {
            s.drop_not_member = s.drop_not_member.wrapping_add(1);
        }
        return false;
    }
    let own = match ECNI_TUN_PEERS.get(&src) {
        Some(p) => p.node == node.addr,
        // The node itself (node → pod, SNATed NodePort traffic).
        None => src.data == node.addr,
    };
    let peer = peer_stats(&node);
    if !own {
        if let Some(s) = stats() {
            s.drop_forged_source = s.drop_forged_source.wrapping_add(1);
        }
        if let Some(s) = peer {
            s.drop_forged_source = s.drop_forged_source.wrapping_add(1);
        }
        return false;
    }
    // SAFETY: the program's own `__sk_buff`; PACKET_OTHERHOST → PACKET_HOST is allowed.
    unsafe { bpf_skb_change_type(ctx.skb.skb, PACKET_HOST) };
    let len = skb_len(ctx);
    if let Some(s) = stats() {
        s.decap_packets = s.decap_packets.wrapping_add(1);
        s.decap_bytes = s.decap_bytes.wrapping_add(len);
    }
    if let Some(s) = peer {
        s.decap_packets = s.decap_packets.wrapping_add(1);
        s.decap_bytes = s.decap_bytes.wrapping_add(len);
    }
    true
}
