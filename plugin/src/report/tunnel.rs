//! The cluster network's tunnel, node-wide: its device, the peers behind it, and what its
//! programs carried and dropped.

use super::part::{Exposition, Part, Text};
use crate::bpf::tunnel::{TunnelPeerReport, TunnelReport, UnroutedPeer};

pub struct Tunnel<'a> {
    /// `None` on a node without the tunnel maps (none pinned yet, or pinned by a release
    /// before them).
    pub tunnel: &'a Option<TunnelReport>,
    /// The peer subnets the agent gives no route (with or without a tunnel).
    pub unrouted_peers: &'a [UnroutedPeer],
}

impl Part for Tunnel<'_> {
    fn inspect(&self, t: &mut Text) {
        match self.tunnel {
            Some(r) if r.ifindex != 0 => {
                t.line(format!(
                    "tunnel: {} (ifindex {}), {} peer subnets of {} nodes",
                    crate::bpf::tunnel::TUNNEL_DEVICE,
                    r.ifindex,
                    r.peers,
                    r.nodes
                ));
                const SHOWN: usize = 32;
                for route in r.peer_subnets.iter().take(SHOWN) {
                    t.line(format!("  {} via {}", route.subnet, route.node));
                }
                if r.peer_subnets.len() > SHOWN {
                    t.line(format!("  ({} more)", r.peer_subnets.len() - SHOWN));
                }
                t.line(format!(
                    "  out: {} packets, {} bytes; in: {} packets, {} bytes",
                    r.encap_packets, r.encap_bytes, r.decap_packets, r.decap_bytes
                ));
                t.line(format!(
                    "  dropped: {} for no peer, {} from a non-member, {} with a forged source, {} malformed; {} errors",
                    r.drop_no_peer, r.drop_not_member, r.drop_forged_source, r.drop_malformed, r.errors
                ));
                for p in r.peer_nodes.iter().take(SHOWN) {
                    t.line(format!(
                        "  node {}: out {} packets, {} bytes; in {} packets, {} bytes; {} forged sources dropped",
                        p.node, p.encap_packets, p.encap_bytes, p.decap_packets, p.decap_bytes, p.drop_forged_source
                    ));
                }
                if r.peer_nodes.len() > SHOWN {
                    t.line(format!("  ({} more nodes)", r.peer_nodes.len() - SHOWN));
                }
            }
            _ => t.line("tunnel: none on this node"),
        }
        if !self.unrouted_peers.is_empty() {
            t.line(format!(
                "cluster network: {} peer subnets without a route",
                self.unrouted_peers.len()
            ));
            for p in self.unrouted_peers {
                t.line(format!("  {} of node {}: {}", p.subnet, p.node, p.why));
            }
        }
    }

    fn metrics(&self, e: &mut Exposition) {
        let default = TunnelReport::default();
        let r = self.tunnel.as_ref().unwrap_or(&default);
        let name = "ebpf_cni_cluster_unrouted_peer_subnets";
        e.family(
            name,
            "gauge",
            "Peer pod subnets the cluster network's agent gives no route (mode direct and only a gateway reaches the peer, no address of the family, no tunnel).",
        );
        e.sample(name, &[], self.unrouted_peers.len());
        let name = "ebpf_cni_tunnel_peers";
        e.family(
            name,
            "gauge",
            "Peer pod subnets the node reaches through its tunnel device.",
        );
        e.sample(name, &[], r.peers);
        let name = "ebpf_cni_tunnel_packets_total";
        e.family(
            name,
            "counter",
            "Packets through the tunnel device, by direction (out: given a tunnel key; in: accepted on arrival).",
        );
        e.sample(name, &[("direction", "out")], r.encap_packets);
        e.sample(name, &[("direction", "in")], r.decap_packets);
        let name = "ebpf_cni_tunnel_bytes_total";
        e.family(
            name,
            "counter",
            "Bytes (of the inner frames) through the tunnel device, by direction.",
        );
        e.sample(name, &[("direction", "out")], r.encap_bytes);
        e.sample(name, &[("direction", "in")], r.decap_bytes);
        let name = "ebpf_cni_tunnel_drops_total";
        e.family(
            name,
            "counter",
            "Packets the tunnel's programs dropped, by reason: no_peer (out, no peer holds the destination), not_member (in, the outer source is no member's node), forged_source (in, a member's packet from outside its pod subnets and address), malformed (in, no tunnel key or not IP), error (out, the tunnel key refused).",
        );
        for (reason, v) in [
            ("no_peer", r.drop_no_peer),
            ("not_member", r.drop_not_member),
            ("forged_source", r.drop_forged_source),
            ("malformed", r.drop_malformed),
            ("error", r.errors),
        ] {
            e.sample(name, &[("reason", reason)], v);
        }
        for (name, help, of) in [
            (
                "ebpf_cni_tunnel_peer_packets_total",
                "Packets through the tunnel device per member node (peer: its address), by direction.",
                (|p| (p.encap_packets, p.decap_packets)) as fn(&TunnelPeerReport) -> (u64, u64),
            ),
            (
                "ebpf_cni_tunnel_peer_bytes_total",
                "Bytes (of the inner frames) through the tunnel device per member node, by direction.",
                |p| (p.encap_bytes, p.decap_bytes),
            ),
        ] {
            e.family(name, "counter", help);
            for p in &r.peer_nodes {
                let peer = p.node.to_string();
                let (out, inward) = of(p);
                e.sample(name, &[("peer", &peer), ("direction", "out")], out);
                e.sample(name, &[("peer", &peer), ("direction", "in")], inward);
            }
        }
        let name = "ebpf_cni_tunnel_peer_drops_total";
        e.family(
            name,
            "counter",
            "Packets from a member node the tunnel's programs dropped, by reason: forged_source (from outside its pod subnets and address).",
        );
        for p in &r.peer_nodes {
            let peer = p.node.to_string();
            e.sample(
                name,
                &[("peer", &peer), ("reason", "forged_source")],
                p.drop_forged_source,
            );
        }
    }
}
