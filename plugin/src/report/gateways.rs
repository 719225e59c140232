//! The pods' gateways and the attachments using each: the IPv4 ones the node holds on
//! `lo`, the IPv6 ones the host veths hold.

use super::part::{heading, Exposition, Part, Text};
use crate::bpf::GatewayReport;

pub struct Gateways<'a> {
    pub gateways: &'a [GatewayReport],
    pub gateways6: &'a [GatewayReport],
}

impl Part for Gateways<'_> {
    fn inspect(&self, t: &mut Text) {
        let Self {
            gateways,
            gateways6,
        } = self;
        heading(
            t,
            "gateways held on lo (ARP answered by the pod programs):",
            gateways.is_empty(),
        );
        lines(t, gateways, 16);
        // A node without IPv6 pods (most) shows no empty section for them.
        if !gateways6.is_empty() {
            t.line(
                "IPv6 gateways held on the users' host veths (put back by STATUS and the agent):",
            );
            lines(t, gateways6, 40);
        }
    }

    /// No series: a gateway follows from the pods' addresses, and one missing fails CHECK.
    fn metrics(&self, _: &mut Exposition) {
        let Self {
            gateways: _,
            gateways6: _,
        } = self;
    }
}

/// One line per gateway: its address (in a column `width` wide) and its users.
fn lines(t: &mut Text, gws: &[GatewayReport], width: usize) {
    for GatewayReport { address, users } in gws {
        t.line(format!(
            "  {:<width$} {} user(s): {}",
            address.to_string(),
            users.len(),
            users.join(", ")
        ));
    }
}
