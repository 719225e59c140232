//! `cargo xtask demo`: the README's first command. After the installs and the build it plays
//! a container runtime on a throw-away "node" (a network namespace) with two pods: it ADDs
//! both through a conflist, shows what the plugin built in the kernel and in bpffs, proves
//! TCP flows pod↔pod and node→pod, runs CHECK, DEL and DEL again, and shows that nothing of
//! the attachments is left. Every step is checked and the first failure ends the demo with a
//! non-zero exit; the harness's `Drop` impls remove the namespaces, pins and IPAM directory
//! whichever way it ends.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{anyhow, bail, ensure, Context as _, Result};
use ebpf_cni_maps::pin::ATTACHMENTS_DIR;
use ebpf_cni_tests::{
    bpf::{self, Direction, Mechanism, PinnedObject},
    config::{self, Stack},
    fsutil, kernel, net, state, AddResult, Attachment, NetConfList, Netns, Node, PluginUnderTest,
    ResultExpectation,
};
use serde_json::Value;

use crate::{cmd, prepare, setup::Scope};

/// The network name: it names the IPAM directory and the pins' subtree.
const NETWORK: &str = "demonet";
const CNI_VERSION: &str = "1.0.0";
const IFNAME: &str = "eth0";
/// Prefix of the host veth names ebpf-cni makes.
const HOST_VETH_PREFIX: &str = "ecni";
/// pod-a's host port (to its port 80).
const HOST_PORT: u16 = 8080;

pub fn demo() -> Result<()> {
    let plugin = prepare::prepare("cargo xtask demo", Scope::Demo, prepare::UNDER_TEST, None)?;
    let started = Instant::now();
    run(&plugin).context("the demo failed (everything it created has been removed)")?;
    println!(
        "\nDemo passed in {:.1}s (after the build).",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One pod: its namespace, what the runtime passes for it and, after ADD, the result the
/// runtime caches for CHECK and DEL.
struct Pod {
    label: &'static str,
    netns: Netns,
    att: Attachment,
    added: Option<(Value, AddResult)>,
}

impl Pod {
    fn new(node: &Node, label: &'static str) -> Result<Self> {
        let netns = node.new_pod()?;
        // Readable ids (real runtimes use 64 hex digits): they show up in pin paths and
        // leases. The node is private to this run, so they cannot collide.
        let mut att = Attachment::new(&format!("demo-{label}"), netns.path(), IFNAME);
        if label == "pod-a" {
            // What containerd passes for `ports: [{containerPort: 80, hostPort: 8080}]`.
            att = att.with_capability(
                "portMappings",
                serde_json::json!([{"HostPort": HOST_PORT, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""}]),
            );
        }
        Ok(Self {
            label,
            netns,
            att,
            added: None,
        })
    }

    fn result(&self) -> Result<&AddResult> {
        self.added
            .as_ref()
            .map(|(_, r)| r)
            .ok_or_else(|| anyhow!("{} has no ADD result", self.label))
    }

    fn cached(&self) -> Option<&Value> {
        self.added.as_ref().map(|(v, _)| v)
    }

    fn ip(&self, v6: bool) -> Result<IpAddr> {
        let r = self.result()?;
        let ip = if v6 { r.ip6() } else { r.ip4() };
        ip.map(|i| i.addr).ok_or_else(|| {
            anyhow!(
                "{} got no IPv{} address",
                self.label,
                if v6 { 6 } else { 4 }
            )
        })
    }
}

/// What must be gone once the node and pods are dropped.
struct Traces {
    netns: Vec<PathBuf>,
    pin_root: PathBuf,
    scratch: PathBuf,
}

/// The demo's steps against `plugin` (also run by `cargo xtask test`, so the README's first
/// command cannot break unnoticed).
pub fn run(plugin: &Path) -> Result<()> {
    let p = PluginUnderTest::at(plugin.to_path_buf());

    section("A node and two pods");
    let node = Node::new().context("creating the node namespace")?;
    let mut pods = [Pod::new(&node, "pod-a")?, Pod::new(&node, "pod-b")?];
    say(&format!(
        "node   netns {} (inode {})",
        node.netns().name(),
        node.netns().inode()
    ));
    for pod in &pods {
        say(&format!("{}  netns {}", pod.label, pod.netns.name()));
    }
    say(&format!("plugin {}", p.bin.display()));
    say(&format!("CNI_PATH {}", p.runtime.cni_path_env()));

    let traces = Traces {
        netns: std::iter::once(node.netns().path())
            .chain(pods.iter().map(|pod| pod.netns.path()))
            .map(Path::to_path_buf)
            .collect(),
        pin_root: node.pin_root().to_path_buf(),
        scratch: node.scratch_dir().to_path_buf(),
    };
    let outcome = exercise(&p, &node, &mut pods);
    // Dropping deletes the namespaces (and with them any veth a failed step left), the
    // node's pins and its dataDir, also when `exercise` failed half-way.
    drop(pods);
    drop(node);
    outcome?;

    section("Teardown: the demo's namespaces and directories are gone");
    for path in traces
        .netns
        .iter()
        .chain([&traces.pin_root, &traces.scratch])
    {
        ensure!(
            !path.exists(),
            "{} still exists after teardown",
            path.display()
        );
        ok(&format!("{} removed", path.display()));
    }
    Ok(())
}

fn exercise(p: &PluginUnderTest, node: &Node, pods: &mut [Pod; 2]) -> Result<()> {
    section("The network configuration list");
    let list = write_conflist(p, node)?;

    section("ADD: the runtime runs the conflist for each pod (dual-stack IPv4 + IPv6)");
    for pod in pods.iter_mut() {
        add(p, node, &list, pod)?;
    }

    section("Inside the pods");
    for pod in pods.iter() {
        say(&format!("{}:", pod.label));
        show_ip(&pod.netns, &["addr", "show", "dev", IFNAME])?;
        show_ip(&pod.netns, &["-4", "route", "show"])?;
        show_ip(&pod.netns, &["-6", "route", "show"])?;
    }

    section("On the node");
    show_ip(node.netns(), &["-br", "link", "show"])?;
    show_ip(node.netns(), &["-br", "addr", "show"])?;
    show_ip(node.netns(), &["-4", "route", "show"])?;
    show_ip(node.netns(), &["-6", "route", "show"])?;

    section("eBPF: TC programs on the host veths (bpf filters, the default attach mode) and the pins in bpffs");
    show_tc_programs(node, pods)?;
    show_pins(node)?;

    section("Traffic: TCP echo, pod <-> pod and node -> pod, IPv4 and IPv6");
    traffic(node, pods)?;
    section("Host port 8080 -> pod-a:80, without any iptables or nftables rule");
    host_port(node, pods)?;
    show_counters(node, &p.bin);

    section("CHECK: the kernel still matches each cached result");
    for pod in pods.iter() {
        let started = Instant::now();
        let cached = pod.cached().context("no cached result")?;
        p.runtime
            .check(node, &list, &pod.att, cached)
            .with_context(|| format!("CHECK {}", pod.label))?;
        ok(&format!("CHECK {} passed ({})", pod.label, ms(started)));
    }

    section("DEL, then DEL again (a runtime may repeat it; it must succeed)");
    for round in ["DEL", "DEL again"] {
        for pod in pods.iter() {
            let started = Instant::now();
            p.runtime
                .del(node, &list, &pod.att, pod.cached())
                .with_context(|| format!("{round} {}", pod.label))?;
            ok(&format!("{round} {} ({})", pod.label, ms(started)));
        }
    }

    section("Nothing left");
    nothing_left(node, pods)
}

/// Writes the conflist where a runtime would find it (here: the node's scratch directory),
/// prints it and reads it back as the runtime does.
fn write_conflist(p: &PluginUnderTest, node: &Node) -> Result<NetConfList> {
    let mut conf = config::standard(
        CNI_VERSION,
        NETWORK,
        &p.plugin_type,
        node.data_dir(),
        Stack::Dual,
    );
    conf["capabilities"] = serde_json::json!({"portMappings": true, "bandwidth": true});
    let text = serde_json::to_string_pretty(&NetConfList::single(&conf).to_value())?;
    let dir = node.scratch_dir().join("net.d");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("10-{NETWORK}.conflist"));
    std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    show(&format!("cat {}", path.display()), &text);

    let read = std::fs::read_to_string(&path)?;
    let value: Value =
        serde_json::from_str(&read).with_context(|| format!("parsing {}", path.display()))?;
    NetConfList::from_value(&value)
}

fn add(p: &PluginUnderTest, node: &Node, list: &NetConfList, pod: &mut Pod) -> Result<()> {
    say(&format!(
        "$ CNI_COMMAND=ADD CNI_CONTAINERID={} CNI_NETNS={} CNI_IFNAME={} {}   (stdin: plugins[0] + cniVersion, name)",
        pod.att.container_id, pod.att.netns, pod.att.ifname, p.plugin_type
    ));
    let started = Instant::now();
    let result = p
        .runtime
        .add(node, list, &pod.att)
        .with_context(|| format!("ADD {}", pod.label))?;
    let took = ms(started);
    block(&serde_json::to_string_pretty(&result)?);

    let expect = ResultExpectation::standard(CNI_VERSION, IFNAME, &pod.att.netns, Stack::Dual)
        .ebpf_cni_host_names();
    let parsed = expect.validate(&result).map_err(|problems| {
        anyhow!(
            "ADD {} returned a result that breaks the spec:\n  - {}",
            pod.label,
            problems.join("\n  - ")
        )
    })?;
    let problems = state::attachment_problems(node, &pod.netns, IFNAME, &parsed, Some(config::MTU));
    if !problems.is_empty() {
        bail!(
            "after ADD {} the kernel does not match the result:\n  - {}",
            pod.label,
            problems.join("\n  - ")
        );
    }
    let ips: Vec<String> = parsed
        .ips
        .iter()
        .map(|i| format!("{}/{}", i.addr, i.prefix))
        .collect();
    ok(&format!(
        "ADD {} ({took}): {} in the pod, host veth {}; the kernel matches the result",
        pod.label,
        ips.join(" "),
        parsed.host_ifname
    ));
    pod.added = Some((result, parsed));
    Ok(())
}

fn show_tc_programs(node: &Node, pods: &[Pod]) -> Result<()> {
    for pod in pods {
        let host = &pod.result()?.host_ifname;
        say(&format!("{host} ({}'s host veth):", pod.label));
        let progs = bpf::attached_programs(node.netns(), host)?;
        for prog in &progs {
            let (dir, what) = match prog.direction {
                Direction::Ingress => ("ingress", "from the pod"),
                Direction::Egress => ("egress ", "to the pod"),
            };
            let how = match (prog.mechanism, prog.link_id) {
                (Mechanism::Tcx, Some(id)) => format!("TCX link {id}"),
                (Mechanism::Tcx, None) => "TCX, no link".to_owned(),
                (Mechanism::NetlinkTc, _) => "bpf filter".to_owned(),
            };
            say(&format!(
                "    {dir} prog {:<5} {:<16} {how:<12} (traffic {what})",
                prog.prog_id, prog.name
            ));
        }
        // The default attach mode: netlink filters on the pods' own veths (docs/dataplane.md,
        // "Attach modes").
        for dir in [Direction::Ingress, Direction::Egress] {
            ensure!(
                progs
                    .iter()
                    .any(|p| p.direction == dir && p.mechanism == Mechanism::NetlinkTc),
                "no bpf filter at {dir:?} of {host}"
            );
        }
    }
    Ok(())
}

fn show_pins(node: &Node) -> Result<()> {
    let root = node.pin_root();
    let names: BTreeMap<u32, String> = kernel::links(node.netns())?
        .into_iter()
        .map(|l| (l.ifindex, l.ifname))
        .collect();
    say(&format!("pins under {}:", root.display()));
    let files = fsutil::list_files(root).with_context(|| format!("listing {}", root.display()))?;
    ensure!(
        !files.is_empty(),
        "nothing is pinned under {}",
        root.display()
    );
    for rel in files {
        let what = match bpf::pinned_object(&root.join(&rel))? {
            PinnedObject::Link(l) => match (l.tcx, l.tcx_direction()) {
                (Some((ifindex, _)), Some(dir)) => format!(
                    "TCX link {} -> prog {} at {dir:?} of {}",
                    l.id,
                    l.prog_id,
                    names
                        .get(&ifindex)
                        .cloned()
                        .unwrap_or_else(|| format!("ifindex {ifindex}"))
                ),
                _ => format!("link {} (type {}) -> prog {}", l.id, l.link_type, l.prog_id),
            },
            PinnedObject::Prog { id, name } => format!("prog {id} {name}"),
            PinnedObject::Map { id, name } => format!("map {id} {name}"),
            PinnedObject::Other(info) => format!("other: {}", info.trim().replace('\n', ", ")),
        };
        say(&format!("    {}  {what}", rel.display()));
    }
    Ok(())
}

fn traffic(node: &Node, pods: &[Pod; 2]) -> Result<()> {
    for v6 in [false, true] {
        for (from, to) in [(&pods[0], &pods[1]), (&pods[1], &pods[0])] {
            let (from_ip, to_ip) = (from.ip(v6)?, to.ip(v6)?);
            let echo = net::tcp_echo(&from.netns, &to.netns, to_ip, 0)
                .with_context(|| format!("TCP {} -> {} ({to_ip})", from.label, to.label))?;
            ensure!(
                echo.client_addr.ip() == from_ip,
                "TCP {} -> {}: the server saw the client as {}, not {from_ip}",
                from.label,
                to.label,
                echo.client_addr
            );
            ok(&format!(
                "TCP {} -> {}  {} -> {}  echoed, source address kept",
                from.label, to.label, echo.client_addr, echo.server_addr
            ));
        }
    }
    for v6 in [false, true] {
        for to in pods {
            let to_ip = to.ip(v6)?;
            let echo = net::tcp_echo(node.netns(), &to.netns, to_ip, 0)
                .with_context(|| format!("TCP node -> {} ({to_ip})", to.label))?;
            ok(&format!(
                "TCP node -> {}   {} -> {}  echoed",
                to.label, echo.client_addr, echo.server_addr
            ));
        }
    }
    Ok(())
}

/// A server in pod-a on port 80 answers "pod-a"; the node reaches it through 127.0.0.1,
/// ::1 and its own address at the host port, pod-b through the node's address, and each
/// client's connection shows the host port as its peer.
fn host_port(node: &Node, pods: &[Pod; 2]) -> Result<()> {
    use std::io::{Read, Write};
    use std::net::{Ipv6Addr, SocketAddr, TcpListener, TcpStream};
    let listener = pods[0]
        .netns
        .run_in(|| TcpListener::bind((Ipv6Addr::UNSPECIFIED, 80)))??;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    listener.set_nonblocking(true)?;
    let server = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut c, _)) => {
                        let _ = c.set_nonblocking(false);
                        let _ = c.write_all(b"pod-a");
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
                }
            }
        })
    };
    // pod-b's gateway is an address of the node (on its host veth).
    let gw = pods[1]
        .result()?
        .ip4()
        .and_then(|i| i.gateway)
        .ok_or_else(|| anyhow!("pod-b has no IPv4 gateway"))?;
    let targets: [(&str, &Netns, SocketAddr); 4] = [
        (
            "node",
            node.netns(),
            SocketAddr::from(([127, 0, 0, 1], HOST_PORT)),
        ),
        (
            "node",
            node.netns(),
            SocketAddr::from((Ipv6Addr::LOCALHOST, HOST_PORT)),
        ),
        ("node", node.netns(), SocketAddr::new(gw, HOST_PORT)),
        ("pod-b", &pods[1].netns, SocketAddr::new(gw, HOST_PORT)),
    ];
    let mut outcome = Ok(());
    for (who, ns, target) in targets {
        let r = ns.run_in(|| -> Result<(String, SocketAddr)> {
            let mut c = TcpStream::connect_timeout(&target, std::time::Duration::from_secs(3))?;
            c.set_read_timeout(Some(std::time::Duration::from_secs(3)))?;
            let mut s = String::new();
            c.read_to_string(&mut s)?;
            Ok((s, c.peer_addr()?))
        })?;
        match r {
            Ok((answer, peer)) if answer == "pod-a" => ok(&format!(
                "TCP {who} -> {target}: answered by {answer}, the connection's peer is {peer}"
            )),
            Ok((answer, _)) => {
                outcome = Err(anyhow!("TCP {who} -> {target}: answered {answer:?}"));
                break;
            }
            Err(e) => {
                outcome = Err(e.context(format!("TCP {who} -> {target}")));
                break;
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = server.join();
    outcome?;
    for cmd in [
        &["iptables-save"][..],
        &["ip6tables-save"],
        &["nft", "list", "ruleset"],
    ] {
        let out = node.netns().exec(cmd)?;
        let text = String::from_utf8_lossy(&out.stdout);
        let rules = text
            .lines()
            .filter(|l| l.starts_with("-A") || l.trim_start().starts_with("dnat"))
            .count();
        ensure!(
            rules == 0,
            "{} shows {rules} rules in the node:\n{text}",
            cmd[0]
        );
    }
    ok("iptables-save, ip6tables-save and nft list ruleset show no rule in the node");
    Ok(())
}

/// The node's eBPF state as the operator sees it: `ebpf-cni inspect`, run in the node's
/// network namespace (device programs, endpoints, per-pod links and counters).
fn show_counters(node: &Node, plugin: &Path) {
    let mut c = Command::new("nsenter");
    c.arg(format!("--net={}", node.netns().path().display()))
        .arg(plugin)
        .arg("inspect")
        .env_remove("CNI_COMMAND");
    match cmd::output(&mut c) {
        Ok(out) => show(
            &format!("ebpf-cni inspect   (in {})", node.netns().name()),
            &out,
        ),
        Err(e) => say(&format!("ebpf-cni inspect failed: {e:#}")),
    }
}

fn nothing_left(node: &Node, pods: &[Pod]) -> Result<()> {
    let mut problems = Vec::new();
    for pod in pods {
        problems.extend(state::leftover_problems(
            node,
            Some(&pod.netns),
            IFNAME,
            pod.result()?,
            NETWORK,
            &pod.att.container_id,
        ));
    }

    show_ip(node.netns(), &["-br", "link", "show"])?;
    let veths: Vec<String> = kernel::links(node.netns())?
        .into_iter()
        .map(|l| l.ifname)
        .filter(|n| n.starts_with(HOST_VETH_PREFIX))
        .collect();
    if veths.is_empty() {
        ok("no host veths");
    } else {
        problems.push(format!("host veths left: {}", veths.join(" ")));
    }

    show_ip(node.netns(), &["-4", "route", "show"])?;
    show_ip(node.netns(), &["-6", "route", "show"])?;
    let routes: Vec<String> = kernel::all_routes(node.netns())?
        .into_iter()
        .filter(|r| {
            r.dev
                .as_deref()
                .is_some_and(|d| d.starts_with(HOST_VETH_PREFIX))
        })
        .map(|r| r.describe())
        .collect();
    if routes.is_empty() {
        ok("no routes to pods");
    } else {
        problems.push(format!("routes left: {}", routes.join(", ")));
    }

    let data_dir = node.data_dir();
    let files: Vec<String> = fsutil::list_files(data_dir)?
        .iter()
        .map(|f| f.display().to_string())
        .collect();
    show(&format!("ls -R {}", data_dir.display()), &files.join("\n"));
    let leases = node.leases(NETWORK);
    if leases.is_empty() {
        ok("no leases (what remains is host-local's lock and last-reserved bookkeeping, and in ebpf-cni/ the boot id and the released lease files kept for reuse)");
    } else {
        problems.push(format!("leases left: {leases:?}"));
    }

    let pin_root = node.pin_root();
    let pins = fsutil::list_files(pin_root)?;
    let listing: Vec<String> = pins.iter().map(|f| f.display().to_string()).collect();
    show(
        &format!("find {} -type f", pin_root.display()),
        &listing.join("\n"),
    );
    let attachment_pins: Vec<&PathBuf> = pins
        .iter()
        .filter(|f| f.starts_with(ATTACHMENTS_DIR))
        .collect();
    if attachment_pins.is_empty() {
        ok("no attachment pins");
    } else {
        problems.push(format!("attachment pins left: {attachment_pins:?}"));
    }

    if !problems.is_empty() {
        bail!("DEL left things behind:\n  - {}", problems.join("\n  - "));
    }
    Ok(())
}

// ---- output: section headers, indented command output, one "ok" line per proven fact ----

fn section(title: &str) {
    println!("\n=== {title} ===");
}

fn say(line: &str) {
    println!("  {line}");
}

fn ok(line: &str) {
    println!("  ok: {line}");
}

/// Prints each line of `text` indented below the current line.
fn block(text: &str) {
    for line in text.lines() {
        println!("      {line}");
    }
}

/// `$ command` followed by its output, indented; "(empty)" for no output.
fn show(command: &str, output: &str) {
    say(&format!("$ {command}"));
    if output.trim().is_empty() {
        block("(empty)");
    } else {
        block(output.trim_end());
    }
}

fn show_ip(ns: &Netns, args: &[&str]) -> Result<()> {
    let out = ns.ip_ok(args)?;
    show(&format!("ip -n {} {}", ns.name(), args.join(" ")), &out);
    Ok(())
}

fn ms(started: Instant) -> String {
    format!("{} ms", started.elapsed().as_millis())
}
