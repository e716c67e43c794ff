//! The documentation holds together: every relative link in README.md,
//! ARCHITECTURE.md, docs/*.md and clients/python/README.md names a file
//! that exists, and a `#fragment` names a heading of that file (by GitHub's
//! slug rules); the README stays a front door (at most 300 lines) that
//! lists every file of docs/; and no doc or source file cites the private
//! files the project was specified from.
//!
//! The commands the docs print work when copied: README.md's tour (and
//! its `nc` session) and docs/cluster.md's local cluster, metrics
//! included, run as printed against real processes (see the end of this
//! file).
//!
//! The link checks run in the test process alone: they read files, start
//! nothing and need no network. Never does: follow links off the
//! repository (an `http://` or `https://` target is not checked).

mod common;

use std::collections::HashSet;
use std::fs;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

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

// ---------------------------------------------------------------------------
// The commands the docs print, run as printed
// ---------------------------------------------------------------------------
//
// README.md's tour and docs/cluster.md's local cluster are run as a new
// user would copy them, each in a bash of its own inside a network
// namespace of its own (`unshare --net --pid --fork --kill-child
// --mount-proc`): there
// the ports the docs print (7373, 9373...) are free whatever else runs on
// the machine, and every process the commands start dies with the
// namespace, whatever happens. Only the harness is added around the
// commands: `target/release/` names the binaries this test was built with,
// `cargo build` is left out (they are built), a background server is waited
// for until it listens, and the state directory and binary of
// scripts/cluster.sh are given in its environment (`BATON_CLUSTER_DIR`,
// `BATOND`). The outputs are compared with the printed ones, digits aside
// (tokens and times differ from run to run). Without a namespace (not root
// and no user namespaces, or no `ip`) these skip with a line on stderr,
// unless BATON_REQUIRE_NETNS=1 (set by .ci/run).

/// The lines of `text` under the heading `heading` (to the next heading of
/// the same or a higher level).
fn section<'a>(text: &'a str, heading: &str) -> Vec<&'a str> {
    let level = heading.chars().take_while(|&c| c == '#').count();
    let mut lines = text.lines().skip_while(|line| *line != heading);
    assert!(lines.next().is_some(), "no heading {heading:?}");
    lines
        .take_while(|line| {
            let hashes = line.chars().take_while(|&c| c == '#').count();
            !(1..=level).contains(&hashes) || !line[hashes..].starts_with(' ')
        })
        .collect()
}

/// The indented (4-space) code blocks of some markdown lines, each as its
/// lines without the indent.
fn indented_blocks(lines: &[&str]) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut block: Vec<String> = Vec::new();
    for line in lines {
        match line.strip_prefix("    ") {
            Some(code) => block.push(code.to_string()),
            None if line.trim().is_empty() && !block.is_empty() => {}
            None => {
                if !block.is_empty() {
                    blocks.push(std::mem::take(&mut block));
                }
            }
        }
    }
    if !block.is_empty() {
        blocks.push(block);
    }
    blocks
}

/// The fenced ```sh blocks of some markdown lines.
fn sh_blocks(lines: &[&str]) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut block: Option<Vec<String>> = None;
    for line in lines {
        match (&mut block, line.trim_start()) {
            (None, "```sh") => block = Some(Vec::new()),
            (Some(_), "```") => blocks.push(block.take().expect("open")),
            (Some(b), _) => b.push(line.to_string()),
            _ => {}
        }
    }
    blocks
}

/// `text` with every run of digits as `0`: outputs compared without their
/// tokens, times and counts.
fn shape(text: &str) -> String {
    let mut out = String::new();
    let mut in_digits = false;
    for c in text.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push('0');
            }
            in_digits = true;
        } else {
            out.push(c);
            in_digits = false;
        }
    }
    out
}

/// A bash single-quoted word.
fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// One command of a doc and what the doc prints after it.
struct Step {
    command: String,
    expected: Vec<String>,
}

/// How the harness runs one part of a doc: a shell command, or an `nc`
/// session whose requests and answers alternate.
enum Part {
    Shell(Step),
    Nc { addr: String, lines: Vec<String> },
}

/// The README's tour, as parts to run.
fn tour_parts() -> Vec<Part> {
    let readme = read(Path::new("README.md"));
    let lines = section(&readme, "## A one-minute tour");
    let mut parts = Vec::new();
    for block in indented_blocks(&lines) {
        if !block.iter().any(|line| line.starts_with("$ ")) {
            // Commands alone (no prompt, no output).
            for command in block {
                parts.push(Part::Shell(Step {
                    command,
                    expected: Vec::new(),
                }));
            }
            continue;
        }
        let mut rest = block.into_iter().peekable();
        while let Some(line) = rest.next() {
            let command = line
                .strip_prefix("$ ")
                .unwrap_or_else(|| panic!("README tour: output before a command: {line:?}"))
                .to_string();
            let mut expected = Vec::new();
            while let Some(next) = rest.next_if(|l| !l.starts_with("$ ")) {
                expected.push(next);
            }
            if let Some(addr) = command
                .split_whitespace()
                .last()
                .filter(|_| command.starts_with("nc "))
            {
                let host = command.split_whitespace().rev().nth(1).unwrap_or_default();
                parts.push(Part::Nc {
                    addr: format!("{host}/{addr}"),
                    lines: expected,
                });
            } else {
                parts.push(Part::Shell(Step { command, expected }));
            }
        }
    }
    parts
}

/// Whether a private network namespace can be made here; if not, why.
fn netns_args() -> Result<Vec<&'static str>, String> {
    let has_ip = common::on_path("ip").is_some();
    if !has_ip {
        return Err("no `ip` (iproute2)".into());
    }
    let mut args = vec!["--net", "--pid", "--fork", "--kill-child", "--mount-proc"];
    if unsafe { libc::geteuid() } != 0 {
        args.push("--map-root-user");
    }
    match std::process::Command::new("unshare")
        .args(&args)
        .arg("true")
        .output()
    {
        Ok(out) if out.status.success() => Ok(args),
        Ok(out) => Err(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        Err(e) => Err(format!("unshare: {e}")),
    }
}

/// Run `script` with bash in a namespace of its own, from the repository
/// root, with loopback up; None (after saying why) where no namespace can
/// be made and none is required.
fn run_in_netns(what: &str, script: &str, env: &[(&str, String)]) -> Option<common::Finished> {
    let args = match netns_args() {
        Ok(args) => args,
        Err(why) => {
            assert!(
                std::env::var_os("BATON_REQUIRE_NETNS").is_none(),
                "BATON_REQUIRE_NETNS is set and no network namespace can be made: {why}"
            );
            eprintln!("{what} skipped: no network namespace ({why})");
            return None;
        }
    };
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    fs::create_dir_all(&dir).expect("target tmp dir");
    let file = dir.join(format!(
        "docs-{}-{}.sh",
        what.replace(' ', "-"),
        std::process::id()
    ));
    fs::write(&file, script).expect("write the script");
    let mut all: Vec<String> = vec!["env".into()];
    all.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    all.push("unshare".into());
    all.extend(args.iter().map(|a| a.to_string()));
    all.extend([
        "bash".into(),
        "-c".into(),
        "ip link set lo up && cd \"$1\" && exec bash \"$2\"".into(),
        "bash".into(),
        root().display().to_string(),
        file.display().to_string(),
    ]);
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let run = common::run_to_exit(all[0], &all[1..], Duration::from_secs(120));
    let _ = fs::remove_file(&file);
    Some(run)
}

/// The directory of the binaries this test was built with, with a `/`.
fn bin_dir() -> String {
    let batond = Path::new(common::batond_path());
    format!("{}/", batond.parent().expect("a directory").display())
}

/// A line that marks the start of step `i` in the script's output.
fn marker(i: usize) -> String {
    format!("@@@ step {i} @@@")
}

#[test]
fn the_readme_tour_runs_as_printed() {
    let parts = tour_parts();
    let commands: Vec<&str> = parts
        .iter()
        .filter_map(|p| match p {
            Part::Shell(step) => Some(step.command.as_str()),
            Part::Nc { .. } => None,
        })
        .collect();
    // What the tour must keep doing (issue: the first hour).
    assert!(
        commands.contains(&"target/release/batond &"),
        "{commands:?}"
    );
    assert!(
        commands.last().is_some_and(|c| *c == "kill %1"),
        "the tour stops its server at the end: {commands:?}"
    );
    assert!(
        commands
            .iter()
            .any(|c| c.starts_with("t=$(") && c.contains("baton acquire")),
        "the tour captures its token: {commands:?}"
    );
    assert!(
        commands
            .iter()
            .any(|c| c.contains("release") && c.contains("\"$t\"")),
        "the tour releases its own token: {commands:?}"
    );
    assert!(
        parts.iter().any(|p| matches!(p, Part::Nc { .. })),
        "the tour has an nc session"
    );
    let readme = read(Path::new("README.md"));
    assert!(
        readme.contains("nc -N 127.0.0.1 7373") && readme.contains("Ctrl+D"),
        "the tour says how to leave nc"
    );

    let bins = bin_dir();
    let mut script = String::from(
        "set -eu\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n\
         await_port() { for _ in $(seq 400); do (exec 3<>\"/dev/tcp/$1/$2\") 2>/dev/null && return 0; sleep 0.05; done; echo \"nothing listens on $1:$2\" >&2; exit 1; }\n",
    );
    for (i, part) in parts.iter().enumerate() {
        script.push_str(&format!("echo {}\n", quoted(&marker(i))));
        match part {
            Part::Shell(step) if step.command == "cargo build --release" => {
                script.push_str(": built by cargo test already\n");
            }
            Part::Shell(step) => {
                let command = step.command.replace("target/release/", &bins);
                script.push_str(&command);
                script.push('\n');
                if command.trim_end().ends_with('&') {
                    script.push_str("await_port 127.0.0.1 7373\n");
                }
            }
            Part::Nc { addr, lines } => {
                // Requests and answers alternate; the token of the first
                // grant is the reader's own in the requests after it.
                let (host, port) = addr.split_once('/').expect("host/port");
                script.push_str(&format!("exec 3<>/dev/tcp/{host}/{port}\n"));
                let mut printed_token: Option<String> = None;
                for pair in lines.chunks(2) {
                    let mut request = quoted(&pair[0]);
                    if let Some(token) = &printed_token {
                        request = request.replace(token.as_str(), "'\"$tok\"'");
                    }
                    script.push_str(&format!(
                        "printf '%s\\n' {request} >&3\nIFS= read -r -t 5 line <&3 || {{ echo 'no answer' >&2; exit 1; }}\nline=${{line%$'\\r'}}\necho \"$line\"\n"
                    ));
                    if let Some(answer) = pair.get(1)
                        && printed_token.is_none()
                        && answer.starts_with("A ")
                    {
                        printed_token = answer.split(' ').nth(1).map(str::to_string);
                        script.push_str("tok=${line#A }; tok=${tok%% *}\n");
                    }
                }
                script.push_str("exec 3>&-\n");
            }
        }
    }
    script.push_str(&format!("echo {}\n", quoted(&marker(parts.len()))));
    let Some(run) = run_in_netns("the README tour", &script, &[]) else {
        return;
    };
    assert_eq!(
        run.code,
        Some(0),
        "the tour failed:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    // Each step's output, between its marker and the next.
    let mut outputs: Vec<Vec<&str>> = Vec::new();
    for line in run.stdout.lines() {
        if line.starts_with("@@@ step ") {
            outputs.push(Vec::new());
        } else if let Some(current) = outputs.last_mut() {
            current.push(line);
        }
    }
    assert_eq!(outputs.len(), parts.len() + 1, "{}", run.stdout);
    for (i, part) in parts.iter().enumerate() {
        let (what, expected): (&str, Vec<&str>) = match part {
            Part::Shell(step) => (
                &step.command,
                step.expected.iter().map(String::as_str).collect(),
            ),
            Part::Nc { lines, .. } => (
                "the nc session",
                lines
                    .iter()
                    .skip(1)
                    .step_by(2)
                    .map(String::as_str)
                    .collect(),
            ),
        };
        let got: Vec<String> = outputs[i].iter().map(|l| shape(l)).collect();
        let want: Vec<String> = expected.iter().map(|l| shape(l)).collect();
        assert_eq!(
            got, want,
            "README tour: {what}: printed {expected:?}, got {:?}\nstderr:\n{}",
            outputs[i], run.stderr
        );
    }
    assert!(outputs[parts.len()].is_empty());
}

#[test]
fn the_local_cluster_commands_of_cluster_md_run_as_printed() {
    let doc = read(Path::new("docs/cluster.md"));
    let lines = section(&doc, "## A local cluster to try");
    let blocks = sh_blocks(&lines);
    assert_eq!(blocks.len(), 2, "the cycle, and metrics: {blocks:?}");
    let all: Vec<&String> = blocks.iter().flatten().collect();
    assert!(
        all.iter()
            .any(|l| l.starts_with("BATON_METRICS_BASE=") && l.contains("cluster.sh start"))
            && all
                .iter()
                .any(|l| l.starts_with("curl ") && l.contains("/metrics")),
        "cluster.md shows metrics per node: {all:?}"
    );
    let state = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("docs-cluster-{}", std::process::id()));
    let _ = fs::remove_dir_all(&state);
    let mut script = String::from("set -euo pipefail\n");
    // Where curl is missing, the same GET through bash (harness only).
    script.push_str(
        "command -v curl >/dev/null || curl() { local url=${@: -1}; url=${url#http://}; \
         local hp=${url%%/*}; exec 3<>\"/dev/tcp/${hp%:*}/${hp#*:}\"; \
         printf 'GET /%s HTTP/1.0\\r\\nHost: %s\\r\\n\\r\\n' \"${url#*/}\" \"$hp\" >&3; \
         sed '1,/^\\r\\{0,1\\}$/d' <&3; }\n",
    );
    for block in &blocks {
        for line in block {
            script.push_str(line);
            script.push('\n');
        }
    }
    let env = [
        ("BATON_CLUSTER_DIR", state.display().to_string()),
        ("BATOND", common::batond_path().to_string()),
    ];
    let run = run_in_netns("the local cluster of cluster.md", &script, &env);
    let _ = fs::remove_dir_all(&state);
    let Some(run) = run else { return };
    assert_eq!(
        run.code,
        Some(0),
        "the commands failed:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    let out = &run.stdout;
    assert_eq!(
        out.matches("cluster formed: node 0 active, 2 standby(s) synced")
            .count(),
        3,
        "start, restart, start with metrics:\n{out}"
    );
    assert!(
        out.contains("metrics http://127.0.0.1:9375/metrics"),
        "{out}"
    );
    assert!(out.contains("baton_role{role=\"standby\"} 1"), "{out}");
    assert_eq!(out.matches(": stopped (pid ").count(), 6, "{out}");
}

#[test]
fn the_async_rust_snippets_say_which_tokio_features_they_need() {
    // The snippets of clients.md use #[tokio::main] and tokio::select!:
    // rt-multi-thread and macros (checked by building them in a project
    // with exactly this line when it was written).
    let doc = read(Path::new("docs/clients.md"));
    let lines = section(&doc, "### Async");
    assert!(
        lines.contains(&r#"tokio = { version = "1", features = ["rt-multi-thread", "macros"] }"#),
        "docs/clients.md, Async: the tokio dependency line"
    );
    let uses: Vec<&str> = ["#[tokio::main]", "tokio::select!"]
        .into_iter()
        .filter(|u| doc.contains(u))
        .collect();
    assert_eq!(uses.len(), 2, "the snippets the line is for: {uses:?}");
    for other in ["tokio::time", "tokio::spawn", "tokio::sync", "tokio::net"] {
        assert!(
            !doc.contains(other),
            "docs/clients.md uses {other}: say which tokio feature it needs"
        );
    }
}
