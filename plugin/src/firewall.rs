//! A host firewall on the forward hook, which the programs' redirects skip: a rule that
//! would drop or reject a pod's forwarded traffic (ufw, firewalld, Docker's FORWARD policy
//! and `DOCKER-USER`, a NetworkPolicy engine's chains) does not see pod traffic the
//! programs forward themselves. That is on purpose (a pod works on a Docker host, whose
//! FORWARD policy is DROP), and it is made visible: the node's first ADD warns once,
//! naming what it found, and `inspect` lists it. Service flows, which go through the stack
//! (see `services`), pass the forward hook as on any node.
//!
//! Found, in every table of both backends read from the kernel (`netfilter`: legacy
//! iptables, iptables-nft and native nftables, both families and `inet`): a forward-hook
//! chain whose policy is drop, and the drop and reject rules of the forward-hook chains and
//! of the chains they jump to, kube-proxy's own (`KUBE-*` chains, its `kube-proxy` table)
//! left out.

use std::collections::BTreeSet;

use crate::{
    bpf::{NodeId, PinRoot},
    netfilter::{self, nftables::Want, Backend, Family, Hook, Rule, Table, Verdict},
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
    forward_drops(&netfilter::read(&Want {
        chains: None,
        sets: &[],
    }))
}

/// kube-proxy's nftables table, whose forward chain drops only invalid packets.
const KUBE_PROXY_TABLE: &str = "kube-proxy";

/// The forward-hook chains' drop policies, and the drop and reject rules of those chains
/// and of the chains reachable from them, table by table: `iptables-legacy ip filter:
/// FORWARD policy DROP`, `nf_tables inet firewalld: -A filter_FORWARD -j REJECT`.
pub fn forward_drops(tables: &[Table]) -> Vec<String> {
    let mut out = Vec::new();
    for t in tables {
        if matches!(t.family, Family::Other(_)) || t.name == KUBE_PROXY_TABLE {
            continue;
        }
        let backend = match t.backend {
            Backend::Legacy => "iptables-legacy",
            Backend::Nftables => "nf_tables",
        };
        let label = format!("{backend} {} {}", t.family.as_str(), t.name);
        let forward = t
            .chains
            .iter()
            .filter(|c| c.hook == Some(Hook::Forward))
            .collect::<Vec<_>>();
        for c in forward.iter().filter(|c| c.policy_drop) {
            out.push(format!("{label}: {} policy DROP", c.name));
        }
        // The chains the forward hook reaches, depth first.
        let mut seen: BTreeSet<&str> = forward.iter().map(|c| c.name.as_str()).collect();
        let mut stack = forward;
        while let Some(chain) = stack.pop() {
            for rule in &chain.rules {
                match &rule.verdict {
                    Verdict::Drop | Verdict::Reject => {
                        out.push(format!("{label}: {}", render(&chain.name, rule)))
                    }
                    Verdict::Jump(to) | Verdict::Goto(to)
                        if !to.starts_with("KUBE-") && seen.insert(to) =>
                    {
                        stack.extend(t.chain(to));
                    }
                    _ => {}
                }
            }
        }
    }
    out
}

/// A rule as `iptables-save` would start it, with what the model keeps of it: `-A C
/// [-s A/N] [-d A/N] -j DROP|REJECT`.
fn render(chain: &str, rule: &Rule) -> String {
    let mut s = format!("-A {chain}");
    if let Some(a) = rule.saddr {
        s.push_str(&format!(" -s {a}"));
    }
    if let Some(d) = rule.daddr {
        s.push_str(&format!(" -d {d}"));
    }
    let target = if rule.verdict == Verdict::Drop {
        "DROP"
    } else {
        "REJECT"
    };
    s.push_str(&format!(" -j {target}"));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netfilter::Chain;

    fn chain(name: &str, hook: Option<Hook>, policy_drop: bool, rules: Vec<Rule>) -> Chain {
        Chain {
            name: name.to_owned(),
            hook,
            policy_drop,
            rules,
        }
    }

    fn rule(daddr: &str, verdict: Verdict) -> Rule {
        Rule {
            daddr: daddr.parse().ok(),
            verdict,
            ..Rule::default()
        }
    }

    fn table(backend: Backend, family: Family, name: &str, chains: Vec<Chain>) -> Table {
        Table {
            backend,
            family,
            name: name.to_owned(),
            chains,
            sets: Vec::new(),
        }
    }

    /// Docker's filter table as it writes it, with kube-proxy's and a ufw-like chain.
    fn docker(backend: Backend) -> Table {
        let jump = |c: &str| Verdict::Jump(c.to_owned());
        table(
            backend,
            Family::Ipv4,
            "filter",
            vec![
                chain(
                    "INPUT",
                    Some(Hook::Input),
                    false,
                    vec![rule("", Verdict::Drop)],
                ),
                chain(
                    "FORWARD",
                    Some(Hook::Forward),
                    true,
                    vec![
                        rule("", jump("DOCKER-USER")),
                        rule("", jump("DOCKER-ISOLATION-STAGE-1")),
                        rule("", jump("KUBE-FORWARD")),
                        rule("", jump("ufw-before-forward")),
                    ],
                ),
                chain(
                    "DOCKER-ISOLATION-STAGE-1",
                    None,
                    false,
                    vec![rule("", jump("DOCKER-ISOLATION-STAGE-2"))],
                ),
                chain(
                    "DOCKER-ISOLATION-STAGE-2",
                    None,
                    false,
                    vec![rule("", Verdict::Drop)],
                ),
                chain("DOCKER-USER", None, false, vec![rule("", Verdict::Return)]),
                chain("KUBE-FORWARD", None, false, vec![rule("", Verdict::Drop)]),
                chain(
                    "ufw-before-forward",
                    None,
                    false,
                    vec![
                        rule("", Verdict::Accept),
                        Rule {
                            saddr: "10.99.0.0/16".parse().ok(),
                            ..rule("10.0.0.0/8", Verdict::Reject)
                        },
                        // A chain jumped to twice is looked at once.
                        rule("", jump("DOCKER-ISOLATION-STAGE-2")),
                    ],
                ),
            ],
        )
    }

    #[test]
    fn forward_drops_are_found_through_the_jumps() {
        assert_eq!(
            forward_drops(&[docker(Backend::Legacy)]),
            [
                "iptables-legacy ip filter: FORWARD policy DROP",
                "iptables-legacy ip filter: -A ufw-before-forward -s 10.99.0.0/16 -d 10.0.0.0/8 -j REJECT",
                "iptables-legacy ip filter: -A DOCKER-ISOLATION-STAGE-2 -j DROP",
            ]
        );
        let open = table(
            Backend::Legacy,
            Family::Ipv4,
            "filter",
            vec![chain("FORWARD", Some(Hook::Forward), false, Vec::new())],
        );
        assert!(forward_drops(&[open]).is_empty());
    }

    #[test]
    fn native_forward_chains_are_found_and_kube_proxys_table_left_out() {
        let tables = [
            table(
                Backend::Nftables,
                Family::Inet,
                "firewalld",
                vec![chain(
                    "filter_FORWARD",
                    Some(Hook::Forward),
                    false,
                    vec![rule("", Verdict::Accept), rule("", Verdict::Reject)],
                )],
            ),
            table(
                Backend::Nftables,
                Family::Inet,
                "lockdown",
                vec![chain("fwd", Some(Hook::Forward), true, Vec::new())],
            ),
            table(
                Backend::Nftables,
                Family::Ipv4,
                "kube-proxy",
                vec![chain(
                    "filter-forward",
                    Some(Hook::Forward),
                    false,
                    vec![rule("", Verdict::Drop)],
                )],
            ),
            table(
                Backend::Nftables,
                Family::Other(7),
                "bridged",
                vec![chain("fwd", Some(Hook::Forward), true, Vec::new())],
            ),
        ];
        assert_eq!(
            forward_drops(&tables),
            [
                "nf_tables inet firewalld: -A filter_FORWARD -j REJECT",
                "nf_tables inet lockdown: fwd policy DROP",
            ]
        );
    }
}
