//! The kernels of the VM test bed: Debian's stock images of the kernels nodes run (5.10 from
//! bullseye, 6.1 from bookworm, 6.12 from bookworm-backports), and what boots them (QEMU and
//! virtme-ng, which runs a kernel over this machine's root filesystem, read-only).
//!
//! The kernels never enter this machine's boot: each image package is downloaded
//! (`apt-get download`) and unpacked with `dpkg-deb -x` into a cache
//! (`~/.cache/ebpf-cni/kernels/<release>/`, with `boot/vmlinuz-<release>` and
//! `lib/modules/<release>/`): no maintainer script runs, no initramfs is made, no boot loader
//! entry is written and nothing lands in /boot or /lib/modules. virtme-ng boots such a tree as
//! it is: it takes the modules from beside the image (the rootfs it finds above
//! `boot/vmlinuz-*`) and links them into the guest's /lib/modules.
//!
//! `install` is a step of `cargo xtask setup`: it looks first and only installs what is
//! missing, so a second run costs a directory listing. The packages come from extra apt
//! suites listed with a low pin priority, so the suites never upgrade this machine's own
//! packages; QEMU is installed from bookworm-backports with `-t`, so that its dependencies
//! come from there too (this image's `qemu-utils` is backports' already).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use crate::{apt::Install, cmd};

/// One kernel of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// `5.10`, `6.1`, `6.12`: what `--kernel` takes and reports name.
    pub series: &'static str,
    /// The Debian suite whose `linux-image-amd64` is this series.
    suite: &'static str,
}

/// Oldest first.
pub const KERNELS: [Kernel; 3] = [
    Kernel {
        series: "5.10",
        suite: "bullseye",
    },
    Kernel {
        series: "6.1",
        suite: "bookworm",
    },
    Kernel {
        series: "6.12",
        suite: "bookworm-backports",
    },
];

/// An unpacked kernel image: `<cache>/<release>/boot/vmlinuz-<release>`, its modules beside it.
#[derive(Clone, Debug)]
pub struct Installed {
    pub release: String,
    pub image: PathBuf,
}

/// Where the kernels are unpacked: `~/.cache/ebpf-cni/kernels`.
pub fn cache_dir() -> Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    Ok(PathBuf::from(home).join(".cache/ebpf-cni/kernels"))
}

/// Written last into a release's directory: its unpacking finished.
const COMPLETE: &str = ".unpacked";

impl Kernel {
    pub fn by_series(series: &str) -> Option<Kernel> {
        KERNELS.iter().copied().find(|k| k.series == series)
    }

    /// The newest unpacked image of this series (`5.10.0-32-amd64`, `6.12.95+deb12-amd64`).
    pub fn installed(&self) -> Option<Installed> {
        let cache = cache_dir().ok()?;
        let mut found: Vec<String> = fs::read_dir(&cache)
            .ok()?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|r| self.is_release(r))
            .filter(|r| cache.join(r).join(COMPLETE).is_file())
            .collect();
        found.sort_by(|a, b| version_cmp(a, b));
        let release = found.pop()?;
        Some(Installed {
            image: image_path(&cache.join(&release), &release),
            release,
        })
    }

    /// `6.1.0-56-amd64` is a 6.1 release, `6.12.95+deb12-amd64` is not.
    fn is_release(&self, release: &str) -> bool {
        release
            .strip_prefix(self.series)
            .is_some_and(|rest| rest.starts_with('.'))
            && release.ends_with("-amd64")
    }
}

/// apt sources for the kernels not in this machine's own suites.
const SOURCES_PATH: &str = "/etc/apt/sources.list.d/ebpf-cni-kernels.sources";
const SOURCES: &str = "\
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports bullseye
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
";
/// Below the default 500 (and backports' own 100): packages of these suites are only ever
/// installed when asked for (`-t`, or a download by exact version).
const PREFERENCES_PATH: &str = "/etc/apt/preferences.d/ebpf-cni-kernels";
const PREFERENCES: &str = "\
Package: *
Pin: release n=bookworm-backports
Pin-Priority: 50

Package: *
Pin: release n=bullseye
Pin-Priority: 50
";

/// QEMU for the guests. From bookworm-backports with `-t`: naming only a version from a
/// low-pinned suite does not bring its dependencies from there (apt then refuses the line).
pub const QEMU: Install = Install {
    purpose: "the kernel VMs' QEMU",
    packages: &["qemu-system-x86"],
    target_release: Some("bookworm-backports"),
};

/// virtme-ng, from PyPI: the version this recipe was verified with.
const VIRTME_NG: &str = "virtme-ng==1.42";

/// The Python environment virtme-ng is installed in (`~/.cache/ebpf-cni/virtme-ng`): its
/// own venv, so whichever `python3` comes first on PATH (pyenv's, or Debian's, which
/// refuses `pip install` into the system) the runner is the same.
pub fn virtme_python() -> Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    Ok(PathBuf::from(home).join(".cache/ebpf-cni/virtme-ng/bin/python"))
}

/// Lists the extra suites (low-pinned) in apt's sources, and refreshes apt's lists when that
/// changed them.
pub fn list_sources() -> Result<()> {
    let changed =
        write_if_changed(SOURCES_PATH, SOURCES)? | write_if_changed(PREFERENCES_PATH, PREFERENCES)?;
    crate::apt::update(changed)
}

/// Installs QEMU, virtme-ng and the three kernels, each only if missing.
pub fn install() -> Result<String> {
    let mut done = Vec::new();
    let missing: Vec<Kernel> = KERNELS
        .iter()
        .copied()
        .filter(|k| k.installed().is_none())
        .collect();
    let qemu_missing = !QEMU.missing()?.is_empty();
    if qemu_missing || !missing.is_empty() {
        list_sources()?;
    }
    if qemu_missing {
        done.push(QEMU.ensure()?);
    }
    for k in &missing {
        let package = k.package()?;
        let release = unpack(&package)?;
        if k.installed().is_none() {
            bail!(
                "unpacking {package} gave release {release}, not a {} kernel",
                k.series
            );
        }
        done.push(format!("unpacked {package}"));
    }
    let python = virtme_python()?;
    if !cmd::succeeds(Command::new(&python).args(["-c", "import virtme_ng"])) {
        let venv = python
            .parent()
            .and_then(Path::parent)
            .expect("bin/python lives two levels below the venv");
        cmd::run(Command::new("python3").args(["-m", "venv"]).arg(venv))?;
        cmd::run(Command::new(&python).args(["-m", "pip", "install", "-q", VIRTME_NG]))?;
        done.push(VIRTME_NG.to_string());
    }
    Ok(if done.is_empty() {
        "present".into()
    } else {
        done.join("; ")
    })
}

/// Downloads the image package `package` (`name=version`) and unpacks it into the cache:
/// the image and its modules, with `modules.dep` made by depmod (a package's postinst would
/// have). Returns the release. Unpacked beside its final place and renamed there, so an
/// interrupted run leaves no half tree that counts as installed.
fn unpack(package: &str) -> Result<String> {
    let cache = cache_dir()?;
    let work = cache.join(format!(".unpacking-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    let tree = work.join("tree");
    fs::create_dir_all(&tree).with_context(|| format!("creating {}", tree.display()))?;
    cmd::run(
        Command::new("apt-get")
            .args(["download", "-q", "-o", "APT::Sandbox::User=root"])
            .arg(package)
            .current_dir(&work),
    )?;
    let deb = fs::read_dir(&work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .with_context(|| {
            format!(
                "apt-get download {package} left no .deb in {}",
                work.display()
            )
        })?;
    cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tree))?;
    let release = fs::read_dir(tree.join("boot"))
        .with_context(|| format!("{} has no boot/", deb.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find_map(|n| n.strip_prefix("vmlinuz-").map(str::to_owned))
        .with_context(|| format!("{} holds no boot/vmlinuz-*", deb.display()))?;
    let modules = modules_root(&tree, &release)
        .with_context(|| format!("{} holds no modules for {release}", deb.display()))?;
    cmd::run(Command::new("depmod").arg("-b").arg(&modules).arg(&release))?;
    fs::write(tree.join(COMPLETE), format!("{package}\n"))?;
    let dest = cache.join(&release);
    let _ = fs::remove_dir_all(&dest);
    fs::rename(&tree, &dest)
        .with_context(|| format!("moving {} to {}", tree.display(), dest.display()))?;
    let _ = fs::remove_dir_all(&work);
    Ok(release)
}

/// The root depmod and virtme-ng take the modules from: the tree, or its `usr/` where the
/// package ships `usr/lib/modules`.
fn modules_root(tree: &Path, release: &str) -> Option<PathBuf> {
    [tree.to_path_buf(), tree.join("usr")]
        .into_iter()
        .find(|root| root.join("lib/modules").join(release).is_dir())
}

fn image_path(dir: &Path, release: &str) -> PathBuf {
    dir.join("boot").join(format!("vmlinuz-{release}"))
}

/// Every kernel package of the matrix resolves to a download (`--print-uris`: nothing is
/// fetched).
pub fn check_downloads() -> Result<()> {
    let mut failures = Vec::new();
    for k in KERNELS {
        let resolved = k.package().and_then(|p| {
            cmd::output(Command::new("apt-get").args(["download", "--print-uris", &p]))
                .map(|uri| (p, uri))
        });
        match resolved {
            Ok((p, uri)) if uri.contains(".deb") => {
                println!("downloadable: kernel {} ({p})", k.series)
            }
            Ok((p, _)) => failures.push(format!("apt-get download {p} names no .deb")),
            Err(e) => failures.push(format!("kernel {}: {e:#}", k.series)),
        }
    }
    if !failures.is_empty() {
        bail!("{}", failures.join("\n"));
    }
    Ok(())
}

impl Kernel {
    /// `linux-image-5.10.0-32-amd64=5.10.223-1`: the concrete image package behind this
    /// series' `linux-image-amd64` in its suite, newest version first.
    fn package(&self) -> Result<String> {
        let madison =
            cmd::output(Command::new("apt-cache").args(["madison", "linux-image-amd64"]))?;
        // `linux-image-amd64 | 6.1.192-2 | http://… bookworm-security/main amd64 Packages`
        let version = madison
            .lines()
            .filter_map(|l| {
                let mut f = l.split('|').map(str::trim);
                let (_, v, src) = (f.next()?, f.next()?, f.next()?);
                let suite = src.split_whitespace().nth(1)?.split('/').next()?;
                let ours = suite == self.suite || suite == format!("{}-security", self.suite);
                (ours && v.starts_with(&format!("{}.", self.series))).then(|| v.to_owned())
            })
            .max_by(|a, b| version_cmp(a, b))
            .with_context(|| {
                format!(
                    "apt knows no linux-image-amd64 {} from {} (see {SOURCES_PATH})",
                    self.series, self.suite
                )
            })?;
        let show = cmd::output(
            Command::new("apt-cache").args(["show", &format!("linux-image-amd64={version}")]),
        )?;
        let image = show
            .lines()
            .find_map(|l| l.strip_prefix("Depends:"))
            .and_then(|d| d.split([',', ' ']).find(|w| w.starts_with("linux-image-")))
            .with_context(|| format!("linux-image-amd64={version} names no image package"))?;
        Ok(format!("{image}={version}"))
    }
}

/// Writes `text` to `path` unless it holds it already; whether it wrote.
fn write_if_changed(path: &str, text: &str) -> Result<bool> {
    if fs::read_to_string(path).ok().as_deref() == Some(text) {
        return Ok(false);
    }
    fs::write(path, text).with_context(|| format!("writing {path}"))?;
    Ok(true)
}

/// Compares release or version strings by their numeric runs (`6.1.0-56` < `6.1.0-100`),
/// which is all Debian's kernel versions need.
fn version_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn parts(s: &str) -> Vec<u64> {
        s.split(|c: char| !c.is_ascii_digit())
            .filter(|p| !p.is_empty())
            .filter_map(|p| p.parse().ok())
            .collect()
    }
    parts(a).cmp(&parts(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_match_their_releases_only() {
        let [k510, k61, k612] = KERNELS;
        assert!(k61.is_release("6.1.0-56-amd64"));
        assert!(!k61.is_release("6.12.95+deb12-amd64"));
        assert!(k612.is_release("6.12.95+deb12-amd64"));
        assert!(k510.is_release("5.10.0-32-amd64"));
        assert!(!k510.is_release("5.10.0-32-cloud-amd64.old"));
    }

    #[test]
    fn versions_compare_numerically() {
        use std::cmp::Ordering::Less;
        assert_eq!(version_cmp("6.1.0-56-amd64", "6.1.0-100-amd64"), Less);
        assert_eq!(version_cmp("6.12.95-1~bpo12+1", "6.12.101-1~bpo12+1"), Less);
    }
}
