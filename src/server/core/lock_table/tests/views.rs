//! Tests of the contention view.

use super::*;

#[test]
fn a_key_is_contended_from_its_first_waiter_until_its_line_empties() {
    let mut h = Harness::new();
    let t = h.grant(0, C1, "a", 1000);
    h.grant(0, C1, "b", 1000);
    assert_eq!(h.table.contended(), 0, "held is not contended");
    h.acquire(10, C2, "a", 100, 0);
    h.acquire(30, C3, "a", 100, 0);
    assert_eq!(contended_by(&h, 50, By::Waiting), owned(&[("a", 2, 40)]));
    // The first waiter is granted: the second is the oldest now.
    h.release(60, C1, "a", t);
    assert_eq!(contended_by(&h, 70, By::Waiting), owned(&[("a", 1, 40)]));
    // Its connection closes: the line is empty, the key is held only.
    h.step(|t, _| t.handle_disconnect(C3));
    assert_eq!(h.table.contended(), 0);
    assert!(contended_by(&h, 80, By::Age).is_empty());
}

#[test]
fn the_oldest_waiter_follows_timeouts_expiries_and_disconnects() {
    let mut h = Harness::new();
    h.grant(0, C1, "k", 1000);
    h.acquire(100, C2, "k", 500, 50); // times out at 150
    h.acquire(110, C3, "k", 500, 0);
    h.acquire(120, C2, "k", 500, 0);
    assert_eq!(contended_by(&h, 140, By::Age), owned(&[("k", 3, 40)]));
    h.tick(151);
    assert_eq!(contended_by(&h, 160, By::Age), owned(&[("k", 2, 50)]));
    // The lease runs out at 1000: C3 is handed the key, C2 waits on.
    let handed = h.tick(1001);
    assert_eq!(
        granted(&handed).iter().map(|g| g.0).collect::<Vec<_>>(),
        [C3]
    );
    assert_eq!(contended_by(&h, 1010, By::Age), owned(&[("k", 1, 890)]));
    h.step(|t, _| t.handle_disconnect(C2));
    assert!(contended_by(&h, 1020, By::Age).is_empty());
    assert_eq!(h.table.contended(), 0);
}

#[test]
fn the_view_orders_keys_and_shows_holders_values_and_times() {
    let mut h = Harness::new();
    // Tokens carry the wall clock: a round at unix 1_000_000 ms.
    h.table
        .observe_token(crate::server::core::tokens::clock_floor(1_000_000));
    h.grant(0, C1, "one", 5000);
    let (t0, _) = h.grant_slot(0, C1, "sem", 2);
    h.acquire_with(
        0,
        C2,
        "sem",
        300,
        0,
        Ask {
            limit: Some(2),
            value: Some(value("web-2")),
        },
    );
    h.acquire(5, C2, "one", 100, 0);
    h.acquire_with(10, C3, "sem", 100, 0, ask(2));
    h.acquire(20, C3, "one", 100, 0);
    h.acquire(30, C1, "one", 100, 0);
    assert_eq!(
        contended_by(&h, 100, By::Waiting),
        owned(&[("one", 3, 95), ("sem", 1, 90)])
    );
    // "one"'s oldest waiter came at 5, "sem"'s at 10.
    assert_eq!(
        contended_by(&h, 100, By::Age),
        owned(&[("one", 3, 95), ("sem", 1, 90)])
    );
    let ask = KeysAsk {
        top_waiting: 1,
        top_age: 0,
        lookups: vec![key("sem"), key("nobody")],
    };
    let view = h.table.contention_view(100, 1_000_250, &ask);
    assert_eq!(view.contended, 2);
    assert_eq!(view.by_waiting.len(), 1);
    assert!(view.by_age.is_empty());
    let (k, sem) = &view.lookups[0];
    assert_eq!(*k, key("sem"));
    let sem = sem.as_ref().expect("held");
    assert_eq!((sem.limit, sem.waiting, sem.oldest_wait_ms), (2, 1, 90));
    let holders: Vec<_> = sem
        .holders
        .iter()
        .map(|h| (h.slot, h.value.clone(), h.held_ms, h.ms_left))
        .collect();
    assert_eq!(
        holders,
        [(0, None, 250, 900), (1, Some(value("web-2")), 250, 200)]
    );
    assert_eq!(sem.holders[0].token, t0, "longest held first");
    assert_eq!(view.lookups[1], (key("nobody"), None));
}

#[test]
fn a_listed_key_shows_its_longest_held_holders_and_counts_the_rest() {
    let mut h = Harness::new();
    let limit = (MAX_LISTED_HOLDERS + 5) as u32;
    let mut tokens = Vec::new();
    for _ in 0..limit {
        tokens.push(h.grant_slot(0, C1, "many", limit).0);
    }
    h.acquire_with(1, C2, "many", 100, 0, ask(limit));
    let ask = KeysAsk {
        top_waiting: 5,
        top_age: 5,
        lookups: vec![key("many")],
    };
    let view = h.table.contention_view(2, 0, &ask);
    let listed = &view.by_age[0];
    assert_eq!(listed.holders.len(), MAX_LISTED_HOLDERS);
    assert_eq!(listed.more_holders, 5);
    assert_eq!(listed.holders[0].token, tokens[0]);
    let looked_up = view.lookups[0].1.as_ref().expect("held");
    assert_eq!(
        (looked_up.holders.len(), looked_up.more_holders),
        (limit as usize, 0)
    );
}

#[test]
fn a_standby_views_its_replicated_holders_and_redirected_waiters_leave_the_set() {
    let mut h = Harness::new();
    h.grant(0, C1, "a", 1000);
    h.acquire(1, C2, "a", 100, 0);
    h.acquire(1, C3, "b", 100, 0); // granted at once
    h.acquire(2, C1, "b", 100, 0);
    assert_eq!(h.table.contended(), 2);
    h.step(|t, o| t.redirect_waiters(Some("elsewhere:1"), o));
    assert_eq!(h.table.contended(), 0);
    // A standby's table: a snapshot, then deltas; held, nobody waits.
    let mut standby = Harness::new();
    let grant = Delta::grant(key("r"), 77 << 20, 500);
    standby.step(|t, _| t.load_snapshot(0, vec![grant]).expect("loads"));
    let view = standby.table.contention_view(
        10,
        90,
        &KeysAsk {
            top_waiting: 20,
            top_age: 20,
            lookups: vec![key("r")],
        },
    );
    assert_eq!(view.contended, 0);
    let entry = view.lookups[0].1.as_ref().expect("replicated");
    assert_eq!((entry.waiting, entry.oldest_wait_ms), (0, 0));
    assert_eq!(entry.holders.len(), 1);
    assert_eq!(
        (entry.holders[0].held_ms, entry.holders[0].ms_left),
        (13, 490)
    );
}
