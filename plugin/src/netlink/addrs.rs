//! The node's global addresses, read by one `RTM_GETADDR` dump parsed in place.
//!
//! Every dual-stack pod's host veth carries its IPv6 gateway and a link-local address (and
//! a pod attached by an earlier release its IPv4 gateway), so on a node with thousands of
//! pods the dump can hold thousands of messages while the answer is a handful of addresses. rtnetlink decodes each message into owned attribute lists and
//! passes it through a channel: about 6 ms for 2,500 pods on this machine, the largest
//! part of an ADD there. Here the messages are read into one buffer and only the header
//! and the address attributes are looked at (the kernel's own share is about 1.5 ms).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::raw::{self, align4, NLMSG_HDRLEN};

const IFADDRMSG_LEN: usize = 8;
const RTM_NEWADDR: u16 = 20;
const RTM_GETADDR: u16 = 22;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_DUMP_INTR: u16 = 0x10;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RT_SCOPE_UNIVERSE: u8 = 0;
/// A dump that the kernel marks as interrupted (addresses changed meanwhile) is retried.
const ATTEMPTS: usize = 3;

/// Every address of global scope in the calling thread's network namespace, with its
/// link's index (`IFA_LOCAL` on point-to-point links, `IFA_ADDRESS` otherwise).
pub fn global_addresses() -> io::Result<Vec<(u32, IpAddr)>> {
    for _ in 1..ATTEMPTS {
        if let Some(v) = dump_once()? {
            return Ok(v);
        }
    }
    dump_once()?.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::Interrupted,
            "the address dump was interrupted by concurrent changes every time",
        )
    })
}

/// One dump; `None` when the kernel flagged it as interrupted.
fn dump_once() -> io::Result<Option<Vec<(u32, IpAddr)>>> {
    let mut req = [0u8; NLMSG_HDRLEN + IFADDRMSG_LEN];
    req[0..4].copy_from_slice(&((NLMSG_HDRLEN + IFADDRMSG_LEN) as u32).to_ne_bytes());
    req[4..6].copy_from_slice(&RTM_GETADDR.to_ne_bytes());
    req[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    // pid 0 (the kernel), ifaddrmsg all zero: AF_UNSPEC, every link.
    let mut out = Vec::new();
    let mut interrupted = false;
    raw::exchange(libc::NETLINK_ROUTE, &req, "the address dump", |m| {
        interrupted |= m.flags & NLM_F_DUMP_INTR != 0;
        if m.kind == RTM_NEWADDR {
            out.extend(parse_address(m.body));
        }
    })?;
    Ok((!interrupted).then_some(out))
}

/// (link index, address) of one `RTM_NEWADDR` body of global scope.
fn parse_address(body: &[u8]) -> Option<(u32, IpAddr)> {
    if body.len() < IFADDRMSG_LEN {
        return None;
    }
    let family = i32::from(body[0]);
    let scope = body[3];
    let index = u32::from_ne_bytes(body[4..8].try_into().ok()?);
    if scope != RT_SCOPE_UNIVERSE {
        return None;
    }
    let (mut local, mut address) = (None, None);
    let mut attrs = &body[IFADDRMSG_LEN..];
    while attrs.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([attrs[0], attrs[1]]));
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]);
        if len < 4 || len > attrs.len() {
            break;
        }
        let payload = &attrs[4..len];
        let ip = match (family, payload.len()) {
            (libc::AF_INET, 4) => Some(IpAddr::V4(Ipv4Addr::from(
                <[u8; 4]>::try_from(payload).ok()?,
            ))),
            (libc::AF_INET6, 16) => Some(IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(payload).ok()?,
            ))),
            _ => None,
        };
        match kind {
            IFA_LOCAL => local = ip,
            IFA_ADDRESS => address = ip,
            _ => {}
        }
        attrs = &attrs[align4(len).min(attrs.len())..];
    }
    Some((index, local.or(address)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = ((4 + payload.len()) as u16).to_ne_bytes().to_vec();
        v.extend_from_slice(&kind.to_ne_bytes());
        v.extend_from_slice(payload);
        while !v.len().is_multiple_of(4) {
            v.push(0);
        }
        v
    }

    fn body(family: u8, scope: u8, index: u32, attrs: &[Vec<u8>]) -> Vec<u8> {
        let mut v = vec![family, 32, 0, scope];
        v.extend_from_slice(&index.to_ne_bytes());
        for a in attrs {
            v.extend_from_slice(a);
        }
        v
    }

    #[test]
    fn local_wins_over_address_and_scopes_filter() {
        let b = body(
            libc::AF_INET as u8,
            RT_SCOPE_UNIVERSE,
            7,
            &[
                attr(IFA_ADDRESS, &[10, 0, 0, 2]),
                attr(IFA_LOCAL, &[10, 0, 0, 1]),
                attr(3, b"eth0\0"),
            ],
        );
        assert_eq!(
            parse_address(&b),
            Some((7, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))))
        );
        let v6: Ipv6Addr = "fd00::5".parse().unwrap();
        let b = body(
            libc::AF_INET6 as u8,
            RT_SCOPE_UNIVERSE,
            3,
            &[attr(IFA_ADDRESS, &v6.octets())],
        );
        assert_eq!(parse_address(&b), Some((3, IpAddr::V6(v6))));
        // Link scope (an IPv6 link-local address): not a node address.
        let b = body(
            libc::AF_INET6 as u8,
            253,
            3,
            &[attr(IFA_ADDRESS, &v6.octets())],
        );
        assert_eq!(parse_address(&b), None);
        // Truncated attributes end the walk instead of reading past the message.
        let mut b = body(libc::AF_INET as u8, 0, 1, &[attr(IFA_LOCAL, &[1, 2, 3, 4])]);
        b.truncate(b.len() - 2);
        assert_eq!(parse_address(&b), None);
    }
}
