//! `cargo xtask <task>`: see `cargo xtask --help`.

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use xtask::build::BuildOptions;

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "ebpf-cni developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Install what building and testing need (apt packages, rust-src, bpf-linker, QEMU,
    /// virtme-ng and the kernels unpacked into a cache); only what is missing.
    Setup,
    /// Prove every apt install of the set-up resolves on a clean Debian 12 and here (apt's
    /// simulation against an empty dpkg status), and every kernel package downloads.
    CheckInstalls,
    /// Build the eBPF object and the plugin embedding it; prints the plugin's path.
    Build(BuildArgs),
    /// Build the release artifacts into <target>/dist/: static amd64 and arm64 tarballs
    /// (with .sha256), Debian packages and an OCI image archive (see docs/release.md).
    Dist,
    /// Rewrite plugin/pgo/: build the plugin instrumented, run it as a busy node's runtime
    /// would, and keep the profile its release build is optimized with (needs root).
    Pgo {
        /// Write the profile into the target directory and compare the kept one with it,
        /// leaving plugin/pgo/ as it is (`cargo xtask test` runs only the training's
        /// workload, with the plugin under test).
        #[arg(long)]
        check: bool,
    },
    /// Build the previous release's plugin (a fixed commit, for the upgrade test) unless it
    /// is built already; prints the binary's path.
    BuildPrevious,
    /// Install what is missing, build, then run every test (unit and real-kernel
    /// integration tests; needs root). Arguments after `--` go to `cargo test`.
    Test {
        #[arg(last = true)]
        cargo_test_args: Vec<String>,
    },
    /// Install what is missing, build, then run two pods in network namespaces and show
    /// ADD, connectivity, CHECK and DEL working (needs root).
    Demo,
    /// Build, then run the integration suites in QEMU VMs booting Debian's 5.10, 6.1 and
    /// 6.12 kernels (needs root). Arguments after `--` filter the tests by name, or name
    /// whole suites (e.g. `programs`).
    Vmtest(xtask::vmtest::VmArgs),
    /// Validate deploy/*.yaml against a fixed Kubernetes version's schemas (strict),
    /// installing the validator (PyPI's kubernetes-validate, in its own venv) if missing.
    ValidateManifests,
    /// Build, then benchmark ebpf-cni against the reference plugin chain (needs root). The
    /// arguments go to the benchmark (bench/): `cargo xtask bench --help` lists them.
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Debug, Args)]
struct BuildArgs {
    /// Build the plugin with the dev profile (the eBPF object is always release).
    #[arg(long)]
    debug_plugin: bool,
    /// Build the plugin with its test hooks, as the integration suites need it (never for
    /// a node), and the benchmark's eBPF object the prototypes' program tests load.
    #[arg(long)]
    test_hooks: bool,
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Setup => xtask::setup::setup(xtask::setup::Scope::Full),
        Task::CheckInstalls => xtask::setup::check_installs(),
        Task::Build(args) => {
            let plugin = xtask::build::build(&BuildOptions {
                debug_plugin: args.debug_plugin,
                test_hooks: args.test_hooks,
                test_link: false,
            })?;
            if args.test_hooks {
                xtask::build::build_prototypes(&xtask::build::Tree::current()?)?;
            }
            println!("{}", plugin.display());
            Ok(())
        }
        Task::Dist => xtask::dist::dist().map(drop),
        Task::Pgo { check: false } => xtask::pgo::pgo(),
        Task::Pgo { check: true } => xtask::pgo::check(),
        Task::BuildPrevious => {
            let plugin = xtask::previous::build()?;
            println!("{}", plugin.display());
            Ok(())
        }
        Task::Test { cargo_test_args } => xtask::test::test(&cargo_test_args),
        Task::Demo => xtask::demo::demo(),
        Task::Vmtest(args) => xtask::vmtest::vmtest(&args),
        Task::Bench { args } => xtask::bench::run(&args),
        Task::ValidateManifests => xtask::manifests::validate(),
    }
}
