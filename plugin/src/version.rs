//! VERSION: which spec versions we speak. Always answers, whatever version is asked about:
//! podman drops a network whose plugin fails VERSION.

use serde_json::{json, Value};

use crate::cni::version::SUPPORTED_VERSIONS;

pub fn version(stdin: &[u8]) -> Value {
    let asked = serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| {
            v.get("cniVersion")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "1.0.0".to_owned());
    json!({ "cniVersion": asked, "supportedVersions": SUPPORTED_VERSIONS })
}
