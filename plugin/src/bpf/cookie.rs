//! Network namespace cookies (`SO_NETNS_COOKIE`, Linux 5.14+): how the socket programs
//! tell the node's sockets from other namespaces' (the node's cookie, in the node config)
//! and how the pacing program finds a limited pod's sockets (the pod's cookie, the key of
//! the pacing map).

use std::io;

use super::BpfError;

/// The cookie of the network namespace `ns` (the key of the pacing map), read from a
/// socket opened there by a short-lived thread so this thread's namespace never changes.
pub fn netns_cookie_of(ns: &crate::netns::Netns) -> Result<u64, BpfError> {
    std::thread::scope(|s| {
        s.spawn(|| {
            let _in = ns.enter().map_err(|e| BpfError::NetnsCookie {
                source: io::Error::other(e.to_string()),
            })?;
            netns_cookie()
        })
        .join()
        .expect("the cookie thread does not panic")
    })
}

/// The node's network namespace cookie (`SO_NETNS_COOKIE`, Linux 5.14+): the plugin runs in
/// the node's namespace.
pub fn netns_cookie() -> Result<u64, BpfError> {
    super::kernel::socket_netns_cookie().map_err(|source| BpfError::NetnsCookie { source })
}
