//! The workspace's layout, checked from its sources: no two modules import each other (directly
//! or around a circle), and the core's crate root stays a front door of at most 40 names
//! (ARCHITECTURE.md §1).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The library and binary crates of the workspace, by the folder their modules start from.
const CRATE_ROOTS: [&str; 5] = [
    "core/src",
    "transports/src",
    "runtime/src",
    "models/src",
    "src",
];

/// A module path inside one crate, e.g. `["tcp", "conn"]`; the crate root is empty.
type ModPath = Vec<String>;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a file holds: `lib.rs`, `main.rs` and `mod.rs` name their folder's module.
fn module_of(root: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(root).expect("a file under its crate");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("lib" | "main" | "mod")
    ) {
        parts.pop();
    }
    parts
}

/// The code of a line, without its comment.
fn code(line: &str) -> &str {
    match line.find("//") {
        Some(at) => &line[..at],
        None => line,
    }
}

/// The paths a `use` tree names, its braces expanded: `a::{b, c::{d}}` gives `a::b`, `a::c::d`.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(tree).trim();
        return vec![path.to_owned()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut parts, mut depth, mut current) = (Vec::new(), 0, String::new());
    for ch in inner.chars() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(ch);
    }
    parts.push(current);
    parts
        .iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(|p| expand(p))
        .map(|p| {
            if p == "self" {
                prefix.trim_end_matches("::").to_owned()
            } else {
                format!("{prefix}{p}")
            }
        })
        .collect()
}

/// Every path into the crate a file names, in `use` items and in code: `crate::a::b`,
/// `super::c`, `self::d`. Modules declared inline (`mod tests { ... }`) are followed, so
/// that their `super` means the file's module.
fn named_paths(text: &str, file_module: &ModPath) -> Vec<(ModPath, String)> {
    let mut out = Vec::new();
    // The inline modules open at this brace depth, innermost last.
    let mut inline: Vec<(String, i32)> = Vec::new();
    let mut depth = 0i32;
    let mut pending_use = String::new();
    for line in text.lines() {
        let line = code(line);
        let here = || {
            let mut m = file_module.clone();
            m.extend(inline.iter().map(|(n, _)| n.clone()));
            m
        };
        let trimmed = line.trim_start();
        let after_vis = trimmed
            .strip_prefix("pub(crate) ")
            .or_else(|| trimmed.strip_prefix("pub(super) "))
            .or_else(|| trimmed.strip_prefix("pub "))
            .unwrap_or(trimmed);
        if !pending_use.is_empty() || after_vis.starts_with("use ") {
            pending_use.push_str(after_vis.trim_start_matches("use "));
            if let Some(end) = pending_use.find(';') {
                let tree = pending_use[..end].to_owned();
                pending_use.clear();
                for path in expand(&tree) {
                    out.push((here(), path));
                }
            }
            continue;
        }
        for start in ["crate::", "super::", "self::"] {
            let mut rest = line;
            while let Some(at) = rest.find(start) {
                let before = rest[..at].chars().last();
                let tail = &rest[at..];
                let end = tail
                    .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .unwrap_or(tail.len());
                if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    out.push((here(), tail[..end].trim_end_matches(':').to_owned()));
                }
                rest = &tail[end.max(1)..];
            }
        }
        if let Some(name) = after_vis
            .strip_prefix("mod ")
            .and_then(|r| r.strip_suffix('{').or_else(|| r.strip_suffix(" {")))
        {
            inline.push((name.trim().to_owned(), depth));
        }
        depth += line.matches('{').count() as i32 - line.matches('}').count() as i32;
        while inline.last().is_some_and(|&(_, opened)| depth <= opened) {
            inline.pop();
        }
    }
    out
}

/// The module a path from `from` leads to: the longest prefix that is a module of the crate.
fn target(path: &str, from: &ModPath, modules: &BTreeSet<ModPath>) -> Option<ModPath> {
    let mut segments = path.split("::").filter(|s| !s.is_empty());
    let mut at: ModPath = match segments.next()? {
        "crate" => Vec::new(),
        "self" => from.clone(),
        "super" => {
            let mut m = from.clone();
            m.pop()?;
            m
        }
        _ => return None,
    };
    for s in segments {
        if s == "super" {
            at.pop()?;
            continue;
        }
        let mut next = at.clone();
        next.push(s.to_owned());
        if modules.contains(&next) {
            at = next;
        } else {
            break;
        }
    }
    Some(at)
}

/// The dependencies between sibling modules of one crate: a path from `a::x` to `b::y` makes
/// `a` depend on `b` under their common parent. A module's own children and parents are not
/// dependencies of it.
fn sibling_edges(crate_root: &Path) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let mut files = Vec::new();
    rust_files(crate_root, &mut files);
    let mut modules: BTreeSet<ModPath> = files.iter().map(|f| module_of(crate_root, f)).collect();
    let mut named = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a readable source file");
        let paths = named_paths(&text, &module_of(crate_root, file));
        for (from, _) in &paths {
            modules.insert(from.clone());
        }
        named.extend(paths);
    }
    let mut edges: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (from, path) in named {
        let Some(to) = target(&path, &from, &modules) else {
            continue;
        };
        let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
        if common == from.len() || common == to.len() {
            continue;
        }
        let (a, b) = (from[..=common].to_vec(), to[..=common].to_vec());
        edges.entry(a).or_default().insert(b);
    }
    edges
}

/// A circle of modules in `edges`, if there is one.
fn circle(edges: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Option<Vec<ModPath>> {
    fn visit(
        node: &ModPath,
        edges: &BTreeMap<ModPath, BTreeSet<ModPath>>,
        done: &mut BTreeSet<ModPath>,
        stack: &mut Vec<ModPath>,
    ) -> Option<Vec<ModPath>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut found = stack[at..].to_vec();
            found.push(node.clone());
            return Some(found);
        }
        if !done.insert(node.clone()) {
            return None;
        }
        stack.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, edges, done, stack) {
                return Some(found);
            }
        }
        stack.pop();
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|n| visit(n, edges, &mut done, &mut Vec::new()))
}

/// Every circle in `edges`, one edge of each found taken away before looking again, so that
/// one report names them all.
fn circles(mut edges: BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<String> {
    let mut found = Vec::new();
    while let Some(c) = circle(&edges) {
        let names: Vec<String> = c.iter().map(|m| m.join("::")).collect();
        found.push(names.join(" -> "));
        let (from, to) = (&c[c.len() - 2], &c[c.len() - 1]);
        if let Some(next) = edges.get_mut(from) {
            next.remove(to);
        }
    }
    found
}

#[test]
fn no_modules_import_each_other_in_any_crate_of_the_workspace() {
    let mut found = Vec::new();
    for root in CRATE_ROOTS {
        for c in circles(sibling_edges(&workspace().join(root))) {
            found.push(format!("{root}: {c}"));
        }
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

#[test]
fn the_circle_check_finds_a_circle_between_sibling_modules() {
    // Two files of a module that name each other, as `bench::{train, vw}` once did.
    let dir = std::env::temp_dir().join(format!("pserver-layout-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("bench")).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod bench;\n").unwrap();
    std::fs::write(dir.join("bench/mod.rs"), "mod train;\nmod vw;\n").unwrap();
    std::fs::write(
        dir.join("bench/train.rs"),
        "use super::{Measure, vw};\nfn f() { vw::run() }\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("bench/vw.rs"),
        "use super::train::{Reached, cpu};\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
    )
    .unwrap();
    let edges = sibling_edges(&dir);
    let found = circle(&edges).map(|c| c.iter().map(|m| m.join("::")).collect::<Vec<_>>());
    // The inline tests module's `super` is `bench::vw`, its parent: no edge of its own.
    std::fs::write(
        dir.join("bench/vw.rs"),
        "#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
    )
    .unwrap();
    let without = circle(&sibling_edges(&dir));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        found,
        Some(vec![
            "bench::train".to_owned(),
            "bench::vw".to_owned(),
            "bench::train".to_owned()
        ])
    );
    assert_eq!(without, None);
}

/// The names the core's crate root exports in a default build: its public modules and every
/// name of its `pub use` items (not those behind a feature the checkers turn on).
fn core_root_names() -> Vec<String> {
    let text = std::fs::read_to_string(workspace().join("core/src/lib.rs")).unwrap();
    let mut names = Vec::new();
    let mut gated = false;
    let mut pending = String::new();
    for line in text.lines().map(code).map(str::trim) {
        if line.starts_with("#[cfg(feature") {
            gated = true;
            continue;
        }
        if !pending.is_empty() || line.starts_with("pub use ") {
            pending.push_str(line.trim_start_matches("pub use "));
            if let Some(end) = pending.find(';') {
                if !gated {
                    for path in expand(&pending[..end]) {
                        let name = path.rsplit("::").next().unwrap_or(&path);
                        names.push(name.to_owned());
                    }
                }
                pending.clear();
                gated = false;
            }
            continue;
        }
        if let Some(module) = line.strip_prefix("pub mod ") {
            if !gated {
                names.push(module.trim_end_matches(';').to_owned());
            }
        }
        if !line.is_empty() && !line.starts_with("#[") {
            gated = false;
        }
    }
    names
}

#[test]
fn the_core_crate_root_holds_at_most_40_names() {
    let names = core_root_names();
    // The count sees what an embedder sees: the driver, the job and the keys are there, the
    // feature-gated checkers' modules are not.
    for expected in ["Driver", "JobSpec", "KvPairs", "node", "wire", "Bytes"] {
        assert!(names.iter().any(|n| n == expected), "{expected}: {names:?}");
    }
    assert!(!names.iter().any(|n| n == "testing" || n == "mutation"));
    assert!(names.len() <= 40, "{} names: {names:?}", names.len());
}
