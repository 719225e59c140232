//! RESULTS.md: the headline, the targets, the subjects, the machine and the parameters,
//! the charts, then each section's tables with their notes, and the method.

use std::fmt::Write as _;

use crate::format::thousands;
use crate::model::{Cell, Subject};
use crate::params::Section;
use crate::run::Run;
use crate::sections::cleanup::{self, Scenario};
use crate::sections::masquerade;

use super::charts::Charts;
use super::headline::headline;
use super::table::{escape, md_table};
use super::targets::targets;

pub fn markdown(run: &Run, charts: &Charts) -> String {
    let m = &run.machine;
    let p = &run.params;
    let mut s = String::new();
    let _ = writeln!(s, "# ebpf-cni benchmark report\n");
    let _ = writeln!(
        s,
        "`{}` — {}. Measured {} on {} ({} cores, {:.1} GiB), kernel {}, revision {}. The run \
         took {} min {} s.\n",
        run.command,
        if p.quick {
            "**quick run**: short and single-repeat, for CI; its figures are indicative only"
        } else {
            "full run"
        },
        m.date_utc,
        m.cpu,
        m.cores,
        m.memory_gib,
        m.kernel,
        m.git_revision,
        run.total.as_secs() / 60,
        run.total.as_secs() % 60
    );
    let _ = writeln!(
        s,
        "Subjects: the **reference chain** (Debian's ptp + host-local + portmap + bandwidth, \
         {}), **ebpf-cni** ({}; binary: {}) and a **plain veth** pair between two namespaces (the \
         physical limit). Both CNI subjects are driven as a runtime drives them, from inside \
         a test-made node namespace, alternating within every repeat. Ratios are ebpf-cni / \
         reference chain (medians).\n",
        m.versions
            .iter()
            .find(|(t, _)| t.starts_with("reference"))
            .map_or("", |(_, v)| v.as_str()),
        m.versions
            .iter()
            .find(|(t, _)| t == "ebpf-cni")
            .map_or("", |(_, v)| v.as_str()),
        m.versions
            .iter()
            .find(|(t, _)| t == "ebpf-cni binary")
            .map_or("", |(_, v)| v.as_str())
    );

    s.push_str(&md_table(&headline(run), "##"));

    let _ = writeln!(s, "## Targets\n");
    let _ = writeln!(s, "| goal | ebpf-cni | reference chain | status |");
    let _ = writeln!(s, "|---|---|---|---|");
    for t in targets(run) {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            t.goal,
            escape(&t.ebpf),
            escape(&t.reference),
            escape(&t.status)
        );
    }
    if p.quick {
        let _ = writeln!(
            s,
            "\nA quick run is too short to judge targets; the full run's report is the one \
             that counts."
        );
    }
    s.push('\n');

    let _ = writeln!(s, "## Subjects and what each provided\n");
    let _ = writeln!(
        s,
        "| subject | what runs | hostPort (portMappings) | bandwidth limits |"
    );
    let _ = writeln!(s, "|---|---|---|---|");
    let hp = |subj: Subject| match run.traffic.as_ref().and_then(|t| t.hostport.get(&subj)) {
        Some(Ok(())) => "provided (probe: external client → hostPort → pod echoed)".to_owned(),
        Some(Err(e)) => format!("not provided — probe: {}", escape(e)),
        None => "not probed (traffic section not run)".to_owned(),
    };
    let bwp = |subj: Subject| match run.bandwidth.as_ref().and_then(|b| b.enforced.get(&subj)) {
        Some(Ok(())) => "enforced".to_owned(),
        Some(Err(e)) => format!("not enforced — {}", escape(e)),
        None => "not probed (bandwidth section not run or failed)".to_owned(),
    };
    let _ = writeln!(
        s,
        "| reference chain | `ptp` (ipMasq off but in the masquerade section, MTU 1500, \
         host-local IPAM) → `portmap` \
         (capability portMappings, snat on) → `bandwidth` (capability bandwidth) | {} | {} |",
        hp(Subject::Reference),
        bwp(Subject::Reference)
    );
    let _ = writeln!(
        s,
        "| ebpf-cni | `ebpf-cni` alone (same IPAM, MTU and ipMasq, capabilities portMappings and \
         bandwidth, so it receives the same runtimeConfig) | {} | {} |",
        hp(Subject::EbpfCni),
        bwp(Subject::EbpfCni)
    );
    let _ = writeln!(
        s,
        "| plain veth | two namespaces, one veth pair, 10.99.0.1/24 ↔ 10.99.0.2/24, MTU 1500 | — | — |\n"
    );
    let _ = writeln!(
        s,
        "Both lists use cniVersion 1.0.0 and the IPv4 range {} (plus {} for the dual-stack \
         rows), and receive runtimeConfig in containerd's spelling (`HostPort`, `IngressRate`, …). Every node \
         has an uplink veth to an \"external\" client namespace (node 192.168.77.1, client \
         192.168.77.2) before its first pod. The masquerade section alone sets `ipMasq: true` \
         on both lists (ptp's and ebpf-cni's) and gives the external client no route to the \
         pods.\n",
        crate::rig::topo::POD_SUBNET_V4,
        crate::rig::topo::POD_SUBNET_V6
    );

    let _ = writeln!(s, "## Machine and versions\n");
    let _ = writeln!(s, "- Date: {}", m.date_utc);
    let _ = writeln!(s, "- CPU: {}, {} cores", m.cpu, m.cores);
    let _ = writeln!(s, "- Memory: {:.1} GiB", m.memory_gib);
    let _ = writeln!(s, "- Kernel: {}", m.kernel);
    let _ = writeln!(
        s,
        "- TCP congestion control: {}; load average at start: {} (the machine is shared)",
        m.tcp_congestion_control, m.load_average
    );
    let _ = writeln!(s, "- Revision: {}", m.git_revision);
    for (tool, v) in &m.versions {
        let _ = writeln!(s, "- {tool}: {v}");
    }
    s.push('\n');

    let _ = writeln!(s, "## Parameters\n");
    let rates: Vec<String> = p
        .bw_rates
        .iter()
        .map(|r| format!("{} Mbit/s", r / 1_000_000))
        .collect();
    let ks: Vec<String> = p.scale_ks.iter().map(|k| thousands(*k)).collect();
    for line in [
        format!(
            "Lifecycle: {} repeat(s) × {} sequential coexisting IPv4 pods per subject, {} \
             concurrent ADDs then DELs, and {} dual-stack pods.",
            p.repeats, p.pods, p.concurrent, p.dual_pods
        ),
        format!(
            "Traffic: {} repeat(s); iperf3 -t {} -O {}; TCP_RR and TCP_CRR {} s per figure.",
            p.repeats, p.iperf_secs, p.iperf_omit, p.rr_secs
        ),
        format!(
            "Port-map scale: K ∈ {{{}}}, {} mappings per pod, {} connections per point, {} \
             extra ADD/DEL (of a pod with {} mappings) per point, {} s install budget per \
             subject and series; pod-density series: K ∈ {{{}}}, {} mappings per pod.",
            ks.join(", "),
            p.scale_ports_per_pod,
            p.scale_connects,
            p.scale_extra_adds,
            p.scale_extra_ports,
            p.scale_budget.as_secs(),
            p.density_ks
                .iter()
                .map(|k| thousands(*k))
                .collect::<Vec<_>>()
                .join(", "),
            p.density_ports_per_pod
        ),
        format!(
            "Bandwidth: {} repeat(s); limits {}; iperf3 -t {} -O {}; UDP at twice the limit.",
            p.bw_repeats,
            rates.join(", "),
            p.bw_secs,
            p.bw_omit
        ),
        "Cleanup: one node per subject, a warm-up pod added and deleted, then a resident \
         pod; four DEL scenarios, each on a fresh pod with a hostPort and a 100 Mbit/s limit."
            .into(),
        format!(
            "Masquerade: {} repeat(s); iperf3 -t {} -O {}; TCP_CRR {} s per figure; {} UDP \
             flows from one pod.",
            p.repeats,
            p.iperf_secs,
            p.iperf_omit,
            p.rr_secs,
            thousands(p.masq_flows)
        ),
        format!(
            "Metrics: {} pods on one ebpf-cni node, `ebpf-cni metrics` run {} time(s) after \
             one warm-up run.",
            thousands(p.metrics_pods),
            p.metrics_runs
        ),
        format!(
            "Source check: {} repeat(s), ebpf-cni with the check on and off; iperf3 -t {} -O \
             {}; TCP_RR and TCP_CRR {} s per figure.",
            p.repeats, p.iperf_secs, p.iperf_omit, p.rr_secs
        ),
        format!(
            "Node: {} pods with a host port each; STATUS run {} time(s) in line and {} time(s) \
             converging; the agent follows {} VIP change(s).",
            p.node_pods,
            p.node_runs,
            2 * p.node_runs,
            p.node_agent_changes
        ),
        format!(
            "Cluster: {} Node objects from a stand-in API server, the agent's start timed \
             once; {} Node event(s) timed to the first reply between pods.",
            thousands(p.cluster_nodes),
            p.cluster_events
        ),
    ] {
        let _ = writeln!(s, "- {line}");
    }
    s.push('\n');

    if !charts.is_empty() {
        let _ = writeln!(s, "## Charts\n");
        for (title, file) in charts {
            let _ = writeln!(s, "![{title}]({file})\n");
        }
    }

    let skipped = |sec: Section| -> Option<String> {
        run.skipped
            .iter()
            .find(|(x, _)| *x == sec)
            .map(|(_, why)| format!("_Section {sec:?}: {why}._\n\n"))
    };

    let _ = writeln!(s, "## 1. Lifecycle\n");
    if let Some(l) = &run.lifecycle {
        s.push_str(&md_table(&l.latency, "###"));
        s.push_str(&md_table(&l.dual_stack, "###"));
        s.push_str(&md_table(&l.cost, "###"));
        s.push_str(&md_table(&l.concurrency, "###"));
    }
    s.extend(skipped(Section::Lifecycle));

    let _ = writeln!(s, "## 2. Dataplane\n");
    if let Some(t) = &run.traffic {
        s.push_str(&md_table(&t.throughput, "###"));
        s.push_str(&md_table(&t.rr, "###"));
    }
    s.extend(skipped(Section::Traffic));

    let _ = writeln!(s, "## 3. Port-map scale\n");
    if let Some(sc) = &run.scale {
        s.push_str(&md_table(&sc.table, "###"));
        if let Some(d) = &sc.density {
            s.push_str(&md_table(d, "###"));
        }
    }
    s.extend(skipped(Section::Scale));

    let _ = writeln!(s, "## 4. Bandwidth\n");
    if let Some(b) = &run.bandwidth {
        s.push_str(&md_table(&b.table, "###"));
    }
    s.extend(skipped(Section::Bandwidth));

    let _ = writeln!(s, "## 5. Cleanup\n");
    if let Some(c) = &run.cleanup {
        s.push_str(&cleanup_md(c));
    }
    s.extend(skipped(Section::Cleanup));

    let _ = writeln!(s, "## 6. Masquerade\n");
    if let Some(m) = &run.masquerade {
        s.push_str(&masquerade_md(run, m));
    }
    s.extend(skipped(Section::Masquerade));

    let _ = writeln!(s, "## 7. Metrics\n");
    if let Some(m) = &run.metrics {
        s.push_str(&md_table(&m.table, "###"));
    }
    s.extend(skipped(Section::Metrics));

    let _ = writeln!(s, "## 8. Source check\n");
    if let Some(sc) = &run.source_check {
        s.push_str(&md_table(&sc.table, "###"));
    }
    s.extend(skipped(Section::SourceCheck));

    let _ = writeln!(s, "## 9. The node following its addresses\n");
    if let Some(n) = &run.node {
        s.push_str(&md_table(&n.table, "###"));
    }
    s.extend(skipped(Section::Node));

    let _ = writeln!(s, "## 10. Pod → pod, part by part\n");
    if let Some(pp) = &run.pod_path {
        s.push_str(&md_table(&pp.table, "###"));
    }
    s.extend(skipped(Section::PodPath));

    let _ = writeln!(s, "## 11. XDP on the uplink\n");
    if let Some(x) = &run.xdp {
        s.push_str(&md_table(&x.table, "###"));
    }
    s.extend(skipped(Section::Xdp));

    let _ = writeln!(s, "## 12. Pod → pod over netkit\n");
    if let Some(n) = &run.netkit {
        s.push_str(&md_table(&n.table, "###"));
        s.push_str(&md_table(&n.ext, "###"));
    }
    s.extend(skipped(Section::Netkit));

    let _ = writeln!(s, "## 13. Services next to kube-proxy\n");
    if let Some(sv) = &run.services {
        s.push_str(&md_table(&sv.table, "###"));
    }
    s.extend(skipped(Section::Services));

    let _ = writeln!(s, "## 14. The cluster network\n");
    if let Some(c) = &run.cluster {
        s.push_str(&md_table(&c.table, "###"));
        s.push_str(&md_table(&c.etcd, "###"));
        s.push_str(&md_table(&c.traffic, "###"));
    }
    s.extend(skipped(Section::Cluster));

    let _ = writeln!(s, "## Not measurable yet\n");
    let mut missing: Vec<String> = Vec::new();
    for t in run.tables() {
        for r in &t.rows {
            if let Cell::NotImplemented { why } = r.cell(Subject::EbpfCni) {
                let line = format!("ebpf-cni: {why}");
                if !missing.contains(&line) {
                    missing.push(line);
                }
            }
        }
    }
    if missing.is_empty() {
        let _ = writeln!(s, "Every metric has figures for both subjects.\n");
    } else {
        for m in missing {
            let _ = writeln!(s, "- {}", escape(&m));
        }
        let _ = writeln!(
            s,
            "\nThe bench probes each feature at run time, so these rows fill in by themselves \
             once the plugin provides the feature.\n"
        );
    }

    let _ = writeln!(s, "## Method\n");
    for line in [
        "Each plugin is forked with only its network namespace switched to the node's \
         (setns between fork and exec; never `ip netns exec`, which would hide the host's \
         bpffs) and reaped with wait4, which gives exact wall time and the rusage of the \
         plugin and every child it waited for.",
        "Every binary the sections run (ebpf-cni's, the kernel floor's, the reference \
         plugins') is dropped from the page cache before they start, so each starts from \
         disk as on a node after a reboot: a binary the build has just written sits in the \
         page cache in large folios, which an exec maps a whole folio per fault, and would \
         take fewer page faults than the same bytes read back. Then ebpf-cni's binary and \
         the floor's are read back in 2 MiB folios with `ebpf-cni layout`, as ebpf-cni's \
         install and its boot-time `ebpf-cni layout` leave the plugin on a node; the \
         reference plugins stay as an exec reads them.",
        "Subjects alternate within each repeat (reference, ebpf-cni, veth; pod by pod in \
         the lifecycle section), so the noise of this shared 2-core machine hits all of them; \
         tables give medians with the range over repeats, never a single best run.",
        "The TCP_RR/TCP_CRR clients and echo server run inside the benchmark's binary (built \
         in cargo's dev profile, as `cargo xtask bench` runs it); they cost every subject the \
         same. \
         Bulk throughput uses iperf3.",
        "Nothing here asserts a timing: `cargo xtask bench` fails only when a measurement \
         fails (a plugin error, a broken path).",
        "Re-run: `cargo xtask bench` (full, writes bench/) or `cargo xtask bench --quick` \
         (CI, writes into cargo's target directory); `--only lifecycle,traffic` runs a \
         subset, `--plugin PATH` benchmarks a given binary.",
    ] {
        let _ = writeln!(s, "- {line}");
    }
    s.push('\n');
    let _ = writeln!(s, "Section run times: {}.", {
        let v: Vec<String> = run
            .section_secs
            .iter()
            .map(|(sec, t)| format!("{sec:?} {t:.0} s"))
            .collect();
        v.join(", ")
    });
    s
}

fn masquerade_md(run: &Run, m: &masquerade::Output) -> String {
    let p = &run.params;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Method: both CNI subjects with `ipMasq: true` (the reference chain's ptp, so \
         iptables MASQUERADE and netfilter conntrack, then portmap and bandwidth; ebpf-cni's \
         eBPF source NAT, no iptables, no conntrack), on one masquerading node each, in the \
         same run. The node's uplink veth leads to an external host ({ext}) that has no \
         route to the pod network ({pods}), so a pod's traffic works only if it leaves with \
         the node's address ({node}); a probe checks that the external host sees a TCP \
         connection and a UDP datagram of a pod come from {node} before anything is \
         measured, and a subject that fails it has no figures. Measured from a pod to the \
         external host: single-stream TCP throughput (iperf3) and TCP_CRR (connections per \
         second, each a new connection, one 1-byte exchange, close), subjects alternating \
         within each of {repeats} repeat(s), medians with their range; then, on a fresh node \
         per subject, how many of {flows} UDP flows opened at once from one pod the node's \
         flow table holds, and how many new flows it dropped (ebpf-cni: its masquerade \
         table; the reference: the node's conntrack table, nf_conntrack_max at its \
         default).\n",
        ext = crate::rig::topo::EXT_IP,
        pods = crate::rig::topo::POD_SUBNET_V4,
        node = crate::rig::topo::NODE_UPLINK_IP,
        repeats = p.repeats,
        flows = thousands(p.masq_flows),
    );
    let _ = writeln!(s, "Probe (what the external host saw):\n");
    for subj in Subject::CNI {
        let text = match m.probe.get(&subj) {
            Some(Ok(seen)) => seen.clone(),
            Some(Err(e)) => format!("**failed**: {e}"),
            None => "not probed".to_owned(),
        };
        let _ = writeln!(s, "- {}: {}", subj.label(), escape(&text));
    }
    s.push('\n');
    s.push_str(&md_table(&m.traffic, "###"));
    s.push_str(&md_table(&m.flows, "###"));
    s
}

fn cleanup_md(c: &cleanup::Output) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "### Leftovers after each DEL scenario\n");
    let _ = writeln!(
        s,
        "_Cells: the DELs' outcomes, then what the node has that it did not have before the \
         scenario's ADD ({})._\n",
        cleanup::CATEGORIES.join(", ")
    );
    let _ = writeln!(s, "| scenario | reference chain | ebpf-cni |");
    let _ = writeln!(s, "|---|---|---|");
    let mut details = Vec::new();
    for sc in Scenario::ALL {
        let mut line = format!("| {} |", escape(sc.label()));
        for subj in Subject::CNI {
            let text = match c.outcomes.get(&sc).and_then(|m| m.get(&subj)) {
                None => "not run".to_owned(),
                Some(o) => match &o.error {
                    Some(e) => format!("**failed**: {}", escape(e)),
                    None => {
                        let dels = o.dels.join(", then ");
                        let left = if o.leftovers.is_empty() {
                            "nothing left".to_owned()
                        } else {
                            let parts: Vec<String> = o
                                .leftovers
                                .iter()
                                .map(|(cat, items)| format!("{} {cat}", items.len()))
                                .collect();
                            for (cat, items) in &o.leftovers {
                                for item in items.iter().take(6) {
                                    details.push(format!(
                                        "{} / {} / {cat}: `{}`",
                                        subj.label(),
                                        sc.label(),
                                        item.replace('`', "'")
                                    ));
                                }
                                if items.len() > 6 {
                                    details.push(format!(
                                        "{} / {} / {cat}: … and {} more",
                                        subj.label(),
                                        sc.label(),
                                        items.len() - 6
                                    ));
                                }
                            }
                            format!("**left: {}**", parts.join(", "))
                        };
                        format!("DEL {}; {left}", escape(&dels))
                    }
                },
            };
            let _ = write!(line, " {text} |");
        }
        let _ = writeln!(s, "{line}");
    }
    s.push('\n');
    if !details.is_empty() {
        let _ = writeln!(s, "What was left:\n");
        for d in details {
            let _ = writeln!(s, "- {}", escape(&d));
        }
        s.push('\n');
    }
    s
}
