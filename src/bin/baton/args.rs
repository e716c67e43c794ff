//! `baton`'s command line: the table of its commands and flags, and
//! turning arguments into a [`Cli`], with one clear message for anything
//! wrong.
//!
//! Owns: [`COMMANDS`] and [`FLAGS`], the one description of the command
//! line — the parser reads exactly the flags of [`FLAGS`], where they say
//! they are accepted, and `--help` ([`help`]) and the shell completions
//! (`baton/complete.rs`) are generated from the same two tables, so none
//! can name a flag the others do not. Also the defaults — `--servers` from
//! the flag, else `$BATON_SERVERS`, else `127.0.0.1:7373`; `--lease 30`;
//! `--wait 0` (no limit); `-n` (the shortest wait the wire allows, 1 ms);
//! `--timeout 5`. Runs once on the main thread. Seconds have no upper
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
use baton::protocol::{Key, MAX_LIMIT, Value, parse_seconds_saturating};

/// Servers used when neither `--servers` nor `$BATON_SERVERS` names any.
pub const DEFAULT_SERVERS: &str = "127.0.0.1:7373";
/// Lease used when `--lease` is not given, in milliseconds.
pub const DEFAULT_LEASE_MS: u64 = 30_000;
/// The wait `-n` asks for: the shortest the wire allows (0 means no
/// limit), so a key that is held is answered `T` a millisecond later.
pub const NONBLOCK_WAIT: Duration = Duration::from_millis(1);

/// One command of `baton`.
#[derive(Debug)]
pub struct Sub {
    /// The word that names it.
    pub name: &'static str,
    /// Its usage line in `--help`, after `baton `.
    pub usage: &'static str,
    /// One line, for completion menus.
    pub summary: &'static str,
    /// Its text in `--help`, wrapped: continuation lines are indented to
    /// the text's column when printed.
    pub help: &'static str,
}

/// What a flag takes after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Takes {
    /// Nothing: a switch.
    Nothing,
    /// A number of seconds (`S`).
    Seconds,
    /// A comma-separated list of `host:port` (`LIST`).
    Servers,
    /// A file (`PATH`).
    Path,
    /// A whole number (`N`).
    Number,
    /// A holder's value (`V`).
    Value,
    /// The order of `top`'s keys (`ORDER`: `waiting` or `age`).
    Order,
}

impl Takes {
    /// The value's name in `--help`.
    pub fn name(self) -> Option<&'static str> {
        match self {
            Takes::Nothing => None,
            Takes::Seconds => Some("S"),
            Takes::Servers => Some("LIST"),
            Takes::Path => Some("PATH"),
            Takes::Number => Some("N"),
            Takes::Value => Some("V"),
            Takes::Order => Some("ORDER"),
        }
    }
}

/// Where a flag is accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// With every command, before or after it.
    Global,
    /// Only with these commands.
    Only(&'static [&'static str]),
    /// Alone: it ends the parse at once (`--help`, `--version`).
    Alone,
}

/// One flag of `baton`.
#[derive(Debug)]
pub struct Flag {
    /// `--name`.
    pub long: &'static str,
    /// `-x`, if it has one.
    pub short: Option<&'static str>,
    /// What follows it.
    pub takes: Takes,
    /// Where it is accepted.
    pub scope: Scope,
    /// One line, for completion menus.
    pub summary: &'static str,
    /// Its text in `--help`, wrapped as [`Sub::help`].
    pub help: &'static str,
}

impl Flag {
    /// Its spellings: the short one first.
    pub fn spellings(&self) -> impl Iterator<Item = &'static str> {
        self.short.into_iter().chain([self.long])
    }

    /// How messages name it: `--lease`, `-n/--nonblock`.
    pub fn shown(&self) -> String {
        match self.short {
            Some(short) => format!("{short}/{}", self.long),
            None => self.long.to_string(),
        }
    }

    /// Whether `command` accepts it.
    pub fn accepted_by(&self, command: &str) -> bool {
        match self.scope {
            Scope::Global | Scope::Alone => true,
            Scope::Only(commands) => commands.contains(&command),
        }
    }
}

/// The commands, in the order `--help` lists them.
pub const COMMANDS: [Sub; 9] = [
    Sub {
        name: "acquire",
        usage: "[FLAGS] acquire KEY [--lease S] [--wait S | -n] [--limit N] [--value V]",
        summary: "wait for KEY and print its fencing token",
        help: "wait for KEY, print its fencing token (with --limit, then a\n\
               space and the slot); the key stays held until `baton release`\n\
               or until the lease runs out",
    },
    Sub {
        name: "release",
        usage: "[FLAGS] release KEY TOKEN",
        summary: "release the grant TOKEN of KEY",
        help: "release the grant TOKEN of KEY",
    },
    Sub {
        name: "run",
        usage: "[FLAGS] run KEY [--lease S] [--wait S | -n] [--limit N] [--value V]\n        \
                -- COMMAND [ARGS...]",
        summary: "hold KEY while a command runs",
        help: "hold KEY while COMMAND runs: COMMAND gets BATON_KEY, BATON_TOKEN\n\
               and BATON_SLOT, the lease is kept alive (every third of it), the\n\
               key is released when COMMAND exits, and baton exits with its\n\
               code; if the key is lost, COMMAND gets SIGTERM (SIGKILL 10 s\n\
               later)",
    },
    Sub {
        name: "keep",
        usage: "[FLAGS] keep KEY TOKEN [--lease S]",
        summary: "extend the lease of the grant TOKEN of KEY",
        help: "extend the lease of the grant TOKEN of KEY to now + --lease",
    },
    Sub {
        name: "query",
        usage: "[FLAGS] query KEY",
        summary: "print who holds KEY",
        help: "print who holds KEY: `held TOKEN SECONDS_LEFT WAITING`, or\n\
               `free 0 0 WAITING`",
    },
    Sub {
        name: "watch",
        usage: "[FLAGS] watch KEY [--once]",
        summary: "print a line each time KEY's holders change",
        help: "print `TOKEN HOLDERS WAITING VALUE` for KEY now and after every\n\
               change of its holders (TOKEN 0 and VALUE - when nobody holds\n\
               it), watching again on the new active node across a failover;\n\
               runs until Ctrl+C (exit 0)",
    },
    Sub {
        name: "top",
        usage: "top --metrics LIST [--by waiting|age] [--interval S] [--once | --json]",
        summary: "a live view of the contended keys, their holders and waiters",
        help: "fill the terminal with the nodes' roles and rates and the\n\
               contended keys (waiting, oldest wait, holders with value,\n\
               time held, lease left), refreshed every --interval; keys q\n\
               quit, w/a sort by waiting/oldest wait. --metrics lists every\n\
               node's metrics address (batond --metrics): the keys are the\n\
               active's. --once prints one snapshot as a plain table, --json\n\
               as JSON (rates are measured over one --interval)",
    },
    Sub {
        name: "status",
        usage: "[FLAGS] status",
        summary: "print each server's role, active node and counts",
        help: "print each server's role, active node and counts",
    },
    Sub {
        name: "completions",
        usage: "completions bash|zsh",
        summary: "print a shell completion script",
        help: "print a completion script for bash or zsh: load it with\n\
               `source <(baton completions bash)`, or install it (see the\n\
               comment at its top)",
    },
];

/// The shells `baton completions` writes a script for.
pub const SHELLS: [&str; 2] = ["bash", "zsh"];

const SERVERS: Flag = Flag {
    long: "--servers",
    short: None,
    takes: Takes::Servers,
    scope: Scope::Global,
    summary: "servers, comma-separated host:port",
    help: "servers, comma-separated (default: $BATON_SERVERS, else\n\
           127.0.0.1:7373)",
};
const LEASE: Flag = Flag {
    long: "--lease",
    short: None,
    takes: Takes::Seconds,
    scope: Scope::Only(&["acquire", "run", "keep"]),
    summary: "seconds the grant lasts (default 30)",
    help: "seconds the grant lasts if not released or kept (default 30;\n\
           decimals allowed: 0.5)",
};
const WAIT: Flag = Flag {
    long: "--wait",
    short: None,
    takes: Takes::Seconds,
    scope: Scope::Only(&["acquire", "run"]),
    summary: "most seconds to wait in line (0: no limit)",
    help: "most seconds to wait in line; 0 waits without limit\n\
           (default 0)",
};
const NONBLOCK: Flag = Flag {
    long: "--nonblock",
    short: Some("-n"),
    takes: Takes::Nothing,
    scope: Scope::Only(&["acquire", "run"]),
    summary: "take the key only if it is free now",
    help: "do not wait in line: take the key only if it is free now\n\
           (exit 75 when it is not)",
};
const LIMIT: Flag = Flag {
    long: "--limit",
    short: None,
    takes: Takes::Number,
    scope: Scope::Only(&["acquire", "run"]),
    summary: "up to N holders at once (a semaphore)",
    help: "KEY is a semaphore: up to N (1 to 10000) grants hold it at\n\
           once, each in its own slot 0..N-1 (default: 1, a mutex)",
};
const VALUE: Flag = Flag {
    long: "--value",
    short: None,
    takes: Takes::Value,
    scope: Scope::Only(&["acquire", "run"]),
    summary: "the holder's value, shown to watchers",
    help: "the holder's value, shown to watchers (1 to 250 bytes, no\n\
           spaces)",
};
const ONCE: Flag = Flag {
    long: "--once",
    short: None,
    takes: Takes::Nothing,
    scope: Scope::Only(&["watch", "top"]),
    summary: "print the state now and exit",
    help: "print the state now and exit (watch: the first line; top: one\n\
           snapshot as a plain table)",
};
const METRICS: Flag = Flag {
    long: "--metrics",
    short: None,
    takes: Takes::Servers,
    scope: Scope::Only(&["top"]),
    summary: "the nodes' metrics addresses, comma-separated host:port",
    help: "the nodes' metrics addresses (batond --metrics),\n\
           comma-separated host:port",
};
const BY: Flag = Flag {
    long: "--by",
    short: None,
    takes: Takes::Order,
    scope: Scope::Only(&["top"]),
    summary: "sort keys by waiting requests or by oldest wait",
    help: "sort the keys by `waiting` requests (default) or by the\n\
           `age` of their oldest waiter",
};
const INTERVAL: Flag = Flag {
    long: "--interval",
    short: None,
    takes: Takes::Seconds,
    scope: Scope::Only(&["top"]),
    summary: "seconds between refreshes (default 1)",
    help: "seconds between refreshes, and that rates are measured over\n\
           (default 1)",
};
const JSON: Flag = Flag {
    long: "--json",
    short: None,
    takes: Takes::Nothing,
    scope: Scope::Only(&["top"]),
    summary: "print one snapshot as JSON and exit",
    help: "print one snapshot as JSON and exit",
};
const QUIET: Flag = Flag {
    long: "--quiet",
    short: Some("-q"),
    takes: Takes::Nothing,
    scope: Scope::Global,
    summary: "print nothing when the key is busy",
    help: "print nothing when the key is busy (the exit code is still\n\
           75)",
};
const TIMEOUT: Flag = Flag {
    long: "--timeout",
    short: None,
    takes: Takes::Seconds,
    scope: Scope::Global,
    summary: "seconds each server has to answer (default 5)",
    help: "seconds each server has to answer a request (default 5)",
};
const AUTH_FILE: Flag = Flag {
    long: "--auth-file",
    short: None,
    takes: Takes::Path,
    scope: Scope::Global,
    summary: "authenticate with the first secret in this file",
    help: "authenticate with the first secret in PATH (the servers'\n\
           --auth-file format: one secret per line, blank and '#'\n\
           lines ignored) (default: $BATON_AUTH_FILE, else none)",
};
const TLS: Flag = Flag {
    long: "--tls",
    short: None,
    takes: Takes::Nothing,
    scope: Scope::Global,
    summary: "speak TLS, trusting the system's CAs",
    help: "speak TLS, trusting the system's CAs",
};
const TLS_CA: Flag = Flag {
    long: "--tls-ca",
    short: None,
    takes: Takes::Path,
    scope: Scope::Global,
    summary: "speak TLS, trusting the CAs in this PEM file",
    help: "speak TLS, trusting the CA certificates in this PEM file\n\
           (default: $BATON_TLS_CA; either one turns TLS on)",
};
const TLS_CERT: Flag = Flag {
    long: "--tls-cert",
    short: None,
    takes: Takes::Path,
    scope: Scope::Global,
    summary: "a client certificate (PEM), with --tls-key",
    help: "a client certificate (PEM) for servers that ask for one\n\
           (batond --tls-client-ca), with --tls-key; turns TLS on",
};
const TLS_KEY: Flag = Flag {
    long: "--tls-key",
    short: None,
    takes: Takes::Path,
    scope: Scope::Global,
    summary: "the private key (PEM) of --tls-cert",
    help: "the private key (PEM) of --tls-cert",
};
const HELP: Flag = Flag {
    long: "--help",
    short: Some("-h"),
    takes: Takes::Nothing,
    scope: Scope::Alone,
    summary: "print the help",
    help: "print this help",
};
const VERSION: Flag = Flag {
    long: "--version",
    short: Some("-V"),
    takes: Takes::Nothing,
    scope: Scope::Alone,
    summary: "print the version",
    help: "print the version",
};

/// Every flag `baton` reads before `--`, in the order `--help` lists
/// them. Each may be given once: a second one is an error that names it.
pub const FLAGS: [&Flag; 20] = [
    &SERVERS, &LEASE, &WAIT, &NONBLOCK, &LIMIT, &VALUE, &ONCE, &METRICS, &BY, &INTERVAL, &JSON,
    &QUIET, &TIMEOUT, &AUTH_FILE, &TLS, &TLS_CA, &TLS_CERT, &TLS_KEY, &HELP, &VERSION,
];

/// The column the text of a command starts at in `--help`.
const COMMAND_COLUMN: usize = 12;
/// The column the text of a flag starts at in `--help`.
const FLAG_COLUMN: usize = 18;

/// The help text of `baton --help`, made from [`COMMANDS`] and [`FLAGS`].
pub fn help() -> String {
    let mut out =
        String::from("baton: the command-line client of the baton lock server\n\nUSAGE:\n");
    for sub in &COMMANDS {
        out.push_str(&format!("  baton {}\n", sub.usage));
    }
    out.push_str("  baton --version\n\nCOMMANDS:\n");
    for sub in &COMMANDS {
        entry(&mut out, sub.name, sub.help, COMMAND_COLUMN);
    }
    out.push_str("\nFLAGS:\n");
    for flag in FLAGS {
        let mut left = flag.spellings().collect::<Vec<_>>().join(", ");
        if let Some(value) = flag.takes.name() {
            left = format!("{left} {value}");
        }
        entry(&mut out, &left, flag.help, FLAG_COLUMN);
    }
    out.push_str(
        "\nEXIT STATUS:\n  \
         0 success; 1 error (unreachable, refused, not held, key lost); 2 bad usage;\n  \
         75 the key was not granted within --wait (or at once with -n). `run` exits\n  \
         with COMMAND's code (128 + N when it is killed by signal N; 126/127 when it\n  \
         cannot start).\n",
    );
    out
}

/// `  left  text`, the text at `column` (on the next line when `left` is
/// too wide), its continuation lines indented to the same column.
fn entry(out: &mut String, left: &str, text: &str, column: usize) {
    let pad = column.saturating_sub(2 + left.len());
    if pad >= 2 {
        out.push_str(&format!("  {left}{}", " ".repeat(pad)));
    } else {
        out.push_str(&format!("  {left}\n{}", " ".repeat(column)));
    }
    let mut lines = text.lines();
    out.push_str(lines.next().unwrap_or(""));
    out.push('\n');
    for line in lines {
        out.push_str(&format!("{}{}\n", " ".repeat(column), line.trim_start()));
    }
}

/// `acquire, release, ... or completions`: the commands, for messages.
fn command_list() -> String {
    let names: Vec<&str> = COMMANDS.iter().map(|sub| sub.name).collect();
    listed(&names, "or")
}

/// `a`, `a and b`, `a, b and c`.
fn listed(items: &[&str], last: &str) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., end] => format!("{} {last} {end}", init.join(", ")),
    }
}

/// What `baton` accepts, for the message about a flag it does not know.
fn accepted_flags() -> String {
    let shown: Vec<String> = FLAGS.iter().map(|flag| flag.shown()).collect();
    shown.join(", ")
}

// What each numeric flag accepts, as its error message says it.
const EXPECT_LEASE: &str = "seconds above 0, with up to 3 decimals (like 30 or 0.5)";
const EXPECT_WAIT: &str = "seconds, with up to 3 decimals (like 10 or 0.5; 0 waits without limit)";
const EXPECT_TIMEOUT: &str = "seconds above 0, with up to 3 decimals (like 5 or 0.5)";
const EXPECT_LIMIT: &str = "a whole number from 1 to 10000";
const EXPECT_VALUE: &str = "1 to 250 bytes, no spaces or control characters";

/// `--limit` and `--value` of `acquire` and `run`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holding {
    /// `--limit N`: KEY is a semaphore of N slots.
    pub limit: Option<u32>,
    /// `--value V`: the holder's value.
    pub value: Option<Vec<u8>>,
}

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Acquire {
        key: Vec<u8>,
        lease: Duration,
        wait: Option<Duration>,
        holding: Holding,
    },
    Release {
        key: Vec<u8>,
        token: u64,
    },
    Run {
        key: Vec<u8>,
        lease: Duration,
        wait: Option<Duration>,
        holding: Holding,
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
    /// `watch KEY [--once]`.
    Watch {
        key: Vec<u8>,
        once: bool,
    },
    Status,
    /// `top --metrics LIST ...`.
    Top(TopArgs),
    /// `completions SHELL`: one of [`SHELLS`].
    Completions(&'static str),
    Help,
    Version,
}

impl Command {
    /// Whether it talks to the servers (else `--servers` and
    /// `$BATON_SERVERS` are not looked at).
    pub fn needs_servers(&self) -> bool {
        !matches!(
            self,
            Command::Completions(_) | Command::Help | Command::Version | Command::Top(_)
        )
    }
}

/// What `top` shows, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopArgs {
    /// Every node's metrics address (`host:port`).
    pub metrics: Vec<String>,
    /// `--by age` (else by waiting).
    pub by_age: bool,
    /// Between refreshes, and what rates are measured over.
    pub interval: Duration,
    /// How it shows.
    pub output: TopOutput,
}

/// `top`'s output: the live screen, or one snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopOutput {
    Screen,
    /// `--once`: a plain table.
    Table,
    /// `--json`.
    Json,
}

/// The parsed command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cli {
    /// Empty when the command talks to no server.
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

/// The flags given (each read once, by [`FLAGS`]), with their values.
struct Given {
    flags: Vec<(&'static str, Option<OsString>)>,
}

impl Given {
    /// Take every flag of [`FLAGS`] but `--help` and `--version` out of
    /// `args`: the first occurrence of each (a second is left in `args`).
    fn read(args: &mut pico_args::Arguments) -> Result<Given, String> {
        let mut flags = Vec::new();
        for flag in FLAGS.iter().filter(|f| f.scope != Scope::Alone) {
            if flag.takes == Takes::Nothing {
                if present(args, flag) {
                    flags.push((flag.long, None));
                }
                continue;
            }
            let value = match flag.short {
                Some(short) => args.opt_value_from_os_str([short, flag.long], os_string),
                None => args.opt_value_from_os_str(flag.long, os_string),
            };
            let what = match flag.takes {
                Takes::Path => "a path",
                _ => "a value",
            };
            match value {
                Ok(Some(v)) if v.is_empty() && flag.takes == Takes::Path => {
                    return Err(format!("{}: expected {what}, got ''", flag.long));
                }
                Ok(Some(v)) => flags.push((flag.long, Some(v))),
                Ok(None) => {}
                Err(_) => return Err(format!("{}: expected {what}, got nothing", flag.long)),
            }
        }
        Ok(Given { flags })
    }

    fn has(&self, flag: &Flag) -> bool {
        self.lookup(flag).is_some()
    }

    /// The value of a flag that takes one, as text.
    fn text(&self, flag: &Flag) -> Result<Option<String>, String> {
        match self.lookup(flag).and_then(|(_, v)| v.as_ref()) {
            None => Ok(None),
            Some(v) => v.to_str().map(|v| Some(v.to_string())).ok_or_else(|| {
                format!("{}: not valid UTF-8: '{}'", flag.long, v.to_string_lossy())
            }),
        }
    }

    /// The value of a flag that takes one, as bytes.
    fn bytes(&self, flag: &Flag) -> Option<Vec<u8>> {
        self.lookup(flag)
            .and_then(|(_, v)| v.clone())
            .map(OsString::into_vec)
    }

    fn path(&self, flag: &Flag) -> Option<PathBuf> {
        self.lookup(flag)
            .and_then(|(_, v)| v.clone())
            .map(PathBuf::from)
    }

    fn lookup(&self, flag: &Flag) -> Option<&(&'static str, Option<OsString>)> {
        debug_assert!(
            FLAGS.iter().any(|f| f.long == flag.long),
            "{} is read through FLAGS",
            flag.long
        );
        self.flags.iter().find(|(long, _)| *long == flag.long)
    }
}

fn os_string(value: &std::ffi::OsStr) -> Result<OsString, std::convert::Infallible> {
    Ok(value.to_os_string())
}

/// Takes `flag` out of `args` if it is there (either spelling).
fn present(args: &mut pico_args::Arguments, flag: &Flag) -> bool {
    match flag.short {
        Some(short) => args.contains([short, flag.long]),
        None => args.contains(flag.long),
    }
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
    for (flag, command) in [(&HELP, Command::Help), (&VERSION, Command::Version)] {
        if present(&mut args, flag) {
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
    let given = Given::read(&mut args)?;
    // Each flag read took its first occurrence: one still left was given
    // again.
    let words = args.finish();
    let spelled = |w: &OsString| FLAGS.iter().flat_map(|f| f.spellings()).any(|s| w == s);
    if let Some(again) = words.iter().find(|w| spelled(w)) {
        return Err(format!(
            "{}: given more than once; give it once",
            again.to_string_lossy()
        ));
    }
    if let Some(unknown) = words.iter().find(|w| is_flag(w)) {
        return Err(format!(
            "unknown flag {}; accepted: {}",
            unknown.to_string_lossy(),
            accepted_flags()
        ));
    }
    let tls = TlsFlags::from_given(&given)?;
    let timeout = given
        .text(&TIMEOUT)?
        .as_deref()
        .map(read_timeout)
        .transpose()?;
    let timing = Timing {
        lease: given.text(&LEASE)?,
        wait: given.text(&WAIT)?,
        nonblock: given.has(&NONBLOCK),
    };
    let command = command_from(words, &given, timing, command)?;
    let servers = match command.needs_servers() {
        true => choose_servers(given.text(&SERVERS)?.as_deref(), env_servers)?,
        false => Vec::new(),
    };
    Ok(Cli {
        servers,
        timeout,
        quiet: given.has(&QUIET),
        auth_file: given.path(&AUTH_FILE),
        tls,
        command,
    })
}

impl TlsFlags {
    /// The TLS flags given, checked together.
    fn from_given(given: &Given) -> Result<TlsFlags, String> {
        let ca = given.path(&TLS_CA);
        let cert_key = match (given.path(&TLS_CERT), given.path(&TLS_KEY)) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err("--tls-cert and --tls-key go together".into()),
        };
        Ok(TlsFlags {
            on: given.has(&TLS) || ca.is_some() || cert_key.is_some(),
            ca,
            cert_key,
        })
    }
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
    given: &Given,
    timing: Timing,
    after_dashes: Option<Vec<OsString>>,
) -> Result<Command, String> {
    let mut words = words.into_iter();
    let Some(name) = words.next() else {
        return Err(format!("no command given: {}", command_list()));
    };
    let name = name.to_string_lossy().into_owned();
    if !COMMANDS.iter().any(|sub| sub.name == name) {
        return Err(format!("unknown command `{name}`: {}", command_list()));
    }
    let rest: Vec<OsString> = words.collect();
    if name != "run" && after_dashes.is_some() {
        return Err(format!("`--` is only for `run`, not `{name}`"));
    }
    for flag in FLAGS {
        if let Scope::Only(commands) = flag.scope
            && given.has(flag)
            && !flag.accepted_by(&name)
        {
            return Err(format!(
                "{} is for {}, not `{name}`",
                flag.shown(),
                listed(commands, "and")
            ));
        }
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
                holding: read_holding(given)?,
            })
        }
        "release" => {
            let [key, token] = positional(rest, ["KEY", "TOKEN"], &name)?;
            Ok(Command::Release {
                key: check_key(key)?,
                token: check_token(&token)?,
            })
        }
        "run" => run_command(rest, &timing, read_holding(given)?, after_dashes),
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
        "watch" => {
            let [key] = positional(rest, ["KEY"], &name)?;
            Ok(Command::Watch {
                key: check_key(key)?,
                once: given.has(&ONCE),
            })
        }
        "status" => {
            let [] = positional(rest, [], &name)?;
            Ok(Command::Status)
        }
        "top" => {
            let [] = positional(rest, [], &name)?;
            read_top(given).map(Command::Top)
        }
        "completions" => {
            let [shell] = positional(rest, ["SHELL"], &name)?;
            let shell = shell.to_string_lossy();
            match SHELLS.iter().find(|s| **s == shell) {
                Some(shell) => Ok(Command::Completions(shell)),
                None => Err(format!(
                    "no completions for `{shell}`: {}",
                    listed(&SHELLS, "or")
                )),
            }
        }
        other => Err(format!("unknown command `{other}`: {}", command_list())),
    }
}

fn run_command(
    rest: Vec<OsString>,
    timing: &Timing,
    holding: Holding,
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
        holding,
        command,
    })
}

impl Holding {
    /// As the client library takes them.
    pub fn options(&self) -> baton::client::AcquireOptions {
        let mut options = baton::client::AcquireOptions::new();
        if let Some(limit) = self.limit {
            options = options.limit(limit);
        }
        if let Some(value) = &self.value {
            options = options.value(value);
        }
        options
    }
}

/// `--limit` and `--value`, checked as the server would check them.
fn read_holding(given: &Given) -> Result<Holding, String> {
    let limit = match given.text(&LIMIT)? {
        None => None,
        Some(text) => match text.parse::<u32>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) && !text.starts_with('+') => Some(n),
            _ => return Err(format!("--limit: expected {EXPECT_LIMIT}, got '{text}'")),
        },
    };
    let value = match given.bytes(&VALUE) {
        None => None,
        Some(bytes) if Value::new(&bytes).is_ok() => Some(bytes),
        Some(bytes) => {
            return Err(format!(
                "--value: expected {EXPECT_VALUE}, got {:?}",
                String::from_utf8_lossy(&bytes)
            ));
        }
    };
    Ok(Holding { limit, value })
}

/// `top`'s flags.
fn read_top(given: &Given) -> Result<TopArgs, String> {
    let Some(list) = given.text(&METRICS)? else {
        return Err(
            "top needs --metrics: every node's metrics address, like 127.0.0.1:9373".into(),
        );
    };
    let entries: Vec<&str> = list.split(',').collect();
    // A metrics port has no default (7373 is the lock port's).
    if let Some(bare) = entries.iter().find(|e| {
        !e.trim()
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.ends_with(':') && port.parse::<u16>().is_ok())
    }) {
        return Err(format!(
            "--metrics: '{}' has no port; give each node's metrics address as host:port",
            bare.trim()
        ));
    }
    let metrics = parse_servers(&entries).map_err(|e| format!("--metrics: {e}"))?;
    let by_age = match given.text(&BY)?.as_deref() {
        None | Some("waiting") => false,
        Some("age") => true,
        Some(other) => return Err(format!("--by: expected waiting or age, got '{other}'")),
    };
    let interval = match given.text(&INTERVAL)? {
        None => Duration::from_secs(1),
        Some(text) => match parse_seconds_saturating(text.as_bytes()) {
            Some(ms) if ms > 0 => Duration::from_millis(ms),
            _ => {
                return Err(format!(
                    "--interval: expected {EXPECT_TIMEOUT}, got '{text}'"
                ));
            }
        },
    };
    let output = match (given.has(&ONCE), given.has(&JSON)) {
        (false, false) => TopOutput::Screen,
        (true, false) => TopOutput::Table,
        (false, true) => TopOutput::Json,
        (true, true) => return Err("give either --once or --json, not both".into()),
    };
    Ok(TopArgs {
        metrics,
        by_age,
        interval,
        output,
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
                holding: Holding::default(),
            }
        );
        assert_eq!(
            command(&["acquire", "job", "--lease", "1.5", "--wait", "0.25"]),
            Command::Acquire {
                key: b"job".to_vec(),
                lease: Duration::from_millis(1500),
                wait: Some(Duration::from_millis(250)),
                holding: Holding::default(),
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
                holding: Holding::default(),
                command: ["sh", "-c", "x --lease 1", "--"]
                    .map(OsString::from)
                    .to_vec(),
            }
        );
    }

    #[test]
    fn acquire_and_run_take_a_limit_and_a_value() {
        let holding = |args: &[&str]| match command(args) {
            Command::Acquire { holding, .. } | Command::Run { holding, .. } => holding,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            holding(&["acquire", "pool", "--limit", "4", "--value", "host-a"]),
            Holding {
                limit: Some(4),
                value: Some(b"host-a".to_vec())
            }
        );
        assert_eq!(
            holding(&["run", "pool", "--limit", "10000", "--", "true"]),
            Holding {
                limit: Some(10_000),
                value: None
            }
        );
        assert_eq!(
            holding(&["acquire", "lead", "--value", "10.0.0.7:80"]).value,
            Some(b"10.0.0.7:80".to_vec())
        );
        let limit = "--limit: expected a whole number from 1 to 10000";
        for bad in ["0", "10001", "-1", "+3", "2.5", "x", ""] {
            let err = parse_with(&["acquire", "k", "--limit", bad], None).expect_err(bad);
            assert_eq!(err, format!("{limit}, got '{bad}'"));
        }
        let long = "v".repeat(251);
        for bad in ["", "a b", long.as_str()] {
            let err = parse_with(&["run", "k", "--value", bad, "--", "true"], None).expect_err(bad);
            assert!(
                err.starts_with("--value: expected 1 to 250 bytes, no spaces"),
                "{err}"
            );
        }
        let err = parse_with(&["query", "k", "--limit", "2"], None).expect_err("not query");
        assert_eq!(err, "--limit is for acquire and run, not `query`");
    }

    #[test]
    fn watch_takes_a_key_and_once() {
        assert_eq!(
            command(&["watch", "lead"]),
            Command::Watch {
                key: b"lead".to_vec(),
                once: false
            }
        );
        assert_eq!(
            command(&["watch", "--once", "lead"]),
            Command::Watch {
                key: b"lead".to_vec(),
                once: true
            }
        );
        let err = parse_with(&["acquire", "k", "--once"], None).expect_err("not acquire");
        assert_eq!(err, "--once is for watch and top, not `acquire`");
        let err = parse_with(&["watch"], None).expect_err("a key");
        assert!(err.starts_with("missing KEY"), "{err}");
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
                holding: Holding::default(),
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

    /// A value `flag` accepts.
    fn value_of(flag: &Flag) -> Option<&'static str> {
        match flag.takes {
            Takes::Nothing => None,
            Takes::Seconds => Some("1"),
            Takes::Servers => Some("a:1"),
            Takes::Path => Some("/f"),
            Takes::Number => Some("2"),
            Takes::Value => Some("v"),
            Takes::Order => Some("age"),
        }
    }

    /// A valid command line of `command`, with `extra` flags before it.
    fn line_of<'a>(command: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = extra.to_vec();
        args.push(command);
        args.extend(match command {
            "acquire" | "query" | "watch" => &["k"][..],
            "release" | "keep" => &["k", "1"],
            "run" => &["k", "--", "true"],
            "completions" => &["bash"],
            "top" if !extra.contains(&"--metrics") => &["--metrics", "a:1"],
            _ => &[],
        });
        args
    }

    #[test]
    fn every_flag_of_the_table_is_parsed_where_it_says_and_refused_elsewhere() {
        for flag in FLAGS {
            for spelling in flag.spellings() {
                let mut given = vec![spelling];
                given.extend(value_of(flag));
                // The two halves of a client certificate go together.
                match flag.long {
                    "--tls-cert" => given.extend(["--tls-key", "/k"]),
                    "--tls-key" => given.extend(["--tls-cert", "/c"]),
                    _ => {}
                }
                for sub in &COMMANDS {
                    let parsed = parse_with(&line_of(sub.name, &given), None);
                    match flag.scope {
                        Scope::Alone => {
                            let alone = if flag.long == "--help" {
                                Command::Help
                            } else {
                                Command::Version
                            };
                            assert_eq!(parsed.map(|cli| cli.command), Ok(alone), "{spelling}");
                        }
                        _ if flag.accepted_by(sub.name) => {
                            assert!(parsed.is_ok(), "{spelling} {}: {parsed:?}", sub.name);
                        }
                        Scope::Only(commands) => assert_eq!(
                            parsed.map(|cli| cli.command),
                            Err(format!(
                                "{} is for {}, not `{}`",
                                flag.shown(),
                                listed(commands, "and"),
                                sub.name
                            )),
                        ),
                        Scope::Global => unreachable!("a global flag is accepted everywhere"),
                    }
                }
            }
        }
    }

    #[test]
    fn help_lists_every_command_and_every_flag_of_the_tables() {
        let help = help();
        for sub in &COMMANDS {
            assert!(
                help.contains(&format!("  baton {}\n", sub.usage)),
                "{}",
                sub.name
            );
            assert!(
                help.contains(&format!("\n  {}  ", sub.name))
                    || help.contains(&format!("\n  {}\n", sub.name)),
                "{}",
                sub.name
            );
        }
        for flag in FLAGS {
            for spelling in flag.spellings() {
                assert!(help.contains(spelling), "--help lists {spelling}");
            }
        }
        // Every line fits 80 columns.
        for line in help.lines() {
            assert!(line.len() <= 80, "{line:?}");
        }
    }

    #[test]
    fn top_takes_metrics_addresses_an_order_an_interval_and_one_output() {
        let top = |args: &[&str]| parse_with(args, None).map(|cli| cli.command);
        assert_eq!(
            top(&["top", "--metrics", "a:1,b:2"]),
            Ok(Command::Top(TopArgs {
                metrics: vec!["a:1".into(), "b:2".into()],
                by_age: false,
                interval: Duration::from_secs(1),
                output: TopOutput::Screen,
            }))
        );
        assert_eq!(
            top(&[
                "top",
                "--metrics",
                "a:1",
                "--by",
                "age",
                "--interval",
                "0.25",
                "--json"
            ]),
            Ok(Command::Top(TopArgs {
                metrics: vec!["a:1".into()],
                by_age: true,
                interval: Duration::from_millis(250),
                output: TopOutput::Json,
            }))
        );
        let once = top(&["top", "--once", "--metrics", "a:1", "--by", "waiting"]);
        assert!(matches!(
            once,
            Ok(Command::Top(TopArgs {
                output: TopOutput::Table,
                by_age: false,
                ..
            }))
        ));
        for (args, says) in [
            (&["top"][..], "top needs --metrics"),
            (&["top", "--metrics", "nohost"], "--metrics"),
            (
                &["top", "--metrics", "a:1", "--by", "size"],
                "--by: expected waiting or age",
            ),
            (
                &["top", "--metrics", "a:1", "--interval", "0"],
                "--interval",
            ),
            (
                &["top", "--metrics", "a:1", "--once", "--json"],
                "either --once or --json",
            ),
            (&["top", "--metrics", "a:1", "extra"], "unexpected argument"),
            (&["status", "--json"], "--json is for top"),
        ] {
            let err = top(args).expect_err("refused");
            assert!(err.contains(says), "{args:?}: {err}");
        }
    }

    #[test]
    fn an_unknown_flag_is_named_with_every_flag_that_is_accepted() {
        let err = parse_with(&["acquire", "k", "--leas", "3"], None).expect_err("unknown");
        assert_eq!(
            err,
            "unknown flag --leas; accepted: --servers, --lease, --wait, -n/--nonblock, \
             --limit, --value, --once, --metrics, --by, --interval, --json, -q/--quiet, \
             --timeout, --auth-file, --tls, --tls-ca, --tls-cert, --tls-key, -h/--help, \
             -V/--version"
        );
        for flag in FLAGS {
            assert!(err.contains(&flag.shown()), "{}", flag.long);
        }
    }

    #[test]
    fn completions_takes_a_shell_and_looks_at_no_server() {
        for shell in SHELLS {
            let cli =
                parse_with(&["completions", shell], Some("not a server list")).expect("valid");
            assert_eq!(cli.command, Command::Completions(shell));
            assert!(cli.servers.is_empty());
        }
        let cases: &[(&[&str], &str)] = &[
            (
                &["completions"],
                "missing SHELL; usage: baton completions SHELL",
            ),
            (
                &["completions", "fish"],
                "no completions for `fish`: bash or zsh",
            ),
            (
                &["completions", "bash", "zsh"],
                "unexpected argument \"zsh\"",
            ),
            (
                &["completions", "bash", "--wait", "1"],
                "--wait is for acquire and run, not `completions`",
            ),
        ];
        for (args, expected) in cases {
            let err = parse_with(args, None).expect_err("a mistake");
            assert!(err.starts_with(expected), "{args:?}: {err}");
        }
    }

    #[test]
    fn a_flag_given_twice_is_an_error_that_names_it() {
        for flag in FLAGS.iter().filter(|f| f.scope != Scope::Alone) {
            for spelling in flag.spellings() {
                let mut args = vec![spelling];
                args.extend(value_of(flag));
                let once = args.clone();
                args.extend(once.iter().copied());
                args.extend(["acquire", "k"]);
                assert_eq!(
                    parse_with(&args, None).map(|cli| cli.command),
                    Err(format!("{spelling}: given more than once; give it once")),
                    "{args:?}"
                );
            }
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
            (
                &["release", "k", "1", "-n"],
                "-n/--nonblock is for acquire and run, not `release`",
            ),
            (
                &["keep", "k", "1", "--wait", "3"],
                "--wait is for acquire and run, not `keep`",
            ),
            (
                &["query", "k", "--lease", "3"],
                "--lease is for acquire, run and keep, not `query`",
            ),
            (
                &["frobnicate", "--lease", "3"],
                "unknown command `frobnicate`",
            ),
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
