//! The host-local `ipam` config: parsing, defaults and validation.
//!
//! Follows the reference plugin's `LoadIPAMConfig`: range sets come from
//! `runtimeConfig.ipRanges` first, then the legacy top-level `subnet`/`rangeStart`/… of the
//! `ipam` object, then `ipam.ranges` — all kept, in that order, so that the index of a set
//! (which names its `last_reserved_ip.<N>` file) is the one the reference would use on the
//! same input. Keys are matched exactly first and then ignoring ASCII case, because the
//! reference decodes with Go's case-insensitive JSON and containerd sends runtimeConfig
//! keys Capitalized. Unknown keys are ignored, as the reference does. One deliberate
//! difference: a gateway outside its subnet is rejected here, the reference accepts it.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnetwork::IpNetwork;
use serde_json::{Map, Value};

use super::error::IpamError;
use super::range::{canonical_ip, from_u128, same_family, to_u128, Range, RangeSet};
use super::IpamRoute;

/// Where the reference keeps its leases when `dataDir` is not given.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

/// How long we wait for another process (ours or the reference's) to release the
/// network's lock before giving up with "try again later". The reference waits forever;
/// a bounded wait lets a stuck holder surface as an error instead of a hung runtime.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// A parsed, canonical host-local config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLocalConfig {
    /// Leases live in `<data_dir>/<network name>/`.
    pub data_dir: PathBuf,
    /// One address per set is handed out; the index is the `N` of `last_reserved_ip.N`.
    pub range_sets: Vec<RangeSet>,
    pub routes: Vec<IpamRoute>,
    /// A resolv.conf-format file whose contents become the result's DNS, read on ADD.
    pub resolv_conf: Option<PathBuf>,
    pub lock_timeout: Duration,
}

impl HostLocalConfig {
    /// `ipam` is the plugin config's "ipam" object; `runtime_ip_ranges` the
    /// runtimeConfig.ipRanges value if any (a list of range sets, like `ipam.ranges`).
    pub fn parse(ipam: &Value, runtime_ip_ranges: Option<&Value>) -> Result<Self, IpamError> {
        let obj = as_object(ipam, "ipam")?;

        let data_dir = opt_str(obj, "ipam", "dataDir")?
            .filter(|s| !s.is_empty())
            .map_or_else(|| PathBuf::from(DEFAULT_DATA_DIR), PathBuf::from);
        let resolv_conf = opt_str(obj, "ipam", "resolvConf")?
            .filter(|s| !s.is_empty())
            .map(PathBuf::from);
        let routes = match get(obj, "routes") {
            Some(v) => parse_routes(v, "ipam.routes")?,
            None => Vec::new(),
        };

        let mut sets = Vec::new();
        if let Some(v) = runtime_ip_ranges.filter(|v| !v.is_null()) {
            sets.extend(parse_range_sets(v, "runtimeConfig.ipRanges")?);
        }
        // The reference only takes the legacy single range when it has a subnet.
        if get(obj, "subnet").is_some() {
            let range = parse_range(obj, "ipam")?;
            sets.push(ParsedSet {
                set: RangeSet {
                    ranges: vec![range],
                    source: "ipam.subnet".into(),
                },
                paths: vec!["ipam".into()],
            });
        } else if ["rangeStart", "rangeEnd", "gateway"]
            .iter()
            .any(|k| get(obj, k).is_some())
        {
            log::warn!("ipam: rangeStart/rangeEnd/gateway without subnet are ignored");
        }
        if let Some(v) = get(obj, "ranges") {
            sets.extend(parse_range_sets(v, "ipam.ranges")?);
        }
        if sets.is_empty() {
            return Err(IpamError::NoRanges);
        }

        for (i, a) in sets.iter().enumerate() {
            for b in &sets[i + 1..] {
                check_no_overlap(a, b)?;
            }
        }

        Ok(Self {
            data_dir,
            range_sets: sets.into_iter().map(|p| p.set).collect(),
            routes,
            resolv_conf,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
        })
    }
}

/// A set together with the config path of each of its ranges, for overlap messages.
struct ParsedSet {
    set: RangeSet,
    paths: Vec<String>,
}

/// Fails on the first pair of overlapping ranges, naming both by their config path.
fn check_pair(a: (&Range, &String), b: (&Range, &String)) -> Result<(), IpamError> {
    if a.0.overlaps(b.0) {
        return Err(IpamError::RangesOverlap {
            first: a.1.clone(),
            first_range: a.0.to_string(),
            second: b.1.clone(),
            second_range: b.0.to_string(),
        });
    }
    Ok(())
}

fn check_no_overlap(a: &ParsedSet, b: &ParsedSet) -> Result<(), IpamError> {
    for ra in a.set.ranges.iter().zip(&a.paths) {
        for rb in b.set.ranges.iter().zip(&b.paths) {
            check_pair(ra, rb)?;
        }
    }
    Ok(())
}

fn parse_range_sets(v: &Value, field: &str) -> Result<Vec<ParsedSet>, IpamError> {
    let sets = as_array(v, field)?;
    let mut out = Vec::with_capacity(sets.len());
    for (i, set) in sets.iter().enumerate() {
        let set_field = format!("{field}[{i}]");
        let items = as_array(set, &set_field)?;
        if items.is_empty() {
            return Err(IpamError::EmptyRangeSet { field: set_field });
        }
        let mut parsed = ParsedSet {
            set: RangeSet {
                ranges: Vec::new(),
                source: set_field.clone(),
            },
            paths: Vec::new(),
        };
        for (j, item) in items.iter().enumerate() {
            let range_field = format!("{set_field}[{j}]");
            let range = parse_range(as_object(item, &range_field)?, &range_field)?;
            if let Some(first) = parsed
                .set
                .ranges
                .first()
                .filter(|f| !same_family(f.range_start, range.range_start))
            {
                let (v4, v6) = if first.subnet.is_ipv4() {
                    (first, &range)
                } else {
                    (&range, first)
                };
                return Err(IpamError::MixedFamilies {
                    field: set_field,
                    v4: v4.subnet.to_string(),
                    v6: v6.subnet.to_string(),
                });
            }
            parsed.set.ranges.push(range);
            parsed.paths.push(range_field);
        }
        let ranges: Vec<_> = parsed.set.ranges.iter().zip(&parsed.paths).collect();
        for (k, &a) in ranges.iter().enumerate() {
            for &b in &ranges[k + 1..] {
                check_pair(a, b)?;
            }
        }
        out.push(parsed);
    }
    Ok(out)
}

/// One range object (`{subnet, rangeStart?, rangeEnd?, gateway?}`), filled in with the
/// reference's defaults: gateway and rangeStart = network+1 (the walk skips the gateway),
/// rangeEnd = the last address (IPv4: the one before broadcast).
fn parse_range(obj: &Map<String, Value>, prefix: &str) -> Result<Range, IpamError> {
    let subnet_field = format!("{prefix}.subnet");
    let subnet_str = opt_str(obj, prefix, "subnet")?.ok_or_else(|| IpamError::MissingField {
        field: subnet_field.clone(),
    })?;
    let subnet = parse_cidr(subnet_str).ok_or_else(|| IpamError::InvalidCidr {
        field: subnet_field.clone(),
        value: subnet_str.into(),
    })?;
    if let IpNetwork::V6(v6) = subnet {
        if v6.ip().to_ipv4_mapped().is_some() {
            return Err(IpamError::MappedSubnet {
                field: subnet_field,
                value: subnet_str.into(),
            });
        }
    }
    let bits: u8 = if subnet.is_ipv4() { 32 } else { 128 };
    // Fewer than two host bits leave nothing between network and broadcast/gateway.
    if subnet.prefix() > bits - 2 {
        return Err(IpamError::SubnetTooSmall {
            field: subnet_field,
            value: subnet_str.into(),
        });
    }
    let network = subnet.network();
    if network != subnet.ip() {
        return Err(IpamError::HostBitsSet {
            field: subnet_field,
            value: subnet_str.into(),
            network,
        });
    }
    let subnet = IpNetwork::new(network, subnet.prefix()).expect("same prefix as a valid network");

    let v6 = subnet.is_ipv6();
    let first = from_u128(to_u128(network) + 1, v6);
    let last = {
        let broadcast = to_u128(subnet.broadcast());
        from_u128(if v6 { broadcast } else { broadcast - 1 }, v6)
    };

    let ip_in_subnet = |key: &str| -> Result<Option<IpAddr>, IpamError> {
        let field = format!("{prefix}.{key}");
        let Some(s) = opt_str(obj, prefix, key)? else {
            return Ok(None);
        };
        let ip = parse_ip(s).ok_or_else(|| IpamError::InvalidIp {
            field: field.clone(),
            value: s.into(),
        })?;
        if !same_family(ip, network) {
            return Err(IpamError::FamilyMismatch {
                field,
                value: ip,
                subnet: subnet.to_string(),
            });
        }
        if !subnet.contains(ip) {
            return Err(IpamError::OutsideSubnet {
                field,
                value: ip,
                subnet: subnet.to_string(),
            });
        }
        Ok(Some(ip))
    };
    let gateway = ip_in_subnet("gateway")?.unwrap_or(first);
    let range_start = ip_in_subnet("rangeStart")?.unwrap_or(first);
    let range_end = ip_in_subnet("rangeEnd")?.unwrap_or(last);
    if to_u128(range_start) > to_u128(range_end) {
        return Err(IpamError::StartAfterEnd {
            field: prefix.into(),
            start: range_start,
            end: range_end,
        });
    }
    Ok(Range {
        subnet,
        range_start,
        range_end,
        gateway,
    })
}

fn parse_routes(v: &Value, field: &str) -> Result<Vec<IpamRoute>, IpamError> {
    let mut routes = Vec::new();
    for (i, item) in as_array(v, field)?.iter().enumerate() {
        let prefix = format!("{field}[{i}]");
        let obj = as_object(item, &prefix)?;
        let dst_str = opt_str(obj, &prefix, "dst")?.ok_or_else(|| IpamError::MissingField {
            field: format!("{prefix}.dst"),
        })?;
        let dst = parse_cidr(dst_str).ok_or_else(|| IpamError::InvalidCidr {
            field: format!("{prefix}.dst"),
            value: dst_str.into(),
        })?;
        let gw = match opt_str(obj, &prefix, "gw")? {
            Some(s) => Some(parse_ip(s).ok_or_else(|| IpamError::InvalidIp {
                field: format!("{prefix}.gw"),
                value: s.into(),
            })?),
            None => None,
        };
        let options = route_options(obj, &prefix)?;
        routes.push(IpamRoute { dst, gw, options });
    }
    Ok(routes)
}

/// CNI 1.1's route fields of one `ipam.routes` entry, each in the range the kernel takes.
fn route_options(
    obj: &serde_json::Map<String, Value>,
    prefix: &str,
) -> Result<crate::cni::types::RouteOptions, IpamError> {
    let num =
        |key: &str, min: u64, max: u64, expected: &'static str| -> Result<Option<u64>, IpamError> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => match v.as_u64() {
                    Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
                    _ => Err(IpamError::WrongType {
                        field: format!("{prefix}.{key}"),
                        expected,
                        value: v.to_string(),
                    }),
                },
            }
        };
    let u32_of = |n: Option<u64>| n.map(|n| u32::try_from(n).expect("checked range"));
    Ok(crate::cni::types::RouteOptions {
        mtu: u32_of(num("mtu", 68, 65535, "an integer from 68 to 65535")?),
        advmss: u32_of(num("advmss", 1, 65535, "an integer from 1 to 65535")?),
        priority: u32_of(num(
            "priority",
            0,
            u64::from(u32::MAX),
            "an integer from 0 to 4294967295",
        )?),
        table: u32_of(num(
            "table",
            1,
            u64::from(u32::MAX),
            "a table id from 1 to 4294967295",
        )?),
        scope: num("scope", 0, 255, "a scope from 0 to 255")?
            .map(|n| u8::try_from(n).expect("checked range")),
    })
}

/// `addr/prefix` with the prefix required (unlike `IpNetwork::from_str`, which takes a
/// bare address as a host route); host bits are kept, as Go's `ParseCIDR` result is.
pub(crate) fn parse_cidr(s: &str) -> Option<IpNetwork> {
    let (addr, prefix) = s.split_once('/')?;
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let addr: IpAddr = addr.parse().ok()?;
    IpNetwork::new(addr, prefix.parse().ok()?).ok()
}

pub(crate) fn parse_ip(s: &str) -> Option<IpAddr> {
    s.parse().ok().map(canonical_ip)
}

/// The value under `key`, matched exactly or else ignoring ASCII case; JSON `null` counts
/// as absent (as for Go's decoder).
fn get<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key)
        .or_else(|| {
            obj.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(key))
                .map(|(_, v)| v)
        })
        .filter(|v| !v.is_null())
}

fn opt_str<'a>(
    obj: &'a Map<String, Value>,
    prefix: &str,
    key: &str,
) -> Result<Option<&'a str>, IpamError> {
    match get(obj, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(wrong_type(&format!("{prefix}.{key}"), "a string", other)),
    }
}

fn as_object<'a>(v: &'a Value, field: &str) -> Result<&'a Map<String, Value>, IpamError> {
    v.as_object()
        .ok_or_else(|| wrong_type(field, "an object", v))
}

fn as_array<'a>(v: &'a Value, field: &str) -> Result<&'a Vec<Value>, IpamError> {
    v.as_array().ok_or_else(|| wrong_type(field, "a list", v))
}

fn wrong_type(field: &str, expected: &'static str, value: &Value) -> IpamError {
    IpamError::WrongType {
        field: field.into(),
        expected,
        value: value.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn parse(v: Value) -> Result<HostLocalConfig, IpamError> {
        HostLocalConfig::parse(&v, None)
    }

    #[test]
    fn defaults_ipv4() {
        let c =
            parse(json!({"type": "host-local", "ranges": [[{"subnet": "10.1.0.0/24"}]]})).unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/var/lib/cni/networks"));
        assert_eq!(c.resolv_conf, None);
        assert!(c.routes.is_empty());
        let r = &c.range_sets[0].ranges[0];
        assert_eq!(r.subnet, "10.1.0.0/24".parse::<IpNetwork>().unwrap());
        assert_eq!(
            (r.range_start, r.range_end, r.gateway),
            (ip("10.1.0.1"), ip("10.1.0.254"), ip("10.1.0.1"))
        );
        assert_eq!(c.range_sets[0].source, "ipam.ranges[0]");
    }

    #[test]
    fn defaults_ipv6_end_at_last_address() {
        let c = parse(json!({"ranges": [[{"subnet": "fd00:1::/120"}]]})).unwrap();
        let r = &c.range_sets[0].ranges[0];
        assert_eq!(
            (r.range_start, r.range_end, r.gateway),
            (ip("fd00:1::1"), ip("fd00:1::ff"), ip("fd00:1::1"))
        );
    }

    #[test]
    fn explicit_values_kept() {
        let c = parse(json!({
            "dataDir": "/tmp/x", "resolvConf": "/etc/r.conf",
            "ranges": [[{"subnet": "10.1.0.0/16", "rangeStart": "10.1.2.0", "rangeEnd": "10.1.2.255", "gateway": "10.1.255.254"}]],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.1.0.1"}],
        }))
        .unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.resolv_conf, Some(PathBuf::from("/etc/r.conf")));
        let r = &c.range_sets[0].ranges[0];
        assert_eq!(
            (r.range_start, r.range_end, r.gateway),
            (ip("10.1.2.0"), ip("10.1.2.255"), ip("10.1.255.254"))
        );
        assert_eq!(
            c.routes,
            vec![
                IpamRoute {
                    dst: "0.0.0.0/0".parse().unwrap(),
                    gw: None,
                    options: Default::default(),
                },
                IpamRoute {
                    dst: "192.168.0.0/16".parse().unwrap(),
                    gw: Some(ip("10.1.0.1")),
                    options: Default::default(),
                },
            ]
        );
    }

    #[test]
    fn order_is_runtime_then_legacy_then_ranges() {
        let runtime = json!([[{"Subnet": "10.3.0.0/24", "RangeStart": "10.3.0.10"}]]);
        let c = HostLocalConfig::parse(
            &json!({"subnet": "10.2.0.0/24", "rangeEnd": "10.2.0.20", "ranges": [[{"subnet": "10.1.0.0/24"}], [{"subnet": "fd00::/64"}]]}),
            Some(&runtime),
        )
        .unwrap();
        let subnets: Vec<_> = c
            .range_sets
            .iter()
            .map(|s| s.ranges[0].subnet.to_string())
            .collect();
        assert_eq!(
            subnets,
            ["10.3.0.0/24", "10.2.0.0/24", "10.1.0.0/24", "fd00::/64"]
        );
        let sources: Vec<_> = c.range_sets.iter().map(|s| s.source.as_str()).collect();
        assert_eq!(
            sources,
            [
                "runtimeConfig.ipRanges[0]",
                "ipam.subnet",
                "ipam.ranges[0]",
                "ipam.ranges[1]"
            ]
        );
        assert_eq!(c.range_sets[0].ranges[0].range_start, ip("10.3.0.10"));
        assert_eq!(c.range_sets[1].ranges[0].range_end, ip("10.2.0.20"));
    }

    #[test]
    fn keys_match_ignoring_case_and_null_is_absent() {
        let c = parse(
            json!({"DataDir": "/d", "Ranges": [[{"SUBNET": "10.1.0.0/24", "gateway": null}]]}),
        )
        .unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/d"));
        assert_eq!(c.range_sets[0].ranges[0].gateway, ip("10.1.0.1"));
        // An empty runtime list or a null adds nothing.
        let c = HostLocalConfig::parse(
            &json!({"ranges": [[{"subnet": "10.1.0.0/24"}]]}),
            Some(&json!([])),
        )
        .unwrap();
        assert_eq!(c.range_sets.len(), 1);
        let c = HostLocalConfig::parse(
            &json!({"ranges": [[{"subnet": "10.1.0.0/24"}]]}),
            Some(&Value::Null),
        )
        .unwrap();
        assert_eq!(c.range_sets.len(), 1);
    }

    #[test]
    fn smallest_allocatable_subnets() {
        for s in ["10.0.0.0/30", "fd00::/126"] {
            parse(json!({"ranges": [[{"subnet": s}]]})).unwrap();
        }
    }

    #[test]
    fn bad_configs() {
        let cases: Vec<(Value, &str)> = vec![
            (json!("x"), r#"ipam: expected an object, got "x""#),
            (json!({}), "ipam: no IP ranges given"),
            (json!({"ranges": []}), "ipam: no IP ranges given"),
            (json!({"rangeStart": "10.0.0.1"}), "ipam: no IP ranges given"),
            (json!({"ranges": {}}), "ipam.ranges: expected a list, got {}"),
            (json!({"ranges": [[]]}), "ipam.ranges[0]: empty range set"),
            (json!({"ranges": [[{"rangeStart": "10.0.0.1"}]]}), "ipam.ranges[0][0].subnet: missing"),
            (json!({"ranges": [[{"subnet": 5}]]}), "ipam.ranges[0][0].subnet: expected a string, got 5"),
            (
                json!({"ranges": [[{"subnet": "10.1.0.0/24"}, {"subnet": "10.0.0.0/33"}]]}),
                r#"ipam.ranges[0][1].subnet "10.0.0.0/33": invalid CIDR"#,
            ),
            (json!({"ranges": [[{"subnet": "10.0.0.0"}]]}), r#"ipam.ranges[0][0].subnet "10.0.0.0": invalid CIDR"#),
            (json!({"ranges": [[{"subnet": "10.0.0.0/+8"}]]}), r#"ipam.ranges[0][0].subnet "10.0.0.0/+8": invalid CIDR"#),
            (json!({"ranges": [[{"subnet": "10.0.0.0/31"}]]}), r#"ipam.ranges[0][0].subnet "10.0.0.0/31": too small to allocate from"#),
            (json!({"ranges": [[{"subnet": "10.0.0.7/32"}]]}), r#"ipam.ranges[0][0].subnet "10.0.0.7/32": too small to allocate from"#),
            (json!({"ranges": [[{"subnet": "fd00::/127"}]]}), r#"ipam.ranges[0][0].subnet "fd00::/127": too small to allocate from"#),
            (json!({"ranges": [[{"subnet": "fd00::/128"}]]}), r#"ipam.ranges[0][0].subnet "fd00::/128": too small to allocate from"#),
            (
                json!({"ranges": [[{"subnet": "10.0.0.1/24"}]]}),
                r#"ipam.ranges[0][0].subnet "10.0.0.1/24": host bits set, the network address is 10.0.0.0"#,
            ),
            (
                json!({"ranges": [[{"subnet": "::ffff:10.0.0.0/120"}]]}),
                r#"ipam.ranges[0][0].subnet "::ffff:10.0.0.0/120": IPv4-mapped IPv6 subnets are not supported"#,
            ),
            (
                json!({"ranges": [[{"subnet": "10.0.0.0/24", "gateway": "10.0.1.1"}]]}),
                "ipam.ranges[0][0].gateway 10.0.1.1: not inside subnet 10.0.0.0/24",
            ),
            (
                json!({"ranges": [[{"subnet": "10.0.0.0/24", "gateway": "fd00::1"}]]}),
                "ipam.ranges[0][0].gateway fd00::1: not the same address family as subnet 10.0.0.0/24",
            ),
            (
                json!({"ranges": [[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.300"}]]}),
                r#"ipam.ranges[0][0].rangeStart "10.0.0.300": invalid IP address"#,
            ),
            (
                json!({"ranges": [[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.1.5"}]]}),
                "ipam.ranges[0][0].rangeStart 10.0.1.5: not inside subnet 10.0.0.0/24",
            ),
            (
                json!({"ranges": [[{"subnet": "10.0.0.0/24", "rangeEnd": "10.0.1.5"}]]}),
                "ipam.ranges[0][0].rangeEnd 10.0.1.5: not inside subnet 10.0.0.0/24",
            ),
            (
                json!({"ranges": [[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.9", "rangeEnd": "10.0.0.8"}]]}),
                "ipam.ranges[0][0]: rangeStart 10.0.0.9 is after rangeEnd 10.0.0.8",
            ),
            (
                json!({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "fd00::/64"}]]}),
                "ipam.ranges[0]: range set mixes IPv4 (10.0.0.0/24) and IPv6 (fd00::/64)",
            ),
            (
                json!({"ranges": [[{"subnet": "10.0.0.0/24", "rangeEnd": "10.0.0.100"}, {"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.100"}]]}),
                "ipam.ranges[0][0] (10.0.0.1-10.0.0.100) overlaps ipam.ranges[0][1] (10.0.0.100-10.0.0.254)",
            ),
            (
                json!({"ranges": [[{"subnet": "10.0.0.0/16"}], [{"subnet": "10.0.5.0/24"}]]}),
                "ipam.ranges[0][0] (10.0.0.1-10.0.255.254) overlaps ipam.ranges[1][0] (10.0.5.1-10.0.5.254)",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "ranges": [[{"subnet": "10.0.0.0/24"}]]}),
                "ipam (10.0.0.1-10.0.0.254) overlaps ipam.ranges[0][0] (10.0.0.1-10.0.0.254)",
            ),
            (json!({"subnet": "10.0.0.0/24", "gateway": "x"}), r#"ipam.gateway "x": invalid IP address"#),
            (json!({"dataDir": 1, "subnet": "10.0.0.0/24"}), "ipam.dataDir: expected a string, got 1"),
            (json!({"subnet": "10.0.0.0/24", "routes": [{"gw": "10.0.0.1"}]}), "ipam.routes[0].dst: missing"),
            (json!({"subnet": "10.0.0.0/24", "routes": [{"dst": "default"}]}), r#"ipam.routes[0].dst "default": invalid CIDR"#),
            (
                json!({"subnet": "10.0.0.0/24", "routes": [{"dst": "0.0.0.0/0", "gw": "gw"}]}),
                r#"ipam.routes[0].gw "gw": invalid IP address"#,
            ),
        ];
        for (conf, want) in cases {
            let e = parse(conf.clone()).expect_err(&conf.to_string());
            assert_eq!(e.cni_code(), crate::cni::error::code::INVALID_CONFIG, "{e}");
            assert!(
                e.to_string().starts_with(want),
                "config {conf}\n got: {e}\nwant: {want}"
            );
        }
    }

    #[test]
    fn runtime_ranges_errors_name_their_field() {
        let e =
            HostLocalConfig::parse(&json!({}), Some(&json!([[{"subnet": "bad"}]]))).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"runtimeConfig.ipRanges[0][0].subnet "bad": invalid CIDR"#
        );
        let e = HostLocalConfig::parse(
            &json!({"ranges": [[{"subnet": "10.0.0.0/24"}]]}),
            Some(&json!([[{"subnet": "10.0.0.0/25"}]])),
        )
        .unwrap_err();
        assert!(
            matches!(e, IpamError::RangesOverlap { ref first, .. } if first == "runtimeConfig.ipRanges[0][0]"),
            "{e}"
        );
    }

    #[test]
    fn requested_style_ip_parsing() {
        assert_eq!(parse_ip("::ffff:10.0.0.5"), Some(ip("10.0.0.5")));
        assert_eq!(parse_ip("010.0.0.5"), None);
        assert_eq!(
            parse_cidr("10.0.0.5/24").map(|n| n.ip()),
            Some(ip("10.0.0.5"))
        );
        assert_eq!(parse_cidr("10.0.0.0/"), None);
    }
}
