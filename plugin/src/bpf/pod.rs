//! What ADD, DEL and CHECK do with the dataplane: a pod's links, endpoint entries, source
//! check, limits, pacing, masquerade and host ports, the node's device links, and the node's teardown
//! when its last pod goes. `inspect.rs` reports what they left.

use std::{fs, net::IpAddr, os::fd::AsFd};

use super::{
    cgroup,
    converge::{self, ConvergedBy, NodeView},
    cookie,
    error::{collect, log_each},
    kernel, links,
    lock::NodeLock,
    maps::{Maps, PodEndpoint, SourceCheck, SourceRecord},
    masq::{MasqMaps, MasqSpec},
    pin::{create_dir_all_racy, ensure_bpffs_at, AttachmentPins, NodeId, PinRoot},
    ports::{self, PortMaps},
    programs::{self, Programs},
    queue, tree, AttachMode, AttachmentKey, BpfError, Hook,
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
    /// The `unshapedSubnets`/`shapedSubnets` entries of a limited pod (the rule is a flag
    /// in `limits`).
    pub shape_subnets: &'a [crate::bandwidth::SubnetKey],
    /// Host port mappings to install.
    pub ports: &'a [PortEntry],
    /// Chained mode: another plugin made the interface and forwards the pod's traffic; the
    /// host veth gets `ecni_from_chain` instead of `ecni_from_pod`.
    pub chained: bool,
    /// The cookie of the pod's network namespace: with an egress limit, its TCP sockets
    /// are paced (`ecni_sockops`).
    pub netns_cookie: u64,
    /// `ipMasq`: what the node needs for the pod's masquerade (its endpoints carry the flag).
    pub masq: Option<&'a MasqSpec>,
    /// What the pod may send from (its host veth's ingress program drops the rest).
    pub sources: &'a SourceCheck,
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
/// list); the list itself goes with the attachment's directory. The node's own sockets
/// connected through them to the pod are destroyed (see `netlink::sockets`): they would
/// keep sending to the pod's address, whoever takes the host port next.
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
    let removed = PortMaps::open(root, node)?.remove(id, &keys)?;
    for (key, target) in &removed {
        if key.proto != ebpf_cni_maps::IPPROTO_TCP && key.proto != ebpf_cni_maps::IPPROTO_UDP {
            continue;
        }
        let pod = super::keys::key_ip(&ebpf_cni_maps::EndpointKey {
            addr: target.pod_addr,
        });
        match crate::netlink::sockets::destroy_connected(key.proto, pod, target.pod_port) {
            Ok(0) => {}
            Ok(n) => log::info!(
                "closed {n} socket(s) of the node connected to {pod} port {} through host port {}",
                target.pod_port,
                ports::describe_key(key)
            ),
            // Not a failure of the teardown: those sockets only keep talking to nothing.
            Err(e) => log::warn!(
                "cannot close the node's sockets connected to {pod} port {} (host port {}): {e}",
                target.pod_port,
                ports::describe_key(key)
            ),
        }
    }
    Ok(removed.len())
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
    // Attached first: without SO_NETNS_COOKIE (before 5.14) `ecni_connect4` itself tells
    // the node's cookie. Until the config holds it, the programs act on no socket.
    cgroup::ensure_sock_links(root, node)?;
    let cookie = cookie::node_netns_cookie(root, node, pm.netns_cookie())?;
    pm.enable(cookie)?;
    pm.sync_node_addrs(node_addrs)?;
    // The list first: whatever happens next, DEL finds what to remove.
    let keys: Vec<_> = entries.iter().map(ports::port_key).collect();
    ports::pin_attachment_ports(&pins.ports(), &keys)?;
    pm.install(id, host_ifindex, entries)
}

/// Attaches a pod: its host veth gets the pod programs (TCX links pinned under the
/// attachment's directory, or netlink filters with a pinned record), the endpoint map
/// learns its addresses, and the node is converged to `view` (its device links, host-port
/// addresses and masquerade sources: see `converge.rs`). On error nothing of the pod stays.
pub fn add_pod(
    node: &NodeId,
    key: &AttachmentKey<'_>,
    pod: &PodSpec<'_>,
    view: &NodeView,
    mode: AttachMode,
) -> Result<(), BpfError> {
    let PodSpec {
        host_ifname,
        host_ifindex,
        endpoints,
        limits,
        shape_subnets,
        ports: port_entries,
        chained,
        netns_cookie,
        masq,
        sources,
    } = *pod;
    let [from_hook, to_hook] = Hook::pod(chained);
    key.validate()?;
    if programs::PROGRAMS.is_empty() {
        return Err(BpfError::NotBuilt);
    }
    let t = std::time::Instant::now();
    let step =
        |what: &str| log::debug!("add_pod {what}: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let root = PinRoot::from_env();
    ensure_bpffs_at(&root)?;
    let mut lock = Some(NodeLock::take(&root)?);
    step("locked");
    let mut progs = Some(Programs::open_or_load(&root, node)?);
    step("programs");
    let mut maps = Maps::open(&root, node)?.ok_or_else(|| BpfError::PinMissing {
        what: "endpoint map",
        path: root.map(node, ebpf_cni_maps::ENDPOINTS_MAP),
    })?;
    step("maps");
    if let Err(e) = converge::converge_locked(&root, node, view, ConvergedBy::Add, &mut progs) {
        // The pod works without them (traffic from devices then takes the stack).
        log::warn!("node devices: {e}");
    }
    let mut progs = progs.expect("opened above");
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
        // Before the programs attach: the pod's first frame is checked. The record says
        // whether CHECK must find entries (a pod of an older release has neither).
        create_dir_all_racy(&pins.source_check_record(sources.is_on()))?;
        maps.install_sources(key.id(), host_ifindex, sources)?;
        let mut limits = limits;
        let pod_name = format!("{}/{}/{}", key.network, key.container_id, key.ifname);
        fq_created = queue::prepare(host_ifindex, &mut limits, &pod_name)?;
        maps.set_limits(host_ifindex, limits)?;
        maps.set_shape_subnets(host_ifindex, shape_subnets)?;
        if let Some(rate) = pacing_rate(limits) {
            if netns_cookie != 0 && Programs::pacing_available(&root, node) {
                // The sockops program looks up a pod with subnets by its host veth.
                let shape_ifindex = if shape_subnets.is_empty() {
                    0
                } else {
                    host_ifindex
                };
                maps.set_pacing(netns_cookie, key.id(), rate, shape_ifindex)?;
                cgroup::ensure_pacing_link(&root, node)?;
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
            m.install(spec, &view.masq_sources)?;
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
                &view.addrs,
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
    let Err(error) = res else {
        return Ok(());
    };
    // Undo: every step is tried, past the failures of the others.
    let mut undo = Vec::new();
    let _relock = if lock.is_none() {
        NodeLock::take(&root).map_err(|e| undo.push(e)).ok()
    } else {
        None
    };
    if mode == AttachMode::Netlink {
        for hook in Hook::pod(chained) {
            links::detach_netlink(hook, host_ifname);
        }
    }
    if let Err(e) = remove_ports(&root, node, &pins, key.id()) {
        undo.push(e);
    }
    if let Err(failures) = links::remove_dir_pins(&stop_at, pins.dir()) {
        undo.push(BpfError::Detach {
            dir: pins.dir().into(),
            failures,
        });
    }
    if let Err(e) = maps.remove_attachment(key.id()) {
        undo.push(e);
    }
    if masq.is_some() {
        let ips: Vec<IpAddr> = endpoints.iter().map(|e| e.ip).collect();
        if let Err(e) = settle_masq(&root, node, &maps, &ips) {
            undo.push(e);
        }
    }
    if fq_created {
        if let Err(e) = queue::remove(host_ifindex) {
            undo.push(e);
        }
    }
    if undo.is_empty() {
        return Err(error);
    }
    log_each("undoing a failed ADD", &undo);
    Err(BpfError::AddUndone {
        error: Box::new(error),
        undo,
    })
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
/// the node's device links, programs and maps with it. Every step is tried, past the
/// failures of the others; the failures are logged and returned together (see
/// [`collect`]), and the node stays while any is left.
pub fn del_pod(node: &NodeId, key: &AttachmentKey<'_>) -> Result<bool, BpfError> {
    key.validate()?;
    let root = PinRoot::from_env();
    ensure_bpffs_at(&root)?;
    if !root.node_dir(node).exists() {
        return Ok(false);
    }
    let _lock = NodeLock::take(&root)?;
    let pins = root.attachment(node, key);
    let mut failures = Vec::new();
    let mut removed = false;
    let ports_left = match remove_ports(&root, node, &pins, key.id()) {
        Ok(n) => {
            removed |= n > 0;
            false
        }
        Err(e) => {
            failures.push(e);
            true
        }
    };
    let mut maps = match Maps::open(&root, node) {
        Ok(maps) => maps,
        Err(e) => {
            failures.push(e);
            None
        }
    };
    // On a device that outlives the pod (chained mode: the previous plugin's veth), the
    // netlink filters and the fq go first, found through the endpoint entries' host ifindex.
    let entries = maps
        .as_ref()
        .map(|m| m.entries_of(key.id()))
        .unwrap_or_default();
    let host_ifindex = entries.first().map(|(_, e)| e.host_ifindex);
    if let Some(i) = host_ifindex {
        match queue::remove(i) {
            Ok(r) => removed |= r,
            Err(e) => failures.push(e),
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
    // Without its port list the attachment's pins stay, so a later DEL can retry what the
    // failure above left.
    if !ports_left {
        match links::remove_dir_pins(&root.attachments_dir(node), pins.dir()) {
            Ok(r) => removed |= r,
            Err(failures_here) => failures.push(BpfError::Detach {
                dir: pins.dir().into(),
                failures: failures_here,
            }),
        }
    }
    if let Some(maps) = maps.as_mut() {
        match maps.remove_attachment(key.id()) {
            Ok(n) => removed |= n > 0,
            Err(e) => failures.push(e),
        }
        // Its flows go with it, so a pod that gets the address next inherits none.
        let ips: Vec<IpAddr> = entries.iter().map(|(ip, _)| *ip).collect();
        if let Err(e) = settle_masq(&root, node, maps, &ips) {
            failures.push(e);
        }
    }
    // An ADD records its gateway use before its attachment directory exists: a recorded
    // gateway is a user of the node as much as an attachment is.
    if failures.is_empty() && !super::gateways::in_use(&root, node) {
        match tree::attachments(&root, node) {
            Ok(left) if left.is_empty() => {
                log::info!(
                    "last pod of {node} deleted: removing {}",
                    root.node_dir(node).display()
                );
                if let Err(e) = teardown_node(&root, node) {
                    failures.push(e);
                }
            }
            Ok(_) => {}
            Err(e) => failures.push(e),
        }
    }
    collect("DEL of the attachment's eBPF state", failures).map(|()| removed)
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

/// What the attachment's record says ADD did about its source check.
pub(super) fn source_record(pins: &AttachmentPins) -> SourceRecord {
    if pins.source_check_record(true).exists() {
        SourceRecord::On
    } else if pins.source_check_record(false).exists() {
        SourceRecord::Off
    } else {
        SourceRecord::None
    }
}

/// GC: the source entries of attachments this node no longer has (a DEL by a release that
/// did not know the source map, a veth deleted without DEL) are removed; returns how many.
pub fn sweep_sources(node: &NodeId) -> Result<usize, BpfError> {
    let root = PinRoot::from_env();
    if !root.node_dir(node).exists() {
        return Ok(0);
    }
    // Under the lock: an ADD creates its attachment's directory before its entries.
    let _lock = NodeLock::take(&root)?;
    let Some(mut maps) = Maps::open(&root, node)? else {
        return Ok(0);
    };
    let live: std::collections::HashSet<u64> = tree::attachments(&root, node)?
        .iter()
        .map(|a| a.key().id())
        .collect();
    maps.sweep_sources(&live)
}

/// CHECK: the kernel holds what `pod` describes (as ADD installed it): both links live on
/// its host veth with our programs (netlink mode: the records are there; the caller checks
/// the filters themselves), the endpoint map holds each address with the right host veth
/// and MACs, the source map exactly the pod's allowed sources and MAC, and the limits,
/// pacing and host ports are the described ones.
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
        shape_subnets,
        ports: port_entries,
        chained,
        netns_cookie,
        masq,
        sources,
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
    // A pod attached by a release before the source check has no record and no entries:
    // it keeps running unchecked until its next ADD, and that is its correct state.
    maps.check_sources(key.id(), host_ifindex, sources, source_record(&pins))?;
    if let Some(spec) = masq {
        MasqMaps::open(&root, node)?
            .ok_or_else(|| BpfError::PinMissing {
                what: "masquerade maps",
                path: root.map(node, ebpf_cni_maps::MASQ_FWD_MAP),
            })?
            .check(spec)?;
    }
    maps.check_limits(host_ifindex, limits)?;
    maps.check_shape_subnets(host_ifindex, shape_subnets)?;
    queue::check(host_ifindex, maps.limits(host_ifindex))?;
    // As ADD decided: no pacing where the kernel refused the program.
    let pacing = pacing_rate(limits)
        .filter(|_| netns_cookie != 0 && Programs::pacing_available(&root, node));
    let shape_ifindex = if shape_subnets.is_empty() {
        0
    } else {
        host_ifindex
    };
    maps.check_pacing(netns_cookie, key.id(), pacing.map(|r| (r, shape_ifindex)))?;
    if pacing.is_some() {
        cgroup::check_pacing_link(&root, node)?;
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
        // A node whose mappings an older build installed on a kernel without SO_NETNS_COOKIE
        // has no cookie and no socket programs until its next ADD with mappings.
        if pm.netns_cookie() != 0 {
            cgroup::check_sock_links(&root, node)?;
        }
    }
    Ok(())
}

/// No pod left: the device links (unpinning detaches them; netlink filters are removed,
/// with the `clsact` qdiscs ebpf-cni created that hold no other filter), programs and maps
/// go. Also `uninstall --purge`'s removal (see `purge.rs`).
pub(super) fn teardown_node(root: &PinRoot, node: &NodeId) -> Result<(), BpfError> {
    let dir = root.node_dir(node);
    if let Ok(entries) = fs::read_dir(root.devices_dir(node)) {
        for e in entries.flatten() {
            if e.path().join(Hook::FromDev.netlink_record_name()).exists() {
                let name = e.file_name().to_string_lossy().into_owned();
                links::detach_device_netlink(&name, &root.device_clsact_record(node, &name));
            }
        }
    }
    match fs::remove_dir_all(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(BpfError::NodeTeardown { path: dir, source }),
    }
}
