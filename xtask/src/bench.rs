//! `cargo xtask bench`: runs the benchmark, the `ebpf-cni-bench` crate in `bench/`, with the
//! arguments given (`cargo xtask bench --help` shows them). It is its own crate and binary:
//! xtask only starts it, so none of the benchmark is built into the other tasks.

use std::path::Path;

use anyhow::Result;

use crate::{build, cmd};

const PACKAGE: &str = "ebpf-cni-bench";

/// `cargo run --package ebpf-cni-bench -- args…` in the workspace.
pub fn run(args: &[String]) -> Result<()> {
    let mut c = cmd::cargo();
    c.current_dir(build::workspace_root())
        .args(["run", "--quiet", "--package", PACKAGE, "--"])
        .args(args);
    cmd::run(&mut c)
}

/// What `cargo xtask test` runs: the quick benchmark, into the default quick output
/// directory, of `release`, the static binary `dist` built for this machine (what operators
/// install, and what the benchmark measures); without it the benchmark builds that binary
/// itself.
pub fn quick_for_ci(release: Option<&Path>) -> Vec<String> {
    let mut args = vec!["--quick".to_owned()];
    if let Some(plugin) = release {
        args.push("--plugin".to_owned());
        args.push(plugin.to_string_lossy().into_owned());
    }
    args
}
