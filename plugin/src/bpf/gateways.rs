//! Who uses each gateway the node holds for its pods.
//!
//! A pod's IPv4 gateway is one address of the node (on `lo`), not one per host veth: the
//! pod's ARP request for it is answered by `ecni_from_pod`. The node keeps the address while
//! any attachment uses it, recorded as empty directories `gateways/<address in hex>/<attachment
//! id>` under the node's pin directory. Taking and dropping a use happens under the node
//! lock, together with adding or removing the address, so an ADD never sees its gateway
//! disappear: the last user's DEL removes the directory and the address in one step that
//! no other plugin run interleaves with.
//!
//! A pod's IPv6 gateway is held by its host veth (as a /128; neighbour discovery is the
//! kernel's), so the address needs no user count; but nothing else on the node says which
//! veths should hold which gateway once one is gone (the kernel keeps the host route and
//! only drops its source). So the same records name them, `gateways6/<address in
//! hex>/<attachment id>`, taken and dropped with the IPv4 ones, for STATUS to put a missing
//! one back. They do not count as users of the node (a DEL's teardown and `uninstall
//! --purge` look at the IPv4 records only, as releases before them did).

use std::{
    fs, io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
};

use super::{
    lock::NodeLock,
    maps::{key_ip, Maps},
    pin::{create_dir_all_racy, ensure_bpffs_at, walk, PinRoot},
    BpfError, NodeId,
};

/// Directories that recording a gateway use had to create (the node's directory,
/// `gateways/`, the gateway's own), outermost first. A failed ADD removes them again, if
/// still empty, so it leaves no empty directory behind; a DEL has none to remove.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CreatedDirs(Vec<PathBuf>);

impl CreatedDirs {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The node lock, held while a gateway use and its address change together.
pub struct GatewayLock {
    _lock: NodeLock,
    root: PinRoot,
}

/// bpffs refuses names with a dot: a gateway's directory is its address in hex.
fn gw_name(gw: Ipv4Addr) -> String {
    format!("{:08x}", u32::from(gw))
}

fn parse_gw_name(name: &str) -> Option<Ipv4Addr> {
    (name.len() == 8)
        .then(|| u32::from_str_radix(name, 16).ok())
        .flatten()
        .map(Ipv4Addr::from)
}

fn gw6_name(gw: Ipv6Addr) -> String {
    format!("{:032x}", u128::from(gw))
}

fn parse_gw6_name(name: &str) -> Option<Ipv6Addr> {
    (name.len() == 32)
        .then(|| u128::from_str_radix(name, 16).ok())
        .flatten()
        .map(Ipv6Addr::from)
}

fn id_name(id: u64) -> String {
    format!("{id:016x}")
}

fn user_dir(root: &PinRoot, node: &NodeId, gw: Ipv4Addr, id: u64) -> PathBuf {
    root.gateways_dir(node).join(gw_name(gw)).join(id_name(id))
}

fn io_err(path: PathBuf) -> impl FnOnce(io::Error) -> BpfError {
    move |source| BpfError::GatewayRecord { path, source }
}

impl GatewayLock {
    pub fn take() -> Result<Self, BpfError> {
        let root = PinRoot::from_env();
        ensure_bpffs_at(&root)?;
        Ok(Self {
            _lock: NodeLock::take(&root)?,
            root,
        })
    }

    /// Records that attachment `id` uses `gw`; `Ok(true)` when other attachments used it
    /// already (its directory was there). The caller then makes sure the node holds the
    /// address: a gateway in use is on `lo` already, since the last user's DEL removes the
    /// directory before the address, under this lock.
    /// The directories this had to create are added to `created`: every writer of the node's
    /// directory holds the lock, so what is missing here is created by this call.
    pub fn add_user(
        &self,
        node: &NodeId,
        gw: Ipv4Addr,
        id: u64,
        created: &mut CreatedDirs,
    ) -> Result<bool, BpfError> {
        let base = self.root.gateways_dir(node);
        self.record_use(node, base, gw_name(gw), id, created)
    }

    /// Records that attachment `id`'s host veth holds IPv6 gateway `gw` (ADD adds the
    /// address there itself); the directories this had to create are added to `created`.
    pub fn add_user6(
        &self,
        node: &NodeId,
        gw: Ipv6Addr,
        id: u64,
        created: &mut CreatedDirs,
    ) -> Result<(), BpfError> {
        let base = self.root.gateways6_dir(node);
        self.record_use(node, base, gw6_name(gw), id, created)
            .map(drop)
    }

    /// `base/<gw>/<id>`; whether `base/<gw>` was there already.
    fn record_use(
        &self,
        node: &NodeId,
        base: PathBuf,
        gw: String,
        id: u64,
        created: &mut CreatedDirs,
    ) -> Result<bool, BpfError> {
        let gw_dir = base.join(gw);
        let user = gw_dir.join(id_name(id));
        // A gateway in use already (every ADD but its first user's): one `mkdir`, and
        // nothing created above it. Else the gateway's directory is missing (every writer
        // holds the lock), and maybe its parents.
        match fs::create_dir(walk(&user)) {
            Ok(()) => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(BpfError::CreatePinDir { path: user, source }),
        }
        for dir in [self.root.node_dir(node), gw_dir, base] {
            if !walk(&dir).exists() && !created.0.contains(&dir) {
                created.0.push(dir);
            }
        }
        created.0.sort_by_key(|d| d.components().count());
        create_dir_all_racy(&user)?;
        Ok(false)
    }

    /// Removes the directories of `created` that are still empty, innermost first. One that
    /// holds anything now (another ADD's use, the node's maps) stays, with its parents.
    pub fn remove_created(&self, created: &CreatedDirs) {
        for dir in created.0.iter().rev() {
            match fs::remove_dir(walk(dir)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => log::debug!("keeping {}: {e}", dir.display()),
            }
        }
    }

    /// Drops every use of attachment `id`, IPv4 and IPv6; returns the IPv4 gateways nobody
    /// uses any more, whose addresses the caller removes before it lets go of the lock.
    /// Idempotent.
    pub fn remove_user(&self, node: &NodeId, id: u64) -> Result<Vec<Ipv4Addr>, BpfError> {
        drop_uses(&self.root.gateways6_dir(node), id)?;
        let emptied = drop_uses(&self.root.gateways_dir(node), id)?;
        Ok(emptied.iter().filter_map(|n| parse_gw_name(n)).collect())
    }

    /// The attachments recorded as holding IPv6 gateway `gw` on their host veths, read
    /// again under the lock (a DEL may have dropped one since [`users6`]).
    pub fn users6_of(&self, node: &NodeId, gw: Ipv6Addr) -> Vec<u64> {
        ids_in(walk(&self.root.gateways6_dir(node).join(gw6_name(gw))))
    }

    /// Whether `gw` still has a recorded user (a DEL may have dropped its last one since
    /// [`in_use_list`]).
    pub fn is_used(&self, node: &NodeId, gw: Ipv4Addr) -> bool {
        walk(&self.root.gateways_dir(node).join(gw_name(gw))).is_dir()
    }

    /// The IPv6 pod addresses behind host veth `host_ifindex` (ADD's host routes to them
    /// take the veth's IPv6 gateway as their source).
    pub fn pods_on6(&self, node: &NodeId, host_ifindex: u32) -> Result<Vec<Ipv6Addr>, BpfError> {
        let Some(endpoints) = Maps::open_endpoints(&self.root, node)? else {
            return Ok(Vec::new());
        };
        let mut v: Vec<Ipv6Addr> = endpoints
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, e)| e.host_ifindex == host_ifindex)
            .filter_map(|(k, _)| match key_ip(&k) {
                IpAddr::V6(a) => Some(a),
                IpAddr::V4(_) => None,
            })
            .collect();
        v.sort_unstable();
        Ok(v)
    }

    /// The pods behind `gw`: each IPv4 pod address whose endpoint names `gw` as its
    /// gateway, with its host veth (what ADD's host route to it holds). Read under the
    /// lock, so no pod leaves the map meanwhile.
    pub fn pods_behind(
        &self,
        node: &NodeId,
        gw: Ipv4Addr,
    ) -> Result<Vec<(Ipv4Addr, u32)>, BpfError> {
        let Some(endpoints) = Maps::open_endpoints(&self.root, node)? else {
            return Ok(Vec::new());
        };
        let mut v: Vec<(Ipv4Addr, u32)> = endpoints
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, e)| e.gateway4 == gw.octets())
            .filter_map(|(k, e)| match key_ip(&k) {
                IpAddr::V4(a) => Some((a, e.host_ifindex)),
                IpAddr::V6(_) => None,
            })
            .collect();
        v.sort_unstable();
        Ok(v)
    }
}

/// CHECK: attachment `id`'s use of `gw` is recorded.
pub fn check_user(node: &NodeId, gw: Ipv4Addr, id: u64) -> Result<(), BpfError> {
    let path = user_dir(&PinRoot::from_env(), node, gw, id);
    if walk(&path).is_dir() {
        Ok(())
    } else {
        Err(BpfError::PinMissing {
            what: "gateway use record",
            path,
        })
    }
}

/// `inspect` and the node's purge: each IPv4 gateway the node holds for its pods, with its
/// users' attachment ids.
pub(super) fn list_at(root: &PinRoot, node: &NodeId) -> Vec<(Ipv4Addr, Vec<u64>)> {
    users_in(&root.gateways_dir(node), parse_gw_name)
}

/// STATUS and the agent, before the lock: each IPv6 gateway with the attachments whose
/// host veths should hold it (one directory read, and one per gateway).
pub fn users6(root: &PinRoot, node: &NodeId) -> Vec<(Ipv6Addr, Vec<u64>)> {
    users_in(walk(&root.gateways6_dir(node)), parse_gw6_name)
}

/// The attachment ids recorded in a gateway's directory, in order.
fn ids_in(dir: &Path) -> Vec<u64> {
    let mut v: Vec<u64> = fs::read_dir(dir)
        .map(|es| {
            es.flatten()
                .filter_map(|e| u64::from_str_radix(&e.file_name().to_string_lossy(), 16).ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// Each gateway recorded in `base` (named as `parse` reads it) with its users, in order.
fn users_in<G: Ord>(base: &Path, parse: fn(&str) -> Option<G>) -> Vec<(G, Vec<u64>)> {
    let mut out: Vec<(G, Vec<u64>)> = fs::read_dir(base)
        .map(|es| {
            es.flatten()
                .filter_map(|e| {
                    let gw = parse(&e.file_name().to_string_lossy())?;
                    Some((gw, ids_in(&e.path())))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Removes `base/<gw>/<id>` for every gateway of `base`, and each gateway directory left
/// empty (the names of those). Under the lock.
fn drop_uses(base: &Path, id: u64) -> Result<Vec<String>, BpfError> {
    let entries = match fs::read_dir(walk(base)) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(base.to_path_buf())(e)),
    };
    let mut emptied = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let mine = base.join(&name).join(id_name(id));
        match fs::remove_dir(walk(&mine)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err(mine)(e)),
        }
        // Fails while another attachment still uses the gateway.
        if fs::remove_dir(e.path()).is_ok() {
            emptied.push(name);
        }
    }
    Ok(emptied)
}

/// Whether any gateway has a recorded user (the last one removes the gateway's
/// directory): a DEL finding none skips the lock, and the node's last DEL keeps the node's
/// state while an ADD holds one.
pub fn in_use(root: &PinRoot, node: &NodeId) -> bool {
    fs::read_dir(root.gateways_dir(node)).is_ok_and(|mut es| es.next().is_some())
}

/// Whether any gateway, IPv4 or IPv6, has a recorded user: a DEL finding none has no
/// record to drop and skips the lock.
pub fn any_recorded(root: &PinRoot, node: &NodeId) -> bool {
    in_use(root, node)
        || fs::read_dir(root.gateways6_dir(node)).is_ok_and(|mut es| es.next().is_some())
}

/// STATUS and the agent, before the lock: the gateways with a recorded user, which the
/// node should hold on `lo` (one directory read).
pub fn in_use_list(root: &PinRoot, node: &NodeId) -> Vec<Ipv4Addr> {
    let mut v: Vec<Ipv4Addr> = fs::read_dir(walk(&root.gateways_dir(node)))
        .map(|es| {
            es.flatten()
                .filter_map(|e| parse_gw_name(&e.file_name().to_string_lossy()))
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_dirs_are_listed_outermost_first_and_removed_while_empty() {
        let tmp = tempfile::tempdir().unwrap();
        let lock = GatewayLock {
            _lock: NodeLock::take(&PinRoot::new(tmp.path())).unwrap(),
            root: PinRoot::new(tmp.path()),
        };
        let node = NodeId::from_netns_inode(7);
        let (gw, other) = (Ipv4Addr::new(10, 1, 0, 1), Ipv4Addr::new(10, 2, 0, 1));
        let mut created = CreatedDirs::default();
        lock.add_user(&node, gw, 1, &mut created).unwrap();
        lock.add_user(&node, other, 1, &mut created).unwrap();
        let root = PinRoot::new(tmp.path());
        let gws = root.gateways_dir(&node);
        assert_eq!(
            created.0,
            vec![
                root.node_dir(&node),
                gws.clone(),
                gws.join(gw_name(gw)),
                gws.join(gw_name(other)),
            ]
        );
        // A second user of an existing gateway creates nothing.
        let mut second = CreatedDirs::default();
        lock.add_user(&node, gw, 2, &mut second).unwrap();
        assert!(second.is_empty());

        // The first attachment's ADD fails: its uses go, the second's keep their parents.
        lock.remove_user(&node, 1).unwrap();
        lock.remove_created(&created);
        assert!(user_dir(&root, &node, gw, 2).is_dir());
        assert!(!gws.join(gw_name(other)).exists());
        lock.remove_user(&node, 2).unwrap();
        lock.remove_created(&created);
        assert!(!root.node_dir(&node).exists(), "all empty now: all gone");
        assert!(root.layout_dir().is_dir(), "the lock's directory stays");
    }

    #[test]
    fn the_gateways_in_use_are_those_with_a_user() {
        let tmp = tempfile::tempdir().unwrap();
        let root = PinRoot::new(tmp.path());
        let lock = GatewayLock {
            _lock: NodeLock::take(&root).unwrap(),
            root: root.clone(),
        };
        let node = NodeId::from_netns_inode(9);
        assert!(
            in_use_list(&root, &node).is_empty(),
            "no node directory yet"
        );
        let (a, b) = (Ipv4Addr::new(10, 2, 0, 1), Ipv4Addr::new(10, 1, 0, 1));
        let mut created = CreatedDirs::default();
        lock.add_user(&node, a, 1, &mut created).unwrap();
        lock.add_user(&node, b, 2, &mut created).unwrap();
        assert_eq!(in_use_list(&root, &node), vec![b, a]);
        assert!(lock.is_used(&node, a));
        lock.remove_user(&node, 1).unwrap();
        assert_eq!(in_use_list(&root, &node), vec![b]);
        assert!(!lock.is_used(&node, a), "its last user went");
    }

    #[test]
    fn ipv6_gateways_are_recorded_per_veth_and_dropped_with_their_attachment() {
        let tmp = tempfile::tempdir().unwrap();
        let root = PinRoot::new(tmp.path());
        let lock = GatewayLock {
            _lock: NodeLock::take(&root).unwrap(),
            root: root.clone(),
        };
        let node = NodeId::from_netns_inode(11);
        let gw6: Ipv6Addr = "fd00:1::1".parse().unwrap();
        let gw4 = Ipv4Addr::new(10, 1, 0, 1);
        assert!(users6(&root, &node).is_empty());
        assert!(!any_recorded(&root, &node));
        let mut created = CreatedDirs::default();
        lock.add_user6(&node, gw6, 1, &mut created).unwrap();
        assert_eq!(
            created.0,
            vec![
                root.node_dir(&node),
                root.gateways6_dir(&node),
                root.gateways6_dir(&node).join(gw6_name(gw6)),
            ]
        );
        assert!(any_recorded(&root, &node), "an IPv6 record is one to drop");
        assert!(!in_use(&root, &node), "but no user of the node");
        lock.add_user6(&node, gw6, 2, &mut created).unwrap();
        lock.add_user(&node, gw4, 2, &mut created).unwrap();
        assert_eq!(users6(&root, &node), vec![(gw6, vec![1, 2])]);
        assert_eq!(lock.users6_of(&node, gw6), vec![1, 2]);

        assert_eq!(lock.remove_user(&node, 2).unwrap(), vec![gw4]);
        assert_eq!(users6(&root, &node), vec![(gw6, vec![1])]);
        assert_eq!(lock.remove_user(&node, 1).unwrap(), Vec::<Ipv4Addr>::new());
        assert!(users6(&root, &node).is_empty());
        assert!(!root.gateways6_dir(&node).join(gw6_name(gw6)).exists());
        assert!(lock.remove_user(&node, 1).unwrap().is_empty(), "idempotent");
        lock.remove_created(&created);
        assert!(!root.node_dir(&node).exists());
    }

    #[test]
    fn gateway_names_have_no_dot_and_round_trip() {
        let gw = Ipv4Addr::new(10, 88, 0, 1);
        assert_eq!(gw_name(gw), "0a580001");
        assert_eq!(parse_gw_name(&gw_name(gw)), Some(gw));
        assert_eq!(parse_gw_name("10.88.0.1"), None);
        assert_eq!(parse_gw_name("0a58000"), None);
        let gw6: Ipv6Addr = "fd00:88::1".parse().unwrap();
        assert_eq!(gw6_name(gw6), "fd000088000000000000000000000001");
        assert_eq!(parse_gw6_name(&gw6_name(gw6)), Some(gw6));
        assert_eq!(parse_gw6_name(&gw_name(Ipv4Addr::new(10, 88, 0, 1))), None);
        assert_eq!(
            parse_gw_name(&gw6_name(gw6)),
            None,
            "the families never mix"
        );
    }
}
