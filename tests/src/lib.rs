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
//! inspect`; [`source_check`] sends traffic with a source not the sender's own (for the source
//! check). [`progtest`] runs the TC programs themselves on frames [`packet`] builds,
//! through `BPF_PROG_TEST_RUN`; [`pod`] is the tests' pod.
//!
//! [`kube_api`] stands in for the Kubernetes API server (Node objects: list, watch, get, status
//! patch, over HTTPS) for the node agent's tests.
//!
//! The same library drives `cargo xtask demo` and `cargo xtask bench`.

pub mod agent;
pub mod bpf;
pub mod config;
pub mod dataplane;
pub mod etcd;
pub mod external;
pub mod fsutil;
pub mod host_ports;
pub mod kernel;
pub mod kube_api;
pub mod kube_proxy;
pub mod lan;
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
pub mod source_check;
pub mod state;
pub mod strace;
pub mod under_test;

pub use config::Stack;
pub(crate) use machine::bin_from_env;
pub use machine::{
    ebpf_cni_bin, euid, pin_root_for, plugin_type, previous_ebpf_cni_bin, require_root,
    BPF_PIN_BASE, CNI_VERSIONS, PLUGIN_BIN_ENV, PREVIOUS_BIN_ENV, PROGRAMS_OBJ_ENV,
    PROTOTYPES_OBJ_ENV, REFERENCE_HOST_LOCAL, REFERENCE_PLUGIN_DIR, REFERENCE_PTP,
};
pub use netns::{unique_container_id, Netns, NetnsGuard};
pub use node::{Lease, Node, NodeSnapshot};
pub use plugin::{CniCommand, ContainerEnv, PluginOutput};
pub use pod::Pod;
pub use result::{AddResult, ResultExpectation};
pub use runtime::{Attachment, CniRuntime, ListError, NetConfList};
pub use under_test::PluginUnderTest;
