//! N workers sharing a key of limit N: each holds one slot of the
//! semaphore at a time, and the resource they share fences per (key, slot).
//!
//! Run a node on this machine, then the example (`WORKERS` workers, 3 by
//! default, on a key of limit `SLOTS`, 2 by default, so that some wait in
//! line for a slot):
//!
//! ```text
//! cargo run --release --bin batond -- --bind 127.0.0.1
//! cargo run --release --example semaphore_workers
//! ```
//!
//! `BATON_SERVERS` names other servers (`host:port`, comma-separated), as
//! for the `baton` command. Each worker thread acquires the key with the
//! limit, does a few rounds of work stamped with its grant's token, and
//! releases. The shared [`Fence`] keeps the last token it accepted for each
//! slot and refuses a smaller one: with several holders at once, "greater
//! than the last token" would refuse the older of two honest holders, so
//! the fence is per slot (a holder whose lease ran out and whose slot went
//! to someone else carries a smaller token than that slot's new holder).
//! Runs on the main thread and one thread per worker; never holds a slot
//! after it returns (every guard releases when dropped).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use baton::client::{AcquireOptions, Client};

/// The key every worker asks for.
const KEY: &str = "example-pool";
/// How long a grant lasts unless released or kept.
const LEASE: Duration = Duration::from_secs(10);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let servers = std::env::var("BATON_SERVERS").unwrap_or_else(|_| "127.0.0.1:7373".into());
    let slots = number("SLOTS", 2)?;
    let workers = number("WORKERS", 3)?;
    let client = Client::connect(servers.split(','))?;
    let fence = Arc::new(Fence::default());
    let handles: Vec<_> = (0..workers)
        .map(|id| {
            let (client, fence) = (client.clone(), fence.clone());
            thread::spawn(move || work(&client, &fence, id, slots))
        })
        .collect();
    for handle in handles {
        handle.join().map_err(|_| "a worker panicked")??;
    }
    println!("done: {:?}", fence.last.lock().map_err(|_| "poisoned")?);
    Ok(())
}

/// One worker: a slot of the semaphore, three rounds of work fenced with
/// its token, then release.
fn work(client: &Client, fence: &Fence, id: u32, slots: u32) -> Result<(), String> {
    let options = AcquireOptions::new()
        .limit(slots)
        .value(format!("worker-{id}"));
    let guard = client
        .lock_with(KEY, LEASE, None, &options)
        .map_err(|e| format!("worker {id}: {e}"))?;
    println!(
        "worker {id}: slot {} of {slots}, token {}",
        guard.slot(),
        guard.token()
    );
    for round in 0..3 {
        fence.write(
            guard.slot(),
            guard.token(),
            &format!("worker {id} round {round}"),
        )?;
        thread::sleep(Duration::from_millis(200));
    }
    guard.release().map_err(|e| format!("worker {id}: {e}"))?;
    Ok(())
}

/// The shared resource: the last token it accepted per slot.
#[derive(Default)]
struct Fence {
    last: Mutex<HashMap<u32, u64>>,
}

impl Fence {
    /// Accept a write from the holder of `slot` with `token`, unless that
    /// slot has seen a greater token since.
    fn write(&self, slot: u32, token: u64, what: &str) -> Result<(), String> {
        let mut last = self.last.lock().map_err(|_| "poisoned".to_string())?;
        let seen = last.entry(slot).or_insert(0);
        if token < *seen {
            return Err(format!(
                "refused {what}: slot {slot} has seen token {seen}, this is {token}"
            ));
        }
        *seen = token;
        println!("  slot {slot}: {what}");
        Ok(())
    }
}

/// A positive number from the environment, or `default`.
fn number(name: &str, default: u32) -> Result<u32, String> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(text) => match text.parse::<u32>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{name}: expected a positive number, got {text:?}")),
        },
    }
}
