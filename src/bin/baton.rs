//! `baton`: the command-line client, built on the client library.
//!
//! Owns: the process — arguments (`baton/args.rs`), one command per run,
//! the exit code, and the one-line messages on stderr (none for a busy key
//! under `-q`). `run` lives in `baton/run.rs`, `watch` in
//! `baton/watch.rs`, `top` in `baton/top.rs`, the shell completion scripts
//! in `baton/complete.rs`. Logs of the library are off
//! unless `RUST_LOG` asks.
//!
//! Never does: print anything but the token (and, with `--limit`, the
//! slot after a space) on stdout for `acquire`, or more than one line on
//! stderr for a failure.

#[path = "baton/args.rs"]
mod args;
#[path = "baton/complete.rs"]
mod complete;
#[path = "baton/run.rs"]
mod run;
#[path = "baton/top.rs"]
mod top;
#[path = "baton/watch.rs"]
mod watch;

use std::process::ExitCode;

use args::{Cli, Command};
use baton::client::{Client, Error, KeyStatus, ReleaseOutcome};

/// Exit code for every failure but a timeout.
pub const EXIT_ERROR: u8 = 1;
/// Exit code for a bad command line.
pub const EXIT_USAGE: u8 = 2;
/// Exit code when the key was not granted within `--wait` (EX_TEMPFAIL).
pub const EXIT_TIMEOUT: u8 = 75;

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("off")).init();
    let env_servers = std::env::var("BATON_SERVERS").ok();
    let cli = match args::parse(
        std::env::args_os().skip(1).collect(),
        env_servers.as_deref(),
    ) {
        Ok(cli) => cli,
        Err(e) => {
            eprintln!("baton: {e} (see baton --help)");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    ExitCode::from(execute(cli))
}

fn execute(mut cli: Cli) -> u8 {
    match cli.command {
        Command::Help => {
            print!("{}", args::help());
            return 0;
        }
        Command::Completions(shell) => {
            print!("{}", complete::script(shell));
            return 0;
        }
        Command::Version => {
            println!("baton {}", env!("CARGO_PKG_VERSION"));
            return 0;
        }
        Command::Top(ref args) => return top::top(args),
        _ => {}
    }
    let mut builder = Client::builder(&cli.servers);
    let auth_file = cli.auth_file.clone().or_else(|| {
        std::env::var_os("BATON_AUTH_FILE")
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from)
    });
    if let Some(path) = auth_file {
        match read_secret(&path) {
            Ok(secret) => builder = builder.auth(secret),
            Err(e) => {
                eprintln!("baton: {e}");
                return EXIT_USAGE;
            }
        }
    }
    if cli.tls.ca.is_none()
        && let Some(ca) = std::env::var_os("BATON_TLS_CA").filter(|ca| !ca.is_empty())
    {
        cli.tls.ca = Some(ca.into());
        cli.tls.on = true;
    }
    if cli.tls.on {
        let mut tls = baton::client::TlsConfig::new();
        if let Some(ca) = &cli.tls.ca {
            tls = tls.ca_file(ca);
        }
        if let Some((cert, key)) = &cli.tls.cert_key {
            tls = tls.client_cert(cert, key);
        }
        builder = builder.tls(tls);
    }
    if let Some(timeout) = cli.timeout {
        builder = builder
            .request_timeout(timeout)
            .connect_timeout(timeout.min(baton::client::DEFAULT_CONNECT_TIMEOUT));
    }
    let client = match builder.connect() {
        Ok(client) => client,
        Err(e) => return report(&format!("cannot start the client: {e}"), &e),
    };
    let quiet = cli.quiet;
    match cli.command {
        Command::Acquire {
            key,
            lease,
            wait,
            holding,
        } => acquire(&client, &key, lease, wait, &holding, quiet),
        Command::Release { key, token } => release(&client, &key, token),
        Command::Keep { key, token, lease } => keep(&client, &key, token, lease),
        Command::Query { key } => query(&client, &key),
        Command::Run {
            key,
            lease,
            wait,
            holding,
            command,
        } => run::run(
            &client,
            &run::Job {
                key: &key,
                lease,
                wait,
                options: &holding.options(),
                command: &command,
                quiet,
            },
        ),
        Command::Watch { key, once } => watch::watch(&client, &key, once, cli.timeout),
        Command::Status => status(&client, &cli.servers),
        Command::Help | Command::Version | Command::Completions(_) | Command::Top(_) => 0,
    }
}

/// The longest secrets file read, in bytes.
const MAX_AUTH_FILE: u64 = 64 * 1024;

/// The first secret of an `--auth-file` (the server's format); errors name
/// the file and the line, never a secret.
fn read_secret(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let shown = path.display();
    let mut contents = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_AUTH_FILE).read_to_end(&mut contents))
        .map_err(|e| format!("--auth-file {shown}: cannot read it: {e}"))?;
    let Some((number, line)) = baton::protocol::secret_lines(&contents).next() else {
        return Err(format!("--auth-file {shown}: holds no secret"));
    };
    if !baton::protocol::is_valid_secret(line) {
        return Err(format!(
            "--auth-file {shown}: line {number}: a secret must be {} to {} bytes of \
             printable ASCII without spaces",
            baton::protocol::MIN_SECRET,
            baton::protocol::MAX_SECRET
        ));
    }
    Ok(line.to_vec())
}

/// Print one line for a failure; its exit code.
pub fn report(line: &str, e: &Error) -> u8 {
    eprintln!("baton: {line}");
    exit_code(e)
}

/// The exit code for a failure: 75 when the key was busy, else 1.
pub fn exit_code(e: &Error) -> u8 {
    match e {
        Error::Timeout => EXIT_TIMEOUT,
        _ => EXIT_ERROR,
    }
}

/// Report a failed acquire: one line, or nothing when the key was busy and
/// `-q` was given.
pub fn acquire_failed(key: &str, wait: Option<std::time::Duration>, e: &Error, quiet: bool) -> u8 {
    if quiet && *e == Error::Timeout {
        return EXIT_TIMEOUT;
    }
    report(&run::acquire_failure(key, wait, e), e)
}

fn acquire(
    client: &Client,
    key: &[u8],
    lease: std::time::Duration,
    wait: Option<std::time::Duration>,
    holding: &args::Holding,
    quiet: bool,
) -> u8 {
    let name = String::from_utf8_lossy(key);
    match client.acquire_with(key, lease, wait, &holding.options()) {
        Ok(grant) => {
            println!("{}", acquired_line(&grant, holding.limit.is_some()));
            0
        }
        Err(e) => acquire_failed(&name, wait, &e, quiet),
    }
}

/// `TOKEN`, or `TOKEN SLOT` for an acquire that named a limit.
fn acquired_line(grant: &baton::client::Grant, with_slot: bool) -> String {
    match with_slot {
        true => format!("{} {}", grant.token(), grant.slot()),
        false => grant.token().to_string(),
    }
}

fn keep(client: &Client, key: &[u8], token: u64, lease: std::time::Duration) -> u8 {
    let name = String::from_utf8_lossy(key);
    match client.keep_token(key, token, lease) {
        Ok(()) => 0,
        Err(Error::NotHeld) => {
            eprintln!(
                "baton: {name} is not held by token {token} (released already, or its lease ran out)"
            );
            EXIT_ERROR
        }
        Err(e) => report(&format!("cannot keep {name}: {e}"), &e),
    }
}

/// `held TOKEN SECONDS_LEFT WAITING` or `free 0 0 WAITING`.
fn query(client: &Client, key: &[u8]) -> u8 {
    let name = String::from_utf8_lossy(key);
    match client.query(key) {
        Ok(status) => {
            println!("{}", query_line(&status));
            0
        }
        Err(e) => report(&format!("cannot query {name}: {e}"), &e),
    }
}

fn query_line(status: &KeyStatus) -> String {
    match status.token {
        Some(token) => format!(
            "held {token} {:.3} {}",
            status.time_left.as_secs_f64(),
            status.waiting
        ),
        None => format!("free 0 0 {}", status.waiting),
    }
}

fn release(client: &Client, key: &[u8], token: u64) -> u8 {
    let name = String::from_utf8_lossy(key);
    match client.release_token(key, token) {
        Ok(ReleaseOutcome::Released) => 0,
        Ok(ReleaseOutcome::NotHeld) => {
            eprintln!(
                "baton: {name} is not held by token {token} (released already, or its lease ran out)"
            );
            EXIT_ERROR
        }
        Err(e) => report(&format!("cannot release {name}: {e}"), &e),
    }
}

/// One line per server: its address and its `I` pairs; an unreachable
/// server is one line on stderr and makes the exit code 1.
fn status(client: &Client, servers: &[String]) -> u8 {
    let mut code = 0;
    for server in servers {
        match client.info(server) {
            Ok(info) => {
                let pairs: Vec<String> =
                    info.pairs.iter().map(|(n, v)| format!("{n}={v}")).collect();
                println!("{server} {}", pairs.join(" "));
            }
            Err(e) => {
                eprintln!("baton: {server}: {e}");
                code = EXIT_ERROR;
            }
        }
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_query_is_one_line_of_four_fields() {
        let held = KeyStatus {
            token: Some(42),
            time_left: Duration::from_millis(2500),
            waiting: 3,
        };
        assert_eq!(query_line(&held), "held 42 2.500 3");
        let free = KeyStatus {
            token: None,
            time_left: Duration::ZERO,
            waiting: 0,
        };
        assert_eq!(query_line(&free), "free 0 0 0");
    }

    #[test]
    fn quiet_silences_only_a_busy_key() {
        assert_eq!(exit_code(&Error::Timeout), EXIT_TIMEOUT);
        assert_eq!(exit_code(&Error::NotHeld), EXIT_ERROR);
    }
}
