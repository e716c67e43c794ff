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
    let cluster_key = match config.read_cluster_key() {
        Ok(key) => key,
        Err(e) => {
            eprintln!("batond: {e}");
            return ExitCode::from(2);
        }
    };
    let client_auth = match config.read_client_auth() {
        Ok(auth) => auth,
        Err(e) => {
            eprintln!("batond: {e}");
            return ExitCode::from(2);
        }
    };
    // TLS files are checked before anything starts, for a clear message.
    if let Err(e) = baton::server::trust::tls::NodeTls::load(&config) {
        eprintln!("batond: {e}");
        return ExitCode::from(2);
    }
    // Room for --max-conns connections: the soft limit raised up to the
    // hard one if need be, and a warning naming the fix if that is short.
    baton::server::os_limits::raise_open_files(config.max_conns);
    let mut signals = match Signals::new([SIGINT, SIGTERM, SIGHUP]) {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("batond: cannot handle signals: {e}");
            return ExitCode::FAILURE;
        }
    };
    let server = match Server::start(&config, cluster_key, client_auth) {
        Ok(server) => server,
        Err(StartError::Flag(e)) => {
            eprintln!("batond: {e}");
            return ExitCode::from(2);
        }
        Err(StartError::Io(e)) => {
            eprintln!(
                "batond: cannot start on {}:{}: {e}",
                config.bind, config.port
            );
            return ExitCode::FAILURE;
        }
    };
    // After every check, so that a node that does not start says one line.
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
    server.shutdown();
    ExitCode::SUCCESS
}
