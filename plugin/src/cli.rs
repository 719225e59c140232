//! The operator CLI, used when `CNI_COMMAND` is not set.

use std::{
    path::PathBuf,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use clap::{Parser, Subcommand};

use crate::cni::error::chain;

use crate::{
    bpf::{self, NodeId},
    netlink::Netlink,
    netns::Netns,
};

#[derive(Parser)]
#[command(
    name = "ebpf-cni",
    version,
    about = "CNI plugin with an eBPF dataplane. Run by a container runtime with CNI_COMMAND set; without it, these operator commands."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Stream the eBPF programs' decisions (redirects, drops, FIB lookups) until Ctrl-C or --seconds.
    /// The programs only note them while a trace runs.
    Trace {
        /// Stop after this many seconds.
        #[arg(long)]
        seconds: Option<u64>,
        /// Trace the node whose network namespace this is (default: the current one).
        #[arg(long, value_name = "PATH")]
        netns: Option<PathBuf>,
    },
    /// Print the plugin version and the CNI spec versions it supports.
    Version,
    /// List the node's eBPF state: device programs, and per attachment its addresses,
    /// programs, links and traffic counters.
    Inspect {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Inspect the node whose network namespace this is (default: the current one).
        #[arg(long, value_name = "PATH")]
        netns: Option<PathBuf>,
    },
    /// Print the node's counters and gauges in the Prometheus text format; or write them
    /// atomically to a file (node_exporter's textfile collector); or serve them at
    /// /metrics over HTTP, read anew for each scrape.
    Metrics {
        /// Read the node whose network namespace this is (default: the current one). The
        /// HTTP listener stays in the namespace the command runs in.
        #[arg(long, value_name = "PATH")]
        netns: Option<PathBuf>,
        /// Write to this file (a temporary file beside it, then renamed over it).
        #[arg(long, value_name = "FILE", conflicts_with = "listen")]
        output: Option<PathBuf>,
        /// Serve GET /metrics on this address in the foreground.
        #[arg(long, value_name = "ADDR:PORT")]
        listen: Option<std::net::SocketAddr>,
    },
    /// Keep the node in line with its devices and addresses as they change (host ports on
    /// a new address, the device program on a new device, masquerade's new source), in
    /// the foreground: the DaemonSet's optional second container. STATUS does the same
    /// each time the runtime asks.
    Agent {
        /// The conflist (or config) whose ebpf-cni plugin says which devices and attach mode
        /// (default: every device holding a global address, attach mode auto).
        #[arg(long, value_name = "FILE")]
        conf: Option<PathBuf>,
        /// Run in the node whose network namespace this is (default: the current one).
        #[arg(long, value_name = "PATH")]
        netns: Option<PathBuf>,
        /// Converge also after this many seconds without announcements.
        #[arg(long, value_name = "SECONDS", default_value_t = 30)]
        resync: u64,
        /// Read kube-proxy's rules (the Service addresses) at least this often: they come
        /// with no announcement.
        #[arg(long, value_name = "SECONDS", default_value_t = 3)]
        services_poll: u64,
        /// Converge once and exit.
        #[arg(long)]
        once: bool,
        /// Also serve the node's metrics at GET /metrics on this address.
        #[arg(long, value_name = "ADDR:PORT")]
        metrics_listen: Option<std::net::SocketAddr>,
        #[command(flatten)]
        cluster: Box<crate::cluster::ClusterArgs>,
    },
    /// Install this binary into the host's CNI bin dir and write its conflist into the conf
    /// dir (a DaemonSet's install step): atomically, idempotently, other files untouched.
    /// Pod subnets default to the Kubernetes Node object's spec.podCIDRs.
    Install(Box<crate::install::InstallArgs>),
    /// Remove what install wrote (the binary and the conflist, only if they are ours);
    /// with --purge also the node's pinned eBPF state, refused while a pod is attached.
    Uninstall(crate::install::UninstallArgs),
    /// Read this binary (or FILE) back into the page cache in 2 MiB folios, so that each
    /// ADD maps its code in fewer and cheaper page faults: for a unit that runs at boot
    /// before the container runtime (install does it for the binary it installs). Pages
    /// a running process maps stay as they are.
    Layout {
        /// The binary to lay out (default: this one).
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
    },
}

pub fn main() -> i32 {
    let cli = Cli::parse();
    // An operator's pipe closing early (`ebpf-cni inspect | head`) ends a command that
    // prints quietly, as for other command-line tools, instead of a panic in println!.
    // Commands that talk over sockets keep Rust's default (SIGPIPE ignored): with the
    // default disposition, an etcd member or API server that hangs up mid-write would kill
    // the agent or `install` without a word. (CNI commands keep Rust's default too: their
    // stdout is the runtime's.)
    if matches!(
        cli.command,
        Cmd::Version
            | Cmd::Trace { .. }
            | Cmd::Inspect { .. }
            | Cmd::Metrics { .. }
            | Cmd::Layout { .. }
    ) {
        // SAFETY: setting a signal's disposition at start-up, before threads.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    match cli.command {
        Cmd::Version => {
            println!(
                "ebpf-cni {}{}\nCNI spec versions: {}\neBPF programs: {}",
                env!("CARGO_PKG_VERSION"),
                if crate::test_hooks::ENABLED {
                    " (a test build: it reads the test hooks)"
                } else {
                    ""
                },
                crate::cni::version::SUPPORTED_VERSIONS.join(", "),
                if bpf::programs_embedded() {
                    format!("embedded, revision {}", bpf::revision())
                } else {
                    "not embedded".into()
                }
            );
            0
        }
        Cmd::Trace { seconds, netns } => match trace(seconds, netns) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("ebpf-cni trace: {e}");
                1
            }
        },
        Cmd::Inspect { json, netns } => match inspect(json, netns) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("ebpf-cni inspect: {e}");
                1
            }
        },
        Cmd::Metrics {
            netns,
            output,
            listen,
        } => match metrics(netns, output, listen) {
            Ok(()) => 0,
            Err(e) => {
                // The cause (e.g. "Address already in use") follows the context that names
                // the address or file: our errors never repeat their source.
                eprintln!("ebpf-cni metrics: {}", chain(e.as_ref()));
                1
            }
        },
        Cmd::Agent {
            conf,
            netns,
            resync,
            services_poll,
            once,
            metrics_listen,
            cluster,
        } => match agent(
            conf,
            netns,
            resync,
            services_poll,
            once,
            metrics_listen,
            &cluster,
        ) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("ebpf-cni agent: {}", chain(e.as_ref()));
                1
            }
        },
        Cmd::Install(args) => match crate::install::install(&args) {
            Ok(report) => {
                println!("{report}");
                0
            }
            Err(e) => {
                eprintln!("ebpf-cni install: {}", chain(&e));
                e.exit_code()
            }
        },
        Cmd::Layout { file } => match layout(file) {
            Ok((path, l)) => {
                println!("{}: {l}", path.display());
                0
            }
            Err(e) => {
                eprintln!("ebpf-cni layout: {}", chain(&e));
                1
            }
        },
        Cmd::Uninstall(args) => match crate::install::uninstall(&args) {
            Ok(report) => {
                println!("{report}");
                0
            }
            Err(e) => {
                eprintln!("ebpf-cni uninstall: {}", chain(&e));
                e.exit_code()
            }
        },
    }
}

/// Lays `file` (default: this binary) out in the page cache, from a copy of this binary
/// in memory when it is the binary this process runs from.
fn layout(
    file: Option<PathBuf>,
) -> Result<(PathBuf, crate::page_cache::Layout), crate::page_cache::LayoutError> {
    use crate::page_cache::{exec_from_memory, is_running_binary, lay_out, LayoutError};
    let path = match file {
        Some(p) => p,
        None => std::env::current_exe().map_err(|source| LayoutError::Open {
            path: "/proc/self/exe".into(),
            source,
        })?,
    };
    if is_running_binary(&path) {
        return Err(exec_from_memory(
            &path,
            &["layout".as_ref(), path.as_os_str()],
        ));
    }
    lay_out(&path).map(|l| (path, l))
}

/// One exposition of `node`, read from its pins now.
fn exposition(node: &NodeId) -> Result<String, bpf::BpfError> {
    let t = std::time::Instant::now();
    let report = bpf::inspect(node, bpf::Links::Skip)?;
    Ok(crate::report::exposition(
        &report,
        t.elapsed().as_secs_f64(),
    ))
}

/// Serves `node`'s metrics at `addr` until the process ends.
fn serve_metrics(
    node: NodeId,
    addr: std::net::SocketAddr,
) -> Result<(), crate::metrics::http::ServeError> {
    // A scraper that goes away mid-answer must cost one failed write, not the server
    // (`metrics` runs with SIGPIPE's default disposition, which ends the process).
    // SAFETY: changing a signal's disposition before any connection thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let scrape = move || exposition(&node).map_err(|e| chain(&e));
    crate::metrics::http::serve(addr, std::sync::Arc::new(scrape), |bound| {
        eprintln!("serving the metrics of {node} at http://{bound}/metrics");
    })
}

fn metrics(
    netns: Option<PathBuf>,
    output: Option<PathBuf>,
    listen: Option<std::net::SocketAddr>,
) -> Result<(), Box<dyn std::error::Error>> {
    let node = node_of(netns)?;
    if let Some(addr) = listen {
        serve_metrics(node, addr)?;
        return Ok(());
    }
    let text = exposition(&node)?;
    match output {
        Some(path) => crate::metrics::output::write_atomically(&path, &text)?,
        None => print!("{text}"),
    }
    Ok(())
}

fn agent(
    conf: Option<PathBuf>,
    netns: Option<PathBuf>,
    resync: u64,
    services_poll: u64,
    once: bool,
    metrics_listen: Option<std::net::SocketAddr>,
    cluster: &crate::cluster::ClusterArgs,
) -> Result<(), Box<dyn std::error::Error>> {
    // What changed is the agent's output: said unless EBPF_CNI_LOG asks otherwise.
    if std::env::var_os("EBPF_CNI_LOG").is_none() {
        log::set_max_level(log::LevelFilter::Info);
    }
    // The main thread enters the node for good: the runtime and the events socket live in
    // it, and so do the cluster source's connections (its thread is started from it).
    let _node_ns = match &netns {
        Some(p) => Some(Netns::open(p)?.enter()?),
        None => None,
    };
    if cluster.leave {
        let released = crate::cluster::leave(cluster)?;
        let released: Vec<String> = released.iter().map(ToString::to_string).collect();
        eprintln!(
            "ebpf-cni agent: the node left the cluster network; its subnets are free: {}",
            if released.is_empty() {
                "(it held none)".to_owned()
            } else {
                released.join(", ")
            }
        );
        return Ok(());
    }
    // Joined before the conflist is read: the join may have written it.
    crate::cluster::start(cluster, conf.as_deref(), crate::agent::converge_for)?;
    let conf = crate::agent::network_conf(conf.as_deref())?;
    let node = NodeId::current()?;
    if let Some(addr) = metrics_listen {
        std::thread::spawn(move || {
            if let Err(e) = serve_metrics(node, addr) {
                eprintln!("ebpf-cni agent: {}", chain(&e));
                std::process::exit(1);
            }
        });
    }
    eprintln!(
        "ebpf-cni agent: node {node} follows its devices and addresses (resync every {resync} s) and kube-proxy's rules (every {services_poll} s)"
    );
    crate::agent::run(
        &conf,
        std::time::Duration::from_secs(resync),
        std::time::Duration::from_secs(services_poll.max(1)),
        once,
    )?;
    Ok(())
}

fn node_of(netns: Option<PathBuf>) -> Result<NodeId, Box<dyn std::error::Error>> {
    Ok(match netns {
        Some(p) => NodeId::from_netns_inode(Netns::open(&p)?.inode()),
        None => NodeId::current()?,
    })
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn trace(seconds: Option<u64>, netns: Option<PathBuf>) -> Result<(), Box<dyn std::error::Error>> {
    let node = node_of(netns)?;
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    eprintln!("tracing {node}; Ctrl-C to stop");
    bpf::trace(&node, seconds.map(Duration::from_secs), &STOP)?;
    Ok(())
}

/// Fills in `attached` of the netlink-mode entries: the kernel's filter list of each device
/// must name the program (the pinned record alone proves nothing).
fn confirm_netlink_filters(
    r: &mut bpf::NodeReport,
    netns: Option<&PathBuf>,
) -> Result<(), Box<dyn std::error::Error>> {
    let ns = netns.map(|p| Netns::open(p)).transpose()?;
    crate::block_on(async {
        let nl = match &ns {
            Some(ns) => Netlink::connect_in(ns)?,
            None => Netlink::connect()?,
        };
        let mut entries: Vec<(Option<&str>, &mut bpf::LinkReport)> = Vec::new();
        for d in &mut r.devices {
            if let Some(l) = d.link.as_mut() {
                entries.push((Some(d.name.as_str()), l));
            }
        }
        for a in &mut r.attachments {
            for l in &mut a.links {
                entries.push((None, l));
            }
        }
        for (name, l) in entries.into_iter().filter(|(_, l)| l.mode == "netlink") {
            if let Some(name) = name {
                if let Some(link) = nl.link_by_name(name).await? {
                    l.ifindex = link.index;
                }
            }
            if l.ifindex == 0 {
                continue;
            }
            let ingress = l.hook != "to_pod";
            l.attached = nl
                .bpf_filters(l.ifindex, ingress)
                .await?
                .contains(&l.program);
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
}

fn inspect(json: bool, netns: Option<PathBuf>) -> Result<(), Box<dyn std::error::Error>> {
    let node = node_of(netns.clone())?;
    let mut r = bpf::inspect(&node, bpf::Links::Read)?;
    confirm_netlink_filters(&mut r, netns.as_ref())?;
    {
        // Found by netlink in the node's namespace: the filters, and the rule dumps.
        let _in_node = match &netns {
            Some(p) => Some(Netns::open(p)?.enter()?),
            None => None,
        };
        r.unpinned = bpf::unpinned_filters(&node);
        if let Some(s) = r.services.as_mut() {
            s.forward_firewall = crate::firewall::detect();
        }
        if let Some(m) = r.masquerade.as_mut() {
            m.kube_proxy_ports = crate::netfilter::masq_ports::current()
                .ok()
                .flatten()
                .map(|g| format!("{}-{}", g.ports.0, g.ports.1));
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    print!("{}", crate::report::inspect(&r));
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Two flattened setting groups with a field of one name (the etcd and Kubernetes CA
    /// files) clash at the first parse, which no other unit test makes.
    #[test]
    fn the_commands_and_their_flags_are_consistent() {
        super::Cli::command().debug_assert();
    }
}
