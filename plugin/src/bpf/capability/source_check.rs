//! The source check: what the pod may send from, in the source map, and the attachment's
//! record of whether it is on (see `maps/source_check.rs`).

use super::{
    spec::{PodSpec, Veth},
    unit::{Capability, Check, Install, Removal},
};
use crate::bpf::{
    maps::SourceRecord,
    pin::{create_dir_all_racy, walk, AttachmentPins},
    placement::PlacedSources,
    BpfError,
};

pub(super) struct Sources;

/// What the attachment's record says ADD did about its source check.
pub(in crate::bpf) fn record(pins: &AttachmentPins) -> SourceRecord {
    if walk(&pins.source_check_record(true)).exists() {
        SourceRecord::On
    } else if walk(&pins.source_check_record(false)).exists() {
        SourceRecord::Off
    } else {
        SourceRecord::None
    }
}

impl Capability for Sources {
    fn name(&self) -> &'static str {
        "source check"
    }

    fn install(&self, pod: &PodSpec, veth: &Veth, cx: &mut Install<'_>) -> Result<(), BpfError> {
        // Before the programs attach: the pod's first frame is checked. The record says
        // whether CHECK must find entries (a pod of an older release has neither).
        create_dir_all_racy(&cx.pins.source_check_record(pod.sources.is_some()))?;
        cx.maps
            .install_sources(cx.key.id(), veth.host_ifindex, &pod.source_check(veth))
    }

    fn check(&self, pod: &PodSpec, veth: &Veth, cx: &Check<'_>) -> Result<(), BpfError> {
        // A pod attached by a release before the source check has no record and no
        // entries: it keeps running unchecked until its next ADD, and that is its correct
        // state.
        cx.maps.check_sources(
            cx.key.id(),
            veth.host_ifindex,
            &pod.source_check(veth),
            record(cx.pins),
        )
    }

    /// The record goes with the attachment's directory. The entries are looked up by key
    /// where the placement says the pod has only its own addresses and its catch-all;
    /// else the map is walked for the attachment's id.
    fn remove(&self, cx: &mut Removal<'_>) -> Result<bool, BpfError> {
        let Some(maps) = cx.maps.as_deref_mut() else {
            return Ok(false);
        };
        let id = cx.key.id();
        let gone = match &cx.placement {
            Some(p) if p.sources == PlacedSources::Off => 0,
            Some(p) if p.sources == PlacedSources::Own => {
                maps.remove_own_sources(id, p.host_ifindex, &p.ips)?
            }
            _ => maps.remove_sources(id)?,
        };
        Ok(gone > 0)
    }
}
