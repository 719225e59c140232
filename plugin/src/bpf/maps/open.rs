//! Opening the node-wide maps from their pins: [`Maps`] (its parts by concern are its
//! siblings'), and the errors of a pinned map that is missing or of another type.

use aya::maps::{Array, HashMap, LpmTrie, Map, MapData, PerCpuHashMap};
use ebpf_cni_maps::{
    EndpointInfo, EndpointKey, NodeConfig, Pacing, PodCounters, RateLimit, ShapeSubnetKey,
    SourceKey, SourceRule, CONFIG_MAP, ENDPOINTS_MAP, PACING_MAP, POD_COUNTERS_MAP,
    RATE_LIMITS_MAP, SHAPE_SUBNETS_MAP, SOURCES_MAP,
};

use crate::bpf::{
    pin::{walk, NodeId, PinRoot},
    BpfError,
};

pub(in crate::bpf) fn is_not_found(e: &aya::maps::MapError) -> bool {
    match e {
        aya::maps::MapError::KeyNotFound => true,
        aya::maps::MapError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

/// The node-wide maps, opened from their pins.
pub struct Maps {
    pub(super) endpoints: HashMap<MapData, EndpointKey, EndpointInfo>,
    pub(super) counters: PerCpuHashMap<MapData, u32, PodCounters>,
    pub(super) rates: HashMap<MapData, u32, RateLimit>,
    /// `None` on a node whose maps predate TCP pacing (until its programs are reloaded).
    pub(super) pacing: Option<HashMap<MapData, u64, Pacing>>,
    /// `None` on a node whose maps predate `unshapedSubnets`/`shapedSubnets` (until its
    /// programs are reloaded).
    pub(super) shape: Option<LpmTrie<MapData, ShapeSubnetKey, u32>>,
    /// `None` on a node whose maps predate the source check (until this binary loads its
    /// programs, which creates the map beside the others).
    pub(super) sources: Option<LpmTrie<MapData, SourceKey, SourceRule>>,
    /// The node's switches (`NodeConfig`), opened with the others so that writing the
    /// limits' switch (ADD, DEL) opens nothing more. `None` on a node whose maps predate
    /// it.
    pub(super) config: Option<Array<MapData, NodeConfig>>,
}

/// The error of a pinned map that did not open as the type its user expects.
pub(in crate::bpf) fn open_map_err(
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

/// The map pinned under `name` on the node, `None` when there is none. One `bpf()` call to
/// open the pin and aya's one read of its info (type, key and value sizes, which the typed
/// wrappers check): the pin is ebpf-cni's own (the node's layout directory, where the
/// programs' load pins each map under its name), so its name is not read back as well.
pub(in crate::bpf) fn open_pinned(
    root: &PinRoot,
    node: &NodeId,
    name: &'static str,
) -> Result<Option<Map>, BpfError> {
    let path = root.map(node, name);
    // No stat first: a missing pin is the open's own ENOENT.
    let data = match MapData::from_pin(walk(&path)) {
        Ok(d) => d,
        Err(e) if is_not_found(&e) => return Ok(None),
        Err(source) => {
            return Err(BpfError::OpenMap {
                path,
                source: Box::new(source),
            })
        }
    };
    Map::from_map_data(data)
        .map(Some)
        .map_err(|source| BpfError::OpenMap {
            path,
            source: Box::new(source),
        })
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
            shape: match open_pinned(root, node, SHAPE_SUBNETS_MAP)? {
                Some(m) => Some(LpmTrie::try_from(m).map_err(conv(SHAPE_SUBNETS_MAP))?),
                None => None,
            },
            sources: match open_pinned(root, node, SOURCES_MAP)? {
                Some(m) => Some(LpmTrie::try_from(m).map_err(conv(SOURCES_MAP))?),
                None => None,
            },
            config: match open_pinned(root, node, CONFIG_MAP)? {
                Some(m) => Some(Array::try_from(m).map_err(conv(CONFIG_MAP))?),
                None => None,
            },
        }))
    }

    /// The endpoint map alone, `None` when this node has none: for a check that reads
    /// nothing else (each map opened costs a stat-free pin open and two info reads).
    pub fn open_endpoints(
        root: &PinRoot,
        node: &NodeId,
    ) -> Result<Option<HashMap<MapData, EndpointKey, EndpointInfo>>, BpfError> {
        match open_pinned(root, node, ENDPOINTS_MAP)? {
            Some(m) => {
                HashMap::try_from(m)
                    .map(Some)
                    .map_err(open_map_err(root, node, ENDPOINTS_MAP))
            }
            None => Ok(None),
        }
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
                sum.source_drops = sum.source_drops.wrapping_add(d.source_drops);
                sum.mac_drops = sum.mac_drops.wrapping_add(d.mac_drops);
            }
        }
        Some(t)
    }
}
