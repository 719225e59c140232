//! Harness for running CNI plugins against the real kernel inside disposable network
//! namespaces.
//!
//! A test builds a [`Node`] (a "node" network namespace, a private IPAM `dataDir` and the
//! bpffs pin root the plugin will use for that namespace), creates pod namespaces with
//! [`Node::new_pod`], and runs plugins either one invocation at a time ([`Node::run`]) or as
//! a container runtime runs a network configuration list ([`CniRuntime`], spec section 3).
//! Plugins run with only the *network* namespace switched to the node's, so they see the
//! host's `/sys/fs/bpf` and their pins outlive the invocation. What the plugin did is read
//! back from the kernel ([`kernel`], [`bpf`]) and from disk ([`Node::leases`],
//! [`Node::pinned_files`]); traffic is checked in-process between test-made namespaces only
//! ([`net`]). Everything is torn down in `Drop`, also when a test panics.
//!
//! For the dataplane (issue 3): [`external`] wires hosts outside a node to it through node
//! devices, [`netfilter`] sets and counts the node's FORWARD chain, and [`dataplane`] reads
//! (and, for CHECK tests, damages) the node-wide pinned maps with bpftool and runs
//! `ebpf-cni inspect`; [`spoof`] sends traffic with a source not the sender's own (issue
//! 27). [`progtest`] runs the TC programs themselves on frames [`packet`] builds, through
//! `BPF_PROG_TEST_RUN` (issue 25).
//!
//! The same library drives `cargo xtask demo` and `cargo xtask bench`.

pub mod bpf;
pub mod config;
pub mod dataplane;
pub mod external;
pub mod fsutil;
pub mod hostport;
pub mod kernel;
pub mod net;
pub mod netfilter;
pub mod netns;
pub mod node;
pub mod packet;
pub mod plugin;
pub mod progtest;
pub mod rate;
pub mod release;
pub mod result;
pub mod runtime;
pub mod spoof;
pub mod state;

use std::path::PathBuf;

pub use config::Stack;
pub use netns::{Netns, NetnsGuard};
pub use node::{Lease, Node, NodeSnapshot};
pub use plugin::{CniCommand, ContainerEnv, PluginOutput};
pub use result::{AddResult, ResultExpectation};
pub use runtime::{Attachment, CniRuntime, ListError, NetConfList};

/// The spec versions whose result format the tests check, oldest first.
pub const CNI_VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// Where Debian's containernetworking-plugins put the reference plugins.
pub const REFERENCE_PLUGIN_DIR: &str = "/usr/lib/cni";
/// The reference point-to-point plugin, the behaviour ebpf-cni's basics mirror.
pub const REFERENCE_PTP: &str = "/usr/lib/cni/ptp";
/// The reference host-local IPAM plugin, whose on-disk format ebpf-cni shares.
pub const REFERENCE_HOST_LOCAL: &str = "/usr/lib/cni/host-local";

/// Root of every pin ebpf-cni makes (one directory per node netns below it).
pub const BPF_PIN_BASE: &str = "/sys/fs/bpf/ebpf-cni/v1";
const _: () = assert!(ebpf_cni_maps::str_eq(
    BPF_PIN_BASE,
    // The bpffs mount point, then maps/'s project and layout directories.
    concat!("/sys/fs/bpf/", "ebpf-cni", "/", "v1")
));
const _: () = assert!(ebpf_cni_maps::str_eq(
    ebpf_cni_maps::pin::PROJECT_DIR,
    "ebpf-cni"
));
const _: () = assert!(ebpf_cni_maps::str_eq(
    ebpf_cni_maps::pin::LAYOUT_VERSION_DIR,
    "v1"
));

/// The pin directory ebpf-cni uses for the network namespace with inode `ino`.
pub fn pin_root_for(ino: u64) -> std::path::PathBuf {
    std::path::Path::new(BPF_PIN_BASE).join(format!("{}{ino}", ebpf_cni_maps::pin::NODE_DIR_PREFIX))
}

/// Environment variable carrying the path of the plugin binary under test.
pub const PLUGIN_BIN_ENV: &str = "EBPF_CNI_BIN";

/// Environment variable naming the eBPF object (`ebpf-cni-programs`) the program tests
/// load ([`progtest`]).
pub const PROGRAMS_OBJ_ENV: &str = "EBPF_CNI_PROGRAMS_OBJ";

/// The effective user id. The tests, the demo, the benchmark and the kernel matrix all need
/// root (namespaces, veths, bpffs pins); this is the one place that asks.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Panics unless running as root: these tests create namespaces and veths, and a test that
/// silently skips would pass without checking anything.
pub fn require_root() {
    let euid = euid();
    assert!(
        euid == 0,
        "these tests create network namespaces and must run as root (euid is {euid}); \
         run them through `cargo xtask test` as root"
    );
}

/// The ebpf-cni binary under test, from `EBPF_CNI_BIN`.
pub fn ebpf_cni_bin() -> PathBuf {
    bin_from_env(
        PLUGIN_BIN_ENV,
        "the ebpf-cni binary",
        "Run the tests with `cargo xtask test`, which builds the plugin and sets it",
    )
}

/// Environment variable carrying the path of the previous release's plugin binary, for the
/// upgrade test (`cargo xtask build-previous` builds it; `cargo xtask test` sets it).
pub const PREVIOUS_BIN_ENV: &str = "EBPF_CNI_PREVIOUS_BIN";

/// The previous release's ebpf-cni binary, from `EBPF_CNI_PREVIOUS_BIN`: panics with a hint
/// when unset (an upgrade test without the old build would check nothing).
pub fn previous_ebpf_cni_bin() -> PathBuf {
    bin_from_env(
        PREVIOUS_BIN_ENV,
        "the previous release's ebpf-cni binary",
        "`cargo xtask build-previous` builds it (once) and prints its path; \
         `cargo xtask test` builds it and sets the variable",
    )
}

/// The file `var` names; panics saying it must name `what`, and `hint`, when it does not.
pub(crate) fn bin_from_env(var: &str, what: &str, hint: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(p) if !p.is_empty() => {
            let p = PathBuf::from(p);
            assert!(
                p.is_file(),
                "{var}={} does not name a file: it must name {what}. {hint}",
                p.display()
            );
            p
        }
        _ => panic!("{var} is not set: it must name {what}. {hint}"),
    }
}

/// The conflist `type` naming a plugin binary: its file name.
pub fn plugin_type(bin: &std::path::Path) -> String {
    bin.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| panic!("plugin path {} has no file name", bin.display()))
}

/// A container id unique across threads and processes, shaped like containerd's (64 hex).
pub fn unique_container_id() -> String {
    let (pid, n) = netns::unique_parts();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{pid:016x}{n:016x}{:032x}", nanos)
}

/// A plugin binary plus the runtime that finds it and its IPAM delegate: the thing a test,
/// the demo or the benchmark drives. Tests of ebpf-cni and of the reference chain differ
/// only in which of these they build.
#[derive(Debug, Clone)]
pub struct PluginUnderTest {
    pub bin: PathBuf,
    /// The configuration `type` naming `bin`.
    pub plugin_type: String,
    pub runtime: CniRuntime,
}

impl PluginUnderTest {
    /// ebpf-cni from `EBPF_CNI_BIN` (panics with a hint when unset).
    pub fn ebpf_cni() -> Self {
        Self::at(ebpf_cni_bin())
    }

    /// The previous release's ebpf-cni from `EBPF_CNI_PREVIOUS_BIN` (panics with a hint
    /// when unset).
    pub fn previous_ebpf_cni() -> Self {
        Self::at(previous_ebpf_cni_bin())
    }

    /// Debian's ptp (with host-local beside it).
    pub fn reference_ptp() -> Self {
        Self::at(PathBuf::from(REFERENCE_PTP))
    }

    /// Any plugin binary; `CNI_PATH` is its directory, then the reference plugins.
    pub fn at(bin: PathBuf) -> Self {
        Self {
            plugin_type: plugin_type(&bin),
            runtime: CniRuntime::with_plugin(&bin),
            bin,
        }
    }

    /// [`config::standard`] for this plugin on `node`.
    pub fn conf(&self, cni_version: &str, node: &Node, stack: Stack) -> serde_json::Value {
        config::standard(
            cni_version,
            config::NETWORK,
            &self.plugin_type,
            node.data_dir(),
            stack,
        )
    }

    /// Attachment parameters with this runtime's `CNI_PATH`.
    pub fn env(
        &self,
        container_id: &str,
        netns: impl AsRef<std::path::Path>,
        ifname: &str,
    ) -> ContainerEnv {
        ContainerEnv::new(container_id, netns, ifname).with_cni_path(&self.runtime.cni_path_env())
    }

    /// One invocation in `node`.
    pub fn run(
        &self,
        node: &Node,
        command: CniCommand,
        env: &ContainerEnv,
        stdin: impl AsRef<[u8]>,
    ) -> PluginOutput {
        node.run(&self.bin, command, env, stdin)
            .unwrap_or_else(|e| panic!("running {} {command}: {e:#}", self.bin.display()))
    }
}
