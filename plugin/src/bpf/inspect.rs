//! `inspect`: the report of everything a node has pinned, with the kernel's view of each
//! link, the counters, source checks, limits, host ports, gateways and masquerade (`ebpf-cni inspect`
//! prints it, the metrics exporter reads it).

use std::{collections::HashMap, fs, net::IpAddr, os::fd::AsFd, path::Path};

use serde::Serialize;

use super::{
    bandwidth, gateways,
    host_ports::{self, PortMaps},
    kernel, links,
    maps::{key_ip, Maps, PodSources, SourceRecord},
    masquerade::{MasqMaps, MasqReport},
    pin::{AttachmentPins, NodeId, PinRoot},
    sys, tree, BpfError, Hook,
};

#[derive(Debug, Clone, Serialize)]
pub struct Counts {
    pub packets: u64,
    pub bytes: u64,
    /// Dropped by the rate limiter (and masquerade's untranslatable packets).
    pub drops: u64,
    pub errors: u64,
    pub marks: u64,
    /// Dropped by the source check: a source address the pod may not send from (from the
    /// pod only).
    pub source_drops: u64,
    /// Dropped by the source check: a source MAC other than the pod's (from the pod only).
    pub mac_drops: u64,
}

impl From<&ebpf_cni_maps::DirCounters> for Counts {
    fn from(d: &ebpf_cni_maps::DirCounters) -> Self {
        Self {
            packets: d.packets,
            bytes: d.bytes,
            drops: d.drops,
            errors: d.errors,
            marks: d.marks,
            source_drops: d.source_drops,
            mac_drops: d.mac_drops,
        }
    }
}

/// A pod's configured limits (bytes/s and bytes; absent: unlimited).
#[derive(Debug, Clone, Serialize)]
pub struct LimitReport {
    pub rate_bytes: u64,
    pub burst_bytes: u64,
    /// How the limit is held: `edt+fq` (paced) or `policer`, with why where pacing was not
    /// possible (`policer (no sch_fq)`).
    pub mode: &'static str,
    /// Paced: the longest a packet waits before it is dropped instead (ns).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub horizon_ns: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LinkReport {
    pub hook: &'static str,
    /// `tcx` (a pinned link) or `netlink` (a `bpf` filter; its program pinned as a record).
    pub mode: &'static str,
    /// TCX: the link still holds a device. Netlink: the filter is on the device (set by
    /// the caller, which asks the kernel; the record alone says nothing about it).
    pub attached: bool,
    pub program: String,
    pub program_id: u32,
    /// 0 for a netlink filter.
    pub link_id: u32,
    pub ifindex: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct AttachmentReport {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    pub host_ifindex: Option<u32>,
    pub addresses: Vec<IpAddr>,
    pub links: Vec<LinkReport>,
    pub from_pod: Option<Counts>,
    pub to_pod: Option<Counts>,
    /// Limit of traffic towards the pod.
    pub ingress_limit: Option<LimitReport>,
    /// Limit of traffic from the pod.
    pub egress_limit: Option<LimitReport>,
    /// `SO_MAX_PACING_RATE` given to the pod's TCP sockets, bytes per second.
    pub tcp_pacing_bytes: Option<u32>,
    /// The limits' `unshapedSubnets` or `shapedSubnets`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shape_subnets: Option<ShapeSubnetsReport>,
    /// What the pod may send from.
    pub source_check: SourceCheckReport,
}

/// A limited pod's `unshapedSubnets` (traffic to or from them is not limited) or
/// `shapedSubnets` (only that traffic is).
#[derive(Debug, Clone, Serialize)]
pub struct ShapeSubnetsReport {
    /// `unshapedSubnets` or `shapedSubnets`.
    pub rule: &'static str,
    pub subnets: Vec<String>,
}

/// A pod's source check as the source map holds it.
#[derive(Debug, Clone, Serialize)]
pub struct SourceCheckReport {
    /// `on`, `off` (`sourceCheck: false`), `unchecked` (the pod was attached by a release
    /// before the check, and is checked from its next ADD), or `missing` (ADD installed a
    /// check whose entries are gone: CHECK fails).
    pub mode: &'static str,
    /// The MAC its frames must carry (`on` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// The prefixes it may send from: its own addresses (/32, /128) and its extra ones.
    pub allowed: Vec<String>,
}

impl SourceCheckReport {
    /// `record` is asked only for a pod without a catch-all (its stats cost a node of
    /// checked pods nothing).
    fn of(p: Option<&PodSources>, record: impl FnOnce() -> SourceRecord) -> Self {
        let on = p.is_some_and(|p| p.verdict == ebpf_cni_maps::SOURCE_REFUSE);
        let mode = match on {
            true => "on",
            false => match record() {
                SourceRecord::Off => "off",
                SourceRecord::On => "missing",
                SourceRecord::None => "unchecked",
            },
        };
        Self {
            mode,
            mac: p.filter(|_| on).map(|p| crate::netlink::format_mac(&p.mac)),
            allowed: p
                .map(|p| p.allowed.iter().map(ToString::to_string).collect())
                .unwrap_or_default(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct DeviceReport {
    pub name: String,
    pub link: Option<LinkReport>,
}

/// One host port mapping with its hit counters.
#[derive(Debug, Clone, Serialize)]
pub struct PortMappingReport {
    /// `0.0.0.0:8080/tcp` (`0.0.0.0` / `[::]`: every node address of the family).
    pub host: String,
    pub pod: String,
    /// `tcp`, `udp` or `sctp`.
    pub protocol: &'static str,
    /// The host address (`0.0.0.0` / `::`: every node address of the family).
    pub host_ip: IpAddr,
    pub host_port: u16,
    pub pod_address: IpAddr,
    pub pod_port: u16,
    pub host_ifindex: u32,
    /// `<network>/<container id>/<ifname>` when the attachment is known.
    pub attachment: Option<String>,
    /// Packets translated by the TC programs (and their bytes).
    pub packets: u64,
    pub bytes: u64,
    /// Connections and datagrams of the node's own processes translated at the socket.
    pub socket: u64,
    /// Whether the node's own connections to loopback reach the mapping
    /// (`hostPortsOnLoopback`).
    pub loopback: bool,
}

/// How full one node map is. Arrays count as full; LRU maps fill up by design and then
/// evict their oldest entries.
#[derive(Debug, Clone, Serialize)]
pub struct MapUsageReport {
    pub name: &'static str,
    pub entries: u32,
    pub max_entries: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct NodeReport {
    pub node: String,
    /// `uname -r`, and how each part of the dataplane runs on it.
    pub kernel: String,
    pub modes: Vec<kernel::PartMode>,
    pub pin_dir: String,
    pub revisions: Vec<String>,
    pub endpoints: usize,
    /// Each pinned node map's use against its size (absent maps are left out).
    pub maps: Vec<MapUsageReport>,
    pub devices: Vec<DeviceReport>,
    /// Filters of ebpf-cni's programs on the node's devices while it has no pin tree (its
    /// pins were removed by hand): the next STATUS, agent pass, ADD or GC removes them.
    pub unpinned: Vec<super::UnpinnedFilter>,
    pub attachments: Vec<AttachmentReport>,
    /// Addresses wildcard host ports answer on.
    pub node_addresses: Vec<IpAddr>,
    pub port_mappings: Vec<PortMappingReport>,
    /// The pods' IPv4 gateways the node holds on `lo`, and who uses each.
    pub gateways: Vec<GatewayReport>,
    /// The pods' IPv6 gateways, and the attachments whose host veths hold each (what STATUS
    /// and the agent put back).
    pub gateways6: Vec<GatewayReport>,
    /// Masquerade: the port range, flows per pod, allocation failures (`None` on a node
    /// whose maps predate it).
    pub masquerade: Option<MasqReport>,
    /// Services next to kube-proxy: whether the programs hand Service flows to the stack,
    /// why, and what they counted (`None` on a node whose maps predate it).
    pub services: Option<super::ServicesReport>,
    /// The cluster network's tunnel: its device, peers and what its programs counted
    /// (`None` on a node whose maps predate it).
    pub tunnel: Option<super::tunnel::TunnelReport>,
    /// The peer subnets the cluster network's agent last gave no route, and why.
    pub unrouted_peers: Vec<super::tunnel::UnroutedPeer>,
    /// The last time ADD, STATUS or the agent changed the node to follow its devices and
    /// addresses (`None`: never recorded, e.g. a node of an older release).
    pub converged: Option<super::ConvergeRecord>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GatewayReport {
    pub address: IpAddr,
    /// `<network>/<container id>/<ifname>` of each attachment using it (the attachment id
    /// in hex when its directory is gone).
    pub users: Vec<String>,
}

/// Each gateway with its users named as in `names` (the id in hex where its attachment's
/// directory is gone).
fn gateway_reports<A: Into<IpAddr>>(
    gws: Vec<(A, Vec<u64>)>,
    names: &HashMap<u64, String>,
) -> Vec<GatewayReport> {
    gws.into_iter()
        .map(|(address, ids)| GatewayReport {
            address: address.into(),
            users: ids
                .iter()
                .map(|id| {
                    names
                        .get(id)
                        .cloned()
                        .unwrap_or_else(|| format!("{id:016x}"))
                })
                .collect(),
        })
        .collect()
}

/// Program names by id: every pod runs the same few programs, so each name costs its
/// syscalls once per `inspect`, not once per link.
#[derive(Default)]
struct ProgNames(HashMap<u32, String>);

impl ProgNames {
    fn get(&mut self, id: u32) -> String {
        self.0
            .entry(id)
            .or_insert_with(|| sys::prog_name(id).unwrap_or_default())
            .clone()
    }
}

fn link_report(names: &mut ProgNames, hook: Hook, path: &Path) -> Option<LinkReport> {
    let info = links::describe(path).ok()?;
    Some(LinkReport {
        hook: hook.label(),
        mode: "tcx",
        attached: info.ifindex != 0,
        program: names.get(info.prog_id),
        program_id: info.prog_id,
        link_id: info.id,
        ifindex: info.ifindex,
    })
}

/// A netlink filter's record (the pinned program) as a report; `attached` stays false
/// until the caller has seen the filter on `ifindex`.
fn netlink_report(
    names: &mut ProgNames,
    hook: Hook,
    record: &Path,
    ifindex: Option<u32>,
) -> Option<LinkReport> {
    let fd = sys::obj_get(record).ok()?;
    let program_id = sys::prog_id(fd.as_fd()).ok()?;
    Some(LinkReport {
        hook: hook.label(),
        mode: "netlink",
        attached: false,
        program: names.get(program_id),
        program_id,
        link_id: 0,
        ifindex: ifindex.unwrap_or(0),
    })
}

/// Use against size of each node map that is pinned.
fn map_usage(root: &PinRoot, node: &NodeId) -> Vec<MapUsageReport> {
    ebpf_cni_maps::NODE_MAPS
        .into_iter()
        .filter_map(|map| {
            let name = map.name;
            let fd = sys::obj_get(&root.map(node, name)).ok()?;
            match sys::map_usage(fd.as_fd()) {
                Ok((entries, max_entries)) => Some(MapUsageReport {
                    name,
                    entries,
                    max_entries,
                }),
                Err(e) => {
                    log::warn!("reading the use of map {name}: {e}");
                    None
                }
            }
        })
        .collect()
}

/// Whether [`inspect`] reads each device's and pod's links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// The links and filters with their programs, as `ebpf-cni inspect` prints them.
    Read,
    /// Not read: the metrics exporter's report, whose series say nothing of links (a link's
    /// state is CHECK's and STATUS's). A pod's links cost six pin lookups (a TCX link and a
    /// filter record per hook) and a program query per record found, about half of a
    /// scrape; a pod without endpoint entries still has them read, for the host interface
    /// they name.
    Skip,
}

/// Everything this node has pinned, with the kernel's view of each link (unless `links`
/// says otherwise) and the counters.
pub fn inspect(node: &NodeId, links: Links) -> Result<NodeReport, BpfError> {
    let root = PinRoot::from_env();
    let maps = Maps::open(&root, node)?;
    let mut prog_names = ProgNames::default();
    let devices = device_reports(&root, node, links, &mut prog_names);
    let (attachments, names) =
        attachment_reports(&root, node, maps.as_ref(), links, &mut prog_names)?;
    let (node_addresses, port_mappings) = match maps {
        Some(_) => host_port_reports(&root, node, &names)?,
        None => (Vec::new(), Vec::new()),
    };
    Ok(NodeReport {
        node: node.to_string(),
        kernel: kernel::release().to_owned(),
        modes: super::part_modes(node),
        pin_dir: root.node_dir(node).display().to_string(),
        revisions: sorted_names(&root.programs_dir(node)),
        endpoints: maps.as_ref().map_or(0, Maps::endpoint_count),
        maps: map_usage(&root, node),
        devices,
        // Read by netlink in the node's namespace: `unpinned_filters`, by the caller.
        unpinned: Vec::new(),
        attachments,
        node_addresses,
        port_mappings,
        gateways: gateway_reports(gateways::list_at(&root, node), &names),
        gateways6: gateway_reports(gateways::users6(&root, node), &names),
        masquerade: MasqMaps::open(&root, node)?.map(|m| m.report()),
        services: super::ServicesMaps::open(&root, node)?
            .map(|m| m.report(super::services_source(&root, node))),
        tunnel: super::tunnel::TunnelMaps::open(&root, node)?.map(|m| m.report()),
        unrouted_peers: super::tunnel::unrouted(&root, node),
        converged: super::converge::last(&root, node),
    })
}

/// The names in directory `dir`, sorted (none when it cannot be read).
fn sorted_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|es| {
            es.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Each pinned device, sorted by name, with its link or filter (unless `links` is
/// `Skip`).
fn device_reports(
    root: &PinRoot,
    node: &NodeId,
    links: Links,
    prog_names: &mut ProgNames,
) -> Vec<DeviceReport> {
    let mut devices = root.pinned_devices(node);
    devices.sort();
    devices
        .into_iter()
        .map(|name| {
            if links == Links::Skip {
                return DeviceReport { name, link: None };
            }
            let link = link_report(prog_names, Hook::FromDev, &root.device_link(node, &name))
                .or_else(|| {
                    netlink_report(
                        prog_names,
                        Hook::FromDev,
                        &root.device_netlink_record(node, &name),
                        None,
                    )
                });
            DeviceReport { name, link }
        })
        .collect()
}

/// The node maps' contents by pod, each map walked once for the whole node: per-pod walks
/// cost O(pods²) syscalls.
struct ByPod<'a> {
    maps: Option<&'a Maps>,
    entries: HashMap<u64, Vec<(IpAddr, ebpf_cni_maps::EndpointInfo)>>,
    pacing: HashMap<u64, u32>,
    sources: HashMap<u32, PodSources>,
}

/// Each attachment's report, and each attachment's name by id (for the host ports and
/// gateways that name their users by it).
fn attachment_reports(
    root: &PinRoot,
    node: &NodeId,
    maps: Option<&Maps>,
    links: Links,
    prog_names: &mut ProgNames,
) -> Result<(Vec<AttachmentReport>, HashMap<u64, String>), BpfError> {
    let mut attachments = Vec::new();
    let mut names = HashMap::new();
    let mut by_pod = ByPod {
        maps,
        entries: maps.map(Maps::entries_by_attachment).unwrap_or_default(),
        pacing: maps.map(Maps::pacing_by_attachment).unwrap_or_default(),
        sources: maps.map(Maps::sources_by_ifindex).unwrap_or_default(),
    };
    for dir in tree::attachments(root, node)? {
        let id = dir.key().id();
        names.insert(id, dir.to_string());
        attachments.push(attachment_report(
            root,
            node,
            id,
            dir,
            &mut by_pod,
            links,
            prog_names,
        ));
    }
    Ok((attachments, names))
}

/// One attachment's addresses, links, counters, limits and source check.
fn attachment_report(
    root: &PinRoot,
    node: &NodeId,
    id: u64,
    dir: tree::AttachmentDir,
    by_pod: &mut ByPod<'_>,
    links: Links,
    prog_names: &mut ProgNames,
) -> AttachmentReport {
    let pins = root.attachment(node, &dir.key());
    let mut entries = by_pod.entries.remove(&id).unwrap_or_default();
    entries.sort_by_key(|(ip, _)| *ip);
    let (host_ifindex, pod_links) = pod_links(prog_names, &pins, &entries, links);
    let maps = by_pod.maps;
    let counters = host_ifindex.and_then(|i| maps?.counters(i));
    let limits = host_ifindex.and_then(|i| maps?.limits(i));
    AttachmentReport {
        addresses: entries.iter().map(|(ip, _)| *ip).collect(),
        host_ifindex,
        links: pod_links,
        from_pod: counters.as_ref().map(|c| (&c.from_pod).into()),
        to_pod: counters.as_ref().map(|c| (&c.to_pod).into()),
        ingress_limit: limits.and_then(|l| limit_report(l.ingress)),
        egress_limit: limits.and_then(|l| limit_report(l.egress)),
        tcp_pacing_bytes: by_pod.pacing.get(&id).copied(),
        shape_subnets: limits.and_then(|l| shape_subnets_report(maps, host_ifindex, l)),
        source_check: SourceCheckReport::of(
            host_ifindex.and_then(|i| by_pod.sources.get(&i)),
            || super::capability::source_record(&pins),
        ),
        network: dir.network,
        container_id: dir.container_id,
        ifname: dir.ifname,
    }
}

/// The pod's TCX links (read also under `Links::Skip` when no endpoint entry names its
/// host interface) and, with `Links::Read`, its filter records; and the host interface's
/// index, from its entries or else its first link.
fn pod_links(
    prog_names: &mut ProgNames,
    pins: &AttachmentPins,
    entries: &[(IpAddr, ebpf_cni_maps::EndpointInfo)],
    links: Links,
) -> (Option<u32>, Vec<LinkReport>) {
    let mut pod_links: Vec<LinkReport> = Vec::new();
    if links == Links::Read || entries.is_empty() {
        pod_links.extend(
            Hook::ANY_POD
                .iter()
                .filter_map(|h| link_report(prog_names, *h, &pins.link(*h))),
        );
    }
    let host_ifindex = entries
        .first()
        .map(|(_, e)| e.host_ifindex)
        .or_else(|| pod_links.first().map(|l| l.ifindex));
    if links == Links::Read {
        pod_links.extend(Hook::ANY_POD.iter().filter_map(|h| {
            netlink_report(prog_names, *h, &pins.netlink_record(*h), host_ifindex)
        }));
    }
    (host_ifindex, pod_links)
}

/// One direction's limit, if it has a rate.
fn limit_report(b: ebpf_cni_maps::Bucket) -> Option<LimitReport> {
    (b.rate_bytes > 0).then(|| LimitReport {
        rate_bytes: b.rate_bytes,
        burst_bytes: u64::from(b.burst_bytes),
        mode: bandwidth::mode_label(b.mode & ebpf_cni_maps::LIMIT_MODE_MASK),
        horizon_ns: (b.mode & ebpf_cni_maps::LIMIT_MODE_MASK == ebpf_cni_maps::LIMIT_EDT)
            .then(|| ebpf_cni_maps::edt_horizon_ns(b.rate_bytes)),
    })
}

/// The limits' `unshapedSubnets` or `shapedSubnets` with their subnets, if they have
/// either.
fn shape_subnets_report(
    maps: Option<&Maps>,
    host_ifindex: Option<u32>,
    l: ebpf_cni_maps::RateLimit,
) -> Option<ShapeSubnetsReport> {
    let flags = (l.ingress.mode | l.egress.mode) & !ebpf_cni_maps::LIMIT_MODE_MASK;
    let rule = if flags & ebpf_cni_maps::LIMIT_SUBNETS_UNSHAPED != 0 {
        "unshapedSubnets"
    } else if flags & ebpf_cni_maps::LIMIT_SUBNETS_SHAPED != 0 {
        "shapedSubnets"
    } else {
        return None;
    };
    let subnets = host_ifindex
        .and_then(|i| Some(maps?.shape_subnets(i)))
        .unwrap_or_default()
        .into_iter()
        .map(|k| crate::bandwidth::subnet_of_key(k).to_string())
        .collect();
    Some(ShapeSubnetsReport { rule, subnets })
}

/// The addresses wildcard host ports answer on and each mapping, when the node has the
/// host-port maps.
fn host_port_reports(
    root: &PinRoot,
    node: &NodeId,
    names: &HashMap<u64, String>,
) -> Result<(Vec<IpAddr>, Vec<PortMappingReport>), BpfError> {
    if !root.map(node, ebpf_cni_maps::PORTMAP_MAP).exists() {
        return Ok((Vec::new(), Vec::new()));
    }
    let pm = PortMaps::open(root, node)?;
    let node_addresses = pm.node_addrs();
    let port_mappings = pm
        .list()
        .iter()
        .map(|m| port_mapping_report(m, names))
        .collect();
    Ok((node_addresses, port_mappings))
}

/// One host-port mapping with its hits, its attachment named as in `names`.
fn port_mapping_report(
    m: &host_ports::InstalledMapping,
    names: &HashMap<u64, String>,
) -> PortMappingReport {
    let pod = key_ip(&ebpf_cni_maps::EndpointKey {
        addr: m.target.pod_addr,
    });
    let host_ip = match m.key.addr {
        a if a == ebpf_cni_maps::PortKey::WILDCARD_V6 => {
            IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
        }
        addr => key_ip(&ebpf_cni_maps::EndpointKey { addr }),
    };
    PortMappingReport {
        host: host_ports::describe_key(&m.key),
        protocol: crate::host_ports::Protocol::from_number(m.key.proto)
            .map_or("unknown", crate::host_ports::Protocol::as_str),
        host_ip,
        host_port: m.key.port,
        pod_address: pod,
        pod_port: m.target.pod_port,
        pod: if pod.is_ipv6() {
            format!("[{pod}]:{}", m.target.pod_port)
        } else {
            format!("{pod}:{}", m.target.pod_port)
        },
        host_ifindex: m.target.host_ifindex,
        attachment: names.get(&m.target.attachment_id).cloned(),
        packets: m.hits.packets,
        bytes: m.hits.bytes,
        socket: m.hits.socket,
        loopback: m.target.flags & ebpf_cni_maps::PORT_FLAG_NO_LOOPBACK == 0,
    }
}
