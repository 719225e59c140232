//! An attachment's placement record: where ADD put the pod's entries in the node maps,
//! kept as the name of an empty directory in the attachment's directory (bpffs holds
//! directories and pins, no files): `placed-<host ifindex>-<netns cookie>-<sources>-<addr>…`.
//!
//! DEL removes the entries by key from it. Without it, DEL finds them by the attachment id
//! they carry, walking the endpoint, pacing and source maps: each walk is one system call
//! per entry of every pod of the node, and one scan of the map's buckets. A pod attached
//! by a release before the record has none, and DEL walks as it did.
//!
//! The record knows nothing of a pod's description: the placement ADD makes of one is
//! `PodSpec::placement`'s (capability/spec.rs), so the capabilities that read the record
//! depend on this module and it on none of them.

use std::{
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use ebpf_cni_maps::pin::PLACEMENT_RECORD_PREFIX;

use super::{
    pin::{create_dir_all_racy, walk, AttachmentPins},
    BpfError,
};

/// What the source map holds of the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlacedSources {
    /// Nothing: the check is off.
    Off,
    /// Its own addresses and its catch-all, no other prefix: found by key.
    Own,
    /// Other prefixes too (`allowedSourcePrefixes`): DEL walks the map for them.
    Extra,
}

impl PlacedSources {
    fn code(self) -> char {
        match self {
            Self::Off => 'n',
            Self::Own => 'o',
            Self::Extra => 'x',
        }
    }

    fn from_code(s: &str) -> Option<Self> {
        match s {
            "n" => Some(Self::Off),
            "o" => Some(Self::Own),
            "x" => Some(Self::Extra),
            _ => None,
        }
    }
}

/// Where one pod's entries are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub host_ifindex: u32,
    /// The key of its pacing entry: its namespace's cookie; 0 when it is not paced.
    pub netns_cookie: u64,
    pub sources: PlacedSources,
    /// Its addresses: the keys of its endpoint entries.
    pub ips: Vec<IpAddr>,
}

impl Placement {
    /// The record's directory name (bpffs names may hold no dot: addresses in hex).
    pub fn record_name(&self) -> String {
        let mut name = format!(
            "{PLACEMENT_RECORD_PREFIX}{}-{:x}-{}",
            self.host_ifindex,
            self.netns_cookie,
            self.sources.code()
        );
        for ip in &self.ips {
            match ip {
                IpAddr::V4(a) => name.push_str(&format!("-{:08x}", u32::from(*a))),
                IpAddr::V6(a) => name.push_str(&format!("-{:032x}", u128::from(*a))),
            }
        }
        name
    }

    /// The placement a record's name says; `None` for any other name.
    pub fn parse(name: &str) -> Option<Self> {
        let mut parts = name.strip_prefix(PLACEMENT_RECORD_PREFIX)?.split('-');
        let host_ifindex = parts.next()?.parse().ok()?;
        let netns_cookie = u64::from_str_radix(parts.next()?, 16).ok()?;
        let sources = PlacedSources::from_code(parts.next()?)?;
        let ips = parts
            .map(|p| match p.len() {
                8 => u32::from_str_radix(p, 16)
                    .ok()
                    .map(|a| IpAddr::V4(Ipv4Addr::from(a))),
                32 => u128::from_str_radix(p, 16)
                    .ok()
                    .map(|a| IpAddr::V6(Ipv6Addr::from(a))),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self {
            host_ifindex,
            netns_cookie,
            sources,
            ips,
        })
    }

    /// Writes the record, before the entries it names.
    pub fn record(&self, pins: &AttachmentPins) -> Result<(), BpfError> {
        create_dir_all_racy(&pins.dir().join(self.record_name()))
    }

    /// The record of the attachment, if it has one (one read of its directory).
    pub fn recorded(pins: &AttachmentPins) -> Option<Self> {
        fs::read_dir(walk(pins.dir()))
            .ok()?
            .filter_map(Result::ok)
            .find_map(|e| Self::parse(e.file_name().to_str()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_name_reads_back_as_the_placement_it_names() {
        let p = Placement {
            host_ifindex: 4_000_000_123,
            netns_cookie: 0xdead_beef_0042,
            sources: PlacedSources::Own,
            ips: vec!["10.88.0.5".parse().unwrap(), "fd00:88::5".parse().unwrap()],
        };
        let name = p.record_name();
        assert!(!name.contains('.') && name.len() < 255, "{name}");
        assert_eq!(Placement::parse(&name), Some(p));
        for sources in [PlacedSources::Off, PlacedSources::Extra] {
            let q = Placement {
                host_ifindex: 7,
                netns_cookie: 0,
                sources,
                ips: Vec::new(),
            };
            assert_eq!(Placement::parse(&q.record_name()), Some(q));
        }
    }

    #[test]
    fn other_names_are_no_record() {
        for name in [
            "source_check",
            "placed-",
            "placed-7-0",
            "placed-7-0-q",
            "placed-x-0-o",
            "placed-7-0-o-0a58",
            "placed-7-0-o-zz580005",
        ] {
            assert_eq!(Placement::parse(name), None, "{name}");
        }
    }
}
