//! `ebpf-cni metrics` against the real kernel: the node's counters in the Prometheus text
//! format, read by a Prometheus text parser as a scraper would, move with real traffic for
//! the pod and host port that carried it and for no other; `--listen` serves them over HTTP
//! and survives garbage; `--output` replaces its file atomically; and the conflist's
//! `logLevel`/`logFile` steer the log.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ebpf_cni_tests::config::Stack;
use ebpf_cni_tests::dataplane as dp;
use ebpf_cni_tests::external::ExternalHost;
use ebpf_cni_tests::host_ports::{sa, tag_of, tcp_ask, PodServer};
use ebpf_cni_tests::{
    require_root, unique_container_id, Attachment, CniCommand, NetConfList, Node, PluginUnderTest,
    Pod,
};
use prometheus_parse::{Sample, Scrape, Value as PromValue};
use serde_json::{json, Value};

/// A 1 Gbit/s limit on pod A: the limiter gauges must show it, and it holds back none of the
/// test's few connections.
const RATE_BPS: u64 = 1_000_000_000;
const BURST_BITS: u64 = 8_000_000;

fn list(p: &PluginUnderTest, node: &Node) -> NetConfList {
    let mut conf = p.conf("1.0.0", node, Stack::V4);
    conf["capabilities"] = json!({"portMappings": true, "bandwidth": true});
    NetConfList::single(&conf)
}

/// An IPv4 pod with `host_port` -> 80/tcp, and a limit of [`RATE_BPS`] each way when
/// `limit`.
fn add(p: &PluginUnderTest, node: &Node, l: &NetConfList, host_port: u16, limit: bool) -> Pod {
    Pod::add_with(p, node, l, Stack::V4, |att| {
        let att = att.with_capability(
            "portMappings",
            json!([{"hostPort": host_port, "containerPort": 80, "protocol": "tcp"}]),
        );
        if !limit {
            return att;
        }
        att.with_capability(
            "bandwidth",
            json!({"ingressRate": RATE_BPS, "ingressBurst": BURST_BITS,
                   "egressRate": RATE_BPS, "egressBurst": BURST_BITS}),
        )
    })
}

/// `ebpf-cni metrics --netns <node> [extra]`: stdout, or a panic with stderr.
fn metrics(bin: &Path, node: &Node, extra: &[&str]) -> String {
    let out = Command::new(bin)
        .env_remove("CNI_COMMAND")
        .arg("metrics")
        .arg("--netns")
        .arg(node.netns().path())
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "metrics failed ({:?}): {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("the exposition is UTF-8")
}

/// Parses the exposition; every sample line must come out as a sample (the parser skips
/// lines it cannot read, which must not hide a malformed one).
fn parse(text: &str) -> Scrape {
    let scrape =
        Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("the exposition parses");
    let lines = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    assert_eq!(
        scrape.samples.len(),
        lines,
        "lines the parser skipped in:\n{text}"
    );
    if std::env::var_os("EBPF_CNI_TEST_SHOW_METRICS").is_some() {
        eprintln!("{text}");
    }
    scrape
}

fn value(s: &Sample) -> f64 {
    match s.value {
        PromValue::Counter(v) | PromValue::Gauge(v) | PromValue::Untyped(v) => v,
        ref other => panic!("{}: unexpected value {other:?}", s.metric),
    }
}

/// The one sample of `metric` whose labels include all of `labels`.
fn one(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<&Sample> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{metric}{labels:?}: expected one sample, found {found:?}"
    );
    value(found[0])
}

/// Every sample of the exposition by (metric, sorted labels), for comparing two scrapes.
fn by_series(scrape: &Scrape) -> HashMap<String, f64> {
    scrape
        .samples
        .iter()
        .map(|s| {
            let mut labels: Vec<_> = s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            labels.sort();
            (format!("{}{{{}}}", s.metric, labels.join(",")), value(s))
        })
        .collect()
}

/// Counters for the right pod and the right host port only; node gauges; the format's rules
/// (counters end in `_total` and are typed counter).
#[test]
fn counters_move_with_traffic_for_the_right_pod_and_host_port_only() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let ext = ExternalHost::attach(node.netns(), "uplink0", 41).unwrap();
    let l = list(&p, &node);
    let a = add(&p, &node, &l, 8080, true);
    let b = add(&p, &node, &l, 8081, false);
    let _server = PodServer::start(&a.netns, 80, "podA");
    let _server_b = PodServer::start(&b.netns, 80, "podB");
    let node4: IpAddr = ext.node_v4.into();

    let before_text = metrics(&p.bin, &node, &[]);
    let before = parse(&before_text);
    for s in &before.samples {
        assert!(s.metric.starts_with("ebpf_cni_"), "{}", s.metric);
        assert_eq!(
            matches!(s.value, PromValue::Counter(_)),
            s.metric.ends_with("_total"),
            "{}: counters and only counters end in _total",
            s.metric
        );
        assert!(
            before.docs.contains_key(&s.metric),
            "{} has no # HELP",
            s.metric
        );
    }
    let pod = |x: &Pod, dir: &'static str| -> Vec<(&'static str, String)> {
        vec![
            ("network", ebpf_cni_tests::config::NETWORK.to_owned()),
            ("container_id", x.id().to_owned()),
            ("ifname", "eth0".to_owned()),
            ("address", x.v4().to_string()),
            ("direction", dir.to_owned()),
        ]
    };
    let get = |s: &Scrape, metric: &str, labels: &[(&'static str, String)]| {
        let l: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        one(s, metric, &l)
    };
    let port = |hp: u16, x: &Pod| -> Vec<(&'static str, String)> {
        vec![
            ("container_id", x.id().to_owned()),
            ("protocol", "tcp".to_owned()),
            ("host_ip", "0.0.0.0".to_owned()),
            ("host_port", hp.to_string()),
            ("pod_address", x.v4().to_string()),
            ("pod_port", "80".to_owned()),
        ]
    };

    // Node gauges.
    assert_eq!(one(&before, "ebpf_cni_attachments", &[]), 2.0);
    assert_eq!(one(&before, "ebpf_cni_endpoints", &[]), 2.0);
    assert_eq!(one(&before, "ebpf_cni_port_mappings", &[]), 2.0);
    assert_eq!(
        one(
            &before,
            "ebpf_cni_map_entries",
            &[("map", "ECNI_ENDPOINTS")]
        ),
        2.0
    );
    assert_eq!(
        one(&before, "ebpf_cni_map_entries", &[("map", "ECNI_PORTMAP")]),
        2.0
    );
    assert_eq!(
        one(
            &before,
            "ebpf_cni_map_max_entries",
            &[("map", "ECNI_PORTMAP")]
        ),
        65536.0
    );
    // The `map` label's values are spelled out: they are what operators' queries and
    // dashboards name, so a renamed map must fail here rather than follow silently.
    for map in [
        "ECNI_ENDPOINTS",
        "ECNI_POD_CNT",
        "ECNI_TRACE",
        "ECNI_RATES",
        "ECNI_PORTMAP",
        "ECNI_PM_HITS",
        "ECNI_NAT_REV",
        "ECNI_SOCK_REV",
        "ECNI_NODE_ADDR",
        "ECNI_CONFIG",
        "ECNI_PACING",
        "ECNI_NS_PROBE",
    ] {
        let used = one(&before, "ebpf_cni_map_entries", &[("map", map)]);
        let max = one(&before, "ebpf_cni_map_max_entries", &[("map", map)]);
        assert!(max > 0.0 && used <= max, "{map}: {used} of {max}");
    }
    let inspect = dp::inspect(&p.bin, &node).unwrap();
    for rev in inspect["revisions"].as_array().unwrap() {
        assert_eq!(
            one(
                &before,
                "ebpf_cni_programs_info",
                &[("revision", rev.as_str().unwrap())]
            ),
            1.0
        );
    }
    for m in inspect["modes"].as_array().unwrap() {
        let degraded = one(
            &before,
            "ebpf_cni_kernel_part_degraded",
            &[("part", m["part"].as_str().unwrap())],
        );
        assert_eq!(degraded == 1.0, m["degraded"].as_bool().unwrap(), "{m}");
    }
    // Limiter: pod A police (egress also paced where the kernel paces), pod B none.
    let a_att = dp::inspect_attachment(&inspect, a.id()).unwrap();
    let egress_mode = if a_att["tcp_pacing_bytes"].is_null() {
        "police"
    } else {
        "police_and_pace"
    };
    for (dir, mode) in [("ingress", "police"), ("egress", egress_mode)] {
        let mut l = pod(&a, dir);
        l.push(("mode", mode.to_owned()));
        assert_eq!(get(&before, "ebpf_cni_pod_limiter", &l), 1.0, "{dir}");
        assert_eq!(
            get(
                &before,
                "ebpf_cni_pod_limit_rate_bytes_per_second",
                &pod(&a, dir)
            ),
            (RATE_BPS / 8) as f64
        );
        let mut l = pod(&b, dir);
        l.push(("mode", "none".to_owned()));
        assert_eq!(get(&before, "ebpf_cni_pod_limiter", &l), 1.0, "{dir}");
    }

    // Traffic: external host -> node:8080 -> pod A, 20 connections.
    const CONNECTIONS: usize = 20;
    for _ in 0..CONNECTIONS {
        let answer = tcp_ask(ext.netns(), sa(node4, 8080)).unwrap();
        assert_eq!(tag_of(&answer), "podA");
    }
    let after = parse(&metrics(&p.bin, &node, &[]));

    let delta = |metric: &str, labels: &[(&'static str, String)]| {
        get(&after, metric, labels) - get(&before, metric, labels)
    };
    // Each connection: at least SYN, ACK, data, FIN towards the pod, and replies back.
    let a_in = delta("ebpf_cni_pod_packets_total", &pod(&a, "ingress"));
    let a_out = delta("ebpf_cni_pod_packets_total", &pod(&a, "egress"));
    assert!(
        a_in >= (3 * CONNECTIONS) as f64,
        "pod A ingress packets +{a_in}"
    );
    assert!(
        a_out >= (3 * CONNECTIONS) as f64,
        "pod A egress packets +{a_out}"
    );
    let a_bytes = delta("ebpf_cni_pod_bytes_total", &pod(&a, "ingress"));
    assert!(
        a_bytes >= (CONNECTIONS * 5) as f64,
        "pod A ingress bytes +{a_bytes}"
    );
    // Pod B carried none of it: nothing towards it; from it at most its own IPv6 link-local
    // chatter (router solicitations, MLD), never the test's connections.
    assert_eq!(
        delta("ebpf_cni_pod_packets_total", &pod(&b, "ingress")),
        0.0,
        "pod B ingress moved"
    );
    let b_out = delta("ebpf_cni_pod_packets_total", &pod(&b, "egress"));
    assert!(b_out < CONNECTIONS as f64, "pod B egress packets +{b_out}");
    for dir in ["ingress", "egress"] {
        for x in [&a, &b] {
            for m in ["ebpf_cni_pod_drops_total", "ebpf_cni_pod_errors_total"] {
                assert_eq!(get(&after, m, &pod(x, dir)), 0.0, "{m} {dir}");
            }
        }
    }
    // Host ports: 8080 counted every packet towards the pod, 8081 nothing.
    let hits_a = delta("ebpf_cni_host_port_packets_total", &port(8080, &a));
    assert!(hits_a >= (3 * CONNECTIONS) as f64, "8080 hits +{hits_a}");
    assert!(delta("ebpf_cni_host_port_bytes_total", &port(8080, &a)) > 0.0);
    assert_eq!(
        delta("ebpf_cni_host_port_packets_total", &port(8081, &b)),
        0.0
    );
    assert_eq!(
        delta("ebpf_cni_host_port_bytes_total", &port(8081, &b)),
        0.0
    );
    // Gauges stay; the same series exist in both scrapes.
    let (sb, sa_) = (by_series(&before), by_series(&after));
    let mut kb: Vec<_> = sb.keys().collect();
    let mut ka: Vec<_> = sa_.keys().collect();
    kb.sort();
    ka.sort();
    assert_eq!(kb, ka, "the set of series changed with traffic");

    for x in [&a, &b] {
        p.runtime.del(&node, &l, &x.att, Some(&x.result)).unwrap();
    }
    // A node without pods has no maps: the exposition says so without failing.
    let empty = parse(&metrics(&p.bin, &node, &[]));
    assert_eq!(one(&empty, "ebpf_cni_attachments", &[]), 0.0);
    assert!(!empty
        .samples
        .iter()
        .any(|s| s.metric == "ebpf_cni_pod_packets_total"));
}

/// A running `metrics --listen`, killed on drop.
struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn listen(bin: &Path, node: &Node, addr: &str) -> Server {
    let mut child = Command::new(bin)
        .env_remove("CNI_COMMAND")
        .arg("metrics")
        .arg("--netns")
        .arg(node.netns().path())
        .args(["--listen", addr])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The first stderr line names the bound address (port 0 picks a free one).
    let mut err = child.stderr.take().unwrap();
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while err.read(&mut b).unwrap_or(0) == 1 && b[0] != b'\n' {
        line.push(b[0]);
    }
    let line = String::from_utf8_lossy(&line).into_owned();
    let url = line
        .split("http://")
        .nth(1)
        .unwrap_or_else(|| panic!("metrics --listen said {line:?}"));
    let addr: SocketAddr = url.trim_end_matches("/metrics").parse().unwrap();
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut err, &mut std::io::sink());
    });
    Server { child, addr }
}

/// Sends raw bytes, half-closes, returns what came back (empty: closed without answer).
fn raw(addr: SocketAddr, request: &[u8]) -> String {
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The server may answer and close before it has read everything (a huge line): a
    // failed write is not the test's concern, the answer is.
    let _ = c.write_all(request);
    let _ = c.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// SO_LINGER 0: closing sends a reset instead of a FIN.
fn reset_on_close(c: &TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on a socket we own, with a pointer to a live `linger` of its size.
    let rc = unsafe {
        libc::setsockopt(
            c.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_LINGER: {}", std::io::Error::last_os_error());
}

fn status(response: &str) -> Option<u16> {
    let line = response.lines().next()?;
    let mut it = line.split(' ');
    if !it.next()?.starts_with("HTTP/1.") {
        return None;
    }
    it.next()?.parse().ok()
}

/// `--listen`: GET /metrics answers 200 with the exposition; garbage gets 4xx or a closed
/// connection, and a good scrape still works after all of it.
#[test]
fn listen_serves_scrapes_and_survives_garbage() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let l = list(&p, &node);
    let a = add(&p, &node, &l, 9090, false);
    let server = listen(&p.bin, &node, "127.0.0.1:0");

    let good = || raw(server.addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    let first = good();
    assert_eq!(status(&first), Some(200), "{first}");
    let (head, body) = first.split_once("\r\n\r\n").unwrap();
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    let scrape = parse(body);
    assert_eq!(one(&scrape, "ebpf_cni_attachments", &[]), 1.0);
    let v4 = a.v4().to_string();
    assert_eq!(
        one(
            &scrape,
            "ebpf_cni_host_port_packets_total",
            &[("host_port", "9090"), ("pod_address", v4.as_str())]
        ),
        0.0
    );

    let huge_line = {
        let mut v = b"GET /".to_vec();
        v.extend(vec![b'a'; 100_000]);
        v
    };
    let huge_header = {
        let mut v = b"GET /metrics HTTP/1.1\r\nX-Big: ".to_vec();
        v.extend(vec![b'b'; 100_000]);
        v.extend_from_slice(b"\r\n\r\n");
        v
    };
    let cases: Vec<(&str, Vec<u8>, &[u16])> = vec![
        (
            "raw bytes",
            vec![0, 0xff, 0xfe, 0x13, b'\r', b'\n', b'\r', b'\n'],
            &[400],
        ),
        ("nothing", vec![], &[]),
        ("half a request", b"GET /metr".to_vec(), &[]),
        // 414 URI Too Long and 431 Request Header Fields Too Large are the precise codes.
        ("huge request line", huge_line, &[400, 414, 431]),
        ("huge header", huge_header, &[400, 431]),
        (
            "wrong method",
            b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc".to_vec(),
            &[405],
        ),
        (
            "DELETE",
            b"DELETE /metrics HTTP/1.0\r\n\r\n".to_vec(),
            &[405],
        ),
        (
            "unknown path",
            b"GET /nope HTTP/1.1\r\n\r\n".to_vec(),
            &[404],
        ),
        (
            "HTTP/2 preface",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
            &[400],
        ),
    ];
    for (what, request, allowed) in cases {
        let response = raw(server.addr, &request);
        match status(&response) {
            // No answer at all: the server closed the connection.
            None => assert!(response.is_empty(), "{what}: not HTTP: {response:?}"),
            Some(code) => assert!(
                allowed.contains(&code),
                "{what}: status {code}, expected one of {allowed:?} or a close"
            ),
        }
    }
    // Clients that reset the connection before the answer is written: the write fails
    // (EPIPE), which must not end the server (as SIGPIPE would).
    for _ in 0..5 {
        let c = TcpStream::connect_timeout(&server.addr, Duration::from_secs(5)).unwrap();
        (&c).write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        reset_on_close(&c);
        drop(c);
    }
    std::thread::sleep(Duration::from_millis(500));
    // A client that starts a request and goes silent is closed on (or answered 408) once
    // the 5 s the head may take are over, while others are served meanwhile.
    let slow = TcpStream::connect_timeout(&server.addr, Duration::from_secs(5)).unwrap();
    (&slow)
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let t = Instant::now();
    assert_eq!(status(&good()), Some(200), "served while a client dribbles");
    let mut out = Vec::new();
    let _ = (&slow).read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out);
    assert!(
        t.elapsed() < Duration::from_secs(10) && matches!(status(&out), None | Some(408)),
        "the slow client got {out:?} after {:?}",
        t.elapsed()
    );
    // HEAD: the head of a 200, no body.
    let head = raw(server.addr, b"HEAD /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status(&head), Some(200), "{head}");
    assert!(head.ends_with("\r\n\r\n"), "HEAD sent a body");

    let again = good();
    assert_eq!(status(&again), Some(200), "after garbage: {again}");
    let mut server = server;
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "the server exited"
    );
    drop(server);
    p.runtime.del(&node, &l, &a.att, Some(&a.result)).unwrap();
}

/// A port in use: a clear error naming the address, a non-zero exit, at once.
#[test]
fn listen_on_a_port_in_use_fails_naming_the_address() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let start = Instant::now();
    let out = Command::new(&p.bin)
        .env_remove("CNI_COMMAND")
        .arg("metrics")
        .arg("--netns")
        .arg(node.netns().path())
        .args(["--listen", &addr])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&addr) && err.to_lowercase().contains("in use"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}

/// `--output`: a complete exposition in the file, no temporary file beside it, on a node
/// with pods and after they are gone.
#[test]
fn output_leaves_a_complete_file_and_no_temporary() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let l = list(&p, &node);
    let a = add(&p, &node, &l, 9191, true);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ebpf_cni.prom");
    let file_arg = file.to_string_lossy().into_owned();
    for expected in [1.0, 0.0] {
        let stdout = metrics(&p.bin, &node, &["--output", &file_arg]);
        assert!(stdout.is_empty(), "--output printed {stdout:?}");
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.ends_with('\n'));
        let scrape = parse(&text);
        assert_eq!(one(&scrape, "ebpf_cni_attachments", &[]), expected);
        // The last family is there: the file is whole.
        assert!(scrape
            .samples
            .iter()
            .any(|s| s.metric == "ebpf_cni_metrics_read_seconds"));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["ebpf_cni.prom".to_owned()]);
        if expected == 1.0 {
            p.runtime.del(&node, &l, &a.att, Some(&a.result)).unwrap();
        }
    }
}

fn conf_with_logging(p: &PluginUnderTest, node: &Node, log: Value) -> Value {
    let mut conf = p.conf("1.0.0", node, Stack::V4);
    for (k, v) in log.as_object().unwrap() {
        conf[k] = v.clone();
    }
    conf
}

/// `logLevel`/`logFile` from the configuration: debug lines land in a 0600 file; an
/// unopenable file never fails the command (a warning on stderr instead); the environment
/// wins over the configuration.
#[test]
fn log_file_and_level_from_the_config() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("ebpf-cni.log");
    let conf = conf_with_logging(
        &p,
        &node,
        json!({"logLevel": "debug", "logFile": log.to_string_lossy()}),
    );
    let pod = node.new_pod().unwrap();
    let cid = unique_container_id();
    // An empty EBPF_CNI_LOG counts as unset, whatever the test's own environment says.
    let env = p
        .env(&cid, pod.path(), "eth0")
        .with_env("EBPF_CNI_LOG", "")
        .with_env("EBPF_CNI_LOG_FILE", "");
    let out = p.run(&node, CniCommand::Add, &env, conf.to_string());
    out.expect_success("ADD with logFile");
    assert!(
        !out.stderr.contains("DEBUG"),
        "debug lines went to stderr: {}",
        out.stderr
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains(" DEBUG ADD ") && l.contains(&cid)),
        "no debug line of this ADD in the log file:\n{text}"
    );
    let mode = std::fs::metadata(&log).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "log file mode {mode:o}");
    // Appended to, not truncated.
    let len = text.len();
    let out = p.run(&node, CniCommand::Del, &env, conf.to_string());
    out.expect_success("DEL with logFile");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.len() > len && text.lines().any(|l| l.contains(" DEBUG DEL ")));

    // A logFile under a missing directory: ADD succeeds, one warning on stderr.
    let bad = dir.path().join("missing-dir/ebpf-cni.log");
    let conf = conf_with_logging(
        &p,
        &node,
        json!({"logLevel": "info", "logFile": bad.to_string_lossy()}),
    );
    let pod = node.new_pod().unwrap();
    let cid = unique_container_id();
    let env = p
        .env(&cid, pod.path(), "eth0")
        .with_env("EBPF_CNI_LOG", "")
        .with_env("EBPF_CNI_LOG_FILE", "");
    let out = p.run(&node, CniCommand::Add, &env, conf.to_string());
    out.expect_success("ADD with an unopenable logFile");
    let warnings = out
        .stderr
        .lines()
        .filter(|l| l.contains("cannot open the log file"))
        .count();
    assert_eq!(warnings, 1, "stderr: {}", out.stderr);
    assert!(!bad.exists());
    // The environment wins: EBPF_CNI_LOG_FILE over logFile, EBPF_CNI_LOG over logLevel.
    let env_log = dir.path().join("from-env.log");
    let env = env
        .with_env("EBPF_CNI_LOG", "error")
        .with_env("EBPF_CNI_LOG_FILE", &env_log.to_string_lossy());
    let conf = conf_with_logging(
        &p,
        &node,
        json!({"logLevel": "debug", "logFile": log.to_string_lossy()}),
    );
    let before = std::fs::read_to_string(&log).unwrap();
    let out = p.run(&node, CniCommand::Del, &env, conf.to_string());
    out.expect_success("DEL with both");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), before);
    let env_text = std::fs::read_to_string(&env_log).unwrap_or_default();
    assert!(!env_text.contains("DEBUG"), "{env_text}");
}

/// Chained mode (after Debian's `bridge`): `logLevel`/`logFile` in ebpf-cni's entry are
/// accepted and steer its log, as in a plain configuration.
#[test]
fn log_file_from_a_chained_config() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("chained.log");
    let mut bridge = p.conf("1.0.0", &node, Stack::V4);
    bridge["type"] = json!("bridge");
    bridge["bridge"] = json!("cni-mlog0");
    bridge["isGateway"] = json!(true);
    let ebpf = json!({
        "type": p.plugin_type,
        "capabilities": {"portMappings": true},
        "logLevel": "debug",
        "logFile": log.to_string_lossy(),
    });
    let l = NetConfList::chain(&bridge, vec![ebpf]);
    let netns = node.new_pod().unwrap();
    let cid = unique_container_id();
    let att = Attachment::new(&cid, netns.path(), "eth0").with_capability(
        "portMappings",
        json!([{"hostPort": 9292, "containerPort": 80, "protocol": "tcp"}]),
    );
    let result = p
        .runtime
        .add(&node, &l, &att)
        .unwrap_or_else(|e| panic!("chained ADD: {e}"));
    p.runtime.del(&node, &l, &att, Some(&result)).unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains(" DEBUG ADD ") && l.contains(&cid)),
        "no debug line of the chained ADD:\n{text}"
    );
    let mode = std::fs::metadata(&log).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

/// A scrape reads the node's maps, not each pod's pins: its series say nothing of a pod's
/// links (a link's state is CHECK's and STATUS's), and opening each pod's link pins and
/// program records was most of a pod's share of a scrape (300 pods: 22–42 → 11–12 ms
/// here). Under `strace -e trace=bpf`, `metrics` opens no pin under `attachments/`, while
/// both pods' counters and limits are in the exposition; `inspect` still reads the pins.
#[test]
fn a_scrape_opens_no_pin_of_a_pod() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let traced = ebpf_cni_tests::strace::Traced::new(&p.bin, "bpf").unwrap();
    let node = Node::new().unwrap();
    let l = list(&p, &node);
    let a = add(&p, &node, &l, 8090, true);
    let b = add(&p, &node, &l, 8091, false);

    let scrape = parse(&metrics(&traced.wrapper, &node, &[]));
    let opened: Vec<String> = traced
        .log()
        .unwrap()
        .lines()
        .filter(|l| l.contains("BPF_OBJ_GET,"))
        .map(str::to_owned)
        .collect();
    assert!(
        opened.iter().any(|l| l.contains("/maps/")),
        "the scrape opened no map at all:\n{}",
        opened.join("\n")
    );
    let pins: Vec<&String> = opened
        .iter()
        .filter(|l| l.contains("/attachments/"))
        .collect();
    assert!(
        pins.is_empty(),
        "the scrape opened pod pins:\n{}",
        pins.iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    for x in [&a, &b] {
        let labels = [
            ("network", ebpf_cni_tests::config::NETWORK),
            ("container_id", x.id()),
            ("ifname", "eth0"),
            ("direction", "egress"),
        ];
        assert!(
            scrape
                .samples
                .iter()
                .any(|s| s.metric == "ebpf_cni_pod_packets_total"
                    && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))),
            "no packet counter of pod {} in the scrape",
            x.id()
        );
    }
    let limited = scrape
        .samples
        .iter()
        .filter(|s| {
            s.metric.starts_with("ebpf_cni_pod_limit")
                && s.labels.get("container_id") == Some(a.id())
        })
        .count();
    assert!(limited > 0, "pod A's limit is not in the scrape");

    let inspect = Command::new(&traced.wrapper)
        .env_remove("CNI_COMMAND")
        .arg("inspect")
        .arg("--netns")
        .arg(node.netns().path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(inspect.status.success(), "inspect failed");
    assert!(
        traced.log().unwrap().contains("/attachments/"),
        "inspect read no pod pin"
    );
    for x in [&a, &b] {
        p.runtime.del(&node, &l, &x.att, Some(&x.result)).unwrap();
    }
}
