//! `cargo xtask test`: the README's test command and what CI runs. Installs what is
//! missing, builds the real plugin with its eBPF programs, then runs every test: unit tests
//! of pure logic and the integration tests that drive the real binary against the kernel.

use std::{fs, path::PathBuf};

use anyhow::{bail, Context, Result};

use crate::{build, cmd, setup};

/// Builds and stages the plugin the integration tests run; returns its path.
///
/// The binary is copied out of `target/release`: any later plain `cargo build` of the
/// plugin (without the eBPF object) would overwrite it there with a stub build.
pub fn stage_plugin() -> Result<PathBuf> {
    let plugin = build::build(&build::BuildOptions {
        debug_plugin: false,
    })?;
    let dir = build::target_dir()?.join("under-test");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let staged = dir.join("ebpf-cni");
    let tmp = dir.join(".ebpf-cni.tmp");
    fs::copy(&plugin, &tmp)
        .with_context(|| format!("copying {} to {}", plugin.display(), tmp.display()))?;
    fs::rename(&tmp, &staged)?;
    Ok(staged)
}

pub fn require_root(what: &str) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc_geteuid() } != 0 {
        bail!("{what} needs root: it creates network namespaces, veth pairs and bpffs pins");
    }
    Ok(())
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

pub fn test(extra: &[String]) -> Result<()> {
    require_root("cargo xtask test")?;
    setup::setup()?;
    let plugin = stage_plugin()?;
    println!("plugin under test: {}", plugin.display());
    let mut c = cmd::cargo();
    // Every test binary runs even when one fails, so one run shows all failures.
    c.arg("test")
        .arg("--no-fail-fast")
        .args(extra)
        .env("EBPF_CNI_BIN", &plugin);
    let tests = cmd::run(&mut c);
    // The README's first command: its checks against the same binary (under a second).
    println!("demo (the README's first command, its checks only)");
    let demo = crate::demo::run(&plugin).map_err(|e| e.context("the demo failed"));
    // The quick benchmark runs too, so it cannot rot: it must complete and write its report.
    // It asserts no timing.
    println!("quick benchmark (checks that it runs and reports; asserts no timing)");
    let bench = crate::bench::bench(&crate::bench::BenchArgs::quick_for_ci(&plugin));
    tests?;
    demo?;
    bench
        .map(|()| println!("quick benchmark: ok"))
        .map_err(|e| e.context("the quick benchmark failed"))
}
