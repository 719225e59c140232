//! Port-map scale: K hostPort mappings installed on one node, spread over pods, and what
//! that does to a connection through one more hostPort, to one more ADD and DEL, and how
//! long installing the K mappings took.
//!
//! Two series. The main one spreads K over pods of `scale_ports_per_pod` mappings each (100:
//! K = 10,000 on 100 pods, a node within kubelet's default of 110 pods), so it measures what
//! the mappings cost. The pod-density series puts a few mappings on each pod (K = 10,000 on
//! 2,500 pods): there the number of pods grows with K, and with it the kernel's per-device
//! work in every ADD (veth, address and route lists), which no port-mapping design removes.
//!
//! Subjects advance together through the K steps (install up to K on the reference, then on
//! ebpf-cni, measure both, next K). The reference's cost per ADD grows with every rule
//! already installed, so its install time grows quadratically: before each step the section
//! predicts the step's install time from the last ADD times and stops a subject whose
//! prediction exceeds its time budget, saying so in the report.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

use crate::format::thousands;
use crate::log::progress;
use crate::metric::{Metric, ScaleFigure};
use crate::model::{first_line, Cell, Row, Subject, Summary, Table};
use crate::params::Params;
use crate::rig::load::{self, EchoServer};
use crate::rig::topo::{self, BenchNode, Binaries, Pod};
use crate::stats::{median, percentile};

const TARGET_HOST_PORT: u16 = 40_000;
const TARGET_PORT: u16 = 7000;
const FIRST_BACKGROUND_HOST_PORT: u16 = 41_000;
const FIRST_EXTRA_HOST_PORT: u16 = 39_000;
/// The container port of a background pod's first mapping (the next ones follow).
const BACKGROUND_PORT: u16 = 8000;

/// One measured K.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Point {
    /// The step: K background mappings asked for.
    pub k: usize,
    /// Mappings actually installed (K rounded up to whole pods).
    pub mappings: usize,
    pub pods: usize,
    /// Through the hostPort of the pod added before all background pods.
    pub connect_us: Summary,
    /// Through the first hostPort of the background pod added last.
    pub connect_newest_us: Summary,
    pub add_ms: Summary,
    /// The same ADD on the subject's control node (only the first pod, no background
    /// mappings), interleaved with `add_ms`: what "no mappings" costs at the same moment
    /// on this shared machine.
    pub control_add_ms: Summary,
    pub del_ms: Summary,
    /// Sum of the ADD times of the background pods that hold the K mappings.
    pub install_s: f64,
}

impl Point {
    /// One figure of this K, as a row's cell shows it.
    pub fn figure(&self, figure: ScaleFigure) -> Summary {
        match figure {
            ScaleFigure::ConnectFirst => self.connect_us,
            ScaleFigure::ConnectNewest => self.connect_newest_us,
            ScaleFigure::OneMoreAdd => self.add_ms,
            ScaleFigure::ControlAdd => self.control_add_ms,
            ScaleFigure::OneMoreDel => self.del_ms,
            ScaleFigure::Install => Summary {
                n: 1,
                median: self.install_s,
                min: self.install_s,
                max: self.install_s,
            },
        }
    }
}

pub struct Output {
    pub table: Table,
    pub curves: BTreeMap<Subject, Vec<Point>>,
    /// The pod-density series (few mappings per pod), when it ran.
    pub density: Option<Table>,
    pub density_curves: BTreeMap<Subject, Vec<Point>>,
}

struct Run {
    /// Mappings per background pod in this series.
    per_pod: usize,
    node: BenchNode,
    _echo: EchoServer,
    _target: Pod,
    /// A second node of the same subject that keeps the K = 0 state (see `control_add_ms`).
    control: BenchNode,
    _control_target: Pod,
    background: Vec<Pod>,
    points: Vec<Point>,
    install: Duration,
    /// Mean time to create one pod namespace (outside the ADD, but part of the wait).
    netns_cost: Duration,
    stopped: Option<String>,
}

impl Run {
    fn start(subject: Subject, bins: &Binaries, per_pod: usize) -> Result<Self> {
        let node = BenchNode::new(subject, bins)?;
        let (target, _) = node.add_pod(
            "scale-target",
            topo::caps(&[(TARGET_HOST_PORT, TARGET_PORT)], None),
        )?;
        let echo = EchoServer::start(&target.netns, TARGET_PORT)?;
        load::probe_echo(
            node.ext(),
            SocketAddr::from((topo::NODE_UPLINK_IP, TARGET_HOST_PORT)),
        )
        .context("hostPort probe")?;
        let control = BenchNode::new(subject, bins)?;
        let (control_target, _) = control.add_pod(
            "scale-control",
            topo::caps(&[(TARGET_HOST_PORT, TARGET_PORT)], None),
        )?;
        Ok(Self {
            per_pod,
            node,
            _echo: echo,
            _target: target,
            control,
            _control_target: control_target,
            background: Vec::new(),
            points: Vec::new(),
            install: Duration::ZERO,
            netns_cost: Duration::from_millis(10),
            stopped: None,
        })
    }

    fn k(&self) -> usize {
        self.background.len() * self.per_pod
    }

    /// Predicted seconds to add pods up to `k`, from the ADD times measured so far, assuming
    /// the per-ADD time keeps growing as it did between the last two points.
    fn predict_install(&self, k: usize) -> f64 {
        let pods_needed = k
            .div_ceil(self.per_pod)
            .saturating_sub(self.background.len()) as f64;
        let Some(last) = self.points.last() else {
            return 0.0;
        };
        let slope = match self.points.len() {
            n if n >= 2 => {
                let prev = &self.points[n - 2];
                ((last.add_ms.median - prev.add_ms.median) / (last.k - prev.k).max(1) as f64)
                    .max(0.0)
            }
            _ => 0.0,
        };
        let mid_add_ms = last.add_ms.median + slope * (k - last.k) as f64 / 2.0;
        pods_needed * (mid_add_ms / 1e3 + self.netns_cost.as_secs_f64())
    }

    fn install_to(&mut self, k: usize) -> Result<()> {
        let per_pod = self.per_pod;
        let mut netns_time = Duration::ZERO;
        let mut created = 0u32;
        while self.k() < k {
            let j = self.background.len();
            let first = FIRST_BACKGROUND_HOST_PORT as usize + j * per_pod;
            let maps: Vec<(u16, u16)> = (0..per_pod)
                .map(|m| ((first + m) as u16, BACKGROUND_PORT + m as u16))
                .collect();
            let t = Instant::now();
            let mut pod = self
                .node
                .new_pod(&format!("bg-{j}"), topo::caps(&maps, None))?;
            netns_time += t.elapsed();
            created += 1;
            let cost = self
                .node
                .add(&mut pod)
                .with_context(|| format!("ADD of background pod {j}"))?;
            self.install += cost.wall;
            self.background.push(pod);
        }
        if created > 0 {
            self.netns_cost = netns_time / created;
        }
        Ok(())
    }

    /// Connect latency through `host_port` of the node's uplink address.
    fn connect(&self, host_port: u16, count: usize) -> Result<Summary> {
        let target = SocketAddr::from((topo::NODE_UPLINK_IP, host_port));
        let crr = load::tcp_crr(self.node.ext(), target, Duration::from_secs(10), count)?;
        let c = &crr.connect_us;
        Ok(Summary {
            n: c.len(),
            median: median(c),
            min: percentile(c, 10.0),
            max: percentile(c, 90.0),
        })
    }

    fn measure(&mut self, p: &Params, k: usize) -> Result<Point> {
        let connect_us = self.connect(TARGET_HOST_PORT, p.scale_connects)?;
        // The newest pod's first mapping too: rule-based NAT may cost more for the rules
        // added last (or first); a hash lookup should not care.
        let connect_newest_us = match self.background.last() {
            None => connect_us,
            Some(pod) => {
                let j = self.background.len() - 1;
                let host_port = (FIRST_BACKGROUND_HOST_PORT as usize + j * self.per_pod) as u16;
                let _server = EchoServer::start(&pod.netns, BACKGROUND_PORT)?;
                self.connect(host_port, p.scale_connects)?
            }
        };
        let mut adds = Vec::new();
        let mut control_adds = Vec::new();
        let mut dels = Vec::new();
        crate::rig::machine::settle(Duration::from_secs(10));
        for e in 0..p.scale_extra_adds {
            let first = FIRST_EXTRA_HOST_PORT as usize + e * p.scale_extra_ports;
            let maps: Vec<(u16, u16)> = (0..p.scale_extra_ports)
                .map(|m| ((first + m) as u16, 80 + m as u16))
                .collect();
            // The control node first, then the node under test, the same pod on each.
            let mut pod = self
                .control
                .new_pod(&format!("control-{e}"), topo::caps(&maps, None))?;
            let add = self
                .control
                .add(&mut pod)
                .context("ADD on the control node")?;
            self.control.del(&pod).context("its DEL")?;
            control_adds.push(add.wall.as_secs_f64() * 1e3);
            drop(pod);
            let mut pod = self
                .node
                .new_pod(&format!("extra-{e}"), topo::caps(&maps, None))?;
            let add = self.node.add(&mut pod).context("one more ADD")?;
            let del = self.node.del(&pod).context("its DEL")?;
            adds.push(add.wall.as_secs_f64() * 1e3);
            dels.push(del.wall.as_secs_f64() * 1e3);
        }
        Ok(Point {
            k,
            mappings: self.k(),
            pods: self.background.len(),
            connect_us,
            connect_newest_us,
            add_ms: Summary::of(&adds).expect("at least one extra ADD"),
            control_add_ms: Summary::of(&control_adds).expect("at least one control ADD"),
            del_ms: Summary::of(&dels).expect("at least one extra DEL"),
            install_s: self.install.as_secs_f64(),
        })
    }
}

pub fn run(p: &Params, bins: &Binaries) -> Output {
    let (table, curves) = series(
        p,
        bins,
        p.scale_ports_per_pod,
        &p.scale_ks,
        "Port-map scale",
    );
    let top = p.density_ks.iter().copied().max().unwrap_or(0);
    let density = (!p.density_ks.is_empty()).then(|| {
        progress(&format!(
            "scale: pod-density series, {} mappings per pod",
            p.density_ports_per_pod
        ));
        let (mut t, c) = series(
            p,
            bins,
            p.density_ports_per_pod,
            &p.density_ks,
            "Port-map scale, pod density",
        );
        t.notes.insert(
            0,
            format!(
                "The same measurement with {} mappings per pod, so K = {} takes {} pods: \
                 the pod count grows with K, and each ADD pays the kernel's per-device work \
                 (new veth, addresses and routes among thousands) on top of what the mappings \
                 cost.",
                p.density_ports_per_pod,
                thousands(top),
                thousands(top.div_ceil(p.density_ports_per_pod))
            ),
        );
        (t, c)
    });
    let (density, density_curves) = match density {
        Some((t, c)) => (Some(t), c),
        None => (None, BTreeMap::new()),
    };
    Output {
        table,
        curves,
        density,
        density_curves,
    }
}

fn series(
    p: &Params,
    bins: &Binaries,
    per_pod: usize,
    ks: &[usize],
    title: &str,
) -> (Table, BTreeMap<Subject, Vec<Point>>) {
    let mut runs: BTreeMap<Subject, Run> = BTreeMap::new();
    let mut instead: BTreeMap<Subject, Cell> = BTreeMap::new();
    for s in Subject::CNI {
        match Run::start(s, bins, per_pod) {
            Ok(r) => {
                runs.insert(s, r);
            }
            Err(e) if format!("{e:#}").contains("hostPort probe") => {
                instead.insert(
                    s,
                    Cell::not_implemented(&format!(
                        "hostPort not provided; probe from the external client: {}",
                        first_line(&e.root_cause().to_string())
                    )),
                );
            }
            Err(e) => {
                progress(&format!("scale: setting up {} failed: {e:#}", s.label()));
                instead.insert(s, Cell::failed(&e));
            }
        }
    }

    let budget = p.scale_budget.as_secs_f64();
    for &k in ks {
        for (s, run) in runs.iter_mut() {
            if run.stopped.is_some() {
                continue;
            }
            let predicted = run.predict_install(k);
            let spent = run.install.as_secs_f64();
            if spent + predicted > budget {
                run.stopped = Some(format!(
                    "capped at K = {}: reaching K = {k} would take ≈ {:.0} s more of ADDs \
                     (predicted from the measured ADD times), over the {:.0} s budget",
                    run.k(),
                    predicted,
                    budget
                ));
                progress(&format!(
                    "scale: {}: {}",
                    s.label(),
                    run.stopped.as_ref().unwrap()
                ));
                continue;
            }
            progress(&format!(
                "scale: {}: installing up to K = {k} ({} pods, ≈ {predicted:.0} s predicted)",
                s.label(),
                k.div_ceil(per_pod)
            ));
            let step = run.install_to(k).and_then(|_| run.measure(p, k));
            match step {
                Ok(point) => {
                    progress(&format!(
                        "scale: {} K = {}: connect p50 {:.0} µs (newest pod {:.0} µs), one \
                         more ADD {:.1} ms (control node {:.1} ms), DEL {:.1} ms, install so far \
                         {:.1} s",
                        s.label(),
                        point.mappings,
                        point.connect_us.median,
                        point.connect_newest_us.median,
                        point.add_ms.median,
                        point.control_add_ms.median,
                        point.del_ms.median,
                        point.install_s
                    ));
                    run.points.push(point);
                }
                Err(e) => {
                    progress(&format!("scale: {} failed at K = {k}: {e:#}", s.label()));
                    run.stopped = Some(format!(
                        "failed at K = {k}: {}",
                        first_line(&format!("{e:#}"))
                    ));
                    instead.insert(*s, Cell::failed(&e));
                }
            }
        }
    }

    let mut table = Table::new(
        title,
        format!(
            "connect: median [p10–p90] of up to {} connections; one more ADD/DEL: median \
             [min–max] of {} run(s); install: total ADD time of the background pods",
            p.scale_connects, p.scale_extra_adds
        ),
    );
    let mut curves = BTreeMap::new();
    for figure in ScaleFigure::ALL {
        for &k in ks {
            let mut row = Row::new(Metric::Scale { figure, k });
            for s in Subject::CNI {
                let cell = match runs.get(&s) {
                    Some(run) => match run.points.iter().find(|pt| pt.k == k) {
                        Some(pt) => Cell::Value(pt.figure(figure)),
                        None => match (&run.stopped, instead.get(&s)) {
                            (_, Some(c)) => c.clone(),
                            (Some(why), None) => Cell::not_run(why),
                            (None, None) => Cell::not_run("not reached"),
                        },
                    },
                    None => instead
                        .get(&s)
                        .cloned()
                        .unwrap_or_else(|| Cell::not_run("not run")),
                };
                row.cells.insert(s, cell);
            }
            table.rows.push(row);
        }
    }
    table.notes.push(format!(
        "K background mappings on {} ports per pod (K / {} pods, rounded up), plus hostPort \
         {} on a pod added before them (\"first pod\"). \"Newest pod\": the first hostPort of \
         the background pod added last. Connections come from the external client through \
         the node's uplink address; the connect() time is measured. \"One more\" pod has \
         {} mappings and is deleted again after each run.",
        per_pod, per_pod, TARGET_HOST_PORT, p.scale_extra_ports
    ));
    table.notes.push(
        "Each subject also runs a control node that keeps the K = 0 state (the first pod \
         only); the \"one more\" ADDs alternate between it and the node under test, so \
         the control row shows what an ADD costs without mappings at that moment. This \
         machine's ADD latency drifts with what ran before (a K = 0 node measured 2.6 ms \
         at the start of one run and 3.7 ms after a series): compare each K with the \
         control of the same K."
            .to_owned(),
    );
    table.notes.push(
        "Client and echo server share one CPU (as for TCP_RR), so the figure follows that \
         CPU's idle state: on this shared VM the same path at K = 0 measured between ≈ 15 and \
         ≈ 27 µs from one run to the next. Compare subjects at the same K, and the first and \
         the newest pod within one K."
            .to_owned(),
    );
    table.notes.push(format!(
        "Each subject may spend {:.0} s installing background pods; a step predicted to \
         exceed that is not run.",
        budget
    ));
    for (s, run) in &runs {
        curves.insert(*s, run.points.clone());
    }
    (table, curves)
}
