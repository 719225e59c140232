//! Services on the node: the Service addresses the programs hand to the stack
//! (`ECNI_SVC_NETS`), the switch that turns the lookups on (`NODE_FLAG_SERVICES`), and
//! what the programs counted. What the addresses are is learned by `crate::services`; the
//! programs' side is `ebpf/src/services.rs`.

use std::collections::BTreeSet;

use aya::maps::{
    lpm_trie::{Key, LpmTrie},
    Array, HashMap, MapData, PerCpuArray,
};
use ebpf_cni_maps::{
    NodeConfig, ServicesFlow, ServicesFlowKey, ServicesStats, CONFIG_MAP, NODE_FLAG_SERVICES,
    SERVICES_FLOWS_MAP, SERVICES_NETS_MAP, SERVICES_STATS_MAP,
};
use ipnetwork::IpNetwork;
use serde::Serialize;

use super::{
    maps::{endpoint_key, host_ports::update_err, key_ip, open_map_err, open_pinned},
    pin::{NodeId, PinRoot},
    BpfError,
};

/// The trie key of a Service range, IPv4 mapped into IPv6.
fn net_key(net: &IpNetwork) -> (u32, [u8; 16]) {
    let base = endpoint_key(net.network()).addr;
    let bits = match net {
        IpNetwork::V4(n) => 96 + u32::from(n.prefix()),
        IpNetwork::V6(n) => u32::from(n.prefix()),
    };
    (bits, base)
}

/// The range a trie key stands for.
fn key_net(bits: u32, addr: [u8; 16]) -> Option<IpNetwork> {
    let ip = key_ip(&ebpf_cni_maps::EndpointKey { addr });
    let prefix = if ip.is_ipv4() {
        bits.checked_sub(96)?
    } else {
        bits
    };
    IpNetwork::new(ip, u8::try_from(prefix).ok()?).ok()
}

/// The node's Services maps, opened from their pins.
pub struct ServicesMaps {
    nets: LpmTrie<MapData, [u8; 16], u32>,
    flows: HashMap<MapData, ServicesFlowKey, ServicesFlow>,
    stats: PerCpuArray<MapData, ServicesStats>,
    config: Array<MapData, NodeConfig>,
}

/// What `inspect` and `metrics` show of Services.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ServicesReport {
    /// Whether the programs hand Service flows to the stack.
    pub in_force: bool,
    /// Where the Service addresses came from, as the last convergence recorded it
    /// (`kube-proxy-iptables-nft`, `config`, … joined by `+`; `none`).
    pub source: String,
    /// The Service addresses (ranges) they know.
    pub addresses: usize,
    /// Flows recorded now.
    pub flows: usize,
    /// The programs' counts, summed over the CPUs.
    pub to_service: u64,
    pub replies: u64,
    pub from_outside: u64,
    pub recorded: u64,
    pub record_failed: u64,
    /// Records of dead Service flows dropped because a flow the programs forward reused
    /// their tuple.
    pub forgotten: u64,
    /// Packets from a port a live Service flow holds, to elsewhere (through the stack too).
    pub shared_port: u64,
    /// What on the node's forward hook would drop or reject forwarded traffic, which the
    /// programs' forwarding skips (`crate::firewall`; `inspect` reads it, the metrics do
    /// not: it runs the rule dumps).
    pub forward_firewall: Vec<String>,
}

impl ServicesMaps {
    /// `None` when the node's maps are not pinned (no pod yet), or predate Services
    /// (programs loaded by an older revision, until they are reloaded).
    pub fn open(root: &PinRoot, node: &NodeId) -> Result<Option<Self>, BpfError> {
        let open = |name: &'static str| open_pinned(root, node, name);
        let (Some(nets), Some(flows), Some(stats), Some(config)) = (
            open(SERVICES_NETS_MAP)?,
            open(SERVICES_FLOWS_MAP)?,
            open(SERVICES_STATS_MAP)?,
            open(CONFIG_MAP)?,
        ) else {
            return Ok(None);
        };
        let conv = |name| open_map_err(root, node, name);
        Ok(Some(Self {
            nets: LpmTrie::try_from(nets).map_err(conv(SERVICES_NETS_MAP))?,
            flows: HashMap::try_from(flows).map_err(conv(SERVICES_FLOWS_MAP))?,
            stats: PerCpuArray::try_from(stats).map_err(conv(SERVICES_STATS_MAP))?,
            config: Array::try_from(config).map_err(conv(CONFIG_MAP))?,
        }))
    }

    fn keys(&self) -> BTreeSet<(u32, [u8; 16])> {
        self.nets
            .keys()
            .filter_map(Result::ok)
            .map(|k| (k.prefix_len(), k.data()))
            .collect()
    }

    fn node_config(&self) -> NodeConfig {
        self.config.get(&0, 0).unwrap_or_default()
    }

    /// The entries: each range's trie key and the mark it holds.
    fn entries_now(&self) -> std::collections::BTreeMap<(u32, [u8; 16]), u32> {
        self.nets
            .iter()
            .filter_map(Result::ok)
            .map(|(k, v)| ((k.prefix_len(), k.data()), v))
            .collect()
    }

    /// Whether the programs are on for Services.
    pub fn in_force(&self) -> bool {
        self.node_config().flags & NODE_FLAG_SERVICES != 0
    }

    /// Whether the map holds exactly `want` (each range with its mark) and the switch says
    /// `on`.
    pub fn in_line(&self, want: &[(IpNetwork, u32)], on: bool) -> bool {
        let want: std::collections::BTreeMap<_, _> =
            want.iter().map(|(n, m)| (net_key(n), *m)).collect();
        self.in_force() == on && self.entries_now() == want
    }

    /// Writes `want` (adds and changes first, then removes, so an address kept never
    /// misses) and the switch: on with `on`, off (and the recorded flows dropped) without.
    pub fn sync(&mut self, want: &[(IpNetwork, u32)], on: bool) -> Result<(), BpfError> {
        let want: std::collections::BTreeMap<_, _> =
            want.iter().map(|(n, m)| (net_key(n), *m)).collect();
        let have = self.entries_now();
        for ((bits, addr), mark) in &want {
            if have.get(&(*bits, *addr)) == Some(mark) {
                continue;
            }
            self.nets
                .insert(&Key::new(*bits, *addr), *mark, 0)
                .map_err(update_err(
                    SERVICES_NETS_MAP,
                    format!("add Service range {:?}", key_net(*bits, *addr)),
                ))?;
        }
        for (bits, addr) in have.keys().filter(|k| !want.contains_key(k)) {
            let _ = self.nets.remove(&Key::new(*bits, *addr));
        }
        let mut c = self.node_config();
        let flags = if on {
            c.flags | NODE_FLAG_SERVICES
        } else {
            c.flags & !NODE_FLAG_SERVICES
        };
        if flags != c.flags {
            c.flags = flags;
            self.config
                .set(0, c, 0)
                .map_err(update_err(CONFIG_MAP, "set the Services switch".to_owned()))?;
        }
        if !on {
            let keys: Vec<ServicesFlowKey> = self.flows.keys().filter_map(Result::ok).collect();
            for k in keys {
                let _ = self.flows.remove(&k);
            }
        }
        Ok(())
    }

    pub fn report(&self, source: Option<String>) -> ServicesReport {
        let mut r = ServicesReport {
            in_force: self.in_force(),
            source: source.unwrap_or_else(|| "none".to_owned()),
            addresses: self.keys().len(),
            flows: self.flows.keys().filter_map(Result::ok).count(),
            ..ServicesReport::default()
        };
        if let Ok(per_cpu) = self.stats.get(&0, 0) {
            for s in per_cpu.iter() {
                r.to_service += s.to_service;
                r.replies += s.replies;
                r.from_outside += s.from_outside;
                r.recorded += s.recorded;
                r.record_failed += s.record_failed;
                r.forgotten += s.forgotten;
                r.shared_port += s.shared_port;
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_round_trip_through_trie_keys() {
        for s in [
            "10.96.0.10/32",
            "10.96.0.0/12",
            "fd00:96::a/128",
            "fd00:96::/108",
        ] {
            let net: IpNetwork = s.parse().unwrap();
            let (bits, addr) = net_key(&net);
            assert_eq!(key_net(bits, addr), Some(net), "{s}");
        }
        assert_eq!(net_key(&"10.96.0.10/32".parse().unwrap()).0, 128);
    }
}
