//! What one pod's dataplane holds ([`PodSpec`], one part per capability) and where it
//! goes ([`Veth`]).

use std::net::{IpAddr, Ipv4Addr};

use ebpf_cni_maps::RateLimit;
use ipnetwork::IpNetwork;

use crate::{
    bandwidth::SubnetKey,
    bpf::{
        maps::{is_one_of, SourceCheck},
        placement::{PlacedSources, Placement},
        MasqSpec,
    },
    host_ports::PortEntry,
};

/// What one pod's dataplane holds, one field per capability.
#[derive(Clone, Debug)]
pub struct PodSpec {
    /// Chained mode: another plugin made the interface and forwards the pod's traffic; the
    /// host veth gets `ecni_from_chain` instead of `ecni_from_pod`, and the endpoints carry
    /// `EP_FLAG_CHAINED`.
    pub chained: bool,
    /// Endpoints: the pod's addresses.
    pub addrs: Vec<PodIp>,
    /// The source check: `None` when it is off, else the prefixes the pod may send from
    /// (its own addresses and the extra prefixes), sorted, without duplicates.
    pub sources: Option<Vec<IpNetwork>>,
    /// Rate limits and pacing.
    pub limits: LimitSpec,
    /// `ipMasq`: what the node needs for the pod's masquerade (the endpoints then carry
    /// `EP_FLAG_MASQ`).
    pub masq: Option<MasqSpec>,
    /// Host port mappings.
    pub ports: Vec<PortEntry>,
}

/// One address of the pod, with the IPv4 gateway the programs answer ARP for, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodIp {
    pub ip: IpAddr,
    pub gateway4: Option<Ipv4Addr>,
}

/// A pod's rate limits.
#[derive(Clone, Debug, Default)]
pub struct LimitSpec {
    /// `None`: no rate limits.
    pub rate: Option<RateLimit>,
    /// The `unshapedSubnets`/`shapedSubnets` entries of a limited pod (the rule is a flag
    /// in `rate`).
    pub shape_subnets: Vec<SubnetKey>,
    /// The cookie of the pod's network namespace: with an egress limit, its TCP sockets
    /// are paced (`ecni_sockops`). 0: not paced.
    pub netns_cookie: u64,
}

/// The veth pair the pod's dataplane is attached to.
#[derive(Clone, Debug)]
pub struct Veth {
    pub host_name: String,
    pub host_ifindex: u32,
    pub host_mac: [u8; 6],
    /// The pod's interface.
    pub pod_mac: [u8; 6],
}

impl PodSpec {
    /// A pod with no address and nothing asked of any capability, for tests.
    #[cfg(test)]
    pub fn bare() -> Self {
        Self {
            chained: false,
            addrs: Vec::new(),
            sources: None,
            limits: LimitSpec::default(),
            masq: None,
            ports: Vec::new(),
        }
    }

    /// The source check as the map holds it, for the pod behind `veth`.
    pub fn source_check(&self, veth: &Veth) -> SourceCheck {
        match &self.sources {
            None => SourceCheck::Off,
            Some(allowed) => SourceCheck::On {
                mac: veth.pod_mac,
                allowed: allowed.clone(),
                masq_addrs: if self.masq.is_some() {
                    self.ips()
                } else {
                    Vec::new()
                },
            },
        }
    }

    pub fn ips(&self) -> Vec<IpAddr> {
        self.addrs.iter().map(|a| a.ip).collect()
    }

    /// The placement ADD is about to make of the pod on `veth` (see `placement.rs`).
    pub fn placement(&self, veth: &Veth) -> Placement {
        let ips = self.ips();
        let sources = match &self.sources {
            None => PlacedSources::Off,
            Some(allowed) => {
                if allowed.iter().all(|n| is_one_of(n, &ips)) {
                    PlacedSources::Own
                } else {
                    PlacedSources::Extra
                }
            }
        };
        Placement {
            host_ifindex: veth.host_ifindex,
            netns_cookie: self.limits.netns_cookie,
            sources,
            ips,
        }
    }
}
