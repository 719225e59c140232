//! The node's own connected sockets towards a pod that is going away, closed by the
//! kernel (`SOCK_DESTROY` over `NETLINK_SOCK_DIAG`, as `ss -K` does); and the node's
//! listeners, which ADD warns about when a host port takes their traffic.
//!
//! The socket programs translate a host port at `connect()`: from then on a connected
//! socket of the node sends to the pod's address itself. When that pod is deleted, the
//! socket would keep sending there (UDP: into nothing, for as long as the process keeps
//! it; TCP: retransmitting until it times out), even after another pod or a process of
//! the node took the host port. Destroying it makes its next call fail (TCP:
//! `ECONNABORTED`; UDP: the socket is disconnected, so a send fails with `EDESTADDRREQ` and
//! a receive with `ECONNABORTED`), so its owner connects again and reaches the port's new
//! owner. Needs
//! `CONFIG_INET_DIAG_DESTROY` and the protocol's diag module (Debian's kernels have both);
//! the calls act on the calling thread's network namespace.

use super::raw::{self, NLMSG_HDRLEN};
use std::io;
use std::net::IpAddr;

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
/// `struct inet_diag_sockid`: ports, two 16-byte addresses, interface, cookie.
const SOCKID_LEN: usize = 48;
/// `struct inet_diag_req_v2`: family, protocol, ext, pad, states, then the socket id.
const REQ_LEN: usize = 8 + SOCKID_LEN;
/// TCP states a socket talking to a peer is in (`TCP_ESTABLISHED` .. `TCP_CLOSE_WAIT`,
/// `TCP_SYN_SENT`); a connected UDP socket is `TCP_ESTABLISHED`.
const CONNECTED_STATES: u32 = (1 << 1) | (1 << 2) | (1 << 3) | (1 << 4) | (1 << 5) | (1 << 8);
/// `TCP_LISTEN`: a listening TCP socket.
const LISTEN_STATE: u32 = 1 << 10;
/// `TCP_CLOSE`: an unconnected UDP socket, which receives from anyone.
const UNCONNECTED_STATE: u32 = 1 << 7;

/// The calling namespace's sockets of `protocol` (`IPPROTO_TCP` or `IPPROTO_UDP`) and
/// `family` (`AF_INET`, `AF_INET6`) that receive from anyone: listening TCP sockets,
/// unconnected UDP ones; each as its local address and port (IPv6 addresses as they are,
/// IPv4-mapped ones included).
///
/// A dump of the listening state only: the kernel walks its listening hash and skips the
/// established one, whose walk (reading `/proc/net/tcp`) costs milliseconds on a machine
/// with a large hash, whatever the namespace holds.
pub fn listeners(protocol: u8, family: u8) -> io::Result<Vec<(IpAddr, u16)>> {
    let states = if protocol == libc::IPPROTO_TCP as u8 {
        LISTEN_STATE
    } else {
        UNCONNECTED_STATE
    };
    let mut out = Vec::new();
    let dump = request_in(
        SOCK_DIAG_BY_FAMILY,
        NLM_F_DUMP,
        family,
        protocol,
        states,
        None,
    );
    exchange(&dump, |kind, body| {
        // `struct inet_diag_msg`: family, state, timer, retrans, then the socket id
        // (source port, destination port, source address, ...).
        if kind != SOCK_DIAG_BY_FAMILY || body.len() < 4 + SOCKID_LEN {
            return;
        }
        let id = &body[4..4 + SOCKID_LEN];
        let port = u16::from_be_bytes([id[0], id[1]]);
        let addr = if body[0] == libc::AF_INET as u8 {
            IpAddr::from(<[u8; 4]>::try_from(&id[4..8]).expect("4 bytes"))
        } else {
            IpAddr::from(<[u8; 16]>::try_from(&id[4..20]).expect("16 bytes"))
        };
        out.push((addr, port));
    })?;
    Ok(out)
}

/// Destroys the calling namespace's sockets of `protocol` (`IPPROTO_TCP` or `IPPROTO_UDP`)
/// connected to `addr:port` (IPv6 sockets connected to an IPv4-mapped `addr` included).
/// Returns how many it destroyed.
pub fn destroy_connected(protocol: u8, addr: IpAddr, port: u16) -> io::Result<usize> {
    let mut n = 0;
    let mapped = match addr {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    };
    let families: &[(u8, [u8; 16])] = match addr {
        IpAddr::V4(v4) => {
            let mut a = [0u8; 16];
            a[..4].copy_from_slice(&v4.octets());
            &[(libc::AF_INET as u8, a), (libc::AF_INET6 as u8, mapped)]
        }
        IpAddr::V6(_) => &[(libc::AF_INET6 as u8, mapped)],
    };
    for &(family, dst) in families {
        let mut found: Vec<[u8; SOCKID_LEN]> = Vec::new();
        let dump = request(SOCK_DIAG_BY_FAMILY, NLM_F_DUMP, family, protocol, None);
        exchange(&dump, |kind, body| {
            // `struct inet_diag_msg`: family, state, timer, retrans, then the socket id.
            if kind != SOCK_DIAG_BY_FAMILY || body.len() < 4 + SOCKID_LEN {
                return;
            }
            let id: [u8; SOCKID_LEN] = body[4..4 + SOCKID_LEN].try_into().expect("48 bytes");
            if u16::from_be_bytes([id[2], id[3]]) == port && id[20..36] == dst {
                found.push(id);
            }
        })?;
        for id in found {
            let msg = request(SOCK_DESTROY, NLM_F_ACK, family, protocol, Some(&id));
            match exchange(&msg, |_, _| {}) {
                Ok(()) => n += 1,
                // Closed meanwhile.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(n)
}

/// A sock_diag request: the netlink header and an `inet_diag_req_v2` for connected sockets
/// of `family` and `protocol`, naming socket `id` (all zero for a dump).
fn request(
    kind: u16,
    flags: u16,
    family: u8,
    protocol: u8,
    id: Option<&[u8; SOCKID_LEN]>,
) -> Vec<u8> {
    request_in(kind, flags, family, protocol, CONNECTED_STATES, id)
}

/// [`request`] for sockets in `states` (a bit per TCP state).
fn request_in(
    kind: u16,
    flags: u16,
    family: u8,
    protocol: u8,
    states: u32,
    id: Option<&[u8; SOCKID_LEN]>,
) -> Vec<u8> {
    let len = NLMSG_HDRLEN + REQ_LEN;
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&[family, protocol, 0, 0]);
    m.extend_from_slice(&states.to_ne_bytes());
    m.extend_from_slice(id.unwrap_or(&[0; SOCKID_LEN]));
    m
}

/// Sends `msg` and hands each answer message to `each` until the dump ends or the ack comes.
fn exchange(msg: &[u8], mut each: impl FnMut(u16, &[u8])) -> io::Result<()> {
    raw::exchange(libc::NETLINK_SOCK_DIAG, msg, "the sock_diag answer", |m| {
        each(m.kind, m.body)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_the_kernels_layout() {
        let id = [7u8; SOCKID_LEN];
        let m = request(SOCK_DESTROY, NLM_F_ACK, libc::AF_INET as u8, 17, Some(&id));
        assert_eq!(m.len(), 16 + 56);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 72);
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), SOCK_DESTROY);
        assert_eq!(u16::from_ne_bytes([m[6], m[7]]), NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(&m[16..20], &[libc::AF_INET as u8, 17, 0, 0]);
        assert_eq!(&m[24..], &id);
    }
}
