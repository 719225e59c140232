//! A real etcd cluster (Debian's `/usr/bin/etcd`, 3.4) for the cluster-network tests: N
//! members, each in a network namespace of its own, on one bridge in a "LAN" namespace, to
//! which test nodes (other namespaces) are attached ([`EtcdCluster::attach`]) to reach them.
//!
//! The LAN is `10.250.0.0/24`: the bridge (`br0`, in the LAN namespace) is `10.250.0.254`,
//! member `i` (named `m<i>`, device `eth0` in its namespace, `m<i>` on the bridge) is
//! `10.250.0.(10+i)`, clients on port 2379 and peers on 2380, and an attached host `h`
//! `10.250.0.<h>` (`h<h>` on the bridge). Every cluster has a LAN of its own, so clusters of
//! tests running at the same time use the same addresses without meeting; the namespaces'
//! names are the harness's unique ones ([`Netns::create`], role `n`: the LAN and the members
//! are hosts, not pods).
//!
//! The members' data directories and logs (`m<i>.log`, etcd's stdout and stderr, zap's JSON
//! lines) are in a temporary directory the cluster owns, `ecni-etcd-<pid>-*`; the errors of
//! [`EtcdCluster::start`] and [`EtcdCluster::restart`] end with the members' log tails, and
//! [`EtcdCluster::log`] reads a whole log. Timings are short for tests (heartbeat 100 ms,
//! election timeout 1 s): a 3-member cluster is healthy about 3 s after it starts, a new
//! leader is elected about 1 s after the old one dies.
//!
//! [`EtcdCluster::start_tls`] serves clients over TLS with certificates made for the test
//! (the CA, the members' and a client's, in the cluster's directory), and
//! [`EtcdCluster::enable_auth`] turns etcd's password authentication on.
//!
//! Dropping the cluster kills its members (SIGKILL, waited for) and removes its namespaces
//! (with them the veths, attached nodes' too) and its directory. The members of a test process
//! that was itself killed are reaped, with their directories, when a harness process next
//! starts a cluster (as [`crate::netns::reap_stale`] does for namespaces).

use std::fs::OpenOptions;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde::Deserialize;
use tempfile::TempDir;

use crate::netns::Netns;

/// The etcd server the members run (Debian's etcd-server).
pub const ETCD_BIN: &str = "/usr/bin/etcd";
/// The client (Debian's etcd-client), always with the v3 API.
pub const ETCDCTL_BIN: &str = "/usr/bin/etcdctl";
/// The bridge's address in the LAN namespace; the LAN is its /24.
pub const LAN_BRIDGE_IP: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 254);
/// The bridge's MAC address (see [`make_lan`]).
const LAN_BRIDGE_MAC: &str = "02:00:0a:fa:00:fe";
/// The network behind the LAN namespace acting as a router ([`EtcdCluster::attach_routed`]).
pub const ROUTED_NET: &str = "10.251.0.0/16";
/// The bridge's name in the LAN namespace.
pub const LAN_BRIDGE: &str = "br0";
/// Member `i` is `10.250.0.(MEMBER_HOST_BASE + i)`.
pub const MEMBER_HOST_BASE: u8 = 10;
/// The members' client port.
pub const CLIENT_PORT: u16 = 2379;
/// The members' peer port.
pub const PEER_PORT: u16 = 2380;
/// How long [`EtcdCluster::start`] and [`EtcdCluster::restart`] wait for health.
pub const HEALTHY_WITHIN: Duration = Duration::from_secs(30);
/// How long [`EtcdCluster::leader`] waits for the running members to agree on a leader.
pub const LEADER_WITHIN: Duration = Duration::from_secs(15);

/// Heartbeat interval and election timeout, ms (etcd's defaults are the same 100 and 1000;
/// given explicitly so a changed default does not change the tests).
const HEARTBEAT_MS: &str = "100";
const ELECTION_MS: &str = "1000";
/// etcdctl's bounds on every call, so nothing waits for a dead member for ever.
const DIAL_TIMEOUT: &str = "2s";
const COMMAND_TIMEOUT: &str = "5s";
/// The temporary directory's prefix; the owner's pid follows it.
const DIR_PREFIX: &str = "ecni-etcd-";
/// Lines of each member's log in an error.
const LOG_TAIL_LINES: usize = 25;

static REAP: Once = Once::new();

/// A client's TLS files (PEM) for a cluster started with [`EtcdCluster::start_tls`].
#[derive(Debug, Clone)]
pub struct ClientTls {
    /// The CA that signed the members' certificate and the client's.
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A running etcd cluster on a LAN of its own (see the module docs); torn down on drop.
#[derive(Debug)]
pub struct EtcdCluster {
    /// The client side's TLS (clients then use `https://` and must show a certificate).
    tls: Option<ClientTls>,
    /// `user:password` etcdctl logs in with once [`EtcdCluster::enable_auth`] ran.
    user: Option<String>,
    members: Vec<Member>,
    lan: Netns,
    /// `--initial-cluster`: `m0=http://10.250.0.10:2380,...`.
    initial_cluster: String,
    token: String,
    /// Member ids (`header.member_id`), by index.
    ids: Vec<u64>,
    dir: TempDir,
}

#[derive(Debug)]
struct Member {
    netns: Netns,
    ip: Ipv4Addr,
    /// None once killed.
    child: Option<Child>,
}

impl EtcdCluster {
    /// Starts `members` members (1..=100) on a new LAN with `--initial-cluster-state new`
    /// and returns once every one is healthy (`etcdctl endpoint health`, within
    /// [`HEALTHY_WITHIN`]); otherwise fails with the members' log tails. Requires root.
    pub fn start(members: usize) -> Result<Self> {
        Self::start_with(members, false)
    }

    /// [`EtcdCluster::start`] with TLS on the client port: the members' certificate (for
    /// their addresses) and a client certificate, signed by a CA the cluster makes; the
    /// members take only clients showing a certificate of that CA (`--client-cert-auth`).
    /// The peers keep plain HTTP.
    pub fn start_tls(members: usize) -> Result<Self> {
        Self::start_with(members, true)
    }

    fn start_with(members: usize, tls: bool) -> Result<Self> {
        crate::require_root();
        ensure!(
            (1..=100).contains(&members),
            "an etcd cluster of {members} members: 1..=100 fit the LAN"
        );
        REAP.call_once(reap_stale);
        let (pid, n) = crate::netns::unique_parts();
        let dir = tempfile::Builder::new()
            .prefix(&format!("{DIR_PREFIX}{pid}-"))
            .tempdir()
            .context("creating the etcd cluster's directory")?;
        let lan = make_lan()?;
        let mut cluster = Self {
            tls: None,
            user: None,
            members: Vec::with_capacity(members),
            lan,
            initial_cluster: String::new(),
            token: format!("ecni-etcd-{pid}-{n}"),
            ids: Vec::new(),
            dir,
        };
        for i in 0..members {
            let host = MEMBER_HOST_BASE + u8::try_from(i).context("member index")?;
            let ip = Ipv4Addr::new(10, 250, 0, host);
            let netns = Netns::create("n")?;
            let bridge_end = member_name(i);
            plug(&cluster.lan, &netns, "eth0", &bridge_end, ip)?;
            cluster.members.push(Member {
                netns,
                ip,
                child: None,
            });
        }
        if tls {
            let ips: Vec<Ipv4Addr> = cluster.members.iter().map(|m| m.ip).collect();
            cluster.tls = Some(make_tls(cluster.dir.path(), &ips)?);
        }
        cluster.initial_cluster = cluster
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| format!("{}=http://{}:{PEER_PORT}", member_name(i), m.ip))
            .collect::<Vec<_>>()
            .join(",");
        for i in 0..members {
            cluster.spawn(i, "new")?;
        }
        let all: Vec<usize> = (0..members).collect();
        cluster.wait_healthy(&all, HEALTHY_WITHIN)?;
        let statuses = cluster.statuses(&all)?;
        for ep in cluster.endpoints() {
            let st = statuses
                .iter()
                .find(|s| s.endpoint == ep)
                .with_context(|| format!("no status from {ep}: {statuses:?}"))?;
            ensure!(st.status.header.member_id != 0, "{ep} has no member id");
            cluster.ids.push(st.status.header.member_id);
        }
        Ok(cluster)
    }

    /// How many members the cluster has (killed ones included).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no members (never: [`EtcdCluster::start`] makes at least one).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Every member's client URL, by index (killed ones included):
    /// `http://10.250.0.10:2379`, ... (`https://` with TLS).
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("{}://{}:{CLIENT_PORT}", self.scheme(), m.ip))
            .collect()
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// The client's TLS files, for a cluster started with [`EtcdCluster::start_tls`].
    pub fn client_tls(&self) -> Option<&ClientTls> {
        self.tls.as_ref()
    }

    /// Turns etcd's authentication on with the user `root` and `password` (etcdctl logs in
    /// as it from then on). With TLS, etcd takes the client certificate's name as the user
    /// instead: use a cluster without.
    pub fn enable_auth(&mut self, password: &str) -> Result<()> {
        self.etcdctl(&["user", "add", &format!("root:{password}")])?;
        self.etcdctl(&["auth", "enable"])?;
        self.user = Some(format!("root:{password}"));
        Ok(())
    }

    /// etcdctl's flags for this cluster's TLS and user.
    fn client_flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        if let Some(t) = &self.tls {
            for (flag, path) in [("--cacert", &t.ca), ("--cert", &t.cert), ("--key", &t.key)] {
                flags.push(format!("{flag}={}", path.display()));
            }
        }
        if let Some(u) = &self.user {
            flags.push(format!("--user={u}"));
        }
        flags
    }

    /// [`EtcdCluster::endpoints`] comma-joined, as `--endpoints` and most clients take them.
    pub fn endpoints_arg(&self) -> String {
        self.endpoints().join(",")
    }

    /// Member `i`'s address on the LAN.
    pub fn member_ip(&self, i: usize) -> Ipv4Addr {
        self.members[i].ip
    }

    /// Member `i`'s namespace.
    pub fn member_netns(&self, i: usize) -> &Netns {
        &self.members[i].netns
    }

    /// The LAN's namespace (the bridge, `10.250.0.254`).
    pub fn lan(&self) -> &Netns {
        &self.lan
    }

    /// The directory holding the members' data directories and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Whether member `i` runs (was not killed, or was restarted since).
    pub fn is_running(&self, i: usize) -> bool {
        self.members[i].child.is_some()
    }

    /// Member `i`'s log so far (etcd's stdout and stderr, every run of it).
    pub fn log(&self, i: usize) -> Result<String> {
        let path = self.log_path(i);
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    }

    /// Attaches `ns` to the LAN: a veth named `ifname` in `ns` (`h<host>` on the bridge),
    /// addressed `10.250.0.<host>/24` and up; returns the address once `ns` reaches the
    /// bridge's address (ping, within 5 s). `host` must be 1..=253 and not a member's.
    pub fn attach(&self, ns: &Netns, ifname: &str, host: u8) -> Result<Ipv4Addr> {
        ensure!(
            (1..=253).contains(&host),
            "LAN host number {host} out of 1..=253"
        );
        let members = MEMBER_HOST_BASE..MEMBER_HOST_BASE.saturating_add(self.len() as u8);
        ensure!(
            !members.contains(&host),
            "LAN host number {host} is a member's ({members:?})"
        );
        attach_host(&self.lan, ns, ifname, host)
    }

    /// Attaches `ns` behind the LAN namespace, which routes between the two: a veth named
    /// `ifname` in `ns` addressed `10.251.<host>.2/24` with its default route via
    /// `10.251.<host>.1` (the LAN namespace's end), forwarding on there, and the members
    /// given a route to [`ROUTED_NET`] via the bridge's address. A node on the LAN reaches
    /// it only through that gateway once it has the same route ([`Self::route_to_routed`]).
    /// Returns the address once `ns` reaches a member (ping, within 5 s).
    pub fn attach_routed(&self, ns: &Netns, ifname: &str, host: u8) -> Result<Ipv4Addr> {
        let ip = plug_routed(&self.lan, ns, ifname, host)?;
        for m in &self.members {
            Self::route_to_routed(&m.netns)?;
        }
        let member = self.member_ip(0).to_string();
        reaches(
            ns,
            &member,
            &format!("the member {member} through the LAN namespace"),
        )?;
        Ok(ip)
    }

    /// Gives `ns` (on the LAN) its route to [`ROUTED_NET`] via the bridge's address; a
    /// second call changes nothing.
    pub fn route_to_routed(ns: &Netns) -> Result<()> {
        ns.ip_ok(&[
            "route",
            "replace",
            ROUTED_NET,
            "via",
            &LAN_BRIDGE_IP.to_string(),
        ])?;
        Ok(())
    }

    /// `etcdctl --endpoints <all members> <args>` (v3 API) in the LAN namespace; returns its
    /// stdout, or fails with its stderr.
    pub fn etcdctl(&self, args: &[&str]) -> Result<String> {
        self.etcdctl_in(&self.lan, args)
    }

    /// [`EtcdCluster::etcdctl`] run in `ns` instead (a node [`EtcdCluster::attach`]ed to the
    /// LAN, say): what a client there sees.
    pub fn etcdctl_in(&self, ns: &Netns, args: &[&str]) -> Result<String> {
        etcdctl(
            ns,
            &self.endpoints_arg(),
            COMMAND_TIMEOUT,
            &self.client_flags(),
            args,
        )
    }

    /// [`EtcdCluster::etcdctl`] against member `i` alone (`--endpoints` its URL only).
    pub fn etcdctl_member(&self, i: usize, args: &[&str]) -> Result<String> {
        let ep = self
            .endpoints()
            .into_iter()
            .nth(i)
            .with_context(|| format!("no member {i}"))?;
        etcdctl(&self.lan, &ep, COMMAND_TIMEOUT, &self.client_flags(), args)
    }

    /// Every key starting with `prefix` and its value, in key order (`get --prefix -w json`;
    /// keys and values must be UTF-8).
    pub fn get_prefix(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let out = self.etcdctl(&["get", "--prefix", "-w", "json", "--", prefix])?;
        let resp: RangeResponse =
            serde_json::from_str(&out).with_context(|| format!("etcdctl get said {out:?}"))?;
        resp.kvs
            .iter()
            .map(|kv| -> Result<(String, String)> {
                Ok((decode_utf8(&kv.key)?, decode_utf8(&kv.value)?))
            })
            .collect()
    }

    /// The value of `key`, if it exists.
    pub fn get(&self, key: &str) -> Result<Option<String>> {
        let out = self.etcdctl(&["get", "-w", "json", "--", key])?;
        let resp: RangeResponse =
            serde_json::from_str(&out).with_context(|| format!("etcdctl get said {out:?}"))?;
        match resp.kvs.as_slice() {
            [] => Ok(None),
            [kv] => Ok(Some(decode_utf8(&kv.value)?)),
            more => bail!("get {key:?} returned {} keys", more.len()),
        }
    }

    /// Sets `key` to `value`.
    pub fn put(&self, key: &str, value: &str) -> Result<()> {
        let out = self.etcdctl(&["put", "--", key, value])?;
        ensure!(out.trim() == "OK", "etcdctl put {key:?} said {out:?}");
        Ok(())
    }

    /// Deletes `key`; returns how many keys were deleted (0 or 1).
    pub fn del(&self, key: &str) -> Result<u64> {
        let out = self.etcdctl(&["del", "--", key])?;
        out.trim()
            .parse()
            .with_context(|| format!("etcdctl del {key:?} said {out:?}"))
    }

    /// The index of the current leader, once every running member reports the same leader
    /// and it is a running member (within [`LEADER_WITHIN`]): right after the leader was
    /// killed, this waits for the new one.
    pub fn leader(&self) -> Result<usize> {
        let running: Vec<usize> = (0..self.len()).filter(|&i| self.is_running(i)).collect();
        ensure!(!running.is_empty(), "no member of the cluster runs");
        let deadline = Instant::now() + LEADER_WITHIN;
        loop {
            let seen = self.statuses(&running);
            if let Ok(statuses) = &seen {
                let leaders: Vec<u64> = statuses.iter().map(|s| s.status.leader).collect();
                let agreed = leaders.len() == running.len()
                    && leaders.windows(2).all(|w| w[0] == w[1])
                    && leaders[0] != 0;
                if agreed {
                    if let Some(i) = self.ids.iter().position(|&id| id == leaders[0]) {
                        if self.is_running(i) {
                            return Ok(i);
                        }
                    }
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the running members {running:?} (ids {:?}) did not agree on a running \
                     leader within {LEADER_WITHIN:?}; last seen: {seen:?}",
                    self.ids
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Kills member `i` (SIGKILL) and waits for it to exit; its data directory stays, for
    /// [`EtcdCluster::restart`].
    pub fn kill(&mut self, i: usize) -> Result<()> {
        let m = self
            .members
            .get_mut(i)
            .with_context(|| format!("no member {i}"))?;
        let mut child = m
            .child
            .take()
            .with_context(|| format!("member {i} is not running"))?;
        child
            .kill()
            .with_context(|| format!("killing member {i}"))?;
        child
            .wait()
            .with_context(|| format!("waiting for member {i} to exit"))?;
        Ok(())
    }

    /// Starts killed member `i` again on its data directory (`--initial-cluster-state
    /// existing`) and waits until it is healthy (within [`HEALTHY_WITHIN`]).
    pub fn restart(&mut self, i: usize) -> Result<()> {
        ensure!(i < self.len(), "no member {i}");
        ensure!(!self.is_running(i), "member {i} is running");
        self.spawn(i, "existing")?;
        self.wait_healthy(&[i], HEALTHY_WITHIN)
    }

    /// Compacts the key space to the current revision; returns that revision. Compacting
    /// again with nothing written since is not an error.
    pub fn compact(&self) -> Result<i64> {
        // Any key's response carries the current revision (3.4's get has no --count-only).
        let out = self.etcdctl(&["get", "-w", "json", "--", "/"])?;
        let resp: RangeResponse =
            serde_json::from_str(&out).with_context(|| format!("etcdctl get said {out:?}"))?;
        let rev = resp.header.revision;
        ensure!(rev > 0, "the cluster reported revision {rev}");
        match self.etcdctl(&["compact", &rev.to_string()]) {
            Ok(_) => Ok(rev),
            Err(e) if format!("{e:#}").contains("required revision has been compacted") => Ok(rev),
            Err(e) => Err(e),
        }
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("{}.log", member_name(i)))
    }

    /// Starts member `i`'s etcd in its namespace, its output appended to its log.
    fn spawn(&mut self, i: usize, state: &str) -> Result<()> {
        let name = member_name(i);
        let log_path = self.log_path(i);
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        writeln!(
            log,
            "--- harness: starting {name} (--initial-cluster-state {state}) ---"
        )
        .with_context(|| format!("writing {}", log_path.display()))?;
        let stderr = log.try_clone().context("the log's second handle")?;
        let data_dir = self.dir.path().join(format!("{name}.data"));
        let scheme = self.scheme();
        let tls = self.tls.is_some();
        let dir = self.dir.path().to_owned();
        let m = &mut self.members[i];
        let client = format!("{scheme}://{}:{CLIENT_PORT}", m.ip);
        let peer = format!("http://{}:{PEER_PORT}", m.ip);
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", m.netns.path().display()))
            .arg("--")
            .arg(ETCD_BIN);
        if tls {
            cmd.arg(format!("--cert-file={}", dir.join(SERVER_CERT).display()))
                .arg(format!("--key-file={}", dir.join(SERVER_KEY).display()))
                .arg(format!("--trusted-ca-file={}", dir.join(CA_CERT).display()))
                .arg("--client-cert-auth");
        }
        cmd.args(["--name", &name])
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", &self.token])
            .args(["--heartbeat-interval", HEARTBEAT_MS])
            .args(["--election-timeout", ELECTION_MS])
            // zap: capnslog, 3.4's default, is deprecated (and gone in 3.5).
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr);
        scrub_env(&mut cmd, "ETCD_");
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {ETCD_BIN} for {name}"))?;
        m.child = Some(child);
        Ok(())
    }

    /// Waits until the members `which` are all healthy; fails early if one exits.
    fn wait_healthy(&mut self, which: &[usize], bound: Duration) -> Result<()> {
        let eps = self.endpoints();
        let which_eps: Vec<&str> = which.iter().map(|&i| eps[i].as_str()).collect();
        let which_eps = which_eps.join(",");
        let deadline = Instant::now() + bound;
        loop {
            for &i in which {
                let exited = match self.members[i].child.as_mut() {
                    Some(c) => c.try_wait().context("polling a member")?,
                    None => bail!("member {i} is not running"),
                };
                if let Some(status) = exited {
                    self.members[i].child = None;
                    bail!(
                        "etcd member {i} exited ({status}) before it was healthy\n{}",
                        self.log_tails()
                    );
                }
            }
            let health = etcdctl(
                &self.lan,
                &which_eps,
                "2s",
                &self.client_flags(),
                &["endpoint", "health", "--dial-timeout", "1s"],
            );
            let err = match health {
                Ok(_) => return Ok(()),
                Err(e) => e,
            };
            if Instant::now() > deadline {
                bail!(
                    "etcd members {which:?} not healthy within {bound:?}: {err:#}\n{}",
                    self.log_tails()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `endpoint status` of the members `which`.
    fn statuses(&self, which: &[usize]) -> Result<Vec<EndpointStatus>> {
        let eps = self.endpoints();
        let which_eps: Vec<&str> = which.iter().map(|&i| eps[i].as_str()).collect();
        let out = etcdctl(
            &self.lan,
            &which_eps.join(","),
            COMMAND_TIMEOUT,
            &self.client_flags(),
            &["endpoint", "status", "-w", "json"],
        )?;
        serde_json::from_str(&out).with_context(|| format!("etcdctl endpoint status said {out:?}"))
    }

    /// The last lines of every member's log, for errors.
    fn log_tails(&self) -> String {
        let mut s = String::new();
        for i in 0..self.len() {
            let path = self.log_path(i);
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| format!("({e})"));
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
            s.push_str(&format!(
                "--- {} ({}), last {} lines:\n{}\n",
                member_name(i),
                path.display(),
                tail.len(),
                tail.join("\n")
            ));
        }
        s
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut child) = m.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // The fields then drop: the members' namespaces, the LAN's, the directory.
    }
}

/// `m<i>`: member `i`'s etcd name and its bridge port.
fn member_name(i: usize) -> String {
    format!("m{i}")
}

/// A veth from `ns` (`ifname` there, addressed `ip/24` and up) to the LAN's bridge (as
/// `port`, up).
/// Attaches `ns` to the LAN whose bridge is in `lan` as host `host` (see
/// [`EtcdCluster::attach`]).
pub(crate) fn attach_host(lan: &Netns, ns: &Netns, ifname: &str, host: u8) -> Result<Ipv4Addr> {
    let ip = Ipv4Addr::new(10, 250, 0, host);
    plug(lan, ns, ifname, &format!("h{host}"), ip)?;
    let bridge = LAN_BRIDGE_IP.to_string();
    reaches(
        ns,
        &bridge,
        &format!("the LAN bridge {bridge} over {ifname}"),
    )?;
    Ok(ip)
}

/// Plugs `ns` in behind `lan`, which routes between the two: a veth named `ifname` in `ns`
/// addressed `10.251.<host>.2/24` with its default route via `10.251.<host>.1` (the LAN
/// namespace's end), forwarding on there. Returns the address.
pub(crate) fn plug_routed(lan: &Netns, ns: &Netns, ifname: &str, host: u8) -> Result<Ipv4Addr> {
    let ip = Ipv4Addr::new(10, 251, host, 2);
    let gw = Ipv4Addr::new(10, 251, host, 1);
    let port = format!("r{host}");
    veth_to(lan, ns, ifname, &port)?;
    lan.ip_ok(&["addr", "add", &format!("{gw}/24"), "dev", &port])?;
    lan.ip_ok(&["link", "set", &port, "up"])?;
    let out = lan.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
    ensure!(
        out.status.success(),
        "forwarding on in the LAN namespace: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    ns.ip_ok(&["addr", "add", &format!("{ip}/24"), "dev", ifname])?;
    ns.ip_ok(&["link", "set", ifname, "up"])?;
    ns.ip_ok(&["route", "add", "default", "via", &gw.to_string()])?;
    Ok(ip)
}

/// A LAN namespace with its bridge (`br0`, [`LAN_BRIDGE_IP`]/24) up. The bridge's MAC
/// address is set: a bridge without one takes its lowest port's, and changes it as hosts
/// join, which left a host that had already resolved the bridge's address sending to the
/// old one until its neighbour entry went stale (its connections to a server on the
/// bridge's address timed out for half a minute).
pub(crate) fn make_lan() -> Result<Netns> {
    let lan = Netns::create("n")?;
    lan.ip_ok(&[
        "link",
        "add",
        LAN_BRIDGE,
        "address",
        LAN_BRIDGE_MAC,
        "type",
        "bridge",
    ])?;
    lan.ip_ok(&[
        "addr",
        "add",
        &format!("{LAN_BRIDGE_IP}/24"),
        "dev",
        LAN_BRIDGE,
    ])?;
    lan.ip_ok(&["link", "set", LAN_BRIDGE, "up"])?;
    Ok(lan)
}

/// A veth pair: `ifname` in `ns`, its peer `port` in `lan`.
fn veth_to(lan: &Netns, ns: &Netns, ifname: &str, port: &str) -> Result<()> {
    ns.ip_ok(&[
        "link",
        "add",
        ifname,
        "type",
        "veth",
        "peer",
        "name",
        port,
        "netns",
        lan.name(),
    ])?;
    Ok(())
}

fn plug(lan: &Netns, ns: &Netns, ifname: &str, port: &str, ip: Ipv4Addr) -> Result<()> {
    veth_to(lan, ns, ifname, port)?;
    lan.ip_ok(&["link", "set", port, "master", LAN_BRIDGE])?;
    lan.ip_ok(&["link", "set", port, "up"])?;
    ns.ip_ok(&["addr", "add", &format!("{ip}/24"), "dev", ifname])?;
    ns.ip_ok(&["link", "set", ifname, "up"])?;
    Ok(())
}

/// `etcdctl --endpoints <endpoints> <args>` with the v3 API in `ns` (only the network
/// namespace switched); stdout, or an error with stderr.
fn etcdctl(
    ns: &Netns,
    endpoints: &str,
    command_timeout: &str,
    flags: &[String],
    args: &[&str],
) -> Result<String> {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net={}", ns.path().display()))
        .arg("--")
        .arg(ETCDCTL_BIN)
        .args(["--endpoints", endpoints])
        .args(["--dial-timeout", DIAL_TIMEOUT])
        .args(["--command-timeout", command_timeout])
        .args(flags)
        .args(args)
        .stdin(Stdio::null());
    scrub_env(&mut cmd, "ETCDCTL_");
    cmd.env("ETCDCTL_API", "3");
    let out = cmd
        .output()
        .with_context(|| format!("running etcdctl {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "etcdctl {} (in {}, --endpoints {endpoints}) failed ({}): {}",
            args.join(" "),
            ns.name(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).context("etcdctl's output is not UTF-8")
}

/// The TLS files in the cluster's directory.
const CA_CERT: &str = "ca.pem";
const SERVER_CERT: &str = "server.pem";
const SERVER_KEY: &str = "server-key.pem";
const CLIENT_CERT: &str = "client.pem";
const CLIENT_KEY: &str = "client-key.pem";

/// Writes a CA, the members' certificate (for `ips`) and a client certificate into `dir`.
fn make_tls(dir: &Path, ips: &[Ipv4Addr]) -> Result<ClientTls> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "test etcd CA");
    let ca = ca.self_signed(&ca_key)?;
    let names: Vec<String> = ips.iter().map(ToString::to_string).collect();
    let server_key = KeyPair::generate()?;
    let mut server = CertificateParams::new(names)?;
    server
        .distinguished_name
        .push(DnType::CommonName, "etcd member");
    let server = server.signed_by(&server_key, &ca, &ca_key)?;
    let client_key = KeyPair::generate()?;
    let mut client = CertificateParams::new(Vec::<String>::new())?;
    client
        .distinguished_name
        .push(DnType::CommonName, "ebpf-cni");
    let client = client.signed_by(&client_key, &ca, &ca_key)?;
    for (name, pem) in [
        (CA_CERT, ca.pem()),
        (SERVER_CERT, server.pem()),
        (SERVER_KEY, server_key.serialize_pem()),
        (CLIENT_CERT, client.pem()),
        (CLIENT_KEY, client_key.serialize_pem()),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, pem).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(ClientTls {
        ca: dir.join(CA_CERT),
        cert: dir.join(CLIENT_CERT),
        key: dir.join(CLIENT_KEY),
    })
}

/// Removes the caller's environment variables starting with `prefix` (etcd and etcdctl
/// read their flags from `ETCD_*` / `ETCDCTL_*` too).
fn scrub_env(cmd: &mut Command, prefix: &str) {
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with(prefix) {
            cmd.env_remove(key);
        }
    }
}

/// Kills the etcd members of harness processes that are gone (their data directory is in an
/// `ecni-etcd-<pid>-*` directory whose pid is dead) and removes those directories.
fn reap_stale() {
    let alive = |pid: u32| Path::new(&format!("/proc/{pid}")).exists();
    if let Ok(procs) = std::fs::read_dir("/proc") {
        for entry in procs.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            if args.first().is_none_or(|a| !a.ends_with(b"etcd")) {
                continue;
            }
            let owner = args
                .windows(2)
                .find(|w| w[0] == b"--data-dir")
                .and_then(|w| Path::new(std::str::from_utf8(w[1]).ok()?).parent())
                .and_then(dir_owner);
            if owner.is_some_and(|o| !alive(o)) {
                // SAFETY: a plain syscall; the pid was an etcd of a dead harness process a
                // moment ago (at worst the signal goes to a process that just exited).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
    if let Ok(tmp) = std::fs::read_dir(std::env::temp_dir()) {
        for entry in tmp.flatten() {
            let path = entry.path();
            if dir_owner(&path).is_some_and(|o| !alive(o)) {
                let _ = crate::fsutil::remove_tree(&path);
            }
        }
    }
}

/// `/tmp/ecni-etcd-<pid>-XXXX` → pid.
fn dir_owner(dir: &Path) -> Option<u32> {
    let name = dir.file_name()?.to_str()?;
    let (pid, rest) = name.strip_prefix(DIR_PREFIX)?.split_once('-')?;
    if rest.is_empty() {
        return None;
    }
    pid.parse().ok()
}

/// A range (get) response of `etcdctl -w json`; empty fields are left out of its JSON.
#[derive(Debug, Deserialize)]
struct RangeResponse {
    header: Header,
    #[serde(default)]
    kvs: Vec<KeyValue>,
}

#[derive(Debug, Deserialize)]
struct Header {
    #[serde(default)]
    revision: i64,
    #[serde(default)]
    member_id: u64,
}

/// Key and value, base64.
#[derive(Debug, Deserialize)]
struct KeyValue {
    key: String,
    #[serde(default)]
    value: String,
}

/// One element of `etcdctl endpoint status -w json`.
#[derive(Debug, Deserialize)]
struct EndpointStatus {
    #[serde(rename = "Endpoint")]
    endpoint: String,
    #[serde(rename = "Status")]
    status: Status,
}

#[derive(Debug, Deserialize)]
struct Status {
    header: Header,
    /// The member id of the leader this member knows (0: none).
    #[serde(default)]
    leader: u64,
}

fn decode_utf8(b64: &str) -> Result<String> {
    String::from_utf8(base64_decode(b64)?).with_context(|| format!("{b64:?} is not UTF-8"))
}

/// Standard base64 (with or without padding), as Go's JSON encodes `[]byte`.
fn base64_decode(s: &str) -> Result<Vec<u8>> {
    fn sextet(c: u8) -> Option<u32> {
        Some(u32::from(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        }))
    }
    let digits = s.trim_end_matches('=').as_bytes();
    ensure!(digits.len() % 4 != 1, "{s:?} is not base64 (length)");
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &c in digits {
        let v = sextet(c).with_context(|| format!("{s:?} is not base64 ({:?})", c as char))?;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

/// Ok once `ns` pings `addr` (within 5 s); the error names `what` and ping's last words.
pub(crate) fn reaches(ns: &Netns, addr: &str, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = ns.exec(&["ping", "-c", "1", "-W", "1", addr])?;
        if out.status.success() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{} does not reach {what}: {} {}",
                ns.name(),
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::{base64_decode, dir_owner};
    use std::path::Path;

    #[test]
    fn base64_decodes_what_go_encodes() {
        assert_eq!(base64_decode("").unwrap(), b"");
        assert_eq!(base64_decode("aGVsbG8gd29ybGQ=").unwrap(), b"hello world");
        assert_eq!(base64_decode("eAp5").unwrap(), b"x\ny");
        assert_eq!(base64_decode("L2EvYg==").unwrap(), b"/a/b");
        assert_eq!(base64_decode("/w==").unwrap(), [0xff]);
        assert!(base64_decode("a").is_err());
        assert!(base64_decode("a*==").is_err());
    }

    #[test]
    fn dir_owner_parses_only_cluster_dirs() {
        assert_eq!(
            dir_owner(Path::new("/tmp/ecni-etcd-1234-Ab3x9Q")),
            Some(1234)
        );
        assert_eq!(dir_owner(Path::new("/tmp/ecni-etcd-1234-")), None);
        assert_eq!(dir_owner(Path::new("/tmp/ecni-test-1234-abc")), None);
        assert_eq!(dir_owner(Path::new("/tmp/ecni-etcd-x-abc")), None);
    }
}
