//! A node's life after ADD: what happens to a node's pods, leases and host ports when
//! nothing the runtime does is the textbook sequence.
//!
//! - A hard reboot: the runtime never DELs the pods it lost. The first ADD of the new boot
//!   reclaims the network's leases whose attachment is gone, and only ebpf-cni's (the boot
//!   is simulated: the test hook `EBPF_CNI_BOOT_ID_FILE` stands for
//!   `/proc/sys/kernel/random/boot_id`, and the node's pin tree is emptied as a reboot
//!   empties bpffs).
//! - A UDP host port whose pod is gone (plugins#123, kubernetes#58336): a client that
//!   keeps sending reaches whoever owns the port next, a new pod or a process of the node,
//!   with the next datagram, even with netfilter conntrack on in the node; the node's own
//!   sockets connected through the port to the deleted pod are closed by its DEL.
//! - Host ports on loopback (cilium#24818): by default (as the reference portmap) a wildcard
//!   host port takes the node's own `127.0.0.1:<port>` and `[::1]:<port>`;
//!   `"hostPortsOnLoopback": false` leaves loopback to the node's own listeners. ADD warns
//!   when a process of the node already listens where a mapping takes its traffic.
//! - Uplinks as nodes have them: the node's addresses on a bond (802.3ad), a VLAN, a VLAN
//!   on a bond, or a bridge, with the external host matching it. Pod to outside,
//!   masquerade and host ports from outside all run in the TC programs (the node's FORWARD
//!   policy is DROP and counts nothing). Bonding and 802.1Q are modules the host kernel of
//!   this project's machine lacks: those tests run in the kernel matrix's guests, and on a
//!   kernel without them they only say so (in a guest that is a failure).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ebpf_cni_tests::config::NETWORK;
use ebpf_cni_tests::external::{kernel_has_link_kind, ExternalHost, ExternalHostBuilder};
use ebpf_cni_tests::host_ports::{sa, tag_of, tcp_ask, udp_ask, unmap, PodServer};
use ebpf_cni_tests::kernel::Family;
use ebpf_cni_tests::net::{tcp_echo, udp_echo};
use ebpf_cni_tests::netfilter;
use ebpf_cni_tests::netfilter::iptables;
use ebpf_cni_tests::strace::Traced;
use ebpf_cni_tests::{fsutil, AddResult, Attachment, NetConfList, ResultExpectation};
use ebpf_cni_tests::{
    require_root, unique_container_id, CniCommand, ContainerEnv, Netns, Node, PluginUnderTest,
    Stack, REFERENCE_HOST_LOCAL,
};
use serde_json::{json, Value};

/// The test hook standing for `/proc/sys/kernel/random/boot_id` (see `ipam/boot.rs`).
const BOOT_ID_FILE_ENV: &str = "EBPF_CNI_BOOT_ID_FILE";

/// A node whose plugin runs read their boot id from a file the test rewrites.
struct BootedNode {
    p: PluginUnderTest,
    node: Node,
    conf: Value,
    boot_file: PathBuf,
}

/// A pod ADDed through one of the plugins, with the address it got.
struct Added {
    container_id: String,
    ip: IpAddr,
    stderr: String,
}

impl BootedNode {
    fn new(boot: &str) -> Self {
        let p = PluginUnderTest::ebpf_cni();
        let node = Node::new().unwrap();
        let conf = p.conf("1.0.0", &node, Stack::V4);
        let boot_file = node.scratch_dir().join("boot_id");
        let b = Self {
            p,
            node,
            conf,
            boot_file,
        };
        b.boot(boot);
        b
    }

    /// The "machine" boots `id` (the file the plugin reads its boot id from).
    fn boot(&self, id: &str) {
        std::fs::write(&self.boot_file, format!("{id}\n")).unwrap();
    }

    fn env(&self, container_id: &str, pod: &Path) -> ContainerEnv {
        self.p
            .env(container_id, pod, "eth0")
            .with_env(BOOT_ID_FILE_ENV, &self.boot_file.to_string_lossy())
    }

    /// ADD through ebpf-cni (`plugin` None) or another plugin binary sharing the dataDir.
    fn add(&self, pod: &Netns, plugin: Option<&Path>) -> Added {
        let container_id = unique_container_id();
        let env = self.env(&container_id, pod.path());
        let out = match plugin {
            None => self
                .p
                .run(&self.node, CniCommand::Add, &env, self.conf.to_string()),
            Some(bin) => self
                .node
                .run(bin, CniCommand::Add, &env, self.conf.to_string())
                .unwrap(),
        };
        let result = out.expect_success("ADD");
        let ip = result["ips"][0]["address"]
            .as_str()
            .and_then(|a| a.split('/').next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address in {result}"));
        Added {
            container_id,
            ip,
            stderr: out.stderr,
        }
    }

    /// DEL of a pod `add` gave `added`.
    fn del(&self, pod: &Netns, added: &Added) {
        let env = self.env(&added.container_id, pod.path());
        self.p
            .run(&self.node, CniCommand::Del, &env, self.conf.to_string())
            .expect_success("DEL");
    }

    /// Every file in the network's IPAM directory, relative to it.
    fn network_files(&self) -> Vec<String> {
        fsutil::list_files(&self.node.data_dir().join(NETWORK))
            .unwrap()
            .iter()
            .map(|f| f.to_string_lossy().into_owned())
            .collect()
    }

    /// The addresses leased in the network (anyone's).
    fn leased(&self) -> BTreeSet<IpAddr> {
        self.node
            .leases(NETWORK)
            .into_iter()
            .map(|l| l.ip)
            .collect()
    }

    /// Waits (up to 10 s) until the node has `count` host veths of ebpf-cni's.
    fn wait_for_host_veths(&self, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let veths: Vec<String> = ebpf_cni_tests::kernel::links(self.node.netns())
                .unwrap()
                .into_iter()
                .map(|l| l.ifname)
                .filter(|n| n.starts_with("ecni"))
                .collect();
            if veths.len() == count {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the node still has host veths {veths:?}, {count} expected"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What a hard reboot does to the node's eBPF state: bpffs comes back empty.
    fn empty_pin_tree(&self) {
        fsutil::remove_tree(self.node.pin_root()).unwrap();
    }
}

/// Lines of `stderr` saying a lease was reclaimed.
fn reclaimed(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains("reclaimed lease"))
        .collect()
}

/// After a (simulated) reboot, the first ADD reclaims this network's leases of pods that
/// are gone (no attachment: no host veth, no pins), logging each; it keeps the lease of a
/// pod still attached (its veth is there) and another plugin's lease in the same directory
/// (the reference host-local's: no record of ours). Later ADDs of that boot reclaim
/// nothing.
#[test]
fn the_first_add_after_a_reboot_reclaims_only_our_dead_pods_leases() {
    require_root();
    let n = BootedNode::new("boot-1");
    let live_pod = n.node.new_pod().unwrap();
    let live = n.add(&live_pod, None);
    let dead_pods: Vec<Netns> = (0..2).map(|_| n.node.new_pod().unwrap()).collect();
    let dead: Vec<Added> = dead_pods.iter().map(|p| n.add(p, None)).collect();
    let foreign_pod = n.node.new_pod().unwrap();
    let foreign = n.add(&foreign_pod, Some(Path::new(REFERENCE_HOST_LOCAL)));
    assert_eq!(n.leased().len(), 4);

    // The reboot: the dead pods' namespaces (and with them their veths) go without a DEL,
    // bpffs is emptied, the boot id changes.
    for p in dead_pods {
        p.delete().unwrap();
    }
    // A deleted namespace's veths go in the kernel's deferred namespace clean-up, so they
    // may outlive `delete` for a moment (seen on a loaded machine); after a reboot none is
    // left: wait until only the live pod's host veth remains.
    n.wait_for_host_veths(1);
    n.empty_pin_tree();
    n.boot("boot-2");

    let new_pod = n.node.new_pod().unwrap();
    let new = n.add(&new_pod, None);
    let expected: BTreeSet<IpAddr> = [live.ip, foreign.ip, new.ip].into();
    assert_eq!(
        n.leased(),
        expected,
        "the first ADD after the reboot must release exactly the dead pods' leases \
         ({:?}); stderr:\n{}",
        dead.iter().map(|d| d.ip).collect::<Vec<_>>(),
        new.stderr
    );
    let lines = reclaimed(&new.stderr);
    assert_eq!(lines.len(), dead.len(), "one log line per lease: {lines:?}");
    for d in &dead {
        assert!(
            lines
                .iter()
                .any(|l| l.contains(&format!("lease {} ", d.ip)) && l.contains(&d.container_id)),
            "no line names {} of {}: {lines:?}",
            d.ip,
            d.container_id
        );
    }
    let boot_record = n.node.data_dir().join(NETWORK).join("ebpf-cni/boot_id");
    assert_eq!(
        std::fs::read_to_string(&boot_record).unwrap().trim(),
        "boot-2"
    );

    // The boot is recorded: the next ADD of this boot does not look again.
    let next_pod = n.node.new_pod().unwrap();
    let next = n.add(&next_pod, None);
    assert!(reclaimed(&next.stderr).is_empty(), "{}", next.stderr);
    let expected: BTreeSet<IpAddr> = [live.ip, foreign.ip, new.ip, next.ip].into();
    assert_eq!(n.leased(), expected);
}

/// Within one boot a dead pod's lease stays: releasing it is GC's job (the runtime lists
/// the live attachments), not ADD's.
#[test]
fn within_one_boot_add_reclaims_nothing() {
    require_root();
    let n = BootedNode::new("boot-1");
    let dead_pod = n.node.new_pod().unwrap();
    let dead = n.add(&dead_pod, None);
    dead_pod.delete().unwrap();
    n.empty_pin_tree();

    let pod = n.node.new_pod().unwrap();
    let added = n.add(&pod, None);
    assert!(reclaimed(&added.stderr).is_empty(), "{}", added.stderr);
    let expected: BTreeSet<IpAddr> = [dead.ip, added.ip].into();
    assert_eq!(n.leased(), expected, "the dead pod's lease must stay");
}

/// The first ADDs of a new boot, run at once, each get an address and keep it: the one
/// that reclaims holds the node lock and records the boot before any of them allocates,
/// so none of their fresh leases (reserved before their veths exist) is taken for a dead
/// pod's. The dead pod's lease is reclaimed once.
#[test]
fn concurrent_first_adds_of_a_boot_keep_their_leases() {
    require_root();
    let n = BootedNode::new("boot-1");
    let dead_pod = n.node.new_pod().unwrap();
    let dead = n.add(&dead_pod, None);
    dead_pod.delete().unwrap();
    n.wait_for_host_veths(0);
    n.empty_pin_tree();
    n.boot("boot-2");

    let pods: Vec<Netns> = (0..4).map(|_| n.node.new_pod().unwrap()).collect();
    let added: Vec<Added> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .map(|p| {
                let n = &n;
                s.spawn(move || n.add(p, None))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ips: BTreeSet<IpAddr> = added.iter().map(|a| a.ip).collect();
    assert_eq!(ips.len(), added.len(), "an address was handed out twice");
    assert_eq!(
        n.leased(),
        ips,
        "every new pod keeps its lease, the dead one is gone"
    );
    let lines: Vec<&str> = added.iter().flat_map(|a| reclaimed(&a.stderr)).collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains(&dead.container_id), "{lines:?}");
}

/// What the reference host-local itself leaves in a network's directory once its last
/// lease is gone: its lock and the round robin's position.
const REFERENCE_FILES: [&str; 2] = ["last_reserved_ip.0", "lock"];

/// After the network's last DEL its IPAM directory holds only what the reference
/// host-local leaves there: no released lease file kept for later, no record of ours, no
/// boot record. A reboot's reclaim of the last leases leaves the same once the next pod
/// is DELed.
#[test]
fn the_networks_last_del_leaves_only_the_reference_host_locals_files() {
    require_root();
    let n = BootedNode::new("boot-1");
    let pods: Vec<Netns> = (0..3).map(|_| n.node.new_pod().unwrap()).collect();
    let added: Vec<Added> = pods.iter().map(|p| n.add(p, None)).collect();
    assert!(
        n.network_files()
            .iter()
            .any(|f| f == &format!("ebpf-cni/{}", added[0].ip)),
        "a lease of ours has its record: {:?}",
        n.network_files()
    );
    n.del(&pods[0], &added[0]);
    assert!(
        !n.network_files()
            .iter()
            .any(|f| f.contains(&added[0].ip.to_string())),
        "the DELed pod's lease went whole: {:?}",
        n.network_files()
    );
    for (pod, a) in pods.iter().zip(&added).skip(1) {
        n.del(pod, a);
    }
    assert_eq!(n.network_files(), REFERENCE_FILES, "after the last DEL");
    // A second DEL of a pod already gone changes nothing.
    n.del(&pods[1], &added[1]);
    assert_eq!(n.network_files(), REFERENCE_FILES, "after a repeated DEL");

    // A reboot loses two pods without a DEL; the first ADD of the new boot reclaims their
    // leases, and the DEL of that last pod leaves the reference's files again.
    let lost: Vec<Netns> = (0..2).map(|_| n.node.new_pod().unwrap()).collect();
    for pod in &lost {
        n.add(pod, None);
    }
    for pod in lost {
        pod.delete().unwrap();
    }
    n.wait_for_host_veths(0);
    n.empty_pin_tree();
    n.boot("boot-2");
    let pod = n.node.new_pod().unwrap();
    let last = n.add(&pod, None);
    assert_eq!(reclaimed(&last.stderr).len(), 2, "{}", last.stderr);
    n.del(&pod, &last);
    assert_eq!(
        n.network_files(),
        REFERENCE_FILES,
        "after the new boot's last DEL"
    );
}

// ---------------------------------------------------------------------------------------
// Host ports: what the dataplane does while owners change

/// A pod ADDed through a conflist with the portMappings capability.
struct MappedPod {
    /// Held: dropping it deletes the pod's namespace.
    _netns: Netns,
    att: Attachment,
    result: Value,
    r: AddResult,
}

fn portmap_list(p: &PluginUnderTest, node: &Node, extra: Value) -> NetConfList {
    let mut conf = p.conf("1.0.0", node, Stack::Dual);
    conf["capabilities"] = json!({"portMappings": true});
    if let (Value::Object(c), Value::Object(e)) = (&mut conf, extra) {
        c.extend(e);
    }
    NetConfList::single(&conf)
}

/// ADDs `netns` (made by the caller, so a server can be bound in it first) with `mappings`
/// and CNI_ARGS `args` (e.g. `IP=...`).
fn add_mapped(
    p: &PluginUnderTest,
    node: &Node,
    l: &NetConfList,
    netns: Netns,
    mappings: Value,
    args: Option<&str>,
) -> MappedPod {
    let mut att = Attachment::new(&unique_container_id(), netns.path(), "eth0")
        .with_capability("portMappings", mappings);
    if let Some(a) = args {
        att = att.with_args(a);
    }
    let result = p
        .runtime
        .add(node, l, &att)
        .unwrap_or_else(|e| panic!("ADD: {e}"));
    let r = ResultExpectation::standard(
        "1.0.0",
        "eth0",
        &netns.path().to_string_lossy(),
        Stack::Dual,
    )
    .ebpf_cni_host_names()
    .assert_valid(&result);
    MappedPod {
        _netns: netns,
        att,
        result,
        r,
    }
}

fn del_mapped(p: &PluginUnderTest, node: &Node, l: &NetConfList, pod: &MappedPod) {
    p.runtime
        .del(node, l, &pod.att, Some(&pod.result))
        .unwrap_or_else(|e| panic!("DEL: {e}"));
}

/// A UDP server on `[::]:port` (both families) in `ns`, answering each datagram with
/// `"<tag> <datagram>"`. Stops when dropped.
struct TaggedUdp {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TaggedUdp {
    fn start(ns: &Netns, port: u16, tag: &str) -> Self {
        let sock = ns
            .run_in(|| UdpSocket::bind((Ipv6Addr::UNSPECIFIED, port)))
            .unwrap()
            .unwrap_or_else(|e| panic!("binding [::]:{port} in {}: {e}", ns.name()));
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (s, tag) = (stop.clone(), tag.to_owned());
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            while !s.load(Ordering::Relaxed) {
                if let Ok((n, peer)) = sock.recv_from(&mut buf) {
                    let msg = format!("{tag} {}", String::from_utf8_lossy(&buf[..n]));
                    let _ = sock.send_to(msg.as_bytes(), peer);
                }
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for TaggedUdp {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A client that keeps sending numbered datagrams from one source port to `target` (every
/// 5 ms) and records who answered each: the answer's tag, or `from <addr>` when the
/// answer did not come from `target` (the address the client sent to).
struct UdpStream {
    target: SocketAddr,
    next: Arc<AtomicU64>,
    answers: Arc<Mutex<BTreeMap<u64, String>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl UdpStream {
    fn start(ns: &Netns, bind: SocketAddr, target: SocketAddr) -> Self {
        // A port the previous stream of the test used is free once its threads are joined,
        // but a slow (emulated) machine has been seen answering EADDRINUSE for a moment:
        // retried for up to a second.
        let deadline = Instant::now() + Duration::from_secs(1);
        let sock = loop {
            match ns.run_in(|| UdpSocket::bind(bind)).unwrap() {
                Err(e)
                    if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => break other.unwrap(),
            }
        };
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let rx = sock.try_clone().unwrap();
        let next = Arc::new(AtomicU64::new(0));
        let answers = Arc::new(Mutex::new(BTreeMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (n, s) = (next.clone(), stop.clone());
        let sender = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let seq = n.fetch_add(1, Ordering::SeqCst);
                let _ = sock.send_to(seq.to_string().as_bytes(), target);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let (a, s) = (answers.clone(), stop.clone());
        let receiver = std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            while !s.load(Ordering::Relaxed) {
                let Ok((len, src)) = rx.recv_from(&mut buf) else {
                    continue;
                };
                let text = String::from_utf8_lossy(&buf[..len]).into_owned();
                let Some((tag, seq)) = text.split_once(' ') else {
                    continue;
                };
                let Ok(seq) = seq.parse::<u64>() else {
                    continue;
                };
                let who = if unmap(src) == target {
                    tag.to_owned()
                } else {
                    format!("from {src}")
                };
                a.lock().unwrap().insert(seq, who);
            }
        });
        Self {
            target,
            next,
            answers,
            stop,
            threads: vec![sender, receiver],
        }
    }

    /// The number the next datagram will carry: every datagram from it on is sent after
    /// this call.
    fn mark(&self) -> u64 {
        self.next.load(Ordering::SeqCst)
    }

    /// Waits until `count` datagrams from `from` on were sent and answered (or 3 s), then
    /// returns who answered each of them (`None`: no answer).
    fn answered_from(&self, from: u64, count: u64) -> Vec<(u64, Option<String>)> {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let done = {
                let a = self.answers.lock().unwrap();
                (from..from + count).all(|s| a.contains_key(&s))
            };
            if done || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let a = self.answers.lock().unwrap();
        (from..from + count)
            .map(|s| (s, a.get(&s).cloned()))
            .collect()
    }

    /// Asserts the datagrams sent from `from` on were answered by `tag` from the first one
    /// on: no answer lost to a stale path, none from the previous owner.
    fn assert_owner_from(&self, from: u64, tag: &str, what: &str) {
        let got = self.answered_from(from, 20);
        let wrong: Vec<_> = got
            .iter()
            .filter(|(_, who)| who.as_deref() != Some(tag))
            .collect();
        assert!(
            wrong.is_empty(),
            "{what} ({}): datagrams sent after the change must be answered by {tag} from the \
             first one on; these were not (seq, answered by): {wrong:?}",
            self.target
        );
    }
}

impl Drop for UdpStream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Turns netfilter conntrack on in `ns` for both families (a rule that matches on it), so
/// datagrams the stack sees leave conntrack entries behind, as on the reference's nodes.
fn conntrack_on(ns: &Netns) {
    for fam in [Family::V4, Family::V6] {
        iptables(
            ns,
            fam,
            &[
                "-A",
                "INPUT",
                "-m",
                "conntrack",
                "--ctstate",
                "INVALID",
                "-j",
                "DROP",
            ],
        )
        .unwrap();
    }
}

/// The node's conntrack entries for UDP towards `port` (`/proc/net/nf_conntrack`).
fn conntrack_udp_to(ns: &Netns, port: u16) -> Vec<String> {
    let out = ns.exec(&["cat", "/proc/net/nf_conntrack"]).unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(" udp ") && l.contains(&format!("dport={port} ")))
        .map(str::to_owned)
        .collect()
}

/// A stale flow of a deleted pod (plugins#123, #1190, kubernetes#58336): a client outside
/// the node keeps sending to a UDP host port from one source port while the pod behind it
/// is deleted; the datagrams of the gap meet the node's stack, where conntrack (on here)
/// records the flow, as it does on the reference's nodes, whose stale entry then blackholes
/// the port. Here (a) a new pod given the port answers the very next datagram sent after
/// its ADD returned, and (b) after that pod's DEL, a process of the node that binds the
/// port answers the very next datagram sent after its bind, IPv4 and IPv6 alike.
#[test]
fn a_udp_host_port_goes_to_its_next_owner_with_the_next_datagram() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "uplink0", 41).unwrap();
    conntrack_on(node.netns());
    let l = portmap_list(&p, &node, json!({}));
    let mappings = json!([{"hostPort": 5354, "containerPort": 53, "protocol": "udp"}]);
    // Another pod keeps the node's programs and maps loaded throughout.
    let _other = add_mapped(&p, &node, &l, node.new_pod().unwrap(), json!([]), None);

    let old_ns = node.new_pod().unwrap();
    let _old_server = TaggedUdp::start(&old_ns, 53, "old");
    let old = add_mapped(&p, &node, &l, old_ns, mappings.clone(), None);
    let streams = [
        UdpStream::start(
            ext.netns(),
            sa(Ipv4Addr::UNSPECIFIED, 40001),
            sa(ext.node_v4, 5354),
        ),
        UdpStream::start(
            ext.netns(),
            sa(Ipv6Addr::UNSPECIFIED, 40011),
            sa(ext.node_v6, 5354),
        ),
    ];
    for s in &streams {
        s.assert_owner_from(s.mark(), "old", "control: the first pod answers");
    }

    del_mapped(&p, &node, &l, &old);
    // The gap: the client keeps sending and the node's stack (nothing listens) sees it.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !conntrack_udp_to(node.netns(), 5354).is_empty(),
        "control: the gap's datagrams left conntrack entries in the node"
    );

    // (a) A new pod takes the port (its server is up before ADD).
    let new_ns = node.new_pod().unwrap();
    let _new_server = TaggedUdp::start(&new_ns, 53, "new");
    let new = add_mapped(&p, &node, &l, new_ns, mappings, None);
    assert_ne!(new.r.ip4().unwrap().addr, old.r.ip4().unwrap().addr);
    let from: Vec<u64> = streams.iter().map(UdpStream::mark).collect();
    for (s, from) in streams.iter().zip(from) {
        s.assert_owner_from(from, "new", "(a) a new pod took the host port");
    }

    // (b) The pod goes and a process of the node binds the port.
    del_mapped(&p, &node, &l, &new);
    std::thread::sleep(Duration::from_millis(300));
    let _node_server = TaggedUdp::start(node.netns(), 5354, "node");
    let from: Vec<u64> = streams.iter().map(UdpStream::mark).collect();
    for (s, from) in streams.iter().zip(from) {
        s.assert_owner_from(
            from,
            "node",
            "(b) a process of the node bound the host port",
        );
    }
}

/// The reverse translation of a host-port flow is kept per flow (`ECNI_NAT_REV`, keyed by
/// what the pod's reply carries) and outlives the pod. A new pod given the same address
/// (here asked for with `IP=`), reached by the same client from the same port *directly*
/// (no host port), must answer from its own address: a stale entry would rewrite its
/// replies' source to the old host port, and the client would drop them.
#[test]
fn a_pod_given_a_deleted_pods_address_answers_from_its_own_address() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "uplink0", 42).unwrap();
    let l = portmap_list(&p, &node, json!({}));
    let _other = add_mapped(&p, &node, &l, node.new_pod().unwrap(), json!([]), None);
    let args = "IgnoreUnknown=1;IP=10.10.0.200,fd00:10::200";

    let old_ns = node.new_pod().unwrap();
    let _old_server = TaggedUdp::start(&old_ns, 53, "old");
    let old = add_mapped(
        &p,
        &node,
        &l,
        old_ns,
        json!([{"hostPort": 5355, "containerPort": 53, "protocol": "udp"}]),
        Some(args),
    );
    for target in [sa(ext.node_v4, 5355), sa(ext.node_v6, 5355)] {
        // One client port per family (a v6 wildcard socket and a v4 one share the port
        // space), the same in both halves of the test.
        let bind = if target.is_ipv4() {
            sa(Ipv4Addr::UNSPECIFIED, 40002)
        } else {
            sa(Ipv6Addr::UNSPECIFIED, 40012)
        };
        let s = UdpStream::start(ext.netns(), bind, target);
        s.assert_owner_from(s.mark(), "old", "control: through the host port");
    }
    del_mapped(&p, &node, &l, &old);

    let new_ns = node.new_pod().unwrap();
    let _new_server = TaggedUdp::start(&new_ns, 53, "new");
    let new = add_mapped(&p, &node, &l, new_ns, json!([]), Some(args));
    for ip in [new.r.ip4().unwrap().addr, new.r.ip6().unwrap().addr] {
        let was = if ip.is_ipv4() {
            old.r.ip4().unwrap().addr
        } else {
            old.r.ip6().unwrap().addr
        };
        assert_eq!(ip, was, "the new pod has the old one's address");
        let bind = if ip.is_ipv4() {
            sa(Ipv4Addr::UNSPECIFIED, 40002)
        } else {
            sa(Ipv6Addr::UNSPECIFIED, 40012)
        };
        let s = UdpStream::start(ext.netns(), bind, sa(ip, 53));
        s.assert_owner_from(
            s.mark(),
            "new",
            "the same client port, straight to the reused address",
        );
    }
}

/// The node's own connected sockets: the socket programs translate a host port at
/// `connect()`, so a connected socket of the node talks to the pod's address itself, and
/// after the pod's DEL it would keep sending there (UDP into nothing, TCP retransmitting)
/// while the port has a new owner. DEL closes them (sock_diag `SOCK_DESTROY`): the next
/// call fails at once (TCP: `ECONNABORTED`; UDP: the socket is no longer connected), and
/// a socket connected again reaches the new owner.
/// Unconnected sockets are translated at each `sendmsg()` and need nothing. The same on
/// every kernel (before 5.14 the socket programs learn the node's namespace by a probe).
#[test]
fn the_nodes_connected_sockets_to_a_deleted_pod_are_closed() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    // A default route, as nodes have: what is sent to a deleted pod's address leaves
    // quietly instead of failing as unreachable.
    let ext = ExternalHost::attach(node.netns(), "uplink0", 44).unwrap();
    node.netns()
        .ip_ok(&["route", "add", "default", "via", &ext.v4.to_string()])
        .unwrap();
    let l = portmap_list(&p, &node, json!({}));
    let mappings = json!([
        {"hostPort": 5359, "containerPort": 53, "protocol": "udp"},
        {"hostPort": 5359, "containerPort": 53, "protocol": "tcp"}
    ]);
    let _other = add_mapped(&p, &node, &l, node.new_pod().unwrap(), json!([]), None);
    let old_ns = node.new_pod().unwrap();
    let _old_server = TaggedUdp::start(&old_ns, 53, "old");
    let old = add_mapped(&p, &node, &l, old_ns, mappings.clone(), None);
    let target = sa(Ipv4Addr::LOCALHOST, 5359);
    // A TCP connection of the node to the old pod, idle (the pod listens; it never answers).
    let tcp_server = old
        ._netns
        .run_in(|| std::net::TcpListener::bind((Ipv6Addr::UNSPECIFIED, 53)).unwrap())
        .unwrap();
    let tcp = node
        .netns()
        .run_in(|| std::net::TcpStream::connect_timeout(&target, Duration::from_secs(3)))
        .unwrap()
        .unwrap();
    let _accepted = tcp_server.accept().unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let udp = node
        .netns()
        .run_in(|| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap())
        .unwrap();
    udp.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    udp.connect(target).unwrap();
    let ask = |s: &UdpSocket| -> std::io::Result<String> {
        s.send(b"1")?;
        let mut buf = [0u8; 128];
        let n = s.recv(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    assert_eq!(
        tag_of(&ask(&udp).unwrap()),
        "old",
        "control: through the host port"
    );

    del_mapped(&p, &node, &l, &old);
    let new_ns = node.new_pod().unwrap();
    let _new_server = TaggedUdp::start(&new_ns, 53, "new");
    let _new = add_mapped(&p, &node, &l, new_ns, mappings, None);

    let started = Instant::now();
    // Destroyed, the socket is no longer connected: a send says so (EDESTADDRREQ), a
    // receive would return ECONNABORTED. Not an answer, and not a timeout.
    let got = ask(&udp);
    assert!(
        got.as_ref()
            .is_err_and(|e| e.raw_os_error() == Some(libc::EDESTADDRREQ)
                || e.kind() == std::io::ErrorKind::ConnectionAborted),
        "the connected UDP socket must fail at once after its pod's DEL, got {got:?}"
    );
    let mut buf = [0u8; 8];
    let got = std::io::Read::read(&mut &tcp, &mut buf);
    assert_eq!(
        got.as_ref().map_err(std::io::Error::kind).err(),
        Some(std::io::ErrorKind::ConnectionAborted),
        "the TCP connection to the deleted pod must fail at once, got {got:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    // What its owner does on the error: a new socket, connected again.
    let again = node
        .netns()
        .run_in(|| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap())
        .unwrap();
    again
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    again.connect(target).unwrap();
    assert_eq!(
        tag_of(&ask(&again).unwrap()),
        "new",
        "a socket connected again reaches the port's new owner"
    );
}

/// DEL looks for the node's sockets connected through a pod's host port only where the
/// socket programs sent some through it (the mapping's `socket` hits): each look is a
/// sock_diag dump, and the kernel walks its whole established hash for it, every
/// namespace's (milliseconds on a machine with a large hash; 8 ms of a 34 ms DEL in the
/// benchmark). The DEL of a pod the node never connected to through its host port opens no
/// sock_diag socket; the DEL of one it did opens one (and closes what it finds, as
/// `the_nodes_connected_sockets_to_a_deleted_pod_are_closed` shows).
#[test]
fn del_looks_for_node_sockets_only_through_mappings_the_node_used() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let traced = Traced::new(&p.bin, "socket").unwrap();
    let t = PluginUnderTest::at(traced.wrapper.clone());
    let node = Node::new().unwrap();
    let l = portmap_list(&p, &node, json!({}));
    let mapped = |port: u16| {
        json!([
            {"hostPort": port, "containerPort": 53, "protocol": "udp"},
            {"hostPort": port, "containerPort": 53, "protocol": "tcp"}
        ])
    };
    let untouched = add_mapped(&p, &node, &l, node.new_pod().unwrap(), mapped(5361), None);
    let used = add_mapped(&p, &node, &l, node.new_pod().unwrap(), mapped(5362), None);
    // The node's own UDP socket, connected through the second pod's host port.
    let udp = node
        .netns()
        .run_in(|| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap())
        .unwrap();
    udp.connect(sa(Ipv4Addr::LOCALHOST, 5362)).unwrap();

    del_mapped(&t, &node, &l, &untouched);
    let trace = traced.log().unwrap();
    assert!(
        trace.contains("socket(") && !trace.contains("NETLINK_SOCK_DIAG"),
        "the DEL of a pod the node never connected to through its host port opened a \
         sock_diag socket; its socket calls:\n{trace}"
    );
    del_mapped(&t, &node, &l, &used);
    let trace = traced.log().unwrap();
    assert!(
        trace.contains("NETLINK_SOCK_DIAG"),
        "the DEL of a pod the node connected to through its host port looked for no \
         socket of the node; socket calls:\n{trace}"
    );
    let got = udp.send(b"1");
    assert!(
        got.as_ref()
            .is_err_and(|e| e.raw_os_error() == Some(libc::EDESTADDRREQ)
                || e.kind() == std::io::ErrorKind::ConnectionAborted),
        "the node's UDP socket connected through the deleted pod's host port must be closed, \
         got {got:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Host ports on loopback

/// A TCP and a UDP server of the node on each of `addrs`, answering `"<tag> <peer>"` like
/// [`PodServer`] (which binds the wildcard). Stops when dropped.
struct NodeListener {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl NodeListener {
    fn start(ns: &Netns, addrs: &[SocketAddr], tag: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for &a in addrs {
            let (tcp, udp) = ns
                .run_in(|| {
                    (
                        std::net::TcpListener::bind(a).unwrap(),
                        UdpSocket::bind(a).unwrap(),
                    )
                })
                .unwrap();
            tcp.set_nonblocking(true).unwrap();
            udp.set_read_timeout(Some(Duration::from_millis(50)))
                .unwrap();
            let (s, t) = (stop.clone(), tag.to_owned());
            threads.push(std::thread::spawn(move || {
                use std::io::{Read, Write};
                while !s.load(Ordering::Relaxed) {
                    match tcp.accept() {
                        Ok((mut c, peer)) => {
                            let _ = c.set_nonblocking(false);
                            let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
                            let mut buf = [0u8; 64];
                            if c.read(&mut buf).unwrap_or(0) > 0 {
                                let _ = c.write_all(format!("{t} {peer}").as_bytes());
                            }
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
            }));
            let (s, t) = (stop.clone(), tag.to_owned());
            threads.push(std::thread::spawn(move || {
                let mut buf = [0u8; 256];
                while !s.load(Ordering::Relaxed) {
                    if let Ok((_, peer)) = udp.recv_from(&mut buf) {
                        let _ = udp.send_to(format!("{t} {peer}").as_bytes(), peer);
                    }
                }
            }));
        }
        Self { stop, threads }
    }
}

impl Drop for NodeListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Who answers TCP and UDP to `target` from `from`: the answers' tags (or the errors).
fn who_answers(from: &Netns, target: SocketAddr) -> (String, String) {
    let tag = |r: anyhow::Result<String>| match r {
        Ok(a) => tag_of(&a).to_owned(),
        Err(e) => format!("error: {e:#}"),
    };
    (tag(tcp_ask(from, target)), tag(udp_ask(from, target)))
}

/// The config of the single plugin as the runtime sends it, with `mappings` as
/// `runtimeConfig.portMappings`.
fn with_mappings(conf: &Value, mappings: &Value) -> String {
    let mut c = conf.clone();
    c["runtimeConfig"] = json!({ "portMappings": mappings });
    c.to_string()
}

/// A host port the node itself serves on loopback (cilium#24818): a wildcard host port 5356
/// and a node that already serves `127.0.0.1:5356` and `[::1]:5356` itself (as a local DNS
/// resolver would 53).
///
/// By default the mapping takes loopback, as the reference portmap does: the node's own
/// connections to `127.0.0.1:5356` and `[::1]:5356` reach the pod, and ADD warns, naming
/// each listener and the key. With `"hostPortsOnLoopback": false` they reach the node's
/// listeners again while the node's own address and clients outside still reach the pod;
/// ADD does not warn about loopback but still about a process listening on `0.0.0.0`
/// (5357), whose traffic the mapping takes; CHECK holds with the same config and fails (105)
/// with the other value, whose pinned mapping differs; `inspect` shows it; an invalid value
/// is refused with code 7 naming the key. The same on every kernel (before 5.14 the socket
/// programs learn the node's namespace by a probe).
#[test]
fn host_ports_take_loopback_unless_the_network_says_not_to() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "uplink0", 43).unwrap();
    let lo4 = sa(Ipv4Addr::LOCALHOST, 5356);
    let lo6 = sa(Ipv6Addr::LOCALHOST, 5356);
    let _resolver = NodeListener::start(node.netns(), &[lo4, lo6], "node");
    let _wildcard = TaggedUdp::start(node.netns(), 5357, "node-any");
    let mappings = json!([
        {"hostPort": 5356, "containerPort": 53, "protocol": "tcp"},
        {"hostPort": 5356, "containerPort": 53, "protocol": "udp"},
        {"hostPort": 5357, "containerPort": 53, "protocol": "udp"}
    ]);
    assert_eq!(
        who_answers(node.netns(), lo4),
        ("node".into(), "node".into())
    );

    let run = |conf: &Value, cmd: CniCommand, cid: &str, pod: &Netns| {
        p.run(
            &node,
            cmd,
            &p.env(cid, pod.path(), "eth0"),
            with_mappings(conf, &mappings),
        )
    };
    let warned = |stderr: &str, at: &str| {
        stderr
            .lines()
            .any(|l| l.contains("already listens on") && l.contains(at))
    };

    // The default: loopback is the pod's (where the node's sockets are translated).
    let default = p.conf("1.0.0", &node, Stack::Dual);
    let pod = node.new_pod().unwrap();
    let _server = PodServer::start(&pod, 53, "pod");
    let cid = unique_container_id();
    let out = run(&default, CniCommand::Add, &cid, &pod);
    out.expect_success("ADD");
    for target in [lo4, lo6] {
        assert_eq!(
            who_answers(node.netns(), target),
            ("pod".into(), "pod".into()),
            "default, the node's own connection to {target}"
        );
    }
    for at in ["127.0.0.1:5356/tcp", "127.0.0.1:5356/udp", "[::1]:5356/tcp"] {
        assert!(
            warned(&out.stderr, at),
            "ADD warns about the node's listener on {at} (loopback taken):\n{}",
            out.stderr
        );
    }
    assert!(
        out.stderr.contains("hostPortsOnLoopback"),
        "the warning names the key: {}",
        out.stderr
    );
    assert!(warned(&out.stderr, "0.0.0.0:5357/udp"), "{}", out.stderr);
    run(&default, CniCommand::Del, &cid, &pod).expect_success("DEL");

    // hostPortsOnLoopback: false.
    let mut off = default.clone();
    off["hostPortsOnLoopback"] = json!(false);
    let cid = unique_container_id();
    let out = run(&off, CniCommand::Add, &cid, &pod);
    out.expect_success("ADD with hostPortsOnLoopback false");
    for target in [lo4, lo6] {
        assert_eq!(
            who_answers(node.netns(), target),
            ("node".into(), "node".into()),
            "hostPortsOnLoopback false: the node's own connection to {target}"
        );
    }
    assert!(
        !out.stderr.contains("127.0.0.1:5356") && !out.stderr.contains("[::1]:5356"),
        "no warning about loopback, which the mapping leaves alone:\n{}",
        out.stderr
    );
    assert!(warned(&out.stderr, "0.0.0.0:5357/udp"), "{}", out.stderr);
    let node4 = sa(ext.node_v4, 5356);
    let (tcp, udp) = who_answers(node.netns(), node4);
    assert!(
        tcp.starts_with("pod") && udp.starts_with("pod"),
        "the node's own connection to its address {node4}: {tcp} / {udp}"
    );
    assert_eq!(
        who_answers(ext.netns(), node4),
        ("pod".into(), "pod".into()),
        "a client outside the node"
    );
    let report = ebpf_cni_tests::dataplane::inspect(&p.bin, &node).unwrap();
    let rows = report["port_mappings"].as_array().expect("port_mappings");
    assert!(
        !rows.is_empty() && rows.iter().all(|m| m["loopback"] == json!(false)),
        "inspect shows loopback off: {rows:?}"
    );

    // CHECK compares the pinned mappings with the config's value.
    let mut prev = with_mappings(&off, &mappings).parse::<Value>().unwrap();
    prev["prevResult"] = out.json.clone().unwrap();
    let check = |conf: Value| {
        p.run(
            &node,
            CniCommand::Check,
            &p.env(&cid, pod.path(), "eth0"),
            conf.to_string(),
        )
    };
    check(prev.clone()).expect_success("CHECK with the same hostPortsOnLoopback");
    let mut flipped = prev.clone();
    flipped["hostPortsOnLoopback"] = json!(true);
    let err = check(flipped).expect_error(105, "CHECK with the other hostPortsOnLoopback");
    assert!(
        err.msg.contains("5356") || err.msg.contains("5357"),
        "{err:?}"
    );

    let mut bad = off.clone();
    bad["hostPortsOnLoopback"] = json!("no");
    let err = run(
        &bad,
        CniCommand::Add,
        &unique_container_id(),
        &node.new_pod().unwrap(),
    )
    .expect_error(7, "an invalid hostPortsOnLoopback");
    assert!(err.msg.contains("hostPortsOnLoopback"), "{err:?}");
    run(&off, CniCommand::Del, &cid, &pod).expect_success("DEL");
    assert!(
        ebpf_cni_tests::dataplane::port_mappings(&node)
            .map(|m| m.is_empty())
            .unwrap_or(true),
        "DEL removed the mappings"
    );
}

// ---------------------------------------------------------------------------------------
// Uplinks as nodes have them

/// Whether this kernel makes every link kind of `kinds`; when not, says so on stderr, and
/// fails in a matrix guest, whose Debian kernels have them all (as modules).
fn kernel_makes(kinds: &[&str]) -> bool {
    let missing: Vec<&str> = kinds
        .iter()
        .copied()
        .filter(|k| !kernel_has_link_kind(k))
        .collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        !ebpf_cni_tests::rate::in_vm(),
        "the guest's kernel cannot make {missing:?} links"
    );
    eprintln!(
        "this kernel cannot make {missing:?} links (no bonding / 802.1Q): the test runs in the \
         kernel matrix's guests"
    );
    false
}

/// A node whose only uplink is `uplink` (named `up0`, external host `n`): pods of a plain
/// network (one with host port 8080, TCP and UDP) and of a masquerading one, with the
/// node's FORWARD policy DROP and a counter on it.
///
/// Pod to the external host (its replies through the uplink's ingress), the masquerading
/// pod to it (leaving with the uplink's address, replies translated at its ingress), and
/// the host to the host port, each IPv4 and IPv6, TCP and UDP; the device program is on
/// the uplink (and not on the ports under it), and the stack forwarded nothing.
fn uplink_serves_the_dataplane(uplink: ExternalHostBuilder) {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = uplink.attach(node.netns()).unwrap();
    for fam in [Family::V4, Family::V6] {
        netfilter::add_forward_counter(node.netns(), fam).unwrap();
        netfilter::set_forward_policy(node.netns(), fam, "DROP").unwrap();
    }

    let plain = portmap_list(&p, &node, json!({}));
    let pod = add_mapped(
        &p,
        &node,
        &plain,
        node.new_pod().unwrap(),
        json!([
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 8080, "containerPort": 80, "protocol": "udp"}
        ]),
        None,
    );
    let mut masq = p.conf("1.0.0", &node, Stack::Dual);
    masq["name"] = json!("masqnet");
    masq["ipMasq"] = json!(true);
    masq["ipam"]["ranges"] = json!([[{"subnet": "10.20.0.0/24"}], [{"subnet": "fd00:20::/64"}]]);
    let mpod = node.new_pod().unwrap();
    p.run(
        &node,
        CniCommand::Add,
        &p.env(&unique_container_id(), mpod.path(), "eth0"),
        masq.to_string(),
    )
    .expect_success("ADD of the masquerading pod");

    let report = ebpf_cni_tests::dataplane::inspect(&p.bin, &node).unwrap();
    let devices: Vec<&str> = report["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d["name"].as_str())
        .collect();
    assert_eq!(
        devices,
        [ext.node_dev()],
        "the device program goes on the uplink holding the addresses, not on its ports"
    );

    let mut failures = Vec::new();
    let families = [
        (IpAddr::from(ext.node_v4), pod.r.ip4().unwrap().addr),
        (IpAddr::from(ext.node_v6), pod.r.ip6().unwrap().addr),
    ];
    for (node_addr, pod_ip) in families {
        let dst = ext.addr_like(node_addr);
        for (what, from, want_src) in [
            ("pod -> outside", &pod._netns, pod_ip),
            ("masquerading pod -> outside", &mpod, node_addr),
        ] {
            match tcp_echo(from, ext.netns(), dst, 0) {
                Ok(e) if e.client_addr.ip() == want_src => {}
                other => failures.push(format!(
                    "{what} TCP to {dst} (source {want_src}): {other:?}"
                )),
            }
            match udp_echo(from, ext.netns(), dst, 0) {
                Ok(e) if e.client_addr.ip() == want_src => {}
                other => failures.push(format!(
                    "{what} UDP to {dst} (source {want_src}): {other:?}"
                )),
            }
        }
    }
    let _server = PodServer::start(&pod._netns, 80, "pod");
    for node_addr in [IpAddr::from(ext.node_v4), IpAddr::from(ext.node_v6)] {
        let target = sa(node_addr, 8080);
        let (tcp, udp) = who_answers(ext.netns(), target);
        if (tcp.as_str(), udp.as_str()) != ("pod", "pod") {
            failures.push(format!(
                "outside -> host port {target}: TCP {tcp}, UDP {udp}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "over the uplink {} ({}):\n{}",
        ext.node_dev(),
        ext.host_dev(),
        failures.join("\n")
    );
    for fam in [Family::V4, Family::V6] {
        assert_eq!(
            netfilter::forward_packets(node.netns(), fam).unwrap(),
            0,
            "{fam:?}: the node's stack forwarded packets: the TC programs must carry all of it"
        );
    }
}

/// An uplink that is not a plain link: an 802.3ad bond (the external host bonds too).
#[test]
fn a_bond_uplink_carries_pods_masquerade_and_host_ports() {
    if kernel_makes(&["bond"]) {
        uplink_serves_the_dataplane(ExternalHost::builder("up0", 51).bond());
    }
}

/// An uplink that is not a plain link: the node's addresses are on VLAN 100 of its link (so
/// are the host's), named as iproute2 and ifupdown name it, `<link>.<id>`: bpffs refuses
/// dotted names, and the device's pins must not.
#[test]
fn a_vlan_uplink_carries_pods_masquerade_and_host_ports() {
    if kernel_makes(&["vlan"]) {
        uplink_serves_the_dataplane(ExternalHost::builder("up0.100", 52).vlan(100));
    }
}

/// The uplink's name holds dots (`eth0.100`, `flannel.1`, `bond0.200` are everyday names,
/// and bpffs refuses them): it gets the device program, pinned under its escaped name, and
/// carries host ports and masquerade; runs on every kernel.
#[test]
fn a_dotted_uplink_name_carries_pods_masquerade_and_host_ports() {
    uplink_serves_the_dataplane(ExternalHost::builder("eth0.100", 55));
}

/// An uplink that is not a plain link: VLAN 100 on an 802.3ad bond, on both ends.
#[test]
fn a_vlan_on_a_bond_uplink_carries_pods_masquerade_and_host_ports() {
    if kernel_makes(&["bond", "vlan"]) {
        uplink_serves_the_dataplane(ExternalHost::builder("up0", 53).bond().vlan(100));
    }
}

/// An uplink that is not a plain link: the node's addresses are on a bridge whose port is
/// its link (as on nodes that also bridge virtual machines); runs on every kernel.
#[test]
fn a_bridge_uplink_carries_pods_masquerade_and_host_ports() {
    uplink_serves_the_dataplane(ExternalHost::builder("up0", 54).bridge());
}
