//! Rate limits: the policer (drops past the burst, ECN marks), when a limit is looked up,
//! and the EDT pacer.

use super::{checksums_ok, family, from, lab};
use ebpf_cni_maps::{Bucket, RateLimit, LIMIT_EDT, LIMIT_POLICE};
use ebpf_cni_tests::packet::{parse, Pkt, L4};
use ebpf_cni_tests::progtest::{monotonic_ns, Lab, Verdict};

/// A policer's bucket holding `tokens` bytes now that does not refill: `rate_bytes` 1 and
/// its last refill in the future (no time has passed).
fn held_bucket(tokens: u64, burst: u32) -> Bucket {
    Bucket {
        rate_bytes: 1,
        burst_bytes: burst,
        mode: LIMIT_POLICE,
        tokens,
        last_ns: monotonic_ns() + 3_600_000_000_000,
    }
}

/// Pod a's egress limit: `rate_bytes` 1 (no refill to speak of) and `tokens` bytes now.
fn police_egress(lab: &mut Lab, tokens: u64, burst: u32) {
    let egress = held_bucket(tokens, burst);
    let a = lab.a.ifindex;
    lab.progs.set_rate(
        a,
        RateLimit {
            ingress: Bucket::default(),
            egress,
        },
    );
}

/// The policer passes what the bucket holds and drops the next packet, counting it as a
/// drop (not as a packet), with the tokens spent.
#[test]
fn the_policer_drops_past_the_burst_and_counts_the_drop() {
    let mut lab = lab();
    let (a, b) = (lab.a.clone(), lab.b.clone());
    let frame = from(&a, b.addr(true), L4::udp(40_020, 9))
        .payload(100)
        .frame();
    let len = frame.len() as u64;
    police_egress(&mut lab, 2 * len, 2 * len as u32);
    let verdicts: Vec<Verdict> = (0..3).map(|_| lab.from_pod(&a, &frame).verdict).collect();
    assert_eq!(
        verdicts,
        [Verdict::Redirect, Verdict::Redirect, Verdict::Shot]
    );
    let c = lab.progs.counters(a.ifindex).from_pod;
    assert_eq!((c.packets, c.drops), (2, 1), "{c:?}");
    assert_eq!(lab.progs.rate(a.ifindex).egress.tokens, 0);
    assert_eq!(lab.progs.counters(b.ifindex).to_pod.packets, 2);
}

/// A node without limits tells the programs so (`NODE_FLAG_NO_LIMITS`), and they then
/// skip the sender's limit lookup: an empty egress bucket the switch says is not there
/// drops nothing. The limit towards the receiver is looked up whatever the switch says (an
/// older release may have written it, see the flag's doc). Without the switch, both drop.
#[test]
fn the_senders_limit_is_looked_up_unless_the_node_says_there_are_none() {
    let mut lab = lab();
    let (a, b) = (lab.a.clone(), lab.b.clone());
    let empty = held_bucket(0, 1);
    for p in [&a, &b] {
        lab.progs.set_rate(
            p.ifindex,
            RateLimit {
                ingress: empty,
                egress: empty,
            },
        );
    }
    let frame = from(&a, b.addr(true), L4::udp(40_022, 9)).frame();
    assert_eq!(
        lab.from_pod(&a, &frame).verdict,
        Verdict::Shot,
        "limits looked up"
    );
    assert_eq!(lab.progs.counters(a.ifindex).from_pod.drops, 1);
    // The switch: a's egress is not looked up, b's ingress still is.
    lab.no_limits();
    assert_eq!(lab.from_pod(&a, &frame).verdict, Verdict::Shot);
    let (ca, cb) = (
        lab.progs.counters(a.ifindex).from_pod,
        lab.progs.counters(b.ifindex).to_pod,
    );
    assert_eq!((ca.drops, ca.packets), (1, 1), "a's egress passed: {ca:?}");
    assert_eq!(cb.drops, 1, "b's ingress dropped: {cb:?}");
    // Without b's limit: delivered.
    lab.progs.set_rate(
        b.ifindex,
        RateLimit {
            ingress: Bucket::default(),
            egress: Bucket::default(),
        },
    );
    assert_eq!(lab.from_pod(&a, &frame).verdict, Verdict::Redirect);
    assert_eq!(lab.progs.counters(b.ifindex).to_pod.packets, 1);
}

/// A receiver whose counters say it has no ingress limit (`COUNTERS_NO_INGRESS_LIMIT`, as
/// ADD writes them for such a pod) is delivered to without a lookup of its limit: an empty
/// ingress bucket the flag says is not there drops nothing. Counters without the flag (an
/// earlier release's, or a limited pod's) keep the lookup, and the bucket drops.
#[test]
fn the_receivers_limit_is_looked_up_unless_its_counters_say_it_has_none() {
    limit_looked_up_unless_the_counters_say_none(true);
}

/// A sender whose counters say it has no egress limit (`COUNTERS_NO_EGRESS_LIMIT`, as ADD
/// writes them for such a pod) leaves without a lookup of its limit, on a node where pods
/// may have limits (the switch off): as for the receiver.
#[test]
fn the_senders_limit_is_looked_up_unless_its_counters_say_it_has_none() {
    limit_looked_up_unless_the_counters_say_none(false);
}

/// Pod a sends to pod b, whose limit (`ingress`) or a's own holds an empty bucket: the
/// packet is dropped while the limited pod's counters have no flag, and delivered once
/// they say there is no limit that way; counted in that pod's direction either way.
fn limit_looked_up_unless_the_counters_say_none(ingress: bool) {
    let mut lab = lab();
    let (a, b) = (lab.a.clone(), lab.b.clone());
    let (pod, empty) = (if ingress { &b } else { &a }, held_bucket(0, 1));
    let (limit, flags) = if ingress {
        let limit = RateLimit {
            ingress: empty,
            egress: Bucket::default(),
        };
        (limit, (0, ebpf_cni_maps::COUNTERS_NO_INGRESS_LIMIT))
    } else {
        let limit = RateLimit {
            ingress: Bucket::default(),
            egress: empty,
        };
        (limit, (ebpf_cni_maps::COUNTERS_NO_EGRESS_LIMIT, 0))
    };
    lab.progs.set_rate(pod.ifindex, limit);
    let counted = |lab: &Lab| {
        let c = lab.progs.counters(pod.ifindex);
        let c = if ingress { c.to_pod } else { c.from_pod };
        (c.drops, c.packets)
    };
    let frame = from(&a, b.addr(true), L4::udp(40_023, 9)).frame();
    assert_eq!(
        lab.from_pod(&a, &frame).verdict,
        Verdict::Shot,
        "flag off: the limit looked up (ingress: {ingress})"
    );
    assert_eq!(counted(&lab), (1, 0), "ingress: {ingress}");
    lab.progs.watch_pod_flagged(pod.ifindex, flags.0, flags.1);
    assert_eq!(
        lab.from_pod(&a, &frame).verdict,
        Verdict::Redirect,
        "flag on: not looked up (ingress: {ingress})"
    );
    assert_eq!(counted(&lab), (0, 1), "ingress: {ingress}");
}

/// While the bucket runs low (under a quarter of the burst), ECN-capable packets pass
/// marked CE (the IPv4 header checksum patched) and are counted as marks; others pass
/// unmarked.
#[test]
fn the_policer_marks_ecn_capable_packets_ce_when_the_bucket_runs_low() {
    let mut lab = lab();
    let (a, b) = (lab.a.clone(), lab.b.clone());
    police_egress(&mut lab, 1_000_000, 100_000_000);
    for (v4, ect) in [(true, 0x02), (false, 0x01)] {
        let frame = from(&a, b.addr(v4), L4::udp(40_021, 9))
            .tos(0xb8 | ect)
            .frame();
        let r = lab.from_pod(&a, &frame);
        assert_eq!(r.verdict, Verdict::Redirect);
        let got = parse(&r.frame);
        assert_eq!(got.tos, 0xbb, "{}: DSCP kept, ECN CE", family(v4));
        checksums_ok(&r.frame, family(v4));
    }
    let plain = from(&a, b.addr(true), L4::udp(40_021, 9)).frame();
    let r = lab.from_pod(&a, &plain);
    assert_eq!(parse(&r.frame).tos, 0, "not ECN-capable: unmarked");
    let c = lab.progs.counters(a.ifindex).from_pod;
    assert_eq!((c.packets, c.marks, c.drops), (3, 2, 0));
}

/// The EDT pacer at the host veth egress of a paced pod: each packet leaves at the pod's
/// clock (`skb->tstamp`, read back from the context), which moves by the packet's length at
/// the rate; a small packet of an idle flow leaves at once (still charged); a departure
/// beyond the horizon is dropped and counted.
#[test]
fn the_pacer_stamps_departures_at_the_rate_and_drops_past_the_horizon() {
    let mut lab = lab();
    let a = lab.a.clone();
    // 1,000 bytes/s: a 1,000-byte packet costs a second, far more than a run takes even
    // under emulation; the horizon is 131 s (two 64 KiB GSO packets at the rate).
    let rate = 1_000;
    let ingress = Bucket {
        rate_bytes: rate,
        burst_bytes: 0,
        mode: LIMIT_EDT,
        tokens: 0,
        last_ns: 0,
    };
    lab.progs.set_rate(
        a.ifindex,
        RateLimit {
            ingress,
            egress: Bucket::default(),
        },
    );
    let big = Pkt::new(lab.up.remote(true), a.addr(true), L4::udp(5000, 5001))
        .payload(1000 - 42)
        .macs(a.host_mac, a.pod_mac)
        .frame();
    assert_eq!(big.len(), 1000);
    let cost = 1_000_000_000 * big.len() as u64 / rate;
    let before = monotonic_ns();
    let first = lab.to_pod(&a, &big);
    let after = monotonic_ns();
    assert_eq!(first.verdict, Verdict::Next);
    let t1 = first.ctx.tstamp;
    assert!(
        t1 >= before + cost && t1 <= after + cost,
        "first departure {t1} not one packet's time after now ({before}..{after} + {cost})"
    );
    let second = lab.to_pod(&a, &big);
    assert_eq!(second.verdict, Verdict::Next);
    assert_eq!(
        second.ctx.tstamp,
        t1 + cost,
        "the second leaves one packet later"
    );

    let small = Pkt::new(lab.up.remote(true), a.addr(true), L4::udp(6000, 6001))
        .macs(a.host_mac, a.pod_mac)
        .frame();
    let before = monotonic_ns();
    let r = lab.to_pod(&a, &small);
    let after = monotonic_ns();
    assert_eq!(r.verdict, Verdict::Next);
    assert!(
        (before..=after).contains(&r.ctx.tstamp),
        "a small packet of an idle flow leaves now, not at {}",
        r.ctx.tstamp
    );
    let charged = 1_000_000_000 * small.len() as u64 / rate;
    assert_eq!(
        lab.progs.rate(a.ifindex).ingress.last_ns,
        t1 + cost + charged
    );

    // The pod's clock 200 s ahead: past the horizon.
    let mut far = lab.progs.rate(a.ifindex);
    far.ingress.last_ns = monotonic_ns() + 200_000_000_000;
    lab.progs.set_rate(a.ifindex, far);
    assert_eq!(lab.to_pod(&a, &big).verdict, Verdict::Shot);
    let c = lab.progs.counters(a.ifindex).to_pod;
    assert_eq!((c.packets, c.drops), (3, 1), "{c:?}");
}
