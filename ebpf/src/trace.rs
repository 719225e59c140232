//! What `ebpf-cni trace` shows: while it listens (the node's trace flag is set), a program
//! writes each decision it makes for a packet to a ring buffer as a [`TraceNote`], and
//! user space writes the line.
//!
//! The programs used to log the line themselves with aya-log. Its formatting code is a few
//! thousand verified instructions a call, and the verifier walks a call on every path that
//! reaches it (the flag is unknown to it): six calls made `ecni_from_pod` 122,848 verified
//! instructions against 91,521 without them, and `ecni_from_chain` twice its size, which
//! every node's first ADD paid. A note is one helper call.

use aya_ebpf::{macros::map, maps::RingBuf};
use ebpf_cni_maps::{
    str_eq, TraceNote, NOTE_ARP_ANSWERED, NOTE_FIB, NOTE_MAC_DROPPED, NOTE_REDIRECT_PEER,
    NOTE_SERVICES, NOTE_SOURCE_DROPPED, NOTE_TO_STACK,
};

use crate::maps::tracing;

/// What a program decided, with the figures its line shows.
#[derive(Clone, Copy)]
pub enum Note {
    /// On device `.0`, redirected into the pod behind host veth `.1`; `bpf_redirect_peer`
    /// answered `.2`.
    RedirectPeer(u32, u32, i64),
    /// Dropped: the pod behind host veth `.0` sent from an address not its own.
    SourceDropped(u32),
    /// Dropped: the pod behind host veth `.0` sent from a MAC not its own.
    MacDropped(u32),
    /// What the pod behind host veth `.0` sent goes on to the stack.
    ToStack(u32),
    /// The ARP request of the pod behind host veth `.0` for its gateway, answered.
    ArpAnswered(u32),
    /// The FIB's answer `.1` (egress device `.2`) for a packet of the pod behind `.0`.
    Fib(u32, i64, u32),
    /// What the pod behind host veth `.0` sent is a Service flow's: to the stack.
    Services(u32),
}

/// 64 KiB: 2,048 notes between two reads of `ebpf-cni trace` (it reads every 200 ms);
/// notes that find it full are lost, the packets are not.
#[map]
static ECNI_TRACE_RING: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);
const _: () = assert!(str_eq(
    ebpf_cni_maps::TRACE_RING_MAP,
    stringify!(ECNI_TRACE_RING)
));

/// Writes `note` for user space while a trace listens.
#[inline(always)]
pub fn note(note: Note) {
    if !tracing() {
        return;
    }
    let (what, ifindex, target, rc) = match note {
        Note::RedirectPeer(me, to, rc) => (NOTE_REDIRECT_PEER, me, to, rc),
        Note::SourceDropped(me) => (NOTE_SOURCE_DROPPED, me, 0, 0),
        Note::MacDropped(me) => (NOTE_MAC_DROPPED, me, 0, 0),
        Note::ToStack(me) => (NOTE_TO_STACK, me, 0, 0),
        Note::ArpAnswered(me) => (NOTE_ARP_ANSWERED, me, 0, 0),
        Note::Fib(me, rc, out) => (NOTE_FIB, me, out, rc),
        Note::Services(me) => (NOTE_SERVICES, me, 0, 0),
    };
    // A full ring loses the note, not the packet.
    let _ = ECNI_TRACE_RING.output::<TraceNote>(
        TraceNote {
            rc,
            what,
            ifindex,
            target,
            _pad: 0,
        },
        0,
    );
}
