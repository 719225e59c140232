//! `ebpf-cni trace`: prints the programs' decisions while it runs. The programs write a
//! [`TraceNote`] for each decision to their ring buffer only while the node's trace flag is
//! set, so an untraced fast path pays one array lookup; this writes the lines.

use std::{
    os::fd::AsRawFd,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use aya::{
    maps::{Array, Map, MapData, MapInfo, RingBuf},
    programs::SchedClassifier,
};
use ebpf_cni_maps::{
    TraceNote, NOTE_ARP_ANSWERED, NOTE_FIB, NOTE_MAC_DROPPED, NOTE_REDIRECT_PEER, NOTE_SERVICES,
    NOTE_SOURCE_DROPPED, NOTE_TO_STACK, TRACE_MAP, TRACE_RING_MAP,
};

use super::{pin::PinRoot, revision, BpfError, Hook, NodeId};

/// The line of one note, as `ebpf-cni trace` prints it.
fn line(n: &TraceNote) -> String {
    let me = n.ifindex;
    match n.what {
        NOTE_REDIRECT_PEER => format!(
            "if {me}: redirect_peer to pod behind if {} (rc {})",
            n.target, n.rc
        ),
        NOTE_SOURCE_DROPPED => format!("if {me}: from pod, dropped: source address not the pod's"),
        NOTE_MAC_DROPPED => format!("if {me}: from pod, dropped: source MAC not the pod's"),
        NOTE_TO_STACK => format!("if {me}: from pod, to the stack"),
        NOTE_SERVICES => format!("if {me}: from pod, a Service flow: to the stack"),
        NOTE_ARP_ANSWERED => format!("if {me}: answered ARP for the pod's gateway"),
        NOTE_FIB => format!("if {me}: fib lookup rc {} out if {}", n.rc, n.target),
        other => format!("if {me}: decision {other} (this binary does not know it)"),
    }
}

/// A note from the ring's bytes (`None`: not a note's size).
fn note_of(bytes: &[u8]) -> Option<TraceNote> {
    if bytes.len() != std::mem::size_of::<TraceNote>() {
        return None;
    }
    // SAFETY: the size is checked; `TraceNote` is plain integers (`aya::Pod`), so any bytes
    // are a valid value, and the read is unaligned.
    Some(unsafe { bytes.as_ptr().cast::<TraceNote>().read_unaligned() })
}

fn set_flag(root: &PinRoot, node: &NodeId, on: bool) -> Result<(), BpfError> {
    let path = root.map(node, TRACE_MAP);
    let err = |source| BpfError::OpenMap {
        path: path.clone(),
        source: Box::new(source),
    };
    let data = MapData::from_pin(&path).map_err(err)?;
    let mut flag: Array<MapData, u32> = Array::try_from(Map::Array(data)).map_err(err)?;
    flag.set(0, u32::from(on), 0)
        .map_err(|source| BpfError::MapUpdate {
            map: TRACE_MAP,
            what: "set the trace flag".into(),
            source: Box::new(source),
        })
}

/// Streams log lines until `stop` is set or `duration` has passed.
pub fn trace(node: &NodeId, duration: Option<Duration>, stop: &AtomicBool) -> Result<(), BpfError> {
    let root = PinRoot::from_env();
    let prog_path = root.program(node, revision(), Hook::FromPod.program());
    let prog = SchedClassifier::from_pin(&prog_path).map_err(|source| BpfError::OpenProgram {
        path: prog_path.clone(),
        source: Box::new(source),
    })?;
    let map_err = |source| BpfError::OpenMap {
        path: prog_path.join(TRACE_RING_MAP),
        source: Box::new(source),
    };
    let ring_id = prog
        .info()
        .and_then(|i| i.map_ids())
        .map_err(|source| BpfError::OpenProgram {
            path: prog_path.clone(),
            source: Box::new(source),
        })?
        .unwrap_or_default()
        .into_iter()
        .find(|id| MapInfo::from_id(*id).is_ok_and(|m| m.name_as_str() == Some(TRACE_RING_MAP)))
        .ok_or_else(|| BpfError::PinMissing {
            what: "the programs' trace ring buffer",
            path: prog_path.join(TRACE_RING_MAP),
        })?;
    let mut ring = RingBuf::try_from(Map::RingBuf(MapData::from_id(ring_id).map_err(map_err)?))
        .map_err(map_err)?;
    // Notes of an earlier trace that stopped before reading them all.
    while ring.next().is_some() {}
    set_flag(&root, node, true)?;
    let started = Instant::now();
    let result = loop {
        if stop.load(Ordering::Relaxed) || duration.is_some_and(|d| started.elapsed() >= d) {
            break Ok(());
        }
        let mut pfd = libc::pollfd {
            fd: ring.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; a timeout keeps the stop flag responsive.
        let n = unsafe { libc::poll(&mut pfd, 1, 200) };
        if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            break Err(BpfError::OpenPin {
                path: prog_path.join(TRACE_RING_MAP),
                source: std::io::Error::last_os_error(),
            });
        }
        while let Some(item) = ring.next() {
            if let Some(n) = note_of(&item) {
                println!("{}", line(&n));
            }
        }
    };
    set_flag(&root, node, false)?;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(what: u32, rc: i64) -> TraceNote {
        TraceNote {
            rc,
            what,
            ifindex: 12,
            target: 7,
            _pad: 0,
        }
    }

    #[test]
    fn each_note_reads_as_the_line_the_programs_used_to_log() {
        assert_eq!(
            line(&note(NOTE_REDIRECT_PEER, 7)),
            "if 12: redirect_peer to pod behind if 7 (rc 7)"
        );
        assert_eq!(
            line(&note(NOTE_SOURCE_DROPPED, 0)),
            "if 12: from pod, dropped: source address not the pod's"
        );
        assert_eq!(
            line(&note(NOTE_MAC_DROPPED, 0)),
            "if 12: from pod, dropped: source MAC not the pod's"
        );
        assert_eq!(
            line(&note(NOTE_TO_STACK, 0)),
            "if 12: from pod, to the stack"
        );
        assert_eq!(
            line(&note(NOTE_ARP_ANSWERED, 0)),
            "if 12: answered ARP for the pod's gateway"
        );
        assert_eq!(
            line(&note(NOTE_FIB, -1)),
            "if 12: fib lookup rc -1 out if 7"
        );
        assert_eq!(
            line(&note(99, 0)),
            "if 12: decision 99 (this binary does not know it)"
        );
    }

    #[test]
    fn only_a_notes_size_is_read_as_a_note() {
        let n = note(NOTE_FIB, 3);
        // SAFETY: a plain-integer struct viewed as its bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&raw const n).cast::<u8>(),
                std::mem::size_of::<TraceNote>(),
            )
        };
        assert_eq!(note_of(bytes), Some(n));
        assert_eq!(note_of(&bytes[..16]), None);
    }
}
