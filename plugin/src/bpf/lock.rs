//! The node's lock: one plugin run at a time changes a node's eBPF state.

use std::{fs::File, io, os::fd::AsRawFd};

use super::{
    pin::{create_dir_all_racy, PinRoot},
    BpfError,
};

/// Held while a plugin run changes the node's eBPF state (flock on the layout directory,
/// which is never removed). Released on drop, or by the kernel if the process dies.
pub struct NodeLock {
    _file: File,
}

impl NodeLock {
    pub fn take(root: &PinRoot) -> Result<Self, BpfError> {
        let path = root.layout_dir();
        create_dir_all_racy(&path)?;
        let err = |source| BpfError::NodeLock {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(err)?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(err(io::Error::last_os_error()));
        }
        Ok(Self { _file: file })
    }
}
