//! `ebpf-cni agent` as a test or the benchmark runs it: in a node's namespace (`--netns`,
//! or started in it as a container is), its stderr lines read by a thread so a caller can
//! wait for what it says (it says each change it makes to the node). Dropping it kills it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::netns::Netns;

/// What the agent says once it runs (`cli.rs`).
pub const STARTED: &str = "follows its devices and addresses";

#[derive(Debug)]
pub struct AgentProcess {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// Every line read so far.
    seen: Vec<String>,
    /// The first line the next wait looks at.
    next: usize,
}

impl AgentProcess {
    /// Starts `bin agent --netns <netns>` with `--conf` and `--metrics-listen` when given,
    /// and waits for its start line.
    pub fn start(
        bin: &Path,
        netns: &Path,
        conf: Option<&Path>,
        metrics_listen: Option<&str>,
    ) -> Result<Self> {
        let args: Vec<&str> = metrics_listen
            .map(|m| vec!["--metrics-listen", m])
            .unwrap_or_default();
        Self::start_with(bin, netns, conf, &args)
    }

    /// [`AgentProcess::start`] with further arguments (`--cluster etcd …`).
    pub fn start_with(
        bin: &Path,
        netns: &Path,
        conf: Option<&Path>,
        args: &[&str],
    ) -> Result<Self> {
        let mut a = Self::spawn_with(bin, netns, conf, args)?;
        a.wait_for(STARTED, Duration::from_secs(10))?;
        Ok(a)
    }

    /// [`AgentProcess::start_with`] without waiting for its start line.
    pub fn spawn_with(
        bin: &Path,
        netns: &Path,
        conf: Option<&Path>,
        args: &[&str],
    ) -> Result<Self> {
        let mut cmd = Command::new(bin);
        cmd.env_remove("CNI_COMMAND")
            .arg("agent")
            .arg("--netns")
            .arg(netns)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(c) = conf {
            cmd.arg("--conf").arg(c);
        }
        cmd.args(args);
        let child = cmd.spawn().context("starting ebpf-cni agent")?;
        Self::read(child)
    }

    /// `bin` with exactly `args` (the agent's whole command line, as a container runs it: no
    /// `--netns` or `--conf` added) and only `env` (nothing of the test's own environment),
    /// started in `netns`, as a container runtime starts a `hostNetwork` container's process
    /// in the node's namespace. Does not wait for its start line.
    pub fn spawn_in(
        netns: &Netns,
        bin: &Path,
        args: &[String],
        env: &[(String, String)],
    ) -> Result<Self> {
        let child = netns.run_in(|| {
            Command::new(bin)
                .env_clear()
                .envs(env.iter().map(|(k, v)| (k, v)))
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
        })?;
        Self::read(child.with_context(|| format!("starting {} {}", bin.display(), args.join(" ")))?)
    }

    /// The agent `child`, its stderr read line by line by a thread of its own.
    fn read(mut child: Child) -> Result<Self> {
        let stderr = child.stderr.take().context("the agent's stderr")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            child,
            lines,
            seen: Vec::new(),
            next: 0,
        })
    }

    /// Waits until the agent says a line containing `what`, after the line the last wait
    /// matched (so a change said twice is waited for twice).
    pub fn wait_for(&mut self, what: &str, bound: Duration) -> Result<()> {
        let deadline = Instant::now() + bound;
        loop {
            if let Some(i) = self.seen[self.next..].iter().position(|l| l.contains(what)) {
                self.next += i + 1;
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.seen.push(l),
                Err(_) => bail!(
                    "the agent did not say {what:?} within {bound:?}; it said:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// SIGKILLs it and reaps it.
    pub fn kill(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// Every line it said so far.
    pub fn said(&mut self) -> String {
        while let Ok(l) = self.lines.try_recv() {
            self.seen.push(l);
        }
        self.seen.join("\n")
    }

    /// Fails if the agent has exited.
    pub fn still_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "the agent exited ({status}); it said:\n{}",
                self.seen.join("\n")
            );
        }
        Ok(())
    }

    /// Whether it ignores SIGPIPE (`SigIgn` in /proc/<pid>/status), as a process that
    /// writes to sockets whose peers may hang up must.
    pub fn ignores_sigpipe(&self) -> Result<bool> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let mask = status
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .context("no SigIgn in /proc/<pid>/status")?;
        let mask = u64::from_str_radix(mask.trim(), 16).context("SigIgn")?;
        Ok(mask & (1 << (libc::SIGPIPE - 1)) != 0)
    }

    /// Its resident memory (VmRSS), MiB.
    pub fn rss_mib(&self) -> Result<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .context("no VmRSS in the agent's /proc status")?;
        Ok(kib / 1024.0)
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
