//! What a node's eBPF state holds and whether it can take another pod, read without
//! changing anything: the attachments pinned for one network (GC's inventory) and the
//! node's readiness (STATUS).

use std::{fs, io, path::Path};

use aya::{
    programs::{CgroupSockAddr, SchedClassifier},
    EbpfLoader,
};
use ebpf_cni_maps::{
    ENDPOINTS_MAP, NAT_REV_MAP, NODE_ADDRS_MAP, POD_COUNTERS_MAP, PORTMAP_HITS_MAP, PORTMAP_MAP,
    RATE_LIMITS_MAP, SOCK_REV_MAP,
};

use super::{
    dataplane::Maps,
    pin::{is_bpffs, NodeId, PinRoot},
    revision, BpfError, Hook, PROGRAMS, SOCK_PROGRAMS,
};

/// The node's hash maps, shrunk for the load probe (each preallocates its full size, tens
/// of MiB together). Arrays keep their size: the programs index them by constant.
const PROBE_SHRUNK_MAPS: [&str; 9] = [
    ENDPOINTS_MAP,
    POD_COUNTERS_MAP,
    RATE_LIMITS_MAP,
    PORTMAP_MAP,
    PORTMAP_HITS_MAP,
    NAT_REV_MAP,
    SOCK_REV_MAP,
    NODE_ADDRS_MAP,
    ebpf_cni_maps::PACING_MAP,
];
const PROBE_MAP_ENTRIES: u32 = 64;

/// `(container id, ifname)` of every attachment of `network` pinned on `node`, sorted.
/// Empty when the node or the network has none (or bpffs is not mounted).
pub fn network_attachments(
    node: &NodeId,
    network: &str,
) -> Result<Vec<(String, String)>, BpfError> {
    let dir = PinRoot::from_env().network_attachments_dir(node, network);
    let mut out = Vec::new();
    for cid in subdirs(&dir)? {
        for ifname in subdirs(&dir.join(&cid))? {
            out.push((cid.clone(), ifname));
        }
    }
    out.sort();
    Ok(out)
}

/// Names of the directories in `dir`; none when `dir` does not exist. Names that are not
/// UTF-8 cannot be ours and are skipped.
fn subdirs(dir: &Path) -> Result<Vec<String>, BpfError> {
    let err = |source| BpfError::ReadPinDir {
        path: dir.into(),
        source,
    };
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(err(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(err)?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            if let Ok(name) = entry.file_name().into_string() {
                out.push(name);
            }
        }
    }
    Ok(out)
}

/// Every attachment directory of the node, all networks.
fn node_attachment_count(root: &PinRoot, node: &NodeId) -> Result<usize, BpfError> {
    let dir = root.attachments_dir(node);
    let mut n = 0;
    for net in subdirs(&dir)? {
        for cid in subdirs(&dir.join(&net))? {
            n += subdirs(&dir.join(&net).join(&cid))?.len();
        }
    }
    Ok(n)
}

/// One reason the node cannot serve ADD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unready {
    pub reason: String,
    /// The pods already attached suffer from it too (spec 1.1 STATUS code 51).
    pub pods_affected: bool,
}

impl Unready {
    fn new(reason: String, pods_affected: bool) -> Self {
        Self {
            reason,
            pods_affected,
        }
    }

    fn from_error(e: &(dyn std::error::Error + 'static), pods_affected: bool) -> Self {
        let mut reason = e.to_string();
        for line in crate::cni::error::source_lines(e) {
            reason.push_str(": ");
            reason.push_str(&line);
        }
        Self::new(reason, pods_affected)
    }
}

/// Whether an ADD on this node would get its dataplane, as ADD itself decides it, and
/// what stands in the way: the programs must be in the binary; bpffs must be mounted (or
/// mountable: ADD mounts the default root); if this revision's programs are pinned the
/// node's maps must be too (ADD opens both), else the kernel must accept the programs — a
/// load into throw-away maps shrunk to one entry, nothing pinned, nothing attached.
/// Maps missing or unreadable while attachments exist also cut the pods already there off
/// from each other and from pods added later, which get new maps.
pub fn readiness(node: &NodeId) -> Vec<Unready> {
    if PROGRAMS.is_empty() {
        return vec![Unready::from_error(&BpfError::NotBuilt, false)];
    }
    let root = PinRoot::from_env();
    match is_bpffs(root.bpffs()) {
        Ok(true) => {}
        // Nothing can be pinned there yet: only the programs are left to try.
        Ok(false) if root.is_default() && root.bpffs().is_dir() => {
            return probe_load().err().into_iter().collect();
        }
        Ok(false) if root.is_default() => {
            return vec![Unready::new(
                format!(
                    "{} does not exist, so no bpf filesystem can be mounted there",
                    root.bpffs().display()
                ),
                false,
            )];
        }
        Ok(false) => {
            return vec![Unready::from_error(
                &BpfError::NotBpffs {
                    path: root.bpffs().into(),
                },
                false,
            )]
        }
        Err(e) => return vec![Unready::from_error(&e, false)],
    }

    let mut problems = Vec::new();
    let attachments = match node_attachment_count(&root, node) {
        Ok(n) => n,
        Err(e) => {
            problems.push(Unready::from_error(&e, false));
            0
        }
    };
    let rev = revision();
    // As `Programs::open_or_load` decides whether ADD loads them (the pacing program is
    // optional there).
    let programs_pinned = Hook::ALL
        .iter()
        .map(|h| h.program())
        .chain(SOCK_PROGRAMS.iter().map(|(name, _)| *name))
        .all(|name| root.program(node, rev, name).exists());
    match Maps::open(&root, node) {
        Ok(Some(_)) => {}
        Ok(None) if attachments > 0 => problems.push(Unready::new(
            format!(
                "the node's maps under {} are missing while {attachments} attachment(s) are pinned: their pods' traffic is no longer delivered by address, and pods added now would get new maps the existing pods do not see",
                root.node_dir(node).display()
            ),
            true,
        )),
        Ok(None) if programs_pinned => problems.push(Unready::new(
            format!(
                "programs of revision {rev} are pinned under {} but the node's maps are missing: ADD would not find them",
                root.node_dir(node).display()
            ),
            false,
        )),
        Ok(None) => {}
        Err(e) => problems.push(Unready::from_error(&e, attachments > 0)),
    }
    if !programs_pinned {
        problems.extend(probe_load().err());
    }
    problems
}

/// Loads (verifies) every program as the first ADD of a node would (the TC programs and the
/// socket-address ones), into unpinned hash maps of a few entries so the probe costs no
/// memory worth mentioning. Everything is released when it returns.
fn probe_load() -> Result<(), Unready> {
    let fail = |e: BpfError| Unready::from_error(&e, false);
    super::kernel::require_minimum().map_err(fail)?;
    let mut loader = EbpfLoader::new();
    loader.btf(None);
    for name in PROBE_SHRUNK_MAPS {
        loader.map_max_entries(name, PROBE_MAP_ENTRIES);
    }
    let mut ebpf = loader.load(PROGRAMS).map_err(|source| {
        fail(BpfError::Load {
            source: Box::new(source),
        })
    })?;
    let mut load_all = || -> Result<(), BpfError> {
        for hook in Hook::ALL {
            load_program!(ebpf, SchedClassifier, hook.program());
        }
        for (name, _) in SOCK_PROGRAMS {
            load_program!(ebpf, CgroupSockAddr, name);
        }
        Ok(())
    };
    load_all().map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unready_reasons_carry_the_cause() {
        let e = BpfError::ReadPinDir {
            path: "/p".into(),
            source: io::Error::from_raw_os_error(libc::EACCES),
        };
        let u = Unready::from_error(&e, true);
        assert!(
            u.reason
                .starts_with("failed to list the pin directory /p: "),
            "{}",
            u.reason
        );
        assert!(u.reason.contains("denied"), "{}", u.reason);
        assert!(u.pods_affected);
    }

    #[test]
    fn subdirs_of_a_missing_directory_are_none() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(subdirs(&tmp.path().join("nope")).unwrap().is_empty());
        fs::create_dir_all(tmp.path().join("a/eth0")).unwrap();
        fs::write(tmp.path().join("file"), b"").unwrap();
        assert_eq!(subdirs(tmp.path()).unwrap(), ["a"]);
    }
}
