//! The node's counters in the Prometheus text exposition format (version 0.0.4, which
//! OpenMetrics scrapers read too). The text is built from the same [`NodeReport`] that
//! `inspect` prints, so the pinned maps have one reader; per-CPU values arrive summed. A pod
//! is one series per direction, its addresses joined by `,` in one `address` label: one
//! series per address would count the pod's traffic once per address in every `sum()`.
//! Writing the text atomically and serving it over HTTP live in [`output`] and [`http`].

pub mod http;
pub mod output;

use std::fmt::Write as _;

use crate::bpf::{AttachmentReport, Counts, NodeReport};

/// `Content-Type` of the exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Escapes a label value: backslash, double quote and newline are the only characters the
/// format reserves there.
pub fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Builds the exposition text metric by metric: each family's `# HELP`/`# TYPE` once, then
/// its samples (the format wants a family's samples together).
#[derive(Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    /// Starts a family. `help` is ours, never user data, so it needs no escaping.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
        self
    }

    /// `value` is printed as is: integers stay exact (a counter past 2^53 would not).
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{k}=\"{}\"", escape_label(v));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }

    pub fn finish(self) -> String {
        self.text
    }
}

/// The labels that join a pod's series with the runtime's view of it.
fn pod_labels(a: &AttachmentReport) -> [(&'static str, String); 4] {
    let addresses: Vec<String> = a.addresses.iter().map(ToString::to_string).collect();
    [
        ("network", a.network.clone()),
        ("container_id", a.container_id.clone()),
        ("ifname", a.ifname.clone()),
        ("address", addresses.join(",")),
    ]
}

fn with<'a>(
    base: &'a [(&'static str, String)],
    more: &[(&'static str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    base.iter()
        .map(|(k, v)| (*k, v.as_str()))
        .chain(more.iter().copied())
        .collect()
}

/// Counters of traffic towards the pod (`ingress`) and from it (`egress`), as the
/// bandwidth keys name the directions.
fn directions(a: &AttachmentReport) -> [(&'static str, Option<&Counts>); 2] {
    [
        ("ingress", a.to_pod.as_ref()),
        ("egress", a.from_pod.as_ref()),
    ]
}

/// The exposition of one node. `read_seconds` is how long reading the maps took (exposed,
/// so a slow read shows on the dashboards it would slow down).
pub fn render(r: &NodeReport, read_seconds: f64) -> String {
    let mut e = Exposition::default();
    let pods: Vec<_> = r.attachments.iter().map(|a| (a, pod_labels(a))).collect();

    type PodGet = fn(&Counts) -> u64;
    let per_pod_counters: [(&str, &str, PodGet); 5] = [
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
        (
            "ebpf_cni_pod_ecn_marks_total",
            "Packets of the pod marked ECN CE by the rate limiter instead of dropped, by direction.",
            |c| c.marks,
        ),
    ];
    for (name, help, get) in per_pod_counters {
        e.family(name, "counter", help);
        for (a, base) in &pods {
            for (dir, c) in directions(a) {
                if let Some(c) = c {
                    e.sample(name, &with(base, &[("direction", dir)]), get(c));
                }
            }
        }
    }

    // The source check: from the pod only, each reason its own series (`drops` stays the
    // limiter's, as dashboards read it).
    let name = "ebpf_cni_pod_source_drops_total";
    e.family(
        name,
        "counter",
        "Frames from the pod dropped by the source check, by reason: address (a source address the pod may not send from, or none readable), mac (a source MAC other than the pod interface's).",
    );
    for (a, base) in &pods {
        if let Some(c) = &a.from_pod {
            for (reason, v) in [("address", c.source_drops), ("mac", c.mac_drops)] {
                e.sample(name, &with(base, &[("reason", reason)]), v);
            }
        }
    }
    let name = "ebpf_cni_pod_source_check";
    e.family(
        name,
        "gauge",
        "1 for the pod's source check mode: on, off, unchecked (attached by a release before the check) or missing (its entries are gone).",
    );
    for (a, base) in &pods {
        e.sample(name, &with(base, &[("mode", a.source_check.mode)]), 1);
    }

    let name = "ebpf_cni_pod_limiter";
    e.family(
        name,
        "gauge",
        "1 for the pod's limiter mode by direction: none, police (token bucket), or police_and_pace (egress TCP also paced at the socket).",
    );
    for (a, base) in &pods {
        for (dir, limit) in [("ingress", &a.ingress_limit), ("egress", &a.egress_limit)] {
            let mode = match (limit, dir, a.tcp_pacing_bytes) {
                (None, _, _) => "none",
                (Some(_), "egress", Some(_)) => "police_and_pace",
                (Some(_), _, _) => "police",
            };
            e.sample(name, &with(base, &[("direction", dir), ("mode", mode)]), 1);
        }
    }
    for (name, help, burst) in [
        (
            "ebpf_cni_pod_limit_rate_bytes_per_second",
            "Configured rate limit of the pod by direction (limited pods only).",
            false,
        ),
        (
            "ebpf_cni_pod_limit_burst_bytes",
            "Configured burst of the pod's rate limit by direction (limited pods only).",
            true,
        ),
    ] {
        e.family(name, "gauge", help);
        for (a, base) in &pods {
            for (dir, limit) in [("ingress", &a.ingress_limit), ("egress", &a.egress_limit)] {
                if let Some(l) = limit {
                    let v = if burst { l.burst_bytes } else { l.rate_bytes };
                    e.sample(name, &with(base, &[("direction", dir)]), v);
                }
            }
        }
    }
    let name = "ebpf_cni_pod_tcp_pacing_rate_bytes_per_second";
    e.family(
        name,
        "gauge",
        "SO_MAX_PACING_RATE given to the TCP sockets of a pod with an egress limit.",
    );
    for (a, base) in &pods {
        if let Some(rate) = a.tcp_pacing_bytes {
            e.sample(name, &with(base, &[]), rate);
        }
    }

    type PortGet = fn(&crate::bpf::PortMappingReport) -> u64;
    let port_counters: [(&str, &str, PortGet); 3] = [
        (
            "ebpf_cni_host_port_packets_total",
            "Packets translated to the pod by the TC programs for this host port.",
            |m| m.packets,
        ),
        (
            "ebpf_cni_host_port_bytes_total",
            "Bytes translated to the pod by the TC programs for this host port.",
            |m| m.bytes,
        ),
        (
            "ebpf_cni_host_port_socket_translations_total",
            "Connections and datagrams of the node's own processes translated at the socket for this host port.",
            |m| m.socket,
        ),
    ];
    let ports: Vec<_> = r
        .port_mappings
        .iter()
        .map(|m| {
            let (network, container_id, ifname) = m
                .attachment
                .as_deref()
                .and_then(|a| {
                    let mut it = a.splitn(3, '/');
                    Some((it.next()?, it.next()?, it.next()?))
                })
                .unwrap_or(("", "", ""));
            let labels: Vec<(&'static str, String)> = vec![
                ("network", network.to_owned()),
                ("container_id", container_id.to_owned()),
                ("ifname", ifname.to_owned()),
                ("protocol", m.protocol.to_owned()),
                ("host_ip", m.host_ip.to_string()),
                ("host_port", m.host_port.to_string()),
                ("pod_address", m.pod_address.to_string()),
                ("pod_port", m.pod_port.to_string()),
            ];
            (m, labels)
        })
        .collect();
    for (name, help, get) in port_counters {
        e.family(name, "counter", help);
        for (m, labels) in &ports {
            e.sample(name, &with(labels, &[]), get(m));
        }
    }

    // Masquerade: node-wide (the flow tables' use and size are in ebpf_cni_map_entries).
    let m = r.masquerade.as_ref();
    let name = "ebpf_cni_masquerade_flows";
    e.family(
        name,
        "gauge",
        "Masqueraded flows held, by pod address (flows the remote end opened to the pod's own address included).",
    );
    for (pod, n) in m.map(|m| &m.flows_by_pod).into_iter().flatten() {
        e.sample(name, &[("pod_address", pod.to_string().as_str())], n);
    }
    let name = "ebpf_cni_masquerade_packets_total";
    e.family(
        name,
        "counter",
        "Packets translated by masquerade, by direction (egress: leaving with the node's address).",
    );
    for (dir, v) in [
        ("egress", m.map_or(0, |m| m.out_packets)),
        ("ingress", m.map_or(0, |m| m.in_packets)),
    ] {
        e.sample(name, &[("direction", dir)], v);
    }
    let name = "ebpf_cni_masquerade_flows_created_total";
    e.family(name, "counter", "Masqueraded flows given a port.");
    e.sample(name, &[], m.map_or(0, |m| m.flows_created));
    let name = "ebpf_cni_masquerade_ports_reclaimed_total";
    e.family(
        name,
        "counter",
        "Ports of flows idle past their timeout given to new flows.",
    );
    e.sample(name, &[], m.map_or(0, |m| m.reclaimed));
    let name = "ebpf_cni_masquerade_failures_total";
    e.family(
        name,
        "counter",
        "Packets dropped by masquerade, by reason: exhausted (every probed port towards the destination taken), table_full, untranslatable (fragments, IP options, other protocols, no source address).",
    );
    for (reason, v) in [
        ("exhausted", m.map_or(0, |m| m.exhausted)),
        ("table_full", m.map_or(0, |m| m.table_full)),
        ("untranslatable", m.map_or(0, |m| m.untranslatable)),
    ] {
        e.sample(name, &[("reason", reason)], v);
    }

    for (name, help, v) in [
        (
            "ebpf_cni_attachments",
            "Pod attachments pinned on the node.",
            r.attachments.len(),
        ),
        (
            "ebpf_cni_endpoints",
            "Pod addresses in the node's endpoint map.",
            r.endpoints,
        ),
        (
            "ebpf_cni_port_mappings",
            "Host port mappings installed on the node.",
            r.port_mappings.len(),
        ),
    ] {
        e.family(name, "gauge", help);
        e.sample(name, &[], v);
    }
    let name = "ebpf_cni_map_entries";
    e.family(
        name,
        "gauge",
        "Entries in each node map (arrays count as full; LRU maps evict their oldest entries when full).",
    );
    for m in &r.maps {
        e.sample(name, &[("map", m.name)], m.entries);
    }
    let name = "ebpf_cni_map_max_entries";
    e.family(name, "gauge", "Capacity of each node map.");
    for m in &r.maps {
        e.sample(name, &[("map", m.name)], m.max_entries);
    }
    let name = "ebpf_cni_programs_info";
    e.family(
        name,
        "gauge",
        "1 for each revision of the eBPF programs pinned on the node (new pods get the newest).",
    );
    for rev in &r.revisions {
        e.sample(name, &[("revision", rev)], 1);
    }
    let name = "ebpf_cni_kernel_info";
    e.family(name, "gauge", "1, labelled with the kernel release.");
    e.sample(name, &[("release", &r.kernel)], 1);
    let name = "ebpf_cni_kernel_part_degraded";
    e.family(
        name,
        "gauge",
        "1 when a part of the dataplane runs with less on this kernel (see inspect), else 0.",
    );
    for m in &r.modes {
        e.sample(name, &[("part", m.part)], u8::from(m.degraded));
    }
    let name = "ebpf_cni_metrics_read_seconds";
    e.family(
        name,
        "gauge",
        "Time taken to read the node's pinned maps for this exposition.",
    );
    e.sample(name, &[], read_seconds);
    e.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_escape_backslash_quote_and_newline() {
        assert_eq!(escape_label(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(escape_label("line\nnext"), "line\\nnext");
        assert_eq!(escape_label("plain-ünïcode/1"), "plain-ünïcode/1");
        assert_eq!(escape_label(r"\n"), r"\\n");
    }

    #[test]
    fn samples_are_formatted_with_escaped_labels() {
        let mut e = Exposition::default();
        e.family("ebpf_cni_x_total", "counter", "Help text.");
        e.sample("ebpf_cni_x_total", &[("a", "q\"\\\n"), ("b", "2")], 5u32);
        e.sample("ebpf_cni_x_total", &[], 0.25);
        assert_eq!(
            e.finish(),
            "# HELP ebpf_cni_x_total Help text.\n\
             # TYPE ebpf_cni_x_total counter\n\
             ebpf_cni_x_total{a=\"q\\\"\\\\\\n\",b=\"2\"} 5\n\
             ebpf_cni_x_total 0.25\n"
        );
    }

    #[test]
    fn an_empty_node_still_has_every_node_family() {
        let r = NodeReport {
            node: "netns-1".into(),
            kernel: "6.18.0".into(),
            modes: crate::bpf::kernel::part_modes(true),
            pin_dir: "/sys/fs/bpf/ebpf-cni/v1/netns-1".into(),
            revisions: vec![],
            endpoints: 0,
            maps: vec![],
            devices: vec![],
            attachments: vec![],
            node_addresses: vec![],
            port_mappings: vec![],
            gateways: vec![],
            masquerade: None,
            converged: None,
        };
        let text = render(&r, 0.001);
        for family in [
            "ebpf_cni_attachments 0",
            "ebpf_cni_endpoints 0",
            "ebpf_cni_port_mappings 0",
            "# TYPE ebpf_cni_pod_bytes_total counter",
            "ebpf_cni_kernel_part_degraded{part=\"egress TCP pacing\"} 0",
            "ebpf_cni_masquerade_failures_total{reason=\"table_full\"} 0",
            "# TYPE ebpf_cni_masquerade_flows gauge",
        ] {
            assert!(text.contains(family), "{family} missing from:\n{text}");
        }
        // Every counter family's name ends in _total, as the format's counters must.
        for line in text.lines().filter(|l| l.starts_with("# TYPE")) {
            let parts: Vec<_> = line.split(' ').collect();
            assert_eq!(
                parts[3] == "counter",
                parts[2].ends_with("_total"),
                "{line}"
            );
        }
    }
}
