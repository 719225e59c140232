//! Spec versions this plugin speaks, and how each one shapes a result.

use super::code;

/// Versions listed by VERSION. 1.1.0 results have the 1.0.0 layout (its new optional
/// fields are ones this plugin does not set); it adds the GC and STATUS commands.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The first version with GC and STATUS.
pub const GC_STATUS_SINCE: &str = "1.1.0";

/// The result layout a version asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultFormat {
    /// 0.3.0, 0.3.1, 0.4.0: `ips[].version` is present.
    V03,
    /// 1.0.0 and later: no `ips[].version`.
    V1,
}

/// A cniVersion this plugin does not speak.
#[derive(Debug, thiserror::Error)]
#[error("incompatible CNI version: cniVersion {version:?} is not supported")]
pub struct VersionError {
    pub version: String,
    #[source]
    pub supported: Supported,
}

/// The versions this plugin speaks: the cause of a [`VersionError`], so that the runtime
/// reads them in the error's details.
#[derive(Debug, thiserror::Error)]
#[error("supported versions: {}", SUPPORTED_VERSIONS.join(", "))]
pub struct Supported;

impl VersionError {
    pub fn cni_code(&self) -> u32 {
        code::INCOMPATIBLE_VERSION
    }
}

/// A validated cniVersion string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniVersion(String);

impl CniVersion {
    pub fn parse(v: &str) -> Result<Self, VersionError> {
        if SUPPORTED_VERSIONS.contains(&v) {
            Ok(Self(v.to_owned()))
        } else {
            Err(VersionError {
                version: v.to_owned(),
                supported: Supported,
            })
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether a config of this version may be used with GC and STATUS. The reference
    /// `skel` refuses older ones with code 1, and libcni never sends them.
    pub fn has_gc_and_status(&self) -> bool {
        at_least(&self.0, GC_STATUS_SINCE)
    }

    pub fn format(&self) -> ResultFormat {
        if self.0.starts_with("0.") {
            ResultFormat::V03
        } else {
            ResultFormat::V1
        }
    }
}

/// `a >= b` for dotted numeric versions ("1.1.0"); anything unparsable is older.
pub fn at_least(a: &str, b: &str) -> bool {
    fn parts(v: &str) -> Option<Vec<u64>> {
        v.split('.').map(|p| p.parse().ok()).collect()
    }
    match (parts(a), parts(b)) {
        (Some(a), Some(b)) => a >= b,
        _ => false,
    }
}

/// The `cniVersion` a request's config names, as sent (even one this plugin does not
/// speak), else `1.0.0`: what VERSION answers with and what an error result carries
/// (spec section 5), both whatever the config's state.
pub fn asked(stdin: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_owned))
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "1.0.0".to_owned())
}

impl Default for CniVersion {
    fn default() -> Self {
        Self("1.0.0".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_supported_and_rejects_others() {
        for v in SUPPORTED_VERSIONS {
            assert_eq!(CniVersion::parse(v).unwrap().as_str(), *v);
        }
        for v in ["0.1.0", "0.2.0", "9.9.9", "", "1.0"] {
            let e = CniVersion::parse(v).unwrap_err();
            assert_eq!(e.cni_code(), code::INCOMPATIBLE_VERSION);
            assert!(e.to_string().contains(&format!("{v:?}")), "{e}");
            assert_eq!(
                crate::cni::error::source_lines(&e),
                ["supported versions: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0"],
                "the details list them"
            );
        }
    }

    #[test]
    fn result_format_by_version() {
        assert_eq!(
            CniVersion::parse("0.3.0").unwrap().format(),
            ResultFormat::V03
        );
        assert_eq!(
            CniVersion::parse("0.4.0").unwrap().format(),
            ResultFormat::V03
        );
        assert_eq!(
            CniVersion::parse("1.0.0").unwrap().format(),
            ResultFormat::V1
        );
        assert_eq!(
            CniVersion::parse("1.1.0").unwrap().format(),
            ResultFormat::V1
        );
    }

    #[test]
    fn lists_every_version_from_0_3_0_to_1_1_0() {
        assert_eq!(
            SUPPORTED_VERSIONS,
            ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
        );
    }

    #[test]
    fn gc_and_status_need_1_1_0() {
        for v in SUPPORTED_VERSIONS {
            assert_eq!(
                CniVersion::parse(v).unwrap().has_gc_and_status(),
                *v == "1.1.0",
                "{v}"
            );
        }
        assert!(at_least("1.10.0", "1.1.0"));
        assert!(!at_least("1.0.9", "1.1.0"));
        assert!(!at_least("x", "1.1.0"));
    }
}
