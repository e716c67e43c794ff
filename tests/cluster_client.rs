//! The official client against a real cluster: a graceful restart of any
//! node, active or standby, causes no failed request at all (issue
//! 4), and redirects (`M`) are followed to the active.
//!
//! Real `batond` processes on loopback, killed by PID when the test ends.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use baton::client::Client;
use common::{DEADLINE, LineClient, Node, free_port, info_field, wait_for};

const DETECT: &str = "0.5";

struct Pair {
    ports: [u16; 2],
    nodes: [Option<Node>; 2],
}

impl Pair {
    fn start() -> Pair {
        let a = free_port();
        let mut b = free_port();
        while b == a {
            b = free_port();
        }
        let mut pair = Pair {
            ports: [a, b],
            nodes: [None, None],
        };
        pair.start_node(0);
        pair.start_node(1);
        pair
    }

    fn name(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.ports[i])
    }

    fn start_node(&mut self, i: usize) {
        let peers = format!("{},{}", self.name(0), self.name(1));
        let port = self.ports[i].to_string();
        let args = [
            "--bind",
            "127.0.0.1",
            "--port",
            &port,
            "--peers",
            &peers,
            "--detect",
            DETECT,
            "--cluster-key-file",
            common::cluster_key_file(),
        ];
        self.nodes[i] = Some(Node::start_raw(&args, Some(self.ports[i])));
    }

    fn info(&self, i: usize) -> Option<String> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.ports[i]));
        let stream =
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok()?;
        drop(stream);
        let mut client = LineClient::connect(addr);
        client.send("I");
        client.try_recv(Duration::from_secs(1))
    }

    /// Node `active` serves with the other as its synced standby.
    fn wait_settled(&self, active: usize) {
        wait_for(
            &format!("node {active} active with a synced standby"),
            DEADLINE,
            || {
                let info = self.info(active)?;
                let serving = info_field(&info, "state").as_deref() == Some("active");
                let synced = info_field(&info, "standbys").as_deref() == Some("1");
                (serving && synced).then_some(())
            },
        );
    }

    /// SIGTERM node `i`, wait for it to exit 0, start it again.
    fn graceful_restart(&mut self, i: usize) {
        let mut node = self.nodes[i].take().expect("running");
        node.signal("TERM");
        assert_eq!(
            node.wait_exit(DEADLINE),
            Some(0),
            "graceful exit: {}",
            node.log()
        );
        std::mem::forget(node); // reaped already: nothing to signal
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
    let mut raw = LineClient::connect(std::net::SocketAddr::from(([127, 0, 0, 1], pair.ports[0])));
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
    let mut raw = LineClient::connect(std::net::SocketAddr::from(([127, 0, 0, 1], pair.ports[0])));
    let q = raw.ask("Q redirected");
    assert!(
        q.starts_with(&format!("Q redirected {} ", first.token())),
        "the active holds the grant: {q}"
    );

    // The active dies: the standby is promoted and the same client, whose
    // preferred node is now gone, is served by it.
    let mut active = pair.nodes[0].take().expect("node 0 runs");
    active.signal("KILL");
    active.wait_exit(DEADLINE);
    let second = rt
        .block_on(client.acquire_async("after-failover", lease, wait))
        .expect("granted by the promoted node");
    assert!(second.token() > first.token(), "tokens only grow");
    let status = rt
        .block_on(client.query_async("after-failover"))
        .expect("query");
    assert_eq!(status.token, Some(second.token()));
}
