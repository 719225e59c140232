//! Traffic that claims a source other than the sender's own, for the source check's tests,
//! and what arrives of it: UDP datagrams sent from an address the sender put on its
//! interface, and ARP requests built by hand on a raw socket (a sender address that is not
//! the sender's). Every wait is bounded: "nothing arrived" is a result, not a hang.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::netns::Netns;

/// Datagrams are re-sent this often while the receiver waits.
const RESEND: Duration = Duration::from_millis(50);

/// UDP from `src` in `from` (an address on one of its interfaces, the sender's own or
/// not) to `dst` in `to`, re-sent for up to `bound`: the source addresses of the datagrams
/// that arrived (empty: none did). Stops at the first one that arrives.
pub fn udp_arrivals(
    from: &Netns,
    src: IpAddr,
    to: &Netns,
    dst: IpAddr,
    bound: Duration,
) -> Result<Vec<IpAddr>> {
    let deadline = Instant::now() + bound;
    let done_flag = AtomicBool::new(false);
    let done = &done_flag;
    let message = format!("ecni-spoof-{}-{src}", from.name());
    let message = message.as_bytes();
    std::thread::scope(|s| {
        let (ready_tx, ready_rx) = mpsc::channel::<Result<SocketAddr>>();
        let server = s.spawn(move || -> Result<Vec<IpAddr>> {
            let _g = to.enter()?;
            let sock = match UdpSocket::bind((dst, 0)).context("receiver bind") {
                Ok(s) => s,
                Err(e) => {
                    let _ = ready_tx.send(Err(anyhow!("{e:#}")));
                    return Err(e);
                }
            };
            sock.set_read_timeout(Some(Duration::from_millis(50)))?;
            let _ = ready_tx.send(Ok(sock.local_addr()?));
            let mut seen = Vec::new();
            let mut buf = [0u8; 256];
            while Instant::now() < deadline && seen.is_empty() {
                match sock.recv_from(&mut buf) {
                    Ok((n, peer)) if &buf[..n] == message => seen.push(peer.ip()),
                    Ok(_) => {}
                    // A signal to the process (a traced test's helper, a child's exit)
                    // may interrupt the wait (one did, in CI): wait again.
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock
                                | std::io::ErrorKind::TimedOut
                                | std::io::ErrorKind::Interrupted
                        ) => {}
                    Err(e) => return Err(e).context("receiver recv"),
                }
            }
            done.store(true, Ordering::Relaxed);
            Ok(seen)
        });
        let client = (|| -> Result<()> {
            let target = ready_rx
                .recv_timeout(bound)
                .map_err(|_| anyhow!("receiver thread never got ready"))??;
            let _g = from.enter()?;
            let sock = UdpSocket::bind((src, 0))
                .with_context(|| format!("binding the sender to {src} in {}", from.name()))?;
            while !done.load(Ordering::Relaxed) && Instant::now() < deadline {
                // Errors (no route, an ICMP error reported on the socket) mean "resend".
                let _ = sock.send_to(message, target);
                std::thread::sleep(RESEND);
            }
            Ok(())
        })();
        done.store(true, Ordering::Relaxed);
        let server = server
            .join()
            .map_err(|_| anyhow!("receiver thread panicked"))?;
        client?;
        server
    })
}

/// [`udp_arrivals`] that must arrive, from `src` as sent.
pub fn assert_udp_arrives(from: &Netns, src: IpAddr, to: &Netns, dst: IpAddr) {
    let seen = udp_arrivals(from, src, to, dst, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("UDP {src} -> {dst}: {e:#}"));
    assert_eq!(
        seen,
        vec![src],
        "UDP from {src} ({}) to {dst} ({}) must arrive with its source",
        from.name(),
        to.name()
    );
}

/// [`udp_arrivals`] that must not arrive within `bound`.
pub fn assert_udp_blocked(from: &Netns, src: IpAddr, to: &Netns, dst: IpAddr, bound: Duration) {
    let seen = udp_arrivals(from, src, to, dst, bound)
        .unwrap_or_else(|e| panic!("UDP {src} -> {dst}: {e:#}"));
    assert!(
        seen.is_empty(),
        "UDP from {src} ({}) to {dst} ({}) arrived with source {seen:?}: a pod sent with an \
         address not its own",
        from.name(),
        to.name()
    );
}

const ETH_P_ARP: u16 = 0x0806;

/// An ARP request on a raw socket of `ifname` in `ns`, "who has `tpa`? tell `spa` at
/// `sha`", broadcast from `sha`: the sender MAC of the first reply for `tpa` addressed to
/// `spa` within `bound`, or `None`.
pub fn arp_ask(
    ns: &Netns,
    ifname: &str,
    sha: [u8; 6],
    spa: Ipv4Addr,
    tpa: Ipv4Addr,
    bound: Duration,
) -> Result<Option<[u8; 6]>> {
    let ifname = ifname.to_owned();
    ns.run_in(move || -> Result<Option<[u8; 6]>> {
        let ifindex = nix::net::if_::if_nametoindex(ifname.as_str())
            .with_context(|| format!("ifindex of {ifname}"))?;
        // SAFETY: plain syscall; the fd is owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW,
                i32::from(ETH_P_ARP.to_be()),
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("AF_PACKET socket");
        }
        // SAFETY: a fresh fd this function owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero sockaddr_ll is valid; the fields are set below.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = ETH_P_ARP.to_be();
        sll.sll_ifindex = ifindex as i32;
        sll.sll_halen = 6;
        sll.sll_addr[..6].copy_from_slice(&[0xff; 6]);
        let sll_len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
        // SAFETY: `sll` is a valid sockaddr_ll of the size passed.
        if unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                sll_len,
            )
        } != 0
        {
            return Err(std::io::Error::last_os_error()).context("binding the raw socket");
        }
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        // SAFETY: a valid timeval of the size passed.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        let mut frame = Vec::with_capacity(42);
        frame.extend_from_slice(&[0xff; 6]);
        frame.extend_from_slice(&sha);
        frame.extend_from_slice(&ETH_P_ARP.to_be_bytes());
        frame.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
        frame.extend_from_slice(&sha);
        frame.extend_from_slice(&spa.octets());
        frame.extend_from_slice(&[0; 6]);
        frame.extend_from_slice(&tpa.octets());
        let deadline = Instant::now() + bound;
        let mut next_send = Instant::now();
        let mut buf = [0u8; 1600];
        while Instant::now() < deadline {
            if Instant::now() >= next_send {
                // SAFETY: `frame` and `sll` are valid for the sizes passed.
                let n = unsafe {
                    libc::sendto(
                        fd.as_raw_fd(),
                        frame.as_ptr().cast(),
                        frame.len(),
                        0,
                        (&sll as *const libc::sockaddr_ll).cast(),
                        sll_len,
                    )
                };
                if n < 0 {
                    bail!(
                        "sending the ARP request: {}",
                        std::io::Error::last_os_error()
                    );
                }
                next_send = Instant::now() + Duration::from_millis(200);
            }
            // SAFETY: `buf` is writable for its length.
            let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 42 {
                continue;
            }
            let f = &buf[..n as usize];
            // A reply (op 2) from tpa, addressed to spa.
            if f[12..14] == ETH_P_ARP.to_be_bytes()
                && f[20..22] == [0, 2]
                && f[28..32] == tpa.octets()
                && f[38..42] == spa.octets()
            {
                let mut mac = [0u8; 6];
                mac.copy_from_slice(&f[22..28]);
                return Ok(Some(mac));
            }
        }
        Ok(None)
    })?
}

/// The MAC of `ifname` in `ns`.
pub fn mac_of(ns: &Netns, ifname: &str) -> Result<[u8; 6]> {
    let out = ns.ip_ok(&["-j", "link", "show", "dev", ifname])?;
    let v: serde_json::Value = serde_json::from_str(&out).context("ip -j link")?;
    let s = v[0]["address"]
        .as_str()
        .ok_or_else(|| anyhow!("{ifname} has no address: {out}"))?;
    let mut mac = [0u8; 6];
    for (i, p) in s.split(':').enumerate().take(6) {
        mac[i] = u8::from_str_radix(p, 16).with_context(|| format!("MAC {s}"))?;
    }
    Ok(mac)
}
