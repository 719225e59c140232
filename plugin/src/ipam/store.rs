//! The on-disk lease store, byte-compatible with the reference host-local's.
//!
//! Layout of `<dataDir>/<network>/`, as the reference (v1.1.1 and later) writes it:
//! - one file per reserved address, named by the address's text (`10.9.0.2`, `fd00:9::2`)
//!   and holding `<containerID>\r\n<ifname>` with no trailing newline; files of older
//!   versions hold just the container ID;
//! - `last_reserved_ip.<N>`: the text of the last address reserved from range set `N`,
//!   no trailing newline (the reference parses it without trimming);
//! - `lock`: an empty file the reference `flock(LOCK_EX)`s around every transaction.
//!
//! Beside them, in `ebpf-cni/`, what only ebpf-cni writes. The reference looks for a
//! container's leases in the whole directory, subdirectories included, matching a file's
//! content against `<containerID>\r\n<ifname>` or `<containerID>`: a record is the lease
//! file itself (it finds the address twice, and its DEL removes both names); the boot id
//! never matches.
//! - `ebpf-cni/<ip>`: a hard link to the lease file of each lease ebpf-cni reserves
//!   (holding what it holds), removed with it: what tells ebpf-cni's leases from those of
//!   another plugin sharing the directory (a lease counts as ours only while its owner is
//!   the record's: a lease released and reserved again is a new file, the record keeps the
//!   old one). A link is a name, not a file: ext4 allocates no inode for it. Where the
//!   filesystem refuses hard links, and as earlier builds wrote it, the record is a file
//!   of its own holding `<containerID>/<ifname>`; both are read. A build that knows no
//!   records (the upgrade test's previous release, 167c4dc) DELs the lease and leaves its
//!   record, which the next release of this build drops (see [`LockedStore::tidy`]);
//! - `ebpf-cni/boot_id`: the boot (`/proc/sys/kernel/random/boot_id`) the records were
//!   last checked in; the directory is created with it, so a record never exists without
//!   a boot to compare (see `boot`).
//!
//! Every release tidies `ebpf-cni/` ([`LockedStore::tidy`]): it drops records that no
//! longer describe a lease (a rollback's DEL, by a build that knows no records, leaves
//! them), the `spare/` directory of released lease files that earlier builds kept, and,
//! once no record is left, the boot's record and the directory itself. A network none of
//! whose leases is ebpf-cni's holds only what the reference writes: `lock` and
//! `last_reserved_ip.<N>`.
//!
//! A [`LockedStore`] only exists while that flock is held, so every read and write goes
//! through it; an allocation or release holds it from first read to last write, which is
//! what keeps two processes (ours or the reference's) from reserving one address twice.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, DirEntryExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::error::IpamError;
use super::range::canonical_ip;

const LAST_RESERVED_PREFIX: &str = "last_reserved_ip.";
const LOCK_FILE: &str = "lock";
/// Where the kernel says which boot this is (a random UUID per boot).
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// ebpf-cni's own records (see the module docs).
const OWN_DIR: &str = "ebpf-cni";
const BOOT_ID_FILE: &str = "boot_id";
/// Where earlier builds kept released lease files for their inodes, in [`OWN_DIR`]; only
/// removed now (see [`LockedStore::tidy`]).
const SPARE_DIR: &str = "spare";
const LINE_BREAK: &str = "\r\n";
/// The reference's modes; the lock file's is ours (the reference's 0750 has no meaning).
const FILE_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o755;

/// `<data_dir>/<network>`, refusing names that would leave `data_dir` (the lead checks
/// the spec's name pattern; this keeps the store safe on its own).
pub fn network_dir(data_dir: &Path, network: &str) -> Result<PathBuf, IpamError> {
    if network.is_empty() || network == "." || network == ".." || network.contains(['/', '\0']) {
        return Err(IpamError::InvalidNetworkName {
            name: network.into(),
        });
    }
    Ok(data_dir.join(network))
}

pub fn create_dir(dir: &Path) -> Result<(), IpamError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .map_err(|source| IpamError::Io {
            op: "create directory",
            path: dir.to_path_buf(),
            source,
        })
}

/// Who holds an address, as far as a lease file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub ip: IpAddr,
    path: PathBuf,
    /// The file's content with surrounding white space removed (as the reference compares).
    content: String,
}

impl Lease {
    /// Written by the current format for exactly this attachment.
    fn is_for(&self, container_id: &str, ifname: &str) -> bool {
        self.content == key(container_id, ifname)
    }

    /// Written by an old version (container ID only) for this container.
    fn is_legacy_for(&self, container_id: &str) -> bool {
        self.content == container_id.trim()
    }

    /// The container ID and, unless the file is in the old format, the interface name.
    pub fn owner(&self) -> (&str, Option<&str>) {
        match self.content.split_once(LINE_BREAK) {
            Some((id, ifname)) => (id, Some(ifname)),
            None => (&self.content, None),
        }
    }
}

fn key(container_id: &str, ifname: &str) -> String {
    format!("{}{LINE_BREAK}{ifname}", container_id.trim())
}

/// A lease ebpf-cni reserved: its record names the owner its lease file still names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnLease {
    pub ip: IpAddr,
    pub container_id: String,
    pub ifname: String,
}

/// A record's content where it is a file of its own: `/` appears in neither a container ID
/// nor an interface name.
fn record(container_id: &str, ifname: &str) -> String {
    format!("{}/{ifname}", container_id.trim())
}

/// The owner a record names: a link to the lease holds the lease's `<id>\r\n<ifname>`, a
/// record file `<id>/<ifname>`.
fn record_owner(content: &str) -> Option<(&str, &str)> {
    let content = content.trim();
    content
        .split_once(LINE_BREAK)
        .or_else(|| content.split_once('/'))
}

/// This boot's id ([`BOOT_ID`], or in a test build the file a test names instead:
/// `EBPF_CNI_BOOT_ID_FILE`, see `test_hooks`).
pub fn current_boot() -> Result<String, IpamError> {
    let path = crate::test_hooks::boot_id_file().unwrap_or_else(|| PathBuf::from(BOOT_ID));
    match fs::read_to_string(&path) {
        Ok(s) => Ok(s.trim().to_owned()),
        Err(source) => Err(IpamError::Io {
            op: "read",
            path,
            source,
        }),
    }
}

/// The directory of ebpf-cni's records in a network directory.
pub fn own_dir(network_dir: &Path) -> PathBuf {
    network_dir.join(OWN_DIR)
}

/// The boot the records of a network directory were last checked in; `None` when the file
/// is missing.
pub fn recorded_boot(network_dir: &Path) -> Result<Option<String>, IpamError> {
    let path = own_dir(network_dir).join(BOOT_ID_FILE);
    match fs::read_to_string(&path) {
        Ok(s) => Ok(Some(s.trim().to_owned())),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(source) => Err(IpamError::Io {
            op: "read",
            path,
            source,
        }),
    }
}

pub struct LockedStore {
    dir: PathBuf,
    _lock: Flock<File>,
}

impl LockedStore {
    /// Takes the network's lock, polling for up to `timeout` while another process holds it.
    /// `dir` must exist.
    pub fn lock(dir: &Path, timeout: Duration) -> Result<Self, IpamError> {
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(FILE_MODE)
            .open(&path)
            .map_err(|source| IpamError::Io {
                op: "open",
                path: path.clone(),
                source,
            })?;
        let started = Instant::now();
        let mut delay = Duration::from_millis(1);
        loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => {
                    return Ok(Self {
                        dir: dir.to_path_buf(),
                        _lock: lock,
                    })
                }
                Err((f, Errno::EINTR)) => file = f,
                Err((f, errno)) if errno == Errno::EWOULDBLOCK => {
                    let waited = started.elapsed();
                    if waited >= timeout {
                        return Err(IpamError::LockTimeout { path, waited });
                    }
                    std::thread::sleep(delay.min(timeout.saturating_sub(waited)));
                    delay = (delay * 2).min(Duration::from_millis(50));
                    file = f;
                }
                Err((_, source)) => return Err(IpamError::Lock { path, source }),
            }
        }
    }

    /// Reserves `ip` for the attachment; `Ok(false)` when some attachment already holds it.
    pub fn reserve(
        &self,
        ip: IpAddr,
        container_id: &str,
        ifname: &str,
        set_index: usize,
    ) -> Result<bool, IpamError> {
        let path = self.dir.join(ip.to_string());
        if !self.reserve_new(ip, &path, container_id, ifname)? {
            return Ok(false);
        }
        let last = self.dir.join(format!("{LAST_RESERVED_PREFIX}{set_index}"));
        if let Err(source) = overwrite_file(&last, ip.to_string().as_bytes()) {
            remove_quietly(&path);
            self.remove_record(ip);
            return Err(IpamError::Io {
                op: "write",
                path: last,
                source,
            });
        }
        Ok(true)
    }

    /// [`Self::reserve`] with a new lease file, and its record.
    fn reserve_new(
        &self,
        ip: IpAddr,
        path: &Path,
        container_id: &str,
        ifname: &str,
    ) -> Result<bool, IpamError> {
        let mut file = match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => return Ok(false),
            Err(source) => {
                return Err(IpamError::Io {
                    op: "create",
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        if let Err(source) = file.write_all(key(container_id, ifname).as_bytes()) {
            remove_quietly(path);
            return Err(IpamError::Io {
                op: "write",
                path: path.to_path_buf(),
                source,
            });
        }
        drop(file);
        if let Err(e) = self.write_record(ip, container_id, ifname) {
            remove_quietly(path);
            return Err(e);
        }
        Ok(true)
    }

    /// The last address reserved from set `set_index`; `None` when unknown. A broken file
    /// only costs the round robin one restart from the beginning, as in the reference.
    pub fn last_reserved(&self, set_index: usize) -> Option<IpAddr> {
        let path = self.dir.join(format!("{LAST_RESERVED_PREFIX}{set_index}"));
        match fs::read_to_string(&path) {
            Ok(s) => s.trim().parse().ok().map(canonical_ip),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => {
                log::warn!("ignoring {}: {e}", path.display());
                None
            }
        }
    }

    /// Every lease file. Unreadable files are skipped with a warning, as the reference does.
    pub fn leases(&self) -> Result<Vec<Lease>, IpamError> {
        let mut out = Vec::new();
        for (ip, path) in self.lease_files()? {
            match fs::read(&path) {
                Ok(bytes) => out.push(Lease {
                    ip,
                    path,
                    content: String::from_utf8_lossy(&bytes).trim().to_owned(),
                }),
                Err(e) => log::warn!("skipping lease {}: {e}", path.display()),
            }
        }
        out.sort_by_key(|l| sort_key(l.ip));
        Ok(out)
    }

    /// The leased addresses, from the directory's names alone (STATUS counts them on every
    /// call: reading each file as [`Self::leases`] does cost five system calls per pod).
    pub fn leased(&self) -> Result<Vec<IpAddr>, IpamError> {
        Ok(self.lease_files()?.into_iter().map(|(ip, _)| ip).collect())
    }

    /// The files named by an address, unsorted.
    fn lease_files(&self) -> Result<Vec<(IpAddr, PathBuf)>, IpamError> {
        let io = |source| IpamError::Io {
            op: "read directory",
            path: self.dir.clone(),
            source,
        };
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let Some(ip) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<IpAddr>().ok())
            else {
                continue;
            };
            if entry.file_type().is_ok_and(|t| t.is_file()) {
                out.push((canonical_ip(ip), entry.path()));
            }
        }
        Ok(out)
    }

    /// Addresses held by the attachment, in either file format (as the reference's
    /// `GetByID`).
    pub fn owned_by(&self, container_id: &str, ifname: &str) -> Result<Vec<IpAddr>, IpamError> {
        Ok(self
            .leases()?
            .into_iter()
            .filter(|l| l.is_for(container_id, ifname) || l.is_legacy_for(container_id))
            .map(|l| l.ip)
            .collect())
    }

    /// Removes the attachment's leases; old-format files of the container only when there
    /// is no current-format one (as the reference's `ReleaseByID`). Tries every file and
    /// reports the first failure.
    pub fn release_owner(
        &self,
        container_id: &str,
        ifname: &str,
    ) -> Result<Vec<IpAddr>, IpamError> {
        let leases = self.leases()?;
        let mut mine: Vec<&Lease> = leases
            .iter()
            .filter(|l| l.is_for(container_id, ifname))
            .collect();
        if mine.is_empty() {
            mine = leases
                .iter()
                .filter(|l| l.is_legacy_for(container_id))
                .collect();
        }
        self.remove_all(mine)
    }

    /// Removes the given leases, trying each and reporting the first failure.
    pub fn remove_all<'a>(
        &self,
        leases: impl IntoIterator<Item = &'a Lease>,
    ) -> Result<Vec<IpAddr>, IpamError> {
        let mut removed = Vec::new();
        let mut first_err = None;
        for lease in leases {
            match fs::remove_file(&lease.path) {
                Ok(()) => {
                    self.remove_record(lease.ip);
                    removed.push(lease.ip);
                }
                Err(e) if e.kind() == ErrorKind::NotFound => self.remove_record(lease.ip),
                Err(source) => {
                    first_err.get_or_insert(IpamError::Io {
                        op: "remove",
                        path: lease.path.clone(),
                        source,
                    });
                }
            }
        }
        self.tidy();
        first_err.map_or(Ok(removed), Err)
    }

    /// Removes the lease of `ip` if any (undo of [`Self::reserve`]).
    pub fn release_ip(&self, ip: IpAddr) -> Result<(), IpamError> {
        let path = self.dir.join(ip.to_string());
        match fs::remove_file(&path) {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(IpamError::Io {
                op: "remove",
                path,
                source: e,
            }),
            _ => {
                self.remove_record(ip);
                self.tidy();
                Ok(())
            }
        }
    }

    /// Records `ip` as ours: a hard link to its lease file, just written; a file of its own
    /// where the filesystem has no hard links. A record left at that name (its lease was
    /// removed by another plugin) is replaced. The records' directory is made with the
    /// current boot in it (in a temporary directory renamed into place), so no record is
    /// ever without one.
    fn write_record(&self, ip: IpAddr, container_id: &str, ifname: &str) -> Result<(), IpamError> {
        let own = own_dir(&self.dir);
        if !own.is_dir() {
            self.create_own_dir(&current_boot()?)?;
        }
        let path = own.join(ip.to_string());
        let lease = self.dir.join(ip.to_string());
        let linked = match fs::hard_link(&lease, &path) {
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                self.remove_record(ip);
                fs::hard_link(&lease, &path)
            }
            r => r,
        };
        match linked {
            Ok(()) => Ok(()),
            Err(e) => {
                log::debug!("a record file instead of a link at {}: {e}", path.display());
                write_file(&path, record(container_id, ifname).as_bytes())
            }
        }
        .map_err(|source| IpamError::Io {
            op: "write",
            path,
            source,
        })
    }

    fn create_own_dir(&self, boot: &str) -> Result<(), IpamError> {
        let tmp = self
            .dir
            .join(format!("{OWN_DIR}.tmp-{}", std::process::id()));
        let io = |op, path: &Path| {
            let path = path.to_path_buf();
            move |source| IpamError::Io { op, path, source }
        };
        let _ = fs::remove_dir_all(&tmp);
        create_dir(&tmp)?;
        let made = write_file(&tmp.join(BOOT_ID_FILE), boot.as_bytes())
            .map_err(io("write", &tmp.join(BOOT_ID_FILE)))
            .and_then(|()| fs::rename(&tmp, own_dir(&self.dir)).map_err(io("rename", &tmp)));
        if made.is_err() {
            let _ = fs::remove_dir_all(&tmp);
        }
        made
    }

    fn remove_record(&self, ip: IpAddr) {
        let path = own_dir(&self.dir).join(ip.to_string());
        match fs::remove_file(&path) {
            Err(e) if e.kind() != ErrorKind::NotFound => {
                log::warn!("failed to remove the lease record {}: {e}", path.display());
            }
            _ => {}
        }
    }

    /// Records `boot` as the one the records were checked in (replacing the file whole).
    pub fn record_boot(&self, boot: &str) -> Result<(), IpamError> {
        let own = own_dir(&self.dir);
        if !own.is_dir() {
            return self.create_own_dir(boot);
        }
        let path = own.join(BOOT_ID_FILE);
        let tmp = own.join(format!("{BOOT_ID_FILE}.tmp-{}", std::process::id()));
        write_file(&tmp, boot.as_bytes())
            .and_then(|()| fs::rename(&tmp, &path))
            .map_err(|source| IpamError::Io {
                op: "write",
                path,
                source,
            })
    }

    /// The leases ebpf-cni reserved (each record whose lease file names the record's
    /// owner), and the records that no longer describe a lease (the lease is gone, or is
    /// now another owner's: the reference released it and reserved it again).
    pub fn own_leases(&self) -> Result<(Vec<OwnLease>, Vec<IpAddr>), IpamError> {
        let own = own_dir(&self.dir);
        let io = |source| IpamError::Io {
            op: "read directory",
            path: own.clone(),
            source,
        };
        let entries = match fs::read_dir(&own) {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Default::default()),
            Err(e) => return Err(io(e)),
        };
        let (mut ours, mut stale) = (Vec::new(), Vec::new());
        for entry in entries {
            let entry = entry.map_err(io)?;
            let Some(ip) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<IpAddr>().ok())
            else {
                continue;
            };
            match self.lease_of_record(ip, &entry.path()) {
                Some(lease) => ours.push(lease),
                None => stale.push(ip),
            }
        }
        ours.sort_by_key(|l| sort_key(l.ip));
        Ok((ours, stale))
    }

    /// The lease the record at `record` describes: `ip`'s lease file names the owner the
    /// record names. `None` when the lease is gone or is another owner's.
    fn lease_of_record(&self, ip: IpAddr, record: &Path) -> Option<OwnLease> {
        let owner = fs::read_to_string(record).ok()?;
        let (container_id, ifname) = record_owner(&owner)?;
        let lease = fs::read(self.dir.join(ip.to_string())).ok()?;
        (String::from_utf8_lossy(&lease).trim() == key(container_id, ifname)).then(|| OwnLease {
            ip: canonical_ip(ip),
            container_id: container_id.to_owned(),
            ifname: ifname.to_owned(),
        })
    }

    /// Tidies ebpf-cni's directory after a release (see the module docs): drops the records
    /// that describe no lease and the `spare/` directory earlier builds kept, then, when no
    /// record is left, the boot's record and the directory. Runs under the store's lock, so
    /// no reservation runs meanwhile. A failure is logged, never fatal: the next release
    /// tidies what stayed.
    pub fn tidy(&self) {
        let own = own_dir(&self.dir);
        let entries = match fs::read_dir(&own) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => return,
            Err(e) => return log::warn!("not tidying {}: {e}", own.display()),
        };
        // A record linked to its lease shares the lease's inode: the two listings tell
        // those apart without opening a file; only a record file of its own is read.
        let lease_inodes = self.lease_inodes();
        let mut kept = 0usize;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let path = entry.path();
            let gone = if name == BOOT_ID_FILE {
                continue;
            } else if name == SPARE_DIR {
                fs::remove_dir_all(&path)
            } else if let Some(ip) = name.to_str().and_then(|n| n.parse::<IpAddr>().ok()) {
                if lease_inodes.get(&name) == Some(&entry.ino())
                    || self.lease_of_record(ip, &path).is_some()
                {
                    kept += 1;
                    continue;
                }
                fs::remove_file(&path)
            } else if name
                .to_str()
                .is_some_and(|n| n.starts_with(&format!("{BOOT_ID_FILE}.tmp-")))
            {
                // A boot record half written by a run that died.
                fs::remove_file(&path)
            } else {
                kept += 1;
                continue;
            };
            match gone {
                Err(e) if e.kind() != ErrorKind::NotFound => {
                    log::warn!("failed to remove {}: {e}", path.display());
                    kept += 1;
                }
                _ => {}
            }
        }
        if kept > 0 {
            return;
        }
        for gone in [
            fs::remove_file(own.join(BOOT_ID_FILE)),
            fs::remove_dir(&own),
        ] {
            match gone {
                Err(e) if e.kind() != ErrorKind::NotFound => {
                    return log::warn!("failed to remove {}: {e}", own.display());
                }
                _ => {}
            }
        }
    }

    /// The inode of each file named by an address in the network directory, by name.
    fn lease_inodes(&self) -> HashMap<OsString, u64> {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return HashMap::new();
        };
        entries
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.parse::<IpAddr>().is_ok())
            })
            .map(|e| (e.file_name(), e.ino()))
            .collect()
    }

    /// Removes records that describe no lease (see [`Self::own_leases`]).
    pub fn remove_records(&self, ips: &[IpAddr]) {
        for ip in ips {
            self.remove_record(*ip);
        }
    }

    /// Releases one of our leases if its file and record still name `lease`'s owner;
    /// `Ok(false)` when either changed since it was read (DEL released it, or it is
    /// another's now).
    pub fn release_own(&self, lease: &OwnLease) -> Result<bool, IpamError> {
        let path = self.dir.join(lease.ip.to_string());
        let record_path = own_dir(&self.dir).join(lease.ip.to_string());
        let lease_names = fs::read(&path).is_ok_and(|b| {
            String::from_utf8_lossy(&b).trim() == key(&lease.container_id, &lease.ifname)
        });
        let record_names = fs::read_to_string(&record_path).is_ok_and(|r| {
            record_owner(&r) == Some((lease.container_id.as_str(), lease.ifname.as_str()))
        });
        if !lease_names || !record_names {
            return Ok(false);
        }
        match fs::remove_file(&path) {
            Ok(()) => {
                self.remove_record(lease.ip);
                Ok(true)
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(source) => Err(IpamError::Io {
                op: "remove",
                path,
                source,
            }),
        }
    }
}

/// IPv4 before IPv6, then numeric.
pub fn sort_key(ip: IpAddr) -> (bool, u128) {
    (ip.is_ipv6(), super::range::to_u128(ip))
}

fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .open(path)?
        .write_all(bytes)
}

/// Replaces a small file's content in place: writes over it from the start, then cuts
/// what the old content had beyond the new. An `O_TRUNC` open costs ext4 far more (on
/// the test machine 0.3–0.5 ms of an ADD's 5–6 ms): cutting a file to zero frees its block
/// and, at close, makes ext4 write the new data out at once (its `auto_da_alloc`
/// replace-by-truncate heuristic). A crash in between leaves a valid or garbled address,
/// which costs the round robin what a broken file costs it (see
/// [`LockedStore::last_reserved`]).
fn overwrite_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .open(path)?;
    file.write_all(bytes)?;
    let len = bytes.len() as u64;
    if file.metadata()?.len() > len {
        file.set_len(len)?;
    }
    Ok(())
}

fn remove_quietly(path: &Path) {
    if let Err(e) = fs::remove_file(path) {
        log::warn!(
            "failed to remove {} after a failed reservation: {e}",
            path.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn store(dir: &Path) -> LockedStore {
        LockedStore::lock(dir, Duration::from_secs(5)).unwrap()
    }

    #[test]
    fn file_bytes_match_the_reference() {
        let tmp = tempfile::tempdir().unwrap();
        let s = store(tmp.path());
        assert!(s.reserve(ip("10.9.0.2"), " ctr1\n", "eth0", 0).unwrap());
        assert!(s.reserve(ip("fd00:9::2"), "ctr1", "eth0", 1).unwrap());
        assert!(!s.reserve(ip("10.9.0.2"), "other", "eth0", 0).unwrap());
        assert_eq!(
            fs::read(tmp.path().join("10.9.0.2")).unwrap(),
            b"ctr1\r\neth0"
        );
        assert_eq!(
            fs::read(tmp.path().join("fd00:9::2")).unwrap(),
            b"ctr1\r\neth0"
        );
        assert_eq!(
            fs::read(tmp.path().join("last_reserved_ip.0")).unwrap(),
            b"10.9.0.2"
        );
        assert_eq!(
            fs::read(tmp.path().join("last_reserved_ip.1")).unwrap(),
            b"fd00:9::2"
        );
        assert_eq!(fs::read(tmp.path().join("lock")).unwrap(), b"");
        assert_eq!(s.last_reserved(0), Some(ip("10.9.0.2")));
        assert_eq!(s.last_reserved(7), None);
    }

    #[test]
    fn last_reserved_is_rewritten_whole_when_shorter() {
        let tmp = tempfile::tempdir().unwrap();
        let s = store(tmp.path());
        let last = tmp.path().join("last_reserved_ip.0");
        assert!(s.reserve(ip("10.9.0.100"), "ctr1", "eth0", 0).unwrap());
        assert!(s.reserve(ip("10.9.0.9"), "ctr2", "eth0", 0).unwrap());
        // The reference parses the file without trimming: no byte of "10.9.0.100" may stay.
        assert_eq!(fs::read(&last).unwrap(), b"10.9.0.9");
        assert!(s.reserve(ip("10.9.0.10"), "ctr3", "eth0", 0).unwrap());
        assert_eq!(fs::read(&last).unwrap(), b"10.9.0.10");
        assert_eq!(s.last_reserved(0), Some(ip("10.9.0.10")));
    }

    #[test]
    fn garbled_last_reserved_is_ignored() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("last_reserved_ip.0"), "10.9.0").unwrap();
        fs::write(tmp.path().join("last_reserved_ip.1"), "10.9.0.7\n").unwrap();
        let s = store(tmp.path());
        assert_eq!(s.last_reserved(0), None);
        assert_eq!(s.last_reserved(1), Some(ip("10.9.0.7")));
    }

    #[test]
    fn leases_only_count_address_named_files() {
        let tmp = tempfile::tempdir().unwrap();
        let s = store(tmp.path());
        s.reserve(ip("10.9.0.3"), "a", "eth0", 0).unwrap();
        fs::write(tmp.path().join("10.9.0.2"), "legacy\n").unwrap();
        fs::write(tmp.path().join("notes"), "a\r\neth0").unwrap();
        fs::create_dir(tmp.path().join("10.9.0.9")).unwrap();
        let leases = s.leases().unwrap();
        let ips: Vec<_> = leases.iter().map(|l| l.ip).collect();
        assert_eq!(ips, [ip("10.9.0.2"), ip("10.9.0.3")]);
        let mut leased = s.leased().unwrap();
        leased.sort();
        assert_eq!(leased, ips, "the names alone give the same addresses");
        assert_eq!(leases[0].owner(), ("legacy", None));
        assert_eq!(leases[1].owner(), ("a", Some("eth0")));
    }

    #[test]
    fn release_prefers_current_format_then_legacy() {
        let tmp = tempfile::tempdir().unwrap();
        let s = store(tmp.path());
        s.reserve(ip("10.9.0.3"), "a", "eth0", 0).unwrap();
        s.reserve(ip("10.9.0.4"), "a", "eth1", 0).unwrap();
        fs::write(tmp.path().join("10.9.0.2"), "a").unwrap();
        assert_eq!(
            s.owned_by("a", "eth0").unwrap(),
            [ip("10.9.0.2"), ip("10.9.0.3")]
        );
        assert_eq!(s.release_owner("a", "eth0").unwrap(), [ip("10.9.0.3")]);
        assert_eq!(s.release_owner("a", "eth0").unwrap(), [ip("10.9.0.2")]);
        assert_eq!(s.release_owner("a", "eth0").unwrap(), Vec::<IpAddr>::new());
        assert_eq!(s.owned_by("a", "eth1").unwrap(), [ip("10.9.0.4")]);
    }

    #[test]
    fn lock_times_out_while_held() {
        let tmp = tempfile::tempdir().unwrap();
        let held = store(tmp.path());
        let e = LockedStore::lock(tmp.path(), Duration::from_millis(30))
            .err()
            .expect("lock must be busy");
        assert!(matches!(e, IpamError::LockTimeout { .. }), "{e}");
        assert_eq!(e.cni_code(), crate::cni::error::code::TRY_AGAIN_LATER);
        drop(held);
        store(tmp.path());
    }

    #[test]
    fn network_names_stay_inside_data_dir() {
        for bad in ["", ".", "..", "a/b", "../x"] {
            assert!(network_dir(Path::new("/d"), bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            network_dir(Path::new("/d"), "net-1.a_b").unwrap(),
            PathBuf::from("/d/net-1.a_b")
        );
    }
}
