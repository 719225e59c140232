//! The CNI protocol: environment, configuration, results, versions and errors.
pub mod error;
pub use error::{code, CniError, CniResult};
