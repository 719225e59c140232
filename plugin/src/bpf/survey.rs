//! Whether the node can take another pod (STATUS), read without changing anything: the
//! programs in the binary, bpffs, the node's pins, and a load probe of the programs.

use aya::EbpfLoader;

use super::{
    maps::Maps,
    pin::{is_bpffs, NodeId, PinRoot},
    programs, revision, tree, BpfError,
};

/// Entries of each node map (but the arrays, see [`ebpf_cni_maps::NodeMap::array`]) in the
/// load probe: the hash maps preallocate their full size, tens of MiB together.
const PROBE_MAP_ENTRIES: u32 = 64;

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
    if programs::PROGRAMS.is_empty() {
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
    // The tree must be readable (ADD writes into it): one directory read says so. The
    // whole walk reads a directory per pod (about 500 system calls on a node of 100, on
    // every STATUS kubelet sends); it is made only when the maps are missing, to say how
    // many pods that cuts off.
    if let Err(e) = tree::networks(&root, node) {
        problems.push(Unready::from_error(&e, false));
    }
    let pinned_attachments = || tree::attachments(&root, node).map_or(0, |all| all.len());
    let rev = revision();
    // As `Programs::open_or_load` decides whether ADD loads them (the pacing program is
    // optional there).
    let programs_pinned = programs::required_pinned(&root, node, rev);
    match Maps::open(&root, node) {
        Ok(Some(_)) => {}
        Ok(None) => match pinned_attachments() {
            0 if programs_pinned => problems.push(Unready::new(
                format!(
                    "programs of revision {rev} are pinned under {} but the node's maps are missing: ADD would not find them",
                    root.node_dir(node).display()
                ),
                false,
            )),
            0 => {}
            attachments => problems.push(Unready::new(
                format!(
                    "the node's maps under {} are missing while {attachments} attachment(s) are pinned: their pods' traffic is no longer delivered by address, and pods added now would get new maps the existing pods do not see",
                    root.node_dir(node).display()
                ),
                true,
            )),
        },
        Err(e) => problems.push(Unready::from_error(&e, pinned_attachments() > 0)),
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
    for map in ebpf_cni_maps::NODE_MAPS.iter().filter(|m| !m.array) {
        loader.map_max_entries(map.name, PROBE_MAP_ENTRIES);
    }
    let mut ebpf = loader.load(programs::PROGRAMS).map_err(|source| {
        fail(BpfError::Load {
            source: Box::new(source),
        })
    })?;
    for p in programs::TABLE.iter().filter(|p| p.required()) {
        programs::load(&mut ebpf, p).map_err(fail)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unready_reasons_carry_the_cause() {
        let e = BpfError::ReadPinDir {
            path: "/p".into(),
            source: std::io::Error::from_raw_os_error(libc::EACCES),
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
}
