//! `cargo xtask setup`: installs what building and testing need, checking before doing, so a
//! second run only looks (well under a second). One line per step on stdout.
//!
//! What is installed depends on the task ([`Scope`]): the demo gets only what it uses (the
//! toolchain pieces and five Debian packages); the test command adds the reference plugins,
//! the runtimes, the traffic tools, etcd and the kernel VMs' pieces (see [`crate::kernels`]).
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

use crate::{apt::Install, cmd, kernels};

/// What a task needs installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// `cargo xtask demo`: build the plugin, run two pods, show the kernel's state.
    Demo,
    /// `cargo xtask test`, `vmtest`, `bench` and `setup`: everything.
    Full,
}

/// What the demo runs besides the plugin: `ip` (iproute2), `bpftool` (the attached
/// programs), `nsenter` and `mount` (util-linux), `modprobe` (kmod); and what building the
/// plugin needs besides the toolchain: `protoc`.
pub const DEMO_PACKAGES: Install = Install {
    purpose: "the demo",
    packages: &[
        "iproute2",
        "bpftool",
        "util-linux",
        "kmod",
        // `protoc`, which the etcd-client crate's build script runs (it generates etcd's
        // gRPC API), so the demo's build of the plugin needs it too; and the well-known
        // types it imports (`google/protobuf/descriptor.proto`), which only a Recommends of
        // protobuf-compiler brings, and installs here never take Recommends.
        "protobuf-compiler",
        "libprotobuf-dev",
    ],
    target_release: None,
};

/// What the tests and benchmarks add.
pub const TEST_PACKAGES: Install = Install {
    purpose: "the tests and benchmarks",
    packages: &[
        "iperf3",
        "iputils-ping",
        // The reference plugins (/usr/lib/cni), compared against and chained with.
        "containernetworking-plugins",
        "iptables",
        // kube-proxy's other two modes' tools (tests/tests/services.rs): its nftables rules
        // are loaded with `nft`, its IPVS virtual servers with `ipvsadm` and its sets with
        // `ipset`; `conntrack` flushes a Service's UDP flows as kube-proxy does.
        "nftables",
        "ipvsadm",
        "ipset",
        "conntrack",
        // The runtime end-to-end tests (tests/tests/podman.rs, tests/tests/containerd/):
        // podman 4.3 with its CNI backend and conmon; containerd 1.6 with its CRI plugin
        // (and `ctr`); runc as the OCI runtime for both (crun fails on hybrid cgroups; listed
        // so apt does not pick crun for podman's `crun | runc` dependency); a static busybox
        // for the containers' rootfs and the image built offline.
        "podman",
        "conmon",
        "containerd",
        "runc",
        "busybox-static",
        // The kernel matrix's virtme-ng and the manifests' kubernetes-validate live in venvs
        // of their own (Debian's python3 needs this package for `python3 -m venv`).
        "python3-venv",
        // What an ADD asks of the kernel, counted (`strace`): the static binary's memory
        // mappings (tests/tests/release.rs), the IPAM store's file opens (lifecycle.rs).
        "strace",
        // A real etcd cluster (3.4's `etcd`, and `etcdctl`) for the cluster-network tests
        // (tests/src/etcd.rs).
        "etcd-server",
        "etcd-client",
    ],
    target_release: None,
};

/// What `cargo xtask dist` and the release tests (tests/tests/release.rs) add: the C
/// compilers of dependencies with C parts (ring, for `ebpf-cni install`'s HTTPS): musl-gcc
/// for the amd64 build (cc looks for `x86_64-linux-musl-gcc` or `musl-gcc`), the arm64 cross
/// gcc, which also links that build, with the arm64 C headers it only recommends (rustup's
/// self-contained musl objects are the C runtime and libc); `qemu-aarch64` to run that build
/// here; `mmdebstrap` for the clean Debian 11 and 12 systems the artifacts are installed
/// into; podman builds and runs the image (listed again so this list stands alone).
pub const DIST_PACKAGES: Install = Install {
    purpose: "the release artifacts and their tests",
    packages: &[
        "gcc-aarch64-linux-gnu",
        "libc6-dev-arm64-cross",
        "musl-tools",
        "qemu-user",
        "mmdebstrap",
        "podman",
    ],
    target_release: None,
};

/// The Rust targets of the static release binaries (the default toolchain's).
pub const DIST_TARGETS: [&str; 2] = ["x86_64-unknown-linux-musl", "aarch64-unknown-linux-musl"];

/// Every install the set-up can run, for `cargo xtask check-installs`.
pub fn all_installs() -> Vec<Install> {
    vec![DEMO_PACKAGES, TEST_PACKAGES, DIST_PACKAGES, kernels::QEMU]
}

pub fn setup(scope: Scope) -> Result<()> {
    report("apt packages (demo)", DEMO_PACKAGES.ensure()?);
    report("nightly toolchain", nightly_toolchain()?);
    report("rust-src (nightly)", rust_src()?);
    report("bpf-linker", bpf_linker()?);
    if scope == Scope::Demo {
        return Ok(());
    }
    report("apt packages (tests)", TEST_PACKAGES.ensure()?);
    let boot = boot_entries();
    report(
        "kernel VMs (QEMU, virtme-ng, Debian kernels unpacked into a cache)",
        kernels::install()?,
    );
    let after = boot_entries();
    if after != boot {
        bail!("the set-up changed the machine's /boot or /lib/modules: {boot:?} -> {after:?}");
    }
    report("release tools (dist)", dist_tools()?);
    Ok(())
}

/// What /boot and /lib/modules hold: the kernel VMs' set-up must leave both as they were.
fn boot_entries() -> Vec<String> {
    let mut names: Vec<String> = ["/boot", "/lib/modules"]
        .iter()
        .flat_map(|dir| {
            fs::read_dir(dir)
                .into_iter()
                .flatten()
                .filter_map(move |e| Some(format!("{dir}/{}", e.ok()?.file_name().to_str()?)))
        })
        .collect();
    names.sort();
    names
}

/// `cargo xtask check-installs`: every apt install of the set-up resolves on a clean
/// Debian 12 and here, and every kernel package of the matrix can be downloaded.
pub fn check_installs() -> Result<()> {
    kernels::list_sources()?;
    let apt = crate::apt::check(&all_installs());
    let kernels = kernels::check_downloads();
    apt?;
    kernels
}

/// What `cargo xtask dist` needs besides the build's own tools: [`DIST_PACKAGES`] and the
/// rustup targets [`DIST_TARGETS`], each installed only when missing.
pub fn dist_tools() -> Result<String> {
    let packages = DIST_PACKAGES.ensure()?;
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
