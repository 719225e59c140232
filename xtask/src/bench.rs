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

/// Where the benchmark's plugin is staged (see [`crate::prepare`]): a directory of its own,
/// so a run of the tests never swaps its binary.
pub const STAGE_DIR: &str = "bench-plugin";

/// What `cargo xtask test` runs: the quick benchmark, into the default quick output
/// directory, of `release`, the static binary `dist` just built, staged with the eBPF
/// objects beside it (the program-lab and XDP sections load them), so it is not built a
/// second time. Without one (`dist` failed) the benchmark builds its own as `dist` does.
/// It boots no guest (`--no-guests`: the bandwidth section on this machine, the netkit
/// section where this kernel has netkit): the two guests took two of CI's minutes, and
/// the kernel matrix boots guests the same way.
pub fn quick_for_ci(release: Option<&Path>) -> Result<Vec<String>> {
    let mut args = vec!["--quick".to_owned(), "--no-guests".to_owned()];
    if let Some(bin) = release {
        let staged = build::stage_built(STAGE_DIR, bin)?;
        args.extend(["--plugin".to_owned(), staged.display().to_string()]);
    }
    Ok(args)
}
