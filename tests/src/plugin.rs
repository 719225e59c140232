//! One plugin invocation as the spec's execution protocol defines it (section 2): the
//! command and attachment parameters in `CNI_*` variables, the configuration on stdin, a
//! result or error JSON on stdout and an exit code.
//!
//! The plugin runs with its *network* namespace switched (setns between fork and exec) and
//! everything else inherited, like `nsenter --net`: `ip netns exec` would remount /sys and
//! hide the host's bpffs, so pins would vanish with the process.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// A hung plugin fails its test instead of hanging the suite: after 120 s, or 300 s in a
/// matrix guest, where an emulated CPU runs the verifier on a node's first ADD 10-30 times
/// slower (three guests share two cores).
pub fn plugin_timeout() -> Duration {
    Duration::from_secs(if crate::rate::in_vm() { 300 } else { 120 })
}

/// Variables the harness controls; inherited values are removed so a test sees only what it
/// sets.
const CONTROLLED_ENV: &[&str] = &[
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_IFNAME",
    "CNI_ARGS",
    "CNI_PATH",
    TEST_HOOKS[0],
    TEST_HOOKS[1],
    TEST_HOOKS[2],
    TEST_HOOKS[3],
];

/// ebpf-cni's test hooks (plugin/src/test_hooks.rs): only a test build reads them
/// (`cargo xtask build --test-hooks`; `cargo xtask test` stages one), a release build
/// ignores them.
pub const TEST_HOOKS: [&str; 4] = [
    "EBPF_CNI_FAILPOINT",
    "EBPF_CNI_TEST_KERNEL_RELEASE",
    "EBPF_CNI_BOOT_ID_FILE",
    "EBPF_CNI_HOLD_BEFORE_VETH",
];

/// Fails when `env` sets a test hook for an ebpf-cni binary that is no test build: the
/// test would otherwise see the hook ignored and fail far from the reason.
fn require_test_build(plugin: &Path, env: &ContainerEnv) -> Result<()> {
    let Some((hook, _)) = env
        .extra
        .iter()
        .find(|(k, _)| TEST_HOOKS.contains(&k.as_str()))
    else {
        return Ok(());
    };
    if plugin.file_name().is_none_or(|n| n != "ebpf-cni") {
        return Ok(());
    }
    static TEST_BUILDS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    let mut known = TEST_BUILDS.lock().unwrap_or_else(|e| e.into_inner());
    if known.iter().any(|p| p == plugin) {
        return Ok(());
    }
    let out = Command::new(plugin)
        .arg("version")
        .env_remove("CNI_COMMAND")
        .output()
        .with_context(|| format!("running {} version", plugin.display()))?;
    if !String::from_utf8_lossy(&out.stdout).contains("(a test build") {
        bail!(
            "{hook} is a test hook, but {} is a release build, which ignores it: run the \
             suites with a test build (`cargo xtask build --test-hooks`, or `cargo xtask test`)",
            plugin.display()
        );
    }
    known.push(plugin.to_path_buf());
    Ok(())
}

/// `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CniCommand {
    Add,
    Del,
    Check,
    Version,
    /// Spec 1.1: remove what the runtime no longer lists.
    Gc,
    /// Spec 1.1: is the plugin ready for ADD.
    Status,
}

impl CniCommand {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Add => "ADD",
            Self::Del => "DEL",
            Self::Check => "CHECK",
            Self::Version => "VERSION",
            Self::Gc => "GC",
            Self::Status => "STATUS",
        }
    }

    /// Commands that print nothing on success.
    pub fn prints_nothing_on_success(self) -> bool {
        matches!(self, Self::Del | Self::Check | Self::Gc | Self::Status)
    }
}

impl std::fmt::Display for CniCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The per-invocation environment. `None` leaves a variable unset (to test "missing"),
/// `Some("")` sets it empty (e.g. `CNI_NETNS=""` on a late DEL).
#[derive(Debug, Clone, Default)]
pub struct ContainerEnv {
    pub container_id: Option<String>,
    pub netns: Option<String>,
    pub ifname: Option<String>,
    pub args: Option<String>,
    pub cni_path: Option<String>,
    /// Further variables, e.g. `EBPF_CNI_FAILPOINT`.
    pub extra: Vec<(String, String)>,
}

impl ContainerEnv {
    /// The usual attachment parameters. `netns` is a path (`/run/netns/<pod>`) or "".
    pub fn new(container_id: &str, netns: impl AsRef<Path>, ifname: &str) -> Self {
        Self {
            container_id: Some(container_id.to_owned()),
            netns: Some(netns.as_ref().to_string_lossy().into_owned()),
            ifname: Some(ifname.to_owned()),
            ..Self::default()
        }
    }

    /// No attachment parameters at all (VERSION).
    pub fn none() -> Self {
        Self::default()
    }

    pub fn with_args(mut self, args: &str) -> Self {
        self.args = Some(args.to_owned());
        self
    }

    pub fn with_cni_path(mut self, cni_path: &str) -> Self {
        self.cni_path = Some(cni_path.to_owned());
        self
    }

    pub fn with_netns(mut self, netns: impl AsRef<Path>) -> Self {
        self.netns = Some(netns.as_ref().to_string_lossy().into_owned());
        self
    }

    pub fn with_env(mut self, key: &str, value: &str) -> Self {
        self.extra.push((key.to_owned(), value.to_owned()));
        self
    }
}

/// What one invocation produced.
#[derive(Debug, Clone)]
pub struct PluginOutput {
    pub command: CniCommand,
    /// `None` when the plugin was killed by a signal.
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// stdout parsed as JSON, when it is JSON.
    pub json: Option<Value>,
}

/// The error result of section 5 ("Error").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorResult {
    pub cni_version: Option<String>,
    pub code: u64,
    pub msg: String,
    pub details: Option<String>,
}

impl ErrorResult {
    /// `msg` and `details` together, lowercased, for "the message names X" checks.
    pub fn text_lower(&self) -> String {
        format!("{} {}", self.msg, self.details.as_deref().unwrap_or("")).to_lowercase()
    }
}

impl PluginOutput {
    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }

    /// The parsed error result, if stdout holds one.
    pub fn error(&self) -> Option<ErrorResult> {
        let v = self.json.as_ref()?;
        let code = v.get("code")?.as_u64()?;
        Some(ErrorResult {
            cni_version: v
                .get("cniVersion")
                .and_then(Value::as_str)
                .map(str::to_owned),
            code,
            msg: v
                .get("msg")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            details: v.get("details").and_then(Value::as_str).map(str::to_owned),
        })
    }

    /// Everything a failure message needs to explain what the plugin did.
    pub fn describe(&self) -> String {
        format!(
            "CNI_COMMAND={} exit={:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.command,
            self.exit_code,
            self.stdout.trim_end(),
            self.stderr.trim_end()
        )
    }

    /// Asserts exit 0 and a JSON object on stdout (an empty stdout is allowed for DEL,
    /// CHECK, GC and STATUS, which print nothing on success); returns the JSON (`Null` when
    /// empty).
    pub fn expect_success(&self, what: &str) -> Value {
        assert!(self.success(), "{what}: plugin failed\n{}", self.describe());
        match &self.json {
            Some(v) => {
                assert!(
                    v.is_object(),
                    "{what}: stdout is not a JSON object\n{}",
                    self.describe()
                );
                assert!(
                    v.get("code").is_none(),
                    "{what}: exit 0 but stdout is an error\n{}",
                    self.describe()
                );
                v.clone()
            }
            None if self.stdout.trim().is_empty() && self.command.prints_nothing_on_success() => {
                Value::Null
            }
            None => panic!("{what}: stdout is not JSON\n{}", self.describe()),
        }
    }

    /// Asserts a failure with the given code, reported as section 5 says: non-zero exit
    /// and an error object on stdout with `cniVersion`, `code` and a non-empty `msg`.
    pub fn expect_error(&self, code: u64, what: &str) -> ErrorResult {
        assert!(
            !self.success() && self.exit_code.is_some(),
            "{what}: expected an error (code {code}), plugin exit {:?}\n{}",
            self.exit_code,
            self.describe()
        );
        let err = self.error().unwrap_or_else(|| {
            panic!(
                "{what}: no error JSON on stdout (section 5)\n{}",
                self.describe()
            )
        });
        assert_eq!(
            err.code,
            code,
            "{what}: wrong error code\n{}",
            self.describe()
        );
        assert!(
            err.cni_version.is_some(),
            "{what}: error result lacks cniVersion (section 5)\n{}",
            self.describe()
        );
        assert!(
            !err.msg.trim().is_empty(),
            "{what}: empty msg\n{}",
            self.describe()
        );
        err
    }
}

/// Runs `plugin` once. `netns` is the namespace to run it in (the node's), or `None` for
/// the caller's own. `stdin` is the configuration as sent.
pub fn run_plugin(
    plugin: &Path,
    netns: Option<&Path>,
    command: CniCommand,
    env: &ContainerEnv,
    stdin: &[u8],
) -> Result<PluginOutput> {
    run_command(Command::new(plugin), plugin, netns, command, env, stdin)
}

/// Runs `plugin` once as someone trying it by hand does: `ip netns exec <netns> plugin`,
/// which also gives it a mount namespace of its own with a fresh sysfs on `/sys`.
pub fn run_plugin_by_hand(
    plugin: &Path,
    netns: &str,
    command: CniCommand,
    env: &ContainerEnv,
    stdin: &[u8],
) -> Result<PluginOutput> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns]).arg(plugin);
    run_command(cmd, plugin, None, command, env, stdin)
}

/// Runs `plugin` once in `netns` as the DaemonSet's image runs it: with no netfilter tools
/// to be found (`iptables*`, `ip6tables*`, `nft`, `ipvsadm` all live in `/usr/sbin`, which a
/// private mount namespace covers with an empty tmpfs for this one run).
pub fn run_plugin_without_host_tools(
    plugin: &Path,
    netns: &Path,
    command: CniCommand,
    env: &ContainerEnv,
    stdin: &[u8],
) -> Result<PluginOutput> {
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount -t tmpfs none /usr/sbin && ! command -v iptables-save >/dev/null && exec "$0""#)
        .arg(plugin);
    run_command(cmd, plugin, Some(netns), command, env, stdin)
}

fn run_command(
    mut cmd: Command,
    plugin: &Path,
    netns: Option<&Path>,
    command: CniCommand,
    env: &ContainerEnv,
    stdin: &[u8],
) -> Result<PluginOutput> {
    require_test_build(plugin, env)?;
    for var in CONTROLLED_ENV {
        cmd.env_remove(var);
    }
    cmd.env("CNI_COMMAND", command.as_str());
    let vars = [
        ("CNI_CONTAINERID", &env.container_id),
        ("CNI_NETNS", &env.netns),
        ("CNI_IFNAME", &env.ifname),
        ("CNI_ARGS", &env.args),
        ("CNI_PATH", &env.cni_path),
    ];
    for (key, value) in vars {
        if let Some(v) = value {
            cmd.env(key, v);
        }
    }
    for (k, v) in &env.extra {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());

    // Opened here (O_CLOEXEC) so the child only has to call setns before exec.
    let ns_file = netns
        .map(|p| File::open(p).with_context(|| format!("opening {}", p.display())))
        .transpose()?;
    if let Some(f) = &ns_file {
        let fd = f.as_raw_fd();
        // SAFETY: the closure runs between fork and exec and only makes the setns syscall,
        // which is async-signal-safe, on an fd that stays open until exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", plugin.display()))?;
    drop(ns_file);
    let mut child_stdin = child.stdin.take().expect("stdin is piped");
    let input = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        // A plugin may exit without reading stdin (bad environment): EPIPE is fine then.
        let _ = child_stdin.write_all(&input);
    });
    let stdout_reader = spawn_reader(child.stdout.take().expect("stdout is piped"));
    let stderr_reader = spawn_reader(child.stderr.take().expect("stderr is piped"));

    let timeout = plugin_timeout();
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for plugin")? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "{} {command} did not finish within {timeout:?}",
                plugin.display()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let _ = writer.join();
    let stdout = stdout_reader.join().expect("reader thread");
    let stderr = stderr_reader.join().expect("reader thread");
    let json = serde_json::from_str(stdout.trim()).ok();
    Ok(PluginOutput {
        command,
        exit_code: status.code(),
        stdout,
        stderr,
        json,
    })
}

fn spawn_reader(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}
