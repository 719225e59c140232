//! results.json: the run's parameters, machine, headline and every table (rows with their
//! typed metric), the raw samples and curves behind the charts, and the failures.

use serde_json::{json, Value};

use crate::model::Table;
use crate::run::Run;

use super::headline::headline;

pub fn results_json(run: &Run) -> Value {
    let tables: Vec<&Table> = run.tables();
    json!({
        "command": run.command,
        "machine": run.machine,
        "params": run.params,
        "headline": headline(run),
        "tables": tables,
        "lifecycle_samples_ms": run.lifecycle.as_ref().map(|l| &l.samples),
        "scale_curves": run.scale.as_ref().map(|s| &s.curves),
        "density_curves": run.scale.as_ref().map(|s| &s.density_curves),
        "cleanup": run.cleanup,
        "hostport_probe": run.traffic.as_ref().map(|t| &t.hostport),
        "bandwidth_enforced": run.bandwidth.as_ref().map(|b| &b.enforced),
        "masquerade_probe": run.masquerade.as_ref().map(|m| &m.probe),
        "skipped_sections": run.skipped,
        "section_seconds": run.section_secs,
        "total_seconds": run.total.as_secs_f64(),
        "failures": run.failures(false),
        "reference_failures": run.failures(true),
    })
}
