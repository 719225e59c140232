//! The source check: the addresses and the MAC each pod may send from.

use crate::endpoints::MAX_ENDPOINTS;

/// Node-wide LPM trie of the source addresses each pod may send from (the source check):
/// an LPM key of [`SourceKey`] (prefix length counting its 64 head bits) → [`SourceRule`].
/// Per checked pod: one entry per own address (/32, /128) and per extra prefix, all
/// [`SOURCE_PASS`], and a catch-all of the pod's ifindex alone ([`SOURCE_POD_BITS`],
/// [`SOURCE_REFUSE`]) for every other source. A pod without entries is not checked: its
/// check is off (`sourceCheck: false`), or a release before the check attached it. One
/// lookup per frame answers both the address and the MAC.
pub const SOURCES_MAP: &str = "ECNI_SOURCES";

/// Capacity of [`SOURCES_MAP`]: every pod address, a catch-all per pod and room for extra
/// prefixes (an LPM trie allocates entry by entry).
pub const MAX_SOURCES: u32 = 4 * MAX_ENDPOINTS;

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
/// The pod may send from this address, its own, and it masquerades (`ipMasq`, its endpoints
/// carry [`EP_FLAG_MASQ`](crate::EP_FLAG_MASQ)): the programs take masquerade's decision
/// from the rule the source check found, with no second lookup of the source's endpoint.
/// Only a pod's own addresses (/32, /128) carry it, only where the pod masquerades; an
/// extra prefix, and the own address of a pod that does not masquerade, are
/// [`SOURCE_PASS`], as every entry of a release before this verdict is: the programs then
/// look the endpoint up. Programs of such a release would refuse it; they never read it
/// (each pod's entries are written by the release whose programs its host veth holds).
pub const SOURCE_PASS_MASQ: u16 = 3;
/// A pod's catch-all: any other source is dropped (IPv6 link-local and the unspecified
/// addresses excepted where their protocols need them).
pub const SOURCE_REFUSE: u16 = 2;

plain_old_data!(SourceKey, SourceRule);

const _: () = assert!(crate::names::fits_bpf_obj_name(SOURCES_MAP));
