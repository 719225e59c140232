//! `ebpf-cni install` and `ebpf-cni uninstall`: the step every CNI DaemonSet runs on each
//! node, putting the plugin binary into the host's CNI bin dir and its conflist into the
//! conf dir, and taking them away again.
//!
//! Install validates every setting, and reads the node's pod subnets from the Kubernetes
//! API when none is given ([`kube`]), before it writes anything; then it writes the binary,
//! and the conflist only after it, so a runtime that sees the conflist finds the plugin.
//! Each file is replaced atomically and left alone when it holds what it should
//! ([`files`]): a second install changes nothing. Only its own conflist is written; other
//! plugins' files in the conf dir are never renamed or removed (multus#972).
//!
//! Uninstall removes the conflist if it carries install's marker ([`conflist::MARKER_KEY`])
//! and the binary if it is an ebpf-cni binary ([`BINARY_MARKER`]) that no other conflist
//! in the conf dir names; with `--purge` also the node's pinned eBPF state, refused while
//! any pod is attached (then nothing at all is removed).

pub mod conflist;
pub mod files;
pub mod kube;
pub mod settings;

use std::{
    fmt,
    path::{Path, PathBuf},
};

use ipnetwork::IpNetwork;

use crate::{
    bpf::{self, BpfError, NodeId, NodeUsers, Purge},
    netns::{Netns, NetnsError},
};
use conflist::ConflistError;
use files::{Existing, FileError, Put};
use kube::KubeError;
use settings::{Install, Subnets, Target, Uninstall, BINARY_NAME};
pub use settings::{InstallArgs, SettingsError, UninstallArgs};

/// Every ebpf-cni binary from this one on holds these bytes (the check below reads them
/// from this constant, so they are linked in): uninstall removes a binary at the plugin's
/// name only when it finds them, or when it is this very binary.
pub const BINARY_MARKER: &[u8] = b"ebpf-cni installable binary, marker v1";

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error(transparent)]
    Settings(#[from] SettingsError),
    #[error(transparent)]
    Kube(#[from] KubeError),
    #[error(transparent)]
    Conflist(#[from] ConflistError),
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Bpf(#[from] BpfError),
    #[error(
        "refusing to purge the node's eBPF state, nothing was removed: still in use by {users}"
    )]
    InUse { users: NodeUsers },
}

impl InstallError {
    /// 2 for a setting that is missing or cannot be used (as for a usage error), else 1.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Settings(_) => 2,
            _ => 1,
        }
    }
}

/// Where the pod subnets came from, for the summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubnetOrigin {
    Settings,
    /// Node name and field (`spec.podCIDRs`).
    Node(String, &'static str),
}

/// What install did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallReport {
    pub binary: PathBuf,
    pub binary_put: Put,
    /// The installed binary's page cache, or why it was not laid out (install goes on).
    pub binary_layout: Result<crate::page_cache::Layout, String>,
    pub conflist: PathBuf,
    pub conflist_put: Put,
    pub network: String,
    pub subnets: Vec<IpNetwork>,
    pub origin: SubnetOrigin,
}

fn put_word(p: Put, written: &'static str) -> &'static str {
    match p {
        Put::Written => written,
        Put::Unchanged => "unchanged",
    }
}

impl fmt::Display for InstallReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let subnets: Vec<String> = self.subnets.iter().map(ToString::to_string).collect();
        let origin = match &self.origin {
            SubnetOrigin::Settings => "from the settings".to_owned(),
            SubnetOrigin::Node(node, field) => format!("from node {node}'s {field}"),
        };
        let layout = match &self.binary_layout {
            Ok(l) => format!("{l}"),
            Err(e) => format!("page cache not laid out: {e}"),
        };
        writeln!(
            f,
            "{}: {}; {layout}",
            self.binary.display(),
            put_word(self.binary_put, "installed")
        )?;
        write!(
            f,
            "{}: {} (network {}, pod subnets {} {origin})",
            self.conflist.display(),
            put_word(self.conflist_put, "written"),
            self.network,
            subnets.join(", ")
        )
    }
}

/// Installs the binary, then the conflist (see the module head).
pub fn install(args: &InstallArgs) -> Result<InstallReport, InstallError> {
    let s: Install = args.validate()?;
    let (subnets, origin) = match &s.subnets {
        Subnets::Explicit(v) => (v.clone(), SubnetOrigin::Settings),
        Subnets::FromNode(k) => {
            let got = kube::node_pod_subnets(k)?;
            (
                got.subnets,
                SubnetOrigin::Node(k.node_name.clone(), got.field),
            )
        }
    };
    let text = conflist::render(&conflist::Spec {
        cni_version: &s.cni_version,
        network: &s.network,
        subnets: &subnets,
        mtu: s.mtu,
        capabilities: s.capabilities,
        ip_masq: s.ip_masq,
        cluster_networks: &[],
    })?;
    let binary = files::read(&s.source)?;
    let binary_put = files::put(&s.target.binary(), &binary, 0o755)?;
    // Also when unchanged: after a reboot the binary is back in small folios.
    let binary_layout = crate::page_cache::lay_out(&s.target.binary()).map_err(|e| {
        let e = std::iter::once(e.to_string())
            .chain(crate::cni::error::source_lines(&e))
            .collect::<Vec<_>>()
            .join(": ");
        log::warn!("{e}");
        e
    });
    let conflist_put = files::put(&s.target.conflist(), text.as_bytes(), 0o644)?;
    Ok(InstallReport {
        binary: s.target.binary(),
        binary_put,
        binary_layout,
        conflist: s.target.conflist(),
        conflist_put,
        network: s.network,
        subnets,
        origin,
    })
}

/// What uninstall did with one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removal {
    Removed,
    Absent,
    /// Left in place, and why.
    Kept(String),
}

/// What uninstall did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UninstallReport {
    pub conflist: PathBuf,
    pub conflist_removal: Removal,
    pub binary: PathBuf,
    pub binary_removal: Removal,
    /// `None` without `--purge`.
    pub purge: Option<Purge>,
}

impl fmt::Display for UninstallReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = |r: &Removal| match r {
            Removal::Removed => "removed".to_owned(),
            Removal::Absent => "absent".to_owned(),
            Removal::Kept(why) => format!("kept: {why}"),
        };
        writeln!(
            f,
            "{}: {}",
            self.conflist.display(),
            word(&self.conflist_removal)
        )?;
        write!(
            f,
            "{}: {}",
            self.binary.display(),
            word(&self.binary_removal)
        )?;
        match &self.purge {
            None => Ok(()),
            Some(Purge::Removed { path }) => write!(f, "\n{}: removed", path.display()),
            Some(Purge::NothingPinned { path }) => {
                write!(f, "\n{}: absent (nothing pinned)", path.display())
            }
            Some(Purge::InUse(users)) => write!(f, "\nnode state kept: in use by {users}"),
        }
    }
}

/// Removes what install wrote (see the module head).
pub fn uninstall(args: &UninstallArgs) -> Result<UninstallReport, InstallError> {
    let s: Uninstall = args.validate()?;
    // The node is the namespace's the whole way: device filters are removed by name there.
    let _in_node = match (&s.netns, s.purge) {
        (Some(path), true) => Some(Netns::open(path)?.enter()?),
        _ => None,
    };
    let node = if s.purge {
        let node = NodeId::current()?;
        let users = bpf::users(&node)?;
        if !users.is_empty() {
            return Err(InstallError::InUse { users });
        }
        Some(node)
    } else {
        None
    };
    let conflist_removal = remove_conflist(&s.target)?;
    let binary_removal = remove_binary(&s.target)?;
    let purge = match node {
        Some(node) => match bpf::purge(&node)? {
            // A pod came between the check above and the lock.
            Purge::InUse(users) => return Err(InstallError::InUse { users }),
            done => Some(done),
        },
        None => None,
    };
    Ok(UninstallReport {
        conflist: s.target.conflist(),
        conflist_removal,
        binary: s.target.binary(),
        binary_removal,
        purge,
    })
}

fn remove_conflist(t: &Target) -> Result<Removal, InstallError> {
    let path = t.conflist();
    Ok(match files::existing(&path)? {
        Existing::Missing => Removal::Absent,
        Existing::File { content, .. } if conflist::is_ours(&content) => {
            if files::remove(&path)? {
                Removal::Removed
            } else {
                Removal::Absent
            }
        }
        Existing::File { .. } => Removal::Kept("not written by ebpf-cni install".into()),
        Existing::Other => Removal::Kept("not a regular file".into()),
    })
}

fn remove_binary(t: &Target) -> Result<Removal, InstallError> {
    let path = t.binary();
    let content = match files::existing(&path)? {
        Existing::Missing => return Ok(Removal::Absent),
        Existing::Other => return Ok(Removal::Kept("not a regular file".into())),
        Existing::File { content, .. } => content,
    };
    let ours = files::contains(&content, BINARY_MARKER)
        || std::fs::read(settings::DEFAULT_SOURCE).is_ok_and(|me| me == content);
    if !ours {
        return Ok(Removal::Kept("not an ebpf-cni binary".into()));
    }
    // Our own conflist is gone by now if it was ours; one at its name that was not ours
    // counts like any other.
    if let Some(other) = conflist_naming_the_plugin(&t.conf_dir) {
        return Ok(Removal::Kept(format!(
            "{} still names type {BINARY_NAME}",
            other.display()
        )));
    }
    Ok(if files::remove(&path)? {
        Removal::Removed
    } else {
        Removal::Absent
    })
}

/// Another network configuration in `conf_dir` (as libcni reads them: `*.conf`,
/// `*.conflist`, `*.json`) with a plugin of our type: its network still needs the binary.
fn conflist_naming_the_plugin(conf_dir: &Path) -> Option<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(conf_dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e == "conf" || e == "conflist" || e == "json")
        })
        .collect();
    paths.sort();
    paths.into_iter().find(|p| {
        let Ok(text) = std::fs::read(p) else {
            return false;
        };
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&text) else {
            return false;
        };
        let names =
            |p: &serde_json::Value| p.get("type").and_then(|t| t.as_str()) == Some(BINARY_NAME);
        names(&v)
            || v.get("plugins")
                .and_then(|p| p.as_array())
                .is_some_and(|ps| ps.iter().any(names))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_configs_naming_the_plugin_keep_the_binary() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("20-bridge.conflist"),
            r#"{"plugins":[{"type":"bridge"}]}"#,
        )
        .unwrap();
        std::fs::write(tmp.path().join("notes.txt"), r#"{"type":"ebpf-cni"}"#).unwrap();
        assert_eq!(conflist_naming_the_plugin(tmp.path()), None);
        let chained = tmp.path().join("30-chain.conflist");
        std::fs::write(
            &chained,
            r#"{"plugins":[{"type":"bridge"},{"type":"ebpf-cni"}]}"#,
        )
        .unwrap();
        assert_eq!(conflist_naming_the_plugin(tmp.path()), Some(chained));
        let single = tmp.path().join("05-single.conf");
        std::fs::write(&single, r#"{"type":"ebpf-cni"}"#).unwrap();
        assert_eq!(conflist_naming_the_plugin(tmp.path()), Some(single));
    }
}
