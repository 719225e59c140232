//! REPORT.md, results.json, the charts and the headline table printed at the end.
//!
//! Cells show "median [min–max]" (a single figure when there was one value); cells without
//! a figure say why in a short word, and the reasons follow the table. Ratios are ebpf-cni's
//! median over the reference chain's.

pub mod charts;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use anyhow::{bail, Context as _};

use serde_json::{json, Value};

use crate::format::short_num;
use crate::format::thousands;
use crate::log::progress;
use crate::metric::{
    Better, Metric, PathKind, ScaleFigure, METRICS_TARGET_MS, METRICS_TARGET_PODS,
};
use crate::model::{Cell, Row, Subject, Summary, Table};
use crate::params::Section;
use crate::run::Run;
use crate::sections::cleanup::{self, Scenario};
use crate::sections::masquerade;

/// Writes REPORT.md, results.json and the charts of `run` to `out_dir` and prints the
/// headline table; then fails when a measurement failed (not when the reference chain's
/// own behaviour did).
pub fn write(run: &Run, out_dir: &Path) -> anyhow::Result<()> {
    let charts = draw_charts(run, out_dir);
    let text = markdown(run, &charts);
    let report_path = out_dir.join("REPORT.md");
    fs::write(&report_path, text).with_context(|| format!("writing {}", report_path.display()))?;
    let json = serde_json::to_string_pretty(&results_json(run))?;
    fs::write(out_dir.join("results.json"), json + "\n")?;

    println!("{}", headline_text(run));
    println!(
        "report: {} ({} charts), took {:.0} s",
        report_path.display(),
        charts.len(),
        run.total.as_secs_f64()
    );
    for f in failures(run, true) {
        println!("note: the reference chain failed (its own behaviour, see the report): {f}");
    }
    let failures = failures(run, false);
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

/// (title, file name) of each chart written.
pub type Charts = Vec<(String, String)>;

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

// ---- cells ----

/// Percentages with one decimal throughout (so 99.96 and 100.2 read alike); other figures
/// with three significant digits.
fn fmt_num(v: f64, unit: &str) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        short_num(v)
    } else if unit.contains('%') {
        format!("{v:.1}")
    } else {
        short_num(v)
    }
}

fn fmt_summary(s: &Summary, unit: &str) -> String {
    if s.n <= 1 || (s.max - s.min).abs() < f64::EPSILON * s.median.abs().max(1.0) {
        fmt_num(s.median, unit)
    } else {
        format!(
            "{} [{}–{}]",
            fmt_num(s.median, unit),
            fmt_num(s.min, unit),
            fmt_num(s.max, unit)
        )
    }
}

fn cell_word(c: &Cell, unit: &str) -> String {
    match c {
        Cell::Value(s) => fmt_summary(s, unit),
        Cell::NotImplemented { .. } => "not implemented".into(),
        Cell::NotApplicable => "—".into(),
        Cell::Failed { .. } => "**fails**".into(),
        Cell::NotRun { .. } => "not run".into(),
    }
}

fn cell_reason(c: &Cell) -> Option<String> {
    match c {
        Cell::NotImplemented { why } => Some(format!("not implemented: {why}")),
        Cell::Failed { error } => Some(format!("fails: {error}")),
        Cell::NotRun { why } => Some(format!("not run: {why}")),
        _ => None,
    }
}

fn ratio_text(r: &Row) -> String {
    match r.ratio() {
        Some(x) => {
            let hint = match r.metric.better() {
                Better::Lower if x < 1.0 => " (better)",
                Better::Lower if x > 1.0 => " (worse)",
                Better::Higher if x > 1.0 => " (better)",
                Better::Higher if x < 1.0 => " (worse)",
                _ => "",
            };
            format!("{x:.2}×{hint}")
        }
        None => "—".into(),
    }
}

fn escape(s: &str) -> String {
    s.replace('|', "\\|")
}

/// A markdown table with the reasons for missing figures below it.
fn md_table(t: &Table, heading: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{heading} {}\n", t.title);
    let _ = writeln!(s, "_Cells: {}._\n", t.cell_meaning);
    let show_veth = t
        .rows
        .iter()
        .any(|r| !matches!(r.cell(Subject::Veth), Cell::NotApplicable));
    let mut head =
        "| metric | unit | reference chain | ebpf-cni | ebpf-cni / reference |".to_owned();
    let mut rule = "|---|---|---:|---:|---:|".to_owned();
    if show_veth {
        head.push_str(" plain veth |");
        rule.push_str("---:|");
    }
    let _ = writeln!(s, "{head}\n{rule}");
    let mut reasons: Vec<String> = Vec::new();
    for r in &t.rows {
        let mut line = format!(
            "| {} | {} | {} | {} | {} |",
            escape(&r.metric.name()),
            r.unit(),
            cell_word(&r.cell(Subject::Reference), r.unit()),
            cell_word(&r.cell(Subject::EbpfCni), r.unit()),
            ratio_text(r)
        );
        if show_veth {
            let _ = write!(line, " {} |", cell_word(&r.cell(Subject::Veth), r.unit()));
        }
        let _ = writeln!(s, "{line}");
        for subj in Subject::ALL {
            if let Some(why) = cell_reason(&r.cell(subj)) {
                let text = format!("{}: {why}", subj.label());
                if !reasons.contains(&text) {
                    reasons.push(text);
                }
            }
        }
    }
    s.push('\n');
    for n in &t.notes {
        let _ = writeln!(s, "- {n}");
    }
    for r in reasons {
        let _ = writeln!(s, "- {}", escape(&r));
    }
    s.push('\n');
    s
}

/// A plain-text table for the terminal.
fn text_table(t: &Table) -> String {
    let mut rows: Vec<[String; 5]> = vec![[
        "metric".into(),
        "reference chain".into(),
        "ebpf-cni".into(),
        "ebpf-cni/ref".into(),
        "plain veth".into(),
    ]];
    for r in &t.rows {
        let word = |c: Cell| cell_word(&c, r.unit()).replace("**", "");
        rows.push([
            format!("{} ({})", r.metric.name(), r.unit()),
            word(r.cell(Subject::Reference)),
            word(r.cell(Subject::EbpfCni)),
            r.ratio().map_or("—".into(), |x| format!("{x:.2}×")),
            word(r.cell(Subject::Veth)),
        ]);
    }
    let mut width = [0usize; 5];
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let mut s = String::new();
    for (n, r) in rows.iter().enumerate() {
        for (i, c) in r.iter().enumerate() {
            let pad = width[i] - c.chars().count();
            if i == 0 {
                let _ = write!(s, "{c}{}  ", " ".repeat(pad));
            } else {
                let _ = write!(s, "{}{c}  ", " ".repeat(pad));
            }
        }
        s.push('\n');
        if n == 0 {
            let total: usize = width.iter().sum::<usize>() + 2 * width.len();
            s.push_str(&"-".repeat(total));
            s.push('\n');
        }
    }
    s
}

// ---- the headline ----

/// The row of `metric` in `t`, as the headline names it.
fn pick(t: Option<&Table>, metric: Metric) -> Option<Row> {
    t?.row(&metric).map(Row::headline)
}

pub fn headline(run: &Run) -> Table {
    let p = &run.params;
    let mut t = Table::new(
        "Headline",
        format!(
            "median [min–max] over repeats; {} run",
            if p.quick {
                "quick (indicative only)"
            } else {
                "full"
            }
        ),
    );
    let l = run.lifecycle.as_ref();
    let tr = run.traffic.as_ref();
    let pod_to_pod = PathKind::PodToPod;
    let mut rows: Vec<Option<Row>> = vec![
        pick(l.map(|l| &l.latency), Metric::AddP50),
        pick(l.map(|l| &l.latency), Metric::CheckP50),
        pick(l.map(|l| &l.latency), Metric::DelP50),
        pick(l.map(|l| &l.cost), Metric::AddCpu),
        pick(l.map(|l| &l.cost), Metric::AddPeakRss),
        pick(
            l.map(|l| &l.concurrency),
            Metric::ConcurrentAdds {
                concurrent: p.concurrent,
            },
        ),
        pick(tr.map(|t| &t.throughput), Metric::Throughput(pod_to_pod)),
        pick(tr.map(|t| &t.throughput), Metric::PodToPodOfVeth),
        pick(
            tr.map(|t| &t.throughput),
            Metric::Throughput(PathKind::NodeToPod),
        ),
        pick(
            tr.map(|t| &t.throughput),
            Metric::Throughput(PathKind::ExtToHostPort),
        ),
        pick(tr.map(|t| &t.rr), Metric::RrP50(pod_to_pod)),
        pick(tr.map(|t| &t.rr), Metric::Crr(pod_to_pod)),
    ];
    if let Some(s) = &run.scale {
        let at = |figure, k| pick(Some(&s.table), Metric::Scale { figure, k });
        rows.push(at(ScaleFigure::ConnectFirst, 0));
        // The largest K the reference reached.
        if let Some(k) = s
            .curves
            .get(&Subject::Reference)
            .and_then(|c| c.last())
            .map(|p| p.k)
            .filter(|k| *k > 0)
        {
            rows.push(at(ScaleFigure::OneMoreAdd, 0));
            for figure in [
                ScaleFigure::ConnectFirst,
                ScaleFigure::ConnectNewest,
                ScaleFigure::OneMoreAdd,
            ] {
                rows.push(at(figure, k));
            }
        }
    }
    if let Some(b) = &run.bandwidth {
        rows.push(pick(Some(&b.table), Metric::WorstDeviation));
    }
    if let Some(c) = &run.cleanup {
        rows.push(Some(cleanup_row(c).headline()));
    }
    if let Some(m) = &run.masquerade {
        rows.push(pick(Some(&m.traffic), Metric::MasqThroughput));
        rows.push(pick(Some(&m.traffic), Metric::MasqCrr));
        rows.push(pick(Some(&m.traffic), Metric::MasqCrrRouted));
        rows.push(pick(
            Some(&m.flows),
            Metric::FlowsHeldShare {
                flows: p.masq_flows,
            },
        ));
    }
    if let Some(m) = &run.metrics {
        rows.push(pick(
            Some(&m.table),
            Metric::MetricsRead {
                pods: p.metrics_pods,
            },
        ));
    }
    t.rows = rows.into_iter().flatten().collect();
    t
}

fn cleanup_row(c: &cleanup::Output) -> Row {
    let mut row = Row::new(Metric::LeftAfterDels);
    for s in Subject::CNI {
        let mut total = 0usize;
        let mut error = None;
        for per in c.outcomes.values() {
            match per.get(&s) {
                Some(o) if o.error.is_some() => error = o.error.clone(),
                Some(o) => total += o.total(),
                None => {}
            }
        }
        let cell = match error {
            Some(e) => Cell::Failed { error: e },
            None => Cell::Value(Summary {
                n: 1,
                median: total as f64,
                min: total as f64,
                max: total as f64,
            }),
        };
        row.cells.insert(s, cell);
    }
    row
}

pub fn headline_text(run: &Run) -> String {
    format!(
        "\n{} — {} ({})\n\n{}",
        run.command,
        run.machine.date_utc,
        if run.params.quick {
            "quick run: indicative only"
        } else {
            "full run"
        },
        text_table(&headline(run))
    )
}

// ---- targets ----

struct Target {
    goal: &'static str,
    source: &'static str,
    ebpf: String,
    reference: String,
    status: String,
}

fn median_of(t: Option<&Table>, metric: &Metric, s: Subject) -> Result<f64, String> {
    let Some(row) = t.and_then(|t| t.row(metric)) else {
        return Err("section not run".into());
    };
    match row.cell(s) {
        Cell::Value(v) => Ok(v.median),
        c => Err(brief(
            &cell_reason(&c).unwrap_or_else(|| "no figure".into()),
        )),
    }
}

/// A reason short enough for a table cell (the full text is under the section's table).
fn brief(s: &str) -> String {
    match s.char_indices().nth(90) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

fn status(ok: bool) -> String {
    if ok { "**met**" } else { "**missed**" }.to_owned()
}

/// The status of a target ebpf-cni has no figure for; the reason is in its column.
fn not_yet() -> String {
    "not measurable yet".to_owned()
}

fn targets(run: &Run) -> Vec<Target> {
    let mut out = Vec::new();
    let lat = run.lifecycle.as_ref().map(|l| &l.latency);
    for (goal, source, metric, limit, issue_ref) in [
        (
            "ADD p50 ≤ 10 ms",
            "3, 6",
            Metric::AddP50,
            10.0,
            "issue: ≈ 65 ms",
        ),
        (
            "DEL p50 ≤ 10 ms",
            "6",
            Metric::DelP50,
            10.0,
            "issue: ≈ 180 ms",
        ),
        (
            "CHECK p50 ≤ 5 ms",
            "6",
            Metric::CheckP50,
            5.0,
            "issue: ≈ 27 ms",
        ),
    ] {
        let e = median_of(lat, &metric, Subject::EbpfCni);
        let r = median_of(lat, &metric, Subject::Reference);
        out.push(Target {
            goal,
            source,
            ebpf: e
                .as_ref()
                .map_or_else(|w| w.clone(), |v| format!("{} ms", short_num(*v))),
            reference: format!(
                "{} ({issue_ref})",
                r.as_ref()
                    .map_or_else(|w| w.clone(), |v| format!("{} ms", short_num(*v)))
            ),
            status: match e {
                Ok(v) => status(v <= limit),
                Err(_) => not_yet(),
            },
        });
    }

    let tput = run.traffic.as_ref().map(|t| &t.throughput);
    let pct = |s| median_of(tput, &Metric::PodToPodOfVeth, s);
    out.push(Target {
        goal: "pod → pod throughput ≥ 93% of a plain veth pair",
        source: "3, 6",
        ebpf: pct(Subject::EbpfCni).map_or_else(|w| w, |v| format!("{v:.0}%")),
        reference: format!(
            "{} (issue: ≈ 80%)",
            pct(Subject::Reference).map_or_else(|w| w, |v| format!("{v:.0}%"))
        ),
        status: match pct(Subject::EbpfCni) {
            Ok(v) => status(v >= 93.0),
            Err(_) => not_yet(),
        },
    });

    let rr = run.traffic.as_ref().map(|t| &t.rr);
    let rr_p50 = Metric::RrP50(PathKind::PodToPod);
    let e = median_of(rr, &rr_p50, Subject::EbpfCni);
    let r = median_of(rr, &rr_p50, Subject::Reference);
    out.push(Target {
        goal: "TCP_RR latency pod → pod lower than the reference chain's",
        source: "3",
        ebpf: e
            .as_ref()
            .map_or_else(|w| w.clone(), |v| format!("{} µs", short_num(*v))),
        reference: r
            .as_ref()
            .map_or_else(|w| w.clone(), |v| format!("{} µs", short_num(*v))),
        status: match (&e, &r) {
            (Ok(e), Ok(r)) => status(e < r),
            (Err(_), _) | (_, Err(_)) => not_yet(),
        },
    });

    for (goal, pick, unit) in [
        (
            "connect latency through a hostPort flat (±20%) from K = 0 to 10,000 (the worse of \
             the first and the newest pod's hostPort)",
            (|p: &crate::sections::scale::Point| {
                p.connect_us.median.max(p.connect_newest_us.median)
            }) as fn(&_) -> f64,
            "µs",
        ),
        (
            "one more ADD flat (±20%) from K = 0 to 10,000, as a multiple of the same ADD on \
             the subject's K = 0 control node at the same time",
            |p: &crate::sections::scale::Point| p.add_ms.median / p.control_add_ms.median,
            "× control",
        ),
    ] {
        let curve = |s| run.scale.as_ref().and_then(|sc| sc.curves.get(&s));
        let growth = |s| -> Result<(f64, f64, usize), String> {
            let c = curve(s).ok_or_else(|| {
                run.scale
                    .as_ref()
                    .and_then(|sc| sc.table.rows.first())
                    .and_then(|r| cell_reason(&r.cell(s)))
                    .map(|w| brief(&w))
                    .unwrap_or_else(|| "section not run".into())
            })?;
            let first = c.iter().find(|p| p.k == 0).ok_or("no K = 0 point")?;
            let last = c.last().ok_or("no points")?;
            Ok((pick(first), pick(last), last.k))
        };
        let describe = |g: &Result<(f64, f64, usize), String>| match g {
            Ok((a, b, k)) => format!(
                "{} → {} {unit} at K = {} (×{:.2})",
                short_num(*a),
                short_num(*b),
                thousands(*k),
                b / a
            ),
            Err(w) => w.clone(),
        };
        let e = growth(Subject::EbpfCni);
        let r = growth(Subject::Reference);
        out.push(Target {
            goal,
            source: "4, 6",
            ebpf: describe(&e),
            reference: describe(&r),
            status: match e {
                Ok((a, b, 10_000)) => status((b / a - 1.0).abs() <= 0.2),
                Ok((_, _, k)) => format!("not measurable yet (reached K = {} only)", thousands(k)),
                Err(_) => not_yet(),
            },
        });
    }

    let bw = run.bandwidth.as_ref().map(|b| &b.table);
    let e = median_of(bw, &Metric::WorstDeviation, Subject::EbpfCni);
    let r = median_of(bw, &Metric::WorstDeviation, Subject::Reference);
    out.push(Target {
        goal: "rate accuracy within ±5% (every rate, direction, TCP and UDP)",
        source: "5, 6",
        ebpf: e
            .as_ref()
            .map_or_else(|w| w.clone(), |v| format!("worst {v:.1}%")),
        reference: r
            .as_ref()
            .map_or_else(|w| w.clone(), |v| format!("worst {v:.1}%")),
        status: match e {
            Ok(v) => status(v <= 5.0),
            Err(_) => not_yet(),
        },
    });
    let loaded: Vec<&Row> = bw
        .map(|t| {
            t.rows
                .iter()
                .filter(|r| matches!(r.metric, Metric::PingUnderLoad { .. }))
                .collect()
        })
        .unwrap_or_default();
    let ratios: Vec<f64> = loaded.iter().filter_map(|r| r.ratio()).collect();
    let why_e = loaded
        .first()
        .and_then(|r| cell_reason(&r.cell(Subject::EbpfCni)))
        .unwrap_or_else(|| "section not run".into());
    out.push(Target {
        goal: "ping under TCP load no worse than the reference's tbf + ifb (within 10%)",
        source: "5",
        ebpf: if ratios.is_empty() {
            brief(&why_e)
        } else {
            format!(
                "worst {:.2}× the reference's",
                ratios.iter().copied().fold(0.0, f64::max)
            )
        },
        reference: "—".into(),
        status: if ratios.is_empty() || ratios.len() < loaded.len() {
            not_yet()
        } else {
            status(ratios.iter().all(|x| *x <= 1.1))
        },
    });

    let read = run.metrics.as_ref().map(|m| {
        let v = m
            .table
            .row(&Metric::MetricsRead { pods: m.pods })
            .map(|r| r.cell(Subject::EbpfCni))
            .unwrap_or(Cell::NotApplicable);
        (m.pods, v)
    });
    out.push(Target {
        goal: "`ebpf-cni metrics` reads all maps of a node of 1,000 pods in < 100 ms",
        source: "18",
        ebpf: match &read {
            Some((pods, Cell::Value(v))) => format!(
                "{} ms (median, {} pods)",
                short_num(v.median),
                thousands(*pods)
            ),
            Some((_, c)) => brief(&cell_reason(c).unwrap_or_else(|| "no figure".into())),
            None => "section not run".into(),
        },
        reference: "— (no counters to export)".into(),
        status: match &read {
            Some((pods, Cell::Value(v))) if *pods >= METRICS_TARGET_PODS => {
                status(v.median < METRICS_TARGET_MS)
            }
            Some((pods, Cell::Value(_))) => format!(
                "not measurable in this run ({} pods only)",
                thousands(*pods)
            ),
            _ => not_yet(),
        },
    });

    if let Some(c) = &run.cleanup {
        let row = cleanup_row(c);
        let v = |s| match row.cell(s) {
            Cell::Value(v) => Ok(v.median),
            c => Err(cell_reason(&c).unwrap_or_default()),
        };
        out.push(Target {
            goal: "nothing left behind after any DEL scenario",
            source: "2–5",
            ebpf: v(Subject::EbpfCni).map_or_else(|w| w, |n| format!("{n:.0} objects")),
            reference: v(Subject::Reference).map_or_else(|w| w, |n| format!("{n:.0} objects")),
            status: match v(Subject::EbpfCni) {
                Ok(n) => status(n == 0.0),
                Err(_) => not_yet(),
            },
        });
    }
    out
}

// ---- the report ----

pub fn markdown(run: &Run, charts: &Charts) -> String {
    let m = &run.machine;
    let p = &run.params;
    let mut s = String::new();
    let _ = writeln!(s, "# ebpf-cni benchmark report\n");
    let _ = writeln!(
        s,
        "`{}` — {}. Measured {} on {} ({} cores, {:.1} GiB), kernel {}, revision {}. The run \
         took {} min {} s.\n",
        run.command,
        if p.quick {
            "**quick run**: short and single-repeat, for CI; its figures are indicative only"
        } else {
            "full run"
        },
        m.date_utc,
        m.cpu,
        m.cores,
        m.memory_gib,
        m.kernel,
        m.git_revision,
        run.total.as_secs() / 60,
        run.total.as_secs() % 60
    );
    let _ = writeln!(
        s,
        "Subjects: the **reference chain** (Debian's ptp + host-local + portmap + bandwidth, \
         {}), **ebpf-cni** ({}) and a **plain veth** pair between two namespaces (the \
         physical limit). Both CNI subjects are driven as a runtime drives them, from inside \
         a test-made node namespace, alternating within every repeat. Ratios are ebpf-cni / \
         reference chain (medians).\n",
        m.versions
            .iter()
            .find(|(t, _)| t.starts_with("reference"))
            .map_or("", |(_, v)| v.as_str()),
        m.versions
            .iter()
            .find(|(t, _)| t == "ebpf-cni")
            .map_or("", |(_, v)| v.as_str())
    );

    s.push_str(&md_table(&headline(run), "##"));

    let _ = writeln!(s, "## Targets (issue 6, with issues 3–5 and 18)\n");
    let _ = writeln!(s, "| goal | issue | ebpf-cni | reference chain | status |");
    let _ = writeln!(s, "|---|---|---|---|---|");
    for t in targets(run) {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            t.goal,
            t.source,
            escape(&t.ebpf),
            escape(&t.reference),
            escape(&t.status)
        );
    }
    if p.quick {
        let _ = writeln!(
            s,
            "\nA quick run is too short to judge targets; the full run's report is the one \
             that counts."
        );
    }
    s.push('\n');

    let _ = writeln!(s, "## Subjects and what each provided\n");
    let _ = writeln!(
        s,
        "| subject | what runs | hostPort (portMappings) | bandwidth limits |"
    );
    let _ = writeln!(s, "|---|---|---|---|");
    let hp = |subj: Subject| match run.traffic.as_ref().and_then(|t| t.hostport.get(&subj)) {
        Some(Ok(())) => "provided (probe: external client → hostPort → pod echoed)".to_owned(),
        Some(Err(e)) => format!("not provided (issue 4) — probe: {}", escape(e)),
        None => "not probed (traffic section not run)".to_owned(),
    };
    let bwp = |subj: Subject| match run.bandwidth.as_ref().and_then(|b| b.enforced.get(&subj)) {
        Some(Ok(())) => "enforced".to_owned(),
        Some(Err(e)) => format!("not enforced — {}", escape(e)),
        None => "not probed (bandwidth section not run or failed)".to_owned(),
    };
    let _ = writeln!(
        s,
        "| reference chain | `ptp` (ipMasq off but in the masquerade section, MTU 1500, \
         host-local IPAM) → `portmap` \
         (capability portMappings, snat on) → `bandwidth` (capability bandwidth) | {} | {} |",
        hp(Subject::Reference),
        bwp(Subject::Reference)
    );
    let _ = writeln!(
        s,
        "| ebpf-cni | `ebpf-cni` alone (same IPAM, MTU and ipMasq, capabilities portMappings and \
         bandwidth, so it receives the same runtimeConfig) | {} | {} |",
        hp(Subject::EbpfCni),
        bwp(Subject::EbpfCni)
    );
    let _ = writeln!(
        s,
        "| plain veth | two namespaces, one veth pair, 10.99.0.1/24 ↔ 10.99.0.2/24, MTU 1500 | — | — |\n"
    );
    let _ = writeln!(
        s,
        "Both lists use cniVersion 1.0.0 and the IPv4 range {} (plus {} for the dual-stack \
         rows), and receive runtimeConfig in containerd's spelling (`HostPort`, `IngressRate`, …). Every node \
         has an uplink veth to an \"external\" client namespace (node 192.168.77.1, client \
         192.168.77.2) before its first pod. The masquerade section alone sets `ipMasq: true` \
         on both lists (ptp's and ebpf-cni's) and gives the external client no route to the \
         pods.\n",
        crate::rig::topo::POD_SUBNET_V4,
        crate::rig::topo::POD_SUBNET_V6
    );

    let _ = writeln!(s, "## Machine and versions\n");
    let _ = writeln!(s, "- Date: {}", m.date_utc);
    let _ = writeln!(s, "- CPU: {}, {} cores", m.cpu, m.cores);
    let _ = writeln!(s, "- Memory: {:.1} GiB", m.memory_gib);
    let _ = writeln!(s, "- Kernel: {}", m.kernel);
    let _ = writeln!(
        s,
        "- TCP congestion control: {}; load average at start: {} (the machine is shared)",
        m.tcp_congestion_control, m.load_average
    );
    let _ = writeln!(s, "- Revision: {}", m.git_revision);
    for (tool, v) in &m.versions {
        let _ = writeln!(s, "- {tool}: {v}");
    }
    s.push('\n');

    let _ = writeln!(s, "## Parameters\n");
    let rates: Vec<String> = p
        .bw_rates
        .iter()
        .map(|r| format!("{} Mbit/s", r / 1_000_000))
        .collect();
    let ks: Vec<String> = p.scale_ks.iter().map(|k| thousands(*k)).collect();
    for line in [
        format!(
            "Lifecycle: {} repeat(s) × {} sequential coexisting IPv4 pods per subject, {} \
             concurrent ADDs then DELs, and {} dual-stack pods.",
            p.repeats, p.pods, p.concurrent, p.dual_pods
        ),
        format!(
            "Traffic: {} repeat(s); iperf3 -t {} -O {}; TCP_RR and TCP_CRR {} s per figure.",
            p.repeats, p.iperf_secs, p.iperf_omit, p.rr_secs
        ),
        format!(
            "Port-map scale: K ∈ {{{}}}, {} mappings per pod, {} connections per point, {} \
             extra ADD/DEL (of a pod with {} mappings) per point, {} s install budget per \
             subject and series; pod-density series: K ∈ {{{}}}, {} mappings per pod.",
            ks.join(", "),
            p.scale_ports_per_pod,
            p.scale_connects,
            p.scale_extra_adds,
            p.scale_extra_ports,
            p.scale_budget.as_secs(),
            p.density_ks
                .iter()
                .map(|k| thousands(*k))
                .collect::<Vec<_>>()
                .join(", "),
            p.density_ports_per_pod
        ),
        format!(
            "Bandwidth: {} repeat(s); limits {}; iperf3 -t {} -O {}; UDP at twice the limit.",
            p.bw_repeats,
            rates.join(", "),
            p.bw_secs,
            p.iperf_omit
        ),
        "Cleanup: one node per subject, a warm-up pod added and deleted, then a resident \
         pod; four DEL scenarios, each on a fresh pod with a hostPort and a 100 Mbit/s limit."
            .into(),
        format!(
            "Masquerade: {} repeat(s); iperf3 -t {} -O {}; TCP_CRR {} s per figure; {} UDP \
             flows from one pod.",
            p.repeats,
            p.iperf_secs,
            p.iperf_omit,
            p.rr_secs,
            thousands(p.masq_flows)
        ),
        format!(
            "Metrics: {} pods on one ebpf-cni node, `ebpf-cni metrics` run {} time(s) after \
             one warm-up run.",
            thousands(p.metrics_pods),
            p.metrics_runs
        ),
    ] {
        let _ = writeln!(s, "- {line}");
    }
    s.push('\n');

    if !charts.is_empty() {
        let _ = writeln!(s, "## Charts\n");
        for (title, file) in charts {
            let _ = writeln!(s, "![{title}]({file})\n");
        }
    }

    let skipped = |sec: Section| -> Option<String> {
        run.skipped
            .iter()
            .find(|(x, _)| *x == sec)
            .map(|(_, why)| format!("_Section {sec:?}: {why}._\n\n"))
    };

    let _ = writeln!(s, "## 1. Lifecycle\n");
    if let Some(l) = &run.lifecycle {
        s.push_str(&md_table(&l.latency, "###"));
        s.push_str(&md_table(&l.dual_stack, "###"));
        s.push_str(&md_table(&l.cost, "###"));
        s.push_str(&md_table(&l.concurrency, "###"));
    }
    s.extend(skipped(Section::Lifecycle));

    let _ = writeln!(s, "## 2. Dataplane\n");
    if let Some(t) = &run.traffic {
        s.push_str(&md_table(&t.throughput, "###"));
        s.push_str(&md_table(&t.rr, "###"));
    }
    s.extend(skipped(Section::Traffic));

    let _ = writeln!(s, "## 3. Port-map scale\n");
    if let Some(sc) = &run.scale {
        s.push_str(&md_table(&sc.table, "###"));
        if let Some(d) = &sc.density {
            s.push_str(&md_table(d, "###"));
        }
    }
    s.extend(skipped(Section::Scale));

    let _ = writeln!(s, "## 4. Bandwidth\n");
    if let Some(b) = &run.bandwidth {
        s.push_str(&md_table(&b.table, "###"));
    }
    s.extend(skipped(Section::Bandwidth));

    let _ = writeln!(s, "## 5. Cleanup\n");
    if let Some(c) = &run.cleanup {
        s.push_str(&cleanup_md(c));
    }
    s.extend(skipped(Section::Cleanup));

    let _ = writeln!(s, "## 6. Masquerade\n");
    if let Some(m) = &run.masquerade {
        s.push_str(&masquerade_md(run, m));
    }
    s.extend(skipped(Section::Masquerade));

    let _ = writeln!(s, "## 7. Metrics\n");
    if let Some(m) = &run.metrics {
        s.push_str(&md_table(&m.table, "###"));
    }
    s.extend(skipped(Section::Metrics));

    let _ = writeln!(s, "## Not measurable yet\n");
    let mut missing: Vec<String> = Vec::new();
    for t in all_tables(run) {
        for r in &t.rows {
            if let Cell::NotImplemented { why } = r.cell(Subject::EbpfCni) {
                let line = format!("ebpf-cni: {why}");
                if !missing.contains(&line) {
                    missing.push(line);
                }
            }
        }
    }
    if missing.is_empty() {
        let _ = writeln!(s, "Every metric has figures for both subjects.\n");
    } else {
        for m in missing {
            let _ = writeln!(s, "- {}", escape(&m));
        }
        let _ = writeln!(
            s,
            "\nThe bench probes each feature at run time, so these rows fill in by themselves \
             once the plugin provides the feature.\n"
        );
    }

    let _ = writeln!(s, "## Method\n");
    for line in [
        "Each plugin is forked with only its network namespace switched to the node's \
         (setns between fork and exec; never `ip netns exec`, which would hide the host's \
         bpffs) and reaped with wait4, which gives exact wall time and the rusage of the \
         plugin and every child it waited for.",
        "Subjects alternate within each repeat (reference, ebpf-cni, veth; pod by pod in \
         the lifecycle section), so the noise of this shared 2-core machine hits all of them; \
         tables give medians with the range over repeats, never a single best run.",
        "The TCP_RR/TCP_CRR clients and echo server run inside the benchmark's binary (built \
         in cargo's dev profile, as `cargo xtask bench` runs it); they cost every subject the \
         same. \
         Bulk throughput uses iperf3.",
        "Nothing here asserts a timing: `cargo xtask bench` fails only when a measurement \
         fails (a plugin error, a broken path).",
        "Re-run: `cargo xtask bench` (full, writes bench/) or `cargo xtask bench --quick` \
         (CI, writes into cargo's target directory); `--only lifecycle,traffic` runs a \
         subset, `--plugin PATH` benchmarks a given binary.",
    ] {
        let _ = writeln!(s, "- {line}");
    }
    s.push('\n');
    let _ = writeln!(s, "Section run times: {}.", {
        let v: Vec<String> = run
            .section_secs
            .iter()
            .map(|(sec, t)| format!("{sec:?} {t:.0} s"))
            .collect();
        v.join(", ")
    });
    s
}

fn masquerade_md(run: &Run, m: &masquerade::Output) -> String {
    let p = &run.params;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Method: both CNI subjects with `ipMasq: true` (the reference chain's ptp, so \
         iptables MASQUERADE and netfilter conntrack, then portmap and bandwidth; ebpf-cni's \
         eBPF source NAT, no iptables, no conntrack), on one masquerading node each, in the \
         same run. The node's uplink veth leads to an external host ({ext}) that has no \
         route to the pod network ({pods}), so a pod's traffic works only if it leaves with \
         the node's address ({node}); a probe checks that the external host sees a TCP \
         connection and a UDP datagram of a pod come from {node} before anything is \
         measured, and a subject that fails it has no figures. Measured from a pod to the \
         external host: single-stream TCP throughput (iperf3) and TCP_CRR (connections per \
         second, each a new connection, one 1-byte exchange, close), subjects alternating \
         within each of {repeats} repeat(s), medians with their range; then, on a fresh node \
         per subject, how many of {flows} UDP flows opened at once from one pod the node's \
         flow table holds, and how many new flows it dropped (ebpf-cni: its masquerade \
         table; the reference: the node's conntrack table, nf_conntrack_max at its \
         default).\n",
        ext = crate::rig::topo::EXT_IP,
        pods = crate::rig::topo::POD_SUBNET_V4,
        node = crate::rig::topo::NODE_UPLINK_IP,
        repeats = p.repeats,
        flows = thousands(p.masq_flows),
    );
    let _ = writeln!(s, "Probe (what the external host saw):\n");
    for subj in Subject::CNI {
        let text = match m.probe.get(&subj) {
            Some(Ok(seen)) => seen.clone(),
            Some(Err(e)) => format!("**failed**: {e}"),
            None => "not probed".to_owned(),
        };
        let _ = writeln!(s, "- {}: {}", subj.label(), escape(&text));
    }
    s.push('\n');
    s.push_str(&md_table(&m.traffic, "###"));
    s.push_str(&md_table(&m.flows, "###"));
    s
}

fn cleanup_md(c: &cleanup::Output) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "### Leftovers after each DEL scenario\n");
    let _ = writeln!(
        s,
        "_Cells: the DELs' outcomes, then what the node has that it did not have before the \
         scenario's ADD ({})._\n",
        cleanup::CATEGORIES.join(", ")
    );
    let _ = writeln!(s, "| scenario | reference chain | ebpf-cni |");
    let _ = writeln!(s, "|---|---|---|");
    let mut details = Vec::new();
    for sc in Scenario::ALL {
        let mut line = format!("| {} |", escape(sc.label()));
        for subj in Subject::CNI {
            let text = match c.outcomes.get(&sc).and_then(|m| m.get(&subj)) {
                None => "not run".to_owned(),
                Some(o) => match &o.error {
                    Some(e) => format!("**failed**: {}", escape(e)),
                    None => {
                        let dels = o.dels.join(", then ");
                        let left = if o.leftovers.is_empty() {
                            "nothing left".to_owned()
                        } else {
                            let parts: Vec<String> = o
                                .leftovers
                                .iter()
                                .map(|(cat, items)| format!("{} {cat}", items.len()))
                                .collect();
                            for (cat, items) in &o.leftovers {
                                for item in items.iter().take(6) {
                                    details.push(format!(
                                        "{} / {} / {cat}: `{}`",
                                        subj.label(),
                                        sc.label(),
                                        item.replace('`', "'")
                                    ));
                                }
                                if items.len() > 6 {
                                    details.push(format!(
                                        "{} / {} / {cat}: … and {} more",
                                        subj.label(),
                                        sc.label(),
                                        items.len() - 6
                                    ));
                                }
                            }
                            format!("**left: {}**", parts.join(", "))
                        };
                        format!("DEL {}; {left}", escape(&dels))
                    }
                },
            };
            let _ = write!(line, " {text} |");
        }
        let _ = writeln!(s, "{line}");
    }
    s.push('\n');
    if !details.is_empty() {
        let _ = writeln!(s, "What was left:\n");
        for d in details {
            let _ = writeln!(s, "- {}", escape(&d));
        }
        s.push('\n');
    }
    s
}

fn all_tables(run: &Run) -> Vec<&Table> {
    let mut v = Vec::new();
    if let Some(l) = &run.lifecycle {
        v.extend([&l.latency, &l.dual_stack, &l.cost, &l.concurrency]);
    }
    if let Some(t) = &run.traffic {
        v.extend([&t.throughput, &t.rr]);
    }
    if let Some(s) = &run.scale {
        v.push(&s.table);
        v.extend(s.density.as_ref());
    }
    if let Some(b) = &run.bandwidth {
        v.push(&b.table);
    }
    if let Some(m) = &run.masquerade {
        v.extend([&m.traffic, &m.flows]);
    }
    if let Some(m) = &run.metrics {
        v.push(&m.table);
    }
    v
}

/// Measurements that failed (not "not implemented"). With `of_reference`, only the
/// reference chain's (which are its behaviour, reported but not fatal); otherwise every
/// other failure, which makes the run exit non-zero.
pub fn failures(run: &Run, of_reference: bool) -> Vec<String> {
    let mut out = Vec::new();
    let wanted = |s: &Subject| (*s == Subject::Reference) == of_reference;
    for t in all_tables(run) {
        for r in &t.rows {
            for (s, c) in r.cells.iter().filter(|(s, _)| wanted(s)) {
                if let Cell::Failed { error } = c {
                    let line =
                        format!("{} / {} / {}: {error}", t.title, r.metric.name(), s.label());
                    out.push(line);
                }
            }
        }
    }
    if let Some(c) = &run.cleanup {
        for (sc, per) in &c.outcomes {
            for (s, o) in per.iter().filter(|(s, _)| wanted(s)) {
                if let Some(e) = &o.error {
                    out.push(format!("cleanup / {} / {}: {e}", sc.label(), s.label()));
                }
            }
        }
    }
    if !of_reference {
        for (sec, why) in &run.skipped {
            if why.starts_with("failed") {
                out.push(format!("section {sec:?}: {why}"));
            }
        }
    }
    out
}

pub fn results_json(run: &Run) -> Value {
    let tables: Vec<&Table> = all_tables(run);
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
        "failures": failures(run, false),
        "reference_failures": failures(run, true),
    })
}
