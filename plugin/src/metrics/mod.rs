//! `ebpf-cni metrics`: the node's counters in the Prometheus text exposition format, built
//! by [`crate::report`] from the same report `inspect` prints (so the pinned maps have one
//! reader; per-CPU values arrive summed). Writing the text atomically and serving it over
//! HTTP live in [`output`] and [`http`].

pub mod http;
pub mod output;

/// `Content-Type` of the exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
