//! Bounds-checked access to packet headers. Header structs hold byte arrays only, so they
//! have alignment 1 and reading them through a pointer into the packet is always aligned.

use crate::maps::AlignedKey;
use aya_ebpf::programs::TcContext;

pub const ETH_HLEN: usize = 14;
pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const ETH_P_ARP: u16 = 0x0806;

#[repr(C)]
pub struct EthHdr {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    pub proto: [u8; 2],
}

#[repr(C)]
pub struct Ipv4Hdr {
    pub ver_ihl: u8,
    pub tos: u8,
    pub tot_len: [u8; 2],
    pub id: [u8; 2],
    pub frag_off: [u8; 2],
    pub ttl: u8,
    pub protocol: u8,
    pub check: [u8; 2],
    pub saddr: [u8; 4],
    pub daddr: [u8; 4],
}

#[repr(C)]
pub struct Ipv6Hdr {
    pub ver_tc_flow: [u8; 4],
    pub payload_len: [u8; 2],
    pub nexthdr: u8,
    pub hop_limit: u8,
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
}

/// An ARP message for IPv4 over Ethernet (RFC 826).
#[repr(C)]
pub struct ArpEth4 {
    pub htype: [u8; 2],
    pub ptype: [u8; 2],
    pub hlen: u8,
    pub plen: u8,
    pub oper: [u8; 2],
    pub sha: [u8; 6],
    pub spa: [u8; 4],
    pub tha: [u8; 6],
    pub tpa: [u8; 4],
}

pub const ARP_REQUEST: [u8; 2] = [0, 1];
pub const ARP_REPLY: [u8; 2] = [0, 2];

const _: () = assert!(core::mem::size_of::<ArpEth4>() == 28);
const _: () = assert!(core::mem::size_of::<EthHdr>() == ETH_HLEN);
const _: () = assert!(core::mem::size_of::<Ipv4Hdr>() == 20);
const _: () = assert!(core::mem::size_of::<Ipv6Hdr>() == 40);

/// A pointer to a `T` at `offset` in the linear packet data, if all of it is there.
#[inline(always)]
pub fn ptr_at<T>(ctx: &TcContext, offset: usize) -> Option<*mut T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + core::mem::size_of::<T>() > end {
        return None;
    }
    Some((start + offset) as *mut T)
}

/// Copies a 16-byte address, a byte loaded and stored at a time (BPF has no unaligned
/// loads). A `memcpy`, so the copy is lowered load by store: as a read and a write of the
/// whole array it became a `memmove`, whose lowering makes all 16 loads before the first
/// store and spills them to the stack (`masquerade::wanted`'s frame: 104 bytes, against 32).
#[inline(always)]
pub fn copy16(dst: &mut [u8; 16], src: &[u8; 16]) {
    // SAFETY: two valid 16-byte arrays; a `&mut` and a `&` never overlap.
    unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr(), 16) };
}

/// What [`parse_ip`] read of a packet's IP header besides its addresses.
#[derive(Clone, Copy)]
pub struct IpHead {
    pub v4: bool,
    /// The transport protocol (IPv6: the next header, an extension header's number too;
    /// after a fragment header, the fragment header's next header).
    pub proto: u8,
    /// The transport header directly follows a fixed-size, unfragmented IP header: IPv4
    /// without options and not a fragment (MF clear, offset 0); IPv6 always (an extension
    /// header shows in `proto`), unless [`parse_frag6`] found a fragment header.
    pub plain: bool,
    /// A fragment: [`FRAG_FIRST`] (the transport header follows the IPv4 header without
    /// options, or IPv6's fragment header) or [`FRAG_LATER`] (the datagram's payload
    /// does); else [`FRAG_NONE`].
    pub frag: u8,
    /// IPv6 with a fragment header right after the fixed one, read by [`parse_frag6`]: a
    /// first fragment's transport header lies [`FRAG6_HLEN`] bytes further than a whole
    /// packet's.
    pub frag6: bool,
    /// The identification the fragments of one datagram share (IPv4: the first two bytes).
    pub id: [u8; 4],
}

pub const FRAG_NONE: u8 = 0;
pub const FRAG_FIRST: u8 = 1;
pub const FRAG_LATER: u8 = 2;

/// IPv6's fragment header (RFC 8200, 4.5).
#[repr(C)]
pub struct Frag6Hdr {
    pub nexthdr: u8,
    pub _reserved: u8,
    /// Offset in 8-byte units (13 bits), two reserved bits, M (more fragments).
    pub frag_off: [u8; 2],
    pub id: [u8; 4],
}

pub const IPPROTO_FRAGMENT: u8 = 44;
pub const FRAG6_HLEN: usize = 8;

const _: () = assert!(core::mem::size_of::<Frag6Hdr>() == FRAG6_HLEN);

/// Parses the Ethernet and IP headers of an IPv4 or IPv6 packet (host ports and
/// masquerade both start here): the source and destination addresses go to `src` and
/// `dst` in the endpoint map's key form (IPv4 mapped into IPv6), which the callers keep
/// in their per-CPU scratch slots (16-byte addresses do not fit the BPF stack's 512 bytes
/// across the call chain). `None` for another ethertype or a truncated header.
#[inline(always)]
pub fn parse_ip(ctx: &TcContext, src: &mut [u8; 16], dst: &mut [u8; 16]) -> Option<IpHead> {
    let eth = ptr_at::<EthHdr>(ctx, 0)?;
    // SAFETY: bounds checked by `ptr_at`.
    let ethertype = u16::from_be_bytes(unsafe { (*eth).proto });
    if ethertype == ETH_P_IP {
        let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)?;
        // SAFETY: bounds checked by `ptr_at`.
        let ip = unsafe { &*ip };
        copy16(src, &AlignedKey::v4(ip.saddr).0.addr);
        copy16(dst, &AlignedKey::v4(ip.daddr).0.addr);
        // Flags (reserved, DF, MF) and the offset in 8-byte units.
        let off = u16::from_be_bytes(ip.frag_off);
        let frag = if ip.ver_ihl != 0x45 {
            FRAG_NONE
        } else if off & 0x1fff != 0 {
            FRAG_LATER
        } else if off & 0x2000 != 0 {
            FRAG_FIRST
        } else {
            FRAG_NONE
        };
        Some(IpHead {
            v4: true,
            proto: ip.protocol,
            plain: ip.ver_ihl == 0x45 && off & 0x3fff == 0,
            frag,
            frag6: false,
            id: [ip.id[0], ip.id[1], 0, 0],
        })
    } else if ethertype == ETH_P_IPV6 {
        let ip = ptr_at::<Ipv6Hdr>(ctx, ETH_HLEN)?;
        // SAFETY: bounds checked by `ptr_at`.
        let ip = unsafe { &*ip };
        copy16(src, &ip.saddr);
        copy16(dst, &ip.daddr);
        Some(IpHead {
            v4: false,
            proto: ip.nexthdr,
            plain: true,
            frag: FRAG_NONE,
            frag6: false,
            id: [0; 4],
        })
    } else {
        None
    }
}

/// Completes `head`, an IPv6 packet's whose next header is a fragment header, from a fragment
/// header right after the fixed one: the transport protocol, the fragment's place, the
/// identification (only masquerade, which translates fragments, reads it). A header cut
/// short leaves `head` as it was: an extension header, not translated.
#[inline(always)]
pub fn parse_frag6(ctx: &TcContext, head: &mut IpHead) {
    if head.v4 || head.proto != IPPROTO_FRAGMENT {
        return;
    }
    let Some(h) = ptr_at::<Frag6Hdr>(ctx, ETH_HLEN + 40) else {
        return;
    };
    // SAFETY: bounds checked by `ptr_at`.
    let h = unsafe { &*h };
    head.proto = h.nexthdr;
    head.plain = false;
    head.frag6 = true;
    head.id = h.id;
    // An offset of 0 without M (an atomic fragment, RFC 6946) is a whole datagram:
    // translated as a first fragment, its record never used.
    head.frag = if u16::from_be_bytes(h.frag_off) & 0xfff8 != 0 {
        FRAG_LATER
    } else {
        FRAG_FIRST
    };
}

/// Whether an ICMP (`v4`) or ICMPv6 type is an error that quotes the packet it is about.
#[inline(always)]
pub fn icmp_is_error(v4: bool, t: u8) -> bool {
    if v4 {
        // Destination unreachable (fragmentation needed among them), time exceeded,
        // parameter problem.
        t == 3 || t == 11 || t == 12
    } else {
        // Destination unreachable, packet too big, time exceeded, parameter problem.
        (1..=4).contains(&t)
    }
}

/// Where the packet an ICMP error quotes starts: after the fixed IP header (errors are
/// translated only without IPv4 options or IPv6 extension headers) and the 8-byte ICMP
/// header.
#[inline(always)]
pub fn quote_off(v4: bool) -> usize {
    ETH_HLEN + if v4 { 20 } else { 40 } + 8
}

/// Where the quoted packet's transport header starts (its IP header fixed-size too).
#[inline(always)]
pub fn quote_l4_off(v4: bool) -> usize {
    quote_off(v4) + if v4 { 20 } else { 40 }
}

/// Reads the packet an ICMP error quotes: its addresses into `src` and `dst` (IPv4 mapped
/// into IPv6, as [`parse_ip`] gives them) and its transport protocol. `None` if the quote
/// is cut short or its IPv4 header has options.
#[inline(always)]
pub fn parse_quote(
    ctx: &TcContext,
    v4: bool,
    src: &mut [u8; 16],
    dst: &mut [u8; 16],
) -> Option<u8> {
    if v4 {
        let ip = ptr_at::<Ipv4Hdr>(ctx, quote_off(true))?;
        // SAFETY: bounds checked by `ptr_at`.
        let ip = unsafe { &*ip };
        if ip.ver_ihl != 0x45 {
            return None;
        }
        copy16(src, &AlignedKey::v4(ip.saddr).0.addr);
        copy16(dst, &AlignedKey::v4(ip.daddr).0.addr);
        Some(ip.protocol)
    } else {
        let ip = ptr_at::<Ipv6Hdr>(ctx, quote_off(false))?;
        // SAFETY: bounds checked by `ptr_at`.
        let ip = unsafe { &*ip };
        copy16(src, &ip.saddr);
        copy16(dst, &ip.daddr);
        Some(ip.nexthdr)
    }
}

/// Decrements the IPv4 TTL and patches the header checksum incrementally (RFC 1624): the
/// 16-bit word (ttl, protocol) drops by 0x0100, so the checksum rises by as much.
#[inline(always)]
pub fn ipv4_decrement_ttl(ip: &mut Ipv4Hdr) {
    let mut sum = u32::from(u16::from_be_bytes(ip.check)) + 0x0100;
    sum = (sum & 0xffff) + (sum >> 16);
    ip.check = (sum as u16).to_be_bytes();
    ip.ttl -= 1;
}

/// Addresses the stack must see: multicast, broadcast and link-local traffic (ARP's IPv6
/// counterpart, neighbour discovery, lives here).
#[inline(always)]
pub fn ipv4_is_special(a: &[u8; 4]) -> bool {
    a[0] >= 224 || a[0] == 0 || a[0] == 127 || (a[0] == 169 && a[1] == 254)
}

#[inline(always)]
pub fn ipv6_is_special(a: &[u8; 16]) -> bool {
    a[0] == 0xff || (a[0] == 0xfe && a[1] & 0xc0 == 0x80) || (a[..15] == [0; 15])
}
