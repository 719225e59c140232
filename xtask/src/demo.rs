//! `cargo xtask demo`: the README's first command.

use anyhow::{bail, Result};

#[derive(Debug, clap::Args)]
pub struct DemoArgs {}

pub fn demo(_args: &DemoArgs) -> Result<()> {
    bail!("demo: not yet")
}
