//! A namespace's link and traffic-control changes as the kernel announces them (rtnetlink
//! multicast groups `RTMGRP_LINK` and `RTMGRP_TC`), in the kernel's own order: for tests of
//! which change an ADD makes before which.
//!
//! Decoded by hand from the kernel's headers (`linux/netlink.h`, `linux/rtnetlink.h`,
//! `linux/if_link.h`), independently of the plugin's netlink crate.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::{bail, Context as _, Result};

use crate::netns::Netns;

const RTMGRP_LINK: u32 = 0x1;
const RTMGRP_TC: u32 = 0x8;
const RTM_NEWLINK: u16 = 16;
const RTM_NEWQDISC: u16 = 36;
const RTM_NEWTFILTER: u16 = 44;
const NLMSG_HDRLEN: usize = 16;
/// `struct ifinfomsg` and `struct tcmsg`.
const IFINFO_LEN: usize = 16;
const TCMSG_LEN: usize = 20;
const TCA_KIND: u16 = 1;
const IFF_UP: u32 = 0x1;

/// One announced change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `RTM_NEWLINK`: a link was created or changed; `up` is its `IFF_UP` flag after it.
    Link { index: u32, up: bool },
    /// `RTM_NEWQDISC` of `kind` (`clsact`, …) on the link.
    Qdisc { index: u32, kind: String },
    /// `RTM_NEWTFILTER` on the link.
    Filter { index: u32 },
}

/// A `NETLINK_ROUTE` socket in the calling thread's namespace (also what the benchmark
/// sends its own requests on).
pub fn route_socket() -> Result<OwnedFd> {
    // SAFETY: plain socket(2); the descriptor is owned below.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if raw < 0 {
        return Err(std::io::Error::last_os_error()).context("a NETLINK_ROUTE socket");
    }
    // SAFETY: a descriptor just returned by socket(2), owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// A socket subscribed to a namespace's link and tc announcements from its creation on.
pub struct RtEvents {
    fd: OwnedFd,
}

impl RtEvents {
    /// Subscribes in `ns` (the socket is created there and stays there).
    pub fn subscribe(ns: &Netns) -> Result<Self> {
        ns.run_in(Self::subscribe_here)?
    }

    fn subscribe_here() -> Result<Self> {
        let fd = route_socket()?;
        // Room for every announcement of an ADD or two (a full buffer drops them).
        let size: libc::c_int = 4 << 20;
        // SAFETY: the option's value is a c_int of the size passed.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        // SAFETY: an all-zero sockaddr_nl is valid; the fields are set below.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = RTMGRP_LINK | RTMGRP_TC;
        // SAFETY: `addr` is a sockaddr_nl of the size passed.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error())
                .context("binding to RTMGRP_LINK | RTMGRP_TC");
        }
        Ok(Self { fd })
    }

    /// Every change announced since the subscription (or the last call), in order.
    pub fn drain(&self) -> Result<Vec<Event>> {
        let mut events = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            // SAFETY: `buf` is writable for its length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::WouldBlock {
                    return Ok(events);
                }
                // ENOBUFS: announcements were lost, so the order cannot be told.
                return Err(e).context("reading rtnetlink announcements");
            }
            parse(&buf[..n as usize], &mut events)?;
        }
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The messages of one datagram.
fn parse(mut b: &[u8], events: &mut Vec<Event>) -> Result<()> {
    while b.len() >= NLMSG_HDRLEN {
        let len = u32_at(b, 0) as usize;
        if len < NLMSG_HDRLEN || len > b.len() {
            bail!("a netlink message of length {len} in {} bytes", b.len());
        }
        let (msg, body) = (&b[..len], &b[NLMSG_HDRLEN..len]);
        match u16_at(msg, 4) {
            RTM_NEWLINK if body.len() >= IFINFO_LEN => events.push(Event::Link {
                index: u32_at(body, 4),
                up: u32_at(body, 8) & IFF_UP != 0,
            }),
            RTM_NEWQDISC if body.len() >= TCMSG_LEN => events.push(Event::Qdisc {
                index: u32_at(body, 4),
                kind: tc_kind(&body[TCMSG_LEN..]),
            }),
            RTM_NEWTFILTER if body.len() >= TCMSG_LEN => events.push(Event::Filter {
                index: u32_at(body, 4),
            }),
            _ => {}
        }
        b = &b[(len + 3) & !3..];
    }
    Ok(())
}

/// `TCA_KIND` among a tc message's attributes.
fn tc_kind(mut attrs: &[u8]) -> String {
    while attrs.len() >= 4 {
        let (len, kind) = (u16_at(attrs, 0) as usize, u16_at(attrs, 2));
        if len < 4 || len > attrs.len() {
            break;
        }
        if kind == TCA_KIND {
            let v = &attrs[4..len];
            return String::from_utf8_lossy(v.split(|c| *c == 0).next().unwrap_or(v)).into_owned();
        }
        attrs = &attrs[((len + 3) & !3).min(attrs.len())..];
    }
    String::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(ty: u16, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend(((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
        m.extend(ty.to_ne_bytes());
        m.extend([0u8; 10]);
        m.extend(body);
        while m.len() % 4 != 0 {
            m.push(0);
        }
        m
    }

    #[test]
    fn decodes_links_qdiscs_and_filters_in_order() {
        let mut link = vec![0u8; IFINFO_LEN];
        link[4..8].copy_from_slice(&7u32.to_ne_bytes());
        link[8..12].copy_from_slice(&(IFF_UP | 0x1000).to_ne_bytes());
        let mut qdisc = vec![0u8; TCMSG_LEN];
        qdisc[4..8].copy_from_slice(&7u32.to_ne_bytes());
        // TCA_KIND "clsact\0", padded to 12.
        qdisc.extend(11u16.to_ne_bytes());
        qdisc.extend(TCA_KIND.to_ne_bytes());
        qdisc.extend(b"clsact\0\0");
        let mut filter = vec![0u8; TCMSG_LEN];
        filter[4..8].copy_from_slice(&7u32.to_ne_bytes());
        let mut datagram = msg(RTM_NEWQDISC, &qdisc);
        datagram.extend(msg(RTM_NEWTFILTER, &filter));
        datagram.extend(msg(RTM_NEWLINK, &link));
        let mut events = Vec::new();
        parse(&datagram, &mut events).unwrap();
        assert_eq!(
            events,
            vec![
                Event::Qdisc {
                    index: 7,
                    kind: "clsact".into()
                },
                Event::Filter { index: 7 },
                Event::Link { index: 7, up: true },
            ]
        );
    }
}
