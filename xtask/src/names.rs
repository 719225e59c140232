//! One name per capability (docs/development.md, "One name per capability"): the table
//! there lists each capability's file on every internal layer; this checks the table
//! against the tree.

use std::path::Path;

use crate::build::workspace_root;

/// The directories whose files are named by capability.
const LAYERS: [&str; 10] = [
    "plugin/src",
    "plugin/src/bpf",
    "plugin/src/bpf/capability",
    "plugin/src/bpf/maps",
    "plugin/src/report",
    "maps/src",
    "ebpf/src",
    "tests/src",
    "tests/tests",
    "tests/tests/programs",
];

/// Names a capability's files had before they took one name each.
const RETIRED: [&str; 13] = [
    "portmap", "hostport", "ports", "nat", "sock", "limits", "limit", "pace", "queue", "sources",
    "source", "spoof", "masq",
];

/// The paths in backticks of the table under the section heading `heading` of `doc`.
fn table_paths(doc: &str, heading: &str) -> Vec<String> {
    let Some((_, section)) = doc.split_once(heading) else {
        return Vec::new();
    };
    let section = section.split("\n## ").next().unwrap_or_default();
    section
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| capability"))
        .flat_map(|l| l.split('`').skip(1).step_by(2).map(str::to_owned))
        .filter(|p| p.ends_with(".rs"))
        .collect()
}

/// The capabilities' names (the table's files are named by them).
const CANONICAL: [&str; 6] = [
    "host_ports",
    "bandwidth",
    "source_check",
    "masquerade",
    "services",
    "endpoints",
];

/// Files of `dir` (relative to the workspace root) whose stem, or whose stem's first
/// `_`-separated word, is a retired name; a stem that begins with a capability's name is
/// that capability's.
fn retired_in(root: &Path, dir: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let stem = name.strip_suffix(".rs").unwrap_or(&name).to_owned();
            let first = stem.split('_').next().unwrap_or_default().to_owned();
            let canonical = CANONICAL.iter().any(|c| stem.starts_with(c));
            (!canonical && (RETIRED.contains(&stem.as_str()) || RETIRED.contains(&first.as_str())))
                .then(|| format!("{dir}/{name}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_files_carry_one_name() {
        let root = workspace_root();
        let doc = std::fs::read_to_string(root.join("docs/development.md")).unwrap();
        let listed = table_paths(&doc, "## One name per capability");
        assert!(listed.len() > 30, "the table lists {listed:?}");
        let missing: Vec<&String> = listed.iter().filter(|p| !root.join(p).is_file()).collect();
        assert!(
            missing.is_empty(),
            "listed but not in the tree: {missing:?}"
        );
        let retired: Vec<String> = LAYERS.iter().flat_map(|d| retired_in(&root, d)).collect();
        assert!(retired.is_empty(), "files with a retired name: {retired:?}");
    }

    #[test]
    fn a_retired_name_is_found_and_the_table_is_read() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("ebpf/src")).unwrap();
        for f in [
            "nat.rs",
            "masq_frag.rs",
            "host_ports.rs",
            "source_check.rs",
            "maps.rs",
        ] {
            std::fs::write(tmp.path().join("ebpf/src").join(f), "").unwrap();
        }
        let mut found = retired_in(tmp.path(), "ebpf/src");
        found.sort();
        assert_eq!(found, ["ebpf/src/masq_frag.rs", "ebpf/src/nat.rs"]);
        let doc = "## One name per capability\n\n| capability | a |\n|---|---|\n\
                   | x | `a/x.rs`, `b/x.rs` (`ipMasq`) |\n\n## Next\n| y | `c/y.rs` |\n";
        assert_eq!(
            table_paths(doc, "## One name per capability"),
            ["a/x.rs", "b/x.rs"]
        );
    }
}
