//! The kernel's run-time statistics of a node's pinned programs (counted while
//! `kernel.bpf_stats_enabled` is on), read with `bpftool prog show pinned`.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{ensure, Context as _, Result};
use ebpf_cni_tests::dataplane as dp;
use serde_json::Value;

use super::topo::BenchNode;

/// One program's statistics so far.
pub struct ProgStats {
    pub name: String,
    pub run_time_ns: u64,
    pub run_cnt: u64,
}

/// The statistics of the program pinned at `path`.
pub fn pinned(path: &Path) -> Result<ProgStats> {
    let out = Command::new("bpftool")
        .args(["-j", "prog", "show", "pinned"])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .context("running bpftool")?;
    ensure!(
        out.status.success(),
        "bpftool prog show pinned {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let v: Value = serde_json::from_slice(&out.stdout).context("bpftool's JSON")?;
    let get = |k: &str| v[k].as_u64().unwrap_or(0);
    Ok(ProgStats {
        name: v["name"].as_str().unwrap_or_default().to_owned(),
        run_time_ns: get("run_time_ns"),
        run_cnt: get("run_cnt"),
    })
}

/// Run time (ns) and run count so far of the node's pinned program `name`.
pub fn of(node: &BenchNode, name: &str) -> Result<(u64, u64)> {
    let path = dp::pinned_programs(&node.node)
        .into_iter()
        .find(|p| p.ends_with(name))
        .with_context(|| format!("the node has no pinned {name}"))?;
    let s = pinned(&path)?;
    Ok((s.run_time_ns, s.run_cnt))
}
