//! `cargo xtask pgo`: writes the profile the plugin's static x86_64 release build is
//! optimized with (LLVM's profile-guided optimization), `plugin/pgo/<triple>.profdata`.
//!
//! A CNI plugin is a process per command, and its code comes into the process a fault at a
//! time: each first touch of its text maps the 64 KiB around it. The release binary's text
//! is 4 MiB, and one ADD touched 44 places spread over all of it. With the profile LLVM
//! knows which functions run: those that never ran in the training are set apart (the
//! linker's `.text.unlikely`) and optimized for size, the hottest are put together
//! (`.text.hot`), and inlining and branch layout follow what runs. On a test node, ADDs
//! alternating with a build of the same code without the profile took 85 page faults
//! instead of 94 and 4–9% less time; CHECK and DEL about 5% less CPU
//! (docs/design-decisions.md, "The profile").
//!
//! The task builds the plugin instrumented (`-Cprofile-generate`, in a target directory of
//! its own), plays a container runtime on a throw-away node with it — what a busy node
//! runs: ADD, CHECK, GC, STATUS and DEL of pods with host ports and limits, dual-stack pods
//! that masquerade behind an uplink, DELs repeated, the operator's commands once — and
//! merges the counts with `llvm-profdata`. The runs that load and unload the node's programs
//! (the node's first ADD and last DEL, once per boot) count apart and are left out: the
//! parse of the eBPF object would make most of the profile. So the loader is optimized for
//! size; the first ADD took as long as before (110–130 ms).
//!
//! The profile names functions as the build names them, which depends neither on the
//! checkout's path nor on its target directory. A function changed since the profile was
//! written is optimized as without one (LLVM checks each function's shape against its
//! counts): after changes to the plugin, run this again. Needs root, and rustup's
//! `llvm-tools` (installed when missing).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, ensure, Context as _, Result};
use ebpf_cni_tests::{
    config::{self, Stack},
    external::ExternalHost,
    require_root, unique_container_id, Attachment, NetConfList, Node, PluginUnderTest,
};
use serde_json::json;

use crate::{
    build::{self, BuildOptions, CrossTarget, Pgo, Tree, PROFILED_TARGET},
    cmd,
};

/// Pods of the host-port network, and how many times they are all added and deleted.
const PODS: usize = 30;
const ROUNDS: usize = 3;
/// Masquerading dual-stack pods.
const MASQ_PODS: usize = 6;

/// The `.profraw` files in `dir` (none if it does not exist).
fn profraws(dir: &Path) -> Result<Vec<PathBuf>> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    Ok(std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "profraw"))
        .collect())
}

/// `cargo xtask pgo`: the profile, written where the release build reads it.
pub fn pgo() -> Result<()> {
    let kept = build::profile_of(&build::workspace_root(), PROFILED_TARGET);
    write_profile(&kept)
}

/// `cargo xtask pgo --check`: the whole task, its profile written into the target
/// directory (the kept one stays as it is), then compared with the kept one (`llvm-profdata
/// overlap`: how much of the kept profile still matches the code).
pub fn check() -> Result<()> {
    let out = build::target_dir()?.join("pgo").join("check.profdata");
    write_profile(&out)?;
    let kept = build::profile_of(&build::workspace_root(), PROFILED_TARGET);
    let overlap = cmd::output(
        Command::new(llvm_profdata()?)
            .arg("overlap")
            .arg(&kept)
            .arg(&out),
    )?;
    for line in overlap.lines().filter(|l| {
        l.contains("Edge profile overlap")
            || l.contains("Mismatched-function")
            || l.contains("Overlap:")
    }) {
        eprintln!("the kept profile against this training: {}", line.trim());
    }
    Ok(())
}

/// What `cargo xtask test` runs, so the training cannot rot: its workload, played with
/// `bin`, a build that is not instrumented (it writes no counts). The instrumented build is
/// `dist`'s with `-Cprofile-generate` for `-Cprofile-use`; building it too cost each CI run
/// five minutes, so only `cargo xtask pgo` and `cargo xtask pgo --check` build it.
pub fn check_workload(bin: &Path) -> Result<()> {
    require_root();
    let unused = build::target_dir()?.join("pgo").join("workload-counts");
    train(bin, &unused).context("the training run failed")
}

/// Builds the plugin instrumented, trains it and writes the merged profile to `out`.
fn write_profile(out: &Path) -> Result<()> {
    require_root();
    let profdata = llvm_profdata()?;
    let current = Tree::current()?;
    let tree = Tree {
        target_dir: current.target_dir.join("pgo"),
        ..current.clone()
    };
    let raw = tree.target_dir.join("profraw");
    if raw.exists() {
        std::fs::remove_dir_all(&raw).with_context(|| format!("removing {}", raw.display()))?;
    }
    std::fs::create_dir_all(&raw).with_context(|| format!("creating {}", raw.display()))?;
    // The eBPF object is the release build's own (in the workspace's target directory).
    let obj = build::build_ebpf(&current)?;
    let bin = build::build_plugin_with(
        &tree,
        &obj,
        &BuildOptions::default(),
        Some(CrossTarget {
            triple: PROFILED_TARGET,
            cross_cc: None,
        }),
        &Pgo::Generate(raw.clone()),
    )?;
    let once = tree.target_dir.join("profraw-once");
    if once.exists() {
        std::fs::remove_dir_all(&once).with_context(|| format!("removing {}", once.display()))?;
    }
    train(&bin, &once).context("the training run failed")?;

    let runs = profraws(&raw)?;
    ensure!(
        !runs.is_empty() && !profraws(&once)?.is_empty(),
        "the instrumented plugin wrote no profile into {} or {}",
        raw.display(),
        once.display()
    );
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    cmd::run(
        Command::new(&profdata)
            .args(["merge", "-o"])
            .arg(out)
            .args(&runs),
    )?;
    let summary = cmd::output(Command::new(&profdata).arg("show").arg(out))?;
    eprintln!("{}: {}", out.display(), summary.trim().replace('\n', "; "));
    Ok(())
}

/// rustup's `llvm-profdata` of the toolchain that builds the plugin, its component added
/// when missing (a profile must be read by the LLVM that wrote its format, or a newer one).
fn llvm_profdata() -> Result<PathBuf> {
    let sysroot = cmd::output(Command::new("rustc").args(["--print", "sysroot"]))?;
    let vv = cmd::output(Command::new("rustc").arg("-vV"))?;
    let Some(host) = vv.lines().find_map(|l| l.strip_prefix("host: ")) else {
        bail!("`rustc -vV` names no host");
    };
    let tool = Path::new(sysroot.trim())
        .join("lib/rustlib")
        .join(host.trim())
        .join("bin/llvm-profdata");
    if !tool.is_file() {
        cmd::run(Command::new("rustup").args(["component", "add", "llvm-tools"]))?;
    }
    ensure!(
        tool.is_file(),
        "no llvm-profdata at {} after `rustup component add llvm-tools`",
        tool.display()
    );
    Ok(tool)
}

/// The runtime's part: what a node's runtime asks of the plugin, with the instrumented
/// binary `bin` as `ebpf-cni`. The runs that load and unload the node's programs (a node's
/// first ADD and its last DEL, once per boot) write their counts to `once` instead, which
/// the profile leaves out: the object's parse would otherwise make up most of it.
fn train(bin: &Path, once: &Path) -> Result<()> {
    let p = PluginUnderTest::at(bin.to_path_buf());
    let node = Node::new()?;
    let ext = ExternalHost::attach(node.netns(), "uplink0", 61)?;
    let once_env = vec![(
        "LLVM_PROFILE_FILE".to_owned(),
        once.join("%p.profraw").display().to_string(),
    )];

    let mut conf = p.conf("1.1.0", &node, Stack::V4);
    conf["capabilities"] = json!({"portMappings": true, "bandwidth": true});
    let ports = NetConfList::single(&conf);
    let mut masq = config::standard(
        "1.1.0",
        "pgomasq",
        &p.plugin_type,
        node.data_dir(),
        Stack::Dual,
    );
    masq["ipMasq"] = json!(true);
    masq["ipam"]["ranges"] = json!([[{"subnet": "10.61.0.0/24"}], [{"subnet": "fd00:61::/64"}]]);
    let masq = NetConfList::single(&masq);

    // One pod per network for the whole run: the programs stay loaded.
    let mut seeds = Vec::new();
    for list in [&ports, &masq] {
        let ns = node.new_pod()?;
        let mut att = Attachment::new(&unique_container_id(), ns.path(), "eth0");
        att.extra_env = once_env.clone();
        let result = p.runtime.add(&node, list, &att)?;
        seeds.push((ns, att, result));
    }

    let mut pods = Vec::new();
    for _ in 0..PODS {
        pods.push(node.new_pod()?);
    }
    for round in 0..ROUNDS {
        let mut added = Vec::new();
        for (i, ns) in pods.iter().enumerate() {
            let att = Attachment::new(&unique_container_id(), ns.path(), "eth0")
                .with_capability(
                    "portMappings",
                    json!([{"hostPort": 30_000 + i, "containerPort": 80, "protocol": "tcp"}]),
                )
                .with_capability(
                    "bandwidth",
                    json!({"ingressRate": 100_000_000, "ingressBurst": 2_000_000,
                           "egressRate": 100_000_000, "egressBurst": 2_000_000}),
                );
            let result = p.runtime.add(&node, &ports, &att)?;
            added.push((att, result));
        }
        for (att, result) in &added {
            p.runtime.check(&node, &ports, att, result)?;
        }
        let valid: Vec<(&str, &str)> = added
            .iter()
            .map(|(a, _)| a)
            .chain(std::iter::once(&seeds[0].1))
            .map(|a| (a.container_id.as_str(), a.ifname.as_str()))
            .collect();
        p.runtime.gc(&node, &ports, &valid)?;
        p.runtime.status(&node, &ports)?;
        for (k, (att, result)) in added.iter().enumerate() {
            p.runtime.del(&node, &ports, att, Some(result))?;
            // Runtimes repeat DELs, the later ones often without the namespace.
            if (k + round) % 3 == 0 {
                let mut late = att.clone();
                late.netns = String::new();
                p.runtime.del(&node, &ports, &late, None)?;
            }
        }
    }

    let mut added = Vec::new();
    for _ in 0..MASQ_PODS {
        let ns = node.new_pod()?;
        let att = Attachment::new(&unique_container_id(), ns.path(), "eth0");
        let result = p.runtime.add(&node, &masq, &att)?;
        added.push((ns, att, result));
    }
    for (_, att, result) in &added {
        p.runtime.check(&node, &masq, att, result)?;
    }
    p.runtime.status(&node, &masq)?;
    for (_, att, result) in &added {
        p.runtime.del(&node, &masq, att, Some(result))?;
    }
    // An operator's commands, once, on a node of two pods: counted, so not cold.
    for args in [&["metrics"][..], &["inspect"], &["version"]] {
        let mut argv = vec![bin.to_str().context("the plugin's path is not UTF-8")?];
        argv.extend_from_slice(args);
        let out = node.netns().nsenter(&argv)?;
        ensure!(
            out.status.success(),
            "`ebpf-cni {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for ((_, att, result), list) in seeds.iter().zip([&ports, &masq]) {
        p.runtime.del(&node, list, att, Some(result))?;
    }
    drop(ext);
    Ok(())
}
