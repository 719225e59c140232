//! The node's convergence: what the node's programs know of its devices and addresses
//! brought in line with the devices and addresses it has now. Between two ADDs an address
//! comes or goes (a DHCP renewal, a keepalived or kube-vip VIP), a NIC appears or leaves;
//! the device program must be on every device that takes traffic for pods and on no other,
//! wildcard host ports must answer on every address of the node, and masquerade must leave
//! with each egress device's current address. STATUS and the agent also attach again a
//! socket or pacing program's link on the cgroup v2 root that its users need and that was
//! detached or unpinned.
//!
//! ADD, STATUS and `ebpf-cni agent` converge the node. The state is read first without the
//! lock and compared with what the node has (a few map reads and one look at each device's
//! pin); only when something differs is the node lock taken, the comparison made again
//! under it, and the differences written, so a STATUS on a node in line writes nothing.
//! Each convergence that changed something records when and by whom (`converged/` in the
//! node's directory: an empty directory named `<unix ms>-<by>`: bpffs names may not hold a dot), which
//! `inspect` shows.

use std::{fs, net::IpAddr, path::Path};

use crate::netfilter::masq_ports;

use super::{
    cgroup,
    host_ports::PortMaps,
    links,
    lock::NodeLock,
    masquerade::MasqMaps,
    pin::{create_dir_all_racy, walk, NodeId, PinRoot},
    programs::Programs,
    services::ServicesMaps,
    tunnel::{TunnelMaps, TunnelView, TUNNEL_DEVICE},
    AttachMode, BpfError, Device, Hook,
};

/// The node as it is now: what the node's programs should know of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// The devices that get the device program.
    pub devices: Vec<Device>,
    /// Every global address of the node (wildcard host ports answer on each).
    pub addrs: Vec<IpAddr>,
    /// Every global address with the index of the link holding it, in the kernel's order,
    /// `lo` included (what [`Self::loopback`] and [`Self::masq_sources`] read, and which
    /// host veths hold the pods' IPv6 gateways: `gateway::restore`).
    pub by_link: Vec<(u32, IpAddr)>,
    /// How the device program attaches.
    pub mode: AttachMode,
    /// The Service ranges the programs hand to the stack, as STATUS and the agent learned
    /// them (`crate::services`); `None` for ADD, which leaves them as they are.
    pub services: Option<ServicesView>,
    /// The addresses of kube-proxy's IPVS dummy device (`kube-ipvs0`): Service addresses,
    /// which are in none of the fields above.
    pub ipvs: Vec<IpAddr>,
    /// The cluster network's tunnel device and its peers (one of `devices` too).
    pub tunnel: Option<super::tunnel::TunnelView>,
}

/// The node's Services as learned: the ranges, and where they came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServicesView {
    pub nets: Vec<ipnetwork::IpNetwork>,
    /// `kube-proxy-iptables-nft`, `config`, … joined by `+`; `none`.
    pub source: String,
    /// Those of `nets` kube-proxy translates, whose packets from a masquerading pod carry
    /// `masq_mark`.
    pub translated: Vec<ipnetwork::IpNetwork>,
    /// kube-proxy's masquerade mark (0: none learned).
    pub masq_mark: u32,
}

impl ServicesView {
    /// Each range with the mark its entry holds.
    pub fn entries(&self) -> Vec<(ipnetwork::IpNetwork, u32)> {
        self.nets
            .iter()
            .map(|n| {
                let mark = if self.translated.contains(n) {
                    self.masq_mark
                } else {
                    0
                };
                (*n, mark)
            })
            .collect()
    }
}

impl ServicesView {
    /// Whether the programs hand Service flows to the stack.
    pub fn in_force(&self) -> bool {
        !self.nets.is_empty()
    }
}

impl NodeView {
    /// Whether `lo` holds `ip`: the pods' IPv4 gateways (`gateway.rs`), which ADD finds
    /// there rather than asking for them again.
    pub fn on_loopback(&self, ip: IpAddr) -> bool {
        self.holds(crate::netlink::LOOPBACK_IFINDEX, ip)
    }

    /// The addresses masqueraded flows may leave with, `(ifindex, address)` in the
    /// kernel's order (see `MasqMaps::install`): every global address but `lo`'s (which
    /// holds the pods' IPv4 gateways). A device's first address of a family is the one its
    /// masqueraded flows take where the FIB lookup cannot tell.
    pub fn masq_sources(&self) -> Vec<(u32, IpAddr)> {
        self.by_link
            .iter()
            .filter(|(i, _)| *i != crate::netlink::LOOPBACK_IFINDEX)
            .copied()
            .collect()
    }

    /// `ip` put on `lo` after the view was read (a pod gateway added again): one more of
    /// the node's addresses, which wildcard host ports answer on as before.
    pub fn add_loopback(&mut self, ip: IpAddr) {
        self.add_held(crate::netlink::LOOPBACK_IFINDEX, ip);
    }

    /// How many links hold `ip`.
    pub fn holders(&self, ip: IpAddr) -> usize {
        self.by_link.iter().filter(|(_, a)| *a == ip).count()
    }

    /// Whether link `ifindex` holds `ip`.
    pub fn holds(&self, ifindex: u32, ip: IpAddr) -> bool {
        self.by_link.contains(&(ifindex, ip))
    }

    /// `ip` put on link `ifindex` after the view was read (a pod's IPv6 gateway on its
    /// host veth again).
    pub fn add_held(&mut self, ifindex: u32, ip: IpAddr) {
        if !self.holds(ifindex, ip) {
            self.by_link.push((ifindex, ip));
        }
        if let Err(at) = self.addrs.binary_search(&ip) {
            self.addrs.insert(at, ip);
        }
    }
}

/// Who converged the node (recorded with the time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvergedBy {
    Add,
    Status,
    Agent,
}

impl ConvergedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Add => "add",
            Self::Status => "status",
            Self::Agent => "agent",
        }
    }
}

/// The last convergence that changed the node, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvergeRecord {
    /// Milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// `add`, `status` or `agent`.
    pub by: String,
}

impl ConvergeRecord {
    /// The time in UTC, RFC 3339.
    pub fn at(&self) -> String {
        utc_rfc3339(self.at_unix_ms)
    }
}

/// `inspect --json` shows the time both ways (`at_unix_ms`, and `at` for people).
impl serde::Serialize for ConvergeRecord {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let mut st = s.serialize_struct("ConvergeRecord", 3)?;
        st.serialize_field("at_unix_ms", &self.at_unix_ms)?;
        st.serialize_field("at", &self.at())?;
        st.serialize_field("by", &self.by)?;
        st.end()
    }
}

/// `unix_ms` as RFC 3339 in UTC, to the millisecond (days to a civil date: H. Hinnant's
/// `civil_from_days`).
pub fn utc_rfc3339(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX);
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        unix_ms % 1000
    )
}

/// What a convergence found different from the node's state, one line per change.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    attach: Vec<Device>,
    /// Device directories whose link is pinned but dead or wrong: removed, then attached.
    reattach: Vec<Device>,
    detach: Vec<String>,
    /// `None`: no host port on the node, nothing to keep.
    node_addrs: Option<AddrDiff>,
    /// `None`: the node does not masquerade, or the sources are in line.
    masq_sources: bool,
    /// Programs whose link on the cgroup v2 root their users need and is not attached
    /// (looked at by STATUS and the agent, not by ADD: see `cgroup::links_to_restore`).
    links: Vec<&'static str>,
    /// The Service ranges or the switch differ from the view's (or its source's record):
    /// what they become.
    services: Option<String>,
    /// kube-proxy's masquerade ports (`netfilter::masq_ports`) differ from what the node
    /// wants: what it wants (`None`: no table).
    masq_ports: Option<Option<masq_ports::Guard>>,
    /// The tunnel device needs its egress program.
    tunnel_hook: bool,
    /// The tunnel maps differ from the view's tunnel: what they become.
    tunnel_maps: Option<String>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct AddrDiff {
    added: Vec<IpAddr>,
    removed: Vec<IpAddr>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.attach.is_empty()
            && self.reattach.is_empty()
            && self.detach.is_empty()
            && self.node_addrs.is_none()
            && !self.masq_sources
            && self.links.is_empty()
            && self.services.is_none()
            && self.masq_ports.is_none()
            && !self.tunnel_hook
            && self.tunnel_maps.is_none()
    }

    /// One line per change, for the log.
    pub fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        out.extend(
            self.attach
                .iter()
                .map(|d| format!("device program attached to {}", d.name)),
        );
        out.extend(
            self.reattach
                .iter()
                .map(|d| format!("device program re-attached to {}", d.name)),
        );
        out.extend(
            self.detach
                .iter()
                .map(|n| format!("device program taken off {n}")),
        );
        if let Some(d) = &self.node_addrs {
            out.extend(
                d.added
                    .iter()
                    .map(|a| format!("wildcard host ports answer on {a}")),
            );
            out.extend(
                d.removed
                    .iter()
                    .map(|a| format!("wildcard host ports no longer answer on {a}")),
            );
        }
        if self.masq_sources {
            out.push("masquerade's source addresses follow the devices' addresses".to_owned());
        }
        out.extend(
            self.links
                .iter()
                .map(|n| format!("{n} attached to the cgroup v2 root again")),
        );
        if let Some(line) = &self.services {
            out.push(line.clone());
        }
        match &self.masq_ports {
            Some(Some(g)) => out.push(format!(
                "kube-proxy's masquerade keeps to ports {}-{} (mark {:#x})",
                g.ports.0, g.ports.1, g.mark
            )),
            Some(None) => out.push("kube-proxy's masquerade has every port again".to_owned()),
            None => {}
        }
        if self.tunnel_hook {
            out.push(format!("tunnel program attached to {TUNNEL_DEVICE}"));
        }
        if let Some(line) = &self.tunnel_maps {
            out.push(line.clone());
        }
        out
    }
}

/// Compares the node's state with `view`; reads only. The cgroup links are looked at by
/// STATUS and the agent: an ADD with host ports or a limit lists their pins itself, and
/// the next STATUS (containerd's every 5 s) attaches again one an operator detached.
fn plan(
    root: &PinRoot,
    node: &NodeId,
    view: &NodeView,
    by: ConvergedBy,
    ports: &mut Option<PortMaps>,
) -> Result<Plan, BpfError> {
    let mut p = Plan::default();
    plan_devices(root, node, &view.devices, view.mode, &mut p);
    if let Some(t) = &view.tunnel {
        p.tunnel_hook = !tunnel_hook_in_place(root, node, t, view.mode);
    }
    if let Some(m) = TunnelMaps::open(root, node)? {
        if !m.in_line(view.tunnel.as_ref()) {
            p.tunnel_maps = Some(match &view.tunnel {
                Some(t) => format!(
                    "the tunnel reaches {} peer subnets through {}",
                    t.peers.len(),
                    t.name
                ),
                None => "no tunnel: its peers forgotten".to_owned(),
            });
        }
    }
    // The node's switches, read once (the host-port maps hold the config map open on any
    // node with programs).
    let mut config = None;
    if ports.is_some() || walk(&root.map(node, ebpf_cni_maps::PORTMAP_MAP)).exists() {
        let pm = PortMaps::opened(ports, root, node)?;
        let c = pm.node_config();
        if PortMaps::enabled_in(c) {
            let have = pm.node_addrs();
            let mut want = view.addrs.clone();
            want.sort();
            want.dedup();
            let added: Vec<IpAddr> = want.iter().filter(|a| !have.contains(a)).copied().collect();
            let removed: Vec<IpAddr> = have.iter().filter(|a| !want.contains(a)).copied().collect();
            if !added.is_empty() || !removed.is_empty() {
                p.node_addrs = Some(AddrDiff { added, removed });
            }
        }
        config = Some(c);
    }
    let masquerading = match config {
        Some(c) => MasqMaps::active_in(c),
        None => MasqMaps::active_on(root, node)?,
    };
    if masquerading {
        if let Some(m) = MasqMaps::open(root, node)? {
            p.masq_sources = m.active() && !m.sources_in_line(&view.masq_sources());
        }
    }
    if let Some(want) = &view.services {
        // kube-proxy's masquerade kept off the node's masquerade ports, while it
        // masquerades and kube-proxy marks.
        let guard = match MasqMaps::open(root, node)? {
            Some(m) if masquerading && m.active() => {
                masq_ports::Guard::beside(want.masq_mark, m.port_range())
            }
            _ => None,
        };
        let held = masq_ports::current().unwrap_or_else(|e| {
            log::warn!("table inet {}: {e}", masq_ports::TABLE);
            None
        });
        if guard != held {
            p.masq_ports = Some(guard);
        }
        // Programs of a release before Services: the next load pins the maps.
        if let Some(m) = ServicesMaps::open(root, node)? {
            // A node that never had Service addresses has no record of their source
            // either: in line, so a STATUS after an ADD writes nothing there.
            let recorded = services_source(root, node);
            let source_differs = match &recorded {
                Some(r) => *r != want.source,
                None => want.in_force(),
            };
            if !m.in_line(&want.entries(), want.in_force()) || source_differs {
                p.services = Some(if want.in_force() {
                    format!(
                        "Service flows go through the stack: {} Service addresses from {}",
                        want.nets.len(),
                        want.source
                    )
                } else {
                    "Service flows: none (no Service addresses)".to_owned()
                });
            }
        }
    }
    if by != ConvergedBy::Add {
        // Without the node's cookie (an older build on a kernel before 5.14) no socket
        // program was attached, and none is wanted until an ADD with host ports.
        let sockets_wanted = config.is_some_and(|c| PortMaps::enabled_in(c) && c.netns_cookie != 0);
        p.links = cgroup::links_to_restore(root, node, sockets_wanted);
    }
    Ok(p)
}

/// The device program on every device of `devices` with a live link of it (TCX) or a
/// record of its filter (netlink), and no pins of devices not listed.
fn plan_devices(root: &PinRoot, node: &NodeId, devices: &[Device], mode: AttachMode, p: &mut Plan) {
    for dev in devices {
        match mode {
            AttachMode::Netlink => {
                if !walk(&root.device_netlink_record(node, &dev.name)).exists() {
                    p.attach.push(dev.clone());
                }
            }
            AttachMode::Tcx => {
                match links::check(
                    Hook::FromDev,
                    &root.device_link(node, &dev.name),
                    dev.ifindex,
                ) {
                    Ok(()) => {}
                    Err(BpfError::PinMissing { .. }) => p.attach.push(dev.clone()),
                    Err(e) => {
                        log::info!("the device program's link on {}: {e}", dev.name);
                        p.reattach.push(dev.clone());
                    }
                }
            }
        }
    }
    for name in root.pinned_devices(node) {
        if !devices.iter().any(|d| d.name == name) {
            p.detach.push(name);
        }
    }
}

/// Whether the tunnel device carries the tunnel program: a live link of it (TCX), or the
/// record of its filter (netlink).
fn tunnel_hook_in_place(root: &PinRoot, node: &NodeId, t: &TunnelView, mode: AttachMode) -> bool {
    let dir = root.device_dir(node, &t.name);
    match mode {
        AttachMode::Netlink => walk(&dir.join(Hook::ToTunnel.netlink_record_name())).exists(),
        AttachMode::Tcx => links::check(
            Hook::ToTunnel,
            &dir.join(Hook::ToTunnel.link_pin_name()),
            t.ifindex,
        )
        .is_ok(),
    }
}

/// Attaches the tunnel program to the tunnel device's egress.
fn attach_tunnel(
    root: &PinRoot,
    node: &NodeId,
    t: &TunnelView,
    mode: AttachMode,
    progs: &mut Option<Programs>,
) -> Result<(), BpfError> {
    if progs.is_none() {
        *progs = Some(Programs::open_or_load(root, node)?);
    }
    let progs = progs.as_mut().expect("opened above");
    let dir = root.device_dir(node, &t.name);
    create_dir_all_racy(&dir)?;
    match mode {
        AttachMode::Netlink => links::attach_netlink(
            progs.classifier(Hook::ToTunnel)?,
            Hook::ToTunnel,
            &t.name,
            &dir.join(Hook::ToTunnel.netlink_record_name()),
            Some(&root.device_clsact_record(node, &t.name)),
            None,
        ),
        AttachMode::Tcx => {
            let path = dir.join(Hook::ToTunnel.link_pin_name());
            let _ = fs::remove_file(&path);
            links::attach(
                progs.fd(Hook::ToTunnel)?,
                Hook::ToTunnel,
                &t.name,
                t.ifindex,
                &path,
            )
        }
    }
}

/// Writes what `plan` found different; the node lock is held. `progs` is opened only when
/// a device needs the program.
fn apply(
    root: &PinRoot,
    node: &NodeId,
    view: &NodeView,
    plan: &Plan,
    progs: &mut Option<Programs>,
    ports: &mut Option<PortMaps>,
) -> Result<(), BpfError> {
    let mut device_err = None;
    for dev in plan.attach.iter().chain(&plan.reattach) {
        if let Err(e) = attach_device(root, node, dev, view.mode, progs) {
            log::warn!("node device {}: {e}", dev.name);
            device_err.get_or_insert(BpfError::NodeDevice {
                ifname: dev.name.clone(),
                source: Box::new(e),
            });
        }
    }
    // The peers first: the device's program finds them when it starts.
    if plan.tunnel_maps.is_some() {
        if let Some(mut m) = TunnelMaps::open(root, node)? {
            m.sync(view.tunnel.as_ref())?;
        }
    }
    if let (true, Some(t)) = (plan.tunnel_hook, &view.tunnel) {
        if let Err(e) = attach_tunnel(root, node, t, view.mode, progs) {
            log::warn!("tunnel device {}: {e}", t.name);
            device_err.get_or_insert(BpfError::NodeDevice {
                ifname: t.name.clone(),
                source: Box::new(e),
            });
        }
    }
    let dir = root.devices_dir(node);
    for name in &plan.detach {
        let path = root.device_dir(node, name);
        if walk(&path.join(Hook::ToTunnel.netlink_record_name())).exists() {
            links::detach_netlink(Hook::ToTunnel, name);
        }
        if root.device_netlink_record(node, name).exists() {
            links::detach_device_netlink(name, &root.device_clsact_record(node, name));
        }
        let _ = links::remove_dir_pins(&dir, &path);
    }
    if plan.node_addrs.is_some() {
        PortMaps::opened(ports, root, node)?.sync_node_addrs(&view.addrs)?;
    }
    if plan.masq_sources {
        if let Some(mut m) = MasqMaps::open(root, node)? {
            m.sync_sources(&view.masq_sources())?;
        }
    }
    if !plan.links.is_empty() {
        cgroup::restore_links(root, node, &plan.links)?;
    }
    if plan.services.is_some() {
        if let (Some(want), Some(mut m)) = (&view.services, ServicesMaps::open(root, node)?) {
            m.sync(&want.entries(), want.in_force())?;
            record_services_source(root, node, &want.source)?;
        }
    }
    // Not fatal: the node's flows go on, and the next convergence tries again.
    let guard = match &plan.masq_ports {
        Some(Some(g)) => masq_ports::set(g),
        Some(None) => masq_ports::remove().map(|_| ()),
        None => Ok(()),
    };
    if let Err(e) = guard {
        log::warn!("table inet {}: {e}", masq_ports::TABLE);
    }
    device_err.map_or(Ok(()), Err)
}

fn attach_device(
    root: &PinRoot,
    node: &NodeId,
    dev: &Device,
    mode: AttachMode,
    progs: &mut Option<Programs>,
) -> Result<(), BpfError> {
    if progs.is_none() {
        *progs = Some(Programs::open_or_load(root, node)?);
    }
    let progs = progs.as_mut().expect("opened above");
    match mode {
        AttachMode::Netlink => {
            let record = root.device_netlink_record(node, &dev.name);
            create_dir_all_racy(record.parent().expect("a record lives in a directory"))?;
            links::attach_netlink(
                progs.classifier(Hook::FromDev)?,
                Hook::FromDev,
                &dev.name,
                &record,
                Some(&root.device_clsact_record(node, &dev.name)),
                None,
            )
        }
        AttachMode::Tcx => {
            let path = root.device_link(node, &dev.name);
            let _ = fs::remove_file(&path);
            create_dir_all_racy(path.parent().expect("a device link lives in a directory"))?;
            links::attach(
                progs.fd(Hook::FromDev)?,
                Hook::FromDev,
                &dev.name,
                dev.ifindex,
                &path,
            )
        }
    }
}

/// Converges the node (see the module docs): `Ok(lines)` says what changed, nothing when
/// the node was in line or has no pods (no node directory: nothing to converge).
pub fn converge(node: &NodeId, view: &NodeView, by: ConvergedBy) -> Result<Vec<String>, BpfError> {
    let root = PinRoot::from_env();
    if !walk(&root.node_dir(node)).exists() || plan(&root, node, view, by, &mut None)?.is_empty() {
        return Ok(Vec::new());
    }
    let _lock = NodeLock::take(&root)?;
    // The last pod may have gone meanwhile, and the node with it.
    if !walk(&root.node_dir(node)).exists() {
        return Ok(Vec::new());
    }
    converge_locked(&root, node, view, by, &mut None, &mut None)
}

/// Converges the node with the lock held (ADD holds it, with its programs open, and keeps
/// the host-port maps `ports` opened for its own entries).
pub(super) fn converge_locked(
    root: &PinRoot,
    node: &NodeId,
    view: &NodeView,
    by: ConvergedBy,
    progs: &mut Option<Programs>,
    ports: &mut Option<PortMaps>,
) -> Result<Vec<String>, BpfError> {
    let plan = plan(root, node, view, by, ports)?;
    if plan.is_empty() {
        return Ok(Vec::new());
    }
    let lines = plan.describe();
    let res = apply(root, node, view, &plan, progs, ports);
    // Recorded even when a device failed: the rest changed.
    record(root, node, by)?;
    for l in &lines {
        log::info!("node {node} converged ({}): {l}", by.as_str());
    }
    res.map(|()| lines)
}

/// Records a change made to the node by a convergence step outside this module (the
/// gateways `crate::gateway::restore` puts back on `lo`); the node lock is held.
pub fn record_change(node: &NodeId, by: ConvergedBy) -> Result<(), BpfError> {
    record(&PinRoot::from_env(), node, by)
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Records a convergence: `converged/<unix ms>-<by>`, the previous record removed.
fn record(root: &PinRoot, node: &NodeId, by: ConvergedBy) -> Result<(), BpfError> {
    let dir = root.converged_dir(node);
    let old = fs::read_dir(&dir)
        .map(|es| es.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default();
    let new = dir.join(format!("{}-{}", unix_ms(), by.as_str()));
    create_dir_all_racy(&new)?;
    for p in old.into_iter().filter(|p| *p != new) {
        let _ = fs::remove_dir(p);
    }
    Ok(())
}

/// Where the node's Service ranges came from, as the last convergence that wrote them
/// recorded it (`services/<source>`).
pub fn services_source(root: &PinRoot, node: &NodeId) -> Option<String> {
    fs::read_dir(root.services_dir(node))
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
}

fn record_services_source(root: &PinRoot, node: &NodeId, source: &str) -> Result<(), BpfError> {
    let dir = root.services_dir(node);
    let new = dir.join(source);
    create_dir_all_racy(&new)?;
    if let Ok(es) = fs::read_dir(&dir) {
        for p in es.flatten().map(|e| e.path()).filter(|p| *p != new) {
            let _ = fs::remove_dir(p);
        }
    }
    Ok(())
}

/// The last convergence recorded for the node.
pub fn last(root: &PinRoot, node: &NodeId) -> Option<ConvergeRecord> {
    fs::read_dir(root.converged_dir(node))
        .ok()?
        .flatten()
        .filter_map(|e| parse_record(Path::new(&e.file_name())))
        .max_by_key(|r| r.at_unix_ms)
}

fn parse_record(name: &Path) -> Option<ConvergeRecord> {
    let name = name.to_str()?;
    let (ms, by) = name.split_once('-')?;
    Some(ConvergeRecord {
        at_unix_ms: ms.parse().ok()?,
        by: by.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_back() {
        assert_eq!(
            parse_record(Path::new("1732480000123-status")),
            Some(ConvergeRecord {
                at_unix_ms: 1_732_480_000_123,
                by: "status".to_owned()
            })
        );
        let r = parse_record(Path::new("1732480000123-status")).unwrap();
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::json!({"at_unix_ms": 1_732_480_000_123u64, "at": "2024-11-24T20:26:40.123Z", "by": "status"})
        );
        assert_eq!(parse_record(Path::new("junk")), None);
        assert_eq!(parse_record(Path::new("x-add")), None);
    }

    #[test]
    fn times_print_as_utc() {
        assert_eq!(utc_rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc_rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(utc_rfc3339(1_798_761_599_999), "2026-12-31T23:59:59.999Z");
    }

    #[test]
    fn an_empty_plan_says_nothing() {
        let p = Plan::default();
        assert!(p.is_empty());
        assert!(p.describe().is_empty());
        let p = Plan {
            node_addrs: Some(AddrDiff {
                added: vec!["10.0.0.9".parse().unwrap()],
                removed: vec![],
            }),
            ..Plan::default()
        };
        assert!(!p.is_empty());
        assert_eq!(p.describe(), ["wildcard host ports answer on 10.0.0.9"]);
    }

    #[test]
    fn an_address_put_back_on_lo_joins_the_view_once_in_order() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let mut v = NodeView {
            devices: Vec::new(),
            tunnel: None,
            addrs: vec![ip("10.0.0.5"), ip("192.168.1.2")],
            by_link: Vec::new(),
            mode: AttachMode::Netlink,
            services: None,
            ipvs: Vec::new(),
        };
        v.add_loopback(ip("10.88.0.1"));
        v.add_loopback(ip("10.88.0.1"));
        assert_eq!(
            v.addrs,
            [ip("10.0.0.5"), ip("10.88.0.1"), ip("192.168.1.2")]
        );
        assert_eq!(v.by_link, [(1, ip("10.88.0.1"))]);
        assert!(v.on_loopback(ip("10.88.0.1")));
        assert!(
            v.masq_sources().is_empty(),
            "lo is never a masquerade source"
        );
    }

    #[test]
    fn an_ipv6_gateway_is_counted_per_link_holding_it() {
        let gw: IpAddr = "fd00::1".parse().unwrap();
        let mut v = NodeView {
            devices: Vec::new(),
            tunnel: None,
            addrs: vec![gw],
            by_link: vec![(7, gw), (9, gw)],
            mode: AttachMode::Netlink,
            services: None,
            ipvs: Vec::new(),
        };
        assert_eq!(v.holders(gw), 2);
        assert!(v.holds(7, gw) && !v.holds(8, gw));
        v.add_held(8, gw);
        v.add_held(8, gw);
        assert_eq!(v.holders(gw), 3);
        assert_eq!(
            v.addrs,
            [gw],
            "a node address once, however many links hold it"
        );
    }

    #[test]
    fn a_link_to_restore_is_a_change() {
        let p = Plan {
            links: vec!["ecni_connect4"],
            ..Plan::default()
        };
        assert!(!p.is_empty());
        assert_eq!(
            p.describe(),
            ["ecni_connect4 attached to the cgroup v2 root again"]
        );
    }
}
