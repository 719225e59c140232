//! Which files of a crate use which: a file uses another when it names one of the other's
//! module paths through `crate::`, `super::` or `self::` (in a `use` tree or a path
//! expression). Circles in that graph are what issue 17 removed; the unit test below keeps
//! every crate of the workspace free of them.
//!
//! A reading of the text, not of the compiler's resolution: enough for this code base,
//! which names modules by those prefixes (a parent module's plain `child::x` is its own
//! business and not counted).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path, e.g. `["bpf", "pod"]`; empty for the crate root.
type ModPath = Vec<String>;

fn module_of(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: ModPath = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("lib" | "main" | "mod")
    ) {
        parts.pop();
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The text without comments and without the `#[cfg(test)]` module at the end.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The modules of `mods` that the file of module `me` names.
fn uses(text: &str, me: &ModPath, mods: &BTreeSet<ModPath>) -> BTreeSet<ModPath> {
    let text = code(text);
    let mut found = BTreeSet::new();
    for kw in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(i) = text[from..].find(kw).map(|i| i + from) {
            from = i + kw.len();
            if text[..i].chars().next_back().is_some_and(is_ident) {
                continue;
            }
            let prefix: ModPath = match kw {
                "crate::" => Vec::new(),
                "super::" => me[..me.len().saturating_sub(1)].to_vec(),
                _ => me.clone(),
            };
            let before = text[..i].trim_end();
            // A `use` tree runs to its `;`; a path expression is one `a::b::c` chain.
            let rest = &text[from..];
            let seg = if before.ends_with("use") {
                rest.split(';').next().unwrap_or_default()
            } else {
                let end = rest
                    .find(|c: char| !(is_ident(c) || c == ':'))
                    .unwrap_or(rest.len());
                &rest[..end]
            };
            let names: Vec<&str> = seg
                .split(|c: char| !is_ident(c))
                .filter(|s| !s.is_empty())
                .collect();
            let mut candidates: Vec<ModPath> = Vec::new();
            let mut path = prefix.clone();
            for n in &names {
                path.push((*n).to_owned());
                candidates.push(path.clone());
            }
            for n in &names {
                let mut one = prefix.clone();
                one.push((*n).to_owned());
                candidates.push(one);
                if let Some(first) = names.first() {
                    let mut two = prefix.clone();
                    two.push((*first).to_owned());
                    two.push((*n).to_owned());
                    candidates.push(two);
                }
            }
            for c in candidates {
                if mods.contains(&c) && &c != me {
                    found.insert(c);
                }
            }
        }
    }
    found
}

/// The groups of files of the crate at `src` that use each other in a circle (strongly
/// connected components of more than one file), each sorted, as `a::b` names.
pub fn circles(src: &Path) -> Vec<Vec<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeMap<ModPath, PathBuf> = files
        .iter()
        .map(|f| (module_of(src, f), f.clone()))
        .collect();
    let names: BTreeSet<ModPath> = modules.keys().cloned().collect();
    let graph: BTreeMap<ModPath, BTreeSet<ModPath>> = modules
        .iter()
        .map(|(m, f)| {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            (m.clone(), uses(&text, m, &names))
        })
        .collect();
    // Reachability is enough at this size: a and b share a circle when each reaches the other.
    let reach = |from: &ModPath| -> BTreeSet<ModPath> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for n in graph.get(&m).into_iter().flatten() {
                if seen.insert(n.clone()) {
                    todo.push(n.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<ModPath, BTreeSet<ModPath>> =
        names.iter().map(|m| (m.clone(), reach(m))).collect();
    let mut groups: BTreeSet<Vec<String>> = BTreeSet::new();
    for m in &names {
        let group: Vec<String> = names
            .iter()
            .filter(|n| reaches[m].contains(*n) && reaches[*n].contains(m))
            .map(|n| {
                if n.is_empty() {
                    "crate".into()
                } else {
                    n.join("::")
                }
            })
            .collect();
        if group.len() > 1 {
            groups.insert(group);
        }
    }
    groups.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_circle_and_reads_super_and_use_trees() {
        let dir = std::env::temp_dir().join(format!("ecni-imports-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a")).unwrap();
        std::fs::write(dir.join("lib.rs"), "mod a; mod b; mod c;").unwrap();
        std::fs::write(dir.join("a/mod.rs"), "mod x;").unwrap();
        std::fs::write(
            dir.join("a/x.rs"),
            "use super::{y};\nfn f() { crate::b::g(); }",
        )
        .unwrap();
        std::fs::write(dir.join("a/y.rs"), "").unwrap();
        std::fs::write(dir.join("b.rs"), "use crate::{c::{self, h}};").unwrap();
        std::fs::write(
            dir.join("c.rs"),
            "fn h() { let node = 1; crate::a::x::f(); }",
        )
        .unwrap();
        assert_eq!(circles(&dir), vec![vec!["a::x", "b", "c"]]);
        std::fs::write(dir.join("c.rs"), "fn h() {}").unwrap();
        assert!(circles(&dir).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The `members = [...]` of a workspace manifest.
    fn workspace_members(manifest: &str) -> Vec<String> {
        let list = manifest
            .split("\nmembers")
            .nth(1)
            .and_then(|rest| rest.split('[').nth(1))
            .and_then(|rest| rest.split(']').next())
            .expect("the workspace lists its members");
        list.split(',')
            .map(|m| m.trim().trim_matches('"').to_owned())
            .filter(|m| !m.is_empty())
            .collect()
    }

    /// Issue 17: no crate of the workspace has files that import each other in a circle.
    #[test]
    fn no_crate_has_an_import_circle() {
        let root = crate::build::workspace_root();
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        let members = workspace_members(&manifest);
        assert!(members.contains(&"bench".to_owned()), "{members:?}");
        for krate in &members {
            let found = circles(&root.join(krate).join("src"));
            assert!(found.is_empty(), "{krate}: import circles {found:?}");
        }
    }
}
