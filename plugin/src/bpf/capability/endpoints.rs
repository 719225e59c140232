//! Endpoints: each address of the pod in the endpoint map, with its host veth and both
//! MACs (the programs deliver to it and answer ARP for its gateway), and the per-pod
//! counters of its host veth (which also tell the programs whether the pod has an ingress
//! limit or host ports to look up).

use super::{
    spec::{PodSpec, Veth},
    unit::{Capability, Check, Install, Removal},
};
use crate::bpf::{
    maps::{CounterHints, PodEndpoint},
    BpfError,
};

pub(super) struct Endpoint;

/// The endpoint entries of the pod behind `veth`.
fn endpoints(pod: &PodSpec, veth: &Veth) -> Vec<PodEndpoint> {
    pod.addrs
        .iter()
        .map(|a| PodEndpoint {
            ip: a.ip,
            host_ifindex: veth.host_ifindex,
            host_mac: veth.host_mac,
            pod_mac: veth.pod_mac,
            chained: pod.chained,
            gateway4: a.gateway4,
            masq: pod.masq.is_some(),
        })
        .collect()
}

/// What the pod's counters tell the programs: whether it has a limit towards it and host
/// ports leading to it, which the programs then look up.
fn hints(pod: &PodSpec) -> CounterHints {
    CounterHints {
        ingress_limit: pod.limits.rate.is_some_and(|r| r.ingress.limits()),
        egress_limit: pod.limits.rate.is_some_and(|r| r.egress.limits()),
        host_ports: !pod.ports.is_empty(),
    }
}

impl Capability for Endpoint {
    fn name(&self) -> &'static str {
        "endpoints"
    }

    fn install(&self, pod: &PodSpec, veth: &Veth, cx: &mut Install<'_>) -> Result<(), BpfError> {
        cx.maps
            .insert_pod(cx.key.id(), &endpoints(pod, veth), hints(pod))
    }

    fn check(&self, pod: &PodSpec, veth: &Veth, cx: &Check<'_>) -> Result<(), BpfError> {
        cx.maps.check_pod(cx.key.id(), &endpoints(pod, veth))?;
        cx.maps.check_counters(veth.host_ifindex, hints(pod))
    }

    fn remove(&self, cx: &mut Removal<'_>) -> Result<bool, BpfError> {
        match cx.maps.as_deref_mut() {
            Some(maps) => Ok(maps.remove_endpoints(cx.key.id(), &cx.ips)? > 0),
            None => Ok(false),
        }
    }
}
