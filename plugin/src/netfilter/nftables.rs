//! nf_tables over netlink.

use super::Table;

/// The nf_tables tables of the calling thread's namespace.
pub fn read(_sets_of: &[&str]) -> std::io::Result<Vec<Table>> {
    Ok(Vec::new())
}
