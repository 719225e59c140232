//! The cluster network as the source describes it: the network config (one JSON document an
//! operator writes once), the key each node's subnet is held under, the record stored
//! there, and which subnet a node gets. Pure: what talks to etcd is `super::etcd`.
//!
//! The layout follows flannel's etcd backend (its `<prefix>/config` and
//! `<prefix>/subnets/10.5.52.0-24`), so an operator who ran flannel knows it: a subnet key is
//! its network address and prefix length with `-` for `/`, an IPv6 one keeps its colons.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::{IpNetwork, Ipv4Network, Ipv6Network};
use serde::{Deserialize, Serialize};

/// How a node reaches a peer's pod subnet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// A route via the peer's node address where a route without a gateway covers it;
    /// through the tunnel (VXLAN) to a peer behind a gateway.
    #[default]
    Auto,
    /// Direct routes only: every peer is expected on one of the node's links, and one that
    /// is not is reported and gets no route.
    Direct,
    /// Every peer through the tunnel.
    Overlay,
}

/// The network config under `<prefix>/config`. flannel's capitalized keys are taken too.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkConfig {
    /// The cluster's IPv4 pod network, split into one subnet per node.
    #[serde(default, alias = "Network")]
    pub network: Option<Ipv4Network>,
    /// The prefix length of each node's IPv4 subnet.
    #[serde(
        default = "default_subnet_len",
        rename = "subnetLen",
        alias = "SubnetLen"
    )]
    pub subnet_len: u8,
    #[serde(default, rename = "ipv6Network", alias = "IPv6Network")]
    pub ipv6_network: Option<Ipv6Network>,
    #[serde(
        default = "default_ipv6_subnet_len",
        rename = "ipv6SubnetLen",
        alias = "IPv6SubnetLen"
    )]
    pub ipv6_subnet_len: u8,
    #[serde(default)]
    pub mode: Mode,
    /// The tunnel's UDP port (flannel's `vxlan` backend's and the kernel's default).
    #[serde(default = "default_vxlan_port", rename = "vxlanPort")]
    pub vxlan_port: u16,
    /// Whether the tunnel's outer UDP header carries a checksum (IPv4; off by default).
    #[serde(default, rename = "vxlanUdpChecksum")]
    pub vxlan_udp_checksum: bool,
}

fn default_subnet_len() -> u8 {
    24
}

fn default_vxlan_port() -> u16 {
    8472
}

fn default_ipv6_subnet_len() -> u8 {
    64
}

/// A network config that cannot be used, naming the key and the value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NetworkConfigError {
    #[error("the network config is not a JSON object with known keys: {0}")]
    Json(String),
    #[error("the network config has neither \"network\" nor \"ipv6Network\"")]
    NoNetwork,
    #[error("the network config's {key} {network} has host bits set (its network is {expected})")]
    HostBits {
        key: &'static str,
        network: IpNetwork,
        expected: IpNetwork,
    },
    #[error("the network config's {key} {len} does not fit {network}: between {min} and {max}")]
    SubnetLen {
        key: &'static str,
        len: u8,
        network: IpNetwork,
        min: u8,
        max: u8,
    },
}

/// The longest IPv4 node subnet: host-local needs a gateway and room for pods.
const MAX_V4_SUBNET_LEN: u8 = 28;
const MAX_V6_SUBNET_LEN: u8 = 120;

impl NetworkConfig {
    /// The cluster's pod networks, IPv4 first: every member's subnets are in them.
    pub fn networks(&self) -> Vec<IpNetwork> {
        let v4 = self.network.map(IpNetwork::V4);
        let v6 = self.ipv6_network.map(IpNetwork::V6);
        v4.into_iter().chain(v6).collect()
    }

    /// Parses and checks the config's text.
    pub fn parse(text: &[u8]) -> Result<Self, NetworkConfigError> {
        let c: Self =
            serde_json::from_slice(text).map_err(|e| NetworkConfigError::Json(e.to_string()))?;
        if c.network.is_none() && c.ipv6_network.is_none() {
            return Err(NetworkConfigError::NoNetwork);
        }
        if let Some(n) = c.network {
            check(
                "network",
                "subnetLen",
                IpNetwork::V4(n),
                c.subnet_len,
                MAX_V4_SUBNET_LEN,
            )?;
        }
        if let Some(n) = c.ipv6_network {
            check(
                "ipv6Network",
                "ipv6SubnetLen",
                IpNetwork::V6(n),
                c.ipv6_subnet_len,
                MAX_V6_SUBNET_LEN,
            )?;
        }
        Ok(c)
    }

    /// Whether `subnet` is one node subnet of this network (its family's length, inside).
    pub fn is_node_subnet(&self, subnet: IpNetwork) -> bool {
        match subnet {
            IpNetwork::V4(s) => self.network.is_some_and(|n| {
                s.prefix() == self.subnet_len && n.contains(s.network()) && s.network() == s.ip()
            }),
            IpNetwork::V6(s) => self.ipv6_network.is_some_and(|n| {
                s.prefix() == self.ipv6_subnet_len
                    && n.contains(s.network())
                    && s.network() == s.ip()
            }),
        }
    }
}

fn check(
    key: &'static str,
    len_key: &'static str,
    network: IpNetwork,
    len: u8,
    max: u8,
) -> Result<(), NetworkConfigError> {
    let expected = IpNetwork::new(network.network(), network.prefix()).expect("a valid prefix");
    if network.ip() != network.network() {
        return Err(NetworkConfigError::HostBits {
            key,
            network,
            expected,
        });
    }
    // Longer than the network's own prefix: a network holds at least two node subnets.
    let min = network.prefix() + 1;
    if len < min || len > max {
        return Err(NetworkConfigError::SubnetLen {
            key: len_key,
            len,
            network,
            min,
            max,
        });
    }
    Ok(())
}

/// What a node's subnet key holds: the node's name and its addresses on the underlay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    pub node: String,
    #[serde(rename = "publicIP", default, skip_serializing_if = "Option::is_none")]
    pub public_ip: Option<Ipv4Addr>,
    #[serde(
        rename = "publicIPv6",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub public_ipv6: Option<Ipv6Addr>,
}

impl MemberRecord {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a member record serializes")
    }
}

/// The key of `subnet` under `prefix` (no trailing slash): `<prefix>/subnets/10.244.1.0-24`.
pub fn subnet_key(prefix: &str, subnet: IpNetwork) -> String {
    format!(
        "{}{}-{}",
        subnets_prefix(prefix),
        subnet.network(),
        subnet.prefix()
    )
}

/// The prefix every subnet key starts with.
pub fn subnets_prefix(prefix: &str) -> String {
    format!("{}/subnets/", prefix.trim_end_matches('/'))
}

/// The config's key.
pub fn config_key(prefix: &str) -> String {
    format!("{}/config", prefix.trim_end_matches('/'))
}

/// The subnet a key names, if it is a subnet key under `prefix`.
pub fn subnet_of_key(prefix: &str, key: &str) -> Option<IpNetwork> {
    let rest = key.strip_prefix(&subnets_prefix(prefix))?;
    let (addr, len) = rest.rsplit_once('-')?;
    let addr: IpAddr = addr.parse().ok()?;
    let subnet = IpNetwork::new(addr, len.parse().ok()?).ok()?;
    (subnet.network() == addr).then_some(subnet)
}

/// The subnet of `network` split into `len`-long subnets that a node named `node` should
/// take: `preferred` if it is one of them and free, else the first free one from a start
/// that depends on the node's name (so nodes joining at once seldom race for one key), or
/// `None` when every subnet is taken.
pub fn choose_subnet(
    network: IpNetwork,
    len: u8,
    taken: &BTreeSet<IpNetwork>,
    preferred: Option<IpNetwork>,
    node: &str,
) -> Option<IpNetwork> {
    if let Some(p) = preferred {
        let fits = p.prefix() == len
            && p.network() == p.ip()
            && network.contains(p.network())
            && p.is_ipv4() == network.is_ipv4();
        if fits && !taken.contains(&p) {
            return Some(p);
        }
    }
    let bits = u32::from(len - network.prefix());
    // Only the first 2^20 subnets are probed (an IPv6 /48 has 65,536 /64s).
    let count: u64 = 1u64 << bits.min(20);
    let start = fnv1a(node.as_bytes()) % count;
    (0..count)
        .map(|i| nth_subnet(network, len, (start + i) % count))
        .find(|s| !taken.contains(s))
}

/// The `i`-th `len`-long subnet of `network`.
fn nth_subnet(network: IpNetwork, len: u8, i: u64) -> IpNetwork {
    match network {
        IpNetwork::V4(n) => {
            let base = u32::from(n.network());
            let step = 1u64 << (32 - u32::from(len));
            let addr = Ipv4Addr::from((u64::from(base) + i * step) as u32);
            IpNetwork::V4(Ipv4Network::new(addr, len).expect("a valid length"))
        }
        IpNetwork::V6(n) => {
            let base = u128::from(n.network());
            let step = 1u128 << (128 - u32::from(len));
            let addr = Ipv6Addr::from(base + u128::from(i) * step);
            IpNetwork::V6(Ipv6Network::new(addr, len).expect("a valid length"))
        }
    }
}

/// FNV-1a, 64 bits: a stable spread of node names over the subnets.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNetwork {
        s.parse().unwrap()
    }

    #[test]
    fn a_config_with_flannels_keys_or_ours_parses_and_bad_ones_name_the_key() {
        let c = NetworkConfig::parse(br#"{"Network": "10.244.0.0/16", "SubnetLen": 24}"#).unwrap();
        assert_eq!(
            (c.network, c.ipv6_network),
            (Some("10.244.0.0/16".parse().unwrap()), None)
        );
        assert_eq!(c.mode, Mode::Auto);
        let c = NetworkConfig::parse(
            br#"{"network": "10.244.0.0/16", "ipv6Network": "fd00:10:244::/48", "mode": "direct"}"#,
        )
        .unwrap();
        assert!(c.network.is_some() && c.ipv6_network.is_some());
        assert_eq!((c.mode, c.ipv6_subnet_len), (Mode::Direct, 64));

        let err = |t: &str| NetworkConfig::parse(t.as_bytes()).unwrap_err().to_string();
        assert!(err("{}").contains("neither"), "{}", err("{}"));
        let e = err(r#"{"network": "10.244.1.0/16"}"#);
        assert!(
            e.contains("network 10.244.1.0/16") && e.contains("10.244.0.0/16"),
            "{e}"
        );
        let e = err(r#"{"network": "10.244.0.0/16", "subnetLen": 12}"#);
        assert!(e.contains("subnetLen 12"), "{e}");
        let e = err(r#"{"network": "10.244.0.0/16", "subnetLen": 31}"#);
        assert!(e.contains("subnetLen 31"), "{e}");
        let e = err(r#"{"network": "10.244.0.0/16", "backend": "vxlan"}"#);
        assert!(e.contains("backend"), "{e}");
        let c = NetworkConfig::parse(
            br#"{"network": "10.244.0.0/16", "mode": "overlay", "vxlanPort": 4789, "vxlanUdpChecksum": true}"#,
        )
        .unwrap();
        assert_eq!(
            (c.mode, c.vxlan_port, c.vxlan_udp_checksum),
            (Mode::Overlay, 4789, true)
        );
        let c = NetworkConfig::parse(br#"{"network": "10.244.0.0/16"}"#).unwrap();
        assert_eq!((c.vxlan_port, c.vxlan_udp_checksum), (8472, false));
        let e = err(r#"{"network": "10.244.0.0/16", "mode": "tunnel"}"#);
        assert!(e.contains("tunnel"), "{e}");
        let e = err(r#"{"network": "10.244.0.0/16", "vxlanPort": 70000}"#);
        assert!(e.contains("70000"), "{e}");
    }

    #[test]
    fn subnet_keys_round_trip_in_both_families() {
        for s in ["10.244.1.0/24", "fd00:10:244:1::/64"] {
            let key = subnet_key("/ebpf-cni/network/", net(s));
            assert!(key.starts_with("/ebpf-cni/network/subnets/"), "{key}");
            assert_eq!(subnet_of_key("/ebpf-cni/network", &key), Some(net(s)));
        }
        assert_eq!(
            subnet_key("/p", net("10.244.1.0/24")),
            "/p/subnets/10.244.1.0-24"
        );
        assert_eq!(subnet_of_key("/p", "/p/subnets/10.244.1.7-24"), None);
        assert_eq!(subnet_of_key("/p", "/p/config"), None);
        assert_eq!(subnet_of_key("/p", "/q/subnets/10.244.1.0-24"), None);
    }

    #[test]
    fn a_node_gets_its_preferred_subnet_if_free_else_a_free_one() {
        let network = net("10.244.0.0/22");
        let mut taken = BTreeSet::new();
        let want = net("10.244.2.0/24");
        assert_eq!(
            choose_subnet(network, 24, &taken, Some(want), "a"),
            Some(want)
        );
        taken.insert(want);
        let other = choose_subnet(network, 24, &taken, Some(want), "a").unwrap();
        assert_ne!(other, want);
        assert!(network.contains(other.network()) && other.prefix() == 24);
        // A preferred subnet outside the network, or of another length, is not taken.
        let outside = choose_subnet(network, 24, &taken, Some(net("10.9.0.0/24")), "a").unwrap();
        assert!(network.contains(outside.network()));
        for s in ["10.244.0.0/24", "10.244.1.0/24", "10.244.3.0/24"] {
            taken.insert(net(s));
        }
        assert_eq!(choose_subnet(network, 24, &taken, None, "a"), None);
        // The same name starts at the same place; IPv6 too.
        let v6 = net("fd00:10:244::/48");
        let a = choose_subnet(v6, 64, &BTreeSet::new(), None, "node-a").unwrap();
        assert_eq!(
            choose_subnet(v6, 64, &BTreeSet::new(), None, "node-a"),
            Some(a)
        );
        assert!(v6.contains(a.network()) && a.prefix() == 64);
    }
}
