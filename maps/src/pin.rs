//! Names of the directories and files under the bpffs mount point. The plugin's `bpf::pin`
//! module assembles them into paths; nothing else spells them out.

/// Directory of this project directly under the bpffs mount point.
pub const PROJECT_DIR: &str = "ebpf-cni";
/// Layout version: a binary that changes what it pins bumps this, so it never misreads
/// pins left by an older one.
pub const LAYOUT_VERSION_DIR: &str = "v1";
/// Prefix of the per-node directory, followed by the node's netns inode.
pub const NODE_DIR_PREFIX: &str = "netns-";
/// Directory holding one sub-tree `<network>/<container id>/<ifname>/` per attachment.
pub const ATTACHMENTS_DIR: &str = "attachments";
/// The pinned TCX link of [`PROG_FROM_POD`](super::PROG_FROM_POD).
pub const LINK_FROM_POD: &str = "link_from_pod";
/// The pinned TCX link of [`PROG_TO_POD`](super::PROG_TO_POD).
pub const LINK_TO_POD: &str = "link_to_pod";
/// The pinned TCX link of [`PROG_FROM_DEV`](super::PROG_FROM_DEV) on a node device.
pub const LINK_FROM_DEV: &str = "link_from_dev";
/// The pinned TCX link of [`PROG_FROM_CHAIN`](super::PROG_FROM_CHAIN) (chained mode).
pub const LINK_FROM_CHAIN: &str = "link_from_chain";
/// A node device's record in netlink mode (no TCX): the device program, pinned in the
/// device's directory, stands for the `clsact` filter that runs it.
pub const NETLINK_FROM_DEV: &str = "netlink_from_dev";
/// A chained pod's record of its ingress filter in netlink mode.
pub const NETLINK_FROM_CHAIN: &str = "netlink_from_chain";
/// The pinned TCX link of [`PROG_TO_TUNNEL`](super::PROG_TO_TUNNEL) on the tunnel device.
pub const LINK_TO_TUNNEL: &str = "link_to_tunnel";
/// The tunnel device's record of its egress filter in netlink mode.
pub const NETLINK_TO_TUNNEL: &str = "netlink_to_tunnel";
/// Directory of the node-wide maps, each pinned under its map name.
pub const MAPS_DIR: &str = "maps";
/// Directory of the loaded programs, one sub-directory per object revision (a hash of
/// the embedded object), each program pinned under its name.
pub const PROGRAMS_DIR: &str = "programs";
/// Directory of the node's cgroup links (socket-address programs), one pin per program.
pub const CGROUP_DIR: &str = "cgroup";
/// Directory with one sub-directory per node device carrying [`LINK_FROM_DEV`].
pub const DEVICES_DIR: &str = "devices";
/// Empty directory beside a node device's netlink record: ebpf-cni created that
/// device's `clsact` qdisc, so the node's teardown may remove it (when no filter of
/// anyone is left on it).
pub const CLSACT_RECORD: &str = "clsact_created";
/// Directory `<IPv4 gateway, 8 hex digits>/<attachment id>`: which attachments use
/// each gateway the node holds on `lo` (bpffs names may not contain a dot).
pub const GATEWAYS_DIR: &str = "gateways";
/// Directory `<IPv6 gateway, 32 hex digits>/<attachment id>`: which attachments' host
/// veths hold each IPv6 gateway (each such veth holds it, as a /128), so STATUS can put
/// one back where it went missing.
pub const GATEWAYS6_DIR: &str = "gateways6";
/// Directory holding one empty directory `<unix ms>-<by>`: when the node's device
/// links, host-port addresses and masquerade sources were last brought in line with
/// its devices and addresses, and by what (`add`, `status`, `agent`).
pub const CONVERGED_DIR: &str = "converged";
/// Directory of the node holding one empty directory per peer subnet the cluster network's
/// agent gives no route, named `<subnet>|<node>|<why>` with `%`, `.`, `/` and `|` written
/// `%25`, `%2e`, `%2f` and `%7c`.
pub const UNROUTED_PEERS_DIR: &str = "unrouted_peers";
/// Directory of the node holding one empty directory named after the source of its
/// Service ranges (`kube-proxy-iptables-nft`, `config`, `none`, joined by `+`).
pub const SERVICES_DIR: &str = "services";
/// Empty directory of the node: its first ADD looked for a forward-hook firewall the
/// programs skip (and warned if it found one).
pub const FORWARD_FIREWALL_RECORD: &str = "forward_firewall_checked";
/// `stock_keys_warned/<16 hex digits>/`: ADD warned of the reference plugins' keys a
/// network's config carries that ebpf-cni accepts (hash of the network and the keys).
pub const STOCK_KEYS_WARNED_DIR: &str = "stock_keys_warned";
/// Empty directory in an attachment's directory: ADD installed the pod's source check
/// in [`SOURCES_MAP`](super::SOURCES_MAP), which CHECK expects to find there.
pub const SOURCE_CHECK_RECORD: &str = "source_check";
/// Empty directory in an attachment's directory: the pod's source check is off
/// (`sourceCheck: false`), and it has no entries. Without either record the pod was
/// attached by a release before the check (and has no entries either).
pub const SOURCE_CHECK_OFF_RECORD: &str = "source_check_off";
/// Prefix of an empty directory in an attachment's directory whose name says where the
/// pod's entries are in the node maps (its host veth, addresses, paced namespace and
/// source entries), so DEL removes them by key instead of walking the maps.
pub const PLACEMENT_RECORD_PREFIX: &str = "placed-";
