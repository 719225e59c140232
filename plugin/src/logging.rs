//! Logging to stderr (or a file), never stdout: stdout carries the CNI result.
//! `EBPF_CNI_LOG` sets the level (off, error, warn, info, debug, trace; default warn);
//! `EBPF_CNI_LOG_FILE` appends to a file instead of stderr. A CNI command's network
//! configuration may set the same with `logLevel` and `logFile` (as multus spells them);
//! the environment wins where both are set. Logging starts from the environment before
//! stdin is read (so reading it can be logged) and [`configure_from_config`] applies the
//! configuration's keys once it has been read. A log file that cannot be opened never fails
//! a command: lines go to stderr, after one warning.

use std::{
    fs::{File, OpenOptions},
    io::Write,
    os::unix::fs::OpenOptionsExt,
    sync::Mutex,
};

use log::{LevelFilter, Log, Metadata, Record};

struct Logger;

/// Where lines go: `None` is stderr. Behind a lock so the configuration can redirect it
/// after start-up.
static FILE: Mutex<Option<File>> = Mutex::new(None);

impl Log for Logger {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        // What the crates below us log (kube's client: "failed with error client error")
        // reaches the operator through our own errors, with their context: their lines
        // show from `debug` on, whatever their level.
        let level = if m.target().starts_with("ebpf_cni") {
            m.level()
        } else {
            m.level().max(log::Level::Debug)
        };
        level <= log::max_level()
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
        let mut file = FILE.lock().unwrap_or_else(|e| e.into_inner());
        match file.as_mut() {
            Some(f) => {
                let _ = f.write_all(line.as_bytes());
            }
            None => {
                let _ = std::io::stderr().write_all(line.as_bytes());
            }
        }
    }

    fn flush(&self) {}
}

/// A warning the operator must see even where the log goes to a file: logged, and written to
/// stderr too in that case (runtimes keep a plugin's stderr).
pub fn warn_operator(msg: &str) {
    log::warn!("{msg}");
    let to_file = FILE.lock().map(|f| f.is_some()).unwrap_or(true);
    if to_file && log::max_level() >= LevelFilter::Warn {
        let _ = std::io::stderr().write_all(format!("ebpf-cni: warning: {msg}\n").as_bytes());
    }
}

/// A level name as `EBPF_CNI_LOG` and `logLevel` spell it (any case); `None` for anything
/// else.
fn parse_level(s: &str) -> Option<LevelFilter> {
    Some(match s.to_ascii_lowercase().as_str() {
        "off" => LevelFilter::Off,
        "error" => LevelFilter::Error,
        "warn" | "warning" => LevelFilter::Warn,
        "info" => LevelFilter::Info,
        "debug" => LevelFilter::Debug,
        "trace" => LevelFilter::Trace,
        _ => return None,
    })
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Sends the lines to `path` (created 0600, appended to); on failure they stay where they
/// went, and the warning says why.
fn open_file(path: &str, from: &str) {
    match OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
    {
        Ok(f) => *FILE.lock().unwrap_or_else(|e| e.into_inner()) = Some(f),
        Err(e) => log::warn!("cannot open the log file {path:?} ({from}): {e}; logging to stderr"),
    }
}

/// Starts logging from the environment.
pub fn init() {
    let level = env("EBPF_CNI_LOG")
        .and_then(|l| parse_level(&l))
        .unwrap_or(LevelFilter::Warn);
    if log::set_logger(&Logger).is_ok() {
        log::set_max_level(level);
    }
    if let Some(path) = env("EBPF_CNI_LOG_FILE") {
        open_file(&path, "EBPF_CNI_LOG_FILE");
    }
}

/// Applies the network configuration's `logLevel` and `logFile` where the environment set
/// neither. `stdin` is the raw configuration: anything that is not a JSON object with these
/// keys as strings changes nothing (the command itself reports a bad configuration).
pub fn configure_from_config(stdin: &[u8]) {
    let Ok(serde_json::Value::Object(conf)) = serde_json::from_slice(stdin) else {
        return;
    };
    let key = |k: &str| {
        conf.get(k)
            .and_then(serde_json::Value::as_str)
            .filter(|v| !v.is_empty())
    };
    // The file first: its warning, if any, is then told at the level in force so far (the
    // default warn), not silenced by a logLevel of error or off.
    if env("EBPF_CNI_LOG_FILE").is_none() {
        if let Some(path) = key("logFile") {
            open_file(path, "logFile");
        }
    }
    if env("EBPF_CNI_LOG").is_none() {
        if let Some(l) = key("logLevel") {
            match parse_level(l) {
                Some(level) => log::set_max_level(level),
                None => log::warn!(
                    "logLevel {l:?} is not one of off, error, warn, info, debug, trace; keeping {}",
                    log::max_level()
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_in_any_case_and_unknown_ones_do_not() {
        assert_eq!(parse_level("DEBUG"), Some(LevelFilter::Debug));
        assert_eq!(parse_level("warning"), Some(LevelFilter::Warn));
        assert_eq!(parse_level("off"), Some(LevelFilter::Off));
        assert_eq!(parse_level("verbose"), None);
    }
}
