//! What a row of the report measures, as a type: every figure any section takes, with the
//! parameters that tell its rows apart (a path, a rate, a K). Its name, unit and better
//! direction come from here, so the sections that fill rows and the report, the charts and
//! the targets that look rows up agree by construction, not by spelling the same string.

use serde::{Deserialize, Serialize};

use crate::format::{rate, thousands};

/// The metrics goal: reading all maps of a node of [`METRICS_TARGET_PODS`] pods takes less than this.
pub const METRICS_TARGET_MS: f64 = 100.0;
pub const METRICS_TARGET_PODS: usize = 1_000;

/// Which way is better for a figure (decides nothing but the wording of ratios).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Better {
    Lower,
    Higher,
    Neither,
}

/// A path the traffic section measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PathKind {
    PodToPod,
    NodeToPod,
    ExtToHostPort,
}

impl PathKind {
    pub const ALL: [PathKind; 3] = [
        PathKind::PodToPod,
        PathKind::NodeToPod,
        PathKind::ExtToHostPort,
    ];

    pub fn label(self) -> &'static str {
        match self {
            PathKind::PodToPod => "pod → pod",
            PathKind::NodeToPod => "node → pod",
            PathKind::ExtToHostPort => "external → hostPort → pod",
        }
    }

    /// The label under a chart's bars.
    pub fn short_label(self) -> &'static str {
        match self {
            PathKind::ExtToHostPort => "ext → hostPort",
            p => p.label(),
        }
    }
}

/// The direction of a bandwidth limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Dir {
    /// Towards the pod (the external client sends).
    Ingress,
    /// From the pod.
    Egress,
}

impl Dir {
    pub fn label(self) -> &'static str {
        match self {
            Dir::Ingress => "ingress",
            Dir::Egress => "egress",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Dir::Ingress => "in",
            Dir::Egress => "out",
        }
    }
}

/// The figures of one K of the port-map scale section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScaleFigure {
    ConnectFirst,
    ConnectNewest,
    OneMoreAdd,
    /// The same ADD on the subject's K = 0 control node, interleaved.
    ControlAdd,
    OneMoreDel,
    /// Total ADD time of the background pods holding the K mappings.
    Install,
}

impl ScaleFigure {
    pub const ALL: [ScaleFigure; 6] = [
        ScaleFigure::ConnectFirst,
        ScaleFigure::ConnectNewest,
        ScaleFigure::OneMoreAdd,
        ScaleFigure::ControlAdd,
        ScaleFigure::OneMoreDel,
        ScaleFigure::Install,
    ];

    fn label(self) -> &'static str {
        match self {
            ScaleFigure::ConnectFirst => "connect latency via the first pod's hostPort",
            ScaleFigure::ConnectNewest => "connect latency via the newest pod's hostPort",
            ScaleFigure::OneMoreAdd => "one more ADD",
            ScaleFigure::ControlAdd => "the same ADD on the control node (K = 0), meanwhile",
            ScaleFigure::OneMoreDel => "one more DEL",
            ScaleFigure::Install => "install the K mappings (total)",
        }
    }
}

/// A figure of the source check section, taken with the check on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceFigure {
    Throughput,
    RrP50,
    RrP99,
    Crr,
    /// `ecni_from_pod`'s mean run time per packet (the kernel's BPF statistics).
    ProgNs,
}

impl SourceFigure {
    pub const ALL: [SourceFigure; 5] = [
        SourceFigure::Throughput,
        SourceFigure::RrP50,
        SourceFigure::RrP99,
        SourceFigure::Crr,
        SourceFigure::ProgNs,
    ];

    fn label(self) -> &'static str {
        match self {
            SourceFigure::Throughput => "TCP throughput",
            SourceFigure::RrP50 => "TCP_RR p50",
            SourceFigure::RrP99 => "TCP_RR p99",
            SourceFigure::Crr => "TCP_CRR",
            SourceFigure::ProgNs => "ecni_from_pod run time per packet (TCP_RR and TCP_CRR)",
        }
    }
}

/// A figure of pod → pod between two nodes (the cluster section).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CrossFigure {
    Throughput { streams: u32 },
    RrP50,
    Crr,
}

impl CrossFigure {
    pub fn label(self) -> String {
        match self {
            CrossFigure::Throughput { streams: 1 } => "TCP throughput, 1 stream".into(),
            CrossFigure::Throughput { streams } => format!("TCP throughput, {streams} streams"),
            CrossFigure::RrP50 => "TCP_RR p50".into(),
            CrossFigure::Crr => "TCP_CRR".into(),
        }
    }
}

/// How pod → pod crosses between two nodes: ebpf-cni's mode, against the reference chain
/// with what its users set up for the same (host-gw routes; flannel's VXLAN device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CrossPath {
    Direct,
    Overlay,
    /// The overlay with `nodes` Node objects in the cluster (ebpf-cni only).
    OverlayNodes {
        nodes: usize,
    },
}

impl CrossPath {
    pub fn label(self) -> String {
        match self {
            CrossPath::Direct => "direct (the reference: host-gw routes)".into(),
            CrossPath::Overlay => "overlay (the reference: flannel's VXLAN device)".into(),
            CrossPath::OverlayNodes { nodes } => {
                format!("overlay, {} Nodes in the cluster", thousands(nodes))
            }
        }
    }
}

/// A figure of the Services section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServicesFigure {
    Throughput,
    RrP50,
    Crr,
    /// One more pod's ADD, wall time.
    AddMs,
    /// ebpf-cni's STATUS, wall time.
    StatusMs,
}

impl ServicesFigure {
    pub const ALL: [ServicesFigure; 5] = [
        ServicesFigure::Throughput,
        ServicesFigure::RrP50,
        ServicesFigure::Crr,
        ServicesFigure::AddMs,
        ServicesFigure::StatusMs,
    ];

    fn label(self) -> &'static str {
        match self {
            ServicesFigure::Throughput => "TCP throughput",
            ServicesFigure::RrP50 => "TCP_RR p50",
            ServicesFigure::Crr => "TCP_CRR",
            ServicesFigure::AddMs => "ADD",
            ServicesFigure::StatusMs => "STATUS",
        }
    }
}

/// Which path the Services section measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServicesPath {
    PodToPod,
    /// To the node's external host (behind its uplink), untranslated: no Service.
    PodToExternal,
    /// To a ClusterIP whose endpoint is a pod of the node.
    PodToClusterIp,
    /// To a ClusterIP whose endpoint is the node's external host.
    PodToClusterIpExternal,
}

impl ServicesPath {
    pub fn label(self) -> &'static str {
        match self {
            ServicesPath::PodToPod => "pod → pod",
            ServicesPath::PodToExternal => "pod → external host (no Service)",
            ServicesPath::PodToClusterIp => "pod → ClusterIP (a local pod)",
            ServicesPath::PodToClusterIpExternal => "pod → ClusterIP (an external host)",
        }
    }
}

/// How the netkit section's two pods are joined to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PodLink {
    /// A plain veth pair between the two pods' namespaces: no node at all.
    Veth,
    /// ebpf-cni's pods: a veth pair each, `ecni_from_pod` and `bpf_redirect_peer`.
    Product,
    /// The same veth pods with the routing floor at TC, `ecni_floor_pod`, in front.
    TcFloor,
    /// netkit pairs, the same floor as the pair's peer-side program (`ecni_floor_nk`).
    Netkit,
}

impl PodLink {
    pub const ALL: [PodLink; 4] = [
        PodLink::Veth,
        PodLink::Product,
        PodLink::TcFloor,
        PodLink::Netkit,
    ];
    /// The figures the section reports for this path: no ratios for the veth pair itself,
    /// run times per packet for the two floors only (the veth pair runs no program; the
    /// product's program is timed in the pod-path section).
    pub fn figures(self) -> &'static [PathFigure] {
        use PathFigure::*;
        match self {
            PodLink::Veth => &[RrP50, Crr],
            PodLink::Product => &[RrP50, RrOfVeth, Crr, CrrOfVeth],
            PodLink::TcFloor | PodLink::Netkit => &[RrP50, RrOfVeth, Crr, CrrOfVeth, FromPodNs],
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            PodLink::Veth => "plain veth pair",
            PodLink::Product => "ebpf-cni pods (veth, ecni_from_pod)",
            PodLink::TcFloor => "veth pods, the routing floor at TC (ecni_floor_pod)",
            PodLink::Netkit => "netkit pods, the same floor (ecni_floor_nk)",
        }
    }
}

/// How the netkit section's pod reaches the external host (not translated).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExtLink {
    /// A veth pod the node's kernel forwards (the reference's dataplane, without its rules).
    Kernel,
    /// ebpf-cni's veth pod: `ecni_from_pod`, the FIB and `bpf_redirect_neigh`.
    Product,
    /// A netkit pod with `ecni_from_pod` as its pair's peer-side program.
    Netkit,
}

impl ExtLink {
    pub const ALL: [ExtLink; 3] = [ExtLink::Kernel, ExtLink::Product, ExtLink::Netkit];

    pub fn label(self) -> &'static str {
        match self {
            ExtLink::Kernel => "veth pod forwarded by the node's kernel",
            ExtLink::Product => "ebpf-cni pod (veth, ecni_from_pod)",
            ExtLink::Netkit => "netkit pod, ecni_from_pod on its pair",
        }
    }

    /// The figures the section reports for this path (no ratios for the kernel's own).
    pub fn figures(self) -> &'static [ExtFigure] {
        use ExtFigure::*;
        match self {
            ExtLink::Kernel => &[Throughput, RrP50, Crr],
            _ => &[
                Throughput,
                ThroughputOfKernel,
                RrP50,
                RrOfKernel,
                Crr,
                CrrOfKernel,
            ],
        }
    }
}

/// A figure of the netkit section's pod → external host paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExtFigure {
    Throughput,
    /// Over the kernel-forwarded pod's, per repeat.
    ThroughputOfKernel,
    RrP50,
    RrOfKernel,
    Crr,
    CrrOfKernel,
}

impl ExtFigure {
    fn label(self) -> &'static str {
        match self {
            ExtFigure::Throughput => "TCP throughput pod → external host",
            ExtFigure::ThroughputOfKernel => {
                "TCP throughput pod → external host / the kernel's forwarding"
            }
            ExtFigure::RrP50 => "TCP_RR p50 pod → external host",
            ExtFigure::RrOfKernel => "TCP_RR p50 pod → external host / the kernel's forwarding",
            ExtFigure::Crr => "TCP_CRR pod → external host",
            ExtFigure::CrrOfKernel => "TCP_CRR pod → external host / the kernel's forwarding",
        }
    }
}

/// A figure of the XDP section, taken with the host-port DNAT at TC or at XDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum XdpFigure {
    Throughput,
    Crr,
    /// XDP's throughput over the TC mode's, per repeat.
    ThroughputXdpOver,
    /// XDP's TCP_CRR over the TC mode's, per repeat.
    CrrXdpOver,
}

impl XdpFigure {
    pub const ALL: [XdpFigure; 4] = [
        XdpFigure::Throughput,
        XdpFigure::Crr,
        XdpFigure::ThroughputXdpOver,
        XdpFigure::CrrXdpOver,
    ];

    fn label(self) -> &'static str {
        match self {
            XdpFigure::Throughput => "TCP throughput",
            XdpFigure::Crr => "TCP_CRR",
            XdpFigure::ThroughputXdpOver => "TCP throughput at XDP over",
            XdpFigure::CrrXdpOver => "TCP_CRR at XDP over",
        }
    }
}

/// How the XDP section's uplink runs: the host-port DNAT at TC with the external client's
/// offloads as a veth has them, at TC with the client sending full-checksum 1500-byte
/// frames (as a NIC's peer does), or at XDP with the same frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UplinkMode {
    TcOffload,
    Tc,
    Xdp,
}

impl UplinkMode {
    pub const ALL: [UplinkMode; 3] = [UplinkMode::TcOffload, UplinkMode::Tc, UplinkMode::Xdp];

    pub fn label(self) -> &'static str {
        match self {
            UplinkMode::TcOffload => "DNAT at TC, client offloads on (64 KB GSO)",
            UplinkMode::Tc => "DNAT at TC, client checksum offload off",
            UplinkMode::Xdp => "DNAT at XDP (native), client checksum offload off",
        }
    }
}

/// A figure of the pod → pod path section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PathFigure {
    RrP50,
    /// pod → pod's TCP_RR p50 over the veth pair's.
    RrOfVeth,
    Crr,
    /// pod → pod's TCP_CRR as a share of the veth pair's.
    CrrOfVeth,
    /// The mean run time per packet of `ecni_from_pod` (of `ecni_floor_pod` in the floor's
    /// state).
    FromPodNs,
    /// The same program's own run time for one pod → pod segment (`BPF_PROG_TEST_RUN`).
    TestRunNs,
    /// The node's cgroup programs' run time per TCP_CRR connection.
    CgroupNsPerConn,
}

impl PathFigure {
    pub const ALL: [PathFigure; 7] = [
        PathFigure::RrP50,
        PathFigure::RrOfVeth,
        PathFigure::Crr,
        PathFigure::CrrOfVeth,
        PathFigure::FromPodNs,
        PathFigure::TestRunNs,
        PathFigure::CgroupNsPerConn,
    ];

    fn label(self) -> &'static str {
        match self {
            PathFigure::RrP50 => "TCP_RR p50",
            PathFigure::RrOfVeth => "TCP_RR p50, pod → pod / plain veth",
            PathFigure::Crr => "TCP_CRR",
            PathFigure::CrrOfVeth => "TCP_CRR, pod → pod as % of plain veth",
            PathFigure::FromPodNs => "the pod program's run time per packet",
            PathFigure::TestRunNs => "the pod program, one pod → pod segment in BPF_PROG_TEST_RUN",
            PathFigure::CgroupNsPerConn => "cgroup programs' run time per connection",
        }
    }
}

/// An IPv4 TCP segment of the masquerade section's `BPF_PROG_TEST_RUN` figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MasqSegment {
    /// A pod that does not masquerade, to a routed destination (the control).
    Routed,
    /// A masqueraded flow's segment after its first.
    Established,
    /// A new flow's SYN, its port free.
    SynPortFree,
    /// A new flow's SYN taking the port of an idle closed flow.
    SynReclaim,
}

impl MasqSegment {
    pub const ALL: [MasqSegment; 4] = [
        MasqSegment::Routed,
        MasqSegment::Established,
        MasqSegment::SynPortFree,
        MasqSegment::SynReclaim,
    ];

    fn label(self) -> &'static str {
        match self {
            MasqSegment::Routed => "routed segment (not translated)",
            MasqSegment::Established => "established flow's segment",
            MasqSegment::SynPortFree => "new flow's SYN, port free",
            MasqSegment::SynReclaim => "new flow's SYN reclaiming an idle flow's port",
        }
    }
}

/// The state of the node in the pod → pod path section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PathPart {
    /// No host port, no limit on the node.
    Bare,
    /// The same node with `ecni_floor_pod` in front of the two pods' `ecni_from_pod`: the
    /// floor of routing pod → pod at TC (destination lookup, TTL and MACs,
    /// `bpf_redirect_peer`), without the features.
    Floor,
    /// A pod with a host port besides.
    HostPort,
    /// And a paced pod.
    Paced,
}

impl PathPart {
    pub const ALL: [PathPart; 4] = [
        PathPart::Bare,
        PathPart::Floor,
        PathPart::HostPort,
        PathPart::Paced,
    ];

    fn label(self) -> &'static str {
        match self {
            PathPart::Bare => "node without host port or limit",
            PathPart::Floor => "the routing floor ecni_floor_pod in front of ecni_from_pod",
            PathPart::HostPort => "+ a pod with a host port",
            PathPart::Paced => "+ a host port and a paced pod",
        }
    }
}

/// One figure of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Metric {
    // Lifecycle.
    AddP50,
    AddP95,
    CheckP50,
    CheckP95,
    DelP50,
    DelP95,
    FirstAdd,
    LaterAdds,
    /// The kernel floor of ADD (`bench/floor`): the same kernel work alone, run as a plugin
    /// process is, alternating with ebpf-cni's ADDs (ebpf-cni's column).
    FloorAdd,
    /// The same, timed inside the floor's process (no fork, exec or process start).
    FloorAddInProcess,
    /// ebpf-cni's ADD p50 over its kernel floor's, per repeat.
    AddOverFloor,
    /// The kernel floor of DEL: the map entries and the veth deleted, nothing else.
    FloorDel,
    /// ebpf-cni's DEL p50 over its kernel floor's, per repeat.
    DelOverFloor,
    /// CPU time of one ADD, in the resources table.
    AddCpu,
    /// The same, in the dual-stack table (named in full there).
    AddCpuDualStack,
    AddPeakRss,
    /// One plugin of the list alone.
    PluginAdd {
        plugin: String,
    },
    /// `concurrent` ADDs at once: the wall time of all.
    ConcurrentAdds {
        concurrent: usize,
    },
    ConcurrentDels,
    DistinctAddresses,
    FailedOperations,
    // Traffic.
    Throughput(PathKind),
    /// pod → pod as a share of the plain veth pair's.
    PodToPodOfVeth,
    RrP50(PathKind),
    RrP99(PathKind),
    Crr(PathKind),
    // Port-map scale.
    Scale {
        figure: ScaleFigure,
        k: usize,
    },
    // Bandwidth.
    PingIdle,
    /// Achieved / configured rate of one configuration.
    Accuracy {
        rate: u64,
        dir: Dir,
        udp: bool,
    },
    PingUnderLoad {
        rate: u64,
        dir: Dir,
    },
    /// The worst |median − 100%| over every configuration.
    WorstDeviation,
    // Cleanup.
    LeftAfterDels,
    // Masquerade.
    MasqThroughput,
    MasqCrr,
    /// The control: the same path not translated, the host routing back to the pods.
    MasqCrrRouted,
    MasqDroppedFlows,
    /// ebpf-cni's run time per packet of `ecni_from_dev` (`dev`) or `ecni_from_pod` over
    /// the TCP_CRR slices, masqueraded or on the control's untranslated path.
    MasqProgNs {
        dev: bool,
        masq: bool,
    },
    /// TCP throughput pod → external host on the control's untranslated path (ebpf-cni's
    /// FIB and redirect against the reference's kernel forwarding).
    MasqThroughputRouted,
    /// A subject's TCP_CRR masqueraded as a share of its untranslated rate, same repeat.
    MasqCrrShare,
    /// ebpf-cni's `ecni_from_pod` run time per packet of a bulk TCP stream (an established
    /// flow's packets, GSO), masqueraded or on the control's untranslated path.
    MasqBulkProgNs {
        masq: bool,
    },
    /// What masquerade adds to `ecni_from_pod` per packet, masqueraded less untranslated in
    /// the same repeat: over a bulk stream (`bulk`), or over TCP_CRR (every connection a new
    /// flow).
    MasqExtraNs {
        bulk: bool,
    },
    /// What masquerade adds per TCP_CRR connection, `ecni_from_pod` and `ecni_from_dev`
    /// together (run time per connection, masqueraded less untranslated).
    MasqExtraPerConn,
    /// `ecni_from_pod`'s own run time on one IPv4 TCP segment in `BPF_PROG_TEST_RUN` (the
    /// program tests' lab), by what the segment is to masquerade.
    MasqTestRunNs {
        segment: MasqSegment,
    },
    FlowsOffered,
    FlowsHeld,
    /// Held / offered, of `flows` opened at once.
    FlowsHeldShare {
        flows: usize,
    },
    FlowsDropped,
    FlowTableEntries,
    FlowTableCapacity,
    FlowSendTime,
    // Services next to kube-proxy: a path with kube-proxy's rules in the node or without.
    Services {
        figure: ServicesFigure,
        path: ServicesPath,
        rules: bool,
    },
    // Source check: pod → pod with the check on (the default) or off.
    SourceCheck {
        figure: SourceFigure,
        on: bool,
    },
    // External → hostPort with the DNAT at TC or at XDP (the prototype).
    Xdp {
        figure: XdpFigure,
        mode: UplinkMode,
    },
    // What pod → pod pays, part by part.
    PodPath {
        figure: PathFigure,
        part: PathPart,
    },
    // Pod → pod over veth and over netkit.
    Netkit {
        figure: PathFigure,
        link: PodLink,
    },
    // Pod → external host over veth and over netkit.
    NetkitExt {
        figure: ExtFigure,
        link: ExtLink,
    },
    // Metrics.
    MetricsRead {
        pods: usize,
    },
    MetricsProcessWall {
        pods: usize,
    },
    MetricsProcessCpu {
        pods: usize,
    },
    // The node following its addresses.
    StatusInLine {
        pods: usize,
    },
    StatusConverging {
        pods: usize,
    },
    AgentFollows {
        pods: usize,
    },
    AgentRss,
    // Pod → pod between two nodes.
    CrossNode {
        figure: CrossFigure,
        path: CrossPath,
    },
    // The cluster network from the Kubernetes API.
    /// From the agent's start to its routes to every other Node of `nodes`.
    ClusterAllRouted {
        nodes: usize,
    },
    /// The agent's VmRSS watching `nodes` Nodes.
    ClusterAgentRss {
        nodes: usize,
    },
    /// From a peer's Node object created to the first reply between pods on the two nodes.
    ClusterFirstReply,
    // The cluster network from etcd: the same figures.
    EtcdAllRouted {
        nodes: usize,
    },
    EtcdAgentRss {
        nodes: usize,
    },
    EtcdFirstReply,
    /// A figure as the headline table names it.
    Headline(Box<Metric>),
}

impl Metric {
    /// The row's name in its table.
    pub fn name(&self) -> String {
        use Metric::*;
        match self {
            AddP50 => "ADD p50".into(),
            AddP95 => "ADD p95".into(),
            CheckP50 => "CHECK p50".into(),
            CheckP95 => "CHECK p95".into(),
            DelP50 => "DEL p50".into(),
            DelP95 => "DEL p95".into(),
            FirstAdd => "first ADD on a fresh node".into(),
            LaterAdds => "later ADDs (p50)".into(),
            FloorAdd => "kernel floor of ADD: its kernel work alone, as a process, p50".into(),
            FloorAddInProcess => {
                "kernel floor of ADD, timed inside its process (no exec), p50".into()
            }
            AddOverFloor => "ADD p50 / kernel floor of ADD p50".into(),
            FloorDel => "kernel floor of DEL: the map entries and the veth deleted, p50".into(),
            DelOverFloor => "DEL p50 / kernel floor of DEL p50".into(),
            AddCpu => "CPU time (user+sys), p50".into(),
            AddCpuDualStack => "CPU time of one ADD (user+sys), p50".into(),
            AddPeakRss => "peak RSS, p50".into(),
            PluginAdd { plugin } => format!("ADD: `{plugin}` alone, p50"),
            ConcurrentAdds { .. } => "wall time of all ADDs".into(),
            ConcurrentDels => "wall time of all DELs".into(),
            DistinctAddresses => "distinct IPv4 addresses".into(),
            FailedOperations => "failed operations".into(),
            Throughput(p) => p.label().into(),
            PodToPodOfVeth => "pod → pod, % of plain veth".into(),
            RrP50(p) => format!("TCP_RR p50, {}", p.label()),
            RrP99(p) => format!("TCP_RR p99, {}", p.label()),
            Crr(p) => format!("TCP_CRR, {}", p.label()),
            Scale { figure, k } => format!("{}, K = {}", figure.label(), thousands(*k)),
            PingIdle => "ping pod → external, idle".into(),
            Accuracy {
                rate: r,
                dir,
                udp: true,
            } => format!(
                "{} {} limit, UDP sent at {}",
                rate(*r),
                dir.label(),
                rate(2 * r)
            ),
            Accuracy {
                rate: r,
                dir,
                udp: false,
            } => format!("{} {} limit, TCP", rate(*r), dir.label()),
            PingUnderLoad { rate: r, dir } => {
                format!("ping under that TCP load ({} {})", rate(*r), dir.label())
            }
            WorstDeviation => "largest deviation from the limit, any configuration".into(),
            LeftAfterDels => "left after the 4 DEL scenarios".into(),
            MasqThroughput => "TCP throughput, pod → external host".into(),
            MasqCrr => "TCP_CRR, pod → external host".into(),
            MasqCrrRouted => {
                "TCP_CRR, pod → external host, not translated (the host routes to the pods)".into()
            }
            MasqDroppedFlows => {
                "new flows the node dropped (all throughput and TCP_CRR runs)".into()
            }
            MasqProgNs { dev, masq } => format!(
                "{} run time per packet, TCP_CRR, {}",
                if *dev {
                    "ecni_from_dev"
                } else {
                    "ecni_from_pod"
                },
                if *masq {
                    "masqueraded"
                } else {
                    "not translated (control)"
                }
            ),
            MasqThroughputRouted => {
                "TCP throughput, pod → external host, not translated (the host routes to the pods)"
                    .into()
            }
            MasqCrrShare => "TCP_CRR masqueraded, share of the same path not translated".into(),
            MasqBulkProgNs { masq } => format!(
                "ecni_from_pod run time per packet, bulk TCP stream, {}",
                if *masq {
                    "masqueraded"
                } else {
                    "not translated (control)"
                }
            ),
            MasqExtraNs { bulk } => format!(
                "masquerade's extra ecni_from_pod run time per packet, {}",
                if *bulk {
                    "bulk TCP stream (established flow)"
                } else {
                    "TCP_CRR (every connection a new flow)"
                }
            ),
            MasqExtraPerConn => {
                "masquerade's extra run time per TCP_CRR connection (ecni_from_pod + ecni_from_dev)"
                    .into()
            }
            MasqTestRunNs { segment } => {
                format!("ecni_from_pod in BPF_PROG_TEST_RUN, {}", segment.label())
            }
            FlowsOffered => "flows offered".into(),
            FlowsHeld => "flows held by the node's flow table".into(),
            FlowsHeldShare { .. } => "held / offered".into(),
            FlowsDropped => "new flows dropped".into(),
            FlowTableEntries => "flow table entries after".into(),
            FlowTableCapacity => "flow table capacity".into(),
            FlowSendTime => "time to send the datagrams".into(),
            Services {
                figure: f @ (ServicesFigure::AddMs | ServicesFigure::StatusMs),
                rules,
                ..
            } => format!(
                "{}, {}",
                f.label(),
                if *rules {
                    "kube-proxy's rules in the node"
                } else {
                    "no rules"
                }
            ),
            Services {
                figure,
                path,
                rules,
            } => format!(
                "{}, {}, {}",
                figure.label(),
                path.label(),
                if *rules {
                    "kube-proxy's rules in the node"
                } else {
                    "no rules"
                }
            ),
            SourceCheck { figure, on } => format!(
                "{}, pod → pod, source check {}",
                figure.label(),
                if *on { "on" } else { "off" }
            ),
            Xdp {
                figure: f @ (XdpFigure::ThroughputXdpOver | XdpFigure::CrrXdpOver),
                mode,
            } => format!(
                "{} {}, external → hostPort",
                f.label(),
                match mode {
                    UplinkMode::TcOffload => "TC with the client's offloads on",
                    _ => "TC with the same frames",
                }
            ),
            Xdp { figure, mode } => {
                format!("{}, external → hostPort, {}", figure.label(), mode.label())
            }
            PodPath { figure, part } => format!("{}, {}", figure.label(), part.label()),
            Netkit { figure, link } => format!("{}, {}", figure.label(), link.label()),
            NetkitExt { figure, link } => format!("{}, {}", figure.label(), link.label()),
            MetricsRead { pods } => {
                let target = if *pods == METRICS_TARGET_PODS {
                    format!("target < {METRICS_TARGET_MS:.0} ms")
                } else {
                    format!(
                        "target < {METRICS_TARGET_MS:.0} ms at {} pods",
                        thousands(METRICS_TARGET_PODS)
                    )
                };
                format!(
                    "reading the maps (ebpf_cni_metrics_read_seconds), {} pods; {target}",
                    thousands(*pods)
                )
            }
            MetricsProcessWall { pods } => format!(
                "`ebpf-cni metrics` process, wall time, {} pods",
                thousands(*pods)
            ),
            MetricsProcessCpu { pods } => format!(
                "`ebpf-cni metrics` process, CPU time (user+sys), {} pods",
                thousands(*pods)
            ),
            StatusInLine { pods } => format!(
                "STATUS, node in line (nothing written), {} pods; target ≤ 5 ms",
                thousands(*pods)
            ),
            StatusConverging { pods } => format!(
                "STATUS converging a VIP added or removed, {} pods",
                thousands(*pods)
            ),
            AgentFollows { pods } => format!(
                "agent: address added → host ports answer on it, {} pods",
                thousands(*pods)
            ),
            AgentRss => "agent: resident memory (VmRSS)".into(),
            CrossNode { figure, path } => {
                format!("{}, pod → pod across nodes, {}", figure.label(), path.label())
            }
            ClusterAllRouted { nodes } => format!(
                "agent start → every other Node routed, {} Nodes",
                thousands(*nodes)
            ),
            ClusterAgentRss { nodes } => format!(
                "agent: resident memory (VmRSS) watching {} Nodes",
                thousands(*nodes)
            ),
            EtcdAllRouted { nodes } => format!(
                "agent start → every other node routed, {} nodes",
                thousands(*nodes)
            ),
            EtcdAgentRss { nodes } => format!(
                "agent: resident memory (VmRSS) with {} nodes",
                thousands(*nodes)
            ),
            EtcdFirstReply => {
                "a node's subnet record written → first reply between pods on the two nodes; target p50 ≤ 1 s"
                    .into()
            }
            ClusterFirstReply => {
                "a peer's Node created → first reply between pods on the two nodes; target p50 ≤ 1 s"
                    .into()
            }
            Headline(m) => m.headline_name(),
        }
    }

    /// The name in the headline table, where a row stands without its table's title.
    fn headline_name(&self) -> String {
        use Metric::*;
        match self {
            AddCpu => "CPU time of one ADD, p50".into(),
            AddPeakRss => "peak RSS of one ADD, p50".into(),
            AddOverFloor => "ADD p50 as a multiple of its kernel floor".into(),
            DelOverFloor => "DEL p50 as a multiple of its kernel floor".into(),
            ConcurrentAdds { concurrent } => format!("{concurrent} concurrent ADDs, wall time"),
            Throughput(p) => format!("TCP throughput {}", p.label()),
            PodToPodOfVeth => "pod → pod as % of plain veth".into(),
            MasqThroughput => "TCP throughput pod → external host, masqueraded".into(),
            MasqCrr => "TCP_CRR pod → external host, masqueraded".into(),
            MasqCrrRouted => "TCP_CRR pod → external host, routed back (control)".into(),
            FlowsHeldShare { flows } => format!(
                "masqueraded UDP flows held, of {} opened at once",
                thousands(*flows)
            ),
            m => m.name(),
        }
    }

    pub fn unit(&self) -> &'static str {
        use Metric::*;
        match self {
            AddP50
            | AddP95
            | CheckP50
            | CheckP95
            | DelP50
            | DelP95
            | FirstAdd
            | LaterAdds
            | FloorAdd
            | FloorAddInProcess
            | FloorDel
            | AddCpu
            | AddCpuDualStack
            | PluginAdd { .. }
            | ConcurrentAdds { .. }
            | ConcurrentDels
            | PingIdle
            | PingUnderLoad { .. }
            | MetricsRead { .. }
            | MetricsProcessWall { .. }
            | MetricsProcessCpu { .. }
            | StatusInLine { .. }
            | StatusConverging { .. }
            | AgentFollows { .. }
            | ClusterAllRouted { .. }
            | ClusterFirstReply
            | EtcdAllRouted { .. }
            | EtcdFirstReply => "ms",
            AddPeakRss | AgentRss | ClusterAgentRss { .. } | EtcdAgentRss { .. } => "MiB",
            AddOverFloor | DelOverFloor => "×",
            DistinctAddresses | FailedOperations => "",
            Throughput(_) | MasqThroughput => "Gbit/s",
            PodToPodOfVeth | FlowsHeldShare { .. } => "%",
            RrP50(_) | RrP99(_) => "µs",
            Crr(_) | MasqCrr | MasqCrrRouted => "conn/s",
            Scale { figure, .. } => match figure {
                ScaleFigure::ConnectFirst | ScaleFigure::ConnectNewest => "µs",
                ScaleFigure::OneMoreAdd | ScaleFigure::ControlAdd | ScaleFigure::OneMoreDel => "ms",
                ScaleFigure::Install => "s",
            },
            Accuracy { .. } | WorstDeviation => "% of limit",
            CrossNode { figure, .. } => match figure {
                CrossFigure::Throughput { .. } => "Gbit/s",
                CrossFigure::RrP50 => "µs",
                CrossFigure::Crr => "conn/s",
            },
            Services { figure, .. } => match figure {
                ServicesFigure::Throughput => "Gbit/s",
                ServicesFigure::RrP50 => "µs",
                ServicesFigure::Crr => "conn/s",
                ServicesFigure::AddMs | ServicesFigure::StatusMs => "ms",
            },
            SourceCheck { figure, .. } => match figure {
                SourceFigure::Throughput => "Gbit/s",
                SourceFigure::RrP50 | SourceFigure::RrP99 => "µs",
                SourceFigure::Crr => "conn/s",
                SourceFigure::ProgNs => "ns",
            },
            Xdp { figure, .. } => match figure {
                XdpFigure::Throughput => "Gbit/s",
                XdpFigure::Crr => "conn/s",
                XdpFigure::ThroughputXdpOver | XdpFigure::CrrXdpOver => "×",
            },
            NetkitExt { figure, .. } => match figure {
                ExtFigure::Throughput => "Gbit/s",
                ExtFigure::RrP50 => "µs",
                ExtFigure::Crr => "conn/s",
                ExtFigure::ThroughputOfKernel | ExtFigure::RrOfKernel | ExtFigure::CrrOfKernel => {
                    "×"
                }
            },
            PodPath { figure, .. } | Netkit { figure, .. } => match figure {
                PathFigure::RrP50 => "µs",
                PathFigure::RrOfVeth => "×",
                PathFigure::Crr => "conn/s",
                PathFigure::CrrOfVeth => "%",
                PathFigure::FromPodNs | PathFigure::TestRunNs | PathFigure::CgroupNsPerConn => "ns",
            },
            MasqProgNs { .. }
            | MasqBulkProgNs { .. }
            | MasqExtraNs { .. }
            | MasqExtraPerConn
            | MasqTestRunNs { .. } => "ns",
            MasqThroughputRouted => "Gbit/s",
            MasqCrrShare => "%",
            LeftAfterDels => "objects",
            MasqDroppedFlows | FlowsOffered | FlowsHeld | FlowsDropped => "flows",
            FlowTableEntries | FlowTableCapacity => "entries",
            FlowSendTime => "s",
            Headline(m) => m.unit(),
        }
    }

    pub fn better(&self) -> Better {
        use Metric::*;
        match self {
            DistinctAddresses
            | Throughput(_)
            | PodToPodOfVeth
            | Crr(_)
            | MasqThroughput
            | MasqCrr
            | MasqCrrRouted
            | MasqThroughputRouted
            | MasqCrrShare
            | FlowsHeld
            | FlowsHeldShare { .. }
            | FlowTableCapacity
            | SourceCheck {
                figure: SourceFigure::Throughput | SourceFigure::Crr,
                ..
            }
            | Services {
                figure: ServicesFigure::Throughput | ServicesFigure::Crr,
                ..
            }
            | CrossNode {
                figure: CrossFigure::Throughput { .. } | CrossFigure::Crr,
                ..
            }
            | PodPath {
                figure: PathFigure::Crr | PathFigure::CrrOfVeth,
                ..
            }
            | Netkit {
                figure: PathFigure::Crr | PathFigure::CrrOfVeth,
                ..
            }
            | NetkitExt {
                figure:
                    ExtFigure::Throughput
                    | ExtFigure::ThroughputOfKernel
                    | ExtFigure::Crr
                    | ExtFigure::CrrOfKernel,
                ..
            }
            | Xdp { .. } => Better::Higher,
            Accuracy { .. } | FlowsOffered | FlowTableEntries => Better::Neither,
            Headline(m) => m.better(),
            _ => Better::Lower,
        }
    }

    /// This figure as the headline names it.
    pub fn headline(self) -> Metric {
        match self {
            h @ Metric::Headline(_) => h,
            m => Metric::Headline(Box::new(m)),
        }
    }

    /// The label under a chart's bar: the path of a traffic figure, the configuration of a
    /// bandwidth one.
    pub fn short_label(&self) -> String {
        match self {
            Metric::Throughput(p) | Metric::RrP50(p) | Metric::RrP99(p) | Metric::Crr(p) => {
                p.short_label().to_owned()
            }
            Metric::Accuracy { rate: r, dir, udp } => {
                let short = rate(*r).replace(" Mbit/s", "M").replace(" Gbit/s", "G");
                format!(
                    "{short} {} {}",
                    dir.short(),
                    if *udp { "UDP" } else { "TCP" }
                )
            }
            m => m.name(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names the report has always used (results.json readers match on them).
    #[test]
    fn names_and_units() {
        let acc = |udp| Metric::Accuracy {
            rate: 10_000_000,
            dir: Dir::Ingress,
            udp,
        };
        assert_eq!(acc(false).name(), "10 Mbit/s ingress limit, TCP");
        assert_eq!(
            acc(true).name(),
            "10 Mbit/s ingress limit, UDP sent at 20 Mbit/s"
        );
        assert_eq!(acc(true).short_label(), "10M in UDP");
        assert_eq!(acc(true).unit(), "% of limit");
        let k = Metric::Scale {
            figure: ScaleFigure::ConnectNewest,
            k: 10_000,
        };
        assert_eq!(
            k.name(),
            "connect latency via the newest pod's hostPort, K = 10,000"
        );
        assert_eq!(
            Metric::Throughput(PathKind::ExtToHostPort)
                .headline()
                .name(),
            "TCP throughput external → hostPort → pod"
        );
        assert_eq!(
            Metric::ConcurrentAdds { concurrent: 32 }.headline().name(),
            "32 concurrent ADDs, wall time"
        );
        assert_eq!(Metric::LaterAdds.headline().name(), "later ADDs (p50)");
        assert_eq!(Metric::Crr(PathKind::PodToPod).better(), Better::Higher);
        let src = |figure, on| Metric::SourceCheck { figure, on };
        assert_eq!(
            src(SourceFigure::RrP50, false).name(),
            "TCP_RR p50, pod → pod, source check off"
        );
        assert_eq!(src(SourceFigure::Crr, true).better(), Better::Higher);
        assert_eq!(src(SourceFigure::RrP99, true).better(), Better::Lower);
        assert_eq!(src(SourceFigure::Throughput, true).unit(), "Gbit/s");
        let syn = Metric::MasqTestRunNs {
            segment: MasqSegment::SynReclaim,
        };
        assert_eq!(
            syn.name(),
            "ecni_from_pod in BPF_PROG_TEST_RUN, new flow's SYN reclaiming an idle flow's port"
        );
        assert_eq!((syn.unit(), syn.better()), ("ns", Better::Lower));
        let svc = |path, rules| Metric::Services {
            figure: ServicesFigure::Crr,
            path,
            rules,
        };
        assert_eq!(
            svc(ServicesPath::PodToClusterIp, true).name(),
            "TCP_CRR, pod → ClusterIP (a local pod), kube-proxy's rules in the node"
        );
        assert_eq!(
            svc(ServicesPath::PodToExternal, false).name(),
            "TCP_CRR, pod → external host (no Service), no rules"
        );
        assert_eq!(
            svc(ServicesPath::PodToClusterIpExternal, true).better(),
            Better::Higher
        );
        assert_eq!(
            Metric::MetricsRead { pods: 1_000 }.name(),
            "reading the maps (ebpf_cni_metrics_read_seconds), 1,000 pods; target < 100 ms"
        );
    }
}
