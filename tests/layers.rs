//! The layering rules of `src/`, checked from the source text so that the
//! tests (not a comment) keep them:
//!
//! - a file under `src/server/core/` (the deciders) names no socket, channel,
//!   thread or clock (`mio`, `crossbeam`, `std::net`, `std::thread`,
//!   `Instant::now`, `SystemTime`), and imports nothing of the crate but
//!   `crate::protocol` and `crate::server::core`;
//! - a file under `src/server/threads/` never imports another thread file;
//! - a file under `src/server/trust/` imports no thread file and no decider;
//! - no two modules of the crate import each other, directly or round a
//!   longer circle (a child naming its own parent's items, the facade a
//!   folder's `mod.rs` defines, is not counted).
//!
//! What a file "imports" is every `crate::…` path in its code outside its
//! `#[cfg(test)]` module and its comments, resolved to the file that defines
//! it (through a parent's `pub use child::Name` re-export).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read a source folder")
        .map(|e| e.expect("a folder entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source of the crate's library: module path ("server::core::wheel")
/// to its code (comments and the test module cut away).
fn library_modules() -> BTreeMap<String, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut modules = BTreeMap::new();
    for path in files {
        let rel = path.strip_prefix(&src).expect("under src");
        // Binaries are not the library; a test module's own files (a
        // `tests/` folder beside a split module) are not its code.
        if rel.starts_with("bin") || rel.components().any(|c| c.as_os_str() == "tests") {
            continue;
        }
        let mut parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let last = parts.pop().expect("a file name");
        let stem = last.trim_end_matches(".rs");
        if stem != "mod" && stem != "lib" {
            parts.push(stem.to_string());
        }
        let text = std::fs::read_to_string(&path).expect("read a source file");
        modules.insert(parts.join("::"), code_of(&text));
    }
    modules
}

/// A file's code without its comments and without its inline test module
/// (a `mod tests;` declaration cuts nothing: its files are skipped).
fn code_of(text: &str) -> String {
    let body = match text.find("#[cfg(test)]\nmod tests {") {
        Some(at) => &text[..at],
        None => text,
    };
    body.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `crate::a::b::C` path in `code`, as its segments.
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let mut segments = Vec::new();
        let mut tail = rest;
        loop {
            let end = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            if end == 0 {
                break;
            }
            segments.push(tail[..end].to_string());
            tail = &tail[end..];
            match tail.strip_prefix("::") {
                Some(next) => tail = next,
                None => break,
            }
        }
        // `use crate::x::{a, b::C}`: each item of a group is a path too.
        if let Some(group) = tail.strip_prefix('{') {
            let close = group.find('}').unwrap_or(group.len());
            for item in group[..close].split(',') {
                let mut path = segments.clone();
                path.extend(
                    item.trim()
                        .split("::")
                        .map(|s| s.trim().to_string())
                        .filter(|s| !s.is_empty() && s != "self"),
                );
                paths.push(path);
            }
        } else {
            paths.push(segments);
        }
    }
    paths
}

/// The module that defines what `path` names: its longest prefix that is a
/// module, followed through a `pub use child::Name` of that module.
fn resolve(path: &[String], modules: &BTreeMap<String, String>) -> Option<String> {
    let mut found = None;
    for len in (1..=path.len()).rev() {
        let name = path[..len].join("::");
        if modules.contains_key(&name) {
            found = Some((name, len));
            break;
        }
    }
    let (module, len) = found?;
    if let Some(item) = path.get(len) {
        let code = &modules[&module];
        for line in code.lines() {
            let line = line.trim();
            let Some(used) = line.strip_prefix("pub use ") else {
                continue;
            };
            let used = used.trim_end_matches(';');
            let Some((child, items)) = used.split_once("::") else {
                continue;
            };
            let named = items
                .trim_matches(|c| c == '{' || c == '}')
                .split(',')
                .any(|i| i.trim().rsplit("::").next() == Some(item.as_str()));
            let child_module = format!("{module}::{child}");
            if named && modules.contains_key(&child_module) {
                return Some(child_module);
            }
        }
    }
    Some(module)
}

/// Module → the other modules of the crate it imports.
fn imports(modules: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    modules
        .iter()
        .map(|(name, code)| {
            let used = crate_paths(code)
                .iter()
                .filter_map(|p| resolve(p, modules))
                .filter(|m| m != name)
                .collect();
            (name.clone(), used)
        })
        .collect()
}

#[test]
fn the_deciders_name_no_socket_channel_thread_or_clock() {
    let modules = library_modules();
    // The cores, and the rounds the threads and the simulation share
    // (their traits must name no thread type: the simulation implements
    // them too).
    let core: Vec<_> = modules
        .iter()
        .filter(|(name, _)| name.starts_with("server::core") || *name == "server::rounds")
        .collect();
    assert!(
        core.len() >= 10,
        "the core's files were found: {}",
        core.len()
    );
    let forbidden = [
        "mio",
        "crossbeam",
        "crossbeam_channel",
        "rustls",
        "TcpStream",
        "std::net",
        "std::thread",
        "Instant::now",
        "SystemTime",
    ];
    for (name, code) in core {
        for word in forbidden {
            let named = code.match_indices(word).any(|(at, _)| {
                let before = code[..at].chars().next_back();
                let after = code[at + word.len()..].chars().next();
                !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                    && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
            });
            assert!(!named, "{name} names {word}: a decider must not");
        }
    }
}

#[test]
fn the_deciders_import_only_the_protocol_and_each_other() {
    let modules = library_modules();
    for (name, used) in imports(&modules) {
        if !name.starts_with("server::core") {
            continue;
        }
        for module in used {
            assert!(
                module == "protocol"
                    || module.starts_with("protocol::")
                    || module.starts_with("server::core"),
                "{name} imports {module}: a decider imports only the protocol and the core"
            );
        }
    }
}

#[test]
fn no_thread_file_imports_another_thread_file() {
    let modules = library_modules();
    for (name, used) in imports(&modules) {
        if !name.starts_with("server::threads::") {
            continue;
        }
        for module in used {
            assert!(
                !module.starts_with("server::threads"),
                "{name} imports {module}: threads share only the plumbing"
            );
        }
    }
}

#[test]
fn trust_imports_no_thread_and_no_decider() {
    let modules = library_modules();
    for (name, used) in imports(&modules) {
        if !name.starts_with("server::trust") {
            continue;
        }
        for module in used {
            assert!(
                !module.starts_with("server::threads") && !module.starts_with("server::core"),
                "{name} imports {module}"
            );
        }
    }
}

#[test]
fn no_two_modules_import_each_other_round_any_circle() {
    let modules = library_modules();
    // A child may name what its parent module defines (a folder's facade,
    // such as `client::Client`, which its guards hold): that is the parent's
    // own API, not a circle among the parts. Every other edge counts.
    let graph: BTreeMap<String, BTreeSet<String>> = imports(&modules)
        .into_iter()
        .map(|(name, used)| {
            let used = used
                .into_iter()
                .filter(|m| !name.starts_with(&format!("{m}::")))
                .collect();
            (name, used)
        })
        .collect();
    // Depth-first search; a module met again while still on the path closes
    // a circle, which is reported with the whole path.
    fn visit(
        at: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if done.contains(at) {
            return;
        }
        if let Some(start) = path.iter().position(|m| m == at) {
            let mut circle = path[start..].to_vec();
            circle.push(at.to_string());
            panic!("an import circle: {}", circle.join(" -> "));
        }
        path.push(at.to_string());
        for next in graph.get(at).into_iter().flatten() {
            visit(next, graph, path, done);
        }
        path.pop();
        done.insert(at.to_string());
    }
    let mut done = BTreeSet::new();
    for module in graph.keys() {
        visit(module, &graph, &mut Vec::new(), &mut done);
    }
}

#[test]
fn the_rules_see_a_known_import_and_a_known_circle() {
    // The checks above pass only if they read imports right: a path in a
    // `use` group resolves to its file, and a circle is found.
    let mut modules = BTreeMap::new();
    modules.insert(
        "a".to_string(),
        "use crate::b::{Thing, c::Other};\n".to_string(),
    );
    modules.insert("b".to_string(), "pub use c::Other;\n".to_string());
    modules.insert("b::c".to_string(), "fn f() { crate::a::g() }\n".to_string());
    let graph = imports(&modules);
    assert_eq!(
        graph["a"],
        BTreeSet::from(["b".to_string(), "b::c".to_string()])
    );
    assert_eq!(graph["b::c"], BTreeSet::from(["a".to_string()]));
    assert_eq!(
        resolve(&["b".into(), "Other".into()], &modules).as_deref(),
        Some("b::c")
    );
}
