//! What the figures were measured on: machine, kernel, tool versions, the code's revision.

use std::path::Path;
use std::process::Command;

use serde::Serialize;

use crate::bench::model::first_line;
use crate::{build, cmd};

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
