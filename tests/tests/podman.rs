//! A real runtime: Debian's podman 4.3 with its CNI backend, runc and conmon runs a
//! container on an ordinary conflist whose only plugin is ebpf-cni (with the `portMappings`
//! capability), and real traffic reaches it through `-p 8080:80`.
//!
//! Isolation: podman gets a fully private configuration (containers.conf, storage.conf,
//! registries.conf, storage root/runroot, tmpdir, file locks, a test-made plugin directory
//! and network config directory, a unique cgroup parent), and it runs with only its
//! *network* namespace switched to a test node (`nsenter --net`), so the plugin runs there,
//! keys its bpffs state by that namespace and builds the host veth there. The machine's root
//! network namespace is never reconfigured. Outside the test's directories podman only
//! writes what is keyed by the container: its netns file `/run/netns/netns-<uuid>`, runc's
//! state `/run/runc/<id>`, libcni's cache `/var/lib/cni/results/<network>-<id>-eth0` (not
//! configurable in podman 4.3) and cgroups below the test's parent; `podman rm` must remove
//! the first three.
//!
//! No registry is reachable: the container runs from a rootfs directory the test builds
//! (`--rootfs`) around Debian's static busybox, whose `httpd` serves a CGI answering
//! `<tag> <client address>`. conmon itself listens on `0.0.0.0:8080` while the container
//! runs, so a mapping that is not redirected would hang on conmon's socket: only the
//! container's tag counts as an answer.
//!
//! Everything podman made is removed by `podman rm` (asserted), and again by a drop guard
//! when the test fails midway (`podman rm -f --all`, then killing what is left in the
//! test's cgroup parent, `runc delete`, unmounting what is mounted under the test's
//! directories, removing the container netns files and podman's CNI cache entries).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use ebpf_cni_tests::config::{self, Stack};
use ebpf_cni_tests::external::ExternalHost;
use ebpf_cni_tests::kernel::{self, Link};
use ebpf_cni_tests::{
    ebpf_cni_bin, require_root, unique_container_id, Attachment, CniRuntime, NetConfList, Netns,
    Node, ResultExpectation,
};
use serde_json::{json, Value};

/// The network's name (podman's `--network`, the conflist's `name`).
const NET: &str = "ecni-podman";
const HOST_PORT: u16 = 8080;
/// Longest any single podman command may take (they take well under a second here).
const PODMAN_TIMEOUT: Duration = Duration::from_secs(60);
/// A connection that is accepted but not answered within this is conmon's, not the pod's.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(3);
/// libcni's cache directory (podman 4.3 does not make it configurable).
const LIBCNI_RESULTS: &str = "/var/lib/cni/results";
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// What must be installed (`cargo xtask setup` installs it: see `APT_PACKAGES`).
const TOOLS: [&str; 5] = [
    "/usr/bin/podman",
    "/usr/sbin/runc",
    "/usr/bin/conmon",
    "/bin/busybox",
    "/usr/lib/cni/loopback",
];

/// The output of one podman command.
struct Ran {
    args: String,
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    fn describe(&self) -> String {
        let status = match self.status {
            Some(s) => s.to_string(),
            None => format!("killed after {PODMAN_TIMEOUT:?}"),
        };
        format!(
            "podman {} -> {status}\nstdout: {}\nstderr: {}",
            self.args,
            self.stdout.trim(),
            self.stderr.trim()
        )
    }
}

/// A private podman installation driving the node; cleans up after itself on drop.
struct Podman {
    base: PathBuf,
    node_netns: PathBuf,
    /// `/ecni-podman-<pid>-<n>`: every container and conmon of this test lives below it.
    cgroup_parent: String,
    rootfs: PathBuf,
    cni_bin: PathBuf,
    conflist: Value,
    /// The container's answer starts with this.
    tag: String,
    /// Container ids and network namespace paths seen, for the drop guard.
    container_ids: Vec<String>,
    sandboxes: Vec<PathBuf>,
    ran: u32,
}

impl Podman {
    fn new(node: &Node, plugin: &Path) -> Result<Self> {
        let base = node.scratch_dir().join("podman");
        let id = unique_container_id();
        let tag = format!("ecni-podman-{}", &id[48..]);
        let cgroup_parent = format!("/ecni-podman-{}-{}", std::process::id(), &id[16..32]);
        let dirs = [
            "root", "runroot", "tmp", "home", "net.d", "cni-bin", "logs", "rootfs",
        ];
        for d in dirs {
            std::fs::create_dir_all(base.join(d))?;
        }

        // The plugin directory: the plugin under test installed as `ebpf-cni`, and Debian's
        // loopback.
        let cni_bin = base.join("cni-bin");
        std::fs::copy(plugin, cni_bin.join("ebpf-cni"))
            .with_context(|| format!("installing {}", plugin.display()))?;
        std::os::unix::fs::symlink("/usr/lib/cni/loopback", cni_bin.join("loopback"))?;

        // An ordinary conflist, its IPAM dataDir in the node's own directory.
        let mut conf = config::standard("1.0.0", NET, "ebpf-cni", node.data_dir(), Stack::Dual);
        conf["capabilities"] = json!({ "portMappings": true });
        let conflist = NetConfList::single(&conf).to_value();
        std::fs::write(
            base.join("net.d").join(format!("{NET}.conflist")),
            serde_json::to_string_pretty(&conflist)?,
        )?;

        let p = |d: &str| base.join(d).to_string_lossy().into_owned();
        std::fs::write(
            base.join("containers.conf"),
            format!(
                r#"[containers]
# podman's defaults for root (nofile 1048576, nproc 4194304) exceed this machine's limits.
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[network]
network_backend = "cni"
cni_plugin_dirs = ["{cni_bin}"]
network_config_dir = "{netd}"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "none"
lock_type = "file"
tmp_dir = "{tmp}"
static_dir = "{root}/libpod"
volume_path = "{root}/volumes"
"#,
                cni_bin = cni_bin.display(),
                netd = p("net.d"),
                tmp = p("tmp"),
                root = p("root"),
            ),
        )?;
        std::fs::write(
            base.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
                p("root"),
                p("runroot")
            ),
        )?;
        std::fs::write(
            base.join("registries.conf"),
            "unqualified-search-registries = []\n",
        )?;

        // The rootfs: static busybox, httpd and a CGI that answers "<tag> <client address>".
        let rootfs = base.join("rootfs");
        for d in ["bin", "www/cgi-bin"] {
            std::fs::create_dir_all(rootfs.join(d))?;
        }
        std::fs::copy("/bin/busybox", rootfs.join("bin/busybox"))?;
        for applet in ["sh", "httpd", "echo"] {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))?;
        }
        let cgi = rootfs.join("www/cgi-bin/peer");
        std::fs::write(
            &cgi,
            format!(
                "#!/bin/sh\necho 'Content-Type: text/plain'\necho\necho \"{tag} $REMOTE_ADDR\"\n"
            ),
        )?;
        std::fs::set_permissions(&cgi, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;

        Ok(Self {
            node_netns: node.netns().path().to_path_buf(),
            cgroup_parent,
            rootfs,
            cni_bin,
            conflist,
            tag,
            base,
            container_ids: Vec::new(),
            sandboxes: Vec::new(),
            ran: 0,
        })
    }

    /// `podman <args>` in the node's network namespace (nothing else switched: the plugin
    /// needs the host's bpffs and cgroup2), with the private configuration only. Output goes
    /// to files, not pipes: conmon inherits podman's descriptors and outlives it.
    fn run(&mut self, args: &[&str]) -> Ran {
        self.ran += 1;
        let logs = self.base.join("logs");
        let out_path = logs.join(format!("{}.out", self.ran));
        let err_path = logs.join(format!("{}.err", self.ran));
        let p = |d: &str| self.base.join(d);
        let status = (|| -> Result<Option<ExitStatus>> {
            let mut child = Command::new("nsenter")
                .arg(format!("--net={}", self.node_netns.display()))
                .arg("--")
                .arg("podman")
                .arg("--root")
                .arg(p("root"))
                .arg("--runroot")
                .arg(p("runroot"))
                .args(args)
                .env("CONTAINERS_CONF", p("containers.conf"))
                .env("CONTAINERS_STORAGE_CONF", p("storage.conf"))
                .env("CONTAINERS_REGISTRIES_CONF", p("registries.conf"))
                .env("HOME", p("home"))
                .env_remove("XDG_RUNTIME_DIR")
                .env_remove("XDG_CONFIG_HOME")
                .env_remove("XDG_DATA_HOME")
                .env_remove("CONTAINER_HOST")
                .env_remove("CONTAINER_CONNECTION")
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(&out_path)?)
                .stderr(std::fs::File::create(&err_path)?)
                .spawn()
                .context("spawning nsenter podman")?;
            let deadline = Instant::now() + PODMAN_TIMEOUT;
            loop {
                if let Some(s) = child.try_wait()? {
                    return Ok(Some(s));
                }
                if Instant::now() > deadline {
                    // nsenter exec'd podman: this is podman's pid, our own child.
                    let _ = child.kill();
                    let _ = child.wait();
                    return Ok(None);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })();
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        let (status, mut stderr) = match status {
            Ok(s) => (s, read(&err_path)),
            Err(e) => (None, format!("{e:#}")),
        };
        if stderr.is_empty() && status.is_none() {
            stderr = "(no output)".into();
        }
        Ran {
            args: args.join(" "),
            status,
            stdout: read(&out_path),
            stderr,
        }
    }

    /// `podman <args>`, panicking with its output unless it succeeds; returns stdout.
    fn ok(&mut self, args: &[&str]) -> String {
        let r = self.run(args);
        assert!(r.success(), "{}", r.describe());
        r.stdout
    }

    /// `podman inspect` of one container.
    fn inspect(&mut self, name: &str) -> Value {
        let out = self.ok(&["inspect", "--type", "container", name]);
        let v: Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("podman inspect printed no JSON ({e}): {out}"));
        v[0].clone()
    }

    /// Every cgroup directory of this test (each hierarchy's `<parent>` and below),
    /// deepest first.
    fn cgroup_dirs(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let rel = self.cgroup_parent.trim_start_matches('/');
        // cgroup v1 and hybrid: a hierarchy per directory of /sys/fs/cgroup; v2 alone:
        // /sys/fs/cgroup itself.
        collect_dirs(&Path::new(CGROUP_ROOT).join(rel), &mut out);
        for h in std::fs::read_dir(CGROUP_ROOT)
            .into_iter()
            .flatten()
            .flatten()
        {
            collect_dirs(&h.path().join(rel), &mut out);
        }
        out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        out
    }

    /// Live (not zombie) processes in this test's cgroups: conmon, the container's
    /// processes and the cleanup processes conmon starts.
    fn live_processes(&self) -> Vec<(u32, String)> {
        let mut pids: Vec<u32> = Vec::new();
        for dir in self.cgroup_dirs() {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            pids.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        pids.sort_unstable();
        pids.dedup();
        pids.into_iter()
            .filter_map(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                // "pid (comm) S ...": the state follows the last ')'.
                let state = stat
                    .rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .next()?
                    .to_owned();
                (state != "Z").then(|| {
                    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                    let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                    (pid, cmd.trim().to_owned())
                })
            })
            .collect()
    }

    /// Mount points below the test's directory or at the container netns files seen.
    fn mounts(&self) -> Vec<PathBuf> {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut out: Vec<PathBuf> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(|m| PathBuf::from(m.replace("\\040", " ")))
            .filter(|m| m.starts_with(&self.base) || self.sandboxes.contains(m))
            .collect();
        out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        out.dedup();
        out
    }

    fn libcni_cache_files(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for id in &self.container_ids {
            let f = Path::new(LIBCNI_RESULTS).join(format!("{NET}-{id}-eth0"));
            if f.exists() {
                out.push(f);
            }
        }
        out
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    out.push(dir.to_path_buf());
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            collect_dirs(&e.path(), out);
        }
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // Whatever podman still knows about.
        let listed = self.run(&["ps", "--all", "--quiet", "--no-trunc"]);
        for id in listed.stdout.split_whitespace() {
            if !self.container_ids.iter().any(|c| c == id) {
                self.container_ids.push(id.to_owned());
            }
        }
        if !self.container_ids.is_empty() {
            let r = self.run(&["rm", "--force", "--all", "--time", "0"]);
            if !r.success() {
                eprintln!("cleanup: {}", r.describe());
            }
        }
        // What podman could not stop: kill it by pid (only processes in our own cgroups).
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let left = self.live_processes();
            if left.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                eprintln!("cleanup: processes survive SIGKILL: {left:?}");
                break;
            }
            for (pid, cmd) in left {
                let cmd: String = cmd.chars().take(80).collect();
                eprintln!("cleanup: killing {pid} {cmd}");
                // SAFETY: kill has no memory-safety preconditions.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for id in &self.container_ids {
            if Path::new("/run/runc").join(id).exists() {
                eprintln!("cleanup: runc delete --force {id}");
                let _ = Command::new("runc")
                    .args(["delete", "--force", id])
                    .stdin(Stdio::null())
                    .output();
            }
        }
        for m in self.mounts() {
            eprintln!("cleanup: unmounting {}", m.display());
            if let Err(e) = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH) {
                eprintln!("cleanup: umount {}: {e}", m.display());
            }
        }
        for s in &self.sandboxes {
            if s.exists() {
                eprintln!("cleanup: removing {}", s.display());
                let _ = std::fs::remove_file(s);
            }
        }
        for f in self.libcni_cache_files() {
            let _ = std::fs::remove_file(f);
        }
        for dir in self.cgroup_dirs() {
            if let Err(e) = std::fs::remove_dir(&dir) {
                eprintln!("cleanup: rmdir {}: {e}", dir.display());
            }
        }
    }
}

/// What the container's CGI answered: its tag and the client address it saw.
#[derive(Debug)]
struct Answer {
    tag: String,
    client: IpAddr,
}

/// One HTTP request for the CGI from `from` to `target`. The container may still be
/// binding right after `podman run` returns: refused or reset connections are retried for
/// a few seconds; an accepted connection that never answers fails at once.
fn ask(from: &Netns, target: SocketAddr) -> Result<Answer> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match from.run_in(|| ask_once(target))? {
            Ok(a) => return Ok(a),
            Err(Retry::No(e)) => return Err(e),
            Err(Retry::Yes(e)) if Instant::now() > deadline => return Err(e),
            Err(Retry::Yes(_)) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

enum Retry {
    Yes(anyhow::Error),
    No(anyhow::Error),
}

fn ask_once(target: SocketAddr) -> Result<Answer, Retry> {
    let retry = |e: std::io::Error, what: &str| {
        let again = matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::ConnectionReset
        );
        let e = anyhow!(e).context(format!("{what} {target}"));
        if again {
            Retry::Yes(e)
        } else {
            Retry::No(e)
        }
    };
    let mut c = TcpStream::connect_timeout(&target, ANSWER_TIMEOUT)
        .map_err(|e| retry(e, "TCP connect to"))?;
    c.set_read_timeout(Some(ANSWER_TIMEOUT))
        .map_err(|e| retry(e, "socket option for"))?;
    c.write_all(b"GET /cgi-bin/peer HTTP/1.0\r\nHost: ecni\r\n\r\n")
        .map_err(|e| retry(e, "sending the request to"))?;
    let mut buf = Vec::new();
    if let Err(e) = c.read_to_end(&mut buf) {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            return Err(Retry::No(anyhow!(
                "{target}: connection accepted but no answer within {ANSWER_TIMEOUT:?} \
                 (conmon's own listening socket, i.e. the host port was not redirected?)"
            )));
        }
        return Err(retry(e, "reading the answer from"));
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    // httpd's status line ends in CRLF, the CGI's header lines in LF: the body is the last
    // line.
    let ok = text
        .lines()
        .next()
        .is_some_and(|l| l.starts_with("HTTP/1.") && l.contains(" 200 "));
    let body = match text.trim_end().rsplit_once('\n') {
        Some((_, body)) if ok => body.trim().to_owned(),
        _ => return Err(Retry::No(anyhow!("{target}: not a 200 answer: {text:?}"))),
    };
    let parse = || -> Option<Answer> {
        let (tag, addr) = body.split_once(' ')?;
        let addr = addr.trim().trim_start_matches('[').trim_end_matches(']');
        Some(Answer {
            tag: tag.to_owned(),
            client: addr.parse::<IpAddr>().ok()?.to_canonical(),
        })
    };
    parse().ok_or_else(|| Retry::No(anyhow!("{target}: unexpected answer {body:?}")))
}

fn sa(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

/// The container as podman reports it, and its network namespace.
#[derive(Debug)]
struct Container {
    id: String,
    pid: u32,
    sandbox: PathBuf,
    v4: IpAddr,
    v6: IpAddr,
}

fn container(podman: &mut Podman, name: &str) -> Container {
    let v = podman.inspect(name);
    let net = &v["NetworkSettings"]["Networks"][NET];
    let ip = |k: &str| -> IpAddr {
        net[k]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("podman inspect: no {k} on {NET}: {v:#}"))
    };
    let c = Container {
        id: v["Id"].as_str().expect("Id").to_owned(),
        pid: v["State"]["Pid"].as_u64().expect("State.Pid") as u32,
        sandbox: PathBuf::from(
            v["NetworkSettings"]["SandboxKey"]
                .as_str()
                .expect("SandboxKey"),
        ),
        v4: ip("IPAddress"),
        v6: ip("GlobalIPv6Address"),
    };
    if !podman.sandboxes.contains(&c.sandbox) {
        podman.sandboxes.push(c.sandbox.clone());
    }
    c
}

fn ebpf_cni_links(node: &Node) -> Vec<Link> {
    kernel::links(node.netns())
        .expect("reading node links")
        .into_iter()
        .filter(|l| l.ifname.starts_with("ecni"))
        .collect()
}

/// The links of a namespace given by path (podman's, not a harness one).
fn links_at(netns: &Path) -> Vec<Link> {
    let out = Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["--", "ip", "-j", "addr", "show"])
        .stdin(Stdio::null())
        .output()
        .expect("running nsenter ip");
    assert!(
        out.status.success(),
        "ip addr in {}: {}",
        netns.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("ip -j addr output")
}

fn netns_inode(path: &Path) -> u64 {
    ebpf_cni_tests::netns::netns_inode(path)
        .unwrap_or_else(|e| panic!("stat {}: {e:#}", path.display()))
}

/// The container's network as ADD must have built it: its own namespace (not the node's,
/// not the machine's), `eth0` there with podman's addresses, its host veth in the node (the
/// one the node's routes to it use) and not in the machine's root namespace, its leases and
/// its attachment's pins. Returns the host veth's name.
fn assert_attached(node: &Node, c: &Container) -> String {
    assert!(
        c.sandbox.exists(),
        "podman's netns {} exists",
        c.sandbox.display()
    );
    let sandbox = netns_inode(&c.sandbox);
    assert_eq!(
        netns_inode(Path::new(&format!("/proc/{}/ns/net", c.pid))),
        sandbox,
        "the container process lives in podman's netns {}",
        c.sandbox.display()
    );
    assert_ne!(
        sandbox,
        node.netns().inode(),
        "the container has its own netns"
    );
    assert_ne!(
        sandbox,
        netns_inode(Path::new("/proc/self/ns/net")),
        "the container is not in the machine's root netns"
    );
    let links = links_at(&c.sandbox);
    let eth0 = links
        .iter()
        .find(|l| l.ifname == "eth0")
        .unwrap_or_else(|| panic!("no eth0 in the container's netns: {links:?}"));
    assert!(
        eth0.has_addr(c.v4, 24) && eth0.has_addr(c.v6, 64),
        "eth0 carries podman's addresses {} and {}: {eth0:?}",
        c.v4,
        c.v6
    );
    // The host end: the node's /32 and /128 routes to the container lead to it.
    let routes = kernel::all_routes(node.netns()).expect("reading node routes");
    let dev_to = |ip: IpAddr| -> String {
        routes
            .iter()
            .find(|r| r.is_host_route_to(ip))
            .and_then(|r| r.dev.clone())
            .unwrap_or_else(|| panic!("no node route to the container's {ip}: {routes:?}"))
    };
    let host_name = dev_to(c.v4);
    assert_eq!(dev_to(c.v6), host_name, "both routes use one host veth");
    let host = kernel::link(node.netns(), &host_name)
        .expect("reading node links")
        .unwrap_or_else(|| panic!("host veth {host_name} is not in the node"));
    assert!(
        host.ifname.starts_with("ecni") && host.link_netnsid.is_some() && host.is_up(),
        "the host veth is ebpf-cni's, up, its peer in another namespace: {host:?}"
    );
    let in_root = Command::new("ip")
        .args(["link", "show", "dev", &host.ifname])
        .stdin(Stdio::null())
        .output()
        .expect("ip link");
    assert!(
        !in_root.status.success(),
        "the host veth {} must not be in the machine's root netns",
        host.ifname
    );
    let mine: Vec<_> = node
        .leases(NET)
        .into_iter()
        .filter(|l| l.container_id == c.id)
        .collect();
    let mut ips: Vec<IpAddr> = mine.iter().map(|l| l.ip).collect();
    ips.sort();
    assert_eq!(
        ips,
        vec![c.v4, c.v6],
        "the leases in the test's dataDir are the container's: {mine:?}"
    );
    assert!(
        mine.iter().all(|l| l.ifname.as_deref() == Some("eth0")),
        "{mine:?}"
    );
    let pins = node.attachment_pin_dir(NET, &c.id, "eth0");
    assert!(
        pins.is_dir(),
        "the attachment is pinned under the node's pin root: {}",
        pins.display()
    );
    host_name
}

/// A podman container on ebpf-cni, reached through its host port from the node (loopback
/// and node addresses, both families), from outside the node and from another pod; the same
/// after `podman restart` (DEL then ADD); and nothing left after `podman rm`.
#[test]
fn podman_runs_a_container_on_ebpf_cni_and_rm_leaves_nothing() {
    require_root();
    let plugin = ebpf_cni_bin();
    let missing: Vec<&str> = TOOLS
        .iter()
        .copied()
        .filter(|t| !Path::new(t).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "missing {missing:?}: install podman, runc, conmon, busybox-static and \
         containernetworking-plugins (`cargo xtask setup` does)"
    );
    let started = Instant::now();

    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "uplink0", 47).unwrap();
    // Declared after the node, so it is dropped (and cleans up) before the node goes.
    let mut podman = Podman::new(&node, &plugin).unwrap();

    // podman sends VERSION to the plugin on almost every command and silently drops a
    // network whose plugins fail it.
    let nets = podman.ok(&["network", "ls", "--format", "{{.Name}} {{.Driver}}"]);
    assert!(
        nets.lines().any(|l| l.trim() == format!("{NET} ebpf-cni")),
        "podman lists the network with the ebpf-cni driver (VERSION answered): {nets:?}"
    );

    let name = format!("ecni-podman-{}", std::process::id());
    let rootfs = podman.rootfs.to_string_lossy().into_owned();
    let cgroup_parent = podman.cgroup_parent.clone();
    let port = format!("{HOST_PORT}:80");
    let out = podman.ok(&[
        "run",
        "--detach",
        "--name",
        &name,
        "--network",
        NET,
        "--cgroup-parent",
        &cgroup_parent,
        "--publish",
        &port,
        "--rootfs",
        &rootfs,
        "/bin/httpd",
        "-f",
        "-p",
        "80",
        "-h",
        "/www",
    ]);
    let id = out.trim().to_owned();
    podman.container_ids.push(id.clone());
    let c = container(&mut podman, &name);
    assert_eq!(c.id, id);
    let host_veth = assert_attached(&node, &c);
    assert_eq!(
        ebpf_cni_links(&node).len(),
        1,
        "the container's is the node's only host veth"
    );

    // Pod B: a plain pod on the same network, added the way a runtime would.
    let runtime = CniRuntime::new(vec![podman.cni_bin.clone()]);
    let list = NetConfList::from_value(&podman.conflist).unwrap();
    let pod_b = node.new_pod().unwrap();
    let att_b = Attachment::new(&unique_container_id(), pod_b.path(), "eth0");
    let result_b = runtime
        .add(&node, &list, &att_b)
        .unwrap_or_else(|e| panic!("ADD of pod B: {e}"));
    let b = ResultExpectation::standard(
        "1.0.0",
        "eth0",
        &pod_b.path().to_string_lossy(),
        Stack::Dual,
    )
    .ebpf_cni_host_names()
    .assert_valid(&result_b);
    let b4 = b.ip4().expect("pod B IPv4").addr;

    let node4: IpAddr = ext.node_v4.into();
    let node6: IpAddr = ext.node_v6.into();
    let paths = |c: &Container| -> Vec<(&'static str, &Netns, SocketAddr, Option<IpAddr>)> {
        vec![
            (
                "node -> 127.0.0.1",
                node.netns(),
                sa(Ipv4Addr::LOCALHOST, HOST_PORT),
                None,
            ),
            (
                "node -> [::1]",
                node.netns(),
                sa(Ipv6Addr::LOCALHOST, HOST_PORT),
                None,
            ),
            (
                "node -> node IPv4",
                node.netns(),
                sa(node4, HOST_PORT),
                None,
            ),
            (
                "node -> node IPv6",
                node.netns(),
                sa(node6, HOST_PORT),
                None,
            ),
            (
                "external -> node IPv4",
                ext.netns(),
                sa(node4, HOST_PORT),
                Some(ext.v4.into()),
            ),
            (
                "external -> node IPv6",
                ext.netns(),
                sa(node6, HOST_PORT),
                Some(ext.v6.into()),
            ),
            ("pod B -> node IPv4", &pod_b, sa(node4, HOST_PORT), Some(b4)),
            ("pod B -> container:80", &pod_b, sa(c.v4, 80), Some(b4)),
        ]
    };
    let tag = podman.tag.clone();
    let check_paths = |c: &Container, when: &str| {
        let mut failures = Vec::new();
        for (what, from, target, client) in paths(c) {
            match ask(from, target) {
                Ok(a) if a.tag != tag => {
                    failures.push(format!("{what} ({target}): answered by {a:?}"))
                }
                Ok(a) if client.is_some_and(|ip| ip != a.client) => failures.push(format!(
                    "{what} ({target}): the container saw client {}, not {}",
                    a.client,
                    client.unwrap()
                )),
                Ok(_) => {}
                Err(e) => failures.push(format!("{what} ({target}): {e:#}")),
            }
        }
        assert!(
            failures.is_empty(),
            "{when}: traffic to the podman container failed:\n{}",
            failures.join("\n")
        );
    };
    check_paths(&c, "after podman run");

    // Restart: podman tears the network down (DEL with prevResult and portMappings) and sets
    // it up again (ADD) in a new netns; the host port follows the container.
    podman.ok(&["restart", "--time", "0", &name]);
    let c2 = container(&mut podman, &name);
    assert_eq!(c2.id, c.id);
    assert_ne!(
        c2.sandbox, c.sandbox,
        "a restarted container gets a new netns"
    );
    assert!(
        !c.sandbox.exists(),
        "the old netns {} is gone",
        c.sandbox.display()
    );
    assert_eq!(
        assert_attached(&node, &c2),
        host_veth,
        "the host veth's name derives from (network, container id, ifname)"
    );
    if c2.v4 != c.v4 {
        assert!(
            !node.leases(NET).iter().any(|l| l.ip == c.v4),
            "the old address {} was released",
            c.v4
        );
    }
    check_paths(&c2, "after podman restart");

    // Remove: nothing of the container may be left.
    podman.ok(&["rm", "--force", "--time", "0", &name]);
    let listed = podman.ok(&["ps", "--all", "--quiet"]);
    assert!(
        listed.trim().is_empty(),
        "podman lists no container: {listed}"
    );
    let mut left = Vec::new();
    let veths = ebpf_cni_links(&node);
    if veths.iter().any(|l| l.ifname == host_veth) || veths.len() != 1 {
        // Pod B's is the one expected.
        left.push(format!("host veths in the node besides pod B's: {veths:?}"));
    }
    if c2.sandbox.exists() {
        left.push(format!("netns {}", c2.sandbox.display()));
    }
    let leases: Vec<_> = node
        .leases(NET)
        .into_iter()
        .filter(|l| l.container_id == c.id)
        .collect();
    if !leases.is_empty() {
        left.push(format!("leases {leases:?}"));
    }
    let pins = node.attachment_pin_dir(NET, &c.id, "eth0");
    if pins.exists() {
        left.push(format!("pins under {}", pins.display()));
    }
    if Path::new("/run/runc").join(&c.id).exists() {
        left.push(format!("runc state /run/runc/{}", c.id));
    }
    let cache = podman.libcni_cache_files();
    if !cache.is_empty() {
        left.push(format!("podman's CNI cache {cache:?}"));
    }
    let mounts = podman.mounts();
    if !mounts.is_empty() {
        left.push(format!("mounts {mounts:?}"));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut procs = podman.live_processes();
    while !procs.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        procs = podman.live_processes();
    }
    if !procs.is_empty() {
        left.push(format!("processes {procs:?}"));
    }
    assert!(
        left.is_empty(),
        "left after podman rm:\n  - {}",
        left.join("\n  - ")
    );
    let nets = podman.ok(&["network", "ls", "--format", "{{.Name}}"]);
    assert!(
        nets.lines().any(|l| l.trim() == NET),
        "the network is still listed: {nets:?}"
    );

    // With pod B gone too, the node holds nothing of ebpf-cni any more.
    runtime
        .del(&node, &list, &att_b, Some(&result_b))
        .unwrap_or_else(|e| panic!("DEL of pod B: {e}"));
    assert!(
        ebpf_cni_links(&node).is_empty(),
        "no host veth after the last DEL"
    );
    assert!(node.leases(NET).is_empty(), "no lease after the last DEL");
    assert!(
        node.pinned_files().is_empty(),
        "nothing pinned after the last DEL: {:?}",
        node.pinned_files()
    );
    eprintln!("podman e2e took {:?}", started.elapsed());
}
