//! The node's subnets in its conflist: the ebpf-cni plugin's host-local ranges become the
//! subnets the source gave the node, the rest of the file staying as it is (an operator's
//! conflist keeps its keys); a missing conflist is written as `ebpf-cni install` writes
//! one. Written atomically, and not at all when it already says so.

use std::path::{Path, PathBuf};

use ipnetwork::IpNetwork;
use serde_json::{json, Value};

use crate::install::{
    conflist::{render, ConflistError, Spec},
    files::{self, FileError},
    settings::{Capabilities, DEFAULT_CNI_VERSION, DEFAULT_NETWORK},
};

#[derive(Debug, thiserror::Error)]
pub enum ConflistUpdateError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error("{path} is not JSON")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path} has no plugin of type \"ebpf-cni\"")]
    NoPlugin { path: PathBuf },
    #[error(transparent)]
    Render(#[from] ConflistError),
}

/// The ebpf-cni plugin object of a conflist (or a single config of that type).
fn plugin_mut(list: &mut Value) -> Option<&mut Value> {
    let is_ours = |p: &Value| p.get("type").and_then(Value::as_str) == Some("ebpf-cni");
    if list.get("plugins").is_none() {
        return is_ours(list).then_some(list);
    }
    list.get_mut("plugins")?
        .as_array_mut()?
        .iter_mut()
        .find(|p| is_ours(p))
}

/// The subnets of the conflist's host-local ranges (empty when there is no such file or
/// plugin): what the node's pods have their addresses from.
pub fn current_subnets(path: &Path) -> Vec<IpNetwork> {
    let Ok(text) = std::fs::read(path) else {
        return Vec::new();
    };
    let Ok(mut list) = serde_json::from_slice::<Value>(&text) else {
        return Vec::new();
    };
    let Some(plugin) = plugin_mut(&mut list) else {
        return Vec::new();
    };
    plugin["ipam"]["ranges"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|set| set.as_array())
        .flatten()
        .filter_map(|r| r["subnet"].as_str()?.parse().ok())
        .collect()
}

/// Makes the conflist at `path` give the node's pods addresses from `subnets` (one range
/// set each), name the cluster's pod `networks` (`clusterNetworks`: masquerade skips
/// them) and, with `max_mtu` (the tunnel's), give pods at most that MTU (a smaller `mtu`
/// is kept); whether it was written.
pub fn write_subnets(
    path: &Path,
    subnets: &[IpNetwork],
    networks: &[IpNetwork],
    max_mtu: Option<u32>,
) -> Result<bool, ConflistUpdateError> {
    let text = match std::fs::read(path) {
        Ok(text) => {
            let mut list: Value =
                serde_json::from_slice(&text).map_err(|source| ConflistUpdateError::Json {
                    path: path.to_owned(),
                    source,
                })?;
            let plugin = plugin_mut(&mut list).ok_or_else(|| ConflistUpdateError::NoPlugin {
                path: path.to_owned(),
            })?;
            with_subnets(plugin, subnets);
            plugin["clusterNetworks"] = networks.iter().map(|n| n.to_string()).collect();
            if let Some(max) = max_mtu {
                let mtu = plugin["mtu"]
                    .as_u64()
                    .map_or(max, |m| m.min(u64::from(max)) as u32);
                plugin["mtu"] = mtu.into();
            }
            let mut text = serde_json::to_string_pretty(&list).expect("JSON serializes");
            text.push('\n');
            text
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => render(&Spec {
            cni_version: DEFAULT_CNI_VERSION,
            network: DEFAULT_NETWORK,
            subnets,
            mtu: max_mtu,
            capabilities: Capabilities {
                port_mappings: true,
                bandwidth: true,
            },
            ip_masq: false,
            cluster_networks: networks,
        })?,
        Err(source) => {
            return Err(FileError::Read {
                path: path.to_owned(),
                source,
            }
            .into())
        }
    };
    Ok(files::put(path, text.as_bytes(), 0o644)? == files::Put::Written)
}

/// The plugin's ipam with `subnets` as its ranges (host-local with a default route per
/// family when it had no ipam).
fn with_subnets(plugin: &mut Value, subnets: &[IpNetwork]) {
    let ranges: Vec<Value> = subnets
        .iter()
        .map(|s| json!([{ "subnet": s.to_string() }]))
        .collect();
    if !plugin.get("ipam").is_some_and(Value::is_object) {
        let routes: Vec<Value> = subnets
            .iter()
            .map(|s| json!({ "dst": if s.is_ipv4() { "0.0.0.0/0" } else { "::/0" } }))
            .collect();
        plugin["ipam"] = json!({ "type": "host-local", "routes": routes });
    }
    plugin["ipam"]["ranges"] = Value::Array(ranges);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operators_conflist_gets_the_subnets_and_keeps_its_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("10-ebpf-cni.conflist");
        let list = json!({"cniVersion": "1.0.0", "name": "k8s", "plugins": [
            {"type": "ebpf-cni", "mtu": 1450, "ipam": {"type": "host-local",
                "ranges": [[{"subnet": "10.1.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "tuning"}
        ]});
        std::fs::write(&path, serde_json::to_vec(&list).unwrap()).unwrap();
        assert_eq!(
            current_subnets(&path),
            vec!["10.1.0.0/24".parse::<IpNetwork>().unwrap()]
        );
        let subnets: Vec<IpNetwork> = vec!["10.244.3.0/24".parse().unwrap()];
        let networks: Vec<IpNetwork> = vec!["10.244.0.0/16".parse().unwrap()];
        assert!(write_subnets(&path, &subnets, &networks, None).unwrap());
        assert!(
            !write_subnets(&path, &subnets, &networks, None).unwrap(),
            "a second write changes nothing"
        );
        let written: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(written["plugins"][0]["mtu"], json!(1450));
        assert_eq!(
            written["plugins"][0]["clusterNetworks"],
            json!(["10.244.0.0/16"])
        );
        assert_eq!(written["plugins"][1], json!({"type": "tuning"}));
        assert_eq!(
            written["plugins"][0]["ipam"]["ranges"],
            json!([[{"subnet": "10.244.3.0/24"}]])
        );
        assert_eq!(current_subnets(&path), subnets);
    }

    #[test]
    fn the_tunnels_mtu_bounds_the_pods_and_a_smaller_one_stays() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("10-ebpf-cni.conflist");
        let subnets: Vec<IpNetwork> = vec!["10.244.3.0/24".parse().unwrap()];
        let mtu = |path: &Path| {
            let v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
            v["plugins"][0]["mtu"].clone()
        };
        assert!(write_subnets(&path, &subnets, &subnets, Some(1450)).unwrap());
        assert_eq!(mtu(&path), json!(1450), "a new conflist");
        let list = json!({"cniVersion": "1.0.0", "name": "k8s", "plugins": [
            {"type": "ebpf-cni", "mtu": 9000}]});
        std::fs::write(&path, serde_json::to_vec(&list).unwrap()).unwrap();
        assert!(write_subnets(&path, &subnets, &subnets, Some(8950)).unwrap());
        assert_eq!(mtu(&path), json!(8950), "lowered to the tunnel's");
        assert!(!write_subnets(&path, &subnets, &subnets, Some(9000)).unwrap());
        assert_eq!(mtu(&path), json!(8950), "a smaller one kept");
    }

    #[test]
    fn a_missing_conflist_is_written_as_install_writes_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("10-ebpf-cni.conflist");
        let subnets: Vec<IpNetwork> = vec![
            "10.244.3.0/24".parse().unwrap(),
            "fd00:10:244:3::/64".parse().unwrap(),
        ];
        let networks: Vec<IpNetwork> = vec![
            "10.244.0.0/16".parse().unwrap(),
            "fd00:10:244::/56".parse().unwrap(),
        ];
        assert!(write_subnets(&path, &subnets, &networks, None).unwrap());
        assert_eq!(current_subnets(&path), subnets);
        let text = std::fs::read(&path).unwrap();
        assert!(crate::install::conflist::is_ours(&text));
        let written: Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(
            written["plugins"][0]["clusterNetworks"],
            json!(["10.244.0.0/16", "fd00:10:244::/56"])
        );
    }
}
