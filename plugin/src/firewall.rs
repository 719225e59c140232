//! A host firewall on the forward hook, which the programs' redirects skip: a rule that
//! would drop or reject a pod's forwarded traffic (ufw, firewalld, Docker's FORWARD policy
//! and `DOCKER-USER`, a NetworkPolicy engine's chains) does not see pod traffic the
//! programs forward themselves. That is on purpose (a pod works on a Docker host, whose
//! FORWARD policy is DROP), and it is made visible: the node's first ADD warns once,
//! naming what it found, and `inspect` lists it. Service flows, which go through the stack
//! (see `services`), pass the forward hook as on any node.
//!
//! Found: in `iptables-save` (legacy and nft backends, both families), a FORWARD policy of
//! DROP and the DROP and REJECT rules of FORWARD and of the chains it jumps to, kube-proxy's
//! own (`KUBE-*`) left out; in `nft list ruleset`, every chain on the forward hook with a
//! drop policy or a drop or reject statement, outside the tables iptables-nft and
//! kube-proxy manage.

use std::collections::{BTreeMap, BTreeSet};

use crate::{
    bpf::{NodeId, PinRoot},
    services::{legacy_tables, run},
};

/// The node's first ADD (no record yet under its pin directory) looks for a forward-hook
/// firewall and warns once, naming what it found; the record keeps the next ADDs from
/// looking again while the node has pods (it goes with the node's pins).
pub fn warn_once(node: &NodeId) {
    let record = PinRoot::from_env()
        .node_dir(node)
        .join(ebpf_cni_maps::pin::FORWARD_FIREWALL_RECORD);
    if record.exists() {
        return;
    }
    let found = detect();
    if !found.is_empty() {
        log::warn!(
            "the node's forward hook has rules that drop or reject forwarded traffic, which pod traffic the programs forward does not pass (Service flows do): {}",
            found.join("; ")
        );
    }
    if let Err(e) = std::fs::create_dir(&record) {
        log::debug!("{}: {e}", record.display());
    }
}

/// What would drop or reject forwarded traffic, one line each (empty: nothing).
pub fn detect() -> Vec<String> {
    let mut out = Vec::new();
    for (backend, tools) in [
        (
            "iptables-legacy",
            [
                (true, "iptables-legacy-save"),
                (false, "ip6tables-legacy-save"),
            ],
        ),
        (
            "iptables-nft",
            [(true, "iptables-nft-save"), (false, "ip6tables-nft-save")],
        ),
    ] {
        for (v4, tool) in tools {
            if backend == "iptables-legacy" && !legacy_tables(v4) {
                continue;
            }
            if let Some(save) = run(tool, &["-t", "filter"]) {
                let fam = if v4 { "IPv4" } else { "IPv6" };
                out.extend(
                    iptables_forward_drops(&save)
                        .into_iter()
                        .map(|l| format!("{backend} {fam}: {l}")),
                );
            }
        }
    }
    if let Some(ruleset) = run("nft", &["list", "ruleset"]) {
        out.extend(
            nft_forward_drops(&ruleset)
                .into_iter()
                .map(|l| format!("nftables: {l}")),
        );
    }
    out
}

/// The filter table's FORWARD policy when it is DROP, and the DROP and REJECT rules of
/// FORWARD and the chains reachable from it (kube-proxy's `KUBE-*` chains left out).
pub fn iptables_forward_drops(save: &str) -> Vec<String> {
    let mut policy_drop = false;
    let mut rules: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut in_filter = false;
    for line in save.lines() {
        if let Some(t) = line.strip_prefix('*') {
            in_filter = t.trim() == "filter";
            continue;
        }
        if !in_filter {
            continue;
        }
        if line.starts_with(":FORWARD DROP") {
            policy_drop = true;
        }
        if let Some(rest) = line.strip_prefix("-A ") {
            if let Some((chain, rule)) = rest.split_once(' ') {
                rules.entry(chain).or_default().push(rule);
            }
        }
    }
    let mut out = Vec::new();
    if policy_drop {
        out.push("FORWARD policy DROP".to_owned());
    }
    // The chains FORWARD reaches, breadth first.
    let mut seen = BTreeSet::from(["FORWARD"]);
    let mut queue = vec!["FORWARD"];
    while let Some(chain) = queue.pop() {
        for rule in rules.get(chain).into_iter().flatten() {
            let target = target_of(rule);
            match target {
                Some("DROP" | "REJECT") => out.push(format!("{chain}: -A {chain} {rule}")),
                Some(t) if rules.contains_key(t) && !t.starts_with("KUBE-") && seen.insert(t) => {
                    queue.push(t)
                }
                _ => {}
            }
        }
    }
    out
}

/// The `-j`/`-g` target of a rule.
fn target_of(rule: &str) -> Option<&str> {
    let mut w = rule.split_whitespace();
    while let Some(x) = w.next() {
        if x == "-j" || x == "-g" || x == "--jump" || x == "--goto" {
            return w.next();
        }
    }
    None
}

/// The tables whose rules `iptables-nft-save` already shows, or that are kube-proxy's.
fn managed_table(family: &str, name: &str) -> bool {
    matches!(
        (family, name),
        (
            "ip" | "ip6",
            "filter" | "nat" | "mangle" | "raw" | "security"
        ) | (_, "kube-proxy")
    )
}

/// The chains on the forward hook of `nft list ruleset` with a drop policy or a drop or
/// reject statement, outside [`managed_table`]s.
pub fn nft_forward_drops(ruleset: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut table: Option<(String, String)> = None;
    let mut chain: Option<String> = None;
    let mut forward = false;
    for line in ruleset.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("table ") {
            let mut w = rest.split_whitespace();
            let fam = w.next().unwrap_or("").to_owned();
            let name = w.next().unwrap_or("").to_owned();
            table = Some((fam, name));
            continue;
        }
        let Some((fam, name)) = &table else { continue };
        if managed_table(fam, name) {
            continue;
        }
        if let Some(rest) = t.strip_prefix("chain ") {
            chain = rest.split_whitespace().next().map(str::to_owned);
            forward = false;
            continue;
        }
        let Some(c) = &chain else { continue };
        if t.starts_with("type filter hook forward") {
            forward = true;
            if t.contains("policy drop") {
                out.push(format!("table {fam} {name} chain {c}: policy drop"));
            }
            continue;
        }
        if forward && t.split_whitespace().any(|w| w == "drop" || w == "reject") {
            out.push(format!("table {fam} {name} chain {c}: {t}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Docker's filter table as it writes it, with kube-proxy's and a ufw-like chain.
    const DOCKER: &str = "*filter\n\
        :INPUT ACCEPT [0:0]\n\
        :FORWARD DROP [0:0]\n\
        :DOCKER-USER - [0:0]\n\
        :DOCKER-ISOLATION-STAGE-1 - [0:0]\n\
        :DOCKER-ISOLATION-STAGE-2 - [0:0]\n\
        :KUBE-FORWARD - [0:0]\n\
        :ufw-before-forward - [0:0]\n\
        -A FORWARD -j DOCKER-USER\n\
        -A FORWARD -j DOCKER-ISOLATION-STAGE-1\n\
        -A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
        -A FORWARD -j ufw-before-forward\n\
        -A DOCKER-ISOLATION-STAGE-1 -i docker0 ! -o docker0 -j DOCKER-ISOLATION-STAGE-2\n\
        -A DOCKER-ISOLATION-STAGE-2 -o docker0 -j DROP\n\
        -A DOCKER-USER -j RETURN\n\
        -A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n\
        -A ufw-before-forward -p icmp -j ACCEPT\n\
        -A ufw-before-forward -s 10.0.0.0/8 -j REJECT --reject-with icmp-port-unreachable\n\
        COMMIT\n";

    #[test]
    fn iptables_forward_drops_are_found_through_the_jumps() {
        assert_eq!(
            iptables_forward_drops(DOCKER),
            [
                "FORWARD policy DROP",
                "ufw-before-forward: -A ufw-before-forward -s 10.0.0.0/8 -j REJECT --reject-with icmp-port-unreachable",
                "DOCKER-ISOLATION-STAGE-2: -A DOCKER-ISOLATION-STAGE-2 -o docker0 -j DROP",
            ]
        );
        assert!(iptables_forward_drops("*filter\n:FORWARD ACCEPT [0:0]\nCOMMIT\n").is_empty());
    }

    #[test]
    fn nft_forward_chains_are_found_outside_managed_tables() {
        let ruleset = "table inet firewalld {\n\
            \tchain filter_FORWARD {\n\
            \t\ttype filter hook forward priority filter + 10; policy accept;\n\
            \t\tct state established,related accept\n\
            \t\treject with icmpx admin-prohibited\n\
            \t}\n\
            }\n\
            table inet lockdown {\n\
            \tchain fwd {\n\
            \t\ttype filter hook forward priority 0; policy drop;\n\
            \t}\n\
            }\n\
            table ip filter {\n\
            \tchain FORWARD {\n\
            \t\ttype filter hook forward priority filter; policy drop;\n\
            \t}\n\
            }\n\
            table ip kube-proxy {\n\
            \tchain filter-forward {\n\
            \t\ttype filter hook forward priority -110; policy accept;\n\
            \t\tct state invalid drop\n\
            \t}\n\
            }\n";
        assert_eq!(
            nft_forward_drops(ruleset),
            [
                "table inet firewalld chain filter_FORWARD: reject with icmpx admin-prohibited",
                "table inet lockdown chain fwd: policy drop",
            ]
        );
    }
}
