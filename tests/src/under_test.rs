//! The subject a test, the demo or the benchmark drives: a plugin binary and the runtime
//! that finds it.

use std::path::PathBuf;

use crate::config::{self, Stack};
use crate::machine::{ebpf_cni_bin, plugin_type, previous_ebpf_cni_bin, REFERENCE_PTP};
use crate::node::Node;
use crate::plugin::{CniCommand, ContainerEnv, PluginOutput};
use crate::runtime::CniRuntime;

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
