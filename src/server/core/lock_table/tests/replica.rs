//! Tests of the replica side: batches of deltas, snapshots, a standby
//! applying them, semaphores included.

use super::*;

#[test]
fn a_key_granted_and_freed_within_one_batch_costs_the_standbys_nothing() {
    let mut h = Harness::replicating();
    let t1 = h.grant(0, C1, "short", 1000);
    h.release(1, C1, "short", t1);
    // Handed from holder to holder and freed: still nothing.
    let t2 = h.grant(1, C1, "passed", 1000);
    h.acquire(1, C2, "passed", 1000, 0);
    let t3 = granted(&h.release(2, C1, "passed", t2))[0].1;
    h.release(2, C2, "passed", t3);
    // A lease that runs out within the batch: nothing either.
    h.grant(2, C3, "expired", 5);
    h.tick(8);
    let t4 = h.grant(8, C1, "kept", 1000);
    assert_eq!(
        h.table.take_deltas(9, 0),
        vec![Delta::grant(key("kept"), t4, 999)]
    );
    // Freed, taken again and freed again in the next batch: the standbys
    // hold the first grant until the free, and never see the second.
    h.release(10, C1, "kept", t4);
    let t5 = h.grant(10, C2, "kept", 1000);
    h.release(11, C2, "kept", t5);
    assert_eq!(
        h.table.take_deltas(12, 0),
        vec![Delta::free(key("kept"), t4)]
    );
}

#[test]
fn a_free_and_a_new_grant_of_one_key_leave_in_that_order() {
    let mut h = Harness::replicating();
    let t1 = h.grant(0, C1, "k", 1000);
    let other = h.grant(0, C1, "other", 1000);
    h.table.take_deltas(0, 0);
    h.release(1, C1, "k", t1);
    h.keep(1, C1, "other", other, 1000);
    let t2 = h.grant(2, C2, "k", 1000);
    assert_eq!(
        h.table.take_deltas(3, 0),
        vec![
            Delta::free(key("k"), t1),
            Delta::grant(key("other"), other, 998),
            Delta::grant(key("k"), t2, 999),
        ]
    );
}

#[test]
fn a_node_that_stops_replicating_drops_its_batch_and_records_nothing() {
    let mut h = Harness::replicating();
    let t1 = h.grant(0, C1, "a", 1000);
    h.table.set_replicating(false);
    assert!(!h.table.has_changes());
    h.release(1, C1, "a", t1);
    h.grant(1, C1, "b", 1000);
    assert!(!h.table.has_changes());
    // Replicating again: a key held from before starts a fresh entry.
    h.table.set_replicating(true);
    let t3 = h.grant(2, C2, "c", 1000);
    assert_eq!(
        h.table.take_deltas(2, 0),
        vec![Delta::grant(key("c"), t3, 1000)]
    );
}

#[test]
fn a_promotion_grace_placeholder_is_never_replicated() {
    let mut h = Harness::replicating();
    h.table.set_grace_until(100);
    // The request waits behind a placeholder, then gives up.
    assert!(h.acquire(0, C1, "k", 1000, 50).is_empty());
    h.tick(50);
    // The placeholder runs out with nobody waiting: no free of token 0.
    h.tick(100);
    assert_eq!(h.table.stats().held, 0);
    assert_eq!(h.table.take_deltas(100, 0), vec![]);
}

#[test]
fn a_new_keys_grant_waits_until_it_is_old_enough_and_is_never_sent_if_freed_first() {
    let mut h = Harness::replicating();
    let short = h.grant(10, C1, "short", 1000);
    h.grant(10, C1, "long", 1000);
    let ready = |h: &Harness| h.table.changes_ready();
    let r = ready(&h);
    assert_eq!(
        (r.urgent, r.young, r.oldest_young_ms, r.settled),
        (false, 2, Some(10), false)
    );
    // Too young at 11: nothing goes, both stay for the next batch.
    assert_eq!(h.table.take_deltas(11, 2), vec![]);
    assert_eq!(ready(&h).oldest_young_ms, Some(10));
    h.release(11, C1, "short", short);
    // A free of a key the standbys hold may wait; the young grant waits
    // until it comes of age.
    let old = h.grant(11, C2, "old", 1000);
    h.table.take_deltas(14, 0);
    h.release(15, C2, "old", old);
    let r = ready(&h);
    assert_eq!((r.urgent, r.young, r.settled), (false, 0, true));
    assert_eq!(
        h.table.take_deltas(15, 2),
        vec![Delta::free(key("old"), old)]
    );
    let young = h.grant(16, C3, "young", 1000);
    assert_eq!(h.table.take_deltas(17, 2), vec![]);
    assert_eq!(
        h.table.take_deltas(18, 2),
        vec![Delta::grant(key("young"), young, 998)]
    );
    let r = ready(&h);
    assert_eq!((r.urgent, r.young, r.settled), (false, 0, false));
}

#[test]
fn one_handover_of_a_held_key_is_urgent_and_a_key_that_keeps_changing_is_not() {
    let mut h = Harness::replicating();
    let t1 = h.grant(0, C1, "k", 1000);
    h.acquire(0, C2, "k", 1000, 0);
    h.acquire(0, C3, "k", 1000, 0);
    h.table.take_deltas(5, 0);
    // One handover: the standbys must hear of it soon.
    let t2 = granted(&h.release(6, C1, "k", t1))[0].1;
    assert!(h.table.changes_ready().urgent);
    // A second change of the same key in the batch: it is hot, and its
    // batch may wait (the standbys' copy is a past state either way).
    h.release(7, C2, "k", t2);
    let r = h.table.changes_ready();
    assert_eq!((r.urgent, r.settled), (false, true));
    let taken = h.table.take_deltas(8, 2);
    assert!(matches!(&taken[..], [Delta::Grant { token, .. }] if *token > t2));
}

#[test]
fn a_standby_fed_the_batches_holds_what_the_active_holds_at_every_take() {
    for seed in 1..=40u64 {
        let mut rng = TestRng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut active = Harness::new();
        active.table.set_replicating(true);
        let mut standby = LockTable::new(0, TableLimits::default(), TokenSource::new(1, 1));
        let keys = ["a", "b", "c", "d", "e"];
        let conns = [C1, C2, C3];
        let mut held: Vec<(usize, u64)> = Vec::new();
        for now in 0..2_000u64 {
            for _ in 0..rng.below(4) {
                let k = rng.below(keys.len() as u64) as usize;
                let conn = conns[rng.below(3) as usize];
                let answers = match rng.below(4) {
                    0 | 1 => {
                        let lease = 1 + rng.below(40);
                        active.acquire(now, conn, keys[k], lease, rng.below(30))
                    }
                    2 => match held.iter().position(|(hk, _)| *hk == k) {
                        Some(i) => active.release(now, conn, keys[k], held[i].1),
                        None => Vec::new(),
                    },
                    _ => match held.iter().position(|(hk, _)| *hk == k) {
                        Some(i) => active.keep(now, conn, keys[k], held[i].1, 1 + rng.below(40)),
                        None => Vec::new(),
                    },
                };
                for (_, answer) in answers {
                    if let Answer::Granted {
                        token, key: got, ..
                    } = answer
                    {
                        let k = keys.iter().position(|k| key(k) == got).expect("a test key");
                        held.retain(|(hk, _)| *hk != k);
                        held.push((k, token));
                    }
                }
            }
            for (_, answer) in active.tick(now) {
                if let Answer::Granted {
                    token, key: got, ..
                } = answer
                {
                    let k = keys.iter().position(|k| key(k) == got).expect("a test key");
                    held.retain(|(hk, _)| *hk != k);
                    held.push((k, token));
                }
            }
            if rng.below(3) == 0 {
                let hold_young = if seed % 2 == 0 { 0 } else { rng.below(4) };
                for delta in active.table.take_deltas(now, hold_young) {
                    standby
                        .apply_delta(now, delta)
                        .expect("the active's own deltas apply");
                }
                standby.check_invariants();
                for k in keys {
                    let on_standby = standby.query_token(&key(k));
                    let on_active = active.table.query_token(&key(k));
                    if hold_young == 0 {
                        assert_eq!(on_standby, on_active, "seed {seed}, key {k} at {now} ms");
                    } else {
                        // A young grant may not have gone yet: the
                        // standby holds nothing then, never a wrong token.
                        assert!(
                            on_standby.is_none() || on_standby == on_active,
                            "seed {seed}, key {k} at {now} ms"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_standby_frees_a_key_held_by_the_token_or_an_older_one_only() {
    let mut standby = Harness::new();
    let grant = |k: &str, token: u64| Delta::grant(key(k), token, 1000);
    let free = |k: &str, token: u64| Delta::free(key(k), token);
    for k in ["older", "same", "newer"] {
        standby.step(|t, _| t.apply_delta(0, grant(k, 500)).expect("applied"));
    }
    // A handover to 600 was coalesced away: its free still frees.
    standby.step(|t, _| t.apply_delta(0, free("older", 600)).expect("applied"));
    standby.step(|t, _| t.apply_delta(0, free("same", 500)).expect("applied"));
    // A free of an older token is stale: the key stays held.
    standby.step(|t, _| t.apply_delta(0, free("newer", 400)).expect("applied"));
    // A free of a key not held is nothing.
    standby.step(|t, _| t.apply_delta(0, free("absent", 700)).expect("applied"));
    assert_eq!(standby.table.query_token(&key("older")), None);
    assert_eq!(standby.table.query_token(&key("same")), None);
    assert_eq!(standby.table.query_token(&key("newer")), Some(500));
    assert_eq!(standby.table.stats().held, 1);
}

#[test]
fn a_standby_refuses_a_grant_that_moves_a_token_down_or_passes_max_keys() {
    let mut standby = Harness::new();
    let grant = |k: &str, token: u64| Delta::grant(key(k), token, 1000);
    standby.step(|t, _| t.apply_delta(0, grant("a", 500)).expect("new key"));
    standby.step(|t, _| t.apply_delta(0, grant("a", 500)).expect("an extension"));
    standby.step(|t, _| t.apply_delta(0, grant("a", 600)).expect("a new grant"));
    standby.step(|t, _| {
        assert_eq!(
            t.apply_delta(0, grant("a", 550)),
            Err("a grant below the key's current token")
        );
    });
    assert_eq!(standby.table.query_token(&key("a")), Some(600));
    let limits = TableLimits {
        max_waiting_per_conn: 8,
        max_keys: 1,
    };
    let mut small = LockTable::new(0, limits, TokenSource::new(0, 1));
    assert_eq!(small.apply_delta(0, grant("a", 16)), Ok(()));
    assert_eq!(
        small.apply_delta(0, grant("b", 32)),
        Err("a grant past --max-keys")
    );
    assert_eq!(small.stats().held, 1);
    assert_eq!(
        small.load_snapshot(0, vec![grant("x", 48), grant("y", 64)]),
        Err((1, "a grant past --max-keys"))
    );
    assert_eq!(small.stats().held, 1);
}

#[test]
fn a_standby_table_follows_snapshot_and_deltas_and_issues_tokens_above_them() {
    let mut active = Harness::new();
    let t1 = active.grant(0, C1, "a", 1000);
    active.grant(0, C1, "b", 1000);
    let mut standby = Harness::new();
    let snapshot = active.table.snapshot(100);
    standby.step(|t, _| t.load_snapshot(100, snapshot).expect("all applied"));
    assert_eq!(standby.table.stats().held, 2);
    standby.step(|t, _| {
        t.apply_delta(100, Delta::free(key("a"), t1))
            .expect("applied")
    });
    standby.step(|t, _| {
        t.apply_delta(100, Delta::Ceiling(t1 + 1_000_000))
            .expect("applied")
    });
    assert_eq!(standby.table.stats().held, 1);
    // Promoted: the held key is still held, new tokens are above the ceiling.
    assert!(standby.acquire(150, C2, "b", 1000, 0).is_empty());
    assert!(standby.grant(150, C2, "a", 1000) > t1 + 1_000_000);
    // A replicated lease runs out on the standby too.
    standby.tick(1100);
    assert_eq!(
        standby.table.stats().held,
        2,
        "b expired and went to its waiter"
    );
    assert_eq!(standby.table.stats().waiting, 0);
}

#[test]
fn redirecting_waiters_answers_each_with_m_in_arrival_order() {
    let mut h = Harness::new();
    h.grant(0, C1, "k", 1000);
    h.acquire(0, C2, "k", 1000, 0);
    h.acquire(0, C2, "k", 1000, 50);
    h.tick(50);
    let answers = h.step(|t, o| t.redirect_waiters(Some("h:1"), o));
    let moved = Answer::Moved {
        active: Some("h:1".into()),
        op: Op::Acquire,
        key: Some(key("k")),
    };
    assert_eq!(
        answers,
        vec![(C2, moved), (C2, Answer::Timeout { key: key("k") })]
    );
    assert_eq!(h.table.stats().waiting, 0);
}

#[test]
fn tokens_strictly_increase_across_keys_handoffs_and_expiries() {
    let mut h = Harness::new();
    let mut seen = vec![h.table.stats().last_token];
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let conns = [C1, C2, C3];
    let mut held: Vec<(String, u64)> = Vec::new();
    for now in 0..3000u64 {
        let r = next();
        let k = format!("k{}", r % 5);
        let conn = conns[(r >> 8) as usize % 3];
        let answers = match (r >> 16) % 6 {
            0 | 1 => h.acquire(now, conn, &k, 1 + (r >> 24) % 50, (r >> 32) % 40),
            2 if !held.is_empty() => {
                let (k, token) = held.swap_remove((r >> 24) as usize % held.len());
                h.release(now, conn, &k, token)
            }
            3 => h.step(|t, _| t.handle_disconnect(conn)),
            4 if !held.is_empty() => {
                let (k, token) = held[(r >> 24) as usize % held.len()].clone();
                h.keep(now, conn, &k, token, 30)
            }
            _ => h.tick(now),
        };
        for (_, answer) in answers {
            if let Answer::Granted { token, key, .. } = answer {
                assert!(token > *seen.last().unwrap_or(&0));
                seen.push(token);
                held.push((key.to_string(), token));
            }
        }
    }
    assert!(seen.len() > 100, "the run granted enough to mean something");
}

#[test]
fn a_semaphores_grants_replicate_with_their_limit_slots_values_and_leases() {
    let mut h = Harness::replicating();
    let mut standby = Harness::new();
    let mut tokens = Vec::new();
    for (i, conn) in [C1, C2, C3].into_iter().enumerate() {
        let answers = h.acquire_with(
            0,
            conn,
            "s",
            1000 + i as u64,
            0,
            with_value(Some(3), &format!("v{i}")),
        );
        tokens.push(granted(&answers)[0].1);
    }
    let t = h.grant(0, C1, "m", 1000);
    let deltas = h.table.take_deltas(10, 0);
    assert_eq!(
        deltas,
        [
            sem_grant("s", tokens[0], 990, 3, 0, Some("v0")),
            sem_grant("s", tokens[1], 991, 3, 1, Some("v1")),
            sem_grant("s", tokens[2], 992, 3, 2, Some("v2")),
            Delta::grant(key("m"), t, 990),
        ]
    );
    let apply = |standby: &mut Harness, now: u64, deltas: Vec<Delta>| {
        for delta in deltas {
            standby.step(|table, _| table.apply_delta(now, delta).expect("applied"));
        }
    };
    apply(&mut standby, 10, deltas);
    assert_eq!(table_state(&standby.table), table_state(&h.table));
    // A release with nobody waiting: the free of that slot only.
    h.release(20, C1, "s", tokens[1]);
    let deltas = h.table.take_deltas(20, 0);
    assert_eq!(
        deltas,
        [Delta::Free {
            key: key("s"),
            token: tokens[1],
            slot: 1
        }]
    );
    apply(&mut standby, 20, deltas);
    assert_eq!(table_state(&standby.table), table_state(&h.table));
    // A new grant takes the freed slot; then a full key queues, and a
    // release hands slot 0 to the waiter: grants of the key, read when
    // the batch is taken (the handover replaces slot 0 on the standby).
    let (t3, slot) = h.grant_slot(30, C2, "s", 3);
    assert_eq!(slot, 1);
    assert!(
        h.acquire_with(30, C3, "s", 500, 0, with_value(Some(3), "next"))
            .is_empty()
    );
    let answers = h.release(31, C1, "s", tokens[0]);
    let t4 = granted(&answers)[0].1;
    assert!(h.keep(32, C3, "s", tokens[2], 5000).len() == 1);
    let mut deltas = h.table.take_deltas(40, 0);
    // A key's grants come in no particular order.
    deltas.sort_by_key(|d| match d {
        Delta::Grant { slot, .. } => *slot,
        _ => u32::MAX,
    });
    assert_eq!(
        deltas,
        [
            sem_grant("s", t4, 491, 3, 0, Some("next")),
            sem_grant("s", t3, 990, 3, 1, None),
            sem_grant("s", tokens[2], 4992, 3, 2, Some("v2")),
        ]
    );
    apply(&mut standby, 40, deltas);
    assert_eq!(table_state(&standby.table), table_state(&h.table));
    // The standby's leases run out when the active's do.
    standby.tick(530);
    assert_eq!(standby.holders("s").len(), 3);
    standby.tick(531);
    assert_eq!(standby.holders("s").len(), 2);
    // A plain mutex that gets a value (a handover to an acquire with
    // one) and loses it again is replicated both ways.
    assert!(
        h.acquire_with(40, C2, "m", 100, 0, with_value(None, "who"))
            .is_empty()
    );
    let t5 = granted(&h.release(41, C1, "m", t))[0].1;
    let deltas = h.table.take_deltas(41, 0);
    assert_eq!(deltas, [sem_grant("m", t5, 100, 1, 0, Some("who"))]);
    apply(&mut standby, 41, deltas);
    assert_eq!(standby.holders("m"), [(t5, 0, Some("who".to_string()))]);
    assert!(h.acquire(42, C3, "m", 100, 0).is_empty());
    let t6 = granted(&h.release(43, C2, "m", t5))[0].1;
    let deltas = h.table.take_deltas(43, 0);
    assert_eq!(deltas, [Delta::grant(key("m"), t6, 100)]);
    apply(&mut standby, 43, deltas);
    assert_eq!(standby.holders("m"), [(t6, 0, None)]);
    assert_eq!(standby.table.sems.len(), 1, "the mutex has no Sem again");
}

#[test]
fn a_semaphore_with_values_round_trips_through_a_snapshot_with_its_leases() {
    let mut h = Harness::new();
    for (i, conn) in [C1, C2, C3].into_iter().enumerate() {
        h.acquire_with(
            0,
            conn,
            "s",
            100 * (i as u64 + 1),
            0,
            with_value(Some(4), &format!("host-{i}")),
        );
    }
    let (t1, _) = h.grant_slot(0, C1, "s", 4);
    h.release(1, C1, "s", h.holders("s")[1].0);
    h.acquire_with(0, C2, "elect", 1000, 0, with_value(Some(1), "leader"));
    h.grant(0, C3, "plain", 50);
    let snapshot = h.table.snapshot(10);
    assert_eq!(snapshot.len(), 5, "a grant per holder: {snapshot:?}");
    let mut standby = Harness::new();
    standby.step(|t, _| t.load_snapshot(10, snapshot).expect("loaded"));
    assert_eq!(table_state(&standby.table), table_state(&h.table));
    assert_eq!(
        standby.holders("s").iter().map(|h| h.1).collect::<Vec<_>>(),
        [0, 2, 3],
        "slot 1 was released"
    );
    // The leases run out on the standby when they do on the active
    // (slot 0: 100 ms from 0).
    standby.tick(99);
    assert_eq!(standby.holders("s").len(), 3);
    standby.tick(100);
    assert_eq!(standby.holders("s").len(), 2);
    assert_eq!(
        standby.table.key_view(&key("plain")).map(|v| v.limit()),
        None
    );
    // A promoted standby serves the same slots: the lowest free is 0.
    standby.table.observe_token(t1);
    assert_eq!(standby.grant_slot(101, C1, "s", 4).1, 0);
    assert_eq!(standby.grant_slot(101, C1, "s", 4).1, 1);
    assert_eq!(
        refused_reason(&standby.acquire_with(101, C1, "s", 10, 0, ask(3))),
        Some(Reason::LimitMismatch)
    );
    assert!(
        standby.acquire_with(101, C1, "s", 10, 0, ask(4)).is_empty(),
        "full: it waits"
    );
}

#[test]
fn a_standby_refuses_a_semaphore_grant_out_of_range_moved_or_past_max_keys() {
    let mut standby = Harness::with_limits(TableLimits {
        max_keys: 4,
        ..TableLimits::default()
    });
    let apply = |standby: &mut Harness, d: Delta| {
        let before = table_state(&standby.table);
        let got = standby.table.apply_delta(0, d);
        standby.table.check_invariants();
        if got.is_err() {
            assert_eq!(
                table_state(&standby.table),
                before,
                "a refusal changes nothing"
            );
        }
        got
    };
    assert_eq!(
        apply(&mut standby, sem_grant("s", 16, 10, 0, 0, None)),
        Err("a limit outside 1..=10000")
    );
    assert_eq!(
        apply(&mut standby, sem_grant("s", 16, 10, 10_001, 0, None)),
        Err("a limit outside 1..=10000")
    );
    assert_eq!(
        apply(&mut standby, sem_grant("s", 16, 10, 3, 3, None)),
        Err("a slot at or above its key's limit")
    );
    assert_eq!(
        apply(&mut standby, sem_grant("s", 0, 10, 3, 0, None)),
        Err("token 0")
    );
    assert_eq!(
        apply(&mut standby, sem_grant("s", 16, 10, 3, 1, Some("a"))),
        Ok(())
    );
    assert_eq!(
        apply(&mut standby, sem_grant("s", 16, 10, 3, 2, None)),
        Err("a grant moved to another slot")
    );
    assert_eq!(
        apply(&mut standby, sem_grant("s", 32, 10, 3, 2, None)),
        Ok(())
    );
    assert_eq!(
        apply(&mut standby, sem_grant("s", 17, 10, 3, 2, None)),
        Err("a grant below the key's current token")
    );
    assert_eq!(
        apply(&mut standby, sem_grant("s", 48, 10, 3, 0, None)),
        Ok(())
    );
    assert_eq!(
        apply(&mut standby, sem_grant("m", 64, 10, 1, 0, None)),
        Ok(())
    );
    // Four grants held: a fifth is past --max-keys, a handover is not.
    assert_eq!(
        apply(&mut standby, sem_grant("n", 80, 10, 1, 0, None)),
        Err("a grant past --max-keys")
    );
    assert_eq!(
        apply(&mut standby, sem_grant("s", 96, 10, 3, 2, Some("b"))),
        Ok(())
    );
    // A free of an older token leaves a slot's newer grant; the free of
    // the slot's token (or a newer one) frees it.
    assert_eq!(
        apply(
            &mut standby,
            Delta::Free {
                key: key("s"),
                token: 32,
                slot: 2
            }
        ),
        Ok(())
    );
    assert_eq!(standby.holders("s").len(), 3);
    assert_eq!(
        apply(
            &mut standby,
            Delta::Free {
                key: key("s"),
                token: 100,
                slot: 2
            }
        ),
        Ok(())
    );
    assert_eq!(
        standby.holders("s"),
        [(48, 0, None), (16, 1, Some("a".to_string()))]
    );
    // The key with another limit: the active's replaces it.
    assert_eq!(
        apply(&mut standby, sem_grant("s", 112, 10, 2, 1, None)),
        Ok(())
    );
    assert_eq!(standby.holders("s"), [(112, 1, None)]);
    assert_eq!(standby.table.stats().holders, 2);
}

#[test]
fn a_snapshot_with_two_grants_in_one_slot_or_two_limits_for_a_key_is_refused() {
    for (entries, why) in [
        (
            vec![
                sem_grant("s", 16, 10, 2, 0, None),
                sem_grant("s", 32, 10, 2, 0, None),
            ],
            "two grants in one slot in a snapshot",
        ),
        (
            vec![
                sem_grant("s", 16, 10, 2, 0, None),
                sem_grant("s", 16, 10, 2, 0, None),
            ],
            "two grants in one slot in a snapshot",
        ),
        (
            vec![
                sem_grant("s", 16, 10, 2, 0, None),
                sem_grant("s", 32, 10, 3, 1, None),
            ],
            "two limits for one key in a snapshot",
        ),
        (
            vec![
                sem_grant("s", 16, 10, 1, 0, None),
                sem_grant("s", 32, 10, 1, 0, None),
            ],
            "more holders than the key's limit in a snapshot",
        ),
        (
            vec![
                sem_grant("s", 16, 10, 2, 0, None),
                Delta::free(key("s"), 16),
            ],
            "a free inside a snapshot",
        ),
    ] {
        let mut standby = Harness::new();
        let got = standby.table.load_snapshot(0, entries);
        standby.table.check_invariants();
        assert_eq!(got, Err((1, why)));
        assert_eq!(
            standby.holders("s"),
            [(16, 0, None)],
            "{why}: the first stays"
        );
    }
}

#[test]
fn a_standby_fed_the_batches_holds_every_semaphores_holders_at_every_take() {
    // Random traffic on keys of limits 1 to 3 with and without values,
    // a limit sometimes changed (refused while held, taken once free):
    // after every take the standby holds the active's holders exactly
    // (tokens, slots, values, expiries), and so does a table loaded
    // from a snapshot.
    for seed in 1..=40u64 {
        let mut rng = TestRng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut active = Harness::replicating();
        let mut standby = LockTable::new(0, TableLimits::default(), TokenSource::new(1, 1));
        let keys = ["a", "b", "c", "d"];
        let conns = [C1, C2, C3];
        let mut held: Vec<(usize, u64)> = Vec::new();
        for now in 0..1_500u64 {
            for _ in 0..rng.below(4) {
                let k = rng.below(keys.len() as u64) as usize;
                let conn = conns[rng.below(3) as usize];
                let mine: Vec<usize> = (0..held.len()).filter(|&i| held[i].0 == k).collect();
                let pick =
                    (!mine.is_empty()).then(|| held[mine[rng.below(mine.len() as u64) as usize]].1);
                let answers = match (rng.below(5), pick) {
                    (0..=2, _) => {
                        let limit = if rng.below(20) == 0 {
                            1 + rng.below(3)
                        } else {
                            1 + k as u64 % 3
                        };
                        let ask = Ask {
                            limit: Some(limit as u32),
                            value: (rng.below(2) == 0)
                                .then(|| value(&format!("v{}", rng.below(9)))),
                        };
                        let lease = 1 + rng.below(40);
                        active.acquire_with(now, conn, keys[k], lease, rng.below(30), ask)
                    }
                    (3, Some(token)) => active.release(now, conn, keys[k], token),
                    (_, Some(token)) => active.keep(now, conn, keys[k], token, 1 + rng.below(40)),
                    _ => Vec::new(),
                };
                for (_, answer) in answers.into_iter().chain(Vec::new()) {
                    if let Answer::Granted {
                        token, key: got, ..
                    } = answer
                    {
                        let k = keys.iter().position(|k| key(k) == got).expect("a test key");
                        held.push((k, token));
                    }
                }
            }
            for (_, answer) in active.tick(now) {
                if let Answer::Granted {
                    token, key: got, ..
                } = answer
                {
                    let k = keys.iter().position(|k| key(k) == got).expect("a test key");
                    held.push((k, token));
                }
            }
            held.retain(|&(k, token)| active.holders(keys[k]).iter().any(|h| h.0 == token));
            if rng.below(3) == 0 {
                let hold_young = if seed % 2 == 0 { 0 } else { rng.below(4) };
                for delta in active.table.take_deltas(now, hold_young) {
                    standby
                        .apply_delta(now, delta)
                        .expect("the active's own deltas apply");
                }
                standby.check_invariants();
                let on_active = table_state(&active.table);
                let on_standby = table_state(&standby);
                if hold_young == 0 {
                    assert_eq!(on_standby, on_active, "seed {seed} at {now} ms");
                } else {
                    // A young key may not have gone yet: the standby
                    // holds nothing of it then, never a wrong state.
                    for entry in &on_standby {
                        assert!(
                            on_active.contains(entry),
                            "seed {seed} at {now} ms: {entry:?}"
                        );
                    }
                }
            }
            if rng.below(50) == 0 {
                let mut fresh = LockTable::new(0, TableLimits::default(), TokenSource::new(2, 1));
                fresh
                    .load_snapshot(now, active.table.snapshot(now))
                    .expect("a snapshot loads");
                fresh.check_invariants();
                assert_eq!(
                    table_state(&fresh),
                    table_state(&active.table),
                    "seed {seed} at {now} ms"
                );
            }
        }
    }
}

#[test]
fn a_semaphores_grant_and_release_within_a_batch_of_a_new_key_costs_nothing() {
    let mut h = Harness::replicating();
    let (a, _) = h.grant_slot(0, C1, "new", 3);
    let (b, _) = h.grant_slot(0, C2, "new", 3);
    h.release(1, C1, "new", a);
    h.release(1, C2, "new", b);
    assert_eq!(h.table.take_deltas(2, 0), []);
    // A key the standbys hold: each grant that ended is freed by slot.
    let (a, _) = h.grant_slot(3, C1, "k", 3);
    let (b, _) = h.grant_slot(3, C1, "k", 3);
    assert_eq!(h.table.take_deltas(3, 0).len(), 2);
    h.release(4, C1, "k", b);
    h.release(4, C1, "k", a);
    assert_eq!(
        h.table.take_deltas(5, 0),
        [
            Delta::Free {
                key: key("k"),
                token: b,
                slot: 1
            },
            Delta::Free {
                key: key("k"),
                token: a,
                slot: 0
            },
        ]
    );
}

#[test]
fn a_promotion_grace_placeholder_of_a_semaphore_lets_every_slot_go_when_it_ends() {
    let mut h = Harness::new();
    h.table.set_grace_until(1000);
    for conn in [C1, C2, C3] {
        assert!(h.acquire_with(10, conn, "s", 500, 0, ask(2)).is_empty());
    }
    let answers = h.tick(1000);
    let slots: Vec<(ConnId, Option<u32>)> = answers
        .iter()
        .map(|(c, a)| match a {
            Answer::Granted { slot, .. } => (*c, *slot),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        slots,
        [(C1, Some(0)), (C2, Some(1))],
        "both slots, in line order"
    );
    assert_eq!(h.table.stats().waiting, 1);
}

#[test]
fn a_snapshot_in_pieces_holds_every_grant_once_and_leaves_new_keys_to_their_batch() {
    let mut h = Harness::replicating();
    for i in 0..10 {
        h.grant(0, C1, &format!("k{i}"), 1000);
    }
    let (_, slot) = h.grant_slot(0, C2, "pool", 3);
    assert_eq!(slot, 0);
    h.grant_slot(0, C3, "pool", 3);
    // Keys freed leave holes in the table, which pieces step over.
    for i in [2, 3, 4] {
        let token = h.table.query_token(&key(&format!("k{i}"))).expect("held");
        h.release(0, C1, &format!("k{i}"), token);
    }
    h.table.take_deltas(1, 0);
    // A key granted since the last batch: its batch carries it (or
    // nothing, if it is freed first), not a piece.
    h.grant(1, C1, "young", 1000);
    let mut all = Vec::new();
    let mut from = 0;
    let mut pieces = 0;
    loop {
        let mut piece = Vec::new();
        let next = h.table.snapshot_from(1, from, 2, &mut piece);
        // A key's grants go in one piece: at most one key over.
        assert!(piece.len() <= 3, "{piece:?}");
        pieces += 1;
        all.extend(piece);
        match next {
            Some(next) => {
                assert!(next > from, "it moves on");
                from = next;
            }
            None => break,
        }
    }
    assert!(pieces >= 5, "{pieces} pieces");
    let sorted = |mut v: Vec<Delta>| {
        v.sort_by_key(|d| format!("{d:?}"));
        v
    };
    let whole: Vec<Delta> = h
        .table
        .snapshot(1)
        .into_iter()
        .filter(|d| !matches!(d, Delta::Grant { key: k, .. } if *k == key("young")))
        .collect();
    assert_eq!(whole.len(), 9, "seven mutexes and two holders of pool");
    assert_eq!(sorted(all), sorted(whole));
    // Once its batch went, the young key is in the pieces too.
    h.table.take_deltas(2, 0);
    let mut piece = Vec::new();
    assert_eq!(h.table.snapshot_from(2, 0, 100, &mut piece), None);
    assert_eq!(piece.len(), 10);
}
