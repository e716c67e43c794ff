//! Tests of the peer-input checks and of the clock window.

use super::*;

#[test]
fn forged_tokens_ceilings_and_leases_are_refused_or_left_out_even_from_a_proved_peer() {
    let params = ClusterParams {
        max_lease_ms: 60_000,
        ..ClusterParams::with_detect(DETECT)
    };
    let core = linked_with(0, params);
    let now = at(2);
    let grant = |token: u64, ms_left: u64| {
        PeerMsg::Delta(Delta::grant(Key::new(b"k").expect("key"), token, ms_left))
    };
    let check = |msg: &PeerMsg| core.check_peer_msg(now, 7, msg);
    let bound = ClusterCore::token_bound(now);
    assert_eq!(check(&grant(0, 1)), Verdict::Refuse("token 0"));
    assert_eq!(check(&grant(bound, 60_000)), Verdict::Accept);
    // Beyond the window: left out (the link stays), never taken.
    assert_eq!(check(&grant(bound + 1, 1)), Verdict::BeyondWindow);
    assert_eq!(check(&grant(u64::MAX - 47, 1)), Verdict::BeyondWindow);
    assert_eq!(
        check(&grant(u64::MAX - 47, 60_001)),
        Verdict::Refuse("a lease above --max-lease"),
        "a malformed message is refused whatever its token"
    );
    assert_eq!(
        check(&grant(16, 60_001)),
        Verdict::Refuse("a lease above --max-lease")
    );
    let free0 = PeerMsg::Delta(Delta::free(Key::new(b"k").expect("key"), 0));
    assert_eq!(check(&free0), Verdict::Refuse("token 0"));
    assert_eq!(
        check(&PeerMsg::Delta(Delta::Ceiling(0))),
        Verdict::Refuse("token 0")
    );
    assert_eq!(
        check(&PeerMsg::Delta(Delta::Ceiling(u64::MAX))),
        Verdict::BeyondWindow
    );
    let stranger = beat(RoleName::Standby, Some(9), false);
    assert!(matches!(check(&stranger), Verdict::Refuse(_)));
    let huge = PeerMsg::Beat {
        beat: Beat {
            role: RoleName::Active,
            following: None,
            synced: true,
            has_state: true,
        },
        last_token: u64::MAX,
        ceiling: 1,
    };
    assert_eq!(check(&huge), Verdict::BeyondWindow);
    // A token near the clock is fine (a real peer's).
    let real = PeerMsg::Beat {
        beat: Beat {
            role: RoleName::Active,
            following: None,
            synced: true,
            has_state: true,
        },
        last_token: tokens::start_floor(now.unix_ms),
        ceiling: tokens::start_floor(now.unix_ms + 1000),
    };
    assert_eq!(check(&real), Verdict::Accept);
}

#[test]
fn a_snapshot_streams_to_the_lock_owner_as_it_comes_and_nothing_of_it_gathers_here() {
    // A hostile active's endless snapshot: grants past --max-keys,
    // frees, ceilings. The cluster core passes them on in batches of at
    // most APPLY_BATCH_MAX (the lock owner's --max-keys bounds what is
    // applied, and refuses the state past it: table_core's tests), in
    // the order they came, and holds no more than one batch itself.
    let mut core = linked(1);
    core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
    core.handle_tick(at(2));
    assert_eq!(core.roles().following(), Some(0));
    effects(&mut core);
    core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotBegin);
    let out = effects(&mut core);
    assert!(
        out.contains(&ClusterEffect::ToTable(ClusterToTable::Snapshot {
            seq: 1,
            entries: vec![]
        })),
        "the table is emptied at once: {out:?}"
    );
    let mut sent = Vec::new();
    let mut passed = Vec::new();
    for i in 0..3 * APPLY_BATCH_MAX as u64 {
        let k = key(&format!("k{}", i % 10));
        let delta = match i % 3 {
            0 => Delta::grant(k, 16 * (i + 1), 1000),
            1 => Delta::free(k, 16 * i),
            _ => Delta::Ceiling(16 * (i + 1)),
        };
        sent.push(delta.clone());
        core.handle_peer_msg(at(3), 7, PeerMsg::Delta(delta));
        assert!(core.deltas_in.len() < APPLY_BATCH_MAX);
        let out = effects(&mut core);
        assert!(!out.contains(&ClusterEffect::DropIn { link: 7 }), "{out:?}");
        passed.extend(to_table_deltas(&out));
    }
    assert!(!core.roles().beat().synced && !core.roles().beat().has_state);
    core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotEnd);
    took(&mut core, at(3));
    passed.extend(to_table_deltas(&effects(&mut core)));
    assert_eq!(passed, sent, "all of it, in order");
    assert!(core.roles().beat().synced);
}

#[test]
fn a_semaphore_grant_with_a_limit_or_slot_out_of_range_is_refused_even_from_a_proved_peer() {
    let params = ClusterParams {
        max_lease_ms: 60_000,
        ..ClusterParams::with_detect(DETECT)
    };
    let core = linked_with(0, params);
    let now = at(2);
    let grant = |token: u64, ms_left: u64, limit: u32, slot: u32| {
        PeerMsg::Delta(Delta::Grant {
            key: Key::new(b"k").expect("key"),
            token,
            ms_left,
            limit,
            slot,
            value: Some(crate::protocol::Value::new(b"v").expect("value")),
        })
    };
    let check = |msg: &PeerMsg| core.check_peer_msg(now, 7, msg);
    assert_eq!(check(&grant(16, 1000, 3, 2)), Verdict::Accept);
    assert_eq!(
        check(&grant(16, 1000, MAX_LIMIT, MAX_LIMIT - 1)),
        Verdict::Accept
    );
    for limit in [0, MAX_LIMIT + 1, u32::MAX] {
        assert_eq!(
            check(&grant(16, 1000, limit, 0)),
            Verdict::Refuse("a limit outside 1..=10000"),
            "limit {limit}"
        );
    }
    for (limit, slot) in [(1, 1), (3, 3), (3, u32::MAX)] {
        assert_eq!(
            check(&grant(16, 1000, limit, slot)),
            Verdict::Refuse("a slot at or above its key's limit"),
            "limit {limit}, slot {slot}"
        );
    }
    assert_eq!(check(&grant(0, 1000, 3, 1)), Verdict::Refuse("token 0"));
    assert_eq!(
        check(&grant(16, 60_001, 3, 1)),
        Verdict::Refuse("a lease above --max-lease")
    );
    let free = |slot: u32| {
        PeerMsg::Delta(Delta::Free {
            key: Key::new(b"k").expect("key"),
            token: 16,
            slot,
        })
    };
    assert_eq!(check(&free(MAX_LIMIT - 1)), Verdict::Accept);
    assert_eq!(
        check(&free(MAX_LIMIT)),
        Verdict::Refuse("a slot at or above its key's limit")
    );
}

#[test]
fn an_active_heartbeat_lifts_the_token_floor_by_its_ceiling() {
    let mut core = linked(1);
    core.handle_peer_msg(at(2), 7, active_beat(10, 500));
    let out = effects(&mut core);
    assert_eq!(out[0], ClusterEffect::ToTable(ClusterToTable::Observe(500)));
    assert!(
        out.contains(&ClusterEffect::ToTable(ClusterToTable::Follow {
            active: Some("n0:1".into())
        }))
    );
}

#[test]
fn an_active_never_takes_a_standbys_ceiling() {
    let mut core = new_core(0, 2);
    core.handle_tick(at(0));
    core.handle_tick(at(DETECT + 1));
    assert!(core.roles().role_name().is_active());
    core.handle_in_opened(at(0), 7);
    core.handle_in_authenticated(at(DETECT + 2), 7, 1);
    effects(&mut core);
    core.handle_peer_msg(
        at(DETECT + 3),
        7,
        PeerMsg::Beat {
            beat: Beat {
                role: RoleName::Standby,
                following: Some(0),
                synced: true,
                has_state: true,
            },
            last_token: 10,
            ceiling: 500,
        },
    );
    assert_eq!(
        effects(&mut core)[0],
        ClusterEffect::ToTable(ClusterToTable::Observe(10))
    );
}

#[test]
fn promotion_floor_comes_from_the_wall_clock_passed_in() {
    let mut core = new_core(0, 2);
    core.handle_tick(Now::at(DETECT + 1, 5_000));
    let out = effects(&mut core);
    assert!(
        out.contains(&ClusterEffect::ToTable(ClusterToTable::BecomeActive {
            floor: tokens::start_floor(5_000),
            failover: true
        }))
    );
}

#[test]
fn a_standby_whose_clock_is_ten_minutes_behind_still_hears_its_active_and_stays_standby() {
    let mut core = linked(1);
    core.handle_peer_msg(at(2), 7, beat_from_ahead(2, RoleName::Active, None));
    let out = effects(&mut core);
    assert!(!out.contains(&ClusterEffect::DropIn { link: 7 }), "{out:?}");
    assert!(
        observed(&out).is_empty(),
        "nothing beyond the window: {out:?}"
    );
    assert!(
        out.contains(&ClusterEffect::ToTable(ClusterToTable::Follow {
            active: Some("n0:1".into())
        })),
        "{out:?}"
    );
    // The active keeps beating: for many detection periods it is live,
    // and this node never elects itself.
    let period = DETECT / BEATS_PER_DETECT;
    let mut t = 2;
    while t < 10 * DETECT {
        t += period;
        core.handle_peer_msg(at(t), 7, beat_from_ahead(t, RoleName::Active, None));
        core.handle_tick(at(t));
        let out = effects(&mut core);
        assert!(
            !out.iter().any(|e| matches!(
                e,
                ClusterEffect::DropIn { .. }
                    | ClusterEffect::ToTable(ClusterToTable::BecomeActive { .. })
            )),
            "at {t}: {out:?}"
        );
        assert!(observed(&out).is_empty(), "at {t}: {out:?}");
        assert!(core.roles().is_live(0, t));
        assert_eq!(core.roles().role_name(), RoleName::Standby);
        assert_eq!(core.roles().following(), Some(0));
    }
    // Its snapshot: what is beyond the window is left out, what is
    // within is applied, and this node does not say it holds the state.
    let near = Delta::grant(key("near"), tokens::start_floor(at(t).unix_ms), 1000);
    core.handle_peer_msg(at(t), 7, PeerMsg::SnapshotBegin);
    core.handle_peer_msg(at(t), 7, PeerMsg::Delta(near.clone()));
    let far = Delta::grant(key("far"), token_from_ahead(t), 1000);
    core.handle_peer_msg(at(t), 7, PeerMsg::Delta(far));
    let far_ceiling = Delta::Ceiling(token_from_ahead(t) + 1);
    core.handle_peer_msg(at(t), 7, PeerMsg::Delta(far_ceiling.clone()));
    core.handle_peer_msg(at(t), 7, PeerMsg::SnapshotEnd);
    took(&mut core, at(t));
    let out = effects(&mut core);
    assert!(!out.contains(&ClusterEffect::DropIn { link: 7 }), "{out:?}");
    assert!(
        out.contains(&ClusterEffect::ToTable(ClusterToTable::Snapshot {
            seq: 1,
            entries: vec![]
        })),
        "{out:?}"
    );
    assert_eq!(to_table_deltas(&out), [near]);
    assert!(!core.roles().beat().synced, "it left part of the state out");
    // Nor do deltas beyond the window reach its table.
    core.handle_peer_msg(at(t + 1), 7, PeerMsg::Delta(far_ceiling));
    core.handle_peer_msg(at(t + 1), 7, beat_from_ahead(t + 1, RoleName::Active, None));
    core.handle_tick(at(t + 1 + APPLY_BATCH_MS));
    let out = effects(&mut core);
    assert!(to_table_deltas(&out).is_empty(), "{out:?}");
    assert!(!out.contains(&ClusterEffect::DropIn { link: 7 }), "{out:?}");
    // So it refuses a handoff: a node with a clock far behind never
    // takes the role from a live active.
    core.handle_peer_msg(at(t + 2), 7, PeerMsg::Handoff);
    assert_eq!(core.roles().role_name(), RoleName::Standby);
}

#[test]
fn a_synced_standby_that_is_sent_a_token_beyond_its_window_no_longer_says_it_holds_the_state() {
    let mut core = linked(1);
    core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
    core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotBegin);
    core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotEnd);
    took(&mut core, at(3));
    assert!(core.roles().beat().synced);
    effects(&mut core);
    let far = Delta::free(key("k"), token_from_ahead(4));
    core.handle_peer_msg(at(4), 7, PeerMsg::Delta(far));
    core.handle_tick(at(4 + APPLY_BATCH_MS));
    let out = effects(&mut core);
    assert!(to_table_deltas(&out).is_empty(), "{out:?}");
    assert!(!out.contains(&ClusterEffect::DropIn { link: 7 }), "{out:?}");
    assert!(!core.roles().beat().synced);
    assert_eq!(core.roles().following(), Some(0), "it still follows");
}

#[test]
fn an_active_whose_clock_is_ten_minutes_behind_steps_back_to_a_higher_active() {
    // Node 1 was alone long enough to be active; node 0, whose clock is
    // ten minutes ahead, is active too (a partition healed, say).
    let mut core = linked_at(1, DETECT + 2);
    assert!(core.roles().role_name().is_active());
    let t = DETECT + 3;
    core.handle_peer_msg(at(t), 7, beat_from_ahead(t, RoleName::Active, None));
    let out = effects(&mut core);
    assert!(!out.contains(&ClusterEffect::DropIn { link: 7 }), "{out:?}");
    assert!(observed(&out).is_empty(), "{out:?}");
    assert!(
        out.contains(&ClusterEffect::ToTable(ClusterToTable::Follow {
            active: Some("n0:1".into())
        })),
        "{out:?}"
    );
    assert_eq!(core.roles().role_name(), RoleName::Standby);
    assert_eq!(core.roles().following(), Some(0));
}

#[test]
fn of_a_heartbeat_only_the_values_within_the_window_are_observed() {
    let mut core = linked(1);
    let near = tokens::start_floor(at(2).unix_ms + 1000);
    core.handle_peer_msg(at(2), 7, active_beat(near, token_from_ahead(2)));
    let out = effects(&mut core);
    assert_eq!(observed(&out), vec![near], "{out:?}");
    // A promotion later starts above it (the lock owner keeps every
    // token above what it observed) and above the clock, never from
    // anything beyond the window.
    core.handle_link_down(at(3), 0, OutDown::Refused, "refused");
    let out = effects(&mut core);
    assert!(
        out.contains(&ClusterEffect::ToTable(ClusterToTable::BecomeActive {
            floor: tokens::start_floor(at(3).unix_ms),
            failover: true
        })),
        "{out:?}"
    );
    assert!(
        observed(&out)
            .iter()
            .all(|&t| t <= ClusterCore::token_bound(at(3)))
    );
}
