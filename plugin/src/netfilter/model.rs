//! The model both readers fill: tables of chains of rules, each rule reduced to what
//! `services` and `firewall` read of it.

use ipnetwork::IpNetwork;

/// Which backend a table lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The legacy x_tables (iptables-legacy).
    Legacy,
    /// nf_tables (iptables-nft, nft).
    Nftables,
}

/// A table's address family (the kernel's `NFPROTO_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Ipv4,
    Ipv6,
    /// nf_tables' `inet`: both.
    Inet,
    /// `arp`, `bridge`, `netdev`: nothing here reads them.
    Other(u8),
}

impl Family {
    /// From `NFPROTO_IPV4` (2), `NFPROTO_IPV6` (10), `NFPROTO_INET` (1)…
    pub fn from_nfproto(p: u8) -> Self {
        match p {
            2 => Self::Ipv4,
            10 => Self::Ipv6,
            1 => Self::Inet,
            other => Self::Other(other),
        }
    }

    /// As `nft` names it: `ip`, `ip6`, `inet`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ipv4 => "ip",
            Self::Ipv6 => "ip6",
            Self::Inet => "inet",
            Self::Other(_) => "other",
        }
    }
}

/// The netfilter hook a base chain is attached to (`NF_INET_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    PreRouting,
    Input,
    Forward,
    Output,
    PostRouting,
    Other(u32),
}

impl Hook {
    pub fn from_num(n: u32) -> Self {
        match n {
            0 => Self::PreRouting,
            1 => Self::Input,
            2 => Self::Forward,
            3 => Self::Output,
            4 => Self::PostRouting,
            other => Self::Other(other),
        }
    }
}

/// What a rule does with a packet it matches, as far as the readers need.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Verdict {
    /// No verdict: the rule only counts, marks, logs…
    #[default]
    Continue,
    Accept,
    Drop,
    /// `-j REJECT` (x_tables' target) or nft's `reject`.
    Reject,
    Return,
    Jump(String),
    Goto(String),
    /// A verdict this model does not name (queue, a target other than REJECT…).
    Other,
}

/// One rule.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rule {
    /// The source it matches (`-s A/N`, `ip saddr A/N`); `None` as for `daddr`.
    pub saddr: Option<IpNetwork>,
    /// The destination it matches (`-d A/N`, `ip daddr A/N`); `None` for a rule without
    /// one or with a negated one (`! -d`, `!=`).
    pub daddr: Option<IpNetwork>,
    pub verdict: Verdict,
    /// The mark bits it sets (`-j MARK --or-mark`/`--set-xmark V/M`: V; nft's `meta mark
    /// set mark or V`: V).
    pub sets_mark: Option<u32>,
}

/// One chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub name: String,
    /// A base chain's hook; `None` for a chain only jumped to.
    pub hook: Option<Hook>,
    /// A base chain's policy is drop.
    pub policy_drop: bool,
    pub rules: Vec<Rule>,
}

/// A named set or map of an nf_tables table, by its elements' keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    pub name: String,
    /// Each element's key, as the kernel holds it (a concatenation's fields each padded
    /// to 4 bytes; an interval's end elements left out).
    pub keys: Vec<Vec<u8>>,
}

/// One table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub backend: Backend,
    pub family: Family,
    pub name: String,
    pub chains: Vec<Chain>,
    /// Its sets and maps (nf_tables only), read only where asked for.
    pub sets: Vec<Set>,
}

impl Table {
    pub fn chain(&self, name: &str) -> Option<&Chain> {
        self.chains.iter().find(|c| c.name == name)
    }

    pub fn set(&self, name: &str) -> Option<&Set> {
        self.sets.iter().find(|s| s.name == name)
    }
}

/// The prefix of a netmask held in network order, when it is one (leading ones only).
pub fn mask_prefix(mask: &[u8]) -> Option<u8> {
    let ones: u32 = mask.iter().map(|b| b.count_ones()).sum();
    let mut seen_zero = false;
    for b in mask {
        for bit in (0..8).rev() {
            let one = b & (1 << bit) != 0;
            if one && seen_zero {
                return None;
            }
            seen_zero |= !one;
        }
    }
    u8::try_from(ones).ok()
}

/// `addr` (4 or 16 bytes, network order, zero-padded when shorter) as a network of
/// `prefix` bits; `None` for another length or a prefix too long.
pub fn network(addr: &[u8], prefix: u8) -> Option<IpNetwork> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let ip = match addr.len() {
        4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(addr).ok()?)),
        16 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(addr).ok()?)),
        _ => return None,
    };
    IpNetwork::new(ip, prefix).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netmasks_give_their_prefix() {
        assert_eq!(mask_prefix(&[255, 240, 0, 0]), Some(12));
        assert_eq!(mask_prefix(&[255; 4]), Some(32));
        assert_eq!(mask_prefix(&[0; 16]), Some(0));
        assert_eq!(mask_prefix(&[255, 0, 255, 0]), None);
        assert_eq!(network(&[10, 96, 0, 0], 12), "10.96.0.0/12".parse().ok());
        assert_eq!(network(&[10, 96, 0], 12), None);
    }
}
