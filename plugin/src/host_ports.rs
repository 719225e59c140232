//! The `portMappings` capability: host ports forwarded to the pod, without iptables.
//!
//! Input as runtimes send it in `runtimeConfig.portMappings`: entries with `hostPort`,
//! `containerPort`, `protocol` (tcp by default, udp, sctp) and `hostIP`, in camelCase or
//! containerd's Capitalized spelling. `hostIP` empty means every node address of each
//! family the pod has; `0.0.0.0` every IPv4 node address, `::` every IPv6 one; anything
//! else that one address. Each entry becomes one [`PortEntry`] per matching pod address:
//! the key of the node-wide port-mapping map and its target.

use std::net::IpAddr;

use ebpf_cni_maps::{IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP};
use serde_json::Value;

use crate::cni::{code, config::get_ci, config::NetConf};

/// Port mappings that cannot be installed; each names the entry and the value at fault.
#[derive(Debug, thiserror::Error)]
pub enum PortmapError {
    #[error("runtimeConfig.portMappings {0} is not a list")]
    NotAList(Value),
    #[error("runtimeConfig.portMappings[{index}] {entry}: {problem}")]
    Entry {
        index: usize,
        entry: Value,
        problem: EntryProblem,
    },
    #[error("runtimeConfig.portMappings: hostPort {host_port}/{} on {} needs an {} address, and the pod has none", .protocol.as_str(), shown(.host_ip), if *.ipv4 { "IPv4" } else { "IPv6" })]
    NoPodAddress {
        host_port: u16,
        protocol: Protocol,
        host_ip: HostIp,
        /// The family the mapping needs.
        ipv4: bool,
    },
}

/// What is wrong with one `portMappings` entry (part of [`PortmapError::Entry`]'s message).
#[derive(Debug, thiserror::Error)]
pub enum EntryProblem {
    #[error("is not an object")]
    NotAnObject,
    #[error("{0} is missing")]
    Missing(&'static str),
    #[error("{field} {value} is not a port number (1-65535)")]
    NotAPort { field: &'static str, value: Value },
    #[error("protocol {0:?} is not one of tcp, udp, sctp")]
    UnknownProtocol(String),
    #[error("protocol {0} is not a string")]
    ProtocolNotAString(Value),
    #[error("hostIP {0:?} is a multicast address")]
    MulticastHostIp(String),
    #[error("hostIP {0:?} is not an IP address")]
    HostIpNotAnIp(String),
    #[error("hostIP {0} is not a string")]
    HostIpNotAString(Value),
    #[error("hostPort {host_port}/{} is already mapped to containerPort {container_port} by an earlier entry", .protocol.as_str())]
    AlreadyMapped {
        host_port: u16,
        protocol: Protocol,
        container_port: u16,
    },
}

impl PortmapError {
    pub fn cni_code(&self) -> u32 {
        code::INVALID_CONFIG
    }
}

fn shown(host_ip: &HostIp) -> String {
    match host_ip {
        HostIp::One(ip) => ip.to_string(),
        HostIp::AnyV4 => "0.0.0.0".to_owned(),
        HostIp::AnyV6 => "::".to_owned(),
        HostIp::Any => "any address".to_owned(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => IPPROTO_TCP,
            Protocol::Udp => IPPROTO_UDP,
            Protocol::Sctp => IPPROTO_SCTP,
        }
    }

    pub fn from_number(n: u8) -> Option<Self> {
        match n {
            IPPROTO_TCP => Some(Protocol::Tcp),
            IPPROTO_UDP => Some(Protocol::Udp),
            IPPROTO_SCTP => Some(Protocol::Sctp),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// Which node addresses a mapping answers on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HostIp {
    /// `hostIP` empty or absent: every node address of each family the pod has.
    Any,
    /// `0.0.0.0`: every IPv4 node address.
    AnyV4,
    /// `::`: every IPv6 node address.
    AnyV6,
    One(IpAddr),
}

/// One validated `portMappings` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortMapping {
    pub host_ip: HostIp,
    pub host_port: u16,
    pub container_port: u16,
    pub protocol: Protocol,
    /// A wildcard mapping also takes the node's own connections to loopback
    /// (`hostPortsOnLoopback`, the network's setting).
    pub loopback: bool,
}

/// A mapping made concrete for one pod address: `host` is `None` for "every node address
/// of the family of `pod_ip`".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortEntry {
    pub host: Option<IpAddr>,
    pub host_port: u16,
    pub protocol: Protocol,
    pub pod_ip: IpAddr,
    pub pod_port: u16,
    /// The pod's gateway in that family: hairpin packets come from it.
    pub gateway: Option<IpAddr>,
    /// See [`PortMapping::loopback`].
    pub loopback: bool,
}

impl PortEntry {
    /// `0.0.0.0:8080/tcp`, `[fd00::1]:80/udp`.
    pub fn describe_host(&self) -> String {
        let host = match self.host {
            Some(ip) => ip,
            None if self.pod_ip.is_ipv4() => IpAddr::from([0u8; 4]),
            None => IpAddr::from([0u16; 8]),
        };
        let host = if host.is_ipv6() {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        format!("{host}:{}/{}", self.host_port, self.protocol.as_str())
    }
}

fn invalid(index: usize, entry: &Value, problem: EntryProblem) -> PortmapError {
    PortmapError::Entry {
        index,
        entry: entry.clone(),
        problem,
    }
}

fn port(
    index: usize,
    entry: &Value,
    obj: &serde_json::Map<String, Value>,
    field: &'static str,
) -> Result<u16, PortmapError> {
    let v =
        get_ci(obj, field).ok_or_else(|| invalid(index, entry, EntryProblem::Missing(field)))?;
    match v.as_u64() {
        Some(p) if (1..=65535).contains(&p) => Ok(p as u16),
        _ => Err(invalid(
            index,
            entry,
            EntryProblem::NotAPort {
                field,
                value: v.clone(),
            },
        )),
    }
}

/// Parses `runtimeConfig.portMappings` (absent or null: none). Identical entries are merged;
/// two entries claiming one host port with different targets are refused.
pub fn mappings(conf: &NetConf) -> Result<Vec<PortMapping>, PortmapError> {
    let Some(v) = conf.runtime.capability("portMappings") else {
        return Ok(Vec::new());
    };
    let list = v
        .as_array()
        .ok_or_else(|| PortmapError::NotAList(v.clone()))?;
    let mut out: Vec<PortMapping> = Vec::new();
    for (i, entry) in list.iter().enumerate() {
        let obj = entry
            .as_object()
            .ok_or_else(|| invalid(i, entry, EntryProblem::NotAnObject))?;
        let host_port = port(i, entry, obj, "hostPort")?;
        let container_port = port(i, entry, obj, "containerPort")?;
        let protocol = match get_ci(obj, "protocol") {
            None | Some(Value::Null) => Protocol::Tcp,
            Some(Value::String(s)) if s.is_empty() => Protocol::Tcp,
            Some(Value::String(s)) => match s.to_ascii_lowercase().as_str() {
                "tcp" => Protocol::Tcp,
                "udp" => Protocol::Udp,
                "sctp" => Protocol::Sctp,
                _ => return Err(invalid(i, entry, EntryProblem::UnknownProtocol(s.clone()))),
            },
            Some(other) => {
                return Err(invalid(
                    i,
                    entry,
                    EntryProblem::ProtocolNotAString(other.clone()),
                ))
            }
        };
        let host_ip = match get_ci(obj, "hostIP") {
            None | Some(Value::Null) => HostIp::Any,
            Some(Value::String(s)) if s.is_empty() => HostIp::Any,
            Some(Value::String(s)) => match s.parse::<IpAddr>() {
                Ok(ip) if ip.is_unspecified() && ip.is_ipv4() => HostIp::AnyV4,
                Ok(ip) if ip.is_unspecified() => HostIp::AnyV6,
                Ok(ip) if ip.is_multicast() => {
                    return Err(invalid(i, entry, EntryProblem::MulticastHostIp(s.clone())))
                }
                Ok(ip) => HostIp::One(ip),
                Err(_) => return Err(invalid(i, entry, EntryProblem::HostIpNotAnIp(s.clone()))),
            },
            Some(other) => {
                return Err(invalid(
                    i,
                    entry,
                    EntryProblem::HostIpNotAString(other.clone()),
                ))
            }
        };
        let m = PortMapping {
            host_ip,
            host_port,
            container_port,
            protocol,
            loopback: conf.host_ports_on_loopback,
        };
        if out.contains(&m) {
            continue;
        }
        if let Some(prev) = out.iter().find(|o| {
            o.host_ip == m.host_ip && o.host_port == m.host_port && o.protocol == m.protocol
        }) {
            return Err(invalid(
                i,
                entry,
                EntryProblem::AlreadyMapped {
                    host_port: m.host_port,
                    protocol: m.protocol,
                    container_port: prev.container_port,
                },
            ));
        }
        out.push(m);
    }
    Ok(out)
}

/// Makes the mappings concrete for the pod's addresses (with their gateways). A mapping for
/// one family only (`0.0.0.0`, `::`, or one address) needs a pod address of that family.
pub fn entries(
    mappings: &[PortMapping],
    pod: &[(IpAddr, Option<IpAddr>)],
) -> Result<Vec<PortEntry>, PortmapError> {
    let mut out = Vec::new();
    for m in mappings {
        let families: &[bool] = match m.host_ip {
            HostIp::Any => &[true, false],
            HostIp::AnyV4 => &[true],
            HostIp::AnyV6 => &[false],
            HostIp::One(ip) => {
                if ip.is_ipv4() {
                    &[true]
                } else {
                    &[false]
                }
            }
        };
        let mut matched = false;
        for &v4 in families {
            // The first address of the family, as the reference plugin does.
            let Some(&(pod_ip, gateway)) = pod.iter().find(|(ip, _)| ip.is_ipv4() == v4) else {
                continue;
            };
            matched = true;
            out.push(PortEntry {
                host: match m.host_ip {
                    HostIp::One(ip) => Some(ip),
                    _ => None,
                },
                host_port: m.host_port,
                protocol: m.protocol,
                pod_ip,
                pod_port: m.container_port,
                gateway,
                loopback: m.loopback,
            });
        }
        if !matched {
            return Err(PortmapError::NoPodAddress {
                host_port: m.host_port,
                protocol: m.protocol,
                host_ip: m.host_ip,
                ipv4: families == [true],
            });
        }
    }
    Ok(out)
}

/// A socket of the node that receives on a port: a listening TCP socket or an unconnected
/// UDP one, as `/proc/net/{tcp,udp}{,6}` list them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Listener {
    /// IPv4-mapped addresses (IPv6 sockets listed with an IPv4 address) made IPv4.
    pub addr: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
}

/// `/proc/<...>/net/tcp` state of a listening socket (`TCP_LISTEN`).
const TCP_LISTEN: &str = "0A";

/// The listeners in one `/proc/net/{tcp,udp}{,6}` table. Addresses there are the kernel's
/// in-memory words printed in hex (native order), ports in host order.
fn parse_proc_net(text: &str, protocol: Protocol) -> Vec<Listener> {
    let hex_ip = |s: &str| -> Option<IpAddr> {
        let word = |w: &str| u32::from_str_radix(w, 16).ok().map(u32::to_ne_bytes);
        match s.len() {
            8 => Some(IpAddr::from(word(s)?)),
            32 => {
                let mut b = [0u8; 16];
                for i in 0..4 {
                    b[i * 4..i * 4 + 4].copy_from_slice(&word(s.get(i * 8..i * 8 + 8)?)?);
                }
                let v6 = std::net::Ipv6Addr::from(b);
                Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4))
            }
            _ => None,
        }
    };
    let endpoint = |s: &str| -> Option<(IpAddr, u16)> {
        let (ip, port) = s.split_once(':')?;
        Some((hex_ip(ip)?, u16::from_str_radix(port, 16).ok()?))
    };
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let mut f = line.split_whitespace().skip(1);
            let (addr, port) = endpoint(f.next()?)?;
            let (_, remote_port) = endpoint(f.next()?)?;
            let state = f.next()?;
            let receives = match protocol {
                Protocol::Tcp => state == TCP_LISTEN,
                _ => remote_port == 0,
            };
            receives.then_some(Listener {
                addr,
                port,
                protocol,
            })
        })
        .collect()
}

/// The node's listeners of `protocols` (the calling thread's network namespace), asked of
/// the kernel over sock_diag (see `netlink::sockets::listeners`); a table the kernel cannot
/// dump (no diag module) is read from `/proc/net` instead, and one that cannot be read
/// either is skipped (SCTP is not listed).
pub fn node_listeners(protocols: &[Protocol]) -> Vec<Listener> {
    let mut out = Vec::new();
    for (table, protocol, family) in [
        ("tcp", Protocol::Tcp, libc::AF_INET),
        ("tcp6", Protocol::Tcp, libc::AF_INET6),
        ("udp", Protocol::Udp, libc::AF_INET),
        ("udp6", Protocol::Udp, libc::AF_INET6),
    ] {
        if !protocols.contains(&protocol) {
            continue;
        }
        match crate::netlink::sockets::listeners(protocol.number(), family as u8) {
            Ok(found) => out.extend(found.into_iter().map(|(addr, port)| Listener {
                addr: match addr {
                    IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
                    v4 => v4,
                },
                port,
                protocol,
            })),
            Err(e) => {
                log::debug!("listing the node's {table} listeners over sock_diag: {e}");
                let path = format!("/proc/thread-self/net/{table}");
                match std::fs::read_to_string(&path) {
                    Ok(text) => out.extend(parse_proc_net(&text, protocol)),
                    Err(e) => log::debug!("not checking the node's listeners in {path}: {e}"),
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Whether mapping `e` takes what `l` would receive: same port and protocol, and an address
/// the mapping answers on (a wildcard one: every node address of its family, and loopback
/// unless `hostPortsOnLoopback` is false). An IPv6 wildcard listener is taken as dual-stack.
fn takes(e: &PortEntry, l: &Listener, node_addrs: &[IpAddr]) -> bool {
    if l.port != e.host_port || l.protocol != e.protocol {
        return false;
    }
    let v4 = e.pod_ip.is_ipv4();
    if l.addr.is_unspecified() {
        return l.addr.is_ipv6() || v4;
    }
    if l.addr.is_ipv4() != v4 {
        return false;
    }
    match e.host {
        Some(h) => h == l.addr,
        None if l.addr.is_loopback() => e.loopback,
        None => node_addrs.contains(&l.addr),
    }
}

/// One line per node listener whose traffic the pod's mappings take, for the operator.
pub fn taken_listeners(
    entries: &[PortEntry],
    listeners: &[Listener],
    node_addrs: &[IpAddr],
) -> Vec<String> {
    let mut out = std::collections::BTreeSet::new();
    for e in entries {
        for l in listeners.iter().filter(|l| takes(e, l, node_addrs)) {
            let at = match l.addr {
                IpAddr::V6(a) => format!("[{a}]:{}", l.port),
                a => format!("{a}:{}", l.port),
            };
            let what = if l.addr.is_loopback() {
                "the node's own connections to it now reach the pod (\"hostPortsOnLoopback\": false leaves loopback to the node)"
            } else {
                "what is sent to that port from outside the node, from pods and from the node itself now reaches the pod"
            };
            out.insert(format!(
                "host port {} of the pod: a process of the node already listens on {at}/{}; {what}",
                e.describe_host(),
                l.protocol.as_str()
            ));
        }
    }
    out.into_iter().collect()
}

/// ADD: warns (log and stderr) about each listener of the node the pod's mappings take.
pub fn warn_taken_listeners(entries: &[PortEntry], node_addrs: &[IpAddr]) {
    if entries.is_empty() {
        return;
    }
    let mut protocols: Vec<Protocol> = entries.iter().map(|e| e.protocol).collect();
    protocols.sort();
    protocols.dedup();
    for line in taken_listeners(entries, &node_listeners(&protocols), node_addrs) {
        crate::logging::warn_operator(&line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn proc_net_tables_parse_to_listeners() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:0035 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F90 0100007F:A1B2 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 100 0 0 10 0
";
        let ip4 = |s: &str| -> IpAddr { s.parse().unwrap() };
        let got = parse_proc_net(tcp, Protocol::Tcp);
        // The loopback word as a little-endian machine prints it.
        let lo = if cfg!(target_endian = "little") {
            ip4("127.0.0.1")
        } else {
            ip4("1.0.0.127")
        };
        assert_eq!(
            got,
            [Listener {
                addr: lo,
                port: 53,
                protocol: Protocol::Tcp
            }],
            "only the LISTEN socket"
        );
        let udp6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  10: 00000000000000000000000000000000:0035 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 3 2 0000000000000000 0
  11: 0000000000000000FFFF00000100007F:1388 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4 2 0000000000000000 0
  12: 00000000000000000000000001000000:0050 00000000000000000000000001000000:3039 01 00000000:00000000 00:00000000 00000000     0        0 5 2 0000000000000000 0
";
        let got = parse_proc_net(udp6, Protocol::Udp);
        if cfg!(target_endian = "little") {
            assert_eq!(
                got,
                [
                    Listener {
                        addr: "::".parse().unwrap(),
                        port: 53,
                        protocol: Protocol::Udp
                    },
                    Listener {
                        addr: ip4("127.0.0.1"),
                        port: 5000,
                        protocol: Protocol::Udp
                    }
                ],
                "unconnected sockets only, v4-mapped made IPv4"
            );
        }
    }

    #[test]
    fn listeners_a_mapping_takes() {
        let node: IpAddr = "192.0.2.1".parse().unwrap();
        let entry = |host: Option<&str>, pod: &str, loopback: bool| PortEntry {
            host: host.map(|h| h.parse().unwrap()),
            host_port: 53,
            protocol: Protocol::Udp,
            pod_ip: pod.parse().unwrap(),
            pod_port: 53,
            gateway: None,
            loopback,
        };
        let l = |a: &str| Listener {
            addr: a.parse().unwrap(),
            port: 53,
            protocol: Protocol::Udp,
        };
        let wild4 = entry(None, "10.0.0.5", true);
        let wild4_no_lo = entry(None, "10.0.0.5", false);
        let wild6 = entry(None, "fd00::5", true);
        let one = entry(Some("192.0.2.1"), "10.0.0.5", true);
        let cases = [
            (&wild4, l("127.0.0.53"), true),
            (&wild4_no_lo, l("127.0.0.53"), false),
            (&wild4, l("0.0.0.0"), true),
            (&wild4_no_lo, l("0.0.0.0"), true),
            (&wild4, l("::"), true),
            (&wild6, l("0.0.0.0"), false),
            (&wild6, l("::1"), true),
            (&wild4, l("192.0.2.1"), true),
            (&wild4, l("198.51.100.7"), false),
            (&one, l("192.0.2.1"), true),
            (&one, l("127.0.0.1"), false),
        ];
        for (e, listener, want) in cases {
            assert_eq!(takes(e, &listener, &[node]), want, "{e:?} {listener:?}");
        }
        let tcp = Listener {
            protocol: Protocol::Tcp,
            ..l("0.0.0.0")
        };
        assert!(!takes(&wild4, &tcp, &[node]), "another protocol");
        let lines = taken_listeners(&[wild4], &[l("127.0.0.53"), l("10.1.1.1")], &[node]);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("127.0.0.53:53/udp") && lines[0].contains("hostPortsOnLoopback"),
            "{lines:?}"
        );
    }

    fn conf(pm: Value) -> NetConf {
        NetConf::parse(json!({
            "cniVersion": "1.0.0", "name": "n", "type": "ebpf-cni",
            "runtimeConfig": {"portMappings": pm}
        }))
        .expect("valid config")
    }

    #[test]
    fn camel_and_capitalized_keys() {
        let m = mappings(&conf(json!([
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": ""},
            {"HostPort": 5353, "ContainerPort": 53, "Protocol": "UDP", "HostIP": "0.0.0.0"},
            {"hostPort": 9000, "containerPort": 9000, "protocol": "sctp", "hostIP": "::"},
            {"hostPort": 81, "containerPort": 80, "hostIP": "192.0.2.1"}
        ])))
        .unwrap();
        assert_eq!(m.len(), 4);
        assert_eq!(m[0].host_ip, HostIp::Any);
        assert_eq!(m[1].protocol, Protocol::Udp);
        assert_eq!(m[1].host_ip, HostIp::AnyV4);
        assert_eq!((m[1].host_port, m[1].container_port), (5353, 53));
        assert_eq!(m[2].host_ip, HostIp::AnyV6);
        assert_eq!(m[2].protocol, Protocol::Sctp);
        assert_eq!(m[3].protocol, Protocol::Tcp, "tcp is the default");
        assert_eq!(m[3].host_ip, HostIp::One("192.0.2.1".parse().unwrap()));
    }

    #[test]
    fn invalid_entries_name_the_entry() {
        for (pm, needle) in [
            (json!([{"hostPort": 0, "containerPort": 80}]), "[0]"),
            (
                json!([{"hostPort": 80, "containerPort": 80}, {"hostPort": 65536, "containerPort": 80}]),
                "[1]",
            ),
            (
                json!([{"hostPort": 80, "containerPort": -1}]),
                "containerPort",
            ),
            (
                json!([{"hostPort": 80, "containerPort": 80, "protocol": "icmp"}]),
                "icmp",
            ),
            (
                json!([{"hostPort": 80, "containerPort": 80, "hostIP": "nonsense"}]),
                "nonsense",
            ),
            (json!([{"hostPort": "80", "containerPort": 80}]), "hostPort"),
            (json!([{"containerPort": 80}]), "hostPort is missing"),
            (json!({"hostPort": 80}), "not a list"),
            (
                json!([{"hostPort": 80, "containerPort": 80}, {"hostPort": 80, "containerPort": 81}]),
                "earlier entry",
            ),
        ] {
            let e = mappings(&conf(pm.clone())).unwrap_err();
            assert_eq!(e.cni_code(), code::INVALID_CONFIG, "{pm}");
            assert!(e.to_string().contains(needle), "{pm}: {e}");
        }
    }

    #[test]
    fn loopback_follows_the_network_setting() {
        let v4: IpAddr = "10.0.0.5".parse().unwrap();
        let pm = json!([{"hostPort": 53, "containerPort": 53, "protocol": "udp"}]);
        let on = mappings(&conf(pm.clone())).unwrap();
        assert!(
            on[0].loopback,
            "the default is portmap's: loopback included"
        );
        let mut off = conf(pm);
        off.host_ports_on_loopback = false;
        let off = mappings(&off).unwrap();
        assert!(!off[0].loopback);
        assert!(!entries(&off, &[(v4, None)]).unwrap()[0].loopback);
    }

    #[test]
    fn identical_entries_merge_and_null_means_none() {
        let m = mappings(&conf(json!([
            {"hostPort": 80, "containerPort": 80},
            {"hostPort": 80, "containerPort": 80, "protocol": "tcp"}
        ])))
        .unwrap();
        assert_eq!(m.len(), 1);
        assert!(mappings(&conf(Value::Null)).unwrap().is_empty());
    }

    #[test]
    fn entries_follow_the_pod_families() {
        let v4: IpAddr = "10.0.0.5".parse().unwrap();
        let gw4: IpAddr = "10.0.0.1".parse().unwrap();
        let v6: IpAddr = "fd00::5".parse().unwrap();
        let m = mappings(&conf(json!([
            {"hostPort": 8080, "containerPort": 80},
            {"hostPort": 8443, "containerPort": 443, "hostIP": "0.0.0.0"}
        ])))
        .unwrap();
        let dual = entries(&m, &[(v4, Some(gw4)), (v6, None)]).unwrap();
        assert_eq!(dual.len(), 3);
        assert_eq!(dual[0].pod_ip, v4);
        assert_eq!(dual[0].gateway, Some(gw4));
        assert_eq!(dual[1].pod_ip, v6);
        assert_eq!(dual[1].describe_host(), "[::]:8080/tcp");
        assert_eq!(dual[2].describe_host(), "0.0.0.0:8443/tcp");
        let only6 = entries(&m[..1], &[(v6, None)]).unwrap();
        assert_eq!(only6.len(), 1);
        let e = entries(&m, &[(v6, None)]).unwrap_err();
        assert!(e.to_string().contains("IPv4"), "{e}");
    }
}
