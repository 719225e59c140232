//! kube-proxy's masquerade kept off ebpf-cni's masquerade ports.
//!
//! kube-proxy masquerades what it marks (`KUBE-MARK-MASQ`, `mark-for-masquerade`) with
//! `MASQUERADE --random-fully` (`masquerade fully-random` in nftables mode): the kernel picks
//! the source port from the whole range, 1024–65535, and knows nothing of the flows ebpf-cni's
//! programs masquerade from the same node address. A flow of each with the same remote
//! address and port and the same node port would share one reply tuple, and the programs
//! would take the replies of kube-proxy's. So where a node masquerades and kube-proxy's mark
//! is known, ebpf-cni holds one nf_tables table, `inet ebpf-cni`, with one nat chain on
//! postrouting just before kube-proxy's (priority `srcnat - 1`), and in it one rule that does
//! what kube-proxy's `KUBE-POSTROUTING` does, within the ports outside ebpf-cni's range:
//!
//! ```text
//! meta mark & 0x4000 == 0x4000 meta mark set meta mark & 0xffffbfff
//!     masquerade to :1024-60999 fully-random
//! ```
//!
//! The kernel binds a flow's source NAT once, at the first nat chain that sets it, so
//! kube-proxy's own rule is not reached for those flows; iptables-legacy's nat table, the
//! iptables-nft one and kube-proxy's nftables table all sit at that hook behind this chain.
//! The rule's user data records the mark and the ports, which is what [`current`] reads.

use std::io;

use super::nftables::{attr, attr_str, be, expr, in_kernel, nest, text, value, Socket, SUBSYS};

/// The table and chain ebpf-cni owns.
pub const TABLE: &str = "ebpf-cni";
pub const CHAIN: &str = "kube-proxy-masquerade";

const NEWTABLE: u16 = SUBSYS;
const DELTABLE: u16 = SUBSYS | 2;
const NEWCHAIN: u16 = SUBSYS | 3;
const NEWRULE: u16 = SUBSYS | 6;
const DELRULE: u16 = SUBSYS | 8;
/// `NFPROTO_INET`: one table for both families.
const INET: u8 = 1;
/// `NF_INET_POST_ROUTING`.
const POSTROUTING: u32 = 4;
/// `NF_IP_PRI_NAT_SRC - 1`: before kube-proxy's chains and iptables' nat table.
const PRIORITY: i32 = 99;
/// `NF_NAT_RANGE_PROTO_SPECIFIED | NF_NAT_RANGE_PROTO_RANDOM_FULLY`.
const MASQ_FLAGS: u32 = 0x02 | 0x10;
/// The registers: `NFT_REG_1` for the mark, `NFT_REG_2`/`NFT_REG_3` for the ports.
const REG_MARK: u32 = 1;
const REG_MIN: u32 = 2;
const REG_MAX: u32 = 3;

/// What the rule does: masquerade packets carrying `mark` from `ports`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guard {
    pub mark: u32,
    pub ports: (u16, u16),
}

impl Guard {
    /// The guard for kube-proxy's `mark` next to ebpf-cni's masquerade range `ours`: the
    /// larger of the ranges above 1023 on either side of it (`None`: nothing is left).
    pub fn beside(mark: u32, ours: (u16, u16)) -> Option<Self> {
        let below = (ours.0 > 1024).then(|| (1024, ours.0 - 1));
        let above = (ours.1 < u16::MAX).then(|| (ours.1.max(1023) + 1, u16::MAX));
        let size = |r: &Option<(u16, u16)>| r.map_or(0, |(a, b)| u32::from(b) - u32::from(a) + 1);
        let ports = if size(&below) >= size(&above) {
            below
        } else {
            above
        };
        (mark != 0).then_some(())?;
        ports.map(|ports| Self { mark, ports })
    }

    /// The rule's user data: what [`current`] reads back.
    fn userdata(&self) -> String {
        format!(
            "ebpf-cni mark={:#x} ports={}-{}",
            self.mark, self.ports.0, self.ports.1
        )
    }

    fn from_userdata(s: &str) -> Option<Self> {
        let rest = s.strip_prefix("ebpf-cni mark=0x")?;
        let (mark, ports) = rest.split_once(" ports=")?;
        let (lo, hi) = ports.split_once('-')?;
        Some(Self {
            mark: u32::from_str_radix(mark, 16).ok()?,
            ports: (lo.parse().ok()?, hi.parse().ok()?),
        })
    }

    /// The rule's expressions (see the module's comment).
    fn expressions(&self) -> Vec<u8> {
        let meta_load = || expr("meta", &[attr(2, &be(3)), attr(1, &be(REG_MARK))]);
        let bitwise = |mask: u32| {
            expr(
                "bitwise",
                &[
                    attr(1, &be(REG_MARK)),
                    attr(2, &be(REG_MARK)),
                    attr(3, &be(4)),
                    value(4, &mask.to_ne_bytes()),
                    value(5, &0u32.to_ne_bytes()),
                ],
            )
        };
        let port = |reg: u32, p: u16| {
            expr(
                "immediate",
                &[attr(1, &be(reg)), value(2, &p.to_be_bytes())],
            )
        };
        [
            meta_load(),
            bitwise(self.mark),
            // NFT_CMP_EQ against the mark's bits.
            expr(
                "cmp",
                &[
                    attr(1, &be(REG_MARK)),
                    attr(2, &be(0)),
                    value(3, &self.mark.to_ne_bytes()),
                ],
            ),
            // The bit cleared, as kube-proxy clears it: the packet leaves unmarked.
            meta_load(),
            bitwise(!self.mark),
            expr("meta", &[attr(2, &be(3)), attr(3, &be(REG_MARK))]),
            port(REG_MIN, self.ports.0),
            port(REG_MAX, self.ports.1),
            expr(
                "masq",
                &[
                    attr(1, &be(MASQ_FLAGS)),
                    attr(2, &be(REG_MIN)),
                    attr(3, &be(REG_MAX)),
                ],
            ),
        ]
        .concat()
    }
}

/// The guard the node holds now (`None`: no table of ebpf-cni's, or a rule it did not
/// write). A kernel without nf_tables loaded holds none, and is not made to load it.
pub fn current() -> io::Result<Option<Guard>> {
    if !in_kernel() {
        return Ok(None);
    }
    let sock = Socket::open()?;
    let req = [attr_str(1, TABLE), attr_str(2, CHAIN)];
    let msgs = match sock.dump(super::nftables::GETRULE, INET, &req) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        other => other?,
    };
    let guards: Vec<Option<Guard>> = msgs
        .iter()
        .map(|m| {
            m.attrs()
                // NFTA_RULE_USERDATA.
                .find_map(|(t, v)| (t == 7).then(|| Guard::from_userdata(&text(v))))
                .flatten()
        })
        .collect();
    Ok(match guards.as_slice() {
        [one] => *one,
        _ => None,
    })
}

/// Makes the node's table hold `guard` and nothing else, in one transaction.
pub fn set(guard: &Guard) -> io::Result<()> {
    let sock = Socket::open()?;
    let create = libc::NLM_F_CREATE as u16;
    let hook = nest(
        4,
        &[attr(1, &be(POSTROUTING)), attr(2, &be(PRIORITY as u32))],
    );
    let rule = [
        attr_str(1, TABLE),
        attr_str(2, CHAIN),
        nest(4, &[guard.expressions()]),
        attr(7, guard.userdata().as_bytes()),
    ];
    sock.batch(&[
        (NEWTABLE, create, INET, vec![attr_str(1, TABLE)]),
        (
            NEWCHAIN,
            create,
            INET,
            vec![
                attr_str(1, TABLE),
                attr_str(3, CHAIN),
                hook,
                attr_str(7, "nat"),
            ],
        ),
        // No handle: every rule of the chain (one written before, with other figures).
        (
            DELRULE,
            0,
            INET,
            vec![attr_str(1, TABLE), attr_str(2, CHAIN)],
        ),
        (
            NEWRULE,
            create | libc::NLM_F_APPEND as u16,
            INET,
            rule.to_vec(),
        ),
    ])
}

/// Takes the node's table away; true if it was there.
pub fn remove() -> io::Result<bool> {
    if !in_kernel() {
        return Ok(false);
    }
    let sock = Socket::open()?;
    match sock.batch(&[(DELTABLE, 0, INET, vec![attr_str(1, TABLE)])]) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ports_left_are_the_larger_side_of_ours() {
        let g = |ours| Guard::beside(0x4000, ours).map(|g| g.ports);
        assert_eq!(g((61000, 65535)), Some((1024, 60999)));
        assert_eq!(g((1024, 2047)), Some((2048, 65535)));
        assert_eq!(g((1, 5000)), Some((5001, 65535)));
        assert_eq!(g((30000, 40000)), Some((1024, 29999)));
        assert_eq!(g((20000, 60000)), Some((1024, 19999)));
        assert_eq!(g((5000, 60000)), Some((60001, 65535)));
        assert_eq!(g((1, 65535)), None);
        assert_eq!(g((1000, 65535)), None);
        assert_eq!(Guard::beside(0, (61000, 65535)), None, "no mark, no guard");
    }

    #[test]
    fn the_user_data_reads_back() {
        let g = Guard {
            mark: 0x4000,
            ports: (1024, 60999),
        };
        assert_eq!(g.userdata(), "ebpf-cni mark=0x4000 ports=1024-60999");
        assert_eq!(Guard::from_userdata(&g.userdata()), Some(g));
        assert_eq!(Guard::from_userdata("something else"), None);
    }
}
