//! Allocate, release, check and garbage-collect leases of one network, and say how full
//! its ranges are.
//!
//! Each call holds the network's lock for its whole transaction: an allocation checks for
//! a duplicate, picks and reserves one address per range set, and on any failure removes
//! what it reserved before the lock is dropped, so no process ever sees a partial lease.
//! (The reference takes the lock once per range set; holding it across all sets is
//! stricter and still compatible.)

use std::net::IpAddr;

use super::config::HostLocalConfig;
use super::dns::read_resolv_conf;
use super::error::IpamError;
use super::range::{canonical_ip, to_u128, RangeSet};
use super::store::{create_dir, network_dir, sort_key, LockedStore};
use super::{IpamIp, IpamRequest, IpamResult};

/// Reserves one address in every range set for `(container_id, ifname)`.
pub fn allocate(conf: &HostLocalConfig, req: &IpamRequest) -> Result<IpamResult, IpamError> {
    let wanted = requested_per_set(&conf.range_sets, req.requested)?;
    // Read before reserving anything, so a bad file cannot leave a lease behind.
    let dns = conf
        .resolv_conf
        .as_deref()
        .map(read_resolv_conf)
        .transpose()?;

    let dir = network_dir(&conf.data_dir, req.network)?;
    create_dir(&dir)?;
    let store = LockedStore::lock(&dir, conf.lock_timeout)?;
    let held = if req.fresh {
        Vec::new()
    } else {
        store.owned_by(req.container_id, req.ifname)?
    };

    let mut ips = Vec::with_capacity(conf.range_sets.len());
    for (idx, set) in conf.range_sets.iter().enumerate() {
        match allocate_in_set(&store, idx, set, wanted[idx], &held, req) {
            Ok(ip) => ips.push(ip),
            Err(e) => {
                for done in &ips {
                    if let Err(undo) = store.release_ip(done.address.ip()) {
                        log::warn!("rolling back {}: {undo}", done.address.ip());
                    }
                }
                return Err(e);
            }
        }
    }
    Ok(IpamResult {
        ips,
        routes: conf.routes.clone(),
        dns,
    })
}

fn allocate_in_set(
    store: &LockedStore,
    idx: usize,
    set: &RangeSet,
    wanted: Option<IpAddr>,
    held: &[IpAddr],
    req: &IpamRequest,
) -> Result<IpamIp, IpamError> {
    if let Some(&ip) = held.iter().find(|&&ip| set.contains(ip)) {
        return Err(IpamError::DuplicateAllocation {
            container_id: req.container_id.into(),
            ifname: req.ifname.into(),
            ip,
            set: set.source.clone(),
        });
    }

    if let Some(ip) = wanted {
        let range = set
            .range_for(ip)
            .expect("requested_per_set only assigns addresses inside the set");
        if set.is_gateway(ip) {
            return Err(IpamError::RequestedIsGateway {
                ip,
                set: set.source.clone(),
            });
        }
        if !store.reserve(ip, req.container_id, req.ifname, idx)? {
            return Err(IpamError::RequestedTaken {
                ip,
                set: set.source.clone(),
            });
        }
        return Ok(IpamIp {
            address: range.address(ip),
            gateway: Some(range.gateway),
        });
    }

    for (ip, range) in set.iter_from(store.last_reserved(idx)) {
        if store.reserve(ip, req.container_id, req.ifname, idx)? {
            return Ok(IpamIp {
                address: range.address(ip),
                gateway: Some(range.gateway),
            });
        }
    }
    Err(IpamError::Exhausted {
        set: set.source.clone(),
        ranges: set.to_string(),
    })
}

/// Which requested address goes to which range set. Every requested address must fall in
/// some set, and at most one per set (the reference fails the same requests, only later).
fn requested_per_set(
    sets: &[RangeSet],
    requested: &[IpAddr],
) -> Result<Vec<Option<IpAddr>>, IpamError> {
    let mut wanted: Vec<Option<IpAddr>> = vec![None; sets.len()];
    for ip in requested.iter().copied().map(canonical_ip) {
        let idx = sets
            .iter()
            .position(|s| s.contains(ip))
            .ok_or(IpamError::RequestedOutsideRanges { ip })?;
        match wanted[idx] {
            Some(first) if first != ip => {
                return Err(IpamError::RequestedSameSet {
                    first,
                    second: ip,
                    set: sets[idx].source.clone(),
                });
            }
            _ => wanted[idx] = Some(ip),
        }
    }
    Ok(wanted)
}

/// Releases every address of `(container_id, ifname)` in the network, whatever range it
/// is in; succeeds when there is none (DEL is idempotent).
pub fn release(
    conf: &HostLocalConfig,
    network: &str,
    container_id: &str,
    ifname: &str,
) -> Result<(), IpamError> {
    let Some(store) = open_existing(conf, network)? else {
        return Ok(());
    };
    let released = store.release_owner(container_id, ifname)?;
    log::debug!("released {released:?} of {container_id}/{ifname} in {network}");
    Ok(())
}

/// The addresses reserved for `(container_id, ifname)` (CHECK); an error when none.
pub fn reserved(
    conf: &HostLocalConfig,
    network: &str,
    container_id: &str,
    ifname: &str,
) -> Result<Vec<IpAddr>, IpamError> {
    let ips = match open_existing(conf, network)? {
        Some(store) => store.owned_by(container_id, ifname)?,
        None => Vec::new(),
    };
    if ips.is_empty() {
        return Err(IpamError::NotReserved {
            container_id: container_id.into(),
            ifname: ifname.into(),
            network: network.into(),
        });
    }
    Ok(ips)
}

/// Releases every lease of the network whose attachment is not in `valid` (CNI 1.1 GC)
/// and returns the released addresses. An old-format lease (container ID only) stays
/// when any valid attachment has that container ID.
pub fn gc(
    conf: &HostLocalConfig,
    network: &str,
    valid: &[(String, String)],
) -> Result<Vec<IpAddr>, IpamError> {
    let Some(store) = open_existing(conf, network)? else {
        return Ok(Vec::new());
    };
    let leases = store.leases()?;
    let stale = leases.iter().filter(|lease| {
        let (id, ifname) = lease.owner();
        !valid
            .iter()
            .any(|(vid, vif)| vid.trim() == id && ifname.is_none_or(|i| i == vif))
    });
    let mut released = store.remove_all(stale)?;
    released.sort_by_key(|ip| sort_key(*ip));
    Ok(released)
}

/// The attachments holding leases in the network, each once: `(container id, ifname)` of
/// every current-format lease (GC's inventory; old-format leases name no interface and
/// are left to [`gc`]).
pub fn holders(conf: &HostLocalConfig, network: &str) -> Result<Vec<(String, String)>, IpamError> {
    let Some(store) = open_existing(conf, network)? else {
        return Ok(Vec::new());
    };
    let mut out: Vec<(String, String)> = store
        .leases()?
        .iter()
        .filter_map(|l| match l.owner() {
            (id, Some(ifname)) => Some((id.to_owned(), ifname.to_owned())),
            (_, None) => None,
        })
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

/// How full one range set is (STATUS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetUsage {
    /// Where the set came from in the config, e.g. `ipam.ranges[0]`.
    pub set: String,
    /// Its ranges with their subnets, e.g. `10.9.0.0/29 range 10.9.0.1-10.9.0.6`.
    pub ranges: String,
    /// Addresses the walk can hand out: every address of the ranges but the gateways.
    pub capacity: u128,
    pub leased: u128,
}

impl SetUsage {
    pub fn free(&self) -> u128 {
        self.capacity.saturating_sub(self.leased)
    }
}

/// How many addresses of each range set are leased, in the config's set order. An ADD
/// needs one free address in every set.
pub fn usage(conf: &HostLocalConfig, network: &str) -> Result<Vec<SetUsage>, IpamError> {
    let leased: Vec<IpAddr> = match open_existing(conf, network)? {
        Some(store) => store.leased()?,
        None => Vec::new(),
    };
    Ok(conf
        .range_sets
        .iter()
        .map(|set| {
            let size: u128 = set
                .ranges
                .iter()
                .map(|r| (to_u128(r.range_end) - to_u128(r.range_start)).saturating_add(1))
                .fold(0, u128::saturating_add);
            let mut gateways: Vec<IpAddr> = set
                .ranges
                .iter()
                .map(|r| r.gateway)
                .filter(|g| set.contains(*g))
                .collect();
            gateways.sort_by_key(|ip| sort_key(*ip));
            gateways.dedup();
            SetUsage {
                set: set.source.clone(),
                ranges: set
                    .ranges
                    .iter()
                    .map(|r| format!("{} range {}-{}", r.subnet, r.range_start, r.range_end))
                    .collect::<Vec<_>>()
                    .join(", "),
                capacity: size.saturating_sub(gateways.len() as u128),
                leased: leased
                    .iter()
                    .filter(|ip| set.contains(**ip) && !set.is_gateway(**ip))
                    .count() as u128,
            }
        })
        .collect())
}

/// The locked store of an existing network directory; `None` when nothing was ever
/// allocated there (so DEL, CHECK and GC do not create directories).
pub(super) fn open_existing(
    conf: &HostLocalConfig,
    network: &str,
) -> Result<Option<LockedStore>, IpamError> {
    let dir = network_dir(&conf.data_dir, network)?;
    if !dir.is_dir() {
        return Ok(None);
    }
    LockedStore::lock(&dir, conf.lock_timeout).map(Some)
}
