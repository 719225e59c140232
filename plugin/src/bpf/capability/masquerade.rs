//! Masquerade (`ipMasq`): the node-wide translation the pod's traffic to outside
//! destinations takes (its skip ranges, port range and sources, `masquerade.rs`); the pod's
//! endpoint entries carry the flag that sends it there (`endpoints.rs`).

use super::{
    spec::{PodSpec, Veth},
    unit::{Capability, Check, Install, Removal},
};
use crate::bpf::{masquerade::MasqMaps, BpfError};

pub(super) struct Masquerade;

impl Capability for Masquerade {
    fn name(&self) -> &'static str {
        "masquerade"
    }

    fn install(&self, pod: &PodSpec, _: &Veth, cx: &mut Install<'_>) -> Result<(), BpfError> {
        let Some(spec) = &pod.masq else {
            return Ok(());
        };
        let mut m = MasqMaps::open(cx.root, cx.node)?.ok_or_else(|| BpfError::PinMissing {
            what: "masquerade maps (programs of an older revision: reload them)",
            path: cx.root.map(cx.node, ebpf_cni_maps::MASQ_FWD_MAP),
        })?;
        m.install(spec, &cx.view.masq_sources())
    }

    fn check(&self, pod: &PodSpec, _: &Veth, cx: &Check<'_>) -> Result<(), BpfError> {
        let Some(spec) = &pod.masq else {
            return Ok(());
        };
        MasqMaps::open(cx.root, cx.node)?
            .ok_or_else(|| BpfError::PinMissing {
                what: "masquerade maps",
                path: cx.root.map(cx.node, ebpf_cni_maps::MASQ_FWD_MAP),
            })?
            .check(spec)
    }

    /// The pod's flows go, so a pod that gets the address next inherits none; when no other
    /// pod of the node masquerades, the node stops masquerading (see [`MasqMaps::release`]).
    fn remove(&self, cx: &mut Removal<'_>) -> Result<bool, BpfError> {
        let Some(maps) = cx.maps.as_deref() else {
            return Ok(false);
        };
        let Some(mut m) = MasqMaps::open(cx.root, cx.node)? else {
            return Ok(false);
        };
        // A node that does not masquerade holds no flow of a live pod: the flag goes on
        // with its first masquerading pod and off with the last, after that pod's flows.
        // Skipped there, the walk of the whole flow table (a large hash, ~0.5 ms even
        // when empty) is paid on masquerading nodes only.
        let n = if m.engaged() {
            m.remove_flows(&cx.ips)
        } else {
            0
        };
        if n > 0 {
            log::debug!("removed {n} masqueraded flows of {:?}", cx.ips);
        }
        // Off, the flag says no pod of the node masquerades: no walk of the endpoints to
        // learn it again.
        if !m.engaged() || !maps.any_masq_besides(cx.key.id()) {
            m.release()?;
        }
        Ok(n > 0)
    }
}
