//! One CNI run at a time per attachment. A runtime that times out an ADD retries it with the
//! same container id and interface while the first still runs (containerd's RunPodSandbox,
//! cilium/cilium#7701), or sends the DEL of an ADD still in flight. Unserialized, the
//! second run passed the first's "already exists" checks and, failing later, undid the
//! first's lease: a pod without an address. ADD and DEL of one attachment take its lock
//! first, so the second run starts once the first is done and sees what it made (a second
//! ADD is refused, code 107; a DEL removes it all).
//!
//! The lock is a one-byte write lock, at the attachment id's offset, in one file that every
//! run on the machine shares (`/run/ebpf-cni/attachments.lock`, never removed): an open file
//! description lock (`F_OFD_SETLKW`), which the kernel releases when the run exits however
//! it exits. Runs of different attachments take different bytes and never wait on each
//! other (two ids sharing a byte only serialize).

use std::{
    fs::{self, File, OpenOptions},
    io,
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    path::Path,
};

/// The file whose bytes are the attachments' locks.
pub const LOCK_FILE: &str = "/run/ebpf-cni/attachments.lock";

/// Held while a run works on one attachment; released on drop (the file closes).
pub struct AttachmentLock {
    _file: File,
}

impl AttachmentLock {
    /// Waits for attachment `id`'s lock. `None` when the lock file cannot be opened (a
    /// read-only `/run`): the run goes on unserialized, as it would without this lock.
    pub fn take(id: u64) -> Option<Self> {
        match Self::try_take(Path::new(LOCK_FILE), id) {
            Ok(lock) => Some(lock),
            Err(e) => {
                log::warn!("attachment lock {LOCK_FILE}: {e}: going on without it");
                None
            }
        }
    }

    fn try_take(path: &Path, id: u64) -> io::Result<Self> {
        let open = || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC)
                .open(path)
        };
        let file = match open() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Some(dir) = path.parent() {
                    fs::create_dir_all(dir)?;
                }
                open()?
            }
            opened => opened?,
        };
        // SAFETY: `flock` is plain data; all-zero is a valid value that is filled in below.
        let mut range: libc::flock = unsafe { std::mem::zeroed() };
        range.l_type = libc::F_WRLCK as libc::c_short;
        range.l_whence = libc::SEEK_SET as libc::c_short;
        range.l_start = offset(id);
        range.l_len = 1;
        loop {
            // SAFETY: fcntl on a descriptor we own, with a pointer to a live `flock`.
            if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLKW, &range) } == 0 {
                return Ok(Self { _file: file });
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// The byte of attachment `id`: any offset a file can have (`off_t` is signed).
fn offset(id: u64) -> libc::off_t {
    libc::off_t::try_from(id >> 2).expect("62 bits fit an off_t")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_id_has_a_byte() {
        for id in [0, 1, u64::MAX, 0xdead_beef_0000_0001] {
            assert!(offset(id) >= 0);
        }
    }

    /// A second open file description waits for the first's byte, not another's.
    #[test]
    fn one_attachment_waits_for_itself_only() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("sub/attachments.lock");
        let held = AttachmentLock::try_take(&path, 4).unwrap();
        // Another attachment's byte is free at once.
        let other = AttachmentLock::try_take(&path, 8).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        let waiter = std::thread::spawn(move || {
            let lock = AttachmentLock::try_take(&p, 5).unwrap();
            tx.send(()).unwrap();
            drop(lock);
        });
        // 4 and 5 share a byte: the waiter waits until `held` goes.
        assert!(rx
            .recv_timeout(std::time::Duration::from_millis(200))
            .is_err());
        drop(held);
        rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap();
        waiter.join().unwrap();
        drop(other);
    }
}
