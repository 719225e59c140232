//! The binaries the benchmark runs, started from disk. A file the build has just written
//! sits in the page cache as it was written, in large folios, and an exec's fault maps a
//! whole folio: such a copy of the plugin takes fewer page faults per ADD than the same
//! bytes read back from disk, enough to have made an LLD link of it look better than GNU
//! ld's until both were read back (docs/design-decisions.md, "GNU ld"; docs/performance.md,
//! "Measuring one change"). Dropping every binary from the page cache before the sections
//! run starts each as on a node after a reboot, the same way for all subjects and every
//! run; then ebpf-cni's binary and the floor's are read back in 2 MiB folios, as
//! ebpf-cni's install and its boot-time `ebpf-cni layout` leave the plugin on a node.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use anyhow::{Context as _, Result};

/// Writes out `path`'s dirty pages and drops its pages from the page cache (those a
/// process maps stay).
pub fn drop_cached(path: &Path) -> Result<()> {
    ebpf_cni_tests::fsutil::drop_cached(path)
        .with_context(|| format!("dropping {} from the page cache", path.display()))
}

/// Reads `path` back into the page cache in 2 MiB folios with the plugin's own
/// `ebpf-cni layout` (see plugin/src/page_cache.rs).
pub fn lay_out(plugin: &Path, path: &Path) -> Result<()> {
    let out = std::process::Command::new(plugin)
        .arg("layout")
        .arg(path)
        .env_remove("CNI_COMMAND")
        .output()
        .with_context(|| format!("running {} layout", plugin.display()))?;
    if !out.status.success() {
        anyhow::bail!(
            "{} layout {}: {}",
            plugin.display(),
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// How many of `path`'s pages are in the page cache (`mincore` of a mapping of it).
pub fn cached_pages(path: &Path) -> Result<usize> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = usize::try_from(file.metadata()?.len())?;
    if len == 0 {
        return Ok(0);
    }
    // SAFETY: a private read-only mapping of a file we opened, unmapped below; `vec` has
    // one byte per page of it.
    unsafe {
        let addr = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            file.as_raw_fd(),
            0,
        );
        if addr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("mapping {}", path.display()));
        }
        let page = usize::try_from(libc::sysconf(libc::_SC_PAGESIZE)).unwrap_or(4096);
        let mut vec = vec![0u8; len.div_ceil(page)];
        let rc = libc::mincore(addr, len, vec.as_mut_ptr());
        let err = std::io::Error::last_os_error();
        libc::munmap(addr, len);
        if rc != 0 {
            return Err(err).with_context(|| format!("mincore of {}", path.display()));
        }
        Ok(vec.iter().filter(|b| **b & 1 != 0).count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file just written is in the page cache; dropped, none of it is (the target
    /// directory is on the machine's disk: tmpfs keeps its pages).
    #[test]
    fn a_written_file_leaves_the_page_cache() {
        let dir = tempfile::tempdir_in(xtask::build::target_dir().unwrap()).unwrap();
        let path = dir.path().join("bin");
        std::fs::write(&path, vec![7u8; 256 * 1024]).unwrap();
        assert!(
            cached_pages(&path).unwrap() > 0,
            "the new file is not cached"
        );
        drop_cached(&path).unwrap();
        assert_eq!(
            cached_pages(&path).unwrap(),
            0,
            "pages left in the page cache"
        );
    }
}
