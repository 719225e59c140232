//! `cargo xtask validate-manifests`: every `deploy/*.yaml` against the OpenAPI schemas of
//! one fixed Kubernetes version, in strict mode (a field the API does not know, such as a
//! misspelt `hostNetwork`, is an error, as `kubectl apply` would make it one), with PyPI's
//! kubernetes-validate, which ships the schemas and needs no cluster. It lives in a venv of
//! its own under `~/.cache/ebpf-cni/`, installed once (the venv is kept while it imports).
//! A resource whose kind has no schema is a failure too (the tool only warns).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::{build, cmd};

/// The Kubernetes version whose schemas the manifests must satisfy: the oldest the
/// DaemonSet is meant for, so nothing newer slips in.
pub const KUBERNETES_VERSION: &str = "1.31.0";

/// The validator, pinned: the version this step was written against.
const KUBERNETES_VALIDATE: &str = "kubernetes-validate==1.37.0";

/// The venv's python (`~/.cache/ebpf-cni/kubernetes-validate/bin/python`).
fn venv_python() -> Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    Ok(PathBuf::from(home).join(".cache/ebpf-cni/kubernetes-validate/bin/python"))
}

/// The validator's command, installed first if its venv does not import it.
pub fn validator() -> Result<PathBuf> {
    let python = venv_python()?;
    if !cmd::succeeds(Command::new(&python).args(["-c", "import kubernetes_validate"])) {
        let venv = python
            .parent()
            .and_then(Path::parent)
            .expect("bin/python lives two levels below the venv");
        cmd::run(Command::new("python3").args(["-m", "venv"]).arg(venv))?;
        cmd::run(Command::new(&python).args(["-m", "pip", "install", "-q", KUBERNETES_VALIDATE]))?;
    }
    Ok(python.with_file_name("kubernetes-validate"))
}

/// `deploy/*.yaml`, sorted.
pub fn manifests() -> Result<Vec<PathBuf>> {
    let dir = build::workspace_root().join("deploy");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("no manifest in {}", dir.display());
    }
    Ok(files)
}

/// Validates `files` (see the module head); the validator's report is printed.
pub fn validate_files(files: &[PathBuf]) -> Result<()> {
    let mut c = Command::new(validator()?);
    c.args(["--strict", "--kubernetes-version", KUBERNETES_VERSION])
        .args(files);
    let line = cmd::display(&c);
    eprintln!("$ {line}");
    let out = c
        .output()
        .with_context(|| format!("failed to start `{line}`"))?;
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    print!("{report}");
    if !out.status.success() {
        bail!(
            "`{line}` failed ({}): the manifests are invalid",
            out.status
        );
    }
    let warnings: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("WARN") || l.starts_with("ERROR"))
        .collect();
    if !warnings.is_empty() {
        bail!(
            "the manifests are not valid for Kubernetes {KUBERNETES_VERSION}: {}",
            warnings.join("; ")
        );
    }
    for f in files {
        let name = f.to_string_lossy();
        if !report
            .lines()
            .any(|l| l.starts_with("INFO") && l.contains(&*name) && l.contains(" passed "))
        {
            bail!("{name}: no resource was validated");
        }
    }
    Ok(())
}

/// `cargo xtask validate-manifests`.
pub fn validate() -> Result<()> {
    let files = manifests()?;
    validate_files(&files)?;
    println!(
        "manifests valid for Kubernetes {KUBERNETES_VERSION} (strict): {}",
        files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The DaemonSet's manifest with one edit, in a file of its own.
    fn broken(dir: &Path, from: &str, to: &str) -> PathBuf {
        let path = build::workspace_root().join("deploy/ebpf-cni.yaml");
        let text = std::fs::read_to_string(path).unwrap();
        assert!(text.contains(from), "the manifest has no {from:?} to break");
        let out = dir.join(format!("broken-{}.yaml", from.len()));
        std::fs::write(&out, text.replacen(from, to, 1)).unwrap();
        out
    }

    #[test]
    fn the_deploy_manifests_are_valid() {
        validate().unwrap();
    }

    #[test]
    fn broken_manifests_fail() {
        let tmp = tempfile::tempdir().unwrap();
        let tmp = tmp.path().to_path_buf();
        for (from, to) in [
            ("hostNetwork: true", "hostNetwrok: true"),
            ("args: [\"install\"]", "args: \"install\""),
            ("kind: DaemonSet", "kind: DaemonSett"),
            (
                "- name: cni-bin\n          hostPath",
                "- name: cni-bin\n          hostPth",
            ),
        ] {
            let file = broken(&tmp, from, to);
            let err = validate_files(&[file]).unwrap_err();
            assert!(
                err.to_string().contains("invalid") || err.to_string().contains("not valid"),
                "{from:?} -> {to:?}: {err:#}"
            );
        }
    }
}
