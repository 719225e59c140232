//! The benchmark's eBPF object (the plugin's programs and the prototypes the plugin's own
//! object leaves out) loaded into one bench node's pinned maps, for the programs the plugin
//! itself never loads (the XDP prototype, the routing floor): they see the node's endpoints
//! and host ports as its own programs do.

use anyhow::{Context as _, Result};
use aya::{Ebpf, EbpfLoader};

use super::topo::{BenchNode, Binaries};

/// The benchmark's object staged beside the benchmarked plugin, its maps those `node`
/// pinned; no program is verified yet.
pub fn on_node(bins: &Binaries, node: &BenchNode) -> Result<Ebpf> {
    let obj = xtask::build::staged_prototypes(&bins.ebpf_cni);
    let bytes = std::fs::read(&obj).with_context(|| format!("reading {}", obj.display()))?;
    let mut loader = EbpfLoader::new();
    // As the plugin loads it: no CO-RE relocations to resolve against the kernel's BTF.
    loader.btf(None);
    for map in ebpf_cni_maps::NODE_MAPS {
        loader.map_pin_path(
            map.name,
            ebpf_cni_tests::dataplane::map_pin(&node.node, map.name),
        );
    }
    loader
        .load(&bytes)
        .with_context(|| format!("loading {}", obj.display()))
}
