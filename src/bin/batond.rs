//! `batond`: the baton lock server.
//!
//! Owns: the process — flags (pico-args, through `server::config`), logging
//! (env_logger, `RUST_LOG`), the open-file limit (raised and warned about
//! by `server::os_limits` before the node starts), and the signals that
//! stop it (SIGINT, SIGTERM: a graceful shutdown, then exit 0) or reload
//! its `--auth-file` and TLS files (SIGHUP: `Server::reload`). Every file a
//! flag names is read and checked before the node starts, whether or not
//! it will be used; a flag that does not work makes it exit 2 with one line
//! on stderr naming the flag (a port in use included), and a flag a node
//! without `--peers` does not use is warned about once it runs, and a node
//! in protected mode says so and how to open it.
//!
//! Never does: anything the server module does itself.

use std::process::ExitCode;

use baton::server::config::{Command, HELP};
use baton::server::{Config, Server, StartError};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let config = match Config::from_args(std::env::args_os().skip(1).collect()) {
        Ok(Command::Run(config)) => *config,
        Ok(Command::Help) => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Ok(Command::Version) => {
            println!("batond {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("batond: {e}");
            return ExitCode::from(2);
        }
    };
    match start(&config) {
        Ok((server, signals)) => {
            say_what_is_unused_or_closed(&config);
            serve_until_stopped(&server, signals);
            server.shutdown();
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

/// Read and check every file a flag names, raise the open-file limit,
/// take the signals, and start the node; a failure is said in one line on
/// stderr and is the exit code (2 for a flag that does not work).
fn start(config: &Config) -> Result<(Server, Signals), ExitCode> {
    let flag_error = |e: &dyn std::fmt::Display| {
        eprintln!("batond: {e}");
        ExitCode::from(2)
    };
    let cluster_key = config.read_cluster_key().map_err(|e| flag_error(&e))?;
    let client_auth = config.read_client_auth().map_err(|e| flag_error(&e))?;
    // TLS files are checked before anything starts, for a clear message.
    baton::server::trust::tls::NodeTls::load(config).map_err(|e| flag_error(&e))?;
    // Room for --max-conns connections: the soft limit raised up to the
    // hard one if need be, and a warning naming the fix if that is short.
    baton::server::os_limits::raise_open_files(config.max_conns);
    let signals = Signals::new([SIGINT, SIGTERM, SIGHUP]).map_err(|e| {
        eprintln!("batond: cannot handle signals: {e}");
        ExitCode::FAILURE
    })?;
    match Server::start(config, cluster_key, client_auth) {
        Ok(server) => Ok((server, signals)),
        Err(StartError::Flag(e)) => Err(flag_error(&e)),
        Err(StartError::Io(e)) => {
            eprintln!(
                "batond: cannot start on {}:{}: {e}",
                config.bind, config.port
            );
            Err(ExitCode::FAILURE)
        }
    }
}

/// After every check, so that a node that does not start says one line:
/// the flags a node without `--peers` does not use, and protected mode.
fn say_what_is_unused_or_closed(config: &Config) {
    for flag in config.unused_without_peers() {
        log::warn!("{flag} is not used without --peers");
    }
    if config.protected_mode() {
        log::info!(
            "protected mode: serving clients on loopback (127.0.0.1, ::1) only; clients \
             from other addresses get `E - - protected-mode` and are closed. To serve \
             other machines, restart with --auth-file PATH (clients send a secret) or \
             --bind 0.0.0.0 (any client that reaches the port; see docs/security.md)"
        );
    }
}

/// Serve until SIGINT or SIGTERM; SIGHUP reloads the auth and TLS files.
fn serve_until_stopped(server: &Server, mut signals: Signals) {
    for signal in signals.forever() {
        if signal == SIGHUP {
            log::info!("SIGHUP received: reloading");
            server.reload();
            continue;
        }
        let name = match signal {
            SIGINT => "SIGINT",
            SIGTERM => "SIGTERM",
            _ => "a signal",
        };
        log::info!("{name} received: shutting down gracefully");
        break;
    }
}
