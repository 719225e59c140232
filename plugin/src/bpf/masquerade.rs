//! Masquerade on the node (`ipMasq`): the skip trie, each device's source address, the
//! port range and its reservation in the node's `ip_local_reserved_ports`, a pod's flows on
//! DEL, and the release of it all when the node's last masquerading pod goes. The programs'
//! side is `ebpf/src/masquerade.rs`.

use std::{
    collections::BTreeSet,
    fs,
    net::IpAddr,
    path::{Path, PathBuf},
};

use aya::maps::{
    lpm_trie::{Key, LpmTrie},
    Array, HashMap, MapData, PerCpuArray,
};
use ebpf_cni_maps::{
    masq_src_key, EndpointKey, MasqFlow, MasqKey, MasqStats, NodeConfig, CONFIG_MAP, MASQ_FWD_MAP,
    MASQ_PORT_MAX, MASQ_PORT_MIN, MASQ_REV_MAP, MASQ_SKIP_MAP, MASQ_SRC_MAP, MASQ_STATS_MAP,
    NODE_FLAG_MASQ,
};
use ipnetwork::IpNetwork;
use serde::Serialize;

use super::{
    host_ports::update_err,
    maps::{endpoint_key, is_not_found, key_ip, open_map_err, open_pinned},
    pin::{NodeId, PinRoot},
    BpfError,
};

/// [`NodeConfig::flags`]: ebpf-cni added the masquerade range to the node's reserved ports
/// (it was not all reserved before), so it takes it out again on release.
const NODE_FLAG_MASQ_RESERVED: u32 = 4;

/// The node's reserved ports (of its network namespace: the plugin runs in it).
const RESERVED_PORTS: &str = "/proc/sys/net/ipv4/ip_local_reserved_ports";

/// What a masquerading pod needs of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasqSpec {
    /// Destinations never masqueraded: the pod network's ranges and `ipMasqExclude`.
    /// (The addresses flows leave with are the node's, not the pod's: `NodeView`.)
    pub skip: Vec<IpNetwork>,
    /// `ipMasqPortRange`; `None`: the default range.
    pub ports: Option<(u16, u16)>,
}

/// The trie key of a range, IPv4 mapped into IPv6.
fn skip_key(net: &IpNetwork) -> Key<[u8; 16]> {
    let base = endpoint_key(net.network()).addr;
    let bits = match net {
        IpNetwork::V4(n) => 96 + u32::from(n.prefix()),
        IpNetwork::V6(n) => u32::from(n.prefix()),
    };
    Key::new(bits, base)
}

/// The `ECNI_MASQ_REV` key of the flow whose `ECNI_MASQ_FWD` entry is `(k, v)`: the same
/// remote end, seen from the node's address and port.
fn node_view(k: &MasqKey, v: &MasqFlow) -> MasqKey {
    MasqKey {
        local: v.addr,
        remote: k.remote,
        local_port: v.port,
        remote_port: k.remote_port,
        proto: k.proto,
        _pad: [0; 3],
    }
}

/// The node's masquerade maps, opened from their pins.
pub struct MasqMaps {
    fwd: HashMap<MapData, MasqKey, MasqFlow>,
    rev: HashMap<MapData, MasqKey, MasqFlow>,
    skip: LpmTrie<MapData, [u8; 16], u32>,
    src: HashMap<MapData, u64, EndpointKey>,
    stats: PerCpuArray<MapData, MasqStats>,
    config: Array<MapData, NodeConfig>,
}

/// The source map's wanted content: one address per device and family, the first listed.
fn wanted_sources(sources: &[(u32, IpAddr)]) -> std::collections::BTreeMap<u64, EndpointKey> {
    let mut want = std::collections::BTreeMap::new();
    for (ifindex, ip) in sources {
        want.entry(masq_src_key(*ifindex, ip.is_ipv4()))
            .or_insert_with(|| endpoint_key(*ip));
    }
    want
}

impl MasqMaps {
    /// `None` when the node's maps are not pinned (no pod yet), or predate masquerade
    /// (programs loaded by an older revision, until they are reloaded).
    pub fn open(root: &PinRoot, node: &NodeId) -> Result<Option<Self>, BpfError> {
        let open = |name: &'static str| open_pinned(root, node, name);
        let (Some(fwd), Some(rev), Some(skip), Some(src), Some(stats), Some(config)) = (
            open(MASQ_FWD_MAP)?,
            open(MASQ_REV_MAP)?,
            open(MASQ_SKIP_MAP)?,
            open(MASQ_SRC_MAP)?,
            open(MASQ_STATS_MAP)?,
            open(CONFIG_MAP)?,
        ) else {
            return Ok(None);
        };
        let conv = |name| open_map_err(root, node, name);
        Ok(Some(Self {
            fwd: HashMap::try_from(fwd).map_err(conv(MASQ_FWD_MAP))?,
            rev: HashMap::try_from(rev).map_err(conv(MASQ_REV_MAP))?,
            skip: LpmTrie::try_from(skip).map_err(conv(MASQ_SKIP_MAP))?,
            src: HashMap::try_from(src).map_err(conv(MASQ_SRC_MAP))?,
            stats: PerCpuArray::try_from(stats).map_err(conv(MASQ_STATS_MAP))?,
            config: Array::try_from(config).map_err(conv(CONFIG_MAP))?,
        }))
    }

    /// The skip trie's keys, as `(prefix length, address)`.
    fn skip_ranges(&self) -> BTreeSet<(u32, [u8; 16])> {
        self.skip
            .keys()
            .filter_map(Result::ok)
            .map(|k| (k.prefix_len(), k.data()))
            .collect()
    }

    fn node_config(&self) -> NodeConfig {
        self.config.get(&0, 0).unwrap_or_default()
    }

    fn set_node_config(&mut self, c: NodeConfig) -> Result<(), BpfError> {
        self.config.set(0, c, 0).map_err(update_err(
            CONFIG_MAP,
            "set the masquerade flags".to_owned(),
        ))
    }

    /// The port range flows take.
    pub fn port_range(&self) -> (u16, u16) {
        let c = self.node_config();
        if c.masq_port_min != 0 && c.masq_port_min <= c.masq_port_max {
            (c.masq_port_min, c.masq_port_max)
        } else {
            (MASQ_PORT_MIN, MASQ_PORT_MAX)
        }
    }

    /// Makes the node masquerade for a pod: the skip ranges, the devices' source addresses
    /// `sources` (the node's, as `NodeView` reads them; a device's new address serves new
    /// flows from now on), the reserved ports and the programs' flag. The node lock is held.
    pub fn install(&mut self, spec: &MasqSpec, sources: &[(u32, IpAddr)]) -> Result<(), BpfError> {
        let present = self.skip_ranges();
        for net in &spec.skip {
            let key = skip_key(net);
            if !present.contains(&(key.prefix_len(), key.data())) {
                self.skip
                    .insert(&key, 1, 0)
                    .map_err(update_err(MASQ_SKIP_MAP, format!("insert {net}")))?;
            }
        }
        self.sync_sources(sources)?;
        let mut c = self.node_config();
        let want = spec.ports.unwrap_or((MASQ_PORT_MIN, MASQ_PORT_MAX));
        if c.flags & NODE_FLAG_MASQ == 0 {
            // The node's first masquerading pod sets the range and reserves it.
            (c.masq_port_min, c.masq_port_max) = want;
            if reserve(Path::new(RESERVED_PORTS), want.0, want.1)? {
                c.flags |= NODE_FLAG_MASQ_RESERVED;
            }
        } else if self.port_range() != want {
            let (lo, hi) = self.port_range();
            return Err(BpfError::MasqPortRange {
                asked: format!("{}-{}", want.0, want.1),
                current: format!("{lo}-{hi}"),
            });
        }
        c.flags |= NODE_FLAG_MASQ;
        if c != self.node_config() {
            self.set_node_config(c)?;
        }
        Ok(())
    }

    /// Whether the node masquerades (some pod of it has `ipMasq`), from its switches.
    pub fn active_in(config: NodeConfig) -> bool {
        config.flags & NODE_FLAG_MASQ != 0
    }

    /// [`Self::active`] from the node's config map alone (`false` without one): what a
    /// check needs before it opens the five masquerade maps, which a node without
    /// masquerade never reads.
    pub fn active_on(root: &PinRoot, node: &NodeId) -> Result<bool, BpfError> {
        let Some(config) = open_pinned(root, node, CONFIG_MAP)? else {
            return Ok(false);
        };
        let config: Array<MapData, NodeConfig> =
            Array::try_from(config).map_err(open_map_err(root, node, CONFIG_MAP))?;
        Ok(Self::active_in(config.get(&0, 0).unwrap_or_default()))
    }

    pub fn active(&self) -> bool {
        Self::active_in(self.node_config())
    }

    /// Whether the node masquerades, or holds ports reserved for it: what a pod that
    /// masquerades turns on and the node's last one turns off.
    pub fn engaged(&self) -> bool {
        self.node_config().flags & (NODE_FLAG_MASQ | NODE_FLAG_MASQ_RESERVED) != 0
    }

    /// Whether the source map holds exactly what [`Self::sync_sources`] would write.
    pub fn sources_in_line(&self, sources: &[(u32, IpAddr)]) -> bool {
        let have: std::collections::BTreeMap<u64, EndpointKey> =
            self.src.iter().filter_map(Result::ok).collect();
        have == wanted_sources(sources)
    }

    /// One address per device and family: the first the node lists.
    pub(super) fn sync_sources(&mut self, sources: &[(u32, IpAddr)]) -> Result<(), BpfError> {
        let want = wanted_sources(sources);
        let stale: Vec<u64> = self
            .src
            .keys()
            .filter_map(Result::ok)
            .filter(|k| !want.contains_key(k))
            .collect();
        for k in stale {
            let _ = self.src.remove(&k);
        }
        for (k, v) in want {
            if self.src.get(&k, 0).ok() != Some(v) {
                self.src
                    .insert(k, v, 0)
                    .map_err(update_err(MASQ_SRC_MAP, format!("set {}", key_ip(&v))))?;
            }
        }
        Ok(())
    }

    /// CHECK: what `install` set up for a pod is still there.
    pub fn check(&self, spec: &MasqSpec) -> Result<(), BpfError> {
        let c = self.node_config();
        if c.flags & NODE_FLAG_MASQ == 0 {
            return Err(BpfError::MasqMissing {
                missing: "the programs' masquerade flag is off".to_owned(),
            });
        }
        let present = self.skip_ranges();
        for net in &spec.skip {
            let key = skip_key(net);
            if !present.contains(&(key.prefix_len(), key.data())) {
                return Err(BpfError::MasqMissing {
                    missing: format!("{net} is missing from the never-masqueraded ranges"),
                });
            }
        }
        Ok(())
    }

    /// Removes every flow of these pod addresses, both entries; returns how many flows.
    pub fn remove_flows(&mut self, addrs: &[IpAddr]) -> usize {
        let locals: BTreeSet<[u8; 16]> = addrs.iter().map(|ip| endpoint_key(*ip).addr).collect();
        let flows: Vec<(MasqKey, MasqFlow)> = self
            .fwd
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, _)| locals.contains(&k.local))
            .collect();
        for (k, v) in &flows {
            let rev = node_view(k, v);
            match self.rev.remove(&rev) {
                Err(e) if !is_not_found(&e) => log::warn!("removing a masquerade flow: {e}"),
                _ => {}
            }
            let _ = self.fwd.remove(k);
        }
        flows.len()
    }

    /// GC: removes the flows idle past their timeout (by the programs' clock,
    /// `CLOCK_MONOTONIC`) and those of addresses no pod holds (`live`); returns how many.
    /// The programs reclaim an idle flow's port when they need it; this frees the table.
    pub fn sweep(&mut self, live: &BTreeSet<IpAddr>) -> Result<usize, BpfError> {
        let now = monotonic_ns()?;
        let live: BTreeSet<[u8; 16]> = live.iter().map(|ip| endpoint_key(*ip).addr).collect();
        let flows: Vec<(MasqKey, MasqFlow)> = self.fwd.iter().filter_map(Result::ok).collect();
        let mut gone = 0;
        for (k, v) in flows {
            let rev = node_view(&k, &v);
            let back = self.rev.get(&rev, 0).ok();
            let last = back.map_or(v.last_ns, |b| b.last_ns.max(v.last_ns));
            let state = back.map_or(v.state, |b| b.state | v.state);
            let idle = now.saturating_sub(last) > ebpf_cni_maps::masq_timeout_ns(k.proto, state);
            if idle || !live.contains(&k.local) {
                let _ = self.rev.remove(&rev);
                let _ = self.fwd.remove(&k);
                gone += 1;
            }
        }
        Ok(gone)
    }

    /// The node's last masquerading pod went: the flag off, the skip ranges and sources
    /// emptied, the reserved ports given back, kube-proxy's masquerade let back into them
    /// (`netfilter::masq_ports`).
    pub fn release(&mut self) -> Result<(), BpfError> {
        let c = self.node_config();
        if c.flags & NODE_FLAG_MASQ_RESERVED != 0 {
            unreserve(Path::new(RESERVED_PORTS), c.masq_port_min, c.masq_port_max)?;
        }
        if c.flags & (NODE_FLAG_MASQ | NODE_FLAG_MASQ_RESERVED) != 0 {
            // kube-proxy's masquerade gets the whole range back.
            if let Err(e) = crate::netfilter::masq_ports::remove() {
                log::warn!("table inet {}: {e}", crate::netfilter::masq_ports::TABLE);
            }
            self.set_node_config(NodeConfig {
                flags: c.flags & !(NODE_FLAG_MASQ | NODE_FLAG_MASQ_RESERVED),
                ..c
            })?;
        }
        let keys: Vec<Key<[u8; 16]>> = self.skip.keys().filter_map(Result::ok).collect();
        for k in keys {
            let _ = self.skip.remove(&k);
        }
        let keys: Vec<u64> = self.src.keys().filter_map(Result::ok).collect();
        for k in keys {
            let _ = self.src.remove(&k);
        }
        Ok(())
    }

    pub fn report(&self) -> MasqReport {
        let mut stats = MasqStats::default();
        if let Ok(per_cpu) = self.stats.get(&0, 0) {
            for s in per_cpu.iter() {
                stats.out_packets += s.out_packets;
                stats.in_packets += s.in_packets;
                stats.flows += s.flows;
                stats.reclaimed += s.reclaimed;
                stats.exhausted += s.exhausted;
                stats.table_full += s.table_full;
                stats.untranslatable += s.untranslatable;
            }
        }
        let c = self.node_config();
        let (lo, hi) = self.port_range();
        let mut flows_by_pod: std::collections::BTreeMap<IpAddr, usize> = Default::default();
        for (k, _) in self.fwd.iter().filter_map(Result::ok) {
            *flows_by_pod
                .entry(key_ip(&EndpointKey { addr: k.local }))
                .or_default() += 1;
        }
        let mut sources: Vec<MasqSourceReport> = self
            .src
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| MasqSourceReport {
                ifindex: ebpf_cni_maps::masq_src_ifindex(k),
                address: key_ip(&v),
            })
            .collect();
        sources.sort_by_key(|s| (s.ifindex, s.address));
        MasqReport {
            enabled: c.flags & NODE_FLAG_MASQ != 0,
            sources,
            ports: format!("{lo}-{hi}"),
            ports_reserved_by_us: c.flags & NODE_FLAG_MASQ_RESERVED != 0,
            // Read by netlink in the node's namespace, by the caller.
            kube_proxy_ports: None,
            flows: flows_by_pod.values().sum(),
            flows_by_pod,
            out_packets: stats.out_packets,
            in_packets: stats.in_packets,
            flows_created: stats.flows,
            reclaimed: stats.reclaimed,
            exhausted: stats.exhausted,
            table_full: stats.table_full,
            untranslatable: stats.untranslatable,
        }
    }
}

/// What `inspect` shows of masquerade (the tables' use and limits are in the map report).
#[derive(Debug, Clone, Serialize)]
pub struct MasqReport {
    pub enabled: bool,
    /// The address each device's masqueraded flows leave with, per family, where the FIB
    /// lookup cannot tell it (before 6.8).
    pub sources: Vec<MasqSourceReport>,
    pub ports: String,
    pub ports_reserved_by_us: bool,
    /// The ports kube-proxy's masquerade is kept to (`netfilter::masq_ports`); `None`: no
    /// such rule (no kube-proxy mark learned, or the node does not masquerade).
    pub kube_proxy_ports: Option<String>,
    pub flows: usize,
    pub flows_by_pod: std::collections::BTreeMap<IpAddr, usize>,
    pub out_packets: u64,
    pub in_packets: u64,
    pub flows_created: u64,
    pub reclaimed: u64,
    /// New flows dropped because every probed port towards their destination was taken.
    pub exhausted: u64,
    /// New flows dropped because the table was full.
    pub table_full: u64,
    pub untranslatable: u64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct MasqSourceReport {
    pub ifindex: u32,
    pub address: IpAddr,
}

/// `bpf_ktime_get_ns`'s clock, as user space reads it.
fn monotonic_ns() -> Result<u64, BpfError> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to write.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        return Err(BpfError::Clock {
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// `ip_local_reserved_ports` as ranges (`"1,5-7"` → `[(1,1),(5,7)]`).
fn parse_ranges(s: &str) -> Vec<(u16, u16)> {
    s.trim()
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .filter_map(|p| {
            let p = p.trim();
            match p.split_once('-') {
                Some((a, b)) => Some((a.trim().parse().ok()?, b.trim().parse().ok()?)),
                None => p.parse().ok().map(|v| (v, v)),
            }
        })
        .collect()
}

fn format_ranges(ports: &BTreeSet<u16>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut it = ports.iter().copied().peekable();
    while let Some(start) = it.next() {
        let mut end = start;
        while it.peek() == Some(&end.wrapping_add(1)) && end != u16::MAX {
            end = it.next().expect("peeked");
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    out.join(",")
}

fn port_set(ranges: &[(u16, u16)]) -> BTreeSet<u16> {
    ranges.iter().flat_map(|&(a, b)| a..=b).collect()
}

fn sysctl_err(path: &Path) -> impl FnOnce(std::io::Error) -> BpfError {
    let path = PathBuf::from(path);
    move |source| BpfError::ReservedPorts { path, source }
}

/// Adds `lo..=hi` to the reserved ports at `path`, merged with what is there. Returns
/// whether it changed anything (false: all of it was reserved already).
fn reserve(path: &Path, lo: u16, hi: u16) -> Result<bool, BpfError> {
    let have = fs::read_to_string(path).map_err(sysctl_err(path))?;
    let mut set = port_set(&parse_ranges(&have));
    if (lo..=hi).all(|p| set.contains(&p)) {
        return Ok(false);
    }
    set.extend(lo..=hi);
    fs::write(path, format_ranges(&set)).map_err(sysctl_err(path))?;
    Ok(true)
}

/// Takes `lo..=hi` out of the reserved ports at `path`, leaving the rest.
fn unreserve(path: &Path, lo: u16, hi: u16) -> Result<(), BpfError> {
    let have = fs::read_to_string(path).map_err(sysctl_err(path))?;
    let mut set = port_set(&parse_ranges(&have));
    set.retain(|p| !(lo..=hi).contains(p));
    let text = format_ranges(&set);
    // An empty write is refused by some kernels; a newline clears the list.
    fs::write(
        path,
        if text.is_empty() {
            "\n".to_owned()
        } else {
            text
        },
    )
    .map_err(sysctl_err(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_ranges_merge_and_give_back_only_ours() {
        let dir = std::env::temp_dir().join(format!("ecni-reserved-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ports");
        fs::write(&path, "8080,9000-9002\n").unwrap();
        assert!(reserve(&path, 61000, 61003).unwrap());
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            "8080,9000-9002,61000-61003"
        );
        assert!(!reserve(&path, 61001, 61002).unwrap(), "already reserved");
        unreserve(&path, 61000, 61003).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "8080,9000-9002");
        fs::write(&path, "\n").unwrap();
        assert!(reserve(&path, 65534, 65535).unwrap());
        assert_eq!(fs::read_to_string(&path).unwrap(), "65534-65535");
        unreserve(&path, 65534, 65535).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "\n");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn skip_keys_map_ipv4_into_ipv6() {
        let k = skip_key(&"10.22.0.0/16".parse().unwrap());
        assert_eq!(k.prefix_len(), 112);
        assert_eq!(
            k.data(),
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 22, 0, 0]
        );
        let k = skip_key(&"fd00:1::/64".parse().unwrap());
        assert_eq!(k.prefix_len(), 64);
    }
}
