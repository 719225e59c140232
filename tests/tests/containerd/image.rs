//! A container image made on the spot, since no registry is reachable: a rootfs holding
//! Debian's statically linked busybox (package `busybox-static`), packed as a
//! `docker save` archive that `ctr images import` accepts. Its default command sleeps, so
//! the same image serves as the pod's sandbox ("pause") image; the test's container runs
//! busybox `httpd` from it instead.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Context, Result};
use serde_json::json;

/// Debian's `busybox-static` puts a static busybox here.
pub const BUSYBOX: &str = "/bin/busybox";
/// What `GET /` on the pod's httpd answers.
pub const INDEX_BODY: &str = "hello from the containerd pod\n";

/// Builds the image archive under `work` and returns its path. `reference` is the tag it
/// is imported as (e.g. `ecni.test/busybox:1`).
pub fn busybox_image(work: &Path, reference: &str) -> Result<PathBuf> {
    ensure!(
        Path::new(BUSYBOX).is_file(),
        "{BUSYBOX} is missing: install Debian's busybox-static (cargo xtask setup does)"
    );
    let rootfs = work.join("rootfs");
    for dir in ["bin", "etc", "www", "proc", "sys", "dev", "tmp"] {
        fs::create_dir_all(rootfs.join(dir))?;
    }
    fs::copy(BUSYBOX, rootfs.join("bin/busybox")).context("copying busybox")?;
    for applet in ["sh", "sleep", "httpd", "nc", "ip", "cat"] {
        symlink("busybox", rootfs.join("bin").join(applet))?;
    }
    fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n")?;
    fs::write(rootfs.join("etc/group"), "root:x:0:\n")?;
    fs::write(rootfs.join("www/index.html"), INDEX_BODY)?;

    let archive = work.join("archive");
    fs::create_dir_all(&archive)?;
    let layer_tmp = archive.join("layer.tar");
    run(Command::new("tar")
        .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
        .arg(&rootfs)
        .args(["-cf"])
        .arg(&layer_tmp)
        .arg("."))?;
    let layer_digest = sha256(&layer_tmp)?;
    fs::create_dir(archive.join(&layer_digest))?;
    let layer = format!("{layer_digest}/layer.tar");
    fs::rename(&layer_tmp, archive.join(&layer))?;

    // The sandbox runs the image's own command: sleep far longer than any test.
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Cmd": ["/bin/busybox", "sleep", "86400"],
            "Env": ["PATH=/bin"],
        },
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{layer_digest}")] },
    });
    let config_tmp = archive.join("config.json");
    fs::write(&config_tmp, serde_json::to_vec(&config)?)?;
    let config_name = format!("{}.json", sha256(&config_tmp)?);
    fs::rename(&config_tmp, archive.join(&config_name))?;
    let manifest = json!([{
        "Config": config_name,
        "RepoTags": [reference],
        "Layers": [layer],
    }]);
    fs::write(
        archive.join("manifest.json"),
        serde_json::to_vec(&manifest)?,
    )?;

    let tar = work.join("image.tar");
    run(Command::new("tar")
        .arg("-C")
        .arg(&archive)
        .arg("-cf")
        .arg(&tar)
        .arg("."))?;
    Ok(tar)
}

fn sha256(path: &Path) -> Result<String> {
    let out = Command::new("sha256sum").arg(path).output()?;
    ensure!(out.status.success(), "sha256sum {}", path.display());
    let text = String::from_utf8(out.stdout)?;
    Ok(text
        .split_whitespace()
        .next()
        .context("sha256sum printed nothing")?
        .to_owned())
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
