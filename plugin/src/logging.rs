//! Logging to stderr (or a file), never stdout: stdout carries the CNI result.
//! `EBPF_CNI_LOG` sets the level (error, warn, info, debug, trace; default warn);
//! `EBPF_CNI_LOG_FILE` appends to a file instead of stderr.

use std::{fs::OpenOptions, io::Write, sync::Mutex};

use log::{LevelFilter, Log, Metadata, Record};

struct Logger {
    file: Option<Mutex<std::fs::File>>,
}

impl Log for Logger {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &Record<'_>) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let cmd = std::env::var("CNI_COMMAND").unwrap_or_default();
        let cid = std::env::var("CNI_CONTAINERID").unwrap_or_default();
        let line = format!(
            "ebpf-cni[{}] {} {cmd} {cid}: {}\n",
            std::process::id(),
            r.level(),
            r.args()
        );
        match &self.file {
            Some(f) => {
                if let Ok(mut f) = f.lock() {
                    let _ = f.write_all(line.as_bytes());
                }
            }
            None => {
                let _ = std::io::stderr().write_all(line.as_bytes());
            }
        }
    }

    fn flush(&self) {}
}

pub fn init() {
    let level = match std::env::var("EBPF_CNI_LOG")
        .unwrap_or_default()
        .to_ascii_lowercase()
        .as_str()
    {
        "off" => LevelFilter::Off,
        "error" => LevelFilter::Error,
        "info" => LevelFilter::Info,
        "debug" => LevelFilter::Debug,
        "trace" => LevelFilter::Trace,
        _ => LevelFilter::Warn,
    };
    let file = std::env::var("EBPF_CNI_LOG_FILE")
        .ok()
        .filter(|p| !p.is_empty())
        .and_then(|p| OpenOptions::new().create(true).append(true).open(p).ok())
        .map(Mutex::new);
    if log::set_boxed_logger(Box::new(Logger { file })).is_ok() {
        log::set_max_level(level);
    }
}
