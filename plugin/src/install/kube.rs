//! The node's pod subnets from its Kubernetes Node object: one `GET /api/v1/nodes/<name>`
//! through kube's client, the one the agent's Kubernetes source watches the Nodes with
//! ([`crate::kube_client`]): the pod's service-account token as the bearer,
//! the server verified against the service account's CA, everything within one deadline.
//! `spec.podCIDRs` (dual-stack clusters list one per family), else the older single
//! `spec.podCIDR`.
//!
//! What can go wrong is told in the terms an operator acts on: the ClusterRole for a 403,
//! the node name for a 404, the controller-manager's CIDR allocation for a node without
//! podCIDRs, the address and the limit for a timeout, the CA file for an untrusted server.

use std::{fmt, io, net::IpAddr, path::PathBuf, time::Duration};

use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::Node;
use serde_json::Value;

use super::settings::{parse_subnet, Kube, KUBE_CA_FILE, KUBE_TOKEN_FILE, NODE_NAME, POD_SUBNET};
use crate::kube_client::{self, ApiServer, ClientError, Token};

/// The node's pod subnets and the field they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSubnets {
    /// IPv4 first.
    pub subnets: Vec<IpNetwork>,
    /// `spec.podCIDRs` or `spec.podCIDR`.
    pub field: &'static str,
}

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("failed to read the service-account token {path} ({setting})", setting = KUBE_TOKEN_FILE)]
    ReadToken {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the service-account token {path} ({setting}) is empty", setting = KUBE_TOKEN_FILE)]
    EmptyToken { path: PathBuf },
    #[error("the Kubernetes client ({setting})", setting = KUBE_CA_FILE)]
    Client(#[from] ClientError),
    #[error("starting the Kubernetes client's runtime")]
    Runtime(#[source] io::Error),
    #[error("failed to connect to the API server at {addr}")]
    Connect {
        addr: String,
        #[source]
        source: io::Error,
    },
    #[error("GET {url} did not complete within {timeout:?} (--kube-timeout, EBPF_CNI_KUBE_TIMEOUT): is the API server reachable from the node's network?")]
    Timeout { url: String, timeout: Duration },
    #[error("the API server at {url} presented a certificate that the CA in {ca} ({setting}) does not accept", setting = KUBE_CA_FILE)]
    UntrustedServer {
        url: String,
        ca: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("GET {url} failed")]
    Request {
        url: String,
        #[source]
        source: kube::Error,
    },
    #[error("GET {url}: 401 Unauthorized: the API server rejects the token in {token} ({setting})", setting = KUBE_TOKEN_FILE)]
    Unauthorized {
        url: String,
        token: PathBuf,
        message: Reason,
    },
    #[error("GET {url}: 403 Forbidden{message}: the service account may not read node {node}; its ClusterRole needs the verb `get` on the resource `nodes` (see deploy/ebpf-cni.yaml)")]
    Forbidden {
        url: String,
        node: String,
        message: Reason,
    },
    #[error("GET {url}: 404 Not Found: there is no node named {node:?}; {setting} must be the node's name (the downward API's spec.nodeName)", setting = NODE_NAME)]
    NodeNotFound { url: String, node: String },
    #[error("GET {url}: {status} {reason}{message}")]
    Status {
        url: String,
        status: u16,
        reason: String,
        message: Reason,
    },
    #[error("GET {url}: the response is not a Node object")]
    Decode {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("node {node} has no spec.podCIDRs and no spec.podCIDR: let the controller-manager allocate them (--allocate-node-cidrs with --cluster-cidr) or give the subnets with {setting}", setting = POD_SUBNET)]
    NoPodCidrs { node: String },
    #[error("node {node}'s {field} {value:?} cannot be a pod subnet: {expected}")]
    BadPodCidr {
        node: String,
        field: &'static str,
        value: String,
        expected: String,
    },
}

/// The `message` of the API server's Status object, as " (<message>)", or nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reason(Option<String>);

impl Reason {
    fn of(message: &str) -> Self {
        Self(Some(message.to_owned()).filter(|m| !m.is_empty()))
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(m) => write!(f, " ({m})"),
            None => Ok(()),
        }
    }
}

/// `host:port`, an IPv6 address in brackets.
pub(crate) fn authority(host: &str, port: u16) -> String {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) => format!("[{host}]:{port}"),
        _ => format!("{host}:{port}"),
    }
}

/// Reads the node's pod subnets from its Node object (see the module head).
pub fn node_pod_subnets(k: &Kube) -> Result<NodeSubnets, KubeError> {
    let token = std::fs::read_to_string(&k.token_file).map_err(|source| KubeError::ReadToken {
        path: k.token_file.clone(),
        source,
    })?;
    let token = token.trim();
    if token.is_empty() {
        return Err(KubeError::EmptyToken {
            path: k.token_file.clone(),
        });
    }
    let authority = authority(&k.host, k.port);
    let url = format!("https://{authority}/api/v1/nodes/{}", k.node_name);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(KubeError::Runtime)?;
    let got = rt.block_on(async {
        let client = kube_client::client(&api_server(k), Token::Given(token.to_owned()))?;
        let api: kube::Api<Node> = kube::Api::all(client);
        Ok::<_, KubeError>(tokio::time::timeout(k.timeout, api.get(&k.node_name)).await)
    })?;
    let node = match got {
        Err(_) => {
            return Err(KubeError::Timeout {
                url,
                timeout: k.timeout,
            })
        }
        Ok(Err(e)) => return Err(classify(k, &authority, url, e)),
        Ok(Ok(node)) => node,
    };
    let body = serde_json::to_vec(&node).map_err(|source| KubeError::Decode {
        url: url.clone(),
        source,
    })?;
    pod_subnets(&k.node_name, &url, &body)
}

/// The API server of `k`'s settings.
pub(crate) fn api_server(k: &Kube) -> ApiServer<'_> {
    ApiServer {
        host: &k.host,
        port: k.port,
        ca_file: &k.ca_file,
        timeout: k.timeout,
    }
}

/// A failed GET in the operator's terms: the API server's refusals by status, an
/// untrusted certificate, a refused connection.
fn classify(k: &Kube, authority: &str, url: String, e: kube::Error) -> KubeError {
    if let kube::Error::Api(status) = &e {
        let message = Reason::of(&status.message);
        return match status.code {
            401 => KubeError::Unauthorized {
                url,
                token: k.token_file.clone(),
                message,
            },
            403 => KubeError::Forbidden {
                url,
                node: k.node_name.clone(),
                message,
            },
            404 => KubeError::NodeNotFound {
                url,
                node: k.node_name.clone(),
            },
            code => KubeError::Status {
                url,
                status: code,
                reason: http::StatusCode::from_u16(code)
                    .ok()
                    .and_then(|c| c.canonical_reason())
                    .unwrap_or(&status.reason)
                    .to_owned(),
                message,
            },
        };
    }
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(c) = cause {
        // hyper wraps the connector's I/O error in another, and an I/O error's `source`
        // skips the error it wraps: the innermost is looked for here.
        let mut io = c.downcast_ref::<io::Error>();
        while let Some(inner) = io.and_then(|i| i.get_ref()?.downcast_ref::<io::Error>()) {
            io = Some(inner);
        }
        let tls = io
            .and_then(|i| i.get_ref()?.downcast_ref::<rustls::Error>())
            .or_else(|| c.downcast_ref::<rustls::Error>());
        if let Some(tls @ rustls::Error::InvalidCertificate(_)) = tls {
            return KubeError::UntrustedServer {
                url,
                ca: k.ca_file.clone(),
                source: tls.clone(),
            };
        }
        if let Some(io) = io.filter(|i| {
            matches!(
                i.kind(),
                io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::HostUnreachable
                    | io::ErrorKind::NetworkUnreachable
            )
        }) {
            return KubeError::Connect {
                addr: authority.to_owned(),
                source: io::Error::new(io.kind(), io.to_string()),
            };
        }
        cause = c.source();
    }
    KubeError::Request { url, source: e }
}

/// What the Node object's `spec` gives as the node's pod subnets.
fn pod_subnets(node: &str, url: &str, body: &[u8]) -> Result<NodeSubnets, KubeError> {
    let v: Value = serde_json::from_slice(body).map_err(|source| KubeError::Decode {
        url: url.to_owned(),
        source,
    })?;
    let spec = &v["spec"];
    let (field, values): (&'static str, Vec<&Value>) = match spec.get("podCIDRs") {
        Some(Value::Array(items)) if !items.is_empty() => ("spec.podCIDRs", items.iter().collect()),
        _ => match spec.get("podCIDR") {
            Some(v @ Value::String(s)) if !s.is_empty() => ("spec.podCIDR", vec![v]),
            _ => {
                return Err(KubeError::NoPodCidrs {
                    node: node.to_owned(),
                })
            }
        },
    };
    let bad = |value: String, expected: String| KubeError::BadPodCidr {
        node: node.to_owned(),
        field,
        value,
        expected,
    };
    let mut subnets: Vec<IpNetwork> = Vec::new();
    for value in values {
        let text = value
            .as_str()
            .ok_or_else(|| bad(value.to_string(), "expected a string".into()))?;
        let net = parse_subnet(text).map_err(|expected| bad(text.to_owned(), expected))?;
        if subnets.iter().any(|s| s.is_ipv4() == net.is_ipv4()) {
            return Err(bad(
                text.to_owned(),
                "a second subnet of its family (one per family)".into(),
            ));
        }
        subnets.push(net);
    }
    subnets.sort_by_key(|s| s.is_ipv6());
    Ok(NodeSubnets { subnets, field })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subnets(body: &str) -> Result<NodeSubnets, KubeError> {
        pod_subnets("n1", "https://x/api/v1/nodes/n1", body.as_bytes())
    }

    #[test]
    fn pod_cidrs_then_the_single_pod_cidr() {
        let got = subnets(
            r#"{"kind":"Node","spec":{"podCIDR":"10.244.1.0/24","podCIDRs":["fd00:1::/64","10.244.1.0/24"]}}"#,
        )
        .unwrap();
        assert_eq!(got.field, "spec.podCIDRs");
        assert_eq!(
            got.subnets
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["10.244.1.0/24", "fd00:1::/64"]
        );
        let got = subnets(r#"{"spec":{"podCIDR":"10.244.2.0/24"}}"#).unwrap();
        assert_eq!(got.field, "spec.podCIDR");
        assert_eq!(got.subnets[0].to_string(), "10.244.2.0/24");
    }

    #[test]
    fn a_node_without_or_with_bad_cidrs_is_named() {
        for body in [
            r#"{"spec":{}}"#,
            r#"{"spec":{"podCIDRs":[],"podCIDR":""}}"#,
            "{}",
        ] {
            let err = subnets(body).unwrap_err().to_string();
            assert!(
                err.starts_with("node n1 has no spec.podCIDRs and no spec.podCIDR"),
                "{err}"
            );
        }
        let err = subnets(r#"{"spec":{"podCIDRs":["10.0.0.0/24","10.1.0.0/24"]}}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"10.1.0.0/24\" cannot be a pod subnet"),
            "{err}"
        );
        let err = subnets(r#"{"spec":{"podCIDRs":[7]}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("spec.podCIDRs \"7\""), "{err}");
        assert!(matches!(subnets("<html>"), Err(KubeError::Decode { .. })));
    }

    #[test]
    fn authority_brackets_ipv6() {
        assert_eq!(authority("10.96.0.1", 443), "10.96.0.1:443");
        assert_eq!(authority("fd00::1", 443), "[fd00::1]:443");
        assert_eq!(authority("api.example", 6443), "api.example:6443");
    }

    #[test]
    fn the_status_message_is_quoted_when_there_is_one() {
        assert_eq!(
            Reason::of("nodes \"n1\" is forbidden").to_string(),
            " (nodes \"n1\" is forbidden)"
        );
        assert_eq!(Reason::of("").to_string(), "");
    }
}
