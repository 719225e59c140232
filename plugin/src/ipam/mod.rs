//! Built-in host-local IPAM: hands out addresses from configured ranges and records them
//! in the reference host-local plugin's on-disk format.
//!
//! Our plugin and the reference `host-local` binary can allocate from one data directory
//! at the same time: both take the same flock on `<dataDir>/<network>/lock`, write one
//! file per address with the same bytes, and continue each other's round robin through
//! `last_reserved_ip.<N>`. `config` parses and validates the `ipam` object, `range` walks
//! the ranges, `store` owns the files, and `allocator` ties them into the operations the
//! CNI commands call (ADD: [`allocate`], DEL: [`release`], CHECK: [`reserved`], GC: [`gc`]
//! and [`holders`], STATUS: [`usage`]); `boot` finds the leases a reboot left behind.

mod allocator;
pub mod backend;
pub mod boot;
mod config;
pub mod delegate;
mod dns;
mod error;
mod range;
mod store;

#[cfg(test)]
mod tests;

use std::net::IpAddr;

use ipnetwork::IpNetwork;

pub use allocator::{allocate, gc, holders, release, reserved, usage, SetUsage};
pub use config::HostLocalConfig;
pub use dns::IpamDns;
pub use error::IpamError;
pub use store::OwnLease;

/// One attachment asking for addresses.
#[derive(Debug, Clone, Copy)]
pub struct IpamRequest<'a> {
    /// The network name; already validated against the spec's name pattern.
    pub network: &'a str,
    pub container_id: &'a str,
    pub ifname: &'a str,
    /// Specific addresses wanted (union of CNI_ARGS `IP=`, `args.cni.ips` and
    /// runtimeConfig `ips`): at most one per range set; sets without one get the next free
    /// address.
    pub requested: &'a [IpAddr],
    /// The caller proved the attachment is new (ADD found no host veth of it), so the
    /// leases are not scanned for one it already holds: that scan reads every lease file,
    /// which would make ADD grow with the number of pods. A lease left by an interrupted ADD
    /// is released with the attachment's others by DEL (which releases by owner).
    pub fresh: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpamIp {
    /// The address with its subnet's prefix length.
    pub address: IpNetwork,
    pub gateway: Option<IpAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpamRoute {
    pub dst: IpNetwork,
    pub gw: Option<IpAddr>,
    pub options: crate::cni::types::RouteOptions,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpamResult {
    /// One per range set, in the config's range set order.
    pub ips: Vec<IpamIp>,
    pub routes: Vec<IpamRoute>,
    /// Present when `resolvConf` is configured.
    pub dns: Option<IpamDns>,
}
