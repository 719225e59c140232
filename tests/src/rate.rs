//! Rates measured with iperf3 between test namespaces (the tests' generous checks; the
//! benchmark measures precisely).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

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

/// Sends `bytes` of UDP datagrams (1,400 bytes each) from `from` to `to` as fast as the
/// socket takes them, and returns how many bytes the socket took. An offer no emulated
/// sender fails to make: `bytes` well over a limit's burst plus what its rate refills while
/// the loop runs overruns it whatever the guest's speed, where iperf3's paced offer may not.
pub fn burst(from: &Netns, to: SocketAddr, bytes: usize) -> anyhow::Result<usize> {
    from.run_in(|| -> anyhow::Result<usize> {
        let any: IpAddr = match to {
            SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
            SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
        };
        let sock = UdpSocket::bind((any, 0))?;
        let datagram = [0x5au8; 1400];
        let (mut sent, mut failed) = (0, 0);
        while sent < bytes {
            // An ICMP error for an earlier datagram may surface here; the offer goes on,
            // unless no datagram leaves at all (a path that refuses every send).
            match sock.send_to(&datagram, to) {
                Ok(n) => (sent, failed) = (sent + n, 0),
                Err(e) if failed >= 100 => anyhow::bail!("sending to {to}: {e}"),
                Err(_) => failed += 1,
            }
        }
        Ok(sent)
    })?
}

/// Held for the length of each measurement: the tests of one binary run in parallel, and two
/// streams at once on a two-core machine take CPU from each other, so a sender that is
/// short of CPU falls below a limit it should reach (33.9 of 40 Mbit/s in one CI run).
static MEASURING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds off every other measurement of this test binary until dropped.
pub fn measuring() -> std::sync::MutexGuard<'static, ()> {
    // A test that panicked while measuring leaves the lock poisoned, not the next one wrong.
    MEASURING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts a one-off iperf3 server in `server` on `addr`:`port` and returns once it
/// listens (a fixed pause was too short on a loaded machine: the client found no server).
pub fn iperf_server(server: &Netns, addr: IpAddr, port: u16) {
    start_iperf_server(server, addr, port, &[]);
}

/// [`iperf_server`] with `extra` arguments (`-J`: a client's `--get-server-output` gets
/// the server's report as JSON).
fn start_iperf_server(server: &Netns, addr: IpAddr, port: u16, extra: &[&str]) {
    let (a, p) = (addr.to_string(), port.to_string());
    let mut args = vec!["iperf3", "-s", "-1", "-D", "-B", &a, "-p", &p];
    args.extend_from_slice(extra);
    let out = server.exec(&args).unwrap();
    assert!(out.status.success(), "iperf3 server: {out:?}");
    let filter = format!("sport = :{port}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = server.exec(&["ss", "-Hltn", &filter]).unwrap();
        if !out.stdout.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "iperf3 server on {a} port {port} not listening after 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A port for the next one-off server: one that exited may hold its port for a moment.
pub fn next_port() -> u16 {
    static PORT: AtomicU16 = AtomicU16::new(5201);
    PORT.fetch_add(1, Ordering::Relaxed)
}

/// Runs one iperf3 test from `client` to a one-off server in `server` at `addr`; returns
/// what the receiver got, in bit/s. Measurements of one test binary never overlap.
pub fn iperf(client: &Netns, server: &Netns, addr: IpAddr, extra: &[&str]) -> f64 {
    iperf_for(client, server, addr, 3, extra)
}

/// [`iperf`] for `secs` seconds.
pub fn iperf_for(client: &Netns, server: &Netns, addr: IpAddr, secs: u32, extra: &[&str]) -> f64 {
    let _one_at_a_time = measuring();
    let port = next_port();
    iperf_server(server, addr, port);
    let (a, p, secs) = (addr.to_string(), port.to_string(), secs.to_string());
    let mut args = vec!["iperf3", "-c", &a, "-p", &p, "-t", &secs, "-J"];
    args.extend_from_slice(extra);
    let out = client.exec(&args).unwrap();
    parse_report(&out, extra)
}

/// What the receiver got, bit/s, from the `-J` output of an iperf3 client run with `extra`.
pub fn parse_report(out: &std::process::Output, extra: &[&str]) -> f64 {
    received_bps(&report_json(out, extra), extra.contains(&"-u"))
}

/// The `-J` report of an iperf3 client run with `extra`; panics on iperf3's own error.
fn report_json(out: &std::process::Output, extra: &[&str]) -> Value {
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "iperf3 {extra:?}: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    if let Some(e) = v["error"].as_str() {
        panic!("iperf3 {extra:?}: {e}");
    }
    v
}

/// Datagrams the UDP sockets of `netns` dropped because their receive buffer was full
/// (`Udp: RcvbufErrors` of /proc/net/snmp, which is per namespace).
pub fn udp_receive_buffer_drops(netns: &Netns) -> u64 {
    let out = netns.exec(&["cat", "/proc/net/snmp"]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut udp = text.lines().filter(|l| l.starts_with("Udp: "));
    let (names, values) = (udp.next(), udp.next());
    let (Some(names), Some(values)) = (names, values) else {
        panic!("no Udp lines in /proc/net/snmp: {text}");
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RcvbufErrors")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no Udp RcvbufErrors in /proc/net/snmp: {text}"))
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

/// The median round-trip time of `count` pings from `from` to `addr`, 0.2 s apart, in ms.
pub fn ping_median_ms(from: &Netns, addr: IpAddr, count: u32) -> f64 {
    let (a, n) = (addr.to_string(), count.to_string());
    let out = from
        .exec(&["ping", "-n", "-c", &n, "-i", "0.2", "-W", "2", &a])
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // "64 bytes from …: icmp_seq=1 ttl=63 time=0.052 ms"
    let mut rtts: Vec<f64> = text
        .lines()
        .filter_map(|l| l.split("time=").nth(1))
        .filter_map(|t| t.split_whitespace().next()?.parse().ok())
        .collect();
    assert!(
        rtts.len() * 2 > count as usize,
        "ping {addr}: fewer than half of {count} answered: {text}"
    );
    rtts.sort_by(f64::total_cmp);
    rtts[rtts.len() / 2]
}

/// The rate on the wire (Ethernet frames, as limits count them) of a measured goodput at
/// MTU 1500: TCP segments carry 1448 bytes in 1514 (IPv4, timestamps); UDP datagrams of
/// `udp_payload` bytes take 42 more (Ethernet 14, IPv4 20, UDP 8).
pub fn on_the_wire(goodput_bps: f64, udp_payload: Option<u32>) -> f64 {
    match udp_payload {
        Some(l) => goodput_bps * f64::from(l + 42) / f64::from(l),
        None => goodput_bps * 1514.0 / 1448.0,
    }
}

/// What the receiver of one iperf3 test got in its first second and after it, both as the
/// receiver counted them (its own intervals: a server's from `--get-server-output`, the
/// client's own with `-R`), so a burst let through at once shows in the first and not in
/// the rest.
#[derive(Debug, Clone)]
pub struct Received {
    /// Bytes of the first interval (about a second: `first_secs`).
    pub first_bytes: f64,
    pub first_secs: f64,
    /// Bit/s over the intervals after the first.
    pub steady_bps: f64,
    /// UDP datagrams that reached the receiver's namespace and that its socket dropped
    /// (a full receive buffer: the receiver starved of CPU), over the whole test.
    pub receiver_socket_drops: u64,
    /// Bytes per interval (about a second each) as the client sent and the server received
    /// them: where a starved sender fell behind and caught up, beside what arrived.
    pub sent_per_interval: Vec<f64>,
    pub received_per_interval: Vec<f64>,
}

/// One iperf3 test of `secs` seconds from `client` to a one-off server in `server`
/// listening on `listen`, the client connecting to `connect` (a host port's address, or
/// `listen` itself; the same port: iperf3's control connection uses it too).
pub fn iperf_after_first_second(
    client: &Netns,
    server: &Netns,
    listen: SocketAddr,
    connect: SocketAddr,
    secs: u32,
    extra: &[&str],
) -> Received {
    assert_eq!(
        listen.port(),
        connect.port(),
        "iperf3's control connection takes one port"
    );
    let _one_at_a_time = measuring();
    start_iperf_server(server, listen.ip(), listen.port(), &["-J"]);
    let (a, p, s) = (
        connect.ip().to_string(),
        connect.port().to_string(),
        secs.to_string(),
    );
    let mut args = vec![
        "iperf3",
        "-c",
        &a,
        "-p",
        &p,
        "-t",
        &s,
        "-J",
        "--get-server-output",
    ];
    args.extend_from_slice(extra);
    let drops_before = udp_receive_buffer_drops(server);
    let out = client.exec(&args).unwrap();
    let receiver_socket_drops = udp_receive_buffer_drops(server) - drops_before;
    let v = report_json(&out, extra);
    let (receiver, sender) = if extra.contains(&"-R") {
        (&v["intervals"], &v["server_output_json"]["intervals"])
    } else {
        (&v["server_output_json"]["intervals"], &v["intervals"])
    };
    let bytes_of = |list: &serde_json::Value| -> Vec<f64> {
        list.as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["sum"]["bytes"].as_f64())
            .collect()
    };
    let intervals: Vec<(f64, f64, f64)> = receiver
        .as_array()
        .unwrap_or_else(|| panic!("no receiver intervals in {v}"))
        .iter()
        .filter_map(|i| {
            let sum = &i["sum"];
            Some((
                sum["start"].as_f64()?,
                sum["seconds"].as_f64()?,
                sum["bytes"].as_f64()?,
            ))
        })
        .collect();
    let sum = |first: bool| {
        intervals
            .iter()
            .filter(|(start, ..)| (*start < 0.5) == first)
            .fold((0.0, 0.0), |(s, b), (_, secs, bytes)| (s + secs, b + bytes))
    };
    let (first_secs, first_bytes) = sum(true);
    let (secs, bytes) = sum(false);
    assert!(secs > 0.0, "no interval after the first second: {receiver}");
    Received {
        first_bytes,
        first_secs,
        steady_bps: bytes * 8.0 / secs,
        receiver_socket_drops,
        sent_per_interval: bytes_of(sender),
        received_per_interval: bytes_of(receiver),
    }
}
