//! The few bpf(2) calls aya 0.14 does not offer, or offers at a cost: aya's `LinkInfo` has
//! no TCX ifindex or attach type and it cannot look a program up by id; and opening a
//! pinned program or naming a map through aya runs its feature detection first (loading
//! probe programs, ~20 ms per process), which ADD's fast path cannot afford.
//!
//! Each attribute struct is the prefix of `union bpf_attr` for its command; the kernel treats
//! bytes past the size we pass as zero, and the info structs are prefixes of the kernel's
//! `bpf_link_info` / `bpf_prog_info` (it copies back only as much as we ask for).

use std::{
    ffi::CString,
    io, mem,
    os::{
        fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
};

const BPF_OBJ_PIN: libc::c_int = 6;
const BPF_OBJ_GET: libc::c_int = 7;
const BPF_LINK_CREATE: libc::c_int = 28;
const BPF_PROG_GET_FD_BY_ID: libc::c_int = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_int = 15;

/// `enum bpf_attach_type` of sockops programs on a cgroup.
pub(crate) const BPF_CGROUP_SOCK_OPS: u32 = 3;
/// `enum bpf_link_type`
pub(crate) const BPF_LINK_TYPE_TCX: u32 = 11;
/// `enum bpf_attach_type`
pub(crate) const BPF_TCX_INGRESS: u32 = 46;
pub(crate) const BPF_TCX_EGRESS: u32 = 47;

/// # Safety
/// `T` must be the `bpf_attr` prefix that `cmd` expects, with any pointers in it valid.
unsafe fn sys_bpf<T>(cmd: libc::c_int, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: per the contract above.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T,
            mem::size_of::<T>() as libc::c_uint,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Takes ownership of an fd a bpf command returned (such fds are always close-on-exec).
fn owned_fd(ret: libc::c_long) -> OwnedFd {
    // SAFETY: a non-negative return of an fd-returning bpf command is a new fd we own.
    unsafe { OwnedFd::from_raw_fd(ret as libc::c_int) }
}

#[repr(C)]
struct ObjGetAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

/// Opens the object pinned at `path` (`BPF_OBJ_GET`).
pub(crate) fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let c_path = CString::new(super::walk::walk(path).as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut attr = ObjGetAttr {
        pathname: c_path.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: 0,
    };
    // SAFETY: `attr` is the BPF_OBJ_GET prefix; `c_path` outlives the call.
    unsafe { sys_bpf(BPF_OBJ_GET, &mut attr) }.map(owned_fd)
}

#[repr(C)]
struct InfoByFdAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// # Safety
/// `T` must be a prefix of the info struct of the object type behind `fd`.
unsafe fn obj_info<T>(fd: BorrowedFd<'_>, info: &mut T) -> io::Result<()> {
    let mut attr = InfoByFdAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: mem::size_of::<T>() as u32,
        info: info as *mut T as u64,
    };
    // SAFETY: `attr` is the BPF_OBJ_GET_INFO_BY_FD prefix; `info` is writable for
    // `info_len` bytes for the duration of the call.
    unsafe { sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) }.map(drop)
}

/// Prefix of `struct bpf_link_info` up to its `tcx` union member (the union is 8-aligned).
#[repr(C)]
#[derive(Default)]
struct RawLinkInfo {
    link_type: u32,
    id: u32,
    prog_id: u32,
    _pad: u32,
    tcx_ifindex: u32,
    tcx_attach_type: u32,
}

/// What the kernel says about a link; `ifindex`/`attach_type` are meaningful for TCX links
/// only, and `ifindex` is 0 once the device is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TcxLinkInfo {
    pub link_type: u32,
    pub id: u32,
    pub prog_id: u32,
    pub ifindex: u32,
    pub attach_type: u32,
}

pub(crate) fn link_info(fd: BorrowedFd<'_>) -> io::Result<TcxLinkInfo> {
    let mut raw = RawLinkInfo::default();
    // SAFETY: `RawLinkInfo` is a prefix of `bpf_link_info` and only integers, so whatever
    // the kernel writes is a valid value (for a non-link fd, that object's own info, which
    // the caller's link type check rejects).
    unsafe { obj_info(fd, &mut raw) }?;
    Ok(TcxLinkInfo {
        link_type: raw.link_type,
        id: raw.id,
        prog_id: raw.prog_id,
        ifindex: raw.tcx_ifindex,
        attach_type: raw.tcx_attach_type,
    })
}

#[repr(C)]
struct GetFdByIdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

/// Prefix of `struct bpf_prog_info` up to `name`.
#[repr(C)]
#[derive(Default)]
struct RawProgInfo {
    prog_type: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
    load_time: u64,
    created_by_uid: u32,
    nr_map_ids: u32,
    map_ids: u64,
    name: [u8; 16],
}

const _: () = assert!(mem::size_of::<RawLinkInfo>() == 24);
const _: () = assert!(mem::size_of::<RawProgInfo>() == 80);

/// The kernel's (at most 15-byte) name of the program with id `prog_id`.
pub(crate) fn prog_name(prog_id: u32) -> io::Result<String> {
    let mut attr = GetFdByIdAttr {
        id: prog_id,
        next_id: 0,
        open_flags: 0,
    };
    // SAFETY: `attr` is the BPF_PROG_GET_FD_BY_ID prefix.
    let fd = unsafe { sys_bpf(BPF_PROG_GET_FD_BY_ID, &mut attr) }.map(owned_fd)?;
    let mut raw = RawProgInfo::default();
    // SAFETY: `fd` is a program fd and `RawProgInfo` a prefix of `bpf_prog_info`; its
    // pointer fields are 0 with 0 lengths, so the kernel dumps nothing through them.
    unsafe { obj_info(std::os::fd::AsFd::as_fd(&fd), &mut raw) }?;
    let len = raw
        .name
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(raw.name.len());
    Ok(String::from_utf8_lossy(&raw.name[..len]).into_owned())
}

/// The id of the program behind `fd` (e.g. a pinned program).
pub(crate) fn prog_id(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut raw = RawProgInfo::default();
    // SAFETY: as in `prog_name`: an integer-only prefix with no buffers to fill.
    unsafe { obj_info(fd, &mut raw) }?;
    Ok(raw.id)
}

#[repr(C)]
struct ObjPinAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

/// Pins `fd` at `path` (`BPF_OBJ_PIN`).
pub(crate) fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let c_path = CString::new(super::walk::walk(path).as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut attr = ObjPinAttr {
        pathname: c_path.as_ptr() as u64,
        bpf_fd: fd.as_raw_fd() as u32,
        file_flags: 0,
    };
    // SAFETY: `attr` is the BPF_OBJ_PIN prefix; `c_path` outlives the call.
    unsafe { sys_bpf(BPF_OBJ_PIN, &mut attr) }.map(drop)
}

/// `bpf_attr.link_create` up to its `tcx` member (relative_fd/id, expected_revision).
#[repr(C)]
struct LinkCreateTcxAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
    relative: u32,
    _pad: u32,
    expected_revision: u64,
}

/// Attaches `prog` to `ifindex` through a TCX link after the programs already there
/// (`BPF_LINK_CREATE`); the link lives as long as the returned fd or a pin of it.
pub(crate) fn link_create_tcx(
    prog: BorrowedFd<'_>,
    ifindex: u32,
    attach_type: u32,
) -> io::Result<OwnedFd> {
    let mut attr = LinkCreateTcxAttr {
        prog_fd: prog.as_raw_fd() as u32,
        target_ifindex: ifindex,
        attach_type,
        flags: 0,
        relative: 0,
        _pad: 0,
        expected_revision: 0,
    };
    // SAFETY: `attr` is the BPF_LINK_CREATE prefix for TCX; no pointers.
    unsafe { sys_bpf(BPF_LINK_CREATE, &mut attr) }.map(owned_fd)
}

/// Prefix of `struct bpf_map_info` up to `name`.
#[repr(C)]
#[derive(Default)]
struct RawMapInfo {
    map_type: u32,
    id: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    name: [u8; 16],
}

const _: () = assert!(mem::size_of::<LinkCreateTcxAttr>() == 32);
const _: () = assert!(mem::size_of::<RawMapInfo>() == 40);

/// `enum bpf_attach_type` of the socket-address hooks.
pub(crate) const BPF_CGROUP_INET4_CONNECT: u32 = 10;
pub(crate) const BPF_CGROUP_INET6_CONNECT: u32 = 11;
pub(crate) const BPF_CGROUP_UDP4_SENDMSG: u32 = 14;
pub(crate) const BPF_CGROUP_UDP6_SENDMSG: u32 = 15;
pub(crate) const BPF_CGROUP_UDP4_RECVMSG: u32 = 19;
pub(crate) const BPF_CGROUP_UDP6_RECVMSG: u32 = 20;
pub(crate) const BPF_CGROUP_INET4_GETPEERNAME: u32 = 29;
pub(crate) const BPF_CGROUP_INET6_GETPEERNAME: u32 = 30;
/// `enum bpf_link_type`
pub(crate) const BPF_LINK_TYPE_CGROUP: u32 = 3;

/// Attaches `prog` to the cgroup open at `cgroup` through a link (`BPF_LINK_CREATE`); such
/// links always let other programs run too (multi-attach).
pub(crate) fn link_create_cgroup(
    prog: BorrowedFd<'_>,
    cgroup: BorrowedFd<'_>,
    attach_type: u32,
) -> io::Result<OwnedFd> {
    // The cgroup's fd takes the place of the ifindex; the rest of the attribute stays zero.
    let mut attr = LinkCreateTcxAttr {
        prog_fd: prog.as_raw_fd() as u32,
        target_ifindex: cgroup.as_raw_fd() as u32,
        attach_type,
        flags: 0,
        relative: 0,
        _pad: 0,
        expected_revision: 0,
    };
    // SAFETY: `attr` is a BPF_LINK_CREATE prefix; no pointers.
    unsafe { sys_bpf(BPF_LINK_CREATE, &mut attr) }.map(owned_fd)
}

const BPF_MAP_CREATE: libc::c_int = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
const BPF_MAP_TYPE_ARRAY: u32 = 2;

/// `bpf_attr` for BPF_MAP_CREATE up to `map_name`.
#[repr(C)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

/// Creates an array map of `max_entries` values of `value_size` bytes named `name` (at most
/// 15 bytes).
pub(crate) fn array_map_create(
    name: &str,
    value_size: u32,
    max_entries: u32,
) -> io::Result<OwnedFd> {
    let mut map_name = [0u8; 16];
    let n = name.len().min(15);
    map_name[..n].copy_from_slice(&name.as_bytes()[..n]);
    let mut attr = MapCreateAttr {
        map_type: BPF_MAP_TYPE_ARRAY,
        key_size: 4,
        value_size,
        max_entries,
        map_flags: 0,
        inner_map_fd: 0,
        numa_node: 0,
        map_name,
    };
    // SAFETY: `attr` is the BPF_MAP_CREATE prefix; no pointers.
    unsafe { sys_bpf(BPF_MAP_CREATE, &mut attr) }.map(owned_fd)
}

#[repr(C)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

const _: () = assert!(mem::size_of::<MapCreateAttr>() == 44);
const _: () = assert!(mem::size_of::<MapElemAttr>() == 32);

/// Writes `value` at `index` of an array map.
///
/// `T` must be the map's value type (its size is the map's value size).
pub(crate) fn array_map_set<T: Copy>(fd: BorrowedFd<'_>, index: u32, value: &T) -> io::Result<()> {
    let mut attr = MapElemAttr {
        map_fd: fd.as_raw_fd() as u32,
        _pad: 0,
        key: &index as *const u32 as u64,
        value: value as *const T as u64,
        flags: 0,
    };
    // SAFETY: `attr` is the BPF_MAP_UPDATE_ELEM prefix; key and value point at live values
    // of the sizes the map was created with (the caller's contract for `T`).
    unsafe { sys_bpf(BPF_MAP_UPDATE_ELEM, &mut attr) }.map(drop)
}

const BPF_MAP_GET_NEXT_KEY: libc::c_int = 4;
/// `enum bpf_map_type` (with [`BPF_MAP_TYPE_ARRAY`]): arrays hold every index from
/// creation on.
const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;

#[repr(C)]
struct MapNextKeyAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    next_key: u64,
}

/// How full the map behind `fd` is: `(entries, max_entries)`. The kernel keeps no count a
/// user can read for hash maps, so their keys are walked (`BPF_MAP_GET_NEXT_KEY`, one call
/// per entry, no values copied); an array counts as full.
pub(crate) fn map_usage(fd: BorrowedFd<'_>) -> io::Result<(u32, u32)> {
    let mut raw = RawMapInfo::default();
    // SAFETY: `RawMapInfo` is a prefix of `bpf_map_info`, integers only.
    unsafe { obj_info(fd, &mut raw) }?;
    if matches!(raw.map_type, BPF_MAP_TYPE_ARRAY | BPF_MAP_TYPE_PERCPU_ARRAY) {
        return Ok((raw.max_entries, raw.max_entries));
    }
    let size = raw.key_size as usize;
    let (mut key, mut next) = (vec![0u8; size], vec![0u8; size]);
    let mut count = 0u32;
    let mut first = true;
    loop {
        let mut attr = MapNextKeyAttr {
            map_fd: fd.as_raw_fd() as u32,
            _pad: 0,
            // A null key asks for the first one.
            key: if first { 0 } else { key.as_ptr() as u64 },
            next_key: next.as_mut_ptr() as u64,
        };
        // SAFETY: `attr` is the BPF_MAP_*_ELEM prefix; both buffers are `key_size` bytes and
        // outlive the call.
        match unsafe { sys_bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) } {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                return Ok((count, raw.max_entries))
            }
            Err(e) => return Err(e),
        }
        count += 1;
        first = false;
        std::mem::swap(&mut key, &mut next);
        if count > raw.max_entries {
            // Entries deleted while we walk can restart the walk at the first key: a
            // concurrent churn never makes this loop forever.
            return Ok((raw.max_entries, raw.max_entries));
        }
    }
}
