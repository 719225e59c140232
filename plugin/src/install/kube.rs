//! The node's pod subnets from its Kubernetes Node object: one `GET /api/v1/nodes/<name>`
//! to the API server with the pod's service-account token, the server verified against the
//! service account's CA, everything (connection, handshake, request, response) within one
//! deadline. `spec.podCIDRs` (dual-stack clusters list one per family), else the older
//! single `spec.podCIDR`.
//!
//! Not a Kubernetes client: rustls over a std `TcpStream` and [`super::http`]'s one GET.
//! What can go wrong is told in the terms an operator acts on: the ClusterRole for a 403,
//! the node name for a 404, the controller-manager's CIDR allocation for a node without
//! podCIDRs, the address and the limit for a timeout, the CA file for an untrusted server.

use std::{
    fmt,
    io::{self, Read, Write},
    net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use ipnetwork::IpNetwork;
use rustls::{
    pki_types::{pem::PemObject, CertificateDer, ServerName},
    ClientConfig, ClientConnection, RootCertStore, StreamOwned,
};
use serde_json::Value;

use super::{
    http::{self, HttpError},
    settings::{parse_subnet, Kube, KUBE_CA_FILE, KUBE_TOKEN_FILE, NODE_NAME, POD_SUBNET},
};

/// A Node object is a few KiB; a response this large is not one.
const RESPONSE_LIMIT: usize = 4 << 20;

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
    #[error("failed to read the API server's CA {path} ({setting})", setting = KUBE_CA_FILE)]
    ReadCa {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the API server's CA {path} ({setting}) holds no usable PEM certificate", setting = KUBE_CA_FILE)]
    NoCaCertificate { path: PathBuf },
    #[error("failed to resolve the API server's address {authority}")]
    Resolve {
        authority: String,
        #[source]
        source: io::Error,
    },
    #[error("failed to connect to the API server at {addr}")]
    Connect {
        addr: SocketAddr,
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
    #[error("the TLS connection to {url} failed")]
    Tls {
        url: String,
        #[source]
        source: rustls::Error,
    },
    #[error("GET {url} failed")]
    Http {
        url: String,
        #[source]
        source: HttpError,
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

/// The `message` of the API server's Status object, as ": <message>", or nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reason(Option<String>);

impl Reason {
    fn of(body: &[u8]) -> Self {
        Self(
            serde_json::from_slice::<Value>(body)
                .ok()
                .and_then(|v| v.get("message")?.as_str().map(str::to_owned))
                .filter(|m| !m.is_empty()),
        )
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
fn authority(host: &str, port: u16) -> String {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) => format!("[{host}]:{port}"),
        _ => format!("{host}:{port}"),
    }
}

/// Reads the node's pod subnets from its Node object (see the module head).
pub fn node_pod_subnets(k: &Kube) -> Result<NodeSubnets, KubeError> {
    let deadline = Instant::now() + k.timeout;
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
    let roots = ca_roots(k)?;
    let authority = authority(&k.host, k.port);
    let path = format!("/api/v1/nodes/{}", k.node_name);
    let url = format!("https://{authority}{path}");
    let request = http::get_request(&authority, &path, token);
    let response = get(k, &authority, &url, roots, &request, deadline)?;
    match response.status {
        200 => pod_subnets(&k.node_name, &url, &response.body),
        401 => Err(KubeError::Unauthorized {
            url,
            token: k.token_file.clone(),
            message: Reason::of(&response.body),
        }),
        403 => Err(KubeError::Forbidden {
            url,
            node: k.node_name.clone(),
            message: Reason::of(&response.body),
        }),
        404 => Err(KubeError::NodeNotFound {
            url,
            node: k.node_name.clone(),
        }),
        status => Err(KubeError::Status {
            url,
            status,
            reason: response.reason,
            message: Reason::of(&response.body),
        }),
    }
}

fn ca_roots(k: &Kube) -> Result<RootCertStore, KubeError> {
    let pem = std::fs::read(&k.ca_file).map_err(|source| KubeError::ReadCa {
        path: k.ca_file.clone(),
        source,
    })?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem).flatten() {
        // A bundle may hold certificates webpki cannot use; the others still count.
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        return Err(KubeError::NoCaCertificate {
            path: k.ca_file.clone(),
        });
    }
    Ok(roots)
}

/// One GET over TLS, all of it before `deadline`.
fn get(
    k: &Kube,
    authority: &str,
    url: &str,
    roots: RootCertStore,
    request: &[u8],
    deadline: Instant,
) -> Result<http::Response, KubeError> {
    let timeout = || KubeError::Timeout {
        url: url.to_owned(),
        timeout: k.timeout,
    };
    let tcp = connect(k, authority, deadline).map_err(|e| match e {
        ConnectError::Timeout => timeout(),
        ConnectError::Other(e) => e,
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|source| KubeError::Tls {
            url: url.to_owned(),
            source,
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // A literal address is checked against the certificate's IP SANs (the API server's
    // certificate carries the `kubernetes` Service's ClusterIP), a name against its DNS
    // SANs. The host was validated as one or the other.
    let name = ServerName::try_from(k.host.clone()).map_err(|_| KubeError::Tls {
        url: url.to_owned(),
        source: rustls::Error::General(
            "the API server's host is not a valid TLS server name".into(),
        ),
    })?;
    let conn = ClientConnection::new(Arc::new(config), name).map_err(|source| KubeError::Tls {
        url: url.to_owned(),
        source,
    })?;
    let mut tls = StreamOwned::new(conn, Deadline { tcp, deadline });
    let classify = |e: io::Error| -> KubeError {
        if e.kind() == io::ErrorKind::TimedOut || Instant::now() >= deadline {
            return timeout();
        }
        match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            Some(rustls::Error::InvalidCertificate(_)) => KubeError::UntrustedServer {
                url: url.to_owned(),
                ca: k.ca_file.clone(),
                source: rustls_error(e),
            },
            Some(_) => KubeError::Tls {
                url: url.to_owned(),
                source: rustls_error(e),
            },
            None => KubeError::Http {
                url: url.to_owned(),
                source: HttpError::Io(e),
            },
        }
    };
    tls.write_all(request)
        .and_then(|()| tls.flush())
        .map_err(classify)?;
    http::read_response(&mut tls, RESPONSE_LIMIT).map_err(|e| match e {
        HttpError::Io(e) => classify(e),
        other => KubeError::Http {
            url: url.to_owned(),
            source: other,
        },
    })
}

/// The rustls error inside an I/O error (the caller checked that there is one).
fn rustls_error(e: io::Error) -> rustls::Error {
    match e.into_inner().map(|i| i.downcast::<rustls::Error>()) {
        Some(Ok(e)) => *e,
        _ => rustls::Error::General("unknown TLS error".into()),
    }
}

enum ConnectError {
    Timeout,
    Other(KubeError),
}

/// A TCP connection to the first address that answers, before `deadline`.
fn connect(k: &Kube, authority: &str, deadline: Instant) -> Result<TcpStream, ConnectError> {
    let addrs: Vec<SocketAddr> = match k.host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, k.port)],
        // A name is resolved by the system resolver, outside the deadline (std has no
        // timeout for it); KUBERNETES_SERVICE_HOST is an address in every cluster.
        Err(_) => (k.host.as_str(), k.port)
            .to_socket_addrs()
            .map_err(|source| {
                ConnectError::Other(KubeError::Resolve {
                    authority: authority.to_owned(),
                    source,
                })
            })?
            .collect(),
    };
    let mut last = None;
    for addr in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ConnectError::Timeout);
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => return Err(ConnectError::Timeout),
            Err(source) => last = Some(KubeError::Connect { addr, source }),
        }
    }
    Err(ConnectError::Other(last.unwrap_or_else(|| {
        KubeError::Resolve {
            authority: authority.to_owned(),
            source: io::Error::new(io::ErrorKind::NotFound, "no address"),
        }
    })))
}

/// A TCP stream whose every read and write ends by the deadline (`TimedOut` past it).
struct Deadline {
    tcp: TcpStream,
    deadline: Instant,
}

impl Deadline {
    fn left(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(io::Error::from(io::ErrorKind::TimedOut))
        } else {
            Ok(left)
        }
    }

    /// A socket timeout shows as `WouldBlock`; past the deadline it is `TimedOut`.
    fn timed_out(e: io::Error) -> io::Error {
        if e.kind() == io::ErrorKind::WouldBlock {
            io::Error::from(io::ErrorKind::TimedOut)
        } else {
            e
        }
    }
}

impl Read for Deadline {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.tcp.set_read_timeout(Some(left))?;
        self.tcp.read(buf).map_err(Self::timed_out)
    }
}

impl Write for Deadline {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.tcp.set_write_timeout(Some(left))?;
        self.tcp.write(buf).map_err(Self::timed_out)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.tcp.flush()
    }
}

/// The pod subnets of a Node object's JSON.
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
            Reason::of(br#"{"kind":"Status","message":"nodes \"n1\" is forbidden"}"#).to_string(),
            " (nodes \"n1\" is forbidden)"
        );
        assert_eq!(Reason::of(b"nope").to_string(), "");
    }
}
