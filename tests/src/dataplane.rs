//! ebpf-cni's node-wide dataplane state, read — and, for CHECK tests, damaged — without
//! going through the plugin: the pinned maps through `bpftool`, the pin layout under the
//! node's directory, and `ebpf-cni inspect --json` for comparison.
//!
//! The layouts decoded here are the contract of `maps/` (little-endian integers):
//! `ECNI_ENDPOINTS` maps a 16-byte address (IPv4 as `::ffff:a.b.c.d`) to 32 bytes
//! `attachment_id u64, host_ifindex u32, flags u32, host_mac [6], pod_mac [6], gateway4 [4]`;
//! `ECNI_POD_CNT` is a per-CPU hash from the host veth's ifindex (u32) to 128 bytes:
//! `from_pod {packets, bytes, drops, errors, marks, source_drops, mac_drops, flags}` then
//! `to_pod {…}`, all u64 (`flags` is not a count: ADD writes it in every CPU's slot). `ECNI_SOURCES` is an LPM trie whose 28-byte key is `prefix_len
//! u32, ifindex u32, family u32 (4, 6; 0 in a pod's catch-all), addr [16]` (IPv4 in its
//! first 4 bytes) and whose 16-byte value is `attachment_id u64, mac [6], verdict u16`
//! (1 pass, 2 refuse).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

use crate::node::Node;

// Names are maps/'s, the contract both sides of the dataplane compile against.
pub use ebpf_cni_maps::pin::{
    ATTACHMENTS_DIR, DEVICES_DIR, GATEWAYS_DIR, LINK_FROM_CHAIN, LINK_FROM_DEV, LINK_FROM_POD,
    LINK_TO_POD, MAPS_DIR, NETLINK_FROM_CHAIN, NETLINK_FROM_DEV, PROGRAMS_DIR,
};
pub use ebpf_cni_maps::{
    CONFIG_MAP, ENDPOINTS_MAP, MASQ_FWD_MAP, MASQ_REV_MAP, PACING_MAP, POD_COUNTERS_MAP,
    PORTMAP_MAP, PROG_FROM_CHAIN, PROG_FROM_DEV, PROG_FROM_POD, PROG_TO_POD, RATE_LIMITS_MAP,
    SHAPE_SUBNETS_MAP, SOURCES_MAP, TRACE_MAP,
};

/// `<node pin root>/maps/<name>`.
pub fn map_pin(node: &Node, name: &str) -> PathBuf {
    node.pin_root().join(MAPS_DIR).join(name)
}

/// `<node pin root>/devices/<dev>/link_from_dev`.
pub fn device_link_pin(node: &Node, dev: &str) -> PathBuf {
    node.pin_root()
        .join(DEVICES_DIR)
        .join(crate::node::pinned_name(dev))
        .join(LINK_FROM_DEV)
}

/// Every pinned program of the node: `programs/<revision>/<name>`.
pub fn pinned_programs(node: &Node) -> Vec<PathBuf> {
    crate::fsutil::list_files(&node.pin_root().join(PROGRAMS_DIR))
        .expect("listing the node's programs")
        .into_iter()
        .map(|p| node.pin_root().join(PROGRAMS_DIR).join(p))
        .collect()
}

/// One value of the endpoint map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    pub attachment_id: u64,
    pub host_ifindex: u32,
    pub flags: u32,
    pub host_mac: [u8; 6],
    pub pod_mac: [u8; 6],
    /// The IPv4 gateway whose ARP the programs answer (all zero: none).
    pub gateway4: [u8; 4],
    /// The value as stored, for writing it back.
    pub raw: [u8; 32],
}

impl Endpoint {
    pub fn decode(raw: [u8; 32]) -> Self {
        let u64_at = |o: usize| u64::from_le_bytes(raw[o..o + 8].try_into().expect("8 bytes"));
        let u32_at = |o: usize| u32::from_le_bytes(raw[o..o + 4].try_into().expect("4 bytes"));
        Self {
            attachment_id: u64_at(0),
            host_ifindex: u32_at(8),
            flags: u32_at(12),
            host_mac: raw[16..22].try_into().expect("6 bytes"),
            pod_mac: raw[22..28].try_into().expect("6 bytes"),
            gateway4: raw[28..32].try_into().expect("4 bytes"),
            raw,
        }
    }

    /// `raw` with the given fields replaced (the rest as stored).
    pub fn encode(&self) -> [u8; 32] {
        let mut raw = self.raw;
        raw[0..8].copy_from_slice(&self.attachment_id.to_le_bytes());
        raw[8..12].copy_from_slice(&self.host_ifindex.to_le_bytes());
        raw[12..16].copy_from_slice(&self.flags.to_le_bytes());
        raw[16..22].copy_from_slice(&self.host_mac);
        raw[22..28].copy_from_slice(&self.pod_mac);
        raw[28..32].copy_from_slice(&self.gateway4);
        raw
    }
}

/// A MAC as `ip link` prints it.
pub fn format_mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The endpoint map's key for `ip`.
pub fn endpoint_key(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn key_ip(key: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(key);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// One direction's counts, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct DirCounts {
    pub packets: u64,
    pub bytes: u64,
    pub drops: u64,
    pub errors: u64,
    pub marks: u64,
    /// Dropped by the source check: address, MAC.
    pub source_drops: u64,
    pub mac_drops: u64,
}

impl DirCounts {
    fn add_le(&mut self, b: &[u8]) {
        let at = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        self.packets += at(0);
        self.bytes += at(1);
        self.drops += at(2);
        self.errors += at(3);
        self.marks += at(4);
        self.source_drops += at(5);
        self.mac_drops += at(6);
    }

    /// From inspect's `{packets, bytes, drops, errors, marks, source_drops, mac_drops}`
    /// (the last two 0 where a release before the source check printed none).
    pub fn from_json(v: &Value) -> Option<Self> {
        let f = |k: &str| v.get(k).and_then(Value::as_u64);
        Some(Self {
            packets: f("packets")?,
            bytes: f("bytes")?,
            drops: f("drops")?,
            errors: f("errors")?,
            marks: f("marks")?,
            source_drops: f("source_drops").unwrap_or(0),
            mac_drops: f("mac_drops").unwrap_or(0),
        })
    }

    /// Every field of `self` is at least `earlier`'s (counters never go back).
    pub fn at_least(&self, earlier: &Self) -> bool {
        self.packets >= earlier.packets
            && self.bytes >= earlier.bytes
            && self.drops >= earlier.drops
            && self.errors >= earlier.errors
            && self.marks >= earlier.marks
            && self.source_drops >= earlier.source_drops
            && self.mac_drops >= earlier.mac_drops
    }
}

/// A pod's counters, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodCounts {
    pub from_pod: DirCounts,
    pub to_pod: DirCounts,
}

fn bpftool_json(args: &[&str]) -> Result<Value> {
    let out = Command::new("bpftool")
        .arg("-j")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running bpftool")?;
    if !out.status.success() {
        bail!(
            "bpftool {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let text = if text.trim().is_empty() {
        "[]"
    } else {
        text.trim()
    };
    serde_json::from_str(text).with_context(|| format!("parsing bpftool {}", args.join(" ")))
}

/// bpftool prints bytes as `["0x0a", …]`.
pub fn hex_bytes(v: &Value) -> Result<Vec<u8>> {
    v.as_array()
        .context("expected an array of bytes")?
        .iter()
        .map(|b| {
            let s = b.as_str().context("byte is not a string")?;
            u8::from_str_radix(s.trim_start_matches("0x"), 16)
                .with_context(|| format!("byte {s:?} is not hex"))
        })
        .collect()
}

fn hex_args(bytes: &[u8]) -> Vec<String> {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One entry of a map dump: the key and its value (one per CPU for per-CPU maps).
struct RawEntry {
    key: Vec<u8>,
    values: Vec<Vec<u8>>,
}

/// The entries of the node's pinned map `name` as bpftool prints them
/// (`[{"key": ["0x0a", …], "value": […]}]`, `values` per CPU; an empty map is `[]`).
pub fn map_entries(node: &Node, name: &str) -> Result<Vec<Value>> {
    map_entries_at(&map_pin(node, name))
}

/// [`map_entries`] of the map pinned at `path`.
fn map_entries_at(path: &Path) -> Result<Vec<Value>> {
    let path_s = path.to_string_lossy();
    let v = bpftool_json(&["map", "dump", "pinned", &path_s])?;
    v.as_array()
        .cloned()
        .context("bpftool map dump is not a list")
}

/// `bpftool map dump pinned <path>`, decoded to bytes.
fn dump(path: &Path) -> Result<Vec<RawEntry>> {
    let mut out = Vec::new();
    for e in &map_entries_at(path)? {
        let key = hex_bytes(e.get("key").context("entry without key")?)?;
        let values = if let Some(per_cpu) = e.get("values").and_then(Value::as_array) {
            per_cpu
                .iter()
                .map(|c| hex_bytes(c.get("value").unwrap_or(&Value::Null)))
                .collect::<Result<Vec<_>>>()?
        } else {
            vec![hex_bytes(e.get("value").context("entry without value")?)?]
        };
        out.push(RawEntry { key, values });
    }
    Ok(out)
}

/// The endpoint map, decoded; read with bpftool from the pin.
pub fn endpoints(node: &Node) -> Result<BTreeMap<IpAddr, Endpoint>> {
    let mut out = BTreeMap::new();
    for RawEntry { key, values } in dump(&map_pin(node, ENDPOINTS_MAP))? {
        let key: [u8; 16] = key
            .as_slice()
            .try_into()
            .with_context(|| format!("endpoint key of {} bytes", key.len()))?;
        let raw: [u8; 32] = values[0]
            .as_slice()
            .try_into()
            .with_context(|| format!("endpoint value of {} bytes", values[0].len()))?;
        out.insert(key_ip(key), Endpoint::decode(raw));
    }
    Ok(out)
}

/// The node config's `flags` (`NODE_FLAG_*`); read with bpftool from the pin.
pub fn node_config_flags(node: &Node) -> Result<u32> {
    let entries = dump(&map_pin(node, CONFIG_MAP))?;
    let value = entries
        .first()
        .and_then(|e| e.values.first())
        .context("the node config map has no entry")?;
    ensure!(value.len() == 16, "node config of {} bytes", value.len());
    Ok(u32::from_le_bytes(
        value[8..12].try_into().expect("4 bytes"),
    ))
}

/// The per-pod counters by host veth ifindex, each summed over CPUs; read with bpftool.
pub fn pod_counters(node: &Node) -> Result<BTreeMap<u32, PodCounts>> {
    let mut out = BTreeMap::new();
    for RawEntry { key, values } in dump(&map_pin(node, POD_COUNTERS_MAP))? {
        ensure!(key.len() == 4, "counters key of {} bytes", key.len());
        let ifindex = u32::from_le_bytes(key[..4].try_into().expect("4 bytes"));
        let mut c = PodCounts::default();
        for v in &values {
            ensure!(v.len() == 128, "counters value of {} bytes", v.len());
            c.from_pod.add_le(&v[..64]);
            c.to_pod.add_le(&v[64..]);
        }
        out.insert(ifindex, c);
    }
    Ok(out)
}

/// The flags of each pod's counters, `(from_pod, to_pod)` (`COUNTERS_NO_HOST_PORTS` and
/// `COUNTERS_NO_EGRESS_LIMIT`, `COUNTERS_NO_INGRESS_LIMIT`), by host veth ifindex, one
/// pair per CPU as ADD wrote them into every CPU's slot; read with bpftool.
pub fn pod_counter_flags(node: &Node) -> Result<BTreeMap<u32, Vec<(u64, u64)>>> {
    let mut out = BTreeMap::new();
    for RawEntry { key, values } in dump(&map_pin(node, POD_COUNTERS_MAP))? {
        ensure!(key.len() == 4, "counters key of {} bytes", key.len());
        let ifindex = u32::from_le_bytes(key[..4].try_into().expect("4 bytes"));
        let word = |v: &[u8], at: usize| u64::from_le_bytes(v[at..at + 8].try_into().expect("8"));
        let flags = values
            .iter()
            .map(|v| {
                ensure!(v.len() == 128, "counters value of {} bytes", v.len());
                Ok((word(v, 56), word(v, 120)))
            })
            .collect::<Result<Vec<_>>>()?;
        out.insert(ifindex, flags);
    }
    Ok(out)
}

/// Damage for CHECK tests: the pod's counters rewritten as zero counts with these flags
/// (bpftool writes the value into every CPU's slot).
pub fn set_pod_counter_flags(node: &Node, ifindex: u32, from_pod: u64, to_pod: u64) -> Result<()> {
    let mut value = [0u8; 128];
    value[56..64].copy_from_slice(&from_pod.to_le_bytes());
    value[120..].copy_from_slice(&to_pod.to_le_bytes());
    update_raw(node, POD_COUNTERS_MAP, &ifindex.to_le_bytes(), &value)
}

/// One entry of the source map, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceEntry {
    pub ifindex: u32,
    /// `None`: the pod's catch-all.
    pub prefix: Option<(IpAddr, u8)>,
    pub attachment_id: u64,
    pub mac: [u8; 6],
    /// 1 pass, 2 refuse (the catch-all).
    pub verdict: u16,
    pub raw_key: Vec<u8>,
    pub raw_value: Vec<u8>,
}

/// Every entry of the source map, read with bpftool (empty when the map is not there).
pub fn sources(node: &Node) -> Result<Vec<SourceEntry>> {
    let path = map_pin(node, SOURCES_MAP);
    if !path.exists() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for RawEntry { key, values } in dump(&path)? {
        ensure!(key.len() == 28, "source key of {} bytes", key.len());
        let v = &values[0];
        ensure!(v.len() == 16, "source value of {} bytes", v.len());
        let le32 = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes"));
        let (bits, ifindex, family) = (le32(&key[0..4]), le32(&key[4..8]), le32(&key[8..12]));
        let addr = &key[12..28];
        let prefix = match family {
            4 => Some((
                IpAddr::from([addr[0], addr[1], addr[2], addr[3]]),
                bits.saturating_sub(64) as u8,
            )),
            6 => Some((
                IpAddr::from(<[u8; 16]>::try_from(addr).expect("16 bytes")),
                bits.saturating_sub(64) as u8,
            )),
            _ => None,
        };
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&v[8..14]);
        out.push(SourceEntry {
            ifindex,
            prefix,
            attachment_id: u64::from_le_bytes(v[0..8].try_into().expect("8 bytes")),
            mac,
            verdict: u16::from_le_bytes([v[14], v[15]]),
            raw_key: key,
            raw_value: v.clone(),
        });
    }
    Ok(out)
}

/// `bpftool map delete` of `ip`'s endpoint entry.
pub fn delete_endpoint(node: &Node, ip: IpAddr) -> Result<()> {
    let path = map_pin(node, ENDPOINTS_MAP);
    let mut args = vec!["map".to_owned(), "delete".into(), "pinned".into()];
    args.push(path.to_string_lossy().into_owned());
    args.push("key".into());
    args.push("hex".into());
    args.extend(hex_args(&endpoint_key(ip)));
    bpftool_ok(&args)
}

/// `bpftool map update` of `ip`'s endpoint entry with `value`.
pub fn update_endpoint(node: &Node, ip: IpAddr, value: &[u8; 32]) -> Result<()> {
    let path = map_pin(node, ENDPOINTS_MAP);
    let mut args = vec!["map".to_owned(), "update".into(), "pinned".into()];
    args.push(path.to_string_lossy().into_owned());
    args.push("key".into());
    args.push("hex".into());
    args.extend(hex_args(&endpoint_key(ip)));
    args.push("value".into());
    args.push("hex".into());
    args.extend(hex_args(value));
    bpftool_ok(&args)
}

/// `bpftool link detach id <id>`: the link stays (and its pin), its program is detached.
pub fn detach_link(link_id: u32) -> Result<()> {
    bpftool_ok(&[
        "link".to_owned(),
        "detach".into(),
        "id".into(),
        link_id.to_string(),
    ])
}

fn bpftool_ok(args: &[String]) -> Result<()> {
    let out = Command::new("bpftool")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running bpftool")?;
    if !out.status.success() {
        bail!(
            "bpftool {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// `ebpf-cni inspect --json --netns <node>` (the operator CLI: no `CNI_COMMAND`), parsed.
pub fn inspect(bin: &Path, node: &Node) -> Result<Value> {
    let out = Command::new(bin)
        .env_remove("CNI_COMMAND")
        .args(["inspect", "--json", "--netns"])
        .arg(node.netns().path())
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} inspect", bin.display()))?;
    if !out.status.success() {
        bail!(
            "{} inspect --json failed ({:?}): {}",
            bin.display(),
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "inspect --json printed no JSON: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// inspect's attachment entry for `container_id`.
pub fn inspect_attachment<'a>(report: &'a Value, container_id: &str) -> Option<&'a Value> {
    report
        .get("attachments")?
        .as_array()?
        .iter()
        .find(|a| a.get("container_id").and_then(Value::as_str) == Some(container_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_layout_round_trips() {
        let mut raw = [0u8; 32];
        raw[0..8].copy_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
        raw[8..12].copy_from_slice(&7u32.to_le_bytes());
        raw[16..22].copy_from_slice(&[1, 2, 3, 4, 5, 6]);
        raw[22..28].copy_from_slice(&[0xa, 0xb, 0xc, 0xd, 0xe, 0xf]);
        let e = Endpoint::decode(raw);
        assert_eq!(e.attachment_id, 0x0102_0304_0506_0708);
        assert_eq!(e.host_ifindex, 7);
        assert_eq!(format_mac(&e.pod_mac), "0a:0b:0c:0d:0e:0f");
        assert_eq!(e.encode(), raw);
        let ip: IpAddr = "10.10.0.2".parse().unwrap();
        assert_eq!(
            endpoint_key(ip),
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 10, 0, 2]
        );
        assert_eq!(key_ip(endpoint_key(ip)), ip);
        let ip6: IpAddr = "fd00:10::2".parse().unwrap();
        assert_eq!(key_ip(endpoint_key(ip6)), ip6);
    }
}

// The node-wide host port map, read independently of the plugin.

/// One entry of [`PORTMAP_MAP`]: key `addr(16) port(u16 LE) proto(u8) pad`, value
/// `attachment_id(u64) pod_addr(16) gateway(16) host_ifindex(u32) pod_port(u16) pad(2)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMapEntry {
    /// `None`: the family's wildcard (every node address).
    pub host: Option<IpAddr>,
    pub wildcard_v6: bool,
    pub host_port: u16,
    pub proto: u8,
    pub pod: IpAddr,
    pub pod_port: u16,
    pub host_ifindex: u32,
    pub raw_key: Vec<u8>,
    pub raw_value: Vec<u8>,
}

/// Every host port mapping of the node, read with bpftool (empty when the map is not there).
pub fn port_mappings(node: &Node) -> Result<Vec<PortMapEntry>> {
    let path = map_pin(node, PORTMAP_MAP);
    if !path.exists() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for RawEntry { key, values } in dump(&path)? {
        ensure!(key.len() == 20, "port key of {} bytes", key.len());
        let v = &values[0];
        ensure!(v.len() == 48, "port value of {} bytes", v.len());
        let addr: [u8; 16] = key[..16].try_into().expect("16 bytes");
        let wildcard_v6 = addr == [0; 16];
        let host = key_ip(addr);
        let host = (!host.is_unspecified()).then_some(host);
        out.push(PortMapEntry {
            host,
            wildcard_v6,
            host_port: u16::from_le_bytes([key[16], key[17]]),
            proto: key[18],
            pod: key_ip(v[8..24].try_into().expect("16 bytes")),
            pod_port: u16::from_le_bytes([v[44], v[45]]),
            host_ifindex: u32::from_le_bytes(v[40..44].try_into().expect("4 bytes")),
            raw_key: key,
            raw_value: v.clone(),
        });
    }
    Ok(out)
}

/// `bpftool map delete` of one raw key in the node map `name`.
pub fn delete_raw(node: &Node, name: &str, key: &[u8]) -> Result<()> {
    let mut args = vec![
        "map".to_owned(),
        "delete".into(),
        "pinned".into(),
        map_pin(node, name).to_string_lossy().into_owned(),
        "key".into(),
        "hex".into(),
    ];
    args.extend(hex_args(key));
    bpftool_ok(&args)
}

/// `bpftool map update` of one raw entry in the node map `name`.
pub fn update_raw(node: &Node, name: &str, key: &[u8], value: &[u8]) -> Result<()> {
    let mut args = vec![
        "map".to_owned(),
        "update".into(),
        "pinned".into(),
        map_pin(node, name).to_string_lossy().into_owned(),
        "key".into(),
        "hex".into(),
    ];
    args.extend(hex_args(key));
    args.push("value".into());
    args.push("hex".into());
    args.extend(hex_args(value));
    bpftool_ok(&args)
}
