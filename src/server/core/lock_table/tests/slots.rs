//! Tests of semaphores: slots, limits, values and their holders.

use super::*;

#[test]
fn a_limit_of_three_grants_three_at_once_in_slots_0_1_2_with_increasing_tokens() {
    let mut h = Harness::new();
    let (t0, s0) = h.grant_slot(0, C1, "s", 3);
    let (t1, s1) = h.grant_slot(1, C2, "s", 3);
    let (t2, s2) = h.grant_slot(2, C3, "s", 3);
    assert_eq!((s0, s1, s2), (0, 1, 2));
    assert!(t0 < t1 && t1 < t2);
    assert!(
        h.acquire_with(3, C1, "s", 1000, 0, ask(3)).is_empty(),
        "a fourth waits"
    );
    assert_eq!(h.table.stats().held, 1, "one key");
    assert_eq!(h.table.stats().holders, 3, "three grants");
    assert_eq!(h.table.stats().waiting, 1);
}

#[test]
fn a_freed_slot_goes_to_the_head_of_the_line_with_a_new_token() {
    let mut h = Harness::new();
    let (_, _) = h.grant_slot(0, C1, "s", 2);
    let (t1, s1) = h.grant_slot(0, C1, "s", 2);
    assert!(h.acquire_with(1, C2, "s", 500, 0, ask(2)).is_empty());
    assert!(h.acquire_with(2, C3, "s", 500, 0, ask(2)).is_empty());
    let answers = h.release(10, C1, "s", t1);
    match answers.as_slice() {
        [
            (
                C2,
                Answer::Granted {
                    token,
                    slot: Some(slot),
                    ..
                },
            ),
            (C1, Answer::Released { .. }),
        ] => {
            assert!(*token > t1, "a new token, above every earlier one");
            assert_eq!(*slot, s1, "the slot just freed");
        }
        other => panic!("{other:?}"),
    }
    // The new holder's lease is fresh from the handover.
    let newest = h
        .table
        .key_view(&key("s"))
        .expect("held")
        .newest()
        .expect("a holder");
    assert_eq!(newest.expiry_ms, 510);
    assert_eq!(h.table.stats().waiting, 1, "C3 still waits: no barging");
    assert_eq!(
        refused_reason(&h.acquire_with(11, C1, "s", 500, 0, ask(2))),
        None,
        "a newcomer queues behind C3"
    );
    assert_eq!(h.table.stats().waiting, 2);
}

#[test]
fn an_acquire_naming_another_limit_is_refused_and_changes_nothing() {
    let mut h = Harness::new();
    let (t0, _) = h.grant_slot(0, C1, "s", 3);
    let before = (h.holders("s"), h.table.stats());
    assert_eq!(
        refused_reason(&h.acquire_with(1, C2, "s", 1000, 0, ask(2))),
        Some(Reason::LimitMismatch)
    );
    assert_eq!(
        refused_reason(&h.acquire(1, C2, "s", 1000, 0)),
        Some(Reason::LimitMismatch),
        "a plain A names limit 1"
    );
    assert_eq!((h.holders("s"), h.table.stats()), before, "nothing changed");
    // A mutex refuses a limit too.
    h.grant(2, C1, "m", 1000);
    assert_eq!(
        refused_reason(&h.acquire_with(3, C2, "m", 1000, 0, ask(4))),
        Some(Reason::LimitMismatch)
    );
    // Once the key has neither holder nor waiter, any limit registers it.
    assert_eq!(h.release(4, C1, "s", t0).len(), 1);
    let (first, _) = h.grant_slot(5, C2, "s", 2);
    h.grant_slot(6, C2, "s", 2);
    // A refusal keeps its place behind the connection's earlier waiter
    // for the key: C3 hears of the mismatch after its grant.
    assert!(h.acquire_with(7, C3, "s", 1000, 0, ask(2)).is_empty());
    assert!(h.acquire_with(8, C3, "s", 1000, 0, ask(3)).is_empty());
    match h.release(9, C2, "s", first).as_slice() {
        [
            (C3, Answer::Granted { slot: Some(0), .. }),
            (
                C3,
                Answer::Error {
                    reason: Reason::LimitMismatch,
                    ..
                },
            ),
            (C2, Answer::Released { .. }),
        ] => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_lowest_free_slot_is_taken() {
    let mut h = Harness::new();
    let grants: Vec<(u64, u32)> = (0..4).map(|i| h.grant_slot(i, C1, "s", 4)).collect();
    assert_eq!(grants.iter().map(|g| g.1).collect::<Vec<_>>(), [0, 1, 2, 3]);
    h.release(10, C1, "s", grants[2].0);
    h.release(11, C1, "s", grants[0].0);
    assert_eq!(h.grant_slot(12, C2, "s", 4).1, 0, "the lowest of 0 and 2");
    assert_eq!(h.grant_slot(13, C2, "s", 4).1, 2);
    let slots: Vec<u32> = h.holders("s").iter().map(|h| h.1).collect();
    assert_eq!(slots, [0, 1, 2, 3]);
}

#[test]
fn max_keys_counts_every_holder() {
    let mut h = Harness::with_limits(TableLimits {
        max_waiting_per_conn: 10,
        max_keys: 3,
    });
    h.grant_slot(0, C1, "s", 5);
    h.grant_slot(0, C1, "s", 5);
    h.grant(0, C1, "m", 1000);
    assert_eq!(h.table.stats().holders, 3);
    assert_eq!(
        refused_reason(&h.acquire_with(1, C2, "s", 1000, 0, ask(5))),
        Some(Reason::TooManyKeys),
        "a free slot, but the table holds max-keys grants"
    );
    assert_eq!(
        refused_reason(&h.acquire(1, C2, "other", 1000, 0)),
        Some(Reason::TooManyKeys)
    );
    assert!(
        h.acquire(1, C2, "m", 1000, 0).is_empty(),
        "a held mutex still queues"
    );
}

#[test]
fn an_expired_holder_frees_its_slot_on_time_for_the_next_waiter() {
    let mut h = Harness::new();
    let (_, _) = h.grant_slot(0, C1, "s", 2);
    let short = match h.acquire_with(0, C1, "s", 100, 0, ask(2)).as_slice() {
        [
            (
                _,
                Answer::Granted {
                    token,
                    slot: Some(1),
                    ..
                },
            ),
        ] => *token,
        other => panic!("{other:?}"),
    };
    assert!(h.acquire_with(5, C2, "s", 300, 0, ask(2)).is_empty());
    assert!(h.tick(99).is_empty(), "not before its lease runs out");
    match h.tick(100).as_slice() {
        [
            (
                C2,
                Answer::Granted {
                    token,
                    slot: Some(1),
                    ..
                },
            ),
        ] => assert!(*token > short),
        other => panic!("expected C2 granted slot 1 at 100 ms, got {other:?}"),
    }
    assert_eq!(h.table.metrics().expiries, 1);
    // The expired holder's token no longer holds the key.
    assert_eq!(
        h.release(101, C1, "s", short),
        vec![(C1, Answer::NotHeld { key: key("s") })]
    );
}

#[test]
fn a_plain_acquire_is_answered_without_a_slot_and_one_naming_a_limit_with_it() {
    let mut h = Harness::new();
    assert!(matches!(
        h.acquire(0, C1, "a", 1000, 0).as_slice(),
        [(_, Answer::Granted { slot: None, .. })]
    ));
    assert_eq!(h.grant_slot(0, C1, "b", 1).1, 0, "limit 1 names slot 0");
    // A waiter is answered the way it asked, whatever the holder did.
    assert!(h.acquire(1, C2, "b", 1000, 0).is_empty());
    let token = h.holders("b")[0].0;
    assert!(matches!(
        h.release(2, C1, "b", token).as_slice(),
        [(C2, Answer::Granted { slot: None, .. }), _]
    ));
}

#[test]
fn a_value_is_kept_with_its_grant_and_handed_on_only_with_the_next_holders_own() {
    let mut h = Harness::new();
    let with_value = |limit, v: &str| Ask {
        limit: Some(limit),
        value: Some(value(v)),
    };
    let answers = h.acquire_with(0, C1, "lead", 1000, 0, with_value(1, "10.0.0.1:80"));
    let Some((_, Answer::Granted { token, .. })) = answers.first() else {
        panic!("{answers:?}")
    };
    assert_eq!(h.holders("lead"), [(*token, 0, Some("10.0.0.1:80".into()))]);
    // A waiter without a value: the next holder has none.
    assert!(h.acquire_with(1, C2, "lead", 1000, 0, ask(1)).is_empty());
    let next = granted(&h.release(2, C1, "lead", *token))[0].1;
    assert_eq!(h.holders("lead"), [(next, 0, None)]);
    // ... and one with a value: its own.
    assert!(
        h.acquire_with(3, C3, "lead", 1000, 0, with_value(1, "b"))
            .is_empty()
    );
    let third = granted(&h.release(4, C2, "lead", next))[0].1;
    assert_eq!(h.holders("lead"), [(third, 0, Some("b".into()))]);
    // Semaphore holders each carry their own.
    let t = granted(&h.acquire_with(5, C1, "s", 1000, 0, with_value(3, "x")))[0].1;
    let u = granted(&h.acquire_with(5, C2, "s", 1000, 0, with_value(3, "y")))[0].1;
    assert_eq!(
        h.holders("s"),
        [(t, 0, Some("x".into())), (u, 1, Some("y".into()))]
    );
    // The first grant leaving moves another into its place: values stay
    // with their grants.
    h.release(6, C1, "s", t);
    assert_eq!(h.holders("s"), [(u, 1, Some("y".into()))]);
}

#[test]
fn query_shows_the_newest_grant_of_a_semaphore() {
    let mut h = Harness::new();
    h.acquire_with(0, C1, "s", 5000, 0, ask(3));
    h.acquire_with(10, C1, "s", 300, 0, ask(3));
    let newest = granted(&h.acquire_with(20, C2, "s", 1000, 0, ask(3)))[0].1;
    assert!(h.acquire_with(30, C3, "s", 1000, 0, ask(3)).is_empty());
    match h.query(40, C1, "s").as_slice() {
        [
            (
                _,
                Answer::Queried {
                    token,
                    ms_left,
                    waiting,
                    ..
                },
            ),
        ] => {
            assert_eq!(*token, newest, "the largest token");
            assert_eq!(*ms_left, 980, "the newest grant's lease left");
            assert_eq!(*waiting, 1);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn release_and_keep_name_any_holder_by_its_token() {
    let mut h = Harness::new();
    let grants: Vec<(u64, u32)> = (0..3).map(|_| h.grant_slot(0, C1, "s", 3)).collect();
    assert_eq!(
        h.keep(10, C2, "s", grants[1].0, 5000),
        vec![(C2, Answer::Kept { key: key("s") })]
    );
    assert_eq!(h.keep(10, C2, "s", 12345, 5000).len(), 1);
    assert!(matches!(
        h.keep(10, C2, "s", 12345, 5000).as_slice(),
        [(
            _,
            Answer::Error {
                reason: Reason::NotHeld,
                ..
            }
        )]
    ));
    // Only the kept grant survives the others' leases.
    assert!(h.tick(1000).is_empty());
    assert_eq!(h.holders("s"), [(grants[1].0, 1, None)]);
    assert_eq!(
        h.release(1001, C3, "s", grants[1].0),
        vec![(C3, Answer::Released { key: key("s") })]
    );
    assert!(
        h.table.key_view(&key("s")).is_none(),
        "a key with no holder is gone"
    );
}

#[test]
fn a_watched_key_replaced_by_the_actives_limit_tells_its_watchers_and_lives() {
    // A standby whose loop watches `s` (a W on its way to its `M`) is
    // told by its active that `s` has another limit: the key it held
    // is replaced, and the watchers hear of it while it is still there
    // to be named (before, the lookup of the removed key panicked).
    let mut standby = Harness::new();
    standby.table.watchers_mut().set(0, key("s"), true);
    assert_eq!(
        standby
            .table
            .apply_delta(0, sem_grant("s", 16, 10, 2, 1, None)),
        Ok(())
    );
    assert_eq!(
        standby
            .table
            .apply_delta(0, sem_grant("s", 32, 10, 3, 0, Some("a"))),
        Ok(())
    );
    standby.table.check_invariants();
    assert_eq!(standby.holders("s"), [(32, 0, Some("a".to_string()))]);
    let mut out = Outbox::default();
    standby.table.take_watch_lines(&mut out);
    assert!(
        !out.answers.is_empty(),
        "the watching loop is told of the change"
    );
}

#[test]
fn a_semaphores_room_follows_its_holders_not_its_past_or_its_limit() {
    // Many holders of a key of limit 10000 come and go; one stays. The
    // key then costs what one holder needs: --max-keys bounds memory by
    // the grants held now.
    let mut h = Harness::new();
    let mut tokens = Vec::new();
    for i in 0..2000u64 {
        let answers = h.acquire_with(
            0,
            C1,
            "big",
            100_000 + i,
            0,
            Ask {
                limit: Some(10_000),
                value: None,
            },
        );
        tokens.push(granted(&answers)[0].1);
    }
    for &t in &tokens[1..] {
        h.release(1, C1, "big", t);
    }
    h.table.check_invariants();
    let view = h.table.key_view(&key("big")).expect("held");
    assert_eq!(view.holders().count(), 1);
    let idx = h
        .table
        .index
        .get(&h.table.keys, &key("big"))
        .expect("indexed");
    let sem = h.table.sem(idx).expect("a semaphore");
    assert!(
        sem.more.capacity() <= 8,
        "room for {} grants kept",
        sem.more.capacity()
    );
    assert!(sem.taken.len() <= 1, "{} slot words kept", sem.taken.len());
}

#[test]
fn every_change_of_a_keys_holders_is_a_notification_point() {
    let mut h = Harness::new();
    let changes = |h: &Harness| h.table.stats().holder_changes;
    let (t, _) = h.grant_slot(0, C1, "s", 2);
    assert_eq!(changes(&h), 1, "a grant");
    h.acquire_with(0, C1, "s", 100, 0, ask(2));
    assert_eq!(changes(&h), 2, "a second grant");
    h.acquire_with(0, C2, "s", 100, 0, ask(2));
    assert_eq!(changes(&h), 2, "a waiter changes no holder");
    h.release(1, C1, "s", t);
    assert_eq!(changes(&h), 3, "a handover");
    h.keep(2, C1, "s", 12345, 10);
    h.query(2, C1, "s");
    assert_eq!(changes(&h), 3, "a refused keep and a query change nothing");
    h.tick(101);
    assert_eq!(changes(&h), 5, "two expiries");
}

/// Acquires, releases (right and wrong tokens), keeps, expiries, wait
/// timeouts, limit mismatches and disconnects on a few keys of limits
/// 1 to 4, with every invariant checked after every step (the
/// harness), and what the answers say checked against the table.
#[test]
fn random_semaphore_traffic_keeps_every_invariant() {
    let base = std::env::var("BATON_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::UNIX_EPOCH
                .elapsed()
                .map_or(1, |d| d.as_nanos() as u64)
        });
    println!("random_semaphore_traffic_keeps_every_invariant: BATON_TEST_SEED={base}");
    for round in 0..20u64 {
        let seed = base.wrapping_add(round);
        let mut rng = TestRng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut h = Harness::with_limits(TableLimits {
            max_waiting_per_conn: 6,
            max_keys: 9,
        });
        let keys = ["a", "b", "c"];
        let limits: Vec<u32> = keys.iter().map(|_| 1 + rng.below(4) as u32).collect();
        let conns = [C1, C2, C3, ConnId(4)];
        let mut issued: Vec<(usize, u64)> = Vec::new();
        let mut last_token = 0;
        let mut grants = 0;
        let mut now = 0;
        for _ in 0..3000 {
            now += rng.below(8);
            let k = rng.below(keys.len() as u64) as usize;
            let conn = conns[rng.below(conns.len() as u64) as usize];
            let answers = match rng.below(10) {
                0..=3 => {
                    let limit = if rng.below(12) == 0 {
                        1 + rng.below(4) as u32
                    } else {
                        limits[k]
                    };
                    let ask = Ask {
                        limit: (limit > 1 || rng.below(2) == 0).then_some(limit),
                        value: (rng.below(3) == 0).then(|| value("v")),
                    };
                    h.acquire_with(now, conn, keys[k], 1 + rng.below(60), rng.below(40), ask)
                }
                4 | 5 => {
                    let token = match issued.iter().rfind(|g| g.0 == k) {
                        Some(g) if rng.below(5) > 0 => g.1,
                        _ => 1 + rng.below(last_token.max(1)),
                    };
                    h.release(now, conn, keys[k], token)
                }
                6 => {
                    let token = issued.get(rng.below(issued.len().max(1) as u64) as usize);
                    let token = token.map_or(7, |g| g.1);
                    h.keep(now, conn, keys[k], token, 1 + rng.below(60))
                }
                7 => h.query(now, conn, keys[k]),
                8 => h.step(|t, _| t.handle_disconnect(conn)),
                _ => h.tick(now),
            };
            for (_, answer) in &answers {
                if let Answer::Granted {
                    token,
                    key: got,
                    slot,
                } = answer
                {
                    grants += 1;
                    assert!(*token > last_token, "seed {seed}: tokens increase");
                    last_token = *token;
                    let k = keys
                        .iter()
                        .position(|k| key(k) == *got)
                        .expect("a test key");
                    let view = h.table.key_view(got).expect("a granted key is held");
                    let mine = view
                        .holders()
                        .find(|h| h.token == *token)
                        .expect("seed {seed}: the grant holds the key");
                    assert!(mine.slot < view.limit(), "seed {seed}");
                    if let Some(slot) = slot {
                        assert_eq!(*slot, mine.slot, "seed {seed}: the slot answered");
                    }
                    issued.push((k, *token));
                }
            }
            if issued.len() > 64 {
                issued.drain(..32);
            }
        }
        assert!(
            grants > 200,
            "seed {seed}: the run granted enough to mean something"
        );
    }
}
