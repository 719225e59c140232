//! Types and names shared between the kernel-side programs (`ebpf/`) and user space
//! (`plugin/`).
//!
//! Every map value crosses the kernel boundary as raw bytes, so each type here is
//! `#[repr(C)]`, lists its fields large to small, spells out any padding as `_pad` fields and
//! asserts its size at compile time: a layout change must be a deliberate edit here, never an
//! accident of field order. Map and program names are BPF object names, which the kernel cuts
//! at 15 bytes, so they are checked for length too.
//!
//! One module per capability, each re-exported here whole, so every item is
//! `ebpf_cni_maps::<name>` whichever module holds it:
//! - `endpoints`: pod endpoints (routing to local pods) and each pod's counters;
//! - `host_ports`: port mappings, the NAT and reverse flow maps, socket translation;
//! - `bandwidth`: rate limits, their buckets and subnets, pacing;
//! - `source_check`: the sources LPM trie and its rules;
//! - `masquerade`: masqueraded flows, fragments, sources, ports and timeouts;
//! - `services`: the flows of Kubernetes Services handed to the node's stack;
//! - `node`: the node config and its flags, the node's addresses, its namespace probe;
//! - `trace`: the notes of `ebpf-cni trace`;
//! - `tunnel`: the cluster network's overlay (its peers, node addresses, device, counters);
//! - `programs`: program names, [`PLUGIN_PROGRAMS`] and [`PROTOTYPE_PROGRAMS`];
//! - [`pin`]: names under the bpffs mount point;
//! - `ip`: IP protocol numbers; `names`: checks on this crate's names.
//!
//! Here: [`NODE_MAPS`], the list of every node-wide map.
#![no_std]

/// `aya::Pod` for the map types, so user space reads and writes them as plain bytes.
macro_rules! plain_old_data {
    ($($t:ty),* $(,)?) => {
        $(
            // SAFETY: `repr(C)`, integer and byte-array fields only, no implicit padding
            // (sizes asserted above), so every bit pattern is a valid value.
            #[cfg(feature = "user")]
            unsafe impl aya::Pod for $t {}
        )*
    };
}

mod bandwidth;
mod endpoints;
mod host_ports;
mod ip;
mod masquerade;
mod names;
mod node;
pub mod pin;
mod programs;
mod services;
mod source_check;
mod trace;
mod tunnel;

pub use bandwidth::*;
pub use endpoints::*;
pub use host_ports::*;
pub use ip::*;
pub use masquerade::*;
pub use names::str_eq;
pub use node::*;
pub use programs::*;
pub use services::*;
pub use source_check::*;
pub use trace::*;
pub use tunnel::*;

/// A node-wide map as user space handles it: a hash, LRU hash or LPM trie (looked up by key), or an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeMap {
    pub name: &'static str,
    /// An array, which the programs index by constant: it keeps its size where user space
    /// shrinks the others (the load probe loads into throw-away maps of a few entries).
    pub array: bool,
}

impl NodeMap {
    const fn keyed(name: &'static str) -> Self {
        Self { name, array: false }
    }

    const fn array(name: &'static str) -> Self {
        Self { name, array: true }
    }
}

/// Every node-wide map, pinned under the node's `maps/` directory: the load pins these, the
/// load probe shrinks them, and `inspect`/`metrics` report each one's use against its size.
pub const NODE_MAPS: [NodeMap; 30] = [
    NodeMap::keyed(ENDPOINTS_MAP),
    NodeMap::keyed(POD_COUNTERS_MAP),
    NodeMap::array(TRACE_MAP),
    NodeMap::keyed(RATE_LIMITS_MAP),
    NodeMap::keyed(PORTMAP_MAP),
    NodeMap::keyed(PORTMAP_HITS_MAP),
    NodeMap::keyed(NAT_REV_MAP),
    NodeMap::keyed(NAT_FRAG_MAP),
    NodeMap::keyed(SOCK_REV_MAP),
    NodeMap::keyed(NODE_ADDRS_MAP),
    NodeMap::array(CONFIG_MAP),
    NodeMap::keyed(PACING_MAP),
    NodeMap::keyed(MASQ_FWD_MAP),
    NodeMap::keyed(MASQ_REV_MAP),
    NodeMap::keyed(MASQ_SKIP_MAP),
    NodeMap::keyed(MASQ_SRC_MAP),
    NodeMap::array(MASQ_STATS_MAP),
    NodeMap::keyed(MASQ_FRAG_MAP),
    NodeMap::keyed(MASQ_FRAG6_MAP),
    NodeMap::array(NS_PROBE_MAP),
    NodeMap::keyed(SHAPE_SUBNETS_MAP),
    NodeMap::keyed(SOURCES_MAP),
    NodeMap::keyed(SERVICES_NETS_MAP),
    NodeMap::keyed(SERVICES_FLOWS_MAP),
    NodeMap::array(SERVICES_STATS_MAP),
    NodeMap::keyed(TUNNEL_PEERS_MAP),
    NodeMap::keyed(TUNNEL_NODES_MAP),
    NodeMap::array(TUNNEL_CONFIG_MAP),
    NodeMap::array(TUNNEL_STATS_MAP),
    NodeMap::keyed(TUNNEL_PEER_STATS_MAP),
];
