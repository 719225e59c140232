//! A node's life after ADD (issue 24): what happens to a node's pods, leases and host
//! ports when nothing the runtime does is the textbook sequence.
//!
//! - A hard reboot: the runtime never DELs the pods it lost. The first ADD of the new boot
//!   reclaims the network's leases whose attachment is gone, and only ebpf-cni's (the boot
//!   is simulated: the test hook `EBPF_CNI_BOOT_ID_FILE` stands for
//!   `/proc/sys/kernel/random/boot_id`, and the node's pin tree is emptied as a reboot
//!   empties bpffs).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use ebpf_cni_tests::config::NETWORK;
use ebpf_cni_tests::fsutil;
use ebpf_cni_tests::{
    require_root, unique_container_id, CniCommand, ContainerEnv, Netns, Node, PluginUnderTest,
    Stack, REFERENCE_HOST_LOCAL,
};
use serde_json::Value;

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

    /// The addresses leased in the network (anyone's).
    fn leased(&self) -> BTreeSet<IpAddr> {
        self.node
            .leases(NETWORK)
            .into_iter()
            .map(|l| l.ip)
            .collect()
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

/// Issue 24, item 2: after a (simulated) reboot, the first ADD reclaims this network's leases
/// of pods that are gone (no attachment: no host veth, no pins), logging each; it keeps the
/// lease of a pod still attached (its veth is there) and another plugin's lease in the same
/// directory (the reference host-local's: no record of ours). Later ADDs of that boot
/// reclaim nothing.
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
