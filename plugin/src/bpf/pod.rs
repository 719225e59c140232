//! What ADD, DEL and CHECK do with a pod's dataplane: each walks the capabilities
//! (`capability/`) for the pod's parts, and attaches, checks or removes the pod's programs
//! around them; ADD converges the node's device links, and DEL tears the node down when its
//! last pod goes. `inspect.rs` reports what they left.

use std::{fs, net::IpAddr, os::fd::AsFd};

use super::{
    capability::{self, Check, Install, PodSpec, Removal, Veth, CAPABILITIES},
    converge::{self, ConvergedBy, NodeView},
    error::{collect, log_each},
    host_ports::PortMaps,
    links,
    lock::NodeLock,
    maps::Maps,
    masquerade::MasqMaps,
    pin::{create_dir_all_racy, ensure_bpffs_at, walk, AttachmentPins, LayoutCwd, NodeId, PinRoot},
    placement::Placement,
    programs::{self, Programs},
    tree, AttachMode, AttachmentKey, BpfError, Hook,
};

/// Attaches a pod: under the node lock, the node is converged to `view` (its device links,
/// host-port addresses and masquerade sources: see `converge.rs`) and each capability
/// installs its part of `pod` (see `capability`); then its host veth gets the pod programs
/// (TCX links pinned under the attachment's directory, or netlink filters with a pinned
/// record). On error nothing of the pod stays.
pub fn add_pod(
    node: &NodeId,
    key: &AttachmentKey<'_>,
    pod: &PodSpec,
    veth: &Veth,
    view: &NodeView,
    mode: AttachMode,
) -> Result<(), BpfError> {
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
    // The node's first ADD, or the first after its pins were removed by hand.
    super::orphans::sweep_locked(&root, node);
    let mut progs = Some(Programs::open_or_load(&root, node)?);
    step("programs");
    let mut maps = required_maps(&root, node)?;
    step("maps");
    let mut ports = None;
    // A pod on a node whose devices lack the program would be half-configured (no host
    // port or masqueraded reply from outside reaches it): the ADD fails, and is undone.
    converge::converge_locked(&root, node, view, ConvergedBy::Add, &mut progs, &mut ports)?;
    let mut progs = progs.expect("opened above");
    step("devices");

    let pins = root.attachment(node, key);
    let at = Attaching {
        root: &root,
        node,
        key,
        pins: &pins,
        pod,
        veth,
        mode,
    };
    at.replace_stale(&mut maps)?;
    maps.ensure_free(key.id(), &pod.ips())?;
    let placement = pod.placement(veth);
    let res = (|| {
        at.record(&placement)?;
        at.install_capabilities(&mut maps, &mut ports, view, &step)?;
        at.attach_programs(&mut progs, &mut lock)?;
        step("attached");
        Ok(())
    })();
    let Err(error) = res else {
        return Ok(());
    };
    Err(at.undo(error, lock.is_none(), &mut maps, placement))
}

/// The node's endpoint map and the maps beside it, which ADD and CHECK require.
fn required_maps(root: &PinRoot, node: &NodeId) -> Result<Maps, BpfError> {
    Maps::open(root, node)?.ok_or_else(|| BpfError::PinMissing {
        what: "endpoint map",
        path: root.map(node, ebpf_cni_maps::ENDPOINTS_MAP),
    })
}

/// One pod's attachment as [`add_pod`] makes it: where its pins go, what it installs and
/// the host veth its programs go on.
struct Attaching<'a> {
    root: &'a PinRoot,
    node: &'a NodeId,
    key: &'a AttachmentKey<'a>,
    pins: &'a AttachmentPins,
    pod: &'a PodSpec,
    veth: &'a Veth,
    mode: AttachMode,
}

impl Attaching<'_> {
    /// An attachment of the same key left by an earlier ADD is removed first.
    fn replace_stale(&self, maps: &mut Maps) -> Result<(), BpfError> {
        if fs::symlink_metadata(walk(self.pins.dir())).is_ok() {
            log::warn!(
                "replacing the stale attachment at {}",
                self.pins.dir().display()
            );
            // Scans the whole endpoint map: only for this rare case, so ADD stays O(1).
            let (_, failures) =
                remove_attachment(self.root, self.node, self.key, self.pins, Some(maps), None);
            collect("removal of the stale attachment", failures)?;
        }
        Ok(())
    }

    /// The attachment's directory, with the placement record in it before the entries it
    /// names: DEL finds them by it.
    fn record(&self, placement: &Placement) -> Result<(), BpfError> {
        create_dir_all_racy(self.pins.dir())?;
        placement.record(self.pins)
    }

    /// Each capability installs its part of the pod, in the order of `CAPABILITIES`.
    fn install_capabilities(
        &self,
        maps: &mut Maps,
        ports: &mut Option<PortMaps>,
        view: &NodeView,
        step: &dyn Fn(&str),
    ) -> Result<(), BpfError> {
        let mut cx = Install {
            root: self.root,
            node: self.node,
            key: self.key,
            pins: self.pins,
            maps,
            ports,
            view,
        };
        for cap in CAPABILITIES {
            cap.install(self.pod, self.veth, &mut cx)?;
            step(cap.name());
        }
        Ok(())
    }

    /// The pod programs on the host veth: TCX links pinned under the attachment's
    /// directory (the node lock let go first), or netlink filters with pinned records.
    fn attach_programs(
        &self,
        progs: &mut Programs,
        lock: &mut Option<NodeLock>,
    ) -> Result<(), BpfError> {
        match self.mode {
            AttachMode::Tcx => {
                // The attachment's directory and entries exist, so a concurrent DEL of the
                // node's last other pod will not tear the node down: the slow part below
                // runs without the lock, letting concurrent ADDs overlap.
                drop(lock.take());
                self.attach_tcx(progs)
            }
            AttachMode::Netlink => self.attach_netlink(progs),
        }
    }

    /// Both hooks' TCX links, attached at once and pinned.
    fn attach_tcx(&self, progs: &mut Programs) -> Result<(), BpfError> {
        let [from_hook, to_hook] = Hook::pod(self.pod.chained);
        let pins = self.pins;
        // Each TCX attach waits out an RCU grace period in the kernel (~15 ms here): the
        // two hooks attach at once so their waits overlap.
        let from_pod = progs
            .fd(from_hook)?
            .try_clone_to_owned()
            .map_err(|source| BpfError::OpenPin {
                path: self
                    .root
                    .program(self.node, super::revision(), from_hook.program()),
                source,
            })?;
        let to_pod = progs.fd(to_hook)?;
        let (host_ifname, host_ifindex) = (self.veth.host_name.as_str(), self.veth.host_ifindex);
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
        b
    }

    /// Both hooks' netlink filters, each with its pinned record.
    fn attach_netlink(&self, progs: &mut Programs) -> Result<(), BpfError> {
        for (i, hook) in Hook::pod(self.pod.chained).into_iter().enumerate() {
            links::attach_netlink(
                progs.classifier(hook)?,
                hook,
                &self.veth.host_name,
                &self.pins.netlink_record(hook),
                None,
                Some(links::KnownLink {
                    ifindex: self.veth.host_ifindex,
                    clsact_added: i > 0,
                }),
            )?;
        }
        Ok(())
    }

    /// After a failed ADD: every capability's part and the programs removed, each tried
    /// past the failures of the others, under the node lock (taken again if `relock`, the
    /// attach having let it go). `error` alone when all of it went, else with the undo's.
    fn undo(
        &self,
        error: BpfError,
        relock: bool,
        maps: &mut Maps,
        placement: Placement,
    ) -> BpfError {
        let mut undo = Vec::new();
        let _relock = if relock {
            NodeLock::take(self.root).map_err(|e| undo.push(e)).ok()
        } else {
            None
        };
        if self.mode == AttachMode::Netlink {
            // A filter whose record was not written yet has none to be found by.
            for hook in Hook::pod(self.pod.chained) {
                links::detach_netlink(hook, &self.veth.host_name);
            }
        }
        undo.extend(
            remove_attachment(
                self.root,
                self.node,
                self.key,
                self.pins,
                Some(maps),
                Some(placement),
            )
            .1,
        );
        if undo.is_empty() {
            return error;
        }
        log_each("undoing a failed ADD", &undo);
        BpfError::AddUndone {
            error: Box::new(error),
            undo,
        }
    }
}

/// Removes what an attachment holds: each capability's part (in the reverse of ADD's
/// order), the netlink filters recorded on its host veth, and its pinned links and
/// directory. Any failure keeps the directory (its port list, records and links), so a
/// later DEL retries what is left. Returns whether anything was removed, and the failures.
fn remove_attachment(
    root: &PinRoot,
    node: &NodeId,
    key: &AttachmentKey<'_>,
    pins: &AttachmentPins,
    maps: Option<&mut Maps>,
    plan: Option<Placement>,
) -> (bool, Vec<BpfError>) {
    let (host_ifindex, ips, placement) = match plan {
        // A failed ADD knows where it put the pod.
        Some(p) => (p.host_ifindex, p.ips.clone(), Some(p)),
        None => {
            // DEL: the entries the placement record names, looked up, or (a pod of a
            // release before the record) those a walk of the endpoint map finds.
            let placement = Placement::recorded(pins);
            let entries = maps
                .as_ref()
                .map(|m| match &placement {
                    Some(p) => m.entries_at(key.id(), &p.ips),
                    None => m.entries_of(key.id()),
                })
                .unwrap_or_default();
            (
                // On a device that outlives the pod (chained mode: the previous plugin's
                // veth), the netlink filters and the fq must go: the entries name it.
                entries.first().map_or(0, |(_, e)| e.host_ifindex),
                entries.iter().map(|(ip, _)| *ip).collect(),
                placement,
            )
        }
    };
    let host_ifindex = (host_ifindex != 0).then_some(host_ifindex);
    let recorded: Vec<Hook> = Hook::ANY_POD
        .into_iter()
        .filter(|h| walk(&pins.netlink_record(*h)).exists())
        .collect();
    if !recorded.is_empty() {
        if let Some(ifname) = host_ifindex.and_then(crate::netlink::ifname::name_of) {
            for hook in recorded {
                links::detach_netlink(hook, &ifname);
            }
        }
    }
    let mut cx = Removal {
        root,
        node,
        key,
        pins,
        maps,
        host_ifindex,
        ips,
        placement,
    };
    let (mut removed, mut failures) = capability::remove_all(&mut cx);
    if failures.is_empty() {
        match links::remove_dir_pins(&root.attachments_dir(node), pins.dir()) {
            Ok(r) => removed |= r,
            Err(failures_here) => failures.push(BpfError::Detach {
                dir: pins.dir().into(),
                failures: failures_here,
            }),
        }
    }
    (removed, failures)
}

/// Before ADD changes anything for these addresses: none may belong to another live
/// attachment of this node (see [`Maps::ensure_free`]).
pub fn ensure_addresses_free(
    node: &NodeId,
    key: &AttachmentKey<'_>,
    ips: &[IpAddr],
) -> Result<(), BpfError> {
    key.validate()?;
    match Maps::open_endpoints(&PinRoot::from_env(), node)? {
        Some(endpoints) => super::maps::ensure_free_in(&endpoints, key.id(), ips),
        None => Ok(()),
    }
}

/// Detaches a pod: each capability's part and its links (see [`remove_attachment`]), found
/// from the pins and the endpoint entries alone. Idempotent: `Ok(false)` when nothing was there. The last pod of a node takes
/// the node's device links, programs and maps with it. Every step is tried, past the
/// failures of the others; the failures are logged and returned together (see
/// [`collect`]), and the node stays while any is left.
pub fn del_pod(node: &NodeId, key: &AttachmentKey<'_>) -> Result<bool, BpfError> {
    key.validate()?;
    let root = PinRoot::from_env();
    ensure_bpffs_at(&root)?;
    if !walk(&root.node_dir(node)).exists() {
        return Ok(false);
    }
    let _lock = NodeLock::take(&root)?;
    let pins = root.attachment(node, key);
    let mut failures = Vec::new();
    let mut maps = Maps::open(&root, node).unwrap_or_else(|e| {
        failures.push(e);
        None
    });
    let (removed, left) = remove_attachment(&root, node, key, &pins, maps.as_mut(), None);
    failures.extend(left);
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

/// GC: the masqueraded flows idle past their timeout, or of addresses no pod of the node
/// holds, are removed (see [`MasqMaps::sweep`]); returns how many.
pub fn sweep_masq(node: &NodeId) -> Result<usize, BpfError> {
    let root = PinRoot::from_env();
    if !walk(&root.node_dir(node)).exists() {
        return Ok(0);
    }
    let _lock = NodeLock::take(&root)?;
    let (Some(maps), Some(mut m)) = (Maps::open(&root, node)?, MasqMaps::open(&root, node)?) else {
        return Ok(0);
    };
    let live = maps.endpoint_ips();
    m.sweep(&live)
}

/// GC: the source entries of attachments this node no longer has (a DEL by a release that
/// did not know the source map, a veth deleted without DEL) are removed; returns how many.
pub fn sweep_sources(node: &NodeId) -> Result<usize, BpfError> {
    let root = PinRoot::from_env();
    if !walk(&root.node_dir(node)).exists() {
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
/// the filters themselves), and each capability's part is as ADD left it.
pub fn check_pod(
    node: &NodeId,
    key: &AttachmentKey<'_>,
    pod: &PodSpec,
    veth: &Veth,
    mode: AttachMode,
) -> Result<(), BpfError> {
    key.validate()?;
    let root = PinRoot::from_env();
    // CHECK reads without the lock: it enters the layout directory itself.
    let _cwd = LayoutCwd::open(&root.layout_dir());
    let pins = root.attachment(node, key);
    for hook in Hook::pod(pod.chained) {
        match mode {
            AttachMode::Tcx => links::check(hook, &pins.link(hook), veth.host_ifindex)?,
            AttachMode::Netlink => {
                links::require_pin(hook.netlink_record_name(), &pins.netlink_record(hook))?
            }
        }
    }
    let maps = required_maps(&root, node)?;
    let cx = Check {
        root: &root,
        node,
        key,
        pins: &pins,
        maps: &maps,
    };
    CAPABILITIES
        .iter()
        .try_for_each(|cap| cap.check(pod, veth, &cx))
}

/// No pod left: the device links (unpinning detaches them; netlink filters are removed,
/// with the `clsact` qdiscs ebpf-cni created that hold no other filter), programs and maps
/// go. Also `uninstall --purge`'s removal (see `purge.rs`).
pub(super) fn teardown_node(root: &PinRoot, node: &NodeId) -> Result<(), BpfError> {
    let dir = root.node_dir(node);
    for name in root.pinned_devices(node) {
        if root.device_netlink_record(node, &name).exists() {
            links::detach_device_netlink(&name, &root.device_clsact_record(node, &name));
        }
    }
    match fs::remove_dir_all(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(BpfError::NodeTeardown { path: dir, source }),
    }
}
