//! The client's async calls and held locks against real `batond`
//! processes: under tokio (multi-threaded and current-thread) and under a
//! bare executor written here with nothing but `std`, to show that the
//! futures need no runtime.

mod common;

use std::future::Future;
use std::time::Duration;

use baton::client::{Client, Error, ReleaseOutcome};
use common::faults::{FakeServer, Gate};
use common::{DEADLINE, Node, block_on, tokio_runtime, wait_for};

const LEASE: Duration = Duration::from_secs(10);

fn node() -> Node {
    Node::start(&["--threads", "1"])
}

fn client(node: &Node) -> Client {
    Client::connect([node.addr.to_string()]).expect("a client")
}

fn holder_of(client: &Client, key: &str) -> Option<u64> {
    client.query(key).expect("query").token
}

fn wait_free(client: &Client, key: &str) {
    wait_for("the key to be free", DEADLINE, || {
        holder_of(client, key).is_none().then_some(())
    });
}

fn assert_send<T: Send>(_: &T) {}

fn assert_static_send<T: Send + 'static>(_: &T) {}

/// Fail the test instead of hanging when a future never completes.
async fn bounded<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(DEADLINE, future)
        .await
        .expect("the future completed within the deadline")
}

#[test]
fn the_async_calls_work_end_to_end_under_tokio() {
    let n = node();
    let c = client(&n);
    tokio_runtime().block_on(async {
        // Right after connect, the connections are still being made: the
        // first call waits for one without blocking the task's thread.
        let mut grant = bounded(c.acquire_async("job", Duration::from_secs(2), None))
            .await
            .expect("granted");
        let status = bounded(c.query_async("job")).await.expect("query");
        assert_eq!((status.token, status.waiting), (Some(grant.token()), 0));

        let keep = c.keep_async(&mut grant, LEASE);
        assert_send(&keep);
        bounded(keep).await.expect("kept");
        let status = bounded(c.query_async("job")).await.expect("query");
        assert!(status.time_left > Duration::from_secs(2), "{status:?}");
        // Every async call is Send, and 'static where it owns its arguments.
        let key = String::from("job");
        assert_static_send(&c.acquire_async(key.as_str(), LEASE, None));
        assert_static_send(&c.lock_async(key.as_str(), LEASE, None));
        assert_static_send(&c.query_async(key.as_str()));
        assert_static_send(&c.release_async(&grant));
        assert_static_send(&c.hold_async(key.as_str(), LEASE, None));

        let released = bounded(c.release_async(&grant)).await;
        assert_eq!(released, Ok(ReleaseOutcome::Released));
        let again = bounded(c.release_async(&grant)).await;
        assert_eq!(again, Ok(ReleaseOutcome::NotHeld));
        assert_eq!(
            bounded(c.keep_async(&mut grant, LEASE)).await,
            Err(Error::NotHeld)
        );
        let bad = bounded(c.acquire_async("a b", LEASE, None)).await;
        assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");
    });
}

#[test]
fn a_waiting_acquire_is_woken_by_the_hand_over_and_a_wait_runs_out() {
    let n = node();
    let c = client(&n);
    let held = c.acquire("job", LEASE, None).expect("granted");
    tokio_runtime().block_on(async {
        // Spawned: the future is Send and 'static.
        let waiter = tokio::spawn(c.acquire_async("job", LEASE, None));
        let short = bounded(c.acquire_async("job", LEASE, Some(Duration::from_millis(50)))).await;
        assert_eq!(short, Err(Error::Timeout));
        wait_for("the waiter to be in line", DEADLINE, || {
            let status = c.query("job").expect("query");
            (status.waiting == 1).then_some(())
        });
        assert_eq!(c.release(&held), Ok(ReleaseOutcome::Released));
        let grant = bounded(waiter).await.expect("task").expect("handed over");
        assert!(grant.token() > held.token());
        assert_eq!(holder_of(&c, "job"), Some(grant.token()));
    });
}

#[test]
fn a_dropped_acquire_leaves_nothing_held() {
    let n = node();
    let c = client(&n);
    let held = c.acquire("job", LEASE, None).expect("granted");
    tokio_runtime().block_on(async {
        let waiter = tokio::spawn(c.acquire_async("job", LEASE, None));
        wait_for("the waiter to be in line", DEADLINE, || {
            (c.query("job").expect("query").waiting == 1).then_some(())
        });
        waiter.abort();
        assert!(bounded(waiter).await.is_err(), "cancelled");
    });
    // The request is still in line on the server; when the key reaches it,
    // the reader thread releases the grant nobody awaits.
    assert_eq!(c.release(&held), Ok(ReleaseOutcome::Released));
    wait_free(&c, "job");
}

#[test]
fn a_grant_dropped_while_it_is_being_confirmed_is_released() {
    // The grant comes after more than a third of its lease (it waited in
    // line), so the client confirms it with `K` before handing it over; the
    // fake server never answers that `K`, and the caller gives up meanwhile.
    // The grant has arrived, so nobody else would release it: the key would
    // stay blocked until its lease ran out.
    let server = FakeServer::start(|line, _| {
        if line.starts_with("A job ") {
            // Not a synchronisation: the grant must come late.
            std::thread::sleep(Duration::from_millis(200));
            Some("A 5 job".into())
        } else if line.starts_with("R job 5") {
            Some("R job".into())
        } else {
            None
        }
    });
    let c = Client::connect([server.server()]).expect("a client");
    let rt = tokio_runtime();
    let acquire = rt.spawn(c.acquire_async("job", Duration::from_millis(300), None));
    wait_for("the confirming K", DEADLINE, || {
        server
            .requests()
            .iter()
            .any(|r| r.starts_with("K job 5 "))
            .then_some(())
    });
    acquire.abort();
    assert!(rt.block_on(bounded(acquire)).is_err(), "cancelled");
    wait_for("the grant to be released", DEADLINE, || {
        server
            .requests()
            .contains(&"R job 5".to_string())
            .then_some(())
    });
}

#[test]
fn close_during_a_grants_confirming_keep_releases_it_and_fails_the_acquire() {
    // As `tests/client_rules.rs` does for the blocking call: the async
    // acquire confirming its late grant when close begins releases it
    // itself and fails `Closed`.
    let gate = std::sync::Arc::new(Gate::default());
    let server = FakeServer::confirm_gated(gate.clone());
    let c = Client::connect([server.server()]).expect("a client");
    let rt = tokio_runtime();
    let acquire = rt.spawn(c.acquire_async("job", Duration::from_millis(300), None));
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
    let acquired = rt.block_on(bounded(acquire)).expect("the acquire ran");
    assert_eq!(acquired.err(), Some(Error::Closed));
    // Received before close returned, so before the sockets closed.
    let requests = server.requests();
    assert!(requests.contains(&"R job 5".to_string()), "{requests:?}");
}

#[test]
fn an_async_guard_releases_when_dropped_without_blocking_the_task() {
    let n = node();
    let c = client(&n);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let mut guard = bounded(c.lock_async("job", LEASE, None))
            .await
            .expect("locked");
        bounded(guard.keep_async(LEASE)).await.expect("kept");
        let token = guard.token();
        assert_eq!(
            bounded(c.query_async("job")).await.expect("query").token,
            Some(token)
        );
        drop(guard);
        let guard = bounded(c.lock_async("job", LEASE, None))
            .await
            .expect("the key was released by the drop");
        assert!(guard.token() > token);
        assert_eq!(
            bounded(guard.release_async()).await,
            Ok(ReleaseOutcome::Released)
        );
    });
    wait_free(&c, "job");
}

#[test]
fn the_futures_need_no_runtime() {
    let n = node();
    let c = client(&n);
    let held = block_on(c.acquire_async("job", LEASE, None)).expect("granted");
    // A wait that runs out is woken by the client's own timer thread, a
    // redirect pause or a retry too: no runtime timer is involved.
    assert_eq!(
        block_on(c.acquire_async("job", LEASE, Some(Duration::from_millis(30)))),
        Err(Error::Timeout)
    );
    let waiter = {
        let c = c.clone();
        std::thread::spawn(move || block_on(c.acquire_async("job", LEASE, None)))
    };
    wait_for("the waiter to be in line", DEADLINE, || {
        (c.query("job").expect("query").waiting == 1).then_some(())
    });
    assert_eq!(
        block_on(c.release_async(&held)),
        Ok(ReleaseOutcome::Released)
    );
    let grant = waiter.join().expect("waiter thread").expect("handed over");
    assert_eq!(
        block_on(c.query_async("job")).expect("query").token,
        Some(grant.token())
    );
}

#[test]
fn a_held_lock_outlives_its_lease_and_is_released_when_dropped() {
    let n = node();
    let c = client(&n);
    // A lease long enough that a loaded machine's scheduling stalls (a
    // keep goes every third of it) never outlast its slack.
    let lease = Duration::from_millis(2000);
    let held = c.hold("job", lease, None).expect("held");
    let token = held.token();
    // Two and a half leases long: without the watchdog the server would
    // have taken the key back twice over.
    assert_eq!(held.wait_lost_timeout(lease * 5 / 2), None);
    assert!(!held.is_lost());
    assert_eq!(holder_of(&c, "job"), Some(token));
    drop(held);
    wait_free(&c, "job");
}

#[test]
fn a_held_lock_says_at_once_when_its_key_is_taken_away() {
    let n = node();
    let c = client(&n);
    let other = client(&n);
    let held = c
        .hold("job", Duration::from_millis(900), None)
        .expect("held");
    // Someone releases it with its token (an operator, or a bug): the next
    // renewal hears "not held".
    assert_eq!(
        other.release_token("job", held.token()),
        Ok(ReleaseOutcome::Released)
    );
    let why = held.wait_lost_timeout(DEADLINE).expect("lost");
    assert_eq!(why, Error::NotHeld);
    assert!(held.is_lost());
    tokio_runtime().block_on(async {
        assert_eq!(bounded(held.lost()).await, Error::NotHeld);
    });
    // A lost key is not asked for again.
    assert_eq!(holder_of(&other, "job"), None);
}

#[test]
fn a_held_lock_whose_server_dies_is_lost_when_its_lease_runs_out() {
    let mut n = node();
    let c = client(&n);
    let rt = tokio_runtime();
    let held = rt
        .block_on(bounded(c.hold_async(
            "job",
            Duration::from_millis(900),
            None,
        )))
        .expect("held");
    let lost = rt.spawn(held.lost());
    n.signal("KILL");
    n.wait_exit(DEADLINE);
    let why = rt.block_on(bounded(lost)).expect("task");
    assert_eq!(why, Error::Expired);
    assert!(held.is_lost());
    // Dropping a lost lock is quiet and quick.
    drop(held);
}

#[test]
fn async_acquires_with_a_limit_get_slots_0_and_1() {
    use baton::client::AcquireOptions;
    let n = node();
    let c = client(&n);
    let two = AcquireOptions::new().limit(2).value("async");
    tokio_runtime().block_on(async {
        let first = c.acquire_with_async("pool", LEASE, None, &two);
        assert_static_send(&first);
        let first = bounded(first).await.expect("slot 0");
        let second = bounded(c.lock_with_async("pool", LEASE, None, &two))
            .await
            .expect("slot 1");
        assert_eq!((first.slot(), second.slot()), (0, 1));
        let third = c.acquire_with_async("pool", LEASE, Some(Duration::from_millis(50)), &two);
        assert_eq!(bounded(third).await, Err(Error::Timeout));
        assert_eq!(
            bounded(second.release_async()).await,
            Ok(ReleaseOutcome::Released)
        );
        let held = bounded(c.hold_with_async("pool", LEASE, None, &two))
            .await
            .expect("slot 1 again");
        assert_eq!(held.slot(), 1);
        assert!(held.token() > first.token());
    });
}
