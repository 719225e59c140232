//! What every part of the report renders with: the [`Part`] trait, the inspect table's
//! lines, and the helpers the parts share.

pub use super::exposition::Exposition;
use crate::bpf::LinkReport;

/// One capability's part of the node report.
pub trait Part {
    /// Its lines of `ebpf-cni inspect`.
    fn inspect(&self, t: &mut Text);
    /// Its metric families, each declared even when it has no sample.
    fn metrics(&self, e: &mut Exposition);
}

/// Lines of the inspect table.
#[derive(Default)]
pub struct Text(pub String);

impl Text {
    pub fn line(&mut self, line: impl AsRef<str>) {
        self.0.push_str(line.as_ref());
        self.0.push('\n');
    }
}

/// A section's heading, and `(none)` under it when it has no line.
pub fn heading(t: &mut Text, title: &str, empty: bool) {
    t.line(title);
    if empty {
        t.line("  (none)");
    }
}

/// A pod's labels and `more`.
pub fn with<'a>(
    base: &[(&'static str, &'a str)],
    more: &[(&'static str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    base.iter().chain(more).copied().collect()
}

/// "tcx link 12", "netlink filter", with "(detached)" when the kernel does not have it.
pub fn attachment(l: &LinkReport) -> String {
    let how = match l.mode {
        "tcx" => format!("tcx link {}", l.link_id),
        other => format!("{other} filter"),
    };
    if l.attached {
        how
    } else {
        format!("{how} (detached)")
    }
}
