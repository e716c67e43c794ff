//! The rules of SPEC section 10 that every official client keeps, held to
//! by the Rust library's own suite (the conformance suite holds every
//! client to them too): a lost held key is said at once and every later
//! call on it fails `Lost`, never re-acquired silently; a grant that
//! arrives after its caller gave up is released; errors are typed and
//! distinct; a try-acquire of a key the same client already waits for in
//! line answers `Timeout`, and that waiter keeps its place; closing leaves
//! no grant behind, not even one its own release handed to its own waiter. (Nothing running after `close` is `tests/client_close.rs`,
//! alone in its process so that it can count threads.)

mod common;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use baton::client::{AcquireOptions, Client, Error, Grant, ReleaseOutcome};
use baton::protocol::Reason;
use common::faults::{FakeServer, Gate};
use common::{DEADLINE, Node, wait_for};

fn node() -> Node {
    Node::start(&["--threads", "1"])
}

fn client(node: &Node) -> Client {
    Client::connect([node.addr.to_string()]).expect("a client")
}

/// Ready now, or not: one poll.
fn poll_once<F: Future>(future: F) -> Poll<F::Output> {
    let mut future = pin!(future);
    future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn a_held_key_a_server_no_longer_holds_is_lost_at_once_and_stays_lost() {
    let n = node();
    let (owner, other) = (client(&n), client(&n));
    let held = owner
        .hold("job", Duration::from_secs(30), None)
        .expect("held");
    let lost = held.lost();
    assert!(poll_once(held.lost()).is_pending(), "not lost yet");

    // Someone frees the key behind the owner's back; the owner's next keep
    // (its own here, so as not to wait a third of the lease) finds it.
    let released = other.release_token("job", held.token());
    assert_eq!(released, Ok(ReleaseOutcome::Released));
    assert_eq!(held.keep(Duration::from_secs(30)), Err(Error::Lost));
    assert!(held.is_lost());
    assert_eq!(held.wait_lost_timeout(Duration::ZERO), Some(Error::NotHeld));
    assert_eq!(poll_once(lost), Poll::Ready(Error::NotHeld));

    // Another takes the key; the lost one never comes back.
    let theirs = other
        .acquire("job", Duration::from_secs(30), Some(Duration::ZERO))
        .expect("free for others");
    assert_eq!(held.keep(Duration::from_secs(30)), Err(Error::Lost));
    assert_eq!(held.release(), Err(Error::Lost));
    let status = other.query("job").expect("query");
    assert_eq!(status.token, Some(theirs.token()));
}

#[test]
fn a_keep_answered_not_held_loses_a_held_key_by_its_watchdog() {
    // The fake grants with a 300 ms lease and answers the watchdog's first
    // keep `E K job not-held`.
    let server = FakeServer::start(|line, _| {
        if line.starts_with("A job ") {
            Some("A 7 job".into())
        } else if line.starts_with("K job 7 ") {
            Some("E K job not-held".into())
        } else {
            None
        }
    });
    let c = Client::connect([server.server()]).expect("a client");
    let held = c
        .hold("job", Duration::from_millis(300), None)
        .expect("held");
    assert_eq!(held.wait_lost_timeout(DEADLINE), Some(Error::NotHeld));
    assert_eq!(held.keep(Duration::from_millis(300)), Err(Error::Lost));
    assert_eq!(held.release(), Err(Error::Lost));
    // One keep, no release and no acquire after it: never re-acquired.
    let requests = server.requests();
    let after: Vec<&String> = requests
        .iter()
        .skip_while(|r| !r.starts_with("K job 7 "))
        .collect();
    assert_eq!(after.len(), 1, "{requests:?}");
    assert_eq!(requests.iter().filter(|r| r.starts_with("A ")).count(), 1);
}

#[test]
fn a_held_key_whose_keeps_go_unanswered_is_lost_when_its_lease_runs_out() {
    let server = FakeServer::start(|line, _| line.starts_with("A job ").then(|| "A 9 job".into()));
    let c = Client::connect([server.server()]).expect("a client");
    let held = c
        .hold("job", Duration::from_millis(600), None)
        .expect("held");
    assert_eq!(held.wait_lost_timeout(DEADLINE), Some(Error::Expired));
    // Said once the lease ran out by the client's clock (not before).
    assert!(std::time::Instant::now() >= held.expires_at());
    assert_eq!(held.release(), Err(Error::Lost));
}

#[test]
fn an_async_acquire_given_up_on_its_own_timeout_releases_the_grant_that_comes_later() {
    let n = node();
    let c = client(&n);
    let holder = c
        .acquire("job", Duration::from_secs(30), None)
        .expect("granted");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    rt.block_on(async {
        // The caller's own timeout, shorter than the wait it asked for.
        let wait = Some(Duration::from_secs(20));
        let given_up = tokio::time::timeout(
            Duration::from_millis(200),
            c.acquire_async("job", Duration::from_secs(30), wait),
        )
        .await;
        assert!(given_up.is_err(), "timed out: {given_up:?}");
    });
    // The acquire is still in line on the node; when the key reaches it,
    // the grant is released at once, not left for its lease.
    assert_eq!(c.query("job").expect("query").waiting, 1);
    assert_eq!(c.release(&holder), Ok(ReleaseOutcome::Released));
    wait_for("the late grant to be released", DEADLINE, || {
        let status = c.query("job").expect("query");
        (status.token.is_none() && status.waiting == 0).then_some(())
    });
}

/// Closing a client releases its held keys, and a release of a key this
/// same client waits for hands the key to its own waiter on another
/// connection: that grant comes after its caller gave up (closing ends
/// every call) and must be released too, before the sockets close, not
/// left held for its lease (it was, about one close in four). Right after
/// `close` returns, the key is free, every time.
#[test]
fn close_leaves_no_grant_its_own_release_handed_to_its_own_waiter() {
    let n = node();
    let mut line = n.client();
    for i in 0..20 {
        let key = format!("handed-{i}");
        let c = client(&n);
        let _held = c.hold(&key, Duration::from_secs(60), None).expect("held");
        let waiter = {
            let c = c.clone();
            let key = key.clone();
            std::thread::spawn(move || c.acquire(&key, Duration::from_secs(60), None))
        };
        wait_for("the waiter in line", DEADLINE, || {
            (c.query(&key).expect("query").waiting == 1).then_some(())
        });
        c.close();
        assert_eq!(
            waiter.join().expect("the waiter").err(),
            Some(Error::Closed)
        );
        line.send(&format!("Q {key}"));
        assert_eq!(line.recv(), format!("Q {key} 0 0 0"), "close {i}");
    }
}

/// A grant that came after more than a third of its lease is confirmed
/// with `K` before the acquire returns it; a close that begins while that
/// `K` is out ends the call: the call releases the grant itself, on a
/// connection close keeps open for it, and fails `Closed` — it does not
/// hand a grant to its caller on a closed client that can no longer
/// release it, the key held for its lease.
#[test]
fn close_during_a_grants_confirming_keep_releases_it_and_fails_the_acquire() {
    let gate = Arc::new(Gate::default());
    let server = FakeServer::confirm_gated(gate.clone());
    let c = Client::connect([server.server()]).expect("a client");
    let acquire = {
        let c = c.clone();
        std::thread::spawn(move || c.acquire("job", Duration::from_millis(300), None))
    };
    wait_for("the confirming K", DEADLINE, || {
        let requests = server.requests();
        requests
            .iter()
            .any(|r| r.starts_with("K job 5 "))
            .then_some(())
    });
    let closer = {
        let c = c.clone();
        std::thread::spawn(move || c.close())
    };
    wait_for("close to begin", DEADLINE, || c.is_closed().then_some(()));
    gate.open();
    closer.join().expect("close returned");
    assert_eq!(
        acquire.join().expect("the acquire").err(),
        Some(Error::Closed)
    );
    // Received before close returned, so before the sockets closed.
    let requests = server.requests();
    assert!(requests.contains(&"R job 5".to_string()), "{requests:?}");
}

/// `c` asks for `key` without a wait limit on its own thread; the grant
/// comes on `granted`, tagged `name`, once `waiting` are in line on `node`.
fn wait_in_line(
    c: &Client,
    key: &'static str,
    name: &'static str,
    granted: &mpsc::Sender<(&'static str, Grant)>,
    watcher: &Client,
    waiting: u64,
) {
    let (c, granted) = (c.clone(), granted.clone());
    std::thread::spawn(move || {
        let grant = c.acquire(key, Duration::from_secs(30), None);
        let _ = granted.send((name, grant.expect("granted in turn")));
    });
    wait_for("the acquire to wait in line", DEADLINE, || {
        (watcher.query(key).expect("query").waiting == waiting).then_some(())
    });
}

/// The next grant to come, and whose it is.
fn next_grant(granted: &mpsc::Receiver<(&'static str, Grant)>) -> (&'static str, Grant) {
    granted.recv_timeout(DEADLINE).expect("a grant")
}

#[test]
fn a_try_acquire_behind_the_clients_own_waiter_times_out_and_the_waiter_keeps_its_place() {
    let n = node();
    let (c, other) = (client(&n), client(&n));
    let holder = other
        .acquire("own", Duration::from_secs(30), None)
        .expect("granted");
    let (granted, grants) = mpsc::channel();
    wait_in_line(&c, "own", "first", &granted, &other, 1);
    // Two in a row: round-robin alone would put one of them behind the
    // waiter, where the server holds its T back until the waiter is
    // answered (and the connection, deemed dead, would be closed).
    for _ in 0..2 {
        let tried = c.acquire("own", Duration::from_secs(30), Some(Duration::ZERO));
        assert_eq!(tried, Err(Error::Timeout));
    }
    wait_in_line(&other, "own", "second", &granted, &other, 2);
    assert_eq!(other.release(&holder), Ok(ReleaseOutcome::Released));
    let (first, grant) = next_grant(&grants);
    assert_eq!(first, "first");
    assert!(grant.token() > holder.token());
    assert_eq!(c.release(&grant), Ok(ReleaseOutcome::Released));
    let (second, grant) = next_grant(&grants);
    assert_eq!(second, "second");
    assert_eq!(other.release(&grant), Ok(ReleaseOutcome::Released));
}

#[test]
fn a_try_acquire_held_back_on_every_connection_times_out_without_closing_one() {
    let n = node();
    // A short request timeout: the try-acquire's answer is due within it
    // (plus its wait), by which time the server still holds it back.
    let c = Client::builder([n.addr.to_string()])
        .request_timeout(Duration::from_millis(300))
        .connect()
        .expect("a client");
    let other = client(&n);
    let holder = other
        .acquire("full", Duration::from_secs(30), None)
        .expect("granted");
    let (granted, grants) = mpsc::channel();
    // One waiter of `c` on each of its two connections, then another
    // client's behind them.
    wait_in_line(&c, "full", "first", &granted, &other, 1);
    wait_in_line(&c, "full", "second", &granted, &other, 2);
    wait_in_line(&other, "full", "third", &granted, &other, 3);
    let tried = c.acquire("full", Duration::from_secs(30), Some(Duration::ZERO));
    assert_eq!(tried, Err(Error::Timeout));
    assert!(c.connections().iter().all(|s| s.connected));
    // Had a connection been closed, its waiter would have been sent again,
    // behind the third.
    let mut last = holder.clone();
    assert_eq!(other.release(&holder), Ok(ReleaseOutcome::Released));
    for want in ["first", "second", "third"] {
        let (name, grant) = next_grant(&grants);
        assert_eq!(name, want);
        assert!(grant.token() > last.token());
        assert_eq!(other.release(&grant), Ok(ReleaseOutcome::Released));
        last = grant;
    }
}

#[test]
fn errors_are_typed_and_distinct() {
    let n = node();
    let c = client(&n);
    let _held = c
        .acquire("busy", Duration::from_secs(30), None)
        .expect("granted");
    // Timed out: T.
    let timeout = c.acquire("busy", Duration::from_secs(30), Some(Duration::ZERO));
    assert_eq!(timeout, Err(Error::Timeout));
    // Refused, with the reason word.
    let two = AcquireOptions::new().limit(2);
    let refused = c.acquire_with("busy", Duration::from_secs(30), None, &two);
    assert_eq!(refused, Err(Error::Refused(Reason::LimitMismatch)));
    assert_eq!(Reason::LimitMismatch.to_string(), "limit-mismatch");
    // Bad argument: refused before anything is sent.
    let bad = c.acquire("a key", Duration::from_secs(30), None);
    assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");
    let bad = c.acquire("k", Duration::ZERO, None);
    assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");
    // Unavailable: no node answered.
    let port = common::free_port();
    let nobody = Client::connect([format!("127.0.0.1:{port}")]).expect("a client");
    let unavailable = nobody.query("k").expect_err("nobody listens");
    assert!(unavailable.is_unreachable(), "{unavailable:?}");
    // Closed.
    nobody.close();
    assert_eq!(nobody.query("k"), Err(Error::Closed));
    // Lost: see the tests above. Each kind is its own variant.
    let kinds = [
        Error::Timeout,
        Error::Refused(Reason::LimitMismatch),
        unavailable,
        Error::Lost,
        Error::Closed,
        Error::InvalidArgument(String::new()),
    ];
    for (i, a) in kinds.iter().enumerate() {
        for b in &kinds[i + 1..] {
            assert_ne!(std::mem::discriminant(a), std::mem::discriminant(b));
        }
    }
}

#[test]
fn a_refused_secret_carries_the_servers_reason() {
    let answered = Arc::new(AtomicUsize::new(0));
    let server = {
        let answered = answered.clone();
        FakeServer::start(move |line, _| {
            answered.fetch_add(1, Ordering::SeqCst);
            Some(match line.starts_with("U ") {
                true => "E - - bad-auth".into(),
                false => "E - - auth-required".into(),
            })
        })
    };
    let wrong = Client::builder([server.server()])
        .auth("a-wrong-secret-of-16+")
        .connect()
        .expect("a client");
    match wrong.query("k") {
        Err(Error::Auth(refused)) => {
            assert_eq!(refused.reason(), Reason::BadAuth);
            assert_eq!(refused.reason().to_string(), "bad-auth");
        }
        other => panic!("refused: {other:?}"),
    }
    wrong.close();
    let none = Client::connect([server.server()]).expect("a client");
    match none.query("k") {
        Err(Error::Auth(refused)) => assert_eq!(refused.reason(), Reason::AuthRequired),
        other => panic!("refused: {other:?}"),
    }
    assert!(answered.load(Ordering::SeqCst) > 0);
}
