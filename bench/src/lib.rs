//! The benchmark (`cargo xtask bench` runs this crate's binary): ebpf-cni against the
//! reference chain (Debian's ptp + host-local + portmap + bandwidth) and a plain veth pair,
//! in one run with identical inputs, driven as a runtime drives CNI plugins, from inside
//! test-made node namespaces.
//!
//! Sections: lifecycle (ADD/CHECK/DEL latency, cost of one ADD, concurrency), traffic
//! (throughput, TCP_RR, TCP_CRR), port-map scale, bandwidth accuracy, cleanup and
//! masquerade (pod → a host without a route back: throughput, TCP_CRR, flows held) and
//! metrics (`ebpf-cni metrics` on a node of 1,000 pods). Subjects
//! alternate within every repeat so the noise of this shared machine hits all of them, and
//! every figure is a median with its range. A feature a subject lacks is found by a probe
//! and reported as "not implemented" instead of a number, so the bench grows with the
//! plugin without edits. Writes `RESULTS.md`, `results.json` and SVG charts to the output
//! directory and prints the headline table.
//!
//! Timing figures are never asserted: the run fails (after writing the report) only when a
//! measurement itself failed.

//! The crate is laid out by what a run does: [`params`] sizes it, [`sections`] measure (on
//! the namespaces, processes and traffic of [`rig`], built on the test harness's nodes), and
//! fill the result model of [`model`] with rows of typed [`metric`]s; [`run`] runs the
//! selected sections and [`report`] writes what they produced.

pub mod format;
pub mod log;
pub mod metric;
pub mod model;
pub mod params;
pub mod report;
pub mod rig;
pub mod run;
pub mod sections;
pub mod stats;
pub mod turns;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context as _, Result};

use crate::log::progress;
use crate::params::{Params, Section};
use crate::run::{Plan, Run};
use crate::sections::guest;

/// The command line of `cargo xtask bench` (which passes its arguments on unchanged).
#[derive(Debug, clap::Parser)]
#[command(
    name = "ebpf-cni-bench",
    bin_name = "cargo xtask bench",
    about = "Build, then benchmark ebpf-cni against the reference plugin chain (needs root)"
)]
pub struct BenchArgs {
    /// A short run (< 3 minutes) that CI uses so the benchmark cannot rot; its figures are
    /// indicative only.
    #[arg(long)]
    pub quick: bool,
    /// Where to write RESULTS.md, results.json and the charts [default: bench/ at the
    /// workspace root for a full run; with --quick: bench-quick/, with --only:
    /// bench-partial/, in cargo's target directory, so only a full run replaces the
    /// committed report]. Never a directory inside bench/.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Benchmark this ebpf-cni binary instead of building one [default: the static release
    /// binary of this machine's architecture, built as `cargo xtask dist` builds it].
    #[arg(long, value_name = "PATH")]
    pub plugin: Option<PathBuf>,
    /// Run only these sections (comma-separated); the others are reported as not run.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Section>,
    /// Repeats of the lifecycle, traffic, masquerade and source check sections, in place of
    /// the run's own (full: 3, quick: 1): more alternating samples on a noisy machine.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub repeats: Option<u16>,
    /// Where the bandwidth section runs: `host`, or a guest booting Debian's kernel 5.10,
    /// 6.1 or 6.12 [default: 6.12 when this machine's kernel has no sch_fq, else host].
    #[arg(long, value_name = "KERNEL")]
    pub bandwidth_kernel: Option<String>,
    /// Boot no guest: the bandwidth section on this machine, the netkit section only
    /// where this machine's kernel has netkit (else it is reported as not run). What
    /// `cargo xtask test` runs: each guest costs CI a minute.
    #[arg(long, conflicts_with = "bandwidth_kernel")]
    pub no_guests: bool,
    /// Inside such a guest: run one section alone and write its output here.
    #[arg(long, hide = true, value_name = "FILE")]
    pub guest_output: Option<PathBuf>,
    /// The section `--guest-output` runs: bandwidth or netkit.
    #[arg(long, hide = true, value_enum, default_value = "bandwidth")]
    pub guest_section: Section,
}

/// Builds the kernel floor's program (`bench/floor`) in release and linked as the released
/// plugin is, statically against musl for this machine's architecture: this crate's own
/// binary is a debug build, and much larger, and a dynamically linked floor would pay the
/// dynamic loader's start (about 0.6 ms here) that neither the kernel work nor the static
/// plugin pays. Returns its path.
fn build_floor() -> Result<PathBuf> {
    let target = xtask::dist::host_arch()?.target;
    let mut c = xtask::cmd::cargo();
    c.current_dir(xtask::build::workspace_root()).args([
        "build",
        "--quiet",
        "--release",
        "--package",
        "ebpf-cni-floor",
        "--target",
        target.triple,
    ]);
    if let Some(cc) = target.cross_cc {
        c.envs(target.cc_env(cc));
    }
    xtask::cmd::run(&mut c)?;
    let path = xtask::build::target_dir()?
        .join(target.triple)
        .join("release/ebpf-cni-floor");
    if !path.is_file() {
        bail!("{} was not built", path.display());
    }
    Ok(path)
}

/// Where a run writes its report. Only a full run of every section replaces the committed
/// `bench/RESULTS.md`; a quick or partial run goes under cargo's target directory. No run
/// writes a directory of its own inside `bench/`: earlier reports live in git history.
fn out_dir(args: &BenchArgs) -> Result<PathBuf> {
    let committed = xtask::build::workspace_root().join("bench");
    let Some(dir) = &args.out else {
        return Ok(if args.quick {
            xtask::build::target_dir()?.join("bench-quick")
        } else if !args.only.is_empty() {
            xtask::build::target_dir()?.join("bench-partial")
        } else {
            committed
        });
    };
    let abs = std::path::absolute(dir).with_context(|| format!("resolving {}", dir.display()))?;
    if abs.starts_with(&committed) && abs != committed {
        bail!(
            "--out {}: a run replaces bench/RESULTS.md and never adds a directory under bench/; \
             write a quick or partial run elsewhere (its default is under target/)",
            dir.display()
        );
    }
    if abs == committed && (args.quick || !args.only.is_empty()) {
        bail!(
            "--out {}: only a full run of every section replaces bench/RESULTS.md",
            dir.display()
        );
    }
    Ok(abs)
}

/// The task's name in messages (root check, the report's command line).
const TASK: &str = "cargo xtask bench";

pub fn bench(args: &BenchArgs) -> Result<()> {
    let started = Instant::now();
    progress("starting");
    let mut params = if args.quick {
        Params::quick()
    } else {
        Params::full()
    };
    if let Some(n) = args.repeats {
        params.repeats = usize::from(n);
    }
    if let Some(file) = &args.guest_output {
        xtask::prepare::require_root(TASK)?;
        let plugin = args
            .plugin
            .as_deref()
            .context("--guest-output needs --plugin")?;
        return guest::serve(args.guest_section, &params, plugin, file);
    }
    let bandwidth_kernel = match args.bandwidth_kernel.as_deref() {
        Some("host") => None,
        Some(k) => Some(k.to_owned()),
        None if args.no_guests => None,
        None => (!guest::host_has_fq()).then(|| "6.12".to_owned()),
    };
    let plugin = xtask::prepare::prepare_release(
        TASK,
        xtask::setup::Scope::Full,
        xtask::bench::STAGE_DIR,
        args.plugin.as_deref(),
    )?;
    for tool in ["ptp", "host-local", "portmap", "bandwidth"] {
        let p = Path::new(ebpf_cni_tests::REFERENCE_PLUGIN_DIR).join(tool);
        if !p.is_file() {
            bail!("the reference plugin {} is missing", p.display());
        }
    }
    ebpf_cni_tests::bpf::ensure_bpffs()?;
    let out_dir = out_dir(args)?;
    fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;

    let mut command = String::from(TASK);
    if args.quick {
        command.push_str(" --quick");
    }
    if args.no_guests {
        command.push_str(" --no-guests");
    }
    if !args.only.is_empty() {
        let names: Vec<String> = args
            .only
            .iter()
            .map(|s| format!("{s:?}").to_lowercase())
            .collect();
        command.push_str(&format!(" --only {}", names.join(",")));
    }
    let floor = match build_floor() {
        Ok(path) => Some(path),
        Err(e) => {
            progress(&format!("the kernel floor is not measured: {e:#}"));
            None
        }
    };
    let machine = rig::machine::collect(&plugin);
    // Every binary the sections run starts from disk, as on a node after a reboot (after
    // the machine's description, which reads the plugin's headers).
    let reference = ["ptp", "host-local", "portmap", "bandwidth"]
        .map(|tool| Path::new(ebpf_cni_tests::REFERENCE_PLUGIN_DIR).join(tool));
    for bin in [Some(plugin.as_path()), floor.as_deref()]
        .into_iter()
        .flatten()
        .chain(reference.iter().map(PathBuf::as_path))
    {
        rig::cache::drop_cached(bin)?;
    }
    // Then laid out as a node leaves ebpf-cni's binary (its install, its boot-time
    // `ebpf-cni layout`), and the floor's alike: in 2 MiB folios.
    for bin in [Some(plugin.as_path()), floor.as_deref()]
        .into_iter()
        .flatten()
    {
        rig::cache::lay_out(&plugin, bin)?;
    }
    progress(&format!(
        "{} run, plugin {}, report to {}",
        if args.quick { "quick" } else { "full" },
        plugin.display(),
        out_dir.display()
    ));
    let plan = Plan {
        params: &params,
        plugin: &plugin,
        floor: floor.as_deref(),
        only: &args.only,
        bandwidth_kernel: bandwidth_kernel.as_deref(),
        guests: !args.no_guests,
    };
    let run = Run::sections(&plan, machine, command, started);
    report::write(&run, &out_dir)
}
