//! `cargo xtask setup`: installs what building and testing need, checking before doing, so a
//! second run only looks (well under a second). One line per step on stdout.
//!
//! bpf-linker is the delicate part: it must link the same LLVM major as the nightly rustc
//! that emits the bitcode, and no system libLLVM matches, so it is built against nightly's
//! own libLLVM (see /work/shared/TOOLCHAIN.md), through symlinks in a stable prefix under
//! `~/.cache/ebpf-cni/llvm`.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use crate::{cmd, kernels};

/// Debian packages the tests, demo and benchmarks use.
pub const APT_PACKAGES: &[&str] = &[
    "iproute2",
    "iperf3",
    "iputils-ping",
    "containernetworking-plugins",
    "iptables",
    "bpftool",
    "util-linux",
    // The runtime end-to-end tests (tests/tests/podman.rs, tests/tests/containerd/):
    // podman 4.3 with its CNI backend and conmon; containerd 1.6 with its CRI plugin (and
    // `ctr`); runc as the OCI runtime for both (crun fails on hybrid cgroups; listed so apt
    // does not pick crun for podman's `crun | runc` dependency); a static busybox for the
    // containers' rootfs and the image built offline.
    "podman",
    "conmon",
    "containerd",
    "runc",
    "busybox-static",
    // The kernel matrix: virtme-ng lives in a venv of its own (Debian's python3 needs this
    // package for `python3 -m venv`; QEMU and the kernels are installed by `kernels`).
    "python3-venv",
];

/// What `cargo xtask dist` and the release tests (tests/tests/release.rs) add: the arm64
/// build's cross gcc, the linker and the C compiler of dependencies with C parts (ring,
/// for `ebpf-cni install`'s HTTPS), with the arm64 C headers it only recommends (rustup's
/// self-contained musl objects are the C runtime and libc, so neither musl-tools nor an
/// arm64 libc is linked); `qemu-aarch64` to run that build here; `mmdebstrap` for the
/// clean Debian 11 and 12 systems the artifacts are installed into; podman builds and
/// runs the image (listed again so this list stands alone).
pub const DIST_PACKAGES: &[&str] = &[
    "gcc-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
    "qemu-user",
    "mmdebstrap",
    "podman",
];

/// The Rust targets of the static release binaries (the default toolchain's).
pub const DIST_TARGETS: [&str; 2] = ["x86_64-unknown-linux-musl", "aarch64-unknown-linux-musl"];

pub fn setup() -> Result<()> {
    report("apt packages", apt_packages()?);
    report("nightly toolchain", nightly_toolchain()?);
    report("rust-src (nightly)", rust_src()?);
    report("bpf-linker", bpf_linker()?);
    report(
        "kernel VMs (QEMU, virtme-ng, Debian kernels)",
        kernels::install()?,
    );
    report("release tools (dist)", dist_tools()?);
    Ok(())
}

/// What `cargo xtask dist` needs besides the build's own tools: [`DIST_PACKAGES`] and the
/// rustup targets [`DIST_TARGETS`], each installed only when missing.
pub fn dist_tools() -> Result<String> {
    let packages = apt_install(DIST_PACKAGES)?;
    let installed = cmd::output(Command::new("rustup").args(["target", "list", "--installed"]))?;
    let missing: Vec<&str> = DIST_TARGETS
        .into_iter()
        .filter(|t| !installed.lines().any(|l| l.trim() == *t))
        .collect();
    if missing.is_empty() {
        return Ok(format!("packages {packages}, targets present"));
    }
    cmd::run(
        Command::new("rustup")
            .args(["target", "add"])
            .args(&missing),
    )?;
    Ok(format!(
        "packages {packages}, targets installed {}",
        missing.join(" ")
    ))
}

fn report(step: &str, outcome: String) {
    println!("{step}: {outcome}");
}

fn apt_packages() -> Result<String> {
    apt_install(APT_PACKAGES)
}

/// Installs the `packages` dpkg does not report as installed; says what it did.
fn apt_install(packages: &'static [&'static str]) -> Result<String> {
    let missing = missing_packages(packages)?;
    if missing.is_empty() {
        return Ok("present".into());
    }
    cmd::run(Command::new("apt-get").arg("update"))?;
    cmd::run(
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    let still = missing_packages(packages)?;
    if !still.is_empty() {
        bail!("apt-get did not install {}", still.join(" "));
    }
    Ok(format!("installed {}", missing.join(" ")))
}

/// Those of `packages` dpkg does not report as installed. One `dpkg-query` for all of them;
/// it exits 1 when it does not know some package at all, which just means "missing" here.
fn missing_packages(packages: &'static [&'static str]) -> Result<Vec<&'static str>> {
    let out = Command::new("dpkg-query")
        .arg("--show")
        .arg("--showformat=${Package} ${db:Status-Status}\\n")
        .args(packages)
        .output()
        .context("failed to run dpkg-query (is this a Debian-based system?)")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let installed: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_suffix(" installed"))
        .map(|p| p.split(':').next().unwrap_or(p))
        .collect();
    Ok(packages
        .iter()
        .copied()
        .filter(|p| !installed.contains(p))
        .collect())
}

fn nightly_toolchain() -> Result<String> {
    if cmd::succeeds(Command::new("rustc").args(["+nightly", "-V"])) {
        return Ok("present".into());
    }
    cmd::run(Command::new("rustup").args([
        "toolchain",
        "install",
        "nightly",
        "--profile",
        "minimal",
    ]))?;
    Ok("installed".into())
}

fn rust_src() -> Result<String> {
    let installed = cmd::output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]))?;
    if installed.lines().any(|l| l.trim() == "rust-src") {
        return Ok("present".into());
    }
    cmd::run(Command::new("rustup").args([
        "component",
        "add",
        "rust-src",
        "--toolchain",
        "nightly",
    ]))?;
    Ok("installed".into())
}

fn bpf_linker() -> Result<String> {
    if let Ok(version) = cmd::output(Command::new("bpf-linker").arg("--version")) {
        return Ok(format!("present ({})", version.trim()));
    }
    let vv = cmd::output(Command::new("rustc").args(["+nightly", "-vV"]))?;
    let major = llvm_major(&vv)
        .with_context(|| format!("no `LLVM version` in `rustc +nightly -vV`:\n{vv}"))?;
    let sysroot = cmd::output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?;
    let prefix = llvm_prefix()?;
    link_nightly_llvm(&Path::new(sysroot.trim()).join("lib"), &prefix, major)?;

    // --force: a bpf-linker that is installed but cannot start (built for another LLVM)
    // would otherwise be kept as "already installed".
    cmd::run(
        cmd::cargo()
            .args(["install", "bpf-linker", "--force", "--no-default-features"])
            .args(["--features", &format!("llvm-{major}")])
            .env("LLVM_PREFIX", &prefix),
    )?;
    match cmd::output(Command::new("bpf-linker").arg("--version")) {
        Ok(version) => Ok(format!("installed {} (LLVM {major})", version.trim())),
        Err(e) => {
            Err(e.context("bpf-linker was installed but does not run: is ~/.cargo/bin on PATH?"))
        }
    }
}

/// `LLVM version: 22.1.4` → 22.
fn llvm_major(rustc_vv: &str) -> Option<u32> {
    rustc_vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version:"))
        .and_then(|v| v.trim().split('.').next())
        .and_then(|m| m.parse().ok())
}

/// `$HOME/.cache/ebpf-cni/llvm`: stable, because bpf-linker's rpath points at its `lib/`.
fn llvm_prefix() -> Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    Ok(PathBuf::from(home).join(".cache/ebpf-cni/llvm"))
}

/// Links nightly's libLLVM into `<prefix>/lib`: `libLLVM.so` for bpf-linker's build to link
/// against, and the library under its own (soname) names so the built binary also starts
/// outside `rustup run nightly`, which is what puts the toolchain's lib/ on the loader path.
fn link_nightly_llvm(nightly_lib: &Path, prefix: &Path, major: u32) -> Result<()> {
    let lib_dir = prefix.join("lib");
    fs::create_dir_all(&lib_dir).with_context(|| format!("cannot create {}", lib_dir.display()))?;
    let soname_prefix = format!("libLLVM.so.{major}.");
    let mut soname = None;
    for entry in fs::read_dir(nightly_lib)
        .with_context(|| format!("cannot read {}", nightly_lib.display()))?
    {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with("libLLVM") {
            continue;
        }
        replace_symlink(&entry.path(), &lib_dir.join(name))?;
        if name.starts_with(&soname_prefix) {
            soname = Some(entry.path());
        }
    }
    let Some(soname) = soname else {
        bail!(
            "no {soname_prefix}* in {}: does this nightly ship libLLVM?",
            nightly_lib.display()
        );
    };
    replace_symlink(&soname, &lib_dir.join("libLLVM.so"))
}

fn replace_symlink(target: &Path, link: &Path) -> Result<()> {
    match fs::remove_file(link) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot replace {}", link.display())),
    }
    symlink(target, link)
        .with_context(|| format!("cannot link {} -> {}", link.display(), target.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_llvm_major() {
        let vv = "rustc 1.97.0-nightly (e50aa6fba 2026-05-19)\nbinary: rustc\nhost: x86_64-unknown-linux-gnu\nLLVM version: 22.1.4\n";
        assert_eq!(llvm_major(vv), Some(22));
        assert_eq!(llvm_major("rustc 1.0\n"), None);
    }
}
