//! A test "node": a network namespace standing in for the host, a private scratch
//! directory holding the IPAM `dataDir`, and the bpffs pin directory ebpf-cni derives from
//! the namespace. Dropping it removes all three, so one node per test leaves nothing behind.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tempfile::TempDir;

use crate::netns::Netns;
use crate::plugin::{run_plugin, CniCommand, ContainerEnv, PluginOutput};
use crate::{fsutil, kernel, pin_root_for};

/// One IP reservation in host-local's on-disk format: a file named after the IP whose
/// content is `<containerID>\r\n<ifname>` (the ifname line is absent in old formats).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Lease {
    pub ip: IpAddr,
    pub container_id: String,
    pub ifname: Option<String>,
}

/// What a failed call must not change: links in the node (and a pod), files in the
/// dataDir, pinned files and directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSnapshot {
    pub node_links: BTreeSet<String>,
    pub node_routes: BTreeSet<String>,
    /// `<ifname> <address>/<prefix>` of every node address but IPv6 link-local ones (those
    /// come and go with their links): a pod's gateway held on `lo` shows here.
    pub node_addrs: BTreeSet<String>,
    pub pod_links: Option<BTreeSet<String>>,
    /// Node links carrying a `clsact` qdisc: a failed ADD must not leave one on a node
    /// device (the pods' veths go with the pods).
    pub node_clsact: BTreeSet<String>,
    pub data_dir_files: Vec<PathBuf>,
    pub pinned_files: Vec<PathBuf>,
    /// Whether the node's pin root exists, and every directory below it (empty ones too).
    pub pin_root_exists: bool,
    pub pinned_dirs: Vec<PathBuf>,
}

impl NodeSnapshot {
    /// The snapshot without the IPAM store's (empty) lock file, which the store's first
    /// transaction creates for good: a failed call may leave it.
    pub fn without_lock(mut self) -> Self {
        self.data_dir_files
            .retain(|f| f.file_name().is_none_or(|n| n != "lock"));
        self
    }
}

#[derive(Debug)]
pub struct Node {
    netns: Netns,
    scratch: TempDir,
    data_dir: PathBuf,
    pin_root: PathBuf,
}

impl Node {
    /// Creates the node namespace and scratch directory (requires root).
    pub fn new() -> Result<Self> {
        crate::require_root();
        let netns = Netns::create("n")?;
        let scratch = tempfile::Builder::new()
            .prefix("ecni-test-")
            .tempdir()
            .context("creating the node's scratch directory")?;
        // One level below the scratch root, so a "../x" network name that escapes the
        // dataDir still lands somewhere the test owns and can look at.
        let data_dir = scratch.path().join("ipam");
        std::fs::create_dir(&data_dir).context("creating dataDir")?;
        let pin_root = pin_root_for(netns.inode());
        // No plugin ran in a namespace just made: pins under its inode are a dead
        // namespace's whose inode the kernel gave out again (a killed run's, or a
        // benchmark's that left them), and would pass for this node's.
        if pin_root.exists() {
            crate::fsutil::remove_tree(&pin_root)
                .with_context(|| format!("removing stale pins at {}", pin_root.display()))?;
        }
        Ok(Self {
            netns,
            scratch,
            data_dir,
            pin_root,
        })
    }

    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// The IPAM `dataDir` to put into configurations.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The scratch directory holding `data_dir` (removed on drop).
    pub fn scratch_dir(&self) -> &Path {
        self.scratch.path()
    }

    /// `/sys/fs/bpf/ebpf-cni/v1/netns-<inode of the node netns>`.
    pub fn pin_root(&self) -> &Path {
        &self.pin_root
    }

    /// Where ebpf-cni pins the programs of one attachment.
    pub fn attachment_pin_dir(&self, network: &str, container_id: &str, ifname: &str) -> PathBuf {
        self.pin_root
            .join(ebpf_cni_maps::pin::ATTACHMENTS_DIR)
            .join(pinned_name(network))
            .join(pinned_name(container_id))
            .join(pinned_name(ifname))
    }

    /// A new pod namespace; the caller owns it (dropping it deletes it).
    pub fn new_pod(&self) -> Result<Netns> {
        Netns::create("p")
    }

    /// Runs one plugin invocation inside the node namespace (network namespace only).
    pub fn run(
        &self,
        plugin: &Path,
        command: CniCommand,
        env: &ContainerEnv,
        stdin: impl AsRef<[u8]>,
    ) -> Result<PluginOutput> {
        run_plugin(
            plugin,
            Some(self.netns.path()),
            command,
            env,
            stdin.as_ref(),
        )
    }

    /// Runs `plugin` in the node with no netfilter tool on the machine, as the
    /// DaemonSet's image runs it (`plugin::run_plugin_without_host_tools`).
    pub fn run_without_host_tools(
        &self,
        plugin: &Path,
        command: CniCommand,
        env: &ContainerEnv,
        stdin: impl AsRef<[u8]>,
    ) -> Result<PluginOutput> {
        crate::plugin::run_plugin_without_host_tools(
            plugin,
            self.netns.path(),
            command,
            env,
            stdin.as_ref(),
        )
    }

    /// Runs `plugin` as someone trying it by hand does, `ip netns exec <node> plugin`
    /// (a mount namespace of its own, a fresh sysfs: no bpffs at `/sys/fs/bpf`).
    pub fn run_by_hand(
        &self,
        plugin: &Path,
        command: CniCommand,
        env: &ContainerEnv,
        stdin: impl AsRef<[u8]>,
    ) -> Result<PluginOutput> {
        crate::plugin::run_plugin_by_hand(plugin, self.netns.name(), command, env, stdin.as_ref())
    }

    /// Every file below the dataDir, relative to it.
    pub fn data_dir_files(&self) -> Vec<PathBuf> {
        fsutil::list_files(&self.data_dir).expect("listing dataDir")
    }

    /// Every file below this node's pin root, relative to it.
    pub fn pinned_files(&self) -> Vec<PathBuf> {
        fsutil::list_files(&self.pin_root).expect("listing the node's pin root")
    }

    /// The IP reservations of `network` (files named by an IP under `<dataDir>/<network>`;
    /// `lock` and `last_reserved_ip.*` are bookkeeping, not leases).
    pub fn leases(&self, network: &str) -> Vec<Lease> {
        let dir = self.data_dir.join(network);
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return out;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // host-local escapes nothing in v4/v6 names, so the name parses as an IP.
            let Ok(ip) = name.parse::<IpAddr>() else {
                continue;
            };
            let content = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let mut lines = content.split("\r\n").map(str::trim);
            let container_id = lines.next().unwrap_or_default().to_owned();
            let ifname = lines.next().filter(|s| !s.is_empty()).map(str::to_owned);
            out.push(Lease {
                ip,
                container_id,
                ifname,
            });
        }
        out.sort();
        out
    }

    /// The node's `net.ipv4.ip_local_reserved_ports` (masquerade reserves its port range
    /// there; the last DEL gives it back).
    pub fn reserved_ports(&self) -> String {
        let out = self
            .netns
            .exec(&["cat", "/proc/sys/net/ipv4/ip_local_reserved_ports"])
            .expect("reading ip_local_reserved_ports");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The state a failing call must leave exactly as it was. `pod` adds the pod's links.
    pub fn snapshot(&self, pod: Option<&Netns>) -> NodeSnapshot {
        let names = |ns: &Netns| -> BTreeSet<String> {
            kernel::links(ns)
                .expect("reading links")
                .into_iter()
                .map(|l| l.ifname)
                .collect()
        };
        let mut node_routes: BTreeSet<String> = BTreeSet::new();
        for fam in [kernel::Family::V4, kernel::Family::V6] {
            for r in kernel::routes(&self.netns, fam).expect("reading routes") {
                node_routes.insert(format!("{} dev {}", r.dst, r.dev.unwrap_or_default()));
            }
        }
        let node_addrs = kernel::addrs(&self.netns)
            .expect("reading node addresses")
            .into_iter()
            .flat_map(|l| {
                l.addr_info
                    .iter()
                    .filter(|a| a.scope != "link")
                    .map(|a| format!("{} {}/{}", l.ifname, a.local, a.prefixlen))
                    .collect::<Vec<_>>()
            })
            .collect();
        NodeSnapshot {
            node_links: names(&self.netns),
            node_routes,
            node_addrs,
            pod_links: pod.map(names),
            node_clsact: kernel::clsact_links(&self.netns)
                .expect("reading node qdiscs")
                .into_iter()
                .collect(),
            data_dir_files: self.data_dir_files(),
            pinned_files: self.pinned_files(),
            pin_root_exists: self.pin_root.exists(),
            pinned_dirs: fsutil::list_dirs(&self.pin_root).expect("listing the node's pin root"),
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Pins first: removing a pinned link detaches its program while the device exists.
        if let Err(e) = fsutil::remove_tree(&self.pin_root) {
            eprintln!("harness: removing pins {}: {e}", self.pin_root.display());
        }
        // The namespace and the scratch directory go with their own Drop impls.
    }
}

/// The path component bpffs holds for a network, container id or interface name: bpffs
/// refuses names with a `.`, so ebpf-cni writes `.` as `%2e` (and `%` as `%25`); every other
/// name is itself. The tests spell the layout out rather than share the plugin's code.
pub fn pinned_name(name: &str) -> String {
    name.replace('%', "%25").replace('.', "%2e")
}
