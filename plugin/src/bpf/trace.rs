//! `ebpf-cni trace`: streams the programs' aya-log lines while it runs. The programs log
//! only while the node's trace flag is set, so an untraced fast path pays one array lookup.

use std::{
    os::fd::AsRawFd,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use aya::{
    maps::{Array, Map, MapData},
    programs::SchedClassifier,
};
use ebpf_cni_maps::TRACE_MAP;

use super::{pin::PinRoot, revision, BpfError, Hook, NodeId};

/// Prints each record on stdout.
struct Printer;

impl log::Log for Printer {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        println!("{} {}", r.level(), r.args());
    }
    fn flush(&self) {}
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
    let id = prog
        .info()
        .map_err(|source| BpfError::OpenProgram {
            path: prog_path.clone(),
            source: Box::new(source),
        })?
        .id();
    let mut logger = aya_log::EbpfLogger::init_from_id_with_logger(id, Printer).map_err(|e| {
        BpfError::PinMissing {
            what: "aya-log ring buffer",
            path: prog_path.join(e.to_string()),
        }
    })?;
    set_flag(&root, node, true)?;
    let started = Instant::now();
    let result = loop {
        if stop.load(Ordering::Relaxed) || duration.is_some_and(|d| started.elapsed() >= d) {
            break Ok(());
        }
        let mut pfd = libc::pollfd {
            fd: logger.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; a timeout keeps the stop flag responsive.
        let n = unsafe { libc::poll(&mut pfd, 1, 200) };
        if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            break Err(BpfError::OpenPin {
                path: root.map(node, "AYA_LOGS"),
                source: std::io::Error::last_os_error(),
            });
        }
        logger.flush();
    };
    set_flag(&root, node, false)?;
    result
}
