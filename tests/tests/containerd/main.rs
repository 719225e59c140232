//! End to end with a real runtime: a private containerd 1.6 runs a pod through its CRI API,
//! as kubelet would, with ebpf-cni as its CNI network.
//!
//! The pod asks for hostPort 8080 → containerPort 80 and for 10 Mbit/s each way through
//! the `kubernetes.io/{ingress,egress}-bandwidth` annotations; its container serves HTTP
//! with busybox `httpd`. The test checks what containerd really sent the plugin
//! (Capitalized `runtimeConfig` keys, the "no burst" value), that the pod is reached through
//! its host port from the node itself, from a host outside the node and from another pod,
//! that UDP in both directions is held to the limit, and that after StopPodSandbox and
//! RemovePodSandbox — which make containerd call DEL several times, the later ones without
//! a netns — every DEL succeeded and nothing is left on the node: no veth, no lease, no pin.
//!
//! containerd runs inside the test's node namespace (see `daemon.rs`); the machine's own
//! network namespace and directories are never touched.

mod cri;
mod daemon;
mod image;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ebpf_cni_tests::config::{self, Stack};
use ebpf_cni_tests::external::ExternalHost;
use ebpf_cni_tests::fsutil;
use ebpf_cni_tests::rate;
use ebpf_cni_tests::{
    ebpf_cni_bin, kernel, require_root, unique_container_id, Attachment, CniRuntime, NetConfList,
    Netns, Node,
};
use serde_json::{json, Value};

use cri::v1;
use daemon::{CgroupParent, Containerd, PluginCall};

const NETWORK: &str = "ctrdnet";
const IMAGE: &str = "ecni.test/busybox:1";
const HOST_PORT: u16 = 8080;
const CONTAINER_PORT: u16 = 80;
/// The pod's annotations ask for this much each way ...
const LIMIT_ANNOTATION: &str = "10M";
/// ... which Kubernetes' quantity parsing makes this many bit/s.
const LIMIT_BPS: u64 = 10_000_000;
/// What containerd sends as the burst when a pod sets none (u32::MAX bits).
const NO_BURST: u64 = 4_294_967_295;
const HTTP_DEADLINE: Duration = Duration::from_secs(15);

/// One containerd at a time: on two cores a second daemon starting pods (and the plugin
/// verifying its programs) took enough CPU from the first test's measured streams to put
/// a limited rate outside its band in one CI run.
fn one_containerd_at_a_time() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn containerd_cri_pod_gets_host_port_and_bandwidth_and_leaves_nothing() {
    require_root();
    let _alone = one_containerd_at_a_time();
    let started = Instant::now();
    let plugin = ebpf_cni_bin();
    // Declared in reverse order of teardown: containerd (and with it every process and
    // mount it made) goes first, then the cgroups runc left, the external host, the node.
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "uplink0", 41).unwrap();
    let cgroups = CgroupParent::new();

    let mut conf = config::standard("1.0.0", NETWORK, "ebpf-cni", node.data_dir(), Stack::Dual);
    conf["capabilities"] = json!({"portMappings": true, "bandwidth": true});
    let list = NetConfList::single(&conf);
    let ctrd = Containerd::start(&node, &plugin, &list.to_value(), IMAGE).unwrap();
    let tar = image::busybox_image(&ctrd.dir().join("image"), IMAGE).unwrap();
    ctrd.import_image(&tar).unwrap();
    let mut cri = ctrd.cri().unwrap();
    let version = cri.version().unwrap();
    assert_eq!(version.runtime_name, "containerd", "{version:?}");
    eprintln!(
        "containerd {} (CRI {}) up after {:.1} s",
        version.runtime_version,
        version.runtime_api_version,
        started.elapsed().as_secs_f64()
    );

    // --- the pod, as kubelet asks for it ---
    let sandbox_config = v1::PodSandboxConfig {
        metadata: Some(v1::PodSandboxMetadata {
            name: "web".into(),
            uid: unique_container_id()[..32].to_owned(),
            namespace: "ecni-test".into(),
            attempt: 0,
        }),
        hostname: "web".into(),
        log_directory: ctrd.dir().join("pod-logs").to_string_lossy().into_owned(),
        port_mappings: vec![v1::PortMapping {
            protocol: v1::PROTOCOL_TCP,
            container_port: CONTAINER_PORT.into(),
            host_port: HOST_PORT.into(),
            host_ip: String::new(),
        }],
        annotations: cri::string_map(&[
            ("kubernetes.io/ingress-bandwidth", LIMIT_ANNOTATION),
            ("kubernetes.io/egress-bandwidth", LIMIT_ANNOTATION),
        ]),
        linux: Some(v1::LinuxPodSandboxConfig {
            cgroup_parent: cgroups.name().to_owned(),
        }),
        ..Default::default()
    };
    let t = Instant::now();
    let sandbox = cri.run_pod_sandbox(&sandbox_config).unwrap_or_else(|e| {
        panic!(
            "RunPodSandbox: {e:#}\nplugin calls: {:#?}",
            ctrd.plugin_calls()
        )
    });
    eprintln!(
        "RunPodSandbox took {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );

    let status = cri.pod_sandbox_status(&sandbox).unwrap();
    let st = status.status.as_ref().expect("sandbox status");
    assert_eq!(st.state, v1::SANDBOX_READY, "{st:?}");
    let net = st.network.as_ref().expect("sandbox network status");
    let mut pod_ips: Vec<IpAddr> = std::iter::once(&net.ip)
        .chain(net.additional_ips.iter().map(|i| &i.ip))
        .map(|s| s.parse().unwrap_or_else(|e| panic!("pod IP {s:?}: {e}")))
        .collect();
    pod_ips.sort();
    let pod_v4 = *pod_ips
        .iter()
        .find(|i| i.is_ipv4())
        .expect("an IPv4 pod IP");
    assert!(
        pod_ips.iter().any(IpAddr::is_ipv6),
        "dual-stack network, but CRI reports {pod_ips:?}"
    );
    let info: Value = serde_json::from_str(status.info.get("info").expect("verbose info"))
        .expect("verbose info is JSON");
    let netns_path = sandbox_netns_path(&info);
    let pod_netns = ctrd.path_in_mount_ns(&netns_path);
    assert!(
        pod_netns.exists(),
        "the sandbox netns {netns_path} is not in containerd's mount namespace"
    );

    // What containerd sent: one ADD for the sandbox, in its netns, with containerd's
    // Capitalized runtimeConfig keys and the "no burst" value.
    let calls = ctrd.plugin_calls();
    let adds: Vec<&PluginCall> = calls_for(&calls, &sandbox, "ADD");
    assert_eq!(adds.len(), 1, "ADD calls for the sandbox: {adds:#?}");
    let add = adds[0];
    assert_eq!(add.exit_code, 0, "ADD failed: {add:#?}");
    assert_eq!(add.netns, netns_path, "{add:#?}");
    assert_eq!(add.ifname, "eth0");
    let rc = &add.stdin["runtimeConfig"];
    assert_eq!(
        rc["portMappings"],
        json!([{"HostPort": HOST_PORT, "ContainerPort": CONTAINER_PORT,
                "Protocol": "tcp", "HostIP": ""}]),
        "portMappings as containerd sent them: {}",
        add.stdin
    );
    assert_eq!(
        rc["bandwidth"],
        json!({"IngressRate": LIMIT_BPS, "IngressBurst": NO_BURST,
               "EgressRate": LIMIT_BPS, "EgressBurst": NO_BURST}),
        "bandwidth as containerd sent it: {}",
        add.stdin
    );

    // The node's record of the pod: one lease per family, held by the sandbox, and the
    // host end of the veth.
    let leases = node.leases(NETWORK);
    let leased: Vec<IpAddr> = leases.iter().map(|l| l.ip).collect();
    assert_eq!(leased, pod_ips, "leases {leases:?}");
    assert!(
        leases
            .iter()
            .all(|l| l.container_id == sandbox && l.ifname.as_deref() == Some("eth0")),
        "{leases:?}"
    );
    let base_links: BTreeSet<String> = ["lo", "uplink0"].map(String::from).into();
    let host_veths: Vec<String> = node_links(&node).difference(&base_links).cloned().collect();
    assert!(
        host_veths.len() == 1 && host_veths[0].starts_with("ecni"),
        "the node's links besides lo and uplink0: {host_veths:?}"
    );
    let attachment_pins = node.attachment_pin_dir(NETWORK, &sandbox, "eth0");
    assert!(
        !fsutil::list_files(&attachment_pins).unwrap().is_empty(),
        "ADD pinned nothing under {}",
        attachment_pins.display()
    );

    // --- the server container ---
    let container_config = v1::ContainerConfig {
        metadata: Some(v1::ContainerMetadata {
            name: "httpd".into(),
            attempt: 0,
        }),
        image: Some(v1::ImageSpec {
            image: IMAGE.into(),
        }),
        command: ["/bin/busybox", "httpd", "-f", "-p", "80", "-h", "/www"]
            .map(String::from)
            .into(),
        log_path: "httpd.log".into(),
        ..Default::default()
    };
    let container = cri
        .create_container(&sandbox, &container_config, &sandbox_config)
        .unwrap();
    cri.start_container(&container).unwrap();
    let cs = cri.container_status(&container).unwrap();
    assert_eq!(cs.state, v1::CONTAINER_RUNNING, "{cs:?}");

    // --- another pod on the node, added the harness's way through the same plugin ---
    let other_ns = node.new_pod().unwrap();
    let other_att = Attachment::new(&unique_container_id(), other_ns.path(), "eth0");
    let harness = CniRuntime::new(vec![ctrd.dir().join("cni-bin")]);
    let other_result = harness
        .add(&node, &list, &other_att)
        .unwrap_or_else(|e| panic!("ADD of the second pod: {e}"));

    // --- the host port, from everywhere ---
    let node4: IpAddr = ext.node_v4.into();
    let node6: IpAddr = ext.node_v6.into();
    let paths: Vec<(&str, &Netns, SocketAddr)> = vec![
        (
            "node -> 127.0.0.1",
            node.netns(),
            sa(Ipv4Addr::LOCALHOST, HOST_PORT),
        ),
        (
            "node -> [::1]",
            node.netns(),
            sa(Ipv6Addr::LOCALHOST, HOST_PORT),
        ),
        ("node -> node IPv4", node.netns(), sa(node4, HOST_PORT)),
        ("node -> node IPv6", node.netns(), sa(node6, HOST_PORT)),
        ("external -> node IPv4", ext.netns(), sa(node4, HOST_PORT)),
        ("external -> node IPv6", ext.netns(), sa(node6, HOST_PORT)),
        ("other pod -> node IPv4", &other_ns, sa(node4, HOST_PORT)),
        ("other pod -> node IPv6", &other_ns, sa(node6, HOST_PORT)),
        ("other pod -> pod IP", &other_ns, sa(pod_v4, CONTAINER_PORT)),
    ];
    let mut failures = Vec::new();
    for (what, from, target) in &paths {
        match http_get(from, *target) {
            Ok(body) if body == image::INDEX_BODY => {}
            Ok(body) => failures.push(format!("{what} ({target}): unexpected body {body:?}")),
            Err(e) => failures.push(format!("{what} ({target}): {e:#}")),
        }
    }
    assert!(
        failures.is_empty(),
        "HTTP to the containerd pod failed:\n{}\ncontainerd log:\n{}",
        failures.join("\n"),
        ctrd.log_text()
    );

    // --- the annotations' limits: UDP at twice the limit gets about the limit through,
    // each way (generous tolerance; the benchmark measures precisely) ---
    let pod_exec = vec![
        "nsenter".to_owned(),
        format!("--net={}", pod_netns.display()),
        "--".to_owned(),
    ];
    let ext4: IpAddr = ext.v4.into();
    let limit = LIMIT_BPS as f64;
    let egress = iperf(&pod_exec, ext.netns(), ext4, &["-u", "-b", "20M"]);
    let ingress = iperf(&pod_exec, ext.netns(), ext4, &["-u", "-b", "20M", "-R"]);
    eprintln!("UDP at 2x the limit: egress {egress:.0} bit/s, ingress {ingress:.0} bit/s");
    for (what, rate) in [("egress", egress), ("ingress", ingress)] {
        assert!(
            (0.75 * limit..=1.25 * limit).contains(&rate),
            "UDP {what} of the pod at twice its {LIMIT_ANNOTATION} annotation: {rate:.0} bit/s"
        );
    }
    // The other pod has no limit: the limit is the annotated pod's, not the node's.
    let other_exec = vec![
        "nsenter".to_owned(),
        format!("--net={}", other_ns.path().display()),
        "--".to_owned(),
    ];
    let free = iperf(&other_exec, ext.netns(), ext4, &[]);
    assert!(
        free > 5.0 * limit,
        "TCP from the pod without annotations: {free:.0} bit/s"
    );

    // --- teardown, as kubelet does it ---
    harness
        .del(&node, &list, &other_att, Some(&other_result))
        .unwrap_or_else(|e| panic!("DEL of the second pod: {e}"));
    drop(other_ns);
    let t = Instant::now();
    cri.stop_pod_sandbox(&sandbox)
        .unwrap_or_else(|e| panic!("StopPodSandbox: {e:#}\n{}", ctrd.log_text()));
    // kubelet stops again before removing; the second stop must be a no-op success too.
    cri.stop_pod_sandbox(&sandbox)
        .unwrap_or_else(|e| panic!("second StopPodSandbox: {e:#}\n{}", ctrd.log_text()));
    cri.remove_pod_sandbox(&sandbox)
        .unwrap_or_else(|e| panic!("RemovePodSandbox: {e:#}\n{}", ctrd.log_text()));
    eprintln!(
        "Stop, Stop, RemovePodSandbox took {:.0} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    assert!(cri.list_pod_sandboxes().unwrap().is_empty());

    let calls = ctrd.plugin_calls();
    let dels = calls_for(&calls, &sandbox, "DEL");
    eprintln!(
        "containerd's DELs for the sandbox, CNI_NETNS of each: {:?}",
        dels.iter().map(|c| c.netns.as_str()).collect::<Vec<_>>()
    );
    assert!(
        dels.len() >= 2,
        "containerd DELs on every stop and on remove; saw {dels:#?}"
    );
    for del in &dels {
        assert_eq!(del.exit_code, 0, "a DEL failed: {del:#?}");
        assert!(del.stdout.trim().is_empty(), "DEL printed: {del:#?}");
    }
    assert!(
        dels.iter().any(|d| d.netns.is_empty()),
        "a DEL after the sandbox's netns is gone comes with an empty CNI_NETNS: {dels:#?}"
    );
    let failed: Vec<&PluginCall> = calls.iter().filter(|c| c.exit_code != 0).collect();
    assert!(failed.is_empty(), "failed plugin calls: {failed:#?}");
    let errors = ctrd.error_lines();
    assert!(
        errors.is_empty(),
        "containerd logged errors:\n{}",
        errors.join("\n")
    );

    // Nothing left on the node.
    assert_eq!(node_links(&node), base_links, "links left in the node");
    assert_eq!(node.leases(NETWORK), vec![], "leases left");
    assert_eq!(
        node.pinned_files(),
        Vec::<PathBuf>::new(),
        "pins left under {}",
        node.pin_root().display()
    );
    assert!(
        !pod_netns.exists(),
        "containerd left the sandbox netns {netns_path}"
    );
    eprintln!("test body took {:.1} s", started.elapsed().as_secs_f64());
}

/// containerd's default network (`10-containerd-net.conflist`, as containerd ships it) with
/// `"type": "ebpf-cni"` in place of `bridge` — its `bridge`, `isGateway` and `promiscMode`
/// keys are ignored, its `ipMasq: true` is honoured — and the reference `portmap` after it:
/// a pod reaches, by IP address, a host outside the node that has no route to the pod
/// network, which sees the node's address; the sandbox then goes without leaving anything.
#[test]
fn containerd_default_conflist_with_ebpf_cni_masquerades_pods() {
    require_root();
    let _alone = one_containerd_at_a_time();
    let plugin = ebpf_cni_bin();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "uplink0", 43).unwrap();
    ext.netns()
        .ip_ok(&["-4", "route", "del", "default"])
        .unwrap();
    let cgroups = CgroupParent::new();
    let conflist = json!({
        "cniVersion": "1.0.0",
        "name": "containerd-net",
        "plugins": [
            {
                "type": "ebpf-cni",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": true,
                "promiscMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [
                        [{"subnet": "10.88.0.0/16"}],
                        [{"subnet": "2001:4860:4860::/64"}]
                    ],
                    "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
                    // The test's own lease directory (containerd's file has none).
                    "dataDir": node.data_dir().to_string_lossy()
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    });
    let ctrd = Containerd::start(&node, &plugin, &conflist, IMAGE).unwrap();
    let tar = image::busybox_image(&ctrd.dir().join("image"), IMAGE).unwrap();
    ctrd.import_image(&tar).unwrap();
    let mut cri = ctrd.cri().unwrap();
    let sandbox_config = v1::PodSandboxConfig {
        metadata: Some(v1::PodSandboxMetadata {
            name: "client".into(),
            uid: unique_container_id()[..32].to_owned(),
            namespace: "ecni-test".into(),
            attempt: 0,
        }),
        hostname: "client".into(),
        log_directory: ctrd.dir().join("pod-logs").to_string_lossy().into_owned(),
        linux: Some(v1::LinuxPodSandboxConfig {
            cgroup_parent: cgroups.name().to_owned(),
        }),
        ..Default::default()
    };
    let sandbox = cri.run_pod_sandbox(&sandbox_config).unwrap_or_else(|e| {
        panic!(
            "RunPodSandbox: {e:#}\nplugin calls: {:#?}",
            ctrd.plugin_calls()
        )
    });
    let status = cri.pod_sandbox_status(&sandbox).unwrap();
    let info: Value = serde_json::from_str(status.info.get("info").expect("verbose info"))
        .expect("verbose info is JSON");
    let netns_path = sandbox_netns_path(&info);
    let pod_netns = ctrd.path_in_mount_ns(&netns_path);

    // The host outside: a TCP server that reports who connected.
    let server = SocketAddr::new(IpAddr::V4(ext.v4), 7100);
    let listener = ext
        .netns()
        .run_in(|| std::net::TcpListener::bind(server))
        .unwrap()
        .unwrap();
    let accepted = std::thread::spawn(move || {
        let (mut s, peer) = listener.accept().unwrap();
        let mut b = [0u8; 5];
        s.read_exact(&mut b).unwrap();
        s.write_all(&b).unwrap();
        peer
    });
    let echoed = std::thread::scope(|sc| {
        sc.spawn(|| -> Result<[u8; 5]> {
            let ns = std::fs::File::open(&pod_netns)?;
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)?;
            let mut c = TcpStream::connect_timeout(&server, Duration::from_secs(5))?;
            c.set_read_timeout(Some(Duration::from_secs(5)))?;
            c.write_all(b"hello")?;
            let mut b = [0u8; 5];
            c.read_exact(&mut b)?;
            Ok(b)
        })
        .join()
        .expect("the client thread")
    });
    assert_eq!(
        &echoed.unwrap_or_else(|e| panic!("the pod's connection to {server}: {e:#}")),
        b"hello"
    );
    let peer = accepted.join().unwrap();
    assert_eq!(
        peer.ip(),
        IpAddr::V4(ext.node_v4),
        "the outside host saw the node's address"
    );

    cri.stop_pod_sandbox(&sandbox)
        .unwrap_or_else(|e| panic!("StopPodSandbox: {e:#}\n{}", ctrd.log_text()));
    cri.remove_pod_sandbox(&sandbox)
        .unwrap_or_else(|e| panic!("RemovePodSandbox: {e:#}\n{}", ctrd.log_text()));
    let calls = ctrd.plugin_calls();
    let failed: Vec<&PluginCall> = calls.iter().filter(|c| c.exit_code != 0).collect();
    assert!(failed.is_empty(), "failed plugin calls: {failed:#?}");
    assert_eq!(node.leases("containerd-net"), vec![], "leases left");
    assert_eq!(
        node.pinned_files(),
        Vec::<PathBuf>::new(),
        "pins left under {}",
        node.pin_root().display()
    );
}

/// The sandbox's network namespace path from CRI's verbose status
/// (`info.runtimeSpec.linux.namespaces[type=network].path`).
fn sandbox_netns_path(info: &Value) -> String {
    info["runtimeSpec"]["linux"]["namespaces"]
        .as_array()
        .and_then(|nss| {
            nss.iter()
                .find(|n| n["type"] == "network")
                .and_then(|n| n["path"].as_str())
        })
        .unwrap_or_else(|| panic!("no network namespace path in the verbose status: {info}"))
        .to_owned()
}

fn calls_for<'a>(
    calls: &'a [PluginCall],
    container_id: &str,
    command: &str,
) -> Vec<&'a PluginCall> {
    calls
        .iter()
        .filter(|c| c.container_id == container_id && c.command == command)
        .collect()
}

fn node_links(node: &Node) -> BTreeSet<String> {
    kernel::links(node.netns())
        .unwrap()
        .into_iter()
        .map(|l| l.ifname)
        .collect()
}

fn sa(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

/// `GET /` over HTTP/1.0 from a thread in `from`; the body when the answer is 200. Retried
/// until [`HTTP_DEADLINE`]: httpd starts listening a moment after StartContainer returns.
fn http_get(from: &Netns, target: SocketAddr) -> Result<String> {
    from.run_in(|| {
        let deadline = Instant::now() + HTTP_DEADLINE;
        loop {
            match http_get_once(target) {
                Ok(body) => return Ok(body),
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    })?
}

fn http_get_once(target: SocketAddr) -> Result<String> {
    let timeout = Duration::from_secs(3);
    let mut c = TcpStream::connect_timeout(&target, timeout).context("connect")?;
    c.set_read_timeout(Some(timeout))?;
    c.write_all(b"GET / HTTP/1.0\r\nHost: pod\r\n\r\n")?;
    let mut answer = String::new();
    c.read_to_string(&mut answer).context("read")?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .with_context(|| format!("not HTTP: {answer:?}"))?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        bail!("answer: {head:?}");
    }
    Ok(body.to_owned())
}

/// One iperf3 test: a one-off server in `server` on `addr`, the client run under the
/// `client` command prefix (nsenter into a namespace); what the receiver got, in bit/s.
fn iperf(client: &[String], server: &Netns, addr: IpAddr, extra: &[&str]) -> f64 {
    let _one_at_a_time = rate::measuring();
    let port = rate::next_port();
    rate::iperf_server(server, addr, port);
    let (a, p) = (addr.to_string(), port.to_string());
    let out = Command::new(&client[0])
        .args(&client[1..])
        .args(["iperf3", "-c", &a, "-p", &p, "-t", "3", "-J"])
        .args(extra)
        .output()
        .unwrap();
    rate::parse_report(&out, extra)
}
