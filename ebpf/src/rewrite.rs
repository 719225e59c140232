//! Rewriting an address or a 16-bit transport field (a port, an ICMP echo identifier) in
//! place, with the IPv4 header checksum and the transport checksum patched incrementally.
//! Host ports (`nat`) and masquerade (`masq`) both translate with these.

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    helpers::bpf_csum_diff,
    programs::TcContext,
};
use ebpf_cni_maps::{IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP};

use crate::packet::ETH_HLEN;

const IPV4_L4_OFF: usize = ETH_HLEN + 20;
const IPV6_L4_OFF: usize = ETH_HLEN + 40;
/// Offsets of the addresses and the IPv4 checksum from the start of the IP header.
const IPV4_SRC: usize = 12;
const IPV4_DST: usize = 16;
const IPV4_CHECK: usize = 10;
const IPV6_SRC: usize = 8;
const IPV6_DST: usize = 24;

/// Where the transport header starts (constant per family, which the verifier needs):
/// only headers without IPv4 options or IPv6 extension headers are translated.
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

/// Rewrites the `end` address from `from` to `to` (IPv4 mapped into IPv6 for IPv4 packets),
/// patching the IPv4 header checksum and the transport checksum's pseudo header.
#[inline(always)]
pub fn set_addr(
    ctx: &TcContext,
    v4: bool,
    proto: u8,
    end: End,
    from: &mut [u8; 16],
    to: &mut [u8; 16],
) -> bool {
    let sum = l4_sum(v4, proto);
    let covered = sum.present && sum.pseudo;
    if v4 {
        let off = ETH_HLEN
            + match end {
                End::Src => IPV4_SRC,
                End::Dst => IPV4_DST,
            };
        let old = u32::from_ne_bytes([from[12], from[13], from[14], from[15]]);
        let new_bytes = [to[12], to[13], to[14], to[15]];
        let new = u32::from_ne_bytes(new_bytes);
        if ctx
            .l3_csum_replace(ETH_HLEN + IPV4_CHECK, u64::from(old), u64::from(new), 4)
            .is_err()
        {
            return false;
        }
        if covered {
            if ctx
                .l4_csum_replace(
                    IPV4_L4_OFF + sum.off,
                    u64::from(old),
                    u64::from(new),
                    sum.flags | u64::from(BPF_F_PSEUDO_HDR) | 4,
                )
                .is_err()
            {
                return false;
            }
        }
        ctx.store(off, &new_bytes, 0).is_ok()
    } else {
        let off = ETH_HLEN
            + match end {
                End::Src => IPV6_SRC,
                End::Dst => IPV6_DST,
            };
        if covered {
            // SAFETY: both buffers are 16 bytes the caller owns.
            let diff = unsafe {
                bpf_csum_diff(from.as_mut_ptr().cast(), 16, to.as_mut_ptr().cast(), 16, 0)
            };
            if diff < 0
                || ctx
                    .l4_csum_replace(
                        IPV6_L4_OFF + sum.off,
                        0,
                        diff as u64,
                        sum.flags | u64::from(BPF_F_PSEUDO_HDR),
                    )
                    .is_err()
            {
                return false;
            }
        }
        ctx.store(off, to, 0).is_ok()
    }
}

/// Rewrites the 16-bit field at `field` bytes into the transport header from `old` to
/// `new` (host byte order), patching the transport checksum.
#[inline(always)]
pub fn set_l4_u16(ctx: &TcContext, v4: bool, proto: u8, field: usize, old: u16, new: u16) -> bool {
    if old == new {
        return true;
    }
    let (from, to) = (old.to_be_bytes(), new.to_be_bytes());
    let sum = l4_sum(v4, proto);
    if sum.present {
        if ctx
            .l4_csum_replace(
                l4_off(v4) + sum.off,
                u64::from(u16::from_ne_bytes(from)),
                u64::from(u16::from_ne_bytes(to)),
                sum.flags | 2,
            )
            .is_err()
        {
            return false;
        }
    }
    ctx.store(l4_off(v4) + field, &to, 0).is_ok()
}

/// Offset of the source and destination ports in a TCP, UDP or SCTP header.
pub const SPORT: usize = 0;
pub const DPORT: usize = 2;
/// Offset of the checksum in a TCP header.
pub const TCP_CHECK: usize = 16;
/// Offset of an ICMP echo's identifier.
pub const ECHO_ID: usize = 4;
