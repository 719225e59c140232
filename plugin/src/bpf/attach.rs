//! Attaching the host-veth programs, and finding, checking and removing them by their pins.

use std::{
    fs, io,
    os::fd::AsFd,
    path::{Path, PathBuf},
};

use aya::{
    maps::{Map, MapData, PerCpuArray},
    programs::{links::FdLink, tc::TcAttachOptions, LinkOrder, SchedClassifier},
    EbpfLoader,
};
use ebpf_cni_maps::{pin as names, TrafficCounters, COUNTERS_MAP};

use super::{
    error::RemoveFailure,
    pin::{create_dir_all_racy, ensure_bpffs_at, AttachmentPins, NodeId, PinRoot},
    sys, AttachmentKey, BpfError, Direction, PROGRAMS,
};

/// Kernel ids of one attached program and its link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttachedLink {
    pub program_id: u32,
    pub link_id: u32,
}

/// What [`attach_host_veth`] set up, for logs and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachInfo {
    /// The attachment's pin directory.
    pub pin_dir: PathBuf,
    /// `ecni_from_pod` at host veth ingress.
    pub from_pod: AttachedLink,
    /// `ecni_to_pod` at host veth egress.
    pub to_pod: AttachedLink,
    pub counters_map_id: u32,
}

/// Loads the embedded programs, attaches them to `host_ifname` (looked up in the calling
/// thread's network namespace) through TCX links after any programs already there, and pins
/// both links and the counters map under the attachment's directory, so they stay when this
/// process exits.
///
/// Pins left for the same key by an earlier run (e.g. one killed midway, or whose veth is
/// gone) are replaced. On error nothing of this attachment stays pinned or attached.
pub fn attach_host_veth(
    node: &NodeId,
    key: &AttachmentKey<'_>,
    host_ifname: &str,
) -> Result<AttachInfo, BpfError> {
    key.validate()?;
    if PROGRAMS.is_empty() {
        return Err(BpfError::NotBuilt);
    }
    let root = PinRoot::from_env();
    ensure_bpffs_at(&root)?;
    let pins = root.attachment(node, key);
    let stop_at = root.attachments_dir(node);

    if fs::symlink_metadata(pins.dir()).is_ok() {
        log::warn!("replacing the stale attachment at {}", pins.dir().display());
        remove_attachment(&stop_at, &pins)?;
    }
    attach_and_pin(&pins, host_ifname).inspect_err(|_| {
        // Unpinning is what detaches: the process' own link fds are closed by then.
        if let Err(e) = remove_attachment(&stop_at, &pins) {
            log::error!("rolling back a failed attach: {e}");
        }
    })
}

fn attach_and_pin(pins: &AttachmentPins, host_ifname: &str) -> Result<AttachInfo, BpfError> {
    create_dir_all_racy(pins.dir())?;

    // No target BTF: the programs use no CO-RE relocations, and parsing the kernel's BTF
    // would cost every ADD about 25 ms (half of the attach) for nothing. Put it back
    // (`EbpfLoader::new()`'s default) when a program needs relocating.
    let mut ebpf = EbpfLoader::new()
        .btf(None)
        .load(PROGRAMS)
        .map_err(|source| BpfError::Load {
            source: Box::new(source),
        })?;

    let counters_map_id = {
        let Some(Map::PerCpuArray(map)) = ebpf.map(COUNTERS_MAP) else {
            return Err(BpfError::MissingMap { name: COUNTERS_MAP });
        };
        let path = pins.counters();
        map.pin(&path).map_err(|source| BpfError::PinMap {
            path,
            source: Box::new(source),
        })?;
        map.info()
            .map_err(|source| BpfError::MapInfo {
                name: COUNTERS_MAP,
                source: Box::new(source),
            })?
            .id()
    };

    // Load (verify) both programs before attaching either, so a verifier failure never
    // touches the device.
    for direction in Direction::ALL {
        classifier(&mut ebpf, direction)?
            .load()
            .map_err(|source| BpfError::Program {
                name: direction.program(),
                source: Box::new(source),
            })?;
    }
    let mut links = [None; 2];
    for direction in Direction::ALL {
        links[direction.index()] = Some(attach_one(&mut ebpf, direction, host_ifname, pins)?);
    }
    let [Some(from_pod), Some(to_pod)] = links else {
        unreachable!("every direction was attached above");
    };
    Ok(AttachInfo {
        pin_dir: pins.dir().to_path_buf(),
        from_pod,
        to_pod,
        counters_map_id,
    })
}

fn classifier(
    ebpf: &mut aya::Ebpf,
    direction: Direction,
) -> Result<&mut SchedClassifier, BpfError> {
    let name = direction.program();
    ebpf.program_mut(name)
        .ok_or(BpfError::MissingProgram { name })?
        .try_into()
        .map_err(|source| BpfError::Program {
            name,
            source: Box::new(source),
        })
}

fn attach_one(
    ebpf: &mut aya::Ebpf,
    direction: Direction,
    host_ifname: &str,
    pins: &AttachmentPins,
) -> Result<AttachedLink, BpfError> {
    let name = direction.program();
    let prog = classifier(ebpf, direction)?;
    let attach_err = |source| BpfError::Attach {
        name,
        ifname: host_ifname.to_owned(),
        direction: direction.label(),
        source: Box::new(source),
    };
    let link_id = prog
        .attach_with_options(
            host_ifname,
            direction.tc_attach_type(),
            TcAttachOptions::TcxOrder(LinkOrder::default()),
        )
        .map_err(attach_err)?;
    // Taken out of aya's bookkeeping, the link lives as long as this fd or its pin.
    let link = prog.take_link(link_id).map_err(attach_err)?;
    let link = FdLink::try_from(link).map_err(|source| BpfError::LinkInfo {
        name,
        source: Box::new(source),
    })?;
    let info = link.info().map_err(|source| BpfError::LinkInfo {
        name,
        source: Box::new(source),
    })?;
    let path = pins.link(direction);
    link.pin(&path).map_err(|source| BpfError::PinLink {
        path,
        source: Box::new(source),
    })?;
    Ok(AttachedLink {
        program_id: info.program_id(),
        link_id: info.id(),
    })
}

/// Removes the attachment's pins (which detaches its programs and frees its map), its
/// directory and any parents left empty, up to `attachments/`. `Ok(false)` when there was
/// nothing to remove. Keeps going past errors and reports them all.
pub fn detach(node: &NodeId, key: &AttachmentKey<'_>) -> Result<bool, BpfError> {
    key.validate()?;
    let root = PinRoot::from_env();
    remove_attachment(&root.attachments_dir(node), &root.attachment(node, key))
}

fn remove_attachment(stop_at: &Path, pins: &AttachmentPins) -> Result<bool, BpfError> {
    let mut failures = Vec::new();
    let mut removed = false;
    let mut fail = |path: &Path, source| {
        failures.push(RemoveFailure {
            path: path.to_path_buf(),
            source,
        })
    };

    // Everything in the directory is ours, including pins a newer or older binary may have
    // added, so remove all of it rather than a list of known names.
    match fs::read_dir(pins.dir()) {
        Ok(entries) => {
            for entry in entries {
                match entry.map(|e| e.path()) {
                    Ok(path) => match fs::remove_file(&path) {
                        Ok(()) => removed = true,
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => fail(&path, e),
                    },
                    Err(e) => fail(pins.dir(), e),
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => fail(pins.dir(), e),
    }

    let mut dir = pins.dir();
    while dir != stop_at && dir.starts_with(stop_at) {
        match fs::remove_dir(dir) {
            Ok(()) => removed |= dir == pins.dir(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            // Another attachment still lives below: leave it and everything above.
            Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => break,
            Err(e) => {
                fail(dir, e);
                break;
            }
        }
        let Some(parent) = dir.parent() else { break };
        dir = parent;
    }

    if failures.is_empty() {
        Ok(removed)
    } else {
        Err(BpfError::Detach {
            dir: pins.dir().to_path_buf(),
            failures,
        })
    }
}

/// Verifies the attachment is still as ADD left it: both link pins exist and each is a TCX
/// link of our program, attached to `host_ifindex` in its direction, and the counters map is
/// pinned. Errors name the first missing or different piece.
pub fn check(node: &NodeId, key: &AttachmentKey<'_>, host_ifindex: u32) -> Result<(), BpfError> {
    key.validate()?;
    let pins = PinRoot::from_env().attachment(node, key);
    for direction in Direction::ALL {
        check_link(&pins, direction, host_ifindex)?;
    }
    open_counters(&pins).map(drop)
}

fn require_pin(what: &'static str, path: &Path) -> Result<(), BpfError> {
    match fs::symlink_metadata(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(BpfError::PinMissing {
            what,
            path: path.to_path_buf(),
        }),
        Err(source) => Err(BpfError::OpenPin {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn check_link(
    pins: &AttachmentPins,
    direction: Direction,
    host_ifindex: u32,
) -> Result<(), BpfError> {
    let path = pins.link(direction);
    require_pin(direction.link_pin_name(), &path)?;
    let fd = sys::obj_get(&path).map_err(|source| BpfError::OpenPin {
        path: path.clone(),
        source,
    })?;
    let info = sys::link_info(fd.as_fd()).map_err(|source| BpfError::PinInfo {
        path: path.clone(),
        source,
    })?;
    let link = direction.label();
    if info.link_type != sys::BPF_LINK_TYPE_TCX {
        return Err(BpfError::NotTcxLink {
            link,
            path,
            link_type: info.link_type,
        });
    }
    if info.ifindex == 0 {
        return Err(BpfError::LinkDefunct { link, path });
    }
    if info.ifindex != host_ifindex {
        return Err(BpfError::WrongIfindex {
            link,
            actual: info.ifindex,
            expected: host_ifindex,
        });
    }
    if info.attach_type != direction.tcx_attach_type() {
        return Err(BpfError::WrongAttachType {
            link,
            actual: info.attach_type,
            expected: direction.tcx_attach_type(),
        });
    }
    let program = sys::prog_name(info.prog_id).map_err(|source| BpfError::PinInfo {
        path: path.clone(),
        source,
    })?;
    if program != direction.program() {
        return Err(BpfError::WrongProgram {
            link,
            actual: program,
            expected: direction.program(),
        });
    }
    Ok(())
}

fn open_counters(pins: &AttachmentPins) -> Result<PerCpuArray<MapData, TrafficCounters>, BpfError> {
    let path = pins.counters();
    require_pin(names::COUNTERS, &path)?;
    let open_err = |source| BpfError::OpenMap {
        path: path.clone(),
        source: Box::new(source),
    };
    let data = MapData::from_pin(&path).map_err(open_err)?;
    let actual = data
        .info()
        .map_err(open_err)?
        .name_as_str()
        .map(str::to_owned);
    if actual.as_deref() != Some(COUNTERS_MAP) {
        return Err(BpfError::WrongMap {
            path,
            actual: actual.unwrap_or_default(),
            expected: COUNTERS_MAP,
        });
    }
    let map = Map::from_map_data(data).map_err(open_err)?;
    PerCpuArray::try_from(map).map_err(open_err)
}

/// The attachment's counters summed over all CPUs, indexed by [`Direction::index`]
/// (`[from pod, to pod]`).
pub fn read_counters(
    node: &NodeId,
    key: &AttachmentKey<'_>,
) -> Result<[TrafficCounters; 2], BpfError> {
    key.validate()?;
    let pins = PinRoot::from_env().attachment(node, key);
    let array = open_counters(&pins)?;
    let mut totals = [TrafficCounters::default(); 2];
    for direction in Direction::ALL {
        let index = direction.index() as u32;
        let per_cpu = array.get(&index, 0).map_err(|source| BpfError::ReadMap {
            path: pins.counters(),
            index,
            source: Box::new(source),
        })?;
        let total = &mut totals[direction.index()];
        for cpu in per_cpu.iter() {
            total.packets = total.packets.wrapping_add(cpu.packets);
            total.bytes = total.bytes.wrapping_add(cpu.bytes);
        }
    }
    Ok(totals)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(container_id: &str) -> AttachmentKey<'_> {
        AttachmentKey {
            network: "net",
            container_id,
            ifname: "eth0",
        }
    }

    /// Pins are plain files for `remove_attachment`, so a temp dir stands in for bpffs.
    fn fake_attachment(root: &PinRoot, node: &NodeId, container_id: &str) -> AttachmentPins {
        let pins = root.attachment(node, &key(container_id));
        fs::create_dir_all(pins.dir()).unwrap();
        for d in Direction::ALL {
            fs::write(pins.link(d), b"").unwrap();
        }
        fs::write(pins.counters(), b"").unwrap();
        pins
    }

    #[test]
    fn remove_prunes_empty_parents_up_to_attachments() {
        let tmp = tempfile::tempdir().unwrap();
        let root = PinRoot::new(tmp.path());
        let node = NodeId::from_netns_inode(42);
        let stop_at = root.attachments_dir(&node);
        let a = fake_attachment(&root, &node, "a");
        let b = fake_attachment(&root, &node, "b");
        fs::write(a.dir().join("from_a_newer_binary"), b"").unwrap();

        assert!(remove_attachment(&stop_at, &a).unwrap());
        assert!(!a.dir().exists());
        assert!(
            !a.dir().parent().unwrap().exists(),
            "empty container dir pruned"
        );
        assert!(b.counters().exists(), "the sibling is untouched");

        assert!(remove_attachment(&stop_at, &b).unwrap());
        assert!(!stop_at.join("net").exists(), "empty network dir pruned");
        assert!(stop_at.is_dir(), "attachments/ itself stays");

        assert!(
            !remove_attachment(&stop_at, &b).unwrap(),
            "second time: nothing there"
        );
    }
}
