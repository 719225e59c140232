//! Masquerade: TCP, UDP and ICMP echo both ways, first packets and established flows,
//! fragments, ICMP errors both ways, a datagram the node would fragment, and the choice
//! of a new flow's port.

use std::net::IpAddr;

use super::{arriving, checksums_ok, family, fragments, from, lab, port_unreachable, udp_flow};
use ebpf_cni_maps::{MasqKey, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP};
use ebpf_cni_tests::packet::{parse, reassemble, Pkt, IP_DF, L4, TCP_ACK, TCP_SYN};
use ebpf_cni_tests::progtest::{endpoint_key, Lab, LabPod, Verdict};

/// One masqueraded flow both ways: `out` leaves pod a for the remote end translated to
/// the uplink's address and a port (echo identifier) of the range, with both flow entries
/// recorded; `back(port)` arriving for that port reaches the pod translated back.
fn masquerade_round_trip(lab: &Lab, v4: bool, proto: u8, out: L4, back: impl Fn(u16) -> L4) {
    let what = format!("{} protocol {proto}", family(v4));
    let (a, node, remote) = (&lab.a, lab.up.addr(v4), lab.up.remote(v4));
    let before = lab.progs.masq_stats();
    let frame = from(a, remote, out).payload(16).frame();
    let sent = parse(&frame);
    let r = lab.from_pod(a, &frame);
    assert_eq!(r.verdict, Verdict::Redirect, "{what}: leaving");
    let got = parse(&r.frame);
    checksums_ok(&r.frame, &what);
    assert_eq!((got.src, got.dst, got.ttl), (node, remote, 63), "{what}");
    let echo = proto == IPPROTO_ICMP || proto == IPPROTO_ICMPV6;
    let (pod_port, remote_port, node_port) = if echo {
        (sent.echo_id(), 0, got.echo_id())
    } else {
        assert_eq!(got.ports().1, sent.ports().1, "{what}: remote port");
        (sent.ports().0, sent.ports().1, got.ports().0)
    };
    assert!(
        (61_000..=61_009).contains(&node_port),
        "{what}: port {node_port} is outside the range"
    );
    let key = |local: IpAddr, local_port| MasqKey {
        local: endpoint_key(local).addr,
        remote: endpoint_key(remote).addr,
        local_port,
        remote_port,
        proto,
        _pad: [0; 3],
    };
    let fwd = lab.progs.masq_fwd(&key(a.addr(v4), pod_port));
    let rev = lab.progs.masq_rev(&key(node, node_port));
    assert_eq!(
        fwd.map(|f| (f.addr, f.port)),
        Some((endpoint_key(node).addr, node_port)),
        "{what}: the pod's view of the flow"
    );
    assert_eq!(
        rev.map(|f| (f.addr, f.port)),
        Some((endpoint_key(a.addr(v4)).addr, pod_port)),
        "{what}: the node's view of the flow"
    );

    let reply = arriving(lab, remote, node, back(node_port))
        .payload(16)
        .frame();
    let r = lab.from_dev(&reply);
    assert_eq!(r.verdict, Verdict::Redirect, "{what}: the reply");
    let got = parse(&r.frame);
    checksums_ok(&r.frame, &format!("{what} reply"));
    assert_eq!((got.src, got.dst), (remote, a.addr(v4)), "{what}: reply");
    assert_eq!(
        (got.src_mac, got.dst_mac),
        (a.host_mac, a.pod_mac),
        "{what}"
    );
    if echo {
        assert_eq!(got.echo_id(), pod_port, "{what}: reply identifier");
    } else {
        assert_eq!(got.ports(), (remote_port, pod_port), "{what}: reply ports");
    }
    let after = lab.progs.masq_stats();
    assert_eq!(
        (
            after.flows - before.flows,
            after.out_packets - before.out_packets,
            after.in_packets - before.in_packets
        ),
        (1, 1, 1),
        "{what}: masquerade's counts"
    );
}

fn masquerading_lab() -> Lab {
    let mut lab = lab();
    let a = lab.a.clone();
    lab.masquerade(&a);
    lab
}

/// Masquerade of TCP: the SYN leaves from the node's address and a port of the range, the
/// SYN-ACK comes back to the pod's address and port.
#[test]
fn masquerade_translates_tcp_out_and_back() {
    let lab = masquerading_lab();
    for v4 in [true, false] {
        masquerade_round_trip(&lab, v4, IPPROTO_TCP, L4::tcp(40_010, 80, TCP_SYN), |p| {
            L4::tcp(80, p, TCP_SYN | TCP_ACK)
        });
    }
}

#[test]
fn masquerade_translates_udp_out_and_back() {
    let lab = masquerading_lab();
    for v4 in [true, false] {
        masquerade_round_trip(&lab, v4, IPPROTO_UDP, L4::udp(40_011, 53), |p| {
            L4::udp(53, p)
        });
    }
}

/// ICMP and ICMPv6 echo: the identifier is the flow's port.
#[test]
fn masquerade_translates_icmp_echo_out_and_back() {
    let lab = masquerading_lab();
    for v4 in [true, false] {
        let proto = if v4 { IPPROTO_ICMP } else { IPPROTO_ICMPV6 };
        masquerade_round_trip(&lab, v4, proto, L4::echo_request(0x4242), L4::echo_reply);
    }
}

/// A masqueraded datagram in fragments, both ways (UDP, and an ICMP echo), IPv4 and IPv6:
/// the first fragment carries the transport header and is translated with its flow; the
/// later ones carry none and are translated by the record the first left
/// (`ECNI_MASQ_FRAG`, `ECNI_MASQ_FRAG6`). Put back together, each datagram has its
/// transport checksum right over the translated addresses and port, so the first
/// fragment's incremental patch held for the whole datagram. A later fragment whose first
/// was never seen has nothing to be translated by: leaving, it is dropped and counted (it
/// would leave with the pod's address); arriving, it goes to the stack as it is. The pod's
/// answers in a flow the remote end opened to its address (a datagram, a large ping) keep
/// that address in every fragment.
#[test]
fn masquerade_translates_fragments_both_ways() {
    let lab = masquerading_lab();
    let a = &lab.a;
    for v4 in [true, false] {
        let fam = if v4 { "IPv4" } else { "IPv6" };
        let (node, remote) = (lab.up.addr(v4), lab.up.remote(v4));
        // What leaves the pod, and the answer to the node's port (echo identifier).
        type Answer = fn(u16) -> L4;
        let cases: [(&str, L4, Answer); 2] = [
            ("UDP", L4::udp(40_070, 5300), |p| L4::udp(5300, p)),
            ("ICMP echo", L4::echo_request(0x4343), L4::echo_reply),
        ];
        for (i, (what, out, back)) in cases.into_iter().enumerate() {
            let what = format!("{fam} {what}");
            let echo = matches!(out, L4::Echo { .. });
            let ident = 0x4000 + i as u16;
            let whole = from(a, remote, out).payload(2500);
            let sent = parse(&whole.clone().frame());
            let frags = fragments(whole, ident);
            assert_eq!(frags.len(), 3, "{what}");
            let left: Vec<Vec<u8>> = frags
                .iter()
                .enumerate()
                .map(|(k, f)| {
                    let r = lab.from_pod(a, f);
                    assert_eq!(r.verdict, Verdict::Redirect, "{what}: fragment {k} leaving");
                    let got = parse(&r.frame);
                    assert_eq!(
                        (got.src, got.dst, got.ttl),
                        (node, remote, 63),
                        "{what}: {k}"
                    );
                    r.frame
                })
                .collect();
            let datagram = reassemble(&left);
            checksums_ok(&datagram, &format!("{what}, leaving, put back together"));
            let got = parse(&datagram);
            let (pod_port, node_port) = if echo {
                (sent.echo_id(), got.echo_id())
            } else {
                assert_eq!(got.ports().1, 5300, "{what}: remote port");
                (sent.ports().0, got.ports().0)
            };
            assert!(
                (61_000..=61_009).contains(&node_port),
                "{what}: port {node_port} is outside the range"
            );
            assert_eq!(
                got.l4[8..],
                sent.l4[8..],
                "{what}: the payload arrives as sent"
            );

            let reply = arriving(&lab, remote, node, back(node_port)).payload(2500);
            let arrived: Vec<Vec<u8>> = fragments(reply, ident)
                .iter()
                .enumerate()
                .map(|(k, f)| {
                    let r = lab.from_dev(f);
                    assert_eq!(
                        r.verdict,
                        Verdict::Redirect,
                        "{what}: fragment {k} arriving"
                    );
                    let got = parse(&r.frame);
                    assert_eq!((got.src, got.dst), (remote, a.addr(v4)), "{what}: {k}");
                    assert_eq!(
                        (got.src_mac, got.dst_mac),
                        (a.host_mac, a.pod_mac),
                        "{what}: {k}"
                    );
                    r.frame
                })
                .collect();
            let datagram = reassemble(&arrived);
            checksums_ok(&datagram, &format!("{what}, arriving, put back together"));
            let got = parse(&datagram);
            if echo {
                assert_eq!(got.echo_id(), pod_port, "{what}: reply identifier");
            } else {
                assert_eq!(got.ports(), (5300, pod_port), "{what}: reply ports");
            }
        }

        // Flows the remote end opened to the pod's own address (its first datagram
        // recorded it; a ping needs no record): the pod's answers keep the pod's address
        // in every fragment, as whole packets of the flow do, and none of them counts as
        // translated.
        let opened = arriving(&lab, remote, a.addr(v4), L4::udp(5400, 7000)).frame();
        assert_eq!(
            lab.from_dev(&opened).verdict,
            Verdict::Redirect,
            "{fam}: the remote end's datagram to the pod"
        );
        let before = lab.progs.masq_stats();
        let answers = [
            ("datagram", L4::udp(7000, 5400), 0x5002),
            ("echo reply", L4::echo_reply(0x5151), 0x5003),
        ];
        for (what, l4, id) in answers {
            let answer = from(a, remote, l4).payload(2500);
            for (k, f) in fragments(answer, id).iter().enumerate() {
                let r = lab.from_pod(a, f);
                assert_eq!(
                    r.verdict,
                    Verdict::Redirect,
                    "{fam}: the {what}'s fragment {k}"
                );
                assert_eq!(
                    parse(&r.frame).src,
                    a.addr(v4),
                    "{fam}: the {what}'s fragment {k}"
                );
            }
        }
        let after = lab.progs.masq_stats();
        assert_eq!(
            (after.out_packets, after.untranslatable),
            (before.out_packets, before.untranslatable),
            "{fam}: the answers' fragments counted as translated or untranslatable"
        );

        // Later fragments of datagrams whose first fragment never came this way.
        let lone = fragments(from(a, remote, L4::udp(40_071, 5300)).payload(2500), 0x5000);
        let before = lab.progs.masq_stats();
        let r = lab.from_pod(a, &lone[1]);
        assert_eq!(
            r.verdict,
            Verdict::Shot,
            "{fam}: a later fragment alone, leaving"
        );
        assert_eq!(
            lab.progs.masq_stats().untranslatable - before.untranslatable,
            1,
            "{fam}: counted"
        );
        let lone_in = fragments(
            arriving(&lab, remote, node, L4::udp(5300, 61_005)).payload(2500),
            0x5001,
        );
        let r = lab.from_dev(&lone_in[1]);
        assert_eq!(
            (r.verdict, &r.frame),
            (Verdict::Next, &lone_in[1]),
            "{fam}: a later fragment alone, arriving"
        );
    }
}

/// The source entry of a pod's own address can say that the pod masquerades
/// (`SOURCE_PASS_MASQ`, as ADD writes it for an `ipMasq` pod): the pod program then
/// masquerades on the word of the entry its check found, without the endpoint's flag.
/// With `SOURCE_PASS` (an extra prefix, an entry of an earlier release) the endpoint
/// decides, as it does for a pod without a source check.
#[test]
fn masquerade_takes_the_pods_word_from_its_source_entry() {
    use ebpf_cni_maps::{SOURCE_PASS, SOURCE_PASS_MASQ};
    let mut lab = masquerading_lab();
    let (a, b) = (lab.a.clone(), lab.b.clone());
    let mut port = 40_100;
    for v4 in [true, false] {
        let (node, remote) = (lab.up.addr(v4), lab.up.remote(v4));
        let mut leaves_from = |lab: &Lab, p: &LabPod| {
            port += 1;
            let frame = from(p, remote, L4::udp(port, 53)).payload(16).frame();
            let r = lab.from_pod(p, &frame);
            assert_eq!(
                r.verdict,
                Verdict::Redirect,
                "{} from {:?}",
                family(v4),
                p.v4
            );
            checksums_ok(&r.frame, family(v4));
            parse(&r.frame).src
        };
        lab.source_check_as(&a, SOURCE_PASS);
        lab.source_check_as(&b, SOURCE_PASS);
        assert_eq!(
            leaves_from(&lab, &a),
            node,
            "{}: a's endpoint masquerades",
            family(v4)
        );
        assert_eq!(
            leaves_from(&lab, &b),
            b.addr(v4),
            "{}: b's does not",
            family(v4)
        );
        lab.source_check_as(&a, SOURCE_PASS_MASQ);
        lab.source_check_as(&b, SOURCE_PASS_MASQ);
        assert_eq!(leaves_from(&lab, &a), node, "{}: a's entry", family(v4));
        assert_eq!(
            leaves_from(&lab, &b),
            node,
            "{}: b's entry says it masquerades, its endpoint does not",
            family(v4)
        );
    }
}

/// Packets of an established flow (after its first, which allocated the port): each
/// leaves from the node's address and port, and each answer comes back to the pod's,
/// with every checksum valid and the payload untouched, in both families, for TCP
/// (segments with payload and timestamps, a FIN), UDP and ICMP echo; no new flow. Both
/// pods masquerade: the checksum patch for an IPv6 address depends on the byte order its
/// words are summed in only where the sum is not a byte palindrome (pod a's, fd00:88::2
/// to the node's 2001:db8:1::1, is one; pod b's is not).
#[test]
fn masquerade_translates_established_flows_both_ways() {
    let mut lab = masquerading_lab();
    let b = lab.b.clone();
    lab.masquerade(&b);
    for a in [&lab.a, &lab.b] {
        established_flows_both_ways(&lab, a);
    }
}

fn established_flows_both_ways(lab: &Lab, a: &LabPod) {
    // NOP, NOP, timestamp: what Linux puts on every segment but the SYN.
    let ts = |val: u32, ecr: u32| {
        let mut o = vec![1, 1, 8, 10];
        o.extend(val.to_be_bytes());
        o.extend(ecr.to_be_bytes());
        o
    };
    let tcp = |sport, dport, flags, o: Vec<u8>| L4::Tcp {
        sport,
        dport,
        flags,
        options: o,
    };
    for v4 in [true, false] {
        let (node, remote) = (lab.up.addr(v4), lab.up.remote(v4));
        let echo_proto = if v4 { IPPROTO_ICMP } else { IPPROTO_ICMPV6 };
        type Out = Box<dyn Fn(u32) -> L4>;
        type Back = Box<dyn Fn(u16, u32) -> L4>;
        let flows: [(u8, L4, Out, Back); 3] = [
            (
                IPPROTO_TCP,
                L4::tcp(40_100, 443, TCP_SYN),
                Box::new(move |i| {
                    tcp(
                        40_100,
                        443,
                        TCP_ACK | if i == 3 { 1 } else { 0 },
                        ts(1000 + i, 77),
                    )
                }),
                Box::new(move |p, i| tcp(443, p, TCP_ACK, ts(77 + i, 1000 + i))),
            ),
            (
                IPPROTO_UDP,
                L4::udp(40_101, 443),
                Box::new(|_| L4::udp(40_101, 443)),
                Box::new(|p, _| L4::udp(443, p)),
            ),
            (
                echo_proto,
                L4::echo_request(0x4343),
                Box::new(|_| L4::echo_request(0x4343)),
                Box::new(|p, _| L4::echo_reply(p)),
            ),
        ];
        for (proto, first, out, back) in flows {
            let what = format!("{} protocol {proto} from {}", family(v4), a.addr(v4));
            let r = lab.from_pod(a, &from(a, remote, first).frame());
            assert_eq!(
                r.verdict,
                Verdict::Redirect,
                "{what}: the flow's first packet"
            );
            let got = parse(&r.frame);
            let echo = proto == echo_proto;
            let node_port = if echo { got.echo_id() } else { got.ports().0 };
            let pod_port = if echo {
                0x4343
            } else {
                parse(&from(a, remote, out(0)).frame()).ports().0
            };
            let before = lab.progs.masq_stats();
            for i in 0..4u32 {
                let frame = from(a, remote, out(i)).payload(100 + i as usize).frame();
                let sent = parse(&frame);
                let r = lab.from_pod(a, &frame);
                assert_eq!(r.verdict, Verdict::Redirect, "{what} #{i}: leaving");
                checksums_ok(&r.frame, &format!("{what} #{i} leaving"));
                let got = parse(&r.frame);
                assert_eq!((got.src, got.dst), (node, remote), "{what} #{i}");
                if echo {
                    assert_eq!(got.echo_id(), node_port, "{what} #{i}: identifier");
                } else {
                    assert_eq!(got.ports(), (node_port, 443), "{what} #{i}: ports");
                }
                assert_eq!(got.l4.len(), sent.l4.len(), "{what} #{i}: length");
                let hdr = if proto == IPPROTO_TCP { 32 } else { 8 };
                assert_eq!(got.l4[hdr..], sent.l4[hdr..], "{what} #{i}: payload");

                let frame = arriving(lab, remote, node, back(node_port, i))
                    .payload(60 + i as usize)
                    .frame();
                let sent = parse(&frame);
                let r = lab.from_dev(&frame);
                assert_eq!(r.verdict, Verdict::Redirect, "{what} #{i}: the answer");
                checksums_ok(&r.frame, &format!("{what} #{i} answer"));
                let got = parse(&r.frame);
                assert_eq!(
                    (got.src, got.dst),
                    (remote, a.addr(v4)),
                    "{what} #{i}: answer"
                );
                if echo {
                    assert_eq!(got.echo_id(), pod_port, "{what} #{i}: answer identifier");
                } else {
                    assert_eq!(got.ports(), (443, pod_port), "{what} #{i}: answer ports");
                }
                assert_eq!(got.l4[hdr..], sent.l4[hdr..], "{what} #{i}: answer payload");
            }
            let after = lab.progs.masq_stats();
            assert_eq!(
                (
                    after.flows - before.flows,
                    after.out_packets - before.out_packets,
                    after.in_packets - before.in_packets
                ),
                (0, 4, 4),
                "{what}: masquerade's counts"
            );
        }
    }
}

/// An ICMP error arriving for a masqueraded flow (it quotes the packet as it left, from
/// the node's address and port) reaches the pod with its destination, the quote's source
/// and the quote's port translated back, every checksum (ICMP, the quoted IPv4 header)
/// valid.
#[test]
fn masquerade_translates_icmp_errors_about_a_flow_back_to_the_pod() {
    let lab = masquerading_lab();
    let a = &lab.a;
    for v4 in [true, false] {
        let f = family(v4);
        let (node, remote) = (lab.up.addr(v4), lab.up.remote(v4));
        let port = udp_flow(&lab, v4);
        let quote = Pkt::new(node, remote, L4::udp(port, 53)).ttl(1).ip();
        let frame = arriving(&lab, remote, node, port_unreachable(v4, quote)).frame();
        let r = lab.from_dev(&frame);
        assert_eq!(r.verdict, Verdict::Redirect, "{f}");
        checksums_ok(&r.frame, f);
        let got = parse(&r.frame);
        assert_eq!((got.src, got.dst), (remote, a.addr(v4)), "{f}: outer");
        let q = got.quote();
        assert_eq!((q.src, q.dst), (a.addr(v4), remote), "{f}: quote");
        assert_eq!(q.ports(), (5353, 53), "{f}: quoted ports");
    }
}

/// An ICMP error the pod sends about a packet of a masqueraded flow leaves from the node's
/// address, quoting the packet as it arrived at the node (to the node's address and port).
#[test]
fn masquerade_translates_the_pods_icmp_errors_about_a_flow() {
    let lab = masquerading_lab();
    let a = &lab.a;
    for v4 in [true, false] {
        let f = family(v4);
        let (node, remote) = (lab.up.addr(v4), lab.up.remote(v4));
        let port = udp_flow(&lab, v4);
        let quote = Pkt::new(remote, a.addr(v4), L4::udp(53, 5353)).ip();
        let frame = from(a, remote, port_unreachable(v4, quote)).frame();
        let r = lab.from_pod(a, &frame);
        assert_eq!(r.verdict, Verdict::Redirect, "{f}");
        checksums_ok(&r.frame, f);
        let got = parse(&r.frame);
        assert_eq!((got.src, got.dst), (node, remote), "{f}: outer");
        let q = got.quote();
        assert_eq!((q.src, q.dst), (remote, node), "{f}: quote");
        assert_eq!(q.ports(), (53, port), "{f}: quoted ports");
    }
}

/// A masqueraded IPv4 datagram without DF that the uplink's MTU would have the stack
/// fragment is dropped and counted (the stack's fragments never pass the programs: they
/// would leave with the pod's address); with DF it goes to the stack, which answers
/// "fragmentation needed".
#[test]
fn a_datagram_the_node_would_fragment_never_leaves_with_the_pods_address() {
    let lab = masquerading_lab();
    lab.ns
        .ip_ok(&["link", "set", "up0", "mtu", "1280"])
        .unwrap();
    let a = &lab.a;
    let pkt = from(a, lab.up.remote(true), L4::udp(40_060, 9)).payload(1300);
    let r = lab.from_pod(a, &pkt.clone().frag(0).frame());
    assert_eq!(r.verdict, Verdict::Shot, "without DF");
    let c = lab.progs.counters(a.ifindex).from_pod;
    assert_eq!(c.drops, 1);
    assert_eq!(lab.progs.masq_stats().untranslatable, 1);
    let frame = pkt.frag(IP_DF).frame();
    let r = lab.from_pod(a, &frame);
    assert_eq!((r.verdict, &r.frame), (Verdict::Next, &frame), "with DF");
    assert_eq!(lab.progs.masq_stats().flows, 0);
}

/// A new TCP flow towards a server prefers a port it can reclaim without a timestamp shift:
/// of two idle ports whose old flows towards that server closed, the one whose last
/// timestamp lies behind the new SYN's, though the other comes first in turn; and with
/// none such, it takes a shifted one (the SYN's timestamp moved past the old flow's last).
/// A shifted flow pays an option scan and a checksum patch on each segment both ways.
#[test]
fn a_new_flow_prefers_a_port_that_needs_no_timestamp_shift() {
    let mut lab = masquerading_lab();
    lab.progs.set_config(ebpf_cni_maps::NodeConfig {
        flags: ebpf_cni_maps::NODE_FLAG_MASQ,
        masq_port_min: 61_000,
        masq_port_max: 61_001,
        ..Default::default()
    });
    let a = lab.a.clone();
    let remote = lab.up.remote(true);
    // NOP, NOP, timestamp value, no echo.
    let seg = |sport, flags, ts: u32| {
        let mut options = vec![1, 1, 8, 10];
        options.extend(ts.to_be_bytes());
        options.extend(0u32.to_be_bytes());
        from(
            &a,
            remote,
            L4::Tcp {
                sport,
                dport: 80,
                flags,
                options,
            },
        )
        .frame()
    };
    // The port a segment left from and its timestamp value.
    let sent = |lab: &Lab, frame: Vec<u8>| {
        let r = lab.from_pod(&a, &frame);
        assert_eq!(r.verdict, Verdict::Redirect);
        checksums_ok(&r.frame, "leaving");
        let got = parse(&r.frame);
        let ts = u32::from_be_bytes(got.l4[24..28].try_into().unwrap());
        (got.ports().0, ts)
    };
    // Two flows, each closed by the pod (FIN, then a reset): their last timestamps 5,001
    // on the range's first port, 101 on its second.
    for (sport, ts, port) in [(30_001, 5_000, 61_000), (30_002, 100, 61_001)] {
        assert_eq!(sent(&lab, seg(sport, TCP_SYN, ts)), (port, ts));
        sent(&lab, seg(sport, TCP_ACK | 0x01, ts + 1));
        sent(&lab, seg(sport, TCP_ACK | 0x04, ts + 1));
    }
    std::thread::sleep(std::time::Duration::from_millis(150));
    // In turn the first port comes next, but its old flow's last timestamp (5,001) is
    // ahead of the SYN's: the second port, no shift.
    assert_eq!(
        sent(&lab, seg(30_003, TCP_SYN, 1_000)),
        (61_001, 1_000),
        "the port that needs no shift"
    );
    // Only the first port is left: taken, the SYN's timestamp moved past 5,001.
    assert_eq!(
        sent(&lab, seg(30_004, TCP_SYN, 1_000)),
        (61_000, 5_002),
        "the shifted port, when no other is free"
    );
    let stats = lab.progs.masq_stats();
    assert_eq!((stats.flows, stats.reclaimed, stats.exhausted), (4, 2, 0));
}
