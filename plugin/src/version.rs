//! VERSION: which spec versions we speak. Always answers, whatever version is asked about:
//! podman drops a network whose plugin fails VERSION.

use serde_json::{json, Value};

use crate::cni::version::{self, SUPPORTED_VERSIONS};

pub fn version(stdin: &[u8]) -> Value {
    json!({ "cniVersion": version::asked(stdin), "supportedVersions": SUPPORTED_VERSIONS })
}
