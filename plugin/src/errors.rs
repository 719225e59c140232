//! Where typed errors from the library modules become CNI errors (the edge).

use crate::{
    add::AddError,
    attachment::{AttachmentError, CheckError},
    bandwidth::BandwidthError,
    bpf::BpfError,
    chained::ChainedError,
    cni::{
        args::ArgsError, code, config::ConfigError, env::EnvError, gc::GcListError,
        types::ResultError, version::VersionError, CniError,
    },
    gateway::GatewayError,
    host_ports::PortmapError,
    ipam::{backend::BackendError, delegate::DelegateError, IpamError},
    netlink::NetlinkError,
    netns::NetnsError,
    node::Failpoint,
    source_check::SourceCheckError,
};

impl From<NetlinkError> for CniError {
    fn from(e: NetlinkError) -> Self {
        let c = match &e {
            NetlinkError::Netns(_) => code::NETNS,
            _ => code::KERNEL,
        };
        CniError::from_error(c, &e)
    }
}

impl From<NetnsError> for CniError {
    fn from(e: NetnsError) -> Self {
        CniError::from_error(code::NETNS, &e)
    }
}

/// The library errors that say their own code (`cni_code()`).
macro_rules! by_their_code {
    ($($t:ty),*) => {$(
        impl From<$t> for CniError {
            fn from(e: $t) -> Self {
                CniError::from_error(e.cni_code(), &e)
            }
        }
    )*};
}

by_their_code!(
    BpfError,
    EnvError,
    ArgsError,
    ConfigError,
    VersionError,
    ResultError,
    IpamError,
    DelegateError,
    BackendError,
    AddError,
    BandwidthError,
    PortmapError,
    GcListError,
    GatewayError,
    CheckError,
    ChainedError,
    AttachmentError,
    SourceCheckError,
    Failpoint
);

impl From<std::io::Error> for CniError {
    fn from(e: std::io::Error) -> Self {
        CniError::from_error(code::IO_FAILURE, &e)
    }
}
