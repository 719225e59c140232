//! `ebpf-cni install` and `uninstall` on the real binary, as a DaemonSet's init container
//! runs them: temporary directories stand for the host's CNI bin and conf dirs (the
//! machine's /opt/cni and /etc/cni are never touched), a stand-in HTTPS server for the
//! Kubernetes API serves the Node object, and pods run in test-made namespaces with the
//! conflist install wrote.
//!
//! What is checked: the binary and then the conflist in place, and a pod added, checked and
//! deleted with them; a second install changing nothing (content, inode, mtime); install
//! replacing a binary a process is running; other plugins' files untouched; uninstall
//! returning the directories to their first state and keeping what it did not write;
//! settings that are missing or invalid failing by name before anything is written; the
//! pod subnets read from the Node object, and each way that can fail named; `--purge`
//! refusing while a pod is attached and removing the node's pins when none is; install and
//! `ebpf-cni layout` leaving the binary in the page cache in 2 MiB folios (where the kernel
//! and the filesystem, this machine's ext4 on 6.18, give a file large folios; the suite
//! runs on the host only).

mod host;
mod kube_api;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ebpf_cni_tests::config::{self, Stack, NETWORK};
use ebpf_cni_tests::state::{assert_attachment, assert_gone};
use ebpf_cni_tests::{
    ebpf_cni_bin, fsutil, require_root, unique_container_id, Attachment, NetConfList, Node,
    PluginUnderTest, ResultExpectation,
};
use host::{pages_in_2mib_folios, run, strings, Host, Run};
use kube_api::{node, Answer, Ca, KubeApi};
use serde_json::{json, Value};

/// The subnets the harness's expectations know (gateways .1 and ::1).
fn subnet_args() -> Vec<String> {
    strings(&[
        "--pod-subnet",
        &format!("{},{}", config::V4_SUBNET, config::V6_SUBNET),
        "--network",
        NETWORK,
        "--mtu",
        &config::MTU.to_string(),
    ])
}

fn install(host: &Host, more: &[String]) -> Run {
    let mut args = strings(&["install"]);
    args.extend(host.dir_args());
    args.extend_from_slice(more);
    run(&ebpf_cni_bin(), &args, &[])
}

fn uninstall(host: &Host, more: &[&str]) -> Run {
    let mut args = strings(&["uninstall"]);
    args.extend(host.dir_args());
    args.extend(strings(more));
    run(&ebpf_cni_bin(), &args, &[])
}

/// The conflist as the test runs it: the IPAM leases in the node's scratch directory
/// instead of the machine's /var/lib/cni/networks (the one key the test changes).
fn runnable(conflist: &Value, node: &Node) -> NetConfList {
    let mut v = conflist.clone();
    v["plugins"][0]["ipam"]["dataDir"] = json!(node.data_dir().to_string_lossy());
    NetConfList::from_value(&v).expect("the installed conflist is a conflist")
}

fn expectation(pod: &Path) -> ResultExpectation {
    let mut e = ResultExpectation::standard("1.0.0", "eth0", &pod.to_string_lossy(), Stack::Dual)
        .ebpf_cni_host_names();
    // The conflist install writes has no dns (kubelet writes the pods' resolv.conf).
    e.dns = None;
    e
}

/// The binary goes in before the conflist, both in place with their modes, and a runtime
/// using them (CNI_PATH = the bin dir) adds, checks and deletes a pod.
#[test]
fn install_puts_the_binary_then_a_conflist_the_plugin_runs_pods_with() {
    require_root();
    let host = Host::new();
    let out = install(&host, &subnet_args());
    out.assert_ok();
    assert!(
        out.stdout
            .contains(&format!("{}: installed", host.binary().display()))
            && out
                .stdout
                .contains(&format!("{}: written", host.conflist().display())),
        "{}",
        out.stdout
    );
    assert_eq!(
        std::fs::read(host.binary()).unwrap(),
        std::fs::read(ebpf_cni_bin()).unwrap(),
        "the binary is the running one"
    );
    // Read back in 2 MiB folios (a file just written sits in smaller ones).
    assert!(out.stdout.contains("in 2 MiB folios"), "{}", out.stdout);
    let in_2mib = pages_in_2mib_folios(&host.binary());
    assert!(in_2mib >= 1024, "{in_2mib} pages in 2 MiB folios");
    let snap = host.snapshot();
    assert_eq!(snap.names(), ["bin/ebpf-cni", "conf/10-ebpf-cni.conflist"]);
    let bin = &snap.0[Path::new("bin/ebpf-cni")];
    let list = &snap.0[Path::new("conf/10-ebpf-cni.conflist")];
    assert_eq!((bin.mode & 0o7777, list.mode & 0o7777), (0o755, 0o644));
    // A runtime that sees the conflist must find the binary: it was written first.
    assert!(
        bin.mtime < list.mtime,
        "the binary ({:?}) is written before the conflist ({:?})",
        bin.mtime,
        list.mtime
    );
    let conflist = host.conflist_json();
    assert_eq!(
        conflist,
        json!({
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "installedBy": "ebpf-cni install",
            "plugins": [{
                "type": "ebpf-cni",
                "mtu": config::MTU,
                "capabilities": { "portMappings": true, "bandwidth": true },
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": config::V4_SUBNET }], [{ "subnet": config::V6_SUBNET }]],
                    "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]
                }
            }]
        })
    );

    let p = PluginUnderTest::at(host.binary());
    let node = Node::new().unwrap();
    let pod = node.new_pod().unwrap();
    let list = runnable(&conflist, &node);
    let cid = unique_container_id();
    let att = Attachment::new(&cid, pod.path(), "eth0");
    let res = p
        .runtime
        .add(&node, &list, &att)
        .unwrap_or_else(|e| panic!("ADD with the installed conflist: {e}"));
    let r = expectation(pod.path()).assert_valid(&res);
    assert_attachment(&node, &pod, "eth0", &r, Some(config::MTU));
    p.runtime
        .check(&node, &list, &att, &res)
        .unwrap_or_else(|e| panic!("CHECK: {e}"));
    p.runtime
        .del(&node, &list, &att, Some(&res))
        .unwrap_or_else(|e| panic!("DEL: {e}"));
    assert_gone(&node, Some(&pod), "eth0", &r, NETWORK, &cid, "DEL");
}

/// Install run again with the same settings touches nothing: same content, same inode,
/// same mtime for both files.
#[test]
fn a_second_install_changes_nothing() {
    let host = Host::new();
    install(&host, &subnet_args()).assert_ok();
    let first = host.snapshot();
    // Past the filesystem's timestamp granularity, so a rewrite would show.
    std::thread::sleep(Duration::from_millis(20));
    let out = install(&host, &subnet_args());
    out.assert_ok();
    assert_eq!(host.snapshot(), first);
    assert_eq!(
        out.stdout.matches(": unchanged").count(),
        2,
        "{}",
        out.stdout
    );
}

/// A runtime executing the old binary while install runs (a pod's ADD) costs nothing: the
/// new binary is renamed over the old name, the running process keeps its old file.
/// Writing into the old file instead fails with ETXTBSY ("text file busy").
#[test]
fn install_replaces_a_binary_a_process_is_running() {
    let host = Host::new();
    // An older build: the binary with bytes appended (still an ELF that runs).
    let mut old = std::fs::read(ebpf_cni_bin()).unwrap();
    old.extend_from_slice(b"\0an older build");
    std::fs::write(host.binary(), &old).unwrap();
    std::fs::set_permissions(host.binary(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut old_build = Command::new(host.binary());
    old_build
        .args(["metrics", "--listen", "127.0.0.1:0"])
        .env_clear()
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut running = spawn_fresh_executable(&mut old_build);
    let mut line = String::new();
    BufReader::new(running.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("serving the metrics"), "{line}");

    let out = install(&host, &subnet_args());
    let still_running = running.try_wait().unwrap().is_none();
    let exe = std::fs::read_link(format!("/proc/{}/exe", running.id())).ok();
    let _ = running.kill();
    let _ = running.wait();
    out.assert_ok();
    assert!(still_running, "the old binary's process was disturbed");
    assert!(
        exe.is_some_and(|e| e.to_string_lossy().ends_with(" (deleted)")),
        "the running process keeps its own, now unlinked, file"
    );
    assert_eq!(
        std::fs::read(host.binary()).unwrap(),
        std::fs::read(ebpf_cni_bin()).unwrap()
    );
    let left: Vec<_> = std::fs::read_dir(host.bin_dir()).unwrap().collect();
    assert_eq!(left.len(), 1, "no temporary file is left");
}

/// Other plugins' binaries and configurations (and a file sorting right beside ours) keep
/// their inode, content and mtime through install and uninstall: install writes only its
/// own conflist, never renames or removes another (multus#972).
#[test]
fn other_plugins_files_are_left_untouched() {
    let host = Host::new();
    let others = [
        (
            "conf/05-bridge.conflist",
            r#"{"cniVersion":"1.0.0","name":"br","plugins":[{"type":"bridge"}]}"#,
        ),
        ("conf/10-ebpf-cni.conflist.bak", "an operator's copy"),
        (
            "conf/99-loopback.conf",
            r#"{"cniVersion":"1.0.0","name":"lo","type":"loopback"}"#,
        ),
        ("bin/bridge", "#!/bin/sh\n"),
        ("bin/ebpf-cni.old", "#!/bin/sh\n"),
    ];
    for (path, text) in others {
        std::fs::write(host.path().join(path), text).unwrap();
    }
    let before = host.snapshot();
    std::thread::sleep(Duration::from_millis(20));
    install(&host, &subnet_args()).assert_ok();
    let during = host.snapshot();
    for (path, state) in &before.0 {
        assert_eq!(
            during.0.get(path),
            Some(state),
            "{} changed",
            path.display()
        );
    }
    assert_eq!(during.0.len(), before.0.len() + 2);
    uninstall(&host, &[]).assert_ok();
    assert_eq!(host.snapshot(), before);
}

/// Install then uninstall leaves the directories as they were: the same listing, and each
/// file the same (content, mode, inode, mtime).
#[test]
fn uninstall_returns_the_directories_to_their_first_state() {
    let host = Host::new();
    std::fs::write(host.conf_dir().join("20-other.conflist"), "{}").unwrap();
    std::fs::write(host.bin_dir().join("loopback"), "#!/bin/sh\n").unwrap();
    let first = host.snapshot();
    install(&host, &subnet_args()).assert_ok();
    assert_ne!(host.snapshot(), first);
    let out = uninstall(&host, &[]);
    out.assert_ok();
    assert_eq!(host.snapshot(), first);
    assert_eq!(out.stdout.matches(": removed").count(), 2, "{}", out.stdout);
    // Nothing left to remove: still a success.
    let again = uninstall(&host, &[]);
    again.assert_ok();
    assert_eq!(
        again.stdout.matches(": absent").count(),
        2,
        "{}",
        again.stdout
    );
}

/// Uninstall removes only what is its own: a conflist without install's marker, a binary
/// at the plugin's name that is not ebpf-cni, and an ebpf-cni binary another conflist
/// still names all stay; an ebpf-cni binary of another build (found by the marker every
/// build carries, not by being this one) goes.
#[test]
fn uninstall_keeps_what_it_did_not_write() {
    let host = Host::new();
    let hand_written = r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ebpf-cni"}]}"#;
    std::fs::write(host.conflist(), hand_written).unwrap();
    std::fs::copy("/bin/true", host.binary()).unwrap();
    let first = host.snapshot();
    let out = uninstall(&host, &[]);
    out.assert_ok();
    assert_eq!(host.snapshot(), first);
    assert!(
        out.stdout.contains("kept: not written by ebpf-cni install")
            && out.stdout.contains("kept: not an ebpf-cni binary"),
        "{}",
        out.stdout
    );

    // Another build of ebpf-cni, which the hand-written conflist still names.
    let mut other_build = std::fs::read(ebpf_cni_bin()).unwrap();
    other_build.extend_from_slice(b"\0another build");
    std::fs::write(host.binary(), &other_build).unwrap();
    let out = uninstall(&host, &[]);
    out.assert_ok();
    assert!(host.binary().exists());
    assert!(
        out.stdout
            .contains("10-ebpf-cni.conflist still names type ebpf-cni"),
        "{}",
        out.stdout
    );
    std::fs::remove_file(host.conflist()).unwrap();
    uninstall(&host, &[]).assert_ok();
    assert!(
        !host.binary().exists(),
        "another ebpf-cni build is ours to remove"
    );
}

/// Each missing or invalid setting fails with exit code 2, naming its flag, its variable
/// and the value, and nothing is written: every setting is checked first, the conflist's
/// cniVersion included, although the binary would be written before it.
#[test]
fn a_missing_or_invalid_setting_fails_naming_it_and_writes_nothing() {
    let host = Host::new();
    let subnet = format!("--pod-subnet={}", config::V4_SUBNET);
    /// Arguments, environment, and what stderr must say.
    type Case<'a> = (Vec<String>, Vec<(&'a str, String)>, &'a [&'a str]);
    let cases: Vec<Case> = vec![
        (
            strings(&["--mtu", "10", &subnet]),
            vec![],
            &["--mtu (EBPF_CNI_MTU) \"10\"", "68 to 65535"],
        ),
        (
            strings(&[&subnet]),
            vec![("EBPF_CNI_MTU", "jumbo".into())],
            &["--mtu (EBPF_CNI_MTU) \"jumbo\""],
        ),
        (
            vec![],
            vec![("EBPF_CNI_POD_SUBNETS", "10.0.0.0/33".into())],
            &[
                "--pod-subnet (EBPF_CNI_POD_SUBNETS) \"10.0.0.0/33\"",
                "expected a CIDR",
            ],
        ),
        (
            strings(&["--pod-subnet", "10.0.0.0/24", "--pod-subnet", "10.1.0.0/24"]),
            vec![],
            &["--pod-subnet (EBPF_CNI_POD_SUBNETS) gives two IPv4 subnets"],
        ),
        (
            strings(&[&subnet, "--capabilities", "portMappings,dns"]),
            vec![],
            &[
                "--capabilities (EBPF_CNI_CAPABILITIES) \"portMappings,dns\"",
                "\"dns\" is not one",
            ],
        ),
        (
            strings(&[&subnet]),
            vec![("EBPF_CNI_IP_MASQ", "yes".into())],
            &["--ip-masq (EBPF_CNI_IP_MASQ) \"yes\"", "true or false"],
        ),
        (
            strings(&[&subnet, "--network", "../etc"]),
            vec![],
            &["--network (EBPF_CNI_NETWORK) \"../etc\""],
        ),
        (
            strings(&[&subnet, "--cni-version", "9.9.9"]),
            vec![],
            &["--cni-version (EBPF_CNI_CNI_VERSION) \"9.9.9\"", "1.0.0"],
        ),
        (
            strings(&[&subnet, "--conflist-name", "ebpf.json"]),
            vec![],
            &["--conflist-name (EBPF_CNI_CONFLIST_NAME) \"ebpf.json\""],
        ),
        (
            strings(&[&subnet, "--source", "/nonexistent/ebpf-cni"]),
            vec![],
            &["--source (EBPF_CNI_SOURCE) \"/nonexistent/ebpf-cni\" cannot be read"],
        ),
        // No subnet: the Node object's, which needs the node's name and the API server.
        (
            vec![],
            vec![],
            &[
                "--node-name (NODE_NAME) is not set",
                "--pod-subnet (EBPF_CNI_POD_SUBNETS)",
            ],
        ),
        (
            vec![],
            vec![("NODE_NAME", "Node_1".into())],
            &["--node-name (NODE_NAME) \"Node_1\" is invalid"],
        ),
        (
            vec![],
            vec![("NODE_NAME", "n1".into())],
            &["--kube-host (KUBERNETES_SERVICE_HOST) is not set"],
        ),
        (
            vec![],
            vec![
                ("NODE_NAME", "n1".into()),
                ("KUBERNETES_SERVICE_HOST", "10.96.0.1".into()),
                ("KUBERNETES_SERVICE_PORT", "https".into()),
            ],
            &["--kube-port (KUBERNETES_SERVICE_PORT) \"https\""],
        ),
        (
            vec![],
            vec![
                ("NODE_NAME", "n1".into()),
                ("KUBERNETES_SERVICE_HOST", "10.96.0.1".into()),
                ("KUBERNETES_SERVICE_PORT", "443".into()),
                ("EBPF_CNI_KUBE_TIMEOUT", "forever".into()),
            ],
            &["--kube-timeout (EBPF_CNI_KUBE_TIMEOUT) \"forever\""],
        ),
    ];
    let empty = host.snapshot();
    for (args, env, says) in cases {
        let mut all = strings(&["install"]);
        all.extend(host.dir_args());
        all.extend(args.clone());
        let out = run(&ebpf_cni_bin(), &all, &env);
        out.assert_failed(2);
        for s in says {
            assert!(
                out.stderr.contains(s),
                "{args:?} {env:?}: stderr does not say {s:?}: {}",
                out.stderr
            );
        }
        assert_eq!(host.snapshot(), empty, "{args:?} {env:?} wrote something");
    }
    // A directory that does not exist, by flag and by variable.
    let missing = host
        .path()
        .join("no-such-dir")
        .to_string_lossy()
        .into_owned();
    let out = run(
        &ebpf_cni_bin(),
        &strings(&["install", "--conf-dir", &missing, &subnet]),
        &[(
            "EBPF_CNI_BIN_DIR",
            host.bin_dir().to_string_lossy().into_owned(),
        )],
    );
    out.assert_failed(2);
    assert!(
        out.stderr.contains(&format!(
            "--conf-dir (EBPF_CNI_CONF_DIR) {missing:?} is not an existing directory"
        )),
        "{}",
        out.stderr
    );
    assert_eq!(host.snapshot(), empty);
}

/// The service account's files, the API server's address and the node's name, as kubelet
/// and the DaemonSet give them (environment only), for `api`.
fn in_cluster_env(
    host: &Host,
    api: &KubeApi,
    node_name: &str,
    ca_pem: &str,
) -> Vec<(&'static str, String)> {
    let token = host.path().join("sa/token");
    let ca = host.path().join("sa/ca.crt");
    std::fs::write(&token, "s3cr3t-token\n").unwrap();
    std::fs::write(&ca, ca_pem).unwrap();
    let s = |p: &Path| p.to_string_lossy().into_owned();
    vec![
        ("NODE_NAME", node_name.to_owned()),
        ("KUBERNETES_SERVICE_HOST", "127.0.0.1".to_owned()),
        ("KUBERNETES_SERVICE_PORT", api.port().to_string()),
        ("EBPF_CNI_KUBE_TOKEN_FILE", s(&token)),
        ("EBPF_CNI_KUBE_CA_FILE", s(&ca)),
        ("EBPF_CNI_BIN_DIR", s(&host.bin_dir())),
        ("EBPF_CNI_CONF_DIR", s(&host.conf_dir())),
        ("EBPF_CNI_KUBE_TIMEOUT", "2s".to_owned()),
    ]
}

fn install_in_cluster(env: &[(&str, String)]) -> Run {
    run(&ebpf_cni_bin(), &strings(&["install"]), env)
}

fn ranges(conflist: &Value) -> Vec<String> {
    conflist["plugins"][0]["ipam"]["ranges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|set| set[0]["subnet"].as_str().unwrap().to_owned())
        .collect()
}

/// With no subnet given, install asks the API server for its node (one GET, the token as a
/// bearer, the server verified against the CA) and writes spec.podCIDRs into the conflist.
#[test]
fn pod_subnets_come_from_the_node_object() {
    let host = Host::new();
    let api = KubeApi::start(Answer::Node(node(
        "node-a",
        json!({ "podCIDR": "10.244.3.0/24", "podCIDRs": ["10.244.3.0/24", "fd00:10:244:3::/64"] }),
    )));
    let env = in_cluster_env(&host, &api, "node-a", &api.ca_pem());
    let out = install_in_cluster(&env);
    out.assert_ok();
    assert!(
        out.stdout.contains(
            "pod subnets 10.244.3.0/24, fd00:10:244:3::/64 from node node-a's spec.podCIDRs"
        ),
        "{}",
        out.stdout
    );
    assert_eq!(
        ranges(&host.conflist_json()),
        ["10.244.3.0/24", "fd00:10:244:3::/64"]
    );
    let requests = api.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert!(
        requests[0].starts_with("GET /api/v1/nodes/node-a HTTP/1.1\r\n"),
        "{}",
        requests[0]
    );
    // Header names in any case (HTTP/1.1's are case-insensitive; hyper writes them lower).
    assert!(
        requests[0]
            .to_ascii_lowercase()
            .contains("\r\nauthorization: bearer s3cr3t-token\r\n"),
        "{}",
        requests[0]
    );
}

/// A node of a single-stack cluster that only has the older spec.podCIDR.
#[test]
fn the_single_pod_cidr_is_the_fallback() {
    let host = Host::new();
    let api = KubeApi::start(Answer::Node(node(
        "node-b",
        json!({ "podCIDR": "10.244.7.0/24" }),
    )));
    let env = in_cluster_env(&host, &api, "node-b", &api.ca_pem());
    install_in_cluster(&env).assert_ok();
    assert_eq!(ranges(&host.conflist_json()), ["10.244.7.0/24"]);
}

/// An explicit subnet wins: the API server is not asked at all.
#[test]
fn an_explicit_subnet_overrides_the_node_object() {
    let host = Host::new();
    let api = KubeApi::start(Answer::Node(node(
        "node-a",
        json!({ "podCIDR": "10.244.3.0/24" }),
    )));
    let mut env = in_cluster_env(&host, &api, "node-a", &api.ca_pem());
    env.push(("EBPF_CNI_POD_SUBNETS", "10.99.0.0/24".to_owned()));
    install_in_cluster(&env).assert_ok();
    assert_eq!(ranges(&host.conflist_json()), ["10.99.0.0/24"]);
    assert!(api.requests().is_empty(), "{:?}", api.requests());
}

/// Each way reading the Node object fails is an error (exit code 1) in the operator's
/// terms, and nothing is written.
#[test]
fn node_object_failures_are_named_and_write_nothing() {
    let forbidden = "nodes \"node-a\" is forbidden: User \"system:serviceaccount:kube-system:ebpf-cni\" cannot get resource \"nodes\" in API group \"\" at the cluster scope";
    let cases: Vec<(&str, Answer, bool, &[&str])> = vec![
        (
            "403",
            Answer::Status(403, "Forbidden", forbidden),
            true,
            &[
                "403 Forbidden",
                "cannot get resource",
                "ClusterRole needs the verb `get` on the resource `nodes`",
            ],
        ),
        (
            "404",
            Answer::Status(404, "Not Found", "nodes \"node-a\" not found"),
            true,
            &[
                "404 Not Found: there is no node named \"node-a\"",
                "--node-name (NODE_NAME)",
            ],
        ),
        (
            "401",
            Answer::Status(401, "Unauthorized", "Unauthorized"),
            true,
            &[
                "401 Unauthorized",
                "--kube-token-file (EBPF_CNI_KUBE_TOKEN_FILE)",
            ],
        ),
        (
            "500",
            Answer::Status(
                500,
                "Internal Server Error",
                "etcdserver: request timed out",
            ),
            true,
            &["500 Internal Server Error (etcdserver: request timed out)"],
        ),
        (
            "no podCIDRs",
            Answer::Node(node("node-a", json!({}))),
            true,
            &[
                "node node-a has no spec.podCIDRs and no spec.podCIDR",
                "--allocate-node-cidrs",
                "--pod-subnet (EBPF_CNI_POD_SUBNETS)",
            ],
        ),
        (
            "slow",
            Answer::Silence(Duration::from_secs(4)),
            true,
            &["did not complete within 2s", "--kube-timeout"],
        ),
        // The right server, with a CA file from another cluster.
        (
            "wrong CA",
            Answer::Node(node("node-a", json!({ "podCIDR": "10.244.3.0/24" }))),
            false,
            &[
                "presented a certificate that the CA in",
                "(--kube-ca-file (EBPF_CNI_KUBE_CA_FILE)) does not accept",
                "UnknownIssuer",
            ],
        ),
    ];
    for (case, answer, right_ca, says) in cases {
        let host = Host::new();
        let api = KubeApi::start(answer);
        let ca = if right_ca {
            api.ca_pem()
        } else {
            Ca::new("another cluster's CA").pem()
        };
        let env = in_cluster_env(&host, &api, "node-a", &ca);
        let t = Instant::now();
        let out = install_in_cluster(&env);
        let took = t.elapsed();
        out.assert_failed(1);
        for s in says {
            assert!(
                out.stderr.contains(s),
                "{case}: stderr does not say {s:?}: {}",
                out.stderr
            );
        }
        assert!(
            took < Duration::from_secs(4),
            "{case} took {took:?}: the timeout is 2 s"
        );
        assert!(
            host.snapshot().0.is_empty(),
            "{case}: something was written"
        );
    }
    // Nothing listening: refused at once.
    let host = Host::new();
    let api = KubeApi::start(Answer::Silence(Duration::ZERO));
    let mut env = in_cluster_env(&host, &api, "node-a", &api.ca_pem());
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    env.retain(|(k, _)| *k != "KUBERNETES_SERVICE_PORT");
    env.push(("KUBERNETES_SERVICE_PORT", closed.to_string()));
    let out = install_in_cluster(&env);
    out.assert_failed(1);
    assert!(
        out.stderr.contains(&format!(
            "failed to connect to the API server at 127.0.0.1:{closed}"
        )),
        "{}",
        out.stderr
    );
}

/// `uninstall --purge` refuses while a pod is attached, naming its container id and
/// interface, and removes nothing at all; once no pod is left (here: a pod whose records
/// were lost, as a DEL that failed part-way leaves a node) it removes the node's pin tree
/// with the binary and the conflist.
#[test]
fn purge_refuses_while_a_pod_is_attached_then_removes_the_pins() {
    require_root();
    let host = Host::new();
    install(&host, &subnet_args()).assert_ok();
    let installed = host.snapshot();
    let p = PluginUnderTest::at(host.binary());
    let node = Node::new().unwrap();
    let pod = node.new_pod().unwrap();
    let list = runnable(&host.conflist_json(), &node);
    let cid = unique_container_id();
    let att = Attachment::new(&cid, pod.path(), "eth0");
    let res = p
        .runtime
        .add(&node, &list, &att)
        .unwrap_or_else(|e| panic!("ADD: {e}"));
    let pinned = node.pinned_files();
    assert!(!pinned.is_empty());
    let netns = node.netns().path().to_string_lossy().into_owned();

    let out = uninstall(&host, &["--purge", "--netns", &netns]);
    out.assert_failed(1);
    assert!(
        out.stderr.contains("refusing to purge")
            && out
                .stderr
                .contains(&format!("container {cid} ifname eth0 (network {NETWORK})")),
        "{}",
        out.stderr
    );
    assert_eq!(
        host.snapshot(),
        installed,
        "a refused purge removes no file"
    );
    assert_eq!(
        node.pinned_files(),
        pinned,
        "a refused purge removes no pin"
    );

    // The pod's own records lost: its attachment directory and its gateway use.
    fsutil::remove_tree(&node.attachment_pin_dir(NETWORK, &cid, "eth0")).unwrap();
    fsutil::remove_tree(&node.pin_root().join(ebpf_cni_maps::pin::GATEWAYS_DIR)).unwrap();
    assert!(node.pin_root().join(ebpf_cni_maps::pin::MAPS_DIR).is_dir());
    let out = uninstall(&host, &["--purge", "--netns", &netns]);
    out.assert_ok();
    assert!(
        out.stdout
            .contains(&format!("{}: removed", node.pin_root().display())),
        "{}",
        out.stdout
    );
    assert!(!node.pin_root().exists(), "the node's pin tree is gone");
    assert!(host.snapshot().0.is_empty());

    // Nothing pinned now: purging again is a success that says so.
    let out = uninstall(&host, &["--purge", "--netns", &netns]);
    out.assert_ok();
    assert!(
        out.stdout.contains("absent (nothing pinned)"),
        "{}",
        out.stdout
    );

    // The runtime's DEL (with the test's binary: the installed one is gone) still cleans
    // up the pod's veth and lease.
    let test_bin = PluginUnderTest::ebpf_cni();
    test_bin
        .runtime
        .del(&node, &list, &att, Some(&res))
        .unwrap_or_else(|e| panic!("DEL after the purge: {e}"));
}

/// Starts a program this process has just written. Another test's thread may fork while
/// the file is open for writing here, and its child holds that descriptor until it execs,
/// so exec can fail with ETXTBSY for a moment (a race of multi-threaded test binaries, not
/// of the install under test): retried for up to a second.
fn spawn_fresh_executable(cmd: &mut Command) -> std::process::Child {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return other.expect("the old build starts"),
        }
    }
}

/// `ebpf-cni layout FILE` reads a binary the page cache holds in small folios (as after a
/// reboot) back in 2 MiB folios, and so does a binary laying itself out (it runs from a
/// copy in memory: the pages a process maps stay where they are). A missing file fails by
/// name.
#[test]
fn layout_reads_a_binary_back_in_2mib_folios() {
    require_root();
    let host = Host::new();
    let copy = host.binary();
    std::fs::copy(ebpf_cni_bin(), &copy).unwrap();
    for args in [
        strings(&["layout", &copy.to_string_lossy()]),
        strings(&["layout"]),
    ] {
        fsutil::drop_cached(&copy).unwrap();
        assert_eq!(
            pages_in_2mib_folios(&copy),
            0,
            "read back in small folios first"
        );
        let bin = if args.len() == 2 {
            ebpf_cni_bin()
        } else {
            copy.clone()
        };
        let out = run(&bin, &args, &[]);
        out.assert_ok();
        let mib: f64 = out
            .stdout
            .strip_prefix(&format!("{}: ", copy.display()))
            .and_then(|s| s.split(' ').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{args:?}: {}", out.stdout));
        assert!(mib >= 4.0, "{args:?}: {}", out.stdout);
        let in_2mib = pages_in_2mib_folios(&copy);
        assert!(in_2mib >= 1024, "{args:?}: {in_2mib} pages in 2 MiB folios");
    }
    let missing = host.bin_dir().join("absent");
    let out = run(
        &ebpf_cni_bin(),
        &strings(&["layout", &missing.to_string_lossy()]),
        &[],
    );
    out.assert_failed(1);
    assert!(
        out.stderr
            .contains(&format!("cannot open {}", missing.display())),
        "{}",
        out.stderr
    );
}

/// `uninstall` (without `--purge`) while a pod runs removes the binary and the conflist and
/// nothing of the pod: its pins stay and its programs run, so the pod's traffic goes on
/// (calico#6739 was programs left attached without their state). Installed again, the
/// plugin's DEL of that pod, with the runtime's cached result, leaves nothing.
#[test]
fn uninstall_with_a_pod_attached_leaves_the_pod_working() {
    require_root();
    let host = Host::new();
    install(&host, &subnet_args()).assert_ok();
    let p = PluginUnderTest::at(host.binary());
    let node = Node::new().unwrap();
    let pod = node.new_pod().unwrap();
    let list = runnable(&host.conflist_json(), &node);
    let att = Attachment::new(&unique_container_id(), pod.path(), "eth0");
    let res = p
        .runtime
        .add(&node, &list, &att)
        .unwrap_or_else(|e| panic!("ADD: {e}"));
    let r = ebpf_cni_tests::AddResult::parse(&res).unwrap();
    let pinned = node.pinned_files();

    uninstall(&host, &[]).assert_ok();
    assert!(host.snapshot().0.is_empty(), "uninstall left files");
    assert_eq!(
        node.pinned_files(),
        pinned,
        "uninstall removed the pod's pins"
    );
    for ip in &r.ips {
        ebpf_cni_tests::net::tcp_echo(node.netns(), &pod, ip.addr, 0).unwrap_or_else(|e| {
            panic!(
                "the node reaches the pod at {} after uninstall: {e:#}",
                ip.addr
            )
        });
    }

    install(&host, &subnet_args()).assert_ok();
    p.runtime
        .del(&node, &list, &att, Some(&res))
        .unwrap_or_else(|e| panic!("DEL after reinstalling: {e}"));
    assert_gone(
        &node,
        Some(&pod),
        "eth0",
        &r,
        NETWORK,
        &att.container_id,
        "DEL",
    );
    assert!(node.pinned_files().is_empty(), "{:?}", node.pinned_files());
}
