//! The `bandwidth` capability: per-pod rate limits, turned into the token buckets of the
//! `ECNI_RATES` map.
//!
//! Input as the reference `bandwidth` plugin takes it: `ingressRate`, `ingressBurst`,
//! `egressRate`, `egressBurst` in the static config, or `runtimeConfig.bandwidth` (camelCase
//! or containerd's Capitalized keys); the static config wins when it sets any of them.
//! Rates are bit/s, bursts bits; "ingress" is traffic towards the pod. Rate and burst are
//! set together. containerd sends burst 4294967295 (u32::MAX bits) when a pod sets none:
//! that means "not set", and the default burst applies, so the rate holds from the first
//! second instead of letting ~4 Gbit through first.
//!
//! `unshapedSubnets` / `shapedSubnets` (the reference's v1.5 keys, mutually exclusive, each
//! a list of CIDRs of either family) exempt the traffic whose remote address (towards the
//! pod: the source; from it: the destination) is in one of them, or limit only that
//! traffic. They are read from the static config, else from `runtimeConfig.bandwidth`, and
//! become flags in the buckets' `mode` and entries of `ECNI_SHAPE_NET`.

use ebpf_cni_maps::{
    Bucket, RateLimit, LIMIT_POLICE, LIMIT_SUBNETS_SHAPED, LIMIT_SUBNETS_UNSHAPED,
};
use ipnetwork::IpNetwork;
use serde_json::{Map, Value};

use crate::cni::{code, config::get_ci, config::NetConf};

/// A bandwidth limit that cannot be used; each names the field and value at fault.
#[derive(Debug, thiserror::Error)]
pub enum BandwidthError {
    #[error("{field} {value} is invalid: expected a non-negative integer")]
    NotANumber { field: String, value: Value },
    #[error("{burst_field} {burst} is set without {rate_field}: set both or neither")]
    BurstWithoutRate {
        burst_field: String,
        burst: u64,
        rate_field: String,
    },
    #[error("{rate_field} {rate} is set without {burst_field}: set both or neither")]
    RateWithoutBurst {
        rate_field: String,
        rate: u64,
        burst_field: String,
    },
    #[error("{field} {rate} is invalid: the rate is in bit/s and must be at least 8")]
    RateTooLow { field: String, rate: u64 },
    #[error("{field} {burst} is invalid: a burst cannot be more than 4 GiB")]
    BurstTooLarge { field: String, burst: u64 },
    #[error("runtimeConfig.bandwidth {0} must be an object")]
    NotAnObject(Value),
    #[error("{field} {value} must be a list of CIDRs (\"10.0.0.0/8\")")]
    NotAList { field: String, value: Value },
    #[error("{field} entry {value} is not a CIDR")]
    NotACidr { field: String, value: Value },
    #[error("unshapedSubnets and shapedSubnets cannot be both specified, one of them should be discarded")]
    BothSubnetLists,
}

impl BandwidthError {
    pub fn cni_code(&self) -> u32 {
        code::INVALID_CONFIG
    }
}

/// What containerd sends for "no burst".
const UNSET_BURST_BITS: u64 = u32::MAX as u64;
/// Default burst: 20 ms of traffic at the rate...
const DEFAULT_BURST_NS: u64 = 20_000_000;
/// ...but never below what one GSO/GRO aggregate (64 KiB) plus slack needs: the programs
/// see aggregated packets, and a bucket smaller than one would drop every one of them.
pub const MIN_BURST_BYTES: u64 = 128 * 1024;

/// One direction's limit in the programs' units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub rate_bytes: u64,
    pub burst_bytes: u64,
}

/// Which traffic `Subnets::nets` select.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubnetRule {
    /// `unshapedSubnets`: traffic to or from them is not limited.
    Unshaped,
    /// `shapedSubnets`: only traffic to or from them is limited.
    Shaped,
}

impl SubnetRule {
    pub fn key(self) -> &'static str {
        match self {
            Self::Unshaped => "unshapedSubnets",
            Self::Shaped => "shapedSubnets",
        }
    }
}

/// A pod's `unshapedSubnets` or `shapedSubnets` (never empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subnets {
    pub rule: SubnetRule,
    pub nets: Vec<IpNetwork>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    /// Towards the pod.
    pub ingress: Option<Limit>,
    /// From the pod.
    pub egress: Option<Limit>,
    /// Only where a direction is limited does it matter.
    pub subnets: Option<Subnets>,
}

/// The data of an `ECNI_SHAPE_NET` key, as its prefix length (the ifindex's 32 bits
/// included) and address (IPv4 mapped into IPv6), without the ifindex.
pub type SubnetKey = (u32, [u8; 16]);

/// `net` as a [`SubnetKey`].
pub fn subnet_key(net: &IpNetwork) -> SubnetKey {
    match net {
        IpNetwork::V4(n) => (
            32 + 96 + u32::from(n.prefix()),
            n.network().to_ipv6_mapped().octets(),
        ),
        IpNetwork::V6(n) => (32 + u32::from(n.prefix()), n.network().octets()),
    }
}

/// The CIDR a [`SubnetKey`] stands for.
pub fn subnet_of_key((prefix, addr): SubnetKey) -> IpNetwork {
    let a = std::net::Ipv6Addr::from(addr);
    let p = prefix.saturating_sub(32);
    match a.to_ipv4_mapped() {
        Some(v4) if p >= 96 => IpNetwork::new(v4.into(), (p - 96) as u8),
        _ => IpNetwork::new(a.into(), p as u8),
    }
    .expect("prefix lengths come from valid keys")
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        self.ingress.is_none() && self.egress.is_none()
    }

    /// The `ECNI_SHAPE_NET` entries of the pod (none without limits or subnets).
    pub fn subnet_keys(&self) -> Vec<SubnetKey> {
        match &self.subnets {
            Some(s) if !self.is_empty() => s.nets.iter().map(subnet_key).collect(),
            _ => Vec::new(),
        }
    }

    /// The `ECNI_RATES` value, buckets full; `None` for a pod without limits.
    pub fn to_map_value(&self) -> Option<RateLimit> {
        if self.is_empty() {
            return None;
        }
        let flags = match self.subnets.as_ref().map(|s| s.rule) {
            None => 0,
            Some(SubnetRule::Unshaped) => LIMIT_SUBNETS_UNSHAPED,
            Some(SubnetRule::Shaped) => LIMIT_SUBNETS_SHAPED,
        };
        let bucket = |l: Option<Limit>| {
            l.map_or(Bucket::default(), |l| {
                // Validation keeps a set burst below 4 GiB; only a default burst (20 ms) of
                // a rate above 1.6 Tbit/s would not fit.
                let burst = u32::try_from(l.burst_bytes).unwrap_or(u32::MAX);
                Bucket {
                    rate_bytes: l.rate_bytes,
                    burst_bytes: burst,
                    // ADD decides whether an ingress limit can be paced (`bpf::queue`).
                    mode: LIMIT_POLICE | flags,
                    tokens: u64::from(burst),
                    last_ns: 0,
                }
            })
        };
        Some(RateLimit {
            ingress: bucket(self.ingress),
            egress: bucket(self.egress),
        })
    }
}

fn number(v: Option<&Value>, field: &str) -> Result<Option<u64>, BandwidthError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) => Ok(Some(n)),
            None => Err(BandwidthError::NotANumber {
                field: field.to_owned(),
                value: v.clone(),
            }),
        },
    }
}

fn direction(
    rate: Option<u64>,
    burst: Option<u64>,
    rate_field: &str,
    burst_field: &str,
) -> Result<Option<Limit>, BandwidthError> {
    match (rate.unwrap_or(0), burst) {
        (0, None | Some(0) | Some(UNSET_BURST_BITS)) => Ok(None),
        (0, Some(b)) => Err(BandwidthError::BurstWithoutRate {
            burst_field: burst_field.to_owned(),
            burst: b,
            rate_field: rate_field.to_owned(),
        }),
        (r, None | Some(0)) => Err(BandwidthError::RateWithoutBurst {
            rate_field: rate_field.to_owned(),
            rate: r,
            burst_field: burst_field.to_owned(),
        }),
        (r, _) if r < 8 => Err(BandwidthError::RateTooLow {
            field: rate_field.to_owned(),
            rate: r,
        }),
        (r, Some(b)) => {
            let rate_bytes = r / 8;
            let burst_bytes = if b == UNSET_BURST_BITS {
                (u128::from(rate_bytes) * u128::from(DEFAULT_BURST_NS) / 1_000_000_000) as u64
            } else if b / 8 >= u64::from(u32::MAX) {
                return Err(BandwidthError::BurstTooLarge {
                    field: burst_field.to_owned(),
                    burst: b,
                });
            } else {
                b / 8
            };
            Ok(Some(Limit {
                rate_bytes,
                burst_bytes: burst_bytes.max(MIN_BURST_BYTES),
            }))
        }
    }
}

const KEYS: [&str; 4] = ["ingressRate", "ingressBurst", "egressRate", "egressBurst"];

fn from_object(
    m: &Map<String, Value>,
    prefix: &str,
    case_insensitive: bool,
) -> Result<Limits, BandwidthError> {
    let get = |k: &str| {
        if case_insensitive {
            get_ci(m, k)
        } else {
            m.get(k)
        }
    };
    let field = |k: &str| format!("{prefix}{k}");
    let n = |k: &str| number(get(k), &field(k));
    Ok(Limits {
        ingress: direction(
            n("ingressRate")?,
            n("ingressBurst")?,
            &field("ingressRate"),
            &field("ingressBurst"),
        )?,
        egress: direction(
            n("egressRate")?,
            n("egressBurst")?,
            &field("egressRate"),
            &field("egressBurst"),
        )?,
        subnets: None,
    })
}

/// `unshapedSubnets` / `shapedSubnets` of one object (`prefix` names where, in errors).
fn subnets_of(
    m: &Map<String, Value>,
    prefix: &str,
    case_insensitive: bool,
) -> Result<Option<Subnets>, BandwidthError> {
    let list = |rule: SubnetRule| -> Result<Vec<IpNetwork>, BandwidthError> {
        let k = rule.key();
        let v = if case_insensitive {
            get_ci(m, k)
        } else {
            m.get(k)
        };
        let field = format!("{prefix}{k}");
        match v {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| {
                    item.as_str()
                        .and_then(|s| s.parse::<IpNetwork>().ok())
                        .map(|n| IpNetwork::new(n.network(), n.prefix()).expect("prefix is valid"))
                        .ok_or_else(|| BandwidthError::NotACidr {
                            field: field.clone(),
                            value: item.clone(),
                        })
                })
                .collect(),
            Some(other) => Err(BandwidthError::NotAList {
                field,
                value: other.clone(),
            }),
        }
    };
    let unshaped = list(SubnetRule::Unshaped)?;
    let shaped = list(SubnetRule::Shaped)?;
    Ok(match (unshaped.is_empty(), shaped.is_empty()) {
        (false, false) => return Err(BandwidthError::BothSubnetLists),
        (false, true) => Some(Subnets {
            rule: SubnetRule::Unshaped,
            nets: unshaped,
        }),
        (true, false) => Some(Subnets {
            rule: SubnetRule::Shaped,
            nets: shaped,
        }),
        (true, true) => None,
    })
}

/// The pod's limits, validated (error 7 naming the field). The subnets come from the
/// static config when it names any, else from `runtimeConfig.bandwidth`, whichever of the
/// two gives the rates: an operator sets them once in the network config while each pod's
/// rates come from the runtime.
pub fn limits(conf: &NetConf) -> Result<Limits, BandwidthError> {
    let obj = conf.raw.as_object().expect("configs are objects");
    let runtime = match conf.runtime.capability("bandwidth") {
        None => None,
        Some(Value::Object(m)) => Some(m),
        Some(other) => return Err(BandwidthError::NotAnObject(other.clone())),
    };
    let static_subnets = subnets_of(obj, "", false)?;
    let runtime_subnets = match runtime {
        Some(m) => subnets_of(m, "runtimeConfig.bandwidth.", true)?,
        None => None,
    };
    let mut l = if KEYS
        .iter()
        .any(|k| obj.get(*k).is_some_and(|v| !v.is_null()))
    {
        from_object(obj, "", false)?
    } else {
        match runtime {
            None => Limits::default(),
            Some(m) => from_object(m, "runtimeConfig.bandwidth.", true)?,
        }
    };
    l.subnets = static_subnets.or(runtime_subnets);
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<Limits, crate::cni::CniError> {
        let mut base = json!({"cniVersion": "1.0.0", "name": "n"});
        for (k, val) in v.as_object().unwrap() {
            base[k] = val.clone();
        }
        Ok(limits(&NetConf::parse(base)?)?)
    }

    #[test]
    fn runtime_config_in_both_spellings() {
        for bw in [
            json!({"ingressRate": 10_000_000, "ingressBurst": 8_000_000, "egressRate": 20_000_000, "egressBurst": 16_000_000}),
            json!({"IngressRate": 10_000_000, "IngressBurst": 8_000_000, "EgressRate": 20_000_000, "EgressBurst": 16_000_000}),
        ] {
            let l = parse(json!({"runtimeConfig": {"bandwidth": bw}})).unwrap();
            assert_eq!(
                l.ingress,
                Some(Limit {
                    rate_bytes: 1_250_000,
                    burst_bytes: 1_000_000
                })
            );
            assert_eq!(
                l.egress,
                Some(Limit {
                    rate_bytes: 2_500_000,
                    burst_bytes: 2_000_000
                })
            );
        }
    }

    #[test]
    fn containerd_unset_burst_gets_the_default() {
        let l = parse(json!({"runtimeConfig": {"bandwidth": {"IngressRate": 1_000_000_000u64, "IngressBurst": 4294967295u64}}})).unwrap();
        // 20 ms at 125 MB/s.
        assert_eq!(
            l.ingress,
            Some(Limit {
                rate_bytes: 125_000_000,
                burst_bytes: 2_500_000
            })
        );
        assert!(l.egress.is_none());
        let l = parse(json!({"runtimeConfig": {"bandwidth": {"EgressRate": 10_000_000, "EgressBurst": 4294967295u64}}})).unwrap();
        assert_eq!(
            l.egress.unwrap().burst_bytes,
            MIN_BURST_BYTES,
            "small rates get the minimum burst"
        );
    }

    #[test]
    fn static_config_wins() {
        let l = parse(json!({"egressRate": 8_000_000, "egressBurst": 8_000_000,
            "runtimeConfig": {"bandwidth": {"ingressRate": 1_000_000, "ingressBurst": 1_000_000}}}))
        .unwrap();
        assert!(l.ingress.is_none());
        assert_eq!(l.egress.unwrap().rate_bytes, 1_000_000);
    }

    #[test]
    fn subnets_from_the_static_config_or_the_runtime() {
        let bw = json!({"IngressRate": 8_000_000, "IngressBurst": 4294967295u64});
        let l = parse(json!({"unshapedSubnets": ["10.1.2.3/8", "fd00::/64"],
            "runtimeConfig": {"bandwidth": bw}}))
        .unwrap();
        let s = l.subnets.clone().unwrap();
        assert_eq!(s.rule, SubnetRule::Unshaped);
        assert_eq!(s.nets[0].to_string(), "10.0.0.0/8", "host bits cleared");
        assert_eq!(
            l.subnet_keys(),
            vec![
                (
                    32 + 96 + 8,
                    std::net::Ipv4Addr::new(10, 0, 0, 0)
                        .to_ipv6_mapped()
                        .octets()
                ),
                (
                    32 + 64,
                    "fd00::".parse::<std::net::Ipv6Addr>().unwrap().octets()
                ),
            ]
        );
        for k in l.subnet_keys() {
            assert_eq!(subnet_key(&subnet_of_key(k)), k);
        }
        let v = l.to_map_value().unwrap();
        assert_eq!(v.ingress.mode, LIMIT_SUBNETS_UNSHAPED);
        let l = parse(
            json!({"runtimeConfig": {"bandwidth": {"EgressRate": 8_000_000,
            "EgressBurst": 8_000_000, "ShapedSubnets": ["192.168.0.0/16"]}}}),
        )
        .unwrap();
        assert_eq!(l.subnets.as_ref().unwrap().rule, SubnetRule::Shaped);
        assert_eq!(l.to_map_value().unwrap().egress.mode, LIMIT_SUBNETS_SHAPED);
        // Empty lists and pods without limits: nothing.
        let l = parse(json!({"unshapedSubnets": [], "shapedSubnets": ["10.0.0.0/8"]})).unwrap();
        assert!(l.subnet_keys().is_empty());
        assert!(l.to_map_value().is_none());
    }

    #[test]
    fn invalid_subnets_are_refused() {
        let cases = [
            (
                json!({"unshapedSubnets": ["10.0.0.0/8"], "shapedSubnets": ["fd00::/8"]}),
                "unshapedSubnets and shapedSubnets cannot be both specified",
            ),
            (
                json!({"unshapedSubnets": ["10.0.0.300/8"]}),
                "unshapedSubnets entry \"10.0.0.300/8\" is not a CIDR",
            ),
            (
                json!({"shapedSubnets": "10.0.0.0/8"}),
                "shapedSubnets \"10.0.0.0/8\" must be a list",
            ),
            (
                json!({"runtimeConfig": {"bandwidth": {"unshapedSubnets": [5]}}}),
                "runtimeConfig.bandwidth.unshapedSubnets entry 5 is not a CIDR",
            ),
        ];
        for (v, msg) in cases {
            let e = parse(v.clone()).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{v}");
            assert!(e.msg.contains(msg), "{v}: {}", e.msg);
        }
    }

    #[test]
    fn invalid_inputs_name_the_field() {
        let cases = [
            (json!({"ingressRate": 1_000_000}), "ingressBurst"),
            (json!({"egressBurst": 1_000_000}), "egressRate"),
            (
                json!({"ingressRate": -5, "ingressBurst": 10}),
                "ingressRate",
            ),
            (
                json!({"ingressRate": "fast", "ingressBurst": 10}),
                "ingressRate",
            ),
            (
                json!({"ingressRate": 1000, "ingressBurst": 40_000_000_000u64}),
                "ingressBurst",
            ),
            (
                json!({"runtimeConfig": {"bandwidth": {"EgressRate": 5, "EgressBurst": 100}}}),
                "runtimeConfig.bandwidth.egressRate",
            ),
            (
                json!({"runtimeConfig": {"bandwidth": "lots"}}),
                "runtimeConfig.bandwidth",
            ),
        ];
        for (v, field) in cases {
            let e = parse(v.clone()).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{v}");
            assert!(e.msg.contains(field), "{v}: {}", e.msg);
        }
        assert!(parse(json!({})).unwrap().is_empty());
    }
}
