//! Routing: pod to pod, device to pod, the FIB's answers, the TTL, ARP for the gateway,
//! the routing floor, and what the stack sends into a pod.

use super::{arriving, checksums_ok, family, from, lab, prototype_lab};
use ebpf_cni_tests::packet::{parse, Arp, Pkt, ARP_REPLY, L4, TCP_ACK, TCP_SYN};
use ebpf_cni_tests::progtest::{Lab, LabPod, Verdict};

/// Pod to pod: redirected (`bpf_redirect_peer`) with the destination pod's MACs (its
/// gateway's as the source), one hop less, the transport untouched, and counted on both
/// pods.
#[test]
fn pod_to_pod_is_redirected_with_the_peers_macs_and_one_hop_less() {
    let lab = lab();
    let (a, b) = (&lab.a, &lab.b);
    let mut bytes = 0;
    for v4 in [true, false] {
        let frame = from(a, b.addr(v4), L4::tcp(40_000, 80, TCP_SYN))
            .payload(20)
            .frame();
        bytes += frame.len() as u64;
        let r = lab.from_pod(a, &frame);
        let f = family(v4);
        assert_eq!(r.verdict, Verdict::Redirect, "{f}");
        let (sent, got) = (parse(&frame), parse(&r.frame));
        assert_eq!((got.src_mac, got.dst_mac), (b.host_mac, b.pod_mac), "{f}");
        assert_eq!(got.ttl, 63, "{f}: TTL / hop limit");
        assert_eq!((got.src, got.dst), (sent.src, sent.dst), "{f}");
        assert_eq!(got.l4, sent.l4, "{f}: the transport is untouched");
        checksums_ok(&r.frame, f);
    }
    let (ca, cb) = (lab.progs.counters(a.ifindex), lab.progs.counters(b.ifindex));
    assert_eq!((ca.from_pod.packets, ca.from_pod.bytes), (2, bytes));
    assert_eq!((cb.to_pod.packets, cb.to_pod.bytes), (2, bytes));
    assert_eq!(ca.from_pod.errors + ca.from_pod.drops, 0);
}

/// Device to pod: a packet arriving on a node device for a local pod is redirected into
/// the pod with its MACs, one hop less, and counted on the pod.
#[test]
fn device_to_pod_is_redirected_into_the_pod() {
    let lab = lab();
    let a = &lab.a;
    for v4 in [true, false] {
        let frame = arriving(&lab, lab.up.remote(v4), a.addr(v4), L4::udp(5000, 53))
            .payload(8)
            .frame();
        let r = lab.from_dev(&frame);
        let f = family(v4);
        assert_eq!(r.verdict, Verdict::Redirect, "{f}");
        let got = parse(&r.frame);
        assert_eq!((got.src_mac, got.dst_mac), (a.host_mac, a.pod_mac), "{f}");
        assert_eq!(got.ttl, 63, "{f}");
        assert_eq!(got.l4, parse(&frame).l4, "{f}");
        checksums_ok(&r.frame, f);
    }
    assert_eq!(lab.progs.counters(a.ifindex).to_pod.packets, 2);
}

/// A destination the FIB resolves: forwarded by `bpf_redirect_neigh` (which fills in the
/// MACs after the program), one hop less, checksums valid.
#[test]
fn a_fib_hit_is_forwarded_by_redirect_neigh_with_one_hop_less() {
    let lab = lab();
    let a = &lab.a;
    for v4 in [true, false] {
        let frame = from(a, lab.up.remote(v4), L4::tcp(40_001, 443, TCP_SYN)).frame();
        let r = lab.from_pod(a, &frame);
        let f = family(v4);
        assert_eq!(r.verdict, Verdict::Redirect, "{f}");
        let (sent, got) = (parse(&frame), parse(&r.frame));
        assert_eq!(got.ttl, 63, "{f}");
        assert_eq!(
            (got.src, got.dst, &got.l4),
            (sent.src, sent.dst, &sent.l4),
            "{f}"
        );
        checksums_ok(&r.frame, f);
    }
    let c = lab.progs.counters(a.ifindex).from_pod;
    assert_eq!((c.packets, c.errors), (2, 0));
}

/// No route (or a node address, which the FIB does not forward to): the stack gets the
/// frame exactly as the pod sent it, and no error is counted (the lookup answered).
#[test]
fn a_fib_miss_goes_to_the_stack_unchanged() {
    let lab = lab();
    let a = &lab.a;
    for v4 in [true, false] {
        for dst in [lab.up.unrouted(v4), lab.up.addr(v4)] {
            let frame = from(a, dst, L4::udp(40_002, 9)).payload(4).frame();
            let r = lab.from_pod(a, &frame);
            assert_eq!(r.verdict, Verdict::Next, "to {dst}");
            assert_eq!(r.frame, frame, "to {dst}: the frame changed");
        }
    }
    let c = lab.progs.counters(a.ifindex).from_pod;
    assert_eq!((c.packets, c.errors, c.drops), (4, 0, 0));
}

/// A TTL / hop limit about to expire goes to the stack unchanged (which answers with ICMP
/// time exceeded), whether the destination is a pod or routed.
#[test]
fn an_expiring_ttl_goes_to_the_stack_unchanged() {
    let lab = lab();
    let a = &lab.a;
    for v4 in [true, false] {
        for dst in [lab.b.addr(v4), lab.up.remote(v4)] {
            let frame = from(a, dst, L4::udp(40_003, 33_434)).ttl(1).frame();
            let r = lab.from_pod(a, &frame);
            assert_eq!(r.verdict, Verdict::Next, "to {dst}");
            assert_eq!(r.frame, frame, "to {dst}");
        }
    }
}

/// The pod's ARP request for its gateway is answered in place: a reply with the host
/// veth's MAC, sent back out of the host veth (`bpf_redirect`). A request for another
/// address, or one claiming an address of another pod, goes to the stack unchanged.
#[test]
fn arp_for_the_gateway_is_answered_with_the_host_veths_mac() {
    let lab = lab();
    let (a, b) = (&lab.a, &lab.b);
    let gw = a.gateway4.octets();
    let req = Arp::request(a.pod_mac, a.v4.octets(), gw).frame([0xff; 6], a.pod_mac);
    let r = lab.from_pod(a, &req);
    assert_eq!(r.verdict, Verdict::Redirect);
    assert_eq!(
        Arp::parse(&r.frame),
        Arp {
            oper: ARP_REPLY,
            sha: a.host_mac,
            spa: gw,
            tha: a.pod_mac,
            tpa: a.v4.octets(),
        }
    );
    assert_eq!(&r.frame[..12], [a.pod_mac, a.host_mac].concat(), "MACs");

    let other = Arp::request(a.pod_mac, a.v4.octets(), b.v4.octets()).frame([0xff; 6], a.pod_mac);
    let r = lab.from_pod(a, &other);
    assert_eq!(
        (r.verdict, &r.frame),
        (Verdict::Next, &other),
        "ARP for a pod"
    );
    // Pod b asking on its own veth while claiming pod a's address.
    let claim = Arp::request(b.pod_mac, a.v4.octets(), gw).frame([0xff; 6], b.pod_mac);
    let r = lab.from_pod(b, &claim);
    assert_eq!(
        (r.verdict, &r.frame),
        (Verdict::Next, &claim),
        "claimed address"
    );
}

/// The floor of routing pod → pod (`ecni_floor_pod`, measured by the benchmark's pod-path
/// section, not loaded by the plugin) leaves a pod → pod frame byte for byte as
/// `ecni_from_pod` does and redirects it the same way, IPv4 and IPv6, while counting
/// nothing; anything not for a local pod goes on to the stack unchanged. So does its
/// netkit twin (`ecni_floor_nk`, the benchmark's netkit section), which redirects with
/// `bpf_redirect` where the TC floor uses `bpf_redirect_peer`.
#[test]
fn the_routing_floor_delivers_pod_to_pod_as_ecni_from_pod_does() {
    let mut lab = prototype_lab();
    let (a, b) = (lab.a.clone(), lab.b.clone());
    type Floor = fn(&mut Lab, &LabPod, &[u8]) -> ebpf_cni_tests::progtest::Run;
    let floors: [(&str, Floor); 2] = [
        ("ecni_floor_pod", |l, p, f| l.floor_pod(p, f)),
        ("ecni_floor_nk", |l, p, f| l.floor_nk(p, f)),
    ];
    for (name, floor_of) in floors {
        for v4 in [true, false] {
            let f = format!("{name}, {}", family(v4));
            let frame = from(&a, b.addr(v4), L4::tcp(40_000, 80, TCP_ACK))
                .payload(30)
                .frame();
            let floor = floor_of(&mut lab, &a, &frame);
            let full = lab.from_pod(&a, &frame);
            assert_eq!(floor.verdict, Verdict::Redirect, "{f}: redirected");
            assert_eq!(floor.verdict, full.verdict, "{f}: as ecni_from_pod");
            assert_eq!(
                floor.frame, full.frame,
                "{f}: the same frame as ecni_from_pod"
            );
            let got = parse(&floor.frame);
            assert_eq!((got.src_mac, got.dst_mac), (b.host_mac, b.pod_mac), "{f}");
            assert_eq!(got.ttl, 63, "{f}");
            checksums_ok(&floor.frame, family(v4));
        }
    }
    // Only ecni_from_pod's runs are counted.
    let (ca, cb) = (lab.progs.counters(a.ifindex), lab.progs.counters(b.ifindex));
    assert_eq!((ca.from_pod.packets, cb.to_pod.packets), (4, 4));
    // Not a local pod (a FIB destination), or not IP: to the stack, unchanged.
    for frame in [
        from(&a, lab.up.remote(true), L4::tcp(40_001, 80, TCP_SYN)).frame(),
        from(&a, lab.up.remote(false), L4::udp(40_002, 53)).frame(),
        Arp::request(a.pod_mac, a.v4.octets(), b.v4.octets()).frame([0xff; 6], a.pod_mac),
    ] {
        for (name, floor_of) in floors {
            let r = floor_of(&mut lab, &a, &frame);
            assert_eq!(r.verdict, Verdict::Next, "{name}: to the stack");
            assert_eq!(r.frame, frame, "{name}: unchanged");
        }
    }
}

/// What the node's stack sends into an unlimited pod passes untouched and is counted.
#[test]
fn what_the_stack_sends_into_a_pod_passes_and_is_counted() {
    let lab = lab();
    let a = &lab.a;
    let frame = Pkt::new(lab.up.remote(false), a.addr(false), L4::udp(1, 2))
        .macs(a.host_mac, a.pod_mac)
        .frame();
    let r = lab.to_pod(a, &frame);
    assert_eq!((r.verdict, &r.frame), (Verdict::Next, &frame));
    assert_eq!(r.ctx.tstamp, 0, "an unpaced pod's packets are not stamped");
    let c = lab.progs.counters(a.ifindex).to_pod;
    assert_eq!((c.packets, c.bytes), (1, frame.len() as u64));
}
