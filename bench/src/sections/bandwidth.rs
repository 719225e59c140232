//! Bandwidth accuracy: a pod limited to R in each direction exchanges traffic with the
//! external client (so the traffic crosses the node as a pod's real traffic would), TCP and
//! UDP (UDP sent at twice the limit); the figure is the receiver's rate over the configured
//! one. While TCP runs, ping measures the latency the limiter's queue adds.
//!
//! A subject that does not enforce limits is found by the first run (the lowest rate): when
//! it lets through more than twice the limit, the rest is skipped and the report says so.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::Result;

use crate::format;
use crate::log::progress;
use crate::metric::{Dir, Metric};
use crate::model::{Cell, Repeats, Row, Subject, Summary, Table};
use crate::params::Params;
use crate::rig::load::{self, Iperf3Server, Proto};
use crate::rig::topo::{self, BenchNode, Binaries, Pod};
use crate::stats::median;

const IPERF_PORT: u16 = 5301;

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Output {
    pub table: Table,
    /// Whether each CNI subject enforced limits, and what the probe measured.
    pub enforced: BTreeMap<Subject, std::result::Result<(), String>>,
}

struct Setup {
    _iperf: Iperf3Server,
    pods: BTreeMap<u64, (Pod, Ipv4Addr)>,
    node: BenchNode,
}

impl Setup {
    fn new(subject: Subject, bins: &Binaries, rates: &[u64]) -> Result<Self> {
        let node = BenchNode::new(subject, bins)?;
        let iperf = Iperf3Server::start(node.ext(), topo::EXT_IP, IPERF_PORT)?;
        let mut pods = BTreeMap::new();
        for &rate in rates {
            let (pod, _) = node.add_pod(
                &format!("bw-{}m", rate / 1_000_000),
                topo::caps(&[], Some(rate)),
            )?;
            let ip = pod.ip4()?;
            pods.insert(rate, (pod, ip));
        }
        Ok(Self {
            _iperf: iperf,
            pods,
            node,
        })
    }
}

/// The key of one configuration's rows.
type Key = (u64, Dir, bool);

pub fn run(p: &Params, bins: &Binaries) -> Output {
    let mut setups: Vec<(Subject, Setup)> = Vec::new();
    let mut accuracy: BTreeMap<Key, Repeats> = BTreeMap::new();
    let mut ping_load: BTreeMap<(u64, Dir), Repeats> = BTreeMap::new();
    let mut ping_idle = Repeats::default();
    let mut enforced = BTreeMap::new();
    let mut instead: BTreeMap<Subject, Cell> = BTreeMap::new();
    // (rate, direction, subject) → the lowest rate a UDP sender reached, when below the limit.
    let mut sender_limited: BTreeMap<(u64, Dir, Subject), f64> = BTreeMap::new();

    for s in Subject::CNI {
        match Setup::new(s, bins, &p.bw_rates) {
            Ok(setup) => setups.push((s, setup)),
            Err(e) => {
                progress(&format!(
                    "bandwidth: setting up {} failed: {e:#}",
                    s.label()
                ));
                instead.insert(s, Cell::failed(&e));
            }
        }
    }

    let secs = p.bw_secs;
    let mut configs: Vec<Key> = Vec::new();
    for &rate in &p.bw_rates {
        for dir in [Dir::Ingress, Dir::Egress] {
            for udp in [false, true] {
                configs.push((rate, dir, udp));
            }
        }
    }

    for rep in 0..p.bw_repeats {
        progress(&format!(
            "bandwidth: repeat {}/{}: {} configurations × {} s",
            rep + 1,
            p.bw_repeats,
            configs.len(),
            secs + p.bw_omit
        ));
        for (s, setup) in &setups {
            if instead.contains_key(s) {
                continue;
            }
            let (pod, _) = setup.pods.values().next().expect("at least one rate");
            match load::ping(&pod.netns, topo::EXT_IP, 10, Duration::from_millis(50)) {
                Ok(rtt) if !rtt.is_empty() => ping_idle.push(*s, median(&rtt)),
                Ok(_) => ping_idle.set_instead(*s, Cell::failed("no ping reply")),
                Err(e) => ping_idle.set_instead(*s, Cell::failed(&e)),
            }
        }
        for &(rate, dir, udp) in &configs {
            for (s, setup) in &setups {
                if instead.contains_key(s) {
                    continue;
                }
                let (pod, pod_ip) = &setup.pods[&rate];
                let proto = if udp {
                    Proto::Udp(2 * rate)
                } else {
                    Proto::Tcp
                };
                let target = SocketAddr::from((topo::EXT_IP, IPERF_PORT));
                // Ping from the sending side, so the probes queue behind the data.
                let (ping_ns, ping_to) = match dir {
                    Dir::Ingress => (setup.node.ext(), *pod_ip),
                    Dir::Egress => (&pod.netns, topo::EXT_IP),
                };
                let (res, rtt) = std::thread::scope(|sc| {
                    let run = sc.spawn(|| {
                        load::iperf3(
                            &pod.netns,
                            target,
                            secs,
                            p.bw_omit,
                            dir == Dir::Ingress,
                            proto,
                        )
                    });
                    let rtt = if udp {
                        None
                    } else {
                        std::thread::sleep(Duration::from_millis(
                            u64::from(p.bw_omit) * 1000 + 500,
                        ));
                        let count = (secs.saturating_sub(1) * 10).max(5);
                        Some(load::ping(
                            ping_ns,
                            ping_to,
                            count,
                            Duration::from_millis(100),
                        ))
                    };
                    (run.join().expect("iperf3 thread panicked"), rtt)
                });
                let key = (rate, dir, udp);
                match res {
                    Ok(r) => {
                        let wire = wire_factor(udp);
                        let achieved = r.receiver_bps * wire / rate as f64 * 100.0;
                        let sent = r.sender_bps * wire;
                        if udp && sent < rate as f64 * 1.02 {
                            let e = sender_limited.entry((rate, dir, *s)).or_insert(sent);
                            *e = e.min(sent);
                        }
                        let first = (rate, dir, udp) == configs[0];
                        if first && achieved > 200.0 {
                            let why = format!(
                                "limit not enforced: {:.0} Mbit/s measured for {} configured",
                                r.receiver_bps / 1e6,
                                format::rate(rate)
                            );
                            progress(&format!("bandwidth: {}: {why}", s.label()));
                            enforced.insert(*s, Err(why.clone()));
                            instead.insert(*s, Cell::not_implemented(&why));
                            continue;
                        }
                        enforced.entry(*s).or_insert(Ok(()));
                        accuracy.entry(key).or_default().push(*s, achieved);
                    }
                    Err(e) => accuracy
                        .entry(key)
                        .or_default()
                        .set_instead(*s, Cell::failed(&e)),
                }
                match rtt {
                    Some(Ok(v)) if !v.is_empty() => ping_load
                        .entry((rate, dir))
                        .or_default()
                        .push(*s, median(&v)),
                    Some(Ok(_)) => ping_load
                        .entry((rate, dir))
                        .or_default()
                        .set_instead(*s, Cell::failed("every ping lost")),
                    Some(Err(e)) => ping_load
                        .entry((rate, dir))
                        .or_default()
                        .set_instead(*s, Cell::failed(&e)),
                    None => {}
                }
            }
        }
    }
    drop(setups);

    let mut table = Table::new(
        "Bandwidth limits: achieved on the wire / configured, and latency under load",
        format!("median [min–max] over {} repeat(s)", p.bw_repeats),
    );
    for (s, c) in &instead {
        ping_idle.set_instead(*s, c.clone());
    }
    table.rows.push(ping_idle.row(Metric::PingIdle));
    for &(rate, dir, udp) in &configs {
        let r = accuracy.entry((rate, dir, udp)).or_default();
        for (s, c) in &instead {
            r.set_instead(*s, c.clone());
        }
        table.rows.push(r.row(Metric::Accuracy { rate, dir, udp }));
        if !udp {
            let r = ping_load.entry((rate, dir)).or_default();
            for (s, c) in &instead {
                r.set_instead(*s, c.clone());
            }
            table.rows.push(r.row(Metric::PingUnderLoad { rate, dir }));
        }
    }
    table.rows.insert(1, deviation_row(&table));
    table.notes = vec![
        format!(
            "One pod per rate with runtimeConfig.bandwidth ingress = egress = rate and burst = \
             max(rate × 20 ms, 128 kbit); iperf3 -t {secs} -O {} between the pod and the \
             external client (ingress: the client sends, iperf3 -R; egress: the pod sends); \
             UDP datagrams of {} bytes with 8 MiB socket buffers.",
            p.bw_omit,
            load::UDP_PAYLOAD
        ),
        format!(
            "Achieved = the receiver's rate on the wire, as the limits count it (Ethernet \
             frames): iperf3's goodput × {:.4} for TCP (1514-byte frames carrying 1448 bytes \
             with timestamps) and × {:.4} for UDP. Goodput alone would read ≈ 4.4% (TCP) and \
             ≈ 2.9% (UDP) low for a perfect limiter.",
            wire_factor(false),
            wire_factor(true)
        ),
        "Ping: 0.1 s apart from the sending side to the receiver during the TCP run, after \
         the omitted start; median RTT."
            .into(),
    ];
    for ((rate, dir, s), sent) in sender_limited {
        table.notes.push(format!(
            "{} {} UDP ({}): the sender reached only {:.0} Mbit/s on the wire, not twice the \
             limit, so that figure says little about the limiter.",
            format::rate(rate),
            dir.label(),
            s.label(),
            sent / 1e6
        ));
    }
    Output { table, enforced }
}

/// Wire bytes per payload byte at MTU 1500: TCP (MSS 1448 with timestamps) or UDP.
fn wire_factor(udp: bool) -> f64 {
    if udp {
        // payload + UDP 8 + IPv4 20 + Ethernet 14
        f64::from(load::UDP_PAYLOAD + 42) / f64::from(load::UDP_PAYLOAD)
    } else {
        // MSS 1448 + TCP 20 + options 12 + IPv4 20 + Ethernet 14
        1514.0 / 1448.0
    }
}

/// The worst |median − 100%| over every configuration, per subject; a subject with a
/// configuration that has no figure gets that configuration's cell instead.
fn deviation_row(t: &Table) -> Row {
    let mut row = Row::new(Metric::WorstDeviation);
    for s in Subject::CNI {
        let mut worst: Option<f64> = None;
        let mut instead = None;
        for r in t
            .rows
            .iter()
            .filter(|r| matches!(r.metric, Metric::Accuracy { .. }))
        {
            match r.cell(s) {
                Cell::Value(v) => {
                    let d = (v.median - 100.0).abs();
                    worst = Some(worst.map_or(d, |w: f64| w.max(d)));
                }
                c => {
                    instead.get_or_insert(c);
                }
            }
        }
        let cell = match (instead, worst) {
            (Some(c), _) => c,
            (None, Some(w)) => Cell::Value(Summary {
                n: 1,
                median: w,
                min: w,
                max: w,
            }),
            (None, None) => Cell::NotApplicable,
        };
        row.cells.insert(s, cell);
    }
    row
}
