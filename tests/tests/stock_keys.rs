//! Conflists copied from the reference chain and from distributions: every key of the
//! reference `ptp`, `bridge`, `portmap`, `bandwidth` and `host-local` plugins, for each of
//! its values, has the fate docs/configuration.md ("Keys of the reference plugins") gives
//! it; and the runtimes' stock default networks, their main, portmap and bandwidth entries
//! replaced by one ebpf-cni entry carrying those entries' keys (the other plugins left as
//! they ship), run pods with host ports and limits.

use std::path::Path;

use ebpf_cni_tests::config::Stack;
use ebpf_cni_tests::state::{assert_gone, assert_node_clean};
use ebpf_cni_tests::{
    require_root, unique_container_id, AddResult, Attachment, CniCommand, NetConfList, Node,
    PluginUnderTest,
};
use serde_json::{json, Value};

/// One row of the docs' table.
#[derive(Debug)]
struct Row {
    /// `hairpinMode`, `ipam.subnet`, `ipam.routes[].mtu`.
    key: String,
    values: String,
    fate: String,
}

fn documented_rows() -> Vec<Row> {
    let docs = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md"),
    )
    .unwrap();
    let section = docs
        .split("## Keys of the reference plugins")
        .nth(1)
        .expect("docs/configuration.md has the section");
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
            Row {
                key: cells[0].trim_matches('`').to_owned(),
                values: cells[2].to_owned(),
                fate: cells[3].to_owned(),
            }
        })
        .collect()
}

/// A value of the row's kind for its key.
fn sample(row: &Row) -> Value {
    let key = row.key.rsplit(['.', ']']).next().unwrap();
    match row.values.as_str() {
        "`true`" => json!(true),
        "`false`" => json!(false),
        "empty (`0`, `[]`)" => match key {
            "vlan" => json!(0),
            _ => json!([]),
        },
        "non-empty" => match key {
            "vlan" => json!(100),
            "vlanTrunk" => json!([{"id": 101}]),
            "conditionsV4" => json!(["-s", "192.0.2.1"]),
            "conditionsV6" => json!(["-s", "2001:db8::1"]),
            other => panic!("no non-empty sample for {other}"),
        },
        "any" => match key {
            "ipMasq" | "forceAddress" | "promiscMode" | "preserveDefaultVlan" | "enabledad" => {
                json!(true)
            }
            "ipMasqBackend" | "backend" => json!("nftables"),
            "mtu" => json!(1400),
            "bridge" => json!("cni0"),
            "markMasqBit" => json!(13),
            "externalSetMarkChain" => json!("KUBE-MARK-MASQ"),
            "ingressRate" | "ingressBurst" | "egressRate" | "egressBurst" => json!(20_000_000),
            other => panic!("no sample for {other}"),
        },
        other => panic!("values {other:?}"),
    }
}

/// The network config with the row's key set (and what the key needs beside it).
fn conf_with(base: &Value, row: &Row, node: &Node) -> Value {
    let mut c = base.clone();
    let v4 = "10.10.0.0/24";
    match row.key.as_str() {
        "ipam.type" | "ipam.ranges" | "ipam.routes" | "ipam.dataDir" => {}
        "ipam.subnet" => {
            c["ipam"] = json!({"type": "host-local", "subnet": v4,
                               "dataDir": base["ipam"]["dataDir"]});
        }
        "ipam.rangeStart" | "ipam.rangeEnd" | "ipam.gateway" => {
            let field = row.key.trim_start_matches("ipam.");
            let value = match field {
                "rangeStart" => "10.10.0.50",
                "rangeEnd" => "10.10.0.60",
                _ => "10.10.0.1",
            };
            c["ipam"] = json!({"type": "host-local", "subnet": v4, field: value,
                               "dataDir": base["ipam"]["dataDir"]});
        }
        "ipam.resolvConf" => {
            let file = node.scratch_dir().join("resolv.conf");
            std::fs::write(&file, "nameserver 10.0.0.53\n").unwrap();
            c["ipam"]["resolvConf"] = json!(file);
        }
        "ipam.routes[].dst" | "ipam.routes[].gw" => {
            c["ipam"]["routes"] =
                json!([{"dst": "0.0.0.0/0"}, {"dst": "10.50.0.0/16", "gw": "10.10.0.1"}]);
        }
        route if route.starts_with("ipam.routes[].") => {
            let field = route.trim_start_matches("ipam.routes[].");
            let value = match field {
                "mtu" => json!(1400),
                "advmss" => json!(1360),
                "priority" => json!(100),
                "table" => json!(100),
                _ => json!(0),
            };
            c["ipam"]["routes"] = json!([{"dst": "0.0.0.0/0", field: value}]);
        }
        top => {
            c[top] = sample(row);
            // Rates and bursts go in pairs.
            for (a, b) in [
                ("ingressRate", "ingressBurst"),
                ("egressRate", "egressBurst"),
            ] {
                if top == a || top == b {
                    c[a] = json!(20_000_000);
                    c[b] = json!(20_000_000);
                }
            }
        }
    }
    c
}

/// The warning line ADD logs for accepted keys.
fn warning(stderr: &str) -> Option<&str> {
    stderr
        .lines()
        .find(|l| l.contains("keys of the reference plugins accepted"))
}

/// Every row of the docs' table, on its own: honoured keys run without a word, accepted
/// ones run with one warning naming the key (on the network's first ADD, not its second),
/// refused ones fail with error 7 naming the key, its value and why, and their DEL succeeds.
#[test]
fn every_reference_key_has_its_documented_fate() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let base = p.conf("1.0.0", &node, Stack::Dual);
    let rows = documented_rows();
    assert!(rows.len() > 40, "the docs' table has {} rows", rows.len());
    let mut failures = Vec::new();
    for row in &rows {
        let conf = conf_with(&base, row, &node);
        let field = row.key.replace("[]", "[0]");
        let pods = [node.new_pod().unwrap(), node.new_pod().unwrap()];
        let envs: Vec<_> = pods
            .iter()
            .map(|pod| p.env(&unique_container_id(), pod.path(), "eth0"))
            .collect();
        let first = p.run(&node, CniCommand::Add, &envs[0], conf.to_string());
        let fate = row.fate.as_str();
        let mut added = vec![first.success()];
        if fate == "honoured" {
            if !first.success() || warning(&first.stderr).is_some_and(|w| w.contains(&field)) {
                failures.push(format!(
                    "{} ({}): honoured, but\n{}",
                    row.key,
                    row.values,
                    first.describe()
                ));
            }
        } else if fate.starts_with("accepted") {
            let second = p.run(&node, CniCommand::Add, &envs[1], conf.to_string());
            added.push(second.success());
            let warned = warning(&first.stderr).is_some_and(|w| w.contains(&field));
            if !first.success() || !warned || !second.success() || warning(&second.stderr).is_some()
            {
                failures.push(format!(
                    "{} ({}): accepted with one warning, but\n{}\n{}",
                    row.key,
                    row.values,
                    first.describe(),
                    second.describe()
                ));
            }
        } else {
            assert!(fate.starts_with("refused (7)"), "{fate}");
            let e = first.error();
            if first.success()
                || !e.as_ref().is_some_and(|e| {
                    e.code == 7 && e.msg.contains(&field) && e.msg.contains("refused")
                })
            {
                failures.push(format!(
                    "{} ({}): refused, but\n{}",
                    row.key,
                    row.values,
                    first.describe()
                ));
            }
        }
        for (env, _) in envs.iter().zip(&added) {
            let del = p.run(&node, CniCommand::Del, env, conf.to_string());
            if !del.success() {
                failures.push(format!("{}: DEL failed\n{}", row.key, del.describe()));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert_node_clean(&node, "after every row's DELs");
}

/// A stock conflist as it ships, its main, portmap and bandwidth entries replaced by one
/// ebpf-cni entry with their keys, run through the runtime with a host port and limits:
/// ADD, CHECK and DEL succeed and DEL leaves nothing.
fn stock_network_runs(list: Value) -> Value {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let mut list = list;
    list["plugins"][0]["ipam"]["dataDir"] = json!(node.data_dir());
    let list = NetConfList::from_value(&list).unwrap();
    let pod = node.new_pod().unwrap();
    let att = Attachment::new(&unique_container_id(), pod.path(), "eth0")
        .with_capability(
            "portMappings",
            json!([{"hostPort": 8086, "containerPort": 80, "protocol": "tcp"}]),
        )
        .with_capability(
            "bandwidth",
            json!({"ingressRate": 50_000_000, "ingressBurst": 1_000_000,
                   "egressRate": 50_000_000, "egressBurst": 1_000_000}),
        );
    let res = p
        .runtime
        .add(&node, &list, &att)
        .unwrap_or_else(|e| panic!("ADD of {}: {e}", list.name));
    let r = AddResult::parse(&res).expect("a result with the pod's interface");
    p.runtime
        .check(&node, &list, &att, &res)
        .unwrap_or_else(|e| panic!("CHECK of {}: {e}", list.name));
    p.runtime
        .del(&node, &list, &att, Some(&res))
        .unwrap_or_else(|e| panic!("DEL of {}: {e}", list.name));
    assert_gone(
        &node,
        Some(&pod),
        "eth0",
        &r,
        &list.name,
        &att.container_id,
        "DEL",
    );
    assert_node_clean(&node, "after DEL");
    res
}

/// podman's `87-podman-bridge.conflist` (Debian's podman 4.3): bridge, portmap,
/// firewall, tuning.
#[test]
fn podmans_default_network_runs() {
    let _ = stock_network_runs(json!({
        "cniVersion": "0.4.0",
        "name": "podman",
        "plugins": [
            {
                "type": "ebpf-cni",
                "bridge": "cni-podman0",
                "isGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "capabilities": {"portMappings": true, "bandwidth": true},
                "ipam": {
                    "type": "host-local",
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "ranges": [[{"subnet": "10.88.0.0/16", "gateway": "10.88.0.1"}]]
                }
            },
            {"type": "firewall"},
            {"type": "tuning"}
        ]
    }));
}

/// containerd's `10-containerd-net.conflist` (its getting-started docs): bridge, portmap.
#[test]
fn containerds_default_network_runs() {
    let _ = stock_network_runs(json!({
        "cniVersion": "1.0.0",
        "name": "containerd-net",
        "plugins": [
            {
                "type": "ebpf-cni",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": true,
                "promiscMode": true,
                "capabilities": {"portMappings": true, "bandwidth": true},
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": "10.88.0.0/16"}], [{"subnet": "2001:4860:4860::/64"}]],
                    "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]
                }
            }
        ]
    }));
}

/// k3s's `10-flannel.conflist`: flannel delegating to bridge (`hairpinMode`,
/// `forceAddress`, `isDefaultGateway`; the subnet flannel would give it), portmap,
/// bandwidth. `isDefaultGateway` gives the pod its default route without IPAM routes.
#[test]
fn k3s_default_network_runs() {
    let res = stock_network_runs(json!({
        "cniVersion": "1.0.0",
        "name": "cbr0",
        "plugins": [
            {
                "type": "ebpf-cni",
                "hairpinMode": true,
                "forceAddress": true,
                "isDefaultGateway": true,
                "capabilities": {"portMappings": true, "bandwidth": true},
                "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.42.0.0/24"}]]}
            }
        ]
    }));
    assert!(
        res["routes"]
            .as_array()
            .is_some_and(|rs| rs.iter().any(|r| r["dst"] == "0.0.0.0/0")),
        "isDefaultGateway gave no default route: {res}"
    );
}

/// host-local's routes with CNI 1.1's fields: `mtu` and `advmss` become the route's
/// metrics, `priority` its metric, `table` the table it goes in, `scope` its scope; the
/// result carries them, CHECK looks for a route in its table, and finds it missing once it
/// is deleted there.
#[test]
fn route_fields_of_cni_1_1_reach_the_pods_routes() {
    require_root();
    let p = PluginUnderTest::ebpf_cni();
    let node = Node::new().unwrap();
    let mut conf = p.conf("1.1.0", &node, Stack::V4);
    conf["ipam"]["routes"] = json!([
        {"dst": "0.0.0.0/0"},
        {"dst": "10.60.0.0/16", "mtu": 1400, "advmss": 1360, "priority": 50},
        {"dst": "10.61.0.0/16", "table": 100, "scope": 0}
    ]);
    let pod = node.new_pod().unwrap();
    let env = p.env(&unique_container_id(), pod.path(), "eth0");
    let res = p
        .run(&node, CniCommand::Add, &env, conf.to_string())
        .expect_success("ADD");
    let routes = res["routes"].as_array().unwrap();
    assert!(
        routes.iter().any(|r| r["dst"] == "10.60.0.0/16"
            && r["mtu"] == 1400
            && r["advmss"] == 1360
            && r["priority"] == 50),
        "the result lacks the route's fields: {res}"
    );
    assert!(routes
        .iter()
        .any(|r| r["dst"] == "10.61.0.0/16" && r["table"] == 100));
    let main = pod.ip_ok(&["route", "show", "10.60.0.0/16"]).unwrap();
    for want in ["metric 50", "mtu 1400", "advmss 1360"] {
        assert!(main.contains(want), "{want} not in {main:?}");
    }
    let table = pod.ip_ok(&["route", "show", "table", "100"]).unwrap();
    assert!(table.contains("10.61.0.0/16"), "table 100: {table:?}");
    let mut checked = conf.clone();
    checked["prevResult"] = res.clone();
    p.run(&node, CniCommand::Check, &env, checked.to_string())
        .expect_success("CHECK");
    pod.ip_ok(&["route", "del", "10.61.0.0/16", "table", "100"])
        .unwrap();
    let out = p.run(&node, CniCommand::Check, &env, checked.to_string());
    let err = out.expect_error(105, "CHECK without the table's route");
    assert!(err.msg.contains("10.61.0.0/16"), "{}", out.describe());
    p.run(&node, CniCommand::Del, &env, conf.to_string())
        .expect_success("DEL");
    assert_node_clean(&node, "after DEL");
}
