//! Masquerade, node-wide: whether a pod masquerades, the port range, the flows held per pod
//! address, the packets translated and the failures (the flow tables' use and size are the
//! node maps').

use super::part::{Exposition, Part, Text};
use crate::bpf::{MasqReport, MasqSourceReport};

pub struct Masquerade<'a> {
    /// `None` on a node without masquerade's maps (none pinned yet, or pinned by a release
    /// before it).
    pub masquerade: &'a Option<MasqReport>,
}

impl Part for Masquerade<'_> {
    fn inspect(&self, t: &mut Text) {
        let Self { masquerade } = self;
        let Some(MasqReport {
            enabled,
            sources,
            ports,
            ports_reserved_by_us,
            kube_proxy_ports,
            flows,
            flows_by_pod,
            out_packets,
            in_packets,
            flows_created,
            reclaimed,
            exhausted,
            table_full,
            untranslatable,
        }) = masquerade
        else {
            t.line("masquerade: not set up on this node");
            return;
        };
        t.line(format!(
            "masquerade: {}, ports {ports}{}, {flows} flows",
            if *enabled {
                "on"
            } else {
                "off (no masquerading pod)"
            },
            if *ports_reserved_by_us {
                " (reserved by ebpf-cni)"
            } else {
                ""
            },
        ));
        t.line(format!(
            "  translated {out_packets} packets out, {in_packets} in; {flows_created} flows created, {reclaimed} ports reclaimed"
        ));
        t.line(format!(
            "  dropped {exhausted} (ports exhausted), {table_full} (table full), {untranslatable} (untranslatable)"
        ));
        match kube_proxy_ports {
            Some(p) => t.line(format!(
                "  kube-proxy's masquerade kept to ports {p} (table inet ebpf-cni)"
            )),
            None if *enabled => t.line(
                "  kube-proxy's masquerade: every port (no kube-proxy masquerade mark learned)",
            ),
            None => {}
        }
        for MasqSourceReport { ifindex, address } in sources {
            t.line(format!("  leaves ifindex {ifindex} with {address}"));
        }
        for (pod, n) in flows_by_pod {
            t.line(format!("  {:<32} {n} flows", pod.to_string()));
        }
    }

    fn metrics(&self, e: &mut Exposition) {
        let Self { masquerade } = self;
        // Every family, zero on a node without masquerade. Whether it is on, the range and
        // the reservation are configuration, and `flows` is the per-pod gauge's sum:
        // inspect's only.
        let default = MasqReport {
            enabled: false,
            sources: Vec::new(),
            ports: String::new(),
            ports_reserved_by_us: false,
            kube_proxy_ports: None,
            flows: 0,
            flows_by_pod: Default::default(),
            out_packets: 0,
            in_packets: 0,
            flows_created: 0,
            reclaimed: 0,
            exhausted: 0,
            table_full: 0,
            untranslatable: 0,
        };
        // The sources follow the node's addresses (inspect's, like the range).
        let MasqReport {
            enabled: _,
            sources: _,
            ports: _,
            ports_reserved_by_us: _,
            kube_proxy_ports: _,
            flows: _,
            flows_by_pod,
            out_packets,
            in_packets,
            flows_created,
            reclaimed,
            exhausted,
            table_full,
            untranslatable,
        } = masquerade.as_ref().unwrap_or(&default);
        let name = "ebpf_cni_masquerade_flows";
        e.family(
            name,
            "gauge",
            "Masqueraded flows held, by pod address (flows the remote end opened to the pod's own address included).",
        );
        for (pod, n) in flows_by_pod {
            e.sample(name, &[("pod_address", pod.to_string().as_str())], n);
        }
        let name = "ebpf_cni_masquerade_packets_total";
        e.family(
            name,
            "counter",
            "Packets translated by masquerade, by direction (egress: leaving with the node's address).",
        );
        for (dir, v) in [("egress", out_packets), ("ingress", in_packets)] {
            e.sample(name, &[("direction", dir)], v);
        }
        let name = "ebpf_cni_masquerade_flows_created_total";
        e.family(name, "counter", "Masqueraded flows given a port.");
        e.sample(name, &[], flows_created);
        let name = "ebpf_cni_masquerade_ports_reclaimed_total";
        e.family(
            name,
            "counter",
            "Ports of flows idle past their timeout given to new flows.",
        );
        e.sample(name, &[], reclaimed);
        let name = "ebpf_cni_masquerade_failures_total";
        e.family(
            name,
            "counter",
            "Packets dropped by masquerade, by reason: exhausted (every probed port towards the destination taken), table_full, untranslatable (fragments, IP options, other protocols, no source address).",
        );
        for (reason, v) in [
            ("exhausted", exhausted),
            ("table_full", table_full),
            ("untranslatable", untranslatable),
        ] {
            e.sample(name, &[("reason", reason)], v);
        }
    }
}
