//! `CNI_ARGS`: `K=V` pairs separated by `;` (spec section 2, CONVENTIONS.md).
//!
//! Unknown keys are an error unless `IgnoreUnknown=1` (or `true`) is among the pairs, as
//! in the reference plugins; runtimes (containerd, podman) always send it.

use std::net::IpAddr;

use super::code;

/// A `CNI_ARGS` that cannot be used; each names the pair and value at fault.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    #[error("CNI_ARGS: invalid pair {0:?}: expected KEY=VALUE")]
    NotAPair(String),
    #[error("CNI_ARGS: invalid pair {0:?}: empty key")]
    EmptyKey(String),
    #[error("CNI_ARGS: IP={value:?}: {ip:?} is not an IP address")]
    NotAnIp { value: String, ip: String },
    #[error("CNI_ARGS: unknown key {key:?} (value {value:?}); add IgnoreUnknown=1 to ignore unknown keys")]
    UnknownKey { key: String, value: String },
}

impl ArgsError {
    pub fn cni_code(&self) -> u32 {
        code::INVALID_ENV
    }
}

/// Extra prefixes a pod may send from, separated by `,` (`source_check` reads them).
pub const ALLOWED_SOURCES_ARG: &str = "ECNI_ALLOWED_SOURCES";

/// Keys we act on, or know to be harmless metadata from Kubernetes runtimes.
const KNOWN_KEYS: &[&str] = &[
    "IgnoreUnknown",
    "IP",
    "MAC",
    ALLOWED_SOURCES_ARG,
    "K8S_POD_NAMESPACE",
    "K8S_POD_NAME",
    "K8S_POD_INFRA_CONTAINER_ID",
    "K8S_POD_UID",
];

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pub pairs: Vec<(String, String)>,
    /// `IP=` (comma-separated list allowed, as newer host-local accepts).
    pub ips: Vec<IpAddr>,
    /// `MAC=`
    pub mac: Option<String>,
}

impl CniArgs {
    pub fn parse(raw: &str) -> Result<Self, ArgsError> {
        let mut out = CniArgs::default();
        for item in raw.split(';').filter(|s| !s.is_empty()) {
            let Some((k, v)) = item.split_once('=') else {
                return Err(ArgsError::NotAPair(item.to_owned()));
            };
            if k.is_empty() {
                return Err(ArgsError::EmptyKey(item.to_owned()));
            }
            out.pairs.push((k.to_owned(), v.to_owned()));
        }
        let ignore_unknown = out
            .get("IgnoreUnknown")
            .is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
        for (k, v) in &out.pairs {
            match k.as_str() {
                "IP" => {
                    for ip in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                        // Accept "10.0.0.5" and "10.0.0.5/24" alike.
                        let addr = ip.split('/').next().unwrap_or(ip);
                        let parsed: IpAddr = addr.parse().map_err(|_| ArgsError::NotAnIp {
                            value: v.clone(),
                            ip: ip.to_owned(),
                        })?;
                        out.ips.push(parsed);
                    }
                }
                "MAC" if !v.is_empty() => out.mac = Some(v.clone()),
                _ if KNOWN_KEYS.contains(&k.as_str()) => {}
                _ if ignore_unknown => {}
                _ => {
                    return Err(ArgsError::UnknownKey {
                        key: k.clone(),
                        value: v.clone(),
                    })
                }
            }
        }
        Ok(out)
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerd_style_args() {
        let a = CniArgs::parse(
            "K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u;IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p",
        )
        .unwrap();
        assert_eq!(a.get("K8S_POD_NAME"), Some("p"));
        assert!(a.ips.is_empty());
    }

    #[test]
    fn ip_and_mac() {
        let a =
            CniArgs::parse("IgnoreUnknown=1;IP=10.1.0.5,fd00::5/64;MAC=02:00:00:00:00:01").unwrap();
        assert_eq!(
            a.ips,
            vec![
                "10.1.0.5".parse::<IpAddr>().unwrap(),
                "fd00::5".parse().unwrap()
            ]
        );
        assert_eq!(a.mac.as_deref(), Some("02:00:00:00:00:01"));
    }

    #[test]
    fn unknown_key_needs_ignore_unknown() {
        let e = CniArgs::parse("FOO=bar").unwrap_err();
        assert_eq!(e.cni_code(), code::INVALID_ENV);
        assert!(e.to_string().contains("FOO"), "{e}");
        assert!(CniArgs::parse("FOO=bar;IgnoreUnknown=1").is_ok());
        assert!(CniArgs::parse("IgnoreUnknown=true;FOO=bar").is_ok());
    }

    #[test]
    fn malformed() {
        for raw in ["foo", "=x", "IP=notanip"] {
            let e = CniArgs::parse(raw).unwrap_err();
            assert_eq!(e.cni_code(), code::INVALID_ENV, "{raw}");
            assert!(e.to_string().starts_with("CNI_ARGS"), "{e}");
        }
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::default());
    }
}
