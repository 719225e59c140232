//! The network configuration a runtime passes on stdin (spec sections 1 and 3), validated
//! up front so a bad config changes nothing on the node.
//!
//! Keys under `runtimeConfig` and `args` are looked up without regard to case: containerd
//! sends Go field names (`PortMappings`, `HostPort`), podman sends camelCase.

use std::net::IpAddr;

use serde_json::{Map, Value};

use super::{
    code,
    env::is_valid_id,
    stock_keys,
    version::{CniVersion, VersionError},
};

/// A network configuration that cannot be used; each names the field and the value found
/// there (as JSON), so an operator can fix the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("failed to decode network configuration from stdin")]
    Decode(#[source] serde_json::Error),
    #[error("failed to decode network configuration from stdin: expected a JSON object")]
    NotAnObject,
    #[error("cniVersion is missing from the network configuration")]
    MissingVersion,
    #[error(transparent)]
    Version(#[from] VersionError),
    #[error("{field} is missing from the network configuration")]
    Missing { field: &'static str },
    /// The value has the wrong JSON type: `expected` says which one it must be.
    #[error("{field} {value} must be {expected}")]
    WrongType {
        field: &'static str,
        value: Value,
        expected: &'static str,
    },
    #[error("{field} {value} is invalid: {expected}")]
    Invalid {
        field: &'static str,
        value: Value,
        expected: &'static str,
    },
    #[error("ipam.type (missing) is invalid: expected the name of an IPAM plugin")]
    MissingIpamType,
    #[error("name {0:?} is invalid: a network name must start with a letter or digit followed by letters, digits, '_', '.' or '-'")]
    InvalidName(String),
    #[error("{field} entry {value} is not a CIDR")]
    NotACidr { field: &'static str, value: Value },
    #[error("{field}[{index}] {value} is not an IP address")]
    NotAnIp {
        field: &'static str,
        index: usize,
        value: Value,
    },
    #[error("devices[{index}] {value} is not a valid interface name")]
    NotAnIfname { index: usize, value: Value },
    #[error("{field} {value:?} is not a valid unicast MAC address")]
    InvalidMac { field: &'static str, value: String },
    #[error("{field} {value} is refused (a key of the reference {plugins} plugin): {why}; remove it from the network configuration")]
    StockKeyRefused {
        field: String,
        value: Value,
        plugins: &'static str,
        why: &'static str,
    },
}

impl ConfigError {
    pub fn cni_code(&self) -> u32 {
        match self {
            Self::Decode(_) | Self::NotAnObject => code::DECODE_FAILURE,
            Self::MissingVersion => code::INCOMPATIBLE_VERSION,
            Self::Version(e) => e.cni_code(),
            _ => code::INVALID_CONFIG,
        }
    }
}

fn wrong_type(field: &'static str, value: &Value, expected: &'static str) -> ConfigError {
    ConfigError::WrongType {
        field,
        value: value.clone(),
        expected,
    }
}

fn invalid(field: &'static str, value: &Value, expected: &'static str) -> ConfigError {
    ConfigError::Invalid {
        field,
        value: value.clone(),
        expected,
    }
}

#[derive(Debug, Clone)]
pub struct NetConf {
    /// The whole object as received: delegated plugins get it unchanged (spec section 4).
    pub raw: Value,
    pub cni_version: CniVersion,
    pub name: String,
    pub mtu: Option<u32>,
    pub ipam: Option<Value>,
    pub ipam_type: Option<String>,
    pub dns: Option<Value>,
    pub runtime: RuntimeConfig,
    /// `args.cni.ips` (CONVENTIONS.md).
    pub args_ips: Vec<IpAddr>,
    pub prev_result: Option<Value>,
    /// `devices`: the node devices that get the device program (default: every device
    /// with a global address that is not a pod veth).
    pub devices: Option<Vec<String>>,
    /// `tcAttachMode`: "tcx", "netlink", or "auto" (the default: TCX links on the node
    /// devices and on a chained pod's veth where the kernel has TCX, netlink filters
    /// everywhere else, and on ebpf-cni's own pod veths always; see `node::attach_modes`).
    pub tc_attach_mode: TcAttachMode,
    /// `ipMasq: true`, with its `ipMasqExclude`.
    pub masq: Option<MasqConf>,
    /// `hostPortsOnLoopback` (default true): the node's own connections to `127.0.0.0/8`
    /// and `::1` reach the wildcard host ports, as the reference portmap does; false leaves
    /// loopback to the node's own listeners (see `portmap`).
    pub host_ports_on_loopback: bool,
    /// `isDefaultGateway` (the reference bridge's key): the pod gets a default route per
    /// family through its gateway, whatever IPAM's routes say.
    pub is_default_gateway: bool,
    /// `serviceCIDRs`: Service ranges the programs hand to the stack besides those learned
    /// from kube-proxy's rules (see `services`).
    pub service_cidrs: Vec<ipnetwork::IpNetwork>,
    /// `clusterNetworks`: the cluster's pod networks, which `ebpf-cni agent` writes from its
    /// cluster source (see cluster.md): pods on other nodes, which keep the pod's address
    /// under `ipMasq`.
    pub cluster_networks: Vec<ipnetwork::IpNetwork>,
}

/// What `ipMasq: true` asks for: the pod's traffic to destinations outside the pod
/// network's ranges and `exclude` leaves with the node's address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MasqConf {
    /// `ipMasqExclude`: more destinations that keep the pod's address.
    pub exclude: Vec<ipnetwork::IpNetwork>,
    /// `ipMasqPortRange` ("61000-65535"): the node's masquerade ports (node-wide: the first
    /// masquerading pod sets it, later ones must agree). `None`: the default.
    pub ports: Option<(u16, u16)>,
}

/// `"lo-hi"` with 1 <= lo <= hi.
fn parse_port_range(v: &Value, field: &'static str) -> Result<(u16, u16), ConfigError> {
    v.as_str()
        .and_then(|s| s.split_once('-'))
        .and_then(|(a, b)| Some((a.trim().parse::<u16>().ok()?, b.trim().parse::<u16>().ok()?)))
        .filter(|&(lo, hi)| lo >= 1 && lo <= hi)
        .ok_or_else(|| invalid(field, v, "expected \"first-last\", ports from 1 to 65535"))
}

/// A list of CIDRs (`field` names it in errors).
fn parse_cidr_list(
    v: &Value,
    field: &'static str,
) -> Result<Vec<ipnetwork::IpNetwork>, ConfigError> {
    let Some(items) = v.as_array() else {
        return Err(wrong_type(field, v, "a list of CIDRs (\"10.0.0.0/8\")"));
    };
    items
        .iter()
        .map(|item| {
            item.as_str()
                .and_then(|s| s.parse::<ipnetwork::IpNetwork>().ok())
                .map(|n| {
                    ipnetwork::IpNetwork::new(n.network(), n.prefix()).expect("prefix is valid")
                })
                .ok_or_else(|| ConfigError::NotACidr {
                    field,
                    value: item.clone(),
                })
        })
        .collect()
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TcAttachMode {
    #[default]
    Auto,
    Tcx,
    Netlink,
}

/// `runtimeConfig`: the keys the protocol layer reads (`mac`, `ips`) parsed; the
/// dataplane capabilities' (`portMappings`, `bandwidth`, `allowedSourcePrefixes`, ...) are
/// each parsed once by its capability's module (see `attachment::PodConf`), which looks its
/// key up with [`RuntimeConfig::capability`].
#[derive(Debug, Clone, Default)]
pub struct RuntimeConfig {
    pub mac: Option<String>,
    pub ips: Vec<IpAddr>,
    /// The whole object, for [`RuntimeConfig::capability`].
    raw: Map<String, Value>,
}

/// Case-insensitive key lookup, for the two spellings real runtimes send.
pub fn get_ci<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).or_else(|| {
        obj.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v)
    })
}

/// Decodes stdin. Malformed JSON is a decoding failure (code 6).
pub fn decode(stdin: &[u8]) -> Result<Value, ConfigError> {
    let v: Value = serde_json::from_slice(stdin).map_err(ConfigError::Decode)?;
    if !v.is_object() {
        return Err(ConfigError::NotAnObject);
    }
    Ok(v)
}

/// The `cniVersion` of a decoded config, validated.
pub fn version_of(raw: &Value) -> Result<CniVersion, ConfigError> {
    match raw.get("cniVersion") {
        Some(Value::String(v)) => Ok(CniVersion::parse(v)?),
        None => Err(ConfigError::MissingVersion),
        Some(other) => Err(wrong_type("cniVersion", other, "a string")),
    }
}

/// Validates a network name against the spec's pattern. The name also names IPAM
/// directories and bpffs pins, so anything else (e.g. "../x") is refused.
pub fn validate_network_name(name: &str) -> Result<(), ConfigError> {
    if is_valid_id(name) && name.len() <= 200 {
        Ok(())
    } else {
        Err(ConfigError::InvalidName(name.to_owned()))
    }
}

impl NetConf {
    /// ADD and CHECK (and `install`): the stock keys of the reference plugins the config
    /// sets (see `stock_keys.rs`): the first refused one as an error (code 7), else those
    /// accepted, for ADD's warning. DEL does not ask, so a runtime's DEL after the refused
    /// ADD still succeeds.
    pub fn review_stock_keys(&self) -> Result<Vec<stock_keys::Found>, ConfigError> {
        let obj = self.raw.as_object().expect("configs are objects");
        let mut accepted = Vec::new();
        for found in stock_keys::review(obj) {
            match found.row.fate {
                stock_keys::Fate::Honoured => {}
                stock_keys::Fate::Accepted(_) => accepted.push(found),
                stock_keys::Fate::Refused(why) => {
                    return Err(ConfigError::StockKeyRefused {
                        field: found.field,
                        value: found.value,
                        plugins: found.row.plugins,
                        why,
                    })
                }
            }
        }
        Ok(accepted)
    }

    /// Parses a decoded config, key by key in this order; the first bad key is the error.
    pub fn parse(raw: Value) -> Result<Self, ConfigError> {
        let cni_version = version_of(&raw)?;
        let obj = raw.as_object().expect("decode() only returns objects");
        let name = parse_name(obj)?;
        let mtu = parse_mtu(obj)?;
        let masq = parse_masq(obj)?;
        let is_default_gateway = parse_flag(obj, "isDefaultGateway", false)?;
        let host_ports_on_loopback = parse_flag(obj, "hostPortsOnLoopback", true)?;
        let (ipam, ipam_type) = parse_ipam(obj)?;
        let dns = parse_object(obj, "dns")?;
        let runtime = parse_runtime_config(obj)?;
        let args_ips = parse_args_ips(obj)?;
        let prev_result = parse_object(obj, "prevResult")?;
        let devices = parse_devices(obj)?;
        let service_cidrs = parse_cidrs(obj, "serviceCIDRs")?;
        let cluster_networks = parse_cidrs(obj, "clusterNetworks")?;
        let tc_attach_mode = parse_tc_attach_mode(obj)?;
        Ok(NetConf {
            masq,
            host_ports_on_loopback,
            is_default_gateway,
            service_cidrs,
            cluster_networks,
            tc_attach_mode,
            devices,
            cni_version,
            name,
            mtu,
            ipam,
            ipam_type,
            dns,
            runtime,
            args_ips,
            prev_result,
            raw,
        })
    }
}

/// `name`: present, a string, and a valid network name.
fn parse_name(obj: &Map<String, Value>) -> Result<String, ConfigError> {
    let name = match obj.get("name") {
        Some(Value::String(s)) => s.clone(),
        None => return Err(ConfigError::Missing { field: "name" }),
        Some(other) => return Err(wrong_type("name", other, "a string")),
    };
    validate_network_name(&name)?;
    Ok(name)
}

/// `mtu`: absent, or an integer from 68 to 65535.
fn parse_mtu(obj: &Map<String, Value>) -> Result<Option<u32>, ConfigError> {
    match obj.get("mtu") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(m) if (68..=65535).contains(&m) => Ok(Some(m as u32)),
            _ => Err(invalid("mtu", v, "expected an integer from 68 to 65535")),
        },
    }
}

/// `ipMasq`, and with `true` its `ipMasqExclude` and `ipMasqPortRange`.
fn parse_masq(obj: &Map<String, Value>) -> Result<Option<MasqConf>, ConfigError> {
    match obj.get("ipMasq") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(None),
        Some(Value::Bool(true)) => Ok(Some(MasqConf {
            exclude: match obj.get("ipMasqExclude") {
                None | Some(Value::Null) => Vec::new(),
                Some(v) => parse_cidr_list(v, "ipMasqExclude")?,
            },
            ports: match obj.get("ipMasqPortRange") {
                None | Some(Value::Null) => None,
                Some(v) => Some(parse_port_range(v, "ipMasqPortRange")?),
            },
        })),
        Some(other) => Err(wrong_type("ipMasq", other, "true or false")),
    }
}

/// A boolean key, `default` when absent or null.
fn parse_flag(
    obj: &Map<String, Value>,
    field: &'static str,
    default: bool,
) -> Result<bool, ConfigError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(wrong_type(field, other, "true or false")),
    }
}

/// `ipam`: absent, or an object whose `type` names a plugin (a file name, no path).
fn parse_ipam(obj: &Map<String, Value>) -> Result<(Option<Value>, Option<String>), ConfigError> {
    match obj.get("ipam") {
        None | Some(Value::Null) => Ok((None, None)),
        Some(Value::Object(m)) => {
            let t = match m.get("type") {
                Some(Value::String(t))
                    if !t.is_empty() && !t.contains('/') && t != "." && t != ".." =>
                {
                    t.clone()
                }
                Some(other) => {
                    return Err(invalid(
                        "ipam.type",
                        other,
                        "expected the name of an IPAM plugin",
                    ))
                }
                None => return Err(ConfigError::MissingIpamType),
            };
            Ok((Some(Value::Object(m.clone())), Some(t)))
        }
        Some(other) => Err(wrong_type("ipam", other, "an object")),
    }
}

/// An object-valued key (`dns`, `prevResult`) kept whole; `None` when absent or null.
fn parse_object(
    obj: &Map<String, Value>,
    field: &'static str,
) -> Result<Option<Value>, ConfigError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v @ Value::Object(_)) => Ok(Some(v.clone())),
        Some(other) => Err(wrong_type(field, other, "an object")),
    }
}

/// `runtimeConfig`: absent, or an object (see [`RuntimeConfig`]).
fn parse_runtime_config(obj: &Map<String, Value>) -> Result<RuntimeConfig, ConfigError> {
    match obj.get("runtimeConfig") {
        None | Some(Value::Null) => Ok(RuntimeConfig::default()),
        Some(Value::Object(m)) => RuntimeConfig::parse(m),
        Some(other) => Err(wrong_type("runtimeConfig", other, "an object")),
    }
}

/// `args.cni.ips` (keys in either case); none unless `args.cni` is an object.
fn parse_args_ips(obj: &Map<String, Value>) -> Result<Vec<IpAddr>, ConfigError> {
    match obj
        .get("args")
        .and_then(Value::as_object)
        .and_then(|a| get_ci(a, "cni"))
    {
        Some(Value::Object(cni)) => match get_ci(cni, "ips") {
            Some(v) => parse_ip_list(v, "args.cni.ips"),
            None => Ok(Vec::new()),
        },
        _ => Ok(Vec::new()),
    }
}

/// `devices`: absent, or a list of valid interface names.
fn parse_devices(obj: &Map<String, Value>) -> Result<Option<Vec<String>>, ConfigError> {
    match obj.get("devices") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v.as_str() {
                Some(n) if super::env::validate_ifname(n).is_ok() => Ok(n.to_owned()),
                _ => Err(ConfigError::NotAnIfname {
                    index: i,
                    value: v.clone(),
                }),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(other) => Err(wrong_type("devices", other, "a list of interface names")),
    }
}

/// A key holding a list of CIDRs (`serviceCIDRs`, `clusterNetworks`): empty when absent.
fn parse_cidrs(
    obj: &Map<String, Value>,
    field: &'static str,
) -> Result<Vec<ipnetwork::IpNetwork>, ConfigError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(v) => parse_cidr_list(v, field),
    }
}

/// `tcAttachMode`: absent (`auto`), or one of "auto", "tcx" and "netlink".
fn parse_tc_attach_mode(obj: &Map<String, Value>) -> Result<TcAttachMode, ConfigError> {
    match obj.get("tcAttachMode") {
        None | Some(Value::Null) => Ok(TcAttachMode::Auto),
        Some(Value::String(m)) if m == "auto" => Ok(TcAttachMode::Auto),
        Some(Value::String(m)) if m == "tcx" => Ok(TcAttachMode::Tcx),
        Some(Value::String(m)) if m == "netlink" => Ok(TcAttachMode::Netlink),
        Some(other) => Err(invalid(
            "tcAttachMode",
            other,
            "expected \"auto\", \"tcx\" or \"netlink\"",
        )),
    }
}

impl RuntimeConfig {
    fn parse(m: &Map<String, Value>) -> Result<Self, ConfigError> {
        let mac = match get_ci(m, "mac") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => return Err(wrong_type("runtimeConfig.mac", other, "a string")),
        };
        let ips = match get_ci(m, "ips") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => parse_ip_list(v, "runtimeConfig.ips")?,
        };
        Ok(RuntimeConfig {
            mac,
            ips,
            raw: m.clone(),
        })
    }

    /// The value of capability `key` (CONVENTIONS.md), in either spelling runtimes send
    /// (containerd capitalizes); `None` when absent or null.
    pub fn capability(&self, key: &str) -> Option<&Value> {
        get_ci(&self.raw, key).filter(|v| !v.is_null())
    }
}

/// A list of addresses, each given plain ("10.0.0.5") or in CIDR form ("10.0.0.5/24").
fn parse_ip_list(v: &Value, field: &'static str) -> Result<Vec<IpAddr>, ConfigError> {
    let Value::Array(items) = v else {
        return Err(wrong_type(field, v, "a list of IP addresses"));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let s = item.as_str().unwrap_or_default();
            s.split('/')
                .next()
                .and_then(|a| a.parse::<IpAddr>().ok())
                .ok_or_else(|| ConfigError::NotAnIp {
                    field,
                    index: i,
                    value: item.clone(),
                })
        })
        .collect()
}

/// Parses a MAC address "aa:bb:cc:dd:ee:ff" (also '-' separated), refusing multicast ones.
pub fn parse_mac(s: &str, field: &'static str) -> Result<[u8; 6], ConfigError> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    let bad = || ConfigError::InvalidMac {
        field,
        value: s.to_owned(),
    };
    if parts.len() != 6 {
        return Err(bad());
    }
    let mut mac = [0u8; 6];
    for (i, p) in parts.iter().enumerate() {
        if p.len() != 2 {
            return Err(bad());
        }
        mac[i] = u8::from_str_radix(p, 16).map_err(|_| bad())?;
    }
    if mac[0] & 1 == 1 || mac == [0; 6] {
        return Err(bad());
    }
    Ok(mac)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<NetConf, ConfigError> {
        NetConf::parse(v)
    }

    /// A refused stock key fails with error 7 naming the key, its value and why; accepted
    /// ones come back for ADD's warning; the keys ebpf-cni honours and the keys runtimes add
    /// pass without a word.
    #[test]
    fn stock_keys_are_refused_accepted_or_honoured() {
        let base = json!({"cniVersion": "1.0.0", "name": "n", "type": "ebpf-cni"});
        let mut refused = base.clone();
        refused["masqAll"] = json!(true);
        let e = parse(refused).unwrap().review_stock_keys().unwrap_err();
        assert_eq!(e.cni_code(), code::INVALID_CONFIG);
        assert_eq!(
            e.to_string(),
            "masqAll true is refused (a key of the reference portmap plugin): host port clients always keep their addresses; remove it from the network configuration"
        );
        let mut accepted = base.clone();
        accepted["snat"] = json!(true);
        accepted["backend"] = json!("nftables");
        let found = parse(accepted).unwrap().review_stock_keys().unwrap();
        let fields: Vec<&str> = found.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(fields, ["snat", "backend"]);
        let mut honoured = base.clone();
        for (k, v) in [
            ("ingressRate", json!(1_000_000)),
            ("ingressBurst", json!(1_000_000)),
            ("egressRate", json!(1_000_000)),
            ("egressBurst", json!(1_000_000)),
            ("unshapedSubnets", json!(["10.0.0.0/8"])),
            ("ipMasq", json!(true)),
            ("isGateway", json!(true)),
            (
                "capabilities",
                json!({"portMappings": true, "bandwidth": true}),
            ),
            (
                "runtimeConfig",
                json!({"portMappings": [], "bandwidth": {}}),
            ),
            ("args", json!({"cni": {}})),
            ("prevResult", json!({"cniVersion": "1.0.0"})),
            ("somethingElse", json!(1)),
            ("snat", Value::Null),
        ] {
            honoured[k] = v;
        }
        assert!(parse(honoured)
            .unwrap()
            .review_stock_keys()
            .unwrap()
            .is_empty());
    }

    #[test]
    fn minimal_config() {
        let c = parse(json!({"cniVersion":"1.0.0","name":"net1","type":"ebpf-cni","ipam":{"type":"host-local","subnet":"10.1.0.0/24"}})).unwrap();
        assert_eq!(c.name, "net1");
        assert_eq!(c.ipam_type.as_deref(), Some("host-local"));
        assert!(c.mtu.is_none());
    }

    #[test]
    fn runtime_config_both_spellings() {
        let camel = parse(json!({"cniVersion":"1.0.0","name":"n","runtimeConfig":{"portMappings":[{"hostPort":8080}],"mac":"02:00:00:00:00:05","ips":["10.1.0.9/24"]}})).unwrap();
        let caps = parse(json!({"cniVersion":"1.0.0","name":"n","runtimeConfig":{"PortMappings":[{"HostPort":8080}],"Mac":"02:00:00:00:00:05","IPs":["10.1.0.9"]}})).unwrap();
        for c in [camel, caps] {
            assert!(c.runtime.capability("portMappings").is_some());
            assert_eq!(c.runtime.mac.as_deref(), Some("02:00:00:00:00:05"));
            assert_eq!(c.runtime.ips, vec!["10.1.0.9".parse::<IpAddr>().unwrap()]);
        }
        let c = parse(json!({"cniVersion":"1.0.0","name":"n","runtimeConfig":{"bandwidth":{"IngressRate":1000000,"IngressBurst":4294967295u64}}})).unwrap();
        assert!(c.runtime.capability("bandwidth").is_some());
    }

    #[test]
    fn cluster_networks_are_a_list_of_cidrs() {
        let c = parse(json!({"cniVersion":"1.0.0","name":"n","clusterNetworks":["10.244.0.0/16","fd00:10:244::/56"]})).unwrap();
        assert_eq!(
            c.cluster_networks,
            vec![
                "10.244.0.0/16".parse().unwrap(),
                "fd00:10:244::/56".parse().unwrap()
            ]
        );
        assert!(parse(json!({"cniVersion":"1.0.0","name":"n"}))
            .unwrap()
            .cluster_networks
            .is_empty());
        let e = parse(json!({"cniVersion":"1.0.0","name":"n","clusterNetworks":["10.244.0.0/33"]}))
            .unwrap_err();
        assert!(e.to_string().contains("clusterNetworks"), "{e}");
    }

    #[test]
    fn ip_masq_and_its_exclusions() {
        let c = parse(json!({"cniVersion":"1.0.0","name":"n","ipMasq":true,"ipMasqExclude":["10.96.0.0/12","fd00:96::1/64"]})).unwrap();
        let m = c.masq.expect("ipMasq: true");
        assert_eq!(m.ports, None);
        assert_eq!(
            m.exclude,
            vec![
                "10.96.0.0/12".parse().unwrap(),
                "fd00:96::/64".parse().unwrap()
            ],
            "host bits are cleared"
        );
        let c = parse(
            json!({"cniVersion":"1.0.0","name":"n","ipMasq":true,"ipMasqPortRange":"40000-40031"}),
        )
        .unwrap();
        assert_eq!(c.masq.unwrap().ports, Some((40000, 40031)));
        for off in [json!(false), json!(null)] {
            let c = parse(json!({"cniVersion":"1.0.0","name":"n","ipMasq":off})).unwrap();
            assert!(c.masq.is_none());
        }
    }

    #[test]
    fn args_cni_ips() {
        let c = parse(json!({"cniVersion":"0.4.0","name":"n","args":{"cni":{"ips":["10.1.0.7"]}}}))
            .unwrap();
        assert_eq!(c.args_ips, vec!["10.1.0.7".parse::<IpAddr>().unwrap()]);
    }

    #[test]
    fn bad_configs_name_the_field() {
        let cases = [
            (
                json!({"cniVersion":"9.9.9","name":"n"}),
                code::INCOMPATIBLE_VERSION,
                "9.9.9",
            ),
            (
                json!({"name":"n"}),
                code::INCOMPATIBLE_VERSION,
                "cniVersion",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"../evil"}),
                code::INVALID_CONFIG,
                "../evil",
            ),
            (json!({"cniVersion":"1.0.0"}), code::INVALID_CONFIG, "name"),
            (
                json!({"cniVersion":"1.0.0","name":"n","mtu":10}),
                code::INVALID_CONFIG,
                "mtu",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"n","ipam":{"type":"../x"}}),
                code::INVALID_CONFIG,
                "ipam.type",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"n","ipMasq":"yes"}),
                code::INVALID_CONFIG,
                "ipMasq \"yes\"",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"n","ipMasq":true,"ipMasqExclude":["10.0.0.0/8","10.300.0.0/16"]}),
                code::INVALID_CONFIG,
                "ipMasqExclude entry \"10.300.0.0/16\"",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"n","ipMasq":true,"ipMasqPortRange":"9-3"}),
                code::INVALID_CONFIG,
                "ipMasqPortRange \"9-3\"",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"n","ipMasq":true,"ipMasqExclude":"10.0.0.0/8"}),
                code::INVALID_CONFIG,
                "ipMasqExclude \"10.0.0.0/8\" must be a list",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"n","hostPortsOnLoopback":"no"}),
                code::INVALID_CONFIG,
                "hostPortsOnLoopback \"no\"",
            ),
            (
                json!({"cniVersion":"1.0.0","name":"n","runtimeConfig":{"ips":["x"]}}),
                code::INVALID_CONFIG,
                "runtimeConfig.ips[0]",
            ),
        ];
        for (v, c, needle) in cases {
            let e = parse(v.clone()).unwrap_err();
            assert_eq!(e.cni_code(), c, "{v}");
            assert!(e.to_string().contains(needle), "{v}: {e}");
        }
    }

    #[test]
    fn decode_errors() {
        assert_eq!(
            decode(b"{not json").unwrap_err().cni_code(),
            code::DECODE_FAILURE
        );
        assert_eq!(decode(b"[1]").unwrap_err().cni_code(), code::DECODE_FAILURE);
    }

    #[test]
    fn macs() {
        assert_eq!(
            parse_mac("02:00:00:aa:bb:cc", "mac").unwrap(),
            [2, 0, 0, 0xaa, 0xbb, 0xcc]
        );
        for bad in [
            "01:00:00:00:00:00",
            "zz:00:00:00:00:00",
            "02:00:00",
            "00:00:00:00:00:00",
        ] {
            assert_eq!(
                parse_mac(bad, "mac").unwrap_err().cni_code(),
                code::INVALID_CONFIG
            );
        }
    }
}
