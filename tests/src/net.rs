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

use anyhow::{anyhow, bail, ensure, Context, Result};

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

/// TCP: `size` bytes from a client in `from` to a server in `to` on `to_addr` (any free
/// port), which answers with the count it read once the client shut its side; Ok when
/// both counts are `size`. Full-sized segments must cross the path (or the path's MTU be
/// learnt on the way), which a short echo never shows.
pub fn tcp_transfer(from: &Netns, to: &Netns, to_addr: IpAddr, size: usize) -> Result<()> {
    let listener = to.run_in(|| {
        retry_bind(Instant::now() + CHECK_DEADLINE, || {
            TcpListener::bind((to_addr, 0))
        })
    })??;
    let target = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + Duration::from_secs(20);
    std::thread::scope(|s| {
        let server = s.spawn(|| -> Result<usize> {
            let mut stream = loop {
                match listener.accept() {
                    Ok((c, _)) => break c,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if Instant::now() > deadline {
                            bail!("no connection reached {target} in {}", to.name());
                        }
                        std::thread::sleep(POLL);
                    }
                    Err(e) => return Err(e).context("accept"),
                }
            };
            stream.set_nonblocking(false)?;
            stream.set_read_timeout(Some(Duration::from_secs(10)))?;
            let mut got = 0usize;
            let mut buf = vec![0u8; 65536];
            loop {
                match stream.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) => bail!("{target} reading after {got} bytes: {e}"),
                }
            }
            stream.write_all(&(got as u64).to_be_bytes())?;
            Ok(got)
        });
        let sent = from.run_in(|| -> Result<u64> {
            let mut c = TcpStream::connect_timeout(&target, CONNECT_TIMEOUT)?;
            c.set_write_timeout(Some(Duration::from_secs(10)))?;
            c.set_read_timeout(Some(Duration::from_secs(10)))?;
            c.write_all(&vec![7u8; size]).context("client write")?;
            c.shutdown(std::net::Shutdown::Write)?;
            let mut n = [0u8; 8];
            c.read_exact(&mut n).context("client read of the count")?;
            Ok(u64::from_be_bytes(n))
        });
        let got = server
            .join()
            .map_err(|_| anyhow!("server thread panicked"))?;
        let sent = sent?.with_context(|| format!("{} -> {target}", from.name()))?;
        let got = got?;
        ensure!(
            got == size && sent == size as u64,
            "{} -> {target}: sent {size}, the server read {got}, the client heard {sent}",
            from.name()
        );
        Ok(())
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

/// One TCP connection attempt from `from` to `target` within `timeout`: the raw outcome,
/// for checks that an address must *not* answer.
pub fn tcp_connect(from: &Netns, target: SocketAddr, timeout: Duration) -> Result<()> {
    from.run_in(|| {
        TcpStream::connect_timeout(&target, timeout)
            .map(drop)
            .with_context(|| format!("TCP {} -> {target}", from.name()))
    })?
}

/// A listener on the wildcard address (both families) in `ns`, kept open while the value
/// lives. Unlike [`tcp_echo`]'s server it does not need any particular address in `ns`, so
/// it keeps answering whatever still reaches the namespace. The kernel completes
/// handshakes into the backlog, so no accept loop is needed.
pub fn tcp_listen_any(ns: &Netns) -> Result<TcpListener> {
    ns.run_in(|| TcpListener::bind((Ipv6Addr::UNSPECIFIED, 0)).context("bind [::]:0"))?
}

fn setsockopt_int(fd: i32, level: i32, name: i32, value: i32) -> std::io::Result<()> {
    // SAFETY: fd is an open socket; the option value is a live c_int of the size passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Receives one datagram on `sock` (which asked for IP_RECVTTL / IPV6_RECVHOPLIMIT) and
/// returns its payload and the TTL / hop limit it arrived with.
fn recv_with_ttl(sock: &UdpSocket) -> std::io::Result<(Vec<u8>, Option<u8>)> {
    use std::os::fd::AsRawFd;
    let mut data = [0u8; 512];
    // u64 elements: cmsghdr needs 8-byte alignment.
    let mut control = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: an all-zero msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: the socket is open and msg describes valid buffers.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut ttl = None;
    // SAFETY: the CMSG_* walk stays within msg_controllen as the kernel filled it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            let (level, kind) = ((*c).cmsg_level, (*c).cmsg_type);
            if (level == libc::IPPROTO_IP && kind == libc::IP_TTL)
                || (level == libc::IPPROTO_IPV6 && kind == libc::IPV6_HOPLIMIT)
            {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<i32>());
                ttl = u8::try_from(v).ok();
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((data[..n as usize].to_vec(), ttl))
}

/// UDP from `from` to `to_addr` in `to`, sent with IP TTL / IPv6 hop limit `send_ttl`: the
/// TTL the receiver saw on the first datagram that arrived, or `None` when none arrived
/// within `bound` (datagrams are re-sent every 100 ms meanwhile).
pub fn udp_received_ttl(
    from: &Netns,
    to: &Netns,
    to_addr: IpAddr,
    send_ttl: u8,
    bound: Duration,
) -> Result<Option<u8>> {
    use std::os::fd::AsRawFd;
    let deadline = Instant::now() + bound;
    let done_flag = AtomicBool::new(false);
    let done = &done_flag;
    let message = format!("ecni-ttl-{}-{}", from.name(), to.name());
    let message = message.as_bytes();
    let v4 = to_addr.is_ipv4();
    std::thread::scope(|s| {
        let (ready_tx, ready_rx) = mpsc::channel::<Result<SocketAddr>>();
        let server = s.spawn(move || -> Result<Option<u8>> {
            let _g = to.enter()?;
            let sock = match retry_bind(deadline, || UdpSocket::bind((to_addr, 0))) {
                Ok(l) => l,
                Err(e) => {
                    let _ = ready_tx.send(Err(anyhow!("{e:#}")));
                    return Err(e);
                }
            };
            let (level, opt) = if v4 {
                (libc::IPPROTO_IP, libc::IP_RECVTTL)
            } else {
                (libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT)
            };
            setsockopt_int(sock.as_raw_fd(), level, opt, 1).context("asking for the TTL")?;
            sock.set_read_timeout(Some(Duration::from_millis(100)))?;
            let _ = ready_tx.send(Ok(sock.local_addr()?));
            while Instant::now() < deadline {
                match recv_with_ttl(&sock) {
                    Ok((data, ttl)) if data == message => {
                        done.store(true, Ordering::Relaxed);
                        return ttl
                            .map(Some)
                            .ok_or_else(|| anyhow!("datagram came without its TTL"));
                    }
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(e) => return Err(e).context("server recvmsg"),
                }
            }
            Ok(None)
        });
        let client = (|| -> Result<()> {
            let target = ready_rx
                .recv_timeout(bound)
                .map_err(|_| anyhow!("server thread never got ready"))??;
            let _g = from.enter()?;
            let unspecified: IpAddr = if v4 {
                Ipv4Addr::UNSPECIFIED.into()
            } else {
                Ipv6Addr::UNSPECIFIED.into()
            };
            let sock = UdpSocket::bind((unspecified, 0)).context("client bind")?;
            let (level, opt) = if v4 {
                (libc::IPPROTO_IP, libc::IP_TTL)
            } else {
                (libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS)
            };
            setsockopt_int(sock.as_raw_fd(), level, opt, i32::from(send_ttl))
                .context("setting the TTL")?;
            while !done.load(Ordering::Relaxed) && Instant::now() < deadline {
                // Errors (e.g. ICMP unreachable reported on the socket) just mean "resend".
                let _ = sock.send_to(message, target);
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(())
        })();
        let server = server
            .join()
            .map_err(|_| anyhow!("server thread panicked"))?;
        client?;
        server
    })
}

/// A TCP echo server on `addr` in a namespace, serving connections one after another until
/// dropped: cheaper than [`tcp_echo`] (no thread or namespace switch per connection) when
/// many clients check the same target, e.g. a full mesh of pods. The listening socket is
/// created inside the namespace and stays there; serving it needs no namespace switch.
pub struct EchoServer {
    addr: SocketAddr,
    listener: TcpListener,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EchoServer {
    /// Binds `addr:0` in `ns` (retrying while the address is tentative) and starts serving.
    pub fn start(ns: &Netns, addr: IpAddr) -> Result<Self> {
        let deadline = Instant::now() + CHECK_DEADLINE;
        let listener = ns.run_in(|| retry_bind(deadline, || TcpListener::bind((addr, 0))))??;
        let local = listener.local_addr()?;
        let serving = listener.try_clone().context("cloning the listener")?;
        let thread = std::thread::spawn(move || {
            // Ends when `Drop` shuts the listening socket down (accept then fails).
            while let Ok((mut stream, _)) = serving.accept() {
                let _ = stream.set_read_timeout(Some(CONNECT_TIMEOUT));
                let mut buf = [0u8; 256];
                if let Ok(n) = stream.read(&mut buf) {
                    let _ = stream.write_all(&buf[..n]);
                }
            }
        });
        Ok(Self {
            addr: local,
            listener,
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: shutdown on a socket this value owns; it wakes the blocked accept().
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// From `from`, one echo exchange with each server in `targets`, one after another
/// (connect, send, read back). Returns the targets that failed, with why.
pub fn echo_each(from: &Netns, targets: &[SocketAddr]) -> Result<Vec<(SocketAddr, String)>> {
    let message = format!("ecni-mesh-{}", from.name());
    from.run_in(|| {
        let mut failed = Vec::new();
        for target in targets {
            let r = (|| -> Result<()> {
                let mut stream = TcpStream::connect_timeout(target, CONNECT_TIMEOUT)?;
                stream.set_read_timeout(Some(CONNECT_TIMEOUT))?;
                stream.write_all(message.as_bytes())?;
                let mut buf = vec![0u8; message.len()];
                stream.read_exact(&mut buf)?;
                if buf != message.as_bytes() {
                    bail!("echo mismatch: {:?}", String::from_utf8_lossy(&buf));
                }
                Ok(())
            })();
            if let Err(e) = r {
                failed.push((*target, format!("{e:#}")));
            }
        }
        failed
    })
}

/// What a connected UDP socket's next receive says after it sends `datagram` to a peer
/// that answers with an ICMP error (port unreachable: `ConnectionRefused`). Up to three
/// datagrams, each drawing its own error: the kernel's ICMP rate limits may drop one (on
/// 6.1 the budget is the whole machine's, shared with whatever else runs there; one such
/// drop timed a test out in a loaded CI guest). Only a delivered error fails the socket,
/// so a retry proves as much. Panics if an answer comes instead.
pub fn udp_error_after_send(s: &UdpSocket, datagram: &[u8]) -> std::io::Error {
    let mut buf = [0u8; 64];
    let mut err = None;
    for _ in 0..3 {
        s.send(datagram).unwrap();
        let e = s
            .recv(&mut buf)
            .expect_err("the peer answers only with an error");
        let timed_out = matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        );
        err = Some(e);
        if !timed_out {
            break;
        }
    }
    err.expect("three tries")
}
