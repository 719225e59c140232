//! The CNI error result (spec section 5, "Error") and the codes this plugin uses.
//!
//! Library modules define their own typed errors (thiserror) and say which code they map
//! to; only this edge turns them into the JSON the runtime reads.

use serde::Serialize;

/// Codes 0-99 are the spec's; 100+ are ours (documented in docs/operations.md).
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const INVALID_ENV: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODE_FAILURE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// CNI 1.1 STATUS: the plugin cannot serve ADD.
    pub const PLUGIN_NOT_AVAILABLE: u32 = 50;
    /// CNI 1.1 STATUS: cannot serve ADD and existing pods may be affected.
    pub const PLUGIN_NOT_AVAILABLE_LIMITED: u32 = 51;

    /// A netlink request to the kernel failed (link, address, route, sysctl).
    pub const KERNEL: u32 = 100;
    /// Loading, attaching or pinning an eBPF program or map failed.
    pub const BPF: u32 = 101;
    /// The IPAM ranges have no free address left.
    pub const IPAM_EXHAUSTED: u32 = 102;
    /// A requested address is outside every range or already taken.
    pub const IPAM_UNAVAILABLE: u32 = 103;
    /// A delegated (IPAM) plugin failed or returned something we cannot use.
    pub const DELEGATE: u32 = 104;
    /// CHECK found the attachment missing or different from what ADD set up.
    pub const CHECK_FAILED: u32 = 105;
    /// The container network namespace could not be entered.
    pub const NETNS: u32 = 106;
    /// The interface name requested for the container already exists there.
    pub const INTERFACE_EXISTS: u32 = 107;
    /// A requested host port (hostIP, hostPort, protocol) is mapped to another pod.
    pub const PORT_IN_USE: u32 = 108;
    /// Anything else (a bug, or a failure we did not classify).
    pub const INTERNAL: u32 = 199;
}

/// The error result printed on stdout.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CniError {
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    pub code: u32,
    pub msg: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        Self {
            cni_version: String::new(),
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// Builds a CNI error from a typed error: `msg` is its top-level message, `details` the
    /// chain of causes below it.
    pub fn from_error(code: u32, err: &(dyn std::error::Error + 'static)) -> Self {
        Self::new(code, err.to_string()).with_details(source_lines(err).join(": "))
    }
}

/// The outcome of steps that kept going past failures (DEL, GC, a teardown): none is `Ok`,
/// one is itself, more are merged into one by `many`.
pub fn collect<E>(mut failures: Vec<E>, many: impl FnOnce(Vec<E>) -> E) -> Result<(), E> {
    match failures.len() {
        0 => Ok(()),
        1 => Err(failures.remove(0)),
        _ => Err(many(failures)),
    }
}

impl CniError {
    /// Several failures of `command` (DEL, GC) as one: under the first one's code, each
    /// in the details. They come from every module DEL and GC touch, already converted
    /// at the edge, so the merged error is built here.
    pub fn merged(command: &str, errors: Vec<CniError>) -> Self {
        let first = errors.first().map_or(code::INTERNAL, |e| e.code);
        let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
        CniError::new(first, format!("{command} failed in {} steps", all.len()))
            .with_details(all.join("; "))
    }
}

/// An error with its causes, one after the other (what the operator commands print).
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    std::iter::once(e.to_string())
        .chain(source_lines(e))
        .collect::<Vec<_>>()
        .join(": ")
}

/// The messages of `err`'s sources, each on one line. A message of several lines (the
/// kernel verifier's log inside a program load error: a dump of the rejected program) is
/// cut to its last line, the verifier's reason; the whole text goes to the debug log.
pub fn source_lines(err: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut lines = Vec::new();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if text.trim_end().contains('\n') {
            log::debug!("{err}: {text}");
            let reason = text
                .lines()
                .map(str::trim)
                .rev()
                .find(|l| {
                    !l.is_empty()
                        && !l.starts_with("processed ")
                        && !l.starts_with("verification time")
                })
                .unwrap_or_default();
            let head = text.lines().next().unwrap_or_default().trim();
            lines.push(if head == reason {
                reason.to_owned()
            } else {
                format!("{head} … {reason}")
            });
        } else {
            lines.push(text);
        }
        source = s.source();
    }
    lines
}

impl std::fmt::Display for CniError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.details.is_empty() {
            write!(f, "{} (code {})", self.msg, self.code)
        } else {
            write!(f, "{}: {} (code {})", self.msg, self.details, self.code)
        }
    }
}

impl std::error::Error for CniError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collect_reports_every_failure_under_the_first_code() {
        let merge = |all| CniError::merged("DEL", all);
        assert!(collect(Vec::new(), merge).is_ok());
        let one = CniError::new(code::KERNEL, "a");
        assert_eq!(collect(vec![one.clone()], merge).unwrap_err(), one);
        let e = collect(
            vec![
                CniError::new(code::BPF, "x").with_details("why"),
                CniError::new(code::IO_FAILURE, "y"),
            ],
            |all| CniError::merged("GC", all),
        )
        .unwrap_err();
        assert_eq!(e.code, code::BPF);
        assert_eq!(e.msg, "GC failed in 2 steps");
        assert_eq!(e.details, "x: why (code 101); y (code 5)");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("failed to prepare program ecni_sockops")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("the BPF_PROG_LOAD syscall failed. Verifier output: 0: (bf) r6 = r1\n1: (85) call bpf_get_netns_cookie#122\nunknown func bpf_get_netns_cookie#122\nprocessed 2 insns (limit 1000000)\n")]
    struct Inner;

    #[test]
    fn a_verifier_dump_is_cut_to_its_reason() {
        let e = CniError::from_error(101, &Outer(Inner));
        assert_eq!(e.msg, "failed to prepare program ecni_sockops");
        assert_eq!(
            e.details,
            "the BPF_PROG_LOAD syscall failed. Verifier output: 0: (bf) r6 = r1 … unknown func bpf_get_netns_cookie#122"
        );
    }
}
