//! What a capability is ([`Capability`]) and what its steps work with: the node's pins and
//! maps under the lock, for ADD ([`Install`]), CHECK ([`Check`]) and removal ([`Removal`]).

use std::net::IpAddr;

use super::spec::{PodSpec, Veth};
use crate::bpf::{
    converge::NodeView,
    maps::{host_ports::PortMaps, Maps},
    pin::{AttachmentPins, NodeId, PinRoot},
    placement::Placement,
    AttachmentKey, BpfError,
};

/// One capability of a pod's dataplane: its part of [`PodSpec`] into the kernel, compared,
/// and taken out again.
pub(in crate::bpf) trait Capability: Sync {
    /// Its name in logs.
    fn name(&self) -> &'static str;
    /// ADD, under the node lock, before the pod's programs attach. A failure may leave part
    /// of it: [`Capability::remove`] takes that away.
    fn install(&self, pod: &PodSpec, veth: &Veth, cx: &mut Install<'_>) -> Result<(), BpfError>;
    /// CHECK: the kernel holds the part as `install` left it.
    fn check(&self, pod: &PodSpec, veth: &Veth, cx: &Check<'_>) -> Result<(), BpfError>;
    /// DEL, GC and the undo of a failed ADD: removes the attachment's part, whatever of it
    /// is there (idempotent). `Ok(true)`: something was removed.
    fn remove(&self, cx: &mut Removal<'_>) -> Result<bool, BpfError>;
}

/// What an ADD's install works with; the node lock is held.
pub(in crate::bpf) struct Install<'a> {
    pub root: &'a PinRoot,
    pub node: &'a NodeId,
    pub key: &'a AttachmentKey<'a>,
    pub pins: &'a AttachmentPins,
    pub maps: &'a mut Maps,
    /// The host-port maps, once something of this ADD opened them (the node's convergence
    /// reads them before the capabilities run): opened once per ADD, not once per use.
    pub ports: &'a mut Option<PortMaps>,
    /// The node as ADD found it (its addresses, masquerade's sources).
    pub view: &'a NodeView,
}

/// What CHECK compares with.
pub(in crate::bpf) struct Check<'a> {
    pub root: &'a PinRoot,
    pub node: &'a NodeId,
    pub key: &'a AttachmentKey<'a>,
    pub pins: &'a AttachmentPins,
    pub maps: &'a Maps,
}

/// What a removal works from: the attachment's pins and what its endpoint entries name
/// (DEL finds them in the map; a failed ADD knows them from its spec). The node lock is
/// held.
pub(in crate::bpf) struct Removal<'a> {
    pub root: &'a PinRoot,
    pub node: &'a NodeId,
    pub key: &'a AttachmentKey<'a>,
    pub pins: &'a AttachmentPins,
    /// `None`: the node's maps could not be opened (that failure is DEL's already).
    pub maps: Option<&'a mut Maps>,
    /// The pod's host veth, if any entry names it.
    pub host_ifindex: Option<u32>,
    /// The pod's addresses.
    pub ips: Vec<IpAddr>,
    /// Where its entries are, from its placement record or the failed ADD's plan: `None`
    /// (a pod of a release before the record) and the removals walk the maps for them.
    pub placement: Option<Placement>,
}
