//! The node's netfilter FORWARD chain, through `iptables`/`ip6tables` in its namespace:
//! set the policy, read it back, and count what traverses the chain.
//!
//! Counting uses one rule with neither match nor target at the top of the chain: every
//! forwarded packet passes it (and is counted) before the policy decides. Policy counters
//! are not relied on, as the nft-based iptables does not always keep them.

use anyhow::{bail, Context, Result};

use crate::kernel::Family;
use crate::netns::Netns;

fn tool(family: Family) -> &'static str {
    match family {
        Family::V4 => "iptables",
        Family::V6 => "ip6tables",
    }
}

/// `iptables -w <args>` (or ip6tables) in `ns`; returns stdout.
pub fn iptables(ns: &Netns, family: Family, args: &[&str]) -> Result<String> {
    let mut cmd = vec![tool(family), "-w"];
    cmd.extend_from_slice(args);
    let out = ns.exec(&cmd)?;
    if !out.status.success() {
        bail!(
            "`{}` in {} failed: {}",
            cmd.join(" "),
            ns.name(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Sets the FORWARD policy (`DROP` or `ACCEPT`) and checks it took.
pub fn set_forward_policy(ns: &Netns, family: Family, policy: &str) -> Result<()> {
    iptables(ns, family, &["-P", "FORWARD", policy])?;
    let now = forward_policy(ns, family)?;
    if now != policy {
        bail!(
            "{} FORWARD policy is {now} after setting {policy}",
            tool(family)
        );
    }
    Ok(())
}

/// The FORWARD policy, from `-S FORWARD` (`-P FORWARD DROP`).
pub fn forward_policy(ns: &Netns, family: Family) -> Result<String> {
    let s = iptables(ns, family, &["-S", "FORWARD"])?;
    s.lines()
        .find_map(|l| l.strip_prefix("-P FORWARD "))
        .map(|p| p.trim().to_owned())
        .with_context(|| format!("no FORWARD policy in {s:?}"))
}

/// Adds the counting rule (see the module docs) to FORWARD.
pub fn add_forward_counter(ns: &Netns, family: Family) -> Result<()> {
    iptables(ns, family, &["-I", "FORWARD", "1"])?;
    Ok(())
}

/// Packets counted by the rules of FORWARD (`-vnxL`: the first column of each rule line).
pub fn forward_packets(ns: &Netns, family: Family) -> Result<u64> {
    let s = iptables(ns, family, &["-vnxL", "FORWARD"])?;
    let mut total = 0;
    let mut rules = 0;
    // Line 1: "Chain FORWARD (policy …)", line 2: column headers, then one line per rule.
    for line in s.lines().skip(2).filter(|l| !l.trim().is_empty()) {
        let pkts = line
            .split_whitespace()
            .next()
            .and_then(|f| f.parse::<u64>().ok())
            .with_context(|| format!("unreadable rule line {line:?} in\n{s}"))?;
        total += pkts;
        rules += 1;
    }
    if rules == 0 {
        bail!("FORWARD has no counting rule:\n{s}");
    }
    Ok(total)
}
