//! `cargo xtask vmtest`: the integration suites on the kernels nodes run (see [`kernels`]),
//! each booted in a QEMU VM by virtme-ng over this machine's root filesystem, with the
//! plugin and the test binaries built here on the host.
//!
//! The guest sees the host's files read-only; each kernel gets a directory of its own that
//! it may write (`target/vmtest/<series>/`), where a generated script leaves one log and one
//! exit code per suite. The guest's console goes to `console.log` there: virtme-ng's own
//! channel for the command's output needs virtio-serial, which these kernels load too late,
//! so nothing is read from the console but the boot log for a failure report.
//!
//! Under TCG (the fallback when KVM does not come up) the guest is 10–15× slower than the
//! host, so the suites run on every kernel as declared in [`PLAN`], which the kernel matrix
//! of docs/kernels.md mirrors. No test asserts timing, so the slowness costs only time.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{
    build, cmd,
    kernels::{Kernel, KERNELS},
    prepare,
    setup::Scope,
};

#[derive(Debug, clap::Args)]
pub struct VmArgs {
    /// Which kernel to boot: 5.10, 6.1, 6.12 or all.
    #[arg(long, default_value = "all")]
    pub kernel: String,
    /// libtest filters (test names or parts of them): run only the planned tests that match;
    /// a suite's name (`programs`) selects that suite.
    #[arg(last = true)]
    pub filter: Vec<String>,
}

impl VmArgs {
    /// Every kernel, every planned test: what `cargo xtask test` runs.
    pub fn all() -> VmArgs {
        VmArgs {
            kernel: "all".into(),
            filter: Vec::new(),
        }
    }
}

/// One test binary of `tests/` and the tests of it that run in the VMs.
struct Suite {
    /// The integration test's name (`tests/tests/<name>.rs`).
    test: &'static str,
    /// libtest filters; empty runs the whole binary.
    only: &'static [&'static str],
}

/// What runs on every kernel of the matrix: under TCG a test takes 10–30× its time on the
/// host, so each suite runs the tests that cover, between them, every program type (TC:
/// pod, device, chained; socket-address; sock_ops), both attach modes (TCX where the kernel
/// has it, netlink filters everywhere), port mappings, limits, GC and STATUS, and every
/// DEL and leftover check, masquerade (the FIB's source address on 6.8+, the
/// recorded one before), and the source check. Left out, and run on the host kernel only: the runtime
/// end-to-end tests (podman, containerd: daemons and images, minutes each), the harness's
/// self-checks against the reference plugins, and the remaining tests of each suite, whose
/// code paths do not depend on the kernel (config and error handling, IPAM, CNI versions).
const PLAN: &[Suite] = &[
    // The programs on crafted frames (BPF_PROG_TEST_RUN): seconds, so all of them.
    Suite {
        test: "programs",
        only: &[],
    },
    Suite {
        test: "ebpf",
        only: &[],
    },
    Suite {
        test: "lifecycle",
        only: &[
            "add_check_del_1_1_0",
            "del_without_netns_or_prev_result",
            "failed_add_rolls_back_everything",
        ],
    },
    Suite {
        test: "gc_status",
        only: &[
            "gc_removes_unlisted_attachments_and_keeps_the_listed_one",
            "status_succeeds_on_a_healthy_node",
        ],
    },
    Suite {
        test: "portmap",
        only: &[
            "every_path_reaches_the_pod_and_replies_come_from_the_dialled_address",
            "socket_translation_is_scoped_to_the_node_namespace",
            "each_node_of_a_machine_reaches_its_own_pod_through_loopback",
            "del_without_port_mappings_cleans_up_and_check_sees_tampering",
            "cgroup_programs_are_attached_only_while_a_pod_needs_them",
        ],
    },
    Suite {
        test: "bandwidth",
        only: &[
            "limits_hold_in_both_directions_and_unlimited_pods_are_untouched",
            "tcp_from_a_limited_pod_is_paced_to_the_limit",
            "traffic_towards_a_limited_pod_is_paced_to_the_limit",
            "subnets_exempt_or_select_the_traffic_a_limit_holds",
        ],
    },
    Suite {
        test: "chained",
        only: &[
            "after_bridge_serves_host_ports_and_limits_and_deletes_cleanly",
            "netlink_mode_del_takes_the_filters_off_the_bridges_veth",
            "the_bridges_pods_send_only_from_their_own_addresses_and_macs",
        ],
    },
    // The source check: the LPM lookup, the verdicts and the counters on every kernel.
    Suite {
        test: "spoof",
        only: &[],
    },
    Suite {
        test: "kernels",
        only: &[],
    },
    Suite {
        test: "masquerade",
        only: &[
            "pods_reach_a_host_without_a_route_back_through_the_node_address",
            "fragmentation_needed_reaches_the_pod_and_a_transfer_completes",
            "the_pods_port_unreachable_reaches_the_remote_end",
            "ports_reused_towards_a_server_in_time_wait_connect_at_once",
            "a_connection_reopened_on_a_closed_flows_tuple_keeps_its_port",
            "a_datagram_the_node_would_fragment_never_leaves_with_the_pods_address",
        ],
    },
    Suite {
        test: "dataplane",
        only: &[
            "forwarding_bypasses_netfilter_and_is_counted",
            "nothing_left_after_the_last_del_and_add_works_again",
            "device_programs_follow_the_node_devices_and_the_config",
            "netlink_filters_on_pods_run_the_same_dataplane",
        ],
    },
    // The node following its devices and addresses: the device program attached to a new
    // device and taken off one that left (TCX links or netlink filters), masquerade's
    // recorded sources (what 5.10-6.7 leave with), the agent's rtnetlink subscription.
    Suite {
        test: "converge",
        only: &[
            "status_gives_new_addresses_and_devices_host_ports_and_takes_them_back",
            "status_moves_masquerade_to_the_egress_devices_new_address",
            "the_agent_follows_a_vip_within_five_seconds_and_serves_metrics",
        ],
    },
    // The bond and VLAN uplinks need bonding and 802.1Q, which the guests' Debian kernels
    // have and a host kernel may not: there they run only here.
    Suite {
        test: "node_life",
        only: &[
            "the_first_add_after_a_reboot_reclaims_only_our_dead_pods_leases",
            "a_udp_host_port_goes_to_its_next_owner_with_the_next_datagram",
            "a_pod_given_a_deleted_pods_address_answers_from_its_own_address",
            "the_nodes_connected_sockets_to_a_deleted_pod_are_closed",
            "host_ports_take_loopback_unless_the_network_says_not_to",
            "a_bond_uplink_carries_pods_masquerade_and_host_ports",
            "a_vlan_uplink_carries_pods_masquerade_and_host_ports",
            "a_vlan_on_a_bond_uplink_carries_pods_masquerade_and_host_ports",
            "a_bridge_uplink_carries_pods_masquerade_and_host_ports",
        ],
    },
];

/// A guest that has not powered off by then is killed and its kernel counted as failed.
/// Under TCG the 5.10 guest has taken 1,650 s here and more than 1,800 s on a slower CI
/// machine; on a machine of the same kind that ran everything 2–2.6× slower (2026-11-25,
/// the benchmark's second run), it had done 6 of its 13 suites after 38 min, and the CI's
/// other steps took 26 min. With the program tests verifying their object once (about 9
/// of those 38 min), 50 min lets such a machine finish within CI's 90, and a hung guest
/// still cannot hold it past that.
const VM_TIMEOUT: Duration = Duration::from_secs(50 * 60);
/// A suite still running then is killed (a hung test must not eat CI's time). The slowest
/// suite, the 5.10 guest's bandwidth tests, took 12.5 min on that slow machine.
const SUITE_TIMEOUT: Duration = Duration::from_secs(18 * 60);
/// A guest that has not started its script by then hangs in its boot (seen under TCG with
/// four guests on two cores: RCU stalls from 26 s on, for good): it is killed and booted
/// again, once. A normal boot takes 35–90 s here.
const BOOT_TIMEOUT: Duration = Duration::from_secs(5 * 60);
const BOOT_ATTEMPTS: u32 = 2;
/// A guest whose script started but that finished no suite for this long hangs (each suite
/// is killed in the guest after `SUITE_TIMEOUT`): it is killed, not waited for until
/// `VM_TIMEOUT`.
const STALL_TIMEOUT: Duration = Duration::from_secs(SUITE_TIMEOUT.as_secs() + 3 * 60);
/// How long a KVM guest may take to run `true` before TCG is used instead.
const KVM_PROBE_TIMEOUT: Duration = Duration::from_secs(25);

pub fn vmtest(args: &VmArgs) -> Result<()> {
    let plugin = prepare::prepare("cargo xtask vmtest", Scope::Full, prepare::UNDER_TEST, None)?;
    run(args, &plugin)
}

/// Runs the plan on the chosen kernels against `plugin`; fails when any test failed.
pub fn run(args: &VmArgs, plugin: &Path) -> Result<()> {
    let kernels: Vec<Kernel> = match args.kernel.as_str() {
        "all" => KERNELS.to_vec(),
        s => vec![Kernel::by_series(s)
            .with_context(|| format!("--kernel {s}: not one of 5.10, 6.1, 6.12, all"))?],
    };
    let binaries = test_binaries()?;
    let root = build::target_dir()?.join("vmtest");
    let accel = accelerator(&kernels[0], &root)?;
    // The kernels boot side by side: much of a test's time is waiting (traffic of a fixed
    // duration, polling), so three guests share two cores better than one after another.
    let results: Vec<(Kernel, Result<Tally>)> = std::thread::scope(|s| {
        let handles: Vec<_> = kernels
            .iter()
            .map(|&kernel| {
                let (dir, binaries, filter) = (root.join(kernel.series), &binaries, &args.filter);
                s.spawn(move || run_kernel(kernel, accel, &dir, plugin, binaries, filter))
            })
            .collect();
        kernels
            .iter()
            .zip(handles)
            .map(|(&k, h)| {
                (
                    k,
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("panicked"))),
                )
            })
            .collect()
    });
    let mut totals = Tally::default();
    let mut failed_kernels = Vec::new();
    for (kernel, result) in results {
        match result {
            Ok(t) => {
                if t.failed > 0 || t.broken > 0 {
                    failed_kernels.push(kernel.series);
                }
                totals.add(&t);
            }
            Err(e) => {
                eprintln!("vmtest {}: {e:#}", kernel.series);
                failed_kernels.push(kernel.series);
                totals.broken += 1;
            }
        }
    }
    println!("vmtest: {} passed, {} failed", totals.passed, totals.failed);
    if !failed_kernels.is_empty() {
        bail!("the kernel matrix failed on {}", failed_kernels.join(", "));
    }
    if totals.passed == 0 {
        bail!("the kernel matrix ran no test (filter {:?})", args.filter);
    }
    Ok(())
}

#[derive(Default)]
struct Tally {
    passed: u32,
    failed: u32,
    /// Suites that did not report a result (crashed, timed out).
    broken: u32,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.passed += o.passed;
        self.failed += o.failed;
        self.broken += o.broken;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

/// KVM where a guest really comes up with it; QEMU's TCG otherwise (on these machines
/// `/dev/kvm` exists but a KVM guest hangs after the boot loader).
fn accelerator(kernel: &Kernel, root: &Path) -> Result<Accel> {
    if !Path::new("/dev/kvm").exists() {
        return Ok(Accel::Tcg);
    }
    let image = installed(kernel)?.image;
    // The guest leaves a file behind: vng's own exit code is not the command's when the
    // guest has no virtio-serial channel for it (these kernels).
    let dir = root.join("kvm-probe");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let marker = dir.join("booted");
    let mut probe = vng();
    probe
        .arg("--run")
        .arg(&image)
        .args(["--cpus", "1", "--memory", "512M", "--rwdir"])
        .arg(&dir)
        .arg("--exec")
        .arg(format!("touch {}", marker.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    run_with_timeout(&mut probe, KVM_PROBE_TIMEOUT, &mut || None)?;
    let ok = marker.is_file();
    let accel = if ok { Accel::Kvm } else { Accel::Tcg };
    eprintln!("vmtest: guests run under {accel:?}");
    Ok(accel)
}

fn installed(kernel: &Kernel) -> Result<crate::kernels::Installed> {
    kernel.installed().with_context(|| {
        format!(
            "kernel {} is not unpacked in the cache; `cargo xtask setup` unpacks it",
            kernel.series
        )
    })
}

/// virtme-ng's runner, through the Python module in its own venv (see
/// [`crate::kernels::virtme_python`]). `vng` starts `virtme-run` by name, so the venv's
/// `bin/` goes first on its PATH (on a fresh machine nothing else provides it).
fn vng() -> Command {
    let python = crate::kernels::virtme_python().unwrap_or_else(|_| "python3".into());
    let mut c = Command::new(&python);
    if let Some(bin) = python.parent() {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let paths = std::iter::once(bin.to_path_buf()).chain(std::env::split_paths(&path));
        if let Ok(joined) = std::env::join_paths(paths) {
            c.env("PATH", joined);
        }
    }
    c.args([
        "-c",
        "import sys; from virtme_ng.run import main; sys.argv[0] = 'vng'; sys.exit(main())",
    ]);
    c
}

/// The integration-test binaries, built (not run) by cargo: test name → executable.
fn test_binaries() -> Result<Vec<(String, PathBuf)>> {
    let out = cmd::output(cmd::cargo().current_dir(build::workspace_root()).args([
        "test",
        "--no-run",
        "--package",
        "ebpf-cni-tests",
        "--tests",
        "--message-format=json",
    ]))?;
    let mut found = Vec::new();
    for line in out.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(exe), Some(name)) = (
            v.get("executable").and_then(|e| e.as_str()),
            v.pointer("/target/name").and_then(|n| n.as_str()),
        ) else {
            continue;
        };
        let is_test = v
            .pointer("/target/kind")
            .and_then(|k| k.as_array())
            .is_some_and(|k| k.iter().any(|k| k == "test"));
        if is_test {
            found.push((name.to_owned(), PathBuf::from(exe)));
        }
    }
    Ok(found)
}

fn run_kernel(
    kernel: Kernel,
    accel: Accel,
    dir: &Path,
    plugin: &Path,
    binaries: &[(String, PathBuf)],
    filter: &[String],
) -> Result<Tally> {
    let image = installed(&kernel)?;
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut runs = Vec::new();
    for suite in PLAN {
        let Some((_, exe)) = binaries.iter().find(|(n, _)| n == suite.test) else {
            bail!("no test binary `{}` was built", suite.test);
        };
        runs.push((suite.test, exe.clone(), libtest_args(suite, filter)));
    }
    let started = Instant::now();
    let script = guest_script(plugin, &runs);
    let booted = boot(kernel, accel, dir, &script, VM_TIMEOUT, Some(STALL_TIMEOUT));
    let secs = started.elapsed().as_secs_f64();

    let mut tally = Tally::default();
    let mut report = String::new();
    for (name, _, _) in &runs {
        let log = fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
        let rc = fs::read_to_string(dir.join(format!("{name}.rc"))).unwrap_or_default();
        let result = libtest_result(&log);
        match result {
            Some((p, f)) => {
                tally.passed += p;
                tally.failed += f;
                let _ = writeln!(report, "  {name}: {p} passed, {f} failed");
            }
            None => {
                tally.broken += 1;
                let _ = writeln!(report, "  {name}: no result (exit code {:?})", rc.trim());
            }
        }
        if result.is_none_or(|(_, f)| f > 0) || rc.trim() != "0" {
            eprintln!(
                "---- vmtest {} {name} (exit code {:?}) ----\n{log}",
                kernel.series,
                rc.trim()
            );
        }
    }
    println!(
        "vmtest {} ({}, {accel:?}, {secs:.0}s):\n{report}",
        kernel.series, image.release
    );
    booted?;
    Ok(tally)
}

/// Boots `kernel` under `accel` and runs `script` (shell, as root) in the guest with `dir`
/// writable, after the common set-up (`PATH`, bpffs, `$out` = `dir`); waits up to `limit`.
/// Fails, with the console's last lines, when the guest did not get to the script's end.
pub fn boot(
    kernel: Kernel,
    accel: Accel,
    dir: &Path,
    script: &str,
    limit: Duration,
    stall: Option<Duration>,
) -> Result<()> {
    let image = installed(&kernel)?;
    let q = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let mut text =
        String::from("#!/bin/bash\n# Written by `cargo xtask`; runs inside the guest.\nset -u\n");
    let _ = writeln!(text, "out={}", q(&dir.to_string_lossy()));
    text.push_str(
        "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
         mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf\n\
         uname -r > \"$out/uname\"\n",
    );
    text.push_str(script);
    text.push_str("touch \"$out/done\"\n");
    let path = dir.join("guest.sh");
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    let _ = fs::remove_file(dir.join("done"));

    eprintln!(
        "vm {}: booting {} under {accel:?}",
        kernel.series,
        image.image.display()
    );
    let mut attempt = 1;
    let status = loop {
        let _ = fs::remove_file(dir.join("uname"));
        let console = fs::File::create(dir.join("console.log"))?;
        let mut vm = vng();
        vm.arg("--run").arg(&image.image).arg("-v");
        if accel == Accel::Tcg {
            vm.arg("--disable-kvm");
        }
        vm.args(["--cpus", "2", "--memory", "4G"])
            .arg("--rwdir")
            .arg(dir)
            .arg("--exec")
            .arg(format!("/bin/bash {}", path.display()))
            .stdin(Stdio::null())
            .stdout(console.try_clone()?)
            .stderr(console);
        let started = Instant::now();
        let mut hung = None;
        let status = run_with_timeout(&mut vm, limit, &mut || {
            hung = guest_hangs(dir, started.elapsed(), stall);
            hung.clone()
        })?;
        match hung {
            Some(why) if attempt < BOOT_ATTEMPTS && !dir.join("uname").is_file() => {
                eprintln!("vm {}: {why}: killed, booting again", kernel.series);
                let _ = fs::rename(
                    dir.join("console.log"),
                    dir.join(format!("console-{attempt}.log")),
                );
                attempt += 1;
            }
            Some(why) => break Err(why),
            None => break Ok(status),
        }
    };
    if dir.join("done").is_file() {
        return Ok(());
    }
    let console = fs::read_to_string(dir.join("console.log")).unwrap_or_default();
    let tail: Vec<&str> = console.lines().rev().take(40).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    bail!(
        "the guest did not finish its script ({}); the console's last lines:\n{}",
        match status {
            Ok(Some(s)) => format!("vng exited with {s}"),
            Ok(None) => format!("killed after {}s", limit.as_secs()),
            Err(why) => format!("killed: {why}"),
        },
        tail.join("\n")
    )
}

/// Why a guest started `elapsed` ago and writing its results to `dir` is to be killed as
/// hung, if it is: no script started after `BOOT_TIMEOUT`, or (with `stall`) no step of the
/// script finished (its `.rc` file) for that long.
fn guest_hangs(dir: &Path, elapsed: Duration, stall: Option<Duration>) -> Option<String> {
    let modified = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).ok();
    let booted = modified(&dir.join("uname"));
    let (Some(booted), Some(stall)) = (booted, stall) else {
        return (booted.is_none() && elapsed > BOOT_TIMEOUT).then(|| {
            format!(
                "its script had not started after {} s (a hung boot)",
                BOOT_TIMEOUT.as_secs()
            )
        });
    };
    let last = fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "rc"))
        .filter_map(|e| modified(&e.path()))
        .fold(booted, std::cmp::max);
    let idle = last.elapsed().unwrap_or_default();
    (idle > stall).then(|| format!("no suite finished in {} s (a hung guest)", stall.as_secs()))
}

/// The kernel of `series` and the accelerator its guest runs under, for a one-off guest
/// (the benchmark's); the probe's files go under `root`.
pub fn guest(series: &str, root: &Path) -> Result<(Kernel, Accel)> {
    let kernel = Kernel::by_series(series)
        .with_context(|| format!("kernel {series}: not one of 5.10, 6.1, 6.12"))?;
    let accel = accelerator(&kernel, root)?;
    Ok((kernel, accel))
}

/// libtest's arguments for one suite: its planned filters, narrowed by the user's. A user
/// filter that names a suite of the plan (`programs`) selects that suite's planned tests
/// and no other suite's; the other filters select tests by name.
fn libtest_args(suite: &Suite, filter: &[String]) -> Vec<String> {
    let names_suite = |f: &String| PLAN.iter().any(|s| s.test == f.as_str());
    if filter.iter().any(|f| f == suite.test) {
        return planned_args(suite, &[]);
    }
    let by_name: Vec<String> = filter.iter().filter(|f| !names_suite(f)).cloned().collect();
    if by_name.is_empty() && !filter.is_empty() {
        // Only other suites are named: a filter no test name matches.
        return vec![
            "--exact".into(),
            "<none selected>".into(),
            "--test-threads=2".into(),
        ];
    }
    planned_args(suite, &by_name)
}

/// [`libtest_args`] with test-name filters only.
fn planned_args(suite: &Suite, filter: &[String]) -> Vec<String> {
    let mut args: Vec<String> = if filter.is_empty() {
        suite.only.iter().map(|s| s.to_string()).collect()
    } else if suite.only.is_empty() {
        filter.to_vec()
    } else {
        // libtest ORs its filters: keep the planned ones the user's select.
        suite
            .only
            .iter()
            .filter(|o| filter.iter().any(|f| o.contains(f.as_str())))
            .map(|s| s.to_string())
            .collect()
    };
    if !filter.is_empty() && args.is_empty() {
        // Nothing of this suite is selected: a filter no test name contains.
        args.push("--exact".into());
        args.push("<none selected>".into());
    }
    args.push("--test-threads=2".into());
    args
}

/// `test result: ok. 3 passed; 1 failed; …` → (3, 1).
fn libtest_result(log: &str) -> Option<(u32, u32)> {
    let line = log.lines().rev().find(|l| l.starts_with("test result:"))?;
    let count = |what: &str| -> Option<u32> {
        let before = line.split(&format!(" {what}")).next()?;
        before.rsplit([' ', '.', ';']).next()?.parse().ok()
    };
    Some((count("passed")?, count("failed")?))
}

/// The suites' part of the guest's script: each suite from the tests' package directory
/// (as cargo runs them), its output and exit code left in `$out`.
fn guest_script(plugin: &Path, runs: &[(&str, PathBuf, Vec<String>)]) -> String {
    let q = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let mut s = String::new();
    let _ = writeln!(
        s,
        "export {}={}",
        ebpf_cni_tests::PLUGIN_BIN_ENV,
        q(&plugin.to_string_lossy())
    );
    // The program tests load the object the plugin embeds (staged beside it).
    let _ = writeln!(
        s,
        "export {}={}",
        ebpf_cni_tests::PROGRAMS_OBJ_ENV,
        q(&build::staged_object(plugin).to_string_lossy())
    );
    // Tells the tests they run under emulation (`ebpf_cni_tests::rate::VM_ENV`).
    let _ = writeln!(s, "export {}=1", ebpf_cni_tests::rate::VM_ENV);
    let _ = writeln!(
        s,
        "cd {}",
        q(&build::workspace_root().join("tests").to_string_lossy())
    );
    for (name, exe, args) in runs {
        let args: Vec<String> = args.iter().map(|a| q(a)).collect();
        let _ = writeln!(
            s,
            "echo \"vmtest: {name}\" > /dev/kmsg\ntimeout -s KILL {} {} {} > \"$out/{name}.log\" 2>&1; echo $? > \"$out/{name}.rc\"",
            SUITE_TIMEOUT.as_secs(),
            q(&exe.to_string_lossy()),
            args.join(" ")
        );
    }
    s
}

/// Runs `cmd` until it exits, `limit` passes or `hung` (asked every 200 ms) says why it
/// should stop (then kills it): the exit status, or None when it was killed. The command runs in a process group of its own, and a timeout kills
/// the whole group: killing virtme-ng's Python alone left its QEMU running (a hung KVM probe
/// guest kept half a core busy for the rest of the run, and after it).
fn run_with_timeout(
    cmd: &mut Command,
    limit: Duration,
    hung: &mut dyn FnMut() -> Option<String>,
) -> Result<Option<std::process::ExitStatus>> {
    use std::os::unix::process::CommandExt as _;
    let line = cmd::display(cmd);
    let mut child = cmd
        .process_group(0)
        .spawn()
        .with_context(|| format!("failed to start `{line}`"))?;
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if started.elapsed() > limit || hung().is_some() {
            let pgid = i32::try_from(child.id()).expect("pids fit in i32");
            // SAFETY: kill(2) on the process group this function created; no memory involved.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hung_guests_are_told_apart_from_slow_ones() {
        let dir = std::env::temp_dir().join(format!("ecni-vmtest-hangs-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let minute = Duration::from_secs(60);
        // Booting: hung only after BOOT_TIMEOUT without the script's first file.
        assert_eq!(guest_hangs(&dir, minute, Some(minute)), None);
        assert!(guest_hangs(&dir, BOOT_TIMEOUT + minute, None).is_some());
        // Running: hung when neither the start nor any suite's `.rc` is newer than `stall`.
        let uname = fs::File::create(dir.join("uname")).unwrap();
        assert_eq!(guest_hangs(&dir, BOOT_TIMEOUT * 2, Some(minute)), None);
        uname
            .set_modified(std::time::SystemTime::now() - 2 * minute)
            .unwrap();
        assert!(guest_hangs(&dir, BOOT_TIMEOUT * 2, Some(minute)).is_some());
        assert_eq!(guest_hangs(&dir, BOOT_TIMEOUT * 2, None), None);
        fs::write(dir.join("ebpf.rc"), "0").unwrap();
        assert_eq!(guest_hangs(&dir, BOOT_TIMEOUT * 2, Some(minute)), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reads_libtest_results() {
        let log = "running 3 tests\n...\ntest result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 4 filtered out; finished in 1.2s\n";
        assert_eq!(libtest_result(log), Some((2, 1)));
        assert_eq!(libtest_result("thread 'main' panicked"), None);
    }

    #[test]
    fn user_filters_narrow_the_plan() {
        let whole = Suite {
            test: "x",
            only: &[],
        };
        let part = Suite {
            test: "y",
            only: &["alpha_one", "beta_two"],
        };
        let f = vec!["beta".to_string()];
        assert_eq!(libtest_args(&whole, &f), ["beta", "--test-threads=2"]);
        assert_eq!(libtest_args(&part, &f), ["beta_two", "--test-threads=2"]);
        assert_eq!(
            libtest_args(&part, &["gamma".to_string()]),
            ["--exact", "<none selected>", "--test-threads=2"]
        );
        assert_eq!(
            libtest_args(&part, &[]),
            ["alpha_one", "beta_two", "--test-threads=2"]
        );
    }

    #[test]
    fn a_filter_naming_a_suite_selects_that_suite() {
        let programs = PLAN.iter().find(|s| s.test == "programs").unwrap();
        let masquerade = PLAN.iter().find(|s| s.test == "masquerade").unwrap();
        let f = vec!["programs".to_string()];
        assert_eq!(libtest_args(programs, &f), ["--test-threads=2"]);
        // "programs" would match ebpf's test names: as a suite's name it selects none.
        let ebpf = PLAN.iter().find(|s| s.test == "ebpf").unwrap();
        assert_eq!(
            libtest_args(ebpf, &f),
            ["--exact", "<none selected>", "--test-threads=2"]
        );
        let both = vec!["programs".to_string(), "time_wait".to_string()];
        assert_eq!(libtest_args(programs, &both), ["--test-threads=2"]);
        assert_eq!(
            libtest_args(masquerade, &both),
            [
                "ports_reused_towards_a_server_in_time_wait_connect_at_once",
                "--test-threads=2"
            ]
        );
    }
}
