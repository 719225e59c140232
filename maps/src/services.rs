//! Kubernetes Services next to kube-proxy: which packets the programs hand to the node's
//! stack so that netfilter (kube-proxy's iptables or nftables rules, IPVS) translates both
//! directions of a Service's flows, while every flow no rule touches keeps the redirect
//! path.
//!
//! Two maps decide it. [`SERVICES_NETS_MAP`] holds the Service addresses user space
//! learned from kube-proxy's rules (ClusterIPs, external and load-balancer IPs): a pod's
//! packet to one of them goes to the stack, and its flow is recorded in
//! [`SERVICES_FLOWS_MAP`] with no peer (replies from an endpoint outside the node come
//! back to the pod's address and port, whatever the endpoint). A packet the stack itself
//! forwards into a pod (the DNATed side of a Service flow, a NodePort, IPVS) is recorded
//! there too, from the pod's side with its peer, by the pod's egress program: the pod's
//! replies in that flow go back to the stack, which un-NATs them.

/// Node-wide LPM trie of Service addresses: an LPM key of a 16-byte address (IPv4 mapped
/// into IPv6, its prefix length counting the 96 mapping bits) → `u32`, kube-proxy's
/// masquerade mark (0x4000 by default; 0 where none was learned), which a masquerading
/// pod's packets to the Service carry so that kube-proxy's own rule masquerades them.
pub const SERVICES_NETS_MAP: &str = "ECNI_SVC_NETS";
/// Node-wide LRU hash of the flows the stack translates: [`ServicesFlowKey`] →
/// [`ServicesFlow`].
pub const SERVICES_FLOWS_MAP: &str = "ECNI_SVC_FLOWS";
/// Node-wide per-CPU array with one [`ServicesStats`].
pub const SERVICES_STATS_MAP: &str = "ECNI_SVC_STAT";
/// Capacity of [`SERVICES_NETS_MAP`]: Service addresses on a node.
pub const MAX_SERVICES_NETS: u32 = 65_536;
/// Capacity of [`SERVICES_FLOWS_MAP`]: flows through the stack at once (the kernel evicts
/// the least recently used; an evicted flow that is still alive would see its replies take
/// the redirect path, so this is sized well above a node's Service connections).
pub const MAX_SERVICES_FLOWS: u32 = 131_072;
/// A flow value: a pod's flow to a Service address (the key has no peer).
pub const SERVICES_FLOW_CLIENT: u32 = 1;
/// A flow value: the stack delivered the flow into the pod (the key names the peer).
pub const SERVICES_FLOW_DELIVERED: u32 = 2;
/// `skb->mark` of a packet the programs themselves redirect to a paced pod's host veth
/// egress (not the stack's): the egress program clears it and records nothing.
pub const SERVICES_MARK_PACED: u32 = 0xec0f_0001;

/// How long a pod's flow to a Service counts as alive after the last packet seen in it
/// ([`SERVICES_FLOW_CLIENT`]): TCP until a FIN or RST and [`SERVICES_TCP_CLOSED_NS`] more
/// (conntrack's TIME_WAIT), else [`SERVICES_TCP_IDLE_NS`] (conntrack's established
/// timeout); UDP and SCTP [`SERVICES_IDLE_NS`] (conntrack's longest: SCTP's established
/// 210 s, UDP's stream 120 s). While it lives, every packet of the pod's port goes through
/// the stack, a direct flow's too (its answers arrive for the same address and port).
pub const SERVICES_TCP_CLOSED_NS: u64 = 120_000_000_000;
pub const SERVICES_TCP_IDLE_NS: u64 = 432_000_000_000_000;
pub const SERVICES_IDLE_NS: u64 = 210_000_000_000;

/// A recorded flow: when it was last seen (client flows; `bpf_ktime_get_ns`), which kind,
/// and whether a FIN or RST was seen in it (TCP client flows).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServicesFlow {
    pub seen_ns: u64,
    pub kind: u32,
    pub closing: u32,
}

const _: () = assert!(core::mem::size_of::<ServicesFlow>() == 16);

/// A flow as the pod sees it: its own address and port, the peer's (all zero in a
/// [`SERVICES_FLOW_CLIENT`] entry), and the transport protocol.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ServicesFlowKey {
    pub pod: [u8; 16],
    pub peer: [u8; 16],
    pub pod_port: u16,
    pub peer_port: u16,
    pub proto: u8,
    pub _pad: [u8; 3],
}

const _: () = assert!(core::mem::size_of::<ServicesFlowKey>() == 40);

/// What the programs handed to the stack for Services, per CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServicesStats {
    /// Packets of pods to a Service address.
    pub to_service: u64,
    /// Packets of pods in flows the stack delivered to them (their replies).
    pub replies: u64,
    /// Packets from outside the node to a pod in one of its Service flows.
    pub from_outside: u64,
    /// Flows recorded (new entries of [`SERVICES_FLOWS_MAP`]).
    pub recorded: u64,
    /// Flows that could not be recorded (the map refused the entry).
    pub record_failed: u64,
    /// Records of dead flows dropped because a flow the programs forward reused their
    /// tuple.
    pub forgotten: u64,
    /// Packets of pods from a port a live Service flow holds, to elsewhere (to the stack
    /// too).
    pub shared_port: u64,
}

const _: () = assert!(core::mem::size_of::<ServicesStats>() == 56);

plain_old_data!(ServicesFlowKey, ServicesFlow, ServicesStats);

const _: () = assert!(crate::names::fits_bpf_obj_name(SERVICES_NETS_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(SERVICES_FLOWS_MAP));
const _: () = assert!(crate::names::fits_bpf_obj_name(SERVICES_STATS_MAP));
