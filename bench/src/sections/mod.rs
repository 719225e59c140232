//! The sections of a run, each measuring both CNI subjects (and the plain veth where it
//! applies) and returning its tables: [`lifecycle`], [`traffic`], [`scale`], [`bandwidth`]
//! (on this machine, or in a kernel guest: [`guest`]), [`cleanup`], [`masquerade`],
//! [`metrics`], [`source_check`], [`node`], [`pod_path`], [`xdp`], [`netkit`] (on this
//! machine where its kernel has netkit, else in a guest) [`services`] and [`cluster`]. They share nothing but the rig and
//! the model.

pub mod bandwidth;
pub mod cleanup;
pub mod cluster;
pub mod guest;
pub mod lifecycle;
pub mod masquerade;
pub mod metrics;
pub mod netkit;
pub mod node;
pub mod pod_path;
pub mod scale;
pub mod services;
pub mod source_check;
pub mod traffic;
pub mod xdp;
