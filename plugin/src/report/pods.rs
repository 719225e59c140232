//! The pods (attachments): each one's identity, addresses, programs and links, its traffic
//! counters, and the lines and series of its limits ([`bandwidth`]) and source check
//! ([`source_check`]); the node's endpoint count.

use super::{
    bandwidth,
    part::{attachment, heading, with, Exposition, Part, Text},
    source_check,
};
use crate::bpf::{AttachmentReport, Counts, LinkReport};

pub struct Pods<'a> {
    pub endpoints: usize,
    pub attachments: &'a [AttachmentReport],
}

/// A pod's report taken apart: its row, and each capability's share of it.
struct Pod<'a> {
    network: &'a str,
    container_id: &'a str,
    ifname: &'a str,
    host_ifindex: Option<u32>,
    addresses: String,
    links: &'a [LinkReport],
    /// Towards the pod (`ingress`, as the bandwidth keys name it) and from it (`egress`).
    traffic: [(&'static str, Option<Traffic>); 2],
    limits: bandwidth::PodLimits<'a>,
    sources: source_check::PodSources<'a>,
}

/// The routing's counters of one direction.
#[derive(Clone, Copy)]
struct Traffic {
    packets: u64,
    bytes: u64,
    drops: u64,
    errors: u64,
}

/// One direction's counters, each to the capability that counts it: the traffic, the
/// limiter's ECN marks, the source check's drops.
fn split(c: &Counts) -> (Traffic, u64, (u64, u64)) {
    let Counts {
        packets,
        bytes,
        drops,
        errors,
        marks,
        source_drops,
        mac_drops,
    } = *c;
    (
        Traffic {
            packets,
            bytes,
            drops,
            errors,
        },
        marks,
        (source_drops, mac_drops),
    )
}

fn pod(a: &AttachmentReport) -> Pod<'_> {
    let AttachmentReport {
        network,
        container_id,
        ifname,
        host_ifindex,
        addresses,
        links,
        from_pod,
        to_pod,
        ingress_limit,
        egress_limit,
        tcp_pacing_bytes,
        shape_subnets,
        source_check,
    } = a;
    let (to, from) = (to_pod.as_ref().map(split), from_pod.as_ref().map(split));
    Pod {
        network,
        container_id,
        ifname,
        host_ifindex: *host_ifindex,
        addresses: addresses
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        links,
        traffic: [("ingress", to.map(|c| c.0)), ("egress", from.map(|c| c.0))],
        limits: bandwidth::PodLimits {
            ingress: ingress_limit.as_ref(),
            egress: egress_limit.as_ref(),
            tcp_pacing_bytes: *tcp_pacing_bytes,
            shape_subnets: shape_subnets.as_ref(),
            marks: [("ingress", to.map(|c| c.1)), ("egress", from.map(|c| c.1))],
        },
        // The check runs on what the pod sends: the other direction's drops stay 0.
        sources: source_check::PodSources {
            check: source_check,
            drops: from.map(|c| c.2),
        },
    }
}

impl Pod<'_> {
    /// The labels that join a pod's series with the runtime's view of it. A pod is one
    /// series per direction, its addresses joined by `,` in one `address` label: one series
    /// per address would count the pod's traffic once per address in every `sum()`.
    fn labels(&self) -> [(&'static str, &str); 4] {
        [
            ("network", self.network),
            ("container_id", self.container_id),
            ("ifname", self.ifname),
            ("address", &self.addresses),
        ]
    }
}

impl Part for Pods<'_> {
    fn inspect(&self, t: &mut Text) {
        let Self {
            endpoints,
            attachments,
        } = self;
        t.line(format!("endpoints: {endpoints}"));
        heading(t, "attachments:", attachments.is_empty());
        if attachments.is_empty() {
            return;
        }
        t.line(format!(
            "  {:<12} {:<20} {:<6} {:>7} {:<28} {:>10} {:>12} {:>10} {:>12} {:>6} {:>6}",
            "NETWORK",
            "CONTAINER",
            "IFNAME",
            "IFINDEX",
            "ADDRESSES",
            "FROM_PKTS",
            "FROM_BYTES",
            "TO_PKTS",
            "TO_BYTES",
            "DROPS",
            "ERRORS"
        ));
        for a in *attachments {
            let Pod {
                network,
                container_id,
                ifname,
                host_ifindex,
                addresses,
                links,
                traffic,
                limits,
                sources,
            } = pod(a);
            let cid: String = container_id.chars().take(20).collect();
            let (fp, fb, tp, tb, dr, er) = match traffic {
                [(_, Some(to)), (_, Some(from))] => (
                    from.packets,
                    from.bytes,
                    to.packets,
                    to.bytes,
                    from.drops + to.drops,
                    from.errors + to.errors,
                ),
                _ => (0, 0, 0, 0, 0, 0),
            };
            t.line(format!(
                "  {:<12} {:<20} {:<6} {:>7} {:<28} {:>10} {:>12} {:>10} {:>12} {:>6} {:>6}",
                network,
                cid,
                ifname,
                host_ifindex.map_or("-".into(), |i| i.to_string()),
                addresses,
                fp,
                fb,
                tp,
                tb,
                dr,
                er
            ));
            for l in links {
                t.line(format!(
                    "      {:<9} {} prog {} {} on ifindex {}",
                    l.hook,
                    l.program,
                    l.program_id,
                    attachment(l),
                    l.ifindex
                ));
            }
            limits.inspect(t);
            sources.inspect(t);
        }
    }

    fn metrics(&self, e: &mut Exposition) {
        let Self {
            endpoints,
            attachments,
        } = self;
        type Get = fn(&Traffic) -> u64;
        let counters: [(&str, &str, Get); 4] = [
            (
                "ebpf_cni_pod_packets_total",
                "Packets of the pod seen by its programs, by direction (ingress: towards the pod).",
                |c| c.packets,
            ),
            (
                "ebpf_cni_pod_bytes_total",
                "Bytes of the pod seen by its programs, by direction (ingress: towards the pod).",
                |c| c.bytes,
            ),
            (
                "ebpf_cni_pod_drops_total",
                "Packets of the pod dropped by the dataplane (rate limit), by direction.",
                |c| c.drops,
            ),
            (
                "ebpf_cni_pod_errors_total",
                "Packets of the pod whose redirect or FIB lookup failed in the kernel helper, by direction.",
                |c| c.errors,
            ),
        ];
        for (name, help, _) in counters {
            e.family(name, "counter", help);
        }
        bandwidth::declare(e);
        source_check::declare(e);
        for a in *attachments {
            // Identity and links are the labels' and inspect's; a link's state is CHECK's.
            let p = pod(a);
            let Pod {
                network: _,
                container_id: _,
                ifname: _,
                host_ifindex: _,
                addresses: _,
                links: _,
                traffic,
                limits,
                sources,
            } = &p;
            let labels = p.labels();
            for (name, _, get) in counters {
                for (dir, c) in traffic {
                    if let Some(c) = c {
                        e.sample(name, &with(&labels, &[("direction", dir)]), get(c));
                    }
                }
            }
            limits.metrics(&labels, e);
            sources.metrics(&labels, e);
        }
        for (name, help, v) in [
            (
                "ebpf_cni_attachments",
                "Pod attachments pinned on the node.",
                attachments.len(),
            ),
            (
                "ebpf_cni_endpoints",
                "Pod addresses in the node's endpoint map.",
                *endpoints,
            ),
        ] {
            e.family(name, "gauge", help);
            e.sample(name, &[], v);
        }
    }
}
