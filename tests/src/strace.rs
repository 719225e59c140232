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
