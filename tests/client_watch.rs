//! Watches and elections through the client library and `baton watch`,
//! against real `batond` processes: a watch sees each grant, release and
//! expiry of a key's holders (blocking, under tokio, and under a bare
//! executor); it watches again on the new active when the active is
//! killed; an election hands over when its leader resigns and tells the
//! leader at once when its key is taken away; `baton watch` prints one line
//! per change, exits 0 on SIGINT, and `--once` after the first line.
//!
//! Every node and `baton` process is killed by its PID when the test ends;
//! waits are polls with a deadline.

mod common;

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use baton::client::{AcquireOptions, Client, Error, ReleaseOutcome, Watch, WatchState};
use baton::protocol::Reason;
use common::nodes::{Nodes, deref_to_nodes};
use common::{DEADLINE, Node, baton_path, block_on, tokio_runtime, wait_for};

const LEASE: Duration = Duration::from_secs(10);

fn node(args: &[&str]) -> Node {
    let mut all = vec!["--threads", "1"];
    all.extend_from_slice(args);
    Node::start(&all)
}

fn client<S: AsRef<str>>(servers: &[S]) -> Client {
    Client::connect(servers).expect("a client")
}

/// The next state within the deadline; fails the test otherwise.
fn next(watch: &mut Watch) -> WatchState {
    watch
        .next_timeout(Some(DEADLINE))
        .expect("the watch goes on")
        .expect("a state within the deadline")
}

fn value_of(state: &WatchState) -> Option<String> {
    state
        .value
        .as_ref()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// (token, holders, waiting, value).
fn fields(state: &WatchState) -> (u64, u64, u64, Option<String>) {
    (state.token, state.holders, state.waiting, value_of(state))
}

fn free() -> (u64, u64, u64, Option<String>) {
    (0, 0, 0, None)
}

/// A node with `--metrics` on a free port, and that port's address.
fn metrics_node() -> (Node, std::net::SocketAddr) {
    let listen = format!("127.0.0.1:{}", common::free_port());
    let n = node(&["--metrics", &listen]);
    (n, listen.parse().expect("an address"))
}

/// `baton_watches` on the node's metrics: the (connection, key) pairs
/// watched now.
fn watches_on(metrics: std::net::SocketAddr) -> u64 {
    use std::io::{Read, Write};
    let mut stream =
        std::net::TcpStream::connect_timeout(&metrics, DEADLINE).expect("connect to metrics");
    stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("send");
    let mut body = String::new();
    let _ = stream.read_to_string(&mut body);
    body.lines()
        .find_map(|line| line.strip_prefix("baton_watches "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or_else(|| panic!("no baton_watches in {body:?}"))
}

#[test]
fn a_watch_sees_the_state_now_each_grant_and_release_and_the_free_key() {
    let (n, metrics) = metrics_node();
    let c = client(&[n.addr.to_string()]);
    let mut watch = c.watch("job").expect("a watch");
    assert_eq!(
        fields(&next(&mut watch)),
        free(),
        "an unheld key is 0 0 0 -"
    );

    let two = AcquireOptions::new().limit(2).value("host-a");
    let first = c.acquire_with("job", LEASE, None, &two).expect("slot 0");
    assert_eq!(
        fields(&next(&mut watch)),
        (first.token(), 1, 0, Some("host-a".into()))
    );
    let second = c
        .acquire_with("job", LEASE, None, &AcquireOptions::new().limit(2))
        .expect("slot 1");
    assert_eq!(
        fields(&next(&mut watch)),
        (second.token(), 2, 0, None),
        "the newest grant's token, and its (lack of a) value"
    );
    assert_eq!(c.release(&second), Ok(ReleaseOutcome::Released));
    assert_eq!(
        fields(&next(&mut watch)),
        (first.token(), 1, 0, Some("host-a".into()))
    );
    assert_eq!(c.release(&first), Ok(ReleaseOutcome::Released));
    assert_eq!(fields(&next(&mut watch)), free());

    // An expiry is a change too.
    let short = c
        .acquire("job", Duration::from_millis(300), None)
        .expect("granted");
    assert_eq!(next(&mut watch).token, short.token());
    assert_eq!(fields(&next(&mut watch)), free(), "the lease ran out");

    // Closing sends X: the node's watch count goes back to 0, while the
    // connection stays up for other requests.
    assert_eq!(watches_on(metrics), 1);
    watch.close();
    wait_for("the watch to be given up", DEADLINE, || {
        (watches_on(metrics) == 0).then_some(())
    });
    assert!(c.connections().iter().all(|conn| conn.connected));
}

#[test]
fn two_watches_of_one_key_on_one_client_each_see_every_change() {
    let n = node(&[]);
    let c = client(&[n.addr.to_string()]);
    let mut watches: Vec<Watch> = (0..3).map(|_| c.watch("job").expect("a watch")).collect();
    for watch in &mut watches {
        assert_eq!(fields(&next(watch)), free());
    }
    let grant = c.acquire("job", LEASE, None).expect("granted");
    for watch in &mut watches {
        // Two watches sharing a connection may see the key's state again
        // when the other subscribes; never a wrong one.
        let mut state = next(watch);
        while state.token == 0 {
            state = next(watch);
        }
        assert_eq!(fields(&state), (grant.token(), 1, 0, None));
    }
    // Dropping one leaves the others watching.
    drop(watches.pop());
    assert_eq!(c.release(&grant), Ok(ReleaseOutcome::Released));
    for watch in &mut watches {
        let mut state = next(watch);
        while state.token != 0 {
            state = next(watch);
        }
        assert_eq!(fields(&state), free());
    }
}

#[test]
fn too_many_watches_on_a_connection_end_the_watch_with_the_refusal() {
    let n = node(&["--max-watches", "1"]);
    // One server: two connections, so three keys put two on one of them.
    let c = client(&[n.addr.to_string()]);
    let mut watches: Vec<Watch> = ["a", "b", "c"]
        .iter()
        .map(|key| c.watch(key).expect("a watch"))
        .collect();
    let ends: Vec<Result<Option<WatchState>, Error>> = watches
        .iter_mut()
        .map(|w| w.next_timeout(Some(DEADLINE)))
        .collect();
    let refused = ends
        .iter()
        .filter(|end| **end == Err(Error::Refused(Reason::TooManyWatches)))
        .count();
    assert!(refused >= 1, "{ends:?}");
    for (watch, end) in watches.iter_mut().zip(&ends) {
        if end.is_err() {
            // An ended watch stays ended, and the iterator yields no more.
            assert_eq!(
                watch.next_timeout(Some(Duration::ZERO)),
                Err(Error::Refused(Reason::TooManyWatches))
            );
            assert!(watch.next().is_none());
        }
    }
}

async fn bounded<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(DEADLINE, future)
        .await
        .expect("the future completed within the deadline")
}

fn assert_send<T: Send>(_: &T) {}

#[test]
fn an_async_watch_under_tokio_sees_grants_and_releases() {
    let n = node(&[]);
    let c = client(&[n.addr.to_string()]);
    tokio_runtime().block_on(async {
        let mut watch = c.watch("job").expect("a watch");
        assert_send(&watch.next_async());
        let first = bounded(watch.next_async()).await.expect("a state");
        assert_eq!(fields(&first.expect("the state now")), free());
        let grant = bounded(c.acquire_async("job", LEASE, None))
            .await
            .expect("granted");
        let held = bounded(watch.next_async()).await.expect("a state");
        assert_eq!(fields(&held.expect("held")), (grant.token(), 1, 0, None));
        bounded(c.release_async(&grant)).await.expect("released");
        let freed = bounded(watch.next_async()).await.expect("a state");
        assert_eq!(fields(&freed.expect("free")), free());
        assert_eq!(
            fields(&bounded(c.leader_async("job")).await.expect("leader")),
            free()
        );
    });
}

#[test]
fn an_async_watch_needs_no_runtime() {
    let n = node(&[]);
    let c = client(&[n.addr.to_string()]);
    let mut watch = c.watch("job").expect("a watch");
    let first = block_on(watch.next_async()).expect("a state");
    assert_eq!(fields(&first.expect("the state now")), free());
    // The change comes from another thread while this one is parked.
    let granter = {
        let c = c.clone();
        std::thread::spawn(move || c.acquire("job", LEASE, None).expect("granted"))
    };
    let held = block_on(watch.next_async()).expect("a state");
    let grant = granter.join().expect("granter thread");
    assert_eq!(fields(&held.expect("held")), (grant.token(), 1, 0, None));
}

#[test]
fn an_election_hands_over_when_the_leader_resigns() {
    let n = node(&[]);
    let servers = [n.addr.to_string()];
    let (a, b, watcher) = (client(&servers), client(&servers), client(&servers));
    assert_eq!(fields(&watcher.leader("lead").expect("leader")), free());
    let mut leaders = watcher.observe("lead").expect("observe");
    assert_eq!(fields(&next(&mut leaders)), free(), "nobody leads yet");

    let leader_a = a
        .campaign("lead", "10.0.0.1:80", LEASE, None)
        .expect("a leads");
    assert_eq!(
        fields(&next(&mut leaders)),
        (leader_a.token(), 1, 0, Some("10.0.0.1:80".into()))
    );
    // b waits in line; observe yields no new leader for that.
    let (elected, got_b) = mpsc::channel();
    let candidate = std::thread::spawn(move || {
        let held = b
            .campaign("lead", "10.0.0.2:80", LEASE, None)
            .expect("b leads");
        elected.send(held.token()).expect("tell the test");
        // Lead until the test is done.
        held.wait_lost_timeout(DEADLINE)
    });
    wait_for("b to wait in line", DEADLINE, || {
        (watcher.query("lead").expect("query").waiting == 1).then_some(())
    });
    let leader = watcher.leader("lead").expect("leader");
    assert_eq!(
        fields(&leader),
        (leader_a.token(), 1, 1, Some("10.0.0.1:80".into()))
    );

    // a resigns: b leads, with a greater token; the watcher sees b.
    assert_eq!(leader_a.release(), Ok(ReleaseOutcome::Released));
    let token_b = got_b.recv_timeout(DEADLINE).expect("b elected");
    let now = next(&mut leaders);
    assert_eq!(fields(&now), (token_b, 1, 0, Some("10.0.0.2:80".into())));
    let leader = watcher.leader("lead").expect("leader");
    assert_eq!(
        (leader.token, value_of(&leader)),
        (token_b, Some("10.0.0.2:80".into()))
    );
    drop(leaders);
    drop(watcher);
    // b is still leading when the test ends (its lost wait runs out).
    assert_eq!(candidate.join().expect("candidate"), None);
}

#[test]
fn a_leader_is_told_at_once_when_its_key_is_taken_away() {
    let n = node(&[]);
    let servers = [n.addr.to_string()];
    let (c, operator) = (client(&servers), client(&servers));
    let leadership = c
        .campaign("lead", "me", Duration::from_millis(900), None)
        .expect("leads");
    let mut leaders = operator.observe("lead").expect("observe");
    assert_eq!(next(&mut leaders).token, leadership.token());
    // Someone releases it with its token: the next renewal hears "not
    // held", and leadership is lost.
    assert_eq!(
        operator.release_token("lead", leadership.token()),
        Ok(ReleaseOutcome::Released)
    );
    assert_eq!(leadership.wait_lost_timeout(DEADLINE), Some(Error::NotHeld));
    tokio_runtime().block_on(async {
        assert_eq!(bounded(leadership.lost()).await, Error::NotHeld);
    });
    assert_eq!(fields(&next(&mut leaders)), free(), "nobody leads");
}

/// Two nodes of one cluster, both started; killed by PID when dropped.
struct Pair {
    nodes: Nodes,
}

deref_to_nodes!(Pair);

impl Pair {
    fn start() -> Pair {
        Pair {
            nodes: Nodes::formed_pair("0.5"),
        }
    }
}

#[test]
fn a_watch_survives_killing_the_active_and_yields_the_new_actives_state() {
    let mut pair = Pair::start();
    let c = client(&pair.names());
    let mut watch = c.watch("job").expect("a watch");
    assert_eq!(fields(&next(&mut watch)), free());
    // A plain grant: holders' values are not replicated (yet), so the new
    // active would show this one's as `-`.
    let grant = c.acquire("job", LEASE, None).expect("granted");
    assert_eq!(fields(&next(&mut watch)), (grant.token(), 1, 0, None));

    // The active dies; node 1 takes over with the replicated grant, and
    // the watch's first line there is that state.
    // Replication is asynchronous: kill the active only once the standby
    // has the grant (a grant made just before a failover may be lost).
    pair.wait_held(1, 1);
    pair.kill(0);
    let after = next(&mut watch);
    assert_eq!(fields(&after), (grant.token(), 1, 0, None));
    // It is the new active's watch: a release there is seen.
    assert_eq!(c.release(&grant), Ok(ReleaseOutcome::Released));
    let mut state = next(&mut watch);
    while state.token != 0 {
        state = next(&mut watch);
    }
    assert_eq!(fields(&state), free());
}

#[test]
fn observe_survives_a_failover_without_repeating_the_leader() {
    let mut pair = Pair::start();
    let c = client(&pair.names());
    let leadership = c.campaign("lead", "me", LEASE, None).expect("leads");
    let mut leaders = c.observe("lead").expect("observe");
    assert_eq!(next(&mut leaders).token, leadership.token());
    // Replication is asynchronous: kill the active only once the standby
    // has the grant (a grant made just before a failover may be lost).
    pair.wait_held(1, 1);
    pair.kill(0);
    // The same leader on the new active is no change; its resignation is.
    let until = std::time::Instant::now() + DEADLINE;
    wait_for("node 1 to serve", DEADLINE, || {
        c.query("lead").ok().filter(|q| q.token.is_some())
    });
    assert_eq!(leadership.release(), Ok(ReleaseOutcome::Released));
    let left = leaders
        .next_timeout(Some(
            until.saturating_duration_since(std::time::Instant::now()),
        ))
        .expect("goes on")
        .expect("a change");
    assert_eq!(fields(&left), free());
}

// --- `baton watch` --------------------------------------------------------------

/// `baton --servers <servers> <args>` with piped output, killed by PID when
/// dropped.
struct Baton {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Baton {
    fn start(servers: &str, args: &[&str]) -> Baton {
        let mut child = Command::new(baton_path())
            .arg("--servers")
            .arg(servers)
            .args(args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn baton");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Baton { child, lines }
    }

    fn line(&self) -> String {
        self.lines
            .recv_timeout(DEADLINE)
            .expect("a line from baton watch within the deadline")
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid");
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(pid, signal) };
    }

    fn exit_code(&mut self) -> Option<i32> {
        wait_for("baton to exit", DEADLINE, || {
            self.child.try_wait().expect("try_wait")
        })
        .code()
    }

    fn stderr(&mut self) -> String {
        let mut text = String::new();
        if let Some(pipe) = self.child.stderr.as_mut() {
            std::io::Read::read_to_string(pipe, &mut text).expect("stderr");
        }
        text
    }
}

impl Drop for Baton {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn baton_watch_prints_a_line_per_change_and_exits_0_on_sigint() {
    let n = node(&[]);
    let servers = n.addr.to_string();
    let c = client(&[&servers]);
    let mut watch = Baton::start(&servers, &["watch", "job"]);
    assert_eq!(watch.line(), "0 0 0 -");
    let grant = c
        .acquire_with(
            "job",
            LEASE,
            None,
            &AcquireOptions::new().limit(2).value("w1"),
        )
        .expect("granted");
    assert_eq!(watch.line(), format!("{} 1 0 w1", grant.token()));
    assert_eq!(c.release(&grant), Ok(ReleaseOutcome::Released));
    assert_eq!(watch.line(), "0 0 0 -");
    watch.signal(libc::SIGINT);
    assert_eq!(watch.exit_code(), Some(0));
    assert_eq!(watch.stderr(), "");
}

#[test]
fn baton_watch_once_prints_the_state_now_and_exits() {
    let n = node(&[]);
    let servers = n.addr.to_string();
    let c = client(&[&servers]);
    let grant = c.acquire("job", LEASE, None).expect("granted");
    let mut once = Baton::start(&servers, &["watch", "job", "--once"]);
    assert_eq!(once.line(), format!("{} 1 0 -", grant.token()));
    assert_eq!(once.exit_code(), Some(0));
    assert!(once.lines.recv_timeout(DEADLINE).is_err(), "one line only");

    // With no server, --once gives up after the timeouts: one line, exit 1.
    let nobody = format!("127.0.0.1:{}", common::free_port());
    let mut lost = Baton::start(&nobody, &["--timeout", "0.5", "watch", "job", "--once"]);
    assert_eq!(lost.exit_code(), Some(1));
    let stderr = lost.stderr();
    assert!(
        stderr.lines().count() == 1 && stderr.contains("cannot watch job"),
        "{stderr}"
    );
}

#[test]
fn baton_watch_follows_the_key_across_a_failover() {
    let mut pair = Pair::start();
    let servers = pair.names().join(",");
    let c = client(&pair.names());
    let watch = Baton::start(&servers, &["watch", "job"]);
    assert_eq!(watch.line(), "0 0 0 -");
    let grant = c.acquire("job", LEASE, None).expect("granted");
    let held = format!("{} 1 0 -", grant.token());
    assert_eq!(watch.line(), held);
    // Replication is asynchronous: kill the active only once the standby
    // has the grant (a grant made just before a failover may be lost).
    pair.wait_held(1, 1);
    pair.kill(0);
    assert_eq!(watch.line(), held, "the new active's first line");
    assert_eq!(c.release(&grant), Ok(ReleaseOutcome::Released));
    let mut line = watch.line();
    while line == held {
        line = watch.line();
    }
    assert_eq!(line, "0 0 0 -");
}
