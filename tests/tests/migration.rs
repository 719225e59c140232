//! Migrating a node from the reference chain (`ptp` + `host-local` + `portmap` +
//! `bandwidth`) to ebpf-cni, as docs/migration.md describes it: a pod of the old chain keeps
//! running while the node's conflist is switched to ebpf-cni, a new pod is added by
//! ebpf-cni beside it, and the runtime later DELs the old pod with the *new* conflist.
//!
//! What is proven:
//! - that DEL succeeds (spec section 2: DEL of an attachment the plugin does not know must
//!   succeed), and leaves ebpf-cni's own pods exactly as they were: the node's pins, the
//!   endpoint and host-port maps, their leases, CHECK and traffic;
//! - what it does to the old pod: its interface in the pod's namespace is a veth named
//!   `CNI_IFNAME`, which ebpf-cni's DEL removes (ptp's host veth and routes go with it);
//!   its host-local lease is released when the new conflist has the old network's name
//!   (the lease file holds `<container id>\r\n<ifname>` in the shared directory) and kept
//!   when the name differs; the old chain's iptables chains and the bandwidth plugin's ifb
//!   device are not ebpf-cni's and stay, until removed as docs/migration.md says;
//! - that a new network name must come with a new subnet: in the old subnet ebpf-cni's
//!   own lease directory hands out an old pod's address, and the ADD fails on that pod's
//!   host route (rolled back);
//! - both dataplanes coexist: old and new pods talk, and each one's host port is served;
//! - going back: the last ebpf-cni pod's DEL leaves the node without ebpf-cni state, and
//!   the old chain then attaches a pod again; when the old chain DELs an ebpf-cni pod
//!   instead, ebpf-cni's state for it stays until a GC of ebpf-cni's conflist removes it.
//!
//! The first two tests fail if ebpf-cni's DEL of a pod it did not add errors, or changes
//! anything of ebpf-cni's own pod (compared before and after, and CHECKed).

use std::net::IpAddr;

use ebpf_cni_tests::config::{self, Stack, NETWORK};
use ebpf_cni_tests::dataplane as dp;
use ebpf_cni_tests::external::ExternalHost;
use ebpf_cni_tests::host_ports::{ruleset, sa, tag_of, tcp_ask, PodServer};
use ebpf_cni_tests::net::tcp_echo;
use ebpf_cni_tests::state::{assert_gone, assert_node_clean};
use ebpf_cni_tests::{
    kernel, require_root, unique_container_id, AddResult, Attachment, CniRuntime, Lease,
    NetConfList, Node, PluginUnderTest, Pod,
};
use serde_json::{json, Value};

/// The old chain's host port, and the new pod's.
const OLD_PORT: u16 = 8080;
const NEW_PORT: u16 = 8081;

/// A pod and what the failure messages call it.
struct Named {
    what: &'static str,
    pod: Pod,
}

impl std::ops::Deref for Named {
    type Target = Pod;
    fn deref(&self) -> &Pod {
        &self.pod
    }
}

impl Named {
    /// The host side of the pod's veth, as the result names it (the interface without a
    /// sandbox).
    fn host_veth(&self) -> String {
        self.result["interfaces"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|i| i.get("sandbox").is_none())
            .and_then(|i| i["name"].as_str())
            .unwrap_or_else(|| panic!("{}: no host interface in {}", self.what, self.result))
            .to_owned()
    }
}

/// The node's conflist before the migration: Debian's ptp (masquerading, as containerd's
/// and podman's default networks do) with host-local, then portmap and bandwidth.
fn old_chain(node: &Node, name: &str) -> NetConfList {
    let mut ptp = config::standard("1.0.0", name, "ptp", node.data_dir(), Stack::V4);
    ptp["ipMasq"] = json!(true);
    NetConfList::chain(
        &ptp,
        vec![
            json!({"type": "portmap", "capabilities": {"portMappings": true}}),
            json!({"type": "bandwidth", "capabilities": {"bandwidth": true}}),
        ],
    )
}

/// The node's conflist after it: ebpf-cni alone, the same IPAM directory, in `subnet`.
fn new_list(p: &PluginUnderTest, node: &Node, name: &str, subnet: &str) -> NetConfList {
    let mut conf = config::standard("1.0.0", name, &p.plugin_type, node.data_dir(), Stack::V4);
    conf = config::with_v4_subnet(conf, subnet);
    conf["ipMasq"] = json!(true);
    conf["capabilities"] = json!({"portMappings": true, "bandwidth": true});
    NetConfList::single(&conf)
}

fn add(
    runtime: &CniRuntime,
    node: &Node,
    l: &NetConfList,
    what: &'static str,
    caps: &[(&str, Value)],
) -> Named {
    let pod = Pod::try_add(runtime, node, l, |att| att.with_capabilities(caps))
        .unwrap_or_else(|e| panic!("ADD of {what}: {e}"));
    Named { what, pod }
}

/// The old pod: a host port and an egress limit, so portmap and bandwidth leave their
/// per-pod state.
fn add_old_pod(node: &Node, l: &NetConfList) -> Named {
    add(
        &CniRuntime::reference(),
        node,
        l,
        "the old chain's pod",
        &[
            (
                "portMappings",
                json!([{"hostPort": OLD_PORT, "containerPort": 80, "protocol": "tcp"}]),
            ),
            (
                "bandwidth",
                json!({"egressRate": 100_000_000u64, "egressBurst": 100_000_000u64}),
            ),
        ],
    )
}

fn add_new_pod(p: &PluginUnderTest, node: &Node, l: &NetConfList) -> Named {
    let pod = add(
        &p.runtime,
        node,
        l,
        "ebpf-cni's pod",
        &[(
            "portMappings",
            json!([{"hostPort": NEW_PORT, "containerPort": 80, "protocol": "tcp"}]),
        )],
    );
    p.runtime
        .check(node, l, &pod.att, &pod.result)
        .unwrap_or_else(|e| panic!("CHECK of {} right after its ADD: {e}", pod.what));
    pod
}

/// A host-port map entry as its raw key and value.
type RawMapping = (Vec<u8>, Vec<u8>);

/// Everything of ebpf-cni's on the node that a DEL of another attachment must leave alone
/// (a map that cannot be read is recorded as its error, so a teardown compares unequal).
#[derive(Debug, PartialEq)]
struct EbpfCniState {
    pinned_files: Vec<std::path::PathBuf>,
    endpoints: Result<Vec<(IpAddr, dp::Endpoint)>, String>,
    port_mappings: Result<Vec<RawMapping>, String>,
    leases: Vec<Lease>,
}

fn ebpf_cni_state(node: &Node, network: &str, pod: &Named) -> EbpfCniState {
    EbpfCniState {
        pinned_files: node.pinned_files(),
        endpoints: dp::endpoints(node)
            .map(|m| m.into_iter().collect())
            .map_err(|e| format!("{e:#}")),
        port_mappings: dp::port_mappings(node)
            .map(|m| m.into_iter().map(|m| (m.raw_key, m.raw_value)).collect())
            .map_err(|e| format!("{e:#}")),
        leases: leases_of(node, network, pod),
    }
}

fn leases_of(node: &Node, network: &str, pod: &Named) -> Vec<Lease> {
    node.leases(network)
        .into_iter()
        .filter(|l| l.container_id == pod.att.container_id)
        .collect()
}

/// Pods talk both ways, and each host port is served from outside the node.
fn coexist(ext: &ExternalHost, old: &Named, new: &Named) {
    for (from, to) in [(old, new), (new, old)] {
        tcp_echo(&from.netns, &to.netns, to.v4(), 0)
            .unwrap_or_else(|e| panic!("TCP {} -> {}: {e:#}", from.what, to.what));
    }
    host_ports_serve(ext, &[(OLD_PORT, "old"), (NEW_PORT, "new")]);
}

fn host_ports_serve(ext: &ExternalHost, ports: &[(u16, &str)]) {
    for (port, tag) in ports {
        let target = sa(IpAddr::V4(ext.node_v4), *port);
        match tcp_ask(ext.netns(), target) {
            Ok(answer) if tag_of(&answer) == *tag => {}
            other => panic!("host port {target} from outside: want {tag:?}, got {other:?}"),
        }
    }
}

/// The lines of the node's rulesets naming an attachment of the old chain (`id: "<id>"`
/// in the comments portmap and ptp put on their rules).
fn rules_of(node: &Node, container_id: &str) -> Vec<String> {
    ruleset(node)
        .lines()
        .filter(|l| l.contains(container_id))
        .map(str::to_owned)
        .collect()
}

/// The ifb devices of the bandwidth plugin (`bwp…`) on the node.
fn ifb_devices(node: &Node) -> Vec<String> {
    kernel::links(node.netns())
        .unwrap()
        .into_iter()
        .map(|l| l.ifname)
        .filter(|n| n.starts_with("bwp"))
        .collect()
}

/// The cleanup docs/migration.md gives for a node with no pod of the old chain left: the
/// nat table without the CNI-* chains and the jumps to them, the ifb devices deleted.
fn clean_old_chain_leftovers(node: &Node) {
    for (save, restore) in [
        ("iptables-save", "iptables-restore"),
        ("ip6tables-save", "ip6tables-restore"),
    ] {
        let script = format!(
            "{save} -t nat | grep -v -e '^:CNI-' -e '^-A CNI-' -e ' -j CNI-' | {restore} -w 5"
        );
        let out = node.netns().exec(&["sh", "-ec", &script]).unwrap();
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for dev in ifb_devices(node) {
        node.netns().ip_ok(&["link", "del", &dev]).unwrap();
    }
}

/// The new network's subnet when its name differs from the old one's (see below why it
/// must not be the old subnet).
const OTHER_SUBNET: &str = "10.11.0.0/24";
const OLD_NETWORK: &str = "oldnet";

/// What the old chain left of `old` on the node after ebpf-cni's DEL of it (with a netns):
/// ebpf-cni deleted the pod's veth (the `CNI_IFNAME` veth in its namespace; ptp's host end
/// went with it) and nothing else of the old chain's.
fn assert_old_pod_left_as_documented(node: &Node, old: &Named, rules: &[String], ifbs: &[String]) {
    assert!(
        kernel::link(&old.netns, "eth0").unwrap().is_none(),
        "ebpf-cni's DEL with the old pod's netns removes its veth there"
    );
    let veth = old.host_veth();
    assert!(
        kernel::link(node.netns(), &veth).unwrap().is_none(),
        "ptp's host veth {veth} goes with its peer"
    );
    assert_eq!(
        rules,
        rules_of(node, &old.att.container_id),
        "the old chain's iptables rules are not ebpf-cni's: it leaves them as they were"
    );
    assert_eq!(
        ifbs,
        ifb_devices(node),
        "the bandwidth plugin's ifb device is not ebpf-cni's: it stays"
    );
}

/// The node's conflist keeps the network's name: one lease directory for both plugins, so
/// ebpf-cni's ADD never hands out an old pod's address, and its DEL of an old pod releases
/// that pod's lease (same file, same `<container id>\r\n<ifname>` content).
#[test]
fn same_network_name_del_of_an_old_pod_releases_its_lease_and_touches_no_ebpf_cni_state() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "uplink0", 43).unwrap();

    let old_list = old_chain(&node, NETWORK);
    let old = add_old_pod(&node, &old_list);
    let _old_server = PodServer::start(&old.netns, 80, "old");
    let old_rules = rules_of(&node, &old.att.container_id);
    assert!(
        old_rules.iter().any(|l| l.contains("CNI-DN-"))
            && old_rules.iter().any(|l| l.contains("MASQUERADE")),
        "portmap's and ptp's rules for the old pod: {old_rules:#?}"
    );
    let old_ifbs = ifb_devices(&node);
    assert_eq!(
        old_ifbs.len(),
        1,
        "the bandwidth plugin's ifb for the old pod"
    );

    // The node's conflist now names ebpf-cni, with the same network name and subnet.
    let new_l = new_list(&p, &node, NETWORK, config::V4_SUBNET);
    let new = add_new_pod(&p, &node, &new_l);
    let _new_server = PodServer::start(&new.netns, 80, "new");
    assert_ne!(
        old.v4(),
        new.v4(),
        "one lease directory: ebpf-cni must not hand out the old pod's address"
    );
    coexist(&ext, &old, &new);

    let before = ebpf_cni_state(&node, NETWORK, &new);
    assert_eq!(before.leases.len(), 1, "{:?}", node.leases(NETWORK));
    let old_lease = leases_of(&node, NETWORK, &old);
    assert_eq!(
        old_lease.iter().map(|l| l.ip).collect::<Vec<_>>(),
        vec![old.v4()],
        "the old pod's lease, in the shared directory"
    );

    // The runtime DELs the old pod with the node's current conflist: ebpf-cni's.
    p.runtime
        .del(&node, &new_l, &old.att, Some(&old.result))
        .unwrap_or_else(|e| panic!("ebpf-cni's DEL of the old chain's pod must succeed: {e}"));
    assert_eq!(
        before,
        ebpf_cni_state(&node, NETWORK, &new),
        "ebpf-cni's DEL of a pod it never added changed its own state"
    );
    p.runtime
        .check(&node, &new_l, &new.att, &new.result)
        .unwrap_or_else(|e| panic!("CHECK of ebpf-cni's pod after the foreign DEL: {e}"));
    tcp_echo(node.netns(), &new.netns, new.v4(), 0).unwrap();
    host_ports_serve(&ext, &[(NEW_PORT, "new")]);

    // The old pod's lease: released (the same network name finds the same file).
    assert!(
        leases_of(&node, NETWORK, &old).is_empty(),
        "ebpf-cni's DEL with the old network's name releases the old pod's lease: {:?}",
        node.leases(NETWORK)
    );
    assert!(!node
        .data_dir()
        .join(NETWORK)
        .join(old.v4().to_string())
        .exists());
    assert_old_pod_left_as_documented(&node, &old, &old_rules, &old_ifbs);

    // A late DEL (containerd's on remove): no netns, no prevResult. Still a success that
    // changes nothing of ebpf-cni's.
    let late = Attachment::new(&old.att.container_id, "", "eth0");
    p.runtime
        .del(&node, &new_l, &late, None)
        .unwrap_or_else(|e| panic!("late DEL of the old pod: {e}"));
    assert_eq!(before, ebpf_cni_state(&node, NETWORK, &new));

    // docs/migration.md's cleanup, once no pod of the old chain is left.
    clean_old_chain_leftovers(&node);
    let rules = ruleset(&node);
    assert!(!rules.contains("CNI-"), "after the cleanup:\n{rules}");
    assert!(ifb_devices(&node).is_empty());
    host_ports_serve(&ext, &[(NEW_PORT, "new")]);

    // Going back: the last ebpf-cni pod's DEL takes every ebpf-cni state off the node, and
    // the old chain attaches a pod there again.
    p.runtime
        .del(&node, &new_l, &new.att, Some(&new.result))
        .unwrap_or_else(|e| panic!("DEL of ebpf-cni's pod: {e}"));
    let r = AddResult::parse(&new.result).unwrap();
    assert_gone(
        &node,
        Some(&new.netns),
        "eth0",
        &r,
        NETWORK,
        &new.att.container_id,
        "DEL of ebpf-cni's pod",
    );
    assert_node_clean(&node, "after the last ebpf-cni pod's DEL");
    let again = add_old_pod(&node, &old_list);
    let _again_server = PodServer::start(&again.netns, 80, "again");
    host_ports_serve(&ext, &[(OLD_PORT, "again")]);
    CniRuntime::reference()
        .del(&node, &old_list, &again.att, Some(&again.result))
        .unwrap_or_else(|e| panic!("the old chain's DEL after going back: {e}"));
    assert!(node.leases(NETWORK).is_empty());
}

/// The node's conflist gets another network name: the old leases are in another directory,
/// which ebpf-cni neither reads nor changes. So the new network needs another subnet (in
/// the old one ebpf-cni hands out an address an old pod holds, and its ADD fails on the
/// old pod's host route), and ebpf-cni's DEL of an old pod keeps that pod's lease.
#[test]
fn other_network_name_del_of_an_old_pod_keeps_its_lease_and_touches_no_ebpf_cni_state() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "uplink0", 44).unwrap();

    let old_list = old_chain(&node, OLD_NETWORK);
    let old = add_old_pod(&node, &old_list);
    let _old_server = PodServer::start(&old.netns, 80, "old");
    let old_rules = rules_of(&node, &old.att.container_id);
    let old_ifbs = ifb_devices(&node);
    let old_lease = leases_of(&node, OLD_NETWORK, &old);
    assert_eq!(old_lease.len(), 1, "{:?}", node.leases(OLD_NETWORK));

    // Another name in the old subnet: the old pod's address is handed out again, and the
    // ADD fails (rolled back) on the route the old pod holds.
    let clash = new_list(&p, &node, NETWORK, config::V4_SUBNET);
    let netns = node.new_pod().unwrap();
    let att = Attachment::new(&unique_container_id(), netns.path(), "eth0");
    let err = p
        .runtime
        .add(&node, &clash, &att)
        .expect_err("another network name in the old subnet gives out the old pod's address");
    let out = err.output().map(|o| o.stdout.clone()).unwrap_or_default();
    assert!(
        out.contains(&format!("{}/32", old.v4())),
        "the failure names the old pod's address: {err}"
    );
    assert!(
        node.leases(NETWORK).is_empty(),
        "a failed ADD keeps no lease"
    );
    assert!(!node.pin_root().exists(), "a failed first ADD pins nothing");
    drop(netns);

    let new_l = new_list(&p, &node, NETWORK, OTHER_SUBNET);
    let new = add_new_pod(&p, &node, &new_l);
    let _new_server = PodServer::start(&new.netns, 80, "new");
    coexist(&ext, &old, &new);
    let before = ebpf_cni_state(&node, NETWORK, &new);

    p.runtime
        .del(&node, &new_l, &old.att, Some(&old.result))
        .unwrap_or_else(|e| panic!("ebpf-cni's DEL of the old chain's pod must succeed: {e}"));
    assert_eq!(
        before,
        ebpf_cni_state(&node, NETWORK, &new),
        "ebpf-cni's DEL of a pod it never added changed its own state"
    );
    p.runtime
        .check(&node, &new_l, &new.att, &new.result)
        .unwrap_or_else(|e| panic!("CHECK of ebpf-cni's pod after the foreign DEL: {e}"));
    tcp_echo(node.netns(), &new.netns, new.v4(), 0).unwrap();
    host_ports_serve(&ext, &[(NEW_PORT, "new")]);

    // The old pod's lease stays: it is under the old network's name.
    assert_eq!(
        old_lease,
        leases_of(&node, OLD_NETWORK, &old),
        "ebpf-cni's DEL under another network name must keep the old pod's lease"
    );
    assert_old_pod_left_as_documented(&node, &old, &old_rules, &old_ifbs);

    // docs/migration.md's cleanup: the old network's lease directory, the rules, the ifb.
    std::fs::remove_dir_all(node.data_dir().join(OLD_NETWORK)).unwrap();
    clean_old_chain_leftovers(&node);
    assert!(!ruleset(&node).contains("CNI-"));
    assert_eq!(before, ebpf_cni_state(&node, NETWORK, &new));

    p.runtime
        .del(&node, &new_l, &new.att, Some(&new.result))
        .unwrap_or_else(|e| panic!("DEL of ebpf-cni's pod: {e}"));
    assert_node_clean(&node, "after the last ebpf-cni pod's DEL");
    assert!(node.leases(NETWORK).is_empty());
}

/// Going back without draining: the old conflist is restored while a pod of ebpf-cni's
/// runs, and the runtime DELs that pod with the old chain. ptp's DEL releases its lease
/// (same network name) and deletes its veth (its first attempt failing, see below), but ebpf-cni's state for it stays (pins,
/// endpoint entries, host port, the node's programs); a CNI GC of ebpf-cni's conflist that
/// lists no attachment removes it, as docs/migration.md says.
#[test]
fn going_back_without_draining_gc_removes_what_the_old_chain_left_of_ebpf_cni() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let new_l = new_list(&p, &node, NETWORK, config::V4_SUBNET);
    let new = add_new_pod(&p, &node, &new_l);
    let old_list = old_chain(&node, NETWORK);
    // Debian 12's ptp (1.1.1) with ipMasq fails this DEL (code 999) after releasing the
    // lease and deleting the veth: the masquerade chain it then removes is not there. The
    // runtime retries, and ptp, finding no interface, succeeds.
    let reference = CniRuntime::reference();
    if let Err(first) = reference.del(&node, &old_list, &new.att, Some(&new.result)) {
        eprintln!("the old chain's first DEL of ebpf-cni's pod failed: {first}");
        reference
            .del(&node, &old_list, &new.att, Some(&new.result))
            .unwrap_or_else(|e| panic!("the old chain's retried DEL of ebpf-cni's pod: {e}"));
    }
    assert!(
        leases_of(&node, NETWORK, &new).is_empty(),
        "host-local's DEL"
    );
    assert!(
        kernel::link(&new.netns, "eth0").unwrap().is_none(),
        "ptp's DEL"
    );
    let pins = node.attachment_pin_dir(NETWORK, &new.att.container_id, "eth0");
    assert!(
        pins.exists(),
        "the old chain cannot remove ebpf-cni's state: {}",
        pins.display()
    );

    // GC needs a 1.1.0 configuration; no attachment is listed as alive.
    let mut gc_list = new_l.clone();
    gc_list.cni_version = "1.1.0".into();
    p.runtime
        .gc(&node, &gc_list, &[])
        .unwrap_or_else(|e| panic!("ebpf-cni's GC: {e}"));
    assert_node_clean(&node, "after ebpf-cni's GC");
}
