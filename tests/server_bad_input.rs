//! Real-process tests of a single `batond` node against bad input and at its
//! limits (docs/protocol.md): malformed lines, over-long lines, binary junk,
//! silent and vanishing clients, `--max-conns`, `--max-waiting`,
//! `--max-keys`, and a client that never reads its answers.
//!
//! Each bad client gets its own connection; a healthy client, connected
//! before the bad input, is checked to still be served afterwards.

mod common;

use std::io::{ErrorKind, Write};
use std::time::{Duration, Instant};

use common::{DEADLINE, LineClient, Node, Query, Received, info_field, token_of, wait_for};

/// The healthy client (connected before the bad input) and a new one are
/// both served: a key can be acquired, queried and released.
fn assert_still_served(node: &Node, healthy: &mut LineClient) {
    assert_eq!(healthy.ask("Q health"), "Q health 0 0 0");
    let token = healthy.acquire_now("health", "30");
    assert_eq!(healthy.ask(&format!("R health {token}")), "R health");
    let mut fresh = node.client();
    assert_eq!(fresh.ask("Q health"), "Q health 0 0 0");
}

/// Send `bytes` on a new connection; expect exactly `answer`, then the
/// server closing the connection.
fn assert_refused_and_closed(node: &Node, bytes: &[u8], answer: &str) {
    let mut bad = node.client();
    bad.send_raw(bytes);
    assert_eq!(bad.recv(), answer, "answer to {bytes:?}");
    assert!(
        bad.closed_within(DEADLINE),
        "the server closes the connection after {answer:?}"
    );
}

/// Send `line` on a new connection; expect exactly `answer`, and the
/// connection to stay open and serve the next request.
fn assert_refused_and_open(node: &Node, line: &[u8], answer: &str) {
    let mut c = node.client();
    c.send_raw(line);
    c.send_raw(b"\n");
    assert_eq!(c.recv(), answer, "answer to {line:?}");
    assert_eq!(c.ask("Q after"), "Q after 0 0 0", "open after {line:?}");
}

// ---------------------------------------------------------------------------
// Lines not understood: E - - <reason>, then closed
// ---------------------------------------------------------------------------

#[test]
fn an_unknown_op_is_refused_and_the_connection_closed() {
    let node = Node::start_protocol(&[]);
    let mut healthy = node.client();
    for line in ["Z k\n", "AA k 30 0\n", "E A k bad-key\n", "- k\n"] {
        assert_refused_and_closed(&node, line.as_bytes(), "E - - unknown-op");
    }
    assert_still_served(&node, &mut healthy);
}

#[test]
fn a_lowercase_op_is_an_unknown_op() {
    let node = Node::start_protocol(&[]);
    let mut healthy = node.client();
    for line in ["a k 30 0\n", "q k\n", "i\n", "r k 5\n", "k k 5 30\n"] {
        assert_refused_and_closed(&node, line.as_bytes(), "E - - unknown-op");
    }
    assert_still_served(&node, &mut healthy);
}

#[test]
fn missing_fields_are_refused_and_the_connection_closed() {
    let node = Node::start_protocol(&[]);
    let mut healthy = node.client();
    for line in ["A k 30\n", "A k\n", "A\n", "R k\n", "K k 5\n", "Q\n"] {
        assert_refused_and_closed(&node, line.as_bytes(), "E - - missing-fields");
    }
    assert_still_served(&node, &mut healthy);
}

#[test]
fn an_over_long_line_without_newline_is_refused_and_the_connection_closed() {
    let node = Node::start_protocol(&[]);
    let mut healthy = node.client();
    assert_refused_and_closed(&node, &[b'x'; 2000], "E - - line-too-long");
    let mut long_request = b"A ".to_vec();
    long_request.extend_from_slice(&[b'k'; 1500]);
    long_request.extend_from_slice(b" 30 0\n");
    assert_refused_and_closed(&node, &long_request, "E - - line-too-long");
    assert_still_served(&node, &mut healthy);
}

#[test]
fn a_line_of_exactly_1024_bytes_is_read_and_one_of_1025_is_too_long() {
    let node = Node::start_protocol(&[]);
    let mut healthy = node.client();
    // 1024 bytes with the line ending: read (and refused for its key).
    for ending in ["\n", "\r\n"] {
        let mut line = b"Q ".to_vec();
        line.resize(1024 - ending.len(), b'x');
        line.extend_from_slice(ending.as_bytes());
        assert_eq!(line.len(), 1024);
        let mut c = node.client();
        c.send_raw(&line);
        assert_eq!(c.recv(), "E Q - bad-key");
        assert_eq!(c.ask("Q after"), "Q after 0 0 0", "still open");
    }
    let mut line = b"Q ".to_vec();
    line.resize(1024, b'x');
    line.push(b'\n');
    assert_eq!(line.len(), 1025);
    assert_refused_and_closed(&node, &line, "E - - line-too-long");
    assert_still_served(&node, &mut healthy);
}

#[test]
fn binary_junk_is_refused_and_the_connection_closed() {
    let node = Node::start_protocol(&[]);
    let mut healthy = node.client();
    assert_refused_and_closed(&node, b"\x00\xff\xfe\n", "E - - unknown-op");
    assert_refused_and_closed(&node, b"\xff\n", "E - - unknown-op");
    assert_refused_and_closed(&node, b"\x00 k 30 0\n", "E - - unknown-op");

    // Seeded random bytes, NUL and 0xFF included, newlines sprinkled in.
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    for _ in 0..5 {
        let mut junk = vec![0x00, 0xff];
        for i in 0..3000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            junk.push(if i % 97 == 0 { b'\n' } else { rng as u8 });
        }
        let mut bad = node.client();
        // The server may close before reading everything: ignore send errors.
        let _ = bad.stream.write_all(&junk);
        match bad.next_event(DEADLINE) {
            Received::Line(line) => assert!(
                line == "E - - unknown-op" || line == "E - - line-too-long",
                "junk answered {line:?}"
            ),
            other => panic!("junk got no E line: {other:?}"),
        }
        assert!(bad.closed_within(DEADLINE), "junk connection is closed");
    }
    assert_still_served(&node, &mut healthy);
}

#[test]
fn requests_before_a_fatal_line_are_answered_before_its_error_which_is_the_last_line() {
    let node = Node::start_protocol(&[]);
    let mut healthy = node.client();
    let mut c = node.client();
    c.send_raw(b"Q before\nZ\nQ after\n");
    assert_eq!(c.recv(), "Q before 0 0 0");
    assert_eq!(c.recv(), "E - - unknown-op");
    assert!(c.closed_within(DEADLINE));
    // Many in flight when the fatal line comes: every answer, then the E.
    let mut c = node.client();
    let mut burst = "Q before\n".repeat(3000);
    burst.push_str("Z\n");
    c.send_raw(burst.as_bytes());
    for i in 0..3000 {
        assert_eq!(c.recv(), "Q before 0 0 0", "answer {i}");
    }
    assert_eq!(c.recv(), "E - - unknown-op");
    assert!(c.closed_within(DEADLINE));
    assert_eq!(c.try_recv(Duration::ZERO), None, "a line after the E");
    assert_still_served(&node, &mut healthy);
}

/// A client that pipelines past a fatal line (it writes on while it
/// reads) still gets every answer owed, the `E`, and an orderly end: the
/// server stops parsing at the fatal line but reads (and drops) the rest
/// before it closes. (Closing with input unread makes the kernel reset the
/// connection, and a reset loses the answers the client has not read.)
#[test]
fn a_client_still_sending_after_a_fatal_line_gets_every_answer_and_an_orderly_end() {
    let node = Node::start_protocol(&[]);
    let mut healthy = node.client();
    let mut c = node.client();
    let mut burst = "Q before\n".repeat(20_000);
    burst.push_str("Z\n");
    burst.push_str(&"Q after\n".repeat(100_000));
    let mut writer = c.stream.try_clone().expect("clone");
    let sending = std::thread::spawn(move || {
        // Fails once the server has closed: that is the end of it.
        let _ = writer.write_all(burst.as_bytes());
    });
    let (lines, ending) = c.rest_until_closed(DEADLINE);
    let _ = c.stream.shutdown(std::net::Shutdown::Both);
    sending.join().expect("writer");
    assert_eq!(ending, common::Ending::Eof, "after {} lines", lines.len());
    assert_eq!(lines.len(), 20_001, "every answer and the E");
    assert!(lines[..20_000].iter().all(|l| l == "Q before 0 0 0"));
    assert_eq!(lines[20_000], "E - - unknown-op");
    assert_still_served(&node, &mut healthy);
}

// ---------------------------------------------------------------------------
// Requests refused: E <op> <key> <reason>, the connection stays open
// ---------------------------------------------------------------------------

#[test]
fn extra_fields_are_refused_and_the_connection_stays_open() {
    let node = Node::start_protocol(&[]);
    let mut healthy = node.client();
    let cases: [(&str, &str); 8] = [
        // A takes a limit and a value after its wait; a field past them is extra.
        ("A k 30 0 1 v extra", "E A k extra-fields"),
        ("A k 30 0 1 v ", "E A k extra-fields"),
        ("A k 30 0 extra", "E A k bad-limit"),
        ("A k 30 0 ", "E A k bad-limit"),
        ("R k 5 6", "E R k extra-fields"),
        ("K k 5 30 x", "E K k extra-fields"),
        ("Q k k", "E Q k extra-fields"),
        ("I x", "E I - extra-fields"),
    ];
    for (line, answer) in cases {
        assert_refused_and_open(&node, line.as_bytes(), answer);
    }
    assert_eq!(healthy.query("k"), Query::FREE, "nothing was registered");
    assert_still_served(&node, &mut healthy);
}

#[test]
fn a_refusal_leaves_in_request_order_with_the_answers_before_it() {
    let node = Node::start_protocol(&[]);
    let mut c = node.client();
    c.send_raw(b"I\nI x\nA bad-key\x01 30 0\nQ k\n");
    assert!(c.recv().starts_with("I "), "the I answer comes first");
    assert_eq!(c.recv(), "E I - extra-fields");
    assert_eq!(c.recv(), "E A - bad-key");
    assert_eq!(c.recv(), "Q k 0 0 0");
}

#[test]
fn bad_numbers_are_refused_and_the_connection_stays_open() {
    // The node runs with --max-lease 60.
    let node = Node::start_protocol(&[]);
    let mut healthy = node.client();
    let cases: [(&str, &str); 20] = [
        ("A k abc 0", "E A k bad-lease"),
        ("A k 0 0", "E A k bad-lease"),
        ("A k 0.000 0", "E A k bad-lease"),
        ("A k -1 0", "E A k bad-lease"),
        ("A k 1.2345 0", "E A k bad-lease"),
        ("A k 1. 0", "E A k bad-lease"),
        ("A k 1e3 0", "E A k bad-lease"),
        ("A k 61 0", "E A k lease-too-long"),
        ("A k 60.001 0", "E A k lease-too-long"),
        ("A k 30 x", "E A k bad-wait"),
        ("A k 30 -1", "E A k bad-wait"),
        ("A k 30 0.0001", "E A k bad-wait"),
        ("A k 30 61", "E A k wait-too-long"),
        ("R k 0", "E R k bad-token"),
        ("R k abc", "E R k bad-token"),
        ("R k -5", "E R k bad-token"),
        ("R k 18446744073709551616", "E R k bad-token"),
        ("K k 0 30", "E K k bad-token"),
        ("K k 5 0", "E K k bad-lease"),
        ("K k 5 61", "E K k lease-too-long"),
    ];
    for (line, answer) in cases {
        assert_refused_and_open(&node, line.as_bytes(), answer);
    }
    assert_eq!(healthy.query("k"), Query::FREE, "nothing was registered");
    // The limits themselves are allowed.
    let mut c = node.client();
    c.acquire_now("max", "60");
    c.acquire_now("min", "0.001");
    let answer = c.ask("A waits 1 60");
    assert_eq!(answer, format!("A {} waits", token_of(&answer)));
    assert_eq!(
        c.ask("R k 18446744073709551615"),
        "N k",
        "the largest u64 is a valid token"
    );
    assert_still_served(&node, &mut healthy);
}

/// A well-formed number of seconds is too long however many digits it has,
/// also past what a u64 of milliseconds holds; only text that is not a
/// number is bad (docs/protocol.md).
#[test]
fn a_huge_lease_or_wait_is_too_long_not_bad_however_many_digits_it_has() {
    let node = Node::start_protocol(&[]);
    let mut c = node.client();
    for huge in [
        "18446744073709551",
        "18446744073709552",
        "18446744073709551.616",
        "99999999999999999999",
        "99999999999999999999999999999999999999999.5",
    ] {
        assert_eq!(c.ask(&format!("A k {huge} 0")), "E A k lease-too-long");
        assert_eq!(c.ask(&format!("A k 30 {huge}")), "E A k wait-too-long");
        assert_eq!(c.ask(&format!("K k 5 {huge}")), "E K k lease-too-long");
    }
    assert_eq!(
        c.ask("A k 99999999999999999999x 0"),
        "E A k bad-lease",
        "malformed stays bad"
    );
    assert_eq!(c.ask("A k 30 1.0001"), "E A k bad-wait");
    assert_eq!(c.query("k"), Query::FREE, "nothing was registered");
}

#[test]
fn bad_keys_are_refused_and_the_connection_stays_open() {
    let node = Node::start_protocol(&[]);
    let mut healthy = node.client();
    let long_key = "k".repeat(251);
    let cases: Vec<Vec<u8>> = vec![
        format!("A {long_key} 30 0").into_bytes(),
        b"A k\x01y 30 0".to_vec(),
        b"A k\ty 30 0".to_vec(),
        b"A k\x7fy 30 0".to_vec(),
        b"A \x00 30 0".to_vec(),
        b"A  30 0".to_vec(),
    ];
    for line in cases {
        assert_refused_and_open(&node, &line, "E A - bad-key");
    }
    assert_refused_and_open(&node, format!("Q {long_key}").as_bytes(), "E Q - bad-key");
    assert_refused_and_open(&node, b"R k\x02 5", "E R - bad-key");
    // The largest key and UTF-8 keys are fine.
    let mut c = node.client();
    let max_key = "m".repeat(250);
    c.acquire_now(&max_key, "30");
    c.acquire_now("clé-日本", "30");
    c.acquire_now("-", "30");
    // Any byte from 0x80 up is allowed, UTF-8 or not, and echoed as sent.
    c.send_raw(b"A \xff\x80\xfe 30 0\n");
    let answer = c.recv_bytes();
    let token = token_of(&String::from_utf8_lossy(&answer));
    assert_eq!(
        answer,
        [format!("A {token} ").as_bytes(), b"\xff\x80\xfe"].concat()
    );
    assert_still_served(&node, &mut healthy);
}

#[test]
fn crlf_line_endings_are_accepted_and_blank_lines_ignored() {
    let node = Node::start_protocol(&[]);
    let mut c = node.client();
    c.send_raw(b"A crlf 30 0\r\n");
    let answer = c.recv();
    let token = token_of(&answer);
    assert_eq!(answer, format!("A {token} crlf"));
    c.send_raw(format!("Q crlf\r\nR crlf {token}\r\n").as_bytes());
    let q = Query::parse(&c.recv(), "crlf");
    assert_eq!(q.token, token);
    assert_eq!(c.recv(), "R crlf");
    // Blank lines get no answer: the next line is the answer to the Q.
    c.send_raw(b"\n\r\n\nQ blank\r\n");
    assert_eq!(c.recv(), "Q blank 0 0 0");
    let info = c.ask("I\r");
    assert!(info.starts_with("I "), "{info:?}");
}

// ---------------------------------------------------------------------------
// Silent and vanishing clients
// ---------------------------------------------------------------------------

#[test]
fn a_client_that_connects_and_says_nothing_does_not_stop_others() {
    let node = Node::start_protocol(&[]);
    let mut silent = node.client();
    let mut healthy = node.client();
    assert_still_served(&node, &mut healthy);
    let mut half_line = node.client();
    half_line.send_raw(b"A slow 30");
    assert_still_served(&node, &mut healthy);
    silent.assert_silent_for(Duration::from_millis(200));
    half_line.assert_silent_for(Duration::from_millis(10));
    // The unfinished line is finished later: then it is answered.
    half_line.send_raw(b" 0\n");
    let answer = half_line.recv();
    assert_eq!(answer, format!("A {} slow", token_of(&answer)));
}

#[test]
fn a_client_that_disconnects_mid_line_does_not_affect_others() {
    let node = Node::start_protocol(&[]);
    let mut healthy = node.client();
    let mut gone = node.client();
    gone.send_raw(b"A half 30");
    drop(gone);
    let mut gone = node.client();
    gone.send_raw(b"A half2 30 0\nQ hal");
    drop(gone);
    healthy.wait_for_conns(1);
    assert_eq!(
        healthy.ask("Q half"),
        "Q half 0 0 0",
        "the half line did nothing"
    );
    assert_still_served(&node, &mut healthy);
}

#[test]
fn a_client_that_never_reads_its_answers_does_not_stop_others() {
    // Threads that sleep at once: busy polling would hide a lost wake-up
    // (a close decided while the loop had nothing else to do).
    let node = Node::start_protocol(&["--busy-poll-us", "0"]);
    let mut healthy = node.client();
    let mut flood = node.client();
    flood
        .stream
        .set_write_timeout(Some(Duration::from_millis(500)))
        .expect("write timeout");
    let chunk = b"Q flood\nI\n".repeat(6_000);
    let mut sent = 0usize;
    let jammed = loop {
        match flood.stream.write(&chunk) {
            Ok(n) => sent += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                break true;
            }
            // Cutting off a client that does not read is fine too.
            Err(_) => break true,
        }
        if sent > 512 << 20 {
            break false;
        }
    };
    assert!(
        jammed,
        "the server kept reading {sent} bytes of requests whose answers nobody reads"
    );
    // While the flood is stuck, others are served.
    assert_still_served(&node, &mut healthy);
    let mut holder = node.client();
    let token = holder.acquire_now("k", "30");
    assert_eq!(holder.ask(&format!("R k {token}")), "R k");
    // When the flooder goes away, its connection is cleaned up.
    drop(flood);
    healthy.wait_for_conns(2);
    assert_still_served(&node, &mut healthy);
}

#[test]
fn a_client_that_never_reads_its_answers_does_not_make_the_node_buffer_without_limit() {
    let node = Node::start_protocol(&[]);
    let mut healthy = node.client();
    let before_kib = node.peak_rss_kib();
    let mut flood = node.client();
    flood
        .stream
        .set_write_timeout(Some(Duration::from_millis(500)))
        .expect("write timeout");
    // 1 MiB of `I` requests: half a million answers of about 120 bytes each,
    // which a node that stops reading a client that does not read (docs/protocol.md,
    // "Details baton settles": never unbounded memory) must not hold all at once.
    let chunk = b"I\n".repeat(32 * 1024);
    let mut sent = 0;
    while sent < 1 << 20 {
        match flood.stream.write(&chunk) {
            Ok(n) => sent += n,
            Err(_) => break, // jammed or cut off: both fine
        }
    }
    // The healthy request is queued behind whatever the node has read.
    assert_still_served(&node, &mut healthy);
    let limit_kib = before_kib + 128 * 1024;
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_millis(500) {
        let peak_kib = node.peak_rss_kib();
        assert!(
            peak_kib < limit_kib,
            "after {sent} bytes of requests whose answers nobody reads, the node's \
             peak memory grew from {before_kib} KiB to {peak_kib} KiB"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_still_served(&node, &mut healthy);
}

// ---------------------------------------------------------------------------
// Limits
// ---------------------------------------------------------------------------

#[test]
fn a_connection_over_max_conns_is_refused_and_one_is_accepted_after_a_close() {
    let node = Node::start(&["--max-conns", "5"]);
    let mut clients: Vec<LineClient> = Vec::new();
    for _ in 0..5 {
        let mut c = node.client();
        c.info(); // admitted and served
        clients.push(c);
    }
    let info = clients[0].info();
    assert_eq!(info_field(&info, "conns").as_deref(), Some("5"), "{info}");

    let mut sixth = node.client();
    assert_eq!(sixth.recv(), "E - - too-many-connections");
    assert!(sixth.closed_within(DEADLINE), "the sixth is closed");
    for c in &mut clients {
        c.info(); // the five are still served
    }

    drop(clients.pop());
    let mut accepted = wait_for("a new connection to be accepted", DEADLINE, || {
        node.admitted()
    });
    let info = accepted.info();
    assert_eq!(info_field(&info, "conns").as_deref(), Some("5"), "{info}");
}

#[test]
fn a_third_queued_acquire_on_one_connection_is_refused_with_max_waiting_2() {
    let node = Node::start(&["--max-waiting", "2"]);
    let mut holder = node.client();
    let mut c = node.client();
    let a = holder.acquire_now("a", "30");
    holder.acquire_now("b", "30");
    holder.acquire_now("c", "30");
    c.send_lines(&["A a 30 0", "A b 30 0", "A c 30 0"]);
    assert_eq!(c.recv(), "E A c too-many-waiting");
    assert_eq!(holder.query("a").waiting, 1);
    assert_eq!(holder.query("b").waiting, 1);
    assert_eq!(
        holder.query("c").waiting,
        0,
        "the refused one is not in line"
    );
    // Other connections are not limited by this one's count.
    let mut other = node.client();
    other.send("A c 30 0");
    wait_for("the other connection to queue", DEADLINE, || {
        (holder.query("c").waiting == 1).then_some(())
    });
    // Once one of its waits is answered, the connection may queue again.
    assert_eq!(holder.ask(&format!("R a {a}")), "R a");
    let answer = c.recv();
    assert_eq!(answer, format!("A {} a", token_of(&answer)));
    c.send("A c 30 0");
    wait_for("the connection to queue again", DEADLINE, || {
        (holder.query("c").waiting == 2).then_some(())
    });
}

#[test]
fn a_waiting_refusal_does_not_overtake_earlier_acquires_of_the_same_key() {
    let node = Node::start(&["--max-waiting", "2"]);
    let mut holder = node.client();
    let mut c = node.client();
    let first = holder.acquire_now("a", "30");
    c.send_lines(&["A a 30 0", "A a 30 0", "A a 30 0"]);
    wait_for("two in line", DEADLINE, || {
        (holder.query("a").waiting == 2).then_some(())
    });
    c.assert_silent_for(Duration::from_millis(200));
    assert_eq!(holder.ask(&format!("R a {first}")), "R a");
    let answer = c.recv();
    let second = token_of(&answer);
    assert_eq!(answer, format!("A {second} a"));
    c.send(&format!("R a {second}"));
    let mut answers = c.recv_n(3);
    let third = answers
        .iter()
        .find(|a| a.starts_with("A "))
        .map(|a| token_of(a))
        .unwrap_or_else(|| panic!("no grant in {answers:?}"));
    let grant = answers.iter().position(|a| a.starts_with("A ")).unwrap();
    let refusal = answers
        .iter()
        .position(|a| a == "E A a too-many-waiting")
        .unwrap_or_else(|| panic!("no refusal in {answers:?}"));
    assert!(
        grant < refusal,
        "(A, a) answers in arrival order: {answers:?}"
    );
    answers.sort();
    assert_eq!(
        answers,
        vec![
            format!("A {third} a"),
            "E A a too-many-waiting".to_string(),
            "R a".to_string()
        ]
    );
}

#[test]
fn a_third_distinct_key_is_refused_with_max_keys_2() {
    let node = Node::start(&["--max-keys", "2"]);
    let mut c = node.client();
    let mut waiter = node.client();
    let k1 = c.acquire_now("k1", "30");
    let k2 = c.acquire_now("k2", "30");
    assert_eq!(c.ask("A k3 30 0"), "E A k3 too-many-keys");
    assert_eq!(c.query("k3"), Query::FREE);
    // A held key still queues.
    waiter.send("A k1 30 0");
    wait_for("the waiter to queue on k1", DEADLINE, || {
        (c.query("k1").waiting == 1).then_some(())
    });
    // Freeing a key makes room.
    assert_eq!(c.ask(&format!("R k2 {k2}")), "R k2");
    c.acquire_now("k3", "30");
    assert_eq!(c.ask(&format!("R k1 {k1}")), "R k1");
    let answer = waiter.recv();
    assert_eq!(answer, format!("A {} k1", token_of(&answer)));
}
