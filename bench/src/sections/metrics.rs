//! `ebpf-cni metrics` on a crowded node (the goal: reading all maps for 1,000 pods takes
//! < 100 ms): one ebpf-cni node with `metrics_pods` pods, each with a host port and every
//! second one with a bandwidth limit, then `ebpf-cni metrics --netns <node>` run
//! `metrics_runs` times. Figures per run: the time the process reports for reading the
//! pinned maps (`ebpf_cni_metrics_read_seconds`), the process's wall time (start to exit,
//! what a textfile-collector job or a scrape waits for) and its CPU time (which the other
//! work of a shared machine inflates less than the wall times).
//!
//! Only ebpf-cni has such counters; the reference chain keeps none to export. The pods are
//! removed with their node (namespaces, pins and IPAM directory go in `Drop`), without DELs:
//! nothing of the node survives it.

use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

use crate::format::thousands;
use crate::log::progress;
use crate::metric::Metric;
use crate::model::{Cell, Repeats, Subject, Table};
use crate::params::Params;
use crate::rig::exec;
use crate::rig::topo::{self, BenchNode, Binaries};

/// The limit every second pod carries (both directions).
const RATE_BPS: u64 = 1_000_000_000;
const FIRST_HOST_PORT: usize = 10_000;
const CONTAINER_PORT: u16 = 80;

pub struct Output {
    pub table: Table,
    /// Pods on the node when it was measured.
    pub pods: usize,
}

pub fn run(p: &Params, bins: &Binaries) -> Output {
    let mut f = Figures::default();
    let mut exposition = None;
    if let Err(e) = measure(p, bins, &mut f, &mut exposition) {
        progress(&format!("metrics: failed: {e:#}"));
        for r in [&mut f.read, &mut f.wall, &mut f.cpu] {
            r.set_instead(Subject::EbpfCni, Cell::failed(&e));
        }
    }
    let pods = thousands(p.metrics_pods);
    let mut table = Table::new(
        &format!("`ebpf-cni metrics` on a node of {pods} pods"),
        format!(
            "median [min–max] over {} run(s) after one warm-up run",
            p.metrics_runs
        ),
    );
    let n = p.metrics_pods;
    table.rows = vec![
        f.read.row(Metric::MetricsRead { pods: n }),
        f.wall.row(Metric::MetricsProcessWall { pods: n }),
        f.cpu.row(Metric::MetricsProcessCpu { pods: n }),
    ];
    table.notes = vec![
        format!(
            "One ebpf-cni node with {pods} pods added one after another, each with one host \
             port ({FIRST_HOST_PORT}+i → {CONTAINER_PORT}/tcp) and every second one with a \
             {} Gbit/s limit both ways, \
             then `ebpf-cni metrics --netns <node>` run from the host, one at a time, after \
             the machine settled.",
            RATE_BPS / 1_000_000_000
        ),
        "Reading the maps: the time the process itself reports in \
         `ebpf_cni_metrics_read_seconds` (every node map walked once, per-CPU values summed, \
         plus a look at each pod's attachment directory; a pod's links are `inspect`'s, not \
         read for metrics). Process: from starting the binary to its exit, the whole \
         exposition read from its stdout; its CPU time from wait4's rusage. Each run's \
         exposition is checked to list every pod."
            .to_owned(),
        "The reference chain keeps no per-pod counters to export, so it has no column here."
            .to_owned(),
    ];
    if let Some(bytes) = exposition {
        table.notes.push(format!(
            "The exposition of the node is {} bytes.",
            thousands(bytes)
        ));
    }
    Output {
        table,
        pods: p.metrics_pods,
    }
}

/// Each run's figures (ms).
#[derive(Default)]
struct Figures {
    read: Repeats,
    wall: Repeats,
    cpu: Repeats,
}

fn measure(
    p: &Params,
    bins: &Binaries,
    f: &mut Figures,
    exposition: &mut Option<usize>,
) -> Result<()> {
    let node = BenchNode::new(Subject::EbpfCni, bins)?;
    let started = Instant::now();
    let mut pods = Vec::with_capacity(p.metrics_pods);
    for i in 0..p.metrics_pods {
        let host_port = u16::try_from(FIRST_HOST_PORT + i).context("more pods than host ports")?;
        let rate = (i % 2 == 0).then_some(RATE_BPS);
        let (pod, _) = node.add_pod(
            &format!("metrics-{i}"),
            topo::caps(&[(host_port, CONTAINER_PORT)], rate),
        )?;
        pods.push(pod);
        if (i + 1) % 250 == 0 {
            progress(&format!(
                "metrics: {} pods added ({:.0} s)",
                i + 1,
                started.elapsed().as_secs_f64()
            ));
        }
    }
    let netns = node.node.netns().path();
    crate::rig::machine::settle(Duration::from_secs(10));
    // A warm-up run: the binary's pages and the maps' first walk, not counted.
    scrape(&bins.ebpf_cni, netns, pods.len())?;
    for _ in 0..p.metrics_runs {
        let s = scrape(&bins.ebpf_cni, netns, pods.len())?;
        f.read.push(Subject::EbpfCni, s.read_ms);
        f.wall.push(Subject::EbpfCni, ms(s.wall));
        f.cpu.push(Subject::EbpfCni, ms(s.cpu));
        *exposition = Some(s.bytes);
    }
    let p50 = |r: &Repeats| crate::stats::median(r.values(Subject::EbpfCni));
    progress(&format!(
        "metrics: {} pods: reading the maps p50 {:.1} ms, process p50 {:.1} ms (CPU {:.1} ms)",
        pods.len(),
        p50(&f.read),
        p50(&f.wall),
        p50(&f.cpu),
    ));
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One run of `ebpf-cni metrics`.
struct Scrape {
    wall: Duration,
    cpu: Duration,
    /// `ebpf_cni_metrics_read_seconds`, in ms.
    read_ms: f64,
    bytes: usize,
}

fn scrape(bin: &Path, netns: &Path, pods: usize) -> Result<Scrape> {
    let args = [
        OsStr::new("metrics"),
        OsStr::new("--netns"),
        netns.as_os_str(),
    ];
    let out = exec::run(bin, &args, None, &[], &[])?;
    if out.code != Some(0) {
        bail!(
            "ebpf-cni metrics failed ({:?}): {}",
            out.code,
            out.stderr.trim()
        );
    }
    let text = out.stdout;
    let attachments = gauge(&text, "ebpf_cni_attachments")?;
    if attachments != pods as f64 {
        bail!("the exposition lists {attachments} attachments, the node has {pods} pods");
    }
    Ok(Scrape {
        wall: out.wall,
        cpu: out.usage.cpu,
        read_ms: gauge(&text, "ebpf_cni_metrics_read_seconds")? * 1e3,
        bytes: text.len(),
    })
}

/// The value of the label-less sample `name` in a Prometheus text exposition.
fn gauge(text: &str, name: &str) -> Result<f64> {
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .with_context(|| format!("the exposition has no {name} sample"))?;
    let value = line.split_whitespace().nth(1).unwrap_or_default();
    value
        .parse()
        .with_context(|| format!("{name}: cannot parse {value:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_label_less_sample() {
        let text = "# HELP ebpf_cni_attachments x\n# TYPE ebpf_cni_attachments gauge\n\
                    ebpf_cni_attachments_extra 7\nebpf_cni_attachments 1000\n";
        assert_eq!(gauge(text, "ebpf_cni_attachments").unwrap(), 1000.0);
        assert!(gauge(text, "ebpf_cni_endpoints").is_err());
    }
}
