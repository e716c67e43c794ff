//! The async calls under tokio: tasks that take turns on one key, and a
//! held lock whose loss stops the work it protects.
//!
//! Run a node on this machine, then the example:
//!
//! ```text
//! cargo run --release --bin batond -- --bind 127.0.0.1
//! cargo run --release --example async_tokio
//! ```
//!
//! `BATON_SERVERS` names other servers (`host:port`, comma-separated). The
//! client library depends on no async runtime — its futures work under
//! any executor — so a project using it adds tokio itself (here it is a
//! dev-dependency of the crate). Everything runs in tokio tasks; no call
//! blocks a runtime thread. Never leaves a key held: each guard is
//! released before its task ends, and the held key when the work is done.

use std::time::Duration;

use baton::client::{Client, Error};

const LEASE: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() -> Result<(), Error> {
    let servers = std::env::var("BATON_SERVERS").unwrap_or_else(|_| "127.0.0.1:7373".into());
    let client = Client::connect(servers.split(','))?;

    // Four tasks want the same key: the server grants it to one at a time,
    // in the order they asked, each with a greater fencing token.
    let mut tasks = Vec::new();
    for worker in 1..=4 {
        let client = client.clone(); // clones share the connections
        tasks.push(tokio::spawn(async move {
            let guard = client
                .lock_async("example-async", LEASE, Some(Duration::from_secs(30)))
                .await?;
            println!("worker {worker}: my turn, token {}", guard.token());
            tokio::time::sleep(Duration::from_millis(300)).await;
            guard.release_async().await?;
            Ok::<(), Error>(())
        }));
    }
    for task in tasks {
        task.await.expect("the worker task did not panic")?;
    }

    // A held lock: the client renews its lease in the background and says
    // at once if it is lost (a server says the token no longer holds it,
    // or none answers before the lease runs out). Race the work against it.
    let held = client
        .hold_async("example-async-held", Duration::from_secs(3), None)
        .await?;
    println!("holding example-async-held with token {}", held.token());
    tokio::select! {
        () = work(held.token()) => println!("work done; the lease was renewed as it ran"),
        why = held.lost() => println!("key lost, work stopped: {why}"),
    }
    held.release_async().await?;

    let status = client.query_async("example-async").await?;
    println!("example-async is free again: {}", status.is_free());
    Ok(())
}

/// Work longer than the held key's lease, fenced with its token.
async fn work(token: u64) {
    for step in 1..=5 {
        println!("  step {step} with token {token}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
