//! The host's side of `ebpf-cni install`: temporary directories standing for its CNI bin
//! and conf dirs (and the service-account files a pod would have), the binary run with only
//! the environment a test gives it, and snapshots of the directories to compare.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tempfile::TempDir;

/// The file name install gives the binary, and the conflist's default name.
pub const BINARY: &str = "ebpf-cni";
pub const CONFLIST: &str = "10-ebpf-cni.conflist";

/// A stand-in host: `bin/`, `conf/` and `sa/` (service account) in one temporary directory.
pub struct Host {
    dir: TempDir,
}

impl Host {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("ecni-install-")
            .tempdir()
            .expect("creating the host's directories");
        for d in ["bin", "conf", "sa"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        Self { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn bin_dir(&self) -> PathBuf {
        self.dir.path().join("bin")
    }

    pub fn conf_dir(&self) -> PathBuf {
        self.dir.path().join("conf")
    }

    pub fn binary(&self) -> PathBuf {
        self.bin_dir().join(BINARY)
    }

    pub fn conflist(&self) -> PathBuf {
        self.conf_dir().join(CONFLIST)
    }

    /// The conflist install wrote, parsed.
    pub fn conflist_json(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(self.conflist()).expect("reading the conflist");
        serde_json::from_str(&text).expect("the conflist is JSON")
    }

    /// `--bin-dir <bin> --conf-dir <conf>`.
    pub fn dir_args(&self) -> Vec<String> {
        vec![
            "--bin-dir".into(),
            self.bin_dir().to_string_lossy().into_owned(),
            "--conf-dir".into(),
            self.conf_dir().to_string_lossy().into_owned(),
        ]
    }

    /// Every file of the bin and conf dirs (and what is in them).
    pub fn snapshot(&self) -> Snapshot {
        let mut files = BTreeMap::new();
        for dir in [self.bin_dir(), self.conf_dir()] {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let meta = std::fs::symlink_metadata(&path).unwrap();
                let content = if meta.is_file() {
                    std::fs::read(&path).unwrap()
                } else {
                    Vec::new()
                };
                files.insert(
                    path.strip_prefix(self.path()).unwrap().to_path_buf(),
                    FileState {
                        content,
                        mode: meta.mode(),
                        inode: meta.ino(),
                        mtime: (meta.mtime(), meta.mtime_nsec()),
                    },
                );
            }
        }
        Snapshot(files)
    }
}

/// One file as found: what is in it, and whether it is the same file (inode, mtime).
#[derive(Clone, PartialEq, Eq)]
pub struct FileState {
    pub content: Vec<u8>,
    pub mode: u32,
    pub inode: u64,
    pub mtime: (i64, i64),
}

impl std::fmt::Debug for FileState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes (fnv {:016x}), mode {:o}, inode {}, mtime {}.{:09}",
            self.content.len(),
            fnv(&self.content),
            self.mode,
            self.inode,
            self.mtime.0,
            self.mtime.1
        )
    }
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The bin and conf dirs' files by path relative to the host.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Snapshot(pub BTreeMap<PathBuf, FileState>);

impl Snapshot {
    pub fn names(&self) -> Vec<String> {
        self.0.keys().map(|p| p.display().to_string()).collect()
    }
}

/// One run of the binary.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    #[track_caller]
    pub fn assert_ok(&self) -> &Self {
        assert_eq!(
            self.code,
            Some(0),
            "expected success\nstdout: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
        self
    }

    #[track_caller]
    pub fn assert_failed(&self, code: i32) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "expected exit code {code}\nstdout: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
        assert!(
            self.stdout.is_empty(),
            "a failure prints no summary: {}",
            self.stdout
        );
        self
    }
}

/// Runs `bin` with `args` and only `env` (and PATH): the machine's own NODE_NAME or
/// KUBERNETES_SERVICE_HOST never reach it.
pub fn run(bin: &Path, args: &[String], env: &[(&str, String)]) -> Run {
    let mut c = Command::new(bin);
    c.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let Output {
        status,
        stdout,
        stderr,
    } = c
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
    Run {
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// `args` as owned strings.
pub fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// How many of `path`'s pages the page cache holds in 2 MiB folios (512 pages, x86-64),
/// read from the kernel's page flags: each page of a mapping of the file, its frame from
/// `/proc/self/pagemap`, the frame's flags from `/proc/kpageflags` (root), a folio a head
/// page and the tail pages after it.
pub fn pages_in_2mib_folios(path: &Path) -> usize {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::fd::AsRawFd;
    const HEAD: u64 = 1 << 15;
    const TAIL: u64 = 1 << 16;
    const PRESENT: u64 = 1 << 63;
    let file = std::fs::File::open(path).unwrap();
    let len = file.metadata().unwrap().len() as usize;
    let pages = len.div_ceil(4096);
    // SAFETY: a private read-only mapping of a file we opened, unmapped below.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(addr, libc::MAP_FAILED, "mapping {}", path.display());
    let mut pagemap = std::fs::File::open("/proc/self/pagemap").unwrap();
    let mut kpageflags = std::fs::File::open("/proc/kpageflags").unwrap();
    let word = |f: &mut std::fs::File, at: u64| {
        let mut b = [0u8; 8];
        f.seek(SeekFrom::Start(at * 8)).unwrap();
        f.read_exact(&mut b).unwrap();
        u64::from_le_bytes(b)
    };
    let mut flags = Vec::with_capacity(pages);
    for i in 0..pages {
        // SAFETY: inside the mapping; the read maps the page (it is in the page cache).
        unsafe { std::ptr::read_volatile((addr as *const u8).add(i * 4096)) };
        let entry = word(&mut pagemap, addr as u64 / 4096 + i as u64);
        assert!(
            entry & PRESENT != 0,
            "page {i} of {} not mapped",
            path.display()
        );
        flags.push(word(&mut kpageflags, entry & ((1 << 55) - 1)));
    }
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(addr, len) };
    let mut in_2mib = 0;
    let mut i = 0;
    while i < pages {
        let tails = flags[i + 1..].iter().take_while(|f| *f & TAIL != 0).count();
        let folio = if flags[i] & HEAD != 0 { 1 + tails } else { 1 };
        if folio == 512 {
            in_2mib += folio;
        }
        i += folio;
    }
    in_2mib
}
