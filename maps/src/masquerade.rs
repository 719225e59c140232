//! Masquerade: pods' flows translated to the node's address (the flow tables, fragments,
//! each device's source address, ports and timeouts).

use crate::ip::{IPPROTO_TCP, IPPROTO_UDP};

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
/// lookup cannot tell it (`BPF_FIB_LOOKUP_SRC` is 6.8+): [`masq_src_key`] →
/// [`EndpointKey`](crate::EndpointKey).
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

plain_old_data!(MasqKey, MasqFlow, MasqFragKey, MasqFrag, MasqStats);

const _: () = assert!(crate::names::fits_bpf_obj_name(MASQ_FWD_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(MASQ_REV_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(MASQ_SKIP_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(MASQ_SRC_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(MASQ_STATS_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(MASQ_FRAG_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(MASQ_FRAG6_MAP));
