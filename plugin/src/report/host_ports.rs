//! Host port mappings: each mapping with its hit counters, and the node addresses wildcard
//! host ports answer on.

use std::net::IpAddr;

use super::part::{heading, Exposition, Part, Text};
use crate::bpf::PortMappingReport;

pub struct HostPorts<'a> {
    pub port_mappings: &'a [PortMappingReport],
    pub node_addresses: &'a [IpAddr],
}

impl Part for HostPorts<'_> {
    fn inspect(&self, t: &mut Text) {
        let Self {
            port_mappings,
            node_addresses,
        } = self;
        heading(t, "port mappings:", port_mappings.is_empty());
        if port_mappings.is_empty() {
            return;
        }
        t.line(format!(
            "  {:<28} {:<28} {:>10} {:>12} {:>8}  attachment",
            "host", "pod", "packets", "bytes", "socket"
        ));
        for m in *port_mappings {
            // `host` and `pod` say the protocol, addresses and ports.
            let PortMappingReport {
                host,
                pod,
                protocol: _,
                host_ip: _,
                host_port: _,
                pod_address: _,
                pod_port: _,
                host_ifindex,
                attachment,
                packets,
                bytes,
                socket,
                loopback,
            } = m;
            t.line(format!(
                "  {:<28} {:<28} {:>10} {:>12} {:>8}  {} on ifindex {}{}",
                host,
                pod,
                packets,
                bytes,
                socket,
                attachment.as_deref().unwrap_or("?"),
                host_ifindex,
                if *loopback { "" } else { ", not on loopback" }
            ));
        }
        let addrs: Vec<String> = node_addresses.iter().map(ToString::to_string).collect();
        t.line(format!(
            "  wildcard host ports answer on: {}",
            addrs.join(", ")
        ));
    }

    fn metrics(&self, e: &mut Exposition) {
        // The node's addresses are the node's own, not the plugin's state: no series.
        let Self {
            port_mappings,
            node_addresses: _,
        } = self;
        type Get = fn(&PortMappingReport) -> u64;
        let counters: [(&str, &str, Get); 3] = [
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
        for (name, help, _) in counters {
            e.family(name, "counter", help);
        }
        for m in *port_mappings {
            // `host` and `pod` are the labels below joined; the veth's ifindex and the
            // loopback setting are inspect's.
            let PortMappingReport {
                host: _,
                pod: _,
                protocol,
                host_ip,
                host_port,
                pod_address,
                pod_port,
                host_ifindex: _,
                attachment,
                packets: _,
                bytes: _,
                socket: _,
                loopback: _,
            } = m;
            let (network, container_id, ifname) = attachment
                .as_deref()
                .and_then(|a| {
                    let mut it = a.splitn(3, '/');
                    Some((it.next()?, it.next()?, it.next()?))
                })
                .unwrap_or(("", "", ""));
            let (host_ip, host_port) = (host_ip.to_string(), host_port.to_string());
            let (pod_address, pod_port) = (pod_address.to_string(), pod_port.to_string());
            let labels = [
                ("network", network),
                ("container_id", container_id),
                ("ifname", ifname),
                ("protocol", *protocol),
                ("host_ip", &host_ip),
                ("host_port", &host_port),
                ("pod_address", &pod_address),
                ("pod_port", &pod_port),
            ];
            for (name, _, get) in counters {
                e.sample(name, &labels, get(m));
            }
        }
        let name = "ebpf_cni_port_mappings";
        e.family(name, "gauge", "Host port mappings installed on the node.");
        e.sample(name, &[], port_mappings.len());
    }
}
