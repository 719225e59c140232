//! Types and names shared between the kernel-side programs (`ebpf/`) and user space
//! (`plugin/`).
//!
//! Every map value crosses the kernel boundary as raw bytes, so each type here is
//! `#[repr(C)]`, lists its fields large to small, spells out any padding as `_pad` fields and
//! asserts its size at compile time: a layout change must be a deliberate edit here, never an
//! accident of field order. Map and program names are BPF object names, which the kernel cuts
//! at 15 bytes, so they are checked for length too.
#![no_std]

mod services;
pub use services::*;

/// Node-wide hash of every local pod address: [`EndpointKey`] → [`EndpointInfo`].
pub const ENDPOINTS_MAP: &str = "ECNI_ENDPOINTS";
/// Node-wide per-CPU hash of per-pod traffic counters: host veth ifindex (`u32`) →
/// [`PodCounters`].
pub const POD_COUNTERS_MAP: &str = "ECNI_POD_CNT";
/// Node-wide array with one `u32`: non-zero while `ebpf-cni trace` runs. The programs
/// write [`TraceNote`]s to [`TRACE_RING_MAP`] only then, so tracing costs one array lookup
/// when off.
pub const TRACE_MAP: &str = "ECNI_TRACE";
/// Ring buffer of [`TraceNote`]s, one per decision the programs make while a trace runs.
/// Not pinned: each load of the programs has its own, and `ebpf-cni trace` finds it among
/// the maps `ecni_from_pod` uses.
pub const TRACE_RING_MAP: &str = "ECNI_TRACE_RING";
/// Node-wide hash of per-pod rate limits: host veth ifindex (`u32`) → [`RateLimit`]. A pod
/// without limits has no entry, and its packets skip the limiter after one failed lookup.
pub const RATE_LIMITS_MAP: &str = "ECNI_RATES";
/// Node-wide hash of the host port mappings: [`PortKey`] → [`PortTarget`].
pub const PORTMAP_MAP: &str = "ECNI_PORTMAP";
/// Node-wide per-CPU hash of each mapping's hit counters: [`PortKey`] → [`PortHits`].
pub const PORTMAP_HITS_MAP: &str = "ECNI_PM_HITS";
/// Node-wide LRU hash of translated flows, keyed as the pod's replies look:
/// [`NatKey`] → [`NatOrig`] (what the client had dialled).
pub const NAT_REV_MAP: &str = "ECNI_NAT_REV";
/// Node-wide LRU hash of socket-level translations (connections and datagrams of the node's
/// own processes): [`SockKey`] → [`SockOrig`].
pub const SOCK_REV_MAP: &str = "ECNI_SOCK_REV";
/// Node-wide hash of the node's own addresses (any of which a wildcard host port answers
/// on): [`EndpointKey`] → `u32` (unused, 0).
pub const NODE_ADDRS_MAP: &str = "ECNI_NODE_ADDR";
/// Node-wide array with one [`NodeConfig`].
pub const CONFIG_MAP: &str = "ECNI_CONFIG";
/// Node-wide hash of TCP pacing for pods with an egress limit: the pod's network namespace
/// cookie (`u64`) → [`Pacing`]. The sockops program caps each TCP socket of such a pod at
/// the rate, so TCP sends at the limit instead of bouncing off the policer.
pub const PACING_MAP: &str = "ECNI_PACING";
/// Node-wide array with one [`NsProbe`]: how the plugin learns the node's network namespace
/// cookie on a kernel without `SO_NETNS_COOKIE` (before 5.14). `ecni_connect4` records the
/// cookie of one armed socket's namespace there.
pub const NS_PROBE_MAP: &str = "ECNI_NS_PROBE";
/// Node-wide LPM trie of the subnets a limited pod's `unshapedSubnets` / `shapedSubnets`
/// name: [`ShapeSubnetKey`] (host veth ifindex, then a 16-byte address, IPv4 mapped into
/// IPv6) → `u32` (unused, 1). The programs look here only for a pod whose limit carries
/// [`LIMIT_SUBNETS_UNSHAPED`] or [`LIMIT_SUBNETS_SHAPED`].
pub const SHAPE_SUBNETS_MAP: &str = "ECNI_SHAPE_NET";
/// Node-wide LPM trie of the source addresses each pod may send from (the source check):
/// an LPM key of [`SourceKey`] (prefix length counting its 64 head bits) → [`SourceRule`].
/// Per checked pod: one entry per own address (/32, /128) and per extra prefix, all
/// [`SOURCE_PASS`], and a catch-all of the pod's ifindex alone ([`SOURCE_POD_BITS`],
/// [`SOURCE_REFUSE`]) for every other source. A pod without entries is not checked: its
/// check is off (`sourceCheck: false`), or a release before the check attached it. One
/// lookup per frame answers both the address and the MAC.
pub const SOURCES_MAP: &str = "ECNI_SOURCES";
/// A node-wide map as user space handles it: a hash, LRU hash or LPM trie (looked up by key), or an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeMap {
    pub name: &'static str,
    /// An array, which the programs index by constant: it keeps its size where user space
    /// shrinks the others (the load probe loads into throw-away maps of a few entries).
    pub array: bool,
}

impl NodeMap {
    const fn keyed(name: &'static str) -> Self {
        Self { name, array: false }
    }

    const fn array(name: &'static str) -> Self {
        Self { name, array: true }
    }
}

/// Every node-wide map, pinned under the node's `maps/` directory: the load pins these, the
/// load probe shrinks them, and `inspect`/`metrics` report each one's use against its size.
pub const NODE_MAPS: [NodeMap; 25] = [
    NodeMap::keyed(ENDPOINTS_MAP),
    NodeMap::keyed(POD_COUNTERS_MAP),
    NodeMap::array(TRACE_MAP),
    NodeMap::keyed(RATE_LIMITS_MAP),
    NodeMap::keyed(PORTMAP_MAP),
    NodeMap::keyed(PORTMAP_HITS_MAP),
    NodeMap::keyed(NAT_REV_MAP),
    NodeMap::keyed(NAT_FRAG_MAP),
    NodeMap::keyed(SOCK_REV_MAP),
    NodeMap::keyed(NODE_ADDRS_MAP),
    NodeMap::array(CONFIG_MAP),
    NodeMap::keyed(PACING_MAP),
    NodeMap::keyed(MASQ_FWD_MAP),
    NodeMap::keyed(MASQ_REV_MAP),
    NodeMap::keyed(MASQ_SKIP_MAP),
    NodeMap::keyed(MASQ_SRC_MAP),
    NodeMap::array(MASQ_STATS_MAP),
    NodeMap::keyed(MASQ_FRAG_MAP),
    NodeMap::keyed(MASQ_FRAG6_MAP),
    NodeMap::array(NS_PROBE_MAP),
    NodeMap::keyed(SHAPE_SUBNETS_MAP),
    NodeMap::keyed(SOURCES_MAP),
    NodeMap::keyed(SERVICES_NETS_MAP),
    NodeMap::keyed(SERVICES_FLOWS_MAP),
    NodeMap::array(SERVICES_STATS_MAP),
];

/// Node-wide hash of masqueraded flows as the pod sends them: [`MasqKey`] with the pod's
/// address and port (ICMP echo: identifier) → [`MasqFlow`] with the node's address and the
/// port it took. Entries are never evicted by the kernel: a flow goes when it has been idle
/// past its timeout and its port is wanted again, when its pod is deleted, or at GC.
pub const MASQ_FWD_MAP: &str = "ECNI_MASQ_FWD";
/// Node-wide hash of the same flows as replies carry them: [`MasqKey`] with the node's
/// address and port → [`MasqFlow`] with the pod's.
pub const MASQ_REV_MAP: &str = "ECNI_MASQ_REV";
/// Node-wide LPM trie of destinations never masqueraded (the masquerading networks' own
/// ranges and their `ipMasqExclude`): an LPM key of a 16-byte address (IPv4 mapped into
/// IPv6, its prefix length counting the 96 bits before it) → `u32` (unused, 1).
pub const MASQ_SKIP_MAP: &str = "ECNI_MASQ_SKIP";
/// Node-wide hash of each device's source address for masquerade, for kernels whose FIB
/// lookup cannot tell it (`BPF_FIB_LOOKUP_SRC` is 6.8+): [`masq_src_key`] → [`EndpointKey`].
pub const MASQ_SRC_MAP: &str = "ECNI_MASQ_SRC";
/// Node-wide per-CPU array with one [`MasqStats`].
pub const MASQ_STATS_MAP: &str = "ECNI_MASQ_STAT";
/// Node-wide LRU hash of the IPv4 datagrams of masqueraded flows that travel in fragments:
/// [`MasqFragKey`] (the datagram's addresses, identification and protocol as the packet
/// carries them, and the direction) → [`MasqFrag`] (the address its fragments take). Only a
/// datagram's first fragment carries the transport header that finds the flow: it is
/// translated with the flow and recorded here, and the later fragments are translated by
/// this record.
pub const MASQ_FRAG_MAP: &str = "ECNI_MASQ_FRAG";
/// The same for IPv6 datagrams: [`MasqFrag6Key`] → [`MasqFrag6`], of [`MAX_MASQ_FRAGS`]
/// records. A map of its own, so that the IPv4 records keep the layout nodes already have
/// pinned.
pub const MASQ_FRAG6_MAP: &str = "ECNI_MASQ_FRAG6";
/// Capacity of [`MASQ_FRAG_MAP`]: datagrams in flight at once (the kernel evicts the
/// least recently used record).
pub const MAX_MASQ_FRAGS: u32 = 4_096;
/// How long a fragment record is used after its first fragment was seen, nanoseconds: the
/// fragments of one datagram are sent back to back. An older record with the same key (the
/// identification came round) is not used, so a late fragment never follows another
/// datagram's translation.
pub const MASQ_FRAG_TTL_NS: u64 = 5_000_000_000;
/// [`MasqFragKey::dir`]: a datagram a pod sends (the key holds the pod's address).
pub const MASQ_FRAG_OUT: u8 = 1;
/// [`MasqFragKey::dir`]: a datagram a remote end sends to the node's address.
pub const MASQ_FRAG_IN: u8 = 2;
/// Node-wide LRU hash of the UDP datagrams of host-port flows that travel in fragments,
/// both families: [`NatFragKey`] (the datagram as its fragments carry it, IPv4 addresses
/// mapped into IPv6, and the direction) → [`NatFrag`] (the address its fragments take: the
/// pod's arriving, the dialled node address leaving), of [`MAX_MASQ_FRAGS`] records kept
/// [`MASQ_FRAG_TTL_NS`], as masquerade's. The first fragment is translated with its flow and
/// recorded here; the later ones, which carry no ports, by the record.
pub const NAT_FRAG_MAP: &str = "ECNI_NAT_FRAG";
/// [`NatFragKey::dir`]: a client's datagram to a host port (the key holds the node's
/// address it dialled).
pub const NAT_FRAG_IN: u8 = 1;
/// [`NatFragKey::dir`]: a pod's reply in a host-port flow (the key holds the pod's address).
pub const NAT_FRAG_OUT: u8 = 2;
/// Capacity of [`MASQ_FWD_MAP`] and [`MASQ_REV_MAP`] (allocated as flows come).
pub const MAX_MASQ_FLOWS: u32 = 262_144;
/// Capacity of [`MASQ_SKIP_MAP`].
pub const MAX_MASQ_SKIP: u32 = 4_096;
/// The masquerade port range when the node config names none: above Linux's default
/// ephemeral range (32768-60999), and reserved in the node's `ip_local_reserved_ports`
/// while a masquerading pod exists, so the node's own sockets are never handed these ports.
pub const MASQ_PORT_MIN: u16 = 61_000;
pub const MASQ_PORT_MAX: u16 = 65_535;
/// How many ports a new flow tries (from where the CPU's last allocation left off) for one no flow
/// holds towards the same remote end; then it may take the first one from a flow idle past
/// its timeout, else it is dropped as exhausted. (The verifier walks every probe: at 32 the
/// programs took 2.5 times as long to load as without masquerade, 1.5 times at 8.)
pub const MASQ_PROBES: u32 = 8;
/// Timeouts of idle masqueraded flows, nanoseconds: a TCP flow that was reset or closed in
/// both directions (its last ACK is long through after 100 ms; the remote end's TIME_WAIT
/// takes the next SYN on the port, whose timestamps are made newer: [`MASQ_TS_LAST`]), one
/// never answered, one established; UDP; ICMP echo.
pub const MASQ_TCP_CLOSED_NS: u64 = 100_000_000;
pub const MASQ_TCP_OPENING_NS: u64 = 60_000_000_000;
pub const MASQ_TCP_OPEN_NS: u64 = 7_200_000_000_000;
pub const MASQ_UDP_NS: u64 = 120_000_000_000;
pub const MASQ_ICMP_NS: u64 = 30_000_000_000;
/// [`MasqFlow::state`] bits.
pub const MASQ_FIN_OUT: u16 = 1;
pub const MASQ_FIN_IN: u16 = 2;
pub const MASQ_RST: u16 = 4;
pub const MASQ_REPLIED: u16 = 8;
/// A flow the remote end opened towards the pod's own address (a UDP flow seen arriving
/// from a node device first): the pod's replies in it keep the pod's address.
pub const MASQ_INBOUND: u16 = 16;
/// [`MasqFlow::ts_last`] holds the timestamp of the pod's closing segments. When the port
/// goes to a new flow towards the same remote end within the remote end's TIME_WAIT, that
/// end accepts the new SYN only if its timestamp is newer (PAWS, RFC 7323); the pod's stack
/// keeps a timestamp clock per 4-tuple (Linux 6.18; per address pair before), so a new
/// pod port's clock may be behind: the new flow's [`MasqFlow::ts_shift`] moves it ahead.
pub const MASQ_TS_LAST: u16 = 32;

/// How long a masqueraded flow may stay idle before its port may go to another flow, by
/// protocol and the state bits both directions saw (the programs reclaim by it, GC sweeps
/// by it).
pub const fn masq_timeout_ns(proto: u8, state: u16) -> u64 {
    match proto {
        IPPROTO_TCP => {
            if state & MASQ_RST != 0
                || state & (MASQ_FIN_IN | MASQ_FIN_OUT) == MASQ_FIN_IN | MASQ_FIN_OUT
            {
                MASQ_TCP_CLOSED_NS
            } else if state & MASQ_REPLIED == 0 {
                MASQ_TCP_OPENING_NS
            } else {
                MASQ_TCP_OPEN_NS
            }
        }
        IPPROTO_UDP => MASQ_UDP_NS,
        _ => MASQ_ICMP_NS,
    }
}

/// The [`MASQ_SRC_MAP`] key of a device's address of one family.
pub const fn masq_src_key(ifindex: u32, v4: bool) -> u64 {
    ((ifindex as u64) << 1) | v4 as u64
}
/// The device of a [`masq_src_key`].
pub const fn masq_src_ifindex(key: u64) -> u32 {
    (key >> 1) as u32
}
const _: () = assert!(masq_src_ifindex(masq_src_key(u32::MAX, true)) == u32::MAX);
/// Sockops program (cgroup v2 root) setting `SO_MAX_PACING_RATE` on limited pods' sockets.
pub const PROG_SOCKOPS: &str = "ecni_sockops";
/// Capacity of [`PORTMAP_MAP`] and [`PORTMAP_HITS_MAP`].
pub const MAX_PORT_MAPPINGS: u32 = 65_536;
/// Capacity of [`NAT_REV_MAP`] and [`SOCK_REV_MAP`] (least recently used entries go first).
pub const MAX_NAT_FLOWS: u32 = 65_536;
/// Capacity of [`NODE_ADDRS_MAP`].
pub const MAX_NODE_ADDRS: u32 = 1_024;

/// Name of the per-attachment array map (pinned in the attachment's directory) that lists
/// the [`PortKey`]s the attachment installed: DEL removes exactly those, with or without
/// `portMappings` in its input.
pub const ATTACHMENT_PORTS_MAP: &str = "ecni_att_ports";

/// Capacity of [`ENDPOINTS_MAP`] (pod addresses per node) and [`POD_COUNTERS_MAP`].
pub const MAX_ENDPOINTS: u32 = 65_536;
/// Capacity of [`SOURCES_MAP`]: every pod address, a catch-all per pod and room for extra
/// prefixes (an LPM trie allocates entry by entry).
pub const MAX_SOURCES: u32 = 4 * MAX_ENDPOINTS;

/// Socket-address programs (attached to the cgroup v2 root, acting only on sockets of the
/// node's network namespace): they translate the node's own connections and datagrams to a
/// host port into connections to the pod, and make replies look as if the host port sent
/// them.
pub const PROG_CONNECT4: &str = "ecni_connect4";
pub const PROG_CONNECT6: &str = "ecni_connect6";
pub const PROG_SENDMSG4: &str = "ecni_sendmsg4";
pub const PROG_SENDMSG6: &str = "ecni_sendmsg6";
pub const PROG_RECVMSG4: &str = "ecni_recvmsg4";
pub const PROG_RECVMSG6: &str = "ecni_recvmsg6";
pub const PROG_PEERNAME4: &str = "ecni_peername4";
pub const PROG_PEERNAME6: &str = "ecni_peername6";

/// TC program at the host veth's ingress: traffic leaving the pod.
pub const PROG_FROM_POD: &str = "ecni_from_pod";
/// TC program at the host veth's egress: traffic the node's stack sends into the pod.
pub const PROG_TO_POD: &str = "ecni_to_pod";
/// TC program at the ingress of the node's external devices: traffic arriving for pods.
pub const PROG_FROM_DEV: &str = "ecni_from_dev";
/// The XDP prototype of `ecni_from_dev`'s host-port path: in the benchmark's object, for
/// its `xdp` section and the program tests, never in the plugin's (docs/dataplane.md).
pub const PROG_XDP_DEV: &str = "ecni_xdp_dev";
/// The floor of routing pod → pod at TC: what any program on a pod's host veth must do to
/// deliver to a local pod (the destination's endpoint, TTL and MACs, `bpf_redirect_peer`)
/// and nothing else. In the benchmark's object, for its pod-path section and the program
/// tests, never in the plugin's.
pub const PROG_FLOOR_POD: &str = "ecni_floor_pod";
/// The same floor for pods behind netkit devices (Linux 6.7+): `bpf_redirect` out of the
/// destination's netkit primary device instead of `bpf_redirect_peer`. For the benchmark's
/// netkit section only, which attaches it as the peer-side program of two netkit pairs.
pub const PROG_FLOOR_NETKIT: &str = "ecni_floor_nk";
/// Host veth ingress of a pod another plugin created (chained mode): limits, counters and
/// host-port translation only; untranslated packets go on to that plugin's bridge or routes.
pub const PROG_FROM_CHAIN: &str = "ecni_from_chain";

/// Every program the plugin loads: the object it embeds holds these and no other
/// (`cargo xtask dist` checks the release's).
pub const PLUGIN_PROGRAMS: [&str; 13] = [
    PROG_FROM_POD,
    PROG_TO_POD,
    PROG_FROM_DEV,
    PROG_FROM_CHAIN,
    PROG_CONNECT4,
    PROG_CONNECT6,
    PROG_SENDMSG4,
    PROG_SENDMSG6,
    PROG_RECVMSG4,
    PROG_RECVMSG6,
    PROG_PEERNAME4,
    PROG_PEERNAME6,
    PROG_SOCKOPS,
];
/// The benchmark's prototypes: only in its own object (the eBPF crate's `prototypes`
/// feature), beside [`PLUGIN_PROGRAMS`].
pub const PROTOTYPE_PROGRAMS: [&str; 3] = [PROG_XDP_DEV, PROG_FLOOR_POD, PROG_FLOOR_NETKIT];

/// IP protocol numbers of the host port protocols.
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_SCTP: u8 = 132;
pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_ICMPV6: u8 = 58;

/// [`NatOrig::flags`]: the flow is a pod reaching its own host port; its source was
/// rewritten to the pod's gateway, so the reply's destination goes back to the pod.
pub const NAT_FLAG_HAIRPIN: u16 = 1;

/// [`NodeConfig::flags`]: some host port mapping exists on the node, so the programs look
/// packets up in the port-mapping maps (without it they skip those lookups).
pub const NODE_FLAG_PORTMAP: u32 = 1;

/// [`EndpointInfo::flags`]: a pod whose interface ebpf-cni made (standalone mode).
pub const EP_FLAGS_NONE: u32 = 0;
/// [`EndpointInfo::flags`]: another plugin made the pod's interface and forwards its traffic
/// (chained mode). The programs deliver into such a pod only packets they translated for a
/// host port; everything else for it takes the stack, as that plugin set it up.
pub const EP_FLAG_CHAINED: u32 = 1;
/// [`EndpointInfo::flags`]: the pod's traffic to destinations outside the skip trie is
/// masqueraded (`ipMasq`).
pub const EP_FLAG_MASQ: u32 = 2;
/// [`NodeConfig::flags`]: some pod on the node masquerades, so the device program looks
/// replies up in the masquerade table.
pub const NODE_FLAG_MASQ: u32 = 2;
/// [`NodeConfig::flags`]: the node's rate map is empty, so `ecni_from_pod` skips the
/// lookup of the sending pod's egress limit. Set by the binary that loads a revision or
/// removes the node's last limit, cleared by the binary that writes a limit, before the
/// pod's programs attach. A flag that says "nothing to do": a node whose config predates
/// it keeps every lookup. Safe across releases because a pod's egress limit is applied by
/// its own programs, which the binary that wrote the limit attached: an older release that
/// writes a limit while the flag is on attaches its own programs, which ignore the flag.
/// The limit towards a pod is still looked up on every delivery: that lookup runs in the
/// sender's programs, and an older release writing a receiver's limit would not turn the
/// flag off for them.
pub const NODE_FLAG_NO_LIMITS: u32 = 8;

/// Names of the directories and files under the bpffs mount point. The plugin's `bpf::pin`
/// module assembles them into paths; nothing else spells them out.
pub mod pin {
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
}

/// Key of [`ENDPOINTS_MAP`]: an IPv6 address, or an IPv4 address mapped into IPv6
/// (`::ffff:a.b.c.d`), in network byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EndpointKey {
    pub addr: [u8; 16],
}

const _: () = assert!(core::mem::size_of::<EndpointKey>() == 16);

impl EndpointKey {
    pub const fn v4(octets: [u8; 4]) -> Self {
        let [a, b, c, d] = octets;
        Self {
            addr: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d],
        }
    }

    pub const fn v6(octets: [u8; 16]) -> Self {
        Self { addr: octets }
    }
}

/// Value of [`ENDPOINTS_MAP`]: where a local pod address lives.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndpointInfo {
    /// Hash of (network, container id, ifname): lets DEL find the entries of an attachment
    /// without knowing its addresses or its (maybe deleted) host veth.
    pub attachment_id: u64,
    /// The pod's host-side veth; `bpf_redirect_peer` to it lands in the pod.
    pub host_ifindex: u32,
    /// `EP_FLAGS_*`.
    pub flags: u32,
    /// Source MAC of frames delivered to the pod (its gateway, the host veth).
    pub host_mac: [u8; 6],
    /// Destination MAC of frames delivered to the pod.
    pub pod_mac: [u8; 6],
    /// For an IPv4 address of a pod whose interface ebpf-cni made: its gateway, whose ARP
    /// requests `ecni_from_pod` answers (the node holds the address once, not on the host
    /// veth). All zero: none (IPv6, chained pods, no gateway, entries of older releases).
    pub gateway4: [u8; 4],
}

const _: () = assert!(core::mem::size_of::<EndpointInfo>() == 32);

/// One direction's counts on one CPU. `bytes` counts `skb->len` (from the Ethernet header).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirCounters {
    pub packets: u64,
    pub bytes: u64,
    /// Packets the dataplane dropped on purpose (the rate limiter).
    pub drops: u64,
    /// Packets a helper or a translation failed on: dropped when a redirect was refused or
    /// a host-port rewrite failed; left to the stack unchanged when the FIB lookup failed.
    pub errors: u64,
    /// Packets the rate limiter marked ECN CE instead of dropping.
    pub marks: u64,
    /// From the pod only: frames the source check dropped because their source address
    /// (IPv4, IPv6, ARP's sender) is not one the pod may send from, or cannot be read.
    /// The check runs after the limiter and the packet count: these frames are in
    /// `packets` and `bytes`, not in `drops`. (Spare room, always 0, before the check.)
    pub source_drops: u64,
    /// From the pod only: frames the source check dropped because their source MAC (or
    /// ARP's sender MAC) is not the pod interface's.
    pub mac_drops: u64,
    /// Not a count: written by ADD into every CPU's slot, never by the programs, and not
    /// summed. In `to_pod`: [`COUNTERS_NO_INGRESS_LIMIT`] or 0; in `from_pod`:
    /// [`COUNTERS_NO_HOST_PORTS`] and [`COUNTERS_NO_EGRESS_LIMIT`], or 0. Releases before
    /// it wrote 0 here (the field was spare room).
    pub flags: u64,
}

/// [`DirCounters::flags`] of `to_pod`: the pod has no ingress limit, so a program
/// delivering to it skips the lookup of its limit (it reads these counters anyway, to
/// count the packet). A flag that says "nothing to do": 0, which every earlier release
/// writes, keeps the lookup, so a pod whose counters an earlier release wrote (with or
/// without a limit) is limited as that release set it up. Written with the counters, at
/// ADD, where the pod's limits are known; CHECK fails if it is set on a pod with an
/// ingress limit.
pub const COUNTERS_NO_INGRESS_LIMIT: u64 = 1;

/// [`DirCounters::flags`] of `from_pod`: no host port mapping leads to the pod, so none of
/// its packets can be a reply in a host port flow, and `ecni_from_pod` (or
/// `ecni_from_chain`) skips the reverse translation's flow lookup for them (it reads these
/// counters anyway, to count the packet). "Nothing to do", as
/// [`COUNTERS_NO_INGRESS_LIMIT`]: 0, which earlier releases write, keeps the lookup. The
/// pod's mappings are its own, installed by its ADD, which writes the flag; CHECK fails if
/// it is set on a pod with a mapping.
pub const COUNTERS_NO_HOST_PORTS: u64 = 2;

/// [`DirCounters::flags`] of `from_pod`: the pod has no egress limit, so `ecni_from_pod`
/// (or `ecni_from_chain`) skips the lookup of its limit on a node where some pod has one
/// (where none has, [`NODE_FLAG_NO_LIMITS`] skips it for every pod). "Nothing to do", as
/// [`COUNTERS_NO_INGRESS_LIMIT`], and written with it; CHECK fails if it is set on a pod
/// with an egress limit.
pub const COUNTERS_NO_EGRESS_LIMIT: u64 = 4;

const _: () = assert!(core::mem::size_of::<DirCounters>() == 64);
const _: () = assert!(core::mem::offset_of!(DirCounters, flags) == 56);
const _: () = assert!(core::mem::offset_of!(DirCounters, source_drops) == 40);
const _: () = assert!(core::mem::offset_of!(DirCounters, mac_drops) == 48);

/// Value of [`POD_COUNTERS_MAP`] on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodCounters {
    /// Sent by the pod (seen at its host veth's ingress).
    pub from_pod: DirCounters,
    /// Delivered to the pod, by redirect or through the stack.
    pub to_pod: DirCounters,
}

const _: () = assert!(core::mem::size_of::<PodCounters>() == 128);

/// One direction's limit. `rate_bytes` 0: no limit in this direction.
///
/// `mode` says how the programs hold it ([`LIMIT_POLICE`] and its variants, or
/// [`LIMIT_EDT`]). Releases before it had a `u64` burst here; bursts are below 4 GiB, so on
/// little-endian machines their entries read as a burst with mode 0 (police), which is what
/// they did.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    /// Rate in bytes per second.
    pub rate_bytes: u64,
    /// The burst in bytes: the policer's bucket size, or how far the pacer may fall behind
    /// "now" after an idle time (burst / rate).
    pub burst_bytes: u32,
    /// `LIMIT_*`.
    pub mode: u32,
    /// Policer: bytes that may pass now (updated by the programs). Pacer: unused.
    pub tokens: u64,
    /// `bpf_ktime_get_ns()`: the policer's last refill, or the pacer's last departure time
    /// (updated by the programs).
    pub last_ns: u64,
}

impl Bucket {
    /// Whether it limits its direction (`rate_bytes` 0: no limit).
    pub const fn limits(&self) -> bool {
        self.rate_bytes > 0
    }
}

const _: () = assert!(core::mem::size_of::<Bucket>() == 32);
const _: () = assert!(core::mem::offset_of!(Bucket, mode) == 12);
const _: () = assert!(core::mem::offset_of!(Bucket, tokens) == 16);

/// [`Bucket::mode`]: a token bucket at the packet's path drops what exceeds rate and burst
/// (the egress limit's mode; the ingress limit's where no pacing is possible).
pub const LIMIT_POLICE: u32 = 0;
/// An ingress limit that is policed because the kernel has no `sch_fq`.
pub const LIMIT_POLICE_NO_FQ: u32 = 2;
/// An ingress limit that is policed because the pod's host veth carries a root qdisc of
/// another kind (chained mode: the first plugin's or an operator's), which ebpf-cni leaves
/// alone.
pub const LIMIT_POLICE_FOREIGN_QDISC: u32 = 3;
/// An ingress limit paced: packets towards the pod go through its host veth's egress, where
/// `ecni_to_pod` stamps each with its departure time (EDT) and the veth's `fq` qdisc
/// releases it then. Packets whose departure lies beyond the horizon are dropped.
pub const LIMIT_EDT: u32 = 1;
/// The bits of [`Bucket::mode`] that hold the `LIMIT_*` mode; the bits above are flags.
pub const LIMIT_MODE_MASK: u32 = 0xff;
/// [`Bucket::mode`] flag: packets whose remote address (towards the pod: the source; from
/// the pod: the destination) is in one of the pod's [`SHAPE_SUBNETS_MAP`] subnets are not
/// limited (`unshapedSubnets`).
pub const LIMIT_SUBNETS_UNSHAPED: u32 = 1 << 8;
/// [`Bucket::mode`] flag: only packets whose remote address is in one of the pod's
/// [`SHAPE_SUBNETS_MAP`] subnets are limited (`shapedSubnets`).
pub const LIMIT_SUBNETS_SHAPED: u32 = 1 << 9;
/// Capacity of [`SHAPE_SUBNETS_MAP`], for the whole node.
pub const MAX_SHAPE_SUBNETS: u32 = 16_384;

/// The data of a [`SHAPE_SUBNETS_MAP`] key (after the LPM prefix length): the pod's host
/// veth ifindex, always matched whole (its 32 bits count in the prefix length), then the
/// address, IPv4 mapped into IPv6 (`::ffff:a.b.c.d`, the prefix counting the 96 bits
/// before it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ShapeSubnetKey {
    pub ifindex: u32,
    pub addr: [u8; 16],
}

const _: () = assert!(core::mem::size_of::<ShapeSubnetKey>() == 20);

/// Root qdisc handle (`ecf0:`) of the `fq` ebpf-cni adds to a paced pod's host veth: how
/// CHECK and DEL tell it from one another plugin or the operator added.
pub const EDT_QDISC_HANDLE: u32 = 0xecf0_0000;
/// The pacer's horizon: at least this long...
pub const EDT_HORIZON_MIN_NS: u64 = 20_000_000;
/// ...and at least the time two of the largest GSO packets (64 KiB) take at the rate, so
/// one always fits behind another.
pub const EDT_HORIZON_GSO_BYTES: u64 = 2 * 65_536;

/// Key of the pacer's flow table (the programs' own, not pinned): the host veth of a paced
/// pod and a flow's hash (`skb->hash`). The value is the pod's clock (ns) after that flow's
/// last packet: until it has passed, the flow has packets waiting in the queue.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PaceFlowKey {
    pub ifindex: u32,
    pub hash: u32,
}

const _: () = assert!(core::mem::size_of::<PaceFlowKey>() == 8);

/// Flows the pacer remembers, on the whole node (LRU: the least recently seen goes).
pub const MAX_PACE_FLOWS: u32 = 65_536;

/// How far ahead of "now" the pacer may schedule a packet towards a pod paced at
/// `rate_bytes` (bytes/s > 0); a packet that would leave later is dropped, which bounds the
/// queue (and the delay it adds) to this time.
#[inline(always)]
pub const fn edt_horizon_ns(rate_bytes: u64) -> u64 {
    // No panicking division: the verifier rejects a program with a panic path.
    let gso = match (EDT_HORIZON_GSO_BYTES * 1_000_000_000).checked_div(rate_bytes) {
        Some(t) => t,
        None => 0,
    };
    if gso > EDT_HORIZON_MIN_NS {
        gso
    } else {
        EDT_HORIZON_MIN_NS
    }
}

/// Value of [`RATE_LIMITS_MAP`]: "ingress" is traffic towards the pod, "egress" from it (the
/// CNI bandwidth convention).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateLimit {
    pub ingress: Bucket,
    pub egress: Bucket,
}

const _: () = assert!(core::mem::size_of::<RateLimit>() == 64);

/// Key of [`PORTMAP_MAP`]: which host address, port and protocol. `addr` is an
/// [`EndpointKey`]-style address; the wildcard of a family ("every node address") is all
/// zeroes for IPv6 and `::ffff:0.0.0.0` for IPv4.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PortKey {
    pub addr: [u8; 16],
    /// Host byte order.
    pub port: u16,
    /// `IPPROTO_*`.
    pub proto: u8,
    pub _pad: u8,
}

const _: () = assert!(core::mem::size_of::<PortKey>() == 20);

impl PortKey {
    pub const WILDCARD_V4: [u8; 16] = EndpointKey::v4([0; 4]).addr;
    pub const WILDCARD_V6: [u8; 16] = [0; 16];
}

/// Value of [`PORTMAP_MAP`]: the pod a host port leads to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortTarget {
    /// The attachment that installed the mapping.
    pub attachment_id: u64,
    /// The pod's address (same family as the key).
    pub pod_addr: [u8; 16],
    /// The pod's gateway in that family: the source of hairpin packets (the pod reaching
    /// its own host port), which the pod routes back to us. All zeroes: none.
    pub gateway: [u8; 16],
    /// The pod's host veth.
    pub host_ifindex: u32,
    /// Host byte order.
    pub pod_port: u16,
    /// `PORT_FLAG_*`. Was padding: an older binary's entries read as 0 (the defaults).
    pub flags: u8,
    pub _pad: u8,
}

const _: () = assert!(core::mem::size_of::<PortTarget>() == 48);

/// [`PortTarget::flags`]: the node's own connections to loopback (`127.0.0.0/8`, `::1`) are
/// not sent to the pod (`hostPortsOnLoopback: false`); they reach the node's own listener.
pub const PORT_FLAG_NO_LOOPBACK: u8 = 1;

/// Value of [`PORTMAP_HITS_MAP`] on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortHits {
    /// Packets translated by the TC programs (clients outside the node, pods).
    pub packets: u64,
    pub bytes: u64,
    /// Connections and datagrams of the node's own processes translated at the socket.
    pub socket: u64,
    pub _spare: u64,
}

const _: () = assert!(core::mem::size_of::<PortHits>() == 32);

/// Key of [`NAT_REV_MAP`]: a translated flow as the pod's replies carry it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NatKey {
    pub pod_addr: [u8; 16],
    pub peer_addr: [u8; 16],
    /// Host byte order.
    pub pod_port: u16,
    pub peer_port: u16,
    pub proto: u8,
    pub _pad: [u8; 3],
}

const _: () = assert!(core::mem::size_of::<NatKey>() == 40);

/// Value of [`NAT_REV_MAP`]: the address and port the client dialled, which replies carry
/// as their source.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatOrig {
    pub addr: [u8; 16],
    /// Host byte order.
    pub port: u16,
    /// `NAT_FLAG_*`.
    pub flags: u16,
    pub _pad: [u8; 4],
}

const _: () = assert!(core::mem::size_of::<NatOrig>() == 24);

/// Key of [`SOCK_REV_MAP`]: a socket and the pod address it was sent to instead.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockKey {
    pub cookie: u64,
    pub pod_addr: [u8; 16],
    /// Host byte order.
    pub pod_port: u16,
    pub _pad: [u8; 6],
}

const _: () = assert!(core::mem::size_of::<SockKey>() == 32);

/// Value of [`SOCK_REV_MAP`]: what the socket had asked for.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockOrig {
    pub addr: [u8; 16],
    /// Host byte order.
    pub port: u16,
    pub _pad: [u8; 6],
}

const _: () = assert!(core::mem::size_of::<SockOrig>() == 24);

/// Value of [`PACING_MAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pacing {
    /// `SO_MAX_PACING_RATE` for the pod's TCP sockets, bytes per second (the socket option
    /// takes 32 bits: at most 4 GB/s).
    pub rate_bytes: u32,
    /// The pod's host veth ifindex when its limits have `unshapedSubnets`/`shapedSubnets`
    /// (a socket whose peer they exempt is not paced), else 0. Releases before them had
    /// padding here, always 0.
    pub shape_ifindex: u32,
    /// The attachment it belongs to (DEL finds the entry by it, without the pod's netns).
    pub attachment_id: u64,
}

const _: () = assert!(core::mem::size_of::<Pacing>() == 16);

/// The data of a [`SOURCES_MAP`] key (after the LPM prefix length): a pod's host veth, the
/// address family and the address. The prefix length counts the 64 bits of `ifindex` and
/// `family` first, then the address's own prefix: a pod's catch-all matches `ifindex`
/// alone ([`SOURCE_POD_BITS`]), an IPv4 /24 is `64 + 24` bits. With the family in the key,
/// an IPv6 prefix never covers an IPv4 source.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SourceKey {
    /// Compared bit by bit, like the address: the bytes as they lie in memory.
    pub ifindex: u32,
    /// [`SOURCE_FAMILY_V4`] or [`SOURCE_FAMILY_V6`]; 0 in a catch-all.
    pub family: u32,
    /// IPv6, or IPv4 in the first 4 bytes (the rest zero), network byte order.
    pub addr: [u8; 16],
}

const _: () = assert!(core::mem::size_of::<SourceKey>() == 24);

/// [`SourceKey::family`].
pub const SOURCE_FAMILY_V4: u32 = 4;
pub const SOURCE_FAMILY_V6: u32 = 6;
/// Prefix length of a pod's catch-all: its ifindex alone.
pub const SOURCE_POD_BITS: u32 = 32;
/// Prefix bits of a [`SourceKey`] before the address.
pub const SOURCE_HEAD_BITS: u32 = 64;

/// Value of [`SOURCES_MAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceRule {
    /// The attachment that installed it (DEL and GC find a pod's entries by it).
    pub attachment_id: u64,
    /// The pod interface's MAC: frames from the pod must carry it as their source.
    pub mac: [u8; 6],
    /// [`SOURCE_PASS`], [`SOURCE_PASS_MASQ`] or [`SOURCE_REFUSE`]; the programs refuse any
    /// other.
    pub verdict: u16,
}

const _: () = assert!(core::mem::size_of::<SourceRule>() == 16);

/// [`SourceRule::verdict`]: the pod may send from this address or prefix.
pub const SOURCE_PASS: u16 = 1;
/// The pod may send from this address, its own, and it masquerades (`ipMasq`, its
/// endpoints carry [`EP_FLAG_MASQ`]): the programs take masquerade's decision from the
/// rule the source check found, with no second lookup of the source's endpoint. Only a
/// pod's own addresses (/32, /128) carry it, only where the pod masquerades; an extra
/// prefix, and the own address of a pod that does not masquerade, are [`SOURCE_PASS`],
/// as every entry of a release before this verdict is: the programs then look the
/// endpoint up. Programs of such a release would refuse it; they never read it (each
/// pod's entries are written by the release whose programs its host veth holds).
pub const SOURCE_PASS_MASQ: u16 = 3;
/// A pod's catch-all: any other source is dropped (IPv6 link-local and the unspecified
/// addresses excepted where their protocols need them).
pub const SOURCE_REFUSE: u16 = 2;

/// Value of [`CONFIG_MAP`]: node-wide settings the programs read.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeConfig {
    /// Cookie of the node's network namespace: the socket programs, attached machine-wide,
    /// act only on sockets of this namespace.
    pub netns_cookie: u64,
    /// `NODE_FLAG_*`.
    pub flags: u32,
    /// The masquerade port range (0, 0: [`MASQ_PORT_MIN`]..=[`MASQ_PORT_MAX`]).
    pub masq_port_min: u16,
    pub masq_port_max: u16,
}

const _: () = assert!(core::mem::size_of::<NodeConfig>() == 16);

/// Value of [`NS_PROBE_MAP`]. The plugin arms a probe by writing the socket cookie of a UDP
/// socket it opened in the node's namespace and a random destination; when that socket
/// connects to that destination, `ecni_connect4` writes the socket's network namespace
/// cookie, disarms the probe (`sock_cookie` 0) and refuses the connection. Only a holder of
/// the map (root) can arm it, and only a socket with both the armed cookie and the random
/// destination is recorded.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NsProbe {
    /// The armed socket's cookie; 0: no probe armed.
    pub sock_cookie: u64,
    /// Written by the program: the armed socket's network namespace cookie.
    pub netns_cookie: u64,
    /// The probe's destination address, as `bpf_sock_addr.user_ip4` holds it (network order
    /// bytes).
    pub addr_be: [u8; 4],
    /// The probe's destination port, host byte order.
    pub port: u16,
    pub _pad: u16,
    pub _spare: u64,
}

const _: () = assert!(core::mem::size_of::<NsProbe>() == 32);

/// Key of [`MASQ_FWD_MAP`] and [`MASQ_REV_MAP`]: one end of a flow (the pod's, or the
/// node's after translation) and the remote end.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MasqKey {
    pub local: [u8; 16],
    pub remote: [u8; 16],
    /// Host byte order; ICMP echo: the identifier, and 0 for the remote.
    pub local_port: u16,
    pub remote_port: u16,
    pub proto: u8,
    pub _pad: [u8; 3],
}

const _: () = assert!(core::mem::size_of::<MasqKey>() == 40);

/// Value of [`MASQ_FWD_MAP`] and [`MASQ_REV_MAP`]: the other side of the translation, and
/// what each direction last saw.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MasqFlow {
    pub addr: [u8; 16],
    /// Host byte order.
    pub port: u16,
    /// `MASQ_FIN_OUT`, `MASQ_FIN_IN`, `MASQ_RST`, `MASQ_REPLIED`, `MASQ_INBOUND`,
    /// `MASQ_TS_LAST`.
    pub state: u16,
    /// TCP: added to the timestamp value of each segment the pod sends in the flow, and
    /// taken from the echoed value of each segment it gets (the same in both entries; 0
    /// for most flows). See [`MASQ_TS_LAST`].
    pub ts_shift: u32,
    /// `bpf_ktime_get_ns` of the last packet this direction translated (updated at most
    /// once a second, or when the state changes).
    pub last_ns: u64,
    /// Node-side entry only: the timestamp value the pod's last closing segment carried
    /// as the remote end saw it (valid with `MASQ_TS_LAST`).
    pub ts_last: u32,
    pub _pad: u32,
}

const _: () = assert!(core::mem::size_of::<MasqFlow>() == 40);

/// Key of [`MASQ_FRAG_MAP`]: an IPv4 datagram as its fragments carry it, before their
/// translation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MasqFragKey {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    /// The IPv4 header's identification, network byte order.
    pub id: [u8; 2],
    pub proto: u8,
    /// [`MASQ_FRAG_OUT`] or [`MASQ_FRAG_IN`].
    pub dir: u8,
}

const _: () = assert!(core::mem::size_of::<MasqFragKey>() == 12);

/// Value of [`MASQ_FRAG_MAP`]: the address the datagram's fragments take (the node's,
/// leaving; the pod's, arriving), and when its first fragment was translated.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MasqFrag {
    pub addr: [u8; 4],
    pub _pad: [u8; 4],
    /// `bpf_ktime_get_ns` of the first fragment.
    pub at_ns: u64,
}

const _: () = assert!(core::mem::size_of::<MasqFrag>() == 16);

/// Key of [`MASQ_FRAG6_MAP`]: an IPv6 datagram as its fragments carry it, before their
/// translation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MasqFrag6Key {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    /// The fragment header's identification, network byte order.
    pub id: [u8; 4],
    /// The fragment header's next header (the transport protocol).
    pub proto: u8,
    /// [`MASQ_FRAG_OUT`] or [`MASQ_FRAG_IN`].
    pub dir: u8,
    pub _pad: [u8; 2],
}

const _: () = assert!(core::mem::size_of::<MasqFrag6Key>() == 40);

/// Value of [`MASQ_FRAG6_MAP`]: the address the datagram's fragments take, and when its
/// first fragment was translated.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MasqFrag6 {
    pub addr: [u8; 16],
    /// `bpf_ktime_get_ns` of the first fragment.
    pub at_ns: u64,
}

const _: () = assert!(core::mem::size_of::<MasqFrag6>() == 24);

/// Key of [`NAT_FRAG_MAP`]: a datagram as its fragments carry it, before their
/// translation. Masquerade's IPv6 record layout, with a direction of its own
/// ([`NAT_FRAG_IN`], [`NAT_FRAG_OUT`]) and IPv4 addresses mapped into IPv6.
pub type NatFragKey = MasqFrag6Key;
/// Value of [`NAT_FRAG_MAP`]: the address the datagram's fragments take, and when its first
/// fragment was translated.
pub type NatFrag = MasqFrag6;

/// Value of [`MASQ_STATS_MAP`] (per CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MasqStats {
    /// Packets translated leaving (to the node's address) and returning (to the pod's).
    pub out_packets: u64,
    pub in_packets: u64,
    /// Flows given a port.
    pub flows: u64,
    /// Idle flows whose port a new flow took.
    pub reclaimed: u64,
    /// New flows dropped: every probed port was taken (towards one destination).
    pub exhausted: u64,
    /// New flows dropped: the table was full.
    pub table_full: u64,
    /// Packets to masquerade that could not be (no source address, fragments, IP options,
    /// protocols other than TCP, UDP and ICMP echo, a helper failing): dropped.
    pub untranslatable: u64,
    pub _spare: u64,
}

const _: () = assert!(core::mem::size_of::<MasqStats>() == 64);

/// One decision of a program while `ebpf-cni trace` runs (a record of [`TRACE_RING_MAP`]):
/// which decision (`what`, one of the `NOTE_*` below) and its figures; user space writes
/// the line. The programs log nothing themselves: a log call's formatting code is walked by
/// the verifier on every path to it, which made `ecni_from_pod` a quarter more work to load.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceNote {
    /// A helper's answer (`NOTE_REDIRECT_PEER`: `bpf_redirect_peer`'s, `NOTE_FIB`: the FIB
    /// lookup's), else 0.
    pub rc: i64,
    pub what: u32,
    /// The device the program runs on.
    pub ifindex: u32,
    /// `NOTE_REDIRECT_PEER`: the destination pod's host veth; `NOTE_FIB`: the egress
    /// device the FIB chose; else 0.
    pub target: u32,
    pub _pad: u32,
}

const _: () = assert!(core::mem::size_of::<TraceNote>() == 24);

/// [`TraceNote::what`]: redirected into the pod behind host veth `target`.
pub const NOTE_REDIRECT_PEER: u32 = 1;
/// [`TraceNote::what`]: dropped, the pod sent from an address not its own.
pub const NOTE_SOURCE_DROPPED: u32 = 2;
/// [`TraceNote::what`]: dropped, the pod sent from a MAC not its own.
pub const NOTE_MAC_DROPPED: u32 = 3;
/// [`TraceNote::what`]: what the pod sent goes on to the stack.
pub const NOTE_TO_STACK: u32 = 4;
/// [`TraceNote::what`]: the pod's ARP request for its gateway answered.
pub const NOTE_ARP_ANSWERED: u32 = 5;
/// [`TraceNote::what`]: the FIB's answer `rc` for a packet of the pod, egress `target`.
pub const NOTE_FIB: u32 = 6;
/// [`TraceNote::what`]: what the pod sent belongs to a Service flow and goes to the stack.
pub const NOTE_SERVICES: u32 = 7;

/// `aya::Pod` for the map types, so user space reads and writes them as plain bytes.
macro_rules! plain_old_data {
    ($($t:ty),* $(,)?) => {
        $(
            // SAFETY: `repr(C)`, integer and byte-array fields only, no implicit padding
            // (sizes asserted above), so every bit pattern is a valid value.
            #[cfg(feature = "user")]
            unsafe impl aya::Pod for $t {}
        )*
    };
}

plain_old_data!(
    EndpointKey,
    EndpointInfo,
    DirCounters,
    PodCounters,
    RateLimit,
    ShapeSubnetKey,
    PortKey,
    PortTarget,
    PortHits,
    NatKey,
    NatOrig,
    SockKey,
    SockOrig,
    NodeConfig,
    NsProbe,
    Pacing,
    MasqKey,
    MasqFlow,
    MasqFragKey,
    MasqFrag,
    MasqStats,
    SourceKey,
    SourceRule,
    TraceNote,
    ServicesFlowKey,
    ServicesFlow,
    ServicesStats,
);

/// The kernel keeps 15 bytes of an object name (`BPF_OBJ_NAME_LEN` is 16 with the NUL); a
/// longer name would show up cut in bpftool and in the program info that CHECK compares.
const fn fits_bpf_obj_name(name: &str) -> bool {
    name.len() <= 15
}

const _: () = assert!(fits_bpf_obj_name(ENDPOINTS_MAP));
const _: () = assert!(fits_bpf_obj_name(POD_COUNTERS_MAP));
const _: () = assert!(fits_bpf_obj_name(TRACE_MAP));
const _: () = assert!(fits_bpf_obj_name(TRACE_RING_MAP));
const _: () = assert!(fits_bpf_obj_name(RATE_LIMITS_MAP));
const _: () = assert!(fits_bpf_obj_name(PROG_FROM_POD));
const _: () = assert!(fits_bpf_obj_name(PROG_TO_POD));
const _: () = assert!(fits_bpf_obj_name(PROG_FROM_DEV));
const _: () = assert!(fits_bpf_obj_name(PROG_XDP_DEV));
const _: () = assert!(fits_bpf_obj_name(PROG_FLOOR_POD));
const _: () = assert!(fits_bpf_obj_name(PROG_FLOOR_NETKIT));
const _: () = assert!(fits_bpf_obj_name(PROG_FROM_CHAIN));
const _: () = assert!(fits_bpf_obj_name(PORTMAP_MAP));
const _: () = assert!(fits_bpf_obj_name(PORTMAP_HITS_MAP));
const _: () = assert!(fits_bpf_obj_name(NAT_REV_MAP));
const _: () = assert!(fits_bpf_obj_name(SOCK_REV_MAP));
const _: () = assert!(fits_bpf_obj_name(NODE_ADDRS_MAP));
const _: () = assert!(fits_bpf_obj_name(CONFIG_MAP));
const _: () = assert!(fits_bpf_obj_name(PACING_MAP));
const _: () = assert!(fits_bpf_obj_name(NS_PROBE_MAP));
const _: () = assert!(fits_bpf_obj_name(PROG_SOCKOPS));
const _: () = assert!(fits_bpf_obj_name(MASQ_FWD_MAP));
const _: () = assert!(fits_bpf_obj_name(MASQ_REV_MAP));
const _: () = assert!(fits_bpf_obj_name(MASQ_SKIP_MAP));
const _: () = assert!(fits_bpf_obj_name(SHAPE_SUBNETS_MAP));
const _: () = assert!(fits_bpf_obj_name(MASQ_SRC_MAP));
const _: () = assert!(fits_bpf_obj_name(MASQ_STATS_MAP));
const _: () = assert!(fits_bpf_obj_name(MASQ_FRAG_MAP));
const _: () = assert!(fits_bpf_obj_name(MASQ_FRAG6_MAP));
const _: () = assert!(fits_bpf_obj_name(NAT_FRAG_MAP));
const _: () = assert!(fits_bpf_obj_name(SOURCES_MAP));
const _: () = assert!(fits_bpf_obj_name(SERVICES_NETS_MAP));
const _: () = assert!(fits_bpf_obj_name(SERVICES_FLOWS_MAP));
const _: () = assert!(fits_bpf_obj_name(SERVICES_STATS_MAP));
const _: () = assert!(fits_bpf_obj_name(ATTACHMENT_PORTS_MAP));
const _: () = assert!(fits_bpf_obj_name(PROG_CONNECT4));
const _: () = assert!(fits_bpf_obj_name(PROG_CONNECT6));
const _: () = assert!(fits_bpf_obj_name(PROG_SENDMSG4));
const _: () = assert!(fits_bpf_obj_name(PROG_SENDMSG6));
const _: () = assert!(fits_bpf_obj_name(PROG_RECVMSG4));
const _: () = assert!(fits_bpf_obj_name(PROG_RECVMSG6));
const _: () = assert!(fits_bpf_obj_name(PROG_PEERNAME4));
const _: () = assert!(fits_bpf_obj_name(PROG_PEERNAME6));

/// `a == b` usable in constants, so the kernel-side crate can assert at compile time that the
/// identifiers it declares (which become the object names) match the names above.
pub const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}
