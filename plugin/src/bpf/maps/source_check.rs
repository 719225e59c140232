//! The source map (`ECNI_SOURCES`): what each pod may send from, which its host veth's
//! ingress program checks every frame against (see `ebpf/src/source_check.rs`). A pod's entries
//! are keyed by its host veth's ifindex: one per allowed prefix (its own addresses as /32
//! and /128, then the extra prefixes its config lists), each carrying the pod interface's
//! MAC, and a catch-all of the ifindex alone that refuses every other source. A pod whose
//! check is off has no entries (its lookups then cost nothing on a node of such pods); the
//! attachment's record says which it is ([`SourceRecord`]). ADD installs them, CHECK
//! compares them, DEL and GC remove them by the attachment id they carry.

use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use aya::maps::lpm_trie::Key;
use ebpf_cni_maps::{
    SourceKey, SourceRule, SOURCES_MAP, SOURCE_FAMILY_V4, SOURCE_FAMILY_V6, SOURCE_HEAD_BITS,
    SOURCE_PASS, SOURCE_PASS_MASQ, SOURCE_POD_BITS, SOURCE_REFUSE,
};
use ipnetwork::IpNetwork;

use super::{is_not_found, Maps};
use crate::bpf::BpfError;

/// What the source check of one pod holds: ADD installs it, CHECK compares the kernel with
/// it, and the result and `inspect` report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceCheck {
    /// `sourceCheck: false`: neither the address nor the MAC is checked.
    Off,
    On {
        /// The pod interface's MAC: every frame from the pod must carry it.
        mac: [u8; 6],
        /// The prefixes the pod may send from: its own addresses (/32, /128) and the
        /// extra prefixes, each with its host bits clear, sorted, without duplicates.
        allowed: Vec<IpNetwork>,
        /// The pod's own addresses when it masquerades (`ipMasq`), else none: their
        /// entries say so ([`SOURCE_PASS_MASQ`]), and the programs take masquerade's
        /// decision from the rule they found.
        masq_addrs: Vec<IpAddr>,
    },
}

/// Whether the allowed prefix `net` is one of `addrs` (a /32 or /128 of it), not a wider
/// or other prefix.
pub fn is_one_of(net: &IpNetwork, addrs: &[IpAddr]) -> bool {
    net.prefix() == if net.is_ipv4() { 32 } else { 128 } && addrs.contains(&net.ip())
}

/// The verdict of the entry that lets the pod send from `net`: [`SOURCE_PASS_MASQ`] for an
/// own address of a masquerading pod, else [`SOURCE_PASS`].
fn pass_verdict(net: &IpNetwork, masq_addrs: &[IpAddr]) -> u16 {
    if is_one_of(net, masq_addrs) {
        SOURCE_PASS_MASQ
    } else {
        SOURCE_PASS
    }
}

/// What an attachment's record says ADD did about its source check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceRecord {
    /// Installed the entries.
    On,
    /// The check is off: no entries.
    Off,
    /// No record: a release before the check attached the pod (no entries).
    None,
}

/// One pod's entries as the map holds them, for `inspect`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodSources {
    /// The catch-all's verdict (`SOURCE_REFUSE`); 0 when the pod has none.
    pub verdict: u16,
    pub mac: [u8; 6],
    pub allowed: Vec<IpNetwork>,
}

fn catch_all(ifindex: u32) -> Key<SourceKey> {
    Key::new(
        SOURCE_POD_BITS,
        SourceKey {
            ifindex,
            family: 0,
            addr: [0; 16],
        },
    )
}

fn prefix_key(ifindex: u32, net: &IpNetwork) -> Key<SourceKey> {
    let mut addr = [0u8; 16];
    let family = match net.network() {
        IpAddr::V4(a) => {
            addr[..4].copy_from_slice(&a.octets());
            SOURCE_FAMILY_V4
        }
        IpAddr::V6(a) => {
            addr = a.octets();
            SOURCE_FAMILY_V6
        }
    };
    Key::new(
        SOURCE_HEAD_BITS + u32::from(net.prefix()),
        SourceKey {
            ifindex,
            family,
            addr,
        },
    )
}

/// The prefix an address entry's key stands for; `None` for a catch-all (or a key no
/// release writes).
fn key_prefix(k: &Key<SourceKey>) -> Option<IpNetwork> {
    let d = k.data();
    let bits = k.prefix_len().checked_sub(SOURCE_HEAD_BITS)?;
    let ip = match d.family {
        SOURCE_FAMILY_V4 => IpAddr::V4(Ipv4Addr::new(d.addr[0], d.addr[1], d.addr[2], d.addr[3])),
        SOURCE_FAMILY_V6 => IpAddr::V6(Ipv6Addr::from(d.addr)),
        _ => return None,
    };
    IpNetwork::new(ip, u8::try_from(bits).ok()?).ok()
}

fn update_err(what: String) -> impl FnOnce(aya::maps::MapError) -> BpfError {
    move |source| BpfError::MapUpdate {
        map: SOURCES_MAP,
        what,
        source: Box::new(source),
    }
}

fn describe(p: &PodSources) -> String {
    match p.verdict {
        SOURCE_REFUSE => format!(
            "on (MAC {}; {})",
            crate::netlink::format_mac(&p.mac),
            p.allowed
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        0 if p.allowed.is_empty() => "without entries".to_owned(),
        0 => format!(
            "without a catch-all ({})",
            p.allowed
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        v => format!("a catch-all of unknown verdict {v}"),
    }
}

impl Maps {
    /// Every entry of the map, with its key (one walk).
    fn source_entries(&self) -> Vec<(Key<SourceKey>, SourceRule)> {
        let Some(map) = self.sources.as_ref() else {
            return Vec::new();
        };
        map.keys()
            .filter_map(Result::ok)
            .filter_map(|k| {
                // An exact lookup: every key of a pod is at least as long as its catch-all,
                // and the walk hands out keys that exist.
                map.get(&k, 0).ok().map(|v| (k, v))
            })
            .collect()
    }

    /// Installs the pod's source check for its host veth `ifindex`. Entries another
    /// attachment left on this ifindex (a veth deleted without DEL whose index came back)
    /// go first; that needs a walk of the map, done only when a catch-all is found there.
    pub fn install_sources(
        &mut self,
        attachment_id: u64,
        ifindex: u32,
        check: &SourceCheck,
    ) -> Result<(), BpfError> {
        let Some(map) = self.sources.as_mut() else {
            return Err(BpfError::PinMissing {
                what: "source map (programs of an older revision: reload them)",
                path: SOURCES_MAP.into(),
            });
        };
        if map.get(&catch_all(ifindex), 0).is_ok() {
            self.remove_sources_where(|k, _| k.data().ifindex == ifindex)?;
        }
        let SourceCheck::On {
            mac,
            allowed,
            masq_addrs,
        } = check
        else {
            // Off: no entries, the pod is not checked.
            return Ok(());
        };
        let map = self.sources.as_mut().expect("checked above");
        let rule = |verdict| SourceRule {
            attachment_id,
            mac: *mac,
            verdict,
        };
        // The address entries before the catch-all: until it is there the pod is not
        // checked, so no frame of it meets a half-written list.
        for net in allowed {
            map.insert(
                &prefix_key(ifindex, net),
                rule(pass_verdict(net, masq_addrs)),
                0,
            )
            .map_err(update_err(format!("allow {net} from ifindex {ifindex}")))?;
        }
        map.insert(&catch_all(ifindex), rule(SOURCE_REFUSE), 0)
            .map_err(update_err(format!(
                "insert the catch-all of ifindex {ifindex}"
            )))
    }

    /// Removes the entries `matches` picks; returns how many went.
    fn remove_sources_where(
        &mut self,
        matches: impl Fn(&Key<SourceKey>, &SourceRule) -> bool,
    ) -> Result<usize, BpfError> {
        let gone: Vec<Key<SourceKey>> = self
            .source_entries()
            .into_iter()
            .filter(|(k, v)| matches(k, v))
            .map(|(k, _)| k)
            .collect();
        let Some(map) = self.sources.as_mut() else {
            return Ok(0);
        };
        // The catch-all last: an ifindex with entries left (a removal that failed half-way)
        // keeps its catch-all, by which the next ADD on that ifindex finds and removes them.
        let (all, addrs): (Vec<_>, Vec<_>) =
            gone.iter().partition(|k| k.prefix_len() == SOURCE_POD_BITS);
        for k in addrs.into_iter().chain(all) {
            match map.remove(k) {
                Err(e) if !is_not_found(&e) => {
                    return Err(update_err(format!(
                        "remove an entry of ifindex {}",
                        k.data().ifindex
                    ))(e))
                }
                _ => {}
            }
        }
        Ok(gone.len())
    }

    /// Removes an attachment's source entries, found by the id they carry (DEL needs no
    /// namespace, result or host veth). Returns how many went.
    pub fn remove_sources(&mut self, attachment_id: u64) -> Result<usize, BpfError> {
        self.remove_sources_where(|_, v| v.attachment_id == attachment_id)
    }

    /// [`Maps::remove_sources`] of a pod whose entries are known: the pod's own addresses
    /// `ips` and its catch-all, on host veth `ifindex` (its placement record says it has
    /// no other). Looked up by key, no walk; only entries that carry the id go, the
    /// catch-all last (see [`Maps::remove_sources_where`]).
    pub fn remove_own_sources(
        &mut self,
        attachment_id: u64,
        ifindex: u32,
        ips: &[IpAddr],
    ) -> Result<usize, BpfError> {
        let Some(map) = self.sources.as_mut() else {
            return Ok(0);
        };
        let keys = ips
            .iter()
            .map(|ip| prefix_key(ifindex, &IpNetwork::from(*ip)))
            .chain([catch_all(ifindex)]);
        let mut gone = 0;
        for k in keys {
            // A lookup is a longest match: without the key itself it may find the pod's
            // catch-all, and the removal of the exact key then finds nothing.
            if !map
                .get(&k, 0)
                .is_ok_and(|v| v.attachment_id == attachment_id)
            {
                continue;
            }
            match map.remove(&k) {
                Ok(()) => gone += 1,
                Err(e) if is_not_found(&e) => {}
                Err(e) => {
                    return Err(update_err(format!("remove an entry of ifindex {ifindex}"))(
                        e,
                    ))
                }
            }
        }
        Ok(gone)
    }

    /// GC: removes the entries of attachments not in `live` (left by a DEL of a release
    /// that did not know the map, or by a veth deleted without DEL). Returns how many went.
    pub fn sweep_sources(
        &mut self,
        live: &std::collections::HashSet<u64>,
    ) -> Result<usize, BpfError> {
        self.remove_sources_where(|_, v| !live.contains(&v.attachment_id))
    }

    /// Each host veth's entries, in one walk of the map's keys: a value is read only for
    /// a catch-all (its MAC and verdict), so a node of N pods costs about N lookups beside
    /// the walk, not one per entry (`inspect` and `metrics` read every pod).
    pub fn sources_by_ifindex(&self) -> HashMap<u32, PodSources> {
        let Some(map) = self.sources.as_ref() else {
            return HashMap::new();
        };
        let mut out: HashMap<u32, PodSources> = HashMap::new();
        for k in map.keys().filter_map(Result::ok) {
            let p = out.entry(k.data().ifindex).or_default();
            match key_prefix(&k) {
                Some(net) => p.allowed.push(net),
                None => {
                    if let Ok(v) = map.get(&k, 0) {
                        p.verdict = v.verdict;
                        p.mac = v.mac;
                    }
                }
            }
        }
        for p in out.values_mut() {
            p.allowed.sort();
        }
        out
    }

    /// CHECK: the entries of host veth `ifindex` are exactly what `check` describes, and
    /// all of attachment `attachment_id`, and the record says the same. A pod without a
    /// record was attached by a release before the check, runs programs without it, and
    /// must have no entries.
    pub fn check_sources(
        &self,
        attachment_id: u64,
        ifindex: u32,
        check: &SourceCheck,
        record: SourceRecord,
    ) -> Result<(), BpfError> {
        let mut owners = BTreeMap::new();
        let mut entries = Vec::new();
        for (k, v) in self.source_entries() {
            if k.data().ifindex == ifindex {
                *owners.entry(v.attachment_id).or_insert(0usize) += 1;
                entries.push((key_prefix(&k), v));
            }
        }
        if let Some(&other) = owners.keys().find(|id| **id != attachment_id) {
            return Err(BpfError::SourceStale {
                ifindex,
                actual: format!("held by attachment {other:016x}"),
                expected: format!("attachment {attachment_id:016x}'s"),
            });
        }
        let catch = entries
            .iter()
            .find(|(net, _)| net.is_none())
            .map(|(_, v)| v);
        let mut actual = PodSources {
            verdict: catch.map_or(0, |v| v.verdict),
            mac: catch.map_or([0; 6], |v| v.mac),
            allowed: entries.iter().filter_map(|(net, _)| *net).collect(),
        };
        actual.allowed.sort();
        let stale = |actual: String, expected: String| BpfError::SourceStale {
            ifindex,
            actual,
            expected,
        };
        let (wanted, masq_addrs) = match (check, record) {
            (_, SourceRecord::None) if entries.is_empty() => return Ok(()),
            (SourceCheck::Off, SourceRecord::Off) if entries.is_empty() => return Ok(()),
            (SourceCheck::Off, _) => {
                let was = match record {
                    SourceRecord::On => "on".to_owned(),
                    _ => describe(&actual),
                };
                return Err(stale(was, "off".to_owned()));
            }
            (SourceCheck::On { .. }, SourceRecord::Off) => {
                return Err(stale("off".to_owned(), describe_check(check)))
            }
            (
                SourceCheck::On {
                    mac,
                    allowed,
                    masq_addrs,
                },
                _,
            ) => (
                PodSources {
                    verdict: SOURCE_REFUSE,
                    mac: *mac,
                    allowed: allowed.clone(),
                },
                masq_addrs,
            ),
        };
        if actual != wanted {
            return Err(stale(describe(&actual), describe(&wanted)));
        }
        for (net, v) in &entries {
            if let Some(net) = net {
                let verdict = pass_verdict(net, masq_addrs);
                // An earlier release wrote `SOURCE_PASS` for a masquerading pod's own
                // address too; its programs, and these, then look the endpoint up.
                let as_written =
                    v.verdict == verdict || verdict == SOURCE_PASS_MASQ && v.verdict == SOURCE_PASS;
                if !as_written || v.mac != wanted.mac {
                    return Err(stale(
                        format!(
                            "{net} with verdict {} and MAC {}",
                            v.verdict,
                            crate::netlink::format_mac(&v.mac)
                        ),
                        format!(
                            "{net} allowed (verdict {verdict}) with MAC {}",
                            crate::netlink::format_mac(&wanted.mac)
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

fn describe_check(check: &SourceCheck) -> String {
    match check {
        SourceCheck::Off => "off".to_owned(),
        SourceCheck::On { mac, allowed, .. } => describe(&PodSources {
            verdict: SOURCE_REFUSE,
            mac: *mac,
            allowed: allowed.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_masquerading_pods_own_addresses_say_it_masquerades() {
        let own: Vec<IpAddr> = vec!["10.88.0.5".parse().unwrap(), "fd00::5".parse().unwrap()];
        let net = |s: &str| s.parse::<IpNetwork>().unwrap();
        for (n, masq, want) in [
            ("10.88.0.5/32", true, SOURCE_PASS_MASQ),
            ("fd00::5/128", true, SOURCE_PASS_MASQ),
            ("10.88.0.5/32", false, SOURCE_PASS),
            // An extra prefix: the address it holds may be another pod's.
            ("10.88.0.0/24", true, SOURCE_PASS),
            ("10.99.0.7/32", true, SOURCE_PASS),
        ] {
            let masq_addrs = if masq { own.clone() } else { Vec::new() };
            assert_eq!(pass_verdict(&net(n), &masq_addrs), want, "{n}, masq {masq}");
        }
    }

    #[test]
    fn keys_put_the_family_before_the_address() {
        let k = prefix_key(7, &"10.99.0.0/16".parse().unwrap());
        assert_eq!(k.prefix_len(), 64 + 16);
        assert_eq!(k.data().family, SOURCE_FAMILY_V4);
        assert_eq!(k.data().addr[..4], [10, 99, 0, 0]);
        assert_eq!(k.data().addr[4..], [0; 12]);
        assert_eq!(key_prefix(&k), Some("10.99.0.0/16".parse().unwrap()));
        let k = prefix_key(7, &"fd99::5/128".parse().unwrap());
        assert_eq!(k.prefix_len(), 64 + 128);
        assert_eq!(k.data().family, SOURCE_FAMILY_V6);
        assert_eq!(key_prefix(&k), Some("fd99::5/128".parse().unwrap()));
        // "Any IPv6 source" is longer than the catch-all, and of its family only.
        let any6 = prefix_key(7, &"::/0".parse().unwrap());
        assert_eq!(any6.prefix_len(), 64);
        assert_ne!(any6.data(), catch_all(7).data());
        assert_eq!(catch_all(7).prefix_len(), 32);
        assert_eq!(key_prefix(&catch_all(7)), None);
    }
}
