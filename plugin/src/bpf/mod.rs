//! The eBPF dataplane from user space: load the programs embedded in this binary, attach them
//! to a pod's host-side veth through TCX, and pin links and maps so they outlive the plugin
//! process; find them again for CHECK, DEL and counter reads.
//!
//! Each attachment loads its own copy of the programs and its own counters map, and owns one
//! pin directory (see [`pin`]). Attaching either completes or leaves nothing pinned.

mod attach;
mod error;
pub mod pin;
mod sys;

pub use attach::{attach_host_veth, check, detach, read_counters, AttachInfo, AttachedLink};
use aya::programs::TcAttachType;
pub use ebpf_cni_maps::TrafficCounters;
pub use error::{BpfError, RemoveFailure};
pub use pin::{ensure_bpffs, NodeId, PinRoot};

/// The kernel-side object, copied to `OUT_DIR` by `build.rs`: empty unless built through
/// `cargo xtask build`.
static PROGRAMS: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ebpf-cni-programs"));

/// Whether this binary carries its eBPF programs (see [`BpfError::NotBuilt`]).
pub fn programs_embedded() -> bool {
    !PROGRAMS.is_empty()
}

/// Names one attachment: one interface of one container on one network. The values come
/// from the CNI request and must already be validated; [`AttachmentKey::validate`] is checked
/// again before any path is built from them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttachmentKey<'a> {
    pub network: &'a str,
    pub container_id: &'a str,
    pub ifname: &'a str,
}

impl AttachmentKey<'_> {
    /// Each value becomes one path component: non-empty, not `.` or `..`, no `/` or NUL.
    pub fn validate(&self) -> Result<(), BpfError> {
        for (field, value) in [
            ("network", self.network),
            ("container id", self.container_id),
            ("ifname", self.ifname),
        ] {
            if value.is_empty() || value == "." || value == ".." || value.contains(['/', '\0']) {
                return Err(BpfError::InvalidKey {
                    field,
                    value: value.to_owned(),
                });
            }
        }
        Ok(())
    }
}

/// Which way traffic crosses the host veth, i.e. which program, hook and counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Host veth ingress: sent by the pod.
    FromPod,
    /// Host veth egress: sent to the pod.
    ToPod,
}

impl Direction {
    pub const ALL: [Direction; 2] = [Direction::FromPod, Direction::ToPod];

    /// Index in the counters map and in [`read_counters`]'s result.
    pub const fn index(self) -> usize {
        match self {
            Self::FromPod => ebpf_cni_maps::DIR_FROM_POD as usize,
            Self::ToPod => ebpf_cni_maps::DIR_TO_POD as usize,
        }
    }

    /// For messages: "link from_pod …".
    pub const fn label(self) -> &'static str {
        match self {
            Self::FromPod => "from_pod",
            Self::ToPod => "to_pod",
        }
    }

    const fn program(self) -> &'static str {
        match self {
            Self::FromPod => ebpf_cni_maps::PROG_FROM_POD,
            Self::ToPod => ebpf_cni_maps::PROG_TO_POD,
        }
    }

    const fn link_pin_name(self) -> &'static str {
        match self {
            Self::FromPod => ebpf_cni_maps::pin::LINK_FROM_POD,
            Self::ToPod => ebpf_cni_maps::pin::LINK_TO_POD,
        }
    }

    const fn tc_attach_type(self) -> TcAttachType {
        match self {
            Self::FromPod => TcAttachType::Ingress,
            Self::ToPod => TcAttachType::Egress,
        }
    }

    /// The kernel's `bpf_attach_type` of the TCX link.
    const fn tcx_attach_type(self) -> u32 {
        match self {
            Self::FromPod => sys::BPF_TCX_INGRESS,
            Self::ToPod => sys::BPF_TCX_EGRESS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_validation_rejects_path_tricks() {
        let ok = AttachmentKey {
            network: "net",
            container_id: "abc",
            ifname: "eth0",
        };
        assert!(ok.validate().is_ok());
        for bad in ["", ".", "..", "a/b", "/", "a\0b"] {
            for key in [
                AttachmentKey { network: bad, ..ok },
                AttachmentKey {
                    container_id: bad,
                    ..ok
                },
                AttachmentKey { ifname: bad, ..ok },
            ] {
                let err = key.validate().unwrap_err();
                assert!(matches!(err, BpfError::InvalidKey { .. }), "{bad:?}: {err}");
            }
        }
        // Dots inside a name are fine.
        assert!(AttachmentKey {
            network: "a..b",
            ..ok
        }
        .validate()
        .is_ok());
    }

    #[test]
    fn directions_match_the_kernel_side() {
        assert_eq!(Direction::FromPod.index(), 0);
        assert_eq!(Direction::ToPod.index(), 1);
        assert_eq!(Direction::ALL.len(), ebpf_cni_maps::DIR_COUNT as usize);
        assert_eq!(Direction::FromPod.program(), "ecni_from_pod");
        assert_eq!(Direction::ToPod.tc_attach_type(), TcAttachType::Egress);
    }

    #[test]
    fn stub_binary_says_not_built() {
        // Only meaningful (and root-free) in the usual stub build.
        if programs_embedded() {
            return;
        }
        let key = AttachmentKey {
            network: "net",
            container_id: "abc",
            ifname: "eth0",
        };
        let node = NodeId::from_netns_inode(1);
        let err = attach_host_veth(&node, &key, "veth0").unwrap_err();
        assert!(matches!(err, BpfError::NotBuilt), "{err}");
        assert!(err.to_string().contains("cargo xtask build"));
    }

    #[test]
    fn detach_failures_are_all_listed() {
        let err = BpfError::Detach {
            dir: "/p".into(),
            failures: vec![
                RemoveFailure {
                    path: "/p/a".into(),
                    source: std::io::Error::from_raw_os_error(libc::EPERM),
                },
                RemoveFailure {
                    path: "/p".into(),
                    source: std::io::Error::from_raw_os_error(libc::EBUSY),
                },
            ],
        };
        let msg = err.to_string();
        assert!(
            msg.starts_with("failed to remove 2 entries of the attachment at /p: /p/a: "),
            "{msg}"
        );
        assert!(msg.contains("; /p: "), "{msg}");
    }

    #[test]
    fn errors_map_to_cni_codes() {
        use crate::cni::code;
        assert_eq!(BpfError::NotBuilt.cni_code(), code::BPF);
        let missing = BpfError::PinMissing {
            what: "link_from_pod",
            path: "/x".into(),
        };
        assert_eq!(missing.cni_code(), code::CHECK_FAILED);
        assert_eq!(missing.to_string(), "link_from_pod pin missing at /x");
        let wrong = BpfError::WrongIfindex {
            link: "to_pod",
            actual: 7,
            expected: 9,
        };
        assert_eq!(
            wrong.to_string(),
            "link to_pod is attached to ifindex 7, expected 9"
        );
    }
}
