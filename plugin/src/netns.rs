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
const PROC_SUPER_MAGIC: i64 = 0x9fa0;

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
        let magic = st.filesystem_type().0 as i64;
        if magic != NSFS_MAGIC && magic != PROC_SUPER_MAGIC {
            return Err(NetnsError::NotANetns {
                path: path.to_owned(),
            });
        }
        Ok(Self {
            file,
            path: path.to_owned(),
        })
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
