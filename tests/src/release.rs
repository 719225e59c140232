//! The release artifacts (`cargo xtask dist`) as an operator meets them: the variables that
//! name them for the tests (tests/tests/release.rs), clean Debian systems to install them
//! into, and a podman of its own for the image. `cargo xtask dist` uses the same podman
//! (building and saving the image) and the same names, so the tests read what it wrote.
//!
//! Nothing here touches the machine's own container storage or package database: podman
//! keeps every file under a directory the caller owns, and the Debian systems are
//! directories under `~/.cache/ebpf-cni/rootfs/`, made once by `mmdebstrap`, which tests
//! change only through an overlay of their own.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context as _, Result};

/// The amd64 tarball (`ebpf-cni-<version>-linux-amd64.tar.gz`, its `.sha256` beside it).
pub const TARBALL_ENV: &str = "EBPF_CNI_DIST_TARBALL";
/// The amd64 Debian package (`ebpf-cni_<version>_amd64.deb`).
pub const DEB_ENV: &str = "EBPF_CNI_DIST_DEB";
/// The amd64 OCI image archive (`ebpf-cni-<version>-linux-amd64.oci.tar`).
pub const IMAGE_ENV: &str = "EBPF_CNI_DIST_IMAGE";
/// The arm64 tarball.
pub const TARBALL_ARM64_ENV: &str = "EBPF_CNI_DIST_TARBALL_ARM64";
/// The arm64 Debian package.
pub const DEB_ARM64_ENV: &str = "EBPF_CNI_DIST_DEB_ARM64";

/// Where the release's shipped files live in the repository: the example conflists and
/// the install note.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is one level below the workspace root")
        .join("deploy")
}

/// The artifact `var` names; panics when it is unset or names no file (a release test
/// without its artifact would check nothing).
pub fn artifact(var: &str, what: &str) -> PathBuf {
    crate::bin_from_env(
        var,
        what,
        "`cargo xtask dist` writes the artifacts to <target>/dist/; `cargo xtask test` \
         runs it and sets the variables",
    )
}

/// Debian's mirror, as in this machine's sources (mmdebstrap would otherwise read its
/// sources from stdin when that is not a terminal).
const DEBIAN_MIRROR: &str = "http://deb.debian.org/debian";

/// A minimal Debian system of `suite` (`bullseye`, `bookworm`: `mmdebstrap
/// --variant=minbase`), made once and kept under `~/.cache/ebpf-cni/rootfs/<suite>`; later
/// calls return it at once. Callers must not change it: [`ScratchRootfs`] is a view of it
/// to change. Concurrent callers wait for the one that makes it.
pub fn debian_rootfs(suite: &str) -> Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    let cache = PathBuf::from(home).join(".cache/ebpf-cni/rootfs");
    fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    let dir = cache.join(suite);
    let lock = File::create(cache.join(format!(".{suite}.lock")))?;
    let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .context("locking the rootfs cache")?;
    // Made in a temporary directory and renamed: the directory exists only once complete.
    if dir.is_dir() {
        return Ok(dir);
    }
    let tmp = cache.join(format!(".{suite}.tmp"));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).with_context(|| format!("removing {}", tmp.display()))?;
    }
    let started = std::time::Instant::now();
    let out = Command::new("mmdebstrap")
        .args(["--variant=minbase", "--quiet", suite])
        .arg(&tmp)
        .arg(DEBIAN_MIRROR)
        .stdin(Stdio::null())
        .output()
        .context("running mmdebstrap (`cargo xtask setup` installs it)")?;
    if !out.status.success() {
        let _ = fs::remove_dir_all(&tmp);
        bail!(
            "mmdebstrap {suite} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    fs::rename(&tmp, &dir)?;
    eprintln!(
        "made a Debian {suite} rootfs in {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        dir.display()
    );
    Ok(dir)
}

/// A writable view of the cached rootfs of `suite` for one test: an overlay mount whose
/// upper layer is a fresh temporary directory, so what the test changes (installs,
/// removals) never reaches the cache, and nothing is copied (copying the 180 MB Debian 12
/// system took 8 s here, removing it 3 s). Unmounted and removed on drop.
pub struct ScratchRootfs {
    root: PathBuf,
    _dir: tempfile::TempDir,
}

impl ScratchRootfs {
    pub fn new(suite: &str) -> Result<Self> {
        let lower = debian_rootfs(suite)?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("ecni-{suite}-"))
            .tempdir()?;
        let [upper, work, root] = ["upper", "work", "root"].map(|d| dir.path().join(d));
        for d in [&upper, &work, &root] {
            fs::create_dir(d).with_context(|| format!("creating {}", d.display()))?;
        }
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            upper.display(),
            work.display()
        );
        nix::mount::mount(
            Some("overlay"),
            &root,
            Some("overlay"),
            nix::mount::MsFlags::empty(),
            Some(options.as_str()),
        )
        .with_context(|| {
            format!(
                "mounting an overlay of {} on {}",
                lower.display(),
                root.display()
            )
        })?;
        Ok(Self { root, _dir: dir })
    }

    /// The system's root directory.
    pub fn path(&self) -> &Path {
        &self.root
    }
}

impl Drop for ScratchRootfs {
    fn drop(&mut self) {
        // Detached: a process still inside (a failed test's) cannot keep the directory
        // from being removed after this.
        let _ = nix::mount::umount2(&self.root, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// podman with every file it keeps (storage, runtime state, locks, temporary files, its
/// configuration) under one directory, so it never sees or changes the machine's own
/// images and containers; removing the directory removes all of it (the `vfs` driver
/// mounts nothing). Containers get this machine's limits: podman's defaults for root
/// exceed them and runc then fails setting RLIMIT_NOFILE.
#[derive(Debug)]
pub struct PrivatePodman {
    base: PathBuf,
}

impl PrivatePodman {
    /// Writes the configuration under `base` (created if missing).
    pub fn new(base: &Path) -> Result<Self> {
        for d in ["root", "runroot", "tmp", "net.d"] {
            fs::create_dir_all(base.join(d))
                .with_context(|| format!("creating {}", base.join(d).display()))?;
        }
        let p = |d: &str| base.join(d).display().to_string();
        fs::write(
            base.join("containers.conf"),
            format!(
                r#"[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[network]
network_backend = "cni"
network_config_dir = "{netd}"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "none"
lock_type = "file"
tmp_dir = "{tmp}"
static_dir = "{root}/libpod"
volume_path = "{root}/volumes"
"#,
                netd = p("net.d"),
                tmp = p("tmp"),
                root = p("root"),
            ),
        )?;
        fs::write(
            base.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
                p("root"),
                p("runroot")
            ),
        )?;
        fs::write(
            base.join("registries.conf"),
            "unqualified-search-registries = []\n",
        )?;
        Ok(Self {
            base: base.to_path_buf(),
        })
    }

    /// `podman` with this installation's configuration.
    pub fn command(&self) -> Command {
        let mut c = Command::new("podman");
        c.env("CONTAINERS_CONF", self.base.join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", self.base.join("storage.conf"))
            .env(
                "CONTAINERS_REGISTRIES_CONF",
                self.base.join("registries.conf"),
            )
            .stdin(Stdio::null());
        c
    }

    /// Runs `podman args…`; its stdout, or an error with its stderr.
    pub fn run(&self, args: &[&str]) -> Result<String> {
        let out = self
            .command()
            .args(args)
            .output()
            .context("running podman")?;
        if !out.status.success() {
            bail!(
                "podman {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// ELF facts `readelf` reports about `bin`: its machine, its type, and whether it asks for a
/// program interpreter or shared libraries (a static binary does neither).
#[derive(Debug)]
pub struct ElfFacts {
    /// `Machine:` of the file header (`Advanced Micro Devices X86-64`, `AArch64`).
    pub machine: String,
    /// `Type:` of the file header: `EXEC (Executable file)` for a binary loaded at a fixed
    /// address, `DYN (…)` for a position-independent one (static-pie included).
    pub file_type: String,
    /// Whether it has a PT_INTERP program header (a dynamic loader to start it).
    pub interp: bool,
    /// Its DT_NEEDED entries (shared libraries).
    pub needed: Vec<String>,
}

impl ElfFacts {
    pub fn read(bin: &Path) -> Result<Self> {
        let out = Command::new("readelf")
            .args(["--file-header", "--program-headers", "--dynamic", "--wide"])
            .arg(bin)
            .output()
            .context("running readelf")?;
        if !out.status.success() {
            bail!(
                "readelf {} failed: {}",
                bin.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let machine = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("Machine:"))
            .map(|m| m.trim().to_owned())
            .unwrap_or_default();
        let file_type = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("Type:"))
            .map(|m| m.trim().to_owned())
            .unwrap_or_default();
        let interp = text.lines().any(|l| l.trim_start().starts_with("INTERP "));
        let needed = text
            .lines()
            .filter(|l| l.contains("(NEEDED)"))
            .map(|l| l.trim().to_owned())
            .collect();
        Ok(Self {
            machine,
            file_type,
            interp,
            needed,
        })
    }

    /// Starts without a dynamic loader or shared library (`static-pie` included).
    pub fn is_static(&self) -> bool {
        !self.interp && self.needed.is_empty()
    }

    /// Loaded at any address, relocating itself at start (ELF type `DYN`).
    pub fn is_position_independent(&self) -> bool {
        self.file_type.starts_with("DYN")
    }
}
