//! One attachment, `(network, container id, ifname)`, as the commands see it: its key, the
//! mode its config puts it in (ebpf-cni makes the pod's interface, or is chained after the
//! plugin that did), and what CHECK reports about it (plain and chained CHECK alike).

use std::net::{IpAddr, Ipv4Addr};

use ipnetwork::IpNetwork;

use crate::{
    bandwidth::Limits,
    bpf::{self, AttachmentKey, BpfError, Hook, MasqSpec, PodEndpoint, PodSpec, SourceCheck},
    cni::{code, config::NetConf, env::CniEnv, CniError},
    netlink::{Link, Netlink},
    netns::Netns,
    portmap::{PortEntry, PortMapping},
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

/// One address of the pod's interface: the address, its gateway (from IPAM or the previous
/// plugin) and the IPv4 gateway the programs answer ARP for, if any.
#[derive(Clone, Copy, Debug)]
pub struct PodAddr {
    pub ip: IpAddr,
    pub gateway: Option<IpAddr>,
    pub gateway4: Option<Ipv4Addr>,
}

/// What the request asks of one pod's dataplane, validated before anything changes: its
/// limits, host ports and source check (each capability parses its own part).
#[derive(Debug)]
pub struct PodConf {
    pub limits: Limits,
    pub port_mappings: Vec<PortMapping>,
    pub sources: SourceConf,
}

impl PodConf {
    pub fn parse(conf: &NetConf, env: &CniEnv) -> Result<Self, CniError> {
        Ok(Self {
            limits: crate::bandwidth::limits(conf)?,
            port_mappings: crate::portmap::mappings(conf)?,
            sources: SourceConf::parse(conf, env)?,
        })
    }
}

/// What one pod's dataplane holds: its endpoints, source check, limits, host ports and the
/// cookie its paced sockets are known by. ADD installs it and CHECK compares the kernel
/// with it, in both modes, built by this one function from the request's parsed
/// [`PodConf`] and the pod's veth pair.
#[derive(Debug)]
pub struct Wanted {
    pub endpoints: Vec<PodEndpoint>,
    pub sources: SourceCheck,
    pub limits: Option<ebpf_cni_maps::RateLimit>,
    /// The `unshapedSubnets`/`shapedSubnets` entries (`bandwidth::Limits::subnet_keys`).
    pub shape_subnets: Vec<crate::bandwidth::SubnetKey>,
    pub ports: Vec<PortEntry>,
    pub netns_cookie: u64,
    pub chained: bool,
    /// `ipMasq`: see [`Wanted::with_masq`].
    pub masq: Option<MasqSpec>,
}

impl Wanted {
    /// `host` and `pod`: the two ends of the pod's veth pair.
    pub fn build(
        pod_conf: &PodConf,
        host: &Link,
        pod: &Link,
        addrs: &[PodAddr],
        pod_ns: &Netns,
        chained: bool,
    ) -> Result<Wanted, CniError> {
        let (Some(host_mac), Some(pod_mac)) = (host.mac, pod.mac) else {
            return Err(AttachmentError::NoMac {
                host: host.name.clone(),
                pod: pod.name.clone(),
            }
            .into());
        };
        let endpoints = addrs
            .iter()
            .map(|a| PodEndpoint {
                ip: a.ip,
                host_ifindex: host.index,
                host_mac,
                pod_mac,
                chained,
                gateway4: a.gateway4,
                masq: false,
            })
            .collect();
        let gateways: Vec<(IpAddr, Option<IpAddr>)> =
            addrs.iter().map(|a| (a.ip, a.gateway)).collect();
        let ips: Vec<IpAddr> = addrs.iter().map(|a| a.ip).collect();
        Ok(Wanted {
            endpoints,
            sources: pod_conf.sources.for_pod(&ips, pod_mac),
            limits: pod_conf.limits.to_map_value(),
            shape_subnets: pod_conf.limits.subnet_keys(),
            ports: crate::portmap::entries(&pod_conf.port_mappings, &gateways)?,
            netns_cookie: pacing_cookie(&pod_conf.limits, pod_ns)?,
            chained,
            masq: None,
        })
    }

    /// The pod masquerades (`ipMasq`): its endpoints carry the flag, and the node gets
    /// what `masq` lists.
    pub fn with_masq(mut self, masq: MasqSpec) -> Self {
        for ep in &mut self.endpoints {
            ep.masq = true;
        }
        self.masq = Some(masq);
        self
    }

    /// The description as the dataplane takes it, for the pod behind `host`.
    pub fn spec<'a>(&'a self, host: &'a Link) -> PodSpec<'a> {
        PodSpec {
            host_ifname: &host.name,
            host_ifindex: host.index,
            endpoints: &self.endpoints,
            limits: self.limits,
            shape_subnets: &self.shape_subnets,
            ports: &self.ports,
            chained: self.chained,
            netns_cookie: self.netns_cookie,
            masq: self.masq.as_ref(),
            sources: &self.sources,
        }
    }
}

/// What `ipMasq` asks of the node for a pod with addresses `addrs`: the subnets of those
/// addresses (the pod network's ranges) and `ipMasqExclude` keep the pod's address (what
/// masqueraded flows leave with is the node's devices' addresses: `node::node_view`).
/// `None` without `ipMasq`.
pub fn masq_spec(conf: &NetConf, addrs: &[ipnetwork::IpNetwork]) -> Option<MasqSpec> {
    let m = conf.masq.as_ref()?;
    let mut skip: Vec<ipnetwork::IpNetwork> = addrs
        .iter()
        .map(|a| ipnetwork::IpNetwork::new(a.network(), a.prefix()).expect("prefix is valid"))
        .chain(m.exclude.iter().copied())
        .collect();
    skip.sort();
    skip.dedup();
    Some(MasqSpec {
        skip,
        ports: m.ports,
    })
}

/// Whether `conf` puts ebpf-cni in chained mode: a config without `ipam` (ebpf-cni cannot
/// address a pod without one), so DEL, CHECK and GC know it without `prevResult`. See
/// `chained`.
pub fn is_chained(conf: &NetConf) -> bool {
    conf.ipam.is_none()
}

/// The pod's netns cookie when its egress limit makes its TCP sockets paced (the pacing
/// map's key), else 0: reading it costs a thread, which pods without limits are spared.
pub fn pacing_cookie(limits: &Limits, pod_ns: &Netns) -> Result<u64, CniError> {
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
