//! TCX links: attaching a pinned program to a device, pinning the link, checking what a
//! pinned link is attached to, and removing pins (which detaches); and netlink mode's `bpf`
//! filters with their records.

use std::{
    fs, io,
    os::fd::{AsFd, BorrowedFd},
    path::Path,
};

use super::{
    error::RemoveFailure,
    pin::{create_dir_all_racy, walk},
    sys, BpfError, Hook,
};
use crate::netlink::tc;

/// Attaches the program `prog` (an fd of a pinned program) to device `ifindex` at `hook`
/// through a TCX link after the programs already there, and pins the link at `path`, so it
/// stays when this process exits.
pub fn attach(
    prog: BorrowedFd<'_>,
    hook: Hook,
    ifname: &str,
    ifindex: u32,
    path: &Path,
) -> Result<(), BpfError> {
    let link = sys::link_create_tcx(prog, ifindex, hook.tcx_attach_type()).map_err(|source| {
        BpfError::AttachTcx {
            name: hook.program(),
            ifname: ifname.to_owned(),
            direction: hook.label(),
            source,
        }
    })?;
    sys::obj_pin(link.as_fd(), path).map_err(|source| BpfError::PinTcxLink {
        path: path.to_path_buf(),
        source,
    })
}

/// What the caller of [`attach_netlink`] already knows of the link (a pod's host veth,
/// which ADD created): its index (no lookup by name), and whether this ADD's earlier hook
/// already added the `clsact` qdisc (no second request that can only answer `EEXIST`).
#[derive(Clone, Copy, Debug)]
pub struct KnownLink {
    pub ifindex: u32,
    pub clsact_added: bool,
}

/// Netlink mode: adds the `clsact` qdisc if missing, attaches `prog` (an fd of a pinned
/// program) as a direct-action `bpf` filter named after the program (which the kernel keeps
/// after this process exits) and pins the program at `record`, so DEL, CHECK and the node
/// teardown know the filter is there. With `clsact_record` (a node device, which other tc
/// users share and which outlives the pods), a `clsact` this call created is recorded
/// there, so the teardown removes that qdisc and never one that was there before.
///
/// Over raw netlink with the fd (`netlink::tc`): no aya program object, whose opening
/// costs aya's kernel feature probes (about fifteen `bpf()` calls, test programs and maps
/// loaded) on every ADD.
pub fn attach_netlink(
    prog: BorrowedFd<'_>,
    hook: Hook,
    ifname: &str,
    record: &Path,
    clsact_record: Option<&Path>,
    known: Option<KnownLink>,
) -> Result<(), BpfError> {
    let name = hook.program();
    let attach_err = |source| BpfError::Attach {
        name,
        ifname: ifname.to_owned(),
        direction: hook.label(),
        source,
    };
    let (index, clsact_added) = match known {
        Some(k) => (k.ifindex, k.clsact_added),
        None => (
            nix::net::if_::if_nametoindex(ifname).map_err(|e| attach_err(e.into()))?,
            false,
        ),
    };
    if !clsact_added {
        // A qdisc that cannot be added fails the attach below.
        let created = tc::add_clsact(index).unwrap_or(false);
        if let (true, Some(path)) = (created, clsact_record) {
            create_dir_all_racy(path)?;
        }
    }
    let ingress = hook.tc_attach_type() == aya::programs::TcAttachType::Ingress;
    tc::add_bpf_filter(index, ingress, prog, name).map_err(attach_err)?;
    sys::obj_pin(prog, record).map_err(|source| BpfError::PinRecord {
        path: record.to_path_buf(),
        name,
        source,
    })
}

/// Netlink mode: removes `hook`'s filters (by program name) from `ifname`; a device that is
/// gone has none left.
pub fn detach_netlink(hook: Hook, ifname: &str) {
    if let Err(e) =
        aya::programs::tc::qdisc_detach_program(ifname, hook.tc_attach_type(), hook.program())
    {
        log::debug!("detaching {} from {ifname}: {e}", hook.program());
    }
}

/// Netlink mode, node device `ifname`: removes the device filter, then the `clsact` qdisc
/// if `clsact_record` says ebpf-cni created it and no filter (of anyone) is left on it:
/// another tc user's filter keeps the qdisc. Best effort, like [`detach_netlink`]; the
/// caller removes the records either way.
pub fn detach_device_netlink(ifname: &str, clsact_record: &Path) {
    detach_netlink(Hook::FromDev, ifname);
    if !clsact_record.is_dir() {
        return;
    }
    let Ok(index) = nix::net::if_::if_nametoindex(ifname) else {
        return;
    };
    match tc::clsact_filter_count(index) {
        Ok(0) => {
            if let Err(e) = tc::delete_clsact(index) {
                log::warn!("removing the clsact qdisc of {ifname}: {e}");
            }
        }
        Ok(n) => log::info!("keeping the clsact qdisc of {ifname}: {n} other filters on it"),
        Err(e) => log::warn!("listing the tc filters of {ifname}: {e}"),
    }
}

pub fn require_pin(what: &'static str, path: &Path) -> Result<(), BpfError> {
    match fs::symlink_metadata(walk(path)) {
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

/// What a pinned link is attached to, as the kernel says.
pub fn describe(path: &Path) -> Result<sys::TcxLinkInfo, BpfError> {
    let fd = sys::obj_get(path).map_err(|source| BpfError::OpenPin {
        path: path.to_path_buf(),
        source,
    })?;
    sys::link_info(fd.as_fd()).map_err(|source| BpfError::PinInfo {
        path: path.to_path_buf(),
        source,
    })
}

/// Verifies the link pinned at `path` is a live TCX link of `hook`'s program on `ifindex`.
pub fn check(hook: Hook, path: &Path, ifindex: u32) -> Result<(), BpfError> {
    require_pin(hook.link_pin_name(), path)?;
    let info = describe(path)?;
    let link = hook.label();
    if info.link_type != sys::BPF_LINK_TYPE_TCX {
        return Err(BpfError::NotTcxLink {
            link,
            path: path.to_path_buf(),
            link_type: info.link_type,
        });
    }
    if info.ifindex == 0 {
        return Err(BpfError::LinkDefunct {
            link,
            path: path.to_path_buf(),
        });
    }
    if info.ifindex != ifindex {
        return Err(BpfError::WrongIfindex {
            link,
            actual: info.ifindex,
            expected: ifindex,
        });
    }
    if info.attach_type != hook.tcx_attach_type() {
        return Err(BpfError::WrongAttachType {
            link,
            actual: info.attach_type,
            expected: hook.tcx_attach_type(),
        });
    }
    let program = sys::prog_name(info.prog_id).map_err(|source| BpfError::PinInfo {
        path: path.to_path_buf(),
        source,
    })?;
    if program != hook.program() {
        return Err(BpfError::WrongProgram {
            link,
            actual: program,
            expected: hook.program(),
        });
    }
    Ok(())
}

/// Removes every pin in `dir`, then `dir` and its parents while they are empty, stopping
/// at `stop_at`. Keeps going past errors and returns them. `Ok(false)`: nothing was there.
pub fn remove_dir_pins(stop_at: &Path, dir: &Path) -> Result<bool, Vec<RemoveFailure>> {
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
    match fs::read_dir(dir) {
        Ok(entries) => {
            for entry in entries {
                match entry.map(|e| e.path()) {
                    // A record kept as an empty directory (`clsact_created`) goes too.
                    Ok(path) if path.is_dir() => match fs::remove_dir(&path) {
                        Ok(()) => removed = true,
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => fail(&path, e),
                    },
                    Ok(path) => match fs::remove_file(&path) {
                        Ok(()) => removed = true,
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => fail(&path, e),
                    },
                    Err(e) => fail(dir, e),
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => fail(dir, e),
    }

    let mut cur = dir;
    while cur != stop_at && cur.starts_with(stop_at) {
        match fs::remove_dir(cur) {
            Ok(()) => removed |= cur == dir,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            // Another attachment still lives below: leave it and everything above.
            Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => break,
            Err(e) => {
                fail(cur, e);
                break;
            }
        }
        let Some(parent) = cur.parent() else { break };
        cur = parent;
    }
    if failures.is_empty() {
        Ok(removed)
    } else {
        Err(failures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remove_prunes_empty_parents_up_to_the_stop() {
        let tmp = tempfile::tempdir().unwrap();
        let stop = tmp.path().join("attachments");
        let a = stop.join("net/a/eth0");
        let b = stop.join("net/b/eth0");
        for d in [&a, &b] {
            fs::create_dir_all(d).unwrap();
            fs::write(d.join("link_from_pod"), b"").unwrap();
        }
        fs::write(a.join("from_a_newer_binary"), b"").unwrap();
        fs::create_dir(a.join("record_dir")).unwrap();
        assert!(remove_dir_pins(&stop, &a).unwrap());
        assert!(
            !a.exists() && !a.parent().unwrap().exists(),
            "dir and empty parent pruned"
        );
        assert!(b.join("link_from_pod").exists(), "the sibling is untouched");
        assert!(remove_dir_pins(&stop, &b).unwrap());
        assert!(
            !stop.join("net").exists() && stop.is_dir(),
            "pruned up to, not including, the stop"
        );
        assert!(
            !remove_dir_pins(&stop, &b).unwrap(),
            "second time: nothing there"
        );
    }
}
