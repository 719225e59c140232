//! Putting a file in place on the host so that no reader ever sees half of it, and taking
//! it away again.
//!
//! A file is written to a temporary name in its own directory (same filesystem), synced,
//! and renamed over the target: a runtime that executes the binary or reads the conflist at
//! that moment gets the old file or the new one. Writing into the old binary instead fails
//! with "text file busy" while any pod's ADD or DEL runs it (calico#8932, aws-vpc-cni#935);
//! the rename leaves the running process its old inode. A file whose content and mode are
//! already the wanted ones is not touched at all, so a second install changes nothing, not
//! even an mtime.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Read, Write},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

/// What [`put`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Put {
    Written,
    /// The file was already there with this content and mode.
    Unchanged,
}

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("failed to read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to rename {from} to {to}")]
    Rename {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to sync directory {path}")]
    SyncDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to remove {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Reads all of `path`.
pub fn read(path: &Path) -> Result<Vec<u8>, FileError> {
    fs::read(path).map_err(|source| FileError::Read {
        path: path.into(),
        source,
    })
}

/// What is at a name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Existing {
    Missing,
    /// A regular file, with its content and permission bits.
    File {
        content: Vec<u8>,
        mode: u32,
    },
    /// A symlink, a directory or anything else: nothing we wrote (we write regular files).
    Other,
}

/// What is at `path`. Symlinks are not followed: what is at the name is what would be
/// replaced or removed.
pub fn existing(path: &Path) -> Result<Existing, FileError> {
    let read_err = |source| FileError::Read {
        path: path.into(),
        source,
    };
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Existing::Missing),
        Err(e) => return Err(read_err(e)),
    };
    if !meta.is_file() {
        return Ok(Existing::Other);
    }
    let mut content = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut content))
        .map_err(read_err)?;
    Ok(Existing::File {
        content,
        mode: meta.permissions().mode() & 0o7777,
    })
}

/// Makes `path` hold `content` with permission bits `mode`, atomically (see the module
/// head), or leaves it alone when it holds them already.
pub fn put(path: &Path, content: &[u8], mode: u32) -> Result<Put, FileError> {
    if let Existing::File {
        content: old,
        mode: old_mode,
    } = existing(path)?
    {
        if old == content && old_mode == mode {
            return Ok(Put::Unchanged);
        }
    }
    // Anything else at the name (a symlink, an older file) is replaced by the rename; a
    // directory makes the rename fail.
    let tmp = temporary_name(path);
    let write = || -> io::Result<()> {
        // create_new: never write through a name someone else put there.
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        // The umask may have narrowed the mode given at creation.
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.write_all(content)?;
        // On disk before the rename makes it visible: a crash leaves the old file, not an
        // empty new one.
        f.sync_all()
    };
    if let Err(source) = write() {
        let _ = fs::remove_file(&tmp);
        return Err(FileError::Write { path: tmp, source });
    }
    if let Err(source) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(FileError::Rename {
            from: tmp,
            to: path.into(),
            source,
        });
    }
    sync_parent(path)?;
    Ok(Put::Written)
}

/// Removes the file at `path`; `Ok(false)` when nothing was there.
pub fn remove(path: &Path) -> Result<bool, FileError> {
    match fs::remove_file(path) {
        Ok(()) => {
            sync_parent(path)?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(FileError::Remove {
            path: path.into(),
            source,
        }),
    }
}

/// `.<name>.ebpf-cni-install.<pid>`: hidden, so a runtime listing the conf dir skips it
/// (libcni reads `*.conf`, `*.conflist` and `*.json` only), and ours alone.
fn temporary_name(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.ebpf-cni-install.{}", std::process::id()))
}

/// The rename (or removal) itself on disk, not only the file's content.
fn sync_parent(path: &Path) -> Result<(), FileError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| FileError::SyncDir {
            path: dir.into(),
            source,
        })
}

/// Whether `needle` occurs in `haystack`.
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    let Some((&first, rest)) = needle.split_first() else {
        return true;
    };
    let mut at = 0;
    while let Some(i) = haystack[at..].iter().position(|&b| b == first) {
        let start = at + i + 1;
        if haystack.len() - start >= rest.len() && haystack[start..start + rest.len()] == *rest {
            return true;
        }
        at = start;
    }
    false
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn put_writes_replaces_and_then_leaves_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        assert_eq!(put(&path, b"one", 0o755).unwrap(), Put::Written);
        let m = fs::metadata(&path).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o755);
        assert_eq!(put(&path, b"one", 0o755).unwrap(), Put::Unchanged);
        let again = fs::metadata(&path).unwrap();
        assert_eq!((again.ino(), again.mtime_nsec()), (m.ino(), m.mtime_nsec()));

        // A new content, or only a new mode, is a new file (a new inode: the old one stays
        // whole for whoever holds it).
        assert_eq!(put(&path, b"two", 0o755).unwrap(), Put::Written);
        assert_ne!(fs::metadata(&path).unwrap().ino(), m.ino());
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(put(&path, b"two", 0o644).unwrap(), Put::Written);
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o7777,
            0o644
        );
        assert_eq!(names(tmp.path()), ["f"], "no temporary file is left");
    }

    #[test]
    fn a_failed_write_leaves_the_target_and_no_temporary() {
        let tmp = tempfile::tempdir().unwrap();
        // A directory where the file should go: the rename fails.
        let path = tmp.path().join("d");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("inside"), b"x").unwrap();
        let err = put(&path, b"x", 0o644).unwrap_err();
        assert!(matches!(err, FileError::Rename { .. }), "{err}");
        assert_eq!(names(tmp.path()), ["d"]);
        assert_eq!(existing(&path).unwrap(), Existing::Other);

        // A symlink is replaced, its target left alone.
        let target = tmp.path().join("target");
        fs::write(&target, b"theirs").unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert_eq!(existing(&link).unwrap(), Existing::Other);
        assert_eq!(put(&link, b"ours", 0o644).unwrap(), Put::Written);
        assert_eq!(fs::read(&target).unwrap(), b"theirs");
        assert_eq!(fs::read(&link).unwrap(), b"ours");
    }

    #[test]
    fn remove_is_idempotent() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        fs::write(&path, b"x").unwrap();
        assert!(remove(&path).unwrap());
        assert!(!remove(&path).unwrap());
    }

    #[test]
    fn contains_finds_a_needle_anywhere() {
        assert!(contains(b"abcabd", b"abd"));
        assert!(contains(b"abd", b"abd"));
        assert!(!contains(b"ab", b"abd"));
        assert!(!contains(b"abcab", b"abd"));
        assert!(contains(b"x", b""));
    }
}
