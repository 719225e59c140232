//! Host ports: the DNAT towards the pod and the reply's reverse translation, ICMP errors
//! and fragments of host-port flows, and the XDP prototype of the uplink's path.

use super::{
    arriving, checksums_ok, family, fragments, from, lab, map_port, port_unreachable, prototype_lab,
};
use ebpf_cni_maps::{NatKey, NatOrig, IPPROTO_TCP, IPPROTO_UDP};
use ebpf_cni_tests::packet::{parse, reassemble, Pkt, ETH_HLEN, L4, TCP_ACK, TCP_SYN};
use ebpf_cni_tests::progtest::{endpoint_key, Verdict};

fn ports_l4(proto: u8, sport: u16, dport: u16, flags: u8) -> L4 {
    if proto == IPPROTO_TCP {
        L4::tcp(sport, dport, flags)
    } else {
        L4::udp(sport, dport)
    }
}

/// Host ports: a packet to a node address and mapped port arriving on a device reaches the
/// pod with its destination rewritten (DNAT), the flow recorded and the mapping's hit
/// counted; the pod's reply leaves from the address and port the client dialled.
#[test]
fn host_port_dnat_reaches_the_pod_and_the_reply_comes_from_the_dialled_port() {
    let mut lab = lab();
    lab.host_ports();
    for (i, (v4, proto)) in [
        (true, IPPROTO_TCP),
        (false, IPPROTO_TCP),
        (true, IPPROTO_UDP),
        (false, IPPROTO_UDP),
    ]
    .into_iter()
    .enumerate()
    {
        let what = format!(
            "{} {}",
            family(v4),
            if proto == IPPROTO_TCP { "TCP" } else { "UDP" }
        );
        let host_port = 8080 + i as u16;
        let key = map_port(&mut lab, v4, proto, host_port, 80);
        let (a, node, client) = (lab.a.clone(), lab.up.addr(v4), lab.up.remote(v4));
        let frame = arriving(
            &lab,
            client,
            node,
            ports_l4(proto, 40_000, host_port, TCP_SYN),
        )
        .payload(10)
        .frame();
        let r = lab.from_dev(&frame);
        assert_eq!(r.verdict, Verdict::Redirect, "{what}: DNAT to the pod");
        let got = parse(&r.frame);
        assert_eq!((got.src, got.dst), (client, a.addr(v4)), "{what}");
        assert_eq!(got.ports(), (40_000, 80), "{what}");
        assert_eq!(
            (got.src_mac, got.dst_mac),
            (a.host_mac, a.pod_mac),
            "{what}"
        );
        checksums_ok(&r.frame, &what);
        let rev = NatKey {
            pod_addr: endpoint_key(a.addr(v4)).addr,
            peer_addr: endpoint_key(client).addr,
            pod_port: 80,
            peer_port: 40_000,
            proto,
            _pad: [0; 3],
        };
        assert_eq!(
            lab.progs.nat_rev(&rev),
            Some(NatOrig {
                addr: endpoint_key(node).addr,
                port: host_port,
                flags: 0,
                _pad: [0; 4],
            }),
            "{what}: the reverse entry"
        );
        let hits = lab.progs.port_hits(&key);
        assert_eq!(
            (hits.packets, hits.bytes),
            (1, frame.len() as u64),
            "{what}"
        );

        let reply = from(&a, client, ports_l4(proto, 80, 40_000, TCP_SYN | TCP_ACK))
            .payload(10)
            .frame();
        let r = lab.from_pod(&a, &reply);
        assert_eq!(r.verdict, Verdict::Redirect, "{what}: the reply is routed");
        let got = parse(&r.frame);
        assert_eq!((got.src, got.dst), (node, client), "{what}: reply");
        assert_eq!(got.ports(), (host_port, 40_000), "{what}: reply");
        checksums_ok(&r.frame, &format!("{what} reply"));
    }
}

/// A pod whose counters say no host port leads to it (`COUNTERS_NO_HOST_PORTS`, as ADD
/// writes them for a pod without mappings) skips the reverse translation's lookup: were a
/// mapping to lead to it after all, its replies would leave untranslated, which is why
/// CHECK refuses the flag on a pod with mappings. Without the flag (counters of a pod with
/// mappings, or an earlier release's) the reply comes from the dialled port.
#[test]
fn a_pod_without_host_ports_skips_the_reverse_translation() {
    let mut lab = lab();
    lab.host_ports();
    let key = map_port(&mut lab, true, IPPROTO_TCP, 8090, 80);
    let (a, node, client) = (lab.a.clone(), lab.up.addr(true), lab.up.remote(true));
    let syn = arriving(&lab, client, node, L4::tcp(40_000, 8090, TCP_SYN)).frame();
    assert_eq!(lab.from_dev(&syn).verdict, Verdict::Redirect, "DNAT");
    assert_eq!(lab.progs.port_hits(&key).packets, 1);
    let reply = from(&a, client, L4::tcp(80, 40_000, TCP_SYN | TCP_ACK)).frame();
    for (flags, src, sport, what) in [
        (0, node, 8090, "flag off: translated"),
        (
            ebpf_cni_maps::COUNTERS_NO_HOST_PORTS,
            a.addr(true),
            80,
            "flag on: not looked up",
        ),
    ] {
        lab.progs.watch_pod_flagged(a.ifindex, flags, 0);
        let r = lab.from_pod(&a, &reply);
        assert_eq!(r.verdict, Verdict::Redirect, "{what}");
        let got = parse(&r.frame);
        assert_eq!((got.src, got.ports().0), (src, sport), "{what}");
        assert_eq!(lab.progs.counters(a.ifindex).from_pod.packets, 1, "{what}");
    }
}

/// XDP's verdicts (linux/bpf.h).
const XDP_PASS: u32 = 2;
const XDP_REDIRECT: u32 = 4;

/// The XDP prototype of the uplink's host-port path (`ecni_xdp_dev`, measured by the
/// benchmark's `xdp` section, not loaded by the plugin) translates as `ecni_from_dev` does:
/// IPv4 TCP and UDP to a mapped host port are redirected to the pod with the destination
/// rewritten, one hop less, the pod's MACs, valid checksums (a zero UDP checksum stays
/// zero), the reverse entry recorded and the hit counted; the same frame through
/// `ecni_from_dev` leaves byte for byte the same. Anything else passes unchanged.
#[test]
fn the_xdp_prototype_does_the_host_port_dnat_of_the_tc_program() {
    let mut lab = prototype_lab();
    lab.host_ports();
    let (a, node, client) = (lab.a.clone(), lab.up.addr(true), lab.up.remote(true));
    for (i, proto) in [IPPROTO_TCP, IPPROTO_UDP].into_iter().enumerate() {
        let what = if proto == IPPROTO_TCP { "TCP" } else { "UDP" };
        let host_port = 9080 + i as u16;
        let key = map_port(&mut lab, true, proto, host_port, 80);
        let frame = arriving(
            &lab,
            client,
            node,
            ports_l4(proto, 41_000, host_port, TCP_SYN),
        )
        .payload(33)
        .frame();
        let (verdict, out) = lab.xdp_dev(&frame);
        assert_eq!(verdict, XDP_REDIRECT, "{what}: redirected to the pod");
        let got = parse(&out);
        assert_eq!((got.src, got.dst), (client, a.addr(true)), "{what}");
        assert_eq!(got.ports(), (41_000, 80), "{what}");
        assert_eq!(
            (got.src_mac, got.dst_mac),
            (a.host_mac, a.pod_mac),
            "{what}"
        );
        assert_eq!(got.ttl, 63, "{what}");
        checksums_ok(&out, what);
        let rev = NatKey {
            pod_addr: endpoint_key(a.addr(true)).addr,
            peer_addr: endpoint_key(client).addr,
            pod_port: 80,
            peer_port: 41_000,
            proto,
            _pad: [0; 3],
        };
        let orig = NatOrig {
            addr: endpoint_key(node).addr,
            port: host_port,
            flags: 0,
            _pad: [0; 4],
        };
        assert_eq!(lab.progs.nat_rev(&rev), Some(orig), "{what}: reverse entry");
        assert_eq!(lab.progs.port_hits(&key).packets, 1, "{what}: hit counted");
        let tc = lab.from_dev(&frame);
        assert_eq!(tc.verdict, Verdict::Redirect, "{what}: TC");
        assert_eq!(out, tc.frame, "{what}: XDP and TC leave the same frame");
    }
    // A UDP datagram without a checksum keeps none.
    let frame = arriving(&lab, client, node, L4::udp(41_001, 9081))
        .payload(5)
        .frame();
    let mut no_sum = frame.clone();
    let at = ETH_HLEN + 20 + 6;
    no_sum[at..at + 2].copy_from_slice(&[0, 0]);
    let (verdict, out) = lab.xdp_dev(&no_sum);
    assert_eq!(verdict, XDP_REDIRECT, "UDP without checksum");
    assert_eq!(&out[at..at + 2], &[0, 0], "a zero UDP checksum stays zero");
    // Not a host port, IPv6, not a node address: passed unchanged.
    for frame in [
        arriving(&lab, client, node, L4::tcp(41_002, 9999, TCP_SYN)).frame(),
        arriving(
            &lab,
            lab.up.remote(false),
            lab.up.addr(false),
            L4::tcp(41_003, 9080, TCP_SYN),
        )
        .frame(),
        arriving(&lab, client, a.addr(true), L4::tcp(41_004, 9080, TCP_SYN)).frame(),
    ] {
        let (verdict, out) = lab.xdp_dev(&frame);
        assert_eq!(verdict, XDP_PASS);
        assert_eq!(out, frame, "passed unchanged");
    }
}

/// ICMP errors about host-port flows, both ways and both families, every checksum valid:
/// the network's error about the pod's reply (it quotes the reply as it left, from the
/// node's address and host port) reaches the pod with the quote's source and port the
/// pod's; the pod's error about the client's packet leaves from the host port, quoting the
/// packet as the client sent it. An error about a flow the programs never translated (or
/// quoting a port no mapping has) goes to the stack unchanged.
#[test]
fn host_port_icmp_errors_are_translated_both_ways() {
    let mut lab = lab();
    lab.host_ports();
    for (i, v4) in [true, false].into_iter().enumerate() {
        let f = family(v4);
        let host_port = 8180 + i as u16;
        map_port(&mut lab, v4, IPPROTO_UDP, host_port, 80);
        let (a, node, client) = (lab.a.clone(), lab.up.addr(v4), lab.up.remote(v4));
        let r = lab.from_dev(&arriving(&lab, client, node, L4::udp(40_000, host_port)).frame());
        assert_eq!(r.verdict, Verdict::Redirect, "{f}: the client's datagram");

        let quote = Pkt::new(node, client, L4::udp(host_port, 40_000))
            .ttl(1)
            .ip();
        let frame = arriving(&lab, client, node, port_unreachable(v4, quote)).frame();
        let r = lab.from_dev(&frame);
        assert_eq!(
            r.verdict,
            Verdict::Redirect,
            "{f}: the error goes to the pod"
        );
        checksums_ok(&r.frame, f);
        let got = parse(&r.frame);
        assert_eq!((got.src, got.dst), (client, a.addr(v4)), "{f}: outer");
        let q = got.quote();
        assert_eq!((q.src, q.dst), (a.addr(v4), client), "{f}: quote");
        assert_eq!(q.ports(), (80, 40_000), "{f}: quoted ports");

        for (what, quote) in [
            ("another client port", L4::udp(host_port, 40_001)),
            ("a port no mapping has", L4::udp(host_port + 100, 40_000)),
        ] {
            let quote = Pkt::new(node, client, quote).ttl(1).ip();
            let frame = arriving(&lab, client, node, port_unreachable(v4, quote)).frame();
            let r = lab.from_dev(&frame);
            assert_eq!(
                (r.verdict, &r.frame),
                (Verdict::Next, &frame),
                "{f}: {what}"
            );
        }

        let quote = Pkt::new(client, a.addr(v4), L4::udp(40_000, 80)).ip();
        let frame = from(&a, client, port_unreachable(v4, quote)).frame();
        let r = lab.from_pod(&a, &frame);
        assert_eq!(
            r.verdict,
            Verdict::Redirect,
            "{f}: the pod's error is routed"
        );
        checksums_ok(&r.frame, f);
        let got = parse(&r.frame);
        assert_eq!(
            (got.src, got.dst),
            (node, client),
            "{f}: the pod's error, outer"
        );
        let q = got.quote();
        assert_eq!(
            (q.src, q.dst),
            (client, node),
            "{f}: the pod's error, quote"
        );
        assert_eq!(
            q.ports(),
            (40_000, host_port),
            "{f}: the pod's error, quoted ports"
        );
    }
}

/// A UDP datagram to a host port in fragments, and the pod's answer in fragments, IPv4 and
/// IPv6: the first fragment carries the ports and is translated as a whole datagram is; the
/// later ones carry none and are translated by the record the first left
/// (`ECNI_NAT_FRAG`). Put back together, each datagram has its checksum right over the
/// translated addresses and port. A later fragment whose first was never seen arriving goes
/// to the stack as it is.
#[test]
fn host_port_datagrams_in_fragments_are_translated_both_ways() {
    let mut lab = lab();
    lab.host_ports();
    for (i, v4) in [true, false].into_iter().enumerate() {
        let f = family(v4);
        let host_port = 8280 + i as u16;
        map_port(&mut lab, v4, IPPROTO_UDP, host_port, 53);
        let (a, node, client) = (lab.a.clone(), lab.up.addr(v4), lab.up.remote(v4));
        let ident = 0x6000 + i as u16;

        let whole = arriving(&lab, client, node, L4::udp(40_000, host_port)).payload(2500);
        let sent = parse(&whole.clone().frame());
        let frags = fragments(whole, ident);
        assert_eq!(frags.len(), 3, "{f}");
        let arrived: Vec<Vec<u8>> = frags
            .iter()
            .enumerate()
            .map(|(k, fr)| {
                let r = lab.from_dev(fr);
                assert_eq!(r.verdict, Verdict::Redirect, "{f}: fragment {k} arriving");
                let got = parse(&r.frame);
                assert_eq!((got.src, got.dst), (client, a.addr(v4)), "{f}: {k}");
                r.frame
            })
            .collect();
        let datagram = reassemble(&arrived);
        checksums_ok(&datagram, &format!("{f}, arriving, put back together"));
        let got = parse(&datagram);
        assert_eq!(got.ports(), (40_000, 53), "{f}: the pod's port");
        assert_eq!(
            got.l4[8..],
            sent.l4[8..],
            "{f}: the payload arrives as sent"
        );

        let answer = from(&a, client, L4::udp(53, 40_000)).payload(2500);
        let left: Vec<Vec<u8>> = fragments(answer, ident)
            .iter()
            .enumerate()
            .map(|(k, fr)| {
                let r = lab.from_pod(&a, fr);
                assert_eq!(r.verdict, Verdict::Redirect, "{f}: fragment {k} leaving");
                let got = parse(&r.frame);
                assert_eq!((got.src, got.dst), (node, client), "{f}: {k}");
                r.frame
            })
            .collect();
        let datagram = reassemble(&left);
        checksums_ok(&datagram, &format!("{f}, leaving, put back together"));
        assert_eq!(
            parse(&datagram).ports(),
            (host_port, 40_000),
            "{f}: the reply's ports"
        );

        let lone = fragments(
            arriving(&lab, client, node, L4::udp(40_001, host_port)).payload(2500),
            ident + 0x100,
        );
        let r = lab.from_dev(&lone[1]);
        assert_eq!(
            (r.verdict, &r.frame),
            (Verdict::Next, &lone[1]),
            "{f}: a later fragment alone, arriving"
        );
    }
}
