//! The Kubernetes API client `ebpf-cni install` reads its Node with and the agent's
//! Kubernetes source watches the Nodes with: kube's client (hyper, rustls with ring), the
//! server verified against the service account's CA, the bearer token given or read from
//! its file (again as it rotates).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;

/// Where the API server is and how it is trusted.
pub struct ApiServer<'a> {
    /// An address or a DNS name (an IPv6 address without brackets).
    pub host: &'a str,
    pub port: u16,
    /// The CA bundle its certificate must chain to.
    pub ca_file: &'a Path,
    /// The longest a connection may take to open.
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("failed to read the API server's CA {path}")]
    ReadCa {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the API server's CA {path} holds no usable PEM certificate")]
    NoCaCertificate { path: PathBuf },
    #[error("the API server's URL {url}")]
    Url {
        url: String,
        source: http::uri::InvalidUri,
    },
    #[error("the Kubernetes client for https://{authority}")]
    Client {
        authority: String,
        source: kube::Error,
    },
}

/// The bearer token a client sends.
pub enum Token {
    /// Read from the file, and again as it rotates (at most a minute late).
    File(PathBuf),
    /// As given, for one request (`ebpf-cni install`).
    Given(String),
}

/// A client of the API server in `kube`'s settings: its CA (read now, and again as it
/// rotates) and `token`. Made in a tokio runtime: it starts its tasks there.
pub fn client(kube: &ApiServer<'_>, token: Token) -> Result<kube::Client, ClientError> {
    let pem = std::fs::read(kube.ca_file).map_err(|source| ClientError::ReadCa {
        path: kube.ca_file.to_owned(),
        source,
    })?;
    let certs: Vec<Vec<u8>> = rustls::pki_types::CertificateDer::pem_slice_iter(&pem)
        .filter_map(Result::ok)
        .map(|c| c.to_vec())
        .collect();
    if certs.is_empty() {
        return Err(ClientError::NoCaCertificate {
            path: kube.ca_file.to_owned(),
        });
    }
    let authority = if kube.host.contains(':') {
        format!("[{}]:{}", kube.host, kube.port)
    } else {
        format!("{}:{}", kube.host, kube.port)
    };
    let err = |source| ClientError::Client {
        authority: authority.clone(),
        source,
    };
    let url = format!("https://{authority}");
    let url: http::Uri = url
        .parse()
        .map_err(|source| ClientError::Url { url, source })?;
    let mut config = kube::Config::new(url);
    config.root_cert = Some(certs);
    config.root_cert_file = Some(kube.ca_file.to_owned());
    match token {
        Token::File(path) => {
            config.auth_info.token_file = Some(path.to_string_lossy().into_owned());
        }
        Token::Given(t) => config.auth_info.token = Some(t.into()),
    }
    config.connect_timeout = Some(kube.timeout);
    config.write_timeout = Some(kube.timeout);
    kube::Client::try_from(config).map_err(err)
}
