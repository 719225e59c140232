//! Cleanup: what each subject leaves on the node after the DEL variants runtimes really
//! send: DEL twice, DEL after the pod's namespace is gone (empty `CNI_NETNS`), DEL without
//! `prevResult`, DEL without `runtimeConfig`.
//!
//! The node first adds and deletes a warm-up pod, then keeps one resident pod throughout, so
//! node-wide state that legitimately stays (shared iptables chains, pinned node maps)
//! exists before the first snapshot.
//! Each scenario snapshots the node, adds a pod with a hostPort and a bandwidth limit, runs
//! its DELs and snapshots again *before* the pod's namespace is deleted (deleting it would
//! destroy a leaked veth and hide the leak); what the second snapshot has in addition is
//! left over.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use serde_json::Value;

use crate::log::progress;
use crate::model::{first_line, Subject};
use crate::rig::topo::{self, BenchNode, Binaries};
use xtask::cmd;

const RESIDENT_HOST_PORT: u16 = 45_000;
const FIRST_HOST_PORT: u16 = 45_001;
const RATE_BPS: u64 = 100_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub enum Scenario {
    DelTwice,
    EmptyNetns,
    NoPrevResult,
    NoRuntimeConfig,
}

impl Scenario {
    pub const ALL: [Scenario; 4] = [
        Scenario::DelTwice,
        Scenario::EmptyNetns,
        Scenario::NoPrevResult,
        Scenario::NoRuntimeConfig,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Scenario::DelTwice => "DEL, then DEL again",
            Scenario::EmptyNetns => "pod netns deleted, then DEL with CNI_NETNS=\"\"",
            Scenario::NoPrevResult => "DEL without prevResult",
            Scenario::NoRuntimeConfig => "DEL without runtimeConfig",
        }
    }
}

/// Categories of node state compared before and after.
pub const CATEGORIES: [&str; 7] = [
    "links",
    "routes",
    "pins",
    "map entries",
    "leases",
    "iptables rules",
    "tc qdiscs",
];

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Outcome {
    /// "ok" or the error of each DEL, in order.
    pub dels: Vec<String>,
    /// Per category, what is there after that was not before.
    pub leftovers: BTreeMap<String, Vec<String>>,
    /// Set when the scenario could not be run.
    pub error: Option<String>,
}

impl Outcome {
    pub fn total(&self) -> usize {
        self.leftovers.values().map(Vec::len).sum()
    }
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Output {
    pub outcomes: BTreeMap<Scenario, BTreeMap<Subject, Outcome>>,
}

pub fn run(bins: &Binaries) -> Output {
    let mut out = Output::default();
    for s in Subject::CNI {
        progress(&format!("cleanup: {}", s.label()));
        match subject(s, bins, &mut out) {
            Ok(()) => {}
            Err(e) => {
                progress(&format!("cleanup: {} failed: {e:#}", s.label()));
                for sc in Scenario::ALL {
                    out.outcomes
                        .entry(sc)
                        .or_default()
                        .entry(s)
                        .or_insert_with(|| Outcome {
                            error: Some(first_line(&format!("{e:#}"))),
                            ..Outcome::default()
                        });
                }
            }
        }
    }
    out
}

fn subject(s: Subject, bins: &Binaries, out: &mut Output) -> Result<()> {
    let node = BenchNode::new(s, bins)?;
    // One full ADD + DEL first: state a subject creates once per node on first use (e.g.
    // empty ip6tables base chains portmap's first DEL creates) is not a per-pod leftover.
    let (warm_up, _) = node.add_pod(
        "warm-up",
        topo::caps(&[(RESIDENT_HOST_PORT - 1, 80)], Some(RATE_BPS)),
    )?;
    node.del(&warm_up).context("DEL of the warm-up pod")?;
    drop(warm_up);
    let (_resident, _) = node.add_pod(
        "resident",
        topo::caps(&[(RESIDENT_HOST_PORT, 80)], Some(RATE_BPS)),
    )?;
    for (i, sc) in Scenario::ALL.into_iter().enumerate() {
        let outcome = scenario(&node, sc, FIRST_HOST_PORT + i as u16).unwrap_or_else(|e| Outcome {
            error: Some(first_line(&format!("{e:#}"))),
            ..Outcome::default()
        });
        out.outcomes.entry(sc).or_default().insert(s, outcome);
    }
    Ok(())
}

fn scenario(node: &BenchNode, sc: Scenario, host_port: u16) -> Result<Outcome> {
    let before = snapshot(node)?;
    let mut pod = node.new_pod(
        &format!("cleanup-{host_port}"),
        topo::caps(&[(host_port, 80)], Some(RATE_BPS)),
    )?;
    node.add(&mut pod).context("ADD")?;
    let result = |r: Result<crate::rig::exec::OpCost>| match r {
        Ok(_) => "ok".to_owned(),
        Err(e) => format!("error: {}", first_line(&format!("{e:#}"))),
    };
    let mut dels = Vec::new();
    let mut netns = Some(pod.netns);
    match sc {
        Scenario::DelTwice => {
            dels.push(result(node.chain.del(&pod.att, pod.cached.as_ref())));
            dels.push(result(node.chain.del(&pod.att, pod.cached.as_ref())));
        }
        Scenario::EmptyNetns => {
            if let Some(ns) = netns.take() {
                ns.delete()?;
            }
            // The kernel destroys the pod's veth pair asynchronously.
            wait_until(Duration::from_secs(3), || {
                snapshot(node).is_ok_and(|now| !diff(&before, &now).contains_key("links"))
            });
            let mut att = pod.att.clone();
            att.netns = String::new();
            dels.push(result(node.chain.del(&att, pod.cached.as_ref())));
        }
        Scenario::NoPrevResult => {
            dels.push(result(node.chain.del(&pod.att, None)));
        }
        Scenario::NoRuntimeConfig => {
            let mut att = pod.att.clone();
            att.capability_args.clear();
            dels.push(result(node.chain.del(&att, pod.cached.as_ref())));
        }
    }
    let after = snapshot(node)?;
    drop(netns);
    Ok(Outcome {
        dels,
        leftovers: diff(&before, &after),
        error: None,
    })
}

fn wait_until(limit: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline && !ok() {
        std::thread::sleep(Duration::from_millis(100));
    }
}

type Snapshot = BTreeMap<&'static str, BTreeSet<String>>;

fn diff(before: &Snapshot, after: &Snapshot) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for (cat, items) in after {
        let empty = BTreeSet::new();
        let was = before.get(cat).unwrap_or(&empty);
        let new: Vec<String> = items.difference(was).cloned().collect();
        if !new.is_empty() {
            out.insert((*cat).to_owned(), new);
        }
    }
    out
}

fn lines(text: &str) -> impl Iterator<Item = String> + '_ {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
}

fn snapshot(node: &BenchNode) -> Result<Snapshot> {
    let ns = node.node.netns();
    let mut snap = Snapshot::new();
    let links = ns.ip_ok(&["-o", "link", "show"])?;
    snap.insert(
        "links",
        links
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_owned())
            .collect(),
    );
    let mut routes = BTreeSet::new();
    for fam in ["-4", "-6"] {
        routes.extend(lines(&ns.ip_ok(&[fam, "route", "show"])?));
    }
    snap.insert("routes", routes);
    snap.insert(
        "pins",
        node.node
            .pinned_files()
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
    );
    snap.insert("map entries", map_entries(node.node.pin_root())?);
    snap.insert(
        "leases",
        node.node
            .leases(topo::NETWORK)
            .into_iter()
            .map(|l| format!("{} ({})", l.ip, l.container_id))
            .collect(),
    );
    let mut rules = BTreeSet::new();
    for tool in ["iptables-save", "ip6tables-save"] {
        let text = cmd::output(
            Command::new("nsenter")
                .arg(format!("--net={}", ns.path().display()))
                .arg("--")
                .arg(tool),
        )?;
        for l in text.lines() {
            if l.starts_with("-A") {
                rules.insert(format!("{tool}: {l}"));
            } else if let Some(chain) = l.strip_prefix(':') {
                // ":CHAIN POLICY [packets:bytes]": the counters change, the chain does not.
                let name = chain.split_whitespace().next().unwrap_or(chain);
                rules.insert(format!("{tool}: chain {name}"));
            }
        }
    }
    snap.insert("iptables rules", rules);
    let qdiscs = cmd::output(Command::new("tc").args(["-n", ns.name(), "qdisc", "show"]))?;
    snap.insert("tc qdiscs", lines(&qdiscs).collect());
    Ok(snap)
}

/// Entries of the hash-type maps pinned under `root` (array maps always hold all their
/// entries, so they say nothing about leftovers), as "<pin>: <key bytes>".
fn map_entries(root: &Path) -> Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    for rel in ebpf_cni_tests::fsutil::list_files(root)? {
        let path = root.join(&rel);
        let Ok(show) = cmd::output(
            Command::new("bpftool")
                .args(["-j", "map", "show", "pinned"])
                .arg(&path),
        ) else {
            continue; // not a map (a link or a program)
        };
        let info: Value = serde_json::from_str(&show).unwrap_or(Value::Null);
        let kind = info.get("type").and_then(Value::as_str).unwrap_or("");
        if !(kind.contains("hash") || kind == "lpm_trie") {
            continue;
        }
        let dump = cmd::output(
            Command::new("bpftool")
                .args(["-j", "map", "dump", "pinned"])
                .arg(&path),
        )?;
        let entries: Value = serde_json::from_str(&dump).unwrap_or(Value::Null);
        for e in entries.as_array().into_iter().flatten() {
            let key = e
                .get("key")
                .map(|k| k.to_string())
                .unwrap_or_default()
                .replace('"', "");
            out.insert(format!("{}: {key}", rel.display()));
        }
    }
    Ok(out)
}
