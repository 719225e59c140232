//! Rates measured with iperf3 between test namespaces (the tests' generous checks; the
//! benchmark measures precisely).

use std::net::IpAddr;

use serde_json::Value;

use crate::Netns;

/// Set by `cargo xtask vmtest` in its guests. Under QEMU's TCG a guest runs 10–30× slower
/// than the host and shares two cores with the other kernels' guests, so a sender may not
/// reach a rate at all: there a measured rate is held only to what a limit must not exceed,
/// and to a floor any working path clears (timing stays out of VM runs).
pub const VM_ENV: &str = "EBPF_CNI_TEST_VM";

/// Whether the tests run in a guest of the kernel matrix.
pub fn in_vm() -> bool {
    std::env::var_os(VM_ENV).is_some_and(|v| !v.is_empty())
}

/// The lower bound of a rate check: `host` on the host, `vm` in a matrix guest.
pub fn floor(host: f64, vm: f64) -> f64 {
    if in_vm() {
        vm
    } else {
        host
    }
}

/// Runs one iperf3 test from `client` to a one-off server in `server` at `addr`; returns
/// what the receiver got, in bit/s.
pub fn iperf(client: &Netns, server: &Netns, addr: IpAddr, extra: &[&str]) -> f64 {
    let a = addr.to_string();
    let out = server
        .exec(&["iperf3", "-s", "-1", "-D", "-B", &a])
        .unwrap();
    assert!(out.status.success(), "iperf3 server: {out:?}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut args = vec!["iperf3", "-c", &a, "-t", "3", "-J"];
    args.extend_from_slice(extra);
    let out = client.exec(&args).unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "iperf3 {extra:?}: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    received_bps(&v, extra.contains(&"-u"))
}

/// What the receiver got in an iperf3 `-J` report, bit/s (UDP: the sent rate less the
/// lost share).
pub fn received_bps(v: &Value, udp: bool) -> f64 {
    let end = &v["end"];
    if udp {
        let sum = &end["sum"];
        let sent = sum["bits_per_second"].as_f64().expect("UDP rate");
        let lost = sum["lost_percent"].as_f64().unwrap_or(0.0);
        sent * (1.0 - lost / 100.0)
    } else {
        end["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or_else(|| panic!("TCP rate in {v}"))
    }
}
