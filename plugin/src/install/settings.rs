//! The settings of `ebpf-cni install` and `uninstall`: each one a flag with an environment
//! variable beside it (a DaemonSet sets the variables, an operator the flags), taken by
//! clap as text and validated here, all of them before anything is written. A setting that
//! is missing or cannot be used is an error naming its flag, its variable and the value, so
//! an operator can find it in a manifest as easily as on a command line.

use std::{
    fmt,
    net::IpAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use ipnetwork::IpNetwork;

use crate::cni::{config, version::SUPPORTED_VERSIONS};

/// One setting: its long flag (without the dashes) and its environment variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting {
    pub long: &'static str,
    pub env: &'static str,
}

/// `--mtu (EBPF_CNI_MTU)`
impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "--{} ({})", self.long, self.env)
    }
}

const fn setting(long: &'static str, env: &'static str) -> Setting {
    Setting { long, env }
}

pub const BIN_DIR: Setting = setting("bin-dir", "EBPF_CNI_BIN_DIR");
pub const CONF_DIR: Setting = setting("conf-dir", "EBPF_CNI_CONF_DIR");
pub const CONFLIST_NAME: Setting = setting("conflist-name", "EBPF_CNI_CONFLIST_NAME");
pub const SOURCE: Setting = setting("source", "EBPF_CNI_SOURCE");
pub const NETWORK: Setting = setting("network", "EBPF_CNI_NETWORK");
pub const POD_SUBNET: Setting = setting("pod-subnet", "EBPF_CNI_POD_SUBNETS");
pub const MTU: Setting = setting("mtu", "EBPF_CNI_MTU");
pub const CAPABILITIES: Setting = setting("capabilities", "EBPF_CNI_CAPABILITIES");
pub const IP_MASQ: Setting = setting("ip-masq", "EBPF_CNI_IP_MASQ");
pub const CNI_VERSION: Setting = setting("cni-version", "EBPF_CNI_CNI_VERSION");
pub const NODE_NAME: Setting = setting("node-name", "NODE_NAME");
pub const KUBE_HOST: Setting = setting("kube-host", "KUBERNETES_SERVICE_HOST");
pub const KUBE_PORT: Setting = setting("kube-port", "KUBERNETES_SERVICE_PORT");
pub const KUBE_TOKEN_FILE: Setting = setting("kube-token-file", "EBPF_CNI_KUBE_TOKEN_FILE");
pub const KUBE_CA_FILE: Setting = setting("kube-ca-file", "EBPF_CNI_KUBE_CA_FILE");
pub const KUBE_TIMEOUT: Setting = setting("kube-timeout", "EBPF_CNI_KUBE_TIMEOUT");
pub const PURGE: Setting = setting("purge", "EBPF_CNI_PURGE");

pub const DEFAULT_BIN_DIR: &str = "/opt/cni/bin";
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";
/// `10-`: before the usual `87-podman…`/`99-loopback…`, since runtimes use the first
/// conflist by name.
pub const DEFAULT_CONFLIST_NAME: &str = "10-ebpf-cni.conflist";
/// The running binary, whichever path it was started by.
pub const DEFAULT_SOURCE: &str = "/proc/self/exe";
pub const DEFAULT_NETWORK: &str = "ebpf-cni";
pub const DEFAULT_CAPABILITIES: &str = "portMappings,bandwidth";
/// The version containerd 1.6 and later, CRI-O and podman all read; 1.1.0 adds GC and
/// STATUS where the runtime has them.
pub const DEFAULT_CNI_VERSION: &str = "1.0.0";
/// Where kubelet mounts a pod's service-account credentials.
pub const DEFAULT_TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
pub const DEFAULT_CA_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
pub const DEFAULT_KUBE_TIMEOUT: &str = "10s";
/// Where the binary goes in the bin dir: the conflist's `type`, which runtimes look up there.
pub const BINARY_NAME: &str = "ebpf-cni";

/// A setting that is missing or cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("{setting} {value:?} is invalid: {expected}")]
    Invalid {
        setting: Setting,
        value: String,
        expected: String,
    },
    #[error("{setting} is not set: {why}")]
    Missing { setting: Setting, why: &'static str },
    #[error("{setting} {value:?} is not an existing directory")]
    NotADirectory {
        setting: Setting,
        value: String,
        #[source]
        source: Option<std::io::Error>,
    },
    #[error("{setting} {value:?} cannot be read")]
    Unreadable {
        setting: Setting,
        value: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{setting} gives two {family} subnets, {first} and {second}: one per family")]
    TwoOfOneFamily {
        setting: Setting,
        family: &'static str,
        first: IpNetwork,
        second: IpNetwork,
    },
}

fn invalid(setting: Setting, value: &str, expected: impl Into<String>) -> SettingsError {
    SettingsError::Invalid {
        setting,
        value: value.to_owned(),
        expected: expected.into(),
    }
}

/// Where install writes and uninstall removes: shared by both commands.
#[derive(Debug, Clone, clap::Args)]
pub struct TargetArgs {
    /// The host's CNI plugin directory, where the binary goes.
    #[arg(long = BIN_DIR.long, env = BIN_DIR.env, value_name = "DIR", default_value = DEFAULT_BIN_DIR)]
    pub bin_dir: String,
    /// The host's CNI configuration directory, where the conflist goes.
    #[arg(long = CONF_DIR.long, env = CONF_DIR.env, value_name = "DIR", default_value = DEFAULT_CONF_DIR)]
    pub conf_dir: String,
    /// The conflist's file name in the configuration directory (runtimes take the first by
    /// name).
    #[arg(long = CONFLIST_NAME.long, env = CONFLIST_NAME.env, value_name = "NAME", default_value = DEFAULT_CONFLIST_NAME)]
    pub conflist_name: String,
}

/// `ebpf-cni install`'s settings as given.
#[derive(Debug, Clone, clap::Args)]
pub struct InstallArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// The binary to install (default: the running one).
    #[arg(long = SOURCE.long, env = SOURCE.env, value_name = "PATH", default_value = DEFAULT_SOURCE)]
    pub source: String,
    /// The network name (it names the IPAM directory and the pods' pins).
    #[arg(long = NETWORK.long, env = NETWORK.env, value_name = "NAME", default_value = DEFAULT_NETWORK)]
    pub network: String,
    /// The node's pod subnet, at most one per address family (repeat the flag or separate
    /// with commas). Default: the Node object's spec.podCIDRs.
    #[arg(long = POD_SUBNET.long, env = POD_SUBNET.env, value_name = "CIDR", value_delimiter = ',')]
    pub pod_subnets: Vec<String>,
    /// The MTU of the pods' veths, 68-65535 (default: none in the conflist, the kernel's
    /// 1500).
    #[arg(long = MTU.long, env = MTU.env, value_name = "BYTES")]
    pub mtu: Option<String>,
    /// The capabilities the runtime passes: portMappings and/or bandwidth, comma-separated,
    /// or "none".
    #[arg(long = CAPABILITIES.long, env = CAPABILITIES.env, value_name = "LIST", default_value = DEFAULT_CAPABILITIES)]
    pub capabilities: String,
    /// Masquerade the pods' traffic leaving the pod network (`ipMasq`): true or false.
    #[arg(long = IP_MASQ.long, env = IP_MASQ.env, value_name = "BOOL", default_value = "false")]
    pub ip_masq: String,
    /// The conflist's cniVersion.
    #[arg(long = CNI_VERSION.long, env = CNI_VERSION.env, value_name = "VERSION", default_value = DEFAULT_CNI_VERSION)]
    pub cni_version: String,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// Where the Node object is read when no pod subnet is given: the pod's in-cluster
/// credentials, as kubelet provides them.
#[derive(Debug, Clone, clap::Args)]
pub struct KubeArgs {
    /// The node whose spec.podCIDRs to read (the downward API's spec.nodeName).
    #[arg(long = NODE_NAME.long, env = NODE_NAME.env, value_name = "NAME")]
    pub node_name: Option<String>,
    /// The API server's address.
    #[arg(id = "kube_host", long = KUBE_HOST.long, env = KUBE_HOST.env, value_name = "HOST")]
    pub host: Option<String>,
    /// The API server's port.
    #[arg(id = "kube_port", long = KUBE_PORT.long, env = KUBE_PORT.env, value_name = "PORT")]
    pub port: Option<String>,
    /// The service-account token.
    #[arg(id = "kube_token_file", long = KUBE_TOKEN_FILE.long, env = KUBE_TOKEN_FILE.env, value_name = "FILE", default_value = DEFAULT_TOKEN_FILE)]
    pub token_file: String,
    /// The CA bundle the API server's certificate must chain to.
    #[arg(id = "kube_ca_file", long = KUBE_CA_FILE.long, env = KUBE_CA_FILE.env, value_name = "FILE", default_value = DEFAULT_CA_FILE)]
    pub ca_file: String,
    /// The longest the request may take, connection included ("10s", "500ms").
    #[arg(id = "kube_timeout", long = KUBE_TIMEOUT.long, env = KUBE_TIMEOUT.env, value_name = "DURATION", default_value = DEFAULT_KUBE_TIMEOUT)]
    pub timeout: String,
}

/// `ebpf-cni uninstall`'s settings as given.
#[derive(Debug, Clone, clap::Args)]
pub struct UninstallArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Also remove the node's pinned eBPF state, refused while any pod is attached.
    #[arg(long = PURGE.long, env = PURGE.env, value_name = "BOOL", num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub purge: String,
    /// With --purge: the node whose network namespace this is (default: the current one).
    #[arg(long, value_name = "PATH")]
    pub netns: Option<PathBuf>,
}

/// Where the files go, validated: both directories exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub bin_dir: PathBuf,
    pub conf_dir: PathBuf,
    pub conflist_name: String,
}

impl Target {
    pub fn binary(&self) -> PathBuf {
        self.bin_dir.join(BINARY_NAME)
    }

    pub fn conflist(&self) -> PathBuf {
        self.conf_dir.join(&self.conflist_name)
    }
}

/// Which capabilities the plugin declares (`capabilities` in the conflist).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    pub port_mappings: bool,
    pub bandwidth: bool,
}

/// Where the pod subnets come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subnets {
    /// Given by `--pod-subnet`: IPv4 first.
    Explicit(Vec<IpNetwork>),
    /// The Node object's, read from the API server.
    FromNode(Kube),
}

/// How to read the Node object, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kube {
    pub node_name: String,
    pub host: String,
    pub port: u16,
    pub token_file: PathBuf,
    pub ca_file: PathBuf,
    pub timeout: Duration,
}

/// `ebpf-cni install`'s settings, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Install {
    pub target: Target,
    pub source: PathBuf,
    pub network: String,
    pub subnets: Subnets,
    pub mtu: Option<u32>,
    pub capabilities: Capabilities,
    pub ip_masq: bool,
    pub cni_version: String,
}

/// `ebpf-cni uninstall`'s settings, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uninstall {
    pub target: Target,
    pub purge: bool,
    pub netns: Option<PathBuf>,
}

impl TargetArgs {
    pub fn validate(&self) -> Result<Target, SettingsError> {
        let name = &self.conflist_name;
        let plain = !name.is_empty()
            && !name.starts_with('.')
            && !name.contains('/')
            && name.ends_with(".conflist")
            && name.len() > ".conflist".len();
        if !plain {
            return Err(invalid(
                CONFLIST_NAME,
                name,
                "expected a file name ending in .conflist, e.g. 10-ebpf-cni.conflist",
            ));
        }
        Ok(Target {
            bin_dir: existing_dir(BIN_DIR, &self.bin_dir)?,
            conf_dir: existing_dir(CONF_DIR, &self.conf_dir)?,
            conflist_name: name.clone(),
        })
    }
}

fn existing_dir(setting: Setting, value: &str) -> Result<PathBuf, SettingsError> {
    let not_a_dir = |source| SettingsError::NotADirectory {
        setting,
        value: value.to_owned(),
        source,
    };
    if value.is_empty() {
        return Err(not_a_dir(None));
    }
    match std::fs::metadata(value) {
        Ok(m) if m.is_dir() => Ok(PathBuf::from(value)),
        Ok(_) => Err(not_a_dir(None)),
        Err(e) => Err(not_a_dir(Some(e))),
    }
}

impl InstallArgs {
    /// Every setting checked; the Node object is not read here (see [`Subnets::FromNode`]).
    pub fn validate(&self) -> Result<Install, SettingsError> {
        let target = self.target.validate()?;
        let source = PathBuf::from(&self.source);
        // Opened, not only stat'ed: /proc/self/exe is a symlink to a file that may be gone.
        std::fs::File::open(&source)
            .and_then(|f| f.metadata())
            .and_then(|m| {
                if m.is_file() {
                    Ok(())
                } else {
                    Err(std::io::Error::other("not a regular file"))
                }
            })
            .map_err(|source| SettingsError::Unreadable {
                setting: SOURCE,
                value: self.source.clone(),
                source,
            })?;
        config::validate_network_name(&self.network).map_err(|_| {
            invalid(
                NETWORK,
                &self.network,
                "expected letters, digits, '_', '.' or '-', starting with a letter or digit",
            )
        })?;
        let subnets = parse_subnets(&self.pod_subnets)?;
        let subnets = if subnets.is_empty() {
            Subnets::FromNode(self.kube.validate()?)
        } else {
            Subnets::Explicit(subnets)
        };
        let mtu = match self.mtu.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(v) => Some(
                v.parse::<u32>()
                    .ok()
                    .filter(|m| (68..=65535).contains(m))
                    .ok_or_else(|| invalid(MTU, v, "expected an integer from 68 to 65535"))?,
            ),
        };
        let cni_version = self.cni_version.trim();
        if !SUPPORTED_VERSIONS.contains(&cni_version) {
            return Err(invalid(
                CNI_VERSION,
                cni_version,
                format!("expected one of {}", SUPPORTED_VERSIONS.join(", ")),
            ));
        }
        Ok(Install {
            target,
            source,
            network: self.network.clone(),
            subnets,
            mtu,
            capabilities: parse_capabilities(&self.capabilities)?,
            ip_masq: parse_bool(IP_MASQ, &self.ip_masq)?,
            cni_version: cni_version.to_owned(),
        })
    }
}

impl UninstallArgs {
    pub fn validate(&self) -> Result<Uninstall, SettingsError> {
        Ok(Uninstall {
            target: self.target.validate()?,
            purge: parse_bool(PURGE, &self.purge)?,
            netns: self.netns.clone(),
        })
    }
}

fn parse_bool(setting: Setting, value: &str) -> Result<bool, SettingsError> {
    match value.trim() {
        "true" => Ok(true),
        "false" | "" => Ok(false),
        other => Err(invalid(setting, other, "expected true or false")),
    }
}

/// At most one subnet per family, each a network address (no host bits), IPv4 first.
fn parse_subnets(values: &[String]) -> Result<Vec<IpNetwork>, SettingsError> {
    let mut v4: Option<IpNetwork> = None;
    let mut v6: Option<IpNetwork> = None;
    for value in values.iter().map(|v| v.trim()).filter(|v| !v.is_empty()) {
        let net = parse_subnet(value).map_err(|expected| invalid(POD_SUBNET, value, expected))?;
        let (slot, family) = match net {
            IpNetwork::V4(_) => (&mut v4, "IPv4"),
            IpNetwork::V6(_) => (&mut v6, "IPv6"),
        };
        if let Some(first) = *slot {
            return Err(SettingsError::TwoOfOneFamily {
                setting: POD_SUBNET,
                family,
                first,
                second: net,
            });
        }
        *slot = Some(net);
    }
    Ok(v4.into_iter().chain(v6).collect())
}

/// A pod subnet: a CIDR whose address is its network's, with room for the gateway and at
/// least one pod (host-local takes the first address as the gateway and, in IPv4, leaves
/// out the network and broadcast addresses). Also checks the Node object's podCIDRs.
pub fn parse_subnet(value: &str) -> Result<IpNetwork, String> {
    let net: IpNetwork = value
        .parse()
        .map_err(|_| "expected a CIDR, e.g. 10.244.1.0/24 or fd00:10:244:1::/64".to_owned())?;
    if net.network() != net.ip() {
        return Err(format!(
            "host bits are set: expected the network address, {}/{}",
            net.network(),
            net.prefix()
        ));
    }
    let max = match net.ip() {
        IpAddr::V4(_) => 30,
        IpAddr::V6(_) => 126,
    };
    if net.prefix() > max {
        return Err(format!(
            "a /{} leaves no address for a pod: at most /{max}",
            net.prefix()
        ));
    }
    Ok(net)
}

fn parse_capabilities(value: &str) -> Result<Capabilities, SettingsError> {
    let mut caps = Capabilities {
        port_mappings: false,
        bandwidth: false,
    };
    let items: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if items == ["none"] {
        return Ok(caps);
    }
    for item in items {
        match item {
            "portMappings" => caps.port_mappings = true,
            "bandwidth" => caps.bandwidth = true,
            _ => {
                return Err(invalid(
                    CAPABILITIES,
                    value,
                    format!("{item:?} is not one: expected portMappings and/or bandwidth, comma-separated, or none"),
                ))
            }
        }
    }
    Ok(caps)
}

impl KubeArgs {
    pub fn validate(&self) -> Result<Kube, SettingsError> {
        self.validate_for(
            "needed to read the node's spec.podCIDRs when no --pod-subnet (EBPF_CNI_POD_SUBNETS) is given",
        )
    }

    /// [`Self::validate`], a missing setting said to be needed `why`.
    pub fn validate_for(&self, why: &'static str) -> Result<Kube, SettingsError> {
        let required = |setting: Setting, v: &Option<String>| -> Result<String, SettingsError> {
            match v.as_deref().map(str::trim) {
                Some(v) if !v.is_empty() => Ok(v.to_owned()),
                _ => Err(SettingsError::Missing { setting, why }),
            }
        };
        let node_name = required(NODE_NAME, &self.node_name)?;
        if !is_dns_subdomain(&node_name) {
            return Err(invalid(
                NODE_NAME,
                &node_name,
                "expected a node name (lowercase letters, digits, '-' and '.')",
            ));
        }
        let host = required(KUBE_HOST, &self.host)?;
        // An IPv6 literal may come bracketed or not; the brackets are added where needed.
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(&host)
            .to_owned();
        let host_ok = host.parse::<IpAddr>().is_ok() || is_dns_subdomain(&host.to_lowercase());
        if !host_ok {
            return Err(invalid(
                KUBE_HOST,
                &host,
                "expected an IP address or a DNS name",
            ));
        }
        let port_text = required(KUBE_PORT, &self.port)?;
        let port = port_text
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| invalid(KUBE_PORT, &port_text, "expected a port from 1 to 65535"))?;
        Ok(Kube {
            node_name,
            host,
            port,
            token_file: file_setting(KUBE_TOKEN_FILE, &self.token_file)?,
            ca_file: file_setting(KUBE_CA_FILE, &self.ca_file)?,
            timeout: parse_duration(&self.timeout).ok_or_else(|| {
                invalid(
                    KUBE_TIMEOUT,
                    &self.timeout,
                    "expected a duration from 1ms to 300s, e.g. 10s or 500ms",
                )
            })?,
        })
    }
}

fn file_setting(setting: Setting, value: &str) -> Result<PathBuf, SettingsError> {
    if value.trim().is_empty() {
        return Err(SettingsError::Missing {
            setting,
            why: "needed to read the node's spec.podCIDRs",
        });
    }
    Ok(Path::new(value).to_path_buf())
}

/// "10s", "500ms", or plain seconds ("10").
fn parse_duration(value: &str) -> Option<Duration> {
    let v = value.trim();
    let d = if let Some(ms) = v.strip_suffix("ms") {
        Duration::from_millis(ms.trim().parse().ok()?)
    } else {
        let s = v.strip_suffix('s').unwrap_or(v).trim();
        Duration::try_from_secs_f64(s.parse().ok()?).ok()?
    };
    (Duration::from_millis(1)..=Duration::from_secs(300))
        .contains(&d)
        .then_some(d)
}

/// RFC 1123 subdomain, as Kubernetes names nodes: lowercase letters, digits, '-' and '.',
/// labels starting and ending with a letter or digit, at most 253 characters.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && !s.is_empty()
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets_are_one_per_family_ipv4_first() {
        let v = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let got = parse_subnets(&v(&["fd00:10::/64", " 10.244.1.0/24", ""])).unwrap();
        assert_eq!(
            got.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["10.244.1.0/24", "fd00:10::/64"]
        );
        let err = parse_subnets(&v(&["10.0.0.0/24", "10.1.0.0/24"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--pod-subnet (EBPF_CNI_POD_SUBNETS) gives two IPv4 subnets, 10.0.0.0/24 and 10.1.0.0/24: one per family"
        );
        assert!(parse_subnets(&v(&[])).unwrap().is_empty());
    }

    #[test]
    fn a_bad_subnet_is_named_with_its_value() {
        for (value, says) in [
            ("10.0.0.0/33", "expected a CIDR"),
            ("banana", "expected a CIDR"),
            (
                "10.0.0.5/24",
                "host bits are set: expected the network address, 10.0.0.0/24",
            ),
            ("10.0.0.0/31", "at most /30"),
            ("fd00::/127", "at most /126"),
        ] {
            let err = parse_subnets(&[value.to_owned()]).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!(
                    "--pod-subnet (EBPF_CNI_POD_SUBNETS) {value:?} is invalid: "
                )) && err.contains(says),
                "{value}: {err}"
            );
        }
    }

    #[test]
    fn capabilities_default_none_and_unknown() {
        assert_eq!(
            parse_capabilities(DEFAULT_CAPABILITIES).unwrap(),
            Capabilities {
                port_mappings: true,
                bandwidth: true
            }
        );
        assert_eq!(
            parse_capabilities("none").unwrap(),
            Capabilities {
                port_mappings: false,
                bandwidth: false
            }
        );
        assert!(parse_capabilities("bandwidth").unwrap().bandwidth);
        let err = parse_capabilities("portMappings,mac")
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"mac\" is not one"), "{err}");
        assert!(err.contains("EBPF_CNI_CAPABILITIES"), "{err}");
    }

    #[test]
    fn durations_and_bools() {
        assert_eq!(parse_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("10"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        for bad in ["", "0", "-1s", "1h", "301s", "ten"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
        assert!(parse_bool(IP_MASQ, "true").unwrap());
        assert!(!parse_bool(IP_MASQ, "false").unwrap());
        let err = parse_bool(IP_MASQ, "yes").unwrap_err().to_string();
        assert_eq!(
            err,
            "--ip-masq (EBPF_CNI_IP_MASQ) \"yes\" is invalid: expected true or false"
        );
    }

    #[test]
    fn node_names_are_dns_subdomains() {
        for ok in ["node-1", "ip-10-0-0-1.ec2.internal", "a"] {
            assert!(is_dns_subdomain(ok), "{ok}");
        }
        for bad in ["", "Node1", "-a", "a-", "a..b", "a/b", "../x", "a b"] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn conflist_names_are_plain_conflist_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_string_lossy().into_owned();
        let args = |name: &str| TargetArgs {
            bin_dir: dir.clone(),
            conf_dir: dir.clone(),
            conflist_name: name.to_owned(),
        };
        assert!(args("10-ebpf-cni.conflist").validate().is_ok());
        for bad in [
            "",
            ".conflist",
            ".x.conflist",
            "../x.conflist",
            "x.conf",
            "x.json",
        ] {
            let err = args(bad).validate().unwrap_err().to_string();
            assert!(
                err.starts_with("--conflist-name (EBPF_CNI_CONFLIST_NAME)"),
                "{bad}: {err}"
            );
        }
        let missing = TargetArgs {
            bin_dir: tmp.path().join("nope").to_string_lossy().into_owned(),
            ..args("10-ebpf-cni.conflist")
        };
        let err = missing.validate().unwrap_err().to_string();
        assert!(
            err.starts_with("--bin-dir (EBPF_CNI_BIN_DIR) \"") && err.contains("nope"),
            "{err}"
        );
    }
}
