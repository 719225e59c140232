//! A stand-in for the Kubernetes API server: HTTPS on 127.0.0.1 with a CA and a server
//! certificate made for the test, answering `GET /api/v1/nodes/<name>` as told (a Node
//! object, or an error status as the API server words it, or nothing for a while). It
//! records each request's head, serves one connection at a time, and stops when dropped.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ServerConfig, ServerConnection, StreamOwned};
use serde_json::{json, Value};

/// What the server answers.
#[derive(Clone, Debug)]
pub enum Answer {
    /// 200 with this Node object, in chunks (as Go's HTTP server sends a body it did not
    /// measure).
    Node(Value),
    /// An error status with the API server's Status object.
    Status(u16, &'static str, &'static str),
    /// Nothing until this long after the request.
    Silence(Duration),
}

/// A Node object as the API server returns it, with `spec` given, and an annotation large
/// enough that the body spans several TLS records.
pub fn node(name: &str, spec: Value) -> Value {
    json!({
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "labels": { "kubernetes.io/hostname": name },
            "annotations": { "node.alpha.kubernetes.io/ttl": "0", "test/filler": "x".repeat(40_000) },
        },
        "spec": spec,
        "status": { "conditions": [{ "type": "Ready", "status": "True" }] },
    })
}

/// A CA and its key.
pub struct Ca {
    pub cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        Self {
            cert: params.self_signed(&key).unwrap(),
            key,
        }
    }

    pub fn pem(&self) -> String {
        self.cert.pem()
    }
}

pub struct KubeApi {
    addr: SocketAddr,
    ca: Ca,
    requests: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl KubeApi {
    /// Listens on 127.0.0.1 (a free port) with a certificate for 127.0.0.1 signed by a CA
    /// of its own.
    pub fn start(answer: Answer) -> Self {
        let ca = Ca::new("stand-in cluster CA");
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        let cert = params.signed_by(&key, &ca.cert, &ca.key).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(cert.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap();
        let config = Arc::new(config);
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (requests, stop) = (requests.clone(), stop.clone());
            std::thread::spawn(move || {
                // Bounded: the test drops the server within seconds; a forgotten one stops
                // by itself after a minute.
                let end = Instant::now() + Duration::from_secs(60);
                while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                    match listener.accept() {
                        Ok((s, _)) => serve(s, &config, &answer, &requests, &stop),
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        Self {
            addr,
            ca,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The PEM of the CA that signed the server's certificate.
    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// The head of every request received so far.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One connection: the TLS handshake, the request's head, the answer. Failures (a client
/// that refuses the certificate, or gave up) end the connection and nothing else.
fn serve(
    tcp: TcpStream,
    config: &Arc<ServerConfig>,
    answer: &Answer,
    requests: &Mutex<Vec<String>>,
    stop: &AtomicBool,
) {
    let _ = tcp.set_nonblocking(false);
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(5)));
    let Ok(conn) = ServerConnection::new(config.clone()) else {
        return;
    };
    let mut tls = StreamOwned::new(conn, tcp);
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match tls.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    requests
        .lock()
        .unwrap()
        .push(String::from_utf8_lossy(&head).into_owned());
    let response = match answer {
        Answer::Node(node) => {
            let body = node.to_string();
            let (a, b) = body.split_at(body.len() / 3);
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n\
                 {:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
                a.len(),
                b.len()
            )
        }
        Answer::Status(code, reason, message) => {
            let body = json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": message, "reason": reason, "code": code,
            })
            .to_string();
            format!(
                "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
        }
        Answer::Silence(d) => {
            let end = Instant::now() + *d;
            while Instant::now() < end && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
            return;
        }
    };
    let _ = tls.write_all(response.as_bytes());
    tls.conn.send_close_notify();
    let _ = tls.flush();
}
