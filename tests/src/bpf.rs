//! What eBPF is attached to a device and what is pinned, read from the kernel.
//!
//! TCX attachments are queried with `BPF_PROG_QUERY` from a thread inside the node
//! namespace (Debian's bpftool 7.1 predates TCX and does not list them); classic netlink tc
//! (`cls_bpf`) attachments come from `bpftool net show dev X -j`, run with only the network
//! namespace switched so bpftool sees the real /proc and bpffs. Pinned objects are opened
//! with `BPF_OBJ_GET` and described with `BPF_OBJ_GET_INFO_BY_FD`.
//!
//! [`fixture`] loads and attaches a trivial program, so the readers themselves can be
//! tested without the plugin.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::netns::Netns;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;

const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
pub const BPF_TCX_INGRESS: u32 = 46;
pub const BPF_TCX_EGRESS: u32 = 47;
pub const BPF_LINK_TYPE_TCX: u32 = 11;
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Where on the device a program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Direction {
    Ingress,
    Egress,
}

/// How the program is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mechanism {
    /// A TCX link or TCX prog attachment (kernel 6.6+).
    Tcx,
    /// A netlink `cls_bpf` filter on a clsact qdisc.
    NetlinkTc,
}

/// One program attached to a device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AttachedProg {
    pub mechanism: Mechanism,
    pub direction: Direction,
    pub prog_id: u32,
    /// The TCX link holding it (none for netlink tc or a link-less TCX attach).
    pub link_id: Option<u32>,
    pub name: String,
}

/// 8-byte aligned scratch buffer for `union bpf_attr` and info structs.
#[repr(C, align(8))]
struct Buf([u8; 256]);

impl Buf {
    fn new() -> Self {
        Self([0; 256])
    }
    fn put_u32(&mut self, off: usize, v: u32) {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
    }
    fn put_u64(&mut self, off: usize, v: u64) {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
    }
    fn u32_at(&self, off: usize) -> u32 {
        u32::from_ne_bytes(self.0[off..off + 4].try_into().expect("4 bytes"))
    }
    fn cstr_at(&self, off: usize, len: usize) -> String {
        let b = &self.0[off..off + len];
        let end = b.iter().position(|&c| c == 0).unwrap_or(len);
        String::from_utf8_lossy(&b[..end]).into_owned()
    }
}

fn sys_bpf(cmd: libc::c_long, attr: &mut Buf, size: usize) -> io::Result<libc::c_long> {
    // SAFETY: attr points to `size` initialized bytes that outlive the call; pointers inside
    // it (set by callers) point to live buffers of the sizes given to the kernel.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.0.as_mut_ptr(), size) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn fd_from(r: libc::c_long) -> OwnedFd {
    // SAFETY: the bpf syscall returned a new file descriptor that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(r as i32) }
}

/// Is `path` a mounted bpffs?
pub fn is_bpffs(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs writes into a zeroed struct of the right type.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid C string and st a valid out-pointer.
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    r == 0 && st.f_type as i64 == BPF_FS_MAGIC
}

/// Mounts bpffs at /sys/fs/bpf when it is not mounted (what CNI plugins do on a fresh node).
pub fn ensure_bpffs() -> Result<()> {
    let p = Path::new("/sys/fs/bpf");
    if is_bpffs(p) {
        return Ok(());
    }
    let out = std::process::Command::new("mount")
        .args(["-t", "bpf", "bpf", "/sys/fs/bpf"])
        .output()
        .context("running mount")?;
    // A concurrent test may have mounted it meanwhile.
    if !out.status.success() && !is_bpffs(p) {
        bail!("mounting bpffs: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// `if_nametoindex` in the calling thread's namespace.
fn ifindex(dev: &str) -> Result<u32> {
    let c = CString::new(dev)?;
    // SAFETY: c is a valid C string.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        bail!("no device {dev}: {}", io::Error::last_os_error());
    }
    Ok(idx)
}

/// A program's name from its id.
pub fn prog_name(prog_id: u32) -> io::Result<String> {
    let mut attr = Buf::new();
    attr.put_u32(0, prog_id);
    let fd = fd_from(sys_bpf(BPF_PROG_GET_FD_BY_ID, &mut attr, 16)?);
    let info = obj_info(&fd)?;
    Ok(info.cstr_at(64, 16))
}

/// A kind of BPF object, for [`object_exists`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    Prog,
    Map,
    Link,
}

/// Whether the kernel still holds the program, map or link with this id (anywhere: ids are
/// global). The kernel frees an object some time after its last reference goes (links and
/// pins are released from deferred work), so callers poll.
pub fn object_exists(kind: ObjectKind, id: u32) -> io::Result<bool> {
    let cmd = match kind {
        ObjectKind::Prog => BPF_PROG_GET_FD_BY_ID,
        ObjectKind::Map => BPF_MAP_GET_FD_BY_ID,
        ObjectKind::Link => BPF_LINK_GET_FD_BY_ID,
    };
    let mut attr = Buf::new();
    attr.put_u32(0, id);
    match sys_bpf(cmd, &mut attr, 16) {
        Ok(fd) => {
            drop(fd_from(fd));
            Ok(true)
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

fn obj_info(fd: &OwnedFd) -> io::Result<Buf> {
    let mut info = Buf::new();
    let mut attr = Buf::new();
    attr.put_u32(0, fd.as_raw_fd() as u32);
    attr.put_u32(4, info.0.len() as u32);
    attr.put_u64(8, info.0.as_mut_ptr() as u64);
    sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr, 16)?;
    Ok(info)
}

/// TCX query of one direction on `ifindex` (calling thread's namespace).
fn tcx_query(ifindex: u32, direction: Direction) -> io::Result<Vec<(u32, Option<u32>)>> {
    const CAP: usize = 64;
    let mut prog_ids = [0u32; CAP];
    let mut link_ids = [0u32; CAP];
    let mut attr = Buf::new();
    attr.put_u32(0, ifindex);
    attr.put_u32(
        4,
        match direction {
            Direction::Ingress => BPF_TCX_INGRESS,
            Direction::Egress => BPF_TCX_EGRESS,
        },
    );
    attr.put_u64(16, prog_ids.as_mut_ptr() as u64);
    attr.put_u32(24, CAP as u32);
    attr.put_u64(40, link_ids.as_mut_ptr() as u64);
    sys_bpf(BPF_PROG_QUERY, &mut attr, 64)?;
    let n = (attr.u32_at(24) as usize).min(CAP);
    Ok((0..n)
        .map(|i| (prog_ids[i], (link_ids[i] != 0).then_some(link_ids[i])))
        .collect())
}

/// Whether this kernel has TCX (6.6+): a TCX query of `lo` (ifindex 1 in every namespace)
/// is refused with EINVAL by kernels that do not know the attach type. Probed, not read off
/// the version, as the plugin decides.
pub fn kernel_has_tcx() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| tcx_query(1, Direction::Ingress).is_ok())
}

/// (major, minor) of the running kernel.
pub fn kernel_version() -> (u32, u32) {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// `getsockopt(SO_NETNS_COOKIE)` (5.14+). Without it ebpf-cni learns the node's namespace
/// cookie through a probe of its `connect4` program instead; `inspect` names which
/// (docs/kernels.md, "Kernel requirements").
pub fn kernel_has_so_netns_cookie() -> bool {
    const SO_NETNS_COOKIE: libc::c_int = 71;
    let Ok(sock) = std::net::UdpSocket::bind("127.0.0.1:0") else {
        return false;
    };
    let mut cookie = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt into a u64 of the length passed, on a socket we own.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    rc == 0
}

/// Whether the kernel has the `fq` qdisc (built in, loaded, or loadable now): ebpf-cni then
/// paces traffic towards a pod with an ingress limit instead of policing it. Debian's
/// kernels ship it as a module; this machine's 6.18 has none.
pub fn kernel_has_sch_fq() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        Path::new("/sys/module/sch_fq").exists()
            || std::process::Command::new("modprobe")
                .args(["-q", "sch_fq"])
                .status()
                .is_ok_and(|s| s.success())
    })
}

/// `bpf_get_netns_cookie` in sock_ops programs (5.15+), which ebpf-cni's TCP pacing needs;
/// without it a pod's egress limit is held by the policer alone.
pub fn kernel_paces_tcp() -> bool {
    kernel_version() >= (5, 15)
}

/// How ebpf-cni attaches the device program to node devices with `tcAttachMode` `mode`
/// (`None`: the default, auto) on this kernel: TCX links where the kernel has them.
pub fn device_mechanism(mode: Option<&str>) -> Mechanism {
    match mode {
        Some("netlink") => Mechanism::NetlinkTc,
        Some("tcx") => Mechanism::Tcx,
        _ if kernel_has_tcx() => Mechanism::Tcx,
        _ => Mechanism::NetlinkTc,
    }
}

/// Programs attached to `dev` through TCX, both directions (none on a kernel without TCX).
pub fn tcx_programs(ns: &Netns, dev: &str) -> Result<Vec<AttachedProg>> {
    if !kernel_has_tcx() {
        return Ok(Vec::new());
    }
    ns.run_in(|| -> Result<Vec<AttachedProg>> {
        let idx = ifindex(dev)?;
        let mut out = Vec::new();
        for direction in [Direction::Ingress, Direction::Egress] {
            for (prog_id, link_id) in
                tcx_query(idx, direction).with_context(|| format!("BPF_PROG_QUERY tcx on {dev}"))?
            {
                let name = prog_name(prog_id).unwrap_or_default();
                out.push(AttachedProg {
                    mechanism: Mechanism::Tcx,
                    direction,
                    prog_id,
                    link_id,
                    name,
                });
            }
        }
        Ok(out)
    })?
}

/// `bpftool net show dev <dev> -j` in the namespace, as bpftool prints it.
pub fn bpftool_net_show(ns: &Netns, dev: &str) -> Result<Value> {
    let out = ns.nsenter(&["bpftool", "-j", "net", "show", "dev", dev])?;
    if !out.status.success() {
        bail!(
            "bpftool net show dev {dev} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout).context("parsing bpftool JSON")
}

/// Programs attached as netlink tc filters, from bpftool's `tc` entries.
pub fn netlink_tc_programs(ns: &Netns, dev: &str) -> Result<Vec<AttachedProg>> {
    let v = bpftool_net_show(ns, dev)?;
    let mut out = Vec::new();
    for section in v.as_array().into_iter().flatten() {
        for e in section
            .get("tc")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let kind = e.get("kind").and_then(Value::as_str).unwrap_or_default();
            let direction = if kind.ends_with("egress") {
                Direction::Egress
            } else {
                Direction::Ingress
            };
            // Newer bpftool lists TCX here too ("tcx/ingress"); those come from tcx_programs.
            let mechanism = if kind.starts_with("tcx") {
                Mechanism::Tcx
            } else {
                Mechanism::NetlinkTc
            };
            let prog_id = e
                .get("id")
                .or_else(|| e.get("prog_id"))
                .and_then(Value::as_u64)
                .unwrap_or(0) as u32;
            let name = e
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            out.push(AttachedProg {
                mechanism,
                direction,
                prog_id,
                link_id: None,
                name,
            });
        }
    }
    Ok(out)
}

/// Every program on `dev`: TCX (queried) plus netlink tc (bpftool), without duplicates.
pub fn attached_programs(ns: &Netns, dev: &str) -> Result<Vec<AttachedProg>> {
    let mut all = tcx_programs(ns, dev)?;
    for p in netlink_tc_programs(ns, dev)? {
        if !all
            .iter()
            .any(|q| q.prog_id == p.prog_id && q.direction == p.direction)
        {
            all.push(p);
        }
    }
    all.sort();
    Ok(all)
}

/// A pinned object, described by the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinnedObject {
    Link(LinkInfo),
    Prog { id: u32, name: String },
    Map { id: u32, name: String },
    Other(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    pub link_type: u32,
    pub id: u32,
    pub prog_id: u32,
    /// For TCX links: (ifindex, attach type).
    pub tcx: Option<(u32, u32)>,
}

impl LinkInfo {
    pub fn tcx_direction(&self) -> Option<Direction> {
        match self.tcx?.1 {
            BPF_TCX_INGRESS => Some(Direction::Ingress),
            BPF_TCX_EGRESS => Some(Direction::Egress),
            _ => None,
        }
    }
}

/// The flags the map pinned at `path` was created with (`map_flags` of its fdinfo), e.g.
/// `BPF_F_NO_PREALLOC` (1).
pub fn pinned_map_flags(path: &Path) -> Result<u32> {
    let (_fd, fdinfo) = open_pin(path)?;
    let hex = fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("map_flags:"))
        .with_context(|| format!("{} is not a map: {fdinfo}", path.display()))?
        .trim();
    u32::from_str_radix(hex.trim_start_matches("0x"), 16)
        .with_context(|| format!("map_flags {hex:?} of {}", path.display()))
}

/// Opens the object pinned at `path`: its fd and its fdinfo text.
fn open_pin(path: &Path) -> Result<(OwnedFd, String)> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())?;
    let mut attr = Buf::new();
    attr.put_u64(0, c.as_ptr() as u64);
    let fd = fd_from(
        sys_bpf(BPF_OBJ_GET, &mut attr, 16)
            .with_context(|| format!("BPF_OBJ_GET {}", path.display()))?,
    );
    let fdinfo = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))
        .context("reading fdinfo")?;
    Ok((fd, fdinfo))
}

/// Opens a pin and says what it is.
pub fn pinned_object(path: &Path) -> Result<PinnedObject> {
    let (fd, fdinfo) = open_pin(path)?;
    let info = obj_info(&fd).with_context(|| format!("info of {}", path.display()))?;
    Ok(if fdinfo.contains("link_type:") {
        let link_type = info.u32_at(0);
        PinnedObject::Link(LinkInfo {
            link_type,
            id: info.u32_at(4),
            prog_id: info.u32_at(8),
            tcx: (link_type == BPF_LINK_TYPE_TCX).then(|| (info.u32_at(16), info.u32_at(20))),
        })
    } else if fdinfo.contains("prog_type:") {
        PinnedObject::Prog {
            id: info.u32_at(4),
            name: info.cstr_at(64, 16),
        }
    } else if fdinfo.contains("map_type:") {
        PinnedObject::Map {
            id: info.u32_at(4),
            name: info.cstr_at(24, 16),
        }
    } else {
        PinnedObject::Other(fdinfo)
    })
}

/// The ifindex of `dev` in `ns`.
pub fn ifindex_in(ns: &Netns, dev: &str) -> Result<u32> {
    ns.run_in(|| ifindex(dev))?
}

/// A trivial TCX program for testing the readers (and the harness's pin cleanup).
pub mod fixture;

/// The cgroup v2 root the plugin attaches its socket programs to: the first reachable
/// cgroup2 mount of the hierarchy's root, or the plugin's own mount.
pub fn cgroup2_root() -> Option<std::path::PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            (right.split(' ').next() == Some("cgroup2") && f.get(3) == Some(&"/"))
                .then(|| f.get(4).map(std::path::PathBuf::from))
                .flatten()
        })
        .chain([std::path::PathBuf::from("/run/ebpf-cni/cgroup2")])
        .find(|p| {
            nix::sys::statfs::statfs(p.as_path())
                .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
        })
}

/// The names of the programs of the node whose pins are under `pin_root` that are attached
/// to the cgroup v2 root now (`BPF_PROG_QUERY`): other nodes of the machine attach their
/// own programs there, told apart by id.
pub fn node_cgroup_programs(pin_root: &Path) -> Result<std::collections::BTreeSet<String>> {
    let mut ours = std::collections::BTreeMap::new();
    if let Ok(revs) = fs::read_dir(pin_root.join(ebpf_cni_maps::pin::PROGRAMS_DIR)) {
        for rev in revs.flatten() {
            for p in fs::read_dir(rev.path())?.flatten() {
                if let Ok(PinnedObject::Prog { id, name }) = pinned_object(&p.path()) {
                    ours.insert(id, name);
                }
            }
        }
    }
    let Some(cg) = cgroup2_root() else {
        return Ok(Default::default());
    };
    let dir = fs::File::open(&cg).with_context(|| format!("opening {}", cg.display()))?;
    // The attach types of ebpf-cni's cgroup programs: sock_ops, inet4/6 connect, udp4/6
    // sendmsg and recvmsg, inet4/6 getpeername (queried one by one, as the kernel asks).
    let mut attached = Vec::new();
    for attach_type in [3u32, 10, 11, 14, 15, 19, 20, 29, 30] {
        const CAP: usize = 64;
        let mut prog_ids = [0u32; CAP];
        let mut attr = Buf::new();
        attr.put_u32(0, dir.as_raw_fd() as u32);
        attr.put_u32(4, attach_type);
        attr.put_u64(16, prog_ids.as_mut_ptr() as u64);
        attr.put_u32(24, CAP as u32);
        sys_bpf(BPF_PROG_QUERY, &mut attr, 64).with_context(|| {
            format!(
                "BPF_PROG_QUERY attach type {attach_type} on {}",
                cg.display()
            )
        })?;
        let n = (attr.u32_at(24) as usize).min(CAP);
        attached.extend_from_slice(&prog_ids[..n]);
    }
    Ok(attached
        .into_iter()
        .filter_map(|id| ours.get(&id).cloned())
        .collect())
}
