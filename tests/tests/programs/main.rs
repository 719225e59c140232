//! Program tests: each TC program runs on crafted frames through `BPF_PROG_TEST_RUN`, as
//! Cilium's `bpf/tests` does, and each test checks the verdict, the bytes the program left
//! (addresses, ports, MACs, TTL, every checksum) and what it wrote into its maps (counters,
//! flows), for one behaviour its name says. One module per capability the programs carry
//! (`routing`, `host_ports`, `masquerade`, `bandwidth`, `source_check`, `services`), one for
//! the object as a whole (`object`: the verifier's budget, the calls) and one for frames no
//! program may misread (`malformed`); the frame builders they share are here. See
//! `ebpf_cni_tests::progtest` for the lab they run in; docs/development.md for how to run
//! and add them.

mod bandwidth;
mod host_ports;
mod malformed;
mod masquerade;
mod object;
mod routing;
mod services;
mod source_check;

use std::net::IpAddr;

use ebpf_cni_maps::{PortKey, PortTarget};
use ebpf_cni_tests::packet::{
    fragment, fragment6, parse, verify_checksums, Pkt, ICMPV6_DEST_UNREACH, ICMPV6_PORT_UNREACH,
    ICMP_DEST_UNREACH, ICMP_PORT_UNREACH, L4,
};
use ebpf_cni_tests::progtest::{endpoint_key, Lab, LabPod, Verdict, GATEWAY_MAC};
use ebpf_cni_tests::require_root;

fn lab() -> Lab {
    require_root();
    Lab::new().unwrap_or_else(|e| panic!("setting up the program lab: {e:#}"))
}

/// [`lab`] with the benchmark's object, for the prototypes the plugin's object leaves out.
fn prototype_lab() -> Lab {
    require_root();
    Lab::with_prototypes().unwrap_or_else(|e| panic!("setting up the prototypes' lab: {e:#}"))
}

fn family(v4: bool) -> &'static str {
    if v4 {
        "IPv4"
    } else {
        "IPv6"
    }
}

fn checksums_ok(frame: &[u8], what: &str) {
    if let Err(e) = verify_checksums(frame) {
        panic!("{what}: {e}");
    }
}

/// A frame pod `p` sends to `dst` (to its gateway's MAC, the host veth's).
fn from(p: &LabPod, dst: IpAddr, l4: L4) -> Pkt {
    Pkt::new(p.addr(dst.is_ipv4()), dst, l4).macs(p.pod_mac, p.host_mac)
}

/// A frame arriving on the uplink from its gateway.
fn arriving(lab: &Lab, src: IpAddr, dst: IpAddr, l4: L4) -> Pkt {
    Pkt::new(src, dst, l4).macs(GATEWAY_MAC, lab.up.mac)
}

/// A host port mapping's key and target for pod `p`, port `host_port` → `pod_port`.
fn map_port(lab: &mut Lab, v4: bool, proto: u8, host_port: u16, pod_port: u16) -> PortKey {
    let key = PortKey {
        addr: endpoint_key(lab.up.addr(v4)).addr,
        port: host_port,
        proto,
        _pad: 0,
    };
    let a = lab.a.clone();
    let target = PortTarget {
        attachment_id: a.attachment_id,
        pod_addr: endpoint_key(a.addr(v4)).addr,
        gateway: if v4 {
            endpoint_key(IpAddr::V4(a.gateway4)).addr
        } else {
            [0; 16]
        },
        host_ifindex: a.ifindex,
        pod_port,
        flags: 0,
        _pad: 0,
    };
    lab.progs.set_port(key, target);
    key
}

/// `pkt` as a sender's stack cuts it into fragments of 1,024 bytes of payload: IPv4's
/// with identification `id` (and DF off), IPv6's with a fragment header and `id` in it.
fn fragments(pkt: Pkt, id: u16) -> Vec<Vec<u8>> {
    if pkt.src.is_ipv4() {
        fragment(&pkt.frag(0).ident(id).frame(), 1024)
    } else {
        fragment6(&pkt.frame(), 1024, 0x8000_0000 | u32::from(id))
    }
}

/// A masqueraded UDP flow from pod a (port 5353 to the remote end's 53); its node port.
fn udp_flow(lab: &Lab, v4: bool) -> u16 {
    let frame = from(&lab.a, lab.up.remote(v4), L4::udp(5353, 53)).frame();
    let r = lab.from_pod(&lab.a, &frame);
    assert_eq!(r.verdict, Verdict::Redirect, "{}: the flow", family(v4));
    parse(&r.frame).ports().0
}

fn port_unreachable(v4: bool, quote: Vec<u8>) -> L4 {
    let (kind, code) = if v4 {
        (ICMP_DEST_UNREACH, ICMP_PORT_UNREACH)
    } else {
        (ICMPV6_DEST_UNREACH, ICMPV6_PORT_UNREACH)
    };
    L4::Error { kind, code, quote }
}
