//! The node itself: its pin directory, the program revisions pinned, the kernel and how each
//! part of the dataplane runs on it; and the node maps' use against their size.

use super::part::{heading, Exposition, Part, Text};
use crate::bpf::{kernel::PartMode, ConvergeRecord, MapUsageReport};

pub struct Node<'a> {
    pub node: &'a str,
    pub pin_dir: &'a str,
    pub revisions: &'a [String],
    pub kernel: &'a str,
    pub modes: &'a [PartMode],
    /// The last convergence to the node's devices and addresses that changed something.
    pub converged: &'a Option<ConvergeRecord>,
}

impl Part for Node<'_> {
    fn inspect(&self, t: &mut Text) {
        let Self {
            node,
            pin_dir,
            revisions,
            kernel,
            modes,
            converged,
        } = self;
        t.line(format!("node {node} ({pin_dir})"));
        t.line(format!(
            "program revisions: {}",
            if revisions.is_empty() {
                "none loaded".into()
            } else {
                revisions.join(", ")
            }
        ));
        t.line(format!("kernel {kernel}:"));
        for PartMode {
            part,
            mode,
            degraded,
        } in *modes
        {
            let flag = if *degraded { " (degraded)" } else { "" };
            t.line(format!("  {part:<42} {mode}{flag}"));
        }
        match converged {
            Some(c) => t.line(format!("converged: {} by {}", c.at(), c.by)),
            None => t.line("converged: never recorded"),
        }
    }

    fn metrics(&self, e: &mut Exposition) {
        // The node's name and pin directory are the scrape target's own: no series.
        let Self {
            node: _,
            pin_dir: _,
            revisions,
            kernel,
            modes,
            converged,
        } = self;
        let name = "ebpf_cni_node_converged_timestamp_seconds";
        e.family(
            name,
            "gauge",
            "When ADD, STATUS or the agent last changed the node to follow its devices and addresses (Unix time), by what; absent when never recorded.",
        );
        if let Some(ConvergeRecord { at_unix_ms, by }) = converged {
            // Milliseconds as seconds: exact in an f64 for any date of this era.
            e.sample(name, &[("by", by)], *at_unix_ms as f64 / 1000.0);
        }
        let name = "ebpf_cni_programs_info";
        e.family(
            name,
            "gauge",
            "1 for each revision of the eBPF programs pinned on the node (new pods get the newest).",
        );
        for rev in *revisions {
            e.sample(name, &[("revision", rev)], 1);
        }
        let name = "ebpf_cni_kernel_info";
        e.family(name, "gauge", "1, labelled with the kernel release.");
        e.sample(name, &[("release", kernel)], 1);
        let name = "ebpf_cni_kernel_part_degraded";
        e.family(
            name,
            "gauge",
            "1 when a part of the dataplane runs with less on this kernel (see inspect), else 0.",
        );
        // The mode's text is inspect's: a label of free text would change with wording.
        for PartMode {
            part,
            mode: _,
            degraded,
        } in *modes
        {
            e.sample(name, &[("part", part)], u8::from(*degraded));
        }
    }
}

/// Each pinned node map's use against its size.
pub struct Maps<'a> {
    pub maps: &'a [MapUsageReport],
}

impl Part for Maps<'_> {
    fn inspect(&self, t: &mut Text) {
        let Self { maps } = self;
        heading(
            t,
            "node maps (entries / max; LRU maps evict their oldest when full):",
            maps.is_empty(),
        );
        for MapUsageReport {
            name,
            entries,
            max_entries,
        } in *maps
        {
            t.line(format!("  {name:<32} {entries} / {max_entries}"));
        }
    }

    fn metrics(&self, e: &mut Exposition) {
        let Self { maps } = self;
        let name = "ebpf_cni_map_entries";
        e.family(
            name,
            "gauge",
            "Entries in each node map (arrays count as full; LRU maps evict their oldest entries when full).",
        );
        for m in *maps {
            e.sample(name, &[("map", m.name)], m.entries);
        }
        let name = "ebpf_cni_map_max_entries";
        e.family(name, "gauge", "Capacity of each node map.");
        for MapUsageReport {
            name: map,
            entries: _,
            max_entries,
        } in *maps
        {
            e.sample(name, &[("map", map)], max_entries);
        }
    }
}
