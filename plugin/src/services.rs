//! Services next to kube-proxy: which destinations are Service addresses, learned from the
//! rules kube-proxy writes, so the programs hand those flows to the stack (see
//! `ebpf/src/services.rs`) and netfilter translates them both ways.
//!
//! kube-proxy's three modes each leave the Service addresses where this reads them:
//! - iptables mode (`pkg/proxy/iptables/proxier.go`): one rule per Service port in the nat
//!   table's `KUBE-SERVICES` (`-d <clusterIP>/32 ... -j KUBE-SVC-…`, external and
//!   load-balancer IPs `-j KUBE-EXT-…`), and in the filter table's `KUBE-SERVICES` and
//!   `KUBE-EXTERNAL-SERVICES` the REJECT of a Service without endpoints, and the mark
//!   `KUBE-MARK-MASQ` sets. Read from the kernel (`netfilter`), legacy and nft backends both.
//! - nftables mode (`pkg/proxy/nftables/proxier.go`): the tables `ip kube-proxy` and
//!   `ip6 kube-proxy`, whose `cluster-ips` set and `service-ips` and `no-endpoint-services`
//!   maps are keyed by the Service address, and the mark `mark-for-masquerade` sets. Read
//!   over netlink (`netfilter::nftables`).
//! - IPVS mode (`pkg/proxy/ipvs/proxier.go`): every ClusterIP is an address of the
//!   `kube-ipvs0` dummy device (`node::node_view` reads them with the node's addresses).
//!
//! `serviceCIDRs` in the config adds ranges to what is learned (for a node whose rules
//! cannot be read). No tool is run: the agent in the DaemonSet's image, which has no
//! iptables or nft, reads what STATUS on the host reads. ADD reads none of this; STATUS and
//! the agent do (a few small netlink dumps and one socket option per legacy table), and
//! converge the programs' map to it.

use std::net::IpAddr;

use ipnetwork::IpNetwork;

use crate::netfilter::{self, nftables::Want, Backend, Family, Table};

/// The dummy device kube-proxy's IPVS mode holds the Service addresses on.
pub const IPVS_DEVICE: &str = "kube-ipvs0";

/// Where the Service addresses came from, for `inspect` and the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    /// `serviceCIDRs` in the config.
    Config,
    /// kube-proxy's iptables rules, legacy backend.
    IptablesLegacy,
    /// kube-proxy's iptables rules, nft backend.
    IptablesNft,
    /// kube-proxy's nftables tables.
    Nftables,
    /// The addresses of `kube-ipvs0`.
    Ipvs,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Config => "config",
            Self::IptablesLegacy => "kube-proxy-iptables-legacy",
            Self::IptablesNft => "kube-proxy-iptables-nft",
            Self::Nftables => "kube-proxy-nftables",
            Self::Ipvs => "kube-proxy-ipvs",
        }
    }
}

/// What was learned: the Service ranges (sorted, once each), their sources, and
/// kube-proxy's masquerade mark (`KUBE-MARK-MASQ`'s, `mark-for-masquerade`'s; 0 where no
/// rule sets one).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Learned {
    pub nets: Vec<IpNetwork>,
    /// Those of `nets` kube-proxy translates (it has endpoints for them): a masquerading
    /// pod's packets to these carry `masq_mark`. The others (a Service without endpoints,
    /// which kube-proxy's filter rules REJECT) must not: kube-proxy's forward chain
    /// accepts marked packets before its REJECT.
    pub translated: Vec<IpNetwork>,
    pub sources: Vec<Source>,
    pub masq_mark: u32,
}

impl Learned {
    fn add(&mut self, source: Source, nets: Vec<(IpNetwork, bool)>) {
        if nets.is_empty() {
            return;
        }
        for (net, translated) in nets {
            self.nets.push(net);
            if translated {
                self.translated.push(net);
            }
        }
        if !self.sources.contains(&source) {
            self.sources.push(source);
        }
    }

    /// `kube-proxy-iptables-nft+config`, or `none`.
    pub fn describe(&self) -> String {
        if self.sources.is_empty() {
            return "none".to_owned();
        }
        self.sources
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("+")
    }
}

/// Learns the node's Service ranges (the calling thread is in the node's namespace):
/// `configured` (`serviceCIDRs`), kube-proxy's rules, and `ipvs`, the addresses of
/// [`IPVS_DEVICE`].
pub fn learn(configured: &[IpNetwork], ipvs: &[IpAddr]) -> Learned {
    let tables = netfilter::read(&Want {
        chains: Some(&READ_CHAINS),
        sets: &[(NFT_TABLE, &NFT_SERVICE_SETS.map(|(name, _)| name))],
    });
    learn_from(configured, &tables, ipvs)
}

/// [`learn`] from tables already read.
fn learn_from(configured: &[IpNetwork], tables: &[Table], ipvs: &[IpAddr]) -> Learned {
    let mut l = Learned::default();
    l.add(
        Source::Config,
        configured.iter().map(|n| (*n, true)).collect(),
    );
    for (source, wanted) in [
        (Source::IptablesLegacy, Backend::Legacy),
        (Source::IptablesNft, Backend::Nftables),
    ] {
        let mut nets = Vec::new();
        for t in tables
            .iter()
            .filter(|t| t.backend == wanted && iptables_table(t))
        {
            nets.extend(iptables_services(t));
            l.masq_mark = l.masq_mark.max(masq_mark(t, IPTABLES_MASQ_CHAIN));
        }
        l.add(source, nets);
    }
    let mut nets = Vec::new();
    for t in tables.iter().filter(|t| nftables_table(t)) {
        nets.extend(nftables_services(t));
        l.masq_mark = l.masq_mark.max(masq_mark(t, NFT_MASQ_CHAIN));
    }
    l.add(Source::Nftables, nets);
    l.add(
        Source::Ipvs,
        ipvs.iter()
            .map(|ip| (IpNetwork::from(*ip), true))
            .collect::<Vec<_>>(),
    );
    for v in [&mut l.nets, &mut l.translated] {
        v.sort();
        v.dedup();
    }
    l
}

/// The chains whose destination matches are Service addresses, in the nat table (with
/// endpoints: translated) and the filter table (the REJECT of a Service without them).
const SERVICE_CHAINS: [&str; 2] = ["KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES"];
/// The chain whose `MARK` target sets kube-proxy's masquerade mark (iptables mode).
const IPTABLES_MASQ_CHAIN: &str = "KUBE-MARK-MASQ";
/// kube-proxy's nftables table (both families), its masquerade-mark chain, and the sets
/// and maps keyed by a Service address, with whether kube-proxy translates what they hold
/// (`service-ips`: Services with endpoints).
const NFT_TABLE: &str = "kube-proxy";
const NFT_MASQ_CHAIN: &str = "mark-for-masquerade";
const NFT_SERVICE_SETS: [(&str, bool); 3] = [
    ("cluster-ips", false),
    ("service-ips", true),
    ("no-endpoint-services", false),
];
/// Every chain [`learn`] reads the rules of.
const READ_CHAINS: [&str; 4] = [
    SERVICE_CHAINS[0],
    SERVICE_CHAINS[1],
    IPTABLES_MASQ_CHAIN,
    NFT_MASQ_CHAIN,
];

/// An iptables table (legacy, or iptables-nft's of the same name) that holds kube-proxy's
/// iptables-mode chains.
fn iptables_table(t: &Table) -> bool {
    matches!(t.family, Family::Ipv4 | Family::Ipv6) && matches!(t.name.as_str(), "nat" | "filter")
}

/// kube-proxy's nftables-mode table.
fn nftables_table(t: &Table) -> bool {
    t.backend == Backend::Nftables
        && matches!(t.family, Family::Ipv4 | Family::Ipv6)
        && t.name == NFT_TABLE
}

/// The Service ranges of an iptables table: the destination of every rule of
/// [`SERVICE_CHAINS`] that matches one (`-d A/N`, not `! -d`), and whether it is the nat
/// table's (translated) rather than the filter table's.
fn iptables_services(t: &Table) -> Vec<(IpNetwork, bool)> {
    let nat = t.name == "nat";
    SERVICE_CHAINS
        .iter()
        .filter_map(|c| t.chain(c))
        .flat_map(|c| &c.rules)
        .filter_map(|r| r.daddr.map(|d| (d, nat)))
        .collect()
}

/// The Service addresses of kube-proxy's nftables table: the first field of every key of
/// [`NFT_SERVICE_SETS`] (`172.30.0.41 . tcp . 80`), and whether it is translated.
fn nftables_services(t: &Table) -> Vec<(IpNetwork, bool)> {
    let width = if t.family == Family::Ipv4 { 4 } else { 16 };
    let prefix = (width * 8) as u8;
    NFT_SERVICE_SETS
        .iter()
        .filter_map(|(name, translated)| Some((t.set(name)?, *translated)))
        .flat_map(|(set, translated)| {
            set.keys.iter().filter_map(move |k| {
                Some((netfilter::network(k.get(..width)?, prefix)?, translated))
            })
        })
        .collect()
}

/// The mark the rules of `chain` set (kube-proxy's masquerade mark); 0 without one.
fn masq_mark(t: &Table, chain: &str) -> u32 {
    t.chain(chain)
        .into_iter()
        .flat_map(|c| &c.rules)
        .find_map(|r| r.sets_mark)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netfilter::{Chain, Rule, Set, Verdict};

    fn nets(v: &[&str]) -> Vec<IpNetwork> {
        v.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn chain(name: &str, rules: Vec<Rule>) -> Chain {
        Chain {
            name: name.to_owned(),
            hook: None,
            policy_drop: false,
            rules,
        }
    }

    fn to(d: &str, verdict: Verdict) -> Rule {
        Rule {
            daddr: d.parse().ok(),
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

    /// kube-proxy's iptables-mode chains as its proxier writes them
    /// (`writeServiceToEndpointRules`, `syncProxyRules`), reduced to what the readers keep.
    fn iptables(backend: Backend) -> Vec<Table> {
        let jump = |c: &str| Verdict::Jump(c.to_owned());
        vec![
            table(
                backend,
                Family::Ipv4,
                "filter",
                vec![
                    chain("KUBE-SERVICES", vec![to("172.30.0.43/32", Verdict::Reject)]),
                    chain(
                        "KUBE-EXTERNAL-SERVICES",
                        vec![to("192.168.99.33/32", Verdict::Reject)],
                    ),
                ],
            ),
            table(
                backend,
                Family::Ipv4,
                "nat",
                vec![
                    chain(
                        "KUBE-SERVICES",
                        vec![
                            to("172.30.0.41/32", jump("KUBE-SVC-X")),
                            to("1.2.3.4/32", jump("KUBE-EXT-X")),
                            // `! -d 10.9.9.9/32 -j RETURN`, and the NodePorts' rule.
                            to("", Verdict::Return),
                            to("", jump("KUBE-NODEPORTS")),
                        ],
                    ),
                    chain(
                        "KUBE-MARK-MASQ",
                        vec![Rule {
                            sets_mark: Some(0x4000),
                            ..Rule::default()
                        }],
                    ),
                ],
            ),
            table(
                backend,
                Family::Ipv6,
                "nat",
                vec![chain(
                    "KUBE-SERVICES",
                    vec![to("fd00:30::a/128", jump("KUBE-SVC-Y"))],
                )],
            ),
            // Another table's chain of the same name is not kube-proxy's.
            table(
                backend,
                Family::Ipv4,
                "mangle",
                vec![chain(
                    "KUBE-SERVICES",
                    vec![to("10.7.7.7/32", Verdict::Accept)],
                )],
            ),
        ]
    }

    #[test]
    fn iptables_rules_give_every_service_address_from_either_backend() {
        for (backend, source) in [
            (Backend::Legacy, "kube-proxy-iptables-legacy"),
            (Backend::Nftables, "kube-proxy-iptables-nft"),
        ] {
            let l = learn_from(&[], &iptables(backend), &[]);
            assert_eq!(
                l.nets,
                nets(&[
                    "1.2.3.4/32",
                    "172.30.0.41/32",
                    "172.30.0.43/32",
                    "192.168.99.33/32",
                    "fd00:30::a/128"
                ])
            );
            assert_eq!(
                l.translated,
                nets(&["1.2.3.4/32", "172.30.0.41/32", "fd00:30::a/128"])
            );
            assert_eq!(l.describe(), source);
            assert_eq!(l.masq_mark, 0x4000);
        }
    }

    /// kube-proxy's nftables table as its proxier writes it: `cluster-ips`, the
    /// `service-ips` and `no-endpoint-services` maps keyed `address . proto . port`.
    #[test]
    fn nftables_tables_give_every_service_address() {
        let key = |a: [u8; 4], proto: u8, port: u16| {
            let mut k = a.to_vec();
            k.extend([proto, 0, 0, 0]);
            k.extend(port.to_be_bytes());
            k.extend([0, 0]);
            k
        };
        let mut t = table(
            Backend::Nftables,
            Family::Ipv4,
            "kube-proxy",
            vec![chain(
                "mark-for-masquerade",
                vec![Rule {
                    sets_mark: Some(0x4000),
                    ..Rule::default()
                }],
            )],
        );
        t.sets = vec![
            Set {
                name: "cluster-ips".into(),
                keys: vec![vec![172, 30, 0, 41], vec![172, 30, 0, 42]],
            },
            Set {
                name: "service-ips".into(),
                keys: vec![key([172, 30, 0, 41], 6, 80), key([5, 6, 7, 8], 6, 80)],
            },
            Set {
                name: "no-endpoint-services".into(),
                keys: vec![key([172, 30, 0, 45], 6, 80)],
            },
        ];
        let l = learn_from(&[], &[t], &[]);
        assert_eq!(
            l.nets,
            nets(&[
                "5.6.7.8/32",
                "172.30.0.41/32",
                "172.30.0.42/32",
                "172.30.0.45/32"
            ])
        );
        assert_eq!(l.translated, nets(&["5.6.7.8/32", "172.30.0.41/32"]));
        assert_eq!(l.describe(), "kube-proxy-nftables");
        assert_eq!(l.masq_mark, 0x4000);
    }

    #[test]
    fn the_config_and_ipvs_add_to_what_the_rules_give() {
        let l = learn_from(
            &nets(&["10.96.0.0/12"]),
            &[],
            &["10.96.0.10".parse().unwrap()],
        );
        assert_eq!(l.nets, nets(&["10.96.0.0/12", "10.96.0.10/32"]));
        assert_eq!(l.describe(), "config+kube-proxy-ipvs");
        assert_eq!(l.masq_mark, 0);
        assert_eq!(learn_from(&[], &[], &[]).describe(), "none");
    }

    #[test]
    fn sources_are_described_in_order() {
        let mut l = Learned::default();
        assert_eq!(l.describe(), "none");
        assert!(l.nets.is_empty());
        l.add(
            Source::IptablesNft,
            vec![("10.96.0.10/32".parse().unwrap(), true)],
        );
        l.add(
            Source::Config,
            vec![("10.96.0.0/12".parse().unwrap(), false)],
        );
        l.add(Source::Ipvs, Vec::new());
        assert_eq!(l.describe(), "kube-proxy-iptables-nft+config");
        assert_eq!(l.nets.len(), 2);
    }
}
