//! The Kubernetes API client `ebpf-cni install` reads its Node with and the agent's
//! Kubernetes source watches the Nodes with: kube's client (hyper, rustls with ring), the
//! server verified against the service account's CA, the bearer token given or read from
//! its file (again as it rotates).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use http::header::{HeaderValue, AUTHORIZATION};

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
    #[error("failed to read the service-account token {path}")]
    ReadToken {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the service-account token {path} is empty")]
    EmptyToken { path: PathBuf },
    #[error("the service-account token {path} holds a character an HTTP header cannot carry")]
    InvalidToken { path: PathBuf },
    #[error("the Kubernetes client for https://{authority}")]
    Client {
        authority: String,
        source: kube::Error,
    },
}

/// The bearer token a client sends.
pub enum Token {
    /// Read from the file, and again as it rotates: see [`TokenFile`].
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
    config.connect_timeout = Some(kube.timeout);
    config.write_timeout = Some(kube.timeout);
    match token {
        Token::File(path) => {
            // Set by the layer below, on every request, rather than by kube's own reading
            // of `token_file`: that one sends the file as it is (a token written with a
            // newline is no header) and reads it again only once a minute.
            let file = TokenFile::open(path)?;
            let builder = kube::client::ClientBuilder::try_from(config).map_err(err)?;
            let layer = tower::util::MapRequestLayer::new(
                move |mut req: http::Request<kube::client::Body>| {
                    req.headers_mut().insert(AUTHORIZATION, file.header());
                    req
                },
            );
            Ok(builder.with_layer(&layer).build())
        }
        Token::Given(t) => {
            config.auth_info.token = Some(t.into());
            kube::Client::try_from(config).map_err(err)
        }
    }
}

/// How long a token read from its file is used without looking at the file again.
const TOKEN_REREAD: Duration = Duration::from_secs(60);

/// The service-account token from its file, as client-go reads it: trimmed of the
/// whitespace around it, and read again when the file changes (kubelet writes a rotated
/// token into a new file and swaps a symlink to it: its modification time changes) or a
/// minute has passed; a file that cannot be read then leaves the last token in use
/// (kubernetes#68164: some clients remove the file after their start).
#[derive(Clone)]
struct TokenFile(Arc<Mutex<TokenRead>>);

struct TokenRead {
    path: PathBuf,
    header: HeaderValue,
    modified: Option<SystemTime>,
    at: Instant,
}

impl TokenFile {
    /// Reads the token now: a file that cannot be read, or holds no usable token, is an
    /// error before any request.
    fn open(path: PathBuf) -> Result<Self, ClientError> {
        let modified = modified(&path);
        let header = read_token(&path)?;
        Ok(Self(Arc::new(Mutex::new(TokenRead {
            path,
            header,
            modified,
            at: Instant::now(),
        }))))
    }

    /// The `Authorization` header to send now.
    fn header(&self) -> HeaderValue {
        let mut t = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let modified = modified(&t.path);
        if modified != t.modified || t.at.elapsed() >= TOKEN_REREAD {
            match read_token(&t.path) {
                Ok(header) => t.header = header,
                Err(e) => log::warn!(
                    "{}; the last token read stays in use",
                    crate::cni::error::chain(&e)
                ),
            }
            t.modified = modified;
            t.at = Instant::now();
        }
        t.header.clone()
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// `Bearer <token>` from the file at `path`, the token trimmed; marked sensitive.
fn read_token(path: &Path) -> Result<HeaderValue, ClientError> {
    let text = std::fs::read_to_string(path).map_err(|source| ClientError::ReadToken {
        path: path.to_owned(),
        source,
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(ClientError::EmptyToken {
            path: path.to_owned(),
        });
    }
    let mut header = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
        ClientError::InvalidToken {
            path: path.to_owned(),
        }
    })?;
    header.set_sensitive(true);
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_trimmed_and_read_again_when_its_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "  abc\n").unwrap();
        let file = TokenFile::open(path.clone()).unwrap();
        assert_eq!(file.header(), "Bearer abc");
        assert!(file.header().is_sensitive());
        // As kubelet rotates it: a new file renamed into place.
        let new = dir.path().join("token.new");
        std::fs::write(&new, "def\n").unwrap();
        let later = SystemTime::now() + Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&new)
            .unwrap()
            .set_modified(later)
            .unwrap();
        std::fs::rename(&new, &path).unwrap();
        assert_eq!(file.header(), "Bearer def");
        // Gone: the last one stays.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(file.header(), "Bearer def");
    }

    #[test]
    fn an_empty_or_unusable_token_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, " \n").unwrap();
        let e = TokenFile::open(path.clone()).err().unwrap();
        assert!(matches!(e, ClientError::EmptyToken { .. }), "{e}");
        std::fs::write(&path, "a\u{7f}b").unwrap();
        let e = TokenFile::open(path.clone()).err().unwrap();
        assert!(e.to_string().contains(&*path.to_string_lossy()), "{e}");
        let e = TokenFile::open(dir.path().join("none")).err().unwrap();
        assert!(matches!(e, ClientError::ReadToken { .. }), "{e}");
    }
}
