//! The documentation holds together: every relative link in README.md,
//! ARCHITECTURE.md, docs/*.md and clients/python/README.md names a file
//! that exists, and a `#fragment` names a heading of that file (by GitHub's
//! slug rules); the README stays a front door (at most 300 lines) that
//! lists every file of docs/; and no doc or source file cites the private
//! files the project was specified from.
//!
//! Runs in the test process alone: it reads files, starts nothing and
//! needs no network. Never does: follow links off the repository (an
//! `http://` or `https://` target is not checked).

use std::collections::HashSet;
use std::fs;
use std::path::{Component, Path, PathBuf};

/// The most lines README.md may have.
const README_MAX_LINES: usize = 300;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The markdown files whose links are checked, relative to the root.
fn doc_files() -> Vec<PathBuf> {
    let mut files = vec![
        PathBuf::from("README.md"),
        PathBuf::from("ARCHITECTURE.md"),
        PathBuf::from("clients/python/README.md"),
    ];
    let mut docs: Vec<PathBuf> = fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|entry| entry.expect("a readable docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .map(|path| {
            path.strip_prefix(root())
                .expect("under the root")
                .to_path_buf()
        })
        .collect();
    docs.sort();
    assert!(!docs.is_empty(), "docs/ holds markdown files");
    files.extend(docs);
    files
}

fn read(rel: &Path) -> String {
    fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{}: {e}", rel.display()))
}

/// The lines of a markdown text outside fenced code blocks, with their
/// numbers (from 1).
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut fence: Option<&str> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m => fence = None,
            (None, None) => out.push((i + 1, line)),
            _ => {}
        }
    }
    out
}

/// A line with its inline code spans (`...`) blanked out, so that text in
/// code is never taken for a link.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else if in_code {
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

/// The targets of the inline links `[text](target)` of one line.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut targets = Vec::new();
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        // The target runs to the ')' that balances the '(' (a target may
        // itself hold parentheses, as in "#protocol-version-1").
        let mut depth = 0usize;
        let mut end = None;
        for (i, c) in after.char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    end = Some(i);
                    break;
                }
                ')' => depth -= 1,
                _ => {}
            }
        }
        let Some(end) = end else { break };
        // Drop an optional title: [text](target "title").
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.trim_matches(['<', '>']).to_string());
        rest = &after[end..];
    }
    targets
}

/// GitHub's anchor for a heading: lowercase; every character but letters,
/// digits, spaces, '-' and '_' dropped; spaces turned into '-'.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a markdown file's headings, as GitHub makes them (a
/// repeated slug gets "-1", "-2", ... after the first).
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim_end_matches('#'));
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// `path` with `.` and `..` resolved, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

/// Every problem with the relative links of one file, as readable lines.
fn broken_links(rel: &Path) -> Vec<String> {
    let text = read(rel);
    let dir = rel.parent().unwrap_or(Path::new(""));
    let mut problems = Vec::new();
    for (number, line) in prose_lines(&text) {
        for target in link_targets(line) {
            if target.is_empty() {
                problems.push(format!("{}:{number}: an empty link target", rel.display()));
                continue;
            }
            if is_external(&target) {
                continue;
            }
            let (file, fragment) = match target.split_once('#') {
                Some((file, fragment)) => (file, Some(fragment)),
                None => (target.as_str(), None),
            };
            let linked = if file.is_empty() {
                rel.to_path_buf()
            } else {
                normalize(&dir.join(file))
            };
            let place = format!("{}:{number}: ({target})", rel.display());
            if linked.as_os_str().is_empty() || !root().join(&linked).exists() {
                problems.push(format!("{place}: {} does not exist", linked.display()));
                continue;
            }
            let Some(fragment) = fragment else { continue };
            if linked.extension().is_none_or(|ext| ext != "md") {
                problems.push(format!(
                    "{place}: a #fragment into {}, which is not markdown",
                    linked.display()
                ));
                continue;
            }
            if !anchors(&read(&linked)).contains(fragment) {
                problems.push(format!(
                    "{place}: no heading of {} has the anchor #{fragment}",
                    linked.display()
                ));
            }
        }
    }
    problems
}

#[test]
fn every_relative_link_names_a_file_and_heading_that_exist() {
    let problems: Vec<String> = doc_files().iter().flat_map(|f| broken_links(f)).collect();
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_readme_is_a_front_door_that_lists_every_doc() {
    let readme = read(Path::new("README.md"));
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines; at most {README_MAX_LINES}: move detail to docs/"
    );
    let linked: HashSet<PathBuf> = prose_lines(&readme)
        .into_iter()
        .flat_map(|(_, line)| link_targets(line))
        .filter(|t| !is_external(t))
        .map(|t| normalize(Path::new(t.split('#').next().unwrap_or(""))))
        .collect();
    for doc in doc_files().into_iter().filter(|f| f.starts_with("docs")) {
        assert!(
            linked.contains(&doc),
            "README.md's map of the docs does not link {}",
            doc.display()
        );
    }
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a readable entry").path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

#[test]
fn no_doc_or_source_file_cites_files_outside_the_repository() {
    // Built from parts, so that this file does not match itself.
    let banned = [["SPEC", ".md"].concat(), ["..", "/shared"].concat()];
    let mut files: Vec<PathBuf> = doc_files().iter().map(|f| root().join(f)).collect();
    files_under(&root().join("src"), &mut files);
    let mut found = Vec::new();
    for file in &files {
        let Ok(text) = fs::read_to_string(file) else {
            continue; // not text
        };
        for (i, line) in text.lines().enumerate() {
            for word in &banned {
                if line.contains(word.as_str()) {
                    found.push(format!("{}:{}: {word}", file.display(), i + 1));
                }
            }
        }
    }
    assert!(found.is_empty(), "cited:\n{}", found.join("\n"));
}

#[test]
fn slugs_follow_githubs_rules() {
    assert_eq!(slug("Protocol (version 1)"), "protocol-version-1");
    assert_eq!(slug("`--threads` by default"), "--threads-by-default");
    assert_eq!(
        slug("TLS and client authentication: cost per request"),
        "tls-and-client-authentication-cost-per-request"
    );
    assert_eq!(
        slug("Contended: C clients on one key (acquire → hold → release)"),
        "contended-c-clients-on-one-key-acquire--hold--release"
    );
    assert_eq!(slug("snake_case stays"), "snake_case-stays");
    let dup = anchors("# A\n\n## A\n\n```\n# not a heading\n```\n");
    assert!(dup.contains("a") && dup.contains("a-1") && !dup.contains("not-a-heading"));
}

#[test]
fn links_are_found_outside_code_only() {
    assert_eq!(
        link_targets("see [x](docs/a.md#b) and [y](../c.md) but not `[z](d.md)`"),
        ["docs/a.md#b", "../c.md"]
    );
    assert_eq!(link_targets("[t](a.md \"title\")"), ["a.md"]);
    assert_eq!(
        prose_lines("a\n```\n[x](y)\n```\nb").len(),
        2,
        "fenced code is skipped"
    );
}
