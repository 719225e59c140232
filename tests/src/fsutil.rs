//! Listing and removing directory trees, on ordinary filesystems and on bpffs (where pins
//! are removed by unlinking files and removing the emptied directories); dropping a file
//! from the page cache.

use std::io;
use std::path::{Path, PathBuf};

/// Every non-directory entry below `root`, as paths relative to it, sorted. A missing
/// `root` is an empty tree.
pub fn list_files(root: &Path) -> io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    walk(root, root, &mut out)?;
    out.sort();
    Ok(out)
}

/// Every directory below `root` (not `root` itself), as paths relative to it, sorted: empty
/// directories are state too (bpffs records, leftovers of a failed call). A missing `root`
/// has none.
pub fn list_dirs(root: &Path) -> io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    walk_dirs(root, root, &mut out)?;
    out.sort();
    Ok(out)
}

fn walk_dirs(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            let path = entry.path();
            out.push(path.strip_prefix(root).unwrap_or(&path).to_path_buf());
            walk_dirs(root, &path, out)?;
        }
    }
    Ok(())
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            walk(root, &path, out)?;
        } else {
            out.push(path.strip_prefix(root).unwrap_or(&path).to_path_buf());
        }
    }
    Ok(())
}

/// Removes `root` and everything below it, without following symlinks. A missing `root` is
/// not an error.
pub fn remove_tree(root: &Path) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(root) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.is_dir() {
        return ignore_missing(std::fs::remove_file(root));
    }
    for entry in std::fs::read_dir(root)? {
        remove_tree(&entry?.path())?;
    }
    ignore_missing(std::fs::remove_dir(root))
}

fn ignore_missing(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Writes out `path`'s dirty pages and drops its pages from the page cache (those a process
/// maps stay): read again, it comes from disk, as a binary does after a reboot.
pub fn drop_cached(path: &Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path)?;
    // Only clean pages are dropped.
    file.sync_all()?;
    // SAFETY: plain syscall on an fd we own.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}
