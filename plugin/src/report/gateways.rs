//! The pods' IPv4 gateways the node holds on `lo`, and the attachments using each.

use super::part::{heading, Exposition, Part, Text};
use crate::bpf::GatewayReport;

pub struct Gateways<'a> {
    pub gateways: &'a [GatewayReport],
}

impl Part for Gateways<'_> {
    fn inspect(&self, t: &mut Text) {
        let Self { gateways } = self;
        heading(
            t,
            "gateways held on lo (ARP answered by the pod programs):",
            gateways.is_empty(),
        );
        for GatewayReport { address, users } in *gateways {
            t.line(format!(
                "  {:<16} {} user(s): {}",
                address.to_string(),
                users.len(),
                users.join(", ")
            ));
        }
    }

    /// No series: a gateway follows from the pods' addresses, and one missing fails CHECK.
    fn metrics(&self, _: &mut Exposition) {
        let Self { gateways: _ } = self;
    }
}
