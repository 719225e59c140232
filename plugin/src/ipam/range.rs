//! Address ranges and range sets, and the round-robin walk over a set.
//!
//! A range is a slice `[range_start, range_end]` of one subnet; a range set is a list of
//! ranges of one family from which an attachment gets exactly one address. The walk
//! reproduces the reference host-local iterator (start after the last reserved address,
//! wrap from one range to the next and from the last back to the first, stop after one
//! full turn, never return a gateway) so that our plugin and the reference, sharing one
//! data directory, continue each other's round robin.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;

/// One canonical range: every field filled in and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    pub subnet: IpNetwork,
    pub range_start: IpAddr,
    pub range_end: IpAddr,
    pub gateway: IpAddr,
}

impl Range {
    /// Whether `ip` is an address this range may hand out (gateway included; the walk
    /// skips it).
    pub fn contains(&self, ip: IpAddr) -> bool {
        same_family(ip, self.range_start)
            && self.subnet.contains(ip)
            && to_u128(ip) >= to_u128(self.range_start)
            && to_u128(ip) <= to_u128(self.range_end)
    }

    pub fn overlaps(&self, other: &Range) -> bool {
        same_family(self.range_start, other.range_start)
            && to_u128(self.range_start) <= to_u128(other.range_end)
            && to_u128(other.range_start) <= to_u128(self.range_end)
    }

    /// The allocated address with the subnet's prefix length.
    pub fn address(&self, ip: IpAddr) -> IpNetwork {
        IpNetwork::new(ip, self.subnet.prefix())
            .expect("prefix taken from a valid subnet of the same family")
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.range_start, self.range_end)
    }
}

/// The ranges one address per attachment is taken from. `source` names where the set
/// came from in the config (`ipam.ranges[1]`, `runtimeConfig.ipRanges[0]`, `ipam`), for
/// messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSet {
    pub ranges: Vec<Range>,
    pub source: String,
}

impl RangeSet {
    pub fn range_for(&self, ip: IpAddr) -> Option<&Range> {
        self.ranges.iter().find(|r| r.contains(ip))
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.range_for(ip).is_some()
    }

    pub fn is_ipv6(&self) -> bool {
        self.ranges[0].range_start.is_ipv6()
    }

    pub fn is_gateway(&self, ip: IpAddr) -> bool {
        self.ranges.iter().any(|r| r.gateway == ip)
    }

    /// Walks the set once, starting right after `last_reserved` when it lies in the set
    /// (else at the first range's start), skipping every gateway of the set.
    pub fn iter_from(&self, last_reserved: Option<IpAddr>) -> RangeIter<'_> {
        let cur = last_reserved.and_then(|ip| {
            self.ranges
                .iter()
                .position(|r| r.contains(ip))
                .map(|idx| (idx, to_u128(ip)))
        });
        RangeIter {
            set: self,
            cur,
            start: None,
        }
    }
}

impl fmt::Display for RangeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// See [`RangeSet::iter_from`].
pub struct RangeIter<'a> {
    set: &'a RangeSet,
    /// Range index and address last returned (or the last reserved address to continue
    /// after); `None` before the first step of a walk from the beginning.
    cur: Option<(usize, u128)>,
    /// The first address visited; reaching it again ends the walk.
    start: Option<u128>,
}

impl<'a> Iterator for RangeIter<'a> {
    /// The candidate address and the range it belongs to.
    type Item = (IpAddr, &'a Range);

    fn next(&mut self) -> Option<Self::Item> {
        let ranges: &'a [Range] = &self.set.ranges;
        let v6 = self.set.is_ipv6();
        loop {
            let (idx, cur) = match self.cur {
                None => {
                    let first = to_u128(ranges[0].range_start);
                    self.start = Some(first);
                    (0, first)
                }
                Some((idx, cur)) => {
                    let next = if cur == to_u128(ranges[idx].range_end) {
                        let idx = (idx + 1) % ranges.len();
                        (idx, to_u128(ranges[idx].range_start))
                    } else {
                        (idx, cur + 1)
                    };
                    match self.start {
                        None => self.start = Some(next.1),
                        Some(start) if start == next.1 => return None,
                        Some(_) => {}
                    }
                    next
                }
            };
            self.cur = Some((idx, cur));
            let ip = from_u128(cur, v6);
            if !self.set.is_gateway(ip) {
                return Some((ip, &ranges[idx]));
            }
        }
    }
}

pub(crate) fn same_family(a: IpAddr, b: IpAddr) -> bool {
    a.is_ipv4() == b.is_ipv4()
}

pub(crate) fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

pub(crate) fn from_u128(v: u128, v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::from(v))
    } else {
        IpAddr::V4(Ipv4Addr::from(
            u32::try_from(v).expect("IPv4 arithmetic stays inside its range"),
        ))
    }
}

/// Plain IPv4 for IPv4-mapped IPv6 addresses (`::ffff:10.0.0.5`), as the reference
/// treats them; everything else unchanged.
pub(crate) fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn range(subnet: &str, start: &str, end: &str, gw: &str) -> Range {
        Range {
            subnet: subnet.parse().unwrap(),
            range_start: ip(start),
            range_end: ip(end),
            gateway: ip(gw),
        }
    }

    fn set(ranges: Vec<Range>) -> RangeSet {
        RangeSet {
            ranges,
            source: "test".into(),
        }
    }

    fn walk(s: &RangeSet, last: Option<&str>) -> Vec<String> {
        s.iter_from(last.map(ip))
            .map(|(a, _)| a.to_string())
            .collect()
    }

    #[test]
    fn walk_from_start_skips_gateway() {
        let s = set(vec![range(
            "10.0.0.0/29",
            "10.0.0.1",
            "10.0.0.6",
            "10.0.0.1",
        )]);
        assert_eq!(
            walk(&s, None),
            ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"]
        );
    }

    #[test]
    fn walk_continues_after_last_and_wraps() {
        let s = set(vec![range(
            "10.0.0.0/29",
            "10.0.0.1",
            "10.0.0.6",
            "10.0.0.1",
        )]);
        assert_eq!(
            walk(&s, Some("10.0.0.4")),
            ["10.0.0.5", "10.0.0.6", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
        );
        assert_eq!(
            walk(&s, Some("10.0.0.6")),
            ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"]
        );
        // A last address outside the set (the ranges changed) restarts at the beginning.
        assert_eq!(walk(&s, Some("10.9.9.9")), walk(&s, None));
    }

    #[test]
    fn walk_crosses_ranges() {
        let s = set(vec![
            range("10.0.0.0/24", "10.0.0.10", "10.0.0.11", "10.0.0.1"),
            range("10.0.1.0/24", "10.0.1.1", "10.0.1.3", "10.0.1.1"),
        ]);
        assert_eq!(
            walk(&s, None),
            ["10.0.0.10", "10.0.0.11", "10.0.1.2", "10.0.1.3"]
        );
        assert_eq!(
            walk(&s, Some("10.0.1.2")),
            ["10.0.1.3", "10.0.0.10", "10.0.0.11", "10.0.1.2"]
        );
    }

    #[test]
    fn walk_ipv6_includes_last_address() {
        let s = set(vec![range("fd00::/126", "fd00::1", "fd00::3", "fd00::1")]);
        assert_eq!(walk(&s, None), ["fd00::2", "fd00::3"]);
    }

    #[test]
    fn walk_of_only_the_gateway_is_empty() {
        let s = set(vec![range(
            "10.0.0.0/24",
            "10.0.0.1",
            "10.0.0.1",
            "10.0.0.1",
        )]);
        assert!(walk(&s, None).is_empty());
        assert!(walk(&s, Some("10.0.0.1")).is_empty());
    }

    #[test]
    fn contains_and_overlaps() {
        let a = range("10.0.0.0/24", "10.0.0.10", "10.0.0.20", "10.0.0.1");
        let b = range("10.0.0.0/24", "10.0.0.20", "10.0.0.30", "10.0.0.1");
        let c = range("10.0.0.0/24", "10.0.0.21", "10.0.0.30", "10.0.0.1");
        let v6 = range("fd00::/64", "fd00::1", "fd00::ff", "fd00::1");
        assert!(a.contains(ip("10.0.0.10")) && a.contains(ip("10.0.0.20")));
        assert!(!a.contains(ip("10.0.0.9")) && !a.contains(ip("10.0.0.21")));
        assert!(!v6.contains(ip("0.0.0.5")));
        assert!(a.overlaps(&b) && b.overlaps(&a));
        assert!(!a.overlaps(&c) && !c.overlaps(&a));
        assert!(!a.overlaps(&v6));
    }

    #[test]
    fn mapped_addresses_become_ipv4() {
        assert_eq!(canonical_ip(ip("::ffff:10.0.0.5")), ip("10.0.0.5"));
        assert_eq!(canonical_ip(ip("fd00::5")), ip("fd00::5"));
    }
}
