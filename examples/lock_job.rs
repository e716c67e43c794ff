//! A lock around a job, with its fencing token passed to the resource the
//! job writes to.
//!
//! Run a node on this machine, then the example (twice at once, to see the
//! second wait in line for the first):
//!
//! ```text
//! cargo run --release --bin batond -- --bind 127.0.0.1
//! cargo run --release --example lock_job
//! ```
//!
//! `BATON_SERVERS` names other servers (`host:port`, comma-separated), as
//! for the `baton` command. The job is a few writes to a small file-backed
//! store (`$TMPDIR/baton-example-ledger`) that remembers the largest token
//! it has seen and refuses writes with a smaller one: that is what makes the
//! lock safe even when a holder stalls past its lease and another takes the
//! key. Runs on the main thread; the client's connections live on its own
//! background threads. Never holds the key after it returns: the guard
//! releases it when dropped, on every path.

use std::fs;
use std::io;
use std::path::PathBuf;
use std::thread;
use std::time::Duration;

use baton::client::{Client, Error};

/// The key every copy of this program asks for.
const KEY: &str = "example-ledger";
/// How long a grant lasts unless released or kept.
const LEASE: Duration = Duration::from_secs(10);
/// How long to wait in line before giving up.
const WAIT: Duration = Duration::from_secs(30);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let servers = std::env::var("BATON_SERVERS").unwrap_or_else(|_| "127.0.0.1:7373".into());
    let client = Client::connect(servers.split(','))?;
    let ledger = Ledger::new(std::env::temp_dir().join("baton-example-ledger"));

    println!("waiting for {KEY} (up to {WAIT:?})");
    let mut guard = match client.lock(KEY, LEASE, Some(WAIT)) {
        Ok(guard) => guard,
        Err(Error::Timeout) => {
            println!("someone else held {KEY} all along; giving up");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let token = guard.token();
    println!("got {KEY} with fencing token {token}");

    for step in 1..=5 {
        // Every write carries the token: the ledger refuses a stale one.
        ledger.write(
            token,
            &format!("step {step} of the job holding token {token}"),
        )?;
        println!("wrote step {step}");
        thread::sleep(Duration::from_secs(1));
        // A long job extends its lease before it runs out (Client::hold
        // does this in the background instead).
        guard.keep(LEASE)?;
    }
    let outcome = guard.release()?;
    println!("released {KEY}: {outcome:?}");
    Ok(())
}

/// The protected resource: a file holding the largest token seen and the
/// last line written. A real one checks and writes in one atomic step — a
/// database row updated `WHERE token <= $1`, an object store's conditional
/// write, a service that checks a header.
struct Ledger {
    path: PathBuf,
}

impl Ledger {
    fn new(path: PathBuf) -> Ledger {
        Ledger { path }
    }

    /// Write `line` for the holder of `token`, unless a holder with a
    /// greater token has written already.
    fn write(&self, token: u64, line: &str) -> io::Result<()> {
        let newest = match fs::read_to_string(&self.path) {
            Ok(text) => text
                .split_once(' ')
                .and_then(|(token, _)| token.parse::<u64>().ok())
                .unwrap_or(0),
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        if token < newest {
            return Err(io::Error::other(format!(
                "refused: token {token} is older than {newest}, which has written since"
            )));
        }
        fs::write(&self.path, format!("{token} {line}\n"))
    }
}
