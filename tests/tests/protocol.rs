//! ebpf-cni's execution protocol (spec section 2) and result types (section 5): VERSION,
//! and the error table — each bad input gets its exact code, an error object on stdout,
//! a non-zero exit, and leaves the node exactly as it was.

use std::collections::BTreeSet;

use ebpf_cni_tests::config::{self, Stack, NETWORK};
use ebpf_cni_tests::{
    require_root, unique_container_id, CniCommand, ContainerEnv, Netns, Node, PluginUnderTest,
    ResultExpectation, CNI_VERSIONS,
};
use serde_json::{json, Value};

/// Section 2 "VERSION" and section 5 "Version": echoes the input cniVersion and lists
/// exactly the versions this plugin supports.
#[test]
fn version_lists_supported_versions() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let before = node.snapshot(None);
    let expected: BTreeSet<&str> = CNI_VERSIONS.into_iter().collect();
    for input in CNI_VERSIONS {
        let out = p.run(
            &node,
            CniCommand::Version,
            &ContainerEnv::none(),
            json!({"cniVersion": input}).to_string(),
        );
        let v = out.expect_success(&format!("VERSION {input}"));
        assert_eq!(
            v["cniVersion"],
            input,
            "VERSION echoes the input version\n{}",
            out.describe()
        );
        let listed: Vec<&str> = v["supportedVersions"]
            .as_array()
            .unwrap_or_else(|| panic!("no supportedVersions\n{}", out.describe()))
            .iter()
            .map(|s| s.as_str().expect("version strings"))
            .collect();
        let set: BTreeSet<&str> = listed.iter().copied().collect();
        assert_eq!(set, expected, "supportedVersions");
        assert_eq!(listed.len(), set.len(), "duplicates in {listed:?}");
    }
    assert_eq!(node.snapshot(None), before, "VERSION changed the node");
}

/// How one error case differs from a valid 1.0.0 ADD.
struct Case {
    what: &'static str,
    stdin: Option<String>,
    conf: fn(Value) -> Value,
    env: fn(ContainerEnv) -> ContainerEnv,
    code: u64,
    /// The message (msg + details) must name this, e.g. the invalid variable (section 5,
    /// code 4: "The error message must contain the names of invalid variables").
    names: Option<&'static str>,
    /// Run in a pod that already has `eth0`.
    pod_has_eth0: bool,
}

impl Case {
    fn new(what: &'static str, code: u64) -> Self {
        Self {
            what,
            stdin: None,
            conf: |c| c,
            env: |e| e,
            code,
            names: None,
            pod_has_eth0: false,
        }
    }
}

fn set_subnet(mut c: Value, subnet: &str) -> Value {
    c["ipam"]["ranges"] = json!([[{ "subnet": subnet }]]);
    c["ipam"]["routes"] = json!([{ "dst": "0.0.0.0/0" }]);
    c
}

fn error_cases() -> Vec<Case> {
    vec![
        Case {
            stdin: Some(r#"{"cniVersion": "1.0.0", "name": "testnet", "type": "#.to_owned()),
            ..Case::new("malformed JSON (code 6: failed to decode)", 6)
        },
        Case {
            conf: |mut c| {
                c["cniVersion"] = json!("0.2.0");
                c
            },
            ..Case::new("cniVersion 0.2.0 (code 1)", 1)
        },
        Case {
            conf: |mut c| {
                c["cniVersion"] = json!("9.9.9");
                c
            },
            ..Case::new("cniVersion 9.9.9 (code 1)", 1)
        },
        Case {
            env: |mut e| {
                e.container_id = None;
                e
            },
            names: Some("CNI_CONTAINERID"),
            ..Case::new("CNI_CONTAINERID missing", 4)
        },
        Case {
            env: |mut e| {
                e.ifname = None;
                e
            },
            names: Some("CNI_IFNAME"),
            ..Case::new("CNI_IFNAME missing", 4)
        },
        Case {
            env: |mut e| {
                e.netns = None;
                e
            },
            names: Some("CNI_NETNS"),
            ..Case::new("CNI_NETNS missing for ADD", 4)
        },
        Case {
            env: |mut e| {
                e.ifname = Some("eth0123456789abc".into());
                e
            },
            names: Some("CNI_IFNAME"),
            ..Case::new("CNI_IFNAME longer than 15 (IFNAMSIZ-1)", 4)
        },
        Case {
            env: |mut e| {
                e.ifname = Some("et/h0".into());
                e
            },
            names: Some("CNI_IFNAME"),
            ..Case::new("CNI_IFNAME with '/'", 4)
        },
        Case {
            env: |mut e| {
                e.container_id = Some("-abc".into());
                e
            },
            names: Some("CNI_CONTAINERID"),
            ..Case::new("CNI_CONTAINERID not starting alphanumeric (section 2)", 4)
        },
        Case {
            env: |mut e| {
                e.container_id = Some("a/b".into());
                e
            },
            names: Some("CNI_CONTAINERID"),
            ..Case::new("CNI_CONTAINERID with '/' (section 2 charset)", 4)
        },
        Case {
            env: |e| e.with_args("foo"),
            names: Some("CNI_ARGS"),
            ..Case::new("CNI_ARGS not KEY=VALUE", 4)
        },
        Case {
            env: |e| e.with_args("FOO=bar"),
            names: Some("CNI_ARGS"),
            ..Case::new("unknown CNI_ARGS key without IgnoreUnknown", 4)
        },
        Case {
            conf: |c| set_subnet(c, "10.10.0.0/33"),
            ..Case::new("subnet prefix /33", 7)
        },
        Case {
            conf: |c| set_subnet(c, "not-a-cidr"),
            ..Case::new("subnet not a CIDR", 7)
        },
        Case {
            conf: |c| set_subnet(c, "10.10.0.0/31"),
            ..Case::new("/31 subnet: nothing to allocate", 7)
        },
        Case {
            conf: |mut c| {
                c["name"] = json!("../evil");
                c
            },
            ..Case::new("network name with path traversal", 7)
        },
        Case {
            conf: |c| set_subnet(c, config::V4_SUBNET),
            env: |e| e.with_args("IP=10.99.0.5"),
            ..Case::new("requested IP outside the range", 103)
        },
        Case {
            pod_has_eth0: true,
            ..Case::new("CNI_IFNAME already exists in the container", 107)
        },
    ]
}

/// Section 5 error codes for bad input: exact code, error JSON with the input's
/// cniVersion, named variables for code 4, and no link, route, lease or pin left over.
#[test]
fn errors_have_exact_codes_and_change_nothing() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let pod = node.new_pod().unwrap();
    let busy_pod = node.new_pod().unwrap();
    busy_pod
        .ip_ok(&[
            "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p",
        ])
        .unwrap();

    let mut failures = Vec::new();
    for case in error_cases() {
        let target: &Netns = if case.pod_has_eth0 { &busy_pod } else { &pod };
        let conf = (case.conf)(p.conf("1.0.0", &node, Stack::Dual));
        let stdin = case.stdin.clone().unwrap_or_else(|| conf.to_string());
        let env = (case.env)(p.env(&unique_container_id(), target.path(), "eth0"));
        let before = node.snapshot(Some(target)).without_lock();
        let out = p.run(&node, CniCommand::Add, &env, &stdin);
        let after = node.snapshot(Some(target)).without_lock();
        let r = std::panic::catch_unwind(|| {
            let err = out.expect_error(case.code, case.what);
            // Section 5: "cniVersion: the same value as provided by the configuration",
            // an unsupported one included. Malformed input has no version to echo.
            if case.stdin.is_none() {
                assert_eq!(
                    err.cni_version.as_deref(),
                    conf["cniVersion"].as_str(),
                    "{}: error cniVersion must be the configuration's (section 5)",
                    case.what
                );
            }
            if let Some(name) = case.names {
                assert!(
                    format!("{} {}", err.msg, err.details.clone().unwrap_or_default())
                        .contains(name),
                    "{}: message does not name {name}: {err:?}",
                    case.what
                );
            }
            assert_eq!(
                after, before,
                "{}: the failed ADD changed the node",
                case.what
            );
        });
        if let Err(e) = r {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(msg);
        }
    }
    assert!(
        !node.scratch_dir().join("evil").exists(),
        "a '../evil' network name escaped the dataDir"
    );
    assert!(
        ebpf_cni_tests::kernel::link(&busy_pod, "eth0")
            .unwrap()
            .is_some(),
        "107 must not remove the existing eth0"
    );
    assert!(
        failures.is_empty(),
        "{} error case(s) failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// A /30 has one usable address besides the gateway: the second ADD fails with 102 and
/// changes nothing; after DEL of the first the address is free again.
#[test]
fn exhausted_range_is_code_102() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let (pod1, pod2) = (node.new_pod().unwrap(), node.new_pod().unwrap());
    let conf = config::with_v4_subnet(p.conf("1.0.0", &node, Stack::V4), "10.10.0.0/30");
    let env1 = p.env(&unique_container_id(), pod1.path(), "eth0");
    let res = p
        .run(&node, CniCommand::Add, &env1, conf.to_string())
        .expect_success("first ADD in a /30");
    assert_eq!(res["ips"][0]["address"], "10.10.0.2/30");

    let env2 = p.env(&unique_container_id(), pod2.path(), "eth0");
    let before = node.snapshot(Some(&pod2));
    p.run(&node, CniCommand::Add, &env2, conf.to_string())
        .expect_error(102, "second ADD in a /30");
    assert_eq!(
        node.snapshot(Some(&pod2)),
        before,
        "the failed ADD changed the node"
    );

    p.run(&node, CniCommand::Del, &env1, conf.to_string())
        .expect_success("DEL");
    let res = p
        .run(&node, CniCommand::Add, &env2, conf.to_string())
        .expect_success("ADD after DEL");
    assert_eq!(res["ips"][0]["address"], "10.10.0.2/30");
    p.run(&node, CniCommand::Del, &env2, conf.to_string())
        .expect_success("DEL");
    assert!(node.leases(NETWORK).is_empty());
}

/// CNI_ARGS (section 2): `IgnoreUnknown=1` lets unknown keys through, and `IP=` picks the
/// address (the positive counterpart of the 103 case).
#[test]
fn cni_args_ignore_unknown_and_ip() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let pod = node.new_pod().unwrap();
    let conf = p.conf("1.0.0", &node, Stack::V4);

    let env = p
        .env(&unique_container_id(), pod.path(), "eth0")
        .with_args("IgnoreUnknown=1;FOO=bar");
    let res = p
        .run(&node, CniCommand::Add, &env, conf.to_string())
        .expect_success("ADD with IgnoreUnknown=1");
    ResultExpectation::standard("1.0.0", "eth0", &pod.path().to_string_lossy(), Stack::V4)
        .ebpf_cni_host_names()
        .assert_valid(&res);
    p.run(&node, CniCommand::Del, &env, conf.to_string())
        .expect_success("DEL");
    assert!(node.leases(NETWORK).is_empty());

    let env = p
        .env(&unique_container_id(), pod.path(), "eth0")
        .with_args("IP=10.10.0.50");
    let res = p
        .run(&node, CniCommand::Add, &env, conf.to_string())
        .expect_success("ADD with IP=");
    assert_eq!(res["ips"][0]["address"], "10.10.0.50/24");
    let lease_ips: Vec<String> = node
        .leases(NETWORK)
        .iter()
        .map(|l| l.ip.to_string())
        .collect();
    assert_eq!(lease_ips, ["10.10.0.50"]);
    p.run(&node, CniCommand::Del, &env, conf.to_string())
        .expect_success("DEL");
    assert!(node.leases(NETWORK).is_empty());
}
