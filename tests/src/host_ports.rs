//! Clients and a server for host-port tests (standalone and chained): a pod server that
//! answers with its tag and the peer it saw, TCP and UDP clients that check the answer came
//! from the address they dialled, and the node's netfilter ruleset for "no rule was
//! created".

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::{Netns, Node};

const TIMEOUT: Duration = Duration::from_secs(3);

/// A TCP and a UDP server on `[::]:port` (both families) in a pod, answering each request
/// with `"<tag> <peer>"`. Stops when dropped.
pub struct PodServer {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl PodServer {
    pub fn start(ns: &Netns, port: u16, tag: &str) -> Self {
        Self::start_on(ns, IpAddr::V6(Ipv6Addr::UNSPECIFIED), port, tag)
    }

    /// As [`PodServer::start`], bound to `addr` only: on a host with several addresses, a
    /// UDP answer then comes from the address asked.
    pub fn start_on(ns: &Netns, addr: IpAddr, port: u16, tag: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (tcp, udp) = ns
            .run_in(|| {
                let deadline = Instant::now() + Duration::from_secs(5);
                loop {
                    match (
                        TcpListener::bind((addr, port)),
                        UdpSocket::bind((addr, port)),
                    ) {
                        (Ok(t), Ok(u)) => break (t, u),
                        (t, u) if Instant::now() > deadline => {
                            panic!("binding {addr}:{port}: {t:?} {u:?}")
                        }
                        _ => std::thread::sleep(Duration::from_millis(50)),
                    }
                }
            })
            .unwrap();
        tcp.set_nonblocking(true).unwrap();
        udp.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut threads = Vec::new();
        let (s, t) = (stop.clone(), tag.to_owned());
        threads.push(std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match tcp.accept() {
                    Ok((mut c, peer)) => {
                        let t = t.clone();
                        std::thread::spawn(move || {
                            let _ = c.set_nonblocking(false);
                            let _ = c.set_read_timeout(Some(TIMEOUT));
                            let mut buf = [0u8; 64];
                            if c.read(&mut buf).unwrap_or(0) > 0 {
                                let _ = c.write_all(format!("{t} {}", unmap(peer)).as_bytes());
                            }
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        }));
        let (s, t) = (stop.clone(), tag.to_owned());
        threads.push(std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !s.load(Ordering::Relaxed) {
                if let Ok((_, peer)) = udp.recv_from(&mut buf) {
                    let _ = udp.send_to(format!("{t} {}", unmap(peer)).as_bytes(), peer);
                }
            }
        }));
        Self { stop, threads }
    }
}

impl Drop for PodServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

pub fn unmap(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => a,
        },
        v4 => v4,
    }
}

/// TCP from `from` to `target`: the server's answer; fails unless the connection's peer is
/// `target` (what `getpeername` says, so socket-level translation must restore it too).
pub fn tcp_ask(from: &Netns, target: SocketAddr) -> Result<String> {
    from.run_in(|| -> Result<String> {
        let deadline = Instant::now() + TIMEOUT;
        let mut c = loop {
            match TcpStream::connect_timeout(&target, TIMEOUT) {
                Ok(c) => break c,
                Err(e) if Instant::now() > deadline => {
                    return Err(e).with_context(|| format!("TCP connect to {target}"))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        let peer = c.peer_addr()?;
        if unmap(peer) != target {
            bail!("TCP to {target}: the connection's peer is {peer}");
        }
        c.set_read_timeout(Some(TIMEOUT))?;
        c.write_all(b"hello")?;
        let mut s = String::new();
        c.read_to_string(&mut s)
            .with_context(|| format!("TCP read from {target}"))?;
        if s.is_empty() {
            bail!("TCP to {target}: empty answer");
        }
        Ok(s)
    })?
}

/// UDP from an unconnected socket in `from` (bound to `bind`, port 0 = any): the answer;
/// fails unless it came from `target` (the address the client sent to).
pub fn udp_ask_from(from: &Netns, bind: SocketAddr, target: SocketAddr) -> Result<String> {
    from.run_in(|| -> Result<String> {
        let s = UdpSocket::bind(bind)?;
        udp_ask_on(&s, target)
    })?
}

pub fn udp_ask(from: &Netns, target: SocketAddr) -> Result<String> {
    let any: SocketAddr = if target.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    udp_ask_from(from, any, target)
}

pub fn udp_ask_on(s: &UdpSocket, target: SocketAddr) -> Result<String> {
    s.set_read_timeout(Some(Duration::from_millis(300)))?;
    let deadline = Instant::now() + TIMEOUT;
    let mut buf = [0u8; 512];
    while Instant::now() < deadline {
        s.send_to(b"hello", target)?;
        if let Ok((n, src)) = s.recv_from(&mut buf) {
            if unmap(src) != target {
                bail!("UDP to {target}: the answer came from {src}");
            }
            return Ok(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    Err(anyhow!("UDP to {target}: no answer"))
}

pub fn tag_of(answer: &str) -> &str {
    answer.split(' ').next().unwrap_or("")
}

/// The node's netfilter state: iptables and ip6tables rules (all tables) and the nftables
/// ruleset, for "no rule was created" comparisons.
pub fn ruleset(node: &Node) -> String {
    let mut out = String::new();
    for cmd in [
        &["iptables-save"][..],
        &["ip6tables-save"],
        &["nft", "list", "ruleset"],
    ] {
        let o = node.netns().exec(cmd).unwrap();
        // iptables-save prints a timestamp comment.
        let text = String::from_utf8_lossy(&o.stdout);
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

pub fn sa(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

/// Asks each `(what, from, target)` over TCP and UDP; the failures (no answer, or an
/// answer not tagged `tag`), one line each, for a single assertion over every path.
pub fn ask_each(cases: &[(&str, &Netns, SocketAddr)], tag: &str) -> Vec<String> {
    let mut failures = Vec::new();
    for (what, from, target) in cases {
        for (proto, r) in [
            ("tcp", tcp_ask(from, *target)),
            ("udp", udp_ask(from, *target)),
        ] {
            match r {
                Ok(ans) if tag_of(&ans) == tag => {}
                Ok(ans) => failures.push(format!("{what} {proto} {target}: answered by {ans:?}")),
                Err(e) => failures.push(format!("{what} {proto} {target}: {e:#}")),
            }
        }
    }
    failures
}
