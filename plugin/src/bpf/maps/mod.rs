//! The node-wide maps, opened from their pins: `Maps` (endpoints, per-pod counters, limits,
//! pacing, source check) opened in `open.rs`, with its parts by concern in `endpoints.rs`,
//! `limits.rs` and `sources.rs`, and the host-port maps in `ports.rs`. The programs are `programs.rs`'s, the node's lock `lock.rs`'s, the
//! keys `keys.rs`'s.

mod endpoints;
mod limits;
mod open;
pub mod ports;
mod sources;

pub use endpoints::{ensure_free_in, CounterHints, PodEndpoint};
pub use limits::any_pacing;
pub use sources::is_one_of;
pub use sources::{PodSources, SourceCheck, SourceRecord};

pub use super::keys::{endpoint_key, key_ip};
pub use open::Maps;
pub(in crate::bpf) use open::{is_not_found, open_map_err, open_pinned};
