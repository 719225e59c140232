//! `cargo xtask test`: the README's test command and what CI runs. Installs what is
//! missing, builds the real plugin with its eBPF programs (and the previous release's, for
//! the upgrade test: see `previous`), then runs every test: unit tests of pure logic and the
//! integration tests that drive the real binary against this machine's kernel, the demo's
//! checks, the quick benchmark and the release profile's training workload (`pgo`), then the
//! kernel matrix (the integration suites in VMs booting the kernels nodes run, see
//! `vmtest`). clippy runs first, with the workspace's lints and `-D warnings`, on the host
//! crates and on the eBPF programs (nightly, their BPF target): a warning fails the run.

use anyhow::Result;

use crate::{
    bench, build, cmd, dist, manifests, prepare, previous,
    setup::{self, Scope},
    vmtest,
};

pub fn test(extra: &[String]) -> Result<()> {
    let plugin = prepare::prepare("cargo xtask test", Scope::Full, prepare::UNDER_TEST, None)?;
    println!("plugin under test: {}", plugin.display());
    // A pin or a missing dependency in an install line fails here, not on a user's machine.
    // It waits on apt's resolver and the kernels' mirror, so it runs beside the previous
    // release's build (which installs nothing), not before it.
    println!("the set-up's installs (apt's simulation on a clean Debian 12 and here)");
    let installs = std::thread::spawn(setup::check_installs);
    // Without it the other tests still run; the upgrade test then fails for want of it.
    let previous = previous::build().map_err(|e| e.context("the previous release's build failed"));
    let installs = installs
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        .map_err(|e| e.context("an install of the set-up does not resolve"));
    match &previous {
        Ok(bin) => println!("previous release: {}", bin.display()),
        Err(e) => eprintln!("{e:#}"),
    }
    // The release artifacts, which tests/tests/release.rs installs; without them those
    // tests fail and the others still run.
    let dist = dist::dist().map_err(|e| e.context("building the release artifacts failed"));
    println!("clippy (the workspace's lints, -D warnings)");
    let mut clippy = cmd::cargo();
    clippy.current_dir(build::workspace_root()).args([
        "clippy",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]);
    let lints = cmd::run(&mut clippy).map_err(|e| e.context("clippy found warnings"));
    println!("clippy on the eBPF programs (nightly, bpfel-unknown-none, -D warnings)");
    let ebpf_lints =
        build::clippy_ebpf().map_err(|e| e.context("clippy found warnings in the eBPF programs"));
    // The deploy manifests, against a fixed Kubernetes version's schemas (before the
    // tests: xtask's own tests of this step then find the validator installed).
    println!("deploy manifests (strict schema validation)");
    let manifests = manifests::validate().map_err(|e| e.context("deploy/ manifests"));
    let mut c = cmd::cargo();
    // Every test binary runs even when one fails, so one run shows all failures.
    c.arg("test")
        .arg("--no-fail-fast")
        .args(extra)
        .env(ebpf_cni_tests::PLUGIN_BIN_ENV, &plugin)
        .env(
            ebpf_cni_tests::PROGRAMS_OBJ_ENV,
            build::staged_object(&plugin),
        )
        .env(
            ebpf_cni_tests::PROTOTYPES_OBJ_ENV,
            build::staged_prototypes(&plugin),
        );
    match &previous {
        Ok(bin) => c.env(previous::PREVIOUS_BIN_ENV, bin),
        Err(_) => c.env_remove(previous::PREVIOUS_BIN_ENV),
    };
    if let Ok(artifacts) = &dist {
        c.envs(artifacts.test_env());
    }
    let tests = cmd::run(&mut c);
    // The README's first command: its checks against the same binary (under a second).
    println!("demo (the README's first command, its checks only)");
    let demo = crate::demo::run(&plugin).map_err(|e| e.context("the demo failed"));
    // The quick benchmark runs too, so it cannot rot: it must complete and write its report.
    // It asserts no timing.
    println!("quick benchmark (checks that it runs and reports; asserts no timing)");
    let release = dist.as_ref().ok().and_then(|a| a.host_binary());
    let bench = bench::quick_for_ci(release).and_then(|args| bench::run(&args));
    // The profile's training workload too, played with the plugin under test (the kept
    // profile is left as it is; `cargo xtask pgo --check` builds the instrumented binary).
    println!("the release build's profile: its training workload runs");
    let pgo =
        crate::pgo::check_workload(&plugin).map_err(|e| e.context("the profile's training failed"));
    println!("kernel matrix (the integration suites on 5.10, 6.1 and 6.12 in VMs)");
    let matrix = vmtest::run(&vmtest::VmArgs::all(), &plugin);
    installs?;
    lints?;
    ebpf_lints?;
    manifests?;
    previous?;
    dist?;
    tests?;
    demo?;
    bench
        .map(|()| println!("quick benchmark: ok"))
        .map_err(|e| e.context("the quick benchmark failed"))?;
    pgo?;
    matrix.map_err(|e| e.context("the kernel matrix failed"))
}
