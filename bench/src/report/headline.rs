//! The headline: the figures that matter most, each row named as it stands alone, as the
//! report opens with and the terminal shows at the end.

use crate::metric::{Metric, PathKind, ScaleFigure};
use crate::model::{Cell, Row, Subject, Summary, Table};
use crate::run::Run;
use crate::sections::cleanup;

use super::table::text_table;

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
        pick(l.map(|l| &l.latency), Metric::AddOverFloor),
        pick(l.map(|l| &l.latency), Metric::CheckP50),
        pick(l.map(|l| &l.latency), Metric::DelP50),
        pick(l.map(|l| &l.latency), Metric::DelOverFloor),
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

pub fn cleanup_row(c: &cleanup::Output) -> Row {
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
