//! Rates measured with iperf3 between test namespaces (the tests' generous checks; the
//! benchmark measures precisely).

use std::net::IpAddr;

use serde_json::Value;

use crate::Netns;

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
