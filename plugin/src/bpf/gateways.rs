//! Who uses each IPv4 gateway the node holds for its pods.
//!
//! A pod's IPv4 gateway is one address of the node (on `lo`), not one per host veth: the
//! pod's ARP request for it is answered by `ecni_from_pod`. The node keeps the address while
//! any attachment uses it, recorded as empty directories `gateways/<address in hex>/<attachment
//! id>` under the node's pin directory. Taking and dropping a use happens under the node
//! lock, together with adding or removing the address, so an ADD never sees its gateway
//! disappear: the last user's DEL removes the directory and the address in one step that
//! no other plugin run interleaves with.

use std::{fs, io, net::Ipv4Addr, path::PathBuf};

use super::{
    dataplane::NodeLock,
    pin::{create_dir_all_racy, ensure_bpffs_at, PinRoot},
    BpfError, NodeId,
};

/// The node lock, held while a gateway use and its address change together.
pub struct GatewayLock {
    _lock: NodeLock,
    root: PinRoot,
}

/// bpffs refuses names with a dot: a gateway's directory is its address in hex.
fn gw_name(gw: Ipv4Addr) -> String {
    format!("{:08x}", u32::from(gw))
}

fn parse_gw_name(name: &str) -> Option<Ipv4Addr> {
    (name.len() == 8)
        .then(|| u32::from_str_radix(name, 16).ok())
        .flatten()
        .map(Ipv4Addr::from)
}

fn user_dir(root: &PinRoot, node: &NodeId, gw: Ipv4Addr, id: u64) -> PathBuf {
    root.gateways_dir(node)
        .join(gw_name(gw))
        .join(format!("{id:016x}"))
}

fn io_err(path: PathBuf) -> impl FnOnce(io::Error) -> BpfError {
    move |source| BpfError::GatewayRecord { path, source }
}

impl GatewayLock {
    pub fn take() -> Result<Self, BpfError> {
        let root = PinRoot::from_env();
        ensure_bpffs_at(&root)?;
        Ok(Self {
            _lock: NodeLock::take(&root)?,
            root,
        })
    }

    /// Records that attachment `id` uses `gw`. The caller then makes sure the node holds
    /// the address, before it lets go of the lock.
    pub fn add_user(&self, node: &NodeId, gw: Ipv4Addr, id: u64) -> Result<(), BpfError> {
        create_dir_all_racy(&user_dir(&self.root, node, gw, id))
    }

    /// Drops every use of attachment `id`; returns the gateways nobody uses any more, whose
    /// addresses the caller removes before it lets go of the lock. Idempotent.
    pub fn remove_user(&self, node: &NodeId, id: u64) -> Result<Vec<Ipv4Addr>, BpfError> {
        let base = self.root.gateways_dir(node);
        let entries = match fs::read_dir(&base) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(base)(e)),
        };
        let mut unused = Vec::new();
        for e in entries.flatten() {
            let Some(gw) = parse_gw_name(&e.file_name().to_string_lossy()) else {
                continue;
            };
            let mine = user_dir(&self.root, node, gw, id);
            match fs::remove_dir(&mine) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err(mine)(e)),
            }
            // Fails while another attachment still uses the gateway.
            if fs::remove_dir(e.path()).is_ok() {
                unused.push(gw);
            }
        }
        Ok(unused)
    }
}

/// CHECK: attachment `id`'s use of `gw` is recorded.
pub fn check_user(node: &NodeId, gw: Ipv4Addr, id: u64) -> Result<(), BpfError> {
    let path = user_dir(&PinRoot::from_env(), node, gw, id);
    if path.is_dir() {
        Ok(())
    } else {
        Err(BpfError::PinMissing {
            what: "gateway use record",
            path,
        })
    }
}

/// `inspect`: each gateway the node holds for its pods, with its users' attachment ids.
pub fn list(node: &NodeId) -> Vec<(Ipv4Addr, Vec<u64>)> {
    let ids = |p: PathBuf| -> Vec<u64> {
        let mut v: Vec<u64> = fs::read_dir(p)
            .map(|es| {
                es.flatten()
                    .filter_map(|e| u64::from_str_radix(&e.file_name().to_string_lossy(), 16).ok())
                    .collect()
            })
            .unwrap_or_default();
        v.sort_unstable();
        v
    };
    let base = PinRoot::from_env().gateways_dir(node);
    let mut out: Vec<(Ipv4Addr, Vec<u64>)> = fs::read_dir(&base)
        .map(|es| {
            es.flatten()
                .filter_map(|e| {
                    let gw = parse_gw_name(&e.file_name().to_string_lossy())?;
                    Some((gw, ids(e.path())))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Whether any gateway has a recorded user (the last one removes the gateway's
/// directory): a DEL finding none skips the lock, and the node's last DEL keeps the node's
/// state while an ADD holds one.
pub fn in_use(root: &PinRoot, node: &NodeId) -> bool {
    fs::read_dir(root.gateways_dir(node)).is_ok_and(|mut es| es.next().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_names_have_no_dot_and_round_trip() {
        let gw = Ipv4Addr::new(10, 88, 0, 1);
        assert_eq!(gw_name(gw), "0a580001");
        assert_eq!(parse_gw_name(&gw_name(gw)), Some(gw));
        assert_eq!(parse_gw_name("10.88.0.1"), None);
        assert_eq!(parse_gw_name("0a58000"), None);
    }
}
