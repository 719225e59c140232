//! The source check: a pod sends only with its own addresses and MAC.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{from, lab};
use ebpf_cni_tests::packet::{Arp, Pkt, L4};
use ebpf_cni_tests::progtest::Verdict;

/// The source check: a frame from another address (IPv4, IPv6, an ARP sender) or another
/// MAC is dropped and counted as such; the pod's own addresses pass, and a link-local
/// source goes to the stack. Every frame is counted as a packet first.
#[test]
fn a_spoofed_source_address_or_mac_is_dropped_and_counted() {
    let mut lab = lab();
    let (a, b) = (lab.a.clone(), lab.b.clone());
    lab.source_check(&a);
    let spoofed4 = IpAddr::V4(Ipv4Addr::new(10, 88, 0, 99));
    let spoofed6 = IpAddr::V6(Ipv6Addr::new(0xfd00, 0x88, 0, 0, 0, 0, 0, 0x99));
    let link_local: IpAddr = "fe80::1".parse().unwrap();
    let mut vlan = from(&a, b.addr(true), L4::udp(1, 2)).frame();
    vlan[12..14].copy_from_slice(&0x8100u16.to_be_bytes());
    let cases: Vec<(&str, Vec<u8>, Verdict)> = vec![
        (
            "own IPv4",
            from(&a, b.addr(true), L4::udp(1, 2)).frame(),
            Verdict::Redirect,
        ),
        (
            "own IPv6",
            from(&a, b.addr(false), L4::udp(1, 2)).frame(),
            Verdict::Redirect,
        ),
        (
            "spoofed IPv4",
            Pkt::new(spoofed4, b.addr(true), L4::udp(1, 2))
                .macs(a.pod_mac, a.host_mac)
                .frame(),
            Verdict::Shot,
        ),
        (
            "spoofed IPv6",
            Pkt::new(spoofed6, b.addr(false), L4::udp(1, 2))
                .macs(a.pod_mac, a.host_mac)
                .frame(),
            Verdict::Shot,
        ),
        (
            "ARP claiming pod b's address",
            Arp::request(a.pod_mac, b.v4.octets(), a.gateway4.octets()).frame([0xff; 6], a.pod_mac),
            Verdict::Shot,
        ),
        ("VLAN-tagged", vlan, Verdict::Shot),
        (
            "link-local IPv6",
            Pkt::new(link_local, "ff02::2".parse().unwrap(), L4::echo_request(1))
                .macs(a.pod_mac, [0x33, 0x33, 0, 0, 0, 2])
                .frame(),
            Verdict::Next,
        ),
        (
            "own address, another MAC",
            from(&a, b.addr(true), L4::udp(1, 2))
                .macs([0x02, 0xbe, 0xef, 0, 0, 1], a.host_mac)
                .frame(),
            Verdict::Shot,
        ),
    ];
    for (what, frame, want) in &cases {
        let r = lab.from_pod(&a, frame);
        assert_eq!(r.verdict, *want, "{what}");
    }
    let c = lab.progs.counters(a.ifindex).from_pod;
    assert_eq!(
        (c.packets, c.source_drops, c.mac_drops, c.drops),
        (cases.len() as u64, 4, 1, 0),
        "{c:?}"
    );
    assert_eq!(lab.progs.counters(b.ifindex).to_pod.packets, 2);
}
