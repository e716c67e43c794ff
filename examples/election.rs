//! A leader election: every copy of this program campaigns for one key
//! with its name as the value; whoever holds it leads, and every copy
//! prints each change of leader as it observes it.
//!
//! Run a node (or a cluster) on this machine, then the example two or three
//! times at once; stop the leader (Ctrl+C) and another copy takes over:
//!
//! ```text
//! cargo run --release --bin batond -- --bind 127.0.0.1
//! NAME=a cargo run --release --example election
//! NAME=b cargo run --release --example election
//! ```
//!
//! `BATON_SERVERS` names other servers (`host:port`, comma-separated), as
//! for the `baton` command; `NAME` is this candidate's value (default: its
//! process id); `TERM_SECS` how long it leads before it resigns (default
//! 10), so that the copies take turns. The main thread campaigns and leads;
//! one thread observes the leaders (`Client::observe`, which watches again
//! on the new active node after a failover). While leading, the work is
//! raced against the loss of leadership (`Held::wait_lost_timeout`): a
//! leader whose lease could not be kept stops at once. Never leads after
//! it lost the key: the token it fences with is then refused.

use std::thread;
use std::time::Duration;

use baton::client::{Client, Error, WatchState};

/// The election's key.
const KEY: &str = "example-leader";
/// How long leadership lasts unless kept (the watchdog keeps it).
const LEASE: Duration = Duration::from_secs(5);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let servers = std::env::var("BATON_SERVERS").unwrap_or_else(|_| "127.0.0.1:7373".into());
    let name = std::env::var("NAME").unwrap_or_else(|_| format!("pid-{}", std::process::id()));
    let term = match std::env::var("TERM_SECS") {
        Ok(text) => Duration::from_secs(text.parse().map_err(|_| "TERM_SECS: whole seconds")?),
        Err(_) => Duration::from_secs(10),
    };
    let client = Client::connect(servers.split(','))?;

    let now = client.leader(KEY)?;
    println!("{name}: at the start, {}", describe(&now));
    let observer = {
        let client = client.clone();
        let name = name.clone();
        thread::spawn(move || -> Result<(), Error> {
            for leader in client.observe(KEY)? {
                println!("{name} sees: {}", describe(&leader?));
            }
            Ok(())
        })
    };

    loop {
        // Waits in line until elected.
        let leadership = client.campaign(KEY, &name, LEASE, None)?;
        println!("{name}: leading, token {}", leadership.token());
        // Lead for one term, unless leadership is lost first.
        match leadership.wait_lost_timeout(term) {
            Some(why) => println!("{name}: lost leadership: {why}"),
            None => {
                println!("{name}: resigning after {term:?}");
                leadership.release()?;
            }
        }
        if observer.is_finished() {
            break;
        }
        // Let another candidate take a turn before standing again.
        thread::sleep(Duration::from_millis(500));
    }
    observer.join().map_err(|_| "the observer panicked")??;
    Ok(())
}

/// "nobody leads", or "b leads (token 42)".
fn describe(state: &WatchState) -> String {
    match (state.token, &state.value) {
        (0, _) => "nobody leads".to_string(),
        (token, Some(value)) => format!(
            "{} leads (token {token})",
            String::from_utf8_lossy(value.as_bytes())
        ),
        (token, None) => format!("token {token} leads"),
    }
}
