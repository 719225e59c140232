//! Which files of a crate use which: a file uses another when it names one of the other's
//! modules, or an item defined there, by a path: through `crate::`, `super::` or `self::`,
//! or through a child module's plain name (`child::x`), in a `use` tree or a path
//! expression. A path that ends in an item of a module (`super::Hook`) uses that module,
//! or, when the module only imported the item (`pub use pod::attach`, or a plain `use`),
//! the module it came from. So a child that names its parent's own items while the parent
//! names the child is a circle, as two siblings naming each other are. The modules of one
//! parent make a graph too, each module standing for every file at or below it: a file that
//! takes an item its sibling directory re-exports (`super::capability::PodSpec`, defined in
//! `capability/spec.rs`) while another file of that directory names the file is a circle of
//! the two modules, though no file reaches back to the one it uses. No module imports its
//! caller: the unit test below keeps every crate of the workspace free of both kinds.
//!
//! A reading of the text, not of the compiler's resolution: enough for this code base,
//! which names modules by those prefixes. A glob import (`use x::*`) is not followed.

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

/// A token of a path or `use` tree.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Ident(String),
    Sep,
    Open,
    Close,
    Comma,
    Star,
}

/// The tokens of a `use` tree (its text up to the `;`).
fn tokens(text: &str) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            ':' if chars.peek() == Some(&':') => {
                chars.next();
                out.push(Tok::Sep);
            }
            '{' => out.push(Tok::Open),
            '}' => out.push(Tok::Close),
            ',' => out.push(Tok::Comma),
            '*' => out.push(Tok::Star),
            c if is_ident(c) => {
                let mut id = String::from(c);
                while let Some(&n) = chars.peek().filter(|n| is_ident(**n)) {
                    id.push(n);
                    chars.next();
                }
                out.push(Tok::Ident(id));
            }
            _ => {}
        }
    }
    out
}

/// The paths of a `use` tree, each with the name it is imported as (`None`: a glob).
fn expand(
    toks: &[Tok],
    pos: &mut usize,
    prefix: &[String],
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(*pos) {
            Some(Tok::Ident(id)) => {
                *pos += 1;
                path.push(id.clone());
                if toks.get(*pos) == Some(&Tok::Sep) {
                    *pos += 1;
                    continue;
                }
                // A leaf: `self` names the module it follows.
                if id == "self" {
                    path.pop();
                }
                let mut name = path.last().cloned();
                if toks.get(*pos) == Some(&Tok::Ident("as".into())) {
                    if let Some(Tok::Ident(alias)) = toks.get(*pos + 1) {
                        name = Some(alias.clone());
                    }
                    *pos += 2;
                }
                out.push((path, name));
                return;
            }
            Some(Tok::Open) => {
                *pos += 1;
                loop {
                    match toks.get(*pos) {
                        Some(Tok::Close) => {
                            *pos += 1;
                            return;
                        }
                        Some(Tok::Comma) => *pos += 1,
                        None => return,
                        _ => {
                            let before = *pos;
                            expand(toks, pos, &path, out);
                            if *pos == before {
                                *pos += 1;
                            }
                        }
                    }
                }
            }
            Some(Tok::Star) => {
                *pos += 1;
                out.push((path, None));
                return;
            }
            _ => return,
        }
    }
}

/// What one file says about names: the paths it names and the names its `use` items bring
/// in (name → path), both unresolved.
#[derive(Default)]
struct FileNames {
    paths: Vec<Vec<String>>,
    imports: BTreeMap<String, Vec<String>>,
}

/// `text` without the paths of visibilities (`pub(in crate::bpf)`), which use nothing.
fn without_visibility_paths(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("pub(in ") {
        out.push_str(&rest[..i + 3]);
        rest = &rest[i + 3..];
        rest = rest.find(')').map_or("", |j| &rest[j + 1..]);
    }
    out.push_str(rest);
    out
}

fn read_names(text: &str, children: &BTreeSet<String>) -> FileNames {
    let text = without_visibility_paths(&code(text));
    let mut names = FileNames::default();
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        let Some(c) = rest.chars().next() else { break };
        let boundary = !text[..i].chars().next_back().is_some_and(is_ident);
        if !(boundary && is_ident(c)) {
            i += c.len_utf8();
            continue;
        }
        let end = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
        let word = &rest[..end];
        let after_sep = text[..i].trim_end().ends_with("::");
        if word == "use" && !after_sep {
            let tree = rest[end..].split(';').next().unwrap_or_default();
            let toks = tokens(tree);
            let mut out = Vec::new();
            let mut pos = 0;
            expand(&toks, &mut pos, &[], &mut out);
            for (path, name) in out {
                if let Some(name) = name {
                    names.imports.insert(name, path.clone());
                }
                names.paths.push(path);
            }
            i += end + tree.len();
            continue;
        }
        let starts_path = matches!(word, "crate" | "super" | "self") || children.contains(word);
        if starts_path && !after_sep && rest[end..].starts_with("::") {
            // A path expression: one `a::b::c` chain (generics and braces end it).
            let chain_end = rest
                .find(|c: char| !(is_ident(c) || c == ':'))
                .unwrap_or(rest.len());
            names.paths.push(
                rest[..chain_end]
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect(),
            );
            i += chain_end;
            continue;
        }
        i += end;
    }
    names
}

/// The modules of the crate, with what each file names.
struct Crate {
    files: BTreeMap<ModPath, FileNames>,
}

impl Crate {
    fn children(mods: &BTreeSet<ModPath>, me: &ModPath) -> BTreeSet<String> {
        mods.iter()
            .filter(|m| m.len() == me.len() + 1 && m.starts_with(me))
            .map(|m| m[me.len()].clone())
            .collect()
    }

    /// The module a path named in `me` leads to (the module an item is defined in), or
    /// `None` for a path out of the crate. `depth` bounds re-export chains.
    fn resolve(&self, me: &ModPath, path: &[String], depth: u32) -> Option<ModPath> {
        let (first, rest) = path.split_first()?;
        let mut m: ModPath = match first.as_str() {
            "crate" => Vec::new(),
            "self" => me.clone(),
            "super" => me[..me.len().saturating_sub(1)].to_vec(),
            child => {
                let mut c = me.clone();
                c.push(child.to_owned());
                if !self.files.contains_key(&c) {
                    return None;
                }
                c
            }
        };
        for seg in rest {
            match seg.as_str() {
                "super" => {
                    m.pop();
                    continue;
                }
                "self" => continue,
                _ => {}
            }
            let mut next = m.clone();
            next.push(seg.clone());
            if self.files.contains_key(&next) {
                m = next;
                continue;
            }
            // An item of `m`: defined there, or brought in by one of its `use` items (then
            // it is the module it came from that is used, none for another crate's).
            if depth > 0 && m != *me {
                if let Some(from) = self.files.get(&m).and_then(|f| f.imports.get(seg)) {
                    return self.resolve(&m, from, depth - 1);
                }
            }
            return Some(m);
        }
        Some(m)
    }
}

/// The modules of `mods` that the file of module `me` names.
fn uses(krate: &Crate, me: &ModPath) -> BTreeSet<ModPath> {
    let Some(file) = krate.files.get(me) else {
        return BTreeSet::new();
    };
    file.paths
        .iter()
        .filter_map(|p| krate.resolve(me, p, 8))
        .filter(|m| m != me)
        .collect()
}

fn display(m: &ModPath) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// The groups of `nodes` that reach each other along `edges` (strongly connected
/// components of more than one node), each sorted.
fn groups(
    nodes: &BTreeSet<ModPath>,
    edges: &BTreeMap<ModPath, BTreeSet<ModPath>>,
) -> BTreeSet<Vec<ModPath>> {
    // Reachability is enough at this size: a and b share a circle when each reaches the other.
    let reach = |from: &ModPath| -> BTreeSet<ModPath> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for n in edges.get(&m).into_iter().flatten() {
                if seen.insert(n.clone()) {
                    todo.push(n.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&ModPath, BTreeSet<ModPath>> =
        nodes.iter().map(|m| (m, reach(m))).collect();
    nodes
        .iter()
        .map(|m| {
            nodes
                .iter()
                .filter(|n| reaches[m].contains(*n) && reaches[*n].contains(m))
                .cloned()
                .collect::<Vec<_>>()
        })
        .filter(|g| g.len() > 1)
        .collect()
}

/// Under `parent`, what stands for file `f`: the parent's own file itself, a child module
/// for every file at or below it; `None` for a file elsewhere.
fn under(parent: &ModPath, f: &ModPath) -> Option<ModPath> {
    if f == parent {
        return Some(f.clone());
    }
    (f.len() > parent.len() && f.starts_with(parent)).then(|| f[..=parent.len()].to_vec())
}

/// The groups of files of the crate at `src` that use each other in a circle (strongly
/// connected components of more than one file), each sorted, as `a::b` names; then the
/// circles between the modules of one parent, each module standing for every file at or
/// below it and the parent for its own file (`a::b` uses `a::c` when a file of `a::b`'s
/// tree uses one of `a::c`'s), where no circle of files is all there is to them: a
/// directory module and its sibling use each other even when no file of one reaches back
/// to the very file that uses it.
pub fn circles(src: &Path) -> Vec<Vec<String>> {
    circles_and_uses(src).0
}

/// [`circles`], and for each file of a circle the files of its circle it uses
/// (`a -> b, c`), to tell where to cut it.
pub fn circles_and_uses(src: &Path) -> (Vec<Vec<String>>, Vec<String>) {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeMap<ModPath, PathBuf> = files
        .iter()
        .map(|f| (module_of(src, f), f.clone()))
        .collect();
    let names: BTreeSet<ModPath> = modules.keys().cloned().collect();
    let krate = Crate {
        files: modules
            .iter()
            .map(|(m, f)| {
                let text = std::fs::read_to_string(f).unwrap_or_default();
                (m.clone(), read_names(&text, &Crate::children(&names, m)))
            })
            .collect(),
    };
    let graph: BTreeMap<ModPath, BTreeSet<ModPath>> =
        names.iter().map(|m| (m.clone(), uses(&krate, m))).collect();
    let file_circles = groups(&names, &graph);
    let mut found: Vec<Vec<String>> = Vec::new();
    let mut uses_in_circles = Vec::new();
    for group in &file_circles {
        found.push(group.iter().map(display).collect());
        for m in group {
            let inside: Vec<String> = graph[m]
                .iter()
                .filter(|u| group.contains(u))
                .map(display)
                .collect();
            uses_in_circles.push(format!("{} -> {}", display(m), inside.join(", ")));
        }
    }
    for parent in names
        .iter()
        .filter(|m| !Crate::children(&names, m).is_empty())
    {
        let mut edges: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
        for (f, used) in &graph {
            let Some(from) = under(parent, f) else {
                continue;
            };
            for to in used.iter().filter_map(|u| under(parent, u)) {
                if to != from {
                    edges.entry(from.clone()).or_default().insert(to);
                }
            }
        }
        let nodes: BTreeSet<ModPath> = names.iter().filter_map(|f| under(parent, f)).collect();
        for group in groups(&nodes, &edges) {
            let only_files = file_circles.iter().any(|files| {
                let seen: BTreeSet<ModPath> =
                    files.iter().filter_map(|f| under(parent, f)).collect();
                seen.len() == group.len() && group.iter().all(|g| seen.contains(g))
            });
            if only_files {
                continue;
            }
            found.push(group.iter().map(display).collect());
            for (f, used) in &graph {
                let Some(from) = under(parent, f).filter(|m| group.contains(m)) else {
                    continue;
                };
                let across: Vec<String> = used
                    .iter()
                    .filter(|u| {
                        under(parent, u).is_some_and(|to| to != from && group.contains(&to))
                    })
                    .map(display)
                    .collect();
                if !across.is_empty() {
                    uses_in_circles.push(format!("{} -> {}", display(f), across.join(", ")));
                }
            }
        }
    }
    (found, uses_in_circles)
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

    /// A child naming its parent's own item while the parent names the child is a circle;
    /// an item the parent only re-exports, or takes from another crate, leads past it.
    #[test]
    fn sees_a_child_and_its_parent_naming_each_other() {
        let dir = std::env::temp_dir().join(format!("ecni-imports-pc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a")).unwrap();
        std::fs::write(dir.join("lib.rs"), "mod a;").unwrap();
        std::fs::write(
            dir.join("a/mod.rs"),
            "mod c; mod h; pub use h::Hook; pub use std::fmt::Debug;\n\
             pub(in crate::a) fn g() { c::f(); }\npub struct Item;",
        )
        .unwrap();
        std::fs::write(dir.join("a/h.rs"), "pub struct Hook;").unwrap();
        std::fs::write(dir.join("a/c.rs"), "use super::{Debug, Hook, Item};").unwrap();
        assert_eq!(circles(&dir), vec![vec!["a", "a::c"]]);
        std::fs::write(dir.join("a/c.rs"), "use super::{Debug, Hook};").unwrap();
        assert!(circles(&dir).is_empty(), "{:?}", circles_and_uses(&dir).1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A file that takes an item its sibling directory re-exports from one of its files,
    /// while other files of that directory take items from it: no file reaches back to the
    /// file it uses, yet the two modules use each other.
    #[test]
    fn sees_a_module_and_a_sibling_directory_using_each_other() {
        let dir = std::env::temp_dir().join(format!("ecni-imports-sib-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("b/cap")).unwrap();
        std::fs::write(dir.join("lib.rs"), "mod b;").unwrap();
        std::fs::write(dir.join("b/mod.rs"), "mod cap; mod place;").unwrap();
        std::fs::write(
            dir.join("b/cap/mod.rs"),
            "mod spec; mod unit; pub use spec::Spec;",
        )
        .unwrap();
        std::fs::write(dir.join("b/cap/spec.rs"), "pub struct Spec;").unwrap();
        std::fs::write(dir.join("b/cap/unit.rs"), "use crate::b::place::Placement;").unwrap();
        std::fs::write(
            dir.join("b/place.rs"),
            "use super::cap::Spec;\npub struct Placement;",
        )
        .unwrap();
        let (found, uses) = circles_and_uses(&dir);
        assert_eq!(found, vec![vec!["b::cap", "b::place"]]);
        assert_eq!(
            uses,
            ["b::cap::unit -> b::place", "b::place -> b::cap::spec"]
        );
        // The dependency one way: the spec below the placement's module, not beside it.
        std::fs::write(dir.join("b/cap/spec.rs"), "pub use crate::b::place::Spec;").unwrap();
        std::fs::write(
            dir.join("b/place.rs"),
            "pub struct Spec;\npub struct Placement;",
        )
        .unwrap();
        assert!(circles(&dir).is_empty(), "{:?}", circles_and_uses(&dir).1);
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

    /// No crate of the workspace has files, or modules of one parent, that use each other
    /// in a circle.
    #[test]
    fn no_crate_has_an_import_circle() {
        let root = crate::build::workspace_root();
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        let members = workspace_members(&manifest);
        assert!(members.contains(&"bench".to_owned()), "{members:?}");
        let mut failures = Vec::new();
        for krate in &members {
            let (found, uses) = circles_and_uses(&root.join(krate).join("src"));
            if !found.is_empty() {
                failures.push(format!(
                    "{krate}: import circles {found:?}; in them: {}",
                    uses.join("; ")
                ));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
