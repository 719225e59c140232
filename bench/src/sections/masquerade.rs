//! Masquerade (`ipMasq: true` on both subjects): a pod reaching a host outside the pod
//! network that has no route back to it, so that only the node's source NAT makes the path
//! work — the reference chain's ptp through iptables MASQUERADE and netfilter conntrack,
//! ebpf-cni through its eBPF flow tables.
//!
//! Each subject gets a node whose external host (behind the node's uplink) has no route to
//! the pod network; a probe from a pod must reach it with the node's address, over TCP and
//! UDP, before anything is measured. Every repeat then measures single-stream TCP throughput
//! (iperf3) and TCP_CRR from the pod to the external host on each subject in turn. Last,
//! on a fresh node per subject, one pod opens N UDP flows at once towards the external host
//! (a few sockets, each sending one datagram to many distinct ports of it) and the bench
//! counts the flows the dataplane holds and the new flows it dropped: ebpf-cni's masquerade
//! table (`ebpf-cni inspect`), the reference's conntrack table of the node.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context as _, Result};
use ebpf_cni_tests::{dataplane as dp, Netns};
use serde_json::{Map, Value};

use crate::log::progress;
use crate::metric::{MasqSegment, Metric};
use crate::model::{Cell, Repeats, Row, Subject, Summary, Table};
use crate::params::Params;
use crate::rig::load::{self, EchoServer, Iperf3Server, Proto};
use crate::rig::topo::{self, BenchNode, Binaries, Egress, Pod, Stack};
use crate::sections::source_check::BpfStats;
use crate::stats::percentile;
use crate::turns::in_turn;

const IPERF_PORT: u16 = 5201;
const ECHO_PORT: u16 = 7000;
/// The external host's probe listener (TCP) and receiver (UDP).
const PROBE_PORT: u16 = 7001;
/// The flows' destination ports: `FLOW_PORT_BASE ..` on the external host.
const FLOW_PORT_BASE: u16 = 10_000;
/// UDP sockets of the pod the flows are sent from; each sends to N / this many ports.
const FLOW_SOCKETS: usize = 4;
/// Datagrams sent between two 1 ms pauses (so the sender never outruns the softirqs that
/// carry its datagrams through the node: a backlog drop would pass for a dataplane one).
const FLOW_BATCH: usize = 512;
/// CRR time per repeat is split into this many alternating slices.
const RR_SLICES: u32 = 4;
/// ebpf-cni's flow table of the pods' view.
const MASQ_FWD_MAP: &str = "ECNI_MASQ_FWD";

/// What the external host saw of each subject's probe (the source of the TCP connection
/// and of the UDP datagram), or why the probe failed.
pub type Probe = BTreeMap<Subject, std::result::Result<String, String>>;

pub struct Output {
    pub traffic: Table,
    pub flows: Table,
    pub probe: Probe,
}

/// One subject's masquerading node, a pod on it and the servers on its external host.
struct Setup {
    // Servers first: they must stop before their namespaces go.
    _iperf: Iperf3Server,
    _echo: EchoServer,
    pod: Pod,
    node: BenchNode,
}

impl Setup {
    /// With `Egress::Routed` (the control: the same path without translation) the
    /// external host routes the pod network via the node, and nothing is probed.
    fn new(subject: Subject, bins: &Binaries, egress: Egress) -> Result<(Self, String)> {
        let (node, pod, seen) = match egress {
            Egress::Masquerade => masquerading_pod(subject, bins, "masq-client")?,
            Egress::Routed => {
                let node = BenchNode::with_egress(subject, bins, Stack::V4, Egress::Routed)?;
                let (pod, _) = node.add_pod("routed-client", Map::new())?;
                (node, pod, String::new())
            }
        };
        let iperf = Iperf3Server::start(node.ext(), topo::EXT_IP, IPERF_PORT)?;
        let echo = EchoServer::start(node.ext(), ECHO_PORT)?;
        load::probe_echo(&pod.netns, SocketAddr::from((topo::EXT_IP, ECHO_PORT)))
            .context("pod → external host echo")?;
        Ok((
            Self {
                _iperf: iperf,
                _echo: echo,
                pod,
                node,
            },
            seen,
        ))
    }
}

/// A masquerading node of `subject` and one pod on it, checked: the external host has no
/// route to the pod, and sees the pod's TCP connection and UDP datagram come from the
/// node's address. Returns what the probe saw.
fn masquerading_pod(
    subject: Subject,
    bins: &Binaries,
    name: &str,
) -> Result<(BenchNode, Pod, String)> {
    let node = BenchNode::with_egress(subject, bins, Stack::V4, Egress::Masquerade)?;
    let (pod, _) = node.add_pod(name, Map::new())?;
    let pod_ip = pod.ip4()?;
    let route = node
        .ext()
        .ip(&["-4", "route", "get", &pod_ip.to_string()])?;
    if route.status.success() {
        bail!(
            "the external host routes the pod's {pod_ip} ({}): the section needs a host \
             without a route back",
            String::from_utf8_lossy(&route.stdout).trim()
        );
    }
    let seen = probe(node.ext(), &pod.netns).with_context(|| {
        format!(
            "probe pod {pod_ip} → external host {} (no route back: only masquerade makes \
             it work)",
            topo::EXT_IP
        )
    })?;
    Ok((node, pod, seen))
}

/// One TCP connection and one UDP datagram from `pod` to the external host, which must see
/// both come from the node's uplink address.
fn probe(ext: &Netns, pod: &Netns) -> Result<String> {
    let node_ip = IpAddr::V4(topo::NODE_UPLINK_IP);
    let target = SocketAddr::from((topo::EXT_IP, PROBE_PORT));
    let (listener, receiver) = ext.run_in(|| -> std::io::Result<(TcpListener, UdpSocket)> {
        Ok((TcpListener::bind(target)?, UdpSocket::bind(target)?))
    })??;
    let _client = pod
        .run_in(|| TcpStream::connect_timeout(&target, Duration::from_secs(2)))?
        .with_context(|| format!("TCP to {target}"))?;
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + Duration::from_secs(2);
    let tcp_peer = loop {
        match listener.accept() {
            Ok((_, peer)) => break peer,
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e).context("the external host accepting the probe"),
        }
    };
    ensure!(
        tcp_peer.ip() == node_ip,
        "the external host saw the TCP connection come from {tcp_peer}, not from the node's \
         {node_ip}"
    );
    pod.run_in(|| -> std::io::Result<()> {
        let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
        s.send_to(b"probe", target)?;
        Ok(())
    })?
    .context("sending the UDP probe")?;
    receiver.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut buf = [0u8; 16];
    let (_, udp_peer) = receiver
        .recv_from(&mut buf)
        .with_context(|| format!("UDP to {target}: nothing arrived"))?;
    ensure!(
        udp_peer.ip() == node_ip,
        "the external host saw the UDP datagram come from {udp_peer}, not from the node's \
         {node_ip}"
    );
    Ok(format!("TCP from {tcp_peer}, UDP from {udp_peer}"))
}

pub fn run(p: &Params, bins: &Binaries) -> Output {
    let mut setups: Vec<(Subject, Setup)> = Vec::new();
    let mut tput = Repeats::default();
    let mut crr = Repeats::default();
    let mut crr_drops = Repeats::default();
    let mut probe = Probe::new();

    let mut crr_routed = Repeats::default();
    let mut tput_routed = Repeats::default();
    let mut crr_share = Repeats::default();
    let mut prog_ns: BTreeMap<(bool, bool), Repeats> = BTreeMap::new();
    let mut bulk_ns: BTreeMap<bool, Repeats> = BTreeMap::new();
    let mut extra_bulk = Repeats::default();
    let mut extra_crr = Repeats::default();
    let mut extra_conn = Repeats::default();
    let mut routed: Vec<(Subject, Setup)> = Vec::new();
    for s in Subject::CNI {
        match Setup::new(s, bins, Egress::Routed) {
            Ok((setup, _)) => routed.push((s, setup)),
            Err(e) => {
                progress(&format!("masquerade: {} routed: {e:#}", s.label()));
                crr_routed.set_instead(s, Cell::failed(&e));
                tput_routed.set_instead(s, Cell::failed(&e));
            }
        }
    }
    for s in Subject::CNI {
        match Setup::new(s, bins, Egress::Masquerade) {
            Ok((setup, seen)) => {
                probe.insert(s, Ok(seen));
                setups.push((s, setup));
            }
            Err(e) => {
                progress(&format!("masquerade: {}: {e:#}", s.label()));
                probe.insert(s, Err(format!("{e:#}")));
                for r in [&mut tput, &mut crr, &mut crr_drops] {
                    r.set_instead(s, Cell::failed(&e));
                }
            }
        }
    }

    let drops_before: BTreeMap<Subject, Result<Drops>> = setups
        .iter()
        .map(|(s, setup)| (*s, dropped_flows(bins, &setup.node)))
        .collect();
    let slice = Duration::from_secs_f64(p.rr_secs) / RR_SLICES;
    let iperf_target = SocketAddr::from((topo::EXT_IP, IPERF_PORT));
    let echo_target = SocketAddr::from((topo::EXT_IP, ECHO_PORT));
    // Per subject: the repeat, the timed connections of its slices before the failure, why,
    // and what the node's flow table held then.
    let mut crr_failed: BTreeMap<Subject, (usize, usize, String, String)> = BTreeMap::new();
    let mut crr_notes: Vec<String> = Vec::new();
    for rep in 0..p.repeats {
        progress(&format!(
            "masquerade: repeat {}/{}: iperf3 {} s per subject, TCP_CRR {} s each",
            rep + 1,
            p.repeats,
            p.iperf_secs,
            p.rr_secs
        ));
        // Throughput, the subjects and the two paths alternating (statistics off), the
        // subjects' order reversed every other repeat.
        for (list, r) in [(&setups, &mut tput), (&routed, &mut tput_routed)] {
            for (s, setup) in in_turn(list, rep) {
                let ns = &setup.pod.netns;
                match load::iperf3(
                    ns,
                    iperf_target,
                    p.iperf_secs,
                    p.iperf_omit,
                    false,
                    Proto::Tcp,
                ) {
                    Ok(res) => r.push(*s, res.receiver_bps / 1e9),
                    Err(e) => r.set_instead(*s, Cell::failed(&e)),
                }
            }
        }
        let ours = |masq: bool| {
            let list = if masq { &setups } else { &routed };
            list.iter()
                .find(|(s, _)| *s == Subject::EbpfCni)
                .map(|(_, setup)| (&setup.node, &setup.pod.netns))
        };
        // ebpf-cni's `ecni_from_pod` per packet of a bulk stream (an established flow's
        // packets), masqueraded and not: a separate short iperf3 run each, with the
        // statistics on (they cost each program run two clock reads, which the timed
        // throughput above does not pay).
        {
            let stats = BpfStats::on();
            let mut per: BTreeMap<bool, f64> = BTreeMap::new();
            for masq in [true, false] {
                let Some((node, ns)) = ours(masq) else {
                    continue;
                };
                let r = bulk_ns.entry(masq).or_default();
                let figure = stats.as_ref().map_err(|e| anyhow!("{e:#}")).and_then(|_| {
                    let before = prog_stats(node, false)?;
                    load::iperf3(ns, iperf_target, BULK_STATS_SECS, 0, false, Proto::Tcp)?;
                    per_packet(before, prog_stats(node, false)?)
                });
                match figure {
                    Ok(v) => {
                        per.insert(masq, v);
                        r.push(Subject::EbpfCni, v);
                    }
                    Err(e) => r.set_instead(Subject::EbpfCni, Cell::failed(&e)),
                }
            }
            if let (Some(m), Some(u)) = (per.get(&true), per.get(&false)) {
                extra_bulk.push(Subject::EbpfCni, m - u);
            }
        }
        // ebpf-cni's programs' run time over the slices, masqueraded and not.
        let stats = BpfStats::on();
        let before: BTreeMap<(bool, bool), Result<(u64, u64)>> = PROG_FIGURES
            .iter()
            .filter_map(|&(dev, masq)| Some(((dev, masq), prog_stats(ours(masq)?.0, dev))))
            .collect();
        // Short slices, subjects alternating within each, as in the traffic section.
        let mut conns: BTreeMap<Subject, (usize, f64)> = BTreeMap::new();
        let mut routed_conns: BTreeMap<Subject, (usize, f64)> = BTreeMap::new();
        for _ in 0..RR_SLICES {
            for (s, setup) in &routed {
                match load::tcp_crr(&setup.pod.netns, echo_target, slice, p.masq_crr_max) {
                    Ok(c) => {
                        let e = routed_conns.entry(*s).or_default();
                        e.0 += c.connect_us.len();
                        e.1 += c.secs;
                    }
                    Err(e) => crr_routed.set_instead(*s, Cell::failed(&e)),
                }
            }
            for (s, setup) in &setups {
                if crr_failed.contains_key(s) {
                    continue;
                }
                match load::tcp_crr(&setup.pod.netns, echo_target, slice, p.masq_crr_max) {
                    Ok(c) => {
                        let e = conns.entry(*s).or_default();
                        e.0 += c.connect_us.len();
                        e.1 += c.secs;
                    }
                    Err(e) => {
                        let why = format!("{e:#}");
                        progress(&format!("masquerade: TCP_CRR of {}: {why}", s.label()));
                        let earlier = conns.get(s).map_or(0, |c| c.0);
                        let held = held_now(bins, setup);
                        crr_failed.insert(*s, (rep + 1, earlier, why, held));
                    }
                }
            }
        }
        // Per key: run time and runs over the slices.
        let mut spent: BTreeMap<(bool, bool), (u64, u64)> = BTreeMap::new();
        for (key, b) in &before {
            let Some((node, _)) = ours(key.1) else {
                continue;
            };
            let r = prog_ns.entry(*key).or_default();
            let delta = stats.as_ref().map_err(|e| anyhow!("{e:#}")).and_then(|_| {
                let (ns0, n0) = b.as_ref().map_err(|e| anyhow!("{e:#}"))?;
                let (ns1, n1) = prog_stats(node, key.0)?;
                ensure!(n1 > *n0, "the program did not run (statistics off?)");
                Ok((ns1 - ns0, n1 - n0))
            });
            match delta {
                Ok((ns, n)) => {
                    spent.insert(*key, (ns, n));
                    r.push(Subject::EbpfCni, ns as f64 / n as f64);
                }
                Err(e) => r.set_instead(Subject::EbpfCni, Cell::failed(&e)),
            }
        }
        drop(stats);
        let pod_ns = |masq: bool| {
            spent
                .get(&(false, masq))
                .map(|&(ns, n)| ns as f64 / n as f64)
        };
        if let (Some(m), Some(u)) = (pod_ns(true), pod_ns(false)) {
            extra_crr.push(Subject::EbpfCni, m - u);
        }
        // Per connection: every connection the slices made, the untimed warm-ups too (the
        // statistics count their packets).
        let made = |c: &BTreeMap<Subject, (usize, f64)>| {
            c.get(&Subject::EbpfCni)
                .map(|&(n, _)| (n + load::CRR_WARMUP * RR_SLICES as usize) as f64)
        };
        let per_conn = |masq: bool, made: Option<f64>| -> Option<f64> {
            let (a, _) = spent.get(&(false, masq))?;
            let (b, _) = spent.get(&(true, masq))?;
            Some((a + b) as f64 / made?)
        };
        if !crr_failed.contains_key(&Subject::EbpfCni) {
            if let (Some(m), Some(u)) = (
                per_conn(true, made(&conns)),
                per_conn(false, made(&routed_conns)),
            ) {
                extra_conn.push(Subject::EbpfCni, m - u);
            }
        }
        for (s, &(n, secs)) in &conns {
            if !crr_failed.contains_key(s) {
                let rate = n as f64 / secs;
                crr.push(*s, rate);
                if let Some(&(rn, rsecs)) = routed_conns.get(s) {
                    crr_share.push(*s, rate / (rn as f64 / rsecs) * 100.0);
                }
            }
        }
        for (s, (n, secs)) in routed_conns {
            crr_routed.push(s, n as f64 / secs);
        }
    }
    drop(routed);
    for (s, setup) in &setups {
        let drops = match (&drops_before[s], dropped_flows(bins, &setup.node)) {
            (Ok(a), Ok(b)) => Ok(b.since(a)),
            (Err(e), _) => Err(format!("{e:#}")),
            (_, Err(e)) => Err(format!("{e:#}")),
        };
        match &drops {
            Ok(d) => crr_drops.push(*s, d.total() as f64),
            Err(e) => crr_drops.set_instead(*s, Cell::failed(e)),
        }
        if let Some((rep, earlier, why, held)) = crr_failed.get(s) {
            let extra = match &drops {
                Ok(d) if d.total() > 0 => format!("; node dropped: {}", d.describe()),
                _ => String::new(),
            };
            crr.set_instead(*s, Cell::failed(format!("{why}{extra}")));
            crr_notes.push(format!(
                "{}'s TCP_CRR failed in repeat {rep}, after {earlier} timed connections in \
                 the repeat's earlier slices (and {} untimed warm-up ones per slice): {why}. \
                 Then {held}; over all repeats its {} dropped {} new flows ({}).",
                s.label(),
                load::CRR_WARMUP,
                table_name(*s),
                drops.as_ref().map_or(0, Drops::total),
                drops.as_ref().map_or_else(|e| e.clone(), Drops::describe),
            ));
        }
    }
    drop(setups);

    let over = format!("median [min–max] over {} repeat(s)", p.repeats);
    let mut traffic = Table::new("Pod → external host through masquerade", over);
    traffic.rows.push(tput.row(Metric::MasqThroughput));
    traffic
        .rows
        .push(tput_routed.row(Metric::MasqThroughputRouted));
    traffic.rows.push(crr.row(Metric::MasqCrr));
    traffic.rows.push(crr_routed.row(Metric::MasqCrrRouted));
    traffic.rows.push(crr_share.row(Metric::MasqCrrShare));
    traffic.rows.push(crr_drops.row(Metric::MasqDroppedFlows));
    traffic
        .rows
        .push(extra_bulk.row(Metric::MasqExtraNs { bulk: true }));
    traffic
        .rows
        .push(extra_crr.row(Metric::MasqExtraNs { bulk: false }));
    traffic.rows.push(extra_conn.row(Metric::MasqExtraPerConn));
    for masq in [true, false] {
        if let Some(r) = bulk_ns.get(&masq) {
            traffic.rows.push(r.row(Metric::MasqBulkProgNs { masq }));
        }
    }
    for (dev, masq) in PROG_FIGURES {
        if let Some(r) = prog_ns.get(&(dev, masq)) {
            traffic.rows.push(r.row(Metric::MasqProgNs { dev, masq }));
        }
    }
    let mut test_run: BTreeMap<MasqSegment, Repeats> = BTreeMap::new();
    match new_flow_cost(bins) {
        Ok(costs) => {
            for (segment, ns) in costs {
                test_run
                    .entry(segment)
                    .or_default()
                    .push(Subject::EbpfCni, ns);
            }
        }
        Err(e) => {
            progress(&format!("masquerade: BPF_PROG_TEST_RUN: {e:#}"));
            for segment in MasqSegment::ALL {
                test_run
                    .entry(segment)
                    .or_default()
                    .set_instead(Subject::EbpfCni, Cell::failed(&e));
            }
        }
    }
    for (segment, r) in &test_run {
        traffic
            .rows
            .push(r.row(Metric::MasqTestRunNs { segment: *segment }));
    }
    traffic.notes = vec![
        format!(
            "Both subjects with `ipMasq: true`: the reference chain's ptp masquerades with \
             iptables (MASQUERADE, netfilter conntrack), ebpf-cni in eBPF. The external host \
             ({}, behind the node's uplink) has no route to the pod network {}: a probe \
             checks, before anything is measured, that it sees the pod's TCP connection and \
             UDP datagram come from the node's {}.",
            topo::EXT_IP,
            topo::POD_SUBNET_V4,
            topo::NODE_UPLINK_IP
        ),
        format!(
            "Throughput: iperf3 -t {} -O {}, one TCP stream from the pod to the external \
             host, the receiver's rate; the subjects take turns, in the reverse order every \
             other repeat. TCP_CRR: as in the traffic section (connect, 1 byte \
             each way, the server closes, then the client; client and server pinned to CPU \
             {}), {} s per repeat in {RR_SLICES} slices alternating the subjects; every \
             connection is a new masqueraded flow towards the same remote end \
             ({}:{ECHO_PORT}).",
            p.iperf_secs,
            p.iperf_omit,
            load::rr_cpu(),
            p.rr_secs,
            topo::EXT_IP
        ),
        "The control rows: each subject on a second node with ipMasq off, whose external \
         host routes the pod network via the node: the same path without translation, \
         throughput and TCP_CRR measured alternately with the masqueraded ones (ebpf-cni's \
         FIB lookup and bpf_redirect_neigh against the reference's kernel forwarding). The \
         share is each subject's masqueraded TCP_CRR over its untranslated one, per repeat."
            .into(),
        format!(
            "Run time: ebpf-cni's `ecni_from_pod` (the pod's packets) and `ecni_from_dev` \
             (the external host's, at the node's uplink), run_time_ns / run_cnt of the \
             kernel's BPF statistics (kernel.bpf_stats_enabled) on the masquerading node \
             and on the control's. Bulk: a separate {BULK_STATS_SECS} s iperf3 stream per \
             path after the timed ones (statistics off for those): an established flow's \
             packets, most of them GSO. TCP_CRR: over the slices above, where every \
             connection is a new flow (port allocation, often reclaiming an idle flow's \
             port). Masquerade's extra is the masqueraded figure less the untranslated one \
             of the same repeat; per connection, both programs' run time over the slices \
             divided by every connection made (the {} untimed warm-ups per slice \
             included).",
            load::CRR_WARMUP
        ),
        "Dropped new flows: ebpf-cni's `exhausted` + `table_full` counters (`ebpf-cni \
         inspect`), the reference's conntrack `drop` + `early_drop` + `insert_failed` \
         (/proc/net/stat/nf_conntrack of the node), before and after all repeats."
            .into(),
    ];
    traffic.notes.push(format!(
        "BPF_PROG_TEST_RUN: ecni_from_pod alone in the program tests' lab (the object loaded \
         into maps of its own, no node), pod a masquerading with a range of {NEW_FLOW_PORTS} \
         ports, IPv4 TCP towards one remote end as TCP_CRR opens flows: {NEW_FLOW_PASSES} \
         passes over the range, each port's SYN (port free in the first pass; in the later \
         ones the range is full of flows the pod reset over 100 ms before, so each SYN \
         reclaims an idle closed flow's port), its flow's next segment, and a segment of pod \
         b, which does not masquerade. Single runs (a SYN opens its flow once), the median \
         of the kernel's durations of each kind."
    ));
    traffic.notes.extend(crr_notes);

    progress(&format!(
        "masquerade: {} UDP flows from one pod, each subject on a fresh node",
        p.masq_flows
    ));
    let flows = flows_table(p, bins, &mut probe);

    Output {
        traffic,
        flows,
        probe,
    }
}

/// Seconds of each of ebpf-cni's bulk streams measured for run time per packet.
const BULK_STATS_SECS: u32 = 1;

/// The masquerade range of [`new_flow_cost`], and how many times it is gone over.
const NEW_FLOW_PORTS: u16 = 200;
const NEW_FLOW_PASSES: u16 = 8;

/// What a new flow's first packet costs `ecni_from_pod`, in the program tests' lab
/// (`progtest`): IPv4 TCP SYNs from masquerading pod a towards one remote end, with their
/// port free and reclaiming the port of an idle closed flow, against an established flow's
/// segment and a segment of pod b, which does not masquerade; the median of single runs'
/// durations of each kind (see the note in [`run`]).
fn new_flow_cost(bins: &Binaries) -> Result<Vec<(MasqSegment, f64)>> {
    use ebpf_cni_tests::packet::{Pkt, L4, TCP_ACK, TCP_SYN};
    use ebpf_cni_tests::progtest::{Lab, LabPod, Verdict};
    const TCP_RST: u8 = 0x04;
    let obj = xtask::build::staged_object(&bins.ebpf_cni);
    let mut lab = Lab::with_object(&obj)
        .with_context(|| format!("the program lab with {}", obj.display()))?;
    let (a, b) = (lab.a.clone(), lab.b.clone());
    lab.masquerade(&a);
    lab.progs.set_config(ebpf_cni_maps::NodeConfig {
        flags: ebpf_cni_maps::NODE_FLAG_MASQ,
        masq_port_min: 61_000,
        masq_port_max: 61_000 + NEW_FLOW_PORTS - 1,
        ..Default::default()
    });
    let remote = lab.up.remote(true);
    let seg = |p: &LabPod, sport, flags| {
        Pkt::new(p.addr(true), remote, L4::tcp(sport, 80, flags))
            .macs(p.pod_mac, p.host_mac)
            .frame()
    };
    let mut ns: BTreeMap<MasqSegment, Vec<f64>> = BTreeMap::new();
    let mut record = |segment, run: ebpf_cni_tests::progtest::Run| -> Result<()> {
        ensure!(
            run.verdict == Verdict::Redirect,
            "{segment:?}: verdict {:?}, not a redirect",
            run.verdict
        );
        ns.entry(segment).or_default().push(run.ns as f64);
        Ok(())
    };
    for pass in 0..NEW_FLOW_PASSES {
        for i in 0..NEW_FLOW_PORTS {
            let sport = 10_000 + pass * NEW_FLOW_PORTS + i;
            let syn = if pass == 0 {
                MasqSegment::SynPortFree
            } else {
                MasqSegment::SynReclaim
            };
            record(syn, lab.from_pod(&a, &seg(&a, sport, TCP_SYN)))?;
            record(
                MasqSegment::Established,
                lab.from_pod(&a, &seg(&a, sport, TCP_ACK)),
            )?;
            record(
                MasqSegment::Routed,
                lab.from_pod(&b, &seg(&b, sport, TCP_ACK)),
            )?;
            // RST: the flow is closed, idle past its timeout 100 ms on.
            lab.from_pod(&a, &seg(&a, sport, TCP_RST | TCP_ACK));
        }
        std::thread::sleep(Duration::from_millis(150));
    }
    let stats = lab.progs.masq_stats();
    ensure!(
        stats.exhausted == 0,
        "{} SYNs found no port (reclaimed {})",
        stats.exhausted,
        stats.reclaimed
    );
    Ok(ns
        .into_iter()
        .map(|(segment, v)| (segment, percentile(&v, 50.0)))
        .collect())
}

/// Run time per run between two readings of a program's statistics.
fn per_packet(before: (u64, u64), after: (u64, u64)) -> Result<f64> {
    ensure!(
        after.1 > before.1,
        "the program did not run (statistics off?)"
    );
    Ok((after.0 - before.0) as f64 / (after.1 - before.1) as f64)
}

/// The run-time figures, (`ecni_from_dev` rather than `ecni_from_pod`, masqueraded), in
/// the order they are reported.
const PROG_FIGURES: [(bool, bool); 4] =
    [(false, true), (false, false), (true, true), (true, false)];

/// `ecni_from_dev`'s (`dev`) or `ecni_from_pod`'s run time (ns) and run count so far on an
/// ebpf-cni node, from the kernel's statistics.
fn prog_stats(node: &BenchNode, dev: bool) -> Result<(u64, u64)> {
    let name = if dev {
        dp::PROG_FROM_DEV
    } else {
        dp::PROG_FROM_POD
    };
    crate::rig::progstats::of(node, name)
}

/// What the node's flow table holds of `setup`'s pod, in words.
fn held_now(bins: &Binaries, setup: &Setup) -> String {
    let held = || -> Result<String> {
        let pod_ip = setup.pod.ip4()?;
        Ok(match setup.node.subject {
            Subject::EbpfCni => {
                let m = inspect(&bins.ebpf_cni, &setup.node)?;
                format!(
                    "the masquerade table held {} flows of the pod ({} in all; ports {})",
                    m.flows_by_pod
                        .get(&pod_ip.to_string())
                        .copied()
                        .unwrap_or(0),
                    m.fwd_entries,
                    m.ports
                )
            }
            _ => {
                let table = conntrack_table(setup.node.node.netns())?;
                let from = format!("src={pod_ip} ");
                format!(
                    "the node's conntrack held {} entries of the pod ({} in all)",
                    table.lines().filter(|l| l.contains(&from)).count(),
                    table.lines().count()
                )
            }
        })
    };
    held().unwrap_or_else(|e| format!("the flow table could not be read ({e:#})"))
}

fn table_name(s: Subject) -> &'static str {
    match s {
        Subject::EbpfCni => "masquerade table",
        _ => "conntrack",
    }
}

/// The node's counters of new flows it dropped: ebpf-cni's exhausted and table_full, the
/// reference's conntrack drop, early_drop and insert_failed.
#[derive(Debug, Clone, Default)]
struct Drops(Vec<(&'static str, u64)>);

impl Drops {
    fn total(&self) -> u64 {
        self.0.iter().map(|(_, n)| n).sum()
    }

    /// What changed from `before`.
    fn since(&self, before: &Drops) -> Drops {
        Drops(
            self.0
                .iter()
                .map(|(name, n)| {
                    let was = before.0.iter().find(|(b, _)| b == name).map_or(0, |b| b.1);
                    (*name, n.saturating_sub(was))
                })
                .collect(),
        )
    }

    fn describe(&self) -> String {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(name, n)| format!("{name} {n}"))
            .collect();
        parts.join(", ")
    }
}

fn dropped_flows(bins: &Binaries, node: &BenchNode) -> Result<Drops> {
    match node.subject {
        Subject::EbpfCni => {
            let m = inspect(&bins.ebpf_cni, node)?;
            Ok(Drops(vec![
                ("exhausted", m.exhausted),
                ("table_full", m.table_full),
            ]))
        }
        _ => conntrack_drops(node.node.netns()),
    }
}

/// What `ebpf-cni inspect` reports of masquerade.
struct MasqState {
    flows_by_pod: BTreeMap<String, u64>,
    ports: String,
    exhausted: u64,
    table_full: u64,
    fwd_entries: u64,
    fwd_max: u64,
}

fn inspect(bin: &Path, node: &BenchNode) -> Result<MasqState> {
    let report = ebpf_cni_tests::dataplane::inspect(bin, &node.node)?;
    let m = report
        .get("masquerade")
        .filter(|m| m.is_object())
        .ok_or_else(|| anyhow!("`ebpf-cni inspect --json` shows no masquerade object"))?;
    let num = |key: &str| -> Result<u64> {
        m.get(key)
            .and_then(Value::as_u64)
            .ok_or_else(|| anyhow!("inspect: masquerade.{key} is missing"))
    };
    let flows_by_pod = m
        .get("flows_by_pod")
        .and_then(Value::as_object)
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
                .collect()
        })
        .unwrap_or_default();
    let fwd = report
        .get("maps")
        .and_then(Value::as_array)
        .and_then(|maps| {
            maps.iter()
                .find(|x| x.get("name").and_then(Value::as_str) == Some(MASQ_FWD_MAP))
        })
        .ok_or_else(|| anyhow!("inspect: no {MASQ_FWD_MAP} in maps"))?;
    let field = |key: &str| -> Result<u64> {
        fwd.get(key)
            .and_then(Value::as_u64)
            .ok_or_else(|| anyhow!("inspect: {MASQ_FWD_MAP}.{key} is missing"))
    };
    Ok(MasqState {
        flows_by_pod,
        ports: m
            .get("ports")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_owned(),
        exhausted: num("exhausted")?,
        table_full: num("table_full")?,
        fwd_entries: field("entries")?,
        fwd_max: field("max_entries")?,
    })
}

/// The node's conntrack table (`/proc/net/nf_conntrack` of its namespace; empty when
/// netfilter's conntrack never ran there).
fn conntrack_table(ns: &Netns) -> Result<String> {
    let out = ns.exec(&["cat", "/proc/net/nf_conntrack"])?;
    if !out.status.success() {
        // No conntrack module at all: nothing is tracked.
        return Ok(String::new());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The node's UDP conntrack entries from `src` to the external host's flow ports.
fn conntrack_flows(table: &str, src: Ipv4Addr) -> usize {
    let from = format!("src={src} dst={} ", topo::EXT_IP);
    table
        .lines()
        .filter(|l| l.split_whitespace().nth(2) == Some("udp") && l.contains(&from))
        .filter(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("dport="))
                .and_then(|p| p.parse::<u16>().ok())
                .is_some_and(|p| p >= FLOW_PORT_BASE)
        })
        .count()
}

/// conntrack's drop, early_drop and insert_failed in the namespace, over all CPUs.
fn conntrack_drops(ns: &Netns) -> Result<Drops> {
    const NAMES: [&str; 3] = ["drop", "early_drop", "insert_failed"];
    let out = ns.exec(&["cat", "/proc/net/stat/nf_conntrack"])?;
    if !out.status.success() {
        return Ok(Drops(NAMES.iter().map(|n| (*n, 0)).collect()));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .context("/proc/net/stat/nf_conntrack is empty")?
        .split_whitespace()
        .collect();
    let mut drops = Drops::default();
    for name in NAMES {
        let i = header
            .iter()
            .position(|h| *h == name)
            .with_context(|| format!("/proc/net/stat/nf_conntrack has no {name}: {header:?}"))?;
        drops.0.push((name, 0));
        for line in lines.clone() {
            if let Some(v) = line.split_whitespace().nth(i) {
                let n = u64::from_str_radix(v, 16)
                    .with_context(|| format!("/proc/net/stat/nf_conntrack: {v:?}"))?;
                if let Some(last) = drops.0.last_mut() {
                    last.1 += n;
                }
            }
        }
    }
    Ok(drops)
}

/// Sends one datagram per flow from `pod`: `n` flows from [`FLOW_SOCKETS`] sockets to
/// distinct ports of the external host. Returns the datagrams sent and the time it took.
fn offer_udp_flows(pod: &Netns, n: usize) -> Result<(usize, Duration)> {
    let per_socket = n.div_ceil(FLOW_SOCKETS);
    ensure!(
        usize::from(FLOW_PORT_BASE) + per_socket <= usize::from(u16::MAX),
        "{n} flows need more than the external host's ports"
    );
    pod.run_in(|| -> Result<(usize, Duration)> {
        let sockets = (0..FLOW_SOCKETS)
            .map(|_| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)))
            .collect::<std::io::Result<Vec<_>>>()
            .context("binding the pod's UDP sockets")?;
        let started = Instant::now();
        let mut sent = 0;
        'ports: for i in 0..per_socket {
            // Checked above: FLOW_PORT_BASE + per_socket fits a port.
            let port = FLOW_PORT_BASE + i as u16;
            for s in &sockets {
                if sent == n {
                    break 'ports;
                }
                s.send_to(&[0], (topo::EXT_IP, port))
                    .with_context(|| format!("sending to {}:{port}", topo::EXT_IP))?;
                sent += 1;
                if sent % FLOW_BATCH == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        Ok((sent, started.elapsed()))
    })?
}

/// What one subject's flows test found.
struct Flows {
    offered: usize,
    held: u64,
    dropped: u64,
    table_entries: u64,
    table_max: u64,
    send_secs: f64,
    /// The node's netfilter conntrack entries of these flows (ebpf-cni: should be none).
    conntrack: usize,
}

fn measure_flows(p: &Params, bins: &Binaries, s: Subject) -> Result<(Flows, String)> {
    let (node, pod, seen) = masquerading_pod(s, bins, "masq-flows")?;
    let pod_ip = pod.ip4()?;
    let ns = node.node.netns();
    let before = match s {
        Subject::EbpfCni => Some(inspect(&bins.ebpf_cni, &node)?),
        _ => None,
    };
    let drops_before = dropped_flows(bins, &node)?;
    let (offered, took) = offer_udp_flows(&pod.netns, p.masq_flows)?;
    // Let the last datagrams cross the node.
    std::thread::sleep(Duration::from_millis(200));
    let table = conntrack_table(ns)?;
    let conntrack = conntrack_flows(&table, pod_ip);
    let flows = match s {
        Subject::EbpfCni => {
            let after = inspect(&bins.ebpf_cni, &node)?;
            let before = before.context("no inspect before")?;
            let key = pod_ip.to_string();
            let of_pod = |m: &MasqState| m.flows_by_pod.get(&key).copied().unwrap_or(0);
            Flows {
                offered,
                held: of_pod(&after).saturating_sub(of_pod(&before)),
                dropped: dropped_flows(bins, &node)?.since(&drops_before).total(),
                table_entries: after.fwd_entries,
                table_max: after.fwd_max,
                send_secs: took.as_secs_f64(),
                conntrack,
            }
        }
        _ => {
            let max: u64 = ns
                .sysctl("net.netfilter.nf_conntrack_max")?
                .parse()
                .context("parsing nf_conntrack_max")?;
            Flows {
                offered,
                held: conntrack as u64,
                dropped: dropped_flows(bins, &node)?.since(&drops_before).total(),
                table_entries: table.lines().count() as u64,
                table_max: max,
                send_secs: took.as_secs_f64(),
                conntrack,
            }
        }
    };
    drop(pod);
    drop(node);
    Ok((flows, seen))
}

fn flows_table(p: &Params, bins: &Binaries, probe: &mut Probe) -> Table {
    let mut t = Table::new(
        &format!(
            "Concurrent flows held: {} UDP flows from one pod",
            crate::format::thousands(p.masq_flows)
        ),
        "one measurement per subject, on a fresh node",
    );
    let metrics = [
        Metric::FlowsOffered,
        Metric::FlowsHeld,
        Metric::FlowsHeldShare {
            flows: p.masq_flows,
        },
        Metric::FlowsDropped,
        Metric::FlowTableEntries,
        Metric::FlowTableCapacity,
        Metric::FlowSendTime,
    ];
    let mut rows: Vec<Row> = metrics.into_iter().map(Row::new).collect();
    let mut notes = Vec::new();
    for s in Subject::CNI {
        match measure_flows(p, bins, s) {
            Ok((f, seen)) => {
                if !matches!(probe.get(&s), Some(Ok(_))) {
                    probe.insert(s, Ok(seen));
                }
                let values = [
                    f.offered as f64,
                    f.held as f64,
                    f.held as f64 / f.offered.max(1) as f64 * 100.0,
                    f.dropped as f64,
                    f.table_entries as f64,
                    f.table_max as f64,
                    f.send_secs,
                ];
                for (row, v) in rows.iter_mut().zip(values) {
                    row.cells.insert(s, value(v));
                }
                if s == Subject::EbpfCni {
                    notes.push(format!(
                        "ebpf-cni's node held {} netfilter conntrack entries of these flows.",
                        f.conntrack
                    ));
                }
            }
            Err(e) => {
                progress(&format!("masquerade: flows of {}: {e:#}", s.label()));
                if !matches!(probe.get(&s), Some(Err(_))) {
                    probe.insert(s, Err(format!("{e:#}")));
                }
                for row in &mut rows {
                    row.cells.insert(s, Cell::failed(&e));
                }
            }
        }
    }
    t.rows = rows;
    t.notes = vec![
        format!(
            "A fresh masquerading node per subject (nothing of the throughput and CRR runs in \
             its tables), the external host without a route back. One pod sends one 1-byte \
             datagram from each of {FLOW_SOCKETS} UDP sockets to each of {} ports of the \
             external host (from {FLOW_PORT_BASE}), {FLOW_BATCH} datagrams between 1 ms \
             pauses: every (source port, destination port) pair is a new flow. The tables \
             are read 0.2 s after the last datagram, well within both idle timeouts \
             (conntrack's unreplied UDP: 30 s; ebpf-cni's UDP: 120 s).",
            crate::format::thousands(p.masq_flows.div_ceil(FLOW_SOCKETS))
        ),
        "Held: ebpf-cni's flows of the pod (`masquerade.flows_by_pod` of `ebpf-cni inspect`, \
         less those of the probe); the reference's UDP conntrack entries of the node from \
         the pod to those ports (/proc/net/nf_conntrack). Table: ebpf-cni's ECNI_MASQ_FWD \
         (one entry per flow, as ECNI_MASQ_REV), the reference's conntrack table of the \
         node (nf_conntrack_max left at this machine's default). Dropped: as in the table \
         above, over the sending."
            .into(),
    ];
    t.notes.extend(notes);
    t
}

fn value(v: f64) -> Cell {
    Cell::Value(Summary {
        n: 1,
        median: v,
        min: v,
        max: v,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conntrack_flows_counts_the_pods_udp_flows_to_the_flow_ports() {
        let table = "\
ipv4     2 udp      17 29 src=10.88.0.2 dst=192.168.77.2 sport=40000 dport=10000 [UNREPLIED] src=192.168.77.2 dst=192.168.77.1 sport=10000 dport=40000 mark=0 zone=0 use=2
ipv4     2 udp      17 29 src=10.88.0.2 dst=192.168.77.2 sport=40002 dport=10001 [UNREPLIED] src=192.168.77.2 dst=192.168.77.1 sport=10001 dport=40002 mark=0 zone=0 use=2
ipv4     2 udp      17 29 src=10.88.0.2 dst=192.168.77.2 sport=40004 dport=7001 [UNREPLIED] src=192.168.77.2 dst=192.168.77.1 sport=7001 dport=40004 mark=0 zone=0 use=2
ipv4     2 tcp      6 117 TIME_WAIT src=10.88.0.2 dst=192.168.77.2 sport=50000 dport=10000 src=192.168.77.2 dst=192.168.77.1 sport=10000 dport=50000 [ASSURED] mark=0 zone=0 use=2
ipv4     2 udp      17 29 src=10.88.0.3 dst=192.168.77.2 sport=40000 dport=10000 [UNREPLIED] src=192.168.77.2 dst=192.168.77.1 sport=10000 dport=40000 mark=0 zone=0 use=2
";
        assert_eq!(conntrack_flows(table, Ipv4Addr::new(10, 88, 0, 2)), 2);
        assert_eq!(conntrack_flows("", Ipv4Addr::new(10, 88, 0, 2)), 0);
    }

    #[test]
    fn drops_subtract_by_name() {
        let before = Drops(vec![("exhausted", 2), ("table_full", 1)]);
        let after = Drops(vec![("exhausted", 5), ("table_full", 1)]);
        let d = after.since(&before);
        assert_eq!(d.total(), 3);
        assert_eq!(d.describe(), "exhausted 3, table_full 0");
    }
}
