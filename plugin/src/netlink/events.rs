//! The node's link and address changes as the kernel announces them: a netlink socket in
//! the rtnetlink multicast groups of links and of IPv4 and IPv6 addresses (`ebpf-cni
//! agent` converges the node on them). What the messages say is not parsed: any of them
//! means "look again", and a lost one (the socket's buffer overflowed) means the same.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// `RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR` (linux/rtnetlink.h).
const GROUPS: u32 = 0x1 | 0x10 | 0x100;
/// Room for a burst of announcements (a node creating many pods at once).
const RCVBUF: libc::c_int = 4 << 20;

pub struct Events {
    sock: OwnedFd,
}

impl Events {
    /// Joins the groups in the calling thread's network namespace.
    pub fn subscribe() -> io::Result<Self> {
        // SAFETY: plain socket(2); the fd is owned right away.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero sockaddr_nl is valid; the fields are set below.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = GROUPS;
        // SAFETY: `addr` is a sockaddr_nl of the length given.
        let bound = unsafe {
            libc::bind(
                sock.as_raw_fd(),
                std::ptr::addr_of!(addr).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if bound != 0 {
            return Err(io::Error::last_os_error());
        }
        // Best effort: a smaller buffer only overflows sooner, which is seen.
        let rcvbuf = RCVBUF;
        // SAFETY: setsockopt with an int option of its size.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                std::ptr::addr_of!(rcvbuf).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        Ok(Self { sock })
    }

    /// Waits up to `timeout` for an announcement; `true` if one came.
    pub fn wait(&self, timeout: Duration) -> io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        loop {
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n >= 0 {
                return Ok(n > 0);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Reads and drops every announcement waiting; how many (a lost batch counts one).
    pub fn drain(&self) -> io::Result<usize> {
        let mut buf = vec![0u8; 64 * 1024];
        let mut n = 0;
        loop {
            // SAFETY: `buf` is writable for its length.
            let r =
                unsafe { libc::recv(self.sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if r >= 0 {
                n += 1;
                continue;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) => return Ok(n),
                Some(libc::EINTR) => {}
                // The kernel dropped announcements: something changed.
                Some(libc::ENOBUFS) => n += 1,
                _ => return Err(e),
            }
        }
    }
}
