//! The benchmark's targets: each goal with ebpf-cni's and the reference chain's figure and
//! whether the goal is met.

use crate::format::{short_num, thousands};
use crate::metric::{
    Better, CrossPath, Metric, PathFigure, PathKind, PathPart, PodLink, METRICS_TARGET_MS,
    METRICS_TARGET_PODS,
};
use crate::model::{Cell, Row, Subject, Table};
use crate::run::Run;
use crate::sections::scale::Point;

use super::headline::cleanup_row;
use super::table::cell_reason;

/// One goal, with each subject's figure and whether ebpf-cni meets it.
pub struct Target {
    pub goal: &'static str,
    pub ebpf: String,
    pub reference: String,
    pub status: String,
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

pub fn targets(run: &Run) -> Vec<Target> {
    let mut out = Vec::new();
    let lat = run.lifecycle.as_ref().map(|l| &l.latency);
    for (goal, metric, limit, when_set) in [
        (
            "ADD p50 ≤ 10 ms",
            Metric::AddP50,
            10.0,
            "≈ 65 ms when the goal was set",
        ),
        (
            "DEL p50 ≤ 10 ms",
            Metric::DelP50,
            10.0,
            "≈ 180 ms when the goal was set",
        ),
        (
            "CHECK p50 ≤ 5 ms",
            Metric::CheckP50,
            5.0,
            "≈ 27 ms when the goal was set",
        ),
    ] {
        let e = median_of(lat, &metric, Subject::EbpfCni);
        let r = median_of(lat, &metric, Subject::Reference);
        out.push(Target {
            goal,
            ebpf: e
                .as_ref()
                .map_or_else(|w| w.clone(), |v| format!("{} ms", short_num(*v))),
            reference: format!(
                "{} ({when_set})",
                r.as_ref()
                    .map_or_else(|w| w.clone(), |v| format!("{} ms", short_num(*v)))
            ),
            status: match e {
                Ok(v) => status(v <= limit),
                Err(_) => not_yet(),
            },
        });
    }

    let floor = median_of(lat, &Metric::AddOverFloor, Subject::EbpfCni);
    out.push(Target {
        goal: "ADD p50 ≤ 1.3× its kernel floor (the same kernel work alone, measured alternately)",
        ebpf: floor.as_ref().map_or_else(
            |w| w.clone(),
            |v| {
                let of = median_of(lat, &Metric::FloorAdd, Subject::EbpfCni)
                    .map(|f| format!(" (floor {} ms)", short_num(f)))
                    .unwrap_or_default();
                format!("{v:.2}×{of}")
            },
        ),
        reference: "—".into(),
        status: match floor {
            Ok(v) => status(v <= 1.3),
            Err(_) => not_yet(),
        },
    });
    let cost = run.lifecycle.as_ref().map(|l| &l.cost);
    let e = median_of(cost, &Metric::AddPeakRss, Subject::EbpfCni);
    let r = median_of(cost, &Metric::AddPeakRss, Subject::Reference);
    out.push(Target {
        goal: "peak RSS of one ADD ≤ the reference chain's",
        ebpf: e
            .as_ref()
            .map_or_else(|w| w.clone(), |v| format!("{} MiB", short_num(*v))),
        reference: r
            .as_ref()
            .map_or_else(|w| w.clone(), |v| format!("{} MiB", short_num(*v))),
        status: match (&e, &r) {
            (Ok(e), Ok(r)) => status(e <= r),
            (Err(_), _) | (_, Err(_)) => not_yet(),
        },
    });

    let tput = run.traffic.as_ref().map(|t| &t.throughput);
    let pct = |s| median_of(tput, &Metric::PodToPodOfVeth, s);
    out.push(Target {
        goal: "pod → pod throughput ≥ 93% of a plain veth pair",
        ebpf: pct(Subject::EbpfCni).map_or_else(|w| w, |v| format!("{v:.0}%")),
        reference: format!(
            "{} (≈ 80% when the goal was set)",
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

    // Pod → pod at the plain veth pair's floor (the dataplane section's medians,
    // the three columns alternating in every repeat).
    let crr = Metric::Crr(PathKind::PodToPod);
    let of_veth = |m: &Metric, s| -> Result<f64, String> {
        Ok(median_of(rr, m, s)? / median_of(rr, m, Subject::Veth)?)
    };
    // Beside it, the routing floor at TC (the pod-path section's `ecni_floor_pod` state: the
    // least any TC program routing pod → pod pays), per repeat over the veth pair.
    let path = run.pod_path.as_ref().map(|p| &p.table);
    let floor = |figure, scale: f64| {
        median_of(
            path,
            &Metric::PodPath {
                figure,
                part: PathPart::Floor,
            },
            Subject::EbpfCni,
        )
        .map(|v| v / scale)
    };
    // And the same floor over netkit (the netkit section, in a guest where this machine's
    // kernel lacks it), beside the TC floor measured with it.
    let nk = run.netkit.as_ref().map(|n| &n.table);
    let over = |figure, link, scale: f64| {
        median_of(nk, &Metric::Netkit { figure, link }, Subject::EbpfCni).map(|v| v / scale)
    };
    let netkit = |figure, scale| match (
        over(figure, PodLink::Netkit, scale),
        over(figure, PodLink::TcFloor, scale),
    ) {
        (Ok(n), Ok(t)) => format!("; the same floor over netkit: {n:.3}×, at TC there {t:.3}×"),
        _ => String::new(),
    };
    for (goal, metric, limit, higher, floor, netkit) in [
        (
            "TCP_CRR pod → pod ≥ 0.95 of a plain veth pair's",
            &crr,
            0.95,
            true,
            floor(PathFigure::CrrOfVeth, 100.0),
            netkit(PathFigure::CrrOfVeth, 100.0),
        ),
        (
            "TCP_RR p50 pod → pod ≤ 1.03× a plain veth pair's",
            &rr_p50,
            1.03,
            false,
            floor(PathFigure::RrOfVeth, 1.0),
            netkit(PathFigure::RrOfVeth, 1.0),
        ),
    ] {
        let e = of_veth(metric, Subject::EbpfCni);
        let r = of_veth(metric, Subject::Reference);
        let show = |v: &Result<f64, String>| {
            v.as_ref()
                .map_or_else(|w| w.clone(), |v| format!("{v:.3}× veth"))
        };
        let at_floor = floor.map_or_else(
            |_| String::new(),
            |v| format!(" (the routing floor at TC: {v:.3}×{netkit})"),
        );
        out.push(Target {
            goal,
            ebpf: format!("{}{at_floor}", show(&e)),
            reference: show(&r),
            status: match e {
                Ok(v) => status(if higher { v >= limit } else { v <= limit }),
                Err(_) => not_yet(),
            },
        });
    }

    // Masquerade at the routed path's cost (the masquerade section).
    let masq = run.masquerade.as_ref().map(|m| &m.traffic);
    let extra = |bulk| median_of(masq, &Metric::MasqExtraNs { bulk }, Subject::EbpfCni);
    let (bulk, crr) = (extra(true), extra(false));
    out.push(Target {
        goal: "masquerade's extra `ecni_from_pod` run time per packet over the untranslated \
               path ≤ 0.3 µs (bulk TCP stream, an established flow / TCP_CRR, every \
               connection a new flow)",
        ebpf: [&bulk, &crr]
            .iter()
            .map(|v| {
                v.as_ref()
                    .map_or_else(|w| w.clone(), |v| format!("{} ns", short_num(*v)))
            })
            .collect::<Vec<_>>()
            .join(" / "),
        reference: "—".into(),
        status: match (&bulk, &crr) {
            (Ok(b), Ok(c)) => status(*b <= 300.0 && *c <= 300.0),
            _ => not_yet(),
        },
    });
    let share = |s| median_of(masq, &Metric::MasqCrrShare, s).map(|v| v / 100.0);
    let (e, r) = (share(Subject::EbpfCni), share(Subject::Reference));
    let show =
        |v: &Result<f64, String>| v.as_ref().map_or_else(|w| w.clone(), |v| format!("{v:.3}"));
    out.push(Target {
        goal: "TCP_CRR pod → external host, masqueraded, ≥ 0.97 of the same path untranslated",
        ebpf: show(&e),
        reference: show(&r),
        status: match e {
            Ok(v) => status(v >= 0.97),
            Err(_) => not_yet(),
        },
    });
    let gbit = |v: &Result<f64, String>| {
        v.as_ref()
            .map_or_else(|w| w.clone(), |v| format!("{} Gbit/s", short_num(*v)))
    };
    for (goal, metric) in [
        (
            "TCP throughput pod → external host, masqueraded, ≥ 1.0× the reference chain's",
            Metric::MasqThroughput,
        ),
        (
            "TCP throughput pod → external host, not translated, ≥ 1.0× the reference chain's \
             (the kernel's own forwarding)",
            Metric::MasqThroughputRouted,
        ),
    ] {
        let e = median_of(masq, &metric, Subject::EbpfCni);
        let r = median_of(masq, &metric, Subject::Reference);
        out.push(Target {
            goal,
            ebpf: match (&e, &r) {
                (Ok(a), Ok(b)) => format!("{} ({:.2}×)", gbit(&e), a / b),
                _ => gbit(&e),
            },
            reference: gbit(&r),
            status: match (&e, &r) {
                (Ok(e), Ok(r)) => status(e >= r),
                (Err(_), _) | (_, Err(_)) => not_yet(),
            },
        });
    }
    let first = median_of(lat, &Metric::FirstAdd, Subject::EbpfCni);
    out.push(Target {
        goal: "first ADD of a node (the programs' load) < 0.25 s",
        ebpf: first
            .as_ref()
            .map_or_else(|w| w.clone(), |v| format!("{} ms", short_num(*v))),
        reference: median_of(lat, &Metric::FirstAdd, Subject::Reference)
            .map_or_else(|w| w, |v| format!("{} ms", short_num(v))),
        status: match first {
            Ok(v) => status(v < 250.0),
            Err(_) => not_yet(),
        },
    });

    for (goal, pick, unit) in [
        (
            "connect latency through a hostPort flat (±20%) from K = 0 to 10,000 (the worse of \
             the first and the newest pod's hostPort)",
            (|p: &Point| p.connect_us.median.max(p.connect_newest_us.median)) as fn(&_) -> f64,
            "µs",
        ),
        (
            "one more ADD flat (±20%) from K = 0 to 10,000, as a multiple of the same ADD on \
             the subject's K = 0 control node at the same time",
            |p: &Point| p.add_ms.median / p.control_add_ms.median,
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

    let in_line = run.node.as_ref().map(|n| {
        n.table
            .row(&Metric::StatusInLine { pods: n.pods })
            .map(|r| r.cell(Subject::EbpfCni))
            .unwrap_or(Cell::NotApplicable)
    });
    out.push(Target {
        goal: "STATUS on an unchanged node of 100 pods: p50 ≤ 5 ms (it converges the node)",
        ebpf: match &in_line {
            Some(Cell::Value(v)) => format!("{} ms (median)", short_num(v.median)),
            Some(c) => brief(&cell_reason(c).unwrap_or_else(|| "no figure".into())),
            None => "section not run".into(),
        },
        reference: "— (nothing to converge)".into(),
        status: match &in_line {
            Some(Cell::Value(v)) => status(v.median <= 5.0),
            _ => not_yet(),
        },
    });

    let cluster = |metric: fn(usize) -> Metric| {
        run.cluster.as_ref().map(|c| {
            c.table
                .row(&metric(c.nodes))
                .map(|r| r.cell(Subject::EbpfCni))
                .unwrap_or(Cell::NotApplicable)
        })
    };
    let first_reply = cluster(|_| Metric::ClusterFirstReply);
    out.push(Target {
        goal: "a peer's Node created → first reply between pods on the two nodes: p50 ≤ 1 s",
        ebpf: match &first_reply {
            Some(Cell::Value(v)) => format!("{} ms (median)", short_num(v.median)),
            Some(c) => brief(&cell_reason(c).unwrap_or_else(|| "no figure".into())),
            None => "section not run".into(),
        },
        reference: "— (no membership)".into(),
        status: match &first_reply {
            Some(Cell::Value(v)) => status(v.median <= 1_000.0),
            _ => not_yet(),
        },
    });
    let rss = cluster(|nodes| Metric::ClusterAgentRss { nodes });
    let nodes = run.cluster.as_ref().map_or(0, |c| c.nodes);
    out.push(Target {
        goal: "the agent watching 1,000 Nodes within the DaemonSet's memory limit (128 MiB)",
        ebpf: match &rss {
            Some(Cell::Value(v)) => {
                format!("{} MiB, {} Nodes", short_num(v.median), thousands(nodes))
            }
            Some(c) => brief(&cell_reason(c).unwrap_or_else(|| "no figure".into())),
            None => "section not run".into(),
        },
        reference: "— (no membership)".into(),
        status: match &rss {
            Some(Cell::Value(v)) if nodes >= 1_000 => status(v.median < 128.0),
            Some(Cell::Value(_)) => format!(
                "not measurable in this run ({} Nodes only)",
                thousands(nodes)
            ),
            _ => not_yet(),
        },
    });

    if let Some(c) = &run.cluster {
        let ms = |t: &Table, m: Metric| match t.row(&m).map(|r| r.cell(Subject::EbpfCni)) {
            Some(Cell::Value(v)) => Ok(v.median),
            Some(c) => Err(brief(
                &cell_reason(&c).unwrap_or_else(|| "no figure".into()),
            )),
            None => Err("no figure".to_owned()),
        };
        for (goal, got, bound, needs_all) in [
            (
                "etcd: a node's subnet record written → first reply between pods on the two nodes: p50 ≤ 1 s",
                ms(&c.etcd, Metric::EtcdFirstReply),
                1_000.0,
                false,
            ),
            (
                "etcd: 1,000 nodes' subnets routed ≤ 1 s after the agent's start",
                ms(&c.etcd, Metric::EtcdAllRouted { nodes: c.nodes }),
                1_000.0,
                true,
            ),
            (
                "Kubernetes: 1,000 Nodes' subnets routed ≤ 1 s after the agent's start",
                ms(&c.table, Metric::ClusterAllRouted { nodes: c.nodes }),
                1_000.0,
                true,
            ),
        ] {
            out.push(Target {
                goal,
                ebpf: match &got {
                    Ok(v) => format!("{} ms (median), {} nodes", short_num(*v), thousands(c.nodes)),
                    Err(why) => why.clone(),
                },
                reference: "— (no membership)".into(),
                status: match got {
                    Ok(_) if needs_all && c.nodes < 1_000 => format!(
                        "not measurable in this run ({} nodes only)",
                        thousands(c.nodes)
                    ),
                    Ok(v) => status(v <= bound),
                    Err(_) => not_yet(),
                },
            });
        }
        // Each figure as a factor where above 1 is better: ebpf-cni's over the reference's.
        let mut worst: Option<(f64, String)> = None;
        let mut missing = Vec::new();
        for row in &c.traffic.rows {
            let Metric::CrossNode { figure, path } = &row.metric else {
                continue;
            };
            if matches!(path, CrossPath::OverlayNodes { .. }) {
                continue;
            }
            let (Ok(e), Ok(r)) = (
                median_of(Some(&c.traffic), &row.metric, Subject::EbpfCni),
                median_of(Some(&c.traffic), &row.metric, Subject::Reference),
            ) else {
                missing.push(row.metric.name());
                continue;
            };
            let factor = if row.metric.better() == Better::Higher {
                e / r
            } else {
                r / e
            };
            let what = format!("{}, {}", figure.label(), path.label());
            if worst.as_ref().is_none_or(|(w, _)| factor < *w) {
                worst = Some((factor, what));
            }
        }
        out.push(Target {
            goal: "pod → pod across nodes: ebpf-cni direct ≥ 1.0× host-gw routes, overlay ≥ 1.0× flannel's VXLAN device, on every figure",
            ebpf: match (&worst, missing.is_empty()) {
                (Some((w, what)), true) => format!("worst {w:.2}× ({what})"),
                (_, _) => format!("no figure: {}", missing.join("; ")),
            },
            reference: "host-gw routes, flannel's VXLAN device (by hand)".into(),
            status: match (&worst, missing.is_empty()) {
                (Some((w, _)), true) => status(*w >= 1.0),
                _ => not_yet(),
            },
        });
    }

    if let Some(c) = &run.cleanup {
        let row = cleanup_row(c);
        let v = |s| match row.cell(s) {
            Cell::Value(v) => Ok(v.median),
            c => Err(cell_reason(&c).unwrap_or_default()),
        };
        out.push(Target {
            goal: "nothing left behind after any DEL scenario",
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
