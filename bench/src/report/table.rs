//! Tables as text: a cell as "median [min–max]" or a short word saying why there is no
//! figure, ratios with their direction, the markdown table with the reasons below it and
//! the plain-text table for the terminal.

use std::fmt::Write as _;

use crate::format::short_num;
use crate::metric::Better;
use crate::model::{Cell, Row, Subject, Summary, Table};

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

pub fn cell_reason(c: &Cell) -> Option<String> {
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

pub fn escape(s: &str) -> String {
    s.replace('|', "\\|")
}

/// A markdown table with the reasons for missing figures below it.
pub fn md_table(t: &Table, heading: &str) -> String {
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
pub fn text_table(t: &Table) -> String {
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
