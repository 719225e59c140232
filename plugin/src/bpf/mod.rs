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

mod cgroup;
mod cookie;
mod error;
pub mod gateways;
mod inspect;
pub mod kernel;
mod keys;
mod links;
mod lock;
mod maps;
mod masq;
pub mod pin;
mod pod;
mod programs;
mod purge;
mod queue;
mod survey;
mod sys;
mod trace;
mod tree;

use aya::programs::TcAttachType;
pub use cookie::netns_cookie_of;
pub use ebpf_cni_maps::{DirCounters, PodCounters};
pub use error::{BpfError, RemoveFailure};
pub use inspect::{
    inspect, AttachmentReport, Counts, DeviceReport, GatewayReport, LimitReport, LinkReport,
    MapUsageReport, NodeReport, PortMappingReport, ShapeSubnetsReport, SourceCheckReport,
};
pub use keys::AttachmentKey;
pub use lock::NodeLock;
use maps::ports;
pub use maps::{PodEndpoint, PodSources, SourceCheck};
pub use masq::{MasqReport, MasqSpec};
pub use pin::{ensure_bpffs, NodeId, PinRoot};
pub use pod::{
    add_pod, check_pod, del_pod, ensure_addresses_free, pacing_rate, sweep_masq, sweep_sources,
    PodSpec,
};
pub use purge::{purge, users, NodeUsers, Purge};
pub use survey::{readiness, Unready};
pub use trace::trace;
pub use tree::{network_attachments, AttachmentDir};

/// The node's lock (see [`NodeLock`]), for work outside this module that must not overlap
/// another run's ADD or DEL: the reclaim of leases after a reboot.
pub fn lock_node() -> Result<NodeLock, BpfError> {
    let root = PinRoot::from_env();
    pin::ensure_bpffs_at(&root)?;
    NodeLock::take(&root)
}

/// How each part of the dataplane runs on this kernel for `node` (see [`kernel`]). Whether
/// TCP pacing runs is the verifier's answer at the node's first load; on a node without
/// programs yet it is read off the kernel version.
pub fn part_modes(node: &NodeId) -> Vec<kernel::PartMode> {
    let root = PinRoot::from_env();
    let loaded = root
        .program(node, revision(), Hook::FromPod.program())
        .exists();
    let pacing = if loaded {
        programs::Programs::pacing_available(&root, node)
    } else {
        kernel::version() >= (5, 15)
    };
    kernel::part_modes(pacing)
}

/// The kernel-side object, copied to `OUT_DIR` by `build.rs`: empty unless built through
/// `cargo xtask build`.
static PROGRAMS: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ebpf-cni-programs"));

/// Identifies the embedded object: programs pinned by a binary with other programs are
/// never reused by this one (it loads and pins its own next to them). `build.rs` computes
/// it ([`keys::fnv1a`] of the object) once at build time.
pub const fn revision() -> &'static str {
    env!("EBPF_CNI_REVISION")
}

/// Whether this binary carries its eBPF programs (see [`BpfError::NotBuilt`]).
pub fn programs_embedded() -> bool {
    !PROGRAMS.is_empty()
}

/// A node device that gets the device program (traffic arriving for pods).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    pub name: String,
    pub ifindex: u32,
}

/// Which way traffic crosses the host veth, i.e. which program, hook and counter.
/// How programs are attached to devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// TCX links (kernel 6.6+), pinned so they outlive the plugin.
    Tcx,
    /// Classic `clsact` qdisc + `bpf` filters over netlink, which the kernel keeps by
    /// itself. The attachment directory then holds a pin of the program as a record.
    Netlink,
}

/// The attach mode of each kind of device a pod's ADD touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttachModes {
    /// The pod's host veth.
    pub pod: AttachMode,
    /// The node's devices (shared by every pod, attached once per node).
    pub devices: AttachMode,
}

impl AttachMode {
    /// TCX where the kernel has it (6.6 and later), netlink filters elsewhere.
    pub fn auto() -> Self {
        if kernel::has_tcx() {
            Self::Tcx
        } else {
            Self::Netlink
        }
    }
}

/// Where a program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hook {
    /// Host veth ingress: traffic leaving the pod.
    FromPod,
    /// Host veth egress: traffic the stack sends into the pod.
    ToPod,
    /// Node device ingress: traffic arriving for pods.
    FromDev,
    /// Host veth ingress of a pod another plugin created (chained mode): traffic leaving
    /// the pod, of which only host-port flows are forwarded here.
    FromChain,
}

impl Hook {
    pub const ALL: [Hook; 4] = [Hook::FromPod, Hook::ToPod, Hook::FromDev, Hook::FromChain];
    /// Every hook a pod's host veth may carry, in either mode.
    pub const ANY_POD: [Hook; 3] = [Hook::FromPod, Hook::FromChain, Hook::ToPod];

    /// The hooks of a pod's host veth: standalone, or chained after another plugin.
    pub const fn pod(chained: bool) -> [Hook; 2] {
        if chained {
            [Hook::FromChain, Hook::ToPod]
        } else {
            [Hook::FromPod, Hook::ToPod]
        }
    }

    pub const fn label(self) -> &'static str {
        match self {
            Self::FromPod => "from_pod",
            Self::ToPod => "to_pod",
            Self::FromDev => "from_dev",
            Self::FromChain => "from_chain",
        }
    }

    pub const fn program(self) -> &'static str {
        match self {
            Self::FromPod => ebpf_cni_maps::PROG_FROM_POD,
            Self::ToPod => ebpf_cni_maps::PROG_TO_POD,
            Self::FromDev => ebpf_cni_maps::PROG_FROM_DEV,
            Self::FromChain => ebpf_cni_maps::PROG_FROM_CHAIN,
        }
    }

    /// Netlink mode: the name of the program pin recording that the filter was attached.
    const fn netlink_record_name(self) -> &'static str {
        match self {
            Self::FromPod => "netlink_from_pod",
            Self::ToPod => "netlink_to_pod",
            Self::FromDev => ebpf_cni_maps::pin::NETLINK_FROM_DEV,
            Self::FromChain => ebpf_cni_maps::pin::NETLINK_FROM_CHAIN,
        }
    }

    const fn link_pin_name(self) -> &'static str {
        match self {
            Self::FromPod => ebpf_cni_maps::pin::LINK_FROM_POD,
            Self::ToPod => ebpf_cni_maps::pin::LINK_TO_POD,
            Self::FromDev => ebpf_cni_maps::pin::LINK_FROM_DEV,
            Self::FromChain => ebpf_cni_maps::pin::LINK_FROM_CHAIN,
        }
    }

    pub const fn tc_attach_type(self) -> TcAttachType {
        match self {
            Self::FromPod | Self::FromDev | Self::FromChain => TcAttachType::Ingress,
            Self::ToPod => TcAttachType::Egress,
        }
    }

    const fn tcx_attach_type(self) -> u32 {
        match self {
            Self::FromPod | Self::FromDev | Self::FromChain => sys::BPF_TCX_INGRESS,
            Self::ToPod => sys::BPF_TCX_EGRESS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            &PodSpec {
                host_ifname: "veth0",
                host_ifindex: 1,
                endpoints: &[],
                limits: None,
                shape_subnets: &[],
                ports: &[],
                node_addrs: &[],
                chained: false,
                netns_cookie: 0,
                masq: None,
                sources: &SourceCheck::Off,
            },
            &[],
            AttachModes {
                pod: AttachMode::Tcx,
                devices: AttachMode::Tcx,
            },
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
