//! The CNI protocol: environment, configuration, results, versions and errors.
pub mod args;
pub mod config;
pub mod env;
pub mod error;
pub mod gc;
pub mod stock_keys;
pub mod types;
pub mod version;

pub use error::{code, CniError};
