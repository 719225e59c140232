//! The attachments tree on bpffs: `attachments/<network>/<container id>/<ifname>/`, one
//! directory per attachment holding its pins. The one walk of it, read without changing
//! anything: DEL's test for the node's last pod, `inspect`, GC's inventory of a network
//! and STATUS (which reads only the first level unless the node's maps are missing).

use std::{fs, io, path::Path};

use super::{
    pin::{name_of_component, pin_component, NodeId, PinRoot},
    AttachmentKey, BpfError,
};

/// One attachment directory, by its three names.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct AttachmentDir {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
}

impl AttachmentDir {
    pub fn key(&self) -> AttachmentKey<'_> {
        AttachmentKey {
            network: &self.network,
            container_id: &self.container_id,
            ifname: &self.ifname,
        }
    }
}

/// `<network>/<container id>/<ifname>`, as `inspect` names an attachment.
impl std::fmt::Display for AttachmentDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.network, self.container_id, self.ifname)
    }
}

/// Every attachment of `node`, all networks, sorted. Empty when the node has none (or
/// bpffs is not mounted).
pub fn attachments(root: &PinRoot, node: &NodeId) -> Result<Vec<AttachmentDir>, BpfError> {
    Ok(walk(&root.attachments_dir(node), 3)?
        .into_iter()
        .map(|names| {
            let [network, container_id, ifname] =
                <[String; 3]>::try_from(names).expect("three levels");
            AttachmentDir {
                network,
                container_id,
                ifname,
            }
        })
        .collect())
}

/// The networks with attachments pinned on `node` (the tree's first level), unsorted:
/// whether the tree can be read, at the cost of one directory.
pub fn networks(root: &PinRoot, node: &NodeId) -> Result<Vec<String>, BpfError> {
    subdirs(&root.attachments_dir(node))
}

/// `(container id, ifname)` of every attachment of `network` pinned on `node`, sorted.
/// Empty when the node or the network has none (or bpffs is not mounted).
pub fn network_attachments(
    node: &NodeId,
    network: &str,
) -> Result<Vec<(String, String)>, BpfError> {
    let dir = PinRoot::from_env().network_attachments_dir(node, network);
    Ok(walk(&dir, 2)?
        .into_iter()
        .map(|names| {
            let [container_id, ifname] = <[String; 2]>::try_from(names).expect("two levels");
            (container_id, ifname)
        })
        .collect())
}

/// The names of every directory `depth` levels below `dir` (one name per level), sorted.
fn walk(dir: &Path, depth: usize) -> Result<Vec<Vec<String>>, BpfError> {
    let mut out = Vec::new();
    for name in subdirs(dir)? {
        if depth <= 1 {
            out.push(vec![name]);
            continue;
        }
        for mut below in walk(&dir.join(&*pin_component(&name)), depth - 1)? {
            below.insert(0, name.clone());
            out.push(below);
        }
    }
    out.sort();
    Ok(out)
}

/// The names pinned by the directories in `dir` (see `pin::pin_component`); none when `dir`
/// does not exist. Components that are not UTF-8 or that no name gives cannot be ours (they
/// come from validated CNI values) and are skipped.
fn subdirs(dir: &Path) -> Result<Vec<String>, BpfError> {
    let err = |source| BpfError::ReadPinDir {
        path: dir.into(),
        source,
    };
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(err(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(err)?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            if let Some(name) = entry.file_name().to_str().and_then(name_of_component) {
                out.push(name);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subdirs_of_a_missing_directory_are_none() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(subdirs(&tmp.path().join("nope")).unwrap().is_empty());
        fs::create_dir_all(tmp.path().join("a/eth0")).unwrap();
        fs::write(tmp.path().join("file"), b"").unwrap();
        assert_eq!(subdirs(tmp.path()).unwrap(), ["a"]);
    }

    #[test]
    fn the_walk_lists_each_attachment_once_sorted() {
        let tmp = tempfile::tempdir().unwrap();
        for dir in [
            "net-b/c1/eth0",
            "net-a/c2/eth1",
            "net-a/c2/eth0",
            "net-a/c1/eth0",
        ] {
            fs::create_dir_all(tmp.path().join(dir)).unwrap();
        }
        // A container directory left without an interface holds no attachment; files are
        // pins, not attachments.
        fs::create_dir_all(tmp.path().join("net-b/c3")).unwrap();
        fs::write(tmp.path().join("net-a/c1/eth0/link_from_pod"), b"").unwrap();
        let found: Vec<String> = walk(tmp.path(), 3)
            .unwrap()
            .into_iter()
            .map(|n| n.join("/"))
            .collect();
        assert_eq!(
            found,
            [
                "net-a/c1/eth0",
                "net-a/c2/eth0",
                "net-a/c2/eth1",
                "net-b/c1/eth0"
            ]
        );
        assert_eq!(walk(&tmp.path().join("net-a"), 2).unwrap().len(), 3);
    }
}
