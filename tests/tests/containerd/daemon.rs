//! A private containerd 1.6 for one test, running inside a test node's network namespace.
//!
//! containerd runs as `nsenter --net=<node> unshare --pid --fork --kill-child --mount
//! --mount-proc sh -c 'mount tmpfs on /run, /var/lib/cni; exec containerd --config …'`:
//! - the node's *network* namespace, so the CNI plugins it runs configure the node (its
//!   bpffs pins are keyed by the node namespace) and never the machine's own;
//! - its own *PID* namespace with containerd as init: when containerd dies the kernel kills
//!   every shim and container process it started, so nothing outlives the test even when
//!   it fails half-way;
//! - its own *mount* namespace with fresh tmpfs on `/run` (pod netns bind mounts, shim
//!   sockets, runc state) and `/var/lib/cni` (libcni's result cache): nothing lands in the
//!   machine's directories, and the container rootfs mounts vanish with the namespace.
//!   bpffs and cgroupfs are the machine's (a mount namespace copies them), so pins and
//!   cgroups are visible to the test as usual.
//!
//! Root, state, socket, CNI `bin_dir`/`conf_dir` and the log all live in one temporary
//! directory. The plugin directory holds Debian's `loopback` and, as `ebpf-cni`, a small
//! wrapper that records each call (environment, stdin, stdout, exit code) and runs the
//! binary under test unchanged: what containerd sent and whether every DEL succeeded are
//! then facts the test reads, not guesses.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ebpf_cni_tests::Node;
use serde_json::Value;
use tempfile::TempDir;

use crate::cri::CriClient;

/// The CRI namespace of containerd (kubelet's images and pods live there).
pub const K8S_NAMESPACE: &str = "k8s.io";
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Names of what a test leaves on the machine until its end: `ecni-ctrd-<pid>-…`, so a
/// later run can remove what a killed test process left (see [`reap_stale`]).
const PREFIX: &str = "ecni-ctrd-";

/// One recorded CNI call of the plugin under test.
#[derive(Debug, Clone)]
pub struct PluginCall {
    pub command: String,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub stdin: Value,
    pub stdout: String,
    #[expect(dead_code, reason = "shown through Debug in failure messages")]
    pub stderr: String,
    pub exit_code: i32,
}

pub struct Containerd {
    dir: TempDir,
    /// `nsenter`, which became `unshare`: the parent of containerd, which it reaps.
    launcher: Child,
    /// containerd's PID as the machine sees it (PID 1 of its own namespace).
    pid: u32,
    socket: PathBuf,
    log: PathBuf,
    calls: PathBuf,
}

impl Containerd {
    /// Starts containerd in `node` with `conflist` as its only CNI network and `plugin` (the
    /// binary under test) installed as `ebpf-cni`; `sandbox_image` is the pause image the
    /// CRI plugin uses (import it before the first pod). Returns once CRI answers.
    pub fn start(
        node: &Node,
        plugin: &Path,
        conflist: &Value,
        sandbox_image: &str,
    ) -> Result<Self> {
        reap_stale();
        let dir = tempfile::Builder::new()
            .prefix(&format!("{PREFIX}{}-", std::process::id()))
            .tempdir()
            .context("creating containerd's directory")?;
        let d = dir.path();
        let bin_dir = d.join("cni-bin");
        let conf_dir = d.join("cni-conf");
        let calls = d.join("plugin-calls");
        for sub in [&bin_dir, &conf_dir, &calls] {
            fs::create_dir(sub).with_context(|| format!("creating {}", sub.display()))?;
        }
        // loopback for every sandbox; portmap for containerd's default conflist.
        for name in ["loopback", "portmap"] {
            fs::copy(
                Path::new(ebpf_cni_tests::REFERENCE_PLUGIN_DIR).join(name),
                bin_dir.join(name),
            )
            .with_context(|| {
                format!("copying Debian's {name} plugin (containernetworking-plugins)")
            })?;
        }
        write_executable(
            &bin_dir.join("ebpf-cni"),
            &recording_wrapper(plugin, &calls),
        )?;
        fs::write(
            conf_dir.join("10-ebpf-cni.conflist"),
            serde_json::to_string_pretty(conflist)?,
        )?;
        let socket = d.join("containerd.sock");
        let config = d.join("config.toml");
        fs::write(
            &config,
            config_toml(d, &socket, &bin_dir, &conf_dir, sandbox_image),
        )?;
        let log = d.join("containerd.log");
        let log_file = fs::File::create(&log)?;

        // The shell mounts the private tmpfs and then *is* containerd (exec), PID 1 of the
        // new PID namespace; nsenter and unshare exec too, so `launcher` is unshare, which
        // forks containerd and waits for it. (`mkdir` makes /var/lib/cni on the machine if
        // it is missing, as libcni would; the tmpfs over it is containerd's alone.)
        let script = "set -e; mount -t tmpfs -o mode=755 ecni-ctrd-run /run; \
                      mkdir -p /var/lib/cni; mount -t tmpfs -o mode=700 ecni-ctrd-cni /var/lib/cni; \
                      exec containerd --config \"$0\"";
        let mut cmd = Command::new("nsenter");
        // SAFETY: runs between fork and exec and only calls prctl, which is
        // async-signal-safe. If the test process is killed outright (no Drop), unshare gets
        // SIGKILL, --kill-child passes it on to containerd, and the PID namespace dies.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let launcher = cmd
            .arg(format!("--net={}", node.netns().path().display()))
            .args([
                "--",
                "unshare",
                "--pid",
                "--fork",
                "--kill-child",
                "--mount",
            ])
            .args(["--propagation", "private", "--mount-proc", "--"])
            .args(["sh", "-c", script])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .context("starting containerd (are containerd, runc and util-linux installed?)")?;
        let mut me = Self {
            pid: 0,
            launcher,
            socket,
            log,
            calls,
            dir,
        };
        me.pid = me.wait_for_child()?;
        me.wait_for_cri()?;
        Ok(me)
    }

    /// containerd's PID: the one child unshare forks.
    fn wait_for_child(&mut self) -> Result<u32> {
        let parent = self.launcher.id();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let children = fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
                .unwrap_or_default();
            if let Some(pid) = children.split_whitespace().next() {
                return Ok(pid.parse()?);
            }
            if let Some(status) = self.launcher.try_wait()? {
                bail!(
                    "containerd's launcher exited ({status}) before starting it:\n{}",
                    self.log_text()
                );
            }
            ensure!(Instant::now() < deadline, "unshare forked no containerd");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_for_cri(&mut self) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut last = None;
        while Instant::now() < deadline {
            if let Some(status) = self.launcher.try_wait()? {
                bail!("containerd exited ({status}):\n{}", self.log_text());
            }
            if self.socket.exists() {
                match CriClient::connect(&self.socket).and_then(|mut c| c.version()) {
                    Ok(_) => return Ok(()),
                    Err(e) => last = Some(e),
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!(
            "containerd's CRI did not answer within {START_TIMEOUT:?} ({last:?}):\n{}",
            self.log_text()
        )
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn cri(&self) -> Result<CriClient> {
        CriClient::connect(&self.socket)
    }

    /// A path in containerd's mount namespace as the test can open it (e.g. a pod's
    /// `/var/run/netns/cni-…`, which exists only on containerd's private `/run`).
    pub fn path_in_mount_ns(&self, path: &str) -> PathBuf {
        // `/var/run` is an absolute symlink to `/run`, and an absolute symlink met below
        // `/proc/<pid>/root` resolves from the *test's* root: resolve that one by hand.
        let path = match path.strip_prefix("/var/run/") {
            Some(rest) => format!("run/{rest}"),
            None => path.trim_start_matches('/').to_owned(),
        };
        Path::new(&format!("/proc/{}/root", self.pid)).join(path)
    }

    /// `ctr -n k8s.io images import <tar>`.
    pub fn import_image(&self, tar: &Path) -> Result<()> {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", K8S_NAMESPACE, "images", "import"])
            .arg(tar)
            .stdin(Stdio::null())
            .output()
            .context("running ctr")?;
        ensure!(
            out.status.success(),
            "ctr images import {}: {}{}",
            tar.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// containerd's `level=error` log lines.
    pub fn error_lines(&self) -> Vec<String> {
        self.log_text()
            .lines()
            .filter(|l| l.contains("level=error"))
            .map(str::to_owned)
            .collect()
    }

    /// Every call of the plugin under test so far, oldest first.
    pub fn plugin_calls(&self) -> Vec<PluginCall> {
        let mut dirs: Vec<PathBuf> = fs::read_dir(&self.calls)
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        // Names start with nanoseconds since the epoch, all of the same width.
        dirs.sort();
        dirs.iter().filter_map(|d| read_call(d)).collect()
    }

    /// Stops containerd: SIGTERM, then SIGKILL after a grace period. Either way the PID
    /// namespace dies with it, and every shim and container in it.
    fn shutdown(&mut self) {
        if self.launcher.try_wait().ok().flatten().is_some() {
            return;
        }
        if self.pid != 0 {
            // SAFETY: kill has no memory-safety preconditions; pid is our containerd's,
            // whose parent (unshare) has not reaped it while `launcher` still runs.
            unsafe { libc::kill(self.pid as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if self.launcher.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            // SAFETY: as above.
            unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
        }
        // --kill-child: unshare's death takes containerd with it.
        let _ = self.launcher.kill();
        let _ = self.launcher.wait();
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.shutdown();
        if std::thread::panicking() {
            eprintln!(
                "--- containerd log ({}) ---\n{}",
                self.log.display(),
                self.log_text()
            );
        }
        // The TempDir removes root, state and the plugin records. Overlay mounts of the
        // containers were in containerd's mount namespace, which is gone by now.
    }
}

/// containerd's configuration: everything under `d`, the CRI plugin with our CNI
/// directories, and the plugins a test does not need disabled (fewer things to fail and
/// no files outside `d`: the `opt` plugin would create /opt/containerd).
fn config_toml(d: &Path, socket: &Path, bin: &Path, conf: &Path, sandbox_image: &str) -> String {
    let q = |p: &Path| toml_string(&p.to_string_lossy());
    format!(
        r#"version = 2
root = {root}
state = {state}
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.internal.v1.opt",
  "io.containerd.tracing.processor.v1.otlp",
]

[grpc]
  address = {sock}

[ttrpc]
  address = {ttrpc}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = {image}
  # containerd cannot lower its children's oom_score_adj below its own here.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {bin}
    conf_dir = {conf}
    max_conf_num = 1
"#,
        root = q(&d.join("root")),
        state = q(&d.join("state")),
        sock = q(socket),
        ttrpc = q(&d.join("containerd.sock.ttrpc")),
        image = toml_string(sandbox_image),
        bin = q(bin),
        conf = q(conf),
    )
}

/// A TOML basic string (JSON's escaping is a subset TOML accepts for these paths).
fn toml_string(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// `sh` that records one call into `<calls>/<ns>-<pid>-<command>/` and runs `plugin` with
/// the same stdin, stdout and exit code.
fn recording_wrapper(plugin: &Path, calls: &Path) -> String {
    format!(
        r#"#!/bin/sh
# Records this CNI call for the test, then runs the plugin under test unchanged.
d={calls}/$(date +%s%N)-$$-$CNI_COMMAND
mkdir -p "$d"
env | grep '^CNI_' > "$d/env"
cat > "$d/stdin"
{plugin} < "$d/stdin" > "$d/stdout" 2> "$d/stderr"
rc=$?
echo $rc > "$d/rc"
cat "$d/stdout"
cat "$d/stderr" >&2
exit $rc
"#,
        calls = sh_quote(&calls.to_string_lossy()),
        plugin = sh_quote(&plugin.to_string_lossy()),
    )
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn write_executable(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

fn read_call(d: &Path) -> Option<PluginCall> {
    let read = |f: &str| fs::read_to_string(d.join(f)).unwrap_or_default();
    let env = read("env");
    let var = |k: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_default()
            .to_owned()
    };
    Some(PluginCall {
        command: var("CNI_COMMAND"),
        container_id: var("CNI_CONTAINERID"),
        netns: var("CNI_NETNS"),
        ifname: var("CNI_IFNAME"),
        stdin: serde_json::from_str(&read("stdin")).unwrap_or(Value::Null),
        stdout: read("stdout"),
        stderr: read("stderr"),
        // A call still running (no rc yet) reads as -1.
        exit_code: read("rc").trim().parse().unwrap_or(-1),
    })
}

/// The pods' `cgroup_parent`, `/ecni-ctrd-<pid>-<n>`: runc's cgroups for them go below it
/// in every hierarchy. runc removes its own on a clean RemovePodSandbox; dropping this
/// removes what a test that failed half-way left (its containers died with containerd's
/// PID namespace, leaving empty cgroups).
pub struct CgroupParent {
    name: String,
}

impl CgroupParent {
    pub fn new() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        Self {
            name: format!(
                "/{PREFIX}{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for CgroupParent {
    fn drop(&mut self) {
        for hierarchy in cgroup_hierarchies() {
            remove_cgroup_tree(&hierarchy.join(self.name.trim_start_matches('/')));
        }
    }
}

fn cgroup_hierarchies() -> Vec<PathBuf> {
    fs::read_dir(CGROUP_ROOT)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// cgroupfs directories go bottom-up with rmdir (their files cannot be unlinked). A cgroup
/// whose last process is still exiting is busy for a moment: retried for a while.
fn remove_cgroup_tree(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            remove_cgroup_tree(&e.path());
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                eprintln!("removing cgroup {}: {e}", dir.display());
                return;
            }
        }
    }
}

/// Removes the directories and cgroups of containerd tests whose process is gone (killed
/// before its Drop ran). Their containerd died with them (PR_SET_PDEATHSIG), and with it
/// its mount namespace, so nothing there is mounted any more. The harness reaps the node
/// namespaces and pins the same way.
fn reap_stale() {
    let stale = |name: &str| -> bool {
        name.strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
            .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
    };
    let names = |dir: &Path| -> Vec<(String, PathBuf)> {
        fs::read_dir(dir)
            .map(|rd| {
                rd.flatten()
                    .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                    .collect()
            })
            .unwrap_or_default()
    };
    for (name, path) in names(&std::env::temp_dir()) {
        if stale(&name) {
            let _ = fs::remove_dir_all(&path);
        }
    }
    for hierarchy in cgroup_hierarchies() {
        for (name, path) in names(&hierarchy) {
            if stale(&name) {
                remove_cgroup_tree(&path);
            }
        }
    }
}
