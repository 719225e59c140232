//! Network configurations the tests send (section 1), built from one template so every
//! test talks about the same subnets and gateways.

use std::path::Path;

use serde_json::{json, Value};

pub const V4_SUBNET: &str = "10.10.0.0/24";
pub const V4_GATEWAY: &str = "10.10.0.1";
pub const V6_SUBNET: &str = "fd00:10::/64";
pub const V6_GATEWAY: &str = "fd00:10::1";
pub const MTU: u32 = 1400;
pub const NAMESERVER: &str = "10.10.0.1";
/// The network name used unless a test needs another.
pub const NETWORK: &str = "testnet";

/// Which address families the IPAM ranges cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stack {
    V4,
    V6,
    Dual,
}

impl Stack {
    pub fn has_v4(self) -> bool {
        matches!(self, Self::V4 | Self::Dual)
    }

    pub fn has_v6(self) -> bool {
        matches!(self, Self::V6 | Self::Dual)
    }

    /// `(subnet, gateway)` per family, v4 first, in range-set order.
    pub fn subnets(self) -> Vec<(&'static str, &'static str)> {
        let mut v = Vec::new();
        if self.has_v4() {
            v.push((V4_SUBNET, V4_GATEWAY));
        }
        if self.has_v6() {
            v.push((V6_SUBNET, V6_GATEWAY));
        }
        v
    }
}

/// The contract's example configuration for `plugin_type` (`ebpf-cni` or `ptp`): host-local
/// style IPAM with a private `dataDir`, a default route per family, MTU 1400 and one DNS
/// server.
pub fn standard(
    cni_version: &str,
    name: &str,
    plugin_type: &str,
    data_dir: &Path,
    stack: Stack,
) -> Value {
    let ranges: Vec<Value> = stack
        .subnets()
        .iter()
        .map(|(s, _)| json!([{ "subnet": s }]))
        .collect();
    let mut routes = Vec::new();
    if stack.has_v4() {
        routes.push(json!({ "dst": "0.0.0.0/0" }));
    }
    if stack.has_v6() {
        routes.push(json!({ "dst": "::/0" }));
    }
    json!({
        "cniVersion": cni_version,
        "name": name,
        "type": plugin_type,
        "mtu": MTU,
        "ipam": {
            "type": "host-local",
            "ranges": ranges,
            "routes": routes,
            "dataDir": data_dir.to_string_lossy(),
        },
        "dns": { "nameservers": [NAMESERVER] },
    })
}

/// Replaces the IPAM ranges with one v4 range, e.g. a /30 to exhaust it.
pub fn with_v4_subnet(mut conf: Value, subnet: &str) -> Value {
    conf["ipam"]["ranges"] = json!([[{ "subnet": subnet }]]);
    conf["ipam"]["routes"] = json!([{ "dst": "0.0.0.0/0" }]);
    conf
}
