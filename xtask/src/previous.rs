//! `cargo xtask build-previous`: the previous release's plugin, built from git, for the
//! upgrade test (`tests/tests/upgrade.rs`), which attaches pods with it and then drives them
//! with the current build, as replacing the binary on a node does.
//!
//! The release is [`PREVIOUS_RELEASE`], a commit of this repository. Its sources come out
//! of git (`git archive`, no worktree registered in the repository) into
//! `<target>/previous/src-<commit>/` and build with the same two steps as `cargo xtask
//! build` ([`build::build_tree`]), with the eBPF flags that release's xtask names
//! ([`build::bpf_rustflags_of`]), into a target directory of their own,
//! `<target>/previous/target/`: building the old sources in the workspace's target
//! directory would put the old binary at `target/release/ebpf-cni`, where the current one is
//! expected. That directory stays from one pinned commit to the next, so a bump rebuilds
//! only what changed. The binary lands in `<target>/previous/<commit>/ebpf-cni`; when it is
//! there, nothing is built (the build is once per fresh clone).
//!
//! A clone that lacks the commit (a shallow one, as CI systems make) fetches it from
//! `origin`; when that fails the build fails, naming the commit and why.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context as _, Result};

use crate::build::{self, BuildOptions, Tree};
use crate::cmd;

/// The release whose nodes the current build must keep working: the commit last merged
/// into main before the current work. To bump it after a release, put the new commit's
/// full hash here (`git rev-parse main`); the next `cargo xtask test` builds it once.
pub const PREVIOUS_RELEASE: &str = "167c4dc2957922fad809ac6740c4575c98293ea4";

/// Read by the upgrade test: the harness owns the name.
pub use ebpf_cni_tests::PREVIOUS_BIN_ENV;

const PLUGIN_BIN: &str = "ebpf-cni";

/// The previous release's plugin binary, built unless it already is; returns its path.
pub fn build() -> Result<PathBuf> {
    let base = build::target_dir()?.join("previous");
    let bin = base.join(PREVIOUS_RELEASE).join(PLUGIN_BIN);
    if bin.is_file() {
        eprintln!(
            "previous release {PREVIOUS_RELEASE}: built already, {}",
            bin.display()
        );
        return Ok(bin);
    }
    let started = Instant::now();
    let repo = build::workspace_root();
    ensure_commit(&repo, PREVIOUS_RELEASE)?;
    let src = base.join(format!("src-{PREVIOUS_RELEASE}"));
    extract(&repo, PREVIOUS_RELEASE, &src)?;
    let tree = Tree {
        bpf_globals: build::no_mangle_functions(&src.join("ebpf").join("src"))?,
        bpf_flags: build::bpf_rustflags_of(&src)?,
        root: src,
        target_dir: base.join("target"),
    };
    let built = build::build_tree(
        &tree,
        // The previous release has no test hooks to build; its link options do not change
        // what its pins and maps are.
        &BuildOptions {
            test_link: true,
            ..BuildOptions::default()
        },
    )
    .with_context(|| format!("building the previous release {PREVIOUS_RELEASE}"))?;
    let dir = bin.parent().expect("the binary is in a directory");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!(".{PLUGIN_BIN}.tmp"));
    std::fs::copy(&built, &tmp)
        .with_context(|| format!("copying {} to {}", built.display(), tmp.display()))?;
    std::fs::rename(&tmp, &bin)?;
    eprintln!(
        "previous release {PREVIOUS_RELEASE} built in {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        bin.display()
    );
    Ok(bin)
}

fn git(repo: &Path) -> Command {
    let mut c = Command::new("git");
    c.arg("-C").arg(repo);
    c
}

/// Makes sure `commit` is in the clone at `repo`, fetching it from `origin` if not.
fn ensure_commit(repo: &Path, commit: &str) -> Result<()> {
    let object = format!("{commit}^{{commit}}");
    if cmd::succeeds(git(repo).args(["cat-file", "-e", &object])) {
        return Ok(());
    }
    let shallow = cmd::output(git(repo).args(["rev-parse", "--is-shallow-repository"]))
        .is_ok_and(|s| s.trim() == "true");
    eprintln!(
        "the previous release {commit} is not in this {}clone: fetching it from origin",
        if shallow { "shallow " } else { "" }
    );
    let mut fetch = git(repo);
    fetch.args(["fetch", "--no-tags"]);
    // In a shallow clone only that commit, not the history behind it; in a full one,
    // `--depth` would make the clone shallow.
    if shallow {
        fetch.arg("--depth=1");
    }
    fetch.args(["origin", commit]);
    let fetched = cmd::run(&mut fetch);
    if fetched.is_ok() && cmd::succeeds(git(repo).args(["cat-file", "-e", &object])) {
        return Ok(());
    }
    let why = match fetched {
        Err(e) => format!("{e:#}"),
        Ok(()) => "the fetch succeeded but did not bring the commit".to_string(),
    };
    bail!(
        "the upgrade test needs the previous release, commit {commit} (xtask/src/previous.rs \
         PREVIOUS_RELEASE), and this clone ({}) does not have it: fetching it from origin \
         failed: {why}. Fetch it by hand (`git fetch origin {commit}`) or clone with history",
        repo.display()
    )
}

/// `commit`'s files, extracted to `dest` (replaced if an earlier extraction was cut short).
fn extract(repo: &Path, commit: &str, dest: &Path) -> Result<()> {
    let done = dest.join(".extracted");
    if done.is_file() {
        return Ok(());
    }
    if dest.exists() {
        std::fs::remove_dir_all(dest).with_context(|| format!("removing {}", dest.display()))?;
    }
    std::fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
    let archive = dest.join(".archive.tar");
    cmd::run(
        git(repo)
            .args(["archive", "--format=tar", "-o"])
            .arg(&archive)
            .arg(commit),
    )?;
    cmd::run(
        Command::new("tar")
            .arg("-xf")
            .arg(&archive)
            .arg("-C")
            .arg(dest),
    )?;
    std::fs::remove_file(&archive)?;
    std::fs::write(&done, commit)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pin is a full commit hash: an abbreviation may become ambiguous as the history
    /// grows, and a branch name would move.
    #[test]
    fn the_previous_release_is_a_full_commit_hash() {
        assert_eq!(PREVIOUS_RELEASE.len(), 40);
        assert!(PREVIOUS_RELEASE
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    }
}
