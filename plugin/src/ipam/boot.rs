//! Leases a reboot left behind. After a hard reboot the runtime never DELs the pods it
//! lost, so their leases would stay until the ranges run out (containerd sends no GC).
//! Every lease ebpf-cni reserves has a record (see `store`), and each network's records
//! carry the boot they were last checked in: the first ADD of a new boot finds that boot
//! changed ([`needs_check`]: two small reads, no lock, so an ADD within one boot pays
//! nothing more), lists this network's leases of ours ([`leases_of_another_boot`]), and,
//! once the caller has found which of them lost their attachment, releases those
//! ([`reclaim`]) and records the new boot. Leases of other plugins sharing the directory
//! have no record and are never touched.

use std::io::ErrorKind;

use super::allocator::open_existing;
use super::config::HostLocalConfig;
use super::error::IpamError;
pub use super::store::current_boot as current;
use super::store::{network_dir, own_dir, recorded_boot, OwnLease};

/// Whether this network's records were last checked in another boot than `current` (without the lock:
/// [`leases_of_another_boot`] looks again under it). False when ebpf-cni never reserved an
/// address here, so nothing is written before the first lease is.
pub fn needs_check(
    conf: &HostLocalConfig,
    network: &str,
    current: &str,
) -> Result<bool, IpamError> {
    let dir = network_dir(&conf.data_dir, network)?;
    match recorded_boot(&dir)? {
        Some(boot) => Ok(boot != current),
        None => match std::fs::metadata(own_dir(&dir)) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(source) => Err(IpamError::Io {
                op: "stat",
                path: own_dir(&dir),
                source,
            }),
        },
    }
}

/// Our leases in a network whose records were last checked in another boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootLeases {
    /// The boot the records were checked in, if the file was there.
    pub recorded: Option<String>,
    pub current: String,
    pub leases: Vec<OwnLease>,
}

/// Our leases of `network` if its records were last checked in another boot than `current` (read under
/// the store's lock); `None` when they were checked in this one.
pub fn leases_of_another_boot(
    conf: &HostLocalConfig,
    network: &str,
    current: &str,
) -> Result<Option<BootLeases>, IpamError> {
    let Some(store) = open_existing(conf, network)? else {
        return Ok(None);
    };
    let dir = network_dir(&conf.data_dir, network)?;
    let recorded = recorded_boot(&dir)?;
    if recorded.as_deref() == Some(current) {
        return Ok(None);
    }
    let (leases, _) = store.own_leases()?;
    Ok(Some(BootLeases {
        recorded,
        current: current.to_owned(),
        leases,
    }))
}

/// Releases `dead` (each only if its lease and record still name the same owner: one
/// released since by DEL is not counted), drops records that describe no lease, and records
/// `boot` as checked. Returns the leases released.
pub fn reclaim(
    conf: &HostLocalConfig,
    network: &str,
    dead: &[OwnLease],
    boot: &str,
) -> Result<Vec<OwnLease>, IpamError> {
    let Some(store) = open_existing(conf, network)? else {
        return Ok(Vec::new());
    };
    let mut released = Vec::new();
    for lease in dead {
        if store.release_own(lease)? {
            released.push(lease.clone());
        }
    }
    let (_, stale) = store.own_leases()?;
    store.remove_records(&stale);
    store.record_boot(boot)?;
    store.tidy();
    Ok(released)
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::net::IpAddr;
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;

    use serde_json::json;

    use super::*;
    use crate::ipam::{allocate, gc, release, IpamRequest};

    const NET: &str = "testnet";

    fn conf(dir: &Path) -> HostLocalConfig {
        HostLocalConfig::parse(
            &json!({"type": "host-local", "dataDir": dir, "ranges": [[{"subnet": "10.9.0.0/28"}]]}),
            None,
        )
        .unwrap()
    }

    fn alloc(c: &HostLocalConfig, id: &str) -> IpAddr {
        alloc_requested(c, id, &[]).unwrap()
    }

    /// The address `id`'s eth0 gets, asking for `requested`.
    fn alloc_requested(
        c: &HostLocalConfig,
        id: &str,
        requested: &[IpAddr],
    ) -> Result<IpAddr, crate::ipam::IpamError> {
        let r = allocate(
            c,
            &IpamRequest {
                fresh: true,
                network: NET,
                container_id: id,
                ifname: "eth0",
                requested,
            },
        )?;
        Ok(r.ips[0].address.ip())
    }

    fn own(ip: IpAddr, id: &str) -> OwnLease {
        OwnLease {
            ip,
            container_id: id.into(),
            ifname: "eth0".into(),
        }
    }

    /// The names in ebpf-cni's directory of the network; none when it is gone.
    fn records(dir: &Path) -> Vec<String> {
        names(&dir.join(NET).join("ebpf-cni"))
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .map(|d| {
                d.map(|e| e.unwrap().file_name().into_string().unwrap())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    #[test]
    fn each_lease_of_ours_has_a_record_that_goes_with_it() {
        let tmp = tempfile::tempdir().unwrap();
        let c = conf(tmp.path());
        let a = alloc(&c, "a");
        let b = alloc(&c, "b");
        let boot = current().unwrap();
        let dir = tmp.path().join(NET);
        // Created with the first lease, holding this boot.
        assert_eq!(recorded_boot(&dir).unwrap().as_deref(), Some(boot.as_str()));
        // The record is the lease file under a second name: no file of its own.
        let record = dir.join("ebpf-cni").join(a.to_string());
        let lease = dir.join(a.to_string());
        assert_eq!(fs::read_to_string(&record).unwrap(), "a\r\neth0");
        assert_eq!(inode(&record), inode(&lease));
        assert_eq!(fs::metadata(&lease).unwrap().nlink(), 2);
        assert_eq!(
            records(tmp.path()),
            [a.to_string(), b.to_string(), "boot_id".into()]
        );
        // DEL and GC take the record with the lease; the boot's record goes with the last.
        release(&c, NET, "a", "eth0").unwrap();
        assert_eq!(records(tmp.path()), [b.to_string(), "boot_id".into()]);
        gc(&c, NET, &[]).unwrap();
        assert!(!dir.join("ebpf-cni").exists());
        assert!(!needs_check(&c, NET, &boot).unwrap());
    }

    /// What the reference host-local itself leaves in a network directory.
    const REFERENCE_FILES: [&str; 2] = ["last_reserved_ip.0", "lock"];

    #[test]
    fn the_last_release_leaves_only_the_references_files() {
        let tmp = tempfile::tempdir().unwrap();
        let c = conf(tmp.path());
        let dir = tmp.path().join(NET);
        let a = alloc(&c, "a");
        alloc(&c, "b");
        release(&c, NET, "a", "eth0").unwrap();
        // A released lease is unlinked: no file is kept for a later reservation.
        assert!(!dir.join(a.to_string()).exists());
        assert_eq!(fs::read_dir(dir.join("ebpf-cni")).unwrap().count(), 2);
        release(&c, NET, "b", "eth0").unwrap();
        assert_eq!(names(&dir), REFERENCE_FILES);
        // A DEL of nothing changes nothing.
        release(&c, NET, "b", "eth0").unwrap();
        assert_eq!(names(&dir), REFERENCE_FILES);
    }

    #[test]
    fn released_lease_files_an_earlier_build_kept_go_at_the_next_release() {
        let tmp = tempfile::tempdir().unwrap();
        let c = conf(tmp.path());
        let dir = tmp.path().join(NET);
        let a = alloc(&c, "a");
        // An earlier build kept released lease files in `ebpf-cni/spare/`, each marked
        // to name no owner, and one still linked as a lease after a crash.
        let spares = dir.join("ebpf-cni/spare");
        fs::create_dir(&spares).unwrap();
        fs::write(spares.join("10.9.0.9"), "#\r\neth0").unwrap();
        fs::hard_link(dir.join(a.to_string()), spares.join(a.to_string())).unwrap();
        let b = alloc(&c, "b");
        release(&c, NET, "a", "eth0").unwrap();
        assert!(!dir.join(a.to_string()).exists(), "the lease is released");
        assert_eq!(records(tmp.path()), [b.to_string(), "boot_id".into()]);
        release(&c, NET, "b", "eth0").unwrap();
        assert_eq!(names(&dir), REFERENCE_FILES);
    }

    #[test]
    fn records_a_rollbacks_del_left_go_at_the_next_release() {
        let tmp = tempfile::tempdir().unwrap();
        let c = conf(tmp.path());
        let dir = tmp.path().join(NET);
        let a = alloc(&c, "a");
        let b = alloc(&c, "b");
        let live = alloc(&c, "live");
        // A build that knows no records DELs `a` and `b`: their lease files go, the
        // records (links to them) stay.
        fs::remove_file(dir.join(a.to_string())).unwrap();
        fs::remove_file(dir.join(b.to_string())).unwrap();
        assert_eq!(
            records(tmp.path()),
            [
                a.to_string(),
                b.to_string(),
                live.to_string(),
                "boot_id".into()
            ]
        );
        // The next release of this build drops them and keeps the live one's.
        let other = alloc(&c, "other");
        release(&c, NET, "other", "eth0").unwrap();
        assert!(!dir.join(other.to_string()).exists());
        assert_eq!(records(tmp.path()), [live.to_string(), "boot_id".into()]);
        // A record file of an earlier build describing a live lease is kept too.
        let older = "10.9.0.12".parse::<IpAddr>().unwrap();
        fs::write(dir.join(older.to_string()), "older\r\neth0").unwrap();
        fs::write(dir.join("ebpf-cni").join(older.to_string()), "older/eth0").unwrap();
        gc(
            &c,
            NET,
            &[
                ("live".into(), "eth0".into()),
                ("older".into(), "eth0".into()),
            ],
        )
        .unwrap();
        assert_eq!(
            records(tmp.path()),
            [older.to_string(), live.to_string(), "boot_id".into()]
        );
        release(&c, NET, "live", "eth0").unwrap();
        release(&c, NET, "older", "eth0").unwrap();
        assert_eq!(names(&dir), REFERENCE_FILES);
    }

    fn inode(p: &Path) -> u64 {
        fs::metadata(p).unwrap().ino()
    }

    #[test]
    fn a_record_file_of_an_earlier_build_still_counts_and_a_left_record_is_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let c = conf(tmp.path());
        let dir = tmp.path().join(NET);
        let ours = alloc(&c, "ours");
        // An earlier build's record: a file of its own naming the owner as `<id>/<ifname>`.
        let old = "10.9.0.9".parse::<IpAddr>().unwrap();
        fs::write(dir.join(old.to_string()), "older\r\neth0").unwrap();
        fs::write(dir.join("ebpf-cni").join(old.to_string()), "older/eth0").unwrap();
        let listed = |c: &HostLocalConfig| {
            leases_of_another_boot(c, NET, "next-boot")
                .unwrap()
                .unwrap()
                .leases
        };
        assert_eq!(listed(&c), [own(ours, "ours"), own(old, "older")]);

        // Another plugin releases `ours`'s address (its lease file goes, our record stays);
        // reserving it again links the new lease in place of the left record.
        fs::remove_file(dir.join(ours.to_string())).unwrap();
        assert_eq!(listed(&c), [own(old, "older")]);
        let again = alloc_requested(&c, "again", &[ours]).unwrap();
        assert_eq!(again, ours);
        let record = dir.join("ebpf-cni").join(ours.to_string());
        assert_eq!(inode(&record), inode(&dir.join(ours.to_string())));
        assert_eq!(fs::read_to_string(&record).unwrap(), "again\r\neth0");
        // The reclaim after a reboot releases both, whichever form their record has.
        let released = reclaim(
            &c,
            NET,
            &[own(ours, "again"), own(old, "older")],
            "next-boot",
        )
        .unwrap();
        assert_eq!(released, [own(ours, "again"), own(old, "older")]);
        assert!(records(tmp.path()).is_empty(), "{:?}", records(tmp.path()));
    }

    #[test]
    fn releasing_another_plugins_lease_where_ebpf_cni_never_reserved_removes_it() {
        let tmp = tempfile::tempdir().unwrap();
        let c = conf(tmp.path());
        let dir = tmp.path().join(NET);
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("10.9.0.2"), "theirs\r\neth0").unwrap();
        release(&c, NET, "theirs", "eth0").unwrap();
        assert!(!dir.join("10.9.0.2").exists(), "the lease is released");
        // No directory of ebpf-cni's appears (it is only ever made with the boot id).
        assert!(!dir.join("ebpf-cni").exists());
    }

    #[test]
    fn nothing_is_checked_or_written_where_ebpf_cni_never_reserved() {
        let tmp = tempfile::tempdir().unwrap();
        let c = conf(tmp.path());
        assert!(!needs_check(&c, NET, "boot-1").unwrap());
        // A directory of the reference's alone.
        let dir = tmp.path().join(NET);
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("10.9.0.2"), "theirs\r\neth0").unwrap();
        assert!(!needs_check(&c, NET, "boot-1").unwrap());
        assert!(!dir.join("ebpf-cni").exists());
    }

    #[test]
    fn another_boot_releases_only_the_dead_leases_of_ours() {
        let tmp = tempfile::tempdir().unwrap();
        let c = conf(tmp.path());
        let dir = tmp.path().join(NET);
        let live = alloc(&c, "live");
        let dead = alloc(&c, "dead");
        let gone = alloc(&c, "gone");
        // Another plugin's lease, and a record of ours that no longer describes its lease
        // (the reference released the address and gave it to another container).
        fs::write(dir.join("10.9.0.10"), "theirs\r\neth0").unwrap();
        fs::write(dir.join("ebpf-cni").join("10.9.0.10"), "old/eth0").unwrap();

        let boot = current().unwrap();
        assert!(!needs_check(&c, NET, &boot).unwrap());
        assert_eq!(leases_of_another_boot(&c, NET, &boot).unwrap(), None);
        assert!(needs_check(&c, NET, "next-boot").unwrap());
        let found = leases_of_another_boot(&c, NET, "next-boot")
            .unwrap()
            .unwrap();
        assert_eq!(found.recorded.as_deref(), Some(boot.as_str()));
        assert_eq!(
            found.leases,
            [own(live, "live"), own(dead, "dead"), own(gone, "gone")]
        );

        // `gone` is released by a DEL between the listing and the reclaim: not counted.
        release(&c, NET, "gone", "eth0").unwrap();
        let released = reclaim(
            &c,
            NET,
            &[own(dead, "dead"), own(gone, "gone")],
            "next-boot",
        )
        .unwrap();
        assert_eq!(released, [own(dead, "dead")]);
        let mut left: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.parse::<IpAddr>().is_ok())
            .collect();
        left.sort();
        assert_eq!(left, ["10.9.0.10".to_string(), live.to_string()]);
        assert_eq!(records(tmp.path()), [live.to_string(), "boot_id".into()]);
        assert!(!needs_check(&c, NET, "next-boot").unwrap());
        assert_eq!(recorded_boot(&dir).unwrap().as_deref(), Some("next-boot"));
    }
}
