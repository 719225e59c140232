//! The source check: a pod sends only from its own addresses and its own MAC. Frames from
//! the pod with another source address (IPv4, IPv6, ARP's sender) or another source MAC
//! are dropped by the program at its host veth's ingress and counted per pod, each reason
//! on its own counter (`ebpf/src/source_check.rs`; the map in `bpf/maps/source_check.rs`).
//!
//! On by default. Input:
//! - `sourceCheck` (network config): `false` turns the check off for the network's pods,
//!   address and MAC alike;
//! - `allowedSourcePrefixes` (network config), `runtimeConfig.allowedSourcePrefixes` (the
//!   capability of the same name, per pod) and `CNI_ARGS ECNI_ALLOWED_SOURCES` (per pod,
//!   prefixes separated by `,`): more prefixes the pod may send from besides its own
//!   addresses (a router or VPN pod); the three lists add up.
//!
//! A prefix is a CIDR (host bits are cleared) or a plain address (/32, /128). A value that
//! is none is refused with error 7, naming the key and the value. The result carries what
//! is in force as `sourceCheck`, an extra top-level key (spec 1.0 lists the keys a result
//! must have and forbids none; runtimes that re-encode results drop it, which loses
//! nothing: CHECK and DEL do not need it).

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde_json::{json, Value};

use crate::{
    bpf::SourceCheck,
    cni::{args::ALLOWED_SOURCES_ARG, code, config::NetConf, env::CniEnv},
    netlink::format_mac,
};

/// The config key that turns the check off.
pub const SOURCE_CHECK_KEY: &str = "sourceCheck";
/// The config key, and the `runtimeConfig` capability, listing extra prefixes.
pub const ALLOWED_PREFIXES_KEY: &str = "allowedSourcePrefixes";
/// The result's key.
pub const RESULT_KEY: &str = "sourceCheck";

/// A source check that cannot be used; each names the key and the value at fault.
#[derive(Debug, thiserror::Error)]
pub enum SourceCheckError {
    #[error("{field} {value} must be {expected}")]
    WrongType {
        field: String,
        value: Value,
        expected: &'static str,
    },
    #[error("{field} entry {value} is not a CIDR or an IP address")]
    NotAPrefix { field: String, value: Value },
    /// CHECK: the `prevResult` says another check is in force than the config gives now.
    #[error(
        "prevResult's sourceCheck is {actual}, the config and the pod's addresses give {expected}"
    )]
    ResultStale { actual: Value, expected: Value },
}

impl SourceCheckError {
    pub fn cni_code(&self) -> u32 {
        match self {
            Self::ResultStale { .. } => code::CHECK_FAILED,
            _ => code::INVALID_CONFIG,
        }
    }
}

/// What the config asks of the check, before the pod's addresses and MAC are known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceConf {
    /// `sourceCheck` (default true).
    pub on: bool,
    /// The extra prefixes of the network and of this pod, host bits clear.
    pub extra: Vec<IpNetwork>,
}

impl Default for SourceConf {
    fn default() -> Self {
        Self {
            on: true,
            extra: Vec::new(),
        }
    }
}

/// One prefix: a CIDR, or a plain address as its full-length prefix.
fn prefix(s: &str) -> Option<IpNetwork> {
    let n: IpNetwork = s.trim().parse().ok()?;
    IpNetwork::new(n.network(), n.prefix()).ok()
}

fn prefix_list(v: &Value, field: &str) -> Result<Vec<IpNetwork>, SourceCheckError> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Array(items) => items
            .iter()
            .map(|item| {
                item.as_str()
                    .and_then(prefix)
                    .ok_or_else(|| SourceCheckError::NotAPrefix {
                        field: field.to_owned(),
                        value: item.clone(),
                    })
            })
            .collect(),
        other => Err(SourceCheckError::WrongType {
            field: field.to_owned(),
            value: other.clone(),
            expected: "a list of CIDRs (\"10.99.0.0/16\")",
        }),
    }
}

impl SourceConf {
    /// The network config, `runtimeConfig` and `CNI_ARGS` of one request, validated.
    pub fn parse(conf: &NetConf, env: &CniEnv) -> Result<Self, SourceCheckError> {
        let obj = conf.raw.as_object().expect("configs are objects");
        let on = match obj.get(SOURCE_CHECK_KEY) {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(SourceCheckError::WrongType {
                    field: SOURCE_CHECK_KEY.to_owned(),
                    value: other.clone(),
                    expected: "true or false",
                })
            }
        };
        let mut extra = match obj.get(ALLOWED_PREFIXES_KEY) {
            Some(v) => prefix_list(v, ALLOWED_PREFIXES_KEY)?,
            None => Vec::new(),
        };
        if let Some(v) = conf.runtime.capability(ALLOWED_PREFIXES_KEY) {
            extra.extend(prefix_list(
                v,
                &format!("runtimeConfig.{ALLOWED_PREFIXES_KEY}"),
            )?);
        }
        if let Some(v) = env.args.get(ALLOWED_SOURCES_ARG) {
            for item in v.split(',').filter(|s| !s.trim().is_empty()) {
                extra.push(prefix(item).ok_or_else(|| SourceCheckError::NotAPrefix {
                    field: format!("CNI_ARGS {ALLOWED_SOURCES_ARG}"),
                    value: Value::from(item),
                })?);
            }
        }
        extra.sort();
        extra.dedup();
        Ok(Self { on, extra })
    }

    /// What a pod with addresses `addrs` may send from: `None` when the check is off, else
    /// its own addresses and the extra prefixes, sorted, without duplicates.
    pub fn allowed(&self, addrs: &[IpAddr]) -> Option<Vec<IpNetwork>> {
        if !self.on {
            return None;
        }
        let mut allowed: Vec<IpNetwork> = addrs
            .iter()
            .map(|ip| IpNetwork::from(*ip))
            .chain(self.extra.iter().copied())
            .collect();
        allowed.sort();
        allowed.dedup();
        Some(allowed)
    }
}

/// The result's `sourceCheck` value: `{"enabled": false}`, or what the pod may send from.
pub fn result_value(check: &SourceCheck) -> Value {
    match check {
        SourceCheck::Off => json!({ "enabled": false }),
        SourceCheck::On { mac, allowed, .. } => json!({
            "enabled": true,
            "mac": format_mac(mac),
            "allowedPrefixes": allowed.iter().map(ToString::to_string).collect::<Vec<_>>(),
        }),
    }
}

/// Adds `check` to a rendered result.
pub fn add_to_result(result: &mut Value, check: &SourceCheck) {
    if let Some(obj) = result.as_object_mut() {
        obj.insert(RESULT_KEY.into(), result_value(check));
    }
}

/// CHECK: a `prevResult` that carries `sourceCheck` (one a runtime passed back as the
/// plugin wrote it) says what is wanted now. Without it there is nothing to compare.
pub fn check_result(prev: &Value, wanted: &SourceCheck) -> Result<(), SourceCheckError> {
    let Some(actual) = prev.get(RESULT_KEY) else {
        return Ok(());
    };
    let expected = result_value(wanted);
    if *actual != expected {
        return Err(SourceCheckError::ResultStale {
            actual: actual.clone(),
            expected,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::args::CniArgs;

    fn env(args: &str) -> CniEnv {
        CniEnv {
            container_id: "c".into(),
            netns: None,
            ifname: "eth0".into(),
            args: CniArgs::parse(args).unwrap(),
            path: Vec::new(),
        }
    }

    /// The check of a pod with addresses `addrs` and interface MAC `mac`, as ADD makes it.
    fn check_of(c: &SourceConf, addrs: &[IpAddr], mac: [u8; 6]) -> SourceCheck {
        crate::bpf::PodSpec {
            sources: c.allowed(addrs),
            ..crate::bpf::PodSpec::bare()
        }
        .source_check(&crate::bpf::Veth {
            host_name: "h".into(),
            host_ifindex: 1,
            host_mac: [0; 6],
            pod_mac: mac,
        })
    }

    fn parse(conf: Value, args: &str) -> Result<SourceConf, SourceCheckError> {
        let mut base = json!({"cniVersion": "1.0.0", "name": "n"});
        for (k, v) in conf.as_object().unwrap() {
            base[k] = v.clone();
        }
        SourceConf::parse(&NetConf::parse(base).unwrap(), &env(args))
    }

    #[test]
    fn on_by_default_with_the_pods_own_addresses() {
        let c = parse(json!({}), "").unwrap();
        assert_eq!(c, SourceConf::default());
        let check = check_of(
            &c,
            &["10.88.0.5".parse().unwrap(), "fd00::5".parse().unwrap()],
            [2, 0, 0, 0, 0, 5],
        );
        assert_eq!(
            check,
            SourceCheck::On {
                mac: [2, 0, 0, 0, 0, 5],
                allowed: vec![
                    "10.88.0.5/32".parse().unwrap(),
                    "fd00::5/128".parse().unwrap()
                ],
                masq_addrs: Vec::new(),
            }
        );
        assert_eq!(
            result_value(&check),
            json!({"enabled": true, "mac": "02:00:00:00:00:05", "allowedPrefixes": ["10.88.0.5/32", "fd00::5/128"]})
        );
    }

    #[test]
    fn the_three_lists_add_up() {
        let c = parse(
            json!({
                "allowedSourcePrefixes": ["10.99.0.7/16", "fd99::/64"],
                "runtimeConfig": {"AllowedSourcePrefixes": ["192.0.2.1"]}
            }),
            "IgnoreUnknown=1;ECNI_ALLOWED_SOURCES=198.51.100.0/24,10.99.0.0/16",
        )
        .unwrap();
        let want: Vec<IpNetwork> = [
            "10.99.0.0/16",
            "192.0.2.1/32",
            "198.51.100.0/24",
            "fd99::/64",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        assert_eq!(c.extra, want, "host bits clear, duplicates once, sorted");
        assert!(c.on);
    }

    #[test]
    fn off_checks_nothing() {
        let c = parse(
            json!({"sourceCheck": false, "allowedSourcePrefixes": ["10.99.0.0/16"]}),
            "",
        )
        .unwrap();
        let check = check_of(&c, &["10.88.0.5".parse().unwrap()], [2, 0, 0, 0, 0, 5]);
        assert_eq!(check, SourceCheck::Off);
        assert_eq!(result_value(&check), json!({"enabled": false}));
    }

    #[test]
    fn bad_values_name_the_key_and_value() {
        let cases = [
            (
                json!({"sourceCheck": "no"}),
                "",
                "sourceCheck \"no\" must be true or false",
            ),
            (
                json!({"allowedSourcePrefixes": "10.0.0.0/8"}),
                "",
                "allowedSourcePrefixes \"10.0.0.0/8\" must be a list",
            ),
            (
                json!({"allowedSourcePrefixes": ["10.0.0.0/8", "10.300.0.0/16"]}),
                "",
                "allowedSourcePrefixes entry \"10.300.0.0/16\"",
            ),
            (
                json!({"runtimeConfig": {"allowedSourcePrefixes": [7]}}),
                "",
                "runtimeConfig.allowedSourcePrefixes entry 7",
            ),
            (
                json!({}),
                "ECNI_ALLOWED_SOURCES=10.0.0.0/8,bogus",
                "CNI_ARGS ECNI_ALLOWED_SOURCES entry \"bogus\"",
            ),
        ];
        for (conf, args, needle) in cases {
            let e = parse(conf.clone(), args).unwrap_err();
            assert_eq!(e.cni_code(), code::INVALID_CONFIG, "{conf}");
            assert!(e.to_string().contains(needle), "{conf}: {e}");
        }
    }

    #[test]
    fn check_compares_a_result_that_carries_the_check() {
        let check = check_of(
            &SourceConf::default(),
            &["10.88.0.5".parse().unwrap()],
            [2; 6],
        );
        let mut result = json!({"cniVersion": "1.0.0"});
        assert!(check_result(&result, &check).is_ok(), "nothing to compare");
        add_to_result(&mut result, &check);
        assert!(check_result(&result, &check).is_ok());
        let e = check_result(&result, &SourceCheck::Off).unwrap_err();
        assert_eq!(e.cni_code(), code::CHECK_FAILED);
        assert!(e.to_string().contains("\"enabled\":false"), "{e}");
    }
}
