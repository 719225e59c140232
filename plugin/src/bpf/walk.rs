//! The working directory of a CNI run while it works on its pins. Every pin path starts
//! at bpffs's layout directory (`pin.rs`), and the paths stay whole in what the plugin
//! says (errors, logs). While a CNI run holds the node lock, that directory (the lock's)
//! is its working directory ([`walk_under_lock`]), and each system call on a pin path is
//! given the path below it ([`walk`]), which the kernel resolves from there. That saves
//! it the walk of `/sys/fs/bpf/ebpf-cni/v1`, a sysfs directory and a mount crossing: 1.4
//! µs of each `BPF_OBJ_GET`'s 4.3 on the developers' machine, and an ADD made 57 calls on
//! such paths. The run goes back to its own working directory before the lock goes, so
//! relative paths the runtime gave (a `dataDir`, `CNI_PATH`) mean what they meant.

use std::{
    ffi::OsStr,
    fs,
    os::{
        fd::{AsFd, BorrowedFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex, PoisonError,
    },
};

/// Whether this process works from the layout directory while it holds the node lock
/// ([`walk_under_lock`]).
static WALKING: AtomicBool = AtomicBool::new(false);
/// The layout directory while it is the working directory (the node lock held).
static WALK_ROOT: Mutex<Option<PathBuf>> = Mutex::new(None);

/// From now on, the node lock (`lock.rs`) makes the layout directory the process's
/// working directory while it is held, for [`walk`] ([`LayoutCwd`]). For the CNI entry point
/// only: the working directory is the process's, and library code (and its tests, threads
/// of one process with pin roots of their own) must not change it.
pub fn walk_under_lock() {
    WALKING.store(true, Ordering::Relaxed);
}

/// While alive, the layout directory is the process's working directory, for [`walk`]
/// (if [`walk_under_lock`] asked for it: else it is nothing). The node lock holds one;
/// CHECK, which reads without the lock, opens one of its own.
pub(super) struct LayoutCwd {
    /// The working directory to go back to.
    home: OwnedFd,
}

impl LayoutCwd {
    /// Enters the layout directory `dir`, open as `open`.
    pub(super) fn enter(dir: &Path, open: BorrowedFd<'_>) -> Option<Self> {
        if !WALKING.load(Ordering::Relaxed) {
            return None;
        }
        let home = fs::File::open(".").ok()?;
        nix::unistd::fchdir(open).ok()?;
        *WALK_ROOT.lock().unwrap_or_else(PoisonError::into_inner) = Some(dir.to_path_buf());
        Some(Self { home: home.into() })
    }

    /// Opens the layout directory `dir` and enters it; `None` where it is not there.
    pub(super) fn open(dir: &Path) -> Option<Self> {
        if !WALKING.load(Ordering::Relaxed) {
            return None;
        }
        let file = fs::File::open(dir).ok()?;
        Self::enter(dir, file.as_fd())
    }
}

impl Drop for LayoutCwd {
    fn drop(&mut self) {
        *WALK_ROOT.lock().unwrap_or_else(PoisonError::into_inner) = None;
        if let Err(e) = nix::unistd::fchdir(self.home.as_fd()) {
            // Relative paths the runtime gave (a `dataDir`, `CNI_PATH`) would resolve in
            // bpffs.
            log::error!("failed to return to the working directory: {e}");
            std::process::abort();
        }
    }
}

/// `path` as a system call on it should be given: below the working directory while that
/// is the layout directory `path` is in ([`LayoutCwd`]), else as it is.
pub(crate) fn walk(path: &Path) -> &Path {
    let root = WALK_ROOT.lock().unwrap_or_else(PoisonError::into_inner);
    root.as_deref()
        .and_then(|root| below(root, path))
        .unwrap_or(path)
}

/// `path` from `root` when it is `root` (`.`) or below it. Pin paths are joined onto the
/// root as it is, so a byte prefix ending at a `/` is the root's components
/// (`Path::strip_prefix` parses both paths' components, about as long as the kernel's
/// walk this saves).
fn below<'p>(root: &Path, path: &'p Path) -> Option<&'p Path> {
    match path
        .as_os_str()
        .as_bytes()
        .strip_prefix(root.as_os_str().as_bytes())?
    {
        [] => Some(Path::new(".")),
        [b'/', rest @ ..] if !rest.is_empty() => Some(Path::new(OsStr::from_bytes(rest))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Paths below the root come out relative, the root itself as `.`; another root, a
    /// name that only starts like it and a relative path are not below it.
    #[test]
    fn paths_below_the_root_are_given_from_it() {
        let root = Path::new("/sys/fs/bpf/ebpf-cni/v1");
        for (path, want) in [
            (
                "/sys/fs/bpf/ebpf-cni/v1/netns-1/maps/M",
                Some("netns-1/maps/M"),
            ),
            ("/sys/fs/bpf/ebpf-cni/v1", Some(".")),
            ("/sys/fs/bpf/ebpf-cni/v1/", None),
            ("/sys/fs/bpf/ebpf-cni/v10/netns-1", None),
            ("/sys/fs/bpf/other/v1/netns-1", None),
            ("netns-1/maps/M", None),
        ] {
            assert_eq!(below(root, Path::new(path)), want.map(Path::new), "{path}");
        }
    }
}
