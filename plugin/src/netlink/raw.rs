//! Requests over a raw netlink socket, each answer read into one buffer and split in
//! place: the loop every netlink call shares. The hand-written ones (the address dump in
//! `addrs`, the qdisc and filter calls in `tc`, the socket closing in `sockets`) build
//! their own requests and read their own message bodies through [`exchange`], which keeps
//! one socket per protocol in the thread's own namespace and opens a fresh one under a
//! namespace guard; the typed calls of [`super::Netlink`] keep one socket per namespace.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

/// `struct nlmsghdr`'s length.
pub(super) const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
/// Room for the largest datagram a dump sends (the kernel fills up to 32 KiB).
const BUF_LEN: usize = 64 * 1024;

/// One message of an answer.
pub(super) struct Message<'a> {
    pub kind: u16,
    pub flags: u16,
    /// What follows the header.
    pub body: &'a [u8],
}

thread_local! {
    /// The sockets [`exchange`] opened in the thread's own namespace, one per protocol,
    /// with the last sequence number each used: kept for the thread's next requests there.
    static HOME_SOCKETS: RefCell<Vec<(libc::c_int, Socket, u32)>> = const { RefCell::new(Vec::new()) };
}

/// Sends `msg` on a socket of netlink `protocol` (`NETLINK_ROUTE`, `NETLINK_SOCK_DIAG`) and
/// hands every answer message to `each` (see [`Socket::exchange`]). In the thread's own
/// namespace (no namespace guard alive, see [`crate::netns::at_home`]) the socket is
/// kept for the next request of that protocol, each request numbered after the last: an
/// ADD's qdisc, filters, address dump and listener dumps share two sockets instead of
/// opening one each. Under a guard, a fresh socket of that namespace. A request that
/// fails gives its socket up (a dump cut short may have left messages unread).
pub(super) fn exchange(
    protocol: libc::c_int,
    msg: &[u8],
    what: &str,
    each: impl FnMut(Message<'_>),
) -> io::Result<()> {
    if !crate::netns::at_home() {
        return Socket::open(protocol)?.exchange(msg, what, each);
    }
    let kept = HOME_SOCKETS.with_borrow_mut(|socks| {
        socks
            .iter()
            .position(|(p, ..)| *p == protocol)
            .map(|i| socks.swap_remove(i))
    });
    let (sock, seq) = match kept {
        Some((_, sock, seq)) => (sock, seq.wrapping_add(1).max(1)),
        None => (Socket::open(protocol)?, 1),
    };
    let mut numbered = msg.to_vec();
    if let Some(field) = numbered.get_mut(8..12) {
        field.copy_from_slice(&seq.to_ne_bytes());
    }
    let res = sock.exchange(&numbered, what, each);
    if res.is_ok() {
        HOME_SOCKETS.with_borrow_mut(|socks| socks.push((protocol, sock, seq)));
    }
    res
}

/// A netlink socket of the namespace the calling thread was in when it was opened, for
/// requests one after another, each answered in full before the next is sent.
pub(super) struct Socket(OwnedFd);

impl Socket {
    pub fn open(protocol: libc::c_int) -> io::Result<Self> {
        // SAFETY: plain socket(2); the fd is owned right away.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                protocol,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// The cookie of the namespace the socket was opened in (see
    /// [`crate::netns::socket_cookie`]).
    pub fn netns_cookie(&self) -> io::Result<u64> {
        crate::netns::socket_cookie(self.0.as_fd())
    }

    /// Sends `msg` and hands every answer message to `each` until the dump's `NLMSG_DONE`
    /// or the request's acknowledgement; an error answer becomes its errno. A request
    /// that is neither a dump nor asks for an acknowledgement would have no end here: every
    /// request sets `NLM_F_DUMP` or `NLM_F_ACK`. `what` names the answer in the errors of
    /// a short or malformed one.
    pub fn exchange(
        &self,
        msg: &[u8],
        what: &str,
        mut each: impl FnMut(Message<'_>),
    ) -> io::Result<()> {
        let sock = &self.0;
        // Answers carry their request's sequence number: anything else (what a request
        // that failed half-way left unread) is not this request's.
        let seq = msg
            .get(8..12)
            .map_or(0, |b| u32::from_ne_bytes(b.try_into().expect("4 bytes")));
        // SAFETY: `msg` is a valid buffer of its length; the peer is the kernel by default.
        if unsafe { libc::send(sock.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // Not zeroed: an answer is a few hundred bytes, and zeroing the whole buffer on
        // every request touched 16 fresh pages per process (16 of an ADD's 121 page faults).
        let mut buf: Vec<u8> = Vec::with_capacity(BUF_LEN);
        loop {
            // SAFETY: `buf`'s capacity is writable for `BUF_LEN` bytes.
            let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), BUF_LEN, 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{what} ended early"),
                ));
            }
            // SAFETY: recv(2) wrote the first `n` bytes (at most `BUF_LEN`, the capacity).
            unsafe { buf.set_len(n as usize) };
            let mut msgs = buf.as_slice();
            while msgs.len() >= NLMSG_HDRLEN {
                let len = u32::from_ne_bytes(msgs[0..4].try_into().expect("4 bytes")) as usize;
                if len < NLMSG_HDRLEN || len > msgs.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("malformed message of length {len} in {what}"),
                    ));
                }
                let kind = u16::from_ne_bytes([msgs[4], msgs[5]]);
                let flags = u16::from_ne_bytes([msgs[6], msgs[7]]);
                let body = &msgs[NLMSG_HDRLEN..len];
                let theirs = u32::from_ne_bytes(msgs[8..12].try_into().expect("4 bytes"));
                if theirs != seq {
                    msgs = &msgs[align4(len).min(msgs.len())..];
                    continue;
                }
                match kind {
                    NLMSG_DONE => return Ok(()),
                    NLMSG_ERROR => {
                        let errno = body
                            .get(0..4)
                            .map(|b| i32::from_ne_bytes(b.try_into().expect("4 bytes")))
                            .unwrap_or(-libc::EIO);
                        return if errno == 0 {
                            Ok(())
                        } else {
                            Err(io::Error::from_raw_os_error(-errno))
                        };
                    }
                    _ => each(Message { kind, flags, body }),
                }
                msgs = &msgs[align4(len).min(msgs.len())..];
            }
        }
    }
}

/// Netlink's 4-byte alignment of messages and attributes.
pub(super) const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `RTM_GETLINK` of link `ifindex` (no root needed), asking for an acknowledgement.
    fn get_link(ifindex: i32) -> Vec<u8> {
        const RTM_GETLINK: u16 = 18;
        let mut m = vec![0u8; NLMSG_HDRLEN + 16];
        let len = m.len() as u32;
        m[0..4].copy_from_slice(&len.to_ne_bytes());
        m[4..6].copy_from_slice(&RTM_GETLINK.to_ne_bytes());
        m[6..8].copy_from_slice(&(0x1u16 | 0x4).to_ne_bytes());
        m[8..12].copy_from_slice(&7u32.to_ne_bytes());
        m[NLMSG_HDRLEN + 4..NLMSG_HDRLEN + 8].copy_from_slice(&ifindex.to_ne_bytes());
        m
    }

    fn kept() -> Vec<(libc::c_int, i32, u32)> {
        HOME_SOCKETS.with_borrow(|s| {
            s.iter()
                .map(|(p, sock, seq)| (*p, sock.0.as_raw_fd(), *seq))
                .collect()
        })
    }

    /// Requests in the thread's own namespace share one socket per protocol, each numbered
    /// after the last whatever number its message carried; a failed request gives the
    /// socket up, and the next one opens another.
    #[test]
    fn requests_at_home_share_a_socket_until_one_fails() {
        let mut links = 0;
        exchange(libc::NETLINK_ROUTE, &get_link(1), "lo", |_| links += 1).unwrap();
        let first = kept();
        assert_eq!(first.len(), 1, "{first:?}");
        assert_eq!((first[0].0, first[0].2), (libc::NETLINK_ROUTE, 1));
        exchange(libc::NETLINK_ROUTE, &get_link(1), "lo", |_| links += 1).unwrap();
        let second = kept();
        assert_eq!(second.len(), 1, "{second:?}");
        assert_eq!(second[0].1, first[0].1, "the same socket");
        assert_eq!(second[0].2, 2, "numbered after the first");
        assert_eq!(links, 2, "each answer read whole, once");
        let gone = exchange(libc::NETLINK_ROUTE, &get_link(i32::MAX), "none", |_| {});
        assert_eq!(gone.unwrap_err().raw_os_error(), Some(libc::ENODEV));
        assert!(kept().is_empty(), "a failed request gives its socket up");
        exchange(libc::NETLINK_ROUTE, &get_link(1), "lo", |_| {}).unwrap();
        assert_eq!(kept().len(), 1);
    }
}
