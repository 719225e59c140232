//! The node's programs: the one table of every program of the embedded object (its name,
//! kind and where it attaches), which drives loading, pinning, the load probe and the
//! readiness check; and the programs of this binary's revision pinned on a node, loaded
//! (verified) by the node's first ADD and opened from their pins after.

use std::{
    fs,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::PathBuf,
    time::Instant,
};

use aya::{
    programs::{CgroupSockAddr, SchedClassifier, SockOps},
    Ebpf, EbpfLoader,
};

use super::{
    kernel,
    pin::{create_dir_all_racy, walk, NodeId, PinRoot},
    sys, BpfError, Hook,
};

/// The kernel-side object, copied to `OUT_DIR` by `build.rs`: empty unless built through
/// `cargo xtask build`.
pub(super) static PROGRAMS: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ebpf-cni-programs"));

/// Identifies the embedded object: programs pinned by a binary with other programs are
/// never reused by this one (it loads and pins its own next to them). `build.rs` computes
/// it ([`super::keys::fnv1a`] of the object) once at build time.
pub const fn revision() -> &'static str {
    env!("EBPF_CNI_REVISION")
}

/// Whether this binary carries its eBPF programs (see [`BpfError::NotBuilt`]).
pub fn programs_embedded() -> bool {
    !PROGRAMS.is_empty()
}

/// How each part of the dataplane runs on this kernel for `node` (see [`kernel`]). Whether
/// TCP pacing runs is the verifier's answer at the node's first load; on a node without
/// programs yet it is read off the kernel version.
pub fn part_modes(node: &NodeId) -> Vec<kernel::PartMode> {
    let root = PinRoot::from_env();
    let loaded = root
        .program(node, revision(), Hook::FromPod.program())
        .exists();
    let pacing = if loaded {
        Programs::pacing_available(&root, node)
    } else {
        kernel::version() >= (5, 15)
    };
    kernel::part_modes(pacing)
}

/// What a program is and where it attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A TC classifier on a device hook.
    Tc(Hook),
    /// A socket-address program on the cgroup v2 root, with its attach type: host ports
    /// for the node's own sockets, attached with the node's first host port mapping.
    SockAddr(u32),
    /// The sockops program on the cgroup v2 root, with its attach type: it paces limited
    /// pods' TCP sockets, attached with the node's first paced pod.
    SockOps(u32),
}

/// One program of the embedded object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Program {
    pub name: &'static str,
    pub kind: Kind,
}

impl Program {
    const fn tc(hook: Hook) -> Self {
        Self {
            name: hook.program(),
            kind: Kind::Tc(hook),
        }
    }

    const fn sock_addr(name: &'static str, attach_type: u32) -> Self {
        Self {
            name,
            kind: Kind::SockAddr(attach_type),
        }
    }

    /// Whether a node needs it. The pacing program does not: a kernel without
    /// `bpf_get_netns_cookie` in sock_ops (before 5.15) refuses it, and the node runs
    /// without pacing (see [`Programs::pacing_available`]).
    pub const fn required(&self) -> bool {
        !matches!(self.kind, Kind::SockOps(_))
    }

    /// The attach type of a program that attaches to the cgroup v2 root.
    pub const fn cgroup_attach_type(&self) -> Option<u32> {
        match self.kind {
            Kind::Tc(_) => None,
            Kind::SockAddr(t) | Kind::SockOps(t) => Some(t),
        }
    }
}

/// Every program of the embedded object, in load order.
pub const TABLE: [Program; 14] = [
    Program::tc(Hook::FromPod),
    Program::tc(Hook::ToPod),
    Program::tc(Hook::FromDev),
    Program::tc(Hook::FromChain),
    Program::tc(Hook::ToTunnel),
    Program::sock_addr(ebpf_cni_maps::PROG_CONNECT4, sys::BPF_CGROUP_INET4_CONNECT),
    Program::sock_addr(ebpf_cni_maps::PROG_CONNECT6, sys::BPF_CGROUP_INET6_CONNECT),
    Program::sock_addr(ebpf_cni_maps::PROG_SENDMSG4, sys::BPF_CGROUP_UDP4_SENDMSG),
    Program::sock_addr(ebpf_cni_maps::PROG_SENDMSG6, sys::BPF_CGROUP_UDP6_SENDMSG),
    Program::sock_addr(ebpf_cni_maps::PROG_RECVMSG4, sys::BPF_CGROUP_UDP4_RECVMSG),
    Program::sock_addr(ebpf_cni_maps::PROG_RECVMSG6, sys::BPF_CGROUP_UDP6_RECVMSG),
    Program::sock_addr(
        ebpf_cni_maps::PROG_PEERNAME4,
        sys::BPF_CGROUP_INET4_GETPEERNAME,
    ),
    Program::sock_addr(
        ebpf_cni_maps::PROG_PEERNAME6,
        sys::BPF_CGROUP_INET6_GETPEERNAME,
    ),
    PACING,
];

/// The sockops program pacing limited pods' TCP sockets.
pub const PACING: Program = Program {
    name: ebpf_cni_maps::PROG_SOCKOPS,
    kind: Kind::SockOps(sys::BPF_CGROUP_SOCK_OPS),
};

/// The socket-address programs, attached together with the node's first host port.
pub fn sock_addr() -> impl Iterator<Item = &'static Program> {
    TABLE.iter().filter(|p| matches!(p.kind, Kind::SockAddr(_)))
}

/// Whether every program a node needs is pinned for revision `rev` (ADD then opens them
/// instead of loading).
pub fn required_pinned(root: &PinRoot, node: &NodeId, rev: &str) -> bool {
    // One read of the directory, not a stat per program (twelve on every ADD).
    let Ok(entries) = fs::read_dir(walk(&root.revision_dir(node, rev))) else {
        return false;
    };
    let pinned: Vec<std::ffi::OsString> = entries.flatten().map(|e| e.file_name()).collect();
    TABLE
        .iter()
        .filter(|p| p.required())
        .all(|p| pinned.iter().any(|n| n.as_os_str() == p.name))
}

/// Loads (verifies) program `p` of `ebpf` as its aya type.
pub fn load<'e>(
    ebpf: &'e mut Ebpf,
    p: &Program,
) -> Result<&'e mut aya::programs::Program, BpfError> {
    let name = p.name;
    let err = |source| BpfError::Program {
        name,
        source: Box::new(source),
    };
    let prog = ebpf
        .program_mut(name)
        .ok_or(BpfError::MissingProgram { name })?;
    match p.kind {
        Kind::Tc(_) => <&mut SchedClassifier>::try_from(&mut *prog)
            .map_err(err)?
            .load()
            .map_err(err)?,
        Kind::SockAddr(_) => <&mut CgroupSockAddr>::try_from(&mut *prog)
            .map_err(err)?
            .load()
            .map_err(err)?,
        Kind::SockOps(_) => <&mut SockOps>::try_from(&mut *prog)
            .map_err(err)?
            .load()
            .map_err(err)?,
    }
    Ok(prog)
}

/// The programs of this binary's revision, pinned on the node.
pub struct Programs {
    paths: Vec<PathBuf>,
    fds: Vec<Option<OwnedFd>>,
}

impl Programs {
    fn index(hook: Hook) -> usize {
        Hook::ALL
            .iter()
            .position(|h| *h == hook)
            .expect("every hook has a program")
    }

    /// The program's fd, opened from its pin with one syscall (TCX attach path).
    pub fn fd(&mut self, hook: Hook) -> Result<BorrowedFd<'_>, BpfError> {
        let i = Self::index(hook);
        if self.fds[i].is_none() {
            let path = &self.paths[i];
            let fd = sys::obj_get(path).map_err(|source| BpfError::OpenPin {
                path: path.clone(),
                source,
            })?;
            self.fds[i] = Some(fd);
        }
        Ok(self.fds[i].as_ref().expect("opened above").as_fd())
    }

    /// The program's fd for a netlink filter (see `links::attach_netlink`): the same as
    /// [`Self::fd`].
    pub fn classifier(&mut self, hook: Hook) -> Result<BorrowedFd<'_>, BpfError> {
        self.fd(hook)
    }

    /// A cgroup program's fd, opened from its pin.
    pub fn sock_fd(root: &PinRoot, node: &NodeId, name: &'static str) -> Result<OwnedFd, BpfError> {
        let path = root.program(node, revision(), name);
        sys::obj_get(&path).map_err(|source| BpfError::OpenPin { path, source })
    }

    /// This revision's pinned programs, loaded (verified) and pinned first if this node has
    /// not all it needs yet, which also creates the node-wide maps or reuses their pins.
    pub fn open_or_load(root: &PinRoot, node: &NodeId) -> Result<Self, BpfError> {
        let rev = revision();
        if !required_pinned(root, node, rev) {
            load_and_pin(root, node, rev)?;
        }
        let paths: Vec<PathBuf> = Hook::ALL
            .iter()
            .map(|h| root.program(node, rev, h.program()))
            .collect();
        Ok(Self {
            fds: paths.iter().map(|_| None).collect(),
            paths,
        })
    }

    /// Whether this node's programs include the pacing program (`ecni_sockops`): the
    /// kernel refused it at the node's first load when it lacks `bpf_get_netns_cookie` in
    /// sock_ops programs (before 5.15), and egress limits are then policed only.
    ///
    /// Of any revision pinned: the kernel's answer does not depend on the build, and on a
    /// node whose binary was replaced, until the next ADD loads this revision, only the
    /// previous build's programs are pinned, its pods paced (CHECK of them failed with
    /// "TCP pacing ... expected none" when this looked at this revision only).
    /// This revision's pin is looked for first (one `stat`), the others only without it.
    pub fn pacing_available(root: &PinRoot, node: &NodeId) -> bool {
        if walk(&root.program(node, revision(), PACING.name)).exists() {
            return true;
        }
        let Ok(revisions) = fs::read_dir(walk(&root.programs_dir(node))) else {
            return false;
        };
        revisions
            .flatten()
            .any(|rev| rev.path().join(PACING.name).exists())
    }
}

fn load_and_pin(root: &PinRoot, node: &NodeId, rev: &str) -> Result<(), BpfError> {
    if PROGRAMS.is_empty() {
        return Err(BpfError::NotBuilt);
    }
    super::kernel::require_minimum()?;
    let maps_dir = root
        .map(node, ebpf_cni_maps::ENDPOINTS_MAP)
        .parent()
        .expect("maps live in a directory")
        .to_path_buf();
    create_dir_all_racy(&maps_dir)?;
    // No target BTF: the programs use no CO-RE relocations, and parsing the kernel's BTF
    // would cost the load about 25 ms for nothing.
    let mut loader = EbpfLoader::new();
    loader.btf(None);
    for map in ebpf_cni_maps::NODE_MAPS {
        loader.map_pin_path(map.name, root.map(node, map.name));
    }
    let started = Instant::now();
    let mut ebpf = loader.load(PROGRAMS).map_err(|source| BpfError::Load {
        source: Box::new(source),
    })?;
    log::debug!("maps created in {:.1} ms", ms(started));
    let dir = root.programs_dir(node).join(rev);
    create_dir_all_racy(&dir)?;
    for p in &TABLE {
        let mut load_and_pin = || -> Result<(), BpfError> {
            let name = p.name;
            let started = Instant::now();
            let prog = load(&mut ebpf, p)?;
            // The kernel counts them from 5.16 on.
            let insns = prog
                .info()
                .ok()
                .and_then(|i| i.verified_instruction_count());
            log::debug!(
                "{name} verified in {:.1} ms ({} instructions)",
                ms(started),
                insns.map_or_else(|| "?".to_string(), |n| n.to_string())
            );
            let path = dir.join(name);
            prog.pin(&path).map_err(|source| BpfError::PinProgram {
                path,
                name,
                source: Box::new(source),
            })
        };
        match load_and_pin() {
            Ok(()) => {}
            // The pacing program (the table's only optional one, see the test below): every
            // other part works without it (see `Programs::pacing_available`).
            Err(e) if !p.required() => log::warn!(
                "TCP pacing ({}) is unavailable on kernel {}, egress limits are policed only: {}",
                p.name,
                super::kernel::release(),
                crate::cni::error::source_lines(&e).join(": ")
            ),
            Err(e) => return Err(e),
        }
    }
    // Programs of other revisions stay alive as long as links use them; their pins only
    // served new attachments, which from now on get this revision.
    if let Ok(entries) = fs::read_dir(root.programs_dir(node)) {
        for e in entries.flatten() {
            if e.file_name() != rev {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
    // The node-wide switches the new programs read and that no pod's ADD sets yet.
    if let Some(mut maps) = super::maps::Maps::open(root, node)? {
        maps.settle_limits_switch()?;
    }
    log::info!("loaded and pinned eBPF programs revision {rev} for {node}");
    Ok(())
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_each_hook_once_and_one_optional_program() {
        let hooks: Vec<Hook> = TABLE
            .iter()
            .filter_map(|p| match p.kind {
                Kind::Tc(h) => Some(h),
                _ => None,
            })
            .collect();
        assert_eq!(hooks, Hook::ALL);
        assert_eq!(sock_addr().count(), 8);
        let optional: Vec<_> = TABLE.iter().filter(|p| !p.required()).collect();
        assert_eq!(optional, [&PACING]);
        let mut names: Vec<_> = TABLE.iter().map(|p| p.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), TABLE.len(), "names are unique");
    }

    /// The node's programs count as pinned when every required one is, whatever else the
    /// revision's directory holds; one missing makes ADD load them again.
    #[test]
    fn programs_are_pinned_when_every_required_one_is() {
        let tmp = tempfile::tempdir().unwrap();
        let root = PinRoot::new(tmp.path());
        let node = NodeId::from_netns_inode(4026531840);
        let rev = revision();
        assert!(!required_pinned(&root, &node, rev), "no directory");
        let dir = root.revision_dir(&node, rev);
        fs::create_dir_all(&dir).unwrap();
        for p in TABLE.iter().filter(|p| p.required()) {
            fs::write(dir.join(p.name), b"").unwrap();
        }
        fs::write(dir.join("something_else"), b"").unwrap();
        assert!(required_pinned(&root, &node, rev));
        assert!(
            !required_pinned(&root, &node, "another-revision"),
            "another build's directory is not this one's"
        );
        let some = TABLE.iter().find(|p| p.required()).unwrap();
        fs::remove_file(dir.join(some.name)).unwrap();
        assert!(
            !required_pinned(&root, &node, rev),
            "{} is missing",
            some.name
        );
    }
}
