//! Network namespaces: opening one by path and entering it on the current thread only.
//!
//! A namespace switch is per thread; the guard restores the original namespace (taken from
//! `/proc/thread-self/ns/net`, not `/proc/<pid>/…`, which names the main thread) and is
//! `!Send` so it cannot be dropped on another thread. Every switch goes through a guard, so
//! a thread with no guard alive is in its own namespace: that one is opened once per thread
//! (an ADD enters the pod's namespace three times), a nested guard's original each time.

use std::{
    cell::{Cell, OnceCell},
    fs::File,
    marker::PhantomData,
    os::fd::{AsFd, AsRawFd, BorrowedFd},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use nix::sched::{setns, CloneFlags};

const NSFS_MAGIC: i64 = 0x6e73_6673;
/// `ioctl(NS_GET_NSTYPE)` (`_IO(0xb7, 0x3)`, Linux 4.11): the `CLONE_NEW*` type of a
/// namespace file. `libc::Ioctl`: the request's type differs between glibc (`c_ulong`) and
/// musl (`c_int`), and the release binaries are static musl builds.
const NS_GET_NSTYPE: libc::Ioctl = 0xb703;
/// Set (non-empty), a `CNI_NETNS` that is the node's own namespace is taken as the pod's,
/// as the reference plugins' `skel` takes it.
pub const NETNS_OVERRIDE_ENV: &str = "CNI_NETNS_OVERRIDE";

pub fn netns_override() -> bool {
    std::env::var_os(NETNS_OVERRIDE_ENV).is_some_and(|v| !v.is_empty())
}

/// The calling thread's own namespace; `/proc/self/…` would name the main thread's.
const THREAD_NETNS: &str = "/proc/thread-self/ns/net";

thread_local! {
    /// The thread's namespace while no guard of it is alive, once opened.
    static HOME: OnceCell<File> = const { OnceCell::new() };
    /// The thread's live guards.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// The cookie of the thread's own namespace, once a socket opened there told it.
    static HOME_COOKIE: Cell<Option<u64>> = const { Cell::new(None) };
}

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("failed to open network namespace {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a network namespace")]
    NotANetns { path: PathBuf },
    #[error("{path} is the node's own network namespace, not a pod's")]
    NodeNetns { path: PathBuf },
    #[error("failed to enter network namespace {path}")]
    Enter {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
}

impl NetnsError {
    /// True when the namespace is simply gone (DEL treats that as nothing to do).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Open { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
            || matches!(self, Self::NotANetns { .. })
    }
}

/// An open network namespace.
#[derive(Debug)]
pub struct Netns {
    file: File,
    path: PathBuf,
    /// The namespace's cookie, once a socket opened there told it (see [`Netns::cookie`]).
    cookie: std::sync::OnceLock<u64>,
}

impl Netns {
    pub fn open(path: &Path) -> Result<Self, NetnsError> {
        let file = File::open(path).map_err(|source| NetnsError::Open {
            path: path.to_owned(),
            source,
        })?;
        let st = nix::sys::statfs::fstatfs(file.as_fd()).map_err(|e| NetnsError::Open {
            path: path.to_owned(),
            source: e.into(),
        })?;
        // Namespace files live on nsfs (procfs only before Linux 3.19, which this plugin
        // does not run on): anything else in procfs, e.g. a directory or `/proc/version`,
        // would only fail once ADD had changed the node. nsfs also holds other kinds of
        // namespace, hence the type check.
        let not_a_netns = || NetnsError::NotANetns {
            path: path.to_owned(),
        };
        if st.filesystem_type().0 as i64 != NSFS_MAGIC {
            return Err(not_a_netns());
        }
        // SAFETY: an argument-less ioctl on an fd we own.
        let nstype = unsafe { libc::ioctl(file.as_raw_fd(), NS_GET_NSTYPE) };
        if nstype != libc::CLONE_NEWNET {
            return Err(not_a_netns());
        }
        Ok(Self {
            file,
            path: path.to_owned(),
            cookie: std::sync::OnceLock::new(),
        })
    }

    /// A pod's namespace for ADD and CHECK: as [`Netns::open`], and not the calling
    /// thread's own (the node's), where ADD would put the pod's interface, addresses and
    /// routes on the node (a `/proc/<pid>/ns/net` whose pid was recycled to a host process
    /// names it), unless `CNI_NETNS_OVERRIDE` says the caller means it.
    pub fn open_pod(path: &Path) -> Result<Self, NetnsError> {
        let ns = Self::open(path)?;
        if ns.is_callers()? && !netns_override() {
            return Err(NetnsError::NodeNetns {
                path: path.to_owned(),
            });
        }
        Ok(ns)
    }

    /// Whether this is the calling thread's own namespace (the node's).
    pub fn is_callers(&self) -> Result<bool, NetnsError> {
        let current = if DEPTH.get() == 0 {
            with_home(|home| home.metadata())?
        } else {
            std::fs::metadata(THREAD_NETNS)
        };
        Ok(match (self.file.metadata(), current) {
            (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
            _ => false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn raw_fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    /// The namespace's inode number: stable for its lifetime, unique among live ones.
    pub fn inode(&self) -> u64 {
        self.file.metadata().map(|m| m.ino()).unwrap_or(0)
    }

    pub fn enter(&self) -> Result<NetnsGuard, NetnsError> {
        NetnsGuard::enter(self)
    }

    /// The namespace's cookie (`SO_NETNS_COOKIE`), if a socket opened there told it: a
    /// netlink connection there records it ([`Netns::learn_cookie`]), so whoever needs the
    /// cookie next (the pacing map's key) neither enters the namespace again nor opens a
    /// socket of its own.
    pub fn cookie(&self) -> Option<u64> {
        self.cookie.get().copied()
    }

    /// Records the cookie a socket opened in this namespace told.
    pub fn learn_cookie(&self, cookie: u64) {
        let _ = self.cookie.set(cookie);
    }
}

/// The namespace the calling thread is in now, opened (no checks: it is one).
fn open_thread_netns() -> Result<File, NetnsError> {
    File::open(THREAD_NETNS).map_err(|source| NetnsError::Open {
        path: THREAD_NETNS.into(),
        source,
    })
}

/// Runs `f` on the thread's own namespace file, opening it on first use. Only while no
/// guard is alive on the thread is that the namespace it is in.
fn with_home<T>(f: impl FnOnce(&File) -> T) -> Result<T, NetnsError> {
    HOME.with(|home| {
        if home.get().is_none() {
            let _ = home.set(open_thread_netns()?);
        }
        Ok(f(home.get().expect("set above")))
    })
}

/// Whether the calling thread is in its own namespace: no guard of it is alive. Every
/// switch of namespace goes through a guard, so a thread at home stays in the same
/// namespace between two such calls unless a guard came and went in between.
pub fn at_home() -> bool {
    DEPTH.get() == 0
}

/// The cookie (`SO_NETNS_COOKIE`, Linux 5.14+; `ENOPROTOOPT` before) of the namespace the
/// socket `sock` was opened in.
pub fn socket_cookie(sock: BorrowedFd<'_>) -> std::io::Result<u64> {
    const SO_NETNS_COOKIE: libc::c_int = 71;
    crate::sockopt::u64_option(sock, SO_NETNS_COOKIE)
}

/// The cookie (`SO_NETNS_COOKIE`) of the calling thread's own namespace, if a socket
/// opened there told it ([`learn_home_cookie`]).
pub fn home_cookie() -> Option<u64> {
    HOME_COOKIE.get()
}

/// Records the cookie a socket opened in the calling thread's own namespace (no guard
/// alive) told.
pub fn learn_home_cookie(cookie: u64) {
    HOME_COOKIE.set(Some(cookie));
}

/// While alive, the current thread is in another network namespace.
pub struct NetnsGuard {
    /// `None`: the thread's own namespace ([`HOME`]); a nested guard's original is the
    /// namespace the outer one entered.
    original: Option<File>,
    _not_send: PhantomData<*const ()>,
}

impl NetnsGuard {
    fn enter(target: &Netns) -> Result<Self, NetnsError> {
        let original = if DEPTH.get() == 0 {
            with_home(|_| ())?;
            None
        } else {
            Some(open_thread_netns()?)
        };
        setns(target.file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|source| {
            NetnsError::Enter {
                path: target.path.clone(),
                source,
            }
        })?;
        DEPTH.set(DEPTH.get() + 1);
        Ok(Self {
            original,
            _not_send: PhantomData,
        })
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        let back = match &self.original {
            Some(file) => setns(file.as_fd(), CloneFlags::CLONE_NEWNET),
            None => HOME.with(|home| {
                let home = home.get().expect("opened by the outermost guard");
                setns(home.as_fd(), CloneFlags::CLONE_NEWNET)
            }),
        };
        if let Err(e) = back {
            // Carrying on in the wrong namespace would configure the wrong network.
            log::error!("failed to return to the original network namespace: {e}");
            std::process::abort();
        }
        DEPTH.set(DEPTH.get() - 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_network_namespace_files_open() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        std::fs::write(&file, b"").unwrap();
        for path in [
            file.as_path(),
            tmp.path(),
            Path::new("/proc/version"),
            Path::new("/proc"),
            Path::new("/proc/thread-self/ns/uts"),
        ] {
            let err = Netns::open(path).unwrap_err();
            assert!(
                matches!(err, NetnsError::NotANetns { .. }),
                "{}: {err}",
                path.display()
            );
        }
        let err = Netns::open(&tmp.path().join("missing")).unwrap_err();
        assert!(err.is_not_found(), "{err}");
        assert!(Netns::open(Path::new(THREAD_NETNS)).is_ok());
    }

    fn thread_netns_inode() -> u64 {
        std::fs::metadata(THREAD_NETNS).unwrap().ino()
    }

    /// Needs CAP_SYS_ADMIN (the suite runs as root): guards, nested and repeated, each
    /// return to the namespace they left (the outermost to the thread's own, opened once),
    /// and a pod's namespace is compared with the one the thread is in.
    #[test]
    fn nested_guards_return_to_the_namespace_each_left() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "entering namespaces needs root"
        );
        // A namespace of its own, made by a thread that then stays in it.
        let other = std::thread::spawn(|| {
            nix::sched::unshare(CloneFlags::CLONE_NEWNET).unwrap();
            Netns::open(Path::new(THREAD_NETNS)).unwrap()
        })
        .join()
        .unwrap();
        std::thread::spawn(move || {
            let own = Netns::open(Path::new(THREAD_NETNS)).unwrap();
            // A path that names this namespace from any other.
            let own_path = PathBuf::from(format!("/proc/self/fd/{}", own.raw_fd()));
            let (home, away) = (own.inode(), other.inode());
            assert_ne!(home, away);
            for _ in 0..2 {
                let outer = other.enter().unwrap();
                assert_eq!(thread_netns_inode(), away);
                {
                    let _inner = own.enter().unwrap();
                    assert_eq!(thread_netns_inode(), home);
                    let err = Netns::open_pod(&own_path).unwrap_err();
                    assert!(matches!(err, NetnsError::NodeNetns { .. }), "{err}");
                }
                assert_eq!(
                    thread_netns_inode(),
                    away,
                    "the inner guard returns to the outer's"
                );
                assert!(Netns::open_pod(&own_path).is_ok());
                drop(outer);
                assert_eq!(thread_netns_inode(), home);
                assert_eq!(DEPTH.get(), 0);
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn the_callers_own_namespace_is_no_pod_namespace() {
        let err = Netns::open_pod(Path::new("/proc/thread-self/ns/net")).unwrap_err();
        assert!(matches!(err, NetnsError::NodeNetns { .. }), "{err}");
        assert!(err.to_string().contains("node's own network namespace"));
    }
}
