//! Network namespaces: opening one by path and entering it on the current thread only.
//!
//! A namespace switch is per thread; the guard restores the original namespace (taken from
//! `/proc/thread-self/ns/net`, not `/proc/<pid>/…`, which names the main thread) and is
//! `!Send` so it cannot be dropped on another thread.

use std::{
    fs::File,
    marker::PhantomData,
    os::fd::{AsFd, AsRawFd},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use nix::sched::{setns, CloneFlags};

const NSFS_MAGIC: i64 = 0x6e73_6673;
/// `ioctl(NS_GET_NSTYPE)` (`_IO(0xb7, 0x3)`, Linux 4.11): the `CLONE_NEW*` type of a
/// namespace file. `libc::Ioctl`: the request's type differs between glibc (`c_ulong`) and
/// musl (`c_int`), and the release binaries are static musl builds.
const NS_GET_NSTYPE: libc::Ioctl = 0xb703;

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
        })
    }

    /// A pod's namespace for ADD: as [`Netns::open`], and not the calling thread's own (the
    /// node's), where ADD would put the pod's interface, addresses and routes on the node.
    pub fn open_pod(path: &Path) -> Result<Self, NetnsError> {
        let ns = Self::open(path)?;
        let current = Self::current()?;
        let (a, b) = (ns.file.metadata(), current.file.metadata());
        if let (Ok(a), Ok(b)) = (a, b) {
            if (a.dev(), a.ino()) == (b.dev(), b.ino()) {
                return Err(NetnsError::NodeNetns {
                    path: path.to_owned(),
                });
            }
        }
        Ok(ns)
    }

    /// The namespace of the calling thread.
    pub fn current() -> Result<Self, NetnsError> {
        Self::open(Path::new("/proc/thread-self/ns/net"))
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
}

/// While alive, the current thread is in another network namespace.
pub struct NetnsGuard {
    original: Netns,
    _not_send: PhantomData<*const ()>,
}

impl NetnsGuard {
    fn enter(target: &Netns) -> Result<Self, NetnsError> {
        let original = Netns::current()?;
        setns(target.file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|source| {
            NetnsError::Enter {
                path: target.path.clone(),
                source,
            }
        })?;
        Ok(Self {
            original,
            _not_send: PhantomData,
        })
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if let Err(e) = setns(self.original.file.as_fd(), CloneFlags::CLONE_NEWNET) {
            // Carrying on in the wrong namespace would configure the wrong network.
            log::error!("failed to return to the original network namespace: {e}");
            std::process::abort();
        }
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
        assert!(Netns::open(Path::new("/proc/thread-self/ns/net")).is_ok());
    }

    #[test]
    fn the_callers_own_namespace_is_no_pod_namespace() {
        let err = Netns::open_pod(Path::new("/proc/thread-self/ns/net")).unwrap_err();
        assert!(matches!(err, NetnsError::NodeNetns { .. }), "{err}");
        assert!(err.to_string().contains("node's own network namespace"));
    }
}
