//! Where the plugin pins its links and maps in bpffs, and making sure bpffs is mounted.
//!
//! A CNI plugin exits right after ADD, so everything that must outlive it is pinned, and DEL
//! and CHECK find it again by recomputing the same path from the same arguments. The layout,
//! every name taken from `ebpf_cni_maps::pin`:
//!
//! ```text
//! <bpffs>/ebpf-cni/v1/                the node lock: every ADD/DEL flocks this directory
//!   netns-<inode>/                    one node (network namespace)
//!     maps/<map>                      the node-wide maps (maps::NODE_MAPS), each under its
//!                                     name: ECNI_ENDPOINTS ECNI_POD_CNT ECNI_TRACE ECNI_RATES
//!                                     ECNI_PORTMAP ECNI_PM_HITS ECNI_NAT_REV ECNI_NAT_FRAG
//!                                     ECNI_SOCK_REV ECNI_NODE_ADDR ECNI_CONFIG ECNI_PACING
//!                                     ECNI_MASQ_FWD
//!                                     ECNI_MASQ_REV ECNI_MASQ_SKIP ECNI_MASQ_SRC ECNI_MASQ_STAT
//!                                     ECNI_MASQ_FRAG ECNI_MASQ_FRAG6 ECNI_NS_PROBE
//!                                     ECNI_SHAPE_NET ECNI_SOURCES ECNI_SVC_NETS
//!                                     ECNI_SVC_FLOWS ECNI_SVC_STAT ECNI_TUN_PEERS
//!                                     ECNI_TUN_NODES ECNI_TUN_CFG ECNI_TUN_STAT
//!                                     ECNI_TUN_PSTAT
//!     programs/<revision>/<program>   every program of programs::TABLE, per object revision:
//!                                     ecni_from_pod ecni_to_pod ecni_from_dev ecni_from_chain
//!                                     ecni_to_tunnel
//!                                     ecni_connect4 ecni_connect6 ecni_sendmsg4 ecni_sendmsg6
//!                                     ecni_recvmsg4 ecni_recvmsg6 ecni_peername4 ecni_peername6
//!                                     ecni_sockops
//!     cgroup/<program>                their links on the cgroup v2 root: the socket-address
//!                                     programs (with the first host port) and ecni_sockops
//!                                     (with the first paced pod)
//!     devices/<ifname>/               one per node device:
//!         link_from_dev               TCX: the device program's link
//!         netlink_from_dev            netlink mode: the filter's record (its program)
//!         link_to_tunnel              the tunnel device (ecni-vxlan) only: TCX, the link
//!                                     of its egress program
//!         netlink_to_tunnel           netlink mode: that filter's record
//!         clsact_created/             netlink mode: ebpf-cni made the device's clsact
//!     gateways/<gateway>/<id>/        the attachments (id in 16 hex digits) using each IPv4
//!                                     gateway (8 hex digits) the node holds on `lo`
//!     gateways6/<gateway>/<id>/       the attachments whose host veth holds each IPv6
//!                                     gateway (32 hex digits)
//!     converged/<unix ms>-<by>/       the node's last convergence to its devices and
//!                                     addresses, and by what (add, status, agent)
//!     services/<source>/              where the node's Service addresses came from
//!                                     (kube-proxy-iptables-nft, config, none, … joined by +)
//!     unrouted_peers/<subnet>|<node>|<why>/  the peer subnets the cluster network's agent
//!                                     gives no route (`tunnel::record_unrouted`)
//!     forward_firewall_checked/       the node's first ADD looked for a forward-hook
//!                                     firewall the programs skip (and warned of it)
//!     attachments/<network>/<container id>/<ifname>/
//!         link_from_pod  link_to_pod            TCX: the pod's programs' links
//!         netlink_from_pod  netlink_to_pod      netlink mode: the filters' records
//!         link_from_chain | netlink_from_chain  chained mode, in place of *_from_pod
//!         ecni_att_ports              the host port mappings it installed (an array map)
//!         source_check/ | source_check_off/     its source check: on or off
//!         placed-<ifindex>-<cookie>-<n|o|x>-<addr>…/  where its map entries are, by key
//!                                     (`placement.rs`): DEL removes them without walks
//! ```
//!
//! bpffs refuses a name with a `.` in it (`EPERM`: the kernel keeps dotted names for itself),
//! and `eth0.100`, `flannel.1` or a network named `lab.net` are everyday names. Every name
//! that comes from outside (a network, a container id, an interface) is pinned in the form
//! [`pin_component`] gives: `.` written `%2e` and `%` written `%25`. Neither a CNI name nor
//! a Linux interface name holds a `%` (the kernel takes one as a `%d` template and never
//! leaves it in a name), so every name without a dot keeps the path it always had.
//!
//! `<bpffs>` is `/sys/fs/bpf` unless `EBPF_CNI_BPFFS_ROOT` says otherwise (tests). The node
//! key `netns-<inode>` is the network namespace the plugin runs in: one fixed value on a
//! real node, and disjoint trees for test "nodes" that are namespaces sharing one bpffs.

use std::{
    fmt, fs, io,
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
};

use ebpf_cni_maps::pin as names;
use nix::{
    mount::MsFlags,
    sys::statfs::{statfs, BPF_FS_MAGIC},
};

pub(crate) use super::walk::walk;
pub(super) use super::walk::LayoutCwd;
use super::{AttachmentKey, BpfError, Hook};

/// Where bpffs is mounted on a normal system.
pub const DEFAULT_BPFFS: &str = "/sys/fs/bpf";
/// Overrides [`DEFAULT_BPFFS`]; the directory must already be a bpf filesystem.
pub const BPFFS_ROOT_ENV: &str = "EBPF_CNI_BPFFS_ROOT";

/// Where this process finds the machine's bpffs, asked once. `/sys/fs/bpf` when it is a
/// bpffs there, or when this process shares its parent's and pid 1's mount namespace (a node
/// where nothing mounted one yet: [`ensure_bpffs_at`] mounts it). In a mount namespace of
/// its own, `ip netns exec`'s (which remounts `/sys` as a fresh sysfs, without the bpffs), a
/// bpffs mounted at `/sys/fs/bpf` would vanish with the command, pins and all, so the one
/// of the namespace it came from is used, through the root of its parent (`ip netns exec`
/// execs the plugin, so that is the shell) or else of pid 1: a path resolved through
/// `/proc/<pid>/root` goes on in that process's mount tree. A pod added by hand is found by
/// the next DEL, however that is run.
fn machine_bpffs() -> PathBuf {
    static FOUND: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| {
            let default = Path::new(DEFAULT_BPFFS);
            let mounts = |pid: &str| fs::metadata(format!("/proc/{pid}/ns/mnt")).map(|m| m.ino());
            let (Ok(own), false) = (mounts("self"), is_bpffs(default).unwrap_or(false)) else {
                return default.into();
            };
            let parent = nix::unistd::getppid().to_string();
            for pid in [parent.as_str(), "1"] {
                let theirs = PathBuf::from(format!("/proc/{pid}/root{DEFAULT_BPFFS}"));
                if mounts(pid).is_ok_and(|m| m != own) && is_bpffs(&theirs).unwrap_or(false) {
                    log::debug!(
                        "no bpffs at {DEFAULT_BPFFS} in this mount namespace: using {}",
                        theirs.display()
                    );
                    return theirs;
                }
            }
            default.into()
        })
        .clone()
}

/// The thread's own network namespace; `/proc/self` would name the main thread's.
const THREAD_NETNS: &str = "/proc/thread-self/ns/net";

/// The path component that pins `name` (a network, a container id or an interface name):
/// `name` itself unless it holds a `.` or a `%` (see the module docs).
pub fn pin_component(name: &str) -> std::borrow::Cow<'_, str> {
    if !name.contains(['.', '%']) {
        return name.into();
    }
    let mut out = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        match c {
            '.' => out.push_str("%2e"),
            '%' => out.push_str("%25"),
            c => out.push(c),
        }
    }
    out.into()
}

/// The name a path component pins: [`pin_component`] undone. `None` for a component no name
/// gives (a `%` not followed by `2e` or `25`, or a raw `.`).
pub fn name_of_component(component: &str) -> Option<String> {
    let mut out = String::with_capacity(component.len());
    let mut rest = component;
    while let Some(i) = rest.find(['%', '.']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if tail.starts_with("%2e") {
            out.push('.');
        } else if tail.starts_with("%25") {
            out.push('%');
        } else {
            return None;
        }
        rest = &tail[3..];
    }
    out.push_str(rest);
    Some(out)
}

/// Identifies the node (network namespace) whose attachments a pin tree holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NodeId {
    netns_inode: u64,
}

impl NodeId {
    /// The node of the calling thread's network namespace.
    pub fn current() -> Result<Self, BpfError> {
        let meta = fs::metadata(THREAD_NETNS).map_err(|source| BpfError::NodeId {
            path: THREAD_NETNS.into(),
            source,
        })?;
        Ok(Self::from_netns_inode(meta.ino()))
    }

    pub const fn from_netns_inode(netns_inode: u64) -> Self {
        Self { netns_inode }
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", names::NODE_DIR_PREFIX, self.netns_inode)
    }
}

/// The bpffs mount point every pin path starts from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinRoot {
    bpffs: PathBuf,
}

impl PinRoot {
    /// `$EBPF_CNI_BPFFS_ROOT` if set and non-empty, else the machine's bpffs
    /// ([`machine_bpffs`]): `/sys/fs/bpf`, or the host's seen through pid 1's root when
    /// the plugin runs in a mount namespace of its own without one (`ip netns exec`).
    pub fn from_env() -> Self {
        match std::env::var_os(BPFFS_ROOT_ENV).filter(|v| !v.is_empty()) {
            Some(root) => Self::new(root),
            None => Self::new(machine_bpffs()),
        }
    }

    pub fn new(bpffs: impl Into<PathBuf>) -> Self {
        Self {
            bpffs: bpffs.into(),
        }
    }

    pub fn bpffs(&self) -> &Path {
        &self.bpffs
    }

    pub(super) fn is_default(&self) -> bool {
        self.bpffs == Path::new(DEFAULT_BPFFS)
    }

    /// `<bpffs>/ebpf-cni/v1`
    pub fn layout_dir(&self) -> PathBuf {
        self.bpffs
            .join(names::PROJECT_DIR)
            .join(names::LAYOUT_VERSION_DIR)
    }

    /// `<bpffs>/ebpf-cni/v1/netns-<inode>`
    pub fn node_dir(&self, node: &NodeId) -> PathBuf {
        self.layout_dir().join(node.to_string())
    }

    /// `<bpffs>/ebpf-cni/v1/netns-<inode>/attachments`: pruning empty directories after a
    /// detach stops here.
    pub fn attachments_dir(&self, node: &NodeId) -> PathBuf {
        self.node_dir(node).join(names::ATTACHMENTS_DIR)
    }

    /// `attachments/<network>`: the attachments of one network on the node, one directory
    /// `<container id>/<ifname>` each (GC's inventory). `network` must be a valid name.
    pub fn network_attachments_dir(&self, node: &NodeId, network: &str) -> PathBuf {
        self.attachments_dir(node).join(&*pin_component(network))
    }

    /// The pins of one attachment. `key` must be valid (see [`AttachmentKey::validate`]).
    /// The node-wide maps, each pinned under its map name.
    pub fn map(&self, node: &NodeId, name: &str) -> PathBuf {
        self.node_dir(node).join(names::MAPS_DIR).join(name)
    }

    pub fn programs_dir(&self, node: &NodeId) -> PathBuf {
        self.node_dir(node).join(names::PROGRAMS_DIR)
    }

    /// A loaded program of one object revision.
    pub fn program(&self, node: &NodeId, revision: &str, name: &str) -> PathBuf {
        self.revision_dir(node, revision).join(name)
    }

    /// `programs/<revision>`: the programs one build loaded, each pinned under its name.
    pub fn revision_dir(&self, node: &NodeId, revision: &str) -> PathBuf {
        self.programs_dir(node).join(revision)
    }

    /// `cgroup/`: the links of the socket programs on the cgroup v2 root, each pinned under
    /// its program's name.
    pub fn cgroup_dir(&self, node: &NodeId) -> PathBuf {
        self.node_dir(node).join(names::CGROUP_DIR)
    }

    pub fn devices_dir(&self, node: &NodeId) -> PathBuf {
        self.node_dir(node).join(names::DEVICES_DIR)
    }

    /// `gateways/`: `<IPv4 gateway in hex>/<attachment id>`, who uses each gateway on `lo`.
    pub fn gateways_dir(&self, node: &NodeId) -> PathBuf {
        self.node_dir(node).join(names::GATEWAYS_DIR)
    }

    /// `gateways6/`: `<IPv6 gateway in hex>/<attachment id>`, whose host veths hold each
    /// IPv6 gateway.
    pub fn gateways6_dir(&self, node: &NodeId) -> PathBuf {
        self.node_dir(node).join(names::GATEWAYS6_DIR)
    }

    /// `converged/<unix ms>-<by>`: the node's last convergence (see `converge.rs`).
    pub fn converged_dir(&self, node: &NodeId) -> PathBuf {
        self.node_dir(node).join(names::CONVERGED_DIR)
    }

    /// `unrouted_peers/<record>`: the peer subnets the cluster network's agent gives no
    /// route (see `tunnel::record_unrouted`).
    pub fn unrouted_peers_dir(&self, node: &NodeId) -> PathBuf {
        self.node_dir(node).join(names::UNROUTED_PEERS_DIR)
    }

    /// The record of where the node's Service ranges came from (`services/<source>`).
    pub fn services_dir(&self, node: &NodeId) -> PathBuf {
        self.node_dir(node).join(names::SERVICES_DIR)
    }

    /// `devices/<ifname>`: the pins of node device `ifname`.
    pub fn device_dir(&self, node: &NodeId, ifname: &str) -> PathBuf {
        self.devices_dir(node).join(&*pin_component(ifname))
    }

    /// The link of the device program on node device `ifname`.
    pub fn device_link(&self, node: &NodeId, ifname: &str) -> PathBuf {
        self.device_dir(node, ifname).join(names::LINK_FROM_DEV)
    }

    /// Netlink mode: the record that node device `ifname` has the device filter.
    pub fn device_netlink_record(&self, node: &NodeId, ifname: &str) -> PathBuf {
        self.device_dir(node, ifname)
            .join(Hook::FromDev.netlink_record_name())
    }

    /// Netlink mode: the record (an empty directory) that ebpf-cni created node device
    /// `ifname`'s `clsact` qdisc; without it the qdisc was someone else's and stays.
    pub fn device_clsact_record(&self, node: &NodeId, ifname: &str) -> PathBuf {
        self.device_dir(node, ifname).join(names::CLSACT_RECORD)
    }

    /// The node devices with pins, by name (unsorted); none when there are none.
    pub fn pinned_devices(&self, node: &NodeId) -> Vec<String> {
        fs::read_dir(walk(&self.devices_dir(node)))
            .map(|es| {
                es.flatten()
                    .filter_map(|e| name_of_component(e.file_name().to_str()?))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn attachment(&self, node: &NodeId, key: &AttachmentKey<'_>) -> AttachmentPins {
        AttachmentPins {
            dir: self
                .network_attachments_dir(node, key.network)
                .join(&*pin_component(key.container_id))
                .join(&*pin_component(key.ifname)),
        }
    }
}

/// The directory of one attachment and the pins in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachmentPins {
    dir: PathBuf,
}

impl AttachmentPins {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The pinned TCX link of the program of `hook`.
    pub fn link(&self, hook: Hook) -> PathBuf {
        self.dir.join(hook.link_pin_name())
    }

    /// Netlink mode: the record that `hook`'s filter was attached.
    pub fn netlink_record(&self, hook: Hook) -> PathBuf {
        self.dir.join(hook.netlink_record_name())
    }

    /// The list of host port mappings the attachment installed.
    pub fn ports(&self) -> PathBuf {
        self.dir.join(ebpf_cni_maps::ATTACHMENT_PORTS_MAP)
    }

    /// The record (an empty directory) that ADD installed the pod's source check (`on`),
    /// or that the check is off.
    pub fn source_check_record(&self, on: bool) -> PathBuf {
        self.dir.join(if on {
            names::SOURCE_CHECK_RECORD
        } else {
            names::SOURCE_CHECK_OFF_RECORD
        })
    }
}

pub(super) fn is_bpffs(path: &Path) -> Result<bool, BpfError> {
    match statfs(path) {
        Ok(fs) => Ok(fs.filesystem_type() == BPF_FS_MAGIC),
        // A missing override directory is simply not a bpffs.
        Err(nix::Error::ENOENT) => Ok(false),
        Err(source) => Err(BpfError::StatBpffs {
            path: path.into(),
            source,
        }),
    }
}

/// Makes sure the pin root ([`PinRoot::from_env`]) is a bpf filesystem, mounting one at
/// `/sys/fs/bpf` if it is not (the kernel does not mount it by itself, and runtimes do not
/// always). A root overridden by `EBPF_CNI_BPFFS_ROOT` is never mounted, only checked.
pub fn ensure_bpffs() -> Result<(), BpfError> {
    ensure_bpffs_at(&PinRoot::from_env())
}

pub(crate) fn ensure_bpffs_at(root: &PinRoot) -> Result<(), BpfError> {
    // Asked once a process: an ADD reached here three times (its start, the gateway's
    // record, its programs), a `statfs` each.
    static FOUND: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    let path = root.bpffs();
    let found = |p: &Path| FOUND.lock().is_ok_and(|f| f.iter().any(|q| q == p));
    if found(path) {
        return Ok(());
    }
    ensure_bpffs_uncached(root)?;
    if let Ok(mut f) = FOUND.lock() {
        f.push(path.to_path_buf());
    }
    Ok(())
}

fn ensure_bpffs_uncached(root: &PinRoot) -> Result<(), BpfError> {
    let path = root.bpffs();
    if is_bpffs(path)? {
        return Ok(());
    }
    if !root.is_default() {
        return Err(BpfError::NotBpffs { path: path.into() });
    }
    // Two plugins starting at once on a fresh node would both see no bpffs and stack two
    // mounts, hiding the first one's pins under the second. The lock is on the directory
    // that is about to be covered (every racer opened it before the mount), and the check
    // is repeated under it.
    let lock_err = |source| BpfError::LockBpffs {
        path: path.into(),
        source,
    };
    let dir = fs::File::open(path).map_err(lock_err)?;
    // SAFETY: plain syscall on an fd we own; the lock goes away when `dir` is closed.
    if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(lock_err(io::Error::last_os_error()));
    }
    if is_bpffs(path)? {
        return Ok(());
    }
    log::info!("mounting a bpf filesystem at {}", path.display());
    nix::mount::mount(
        Some("bpf"),
        path,
        Some("bpf"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=0700"),
    )
    .map_err(|source| BpfError::MountBpffs {
        path: path.into(),
        source,
    })
}

/// Creates `dir` and its parents, retrying when a concurrent detach of a sibling attachment
/// prunes a shared parent (`<network>/`) between our `mkdir`s.
pub(crate) fn create_dir_all_racy(dir: &Path) -> Result<(), BpfError> {
    let mut attempts = 0;
    loop {
        match fs::create_dir_all(walk(dir)) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound && attempts < 3 => attempts += 1,
            Err(source) => {
                return Err(BpfError::CreatePinDir {
                    path: dir.into(),
                    source,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bpffs refuses dotted names: each `.` (and the escape's own `%`) is written out, every
    /// other name is pinned as itself, and every component reads back as its name.
    #[test]
    fn names_become_components_bpffs_takes_and_back() {
        for (name, component) in [
            ("eth0", "eth0"),
            ("eth0.100", "eth0%2e100"),
            ("flannel.1", "flannel%2e1"),
            ("a..b", "a%2e%2eb"),
            ("50%", "50%25"),
            ("%2e", "%252e"),
            (".x", "%2ex"),
        ] {
            assert_eq!(pin_component(name), component);
            assert!(!pin_component(name).contains('.'));
            assert_eq!(name_of_component(component).as_deref(), Some(name));
        }
        for foreign in ["a.b", "a%", "a%2", "a%41", "%"] {
            assert_eq!(name_of_component(foreign), None, "{foreign}");
        }
    }

    const KEY: AttachmentKey<'static> = AttachmentKey {
        network: "podnet",
        container_id: "0123abcd",
        ifname: "eth0",
    };

    #[test]
    fn attachment_paths_follow_the_layout() {
        let root = PinRoot::new("/sys/fs/bpf");
        let node = NodeId::from_netns_inode(4026531840);
        let pins = root.attachment(&node, &KEY);
        let dir = "/sys/fs/bpf/ebpf-cni/v1/netns-4026531840/attachments/podnet/0123abcd/eth0";
        assert_eq!(pins.dir(), Path::new(dir));
        assert_eq!(
            pins.link(Hook::FromPod),
            Path::new(dir).join("link_from_pod")
        );
        assert_eq!(pins.link(Hook::ToPod), Path::new(dir).join("link_to_pod"));
        assert_eq!(
            pins.source_check_record(true),
            Path::new(dir).join("source_check")
        );
        assert_eq!(
            pins.source_check_record(false),
            Path::new(dir).join("source_check_off")
        );
        assert_eq!(
            root.map(&node, "ECNI_ENDPOINTS"),
            Path::new("/sys/fs/bpf/ebpf-cni/v1/netns-4026531840/maps/ECNI_ENDPOINTS")
        );
        assert_eq!(
            root.program(&node, "r1", "ecni_from_pod"),
            Path::new("/sys/fs/bpf/ebpf-cni/v1/netns-4026531840/programs/r1/ecni_from_pod")
        );
        assert_eq!(
            root.device_link(&node, "eth0"),
            Path::new("/sys/fs/bpf/ebpf-cni/v1/netns-4026531840/devices/eth0/link_from_dev")
        );
        assert_eq!(
            root.device_clsact_record(&node, "eth0"),
            Path::new("/sys/fs/bpf/ebpf-cni/v1/netns-4026531840/devices/eth0/clsact_created")
        );
        assert_eq!(
            root.attachments_dir(&node),
            Path::new("/sys/fs/bpf/ebpf-cni/v1/netns-4026531840/attachments")
        );
        assert!(pins.dir().starts_with(root.attachments_dir(&node)));
    }

    /// The module's layout names every pin the code makes: each node map, program, link,
    /// record and directory (a name added to the code and not to the layout fails here).
    #[test]
    fn the_layout_names_every_pin() {
        let doc: String = include_str!("pin.rs")
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .collect::<Vec<_>>()
            .join("\n");
        let hooks = [Hook::FromPod, Hook::ToPod, Hook::FromDev, Hook::FromChain];
        let names = ebpf_cni_maps::NODE_MAPS
            .iter()
            .map(|m| m.name)
            .chain(super::super::programs::TABLE.iter().map(|p| p.name))
            .chain(hooks.iter().map(|h| h.link_pin_name()))
            .chain(hooks.iter().map(|h| h.netlink_record_name()))
            .chain([
                names::PROJECT_DIR,
                names::LAYOUT_VERSION_DIR,
                names::NODE_DIR_PREFIX,
                names::ATTACHMENTS_DIR,
                names::MAPS_DIR,
                names::PROGRAMS_DIR,
                names::CGROUP_DIR,
                names::DEVICES_DIR,
                names::CLSACT_RECORD,
                names::GATEWAYS_DIR,
                names::GATEWAYS6_DIR,
                names::SERVICES_DIR,
                names::FORWARD_FIREWALL_RECORD,
                names::SOURCE_CHECK_RECORD,
                names::SOURCE_CHECK_OFF_RECORD,
                ebpf_cni_maps::ATTACHMENT_PORTS_MAP,
            ]);
        for name in names {
            let named = doc
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
                .any(|w| w == name || (name.ends_with('-') && w.starts_with(name)));
            assert!(
                named,
                "the layout in pin.rs's module doc does not name {name}"
            );
        }
    }

    #[test]
    fn nodes_get_disjoint_trees() {
        let root = PinRoot::new("/b");
        let a = root.attachment(&NodeId::from_netns_inode(1), &KEY);
        let b = root.attachment(&NodeId::from_netns_inode(2), &KEY);
        assert_ne!(a.dir(), b.dir());
        assert!(!a
            .dir()
            .starts_with(root.node_dir(&NodeId::from_netns_inode(2))));
    }

    #[test]
    fn root_override_moves_everything() {
        let root = PinRoot::new("/tmp/bpffs-test");
        let pins = root.attachment(&NodeId::from_netns_inode(7), &KEY);
        assert!(pins
            .link(Hook::FromPod)
            .starts_with("/tmp/bpffs-test/ebpf-cni/v1/netns-7/"));
    }

    #[test]
    fn current_node_is_this_threads_netns() {
        let node = NodeId::current().expect("procfs is mounted");
        let ino = fs::metadata("/proc/thread-self/ns/net").unwrap().ino();
        assert_eq!(node.netns_inode, ino);
        assert_eq!(node.to_string(), format!("netns-{ino}"));
    }
}
