//! Qdiscs over one synchronous netlink request each. The `clsact` qdisc of a device: adding
//! it while telling whether it was there already, counting the filters on its two hooks,
//! deleting it. The root `fq` of a paced pod's host veth: adding it with ebpf-cni's handle,
//! reading a device's root qdisc, deleting the `fq` with that handle.
//!
//! A node device's `clsact` is shared with every other tc user of the node, so ebpf-cni
//! only ever removes one it created itself and that holds no filter of anyone. That check
//! and the removal run in the dataplane's synchronous teardown, under its node lock, where
//! the async rtnetlink handle cannot be used; aya's helpers neither tell "created" from
//! "already there" nor list filters or delete a qdisc. The calls act on the calling
//! thread's network namespace.

use super::raw::{self, align4, NLMSG_HDRLEN};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

const TCMSG_LEN: usize = 20;
const RTM_NEWQDISC: u16 = 36;
const RTM_DELQDISC: u16 = 37;
const RTM_GETQDISC: u16 = 38;
const RTM_NEWTFILTER: u16 = 44;
const RTM_GETTFILTER: u16 = 46;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_ECHO: u16 = 0x8;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_DUMP: u16 = 0x300;
const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;
const NLA_F_NESTED: u16 = 0x8000;
/// fq's `TCA_FQ_PLIMIT` and `TCA_FQ_FLOW_PLIMIT`: its packet limits, total and per flow.
const TCA_FQ_PLIMIT: u16 = 1;
const TCA_FQ_FLOW_PLIMIT: u16 = 2;
/// The packet limits of ebpf-cni's fq, total and per flow. The pacer's horizon is what
/// bounds the queue; fq's own per-flow limit (100 by default) would drop packets the pacer
/// has already given a departure slot, and each such slot would go unused.
const FQ_PACKET_LIMIT: u32 = 10_000;
/// `TC_H_CLSACT` (the same value as `TC_H_INGRESS`): the parent of the clsact qdisc.
const TC_H_CLSACT: u32 = 0xffff_fff1;
/// The clsact qdisc's own handle, `ffff:`.
const CLSACT_HANDLE: u32 = 0xffff_0000;
/// `TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS / TC_H_MIN_EGRESS)`: the parents of its filters.
const CLSACT_INGRESS: u32 = 0xffff_fff2;
const CLSACT_EGRESS: u32 = 0xffff_fff3;
const CLSACT: &[u8] = b"clsact\0";
const BPF: &[u8] = b"bpf\0";
/// The `bpf` classifier's options: the program's fd, its name, and its flags.
const TCA_BPF_FD: u16 = 6;
const TCA_BPF_NAME: u16 = 7;
const TCA_BPF_FLAGS: u16 = 8;
/// The program's return value is the action (`TC_ACT_*`).
const TCA_BPF_FLAG_ACT_DIRECT: u32 = 1;
const ETH_P_ALL: u16 = 0x0003;
const FQ: &[u8] = b"fq\0";
/// `TC_H_ROOT`: the parent of a device's root qdisc.
const TC_H_ROOT: u32 = 0xffff_ffff;

/// Adds a `clsact` qdisc to link `ifindex`. `Ok(false)`: the link had one already (or an
/// `ingress` qdisc, which takes the same place), so it is not ours.
pub fn add_clsact(ifindex: u32) -> io::Result<bool> {
    let msg = message(
        RTM_NEWQDISC,
        NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        ifindex,
        CLSACT_HANDLE,
        TC_H_CLSACT,
        Some(CLSACT),
    );
    match request(&msg, |_, _| {}) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Attaches the program `prog` (an fd) to link `ifindex`'s `clsact` (ingress or egress) as
/// a direct-action `bpf` filter named `name`, at a priority the kernel picks (as aya's
/// netlink attach does, so `detach_netlink`, CHECK and inspect find it by that name).
pub fn add_bpf_filter(
    ifindex: u32,
    ingress: bool,
    prog: BorrowedFd<'_>,
    name: &str,
) -> io::Result<()> {
    let parent = if ingress {
        CLSACT_INGRESS
    } else {
        CLSACT_EGRESS
    };
    let mut msg = message(
        RTM_NEWTFILTER,
        NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        ifindex,
        0,
        parent,
        Some(BPF),
    );
    // tcm_info: priority 0 (the kernel picks one) and every protocol, in network order.
    let t = NLMSG_HDRLEN;
    msg[t + 16..t + 20].copy_from_slice(&u32::from(ETH_P_ALL.to_be()).to_ne_bytes());
    let mut name_z = name.as_bytes().to_vec();
    name_z.push(0);
    let fd = u32::try_from(prog.as_raw_fd()).map_err(io::Error::other)?;
    let mut options = attr(TCA_BPF_FD, &fd.to_ne_bytes());
    options.extend(attr(TCA_BPF_NAME, &name_z));
    options.extend(attr(TCA_BPF_FLAGS, &TCA_BPF_FLAG_ACT_DIRECT.to_ne_bytes()));
    msg.extend(attr(TCA_OPTIONS | NLA_F_NESTED, &options));
    let len = msg.len() as u32;
    msg[0..4].copy_from_slice(&len.to_ne_bytes());
    request(&msg, |_, _| {})
}

/// How many filters (of any kind and owner) the `clsact` of link `ifindex` holds on both
/// hooks together; 0 without a `clsact`.
pub fn clsact_filter_count(ifindex: u32) -> io::Result<usize> {
    let mut n = 0;
    for parent in [CLSACT_INGRESS, CLSACT_EGRESS] {
        let msg = message(RTM_GETTFILTER, NLM_F_DUMP, ifindex, 0, parent, None);
        request(&msg, |kind, _| n += usize::from(kind == RTM_NEWTFILTER))?;
    }
    Ok(n)
}

/// The program names of the `bpf` filters on both hooks of link `ifindex`'s `clsact`
/// (each as `(ingress, name)`); none without a `clsact`.
pub fn bpf_filter_names(ifindex: u32) -> io::Result<Vec<(bool, String)>> {
    /// `TCA_BPF_NAME` inside a `bpf` filter's `TCA_OPTIONS` (linux/pkt_cls.h).
    const TCA_BPF_NAME: u16 = 7;
    fn attrs(mut b: &[u8], mut each: impl FnMut(u16, &[u8])) {
        while b.len() >= 4 {
            let len = usize::from(u16::from_ne_bytes([b[0], b[1]]));
            let ty = u16::from_ne_bytes([b[2], b[3]]) & !NLA_F_NESTED;
            if len < 4 || len > b.len() {
                break;
            }
            each(ty, &b[4..len]);
            b = &b[align4(len).min(b.len())..];
        }
    }
    let mut out = Vec::new();
    for (ingress, parent) in [(true, CLSACT_INGRESS), (false, CLSACT_EGRESS)] {
        let msg = message(RTM_GETTFILTER, NLM_F_DUMP, ifindex, 0, parent, None);
        let res = request(&msg, |kind, body| {
            if kind != RTM_NEWTFILTER || body.len() < TCMSG_LEN {
                return;
            }
            attrs(&body[TCMSG_LEN..], |ty, v| {
                if ty == TCA_OPTIONS {
                    attrs(v, |ty, v| {
                        if ty == TCA_BPF_NAME {
                            let name = v.split(|b| *b == 0).next().unwrap_or_default();
                            out.push((ingress, String::from_utf8_lossy(name).into_owned()));
                        }
                    });
                }
            });
        });
        match res {
            Ok(()) => {}
            // No clsact on the link: no filters.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
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
        Some(CLSACT),
    );
    match request(&msg, |_, _| {}) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EINVAL)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// What adding a root `fq` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FqAdded {
    Created,
    /// The device has a root qdisc already (not the default `noqueue`/`pfifo_fast`); it is
    /// left as it is.
    Occupied,
    /// The kernel has no `fq` (`sch_fq` neither built in nor loadable).
    Unsupported,
}

/// Adds an `fq` qdisc with default parameters as the root qdisc of link `ifindex`, with
/// handle `handle`.
pub fn add_root_fq(ifindex: u32, handle: u32) -> io::Result<FqAdded> {
    let mut msg = message(
        RTM_NEWQDISC,
        NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        ifindex,
        handle,
        TC_H_ROOT,
        Some(FQ),
    );
    let mut options = attr(TCA_FQ_PLIMIT, &FQ_PACKET_LIMIT.to_ne_bytes());
    options.extend(attr(TCA_FQ_FLOW_PLIMIT, &FQ_PACKET_LIMIT.to_ne_bytes()));
    msg.extend(attr(TCA_OPTIONS | NLA_F_NESTED, &options));
    let len = msg.len() as u32;
    msg[0..4].copy_from_slice(&len.to_ne_bytes());
    match request(&msg, |_, _| {}) {
        Ok(()) => Ok(FqAdded::Created),
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(FqAdded::Occupied),
        // "Specified qdisc kind is unknown" once the module could not be loaded.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EOPNOTSUPP)) => {
            Ok(FqAdded::Unsupported)
        }
        Err(e) => Err(e),
    }
}

/// What [`root_qdisc`] says of a device that has its built-in default.
pub const DEFAULT_QDISC: &str = "(default)";

/// The root qdisc of link `ifindex`: its kind and handle; [`DEFAULT_QDISC`] and 0 for the
/// built-in `noqueue` a veth starts with.
pub fn root_qdisc(ifindex: u32) -> io::Result<(String, u32)> {
    // The kernel answers a qdisc get as a notification, sent to the asker only with ECHO;
    // with an ACK asked for, the answer ends with it (a plain get has no NLMSG_DONE).
    let msg = message(
        RTM_GETQDISC,
        NLM_F_ACK | NLM_F_ECHO,
        ifindex,
        0,
        TC_H_ROOT,
        None,
    );
    let mut found = None;
    let res = request(&msg, |kind, body| {
        if kind != RTM_NEWQDISC || body.len() < TCMSG_LEN {
            return;
        }
        let handle = u32::from_ne_bytes(body[8..12].try_into().expect("4 bytes"));
        let mut attrs = &body[TCMSG_LEN..];
        while attrs.len() >= 4 {
            let len = usize::from(u16::from_ne_bytes([attrs[0], attrs[1]]));
            let ty = u16::from_ne_bytes([attrs[2], attrs[3]]);
            if len < 4 || len > attrs.len() {
                break;
            }
            if ty == TCA_KIND {
                let v = &attrs[4..len];
                let name = v.split(|b| *b == 0).next().unwrap_or_default();
                found = Some((String::from_utf8_lossy(name).into_owned(), handle));
            }
            attrs = &attrs[align4(len).min(attrs.len())..];
        }
    });
    match res {
        Ok(()) => Ok(found.unwrap_or_else(|| (DEFAULT_QDISC.to_owned(), 0))),
        // The kernel does not report built-in qdiscs: some versions answer with nothing but
        // the ACK, older ones refuse the request so.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((DEFAULT_QDISC.to_owned(), 0)),
        Err(e) => Err(e),
    }
}

/// Deletes the root `fq` of link `ifindex` if its handle is `handle`. `Ok(false)`: the link
/// has no such qdisc (or no longer exists).
pub fn delete_root_fq(ifindex: u32, handle: u32) -> io::Result<bool> {
    match root_qdisc(ifindex) {
        Ok((kind, h)) if kind == "fq" && h == handle => {}
        Ok(_) => return Ok(false),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENODEV | libc::ENOENT)) => {
            return Ok(false)
        }
        Err(e) => return Err(e),
    }
    let msg = message(
        RTM_DELQDISC,
        NLM_F_ACK,
        ifindex,
        handle,
        TC_H_ROOT,
        Some(FQ),
    );
    match request(&msg, |_, _| {}) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENODEV)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// One netlink attribute, padded to 4 bytes.
fn attr(ty: u16, payload: &[u8]) -> Vec<u8> {
    let mut a = Vec::with_capacity(align4(4 + payload.len()));
    a.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    a.extend_from_slice(&ty.to_ne_bytes());
    a.extend_from_slice(payload);
    a.resize(align4(a.len()), 0);
    a
}

/// One `tcmsg` request, with `TCA_KIND` when `kind` is set (NUL-terminated; the kernel then
/// refuses to act on a qdisc of another kind).
fn message(
    msg_type: u16,
    flags: u16,
    ifindex: u32,
    handle: u32,
    parent: u32,
    kind: Option<&[u8]>,
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
    if let Some(kind) = kind {
        m.extend(attr(TCA_KIND, kind));
    }
    let len = m.len() as u32;
    m[0..4].copy_from_slice(&len.to_ne_bytes());
    m
}

/// Sends `msg` and reads until its ACK or the end of its dump, passing every other message
/// (type and body) to `each`; an error answer becomes its errno.
fn request(msg: &[u8], mut each: impl FnMut(u16, &[u8])) -> io::Result<()> {
    raw::exchange(libc::NETLINK_ROUTE, msg, "the netlink answer", |m| {
        each(m.kind, m.body)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qdisc_request_names_clsact_and_its_handle() {
        let m = message(
            RTM_DELQDISC,
            NLM_F_ACK,
            7,
            CLSACT_HANDLE,
            TC_H_CLSACT,
            Some(CLSACT),
        );
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
