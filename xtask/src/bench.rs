//! `cargo xtask bench`: ebpf-cni against the reference chain.

use anyhow::{bail, Result};

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// A short run (< 3 minutes) that CI uses so the benchmark cannot rot.
    #[arg(long)]
    pub quick: bool,
}

pub fn bench(_args: &BenchArgs) -> Result<()> {
    bail!("bench: not yet")
}
