//! Services next to kube-proxy: which flows go to the stack.

use std::net::IpAddr;

use super::{arriving, family, from, lab};
use ebpf_cni_maps::IPPROTO_TCP;
use ebpf_cni_tests::packet::{Pkt, L4, TCP_ACK, TCP_SYN};
use ebpf_cni_tests::progtest::{endpoint_key, Verdict};

/// The key of a Services flow as the programs record it: `pod`'s address and port, the
/// peer's (`None`: a pod's flow to a Service address, which has no peer).
fn services_key(
    pod: IpAddr,
    pod_port: u16,
    peer: Option<(IpAddr, u16)>,
) -> ebpf_cni_maps::ServicesFlowKey {
    let (peer, peer_port) = peer.map_or(([0; 16], 0), |(a, p)| (endpoint_key(a).addr, p));
    ebpf_cni_maps::ServicesFlowKey {
        pod: endpoint_key(pod).addr,
        peer,
        pod_port,
        peer_port,
        proto: IPPROTO_TCP,
        _pad: [0; 3],
    }
}

/// Services next to kube-proxy: without the node's switch a pod's packet to a routed
/// address is forwarded by the programs; with it, a packet to a Service address goes to the
/// stack (its flow recorded without a peer), the stack's delivery of the translated packet
/// into the endpoint pod records the flow from the endpoint's side, whose reply then goes
/// to the stack too, as does an answer from beyond the node to the client's flow; a flow
/// no rule touches keeps the redirect, both families.
#[test]
fn service_flows_go_to_the_stack_both_ways_and_other_flows_keep_the_redirect() {
    let mut lab = lab();
    let (a, b) = (lab.a.clone(), lab.b.clone());
    for v4 in [true, false] {
        let f = family(v4);
        // A "ClusterIP" the lab's FIB routes out of the uplink.
        let vip = lab.up.remote(v4);
        let to_vip = from(&a, vip, L4::tcp(40_000, 80, TCP_SYN)).frame();
        assert_eq!(
            lab.from_pod(&a, &to_vip).verdict,
            Verdict::Redirect,
            "{f}: no switch"
        );
    }
    lab.progs.add_service_net(lab.up.remote(true), 32);
    lab.progs.add_service_net(lab.up.remote(false), 128);
    for v4 in [true, false] {
        let f = family(v4);
        let vip = lab.up.remote(v4);
        let r = lab.from_pod(&a, &from(&a, vip, L4::tcp(40_000, 80, TCP_SYN)).frame());
        assert_eq!(r.verdict, Verdict::Next, "{f}: to a Service address");
        assert_eq!(
            lab.progs
                .services_flow(&services_key(a.addr(v4), 40_000, None)),
            Some(ebpf_cni_maps::SERVICES_FLOW_CLIENT),
            "{f}: the client's flow"
        );
        // netfilter translated it to pod B: the stack delivers it through B's host veth.
        let dnated = Pkt::new(a.addr(v4), b.addr(v4), L4::tcp(40_000, 8080, TCP_SYN))
            .macs(b.host_mac, b.pod_mac)
            .frame();
        lab.to_pod(&b, &dnated);
        assert_eq!(
            lab.progs
                .services_flow(&services_key(b.addr(v4), 8080, Some((a.addr(v4), 40_000)))),
            Some(ebpf_cni_maps::SERVICES_FLOW_DELIVERED),
            "{f}: the endpoint's side"
        );
        let reply = from(&b, a.addr(v4), L4::tcp(8080, 40_000, TCP_SYN | TCP_ACK)).frame();
        assert_eq!(
            lab.from_pod(&b, &reply).verdict,
            Verdict::Next,
            "{f}: the endpoint's reply"
        );
        let answer = arriving(
            &lab,
            vip,
            a.addr(v4),
            L4::tcp(80, 40_000, TCP_SYN | TCP_ACK),
        )
        .frame();
        assert_eq!(
            lab.from_dev(&answer).verdict,
            Verdict::Next,
            "{f}: an answer from beyond"
        );
        // Pod to pod, and the same pods' other ports: the redirect.
        let direct = from(&a, b.addr(v4), L4::tcp(40_001, 8080, TCP_SYN)).frame();
        assert_eq!(
            lab.from_pod(&a, &direct).verdict,
            Verdict::Redirect,
            "{f}: pod to pod"
        );
        let other = from(&b, a.addr(v4), L4::tcp(8080, 40_001, TCP_SYN | TCP_ACK)).frame();
        assert_eq!(
            lab.from_pod(&b, &other).verdict,
            Verdict::Redirect,
            "{f}: its reply"
        );
        let inbound = arriving(&lab, vip, a.addr(v4), L4::tcp(80, 40_001, TCP_SYN)).frame();
        assert_eq!(
            lab.from_dev(&inbound).verdict,
            Verdict::Redirect,
            "{f}: from outside"
        );
    }
}
