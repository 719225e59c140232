//! The DaemonSet of `deploy/ebpf-cni.yaml`, run as its manifest says: the test reads the
//! manifest and starts its containers on two test nodes as kubelet would start them (the
//! image's binary with the containers' args and env, the volumes as directories of the
//! node, the securityContext's capabilities, in the node's network namespace), against the
//! stand-in Kubernetes API server; then it checks the cluster works with what the manifest
//! gives it, and that the manifest's ClusterRole grants exactly what the binary asks the API.
//!
//! What kubelet adds to a pod's containers stands in here too: the API server's address
//! (`KUBERNETES_SERVICE_HOST`/`_PORT`, the stand-in's) and the service account's token and
//! CA (kubelet mounts them at /var/run/secrets/kubernetes.io/serviceaccount; here
//! `EBPF_CNI_KUBE_TOKEN_FILE`/`EBPF_CNI_KUBE_CA_FILE` name the stand-in's files).
//!
//! Anything in the pod the translation does not know (a volume type, a container field, an
//! env source other than `spec.nodeName`, a path outside the container's mounts) fails the
//! test by name, so a change to the manifest cannot slip past it untested.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ebpf_cni_tests::agent::{AgentProcess, STARTED};
use ebpf_cni_tests::etcd::LAN_BRIDGE_IP;
use ebpf_cni_tests::kube_api::{self, KubeApi, Request};
use ebpf_cni_tests::lan::Lan;
use ebpf_cni_tests::net::tcp_echo;
use ebpf_cni_tests::{require_root, Attachment, NetConfList, Netns, Node, PluginUnderTest, Pod};
use ipnetwork::IpNetwork;
use serde::Deserialize;
use serde_json::{json, Value};

/// The manifest under test.
const MANIFEST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/ebpf-cni.yaml");

/// The service-account token the stand-in accepts (and kubelet would mount).
const TOKEN: &str = "token-1";

/// The capabilities a container runtime (containerd, CRI-O) gives a container whose
/// securityContext drops none: the set a `drop`/`add` list changes.
const RUNTIME_DEFAULT_CAPS: [&str; 14] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FSETID",
    "FOWNER",
    "MKNOD",
    "NET_RAW",
    "SETGID",
    "SETUID",
    "SETFCAP",
    "SETPCAP",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
    "KILL",
    "AUDIT_WRITE",
];

/// The environment variables kubelet gives the containers here (the manifest may not set
/// them: the test points them at its stand-in).
const KUBELET_ENV: [&str; 4] = [
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
    "EBPF_CNI_KUBE_TOKEN_FILE",
    "EBPF_CNI_KUBE_CA_FILE",
];

/// Polls `ok` until it holds, for at most `bound`; panics naming `what` after that.
fn eventually(what: &str, bound: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + bound;
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: not within {bound:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `v[key]` as a string, panicking with `what` when it is not one.
fn text<'a>(v: &'a Value, key: &str, what: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: `{key}` is not a string: {v}"))
}

/// `v[key]` as an array (none: empty).
fn list<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v[key].as_array().map_or(&[], Vec::as_slice)
}

/// Panics unless every key of the object `v` is in `known`: a field the translation does
/// not know could change how the container runs.
fn only_known(what: &str, v: &Value, known: &[&str]) {
    let object = v
        .as_object()
        .unwrap_or_else(|| panic!("{what} is not an object: {v}"));
    for key in object.keys() {
        assert!(
            known.contains(&key.as_str()),
            "{what} has `{key}`, which tests/tests/daemonset.rs does not know how to run: \
             teach the test what it means (known: {known:?})"
        );
    }
}

/// The manifest's documents, as the API server would take them.
struct Manifest {
    docs: Vec<Value>,
}

impl Manifest {
    fn load() -> Self {
        let yaml =
            std::fs::read_to_string(MANIFEST).unwrap_or_else(|e| panic!("reading {MANIFEST}: {e}"));
        let docs = serde_yaml_ng::Deserializer::from_str(&yaml)
            .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{MANIFEST}: {e}")))
            .filter(|doc| !doc.is_null())
            .collect();
        Self { docs }
    }

    /// The one document of `kind`.
    fn one(&self, kind: &str) -> &Value {
        let of_kind: Vec<&Value> = self.docs.iter().filter(|d| d["kind"] == kind).collect();
        assert_eq!(of_kind.len(), 1, "{MANIFEST}: one {kind}, not {of_kind:?}");
        of_kind[0]
    }

    fn daemonset(&self) -> &Value {
        self.one("DaemonSet")
    }

    /// The DaemonSet's pod spec.
    fn pod_spec(&self) -> &Value {
        &self.daemonset()["spec"]["template"]["spec"]
    }

    /// The ConfigMap named `name` in `namespace`: its `data`.
    fn config_map(&self, name: &str, namespace: &str) -> &serde_json::Map<String, Value> {
        let cm = self
            .docs
            .iter()
            .find(|d| {
                d["kind"] == "ConfigMap"
                    && d["metadata"]["name"] == name
                    && d["metadata"]["namespace"] == namespace
            })
            .unwrap_or_else(|| panic!("{MANIFEST}: no ConfigMap {namespace}/{name}"));
        cm["data"]
            .as_object()
            .unwrap_or_else(|| panic!("ConfigMap {name}: no data"))
    }

    /// The network config (`net-conf.json` of the ConfigMap `ebpf-cni-config`): its
    /// `network`.
    fn cluster_network(&self) -> IpNetwork {
        let namespace = text(&self.daemonset()["metadata"], "namespace", "the DaemonSet");
        let data = self.config_map("ebpf-cni-config", namespace);
        let conf: Value = serde_json::from_str(
            data["net-conf.json"]
                .as_str()
                .expect("ebpf-cni-config has net-conf.json"),
        )
        .expect("net-conf.json is JSON");
        text(&conf, "network", "net-conf.json")
            .parse()
            .expect("net-conf.json's network is a CIDR")
    }
}

/// What kubelet gives the pod's containers besides the manifest: the API server and the
/// service account's files.
struct Kubelet {
    api: SocketAddr,
    token_file: PathBuf,
    ca_file: PathBuf,
}

/// One container's process as kubelet starts it on a test node: its argv (the
/// securityContext applied by `setpriv` as the runtime applies it, then the image's binary
/// and the args, paths moved to where the volumes are) and its whole environment.
#[derive(Debug)]
struct Process {
    argv: Vec<String>,
    env: Vec<(String, String)>,
}

/// A container of the pod: its name, its spec in the manifest and its process.
#[derive(Debug)]
struct Container {
    name: String,
    spec: Value,
    process: Process,
}

/// The pod of the DaemonSet on one test node.
struct PodOnNode {
    init: Vec<Container>,
    containers: Vec<Container>,
    /// Each hostPath's directory on this node.
    host_paths: BTreeMap<String, PathBuf>,
}

/// Translates the DaemonSet's pod for the node `node_name` whose host directories live
/// below `root` (hostPath `/x/y` is `<root>/x/y`; `/sys/fs/bpf` is the machine's bpffs,
/// where each node's pins live apart under its namespace's inode), running `image` (the
/// image's binary, its entrypoint).
fn translate(
    manifest: &Manifest,
    image: &Path,
    node_name: &str,
    root: &Path,
    kubelet: &Kubelet,
) -> PodOnNode {
    let spec = manifest.pod_spec();
    only_known(
        "the DaemonSet's pod spec",
        spec,
        &[
            "serviceAccountName",
            "hostNetwork",
            "priorityClassName",
            "tolerations",
            "nodeSelector",
            "terminationGracePeriodSeconds",
            "initContainers",
            "containers",
            "volumes",
        ],
    );
    assert_eq!(
        spec["hostNetwork"], true,
        "the test runs the containers in the node's namespace: hostNetwork must be true"
    );
    let namespace = text(
        &manifest.daemonset()["metadata"],
        "namespace",
        "the DaemonSet",
    );
    let mut volumes = BTreeMap::new();
    let mut host_paths = BTreeMap::new();
    for volume in list(spec, "volumes") {
        let name = text(volume, "name", "a volume").to_owned();
        only_known(
            &format!("volume {name}"),
            volume,
            &["name", "hostPath", "configMap"],
        );
        let dir = if let Some(host) = volume.get("hostPath") {
            only_known(
                &format!("volume {name}'s hostPath"),
                host,
                &["path", "type"],
            );
            let path = text(host, "path", &name);
            assert!(
                matches!(
                    host["type"].as_str(),
                    None | Some("Directory" | "DirectoryOrCreate")
                ),
                "volume {name}: hostPath type {} is not a directory the test can make",
                host["type"]
            );
            let dir = if path == "/sys/fs/bpf" {
                let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
                assert!(
                    mounts.lines().any(|l| l.contains(" /sys/fs/bpf bpf ")),
                    "no bpffs at /sys/fs/bpf"
                );
                PathBuf::from(path)
            } else {
                let dir = root.join(path.trim_start_matches('/'));
                std::fs::create_dir_all(&dir).unwrap();
                dir
            };
            host_paths.insert(path.to_owned(), dir.clone());
            dir
        } else if let Some(cm) = volume.get("configMap") {
            only_known(&format!("volume {name}'s configMap"), cm, &["name"]);
            let data = manifest.config_map(text(cm, "name", &name), namespace);
            let dir = root.join("pod-volumes").join(&name);
            std::fs::create_dir_all(&dir).unwrap();
            for (file, content) in data {
                let content = content
                    .as_str()
                    .unwrap_or_else(|| panic!("ConfigMap data {file} is not text"));
                std::fs::write(dir.join(file), content).unwrap();
            }
            dir
        } else {
            panic!("volume {name}: neither hostPath nor configMap, the kinds the test makes")
        };
        volumes.insert(name, dir);
    }
    let container = |c: &Value| {
        let name = text(c, "name", "a container").to_owned();
        Container {
            process: process(c, &name, image, node_name, &volumes, kubelet),
            spec: c.clone(),
            name,
        }
    };
    PodOnNode {
        init: list(spec, "initContainers").iter().map(container).collect(),
        containers: list(spec, "containers").iter().map(container).collect(),
        host_paths,
    }
}

/// The process of the container `c` (named `name`): see [`Process`].
fn process(
    c: &Value,
    name: &str,
    image: &Path,
    node_name: &str,
    volumes: &BTreeMap<String, PathBuf>,
    kubelet: &Kubelet,
) -> Process {
    let what = format!("container {name}");
    only_known(
        &what,
        c,
        &[
            "name",
            "image",
            "imagePullPolicy",
            "args",
            "env",
            "volumeMounts",
            "securityContext",
            "resources",
            "ports",
            "livenessProbe",
        ],
    );
    // The container's mounts: mountPath -> the directory of its volume.
    let mut mounts = Vec::new();
    for m in list(c, "volumeMounts") {
        only_known(
            &format!("{what}'s volumeMount"),
            m,
            &["name", "mountPath", "readOnly", "mountPropagation"],
        );
        let volume = text(m, "name", &what);
        let dir = volumes
            .get(volume)
            .unwrap_or_else(|| panic!("{what} mounts volume {volume}, which the pod lacks"));
        mounts.push((text(m, "mountPath", &what).to_owned(), dir.clone()));
    }
    // An absolute path is the container's file system: a mount's, or nothing (the image
    // holds only its binary).
    let in_node = |value: &str| -> String {
        let Some(rest) = value.strip_prefix('/') else {
            return value.to_owned();
        };
        let path = format!("/{rest}");
        let (mount, dir) = mounts
            .iter()
            .filter(|(m, _)| path == *m || path.starts_with(&format!("{m}/")))
            .max_by_key(|(m, _)| m.len())
            .unwrap_or_else(|| {
                panic!(
                    "{what}: {path} is outside its volume mounts (the image has only its binary)"
                )
            });
        let below = path[mount.len()..].trim_start_matches('/');
        if below.is_empty() {
            dir.to_string_lossy().into_owned()
        } else {
            dir.join(below).to_string_lossy().into_owned()
        }
    };
    let args: Vec<String> = list(c, "args")
        .iter()
        .map(|a| {
            let a = a
                .as_str()
                .unwrap_or_else(|| panic!("{what}: arg {a} is not a string"));
            match a.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => {
                    format!("{flag}={}", in_node(value))
                }
                _ => in_node(a),
            }
        })
        .collect();
    let mut env = Vec::new();
    for e in list(c, "env") {
        let key = text(e, "name", &what).to_owned();
        assert!(
            !KUBELET_ENV.contains(&key.as_str()),
            "{what} sets {key}, which the test gives (as kubelet does) to reach its stand-in"
        );
        only_known(
            &format!("{what}'s env {key}"),
            e,
            &["name", "value", "valueFrom"],
        );
        let value = match (e.get("value"), e.get("valueFrom")) {
            (Some(v), None) => in_node(
                v.as_str()
                    .unwrap_or_else(|| panic!("{what}'s env {key}: not a string")),
            ),
            (None, Some(from)) => {
                only_known(&format!("{what}'s env {key}"), from, &["fieldRef"]);
                let path = from["fieldRef"]["fieldPath"].as_str();
                assert_eq!(
                    path,
                    Some("spec.nodeName"),
                    "{what}'s env {key}: from {from}: the test gives only spec.nodeName"
                );
                node_name.to_owned()
            }
            _ => panic!("{what}'s env {key}: neither a value nor valueFrom: {e}"),
        };
        env.push((key, value));
    }
    // kubelet's: the API server's Service, and (for the service account's mount) its files.
    env.extend([
        (
            "KUBERNETES_SERVICE_HOST".into(),
            kubelet.api.ip().to_string(),
        ),
        (
            "KUBERNETES_SERVICE_PORT".into(),
            kubelet.api.port().to_string(),
        ),
        (
            "EBPF_CNI_KUBE_TOKEN_FILE".into(),
            kubelet.token_file.to_string_lossy().into_owned(),
        ),
        (
            "EBPF_CNI_KUBE_CA_FILE".into(),
            kubelet.ca_file.to_string_lossy().into_owned(),
        ),
    ]);
    let mut argv = security_context(&what, &c["securityContext"]);
    argv.push(image.to_string_lossy().into_owned());
    argv.extend(args);
    Process { argv, env }
}

/// `setpriv` with what `securityContext` asks of the process: the capabilities the runtime
/// leaves it (its defaults, less `drop`, plus `add`) as its bounding set, which is what a
/// process of root keeps across exec, and no_new_privs when `allowPrivilegeEscalation` is
/// false.
fn security_context(what: &str, sc: &Value) -> Vec<String> {
    if sc.is_null() {
        return security_context(what, &json!({}));
    }
    only_known(
        &format!("{what}'s securityContext"),
        sc,
        &[
            "allowPrivilegeEscalation",
            "readOnlyRootFilesystem",
            "capabilities",
        ],
    );
    only_known(
        &format!("{what}'s capabilities"),
        &if sc["capabilities"].is_null() {
            json!({})
        } else {
            sc["capabilities"].clone()
        },
        &["add", "drop"],
    );
    let names = |key: &str| -> Vec<String> {
        list(&sc["capabilities"], key)
            .iter()
            .map(|c| c.as_str().expect("a capability name").to_uppercase())
            .collect()
    };
    let mut caps: BTreeSet<String> = RUNTIME_DEFAULT_CAPS.iter().map(|c| c.to_string()).collect();
    for drop in names("drop") {
        if drop == "ALL" {
            caps.clear();
        } else {
            caps.remove(drop.trim_start_matches("CAP_"));
        }
    }
    caps.extend(
        names("add")
            .iter()
            .map(|c| c.trim_start_matches("CAP_").to_owned()),
    );
    let mut bounding = "-all".to_owned();
    for c in &caps {
        bounding.push_str(&format!(",+{}", c.to_lowercase()));
    }
    let mut argv = vec![
        "/usr/bin/setpriv".to_owned(),
        "--bounding-set".to_owned(),
        bounding,
        "--inh-caps".to_owned(),
        "-all".to_owned(),
    ];
    if sc["allowPrivilegeEscalation"] == false {
        argv.push("--no-new-privs".to_owned());
    }
    argv.push("--".to_owned());
    argv
}

/// The value of `--flag` in `args` (`--flag value` or `--flag=value`).
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().enumerate().find_map(|(i, a)| {
        if a == name {
            args.get(i + 1).map(String::as_str)
        } else {
            a.strip_prefix(name)?.strip_prefix('=')
        }
    })
}

/// One access to the API, as RBAC names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Access {
    group: String,
    resource: String,
    verb: String,
}

impl Access {
    fn new(group: &str, resource: &str, verb: &str) -> Self {
        Self {
            group: group.to_owned(),
            resource: resource.to_owned(),
            verb: verb.to_owned(),
        }
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} (apiGroup {:?})",
            self.verb, self.resource, self.group
        )
    }
}

/// What RBAC checks of `request`: its verb on its resource (a subresource as
/// `resource/sub`), or why it is not a resource request this check knows.
fn access_of(request: &Request) -> Result<Access, String> {
    let named = format!("{} {}", request.method, request.target);
    let (path, query) = request
        .target
        .split_once('?')
        .unwrap_or((&request.target, ""));
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return Err(format!("{named}: not a resource request")),
    };
    let rest = match rest {
        ["namespaces", _, more @ ..] if !more.is_empty() => more,
        _ => rest,
    };
    let watch = query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1");
    let (resource, verb) = match (request.method.as_str(), rest) {
        ("GET", [resource]) if watch => (resource.to_string(), "watch"),
        ("GET", [resource]) => (resource.to_string(), "list"),
        ("GET", [resource, _]) => (resource.to_string(), "get"),
        ("GET", [resource, _, sub]) => (format!("{resource}/{sub}"), "get"),
        ("PATCH", [resource, _]) => (resource.to_string(), "patch"),
        ("PATCH", [resource, _, sub]) => (format!("{resource}/{sub}"), "patch"),
        ("PUT", [resource, _]) => (resource.to_string(), "update"),
        ("PUT", [resource, _, sub]) => (format!("{resource}/{sub}"), "update"),
        ("POST", [resource]) => (resource.to_string(), "create"),
        ("DELETE", [resource, _]) => (resource.to_string(), "delete"),
        _ => return Err(format!("{named}: no RBAC verb known for it")),
    };
    Ok(Access::new(group, &resource, verb))
}

/// What is wrong with the ClusterRole's `rules` for the accesses `used`: each access no
/// rule grants, and each grant never used (least privilege). Empty when they match.
fn rbac_findings(rules: &Value, used: &BTreeSet<Access>) -> Vec<String> {
    let mut granted = BTreeSet::new();
    let mut findings = Vec::new();
    for rule in rules.as_array().map_or(&[][..], Vec::as_slice) {
        let keys: Vec<&String> = rule
            .as_object()
            .map(|o| o.keys().collect())
            .unwrap_or_default();
        if let Some(k) = keys
            .iter()
            .find(|k| !["apiGroups", "resources", "verbs"].contains(&k.as_str()))
        {
            findings.push(format!(
                "a rule with `{k}`, which this check does not know: {rule}"
            ));
            continue;
        }
        let strings = |key: &str| -> Vec<String> {
            list(rule, key)
                .iter()
                .map(|v| v.as_str().unwrap_or("?").to_owned())
                .collect()
        };
        for g in strings("apiGroups") {
            for r in strings("resources") {
                for v in strings("verbs") {
                    if [&g, &r, &v].iter().any(|s| s.contains('*')) {
                        findings.push(format!("a wildcard grant ({v} {r} in {g:?}): {rule}"));
                    }
                    granted.insert(Access::new(&g, &r, &v));
                }
            }
        }
    }
    for a in used.difference(&granted) {
        findings.push(format!("{a} is asked by the binary but not granted"));
    }
    for a in granted.difference(used) {
        findings.push(format!("{a} is granted but never asked (least privilege)"));
    }
    findings
}

/// Panics unless the ClusterRoleBinding binds the ClusterRole to the service account the
/// DaemonSet's pod runs as, and that account is in the manifest.
fn assert_binding(manifest: &Manifest) {
    let role = text(
        &manifest.one("ClusterRole")["metadata"],
        "name",
        "the ClusterRole",
    );
    let binding = manifest.one("ClusterRoleBinding");
    let ds = manifest.daemonset();
    let account = text(manifest.pod_spec(), "serviceAccountName", "the pod spec");
    let namespace = text(&ds["metadata"], "namespace", "the DaemonSet");
    assert_eq!(
        binding["roleRef"],
        json!({ "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role }),
        "the ClusterRoleBinding's roleRef"
    );
    assert!(
        list(binding, "subjects").contains(&json!({
            "kind": "ServiceAccount",
            "name": account,
            "namespace": namespace,
        })),
        "the ClusterRoleBinding does not bind {namespace}/{account}: {binding}"
    );
    let sa = &manifest.one("ServiceAccount")["metadata"];
    assert_eq!(
        (sa["name"].as_str(), sa["namespace"].as_str()),
        (Some(account), Some(namespace)),
        "the ServiceAccount"
    );
}

/// A test node on the LAN running the DaemonSet's pod.
struct DsNode {
    node: Node,
    name: String,
    addr: Ipv4Addr,
    pod: PodOnNode,
}

impl DsNode {
    /// The node `name`, host `host` of the LAN, with the pod translated for it and the
    /// service account's files (kubelet's mount) in its scratch directory.
    fn new(
        manifest: &Manifest,
        image: &Path,
        lan: &Lan,
        api: &KubeApi,
        name: &str,
        host: u8,
    ) -> Self {
        let node = Node::new().unwrap();
        let addr = lan.attach(node.netns(), "lan0", host).unwrap();
        let sa = node.scratch_dir().join("serviceaccount");
        std::fs::create_dir(&sa).unwrap();
        let (ca_file, token_file) = api.write_credentials(&sa).unwrap();
        let kubelet = Kubelet {
            api: api.addr(),
            token_file,
            ca_file,
        };
        let root = node.scratch_dir().join("host");
        let pod = translate(manifest, image, name, &root, &kubelet);
        Self {
            node,
            name: name.to_owned(),
            addr,
            pod,
        }
    }

    /// The host directory hostPath `path` stands for.
    fn host_path(&self, path: &str) -> &Path {
        self.pod
            .host_paths
            .get(path)
            .unwrap_or_else(|| panic!("the pod mounts no hostPath {path}"))
    }

    /// Runs each init container to its end in the node's namespace, as kubelet does before
    /// the containers start; panics unless each exits 0. Returns what each printed.
    fn run_init_containers(&self) -> Vec<String> {
        self.pod
            .init
            .iter()
            .map(|c| {
                let p = &c.process;
                let out = self
                    .node
                    .netns()
                    .run_in(|| {
                        Command::new(&p.argv[0])
                            .env_clear()
                            .envs(p.env.iter().map(|(k, v)| (k, v)))
                            .args(&p.argv[1..])
                            .stdin(Stdio::null())
                            .output()
                    })
                    .unwrap()
                    .unwrap_or_else(|e| panic!("starting init container {}: {e}", c.name));
                let (stdout, stderr) = (
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr),
                );
                assert!(
                    out.status.success(),
                    "{}: init container {} ({:?}) failed ({}):\n{stdout}{stderr}",
                    self.name,
                    c.name,
                    p,
                    out.status
                );
                format!("{stdout}{stderr}")
            })
            .collect()
    }

    /// Starts the containers (the agent) in the node's namespace; once each runs.
    fn start_containers(&self) -> Vec<AgentProcess> {
        self.pod
            .containers
            .iter()
            .map(|c| {
                let p = &c.process;
                let mut agent = AgentProcess::spawn_in(
                    self.node.netns(),
                    Path::new(&p.argv[0]),
                    &p.argv[1..],
                    &p.env,
                )
                .unwrap();
                agent
                    .wait_for(STARTED, Duration::from_secs(30))
                    .unwrap_or_else(|e| panic!("{}: container {}: {e:#}", self.name, c.name));
                agent
            })
            .collect()
    }

    /// The conflist a runtime of the node uses: the first by name in the host's CNI conf
    /// dir, parsed.
    fn conflist(&self) -> (PathBuf, Value) {
        let dir = self.host_path("/etc/cni/net.d");
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.extension()
                    .is_some_and(|x| x == "conflist" || x == "conf")
            })
            .collect();
        files.sort();
        let first = files
            .first()
            .unwrap_or_else(|| panic!("{}: no conflist in {}", self.name, dir.display()))
            .clone();
        let value = serde_json::from_str(&std::fs::read_to_string(&first).unwrap()).unwrap();
        (first, value)
    }

    /// The pod subnets its conflist gives.
    fn conflist_subnets(&self) -> Vec<String> {
        self.conflist().1["plugins"][0]["ipam"]["ranges"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|set| set[0]["subnet"].as_str().map(str::to_owned))
            .collect()
    }

    /// A pod the node's runtime adds with its conflist and the binary install put into
    /// the host's CNI bin dir (the IPAM leases in the node's scratch directory).
    fn add_pod(&self) -> (Pod, PluginUnderTest, NetConfList) {
        let (_, mut conflist) = self.conflist();
        conflist["plugins"][0]["ipam"]["dataDir"] = json!(self.node.data_dir());
        let list = NetConfList::from_value(&conflist).unwrap();
        let plugin_type = list.plugins[0]["type"].as_str().unwrap().to_owned();
        let p = PluginUnderTest::at(self.host_path("/opt/cni/bin").join(plugin_type));
        let pod = Pod::try_add(&p.runtime, &self.node, &list, |a: Attachment| a)
            .unwrap_or_else(|e| panic!("{}: ADD with the installed conflist: {e}", self.name));
        (pod, p, list)
    }

    /// Whether its agent routes `subnet` via `via` on the LAN (`proto 236`: the agent's).
    fn routes_to(&self, subnet: &str, via: Ipv4Addr) -> bool {
        self.node
            .netns()
            .ip_ok(&["-4", "route", "show", "proto", "236"])
            .unwrap()
            .contains(&format!("{subnet} via {via} dev lan0"))
    }
}

/// `GET <path>` over HTTP/1.0 to `target` from a thread in `ns`: the answer, head and body.
fn http_get(ns: &Netns, target: SocketAddr, path: &str) -> std::io::Result<String> {
    ns.run_in(|| {
        let timeout = Duration::from_secs(5);
        let mut c = TcpStream::connect_timeout(&target, timeout)?;
        c.set_read_timeout(Some(timeout))?;
        c.write_all(format!("GET {path} HTTP/1.0\r\nHost: {target}\r\n\r\n").as_bytes())?;
        let mut answer = String::new();
        c.read_to_string(&mut answer)?;
        Ok(answer)
    })
    .map_err(std::io::Error::other)?
}

/// The status of the node's NetworkUnavailable condition in the stand-in, if it has one.
fn network_unavailable(api: &KubeApi, name: &str) -> Option<String> {
    let node = api.node(name)?;
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "NetworkUnavailable")
        .map(|c| c["status"].as_str().unwrap_or("").to_owned())
}

/// The DaemonSet's containers run on two nodes exactly as `deploy/ebpf-cni.yaml` has them
/// (its args, env from values and the downward API, its volumes as the nodes' directories
/// and its ConfigMap's files, its capabilities), with only what kubelet adds besides (the
/// API server's address, the service account's token and CA), against the stand-in API
/// server. It proves that the manifest as written installs a working network: the init
/// container writes the conflist with the Node's pod CIDR; the agent routes to the other
/// node's pod subnet, pods on the two nodes reach each other, each node's
/// NetworkUnavailable condition is cleared, and the metrics answer where the manifest's
/// `--metrics-listen` and liveness probe say. And that the ClusterRole grants exactly what
/// the binary asked the API (every request granted, every grant used), bound to the pod's
/// service account.
#[test]
fn the_daemonsets_containers_run_as_the_manifest_says() {
    require_root();
    let manifest = Manifest::load();
    // The image: a copy of the binary under test, fixed for the test's length as a pulled
    // image is (a build may replace the original meanwhile).
    let image_dir = tempfile::tempdir().unwrap();
    let image = image_dir.path().join("ebpf-cni");
    std::fs::copy(PluginUnderTest::ebpf_cni().bin, &image).unwrap();
    let network = manifest.cluster_network();
    let lan = Lan::new().unwrap();
    let api = KubeApi::start(Some(lan.netns()), (LAN_BRIDGE_IP, 0).into(), TOKEN).unwrap();
    let a = DsNode::new(&manifest, &image, &lan, &api, "node-a", 1);
    let b = DsNode::new(&manifest, &image, &lan, &api, "node-b", 2);
    let subnets = [(&a, "10.244.1.0/24"), (&b, "10.244.2.0/24")];
    let node_selector = &manifest.pod_spec()["nodeSelector"];
    for (n, subnet) in subnets {
        assert!(
            network.contains(subnet.parse::<IpNetwork>().unwrap().network()),
            "{subnet} outside the ConfigMap's network {network}"
        );
        let object = kube_api::node(&n.name, &[subnet], &[&n.addr.to_string()], &[]);
        for (label, value) in node_selector.as_object().into_iter().flatten() {
            assert_eq!(
                &object["metadata"]["labels"][label], value,
                "the DaemonSet's nodeSelector {label} does not select {}",
                n.name
            );
        }
        api.set_node(object);
    }
    let names = |cs: &[Container]| cs.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&a.pod.init), ["install"], "the init containers");
    assert_eq!(names(&a.pod.containers), ["agent"], "the containers");

    // Each node: install runs to its end (the binary, then the conflist from the Node's
    // pod CIDR), then the agent starts.
    let mut agents = Vec::new();
    for (n, subnet) in subnets {
        let said = n.run_init_containers();
        let binary = n.host_path("/opt/cni/bin").join("ebpf-cni");
        assert!(
            std::fs::read(&binary).unwrap_or_else(|e| panic!("{}: {e}", binary.display()))
                == std::fs::read(&image).unwrap(),
            "{}: install put the image's binary into the host's CNI bin dir: {said:?}",
            n.name
        );
        assert_eq!(
            n.conflist_subnets(),
            [subnet],
            "{}: the conflist has the Node's pod CIDR: {said:?}",
            n.name
        );
        let agent_args = &n.pod.containers[0].process.argv;
        assert_eq!(
            flag(agent_args, "--conf").map(PathBuf::from),
            Some(n.conflist().0),
            "{}: the agent's --conf is the conflist install wrote",
            n.name
        );
        agents.extend(n.start_containers());
    }

    // The routes to each other's pod subnet, via the other's LAN address.
    eventually("a's route to b's pods", Duration::from_secs(20), || {
        a.routes_to("10.244.2.0/24", b.addr)
    });
    eventually("b's route to a's pods", Duration::from_secs(20), || {
        b.routes_to("10.244.1.0/24", a.addr)
    });
    // A pod on each node, added with what install wrote; each reaches the other.
    let (pod_a, p_a, list_a) = a.add_pod();
    let (pod_b, p_b, list_b) = b.add_pod();
    let (sa, sb): (IpNetwork, IpNetwork) = (
        "10.244.1.0/24".parse().unwrap(),
        "10.244.2.0/24".parse().unwrap(),
    );
    assert!(sa.contains(pod_a.v4()) && sb.contains(pod_b.v4()));
    tcp_echo(&pod_a.netns, &pod_b.netns, pod_b.v4(), 0).expect("pod a -> pod b");
    tcp_echo(&pod_b.netns, &pod_a.netns, pod_a.v4(), 0).expect("pod b -> pod a");

    // Each node's NetworkUnavailable condition cleared by its agent.
    for n in [&a, &b] {
        eventually(
            &format!("{}'s NetworkUnavailable False", n.name),
            Duration::from_secs(30),
            || network_unavailable(&api, &n.name).as_deref() == Some("False"),
        );
    }

    // The metrics where --metrics-listen says (its unspecified address: the node's), as
    // the liveness probe and a scraper reach them: the node's own pod counted.
    let agent = &a.pod.containers[0];
    let listen: SocketAddr = flag(&agent.process.argv, "--metrics-listen")
        .expect("the agent serves metrics (--metrics-listen)")
        .parse()
        .expect("--metrics-listen is ADDR:PORT");
    let probe = &agent.spec["livenessProbe"]["httpGet"];
    assert_eq!(
        (probe["path"].as_str(), probe["port"].as_u64()),
        (Some("/metrics"), Some(u64::from(listen.port()))),
        "the liveness probe asks the metrics"
    );
    for n in [&a, &b] {
        let ip = if listen.ip().is_unspecified() {
            IpAddr::V4(n.addr)
        } else {
            listen.ip()
        };
        let target = SocketAddr::new(ip, listen.port());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let answer = http_get(n.node.netns(), target, "/metrics");
            let ok = answer.as_ref().is_ok_and(|a| {
                a.split(' ').nth(1) == Some("200")
                    && a.lines().any(|l| l == "ebpf_cni_attachments 1")
            });
            if ok {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{}'s metrics at {target} (its one pod counted): {:?}",
                n.name,
                answer.map(|a| a.chars().take(2000).collect::<String>())
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    for agent in &mut agents {
        agent.still_running().unwrap();
    }

    // RBAC: every request granted, every grant used (the watch may come a moment after
    // the routes: waited for, bounded).
    let rules = &manifest.one("ClusterRole")["rules"];
    let used = || -> BTreeSet<Access> {
        api.requests()
            .iter()
            .map(|r| access_of(r).unwrap_or_else(|e| panic!("{e}")))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !rbac_findings(rules, &used()).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let requests = api.requests();
    let findings = rbac_findings(rules, &used());
    assert!(
        findings.is_empty(),
        "the ClusterRole does not match what the binary asks:\n{}\nthe requests:\n{}",
        findings.join("\n"),
        requests
            .iter()
            .map(|r| format!("{} {} -> {}", r.method, r.target, r.status))
            .collect::<Vec<_>>()
            .join("\n")
    );
    for r in &requests {
        assert!(
            r.status == 200 && r.token == TOKEN,
            "a request not answered 200 with the service account's token: {r:?}"
        );
    }
    assert_binding(&manifest);

    pod_a.del(&p_a, &a.node, &list_a);
    pod_b.del(&p_b, &b.node, &list_b);
}

/// The RBAC check itself, without a cluster: a role lacking `watch` is reported for it, a
/// grant never used is reported, requests map to RBAC's verbs, and a request that is not
/// a resource request is named.
#[test]
fn the_rbac_check_names_missing_and_unused_grants() {
    let request = |method: &str, target: &str| Request {
        method: method.to_owned(),
        target: target.to_owned(),
        token: TOKEN.to_owned(),
        content_type: String::new(),
        body: String::new(),
        status: 200,
    };
    let used: BTreeSet<Access> = [
        request("GET", "/api/v1/nodes/node-a"),
        request("GET", "/api/v1/nodes?&limit=500"),
        request(
            "GET",
            "/api/v1/nodes?&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=101",
        ),
        request("PATCH", "/api/v1/nodes/node-a/status?"),
    ]
    .iter()
    .map(|r| access_of(r).unwrap())
    .collect();
    assert_eq!(
        used,
        BTreeSet::from([
            Access::new("", "nodes", "get"),
            Access::new("", "nodes", "list"),
            Access::new("", "nodes", "watch"),
            Access::new("", "nodes/status", "patch"),
        ])
    );
    let manifest = Manifest::load();
    assert_eq!(
        rbac_findings(&manifest.one("ClusterRole")["rules"], &used),
        Vec::<String>::new(),
        "the manifest's role"
    );
    let without_watch = json!([
        { "apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"] },
        { "apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch", "update"] },
    ]);
    assert_eq!(
        rbac_findings(&without_watch, &used),
        [
            "watch nodes (apiGroup \"\") is asked by the binary but not granted",
            "update nodes/status (apiGroup \"\") is granted but never asked (least privilege)",
        ]
    );
    let wildcard = json!([{ "apiGroups": [""], "resources": ["*"], "verbs": ["*"] }]);
    assert!(rbac_findings(&wildcard, &used)
        .iter()
        .any(|f| f.contains("wildcard")));
    let err = access_of(&request("GET", "/version")).unwrap_err();
    assert!(err.contains("GET /version"), "{err}");
}
