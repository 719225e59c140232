//! Services next to kube-proxy, node-wide: whether the programs hand Service flows to the
//! stack and why (where the Service addresses came from), and what they handed over.

use super::part::{Exposition, Part, Text};
use crate::bpf::ServicesReport;

pub struct Services<'a> {
    /// `None` on a node without the Services maps (none pinned yet, or pinned by a release
    /// before them).
    pub services: &'a Option<ServicesReport>,
}

impl Part for Services<'_> {
    fn inspect(&self, t: &mut Text) {
        let Some(ServicesReport {
            in_force,
            source,
            addresses,
            flows,
            to_service,
            replies,
            from_outside,
            recorded,
            record_failed,
            forgotten,
            shared_port,
            forward_firewall,
        }) = self.services
        else {
            t.line("services: not set up on this node");
            return;
        };
        t.line(format!(
            "services: {}, {addresses} Service addresses from {source}, {flows} flows through the stack",
            if *in_force {
                "Service flows go through the stack"
            } else {
                "off (no Service addresses)"
            },
        ));
        t.line(format!(
            "  to the stack: {to_service} packets to Services, {replies} replies, {from_outside} from outside, {shared_port} from ports Service flows hold; {recorded} flows recorded, {record_failed} refused, {forgotten} dead flows' records dropped"
        ));
        for f in forward_firewall {
            t.line(format!("  forward hook drops that pod traffic skips: {f}"));
        }
    }

    fn metrics(&self, e: &mut Exposition) {
        // Zero on a node without the maps. Whether it is on and why is inspect's.
        let default = ServicesReport::default();
        let ServicesReport {
            in_force: _,
            source: _,
            addresses,
            flows,
            to_service,
            replies,
            from_outside,
            recorded,
            record_failed,
            forgotten,
            shared_port,
            forward_firewall: _,
        } = self.services.as_ref().unwrap_or(&default);
        let name = "ebpf_cni_services_addresses";
        e.family(
            name,
            "gauge",
            "Service addresses (ranges) the programs hand to the stack.",
        );
        e.sample(name, &[], addresses);
        let name = "ebpf_cni_services_flows";
        e.family(
            name,
            "gauge",
            "Flows the programs hand to the stack for netfilter to translate.",
        );
        e.sample(name, &[], flows);
        let name = "ebpf_cni_services_packets_total";
        e.family(
            name,
            "counter",
            "Packets handed to the stack for Services, by reason: to_service (a pod's packet to a Service address), reply (a pod's reply in a flow the stack delivered), from_outside (a reply from beyond the node to a pod's Service flow), shared_port (a pod's packet from a port a live Service flow holds, to elsewhere).",
        );
        for (reason, v) in [
            ("to_service", to_service),
            ("reply", replies),
            ("from_outside", from_outside),
            ("shared_port", shared_port),
        ] {
            e.sample(name, &[("reason", reason)], v);
        }
        let name = "ebpf_cni_services_flows_recorded_total";
        e.family(
            name,
            "counter",
            "Flows recorded as going through the stack, by outcome.",
        );
        for (outcome, v) in [
            ("recorded", recorded),
            ("refused", record_failed),
            ("forgotten", forgotten),
        ] {
            e.sample(name, &[("outcome", outcome)], v);
        }
    }
}
