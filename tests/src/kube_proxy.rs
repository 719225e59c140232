//! kube-proxy's rules, written into a test node as kube-proxy writes them: no kube-proxy
//! binary can run here, so each mode's rule set is built the way its proxier builds it
//! (kubernetes/kubernetes `pkg/proxy/iptables/proxier.go`'s `syncProxyRules` and
//! `writeServiceToEndpointRules`, `pkg/proxy/nftables/proxier.go`), for the Services a test
//! describes, and loaded with the same tools (`iptables-restore --noflush`, `nft -f`).

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::netns::Netns;

/// The mark kube-proxy's masquerade rules set and test (`--iptables-masquerade-bit` 14).
pub const MASQ_MARK: &str = "0x4000/0x4000";

/// Transport protocols of a Service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
}

impl Proto {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
        }
    }
}

/// One Service port, as kube-proxy sees it: its ClusterIP and port, its endpoints, and
/// optionally a NodePort and external IPs.
#[derive(Debug, Clone)]
pub struct Service {
    /// `namespace/name:port`, the rules' comment.
    pub name: String,
    pub cluster_ip: IpAddr,
    pub port: u16,
    pub proto: Proto,
    pub endpoints: Vec<SocketAddr>,
    pub node_port: Option<u16>,
    pub external_ips: Vec<IpAddr>,
    /// `externalTrafficPolicy: Local`: traffic from outside keeps its source (no
    /// masquerade) and goes only to local endpoints (all of `endpoints` are local here).
    pub local: bool,
    /// `sessionAffinity: ClientIP`.
    pub affinity: bool,
}

impl Service {
    pub fn new(name: &str, cluster_ip: IpAddr, port: u16, proto: Proto) -> Self {
        Self {
            name: name.to_owned(),
            cluster_ip,
            port,
            proto,
            endpoints: Vec::new(),
            node_port: None,
            external_ips: Vec::new(),
            local: false,
            affinity: false,
        }
    }

    pub fn endpoint(mut self, ep: SocketAddr) -> Self {
        self.endpoints.push(ep);
        self
    }

    /// A chain name of kube-proxy's shape (`KUBE-SVC-` and 16 base32 characters of a
    /// hash): here the hash of the name and what it is for, stable across calls.
    fn chain(&self, prefix: &str, extra: &str) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self
            .name
            .bytes()
            .chain(extra.bytes())
            .chain(self.proto.as_str().bytes())
        {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        const B32: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
        let s: String = (0..16)
            .map(|i| B32[((h >> (i * 4)) & 31) as usize] as char)
            .collect();
        format!("{prefix}{s}")
    }

    fn v4(&self) -> bool {
        self.cluster_ip.is_ipv4()
    }
}

fn host(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}/32"),
        IpAddr::V6(a) => format!("{a}/128"),
    }
}

fn dnat_target(ep: SocketAddr) -> String {
    match ep {
        SocketAddr::V4(a) => format!("{}:{}", a.ip(), a.port()),
        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
    }
}

/// The `iptables-restore` input kube-proxy's iptables mode writes for `services` of one
/// family, with `cluster_cidr` (`--cluster-cidr`) as its notion of local pod traffic.
pub fn iptables_rules(services: &[Service], cluster_cidr: &str) -> String {
    let reject = if services.first().is_none_or(Service::v4) {
        "icmp-port-unreachable"
    } else {
        "icmp6-port-unreachable"
    };
    let mut filter = String::from(
        "*filter\n\
         :KUBE-SERVICES - [0:0]\n\
         :KUBE-EXTERNAL-SERVICES - [0:0]\n\
         :KUBE-NODEPORTS - [0:0]\n\
         :KUBE-FORWARD - [0:0]\n\
         :KUBE-PROXY-FIREWALL - [0:0]\n\
         -A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL\n\
         -A INPUT -m comment --comment \"kubernetes health check service ports\" -j KUBE-NODEPORTS\n\
         -A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES\n\
         -A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL\n\
         -A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
         -A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES\n\
         -A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL\n\
         -A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n\
         -A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT\n\
         -A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n",
    );
    let nat = String::from(
        "*nat\n\
         :KUBE-SERVICES - [0:0]\n\
         :KUBE-NODEPORTS - [0:0]\n\
         :KUBE-POSTROUTING - [0:0]\n\
         :KUBE-MARK-MASQ - [0:0]\n",
    );
    let mut chains = String::new();
    let mut rules = String::from(
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n",
    );
    for svc in services {
        let p = svc.proto.as_str();
        let name = &svc.name;
        let vip = host(svc.cluster_ip);
        let port = svc.port;
        if svc.endpoints.is_empty() {
            // No endpoints: REJECT in the filter table (for the ClusterIP, the external
            // IPs and the NodePort alike).
            let _ = writeln!(
                filter,
                "-A KUBE-SERVICES -d {vip} -p {p} -m comment --comment \"{name} has no endpoints\" -m {p} --dport {port} -j REJECT --reject-with {reject}"
            );
            for ext in &svc.external_ips {
                let _ = writeln!(
                    filter,
                    "-A KUBE-EXTERNAL-SERVICES -d {} -p {p} -m comment --comment \"{name} has no endpoints\" -m {p} --dport {port} -j REJECT --reject-with {reject}",
                    host(*ext)
                );
            }
            if let Some(np) = svc.node_port {
                let _ = writeln!(
                    filter,
                    "-A KUBE-EXTERNAL-SERVICES -m addrtype --dst-type LOCAL -p {p} -m comment --comment \"{name} has no endpoints\" -m {p} --dport {np} -j REJECT --reject-with {reject}"
                );
            }
            continue;
        }
        let svc_chain = svc.chain("KUBE-SVC-", "");
        let ext_chain = svc.chain("KUBE-EXT-", "");
        let _ = writeln!(chains, ":{svc_chain} - [0:0]");
        let external = svc.node_port.is_some() || !svc.external_ips.is_empty();
        if external {
            let _ = writeln!(chains, ":{ext_chain} - [0:0]");
        }
        let _ = writeln!(
            rules,
            "-A KUBE-SERVICES -d {vip} -p {p} -m comment --comment \"{name} cluster IP\" -m {p} --dport {port} -j {svc_chain}"
        );
        for ext in &svc.external_ips {
            let _ = writeln!(
                rules,
                "-A KUBE-SERVICES -d {} -p {p} -m comment --comment \"{name} external IP\" -m {p} --dport {port} -j {ext_chain}",
                host(*ext)
            );
        }
        if let Some(np) = svc.node_port {
            let _ = writeln!(
                rules,
                "-A KUBE-NODEPORTS -p {p} -m comment --comment \"{name}\" -m {p} --dport {np} -j {ext_chain}"
            );
        }
        // Traffic to the ClusterIP from outside the cluster CIDR is masqueraded.
        let _ = writeln!(
            rules,
            "-A {svc_chain} ! -s {cluster_cidr} -d {vip} -p {p} -m comment --comment \"{name} cluster IP\" -m {p} --dport {port} -j KUBE-MARK-MASQ"
        );
        if external {
            if svc.local {
                // Local policy: pods' own traffic takes the cluster chain; the rest keeps
                // its source and goes to the local endpoints.
                let _ = writeln!(
                    rules,
                    "-A {ext_chain} -s {cluster_cidr} -m comment --comment \"pod traffic for {name} external destinations\" -j {svc_chain}\n\
                     -A {ext_chain} -m comment --comment \"masquerade LOCAL traffic for {name} external destinations\" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ\n\
                     -A {ext_chain} -m comment --comment \"route LOCAL traffic for {name} external destinations\" -m addrtype --src-type LOCAL -j {svc_chain}"
                );
                let local_chain = svc.chain("KUBE-SVL-", "");
                let _ = writeln!(chains, ":{local_chain} - [0:0]");
                let _ = writeln!(rules, "-A {ext_chain} -j {local_chain}");
                write_endpoints(&mut chains, &mut rules, svc, &local_chain, "local");
            } else {
                let _ = writeln!(
                    rules,
                    "-A {ext_chain} -m comment --comment \"masquerade traffic for {name} external destinations\" -j KUBE-MARK-MASQ\n\
                     -A {ext_chain} -j {svc_chain}"
                );
            }
        }
        write_endpoints(&mut chains, &mut rules, svc, &svc_chain, "");
    }
    rules.push_str(
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n",
    );
    filter.push_str("COMMIT\n");
    format!("{filter}{nat}{chains}{rules}COMMIT\n")
}

/// A Service chain's jumps to its endpoints (`statistic --mode random` with the
/// probabilities kube-proxy writes: 1/n, 1/(n-1), …, the last unconditional) and each
/// endpoint's chain: masquerade of the endpoint reaching itself (hairpin), and the DNAT.
fn write_endpoints(chains: &mut String, rules: &mut String, svc: &Service, from: &str, kind: &str) {
    let p = svc.proto.as_str();
    let name = &svc.name;
    let n = svc.endpoints.len();
    for ep in &svc.endpoints {
        let sep = svc.chain("KUBE-SEP-", &format!("{kind}{ep}"));
        if !chains.contains(&format!(":{sep} ")) {
            let _ = writeln!(chains, ":{sep} - [0:0]");
            let affinity = if svc.affinity {
                format!(
                    " -m recent --set --name {sep} --mask {} --rsource",
                    full_mask(svc)
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                rules,
                "-A {sep} -s {} -m comment --comment \"{name}\" -j KUBE-MARK-MASQ\n\
                 -A {sep} -p {p} -m comment --comment \"{name}\"{affinity} -m {p} -j DNAT --to-destination {}",
                host(ep.ip()),
                dnat_target(*ep)
            );
        }
        if svc.affinity {
            let _ = writeln!(
                rules,
                "-A {from} -m comment --comment \"{name} -> {}\" -m recent --rcheck --seconds 10800 --reap --name {sep} --mask {} --rsource -j {sep}",
                dnat_target(*ep),
                full_mask(svc)
            );
        }
    }
    for (i, ep) in svc.endpoints.iter().enumerate() {
        let sep = svc.chain("KUBE-SEP-", &format!("{kind}{ep}"));
        let left = n - i;
        if left > 1 {
            let _ = writeln!(
                rules,
                "-A {from} -m comment --comment \"{name} -> {}\" -m statistic --mode random --probability {:.11} -j {sep}",
                dnat_target(*ep),
                1.0 / left as f64
            );
        } else {
            let _ = writeln!(
                rules,
                "-A {from} -m comment --comment \"{name} -> {}\" -j {sep}",
                dnat_target(*ep)
            );
        }
    }
}

fn full_mask(svc: &Service) -> &'static str {
    if svc.v4() {
        "255.255.255.255"
    } else {
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
    }
}

/// Which iptables backend writes the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Nft,
    Legacy,
}

/// Loads `rules` into `ns` with `iptables-restore --noflush` (or ip6tables-) of `backend`.
pub fn load_iptables(ns: &Netns, v4: bool, backend: Backend, rules: &str) -> Result<()> {
    let tool = match (v4, backend) {
        (true, Backend::Nft) => "iptables-nft-restore",
        (false, Backend::Nft) => "ip6tables-nft-restore",
        (true, Backend::Legacy) => "iptables-legacy-restore",
        (false, Backend::Legacy) => "ip6tables-legacy-restore",
    };
    restore(ns, &[tool, "-w", "--noflush"], rules)
}

/// Flushes kube-proxy's chains as `kube-proxy --cleanup` would: every rule of the nat and
/// filter tables of `backend` (the test node holds no other rules).
pub fn flush_iptables(ns: &Netns, v4: bool, backend: Backend) -> Result<()> {
    let tool = match (v4, backend) {
        (true, Backend::Nft) => "iptables-nft",
        (false, Backend::Nft) => "ip6tables-nft",
        (true, Backend::Legacy) => "iptables-legacy",
        (false, Backend::Legacy) => "ip6tables-legacy",
    };
    for table in ["nat", "filter"] {
        for args in [
            &["-w", "-t", table, "-F"][..],
            &["-w", "-t", table, "-X"][..],
        ] {
            let mut cmd = vec![tool];
            cmd.extend_from_slice(args);
            let out = ns.exec(&cmd)?;
            if !out.status.success() {
                bail!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
    }
    Ok(())
}

/// The `nft -f` input of kube-proxy's nftables mode for `services` of one family
/// (`table ip kube-proxy` or `ip6`): the `service-ips` verdict map and `cluster-ips` set,
/// a chain per Service and endpoint, the masquerade mark, and the REJECT of Services
/// without endpoints through `no-endpoint-services`.
pub fn nftables_rules(services: &[Service], cluster_cidr: &str) -> String {
    let v4 = services.first().is_none_or(Service::v4);
    let (fam, addr_t, ip) = if v4 {
        ("ip", "ipv4_addr", "ip")
    } else {
        ("ip6", "ipv6_addr", "ip6")
    };
    let mut chains = String::new();
    let mut svc_elems = Vec::new();
    let mut no_ep_elems = Vec::new();
    let mut cluster_ips = Vec::new();
    for (k, svc) in services.iter().enumerate() {
        let p = svc.proto.as_str();
        cluster_ips.push(svc.cluster_ip.to_string());
        if svc.endpoints.is_empty() {
            no_ep_elems.push(format!(
                "{} . {p} . {} : goto reject-chain",
                svc.cluster_ip, svc.port
            ));
            continue;
        }
        let chain = format!("service-{k}-{}", svc.name.replace([':', '/'], "-"));
        svc_elems.push(format!(
            "{} . {p} . {} : goto {chain}",
            svc.cluster_ip, svc.port
        ));
        let _ = writeln!(
            chains,
            "\tchain {chain} {{\n\t\t{ip} daddr {} {p} dport {} {ip} saddr != {cluster_cidr} jump mark-for-masquerade",
            svc.cluster_ip, svc.port
        );
        let eps: Vec<String> = (0..svc.endpoints.len())
            .map(|i| format!("{i} : goto endpoint-{k}-{i}"))
            .collect();
        let _ = writeln!(
            chains,
            "\t\tnumgen random mod {} vmap {{ {} }}\n\t}}",
            svc.endpoints.len(),
            eps.join(", ")
        );
        for (i, ep) in svc.endpoints.iter().enumerate() {
            let _ = writeln!(
                chains,
                "\tchain endpoint-{k}-{i} {{\n\t\t{ip} saddr {} jump mark-for-masquerade\n\t\tmeta l4proto {p} dnat to {}\n\t}}",
                ep.ip(),
                dnat_target(*ep)
            );
        }
    }
    let elems = |v: &[String]| {
        if v.is_empty() {
            String::new()
        } else {
            format!("\t\telements = {{ {} }}\n", v.join(", "))
        }
    };
    format!(
        "table {fam} kube-proxy {{\n\
         \tcomment \"rules for kube-proxy\"\n\
         \tset cluster-ips {{\n\t\ttype {addr_t}\n{}\t}}\n\
         \tmap service-ips {{\n\t\ttype {addr_t} . inet_proto . inet_service : verdict\n{}\t}}\n\
         \tmap no-endpoint-services {{\n\t\ttype {addr_t} . inet_proto . inet_service : verdict\n{}\t}}\n\
         \tchain mark-for-masquerade {{\n\t\tmark set mark or 0x4000\n\t}}\n\
         \tchain masquerading {{\n\t\tmark and 0x4000 == 0 return\n\t\tmark set mark xor 0x4000\n\t\tmasquerade fully-random\n\t}}\n\
         \tchain reject-chain {{\n\t\treject\n\t}}\n\
         \tchain services {{\n\t\t{ip} daddr . meta l4proto . th dport vmap @service-ips\n\t}}\n\
         \tchain nat-prerouting {{\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tjump services\n\t}}\n\
         \tchain nat-output {{\n\t\ttype nat hook output priority -100; policy accept;\n\t\tjump services\n\t}}\n\
         \tchain nat-postrouting {{\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\t\tjump masquerading\n\t}}\n\
         \tchain filter-forward {{\n\t\ttype filter hook forward priority -110; policy accept;\n\t\tct state new {ip} daddr . meta l4proto . th dport vmap @no-endpoint-services\n\t}}\n\
         \tchain filter-output {{\n\t\ttype filter hook output priority -110; policy accept;\n\t\tct state new {ip} daddr . meta l4proto . th dport vmap @no-endpoint-services\n\t}}\n\
         {chains}}}\n",
        elems(&cluster_ips),
        elems(&svc_elems),
        elems(&no_ep_elems),
    )
}

/// Loads an `nft -f` ruleset into `ns`.
pub fn load_nftables(ns: &Netns, rules: &str) -> Result<()> {
    restore(ns, &["nft", "-f", "-"], rules)
}

fn restore(ns: &Netns, cmd: &[&str], input: &str) -> Result<()> {
    let mut child = Command::new("nsenter")
        .arg(format!("--net={}", ns.path().display()))
        .arg("--")
        .args(cmd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{cmd:?} refused the rules: {}\n{input}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Whether the kernel of `ns` has IPVS (`ipvsadm -Ln` loads `ip_vs` where it is a module).
pub fn kernel_has_ipvs(ns: &Netns) -> bool {
    ns.exec(&["ipvsadm", "-Ln"])
        .is_ok_and(|o| o.status.success())
}

/// kube-proxy's IPVS mode for `services` (both families may be mixed): every ClusterIP an
/// address of the `kube-ipvs0` dummy; where `virtual_servers`, an IPVS virtual server per
/// Service port with its endpoints (masquerading forwarding, round robin), the ipsets
/// `KUBE-CLUSTER-IP` and `KUBE-LOOP-BACK` (and their `KUBE-6-` twins) and the iptables
/// rules beside them (`pkg/proxy/ipvs/proxier.go`: masquerade of traffic from outside the
/// cluster CIDR, of a hairpin, and the `vs/conntrack` sysctl they need).
pub fn load_ipvs(
    ns: &Netns,
    services: &[Service],
    cluster_cidrs: (&str, &str),
    virtual_servers: bool,
) -> Result<()> {
    let ok = |cmd: &[&str]| -> Result<()> {
        let out = ns.exec(cmd)?;
        if !out.status.success() {
            bail!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    };
    // A dummy, as kube-proxy makes it; a kernel without dummy devices (this machine's) gets
    // an empty bridge of that name, which holds addresses the same way.
    let kind = if crate::external::kernel_has_link_kind("dummy") {
        "dummy"
    } else {
        "bridge"
    };
    ok(&["ip", "link", "add", "kube-ipvs0", "type", kind])?;
    for svc in services {
        ok(&[
            "ip",
            "addr",
            "add",
            &host(svc.cluster_ip),
            "dev",
            "kube-ipvs0",
        ])?;
    }
    if !virtual_servers {
        return Ok(());
    }
    let vs = |ip: IpAddr, port: u16| match ip {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    };
    let mut sets = String::new();
    for (fam, prefix) in [("inet", "KUBE-"), ("inet6", "KUBE-6-")] {
        let _ = writeln!(
            sets,
            "create {prefix}CLUSTER-IP hash:ip,port family {fam}\ncreate {prefix}LOOP-BACK hash:ip,port,ip family {fam}"
        );
    }
    for svc in services {
        let flag = match svc.proto {
            Proto::Tcp => "-t",
            Proto::Udp => "-u",
            Proto::Sctp => "--sctp-service",
        };
        let v = vs(svc.cluster_ip, svc.port);
        ok(&["ipvsadm", "-A", flag, &v, "-s", "rr"])?;
        let prefix = if svc.v4() { "KUBE-" } else { "KUBE-6-" };
        let p = svc.proto.as_str();
        let _ = writeln!(
            sets,
            "add {prefix}CLUSTER-IP {},{p}:{}",
            svc.cluster_ip, svc.port
        );
        for ep in &svc.endpoints {
            ok(&["ipvsadm", "-a", flag, &v, "-r", &dnat_target(*ep), "-m"])?;
            let _ = writeln!(
                sets,
                "add {prefix}LOOP-BACK {},{p}:{},{}",
                ep.ip(),
                ep.port(),
                ep.ip()
            );
        }
    }
    restore(ns, &["ipset", "restore"], &sets)?;
    for (v4, cidr) in [(true, cluster_cidrs.0), (false, cluster_cidrs.1)] {
        let prefix = if v4 { "KUBE-" } else { "KUBE-6-" };
        let rules = format!(
            "*nat\n\
             :KUBE-SERVICES - [0:0]\n\
             :KUBE-POSTROUTING - [0:0]\n\
             :KUBE-MARK-MASQ - [0:0]\n\
             :KUBE-NODE-PORT - [0:0]\n\
             -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
             -A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n\
             -A KUBE-POSTROUTING -m comment --comment \"Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose\" -m set --match-set {prefix}LOOP-BACK dst,dst,src -j MASQUERADE\n\
             -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
             -A KUBE-POSTROUTING -j MARK --xor-mark 0x4000\n\
             -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n\
             -A KUBE-SERVICES ! -s {cidr} -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set {prefix}CLUSTER-IP dst,dst -j KUBE-MARK-MASQ\n\
             -A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT\n\
             -A KUBE-SERVICES -m set --match-set {prefix}CLUSTER-IP dst,dst -j ACCEPT\n\
             COMMIT\n"
        );
        load_iptables(ns, v4, Backend::Nft, &rules)?;
    }
    // What the IPVS proxier sets: connection tracking of IPVS traffic (its masquerade
    // needs it), and no ARP answers for the dummy's addresses.
    for (key, value) in [
        ("net/ipv4/vs/conntrack", "1"),
        ("net/ipv4/vs/expire_nodest_conn", "1"),
        ("net/ipv4/conf/all/arp_ignore", "1"),
        ("net/ipv4/conf/all/arp_announce", "2"),
    ] {
        ok(&[
            "sysctl",
            "-qw",
            &format!("{}={value}", key.replace('/', ".")),
        ])?;
    }
    Ok(())
}
