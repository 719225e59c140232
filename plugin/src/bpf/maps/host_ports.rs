//! Host port mappings in the dataplane: the node-wide mapping map and its hit counters, the
//! node's addresses (which wildcard mappings answer on), and the per-attachment list of
//! what an attachment installed (pinned in its directory, so DEL needs no input to remove
//! it). The socket-address programs that serve the node's own sockets are attached by
//! `cgroup.rs`.

use std::{fs, net::IpAddr, os::fd::AsFd, path::Path};

use aya::maps::{Array, HashMap, Map, MapData, PerCpuHashMap, PerCpuValues};
use ebpf_cni_maps::{
    EndpointKey, NodeConfig, PortHits, PortKey, PortTarget, ATTACHMENT_PORTS_MAP, CONFIG_MAP,
    NODE_ADDRS_MAP, NODE_FLAG_PORTMAP, PORTMAP_HITS_MAP, PORTMAP_MAP,
};

use super::{endpoint_key, is_not_found, key_ip, open_map_err, open_pinned};
use crate::bpf::{
    pin::{walk, NodeId, PinRoot},
    sys, BpfError,
};
use crate::host_ports::{PortEntry, Protocol};

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
        flags: if e.loopback {
            0
        } else {
            ebpf_cni_maps::PORT_FLAG_NO_LOOPBACK
        },
        _pad: 0,
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

pub(in crate::bpf) fn update_err(
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

/// A mapping [`PortMaps::remove`] took out.
#[derive(Debug, Clone)]
pub struct RemovedMapping {
    pub key: PortKey,
    pub target: PortTarget,
    /// Connections and datagrams of the node's own processes the socket programs sent
    /// through it (its `socket` hits, summed over CPUs): with none, no socket of the node
    /// can be connected to the pod through it.
    pub node_sockets: u64,
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

    /// The maps in `slot`, opened there first if they are not yet.
    pub fn opened<'s>(
        slot: &'s mut Option<Self>,
        root: &PinRoot,
        node: &NodeId,
    ) -> Result<&'s mut Self, BpfError> {
        if slot.is_none() {
            *slot = Some(Self::open(root, node)?);
        }
        Ok(slot.as_mut().expect("opened above"))
    }

    /// Refuses a host port another live attachment holds. An entry whose host veth is gone
    /// is stale (its DEL never came) and may be replaced.
    pub fn ensure_free(&self, attachment_id: u64, entries: &[PortEntry]) -> Result<(), BpfError> {
        for e in entries {
            let key = port_key(e);
            if let Ok(t) = self.mappings.get(&key, 0) {
                if t.attachment_id != attachment_id
                    && crate::netlink::ifname::name_of(t.host_ifindex).is_some()
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
    /// have taken over a stale one) and returns them. Missing entries are fine.
    pub fn remove(
        &mut self,
        attachment_id: u64,
        keys: &[PortKey],
    ) -> Result<Vec<RemovedMapping>, BpfError> {
        let mut removed = Vec::new();
        for key in keys {
            let target = match self.mappings.get(key, 0) {
                Ok(t) if t.attachment_id == attachment_id => t,
                _ => continue,
            };
            match self.mappings.remove(key) {
                Err(e) if !is_not_found(&e) => {
                    return Err(update_err(PORTMAP_MAP, describe_key(key))(e))
                }
                _ => {}
            }
            // Read once the mapping is gone, so no socket program translates through it
            // any more (one already running on another CPU may still count after this).
            let node_sockets = self.hits.get(key, 0).map_or(0, |per_cpu| {
                per_cpu
                    .iter()
                    .fold(0u64, |sum, h| sum.wrapping_add(h.socket))
            });
            removed.push(RemovedMapping {
                key: *key,
                target,
                node_sockets,
            });
            match self.hits.remove(key) {
                Err(e) if !is_not_found(&e) => {
                    return Err(update_err(PORTMAP_HITS_MAP, describe_key(key))(e))
                }
                _ => {}
            }
        }
        Ok(removed)
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

    /// Turns the programs' port-mapping lookups off again (the node's last mapping went);
    /// the netns cookie stays for the next mapping.
    pub fn disable(&mut self) -> Result<(), BpfError> {
        let have = self.config.get(&0, 0).unwrap_or_default();
        if have.flags & NODE_FLAG_PORTMAP == 0 {
            return Ok(());
        }
        let want = NodeConfig {
            flags: have.flags & !NODE_FLAG_PORTMAP,
            ..have
        };
        self.config
            .set(0, want, 0)
            .map_err(update_err(CONFIG_MAP, "disable port mappings".to_owned()))
    }

    /// Whether the node has any host port mapping.
    pub fn any_mapping(&self) -> bool {
        self.mappings.keys().next().is_some()
    }

    /// The node's netns cookie as the socket programs have it (0: none yet, e.g. a node whose
    /// mappings an older build installed on a kernel without `SO_NETNS_COOKIE`, which
    /// attached no socket programs).
    pub fn netns_cookie(&self) -> u64 {
        self.node_config().netns_cookie
    }

    /// The node's switches (zero where the map cannot be read): this set holds the node's
    /// config map open, so others read it here rather than open it again.
    pub fn node_config(&self) -> NodeConfig {
        self.config.get(&0, 0).unwrap_or_default()
    }

    pub fn enabled(&self) -> bool {
        self.config.get(&0, 0).is_ok_and(Self::enabled_in)
    }

    /// Whether the node's switches `c` have the port-mapping lookups on.
    pub fn enabled_in(c: NodeConfig) -> bool {
        c.flags & NODE_FLAG_PORTMAP != 0
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
    if fs::symlink_metadata(walk(path)).is_err() {
        return Ok(Vec::new());
    }
    let err = |source| BpfError::OpenMap {
        path: path.to_path_buf(),
        source: Box::new(source),
    };
    let data = MapData::from_pin(walk(path)).map_err(err)?;
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
