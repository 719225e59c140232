//! Services next to kube-proxy: which destinations are Service addresses, learned from the
//! rules kube-proxy writes, so the programs hand those flows to the stack (see
//! `ebpf/src/services.rs`) and netfilter translates them both ways.
//!
//! kube-proxy's three modes each leave the Service addresses where this reads them:
//! - iptables mode (`pkg/proxy/iptables/proxier.go`): one rule per Service port in the nat
//!   table's `KUBE-SERVICES` (`-d <clusterIP>/32 ... -j KUBE-SVC-…`, external and
//!   load-balancer IPs `-j KUBE-EXT-…`), and in the filter table's `KUBE-SERVICES` and
//!   `KUBE-EXTERNAL-SERVICES` the REJECT of a Service without endpoints. Read from
//!   `iptables-save` and `ip6tables-save`, legacy and nft backends both.
//! - nftables mode (`pkg/proxy/nftables/proxier.go`): the tables `ip kube-proxy` and
//!   `ip6 kube-proxy`, whose `cluster-ips` set and `service-ips` and `no-endpoint-services`
//!   maps are keyed by the Service address. Read from `nft list table`.
//! - IPVS mode (`pkg/proxy/ipvs/proxier.go`): every ClusterIP is an address of the
//!   `kube-ipvs0` dummy device (`node::node_view` reads them with the node's addresses).
//!
//! `serviceCIDRs` in the config adds ranges to what is learned (for a node whose rules
//! cannot be read). ADD reads none of this (it would cost a rule dump per pod); STATUS and
//! the agent do, and converge the programs' map to it.

use std::{
    net::IpAddr,
    process::{Command, Stdio},
};

use ipnetwork::IpNetwork;

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
    let mut l = Learned::default();
    l.add(
        Source::Config,
        configured.iter().map(|n| (*n, true)).collect(),
    );
    for (source, tools) in [
        (
            Source::IptablesLegacy,
            [
                (true, "iptables-legacy-save"),
                (false, "ip6tables-legacy-save"),
            ],
        ),
        (
            Source::IptablesNft,
            [(true, "iptables-nft-save"), (false, "ip6tables-nft-save")],
        ),
    ] {
        let mut nets = Vec::new();
        for (v4, tool) in tools {
            if source == Source::IptablesLegacy && !legacy_tables(v4) {
                continue;
            }
            if let Some(out) = run(tool, &[]) {
                nets.extend(iptables_services(&out));
                l.masq_mark = l.masq_mark.max(iptables_masq_mark(&out));
            }
        }
        l.add(source, nets);
    }
    let mut nets = Vec::new();
    for family in ["ip", "ip6"] {
        if let Some(out) = run("nft", &["list", "table", family, "kube-proxy"]) {
            nets.extend(nftables_services(&out));
            l.masq_mark = l.masq_mark.max(nftables_masq_mark(&out));
        }
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

/// Runs `tool args` (found in the usual sbin directories or on `PATH`); its output when
/// it ran and succeeded. A tool missing or failing is a source with nothing in it. Each
/// candidate is looked at with a `stat` first: a spawn that finds no file still costs a
/// fork, and STATUS and the agent look for six tools on every pass.
pub(crate) fn run(tool: &str, args: &[&str]) -> Option<String> {
    let path = find_tool(tool)?;
    match Command::new(&path)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => Some(String::from_utf8_lossy(&out.stdout).into_owned()),
        Ok(_) => None,
        Err(e) => {
            log::debug!("{}: {e}", path.display());
            None
        }
    }
}

fn find_tool(tool: &str) -> Option<std::path::PathBuf> {
    let path_dirs = std::env::var_os("PATH").unwrap_or_default();
    ["/usr/sbin", "/sbin", "/usr/local/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(std::path::PathBuf::from)
        .chain(std::env::split_paths(&path_dirs))
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// Whether the legacy backend holds any table of `family` in this thread's network
/// namespace (its tables are listed once the kernel's module has one): without, its
/// `-save` has nothing to say and is not run.
pub(crate) fn legacy_tables(v4: bool) -> bool {
    let name = if v4 {
        "ip_tables_names"
    } else {
        "ip6_tables_names"
    };
    std::fs::read_to_string(format!("/proc/thread-self/net/{name}"))
        .is_ok_and(|s| !s.trim().is_empty())
}

/// The chains whose `-d` matches are Service addresses, in any table.
const SERVICE_CHAINS: [&str; 2] = ["KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES"];

/// The Service ranges of an `iptables-save` dump: the destination of every rule of
/// [`SERVICE_CHAINS`] that matches one (`-d A/N`, not `! -d`), and whether it is the nat
/// table's (translated) rather than the filter table's (the REJECT of a Service without
/// endpoints).
pub fn iptables_services(save: &str) -> Vec<(IpNetwork, bool)> {
    let mut out = Vec::new();
    let mut nat = false;
    for line in save.lines() {
        if let Some(table) = line.strip_prefix('*') {
            nat = table.trim() == "nat";
            continue;
        }
        let mut words = line.split_whitespace();
        if words.next() != Some("-A") {
            continue;
        }
        let Some(chain) = words.next() else { continue };
        if !SERVICE_CHAINS.contains(&chain) {
            continue;
        }
        let mut negated = false;
        while let Some(w) = words.next() {
            match w {
                "!" => {
                    negated = true;
                    continue;
                }
                "-d" | "--destination" | "--dst" => {
                    if let Some(net) = words.next().and_then(parse_net) {
                        if !negated {
                            out.push((net, nat));
                        }
                    }
                }
                _ => {}
            }
            negated = false;
        }
    }
    out
}

/// The mark `KUBE-MARK-MASQ` sets (`-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000`),
/// which `KUBE-POSTROUTING` masquerades; 0 without that rule.
pub fn iptables_masq_mark(save: &str) -> u32 {
    save.lines()
        .filter(|l| l.starts_with("-A KUBE-MARK-MASQ "))
        .find_map(|l| {
            let mut w = l.split_whitespace();
            w.find(|x| *x == "--set-xmark" || *x == "--or-mark" || *x == "--set-mark")?;
            let v = w.next()?.split('/').next()?;
            u32::from_str_radix(v.trim_start_matches("0x"), 16).ok()
        })
        .unwrap_or(0)
}

/// The mark kube-proxy's nftables `mark-for-masquerade` chain sets (`mark set mark or
/// 0x4000`); 0 without it.
pub fn nftables_masq_mark(list: &str) -> u32 {
    let mut in_chain = false;
    for line in list.lines() {
        let t = line.trim();
        if t.starts_with("chain ") {
            in_chain = t.starts_with("chain mark-for-masquerade ");
            continue;
        }
        if in_chain {
            if let Some(v) = t.strip_prefix("mark set mark or ") {
                if let Ok(m) = u32::from_str_radix(v.trim().trim_start_matches("0x"), 16) {
                    return m;
                }
            }
        }
    }
    0
}

/// The sets and maps of kube-proxy's nftables tables keyed by a Service address, and
/// whether kube-proxy translates what they hold (`service-ips`: Services with endpoints).
const NFT_SERVICE_SETS: [(&str, bool); 3] = [
    ("cluster-ips", false),
    ("service-ips", true),
    ("no-endpoint-services", false),
];

/// The Service addresses of an `nft list table … kube-proxy` dump: the first address of
/// every element of [`NFT_SERVICE_SETS`] (`172.30.0.41 . tcp . 80 : goto …`), and whether
/// it is translated.
pub fn nftables_services(list: &str) -> Vec<(IpNetwork, bool)> {
    let mut out = Vec::new();
    // Inside a wanted set or map (and whether it is translated), and inside its
    // `elements = { … }`.
    let mut wanted = None;
    let mut in_elements = false;
    for line in list.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("set ").or_else(|| t.strip_prefix("map ")) {
            let name = rest.split_whitespace().next().unwrap_or("");
            wanted = NFT_SERVICE_SETS
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, t)| *t);
            in_elements = false;
            continue;
        }
        let Some(translated) = wanted else { continue };
        let body = match t.strip_prefix("elements = {") {
            Some(rest) => {
                in_elements = true;
                rest
            }
            None if in_elements => t,
            None => continue,
        };
        // Elements are separated by commas; each one's first word is its address.
        for elem in body.split(',') {
            let elem = elem.trim().trim_end_matches('}').trim();
            if let Some(net) = elem.split_whitespace().next().and_then(parse_net) {
                out.push((net, translated));
            }
        }
        if t.ends_with('}') {
            in_elements = false;
            wanted = None;
        }
    }
    out
}

/// `A` or `A/N`, IPv4 or IPv6.
fn parse_net(s: &str) -> Option<IpNetwork> {
    match s.split_once('/') {
        Some((a, n)) => {
            let ip: IpAddr = a.parse().ok()?;
            // iptables-save writes a mask length; an old one a dotted mask.
            let prefix = match n.parse::<u8>() {
                Ok(p) => p,
                Err(_) => {
                    let m: std::net::Ipv4Addr = n.parse().ok()?;
                    u8::try_from(u32::from(m).leading_ones()).ok()?
                }
            };
            IpNetwork::new(ip, prefix).ok()
        }
        None => s.parse::<IpAddr>().ok().map(IpNetwork::from),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(v: &[&str]) -> Vec<IpNetwork> {
        v.iter().map(|s| s.parse().unwrap()).collect()
    }

    /// Lines as kube-proxy's iptables proxier writes them (`writeServiceToEndpointRules`,
    /// `syncProxyRules`).
    const IPTABLES: &str = r#"# Generated by iptables-nft-save v1.8.9 (nf_tables)
*filter
:KUBE-SERVICES - [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d 172.30.0.43/32 -p tcp -m comment --comment "ns3/svc3:p80 has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
-A KUBE-EXTERNAL-SERVICES -d 192.168.99.33/32 -p tcp -m comment --comment "ns3/svc3:p80 has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
COMMIT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -d 1.2.3.4/32 -p tcp -m comment --comment "ns1/svc1:p80 loadbalancer IP" -m tcp --dport 80 -j KUBE-EXT-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-XPGD46QRK7WJZT7O ! -s 10.0.0.0/8 -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-SERVICES ! -d 10.9.9.9/32 -j RETURN
COMMIT
"#;

    #[test]
    fn iptables_rules_give_every_service_address() {
        let net = |s: &str| s.parse::<IpNetwork>().unwrap();
        assert_eq!(
            iptables_services(IPTABLES),
            [
                (net("172.30.0.43/32"), false),
                (net("192.168.99.33/32"), false),
                (net("172.30.0.41/32"), true),
                (net("1.2.3.4/32"), true)
            ]
        );
        assert_eq!(
            iptables_services("*nat\n-A KUBE-SERVICES -d fd00:30::a/128 -p udp -j KUBE-SVC-X\n"),
            [(net("fd00:30::a/128"), true)]
        );
        assert!(iptables_services("-A FORWARD -d 10.0.0.1/32 -j DROP\n").is_empty());
    }

    /// As kube-proxy's nftables proxier writes them (`nft list table ip kube-proxy`).
    const NFT: &str = r#"table ip kube-proxy {
	comment "rules for kube-proxy"
	set cluster-ips {
		type ipv4_addr
		comment "Active ClusterIPs"
		elements = { 172.30.0.41, 172.30.0.42,
			     172.30.0.44 }
	}
	set nodeport-ips {
		type ipv4_addr
		elements = { 192.168.0.2 }
	}
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
		elements = { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80,
			     5.6.7.8 . tcp . 80 : goto external-ULMVA6XW-ns1/svc1/tcp/p80 }
	}
	map no-endpoint-services {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 172.30.0.45 . tcp . 80 comment "ns5/svc5:p80" : goto reject-chain }
	}
	chain services {
		ip daddr . meta l4proto . th dport vmap @service-ips
	}
}
"#;

    #[test]
    fn nftables_tables_give_every_service_address() {
        let got = nftables_services(NFT);
        let (translated, not): (Vec<_>, Vec<_>) = got.iter().partition(|(_, t)| *t);
        let firsts = |v: Vec<&(IpNetwork, bool)>| v.iter().map(|(n, _)| *n).collect::<Vec<_>>();
        assert_eq!(firsts(translated), nets(&["172.30.0.41/32", "5.6.7.8/32"]));
        assert_eq!(
            firsts(not),
            nets(&[
                "172.30.0.41/32",
                "172.30.0.42/32",
                "172.30.0.44/32",
                "172.30.0.45/32"
            ])
        );
    }

    #[test]
    fn kube_proxys_masquerade_mark_is_read_from_either_mode() {
        assert_eq!(
            iptables_masq_mark("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n"),
            0x4000
        );
        assert_eq!(iptables_masq_mark(IPTABLES), 0);
        let nft = "table ip kube-proxy {\n\tchain mark-for-masquerade {\n\t\tmark set mark or 0x4000\n\t}\n}\n";
        assert_eq!(nftables_masq_mark(nft), 0x4000);
        assert_eq!(nftables_masq_mark(NFT), 0);
    }

    #[test]
    fn masks_parse_both_ways() {
        assert_eq!(parse_net("10.96.0.0/12"), "10.96.0.0/12".parse().ok());
        assert_eq!(
            parse_net("10.96.0.0/255.240.0.0"),
            "10.96.0.0/12".parse().ok()
        );
        assert_eq!(parse_net("fd00::1"), "fd00::1/128".parse().ok());
        assert_eq!(parse_net("tcp"), None);
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
