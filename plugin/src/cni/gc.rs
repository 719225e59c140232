//! The attachments a GC request keeps (spec 1.1, GC): `cni.dev/valid-attachments`, a list
//! of `{"containerID", "ifname"}` the runtime still considers alive. libcni also sends the
//! list under its earlier name `cni.dev/attachments`, read when the first is absent.
//!
//! GC deletes everything of the network that is not listed, so a request without the list
//! is refused (code 7) instead of being read as "keep nothing"; an explicit empty list (or
//! `null`, which is how libcni encodes an empty Go slice) does mean "keep nothing".

use serde_json::Value;

use super::{code, config::get_ci, CniError};

pub const VALID_ATTACHMENTS: &str = "cni.dev/valid-attachments";
/// The name libcni sent before the spec settled on [`VALID_ATTACHMENTS`]; it still sends both.
pub const ATTACHMENTS_OLD_NAME: &str = "cni.dev/attachments";

fn invalid(msg: String) -> CniError {
    CniError::new(code::INVALID_CONFIG, msg)
}

/// `(container id, ifname)` of every attachment to keep, as listed.
pub fn valid_attachments(raw: &Value) -> Result<Vec<(String, String)>, CniError> {
    let (field, list) = match (raw.get(VALID_ATTACHMENTS), raw.get(ATTACHMENTS_OLD_NAME)) {
        (Some(v), _) => (VALID_ATTACHMENTS, v),
        (None, Some(v)) => (ATTACHMENTS_OLD_NAME, v),
        (None, None) => {
            return Err(invalid(format!(
                "{VALID_ATTACHMENTS} is missing: GC needs the list of attachments to keep"
            )))
        }
    };
    let items = match list {
        Value::Null => return Ok(Vec::new()),
        Value::Array(items) => items,
        other => {
            return Err(invalid(format!(
                "{field} {other} must be a list of {{\"containerID\", \"ifname\"}} objects"
            )))
        }
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let Value::Object(obj) = item else {
                return Err(invalid(format!(
                    "{field}[{i}] {item} must be an object with containerID and ifname"
                )));
            };
            let text = |key: &str| match get_ci(obj, key) {
                Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                Some(other) => Err(invalid(format!(
                    "{field}[{i}].{key} {other} must be a non-empty string"
                ))),
                None => Err(invalid(format!("{field}[{i}].{key} is missing"))),
            };
            Ok((text("containerID")?, text("ifname")?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pair(id: &str, ifname: &str) -> (String, String) {
        (id.to_owned(), ifname.to_owned())
    }

    #[test]
    fn reads_the_list_under_either_name() {
        let base = json!({"cniVersion": "1.1.0", "name": "n"});
        let mut v = base.clone();
        v[VALID_ATTACHMENTS] = json!([
            {"containerID": "a1", "ifname": "eth0"},
            {"containerID": "b2", "ifname": "net1"}
        ]);
        assert_eq!(
            valid_attachments(&v).unwrap(),
            [pair("a1", "eth0"), pair("b2", "net1")]
        );

        // The old name alone is read; with both, the spec's name wins.
        let mut old = base.clone();
        old[ATTACHMENTS_OLD_NAME] = json!([{"containerID": "c3", "ifname": "eth0"}]);
        assert_eq!(valid_attachments(&old).unwrap(), [pair("c3", "eth0")]);
        let mut both = old.clone();
        both[VALID_ATTACHMENTS] = json!([]);
        assert!(valid_attachments(&both).unwrap().is_empty());

        // Go field spelling is tolerated, as libcni's case-insensitive decoder does.
        let mut caps = base.clone();
        caps[VALID_ATTACHMENTS] = json!([{"ContainerID": "d4", "IfName": "eth0"}]);
        assert_eq!(valid_attachments(&caps).unwrap(), [pair("d4", "eth0")]);
    }

    #[test]
    fn empty_and_null_mean_keep_nothing() {
        for list in [json!([]), Value::Null] {
            let v = json!({"cniVersion": "1.1.0", "name": "n", VALID_ATTACHMENTS: list});
            assert!(valid_attachments(&v).unwrap().is_empty(), "{v}");
        }
    }

    #[test]
    fn missing_or_malformed_is_code_7_naming_the_field() {
        let cases = [
            (json!({"name": "n"}), "cni.dev/valid-attachments is missing"),
            (
                json!({VALID_ATTACHMENTS: {"containerID": "a", "ifname": "eth0"}}),
                "cni.dev/valid-attachments {",
            ),
            (
                json!({VALID_ATTACHMENTS: "a/eth0"}),
                "cni.dev/valid-attachments \"a/eth0\"",
            ),
            (
                json!({VALID_ATTACHMENTS: [{"containerID": "a", "ifname": "eth0"}, "b"]}),
                "cni.dev/valid-attachments[1]",
            ),
            (
                json!({VALID_ATTACHMENTS: [{"ifname": "eth0"}]}),
                "cni.dev/valid-attachments[0].containerID is missing",
            ),
            (
                json!({VALID_ATTACHMENTS: [{"containerID": "a", "ifname": 7}]}),
                "cni.dev/valid-attachments[0].ifname 7",
            ),
            (
                json!({VALID_ATTACHMENTS: [{"containerID": "", "ifname": "eth0"}]}),
                "cni.dev/valid-attachments[0].containerID \"\"",
            ),
            (
                json!({ATTACHMENTS_OLD_NAME: [{"containerID": "a"}]}),
                "cni.dev/attachments[0].ifname is missing",
            ),
        ];
        for (v, needle) in cases {
            let e = valid_attachments(&v).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{v}");
            assert!(e.msg.contains(needle), "{v}: {}", e.msg);
        }
    }
}
