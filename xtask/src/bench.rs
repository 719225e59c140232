//! `cargo xtask bench`: ebpf-cni against the reference chain (Debian's ptp + host-local +
//! portmap + bandwidth) and a plain veth pair, in one run with identical inputs, driven as
//! a runtime drives CNI plugins, from inside test-made node namespaces.
//!
//! Sections: lifecycle (ADD/CHECK/DEL latency, cost of one ADD, concurrency), traffic
//! (throughput, TCP_RR, TCP_CRR), port-map scale, bandwidth accuracy, cleanup and
//! masquerade (pod → a host without a route back: throughput, TCP_CRR, flows held) and
//! metrics (`ebpf-cni metrics` on a node of 1,000 pods). Subjects
//! alternate within every repeat so the noise of this shared machine hits all of them, and
//! every figure is a median with its range. A feature a subject lacks is found by a probe
//! and reported as "not implemented" instead of a number, so the bench grows with the
//! plugin without edits. Writes `REPORT.md`, `results.json` and SVG charts to the output
//! directory and prints the headline table.
//!
//! Timing figures are never asserted: the run fails (after writing the report) only when a
//! measurement itself failed.

mod bandwidth;
mod charts;
mod cleanup;
mod exec;
mod guest;
mod lifecycle;
mod load;
mod machine;
mod masquerade;
mod metrics;
mod model;
mod report;
mod scale;
mod stats;
mod topo;
mod traffic;

use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use serde::Serialize;

use crate::{build, cmd, setup};

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// A short run (< 3 minutes) that CI uses so the benchmark cannot rot; its figures are
    /// indicative only.
    #[arg(long)]
    pub quick: bool,
    /// Where to write REPORT.md, results.json and the charts [default: bench/ at the
    /// workspace root; with --quick: bench-quick/ in cargo's target directory, so a CI run
    /// never overwrites the committed report].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Benchmark this ebpf-cni binary instead of building one.
    #[arg(long, value_name = "PATH")]
    pub plugin: Option<PathBuf>,
    /// Run only these sections (comma-separated); the others are reported as not run.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Section>,
    /// Where the bandwidth section runs: `host`, or a guest booting Debian's kernel 5.10,
    /// 6.1 or 6.12 [default: 6.12 when this machine's kernel has no sch_fq, else host].
    #[arg(long, value_name = "KERNEL")]
    pub bandwidth_kernel: Option<String>,
    /// Inside such a guest: run the bandwidth section alone and write its output here.
    #[arg(long, hide = true, value_name = "FILE")]
    pub guest_output: Option<PathBuf>,
}

impl BenchArgs {
    /// What `cargo xtask test` runs: the quick benchmark of an already built plugin, into
    /// the default quick output directory.
    pub fn quick_for_ci(plugin: &std::path::Path) -> Self {
        Self {
            quick: true,
            out: None,
            plugin: Some(plugin.to_path_buf()),
            only: Vec::new(),
            bandwidth_kernel: None,
            guest_output: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Section {
    Lifecycle,
    Traffic,
    Scale,
    Bandwidth,
    Cleanup,
    Masquerade,
    Metrics,
}

impl Section {
    const ALL: [Section; 7] = [
        Section::Lifecycle,
        Section::Traffic,
        Section::Scale,
        Section::Bandwidth,
        Section::Cleanup,
        Section::Masquerade,
        Section::Metrics,
    ];
}

/// Everything that sizes a run; printed in the report.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    pub quick: bool,
    /// Repeats of the lifecycle, traffic and masquerade sections.
    pub repeats: usize,
    /// Sequential, coexisting pods per subject and repeat.
    pub pods: usize,
    /// Dual-stack pods per subject and repeat.
    pub dual_pods: usize,
    pub concurrent: usize,
    pub iperf_secs: u32,
    pub iperf_omit: u32,
    pub rr_secs: f64,
    pub scale_ks: Vec<usize>,
    /// Mappings per background pod of the main scale series.
    pub scale_ports_per_pod: usize,
    /// Mappings of the "one more" pod added and deleted at each K.
    pub scale_extra_ports: usize,
    /// The pod-density series: its K steps (none: not run) and mappings per pod.
    pub density_ks: Vec<usize>,
    pub density_ports_per_pod: usize,
    pub scale_connects: usize,
    pub scale_extra_adds: usize,
    /// Install time each subject may spend on the scale section's background pods.
    pub scale_budget: Duration,
    pub bw_rates: Vec<u64>,
    pub bw_secs: u32,
    pub bw_repeats: usize,
    /// UDP flows one pod opens at once in the masquerade section.
    pub masq_flows: usize,
    /// TCP_CRR connections per slice in the masquerade section (the quick run stays below
    /// the 4,536 ports of the default range, so CI never depends on port reuse timing).
    pub masq_crr_max: usize,
    /// Pods on the node `ebpf-cni metrics` reads, and its timed runs.
    pub metrics_pods: usize,
    pub metrics_runs: usize,
}

impl Params {
    pub fn full() -> Self {
        Self {
            quick: false,
            repeats: 3,
            pods: 60,
            dual_pods: 10,
            concurrent: 32,
            iperf_secs: 5,
            iperf_omit: 1,
            rr_secs: 2.0,
            scale_ks: vec![0, 250, 1_000, 2_500, 5_000, 10_000],
            scale_ports_per_pod: 100,
            scale_extra_ports: 4,
            density_ks: vec![0, 2_500, 10_000],
            density_ports_per_pod: 4,
            scale_connects: 300,
            scale_extra_adds: 7,
            scale_budget: Duration::from_secs(240),
            bw_rates: vec![10_000_000, 100_000_000, 1_000_000_000],
            bw_secs: 5,
            bw_repeats: 2,
            masq_flows: 100_000,
            masq_crr_max: usize::MAX,
            metrics_pods: 1_000,
            metrics_runs: 10,
        }
    }

    pub fn quick() -> Self {
        Self {
            quick: true,
            repeats: 1,
            pods: 20,
            dual_pods: 4,
            concurrent: 32,
            iperf_secs: 2,
            iperf_omit: 1,
            rr_secs: 0.5,
            scale_ks: vec![0, 100],
            scale_ports_per_pod: 25,
            scale_extra_ports: 4,
            density_ks: Vec::new(),
            density_ports_per_pod: 4,
            scale_connects: 100,
            scale_extra_adds: 1,
            scale_budget: Duration::from_secs(30),
            bw_rates: vec![100_000_000],
            bw_secs: 2,
            bw_repeats: 1,
            masq_flows: 2_000,
            masq_crr_max: 500,
            metrics_pods: 100,
            metrics_runs: 5,
        }
    }
}

/// One progress line on stderr, with the time since the bench started.
pub(crate) fn progress(msg: &str) {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let t = START.get_or_init(Instant::now).elapsed().as_secs_f64();
    eprintln!("[bench {t:6.1}s] {msg}");
}

/// Everything a run produced; the report, the charts and results.json read it.
pub struct Run {
    pub params: Params,
    pub machine: machine::Machine,
    pub command: String,
    pub lifecycle: Option<lifecycle::Output>,
    pub traffic: Option<traffic::Output>,
    pub scale: Option<scale::Output>,
    pub bandwidth: Option<bandwidth::Output>,
    pub cleanup: Option<cleanup::Output>,
    pub masquerade: Option<masquerade::Output>,
    pub metrics: Option<metrics::Output>,
    /// Sections that were not selected, or that panicked (with the message).
    pub skipped: Vec<(Section, String)>,
    pub section_secs: Vec<(Section, f64)>,
    pub total: Duration,
}

pub fn bench(args: &BenchArgs) -> Result<()> {
    let started = Instant::now();
    progress("starting");
    cmd::require_root("cargo xtask bench")?;
    let params = if args.quick {
        Params::quick()
    } else {
        Params::full()
    };
    if let Some(file) = &args.guest_output {
        let plugin = args
            .plugin
            .as_deref()
            .context("--guest-output needs --plugin")?;
        return guest::serve(&params, plugin, file);
    }
    let bandwidth_kernel = match args.bandwidth_kernel.as_deref() {
        Some("host") => None,
        Some(k) => Some(k.to_owned()),
        None => (!guest::host_has_fq()).then(|| "6.12".to_owned()),
    };
    setup::setup()?;
    let plugin = match &args.plugin {
        Some(p) => p
            .canonicalize()
            .with_context(|| format!("--plugin {}", p.display()))?,
        None => build::stage("bench-plugin")?,
    };
    for tool in ["ptp", "host-local", "portmap", "bandwidth"] {
        let p = Path::new(ebpf_cni_tests::REFERENCE_PLUGIN_DIR).join(tool);
        if !p.is_file() {
            bail!("the reference plugin {} is missing", p.display());
        }
    }
    ebpf_cni_tests::bpf::ensure_bpffs()?;
    let out_dir = match &args.out {
        Some(d) => d.clone(),
        None if args.quick => build::target_dir()?.join("bench-quick"),
        None => build::workspace_root().join("bench"),
    };
    fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;

    let bins = topo::Binaries {
        ebpf_cni: plugin.clone(),
    };
    let mut command = String::from("cargo xtask bench");
    if args.quick {
        command.push_str(" --quick");
    }
    if !args.only.is_empty() {
        let names: Vec<String> = args
            .only
            .iter()
            .map(|s| format!("{s:?}").to_lowercase())
            .collect();
        command.push_str(&format!(" --only {}", names.join(",")));
    }
    let mut run = Run {
        machine: machine::collect(&plugin),
        params: params.clone(),
        command,
        lifecycle: None,
        traffic: None,
        scale: None,
        bandwidth: None,
        cleanup: None,
        masquerade: None,
        metrics: None,
        skipped: Vec::new(),
        section_secs: Vec::new(),
        total: Duration::ZERO,
    };
    progress(&format!(
        "{} run, plugin {}, report to {}",
        if args.quick { "quick" } else { "full" },
        plugin.display(),
        out_dir.display()
    ));

    for section in Section::ALL {
        if !args.only.is_empty() && !args.only.contains(&section) {
            run.skipped.push((section, "not selected (--only)".into()));
            continue;
        }
        let t = Instant::now();
        progress(&format!("section {section:?}"));
        let outcome = catch_unwind(AssertUnwindSafe(|| match section {
            Section::Lifecycle => run.lifecycle = Some(lifecycle::run(&params, &bins)),
            Section::Traffic => run.traffic = Some(traffic::run(&params, &bins)),
            Section::Scale => run.scale = Some(scale::run(&params, &bins)),
            Section::Bandwidth => {
                run.bandwidth = Some(match &bandwidth_kernel {
                    None => bandwidth::run(&params, &bins),
                    Some(series) => guest::bandwidth(series, &params, &plugin)
                        .unwrap_or_else(|e| panic!("bandwidth in a guest: {e:#}")),
                })
            }
            Section::Cleanup => run.cleanup = Some(cleanup::run(&bins)),
            Section::Masquerade => run.masquerade = Some(masquerade::run(&params, &bins)),
            Section::Metrics => run.metrics = Some(metrics::run(&params, &bins)),
        }));
        if let Err(panic) = outcome {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "unknown panic".into());
            progress(&format!("section {section:?} panicked: {msg}"));
            run.skipped
                .push((section, format!("failed: {}", model::first_line(&msg))));
        }
        let secs = t.elapsed().as_secs_f64();
        progress(&format!("section {section:?} took {secs:.0} s"));
        run.section_secs.push((section, secs));
    }
    run.total = started.elapsed();

    let charts = report::charts(&run, &out_dir);
    let text = report::markdown(&run, &charts);
    let report_path = out_dir.join("REPORT.md");
    fs::write(&report_path, text).with_context(|| format!("writing {}", report_path.display()))?;
    let json = serde_json::to_string_pretty(&report::results_json(&run))?;
    fs::write(out_dir.join("results.json"), json + "\n")?;

    println!("{}", report::headline_text(&run));
    println!(
        "report: {} ({} charts), took {:.0} s",
        report_path.display(),
        charts.len(),
        run.total.as_secs_f64()
    );
    for f in report::failures(&run, true) {
        println!("note: the reference chain failed (its own behaviour, see the report): {f}");
    }
    let failures = report::failures(&run, false);
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
