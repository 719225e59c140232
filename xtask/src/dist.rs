//! `cargo xtask dist`: the release artifacts, written to `<target>/dist/`:
//!
//! - per architecture (amd64, arm64), `ebpf-cni-<version>-linux-<arch>.tar.gz` and its
//!   `.sha256` (sha256sum's format): the plugin, statically linked against musl so it
//!   starts on any node's userland, whatever its glibc; the example conflists; the licence;
//!   the install note. Flat, so `tar -C /opt/cni/bin -xzf <tarball> ebpf-cni` installs
//!   the binary alone;
//! - per architecture, `ebpf-cni_<version>_<arch>.deb`: the binary in Debian's CNI
//!   directory `/usr/lib/cni` (where podman looks), `/opt/cni/bin/ebpf-cni` linking to it
//!   (containerd's default), the docs and examples under `/usr/share/doc/ebpf-cni/`. No
//!   maintainer scripts: installing it configures and starts nothing;
//! - `ebpf-cni-<version>-linux-amd64.oci.tar`: an OCI image archive of `FROM scratch` and
//!   the static binary as `/ebpf-cni`, its entry point, built by a podman of its own (no
//!   registry, nothing left in the machine's container storage).
//!
//! The eBPF object is built once, as `cargo xtask build` builds it ([`build::build_ebpf`]),
//! and the same object is embedded in both architectures' binaries: it is `bpfel` bytecode,
//! and no program or map depends on the host's architecture (the programs are TC, sock_ops
//! and cgroup sock_addr programs, whose contexts are the same everywhere; every map type in
//! `maps/` has a size asserted at compile time, for both targets, and no `usize`).
//!
//! The archives are reproducible given the same binaries: entries sorted, owned by root,
//! their times `SOURCE_DATE_EPOCH` or else the commit's date; gzip without name or time;
//! dpkg-deb and podman given the same time.

use std::{
    fs,
    os::unix::fs::{symlink, PermissionsExt},
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, Context as _, Result};
use ebpf_cni_tests::release::{self as rel, ElfFacts, PrivatePodman};

use crate::{
    build::{self, BuildOptions, CrossTarget, Tree},
    cmd, setup,
};

const PLUGIN_PACKAGE: &str = "ebpf-cni";
const PLUGIN_BIN: &str = "ebpf-cni";

/// The `Maintainer` of the Debian packages. Placeholder until the project has a public
/// address for it.
const MAINTAINER: &str = "ebpf-cni maintainers <maintainers@ebpf-cni.invalid>";

/// One architecture of the release.
#[derive(Clone, Copy, Debug)]
pub struct Arch {
    /// Debian's and OCI's name, as in the artifacts' names: `amd64`, `arm64`.
    pub name: &'static str,
    pub target: CrossTarget,
    /// `readelf`'s `Machine:` for this architecture.
    pub elf_machine: &'static str,
    /// What runs the binary here (`None`: it runs natively).
    pub runner: Option<&'static str>,
}

pub const ARCHES: [Arch; 2] = [
    Arch {
        name: "amd64",
        target: CrossTarget {
            triple: "x86_64-unknown-linux-musl",
            cross_cc: None,
        },
        elf_machine: "Advanced Micro Devices X86-64",
        runner: None,
    },
    Arch {
        name: "arm64",
        target: CrossTarget {
            triple: "aarch64-unknown-linux-musl",
            // Debian's cross gcc as the link driver (the C runtime and libc are rustup's
            // self-contained musl objects) and for C code of dependencies, with Debian's
            // arm64 glibc headers (libc6-dev-arm64-cross): ring's C needs only
            // freestanding-style headers, and links against musl's libc.a.
            cross_cc: Some("aarch64-linux-gnu-gcc"),
        },
        elf_machine: "AArch64",
        runner: Some("qemu-aarch64"),
    },
];

/// The release architecture of this machine (the one whose binary runs here natively).
pub fn host_arch() -> Result<Arch> {
    let rust_arch = std::env::consts::ARCH;
    ARCHES
        .into_iter()
        .find(|a| a.target.triple.split('-').next() == Some(rust_arch))
        .with_context(|| format!("no release is built for this machine's architecture {rust_arch}"))
}

/// Builds the binary the release ships for this machine's architecture (static, musl, as
/// [`dist`] builds it), checks it as [`dist`] does, and stages it to `<target>/<dir>/ebpf-cni`
/// (see [`build::stage_for`]): what the benchmark measures, so its figures are the
/// product's as operators install it.
pub fn stage_release(dir: &str) -> Result<PathBuf> {
    let arch = host_arch()?;
    let staged = build::stage_for(dir, Some(arch.target))?;
    check_binary(&staged, arch, &package(&build::workspace_root())?.version)?;
    Ok(staged)
}

/// What one architecture's release consists of.
#[derive(Clone, Debug)]
pub struct ArchArtifacts {
    pub arch: Arch,
    /// The static binary that went into the archives.
    pub binary: PathBuf,
    pub tarball: PathBuf,
    pub deb: PathBuf,
}

/// Everything `dist` wrote.
#[derive(Clone, Debug)]
pub struct Artifacts {
    pub version: String,
    pub dir: PathBuf,
    pub arches: Vec<ArchArtifacts>,
    pub image: PathBuf,
}

impl Artifacts {
    /// The static binary of this machine's architecture, as the archives hold it.
    pub fn host_binary(&self) -> Option<&Path> {
        let arch = host_arch().ok()?;
        self.arches
            .iter()
            .find(|a| a.arch.name == arch.name)
            .map(|a| a.binary.as_path())
    }

    /// The variables through which the release tests find the artifacts.
    pub fn test_env(&self) -> Vec<(&'static str, PathBuf)> {
        let mut env = vec![(rel::IMAGE_ENV, self.image.clone())];
        for a in &self.arches {
            let (tarball, deb) = match a.arch.name {
                "amd64" => (rel::TARBALL_ENV, rel::DEB_ENV),
                "arm64" => (rel::TARBALL_ARM64_ENV, rel::DEB_ARM64_ENV),
                other => unreachable!("no test variables for {other}"),
            };
            env.push((tarball, a.tarball.clone()));
            env.push((deb, a.deb.clone()));
        }
        env
    }

    /// Every file written, for the summary.
    fn files(&self) -> Vec<PathBuf> {
        let mut files = Vec::new();
        for a in &self.arches {
            files.push(a.tarball.clone());
            files.push(sha256_path(&a.tarball));
            files.push(a.deb.clone());
        }
        files.push(self.image.clone());
        files
    }
}

/// The plugin package's facts the artifacts carry.
#[derive(Debug)]
struct Package {
    version: String,
    license: String,
    description: String,
    /// The source repository's address, when the manifest or git knows one.
    repository: Option<String>,
}

/// `cargo xtask dist`: installs what is missing, then builds everything (see the module
/// head) into `<target>/dist/`, replacing what was there.
pub fn dist() -> Result<Artifacts> {
    println!("release tools: {}", setup::dist_tools()?);
    let started = Instant::now();
    let artifacts = build_all()?;
    for f in artifacts.files() {
        let len = fs::metadata(&f)?.len();
        println!("{} ({:.1} MB)", f.display(), len as f64 / 1e6);
    }
    println!(
        "dist: {} artifacts in {:.0} s",
        artifacts.files().len(),
        started.elapsed().as_secs_f64()
    );
    Ok(artifacts)
}

fn build_all() -> Result<Artifacts> {
    let root = build::workspace_root();
    let tree = Tree::current()?;
    let pkg = package(&root)?;
    let epoch = source_date_epoch(&root)?;
    let revision = cmd::output(git(&root).args(["rev-parse", "HEAD"]))?
        .trim()
        .to_owned();

    let dir = tree.target_dir.join("dist");
    let stage = tree.target_dir.join("dist-stage");
    for d in [&dir, &stage] {
        if d.exists() {
            fs::remove_dir_all(d).with_context(|| format!("removing {}", d.display()))?;
        }
        fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }

    let obj = build::build_ebpf(&tree)?;
    check_object(&obj)?;
    let mut arches = Vec::new();
    for arch in ARCHES {
        let binary = build::build_plugin(&tree, &obj, &BuildOptions::default(), Some(arch.target))?;
        check_binary(&binary, arch, &pkg.version)?;
        let tarball = tarball(&root, &stage, &dir, &binary, arch, &pkg.version, epoch)?;
        let deb = deb(&root, &stage, &dir, &binary, arch, &pkg, epoch)?;
        arches.push(ArchArtifacts {
            arch,
            binary,
            tarball,
            deb,
        });
    }
    let amd64 = &arches[0];
    let image = image(
        &stage,
        &dir,
        &amd64.binary,
        amd64.arch,
        &pkg,
        &revision,
        epoch,
    )?;
    fs::remove_dir_all(&stage).with_context(|| format!("removing {}", stage.display()))?;
    Ok(Artifacts {
        version: pkg.version,
        dir,
        arches,
        image,
    })
}

fn git(root: &Path) -> Command {
    let mut c = Command::new("git");
    c.arg("-C").arg(root);
    c
}

fn package(root: &Path) -> Result<Package> {
    let json = cmd::output(cmd::cargo().current_dir(root).args([
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
    ]))?;
    let meta: serde_json::Value =
        serde_json::from_str(&json).context("cannot parse `cargo metadata` output")?;
    let p = meta["packages"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == PLUGIN_PACKAGE))
        .with_context(|| format!("`cargo metadata` lists no package {PLUGIN_PACKAGE}"))?;
    let field = |k: &str| p[k].as_str().map(str::to_owned);
    let repository = field("repository").or_else(|| {
        cmd::output(git(root).args(["remote", "get-url", "origin"]))
            .ok()
            .map(|u| u.trim().to_owned())
            .filter(|u| !u.is_empty())
    });
    let license = field("license").context("the plugin package has no license")?;
    // The copyright file and the archives carry this licence's text.
    if license != "Apache-2.0" {
        bail!("the plugin's licence is {license}: the release ships Apache-2.0's text only");
    }
    Ok(Package {
        version: field("version").context("the plugin package has no version")?,
        license,
        description: field("description").unwrap_or_default(),
        repository,
    })
}

/// `SOURCE_DATE_EPOCH` when set (the reproducible-builds convention), else the commit's
/// date.
fn source_date_epoch(root: &Path) -> Result<u64> {
    if let Some(v) = std::env::var_os("SOURCE_DATE_EPOCH") {
        let v = v.to_string_lossy();
        return v
            .trim()
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={v} is not a number of seconds"));
    }
    let ct = cmd::output(git(root).args(["log", "-1", "--format=%ct"]))?;
    ct.trim()
        .parse()
        .with_context(|| format!("`git log --format=%ct` printed {ct:?}"))
}

/// Refuses a binary that is not static, not of `arch`, or does not start and report this
/// version with its eBPF programs embedded.
/// The eBPF object the release embeds holds exactly the programs the plugin loads: no
/// prototype of the benchmark's, nothing the plugin never attaches.
fn check_object(obj: &Path) -> Result<()> {
    let mut found = object_programs(obj)?;
    found.sort();
    let mut loaded: Vec<String> = ebpf_cni_maps::PLUGIN_PROGRAMS
        .iter()
        .map(|p| p.to_string())
        .collect();
    loaded.sort();
    if found != loaded {
        bail!(
            "{} holds the programs {found:?}; the plugin loads {loaded:?} (the benchmark's \
             prototypes belong in its own object)",
            obj.display()
        );
    }
    Ok(())
}

/// The programs of the eBPF object at `obj`, by `readelf`: its global functions of default
/// visibility outside `.text` (which holds the subprograms they call), each in its
/// program's section.
fn object_programs(obj: &Path) -> Result<Vec<String>> {
    let out = cmd::output(
        Command::new("readelf")
            .args(["--section-headers", "--syms", "--wide"])
            .arg(obj),
    )?;
    Ok(programs_of_readelf(&out))
}

/// [`object_programs`] of `readelf --section-headers --syms --wide`'s output.
fn programs_of_readelf(out: &str) -> Vec<String> {
    // `  [ 2] .text  PROGBITS …`: the section index of `.text`.
    let text = out.lines().find_map(|l| {
        let (idx, rest) = l.trim().strip_prefix('[')?.split_once(']')?;
        (rest.split_whitespace().next() == Some(".text")).then(|| idx.trim().to_owned())
    });
    // `  77: 00000000000047d0 16128 FUNC GLOBAL DEFAULT 8 ecni_from_pod`
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [_, _, _, "FUNC", "GLOBAL", "DEFAULT", ndx, name]
                    if Some(*ndx) != text.as_deref() && *ndx != "UND" =>
                {
                    Some((*name).to_owned())
                }
                _ => None,
            }
        })
        .collect()
}

/// The test hooks' variables (plugin/src/test_hooks.rs): a release binary holds none of
/// their names, which only a test build (`--features test-hooks`) compiles in.
const TEST_HOOK_VARS: [&str; 4] = [
    "EBPF_CNI_FAILPOINT",
    "EBPF_CNI_TEST_KERNEL_RELEASE",
    "EBPF_CNI_BOOT_ID_FILE",
    "EBPF_CNI_HOLD_BEFORE_VETH",
];

/// The first test hook whose name is in `binary`'s bytes.
fn test_hook_in(binary: &[u8]) -> Option<&'static str> {
    TEST_HOOK_VARS
        .into_iter()
        .find(|var| binary.windows(var.len()).any(|w| w == var.as_bytes()))
}

fn check_binary(bin: &Path, arch: Arch, version: &str) -> Result<()> {
    let bytes = fs::read(bin).with_context(|| format!("reading {}", bin.display()))?;
    if let Some(var) = test_hook_in(&bytes) {
        bail!(
            "{} honours the test hook {var}: a release binary is built without the \
             test-hooks feature",
            bin.display()
        );
    }
    drop(bytes);
    let elf = ElfFacts::read(bin)?;
    if elf.machine != arch.elf_machine {
        bail!(
            "{} is for {}, not {} ({})",
            bin.display(),
            elf.machine,
            arch.name,
            arch.elf_machine
        );
    }
    if !elf.is_static() {
        bail!(
            "{} is not static (interpreter: {}, needed: {:?}): it would not start on a node \
             with another C library",
            bin.display(),
            elf.interp,
            elf.needed
        );
    }
    if elf.is_position_independent() {
        bail!(
            "{} is position-independent ({}): it would relocate itself at every start, \
             copying the pages that hold its pointers (.cargo/config.toml sets the release \
             targets' relocation model)",
            bin.display(),
            elf.file_type
        );
    }
    let mut run = match arch.runner {
        Some(runner) => {
            let mut c = Command::new(runner);
            c.arg(bin);
            c
        }
        None => Command::new(bin),
    };
    let out = cmd::output(run.arg("version"))?;
    if !out.contains(&format!("ebpf-cni {version}\n")) || !out.contains("eBPF programs: embedded") {
        bail!(
            "{} version printed no `ebpf-cni {version}` with embedded programs:\n{out}",
            bin.display()
        );
    }
    eprintln!(
        "{} binary: static, not position-independent, starts, programs embedded",
        arch.name
    );
    Ok(())
}

fn sha256_path(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".sha256");
    PathBuf::from(name)
}

/// Writes `<file>.sha256` in sha256sum's format, naming the file without a directory so
/// `sha256sum -c` works beside it.
fn write_sha256(file: &Path) -> Result<()> {
    let dir = file.parent().context("the artifact is in a directory")?;
    let name = file.file_name().context("the artifact has a name")?;
    let line = cmd::output(Command::new("sha256sum").current_dir(dir).arg(name))?;
    fs::write(sha256_path(file), line)?;
    Ok(())
}

/// Copies `from` to `to` with `mode`, creating `to`'s directory.
fn install(from: &Path, to: &Path, mode: u32) -> Result<()> {
    if let Some(dir) = to.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// The example conflists shipped (`deploy/examples/*.conflist`), sorted.
fn examples(root: &Path) -> Result<Vec<PathBuf>> {
    let dir = root.join("deploy/examples");
    let mut found: Vec<PathBuf> = fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "conflist"))
        .collect();
    found.sort();
    if found.is_empty() {
        bail!("no example conflists in {}", dir.display());
    }
    Ok(found)
}

/// The tarball of `arch`: binary, examples, LICENSE, INSTALL.md at its top level; and its
/// `.sha256`.
fn tarball(
    root: &Path,
    stage: &Path,
    dist: &Path,
    binary: &Path,
    arch: Arch,
    version: &str,
    epoch: u64,
) -> Result<PathBuf> {
    let dir = stage.join(format!("tar-{}", arch.name));
    install(binary, &dir.join(PLUGIN_BIN), 0o755)?;
    install(&root.join("LICENSE"), &dir.join("LICENSE"), 0o644)?;
    install(
        &root.join("deploy/INSTALL.md"),
        &dir.join("INSTALL.md"),
        0o644,
    )?;
    for ex in examples(root)? {
        let name = ex.file_name().expect("a file");
        install(&ex, &dir.join("examples").join(name), 0o644)?;
    }
    fs::set_permissions(dir.join("examples"), fs::Permissions::from_mode(0o755))?;

    let out = dist.join(format!("ebpf-cni-{version}-linux-{}.tar.gz", arch.name));
    let mut members: Vec<String> = fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    members.sort();
    cmd::run(
        Command::new("tar")
            .arg("--create")
            .arg("--file")
            .arg(&out)
            .args(["--use-compress-program", "gzip -9 --no-name"])
            .args(["--format=gnu", "--sort=name"])
            .arg(format!("--mtime=@{epoch}"))
            .args(["--owner=0", "--group=0", "--numeric-owner"])
            .arg("--directory")
            .arg(&dir)
            .args(&members),
    )?;
    write_sha256(&out)?;
    Ok(out)
}

/// The Debian package of `arch`, from a staged tree (see the module head).
fn deb(
    root: &Path,
    stage: &Path,
    dist: &Path,
    binary: &Path,
    arch: Arch,
    pkg: &Package,
    epoch: u64,
) -> Result<PathBuf> {
    let tree = stage.join(format!("deb-{}", arch.name));
    let bin = tree.join("usr/lib/cni").join(PLUGIN_BIN);
    install(binary, &bin, 0o755)?;
    let opt = tree.join("opt/cni/bin");
    fs::create_dir_all(&opt)?;
    symlink(
        Path::new("/usr/lib/cni").join(PLUGIN_BIN),
        opt.join(PLUGIN_BIN),
    )?;
    let doc = tree.join("usr/share/doc").join(PLUGIN_PACKAGE);
    install(&root.join("README.md"), &doc.join("README.md"), 0o644)?;
    install(
        &root.join("deploy/INSTALL.md"),
        &doc.join("INSTALL.md"),
        0o644,
    )?;
    for ex in examples(root)? {
        let name = ex.file_name().expect("a file");
        install(&ex, &doc.join("examples").join(name), 0o644)?;
    }
    fs::write(doc.join("copyright"), copyright(pkg))?;

    // dpkg-gencontrol would compute it: the installed files' size in KiB, rounded up.
    let installed_kib = cmd::output(
        Command::new("du")
            .args(["-sk", "--apparent-size"])
            .arg(&tree),
    )?
    .split_whitespace()
    .next()
    .and_then(|k| k.parse::<u64>().ok())
    .context("du printed no size")?;
    let control_dir = tree.join("DEBIAN");
    fs::create_dir_all(&control_dir)?;
    fs::write(
        control_dir.join("control"),
        control(pkg, arch.name, installed_kib),
    )?;
    // What `dpkg --verify` checks the installed files against.
    let mut files = Vec::new();
    regular_files(&tree, &tree, &mut files)?;
    files.retain(|f| !f.starts_with("DEBIAN"));
    files.sort();
    let md5sums = cmd::output(Command::new("md5sum").current_dir(&tree).args(&files))?;
    fs::write(control_dir.join("md5sums"), md5sums)?;
    // Modes as a package wants them, whatever the umask: directories 0755, files 0644
    // (the binary 0755, set above).
    normalise_modes(&tree)?;

    let out = dist.join(format!(
        "{PLUGIN_PACKAGE}_{}_{}.deb",
        pkg.version, arch.name
    ));
    cmd::run(
        Command::new("dpkg-deb")
            .args(["--build", "--root-owner-group"])
            .arg(&tree)
            .arg(&out)
            .env("SOURCE_DATE_EPOCH", epoch.to_string()),
    )?;
    Ok(out)
}

fn control(pkg: &Package, arch: &str, installed_kib: u64) -> String {
    let mut c = format!(
        "Package: {PLUGIN_PACKAGE}\n\
         Version: {version}\n\
         Architecture: {arch}\n\
         Maintainer: {MAINTAINER}\n\
         Installed-Size: {installed_kib}\n\
         Section: net\n\
         Priority: optional\n",
        version = pkg.version,
    );
    if let Some(url) = pkg.repository.as_deref().filter(|u| u.starts_with("http")) {
        c.push_str(&format!("Homepage: {url}\n"));
    }
    // Runtimes run Debian's `loopback` beside any network plugin; ebpf-cni's host-local
    // IPAM is built in.
    c.push_str("Recommends: containernetworking-plugins\n");
    c.push_str(&format!(
        "Description: {}\n \
         ebpf-cni gives a container its network (a veth pair, host-local IPAM, addresses\n \
         and routes) and runs its dataplane, host ports, bandwidth limits and masquerade\n \
         included, as TC eBPF programs instead of iptables rules and tc qdiscs.\n \
         .\n \
         The binary is installed in /usr/lib/cni (podman's plugin directory) and linked\n \
         from /opt/cni/bin (containerd's). Installing the package writes no network\n \
         configuration: example conflists are in /usr/share/doc/ebpf-cni/examples.\n",
        pkg.description
    ));
    c
}

/// debian/copyright in the machine-readable format.
fn copyright(pkg: &Package) -> String {
    let source = pkg
        .repository
        .as_deref()
        .map(|u| format!("Source: {u}\n"))
        .unwrap_or_default();
    format!(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
         Upstream-Name: {PLUGIN_PACKAGE}\n\
         {source}\n\
         Files: *\n\
         Copyright: the ebpf-cni contributors\n\
         License: {license}\n\
         \n\
         License: {license}\n \
         On Debian systems, the full text of the Apache License, Version 2.0 is in\n \
         /usr/share/common-licenses/Apache-2.0.\n",
        license = pkg.license
    )
}

/// The regular files under `dir`, relative to `base`.
fn regular_files(base: &Path, dir: &Path, found: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let meta = fs::symlink_metadata(&path)?;
        if meta.is_dir() {
            regular_files(base, &path, found)?;
        } else if meta.is_file() {
            found.push(path.strip_prefix(base)?.to_path_buf());
        }
    }
    Ok(())
}

fn normalise_modes(dir: &Path) -> Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let meta = fs::symlink_metadata(&path)?;
        if meta.is_dir() {
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
            normalise_modes(&path)?;
        } else if meta.is_file() && meta.permissions().mode() & 0o111 == 0 {
            fs::set_permissions(&path, fs::Permissions::from_mode(0o644))?;
        }
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// The OCI image archive: `FROM scratch`, the binary as `/ebpf-cni` and its entry point,
/// built and saved by a podman whose storage is under `stage` (removed with it).
fn image(
    stage: &Path,
    dist: &Path,
    binary: &Path,
    arch: Arch,
    pkg: &Package,
    revision: &str,
    epoch: u64,
) -> Result<PathBuf> {
    let context = stage.join(format!("image-{}", arch.name));
    install(binary, &context.join(PLUGIN_BIN), 0o755)?;
    fs::write(
        context.join("Containerfile"),
        format!("FROM scratch\nCOPY {PLUGIN_BIN} /{PLUGIN_BIN}\nENTRYPOINT [\"/{PLUGIN_BIN}\"]\n"),
    )?;
    let podman = PrivatePodman::new(&stage.join("podman"))?;
    let tag = format!("localhost/{PLUGIN_PACKAGE}:{}", pkg.version);
    let mut labels = vec![
        ("org.opencontainers.image.title", PLUGIN_PACKAGE.to_owned()),
        (
            "org.opencontainers.image.description",
            pkg.description.clone(),
        ),
        ("org.opencontainers.image.version", pkg.version.clone()),
        ("org.opencontainers.image.licenses", pkg.license.clone()),
        ("org.opencontainers.image.revision", revision.to_owned()),
    ];
    match &pkg.repository {
        Some(url) => labels.push(("org.opencontainers.image.source", url.clone())),
        None => eprintln!(
            "warning: no repository address (Cargo.toml `repository` or git remote `origin`): \
             the image has no org.opencontainers.image.source label"
        ),
    }
    let mut build = podman.command();
    build
        .args(["build", "--quiet", "--pull=never", "--network=none"])
        .arg(format!("--platform=linux/{}", arch.name))
        .arg(format!("--timestamp={epoch}"))
        .arg("--file")
        .arg(context.join("Containerfile"))
        .args(["--tag", &tag]);
    for (k, v) in &labels {
        build.arg("--label").arg(format!("{k}={v}"));
    }
    build.arg(&context);
    cmd::run(&mut build)?;
    let out = dist.join(format!(
        "{PLUGIN_PACKAGE}-{}-linux-{}.oci.tar",
        pkg.version, arch.name
    ));
    cmd::run(
        podman
            .command()
            .args(["save", "--quiet", "--format", "oci-archive", "--output"])
            .arg(&out)
            .arg(&tag),
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_objects_programs_are_its_global_functions_outside_text() {
        let out = "\
Section Headers:
  [Nr] Name              Type            Address          Off    Size   ES Flg Lk Inf Al
  [ 2] .text             PROGBITS        0000000000000000 000040 01c370 00  AX  0   0  8
  [ 8] classifier        PROGBITS        0000000000000000 01c3b0 00a2c8 00  AX  0   0  8
  [24] xdp               PROGBITS        0000000000000000 02e160 001018 00  AX  0   0  8
Symbol table '.symtab' contains 102 entries:
   Num:    Value          Size Type    Bind   Vis      Ndx Name
    48: 0000000000000500  4768 FUNC    GLOBAL DEFAULT    2 ecni_source_check
    77: 00000000000047d0 16128 FUNC    GLOBAL DEFAULT    8 ecni_from_pod
    98: 0000000000000000  4120 FUNC    GLOBAL DEFAULT   24 ecni_xdp_dev
    99: 000000000001c190    88 FUNC    GLOBAL HIDDEN     2 memcpy
    12: 0000000000000010     0 FUNC    LOCAL  DEFAULT    8 LBB0_1
";
        assert_eq!(programs_of_readelf(out), ["ecni_from_pod", "ecni_xdp_dev"]);
    }

    /// The names dist looks for are the hooks the plugin defines, each behind the feature.
    #[test]
    fn the_test_hooks_checked_are_the_plugins() {
        let src =
            fs::read_to_string(build::workspace_root().join("plugin/src/test_hooks.rs")).unwrap();
        let mut defined: Vec<&str> = src
            .split('"')
            .filter(|s| s.starts_with("EBPF_CNI_"))
            .collect();
        defined.sort_unstable();
        let mut checked = TEST_HOOK_VARS.to_vec();
        checked.sort_unstable();
        assert_eq!(defined, checked);
        // Every definition of a name is compiled only into a test build.
        for line in src.lines().filter(|l| l.contains("\"EBPF_CNI_")) {
            let before = &src[..src.find(line).unwrap()];
            assert!(
                before
                    .trim_end()
                    .ends_with("#[cfg(feature = \"test-hooks\")]"),
                "{line} is not behind the test-hooks feature"
            );
        }
        assert_eq!(
            test_hook_in(b"..EBPF_CNI_BOOT_ID_FILE.."),
            Some("EBPF_CNI_BOOT_ID_FILE")
        );
        assert_eq!(test_hook_in(b"EBPF_CNI_LOG"), None);
    }

    /// The benchmark measures the release binary of the machine it runs on: each
    /// architecture Rust names maps to the release of that architecture.
    #[test]
    fn the_host_arch_is_the_release_of_this_architecture() {
        let arch = host_arch().expect("a release is built for this machine");
        let expected = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => panic!("no release for {other}"),
        };
        assert_eq!(arch.name, expected);
        assert!(arch.target.triple.ends_with("-unknown-linux-musl"));
    }
}
