//! A pod's dataplane, one capability at a time. [`PodSpec`] is what a pod's dataplane
//! holds, one part per capability, built once from the request (by `attachment::pod_spec`)
//! and used by ADD, CHECK and chained mode alike; [`Veth`] is where it goes. Each
//! capability is one module with one [`Capability`] implementation, which installs its part
//! (ADD), compares the kernel with it (CHECK) and removes it (DEL, GC and a failed ADD,
//! from the pins and the endpoint entries alone, without the spec). `pod.rs` walks
//! [`CAPABILITIES`] for all three: adding a capability is a module here and one line in
//! that list (docs/development.md, "How to add a capability").

mod bandwidth;
mod endpoints;
mod host_ports;
mod masquerade;
mod source_check;
mod spec;
mod unit;

pub use bandwidth::pacing_rate;
pub(super) use source_check::record as source_record;
pub use spec::{LimitSpec, PodIp, PodSpec, Veth};
pub(super) use unit::{Capability, Check, Install, Removal};

use super::BpfError;

/// The capabilities in the order ADD installs them; DEL and a failed ADD remove them in
/// the reverse order, CHECK compares them in this one. The endpoints come first: the other
/// parts are keyed by the attachment and its host veth, and a pod whose endpoint entries
/// are gone is gone for the programs.
pub(super) const CAPABILITIES: &[&dyn Capability] = &[
    &endpoints::Endpoint,
    &source_check::Sources,
    &bandwidth::Limits,
    &masquerade::Masquerade,
    &host_ports::HostPorts,
];

/// Removes every capability's part of the attachment, in the reverse of ADD's order, each
/// tried past the failures of the others. Returns whether anything was removed, and the
/// failures.
pub(super) fn remove_all(cx: &mut Removal<'_>) -> (bool, Vec<BpfError>) {
    let mut removed = false;
    let mut failures = Vec::new();
    for cap in CAPABILITIES.iter().rev() {
        match cap.remove(cx) {
            Ok(r) => removed |= r,
            Err(e) => failures.push(e),
        }
    }
    (removed, failures)
}
