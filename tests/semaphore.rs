//! Real-process tests of semaphores on a single `batond` node: a key held
//! by up to `limit` grants at once, each with its own token, lease and slot
//! (docs/protocol.md, "Semaphores"), seen from TCP clients.
//!
//! Every test starts its own node on a free loopback port (killed by PID when
//! the test ends) and talks raw protocol lines to it. Waits are polls with a
//! deadline; the short silences (`assert_silent_for`) only prove that
//! something does NOT happen during an interval.

mod common;

use std::time::{Duration, Instant};

use common::{DEADLINE, LineClient, Node, token_of, wait_for};

/// How long a test watches to show that nothing arrives.
const SILENCE: Duration = Duration::from_millis(300);

/// `A <token> <key> <slot>`: the token and the slot; fails the test on any
/// other answer.
fn token_and_slot(answer: &str, key: &str) -> (u64, u32) {
    let fields: Vec<&str> = answer.split(' ').collect();
    assert!(
        fields.len() == 4 && fields[0] == "A" && fields[2] == key,
        "expected `A <token> {key} <slot>`, got {answer:?}"
    );
    let slot = fields[3]
        .parse()
        .unwrap_or_else(|_| panic!("the slot of {answer:?}"));
    (token_of(answer), slot)
}

/// Acquire `key` naming `limit`, expecting an immediate grant.
fn grant(client: &mut LineClient, key: &str, lease: &str, limit: u32) -> (u64, u32) {
    let answer = client.ask(&format!("A {key} {lease} 0 {limit}"));
    token_and_slot(&answer, key)
}

#[test]
fn a_limit_of_three_grants_three_at_once_and_the_fourth_gets_the_freed_slot() {
    let node = Node::start_protocol(&[]);
    let mut clients: Vec<LineClient> = (0..4).map(|_| node.client()).collect();
    let grants: Vec<(u64, u32)> = clients[..3]
        .iter_mut()
        .map(|c| grant(c, "pool", "30", 3))
        .collect();
    assert_eq!(
        grants.iter().map(|g| g.1).collect::<Vec<_>>(),
        [0, 1, 2],
        "slots 0, 1, 2"
    );
    assert!(
        grants[0].0 < grants[1].0 && grants[1].0 < grants[2].0,
        "distinct, increasing tokens: {grants:?}"
    );
    // The fourth waits in line.
    clients[3].send("A pool 30 0 3");
    wait_for("the fourth to wait", DEADLINE, || {
        (clients[0].query("pool").waiting == 1).then_some(())
    });
    clients[3].assert_silent_for(SILENCE);
    // The holder of slot 1 releases: the fourth gets slot 1, a greater token.
    assert_eq!(clients[1].ask(&format!("R pool {}", grants[1].0)), "R pool");
    let (token, slot) = token_and_slot(&clients[3].recv(), "pool");
    assert_eq!(slot, 1, "the slot just freed");
    assert!(token > grants[2].0, "above every token before it");
    // Query shows the newest grant (the largest token), nobody waiting.
    let q = clients[0].query("pool");
    assert_eq!((q.token, q.waiting), (token, 0));
    assert!(q.ms_left > 0 && q.ms_left <= 30_000, "{q:?}");
}

#[test]
fn an_expired_holder_frees_its_slot_on_time_for_the_waiter() {
    let node = Node::start_protocol(&[]);
    let mut a = node.client();
    let mut b = node.client();
    let (_, _) = grant(&mut a, "pool", "30", 2);
    // The lease starts after this instant: the grant may not come sooner.
    let asked = Instant::now();
    let (short, short_slot) = grant(&mut a, "pool", "0.2", 2);
    assert_eq!(short_slot, 1);
    b.send("A pool 30 0 2");
    let answer = b.recv_within(DEADLINE);
    let waited = asked.elapsed();
    let (token, slot) = token_and_slot(&answer, "pool");
    assert_eq!(slot, 1, "the expired holder's slot");
    assert!(token > short);
    assert!(
        waited >= Duration::from_millis(200),
        "granted only once the lease ran out ({waited:?})"
    );
    // The expired token holds nothing now.
    assert_eq!(a.ask(&format!("R pool {short}")), "N pool");
    assert_eq!(a.ask(&format!("K pool {short} 5")), "E K pool not-held");
}

#[test]
fn an_acquire_naming_another_limit_is_refused_until_the_key_is_free() {
    let node = Node::start_protocol(&[]);
    let mut a = node.client();
    let (token, _) = grant(&mut a, "k", "30", 3);
    assert_eq!(a.ask("A k 30 0 2"), "E A k limit-mismatch");
    assert_eq!(
        a.ask("A k 30 0"),
        "E A k limit-mismatch",
        "a plain A is limit 1"
    );
    let q = a.query("k");
    assert_eq!((q.token, q.waiting), (token, 0), "nothing changed");
    // A mutex refuses a limit too.
    a.acquire_now("m", "30");
    assert_eq!(a.ask("A m 30 0 4"), "E A m limit-mismatch");
    // Free again: any limit registers it afresh.
    assert_eq!(a.ask(&format!("R k {token}")), "R k");
    assert_eq!(grant(&mut a, "k", "30", 2).1, 0);
}

#[test]
fn bad_limits_and_bad_values_are_refused_and_the_connection_stays() {
    let node = Node::start_protocol(&[]);
    let mut a = node.client();
    for limit in ["0", "10001", "x", "-1", "1.5"] {
        assert_eq!(
            a.ask(&format!("A k 30 0 {limit}")),
            "E A k bad-limit",
            "limit {limit:?}"
        );
    }
    let too_long = "v".repeat(251);
    assert_eq!(a.ask(&format!("A k 30 0 1 {too_long}")), "E A k bad-value");
    a.send_raw(b"A k 30 0 1 a\x7fb\n");
    assert_eq!(a.recv(), "E A k bad-value");
    // `-` alone is how a watch line says "no value": never a value.
    assert_eq!(a.ask("A k 30 0 2 -"), "E A k bad-value");
    assert_eq!(
        a.ask("A k 30 0 1 v extra"),
        "E A k extra-fields",
        "at most a limit and a value"
    );
    // Nothing was granted, and the connection still serves.
    assert_eq!(a.query("k").token, 0);
    let longest = "v".repeat(250);
    assert_eq!(
        grant_line(&mut a, &format!("A k 30 0 10000 {longest}"), "k"),
        0
    );
}

/// Send an acquire line expected to be granted at once with a slot; the slot.
fn grant_line(client: &mut LineClient, line: &str, key: &str) -> u32 {
    token_and_slot(&client.ask(line), key).1
}

#[test]
fn a_plain_acquire_is_answered_without_a_slot_and_limit_one_with_slot_zero() {
    let node = Node::start_protocol(&[]);
    let mut a = node.client();
    let mut b = node.client();
    let token = a.acquire_now("plain", "30");
    assert!(token > 0);
    assert_eq!(
        grant(&mut a, "named", "30", 1),
        (token_of_query(&mut a, "named"), 0)
    );
    // A value on a mutex: the grant is answered the same way.
    let answer = a.ask("A leader 30 0 1 10.0.0.7:8080");
    assert_eq!(token_and_slot(&answer, "leader").1, 0);
    // A plain waiter on a key registered by a plain A is answered plainly.
    b.send("A plain 30 0");
    wait_for("b to wait", DEADLINE, || {
        (a.query("plain").waiting == 1).then_some(())
    });
    assert_eq!(a.ask(&format!("R plain {token}")), "R plain");
    let next = b.recv();
    assert_eq!(next, format!("A {} plain", token_of(&next)));
}

fn token_of_query(client: &mut LineClient, key: &str) -> u64 {
    client.query(key).token
}

#[test]
fn max_keys_counts_every_holder_of_a_semaphore() {
    let node = Node::start_protocol(&["--max-keys", "3"]);
    let mut a = node.client();
    grant(&mut a, "pool", "30", 5);
    grant(&mut a, "pool", "30", 5);
    a.acquire_now("m", "30");
    assert_eq!(
        a.ask("A pool 30 0 5"),
        "E A pool too-many-keys",
        "a free slot, but three grants are held"
    );
    assert_eq!(a.ask("A other 30 0"), "E A other too-many-keys");
    let info = a.info();
    assert!(info.contains(" held=2 "), "held counts keys: {info}");
}

#[test]
fn release_and_keep_name_any_holder_by_its_token_from_any_connection() {
    let node = Node::start_protocol(&[]);
    let mut a = node.client();
    let mut b = node.client();
    let grants: Vec<(u64, u32)> = (0..3).map(|_| grant(&mut a, "pool", "30", 3)).collect();
    assert_eq!(b.ask(&format!("K pool {} 50", grants[0].0)), "K pool");
    assert_eq!(b.ask(&format!("R pool {}", grants[1].0)), "R pool");
    assert_eq!(
        b.ask(&format!("R pool {}", grants[1].0)),
        "N pool",
        "released once"
    );
    // The freed slot 1 is the lowest free: the next grant takes it.
    assert_eq!(grant(&mut b, "pool", "30", 3).1, 1);
    drop(a);
    // Grants survive their connection closing.
    let q = b.query("pool");
    assert!(q.token > grants[2].0, "the newest is b's: {q:?}");
    assert_eq!(b.ask(&format!("R pool {}", grants[2].0)), "R pool");
}
