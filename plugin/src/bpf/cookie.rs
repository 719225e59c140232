//! Network namespace cookies: how the socket programs tell the node's sockets from other
//! namespaces' (the node's cookie, in the node config) and how the pacing program finds a
//! limited pod's sockets (the pod's cookie, the key of the pacing map).
//!
//! Since 5.14 a socket tells its namespace's cookie (`SO_NETNS_COOKIE`). Before that only
//! programs can read it (`bpf_get_netns_cookie`, in socket-address programs since 5.7), so
//! the node's cookie is learned through `ecni_connect4` ([`probe`]): the plugin arms the
//! probe map with the cookie of a UDP socket it opened in the node's namespace and a random
//! destination, and connects that socket there; the program records the namespace cookie of
//! the socket that matches both, disarms the map and refuses that connection. Only root can
//! arm the map (it is pinned in the node's bpffs directory), the random destination is known
//! only to the plugin and the map, and the plugin takes the answer only when its own
//! `connect()` was the one refused — so another namespace cannot make the node adopt its
//! cookie. A cookie that differs from the one the node has is confirmed by a second probe
//! with a fresh socket and destination before it is used.

use std::{
    io,
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    os::fd::AsFd,
};

use aya::maps::{Array, MapData};
use ebpf_cni_maps::{NsProbe, NS_PROBE_MAP};

use super::{
    kernel,
    maps::{open_map_err, open_pinned},
    pin::{NodeId, PinRoot},
    BpfError,
};

/// The cookie of the network namespace `ns` (the key of the pacing map), read from a
/// socket opened there. The calling thread enters `ns` for that socket only (the guard
/// takes it back before this returns), as `Netlink::connect_in` does: the commands run on a
/// single-threaded runtime and this call does not yield, so nothing else runs on the thread
/// meanwhile. (A thread of its own cost ADD a thread start and glibc a second malloc arena:
/// about 0.2 ms and 0.3 MiB of peak RSS.)
///
/// A cookie the namespace already knows (a netlink connection there told it) is taken as
/// it is: ADD connects to the pod's namespace first, so it enters it once, not twice.
pub fn netns_cookie_of(ns: &crate::netns::Netns) -> Result<u64, BpfError> {
    if let Some(cookie) = ns.cookie() {
        return Ok(cookie);
    }
    let _in = ns.enter().map_err(|e| BpfError::NetnsCookie {
        source: io::Error::other(e.to_string()),
    })?;
    netns_cookie()
}

/// The node's network namespace cookie (`SO_NETNS_COOKIE`, Linux 5.14+): the plugin runs in
/// the node's namespace.
pub fn netns_cookie() -> Result<u64, BpfError> {
    super::kernel::socket_netns_cookie().map_err(|source| BpfError::NetnsCookie { source })
}

/// The node's network namespace cookie for the socket programs, which are attached already:
/// `SO_NETNS_COOKIE` where the kernel has it, else learned by [`probe`] (twice when it
/// differs from `known`, the cookie the node config holds). The calling thread is in the
/// node's namespace and holds the node lock.
pub fn node_netns_cookie(root: &PinRoot, node: &NodeId, known: u64) -> Result<u64, BpfError> {
    if kernel::has_netns_cookie() {
        return netns_cookie();
    }
    let cookie = probe(root, node)?;
    if cookie != known {
        let again = probe(root, node)?;
        if again != cookie {
            return Err(BpfError::NetnsProbe {
                step: "a second probe gave another cookie",
                source: io::Error::other(format!("{cookie:#x}, then {again:#x}")),
            });
        }
        log::info!("learned the node network namespace's cookie {cookie:#x} through ecni_connect4 (no SO_NETNS_COOKIE before 5.14)");
    }
    Ok(cookie)
}

/// One probe through `ecni_connect4` (see the module head): the cookie of the calling
/// thread's network namespace.
fn probe(root: &PinRoot, node: &NodeId) -> Result<u64, BpfError> {
    let err = |step: &'static str| move |source| BpfError::NetnsProbe { step, source };
    let map = open_pinned(root, node, NS_PROBE_MAP)?.ok_or_else(|| BpfError::PinMissing {
        what: "node map",
        path: root.map(node, NS_PROBE_MAP),
    })?;
    let mut map: Array<MapData, NsProbe> =
        Array::try_from(map).map_err(open_map_err(root, node, NS_PROBE_MAP))?;
    // Nothing is ever sent from it: the program refuses its connect().
    let sock = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0))
        .map_err(err("open the probe socket"))?;
    let sock_cookie = socket_cookie(&sock).map_err(err("read the probe socket's SO_COOKIE"))?;
    let mut nonce = [0u8; 6];
    getrandom(&mut nonce).map_err(err("draw the probe's destination"))?;
    let armed = NsProbe {
        sock_cookie,
        addr_be: [nonce[0], nonce[1], nonce[2], nonce[3]],
        port: u16::from_ne_bytes([nonce[4], nonce[5]]),
        ..NsProbe::default()
    };
    let update = |what: &str| super::maps::host_ports::update_err(NS_PROBE_MAP, what.to_owned());
    map.set(0, armed, 0).map_err(update("arm the probe"))?;
    let dest = SocketAddrV4::new(Ipv4Addr::from(armed.addr_be), armed.port);
    let connected = sock.connect(dest);
    let got = map.get(&0, 0);
    map.set(0, NsProbe::default(), 0)
        .map_err(update("disarm the probe"))?;
    let got = got.map_err(|e| BpfError::NetnsProbe {
        step: "read the probe map",
        source: io::Error::other(e),
    })?;
    match connected {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
        other => {
            return Err(BpfError::NetnsProbe {
                step: "ecni_connect4 did not refuse the probe socket's connect()",
                source: other
                    .err()
                    .unwrap_or_else(|| io::Error::other("it connected")),
            })
        }
    }
    if got.sock_cookie != 0 || got.netns_cookie == 0 {
        return Err(BpfError::NetnsProbe {
            step: "ecni_connect4 did not record the probe socket",
            source: io::Error::other(format!("probe map: {got:?}")),
        });
    }
    Ok(got.netns_cookie)
}

/// `getsockopt(SO_COOKIE)` (4.12+): the value `bpf_get_socket_cookie` gives the programs.
fn socket_cookie(sock: &UdpSocket) -> io::Result<u64> {
    const SO_COOKIE: libc::c_int = 57;
    crate::sockopt::u64_option(sock.as_fd(), SO_COOKIE)
}

/// Fills `buf` from the kernel's random pool.
fn getrandom(buf: &mut [u8]) -> io::Result<()> {
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if usize::try_from(n).ok() != Some(buf.len()) {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
