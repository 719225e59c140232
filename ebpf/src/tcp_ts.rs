//! The TCP timestamp option (RFC 7323): where a segment carries it, and moving its value or
//! its echoed value by a constant, with the checksum patched. Masquerade shifts the clock of
//! a flow that reuses a port towards the same remote end (`ebpf_cni_maps::MASQ_TS_LAST`).

use aya_ebpf::programs::TcContext;

use crate::rewrite;

const TCPOPT_EOL: u8 = 0;
const TCPOPT_NOP: u8 = 1;
const TCPOPT_TIMESTAMP: u8 = 8;
const TCPOLEN_TIMESTAMP: u8 = 10;
/// Options a scan steps over at most (40 bytes of options hold at most 20 NOPs, but the
/// stacks that send timestamps put them within the first four options).
const SCAN: u32 = 8;

/// The packet offset of the timestamp value in a TCP segment whose header starts at
/// `rewrite::l4_off(v4)`, or 0 when it carries none. The echoed value follows it.
#[inline(never)]
pub fn value_at(ctx: &TcContext, v4: bool) -> u32 {
    let l4 = rewrite::l4_off(v4);
    let Ok(doff) = ctx.load::<u8>(l4 + 12) else {
        return 0;
    };
    let end = l4 + usize::from(doff >> 4) * 4;
    let mut off = l4 + 20;
    // What Linux sends on every segment but the SYN: NOP, NOP, timestamp.
    if let Ok(w) = ctx.load::<[u8; 4]>(off) {
        if w == [TCPOPT_NOP, TCPOPT_NOP, TCPOPT_TIMESTAMP, TCPOLEN_TIMESTAMP] {
            return if off + 12 <= end { (off + 4) as u32 } else { 0 };
        }
    }
    for _ in 0..SCAN {
        if off + 2 > end {
            return 0;
        }
        let Ok(kl) = ctx.load::<[u8; 2]>(off) else {
            return 0;
        };
        match kl[0] {
            TCPOPT_EOL => return 0,
            TCPOPT_NOP => off += 1,
            TCPOPT_TIMESTAMP => {
                return if kl[1] == TCPOLEN_TIMESTAMP && off + 10 <= end {
                    (off + 2) as u32
                } else {
                    0
                };
            }
            _ => {
                if kl[1] < 2 {
                    return 0;
                }
                off += usize::from(kl[1]);
            }
        }
    }
    0
}

/// The 32-bit value at packet offset `at` (host byte order).
#[inline(always)]
pub fn read(ctx: &TcContext, at: u32) -> Option<u32> {
    ctx.load::<[u8; 4]>(at as usize)
        .ok()
        .map(u32::from_be_bytes)
}

/// Writes `new` over `old` at packet offset `at` of a TCP segment, patching its checksum.
#[inline(always)]
pub fn write(ctx: &TcContext, v4: bool, at: u32, old: u32, new: u32) -> bool {
    if old == new {
        return true;
    }
    let (from, to) = (old.to_be_bytes(), new.to_be_bytes());
    ctx.l4_csum_replace(
        rewrite::l4_off(v4) + rewrite::TCP_CHECK,
        u64::from(u32::from_ne_bytes(from)),
        u64::from(u32::from_ne_bytes(to)),
        4,
    )
    .is_ok()
        && ctx.store(at as usize, &to, 0).is_ok()
}
