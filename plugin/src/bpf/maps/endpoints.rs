//! The endpoint map: every local pod address, where it lives and how the programs treat
//! it; ADD inserts a pod's entries, CHECK compares them, DEL removes them.

use std::net::IpAddr;

use aya::maps::{HashMap, MapData, PerCpuValues};
use ebpf_cni_maps::{
    EndpointInfo, EndpointKey, PodCounters, COUNTERS_NO_EGRESS_LIMIT, COUNTERS_NO_HOST_PORTS,
    COUNTERS_NO_INGRESS_LIMIT, ENDPOINTS_MAP, EP_FLAGS_NONE, POD_COUNTERS_MAP,
};

use super::{endpoint_key, is_not_found, key_ip, Maps};
use crate::bpf::BpfError;

/// What a pod's counters tell the programs that read them: whether a limit towards the pod
/// or from it, or a host port leading to it, needs a lookup (see
/// [`COUNTERS_NO_INGRESS_LIMIT`], [`COUNTERS_NO_EGRESS_LIMIT`] and
/// [`COUNTERS_NO_HOST_PORTS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterHints {
    pub ingress_limit: bool,
    pub egress_limit: bool,
    pub host_ports: bool,
}

impl CounterHints {
    /// The pod's counters before its first packet.
    fn first(self) -> PodCounters {
        let mut c = PodCounters::default();
        if !self.ingress_limit {
            c.to_pod.flags |= COUNTERS_NO_INGRESS_LIMIT;
        }
        if !self.egress_limit {
            c.from_pod.flags |= COUNTERS_NO_EGRESS_LIMIT;
        }
        if !self.host_ports {
            c.from_pod.flags |= COUNTERS_NO_HOST_PORTS;
        }
        c
    }

    /// A flag of `c` that says there is nothing to look up where the pod has something:
    /// its direction's name and the flags.
    fn contradicted_by(self, c: &PodCounters) -> Option<(&'static str, u64)> {
        if self.ingress_limit && c.to_pod.flags & COUNTERS_NO_INGRESS_LIMIT != 0 {
            return Some(("ingress limit", c.to_pod.flags));
        }
        if self.egress_limit && c.from_pod.flags & COUNTERS_NO_EGRESS_LIMIT != 0 {
            return Some(("egress limit", c.from_pod.flags));
        }
        if self.host_ports && c.from_pod.flags & COUNTERS_NO_HOST_PORTS != 0 {
            return Some(("host port", c.from_pod.flags));
        }
        None
    }
}

/// One address of a pod and where it lives, as the endpoint map records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodEndpoint {
    pub ip: IpAddr,
    pub host_ifindex: u32,
    pub host_mac: [u8; 6],
    pub pod_mac: [u8; 6],
    /// Chained mode (see [`ebpf_cni_maps::EP_FLAG_CHAINED`]).
    pub chained: bool,
    /// The IPv4 gateway the programs answer ARP for (see [`EndpointInfo::gateway4`]).
    pub gateway4: Option<std::net::Ipv4Addr>,
    /// The pod masquerades (see [`ebpf_cni_maps::EP_FLAG_MASQ`]).
    pub masq: bool,
}

impl PodEndpoint {
    pub(super) fn flags(&self) -> u32 {
        let mut flags = EP_FLAGS_NONE;
        if self.chained {
            flags |= ebpf_cni_maps::EP_FLAG_CHAINED;
        }
        if self.masq {
            flags |= ebpf_cni_maps::EP_FLAG_MASQ;
        }
        flags
    }
}

/// [`Maps::ensure_free`] on the endpoint map alone (opened by [`Maps::open_endpoints`]: ADD's
/// check before it changes anything needs no other map).
pub fn ensure_free_in(
    endpoints: &HashMap<MapData, EndpointKey, EndpointInfo>,
    attachment_id: u64,
    ips: &[IpAddr],
) -> Result<(), BpfError> {
    for ip in ips {
        if let Ok(v) = endpoints.get(&endpoint_key(*ip), 0) {
            if v.attachment_id != attachment_id
                && crate::netlink::ifname::name_of(v.host_ifindex).is_some()
            {
                return Err(BpfError::AddressInUse {
                    ip: *ip,
                    host_ifindex: v.host_ifindex,
                });
            }
        }
    }
    Ok(())
}

impl Maps {
    /// Refuses an address another live attachment of this node already holds: the map is
    /// keyed by address alone, so two networks with overlapping subnets on one node would
    /// silently steal each other's pods. An entry whose host veth is gone is stale (its DEL
    /// never came) and may be replaced.
    pub fn ensure_free(&self, attachment_id: u64, ips: &[IpAddr]) -> Result<(), BpfError> {
        ensure_free_in(&self.endpoints, attachment_id, ips)
    }

    /// Inserts the pod's entries, and zero counters for its host veth, which carry `hints`
    /// in every CPU's slot: once per host veth (a dual-stack pod's two addresses share
    /// one), before the first entry that leads the programs to it.
    pub fn insert_pod(
        &mut self,
        attachment_id: u64,
        eps: &[PodEndpoint],
        hints: CounterHints,
    ) -> Result<(), BpfError> {
        let cpus = aya::util::nr_cpus().map_err(|(_, source)| BpfError::Cpus { source })?;
        let first = hints.first();
        let mut counted = Vec::with_capacity(1);
        for ep in eps {
            if !counted.contains(&ep.host_ifindex) {
                let values = PerCpuValues::try_from(vec![first; cpus]).expect("one value per CPU");
                self.counters
                    .insert(ep.host_ifindex, values, 0)
                    .map_err(|source| BpfError::MapUpdate {
                        map: POD_COUNTERS_MAP,
                        what: format!("reset counters of ifindex {}", ep.host_ifindex),
                        source: Box::new(source),
                    })?;
                counted.push(ep.host_ifindex);
            }
            let info = EndpointInfo {
                attachment_id,
                host_ifindex: ep.host_ifindex,
                flags: ep.flags(),
                host_mac: ep.host_mac,
                pod_mac: ep.pod_mac,
                gateway4: ep.gateway4.map_or([0; 4], |g| g.octets()),
            };
            self.endpoints
                .insert(endpoint_key(ep.ip), info, 0)
                .map_err(|source| BpfError::MapUpdate {
                    map: ENDPOINTS_MAP,
                    what: format!("insert {}", ep.ip),
                    source: Box::new(source),
                })?;
        }
        Ok(())
    }

    /// Entries of one attachment: (address, entry).
    pub fn entries_of(&self, attachment_id: u64) -> Vec<(IpAddr, EndpointInfo)> {
        self.endpoints
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, v)| v.attachment_id == attachment_id)
            .map(|(k, v)| (key_ip(&k), v))
            .collect()
    }

    /// Every entry, grouped by attachment: one walk of the map for a whole node, where
    /// [`Maps::entries_of`] per pod would walk it once per pod.
    pub fn entries_by_attachment(
        &self,
    ) -> std::collections::HashMap<u64, Vec<(IpAddr, EndpointInfo)>> {
        let mut out: std::collections::HashMap<u64, Vec<_>> = std::collections::HashMap::new();
        for (k, v) in self.endpoints.iter().filter_map(Result::ok) {
            out.entry(v.attachment_id)
                .or_default()
                .push((key_ip(&k), v));
        }
        out
    }

    /// Every pod address on the node.
    pub fn endpoint_ips(&self) -> std::collections::BTreeSet<IpAddr> {
        self.endpoints
            .keys()
            .filter_map(Result::ok)
            .map(|k| key_ip(&k))
            .collect()
    }

    /// Whether any pod on the node but attachment `except` masquerades.
    pub fn any_masq_besides(&self, except: u64) -> bool {
        self.endpoints
            .iter()
            .filter_map(Result::ok)
            .any(|(_, v)| v.flags & ebpf_cni_maps::EP_FLAG_MASQ != 0 && v.attachment_id != except)
    }

    pub fn endpoint_count(&self) -> usize {
        self.endpoints.keys().filter_map(Result::ok).count()
    }

    /// The entries of `ips` that are attachment `attachment_id`'s (looked up, no walk).
    pub fn entries_at(&self, attachment_id: u64, ips: &[IpAddr]) -> Vec<(IpAddr, EndpointInfo)> {
        ips.iter()
            .filter_map(|ip| {
                let v = self.endpoints.get(&endpoint_key(*ip), 0).ok()?;
                (v.attachment_id == attachment_id).then_some((*ip, v))
            })
            .collect()
    }

    /// Removes an attachment's entries, those of `ips` that carry its id (the removal
    /// found them with [`Maps::entries_of`] or [`Maps::entries_at`], or a failed ADD knows
    /// them: no second walk of the map), and the counters of its host veth; returns how
    /// many entries went. Entries already gone are fine (a concurrent or repeated DEL).
    pub fn remove_endpoints(
        &mut self,
        attachment_id: u64,
        ips: &[IpAddr],
    ) -> Result<usize, BpfError> {
        let entries = self.entries_at(attachment_id, ips);
        let mut ifindexes: Vec<u32> = entries.iter().map(|(_, e)| e.host_ifindex).collect();
        ifindexes.dedup();
        for (ip, _) in &entries {
            match self.endpoints.remove(&endpoint_key(*ip)) {
                Err(e) if !is_not_found(&e) => {
                    return Err(BpfError::MapUpdate {
                        map: ENDPOINTS_MAP,
                        what: format!("remove {ip}"),
                        source: Box::new(e),
                    })
                }
                _ => {}
            }
        }
        for ifindex in ifindexes {
            match self.counters.remove(&ifindex) {
                Err(e) if !is_not_found(&e) => {
                    return Err(BpfError::MapUpdate {
                        map: POD_COUNTERS_MAP,
                        what: format!("remove counters of ifindex {ifindex}"),
                        source: Box::new(e),
                    })
                }
                _ => {}
            }
        }
        Ok(entries.len())
    }

    /// CHECK: the counters of host veth `ifindex` do not tell the programs to skip the
    /// lookup of an ingress limit or a host port the pod has (which would leave the limit
    /// unenforced for every delivery but the stack's, or the pod's host port replies
    /// untranslated). A flag off where the pod has nothing is fine (counters of an earlier
    /// release: the programs look it up and find none), as are counters not there
    /// (nothing is skipped).
    pub fn check_counters(&self, ifindex: u32, hints: CounterHints) -> Result<(), BpfError> {
        let Ok(per_cpu) = self.counters.get(&ifindex, 0) else {
            return Ok(());
        };
        for (cpu, c) in per_cpu.iter().enumerate() {
            if let Some((what, flags)) = hints.contradicted_by(c) {
                return Err(BpfError::CountersStale {
                    ifindex,
                    what,
                    cpu,
                    flags,
                });
            }
        }
        Ok(())
    }

    /// CHECK: each address maps to this attachment's host veth and MACs.
    pub fn check_pod(&self, attachment_id: u64, eps: &[PodEndpoint]) -> Result<(), BpfError> {
        let mac = |m: [u8; 6]| crate::netlink::format_mac(&m);
        for ep in eps {
            let Ok(v) = self.endpoints.get(&endpoint_key(ep.ip), 0) else {
                return Err(BpfError::EndpointMissing { ip: ep.ip });
            };
            let stale = |field, actual: String, expected: String| BpfError::EndpointStale {
                ip: ep.ip,
                field,
                actual,
                expected,
            };
            if v.attachment_id != attachment_id {
                return Err(stale(
                    "attachment",
                    format!("{:016x}", v.attachment_id),
                    format!("{attachment_id:016x}"),
                ));
            }
            if v.host_ifindex != ep.host_ifindex {
                return Err(stale(
                    "host ifindex",
                    v.host_ifindex.to_string(),
                    ep.host_ifindex.to_string(),
                ));
            }
            if v.host_mac != ep.host_mac {
                return Err(stale("host MAC", mac(v.host_mac), mac(ep.host_mac)));
            }
            if v.pod_mac != ep.pod_mac {
                return Err(stale("pod MAC", mac(v.pod_mac), mac(ep.pod_mac)));
            }
            let gw = ep.gateway4.map_or([0; 4], |g| g.octets());
            if v.gateway4 != gw {
                let show = |g: [u8; 4]| std::net::Ipv4Addr::from(g).to_string();
                return Err(stale("gateway", show(v.gateway4), show(gw)));
            }
            if v.flags != ep.flags() {
                return Err(stale(
                    "flags",
                    format!("{:#x}", v.flags),
                    format!("{:#x}", ep.flags()),
                ));
            }
        }
        Ok(())
    }
}
