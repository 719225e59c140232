//! Rate limits: the pod's buckets in the rate map (the policer and EDT pacer of its
//! programs), its shaped or unshaped subnets, the `fq` that paces traffic towards it
//! (`bpf/bandwidth.rs`) and the TCP pacing of its sockets (`ecni_sockops` on the cgroup root).

use ebpf_cni_maps::RateLimit;

use super::{
    spec::{PodSpec, Veth},
    unit::{Capability, Check, Install, Removal},
};
use crate::bpf::{bandwidth, cgroup, kernel, programs::Programs, BpfError};

pub(super) struct Limits;

/// The pacing rate for an egress limit, in payload bytes: TCP paces the payload it sends,
/// and the limit counts Ethernet frames (as the pacer towards pods and tbf do), which at MTU
/// 1500 carry 1448 payload bytes in 1514 (IPv4, TCP timestamps). Pacing at that share of
/// the rate puts the stream on the wire at the limit (IPv6's 1428-byte MSS: 1.4% above).
/// The policer behind it counts a GSO packet's headers once, so it leaves the paced stream
/// room and does not drop it. `None` without an egress limit.
pub fn pacing_rate(limits: Option<RateLimit>) -> Option<u32> {
    let rate = limits?.egress.rate_bytes;
    let paced = u128::from(rate) * 1448 / 1514;
    (rate > 0).then(|| u32::try_from(paced).unwrap_or(u32::MAX))
}

/// The sockops program looks up a pod with subnets by its host veth.
fn shape_ifindex(pod: &PodSpec, veth: &Veth) -> u32 {
    if pod.limits.shape_subnets.is_empty() {
        0
    } else {
        veth.host_ifindex
    }
}

impl Capability for Limits {
    fn name(&self) -> &'static str {
        "limits"
    }

    fn install(&self, pod: &PodSpec, veth: &Veth, cx: &mut Install<'_>) -> Result<(), BpfError> {
        let mut rate = pod.limits.rate;
        let key = cx.key;
        let pod_name = format!("{}/{}/{}", key.network, key.container_id, key.ifname);
        bandwidth::prepare(veth.host_ifindex, &mut rate, &pod_name)?;
        cx.maps.set_limits(veth.host_ifindex, rate)?;
        if rate.is_some() {
            cx.maps.settle_limits_switch()?;
        }
        cx.maps
            .set_shape_subnets(veth.host_ifindex, &pod.limits.shape_subnets)?;
        if let Some(paced) = pacing_rate(rate) {
            if pod.limits.netns_cookie != 0 && Programs::pacing_available(cx.root, cx.node) {
                cx.maps.set_pacing(
                    pod.limits.netns_cookie,
                    key.id(),
                    paced,
                    shape_ifindex(pod, veth),
                )?;
                cgroup::ensure_pacing_link(cx.root, cx.node)?;
            } else {
                log::warn!(
                    "kernel {} cannot pace TCP (needs 5.15): the egress limit of {pod_name} is policed only",
                    kernel::release(),
                );
            }
        }
        Ok(())
    }

    fn check(&self, pod: &PodSpec, veth: &Veth, cx: &Check<'_>) -> Result<(), BpfError> {
        let ifindex = veth.host_ifindex;
        cx.maps.check_limits(ifindex, pod.limits.rate)?;
        cx.maps
            .check_shape_subnets(ifindex, &pod.limits.shape_subnets)?;
        bandwidth::check(ifindex, cx.maps.limits(ifindex))?;
        // As ADD decided: no pacing where the kernel refused the program.
        let pacing = pacing_rate(pod.limits.rate).filter(|_| {
            pod.limits.netns_cookie != 0 && Programs::pacing_available(cx.root, cx.node)
        });
        cx.maps.check_pacing(
            pod.limits.netns_cookie,
            cx.key.id(),
            pacing.map(|r| (r, shape_ifindex(pod, veth))),
        )?;
        if pacing.is_some() {
            cgroup::check_pacing_link(cx.root, cx.node)?;
        }
        Ok(())
    }

    /// The fq first, on a device that may outlive the pod (chained mode: the previous
    /// plugin's veth); only ebpf-cni's own is removed.
    fn remove(&self, cx: &mut Removal<'_>) -> Result<bool, BpfError> {
        let mut removed = false;
        if let Some(ifindex) = cx.host_ifindex {
            removed |= bandwidth::remove(ifindex)?;
        }
        if let Some(maps) = cx.maps.as_deref_mut() {
            maps.remove_pacing(cx.key.id(), cx.placement.as_ref().map(|p| p.netns_cookie))?;
            if let Some(ifindex) = cx.host_ifindex {
                let had = maps.limits(ifindex).is_some();
                maps.set_limits(ifindex, None)?;
                maps.set_shape_subnets(ifindex, &[])?;
                if had {
                    maps.settle_limits_switch()?;
                }
            }
        }
        Ok(removed)
    }
}
