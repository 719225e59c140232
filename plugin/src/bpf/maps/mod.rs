//! The node-wide maps, opened from their pins: `Maps` (endpoints, per-pod counters, limits,
//! pacing, source check) opened in `open.rs`, with its parts by concern in `endpoints.rs`,
//! `bandwidth.rs` and `source_check.rs`, and the host-port maps in `host_ports.rs`. The programs are `programs.rs`'s, the node's lock `lock.rs`'s, the
//! keys `keys.rs`'s.

mod bandwidth;
mod endpoints;
pub mod host_ports;
mod open;
mod source_check;

pub use bandwidth::any_pacing;
pub use endpoints::{ensure_free_in, CounterHints, PodEndpoint};
pub use source_check::is_one_of;
pub use source_check::{PodSources, SourceCheck, SourceRecord};

pub use super::keys::{endpoint_key, key_ip};
pub use open::Maps;
pub(in crate::bpf) use open::{is_not_found, open_map_err, open_pinned};
