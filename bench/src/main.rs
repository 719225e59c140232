//! `ebpf-cni-bench`: the benchmark's command line; `cargo xtask bench` runs it.

use clap::Parser as _;

fn main() -> anyhow::Result<()> {
    ebpf_cni_bench::bench(&ebpf_cni_bench::BenchArgs::parse())
}
