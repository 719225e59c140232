//! A plugin binary run under `strace`: a wrapper script named like the binary (so a
//! [`crate::PluginUnderTest`] at it configures the same plugin type) that traces the given
//! system calls of every invocation into one log, for tests that count what an ADD asks of
//! the kernel.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

pub struct Traced {
    /// Holds the wrapper and the log (removed on drop).
    dir: tempfile::TempDir,
    /// The wrapper, named as the traced binary.
    pub wrapper: PathBuf,
}

impl Traced {
    /// A wrapper running `bin` under `strace -f -qq -e trace=<calls>`.
    pub fn new(bin: &Path, calls: &str) -> Result<Self> {
        let dir = tempfile::tempdir().context("a directory for the strace wrapper")?;
        let name = bin
            .file_name()
            .context("the traced binary has a file name")?;
        let wrapper = dir.path().join(name);
        let script = format!(
            "#!/bin/sh\nexec strace -f -qq -e trace={calls} -o {} {} \"$@\"\n",
            dir.path().join("strace.log").display(),
            bin.display()
        );
        std::fs::write(&wrapper, script)
            .with_context(|| format!("writing {}", wrapper.display()))?;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
        Ok(Self { dir, wrapper })
    }

    /// What the traced invocations made so far, one call per line.
    pub fn log(&self) -> Result<String> {
        let path = self.dir.path().join("strace.log");
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    }
}

/// The `BPF_MAP_GET_NEXT_KEY` calls a trace of `bpf,close` made on the pinned map `name`,
/// following each fd from its `BPF_OBJ_GET` to its `close`: for each call, whether it
/// asked for the first key (`key=NULL`, how every walk starts). A walk of a map of `n`
/// entries is `n + 1` calls; asking whether it holds any, one.
pub fn next_key_calls(trace: &str, name: &str) -> Vec<bool> {
    let pin = format!("/{name}\"");
    let mut fds: Vec<String> = Vec::new();
    let mut calls = Vec::new();
    for line in trace.lines() {
        if line.contains("BPF_OBJ_GET,") && line.contains(&pin) {
            if let Some(fd) = line.rsplit("= ").next() {
                fds.push(fd.trim().to_owned());
            }
        } else if let Some(i) = fds
            .iter()
            .position(|fd| line.contains(&format!("close({fd})")))
        {
            fds.remove(i);
        } else if let Some(fd) = fds
            .iter()
            .find(|fd| line.contains(&format!("BPF_MAP_GET_NEXT_KEY, {{map_fd={fd}, ")))
        {
            calls.push(line.contains(&format!("map_fd={fd}, key=NULL")));
        }
    }
    calls
}

/// How many walks (or first-key asks) of the pinned map `name` the trace made.
pub fn walks(trace: &str, name: &str) -> usize {
    next_key_calls(trace, name).iter().filter(|s| **s).count()
}
