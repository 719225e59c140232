//! Per-pod rate limits in eBPF (CNI conventions, "bandwidth"): real traffic with iperf3
//! between a pod and a host behind the node's uplink proves each direction of a limited pod
//! is held to its limit (a generous tolerance: precise figures belong to the benchmark)
//! while an unlimited pod is not; no qdisc, class, filter or ifb device appears; CHECK
//! notices a limiter that differs from the config; DEL removes it; bad inputs get error 7
//! and change nothing.

use std::net::IpAddr;
use std::path::Path;

use ebpf_cni_tests::config::Stack;
use ebpf_cni_tests::dataplane as dp;
use ebpf_cni_tests::external::ExternalHost;
use ebpf_cni_tests::rate::{floor, iperf, iperf_for, on_the_wire, ping_median_ms};
use ebpf_cni_tests::{
    bpf, require_root, unique_container_id, CniCommand, Netns, Node, PluginUnderTest, Pod,
};
use serde_json::{json, Value};

/// The limit the tests set: 40 Mbit/s, or 4 Mbit/s in a matrix guest, whose emulated senders
/// may not offer twice 40 Mbit/s (`rate::VM_ENV`).
fn limit_bps() -> f64 {
    if ebpf_cni_tests::rate::in_vm() {
        4_000_000.0
    } else {
        40_000_000.0
    }
}

/// iperf3's `-b` for twice the limit.
fn twice_the_limit() -> String {
    format!("{}", 2.0 * limit_bps())
}

/// The node's tc and link state that a qdisc-based limiter would change.
fn tc_state(node: &Node) -> (String, Vec<String>) {
    let qdiscs = node.netns().exec(&["tc", "qdisc", "show"]).unwrap();
    // "qdisc <kind> <handle> dev <name> …": the kinds the bandwidth plugin would create,
    // and any qdisc on an ifb device (matched by word: a host veth's hashed name may
    // contain "ifb", as ecnifb6e523ccb8 did).
    let qdiscs = String::from_utf8_lossy(&qdiscs.stdout)
        .lines()
        .filter(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let kind = words.get(1).copied().unwrap_or_default();
            let dev = words
                .iter()
                .position(|w| *w == "dev")
                .and_then(|i| words.get(i + 1))
                .copied()
                .unwrap_or_default();
            matches!(kind, "tbf" | "htb" | "ingress") || dev.starts_with("ifb")
        })
        .map(str::to_owned)
        .collect::<Vec<_>>()
        .join("\n");
    let ifbs = ebpf_cni_tests::kernel::links(node.netns())
        .unwrap()
        .into_iter()
        .filter(|l| l.ifname.starts_with("ifb") || l.ifname.starts_with("bwp"))
        .map(|l| l.ifname)
        .collect();
    (qdiscs, ifbs)
}

fn conf_with(p: &PluginUnderTest, node: &Node, bandwidth: Option<Value>) -> Value {
    let mut c = p.conf("1.0.0", node, Stack::V4);
    if let Some(bw) = bandwidth {
        c["runtimeConfig"] = json!({ "bandwidth": bw });
    }
    c
}

#[test]
fn limits_hold_in_both_directions_and_unlimited_pods_are_untouched() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "up0", 77).unwrap();
    let tc_before = tc_state(&node);

    // containerd's spelling, with the "no burst" value it sends when a pod sets none.
    let bw = json!({"IngressRate": limit_bps() as u64, "IngressBurst": 4294967295u64,
                    "EgressRate": limit_bps() as u64, "EgressBurst": 4294967295u64});
    let limited_conf = conf_with(&p, &node, Some(bw));
    let plain_conf = conf_with(&p, &node, None);
    // The programs skip the sender's limit lookup only on a node without limits: the
    // node's switch is on after the first load on a node without limits, off while a pod
    // has one (the traffic below proves the limited pod's limits still hold), on again when
    // the last limit goes.
    let no_limits =
        || dp::node_config_flags(&node).unwrap() & ebpf_cni_maps::NODE_FLAG_NO_LIMITS != 0;
    let plain = Pod::add_direct(&p, &node, &plain_conf);
    assert!(no_limits(), "a node without limits has the switch on");
    let limited = Pod::add_direct(&p, &node, &limited_conf);
    assert!(
        !no_limits(),
        "the no-limits switch is on beside a limited pod"
    );
    // Each pod's counters tell the programs whether to look its limits up, in every CPU's
    // slot: the plain pod's say there are none (the lookups are skipped, its packets' and
    // those delivered to it), the limited pod's do not (the traffic below proves its
    // limits hold, pod to pod included). Neither has a host port: both say so for their
    // own packets.
    let flags = dp::pod_counter_flags(&node).unwrap();
    let (li, pi) = (limited.host_ifindex(&node), plain.host_ifindex(&node));
    let no_ports = ebpf_cni_maps::COUNTERS_NO_HOST_PORTS;
    let no_egress = ebpf_cni_maps::COUNTERS_NO_EGRESS_LIMIT;
    assert!(
        flags[&pi].iter().all(|f| *f
            == (
                no_ports | no_egress,
                ebpf_cni_maps::COUNTERS_NO_INGRESS_LIMIT
            )),
        "the plain pod's counters flags: {flags:?}"
    );
    assert!(
        flags[&li].iter().all(|f| *f == (no_ports, 0)),
        "the limited pod's counters flags: {flags:?}"
    );
    let ext_ip = IpAddr::V4(ext.v4);

    // UDP at twice the limit: the receiver gets about the limit (the burst adds at most
    // 128 KiB over 3 s; the tolerance here is generous, the benchmark measures precisely).
    let udp_out = iperf(
        &limited.netns,
        ext.netns(),
        ext_ip,
        &["-u", "-b", &twice_the_limit()],
    );
    assert!(
        (floor(0.75, 0.05) * limit_bps()..=1.25 * limit_bps()).contains(&udp_out),
        "UDP from the limited pod at 2x its egress limit: {udp_out:.0} bit/s received"
    );
    let udp_in = iperf(
        &limited.netns,
        ext.netns(),
        ext_ip,
        &["-u", "-b", &twice_the_limit(), "-R"],
    );
    assert!(
        (floor(0.75, 0.05) * limit_bps()..=1.25 * limit_bps()).contains(&udp_in),
        "UDP towards the limited pod at 2x its ingress limit: {udp_in:.0} bit/s received"
    );
    // TCP never exceeds the limit by more than the burst allows.
    let tcp_out = iperf(&limited.netns, ext.netns(), ext_ip, &[]);
    let tcp_in = iperf(&limited.netns, ext.netns(), ext_ip, &["-R"]);
    for (what, rate) in [("egress", tcp_out), ("ingress", tcp_in)] {
        assert!(
            rate > 0.0 && rate < 1.3 * limit_bps(),
            "TCP {what} of the limited pod: {rate:.0} bit/s"
        );
    }
    // Pod to pod is held too (the limit sits in the redirect path).
    let pod_to_pod = iperf(
        &plain.netns,
        &limited.netns,
        limited.v4(),
        &["-u", "-b", &twice_the_limit()],
    );
    assert!(
        pod_to_pod < 1.25 * limit_bps(),
        "UDP pod -> limited pod: {pod_to_pod:.0} bit/s"
    );

    // The unlimited pod is not slowed at all.
    let free = iperf(&plain.netns, ext.netns(), ext_ip, &[]);
    assert!(
        free > floor(25.0, 1.5) * limit_bps(),
        "TCP from the unlimited pod: {free:.0} bit/s"
    );

    // Drops are counted for the limited pod only, and inspect shows the limits.
    let counters = dp::pod_counters(&node).unwrap();
    assert!(
        // In a matrix guest the sender may not overrun the limit in both directions.
        if ebpf_cni_tests::rate::in_vm() {
            counters[&li].from_pod.drops > 0 || counters[&li].to_pod.drops > 0
        } else {
            counters[&li].from_pod.drops > 0 && counters[&li].to_pod.drops > 0
        },
        "{:?}",
        counters[&li]
    );
    assert_eq!(
        (counters[&pi].from_pod.drops, counters[&pi].to_pod.drops),
        (0, 0)
    );
    let report = dp::inspect(Path::new(&p.bin), &node).unwrap();
    let a = dp::inspect_attachment(&report, limited.id()).expect("limited pod in inspect");
    assert_eq!(
        a["ingress_limit"]["rate_bytes"],
        json!(limit_bps() as u64 / 8),
        "{a}"
    );
    assert_eq!(
        a["egress_limit"]["rate_bytes"],
        json!(limit_bps() as u64 / 8),
        "{a}"
    );
    let b = dp::inspect_attachment(&report, plain.id()).expect("plain pod in inspect");
    assert!(
        b["ingress_limit"].is_null() && b["egress_limit"].is_null(),
        "{b}"
    );

    // No qdisc, class, filter or ifb device: only the clsact/TCX attachments of the programs.
    assert_eq!(tc_state(&node), tc_before, "tc state changed");

    // CHECK passes with the config, fails when the config asks for other rates.
    let check = |conf: &Value| p.check(&node, &limited.env(&p), conf, &limited.result);
    check(&limited_conf).expect_success("CHECK with the ADD's config");
    let mut other = limited_conf.clone();
    other["runtimeConfig"]["bandwidth"]["EgressRate"] = json!(10_000_000);
    let err = check(&other).expect_error(105, "CHECK with other rates");
    assert!(err.msg.contains("rate limiter"), "{err:?}");
    // Counters that would let the programs skip either of the limited pod's limits (the
    // receiver's flag, the sender's own): CHECK fails, naming them (the flags off on the
    // plain pod, as an earlier release writes them, are fine: the programs then look up a
    // limit and find none).
    let no_ingress = ebpf_cni_maps::COUNTERS_NO_INGRESS_LIMIT;
    for (from_pod, to_pod, way) in [
        (0, no_ingress, "ingress"),
        (no_ports | no_egress, 0, "egress"),
    ] {
        dp::set_pod_counter_flags(&node, li, from_pod, to_pod).unwrap();
        let err =
            check(&limited_conf).expect_error(105, &format!("CHECK with the {way} limit skipped"));
        assert!(
            err.msg
                .contains(&format!("counters of host veth ifindex {li}"))
                && err.msg.contains(&format!("no {way} limit")),
            "{way}: {err:?}"
        );
    }
    dp::set_pod_counter_flags(&node, li, 0, 0).unwrap();
    check(&limited_conf).expect_success("CHECK with the counters an earlier release wrote");
    dp::set_pod_counter_flags(&node, pi, 0, 0).unwrap();

    // DEL removes the limiter entry; the other pod keeps none.
    p.run(
        &node,
        CniCommand::Del,
        &limited.env(&p),
        limited_conf.to_string(),
    )
    .expect_success("DEL");
    let report = dp::inspect(Path::new(&p.bin), &node).unwrap();
    assert!(dp::inspect_attachment(&report, limited.id()).is_none());
    let rates = dp::map_entries(&node, dp::RATE_LIMITS_MAP).unwrap();
    assert_eq!(rates.len(), 0, "limiter entries left: {rates:?}");
    assert!(no_limits(), "the last limit went, the switch stays off");
    // CHECK of the unlimited pod still passes with the hint in its entries.
    let mut c = plain_conf.clone();
    c["prevResult"] = plain.result.clone();
    p.run(&node, CniCommand::Check, &plain.env(&p), c.to_string())
        .expect_success("CHECK of the unlimited pod");
    p.run(
        &node,
        CniCommand::Del,
        &plain.env(&p),
        plain_conf.to_string(),
    )
    .expect_success("DEL plain");
}

/// TCP from a limited pod paces itself at the limit: without help a single stream bounces
/// off the policer far below the rate. ebpf-cni's sockops program gives the pod's TCP
/// sockets `SO_MAX_PACING_RATE` (the payload share of the limit: 1448 of 1514 bytes) and
/// the stream then runs at the limit on the wire: never more than 2% above it. Below it, a
/// busy machine costs up to a fifth: TCP's pacing timer fires late and the time is not made
/// up (0.93–1.00 over quiet runs here, 0.83 in a CI run), so the floor only proves the
/// stream is paced, not policed (policed, one stream got a tenth of the limit); the
/// accuracy is the benchmark's (99.9–100.0% in the 6.12 guest). The pacing entry is the
/// pod's, CHECK proves it, DEL removes it.
#[test]
fn tcp_from_a_limited_pod_is_paced_to_the_limit() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "up0", 78).unwrap();
    let bw = json!({"egressRate": limit_bps() as u64, "egressBurst": 4294967295u64});
    let conf = conf_with(&p, &node, Some(bw));
    let pod = Pod::add_direct(&p, &node, &conf);
    let ext_ip = IpAddr::V4(ext.v4);

    let tcp = on_the_wire(iperf_for(&pod.netns, ext.netns(), ext_ip, 5, &[]), None);
    eprintln!(
        "egress TCP on the wire: {:.4} of the limit",
        tcp / limit_bps()
    );
    let report = dp::inspect(Path::new(&p.bin), &node).unwrap();
    let a = dp::inspect_attachment(&report, pod.id()).expect("pod in inspect");
    let pacing_mode = report["modes"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["part"] == "egress TCP pacing"))
        .unwrap_or_else(|| panic!("inspect names the pacing mode: {report:#}"));
    if !bpf::kernel_paces_tcp() {
        // Before 5.15 the kernel refuses the pacing program: the policer alone holds the
        // limit (TCP backs off below it), inspect says so, and nothing is paced. The bucket
        // lets its burst (128 KiB) through on top of the rate: 9% of 4 Mbit/s over the 3 s
        // of a matrix guest's measurement, as in the policed checks above.
        assert!(
            tcp <= 1.3 * limit_bps(),
            "policed TCP above the limit and its burst: {tcp:.0}"
        );
        assert_eq!(pacing_mode["degraded"], json!(true), "{pacing_mode}");
        assert_eq!(a["tcp_pacing_bytes"], Value::Null, "{a}");
        assert!(dp::map_entries(&node, dp::PACING_MAP).unwrap().is_empty());
        let env = pod.env(&p);
        let mut check_conf = conf.clone();
        check_conf["prevResult"] = pod.result.clone();
        p.run(&node, CniCommand::Check, &env, check_conf.to_string())
            .expect_success("CHECK of a policed pod");
        p.run(&node, CniCommand::Del, &env, conf.to_string())
            .expect_success("DEL");
        assert!(node.pinned_files().is_empty(), "{:?}", node.pinned_files());
        return;
    }
    assert_eq!(pacing_mode["degraded"], json!(false), "{pacing_mode}");
    assert!(
        (floor(0.5, 0.05) * limit_bps()..=1.02 * limit_bps()).contains(&tcp),
        "one TCP stream from a pod limited to {} bit/s got {tcp:.0} bit/s on the wire",
        limit_bps()
    );
    assert_eq!(
        a["tcp_pacing_bytes"],
        json!(limit_bps() as u64 / 8 * 1448 / 1514),
        "{a}"
    );

    // CHECK proves the pacing entry; without it CHECK fails naming it.
    let env = pod.env(&p);
    let mut check_conf = conf.clone();
    check_conf["prevResult"] = pod.result.clone();
    p.run(&node, CniCommand::Check, &env, check_conf.to_string())
        .expect_success("CHECK");
    let entries = dp::map_entries(&node, dp::PACING_MAP).unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    dp::delete_raw(
        &node,
        dp::PACING_MAP,
        &dp::hex_bytes(&entries[0]["key"]).unwrap(),
    )
    .unwrap();
    let err = p
        .run(&node, CniCommand::Check, &env, check_conf.to_string())
        .expect_error(105, "CHECK without the pacing entry");
    assert!(err.msg.contains("pacing"), "{err:?}");

    // DEL (late, without netns) removes the entry even if ADD made it again.
    let out = p.run(&node, CniCommand::Add, &env, conf.to_string());
    out.expect_error(107, "ADD of an existing attachment");
    p.run(
        &node,
        CniCommand::Del,
        &p.env(pod.id(), "", "eth0"),
        conf.to_string(),
    )
    .expect_success("DEL");
    assert!(node.pinned_files().is_empty(), "{:?}", node.pinned_files());
}

/// The root qdisc line of `dev` in `tc qdisc show` ("qdisc fq ecf0: root refcnt 2 …").
fn root_qdisc(node: &Node, dev: &str) -> String {
    let out = node
        .netns()
        .exec(&["tc", "qdisc", "show", "dev", dev, "root"])
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The largest backlog (bytes) of `dev`'s root qdisc in `samples` looks 100 ms apart.
fn largest_backlog(node: &Node, dev: &str, samples: u32) -> u64 {
    (0..samples)
        .map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(100));
            let out = node
                .netns()
                .exec(&["tc", "-s", "qdisc", "show", "dev", dev, "root"])
                .unwrap();
            // " backlog 12345b 9p requeues 0"
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .skip_while(|w| *w != "backlog")
                .nth(1)
                .and_then(|b| b.strip_suffix('b')?.parse().ok())
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

fn host_veth(pod: &Pod) -> &str {
    &pod.r.host_ifname
}

/// Traffic towards a pod with an ingress limit is paced, not policed. Its host veth gets an
/// `fq` (handle `ecf0:`, nothing else), deliveries to it go through that veth, and
/// `ecni_to_pod` stamps each packet with its departure time: a single TCP stream from a
/// host behind the node, or from another pod, gets the limit (±5%), as does UDP offered at
/// twice the limit; a ping (a sparse flow) does not wait behind the stream's queue, and a
/// pod without a limit is not slowed by it and gets no qdisc. CHECK sees a missing fq; DEL
/// leaves nothing. Where the kernel has no `sch_fq` (this machine's), the limit is policed
/// instead, and inspect and the log say so; the accuracy is proven in the kernel matrix's
/// guests.
#[test]
fn traffic_towards_a_limited_pod_is_paced_to_the_limit() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "up0", 79).unwrap();
    let ext_ip = IpAddr::V4(ext.v4);
    let plain_conf = conf_with(&p, &node, None);
    let plain = Pod::add_direct(&p, &node, &plain_conf);

    if !bpf::kernel_has_sch_fq() {
        let conf = conf_with(
            &p,
            &node,
            Some(json!({"ingressRate": 40_000_000, "ingressBurst": 4294967295u64})),
        );
        let ns = node.new_pod().unwrap();
        let cid = unique_container_id();
        let env = p.env(&cid, ns.path(), "eth0");
        let out = p.run(&node, CniCommand::Add, &env, conf.to_string());
        out.expect_success("ADD without sch_fq");
        assert!(out.stderr.contains("no sch_fq"), "{}", out.stderr);
        let report = dp::inspect(Path::new(&p.bin), &node).unwrap();
        let a = dp::inspect_attachment(&report, &cid).unwrap();
        assert_eq!(
            a["ingress_limit"]["mode"],
            json!("policer (no sch_fq)"),
            "{a}"
        );
        let veth = out.json.as_ref().unwrap()["interfaces"][0]["name"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(!root_qdisc(&node, &veth).contains(" fq "));
        p.run(&node, CniCommand::Del, &env, conf.to_string())
            .expect_success("DEL");
        return;
    }

    // containerd's Capitalized keys with its "no burst", and the reference's spelling.
    let cases = [
        (
            10e6,
            json!({"IngressRate": 10_000_000u64, "IngressBurst": 4294967295u64}),
        ),
        (
            100e6,
            json!({"ingressRate": 100_000_000u64, "ingressBurst": 1_000_000u64}),
        ),
    ];
    for (limit, bw) in cases {
        let conf = conf_with(&p, &node, Some(bw.clone()));
        let pod = Pod::add_direct(&p, &node, &conf);
        let report = dp::inspect(Path::new(&p.bin), &node).unwrap();
        let a = dp::inspect_attachment(&report, pod.id()).unwrap();
        assert_eq!(a["ingress_limit"]["mode"], json!("edt+fq"), "{a}");
        let horizon_ms = a["ingress_limit"]["horizon_ns"].as_f64().unwrap() / 1e6;
        let qdisc = root_qdisc(&node, host_veth(&pod));
        assert!(qdisc.starts_with("qdisc fq ecf0: root"), "{qdisc}");
        assert!(
            !root_qdisc(&node, host_veth(&plain)).contains(" fq "),
            "the unlimited pod's veth got a qdisc"
        );

        // At 100 Mbit/s the emulated sender itself runs short when the matrix's three guests
        // share two cores (0.945 in one run, 0.804 and 0.452 in CI runs; the benchmark's
        // single guest measures 99.8%). There the floor is half of what the same sender gets
        // towards the unlimited pod just before and just after (the lesser): it catches a
        // collapse of the paced path, not the guest's speed. The accuracy is held at 10
        // Mbit/s and by the benchmark. Nothing may exceed the limit by more than 5%.
        let fast = limit > 50e6;
        let capacity = || {
            let got = on_the_wire(
                iperf_for(&plain.netns, ext.netns(), ext_ip, 5, &["-R"]),
                None,
            );
            eprintln!("the unlimited pod from a host behind the node: {got:.0} bit/s");
            got
        };
        let mut before = if fast { capacity() } else { f64::INFINITY };
        let mut within = |what: &str, goodput: f64, udp_payload: Option<u32>| {
            let got = on_the_wire(goodput, udp_payload);
            let after = if fast { capacity() } else { f64::INFINITY };
            let reachable = f64::min(limit, before).min(after);
            let floor = if fast { 0.5 * reachable } else { 0.95 * limit };
            before = after;
            assert!(
                (floor..=1.05 * limit).contains(&got),
                "{what} towards a pod limited to {limit} bit/s: {got:.0} bit/s on the wire ({:.3} \
                 of the limit; floor {floor:.0}: half the lesser of the limit and what the unlimited pod \
                 got around it, {reachable:.0})",
                got / limit
            );
            eprintln!("{what}, limit {limit}: {:.4} of the limit", got / limit);
        };
        within(
            "one TCP stream from a host behind the node",
            iperf_for(&pod.netns, ext.netns(), ext_ip, 10, &["-R"]),
            None,
        );
        within(
            "one TCP stream from another pod",
            iperf_for(&plain.netns, &pod.netns, pod.v4(), 10, &[]),
            None,
        );
        if limit <= 10e6 {
            // UDP at twice the limit: an emulated sender in a matrix guest offers 20
            // Mbit/s, not 200.
            within(
                "UDP at twice the limit from a host behind the node",
                iperf_for(
                    &pod.netns,
                    ext.netns(),
                    ext_ip,
                    10,
                    &["-u", "-l", "1400", "-b", &format!("{}", 2.0 * limit), "-R"],
                ),
                Some(1400),
            );
            // While a stream keeps the paced pod's queue filled, a ping (a sparse flow) is
            // charged to the pod like any packet but does not wait behind the stream: it
            // leaves at once. (Before sparse flows it waited about half the horizon: 47 ms
            // at 10 Mbit/s in the benchmark's guest, where the reference's tbf gives 33.)
            // The queue's backlog, sampled meanwhile, proves the stream filled it.
            let (limited_rtt, plain_rtt, backlog) = std::thread::scope(|s| {
                let stream = s.spawn(|| iperf_for(&pod.netns, ext.netns(), ext_ip, 8, &["-R"]));
                std::thread::sleep(std::time::Duration::from_secs(3));
                let backlog = s.spawn(|| largest_backlog(&node, host_veth(&pod), 20));
                let limited_rtt = ping_median_ms(ext.netns(), pod.v4(), 10);
                let plain_rtt = ping_median_ms(ext.netns(), plain.v4(), 10);
                let backlog = backlog.join().unwrap();
                stream.join().unwrap();
                (limited_rtt, plain_rtt, backlog)
            });
            eprintln!(
                "ping during the stream: limited pod {limited_rtt:.1} ms (horizon {horizon_ms:.0} ms, \
                 fq backlog up to {backlog} bytes), unlimited pod {plain_rtt:.1} ms"
            );
            assert!(
                backlog >= 3_000,
                "the stream kept no queue in the paced pod's fq (largest backlog {backlog} bytes)"
            );
            assert!(
                limited_rtt < 25.0 && limited_rtt < horizon_ms / 4.0,
                "ping to the paced pod waited {limited_rtt:.1} ms behind a queue of up to \
                 {backlog} bytes (horizon {horizon_ms:.0} ms)"
            );
            assert!(
                plain_rtt < 25.0,
                "ping to the unlimited pod: {plain_rtt:.1} ms"
            );
        }

        // CHECK proves the fq; without it CHECK fails naming it.
        let env = pod.env(&p);
        let mut check_conf = conf.clone();
        check_conf["prevResult"] = pod.result.clone();
        p.run(&node, CniCommand::Check, &env, check_conf.to_string())
            .expect_success("CHECK of a paced pod");
        let del = node
            .netns()
            .exec(&["tc", "qdisc", "del", "dev", host_veth(&pod), "root"])
            .unwrap();
        assert!(del.status.success(), "{del:?}");
        let err = p
            .run(&node, CniCommand::Check, &env, check_conf.to_string())
            .expect_error(105, "CHECK without the fq");
        assert!(err.msg.contains("fq"), "{err:?}");
        p.run(&node, CniCommand::Del, &env, conf.to_string())
            .expect_success("DEL");
        assert!(dp::map_entries(&node, dp::RATE_LIMITS_MAP)
            .unwrap()
            .is_empty());
    }
    p.run(
        &node,
        CniCommand::Del,
        &plain.env(&p),
        plain_conf.to_string(),
    )
    .expect_success("DEL plain");
    assert!(node.pinned_files().is_empty(), "{:?}", node.pinned_files());
}

/// Seconds of each measurement of the subnets test: 6 in a matrix guest, where its limit is
/// 1 Mbit/s and the policer's minimum burst (128 KiB, 1 Mbit) would let a 3-s measurement
/// reach 1.35x the limit.
fn subnet_secs() -> u32 {
    if ebpf_cni_tests::rate::in_vm() {
        6
    } else {
        3
    }
}

/// The UDP rate the receiver gets from `client` to `server` at `addr`, sent at `offer` bit/s
/// (`reverse`: from the server to the client).
fn udp_at(client: &Netns, server: &Netns, addr: IpAddr, offer: f64, reverse: bool) -> f64 {
    let b = format!("{offer}");
    let mut args = vec!["-u", "-b", b.as_str()];
    if reverse {
        args.push("-R");
    }
    iperf_for(client, server, addr, subnet_secs(), &args)
}

/// `unshapedSubnets` / `shapedSubnets` (the reference plugin's v1.5 keys): a pod with
/// `unshapedSubnets` covering host A's subnet sends to and receives from A well above its
/// limit (UDP at 5x the limit gets through; TCP too, so its sockets are not paced for A)
/// while traffic with host B is held to the limit in both directions; a pod with
/// `shapedSubnets` naming A is the reverse. The static key and the runtime's
/// `runtimeConfig.bandwidth` spelling both work. `inspect` shows the subnets, CHECK fails
/// once an entry is removed from the subnet map, DEL removes every entry.
#[test]
fn subnets_exempt_or_select_the_traffic_a_limit_holds() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let a = ExternalHost::attach(node.netns(), "up0", 77).unwrap();
    let b = ExternalHost::attach(node.netns(), "up1", 78).unwrap();
    let (a_ip, b_ip) = (IpAddr::V4(a.v4), IpAddr::V4(b.v4));
    // In a matrix guest 1 Mbit/s (measured for `subnet_secs`): an exempt path must carry
    // five times the limit, and an emulated UDP sender sharing its vCPU with the receiver
    // offered 20 Mbit/s and got 4.4 through (6.1, one vCPU).
    let limit = if ebpf_cni_tests::rate::in_vm() {
        1_000_000.0
    } else {
        limit_bps()
    };
    let rates = json!({"IngressRate": limit as u64, "IngressBurst": 4294967295u64,
                       "EgressRate": limit as u64, "EgressBurst": 4294967295u64});
    // Static key, runtime rates (an operator's config, kubelet's per-pod rates).
    let mut unshaped_conf = conf_with(&p, &node, Some(rates.clone()));
    unshaped_conf["unshapedSubnets"] = json!(["192.168.77.0/24", "fd77::/64"]);
    // All in runtimeConfig.bandwidth, containerd's capitalized spelling.
    let mut shaped_rates = rates.clone();
    shaped_rates["ShapedSubnets"] = json!(["192.168.77.2/32"]);
    let shaped_conf = conf_with(&p, &node, Some(shaped_rates));
    let unshaped = Pod::add_direct(&p, &node, &unshaped_conf);
    let shaped = Pod::add_direct(&p, &node, &shaped_conf);

    let limited = |what: &str, got: f64| {
        assert!(got <= 1.25 * limit, "{what}: {got:.0} bit/s, limit {limit}");
    };
    let free = |what: &str, got: f64| {
        assert!(
            got >= floor(3.0, 1.5) * limit,
            "{what}: {got:.0} bit/s, not above the limit {limit}"
        );
    };
    for (reverse, dir) in [(false, "from"), (true, "towards")] {
        free(
            &format!("UDP {dir} the unshaped pod, host A (exempt)"),
            udp_at(&unshaped.netns, a.netns(), a_ip, 5.0 * limit, reverse),
        );
        limited(
            &format!("UDP {dir} the unshaped pod, host B"),
            udp_at(&unshaped.netns, b.netns(), b_ip, 2.0 * limit, reverse),
        );
        limited(
            &format!("UDP {dir} the shaped pod, host A (selected)"),
            udp_at(&shaped.netns, a.netns(), a_ip, 2.0 * limit, reverse),
        );
        free(
            &format!("UDP {dir} the shaped pod, host B"),
            udp_at(&shaped.netns, b.netns(), b_ip, 5.0 * limit, reverse),
        );
    }
    // TCP from the pod: its socket to an exempt peer is not paced at the limit.
    free(
        "TCP from the unshaped pod to host A",
        iperf_for(&unshaped.netns, a.netns(), a_ip, subnet_secs(), &[]),
    );
    let tcp_b = iperf_for(&unshaped.netns, b.netns(), b_ip, subnet_secs(), &[]);
    assert!(
        tcp_b > 0.0 && tcp_b < 1.3 * limit,
        "TCP from the unshaped pod to host B: {tcp_b:.0} bit/s"
    );

    let report = dp::inspect(Path::new(&p.bin), &node).unwrap();
    let ua = dp::inspect_attachment(&report, unshaped.id()).unwrap();
    assert_eq!(ua["shape_subnets"]["rule"], "unshapedSubnets", "{ua}");
    let mut nets: Vec<&str> = ua["shape_subnets"]["subnets"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    nets.sort_unstable();
    assert_eq!(nets, ["192.168.77.0/24", "fd77::/64"], "{ua}");
    let sa = dp::inspect_attachment(&report, shaped.id()).unwrap();
    assert_eq!(
        sa["shape_subnets"],
        json!({"rule": "shapedSubnets", "subnets": ["192.168.77.2/32"]}),
        "{sa}"
    );

    // CHECK passes, and fails once the shaped pod's entry is gone from the subnet map.
    let check = |pod: &Pod, conf: &Value| p.check(&node, &pod.env(&p), conf, &pod.result);
    check(&unshaped, &unshaped_conf).expect_success("CHECK of the unshaped pod");
    check(&shaped, &shaped_conf).expect_success("CHECK of the shaped pod");
    let entries = dp::map_entries(&node, dp::SHAPE_SUBNETS_MAP).unwrap();
    assert_eq!(entries.len(), 3, "{entries:?}");
    let si = shaped.host_ifindex(&node).to_ne_bytes();
    let key = entries
        .iter()
        .map(|e| dp::hex_bytes(&e["key"]).unwrap())
        // LPM key: prefix length (u32), then the ifindex.
        .find(|k| k[4..8] == si)
        .expect("the shaped pod's entry");
    dp::delete_raw(&node, dp::SHAPE_SUBNETS_MAP, &key).unwrap();
    let err = check(&shaped, &shaped_conf).expect_error(105, "CHECK without the subnet entry");
    assert!(err.msg.contains("192.168.77.2/32"), "{err:?}");

    for (pod, conf) in [(&unshaped, &unshaped_conf), (&shaped, &shaped_conf)] {
        p.run(&node, CniCommand::Del, &pod.env(&p), conf.to_string())
            .expect_success("DEL");
    }
    let left = dp::map_entries(&node, dp::SHAPE_SUBNETS_MAP).unwrap_or_default();
    assert!(left.is_empty(), "subnet entries left: {left:?}");
}

/// Validation as the reference plugin: rate and burst together, burst within 4 GiB; the
/// error names the field and nothing is created.
#[test]
fn bad_bandwidth_inputs_are_refused_and_change_nothing() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let pod = node.new_pod().unwrap();
    let cases = [
        (json!({"ingressRate": 1_000_000}), "ingressBurst"),
        (json!({"EgressBurst": 1_000_000}), "egressRate"),
        (
            json!({"egressRate": 1_000_000, "egressBurst": 40_000_000_000u64}),
            "egressBurst",
        ),
        (
            json!({"ingressRate": "fast", "ingressBurst": 1}),
            "ingressRate",
        ),
        (
            json!({"ingressRate": 1_000_000, "ingressBurst": 1_000_000,
                   "unshapedSubnets": ["10.0.0.0/8"], "shapedSubnets": ["fd00::/8"]}),
            "unshapedSubnets and shapedSubnets cannot be both specified",
        ),
        (
            json!({"ingressRate": 1_000_000, "ingressBurst": 1_000_000,
                   "unshapedSubnets": ["10.0.0.0/33"]}),
            "runtimeConfig.bandwidth.unshapedSubnets",
        ),
    ];
    for (bw, field) in cases {
        let conf = conf_with(&p, &node, Some(bw.clone()));
        let before = node.snapshot(Some(&pod));
        let out = p.run(
            &node,
            CniCommand::Add,
            &p.env(&unique_container_id(), pod.path(), "eth0"),
            conf.to_string(),
        );
        let err = out.expect_error(7, &format!("bandwidth {bw}"));
        assert!(err.msg.contains(field), "{bw}: {err:?}");
        let mut after = node.snapshot(Some(&pod));
        after
            .data_dir_files
            .retain(|f| f.file_name().is_none_or(|n| n != "lock"));
        let mut before = before;
        before
            .data_dir_files
            .retain(|f| f.file_name().is_none_or(|n| n != "lock"));
        assert_eq!(after, before, "{bw}: a refused ADD changed the node");
    }
    // A key of the reference plugins that ebpf-cni refuses (the whole table is
    // tests/tests/stock_keys.rs'): refused by ADD and CHECK, never ignored; DEL of the
    // refused pod still succeeds.
    let mut conf = conf_with(&p, &node, None);
    conf["masqAll"] = json!(true);
    let cid = unique_container_id();
    let before = node.snapshot(Some(&pod));
    for cmd in [CniCommand::Add, CniCommand::Check] {
        let err = p
            .run(
                &node,
                cmd,
                &p.env(&cid, pod.path(), "eth0"),
                conf.to_string(),
            )
            .expect_error(7, "masqAll");
        assert!(
            err.msg
                .contains("masqAll true is refused (a key of the reference portmap plugin)"),
            "{err:?}"
        );
    }
    p.run(
        &node,
        CniCommand::Del,
        &p.env(&cid, pod.path(), "eth0"),
        conf.to_string(),
    )
    .expect_success("DEL of the refused pod");
    let mut after = node.snapshot(Some(&pod));
    let mut before = before;
    for s in [&mut after, &mut before] {
        s.data_dir_files
            .retain(|f| f.file_name().is_none_or(|n| n != "lock"));
    }
    assert_eq!(after, before, "a refused ADD changed the node");
}

/// The DEL of a paced pod removes its pacing entry by the key its placement record names
/// (its namespace's cookie), with no walk of the pacing map; whether the node still paces
/// any pod (which keeps the pacing program on the cgroup root) is then the map's first
/// key, not a walk. Both pods are paced (an egress limit).
#[test]
fn del_removes_the_pacing_entry_by_key_and_asks_for_one_more() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let traced = ebpf_cni_tests::strace::Traced::new(&p.bin, "bpf,close").unwrap();
    let t = PluginUnderTest::at(traced.wrapper.clone());
    let node = Node::new().unwrap();
    let conf = conf_with(
        &p,
        &node,
        Some(json!({"egressRate": 100_000_000, "egressBurst": 1_000_000})),
    );
    let (a, b) = (
        Pod::add_direct(&p, &node, &conf),
        Pod::add_direct(&p, &node, &conf),
    );
    assert_eq!(
        dp::map_entries(&node, dp::PACING_MAP).unwrap().len(),
        2,
        "control: both pods are paced"
    );
    let del = |p: &PluginUnderTest, pod: &Pod| {
        p.run(&node, CniCommand::Del, &pod.env(p), conf.to_string())
            .expect_success("DEL")
    };
    del(&t, &a);
    let trace = traced.log().unwrap();
    assert_eq!(
        ebpf_cni_tests::strace::next_key_calls(&trace, dp::PACING_MAP),
        // The first key, after the removal by key.
        vec![true],
        "the DEL's bpf and close calls:\n{trace}"
    );
    assert_eq!(dp::map_entries(&node, dp::PACING_MAP).unwrap().len(), 1);
    let sockops = ebpf_cni_maps::PROG_SOCKOPS;
    let paced = || {
        ebpf_cni_tests::bpf::node_cgroup_programs(node.pin_root())
            .unwrap()
            .contains(sockops)
    };
    assert!(
        paced(),
        "{sockops} stays on the cgroup root while a pod is paced"
    );
    // The node's last pod: its maps go with it.
    del(&p, &b);
    assert!(!paced(), "{sockops} goes with the last paced pod");
}

/// containerd's keys with its "no burst" (4294967295) on a 10 Mbit/s limit, on every path a
/// redirect could take past a qdisc (k8s#90838, cilium#15824): a pod with only an egress
/// limit sending TCP, and UDP at twice the limit, to a pod on the same node, to a host
/// behind the node and to another pod's host port at the node's address; a pod with only an
/// ingress limit receiving the same from a pod on the same node, from the host behind the
/// node and through its own host port. The receiver gets at most a second of the rate plus
/// the default burst (128 KiB at 10 Mbit/s) in its first second, and the rate after it:
/// ±5% where the kernel has `sch_fq` (the matrix's 6.12 guest). Without it (this machine)
/// the ingress limit is policed: UDP still holds ±5%, one TCP stream towards the pod gets
/// part of the limit and never more, and TCP from the pod is paced by its socket (at least
/// half the limit here, as in `tcp_from_a_limited_pod_is_paced_to_the_limit`).
#[test]
fn runtime_bursts_hold_every_path_to_the_limit() {
    use ebpf_cni_tests::config::MTU;
    use ebpf_cni_tests::rate::iperf_after_first_second;
    use std::net::SocketAddr;
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "up0", 80).unwrap();
    let limit = 10e6;
    let burst_bytes = 128.0 * 1024.0;
    let paced = bpf::kernel_has_sch_fq();
    let mappings = |port: u16| {
        json!({"portMappings": [
            {"hostPort": port, "containerPort": port, "protocol": "tcp"},
            {"hostPort": port, "containerPort": port, "protocol": "udp"},
        ]})
    };
    let with = |runtime: Value| {
        let mut c = conf_with(&p, &node, None);
        c["runtimeConfig"] = runtime;
        c
    };
    // The egress pod's receivers: a plain pod (also behind host port 5390), and the host.
    let (plain_port, ingress_port) = (5390, 5391);
    let plain_conf = with(mappings(plain_port));
    let plain = Pod::add_direct(&p, &node, &plain_conf);
    let egress_conf = with(json!({"bandwidth":
        {"EgressRate": limit as u64, "EgressBurst": 4294967295u64}}));
    let egress = Pod::add_direct(&p, &node, &egress_conf);
    let mut ingress_conf = with(mappings(ingress_port));
    ingress_conf["runtimeConfig"]["bandwidth"] =
        json!({"IngressRate": limit as u64, "IngressBurst": 4294967295u64});
    let ingress = Pod::add_direct(&p, &node, &ingress_conf);
    let report = dp::inspect(Path::new(&p.bin), &node).unwrap();
    let mode = &dp::inspect_attachment(&report, ingress.id()).unwrap()["ingress_limit"]["mode"];
    assert_eq!(
        mode,
        &json!(if paced {
            "edt+fq"
        } else {
            "policer (no sch_fq)"
        }),
        "{report:#}"
    );

    let node_addr = |port| SocketAddr::new(IpAddr::V4(ext.node_v4), port);
    let at = |ip: IpAddr, port| SocketAddr::new(ip, port);
    let ext_ip = IpAddr::V4(ext.v4);
    // Datagrams that fit the pods' MTU: a policer drops fragments one by one, and a
    // datagram with one fragment lost is lost (the receiver got 0.57 of the limit with
    // 1,400-byte payloads in 1,400-byte packets).
    let payload = MTU - 28;
    let (l, b) = (payload.to_string(), (2.0 * limit).to_string());
    let udp = ["-u", "-l", &l, "-b", &b];
    // Frame bytes per payload byte at the pods' MTU: TCP with timestamps, UDP over IPv4.
    let wire_per_payload = |udp_payload: Option<u32>| match udp_payload {
        Some(l) => f64::from(l + 42) / f64::from(l),
        None => f64::from(MTU + 14) / f64::from(MTU - 52),
    };
    let mut measured = Vec::new();
    // (what, client, server, listen, connect, towards the ingress-limited pod)
    let paths: [(&str, &Netns, &Netns, SocketAddr, SocketAddr, bool); 6] = [
        (
            "from the egress pod to a pod on the node",
            &egress.netns,
            &plain.netns,
            at(plain.v4(), 5301),
            at(plain.v4(), 5301),
            false,
        ),
        (
            "from the egress pod to a host behind the node",
            &egress.netns,
            ext.netns(),
            at(ext_ip, 5302),
            at(ext_ip, 5302),
            false,
        ),
        (
            "from the egress pod to a host port at the node's address",
            &egress.netns,
            &plain.netns,
            at(plain.v4(), plain_port),
            node_addr(plain_port),
            false,
        ),
        (
            "to the ingress pod from a pod on the node",
            &plain.netns,
            &ingress.netns,
            at(ingress.v4(), 5303),
            at(ingress.v4(), 5303),
            true,
        ),
        (
            "to the ingress pod from a host behind the node",
            ext.netns(),
            &ingress.netns,
            at(ingress.v4(), 5304),
            at(ingress.v4(), 5304),
            true,
        ),
        (
            "to the ingress pod through its host port",
            ext.netns(),
            &ingress.netns,
            at(ingress.v4(), ingress_port),
            node_addr(ingress_port),
            true,
        ),
    ];
    for (what, client, server, listen, connect, towards) in paths {
        for (proto, extra, payload) in [("TCP", &[][..], None), ("UDP", &udp[..], Some(payload))] {
            let qdiscs = || {
                node.netns()
                    .exec(&["tc", "-s", "qdisc", "show"])
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default()
            };
            let qdiscs_before = qdiscs();
            let got = iperf_after_first_second(client, server, listen, connect, 6, extra);
            let steady = got.steady_bps * wire_per_payload(payload);
            let first = got.first_bytes * wire_per_payload(payload);
            let first_bound = 1.05 * limit / 8.0 * got.first_secs + burst_bytes;
            let dropped = got.receiver_socket_drops;
            eprintln!(
                "{proto} {what}: first second {first:.0} bytes (bound {first_bound:.0}), then \
                 {:.4} of the limit ({dropped} datagrams dropped at the receiver's socket)",
                steady / limit
            );
            measured.push((proto, what, steady / limit));
            assert!(
                first <= first_bound,
                "{proto} {what}: {first:.0} bytes on the wire in the first {:.2} s, over a \
                 second of the limit and the default burst ({first_bound:.0})",
                got.first_secs
            );
            // Without sch_fq one TCP stream towards a policed pod backs off below the rate,
            // and TCP from the pod is paced by a timer a busy machine fires late.
            let low = match (paced, proto, towards) {
                (true, ..) | (false, "UDP", _) => 0.95,
                (false, _, true) => 0.2,
                (false, _, false) => 0.5,
            };
            assert!(
                (low * limit..=1.05 * limit).contains(&steady),
                "{proto} {what}: {steady:.0} bit/s on the wire after the first second, {:.3} \
                 of the limit (allowed {low}–1.05); the receiver's socket dropped {dropped} \
                 datagrams (a full receive buffer); bytes per interval sent {:?}, received \
                 {:?}; the ingress pod's counters {}; the node's qdiscs before:\n{qdiscs_before}\nafter:\n{}",
                steady / limit,
                got.sent_per_interval,
                got.received_per_interval,
                dp::inspect_attachment(&dp::inspect(Path::new(&p.bin), &node).unwrap(), ingress.id())
                    .map(|a| a["to_pod"].to_string())
                    .unwrap_or_default(),
                qdiscs(),
            );
        }
    }
    eprintln!("measured: {measured:?}");

    for (pod, conf) in [
        (&plain, &plain_conf),
        (&egress, &egress_conf),
        (&ingress, &ingress_conf),
    ] {
        pod.del_direct(&p, &node, conf);
    }
    assert!(node.pinned_files().is_empty(), "{:?}", node.pinned_files());
}
