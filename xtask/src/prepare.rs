//! What every task that runs the plugin does first, in one place: it checks for root, installs
//! what is missing ([`setup`]) and stages the plugin under test ([`build::stage`]), or takes the
//! binary it was given. `test`, `demo`, `vmtest` and the benchmark (the `ebpf-cni-bench`
//! crate) all start here.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};

use crate::{build, dist, setup};

/// Where `test`, `demo` and `vmtest` stage the plugin (the benchmark has its own directory,
/// so a run of one never swaps the other's binary).
pub const UNDER_TEST: &str = "under-test";

/// Fails unless running as root: `task` creates network namespaces, veth pairs and bpffs
/// pins.
pub fn require_root(task: &str) -> Result<()> {
    if ebpf_cni_tests::euid() != 0 {
        bail!("{task} needs root: it creates network namespaces, veth pairs and bpffs pins");
    }
    Ok(())
}

/// [`require_root`], [`setup::setup`] of what `scope` needs, then the plugin: `plugin` when given (resolved to an
/// absolute path), else a fresh build staged to `<target>/<stage_dir>/ebpf-cni`.
pub fn prepare(
    task: &str,
    scope: setup::Scope,
    stage_dir: &str,
    plugin: Option<&Path>,
) -> Result<PathBuf> {
    require_root(task)?;
    setup::setup(scope)?;
    match plugin {
        Some(p) => p
            .canonicalize()
            .with_context(|| format!("--plugin {}", p.display())),
        None => build::stage(stage_dir),
    }
}

/// [`prepare`] for a task that measures the product as shipped (the benchmark): the plugin
/// when given, else the static release binary of this machine's architecture, built as
/// `cargo xtask dist` builds it ([`dist::stage_release`]), staged to
/// `<target>/<stage_dir>/ebpf-cni`.
pub fn prepare_release(
    task: &str,
    scope: setup::Scope,
    stage_dir: &str,
    plugin: Option<&Path>,
) -> Result<PathBuf> {
    match plugin {
        Some(_) => prepare(task, scope, stage_dir, plugin),
        None => {
            require_root(task)?;
            setup::setup(scope)?;
            dist::stage_release(stage_dir)
        }
    }
}
