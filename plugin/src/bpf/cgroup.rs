//! The cgroup v2 side of the dataplane: where the cgroup v2 root is (found among the
//! mounts, or mounted by ebpf-cni), and the links of the programs attached there — the
//! socket-address programs (host ports for the node's own sockets, attached with the
//! node's first mapping) and the pacing program (attached with the first paced pod) —
//! pinned under the node's directory. A program on the root runs for every socket of the
//! machine, pods' included, whether or not it acts on it (each costs a run per `connect`,
//! `sendmsg`, `recvmsg`, `getpeername` or TCP event): so they are attached only while they
//! have a user, and [`settle_links`] detaches them when the last one goes (after every DEL
//! and GC removal), and with them the node's switch for the programs' host port lookups.

use std::{
    fs, io,
    os::fd::AsFd,
    path::{Path, PathBuf},
};

use super::{
    lock::NodeLock,
    maps::{any_pacing, host_ports::PortMaps},
    pin::{create_dir_all_racy, walk, NodeId, PinRoot},
    programs::{self, Program, Programs},
    sys, BpfError,
};

/// Where ebpf-cni mounts its own cgroup v2 hierarchy when none is reachable.
const OWN_CGROUP2: &str = "/run/ebpf-cni/cgroup2";

/// The root of the cgroup v2 hierarchy: the first cgroup2 mount of the hierarchy's root
/// that is reachable from here and really is cgroup2, else ebpf-cni's own mount at
/// [`OWN_CGROUP2`]. mountinfo can list a mount that is hidden (e.g. in a mount namespace
/// with a fresh sysfs over `/sys`, as `ip netns exec` makes): its path then leads to
/// another filesystem or nowhere, so each candidate is checked before it is used.
fn cgroup2_root() -> Result<PathBuf, BpfError> {
    let err = |path: &str, source| BpfError::Cgroup {
        path: PathBuf::from(path),
        source,
    };
    let mountinfo =
        fs::read_to_string("/proc/self/mountinfo").map_err(|e| err("/proc/self/mountinfo", e))?;
    let own = Path::new(OWN_CGROUP2);
    for path in cgroup2_candidates(&mountinfo)
        .into_iter()
        .chain([own.to_path_buf()])
    {
        if is_cgroup2(&path) {
            return Ok(path);
        }
        log::debug!("{} is not a reachable cgroup v2 mount", path.display());
    }
    fs::create_dir_all(own).map_err(|e| err(OWN_CGROUP2, e))?;
    nix::mount::mount(
        Some("cgroup2"),
        own,
        Some("cgroup2"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| err(OWN_CGROUP2, io::Error::from(e)))?;
    Ok(own.to_path_buf())
}

fn is_cgroup2(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
}

/// The mount points of the cgroup2 mounts of the hierarchy's root listed in `mountinfo`,
/// in its order (escapes such as `\040` for a space undone).
fn cgroup2_candidates(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            // `id parent maj:min root mountpoint options ... - fstype source superoptions`
            let (left, right) = line.split_once(" - ")?;
            let fields: Vec<&str> = left.split(' ').collect();
            (right.split(' ').next() == Some("cgroup2") && fields.get(3) == Some(&"/"))
                .then(|| fields.get(4).map(|mp| unescape_mountinfo(mp)))
                .flatten()
        })
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134`
/// backslash).
fn unescape_mountinfo(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| {
                let v = d.iter().fold(0u16, |v, c| v * 8 + u16::from(c - b'0'));
                u8::try_from(v).ok()
            });
        match octal {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// Attaches each socket-address program (as pinned on the node) to the cgroup v2 root
/// unless its link is pinned and live already.
pub fn ensure_sock_links(root: &PinRoot, node: &NodeId) -> Result<(), BpfError> {
    ensure_cgroup_links(root, node, programs::sock_addr())
}

/// The pacing program's link on the cgroup v2 root, as [`ensure_sock_links`].
pub fn ensure_pacing_link(root: &PinRoot, node: &NodeId) -> Result<(), BpfError> {
    ensure_cgroup_links(root, node, [&programs::PACING])
}

/// CHECK: the pacing program's link is pinned and live.
pub fn check_pacing_link(root: &PinRoot, node: &NodeId) -> Result<(), BpfError> {
    let dir = root.cgroup_dir(node);
    check_sock_link(&dir.join(programs::PACING.name), programs::PACING.name)
}

fn ensure_cgroup_links(
    root: &PinRoot,
    node: &NodeId,
    progs: impl IntoIterator<Item = &'static Program>,
) -> Result<(), BpfError> {
    let dir = root.cgroup_dir(node);
    let pinned = pinned_names(&dir);
    let mut cgroup: Option<fs::File> = None;
    for p in progs {
        let name = p.name;
        let attach_type = p
            .cgroup_attach_type()
            .expect("only cgroup programs are attached here");
        if pinned.iter().any(|n| n == name) {
            continue;
        }
        let path = dir.join(name);
        // A pin the directory read could not list (nothing else pins here).
        let _ = fs::remove_file(walk(&path));
        if cgroup.is_none() {
            let cg = cgroup2_root()?;
            cgroup = Some(fs::File::open(&cg).map_err(|source| BpfError::Cgroup {
                path: cg.clone(),
                source,
            })?);
            create_dir_all_racy(&dir)?;
        }
        let cg = cgroup.as_ref().expect("opened above");
        let fd = Programs::sock_fd(root, node, name)?;
        let link = sys::link_create_cgroup(fd.as_fd(), cg.as_fd(), attach_type)
            .map_err(|source| BpfError::AttachCgroup { name, source })?;
        sys::obj_pin(link.as_fd(), &path).map_err(|source| BpfError::PinTcxLink {
            path: path.clone(),
            source,
        })?;
    }
    Ok(())
}

/// The node's cgroup links in line with their users, under the node lock: the socket
/// programs stay attached while the node has a host port mapping, the pacing program while
/// a pod's sockets are paced; a link without users is detached (unpinning its only
/// reference detaches it), and with the socket programs the node's switch for the TC
/// programs' host port lookups goes off. A node with neither then has no program on the
/// cgroup root. Nothing to do on a node without pins.
pub fn settle_links(node: &NodeId) -> Result<(), BpfError> {
    let root = PinRoot::from_env();
    if !walk(&root.cgroup_dir(node)).exists()
        && !walk(&root.map(node, ebpf_cni_maps::PORTMAP_MAP)).exists()
    {
        return Ok(());
    }
    let _lock = NodeLock::take(&root)?;
    settle_links_locked(&root, node)
}

/// [`settle_links`] with the node lock held.
fn settle_links_locked(root: &PinRoot, node: &NodeId) -> Result<(), BpfError> {
    let dir = root.cgroup_dir(node);
    if walk(&root.map(node, ebpf_cni_maps::PORTMAP_MAP)).exists() {
        let mut pm = PortMaps::open(root, node)?;
        if !pm.any_mapping() {
            // The switch first: the programs act on no socket while their links go.
            pm.disable()?;
            for p in programs::sock_addr() {
                unpin_link(&dir.join(p.name))?;
            }
        }
    }
    let paced = any_pacing(root, node)?;
    if !paced {
        unpin_link(&dir.join(programs::PACING.name))?;
    }
    // Empty now: it goes (the next attach creates it again).
    match fs::remove_dir(&dir) {
        Err(e)
            if e.kind() != io::ErrorKind::NotFound
                && e.kind() != io::ErrorKind::DirectoryNotEmpty =>
        {
            Err(BpfError::DetachCgroup {
                path: dir,
                source: e,
            })
        }
        _ => Ok(()),
    }
}

/// Removes a link's pin, which detaches the link (nothing else holds it); a missing pin is
/// fine.
fn unpin_link(path: &Path) -> Result<(), BpfError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(BpfError::DetachCgroup {
            path: path.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// ADD's test of the links it may have to create: the names pinned in the node's cgroup
/// directory, read at once (one directory read, where opening each link and reading its
/// info took three system calls a link). Only ebpf-cni pins there, each link under its
/// program's name, and a pin keeps its link attached: the cgroup v2 root it is attached to
/// is never removed. A link someone detached while its pin stays (`bpftool link detach`)
/// is CHECK's to report ([`check_sock_link`]) and STATUS's to attach again
/// ([`links_to_restore`]).
fn pinned_names(dir: &Path) -> Vec<std::ffi::OsString> {
    fs::read_dir(walk(dir))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.file_name()))
                .collect()
        })
        .unwrap_or_default()
}

/// The links the node's users need that are not attached: the socket programs' while
/// `sockets_wanted` (the node's host-port switch is on, with its netns cookie), the pacing
/// program's where it is pinned (its users are the paced pods, which only ADD and DEL
/// count). A link is not attached when its pin is missing, or when the link was detached
/// while its pin stayed (`bpftool link detach`). STATUS's and the agent's convergence asks
/// (three system calls a link); ADD only lists the pins ([`pinned_names`]). Reads only.
pub fn links_to_restore(root: &PinRoot, node: &NodeId, sockets_wanted: bool) -> Vec<&'static str> {
    let dir = root.cgroup_dir(node);
    let pinned = pinned_names(&dir);
    let pacing = pinned.iter().any(|n| n == programs::PACING.name);
    programs::sock_addr()
        .filter(|_| sockets_wanted)
        .chain(Some(&programs::PACING).filter(|_| pacing))
        .map(|p| p.name)
        .filter(|name| !link_live(&dir.join(name)))
        .collect()
}

/// Attaches the programs `names` (from [`links_to_restore`]) to the cgroup v2 root again:
/// each pin goes (its link is detached, or missing), then each is attached and pinned anew.
pub fn restore_links(
    root: &PinRoot,
    node: &NodeId,
    names: &[&'static str],
) -> Result<(), BpfError> {
    let dir = root.cgroup_dir(node);
    for name in names {
        unpin_link(&dir.join(name))?;
    }
    ensure_cgroup_links(
        root,
        node,
        programs::sock_addr()
            .chain([&programs::PACING])
            .filter(|p| names.contains(&p.name)),
    )
}

/// One pinned link is a cgroup link still attached (two `bpf()` calls): only ebpf-cni pins
/// there, and always the program of the pin's name, so the program's name is left to CHECK
/// ([`check_sock_link`]), which reads it too.
fn link_live(path: &Path) -> bool {
    super::links::describe(path)
        .is_ok_and(|info| info.link_type == sys::BPF_LINK_TYPE_CGROUP && info.ifindex != 0)
}

/// The link pinned at `path` is a live cgroup link of program `name`.
pub fn check_sock_link(path: &Path, name: &'static str) -> Result<(), BpfError> {
    super::links::require_pin("socket program link", path)?;
    let info = super::links::describe(path)?;
    let actual = sys::prog_name(info.prog_id).unwrap_or_default();
    // For a cgroup link, the field read as `ifindex` is the low half of the cgroup id: 0
    // once the link was detached.
    if info.link_type != sys::BPF_LINK_TYPE_CGROUP || actual != name || info.ifindex == 0 {
        return Err(BpfError::SockLinkStale {
            path: path.to_path_buf(),
            expected: name,
            actual,
        });
    }
    Ok(())
}

/// CHECK: every socket program's link is pinned and live.
pub fn check_sock_links(root: &PinRoot, node: &NodeId) -> Result<(), BpfError> {
    let dir = root.cgroup_dir(node);
    for p in programs::sock_addr() {
        check_sock_link(&dir.join(p.name), p.name)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup2_candidates_in_mountinfo_order() {
        let mountinfo = "\
24 1 0:22 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
35 24 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate
36 35 0:31 / /sys/fs/cgroup/unified rw shared:10 - cgroup2 cgroup2 rw
37 24 0:30 /kubepods /var/lib/sub rw shared:9 - cgroup2 cgroup2 rw
38 24 0:32 / /sys/fs/cgroup/systemd rw shared:11 - cgroup cgroup rw,name=systemd
39 24 0:30 / /run/my\\040cgroup rw shared:9 - cgroup2 cgroup2 rw
40 24 0:33 / /x rw shared:12 opt:1 - cgroup2 none rw
";
        assert_eq!(
            cgroup2_candidates(mountinfo),
            [
                "/sys/fs/cgroup",
                "/sys/fs/cgroup/unified",
                "/run/my cgroup",
                "/x"
            ]
            .map(PathBuf::from),
            "cgroup2 mounts of the hierarchy's root only (not a sub-cgroup, not v1), in order"
        );
        assert!(cgroup2_candidates("").is_empty());
        assert!(cgroup2_candidates("garbage without separator\n").is_empty());
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(
            unescape_mountinfo(r"/a\040b\011c\134d"),
            PathBuf::from("/a b\tc\\d")
        );
        // Not an escape: left as it is.
        assert_eq!(unescape_mountinfo(r"/a\9b\04"), PathBuf::from(r"/a\9b\04"));
        assert_eq!(unescape_mountinfo(r"/a\777"), PathBuf::from(r"/a\777"));
    }

    #[test]
    fn a_missing_or_other_filesystem_is_not_cgroup2() {
        assert!(!is_cgroup2(Path::new("/nonexistent/cgroup")));
        assert!(!is_cgroup2(Path::new("/proc")));
    }
}
