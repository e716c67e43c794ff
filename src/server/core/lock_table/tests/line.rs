//! Tests of requests, the FIFO line, timeouts and deferred answers.

use super::*;

#[test]
fn grants_handoffs_expiries_and_timeouts_are_counted_with_their_latencies() {
    let mut h = Harness::new();
    let t1 = h.grant(0, C1, "a", 1000);
    h.acquire(10, C2, "a", 100, 0); // waits for a release
    h.acquire(20, C3, "a", 100, 50); // waits, then times out
    assert_eq!(h.tick(70).len(), 1, "C3 timed out");
    let to =
        |answers: Vec<(ConnId, Answer)>| granted(&answers).iter().map(|g| g.0).collect::<Vec<_>>();
    assert_eq!(to(h.release(110, C1, "a", t1)), vec![C2]);
    let m = h.table.metrics();
    assert_eq!((m.grants, m.handoffs, m.timeouts, m.expiries), (2, 1, 1, 0));
    assert_eq!((m.round_released, m.round_expired.len()), (1, 0));
    let wait = m.grant_wait();
    assert_eq!((wait.count, wait.sum_us), (2, 100_000), "0 ms and 100 ms");
    // C2's lease (deadline 210) runs out at 212; C1 was waiting.
    h.acquire(150, C1, "a", 100, 0);
    h.table.metrics_mut().begin_round();
    assert_eq!(to(h.tick(212)), vec![C1]);
    let m = h.table.metrics();
    assert_eq!((m.grants, m.handoffs, m.expiries), (3, 2, 1));
    assert_eq!(
        (m.round_released, m.round_expired.as_slice()),
        (0, &[210][..])
    );
    let late = m.expiry_lateness.snapshot();
    assert_eq!((late.count, late.sum_us), (1, 2_000));
    // A lease found run out by a request counts too; no waiter, no handoff.
    h.query(400, C2, "a");
    let m = h.table.metrics();
    assert_eq!((m.handoffs, m.expiries), (2, 2));
    assert_eq!(m.expiry_lateness.snapshot().sum_us, 2_000 + 88_000);
}

#[test]
fn a_free_key_is_granted_at_once_with_a_new_token() {
    let mut h = Harness::new();
    let t1 = h.grant(0, C1, "a", 1000);
    let t2 = h.grant(0, C1, "b", 1000);
    assert!(t1 > 1000 && t2 > t1);
    assert_eq!(h.table.stats().held, 2);
}

#[test]
fn a_held_key_queues_and_goes_to_waiters_in_fifo_order() {
    let mut h = Harness::new();
    let t1 = h.grant(0, C1, "k", 10_000);
    assert!(h.acquire(1, C2, "k", 5000, 0).is_empty());
    assert!(h.acquire(2, C3, "k", 5000, 0).is_empty());
    assert!(h.acquire(3, C1, "k", 5000, 0).is_empty());
    let answers = h.release(10, C1, "k", t1);
    assert_eq!(answers.len(), 2);
    assert_eq!(answers[1], (C1, Answer::Released { key: key("k") }));
    let g2 = granted(&answers);
    assert_eq!(g2.len(), 1);
    assert_eq!(g2[0].0, C2);
    assert!(g2[0].1 > t1);
    let g3 = granted(&h.release(20, C2, "k", g2[0].1));
    assert_eq!(g3[0].0, C3);
    let g4 = granted(&h.release(30, C3, "k", g3[0].1));
    assert_eq!(g4[0].0, C1);
    assert!(g4[0].1 > g3[0].1 && g3[0].1 > g2[0].1);
    h.release(40, C1, "k", g4[0].1);
    assert_eq!(
        h.table.stats().held,
        0,
        "a released key with no waiter leaves the table"
    );
}

#[test]
fn a_release_answers_the_next_holder_before_the_releaser() {
    // Across connections the grant goes out first: it is what the
    // waiters are waiting for. On one connection, answers keep the order
    // of the requests.
    let mut h = Harness::new();
    let t1 = h.grant(0, C1, "k", 10_000);
    h.acquire(1, C2, "k", 5000, 0);
    let answers = h.release(2, C1, "k", t1);
    assert!(matches!(
        answers[..],
        [(C2, Answer::Granted { .. }), (C1, Answer::Released { .. })]
    ));
    let t2 = granted(&answers)[0].1;
    h.acquire(3, C2, "k", 5000, 0);
    let answers = h.release(4, C2, "k", t2);
    assert!(matches!(
        answers[..],
        [(C2, Answer::Released { .. }), (C2, Answer::Granted { .. })]
    ));
}

#[test]
fn a_handed_over_key_gets_a_fresh_lease_from_the_handover() {
    let mut h = Harness::new();
    let t1 = h.grant(0, C1, "k", 10_000);
    h.acquire(0, C2, "k", 300, 0);
    let t2 = granted(&h.release(1000, C1, "k", t1))[0].1;
    match h.query(1100, C3, "k").as_slice() {
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
            assert_eq!((*token, *ms_left, *waiting), (t2, 200, 0));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_expired_lease_goes_to_the_next_waiter_on_time_without_a_request() {
    let mut h = Harness::new();
    let t1 = h.grant(0, C1, "k", 500);
    h.acquire(10, C2, "k", 1000, 0);
    assert!(h.tick(499).is_empty(), "not one millisecond early");
    assert_eq!(h.table.next_wake_ms().map(|w| w <= 500), Some(true));
    let answers = h.tick(500);
    let g = granted(&answers);
    assert_eq!(g.len(), 1);
    assert_eq!(g[0].0, C2);
    assert!(g[0].1 > t1);
    assert_eq!(
        h.release(600, C1, "k", t1),
        vec![(C1, Answer::NotHeld { key: key("k") })]
    );
}

#[test]
fn an_expired_lease_with_no_waiter_frees_the_key() {
    let mut h = Harness::new();
    h.grant(0, C1, "k", 500);
    assert!(h.tick(500).is_empty());
    assert_eq!(h.table.stats().held, 0);
    assert_eq!(h.table.next_wake_ms(), None);
}

#[test]
fn an_expired_lease_is_re_registered_even_before_its_timer_runs() {
    let mut h = Harness::new();
    let t1 = h.grant(0, C1, "k", 500);
    // No tick: the timer has not run, but the lease is over.
    let t2 = h.grant(700, C2, "k", 500);
    assert!(t2 > t1);
    assert_eq!(
        h.release(701, C1, "k", t1),
        vec![(C1, Answer::NotHeld { key: key("k") })]
    );
}

#[test]
fn a_wait_that_runs_out_answers_t_and_grants_nothing() {
    let mut h = Harness::new();
    let t1 = h.grant(0, C1, "k", 10_000);
    assert!(h.acquire(0, C2, "k", 1000, 300).is_empty());
    assert!(h.tick(299).is_empty());
    assert_eq!(h.tick(300), vec![(C2, Answer::Timeout { key: key("k") })]);
    assert_eq!(h.table.stats().waiting, 0);
    let answers = h.release(400, C1, "k", t1);
    assert_eq!(answers, vec![(C1, Answer::Released { key: key("k") })]);
    assert_eq!(h.table.stats().held, 0);
}

#[test]
fn wait_zero_waits_without_limit() {
    let mut h = Harness::new();
    let t1 = h.grant(0, C1, "k", 86_400_000);
    h.acquire(0, C2, "k", 1000, 0);
    assert!(h.tick(86_399_999).is_empty());
    let t2 = granted(&h.release(86_399_999, C1, "k", t1));
    assert_eq!(t2[0].0, C2);
}

#[test]
fn a_waiter_whose_connection_closes_is_never_granted() {
    let mut h = Harness::new();
    let t1 = h.grant(0, C1, "k", 10_000);
    h.acquire(0, C2, "k", 1000, 5000);
    h.acquire(0, C3, "k", 1000, 0);
    h.step(|t, _| t.handle_disconnect(C2));
    let g = granted(&h.release(10, C1, "k", t1));
    assert_eq!(g[0].0, C3);
    assert!(
        h.tick(6000).iter().all(|(c, _)| *c != C2),
        "its wait timer is gone too"
    );
}

#[test]
fn a_grant_survives_its_connection_and_is_released_from_another() {
    let mut h = Harness::new();
    let t1 = h.grant(0, C1, "k", 10_000);
    h.step(|t, _| t.handle_disconnect(C1));
    assert_eq!(h.table.stats().held, 1);
    assert_eq!(
        h.release(5, C2, "k", t1),
        vec![(C2, Answer::Released { key: key("k") })]
    );
}

#[test]
fn a_release_with_a_token_that_does_not_hold_the_key_changes_nothing() {
    let mut h = Harness::new();
    let t1 = h.grant(0, C1, "k", 10_000);
    let n = vec![(C2, Answer::NotHeld { key: key("k") })];
    assert_eq!(h.release(1, C2, "k", t1 + 1), n);
    assert_eq!(
        h.release(1, C2, "other", t1),
        vec![(C2, Answer::NotHeld { key: key("other") })]
    );
    assert_eq!(h.table.stats().held, 1);
    h.release(2, C1, "k", t1);
    assert_eq!(h.release(3, C2, "k", t1), n, "already released");
}

#[test]
fn keep_extends_the_lease_and_rearms_the_timer() {
    let mut h = Harness::new();
    let t1 = h.grant(0, C1, "k", 500);
    assert_eq!(
        h.keep(400, C1, "k", t1, 1000),
        vec![(C1, Answer::Kept { key: key("k") })]
    );
    assert!(
        h.tick(1399).is_empty(),
        "the old expiry at 500 no longer fires"
    );
    assert_eq!(h.table.stats().held, 1);
    h.tick(1400);
    assert_eq!(h.table.stats().held, 0);
}

#[test]
fn keep_with_a_lost_grant_says_not_held() {
    let mut h = Harness::new();
    let t1 = h.grant(0, C1, "k", 500);
    h.tick(500);
    let refused = vec![(
        C1,
        Answer::Error {
            op: Some(Op::Keep),
            key: Some(key("k")),
            reason: Reason::NotHeld,
        },
    )];
    assert_eq!(h.keep(600, C1, "k", t1, 1000), refused);
    let t2 = h.grant(700, C2, "k", 500);
    assert_eq!(
        h.keep(701, C1, "k", t1, 1000),
        refused,
        "a newer holder's key"
    );
    assert_eq!(h.keep(701, C2, "k", t2, 1000).len(), 1);
}

#[test]
fn query_reports_holder_time_left_and_queue_length() {
    let mut h = Harness::new();
    let free = vec![(
        C1,
        Answer::Queried {
            key: key("k"),
            token: 0,
            ms_left: 0,
            waiting: 0,
        },
    )];
    assert_eq!(h.query(0, C1, "k"), free);
    let t1 = h.grant(0, C1, "k", 1000);
    h.acquire(0, C2, "k", 1000, 0);
    h.acquire(0, C3, "k", 1000, 0);
    assert_eq!(
        h.query(250, C1, "k"),
        vec![(
            C1,
            Answer::Queried {
                key: key("k"),
                token: t1,
                ms_left: 750,
                waiting: 2
            }
        )]
    );
}

#[test]
fn a_later_timeout_never_overtakes_an_earlier_answer_for_the_same_key() {
    let mut h = Harness::new();
    let t1 = h.grant(0, C1, "k", 10_000);
    h.acquire(0, C2, "k", 1000, 0); // earlier, waits without limit
    h.acquire(0, C2, "k", 1000, 100); // later, times out first
    h.acquire(0, C3, "k", 1000, 100); // another connection: not held back
    assert_eq!(h.tick(100), vec![(C3, Answer::Timeout { key: key("k") })]);
    assert_eq!(
        h.table.stats().waiting,
        1,
        "the timed-out waiter left the queue"
    );
    let answers = h.release(200, C1, "k", t1);
    let to_c2: Vec<&Answer> = answers
        .iter()
        .filter(|(c, _)| *c == C2)
        .map(|(_, a)| a)
        .collect();
    assert!(matches!(to_c2[0], Answer::Granted { .. }));
    assert_eq!(to_c2[1], &Answer::Timeout { key: key("k") });
    assert_eq!(to_c2.len(), 2);
}

#[test]
fn chained_timeouts_come_out_in_arrival_order_after_the_first_answer() {
    let mut h = Harness::new();
    let t1 = h.grant(0, C1, "k", 10_000);
    h.acquire(0, C2, "k", 1000, 500); // w1
    h.acquire(0, C2, "k", 1000, 200); // w2
    h.acquire(0, C2, "k", 1000, 100); // w3
    assert!(h.tick(200).is_empty());
    let t = Answer::Timeout { key: key("k") };
    assert_eq!(h.tick(500), vec![(C2, t.clone()), (C2, t.clone()), (C2, t)]);
    assert_eq!(h.table.stats().waiting, 0);
    h.release(501, C1, "k", t1);
    assert_eq!(h.table.stats().held, 0);
}

#[test]
fn a_refusal_waits_behind_an_earlier_waiter_for_the_same_key() {
    let mut h = Harness::new();
    let t1 = h.grant(0, C1, "k", 10_000);
    h.acquire(0, C2, "k", 1000, 0);
    let refused =
        h.step(|t, o| t.handle_refused(C2, Op::Acquire, Some(key("k")), Reason::BadLease, o));
    assert!(refused.is_empty());
    let other =
        h.step(|t, o| t.handle_refused(C2, Op::Acquire, Some(key("x")), Reason::BadLease, o));
    assert_eq!(other.len(), 1, "no earlier waiter for x: answered at once");
    let answers = h.release(1, C1, "k", t1);
    let to_c2: Vec<&Answer> = answers
        .iter()
        .filter(|(c, _)| *c == C2)
        .map(|(_, a)| a)
        .collect();
    assert!(matches!(to_c2[0], Answer::Granted { .. }));
    assert!(matches!(
        to_c2[1],
        Answer::Error {
            reason: Reason::BadLease,
            ..
        }
    ));
}

#[test]
fn a_connection_over_its_waiting_limit_is_refused() {
    let mut h = Harness::with_limits(TableLimits {
        max_waiting_per_conn: 2,
        max_keys: 100,
    });
    h.grant(0, C1, "a", 1000);
    h.grant(0, C1, "b", 1000);
    h.grant(0, C1, "c", 1000);
    h.acquire(0, C2, "a", 1000, 0);
    h.acquire(0, C2, "b", 1000, 0);
    let answers = h.acquire(0, C2, "c", 1000, 0);
    assert!(matches!(
        answers.as_slice(),
        [(
            _,
            Answer::Error {
                reason: Reason::TooManyWaiting,
                ..
            }
        )]
    ));
    assert!(
        h.acquire(0, C3, "c", 1000, 0).is_empty(),
        "other connections are not affected"
    );
}

#[test]
fn deferred_refusals_past_the_limit_cut_the_connection_off() {
    let mut h = Harness::with_limits(TableLimits {
        max_waiting_per_conn: 2,
        max_keys: 100,
    });
    h.grant(0, C1, "a", 1000);
    h.acquire(0, C2, "a", 1000, 0);
    h.acquire(0, C2, "a", 1000, 0);
    h.acquire(0, C2, "a", 1000, 0);
    h.acquire(0, C2, "a", 1000, 0);
    assert!(h.out.closes.is_empty());
    h.acquire(0, C2, "a", 1000, 0);
    assert_eq!(h.out.closes, vec![C2]);
    assert_eq!(h.table.stats().waiting, 0, "its waiters are gone");
}

#[test]
fn a_full_table_refuses_new_keys_but_serves_held_ones() {
    let mut h = Harness::with_limits(TableLimits {
        max_waiting_per_conn: 10,
        max_keys: 1,
    });
    h.grant(0, C1, "a", 1000);
    let answers = h.acquire(0, C1, "b", 1000, 0);
    assert!(matches!(
        answers.as_slice(),
        [(
            _,
            Answer::Error {
                reason: Reason::TooManyKeys,
                ..
            }
        )]
    ));
    assert!(
        h.acquire(0, C2, "a", 1000, 0).is_empty(),
        "a held key still queues"
    );
}

#[test]
fn during_a_promotion_grace_unknown_keys_wait_until_it_ends() {
    let mut h = Harness::new();
    let held = h.grant(0, C1, "known", 10_000);
    h.table.set_grace_until(1000);
    // A key it knows as held behaves as usual.
    assert_eq!(h.release(10, C1, "known", held).len(), 1);
    // A key it does not know waits for the grace, in FIFO order.
    assert!(h.acquire(10, C2, "k", 500, 0).is_empty());
    assert!(h.acquire(20, C3, "k", 500, 0).is_empty());
    match h.query(30, C1, "k").as_slice() {
        [
            (
                _,
                Answer::Queried {
                    token: 0,
                    ms_left: 970,
                    waiting: 2,
                    ..
                },
            ),
        ] => {}
        other => panic!("{other:?}"),
    }
    // A waiter whose wait ends during the grace gets T, nothing else.
    assert!(h.acquire(30, C1, "w", 500, 100).is_empty());
    assert_eq!(h.tick(130), vec![(C1, Answer::Timeout { key: key("w") })]);
    assert!(h.tick(999).is_empty());
    let g = granted(&h.tick(1000));
    assert_eq!(g.len(), 1);
    assert_eq!(g[0].0, C2);
    h.table.set_grace_until(0);
    assert!(
        h.grant(1001, C1, "fresh", 500) > 0,
        "after the grace, grants are immediate"
    );
}

#[test]
fn a_batch_holds_each_keys_last_state_counted_from_when_it_is_taken() {
    let mut h = Harness::replicating();
    let t1 = h.grant(0, C1, "k", 1000);
    h.acquire(0, C2, "k", 500, 0);
    h.keep(10, C1, "k", t1, 2000);
    assert_eq!(
        h.table.take_deltas(15, 0),
        vec![Delta::grant(key("k"), t1, 1995)],
        "a grant and its extension: one line, the lease left at the take"
    );
    // Held before this batch: a handover, then the free, is one free.
    let t2 = granted(&h.release(20, C1, "k", t1))[0].1;
    assert!(h.table.has_changes());
    h.tick(520);
    assert_eq!(h.table.take_deltas(520, 0), vec![Delta::free(key("k"), t2)]);
    assert!(!h.table.has_changes());
    assert_eq!(h.table.take_deltas(521, 0), vec![]);
}
