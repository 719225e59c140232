//! RESULTS.md ([`markdown`]), results.json ([`json`]), the charts ([`charts`]) and the
//! headline table printed at the end ([`headline`]); [`targets`] judges the goals and
//! [`table`] writes tables as text.
//!
//! Cells show "median [min–max]" (a single figure when there was one value); cells without
//! a figure say why in a short word, and the reasons follow the table. Ratios are ebpf-cni's
//! median over the reference chain's.

pub mod charts;
pub mod headline;
pub mod json;
pub mod markdown;
pub mod table;
pub mod targets;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use anyhow::{bail, Context as _};

use crate::log::progress;
use crate::model::{Cell, Subject};
use crate::run::Run;
pub use charts::Charts;

/// Writes RESULTS.md, results.json and the charts of `run` to `out_dir` and prints the
/// headline table; then fails when a measurement failed (not when the reference chain's
/// own behaviour did).
pub fn write(run: &Run, out_dir: &Path) -> anyhow::Result<()> {
    let charts = draw_charts(run, out_dir);
    let text = markdown::markdown(run, &charts);
    let report_path = out_dir.join("RESULTS.md");
    fs::write(&report_path, text).with_context(|| format!("writing {}", report_path.display()))?;
    let json = serde_json::to_string_pretty(&json::results_json(run))?;
    fs::write(out_dir.join("results.json"), json + "\n")?;

    println!("{}", headline::headline_text(run));
    println!(
        "report: {} ({} charts), took {:.0} s",
        report_path.display(),
        charts.len(),
        run.total.as_secs_f64()
    );
    for f in run.failures(true) {
        println!("note: the reference chain failed (its own behaviour, see the report): {f}");
    }
    let failures = run.failures(false);
    if !failures.is_empty() {
        let mut shown: Vec<String> = failures.iter().take(8).cloned().collect();
        if failures.len() > shown.len() {
            shown.push(format!("… and {} more", failures.len() - shown.len()));
        }
        bail!(
            "{} measurement(s) failed (see {}):\n  - {}",
            failures.len(),
            report_path.display(),
            shown.join("\n  - ")
        );
    }
    Ok(())
}

fn draw_charts(run: &Run, dir: &Path) -> Charts {
    let mut out = Vec::new();
    let mut keep = |title: &str, r: anyhow::Result<std::path::PathBuf>| match r {
        Ok(p) => out.push((
            title.to_owned(),
            p.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        )),
        Err(e) => progress(&format!("chart {title}: {e:#}")),
    };
    if let Some(l) = &run.lifecycle {
        keep(
            "ADD, CHECK and DEL latency",
            charts::latency(dir, &l.samples),
        );
    }
    if let Some(t) = &run.traffic {
        keep(
            "Throughput, TCP_RR and TCP_CRR",
            charts::traffic(dir, &t.throughput, &t.rr),
        );
    }
    if let Some(s) = &run.scale {
        let missing: BTreeMap<Subject, String> = Subject::CNI
            .into_iter()
            .filter_map(|subj| {
                let cell = s.table.rows.first()?.cell(subj);
                let why = match cell {
                    Cell::NotImplemented { .. } => "not implemented yet",
                    Cell::Failed { .. } => "failed",
                    Cell::Value(_) => return None,
                    _ => "not measured",
                };
                Some((subj, why.to_owned()))
            })
            .collect();
        keep("Port-map scale", charts::scale(dir, &s.curves, &missing));
    }
    if let Some(b) = &run.bandwidth {
        keep("Bandwidth accuracy", charts::bandwidth(dir, &b.table));
    }
    out
}
