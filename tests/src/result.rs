//! Checking an ADD result against section 5 ("Success") and the versioned result formats,
//! and extracting what later checks need (interface names, MACs, addresses).

use std::net::IpAddr;

use serde_json::Value;

use crate::config::Stack;

/// What an ADD result must say.
#[derive(Debug, Clone)]
pub struct ResultExpectation {
    pub cni_version: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_NETNS`, expected as the container interface's `sandbox`.
    pub sandbox: String,
    pub stack: Stack,
    /// Host veth name rules: prefix and exact length (ebpf-cni: `ecni`, 15).
    pub host_ifname_prefix: Option<String>,
    pub host_ifname_len: Option<usize>,
    /// `dst` of each route the result must list (from `ipam.routes`).
    pub route_dsts: Vec<String>,
    /// The `dns` object the result must carry, if any.
    pub dns: Option<Value>,
    /// The container MAC the result must report, if one was requested.
    pub container_mac: Option<String>,
}

impl ResultExpectation {
    /// Expectations for [`crate::config::standard`] with `stack`.
    pub fn standard(cni_version: &str, ifname: &str, sandbox: &str, stack: Stack) -> Self {
        let mut route_dsts = Vec::new();
        if stack.has_v4() {
            route_dsts.push("0.0.0.0/0".to_owned());
        }
        if stack.has_v6() {
            route_dsts.push("::/0".to_owned());
        }
        Self {
            cni_version: cni_version.to_owned(),
            ifname: ifname.to_owned(),
            sandbox: sandbox.to_owned(),
            stack,
            host_ifname_prefix: None,
            host_ifname_len: None,
            route_dsts,
            dns: Some(serde_json::json!({ "nameservers": [crate::config::NAMESERVER] })),
            container_mac: None,
        }
    }

    /// ebpf-cni's host veth naming: `ecni…`, 15 characters.
    pub fn ebpf_cni_host_names(mut self) -> Self {
        self.host_ifname_prefix = Some("ecni".to_owned());
        self.host_ifname_len = Some(15);
        self
    }

    pub fn with_container_mac(mut self, mac: &str) -> Self {
        self.container_mac = Some(mac.to_lowercase());
        self
    }

    /// Checks `result`; returns the parsed result or every problem found.
    pub fn validate(&self, result: &Value) -> Result<AddResult, Vec<String>> {
        let mut p = Vec::new();
        let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);

        if s(result, "cniVersion").as_deref() != Some(self.cni_version.as_str()) {
            p.push(format!(
                "cniVersion is {:?}, expected {:?}",
                result.get("cniVersion"),
                self.cni_version
            ));
        }
        let ifaces = result
            .get("interfaces")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if ifaces.len() < 2 {
            p.push(format!(
                "expected interfaces[0] (host veth) and [1] (container), got {}",
                ifaces.len()
            ));
        }
        let get_if = |i: usize| ifaces.get(i).cloned().unwrap_or(Value::Null);
        let host = get_if(0);
        let cont = get_if(1);
        let host_ifname = s(&host, "name").unwrap_or_default();
        let host_mac = s(&host, "mac").unwrap_or_default();
        let container_mac = s(&cont, "mac").unwrap_or_default();
        if host_ifname.is_empty() {
            p.push("interfaces[0].name missing".into());
        }
        if let Some(prefix) = &self.host_ifname_prefix {
            if !host_ifname.starts_with(prefix.as_str()) {
                p.push(format!(
                    "host veth {host_ifname:?} does not start with {prefix:?}"
                ));
            }
        }
        if let Some(len) = self.host_ifname_len {
            if host_ifname.len() != len {
                p.push(format!("host veth {host_ifname:?} is not {len} characters"));
            }
        }
        if !is_mac(&host_mac) {
            p.push(format!("interfaces[0].mac {host_mac:?} is not a MAC"));
        }
        if host
            .get("sandbox")
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
        {
            p.push("interfaces[0] (host side) has a sandbox".into());
        }
        if s(&cont, "name").as_deref() != Some(self.ifname.as_str()) {
            p.push(format!(
                "interfaces[1].name is {:?}, expected {:?}",
                cont.get("name"),
                self.ifname
            ));
        }
        if !is_mac(&container_mac) {
            p.push(format!("interfaces[1].mac {container_mac:?} is not a MAC"));
        }
        if let Some(mac) = &self.container_mac {
            if container_mac.to_lowercase() != *mac {
                p.push(format!(
                    "interfaces[1].mac is {container_mac:?}, requested {mac:?}"
                ));
            }
        }
        if s(&cont, "sandbox").as_deref() != Some(self.sandbox.as_str()) {
            p.push(format!(
                "interfaces[1].sandbox is {:?}, expected {:?}",
                cont.get("sandbox"),
                self.sandbox
            ));
        }

        // 0.3.x and 0.4.0 carry `ips[].version`; 1.0.0 dropped it, and 1.1.0 keeps 1.0.0's
        // layout.
        let versioned_ips = self.cni_version.starts_with("0.");
        let mut ips = Vec::new();
        for (i, ip) in result
            .get("ips")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            let Some(addr) = s(ip, "address") else {
                p.push(format!("ips[{i}] has no address"));
                continue;
            };
            let Some((a, l)) = parse_cidr(&addr) else {
                p.push(format!("ips[{i}].address {addr:?} is not CIDR"));
                continue;
            };
            let gw = s(ip, "gateway").and_then(|g| g.parse::<IpAddr>().ok());
            if ip.get("interface").and_then(Value::as_u64) != Some(1) {
                p.push(format!(
                    "ips[{i}].interface is {:?}, expected 1",
                    ip.get("interface")
                ));
            }
            let want_version = if a.is_ipv4() { "4" } else { "6" };
            match (versioned_ips, ip.get("version")) {
                (true, Some(Value::String(v))) if v == want_version => {}
                (true, other) => p.push(format!(
                    "ips[{i}].version is {other:?}, cniVersion {} needs {want_version:?}",
                    self.cni_version
                )),
                (false, Some(v)) => p.push(format!("ips[{i}] has version {v} (not in 1.0.0)")),
                (false, None) => {}
            }
            ips.push(ResultIp {
                addr: a,
                prefix: l,
                gateway: gw,
            });
        }
        for (subnet, gateway) in self.stack.subnets() {
            let (net, len) = parse_cidr(subnet).expect("valid test subnet");
            let gw: IpAddr = gateway.parse().expect("valid test gateway");
            match ips.iter().find(|ip| in_subnet(ip.addr, net, len)) {
                None => p.push(format!("no ips entry in {subnet}")),
                Some(ip) => {
                    if ip.prefix != len {
                        p.push(format!(
                            "{}/{} does not carry the subnet prefix /{len}",
                            ip.addr, ip.prefix
                        ));
                    }
                    if ip.gateway != Some(gw) {
                        p.push(format!(
                            "{} has gateway {:?}, expected {gw}",
                            ip.addr, ip.gateway
                        ));
                    }
                    if ip.addr == gw {
                        p.push(format!("the gateway {gw} was handed out"));
                    }
                }
            }
        }
        if ips.len() != self.stack.subnets().len() {
            p.push(format!(
                "expected {} ips, got {}",
                self.stack.subnets().len(),
                ips.len()
            ));
        }

        let routes = result
            .get("routes")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for dst in &self.route_dsts {
            if !routes
                .iter()
                .any(|r| r.get("dst").and_then(Value::as_str) == Some(dst.as_str()))
            {
                p.push(format!("routes lack dst {dst}: {routes:?}"));
            }
        }
        if let Some(dns) = &self.dns {
            if result.get("dns") != Some(dns) {
                p.push(format!("dns is {:?}, expected {dns}", result.get("dns")));
            }
        }

        if p.is_empty() {
            Ok(AddResult {
                host_ifname,
                host_mac,
                container_mac,
                ips,
            })
        } else {
            Err(p)
        }
    }

    /// [`Self::validate`], panicking with every problem and the result.
    pub fn assert_valid(&self, result: &Value) -> AddResult {
        self.validate(result).unwrap_or_else(|problems| {
            panic!(
                "ADD result (cniVersion {}) violates section 5:\n  - {}\nresult: {}",
                self.cni_version,
                problems.join("\n  - "),
                serde_json::to_string_pretty(result).unwrap_or_default()
            )
        })
    }
}

/// The parts of an ADD result later checks use.
#[derive(Debug, Clone)]
pub struct AddResult {
    pub host_ifname: String,
    pub host_mac: String,
    pub container_mac: String,
    pub ips: Vec<ResultIp>,
}

impl AddResult {
    pub fn ip4(&self) -> Option<&ResultIp> {
        self.ips.iter().find(|i| i.addr.is_ipv4())
    }

    pub fn ip6(&self) -> Option<&ResultIp> {
        self.ips.iter().find(|i| i.addr.is_ipv6())
    }

    /// Parses a result without judging it (e.g. one made by a chain).
    pub fn parse(result: &Value) -> Option<Self> {
        let ifaces = result.get("interfaces")?.as_array()?;
        let name = |i: usize, k: &str| -> Option<String> {
            Some(ifaces.get(i)?.get(k)?.as_str()?.to_owned())
        };
        let ips = result
            .get("ips")?
            .as_array()?
            .iter()
            .filter_map(|ip| {
                let (addr, prefix) = parse_cidr(ip.get("address")?.as_str()?)?;
                let gateway = ip
                    .get("gateway")
                    .and_then(Value::as_str)
                    .and_then(|g| g.parse().ok());
                Some(ResultIp {
                    addr,
                    prefix,
                    gateway,
                })
            })
            .collect();
        Some(Self {
            host_ifname: name(0, "name")?,
            host_mac: name(0, "mac").unwrap_or_default(),
            container_mac: name(1, "mac").unwrap_or_default(),
            ips,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResultIp {
    pub addr: IpAddr,
    pub prefix: u8,
    pub gateway: Option<IpAddr>,
}

pub fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (a, l) = s.split_once('/')?;
    let a: IpAddr = a.parse().ok()?;
    let l: u8 = l.parse().ok()?;
    let max = if a.is_ipv4() { 32 } else { 128 };
    (l <= max).then_some((a, l))
}

pub fn in_subnet(ip: IpAddr, net: IpAddr, len: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if len == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(len))
            };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(len))
            };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

fn is_mac(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && u8::from_str_radix(p, 16).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample(version: &str, with_version_field: bool) -> Value {
        let mut ips = vec![
            json!({"interface": 1, "address": "10.10.0.2/24", "gateway": "10.10.0.1"}),
            json!({"interface": 1, "address": "fd00:10::2/64", "gateway": "fd00:10::1"}),
        ];
        if with_version_field {
            ips[0]["version"] = json!("4");
            ips[1]["version"] = json!("6");
        }
        json!({
            "cniVersion": version,
            "interfaces": [
                {"name": "ecni0123456789a", "mac": "66:59:70:a6:4d:44"},
                {"name": "eth0", "mac": "b2:e7:ad:9b:bb:be", "sandbox": "/run/netns/p"}
            ],
            "ips": ips,
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
            "dns": {"nameservers": ["10.10.0.1"]}
        })
    }

    #[test]
    fn accepts_well_formed_results_per_version() {
        for v in crate::CNI_VERSIONS {
            let exp = ResultExpectation::standard(v, "eth0", "/run/netns/p", Stack::Dual)
                .ebpf_cni_host_names();
            let r = exp.assert_valid(&sample(v, v.starts_with("0.")));
            assert_eq!(r.ip4().unwrap().addr.to_string(), "10.10.0.2");
            assert_eq!(r.host_ifname, "ecni0123456789a");
        }
    }

    #[test]
    fn rejects_version_field_mismatch() {
        let exp = ResultExpectation::standard("1.0.0", "eth0", "/run/netns/p", Stack::Dual);
        assert!(exp.validate(&sample("1.0.0", true)).is_err());
        let exp = ResultExpectation::standard("0.4.0", "eth0", "/run/netns/p", Stack::Dual);
        assert!(exp.validate(&sample("0.4.0", false)).is_err());
    }

    #[test]
    fn rejects_wrong_prefix_gateway_and_names() {
        let exp = ResultExpectation::standard("1.0.0", "eth0", "/run/netns/p", Stack::Dual)
            .ebpf_cni_host_names();
        let mut r = sample("1.0.0", false);
        r["ips"][0]["address"] = json!("10.10.0.2/32");
        r["ips"][1]["gateway"] = json!("fd00:10::9");
        r["interfaces"][0]["name"] = json!("veth1234");
        let problems = exp.validate(&r).unwrap_err();
        assert!(problems.len() >= 3, "{problems:?}");
    }

    #[test]
    fn subnet_math() {
        let (n, l) = parse_cidr("10.10.0.0/24").unwrap();
        assert!(in_subnet("10.10.0.200".parse().unwrap(), n, l));
        assert!(!in_subnet("10.10.1.2".parse().unwrap(), n, l));
        let (n, l) = parse_cidr("fd00:10::/64").unwrap();
        assert!(in_subnet("fd00:10::2".parse().unwrap(), n, l));
        assert!(parse_cidr("10.0.0.0/33").is_none());
    }
}
