//! Traffic generators: iperf3 for bulk throughput (server and client each in their own
//! namespace, entered with `nsenter --net` so nothing else changes), an in-process echo
//! server with TCP_RR-style (ping-pong on one connection) and TCP_CRR-style (connect,
//! one exchange, close) clients, and ping for latency under load.
//!
//! The echo protocol is one byte: the server echoes it, and closes after echoing `C`. The
//! server closing first keeps TIME_WAIT on the server side, so a fast CRR client never runs
//! out of ephemeral ports.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use ebpf_cni_tests::Netns;
use serde_json::Value;

/// A command with only the network namespace switched.
fn in_netns(ns: &Netns, program: &str) -> Command {
    let mut c = Command::new("nsenter");
    c.arg(format!("--net={}", ns.path().display()))
        .arg("--")
        .arg(program);
    c
}

/// A running `iperf3 -s`; killed and reaped on drop.
pub struct Iperf3Server {
    child: Child,
}

impl Iperf3Server {
    /// Starts `iperf3 -s` bound to `addr:port` in `ns` and waits until it listens.
    pub fn start(ns: &Netns, addr: Ipv4Addr, port: u16) -> Result<Self> {
        let child = in_netns(ns, "iperf3")
            .args(["-s", "-B", &addr.to_string(), "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting iperf3 -s")?;
        let server = Self { child };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let out = in_netns(ns, "ss")
                .args(["-Hltn", &format!("sport = :{port}")])
                .stdin(Stdio::null())
                .output()
                .context("running ss")?;
            if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
                return Ok(server);
            }
            if Instant::now() > deadline {
                bail!("iperf3 -s on {addr}:{port} in {} never listened", ns.name());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Iperf3Server {
    fn drop(&mut self) {
        // nsenter execs iperf3, so this pid is iperf3's.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// UDP datagram payload (bytes): 1442-byte frames at MTU 1500.
pub const UDP_PAYLOAD: u32 = 1400;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    /// UDP sent at this many bit/s.
    Udp(u64),
}

/// What one iperf3 run measured: goodput (payload bits/s) at each end.
#[derive(Debug, Clone, Copy)]
pub struct Iperf3Result {
    pub receiver_bps: f64,
    pub sender_bps: f64,
}

/// Runs an iperf3 client in `ns` against `target` for `secs` (after `omit` seconds that do
/// not count); `reverse` makes the server send. Retries briefly when the server is still busy
/// with the previous test.
pub fn iperf3(
    ns: &Netns,
    target: SocketAddr,
    secs: u32,
    omit: u32,
    reverse: bool,
    proto: Proto,
) -> Result<Iperf3Result> {
    iperf3_streams(ns, target, secs, omit, reverse, proto, 1)
}

/// [`iperf3`] with `streams` parallel streams (`-P`): the figures are their sum.
pub fn iperf3_streams(
    ns: &Netns,
    target: SocketAddr,
    secs: u32,
    omit: u32,
    reverse: bool,
    proto: Proto,
    streams: u32,
) -> Result<Iperf3Result> {
    let mut last = None;
    for attempt in 0..4 {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(300));
        }
        let mut c = in_netns(ns, "iperf3");
        c.args([
            "-c",
            &target.ip().to_string(),
            "-p",
            &target.port().to_string(),
        ])
        .args(["-t", &secs.to_string(), "-O", &omit.to_string(), "-J"])
        .args(["--connect-timeout", "3000"]);
        if reverse {
            c.arg("-R");
        }
        if streams > 1 {
            c.args(["-P", &streams.to_string()]);
        }
        if let Proto::Udp(rate) = proto {
            // 8 MiB socket buffers: with the default ones the iperf3 receiver itself drops
            // datagrams above ≈ 600 Mbit/s on this kind of machine, limiter or not.
            c.args([
                "-u",
                "-b",
                &rate.to_string(),
                "-l",
                &UDP_PAYLOAD.to_string(),
            ])
            .args(["-w", "8M"]);
        }
        let out = c
            .stdin(Stdio::null())
            .output()
            .context("running iperf3 -c")?;
        let json: Option<Value> = serde_json::from_slice(&out.stdout).ok();
        let error = json
            .as_ref()
            .and_then(|j| j.get("error"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        match (&json, error) {
            (Some(j), None) if out.status.success() => return parse_iperf3(j),
            (_, Some(e)) => last = Some(e),
            _ => {
                last = Some(format!(
                    "exit {:?}: {}",
                    out.status.code(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        }
    }
    bail!(
        "iperf3 {} -> {target}: {}",
        ns.name(),
        last.unwrap_or_default()
    )
}

fn parse_iperf3(j: &Value) -> Result<Iperf3Result> {
    let recv = j
        .pointer("/end/sum_received")
        .ok_or_else(|| anyhow!("iperf3 JSON has no end.sum_received"))?;
    let bps = recv
        .get("bits_per_second")
        .and_then(Value::as_f64)
        .ok_or_else(|| anyhow!("iperf3 JSON has no receiver bits_per_second"))?;
    let sender_bps = j
        .pointer("/end/sum_sent/bits_per_second")
        .and_then(Value::as_f64)
        .unwrap_or(f64::NAN);
    Ok(Iperf3Result {
        receiver_bps: bps,
        sender_bps,
    })
}

/// An in-process echo server in a namespace (the listening socket is created there and keeps
/// its namespace; the serving thread itself needs none). Connections are served one at a
/// time: every client here is sequential.
pub struct EchoServer {
    listener: Arc<TcpListener>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

pub const ECHO_CLOSE: u8 = b'C';
const ECHO_KEEP: u8 = b'R';

impl EchoServer {
    pub fn start(ns: &Netns, port: u16) -> Result<Self> {
        let listener = ns.run_in(|| TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)))??;
        let listener = Arc::new(listener);
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s) = (listener.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            pin_thread(rr_cpu());
            serve(&l, &s)
        });
        Ok(Self {
            listener,
            stop,
            thread: Some(thread),
        })
    }
}

fn serve(listener: &TcpListener, stop: &AtomicBool) {
    loop {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(_) if stop.load(Ordering::Relaxed) => return,
            Err(_) => continue,
        };
        let _ = echo_one(stream);
    }
}

fn echo_one(mut s: TcpStream) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut b = [0u8; 1];
    loop {
        if s.read(&mut b)? == 0 {
            return Ok(());
        }
        s.write_all(&b)?;
        if b[0] == ECHO_CLOSE {
            return Ok(());
        }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // shutdown(2) on a listening socket wakes a blocked accept(2) on Linux.
        // SAFETY: the fd is owned by `listener`, alive until after the join below.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The CPU request/response clients and the echo server are pinned to: the same one for
/// both, so a transaction costs the path's CPU work rather than a cross-CPU wakeup, which
/// on this kind of virtual machine varies several-fold from run to run.
pub fn rr_cpu() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get() - 1)
}

/// Pins the calling thread to `cpu` (best effort: a failure leaves it unpinned).
pub fn pin_thread(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET and sched_setaffinity(0, …) act
    // on the calling thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// TCP_RR-style: one connection, one byte each way per transaction, for `duration` after a
/// short warm-up; returns each transaction's time in µs.
pub fn tcp_rr(ns: &Netns, target: SocketAddr, duration: Duration) -> Result<Vec<f64>> {
    ns.run_in(|| -> Result<Vec<f64>> {
        pin_thread(rr_cpu());
        let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(3))
            .with_context(|| format!("connecting to {target}"))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(3)))?;
        let mut b = [0u8; 1];
        let mut once = |s: &mut TcpStream| -> Result<()> {
            s.write_all(&[ECHO_KEEP])?;
            s.read_exact(&mut b).context("reading the echo")?;
            Ok(())
        };
        for _ in 0..200 {
            once(&mut s)?;
        }
        let mut lat = Vec::with_capacity(100_000);
        let started = Instant::now();
        while started.elapsed() < duration {
            let t = Instant::now();
            once(&mut s)?;
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(lat)
    })?
}

/// TCP_CRR-style: connect, one exchange, server closes, client closes; repeated for
/// `duration`. Also returns the connect() latencies.
#[derive(Debug, Clone)]
pub struct CrrResult {
    pub secs: f64,
    pub connect_us: Vec<f64>,
}

/// Untimed connections [`tcp_crr`] opens before it measures.
pub const CRR_WARMUP: usize = 20;

pub fn tcp_crr(
    ns: &Netns,
    target: SocketAddr,
    duration: Duration,
    max_connections: usize,
) -> Result<CrrResult> {
    ns.run_in(|| -> Result<CrrResult> {
        pin_thread(rr_cpu());
        let one = || -> Result<f64> {
            let t = Instant::now();
            let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(3))
                .with_context(|| format!("connecting to {target}"))?;
            let connect = t.elapsed().as_secs_f64() * 1e6;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(Duration::from_secs(3)))?;
            s.write_all(&[ECHO_CLOSE])?;
            let mut b = [0u8; 1];
            s.read_exact(&mut b).context("reading the echo")?;
            // Wait for the server's FIN, so the client closes second (no TIME_WAIT here).
            let _ = s.read(&mut b);
            Ok(connect)
        };
        for i in 0..CRR_WARMUP {
            one().with_context(|| format!("warm-up connection {} failed", i + 1))?;
        }
        let mut connect_us = Vec::new();
        let started = Instant::now();
        while started.elapsed() < duration && connect_us.len() < max_connections {
            let at = started.elapsed().as_secs_f64();
            let connect = one().with_context(|| {
                format!(
                    "connection {} after the warm-up ({at:.2} s in) failed",
                    connect_us.len() + 1
                )
            })?;
            connect_us.push(connect);
        }
        Ok(CrrResult {
            secs: started.elapsed().as_secs_f64(),
            connect_us,
        })
    })?
}

/// Round-trip times of `count` pings from `ns` to `target`, one every `interval`; lost
/// probes are simply absent.
pub fn ping(ns: &Netns, target: Ipv4Addr, count: u32, interval: Duration) -> Result<Vec<f64>> {
    let out = in_netns(ns, "ping")
        .args(["-n", "-c", &count.to_string(), "-W", "1"])
        .args(["-i", &format!("{:.3}", interval.as_secs_f64())])
        .arg(target.to_string())
        .stdin(Stdio::null())
        .output()
        .context("running ping")?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter_map(|l| l.split("time=").nth(1))
        .filter_map(|t| t.split_whitespace().next()?.parse::<f64>().ok())
        .collect())
}

/// One echo exchange through `target` (e.g. a hostPort), with short timeouts: does the path
/// work at all?
pub fn probe_echo(ns: &Netns, target: SocketAddr) -> Result<()> {
    ns.run_in(|| -> Result<()> {
        let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(1))
            .with_context(|| format!("connecting to {target}"))?;
        s.set_read_timeout(Some(Duration::from_secs(1)))?;
        s.write_all(&[ECHO_CLOSE])?;
        let mut b = [0u8; 1];
        s.read_exact(&mut b)
            .with_context(|| format!("no echo through {target}"))?;
        Ok(())
    })?
}
