//! The `clsact` qdisc of a device over one synchronous netlink request each: adding it while
//! telling whether it was there already, counting the filters on its two hooks, deleting it.
//!
//! A node device's `clsact` is shared with every other tc user of the node, so ebpf-cni
//! only ever removes one it created itself and that holds no filter of anyone. That check
//! and the removal run in the dataplane's synchronous teardown, under its node lock, where
//! the async rtnetlink handle cannot be used; aya's helpers neither tell "created" from
//! "already there" nor list filters or delete a qdisc. The calls act on the calling
//! thread's network namespace.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const NLMSG_HDRLEN: usize = 16;
const TCMSG_LEN: usize = 20;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const RTM_NEWQDISC: u16 = 36;
const RTM_DELQDISC: u16 = 37;
const RTM_NEWTFILTER: u16 = 44;
const RTM_GETTFILTER: u16 = 46;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_DUMP: u16 = 0x300;
const TCA_KIND: u16 = 1;
/// `TC_H_CLSACT` (the same value as `TC_H_INGRESS`): the parent of the clsact qdisc.
const TC_H_CLSACT: u32 = 0xffff_fff1;
/// The clsact qdisc's own handle, `ffff:`.
const CLSACT_HANDLE: u32 = 0xffff_0000;
/// `TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS / TC_H_MIN_EGRESS)`: the parents of its filters.
const CLSACT_INGRESS: u32 = 0xffff_fff2;
const CLSACT_EGRESS: u32 = 0xffff_fff3;
const KIND: &[u8] = b"clsact\0";

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Adds a `clsact` qdisc to link `ifindex`. `Ok(false)`: the link had one already (or an
/// `ingress` qdisc, which takes the same place), so it is not ours.
pub fn add_clsact(ifindex: u32) -> io::Result<bool> {
    let msg = message(
        RTM_NEWQDISC,
        NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        ifindex,
        CLSACT_HANDLE,
        TC_H_CLSACT,
        true,
    );
    match request(&msg, |_, _| {}) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
        Err(e) => Err(e),
    }
}

/// How many filters (of any kind and owner) the `clsact` of link `ifindex` holds on both
/// hooks together; 0 without a `clsact`.
pub fn clsact_filter_count(ifindex: u32) -> io::Result<usize> {
    let mut n = 0;
    for parent in [CLSACT_INGRESS, CLSACT_EGRESS] {
        let msg = message(RTM_GETTFILTER, NLM_F_DUMP, ifindex, 0, parent, false);
        request(&msg, |kind, _| n += usize::from(kind == RTM_NEWTFILTER))?;
    }
    Ok(n)
}

/// Deletes the `clsact` qdisc of link `ifindex` (with whatever filters it holds).
/// `Ok(false)`: the link has none (or has an `ingress` qdisc, which is left alone).
pub fn delete_clsact(ifindex: u32) -> io::Result<bool> {
    let msg = message(
        RTM_DELQDISC,
        NLM_F_ACK,
        ifindex,
        CLSACT_HANDLE,
        TC_H_CLSACT,
        true,
    );
    match request(&msg, |_, _| {}) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EINVAL)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// One `tcmsg` request, with `TCA_KIND "clsact"` when `kind` is set (the kernel then
/// refuses to act on a qdisc of another kind).
fn message(
    msg_type: u16,
    flags: u16,
    ifindex: u32,
    handle: u32,
    parent: u32,
    kind: bool,
) -> Vec<u8> {
    let mut m = vec![0u8; NLMSG_HDRLEN + TCMSG_LEN];
    m[4..6].copy_from_slice(&msg_type.to_ne_bytes());
    m[6..8].copy_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
    m[8..12].copy_from_slice(&1u32.to_ne_bytes());
    // tcmsg: family AF_UNSPEC and padding stay 0.
    let t = NLMSG_HDRLEN;
    m[t + 4..t + 8].copy_from_slice(&ifindex.to_ne_bytes());
    m[t + 8..t + 12].copy_from_slice(&handle.to_ne_bytes());
    m[t + 12..t + 16].copy_from_slice(&parent.to_ne_bytes());
    if kind {
        m.extend_from_slice(&((4 + KIND.len()) as u16).to_ne_bytes());
        m.extend_from_slice(&TCA_KIND.to_ne_bytes());
        m.extend_from_slice(KIND);
        m.resize(align4(m.len()), 0);
    }
    let len = m.len() as u32;
    m[0..4].copy_from_slice(&len.to_ne_bytes());
    m
}

/// Sends `msg` and reads until its ACK or the end of its dump, passing every other message
/// (type and body) to `each`; an error answer becomes its errno.
fn request(msg: &[u8], mut each: impl FnMut(u16, &[u8])) -> io::Result<()> {
    // SAFETY: plain socket(2); the fd is owned right away.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `msg` is a valid buffer of its length; the peer is the kernel by default.
    if unsafe { libc::send(sock.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
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
                "netlink answer ended early",
            ));
        }
        let mut msgs = &buf[..n as usize];
        while msgs.len() >= NLMSG_HDRLEN {
            let len = u32::from_ne_bytes(msgs[0..4].try_into().expect("4 bytes")) as usize;
            if len < NLMSG_HDRLEN || len > msgs.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("malformed netlink message of length {len}"),
                ));
            }
            let kind = u16::from_ne_bytes([msgs[4], msgs[5]]);
            let body = &msgs[NLMSG_HDRLEN..len];
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
                _ => each(kind, body),
            }
            msgs = &msgs[align4(len).min(msgs.len())..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qdisc_request_names_clsact_and_its_handle() {
        let m = message(RTM_DELQDISC, NLM_F_ACK, 7, CLSACT_HANDLE, TC_H_CLSACT, true);
        assert_eq!(m.len(), NLMSG_HDRLEN + TCMSG_LEN + 12);
        assert_eq!(
            u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize,
            m.len()
        );
        let t = NLMSG_HDRLEN;
        assert_eq!(u32::from_ne_bytes(m[t + 4..t + 8].try_into().unwrap()), 7);
        assert_eq!(
            u32::from_ne_bytes(m[t + 12..t + 16].try_into().unwrap()),
            TC_H_CLSACT
        );
        assert_eq!(&m[t + TCMSG_LEN + 4..t + TCMSG_LEN + 11], b"clsact\0");
    }
}
