//! Allocation behaviour on a real (temporary) data directory, and interop with the
//! reference `host-local` binary sharing that directory.

use std::collections::HashSet;
use std::fs;
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Barrier};

use serde_json::{json, Value};

use super::*;
use crate::cni::error::code;

const NET: &str = "testnet";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A config whose `dataDir` is `dir`; `ipam` supplies the rest.
fn conf(dir: &Path, mut ipam: Value) -> HostLocalConfig {
    ipam["dataDir"] = json!(dir);
    HostLocalConfig::parse(&ipam, None).unwrap()
}

fn v4_29(dir: &Path) -> HostLocalConfig {
    conf(
        dir,
        json!({"type": "host-local", "ranges": [[{"subnet": "10.9.0.0/29"}]]}),
    )
}

fn req<'a>(id: &'a str, requested: &'a [IpAddr]) -> IpamRequest<'a> {
    IpamRequest {
        fresh: false,
        network: NET,
        container_id: id,
        ifname: "eth0",
        requested,
    }
}

fn alloc(c: &HostLocalConfig, id: &str) -> Result<Vec<IpAddr>, IpamError> {
    Ok(allocate(c, &req(id, &[]))?
        .ips
        .iter()
        .map(|i| i.address.ip())
        .collect())
}

fn alloc1(c: &HostLocalConfig, id: &str) -> String {
    let ips = alloc(c, id).unwrap();
    assert_eq!(ips.len(), 1);
    ips[0].to_string()
}

/// The reference's files of the network directory (ebpf-cni's own records, in their
/// directory, are tested in `boot`'s tests).
fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> = fs::read_dir(dir.join(NET))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "ebpf-cni")
        .collect();
    names.sort();
    names
}

#[test]
fn round_robin_order_and_wrap_around() {
    let tmp = tempfile::tempdir().unwrap();
    let c = v4_29(tmp.path());
    let got: Vec<_> = ["a", "b", "c"].iter().map(|id| alloc1(&c, id)).collect();
    assert_eq!(got, ["10.9.0.2", "10.9.0.3", "10.9.0.4"]);
    // A released address is not reused until the walk comes round again.
    release(&c, NET, "a", "eth0").unwrap();
    assert_eq!(alloc1(&c, "d"), "10.9.0.5");
    assert_eq!(alloc1(&c, "e"), "10.9.0.6");
    // Past the end, the walk wraps to the start and skips what is taken.
    assert_eq!(alloc1(&c, "f"), "10.9.0.2");
    release(&c, NET, "c", "eth0").unwrap();
    assert_eq!(alloc1(&c, "g"), "10.9.0.4");
    assert_eq!(
        fs::read(tmp.path().join(NET).join("last_reserved_ip.0")).unwrap(),
        b"10.9.0.4"
    );
}

#[test]
fn gateway_is_never_handed_out() {
    let tmp = tempfile::tempdir().unwrap();
    let c = conf(
        tmp.path(),
        json!({"ranges": [[{"subnet": "10.9.0.0/29", "gateway": "10.9.0.4"}]]}),
    );
    let got: Vec<_> = ["a", "b", "c", "d", "e"]
        .iter()
        .map(|id| alloc1(&c, id))
        .collect();
    assert_eq!(
        got,
        ["10.9.0.1", "10.9.0.2", "10.9.0.3", "10.9.0.5", "10.9.0.6"]
    );
    let r = allocate(&c, &req("z", &[])).unwrap_err();
    assert!(matches!(r, IpamError::Exhausted { .. }), "{r}");
}

#[test]
fn result_carries_prefix_gateway_routes_and_dns() {
    let tmp = tempfile::tempdir().unwrap();
    let resolv = tmp.path().join("resolv.conf");
    fs::write(&resolv, "nameserver 10.0.0.53\nsearch example.com\n").unwrap();
    let c = conf(
        tmp.path(),
        json!({"ranges": [[{"subnet": "10.9.0.0/24", "gateway": "10.9.0.254"}]], "routes": [{"dst": "0.0.0.0/0"}], "resolvConf": resolv}),
    );
    let r = allocate(&c, &req("a", &[])).unwrap();
    assert_eq!(
        r.ips,
        [IpamIp {
            address: "10.9.0.1/24".parse().unwrap(),
            gateway: Some(ip("10.9.0.254"))
        }]
    );
    assert_eq!(
        r.routes,
        [IpamRoute {
            dst: "0.0.0.0/0".parse().unwrap(),
            gw: None,
            options: Default::default(),
        }]
    );
    let dns = r.dns.unwrap();
    assert_eq!(
        (dns.nameservers, dns.search),
        (
            vec!["10.0.0.53".to_string()],
            vec!["example.com".to_string()]
        )
    );
    // Without resolvConf there is no DNS at all.
    assert_eq!(
        allocate(
            &v4_29(tmp.path()),
            &IpamRequest {
                fresh: false,
                network: "other",
                ..req("a", &[])
            }
        )
        .unwrap()
        .dns,
        None
    );
}

#[test]
fn missing_resolv_conf_reserves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let c = conf(
        tmp.path(),
        json!({"ranges": [[{"subnet": "10.9.0.0/29"}]], "resolvConf": tmp.path().join("nope")}),
    );
    let e = allocate(&c, &req("a", &[])).unwrap_err();
    assert_eq!(e.cni_code(), code::IO_FAILURE);
    assert!(!tmp.path().join(NET).exists());
}

#[test]
fn exhaustion_is_reported_with_the_set() {
    let tmp = tempfile::tempdir().unwrap();
    let c = conf(tmp.path(), json!({"ranges": [[{"subnet": "10.9.0.0/30"}]]}));
    assert_eq!(alloc1(&c, "a"), "10.9.0.2");
    let e = allocate(&c, &req("b", &[])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "no IP address left in range set ipam.ranges[0] (10.9.0.1-10.9.0.2)"
    );
    assert_eq!(e.cni_code(), code::IPAM_EXHAUSTED);
    assert_eq!(
        files(tmp.path()),
        ["10.9.0.2", "last_reserved_ip.0", "lock"]
    );
}

#[test]
fn requested_addresses() {
    let tmp = tempfile::tempdir().unwrap();
    let c = v4_29(tmp.path());
    let r = allocate(&c, &req("a", &[ip("10.9.0.5")])).unwrap();
    assert_eq!(r.ips[0].address, "10.9.0.5/29".parse().unwrap());
    // The round robin continues after a requested address too (as in the reference).
    assert_eq!(alloc1(&c, "b"), "10.9.0.6");
    // IPv4-mapped spelling is the IPv4 address.
    let r = allocate(&c, &req("c", &[ip("::ffff:10.9.0.3")])).unwrap();
    assert_eq!(r.ips[0].address.ip(), ip("10.9.0.3"));

    let cases: Vec<(&str, Vec<IpAddr>, &str)> = vec![
        ("d", vec![ip("10.9.0.5")], "requested IP 10.9.0.5 in range set ipam.ranges[0] is already reserved"),
        ("d", vec![ip("10.9.0.1")], "requested IP 10.9.0.1 is the gateway of range set ipam.ranges[0]"),
        ("d", vec![ip("10.9.0.7")], "requested IP 10.9.0.7 is not inside any range of this network"),
        ("d", vec![ip("fd00::2")], "requested IP fd00::2 is not inside any range of this network"),
        (
            "d",
            vec![ip("10.9.0.2"), ip("10.9.0.4")],
            "requested IPs 10.9.0.2 and 10.9.0.4 both fall in range set ipam.ranges[0]; one address per range set",
        ),
    ];
    for (id, want, msg) in cases {
        let e = allocate(&c, &req(id, &want)).unwrap_err();
        assert_eq!(e.to_string(), msg);
        assert_eq!(e.cni_code(), code::IPAM_UNAVAILABLE);
    }
    // The same address twice is one request.
    allocate(&c, &req("d", &[ip("10.9.0.2"), ip("10.9.0.2")])).unwrap();
    assert_eq!(
        files(tmp.path()),
        [
            "10.9.0.2",
            "10.9.0.3",
            "10.9.0.5",
            "10.9.0.6",
            "last_reserved_ip.0",
            "lock"
        ]
    );
}

#[test]
fn duplicate_allocation_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let c = v4_29(tmp.path());
    alloc1(&c, "a");
    let e = allocate(&c, &req("a", &[])).unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"container "a" interface "eth0" already holds 10.9.0.2 in range set ipam.ranges[0]; duplicate allocation is not allowed"#
    );
    assert!(allocate(&c, &req("a", &[ip("10.9.0.4")])).is_err());
    // Another interface of the same container is another attachment.
    let r = allocate(
        &c,
        &IpamRequest {
            ifname: "eth1",
            ..req("a", &[])
        },
    )
    .unwrap();
    assert_eq!(r.ips[0].address.ip(), ip("10.9.0.3"));
    // An old-format lease (container ID only) counts for every interface of the container.
    fs::write(tmp.path().join(NET).join("10.9.0.6"), "old").unwrap();
    assert!(matches!(
        allocate(&c, &req("old", &[])),
        Err(IpamError::DuplicateAllocation { .. })
    ));
}

#[test]
fn dual_stack_gets_one_address_per_set() {
    let tmp = tempfile::tempdir().unwrap();
    let c = conf(
        tmp.path(),
        json!({"ranges": [[{"subnet": "10.9.0.0/24"}], [{"subnet": "fd00:9::/64", "rangeStart": "fd00:9::10"}]]}),
    );
    let r = allocate(&c, &req("a", &[ip("fd00:9::99")])).unwrap();
    assert_eq!(
        r.ips,
        [
            IpamIp {
                address: "10.9.0.2/24".parse().unwrap(),
                gateway: Some(ip("10.9.0.1"))
            },
            IpamIp {
                address: "fd00:9::99/64".parse().unwrap(),
                gateway: Some(ip("fd00:9::1"))
            },
        ]
    );
    assert_eq!(alloc(&c, "b").unwrap(), [ip("10.9.0.3"), ip("fd00:9::9a")]);
    assert_eq!(
        reserved(&c, NET, "a", "eth0").unwrap(),
        [ip("10.9.0.2"), ip("fd00:9::99")]
    );
    assert_eq!(
        files(tmp.path()),
        [
            "10.9.0.2",
            "10.9.0.3",
            "fd00:9::99",
            "fd00:9::9a",
            "last_reserved_ip.0",
            "last_reserved_ip.1",
            "lock"
        ]
    );
}

#[test]
fn failure_in_one_set_leaves_no_partial_lease() {
    let tmp = tempfile::tempdir().unwrap();
    let c = conf(
        tmp.path(),
        json!({"ranges": [[{"subnet": "10.9.0.0/24"}], [{"subnet": "fd00:9::/126"}]]}),
    );
    assert_eq!(alloc(&c, "a").unwrap(), [ip("10.9.0.2"), ip("fd00:9::2")]);
    assert_eq!(alloc(&c, "b").unwrap(), [ip("10.9.0.3"), ip("fd00:9::3")]);
    let e = allocate(&c, &req("c", &[])).unwrap_err();
    assert_eq!(e.cni_code(), code::IPAM_EXHAUSTED);
    assert!(reserved(&c, NET, "c", "eth0").is_err());
    // A taken requested address in the second set also rolls back the first.
    release(&c, NET, "b", "eth0").unwrap();
    let e = allocate(&c, &req("c", &[ip("fd00:9::2")])).unwrap_err();
    assert!(matches!(e, IpamError::RequestedTaken { .. }), "{e}");
    assert!(reserved(&c, NET, "c", "eth0").is_err());
    assert_eq!(files(tmp.path()).len(), 2 + 3);
}

#[test]
fn release_is_idempotent_and_per_attachment() {
    let tmp = tempfile::tempdir().unwrap();
    let c = v4_29(tmp.path());
    // Nothing ever allocated: no directory is created.
    release(&c, NET, "a", "eth0").unwrap();
    assert!(!tmp.path().join(NET).exists());
    alloc1(&c, "a");
    let eth1 = allocate(
        &c,
        &IpamRequest {
            ifname: "eth1",
            ..req("a", &[])
        },
    )
    .unwrap();
    release(&c, NET, "a", "eth0").unwrap();
    release(&c, NET, "a", "eth0").unwrap();
    assert_eq!(
        reserved(&c, NET, "a", "eth1").unwrap(),
        [eth1.ips[0].address.ip()]
    );
    let e = reserved(&c, NET, "a", "eth0").unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"no IP address reserved for container "a" interface "eth0" in network "testnet""#
    );
    assert_eq!(e.cni_code(), code::CHECK_FAILED);
}

#[test]
fn release_of_legacy_format() {
    let tmp = tempfile::tempdir().unwrap();
    let c = v4_29(tmp.path());
    alloc1(&c, "x");
    fs::write(tmp.path().join(NET).join("10.9.0.5"), "old-ctr\n").unwrap();
    assert_eq!(
        reserved(&c, NET, "old-ctr", "eth0").unwrap(),
        [ip("10.9.0.5")]
    );
    release(&c, NET, "old-ctr", "eth0").unwrap();
    assert_eq!(
        files(tmp.path()),
        ["10.9.0.2", "last_reserved_ip.0", "lock"]
    );
}

#[test]
fn gc_releases_everything_not_listed() {
    let tmp = tempfile::tempdir().unwrap();
    let c = conf(
        tmp.path(),
        json!({"ranges": [[{"subnet": "10.9.0.0/24"}], [{"subnet": "fd00:9::/64"}]]}),
    );
    assert_eq!(gc(&c, NET, &[]).unwrap(), Vec::<IpAddr>::new());
    for id in ["a", "b", "c"] {
        alloc(&c, id).unwrap();
    }
    fs::write(tmp.path().join(NET).join("10.9.0.100"), "legacy-kept").unwrap();
    fs::write(tmp.path().join(NET).join("10.9.0.101"), "legacy-gone").unwrap();
    let valid = [
        ("b".to_string(), "eth0".to_string()),
        ("legacy-kept".to_string(), "eth0".to_string()),
    ];
    let released = gc(&c, NET, &valid).unwrap();
    assert_eq!(
        released,
        [
            ip("10.9.0.2"),
            ip("10.9.0.4"),
            ip("10.9.0.101"),
            ip("fd00:9::2"),
            ip("fd00:9::4")
        ]
    );
    assert_eq!(
        files(tmp.path()),
        [
            "10.9.0.100",
            "10.9.0.3",
            "fd00:9::3",
            "last_reserved_ip.0",
            "last_reserved_ip.1",
            "lock"
        ]
    );
    // Same container, other interface: not valid (and legacy-kept is no longer listed).
    assert_eq!(
        gc(&c, NET, &[("b".into(), "eth1".into())]).unwrap(),
        [ip("10.9.0.3"), ip("10.9.0.100"), ip("fd00:9::3")]
    );
}

#[test]
fn holders_lists_each_current_format_attachment_once() {
    let tmp = tempfile::tempdir().unwrap();
    let c = conf(
        tmp.path(),
        json!({"ranges": [[{"subnet": "10.9.0.0/24"}], [{"subnet": "fd00:9::/64"}]]}),
    );
    assert!(holders(&c, NET).unwrap().is_empty(), "no directory yet");
    assert!(
        !tmp.path().join(NET).exists(),
        "holders created the directory"
    );
    for id in ["b", "a"] {
        alloc(&c, id).unwrap();
    }
    fs::write(tmp.path().join(NET).join("10.9.0.100"), "legacy").unwrap();
    assert_eq!(
        holders(&c, NET).unwrap(),
        [
            ("a".to_string(), "eth0".to_string()),
            ("b".to_string(), "eth0".to_string())
        ]
    );
}

#[test]
fn usage_counts_free_addresses_per_set() {
    let tmp = tempfile::tempdir().unwrap();
    // A /30 has .1 (the gateway) and .2; the v6 set is a 4-address range with its gateway
    // outside it.
    let c = conf(
        tmp.path(),
        json!({"ranges": [
            [{"subnet": "10.9.0.0/30"}],
            [{"subnet": "fd00:9::/64", "rangeStart": "fd00:9::10", "rangeEnd": "fd00:9::13"}]
        ]}),
    );
    let u = usage(&c, NET).unwrap();
    assert_eq!(u.len(), 2);
    assert_eq!(
        (u[0].set.as_str(), u[0].ranges.as_str()),
        ("ipam.ranges[0]", "10.9.0.0/30 range 10.9.0.1-10.9.0.2")
    );
    assert_eq!((u[0].capacity, u[0].leased, u[0].free()), (1, 0, 1));
    assert_eq!((u[1].capacity, u[1].leased, u[1].free()), (4, 0, 4));

    alloc(&c, "a").unwrap();
    let u = usage(&c, NET).unwrap();
    assert_eq!((u[0].leased, u[0].free()), (1, 0), "{u:?}");
    assert_eq!((u[1].leased, u[1].free()), (1, 3), "{u:?}");
    // What usage calls full, allocate calls exhausted.
    assert_eq!(alloc(&c, "b").unwrap_err().cni_code(), code::IPAM_EXHAUSTED);
    // Files outside the ranges (another config's leases) do not count.
    fs::write(tmp.path().join(NET).join("10.9.1.7"), "x\r\neth0").unwrap();
    assert_eq!(usage(&c, NET).unwrap()[1].leased, 1);
    release(&c, NET, "a", "eth0").unwrap();
    assert_eq!(usage(&c, NET).unwrap()[0].free(), 1);
}

#[test]
fn usage_of_huge_ranges_does_not_overflow() {
    let tmp = tempfile::tempdir().unwrap();
    let c = conf(
        tmp.path(),
        json!({"ranges": [[{"subnet": "::/0", "rangeStart": "::1", "rangeEnd": "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}]]}),
    );
    let u = usage(&c, NET).unwrap();
    assert!(u[0].free() > u128::MAX / 2, "{u:?}");
}

#[test]
fn stale_last_reserved_restarts_the_walk() {
    let tmp = tempfile::tempdir().unwrap();
    let c = v4_29(tmp.path());
    fs::create_dir_all(tmp.path().join(NET)).unwrap();
    fs::write(
        tmp.path().join(NET).join("last_reserved_ip.0"),
        "192.168.7.7",
    )
    .unwrap();
    assert_eq!(alloc1(&c, "a"), "10.9.0.2");
    fs::write(tmp.path().join(NET).join("last_reserved_ip.0"), "10.9.0.5").unwrap();
    assert_eq!(alloc1(&c, "b"), "10.9.0.6");
}

#[test]
fn concurrent_allocations_get_distinct_addresses() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Arc::new(conf(
        tmp.path(),
        json!({"ranges": [[{"subnet": "10.9.0.0/26"}]]}),
    ));
    let threads = 8;
    let per_thread = 7;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (c, barrier) = (Arc::clone(&c), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                // Each call opens and locks the store itself, like a separate process.
                (0..per_thread)
                    .map(|i| alloc(&c, &format!("t{t}-{i}")).unwrap()[0])
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let all: Vec<IpAddr> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let unique: HashSet<_> = all.iter().collect();
    assert_eq!(unique.len(), threads * per_thread, "duplicates in {all:?}");
    // 62 usable minus the gateway: 61 addresses, 56 taken.
    assert_eq!(files(tmp.path()).len(), threads * per_thread + 2);
}

/// Runs Debian's reference `host-local` against the same data directory as our allocator.
mod interop {
    use std::io::Write;
    use std::process::{Command, Stdio};

    use super::*;

    const REFERENCE: &str = "/usr/lib/cni/host-local";

    /// Never skipped: without the reference these tests prove nothing, so they fail.
    fn reference_available() -> bool {
        assert!(
            Path::new(REFERENCE).exists(),
            "{REFERENCE} is missing: run `cargo xtask setup` (installs containernetworking-plugins)"
        );
        true
    }

    /// The full network config the reference reads on stdin.
    fn net_conf(dir: &Path, ranges: Value) -> Value {
        json!({"cniVersion": "1.0.0", "name": NET, "type": "ebpf-cni",
               "ipam": {"type": "host-local", "dataDir": dir, "ranges": ranges}})
    }

    fn ours(net: &Value) -> HostLocalConfig {
        HostLocalConfig::parse(&net["ipam"], None).unwrap()
    }

    /// Runs the reference; `Ok(stdout JSON)` on success, `Err(error JSON)` on failure.
    fn reference(cmd: &str, net: &Value, id: &str, args: &str) -> Result<Value, Value> {
        let mut child = Command::new(REFERENCE)
            .env_clear()
            .env("CNI_COMMAND", cmd)
            .env("CNI_CONTAINERID", id)
            .env("CNI_NETNS", "/var/run/netns/interop-test")
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/usr/lib/cni")
            .env("CNI_ARGS", args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(net.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let json = if stdout.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&stdout).unwrap()
        };
        if out.status.success() {
            Ok(json)
        } else {
            Err(json)
        }
    }

    fn reference_ips(result: &Value) -> Vec<IpAddr> {
        result["ips"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                i["address"]
                    .as_str()
                    .unwrap()
                    .parse::<ipnetwork::IpNetwork>()
                    .unwrap()
                    .ip()
            })
            .collect()
    }

    #[test]
    fn alternating_allocations_share_round_robin_and_files() {
        if !reference_available() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let net = net_conf(
            tmp.path(),
            json!([[{"subnet": "10.9.0.0/28"}], [{"subnet": "fd00:9::/120"}]]),
        );
        let c = ours(&net);
        let mut seen = Vec::new();
        for i in 0..8 {
            let id = format!("ctr{i}");
            let ips = if i % 2 == 0 {
                reference_ips(&reference("ADD", &net, &id, "").unwrap())
            } else {
                alloc(&c, &id).unwrap()
            };
            seen.push(ips);
        }
        // One shared round robin: .2, .3, ... alternately from either side.
        for (i, ips) in seen.iter().enumerate() {
            assert_eq!(
                ips,
                &[
                    ip(&format!("10.9.0.{}", i + 2)),
                    ip(&format!("fd00:9::{}", i + 2))
                ],
                "allocation {i}"
            );
        }
        // Byte-identical files, whoever wrote them.
        let dir = tmp.path().join(NET);
        assert_eq!(fs::read(dir.join("10.9.0.2")).unwrap(), b"ctr0\r\neth0");
        assert_eq!(fs::read(dir.join("10.9.0.3")).unwrap(), b"ctr1\r\neth0");
        assert_eq!(fs::read(dir.join("fd00:9::2")).unwrap(), b"ctr0\r\neth0");
        assert_eq!(fs::read(dir.join("fd00:9::3")).unwrap(), b"ctr1\r\neth0");
        assert_eq!(
            fs::read(dir.join("last_reserved_ip.0")).unwrap(),
            b"10.9.0.9"
        );
        assert_eq!(
            fs::read(dir.join("last_reserved_ip.1")).unwrap(),
            b"fd00:9::9"
        );

        // Each side reads and releases the other's leases.
        assert_eq!(
            reserved(&c, NET, "ctr0", "eth0").unwrap(),
            [ip("10.9.0.2"), ip("fd00:9::2")]
        );
        reference("CHECK", &net, "ctr1", "").unwrap();
        assert!(reference("CHECK", &net, "nobody", "").is_err());
        release(&c, NET, "ctr0", "eth0").unwrap();
        reference("DEL", &net, "ctr1", "").unwrap();
        assert!(!dir.join("10.9.0.2").exists() && !dir.join("fd00:9::2").exists());
        assert!(!dir.join("10.9.0.3").exists() && !dir.join("fd00:9::3").exists());
        assert!(reference("CHECK", &net, "ctr0", "").is_err());
        assert!(reserved(&c, NET, "ctr1", "eth0").is_err());

        // Duplicate detection sees the other side's lease.
        assert!(matches!(
            alloc(&c, "ctr2"),
            Err(IpamError::DuplicateAllocation { .. })
        ));
        let e = reference("ADD", &net, "ctr3", "").unwrap_err();
        assert!(
            e["msg"].as_str().unwrap().contains("duplicate allocation"),
            "{e}"
        );

        // A requested address taken by the reference is refused by us, and vice versa.
        let e = allocate(&c, &req("new1", &[ip("10.9.0.4")])).unwrap_err();
        assert!(matches!(e, IpamError::RequestedTaken { .. }), "{e}");
        let r = allocate(&c, &req("new1", &[ip("10.9.0.2")])).unwrap();
        assert_eq!(r.ips[0].address.ip(), ip("10.9.0.2"));
        assert!(reference("ADD", &net, "new2", "IgnoreUnknown=1;IP=10.9.0.2").is_err());
    }

    /// Lease file names are the address text; Go and Rust must spell IPv6 alike (RFC 5952),
    /// or each side would miss the other's leases.
    #[test]
    fn ipv6_file_names_agree() {
        if !reference_available() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let net = net_conf(tmp.path(), json!([[{"subnet": "2001:db8::/32"}]]));
        let c = ours(&net);
        let tricky = [
            "2001:db8:0:0:1:0:0:1",
            "2001:db8:0:1:1:1:1:1",
            "2001:db8:1:0:0:0:0:0",
            "2001:0db8:00:0000:0a:0:0:0",
            "2001:db8:0:0:0:0:1.2.3.4",
            "2001:db8::ffff:0:1",
        ];
        for (i, a) in tricky.iter().enumerate() {
            let a = ip(a);
            let (mine, theirs) = (format!("ours{i}"), format!("ref{i}"));
            if i % 2 == 0 {
                allocate(&c, &req(&mine, &[a])).unwrap();
                let e = reference("ADD", &net, &theirs, &format!("IP={a}")).unwrap_err();
                assert!(
                    e["msg"].as_str().unwrap().contains("not available"),
                    "{a}: {e}"
                );
            } else {
                reference("ADD", &net, &theirs, &format!("IP={a}")).unwrap();
                let e = allocate(&c, &req(&mine, &[a])).unwrap_err();
                assert!(matches!(e, IpamError::RequestedTaken { .. }), "{a}: {e}");
            }
        }
    }

    #[test]
    fn both_sides_fill_and_exhaust_one_range() {
        if !reference_available() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let net = net_conf(
            tmp.path(),
            json!([[{"subnet": "10.9.0.0/28", "rangeStart": "10.9.0.4", "rangeEnd": "10.9.0.9"}]]),
        );
        let c = ours(&net);
        let mut got = HashSet::new();
        for i in 0..6 {
            let id = format!("c{i}");
            let ips = if i % 3 == 0 {
                reference_ips(&reference("ADD", &net, &id, "").unwrap())
            } else {
                alloc(&c, &id).unwrap()
            };
            assert!(got.insert(ips[0]), "duplicate {}", ips[0]);
        }
        assert_eq!(got.len(), 6);
        assert!(matches!(
            alloc(&c, "late"),
            Err(IpamError::Exhausted { .. })
        ));
        let e = reference("ADD", &net, "late2", "").unwrap_err();
        assert!(
            e["msg"]
                .as_str()
                .unwrap()
                .contains("no IP addresses available"),
            "{e}"
        );
        // GC by us drops the reference's leases too.
        let valid = [("c1".to_string(), "eth0".to_string())];
        assert_eq!(gc(&c, NET, &valid).unwrap().len(), 5);
        assert_eq!(
            files(tmp.path()),
            ["10.9.0.5", "last_reserved_ip.0", "lock"]
        );
    }

    #[test]
    fn concurrent_reference_processes_and_our_threads() {
        if !reference_available() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let net = Arc::new(net_conf(tmp.path(), json!([[{"subnet": "10.9.0.0/27"}]])));
        let c = Arc::new(ours(&net));
        let n = 10;
        let barrier = Arc::new(Barrier::new(2 * n));
        let mut handles = Vec::new();
        for i in 0..n {
            let (net, b) = (Arc::clone(&net), Arc::clone(&barrier));
            handles.push(std::thread::spawn(move || {
                b.wait();
                reference_ips(&reference("ADD", &net, &format!("ref{i}"), "").unwrap())[0]
            }));
            let (c, b) = (Arc::clone(&c), Arc::clone(&barrier));
            handles.push(std::thread::spawn(move || {
                b.wait();
                alloc(&c, &format!("ours{i}")).unwrap()[0]
            }));
        }
        let all: Vec<IpAddr> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let unique: HashSet<_> = all.iter().collect();
        assert_eq!(unique.len(), 2 * n, "duplicates in {all:?}");
        assert!(!unique.contains(&ip("10.9.0.1")), "gateway handed out");
    }
}
