//! Errors of the built-in host-local IPAM and the CNI code each one maps to.
//!
//! Config errors name the JSON field (as a path like `ipam.ranges[0][1].subnet`) and the
//! value found there, so an operator can fix the file without reading our source.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::cni::error::code;

#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    // --- configuration -------------------------------------------------------------------
    #[error("{field}: expected {expected}, got {value}")]
    WrongType {
        field: String,
        expected: &'static str,
        value: String,
    },

    #[error("{field}: missing")]
    MissingField { field: String },

    #[error("{field} {value:?}: invalid CIDR")]
    InvalidCidr { field: String, value: String },

    #[error("{field} {value:?}: invalid IP address")]
    InvalidIp { field: String, value: String },

    #[error("{field} {value:?}: host bits set, the network address is {network}")]
    HostBitsSet {
        field: String,
        value: String,
        network: IpAddr,
    },

    #[error("{field} {value:?}: too small to allocate from")]
    SubnetTooSmall { field: String, value: String },

    #[error("{field} {value:?}: IPv4-mapped IPv6 subnets are not supported")]
    MappedSubnet { field: String, value: String },

    #[error("{field} {value}: not the same address family as subnet {subnet}")]
    FamilyMismatch {
        field: String,
        value: IpAddr,
        subnet: String,
    },

    #[error("{field} {value}: not inside subnet {subnet}")]
    OutsideSubnet {
        field: String,
        value: IpAddr,
        subnet: String,
    },

    #[error("{field}: rangeStart {start} is after rangeEnd {end}")]
    StartAfterEnd {
        field: String,
        start: IpAddr,
        end: IpAddr,
    },

    #[error("{field}: empty range set")]
    EmptyRangeSet { field: String },

    #[error("{field}: range set mixes IPv4 ({v4}) and IPv6 ({v6})")]
    MixedFamilies {
        field: String,
        v4: String,
        v6: String,
    },

    #[error("{first} ({first_range}) overlaps {second} ({second_range})")]
    RangesOverlap {
        first: String,
        first_range: String,
        second: String,
        second_range: String,
    },

    #[error("ipam: no IP ranges given (need ipam.ranges, ipam.subnet or runtimeConfig.ipRanges)")]
    NoRanges,

    #[error("network name {name:?} cannot be used as a directory name")]
    InvalidNetworkName { name: String },

    // --- allocation ----------------------------------------------------------------------
    #[error("requested IP {ip} is not inside any range of this network")]
    RequestedOutsideRanges { ip: IpAddr },

    #[error("requested IPs {first} and {second} both fall in range set {set}; one address per range set")]
    RequestedSameSet {
        first: IpAddr,
        second: IpAddr,
        set: String,
    },

    #[error("requested IP {ip} is the gateway of range set {set}")]
    RequestedIsGateway { ip: IpAddr, set: String },

    #[error("requested IP {ip} in range set {set} is already reserved")]
    RequestedTaken { ip: IpAddr, set: String },

    #[error(
        "container {container_id:?} interface {ifname:?} already holds {ip} in range set {set}; duplicate allocation is not allowed"
    )]
    DuplicateAllocation {
        container_id: String,
        ifname: String,
        ip: IpAddr,
        set: String,
    },

    #[error("no IP address left in range set {set} ({ranges})")]
    Exhausted { set: String, ranges: String },

    #[error("no IP address reserved for container {container_id:?} interface {ifname:?} in network {network:?}")]
    NotReserved {
        container_id: String,
        ifname: String,
        network: String,
    },

    // --- disk ----------------------------------------------------------------------------
    #[error("failed to {op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("failed to lock {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },

    #[error("lock {path} still held by another process after {waited:?}")]
    LockTimeout { path: PathBuf, waited: Duration },

    #[error("failed to read resolvConf {path}")]
    ResolvConf {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl IpamError {
    /// The CNI error code (`crate::cni::error::code`) for this error.
    pub fn cni_code(&self) -> u32 {
        use IpamError::*;
        match self {
            WrongType { .. }
            | MissingField { .. }
            | InvalidCidr { .. }
            | InvalidIp { .. }
            | HostBitsSet { .. }
            | SubnetTooSmall { .. }
            | MappedSubnet { .. }
            | FamilyMismatch { .. }
            | OutsideSubnet { .. }
            | StartAfterEnd { .. }
            | EmptyRangeSet { .. }
            | MixedFamilies { .. }
            | RangesOverlap { .. }
            | NoRanges
            | InvalidNetworkName { .. } => code::INVALID_CONFIG,
            // The attachment cannot get the address it asked for (or asks a second time).
            RequestedOutsideRanges { .. }
            | RequestedSameSet { .. }
            | RequestedIsGateway { .. }
            | RequestedTaken { .. }
            | DuplicateAllocation { .. } => code::IPAM_UNAVAILABLE,
            Exhausted { .. } => code::IPAM_EXHAUSTED,
            NotReserved { .. } => code::CHECK_FAILED,
            Io { .. } | Lock { .. } | ResolvConf { .. } => code::IO_FAILURE,
            LockTimeout { .. } => code::TRY_AGAIN_LATER,
        }
    }
}
