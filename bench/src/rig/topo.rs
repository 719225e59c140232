//! The topologies every section builds: a node (the test harness's [`Node`], with the
//! harness's [`ExternalHost`] behind an uplink as the "external" client) running one CNI
//! subject's conflist, pods added through it, and the plain veth pair. Everything is torn
//! down by `Drop` (the harness deletes the namespaces, the node's pins and its IPAM
//! directory), also when a section fails half-way.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, ensure, Context as _, Result};
use ebpf_cni_tests::external::ExternalHost;
use ebpf_cni_tests::{AddResult, Attachment, CniRuntime, NetConfList, Netns, Node};
use serde_json::{json, Map, Value};

use crate::model::Subject;
use crate::rig::exec::{Chain, OpCost};

pub const NETWORK: &str = "benchnet";
pub const CNI_VERSION: &str = "1.0.0";
pub const IFNAME: &str = "eth0";
pub const POD_SUBNET_V4: &str = "10.88.0.0/16";
pub const POD_SUBNET_V6: &str = "fd00:88::/64";
pub const MTU: u32 = 1500;

/// The external client is the harness's external host of this number: 192.168.77.0/24.
const UPLINK_NET: u8 = 77;
/// The node's address on its uplink, and the external client's.
pub const NODE_UPLINK_IP: Ipv4Addr = Ipv4Addr::new(192, 168, UPLINK_NET, 1);
pub const EXT_IP: Ipv4Addr = Ipv4Addr::new(192, 168, UPLINK_NET, 2);
const UPLINK_DEV: &str = "uplink0";

/// The veth pair's addresses.
pub const VETH_A_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
pub const VETH_B_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);

/// The address families of the pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stack {
    /// IPv4 only, as most Kubernetes nodes run: every section but the dual-stack rows.
    V4,
    /// IPv4 + IPv6.
    Dual,
}

/// The binaries under test.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub ebpf_cni: PathBuf,
    /// The kernel floor of ADD and DEL (`bench/floor`, built in release by the run); `None`
    /// where the run has none (the bandwidth section's guest).
    pub floor: Option<PathBuf>,
}

/// What happens to pod traffic leaving the pod network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Egress {
    /// It keeps the pod's address (ipMasq off on both subjects): every section but one. The
    /// external client routes the pod network via the node.
    Routed,
    /// `ipMasq: true` on both subjects (ptp's iptables MASQUERADE; ebpf-cni's eBPF source
    /// NAT), and the external client has no route to the pod network: only the node's
    /// address gets answers.
    Masquerade,
}

/// The conflist of a CNI subject, as a node would configure it: same IPAM, MTU and routes
/// for both; ipMasq the same on both, off unless `egress` asks for masquerade (masquerading
/// adds rules and conntrack state a section not about it would measure too).
pub fn conflist(subject: Subject, data_dir: &Path, stack: Stack, egress: Egress) -> NetConfList {
    let masq = egress == Egress::Masquerade;
    let (ranges, routes) = match stack {
        Stack::V4 => (
            json!([[{ "subnet": POD_SUBNET_V4 }]]),
            json!([{ "dst": "0.0.0.0/0" }]),
        ),
        Stack::Dual => (
            json!([[{ "subnet": POD_SUBNET_V4 }], [{ "subnet": POD_SUBNET_V6 }]]),
            json!([{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]),
        ),
    };
    let ipam = json!({
        "type": "host-local",
        "ranges": ranges,
        "routes": routes,
        "dataDir": data_dir.to_string_lossy(),
    });
    let plugins = match subject {
        Subject::Reference => vec![
            json!({ "type": "ptp", "mtu": MTU, "ipMasq": masq, "ipam": ipam }),
            json!({ "type": "portmap", "capabilities": { "portMappings": true }, "snat": true }),
            json!({ "type": "bandwidth", "capabilities": { "bandwidth": true } }),
        ],
        Subject::EbpfCni => {
            let mut conf = json!({
                "type": "ebpf-cni",
                "mtu": MTU,
                "ipam": ipam,
                "capabilities": { "portMappings": true, "bandwidth": true },
            });
            if masq {
                conf["ipMasq"] = json!(true);
            }
            vec![conf]
        }
        Subject::Veth => unreachable!("the veth pair has no conflist"),
    };
    NetConfList {
        cni_version: CNI_VERSION.to_owned(),
        name: NETWORK.to_owned(),
        disable_check: false,
        plugins,
    }
}

/// `runtimeConfig.portMappings` as containerd sends it (Capitalized keys, empty HostIP).
pub fn port_mappings(pairs: &[(u16, u16)]) -> Value {
    Value::Array(
        pairs
            .iter()
            .map(|(host, container)| {
                json!({ "HostPort": host, "ContainerPort": container, "Protocol": "tcp", "HostIP": "" })
            })
            .collect(),
    )
}

/// `runtimeConfig.bandwidth` as containerd sends it: rates in bit/s, bursts in bits.
pub fn bandwidth(rate_bps: u64, burst_bits: u64) -> Value {
    json!({
        "IngressRate": rate_bps, "IngressBurst": burst_bits,
        "EgressRate": rate_bps, "EgressBurst": burst_bits,
    })
}

/// The burst the bench configures with a rate: 20 ms worth of traffic, at least 128 kbit
/// (tbf needs a burst of several MTUs to reach its rate).
pub fn burst_for(rate_bps: u64) -> u64 {
    (rate_bps / 50).max(131_072)
}

/// Capability arguments for one pod.
pub fn caps(mappings: &[(u16, u16)], rate_bps: Option<u64>) -> Map<String, Value> {
    let mut m = Map::new();
    if !mappings.is_empty() {
        m.insert("portMappings".into(), port_mappings(mappings));
    }
    if let Some(rate) = rate_bps {
        m.insert("bandwidth".into(), bandwidth(rate, burst_for(rate)));
    }
    m
}

/// A node running one CNI subject, with an uplink veth to an external client namespace
/// (present before any pod, as a node's NIC is).
pub struct BenchNode {
    pub subject: Subject,
    pub chain: Chain,
    /// The external client: the harness's external host number [`UPLINK_NET`] (192.168.77.2
    /// behind the node's 192.168.77.1, and IPv6 beside), routing everything via the node
    /// unless the node masquerades ([`Egress::Masquerade`]).
    pub external: ExternalHost,
    pub node: Node,
}

impl BenchNode {
    pub fn new(subject: Subject, bins: &Binaries) -> Result<Self> {
        Self::with_stack(subject, bins, Stack::V4)
    }

    pub fn with_stack(subject: Subject, bins: &Binaries, stack: Stack) -> Result<Self> {
        Self::with_egress(subject, bins, stack, Egress::Routed)
    }

    pub fn with_egress(
        subject: Subject,
        bins: &Binaries,
        stack: Stack,
        egress: Egress,
    ) -> Result<Self> {
        Self::with_list(subject, bins, stack, egress, |_| {})
    }

    /// [`Self::with_egress`] with the conflist changed by `edit` (a section's own setting,
    /// e.g. the source check's `sourceCheck`).
    pub fn with_list(
        subject: Subject,
        bins: &Binaries,
        stack: Stack,
        egress: Egress,
        edit: impl FnOnce(&mut NetConfList),
    ) -> Result<Self> {
        let node = Node::new().context("creating the node namespace")?;
        let external = ExternalHost::attach(node.netns(), UPLINK_DEV, UPLINK_NET)
            .context("creating the external client")?;
        ensure!(
            external.v4 == EXT_IP && external.node_v4 == NODE_UPLINK_IP,
            "the external client is {} behind {}, not {EXT_IP} behind {NODE_UPLINK_IP}",
            external.v4,
            external.node_v4
        );
        if egress == Egress::Masquerade {
            // The harness's host routes everything through the node; this one must not
            // reach the pods but through the node's address.
            for family in ["-4", "-6"] {
                external
                    .netns()
                    .ip_ok(&[family, "route", "del", "default"])?;
            }
        }
        let n = node.netns();
        let runtime = match subject {
            Subject::Reference => CniRuntime::reference(),
            Subject::EbpfCni => CniRuntime::with_plugin(&bins.ebpf_cni),
            Subject::Veth => bail!("the veth pair is not a node"),
        };
        let mut list = conflist(subject, node.data_dir(), stack, egress);
        edit(&mut list);
        let chain = Chain::new(list, runtime, n.path())?;
        Ok(Self {
            subject,
            chain,
            external,
            node,
        })
    }

    /// The external client's namespace.
    pub fn ext(&self) -> &Netns {
        self.external.netns()
    }

    /// A new pod namespace and the attachment a runtime would pass for it.
    pub fn new_pod(&self, name: &str, caps: Map<String, Value>) -> Result<Pod> {
        let netns = self.node.new_pod()?;
        let container_id = ebpf_cni_tests::unique_container_id();
        let mut att = Attachment::new(&container_id, netns.path(), IFNAME).with_args(&format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID={container_id}"
        ));
        att.capability_args = caps;
        Ok(Pod {
            netns,
            att,
            cached: None,
        })
    }

    /// ADD `pod`; keeps the result in it (the runtime's cache).
    pub fn add(&self, pod: &mut Pod) -> Result<OpCost> {
        let (result, cost) = self.chain.add(&pod.att)?;
        pod.cached = Some(result);
        Ok(cost)
    }

    /// [`Self::new_pod`] then [`Self::add`].
    pub fn add_pod(&self, name: &str, caps: Map<String, Value>) -> Result<(Pod, OpCost)> {
        let mut pod = self.new_pod(name, caps)?;
        let cost = self.add(&mut pod).with_context(|| format!("ADD {name}"))?;
        Ok((pod, cost))
    }

    pub fn del(&self, pod: &Pod) -> Result<OpCost> {
        self.chain.del(&pod.att, pod.cached.as_ref())
    }

    pub fn check(&self, pod: &Pod) -> Result<OpCost> {
        let cached = pod
            .cached
            .as_ref()
            .ok_or_else(|| anyhow!("CHECK of a pod that was never added"))?;
        self.chain.check(&pod.att, cached)
    }
}

/// A pod: its namespace, its attachment parameters and, after ADD, the cached result.
pub struct Pod {
    pub netns: Netns,
    pub att: Attachment,
    pub cached: Option<Value>,
}

impl Pod {
    pub fn ip4(&self) -> Result<Ipv4Addr> {
        let r = self
            .cached
            .as_ref()
            .and_then(AddResult::parse)
            .ok_or_else(|| anyhow!("pod has no parsable ADD result"))?;
        match r.ip4().map(|i| i.addr) {
            Some(IpAddr::V4(a)) => Ok(a),
            _ => bail!("pod got no IPv4 address"),
        }
    }
}

/// Two namespaces joined by a veth pair with static addresses.
pub struct VethPair {
    pub a: Netns,
    pub b: Netns,
}

impl VethPair {
    pub fn new() -> Result<Self> {
        let a = Netns::create("p")?;
        let b = Netns::create("p")?;
        add_veth(&a, IFNAME, &b)?;
        for (ns, ip) in [(&a, VETH_A_IP), (&b, VETH_B_IP)] {
            ns.ip_ok(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
            ns.ip_ok(&["link", "set", "eth0", "up"])?;
        }
        Ok(Self { a, b })
    }
}

/// A pod the node's kernel routes, as the reference `ptp` plugin wires one without its
/// rules: a veth pair from the node's namespace with no program on it, the pod's /32 routed
/// to the node's end, which holds `gateway` for the pod's default route.
pub struct RoutedPod {
    pub netns: Netns,
}

impl RoutedPod {
    pub fn new(node: &Netns, host_veth: &str, ip: Ipv4Addr, gateway: Ipv4Addr) -> Result<Self> {
        let netns = Netns::create("p")?;
        add_veth(node, host_veth, &netns)?;
        node.ip_ok(&["addr", "add", &format!("{gateway}/32"), "dev", host_veth])?;
        node.ip_ok(&["link", "set", host_veth, "up"])?;
        node.ip_ok(&["route", "add", &format!("{ip}/32"), "dev", host_veth])?;
        let gw = gateway.to_string();
        netns.ip_ok(&["addr", "add", &format!("{ip}/32"), "dev", IFNAME])?;
        netns.ip_ok(&["link", "set", IFNAME, "up"])?;
        netns.ip_ok(&["route", "add", &gw, "dev", IFNAME, "scope", "link"])?;
        netns.ip_ok(&["route", "add", "default", "via", &gw])?;
        Ok(Self { netns })
    }
}

/// A veth pair of MTU [`MTU`]: `name` in `ns`, its peer `eth0` in `peer_ns`.
fn add_veth(ns: &Netns, name: &str, peer_ns: &Netns) -> Result<()> {
    ns.ip_ok(&[
        "link",
        "add",
        name,
        "mtu",
        &MTU.to_string(),
        "type",
        "veth",
        "peer",
        "name",
        IFNAME,
        "netns",
        peer_ns.name(),
    ])?;
    Ok(())
}
