//! The node report rendered: `ebpf-cni inspect`'s table and `ebpf-cni metrics`' exposition
//! both walk the same parts of one [`NodeReport`] (read by `bpf::inspect`), one part per
//! capability, each giving its inspect lines and its metric families side by side. The
//! report is taken apart in one place, [`parts`], exhaustively (no `..`), and each part
//! takes its own fields apart the same way in both of its renderers: a field added to the
//! report does not build until a part renders it in both outputs, or says there why one of
//! them leaves it out. `inspect --json` is the report itself, serialized.

mod bandwidth;
mod devices;
pub mod exposition;
mod gateways;
mod host_ports;
mod masquerade;
mod node;
mod part;
mod pods;
mod services;
mod source_check;
mod tunnel;

use crate::bpf::NodeReport;
pub use exposition::Exposition;
use part::{Part, Text};

/// The report as its parts, in the order both outputs show them.
fn parts(r: &NodeReport) -> [Box<dyn Part + '_>; 9] {
    let NodeReport {
        node,
        kernel,
        modes,
        pin_dir,
        revisions,
        endpoints,
        maps,
        devices,
        unpinned,
        attachments,
        node_addresses,
        port_mappings,
        gateways,
        gateways6,
        masquerade,
        services,
        tunnel,
        unrouted_peers,
        converged,
    } = r;
    [
        Box::new(node::Node {
            node,
            pin_dir,
            revisions,
            kernel,
            modes,
            converged,
        }),
        Box::new(devices::Devices { devices, unpinned }),
        Box::new(pods::Pods {
            endpoints: *endpoints,
            attachments,
        }),
        Box::new(host_ports::HostPorts {
            port_mappings,
            node_addresses,
        }),
        Box::new(masquerade::Masquerade { masquerade }),
        Box::new(services::Services { services }),
        Box::new(tunnel::Tunnel {
            tunnel,
            unrouted_peers,
        }),
        Box::new(gateways::Gateways {
            gateways,
            gateways6,
        }),
        Box::new(node::Maps { maps }),
    ]
}

/// `ebpf-cni inspect`'s table.
pub fn inspect(r: &NodeReport) -> String {
    let mut t = Text::default();
    for part in parts(r) {
        part.inspect(&mut t);
    }
    t.0
}

/// The Prometheus exposition of the node. `read_seconds` is how long reading the maps
/// took (exposed, so a slow read shows on the dashboards it would slow down): a fact of
/// this read, not of the node, so it is the last family and no part's.
pub fn exposition(r: &NodeReport, read_seconds: f64) -> String {
    let mut e = Exposition::default();
    for part in parts(r) {
        part.metrics(&mut e);
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
    use std::{collections::BTreeMap, net::IpAddr};

    use super::*;
    use crate::bpf::{
        AttachmentReport, Counts, GatewayReport, LimitReport, MapUsageReport, MasqReport,
        PortMappingReport, SourceCheckReport,
    };

    fn empty() -> NodeReport {
        NodeReport {
            node: "netns-1".into(),
            kernel: "6.18.0".into(),
            modes: crate::bpf::kernel::part_modes(true),
            pin_dir: "/sys/fs/bpf/ebpf-cni/v1/netns-1".into(),
            revisions: vec![],
            endpoints: 0,
            maps: vec![],
            devices: vec![],
            unpinned: vec![],
            attachments: vec![],
            node_addresses: vec![],
            port_mappings: vec![],
            gateways: vec![],
            gateways6: vec![],
            masquerade: None,
            services: None,
            tunnel: None,
            unrouted_peers: Vec::new(),
            converged: None,
        }
    }

    fn counts(n: u64) -> Counts {
        Counts {
            packets: n,
            bytes: n * 100,
            drops: 1,
            errors: 2,
            marks: 3,
            source_drops: 4,
            mac_drops: 5,
        }
    }

    /// A node with one masquerading, limited pod with a host port.
    fn full() -> NodeReport {
        let pod: IpAddr = "10.88.0.5".parse().unwrap();
        let limit = LimitReport {
            rate_bytes: 125_000,
            burst_bytes: 10_000,
            mode: "edt+fq",
            horizon_ns: Some(2_000_000_000),
        };
        NodeReport {
            revisions: vec!["r1".into()],
            endpoints: 1,
            maps: vec![MapUsageReport {
                name: "ECNI_ENDPOINTS",
                entries: 1,
                max_entries: 65_536,
            }],
            attachments: vec![AttachmentReport {
                network: "podnet".into(),
                container_id: "c0ffee".into(),
                ifname: "eth0".into(),
                host_ifindex: Some(7),
                addresses: vec![pod],
                links: vec![],
                from_pod: Some(counts(10)),
                to_pod: Some(counts(20)),
                ingress_limit: Some(limit.clone()),
                egress_limit: Some(limit),
                tcp_pacing_bytes: Some(119_550),
                shape_subnets: None,
                source_check: SourceCheckReport {
                    mode: "on",
                    mac: Some("02:00:00:00:00:01".into()),
                    allowed: vec!["10.88.0.5/32".into()],
                },
            }],
            node_addresses: vec!["192.0.2.1".parse().unwrap()],
            port_mappings: vec![PortMappingReport {
                host: "0.0.0.0:8080/tcp".into(),
                pod: "10.88.0.5:80".into(),
                protocol: "tcp",
                host_ip: "0.0.0.0".parse().unwrap(),
                host_port: 8080,
                pod_address: pod,
                pod_port: 80,
                host_ifindex: 7,
                attachment: Some("podnet/c0ffee/eth0".into()),
                packets: 6,
                bytes: 600,
                socket: 2,
                loopback: false,
            }],
            masquerade: Some(MasqReport {
                enabled: true,
                sources: vec![crate::bpf::MasqSourceReport {
                    ifindex: 2,
                    address: "192.0.2.1".parse().unwrap(),
                }],
                ports: "61000-65535".into(),
                ports_reserved_by_us: true,
                kube_proxy_ports: Some("1024-60999".into()),
                flows: 3,
                flows_by_pod: BTreeMap::from([(pod, 3)]),
                out_packets: 40,
                in_packets: 30,
                flows_created: 3,
                reclaimed: 0,
                exhausted: 0,
                table_full: 0,
                untranslatable: 1,
            }),
            converged: Some(crate::bpf::ConvergeRecord {
                at_unix_ms: 1_798_761_599_999,
                by: "agent".into(),
            }),
            gateways: vec![GatewayReport {
                address: "10.88.0.1".parse().unwrap(),
                users: vec!["podnet/c0ffee/eth0".into()],
            }],
            gateways6: vec![GatewayReport {
                address: "fd00:88::1".parse().unwrap(),
                users: vec!["podnet/c0ffee/eth0".into()],
            }],
            ..empty()
        }
    }

    #[test]
    fn an_empty_node_still_has_every_node_family() {
        let text = exposition(&empty(), 0.001);
        for family in [
            "ebpf_cni_attachments 0",
            "ebpf_cni_endpoints 0",
            "ebpf_cni_port_mappings 0",
            "# TYPE ebpf_cni_pod_bytes_total counter",
            "# TYPE ebpf_cni_pod_source_check gauge",
            "# TYPE ebpf_cni_pod_limiter gauge",
            "ebpf_cni_kernel_part_degraded{part=\"egress TCP pacing\"} 0",
            "ebpf_cni_masquerade_failures_total{reason=\"table_full\"} 0",
            "# TYPE ebpf_cni_masquerade_flows gauge",
        ] {
            assert!(text.contains(family), "{family} missing from:\n{text}");
        }
        assert!(
            text.ends_with("ebpf_cni_metrics_read_seconds 0.001\n"),
            "{text}"
        );
        // Every counter family's name ends in _total, as the format's counters must.
        for line in text.lines().filter(|l| l.starts_with("# TYPE")) {
            let parts: Vec<_> = line.split(' ').collect();
            assert_eq!(
                parts[3] == "counter",
                parts[2].ends_with("_total"),
                "{line}"
            );
        }
        let table = inspect(&empty());
        assert!(
            table.contains("masquerade: not set up on this node"),
            "{table}"
        );
        assert!(!table.contains("IPv6 gateways"), "{table}");
    }

    /// Each capability's state shows in both outputs, and each family is one block.
    #[test]
    fn every_part_shows_in_both_outputs() {
        let r = full();
        let text = exposition(&r, 0.5);
        let pod = r#"network="podnet",container_id="c0ffee",ifname="eth0",address="10.88.0.5""#;
        for sample in [
            format!("ebpf_cni_pod_packets_total{{{pod},direction=\"ingress\"}} 20"),
            format!("ebpf_cni_pod_ecn_marks_total{{{pod},direction=\"egress\"}} 3"),
            format!("ebpf_cni_pod_source_drops_total{{{pod},reason=\"mac\"}} 5"),
            format!("ebpf_cni_pod_source_check{{{pod},mode=\"on\"}} 1"),
            format!("ebpf_cni_pod_limiter{{{pod},direction=\"egress\",mode=\"police_and_pace\"}} 1"),
            format!("ebpf_cni_pod_limit_burst_bytes{{{pod},direction=\"ingress\"}} 10000"),
            format!("ebpf_cni_pod_tcp_pacing_rate_bytes_per_second{{{pod}}} 119550"),
            "ebpf_cni_host_port_socket_translations_total{network=\"podnet\",container_id=\"c0ffee\",ifname=\"eth0\",protocol=\"tcp\",host_ip=\"0.0.0.0\",host_port=\"8080\",pod_address=\"10.88.0.5\",pod_port=\"80\"} 2".into(),
            "ebpf_cni_masquerade_flows{pod_address=\"10.88.0.5\"} 3".into(),
            "ebpf_cni_masquerade_failures_total{reason=\"untranslatable\"} 1".into(),
            "ebpf_cni_map_max_entries{map=\"ECNI_ENDPOINTS\"} 65536".into(),
            "ebpf_cni_programs_info{revision=\"r1\"} 1".into(),
            "ebpf_cni_node_converged_timestamp_seconds{by=\"agent\"} 1798761599.999".into(),
        ] {
            assert!(text.contains(&sample), "{sample} missing from:\n{text}");
        }
        let mut seen = std::collections::BTreeSet::new();
        let mut last = "";
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            if name != last {
                assert!(seen.insert(name), "{name}'s samples are split:\n{text}");
                last = name;
            }
        }

        let table = inspect(&r);
        for line in [
            "      limits    to pod 1000000 bit/s, burst 10000 B, edt+fq (horizon 2000 ms) (3 ECN-marked), from pod 1000000 bit/s, burst 10000 B, edt+fq (horizon 2000 ms) (3 ECN-marked)",
            "      TCP paced at 956400 bit/s",
            "      sources   on, MAC 02:00:00:00:00:01, from 10.88.0.5/32; dropped 4 (address), 5 (MAC)",
            "masquerade: on, ports 61000-65535 (reserved by ebpf-cni), 3 flows",
            "  translated 40 packets out, 30 in; 3 flows created, 0 ports reclaimed",
            "  dropped 0 (ports exhausted), 0 (table full), 1 (untranslatable)",
            "  kube-proxy's masquerade kept to ports 1024-60999 (table inet ebpf-cni)",
            "  10.88.0.5                        3 flows",
            "  leaves ifindex 2 with 192.0.2.1",
            "converged: 2026-12-31T23:59:59.999Z by agent",
            "  wildcard host ports answer on: 192.0.2.1",
            "  ECNI_ENDPOINTS                   1 / 65536",
            "  10.88.0.1        1 user(s): podnet/c0ffee/eth0",
            "IPv6 gateways held on the users' host veths (put back by STATUS and the agent):",
            "  fd00:88::1                               1 user(s): podnet/c0ffee/eth0",
        ] {
            assert!(table.lines().any(|l| l == line), "{line:?} missing from:\n{table}");
        }
        assert!(table.contains("not on loopback"), "{table}");
    }
}
