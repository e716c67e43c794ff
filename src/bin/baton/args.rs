//! `baton`'s command line: turning arguments into a [`Cli`], with one clear
//! message for anything wrong.
//!
//! Owns: flags (pico-args), their defaults — `--servers` from the flag, else
//! `$BATON_SERVERS`, else `127.0.0.1:7373`; `--lease 30`; `--wait 0` (no
//! limit); `-n` (the shortest wait the wire allows, 1 ms); `--timeout 5` —
//! and the help text. Runs once on the main thread. Seconds have no upper
//! bound here: a well-formed number too large for a u64 of milliseconds is
//! read as the largest, and the server answers `lease-too-long` or
//! `wait-too-long` as it does for any lease or wait above its maximum.
//!
//! Never does: I/O, or look at anything after `--` (that is the command
//! `run` starts, passed on untouched).

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::time::Duration;

use baton::client::parse_servers;
use baton::protocol::{Key, parse_seconds_saturating};

/// Servers used when neither `--servers` nor `$BATON_SERVERS` names any.
pub const DEFAULT_SERVERS: &str = "127.0.0.1:7373";
/// Lease used when `--lease` is not given, in milliseconds.
pub const DEFAULT_LEASE_MS: u64 = 30_000;
/// The wait `-n` asks for: the shortest the wire allows (0 means no
/// limit), so a key that is held is answered `T` a millisecond later.
pub const NONBLOCK_WAIT: Duration = Duration::from_millis(1);

/// The help text of `baton --help`.
pub const HELP: &str = "\
baton: the command-line client of the baton lock server

USAGE:
  baton [FLAGS] acquire KEY [--lease S] [--wait S | -n]
  baton [FLAGS] release KEY TOKEN
  baton [FLAGS] run KEY [--lease S] [--wait S | -n] -- COMMAND [ARGS...]
  baton [FLAGS] keep KEY TOKEN [--lease S]
  baton [FLAGS] query KEY
  baton [FLAGS] status
  baton --version

COMMANDS:
  acquire   wait for KEY, print its fencing token; the key stays held until
            `baton release` or until the lease runs out
  release   release the grant TOKEN of KEY
  run       hold KEY while COMMAND runs: COMMAND gets BATON_KEY and
            BATON_TOKEN, the lease is kept alive (every third of it), the key
            is released when COMMAND exits, and baton exits with its code;
            if the key is lost, COMMAND gets SIGTERM (SIGKILL 10 s later)
  keep      extend the lease of the grant TOKEN of KEY to now + --lease
  query     print who holds KEY: `held TOKEN SECONDS_LEFT WAITING`, or
            `free 0 0 WAITING`
  status    print each server's role, active node and counts

FLAGS:
  --servers LIST  servers, comma-separated (default: $BATON_SERVERS, else
                  127.0.0.1:7373)
  --lease S       seconds the grant lasts if not released or kept (default 30;
                  decimals allowed: 0.5)
  --wait S        most seconds to wait in line; 0 waits without limit
                  (default 0)
  -n, --nonblock  do not wait in line: take the key only if it is free now
                  (exit 75 when it is not)
  -q, --quiet     print nothing when the key is busy (the exit code is still
                  75)
  --timeout S     seconds each server has to answer a request (default 5)
  --auth-file PATH
                  authenticate with the first secret in PATH (the servers'
                  --auth-file format: one secret per line, blank and '#'
                  lines ignored) (default: $BATON_AUTH_FILE, else none)
  --tls           speak TLS, trusting the system's CAs
  --tls-ca PATH   speak TLS, trusting the CA certificates in this PEM file
                  (default: $BATON_TLS_CA; either one turns TLS on)
  --tls-cert PATH, --tls-key PATH
                  a client certificate and key (PEM) for servers that ask for
                  one (batond --tls-client-ca); turns TLS on
  -h, --help      print this help
  -V, --version   print the version

EXIT STATUS:
  0 success; 1 error (unreachable, refused, not held, key lost); 2 bad usage;
  75 the key was not granted within --wait (or at once with -n). `run` exits with COMMAND's code
  (128 + N when it is killed by signal N; 126/127 when it cannot start).
";

// What each numeric flag accepts, as its error message says it.
const EXPECT_LEASE: &str = "seconds above 0, with up to 3 decimals (like 30 or 0.5)";
const EXPECT_WAIT: &str = "seconds, with up to 3 decimals (like 10 or 0.5; 0 waits without limit)";
const EXPECT_TIMEOUT: &str = "seconds above 0, with up to 3 decimals (like 5 or 0.5)";

/// Every flag `baton` reads before `--` but `--help` and `--version`
/// (which end the parse at once), with both spellings of the short ones.
/// Each may be given once: a second one is an error that names it.
const FLAGS: [&str; 13] = [
    "--servers",
    "--timeout",
    "-q",
    "--quiet",
    "--auth-file",
    "--tls",
    "--tls-ca",
    "--tls-cert",
    "--tls-key",
    "--lease",
    "--wait",
    "-n",
    "--nonblock",
];

/// The commands, for messages.
const COMMANDS: &str = "acquire, release, run, keep, query or status";

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Acquire {
        key: Vec<u8>,
        lease: Duration,
        wait: Option<Duration>,
    },
    Release {
        key: Vec<u8>,
        token: u64,
    },
    Run {
        key: Vec<u8>,
        lease: Duration,
        wait: Option<Duration>,
        command: Vec<OsString>,
    },
    Keep {
        key: Vec<u8>,
        token: u64,
        lease: Duration,
    },
    Query {
        key: Vec<u8>,
    },
    Status,
    Help,
    Version,
}

/// The parsed command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cli {
    pub servers: Vec<String>,
    /// `--timeout`: the time a server has to answer one request.
    pub timeout: Option<Duration>,
    /// `-q`: say nothing when the key is busy.
    pub quiet: bool,
    /// `--auth-file`: where the secret is read from (`$BATON_AUTH_FILE`
    /// is looked at by the caller when this is None).
    pub auth_file: Option<PathBuf>,
    /// The TLS flags (`$BATON_TLS_CA` is looked at by the caller).
    pub tls: TlsFlags,
    pub command: Command,
}

/// `--tls`, `--tls-ca`, `--tls-cert`, `--tls-key`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFlags {
    pub on: bool,
    pub ca: Option<std::path::PathBuf>,
    /// Certificate and key, given together.
    pub cert_key: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// Flags of `acquire`, `run` and `keep`.
struct Timing {
    lease: Option<String>,
    wait: Option<String>,
    nonblock: bool,
}

/// Parse the arguments (without the program name); `env_servers` is
/// `$BATON_SERVERS`.
pub fn parse(args: Vec<OsString>, env_servers: Option<&str>) -> Result<Cli, String> {
    let (ours, command) = split_at_dashes(args);
    let mut args = pico_args::Arguments::from_vec(ours);
    for (flags, command) in [
        (["-h", "--help"], Command::Help),
        (["-V", "--version"], Command::Version),
    ] {
        if args.contains(flags) {
            return Ok(Cli {
                servers: Vec::new(),
                timeout: None,
                quiet: false,
                auth_file: None,
                tls: TlsFlags::default(),
                command,
            });
        }
    }
    let flag = |e: pico_args::Error| match e {
        pico_args::Error::OptionWithoutAValue(name) => {
            format!("{name}: expected a value, got nothing")
        }
        e => e.to_string(),
    };
    let servers: Option<String> = args.opt_value_from_str("--servers").map_err(flag)?;
    let timeout: Option<String> = args.opt_value_from_str("--timeout").map_err(flag)?;
    let quiet = args.contains(["-q", "--quiet"]);
    let auth_file = args
        .opt_value_from_os_str("--auth-file", |s| {
            Ok::<_, std::convert::Infallible>(PathBuf::from(s))
        })
        .map_err(flag)?;
    let tls = read_tls_flags(&mut args)?;
    let timing = Timing {
        lease: args.opt_value_from_str("--lease").map_err(flag)?,
        wait: args.opt_value_from_str("--wait").map_err(flag)?,
        nonblock: args.contains(["-n", "--nonblock"]),
    };
    // Each flag read took its first occurrence: one still left was given
    // again.
    let words = args.finish();
    if let Some(again) = words.iter().find(|w| FLAGS.iter().any(|f| *w == *f)) {
        return Err(format!(
            "{}: given more than once; give it once",
            again.to_string_lossy()
        ));
    }
    if let Some(unknown) = words.iter().find(|w| is_flag(w)) {
        return Err(format!("unknown flag {}", unknown.to_string_lossy()));
    }
    let tls = tls.check()?;
    let servers = choose_servers(servers.as_deref(), env_servers)?;
    let timeout = timeout.as_deref().map(read_timeout).transpose()?;
    let command = command_from(words, timing, command)?;
    Ok(Cli {
        servers,
        timeout,
        quiet,
        auth_file,
        tls,
        command,
    })
}

/// The TLS flags as given, before they are checked together (after every
/// flag is read, so that a repeated one is named as such first).
struct TlsGiven {
    on: bool,
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

impl TlsGiven {
    fn check(self) -> Result<TlsFlags, String> {
        let cert_key = match (self.cert, self.key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err("--tls-cert and --tls-key go together".into()),
        };
        Ok(TlsFlags {
            on: self.on || self.ca.is_some() || cert_key.is_some(),
            ca: self.ca,
            cert_key,
        })
    }
}

fn read_tls_flags(args: &mut pico_args::Arguments) -> Result<TlsGiven, String> {
    let on = args.contains("--tls");
    let mut path = |name: &'static str| {
        let value = args
            .opt_value_from_os_str(name, |v| {
                Ok::<_, std::convert::Infallible>(v.to_os_string())
            })
            .map_err(|_| format!("{name}: expected a path, got nothing"))?;
        match value {
            Some(v) if v.is_empty() => Err(format!("{name}: expected a path, got ''")),
            v => Ok(v.map(PathBuf::from)),
        }
    };
    Ok(TlsGiven {
        ca: path("--tls-ca")?,
        cert: path("--tls-cert")?,
        key: path("--tls-key")?,
        on,
    })
}

fn read_timeout(text: &str) -> Result<Duration, String> {
    match parse_seconds_saturating(text.as_bytes()) {
        Some(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => Err(format!(
            "--timeout: expected {EXPECT_TIMEOUT}, got '{text}'"
        )),
    }
}

/// Everything before the first `--`, and everything after it (None when
/// there is no `--`).
fn split_at_dashes(mut args: Vec<OsString>) -> (Vec<OsString>, Option<Vec<OsString>>) {
    match args.iter().position(|a| a == "--") {
        Some(at) => {
            let after = args.split_off(at + 1);
            args.pop();
            (args, Some(after))
        }
        None => (args, None),
    }
}

fn is_flag(word: &OsString) -> bool {
    let bytes = word.as_encoded_bytes();
    bytes.len() > 1 && bytes[0] == b'-'
}

/// `--servers`, else `$BATON_SERVERS` (when not empty), else the default.
fn choose_servers(flag: Option<&str>, env: Option<&str>) -> Result<Vec<String>, String> {
    let (list, source) = match (flag, env.filter(|e| !e.trim().is_empty())) {
        (Some(list), _) => (list, "--servers"),
        (None, Some(list)) => (list, "BATON_SERVERS"),
        (None, None) => (DEFAULT_SERVERS, "the default"),
    };
    let entries: Vec<&str> = list.split(',').collect();
    parse_servers(&entries).map_err(|e| format!("{source}: {e}"))
}

fn command_from(
    words: Vec<OsString>,
    timing: Timing,
    after_dashes: Option<Vec<OsString>>,
) -> Result<Command, String> {
    let mut words = words.into_iter();
    let Some(name) = words.next() else {
        return Err(format!("no command given: {COMMANDS}"));
    };
    let name = name.to_string_lossy().into_owned();
    let rest: Vec<OsString> = words.collect();
    if name != "run" && after_dashes.is_some() {
        return Err(format!("`--` is only for `run`, not `{name}`"));
    }
    let waits = matches!(name.as_str(), "acquire" | "run");
    if !waits && (timing.wait.is_some() || timing.nonblock) {
        return Err(format!(
            "--wait and -n are for acquire and run, not `{name}`"
        ));
    }
    if !waits && name != "keep" && timing.lease.is_some() {
        return Err(format!(
            "--lease is for acquire, run and keep, not `{name}`"
        ));
    }
    if timing.nonblock && timing.wait.is_some() {
        return Err("give either --wait or -n, not both".into());
    }
    match name.as_str() {
        "acquire" => {
            let [key] = positional(rest, ["KEY"], &name)?;
            let (lease, wait) = read_timing(&timing)?;
            Ok(Command::Acquire {
                key: check_key(key)?,
                lease,
                wait,
            })
        }
        "release" => {
            let [key, token] = positional(rest, ["KEY", "TOKEN"], &name)?;
            Ok(Command::Release {
                key: check_key(key)?,
                token: check_token(&token)?,
            })
        }
        "run" => run_command(rest, &timing, after_dashes),
        "keep" => {
            let [key, token] = positional(rest, ["KEY", "TOKEN"], &name)?;
            let (lease, _) = read_timing(&timing)?;
            Ok(Command::Keep {
                key: check_key(key)?,
                token: check_token(&token)?,
                lease,
            })
        }
        "query" => {
            let [key] = positional(rest, ["KEY"], &name)?;
            Ok(Command::Query {
                key: check_key(key)?,
            })
        }
        "status" => {
            let [] = positional(rest, [], &name)?;
            Ok(Command::Status)
        }
        other => Err(format!("unknown command `{other}`: {COMMANDS}")),
    }
}

fn run_command(
    rest: Vec<OsString>,
    timing: &Timing,
    after_dashes: Option<Vec<OsString>>,
) -> Result<Command, String> {
    let command = match after_dashes {
        Some(command) if !command.is_empty() => command,
        _ => {
            return Err(
                "run needs a command after `--`: baton run KEY -- COMMAND [ARGS...]".into(),
            );
        }
    };
    let [key] = positional(rest, ["KEY"], "run")
        .map_err(|e| format!("{e} (the command goes after `--`)"))?;
    let (lease, wait) = read_timing(timing)?;
    Ok(Command::Run {
        key: check_key(key)?,
        lease,
        wait,
        command,
    })
}

/// Exactly the named positional arguments.
fn positional<const N: usize>(
    words: Vec<OsString>,
    names: [&str; N],
    command: &str,
) -> Result<[OsString; N], String> {
    let usage = || {
        let names = names.join(" ");
        format!("usage: baton {command} {names}")
            .trim_end()
            .to_string()
    };
    match <[OsString; N]>::try_from(words) {
        Ok(words) => Ok(words),
        Err(words) if words.len() > N => Err(format!(
            "unexpected argument {:?}; {}",
            words[N].to_string_lossy(),
            usage()
        )),
        Err(_) => Err(format!("missing {}; {}", names.join(" "), usage())),
    }
}

fn check_key(key: OsString) -> Result<Vec<u8>, String> {
    let bytes = key.into_vec();
    match Key::new(&bytes) {
        Ok(_) => Ok(bytes),
        Err(_) => Err(format!(
            "bad key {:?}: 1 to 250 bytes, no spaces or control characters",
            String::from_utf8_lossy(&bytes)
        )),
    }
}

fn check_token(token: &OsString) -> Result<u64, String> {
    match token.to_str().and_then(|t| t.parse::<u64>().ok()) {
        Some(token) if token > 0 => Ok(token),
        _ => Err(format!(
            "bad token {:?}: a positive whole number, as `baton acquire` prints it",
            token.to_string_lossy()
        )),
    }
}

fn read_timing(timing: &Timing) -> Result<(Duration, Option<Duration>), String> {
    let lease_ms = match &timing.lease {
        None => DEFAULT_LEASE_MS,
        Some(text) => match parse_seconds_saturating(text.as_bytes()) {
            Some(ms) if ms > 0 => ms,
            _ => return Err(format!("--lease: expected {EXPECT_LEASE}, got '{text}'")),
        },
    };
    let wait_ms = match &timing.wait {
        None => 0,
        Some(text) => parse_seconds_saturating(text.as_bytes())
            .ok_or_else(|| format!("--wait: expected {EXPECT_WAIT}, got '{text}'"))?,
    };
    let wait = match timing.nonblock {
        true => Some(NONBLOCK_WAIT),
        false => (wait_ms > 0).then(|| Duration::from_millis(wait_ms)),
    };
    Ok((Duration::from_millis(lease_ms), wait))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_with(args: &[&str], env: Option<&str>) -> Result<Cli, String> {
        parse(args.iter().map(OsString::from).collect(), env)
    }

    fn command(args: &[&str]) -> Command {
        parse_with(args, None).expect("valid command line").command
    }

    #[test]
    fn servers_come_from_the_flag_then_the_environment_then_the_default() {
        let servers = |args: &[&str], env| parse_with(args, env).expect("valid").servers;
        assert_eq!(servers(&["status"], None), vec!["127.0.0.1:7373"]);
        assert_eq!(servers(&["status"], Some(" ")), vec!["127.0.0.1:7373"]);
        assert_eq!(servers(&["status"], Some("e:1,f:2")), vec!["e:1", "f:2"]);
        assert_eq!(
            servers(&["--servers", "a:1", "status"], Some("e:1")),
            vec!["a:1"]
        );
        assert_eq!(servers(&["status", "--servers", "b:2"], None), vec!["b:2"]);
        let bad = parse_with(&["status"], Some("nope:x")).expect_err("bad env");
        assert!(bad.contains("BATON_SERVERS"), "{bad}");
    }

    #[test]
    fn auth_file_is_read_from_the_flag_anywhere_before_the_dashes() {
        let auth = |args: &[&str]| parse_with(args, None).expect("valid").auth_file;
        assert_eq!(auth(&["status"]), None);
        assert_eq!(
            auth(&["--auth-file", "/s", "status"]),
            Some(PathBuf::from("/s"))
        );
        assert_eq!(
            auth(&["status", "--auth-file", "/t"]),
            Some(PathBuf::from("/t"))
        );
        assert!(parse_with(&["status", "--auth-file"], None).is_err());
    }

    #[test]
    fn acquire_defaults_to_a_30_second_lease_and_no_wait_limit() {
        assert_eq!(
            command(&["acquire", "job"]),
            Command::Acquire {
                key: b"job".to_vec(),
                lease: Duration::from_secs(30),
                wait: None,
            }
        );
        assert_eq!(
            command(&["acquire", "job", "--lease", "1.5", "--wait", "0.25"]),
            Command::Acquire {
                key: b"job".to_vec(),
                lease: Duration::from_millis(1500),
                wait: Some(Duration::from_millis(250)),
            }
        );
        assert!(matches!(
            command(&["acquire", "job", "--wait", "0"]),
            Command::Acquire { wait: None, .. }
        ));
    }

    #[test]
    fn run_takes_everything_after_the_dashes_untouched() {
        assert_eq!(
            command(&[
                "run",
                "job",
                "--lease",
                "9",
                "--",
                "sh",
                "-c",
                "x --lease 1",
                "--"
            ]),
            Command::Run {
                key: b"job".to_vec(),
                lease: Duration::from_secs(9),
                wait: None,
                command: ["sh", "-c", "x --lease 1", "--"]
                    .map(OsString::from)
                    .to_vec(),
            }
        );
    }

    #[test]
    fn release_and_status_take_their_arguments() {
        assert_eq!(
            command(&["release", "job", "42"]),
            Command::Release {
                key: b"job".to_vec(),
                token: 42
            }
        );
        assert_eq!(command(&["status"]), Command::Status);
        assert_eq!(command(&["--help"]), Command::Help);
        assert_eq!(command(&["run", "-h"]), Command::Help);
        assert_eq!(command(&["--version"]), Command::Version);
        assert_eq!(command(&["-V"]), Command::Version);
    }

    #[test]
    fn keep_and_query_take_their_arguments() {
        assert_eq!(
            command(&["keep", "job", "42"]),
            Command::Keep {
                key: b"job".to_vec(),
                token: 42,
                lease: Duration::from_secs(30),
            }
        );
        assert_eq!(
            command(&["keep", "job", "42", "--lease", "2.5"]),
            Command::Keep {
                key: b"job".to_vec(),
                token: 42,
                lease: Duration::from_millis(2500),
            }
        );
        assert_eq!(
            command(&["query", "job"]),
            Command::Query {
                key: b"job".to_vec()
            }
        );
    }

    #[test]
    fn nonblock_asks_for_the_shortest_wait_and_quiet_and_timeout_are_global() {
        for flag in ["-n", "--nonblock"] {
            assert!(matches!(
                command(&["acquire", "job", flag]),
                Command::Acquire {
                    wait: Some(NONBLOCK_WAIT),
                    ..
                }
            ));
            assert!(matches!(
                command(&["run", flag, "job", "--", "true"]),
                Command::Run {
                    wait: Some(NONBLOCK_WAIT),
                    ..
                }
            ));
        }
        let cli = parse_with(&["-q", "--timeout", "0.5", "acquire", "job"], None).expect("valid");
        assert!(cli.quiet);
        assert_eq!(cli.timeout, Some(Duration::from_millis(500)));
        let cli = parse_with(&["acquire", "job", "--quiet"], None).expect("valid");
        assert!(cli.quiet);
        assert_eq!(cli.timeout, None);
    }

    #[test]
    fn numeric_flag_errors_name_the_flag_what_it_accepts_and_what_it_got() {
        let lease = "seconds above 0, with up to 3 decimals (like 30 or 0.5)";
        let wait = "seconds, with up to 3 decimals (like 10 or 0.5; 0 waits without limit)";
        let timeout = "seconds above 0, with up to 3 decimals (like 5 or 0.5)";
        let cases: &[(&[&str], String)] = &[
            (
                &["acquire", "k", "--lease", "0"],
                format!("--lease: expected {lease}, got '0'"),
            ),
            (
                &["keep", "k", "1", "--lease", "abc"],
                format!("--lease: expected {lease}, got 'abc'"),
            ),
            (
                &["run", "k", "--lease", "1.2345", "--", "true"],
                format!("--lease: expected {lease}, got '1.2345'"),
            ),
            (
                &["acquire", "k", "--wait", "-1"],
                format!("--wait: expected {wait}, got '-1'"),
            ),
            (
                &["--timeout", "0", "status"],
                format!("--timeout: expected {timeout}, got '0'"),
            ),
            (
                &["--timeout", "soon", "status"],
                format!("--timeout: expected {timeout}, got 'soon'"),
            ),
            (
                &["acquire", "k", "--lease"],
                "--lease: expected a value, got nothing".to_string(),
            ),
            (
                &["status", "--timeout"],
                "--timeout: expected a value, got nothing".to_string(),
            ),
            (
                &["status", "--servers"],
                "--servers: expected a value, got nothing".to_string(),
            ),
        ];
        for (args, expected) in cases {
            assert_eq!(parse_with(args, None).as_ref(), Err(expected), "{args:?}");
        }
    }

    #[test]
    fn a_huge_number_of_seconds_is_not_malformed_the_server_judges_it() {
        let huge = "99999999999999999999";
        let longest = Duration::from_millis(u64::MAX);
        assert_eq!(
            command(&["acquire", "k", "--lease", huge, "--wait", huge]),
            Command::Acquire {
                key: b"k".to_vec(),
                lease: longest,
                wait: Some(longest),
            }
        );
        let cli = parse_with(&["--timeout", huge, "status"], None).expect("valid");
        assert_eq!(cli.timeout, Some(longest));
        let err = parse_with(&["acquire", "k", "--lease", "99999999999999999999x"], None);
        assert!(err.is_err_and(|e| e.starts_with("--lease: expected")));
    }

    #[test]
    fn any_tls_flag_turns_tls_on() {
        let plain = parse_with(&["status"], None).expect("valid");
        assert_eq!(plain.tls, TlsFlags::default());
        let system = parse_with(&["--tls", "status"], None).expect("valid");
        assert!(system.tls.on && system.tls.ca.is_none());
        let ca = parse_with(&["--tls-ca", "/ca.pem", "status"], None).expect("valid");
        assert!(ca.tls.on);
        assert_eq!(ca.tls.ca, Some("/ca.pem".into()));
        let mtls =
            parse_with(&["--tls-cert", "/c", "--tls-key", "/k", "status"], None).expect("valid");
        assert!(mtls.tls.on);
        assert_eq!(mtls.tls.cert_key, Some(("/c".into(), "/k".into())));
        for flag in ["--tls-ca", "--tls-cert", "--tls-key"] {
            assert_eq!(
                parse_with(&["status", flag], None).map(|cli| cli.command),
                Err(format!("{flag}: expected a path, got nothing"))
            );
            assert_eq!(
                parse_with(&[flag, "", "status"], None).map(|cli| cli.command),
                Err(format!("{flag}: expected a path, got ''"))
            );
        }
        for lone in [["--tls-cert", "/c"], ["--tls-key", "/k"]] {
            let err = parse_with(&[lone[0], lone[1], "status"], None).expect_err("alone");
            assert!(err.contains("go together"), "{err}");
        }
    }

    #[test]
    fn a_flag_given_twice_is_an_error_that_names_it() {
        let value = |flag: &str| match flag {
            "--servers" => Some("a:1"),
            "-q" | "--quiet" | "--tls" | "-n" | "--nonblock" => None,
            f if f.starts_with("--tls") || f == "--auth-file" => Some("/f"),
            _ => Some("1"),
        };
        for flag in FLAGS {
            let mut args = vec![flag];
            args.extend(value(flag));
            let once = args.clone();
            args.extend(once.iter().copied());
            args.extend(["acquire", "k"]);
            assert_eq!(
                parse_with(&args, None).map(|cli| cli.command),
                Err(format!("{flag}: given more than once; give it once")),
                "{args:?}"
            );
            assert!(HELP.contains(flag), "--help lists {flag}");
        }
        let err = parse_with(&["acquire", "k", "--wait", "1", "--wait", "2"], None);
        assert_eq!(
            err.map(|cli| cli.command),
            Err("--wait: given more than once; give it once".to_string())
        );
        // The two spellings of one flag are one flag.
        let err = parse_with(&["-q", "acquire", "k", "--quiet"], None);
        assert_eq!(
            err.map(|cli| cli.command),
            Err("--quiet: given more than once; give it once".to_string())
        );
        // After `--`, flags belong to the command.
        assert!(matches!(
            command(&["run", "k", "--lease", "1", "--", "x", "--lease", "2"]),
            Command::Run { .. }
        ));
    }

    #[test]
    fn mistakes_get_one_clear_message() {
        let cases: &[(&[&str], &str)] = &[
            (&[], "no command"),
            (&["frobnicate"], "unknown command"),
            (&["acquire"], "missing KEY"),
            (&["acquire", "a", "b"], "unexpected argument"),
            (&["acquire", "a b"], "bad key"),
            (&["acquire", "k", "--lease", "0"], "--lease"),
            (&["acquire", "k", "--lease", "-1"], "--lease"),
            (&["acquire", "k", "--wait", "soon"], "--wait"),
            (&["acquire", "k", "--bogus"], "unknown flag"),
            (&["release", "k", "0"], "bad token"),
            (&["release", "k"], "missing"),
            (&["release", "k", "1", "--lease", "3"], "--lease is for"),
            (&["release", "k", "1", "-n"], "--wait and -n"),
            (&["keep", "k", "1", "--wait", "3"], "--wait and -n"),
            (&["query", "k", "--lease", "3"], "--lease is for"),
            (
                &["acquire", "k", "-n", "--wait", "1"],
                "either --wait or -n",
            ),
            (&["keep", "k"], "missing KEY TOKEN"),
            (&["keep", "k", "x"], "bad token"),
            (&["query"], "missing KEY"),
            (&["--timeout", "0", "status"], "--timeout"),
            (&["--timeout", "soon", "status"], "--timeout"),
            (&["status", "--", "x"], "only for `run`"),
            (&["run", "k"], "needs a command"),
            (&["run", "k", "--"], "needs a command"),
            (&["run", "k", "sleep", "--", "x"], "after `--`"),
            (&["--servers", "a:b", "status"], "--servers"),
        ];
        for (args, expected) in cases {
            let message = parse_with(args, None).expect_err("a mistake");
            assert!(message.contains(expected), "{args:?}: {message}");
            assert!(!message.contains('\n'), "{args:?}: {message}");
        }
    }
}
