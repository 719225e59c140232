//! In-process connectivity checks between test-made namespaces: a server thread in one
//! namespace echoes what a client thread in another sends. Every wait is bounded, so a
//! broken path fails the check instead of hanging it.
//!
//! The server binds the exact target address, which proves the address lives in the target
//! namespace; binding is retried for a short while because a fresh IPv6 address is
//! "tentative" (unbindable) until duplicate address detection finishes.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::netns::Netns;

/// One connection attempt.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The whole check, including waiting for IPv6 DAD on either side.
pub const CHECK_DEADLINE: Duration = Duration::from_secs(8);
const POLL: Duration = Duration::from_millis(20);

/// What the server saw: the address it was reached on and the client's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Echo {
    pub server_addr: SocketAddr,
    pub client_addr: SocketAddr,
}

/// TCP: a server in `to` on `to_addr:port` (0 = any free port) echoes one message sent by a
/// client in `from`; Ok when the client got its message back.
pub fn tcp_echo(from: &Netns, to: &Netns, to_addr: IpAddr, port: u16) -> Result<Echo> {
    tcp_echo_with(from, to, to_addr, port, CHECK_DEADLINE)
}

/// [`tcp_echo`] with a custom overall bound (e.g. short, when failure is expected).
pub fn tcp_echo_with(
    from: &Netns,
    to: &Netns,
    to_addr: IpAddr,
    port: u16,
    bound: Duration,
) -> Result<Echo> {
    let deadline = Instant::now() + bound;
    let done_flag = AtomicBool::new(false);
    let done = &done_flag;
    let message = format!("ecni-tcp-{}-{}", from.name(), to.name());
    std::thread::scope(|s| {
        let (ready_tx, ready_rx) = mpsc::channel::<Result<SocketAddr>>();
        let server = s.spawn(move || -> Result<Echo> {
            let _g = to.enter()?;
            let listener = match retry_bind(deadline, || TcpListener::bind((to_addr, port))) {
                Ok(l) => l,
                Err(e) => {
                    let _ = ready_tx.send(Err(anyhow!("{e:#}")));
                    return Err(e);
                }
            };
            listener.set_nonblocking(true)?;
            let _ = ready_tx.send(Ok(listener.local_addr()?));
            let (mut stream, peer) = loop {
                match listener.accept() {
                    Ok(c) => break c,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if done.load(Ordering::Relaxed) || Instant::now() > deadline {
                            bail!("no connection reached {to_addr} in {}", to.name());
                        }
                        std::thread::sleep(POLL);
                    }
                    Err(e) => return Err(e).context("accept"),
                }
            };
            stream.set_nonblocking(false)?;
            stream.set_read_timeout(Some(CONNECT_TIMEOUT))?;
            let mut buf = vec![0u8; 256];
            let n = stream.read(&mut buf).context("server read")?;
            stream.write_all(&buf[..n]).context("server write")?;
            Ok(Echo {
                server_addr: stream.local_addr()?,
                client_addr: peer,
            })
        });

        let client = (|| -> Result<()> {
            let target = ready_rx
                .recv_timeout(bound)
                .map_err(|_| anyhow!("server thread never got ready"))??;
            let _g = from.enter()?;
            let mut last_err = None;
            while Instant::now() < deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                let attempt = CONNECT_TIMEOUT.min(left).max(Duration::from_millis(10));
                match TcpStream::connect_timeout(&target, attempt) {
                    Ok(mut stream) => {
                        stream.set_read_timeout(Some(CONNECT_TIMEOUT))?;
                        stream
                            .write_all(message.as_bytes())
                            .context("client write")?;
                        let mut buf = vec![0u8; message.len()];
                        stream.read_exact(&mut buf).context("client read")?;
                        if buf != message.as_bytes() {
                            bail!(
                                "echo mismatch: sent {message:?}, got {:?}",
                                String::from_utf8_lossy(&buf)
                            );
                        }
                        return Ok(());
                    }
                    Err(e) => {
                        // Unreachable/unavailable right after ADD can be IPv6 DAD; retry.
                        last_err = Some(e);
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
            Err(anyhow!(
                "TCP {} -> {target} ({}) failed: {:?}",
                from.name(),
                to.name(),
                last_err
            ))
        })();
        done.store(true, Ordering::Relaxed);
        let server = server
            .join()
            .map_err(|_| anyhow!("server thread panicked"))?;
        client?;
        server
    })
}

/// UDP: a server in `to` on `to_addr:port` (0 = any free port) echoes datagrams from a
/// client in `from`; Ok when one came back intact.
pub fn udp_echo(from: &Netns, to: &Netns, to_addr: IpAddr, port: u16) -> Result<Echo> {
    udp_echo_with(from, to, to_addr, port, CHECK_DEADLINE)
}

/// [`udp_echo`] with a custom overall bound.
pub fn udp_echo_with(
    from: &Netns,
    to: &Netns,
    to_addr: IpAddr,
    port: u16,
    bound: Duration,
) -> Result<Echo> {
    let deadline = Instant::now() + bound;
    let done_flag = AtomicBool::new(false);
    let done = &done_flag;
    let message = format!("ecni-udp-{}-{}", from.name(), to.name());
    std::thread::scope(|s| {
        let (ready_tx, ready_rx) = mpsc::channel::<Result<SocketAddr>>();
        let server = s.spawn(move || -> Result<Option<Echo>> {
            let _g = to.enter()?;
            let sock = match retry_bind(deadline, || UdpSocket::bind((to_addr, port))) {
                Ok(l) => l,
                Err(e) => {
                    let _ = ready_tx.send(Err(anyhow!("{e:#}")));
                    return Err(e);
                }
            };
            sock.set_read_timeout(Some(Duration::from_millis(100)))?;
            let local = sock.local_addr()?;
            let _ = ready_tx.send(Ok(local));
            let mut seen = None;
            let mut buf = [0u8; 256];
            while !done.load(Ordering::Relaxed) && Instant::now() < deadline {
                match sock.recv_from(&mut buf) {
                    Ok((n, peer)) => {
                        sock.send_to(&buf[..n], peer).context("server send")?;
                        seen = Some(Echo {
                            server_addr: local,
                            client_addr: peer,
                        });
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(e) => return Err(e).context("server recv"),
                }
            }
            Ok(seen)
        });

        let client = (|| -> Result<()> {
            let target = ready_rx
                .recv_timeout(bound)
                .map_err(|_| anyhow!("server thread never got ready"))??;
            let _g = from.enter()?;
            let unspecified: IpAddr = match target.ip() {
                IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
                IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
            };
            let sock = UdpSocket::bind((unspecified, 0)).context("client bind")?;
            sock.set_read_timeout(Some(Duration::from_millis(250)))?;
            let mut last_err = None;
            while Instant::now() < deadline {
                if let Err(e) = sock.send_to(message.as_bytes(), target) {
                    last_err = Some(e);
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
                let mut buf = [0u8; 256];
                match sock.recv_from(&mut buf) {
                    Ok((n, peer)) if peer == target && &buf[..n] == message.as_bytes() => {
                        return Ok(())
                    }
                    Ok((n, peer)) => {
                        bail!(
                            "unexpected datagram from {peer}: {:?}",
                            String::from_utf8_lossy(&buf[..n])
                        )
                    }
                    Err(e) => last_err = Some(e),
                }
            }
            Err(anyhow!(
                "UDP {} -> {target} ({}) got no echo: {:?}",
                from.name(),
                to.name(),
                last_err
            ))
        })();
        done.store(true, Ordering::Relaxed);
        let server = server
            .join()
            .map_err(|_| anyhow!("server thread panicked"))?;
        client?;
        server?.ok_or_else(|| anyhow!("UDP server saw no datagram"))
    })
}

fn retry_bind<T>(deadline: Instant, mut bind: impl FnMut() -> std::io::Result<T>) -> Result<T> {
    loop {
        match bind() {
            Ok(s) => return Ok(s),
            // EADDRNOTAVAIL: not (yet) an address of this namespace, e.g. tentative IPv6.
            Err(e)
                if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(e).context("server bind"),
        }
    }
}
