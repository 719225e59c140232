//! Types and names shared between the kernel-side programs (`ebpf/`) and user space
//! (`plugin/`).
//!
//! Every map value crosses the kernel boundary as raw bytes, so each type here is
//! `#[repr(C)]`, lists its fields large to small, spells out any padding as `_pad` fields and
//! asserts its size at compile time: a layout change must be a deliberate edit here, never an
//! accident of field order. Map and program names are BPF object names, which the kernel cuts
//! at 15 bytes, so they are checked for length too.
#![no_std]

/// Name of the per-CPU array of [`TrafficCounters`], indexed by `DIR_*`.
pub const COUNTERS_MAP: &str = "ECNI_COUNTERS";

/// TC classifier attached at the host veth's ingress: traffic leaving the pod.
pub const PROG_FROM_POD: &str = "ecni_from_pod";
/// TC classifier attached at the host veth's egress: traffic going into the pod.
pub const PROG_TO_POD: &str = "ecni_to_pod";

/// Index into [`COUNTERS_MAP`]: packets seen at host veth ingress (sent by the pod).
pub const DIR_FROM_POD: u32 = 0;
/// Index into [`COUNTERS_MAP`]: packets seen at host veth egress (sent to the pod).
pub const DIR_TO_POD: u32 = 1;
/// Number of entries of [`COUNTERS_MAP`].
pub const DIR_COUNT: u32 = 2;

/// Names of the directories and files under the bpffs mount point. The plugin's `bpf::pin`
/// module assembles them into paths; nothing else spells them out.
pub mod pin {
    /// Directory of this project directly under the bpffs mount point.
    pub const PROJECT_DIR: &str = "ebpf-cni";
    /// Layout version: a binary that changes what it pins bumps this, so it never misreads
    /// pins left by an older one.
    pub const LAYOUT_VERSION_DIR: &str = "v1";
    /// Prefix of the per-node directory, followed by the node's netns inode.
    pub const NODE_DIR_PREFIX: &str = "netns-";
    /// Directory holding one sub-tree `<network>/<container id>/<ifname>/` per attachment.
    pub const ATTACHMENTS_DIR: &str = "attachments";
    /// The pinned TCX link of [`PROG_FROM_POD`](super::PROG_FROM_POD).
    pub const LINK_FROM_POD: &str = "link_from_pod";
    /// The pinned TCX link of [`PROG_TO_POD`](super::PROG_TO_POD).
    pub const LINK_TO_POD: &str = "link_to_pod";
    /// The pinned [`COUNTERS_MAP`](super::COUNTERS_MAP) of the attachment.
    pub const COUNTERS: &str = "counters";
}

/// Packet and byte counts of one direction on one CPU (value of [`COUNTERS_MAP`]).
/// `bytes` counts `skb->len`, i.e. from the Ethernet header on.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrafficCounters {
    pub packets: u64,
    pub bytes: u64,
}

const _: () = assert!(core::mem::size_of::<TrafficCounters>() == 16);

// SAFETY: `repr(C)`, only `u64` fields and no padding (asserted above), so every bit pattern
// is a valid value.
#[cfg(feature = "user")]
unsafe impl aya::Pod for TrafficCounters {}

/// The kernel keeps 15 bytes of an object name (`BPF_OBJ_NAME_LEN` is 16 with the NUL); a
/// longer name would show up cut in bpftool and in the program info that CHECK compares.
const fn fits_bpf_obj_name(name: &str) -> bool {
    name.len() <= 15
}

const _: () = assert!(fits_bpf_obj_name(COUNTERS_MAP));
const _: () = assert!(fits_bpf_obj_name(PROG_FROM_POD));
const _: () = assert!(fits_bpf_obj_name(PROG_TO_POD));

/// `a == b` usable in constants, so the kernel-side crate can assert at compile time that the
/// identifiers it declares (which become the object names) match the names above.
pub const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}
