//! Disposable named network namespaces (`/run/netns/<name>`), and entering one from a
//! single thread.
//!
//! Names are `ecni-<role><pid>-<counter>`, unique across the threads of one process and
//! across processes, so parallel tests never share a namespace. A namespace is deleted when
//! its [`Netns`] is dropped; namespaces left behind by a killed test process are reaped the
//! next time a harness process starts (see [`reap_stale`]).

use std::fs::File;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

use anyhow::{bail, Context, Result};
use nix::sched::{setns, CloneFlags};

/// Prefix of every namespace the harness creates.
pub const NAME_PREFIX: &str = "ecni-";
const NETNS_DIR: &str = "/run/netns";

static COUNTER: AtomicU64 = AtomicU64::new(0);
static REAP: Once = Once::new();

/// (pid, per-process counter): the two halves of every unique name.
pub(crate) fn unique_parts() -> (u32, u64) {
    (std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// A named network namespace owned by the test; deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
    path: PathBuf,
    inode: u64,
    deleted: bool,
}

impl Netns {
    /// Creates `ecni-<role><pid>-<n>` and brings its loopback up. `role` is `n` (node) or
    /// `p` (pod): it makes `ip netns list` readable and lets [`reap_stale`] recognise ours.
    pub fn create(role: &str) -> Result<Self> {
        assert!(
            matches!(role, "n" | "p"),
            "netns role must be \"n\" or \"p\", not {role:?}"
        );
        REAP.call_once(reap_stale);
        let (pid, n) = unique_parts();
        let name = format!("{NAME_PREFIX}{role}{pid}-{n}");
        let out = Command::new("ip")
            .args(["netns", "add", &name])
            .output()
            .context("running `ip netns add`")?;
        if !out.status.success() {
            bail!(
                "ip netns add {name} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let path = Path::new(NETNS_DIR).join(&name);
        let mut ns = Self {
            name,
            path,
            inode: 0,
            deleted: false,
        };
        ns.inode = netns_inode(&ns.path)?;
        // Runtimes bring lo up (the loopback plugin); some checks (bind to 127.0.0.1) need it.
        ns.ip_ok(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<name>`: what goes into `CNI_NETNS`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The namespace's inode number (`stat -L /run/netns/<name>`), which ebpf-cni uses to name
    /// the node's pin directory.
    pub fn inode(&self) -> u64 {
        self.inode
    }

    /// Runs `cmd` under `ip netns exec` (which also remounts /sys: fine for `ip`, `ping`,
    /// `nft`, `cat /proc/sys/...`; not for anything that needs the host's bpffs).
    pub fn exec(&self, cmd: &[&str]) -> Result<Output> {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(cmd)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running `ip netns exec {} {}`", self.name, cmd.join(" ")))
    }

    /// Runs `cmd` with only the network namespace switched (`nsenter --net`), keeping the
    /// host's mounts (bpffs, /proc): for bpftool.
    pub fn nsenter(&self, cmd: &[&str]) -> Result<Output> {
        Command::new("nsenter")
            .arg(format!("--net={}", self.path.display()))
            .arg("--")
            .args(cmd)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running `nsenter` in {}: {}", self.name, cmd.join(" ")))
    }

    /// `ip -n <name> <args>`.
    pub fn ip(&self, args: &[&str]) -> Result<Output> {
        Command::new("ip")
            .args(["-n", &self.name])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running `ip -n {} {}`", self.name, args.join(" ")))
    }

    /// `ip -n <name> <args>`, failing unless it succeeds; returns stdout.
    pub fn ip_ok(&self, args: &[&str]) -> Result<String> {
        let out = self.ip(args)?;
        if !out.status.success() {
            bail!(
                "`ip -n {} {}` failed: {}",
                self.name,
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Reads a sysctl of this namespace, e.g. `net.ipv4.ip_forward`.
    pub fn sysctl(&self, key: &str) -> Result<String> {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        let out = self.exec(&["cat", &path])?;
        if !out.status.success() {
            bail!(
                "reading {path} in {}: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// Switches the *calling thread* into this namespace until the guard drops. Only that
    /// thread moves; sockets it creates meanwhile stay in this namespace for good.
    pub fn enter(&self) -> Result<NetnsGuard> {
        let original = File::open("/proc/thread-self/ns/net").context("opening own netns")?;
        let target =
            File::open(&self.path).with_context(|| format!("opening {}", self.path.display()))?;
        setns(&target, CloneFlags::CLONE_NEWNET)
            .with_context(|| format!("entering netns {}", self.name))?;
        Ok(NetnsGuard {
            original,
            _not_send: PhantomData,
        })
    }

    /// Runs `f` on a fresh thread that entered this namespace, and returns its value
    /// (a panic in `f` is propagated).
    pub fn run_in<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        std::thread::scope(|s| {
            let h = s.spawn(|| -> Result<T> {
                let _guard = self.enter()?;
                Ok(f())
            });
            match h.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Deletes the namespace now (e.g. "the runtime removed the pod netns before DEL").
    pub fn delete(mut self) -> Result<()> {
        self.deleted = true;
        delete_named(&self.name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if !self.deleted {
            if let Err(e) = delete_named(&self.name) {
                eprintln!("harness: {e:#}");
            }
        }
    }
}

/// Restores the thread's original network namespace on drop. Not `Send`: the namespace
/// belongs to the thread that entered it.
pub struct NetnsGuard {
    original: File,
    _not_send: PhantomData<*const ()>,
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if let Err(e) = setns(&self.original, CloneFlags::CLONE_NEWNET) {
            // A thread stuck in a foreign namespace could send traffic where it must not.
            eprintln!("harness: cannot restore the thread's netns ({e}); aborting");
            std::process::abort();
        }
    }
}

/// The inode of a namespace file (`stat -L`).
pub fn netns_inode(path: &Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata(path)
        .with_context(|| format!("stat {}", path.display()))?
        .ino())
}

fn delete_named(name: &str) -> Result<()> {
    let out = Command::new("ip")
        .args(["netns", "del", name])
        .stdin(Stdio::null())
        .output()
        .context("running `ip netns del`")?;
    if !out.status.success() {
        bail!(
            "ip netns del {name} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Deletes harness namespaces (and their ebpf-cni pins) whose creating process is gone,
/// e.g. after a test run was killed. Namespaces of live processes are never touched.
pub fn reap_stale() {
    let Ok(dir) = std::fs::read_dir(NETNS_DIR) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = owner_pid(&name) else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if let Ok(ino) = netns_inode(&entry.path()) {
            let _ = crate::fsutil::remove_tree(&crate::pin_root_for(ino));
        }
        let _ = delete_named(&name);
    }
}

/// `ecni-<role><pid>-<n>` → pid.
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(NAME_PREFIX)?;
    // Only the roles this harness creates, so namespaces named otherwise are never touched.
    let rest = rest.strip_prefix('n').or_else(|| rest.strip_prefix('p'))?;
    let (pid, n) = rest.split_once('-')?;
    n.parse::<u64>().ok()?;
    pid.parse().ok()
}

/// A container id unique across threads and processes, shaped like containerd's (64 hex).
pub fn unique_container_id() -> String {
    let (pid, n) = unique_parts();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{pid:016x}{n:016x}{:032x}", nanos)
}

#[cfg(test)]
mod tests {
    use super::owner_pid;

    #[test]
    fn owner_pid_parses_only_harness_names() {
        assert_eq!(owner_pid("ecni-n1234-7"), Some(1234));
        assert_eq!(owner_pid("ecni-p99-0"), Some(99));
        assert_eq!(owner_pid("ecni-n1234"), None);
        assert_eq!(owner_pid("cni-1234-5"), None);
        assert_eq!(owner_pid("ecni-nx-5"), None);
        assert_eq!(owner_pid("ecni-smoke-node"), None);
        assert_eq!(owner_pid("ecni-bench1-0"), None);
    }
}
