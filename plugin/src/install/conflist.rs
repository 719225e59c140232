//! The conflist `ebpf-cni install` writes: one plugin, ebpf-cni with its built-in
//! host-local IPAM over the node's pod subnets and a default route per family, the
//! capabilities the runtime should pass, and a marker (`installedBy`) by which `uninstall`
//! knows the file as its own. Before it is written it goes through the plugin's own parsers
//! (the network config and the host-local config, as a runtime would hand the plugin its
//! entry), so install never leaves a conflist the plugin would refuse at the first ADD.

use ipnetwork::IpNetwork;
use serde::Serialize;
use serde_json::Value;

use super::settings::{Capabilities, BINARY_NAME};
use crate::{
    cni::config::{ConfigError, NetConf},
    ipam::{HostLocalConfig, IpamError},
};

/// The top-level key marking a conflist as written by `ebpf-cni install`. Runtimes ignore
/// keys of a conflist they do not know, and do not pass top-level keys to plugins.
pub const MARKER_KEY: &str = "installedBy";
pub const MARKER_VALUE: &str = "ebpf-cni install";

/// What the conflist describes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec<'a> {
    pub cni_version: &'a str,
    pub network: &'a str,
    /// At most one per family, IPv4 first: one range set each.
    pub subnets: &'a [IpNetwork],
    pub mtu: Option<u32>,
    pub capabilities: Capabilities,
    pub ip_masq: bool,
    /// `clusterNetworks` (the agent's, from its cluster source; `install` writes none).
    pub cluster_networks: &'a [IpNetwork],
}

/// The plugin refused the conflist we would write: the settings that made it are wrong in a
/// way their own checks missed.
#[derive(Debug, thiserror::Error)]
pub enum ConflistError {
    #[error("the plugin refuses the conflist these settings make")]
    Config(#[source] ConfigError),
    #[error("the plugin refuses the conflist's ipam section")]
    Ipam(#[source] IpamError),
    #[error("no pod subnet to give the ipam section")]
    NoSubnet,
}

#[derive(Serialize)]
struct Conflist<'a> {
    #[serde(rename = "cniVersion")]
    cni_version: &'a str,
    name: &'a str,
    #[serde(rename = "installedBy")]
    installed_by: &'static str,
    plugins: [Plugin; 1],
}

#[derive(Serialize)]
struct Plugin {
    #[serde(rename = "type")]
    plugin_type: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    mtu: Option<u32>,
    #[serde(rename = "ipMasq", skip_serializing_if = "std::ops::Not::not")]
    ip_masq: bool,
    #[serde(rename = "clusterNetworks", skip_serializing_if = "Vec::is_empty")]
    cluster_networks: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    capabilities: Option<CapabilityFlags>,
    ipam: Ipam,
}

#[derive(Serialize)]
struct CapabilityFlags {
    #[serde(rename = "portMappings", skip_serializing_if = "std::ops::Not::not")]
    port_mappings: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    bandwidth: bool,
}

#[derive(Serialize)]
struct Ipam {
    #[serde(rename = "type")]
    ipam_type: &'static str,
    ranges: Vec<[Subnet; 1]>,
    routes: Vec<Route>,
}

#[derive(Serialize)]
struct Subnet {
    subnet: String,
}

#[derive(Serialize)]
struct Route {
    dst: &'static str,
}

/// The conflist's text (pretty JSON, with a final newline), checked by the plugin's parsers.
pub fn render(spec: &Spec<'_>) -> Result<String, ConflistError> {
    if spec.subnets.is_empty() {
        return Err(ConflistError::NoSubnet);
    }
    let caps = spec.capabilities;
    let list = Conflist {
        cni_version: spec.cni_version,
        name: spec.network,
        installed_by: MARKER_VALUE,
        plugins: [Plugin {
            plugin_type: BINARY_NAME,
            mtu: spec.mtu,
            ip_masq: spec.ip_masq,
            cluster_networks: spec
                .cluster_networks
                .iter()
                .map(|n| n.to_string())
                .collect(),
            capabilities: (caps.port_mappings || caps.bandwidth).then_some(CapabilityFlags {
                port_mappings: caps.port_mappings,
                bandwidth: caps.bandwidth,
            }),
            ipam: Ipam {
                ipam_type: "host-local",
                ranges: spec
                    .subnets
                    .iter()
                    .map(|s| {
                        [Subnet {
                            subnet: s.to_string(),
                        }]
                    })
                    .collect(),
                routes: spec
                    .subnets
                    .iter()
                    .map(|s| Route {
                        dst: match s {
                            IpNetwork::V4(_) => "0.0.0.0/0",
                            IpNetwork::V6(_) => "::/0",
                        },
                    })
                    .collect(),
            },
        }],
    };
    // The text from the structs (a `Value` would sort the keys), checked as a `Value`.
    let mut text = serde_json::to_string_pretty(&list).expect("the conflist serializes");
    check(&serde_json::from_str(&text).expect("the conflist parses"))?;
    text.push('\n');
    Ok(text)
}

/// Runs the plugin's entry through the parsers ADD uses, as a runtime passes it: the
/// plugin's object with the list's `cniVersion` and `name` added.
fn check(list: &Value) -> Result<(), ConflistError> {
    let mut entry = list["plugins"][0].clone();
    entry["cniVersion"] = list["cniVersion"].clone();
    entry["name"] = list["name"].clone();
    let conf = NetConf::parse(entry).map_err(ConflistError::Config)?;
    conf.review_stock_keys().map_err(ConflistError::Config)?;
    let ipam = conf.ipam.as_ref().ok_or(ConflistError::NoSubnet)?;
    HostLocalConfig::parse(ipam, None).map_err(ConflistError::Ipam)?;
    Ok(())
}

/// Whether `text` is a conflist `ebpf-cni install` wrote (it carries the marker).
pub fn is_ours(text: &[u8]) -> bool {
    serde_json::from_slice::<Value>(text)
        .ok()
        .and_then(|v| v.get(MARKER_KEY)?.as_str().map(|m| m == MARKER_VALUE))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const BOTH: Capabilities = Capabilities {
        port_mappings: true,
        bandwidth: true,
    };

    fn nets(s: &[&str]) -> Vec<IpNetwork> {
        s.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn dual_stack_with_everything() {
        let subnets = nets(&["10.244.1.0/24", "fd00:10:244:1::/64"]);
        let text = render(&Spec {
            cni_version: "1.0.0",
            network: "k8s",
            subnets: &subnets,
            mtu: Some(1450),
            capabilities: BOTH,
            ip_masq: true,
            cluster_networks: &[],
        })
        .unwrap();
        assert!(text.ends_with("}\n"));
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v,
            json!({
                "cniVersion": "1.0.0",
                "name": "k8s",
                "installedBy": "ebpf-cni install",
                "plugins": [{
                    "type": "ebpf-cni",
                    "mtu": 1450,
                    "ipMasq": true,
                    "capabilities": { "portMappings": true, "bandwidth": true },
                    "ipam": {
                        "type": "host-local",
                        "ranges": [
                            [{ "subnet": "10.244.1.0/24" }],
                            [{ "subnet": "fd00:10:244:1::/64" }]
                        ],
                        "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]
                    }
                }]
            })
        );
        // Keys keep the order a reader expects, not the alphabet's.
        assert!(text.find("cniVersion").unwrap() < text.find("plugins").unwrap());
        assert!(is_ours(text.as_bytes()));
    }

    #[test]
    fn defaults_leave_keys_out() {
        let subnets = nets(&["fd00::/64"]);
        let text = render(&Spec {
            cni_version: "1.1.0",
            network: "n",
            subnets: &subnets,
            mtu: None,
            capabilities: Capabilities {
                port_mappings: false,
                bandwidth: true,
            },
            ip_masq: false,
            cluster_networks: &[],
        })
        .unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        let plugin = &v["plugins"][0];
        assert!(plugin.get("mtu").is_none() && plugin.get("ipMasq").is_none());
        assert_eq!(plugin["capabilities"], json!({ "bandwidth": true }));
        assert_eq!(plugin["ipam"]["routes"], json!([{ "dst": "::/0" }]));
    }

    #[test]
    fn the_plugins_parsers_judge_the_result() {
        // A network name the plugin refuses (the settings check it too).
        let subnets = nets(&["10.0.0.0/24"]);
        let err = render(&Spec {
            cni_version: "1.0.0",
            network: "../x",
            subnets: &subnets,
            mtu: None,
            capabilities: BOTH,
            ip_masq: false,
            cluster_networks: &[],
        })
        .unwrap_err();
        assert!(matches!(err, ConflistError::Config(_)), "{err}");
        let err = render(&Spec {
            cni_version: "1.0.0",
            network: "n",
            subnets: &[],
            mtu: None,
            capabilities: BOTH,
            ip_masq: false,
            cluster_networks: &[],
        })
        .unwrap_err();
        assert!(matches!(err, ConflistError::NoSubnet), "{err}");
    }

    #[test]
    fn only_marked_conflists_are_ours() {
        assert!(!is_ours(b"not json"));
        assert!(!is_ours(
            br#"{"cniVersion":"1.0.0","name":"x","plugins":[{"type":"ebpf-cni"}]}"#
        ));
        assert!(!is_ours(br#"{"installedBy":"someone else"}"#));
        assert!(is_ours(br#"{"installedBy":"ebpf-cni install"}"#));
    }
}
