//! A stand-in for the Kubernetes API server, for the node agent's tests: HTTPS with a
//! server certificate signed by a CA of its own, HTTP/1.1 only (no ALPN, so clients speak
//! HTTP/1.1), keep-alive, every connection served by a thread of its own. It keeps Node
//! objects and answers what a kube-rs client (kube-runtime's watcher included) asks about
//! them:
//!
//! - `GET /api/v1/nodes`: the list, at the store's current resourceVersion (every node in
//!   one page: `limit` and `continue` are ignored);
//! - `GET /api/v1/nodes?watch=true&resourceVersion=<rv>`: a chunked stream of events, one
//!   JSON line per chunk: the changes after `<rv>` from the history, then new ones as they
//!   happen, and a BOOKMARK every [`KubeApi::set_bookmark_every`] when
//!   `allowWatchBookmarks` is set. It ends cleanly (terminating chunk) after
//!   `timeoutSeconds` or when the server stops, and abruptly (the connection closed mid-body)
//!   on [`KubeApi::drop_watches`] and [`KubeApi::expire_history`]. A watch from a
//!   resourceVersion older than the history's horizon gets the API server's 410 `Expired`
//!   ERROR event, as after an etcd compaction;
//! - `GET /api/v1/nodes/<name>` (and `.../status`): the Node, or 404;
//! - `PATCH /api/v1/nodes/<name>/status`: a strategic merge patch (conditions merged by
//!   `type`) or a JSON merge patch of the node's `status`, or 403 when told to refuse.
//!
//! Every request needs `Authorization: Bearer <token>` with an accepted token (else 401) and
//! is recorded ([`KubeApi::requests`]). Errors are Status objects as the API server words
//! them. Resource versions are one counter for the whole store, 100 at start, bumped by
//! every change. The server stops when dropped, and by itself [`LIFETIME`] after it started.

use std::collections::{BTreeMap, HashSet};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ServerConfig, ServerConnection, StreamOwned};
use serde_json::{json, Map, Value};

use crate::netns::Netns;

/// How long a server runs at most: after this it stops by itself (its listener, connections
/// and watches end), so a forgotten one holds no thread for longer.
pub const LIFETIME: Duration = Duration::from_secs(300);
/// The store's resourceVersion before any change.
pub const FIRST_RESOURCE_VERSION: u64 = 100;
/// How often an open watch sends a BOOKMARK unless told otherwise.
pub const DEFAULT_BOOKMARK_EVERY: Duration = Duration::from_secs(1);
/// The name of the CA file [`KubeApi::write_credentials`] writes.
pub const CA_FILE: &str = "ca.crt";
/// The name of the token file [`KubeApi::write_credentials`] writes.
pub const TOKEN_FILE: &str = "token";

/// Bookmarks come no more often than this, whatever [`KubeApi::set_bookmark_every`] said.
const MIN_BOOKMARK_EVERY: Duration = Duration::from_millis(10);
/// How often blocked reads and waiting watches look whether the server is stopping.
const POLL: Duration = Duration::from_millis(100);
/// How long a write may block on a client that does not read before the connection ends.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Requests with a larger head or body are garbage: the connection ends.
const MAX_HEAD: usize = 64 * 1024;
const MAX_BODY: usize = 16 * 1024 * 1024;

/// Node uids, unique across the servers of one process.
static UIDS: AtomicU64 = AtomicU64::new(0);

/// One request the server received, and the status it answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `PATCH`, ...
    pub method: String,
    /// The path with its query, as sent.
    pub target: String,
    /// The bearer token, or "" when the request had none.
    pub token: String,
    /// The `Content-Type` header, or "".
    pub content_type: String,
    /// The body (lossily UTF-8).
    pub body: String,
    /// The response's status code (200 for a watch, also one answered with the 410 event).
    pub status: u16,
}

/// The stand-in API server. Dropping it stops it: the listener, every connection and
/// every watch end within a fraction of a second.
pub struct KubeApi {
    addr: SocketAddr,
    ca: Ca,
    /// The token given to [`KubeApi::start`].
    token: String,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// What the test's thread and the connections' threads share.
struct Shared {
    store: Mutex<Store>,
    /// Notified on every change of the store, dropped watches and stop.
    changed: Condvar,
    stop: AtomicBool,
    deadline: Instant,
}

struct Store {
    /// The current resourceVersion: that of the last change.
    rv: u64,
    nodes: BTreeMap<String, Value>,
    /// Every change, oldest first.
    history: Vec<Change>,
    /// A watch from an older resourceVersion is answered 410 Expired.
    horizon: u64,
    /// Bumped to end the open watches abruptly.
    watch_generation: u64,
    tokens: HashSet<String>,
    refuse_status_patch: bool,
    bookmark_every: Duration,
    requests: Vec<Request>,
    open_watches: usize,
}

struct Change {
    rv: u64,
    kind: &'static str,
    object: Value,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || Instant::now() >= self.deadline
    }

    /// Records a change made to the store (under its lock) and wakes the watches.
    fn record_change(&self, store: &mut Store, kind: &'static str, object: Value) {
        store.history.push(Change {
            rv: store.rv,
            kind,
            object,
        });
        self.changed.notify_all();
    }
}

/// A CA and its key.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Result<Self> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        Ok(Self {
            cert: params.self_signed(&key)?,
            key,
        })
    }

    /// A TLS server configuration with a certificate for `ip` signed by this CA (for the
    /// loopback addresses and `localhost` when `ip` is unspecified). No ALPN: clients speak
    /// HTTP/1.1.
    fn server_config(&self, ip: IpAddr) -> Result<ServerConfig> {
        let names = if ip.is_unspecified() {
            vec![
                Ipv4Addr::LOCALHOST.to_string(),
                Ipv6Addr::LOCALHOST.to_string(),
                "localhost".to_owned(),
            ]
        } else {
            vec![ip.to_string()]
        };
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        let cert = params.signed_by(&key, &self.cert, &self.key)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(cert.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )?;
        Ok(config)
    }
}

impl KubeApi {
    /// Listens on `addr` (e.g. 127.0.0.1:0 or a LAN address:0), its socket made in the
    /// network namespace `netns` when given, with a server certificate for that IP signed by
    /// a CA of its own. Accepts `token`.
    pub fn start(netns: Option<&Netns>, addr: SocketAddr, token: &str) -> Result<Self> {
        let ca = Ca::new("stand-in cluster CA").context("making the CA")?;
        let listener = match netns {
            Some(ns) => ns.run_in(|| TcpListener::bind(addr))?,
            None => TcpListener::bind(addr),
        }
        .with_context(|| format!("listening on {addr}"))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let config = Arc::new(
            ca.server_config(addr.ip())
                .context("making the server certificate")?,
        );
        let shared = Arc::new(Shared {
            store: Mutex::new(Store {
                rv: FIRST_RESOURCE_VERSION,
                nodes: BTreeMap::new(),
                history: Vec::new(),
                horizon: 0,
                watch_generation: 0,
                tokens: HashSet::from([token.to_owned()]),
                refuse_status_patch: false,
                bookmark_every: DEFAULT_BOOKMARK_EVERY,
                requests: Vec::new(),
                open_watches: 0,
            }),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            deadline: Instant::now() + LIFETIME,
        });
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("kube-api".to_owned())
                .spawn(move || accept_loop(listener, config, shared))
                .context("starting the listener thread")?
        };
        Ok(Self {
            addr,
            ca,
            token: token.to_owned(),
            shared,
            thread: Some(thread),
        })
    }

    /// The address the server listens on (the port chosen when `addr` had 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The PEM of the CA that signed the server's certificate.
    pub fn ca_pem(&self) -> String {
        self.ca.cert.pem()
    }

    /// Writes the CA's PEM and the token given to [`KubeApi::start`] into files under `dir`
    /// (`ca.crt` and `token`, as in a service account's mount): (ca path, token path).
    pub fn write_credentials(&self, dir: &Path) -> Result<(PathBuf, PathBuf)> {
        let ca_path = dir.join(CA_FILE);
        let token_path = dir.join(TOKEN_FILE);
        std::fs::write(&ca_path, self.ca_pem())
            .with_context(|| format!("writing {}", ca_path.display()))?;
        std::fs::write(&token_path, &self.token)
            .with_context(|| format!("writing {}", token_path.display()))?;
        Ok((ca_path, token_path))
    }

    /// Adds `token` to the accepted ones.
    pub fn accept_token(&self, token: &str) {
        self.shared.lock().tokens.insert(token.to_owned());
    }

    /// Removes `token` from the accepted ones: requests with it are answered 401.
    pub fn refuse_token(&self, token: &str) {
        self.shared.lock().tokens.remove(token);
    }

    /// Adds or replaces a node (ADDED or MODIFIED); returns the new resourceVersion. The node
    /// is named by its `metadata.name`; its `metadata.resourceVersion`, `uid` (kept while the
    /// node exists, a new one when it is added again) and `creationTimestamp` are set here.
    pub fn set_node(&self, mut node: Value) -> u64 {
        let name = node
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .expect("set_node: the node has no metadata.name")
            .to_owned();
        let mut store = self.shared.lock();
        let (kind, uid, created) = match store.nodes.get(&name) {
            Some(old) => (
                "MODIFIED",
                old["metadata"]["uid"].clone(),
                old["metadata"]["creationTimestamp"].clone(),
            ),
            None => (
                "ADDED",
                Value::from(new_uid()),
                Value::from(rfc3339(SystemTime::now())),
            ),
        };
        store.rv += 1;
        let rv = store.rv;
        let object = node
            .as_object_mut()
            .expect("set_node: the node is an object");
        object.entry("kind").or_insert_with(|| Value::from("Node"));
        object
            .entry("apiVersion")
            .or_insert_with(|| Value::from("v1"));
        let metadata = &mut node["metadata"];
        metadata["resourceVersion"] = Value::from(rv.to_string());
        metadata["uid"] = uid;
        metadata["creationTimestamp"] = created;
        store.nodes.insert(name, node.clone());
        self.shared.record_change(&mut store, kind, node);
        rv
    }

    /// Deletes a node (DELETED, with the node as it was, at the new resourceVersion);
    /// returns the new resourceVersion, or the current one when there is no such node.
    pub fn delete_node(&self, name: &str) -> u64 {
        let mut store = self.shared.lock();
        let Some(mut node) = store.nodes.remove(name) else {
            return store.rv;
        };
        store.rv += 1;
        let rv = store.rv;
        node["metadata"]["resourceVersion"] = Value::from(rv.to_string());
        self.shared.record_change(&mut store, "DELETED", node);
        rv
    }

    /// The node as stored now, or `None`.
    pub fn node(&self, name: &str) -> Option<Value> {
        self.shared.lock().nodes.get(name).cloned()
    }

    /// Ends every open watch abruptly: its connection is closed without the terminating
    /// chunk, as when the API server or a load balancer in between goes away.
    pub fn drop_watches(&self) {
        let mut store = self.shared.lock();
        store.watch_generation += 1;
        self.shared.changed.notify_all();
    }

    /// Forgets the history up to now, as an etcd compaction does: the resourceVersion moves
    /// on by one without a change to a node (as writes to other objects move it), and a watch
    /// from any older one, the one before included, is answered with the 410 `Expired`
    /// event. The open watches are dropped too, so a client watches again from its last
    /// resourceVersion, gets the 410 and lists again (at the new resourceVersion, from which
    /// it can watch). Returns the new resourceVersion, the horizon.
    pub fn expire_history(&self) -> u64 {
        let mut store = self.shared.lock();
        store.rv += 1;
        store.horizon = store.rv;
        store.watch_generation += 1;
        self.shared.changed.notify_all();
        store.rv
    }

    /// Makes `PATCH .../status` answer 403 Forbidden (as when the service account's role
    /// lacks `nodes/status`) while `refuse` holds.
    pub fn refuse_status_patch(&self, refuse: bool) {
        self.shared.lock().refuse_status_patch = refuse;
    }

    /// Sets how often open watches that allow bookmarks send one (at most every 10 ms).
    pub fn set_bookmark_every(&self, every: Duration) {
        self.shared.lock().bookmark_every = every;
        self.shared.changed.notify_all();
    }

    /// Every request so far, in the order they were answered (a watch when it started).
    pub fn requests(&self) -> Vec<Request> {
        self.shared.lock().requests.clone()
    }

    /// How many watch streams are open now.
    pub fn open_watches(&self) -> usize {
        self.shared.lock().open_watches
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        {
            let _store = self.shared.lock();
            self.shared.changed.notify_all();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A Node object as the API server returns it: name (also its `kubernetes.io/hostname`
/// label), `spec.podCIDRs` (and `spec.podCIDR` = the first, when any), `status.addresses`
/// with each InternalIP given and a Hostname, `metadata.annotations` as given, a Ready
/// condition.
pub fn node(
    name: &str,
    pod_cidrs: &[&str],
    internal_ips: &[&str],
    annotations: &[(&str, &str)],
) -> Value {
    let mut metadata = json!({
        "name": name,
        "labels": { "kubernetes.io/hostname": name, "kubernetes.io/os": "linux" },
    });
    if !annotations.is_empty() {
        let annotations: Map<String, Value> = annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
            .collect();
        metadata["annotations"] = Value::Object(annotations);
    }
    let mut spec = json!({});
    if let Some(first) = pod_cidrs.first() {
        spec["podCIDR"] = Value::from(*first);
        spec["podCIDRs"] = Value::from(pod_cidrs.to_vec());
    }
    let mut addresses: Vec<Value> = internal_ips
        .iter()
        .map(|ip| json!({ "type": "InternalIP", "address": ip }))
        .collect();
    addresses.push(json!({ "type": "Hostname", "address": name }));
    let now = rfc3339(SystemTime::now());
    json!({
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": metadata,
        "spec": spec,
        "status": {
            "addresses": addresses,
            "conditions": [{
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }],
        },
    })
}

/// Accepts connections until the server stops, each served by a thread of its own, then
/// waits for those threads.
fn accept_loop(listener: TcpListener, config: Arc<ServerConfig>, shared: Arc<Shared>) {
    let mut connections: Vec<JoinHandle<()>> = Vec::new();
    while !shared.stopping() {
        match listener.accept() {
            Ok((tcp, _)) => {
                let (config, shared) = (config.clone(), shared.clone());
                let spawned = std::thread::Builder::new()
                    .name("kube-api-conn".to_owned())
                    .spawn(move || serve_connection(tcp, &config, &shared));
                if let Ok(handle) = spawned {
                    connections.push(handle);
                }
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
        connections.retain(|c| !c.is_finished());
    }
    drop(listener);
    for connection in connections {
        let _ = connection.join();
    }
}

/// How a connection goes on after a response.
enum Next {
    /// The next request.
    KeepAlive,
    /// Closed cleanly (TLS close_notify).
    Close,
    /// Closed abruptly, as a dropped connection.
    Abort,
}

type Tls = StreamOwned<ServerConnection, TcpStream>;

/// One connection: requests one after another until the client closes it, sends garbage,
/// or the server stops.
fn serve_connection(tcp: TcpStream, config: &Arc<ServerConfig>, shared: &Shared) {
    let _ = tcp.set_nonblocking(false);
    let _ = tcp.set_nodelay(true);
    let _ = tcp.set_read_timeout(Some(POLL));
    let _ = tcp.set_write_timeout(Some(WRITE_TIMEOUT));
    let Ok(conn) = ServerConnection::new(config.clone()) else {
        return;
    };
    let mut tls = StreamOwned::new(conn, tcp);
    let mut buf = Vec::new();
    loop {
        let Some(request) = read_request(&mut tls, &mut buf, shared) else {
            return;
        };
        match handle(&mut tls, &request, shared) {
            Next::KeepAlive => {}
            Next::Close => {
                tls.conn.send_close_notify();
                let _ = tls.flush();
                return;
            }
            Next::Abort => {
                let _ = tls.sock.shutdown(Shutdown::Both);
                return;
            }
        }
    }
}

/// A request as read off the connection.
struct HttpRequest {
    method: String,
    target: String,
    /// Lowercased names.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// HTTP/1.0, or `Connection: close`.
    close: bool,
}

impl HttpRequest {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn token(&self) -> &str {
        self.header("authorization")
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map_or("", |(_, token)| token.trim())
    }
}

/// Reads the next request: its head up to the blank line, then exactly `Content-Length`
/// bytes of body, however they arrive. `None` when the client closed the connection, sent
/// something this server does not take (garbage, a chunked body, too large), or the server
/// is stopping. `buf` keeps what was read past the request.
fn read_request(tls: &mut Tls, buf: &mut Vec<u8>, shared: &Shared) -> Option<HttpRequest> {
    let head_len = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
        fill(tls, buf, shared)?;
    };
    let head = String::from_utf8(buf[..head_len].to_vec()).ok()?;
    buf.drain(..head_len + 4);
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let (method, target, version) = (
        request_line.next()?.to_owned(),
        request_line.next()?.to_owned(),
        request_line.next()?,
    );
    if request_line.next().is_some() || !version.starts_with("HTTP/1.") || !target.starts_with('/')
    {
        return None;
    }
    let mut headers = Vec::new();
    for line in lines {
        let (name, value) = line.split_once(':')?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let mut request = HttpRequest {
        method,
        target,
        headers,
        body: Vec::new(),
        close: version == "HTTP/1.0",
    };
    if request
        .header("transfer-encoding")
        .is_some_and(|te| !te.eq_ignore_ascii_case("identity"))
    {
        return None;
    }
    if request
        .header("connection")
        .is_some_and(|c| c.eq_ignore_ascii_case("close"))
    {
        request.close = true;
    }
    let len = match request.header("content-length") {
        Some(len) => len.parse::<usize>().ok()?,
        None => 0,
    };
    if len > MAX_BODY {
        return None;
    }
    while buf.len() < len {
        fill(tls, buf, shared)?;
    }
    request.body = buf.drain(..len).collect();
    Some(request)
}

/// Reads what the client sent next into `buf`, waiting for it. `None` on end of
/// connection, an error, or when the server is stopping.
fn fill(tls: &mut Tls, buf: &mut Vec<u8>, shared: &Shared) -> Option<()> {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if shared.stopping() {
            return None;
        }
        match tls.read(&mut chunk) {
            Ok(0) => return None,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                return Some(());
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => return None,
        }
    }
}

/// What a request path names.
enum Route<'a> {
    Nodes,
    Node(&'a str),
    NodeStatus(&'a str),
    Unknown,
}

fn route(path: &str) -> Route<'_> {
    let Some(rest) = path.strip_prefix("/api/v1/nodes") else {
        return Route::Unknown;
    };
    if rest.is_empty() || rest == "/" {
        return Route::Nodes;
    }
    let Some(rest) = rest.strip_prefix('/') else {
        return Route::Unknown;
    };
    match rest.split_once('/') {
        None => Route::Node(rest),
        Some((name, "status")) if !name.is_empty() => Route::NodeStatus(name),
        Some(_) => Route::Unknown,
    }
}

/// Answers one request, and records it.
fn handle(tls: &mut Tls, request: &HttpRequest, shared: &Shared) -> Next {
    let record = |status: u16| {
        shared.lock().requests.push(Request {
            method: request.method.clone(),
            target: request.target.clone(),
            token: request.token().to_owned(),
            content_type: request.header("content-type").unwrap_or("").to_owned(),
            body: String::from_utf8_lossy(&request.body).into_owned(),
            status,
        });
    };
    let (path, query) = request
        .target
        .split_once('?')
        .unwrap_or((&request.target, ""));
    let query = parse_query(query);
    let param = |name: &str| {
        query
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let is_true = |name: &str| matches!(param(name), Some("true" | "1"));
    let token = request.token();
    let authorized = !token.is_empty() && shared.lock().tokens.contains(token);
    let method = request.method.as_str();
    let (status, body) = if !authorized {
        status_object(401, "Unauthorized", "Unauthorized", None)
    } else {
        match (route(path), method) {
            (Route::Nodes, "GET") if is_true("watch") => {
                return watch(
                    tls,
                    request,
                    shared,
                    param("resourceVersion"),
                    &param,
                    record,
                );
            }
            (Route::Nodes, "GET") => (200, list(shared)),
            (Route::Node(name) | Route::NodeStatus(name), "GET") => get(shared, name),
            (Route::NodeStatus(name), "PATCH") => patch_status(shared, name, request),
            (Route::Unknown, _) => status_object(
                404,
                "NotFound",
                "the server could not find the requested resource",
                None,
            ),
            _ => status_object(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
                None,
            ),
        }
    };
    record(status);
    let body = body.to_string();
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nCache-Control: no-cache, private\r\nContent-Length: {}\r\n{}\r\n",
        reason_phrase(status),
        body.len(),
        if request.close { "Connection: close\r\n" } else { "" },
    );
    let mut response = head.into_bytes();
    response.extend_from_slice(body.as_bytes());
    if tls.write_all(&response).and_then(|()| tls.flush()).is_err() {
        Next::Abort
    } else if request.close {
        Next::Close
    } else {
        Next::KeepAlive
    }
}

/// The NodeList: every node, at the current resourceVersion.
fn list(shared: &Shared) -> Value {
    let store = shared.lock();
    json!({
        "kind": "NodeList",
        "apiVersion": "v1",
        "metadata": { "resourceVersion": store.rv.to_string() },
        "items": store.nodes.values().collect::<Vec<_>>(),
    })
}

fn get(shared: &Shared, name: &str) -> (u16, Value) {
    match shared.lock().nodes.get(name) {
        Some(node) => (200, node.clone()),
        None => not_found(name),
    }
}

fn not_found(name: &str) -> (u16, Value) {
    status_object(
        404,
        "NotFound",
        &format!("nodes \"{name}\" not found"),
        Some(json!({ "name": name, "kind": "nodes" })),
    )
}

/// `PATCH /api/v1/nodes/<name>/status`: the patch applied to the node's `status` (what
/// else it holds is ignored, as for a status subresource). A strategic merge patch merges
/// `conditions` by `type` (the fields of a condition given replace those of the stored one
/// of that type, which is otherwise kept; one of a new type is appended; `"$patch":
/// "delete"` removes one) and other objects key by key; a JSON merge patch (RFC 7386)
/// replaces lists whole, `conditions` too, as the API server does. A patch that changes
/// nothing leaves the resourceVersion as it is and makes no event, as the API server does.
fn patch_status(shared: &Shared, name: &str, request: &HttpRequest) -> (u16, Value) {
    let mut store = shared.lock();
    if store.refuse_status_patch {
        return status_object(
            403,
            "Forbidden",
            &format!(
                "nodes \"{name}\" is forbidden: User \"system:serviceaccount:kube-system:ebpf-cni\" cannot patch resource \"nodes/status\" in API group \"\" at the cluster scope"
            ),
            Some(json!({ "name": name, "kind": "nodes" })),
        );
    }
    let content_type = request.header("content-type").unwrap_or("");
    let strategic = match content_type.split(';').next().unwrap_or("").trim() {
        "application/strategic-merge-patch+json" => true,
        "application/merge-patch+json" => false,
        _ => {
            return status_object(
                415,
                "UnsupportedMediaType",
                &format!("the body of the request was in an unknown format - accepted media types include: application/strategic-merge-patch+json, application/merge-patch+json (not {content_type:?})"),
                None,
            )
        }
    };
    let patch: Value = match serde_json::from_slice(&request.body) {
        Ok(patch @ Value::Object(_)) => patch,
        Ok(other) => {
            return status_object(
                400,
                "BadRequest",
                &format!("the patch is not a JSON object: {other}"),
                None,
            )
        }
        Err(e) => {
            return status_object(400, "BadRequest", &format!("invalid JSON patch: {e}"), None)
        }
    };
    let Some(node) = store.nodes.get(name) else {
        return not_found(name);
    };
    let mut patched = node.clone();
    if let Some(status_patch) = patch.get("status") {
        let status = &mut patched["status"];
        merge(status, status_patch, strategic);
    }
    if &patched == node {
        return (200, patched);
    }
    store.rv += 1;
    patched["metadata"]["resourceVersion"] = Value::from(store.rv.to_string());
    store.nodes.insert(name.to_owned(), patched.clone());
    shared.record_change(&mut store, "MODIFIED", patched.clone());
    (200, patched)
}

/// `patch` applied to `target` as the API server applies one to a Node's status. A JSON
/// merge patch (RFC 7386, `strategic` false): objects merged key by key (`null` removes a
/// key), anything else replaced. A strategic merge patch (`strategic`): the same, except
/// that `conditions` lists merge by `type` and directives (`$...` keys) are not stored.
fn merge(target: &mut Value, patch: &Value, strategic: bool) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let Value::Object(target) = target else {
        return;
    };
    for (key, value) in patch {
        if strategic && key.starts_with('$') {
            continue;
        }
        if value.is_null() {
            target.remove(key);
            continue;
        }
        if let (true, Value::Array(items), "conditions") = (strategic, value, key.as_str()) {
            let Value::Array(list) = target
                .entry(key.clone())
                .or_insert_with(|| Value::Array(Vec::new()))
            else {
                target.insert(key.clone(), value.clone());
                continue;
            };
            for item in items {
                let kind = item.get("type");
                let at = list.iter().position(|c| c.get("type") == kind);
                if item.get("$patch").and_then(Value::as_str) == Some("delete") {
                    if let Some(at) = at {
                        list.remove(at);
                    }
                    continue;
                }
                match at {
                    Some(at) => merge(&mut list[at], item, true),
                    None => {
                        let mut fresh = Value::Null;
                        merge(&mut fresh, item, true);
                        list.push(fresh);
                    }
                }
            }
            continue;
        }
        merge(
            target.entry(key.clone()).or_insert(Value::Null),
            value,
            strategic,
        );
    }
}

/// Decrements the count of open watches when the watch ends, however it ends.
struct OpenWatch<'a>(&'a Shared);

impl Drop for OpenWatch<'_> {
    fn drop(&mut self) {
        self.0.lock().open_watches -= 1;
    }
}

/// How a watch stream ends.
enum End {
    /// The terminating chunk: `timeoutSeconds` ran out, or the server stops.
    Clean,
    /// The connection closed mid-body: dropped watches, or the client went away.
    Dropped,
}

/// `GET /api/v1/nodes?watch=true`: the events after `since` (every node ADDED when it is
/// "0" or absent, as the API server starts such a watch), then new ones as they happen, with bookmarks, until
/// `timeoutSeconds`, [`KubeApi::drop_watches`] or the server stops; or, when `since` is
/// older than the history's horizon, the 410 `Expired` event alone.
fn watch<'q>(
    tls: &mut Tls,
    request: &HttpRequest,
    shared: &Shared,
    since: Option<&str>,
    param: &impl Fn(&str) -> Option<&'q str>,
    record: impl Fn(u16),
) -> Next {
    let started = Instant::now();
    let end = match param("timeoutSeconds").and_then(|t| t.parse::<u64>().ok()) {
        Some(secs) => started + Duration::from_secs(secs),
        None => shared.deadline,
    };
    let bookmarks = matches!(param("allowWatchBookmarks"), Some("true" | "1"));
    let mut store = shared.lock();
    let since = match since.unwrap_or("") {
        "" => None,
        rv => match rv.parse::<u64>() {
            Ok(rv) => Some(rv),
            Err(_) => {
                drop(store);
                let (status, body) = status_object(
                    400,
                    "BadRequest",
                    &format!("invalid resource version: {rv:?}"),
                    None,
                );
                record(status);
                return respond_plain(tls, request, status, &body.to_string());
            }
        },
    };
    let mut lines = Vec::new();
    let mut next = store.history.len();
    match since {
        Some(rv) if rv != 0 && rv < store.horizon => {
            let horizon = store.horizon;
            drop(store);
            record(200);
            let (_, status) = status_object(
                410,
                "Expired",
                &format!("too old resource version: {rv} ({horizon})"),
                None,
            );
            let line = json!({ "type": "ERROR", "object": status }).to_string();
            let sent = tls
                .write_all(WATCH_HEAD.as_bytes())
                .and_then(|()| tls.write_all(chunk(&line).as_bytes()))
                .and_then(|()| tls.write_all(b"0\r\n\r\n"))
                .and_then(|()| tls.flush());
            return match sent {
                Ok(()) if request.close => Next::Close,
                Ok(()) => Next::KeepAlive,
                Err(_) => Next::Abort,
            };
        }
        Some(0) | None => {
            for node in store.nodes.values() {
                lines.push(event("ADDED", node));
            }
        }
        Some(rv) => {
            next = store.history.partition_point(|c| c.rv <= rv);
        }
    }
    let generation = store.watch_generation;
    store.open_watches += 1;
    let open = OpenWatch(shared);
    drop(store);
    record(200);
    if tls.write_all(WATCH_HEAD.as_bytes()).is_err() {
        return Next::Abort;
    }
    let mut last_bookmark = started;
    let how = loop {
        let store = shared.lock();
        let now = Instant::now();
        if store.watch_generation != generation {
            break End::Dropped;
        }
        if shared.stopping() || now >= end {
            break End::Clean;
        }
        for change in &store.history[next..] {
            lines.push(event(change.kind, &change.object));
        }
        next = store.history.len();
        let next_bookmark = last_bookmark + store.bookmark_every.max(MIN_BOOKMARK_EVERY);
        if bookmarks && now >= next_bookmark {
            lines.push(
                json!({
                    "type": "BOOKMARK",
                    "object": {
                        "kind": "Node",
                        "apiVersion": "v1",
                        "metadata": { "resourceVersion": store.rv.to_string() },
                    },
                })
                .to_string(),
            );
            last_bookmark = now;
        }
        if lines.is_empty() {
            let mut wake = end.min(now + POLL);
            if bookmarks {
                wake = wake.min(next_bookmark);
            }
            drop(
                shared
                    .changed
                    .wait_timeout(store, wake.saturating_duration_since(now)),
            );
            continue;
        }
        drop(store);
        let sent = lines
            .drain(..)
            .try_for_each(|line| tls.write_all(chunk(&line).as_bytes()))
            .and_then(|()| tls.flush());
        if sent.is_err() {
            break End::Dropped;
        }
    };
    drop(open);
    match how {
        End::Dropped => Next::Abort,
        End::Clean => match tls.write_all(b"0\r\n\r\n").and_then(|()| tls.flush()) {
            Ok(()) if request.close => Next::Close,
            Ok(()) => Next::KeepAlive,
            Err(_) => Next::Abort,
        },
    }
}

/// The head of a watch response: its body is chunked, one event a chunk.
const WATCH_HEAD: &str = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nCache-Control: no-cache, private\r\nTransfer-Encoding: chunked\r\n\r\n";

/// A watch event's line.
fn event(kind: &str, object: &Value) -> String {
    json!({ "type": kind, "object": object }).to_string()
}

/// `line` and its newline as one chunk.
fn chunk(line: &str) -> String {
    format!("{:x}\r\n{line}\n\r\n", line.len() + 1)
}

/// A response with a measured body.
fn respond_plain(tls: &mut Tls, request: &HttpRequest, status: u16, body: &str) -> Next {
    let response = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        reason_phrase(status),
        body.len()
    );
    match tls
        .write_all(response.as_bytes())
        .and_then(|()| tls.flush())
    {
        Ok(()) if request.close => Next::Close,
        Ok(()) => Next::KeepAlive,
        Err(_) => Next::Abort,
    }
}

/// A Status object (`kind: Status`, `status: Failure`) as the API server words errors.
fn status_object(code: u16, reason: &str, message: &str, details: Option<Value>) -> (u16, Value) {
    let mut status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    });
    if let Some(details) = details {
        status["details"] = details;
    }
    (code, status)
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        410 => "Gone",
        415 => "Unsupported Media Type",
        _ => "Unknown",
    }
}

/// The query's pairs, percent- and `+`-decoded.
fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(name), percent_decode(value))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(high), Some(low)) => {
                    out.push((high * 16 + low) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A uid shaped like the API server's (a UUID), unique in this process and across
/// processes.
fn new_uid() -> String {
    format!(
        "{:08x}-0000-4000-8000-{:012x}",
        std::process::id(),
        UIDS.fetch_add(1, Ordering::Relaxed)
    )
}

/// `t` as the API server writes times (RFC 3339, UTC, whole seconds).
fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Days to the civil date (H. Hinnant's algorithm), in eras of 400 years from 0000-03-01.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
