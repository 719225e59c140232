//! The keys of the reference plugins ebpf-cni stands in for (`ptp`, `bridge`, `portmap`,
//! `bandwidth`, `host-local`, containernetworking/plugins), as conflists copied from the
//! reference chain and from distributions carry them. Each key, for each of its values,
//! has exactly one fate ([`STOCK_KEYS`]):
//!
//! - honoured: it means what it means there;
//! - accepted: it describes what ebpf-cni always does, or names a part that ebpf-cni does
//!   without (a bridge, an iptables backend); ADD says so once per network (a warning);
//! - refused: it asks for what ebpf-cni does not do; ADD, CHECK and `install` fail with
//!   code 7 naming the key, the value and why. DEL does not ask.
//!
//! docs/configuration.md's table of stock keys is this table (a unit test holds it).

use serde_json::Value;

/// What becomes of one key with one kind of value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    Honoured,
    /// Accepted, and why (the warning's text).
    Accepted(&'static str),
    /// Refused, and why (the error's text).
    Refused(&'static str),
}

/// Which values a row is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Values {
    Any,
    True,
    /// `false` (or absent, which is no row's concern).
    False,
    /// A value that asks for nothing: `0`, `""`, `[]`, `false`.
    Empty,
    /// A value that asks for something: anything but [`Values::Empty`]'s.
    NotEmpty,
}

impl Values {
    fn matches(self, v: &Value) -> bool {
        let empty = match v {
            Value::Bool(b) => !b,
            Value::Number(n) => n.as_f64() == Some(0.0),
            Value::String(s) => s.is_empty(),
            Value::Array(a) => a.is_empty(),
            Value::Object(o) => o.is_empty(),
            Value::Null => true,
        };
        match self {
            Self::Any => true,
            Self::True => v == &Value::Bool(true),
            Self::False => v == &Value::Bool(false),
            Self::Empty => empty,
            Self::NotEmpty => !empty,
        }
    }

    /// How the docs' table names the values (its test renders the table).
    #[cfg(test)]
    fn describe(self) -> &'static str {
        match self {
            Self::Any => "any",
            Self::True => "`true`",
            Self::False => "`false`",
            Self::Empty => "empty (`0`, `[]`)",
            Self::NotEmpty => "non-empty",
        }
    }
}

/// Where a key lives in the plugin's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// The plugin's object itself.
    Top,
    /// The `ipam` object (host-local).
    Ipam,
    /// Each entry of `ipam.routes` (host-local, CNI 1.1's route fields).
    Route,
}

impl Place {
    /// The key's path before its name, as the docs' table writes it (its test renders the
    /// table).
    #[cfg(test)]
    fn prefix(self) -> &'static str {
        match self {
            Self::Top => "",
            Self::Ipam => "ipam.",
            Self::Route => "ipam.routes[].",
        }
    }
}

/// One key of the reference plugins with one kind of value, and its fate.
#[derive(Clone, Copy, Debug)]
pub struct StockKey {
    pub key: &'static str,
    pub place: Place,
    /// The reference plugins that have it.
    pub plugins: &'static str,
    pub values: Values,
    pub fate: Fate,
}

const fn row(key: &'static str, plugins: &'static str, values: Values, fate: Fate) -> StockKey {
    StockKey {
        key,
        place: Place::Top,
        plugins,
        values,
        fate,
    }
}

const fn at(place: Place, key: &'static str, plugins: &'static str, fate: Fate) -> StockKey {
    StockKey {
        key,
        place,
        plugins,
        values: Values::Any,
        fate,
    }
}

use Fate::{Accepted, Honoured, Refused};
use Values::{Any, Empty, False, NotEmpty, True};

const ROUTED: &str = "pods are routed over their own veth pairs, without a bridge or VLANs";
const PROGRAMS_NAT: &str =
    "host ports are translated in ebpf-cni's programs, with no iptables or nftables rule or mark";

/// Every key of the reference plugins' configurations (current upstream), by value.
/// The keys every plugin shares (`cniVersion`, `name`, `type`, `capabilities`, `ipam`,
/// `dns`, `runtimeConfig`, `prevResult`, `args`) are the spec's, and honoured.
pub const STOCK_KEYS: &[StockKey] = &[
    row("ipMasq", "ptp, bridge", Any, Honoured),
    row(
        "ipMasqBackend",
        "ptp, bridge",
        Any,
        Accepted("ebpf-cni masquerades in its programs, with no iptables or nftables rule"),
    ),
    row("mtu", "ptp, bridge", Any, Honoured),
    row(
        "bridge",
        "bridge",
        Any,
        Accepted("no bridge is created or joined: pods are routed over their own veth pairs"),
    ),
    row("isGateway", "bridge", True, Honoured),
    row(
        "isGateway",
        "bridge",
        False,
        Refused("pods always route through their gateway on the node; an L2-only network is not offered"),
    ),
    row("isDefaultGateway", "bridge", True, Honoured),
    row("isDefaultGateway", "bridge", False, Honoured),
    row(
        "forceAddress",
        "bridge",
        Any,
        Accepted("there is no bridge whose address could be replaced"),
    ),
    row(
        "hairpinMode",
        "bridge",
        True,
        Accepted("a pod always reaches itself through its host ports and Services"),
    ),
    row(
        "hairpinMode",
        "bridge",
        False,
        Refused("a pod always reaches itself through its host ports and Services; that cannot be turned off"),
    ),
    row(
        "promiscMode",
        "bridge",
        Any,
        Accepted("there is no bridge to make promiscuous, and hairpin traffic needs none"),
    ),
    row("vlan", "bridge", Empty, Accepted(ROUTED)),
    row("vlan", "bridge", NotEmpty, Refused(ROUTED)),
    row("vlanTrunk", "bridge", Empty, Accepted(ROUTED)),
    row("vlanTrunk", "bridge", NotEmpty, Refused(ROUTED)),
    row("preserveDefaultVlan", "bridge", Any, Accepted(ROUTED)),
    row(
        "macspoofchk",
        "bridge",
        True,
        Accepted("the source check (on unless `sourceCheck` is false) drops what a pod sends from another MAC or address"),
    ),
    row(
        "macspoofchk",
        "bridge",
        False,
        Refused("the source check follows `sourceCheck`: set `sourceCheck: false` to let a pod send from other MACs and addresses"),
    ),
    row(
        "enabledad",
        "bridge",
        Any,
        Accepted("a pod's IPv6 addresses are leases unique on the node and skip duplicate address detection"),
    ),
    row("disableContainerInterface", "bridge", False, Accepted("the pod's interface is brought up")),
    row(
        "disableContainerInterface",
        "bridge",
        True,
        Refused("the pod's interface is always brought up"),
    ),
    row("portIsolation", "bridge", False, Accepted(ROUTED)),
    row(
        "portIsolation",
        "bridge",
        True,
        Refused("pods on a node are routed to each other; there are no bridge ports to isolate"),
    ),
    row(
        "snat",
        "portmap",
        True,
        Accepted("a pod reaching its own host port and the node's own clients on loopback are always answered, as snat asks"),
    ),
    row(
        "snat",
        "portmap",
        False,
        Refused("hairpin and loopback host port traffic is always translated; that cannot be turned off"),
    ),
    row("masqAll", "portmap", False, Accepted("host port clients keep their addresses")),
    row(
        "masqAll",
        "portmap",
        True,
        Refused("host port clients always keep their addresses"),
    ),
    row("markMasqBit", "portmap", Any, Accepted(PROGRAMS_NAT)),
    row("externalSetMarkChain", "portmap", Any, Accepted(PROGRAMS_NAT)),
    row("conditionsV4", "portmap", Empty, Accepted(PROGRAMS_NAT)),
    row(
        "conditionsV4",
        "portmap",
        NotEmpty,
        Refused("host ports take no iptables match conditions"),
    ),
    row("conditionsV6", "portmap", Empty, Accepted(PROGRAMS_NAT)),
    row(
        "conditionsV6",
        "portmap",
        NotEmpty,
        Refused("host ports take no iptables match conditions"),
    ),
    row("backend", "portmap", Any, Accepted(PROGRAMS_NAT)),
    row("ingressRate", "bandwidth", Any, Honoured),
    row("ingressBurst", "bandwidth", Any, Honoured),
    row("egressRate", "bandwidth", Any, Honoured),
    row("egressBurst", "bandwidth", Any, Honoured),
    at(Place::Ipam, "type", "host-local", Honoured),
    at(Place::Ipam, "ranges", "host-local", Honoured),
    at(Place::Ipam, "subnet", "host-local", Honoured),
    at(Place::Ipam, "rangeStart", "host-local", Honoured),
    at(Place::Ipam, "rangeEnd", "host-local", Honoured),
    at(Place::Ipam, "gateway", "host-local", Honoured),
    at(Place::Ipam, "routes", "host-local", Honoured),
    at(Place::Ipam, "dataDir", "host-local", Honoured),
    at(Place::Ipam, "resolvConf", "host-local", Honoured),
    at(Place::Route, "dst", "host-local", Honoured),
    at(Place::Route, "gw", "host-local", Honoured),
    at(Place::Route, "mtu", "host-local", Honoured),
    at(Place::Route, "advmss", "host-local", Honoured),
    at(Place::Route, "priority", "host-local", Honoured),
    at(Place::Route, "table", "host-local", Honoured),
    at(Place::Route, "scope", "host-local", Honoured),
];

/// A stock key a configuration sets, with the row that decides its fate.
#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    /// As the configuration spells its place: `hairpinMode`, `ipam.routes[0].mtu`.
    pub field: String,
    pub value: Value,
    pub row: StockKey,
}

impl PartialEq for StockKey {
    fn eq(&self, other: &Self) -> bool {
        (self.key, self.place, self.values) == (other.key, other.place, other.values)
    }
}

/// The fate of a stock key set to a value of another type than any of its rows take
/// (`"hairpinMode": "yes"`).
const WRONG_TYPE: Fate = Refused("the reference plugin takes another type of value here");

/// The stock keys `conf` (a plugin's configuration object) sets, in the table's order, each
/// with the row that decides its fate. `null` values are unset. The keys inside `ipam` are
/// host-local's only when it is the IPAM plugin.
pub fn review(conf: &serde_json::Map<String, Value>) -> Vec<Found> {
    let ipam = conf.get("ipam").and_then(Value::as_object);
    let host_local = ipam
        .and_then(|i| i.get("type"))
        .is_some_and(|t| t == "host-local");
    let routes: Vec<&serde_json::Map<String, Value>> = ipam
        .filter(|_| host_local)
        .and_then(|i| i.get("routes"))
        .and_then(Value::as_array)
        .map(|rs| rs.iter().filter_map(Value::as_object).collect())
        .unwrap_or_default();
    let mut out = Vec::new();
    let mut seen: Vec<(&str, Place)> = Vec::new();
    for first in STOCK_KEYS {
        if seen.contains(&(first.key, first.place)) {
            continue;
        }
        seen.push((first.key, first.place));
        let rows: Vec<&StockKey> = STOCK_KEYS
            .iter()
            .filter(|r| (r.key, r.place) == (first.key, first.place))
            .collect();
        let mut look = |obj: &serde_json::Map<String, Value>, field: String| {
            let Some(v) = obj.get(first.key).filter(|v| !v.is_null()) else {
                return;
            };
            let row = rows.iter().find(|r| r.values.matches(v)).map_or(
                StockKey {
                    fate: WRONG_TYPE,
                    ..*first
                },
                |r| **r,
            );
            out.push(Found {
                field,
                value: v.clone(),
                row,
            });
        };
        match first.place {
            Place::Top => look(conf, first.key.to_owned()),
            Place::Ipam => {
                if let (Some(i), true) = (ipam, host_local) {
                    look(i, format!("ipam.{}", first.key));
                }
            }
            Place::Route => {
                for (n, r) in routes.iter().enumerate() {
                    look(r, format!("ipam.routes[{n}].{}", first.key));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// docs/configuration.md's table, one row per key and values.
    fn docs_table() -> String {
        let mut out =
            String::from("| key | reference plugins | value | fate |\n|---|---|---|---|\n");
        for r in STOCK_KEYS {
            let fate = match r.fate {
                Honoured => "honoured".to_owned(),
                Accepted(why) => format!("accepted, with a warning: {why}"),
                Refused(why) => format!("refused (7): {why}"),
            };
            out.push_str(&format!(
                "| `{}{}` | {} | {} | {fate} |\n",
                r.place.prefix(),
                r.key,
                r.plugins,
                r.values.describe()
            ));
        }
        out
    }

    #[test]
    fn the_docs_list_every_stock_key_and_its_fate() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md");
        let docs = std::fs::read_to_string(path).unwrap();
        let table = docs_table();
        assert!(
            docs.contains(&table),
            "docs/configuration.md lacks the stock keys' table as the code has it:\n{table}"
        );
    }

    /// Each key has one fate per value: its rows' values never overlap, and a key with
    /// several rows covers every value.
    #[test]
    fn each_value_of_a_key_has_one_fate() {
        let samples = [
            json!(true),
            json!(false),
            json!(0),
            json!(7),
            json!(""),
            json!("x"),
            json!([]),
            json!([1]),
        ];
        for r in STOCK_KEYS {
            let rows: Vec<&StockKey> = STOCK_KEYS
                .iter()
                .filter(|o| (o.key, o.place) == (r.key, r.place))
                .collect();
            for v in &samples {
                let n = rows.iter().filter(|o| o.values.matches(v)).count();
                assert!(n <= 1, "{} {v}: {n} fates", r.key);
                if rows.len() > 1 && !matches!(rows[0].values, True | False) {
                    assert_eq!(n, 1, "{} {v}: no fate", r.key);
                }
            }
        }
    }

    #[test]
    fn the_review_finds_keys_where_they_live() {
        let conf = json!({
            "bridge": "cni0", "isGateway": true, "hairpinMode": false, "vlan": 0, "snat": null,
            "ipam": {"type": "host-local", "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0", "mtu": 1400}]}
        });
        let found = review(conf.as_object().unwrap());
        let fields: Vec<&str> = found.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "bridge",
                "isGateway",
                "hairpinMode",
                "vlan",
                "ipam.type",
                "ipam.routes",
                "ipam.routes[0].dst",
                "ipam.routes[1].dst",
                "ipam.routes[1].mtu"
            ]
        );
        assert!(matches!(found[2].row.fate, Refused(_)));
        assert!(matches!(found[3].row.fate, Accepted(_)));
        let odd = review(json!({"hairpinMode": "yes"}).as_object().unwrap());
        assert_eq!(odd[0].row.fate, WRONG_TYPE);
        // Another IPAM plugin's keys are its own.
        let other =
            json!({"ipam": {"type": "whereabouts", "routes": [{"dst": "0.0.0.0/0", "mtu": 1}]}});
        assert!(review(other.as_object().unwrap()).is_empty());
    }
}
