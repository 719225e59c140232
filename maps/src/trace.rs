//! `ebpf-cni trace`: the notes the programs write about their decisions while a trace runs.

/// Node-wide array with one `u32`: non-zero while `ebpf-cni trace` runs. The programs
/// write [`TraceNote`]s to [`TRACE_RING_MAP`] only then, so tracing costs one array lookup
/// when off.
pub const TRACE_MAP: &str = "ECNI_TRACE";

/// Ring buffer of [`TraceNote`]s, one per decision the programs make while a trace runs.
/// Not pinned: each load of the programs has its own, and `ebpf-cni trace` finds it among
/// the maps `ecni_from_pod` uses.
pub const TRACE_RING_MAP: &str = "ECNI_TRACE_RING";

/// One decision of a program while `ebpf-cni trace` runs (a record of [`TRACE_RING_MAP`]):
/// which decision (`what`, one of the `NOTE_*` below) and its figures; user space writes
/// the line. The programs log nothing themselves: a log call's formatting code is walked by
/// the verifier on every path to it, which made `ecni_from_pod` a quarter more work to load.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceNote {
    /// A helper's answer (`NOTE_REDIRECT_PEER`: `bpf_redirect_peer`'s, `NOTE_FIB`: the FIB
    /// lookup's), else 0.
    pub rc: i64,
    pub what: u32,
    /// The device the program runs on.
    pub ifindex: u32,
    /// `NOTE_REDIRECT_PEER`: the destination pod's host veth; `NOTE_FIB`: the egress
    /// device the FIB chose; else 0.
    pub target: u32,
    pub _pad: u32,
}

const _: () = assert!(core::mem::size_of::<TraceNote>() == 24);

/// [`TraceNote::what`]: redirected into the pod behind host veth `target`.
pub const NOTE_REDIRECT_PEER: u32 = 1;
/// [`TraceNote::what`]: dropped, the pod sent from an address not its own.
pub const NOTE_SOURCE_DROPPED: u32 = 2;
/// [`TraceNote::what`]: dropped, the pod sent from a MAC not its own.
pub const NOTE_MAC_DROPPED: u32 = 3;
/// [`TraceNote::what`]: what the pod sent goes on to the stack.
pub const NOTE_TO_STACK: u32 = 4;
/// [`TraceNote::what`]: the pod's ARP request for its gateway answered.
pub const NOTE_ARP_ANSWERED: u32 = 5;
/// [`TraceNote::what`]: the FIB's answer `rc` for a packet of the pod, egress `target`.
pub const NOTE_FIB: u32 = 6;
/// [`TraceNote::what`]: what the pod sent belongs to a Service flow and goes to the stack.
pub const NOTE_SERVICES: u32 = 7;

plain_old_data!(TraceNote);

const _: () = assert!(crate::names::fits_bpf_obj_name(TRACE_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(TRACE_RING_MAP));
