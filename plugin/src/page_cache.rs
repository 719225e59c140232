//! The plugin binary in the page cache, read back in 2 MiB folios. Every ADD is a new
//! process that maps the code and data it runs a fault at a time; a fault maps up to 64 KiB
//! around it, and each page it maps costs an extra page reference and reverse-map update
//! unless the pages belong to one large folio, which the kernel maps (and the exit unmaps)
//! in one step. A binary the exec faults read from disk lands in 4 KiB folios (after a
//! boot, after an eviction); read back through a mapping marked `MADV_HUGEPAGE`, the kernel
//! reads it in 2 MiB folios where the filesystem supports large folios (XFS, ext4 on recent
//! kernels). Measured on the test node: an ADD 14% faster, in 27 fewer page faults, for
//! 0.1 MiB more peak RSS (docs/design-decisions.md, "The binary in 2 MiB
//! folios").
//!
//! Only pages no process maps leave the page cache: an ADD running meanwhile keeps its
//! pages where they are, and the report says how much was laid out.

use std::{
    fs::File,
    io,
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
};

/// A PMD-mapped page on x86-64 and arm64 with 4 KiB pages.
const HUGE: usize = 2 << 20;
const PAGE: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("cannot open {}", .path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot drop {} from the page cache", .path.display())]
    Drop {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot map {}", .path.display())]
    Map {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read the mapping of {} back from /proc/self/smaps", .path.display())]
    Smaps {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot copy the running binary into memory to lay out {}", .path.display())]
    Copy {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// What [`lay_out`] left: the file's size, and how much of it a mapping aligned to 2 MiB
/// mapped as whole 2 MiB pages (`FilePmdMapped`), which the kernel does only for a 2 MiB
/// folio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub bytes: u64,
    pub huge_bytes: u64,
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
        write!(
            f,
            "{:.1} of {:.1} MiB in 2 MiB folios",
            mib(self.huge_bytes),
            mib(self.bytes)
        )?;
        if self.huge_bytes == 0 && self.bytes >= HUGE as u64 {
            write!(
                f,
                " (this kernel or filesystem reads the file in small folios, or a process maps all of it)"
            )?;
        }
        Ok(())
    }
}

/// Drops `path` from the page cache (the pages no process maps) and reads it back through a
/// mapping marked `MADV_HUGEPAGE`, so that the kernel reads it in 2 MiB folios.
pub fn lay_out(path: &Path) -> Result<Layout, LayoutError> {
    let at = |f: fn(PathBuf, io::Error) -> LayoutError| move |e| f(path.to_owned(), e);
    let file = File::open(path).map_err(at(|path, source| LayoutError::Open { path, source }))?;
    let bytes = file
        .metadata()
        .map_err(at(|path, source| LayoutError::Open { path, source }))?
        .len();
    let Ok(len) = usize::try_from(bytes) else {
        return Ok(Layout {
            bytes,
            huge_bytes: 0,
        });
    };
    if len == 0 {
        return Ok(Layout {
            bytes,
            huge_bytes: 0,
        });
    }
    let drop_err = at(|path, source| LayoutError::Drop { path, source });
    // Only clean pages leave the page cache: a binary just written may not be on disk yet.
    file.sync_data().map_err(drop_err)?;
    // SAFETY: plain syscall on an fd we own.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(drop_err(io::Error::from_raw_os_error(rc)));
    }
    let map =
        Mapping::new(&file, len).map_err(at(|path, source| LayoutError::Map { path, source }))?;
    // A kernel without transparent huge pages refuses the advice: the file is then read
    // back as it would have been.
    // SAFETY: advice on a mapping we own.
    let _ = unsafe { libc::madvise(map.addr as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
    for off in (0..len).step_by(PAGE) {
        // SAFETY: `off` is inside the mapping, which is readable.
        unsafe { std::ptr::read_volatile(map.addr.add(off)) };
    }
    let smaps = std::fs::read_to_string("/proc/self/smaps")
        .map_err(at(|path, source| LayoutError::Smaps { path, source }))?;
    let huge_bytes = pmd_mapped(&smaps, map.addr as usize).unwrap_or(0);
    Ok(Layout { bytes, huge_bytes })
}

/// Whether `path` is the file this process runs from (it maps its pages, which then cannot
/// be laid out).
pub fn is_running_binary(path: &Path) -> bool {
    let id = |p: &Path| std::fs::metadata(p).map(|m| (m.dev(), m.ino()));
    matches!((id(path), id(Path::new("/proc/self/exe"))), (Ok(a), Ok(b)) if a == b)
}

/// Runs this binary again from a copy in memory, with `args`: a process that runs from
/// its own file maps pages of it that then stay in small folios. Returns only on failure.
pub fn exec_from_memory(path: &Path, args: &[&std::ffi::OsStr]) -> LayoutError {
    use std::os::unix::process::CommandExt;
    let copy_err = |source| LayoutError::Copy {
        path: path.to_owned(),
        source,
    };
    // SAFETY: plain syscall with a NUL-terminated name; the fd is owned at once.
    let fd = unsafe { libc::memfd_create(c"ebpf-cni".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return copy_err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let mut copy = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    if let Err(e) = File::open("/proc/self/exe").and_then(|mut exe| io::copy(&mut exe, &mut copy)) {
        return copy_err(e);
    }
    // The kernel opens the copy before the exec closes its descriptor.
    let e = std::process::Command::new(format!("/proc/self/fd/{fd}"))
        .arg0("ebpf-cni")
        .args(args)
        .exec();
    copy_err(e)
}

/// `FilePmdMapped` of the mapping that starts at `addr`, in bytes.
fn pmd_mapped(smaps: &str, addr: usize) -> Option<u64> {
    // The kernel pads the address to 8 digits: compared as a number, not as text.
    let starts_at = |l: &str| {
        l.split_once('-')
            .and_then(|(a, _)| usize::from_str_radix(a, 16).ok())
            == Some(addr)
    };
    let mut lines = smaps.lines().skip_while(|l| !starts_at(l));
    lines.next()?;
    lines
        // The next mapping's head line has no colon after its first word.
        .take_while(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|w| w.ends_with(':'))
        })
        .find_map(|l| l.strip_prefix("FilePmdMapped:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
}

/// A private read-only mapping of a file at a 2 MiB-aligned address (so that the kernel can
/// map its 2 MiB folios whole, and `FilePmdMapped` says how many there are), unmapped on
/// drop with the reservation around it.
struct Mapping {
    reserved: *mut libc::c_void,
    reserved_len: usize,
    addr: *const u8,
}

impl Mapping {
    fn new(file: &File, len: usize) -> io::Result<Self> {
        let reserved_len = len + HUGE;
        // SAFETY: an anonymous reservation nothing else uses.
        let reserved = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserved_len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if reserved == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let aligned = (reserved as usize).next_multiple_of(HUGE);
        // SAFETY: `aligned .. aligned + len` lies inside the reservation, which we own.
        let addr = unsafe {
            libc::mmap(
                aligned as *mut libc::c_void,
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_FIXED,
                file.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            // SAFETY: the reservation made above.
            unsafe { libc::munmap(reserved, reserved_len) };
            return Err(e);
        }
        Ok(Self {
            reserved,
            reserved_len,
            addr: addr.cast(),
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the reservation (with the file's mapping inside it) is ours.
        unsafe { libc::munmap(self.reserved, self.reserved_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
7f1543400000-7f1543b32000 r--p 00000000 fe:00 10567685                   /opt/cni/bin/ebpf-cni
Size:               7368 kB
Rss:                7368 kB
FilePmdMapped:      6144 kB
VmFlags: rd mr mw me hg
7f1543c00000-7f1543e00000 r--p 00000000 fe:00 10567686                   /other
Size:               2048 kB
FilePmdMapped:      2048 kB
";

    #[test]
    fn the_mapping_at_the_address_says_how_much_is_in_2_mib_pages() {
        assert_eq!(pmd_mapped(SMAPS, 0x7f15_4340_0000), Some(6144 * 1024));
        assert_eq!(pmd_mapped(SMAPS, 0x7f15_43c0_0000), Some(2048 * 1024));
    }

    #[test]
    fn a_mapping_without_the_field_or_not_there_says_nothing() {
        let old = "7f0000000000-7f0000200000 r--p 00000000 fe:00 1 /x\nRss: 8 kB\n\
                   7f0000400000-7f0000600000 r--p 00000000 fe:00 2 /y\nFilePmdMapped: 2048 kB\n";
        assert_eq!(pmd_mapped(old, 0x7f00_0000_0000), None);
        assert_eq!(pmd_mapped(SMAPS, 0x1000), None);
        let padded = "00400000-00600000 r--p 00000000 fe:00 1 /low\nFilePmdMapped: 2048 kB\n";
        assert_eq!(pmd_mapped(padded, 0x40_0000), Some(2048 * 1024));
    }

    #[test]
    fn the_report_names_both_sizes_and_says_why_nothing_was_laid_out() {
        let l = Layout {
            bytes: 7 << 20,
            huge_bytes: 6 << 20,
        };
        assert_eq!(l.to_string(), "6.0 of 7.0 MiB in 2 MiB folios");
        let none = Layout {
            bytes: 7 << 20,
            huge_bytes: 0,
        };
        assert!(none.to_string().contains("small folios"), "{none}");
    }
}
