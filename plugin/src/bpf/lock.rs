//! The node's lock: one plugin run at a time changes a node's eBPF state.

use std::{
    fs::File,
    io,
    os::fd::{AsFd, AsRawFd},
};

use super::{
    pin::{create_dir_all_racy, walk, LayoutCwd, PinRoot},
    BpfError,
};

/// Held while a plugin run changes the node's eBPF state (flock on the layout directory,
/// which is never removed). Released on drop, or by the kernel if the process dies.
pub struct NodeLock {
    /// The layout directory as the working directory (see `walk.rs`); left
    /// before the lock goes (fields drop in order).
    _cwd: Option<LayoutCwd>,
    _file: File,
}

impl NodeLock {
    pub fn take(root: &PinRoot) -> Result<Self, BpfError> {
        let path = root.layout_dir();
        let err = |source| BpfError::NodeLock {
            path: path.clone(),
            source,
        };
        // Opened first: the directory is there on every run but a machine's first.
        let file = match File::open(walk(&path)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                create_dir_all_racy(&path)?;
                File::open(walk(&path)).map_err(err)?
            }
            opened => opened.map_err(err)?,
        };
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(err(io::Error::last_os_error()));
        }
        Ok(Self {
            _cwd: LayoutCwd::enter(&path, file.as_fd()),
            _file: file,
        })
    }
}
