//! A pod's bandwidth limits: the rate, burst and mode of each direction, the subnets the
//! limits exempt or select, TCP pacing, and the ECN marks the limiter set.

use super::part::{with, Exposition, Text};
use crate::bpf::{LimitReport, ShapeSubnetsReport};

pub struct PodLimits<'a> {
    /// Towards the pod.
    pub ingress: Option<&'a LimitReport>,
    /// From the pod.
    pub egress: Option<&'a LimitReport>,
    pub tcp_pacing_bytes: Option<u32>,
    pub shape_subnets: Option<&'a ShapeSubnetsReport>,
    /// ECN marks by direction (`ingress`: towards the pod), where the pod has counters.
    pub marks: [(&'static str, Option<u64>); 2],
}

const ECN_MARKS: &str = "ebpf_cni_pod_ecn_marks_total";
const LIMITER: &str = "ebpf_cni_pod_limiter";
const RATE: &str = "ebpf_cni_pod_limit_rate_bytes_per_second";
const BURST: &str = "ebpf_cni_pod_limit_burst_bytes";
const TCP_PACING: &str = "ebpf_cni_pod_tcp_pacing_rate_bytes_per_second";

/// The pods' limit families (declared with none).
pub fn declare(e: &mut Exposition) {
    e.family(
        ECN_MARKS,
        "counter",
        "Packets of the pod marked ECN CE by the rate limiter instead of dropped, by direction.",
    )
    .family(
        LIMITER,
        "gauge",
        "1 for the pod's limiter mode by direction: none, police (token bucket), or police_and_pace (egress TCP also paced at the socket).",
    )
    .family(
        RATE,
        "gauge",
        "Configured rate limit of the pod by direction (limited pods only).",
    )
    .family(
        BURST,
        "gauge",
        "Configured burst of the pod's rate limit by direction (limited pods only).",
    )
    .family(
        TCP_PACING,
        "gauge",
        "SO_MAX_PACING_RATE given to the TCP sockets of a pod with an egress limit.",
    );
}

/// "1000000 bit/s, burst 10000 B, edt+fq (horizon 2000 ms)", or "unlimited".
fn describe(l: Option<&LimitReport>) -> String {
    let Some(LimitReport {
        rate_bytes,
        burst_bytes,
        mode,
        horizon_ns,
    }) = l
    else {
        return "unlimited".to_owned();
    };
    let horizon = horizon_ns.map_or(String::new(), |ns| {
        format!(" (horizon {} ms)", ns / 1_000_000)
    });
    format!(
        "{} bit/s, burst {burst_bytes} B, {mode}{horizon}",
        rate_bytes * 8
    )
}

impl PodLimits<'_> {
    pub fn inspect(&self, t: &mut Text) {
        let Self {
            ingress,
            egress,
            tcp_pacing_bytes,
            shape_subnets,
            marks: [(_, to_pod), (_, from_pod)],
        } = self;
        if ingress.is_some() || egress.is_some() {
            t.line(format!(
                "      limits    to pod {} ({} ECN-marked), from pod {} ({} ECN-marked)",
                describe(*ingress),
                to_pod.unwrap_or(0),
                describe(*egress),
                from_pod.unwrap_or(0)
            ));
        }
        if let Some(ShapeSubnetsReport { rule, subnets }) = shape_subnets {
            t.line(format!("      {:<9} {}", rule, subnets.join(", ")));
        }
        if let Some(rate) = tcp_pacing_bytes {
            t.line(format!("      TCP paced at {} bit/s", u64::from(*rate) * 8));
        }
    }

    /// Series of one pod, labelled `labels`. The subnets are configuration (a label of
    /// prefixes would be a new series per change) and the horizon follows from the rate:
    /// both are inspect's only.
    pub fn metrics(&self, labels: &[(&'static str, &str)], e: &mut Exposition) {
        let Self {
            ingress,
            egress,
            tcp_pacing_bytes,
            shape_subnets: _,
            marks,
        } = self;
        for (dir, m) in marks {
            if let Some(m) = m {
                e.sample(ECN_MARKS, &with(labels, &[("direction", dir)]), m);
            }
        }
        for (dir, limit) in [("ingress", ingress), ("egress", egress)] {
            let mode = match (limit, dir, tcp_pacing_bytes) {
                (None, _, _) => "none",
                (Some(_), "egress", Some(_)) => "police_and_pace",
                (Some(_), _, _) => "police",
            };
            e.sample(
                LIMITER,
                &with(labels, &[("direction", dir), ("mode", mode)]),
                1,
            );
        }
        for (dir, limit) in [("ingress", ingress), ("egress", egress)] {
            if let Some(l) = limit {
                e.sample(RATE, &with(labels, &[("direction", dir)]), l.rate_bytes);
                e.sample(BURST, &with(labels, &[("direction", dir)]), l.burst_bytes);
            }
        }
        if let Some(rate) = tcp_pacing_bytes {
            e.sample(TCP_PACING, &with(labels, &[]), rate);
        }
    }
}
