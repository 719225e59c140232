//! Program names: every program of the two objects, and which object holds which.

/// Sockops program (cgroup v2 root) setting `SO_MAX_PACING_RATE` on limited pods' sockets.
pub const PROG_SOCKOPS: &str = "ecni_sockops";

/// Socket-address programs (attached to the cgroup v2 root, acting only on sockets of the
/// node's network namespace): they translate the node's own connections and datagrams to a
/// host port into connections to the pod, and make replies look as if the host port sent
/// them.
pub const PROG_CONNECT4: &str = "ecni_connect4";
pub const PROG_CONNECT6: &str = "ecni_connect6";
pub const PROG_SENDMSG4: &str = "ecni_sendmsg4";
pub const PROG_SENDMSG6: &str = "ecni_sendmsg6";
pub const PROG_RECVMSG4: &str = "ecni_recvmsg4";
pub const PROG_RECVMSG6: &str = "ecni_recvmsg6";
pub const PROG_PEERNAME4: &str = "ecni_peername4";
pub const PROG_PEERNAME6: &str = "ecni_peername6";

/// TC program at the host veth's ingress: traffic leaving the pod.
pub const PROG_FROM_POD: &str = "ecni_from_pod";
/// TC program at the host veth's egress: traffic the node's stack sends into the pod.
pub const PROG_TO_POD: &str = "ecni_to_pod";
/// TC program at the ingress of the node's external devices: traffic arriving for pods.
pub const PROG_FROM_DEV: &str = "ecni_from_dev";
/// The XDP prototype of `ecni_from_dev`'s host-port path: in the benchmark's object, for
/// its `xdp` section and the program tests, never in the plugin's (docs/dataplane.md).
pub const PROG_XDP_DEV: &str = "ecni_xdp_dev";
/// The floor of routing pod → pod at TC: what any program on a pod's host veth must do to
/// deliver to a local pod (the destination's endpoint, TTL and MACs, `bpf_redirect_peer`)
/// and nothing else. In the benchmark's object, for its pod-path section and the program
/// tests, never in the plugin's.
pub const PROG_FLOOR_POD: &str = "ecni_floor_pod";
/// The same floor for pods behind netkit devices (Linux 6.7+): `bpf_redirect` out of the
/// destination's netkit primary device instead of `bpf_redirect_peer`. For the benchmark's
/// netkit section only, which attaches it as the peer-side program of two netkit pairs.
pub const PROG_FLOOR_NETKIT: &str = "ecni_floor_nk";
/// Host veth ingress of a pod another plugin created (chained mode): limits, counters and
/// host-port translation only; untranslated packets go on to that plugin's bridge or routes.
pub const PROG_FROM_CHAIN: &str = "ecni_from_chain";
/// TC program at the egress of the cluster network's VXLAN device: sets the tunnel key
/// towards the peer holding the destination.
pub const PROG_TO_TUNNEL: &str = "ecni_to_tunnel";

/// Every program the plugin loads: the object it embeds holds these and no other
/// (`cargo xtask dist` checks the release's).
pub const PLUGIN_PROGRAMS: [&str; 14] = [
    PROG_FROM_POD,
    PROG_TO_POD,
    PROG_FROM_DEV,
    PROG_FROM_CHAIN,
    PROG_TO_TUNNEL,
    PROG_CONNECT4,
    PROG_CONNECT6,
    PROG_SENDMSG4,
    PROG_SENDMSG6,
    PROG_RECVMSG4,
    PROG_RECVMSG6,
    PROG_PEERNAME4,
    PROG_PEERNAME6,
    PROG_SOCKOPS,
];
/// The benchmark's prototypes: only in its own object (the eBPF crate's `prototypes`
/// feature), beside [`PLUGIN_PROGRAMS`].
pub const PROTOTYPE_PROGRAMS: [&str; 3] = [PROG_XDP_DEV, PROG_FLOOR_POD, PROG_FLOOR_NETKIT];

const _: () = assert!(crate::names::fits_bpf_obj_name(PROG_FROM_POD));
const _: () = assert!(crate::names::fits_bpf_obj_name(PROG_TO_POD));
const _: () = assert!(crate::names::fits_bpf_obj_name(PROG_FROM_DEV));
const _: () = assert!(crate::names::fits_bpf_obj_name(PROG_XDP_DEV));
const _: () = assert!(crate::names::fits_bpf_obj_name(PROG_FLOOR_POD));
const _: () = assert!(crate::names::fits_bpf_obj_name(PROG_FLOOR_NETKIT));
const _: () = assert!(crate::names::fits_bpf_obj_name(PROG_FROM_CHAIN));
const _: () = assert!(crate::names::fits_bpf_obj_name(PROG_TO_TUNNEL));
const _: () = assert!(crate::names::fits_bpf_obj_name(PROG_SOCKOPS));
const _: () = assert!(crate::names::fits_bpf_obj_name(PROG_CONNECT4));
const _: () = assert!(crate::names::fits_bpf_obj_name(PROG_CONNECT6));
const _: () = assert!(crate::names::fits_bpf_obj_name(PROG_SENDMSG4));
const _: () = assert!(crate::names::fits_bpf_obj_name(PROG_SENDMSG6));
const _: () = assert!(crate::names::fits_bpf_obj_name(PROG_RECVMSG4));
const _: () = assert!(crate::names::fits_bpf_obj_name(PROG_RECVMSG6));
const _: () = assert!(crate::names::fits_bpf_obj_name(PROG_PEERNAME4));
const _: () = assert!(crate::names::fits_bpf_obj_name(PROG_PEERNAME6));
