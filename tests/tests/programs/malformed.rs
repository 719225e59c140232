//! Frames no program may misread: cut short at every length (at a pod and at a device),
//! IPv6 extension headers and fragments.

use super::{arriving, checksums_ok, family, from, lab, map_port, port_unreachable, udp_flow};
use ebpf_cni_maps::{IPPROTO_TCP, IPPROTO_UDP, PROG_FROM_DEV, PROG_FROM_POD};
use ebpf_cni_tests::packet::{
    self, Arp, Pkt, ETH_HLEN, IPPROTO_DSTOPTS, IPPROTO_FRAGMENT, IPPROTO_HOPOPTS, IP_MF, L4,
    TCP_ACK, TCP_SYN,
};
use ebpf_cni_tests::progtest::{Lab, SkBuff, Verdict, GATEWAY_MAC};

/// The IP header's end in a frame (`ETH_HLEN` + 20 or 40).
fn l3_end(frame: &[u8]) -> usize {
    ETH_HLEN
        + match packet::be16(frame, 12) {
            packet::ETH_P_IP => 20,
            packet::ETH_P_IPV6 => 40,
            _ => 28, // ARP
        }
}

/// `pkt` as the first fragment of a datagram that is no longer (MF set, offset 0; IPv6: in
/// a fragment header).
fn first_fragment(pkt: Pkt) -> Pkt {
    if pkt.src.is_ipv4() {
        pkt.frag(IP_MF).ident(0x6000)
    } else {
        pkt.ext(IPPROTO_FRAGMENT)
    }
}

/// Program `prog` on device `ifindex` run on `frame` cut to `cut` bytes. `None` when the
/// kernel refused the run: only allowed for a cut inside the IP header (the
/// `BPF_PROG_TEST_RUN` of 6.1 and later checks it before running the program; 5.10 runs
/// it), which is recorded in `refused`; any other refusal fails the test.
fn run_cut(
    lab: &Lab,
    prog: &str,
    ifindex: u32,
    frame: &[u8],
    cut: usize,
    refused: &mut Vec<usize>,
) -> Option<ebpf_cni_tests::progtest::Run> {
    let ip = matches!(
        packet::be16(frame, 12),
        packet::ETH_P_IP | packet::ETH_P_IPV6
    );
    match lab.try_run(prog, &SkBuff::on(ifindex), &frame[..cut]) {
        Ok(r) => Some(r),
        Err(e) if ip && cut < l3_end(frame) && e.errno == Some(libc::EINVAL) => {
            refused.push(cut);
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// Says which cuts this kernel refused to run (and so were not checked here).
fn report_refused(refused: &[usize]) {
    if !refused.is_empty() {
        eprintln!(
            "this kernel's BPF_PROG_TEST_RUN refused {} frames cut inside their IP header \
             (EINVAL before the program runs); 5.10, which runs them, checks those cuts",
            refused.len()
        );
    }
}

/// Frames of a source-checked, masquerading pod cut short at every length from the
/// Ethernet header on: none crashes or reads out of bounds (the verifier's promise, and
/// the run returns), and each gets the verdict its cut deserves: a cut into the IP or ARP
/// header is a counted source-check drop (the source cannot be read); a cut into the
/// transport header of a packet to be masqueraded is a counted masquerade drop, with no
/// flow allocated for it; a cut into the transport of a packet to a pod is still
/// delivered (only the IP header decides). The whole frames then pass.
#[test]
fn frames_cut_short_anywhere_are_dropped_counted_or_passed_never_misread() {
    let mut lab = lab();
    let (a, b) = (lab.a.clone(), lab.b.clone());
    lab.source_check(&a);
    lab.masquerade(&a);
    let remote = |v4| lab.up.remote(v4);
    let mut frames: Vec<(String, Vec<u8>, bool)> = Vec::new();
    for v4 in [true, false] {
        let f = family(v4);
        let echo = L4::echo_request(7);
        for (what, l4) in [
            ("TCP SYN", L4::tcp(40_030, 80, TCP_SYN)),
            ("UDP", L4::udp(40_031, 53)),
            ("echo request", echo),
        ] {
            frames.push((
                format!("{f} {what} out"),
                from(&a, remote(v4), l4.clone()).frame(),
                true,
            ));
            frames.push((
                format!("{f} {what} to a pod"),
                from(&a, b.addr(v4), l4).frame(),
                false,
            ));
        }
        // A datagram's first fragment (IPv6: its fragment header cut too).
        frames.push((
            format!("{f} UDP first fragment out"),
            first_fragment(from(&a, remote(v4), L4::udp(40_032, 53))).frame(),
            true,
        ));
        frames.push((
            format!("{f} UDP first fragment to a pod"),
            first_fragment(from(&a, b.addr(v4), L4::udp(40_032, 53))).frame(),
            false,
        ));
    }
    frames.push((
        "ARP for the gateway".into(),
        Arp::request(a.pod_mac, a.v4.octets(), a.gateway4.octets()).frame([0xff; 6], a.pod_mac),
        false,
    ));
    let mut refused = Vec::new();
    for (what, frame, masqueraded) in &frames {
        let l3 = l3_end(frame);
        let flows = lab.progs.masq_stats().flows;
        for cut in ETH_HLEN..frame.len() {
            let before = (
                lab.progs.counters(a.ifindex).from_pod,
                lab.progs.masq_stats(),
            );
            let Some(r) = run_cut(&lab, PROG_FROM_POD, a.ifindex, frame, cut, &mut refused) else {
                continue;
            };
            let after = (
                lab.progs.counters(a.ifindex).from_pod,
                lab.progs.masq_stats(),
            );
            let delta = |f: fn(&ebpf_cni_maps::DirCounters) -> u64| f(&after.0) - f(&before.0);
            let at = format!("{what} cut to {cut} bytes");
            assert_eq!(delta(|c| c.packets), 1, "{at}: counted as a packet");
            if cut < l3 {
                assert_eq!(r.verdict, Verdict::Shot, "{at}");
                assert_eq!(delta(|c| c.source_drops), 1, "{at}: a source-check drop");
            } else if *masqueraded {
                assert_eq!(r.verdict, Verdict::Shot, "{at}");
                assert_eq!(delta(|c| c.drops), 1, "{at}: a counted drop");
                assert_eq!(
                    after.1.untranslatable - before.1.untranslatable,
                    1,
                    "{at}: untranslatable"
                );
            } else {
                assert_eq!(r.verdict, Verdict::Redirect, "{at}: delivered to the pod");
            }
            assert_eq!(
                after.1.flows, flows,
                "{at}: a masquerade flow was allocated"
            );
        }
        let r = lab.from_pod(&a, frame);
        assert_eq!(r.verdict, Verdict::Redirect, "{what}, whole");
    }
    report_refused(&refused);
}

/// Frames arriving at a node device cut short at every length: host-port and masquerade
/// traffic, and ICMP errors about a masqueraded and a host-port flow. A cut into the IP
/// header goes to the stack unchanged; so does every cut of the masquerade's ICMP error
/// (its quote's first 8 transport bytes cannot be read, so it is not translated); a cut
/// host-port packet or error is dropped or delivered, never passed half-translated. Whole,
/// they are translated and delivered.
#[test]
fn frames_cut_short_at_a_device_are_never_half_translated() {
    let mut lab = lab();
    let a = lab.a.clone();
    lab.host_ports();
    lab.masquerade(&a);
    let mut frames: Vec<(String, Vec<u8>, bool)> = Vec::new();
    for v4 in [true, false] {
        let f = family(v4);
        let (node, remote) = (lab.up.addr(v4), lab.up.remote(v4));
        map_port(&mut lab, v4, IPPROTO_TCP, 8080, 80);
        let port = udp_flow(&lab, v4);
        frames.push((
            format!("{f} TCP to a host port"),
            arriving(&lab, remote, node, L4::tcp(40_040, 8080, TCP_SYN)).frame(),
            false,
        ));
        frames.push((
            format!("{f} UDP reply to a masqueraded flow"),
            arriving(&lab, remote, node, L4::udp(53, port)).frame(),
            false,
        ));
        frames.push((
            format!("{f} UDP reply to a masqueraded flow, first fragment"),
            first_fragment(arriving(&lab, remote, node, L4::udp(53, port))).frame(),
            false,
        ));
        let quote = Pkt::new(node, remote, L4::udp(port, 53)).ip();
        frames.push((
            format!("{f} ICMP error about a masqueraded flow"),
            arriving(&lab, remote, node, port_unreachable(v4, quote)).frame(),
            true,
        ));
        // About the host-port flow above (its reply, from the host port): cut anywhere past
        // the quoted ports it is still translated whole.
        let quote = Pkt::new(node, remote, L4::tcp(8080, 40_040, TCP_SYN | TCP_ACK)).ip();
        frames.push((
            format!("{f} ICMP error about a host-port flow"),
            arriving(&lab, remote, node, port_unreachable(v4, quote)).frame(),
            false,
        ));
    }
    let mut refused = Vec::new();
    for (what, frame, icmp_error) in &frames {
        let l3 = l3_end(frame);
        for cut in ETH_HLEN..frame.len() {
            let short = &frame[..cut];
            let Some(r) = run_cut(
                &lab,
                PROG_FROM_DEV,
                lab.up.ifindex,
                frame,
                cut,
                &mut refused,
            ) else {
                continue;
            };
            let at = format!("{what} cut to {cut} bytes");
            if cut < l3 || *icmp_error {
                assert_eq!(r.verdict, Verdict::Next, "{at}");
                assert_eq!(r.frame, short, "{at}: changed");
            } else {
                assert!(
                    matches!(r.verdict, Verdict::Next | Verdict::Shot | Verdict::Redirect),
                    "{at}: {:?}",
                    r.verdict
                );
                if r.verdict == Verdict::Next {
                    assert_eq!(r.frame, short, "{at}: passed half-translated");
                }
            }
        }
        let r = lab.from_dev(frame);
        assert_eq!(r.verdict, Verdict::Redirect, "{what}, whole");
        checksums_ok(&r.frame, what);
    }
    report_refused(&refused);
}

/// IPv6 extension headers other than a fragment header, a fragment header followed by
/// another, TCP in IPv6 fragments, and fragments outside a translated datagram (a later
/// fragment whose first never came) are never translated: from a masquerading pod they
/// are dropped and counted (they would leave with the pod's address); to a host port they
/// go to the stack untranslated; to a pod they are delivered with the headers intact.
#[test]
fn extension_headers_and_fragments_are_never_translated() {
    let mut lab = lab();
    let (a, b) = (lab.a.clone(), lab.b.clone());
    lab.host_ports();
    lab.masquerade(&a);
    for v4 in [true, false] {
        map_port(&mut lab, v4, IPPROTO_UDP, 8081, 81);
    }
    let mut odd: Vec<(String, Pkt)> = Vec::new();
    let six = |l4| Pkt::new(a.addr(false), lab.up.remote(false), l4);
    for ext in [IPPROTO_HOPOPTS, IPPROTO_DSTOPTS] {
        odd.push((
            format!("IPv6 with extension header {ext}"),
            six(L4::udp(40_050, 8081)).ext(ext),
        ));
    }
    odd.push((
        "IPv6 first fragment of a datagram with a further extension header".to_owned(),
        six(L4::udp(40_050, 8081))
            .ext(IPPROTO_FRAGMENT)
            .ext(IPPROTO_DSTOPTS),
    ));
    odd.push((
        "TCP in IPv6 fragments".to_owned(),
        six(L4::tcp(40_050, 8081, TCP_SYN)).ext(IPPROTO_FRAGMENT),
    ));
    odd.push((
        "IPv6 later fragment, its first unseen".to_owned(),
        six(L4::udp(40_050, 8081))
            .ext(IPPROTO_FRAGMENT)
            .frag6(1024 | 1),
    ));
    odd.push((
        "IPv4 later fragment, its first unseen".to_owned(),
        Pkt::new(a.addr(true), lab.up.remote(true), L4::udp(40_050, 8081)).frag(100),
    ));
    for (what, pkt) in &odd {
        let v4 = pkt.src.is_ipv4();
        let before = (
            lab.progs.counters(a.ifindex).from_pod,
            lab.progs.masq_stats(),
        );
        let out = pkt.clone().macs(a.pod_mac, a.host_mac).frame();
        let r = lab.from_pod(&a, &out);
        assert_eq!(r.verdict, Verdict::Shot, "{what}, masqueraded");
        let after = (
            lab.progs.counters(a.ifindex).from_pod,
            lab.progs.masq_stats(),
        );
        assert_eq!(after.0.drops - before.0.drops, 1, "{what}: counted");
        assert_eq!(
            after.1.untranslatable - before.1.untranslatable,
            1,
            "{what}"
        );

        let mut to_host_port = pkt.clone();
        (to_host_port.src, to_host_port.dst) = (lab.up.remote(v4), lab.up.addr(v4));
        let frame = to_host_port.macs(GATEWAY_MAC, lab.up.mac).frame();
        let r = lab.from_dev(&frame);
        assert_eq!(
            (r.verdict, &r.frame),
            (Verdict::Next, &frame),
            "{what}, host port"
        );

        let mut to_pod = pkt.clone();
        to_pod.dst = b.addr(v4);
        let frame = to_pod.macs(a.pod_mac, a.host_mac).frame();
        let r = lab.from_pod(&a, &frame);
        assert_eq!(r.verdict, Verdict::Redirect, "{what}, to a pod");
        assert_eq!(r.frame[l3_end(&frame)..], frame[l3_end(&frame)..], "{what}");
    }
    assert_eq!(lab.progs.masq_stats().flows, 0);
}
