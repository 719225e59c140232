//! The node following its devices and addresses: STATUS on a node of
//! `node_pods` pods, each with a host port, when nothing changed (what containerd 2.x pays
//! every 5 s: the target is p50 ≤ 5 ms) and when a VIP was just added to or removed from
//! the uplink (STATUS then converges the node); then `ebpf-cni agent` on the same node: how
//! long after `ip addr add` it says wildcard host ports answer on the VIP, and its resident
//! memory.
//!
//! Only ebpf-cni has this: the reference chain's host ports are iptables rules for the
//! addresses matched at each packet (`--dst-type LOCAL`), with nothing to converge.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use ebpf_cni_tests::agent::AgentProcess;
use serde_json::Value;

use crate::log::progress;
use crate::metric::Metric;
use crate::model::{Cell, Repeats, Subject, Table};
use crate::params::Params;
use crate::rig::exec;
use crate::rig::topo::{self, BenchNode, Binaries};

const FIRST_HOST_PORT: usize = 20_000;
const CONTAINER_PORT: u16 = 80;
const VIP: &str = "192.168.77.200";

pub struct Output {
    pub table: Table,
    pub pods: usize,
}

#[derive(Default)]
struct Figures {
    in_line: Repeats,
    converging: Repeats,
    agent_follows: Repeats,
    agent_rss: Repeats,
}

pub fn run(p: &Params, bins: &Binaries) -> Output {
    let mut f = Figures::default();
    if let Err(e) = measure(p, bins, &mut f) {
        progress(&format!("node: failed: {e:#}"));
        for r in [
            &mut f.in_line,
            &mut f.converging,
            &mut f.agent_follows,
            &mut f.agent_rss,
        ] {
            r.set_instead(Subject::EbpfCni, Cell::failed(&e));
        }
    }
    let n = p.node_pods;
    let mut table = Table::new(
        &format!("The node following its addresses, {n} pods"),
        format!(
            "median [min–max] over {} STATUS run(s) each and {} VIP change(s) for the agent",
            p.node_runs, p.node_agent_changes
        ),
    );
    table.rows = vec![
        f.in_line.row(Metric::StatusInLine { pods: n }),
        f.converging.row(Metric::StatusConverging { pods: n }),
        f.agent_follows.row(Metric::AgentFollows { pods: n }),
        f.agent_rss.row(Metric::AgentRss),
    ];
    table.notes = vec![
        format!(
            "One ebpf-cni node with {n} pods, each with one host port ({FIRST_HOST_PORT}+i → \
             {CONTAINER_PORT}/tcp). STATUS (cniVersion 1.1.0) run in the node's namespace as a \
             runtime runs it, from start to exit, started as Go's os/exec starts it \
             (posix_spawn from a thread in the node's namespace: no copy of the bench's \
             page tables): with the node in line (nothing written), \
             and right after {VIP}/32 was added to or removed from the uplink (STATUS then \
             converges: the address joins or leaves the host-port addresses, and its record \
             is written)."
        ),
        "Agent: `ebpf-cni agent --netns <node>`, from `ip addr add` of the VIP returning to \
         the agent's line saying host ports answer on it (its rtnetlink announcement, the \
         100 ms it gathers announcements, and the convergence); its VmRSS after the changes."
            .to_owned(),
        "The reference chain has no column: its host ports are iptables rules that match \
         the node's addresses at each packet, with nothing to converge."
            .to_owned(),
    ];
    Output {
        table,
        pods: p.node_pods,
    }
}

fn measure(p: &Params, bins: &Binaries, f: &mut Figures) -> Result<()> {
    let node = BenchNode::new(Subject::EbpfCni, bins)?;
    let mut pods = Vec::with_capacity(p.node_pods);
    for i in 0..p.node_pods {
        let host_port = u16::try_from(FIRST_HOST_PORT + i).context("more pods than host ports")?;
        let (pod, _) = node.add_pod(
            &format!("node-{i}"),
            topo::caps(&[(host_port, CONTAINER_PORT)], None),
        )?;
        pods.push(pod);
    }
    let netns = node.node.netns();
    let uplink = node.external.node_dev().to_owned();
    let mut conf = node.chain.list.exec_config(0, &Default::default(), None);
    conf["cniVersion"] = Value::from("1.1.0");
    let conf = conf.to_string();
    let status = || -> Result<Duration> {
        // Started as containerd starts it (see `exec::Spawn::Vfork`): this section runs
        // late, when the bench's own memory would make a fork cost milliseconds.
        let out = exec::run_spawned(
            exec::Spawn::Vfork,
            &bins.ebpf_cni,
            &[],
            Some(netns.path()),
            &[("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/nonexistent")],
            conf.as_bytes(),
        )?;
        if out.code != Some(0) {
            bail!("STATUS failed ({:?}): {}", out.code, out.stdout.trim());
        }
        Ok(out.wall)
    };
    let vip = |op: &str| netns.ip_ok(&["addr", op, &format!("{VIP}/32"), "dev", &uplink]);
    crate::rig::machine::settle(Duration::from_secs(5));
    status()?;
    for _ in 0..p.node_runs {
        f.in_line.push(Subject::EbpfCni, ms(status()?));
        vip("add")?;
        f.converging.push(Subject::EbpfCni, ms(status()?));
        vip("del")?;
        f.converging.push(Subject::EbpfCni, ms(status()?));
    }

    let mut agent = AgentProcess::start(&bins.ebpf_cni, netns.path(), None, None)?;
    for _ in 0..p.node_agent_changes {
        let t = Instant::now();
        vip("add")?;
        agent.wait_for(
            &format!("host ports answer on {VIP}"),
            Duration::from_secs(10),
        )?;
        f.agent_follows.push(Subject::EbpfCni, ms(t.elapsed()));
        vip("del")?;
        agent.wait_for(
            &format!("no longer answer on {VIP}"),
            Duration::from_secs(10),
        )?;
    }
    f.agent_rss.push(Subject::EbpfCni, agent.rss_mib()?);
    drop(agent);
    let p50 = |r: &Repeats| crate::stats::median(r.values(Subject::EbpfCni));
    progress(&format!(
        "node: {} pods: STATUS in line p50 {:.2} ms, converging p50 {:.2} ms; agent follows in {:.0} ms",
        pods.len(),
        p50(&f.in_line),
        p50(&f.converging),
        p50(&f.agent_follows),
    ));
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
