//! Developer tasks behind `cargo xtask`, as a library so tasks can call each other (`test`,
//! `demo` and `vmtest` all start with [`prepare::prepare`]) and the benchmark crate
//! (`bench/`, which `bench` runs) can use them too.

pub mod apt;
pub mod bench;
pub mod build;
pub mod cmd;
pub mod demo;
pub mod dist;
pub mod imports;
pub mod kernels;
pub mod manifests;
#[cfg(test)]
mod names;
pub mod pgo;
pub mod prepare;
pub mod previous;
pub mod setup;
pub mod test;
pub mod vmtest;
