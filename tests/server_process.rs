//! Real-process tests of `batond` as a program (docs/fencing.md, docs/running.md):
//! its flags, its exit on SIGTERM (waiters told `M -` first), and fencing
//! tokens across a restart.

mod common;

use std::io::Write;
use std::time::Duration;

use common::{DEADLINE, Node, batond_path, info_field, run_to_exit, token_of};

#[test]
fn help_lists_every_flag_and_exits_0() {
    for flag in ["--help", "-h"] {
        let run = run_to_exit(batond_path(), &[flag], DEADLINE);
        assert_eq!(run.code, Some(0), "batond {flag}: {run:?}");
        let every = baton::server::config::FLAGS.iter().chain([&"--help"]);
        for name in every {
            assert!(run.stdout.contains(name), "--help lists {name}: {run:?}");
        }
    }
}

#[test]
fn a_cluster_node_without_a_cluster_key_refuses_to_start_with_exit_2() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let short = dir.join(format!("short-{}.key", std::process::id()));
    std::fs::write(&short, "only sixteen byt\n").expect("write");
    let short = short.to_string_lossy().into_owned();
    let peers = ["--peers", "127.0.0.1:1,127.0.0.1:2", "--port", "1"];
    let cases: [(&[&str], &str); 3] = [
        (&[], "--cluster-key-file"),
        (&["--cluster-key-file", &short], "at least 32"),
        (
            &["--cluster-key-file", "/nonexistent/baton.key"],
            "cannot open",
        ),
    ];
    for (extra, says) in cases {
        let mut args = vec!["--bind", "127.0.0.1"];
        args.extend_from_slice(&peers);
        args.extend_from_slice(extra);
        let run = run_to_exit(batond_path(), &args, DEADLINE);
        assert_eq!(run.code, Some(2), "batond {args:?}: {run:?}");
        let lines: Vec<&str> = run.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line for {args:?}: {run:?}");
        assert!(
            lines[0].starts_with("batond: --"),
            "names the flag: {run:?}"
        );
        assert!(lines[0].contains(says), "{run:?}");
    }
    let _ = std::fs::remove_file(&short);
}

/// Every file a flag names is checked at start, also one a node without
/// --peers will not use (docs/running.md).
#[test]
fn a_single_node_with_an_unusable_cluster_key_file_exits_2() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let short = dir.join(format!("single-short-{}.key", std::process::id()));
    std::fs::write(&short, "only sixteen byt\n").expect("write");
    let short = short.to_string_lossy().into_owned();
    for (file, says) in [
        ("/nonexistent/baton.key", "cannot open"),
        (short.as_str(), "at least 32"),
    ] {
        let args = [
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
            "--cluster-key-file",
            file,
        ];
        let run = run_to_exit(batond_path(), &args, DEADLINE);
        assert_eq!(run.code, Some(2), "{run:?}");
        assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
        assert!(
            run.stderr.starts_with("batond: --cluster-key-file") && run.stderr.contains(says),
            "{run:?}"
        );
    }
    let _ = std::fs::remove_file(&short);
}

/// A node without --peers warns, once, about each cluster flag it was given
/// and does not use, then serves.
#[test]
fn a_single_node_warns_about_each_cluster_flag_it_does_not_use() {
    let node = Node::start(&[
        "--insecure-peers",
        "--detect",
        "2",
        "--promotion-grace",
        "1",
    ]);
    let mut client = node.client();
    assert!(client.info().starts_with("I role=active"));
    let flags = ["--insecure-peers", "--detect", "--promotion-grace"];
    let log = common::wait_for("the warnings", DEADLINE, || {
        let log = node.log();
        flags
            .iter()
            .all(|flag| log.contains(&format!("{flag} is not used")))
            .then_some(log)
    });
    for flag in flags {
        let warning = format!("{flag} is not used without --peers");
        assert_eq!(log.matches(&warning).count(), 1, "{warning}: {log}");
    }
    let key = common::cluster_key_file();
    let node = Node::start(&["--cluster-key-file", key]);
    common::wait_for("the key file warning", DEADLINE, || {
        node.log()
            .contains("--cluster-key-file is not used without --peers")
            .then_some(())
    });
}

#[test]
fn a_bad_flag_exits_non_zero_with_a_one_line_error() {
    // Each run also names a loopback address and port 0, so that a flag
    // parser that wrongly accepted the bad flag would not listen elsewhere.
    let cases: [&[&str]; 7] = [
        &["--bogus"],
        &["--port", "notaport"],
        &["--threads", "0"],
        &["--max-lease", "0"],
        &["--max-conns", "-3"],
        &["--peers", "nohostport"],
        &["stray-argument"],
    ];
    for bad in cases {
        let mut args = vec!["--bind", "127.0.0.1", "--port", "0"];
        if bad[0] == "--port" {
            args.truncate(2);
        }
        args.extend_from_slice(bad);
        let run = run_to_exit(batond_path(), &args, DEADLINE);
        assert!(
            matches!(run.code, Some(code) if code != 0),
            "batond {args:?} must fail: {run:?}"
        );
        let lines: Vec<&str> = run.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line of error for {args:?}: {run:?}");
        assert!(lines[0].starts_with("batond: "), "{run:?}");
        assert!(run.stdout.is_empty(), "{run:?}");
    }
}

#[test]
fn a_bad_number_names_the_flag_and_the_range_and_exits_2() {
    let run = run_to_exit(
        batond_path(),
        &["--bind", "127.0.0.1", "--port", "abc"],
        DEADLINE,
    );
    assert_eq!(run.code, Some(2), "{run:?}");
    assert_eq!(
        run.stderr, "batond: --port: expected a port number 0-65535, got 'abc'\n",
        "{run:?}"
    );
    let run = run_to_exit(
        batond_path(),
        &[
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
            "--busy-poll-us",
            "99999",
        ],
        DEADLINE,
    );
    assert_eq!(run.code, Some(2), "{run:?}");
    assert_eq!(
        run.stderr, "batond: --busy-poll-us: expected microseconds 0-10000, got '99999'\n",
        "{run:?}"
    );
}

#[test]
fn a_flag_given_twice_is_one_line_naming_it_and_exit_2() {
    for (args, flag) in [
        (&["--port", "0", "--port", "0"][..], "--port"),
        (
            &["--port", "0", "--threads", "1", "--threads", "2"][..],
            "--threads",
        ),
        (&["--port", "0", "--echo", "--echo"][..], "--echo"),
    ] {
        let mut all = vec!["--bind", "127.0.0.1"];
        all.extend_from_slice(args);
        let run = run_to_exit(batond_path(), &all, DEADLINE);
        assert_eq!(run.code, Some(2), "batond {all:?}: {run:?}");
        assert_eq!(
            run.stderr,
            format!("batond: {flag}: given more than once; give it once\n"),
            "{run:?}"
        );
    }
}

/// A number of seconds too large for any arithmetic is out of range like
/// any other: the message gives the range.
#[test]
fn a_huge_number_of_seconds_names_the_range_and_exits_2() {
    for (flag, range) in [
        ("--max-lease", "seconds above 0 and at most 31536000"),
        ("--detect", "seconds 0.02-3600"),
        ("--promotion-grace", "seconds 0-31536000"),
    ] {
        let huge = "99999999999999999999";
        let args = ["--bind", "127.0.0.1", "--port", "0", flag, huge];
        let run = run_to_exit(batond_path(), &args, DEADLINE);
        assert_eq!(run.code, Some(2), "{run:?}");
        assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
        assert!(
            run.stderr
                .starts_with(&format!("batond: {flag}: expected {range}"))
                && run.stderr.ends_with(&format!("got '{huge}'\n")),
            "{run:?}"
        );
    }
}

/// A port or address the node cannot listen on is a flag it cannot use:
/// exit 2, one line naming the flag, the address and the system's reason.
#[test]
fn a_port_in_use_or_an_address_not_here_exits_2_naming_the_flag() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port().to_string();
    let run = run_to_exit(
        batond_path(),
        &["--bind", "127.0.0.1", "--port", &port],
        DEADLINE,
    );
    assert_eq!(run.code, Some(2), "{run:?}");
    assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
    let says = format!("batond: --port: cannot listen on 127.0.0.1:{port}: ");
    assert!(
        run.stderr.starts_with(&says) && run.stderr.contains("in use"),
        "{run:?}"
    );
    let metrics = format!("127.0.0.1:{port}");
    let args = ["--bind", "127.0.0.1", "--port", "0", "--metrics", &metrics];
    let run = run_to_exit(batond_path(), &args, DEADLINE);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
    let says = format!("batond: --metrics: cannot listen on {metrics}: ");
    assert!(
        run.stderr.starts_with(&says) && run.stderr.contains("in use"),
        "{run:?}"
    );
    drop(taken);
    // 192.0.2.1 is a documentation address (RFC 5737), on no machine: the
    // bind fails before anything listens. Skipped if this one has it.
    if std::net::TcpListener::bind("192.0.2.1:0").is_err() {
        let run = run_to_exit(
            batond_path(),
            &["--bind", "192.0.2.1", "--port", "0"],
            DEADLINE,
        );
        assert_eq!(run.code, Some(2), "{run:?}");
        assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
        assert!(
            run.stderr
                .starts_with("batond: --bind: cannot listen on 192.0.2.1:0: "),
            "{run:?}"
        );
    }
}

#[test]
fn version_prints_the_crate_version_and_exits_0() {
    for flag in ["--version", "-V"] {
        let run = run_to_exit(batond_path(), &[flag], DEADLINE);
        assert_eq!(run.code, Some(0), "batond {flag}: {run:?}");
        assert_eq!(
            run.stdout,
            format!("batond {}\n", env!("CARGO_PKG_VERSION")),
            "{run:?}"
        );
    }
}

#[test]
fn sigterm_makes_the_node_exit_0_promptly() {
    let mut node = Node::start(&[]);
    let mut holder = node.client();
    let mut waiter = node.client();
    holder.acquire_now("k", "30");
    waiter.send("A k 30 0");
    let mut probe = node.client();
    common::wait_for("the waiter to queue", DEADLINE, || {
        (probe.query("k").waiting == 1).then_some(())
    });
    node.signal("TERM");
    assert_eq!(node.wait_exit(DEADLINE), Some(0), "log:\n{}", node.log());
    // The waiter hears that no node is active (as from a cluster's last
    // node), then the connection ends.
    assert_eq!(waiter.recv_within(DEADLINE), "M - A k");
    assert!(waiter.closed_within(DEADLINE), "then the connection ends");
    assert!(
        holder.closed_within(DEADLINE),
        "connections end with the node"
    );
}

/// SIGTERM while a client streams requests (so the node stops with input
/// unread): the client still gets the answers written before the stop,
/// its waiter's `M - A k`, and an orderly end, not a reset that would
/// discard them. Three rounds: the stop lands at a different point of the
/// stream each time.
#[test]
fn sigterm_while_a_client_streams_requests_still_delivers_its_last_answers() {
    for round in 0..3 {
        let mut node = Node::start(&[]);
        let mut holder = node.client();
        holder.acquire_now("k", "30");
        let mut c = node.client();
        c.send("A k 30 0");
        let mut probe = node.client();
        common::wait_for("the waiter to queue", DEADLINE, || {
            (probe.query("k").waiting == 1).then_some(())
        });
        let stream: String = (0..20_000).map(|i| format!("A p{i} 30 0\n")).collect();
        let mut writer = c.stream.try_clone().expect("clone");
        let sending = std::thread::spawn(move || {
            // Fails once the node has closed: that is the end of it.
            let _ = writer.write_all(stream.as_bytes());
        });
        // The stream is being served: stop the node in the middle of it.
        let first = c.recv();
        assert!(first.starts_with("A "), "{first}");
        node.signal("TERM");
        let (lines, ending) = c.rest_until_closed(DEADLINE);
        let _ = c.stream.shutdown(std::net::Shutdown::Both);
        sending.join().expect("writer");
        assert_eq!(node.wait_exit(DEADLINE), Some(0), "log:\n{}", node.log());
        assert_eq!(
            ending,
            common::Ending::Eof,
            "round {round}: after {} lines",
            lines.len() + 1
        );
        assert!(
            lines.iter().any(|l| l == "M - A k"),
            "round {round}: the waiter is told no node is active ({} lines)",
            lines.len() + 1
        );
        // Every request the node had read was answered before the end.
        assert!(
            !node.log().contains("requests unanswered"),
            "round {round}: log:\n{}",
            node.log()
        );
    }
}

/// A stopping node ends its connections in order (up to a second for
/// clients that do not close), but it refuses new ones from the start, so
/// a client dialing it then tries another node at once instead of waiting.
#[test]
fn a_stopping_node_refuses_new_connections_while_its_last_ones_end() {
    let mut node = Node::start(&[]);
    // Never closes: the node waits for it before it exits.
    let mut idle = node.client();
    assert!(idle.info().starts_with("I "));
    node.signal("TERM");
    common::wait_for("a new connection to be refused", DEADLINE, || {
        match std::net::TcpStream::connect_timeout(&node.addr, Duration::from_millis(200)) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Some(()),
            _ => None,
        }
    });
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", node.pid())).expect("stat");
    let state = stat
        .rsplit(") ")
        .next()
        .and_then(|rest| rest.chars().next());
    assert_ne!(state, Some('Z'), "refused while the node still runs");
    assert!(idle.closed_within(DEADLINE), "the last connection ends");
    assert_eq!(node.wait_exit(DEADLINE), Some(0), "log:\n{}", node.log());
}

#[test]
fn sigterm_makes_an_idle_node_exit_0_promptly() {
    let mut node = Node::start(&[]);
    node.signal("TERM");
    assert_eq!(node.wait_exit(DEADLINE), Some(0), "log:\n{}", node.log());
}

#[test]
fn tokens_after_a_restart_are_larger_than_before_it() {
    let mut first = Node::start(&[]);
    let mut c = first.client();
    let mut before = 0;
    for i in 0..20 {
        before = c.acquire_now(&format!("k{i}"), "30");
    }
    first.signal("KILL");
    first.wait_exit(DEADLINE);
    drop(first);

    let second = Node::start(&[]);
    let mut c = second.client();
    let answer = c.ask("A k0 30 0");
    let after = token_of(&answer);
    assert_eq!(answer, format!("A {after} k0"));
    assert!(
        after > before,
        "token after the restart {after} > last before it {before}"
    );
}

#[test]
fn a_node_stops_busy_polling_when_traffic_stops() {
    // Requests a few milliseconds apart grow the polling windows to cover
    // those gaps (up to the 10 ms allowed). Then traffic stops, but leases
    // keep running out every 10 ms for most of a second: the lock owner wakes for each, and must
    // not poll again after each of them. The threads must go back to sleep.
    let node = Node::start(&["--busy-poll-us", "10000", "--threads", "2"]);
    let mut client = node.client();
    for _ in 0..60 {
        assert_eq!(client.ask("Q k"), "Q k 0 0 0");
        std::thread::sleep(std::time::Duration::from_millis(4));
    }
    for i in 1..=95 {
        // Leases of 0.01 s to 0.95 s: one runs out every 10 ms.
        let lease = format!("0.{:03}", 10 * i);
        client.acquire_now(&format!("lease{i}"), &lease);
    }
    let before = node.cpu_ticks();
    // Showing that nothing happens takes a while by nature.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let used = node.cpu_ticks() - before;
    let info = client.info();
    assert_eq!(info_field(&info, "held").as_deref(), Some("0"), "{info}");
    // Clock ticks are 10 ms: an idle node costs 0-1 ticks a second, plus up
    // to one window (10 ms) of polling per thread after the last request; a
    // thread that kept polling would cost up to 100 (less on a machine whose
    // cores are shared, hence the low bound).
    println!("{used} ticks of CPU in 1 s without requests");
    assert!(
        used <= 10,
        "used {used} ticks of CPU in 1 s without requests"
    );
}

#[test]
fn debug_logs_name_the_connection_its_address_and_the_key_in_words() {
    let node = Node::start_debug(&[]);
    let mut client = node.client();
    let local = client.stream.local_addr().expect("local address");
    assert_eq!(client.ask("A reports 0 0"), "E A reports bad-lease");
    client.send("Z");
    assert_eq!(client.recv(), "E - - unknown-op");
    drop(client);
    let log = common::wait_for("the close to be logged", DEADLINE, || {
        let log = node.log();
        log.contains(": closed").then_some(log)
    });
    let refused = log
        .lines()
        .find(|l| l.contains("refused A reports: bad-lease"))
        .unwrap_or_else(|| panic!("the refusal is logged: {log}"));
    assert!(
        refused.contains("conn ") && refused.contains(&format!("({local})")),
        "names the connection and its address: {refused}"
    );
    assert!(
        log.contains(&format!("({local}): line not understood: unknown-op")),
        "{log}"
    );
    for line in log.lines() {
        for pattern in ["Some(", "None)", "ConnId(", "{ ", " }"] {
            assert!(!line.contains(pattern), "a debug value: {line}");
        }
    }
}
