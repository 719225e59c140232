//! SVG charts with plotters: latency distributions (ADD/CHECK/DEL), throughput and
//! request/response bars, the port-map scale curves and bandwidth accuracy. Text is left to
//! the SVG viewer's sans-serif font (plotters is built without its font stack).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// (title, file name) of each chart written.
pub type Charts = Vec<(String, String)>;

use crate::format::short_num;
use crate::metric::Metric;
use crate::model::{Cell, Row, Subject, Table};
use crate::sections::lifecycle::Samples;
use crate::sections::scale::Point;

const FONT: &str = "sans-serif";

fn color(s: Subject) -> RGBColor {
    match s {
        Subject::Reference => RGBColor(214, 96, 77),
        Subject::EbpfCni => RGBColor(33, 113, 181),
        Subject::Veth => RGBColor(130, 130, 130),
    }
}

fn err(e: impl std::fmt::Debug) -> anyhow::Error {
    anyhow!("drawing a chart: {e:?}")
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// ECDF of ADD, CHECK and DEL latency per subject, log-scaled x.
pub fn latency(dir: &Path, s: &Samples) -> Result<PathBuf> {
    let path = dir.join("lifecycle-latency.svg");
    let root = SVGBackend::new(&path, (1500, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root
        .titled(
            "ADD, CHECK and DEL latency: share of operations at or below x (log scale)",
            (FONT, 24),
        )
        .map_err(err)?;
    let panels = root.split_evenly((1, 3));
    for (panel, (name, data)) in panels.iter().zip([
        ("ADD", &s.add_ms),
        ("CHECK", &s.check_ms),
        ("DEL", &s.del_ms),
    ]) {
        ecdf_panel(panel, name, data)?;
    }
    root.present().map_err(err)?;
    Ok(path.clone())
}

fn ecdf_panel(area: &Area, name: &str, data: &BTreeMap<Subject, Vec<f64>>) -> Result<()> {
    let all: Vec<f64> = data
        .values()
        .flatten()
        .copied()
        .filter(|v| *v > 0.0)
        .collect();
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = all.iter().copied().fold(0.0, f64::max);
    let (lo, hi) = if all.is_empty() {
        (1.0, 100.0)
    } else {
        (lo * 0.8, hi * 1.25)
    };
    // Ticks at round 1-2-3-5 values: plotters' own choice on a log axis labels too few
    // points to read the faster subject's values.
    let mut chart = ChartBuilder::on(area)
        .caption(name, (FONT, 20))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d(
            (lo..hi).log_scale().with_key_points(round_ticks(lo, hi)),
            0f64..1.0,
        )
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("latency (ms, log scale)")
        .y_desc("share of operations")
        .x_label_formatter(&|v| axis_num(*v))
        .label_style((FONT, 14))
        .draw()
        .map_err(err)?;
    for s in Subject::CNI {
        let c = color(s);
        let Some(v) = data.get(&s).filter(|v| !v.is_empty()) else {
            chart
                .draw_series(std::iter::empty::<PathElement<(f64, f64)>>())
                .map_err(err)?
                .label(format!("{} (no data: failed, see the report)", s.label()))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
            continue;
        };
        let mut sorted = v.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len() as f64;
        let mut pts = Vec::with_capacity(sorted.len() * 2);
        for (i, x) in sorted.iter().enumerate() {
            pts.push((*x, i as f64 / n));
            pts.push((*x, (i + 1) as f64 / n));
        }
        let p50 = crate::stats::median(&sorted);
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(3)))
            .map_err(err)?
            .label(format!(
                "{} (p50 {} ms, n={})",
                s.label(),
                short_num(p50),
                v.len()
            ))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// One group of bars: a label and each subject's cell.
struct Group {
    label: String,
    cells: Vec<(Subject, Cell)>,
}

fn groups(rows: &[&Row], label: impl Fn(&Row) -> String, subjects: &[Subject]) -> Vec<Group> {
    rows.iter()
        .map(|r| Group {
            label: label(r),
            cells: subjects.iter().map(|s| (*s, r.cell(*s))).collect(),
        })
        .collect()
}

/// Grouped bars with min–max whiskers and the median printed on each bar. `band` shades a
/// horizontal range (e.g. the ±5% accuracy goal).
fn bar_panel(
    area: &Area,
    title: &str,
    unit: &str,
    groups: &[Group],
    subjects: &[Subject],
    band: Option<(f64, f64)>,
) -> Result<()> {
    let values = || {
        groups
            .iter()
            .flat_map(|g| g.cells.iter())
            .filter_map(|(_, c)| c.value().copied())
    };
    // With a band (an accuracy goal) the figures are dots on an axis zoomed around the
    // band: bars from zero would hide a 3% miss.
    let dots = band.is_some();
    let (ymin, ymax) = match band {
        Some((lo, hi)) => {
            let lo = values().map(|v| v.min).fold(lo, f64::min);
            let hi = values().map(|v| v.max).fold(hi, f64::max);
            let pad = (hi - lo) * 0.15;
            ((lo - pad).max(0.0), hi + (hi - lo) * 0.6)
        }
        None => (
            0.0,
            values().map(|v| v.max).fold(0.0, f64::max).max(1e-9) * 1.4,
        ),
    };
    let n = groups.len().max(1) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(65)
        .build_cartesian_2d(-0.5f64..n - 0.5, ymin..ymax)
        .map_err(err)?;
    let span = ymax - ymin;
    let labels: Vec<String> = groups.iter().map(|g| g.label.clone()).collect();
    let formatter = |x: &f64| {
        let i = x.round();
        if (x - i).abs() > 1e-6 || i < 0.0 {
            return String::new();
        }
        labels.get(i as usize).cloned().unwrap_or_default()
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups.len().max(1))
        .x_label_formatter(&formatter)
        .y_desc(unit)
        .y_label_formatter(&|v| axis_num(*v))
        .label_style((FONT, 14))
        .draw()
        .map_err(err)?;
    if let Some((lo, hi)) = band {
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(-0.5, lo), (n - 0.5, hi)],
                RGBColor(120, 190, 120).mix(0.25).filled(),
            )))
            .map_err(err)?;
    }
    let width = 0.8 / subjects.len() as f64;
    for (si, s) in subjects.iter().enumerate() {
        let c = color(*s);
        let mut any = false;
        for (gi, g) in groups.iter().enumerate() {
            let Some(v) = g
                .cells
                .iter()
                .find(|(x, _)| x == s)
                .and_then(|(_, c)| c.value())
            else {
                continue;
            };
            any = true;
            let x0 = gi as f64 - 0.4 + si as f64 * width;
            let x1 = x0 + width * 0.92;
            let xm = (x0 + x1) / 2.0;
            if dots {
                chart
                    .draw_series(std::iter::once(Circle::new((xm, v.median), 6, c.filled())))
                    .map_err(err)?;
            } else {
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(x0, 0.0), (x1, v.median)],
                        c.filled(),
                    )))
                    .map_err(err)?;
            }
            if v.max > v.min {
                let w = width * 0.15;
                chart
                    .draw_series([
                        PathElement::new(vec![(xm, v.min), (xm, v.max)], BLACK.stroke_width(1)),
                        PathElement::new(vec![(xm - w, v.min), (xm + w, v.min)], BLACK),
                        PathElement::new(vec![(xm - w, v.max), (xm + w, v.max)], BLACK),
                    ])
                    .map_err(err)?;
            }
            let style = TextStyle::from((FONT, 13).into_font())
                .color(&BLACK)
                .pos(Pos::new(HPos::Center, VPos::Bottom));
            chart
                .draw_series(std::iter::once(Text::new(
                    if unit.contains('%') {
                        format!("{:.1}", v.median)
                    } else {
                        short_num(v.median)
                    },
                    (xm, v.max.max(v.median) + span * 0.02),
                    style,
                )))
                .map_err(err)?;
        }
        let label = if any {
            s.label().to_owned()
        } else {
            format!("{} (not measured)", s.label())
        };
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// Throughput, TCP_RR p50 and TCP_CRR per path.
pub fn traffic(dir: &Path, throughput: &Table, rr: &Table) -> Result<PathBuf> {
    let path = dir.join("throughput.svg");
    let root = SVGBackend::new(&path, (1650, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root
        .titled(
            "Dataplane: median, whiskers = min–max over repeats",
            (FONT, 24),
        )
        .map_err(err)?;
    let panels = root.split_evenly((1, 3));
    let all = [Subject::Reference, Subject::EbpfCni, Subject::Veth];
    let tput: Vec<&Row> = throughput
        .rows
        .iter()
        .filter(|r| matches!(r.metric, Metric::Throughput(_)))
        .collect();
    let short = |r: &Row| r.metric.short_label();
    bar_panel(
        &panels[0],
        "TCP throughput, one stream",
        "Gbit/s",
        &groups(&tput, short, &all),
        &all,
        None,
    )?;
    let rr_rows: Vec<&Row> = rr
        .rows
        .iter()
        .filter(|r| matches!(r.metric, Metric::RrP50(_)))
        .collect();
    bar_panel(
        &panels[1],
        "TCP_RR latency p50 (lower is better)",
        "µs",
        &groups(&rr_rows, short, &all),
        &all,
        None,
    )?;
    let crr_rows: Vec<&Row> = rr
        .rows
        .iter()
        .filter(|r| matches!(r.metric, Metric::Crr(_)))
        .collect();
    bar_panel(
        &panels[2],
        "TCP_CRR connections per second",
        "conn/s",
        &groups(&crr_rows, short, &all),
        &all,
        None,
    )?;
    root.present().map_err(err)?;
    Ok(path.clone())
}

/// Achieved / configured rate per configuration, with the ±5% goal shaded.
pub fn bandwidth(dir: &Path, table: &Table) -> Result<PathBuf> {
    let path = dir.join("bandwidth.svg");
    let rows: Vec<&Row> = table
        .rows
        .iter()
        .filter(|r| matches!(r.metric, Metric::Accuracy { .. }))
        .collect();
    let width = (320 + rows.len() as u32 * 130).max(900);
    let root = SVGBackend::new(&path, (width, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let short = |r: &Row| r.metric.short_label();
    bar_panel(
        &root,
        "Bandwidth limits: achieved rate on the wire as % of the limit (green band: ±5% goal)",
        "% of limit",
        &groups(&rows, short, &Subject::CNI),
        &Subject::CNI,
        Some((95.0, 105.0)),
    )?;
    root.present().map_err(err)?;
    Ok(path.clone())
}

/// K → connect latency and K → one more ADD, per subject.
pub fn scale(
    dir: &Path,
    curves: &BTreeMap<Subject, Vec<Point>>,
    missing: &BTreeMap<Subject, String>,
) -> Result<PathBuf> {
    let path = dir.join("portmap-scale.svg");
    let root = SVGBackend::new(&path, (1400, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root
        .titled(
            "Port-map scale: K hostPort mappings on the node",
            (FONT, 24),
        )
        .map_err(err)?;
    let panels = root.split_evenly((1, 2));
    type Pick = fn(&Point) -> (f64, f64, f64);
    // Per panel: (series suffix, pick, light) — the newest pod's line is drawn lighter.
    let connect: Vec<(&str, Pick, bool)> = vec![
        (
            " — first pod's hostPort",
            |p| (p.connect_us.median, p.connect_us.min, p.connect_us.max),
            false,
        ),
        (
            " — newest pod's hostPort",
            |p| {
                let s = &p.connect_newest_us;
                (s.median, s.min, s.max)
            },
            true,
        ),
    ];
    let add: Vec<(&str, Pick, bool)> =
        vec![("", |p| (p.add_ms.median, p.add_ms.min, p.add_ms.max), false)];
    let panels_spec = [
        (
            "connect latency through a hostPort (p50, whiskers p10–p90)",
            "µs",
            connect,
        ),
        ("one more ADD (median, whiskers min–max)", "ms", add),
    ];
    for (panel, (title, unit, series)) in panels.iter().zip(panels_spec) {
        let kmax = curves
            .values()
            .flatten()
            .map(|p| p.mappings)
            .max()
            .unwrap_or(1)
            .max(1) as f64;
        let ymax = curves
            .values()
            .flatten()
            .flat_map(|p| series.iter().map(move |(_, pick, _)| pick(p).2))
            .fold(0.0, f64::max)
            .max(1e-9)
            * 1.3;
        let mut chart = ChartBuilder::on(panel)
            .caption(title, (FONT, 20))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(65)
            .build_cartesian_2d(0f64..kmax * 1.05, 0f64..ymax)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("K (hostPort mappings installed)")
            .y_desc(unit)
            .x_label_formatter(&|v| crate::format::thousands(v.round().max(0.0) as usize))
            .y_label_formatter(&|v| axis_num(*v))
            .label_style((FONT, 14))
            .draw()
            .map_err(err)?;
        for s in Subject::CNI {
            let base = color(s);
            match curves.get(&s).filter(|v| !v.is_empty()) {
                Some(points) => {
                    for (suffix, pick, light) in &series {
                        let c = if *light {
                            base.mix(0.45)
                        } else {
                            base.mix(1.0)
                        };
                        let line: Vec<(f64, f64)> = points
                            .iter()
                            .map(|p| (p.mappings as f64, pick(p).0))
                            .collect();
                        chart
                            .draw_series(LineSeries::new(line.clone(), c.stroke_width(3)))
                            .map_err(err)?
                            .label(format!("{}{suffix}", s.label()))
                            .legend(move |(x, y)| {
                                PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3))
                            });
                        chart
                            .draw_series(
                                line.iter()
                                    .map(|&(x, y)| Circle::new((x, y), 4, c.filled())),
                            )
                            .map_err(err)?;
                        chart
                            .draw_series(points.iter().map(|p| {
                                let (_, lo, hi) = pick(p);
                                let x = p.mappings as f64;
                                PathElement::new(vec![(x, lo), (x, hi)], c)
                            }))
                            .map_err(err)?;
                    }
                }
                None => {
                    let why = missing
                        .get(&s)
                        .cloned()
                        .unwrap_or_else(|| "not measured".into());
                    chart
                        .draw_series(std::iter::empty::<PathElement<(f64, f64)>>())
                        .map_err(err)?
                        .label(format!("{}: {why}", s.label()))
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], base));
                }
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font((FONT, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(path.clone())
}

/// Every 1, 2, 3 or 5 × 10^k value in [lo, hi] (with ×1.5 and ×7 where the range is
/// narrow): the ticks of a log axis.
fn round_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let pick = |mults: &[f64]| {
        let mut out = Vec::new();
        let mut decade = 10f64.powf(lo.log10().floor());
        while decade <= hi {
            for m in mults {
                let v = m * decade;
                if v >= lo && v <= hi {
                    out.push(v);
                }
            }
            decade *= 10.0;
        }
        out
    };
    let ticks = pick(&[1.0, 2.0, 3.0, 5.0]);
    if ticks.len() >= 3 {
        ticks
    } else {
        pick(&[1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.0])
    }
}

/// An axis label: whole numbers without decimals.
fn axis_num(v: f64) -> String {
    if v >= 0.0 && (v - v.round()).abs() < 1e-9 {
        crate::format::thousands(v.round() as usize)
    } else {
        short_num(v)
    }
}
