//! The eBPF dataplane from user space.
//!
//! Per node (network namespace) the programs are loaded and verified once, by the first ADD,
//! and pinned with the node-wide maps (endpoints, per-pod counters); later ADDs open the
//! pinned programs and only attach them, which costs a few milliseconds instead of a
//! verification. Each attachment pins its TCX links under its own directory; the node's
//! devices carry one shared link each. When the last attachment of a node is deleted, the
//! node's device links, programs and maps go too, so a node without pods has no eBPF state.
//! A process-wide lock (flock on the layout directory) serialises these steps between
//! concurrent plugin runs; it is held for milliseconds.

mod bandwidth;
mod capability;
mod cgroup;
mod converge;
mod cookie;
mod error;
pub mod gateways;
mod hook;
mod inspect;
pub mod kernel;
mod keys;
mod links;
mod lock;
mod maps;
mod masquerade;
mod orphans;
pub mod pin;
mod placement;
mod pod;
mod programs;
mod purge;
mod services;
mod survey;
mod sys;
mod trace;
mod tree;
pub mod tunnel;
pub mod walk;

pub use capability::{pacing_rate, LimitSpec, PodIp, PodSpec, Veth};
pub use converge::{
    converge, record_change, services_source, ConvergeRecord, ConvergedBy, NodeView, ServicesView,
};
pub use cookie::netns_cookie_of;
pub use error::BpfError;
pub use hook::{AttachMode, AttachModes, Device, Hook};
pub use inspect::{
    inspect, AttachmentReport, Counts, DeviceReport, GatewayReport, LimitReport, LinkReport, Links,
    MapUsageReport, NodeReport, PortMappingReport, ShapeSubnetsReport, SourceCheckReport,
};
pub(crate) use keys::fnv1a;
pub use keys::AttachmentKey;
pub use lock::NodeLock;
use maps::host_ports;
pub use maps::SourceCheck;
pub use masquerade::{MasqReport, MasqSourceReport, MasqSpec};
pub use orphans::{sweep as sweep_orphans, unpinned_filters, UnpinnedFilter};
pub use pin::{ensure_bpffs, NodeId, PinRoot};
pub use pod::{add_pod, check_pod, del_pod, ensure_addresses_free, sweep_masq, sweep_sources};
pub use programs::{part_modes, programs_embedded, revision};
pub use purge::{purge, users, NodeUsers, Purge};
pub use services::{ServicesMaps, ServicesReport};
pub use survey::{readiness, Unready};
pub use trace::trace;
pub use tree::network_attachments;

// After every removal (DEL, GC): the node's programs on the cgroup root go with their
// last user.
pub use cgroup::settle_links as settle_cgroup_links;

/// The node's lock (see [`NodeLock`]), for work outside this module that must not overlap
/// another run's ADD or DEL: the reclaim of leases after a reboot.
pub fn lock_node() -> Result<NodeLock, BpfError> {
    let root = PinRoot::from_env();
    pin::ensure_bpffs_at(&root)?;
    NodeLock::take(&root)
}

#[cfg(test)]
mod tests {
    use aya::programs::TcAttachType;

    use super::*;
    use crate::bpf::{error::RemoveFailure, programs::PROGRAMS};

    /// build.rs hashes the object the same way: pins made by older binaries keep their
    /// names.
    #[test]
    fn build_time_revision_is_the_objects_hash() {
        assert_eq!(
            revision(),
            format!("{:016x}", keys::fnv1a(PROGRAMS.iter().copied()))
        );
    }

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
    fn hooks_match_the_kernel_side() {
        assert_eq!(Hook::FromPod.program(), "ecni_from_pod");
        assert_eq!(Hook::ToPod.tc_attach_type(), TcAttachType::Egress);
        assert_eq!(Hook::FromDev.tc_attach_type(), TcAttachType::Ingress);
    }

    #[test]
    fn attachment_ids_separate_their_parts() {
        let a = AttachmentKey {
            network: "ab",
            container_id: "c",
            ifname: "e",
        };
        let b = AttachmentKey {
            network: "a",
            container_id: "bc",
            ifname: "e",
        };
        assert_ne!(a.id(), b.id());
        assert_eq!(a.id(), AttachmentKey { ..a }.id());
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
        let err = add_pod(
            &node,
            &key,
            &PodSpec::bare(),
            &Veth {
                host_name: "veth0".into(),
                host_ifindex: 1,
                host_mac: [0; 6],
                pod_mac: [0; 6],
            },
            &NodeView {
                devices: Vec::new(),
                addrs: Vec::new(),
                by_link: Vec::new(),
                mode: AttachMode::Tcx,
                services: None,
                ipvs: Vec::new(),
                tunnel: None,
            },
            AttachMode::Tcx,
        )
        .unwrap_err();
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
    fn a_teardown_reports_every_failure_with_its_causes() {
        use crate::cni::code;
        assert!(error::collect("DEL", Vec::new()).is_ok());
        let open = || BpfError::OpenPin {
            path: "/p/ports".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOENT),
        };
        // One failure is itself.
        let one = error::collect("DEL", vec![open()]).unwrap_err();
        assert!(matches!(one, BpfError::OpenPin { .. }), "{one}");
        let all = error::collect(
            "DEL",
            vec![
                BpfError::PortInUse {
                    mapping: "0.0.0.0:80/tcp".into(),
                    pod: "10.0.0.2".parse().unwrap(),
                    pod_port: 8,
                    host_ifindex: 3,
                },
                open(),
            ],
        )
        .unwrap_err();
        assert_eq!(
            all.cni_code(),
            code::PORT_IN_USE,
            "the first failure's code"
        );
        let msg = all.to_string();
        assert!(
            msg.starts_with("DEL failed in 2 steps: hostPort 0.0.0.0:80/tcp"),
            "{msg}"
        );
        assert!(
            msg.ends_with("; failed to open the pinned object at /p/ports: No such file or directory (os error 2)"),
            "each failure with its cause: {msg}"
        );
        let undone = BpfError::AddUndone {
            error: Box::new(BpfError::NotBuilt),
            undo: vec![open()],
        };
        assert_eq!(undone.cni_code(), code::BPF);
        assert!(
            undone.to_string().contains("; undoing the ADD failed too: failed to open the pinned object at /p/ports: No such"),
            "{undone}"
        );
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
