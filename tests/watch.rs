//! Watches on real `batond` processes over TCP: `W <key>` answered with the
//! key's state and then one line per change of its holders (grant,
//! handoff, release, expiry), `X <key>`, `--max-watches`, a standby's `M`,
//! the end of the watches when the active hands over or the node stops, a
//! slow watcher's bounded memory, and one change reaching 10,000 watchers.
//!
//! Every node is started on loopback and killed by PID when dropped; every
//! wait is bounded by a deadline.

mod common;

use std::time::{Duration, Instant};

use common::nodes::Nodes;
use common::{DEADLINE, LineClient, Node, raise_fd_limit, token_of};

/// How long a test waits to be sure no line comes.
const QUIET: Duration = Duration::from_millis(300);

/// The fields of a `W <key> <token> <holders> <waiting> <value>` line.
fn watch_line(line: &str, key: &str) -> (u64, u64, u64, String) {
    let fields: Vec<&str> = line.split(' ').collect();
    assert!(
        fields.len() == 6 && fields[0] == "W" && fields[1] == key,
        "expected a W line for {key}, got {line:?}"
    );
    let n = |s: &str| -> u64 { s.parse().unwrap_or_else(|_| panic!("{line:?}")) };
    (
        n(fields[2]),
        n(fields[3]),
        n(fields[4]),
        fields[5].to_owned(),
    )
}

#[test]
fn a_watch_answers_the_state_then_one_line_per_change_in_order() {
    let node = Node::start(&[]);
    let mut watcher = node.client();
    assert_eq!(watcher.ask("W k"), "W k 0 0 0 -", "an unregistered key");
    let mut a = node.client();
    let mut b = node.client();
    // A grant.
    let t1 = a.acquire_now("k", "30");
    assert_eq!(watcher.recv(), format!("W k {t1} 1 0 -"));
    // Waiters change no holder: no line.
    let mut d = node.client();
    b.send("A k 30 0");
    // b is in line before d asks (two connections, maybe two I/O loops:
    // without the wait, d could be first in line).
    common::wait_for("b in line", DEADLINE, || {
        (a.query("k").waiting == 1).then_some(())
    });
    d.send("A k 30 0");
    common::wait_for("d in line", DEADLINE, || {
        (a.query("k").waiting == 2).then_some(())
    });
    watcher.assert_silent_for(QUIET);
    // A handoff is one change: the next waiter's token, one still waiting.
    assert_eq!(a.ask(&format!("R k {t1}")), "R k");
    let t2 = token_of(&b.recv());
    assert!(t2 > t1);
    assert_eq!(watcher.recv(), format!("W k {t2} 1 1 -"));
    assert_eq!(b.ask(&format!("R k {t2}")), "R k");
    let t3 = token_of(&d.recv());
    assert_eq!(watcher.recv(), format!("W k {t3} 1 0 -"));
    // A release with nobody waiting.
    assert_eq!(d.ask(&format!("R k {t3}")), "R k");
    assert_eq!(watcher.recv(), "W k 0 0 0 -");
    watcher.assert_silent_for(QUIET);
}

#[test]
fn an_expiry_produces_a_line_on_time() {
    let node = Node::start(&[]);
    let mut watcher = node.client();
    let mut a = node.client();
    assert_eq!(watcher.ask("W lease"), "W lease 0 0 0 -");
    // Timed from before the acquire is sent: the lease starts after that,
    // however late this thread reads the grant.
    let sent = Instant::now();
    let token = a.acquire_now("lease", "0.3");
    assert_eq!(watcher.recv(), format!("W lease {token} 1 0 -"));
    assert_eq!(watcher.recv(), "W lease 0 0 0 -");
    assert!(
        sent.elapsed() >= Duration::from_millis(300),
        "the expiry line came before the lease ran out"
    );
}

#[test]
fn a_second_watch_answers_again_without_doubling_and_x_stops_the_lines() {
    let node = Node::start(&[]);
    let mut watcher = node.client();
    let mut a = node.client();
    assert_eq!(watcher.ask("W k"), "W k 0 0 0 -");
    assert_eq!(watcher.ask("W k"), "W k 0 0 0 -");
    let t1 = a.acquire_now("k", "30");
    assert_eq!(watcher.recv(), format!("W k {t1} 1 0 -"));
    watcher.assert_silent_for(QUIET);
    // X: its answer, and nothing after it.
    assert_eq!(watcher.ask("X k"), "X k");
    assert_eq!(a.ask(&format!("R k {t1}")), "R k");
    a.acquire_now("k", "30");
    watcher.assert_silent_for(QUIET);
    // X of a key not watched.
    assert_eq!(watcher.ask("X never"), "X never");
    // Pipelined W then X: the W's answer, then the X's, and nothing more.
    watcher.send_raw(b"W p\nX p\n");
    assert_eq!(watcher.recv(), "W p 0 0 0 -");
    assert_eq!(watcher.recv(), "X p");
    a.acquire_now("p", "30");
    watcher.assert_silent_for(QUIET);
}

#[test]
fn past_max_watches_a_watch_is_refused_and_the_connection_stays() {
    let node = Node::start(&["--max-watches", "2"]);
    let mut c = node.client();
    assert_eq!(c.ask("W a"), "W a 0 0 0 -");
    assert_eq!(c.ask("W b"), "W b 0 0 0 -");
    assert_eq!(c.ask("W c"), "E W c too-many-watches");
    // Watching a key again subscribes nothing more: not refused.
    assert_eq!(c.ask("W a"), "W a 0 0 0 -");
    assert_eq!(c.ask("X b"), "X b");
    assert_eq!(c.ask("W c"), "W c 0 0 0 -");
    // Another connection has its own allowance.
    assert_eq!(node.client().ask("W d"), "W d 0 0 0 -");
}

/// Two nodes, node 0 active.
fn pair() -> Nodes {
    let mut nodes = Nodes::on_free_ports(2);
    let flags = [
        "--cluster-key-file",
        common::cluster_key_file(),
        "--detect",
        "0.5",
    ];
    nodes.start_with(0, &flags, &[]);
    nodes.start_with(1, &flags, &[]);
    nodes.wait_serving(0);
    nodes.wait_standby_of(1, 0);
    nodes
}

#[test]
fn a_standby_redirects_a_watch_and_a_hand_over_ends_the_watches_with_m() {
    let mut nodes = pair();
    let mut on_standby = nodes.client(1);
    assert_eq!(
        on_standby.ask("W k"),
        format!("M {} W k", nodes.name(0)),
        "a standby answers W like any keyed request"
    );
    let mut watcher = nodes.client(0);
    assert_eq!(watcher.ask("W k"), "W k 0 0 0 -");
    assert_eq!(watcher.ask("W j"), "W j 0 0 0 -");
    // SIGTERM: node 0 hands the role to node 1, and every watch ends with M.
    nodes.node(0).signal("TERM");
    let mut ends = vec![watcher.recv(), watcher.recv()];
    ends.sort();
    let to = nodes.name(1);
    assert_eq!(ends, [format!("M {to} W j"), format!("M {to} W k")]);
    assert_eq!(nodes.wait_exited(0), Some(0));
    // The client watches again on the new active.
    nodes.wait_serving(1);
    assert_eq!(nodes.client(1).ask("W k"), "W k 0 0 0 -");
}

#[test]
fn a_stopping_node_ends_its_watches() {
    let mut node = Node::start(&[]);
    let mut watcher = node.client();
    assert_eq!(watcher.ask("W k"), "W k 0 0 0 -");
    node.signal("TERM");
    let (lines, _) = watcher.rest_until_closed(DEADLINE);
    assert_eq!(
        lines,
        ["M - W k"],
        "the watch ends with M - and the connection"
    );
    assert_eq!(node.wait_exit(DEADLINE), Some(0));
}

#[test]
fn a_watcher_that_never_reads_costs_bounded_memory_and_ends_on_the_latest_state() {
    let node = Node::start(&[]);
    let mut slow = node.client();
    assert_eq!(slow.ask("W hot"), "W hot 0 0 0 -");
    let before = node.rss_kib();
    // 200,000 changes (100,000 grants and releases) while the watcher
    // reads nothing: far more lines than its socket buffers hold. Each
    // grant and each release of a semaphore's holder is a change, so the
    // client pipelines them a thousand at a time (limit 1000).
    let mut c = node.client();
    let rounds = 100_000;
    let batch = 1_000;
    let acquires = "A hot 30 0 1000\n".repeat(batch);
    for b in 0..rounds / batch {
        c.send_raw(acquires.as_bytes());
        let tokens: Vec<u64> = (0..batch).map(|_| token_of(&c.recv())).collect();
        let releases: String = tokens.iter().map(|t| format!("R hot {t}\n")).collect();
        c.send_raw(releases.as_bytes());
        for _ in 0..batch {
            assert_eq!(c.recv(), "R hot", "batch {b}");
        }
    }
    let grown = node.rss_kib().saturating_sub(before);
    assert!(
        grown < 50 * 1024,
        "the node grew {grown} KiB for a watcher that does not read"
    );
    // The last state: free, after the last release.
    let lines_read = {
        let mut n = 0;
        let mut last_line = String::new();
        while let Some(line) = slow.try_recv(QUIET) {
            last_line = line;
            n += 1;
        }
        (n, last_line)
    };
    assert!(lines_read.0 < 2 * rounds, "some lines were skipped");
    assert_eq!(lines_read.1, "W hot 0 0 0 -", "ends on the latest state");
    // And the watch still works.
    let token = c.acquire_now("hot", "30");
    let line = slow.recv();
    assert_eq!(watch_line(&line, "hot"), (token, 1, 0, "-".to_owned()));
}

#[test]
fn one_change_reaches_ten_thousand_watchers() {
    const WATCHERS: usize = 10_000;
    let limit = raise_fd_limit();
    assert!(
        limit as usize > WATCHERS + 512,
        "the open-file limit ({limit}) is below {WATCHERS} connections"
    );
    let node = Node::start(&["--max-conns", "12000"]);
    let mut watchers: Vec<LineClient> = (0..WATCHERS).map(|_| node.client()).collect();
    for w in &mut watchers {
        w.send("W fan");
    }
    for w in &mut watchers {
        assert_eq!(w.recv(), "W fan 0 0 0 -");
    }
    let token = node.client().acquire_now("fan", "30");
    let start = Instant::now();
    for (i, w) in watchers.iter_mut().enumerate() {
        let line = w.recv();
        assert_eq!(line, format!("W fan {token} 1 0 -"), "watcher {i}");
    }
    println!(
        "{WATCHERS} watchers got the change in {:?}",
        start.elapsed()
    );
}

#[test]
fn a_semaphores_watch_shows_its_newest_grant_its_value_and_every_holder() {
    let node = Node::start(&[]);
    let mut watcher = node.client();
    assert_eq!(watcher.ask("W sem"), "W sem 0 0 0 -");
    let mut a = node.client();
    let first = a.ask("A sem 30 0 2 10.0.0.1:80");
    let t1 = token_of(&first);
    assert_eq!(watcher.recv(), format!("W sem {t1} 1 0 10.0.0.1:80"));
    let t2 = token_of(&a.ask("A sem 30 0 2 10.0.0.2:80"));
    assert_eq!(watcher.recv(), format!("W sem {t2} 2 0 10.0.0.2:80"));
    // The newest leaves: the largest token holding is the older grant.
    assert_eq!(a.ask(&format!("R sem {t2}")), "R sem");
    assert_eq!(watcher.recv(), format!("W sem {t1} 1 0 10.0.0.1:80"));
    // A grant without a value shows `-`.
    let t3 = token_of(&a.ask("A sem 30 0 2"));
    assert_eq!(watcher.recv(), format!("W sem {t3} 2 0 -"));
}
