//! Whole-attachment checks on kernel and disk state: what a ptp-style ADD must have set up
//! (container interface, addresses, routes; host veth and host routes; forwarding), and
//! that nothing of an attachment (or, after the last DEL, of the node's dataplane) is left
//! after DEL or a failed ADD.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::kernel::{self, Family};
use crate::netns::Netns;
use crate::node::Node;
use crate::result::{in_subnet, AddResult};
use crate::{bpf, fsutil};

/// Problems with the state an ADD should have left. `mtu` and `mac` are checked when
/// given (the configured MTU, a requested container MAC).
pub fn attachment_problems(
    node: &Node,
    pod: &Netns,
    ifname: &str,
    r: &AddResult,
    mtu: Option<u32>,
) -> Vec<String> {
    let mut p = Vec::new();

    // Container side.
    match kernel::link_addrs(pod, ifname).expect("reading pod addresses") {
        None => p.push(format!(
            "container interface {ifname} missing in {}",
            pod.name()
        )),
        Some(link) => {
            if !link.is_up() {
                p.push(format!("container {ifname} is not up"));
            }
            if let Some(mtu) = mtu {
                if link.mtu != mtu {
                    p.push(format!("container {ifname} MTU {} != {mtu}", link.mtu));
                }
            }
            let mac = link.address.clone().unwrap_or_default();
            if !mac.eq_ignore_ascii_case(&r.container_mac) {
                p.push(format!(
                    "container {ifname} MAC {mac} != result's {}",
                    r.container_mac
                ));
            }
            for ip in &r.ips {
                if !link.has_addr(ip.addr, ip.prefix) {
                    p.push(format!(
                        "{}/{} not on container {ifname}",
                        ip.addr, ip.prefix
                    ));
                }
            }
        }
    }
    let pod_routes = kernel::all_routes(pod).expect("reading pod routes");
    for ip in &r.ips {
        let Some(gw) = ip.gateway else { continue };
        let onlink = pod_routes.iter().any(|rt| {
            rt.dev_is(ifname)
                && rt.gateway.is_none()
                && rt.dst_net().is_some_and(|(n, l)| in_subnet(gw, n, l))
                && (gw.is_ipv6() || rt.scope.as_deref() == Some("link"))
        });
        if !onlink {
            p.push(format!(
                "container has no on-link route to the gateway {gw} via {ifname}"
            ));
        }
        let default = pod_routes.iter().any(|rt| {
            rt.is_default()
                && rt.family == Some(Family::of(&gw))
                && rt.gateway_ip() == Some(gw)
                && rt.dev_is(ifname)
        });
        if !default {
            p.push(format!(
                "container has no default route via {gw} dev {ifname}"
            ));
        }
    }
    if !p.is_empty() {
        let all: Vec<String> = pod_routes.iter().map(|r| r.describe()).collect();
        p.push(format!("(container routes: {all:?})"));
    }

    // Node side.
    match kernel::link(node.netns(), &r.host_ifname).expect("reading node links") {
        None => p.push(format!("host veth {} missing in the node", r.host_ifname)),
        Some(link) => {
            if !link.is_up() {
                p.push(format!("host veth {} is not up", r.host_ifname));
            }
            let mac = link.address.clone().unwrap_or_default();
            if !mac.eq_ignore_ascii_case(&r.host_mac) {
                p.push(format!("host veth MAC {mac} != result's {}", r.host_mac));
            }
            if link.link_netnsid.is_none() {
                p.push(format!(
                    "host veth {}'s peer is not in another namespace",
                    r.host_ifname
                ));
            }
        }
    }
    let node_routes = kernel::all_routes(node.netns()).expect("reading node routes");
    for ip in &r.ips {
        if !node_routes
            .iter()
            .any(|rt| rt.is_host_route_to(ip.addr) && rt.dev_is(&r.host_ifname))
        {
            let all: Vec<String> = node_routes.iter().map(|r| r.describe()).collect();
            p.push(format!(
                "node has no /{} route to {} dev {} (routes: {all:?})",
                Family::of(&ip.addr).host_prefix(),
                ip.addr,
                r.host_ifname
            ));
        }
    }
    if !r.ips.is_empty() {
        let fwd = node
            .netns()
            .sysctl("net.ipv4.ip_forward")
            .expect("reading ip_forward");
        if fwd != "1" {
            p.push(format!("net.ipv4.ip_forward is {fwd} in the node"));
        }
    }
    p
}

/// Panics with every problem of [`attachment_problems`].
pub fn assert_attachment(node: &Node, pod: &Netns, ifname: &str, r: &AddResult, mtu: Option<u32>) {
    let p = attachment_problems(node, pod, ifname, r, mtu);
    assert!(
        p.is_empty(),
        "attachment state after ADD is wrong:\n  - {}",
        p.join("\n  - ")
    );
}

/// What of one attachment is still there: host veth, container interface (when the pod
/// still exists), node routes to its IPs, leases of its IPs or container id, its pins.
pub fn leftover_problems(
    node: &Node,
    pod: Option<&Netns>,
    ifname: &str,
    r: &AddResult,
    network: &str,
    container_id: &str,
) -> Vec<String> {
    let mut p = Vec::new();
    if kernel::link(node.netns(), &r.host_ifname)
        .expect("reading node links")
        .is_some()
    {
        p.push(format!("host veth {} still exists", r.host_ifname));
    }
    if let Some(pod) = pod {
        if kernel::link(pod, ifname)
            .expect("reading pod links")
            .is_some()
        {
            p.push(format!(
                "container interface {ifname} still exists in {}",
                pod.name()
            ));
        }
    }
    let ips: Vec<IpAddr> = r.ips.iter().map(|i| i.addr).collect();
    for rt in kernel::all_routes(node.netns()).expect("reading node routes") {
        if ips.iter().any(|ip| rt.is_host_route_to(*ip)) || rt.dev_is(&r.host_ifname) {
            p.push(format!("node route left: {}", rt.describe()));
        }
    }
    for lease in node.leases(network) {
        if ips.contains(&lease.ip) || lease.container_id == container_id {
            p.push(format!(
                "lease left: {} for {}",
                lease.ip, lease.container_id
            ));
        }
    }
    let pins = node
        .pin_root()
        .join(ebpf_cni_maps::pin::ATTACHMENTS_DIR)
        .join(crate::node::pinned_name(network))
        .join(crate::node::pinned_name(container_id));
    if pins.exists() {
        let files = crate::fsutil::list_files(&pins).unwrap_or_default();
        p.push(format!("pins left under {}: {files:?}", pins.display()));
    }
    p
}

/// Panics with every problem of [`leftover_problems`].
pub fn assert_gone(
    node: &Node,
    pod: Option<&Netns>,
    ifname: &str,
    r: &AddResult,
    network: &str,
    container_id: &str,
    what: &str,
) {
    let p = leftover_problems(node, pod, ifname, r, network, container_id);
    assert!(
        p.is_empty(),
        "{what}: attachment not fully removed:\n  - {}",
        p.join("\n  - ")
    );
}

/// How long the kernel gets to release links and programs whose last pin went (it may do
/// so from deferred work, after the unlink returns; here it is usually done at once).
pub const RELEASE_BOUND: Duration = Duration::from_secs(5);

/// Polls `f` every 20 ms until it holds (true) or `bound` passes (false).
pub fn eventually(bound: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Nothing of ebpf-cni remains on the node: no pin directory, no TC/TCX program on any of
/// its links: after the last pod's DEL nothing of the pods remains pinned or attached.
pub fn assert_node_clean(node: &Node, what: &str) {
    assert!(
        !node.pin_root().exists(),
        "{what}: the node's pin directory {} is still there: {:?}",
        node.pin_root().display(),
        fsutil::list_files(node.pin_root())
    );
    let links = kernel::links(node.netns()).unwrap();
    let mut left = BTreeMap::new();
    let clean = eventually(RELEASE_BOUND, || {
        left.clear();
        for l in &links {
            let progs = bpf::attached_programs(node.netns(), &l.ifname).unwrap();
            if !progs.is_empty() {
                left.insert(l.ifname.clone(), progs);
            }
        }
        left.is_empty()
    });
    assert!(
        clean,
        "{what}: programs still attached after {RELEASE_BOUND:?}: {left:?}"
    );
    let veths: Vec<&str> = links
        .iter()
        .map(|l| l.ifname.as_str())
        .filter(|n| n.starts_with("ecni"))
        .collect();
    assert!(veths.is_empty(), "{what}: host veths left: {veths:?}");
    // These tests' nodes had no qdisc before their first ADD: any clsact is ebpf-cni's.
    let clsact = kernel::clsact_links(node.netns()).unwrap();
    assert!(
        clsact.is_empty(),
        "{what}: clsact qdiscs left on node links: {clsact:?}"
    );
}
