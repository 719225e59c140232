//! A pod's source check: its mode, the MAC and prefixes it may send from, and the frames
//! dropped for another source address or MAC.

use super::part::{with, Exposition, Text};
use crate::bpf::SourceCheckReport;

pub struct PodSources<'a> {
    pub check: &'a SourceCheckReport,
    /// Frames from the pod dropped for their source address and for their MAC, where the
    /// pod has counters.
    pub drops: Option<(u64, u64)>,
}

const DROPS: &str = "ebpf_cni_pod_source_drops_total";
const MODE: &str = "ebpf_cni_pod_source_check";

/// The pods' source-check families (declared with none).
pub fn declare(e: &mut Exposition) {
    // Each reason its own series (`drops` stays the limiter's, as dashboards read it).
    e.family(
        DROPS,
        "counter",
        "Frames from the pod dropped by the source check, by reason: address (a source address the pod may not send from, or none readable), mac (a source MAC other than the pod interface's).",
    )
    .family(
        MODE,
        "gauge",
        "1 for the pod's source check mode: on, off, unchecked (attached by a release before the check) or missing (its entries are gone).",
    );
}

impl PodSources<'_> {
    pub fn inspect(&self, t: &mut Text) {
        let Self {
            check: SourceCheckReport { mode, mac, allowed },
            drops,
        } = self;
        let (by_addr, by_mac) = drops.unwrap_or((0, 0));
        let what = match (*mode, mac) {
            ("on", Some(mac)) => format!("on, MAC {mac}, from {}", allowed.join(", ")),
            ("unchecked", _) => "unchecked (attached by a release before the check)".to_owned(),
            (mode, _) => mode.to_owned(),
        };
        t.line(format!(
            "      sources   {what}; dropped {by_addr} (address), {by_mac} (MAC)"
        ));
    }

    /// Series of one pod, labelled `labels`. The MAC and prefixes are configuration:
    /// inspect's only.
    pub fn metrics(&self, labels: &[(&'static str, &str)], e: &mut Exposition) {
        let Self {
            check:
                SourceCheckReport {
                    mode,
                    mac: _,
                    allowed: _,
                },
            drops,
        } = self;
        if let Some((address, mac)) = drops {
            for (reason, v) in [("address", address), ("mac", mac)] {
                e.sample(DROPS, &with(labels, &[("reason", reason)]), v);
            }
        }
        e.sample(MODE, &with(labels, &[("mode", mode)]), 1);
    }
}
