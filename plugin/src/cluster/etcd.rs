//! The etcd source: the node takes its pod subnets from the network config under
//! `<prefix>/config`, holds them by keys under `<prefix>/subnets/` created only if absent
//! (one transaction, so two nodes never hold one subnet) and bound to a lease the agent keeps
//! alive, and gives them back on `agent --leave`. A node that dies loses its keys when the
//! lease expires; a node that restarts, or whose etcd was away, finds its keys by its name
//! and keeps them, or, if they expired meanwhile, asks for the same subnets again.
//!
//! Talks to etcd with the `etcd-client` crate (gRPC over tonic, rustls with ring for TLS):
//! its transactions, leases and watches are what this needs, and etcd's own gRPC API is
//! the one every etcd release keeps.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    PutOptions, TlsOptions, Txn, TxnOp, WatchOptions,
};
use ipnetwork::IpNetwork;

use super::network::{
    choose_subnet, config_key, subnet_key, subnet_of_key, subnets_prefix, MemberRecord,
    NetworkConfig, NetworkConfigError,
};
use super::routes::Members;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "/ebpf-cni/network";
/// The default lease: a node that dies keeps its subnet this long (flannel keeps 24 h).
pub const DEFAULT_TTL_SECS: u64 = 24 * 60 * 60;
/// How many times a join is tried again when another node took a chosen subnet first.
const JOIN_ATTEMPTS: usize = 10;

/// The endpoint the next [`EtcdArgs::connect`] tries first.
static NEXT_ENDPOINT: AtomicUsize = AtomicUsize::new(0);

/// How the agent reaches etcd (flags with an environment variable each).
#[derive(Debug, Clone, clap::Args)]
pub struct EtcdArgs {
    /// etcd's client URLs, comma-separated (http:// or https://).
    #[arg(
        long = "etcd-endpoints",
        env = "EBPF_CNI_ETCD_ENDPOINTS",
        value_name = "URLS",
        value_delimiter = ','
    )]
    pub endpoints: Vec<String>,
    /// The prefix of the network config's and the subnets' keys.
    #[arg(long = "etcd-prefix", env = "EBPF_CNI_ETCD_PREFIX", default_value = DEFAULT_PREFIX)]
    pub prefix: String,
    /// The CA certificate (PEM) etcd's server certificate is checked against.
    #[arg(
        long = "etcd-ca-file",
        env = "EBPF_CNI_ETCD_CA_FILE",
        value_name = "FILE"
    )]
    pub ca_file: Option<PathBuf>,
    /// The client certificate (PEM) for etcd's client-certificate authentication.
    #[arg(
        long = "etcd-cert-file",
        env = "EBPF_CNI_ETCD_CERT_FILE",
        value_name = "FILE"
    )]
    pub cert_file: Option<PathBuf>,
    /// The client certificate's key (PEM).
    #[arg(
        long = "etcd-key-file",
        env = "EBPF_CNI_ETCD_KEY_FILE",
        value_name = "FILE"
    )]
    pub key_file: Option<PathBuf>,
    /// The etcd user (with --etcd-password).
    #[arg(long = "etcd-username", env = "EBPF_CNI_ETCD_USERNAME")]
    pub username: Option<String>,
    #[arg(
        long = "etcd-password",
        env = "EBPF_CNI_ETCD_PASSWORD",
        hide_env_values = true
    )]
    pub password: Option<String>,
    /// The lease the node's subnet keys are bound to, in seconds.
    #[arg(long = "subnet-ttl", env = "EBPF_CNI_SUBNET_TTL", value_name = "SECONDS", default_value_t = DEFAULT_TTL_SECS)]
    pub ttl: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("--etcd-endpoints (EBPF_CNI_ETCD_ENDPOINTS) is not set: the etcd source needs it")]
    NoEndpoints,
    #[error("--subnet-ttl (EBPF_CNI_SUBNET_TTL) {0} is invalid: at least 2 seconds")]
    Ttl(u64),
    #[error("--etcd-cert-file and --etcd-key-file go together: only {given} is set")]
    HalfIdentity { given: &'static str },
    #[error("--etcd-username and --etcd-password go together: only {given} is set")]
    HalfUser { given: &'static str },
    #[error("reading {what} {path}")]
    ReadFile {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("connecting to etcd at {endpoints}")]
    Connect {
        endpoints: String,
        source: etcd_client::Error,
    },
    #[error("etcd: {what}")]
    Request {
        what: String,
        source: etcd_client::Error,
    },
    #[error("no network config at {key}: write one, e.g. {{\"network\": \"10.244.0.0/16\"}}")]
    NoConfig { key: String },
    #[error("the network config at {key}")]
    Config {
        key: String,
        source: NetworkConfigError,
    },
    #[error("every /{len} subnet of {network} is held by another node")]
    Exhausted { network: IpNetwork, len: u8 },
    #[error("other nodes took each subnet chosen, {JOIN_ATTEMPTS} times")]
    Raced,
    #[error("the node's address towards etcd at {endpoint}: {source}")]
    NodeAddress {
        endpoint: String,
        source: std::io::Error,
    },
    #[error("the etcd endpoint {0} is not a URL with an address and a port")]
    Endpoint(String),
    #[error("the lease of the node's subnets expired")]
    LeaseExpired,
    #[error("etcd compacted the subnets' history past the watch (now at revision {0})")]
    Compacted(i64),
    #[error("etcd ended the watch of the subnets")]
    WatchEnded,
}

impl EtcdError {
    /// Whether etcd may answer if asked again: it cannot be reached, or it answered that it
    /// cannot serve now (`Unavailable`: no leader, "leader changed"; a deadline or an
    /// aborted request). A missing or wrong config, a full network or bad settings are not.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Connect { .. } => true,
            Self::Request { source, .. } => match source {
                etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
                // gRPC's CANCELLED (the client's own timeout), UNKNOWN, DEADLINE_EXCEEDED,
                // ABORTED, UNAVAILABLE.
                etcd_client::Error::GRpcStatus(s) => {
                    matches!(i32::from(s.code()), 1 | 2 | 4 | 10 | 14)
                }
                _ => false,
            },
            _ => false,
        }
    }
}

fn request(what: impl Into<String>) -> impl FnOnce(etcd_client::Error) -> EtcdError {
    let what = what.into();
    move |source| EtcdError::Request { what, source }
}

impl EtcdArgs {
    /// Checks the settings that need no connection.
    pub fn validate(&self) -> Result<(), EtcdError> {
        if self.endpoints.iter().all(|e| e.trim().is_empty()) {
            return Err(EtcdError::NoEndpoints);
        }
        if self.ttl < 2 {
            return Err(EtcdError::Ttl(self.ttl));
        }
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => {
                return Err(EtcdError::HalfIdentity {
                    given: "--etcd-cert-file",
                })
            }
            (None, Some(_)) => {
                return Err(EtcdError::HalfIdentity {
                    given: "--etcd-key-file",
                })
            }
            _ => {}
        }
        match (&self.username, &self.password) {
            (Some(_), None) => Err(EtcdError::HalfUser {
                given: "--etcd-username",
            }),
            (None, Some(_)) => Err(EtcdError::HalfUser {
                given: "--etcd-password",
            }),
            _ => Ok(()),
        }
    }

    fn endpoints(&self) -> Vec<String> {
        self.endpoints
            .iter()
            .map(|e| e.trim().to_owned())
            .filter(|e| !e.is_empty())
            .collect()
    }

    /// Connects (TLS and user as set).
    pub async fn connect(&self) -> Result<Client, EtcdError> {
        self.validate()?;
        let read = |what: &'static str, path: &PathBuf| {
            std::fs::read(path).map_err(|source| EtcdError::ReadFile {
                what,
                path: path.clone(),
                source,
            })
        };
        let mut options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(10))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
        if self.ca_file.is_some() || self.cert_file.is_some() {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &self.ca_file {
                tls = tls.ca_certificate(Certificate::from_pem(read("the etcd CA", ca)?));
            }
            if let (Some(cert), Some(key)) = (&self.cert_file, &self.key_file) {
                tls = tls.identity(Identity::from_pem(
                    read("the etcd client certificate", cert)?,
                    read("the etcd client key", key)?,
                ));
            }
            options = options.with_tls(tls);
        }
        if let (Some(user), Some(password)) = (&self.username, &self.password) {
            options = options.with_user(user, password);
        }
        // One member at a time, the first that answers: etcd-client's balanced channel
        // fails a request sent to a member that is down instead of trying another
        // (etcdv3/etcd-client#39), so with one member of three stopped every third request
        // would fail. Each connection starts after the member the last one reached, so the
        // reconnection after an error goes to the next member, as etcd's own Go client
        // rotates.
        let endpoints = self.endpoints();
        let start = NEXT_ENDPOINT.load(Ordering::Relaxed);
        let mut last = None;
        for i in 0..endpoints.len() {
            let at = (start + i) % endpoints.len();
            let attempt = async {
                let mut client = Client::connect([&endpoints[at]], Some(options.clone())).await?;
                // A single endpoint connects lazily: a status answered proves a member.
                client.status().await?;
                Ok::<_, etcd_client::Error>(client)
            };
            match attempt.await {
                Ok(client) => {
                    NEXT_ENDPOINT.store((at + 1) % endpoints.len(), Ordering::Relaxed);
                    log::debug!("etcd: connected to {}", endpoints[at]);
                    return Ok(client);
                }
                Err(e) => {
                    log::debug!("etcd: {}: {e}", endpoints[at]);
                    last = Some(e);
                }
            }
        }
        Err(EtcdError::Connect {
            endpoints: endpoints.join(","),
            source: last
                .unwrap_or_else(|| etcd_client::Error::InvalidArgs("no etcd endpoint".to_owned())),
        })
    }

    /// The node's address towards the first endpoint: the source the kernel picks for it
    /// (no packet is sent).
    pub fn node_address(&self) -> Result<IpAddr, EtcdError> {
        let endpoint = self
            .endpoints()
            .into_iter()
            .next()
            .ok_or(EtcdError::NoEndpoints)?;
        let target =
            endpoint_addr(&endpoint).ok_or_else(|| EtcdError::Endpoint(endpoint.clone()))?;
        let any: SocketAddr = if target.is_ipv4() {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let local = UdpSocket::bind(any)
            .and_then(|s| s.connect(target).and_then(|()| s.local_addr()))
            .map_err(|source| EtcdError::NodeAddress { endpoint, source })?;
        Ok(local.ip())
    }
}

/// The address and port of an endpoint URL (`http://10.0.0.1:2379`, `https://[fd00::1]:2379`).
fn endpoint_addr(url: &str) -> Option<SocketAddr> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host_port = rest.split('/').next()?;
    host_port.parse().ok()
}

/// The network config, read once.
pub async fn network_config(client: &mut Client, prefix: &str) -> Result<NetworkConfig, EtcdError> {
    let key = config_key(prefix);
    let resp = client
        .get(key.as_str(), None)
        .await
        .map_err(request(format!("reading {key}")))?;
    let kv = resp
        .kvs()
        .first()
        .ok_or_else(|| EtcdError::NoConfig { key: key.clone() })?;
    NetworkConfig::parse(kv.value()).map_err(|source| EtcdError::Config { key, source })
}

/// The node's hold on its subnets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub subnets: Vec<IpNetwork>,
    /// The lease the keys are bound to; 0 for keys an operator wrote without one (a
    /// reservation, kept for good).
    pub lease: i64,
}

/// One subnet key as listed.
struct Held {
    subnet: IpNetwork,
    record: Option<MemberRecord>,
    lease: i64,
    mod_revision: i64,
}

/// The subnet keys, and the revision of the listing.
async fn list(client: &mut Client, prefix: &str) -> Result<(Vec<Held>, i64), EtcdError> {
    let resp = client
        .get(
            subnets_prefix(prefix),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .map_err(request("listing the subnets"))?;
    let revision = resp.header().map_or(0, |h| h.revision());
    let held = resp
        .kvs()
        .iter()
        .filter_map(|kv| {
            let subnet = subnet_of_key(prefix, kv.key_str().ok()?)?;
            Some(Held {
                subnet,
                record: serde_json::from_slice(kv.value()).ok(),
                lease: kv.lease(),
                mod_revision: kv.mod_revision(),
            })
        })
        .collect();
    Ok((held, revision))
}

/// Takes the node's subnets (one per family of the config): the ones its keys already hold
/// (its name in the record), else `preferred` ones that are free (a node whose pods already
/// have addresses keeps them), else free ones; never a subnet whose key exists. The keys
/// carry `record` (the node's current addresses) and a lease of `ttl` seconds (the one they
/// have if it is still alive and of that TTL).
pub async fn join(
    client: &mut Client,
    prefix: &str,
    config: &NetworkConfig,
    record: &MemberRecord,
    preferred: &[IpNetwork],
    ttl: u64,
) -> Result<Membership, EtcdError> {
    for _ in 0..JOIN_ATTEMPTS {
        let (held, _) = list(client, prefix).await?;
        let is_ours = |h: &Held| h.record.as_ref().is_some_and(|r| r.node == record.node);
        let taken: BTreeSet<IpNetwork> = held
            .iter()
            .filter(|h| !is_ours(h))
            .map(|h| h.subnet)
            .collect();
        let ours: Vec<&Held> = held.iter().filter(|h| is_ours(h)).collect();
        let mut wanted = Vec::new();
        for (network, len) in [
            (config.network.map(IpNetwork::V4), config.subnet_len),
            (
                config.ipv6_network.map(IpNetwork::V6),
                config.ipv6_subnet_len,
            ),
        ] {
            let Some(network) = network else { continue };
            let kept = ours.iter().find(|h| {
                h.subnet.is_ipv4() == network.is_ipv4() && config.is_node_subnet(h.subnet)
            });
            let subnet = match kept {
                Some(h) => h.subnet,
                None => {
                    let want = preferred
                        .iter()
                        .copied()
                        .find(|p| p.is_ipv4() == network.is_ipv4());
                    choose_subnet(network, len, &taken, want, &record.node)
                        .ok_or(EtcdError::Exhausted { network, len })?
                }
            };
            wanted.push((subnet, kept.map(|h| h.mod_revision)));
        }
        // The lease the node's keys have, if it is still alive; a reservation stays one.
        let mut lease = None;
        for h in ours.iter().filter(|h| {
            wanted
                .iter()
                .any(|(s, kept)| kept.is_some() && *s == h.subnet)
        }) {
            if h.lease == 0 {
                lease = Some(0);
                break;
            }
            let l = client
                .lease_time_to_live(h.lease, None)
                .await
                .map_err(request("reading the subnets' lease"))?;
            // Alive and of the TTL asked for (a changed --subnet-ttl takes a new lease).
            if l.ttl() > 0 && u64::try_from(l.granted_ttl()) == Ok(ttl) {
                lease = Some(h.lease);
                break;
            }
        }
        let granted = lease.is_none();
        let lease = match lease {
            Some(l) => l,
            None => client
                .lease_grant(i64::try_from(ttl).unwrap_or(i64::MAX), None)
                .await
                .map_err(request("granting the subnets' lease"))?
                .id(),
        };
        let value = record.to_json();
        let put = |s: IpNetwork| {
            let options = (lease != 0).then(|| PutOptions::new().with_lease(lease));
            TxnOp::put(subnet_key(prefix, s), value.as_str(), options)
        };
        // New keys only if absent; kept ones only if unchanged since listed (a lease that
        // expired meanwhile took them away, maybe to another node: then the next attempt
        // asks again).
        let compares: Vec<Compare> = wanted
            .iter()
            .map(|(s, kept)| {
                let key = subnet_key(prefix, *s);
                match kept {
                    Some(rev) => Compare::mod_revision(key, CompareOp::Equal, *rev),
                    None => Compare::version(key, CompareOp::Equal, 0),
                }
            })
            .collect();
        let mut ops: Vec<TxnOp> = wanted.iter().map(|(s, _)| put(*s)).collect();
        // Keys of ours not wanted any more (a family dropped, the network changed) go.
        for h in &ours {
            if !wanted.iter().any(|(s, _)| *s == h.subnet) {
                ops.push(TxnOp::delete(subnet_key(prefix, h.subnet), None));
            }
        }
        let done = client
            .txn(Txn::new().when(compares).and_then(ops))
            .await
            .map_err(request("taking the subnets"))?
            .succeeded();
        if done {
            return Ok(Membership {
                subnets: wanted.into_iter().map(|(s, _)| s).collect(),
                lease,
            });
        }
        if granted {
            // Would expire by itself; revoked so that it does not linger.
            let _ = client.lease_revoke(lease).await;
        }
        log::info!(
            "another node took a subnet chosen for {}: trying again",
            record.node
        );
    }
    Err(EtcdError::Raced)
}

/// Keeps the membership's lease alive until it expires (`Err(LeaseExpired)`) or etcd
/// cannot be reached (the other errors): renewed at a third of `ttl`.
pub async fn keep_alive(
    client: &mut Client,
    membership: &Membership,
    ttl: u64,
) -> Result<(), EtcdError> {
    if membership.lease == 0 {
        // A reservation needs no renewal.
        std::future::pending::<()>().await;
    }
    let (mut keeper, mut stream) = client
        .lease_keep_alive(membership.lease)
        .await
        .map_err(request("keeping the subnets' lease alive"))?;
    let every = Duration::from_secs((ttl / 3).max(1));
    loop {
        keeper
            .keep_alive()
            .await
            .map_err(request("keeping the subnets' lease alive"))?;
        match stream
            .message()
            .await
            .map_err(request("keeping the subnets' lease alive"))?
        {
            Some(r) if r.ttl() > 0 => {}
            _ => return Err(EtcdError::LeaseExpired),
        }
        tokio::time::sleep(every).await;
    }
}

/// Deletes the keys whose record names `node` and revokes their lease: the node's
/// subnets are free at once. Returns them.
pub async fn leave(
    client: &mut Client,
    prefix: &str,
    node: &str,
) -> Result<Vec<IpNetwork>, EtcdError> {
    let (held, _) = list(client, prefix).await?;
    let ours: Vec<&Held> = held
        .iter()
        .filter(|h| h.record.as_ref().is_some_and(|r| r.node == node))
        .collect();
    for h in &ours {
        client
            .delete(subnet_key(prefix, h.subnet), None)
            .await
            .map_err(request(format!("deleting the key of {}", h.subnet)))?;
    }
    let leases: BTreeSet<i64> = ours.iter().map(|h| h.lease).filter(|l| *l != 0).collect();
    for lease in leases {
        // Already gone is fine: the keys are.
        if let Err(e) = client.lease_revoke(lease).await {
            log::debug!("revoking lease {lease:x}: {e}");
        }
    }
    Ok(ours.iter().map(|h| h.subnet).collect())
}

/// The members as listed now (each subnet key with a record), and the listing's revision.
pub async fn members(client: &mut Client, prefix: &str) -> Result<(Members, i64), EtcdError> {
    let (held, revision) = list(client, prefix).await?;
    let members = held
        .into_iter()
        .filter_map(|h| Some((h.subnet, h.record?)))
        .collect();
    Ok((members, revision))
}

/// Follows the members from `revision` on, `members` updated by each event; `changed` is
/// called after each batch of events and every `resync` without any. Returns only when the
/// watch ends, with why: `Compacted` when etcd no longer has the revisions (then list again).
pub async fn follow(
    client: &mut Client,
    prefix: &str,
    members: &mut Members,
    revision: i64,
    resync: Duration,
    mut changed: impl FnMut(&Members),
) -> Result<std::convert::Infallible, EtcdError> {
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(revision)
        .with_progress_notify();
    let mut stream = client
        .watch(subnets_prefix(prefix), Some(options))
        .await
        .map_err(request("watching the subnets"))?;
    loop {
        let Ok(message) = tokio::time::timeout(resync, stream.message()).await else {
            changed(members);
            continue;
        };
        let Some(resp) = message.map_err(request("watching the subnets"))? else {
            return Err(EtcdError::WatchEnded);
        };
        if resp.canceled() {
            return Err(if resp.compact_revision() > 0 {
                EtcdError::Compacted(resp.compact_revision())
            } else {
                EtcdError::WatchEnded
            });
        }
        if resp.events().is_empty() {
            continue;
        }
        for event in resp.events() {
            let Some(kv) = event.kv() else { continue };
            let Some(subnet) = kv.key_str().ok().and_then(|k| subnet_of_key(prefix, k)) else {
                continue;
            };
            match event.event_type() {
                EventType::Put => match serde_json::from_slice(kv.value()) {
                    Ok(record) => {
                        members.insert(subnet, record);
                    }
                    Err(e) => {
                        log::warn!("the key of {subnet} holds no member record ({e}): skipped");
                        members.remove(&subnet);
                    }
                },
                EventType::Delete => {
                    members.remove(&subnet);
                }
            }
        }
        changed(members);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_urls_give_their_address() {
        assert_eq!(
            endpoint_addr("http://10.0.0.1:2379"),
            Some("10.0.0.1:2379".parse().unwrap())
        );
        assert_eq!(
            endpoint_addr("https://[fd00::1]:2379/"),
            Some("[fd00::1]:2379".parse().unwrap())
        );
        assert_eq!(endpoint_addr("http://etcd.example:2379"), None);
    }
}
