//! `Client::close` (SPEC section 10): held keys are released once and not
//! reported lost, watches and calls under way end with `Closed`, every
//! later call fails `Closed`, and no thread of the client runs after it.
//! Alone in its test binary, since it counts the process's threads by name.

mod common;

use std::future::Future;
use std::time::Duration;

use baton::client::{Client, Error};
use common::{DEADLINE, Node, wait_for};

/// The names of this process's threads that are the client's (`baton-*`).
fn client_threads() -> Vec<String> {
    let mut names = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let comm = task.expect("a task").path().join("comm");
        if let Ok(name) = std::fs::read_to_string(comm)
            && name.starts_with("baton-")
        {
            names.push(name.trim_end().to_string());
        }
    }
    names
}

#[test]
fn close_releases_held_keys_ends_every_call_and_leaves_no_thread_running() {
    let n = Node::start(&["--threads", "1"]);
    let c = Client::connect([n.addr.to_string()]).expect("a client");
    let held = c.hold("held", Duration::from_secs(30), None).expect("held");
    let lost = held.lost();
    let mut watch = c.watch("held").expect("a watch");
    assert!(
        watch
            .next_timeout(Some(DEADLINE))
            .expect("a state")
            .is_some()
    );
    // A call under way: an acquire waiting in line without limit, for a
    // key this client holds with a plain grant (which close leaves alone:
    // the caller owns it).
    let busy = c
        .acquire("busy", Duration::from_secs(30), None)
        .expect("granted");
    let waiter = {
        let c = c.clone();
        std::thread::spawn(move || c.acquire("busy", Duration::from_secs(30), None))
    };
    wait_for("the waiter to be in line", DEADLINE, || {
        (c.query("busy").expect("query").waiting == 1).then_some(())
    });
    // An async call, so that the timer thread runs too.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let timed_out = rt.block_on(c.acquire_async(
        "held",
        Duration::from_secs(30),
        Some(Duration::from_millis(50)),
    ));
    assert_eq!(timed_out.err(), Some(Error::Timeout));
    assert!(client_threads().iter().any(|t| t.starts_with("baton-hold")));
    assert!(
        client_threads()
            .iter()
            .any(|t| t.starts_with("baton-timer"))
    );

    c.close();

    let running = client_threads();
    assert!(running.is_empty(), "still running after close: {running:?}");
    assert_eq!(waiter.join().expect("the waiter"), Err(Error::Closed));
    assert_eq!(watch.next_timeout(Some(DEADLINE)), Err(Error::Closed));
    assert_eq!(held.keep(Duration::from_secs(30)), Err(Error::Closed));
    assert_eq!(held.release(), Err(Error::Closed));
    assert_eq!(c.query("held"), Err(Error::Closed));
    assert!(c.watch("held").is_err());
    assert_eq!(c.release(&busy), Err(Error::Closed));
    let asked = rt.block_on(c.query_async("held"));
    assert_eq!(asked, Err(Error::Closed));
    // Released, and not reported lost; the waiter left the line.
    let mut line = n.client();
    line.send("Q held");
    assert_eq!(line.recv(), "Q held 0 0 0");
    wait_for("the waiter to leave the line", DEADLINE, || {
        line.send("Q busy");
        let status = line.recv();
        let fields: Vec<&str> = status.split(' ').collect();
        (fields[2] == busy.token().to_string() && fields[4] == "0").then_some(())
    });
    let lost = std::pin::pin!(lost);
    let polled = lost.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
    assert!(polled.is_pending(), "a key released by close is not lost");
    // Closing again is harmless.
    c.close();
}
