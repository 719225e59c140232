//! The set-up's Debian packages. Every `apt-get install` the set-up runs is an [`Install`]
//! here, and the same value builds both the real command and its simulation, so the line that
//! installs on a machine is the line `cargo xtask check-installs` proves resolvable on a clean
//! Debian 12 (an empty dpkg status) and on this machine's own state. A version pin, a package
//! from a low-pinned suite without its dependencies, or a missing dependency fails that
//! check, in CI, instead of a user's first command.

use std::{
    path::Path,
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
};

use anyhow::{bail, Context as _, Result};

use crate::cmd;

/// One `apt-get install` of the set-up.
#[derive(Clone, Copy, Debug)]
pub struct Install {
    /// What the packages are for (messages).
    pub purpose: &'static str,
    pub packages: &'static [&'static str],
    /// `-t SUITE`: resolve the packages and their dependencies from this suite, which the
    /// set-up lists at a low pin priority (so it never upgrades the machine by itself).
    pub target_release: Option<&'static str>,
}

/// Whether this process already ran `apt-get update` (once is enough).
static UPDATED: AtomicBool = AtomicBool::new(false);

/// `apt-get update`, once per process; again after the sources changed (`force`).
pub fn update(force: bool) -> Result<()> {
    if force || !UPDATED.load(Ordering::Relaxed) {
        cmd::run(Command::new("apt-get").args(["update", "-q"]))?;
        UPDATED.store(true, Ordering::Relaxed);
    }
    Ok(())
}

impl Install {
    /// Installs the packages dpkg does not report as installed; says what it did.
    pub fn ensure(&self) -> Result<String> {
        let missing = self.missing()?;
        if missing.is_empty() {
            return Ok("present".into());
        }
        update(false)?;
        cmd::run(
            self.command(&missing)
                .arg("-y")
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
        let still = self.missing()?;
        if !still.is_empty() {
            bail!("apt-get did not install {}", still.join(" "));
        }
        Ok(format!("installed {}", missing.join(" ")))
    }

    /// Simulates installing every package (installed or not) against `status` (a dpkg status
    /// file; `None`: this machine's). Fails with apt's explanation when it would not resolve.
    pub fn simulate(&self, status: Option<&Path>) -> Result<()> {
        let mut c = self.command(self.packages);
        c.arg("--simulate");
        if let Some(status) = status {
            c.arg(format!("-o=Dir::State::status={}", status.display()));
        }
        cmd::output(&mut c).map(drop).with_context(|| {
            format!(
                "the set-up's install of {} would fail{}",
                self.purpose,
                match status {
                    Some(_) => " on a clean Debian 12",
                    None => " on this machine",
                }
            )
        })
    }

    fn command(&self, packages: &[&str]) -> Command {
        let mut c = Command::new("apt-get");
        c.args(["install", "-q", "--no-install-recommends"]);
        if let Some(suite) = self.target_release {
            c.args(["-t", suite]);
        }
        c.args(packages);
        c
    }

    /// Packages dpkg does not report as installed. One `dpkg-query` for all of them; it
    /// exits 1 when it does not know some package at all, which just means "missing" here.
    pub fn missing(&self) -> Result<Vec<&'static str>> {
        let out = Command::new("dpkg-query")
            .arg("--show")
            .arg("--showformat=${Package} ${db:Status-Status}\\n")
            .args(self.packages)
            .output()
            .context("failed to run dpkg-query (is this a Debian-based system?)")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let installed: Vec<&str> = stdout
            .lines()
            .filter_map(|l| l.strip_suffix(" installed"))
            .map(|p| p.split(':').next().unwrap_or(p))
            .collect();
        Ok(self
            .packages
            .iter()
            .copied()
            .filter(|p| !installed.contains(p))
            .collect())
    }
}

/// Every install of `installs` simulated on a clean Debian 12 (an empty dpkg status) and on
/// this machine; every failure reported, not only the first.
pub fn check(installs: &[Install]) -> Result<()> {
    let dir = tempfile_dir()?;
    let empty = dir.join("status");
    std::fs::write(&empty, "").with_context(|| format!("writing {}", empty.display()))?;
    let mut failures = Vec::new();
    for install in installs {
        for status in [Some(empty.as_path()), None] {
            match install.simulate(status) {
                Ok(()) => println!(
                    "resolves{}: {} ({})",
                    if status.is_some() {
                        " on a clean Debian 12"
                    } else {
                        " here"
                    },
                    install.purpose,
                    install.packages.join(" ")
                ),
                Err(e) => failures.push(format!("{e:#}")),
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if !failures.is_empty() {
        bail!("{}", failures.join("\n"));
    }
    Ok(())
}

/// A fresh directory under the system's temporary directory.
fn tempfile_dir() -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("ebpf-cni-apt-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simulation_runs_the_install_line() {
        let i = Install {
            purpose: "t",
            packages: &["a", "b"],
            target_release: Some("bookworm-backports"),
        };
        let real = cmd::display(&i.command(i.packages));
        assert_eq!(
            real,
            "apt-get install -q --no-install-recommends -t bookworm-backports a b"
        );
    }
}
