//! The result model every section fills and the report, the charts and `results.json` read:
//! the subjects, per-repeat summaries, and table rows holding one cell per subject for one
//! [`Metric`]. A cell is a measured value or says plainly why there is none (not
//! implemented, not applicable, failed), so a missing figure can never pass for a measured
//! one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::metric::{Better, Metric};

/// What is measured. Declaration order is the report's column order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Subject {
    /// Debian's ptp + host-local + portmap + bandwidth.
    Reference,
    EbpfCni,
    /// Two namespaces joined by a plain veth pair with static addresses: the physical limit.
    Veth,
}

impl Subject {
    /// The two CNI subjects, in the order they alternate within a repeat.
    pub const CNI: [Subject; 2] = [Subject::Reference, Subject::EbpfCni];
    pub const ALL: [Subject; 3] = [Subject::Reference, Subject::EbpfCni, Subject::Veth];

    pub fn label(self) -> &'static str {
        match self {
            Subject::Reference => "reference chain",
            Subject::EbpfCni => "ebpf-cni",
            Subject::Veth => "plain veth",
        }
    }

    pub fn short(self) -> &'static str {
        match self {
            Subject::Reference => "reference",
            Subject::EbpfCni => "ebpf-cni",
            Subject::Veth => "veth",
        }
    }
}

/// Median and range of one figure over the repeats (or over samples, where the row says so).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    /// Median and range of the finite `values`; `None` when there is nothing to summarize.
    pub fn of(values: &[f64]) -> Option<Summary> {
        let v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        Some(Summary {
            n: v.len(),
            median: crate::stats::median(&v),
            min: v.iter().copied().fold(f64::INFINITY, f64::min),
            max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Cell {
    Value(Summary),
    /// The subject does not provide the feature (yet); `why` says which probe.
    NotImplemented {
        why: String,
    },
    NotApplicable,
    /// Measuring failed: the bench reports it and exits non-zero at the end.
    Failed {
        error: String,
    },
    /// The section was not selected (`--only`) or stopped before this figure.
    NotRun {
        why: String,
    },
}

impl Cell {
    pub fn value(&self) -> Option<&Summary> {
        match self {
            Cell::Value(s) => Some(s),
            _ => None,
        }
    }

    pub fn not_run(why: &str) -> Self {
        Cell::NotRun {
            why: why.to_owned(),
        }
    }

    pub fn not_implemented(why: &str) -> Self {
        Cell::NotImplemented {
            why: why.to_owned(),
        }
    }

    pub fn failed(error: impl std::fmt::Display) -> Self {
        Cell::Failed {
            error: first_line(&format!("{error:#}")),
        }
    }
}

/// One line of a table: a figure and each subject's cell. In JSON (results.json, and the
/// bandwidth section's output from a guest) it carries the metric's name, unit and better
/// direction as text, and the typed metric as `id`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(into = "RowJson", from = "RowJson")]
pub struct Row {
    pub metric: Metric,
    pub cells: BTreeMap<Subject, Cell>,
}

#[derive(Serialize, Deserialize)]
struct RowJson {
    metric: String,
    unit: String,
    better: Better,
    cells: BTreeMap<Subject, Cell>,
    id: Metric,
}

impl From<Row> for RowJson {
    fn from(r: Row) -> Self {
        Self {
            metric: r.metric.name(),
            unit: r.metric.unit().to_owned(),
            better: r.metric.better(),
            cells: r.cells,
            id: r.metric,
        }
    }
}

impl From<RowJson> for Row {
    fn from(r: RowJson) -> Self {
        Self {
            metric: r.id,
            cells: r.cells,
        }
    }
}

impl Row {
    pub fn new(metric: Metric) -> Self {
        Self {
            metric,
            cells: BTreeMap::new(),
        }
    }

    pub fn unit(&self) -> &'static str {
        self.metric.unit()
    }

    /// The same row as the headline names it.
    pub fn headline(&self) -> Row {
        Row {
            metric: self.metric.clone().headline(),
            cells: self.cells.clone(),
        }
    }

    pub fn with(mut self, subject: Subject, cell: Cell) -> Self {
        self.cells.insert(subject, cell);
        self
    }

    pub fn cell(&self, subject: Subject) -> Cell {
        self.cells
            .get(&subject)
            .cloned()
            .unwrap_or(Cell::NotApplicable)
    }

    /// ebpf-cni's median over the reference chain's, when both were measured.
    pub fn ratio(&self) -> Option<f64> {
        let e = self.cells.get(&Subject::EbpfCni)?.value()?;
        let r = self.cells.get(&Subject::Reference)?.value()?;
        (r.median != 0.0).then(|| e.median / r.median)
    }
}

/// A titled table with notes that explain how its figures were taken.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Table {
    pub title: String,
    /// What one cell is, e.g. "median [min–max] over 3 repeats".
    pub cell_meaning: String,
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
}

impl Table {
    pub fn new(title: &str, cell_meaning: impl Into<String>) -> Self {
        Self {
            title: title.to_owned(),
            cell_meaning: cell_meaning.into(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    pub fn row(&self, metric: &Metric) -> Option<&Row> {
        self.rows.iter().find(|r| &r.metric == metric)
    }
}

/// Per-subject values of one figure collected over the repeats, or why a subject has none.
#[derive(Debug, Clone, Default)]
pub struct Repeats {
    values: BTreeMap<Subject, Vec<f64>>,
    instead: BTreeMap<Subject, Cell>,
}

impl Repeats {
    pub fn push(&mut self, subject: Subject, v: f64) {
        if v.is_finite() {
            self.values.entry(subject).or_default().push(v);
        }
    }

    /// Records why `subject` has no value; the first reason given wins.
    pub fn set_instead(&mut self, subject: Subject, cell: Cell) {
        self.instead.entry(subject).or_insert(cell);
    }

    pub fn values(&self, subject: Subject) -> &[f64] {
        self.values.get(&subject).map(Vec::as_slice).unwrap_or(&[])
    }

    /// A failure beats values (a figure from the repeats that worked would hide it); then
    /// values; then the recorded reason; else "not applicable".
    pub fn cell(&self, subject: Subject) -> Cell {
        match self.instead.get(&subject) {
            Some(c @ Cell::Failed { .. }) => c.clone(),
            other => match Summary::of(self.values(subject)) {
                Some(s) => Cell::Value(s),
                None => other.cloned().unwrap_or(Cell::NotApplicable),
            },
        }
    }

    pub fn row(&self, metric: Metric) -> Row {
        let mut row = Row::new(metric);
        for s in Subject::ALL {
            if self.values.contains_key(&s) || self.instead.contains_key(&s) {
                row.cells.insert(s, self.cell(s));
            }
        }
        row
    }
}

pub fn first_line(s: &str) -> String {
    let line = s.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let mut line = line.trim().to_owned();
    if line.len() > 160 {
        let mut cut = 157;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
        line.push('…');
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_has_range() {
        let s = Summary::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.n, s.median, s.min, s.max), (3, 2.0, 1.0, 3.0));
        assert!(Summary::of(&[f64::NAN]).is_none());
    }

    /// A row's JSON keeps the text fields readers of results.json match on, and comes back
    /// as the same typed row (the bandwidth section's output crosses from a guest this way).
    #[test]
    fn row_json_has_the_names_and_round_trips() {
        let metric = crate::metric::Metric::Accuracy {
            rate: 100_000_000,
            dir: crate::metric::Dir::Egress,
            udp: false,
        };
        let row = Row::new(metric.clone()).with(Subject::EbpfCni, Cell::not_run("x"));
        let v = serde_json::to_value(&row).unwrap();
        assert_eq!(v["metric"], "100 Mbit/s egress limit, TCP");
        assert_eq!(v["unit"], "% of limit");
        assert_eq!(v["better"], "neither");
        let back: Row = serde_json::from_value(v).unwrap();
        assert_eq!(back.metric, metric);
        assert!(matches!(back.cell(Subject::EbpfCni), Cell::NotRun { .. }));
    }
}
