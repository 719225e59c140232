//! The cluster network's overlay on the node: the tunnel device's index and checksum
//! setting (`ECNI_TUN_CFG`), the peers' pod subnets with their node addresses
//! (`ECNI_TUN_PEERS`) and those node addresses (`ECNI_TUN_NODES`), and what the programs
//! counted, node-wide (`ECNI_TUN_STAT`) and per member node (`ECNI_TUN_PSTAT`). What they
//! should hold is read off the kernel: the tunnel device the agent made and its routes of
//! the cluster's protocol (`crate::cluster::tunnel`), so a node whose maps went with its
//! last pod gets them back at its next ADD. The programs' side is `ebpf/src/tunnel.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aya::maps::{
    lpm_trie::{Key, LpmTrie},
    Array, HashMap, MapData, PerCpuArray, PerCpuHashMap, PerCpuValues,
};
use ebpf_cni_maps::{
    EndpointKey, TunnelConfig, TunnelPeer, TunnelPeerStats, TunnelStats, TUNNEL_CONFIG_MAP,
    TUNNEL_FLAG_UDP_CSUM, TUNNEL_NODES_MAP, TUNNEL_PEERS_MAP, TUNNEL_PEER_STATS_MAP,
    TUNNEL_STATS_MAP,
};
use ipnetwork::IpNetwork;
use serde::Serialize;

use super::{
    maps::{endpoint_key, host_ports::update_err, open_map_err, open_pinned},
    pin::{NodeId, PinRoot},
    BpfError,
};

/// The cluster network's VXLAN device, which the agent creates (`crate::cluster::tunnel`).
pub const TUNNEL_DEVICE: &str = "ecni-vxlan";

/// `rtm_protocol` of the cluster network's routes to peers, whose tunnel peers the
/// programs' maps follow (`ip route show proto 236`): no other writer
/// (iproute2's `rt_protos` stops at 192 for the well-known ones, bird 12, zebra 11) uses it.
pub const ROUTE_PROTOCOL: u8 = 236;

/// The gateway of an IPv6 peer route through the tunnel: an IPv6 route cannot go via an
/// IPv4 address, so the peer's IPv4 node address is written as the link-local
/// `fe80::<node>` (`fe80::a0f:302` for 10.15.3.2), which the device, holding no link-local
/// address and resolving no neighbour, never answers for.
pub fn v6_gateway(node: Ipv4Addr) -> Ipv6Addr {
    let [a, b, c, d] = node.octets();
    Ipv6Addr::new(
        0xfe80,
        0,
        0,
        0,
        0,
        0,
        u16::from_be_bytes([a, b]),
        u16::from_be_bytes([c, d]),
    )
}

/// The peer node a tunnel route's gateway names: an IPv4 one, [`v6_gateway`]'s form of
/// one, or an IPv6 underlay's address (any other IPv6 address but a link-local one).
pub fn node_of(gw: IpAddr) -> Option<IpAddr> {
    match gw {
        IpAddr::V4(a) => Some(IpAddr::V4(a)),
        IpAddr::V6(a) => {
            let s = a.segments();
            if s[..6] == [0xfe80, 0, 0, 0, 0, 0] {
                let [a, b] = s[6].to_be_bytes();
                let [c, d] = s[7].to_be_bytes();
                Some(IpAddr::V4(Ipv4Addr::new(a, b, c, d)))
            } else if s[0] & 0xffc0 == 0xfe80 {
                None
            } else {
                Some(IpAddr::V6(a))
            }
        }
    }
}

/// The VXLAN network identifier the programs put in every packet's tunnel key.
pub const TUNNEL_VNI: u32 = 1;

/// What the node's tunnel should be, read off the kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TunnelView {
    pub ifindex: u32,
    pub name: String,
    pub udp_csum: bool,
    /// Each peer pod subnet behind the tunnel with its node's address.
    pub peers: Vec<(IpNetwork, IpAddr)>,
}

impl TunnelView {
    fn config(&self) -> TunnelConfig {
        TunnelConfig {
            ifindex: self.ifindex,
            vni: TUNNEL_VNI,
            flags: if self.udp_csum {
                TUNNEL_FLAG_UDP_CSUM
            } else {
                0
            },
            _pad: 0,
        }
    }

    fn entries(&self) -> BTreeMap<(u32, [u8; 16]), [u8; 16]> {
        self.peers
            .iter()
            .map(|(net, node)| (net_key(net), endpoint_key(*node).addr))
            .collect()
    }

    fn nodes(&self) -> BTreeSet<[u8; 16]> {
        self.peers
            .iter()
            .map(|(_, node)| endpoint_key(*node).addr)
            .collect()
    }
}

/// The subnet of a trie key ([`net_key`] undone).
fn key_net((bits, addr): (u32, [u8; 16])) -> Option<IpNetwork> {
    match unmapped(addr) {
        IpAddr::V4(a) if bits >= 96 => IpNetwork::new(IpAddr::V4(a), (bits - 96) as u8).ok(),
        a => IpNetwork::new(a, u8::try_from(bits).ok()?).ok(),
    }
}

/// A 16-byte address, an IPv4-mapped one as IPv4.
fn unmapped(addr: [u8; 16]) -> IpAddr {
    let a = Ipv6Addr::from(addr);
    a.to_ipv4_mapped().map_or(IpAddr::V6(a), IpAddr::V4)
}

/// The trie key of a subnet, IPv4 mapped into IPv6.
fn net_key(net: &IpNetwork) -> (u32, [u8; 16]) {
    let base = endpoint_key(net.network()).addr;
    let bits = match net {
        IpNetwork::V4(n) => 96 + u32::from(n.prefix()),
        IpNetwork::V6(n) => u32::from(n.prefix()),
    };
    (bits, base)
}

/// The node's tunnel maps, opened from their pins.
pub struct TunnelMaps {
    peers: LpmTrie<MapData, [u8; 16], TunnelPeer>,
    nodes: HashMap<MapData, EndpointKey, u32>,
    config: Array<MapData, TunnelConfig>,
    stats: PerCpuArray<MapData, TunnelStats>,
    peer_stats: PerCpuHashMap<MapData, EndpointKey, TunnelPeerStats>,
}

/// A peer pod subnet in the tunnel's map and its node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TunnelRoute {
    pub subnet: IpNetwork,
    pub node: IpAddr,
}

/// What the tunnel carried for one member node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TunnelPeerReport {
    pub node: IpAddr,
    pub encap_packets: u64,
    pub encap_bytes: u64,
    pub decap_packets: u64,
    pub decap_bytes: u64,
    pub drop_forged_source: u64,
}

/// A peer subnet the cluster network's agent gives no route: in mode `direct` its node is
/// reached only through a gateway (or has no address of its family), or the tunnel it
/// would take cannot be had. Reported, not fatal: the agent goes on with the others.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct UnroutedPeer {
    pub subnet: IpNetwork,
    pub node: String,
    pub why: String,
}

/// The characters a record's name escapes (`%` first): bpffs refuses `.`, a path `/`, and
/// `|` separates the fields.
const RECORD_ESCAPES: [(char, &str); 4] = [('%', "%25"), ('.', "%2e"), ('/', "%2f"), ('|', "%7c")];
/// The longest name bpffs takes.
const NAME_MAX: usize = 255;

fn escape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    for c in field.chars() {
        match RECORD_ESCAPES.iter().find(|(e, _)| *e == c) {
            Some((_, s)) => out.push_str(s),
            None => out.push(c),
        }
    }
    out
}

fn unescape(field: &str) -> Option<String> {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let (c, _) = RECORD_ESCAPES.iter().find(|(_, s)| tail.starts_with(s))?;
        out.push(*c);
        rest = &tail[3..];
    }
    out.push_str(rest);
    Some(out)
}

impl UnroutedPeer {
    /// Its record's name; the reason is cut to fit bpffs's name length.
    fn record_name(&self) -> String {
        let mut name = format!(
            "{}|{}|",
            escape(&self.subnet.to_string()),
            escape(&self.node)
        );
        for c in self.why.chars() {
            let e = escape(c.encode_utf8(&mut [0; 4]));
            if name.len() + e.len() > NAME_MAX {
                break;
            }
            name.push_str(&e);
        }
        name
    }

    fn from_record_name(name: &str) -> Option<Self> {
        let mut fields = name.splitn(3, '|');
        let subnet = unescape(fields.next()?)?.parse().ok()?;
        let node = unescape(fields.next()?)?;
        let why = unescape(fields.next()?)?;
        Some(Self { subnet, node, why })
    }
}

/// Makes `unrouted_peers/` hold exactly `peers` (the agent's each pass).
pub fn record_unrouted(
    root: &PinRoot,
    node: &NodeId,
    peers: &[UnroutedPeer],
) -> Result<(), BpfError> {
    let dir = root.unrouted_peers_dir(node);
    let want: BTreeSet<String> = peers.iter().map(UnroutedPeer::record_name).collect();
    let have: BTreeSet<String> = std::fs::read_dir(&dir)
        .map(|es| {
            es.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    if want == have {
        return Ok(());
    }
    for name in want.difference(&have) {
        super::pin::create_dir_all_racy(&dir.join(name))?;
    }
    for name in have.difference(&want) {
        let _ = std::fs::remove_dir(dir.join(name));
    }
    Ok(())
}

/// The peer subnets the agent last recorded without a route.
pub fn unrouted(root: &PinRoot, node: &NodeId) -> Vec<UnroutedPeer> {
    let mut out: Vec<UnroutedPeer> = std::fs::read_dir(root.unrouted_peers_dir(node))
        .map(|es| {
            es.flatten()
                .filter_map(|e| UnroutedPeer::from_record_name(e.file_name().to_str()?))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// What `inspect` and `metrics` show of the tunnel.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TunnelReport {
    /// The tunnel device's index (0: none).
    pub ifindex: u32,
    /// Peer pod subnets reached through it, and their nodes.
    pub peers: usize,
    pub nodes: usize,
    /// Each peer subnet and the node address its packets are sent to.
    pub peer_subnets: Vec<TunnelRoute>,
    pub encap_packets: u64,
    pub encap_bytes: u64,
    pub decap_packets: u64,
    pub decap_bytes: u64,
    pub drop_no_peer: u64,
    pub drop_not_member: u64,
    pub drop_forged_source: u64,
    pub drop_malformed: u64,
    pub errors: u64,
    /// Per member node, by address.
    pub peer_nodes: Vec<TunnelPeerReport>,
}

impl TunnelMaps {
    /// `None` when the node's maps are not pinned (no pod yet), or predate the tunnel.
    pub fn open(root: &PinRoot, node: &NodeId) -> Result<Option<Self>, BpfError> {
        let open = |name: &'static str| open_pinned(root, node, name);
        let (Some(peers), Some(nodes), Some(config), Some(stats), Some(peer_stats)) = (
            open(TUNNEL_PEERS_MAP)?,
            open(TUNNEL_NODES_MAP)?,
            open(TUNNEL_CONFIG_MAP)?,
            open(TUNNEL_STATS_MAP)?,
            open(TUNNEL_PEER_STATS_MAP)?,
        ) else {
            return Ok(None);
        };
        let conv = |name| open_map_err(root, node, name);
        Ok(Some(Self {
            peers: LpmTrie::try_from(peers).map_err(conv(TUNNEL_PEERS_MAP))?,
            nodes: HashMap::try_from(nodes).map_err(conv(TUNNEL_NODES_MAP))?,
            config: Array::try_from(config).map_err(conv(TUNNEL_CONFIG_MAP))?,
            stats: PerCpuArray::try_from(stats).map_err(conv(TUNNEL_STATS_MAP))?,
            peer_stats: PerCpuHashMap::try_from(peer_stats).map_err(conv(TUNNEL_PEER_STATS_MAP))?,
        }))
    }

    fn config_now(&self) -> TunnelConfig {
        self.config.get(&0, 0).unwrap_or_default()
    }

    fn entries_now(&self) -> BTreeMap<(u32, [u8; 16]), [u8; 16]> {
        self.peers
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| ((k.prefix_len(), k.data()), v.node))
            .collect()
    }

    fn nodes_now(&self) -> BTreeSet<[u8; 16]> {
        self.nodes
            .keys()
            .filter_map(Result::ok)
            .map(|k| k.addr)
            .collect()
    }

    fn peer_stats_now(&self) -> BTreeSet<[u8; 16]> {
        self.peer_stats
            .keys()
            .filter_map(Result::ok)
            .map(|k| k.addr)
            .collect()
    }

    /// Whether the maps hold exactly `want` (no tunnel: nothing at all).
    pub fn in_line(&self, want: Option<&TunnelView>) -> bool {
        let empty = TunnelView::default();
        let want = want.unwrap_or(&empty);
        let cfg = if want.ifindex == 0 {
            TunnelConfig::default()
        } else {
            want.config()
        };
        self.config_now() == cfg
            && self.entries_now() == want.entries()
            && self.nodes_now() == want.nodes()
            && self.peer_stats_now() == want.nodes()
    }

    /// Writes `want`: the peers and nodes added first, the device last, so a packet the
    /// device takes always finds its peer; removals after.
    pub fn sync(&mut self, want: Option<&TunnelView>) -> Result<(), BpfError> {
        let empty = TunnelView::default();
        let want = want.unwrap_or(&empty);
        let entries = want.entries();
        let have = self.entries_now();
        for ((bits, addr), node) in &entries {
            if have.get(&(*bits, *addr)) == Some(node) {
                continue;
            }
            let v = TunnelPeer {
                node: *node,
                _pad: 0,
            };
            self.peers
                .insert(&Key::new(*bits, *addr), v, 0)
                .map_err(update_err(TUNNEL_PEERS_MAP, "add a peer subnet".to_owned()))?;
        }
        let nodes = want.nodes();
        let nodes_have = self.nodes_now();
        for n in nodes.difference(&nodes_have) {
            self.nodes
                .insert(EndpointKey { addr: *n }, 0, 0)
                .map_err(update_err(TUNNEL_NODES_MAP, "add a peer node".to_owned()))?;
        }
        // A member's counters start at zero when it joins and are kept while it stays.
        let counted = self.peer_stats_now();
        if nodes.difference(&counted).next().is_some() {
            let cpus = aya::util::nr_cpus().map_err(|(_, source)| BpfError::Cpus { source })?;
            for n in nodes.difference(&counted) {
                let zero = PerCpuValues::try_from(vec![TunnelPeerStats::default(); cpus])
                    .expect("one per CPU");
                self.peer_stats
                    .insert(EndpointKey { addr: *n }, zero, 0)
                    .map_err(update_err(
                        TUNNEL_PEER_STATS_MAP,
                        "add a peer node's counters".to_owned(),
                    ))?;
            }
        }
        let cfg = if want.ifindex == 0 {
            TunnelConfig::default()
        } else {
            want.config()
        };
        if self.config_now() != cfg {
            self.config.set(0, cfg, 0).map_err(update_err(
                TUNNEL_CONFIG_MAP,
                "set the tunnel device".to_owned(),
            ))?;
        }
        for (bits, addr) in have.keys().filter(|k| !entries.contains_key(k)) {
            let _ = self.peers.remove(&Key::new(*bits, *addr));
        }
        for n in nodes_have.difference(&nodes) {
            let _ = self.nodes.remove(&EndpointKey { addr: *n });
        }
        for n in counted.difference(&nodes) {
            let _ = self.peer_stats.remove(&EndpointKey { addr: *n });
        }
        Ok(())
    }

    pub fn report(&self) -> TunnelReport {
        let entries = self.entries_now();
        let mut r = TunnelReport {
            ifindex: self.config_now().ifindex,
            peers: entries.len(),
            nodes: self.nodes_now().len(),
            peer_subnets: entries
                .iter()
                .filter_map(|(k, node)| {
                    Some(TunnelRoute {
                        subnet: key_net(*k)?,
                        node: unmapped(*node),
                    })
                })
                .collect(),
            ..TunnelReport::default()
        };
        if let Ok(per_cpu) = self.stats.get(&0, 0) {
            for s in per_cpu.iter() {
                r.encap_packets += s.encap_packets;
                r.encap_bytes += s.encap_bytes;
                r.decap_packets += s.decap_packets;
                r.decap_bytes += s.decap_bytes;
                r.drop_no_peer += s.drop_no_peer;
                r.drop_not_member += s.drop_not_member;
                r.drop_forged_source += s.drop_forged_source;
                r.drop_malformed += s.drop_malformed;
                r.errors += s.errors;
            }
        }
        r.peer_nodes = self
            .peer_stats
            .iter()
            .filter_map(Result::ok)
            .map(|(k, per_cpu)| {
                let mut p = TunnelPeerReport {
                    node: unmapped(k.addr),
                    encap_packets: 0,
                    encap_bytes: 0,
                    decap_packets: 0,
                    decap_bytes: 0,
                    drop_forged_source: 0,
                };
                for s in per_cpu.iter() {
                    p.encap_packets += s.encap_packets;
                    p.encap_bytes += s.encap_bytes;
                    p.decap_packets += s.decap_packets;
                    p.decap_bytes += s.decap_bytes;
                    p.drop_forged_source += s.drop_forged_source;
                }
                p
            })
            .collect();
        r.peer_nodes.sort_by_key(|p| p.node);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unrouted_peers_record_reads_back_and_fits_bpffs() {
        for (subnet, node, why) in [
            (
                "10.244.3.0/24",
                "node-c",
                "its address 10.15.3.2 is reached through the gateway 10.250.0.1",
            ),
            (
                "fd00:10:244:7::/64",
                "c.example.org|%2e",
                "node c has no IPv6 address",
            ),
        ] {
            let p = UnroutedPeer {
                subnet: subnet.parse().unwrap(),
                node: node.into(),
                why: why.into(),
            };
            let name = p.record_name();
            assert!(!name.contains(['.', '/']), "{name}");
            assert_eq!(UnroutedPeer::from_record_name(&name), Some(p));
        }
        let long = UnroutedPeer {
            subnet: "10.244.3.0/24".parse().unwrap(),
            node: "n".into(),
            why: ".".repeat(300),
        };
        let name = long.record_name();
        assert!(name.len() <= NAME_MAX, "{}", name.len());
        assert!(UnroutedPeer::from_record_name(&name)
            .unwrap()
            .why
            .starts_with(".."));
        assert_eq!(UnroutedPeer::from_record_name("10%2x0|n|w"), None);
    }

    #[test]
    fn a_subnets_trie_key_reads_back_as_the_subnet() {
        for net in [
            "10.244.7.0/24",
            "10.0.0.0/8",
            "fd00:10:244:7::/64",
            "0.0.0.0/0",
        ] {
            let net: IpNetwork = net.parse().unwrap();
            assert_eq!(key_net(net_key(&net)), Some(net));
        }
        let v4 = Ipv4Addr::new(10, 15, 3, 2);
        assert_eq!(v6_gateway(v4), "fe80::a0f:302".parse::<Ipv6Addr>().unwrap());
        assert_eq!(node_of(IpAddr::V6(v6_gateway(v4))), Some(IpAddr::V4(v4)));
        assert_eq!(node_of(IpAddr::V4(v4)), Some(IpAddr::V4(v4)));
        let v6: IpAddr = "fd00:250::1".parse().unwrap();
        assert_eq!(node_of(v6), Some(v6));
        assert_eq!(node_of("fe80::1:0:a0f:302".parse().unwrap()), None);
        let node = EndpointKey::v4([10, 251, 3, 2]).addr;
        assert_eq!(unmapped(node), IpAddr::V4(Ipv4Addr::new(10, 251, 3, 2)));
    }
}
