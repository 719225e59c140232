//! What can go wrong between the plugin and the kernel's BPF subsystem.

use std::{fmt, io, path::PathBuf};

use crate::cni::code;

/// Errors of the `bpf` module. Messages say what failed and where; the cause is the
/// `source`, never repeated in the message. aya's errors are boxed: they are large, and
/// every `Result` here would carry their size.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("this binary was built without its eBPF programs; build with `cargo xtask build`")]
    NotBuilt,

    #[error("invalid attachment {field} {value:?}: must be non-empty, not `.` or `..`, without `/` or NUL")]
    InvalidKey { field: &'static str, value: String },

    #[error("failed to read the network namespace of the calling thread at {path}")]
    NodeId {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("failed to check whether {path} is a bpf filesystem")]
    StatBpffs {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },

    #[error("failed to lock {path} while mounting bpffs")]
    LockBpffs {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("failed to mount a bpf filesystem at {path}")]
    MountBpffs {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },

    /// Only for a root chosen with `EBPF_CNI_BPFFS_ROOT`: we mount nothing there.
    #[error("{path} is not a bpf filesystem")]
    NotBpffs { path: PathBuf },

    #[error("failed to create the pin directory {path}")]
    CreatePinDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("failed to list the pin directory {path}")]
    ReadPinDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("failed to load the embedded eBPF object")]
    Load {
        #[source]
        source: Box<aya::EbpfError>,
    },

    #[error("the embedded eBPF object has no program {name}")]
    MissingProgram { name: &'static str },
    #[error("failed to prepare program {name}")]
    Program {
        name: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },

    #[error("failed to attach program {name} to {ifname} ({direction})")]
    Attach {
        name: &'static str,
        ifname: String,
        direction: &'static str,
        #[source]
        source: io::Error,
    },

    /// A node device the device program could not be attached to: the traffic that
    /// arrives on it for pods (host ports, replies to masqueraded flows) would miss them.
    #[error("node device {ifname} could not get the device program, so host ports and masqueraded replies arriving on it would not reach pods")]
    NodeDevice {
        ifname: String,
        #[source]
        source: Box<BpfError>,
    },

    /// Every failure is listed in the message (there is no single source).
    #[error(
        "failed to remove {} entries of the attachment at {dir}: {}",
        failures.len(),
        Joined(failures, std::convert::identity)
    )]
    Detach {
        dir: PathBuf,
        failures: Vec<RemoveFailure>,
    },

    /// A teardown (DEL of an attachment) that went on past its failures: every one, in
    /// order, each with its causes (there is no single source).
    #[error("{what} failed in {} steps: {}", failures.len(), Joined(failures, Chain))]
    Incomplete {
        what: &'static str,
        failures: Vec<BpfError>,
    },

    /// ADD failed (`error`), and undoing what it had done failed too (`undo`): the error
    /// with its causes, then every failure of the undo with its causes.
    #[error(
        "{}; undoing the ADD failed too: {}",
        Chain(error),
        Joined(undo, Chain)
    )]
    AddUndone {
        error: Box<BpfError>,
        undo: Vec<BpfError>,
    },

    #[error("failed to count the possible CPUs")]
    Cpus {
        #[source]
        source: io::Error,
    },

    #[error("failed to attach program {name} to {ifname} ({direction})")]
    AttachTcx {
        name: &'static str,
        ifname: String,
        direction: &'static str,
        #[source]
        source: io::Error,
    },

    #[error("failed to pin link at {path}")]
    PinTcxLink {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("address {ip} is already used on this node by another attachment (host veth ifindex {host_ifindex}): networks with overlapping subnets cannot share a node")]
    AddressInUse {
        ip: std::net::IpAddr,
        host_ifindex: u32,
    },

    #[error("failed to update the gateway use record {path}")]
    GatewayRecord {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("failed to lock {path}")]
    NodeLock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("failed to {what} in map {map}")]
    MapUpdate {
        map: &'static str,
        what: String,
        #[source]
        source: Box<aya::maps::MapError>,
    },

    #[error("failed to pin program {name} at {path}")]
    PinProgram {
        path: PathBuf,
        name: &'static str,
        #[source]
        source: Box<aya::pin::PinError>,
    },

    /// Netlink mode: the record of a filter (its program pinned in the attachment's or the
    /// device's directory).
    #[error("failed to pin program {name} at {path}")]
    PinRecord {
        path: PathBuf,
        name: &'static str,
        #[source]
        source: io::Error,
    },

    #[error("failed to open the pinned program at {path}")]
    OpenProgram {
        path: PathBuf,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },

    #[error("failed to remove the node's eBPF state at {path}")]
    NodeTeardown {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("failed to {what} of host veth ifindex {ifindex}")]
    Qdisc {
        what: &'static str,
        ifindex: u32,
        #[source]
        source: io::Error,
    },

    // CHECK: the attachment is missing or differs from what ADD set up.
    #[error("host veth ifindex {ifindex} of a pod whose ingress limit is paced has root qdisc {found}, not the fq that releases the paced packets")]
    PacingQdiscMissing { ifindex: u32, found: String },
    #[error("host veth ifindex {ifindex} of a pod without an ingress limit still has ebpf-cni's fq qdisc")]
    PacingQdiscLeft { ifindex: u32 },
    #[error("subnet map holds {actual} for host veth ifindex {ifindex}, the config's unshapedSubnets/shapedSubnets ask for {expected}")]
    ShapeSubnetsStale {
        ifindex: u32,
        actual: String,
        expected: String,
    },
    #[error("rate limiter of host veth ifindex {ifindex} holds {actual}, the config asks for {expected}")]
    LimitMismatch {
        ifindex: u32,
        actual: String,
        expected: String,
    },
    #[error("counters of host veth ifindex {ifindex} say the pod has no {what} (flags {flags:#x} on CPU {cpu}), but it has one")]
    CountersStale {
        ifindex: u32,
        what: &'static str,
        cpu: usize,
        flags: u64,
    },
    #[error("endpoint map has no entry for pod address {ip}")]
    EndpointMissing { ip: std::net::IpAddr },
    #[error("endpoint map entry for {ip} is stale: {field} is {actual}, expected {expected}")]
    EndpointStale {
        ip: std::net::IpAddr,
        field: &'static str,
        actual: String,
        expected: String,
    },
    #[error("{what} pin missing at {path}")]
    PinMissing { what: &'static str, path: PathBuf },
    #[error("source check of host veth ifindex {ifindex} is {actual}, expected {expected}")]
    SourceStale {
        ifindex: u32,
        actual: String,
        expected: String,
    },

    #[error("link {link} at {path} is not a TCX link (link type {link_type})")]
    NotTcxLink {
        link: &'static str,
        path: PathBuf,
        link_type: u32,
    },

    #[error("link {link} at {path} is no longer attached to any device")]
    LinkDefunct { link: &'static str, path: PathBuf },

    #[error("link {link} is attached to ifindex {actual}, expected {expected}")]
    WrongIfindex {
        link: &'static str,
        actual: u32,
        expected: u32,
    },

    #[error("link {link} has attach type {actual}, expected {expected}")]
    WrongAttachType {
        link: &'static str,
        actual: u32,
        expected: u32,
    },

    #[error("link {link} runs program {actual:?}, expected {expected:?}")]
    WrongProgram {
        link: &'static str,
        actual: String,
        expected: &'static str,
    },

    // Reading pins back.
    #[error("failed to open the pinned object at {path}")]
    OpenPin {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("failed to read the kernel's information on the object pinned at {path}")]
    PinInfo {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("failed to open the map pinned at {path}")]
    OpenMap {
        path: PathBuf,
        #[source]
        source: Box<aya::maps::MapError>,
    },

    // Host port mappings.
    #[error("hostPort {mapping} is already mapped to {pod}:{pod_port} (another pod, host veth ifindex {host_ifindex}); a host port serves one pod")]
    PortInUse {
        mapping: String,
        pod: std::net::IpAddr,
        pod_port: u16,
        host_ifindex: u32,
    },

    #[error("port mapping {mapping} is missing from the node's port-mapping map")]
    PortMappingMissing { mapping: String },

    #[error("TCP pacing of the pod's namespace is {actual}, expected {expected}")]
    PacingStale { actual: String, expected: String },

    #[error("port mapping {mapping} points to {actual}, expected {expected}")]
    PortMappingStale {
        mapping: String,
        actual: String,
        expected: String,
    },

    #[error("failed to pin the attachment's port list at {path}")]
    PinPorts {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("kernel {release} is older than {minimum}, the oldest ebpf-cni supports: it lacks {missing}")]
    KernelTooOld {
        release: String,
        minimum: String,
        missing: &'static str,
    },

    #[error("tcAttachMode \"tcx\" needs TCX links (kernel 6.6 or later), and kernel {release} has none: use \"auto\" or \"netlink\"")]
    NoTcx { release: String },

    #[error("failed to read the node network namespace's cookie (SO_NETNS_COOKIE, Linux 5.14+)")]
    NetnsCookie {
        #[source]
        source: io::Error,
    },

    #[error("failed to learn the node network namespace's cookie through ecni_connect4 (no SO_NETNS_COOKIE before Linux 5.14): {step}")]
    NetnsProbe {
        step: &'static str,
        #[source]
        source: io::Error,
    },

    #[error("failed to find or open the cgroup v2 root at {path}")]
    Cgroup {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("failed to attach socket program {name} to the cgroup v2 root")]
    AttachCgroup {
        name: &'static str,
        #[source]
        source: io::Error,
    },

    #[error("failed to detach a program from the cgroup v2 root (its link's pin {path})")]
    DetachCgroup {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("ipMasqPortRange {asked} differs from the range the node's masquerading pods use, {current}: the range is node-wide and changes only when no masquerading pod is left")]
    MasqPortRange { asked: String, current: String },

    #[error("masquerade state of the node is incomplete: {missing}")]
    MasqMissing { missing: String },

    #[error("failed to read CLOCK_MONOTONIC (the programs' clock)")]
    Clock {
        #[source]
        source: io::Error,
    },

    #[error("failed to update the node's reserved ports at {path}")]
    ReservedPorts {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error(
        "the link pinned at {path} is not a live cgroup link of {expected:?} (program {actual:?})"
    )]
    SockLinkStale {
        path: PathBuf,
        expected: &'static str,
        actual: String,
    },
}

impl BpfError {
    /// The CNI error code this error is reported with.
    pub fn cni_code(&self) -> u32 {
        match self {
            Self::PinMissing { .. }
            | Self::NotTcxLink { .. }
            | Self::LinkDefunct { .. }
            | Self::WrongIfindex { .. }
            | Self::WrongAttachType { .. }
            | Self::WrongProgram { .. }
            | Self::EndpointMissing { .. }
            | Self::LimitMismatch { .. }
            | Self::ShapeSubnetsStale { .. }
            | Self::PacingQdiscMissing { .. }
            | Self::PacingQdiscLeft { .. }
            | Self::EndpointStale { .. }
            | Self::CountersStale { .. }
            | Self::PortMappingMissing { .. }
            | Self::PortMappingStale { .. }
            | Self::PacingStale { .. }
            | Self::SockLinkStale { .. }
            | Self::MasqMissing { .. }
            | Self::SourceStale { .. } => code::CHECK_FAILED,
            Self::AddressInUse { .. } | Self::NoTcx { .. } | Self::MasqPortRange { .. } => {
                code::INVALID_CONFIG
            }
            Self::PortInUse { .. } => code::PORT_IN_USE,
            // The caller promised validated values: this is a bug, not a bad config.
            Self::InvalidKey { .. } => code::INTERNAL,
            // As `CniError::merged` reports several failures: under the first one's code.
            Self::Incomplete { failures, .. } => {
                failures.first().map_or(code::BPF, BpfError::cni_code)
            }
            Self::AddUndone { error, .. } => error.cni_code(),
            Self::NodeDevice { source, .. } => source.cni_code(),
            _ => code::BPF,
        }
    }
}

/// The failures of a teardown: none is `Ok`, one is itself, more are
/// [`BpfError::Incomplete`]. Each is logged here, with its causes, as it is the teardown's
/// record of what was left behind.
pub fn collect(what: &'static str, failures: Vec<BpfError>) -> Result<(), BpfError> {
    log_each(what, &failures);
    crate::cni::error::collect(failures, |failures| BpfError::Incomplete { what, failures })
}

/// Logs each failure of `what` with its causes.
pub fn log_each(what: &str, failures: &[BpfError]) {
    for f in failures {
        log::warn!("{what}: {}", Chain(f));
    }
}

/// An error with its causes on one line (`msg: cause: cause`).
struct Chain<'a>(&'a BpfError);

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        for line in crate::cni::error::source_lines(self.0) {
            write!(f, ": {line}")?;
        }
        Ok(())
    }
}

/// The items of a list, each shown through the function, separated by `; `.
struct Joined<'a, T, D>(&'a [T], fn(&'a T) -> D);

impl<'a, T, D: fmt::Display> fmt::Display for Joined<'a, T, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, item) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}", (self.1)(item))?;
        }
        Ok(())
    }
}

/// One pin or directory that `detach` could not remove.
#[derive(Debug)]
pub struct RemoveFailure {
    pub path: PathBuf,
    pub source: io::Error,
}

impl fmt::Display for RemoveFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.source)
    }
}
