//! The node-wide maps of the dataplane (endpoints, per-pod counters, limits, pacing),
//! opened from their pins. The programs are `programs.rs`'s, the node's lock `lock.rs`'s,
//! the keys `keys.rs`'s.

use std::{net::IpAddr, os::fd::AsFd};

use aya::maps::{HashMap, Map, MapData, PerCpuHashMap, PerCpuValues};
use ebpf_cni_maps::{
    EndpointInfo, EndpointKey, Pacing, PodCounters, RateLimit, ENDPOINTS_MAP, EP_FLAGS_NONE,
    PACING_MAP, POD_COUNTERS_MAP, RATE_LIMITS_MAP,
};

pub use super::keys::{endpoint_key, key_ip};
use super::{
    pin::{NodeId, PinRoot},
    BpfError,
};

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
    fn flags(&self) -> u32 {
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

/// A node device that gets the device program (traffic arriving for pods).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    pub name: String,
    pub ifindex: u32,
}

pub(super) fn is_not_found(e: &aya::maps::MapError) -> bool {
    match e {
        aya::maps::MapError::KeyNotFound => true,
        aya::maps::MapError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

/// The node-wide maps, opened from their pins.
pub struct Maps {
    endpoints: HashMap<MapData, EndpointKey, EndpointInfo>,
    counters: PerCpuHashMap<MapData, u32, PodCounters>,
    rates: HashMap<MapData, u32, RateLimit>,
    /// `None` on a node whose maps predate TCP pacing (until its programs are reloaded).
    pacing: Option<HashMap<MapData, u64, Pacing>>,
}

/// The error of a pinned map that did not open as the type its user expects.
pub(super) fn open_map_err(
    root: &PinRoot,
    node: &NodeId,
    name: &'static str,
) -> impl FnOnce(aya::maps::MapError) -> BpfError {
    let path = root.map(node, name);
    move |source| BpfError::OpenMap {
        path,
        source: Box::new(source),
    }
}

pub(super) fn open_pinned(
    root: &PinRoot,
    node: &NodeId,
    name: &'static str,
) -> Result<Option<Map>, BpfError> {
    let path = root.map(node, name);
    if !path.exists() {
        return Ok(None);
    }
    let err = |source| BpfError::OpenMap {
        path: path.clone(),
        source: Box::new(source),
    };
    let data = MapData::from_pin(&path).map_err(err)?;
    let actual = super::sys::map_name(data.fd().as_fd()).map_err(|source| BpfError::PinInfo {
        path: path.clone(),
        source,
    })?;
    if actual != name {
        return Err(BpfError::WrongMap {
            path,
            actual,
            expected: name,
        });
    }
    Map::from_map_data(data).map(Some).map_err(err)
}

impl Maps {
    /// `None` when this node has no maps (nothing was ever added, or all was deleted).
    pub fn open(root: &PinRoot, node: &NodeId) -> Result<Option<Self>, BpfError> {
        let (Some(ep), Some(cnt), Some(rates)) = (
            open_pinned(root, node, ENDPOINTS_MAP)?,
            open_pinned(root, node, POD_COUNTERS_MAP)?,
            open_pinned(root, node, RATE_LIMITS_MAP)?,
        ) else {
            return Ok(None);
        };
        let conv = |name| open_map_err(root, node, name);
        Ok(Some(Self {
            endpoints: HashMap::try_from(ep).map_err(conv(ENDPOINTS_MAP))?,
            counters: PerCpuHashMap::try_from(cnt).map_err(conv(POD_COUNTERS_MAP))?,
            rates: HashMap::try_from(rates).map_err(conv(RATE_LIMITS_MAP))?,
            pacing: match open_pinned(root, node, PACING_MAP)? {
                Some(m) => Some(HashMap::try_from(m).map_err(conv(PACING_MAP))?),
                None => None,
            },
        }))
    }

    /// Refuses an address another live attachment of this node already holds: the map is
    /// keyed by address alone, so two networks with overlapping subnets on one node would
    /// silently steal each other's pods. An entry whose host veth is gone is stale (its DEL
    /// never came) and may be replaced.
    pub fn ensure_free(&self, attachment_id: u64, ips: &[IpAddr]) -> Result<(), BpfError> {
        for ip in ips {
            if let Ok(v) = self.endpoints.get(&endpoint_key(*ip), 0) {
                if v.attachment_id != attachment_id
                    && nix::net::if_::if_indextoname(v.host_ifindex).is_ok()
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

    pub fn insert_pod(&mut self, attachment_id: u64, eps: &[PodEndpoint]) -> Result<(), BpfError> {
        let cpus = aya::util::nr_cpus().map_err(|(_, source)| BpfError::Cpus { source })?;
        for ep in eps {
            let zero = PerCpuValues::try_from(vec![PodCounters::default(); cpus])
                .expect("one value per CPU");
            self.counters
                .insert(ep.host_ifindex, zero, 0)
                .map_err(|source| BpfError::MapUpdate {
                    map: POD_COUNTERS_MAP,
                    what: format!("reset counters of ifindex {}", ep.host_ifindex),
                    source: Box::new(source),
                })?;
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

    /// Pacing rate (bytes/s) by attachment, in one walk of the pacing map.
    pub fn pacing_by_attachment(&self) -> std::collections::HashMap<u64, u32> {
        self.pacing
            .as_ref()
            .map(|m| {
                m.iter()
                    .filter_map(Result::ok)
                    .map(|(_, v)| (v.attachment_id, v.rate_bytes))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every pod address on the node.
    pub fn endpoint_ips(&self) -> std::collections::BTreeSet<IpAddr> {
        self.endpoints
            .keys()
            .filter_map(Result::ok)
            .map(|k| key_ip(&k))
            .collect()
    }

    /// Whether any pod on the node masquerades.
    pub fn any_masq(&self) -> bool {
        self.endpoints
            .iter()
            .filter_map(Result::ok)
            .any(|(_, v)| v.flags & ebpf_cni_maps::EP_FLAG_MASQ != 0)
    }

    pub fn endpoint_count(&self) -> usize {
        self.endpoints.keys().filter_map(Result::ok).count()
    }

    /// Removes an attachment's entries and counters; returns how many entries went.
    /// Entries already gone are fine (a concurrent or repeated DEL).
    pub fn remove_attachment(&mut self, attachment_id: u64) -> Result<usize, BpfError> {
        let entries = self.entries_of(attachment_id);
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
        self.remove_pacing(attachment_id)?;
        for ifindex in ifindexes {
            self.set_limits(ifindex, None)?;
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

    /// TCP pacing for the pod whose network namespace has `cookie`: its sockets are capped
    /// at `rate_bytes` per second (see `ebpf/src/pace.rs`).
    pub fn set_pacing(
        &mut self,
        cookie: u64,
        attachment_id: u64,
        rate_bytes: u32,
    ) -> Result<(), BpfError> {
        let map = self.pacing.as_mut().ok_or(BpfError::PinMissing {
            what: "pacing map",
            path: PACING_MAP.into(),
        })?;
        let v = Pacing {
            rate_bytes,
            _pad: 0,
            attachment_id,
        };
        map.insert(cookie, v, 0)
            .map_err(|source| BpfError::MapUpdate {
                map: PACING_MAP,
                what: format!("set pacing of netns cookie {cookie}"),
                source: Box::new(source),
            })
    }

    /// Removes the attachment's pacing entries, found by their value: DEL may come without
    /// the pod's namespace. The map holds only limited pods, so the scan is short.
    fn remove_pacing(&mut self, attachment_id: u64) -> Result<(), BpfError> {
        let Some(map) = self.pacing.as_mut() else {
            return Ok(());
        };
        let cookies: Vec<u64> = map
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, v)| v.attachment_id == attachment_id)
            .map(|(k, _)| k)
            .collect();
        for c in cookies {
            match map.remove(&c) {
                Err(e) if !is_not_found(&e) => {
                    return Err(BpfError::MapUpdate {
                        map: PACING_MAP,
                        what: format!("remove pacing of netns cookie {c}"),
                        source: Box::new(e),
                    })
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// CHECK: the pod's namespace has exactly the expected pacing (or none).
    pub fn check_pacing(
        &self,
        cookie: u64,
        attachment_id: u64,
        expected: Option<u32>,
    ) -> Result<(), BpfError> {
        let actual = self
            .pacing
            .as_ref()
            .and_then(|m| m.get(&cookie, 0).ok())
            .filter(|v| v.attachment_id == attachment_id)
            .map(|v| v.rate_bytes);
        if actual != expected {
            let show = |r: Option<u32>| r.map_or("none".to_owned(), |r| format!("{r} B/s"));
            return Err(BpfError::PacingStale {
                actual: show(actual),
                expected: show(expected),
            });
        }
        Ok(())
    }

    /// Installs (or, with `None`, removes) the rate limits of the pod behind `ifindex`.
    pub fn set_limits(&mut self, ifindex: u32, limit: Option<RateLimit>) -> Result<(), BpfError> {
        let res = match limit {
            Some(l) => self.rates.insert(ifindex, l, 0),
            None => match self.rates.remove(&ifindex) {
                Err(e) if is_not_found(&e) => Ok(()),
                r => r,
            },
        };
        res.map_err(|source| BpfError::MapUpdate {
            map: RATE_LIMITS_MAP,
            what: format!("set the limits of ifindex {ifindex}"),
            source: Box::new(source),
        })
    }

    pub fn limits(&self, ifindex: u32) -> Option<RateLimit> {
        self.rates.get(&ifindex, 0).ok()
    }

    /// CHECK: the limiter holds exactly the configured rates and bursts (or nothing).
    pub fn check_limits(&self, ifindex: u32, expected: Option<RateLimit>) -> Result<(), BpfError> {
        let actual = self.limits(ifindex);
        let describe = |l: &Option<RateLimit>| match l {
            None => "no limit".to_owned(),
            Some(l) => format!(
                "ingress {} B/s burst {} B, egress {} B/s burst {} B",
                l.ingress.rate_bytes,
                l.ingress.burst_bytes,
                l.egress.rate_bytes,
                l.egress.burst_bytes
            ),
        };
        let same = |a: &RateLimit, b: &RateLimit| {
            (
                a.ingress.rate_bytes,
                a.ingress.burst_bytes,
                a.egress.rate_bytes,
                a.egress.burst_bytes,
            ) == (
                b.ingress.rate_bytes,
                b.ingress.burst_bytes,
                b.egress.rate_bytes,
                b.egress.burst_bytes,
            )
        };
        let ok = match (&actual, &expected) {
            (None, None) => true,
            (Some(a), Some(b)) => same(a, b),
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(BpfError::LimitMismatch {
                ifindex,
                actual: describe(&actual),
                expected: describe(&expected),
            })
        }
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

    /// A pod's counters summed over CPUs.
    pub fn counters(&self, host_ifindex: u32) -> Option<PodCounters> {
        let per_cpu = self.counters.get(&host_ifindex, 0).ok()?;
        let mut t = PodCounters::default();
        for c in per_cpu.iter() {
            for (sum, d) in [(&mut t.from_pod, &c.from_pod), (&mut t.to_pod, &c.to_pod)] {
                sum.packets = sum.packets.wrapping_add(d.packets);
                sum.bytes = sum.bytes.wrapping_add(d.bytes);
                sum.drops = sum.drops.wrapping_add(d.drops);
                sum.errors = sum.errors.wrapping_add(d.errors);
                sum.marks = sum.marks.wrapping_add(d.marks);
            }
        }
        Some(t)
    }
}
