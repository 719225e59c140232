//! What ADD, DEL, CHECK and `inspect` do with the dataplane: a pod's links and endpoint
//! entries, the node's device links, and the node's teardown when its last pod goes.

use std::{fs, net::IpAddr, os::fd::AsFd, path::Path};

use serde::Serialize;

use super::{
    dataplane::{Device, Maps, NodeLock, PodEndpoint, Programs},
    kernel, links,
    masq::{MasqMaps, MasqReport, MasqSpec},
    pin::{create_dir_all_racy, ensure_bpffs_at, AttachmentPins, NodeId, PinRoot},
    ports::{self, PortMaps},
    queue, AttachMode, AttachModes, AttachmentKey, BpfError, Hook, PROGRAMS,
};
use crate::portmap::PortEntry;
use ebpf_cni_maps::RateLimit;

/// What ADD tells the dataplane about a pod.
pub struct PodSpec<'a> {
    pub host_ifname: &'a str,
    pub host_ifindex: u32,
    pub endpoints: &'a [PodEndpoint],
    /// `None`: no rate limits.
    pub limits: Option<RateLimit>,
    /// Host port mappings to install.
    pub ports: &'a [PortEntry],
    /// The node's addresses (wildcard host ports answer on each); used when `ports` is not
    /// empty.
    pub node_addrs: &'a [IpAddr],
    /// Chained mode: another plugin made the interface and forwards the pod's traffic; the
    /// host veth gets `ecni_from_chain` instead of `ecni_from_pod`.
    pub chained: bool,
    /// The cookie of the pod's network namespace: with an egress limit, its TCP sockets
    /// are paced (`ecni_sockops`).
    pub netns_cookie: u64,
    /// `ipMasq`: what the node needs for the pod's masquerade (its endpoints carry the flag).
    pub masq: Option<&'a MasqSpec>,
}

/// The pacing rate for an egress limit, in payload bytes: TCP paces the payload it sends,
/// and the limit counts Ethernet frames (as the pacer towards pods and tbf do), which at MTU
/// 1500 carry 1448 payload bytes in 1514 (IPv4, TCP timestamps). Pacing at that share of
/// the rate puts the stream on the wire at the limit (IPv6's 1428-byte MSS: 1.4% above).
/// The policer behind it counts a GSO packet's headers once, so it leaves the paced stream
/// room and does not drop it. `None` without an egress limit.
pub fn pacing_rate(limits: Option<RateLimit>) -> Option<u32> {
    let rate = limits?.egress.rate_bytes;
    let paced = u128::from(rate) * 1448 / 1514;
    (rate > 0).then(|| u32::try_from(paced).unwrap_or(u32::MAX))
}

/// Removes the host port mappings an attachment installed (as listed in its pinned port
/// list); the list itself goes with the attachment's directory.
fn remove_ports(
    root: &PinRoot,
    node: &NodeId,
    pins: &AttachmentPins,
    id: u64,
) -> Result<usize, BpfError> {
    let keys = ports::attachment_ports(&pins.ports())?;
    if keys.is_empty() || !root.map(node, ebpf_cni_maps::PORTMAP_MAP).exists() {
        return Ok(0);
    }
    PortMaps::open(root, node)?.remove(id, &keys)
}

/// Installs a pod's host port mappings; the node lock is held.
fn add_ports(
    root: &PinRoot,
    node: &NodeId,
    pins: &AttachmentPins,
    id: u64,
    host_ifindex: u32,
    entries: &[PortEntry],
    node_addrs: &[IpAddr],
) -> Result<(), BpfError> {
    let mut pm = PortMaps::open(root, node)?;
    pm.ensure_free(id, entries)?;
    // Without SO_NETNS_COOKIE the socket programs cannot tell the node's sockets from any
    // other namespace's: they stay off, and the node's own processes reach host ports
    // through the stack (the TC programs serve everyone else as always).
    let cookie = if kernel::has_netns_cookie() {
        ports::ensure_sock_links(root, node, |name| Programs::sock_fd(root, node, name))?;
        ports::netns_cookie()?
    } else {
        0
    };
    pm.enable(cookie)?;
    pm.sync_node_addrs(node_addrs)?;
    // The list first: whatever happens next, DEL finds what to remove.
    let keys: Vec<_> = entries.iter().map(ports::port_key).collect();
    ports::pin_attachment_ports(&pins.ports(), &keys)?;
    pm.install(id, host_ifindex, entries)
}

/// Attaches a pod: its host veth gets the pod programs (TCX links pinned under the
/// attachment's directory, or netlink filters with a pinned record), the endpoint map
/// learns its addresses, and the node's devices are brought in line with `devices`. On
/// error nothing of the pod stays.
pub fn add_pod(
    node: &NodeId,
    key: &AttachmentKey<'_>,
    pod: &PodSpec<'_>,
    devices: &[Device],
    modes: AttachModes,
) -> Result<(), BpfError> {
    let mode = modes.pod;
    let PodSpec {
        host_ifname,
        host_ifindex,
        endpoints,
        limits,
        ports: port_entries,
        node_addrs,
        chained,
        netns_cookie,
        masq,
    } = *pod;
    let [from_hook, to_hook] = Hook::pod(chained);
    key.validate()?;
    if PROGRAMS.is_empty() {
        return Err(BpfError::NotBuilt);
    }
    let t = std::time::Instant::now();
    let step =
        |what: &str| log::debug!("add_pod {what}: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let root = PinRoot::from_env();
    ensure_bpffs_at(&root)?;
    let mut lock = Some(NodeLock::take(&root)?);
    step("locked");
    let mut progs = Programs::open_or_load(&root, node)?;
    step("programs");
    let mut maps = Maps::open(&root, node)?.ok_or_else(|| BpfError::PinMissing {
        what: "endpoint map",
        path: root.map(node, ebpf_cni_maps::ENDPOINTS_MAP),
    })?;
    step("maps");
    if let Err(e) = sync_devices(&root, node, &mut progs, devices, modes.devices) {
        // The pod works without them (traffic from devices then takes the stack).
        log::warn!("node devices: {e}");
    }
    step("devices");

    let pins = root.attachment(node, key);
    let stop_at = root.attachments_dir(node);
    if fs::symlink_metadata(pins.dir()).is_ok() {
        log::warn!("replacing the stale attachment at {}", pins.dir().display());
        remove_ports(&root, node, &pins, key.id())?;
        links::remove_dir_pins(&stop_at, pins.dir()).map_err(|failures| BpfError::Detach {
            dir: pins.dir().into(),
            failures,
        })?;
        // Scans the whole endpoint map: only for this rare case, so ADD stays O(1).
        maps.remove_attachment(key.id())?;
    }
    maps.ensure_free(
        key.id(),
        &endpoints.iter().map(|e| e.ip).collect::<Vec<_>>(),
    )?;
    let mut fq_created = false;
    let res = (|| {
        create_dir_all_racy(pins.dir())?;
        maps.insert_pod(key.id(), endpoints)?;
        let mut limits = limits;
        let pod_name = format!("{}/{}/{}", key.network, key.container_id, key.ifname);
        fq_created = queue::prepare(host_ifindex, &mut limits, &pod_name)?;
        maps.set_limits(host_ifindex, limits)?;
        if let Some(rate) = pacing_rate(limits) {
            if netns_cookie != 0 && Programs::pacing_available(&root, node) {
                maps.set_pacing(netns_cookie, key.id(), rate)?;
                ports::ensure_pacing_link(&root, node, |name| {
                    Programs::sock_fd(&root, node, name)
                })?;
            } else {
                log::warn!(
                    "kernel {} cannot pace TCP (needs 5.15): the egress limit of {}/{}/{} is policed only",
                    kernel::release(),
                    key.network,
                    key.container_id,
                    key.ifname
                );
            }
        }
        step("endpoints");
        if let Some(spec) = masq {
            let mut m = MasqMaps::open(&root, node)?.ok_or_else(|| BpfError::PinMissing {
                what: "masquerade maps (programs of an older revision: reload them)",
                path: root.map(node, ebpf_cni_maps::MASQ_FWD_MAP),
            })?;
            m.install(spec)?;
            step("masquerade");
        }
        if !port_entries.is_empty() {
            add_ports(
                &root,
                node,
                &pins,
                key.id(),
                host_ifindex,
                port_entries,
                node_addrs,
            )?;
            step("port mappings");
        }
        match mode {
            AttachMode::Tcx => {
                // The attachment's directory and entries exist, so a concurrent DEL of the
                // node's last other pod will not tear the node down: the slow part below
                // runs without the lock, letting concurrent ADDs overlap.
                drop(lock.take());
                // Each TCX attach waits out an RCU grace period in the kernel (~15 ms here):
                // the two hooks attach at once so their waits overlap.
                let from_pod = progs
                    .fd(from_hook)?
                    .try_clone_to_owned()
                    .map_err(|source| BpfError::OpenPin {
                        path: root.program(node, super::revision(), from_hook.program()),
                        source,
                    })?;
                let to_pod = progs.fd(to_hook)?;
                let (a, b) = std::thread::scope(|s| {
                    let path = pins.link(from_hook);
                    let t = s.spawn(move || {
                        links::attach(
                            from_pod.as_fd(),
                            from_hook,
                            host_ifname,
                            host_ifindex,
                            &path,
                        )
                    });
                    let b = links::attach(
                        to_pod,
                        to_hook,
                        host_ifname,
                        host_ifindex,
                        &pins.link(to_hook),
                    );
                    (t.join().expect("attach thread does not panic"), b)
                });
                a?;
                b?;
            }
            AttachMode::Netlink => {
                for hook in Hook::pod(chained) {
                    links::attach_netlink(
                        progs.classifier(hook)?,
                        hook,
                        host_ifname,
                        &pins.netlink_record(hook),
                        None,
                    )?;
                }
            }
        }
        step("attached");
        Ok(())
    })();
    if res.is_err() {
        let _relock = if lock.is_none() {
            NodeLock::take(&root).ok()
        } else {
            None
        };
        if mode == AttachMode::Netlink {
            for hook in Hook::pod(chained) {
                links::detach_netlink(hook, host_ifname);
            }
        }
        let _ = remove_ports(&root, node, &pins, key.id());
        let _ = links::remove_dir_pins(&stop_at, pins.dir());
        let _ = maps.remove_attachment(key.id());
        if masq.is_some() {
            let ips: Vec<IpAddr> = endpoints.iter().map(|e| e.ip).collect();
            if let Err(e) = settle_masq(&root, node, &maps, &ips) {
                log::warn!("masquerade after a failed ADD: {e}");
            }
        }
        if fq_created {
            let _ = queue::remove(host_ifindex);
        }
    }
    res
}

/// Before ADD changes anything for these addresses: none may belong to another live
/// attachment of this node (see [`Maps::ensure_free`]).
pub fn ensure_addresses_free(
    node: &NodeId,
    key: &AttachmentKey<'_>,
    ips: &[IpAddr],
) -> Result<(), BpfError> {
    key.validate()?;
    match Maps::open(&PinRoot::from_env(), node)? {
        Some(maps) => maps.ensure_free(key.id(), ips),
        None => Ok(()),
    }
}

/// Detaches a pod: its links (unpinning detaches them) and its endpoint entries and
/// counters. Idempotent: `Ok(false)` when nothing was there. The last pod of a node takes
/// the node's device links, programs and maps with it.
pub fn del_pod(node: &NodeId, key: &AttachmentKey<'_>) -> Result<bool, BpfError> {
    key.validate()?;
    let root = PinRoot::from_env();
    ensure_bpffs_at(&root)?;
    if !root.node_dir(node).exists() {
        return Ok(false);
    }
    let _lock = NodeLock::take(&root)?;
    let pins = root.attachment(node, key);
    let mut errors = Vec::new();
    let mut removed = false;
    match remove_ports(&root, node, &pins, key.id()) {
        Ok(n) => removed |= n > 0,
        Err(e) => errors.push(e),
    }
    // Without its port list the attachment's pins stay, so a later DEL can retry.
    if !errors.is_empty() {
        return Err(errors.remove(0));
    }
    // On a device that outlives the pod (chained mode: the previous plugin's veth), the
    // netlink filters and the fq go first, found through the endpoint entries' host ifindex.
    let entries = Maps::open(&root, node)
        .ok()
        .flatten()
        .map(|m| m.entries_of(key.id()))
        .unwrap_or_default();
    let host_ifindex = entries.first().map(|(_, e)| e.host_ifindex);
    if let Some(i) = host_ifindex {
        match queue::remove(i) {
            Ok(r) => removed |= r,
            Err(e) => errors.push(e),
        }
    }
    let recorded: Vec<Hook> = Hook::ANY_POD
        .into_iter()
        .filter(|h| pins.netlink_record(*h).exists())
        .collect();
    if !recorded.is_empty() {
        let host = host_ifindex.and_then(|i| nix::net::if_::if_indextoname(i).ok());
        if let Some(ifname) = host {
            for hook in recorded {
                links::detach_netlink(hook, &ifname.to_string_lossy());
            }
        }
    }
    removed |= match links::remove_dir_pins(&root.attachments_dir(node), pins.dir()) {
        Ok(r) => r,
        Err(failures) => {
            errors.push(BpfError::Detach {
                dir: pins.dir().into(),
                failures,
            });
            false
        }
    };
    match Maps::open(&root, node) {
        Ok(Some(mut maps)) => {
            match maps.remove_attachment(key.id()) {
                Ok(n) => removed |= n > 0,
                Err(e) => errors.push(e),
            }
            // Its flows go with it, so a pod that gets the address next inherits none.
            let ips: Vec<IpAddr> = entries.iter().map(|(ip, _)| *ip).collect();
            if let Err(e) = settle_masq(&root, node, &maps, &ips) {
                errors.push(e);
            }
        }
        Ok(None) => {}
        Err(e) => errors.push(e),
    }
    // An ADD records its gateway use before its attachment directory exists: a recorded
    // gateway is a user of the node as much as an attachment is.
    if errors.is_empty()
        && attachment_count(&root.attachments_dir(node)) == 0
        && !super::gateways::in_use(&root, node)
    {
        teardown_node(&root, node)?;
    }
    match errors.into_iter().next() {
        None => Ok(removed),
        Some(e) => Err(e),
    }
}

/// After pods left (their addresses `gone`): their masqueraded flows are removed, and when
/// no masquerading pod is left the node stops masquerading (see [`MasqMaps::release`]).
fn settle_masq(
    root: &PinRoot,
    node: &NodeId,
    maps: &Maps,
    gone: &[IpAddr],
) -> Result<(), BpfError> {
    let Some(mut m) = MasqMaps::open(root, node)? else {
        return Ok(());
    };
    let n = m.remove_flows(gone);
    if n > 0 {
        log::debug!("removed {n} masqueraded flows of {gone:?}");
    }
    if !maps.any_masq() {
        m.release()?;
    }
    Ok(())
}

/// GC: the masqueraded flows idle past their timeout, or of addresses no pod of the node
/// holds, are removed (see [`MasqMaps::sweep`]); returns how many.
pub fn sweep_masq(node: &NodeId) -> Result<usize, BpfError> {
    let root = PinRoot::from_env();
    if !root.node_dir(node).exists() {
        return Ok(0);
    }
    let _lock = NodeLock::take(&root)?;
    let (Some(maps), Some(mut m)) = (Maps::open(&root, node)?, MasqMaps::open(&root, node)?) else {
        return Ok(0);
    };
    let live = maps.endpoint_ips();
    m.sweep(&live)
}

/// CHECK: the kernel holds what `pod` describes (as ADD installed it): both links live on
/// its host veth with our programs (netlink mode: the records are there; the caller checks
/// the filters themselves), the endpoint map holds each address with the right host veth
/// and MACs, and the limits, pacing and host ports are the described ones.
pub fn check_pod(
    node: &NodeId,
    key: &AttachmentKey<'_>,
    pod: &PodSpec<'_>,
    mode: AttachMode,
) -> Result<(), BpfError> {
    let PodSpec {
        host_ifindex,
        endpoints,
        limits,
        ports: port_entries,
        chained,
        netns_cookie,
        masq,
        ..
    } = *pod;
    key.validate()?;
    let root = PinRoot::from_env();
    let pins = root.attachment(node, key);
    for hook in Hook::pod(chained) {
        match mode {
            AttachMode::Tcx => links::check(hook, &pins.link(hook), host_ifindex)?,
            AttachMode::Netlink => {
                links::require_pin(hook.netlink_record_name(), &pins.netlink_record(hook))?
            }
        }
    }
    let maps = Maps::open(&root, node)?.ok_or_else(|| BpfError::PinMissing {
        what: "endpoint map",
        path: root.map(node, ebpf_cni_maps::ENDPOINTS_MAP),
    })?;
    maps.check_pod(key.id(), endpoints)?;
    if let Some(spec) = masq {
        MasqMaps::open(&root, node)?
            .ok_or_else(|| BpfError::PinMissing {
                what: "masquerade maps",
                path: root.map(node, ebpf_cni_maps::MASQ_FWD_MAP),
            })?
            .check(spec)?;
    }
    maps.check_limits(host_ifindex, limits)?;
    queue::check(host_ifindex, maps.limits(host_ifindex))?;
    // As ADD decided: no pacing where the kernel refused the program.
    let pacing = pacing_rate(limits)
        .filter(|_| netns_cookie != 0 && Programs::pacing_available(&root, node));
    maps.check_pacing(netns_cookie, key.id(), pacing)?;
    if pacing.is_some() {
        ports::check_pacing_link(&root, node)?;
    }
    if !port_entries.is_empty() {
        let pm = PortMaps::open(&root, node)?;
        pm.check(key.id(), host_ifindex, port_entries)?;
        let listed = ports::attachment_ports(&pins.ports())?;
        for e in port_entries {
            let k = ports::port_key(e);
            if !listed.contains(&k) {
                return Err(BpfError::PinMissing {
                    what: "attachment port list entry",
                    path: pins.ports(),
                });
            }
        }
        if !pm.enabled() {
            return Err(BpfError::PortMappingMissing {
                mapping: "(node switch: port mappings are turned off in ECNI_CONFIG)".to_owned(),
            });
        }
        if kernel::has_netns_cookie() {
            ports::check_sock_links(&root, node)?;
        }
    }
    Ok(())
}

/// Puts the device program on every device of `devices` that lacks a live link of it, and
/// removes the links of devices no longer listed.
fn sync_devices(
    root: &PinRoot,
    node: &NodeId,
    progs: &mut Programs,
    devices: &[Device],
    mode: AttachMode,
) -> Result<(), BpfError> {
    let dir = root.devices_dir(node);
    if mode == AttachMode::Netlink {
        for dev in devices {
            let record = root.device_netlink_record(node, &dev.name);
            if record.exists() {
                continue;
            }
            create_dir_all_racy(record.parent().expect("a record lives in a directory"))?;
            links::attach_netlink(
                progs.classifier(Hook::FromDev)?,
                Hook::FromDev,
                &dev.name,
                &record,
                Some(&root.device_clsact_record(node, &dev.name)),
            )?;
        }
    }
    for dev in devices.iter().filter(|_| mode == AttachMode::Tcx) {
        let path = root.device_link(node, &dev.name);
        match links::check(Hook::FromDev, &path, dev.ifindex) {
            Ok(()) => continue,
            Err(BpfError::PinMissing { .. }) => {}
            Err(e) => {
                log::info!("re-attaching the device program to {}: {e}", dev.name);
                let _ = fs::remove_file(&path);
            }
        }
        create_dir_all_racy(path.parent().expect("a device link lives in a directory"))?;
        links::attach(
            progs.fd(Hook::FromDev)?,
            Hook::FromDev,
            &dev.name,
            dev.ifindex,
            &path,
        )?;
    }
    if let Ok(entries) = fs::read_dir(&dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !devices.iter().any(|d| d.name == name) {
                if e.path().join(Hook::FromDev.netlink_record_name()).exists() {
                    links::detach_device_netlink(&name, &root.device_clsact_record(node, &name));
                }
                let _ = links::remove_dir_pins(&dir, &e.path());
            }
        }
    }
    Ok(())
}

/// Attachment directories (`<network>/<container>/<ifname>`) below `attachments/`.
fn attachment_dirs(attachments: &Path) -> Vec<(String, String, String)> {
    let names = |p: &Path| -> Vec<String> {
        fs::read_dir(p)
            .map(|es| {
                es.flatten()
                    .filter(|e| e.path().is_dir())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for net in names(attachments) {
        for cid in names(&attachments.join(&net)) {
            for ifname in names(&attachments.join(&net).join(&cid)) {
                out.push((net.clone(), cid.clone(), ifname));
            }
        }
    }
    out.sort();
    out
}

fn attachment_count(attachments: &Path) -> usize {
    attachment_dirs(attachments).len()
}

/// No pod left: the device links (unpinning detaches them; netlink filters are removed,
/// with the `clsact` qdiscs ebpf-cni created that hold no other filter), programs and maps
/// go.
fn teardown_node(root: &PinRoot, node: &NodeId) -> Result<(), BpfError> {
    let dir = root.node_dir(node);
    if let Ok(entries) = fs::read_dir(root.devices_dir(node)) {
        for e in entries.flatten() {
            if e.path().join(Hook::FromDev.netlink_record_name()).exists() {
                let name = e.file_name().to_string_lossy().into_owned();
                links::detach_device_netlink(&name, &root.device_clsact_record(node, &name));
            }
        }
    }
    log::info!("last pod of {node} deleted: removing {}", dir.display());
    match fs::remove_dir_all(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(BpfError::NodeTeardown { path: dir, source }),
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Counts {
    pub packets: u64,
    pub bytes: u64,
    pub drops: u64,
    pub errors: u64,
    pub marks: u64,
}

impl From<&ebpf_cni_maps::DirCounters> for Counts {
    fn from(d: &ebpf_cni_maps::DirCounters) -> Self {
        Self {
            packets: d.packets,
            bytes: d.bytes,
            drops: d.drops,
            errors: d.errors,
            marks: d.marks,
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
    pub attachments: Vec<AttachmentReport>,
    /// Addresses wildcard host ports answer on.
    pub node_addresses: Vec<IpAddr>,
    pub port_mappings: Vec<PortMappingReport>,
    /// The pods' IPv4 gateways the node holds on `lo`, and who uses each.
    pub gateways: Vec<GatewayReport>,
    /// Masquerade: the port range, flows per pod, allocation failures (`None` on a node
    /// whose maps predate it).
    pub masquerade: Option<MasqReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GatewayReport {
    pub address: std::net::Ipv4Addr,
    /// `<network>/<container id>/<ifname>` of each attachment using it (the attachment id
    /// in hex when its directory is gone).
    pub users: Vec<String>,
}

/// Program names by id: every pod runs the same few programs, so each name costs its
/// syscalls once per `inspect`, not once per link.
#[derive(Default)]
struct ProgNames(std::collections::HashMap<u32, String>);

impl ProgNames {
    fn get(&mut self, id: u32) -> String {
        self.0
            .entry(id)
            .or_insert_with(|| super::sys::prog_name(id).unwrap_or_default())
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
    let fd = super::sys::obj_get(record).ok()?;
    let program_id = super::sys::prog_id(fd.as_fd()).ok()?;
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
        .filter_map(|name| {
            let fd = super::sys::obj_get(&root.map(node, name)).ok()?;
            match super::sys::map_usage(fd.as_fd()) {
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

/// Everything this node has pinned, with the kernel's view of each link and the counters.
pub fn inspect(node: &NodeId) -> Result<NodeReport, BpfError> {
    let root = PinRoot::from_env();
    let maps = Maps::open(&root, node)?;
    let list = |p: &Path| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(p)
            .map(|es| {
                es.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    let mut prog_names = ProgNames::default();
    let devices = list(&root.devices_dir(node))
        .into_iter()
        .map(|name| {
            let link = link_report(
                &mut prog_names,
                Hook::FromDev,
                &root.device_link(node, &name),
            )
            .or_else(|| {
                netlink_report(
                    &mut prog_names,
                    Hook::FromDev,
                    &root.device_netlink_record(node, &name),
                    None,
                )
            });
            DeviceReport { name, link }
        })
        .collect();
    let mut attachments = Vec::new();
    let mut names = std::collections::HashMap::new();
    // One walk of each map for the whole node: per-pod walks cost O(pods²) syscalls.
    let mut by_attachment = maps
        .as_ref()
        .map(Maps::entries_by_attachment)
        .unwrap_or_default();
    let pacing = maps
        .as_ref()
        .map(Maps::pacing_by_attachment)
        .unwrap_or_default();
    for (network, container_id, ifname) in attachment_dirs(&root.attachments_dir(node)) {
        let key = AttachmentKey {
            network: &network,
            container_id: &container_id,
            ifname: &ifname,
        };
        names.insert(key.id(), format!("{network}/{container_id}/{ifname}"));
        let pins = root.attachment(node, &key);
        let mut links: Vec<LinkReport> = Hook::ANY_POD
            .iter()
            .filter_map(|h| link_report(&mut prog_names, *h, &pins.link(*h)))
            .collect();
        let mut entries = by_attachment.remove(&key.id()).unwrap_or_default();
        entries.sort_by_key(|(ip, _)| *ip);
        let host_ifindex = entries
            .first()
            .map(|(_, e)| e.host_ifindex)
            .or_else(|| links.first().map(|l| l.ifindex));
        links.extend(Hook::ANY_POD.iter().filter_map(|h| {
            netlink_report(&mut prog_names, *h, &pins.netlink_record(*h), host_ifindex)
        }));
        let counters = host_ifindex.and_then(|i| maps.as_ref()?.counters(i));
        let limits = host_ifindex.and_then(|i| maps.as_ref()?.limits(i));
        let report = |b: ebpf_cni_maps::Bucket| {
            (b.rate_bytes > 0).then(|| LimitReport {
                rate_bytes: b.rate_bytes,
                burst_bytes: u64::from(b.burst_bytes),
                mode: queue::mode_label(b.mode),
                horizon_ns: (b.mode == ebpf_cni_maps::LIMIT_EDT)
                    .then(|| ebpf_cni_maps::edt_horizon_ns(b.rate_bytes)),
            })
        };
        attachments.push(AttachmentReport {
            addresses: entries.iter().map(|(ip, _)| *ip).collect(),
            host_ifindex,
            links,
            from_pod: counters.as_ref().map(|c| (&c.from_pod).into()),
            to_pod: counters.as_ref().map(|c| (&c.to_pod).into()),
            ingress_limit: limits.and_then(|l| report(l.ingress)),
            egress_limit: limits.and_then(|l| report(l.egress)),
            tcp_pacing_bytes: pacing.get(&key.id()).copied(),
            network,
            container_id,
            ifname,
        });
    }
    let (mut node_addresses, mut port_mappings) = (Vec::new(), Vec::new());
    if maps.is_some() && root.map(node, ebpf_cni_maps::PORTMAP_MAP).exists() {
        let pm = PortMaps::open(&root, node)?;
        node_addresses = pm.node_addrs();
        for m in pm.list() {
            let pod = super::dataplane::key_ip(&ebpf_cni_maps::EndpointKey {
                addr: m.target.pod_addr,
            });
            let host_ip = match m.key.addr {
                a if a == ebpf_cni_maps::PortKey::WILDCARD_V6 => {
                    IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
                }
                addr => super::dataplane::key_ip(&ebpf_cni_maps::EndpointKey { addr }),
            };
            port_mappings.push(PortMappingReport {
                host: ports::describe_key(&m.key),
                protocol: crate::portmap::Protocol::from_number(m.key.proto)
                    .map_or("unknown", crate::portmap::Protocol::as_str),
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
            });
        }
    }
    Ok(NodeReport {
        node: node.to_string(),
        kernel: kernel::release().to_owned(),
        modes: super::part_modes(node),
        pin_dir: root.node_dir(node).display().to_string(),
        revisions: list(&root.programs_dir(node)),
        endpoints: maps.as_ref().map_or(0, Maps::endpoint_count),
        maps: map_usage(&root, node),
        devices,
        attachments,
        node_addresses,
        port_mappings,
        gateways: super::gateways::list(node)
            .into_iter()
            .map(|(address, ids)| GatewayReport {
                address,
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
            .collect(),
        masquerade: MasqMaps::open(&root, node)?.map(|m| m.report()),
    })
}
