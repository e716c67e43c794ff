//! Tests of the replication stream: snapshots, deltas, standbys'
//! synced state, state refusals and the handoff.

use super::*;

#[test]
fn a_standby_whose_lock_owner_refuses_the_actives_state_drops_the_link_and_holds_none() {
    let mut core = linked(1);
    core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
    core.handle_tick(at(2));
    assert_eq!(core.roles().following(), Some(0));
    core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotBegin);
    core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotEnd);
    took(&mut core, at(3));
    assert!(core.roles().beat().synced);
    effects(&mut core);
    // Its lock owner refused a grant past --max-keys.
    core.handle_table(
        at(4),
        TableToCluster::StateRefused {
            why: "a grant past --max-keys",
            snapshot: 1,
        },
    );
    let out = effects(&mut core);
    assert!(out.contains(&ClusterEffect::DropIn { link: 7 }), "{out:?}");
    assert!(out.contains(&ClusterEffect::DropOut { peer: 0 }), "{out:?}");
    let beat_now = core.roles().beat();
    assert!(!beat_now.synced, "not counted in the active's standbys=");
    assert!(!beat_now.has_state, "not preferred in an election");
    // Redialed, it is handed no role before a snapshot it can take.
    let t = dial_up(&mut core, 0, 4);
    core.handle_in_opened(at(t), 8);
    core.handle_in_authenticated(at(t), 8, 0);
    core.handle_peer_msg(at(t), 8, beat(RoleName::Active, None, false));
    core.handle_peer_msg(at(t), 8, PeerMsg::Handoff);
    assert_eq!(core.roles().role_name(), RoleName::Standby);
    let out = effects(&mut core);
    assert!(
        !out.iter().any(|e| matches!(
            e,
            ClusterEffect::ToTable(ClusterToTable::BecomeActive { .. })
        )),
        "{out:?}"
    );
    core.handle_peer_msg(at(t + 1), 8, PeerMsg::SnapshotBegin);
    core.handle_peer_msg(at(t + 1), 8, PeerMsg::SnapshotEnd);
    took(&mut core, at(t + 1));
    assert!(core.roles().beat().synced && core.roles().beat().has_state);
    // Told after it took the active role: the link to its old active
    // is no business of it any more.
    core.handle_peer_msg(at(t + 2), 8, PeerMsg::Handoff);
    assert_eq!(core.roles().role_name(), RoleName::Active);
    effects(&mut core);
    core.handle_table(
        at(t + 3),
        TableToCluster::StateRefused {
            why: "a grant past --max-keys",
            snapshot: 2,
        },
    );
    assert!(
        !effects(&mut core)
            .iter()
            .any(|e| matches!(e, ClusterEffect::DropIn { .. })),
    );
}

#[test]
fn a_state_refusal_is_matched_to_the_snapshot_it_came_after() {
    let refused = |snapshot| TableToCluster::StateRefused {
        why: "a grant past --max-keys",
        snapshot,
    };
    let mut core = linked(1);
    core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
    core.handle_tick(at(2));
    core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotBegin);
    core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotEnd);
    took(&mut core, at(3));
    // Link 7 drops (a blip); link 8 from node 0 carries snapshot 2,
    // which the lock owner takes.
    core.handle_in_closed(at(4), 7, "eof");
    let t = dial_up(&mut core, 0, 4);
    core.handle_in_opened(at(t), 8);
    core.handle_in_authenticated(at(t), 8, 0);
    core.handle_peer_msg(at(t), 8, beat(RoleName::Active, None, false));
    core.handle_peer_msg(at(t), 8, PeerMsg::SnapshotBegin);
    core.handle_peer_msg(at(t), 8, PeerMsg::SnapshotEnd);
    took(&mut core, at(t));
    assert!(core.roles().beat().synced);
    effects(&mut core);
    // A refusal of snapshot 1 comes through late: stale, the table was
    // replaced since. The good link stays, and so does the state.
    core.handle_table(at(t + 1), refused(1));
    let out = effects(&mut core);
    assert!(
        !out.iter()
            .any(|e| matches!(e, ClusterEffect::DropIn { .. })),
        "{out:?}"
    );
    assert!(core.roles().beat().synced && core.roles().beat().has_state);
    // Node 0 replaces link 8 with link 9 (no snapshot on it yet), then
    // the refusal of snapshot 2 comes: no state held, and link 9 stays
    // (its own snapshot will be judged on its own).
    core.handle_in_opened(at(t + 2), 9);
    core.handle_in_authenticated(at(t + 2), 9, 0);
    effects(&mut core);
    core.handle_table(at(t + 3), refused(2));
    let out = effects(&mut core);
    assert!(!out.contains(&ClusterEffect::DropIn { link: 9 }), "{out:?}");
    assert!(!core.roles().beat().has_state);
    // A refusal of the snapshot a link still carries drops that link.
    core.handle_peer_msg(at(t + 4), 9, PeerMsg::SnapshotBegin);
    core.handle_peer_msg(at(t + 4), 9, PeerMsg::SnapshotEnd);
    took(&mut core, at(t + 4));
    effects(&mut core);
    core.handle_table(at(t + 5), refused(3));
    let out = effects(&mut core);
    assert!(out.contains(&ClusterEffect::DropIn { link: 9 }), "{out:?}");
}

#[test]
fn a_state_refusal_after_the_active_is_found_dead_still_means_no_state_held() {
    // Node 2 of 3 follows node 0 and took its snapshot; node 1 (ranked
    // above it) is a standby too. Node 0 is found dead, then node 2's
    // lock owner's refusal comes through: node 2 follows no one, yet
    // must not say it holds the state (node 1 does, and must win).
    let mut core = new_core(2, 3);
    core.handle_tick(at(0));
    core.handle_link_up(at(1), 0);
    core.handle_link_up(at(1), 1);
    core.handle_in_opened(at(1), 7);
    core.handle_in_authenticated(at(1), 7, 0);
    core.handle_in_opened(at(1), 8);
    core.handle_in_authenticated(at(1), 8, 1);
    core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
    core.handle_peer_msg(at(2), 8, beat(RoleName::Standby, Some(0), true));
    core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotBegin);
    core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotEnd);
    took(&mut core, at(3));
    assert!(core.roles().beat().has_state);
    core.handle_in_closed(at(4), 7, "eof");
    core.handle_link_down(at(4), 0, OutDown::Refused, "refused");
    assert_eq!(core.roles().following(), None);
    assert!(!core.roles().role_name().is_active());
    effects(&mut core);
    core.handle_table(
        at(5),
        TableToCluster::StateRefused {
            why: "a grant past --max-keys",
            snapshot: 1,
        },
    );
    assert!(
        !core.roles().beat().has_state,
        "not preferred in the election"
    );
    let out = effects(&mut core);
    assert!(
        !out.contains(&ClusterEffect::DropIn { link: 8 }),
        "node 1's link stays: {out:?}"
    );
}

#[test]
fn standbys_count_only_while_both_links_are_up_and_carried_the_snapshot() {
    let mut core = linked(0);
    core.handle_tick(at(2));
    core.handle_peer_msg(at(3), 7, beat(RoleName::Standby, None, false));
    core.handle_tick(at(3));
    assert!(core.roles().role_name().is_active() || core.roles().active().is_none());
    // It says it holds this node's state, but this link has not carried
    // the snapshot yet (the claim is from an earlier link, say).
    core.handle_peer_msg(at(4), 7, beat(RoleName::Standby, Some(0), true));
    assert_eq!(core.synced_standbys(at(4)), 0);
    effects(&mut core);
    core.handle_tick(at(4));
    let out = effects(&mut core);
    assert!(asked(&out, 1).is_some(), "{out:?}");
    let ask = core.outs[1].snap_ask;
    core.handle_table(at(4), whole(1, ask, 16));
    assert_eq!(core.synced_standbys(at(5)), 1);
    core.handle_in_closed(at(6), 7, "reset");
    assert_eq!(core.synced_standbys(at(6)), 0, "a dropped link resets it");
}

#[test]
fn a_standby_whose_link_from_the_active_drops_is_no_longer_synced() {
    let mut core = linked(1);
    core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
    core.handle_tick(at(2));
    assert_eq!(core.roles().following(), Some(0));
    core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotBegin);
    core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotEnd);
    took(&mut core, at(3));
    assert!(core.roles().beat().synced);
    assert_eq!(core.heard_active_ms(), 3);
    // A flood of deltas does not move lag; a beat after them does.
    core.handle_peer_msg(at(50), 7, PeerMsg::Delta(Delta::Ceiling(16)));
    assert_eq!(core.heard_active_ms(), 3);
    core.handle_peer_msg(at(60), 7, beat(RoleName::Active, None, false));
    assert_eq!(core.heard_active_ms(), 60);
    core.handle_in_closed(at(70), 7, "reset");
    assert!(!core.roles().beat().synced, "deltas may be lost");
    assert!(core.roles().beat().has_state, "it keeps what it has");
}

#[test]
fn a_standby_whose_link_from_the_active_is_replaced_holds_its_state_no_more() {
    let mut core = linked(1);
    core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
    core.handle_tick(at(2));
    core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotBegin);
    core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotEnd);
    took(&mut core, at(3));
    assert!(core.roles().beat().synced);
    // A new link from the active replaces the old one: the old one's
    // unread tail (and what the active cleared from its writer) is lost.
    core.handle_in_opened(at(4), 8);
    core.handle_in_authenticated(at(4), 8, 0);
    let out = effects(&mut core);
    assert!(out.contains(&ClusterEffect::DropIn { link: 7 }));
    assert!(!core.roles().beat().synced, "deltas may have been lost");
    assert!(core.roles().beat().has_state, "it keeps what it has");
    // So it refuses a handoff until a snapshot came on the new link.
    core.handle_peer_msg(at(5), 8, PeerMsg::Handoff);
    assert_eq!(core.roles().role_name(), RoleName::Standby);
    core.handle_peer_msg(at(6), 8, PeerMsg::SnapshotBegin);
    core.handle_peer_msg(at(6), 8, PeerMsg::SnapshotEnd);
    took(&mut core, at(6));
    assert!(core.roles().beat().synced);
}

#[test]
fn a_snapshot_may_hold_frees_and_ceilings_between_its_grants() {
    // The active's deltas come between the pieces: a free of a key
    // granted in an earlier piece, a raised ceiling. None costs the link.
    let mut core = linked(1);
    core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
    core.handle_tick(at(2));
    effects(&mut core);
    core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotBegin);
    for delta in [
        Delta::Ceiling(32),
        Delta::grant(key("a"), 16, 1000),
        Delta::free(key("a"), 16),
        Delta::grant(key("b"), 48, 1000),
        Delta::Ceiling(64),
    ] {
        core.handle_peer_msg(at(3), 7, PeerMsg::Delta(delta));
    }
    core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotEnd);
    took(&mut core, at(3));
    let out = effects(&mut core);
    assert!(!out.contains(&ClusterEffect::DropIn { link: 7 }), "{out:?}");
    assert_eq!(to_table_deltas(&out).len(), 5);
    assert!(core.roles().beat().synced);
}

#[test]
fn an_active_asks_for_a_snapshot_for_a_new_follower_and_resends_a_stale_one() {
    let mut core = linked_at(0, DETECT + 1);
    assert!(core.roles().role_name().is_active());
    core.handle_peer_msg(at(DETECT + 3), 7, beat(RoleName::Standby, Some(0), false));
    effects(&mut core);
    core.handle_tick(at(DETECT + 4));
    let wanted = 1;
    assert!(asked(&effects(&mut core), wanted).is_some());
    core.handle_tick(at(DETECT + 5));
    assert!(asked(&effects(&mut core), wanted).is_none(), "asked once");
    let ask = core.outs[1].snap_ask;
    core.handle_table(at(DETECT + 6), whole(1, ask, 99));
    let sent = effects(&mut core);
    assert_eq!(
        sent.first(),
        Some(&ClusterEffect::Send {
            peer: 1,
            msg: PeerMsg::SnapshotBegin
        })
    );
    core.handle_table(
        at(DETECT + 7),
        TableToCluster::Deltas(vec![Delta::Ceiling(5)]),
    );
    assert!(effects(&mut core).contains(&ClusterEffect::Send {
        peer: 1,
        msg: PeerMsg::Delta(Delta::Ceiling(5))
    }));
    // Still not synced a detection period later: sent again.
    let later = 2 * DETECT + 10;
    core.handle_peer_msg(at(later), 7, beat(RoleName::Standby, Some(0), false));
    core.handle_tick(at(later));
    assert!(asked(&effects(&mut core), wanted).is_some());
}

#[test]
fn deltas_the_owner_dropped_cost_each_standby_a_fresh_snapshot_and_nothing_is_sent_before() {
    let mut core = linked_at(0, DETECT + 1);
    core.handle_peer_msg(at(DETECT + 3), 7, beat(RoleName::Standby, Some(0), true));
    core.handle_tick(at(DETECT + 4));
    let wanted = 1;
    assert!(asked(&effects(&mut core), wanted).is_some());
    let snapshot = whole(1, core.outs[1].snap_ask, 99);
    core.handle_table(at(DETECT + 5), snapshot.clone());
    effects(&mut core);
    core.handle_tick(at(DETECT + 6));
    assert!(
        asked(&effects(&mut core), wanted).is_none(),
        "synced: no new snapshot"
    );
    core.handle_table(at(DETECT + 7), TableToCluster::DeltasLost);
    // The link is dropped, as one too far behind would be: the standby
    // sees it close and stops saying it is synced.
    assert!(effects(&mut core).contains(&ClusterEffect::DropOut { peer: 1 }));
    // Neither later deltas nor a role transfer go to it now: it lacks
    // the dropped ones.
    core.handle_table(
        at(DETECT + 8),
        TableToCluster::Deltas(vec![Delta::Ceiling(5)]),
    );
    core.handle_table(at(DETECT + 8), TableToCluster::TransferReady { to: 1 });
    let sent = effects(&mut core);
    assert!(
        !sent
            .iter()
            .any(|e| matches!(e, ClusterEffect::Send { peer: 1, .. })),
        "{sent:?}"
    );
    // Redialed at once; the new link carries a fresh snapshot.
    let t = dial_up(&mut core, 1, DETECT + 8);
    core.handle_peer_msg(at(t), 7, beat(RoleName::Standby, Some(0), false));
    core.handle_tick(at(t));
    assert!(asked(&effects(&mut core), wanted).is_some());
    assert!(
        !matches!(&snapshot, TableToCluster::SnapshotChunk { ask, .. } if *ask == core.outs[1].snap_ask),
        "asked again"
    );
    let snapshot = whole(1, core.outs[1].snap_ask, 99);
    core.handle_table(at(t + 1), snapshot);
    assert_eq!(
        effects(&mut core).first(),
        Some(&ClusterEffect::Send {
            peer: 1,
            msg: PeerMsg::SnapshotBegin
        })
    );
}

#[test]
fn a_standby_takes_a_snapshot_as_it_streams_and_says_it_is_synced_at_its_end() {
    let mut core = linked(1);
    core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
    core.handle_peer_msg(at(2), 7, PeerMsg::SnapshotBegin);
    core.handle_peer_msg(at(2), 7, PeerMsg::SnapshotEnd);
    took(&mut core, at(2));
    assert!(core.roles().beat().synced);
    effects(&mut core);
    // A fresh snapshot: not synced from its first line to its last.
    let grant = Delta::grant(Key::new(b"k").expect("key"), 33, 100);
    core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotBegin);
    assert!(!core.roles().beat().synced);
    core.handle_peer_msg(at(3), 7, PeerMsg::Delta(grant.clone()));
    assert!(!core.roles().beat().synced);
    core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotEnd);
    took(&mut core, at(3));
    let out = effects(&mut core);
    assert_eq!(
        out[..2],
        [
            ClusterEffect::ToTable(ClusterToTable::Snapshot {
                seq: 2,
                entries: vec![]
            }),
            ClusterEffect::ToTable(ClusterToTable::Deltas(vec![grant])),
        ]
    );
    assert!(core.roles().beat().synced);
    assert!(out.iter().any(|e| matches!(
        e,
        ClusterEffect::Send {
            msg: PeerMsg::Beat { beat, .. },
            ..
        } if beat.synced
    )));
    assert_eq!(core.heard_active_ms(), 3);
}

#[test]
fn a_standby_passes_deltas_to_its_owner_in_batches_and_at_once_on_a_heartbeat() {
    let mut core = linked(1);
    core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
    core.handle_peer_msg(at(2), 7, PeerMsg::SnapshotBegin);
    core.handle_peer_msg(at(2), 7, PeerMsg::SnapshotEnd);
    took(&mut core, at(2));
    effects(&mut core);
    let ceiling = |c: u64| PeerMsg::Delta(Delta::Ceiling(c));
    core.handle_peer_msg(at(10), 7, ceiling(1));
    core.handle_peer_msg(at(11), 7, ceiling(2));
    // Ticks before the batch is due pass nothing, and the core asks to
    // be woken when it is.
    core.handle_tick(at(10 + APPLY_BATCH_MS - 1));
    assert!(to_table_deltas(&effects(&mut core)).is_empty());
    assert!(core.next_wake_ms(at(12)) <= 10 + APPLY_BATCH_MS);
    core.handle_tick(at(10 + APPLY_BATCH_MS));
    assert_eq!(
        to_table_deltas(&effects(&mut core)),
        vec![Delta::Ceiling(1), Delta::Ceiling(2)]
    );
    // The active's heartbeat makes the state current at once.
    core.handle_peer_msg(at(40), 7, ceiling(3));
    core.handle_peer_msg(at(41), 7, beat(RoleName::Active, None, true));
    assert_eq!(
        to_table_deltas(&effects(&mut core)),
        vec![Delta::Ceiling(3)]
    );
    // So does a full batch.
    for c in 0..APPLY_BATCH_MAX as u64 {
        core.handle_peer_msg(at(42), 7, ceiling(10 + c));
    }
    assert_eq!(to_table_deltas(&effects(&mut core)).len(), APPLY_BATCH_MAX);
    // And a role change: the deltas of the old role are applied first.
    core.handle_peer_msg(at(43), 7, ceiling(99_999));
    core.handle_peer_msg(at(44), 7, PeerMsg::Handoff);
    let out = effects(&mut core);
    let first_deltas = out
        .iter()
        .position(|e| matches!(e, ClusterEffect::ToTable(ClusterToTable::Deltas(_))));
    let became_active = out.iter().position(|e| {
        matches!(
            e,
            ClusterEffect::ToTable(ClusterToTable::BecomeActive { .. })
        )
    });
    assert!(
        first_deltas.is_some() && first_deltas < became_active,
        "{out:?}"
    );
}

#[test]
fn deltas_from_a_node_this_one_does_not_follow_are_ignored() {
    let mut core = linked(1);
    core.handle_peer_msg(at(2), 7, PeerMsg::Delta(Delta::Ceiling(5)));
    core.handle_tick(at(3));
    assert!(
        !effects(&mut core)
            .iter()
            .any(|e| matches!(e, ClusterEffect::ToTable(ClusterToTable::Deltas(_))))
    );
}

#[test]
fn a_graceful_shutdown_without_a_successor_retires_then_exits_after_redirecting() {
    let mut core = new_core(0, 2);
    core.handle_tick(at(DETECT + 1));
    effects(&mut core);
    assert!(core.roles().role_name().is_active());
    core.handle_shutdown(at(DETECT + 2));
    assert!(effects(&mut core).contains(&ClusterEffect::ToTable(ClusterToTable::Retire)));
    assert!(!core.exited());
    core.handle_table(at(DETECT + 3), TableToCluster::Redirected);
    assert_eq!(effects(&mut core), vec![ClusterEffect::Exit]);
    assert!(core.exited());
}

#[test]
fn a_transfer_of_the_active_role_sends_handoff_after_the_last_delta() {
    // Node 1 alone became active; node 0 (higher) follows it, synced.
    let mut core = linked_at(1, DETECT + 2);
    assert!(core.roles().role_name().is_active());
    core.handle_peer_msg(at(DETECT + 3), 7, beat(RoleName::Standby, Some(1), false));
    core.handle_tick(at(DETECT + 3));
    let out = effects(&mut core);
    assert!(asked(&out, 0).is_some());
    let ask = core.outs[0].snap_ask;
    core.handle_table(at(DETECT + 3), whole(0, ask, 16));
    effects(&mut core);
    core.handle_peer_msg(at(DETECT + 3), 7, beat(RoleName::Standby, Some(1), true));
    let out = effects(&mut core);
    assert!(
        out.contains(&ClusterEffect::ToTable(ClusterToTable::StartTransfer {
            to: 0
        }))
    );
    core.handle_table(at(DETECT + 4), TableToCluster::TransferReady { to: 0 });
    assert_eq!(
        effects(&mut core),
        vec![ClusterEffect::Send {
            peer: 0,
            msg: PeerMsg::Handoff
        }]
    );
    core.handle_peer_msg(at(DETECT + 5), 7, PeerMsg::Took);
    assert!(
        effects(&mut core).contains(&ClusterEffect::ToTable(ClusterToTable::FinishTransfer {
            to: "n0:1".into()
        }))
    );
}

#[test]
fn no_handoff_goes_over_a_link_that_has_not_carried_the_state() {
    // Node 0 says it is synced, but this node's link to it has carried
    // no snapshot (it came up again since): the handoff is not sent.
    let mut core = linked_at(1, DETECT + 2);
    core.handle_peer_msg(at(DETECT + 3), 7, beat(RoleName::Standby, Some(1), true));
    assert!(
        effects(&mut core).contains(&ClusterEffect::ToTable(ClusterToTable::StartTransfer {
            to: 0
        }))
    );
    core.handle_table(at(DETECT + 4), TableToCluster::TransferReady { to: 0 });
    assert!(
        !effects(&mut core).contains(&ClusterEffect::Send {
            peer: 0,
            msg: PeerMsg::Handoff
        }),
        "a successor without the state must not be handed the role"
    );
}

#[test]
fn a_follower_that_never_takes_its_snapshot_is_sent_one_ever_less_often() {
    let mut core = linked_at(0, DETECT + 1);
    assert!(core.roles().role_name().is_active());
    let wanted = 1;
    let mut asks = Vec::new();
    let period = DETECT / BEATS_PER_DETECT;
    let mut t = DETECT + 2;
    while t < DETECT + 2 + 4 * SNAPSHOT_RESEND_MAX_MS {
        core.handle_peer_msg(at(t), 7, beat(RoleName::Standby, Some(0), false));
        core.handle_tick(at(t));
        if asked(&effects(&mut core), wanted).is_some() {
            asks.push(t);
            let ask = core.outs[1].snap_ask;
            core.handle_table(at(t), whole(1, ask, 16));
            effects(&mut core);
        }
        t += period;
    }
    let gaps: Vec<u64> = asks.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.len() >= 5, "{gaps:?}");
    assert!(gaps[0] <= DETECT + period, "the first resend: {gaps:?}");
    assert!(gaps.windows(2).all(|g| g[1] >= g[0]), "{gaps:?}");
    assert!(
        gaps.iter()
            .all(|&g| g <= SNAPSHOT_RESEND_MAX_MS + period + 1),
        "{gaps:?}"
    );
    assert!(
        gaps.last().is_some_and(|&g| g >= SNAPSHOT_RESEND_MAX_MS),
        "{gaps:?}"
    );
    // Once it says it holds the state, the wait starts over.
    core.handle_peer_msg(at(t), 7, beat(RoleName::Standby, Some(0), true));
    core.handle_tick(at(t));
    effects(&mut core);
    let synced_at = t;
    let again = loop {
        t += period;
        core.handle_peer_msg(at(t), 7, beat(RoleName::Standby, Some(0), false));
        core.handle_tick(at(t));
        if asked(&effects(&mut core), wanted).is_some() {
            break t;
        }
    };
    assert!(
        again - synced_at <= DETECT + 2 * period,
        "{}",
        again - synced_at
    );
}

/// A piece of the snapshot for node 1 asked as `ask`: the first
/// carries ceiling 99; a grant of each of `keys`.
fn piece(ask: u64, first: bool, keys: &[&str], last: bool) -> TableToCluster {
    TableToCluster::SnapshotChunk {
        peer: 1,
        ask,
        ceiling: first.then_some(99),
        held: 2,
        entries: keys
            .iter()
            .map(|k| Delta::grant(key(k), 16, 1000))
            .collect(),
        last,
    }
}

/// What these effects send to node 1.
fn sent_to_1(out: &[ClusterEffect]) -> Vec<PeerMsg> {
    out.iter()
        .filter_map(|e| match e {
            ClusterEffect::Send { peer: 1, msg } => Some(msg.clone()),
            _ => None,
        })
        .filter(|m| !matches!(m, PeerMsg::Beat { .. }))
        .collect()
}

#[test]
fn an_active_sends_a_snapshot_in_pieces_with_its_deltas_between_them_in_order() {
    let (mut core, t) = active_with_follower(DETECT, 7);
    core.handle_peer_msg(at(t), 7, beat(RoleName::Standby, Some(0), false));
    core.handle_tick(at(t));
    let ask = asked(&effects(&mut core), 1).expect("a snapshot asked for");
    core.handle_tick(at(t + 1));
    assert_eq!(asked(&effects(&mut core), 1), None, "asked once");
    // Deltas before the first piece do not go: the standby empties its
    // table at the first piece, which holds their keys as they are now.
    let early = Delta::grant(key("x"), 8, 1000);
    core.handle_table(at(t), TableToCluster::Deltas(vec![early]));
    assert_eq!(sent_to_1(&effects(&mut core)), []);
    core.handle_table(at(t), piece(ask, true, &["a"], false));
    let free = Delta::free(key("a"), 16);
    core.handle_table(at(t), TableToCluster::Deltas(vec![free.clone()]));
    // Not holding the whole state yet: the active role is not handed to
    // it, nor is it counted, whatever it says.
    core.handle_table(at(t), TableToCluster::TransferReady { to: 1 });
    core.handle_peer_msg(at(t), 7, beat(RoleName::Standby, Some(0), true));
    assert_eq!(core.synced_standbys(at(t)), 0);
    let mut sent = sent_to_1(&effects(&mut core));
    core.handle_tick(at(t + 2));
    let out = effects(&mut core);
    assert_eq!(asked(&out, 1), None, "not asked again meanwhile");
    sent.extend(sent_to_1(&out));
    core.handle_table(at(t), piece(ask, false, &["b"], true));
    sent.extend(sent_to_1(&effects(&mut core)));
    assert_eq!(
        sent,
        [
            PeerMsg::SnapshotBegin,
            PeerMsg::Delta(Delta::Ceiling(99)),
            PeerMsg::Delta(Delta::grant(key("a"), 16, 1000)),
            PeerMsg::Delta(free),
            PeerMsg::Delta(Delta::grant(key("b"), 16, 1000)),
            PeerMsg::SnapshotEnd,
        ]
    );
    assert_eq!(core.synced_standbys(at(t)), 1);
    // Now the role may go to it.
    core.handle_table(at(t), TableToCluster::TransferReady { to: 1 });
    assert_eq!(sent_to_1(&effects(&mut core)), [PeerMsg::Handoff]);
}

#[test]
fn pieces_of_an_older_ask_or_for_a_link_that_went_are_dropped_and_the_owner_told_to_stop() {
    let (mut core, t) = active_with_follower(DETECT, 7);
    core.handle_peer_msg(at(t), 7, beat(RoleName::Standby, Some(0), false));
    core.handle_tick(at(t));
    let ask = asked(&effects(&mut core), 1).expect("a snapshot asked for");
    core.handle_table(at(t), piece(ask, true, &["a"], false));
    effects(&mut core);
    // The link drops mid-stream: the lock owner stops, and what was
    // still on its way goes nowhere.
    core.handle_link_down(at(t + 1), 1, OutDown::Failed, "reset");
    let out = effects(&mut core);
    assert!(
        out.contains(&ClusterEffect::ToTable(ClusterToTable::SnapshotStop {
            peer: 1
        })),
        "{out:?}"
    );
    core.handle_table(at(t + 1), piece(ask, false, &["b"], true));
    let late = Delta::grant(key("y"), 8, 1000);
    core.handle_table(at(t + 1), TableToCluster::Deltas(vec![late]));
    assert_eq!(sent_to_1(&effects(&mut core)), []);
    assert_eq!(core.synced_standbys(at(t + 1)), 0);
    // Up again: asked afresh; a piece of the old ask is dropped, even a
    // first one, and the new ask's first begins the snapshot.
    let t = dial_up(&mut core, 1, t + 1);
    core.handle_peer_msg(at(t), 7, beat(RoleName::Standby, Some(0), false));
    core.handle_tick(at(t));
    let again = asked(&effects(&mut core), 1).expect("asked again");
    assert!(again > ask);
    core.handle_table(at(t), piece(ask, true, &["old"], true));
    assert_eq!(sent_to_1(&effects(&mut core)), []);
    core.handle_table(at(t), piece(again, true, &["a"], false));
    assert_eq!(
        sent_to_1(&effects(&mut core)).first(),
        Some(&PeerMsg::SnapshotBegin)
    );
    // Changes the owner dropped cost a link in the middle of its
    // snapshot too: it lacks them.
    core.handle_table(at(t), TableToCluster::DeltasLost);
    let out = effects(&mut core);
    assert!(out.contains(&ClusterEffect::DropOut { peer: 1 }), "{out:?}");
    assert!(
        out.contains(&ClusterEffect::ToTable(ClusterToTable::SnapshotStop {
            peer: 1
        }))
    );
    // A follower that turns to another node stops its snapshot too.
    let t = dial_up(&mut core, 1, t);
    core.handle_in_opened(at(t), 8);
    core.handle_in_authenticated(at(t), 8, 1);
    core.handle_peer_msg(at(t), 8, beat(RoleName::Standby, Some(0), false));
    core.handle_tick(at(t));
    let third = asked(&effects(&mut core), 1).expect("asked again");
    core.handle_table(at(t), piece(third, true, &["a"], false));
    effects(&mut core);
    core.handle_peer_msg(at(t), 8, beat(RoleName::Standby, None, false));
    let out = effects(&mut core);
    assert!(
        out.contains(&ClusterEffect::ToTable(ClusterToTable::SnapshotStop {
            peer: 1
        })),
        "{out:?}"
    );
    core.handle_table(at(t), piece(third, false, &["b"], true));
    assert_eq!(sent_to_1(&effects(&mut core)), []);
}

#[test]
fn a_standby_holds_the_state_only_once_its_lock_owner_took_the_whole_snapshot() {
    let mut core = linked(1);
    core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
    core.handle_peer_msg(at(2), 7, PeerMsg::SnapshotBegin);
    core.handle_peer_msg(at(2), 7, PeerMsg::Delta(Delta::grant(key("k"), 16, 1000)));
    core.handle_peer_msg(at(2), 7, PeerMsg::SnapshotEnd);
    let out = effects(&mut core);
    assert!(
        out.contains(&ClusterEffect::ToTable(ClusterToTable::SnapshotEnd {
            seq: 1
        })),
        "{out:?}"
    );
    // The lock owner has not answered: not synced, whatever the wire said.
    assert!(!core.roles().beat().synced);
    // It refused part of it instead: never synced by this snapshot.
    core.handle_table(
        at(3),
        TableToCluster::StateRefused {
            why: "a grant past --max-keys",
            snapshot: 1,
        },
    );
    core.handle_table(at(3), TableToCluster::SnapshotTaken { seq: 1 });
    assert!(!core.roles().beat().synced);
    // A stale confirmation (of an older snapshot) changes nothing either.
    let mut core = linked(1);
    core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
    core.handle_peer_msg(at(2), 7, PeerMsg::SnapshotBegin);
    core.handle_peer_msg(at(2), 7, PeerMsg::SnapshotEnd);
    core.handle_peer_msg(at(2), 7, PeerMsg::SnapshotBegin);
    core.handle_table(at(2), TableToCluster::SnapshotTaken { seq: 1 });
    assert!(!core.roles().beat().synced);
    core.handle_peer_msg(at(2), 7, PeerMsg::SnapshotEnd);
    core.handle_table(at(2), TableToCluster::SnapshotTaken { seq: 2 });
    assert!(core.roles().beat().synced);
    assert_eq!(core.heard_active_ms(), 2);
}
