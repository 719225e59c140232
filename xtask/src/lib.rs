//! Developer tasks behind `cargo xtask`, as a library so tasks can call each other (`test`,
//! `demo` and `bench` all start with [`build::build`]).

pub mod bench;
pub mod build;
pub mod cmd;
pub mod demo;
pub mod imports;
pub mod kernels;
pub mod previous;
pub mod setup;
pub mod test;
pub mod vmtest;
