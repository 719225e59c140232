//! The node's netfilter rules, read from the kernel itself, as far as `services` and
//! `firewall` need them: no `iptables-save` or `nft` is run, so the agent in the DaemonSet's
//! image (which has neither) reads what STATUS on the host reads, and a pass costs a few
//! netlink messages and socket options instead of six process spawns.
//!
//! Two backends hold rules:
//! - nf_tables (`nftables`), read over netlink (`NETLINK_NETFILTER`): the tables
//!   iptables-nft writes (`ip filter`, `ip nat`, …), kube-proxy's own in nftables mode
//!   (`ip kube-proxy`, `ip6 kube-proxy`) and every native ruleset (firewalld, ufw on nft);
//! - the legacy x_tables (`xtables`), read with `IPT_SO_GET_INFO`/`IPT_SO_GET_ENTRIES` and
//!   their IPv6 twins: what iptables-legacy writes.
//!
//! Both are read into one small model: tables of chains of rules, each rule reduced to its
//! destination match, its verdict and the mark it sets. What the model does not keep (the
//! other matches) neither reader needs.

pub mod masq_ports;
mod model;
pub mod nftables;
mod xtables;

pub use model::{network, Backend, Family, Hook, Rule, Table, Verdict};
// What the readers' users build by hand in their tests.
#[cfg(test)]
pub use model::{Chain, Set};

/// The tables of both backends in the calling thread's network namespace. A backend that
/// cannot be read (no module, no permission) holds nothing; the error goes to the debug
/// log. `want` says which nf_tables chains and sets are read (the legacy tables come
/// whole: one socket option each).
pub fn read(want: &nftables::Want) -> Vec<Table> {
    let mut tables = xtables::read();
    match nftables::read(want) {
        Ok(t) => tables.extend(t),
        Err(e) => log::debug!("nf_tables: {e}"),
    }
    tables
}
