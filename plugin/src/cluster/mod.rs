//! The cluster network: which pod subnets this node holds, taken from a source the nodes
//! share (etcd, or the Kubernetes Node objects) and written into the node's conflist so its
//! pods get addresses from them, and a route to each peer's subnets (`routes`), brought in
//! line by one reconciler (`reconciler`) whichever the source. `ebpf-cni agent --cluster etcd` joins
//! before its first convergence, then keeps the membership alive and follows the members in
//! a thread of its own; `--leave` gives the subnets back. `--cluster kubernetes` waits for
//! its Node's pod CIDRs, then watches the Nodes (`kubernetes`). See docs/cluster.md.

pub mod conflist;
pub mod etcd;
pub mod kubernetes;
pub mod network;
mod reconciler;
pub mod routes;
pub mod tunnel;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnetwork::IpNetwork;

use self::etcd::{EtcdArgs, EtcdError, Membership};
use self::network::{MemberRecord, NetworkConfig};

/// Where the node's subnets come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Source {
    /// The conflist's own ranges; no peers.
    None,
    /// etcd (flannel's layout, see docs/cluster.md).
    Etcd,
    /// The Node objects of the Kubernetes API (their spec.podCIDRs and InternalIPs).
    Kubernetes,
}

impl Source {
    /// The source when none is given: Kubernetes in a pod with a service account (the API
    /// server's address in the environment kubelet gives every pod), else none.
    fn default_here() -> Self {
        match std::env::var_os(crate::install::settings::KUBE_HOST.env) {
            Some(h) if !h.is_empty() => Self::Kubernetes,
            _ => Self::None,
        }
    }
}

/// The agent's cluster settings.
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterArgs {
    /// Where the node's pod subnets and the cluster's members come from [default:
    /// kubernetes where KUBERNETES_SERVICE_HOST is set (a pod's environment), else none].
    #[arg(long = "cluster", env = "EBPF_CNI_CLUSTER", value_enum)]
    pub source: Option<Source>,
    /// With --cluster kubernetes: the network config (the JSON document etcd's
    /// `<prefix>/config` holds: the cluster's pod networks, the mode, the VXLAN port).
    #[arg(
        long = "network-config",
        env = "EBPF_CNI_NETWORK_CONFIG",
        value_name = "FILE"
    )]
    pub network_config: Option<PathBuf>,
    /// The node's addresses on the network between the nodes, at most one per family,
    /// comma-separated (default: its address towards the first etcd endpoint).
    #[arg(long = "node-ip", env = "EBPF_CNI_NODE_IP", value_delimiter = ',')]
    pub node_ip: Vec<IpAddr>,
    /// Give the node's subnets back (their keys deleted at once) and exit.
    #[arg(long)]
    pub leave: bool,
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// The node's name (the Kubernetes source: its Node) and the API server.
    #[command(flatten)]
    pub kube: crate::install::settings::KubeArgs,
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    #[error("--node-ip (EBPF_CNI_NODE_IP) gives two {family} addresses, {first} and {second}: one per family")]
    TwoAddresses {
        family: &'static str,
        first: IpAddr,
        second: IpAddr,
    },
    #[error(transparent)]
    Kubernetes(#[from] kubernetes::KubernetesError),
    #[error("--cluster {0} needs --conf: the conflist the node's subnets are written into")]
    NoConflist(&'static str),
    #[error("--cluster kubernetes needs --network-config (EBPF_CNI_NETWORK_CONFIG): the cluster's pod networks, the mode and the VXLAN port, as JSON")]
    NoNetworkConfig,
    #[error("reading the network config {path}")]
    ReadNetworkConfig {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the network config {path}")]
    NetworkConfig {
        path: PathBuf,
        source: network::NetworkConfigError,
    },
    #[error("the node's name: its host name cannot be read")]
    Hostname(#[source] nix::Error),
    #[error("starting the etcd client's runtime")]
    Runtime(#[source] std::io::Error),
    #[error("the cluster network's tunnel")]
    Tunnel(#[from] tunnel::TunnelError),
    #[error("writing the node's subnets into {path}")]
    Conflist {
        path: PathBuf,
        source: Box<conflist::ConflistUpdateError>,
    },
}

impl ClusterArgs {
    fn source(&self) -> Source {
        self.source.unwrap_or_else(Source::default_here)
    }

    fn network_config(&self) -> Result<NetworkConfig, ClusterError> {
        let path = self
            .network_config
            .as_ref()
            .ok_or(ClusterError::NoNetworkConfig)?;
        let text = std::fs::read(path).map_err(|source| ClusterError::ReadNetworkConfig {
            path: path.clone(),
            source,
        })?;
        NetworkConfig::parse(&text).map_err(|source| ClusterError::NetworkConfig {
            path: path.clone(),
            source,
        })
    }

    fn node_name(&self) -> Result<String, ClusterError> {
        match &self.kube.node_name {
            Some(n) if !n.is_empty() => Ok(n.clone()),
            _ => Ok(nix::unistd::gethostname()
                .map_err(ClusterError::Hostname)?
                .to_string_lossy()
                .into_owned()),
        }
    }

    fn record(&self, node: String) -> Result<MemberRecord, ClusterError> {
        let addrs = if self.node_ip.is_empty() {
            vec![self.etcd.node_address()?]
        } else {
            self.node_ip.clone()
        };
        record_of(node, &addrs)
    }
}

/// `node`'s record with `addrs`, at most one per family.
fn record_of(node: String, addrs: &[IpAddr]) -> Result<MemberRecord, ClusterError> {
    let mut record = MemberRecord {
        node,
        public_ip: None,
        public_ipv6: None,
    };
    for &a in addrs {
        let (family, first) = match (a, record.public_ip, record.public_ipv6) {
            (IpAddr::V4(v4), None, _) => {
                record.public_ip = Some(v4);
                continue;
            }
            (IpAddr::V6(v6), _, None) => {
                record.public_ipv6 = Some(v6);
                continue;
            }
            (IpAddr::V4(_), Some(f), _) => ("IPv4", IpAddr::V4(f)),
            (IpAddr::V6(_), _, Some(f)) => ("IPv6", IpAddr::V6(f)),
        };
        return Err(ClusterError::TwoAddresses {
            family,
            first,
            second: a,
        });
    }
    Ok(record)
}

fn runtime() -> Result<tokio::runtime::Runtime, ClusterError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ClusterError::Runtime)
}

/// `agent --leave`: deletes the node's keys; the subnets they held.
pub fn leave(args: &ClusterArgs) -> Result<Vec<IpNetwork>, ClusterError> {
    let node = args.node_name()?;
    runtime()?.block_on(async {
        let mut client = args.etcd.connect().await?;
        Ok(etcd::leave(&mut client, &args.etcd.prefix, &node).await?)
    })
}

pub use self::reconciler::AfterRoutes;
use self::reconciler::Reconciler;

/// Joins the cluster (nothing without a source), writes the node's subnets into the
/// conflist at `conf`, and keeps the membership alive in a thread of its own, which, in
/// the calling thread's network namespace, follows a lease that expired (the same subnets
/// asked for again) and an etcd that cannot be reached (nothing changes meanwhile), and
/// calls `after_routes` each time the peer routes changed.
pub fn start(
    args: &ClusterArgs,
    conf: Option<&Path>,
    after_routes: AfterRoutes,
) -> Result<(), ClusterError> {
    match args.source() {
        Source::None => Ok(()),
        Source::Etcd => start_etcd(
            args,
            conf.ok_or(ClusterError::NoConflist("etcd"))?,
            after_routes,
        ),
        Source::Kubernetes => start_kubernetes(
            args,
            conf.ok_or(ClusterError::NoConflist("kubernetes"))?,
            after_routes,
        ),
    }
}

fn start_etcd(
    args: &ClusterArgs,
    conf: &Path,
    after_routes: AfterRoutes,
) -> Result<(), ClusterError> {
    let conf = conf.to_owned();
    args.etcd.validate()?;
    let node = args.node_name()?;
    let record = args.record(node.clone())?;
    let rt = runtime()?;
    let prefix = args.etcd.prefix.clone();
    let ttl = args.etcd.ttl;
    let preferred = conflist::current_subnets(&conf);
    // An etcd that cannot serve yet (unreachable, electing a leader) is waited for, as
    // its outages later are; a missing config or a full network ends the agent.
    let (mut client, config, membership) = rt.block_on(async {
        let mut backoff = Duration::from_secs(1);
        loop {
            let joined = async {
                let mut client = args.etcd.connect().await?;
                let config = etcd::network_config(&mut client, &prefix).await?;
                let m = etcd::join(&mut client, &prefix, &config, &record, &preferred, ttl).await?;
                Ok::<_, EtcdError>((client, config, m))
            };
            match joined.await {
                Err(e) if e.is_transient() => {
                    back_off(&mut backoff, "joining the cluster network", &e).await
                }
                other => return other,
            }
        }
    })?;
    let tunnel = bring_up(&config, &record, &membership.subnets, &conf)?;
    log::info!(
        "node {node} holds {} in the cluster network (etcd, lease {:x})",
        list(&membership.subnets),
        membership.lease
    );
    let args = args.clone();
    std::thread::Builder::new()
        .name("etcd".into())
        .spawn(move || {
            let held = Held {
                args: &args,
                prefix: &prefix,
                config: &config,
                record: &record,
                ttl,
                conf: &conf,
                tunnel: tunnel.as_ref(),
                after_routes,
            };
            rt.block_on(hold(&held, &mut client, membership))
        })
        .map_err(ClusterError::Runtime)?;
    Ok(())
}

/// The tunnel device (where the mode has one) and the node's subnets in the conflist.
/// The device comes first, since the conflist's MTU is the tunnel's: a port another
/// device holds ends the agent here, naming it.
fn bring_up(
    config: &NetworkConfig,
    record: &MemberRecord,
    subnets: &[IpNetwork],
    conf: &Path,
) -> Result<Option<tunnel::TunnelSpec>, ClusterError> {
    let tunnel = match config.mode {
        network::Mode::Direct => None,
        network::Mode::Auto | network::Mode::Overlay => {
            let nl = crate::netlink::Netlink::connect().map_err(tunnel::TunnelError::from)?;
            let spec = tunnel::TunnelSpec {
                port: config.vxlan_port,
                udp_csum: config.vxlan_udp_checksum,
                underlay_mtu: crate::block_on(tunnel::mtu_of(
                    &nl,
                    record
                        .public_ip
                        .map(IpAddr::V4)
                        .or(record.public_ipv6.map(IpAddr::V6)),
                )),
                ipv6_underlay: record.public_ipv6.is_some(),
                addresses: tunnel::addresses_of(subnets),
            };
            crate::block_on(tunnel::ensure(&nl, &spec))?;
            log::info!(
                "tunnel {} up: VXLAN on UDP {}, MTU {}",
                crate::bpf::tunnel::TUNNEL_DEVICE,
                spec.port,
                spec.mtu()
            );
            Some(spec)
        }
    };
    write_conflist(conf, subnets, &config.networks(), tunnel.map(|t| t.mtu()))?;
    Ok(tunnel)
}

/// How often a node whose Node object has no pod CIDRs yet is read again.
const OWN_NODE_POLL: Duration = Duration::from_secs(2);

fn start_kubernetes(
    args: &ClusterArgs,
    conf: &Path,
    after_routes: AfterRoutes,
) -> Result<(), ClusterError> {
    let conf = conf.to_owned();
    let kube = args
        .kube
        .validate_for("needed by --cluster kubernetes (EBPF_CNI_CLUSTER)")
        .map_err(kubernetes::KubernetesError::from)?;
    let config = args.network_config()?;
    let rt = runtime()?;
    // kube's client starts its tasks on the runtime it is made in.
    let client = {
        let _in = rt.enter();
        crate::kube_client::client(
            &crate::install::kube::api_server(&kube),
            crate::kube_client::Token::File(kube.token_file.clone()),
        )
        .map_err(kubernetes::KubernetesError::from)?
    };
    let node = kube.node_name.clone();
    // The API server unreachable, or the Node without pod CIDRs yet (the controller
    // manager allocates them): waited for, saying why.
    let (subnets, record) = rt.block_on(async {
        let mut backoff = Duration::from_secs(1);
        let mut said = None;
        loop {
            match kubernetes::own_view(&client, &node).await {
                Ok(kubernetes::View::Member { subnets, record }) => {
                    return Ok::<_, ClusterError>((subnets, record))
                }
                Ok(kubernetes::View::Skipped(why)) => {
                    if said.as_ref() != Some(&why) {
                        log::warn!("node {node} has no pod subnet to take: {why}; waiting");
                    }
                    said = Some(why);
                    tokio::time::sleep(OWN_NODE_POLL).await;
                }
                Err(e) if e.is_transient() => {
                    back_off(&mut backoff, "reading the node's pod CIDRs", &e).await
                }
                Err(e) => return Err(e.into()),
            }
        }
    })?;
    let record = if args.node_ip.is_empty() {
        record
    } else {
        record_of(node.clone(), &args.node_ip)?
    };
    let tunnel = bring_up(&config, &record, &subnets, &conf)?;
    log::info!(
        "node {node} holds {} in the cluster network (Kubernetes)",
        list(&subnets)
    );
    std::thread::Builder::new()
        .name("kubernetes".into())
        .spawn(move || {
            let mut reconciler =
                match Reconciler::new(&node, config.mode, tunnel.as_ref(), &conf, after_routes) {
                    Ok(r) => r,
                    Err(e) => {
                        log::error!("the peer routes: {}", crate::cni::error::chain(&e));
                        return;
                    }
                };
            let networks = config.networks();
            let max_mtu = tunnel.map(|t| t.mtu());
            let mut held = subnets;
            let own_changed = |v: &kubernetes::View| {
                if let kubernetes::View::Member { subnets, .. } = v {
                    if *subnets != held {
                        log::warn!(
                            "node {node}'s pod CIDRs are {} now (were {}): new pods get addresses from them",
                            list(subnets),
                            list(&held)
                        );
                        if let Err(e) = write_conflist(&conf, subnets, &networks, max_mtu) {
                            log::error!("{}", crate::cni::error::chain(&e));
                        }
                        held.clone_from(subnets);
                    }
                }
            };
            rt.block_on(kubernetes::follow(
                client,
                &node,
                &mut reconciler,
                ROUTE_RESYNC,
                own_changed,
            ));
        })
        .map_err(ClusterError::Runtime)?;
    Ok(())
}

fn write_conflist(
    conf: &Path,
    subnets: &[IpNetwork],
    networks: &[IpNetwork],
    max_mtu: Option<u32>,
) -> Result<(), ClusterError> {
    if conflist::write_subnets(conf, subnets, networks, max_mtu).map_err(|source| {
        ClusterError::Conflist {
            path: conf.to_owned(),
            source: Box::new(source),
        }
    })? {
        log::info!(
            "{} gives pods addresses from {}",
            conf.display(),
            list(subnets)
        );
    }
    Ok(())
}

fn list(subnets: &[IpNetwork]) -> String {
    subnets
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" and ")
}

/// How often the peer routes are compared with the kernel's without any event (a route
/// someone deleted, a link that came back), as flannel's route check does every 10 s.
const ROUTE_RESYNC: Duration = Duration::from_secs(10);

/// The membership renewed and the members followed, until the process ends.
/// What holding the membership needs besides the connection.
#[derive(Clone, Copy)]
struct Held<'a> {
    args: &'a ClusterArgs,
    prefix: &'a str,
    config: &'a NetworkConfig,
    record: &'a MemberRecord,
    ttl: u64,
    /// The conflist the node's subnets are written into.
    conf: &'a Path,
    /// The tunnel's settings (mode `direct`: none).
    tunnel: Option<&'a tunnel::TunnelSpec>,
    /// Called with `conf` after the peer routes changed.
    after_routes: AfterRoutes,
}

async fn hold(held: &Held<'_>, client: &mut etcd_client::Client, membership: Membership) {
    let mut watcher = client.clone();
    tokio::join!(
        renew(held, client, membership),
        follow_members(held, &mut watcher),
    );
}

/// After an error: `client` replaced by a connection to the next member that answers (it
/// stays as it is when none does; the next error tries again).
async fn reconnect(etcd: &EtcdArgs, client: &mut etcd_client::Client) {
    match etcd.connect().await {
        Ok(c) => *client = c,
        Err(e) => log::debug!("{}", crate::cni::error::chain(&e)),
    }
}

/// The members listed, then followed; each change brought into the peer routes. When etcd
/// cannot be reached the routes stay as they are; after a compaction, the members are
/// listed again.
async fn follow_members(held: &Held<'_>, client: &mut etcd_client::Client) {
    let (etcd, prefix, own) = (&held.args.etcd, held.prefix, held.record.node.as_str());
    let mut reconciler = match Reconciler::new(
        own,
        held.config.mode,
        held.tunnel,
        held.conf,
        held.after_routes,
    ) {
        Ok(r) => r,
        Err(e) => {
            log::error!("the peer routes: {}", crate::cni::error::chain(&e));
            return;
        }
    };
    let mut apply = |members: &routes::Members| {
        reconciler.apply(members);
    };
    let mut backoff = Duration::from_secs(1);
    loop {
        let e = match etcd::members(client, prefix).await {
            Ok((mut members, revision)) => {
                apply(&members);
                backoff = Duration::from_secs(1);
                let Err(e) = etcd::follow(
                    client,
                    prefix,
                    &mut members,
                    revision + 1,
                    ROUTE_RESYNC,
                    &mut apply,
                )
                .await;
                e
            }
            Err(e) => e,
        };
        if let EtcdError::Compacted(rev) = e {
            log::info!("the subnets' history was compacted (revision {rev}): listing them again");
            continue;
        }
        back_off(&mut backoff, "following the members (the routes stay)", &e).await;
        reconnect(etcd, client).await;
    }
}

/// The membership's life after the join: renewed until killed, and its record rewritten
/// when the node's address moves (the peers route to the new one).
async fn renew(held: &Held<'_>, client: &mut etcd_client::Client, mut membership: Membership) {
    let Held {
        args,
        prefix,
        config,
        record,
        ttl,
        conf,
        ..
    } = *held;
    let etcd = &args.etcd;
    let mut record = record.clone();
    let mut backoff = Duration::from_secs(1);
    loop {
        let woke = tokio::select! {
            kept = etcd::keep_alive(client, &membership, ttl) => Woke::Kept(kept),
            now = moved(args, &record) => Woke::Moved(now),
        };
        match woke {
            Woke::Kept(Ok(())) => continue,
            Woke::Kept(Err(EtcdError::LeaseExpired)) => {
                log::warn!("the lease of the node's subnets expired: asking for them again");
            }
            // The dataplane and the conflist stay as they are while etcd is away.
            Woke::Kept(Err(e)) => {
                back_off(&mut backoff, "the node's membership", &e).await;
                reconnect(etcd, client).await;
            }
            Woke::Moved(now) => {
                log::info!(
                    "the node's address moved: its subnets' keys say {} now",
                    now.to_json()
                );
                record = now;
                // The connection may have left from the address that went.
                reconnect(etcd, client).await;
            }
        }
        match etcd::join(client, prefix, config, &record, &membership.subnets, ttl).await {
            Ok(m) => {
                backoff = Duration::from_secs(1);
                if m.subnets != membership.subnets {
                    log::error!(
                        "the node's subnets {} went to another node while its lease was expired: \
                         it holds {} now, new pods get addresses from them",
                        list(&membership.subnets),
                        list(&m.subnets)
                    );
                    if let Err(e) = write_conflist(
                        conf,
                        &m.subnets,
                        &config.networks(),
                        held.tunnel.map(|t| t.mtu()),
                    ) {
                        log::error!("{}", crate::cni::error::chain(&e));
                    }
                }
                membership = m;
            }
            Err(e) => {
                back_off(&mut backoff, "the node's membership", &e).await;
                reconnect(etcd, client).await;
            }
        }
    }
}

/// What woke [`renew`].
enum Woke {
    /// The lease's renewal ended (only with an error, or a lease that expired).
    Kept(Result<(), EtcdError>),
    /// The node's record with its new address.
    Moved(MemberRecord),
}

/// How often the node's own address is looked at: one route lookup, no packet sent.
const ADDRESS_CHECK: Duration = Duration::from_secs(1);

/// Returns the node's record once its address differs from `record`'s (never where
/// `--node-ip` gives it).
async fn moved(args: &ClusterArgs, record: &MemberRecord) -> MemberRecord {
    if !args.node_ip.is_empty() {
        return std::future::pending().await;
    }
    loop {
        tokio::time::sleep(ADDRESS_CHECK).await;
        match args.record(record.node.clone()) {
            Ok(now) if now != *record => return now,
            Ok(_) => {}
            Err(e) => log::debug!("the node's address: {}", crate::cni::error::chain(&e)),
        }
    }
}

/// Says `e` about `what` and waits `backoff`, which doubles up to 30 s.
async fn back_off(backoff: &mut Duration, what: &str, e: &(dyn std::error::Error + 'static)) {
    log::warn!(
        "{what}: {}: trying again in {} s",
        crate::cni::error::chain(e),
        backoff.as_secs()
    );
    tokio::time::sleep(*backoff).await;
    *backoff = (*backoff * 2).min(Duration::from_secs(30));
}
