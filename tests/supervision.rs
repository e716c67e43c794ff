//! A thread of the node that ends, ends the node (src/server/supervise.rs):
//! real `batond` processes, each told by the test hook
//! `BATON_TEST_THREAD_FAULT` to make one of its threads return or panic
//! while it serves, must exit non-zero with a log line naming the thread.
//! Without the supervisor the process would go on listening and this test
//! would time out waiting for its exit.

mod common;

use common::{DEADLINE, Node, free_port, free_port_run};

/// Start a node whose thread `thread` will `fault` (return or panic), with
/// the flags that make that thread exist, and check how the process ends.
fn node_ends_when(thread: &str, fault: &str) {
    let port = free_port_run(2);
    let metrics = free_port();
    let peers = format!("127.0.0.1:{port},127.0.0.1:{}", port + 1);
    let port_arg = port.to_string();
    let metrics_arg = format!("127.0.0.1:{metrics}");
    let args = [
        "--bind",
        "127.0.0.1",
        "--port",
        &port_arg,
        "--peers",
        &peers,
        "--insecure-peers",
        "--metrics",
        &metrics_arg,
        "--threads",
        "1",
    ];
    let value = format!("{thread}:{fault}");
    let mut node = Node::start_raw_with_env(
        &args,
        Some(port),
        &[("BATON_TEST_THREAD_FAULT", value.as_str())],
    );
    let code = node.wait_exit(DEADLINE);
    let log = node.log();
    let expected = if fault == "panic" { 101 } else { 70 };
    assert_eq!(
        code,
        Some(expected),
        "{thread} {fault}: exit code; log:\n{log}"
    );
    let named = if fault == "panic" {
        format!("thread {thread} panicked")
    } else {
        format!("thread {thread} ended while the node was serving")
    };
    common::wait_for("the log line naming the thread", DEADLINE, || {
        node.log().contains(&named).then_some(())
    });
}

#[test]
fn the_node_exits_when_an_io_loop_returns_or_panics() {
    node_ends_when("baton-io-0", "return");
    node_ends_when("baton-io-0", "panic");
}

#[test]
fn the_node_exits_when_the_lock_owner_returns_or_panics() {
    node_ends_when("baton-owner", "return");
    node_ends_when("baton-owner", "panic");
}

#[test]
fn the_node_exits_when_replication_returns_or_panics() {
    node_ends_when("baton-repl", "return");
    node_ends_when("baton-repl", "panic");
}

#[test]
fn the_node_exits_when_the_metrics_thread_returns_or_panics() {
    node_ends_when("baton-metrics", "return");
    node_ends_when("baton-metrics", "panic");
}
