//! Running a conflist as a runtime does, timed to the microsecond and with each plugin's
//! resource usage.
//!
//! The harness's own runner polls for the child's exit every 5 ms, which is fine for tests
//! but would quantize a 3 ms ADD; here the child is reaped with a blocking `wait4`, which
//! also returns its `rusage`. That usage covers the plugin *and* every descendant it waited
//! for (the kernel folds reaped children into the parent's counters), so ptp's CPU time
//! includes the host-local it ran, and portmap's the iptables processes it ran. Each plugin
//! enters only the node's network namespace (setns between fork and exec), like the harness.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use ebpf_cni_tests::{Attachment, CniRuntime, NetConfList};
use serde_json::Value;

use crate::model::first_line;

/// A plugin that hangs is killed after this long and the operation fails.
const PLUGIN_TIMEOUT: Duration = Duration::from_secs(120);

/// Variables a runtime sets; inherited values are removed.
const CNI_VARS: &[&str] = &[
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_IFNAME",
    "CNI_ARGS",
    "CNI_PATH",
];

/// CPU time and peak memory of a process and the descendants it reaped.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub cpu: Duration,
    pub max_rss_kib: u64,
}

/// One finished plugin process.
#[derive(Debug)]
pub struct Exit {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub wall: Duration,
    pub usage: Usage,
}

/// How a plugin process is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spawn {
    /// `fork`, then `setns` into the node's namespace, then `exec`. The child's peak RSS
    /// (`wait4`'s `ru_maxrss`) is its own as long as the bench's anonymous memory, which
    /// the forked copy counts until `exec`, is smaller; the fork copies the bench's page
    /// tables, a cost that grows with the bench's memory and that a runtime does not pay.
    Fork,
    /// As Go's `os/exec` starts a plugin for containerd or CRI-O: `posix_spawn` (`clone`
    /// with `CLONE_VM | CLONE_VFORK`, no page tables copied), from a thread that entered
    /// the node's namespace. For wall times only: `ru_maxrss` then reports the bench's own
    /// peak (the kernel records the shared memory's at `exec`).
    Vfork,
}

/// Runs `bin` in the network namespace at `netns` with `env` and `stdin`; reaps it with
/// `wait4` for its resource usage.
pub fn run_in_netns(bin: &Path, netns: &Path, env: &[(&str, &str)], stdin: &[u8]) -> Result<Exit> {
    run(bin, &[], Some(netns), env, stdin)
}

/// Runs `bin args…` (in the network namespace at `netns`, else in this process's) with
/// `env` and `stdin`; reaps it with `wait4` for its resource usage.
pub fn run(
    bin: &Path,
    args: &[&OsStr],
    netns: Option<&Path>,
    env: &[(&str, &str)],
    stdin: &[u8],
) -> Result<Exit> {
    run_spawned(Spawn::Fork, bin, args, netns, env, stdin)
}

/// [`run`], the process started as `how` says.
pub fn run_spawned(
    how: Spawn,
    bin: &Path,
    args: &[&OsStr],
    netns: Option<&Path>,
    env: &[(&str, &str)],
    stdin: &[u8],
) -> Result<Exit> {
    let mut cmd = Command::new(bin);
    cmd.args(args);
    for var in CNI_VARS {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let ns = match netns {
        Some(netns) => {
            Some(File::open(netns).with_context(|| format!("opening {}", netns.display()))?)
        }
        None => None,
    };
    let (mut child, started) = match (how, ns.as_ref().map(File::as_raw_fd)) {
        (Spawn::Vfork, Some(ns_fd)) => std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: setns on an fd open for the call; it moves this thread alone,
                // which ends after the spawn.
                if unsafe { libc::setns(ns_fd, libc::CLONE_NEWNET) } != 0 {
                    return Err(std::io::Error::last_os_error())
                        .context("entering the node's namespace");
                }
                let started = Instant::now();
                let child = cmd
                    .spawn()
                    .with_context(|| format!("starting {}", bin.display()))?;
                Ok((child, started))
            })
            .join()
            .map_err(|_| anyhow!("the spawning thread panicked"))?
        })?,
        (_, ns_fd) => {
            if let Some(ns_fd) = ns_fd {
                // SAFETY: runs between fork and exec and makes only the async-signal-safe
                // setns call on an fd that stays open (in `ns`) until spawn returns.
                unsafe {
                    cmd.pre_exec(move || {
                        if libc::setns(ns_fd, libc::CLONE_NEWNET) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
            }
            let started = Instant::now();
            let child = cmd
                .spawn()
                .with_context(|| format!("starting {}", bin.display()))?;
            (child, started)
        }
    };
    drop(ns);
    let pid = child.id() as libc::pid_t;
    let mut child_stdin = child.stdin.take().expect("stdin is piped");
    let input = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        // A plugin may exit without reading its stdin: EPIPE is its business.
        let _ = child_stdin.write_all(&input);
    });
    let stdout = reader(child.stdout.take().expect("stdout is piped"));
    let stderr = reader(child.stderr.take().expect("stderr is piped"));
    let (reaped_tx, reaped_rx) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if reaped_rx.recv_timeout(PLUGIN_TIMEOUT) == Err(mpsc::RecvTimeoutError::Timeout) {
            // SAFETY: plain kill(2); the child is not reaped yet (wait4 has not returned),
            // so the pid is still ours.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });

    let mut status: libc::c_int = 0;
    // SAFETY: zeroed rusage is a valid out-parameter.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: waiting for our own child with valid out-pointers. std's `Child` is never
        // waited on after this, so the pid is reaped exactly once.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            let _ = reaped_tx.send(());
            return Err(e).context("wait4");
        }
    }
    let wall = started.elapsed();
    let _ = reaped_tx.send(());
    let _ = watchdog.join();
    let _ = writer.join();
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    if libc::WIFSIGNALED(status)
        && libc::WTERMSIG(status) == libc::SIGKILL
        && wall >= PLUGIN_TIMEOUT
    {
        bail!("{} did not finish within {PLUGIN_TIMEOUT:?}", bin.display());
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Ok(Exit {
        code,
        stdout,
        stderr,
        wall,
        usage: Usage {
            cpu: tv(ru.ru_utime) + tv(ru.ru_stime),
            max_rss_kib: ru.ru_maxrss.max(0) as u64,
        },
    })
}

fn reader(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// What one list operation (ADD, CHECK or DEL of every plugin) cost.
#[derive(Debug, Clone, Default)]
pub struct OpCost {
    /// From the first plugin's start to the last plugin's exit, as the runtime sees it.
    pub wall: Duration,
    /// CPU time of all plugins and their children.
    pub cpu: Duration,
    /// The largest peak RSS of any plugin process (or child) involved.
    pub max_rss_kib: u64,
    /// Each plugin's wall time, in invocation order.
    pub per_plugin: Vec<(String, Duration)>,
}

impl OpCost {
    fn add(&mut self, plugin: &str, exit: &Exit) {
        self.cpu += exit.usage.cpu;
        self.max_rss_kib = self.max_rss_kib.max(exit.usage.max_rss_kib);
        self.per_plugin.push((plugin.to_owned(), exit.wall));
    }
}

/// A conflist bound to a node: what a runtime on that node executes.
#[derive(Debug, Clone)]
pub struct Chain {
    pub list: NetConfList,
    pub runtime: CniRuntime,
    pub node_netns: PathBuf,
    /// The executable of each plugin, resolved once in `CNI_PATH`.
    plugins: Vec<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Add,
    Check,
    Del,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Add => "ADD",
            Op::Check => "CHECK",
            Op::Del => "DEL",
        }
    }
}

impl Chain {
    pub fn new(list: NetConfList, runtime: CniRuntime, node_netns: &Path) -> Result<Self> {
        let plugins = list
            .plugins
            .iter()
            .map(|p| {
                let t = p.get("type").and_then(Value::as_str).unwrap_or_default();
                runtime.find_plugin(t).map_err(|e| anyhow!("{e}"))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            list,
            runtime,
            node_netns: node_netns.to_path_buf(),
            plugins,
        })
    }

    fn plugin_type(&self, index: usize) -> &str {
        self.list.plugins[index]
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    fn invoke(
        &self,
        op: Op,
        index: usize,
        att: &Attachment,
        prev: Option<&Value>,
        cost: &mut OpCost,
    ) -> Result<Exit> {
        let conf = self.list.exec_config(index, &att.capability_args, prev);
        let cni_path = self.runtime.cni_path_env();
        let mut env: Vec<(&str, &str)> = vec![
            ("CNI_COMMAND", op.as_str()),
            ("CNI_CONTAINERID", &att.container_id),
            ("CNI_NETNS", &att.netns),
            ("CNI_IFNAME", &att.ifname),
            ("CNI_PATH", &cni_path),
        ];
        if let Some(args) = &att.args {
            env.push(("CNI_ARGS", args));
        }
        for (k, v) in &att.extra_env {
            env.push((k, v));
        }
        let exit = run_in_netns(
            &self.plugins[index],
            &self.node_netns,
            &env,
            conf.to_string().as_bytes(),
        )?;
        cost.add(self.plugin_type(index), &exit);
        if exit.code != Some(0) {
            let msg = serde_json::from_str::<Value>(exit.stdout.trim())
                .ok()
                .and_then(|v| {
                    let msg = v.get("msg")?.as_str()?.to_owned();
                    let details = v.get("details").and_then(Value::as_str).unwrap_or("");
                    Some(format!("{msg} {details}").trim().to_owned())
                })
                .unwrap_or_else(|| {
                    first_line(&format!("{} {}", exit.stdout.trim(), exit.stderr.trim()))
                });
            let status = exit
                .code
                .map_or_else(|| "killed by a signal".to_owned(), |c| format!("exit {c}"));
            bail!(
                "{} {} failed ({status}): {msg}",
                self.plugin_type(index),
                op.as_str()
            );
        }
        Ok(exit)
    }

    /// ADD in order, each plugin getting the previous result; returns the final result (the
    /// runtime's cache) and the cost.
    pub fn add(&self, att: &Attachment) -> Result<(Value, OpCost)> {
        let mut cost = OpCost::default();
        let started = Instant::now();
        let mut prev: Option<Value> = None;
        for index in 0..self.plugins.len() {
            let exit = self.invoke(Op::Add, index, att, prev.as_ref(), &mut cost)?;
            let result: Value = serde_json::from_str(exit.stdout.trim()).with_context(|| {
                format!(
                    "{} ADD printed no JSON result: {}",
                    self.plugin_type(index),
                    first_line(&exit.stdout)
                )
            })?;
            prev = Some(result);
        }
        cost.wall = started.elapsed();
        Ok((prev.unwrap_or(Value::Null), cost))
    }

    /// CHECK in order against the cached result.
    pub fn check(&self, att: &Attachment, cached: &Value) -> Result<OpCost> {
        let mut cost = OpCost::default();
        let started = Instant::now();
        for index in 0..self.plugins.len() {
            self.invoke(Op::Check, index, att, Some(cached), &mut cost)?;
        }
        cost.wall = started.elapsed();
        Ok(cost)
    }

    /// DEL in reverse order; `cached` is `None` for a runtime that lost its cache.
    pub fn del(&self, att: &Attachment, cached: Option<&Value>) -> Result<OpCost> {
        let mut cost = OpCost::default();
        let started = Instant::now();
        for index in (0..self.plugins.len()).rev() {
            self.invoke(Op::Del, index, att, cached, &mut cost)?;
        }
        cost.wall = started.elapsed();
        Ok(cost)
    }
}
