//! The node devices and their device program.

use super::part::{attachment, heading, Exposition, Part, Text};
use crate::bpf::DeviceReport;

pub struct Devices<'a> {
    pub devices: &'a [DeviceReport],
}

impl Part for Devices<'_> {
    fn inspect(&self, t: &mut Text) {
        let Self { devices } = self;
        heading(t, "devices:", devices.is_empty());
        for DeviceReport { name, link } in *devices {
            match link {
                Some(l) => t.line(format!(
                    "  {:<16} ifindex {:<4} {} prog {} {}",
                    name,
                    l.ifindex,
                    l.program,
                    l.program_id,
                    attachment(l)
                )),
                None => t.line(format!("  {name:<16} link pin unreadable")),
            }
        }
    }

    /// No series: which devices carry the program is configuration, and a detached one
    /// fails CHECK and STATUS, which alert on it.
    fn metrics(&self, _: &mut Exposition) {
        let Self { devices: _ } = self;
    }
}
