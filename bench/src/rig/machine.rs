//! What the figures were measured on: machine, kernel, tool versions, the code's revision.

use std::path::Path;
use std::process::Command;

use serde::Serialize;

use crate::model::first_line;
use xtask::{build, cmd};

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub date_utc: String,
    pub cpu: String,
    pub cores: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub load_average: String,
    pub tcp_congestion_control: String,
    pub git_revision: String,
    /// (tool, version) in report order.
    pub versions: Vec<(String, String)>,
}

fn out(program: &str, args: &[&str]) -> String {
    cmd::output(Command::new(program).args(args))
        .map(|s| first_line(&s))
        .unwrap_or_else(|e| format!("unknown ({})", first_line(&format!("{e:#}"))))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

pub fn collect(ebpf_cni: &Path) -> Machine {
    let cpuinfo = read("/proc/cpuinfo");
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| "unknown".into());
    let hypervisor = if cpuinfo.contains(" hypervisor") {
        " (virtual machine)"
    } else {
        ""
    };
    let mem_kib: f64 = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let root = build::workspace_root();
    let root = root.to_string_lossy();
    let rev = out("git", &["-C", &root, "rev-parse", "--short=12", "HEAD"]);
    let dirty = cmd::output(Command::new("git").args(["-C", &root, "status", "--porcelain"]))
        .map(|s| !s.trim().is_empty())
        .unwrap_or(false);
    let plugin_version = cmd::output(Command::new(ebpf_cni).arg("version"))
        .map(|s| first_line(&s))
        .unwrap_or_else(|_| "unknown".into());
    let plugin_build = binary_kind(ebpf_cni);
    let dpkg = |pkg: &str| out("dpkg-query", &["-W", "-f=${Version}", pkg]);
    Machine {
        date_utc: out("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        cpu: format!("{cpu}{hypervisor}"),
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        memory_gib: mem_kib / 1024.0 / 1024.0,
        kernel: out("uname", &["-r"]),
        load_average: read("/proc/loadavg")
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        tcp_congestion_control: read("/proc/sys/net/ipv4/tcp_congestion_control")
            .trim()
            .to_owned(),
        git_revision: format!(
            "{rev}{}",
            if dirty {
                " (with uncommitted changes)"
            } else {
                ""
            }
        ),
        versions: vec![
            ("ebpf-cni".into(), plugin_version),
            ("ebpf-cni binary".into(), plugin_build),
            (
                "reference plugins (Debian containernetworking-plugins)".into(),
                dpkg("containernetworking-plugins"),
            ),
            ("iptables".into(), out("iptables", &["--version"])),
            ("iproute2".into(), out("ip", &["-V"])),
            ("iperf3".into(), out("iperf3", &["--version"])),
            ("rustc".into(), out("rustc", &["-V"])),
        ],
    }
}

/// What the measured plugin binary is: static (as the release ships it, `cargo xtask dist`)
/// or dynamically linked (a host build), its size and path.
fn binary_kind(bin: &Path) -> String {
    let size = std::fs::metadata(bin).map_or(0, |m| m.len());
    let kind = match ebpf_cni_tests::release::ElfFacts::read(bin) {
        Ok(elf) if elf.is_static() && !elf.is_position_independent() => {
            "static, no dynamic loader or shared library, not position-independent (the \
             release binary, as `cargo xtask dist` builds it)"
                .to_owned()
        }
        Ok(elf) if elf.is_static() => {
            "static-pie: no dynamic loader or shared library, but relocating itself at start \
             (not the release binary, which `cargo xtask dist` links at a fixed address)"
                .to_owned()
        }
        Ok(elf) => format!(
            "dynamically linked ({}): a host build, not the released static binary",
            elf.needed
                .iter()
                .filter_map(|n| n.split('[').nth(1)?.split(']').next())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Err(e) => format!("unknown ({})", first_line(&format!("{e:#}"))),
    };
    format!("{kind}, {:.1} MB, {}", size as f64 / 1e6, bin.display())
}

/// (busy, total) jiffies of all CPUs, from /proc/stat.
fn cpu_jiffies() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    let total: u64 = v.iter().take(8).sum();
    Some((total - idle, total))
}

/// Waits (at most `limit`) until the CPUs have been mostly idle for a quarter second: the
/// kernel finishes work a previous step left behind asynchronously (namespaces and devices
/// of deleted pods, netfilter transactions) on its own time, and a latency measured while
/// it runs measures that work too.
pub fn settle(limit: std::time::Duration) {
    let start = std::time::Instant::now();
    let window = std::time::Duration::from_millis(250);
    while start.elapsed() < limit {
        let Some((b0, t0)) = cpu_jiffies() else {
            return;
        };
        std::thread::sleep(window);
        let Some((b1, t1)) = cpu_jiffies() else {
            return;
        };
        let total = t1.saturating_sub(t0).max(1);
        if (b1.saturating_sub(b0)) * 100 / total <= 10 {
            return;
        }
    }
}
