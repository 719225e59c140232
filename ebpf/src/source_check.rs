//! The source check of what a pod sends (`ecni_from_pod`, `ecni_from_chain`): a frame must
//! come from the pod interface's MAC and from an address the pod may send from (its own,
//! or a prefix its config lists); anything else is dropped and counted, so a pod cannot
//! send with another pod's address, a made-up one, or another MAC.
//!
//! One LPM lookup in `ECNI_SOURCES` per frame answers both, keyed by the host veth and the
//! frame's source address (IPv4, IPv6, or ARP's sender): the longest match is the
//! address's own entry (pass) or the pod's catch-all (refuse), and every entry carries the
//! pod's MAC. A pod without entries (its check is off, a release before the check attached
//! it, or it is between its ADD's steps) is not checked: on a node of such pods the lookup
//! finds an empty trie.
//!
//! Passed although they are no address of the pod, where the protocols need them: IPv6
//! link-local sources (neighbour discovery, router solicitation, MLD), the unspecified
//! address `::` of duplicate address detection and MLD (ICMPv6, or a hop-by-hop header
//! first), `0.0.0.0` of DHCP (UDP) and IGMP, and ARP probes (sender `0.0.0.0`). They go to
//! the stack, which never forwards them (a link-local or unspecified source stays on its
//! link), never to the programs' redirects.
//!
//! A frame whose source cannot be read is refused when the pod is checked: an IP or ARP
//! header cut short (one outside the linear data, where a raw socket may put it, is pulled
//! in first), an ARP message that is not Ethernet/IPv4, and every other EtherType
//! (VLAN-tagged frames could carry a spoofed IP packet that the stack unwraps after this
//! program has run).
//!
//! `ecni_source_check` is a global function (see `masq`'s module doc): the verifier checks
//! it once, and its callers see only its verdict.

use aya_ebpf::{
    bindings::__sk_buff,
    macros::map,
    maps::{lpm_trie::Key, LpmTrie},
    programs::TcContext,
};
use ebpf_cni_maps::{
    str_eq, SourceKey, SourceRule, IPPROTO_ICMPV6, IPPROTO_UDP, MAX_SOURCES, SOURCE_FAMILY_V4,
    SOURCE_FAMILY_V6, SOURCE_HEAD_BITS, SOURCE_PASS, SOURCE_PASS_MASQ,
};

use crate::packet::{
    ptr_at, ArpEth4, EthHdr, Ipv4Hdr, Ipv6Hdr, ETH_HLEN, ETH_P_ARP, ETH_P_IP, ETH_P_IPV6,
};

#[map]
pub static ECNI_SOURCES: LpmTrie<SourceKey, SourceRule> = LpmTrie::with_max_entries(MAX_SOURCES, 0);

const _: () = assert!(str_eq(ebpf_cni_maps::SOURCES_MAP, stringify!(ECNI_SOURCES)));

const IPPROTO_IGMP: u8 = 2;

const _: () = assert!(core::mem::size_of::<Key<SourceKey>>() == 7 * 4);
/// IPv6 hop-by-hop options: MLD reports carry one before their ICMPv6 header.
const IPPROTO_HOPOPTS: u8 = 0;

/// What the check decided about a frame the pod sent.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Source {
    /// The pod may send it (or the pod is not checked): on as usual.
    Pass = 0,
    /// A source the protocols need on the link only (see the module doc): to the stack.
    Stack = 1,
    /// The source address is not one the pod may send from, or cannot be read: drop.
    BadAddress = 2,
    /// The source MAC is not the pod interface's: drop.
    BadMac = 3,
    /// As `Pass`, from the pod's own address, and the pod masquerades
    /// ([`SOURCE_PASS_MASQ`]): masquerade need not look the source's endpoint up.
    PassMasq = 4,
}

/// The check of the frame in `ctx`, sent by the pod behind host veth `ifindex`.
#[inline(always)]
pub fn check(ctx: &TcContext, ifindex: u32) -> Source {
    match ecni_source_check(ctx.skb.skb, ifindex) {
        v if v == Source::Pass as u32 => Source::Pass,
        v if v == Source::PassMasq as u32 => Source::PassMasq,
        v if v == Source::Stack as u32 => Source::Stack,
        v if v == Source::BadMac as u32 => Source::BadMac,
        _ => Source::BadAddress,
    }
}

/// [`check`] as a global function; returns a [`Source`].
#[no_mangle]
#[inline(never)]
pub extern "C" fn ecni_source_check(skb: *mut __sk_buff, ifindex: u32) -> u32 {
    verdict(&TcContext::new(skb), ifindex) as u32
}

/// A header at `offset`, pulled into the linear data when it lies beyond it.
#[inline(always)]
fn header<T>(ctx: &TcContext, offset: usize) -> Option<*mut T> {
    if let Some(p) = ptr_at::<T>(ctx, offset) {
        return Some(p);
    }
    ctx.pull_data((offset + core::mem::size_of::<T>()) as u32)
        .ok()?;
    ptr_at::<T>(ctx, offset)
}

/// Word compares, not a slice compare (see `maps::is_v4_mapped`).
#[inline(always)]
fn same_mac(a: &[u8; 6], b: &[u8; 6]) -> bool {
    u32::from_ne_bytes([a[0], a[1], a[2], a[3]]) == u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
        && u16::from_ne_bytes([a[4], a[5]]) == u16::from_ne_bytes([b[4], b[5]])
}

#[inline(always)]
fn is_zero16(a: &[u8; 16]) -> bool {
    u64::from_ne_bytes([a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]]) == 0
        && u64::from_ne_bytes([a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15]]) == 0
}

#[inline(always)]
fn verdict(ctx: &TcContext, ifindex: u32) -> Source {
    let Some(eth) = ptr_at::<EthHdr>(ctx, 0) else {
        // The veth never delivers less than an Ethernet header.
        return Source::Pass;
    };
    // SAFETY: bounds checked by `ptr_at`; copied out before any pull moves the data.
    let (mac, proto) = unsafe { ((*eth).src, u16::from_be_bytes((*eth).proto)) };
    // The key's fields as 32-bit words, filled below: a packed `Key<SourceKey>` zeroed
    // whole is 28 byte stores (alignment 1), words are 7 stores.
    let mut family = 0u32;
    let mut addr = [0u32; 4];
    // The sender MAC an ARP message claims, besides the frame's.
    let mut arp_mac = mac;
    let mut readable = true;
    let mut link_only = false;
    match proto {
        ETH_P_IP => match header::<Ipv4Hdr>(ctx, ETH_HLEN) {
            Some(ip) => {
                // SAFETY: bounds checked by `header`.
                let ip = unsafe { &*ip };
                family = SOURCE_FAMILY_V4;
                addr[0] = u32::from_ne_bytes(ip.saddr);
                link_only =
                    addr[0] == 0 && (ip.protocol == IPPROTO_UDP || ip.protocol == IPPROTO_IGMP);
            }
            None => readable = false,
        },
        ETH_P_IPV6 => match header::<Ipv6Hdr>(ctx, ETH_HLEN) {
            Some(ip) => {
                // SAFETY: bounds checked by `header`.
                let ip = unsafe { &*ip };
                family = SOURCE_FAMILY_V6;
                let s = &ip.saddr;
                addr = [
                    u32::from_ne_bytes([s[0], s[1], s[2], s[3]]),
                    u32::from_ne_bytes([s[4], s[5], s[6], s[7]]),
                    u32::from_ne_bytes([s[8], s[9], s[10], s[11]]),
                    u32::from_ne_bytes([s[12], s[13], s[14], s[15]]),
                ];
                link_only = (s[0] == 0xfe && s[1] & 0xc0 == 0x80)
                    || (is_zero16(s)
                        && (ip.nexthdr == IPPROTO_ICMPV6 || ip.nexthdr == IPPROTO_HOPOPTS));
            }
            None => readable = false,
        },
        ETH_P_ARP => match header::<ArpEth4>(ctx, ETH_HLEN) {
            Some(a) => {
                // SAFETY: bounds checked by `header`.
                let a = unsafe { &*a };
                if a.htype == [0, 1]
                    && u16::from_be_bytes(a.ptype) == ETH_P_IP
                    && a.hlen == 6
                    && a.plen == 4
                {
                    family = SOURCE_FAMILY_V4;
                    addr[0] = u32::from_ne_bytes(a.spa);
                    arp_mac = a.sha;
                    link_only = addr[0] == 0;
                } else {
                    readable = false;
                }
            }
            None => readable = false,
        },
        _ => readable = false,
    }
    // Unreadable frames look up the pod's catch-all (family 0 matches no address entry).
    // `Key<SourceKey>`'s layout: prefix length, ifindex, family, address.
    let key: [u32; 7] = [
        SOURCE_HEAD_BITS + 128,
        ifindex,
        family,
        addr[0],
        addr[1],
        addr[2],
        addr[3],
    ];
    // SAFETY: `Key<SourceKey>` is packed (alignment 1) and 28 plain bytes, as `key` is.
    let key = unsafe { &*key.as_ptr().cast::<Key<SourceKey>>() };
    let Some(rule) = ECNI_SOURCES.get(key).copied() else {
        return Source::Pass;
    };
    if !same_mac(&mac, &rule.mac) || !same_mac(&arp_mac, &rule.mac) {
        return Source::BadMac;
    }
    if !readable {
        return Source::BadAddress;
    }
    if rule.verdict == SOURCE_PASS {
        return Source::Pass;
    }
    if rule.verdict == SOURCE_PASS_MASQ {
        return Source::PassMasq;
    }
    if link_only {
        return Source::Stack;
    }
    Source::BadAddress
}
