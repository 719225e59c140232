//! Running external commands: echoed to stderr before they run, failing with the command
//! line when they fail.

use std::{
    ffi::OsStr,
    process::{Command, Stdio},
};

use anyhow::{bail, Context as _, Result};

/// `program arg…` as a shell would show it, for messages.
pub fn display(cmd: &Command) -> String {
    let mut s = String::new();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            s.push_str(&format!("{}={} ", k.to_string_lossy(), v.to_string_lossy()));
        }
    }
    s.push_str(&cmd.get_program().to_string_lossy());
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

/// Runs `cmd` with inherited stdio; an error if it cannot start or exits non-zero.
pub fn run(cmd: &mut Command) -> Result<()> {
    let line = display(cmd);
    eprintln!("$ {line}");
    let status = cmd
        .status()
        .with_context(|| format!("failed to start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(())
}

/// Runs `cmd` quietly and returns its stdout; an error (with its stderr) if it fails.
pub fn output(cmd: &mut Command) -> Result<String> {
    let line = display(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("failed to start `{line}`"))?;
    if !out.status.success() {
        bail!(
            "`{line}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("`{line}` printed non-UTF-8"))
}

/// Whether `cmd` runs and exits 0, all output discarded.
pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The cargo that runs this xtask (`$CARGO`), so nested builds use the same toolchain.
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// A command run with the nightly toolchain through rustup (`rustup run nightly …`), which
/// also puts nightly's libLLVM on the library path for bpf-linker.
pub fn nightly(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new("rustup");
    cmd.args(["run", "nightly"]).arg(program);
    cmd
}
