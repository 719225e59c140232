//! One run: the selected sections one after another, each caught when it panics (the
//! report then says why it has no figures), with their run times. What they produced is
//! the [`Run`] the report reads.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::log::progress;
use crate::model::{first_line, Cell, Subject, Table};
use crate::params::{Params, Section};
use crate::rig::machine::Machine;
use crate::rig::topo::Binaries;
use crate::sections::{
    bandwidth, cleanup, cluster, guest, lifecycle, masquerade, metrics, netkit, node, pod_path,
    scale, services, source_check, traffic, xdp,
};

/// Everything a run produced; the report, the charts and results.json read it.
pub struct Run {
    pub params: Params,
    pub machine: Machine,
    pub command: String,
    pub lifecycle: Option<lifecycle::Output>,
    pub traffic: Option<traffic::Output>,
    pub scale: Option<scale::Output>,
    pub bandwidth: Option<bandwidth::Output>,
    pub cleanup: Option<cleanup::Output>,
    pub masquerade: Option<masquerade::Output>,
    pub metrics: Option<metrics::Output>,
    pub source_check: Option<source_check::Output>,
    pub pod_path: Option<pod_path::Output>,
    pub node: Option<node::Output>,
    pub xdp: Option<xdp::Output>,
    pub netkit: Option<netkit::Output>,
    pub services: Option<services::Output>,
    pub cluster: Option<cluster::Output>,
    /// Sections that were not selected, or that panicked (with the message).
    pub skipped: Vec<(Section, String)>,
    pub section_secs: Vec<(Section, f64)>,
    pub total: Duration,
}

/// What to run and on what.
pub struct Plan<'a> {
    pub params: &'a Params,
    pub plugin: &'a Path,
    /// The kernel floor's binary (see `bench/floor`), if built.
    pub floor: Option<&'a Path>,
    /// Sections to run; empty: all.
    pub only: &'a [Section],
    /// The kernel of the guest the bandwidth section runs in; `None`: on this machine.
    pub bandwidth_kernel: Option<&'a str>,
    /// Whether a section may boot a guest (`--no-guests`: not).
    pub guests: bool,
}

impl Run {
    /// Runs the plan's sections in [`Section::ALL`]'s order.
    /// Runs the plan's sections in [`Section::ALL`]'s order; `started` is when the whole
    /// task started (the report's run time counts the setup too).
    pub fn sections(plan: &Plan, machine: Machine, command: String, started: Instant) -> Run {
        let params = plan.params;
        let bins = Binaries {
            ebpf_cni: plan.plugin.to_path_buf(),
            floor: plan.floor.map(Path::to_path_buf),
        };
        let mut run = Run {
            machine,
            params: params.clone(),
            command,
            lifecycle: None,
            traffic: None,
            scale: None,
            bandwidth: None,
            cleanup: None,
            masquerade: None,
            metrics: None,
            source_check: None,
            pod_path: None,
            node: None,
            xdp: None,
            netkit: None,
            services: None,
            cluster: None,
            skipped: Vec::new(),
            section_secs: Vec::new(),
            total: Duration::ZERO,
        };
        for section in Section::ALL {
            if !plan.only.is_empty() && !plan.only.contains(&section) {
                run.skipped.push((section, "not selected (--only)".into()));
                continue;
            }
            if section == Section::Netkit && !plan.guests && !crate::rig::netkit::available() {
                run.skipped
                    .push((section, "needs a guest (--no-guests)".into()));
                continue;
            }
            let t = Instant::now();
            progress(&format!("section {section:?}"));
            let outcome = catch_unwind(AssertUnwindSafe(|| match section {
                Section::Lifecycle => run.lifecycle = Some(lifecycle::run(params, &bins)),
                Section::Traffic => run.traffic = Some(traffic::run(params, &bins)),
                Section::Scale => run.scale = Some(scale::run(params, &bins)),
                Section::Bandwidth => {
                    run.bandwidth = Some(match plan.bandwidth_kernel {
                        None => bandwidth::run(params, &bins),
                        Some(series) => guest::bandwidth(series, params, plan.plugin)
                            .unwrap_or_else(|e| panic!("bandwidth in a guest: {e:#}")),
                    })
                }
                Section::Cleanup => run.cleanup = Some(cleanup::run(&bins)),
                Section::Masquerade => run.masquerade = Some(masquerade::run(params, &bins)),
                Section::Metrics => run.metrics = Some(metrics::run(params, &bins)),
                Section::SourceCheck => run.source_check = Some(source_check::run(params, &bins)),
                Section::Node => run.node = Some(node::run(params, &bins)),
                Section::PodPath => run.pod_path = Some(pod_path::run(params, &bins)),
                Section::Xdp => run.xdp = Some(xdp::run(params, &bins)),
                Section::Services => run.services = Some(services::run(params, &bins)),
                Section::Cluster => run.cluster = Some(cluster::run(params, &bins)),
                Section::Netkit => {
                    run.netkit = Some(if crate::rig::netkit::available() {
                        netkit::measure(params, &bins)
                    } else {
                        guest::netkit(netkit::GUEST_KERNEL, params, plan.plugin)
                            .unwrap_or_else(|e| panic!("netkit in a guest: {e:#}"))
                    })
                }
            }));
            if let Err(panic) = outcome {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "unknown panic".into());
                progress(&format!("section {section:?} panicked: {msg}"));
                run.skipped
                    .push((section, format!("failed: {}", first_line(&msg))));
            }
            let secs = t.elapsed().as_secs_f64();
            progress(&format!("section {section:?} took {secs:.0} s"));
            run.section_secs.push((section, secs));
        }
        run.total = started.elapsed();
        run
    }
}

impl Run {
    /// Every table the sections produced, in the report's order.
    pub fn tables(&self) -> Vec<&Table> {
        let run = self;
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
        if let Some(s) = &run.source_check {
            v.push(&s.table);
        }
        if let Some(n) = &run.node {
            v.push(&n.table);
        }
        if let Some(pp) = &run.pod_path {
            v.push(&pp.table);
        }
        if let Some(x) = &run.xdp {
            v.push(&x.table);
        }
        if let Some(n) = &run.netkit {
            v.extend([&n.table, &n.ext]);
        }
        if let Some(s) = &run.services {
            v.push(&s.table);
        }
        if let Some(c) = &run.cluster {
            v.extend([&c.table, &c.etcd, &c.traffic]);
        }
        v
    }

    /// Measurements that failed (not "not implemented"). With `of_reference`, only the
    /// reference chain's (which are its behaviour, reported but not fatal); otherwise every
    /// other failure, which makes the run exit non-zero.
    pub fn failures(&self, of_reference: bool) -> Vec<String> {
        let run = self;
        let mut out = Vec::new();
        let wanted = |s: &Subject| (*s == Subject::Reference) == of_reference;
        for t in run.tables() {
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
}
