//! What the running kernel offers the dataplane, and what each part does without it.
//!
//! The dataplane needs 5.10 (`bpf_redirect_peer`, `bpf_redirect_neigh`); below that ADD and
//! STATUS fail naming what is missing, before any program reaches the verifier. Newer
//! features degrade one part each, never the rest:
//! - TCX (6.6): without it every program is a netlink `bpf` filter on a `clsact` qdisc;
//! - `SO_NETNS_COOKIE` (5.14): without it the socket programs, which must know the node's
//!   namespace by its cookie, learn it from a probe through `ecni_connect4` (see
//!   `cookie.rs`): nothing degrades, the node's own processes reach host ports as on newer
//!   kernels;
//! - `bpf_get_netns_cookie` in sock_ops programs (5.15): without it the pacing program does
//!   not load, and a pod's egress limit is held by the policer alone (TCP from the pod
//!   then runs below its limit).
//!
//! The "Kernel requirements" table of docs/kernels.md is this list.

use std::{io, os::fd::OwnedFd, sync::OnceLock};

use super::error::BpfError;

/// The oldest kernel the TC programs work on.
pub const MINIMUM: (u32, u32) = (5, 10);
/// What a kernel below [`MINIMUM`] lacks.
const MINIMUM_NEEDS: &str = "bpf_redirect_peer and bpf_redirect_neigh";

/// `uname -r`, or in a test build the release a test stands in for it
/// (`EBPF_CNI_TEST_KERNEL_RELEASE`, see `test_hooks`: a node with an older kernel, e.g.
/// `5.4.0`, below the minimum, which no VM of the matrix runs). Only this module's
/// decisions read it.
pub fn release() -> &'static str {
    static RELEASE: OnceLock<String> = OnceLock::new();
    RELEASE.get_or_init(|| match crate::test_hooks::kernel_release() {
        Some(r) => r,
        None => nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default(),
    })
}

/// (major, minor) of `release`; (0, 0) when it cannot be read.
fn version_of(release: &str) -> (u32, u32) {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    match (parts.next(), parts.next()) {
        (Some(major), Some(minor)) => (major, minor),
        _ => (0, 0),
    }
}

pub fn version() -> (u32, u32) {
    version_of(release())
}

/// Fails on a kernel older than [`MINIMUM`], naming what it lacks (the verifier's own
/// answer would be a dump of the rejected program).
pub fn require_minimum() -> Result<(), BpfError> {
    if version() >= MINIMUM {
        return Ok(());
    }
    Err(BpfError::KernelTooOld {
        release: release().to_owned(),
        minimum: format!("{}.{}", MINIMUM.0, MINIMUM.1),
        missing: MINIMUM_NEEDS,
    })
}

/// Before 5.11 the kernel charges BPF maps and programs to the user's `RLIMIT_MEMLOCK`
/// (since 5.11 to the memory cgroup): every pinned map of every node on the machine counts
/// against root's locked memory, and a map creation fails with EPERM once the sum passes
/// the limit (seen on 5.10 after a few nodes). The plugin lifts its own limit there, as
/// libbpf-based loaders do; newer kernels are left as they are.
pub fn lift_memlock_limit() {
    if version() >= (5, 11) {
        return;
    }
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit with a valid rlimit value.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) } != 0 {
        log::warn!(
            "cannot lift RLIMIT_MEMLOCK on kernel {}: map creation may fail with EPERM: {}",
            release(),
            io::Error::last_os_error()
        );
    }
}

/// TCX links (6.6+).
pub fn has_tcx() -> bool {
    version() >= (6, 6)
}

/// What ADD (and STATUS, which answers for ADD) requires of the kernel before touching
/// anything: the minimum, and TCX where the config forces it (`tcAttachMode: "tcx"`).
pub fn require_for(forced_tcx: bool) -> Result<(), BpfError> {
    require_minimum()?;
    if forced_tcx && !has_tcx() {
        return Err(BpfError::NoTcx {
            release: release().to_owned(),
        });
    }
    Ok(())
}

/// `getsockopt(SO_NETNS_COOKIE)` (5.14+), probed once per process on a socket of the
/// calling thread's namespace: every namespace of a kernel answers alike. Without it the
/// node's cookie is learned through a probe (`cookie::node_netns_cookie`). A release below
/// 5.14 given through the test hook counts as without.
pub fn has_netns_cookie() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        version() >= (5, 14)
            && !matches!(socket_netns_cookie(), Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT))
    })
}

/// The cookie of the calling thread's network namespace, from an unbound socket opened
/// there (a new pod namespace may not even have loopback up). In the thread's own
/// namespace (no namespace guard alive) the cookie is read once and kept
/// ([`crate::netns::home_cookie`], which a netlink connection opened there also tells),
/// where an ADD read the node's three times (the probe of the option, the host-port step,
/// the pacing entry), a socket each.
pub fn socket_netns_cookie() -> io::Result<u64> {
    let at_home = crate::netns::at_home();
    if let Some(cookie) = crate::netns::home_cookie().filter(|_| at_home) {
        return Ok(cookie);
    }
    let cookie = read_socket_netns_cookie()?;
    if at_home {
        crate::netns::learn_home_cookie(cookie);
    }
    Ok(cookie)
}

fn read_socket_netns_cookie() -> io::Result<u64> {
    // SAFETY: plain socket(2); the fd is owned right below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor nobody else owns.
    let sock = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    crate::netns::socket_cookie(std::os::fd::AsFd::as_fd(&sock))
}

/// How one part of the dataplane runs on this kernel.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PartMode {
    pub part: &'static str,
    pub mode: String,
    /// The part runs with less than it does on a newer kernel.
    pub degraded: bool,
}

/// The mode of each part on this kernel. `pacing_loaded` says whether the pacing program
/// is loaded on the node (the verifier decides that, see `Programs::pacing_available`).
pub fn part_modes(pacing_loaded: bool) -> Vec<PartMode> {
    let tcx = has_tcx();
    let cookie = has_netns_cookie();
    vec![
        PartMode {
            part: "tc attach",
            mode: if tcx {
                "TCX links on node devices, netlink filters on pod veths (auto)".into()
            } else {
                "netlink clsact filters everywhere (no TCX: needs 6.6)".into()
            },
            degraded: false,
        },
        PartMode {
            part: "host ports from the node's own processes",
            mode: if cookie {
                "socket programs (connect/sendmsg), node namespace by SO_NETNS_COOKIE".into()
            } else {
                "socket programs (connect/sendmsg), node namespace learned through connect4 (no SO_NETNS_COOKIE before 5.14)".into()
            },
            degraded: false,
        },
        PartMode {
            part: "egress TCP pacing",
            mode: if pacing_loaded {
                "sockops SO_MAX_PACING_RATE".into()
            } else {
                "policer only (no bpf_get_netns_cookie in sock_ops: needs 5.15)".into()
            },
            degraded: !pacing_loaded,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_of_releases() {
        assert_eq!(version_of("5.10.0-32-amd64"), (5, 10));
        assert_eq!(version_of("6.12.95+deb12-amd64"), (6, 12));
        assert_eq!(version_of("6.18.44-fc-v657"), (6, 18));
        assert_eq!(version_of(""), (0, 0));
        assert!(version_of("5.4.0-150-generic") < MINIMUM);
    }
}
