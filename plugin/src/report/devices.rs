//! The node devices and their device program.

use super::part::{attachment, heading, Exposition, Part, Text};
use crate::bpf::{DeviceReport, UnpinnedFilter};

pub struct Devices<'a> {
    pub devices: &'a [DeviceReport],
    pub unpinned: &'a [UnpinnedFilter],
}

impl Part for Devices<'_> {
    fn inspect(&self, t: &mut Text) {
        let Self { devices, unpinned } = self;
        if !unpinned.is_empty() {
            t.line(
                "programs attached without pins (the pins were removed; the next STATUS, agent pass, ADD or GC removes them):",
            );
            for UnpinnedFilter {
                device,
                hook,
                program,
            } in *unpinned
            {
                t.line(format!("  {device:<16} {hook:<8} {program}"));
            }
        }
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
    /// fails CHECK and STATUS, which alert on it. Programs attached without pins are found
    /// by netlink in the node's namespace, which `inspect` enters and a metrics read does
    /// not (and the next STATUS or agent pass removes them).
    fn metrics(&self, _: &mut Exposition) {
        let Self {
            devices: _,
            unpinned: _,
        } = self;
    }
}
