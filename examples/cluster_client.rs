//! A client of a two-node cluster that keeps working when the active node
//! dies: it takes and releases a key once a second, and holds another the
//! whole time, while you kill the active node.
//!
//! Start two nodes on this machine that share a cluster key:
//!
//! ```text
//! (umask 077; head -c 32 /dev/urandom | base64 > /tmp/baton-example.key)
//! cargo build --release --bin batond
//! for port in 7373 7374; do
//!   target/release/batond --bind 127.0.0.1 --port $port \
//!     --peers 127.0.0.1:7373,127.0.0.1:7374 \
//!     --cluster-key-file /tmp/baton-example.key &
//! done
//! cargo run --release --example cluster_client
//! ```
//!
//! (from a checkout, `scripts/cluster.sh start 2` does the same, and
//! `scripts/cluster.sh kill 0` / `restart 0` / `stop` the rest). Then kill
//! the active node (the first, port 7373, unless it was down at the start):
//! the calls of the next second or two wait for the standby to take over,
//! then go on against it, with tokens still greater than every token
//! before; the held key stays held through the failover, its lease kept by
//! the new active. `BATON_SERVERS` names other nodes (`host:port`,
//! comma-separated). Runs on the main thread for 60 rounds; the client's
//! connections, reconnections and the held key's watchdog live on its own
//! background threads. Never gives up on an unreachable cluster before its
//! rounds are done: each failed round says why and the next one tries again.

use std::time::Duration;

use baton::client::{Client, Error};

const ROUNDS: u32 = 60;
const LEASE: Duration = Duration::from_secs(5);

fn main() -> Result<(), Error> {
    let servers =
        std::env::var("BATON_SERVERS").unwrap_or_else(|_| "127.0.0.1:7373,127.0.0.1:7374".into());
    // Every node, in any order: calls go to the active one, following
    // redirects from standbys and moving on when a node is down.
    let client = Client::connect(servers.split(','))?;
    let held = client.hold("example-cluster-held", LEASE, Some(Duration::from_secs(10)))?;
    println!("holding example-cluster-held, token {}", held.token());

    let mut newest = 0;
    for round in 1..=ROUNDS {
        match client.acquire("example-cluster", LEASE, Some(Duration::from_secs(10))) {
            Ok(grant) => {
                let token = grant.token();
                assert!(token > newest, "tokens only grow, across failovers too");
                newest = token;
                client.release(&grant)?;
                println!(
                    "round {round}: token {token}, active node {}",
                    active(&client)
                );
            }
            // No node answered in time (the active one just died, and the
            // standby has not taken over yet): try again next round.
            Err(e) if e.is_unreachable() => println!("round {round}: {e}"),
            Err(e) => return Err(e),
        }
        if let Some(why) = held.wait_lost_timeout(Duration::from_secs(1)) {
            println!("the held key was lost: {why}");
            break;
        }
    }
    held.release()?;
    Ok(())
}

/// The active node's address, as the first node that answers `I` says.
fn active(client: &Client) -> String {
    client
        .servers()
        .iter()
        .find_map(|server| {
            let info = client.info(server).ok()?;
            info.get("active").map(str::to_string)
        })
        .unwrap_or_else(|| "unknown".into())
}
