//! What the sections measure with: the binaries started from disk ([`cache`]), nodes and
//! pods on the test harness's namespaces ([`topo`]), plugin processes timed with their
//! resource usage ([`exec`]), traffic generators ([`load`]), the programs' run-time
//! statistics ([`progstats`]), the plugin's object loaded into a node's maps for the
//! programs it never loads ([`object`]), the routing floors built on it ([`floor`],
//! [`netkit`]) and the machine's description and idle wait ([`machine`]).

pub mod cache;
pub mod exec;
pub mod floor;
pub mod load;
pub mod machine;
pub mod netkit;
pub mod object;
pub mod progstats;
pub mod topo;
