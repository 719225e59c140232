//! The attachments a GC request keeps (spec 1.1, GC): `cni.dev/valid-attachments`, a list
//! of `{"containerID", "ifname"}` the runtime still considers alive. libcni also sends the
//! list under its earlier name `cni.dev/attachments`, read when the first is absent.
//!
//! GC deletes everything of the network that is not listed, so a request without the list
//! is refused (code 7) instead of being read as "keep nothing"; an explicit empty list (or
//! `null`, which is how libcni encodes an empty Go slice) does mean "keep nothing".

use serde_json::Value;

use super::{code, config::get_ci};

pub const VALID_ATTACHMENTS: &str = "cni.dev/valid-attachments";
/// The name libcni sent before the spec settled on [`VALID_ATTACHMENTS`]; it still sends both.
pub const ATTACHMENTS_OLD_NAME: &str = "cni.dev/attachments";

/// A GC request whose list of attachments to keep cannot be read; each names the field
/// (under the name the request used) and the value found there.
#[derive(Debug, thiserror::Error)]
pub enum GcListError {
    #[error(
        "{} is missing: GC needs the list of attachments to keep",
        VALID_ATTACHMENTS
    )]
    Missing,
    #[error("{field} {value} must be a list of {{\"containerID\", \"ifname\"}} objects")]
    NotAList { field: &'static str, value: Value },
    #[error("{field}[{index}] {value} must be an object with containerID and ifname")]
    NotAnObject {
        field: &'static str,
        index: usize,
        value: Value,
    },
    #[error("{field}[{index}].{key} {value} must be a non-empty string")]
    NotAString {
        field: &'static str,
        index: usize,
        key: &'static str,
        value: Value,
    },
    #[error("{field}[{index}].{key} is missing")]
    MissingKey {
        field: &'static str,
        index: usize,
        key: &'static str,
    },
}

impl GcListError {
    pub fn cni_code(&self) -> u32 {
        code::INVALID_CONFIG
    }
}

/// `(container id, ifname)` of every attachment to keep, as listed.
pub fn valid_attachments(raw: &Value) -> Result<Vec<(String, String)>, GcListError> {
    let (field, list) = match (raw.get(VALID_ATTACHMENTS), raw.get(ATTACHMENTS_OLD_NAME)) {
        (Some(v), _) => (VALID_ATTACHMENTS, v),
        (None, Some(v)) => (ATTACHMENTS_OLD_NAME, v),
        (None, None) => return Err(GcListError::Missing),
    };
    let items = match list {
        Value::Null => return Ok(Vec::new()),
        Value::Array(items) => items,
        other => {
            return Err(GcListError::NotAList {
                field,
                value: other.clone(),
            })
        }
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let Value::Object(obj) = item else {
                return Err(GcListError::NotAnObject {
                    field,
                    index: i,
                    value: item.clone(),
                });
            };
            let text = |key: &'static str| match get_ci(obj, key) {
                Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                Some(other) => Err(GcListError::NotAString {
                    field,
                    index: i,
                    key,
                    value: other.clone(),
                }),
                None => Err(GcListError::MissingKey {
                    field,
                    index: i,
                    key,
                }),
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
            assert_eq!(e.cni_code(), code::INVALID_CONFIG, "{v}");
            assert!(e.to_string().contains(needle), "{v}: {e}");
        }
    }
}
