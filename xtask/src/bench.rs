//! `cargo xtask bench`: runs the benchmark, the `ebpf-cni-bench` crate in `bench/`, with the
//! arguments given (`cargo xtask bench --help` shows them). It is its own crate and binary:
//! xtask only starts it, so none of the benchmark is built into the other tasks.

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
/// directory. The benchmark stages the static release binary itself, as `dist` builds it
/// (the build `dist` just made: cargo finds nothing to redo), with the eBPF object it
/// embeds beside it, which the program-lab and XDP sections load; `dist`'s own copy of
/// the binary has no object beside it.
pub fn quick_for_ci() -> Vec<String> {
    vec!["--quick".to_owned()]
}
