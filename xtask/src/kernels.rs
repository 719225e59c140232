//! The kernels of the VM test bed: Debian's stock images of the kernels nodes run (5.10 from
//! bullseye, 6.1 from bookworm, 6.12 from bookworm-backports), and what boots them (QEMU and
//! virtme-ng, which runs a kernel over this machine's root filesystem, read-only).
//!
//! `install` is a step of `cargo xtask setup`: it looks first and only installs what is
//! missing, so a second run costs a directory listing. The kernels are installed as Debian
//! packages (their modules under /lib/modules, where virtme-ng's guest loads them from), from
//! extra apt suites listed with a low pin priority, so the suites never upgrade this
//! machine's own packages.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use crate::cmd;

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

/// An installed kernel image: `/boot/vmlinuz-<release>` with `/lib/modules/<release>`.
#[derive(Clone, Debug)]
pub struct Installed {
    pub release: String,
    pub image: PathBuf,
}

impl Kernel {
    pub fn by_series(series: &str) -> Option<Kernel> {
        KERNELS.iter().copied().find(|k| k.series == series)
    }

    /// The newest installed image of this series (`5.10.0-32-amd64`, `6.12.95+deb12-amd64`).
    pub fn installed(&self) -> Option<Installed> {
        let mut found: Vec<String> = fs::read_dir("/boot")
            .ok()?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|n| n.strip_prefix("vmlinuz-").map(str::to_owned))
            .filter(|r| self.is_release(r))
            .filter(|r| {
                Path::new("/lib/modules")
                    .join(r)
                    .join("modules.dep")
                    .is_file()
            })
            .collect();
        found.sort_by(|a, b| version_cmp(a, b));
        let release = found.pop()?;
        Some(Installed {
            image: Path::new("/boot").join(format!("vmlinuz-{release}")),
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
/// installed when asked for by exact version.
const PREFERENCES_PATH: &str = "/etc/apt/preferences.d/ebpf-cni-kernels";
const PREFERENCES: &str = "\
Package: *
Pin: release n=bookworm-backports
Pin-Priority: 50

Package: *
Pin: release n=bullseye
Pin-Priority: 50
";

/// virtme-ng, from PyPI: the version this recipe was verified with.
const VIRTME_NG: &str = "virtme-ng==1.42";

/// The Python environment virtme-ng is installed in (`~/.cache/ebpf-cni/virtme-ng`): its
/// own venv, so whichever `python3` comes first on PATH (pyenv's, or Debian's, which
/// refuses `pip install` into the system) the runner is the same.
pub fn virtme_python() -> Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    Ok(PathBuf::from(home).join(".cache/ebpf-cni/virtme-ng/bin/python"))
}

/// Installs QEMU, virtme-ng and the three kernels, each only if missing.
pub fn install() -> Result<String> {
    let mut done = Vec::new();
    let missing: Vec<Kernel> = KERNELS
        .iter()
        .copied()
        .filter(|k| k.installed().is_none())
        .collect();
    let qemu_missing = !cmd::succeeds(Command::new("qemu-system-x86_64").arg("--version"));
    if qemu_missing || !missing.is_empty() {
        write_if_changed(SOURCES_PATH, SOURCES)?;
        write_if_changed(PREFERENCES_PATH, PREFERENCES)?;
        cmd::run(Command::new("apt-get").args(["update", "-q"]))?;
    }
    if qemu_missing {
        // The machine's qemu-utils may come from backports; qemu-system-x86 must then be the
        // same version, or apt refuses the pair.
        let qemu = match installed_version("qemu-utils") {
            Some(v) => format!("qemu-system-x86={v}"),
            None => "qemu-system-x86".into(),
        };
        apt_install(&[qemu])?;
        done.push("qemu-system-x86".to_string());
    }
    if !missing.is_empty() {
        let packages = missing
            .iter()
            .map(|k| k.package())
            .collect::<Result<Vec<_>>>()?;
        apt_install(&packages)?;
        for k in &missing {
            if k.installed().is_none() {
                bail!(
                    "installing {} left no kernel {} in /boot",
                    packages.join(" "),
                    k.series
                );
            }
        }
        done.extend(packages);
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
        format!("installed {}", done.join(" "))
    })
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

fn apt_install(packages: &[String]) -> Result<()> {
    cmd::run(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

fn installed_version(package: &str) -> Option<String> {
    let out = cmd::output(Command::new("dpkg-query").args([
        "--show",
        "--showformat=${db:Status-Status} ${Version}",
        package,
    ]))
    .ok()?;
    out.strip_prefix("installed ").map(|v| v.trim().to_owned())
}

fn write_if_changed(path: &str, text: &str) -> Result<()> {
    if fs::read_to_string(path).ok().as_deref() == Some(text) {
        return Ok(());
    }
    fs::write(path, text).with_context(|| format!("writing {path}"))
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
