//! The official client against a real cluster: a graceful restart of any
//! node, active or standby, causes no failed request at all (issue
//! 4), and redirects (`M`) are followed to the active.
//!
//! Real `batond` processes on loopback, killed by PID when the test ends;
//! their logs are printed if it fails.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use baton::client::Client;
use common::nodes::{Nodes, deref_to_nodes};
use common::{DEADLINE, wait_for};

const DETECT: &str = "0.5";

/// Two `batond` processes on loopback with one `--peers` list, both started;
/// killed by PID when dropped, and their logs printed if the test fails.
struct Pair {
    nodes: Nodes,
}

deref_to_nodes!(Pair);

impl Pair {
    fn start() -> Pair {
        let mut pair = Pair {
            nodes: Nodes::on_free_ports(2),
        };
        pair.start_node(0);
        pair.start_node(1);
        pair
    }

    fn start_node(&mut self, i: usize) {
        self.nodes.start_clustered(i, DETECT);
    }

    /// Node `active` serves with the other as its synced standby.
    fn wait_settled(&self, active: usize) {
        self.wait_synced_standbys(active, 1);
    }

    /// SIGTERM node `i`, wait for it to exit 0, start it again.
    fn graceful_restart(&mut self, i: usize) {
        assert_eq!(self.terminate(i), Some(0), "graceful exit of node {i}");
        self.start_node(i);
    }
}

#[test]
fn a_graceful_restart_of_either_node_fails_no_request_of_the_official_client() {
    let mut pair = Pair::start();
    pair.wait_settled(0);

    let client = Client::connect([pair.name(0), pair.name(1)]).expect("client");
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let client = client.clone();
            let stop = stop.clone();
            let done = done.clone();
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                let mut last_token = 0;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("job-{}", w % 2);
                    let lease = Duration::from_secs(5);
                    match client.acquire(&key, lease, Some(Duration::from_secs(10))) {
                        Ok(grant) => {
                            assert!(grant.token() > 0);
                            last_token = last_token.max(grant.token());
                            if let Err(e) = client.release(&grant) {
                                failures.push(format!("release: {e}"));
                            }
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => failures.push(format!("acquire: {e}")),
                    }
                }
                failures
            })
        })
        .collect();

    let ops_at = |n: u64| {
        let start = done.load(Ordering::Relaxed);
        wait_for("the workers to make progress", DEADLINE, || {
            (done.load(Ordering::Relaxed) >= start + n).then_some(())
        });
    };
    ops_at(50);
    // The active goes first: it hands over to node 1, then comes back and
    // takes over again by handoff.
    pair.graceful_restart(0);
    pair.wait_settled(0);
    ops_at(50);
    // Then the standby.
    pair.graceful_restart(1);
    pair.wait_settled(0);
    ops_at(50);

    stop.store(true, Ordering::Relaxed);
    let failures: Vec<String> = workers
        .into_iter()
        .flat_map(|w| w.join().expect("worker"))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} requests failed during graceful restarts: {failures:?}",
        failures.len(),
        done.load(Ordering::Relaxed)
    );
}

#[test]
fn the_client_follows_a_standby_redirect_to_the_active() {
    let pair = Pair::start();
    pair.wait_settled(0);
    // Only the standby is given: it answers M <active>, the client moves.
    let client = Client::connect([pair.name(1)]).expect("client");
    let grant = client
        .acquire(
            "redirected",
            Duration::from_secs(5),
            Some(Duration::from_secs(5)),
        )
        .expect("granted through the redirect");
    let mut raw = pair.client(0);
    let q = raw.ask("Q redirected");
    assert!(
        q.starts_with(&format!("Q redirected {} ", grant.token())),
        "the active holds the grant: {q}"
    );
    client.release(&grant).expect("release");
}

#[test]
fn the_async_client_follows_redirects_and_moves_on_when_the_active_dies() {
    let mut pair = Pair::start();
    pair.wait_settled(0);
    let client = Client::connect([pair.name(1)]).expect("client");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    let lease = Duration::from_secs(5);
    let wait = Some(Duration::from_secs(5));
    let first = rt
        .block_on(client.acquire_async("redirected", lease, wait))
        .expect("granted through the redirect");
    let mut raw = pair.client(0);
    let q = raw.ask("Q redirected");
    assert!(
        q.starts_with(&format!("Q redirected {} ", first.token())),
        "the active holds the grant: {q}"
    );

    // The active dies: the standby is promoted and the same client, whose
    // preferred node is now gone, is served by it.
    pair.kill(0);
    let second = rt
        .block_on(client.acquire_async("after-failover", lease, wait))
        .expect("granted by the promoted node");
    assert!(second.token() > first.token(), "tokens only grow");
    let status = rt
        .block_on(client.query_async("after-failover"))
        .expect("query");
    assert_eq!(status.token, Some(second.token()));
}
