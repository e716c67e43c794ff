//! The `baton` command-line tool against real `batond` processes. Every
//! `baton` process is killed by its PID if a test fails.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use baton::client::{Client, Error, ReleaseOutcome};
use common::{DEADLINE, Node, baton_path, batond_path, run_to_exit, wait_for};

fn node() -> Node {
    Node::start(&["--threads", "1"])
}

/// `baton --servers <servers> <args>`, started with piped output.
fn start(servers: &str, args: &[&str]) -> Baton {
    let mut all = vec!["--servers", servers];
    all.extend_from_slice(args);
    start_with(&all, None)
}

/// `baton <args>` with `$BATON_SERVERS` set to `env_servers` (or unset).
fn start_with(args: &[&str], env_servers: Option<&str>) -> Baton {
    let mut command = Command::new(baton_path());
    command
        .args(args)
        .env_remove("BATON_SERVERS")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(servers) = env_servers {
        command.env("BATON_SERVERS", servers);
    }
    Baton {
        child: command.spawn().expect("spawn baton"),
    }
}

/// A running `baton`, killed by PID when dropped.
struct Baton {
    child: Child,
}

/// How a `baton` process ended.
struct Finished {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Baton {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Wait for the exit (failing the test after `deadline`), then read the
    /// output (small: it fits the pipes).
    fn finish_within(mut self, deadline: Duration) -> Finished {
        let status = wait_for("baton to exit", deadline, || {
            self.child.try_wait().expect("try_wait")
        });
        let read = |pipe: Option<&mut dyn std::io::Read>| {
            let mut text = String::new();
            if let Some(pipe) = pipe {
                pipe.read_to_string(&mut text).expect("read output");
            }
            text
        };
        let stdout = read(self.child.stdout.as_mut().map(|p| p as _));
        let stderr = read(self.child.stderr.as_mut().map(|p| p as _));
        Finished {
            code: status.code(),
            stdout,
            stderr,
        }
    }

    fn finish(self) -> Finished {
        self.finish_within(DEADLINE)
    }
}

impl Drop for Baton {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn baton(servers: &str, args: &[&str]) -> Finished {
    start(servers, args).finish()
}

fn library(servers: &str) -> Client {
    Client::connect([servers]).expect("a client")
}

fn holder(client: &Client, key: &str) -> Option<u64> {
    client.query(key).expect("query").token
}

/// A fresh scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir =
            std::env::temp_dir().join(format!("baton-cli-{}-{name}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }

    fn file(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn one_line(text: &str) -> bool {
    text.lines().count() == 1 && text.ends_with('\n')
}

#[test]
fn acquire_prints_only_the_token_and_release_frees_the_key() {
    let n = node();
    let servers = n.addr.to_string();
    let out = baton(&servers, &["acquire", "job", "--lease", "30"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let token: u64 = out
        .stdout
        .trim_end()
        .parse()
        .expect("only the token on stdout");
    assert_eq!(out.stdout, format!("{token}\n"));
    assert_eq!(out.stderr, "");
    let c = library(&servers);
    assert_eq!(holder(&c, "job"), Some(token), "held after baton exited");

    let out = baton(&servers, &["release", "job", &token.to_string()]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(0), ""),
        "{}",
        out.stderr
    );
    assert_eq!(holder(&c, "job"), None);

    let out = baton(&servers, &["release", "job", &token.to_string()]);
    assert_eq!(out.code, Some(1));
    assert!(
        one_line(&out.stderr) && out.stderr.contains("not held"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_timeout_is_one_line_on_stderr_and_exit_code_75() {
    let n = node();
    let servers = n.addr.to_string();
    let c = library(&servers);
    let _held = c
        .acquire("job", Duration::from_secs(30), None)
        .expect("granted");
    let out = baton(&servers, &["acquire", "job", "--wait", "0.2"]);
    assert_eq!((out.code, out.stdout.as_str()), (Some(75), ""));
    assert!(
        one_line(&out.stderr) && out.stderr.contains("timed out"),
        "{}",
        out.stderr
    );

    let scratch = Scratch::new("timeout");
    let marker = scratch.file("ran");
    let out = baton(
        &servers,
        &["run", "job", "--wait", "0.2", "--", "touch", &marker],
    );
    assert_eq!(out.code, Some(75));
    assert!(
        one_line(&out.stderr) && out.stderr.contains("timed out"),
        "{}",
        out.stderr
    );
    assert!(
        !std::path::Path::new(&marker).exists(),
        "the command did not run"
    );
}

#[test]
fn nonblock_takes_a_free_key_and_gives_up_at_once_on_a_held_one() {
    let n = node();
    let servers = n.addr.to_string();
    let out = baton(&servers, &["acquire", "-n", "job"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let token: u64 = out.stdout.trim_end().parse().expect("the token");

    // Held now (nobody released it): -n does not wait in line.
    for flag in ["-n", "--nonblock"] {
        let out = baton(&servers, &["acquire", "job", flag]);
        assert_eq!((out.code, out.stdout.as_str()), (Some(75), ""));
        assert!(
            one_line(&out.stderr) && out.stderr.contains("busy"),
            "{}",
            out.stderr
        );
    }
    let c = library(&servers);
    let status = c.query("job").expect("query");
    assert_eq!(status.token, Some(token), "the holder kept the key");
    assert_eq!(status.waiting, 0, "nobody was left in line");

    // -q: nothing at all on a busy key, the exit code says it.
    let scratch = Scratch::new("nonblock");
    let marker = scratch.file("ran");
    for args in [
        &["-q", "acquire", "job", "-n"][..],
        &["acquire", "--quiet", "job", "--wait", "0.05"][..],
        &["run", "-n", "-q", "job", "--", "touch", &marker][..],
    ] {
        let out = baton(&servers, args);
        assert_eq!(
            (out.code, out.stdout.as_str(), out.stderr.as_str()),
            (Some(75), "", ""),
            "{args:?}"
        );
    }
    assert!(
        !std::path::Path::new(&marker).exists(),
        "the command did not run"
    );

    // -q does not hide real failures.
    let nobody = format!("127.0.0.1:{}", common::free_port());
    let out = baton(&nobody, &["-q", "acquire", "-n", "job"]);
    assert_eq!(out.code, Some(1));
    assert!(one_line(&out.stderr), "{}", out.stderr);

    // Once released, -n takes it and run -n runs the command.
    assert_eq!(c.release_token("job", token), Ok(ReleaseOutcome::Released));
    let out = baton(&servers, &["run", "-n", "job", "--", "touch", &marker]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(std::path::Path::new(&marker).exists(), "the command ran");
}

#[test]
fn query_prints_the_holder_and_keep_extends_a_lease_by_token() {
    let n = node();
    let servers = n.addr.to_string();
    let out = baton(&servers, &["query", "job"]);
    assert_eq!(
        (out.code, out.stdout.as_str(), out.stderr.as_str()),
        (Some(0), "free 0 0 0\n", "")
    );

    let out = baton(&servers, &["acquire", "job", "--lease", "2"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let token = out.stdout.trim_end().to_string();
    let out = baton(&servers, &["query", "job"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let fields: Vec<&str> = out.stdout.split_whitespace().collect();
    assert_eq!(fields.len(), 4, "{}", out.stdout);
    assert_eq!(
        (fields[0], fields[1], fields[3]),
        ("held", token.as_str(), "0")
    );
    let left: f64 = fields[2].parse().expect("seconds left");
    assert!(left > 0.0 && left <= 2.0, "{left}");

    // keep: the lease becomes 60 s from now, far above the 2 s it had.
    let out = baton(&servers, &["keep", "job", &token, "--lease", "60"]);
    assert_eq!(
        (out.code, out.stdout.as_str(), out.stderr.as_str()),
        (Some(0), "", "")
    );
    let status = library(&servers).query("job").expect("query");
    assert_eq!(status.token.map(|t| t.to_string()), Some(token.clone()));
    assert!(status.time_left > Duration::from_secs(2), "{status:?}");

    // A token that does not hold the key: one line, exit 1.
    let wrong = (token.parse::<u64>().expect("token") + 1).to_string();
    let out = baton(&servers, &["keep", "job", &wrong]);
    assert_eq!(out.code, Some(1));
    assert!(
        one_line(&out.stderr) && out.stderr.contains("not held"),
        "{}",
        out.stderr
    );
}

#[test]
fn timeout_bounds_each_request_and_version_prints_the_version() {
    // A server that takes connections and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let servers = silent.local_addr().expect("addr").to_string();
    // The default request timeout is 5 s; 0.3 s must end well before 4 s.
    let out = start(&servers, &["--timeout", "0.3", "query", "job"])
        .finish_within(Duration::from_secs(4));
    assert_eq!(out.code, Some(1));
    assert!(
        one_line(&out.stderr) && out.stderr.contains("no answer"),
        "{}",
        out.stderr
    );
    drop(silent);

    for flag in ["--version", "-V"] {
        let out = baton("127.0.0.1:1", &[flag]);
        assert_eq!(out.code, Some(0));
        assert_eq!(out.stdout, format!("baton {}\n", env!("CARGO_PKG_VERSION")));
    }
}

#[test]
fn servers_come_from_baton_servers_and_failures_are_one_line() {
    let n = node();
    let out = start_with(&["acquire", "envkey"], Some(&n.addr.to_string())).finish();
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(holder(&library(&n.addr.to_string()), "envkey").is_some());

    let nobody = format!("127.0.0.1:{}", common::free_port());
    let start = Instant::now();
    let out = baton(&nobody, &["acquire", "k"]);
    assert_eq!(out.code, Some(1));
    assert!(
        one_line(&out.stderr) && out.stderr.contains("refused"),
        "{}",
        out.stderr
    );
    assert!(start.elapsed() < Duration::from_secs(5));

    let out = baton(&nobody, &["acquire"]);
    assert_eq!(out.code, Some(2));
    assert!(one_line(&out.stderr), "{}", out.stderr);

    let out = baton(&nobody, &["acquire", "k", "--lease", "abc"]);
    assert_eq!(out.code, Some(2));
    assert_eq!(
        out.stderr,
        "baton: --lease: expected seconds above 0, with up to 3 decimals (like 30 or 0.5), got 'abc' (see baton --help)\n"
    );
}

#[test]
fn a_flag_given_twice_is_one_line_naming_it_and_exit_2() {
    // Nothing listens on the server given: a flag wrongly accepted would
    // fail to connect (exit 1), not exit 2.
    let nobody = format!("127.0.0.1:{}", common::free_port());
    for (args, flag) in [
        (
            &["acquire", "k", "--lease", "1", "--lease", "2"][..],
            "--lease",
        ),
        (
            &["--timeout", "1", "--timeout", "2", "status"][..],
            "--timeout",
        ),
        (&["-q", "-q", "acquire", "k"][..], "-q"),
        (&["--tls", "status", "--tls"][..], "--tls"),
    ] {
        let out = baton(&nobody, args);
        assert_eq!(out.code, Some(2), "{args:?}: {}", out.stderr);
        assert_eq!(
            out.stderr,
            format!("baton: {flag}: given more than once; give it once (see baton --help)\n"),
            "{args:?}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: {}", out.stdout);
    }
    let out = baton(&nobody, &["--servers", "127.0.0.1:2", "status"]);
    assert_eq!(out.code, Some(2), "--servers given twice: {}", out.stderr);
    assert!(
        one_line(&out.stderr) && out.stderr.contains("--servers: given more than once"),
        "{}",
        out.stderr
    );
}

/// Both tools name a flag they do not know and list every flag they
/// accept, in one line, and exit 2.
#[test]
fn an_unknown_flag_is_named_with_every_flag_each_tool_accepts() {
    let nobody = format!("127.0.0.1:{}", common::free_port());
    let out = baton(&nobody, &["acquire", "k", "--leas", "3"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert_eq!(
        out.stderr,
        "baton: unknown flag --leas; accepted: --servers, --lease, --wait, -n/--nonblock, \
         --limit, --value, --once, --metrics, --by, --interval, --json, -q/--quiet, --timeout, \
         --auth-file, --tls, --tls-ca, \
         --tls-cert, --tls-key, -h/--help, -V/--version (see baton --help)\n"
    );
    let run = run_to_exit(
        batond_path(),
        &["--bind", "127.0.0.1", "--prot", "1"],
        DEADLINE,
    );
    assert_eq!(run.code, Some(2), "{run:?}");
    let accepted = baton::server::config::FLAGS.join(", ");
    assert_eq!(
        run.stderr,
        format!("batond: unknown flag --prot; accepted: {accepted}, -h/--help, -V/--version\n")
    );
    assert!(
        accepted.starts_with("--bind, --port, --peers"),
        "{accepted}"
    );
}

/// Complete each of `lines` (the command line up to the cursor) with the
/// script `baton completions <shell>` prints, in `<shell> -c <driver>`; one
/// line of output per line completed.
fn complete_in(shell: &[&str], driver: &str, lines: &[&str]) -> Vec<String> {
    let mut args = shell.to_vec();
    args.extend(["-c", driver, "complete", baton_path()]);
    args.extend(lines);
    let run = run_to_exit(args[0], &args[1..], DEADLINE);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stderr.is_empty(), "{run:?}");
    run.stdout.lines().map(str::to_string).collect()
}

/// As bash calls a completion function, without the bash-completion
/// package: COMP_LINE and COMP_POINT, and the words bash splits.
const BASH_DRIVER: &str = r#"
source <("$1" completions bash) || exit 1
shift
for line in "$@"; do
    COMP_LINE=$line COMP_POINT=${#line}
    read -ra COMP_WORDS <<<"$line"
    [[ $line == *' ' ]] && COMP_WORDS+=("")
    COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
    COMPREPLY=()
    _baton
    echo "${COMPREPLY[*]}"
done
"#;

#[test]
fn the_bash_completion_offers_commands_the_flags_each_accepts_files_and_shells() {
    let out = start_with(&["completions", "bash"], Some("not a server list")).finish();
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("complete -F _baton baton"),
        "{}",
        out.stdout
    );
    let scratch = Scratch::new("complete");
    std::fs::write(scratch.file("secret"), "x").expect("write");
    let path_prefix = scratch.file("sec");
    let cases = [
        (
            "baton ",
            "acquire release run keep query watch top status completions".to_string(),
        ),
        ("baton st", "status".into()),
        (
            "baton -",
            "--servers -q --quiet --timeout --auth-file --tls --tls-ca --tls-cert --tls-key \
             -h --help -V --version"
                .into(),
        ),
        (
            "baton acquire k --",
            "--servers --lease --wait --nonblock --limit --value --quiet --timeout --auth-file \
             --tls --tls-ca --tls-cert --tls-key"
                .into(),
        ),
        (
            "baton watch k --",
            "--servers --once --quiet --timeout --auth-file --tls --tls-ca --tls-cert \
             --tls-key"
                .into(),
        ),
        (
            "baton --servers a:1,b:2 keep k 1 --",
            "--servers --lease --quiet --timeout --auth-file --tls --tls-ca --tls-cert \
             --tls-key"
                .into(),
        ),
        ("baton query k --l", String::new()),
        ("baton completions ", "bash zsh".into()),
        ("baton --lease ", String::new()),
        ("baton --timeout 1 ac", "acquire".into()),
        (
            &format!("baton --auth-file {path_prefix}"),
            scratch.file("secret"),
        ),
    ];
    let lines: Vec<&str> = cases.iter().map(|(line, _)| *line).collect();
    let got = complete_in(&["bash", "--noprofile", "--norc"], BASH_DRIVER, &lines);
    assert_eq!(got.len(), cases.len(), "{got:?}");
    for ((line, expected), got) in cases.iter().zip(&got) {
        assert_eq!(got, expected, "{line:?}");
    }
}

/// zsh's completion functions replaced by ones that print what they were
/// given, so the script's choices can be read off.
const ZSH_DRIVER: &str = r#"
compdef() { }
_describe() {
    [[ $1 == -t ]] && shift 2
    shift
    local e
    local -a names
    for e in "${(@P)1}"; do names+=("${e%%:*}"); done
    print -r -- "${names[*]}"
}
compadd() { print -r -- "$*"; }
_files() { print -r -- "(files)"; }
_message() { print -r -- "(a value)"; }
_normal() { print -r -- "(normal at $CURRENT: ${words[*]})"; }
source <("$1" completions zsh) || exit 1
shift
for line in "$@"; do
    words=(${=line})
    [[ $line == *' ' ]] && words+=("")
    CURRENT=${#words}
    _baton
done
"#;

/// Whether zsh is installed; CI sets BATON_REQUIRE_ZSH=1 (it installs
/// zsh), so that a missing zsh fails there instead of skipping.
fn zsh_present() -> bool {
    let found = common::on_path("zsh").is_some();
    if !found {
        assert!(
            std::env::var_os("BATON_REQUIRE_ZSH").is_none(),
            "BATON_REQUIRE_ZSH is set and zsh is not installed"
        );
        eprintln!("zsh completion test skipped: no zsh");
    }
    found
}

#[test]
fn the_zsh_completion_parses_and_offers_commands_the_flags_each_accepts_files_and_shells() {
    if !zsh_present() {
        return;
    }
    let out = baton("127.0.0.1:1", &["completions", "zsh"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.starts_with("#compdef baton\n"), "{}", out.stdout);
    let cases = [
        (
            "baton ",
            "acquire release run keep query watch top status completions",
        ),
        (
            "baton -",
            "--servers -q --quiet --timeout --auth-file --tls --tls-ca --tls-cert --tls-key \
             -h --help -V --version",
        ),
        (
            "baton run k -",
            "--servers --lease --wait -n --nonblock --limit --value -q --quiet --timeout \
             --auth-file --tls --tls-ca --tls-cert --tls-key",
        ),
        (
            "baton watch k -",
            "--servers --once -q --quiet --timeout --auth-file --tls --tls-ca --tls-cert \
             --tls-key",
        ),
        ("baton acquire k --limit ", "(a value)"),
        (
            "baton --servers a:1 status -",
            "--servers -q --quiet --timeout --auth-file --tls --tls-ca --tls-cert --tls-key",
        ),
        ("baton completions ", "bash zsh"),
        ("baton --tls-ca /et", "(files)"),
        ("baton acquire k --wait ", "(a value)"),
        ("baton run k -- ls /et", "(normal at 2: ls /et)"),
    ];
    let lines: Vec<&str> = cases.iter().map(|(line, _)| *line).collect();
    let got = complete_in(&["zsh", "-f"], ZSH_DRIVER, &lines);
    assert_eq!(got.len(), cases.len(), "{got:?}");
    for ((line, expected), got) in cases.iter().zip(&got) {
        assert_eq!(got, expected, "{line:?}");
    }
}

/// A lease or wait too long for the server is refused by it with the same
/// line whatever its number of digits, also past what 64 bits hold.
#[test]
fn a_huge_lease_or_wait_is_refused_by_the_server_however_many_digits_it_has() {
    let n = node();
    let server = n.addr.to_string();
    for huge in ["99999999999", "99999999999999999999"] {
        for (flag, reason) in [("--lease", "lease-too-long"), ("--wait", "wait-too-long")] {
            let out = baton(&server, &["acquire", "k", flag, huge]);
            assert_eq!(out.code, Some(1), "{flag} {huge}: {}", out.stderr);
            assert_eq!(
                out.stderr,
                format!("baton: cannot acquire k: refused by the server: {reason}\n"),
                "{flag} {huge}"
            );
        }
    }
    assert_eq!(holder(&library(&server), "k"), None, "nothing was granted");
}

#[test]
fn status_prints_each_servers_role_and_counts() {
    let (a, b) = (node(), node());
    let c = library(&a.addr.to_string());
    let _held = c
        .acquire("k", Duration::from_secs(30), None)
        .expect("granted");
    let servers = format!("{},{}", a.addr, b.addr);
    let out = baton(&servers, &["status"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    assert!(
        lines[0].starts_with(&format!("{} role=active", a.addr)),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].contains(" held=1") && lines[0].contains(" active="),
        "{}",
        lines[0]
    );
    assert!(lines[1].contains(" held=0"), "{}", lines[1]);

    let nobody = format!("127.0.0.1:{}", common::free_port());
    let out = baton(&format!("{},{nobody}", a.addr), &["status"]);
    assert_eq!(out.code, Some(1));
    assert_eq!(out.stdout.lines().count(), 1);
    assert!(
        one_line(&out.stderr) && out.stderr.contains(&nobody),
        "{}",
        out.stderr
    );
}

#[test]
fn run_passes_key_token_and_exit_code_and_releases() {
    let n = node();
    let servers = n.addr.to_string();
    let script = r#"echo "$BATON_KEY $BATON_TOKEN"; exit 7"#;
    let out = baton(&servers, &["run", "job", "--", "sh", "-c", script]);
    assert_eq!(out.code, Some(7), "{}", out.stderr);
    let (key, token) = out
        .stdout
        .trim_end()
        .split_once(' ')
        .expect("key and token");
    assert_eq!(key, "job");
    assert!(token.parse::<u64>().is_ok_and(|t| t > 0), "{token}");
    assert_eq!(out.stderr, "");
    assert_eq!(holder(&library(&servers), "job"), None, "released on exit");

    let out = baton(&servers, &["run", "job", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(out.code, Some(128 + 15), "killed by a signal: 128 + N");
    assert_eq!(
        holder(&library(&servers), "job"),
        None,
        "released after a kill"
    );
}

#[test]
fn a_command_that_cannot_start_exits_127_and_releases() {
    let n = node();
    let servers = n.addr.to_string();
    let out = baton(&servers, &["run", "job", "--", "/nonexistent/command"]);
    assert_eq!(out.code, Some(127));
    assert!(one_line(&out.stderr), "{}", out.stderr);
    assert_eq!(holder(&library(&servers), "job"), None);
}

#[test]
fn two_runs_on_one_key_never_overlap() {
    let n = node();
    let servers = n.addr.to_string();
    let scratch = Scratch::new("overlap");
    let log = scratch.file("log");
    let script = format!(
        r#"echo "start $BATON_TOKEN" >> {log}; sleep 0.3; echo "end $BATON_TOKEN" >> {log}"#
    );
    let runs: Vec<Baton> = (0..3)
        .map(|_| start(&servers, &["run", "shared", "--", "sh", "-c", &script]))
        .collect();
    for run in runs {
        let out = run.finish();
        assert_eq!(out.code, Some(0), "{}", out.stderr);
    }
    let text = std::fs::read_to_string(&log).expect("the log");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "{text}");
    let mut last = 0;
    for pair in lines.chunks(2) {
        let start = pair[0].strip_prefix("start ").expect("a start");
        assert_eq!(pair[1], format!("end {start}"), "no overlap:\n{text}");
        let token: u64 = start.parse().expect("a token");
        assert!(token > last, "tokens grow:\n{text}");
        last = token;
    }
}

#[test]
fn a_command_that_outlives_its_lease_keeps_the_key() {
    let n = node();
    let servers = n.addr.to_string();
    let c = library(&servers);
    let run = start(
        &servers,
        &["run", "long", "--lease", "1", "--", "sleep", "3"],
    );
    let token = wait_for("the run to hold the key", DEADLINE, || holder(&c, "long"));
    let start = Instant::now();
    let wait = Some(Duration::from_millis(100));
    while start.elapsed() < Duration::from_millis(2500) {
        assert_eq!(holder(&c, "long"), Some(token), "the same grant all along");
        assert_eq!(
            c.acquire("long", Duration::from_secs(1), wait),
            Err(Error::Timeout)
        );
    }
    let out = run.finish();
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(holder(&c, "long"), None);
}

/// The command started by a `run`, killed by its PID when dropped if a
/// failing test left it running.
struct RunCommand(u32);

impl RunCommand {
    fn is_gone(&self) -> bool {
        !std::path::Path::new(&format!("/proc/{}", self.0)).exists()
    }
}

impl Drop for RunCommand {
    fn drop(&mut self) {
        if !self.is_gone() {
            let _ = Command::new("kill")
                .args(["-KILL", &self.0.to_string()])
                .status();
        }
    }
}

/// Start `run k [extra...]` of a command that sleeps 30 s and writes its PID
/// to a file; wait until it holds the key. The run, its token and command.
fn start_long_run(
    servers: &str,
    scratch: &Scratch,
    c: &Client,
    extra: &[&str],
) -> (Baton, u64, RunCommand) {
    let pid_file = scratch.file("pid");
    let script = format!("echo $$ > {pid_file}; exec sleep 30");
    let mut args = vec!["run", "k"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", &script]);
    let run = start(servers, &args);
    let token = wait_for("the run to hold the key", DEADLINE, || holder(c, "k"));
    let pid = wait_for("the command to start", DEADLINE, || {
        std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    });
    (run, token, RunCommand(pid))
}

#[test]
fn a_command_whose_key_is_lost_with_its_server_is_terminated() {
    let n = node();
    let servers = n.addr.to_string();
    let scratch = Scratch::new("lost");
    let c = library(&servers);
    let (run, _, command) = start_long_run(&servers, &scratch, &c, &["--lease", "1"]);
    drop(n); // SIGKILL: no standby
    let killed = Instant::now();
    let out = run.finish();
    assert_eq!(out.code, Some(1));
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "{:?}",
        killed.elapsed()
    );
    assert!(out.stderr.contains("lost k"), "{}", out.stderr);
    assert!(command.is_gone(), "the command was terminated");
}

#[test]
fn a_command_whose_key_is_released_elsewhere_is_terminated() {
    let n = node();
    let servers = n.addr.to_string();
    let scratch = Scratch::new("stolen");
    let c = library(&servers);
    let (run, token, command) = start_long_run(&servers, &scratch, &c, &["--lease", "1"]);
    assert_eq!(c.release_token("k", token), Ok(ReleaseOutcome::Released));
    let out = run.finish_within(Duration::from_secs(3));
    assert_eq!(out.code, Some(1));
    assert!(one_line(&out.stderr), "{}", out.stderr);
    assert!(out.stderr.contains("no longer held"), "{}", out.stderr);
    assert!(command.is_gone(), "the command was terminated");
}

#[test]
fn a_signal_to_baton_reaches_the_command_and_the_key_is_released() {
    let n = node();
    let servers = n.addr.to_string();
    let c = library(&servers);
    let scratch = Scratch::new("signal");
    let (run, _, command) = start_long_run(&servers, &scratch, &c, &[]);
    let status = Command::new("kill")
        .args(["-INT", &run.pid().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let out = run.finish_within(Duration::from_secs(3));
    assert_eq!(out.code, Some(128 + 2), "{}", out.stderr);
    assert!(command.is_gone());
    assert_eq!(holder(&c, "k"), None);
}

#[test]
fn a_run_that_waited_in_line_longer_than_its_lease_runs_its_command() {
    let n = node();
    let servers = n.addr.to_string();
    let c = library(&servers);
    let held = c
        .acquire("k", Duration::from_secs(30), None)
        .expect("granted");
    let run = start(
        &servers,
        &["run", "k", "--lease", "1", "--", "sleep", "0.5"],
    );
    wait_for("the run to wait in line", DEADLINE, || {
        (c.query("k").expect("query").waiting == 1).then_some(())
    });
    std::thread::sleep(Duration::from_millis(1500)); // longer in line than the lease
    c.release(&held).expect("released");
    let out = run.finish();
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stderr, "");
}

/// A new pseudo-terminal: (master, slave).
fn open_pty() -> (std::fs::File, std::fs::File) {
    use std::os::fd::FromRawFd;
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty writes two new descriptors; the null arguments ask
    // for the default name, settings (ISIG on, ^C as INTR) and size.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    for fd in [master, slave] {
        // Not inherited by other tests' processes (the slave becomes the
        // child's stdin by dup2, which clears the flag there).
        // SAFETY: fcntl on descriptors this function owns.
        let rc = unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        assert_eq!(rc, 0, "fcntl: {}", std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and owned by nothing else.
    unsafe {
        (
            std::fs::File::from_raw_fd(master),
            std::fs::File::from_raw_fd(slave),
        )
    }
}

#[test]
fn a_ctrl_c_typed_in_the_terminal_stops_the_command_and_the_key_is_released() {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    let n = node();
    let servers = n.addr.to_string();
    let c = library(&servers);
    let scratch = Scratch::new("ctrl-c");
    let pid_file = scratch.file("pid");
    let script = format!("echo $$ > {pid_file}; exec sleep 30");
    let (mut master, slave) = open_pty();
    let mut command = Command::new(baton_path());
    command
        .args(["--servers", &servers, "run", "k", "--", "sh", "-c", &script])
        .env_remove("BATON_SERVERS")
        .env_remove("RUST_LOG")
        .stdin(slave)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setsid and ioctl are async-signal-safe. baton becomes the
    // leader of a new session whose controlling terminal is the pty (its
    // stdin), so its process group — shared with the command it starts —
    // is the terminal's foreground group, as in an interactive shell.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let run = Baton {
        child: command.spawn().expect("spawn baton on a pty"),
    };
    wait_for("the run to hold the key", DEADLINE, || holder(&c, "k"));
    let pid = wait_for("the command to start", DEADLINE, || {
        std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    });
    let command = RunCommand(pid);
    // Ctrl+C: the terminal sends SIGINT to its foreground process group,
    // baton and the command alike. baton passes on only signals a process
    // sent it; whether the command saw this one once cannot be told from
    // here (a second SIGINT pending at once merges with the first).
    master.write_all(&[0x03]).expect("type ^C");
    let out = run.finish_within(Duration::from_secs(3));
    assert_eq!(out.code, Some(128 + 2), "{}", out.stderr);
    assert!(command.is_gone(), "the command stopped");
    assert_eq!(holder(&c, "k"), None, "the key was released");
}

#[test]
fn acquire_with_a_limit_prints_the_token_and_the_slot() {
    let n = node();
    let servers = n.addr.to_string();
    let slots: Vec<(u64, u32)> = (0..2)
        .map(|_| {
            let out = baton(
                &servers,
                &["acquire", "pool", "--limit", "2", "--value", "cli"],
            );
            assert_eq!(out.code, Some(0), "{}", out.stderr);
            assert!(one_line(&out.stdout), "{:?}", out.stdout);
            let (token, slot) = out.stdout.trim_end().split_once(' ').expect("`TOKEN SLOT`");
            (
                token.parse().expect("a token"),
                slot.parse().expect("a slot"),
            )
        })
        .collect();
    assert_eq!((slots[0].1, slots[1].1), (0, 1), "{slots:?}");
    assert!(slots[0].0 < slots[1].0, "{slots:?}");
    // Both hold the key at once; a third finds both slots taken.
    let out = baton(&servers, &["acquire", "pool", "--limit", "2", "-n"]);
    assert_eq!(out.code, Some(75), "{}", out.stderr);
    // Another limit while it is held is the server's limit-mismatch.
    let out = baton(&servers, &["acquire", "pool", "--limit", "3", "-n"]);
    assert_eq!(out.code, Some(1));
    assert!(
        one_line(&out.stderr) && out.stderr.contains("limit-mismatch"),
        "{}",
        out.stderr
    );
    // Without --limit, only the token: a plain mutex elsewhere.
    let out = baton(&servers, &["acquire", "plain", "--value", "cli"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.trim_end().parse::<u64>().is_ok(),
        "{:?}",
        out.stdout
    );
    // A limit out of range never reaches a server.
    let out = baton(&servers, &["acquire", "pool", "--limit", "0"]);
    assert_eq!(out.code, Some(2));
    assert!(out.stderr.contains("--limit"), "{}", out.stderr);
}

#[test]
fn run_with_a_limit_exports_the_slot_and_shares_the_key() {
    let n = node();
    let servers = n.addr.to_string();
    let other = library(&servers)
        .acquire_with(
            "pool",
            Duration::from_secs(30),
            None,
            &baton::client::AcquireOptions::new().limit(2),
        )
        .expect("slot 0 held elsewhere");
    assert_eq!(other.slot(), 0);
    let script = r#"echo "$BATON_KEY $BATON_TOKEN $BATON_SLOT""#;
    let out = baton(
        &servers,
        &[
            "run", "pool", "--limit", "2", "-n", "--", "sh", "-c", script,
        ],
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let fields: Vec<&str> = out.stdout.split_whitespace().collect();
    assert_eq!(fields.len(), 3, "{:?}", out.stdout);
    assert_eq!((fields[0], fields[2]), ("pool", "1"), "the free slot");
    let token: u64 = fields[1].parse().expect("a token");
    assert!(token > other.token());
    // A plain run exports slot 0.
    let out = baton(
        &servers,
        &["run", "solo", "--", "sh", "-c", "echo $BATON_SLOT"],
    );
    assert_eq!((out.code, out.stdout.as_str()), (Some(0), "0\n"));
}
