//! The operator CLI, used when `CNI_COMMAND` is not set.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "ebpf-cni", version, about = "CNI plugin with an eBPF dataplane. Run by a container runtime with CNI_COMMAND set; without it, these operator commands.")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print the plugin version and the CNI spec versions it supports.
    Version,
}

pub fn main() -> i32 {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Version => {
            println!(
                "ebpf-cni {}\nCNI spec versions: {}",
                env!("CARGO_PKG_VERSION"),
                crate::cni::version::SUPPORTED_VERSIONS.join(", ")
            );
            0
        }
    }
}
