//! Host port mappings in the dataplane: the node-wide mapping map and its hit counters, the
//! node's addresses (which wildcard mappings answer on), the per-attachment list of what an
//! attachment installed (pinned in its directory, so DEL needs no input to remove it), and
//! the socket-address programs' cgroup links (attached when the node gets its first
//! mapping, removed with the node).

use std::{
    fs, io,
    net::IpAddr,
    os::fd::{AsFd, OwnedFd},
    path::{Path, PathBuf},
};

use aya::maps::{Array, HashMap, Map, MapData, PerCpuHashMap, PerCpuValues};
use ebpf_cni_maps::{
    EndpointKey, NodeConfig, PortHits, PortKey, PortTarget, ATTACHMENT_PORTS_MAP, CONFIG_MAP,
    NODE_ADDRS_MAP, NODE_FLAG_PORTMAP, PORTMAP_HITS_MAP, PORTMAP_MAP,
};

use super::{
    dataplane::{endpoint_key, is_not_found, key_ip, open_map_err, open_pinned},
    pin::{create_dir_all_racy, NodeId, PinRoot},
    sys, BpfError, SOCK_PROGRAMS,
};
use crate::portmap::{PortEntry, Protocol};

pub fn port_key(e: &PortEntry) -> PortKey {
    let addr = match e.host {
        Some(ip) => endpoint_key(ip).addr,
        None if e.pod_ip.is_ipv4() => PortKey::WILDCARD_V4,
        None => PortKey::WILDCARD_V6,
    };
    PortKey {
        addr,
        port: e.host_port,
        proto: e.protocol.number(),
        _pad: 0,
    }
}

fn port_target(e: &PortEntry, attachment_id: u64, host_ifindex: u32) -> PortTarget {
    PortTarget {
        attachment_id,
        pod_addr: endpoint_key(e.pod_ip).addr,
        gateway: e.gateway.map_or([0; 16], |g| endpoint_key(g).addr),
        host_ifindex,
        pod_port: e.pod_port,
        _pad: [0; 2],
    }
}

/// `0.0.0.0:8080/tcp` for a key.
pub fn describe_key(k: &PortKey) -> String {
    let host = if k.addr == PortKey::WILDCARD_V6 {
        "[::]".to_owned()
    } else {
        match key_ip(&EndpointKey { addr: k.addr }) {
            IpAddr::V6(v6) => format!("[{v6}]"),
            v4 => v4.to_string(),
        }
    };
    let proto = Protocol::from_number(k.proto).map_or("?", Protocol::as_str);
    format!("{host}:{}/{proto}", k.port)
}

/// A node map by name; its absence is an error here (the programs' load creates it).
fn open(root: &PinRoot, node: &NodeId, name: &'static str) -> Result<Map, BpfError> {
    open_pinned(root, node, name)?.ok_or_else(|| BpfError::PinMissing {
        what: "node map",
        path: root.map(node, name),
    })
}

pub(super) fn update_err(
    map: &'static str,
    what: String,
) -> impl FnOnce(aya::maps::MapError) -> BpfError {
    move |source| BpfError::MapUpdate {
        map,
        what,
        source: Box::new(source),
    }
}

/// The node-wide port-mapping maps, opened from their pins.
pub struct PortMaps {
    mappings: HashMap<MapData, PortKey, PortTarget>,
    hits: PerCpuHashMap<MapData, PortKey, PortHits>,
    node_addrs: HashMap<MapData, EndpointKey, u32>,
    config: Array<MapData, NodeConfig>,
}

/// One installed mapping, for `inspect`.
#[derive(Debug, Clone)]
pub struct InstalledMapping {
    pub key: PortKey,
    pub target: PortTarget,
    pub hits: PortHits,
}

impl PortMaps {
    pub fn open(root: &PinRoot, node: &NodeId) -> Result<Self, BpfError> {
        let conv = |name| open_map_err(root, node, name);
        Ok(Self {
            mappings: HashMap::try_from(open(root, node, PORTMAP_MAP)?)
                .map_err(conv(PORTMAP_MAP))?,
            hits: PerCpuHashMap::try_from(open(root, node, PORTMAP_HITS_MAP)?)
                .map_err(conv(PORTMAP_HITS_MAP))?,
            node_addrs: HashMap::try_from(open(root, node, NODE_ADDRS_MAP)?)
                .map_err(conv(NODE_ADDRS_MAP))?,
            config: Array::try_from(open(root, node, CONFIG_MAP)?).map_err(conv(CONFIG_MAP))?,
        })
    }

    /// Refuses a host port another live attachment holds. An entry whose host veth is gone
    /// is stale (its DEL never came) and may be replaced.
    pub fn ensure_free(&self, attachment_id: u64, entries: &[PortEntry]) -> Result<(), BpfError> {
        for e in entries {
            let key = port_key(e);
            if let Ok(t) = self.mappings.get(&key, 0) {
                if t.attachment_id != attachment_id
                    && nix::net::if_::if_indextoname(t.host_ifindex).is_ok()
                {
                    return Err(BpfError::PortInUse {
                        mapping: describe_key(&key),
                        pod: key_ip(&EndpointKey { addr: t.pod_addr }),
                        pod_port: t.pod_port,
                        host_ifindex: t.host_ifindex,
                    });
                }
            }
        }
        Ok(())
    }

    /// Installs the mappings with zeroed hit counters.
    pub fn install(
        &mut self,
        attachment_id: u64,
        host_ifindex: u32,
        entries: &[PortEntry],
    ) -> Result<(), BpfError> {
        let cpus = aya::util::nr_cpus().map_err(|(_, source)| BpfError::Cpus { source })?;
        for e in entries {
            let key = port_key(e);
            let zero =
                PerCpuValues::try_from(vec![PortHits::default(); cpus]).expect("one per CPU");
            self.hits
                .insert(key, zero, 0)
                .map_err(update_err(PORTMAP_HITS_MAP, describe_key(&key)))?;
            self.mappings
                .insert(key, port_target(e, attachment_id, host_ifindex), 0)
                .map_err(update_err(PORTMAP_MAP, describe_key(&key)))?;
        }
        Ok(())
    }

    /// Removes the mappings of `keys` that belong to `attachment_id` (another attachment may
    /// have taken over a stale one). Missing entries are fine.
    pub fn remove(&mut self, attachment_id: u64, keys: &[PortKey]) -> Result<usize, BpfError> {
        let mut n = 0;
        for key in keys {
            match self.mappings.get(key, 0) {
                Ok(t) if t.attachment_id == attachment_id => {}
                _ => continue,
            }
            match self.mappings.remove(key) {
                Err(e) if !is_not_found(&e) => {
                    return Err(update_err(PORTMAP_MAP, describe_key(key))(e))
                }
                _ => n += 1,
            }
            match self.hits.remove(key) {
                Err(e) if !is_not_found(&e) => {
                    return Err(update_err(PORTMAP_HITS_MAP, describe_key(key))(e))
                }
                _ => {}
            }
        }
        Ok(n)
    }

    /// CHECK: each mapping is installed, for this attachment, to this pod address and port.
    pub fn check(
        &self,
        attachment_id: u64,
        host_ifindex: u32,
        entries: &[PortEntry],
    ) -> Result<(), BpfError> {
        for e in entries {
            let key = port_key(e);
            let Ok(t) = self.mappings.get(&key, 0) else {
                return Err(BpfError::PortMappingMissing {
                    mapping: describe_key(&key),
                });
            };
            let want = port_target(e, attachment_id, host_ifindex);
            if t != want {
                return Err(BpfError::PortMappingStale {
                    mapping: describe_key(&key),
                    actual: format!(
                        "{}:{} via ifindex {} (attachment {:016x})",
                        key_ip(&EndpointKey { addr: t.pod_addr }),
                        t.pod_port,
                        t.host_ifindex,
                        t.attachment_id
                    ),
                    expected: format!(
                        "{}:{} via ifindex {host_ifindex} (attachment {attachment_id:016x})",
                        e.pod_ip, e.pod_port
                    ),
                });
            }
        }
        Ok(())
    }

    /// Makes the node-address map hold exactly `addrs`.
    pub fn sync_node_addrs(&mut self, addrs: &[IpAddr]) -> Result<(), BpfError> {
        let want: Vec<EndpointKey> = addrs.iter().map(|a| endpoint_key(*a)).collect();
        let have: Vec<EndpointKey> = self.node_addrs.keys().filter_map(Result::ok).collect();
        for k in have.iter().filter(|k| !want.contains(k)) {
            match self.node_addrs.remove(k) {
                Err(e) if !is_not_found(&e) => {
                    return Err(update_err(NODE_ADDRS_MAP, format!("remove {}", key_ip(k)))(
                        e,
                    ))
                }
                _ => {}
            }
        }
        for k in want.iter().filter(|k| !have.contains(k)) {
            self.node_addrs
                .insert(*k, 0, 0)
                .map_err(update_err(NODE_ADDRS_MAP, format!("insert {}", key_ip(k))))?;
        }
        Ok(())
    }

    pub fn node_addrs(&self) -> Vec<IpAddr> {
        let mut v: Vec<IpAddr> = self
            .node_addrs
            .keys()
            .filter_map(Result::ok)
            .map(|k| key_ip(&k))
            .collect();
        v.sort();
        v
    }

    /// Turns the programs' port-mapping lookups on, with the node's netns cookie for the
    /// socket programs.
    pub fn enable(&mut self, netns_cookie: u64) -> Result<(), BpfError> {
        let have = self.config.get(&0, 0).unwrap_or_default();
        let want = NodeConfig {
            netns_cookie,
            flags: have.flags | NODE_FLAG_PORTMAP,
            ..have
        };
        if have == want {
            return Ok(());
        }
        self.config
            .set(0, want, 0)
            .map_err(update_err(CONFIG_MAP, "enable port mappings".to_owned()))
    }

    pub fn enabled(&self) -> bool {
        self.config
            .get(&0, 0)
            .is_ok_and(|c| c.flags & NODE_FLAG_PORTMAP != 0)
    }

    /// Every installed mapping with its hits summed over CPUs.
    pub fn list(&self) -> Vec<InstalledMapping> {
        let mut out: Vec<InstalledMapping> = self
            .mappings
            .iter()
            .filter_map(Result::ok)
            .map(|(key, target)| {
                let mut hits = PortHits::default();
                if let Ok(per_cpu) = self.hits.get(&key, 0) {
                    for h in per_cpu.iter() {
                        hits.packets = hits.packets.wrapping_add(h.packets);
                        hits.bytes = hits.bytes.wrapping_add(h.bytes);
                        hits.socket = hits.socket.wrapping_add(h.socket);
                    }
                }
                InstalledMapping { key, target, hits }
            })
            .collect();
        out.sort_by_key(|m| (m.key.port, m.key.proto, m.key.addr));
        out
    }
}

/// Pins the list of `keys` at `path` (an array map, see [`ATTACHMENT_PORTS_MAP`]).
pub fn pin_attachment_ports(path: &Path, keys: &[PortKey]) -> Result<(), BpfError> {
    let err = |source| BpfError::PinPorts {
        path: path.to_path_buf(),
        source,
    };
    let fd = sys::array_map_create(
        ATTACHMENT_PORTS_MAP,
        std::mem::size_of::<PortKey>() as u32,
        keys.len().max(1) as u32,
    )
    .map_err(err)?;
    for (i, k) in keys.iter().enumerate() {
        sys::array_map_set(fd.as_fd(), i as u32, k).map_err(err)?;
    }
    sys::obj_pin(fd.as_fd(), path).map_err(err)
}

/// The keys pinned at `path`; empty if there is no pin.
pub fn attachment_ports(path: &Path) -> Result<Vec<PortKey>, BpfError> {
    if fs::symlink_metadata(path).is_err() {
        return Ok(Vec::new());
    }
    let err = |source| BpfError::OpenMap {
        path: path.to_path_buf(),
        source: Box::new(source),
    };
    let data = MapData::from_pin(path).map_err(err)?;
    let arr: Array<MapData, PortKey> = Array::try_from(Map::Array(data)).map_err(err)?;
    let mut out = Vec::new();
    for i in 0..arr.len() {
        let k = arr.get(&i, 0).map_err(err)?;
        if k != PortKey::default() {
            out.push(k);
        }
    }
    Ok(out)
}

/// The cookie of the network namespace `ns` (the key of the pacing map), read from a
/// socket opened there by a short-lived thread so this thread's namespace never changes.
pub fn netns_cookie_of(ns: &crate::netns::Netns) -> Result<u64, BpfError> {
    std::thread::scope(|s| {
        s.spawn(|| {
            let _in = ns.enter().map_err(|e| BpfError::NetnsCookie {
                source: io::Error::other(e.to_string()),
            })?;
            netns_cookie()
        })
        .join()
        .expect("the cookie thread does not panic")
    })
}

/// The node's network namespace cookie (`SO_NETNS_COOKIE`, Linux 5.14+): the plugin runs in
/// the node's namespace.
pub fn netns_cookie() -> Result<u64, BpfError> {
    super::kernel::socket_netns_cookie().map_err(|source| BpfError::NetnsCookie { source })
}

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

/// The sockops program pacing limited pods' TCP sockets, and its attach type.
pub const PACING_PROGRAM: (&str, u32) = (ebpf_cni_maps::PROG_SOCKOPS, sys::BPF_CGROUP_SOCK_OPS);

/// Attaches each socket program (fds from `prog`) to the cgroup v2 root unless its link is
/// pinned and live already.
pub fn ensure_sock_links(
    root: &PinRoot,
    node: &NodeId,
    prog: impl FnMut(&'static str) -> Result<OwnedFd, BpfError>,
) -> Result<(), BpfError> {
    ensure_cgroup_links(root, node, &SOCK_PROGRAMS, prog)
}

/// The pacing program's link on the cgroup v2 root, as [`ensure_sock_links`].
pub fn ensure_pacing_link(
    root: &PinRoot,
    node: &NodeId,
    prog: impl FnMut(&'static str) -> Result<OwnedFd, BpfError>,
) -> Result<(), BpfError> {
    ensure_cgroup_links(root, node, &[PACING_PROGRAM], prog)
}

/// CHECK: the pacing program's link is pinned and live.
pub fn check_pacing_link(root: &PinRoot, node: &NodeId) -> Result<(), BpfError> {
    let dir = root.node_dir(node).join(ebpf_cni_maps::pin::CGROUP_DIR);
    check_sock_link(&dir.join(PACING_PROGRAM.0), PACING_PROGRAM.0)
}

fn ensure_cgroup_links(
    root: &PinRoot,
    node: &NodeId,
    programs: &[(&'static str, u32)],
    mut prog: impl FnMut(&'static str) -> Result<OwnedFd, BpfError>,
) -> Result<(), BpfError> {
    let dir = root.node_dir(node).join(ebpf_cni_maps::pin::CGROUP_DIR);
    let mut cgroup: Option<fs::File> = None;
    for &(name, attach_type) in programs {
        let path = dir.join(name);
        if check_sock_link(&path, name).is_ok() {
            continue;
        }
        let _ = fs::remove_file(&path);
        if cgroup.is_none() {
            let cg = cgroup2_root()?;
            cgroup = Some(fs::File::open(&cg).map_err(|source| BpfError::Cgroup {
                path: cg.clone(),
                source,
            })?);
            create_dir_all_racy(&dir)?;
        }
        let cg = cgroup.as_ref().expect("opened above");
        let fd = prog(name)?;
        let link = sys::link_create_cgroup(fd.as_fd(), cg.as_fd(), attach_type)
            .map_err(|source| BpfError::AttachCgroup { name, source })?;
        sys::obj_pin(link.as_fd(), &path).map_err(|source| BpfError::PinTcxLink {
            path: path.clone(),
            source,
        })?;
    }
    Ok(())
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
    let dir = root.node_dir(node).join(ebpf_cni_maps::pin::CGROUP_DIR);
    for (name, _) in SOCK_PROGRAMS {
        check_sock_link(&dir.join(name), name)?;
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
