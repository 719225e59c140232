//! The integration tests' pod: a namespace of the node, the attachment parameters the
//! runtime used for it (`eth0`, a unique container id) and the ADD result it keeps for
//! CHECK and DEL. A pod is added through a [`CniRuntime`] and a list ([`Pod::add`],
//! [`Pod::try_add`]) or by one invocation of the plugin with a configuration as written
//! ([`Pod::add_direct`]), and removed the same way; everything else a test asks of it
//! (its addresses, its host veth) is read from the result.

use std::net::IpAddr;

use serde_json::Value;

use crate::kernel::Family;
use crate::{
    bpf, AddResult, Attachment, CniCommand, CniRuntime, ContainerEnv, ListError, NetConfList,
    Netns, Node, PluginUnderTest, ResultExpectation, Stack,
};

/// The pod's interface in its namespace.
pub const IFNAME: &str = "eth0";

/// One pod attached to a node.
pub struct Pod {
    pub netns: Netns,
    pub att: Attachment,
    /// The ADD result, as the runtime caches it.
    pub result: Value,
    /// `result` parsed (and judged, when the pod was added by [`Pod::add`]).
    pub r: AddResult,
}

impl Pod {
    /// A new pod of `node` ADDed through `runtime` with `list`; `tweak` adds to the
    /// attachment (capability arguments, `CNI_ARGS`, extra environment). The result is
    /// parsed without judging it (a chain's, or the reference plugins').
    pub fn try_add(
        runtime: &CniRuntime,
        node: &Node,
        list: &NetConfList,
        tweak: impl FnOnce(Attachment) -> Attachment,
    ) -> Result<Self, ListError> {
        let netns = node.new_pod().unwrap();
        let att = tweak(Attachment::new(
            &crate::netns::unique_container_id(),
            netns.path(),
            IFNAME,
        ));
        let result = runtime.add(node, list, &att)?;
        Ok(Self::attached(netns, att, result))
    }

    /// ebpf-cni's pod: [`Pod::try_add`] through `p`'s runtime, panicking when ADD fails,
    /// and the result judged as [`ResultExpectation::standard`] for the list's version and
    /// `stack`, with ebpf-cni's host names.
    pub fn add(p: &PluginUnderTest, node: &Node, list: &NetConfList, stack: Stack) -> Self {
        Self::add_with(p, node, list, stack, |a| a)
    }

    /// [`Pod::add`] with `tweak` adding to the attachment.
    pub fn add_with(
        p: &PluginUnderTest,
        node: &Node,
        list: &NetConfList,
        stack: Stack,
        tweak: impl FnOnce(Attachment) -> Attachment,
    ) -> Self {
        Self::try_add(&p.runtime, node, list, tweak)
            .unwrap_or_else(|e| panic!("ADD: {e}"))
            .assert_standard(&list.cni_version, stack)
    }

    /// A pod ADDed by one invocation of `p` with `conf` as it is (no list, no capability
    /// arguments: what the configuration holds is what the plugin gets).
    pub fn add_direct(p: &PluginUnderTest, node: &Node, conf: &Value) -> Self {
        let netns = node.new_pod().unwrap();
        let att = Attachment::new(&crate::netns::unique_container_id(), netns.path(), IFNAME);
        let out = p.run(
            node,
            CniCommand::Add,
            &p.runtime.env(&att),
            conf.to_string(),
        );
        out.expect_success("ADD");
        let result = out.json.clone().expect("ADD result");
        Self::attached(netns, att, result)
    }

    /// The pod of an ADD made by the test itself.
    pub fn attached(netns: Netns, att: Attachment, result: Value) -> Self {
        let r = AddResult::parse(&result)
            .unwrap_or_else(|| panic!("an ADD result with interfaces and ips: {result}"));
        Self {
            netns,
            att,
            result,
            r,
        }
    }

    /// Panics unless the result is ebpf-cni's [`ResultExpectation::standard`] one for
    /// `cni_version` and `stack`.
    pub fn assert_standard(mut self, cni_version: &str, stack: Stack) -> Self {
        self.r = ResultExpectation::standard(
            cni_version,
            IFNAME,
            &self.netns.path().to_string_lossy(),
            stack,
        )
        .ebpf_cni_host_names()
        .assert_valid(&self.result);
        self
    }

    /// DEL through `p`'s runtime with the cached result; panics when it fails.
    pub fn del(&self, p: &PluginUnderTest, node: &Node, list: &NetConfList) {
        p.runtime
            .del(node, list, &self.att, Some(&self.result))
            .unwrap_or_else(|e| panic!("DEL {}: {e}", self.id()));
    }

    /// DEL by one invocation of `p` with `conf` (the one the pod was added with).
    pub fn del_direct(&self, p: &PluginUnderTest, node: &Node, conf: &Value) {
        p.run(node, CniCommand::Del, &self.env(p), conf.to_string())
            .expect_success("DEL");
    }

    /// The attachment parameters of one invocation of `p` about this pod.
    pub fn env(&self, p: &PluginUnderTest) -> ContainerEnv {
        p.runtime.env(&self.att)
    }

    pub fn id(&self) -> &str {
        &self.att.container_id
    }

    pub fn v4(&self) -> IpAddr {
        self.r.ip4().expect("the pod has IPv4").addr
    }

    pub fn v6(&self) -> IpAddr {
        self.r.ip6().expect("the pod has IPv6").addr
    }

    pub fn addr(&self, family: Family) -> IpAddr {
        match family {
            Family::V4 => self.v4(),
            Family::V6 => self.v6(),
        }
    }

    /// Every address of the result, in its order.
    pub fn ips(&self) -> Vec<IpAddr> {
        self.r.ips.iter().map(|i| i.addr).collect()
    }

    /// The ifindex, in the node, of the interface the result lists first (ebpf-cni's and
    /// ptp's host veth).
    pub fn host_ifindex(&self, node: &Node) -> u32 {
        bpf::ifindex_in(node.netns(), &self.r.host_ifname).expect("host veth ifindex")
    }
}
