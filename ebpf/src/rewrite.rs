//! Rewriting an address or a 16-bit transport field (a port, an ICMP echo identifier) in
//! place, with the IPv4 header checksum and the transport checksum patched incrementally.
//! Host ports (`nat`) and masquerade (`masq`) both translate with these.

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    programs::TcContext,
};
use ebpf_cni_maps::{IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP};

use crate::packet::{copy16, ptr_at, quote_l4_off, quote_off, Ipv4Hdr, Ipv6Hdr, ETH_HLEN};

const IPV4_L4_OFF: usize = ETH_HLEN + 20;
const IPV6_L4_OFF: usize = ETH_HLEN + 40;

/// Where the transport header starts after a fixed-size IP header (constant per family):
/// only headers without IPv4 options or IPv6 extension headers are translated, but for
/// masquerade's IPv6 fragments (`set_addr_at`, `set_l4_u16_at`).
#[inline(always)]
pub fn l4_off(v4: bool) -> usize {
    if v4 {
        IPV4_L4_OFF
    } else {
        IPV6_L4_OFF
    }
}

#[derive(Clone, Copy)]
pub enum End {
    Src,
    Dst,
}

/// The transport checksum: its offset in the transport header, the helper's flags, and
/// whether it covers the addresses (pseudo header; ICMP for IPv4 does not). Every field is
/// defined in every case: an `Option` of a tuple leaves its payload undefined when `None`,
/// and a spilled undefined register is what the verifier refuses ("!read_ok").
#[derive(Clone, Copy)]
struct Sum {
    present: bool,
    pseudo: bool,
    off: usize,
    flags: u64,
}

#[inline(always)]
fn l4_sum(v4: bool, proto: u8) -> Sum {
    let (present, pseudo, off, flags) = match proto {
        IPPROTO_TCP => (true, true, TCP_CHECK, 0),
        // A zero UDP checksum (IPv4) means "none" and must stay zero.
        IPPROTO_UDP => (true, true, 6, u64::from(BPF_F_MARK_MANGLED_0)),
        IPPROTO_ICMP if v4 => (true, false, 2, 0),
        IPPROTO_ICMPV6 if !v4 => (true, true, 2, 0),
        _ => (false, false, 0, 0),
    };
    Sum {
        present,
        pseudo,
        off,
        flags,
    }
}

/// The ones' complement sum of the 16-bit words `sum` has gathered, folded to 16 bits.
#[inline(always)]
pub fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// The 16-bit word at `i` of `b` (network order).
#[inline(always)]
fn word(b: &[u8], i: usize) -> u32 {
    u32::from(u16::from_be_bytes([b[i], b[i + 1]]))
}

/// What the ones' complement sum of a header gains when `from` (16 bytes) becomes `to`, as
/// `bpf_csum_diff` gives it (unfolded): in the kernel's convention, the words read in the
/// machine's byte order, as `bpf_l4_csum_replace` adds it to the checksum field read
/// likewise.
#[inline(always)]
fn diff16(from: &[u8; 16], to: &[u8; 16]) -> u32 {
    let mut d = 0u32;
    let mut i = 0;
    while i < 16 {
        let (f, t) = (
            u16::from_ne_bytes([from[i], from[i + 1]]),
            u16::from_ne_bytes([to[i], to[i + 1]]),
        );
        d += u32::from(!f) + u32::from(t);
        i += 2;
    }
    d
}

/// Rewrites the `end` address from `from` to `to` (IPv4 mapped into IPv6 for IPv4 packets),
/// patching the IPv4 header checksum and the transport checksum's pseudo header.
///
/// The addresses and the IPv4 header checksum are written in place (direct packet access:
/// the program's prologue has already made the headers writable, so a cloned skb is not
/// unshared again by each helper), the header checksum by RFC 1624. Only the transport
/// checksum goes through `bpf_l4_csum_replace`, which alone knows the skb's checksum state
/// (a `CHECKSUM_PARTIAL` segment's field holds the pseudo header's sum, not the complement,
/// and `CHECKSUM_COMPLETE`'s `skb->csum` follows): one helper call where there were three.
#[inline(always)]
pub fn set_addr(
    ctx: &TcContext,
    v4: bool,
    proto: u8,
    end: End,
    from: &mut [u8; 16],
    to: &mut [u8; 16],
) -> bool {
    set_addr_at(ctx, v4, 0, proto, end, from, to)
}

/// [`set_addr`] for a packet whose transport header starts `extra` bytes past the fixed IP
/// header (an IPv6 first fragment's: after the fragment header). Callers pass a constant,
/// so each family's offset stays one for the verifier.
#[inline(always)]
pub fn set_addr_at(
    ctx: &TcContext,
    v4: bool,
    extra: usize,
    proto: u8,
    end: End,
    from: &mut [u8; 16],
    to: &mut [u8; 16],
) -> bool {
    let sum = l4_sum(v4, proto);
    let covered = sum.present && sum.pseudo;
    if v4 {
        let Some(ip) = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN) else {
            return false;
        };
        // SAFETY: bounds checked by `ptr_at`; TC programs may write packet data.
        let ip = unsafe { &mut *ip };
        let new_bytes = [to[12], to[13], to[14], to[15]];
        let at = match end {
            End::Src => &mut ip.saddr,
            End::Dst => &mut ip.daddr,
        };
        // What the header's sum loses (the old address) and gains (the new one).
        let old_bytes = [from[12], from[13], from[14], from[15]];
        let gain = (!word(&old_bytes, 0) & 0xffff)
            + (!word(&old_bytes, 2) & 0xffff)
            + word(&new_bytes, 0)
            + word(&new_bytes, 2);
        let check = !u16::from_be_bytes(ip.check);
        ip.check = (!fold(u32::from(check) + gain)).to_be_bytes();
        *at = new_bytes;
        if covered {
            let old = u32::from_ne_bytes(old_bytes);
            let new = u32::from_ne_bytes(new_bytes);
            if ctx
                .l4_csum_replace(
                    IPV4_L4_OFF + extra + sum.off,
                    u64::from(old),
                    u64::from(new),
                    sum.flags | u64::from(BPF_F_PSEUDO_HDR) | 4,
                )
                .is_err()
            {
                return false;
            }
        }
        true
    } else {
        if covered {
            let diff = diff16(from, to);
            if ctx
                .l4_csum_replace(
                    IPV6_L4_OFF + extra + sum.off,
                    0,
                    u64::from(diff),
                    sum.flags | u64::from(BPF_F_PSEUDO_HDR),
                )
                .is_err()
            {
                return false;
            }
        }
        let Some(ip) = ptr_at::<Ipv6Hdr>(ctx, ETH_HLEN) else {
            return false;
        };
        // SAFETY: bounds checked by `ptr_at`; TC programs may write packet data.
        let ip = unsafe { &mut *ip };
        match end {
            End::Src => copy16(&mut ip.saddr, to),
            End::Dst => copy16(&mut ip.daddr, to),
        }
        true
    }
}

/// Rewrites the 16-bit field at `field` bytes into the transport header from `old` to
/// `new` (host byte order), patching the transport checksum (by the helper, which knows
/// the skb's checksum state) and writing the field in place.
#[inline(always)]
pub fn set_l4_u16(ctx: &TcContext, v4: bool, proto: u8, field: usize, old: u16, new: u16) -> bool {
    set_l4_u16_at(ctx, v4, 0, proto, field, old, new)
}

/// [`set_l4_u16`] for a packet whose transport header starts `extra` bytes past the fixed
/// IP header (a constant, as for [`set_addr_at`]).
#[inline(always)]
pub fn set_l4_u16_at(
    ctx: &TcContext,
    v4: bool,
    extra: usize,
    proto: u8,
    field: usize,
    old: u16,
    new: u16,
) -> bool {
    if old == new {
        return true;
    }
    let (from, to) = (old.to_be_bytes(), new.to_be_bytes());
    let sum = l4_sum(v4, proto);
    let l4 = l4_off(v4) + extra;
    if sum.present
        && ctx
            .l4_csum_replace(
                l4 + sum.off,
                u64::from(u16::from_ne_bytes(from)),
                u64::from(u16::from_ne_bytes(to)),
                sum.flags | 2,
            )
            .is_err()
    {
        return false;
    }
    // The fields rewritten lie in the first 8 bytes of every transport header here.
    let Some(h) = ptr_at::<[u8; 8]>(ctx, l4) else {
        return false;
    };
    // SAFETY: bounds checked by `ptr_at`; TC programs may write packet data.
    let h = unsafe { &mut *h };
    match field {
        SPORT => h[0..2].copy_from_slice(&to),
        DPORT => h[2..4].copy_from_slice(&to),
        ECHO_ID => h[4..6].copy_from_slice(&to),
        _ => return false,
    }
    true
}

/// Rewrites the packet an ICMP error quotes (see [`quote_off`]): its `end` address
/// from `from` to `to`, and the 16-bit transport field at `field` (a port, an echo's
/// identifier) from `old` to `new`. The IPv4 quote's header checksum is patched with its
/// address (which leaves the ICMP checksum's sum over it unchanged); otherwise the ICMP
/// checksum follows every byte changed. The quoted transport checksum is left as it is
/// (stacks do not verify a quote's).
#[inline(always)]
#[allow(
    clippy::too_many_arguments,
    reason = "one rewrite's inputs, inlined at each call: a struct of them would only rename them"
)]
pub fn set_quote(
    ctx: &TcContext,
    v4: bool,
    end: End,
    from: &mut [u8; 16],
    to: &mut [u8; 16],
    field: usize,
    old: u16,
    new: u16,
) -> bool {
    let inner = quote_off(v4);
    let icmp_check = l4_off(v4) + 2;
    if v4 {
        let at = inner
            + match end {
                End::Src => 12,
                End::Dst => 16,
            };
        let old_addr = u32::from_ne_bytes([from[12], from[13], from[14], from[15]]);
        let new_bytes = [to[12], to[13], to[14], to[15]];
        let new_addr = u32::from_ne_bytes(new_bytes);
        if ctx
            .l3_csum_replace(inner + 10, u64::from(old_addr), u64::from(new_addr), 4)
            .is_err()
            || ctx.store(at, &new_bytes, 0).is_err()
        {
            return false;
        }
    } else {
        let at = inner
            + match end {
                End::Src => 8,
                End::Dst => 24,
            };
        if ctx
            .l4_csum_replace(icmp_check, 0, u64::from(diff16(from, to)), 0)
            .is_err()
            || ctx.store(at, to, 0).is_err()
        {
            return false;
        }
    }
    let (from, to) = (old.to_be_bytes(), new.to_be_bytes());
    ctx.l4_csum_replace(
        icmp_check,
        u64::from(u16::from_ne_bytes(from)),
        u64::from(u16::from_ne_bytes(to)),
        2,
    )
    .is_ok()
        && ctx.store(quote_l4_off(v4) + field, &to, 0).is_ok()
}

/// Offset of the source and destination ports in a TCP, UDP or SCTP header.
pub const SPORT: usize = 0;
pub const DPORT: usize = 2;
/// Offset of the checksum in a TCP header.
pub const TCP_CHECK: usize = 16;
/// Offset of an ICMP echo's identifier.
pub const ECHO_ID: usize = 4;
