//! The client library against real `batond` processes, with faults
//! injected by the proxy and the fake standby of `common/faults.rs`.

mod common;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use baton::client::{Client, Error, ReleaseOutcome};
use baton::protocol::Reason;
use common::faults::{FakeServer, Proxy};
use common::{DEADLINE, Node, wait_for};

const LEASE: Duration = Duration::from_secs(10);

fn node() -> Node {
    Node::start(&["--threads", "1"])
}

fn server(node: &Node) -> String {
    node.addr.to_string()
}

fn client<S: AsRef<str>>(servers: &[S]) -> Client {
    Client::connect(servers).expect("a client")
}

fn up(client: &Client) -> usize {
    client.connections().iter().filter(|c| c.connected).count()
}

fn wait_up(client: &Client, count: usize) {
    wait_for("connections to be up", DEADLINE, || {
        (up(client) == count).then_some(())
    });
}

fn holder_of(client: &Client, key: &str) -> Option<u64> {
    client.query(key).expect("query").token
}

#[test]
fn one_address_gets_two_connections_and_several_get_one_each() {
    let (a, b) = (node(), node());
    let one = client(&[server(&a)]);
    wait_up(&one, 2);
    assert_eq!(one.connections().len(), 2);
    let info = one.info(&server(&a)).expect("info");
    assert_eq!(
        (info.role(), info.get("conns")),
        (Some("active"), Some("2"))
    );
    drop(one);

    let two = client(&[server(&a), server(&b)]);
    wait_up(&two, 2);
    assert_eq!(two.connections().len(), 2);
    for addr in [server(&a), server(&b)] {
        wait_for("the old connections to close", DEADLINE, || {
            let info = two.info(&addr).expect("info");
            (info.get("conns") == Some("1")).then_some(())
        });
    }
}

#[test]
fn acquire_query_keep_and_release_work_end_to_end() {
    let n = node();
    let c = client(&[server(&n)]);
    let sent = Instant::now();
    let mut grant = c
        .acquire("job", Duration::from_secs(5), None)
        .expect("granted");
    assert_eq!(grant.key().as_bytes(), b"job");
    assert!(grant.time_left() <= Duration::from_secs(5));
    assert!(grant.expires_at() >= sent + Duration::from_secs(5));

    let status = c.query("job").expect("query");
    assert_eq!((status.token, status.waiting), (Some(grant.token()), 0));
    assert!(status.time_left <= Duration::from_secs(5));

    c.keep(&mut grant, Duration::from_secs(20)).expect("kept");
    assert!(grant.time_left() > Duration::from_secs(19));
    assert!(c.query("job").expect("query").time_left > Duration::from_secs(15));

    assert_eq!(c.release(&grant), Ok(ReleaseOutcome::Released));
    assert!(c.query("job").expect("query").is_free());
    assert_eq!(c.release(&grant), Ok(ReleaseOutcome::NotHeld));
    assert_eq!(c.keep(&mut grant, LEASE), Err(Error::NotHeld));

    let next = c.acquire("job", LEASE, None).expect("granted again");
    assert!(next.token() > grant.token());
    assert_eq!(
        c.release_token("job", next.token()),
        Ok(ReleaseOutcome::Released)
    );
}

#[test]
fn a_timeout_and_a_refusal_are_typed_errors() {
    let n = Node::start(&["--threads", "1", "--max-lease", "10"]);
    let c = client(&[server(&n)]);
    let held = c.acquire("k", LEASE, None).expect("granted");

    let start = Instant::now();
    let wait = Some(Duration::from_millis(200));
    assert_eq!(c.acquire("k", LEASE, wait), Err(Error::Timeout));
    // The server counts whole milliseconds, so T may come up to 1 ms early.
    assert!(
        start.elapsed() >= Duration::from_millis(199),
        "{:?}",
        start.elapsed()
    );
    assert!(start.elapsed() < Duration::from_secs(2));

    let start = Instant::now();
    assert_eq!(
        c.acquire("k", LEASE, Some(Duration::ZERO)),
        Err(Error::Timeout)
    );
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "a try-lock is quick"
    );

    let too_long = Duration::from_secs(20);
    assert_eq!(
        c.acquire("other", too_long, None),
        Err(Error::Refused(Reason::LeaseTooLong))
    );
    assert!(matches!(
        c.acquire("a key", LEASE, None),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        c.acquire("k", Duration::ZERO, None),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(
        holder_of(&c, "k"),
        Some(held.token()),
        "a timeout takes nothing"
    );
}

#[test]
fn threads_share_one_client_and_a_waiting_acquire_holds_up_nothing() {
    let n = node();
    let c = client(&[server(&n)]);
    let held = c.acquire("busy", LEASE, None).expect("granted");
    let waiter = {
        let c = c.clone();
        thread::spawn(move || c.acquire("busy", LEASE, None))
    };
    wait_for("the acquire to wait in line", DEADLINE, || {
        (c.query("busy").expect("query").waiting == 1).then_some(())
    });

    let held_token = held.token();
    let workers: Vec<_> = (0..8)
        .map(|i| {
            let c = c.clone();
            thread::spawn(move || {
                let key = format!("own-{i}");
                for _ in 0..25 {
                    let grant = c.acquire(&key, LEASE, Some(DEADLINE)).expect("granted");
                    assert_eq!(c.query("busy").expect("query").token, Some(held_token));
                    assert_eq!(c.release(&grant), Ok(ReleaseOutcome::Released));
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("a worker");
    }
    assert!(!waiter.is_finished(), "still in line");
    assert_eq!(c.release(&held), Ok(ReleaseOutcome::Released));
    let next = waiter
        .join()
        .expect("the waiter")
        .expect("granted on release");
    assert!(next.token() > held.token());
}

#[test]
fn answers_for_one_key_reach_their_callers_in_send_order() {
    let n = node();
    let c = client(&[server(&n)]);
    let first = c.acquire("k", LEASE, None).expect("granted");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..4 {
        let (c2, order) = (c.clone(), order.clone());
        waiters.push(thread::spawn(move || {
            let grant = c2.acquire("k", LEASE, None).expect("granted");
            assert_eq!(c2.query("k").expect("query").token, Some(grant.token()));
            order.lock().unwrap().push((i, grant.token()));
            assert_eq!(c2.release(&grant), Ok(ReleaseOutcome::Released));
        }));
        wait_for("the acquire to queue", DEADLINE, || {
            (c.query("k").expect("query").waiting == i + 1).then_some(())
        });
    }
    c.release(&first).expect("released");
    for waiter in waiters {
        waiter.join().expect("a waiter");
    }
    let order = order.lock().unwrap().clone();
    let callers: Vec<u64> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(callers, [0, 1, 2, 3], "FIFO, each grant to its own caller");
    assert!(order.windows(2).all(|w| w[0].1 < w[1].1), "{order:?}");
}

#[test]
fn requests_go_round_robin_over_the_connections() {
    let n = node();
    let (p1, p2) = (Proxy::start(n.addr), Proxy::start(n.addr));
    let c = client(&[p1.server(), p2.server()]);
    wait_up(&c, 2);
    for _ in 0..20 {
        c.query("k").expect("query");
    }
    assert_eq!((p1.count("Q k"), p2.count("Q k")), (10, 10));
}

/// A client on two proxies to one node, and a grant on "k" held by another
/// client, so that the first client's acquire of "k" waits in line.
struct Failover {
    node: Node,
    proxies: [Proxy; 2],
    holder: Client,
    held: baton::client::Grant,
    client: Client,
}

impl Failover {
    fn start() -> Failover {
        let node = node();
        let proxies = [Proxy::start(node.addr), Proxy::start(node.addr)];
        let holder = client(&[server(&node)]);
        let held = holder.acquire("k", LEASE, None).expect("granted");
        let client = client(&[proxies[0].server(), proxies[1].server()]);
        wait_up(&client, 2);
        proxies.iter().for_each(|p| p.wait_live(1));
        Failover {
            node,
            proxies,
            holder,
            held,
            client,
        }
    }

    /// The index of the proxy that carried the acquire.
    fn carrier(&self) -> usize {
        wait_for("the acquire to go out", DEADLINE, || {
            (0..2).find(|&i| self.proxies[i].count("A k ") == 1)
        })
    }

    fn wait_resent_on(&self, index: usize) {
        wait_for("the acquire to be sent again", DEADLINE, || {
            (self.proxies[index].count("A k ") == 1).then_some(())
        });
    }
}

#[test]
fn an_acquire_moves_to_the_next_connection_when_its_connection_drops() {
    let f = Failover::start();
    let acquire = {
        let c = f.client.clone();
        thread::spawn(move || c.acquire("k", LEASE, None))
    };
    let first = f.carrier();
    f.proxies[first].cut();
    f.wait_resent_on(1 - first);
    wait_for(
        "the dropped connection's place in line to go",
        DEADLINE,
        || (f.holder.query("k").expect("query").waiting == 1).then_some(()),
    );
    assert_eq!(f.holder.release(&f.held), Ok(ReleaseOutcome::Released));
    let grant = acquire
        .join()
        .expect("thread")
        .expect("granted after failover");
    assert!(grant.token() > f.held.token());
    assert_eq!(holder_of(&f.holder, "k"), Some(grant.token()));
    drop(f.node);
}

#[test]
fn an_acquire_fails_only_after_every_connection_failed() {
    let f = Failover::start();
    let acquire = {
        let c = f.client.clone();
        thread::spawn(move || c.acquire("k", LEASE, None))
    };
    let first = f.carrier();
    f.proxies[first].cut();
    f.wait_resent_on(1 - first);
    assert!(
        !acquire.is_finished(),
        "one failed attempt of two is no error"
    );
    let cut = Instant::now();
    f.proxies[1 - first].cut();
    let result = acquire.join().expect("thread");
    assert!(matches!(result, Err(Error::NoConnection(_))), "{result:?}");
    assert!(
        cut.elapsed() < Duration::from_secs(2),
        "{:?}",
        cut.elapsed()
    );
}

#[test]
fn a_dropped_connection_comes_back_after_three_seconds() {
    let n = node();
    let p = Proxy::start(n.addr);
    let c = client(&[p.server()]);
    wait_up(&c, 2);
    p.wait_live(2);
    let accepted = p.accepted();
    let cut = Instant::now();
    p.cut();
    wait_up(&c, 0);

    let start = Instant::now();
    let result = c.query("k");
    assert!(matches!(result, Err(Error::NoConnection(_))), "{result:?}");
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "no waiting when all are down"
    );

    wait_up(&c, 2);
    let took = cut.elapsed();
    assert!(
        took >= Duration::from_millis(2900),
        "reconnected after {took:?}"
    );
    assert!(took < Duration::from_secs(6), "reconnected after {took:?}");
    p.wait_live(2);
    assert_eq!(p.accepted(), accepted + 2, "one attempt per connection");
    assert!(c.query("k").expect("query").is_free());
}

#[test]
fn a_release_is_retried_until_a_connection_is_back() {
    let n = node();
    let p = Proxy::start(n.addr);
    let c = client(&[p.server()]);
    let grant = c.acquire("k", LEASE, None).expect("granted");
    p.wait_live(2);
    p.refuse(true);
    p.cut();
    wait_up(&c, 0);

    let start = Instant::now();
    let release = {
        let (c, grant) = (c.clone(), grant.clone());
        thread::spawn(move || c.release(&grant))
    };
    thread::sleep(Duration::from_secs(1)); // the outage lasts a second
    p.refuse(false);
    assert_eq!(
        release.join().expect("thread"),
        Ok(ReleaseOutcome::Released)
    );
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(2500), "{took:?}");
    assert!(took < Duration::from_millis(5500), "{took:?}");
    let direct = client(&[server(&n)]);
    assert!(direct.query("k").expect("query").is_free());
}

#[test]
fn not_held_after_a_lost_release_answer_counts_as_released() {
    let n = node();
    let proxies = [Proxy::start(n.addr), Proxy::start(n.addr)];
    let c = client(&[proxies[0].server(), proxies[1].server()]);
    wait_up(&c, 2);
    proxies.iter().for_each(|p| p.wait_live(1));
    let grant = c.acquire("k", LEASE, None).expect("granted");
    for p in &proxies {
        p.stall_down(true);
    }
    let release = {
        let (c, grant) = (c.clone(), grant.clone());
        thread::spawn(move || c.release(&grant))
    };
    let carrier = wait_for("the release to reach the server", DEADLINE, || {
        (0..2).find(|&i| proxies[i].count("R k ") == 1)
    });
    let direct = client(&[server(&n)]);
    wait_for("the key to be free", DEADLINE, || {
        direct.query("k").expect("query").is_free().then_some(())
    });
    proxies[1 - carrier].stall_down(false);
    proxies[carrier].cut();
    assert_eq!(
        release.join().expect("thread"),
        Ok(ReleaseOutcome::Released)
    );
    assert_eq!(
        proxies[1 - carrier].count("R k "),
        1,
        "retried on the other"
    );
}

#[test]
fn a_redirect_moves_the_client_to_the_active_node() {
    let n = node();
    let standby = FakeServer::standby(server(&n), 0);
    let c = client(&[standby.server()]);
    let grant = c
        .acquire("k", LEASE, None)
        .expect("granted by the active node");
    assert_eq!(standby.requests(), ["A k 10 0"]);
    assert_eq!(holder_of(&c, "k"), Some(grant.token()));
    assert_eq!(c.release(&grant), Ok(ReleaseOutcome::Released));
    assert_eq!(
        standby.requests().len(),
        1,
        "later requests go to the active node"
    );
    assert_eq!(c.servers(), [standby.server(), server(&n)]);
}

#[test]
fn m_dash_means_try_again_shortly() {
    let n = node();
    let standby = FakeServer::standby(server(&n), 2);
    let c = client(&[standby.server()]);
    let start = Instant::now();
    let grant = c.acquire("k", LEASE, None).expect("granted");
    assert!(start.elapsed() >= Duration::from_millis(200));
    assert_eq!(standby.requests().len(), 3);
    assert_eq!(holder_of(&c, "k"), Some(grant.token()));
}

#[test]
fn standbys_that_know_no_active_node_give_a_clear_error() {
    let standby = FakeServer::standby("nowhere:1".into(), usize::MAX);
    let c = Client::builder([standby.server()])
        .request_timeout(Duration::from_secs(1))
        .connect()
        .expect("client");
    let start = Instant::now();
    let result = c.acquire("k", LEASE, None);
    assert!(matches!(result, Err(Error::NoActive(_))), "{result:?}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn a_guard_releases_its_key_when_dropped() {
    let n = node();
    let c = client(&[server(&n)]);
    let guard = c.lock("k", LEASE, None).expect("locked");
    assert_eq!(holder_of(&c, "k"), Some(guard.token()));
    drop(guard);
    assert!(c.query("k").expect("query").is_free());

    let guard = c.lock("k", LEASE, None).expect("locked");
    let grant = guard.into_grant();
    assert_eq!(
        holder_of(&c, "k"),
        Some(grant.token()),
        "into_grant keeps it"
    );
    let guard = c.lock("k2", LEASE, None).expect("locked");
    assert_eq!(guard.release(), Ok(ReleaseOutcome::Released));
}

#[test]
fn a_grant_knows_when_its_lease_runs_out() {
    let n = node();
    let c = client(&[server(&n)]);
    let mut grant = c
        .acquire("k", Duration::from_millis(300), None)
        .expect("granted");
    assert!(grant.time_left() <= Duration::from_millis(300));
    wait_for("the lease to run out", DEADLINE, || {
        grant.is_expired().then_some(())
    });
    assert_eq!(c.keep(&mut grant, LEASE), Err(Error::Expired));
    wait_for("the server to take the key back", DEADLINE, || {
        c.query("k").expect("query").is_free().then_some(())
    });
}

#[test]
fn no_call_hangs_when_every_server_is_gone() {
    let n = node();
    let addr = server(&n);
    let c = client(std::slice::from_ref(&addr));
    let grant = c.acquire("k", LEASE, None).expect("granted");
    drop(n);
    wait_up(&c, 0);

    let start = Instant::now();
    match c.acquire("k2", LEASE, None) {
        Err(Error::NoConnection(why)) => assert!(why.contains(&addr), "{why}"),
        other => panic!("expected no connection, got {other:?}"),
    }
    assert!(c.query("k").is_err());
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );

    let start = Instant::now();
    let result = c.release(&grant);
    assert!(matches!(result, Err(Error::NoConnection(_))), "{result:?}");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(4500) && took < Duration::from_secs(8),
        "{took:?}"
    );

    let nobody = client(&[format!("127.0.0.1:{}", common::free_port())]);
    let start = Instant::now();
    match nobody.acquire("k", LEASE, None) {
        Err(Error::NoConnection(why)) => assert!(why.contains("refused"), "{why}"),
        other => panic!("expected no connection, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(3));
}

#[test]
fn a_stalled_server_costs_a_caller_no_more_than_its_deadline() {
    let n = node();
    let p = Proxy::start(n.addr);
    let c = Client::builder([p.server()])
        .request_timeout(Duration::from_millis(500))
        .connect()
        .expect("client");
    wait_up(&c, 2);
    p.wait_live(2);
    p.stall_up(true);
    p.stall_down(true);

    let start = Instant::now();
    let result = c.query("k");
    assert!(matches!(result, Err(Error::NoAnswer(_))), "{result:?}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );

    let start = Instant::now();
    let result = c.acquire("k", LEASE, None);
    assert!(
        result.as_ref().is_err_and(Error::is_unreachable),
        "{result:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn dropping_the_last_handle_closes_the_connections() {
    let n = node();
    let p = Proxy::start(n.addr);
    let c = client(&[p.server()]);
    wait_up(&c, 2);
    p.wait_live(2);
    let guard = c.lock("k", LEASE, None).expect("locked");
    drop(c);
    assert_eq!(p.live(), 2, "the guard keeps the client alive");
    drop(guard);
    p.wait_live(0);
    let direct = client(&[server(&n)]);
    assert!(
        direct.query("k").expect("query").is_free(),
        "released on drop"
    );
}

#[test]
fn a_connection_the_server_turns_away_is_left_out() {
    let n = Node::start(&["--threads", "1", "--max-conns", "1"]);
    let c = client(&[server(&n)]);
    wait_for("one connection up, one turned away", DEADLINE, || {
        let conns = c.connections();
        let turned_away = conns.iter().any(|c| {
            c.last_error
                .as_deref()
                .is_some_and(|e| e.contains("too-many-connections"))
        });
        let up = conns.iter().filter(|c| c.connected).count();
        (turned_away && up == 1).then_some(())
    });
    for _ in 0..10 {
        c.query("k")
            .expect("a query over the connection that is up");
    }
}

#[test]
fn a_grant_that_waited_longer_than_its_lease_is_not_spent_on_arrival() {
    let n = node();
    let c = client(&[server(&n)]);
    let held = c.acquire("k", LEASE, None).expect("granted");
    let lease = Duration::from_secs(1);
    let waiter = {
        let c = c.clone();
        thread::spawn(move || c.acquire("k", lease, None))
    };
    wait_for("the acquire to wait in line", DEADLINE, || {
        (c.query("k").expect("query").waiting == 1).then_some(())
    });
    thread::sleep(Duration::from_millis(1500)); // longer in line than the lease
    c.release(&held).expect("released");
    let grant = waiter.join().expect("thread").expect("granted");
    assert!(!grant.is_expired());
    assert!(grant.time_left() > Duration::from_millis(700), "{grant:?}");
    assert_eq!(holder_of(&c, "k"), Some(grant.token()));
}

#[test]
fn a_limit_of_two_grants_slots_0_and_1_and_a_freed_slot_goes_to_the_next() {
    use baton::client::AcquireOptions;
    let n = node();
    let c = client(&[server(&n)]);
    let two = AcquireOptions::new().limit(2);
    let first = c.acquire_with("pool", LEASE, None, &two).expect("slot 0");
    let second = c
        .lock_with("pool", LEASE, None, &two.clone().value("host-b"))
        .expect("slot 1");
    assert_eq!((first.slot(), second.slot()), (0, 1));
    assert!(first.token() < second.token());
    let now = Some(Duration::ZERO);
    assert_eq!(
        c.acquire_with("pool", LEASE, now, &two).map(|g| g.slot()),
        Err(Error::Timeout),
        "both slots are taken"
    );
    assert_eq!(
        c.acquire_with("pool", LEASE, now, &AcquireOptions::new().limit(3))
            .map(|g| g.slot()),
        Err(Error::Refused(Reason::LimitMismatch))
    );
    assert_eq!(
        c.acquire("pool", LEASE, now).map(|g| g.slot()),
        Err(Error::Refused(Reason::LimitMismatch)),
        "a plain acquire names limit 1"
    );
    // Slot 0 freed: the next holder takes it, with a greater token.
    assert_eq!(c.release(&first), Ok(ReleaseOutcome::Released));
    let held = c.hold_with("pool", LEASE, now, &two).expect("slot 0 again");
    assert_eq!(held.slot(), 0);
    assert!(held.token() > second.token());
    // A plain grant's slot is 0.
    assert_eq!(c.acquire("solo", LEASE, None).expect("granted").slot(), 0);
}

#[test]
fn a_bad_limit_or_value_is_refused_before_anything_is_sent() {
    use baton::client::AcquireOptions;
    // Nothing listens there: a request sent would fail otherwise.
    let c = client(&["127.0.0.1:1"]);
    for options in [
        AcquireOptions::new().limit(0),
        AcquireOptions::new().limit(10_001),
        AcquireOptions::new().value(""),
        AcquireOptions::new().value("two words"),
        AcquireOptions::new().value("v".repeat(251)),
    ] {
        let got = c.acquire_with("k", LEASE, None, &options);
        assert!(
            matches!(got, Err(Error::InvalidArgument(_))),
            "{options:?}: {got:?}"
        );
    }
    let got = c.campaign("k", "", LEASE, None);
    assert!(matches!(got, Err(Error::InvalidArgument(_))), "{got:?}");
}
