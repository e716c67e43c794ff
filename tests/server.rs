//! Real-process tests of a single `batond` node: the lock semantics of
//! docs/protocol.md (the state table, FIFO handover, lease expiry, wait
//! timeouts, disconnects, release, keep, query, pipelining and `I`) and
//! docs/fencing.md, seen from TCP clients.
//!
//! Every test starts its own node on a free loopback port (killed by PID when
//! the test ends) and talks raw protocol lines to it. Waits are polls with a
//! deadline; the few short silences (`assert_silent_for`) only prove that
//! something does NOT happen during an interval.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::{DEADLINE, LineClient, Node, Query, info_field, token_of, wait_for};

/// How long a test watches to show that nothing arrives.
const SILENCE: Duration = Duration::from_millis(400);

/// Poll `Q key` on `probe` until `pred` holds; the last answer.
fn wait_for_query(
    probe: &mut LineClient,
    key: &str,
    what: &str,
    pred: impl Fn(&Query) -> bool,
) -> Query {
    wait_for(what, DEADLINE, || {
        let q = probe.query(key);
        pred(&q).then_some(q)
    })
}

/// Send `A key lease 0` on `waiter` and wait until `probe` sees the queue at
/// `position` (so waiters queue in a known order).
fn queue_behind(waiter: &mut LineClient, probe: &mut LineClient, key: &str, position: u64) {
    waiter.send(&format!("A {key} 30 0"));
    wait_for_query(
        probe,
        key,
        &format!("{key} to have {position} waiting"),
        |q| q.waiting == position,
    );
}

// ---------------------------------------------------------------------------
// docs/protocol.md, "Writing a client": the state table
// ---------------------------------------------------------------------------

#[test]
fn an_unregistered_key_is_granted_at_once() {
    let node = Node::start_protocol(&[]);
    let mut c = node.client();
    let answer = c.ask("A fresh 30 0");
    let token = token_of(&answer);
    assert_eq!(answer, format!("A {token} fresh"));
    let q = c.query("fresh");
    assert_eq!((q.token, q.waiting), (token, 0));
    assert!(
        (20_000..=30_000).contains(&q.ms_left),
        "a 30 s lease has about 30000 ms left: {q:?}"
    );
}

#[test]
fn a_key_whose_lease_expired_is_granted_again_with_a_larger_token() {
    let node = Node::start_protocol(&[]);
    let mut c = node.client();
    let first = c.acquire_now("k", "0.2");
    wait_for_query(&mut c, "k", "the lease to run out", |q| *q == Query::FREE);
    let answer = c.ask("A k 30 0");
    let second = token_of(&answer);
    assert_eq!(answer, format!("A {second} k"));
    assert!(second > first, "new token {second} > expired {first}");
    assert_eq!(
        c.ask(&format!("R k {first}")),
        "N k",
        "the old token is dead"
    );
    assert_eq!(c.query("k").token, second);
}

#[test]
fn a_held_key_queues_the_acquire_and_grants_it_on_release() {
    let node = Node::start_protocol(&[]);
    let mut holder = node.client();
    let mut waiter = node.client();
    let mut probe = node.client();
    let first = holder.acquire_now("k", "30");
    queue_behind(&mut waiter, &mut probe, "k", 1);
    waiter.assert_silent_for(SILENCE);
    assert_eq!(holder.ask(&format!("R k {first}")), "R k");
    let answer = waiter.recv();
    let second = token_of(&answer);
    assert_eq!(answer, format!("A {second} k"));
    assert!(second > first);
    let q = probe.query("k");
    assert_eq!((q.token, q.waiting), (second, 0));
    assert!(
        q.ms_left > 20_000,
        "the new holder has a fresh lease: {q:?}"
    );
}

#[test]
fn waiters_on_separate_connections_are_granted_in_fifo_order() {
    let node = Node::start_protocol(&[]);
    let mut holder = node.client();
    let mut probe = node.client();
    let mut token = holder.acquire_now("fifo", "30");
    let mut waiters: Vec<LineClient> = (0..5).map(|_| node.client()).collect();
    for (i, waiter) in waiters.iter_mut().enumerate() {
        queue_behind(waiter, &mut probe, "fifo", i as u64 + 1);
    }
    assert_eq!(holder.ask(&format!("R fifo {token}")), "R fifo");
    for (i, waiter) in waiters.iter_mut().enumerate() {
        let answer = waiter.recv();
        let next = token_of(&answer);
        assert_eq!(answer, format!("A {next} fifo"), "waiter {i} is next");
        assert!(next > token);
        token = next;
        let q = probe.query("fifo");
        assert_eq!(
            (q.token, q.waiting),
            (token, 4 - i as u64),
            "waiter {i} holds it, the others still wait"
        );
        assert_eq!(waiter.ask(&format!("R fifo {token}")), "R fifo");
    }
    assert_eq!(probe.query("fifo"), Query::FREE);
}

#[test]
fn an_expired_lease_hands_the_key_to_the_next_waiter_without_any_request() {
    let node = Node::start_protocol(&[]);
    let mut holder = node.client();
    let mut waiter = node.client();
    let mut probe = node.client();
    let sent = Instant::now();
    let first = holder.acquire_now("k", "1");
    queue_behind(&mut waiter, &mut probe, "k", 1);
    let q = probe.query("k");
    assert_eq!(
        (q.token, q.waiting),
        (first, 1),
        "still held when the queue was checked (machine too slow?)"
    );
    // From here on nobody sends anything: the server must act on its own.
    let answer = waiter.recv_within(DEADLINE);
    let elapsed = sent.elapsed();
    let second = token_of(&answer);
    assert_eq!(answer, format!("A {second} k"));
    assert!(second > first);
    assert!(
        elapsed >= Duration::from_millis(900),
        "granted after {elapsed:?}, before the 1 s lease ended"
    );
    assert_eq!(holder.ask(&format!("R k {first}")), "N k");
    assert_eq!(probe.query("k").token, second);
}

#[test]
fn an_expired_lease_with_nobody_waiting_frees_the_key() {
    let node = Node::start_protocol(&[]);
    let mut c = node.client();
    c.acquire_now("k", "0.2");
    let mut probe = node.client();
    wait_for_query(&mut probe, "k", "the key to be free", |q| *q == Query::FREE);
    let info = probe.info();
    assert_eq!(info_field(&info, "held").as_deref(), Some("0"), "{info}");
}

// ---------------------------------------------------------------------------
// Waiting: timeouts, no limit, disconnects
// ---------------------------------------------------------------------------

#[test]
fn an_acquire_that_waits_too_long_times_out_and_is_granted_nothing() {
    let node = Node::start_protocol(&[]);
    let mut holder = node.client();
    let mut waiter = node.client();
    let first = holder.acquire_now("k", "30");
    let sent = Instant::now();
    waiter.send("A k 30 0.3");
    assert_eq!(waiter.recv(), "T k");
    let elapsed = sent.elapsed();
    assert!(
        elapsed >= Duration::from_millis(250),
        "timed out after {elapsed:?}, before its 0.3 s wait"
    );
    let q = waiter.query("k");
    assert_eq!(
        (q.token, q.waiting),
        (first, 0),
        "still the holder's, nobody waits"
    );
    assert_eq!(holder.ask(&format!("R k {first}")), "R k");
    assert_eq!(
        waiter.query("k"),
        Query::FREE,
        "the release went to nobody: the timed-out waiter was granted nothing"
    );
    waiter.assert_silent_for(Duration::from_millis(200));
}

#[test]
fn a_wait_of_zero_waits_without_limit() {
    let node = Node::start_protocol(&[]);
    let mut holder = node.client();
    let mut waiter = node.client();
    let mut probe = node.client();
    let first = holder.acquire_now("k", "30");
    queue_behind(&mut waiter, &mut probe, "k", 1);
    waiter.assert_silent_for(Duration::from_millis(500));
    assert_eq!(probe.query("k").waiting, 1, "still in line");
    assert_eq!(holder.ask(&format!("R k {first}")), "R k");
    let answer = waiter.recv();
    assert_eq!(answer, format!("A {} k", token_of(&answer)));
}

#[test]
fn a_waiter_that_disconnects_is_dropped_from_the_queue() {
    let node = Node::start_protocol(&[]);
    let mut holder = node.client();
    let mut probe = node.client();
    let mut gone = node.client();
    let mut next = node.client();
    let first = holder.acquire_now("k", "30");
    queue_behind(&mut gone, &mut probe, "k", 1);
    queue_behind(&mut next, &mut probe, "k", 2);
    drop(gone);
    wait_for_query(&mut probe, "k", "the closed waiter to leave", |q| {
        q.waiting == 1
    });
    let info = probe.info();
    assert_eq!(info_field(&info, "waiting").as_deref(), Some("1"), "{info}");
    assert_eq!(holder.ask(&format!("R k {first}")), "R k");
    let answer = next.recv();
    let second = token_of(&answer);
    assert_eq!(answer, format!("A {second} k"), "the live waiter is next");
    let q = probe.query("k");
    assert_eq!((q.token, q.waiting), (second, 0));
}

// ---------------------------------------------------------------------------
// Release
// ---------------------------------------------------------------------------

#[test]
fn a_grant_survives_its_connection_closing_and_is_released_from_another() {
    let node = Node::start_protocol(&[]);
    let mut probe = node.client();
    let mut owner = node.client();
    let token = owner.acquire_now("k", "30");
    drop(owner);
    probe.wait_for_conns(1);
    let q = probe.query("k");
    assert_eq!(q.token, token, "the grant outlives its connection");
    assert!(q.ms_left > 20_000);
    let mut other = node.client();
    assert_eq!(other.ask(&format!("R k {token}")), "R k");
    assert_eq!(probe.query("k"), Query::FREE);
}

#[test]
fn a_release_on_another_connection_hands_the_key_to_the_next_waiter() {
    let node = Node::start_protocol(&[]);
    let mut holder = node.client();
    let mut waiter = node.client();
    let mut probe = node.client();
    let first = holder.acquire_now("k", "30");
    queue_behind(&mut waiter, &mut probe, "k", 1);
    assert_eq!(probe.ask(&format!("R k {first}")), "R k");
    let answer = waiter.recv();
    assert!(token_of(&answer) > first);
    holder.assert_silent_for(Duration::from_millis(100));
}

#[test]
fn a_release_with_a_token_that_does_not_hold_the_key_changes_nothing() {
    let node = Node::start_protocol(&[]);
    let mut c = node.client();
    let mut waiter = node.client();

    assert_eq!(c.ask("R never 12345"), "N never", "a key nobody holds");

    let token = c.acquire_now("k", "30");
    assert_eq!(c.ask(&format!("R k {}", token + 1)), "N k", "wrong token");
    assert_eq!(c.ask(&format!("R k {}", token - 1)), "N k", "wrong token");
    assert_eq!(c.query("k").token, token, "the holder keeps it");

    assert_eq!(c.ask(&format!("R k {token}")), "R k");
    assert_eq!(c.ask(&format!("R k {token}")), "N k", "already released");
    assert_eq!(c.query("k"), Query::FREE);

    let first = c.acquire_now("k", "30");
    queue_behind(&mut waiter, &mut c, "k", 1);
    assert_eq!(c.ask(&format!("R k {first}")), "R k");
    let second = token_of(&waiter.recv());
    assert_eq!(
        c.ask(&format!("R k {first}")),
        "N k",
        "a stale token does not release the next holder's grant"
    );
    assert_eq!(c.query("k").token, second);

    let expired = c.acquire_now("e", "0.1");
    wait_for_query(&mut c, "e", "the lease to run out", |q| *q == Query::FREE);
    assert_eq!(c.ask(&format!("R e {expired}")), "N e", "lease expired");
}

// ---------------------------------------------------------------------------
// Keep (lease extension)
// ---------------------------------------------------------------------------

#[test]
fn keep_extends_the_lease_past_its_original_expiry_with_the_same_token() {
    let node = Node::start_protocol(&[]);
    let mut holder = node.client();
    let mut waiter = node.client();
    let token = holder.acquire_now("k", "0.5");
    assert_eq!(holder.ask(&format!("K k {token} 10")), "K k");
    let q = holder.query("k");
    assert_eq!(q.token, token, "the token stays the same");
    assert!(
        q.ms_left > 5_000,
        "ms_left grew past the 500 ms lease: {q:?}"
    );
    waiter.send("A k 30 0");
    // Past the original expiry: the key must still be the holder's.
    waiter.assert_silent_for(Duration::from_millis(500));
    let q = holder.query("k");
    assert_eq!((q.token, q.waiting), (token, 1), "{q:?}");
    assert!(q.ms_left > 5_000, "{q:?}");
    assert_eq!(holder.ask(&format!("R k {token}")), "R k");
    assert!(token_of(&waiter.recv()) > token);
}

#[test]
fn keep_of_a_lost_grant_is_refused_as_not_held() {
    let node = Node::start_protocol(&[]);
    let mut c = node.client();
    assert_eq!(c.ask("K never 5 10"), "E K never not-held");

    let token = c.acquire_now("k", "30");
    assert_eq!(c.ask(&format!("K k {} 10", token + 1)), "E K k not-held");
    assert_eq!(c.ask(&format!("R k {token}")), "R k");
    assert_eq!(c.ask(&format!("K k {token} 10")), "E K k not-held");
    assert_eq!(
        c.query("k"),
        Query::FREE,
        "a refused keep registers nothing"
    );

    let expired = c.acquire_now("e", "0.1");
    wait_for_query(&mut c, "e", "the lease to run out", |q| *q == Query::FREE);
    assert_eq!(c.ask(&format!("K e {expired} 10")), "E K e not-held");
}

#[test]
fn keep_sets_the_expiry_to_now_plus_the_new_lease_even_when_shorter() {
    let node = Node::start_protocol(&[]);
    let mut holder = node.client();
    let mut waiter = node.client();
    let mut probe = node.client();
    let token = holder.acquire_now("k", "30");
    queue_behind(&mut waiter, &mut probe, "k", 1);
    assert_eq!(holder.ask(&format!("K k {token} 0.2")), "K k");
    let q = probe.query("k");
    assert!(q.ms_left <= 200, "the lease was cut to 0.2 s: {q:?}");
    // Handed over when the new, short lease runs out (not after 30 s).
    let answer = waiter.recv_within(DEADLINE);
    assert!(token_of(&answer) > token);
    assert_eq!(holder.ask(&format!("K k {token} 30")), "E K k not-held");
}

#[test]
fn leases_and_waits_longer_than_a_minute_do_not_run_out_early() {
    // Deadlines more than one turn of a millisecond timing wheel away
    // (65.536 s for 2^16 slots) land in a slot that comes round again within
    // the next few hundred ms; they must not fire then.
    let node = Node::start(&[]);
    let mut holder = node.client();
    let mut waiter = node.client();
    let mut tokens = Vec::new();
    for (key, lease) in [
        ("l1", "65.6"),
        ("l2", "131.2"),
        ("l3", "196.9"),
        ("l4", "86400"),
    ] {
        tokens.push((key, holder.acquire_now(key, lease)));
    }
    waiter.send_lines(&["A l1 30 65.6", "A l2 30 131.2"]);
    wait_for_query(&mut holder, "l2", "the waiters to queue", |q| {
        q.waiting == 1
    });
    waiter.assert_silent_for(Duration::from_millis(500));
    for (key, token) in tokens {
        let q = holder.query(key);
        assert_eq!(q.token, token, "{key} is still held: {q:?}");
        assert!(q.ms_left > 60_000, "{key}: {q:?}");
    }
    assert_eq!(
        holder.query("l1").waiting,
        1,
        "the long wait has not run out"
    );
}

// ---------------------------------------------------------------------------
// Query
// ---------------------------------------------------------------------------

#[test]
fn query_reports_free_held_and_waiting() {
    let node = Node::start_protocol(&[]);
    let mut c = node.client();
    assert_eq!(c.ask("Q free"), "Q free 0 0 0");
    let token = c.acquire_now("k", "30");
    let q = c.query("k");
    assert_eq!((q.token, q.waiting), (token, 0));
    assert!((20_000..=30_000).contains(&q.ms_left), "{q:?}");
    let mut w1 = node.client();
    let mut w2 = node.client();
    queue_behind(&mut w1, &mut c, "k", 1);
    queue_behind(&mut w2, &mut c, "k", 2);
    let q = c.query("k");
    assert_eq!((q.token, q.waiting), (token, 2));
    assert!(q.ms_left <= 30_000);
}

// ---------------------------------------------------------------------------
// Pipelining (docs/protocol.md)
// ---------------------------------------------------------------------------

#[test]
fn many_pipelined_requests_in_one_write_are_all_answered() {
    let node = Node::start_protocol(&[]);
    let mut c = node.client();
    let n = 100;
    let mut lines: Vec<String> = (0..n).map(|i| format!("A pipe{i} 30 0")).collect();
    lines.extend((0..n).map(|i| format!("Q pipe{i}")));
    lines.push("Q nobody".to_string());
    lines.push("I".to_string());
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    c.send_lines(&refs);
    let answers = c.recv_n(2 * n + 2);

    let mut grants = std::collections::HashMap::new();
    let mut queries = std::collections::HashMap::new();
    for answer in &answers {
        let fields: Vec<&str> = answer.split(' ').collect();
        match fields[0] {
            "A" => {
                assert!(
                    grants
                        .insert(fields[2].to_string(), token_of(answer))
                        .is_none()
                );
            }
            "Q" if fields[1] != "nobody" => {
                let q = Query::parse(answer, fields[1]);
                assert!(queries.insert(fields[1].to_string(), q).is_none());
            }
            "Q" => assert_eq!(answer, "Q nobody 0 0 0"),
            "I" => assert_eq!(info_field(answer, "held").as_deref(), Some("100")),
            _ => panic!("unexpected answer {answer:?}"),
        }
    }
    for i in 0..n {
        let key = format!("pipe{i}");
        let token = grants[&key];
        assert_eq!(queries[&key].token, token, "Q {key} sees its grant");
    }
    let tokens: HashSet<u64> = grants.values().copied().collect();
    assert_eq!(tokens.len(), n, "every grant has its own token");
    c.assert_silent_for(Duration::from_millis(100));
}

#[test]
fn a_pipelined_write_far_larger_than_one_read_is_answered_in_full() {
    let node = Node::start_protocol(&[]);
    let mut c = node.client();
    let n = 20_000;
    let mut bytes = Vec::new();
    for i in 0..n {
        bytes.extend_from_slice(format!("Q big{i}\n").as_bytes());
    }
    let mut writer = c.stream.try_clone().expect("clone the stream");
    let sender = std::thread::spawn(move || {
        use std::io::Write;
        writer.write_all(&bytes).expect("send the batch");
    });
    let mut seen = HashSet::new();
    for _ in 0..n {
        let answer = c.recv();
        let key = answer.split(' ').nth(1).unwrap_or("").to_string();
        assert_eq!(answer, format!("Q {key} 0 0 0"));
        assert!(seen.insert(key), "one answer per request: {answer:?}");
    }
    sender.join().expect("sender thread");
    assert_eq!(seen.len(), n);
    c.assert_silent_for(Duration::from_millis(100));
}

#[test]
fn answers_to_the_same_op_and_key_come_in_arrival_order() {
    let node = Node::start_protocol(&[]);
    let mut c = node.client();
    let token = c.acquire_now("k", "30");
    c.send_lines(&[&format!("R k {token}"), &format!("R k {token}")]);
    assert_eq!(c.recv_n(2), vec!["R k", "N k"]);
    c.send_lines(&["A k 30 0", "A k 30 0.05", "A k 30 x"]);
    let answers = c.recv_n(3);
    let second = token_of(&answers[0]);
    assert_eq!(
        answers,
        vec![
            format!("A {second} k"),
            "T k".to_string(),
            "E A k bad-wait".to_string()
        ]
    );
}

#[test]
fn a_client_that_half_closes_after_sending_still_gets_its_answers() {
    let node = Node::start_protocol(&[]);
    let mut c = node.client();
    c.send_lines(&["Q a", "A b 30 0", "I"]);
    c.shutdown_write();
    let mut answers = c.recv_n(3);
    answers.sort();
    assert_eq!(answers[0], format!("A {} b", token_of(&answers[0])));
    assert!(answers[1].starts_with("I role=active "), "{answers:?}");
    assert_eq!(answers[2], "Q a 0 0 0");
    assert!(c.closed_within(DEADLINE), "then the server closes");
}

#[test]
fn an_acquire_that_waits_does_not_hold_up_later_requests_on_the_same_connection() {
    let node = Node::start_protocol(&[]);
    let mut holder = node.client();
    let mut c = node.client();
    let first = holder.acquire_now("busy", "30");
    c.send_lines(&["A busy 30 0", "Q other", "A free 30 0"]);
    assert_eq!(
        c.recv(),
        "Q other 0 0 0",
        "answered before the waiting acquire"
    );
    let answer = c.recv();
    assert_eq!(answer, format!("A {} free", token_of(&answer)));
    assert_eq!(holder.ask(&format!("R busy {first}")), "R busy");
    let answer = c.recv();
    assert_eq!(answer, format!("A {} busy", token_of(&answer)));
}

#[test]
fn a_later_timeout_does_not_overtake_an_earlier_waiting_acquire_of_the_same_key() {
    let node = Node::start_protocol(&[]);
    let mut holder = node.client();
    let mut c = node.client();
    let mut probe = node.client();
    let first = holder.acquire_now("k", "30");
    c.send_lines(&["A k 30 0", "A k 30 0.2"]);
    // The later request's wait runs out, but its T must wait behind the
    // earlier request, which is still in line.
    wait_for_query(&mut probe, "k", "both acquires queued", |q| q.waiting == 2);
    wait_for_query(&mut probe, "k", "the 0.2 s wait to run out", |q| {
        q.waiting == 1
    });
    c.assert_silent_for(SILENCE);
    assert_eq!(holder.ask(&format!("R k {first}")), "R k");
    let answers = c.recv_n(2);
    let second = token_of(&answers[0]);
    assert_eq!(
        answers,
        vec![format!("A {second} k"), "T k".to_string()],
        "answers for (A, k) in the order the requests arrived"
    );
    let q = probe.query("k");
    assert_eq!(
        (q.token, q.waiting),
        (second, 0),
        "the timed-out request got nothing"
    );
}

#[test]
fn a_refused_acquire_does_not_overtake_an_earlier_waiting_acquire_of_the_same_key() {
    let node = Node::start_protocol(&[]);
    let mut holder = node.client();
    let mut c = node.client();
    let mut probe = node.client();
    let first = holder.acquire_now("k", "30");
    c.send_lines(&["A k 30 0", "A k 0 0", "Q k"]);
    let q = Query::parse(&c.recv(), "k");
    assert_eq!((q.token, q.waiting), (first, 1));
    c.assert_silent_for(Duration::from_millis(200));
    assert_eq!(holder.ask(&format!("R k {first}")), "R k");
    let answers = c.recv_n(2);
    let second = token_of(&answers[0]);
    assert_eq!(
        answers,
        vec![format!("A {second} k"), "E A k bad-lease".to_string()]
    );
    assert_eq!(probe.query("k").token, second);
}

#[test]
fn acquires_of_one_key_on_one_connection_are_granted_in_arrival_order() {
    let node = Node::start_protocol(&[]);
    let mut c = node.client();
    let mut probe = node.client();
    c.send_lines(&["A s 30 0", "A s 30 0", "A s 30 0"]);
    let mut token = token_of(&c.recv());
    wait_for_query(&mut probe, "s", "two more in line", |q| q.waiting == 2);
    for left in [1, 0] {
        c.send(&format!("R s {token}"));
        let mut answers = c.recv_n(2);
        answers.sort(); // R and A answer different ops: any order
        let next = token_of(&answers[0]);
        assert_eq!(answers, vec![format!("A {next} s"), "R s".to_string()]);
        assert!(next > token);
        token = next;
        assert_eq!(probe.query("s").waiting, left);
    }
    assert_eq!(c.ask(&format!("R s {token}")), "R s");
    assert_eq!(probe.query("s"), Query::FREE);
}

// ---------------------------------------------------------------------------
// Info
// ---------------------------------------------------------------------------

#[test]
fn info_reports_the_role_the_node_and_the_right_counts() {
    let node = Node::start_protocol(&[]);
    let mut holder = node.client();
    let mut w1 = node.client();
    let mut w2 = node.client();
    let mut probe = node.client();

    // The kernel completes connects before the server accepts them.
    probe.wait_for_conns(4);
    let info = probe.info();
    let me = node.addr.to_string();
    assert_eq!(
        info_field(&info, "role").as_deref(),
        Some("active"),
        "{info}"
    );
    assert_eq!(
        info_field(&info, "node").as_deref(),
        Some(me.as_str()),
        "{info}"
    );
    assert_eq!(
        info_field(&info, "active").as_deref(),
        Some(me.as_str()),
        "{info}"
    );
    assert_eq!(info_field(&info, "held").as_deref(), Some("0"), "{info}");
    assert_eq!(info_field(&info, "waiting").as_deref(), Some("0"), "{info}");
    assert_eq!(info_field(&info, "conns").as_deref(), Some("4"), "{info}");
    assert_eq!(
        info_field(&info, "token").as_deref(),
        Some("0"),
        "nothing granted yet: {info}"
    );

    let a = holder.acquire_now("a", "30");
    let b = holder.acquire_now("b", "30");
    assert!(b > a);
    queue_behind(&mut w1, &mut probe, "a", 1);
    queue_behind(&mut w2, &mut probe, "a", 2);
    queue_behind(&mut w2, &mut probe, "b", 1);
    let info = probe.info();
    assert_eq!(info_field(&info, "token"), Some(b.to_string()), "{info}");
    assert_eq!(info_field(&info, "held").as_deref(), Some("2"), "{info}");
    assert_eq!(info_field(&info, "waiting").as_deref(), Some("3"), "{info}");
    assert_eq!(info_field(&info, "conns").as_deref(), Some("4"), "{info}");

    assert_eq!(holder.ask(&format!("R a {a}")), "R a");
    let granted = token_of(&w1.recv());
    let info = probe.info();
    assert_eq!(
        info_field(&info, "token"),
        Some(granted.to_string()),
        "{info}"
    );
    assert_eq!(info_field(&info, "held").as_deref(), Some("2"), "{info}");
    assert_eq!(info_field(&info, "waiting").as_deref(), Some("2"), "{info}");
    // Once the clock's token floor (in `ceiling`) has passed the last grant,
    // `token` still names that grant: it is the last token issued, not the
    // largest one known.
    let info = wait_for("the clock floor to pass the last grant", DEADLINE, || {
        let info = probe.info();
        let ceiling: u64 = info_field(&info, "ceiling")?.parse().ok()?;
        (ceiling > granted).then_some(info)
    });
    assert_eq!(
        info_field(&info, "token"),
        Some(granted.to_string()),
        "{info}"
    );

    drop(w2);
    drop(holder);
    probe.wait_for_conns(2);
    let info = probe.info();
    assert_eq!(info_field(&info, "waiting").as_deref(), Some("0"), "{info}");
    assert_eq!(
        info_field(&info, "held").as_deref(),
        Some("2"),
        "grants outlive their connections: {info}"
    );
}

// ---------------------------------------------------------------------------
// Fencing tokens (docs/fencing.md)
// ---------------------------------------------------------------------------

#[test]
fn tokens_strictly_increase_across_keys_connections_and_handoffs() {
    let node = Node::start_protocol(&[]);
    let mut clients: Vec<LineClient> = (0..3).map(|_| node.client()).collect();
    let mut probe = node.client();
    let mut last = 0;
    let mut check = |token: u64| {
        assert!(token > last, "token {token} after {last}");
        last = token;
    };
    for round in 0..10 {
        for (i, c) in clients.iter_mut().enumerate() {
            check(c.acquire_now(&format!("t{round}-{i}"), "30"));
        }
    }
    let held = clients[0].acquire_now("shared", "30");
    check(held);
    queue_behind(&mut clients[1], &mut probe, "shared", 1);
    assert_eq!(clients[0].ask(&format!("R shared {held}")), "R shared");
    let handed = token_of(&clients[1].recv());
    check(handed);
    check(clients[2].acquire_now("after", "30"));
    let info = probe.info();
    assert_eq!(info_field(&info, "token"), Some(last.to_string()), "{info}");
}

// ---------------------------------------------------------------------------
// Load
// ---------------------------------------------------------------------------

#[test]
fn a_few_hundred_connections_at_once_are_all_served() {
    let node = Node::start_protocol(&[]);
    let n = 300;
    let mut clients: Vec<LineClient> = (0..n).map(|_| node.client()).collect();
    for (i, c) in clients.iter_mut().enumerate() {
        c.send(&format!("A many{i} 30 0"));
    }
    let mut tokens = Vec::with_capacity(n);
    for (i, c) in clients.iter_mut().enumerate() {
        let answer = c.recv();
        let token = token_of(&answer);
        assert_eq!(answer, format!("A {token} many{i}"));
        tokens.push(token);
    }
    let distinct: HashSet<u64> = tokens.iter().copied().collect();
    assert_eq!(distinct.len(), n, "no two grants share a token");
    let info = clients[0].info();
    assert_eq!(info_field(&info, "held"), Some(n.to_string()), "{info}");
    assert_eq!(info_field(&info, "conns"), Some(n.to_string()), "{info}");
    for (i, c) in clients.iter_mut().enumerate() {
        c.send(&format!("R many{i} {}", tokens[i]));
    }
    for (i, c) in clients.iter_mut().enumerate() {
        assert_eq!(c.recv(), format!("R many{i}"));
    }
    let info = clients[0].info();
    assert_eq!(info_field(&info, "held").as_deref(), Some("0"), "{info}");
}
