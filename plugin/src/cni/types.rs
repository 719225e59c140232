//! Success results (spec section 5) in every version we speak, and parsing of `prevResult`
//! whatever version produced it.

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{code, version::ResultFormat};

/// A result (a `prevResult` or a delegate's output) that is not one of a version we speak.
#[derive(Debug, thiserror::Error)]
#[error("failed to decode {what}")]
pub struct ResultError {
    /// What was decoded ("prevResult").
    pub what: &'static str,
    #[source]
    pub source: serde_json::Error,
}

impl ResultError {
    pub fn cni_code(&self) -> u32 {
        code::DECODE_FAILURE
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sandbox: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// The address with its subnet's prefix, e.g. 10.1.0.5/24.
    pub address: IpNetwork,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub dst: IpNetwork,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    #[serde(flatten)]
    pub options: RouteOptions,
}

/// CNI 1.1's route fields: the route's MTU and TCP advertised MSS (route metrics), its
/// metric (`priority`), its routing table and its scope. Unset, the kernel's defaults (the
/// main table, universe scope).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advmss: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u8>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_none()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SuccessResult {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<IpConfig>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    #[serde(default, skip_serializing_if = "Dns::is_empty")]
    pub dns: Dns,
}

impl SuccessResult {
    /// Renders the result in the layout of `cni_version`.
    pub fn to_json(&self, cni_version: &str, format: ResultFormat) -> Value {
        let mut v = serde_json::to_value(self).expect("result types always serialize");
        let obj = v.as_object_mut().expect("a struct serializes to an object");
        if format == ResultFormat::V03 {
            if let Some(Value::Array(ips)) = obj.get_mut("ips") {
                for ip in ips.iter_mut() {
                    let is_v4 = ip
                        .get("address")
                        .and_then(Value::as_str)
                        .is_some_and(|a| a.parse::<IpNetwork>().is_ok_and(|n| n.is_ipv4()));
                    ip["version"] = Value::from(if is_v4 { "4" } else { "6" });
                }
            }
        }
        obj.insert("cniVersion".into(), Value::from(cni_version));
        // Keep "cniVersion" first for people reading it.
        let mut ordered = serde_json::Map::new();
        ordered.insert(
            "cniVersion".into(),
            obj.remove("cniVersion").unwrap_or_default(),
        );
        ordered.extend(std::mem::take(obj));
        Value::Object(ordered)
    }

    /// Parses a result of any supported version (a `prevResult` or a delegate's output).
    /// `ips[].version` of 0.3.x/0.4.0 is ignored: the address says its family.
    pub fn from_json(v: &Value, what: &'static str) -> Result<Self, ResultError> {
        serde_json::from_value(v.clone()).map_err(|source| ResultError { what, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> SuccessResult {
        SuccessResult {
            interfaces: vec![
                Interface {
                    name: "ecni0123456789a".into(),
                    mac: "02:00:00:00:00:01".into(),
                    sandbox: String::new(),
                },
                Interface {
                    name: "eth0".into(),
                    mac: "02:00:00:00:00:02".into(),
                    sandbox: "/run/netns/p".into(),
                },
            ],
            ips: vec![
                IpConfig {
                    address: "10.1.0.2/24".parse().unwrap(),
                    gateway: Some("10.1.0.1".parse().unwrap()),
                    interface: Some(1),
                },
                IpConfig {
                    address: "fd00::2/64".parse().unwrap(),
                    gateway: Some("fd00::1".parse().unwrap()),
                    interface: Some(1),
                },
            ],
            routes: vec![Route {
                dst: "0.0.0.0/0".parse().unwrap(),
                gw: None,
                options: Default::default(),
            }],
            dns: Dns {
                nameservers: vec!["10.1.0.1".into()],
                ..Default::default()
            },
        }
    }

    #[test]
    fn v1_has_no_ip_version() {
        let v = sample().to_json("1.0.0", ResultFormat::V1);
        assert_eq!(v["cniVersion"], "1.0.0");
        assert!(v["ips"][0].get("version").is_none());
        assert_eq!(v["ips"][0]["address"], "10.1.0.2/24");
        assert_eq!(v["ips"][0]["interface"], 1);
        assert_eq!(v["interfaces"][1]["sandbox"], "/run/netns/p");
        assert!(v["interfaces"][0].get("sandbox").is_none());
        assert_eq!(v["dns"]["nameservers"][0], "10.1.0.1");
    }

    #[test]
    fn v03_has_ip_version() {
        let v = sample().to_json("0.3.1", ResultFormat::V03);
        assert_eq!(v["ips"][0]["version"], "4");
        assert_eq!(v["ips"][1]["version"], "6");
    }

    #[test]
    fn round_trip_from_any_version() {
        for (ver, fmt) in [
            ("0.3.0", ResultFormat::V03),
            ("0.4.0", ResultFormat::V03),
            ("1.0.0", ResultFormat::V1),
            ("1.1.0", ResultFormat::V1),
        ] {
            let v = sample().to_json(ver, fmt);
            assert_eq!(
                SuccessResult::from_json(&v, "prevResult").unwrap(),
                sample()
            );
        }
        let e = SuccessResult::from_json(&json!({"ips":[{"address":"bogus"}]}), "prevResult")
            .unwrap_err();
        assert_eq!(e.cni_code(), code::DECODE_FAILURE);
        assert!(e.to_string().contains("prevResult"));
    }
}
