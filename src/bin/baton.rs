//! `baton`: the command-line client, built on the client library.
//!
//! Owns: the process — arguments (`baton/args.rs`), one command per run,
//! the exit code, and the one-line messages on stderr. `run` lives in
//! `baton/run.rs`. Logs of the library are off unless `RUST_LOG` asks.
//!
//! Never does: print anything but the token on stdout for `acquire`, or
//! more than one line on stderr for a failure.

#[path = "baton/args.rs"]
mod args;
#[path = "baton/run.rs"]
mod run;

use std::process::ExitCode;

use args::{Cli, Command, HELP};
use baton::client::{Client, Error, ReleaseOutcome};

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

fn execute(cli: Cli) -> u8 {
    if cli.command == Command::Help {
        print!("{HELP}");
        return 0;
    }
    let client = match Client::connect(&cli.servers) {
        Ok(client) => client,
        Err(e) => return report(&format!("cannot start the client: {e}"), &e),
    };
    match cli.command {
        Command::Acquire { key, lease, wait } => acquire(&client, &key, lease, wait),
        Command::Release { key, token } => release(&client, &key, token),
        Command::Run {
            key,
            lease,
            wait,
            command,
        } => run::run(
            &client,
            &run::Job {
                key: &key,
                lease,
                wait,
                command: &command,
            },
        ),
        Command::Status => status(&client, &cli.servers),
        Command::Help => 0,
    }
}

/// Print one line for a failure; its exit code.
pub fn report(line: &str, e: &Error) -> u8 {
    eprintln!("baton: {line}");
    match e {
        Error::Timeout => EXIT_TIMEOUT,
        _ => EXIT_ERROR,
    }
}

fn acquire(
    client: &Client,
    key: &[u8],
    lease: std::time::Duration,
    wait: Option<std::time::Duration>,
) -> u8 {
    let name = String::from_utf8_lossy(key);
    match client.acquire(key, lease, wait) {
        Ok(grant) => {
            println!("{}", grant.token());
            0
        }
        Err(e) => report(&run::acquire_failure(&name, wait, &e), &e),
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
