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
pub use super::store::{current_boot as current, BOOT_ID_FILE_ENV};
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

    fn records(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir.join(NET).join("ebpf-cni"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n != "spare")
            .collect();
        v.sort();
        v
    }

    fn spares(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir.join(NET).join("ebpf-cni/spare"))
            .map(|d| {
                d.map(|e| e.unwrap().file_name().into_string().unwrap())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    #[test]
    fn a_released_lease_file_serves_the_next_reservation() {
        let tmp = tempfile::tempdir().unwrap();
        let c = conf(tmp.path());
        let dir = tmp.path().join(NET);
        let a = alloc(&c, "a");
        let a_inode = inode(&dir.join(a.to_string()));
        release(&c, NET, "a", "eth0").unwrap();
        // Released: the lease and its record are gone; the file is a spare naming nobody.
        assert!(!dir.join(a.to_string()).exists());
        assert_eq!(records(tmp.path()), ["boot_id"]);
        assert_eq!(spares(tmp.path()), [a.to_string()]);
        let spare = dir.join("ebpf-cni/spare").join(a.to_string());
        assert_eq!(fs::read_to_string(&spare).unwrap(), "#\r\neth0");
        assert_eq!(inode(&spare), a_inode);

        // The next reservation (another address: round robin) takes it, with its owner's
        // content exactly (shorter than before: nothing of the old one is left).
        let b = alloc(&c, "b");
        assert_ne!(a, b);
        let lease = dir.join(b.to_string());
        assert_eq!(inode(&lease), a_inode);
        assert_eq!(fs::read_to_string(&lease).unwrap(), "b\r\neth0");
        assert_eq!(fs::metadata(&lease).unwrap().nlink(), 2);
        assert_eq!(
            inode(&dir.join("ebpf-cni").join(b.to_string())),
            a_inode,
            "the spare's name became the record"
        );
        assert!(spares(tmp.path()).is_empty());

        // A spare still linked elsewhere (a crash between linking it in and renaming it)
        // is no spare: its name goes, the file it shares stays as it is.
        release(&c, NET, "b", "eth0").unwrap();
        let other = dir.join("10.9.0.12");
        fs::write(&other, "someone\r\neth0").unwrap();
        let spare_b = dir.join("ebpf-cni/spare").join(b.to_string());
        fs::remove_file(&spare_b).unwrap();
        fs::hard_link(&other, &spare_b).unwrap();
        let d = alloc(&c, "d");
        assert_ne!(inode(&dir.join(d.to_string())), inode(&other));
        assert_eq!(fs::read_to_string(&other).unwrap(), "someone\r\neth0");
        assert_eq!(fs::metadata(&other).unwrap().nlink(), 1);
        assert!(spares(tmp.path()).is_empty());
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
        // DEL and GC take the record with the lease.
        release(&c, NET, "a", "eth0").unwrap();
        gc(&c, NET, &[]).unwrap();
        assert_eq!(records(tmp.path()), ["boot_id"]);
        assert!(!needs_check(&c, NET, &boot).unwrap());
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
        assert_eq!(records(tmp.path()), ["boot_id"]);
    }

    #[test]
    fn a_taken_address_leaves_the_spare_as_it_was() {
        let tmp = tempfile::tempdir().unwrap();
        let c = conf(tmp.path());
        let dir = tmp.path().join(NET);
        let a = alloc(&c, "a");
        let b = alloc(&c, "b");
        release(&c, NET, "a", "eth0").unwrap();
        let spare = dir.join("ebpf-cni/spare").join(a.to_string());
        // A request for `b`'s address is refused; the spare still names no owner (the
        // reference searches the spares too) and `b`'s lease is untouched.
        let refused = alloc_requested(&c, "c", &[b]);
        assert!(refused.is_err(), "{refused:?}");
        assert_eq!(fs::read_to_string(&spare).unwrap(), "#\r\neth0");
        assert_eq!(
            fs::read_to_string(dir.join(b.to_string())).unwrap(),
            "b\r\neth0"
        );
        assert_eq!(spares(tmp.path()), [a.to_string()]);
    }

    #[test]
    fn a_lease_still_linked_as_its_spare_is_released_and_its_spare_marked() {
        let tmp = tempfile::tempdir().unwrap();
        let c = conf(tmp.path());
        let dir = tmp.path().join(NET);
        let a = alloc(&c, "a");
        // A crash between linking a spare in as the lease and renaming it to the record:
        // the lease's file has its spare's name too.
        let spare = dir.join("ebpf-cni/spare").join(a.to_string());
        fs::create_dir_all(spare.parent().unwrap()).unwrap();
        fs::hard_link(dir.join(a.to_string()), &spare).unwrap();
        release(&c, NET, "a", "eth0").unwrap();
        assert!(!dir.join(a.to_string()).exists(), "the lease is released");
        assert_eq!(fs::read_to_string(&spare).unwrap(), "#\r\neth0");
        assert_eq!(records(tmp.path()), ["boot_id"]);
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
