//! One attachment, `(network, container id, ifname)`, as the commands see it: its key, the
//! mode its config puts it in (ebpf-cni makes the pod's interface, or is chained after the
//! plugin that did), and what CHECK reports about it (plain and chained CHECK alike).

use std::net::{IpAddr, Ipv4Addr};

use ipnetwork::IpNetwork;

use crate::{
    bandwidth::Limits,
    bpf::{self, AttachmentKey, BpfError, Hook, LimitSpec, MasqSpec, PodIp, PodSpec, Veth},
    cni::{
        code,
        config::{MasqConf, NetConf},
        env::CniEnv,
        CniError,
    },
    host_ports::PortMapping,
    netlink::{Link, Netlink},
    netns::Netns,
    source_check::SourceConf,
};

/// What is wrong with an attachment's veth pair or, for CHECK, its dataplane.
#[derive(Debug, thiserror::Error)]
pub enum AttachmentError {
    #[error("veth pair {host} / {pod} has no MAC address")]
    NoMac { host: String, pod: String },
    /// CHECK found the dataplane unlike ADD left it.
    #[error(transparent)]
    Dataplane(DataplaneMismatch),
    #[error("eBPF dataplane: no {} filter of program {program} on {host} (netlink mode)", if *.ingress { "ingress" } else { "egress" })]
    NoFilter {
        ingress: bool,
        program: &'static str,
        host: String,
    },
}

impl AttachmentError {
    /// CHECK's findings are 105 whatever the `BpfError`'s own code.
    pub fn cni_code(&self) -> u32 {
        match self {
            Self::NoMac { .. } => code::KERNEL,
            Self::Dataplane(_) | Self::NoFilter { .. } => code::CHECK_FAILED,
        }
    }
}

/// What CHECK found unlike ADD left it (code 105), or a CHECK without `prevResult`
/// (code 7), in plain and chained mode. `sandbox` is the container's netns path.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("prevResult is required for CHECK (spec: CHECK)")]
    NoPrevResult,
    #[error("prevResult lists no interface {ifname:?} in sandbox {sandbox}")]
    NotInPrevResult { ifname: String, sandbox: String },
    #[error("host veth {host} is missing")]
    HostVethMissing { host: String },
    #[error("host veth {host} is down")]
    HostVethDown { host: String },
    #[error("interface {ifname} is missing from {sandbox}")]
    InterfaceMissing { ifname: String, sandbox: String },
    #[error("interface {ifname} has MAC {mac}, prevResult says {expected}")]
    WrongMac {
        ifname: String,
        mac: String,
        expected: String,
    },
    #[error("interface {ifname} in {sandbox} is down")]
    InterfaceDown { ifname: String, sandbox: String },
    #[error("address {address} is missing from {ifname} in {sandbox}")]
    AddressMissing {
        address: IpNetwork,
        ifname: String,
        sandbox: String,
    },
    #[error("route to gateway {gw} via {ifname} is missing in {sandbox}")]
    GatewayRouteMissing {
        gw: IpAddr,
        ifname: String,
        sandbox: String,
    },
    #[error("route {dst}{} is missing in {sandbox}", .gw.map(|g| format!(" via {g}")).unwrap_or_default())]
    RouteMissing {
        dst: IpNetwork,
        gw: Option<IpAddr>,
        sandbox: String,
    },
    #[error("host route {dst} dev {host} is missing in the node namespace")]
    HostRouteMissing { dst: IpNetwork, host: String },
    /// The pod's IPv6 gateway, which the host veth holds (the pod's neighbour discovery
    /// for it goes unanswered without it).
    #[error("gateway {gw} is missing from host veth {host}")]
    HostGatewayMissing { gw: IpAddr, host: String },
}

impl CheckError {
    pub fn cni_code(&self) -> u32 {
        match self {
            Self::NoPrevResult => code::INVALID_CONFIG,
            _ => code::CHECK_FAILED,
        }
    }
}

/// A `BpfError` from CHECK's comparison, said as a finding: its message after "eBPF
/// dataplane: ", its causes (a netlink or syscall error) as this error's own, so they are
/// not said twice.
#[derive(Debug)]
pub struct DataplaneMismatch(pub BpfError);

impl std::fmt::Display for DataplaneMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "eBPF dataplane: {}", self.0)
    }
}

impl std::error::Error for DataplaneMismatch {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.0)
    }
}

/// The attachment `env` names in the network of `conf`.
pub fn key<'a>(conf: &'a NetConf, env: &'a CniEnv) -> AttachmentKey<'a> {
    AttachmentKey {
        network: &conf.name,
        container_id: &env.container_id,
        ifname: &env.ifname,
    }
}

/// One address of the pod's interface: the address with its prefix, its gateway (from
/// IPAM or the previous plugin) and the IPv4 gateway the programs answer ARP for, if any.
#[derive(Clone, Copy, Debug)]
pub struct PodAddr {
    pub address: IpNetwork,
    pub gateway: Option<IpAddr>,
    pub gateway4: Option<Ipv4Addr>,
}

/// The capability arguments of one request (network config, `runtimeConfig`, `CNI_ARGS`),
/// each parsed once by its capability's module and validated before anything changes:
/// the typed form of what the request asks of the pod's dataplane.
#[derive(Debug)]
pub struct PodConf {
    pub limits: Limits,
    pub port_mappings: Vec<PortMapping>,
    pub sources: SourceConf,
    /// `ipMasq` (a network setting).
    pub masq: Option<MasqConf>,
    /// `clusterNetworks`: pods on the other nodes, which masquerade skips.
    pub cluster_networks: Vec<IpNetwork>,
}

impl PodConf {
    pub fn parse(conf: &NetConf, env: &CniEnv) -> Result<Self, CniError> {
        Ok(Self {
            limits: crate::bandwidth::limits(conf)?,
            port_mappings: crate::host_ports::mappings(conf)?,
            sources: SourceConf::parse(conf, env)?,
            masq: conf.masq.clone(),
            cluster_networks: conf.cluster_networks.clone(),
        })
    }

    /// What the dataplane of a pod with addresses `addrs` in `pod_ns` holds: one
    /// description, built once per request before anything changes (ADD), or from the
    /// result ADD gave (CHECK), in both modes. Its host ports are validated against the
    /// pod's addresses here (a family the pod has no address of is refused).
    pub fn pod_spec(
        &self,
        addrs: &[PodAddr],
        pod_ns: &Netns,
        chained: bool,
    ) -> Result<PodSpec, CniError> {
        let ips: Vec<IpAddr> = addrs.iter().map(|a| a.address.ip()).collect();
        let gateways: Vec<(IpAddr, Option<IpAddr>)> =
            addrs.iter().map(|a| (a.address.ip(), a.gateway)).collect();
        let networks: Vec<IpNetwork> = addrs.iter().map(|a| a.address).collect();
        Ok(PodSpec {
            chained,
            addrs: addrs
                .iter()
                .map(|a| PodIp {
                    ip: a.address.ip(),
                    gateway4: a.gateway4,
                })
                .collect(),
            sources: self.sources.allowed(&ips),
            limits: LimitSpec {
                rate: self.limits.to_map_value(),
                shape_subnets: self.limits.subnet_keys(),
                netns_cookie: pacing_cookie(&self.limits, pod_ns)?,
            },
            // Chained mode refuses `ipMasq` (ADD): the plugin before ebpf-cni masquerades.
            masq: self
                .masq
                .as_ref()
                .filter(|_| !chained)
                .map(|m| masq_spec(m, &networks, &self.cluster_networks)),
            ports: crate::host_ports::entries(&self.port_mappings, &gateways)?,
        })
    }
}

/// The two ends of the pod's veth pair, as the dataplane takes them.
pub fn veth(host: &Link, pod: &Link) -> Result<Veth, AttachmentError> {
    let (Some(host_mac), Some(pod_mac)) = (host.mac, pod.mac) else {
        return Err(AttachmentError::NoMac {
            host: host.name.clone(),
            pod: pod.name.clone(),
        });
    };
    Ok(Veth {
        host_name: host.name.clone(),
        host_ifindex: host.index,
        host_mac,
        pod_mac,
    })
}

/// What `ipMasq` asks of the node for a pod with addresses `addrs`: the subnets of those
/// addresses (the pod network's ranges), `ipMasqExclude` and the cluster's pod networks
/// keep the pod's address (what masqueraded flows leave with is the node's devices'
/// addresses: `node::node_view`).
fn masq_spec(m: &MasqConf, addrs: &[IpNetwork], cluster: &[IpNetwork]) -> MasqSpec {
    let mut skip: Vec<IpNetwork> = addrs
        .iter()
        .map(|a| IpNetwork::new(a.network(), a.prefix()).expect("prefix is valid"))
        .chain(m.exclude.iter().copied())
        .chain(cluster.iter().copied())
        .collect();
    skip.sort();
    skip.dedup();
    MasqSpec {
        skip,
        ports: m.ports,
    }
}

/// Whether `conf` puts ebpf-cni in chained mode: a config without `ipam` (ebpf-cni cannot
/// address a pod without one), so DEL, CHECK and GC know it without `prevResult`. See
/// `chained`.
pub fn is_chained(conf: &NetConf) -> bool {
    conf.ipam.is_none()
}

/// The pod's netns cookie when its egress limit makes its TCP sockets paced (the pacing
/// map's key), else 0: reading it enters the pod's namespace, which pods without limits are spared.
fn pacing_cookie(limits: &Limits, pod_ns: &Netns) -> Result<u64, CniError> {
    if bpf::pacing_rate(limits.to_map_value()).is_none() || !bpf::kernel::has_netns_cookie() {
        return Ok(0);
    }
    Ok(bpf::netns_cookie_of(pod_ns)?)
}

/// CHECK found the dataplane unlike ADD left it: code 105 whatever the `BpfError`'s own code,
/// its causes (a netlink or syscall error) in the details.
pub fn dataplane_failed(e: BpfError) -> AttachmentError {
    AttachmentError::Dataplane(DataplaneMismatch(e))
}

/// Netlink mode: each of `hooks` has its program's filter on `host`.
pub async fn netlink_filters(
    host_nl: &Netlink,
    host: &Link,
    hooks: [Hook; 2],
) -> Result<(), CniError> {
    for hook in hooks {
        let ingress = hook.tc_attach_type() == aya::programs::TcAttachType::Ingress;
        let filters = host_nl.bpf_filters(host.index, ingress).await?;
        if !filters.iter().any(|f| f == hook.program()) {
            return Err(AttachmentError::NoFilter {
                ingress,
                program: hook.program(),
                host: host.name.clone(),
            }
            .into());
        }
    }
    Ok(())
}
