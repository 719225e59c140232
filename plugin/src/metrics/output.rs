//! Writes the exposition for node_exporter's textfile collector: into a temporary file in
//! the target's directory, then renamed over the target, so the collector, which may read
//! at any moment, sees the old file or the new one and never half of one.

use std::{
    fs::{self, OpenOptions},
    io::Write,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("{path} has no file name")]
    NoFileName { path: PathBuf },
    #[error("failed to write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("failed to rename {from} to {to}")]
    Rename {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Replaces `path` with `text` atomically. The temporary file starts with a dot, which the
/// textfile collector skips (it reads `*.prom` only), and carries our pid so two writers
/// never share one.
pub fn write_atomically(path: &Path, text: &str) -> Result<(), OutputError> {
    let name = path.file_name().ok_or_else(|| OutputError::NoFileName {
        path: path.to_path_buf(),
    })?;
    let tmp = path.with_file_name(format!(
        ".{}.tmp.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let write = || -> std::io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        // On disk before the rename makes it visible: a crash leaves the old file, not an
        // empty new one.
        f.sync_all()
    };
    if let Err(source) = write() {
        let _ = fs::remove_file(&tmp);
        return Err(OutputError::Write { path: tmp, source });
    }
    fs::rename(&tmp, path).map_err(|source| {
        let _ = fs::remove_file(&tmp);
        OutputError::Rename {
            from: tmp.clone(),
            to: path.to_path_buf(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ebpf_cni.prom");
        fs::write(&path, "old").unwrap();
        write_atomically(&path, "new\n").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "new\n");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("ebpf_cni.prom")]);
    }

    #[test]
    fn a_missing_directory_is_an_error_naming_the_file() {
        let err = write_atomically(Path::new("/nonexistent-dir/x.prom"), "x").unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent-dir/.x.prom.tmp."),
            "{err}"
        );
    }
}
