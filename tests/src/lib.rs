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
//! For the dataplane: [`external`] wires hosts outside a node to it through node devices,
//! [`netfilter`] sets and counts the node's FORWARD chain, and [`dataplane`] reads (and,
//! for CHECK tests, damages) the node-wide pinned maps with bpftool and runs `ebpf-cni
//! inspect`; [`spoof`] sends traffic with a source not the sender's own (for the source
//! check). [`progtest`] runs the TC programs themselves on frames [`packet`] builds,
//! through `BPF_PROG_TEST_RUN`; [`pod`] is the tests' pod.
//!
//! The same library drives `cargo xtask demo` and `cargo xtask bench`.

pub mod agent;
pub mod bpf;
pub mod config;
pub mod dataplane;
pub mod external;
pub mod fsutil;
pub mod hostport;
pub mod kernel;
pub mod kube_proxy;
mod machine;
pub mod net;
pub mod netfilter;
pub mod netns;
pub mod node;
pub mod packet;
pub mod plugin;
pub mod pod;
pub mod progtest;
pub mod rate;
pub mod release;
pub mod result;
pub mod rtevents;
pub mod runtime;
pub mod spoof;
pub mod state;
pub mod strace;

use std::path::PathBuf;

pub use config::Stack;
pub(crate) use machine::bin_from_env;
pub use machine::{
    ebpf_cni_bin, euid, pin_root_for, plugin_type, previous_ebpf_cni_bin, require_root,
    BPF_PIN_BASE, CNI_VERSIONS, PLUGIN_BIN_ENV, PREVIOUS_BIN_ENV, PROGRAMS_OBJ_ENV,
    REFERENCE_HOST_LOCAL, REFERENCE_PLUGIN_DIR, REFERENCE_PTP,
};
pub use netns::{Netns, NetnsGuard};
pub use node::{Lease, Node, NodeSnapshot};
pub use plugin::{CniCommand, ContainerEnv, PluginOutput};
pub use pod::Pod;
pub use result::{AddResult, ResultExpectation};
pub use runtime::{Attachment, CniRuntime, ListError, NetConfList};

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

    /// CHECK of the attachment `env` names, with `conf` and `prev_result` as its
    /// `prevResult` (what a runtime sends).
    pub fn check(
        &self,
        node: &Node,
        env: &ContainerEnv,
        conf: &serde_json::Value,
        prev_result: &serde_json::Value,
    ) -> PluginOutput {
        let mut c = conf.clone();
        c["prevResult"] = prev_result.clone();
        self.run(node, CniCommand::Check, env, c.to_string())
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
