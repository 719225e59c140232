//! Where programs run (the hooks) and how they attach to devices (the attach modes).

use aya::programs::TcAttachType;

use super::{kernel, sys};

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
    /// The cluster network's VXLAN device egress: traffic for a peer's pods.
    ToTunnel,
}

impl Hook {
    pub const ALL: [Hook; 5] = [
        Hook::FromPod,
        Hook::ToPod,
        Hook::FromDev,
        Hook::FromChain,
        Hook::ToTunnel,
    ];
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
            Self::ToTunnel => "to_tunnel",
        }
    }

    pub const fn program(self) -> &'static str {
        match self {
            Self::FromPod => ebpf_cni_maps::PROG_FROM_POD,
            Self::ToPod => ebpf_cni_maps::PROG_TO_POD,
            Self::FromDev => ebpf_cni_maps::PROG_FROM_DEV,
            Self::FromChain => ebpf_cni_maps::PROG_FROM_CHAIN,
            Self::ToTunnel => ebpf_cni_maps::PROG_TO_TUNNEL,
        }
    }

    /// Netlink mode: the name of the program pin recording that the filter was attached.
    pub(super) const fn netlink_record_name(self) -> &'static str {
        match self {
            Self::FromPod => "netlink_from_pod",
            Self::ToPod => "netlink_to_pod",
            Self::FromDev => ebpf_cni_maps::pin::NETLINK_FROM_DEV,
            Self::FromChain => ebpf_cni_maps::pin::NETLINK_FROM_CHAIN,
            Self::ToTunnel => ebpf_cni_maps::pin::NETLINK_TO_TUNNEL,
        }
    }

    pub(super) const fn link_pin_name(self) -> &'static str {
        match self {
            Self::FromPod => ebpf_cni_maps::pin::LINK_FROM_POD,
            Self::ToPod => ebpf_cni_maps::pin::LINK_TO_POD,
            Self::FromDev => ebpf_cni_maps::pin::LINK_FROM_DEV,
            Self::FromChain => ebpf_cni_maps::pin::LINK_FROM_CHAIN,
            Self::ToTunnel => ebpf_cni_maps::pin::LINK_TO_TUNNEL,
        }
    }

    pub const fn tc_attach_type(self) -> TcAttachType {
        match self {
            Self::FromPod | Self::FromDev | Self::FromChain => TcAttachType::Ingress,
            Self::ToPod | Self::ToTunnel => TcAttachType::Egress,
        }
    }

    pub(super) const fn tcx_attach_type(self) -> u32 {
        match self {
            Self::FromPod | Self::FromDev | Self::FromChain => sys::BPF_TCX_INGRESS,
            Self::ToPod | Self::ToTunnel => sys::BPF_TCX_EGRESS,
        }
    }
}
