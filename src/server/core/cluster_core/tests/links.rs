//! Tests of links: dialing, handshakes, backoff and redials.

use super::*;

#[test]
fn a_link_that_proved_the_key_starts_with_beats() {
    let mut core = new_core(1, 2);
    core.handle_tick(at(0));
    assert_eq!(effects(&mut core), vec![ClusterEffect::Dial { peer: 0 }]);
    core.handle_link_up(at(2), 0);
    let out = effects(&mut core);
    assert!(matches!(
        out[0],
        ClusterEffect::Send {
            peer: 0,
            msg: PeerMsg::Beat { .. }
        }
    ));
}

#[test]
fn failed_dials_back_off_with_jitter_up_to_the_cap_and_reset_once_up() {
    let mut core = new_core(1, 2);
    core.handle_tick(at(0));
    effects(&mut core);
    let mut now = 1;
    let mut waits = Vec::new();
    for _ in 0..8 {
        core.handle_link_down(at(now), 0, OutDown::Refused, "refused");
        let retry = next_dial(&mut core, 0, now + 1);
        waits.push(retry - now);
        now = retry;
    }
    let cap = (DETECT / 2).clamp(RECONNECT_MS, RECONNECT_MAX_MS);
    assert!(
        waits[0] >= RECONNECT_MS * 3 / 4 && waits[0] <= RECONNECT_MS * 5 / 4,
        "{waits:?}"
    );
    assert!(waits[1] > waits[0] || waits[1] >= cap * 3 / 4, "{waits:?}");
    assert!(waits.iter().all(|&w| w <= cap * 5 / 4), "{waits:?}");
    assert!(waits[7] >= cap * 3 / 4, "reaches the cap: {waits:?}");
    // Dials that time out (a partition) are tried again within the
    // dial timeout: one gets through soon after the network heals.
    for _ in 0..8 {
        core.handle_link_down(at(now), 0, OutDown::Failed, "timed out");
        let retry = next_dial(&mut core, 0, now + 1);
        assert!(
            retry - now <= core.dial_timeout_ms() * 5 / 4,
            "{}",
            retry - now
        );
        now = retry;
    }
    // Up, then dropped: redial at once.
    core.handle_link_up(at(now), 0);
    effects(&mut core);
    core.handle_link_down(at(now + 5), 0, OutDown::Failed, "reset");
    core.handle_tick(at(now + 5));
    assert!(effects(&mut core).contains(&ClusterEffect::Dial { peer: 0 }));
}

/// A peer that starts after this node refuses its first dials, and the
/// backoff grows; once that peer dials this node (it is listening now),
/// this node dials it at once rather than when the backoff ends, so that
/// its heartbeats reach the peer within a round trip. A conformance run
/// once killed the active before the second standby's link to the third
/// was up: the third, never having heard the second, elected itself.
#[test]
fn a_peer_that_dials_in_is_dialed_back_at_once_not_after_the_backoff() {
    let mut core = new_core(1, 3);
    core.handle_tick(at(0));
    effects(&mut core);
    let mut now = 1;
    for _ in 0..4 {
        core.handle_link_down(at(now), 2, OutDown::Refused, "refused");
        now = next_dial(&mut core, 2, now + 1);
    }
    core.handle_link_down(at(now), 2, OutDown::Refused, "refused");
    core.handle_tick(at(now + 1));
    assert!(
        !effects(&mut core).contains(&ClusterEffect::Dial { peer: 2 }),
        "backing off"
    );
    core.handle_in_opened(at(now + 2), 5);
    core.handle_in_authenticated(at(now + 2), 5, 2);
    assert!(core.next_wake_ms(at(now + 2)) <= now + 2);
    core.handle_tick(at(now + 2));
    assert!(
        effects(&mut core).contains(&ClusterEffect::Dial { peer: 2 }),
        "dialed back at once"
    );
    // A link already up, or dialing, is left alone.
    core.handle_link_up(at(now + 3), 2);
    effects(&mut core);
    core.handle_in_opened(at(now + 4), 6);
    core.handle_in_authenticated(at(now + 4), 6, 2);
    core.handle_tick(at(now + 4));
    let out = effects(&mut core);
    assert!(
        !out.iter().any(|e| matches!(
            e,
            ClusterEffect::Dial { peer: 2 } | ClusterEffect::DropOut { peer: 2 }
        )),
        "{out:?}"
    );
}

#[test]
fn a_dial_that_does_not_connect_and_prove_itself_in_time_fails() {
    let mut core = new_core(1, 2);
    core.handle_tick(at(0));
    assert_eq!(effects(&mut core), vec![ClusterEffect::Dial { peer: 0 }]);
    let timeout = core.dial_timeout_ms();
    assert_eq!(timeout, DETECT / BEATS_PER_DETECT);
    core.handle_tick(at(timeout - 1));
    assert!(!effects(&mut core).contains(&ClusterEffect::DropOut { peer: 0 }));
    assert!(core.next_wake_ms(at(10)) <= timeout);
    core.handle_tick(at(timeout));
    let out = effects(&mut core);
    let drop = out
        .iter()
        .position(|e| *e == ClusterEffect::DropOut { peer: 0 });
    let dial = out
        .iter()
        .position(|e| *e == ClusterEffect::Dial { peer: 0 });
    assert!(
        matches!((drop, dial), (Some(d), Some(n)) if d < n),
        "dropped, then dialed again at once: {out:?}"
    );
}

#[test]
fn messages_on_a_link_before_its_handshake_are_refused() {
    let mut core = new_core(0, 2);
    core.handle_in_opened(at(0), 1);
    assert_eq!(
        core.check_peer_msg(at(1), 1, &PeerMsg::Took),
        Verdict::Refuse("a message before the handshake")
    );
    core.handle_peer_msg(at(1), 1, PeerMsg::Took);
    assert_eq!(effects(&mut core), vec![ClusterEffect::DropIn { link: 1 }]);
    // An index that cannot be a peer is refused even when proved.
    core.handle_in_opened(at(1), 3);
    core.handle_in_authenticated(at(1), 3, 0);
    assert_eq!(effects(&mut core), vec![ClusterEffect::DropIn { link: 3 }]);
    // A failed handshake drops the link.
    core.handle_in_opened(at(1), 4);
    core.handle_in_rejected(at(1), 4, None, "bad proof");
    assert_eq!(effects(&mut core), vec![ClusterEffect::DropIn { link: 4 }]);
    assert_eq!(core.roles().role_name(), RoleName::Discovering);
}

#[test]
fn links_that_never_finish_their_handshake_are_dropped_and_bounded() {
    let mut core = new_core(0, 2);
    for link in 0..(MAX_PENDING_IN + 4) {
        core.handle_in_opened(at(link as u64), link);
    }
    // The oldest ones made room for the newest.
    let dropped: Vec<ClusterEffect> = effects(&mut core);
    assert_eq!(
        dropped,
        (0..4)
            .map(|link| ClusterEffect::DropIn { link })
            .collect::<Vec<_>>()
    );
    assert!(core.next_wake_ms(at(30)) <= 4 + HANDSHAKE_MS);
    core.handle_tick(at(HANDSHAKE_MS + MAX_PENDING_IN as u64 + 4));
    let late: Vec<ClusterEffect> = effects(&mut core)
        .into_iter()
        .filter(|e| matches!(e, ClusterEffect::DropIn { .. }))
        .collect();
    assert_eq!(late.len(), MAX_PENDING_IN, "every unproved link timed out");
}

#[test]
fn links_a_follower_keeps_dropping_after_this_nodes_snapshot_are_redialed_ever_later() {
    // Node 1 drops every link of this active node right after its
    // snapshot (it refuses it: another --max-keys, say), the incoming
    // one seen first or last: the backoff grows by one step per round,
    // not two.
    let (mut core, now) = active_with_follower(DETECT, 7);
    let (waits, now, link) = refused_rounds(&mut core, now, 7, 8);
    assert_backs_off(&waits);
    // A link that stays up for --detect is healthy: the next refused
    // drop is redialed at once.
    let down = refused_round(&mut core, link, now + DETECT, true);
    assert_eq!(
        dial_up(&mut core, 1, down),
        down,
        "at once after a healthy link"
    );
}

#[test]
fn young_links_that_drop_over_nothing_refused_are_always_redialed_at_once() {
    // A blip, a crash, a peer dropping a silent link: however young the
    // link and however often, no backoff (a backoff here would keep
    // this node's heartbeats from a peer that is counting the silence).
    // Standby side: the active drops the links a few ms after they
    // come up.
    let mut core = linked(1);
    let mut now = 1;
    let mut link = 7;
    for round in 0..8 {
        let t = now + 5;
        if round % 2 == 0 {
            core.handle_in_closed(at(t), link, "eof");
        } else {
            core.handle_link_down(at(t), 0, OutDown::Failed, "eof");
            core.handle_in_closed(at(t), link, "eof");
        }
        now = dial_up(&mut core, 0, t);
        assert_eq!(now, t, "round {round}: at once");
        link = new_in_link(&mut core, now, link, 0);
    }
    // Active side: links that carried no snapshot yet, or whose
    // follower said it holds the state, drop young: at once too.
    let (mut core, mut now) = active_with_follower(DETECT, 7);
    let mut link = 7;
    for round in 0..8 {
        if round % 2 == 1 {
            snapshot_to_follower(&mut core, link, now);
            core.handle_peer_msg(at(now), link, beat(RoleName::Standby, Some(0), true));
        }
        core.handle_link_down(at(now + 2), 1, OutDown::Failed, "reset");
        core.handle_in_closed(at(now + 2), link, "eof");
        let t = dial_up(&mut core, 1, now + 2);
        assert_eq!(t, now + 2, "round {round}: at once");
        now = t;
        link = new_in_link(&mut core, now, link, 1);
    }
}

#[test]
fn the_backoff_over_refused_state_never_waits_more_than_half_of_detect() {
    // With a small --detect a wait of RECONNECT_MS or more would outlast
    // the silence limit: every wait stays within --detect/2, jitter
    // included, so each new link's first heartbeat keeps both nodes
    // live (see ClusterCore::flap_backoff_ms).
    for detect in [20, 100, 1000] {
        let (mut core, now) = active_with_follower(detect, 7);
        let (waits, _, _) = refused_rounds(&mut core, now, 7, 12);
        assert_eq!(waits[0], 0, "detect {detect}: {waits:?}");
        assert!(waits[1] > 0, "detect {detect}: backs off: {waits:?}");
        assert!(
            waits.iter().all(|&w| w <= detect / 2),
            "detect {detect}: {waits:?}"
        );
        assert!(
            waits[11] >= (detect / 2).min(RECONNECT_MAX_MS) * 3 / 4,
            "detect {detect}: reaches the cap: {waits:?}"
        );
        // The standby's side: it refuses what the active sends.
        let params = ClusterParams {
            max_lease_ms: 60_000,
            ..ClusterParams::with_detect(detect)
        };
        let mut core = linked_with(1, params);
        let bad = PeerMsg::Delta(Delta::grant(key("k"), 16, 60_001));
        let mut now = 2;
        let mut link = 7;
        let mut waits = Vec::new();
        for _ in 0..12 {
            core.handle_peer_msg(at(now), link, bad.clone());
            let t = dial_up(&mut core, 0, now);
            waits.push(t - now);
            link = new_in_link(&mut core, t, link, 0);
            now = t + 1;
        }
        assert!(waits[1] > 0, "detect {detect}: backs off: {waits:?}");
        assert!(
            waits.iter().all(|&w| w <= detect / 2),
            "detect {detect}: {waits:?}"
        );
    }
}

#[test]
fn a_refusal_counts_even_on_an_old_link() {
    // A link up for long that carries something refused (a lease above
    // --max-lease) is redialed at once; the next refusals back off.
    let params = ClusterParams {
        max_lease_ms: 60_000,
        ..ClusterParams::with_detect(DETECT)
    };
    let mut core = linked_with(1, params);
    let bad = PeerMsg::Delta(Delta::grant(key("k"), 16, 60_001));
    let mut now = 3 * DETECT;
    let mut link = 7;
    let mut waits = Vec::new();
    for _ in 0..6 {
        core.handle_peer_msg(at(now), link, bad.clone());
        let out = effects(&mut core);
        assert!(out.contains(&ClusterEffect::DropIn { link }), "{out:?}");
        assert!(out.contains(&ClusterEffect::DropOut { peer: 0 }), "{out:?}");
        let t = dial_up(&mut core, 0, now);
        waits.push(t - now);
        link = new_in_link(&mut core, t, link, 0);
        now = t + 3;
    }
    assert_backs_off(&waits);
}

#[test]
fn a_young_link_that_goes_silent_is_still_redialed_at_once() {
    // A blip, not a refusal: dial again at once, however young the link
    // and however often (such dials then time out every period).
    let mut core = linked(0);
    let silence = core.silence_ms();
    assert!(silence < DETECT);
    let mut link = 7;
    let mut t = 1;
    for _ in 0..4 {
        core.handle_tick(at(t + silence));
        let out = effects(&mut core);
        assert!(out.contains(&ClusterEffect::DropIn { link }), "{out:?}");
        assert!(out.contains(&ClusterEffect::DropOut { peer: 1 }), "{out:?}");
        assert!(
            out.contains(&ClusterEffect::Dial { peer: 1 }),
            "at once: {out:?}"
        );
        t += silence;
        core.handle_link_up(at(t), 1);
        link = new_in_link(&mut core, t, link, 1);
    }
}

#[test]
fn a_silent_link_is_dropped_and_the_peer_dialed_afresh_before_it_is_found_dead() {
    let mut core = linked(0);
    let silence = core.silence_ms();
    assert!(silence < DETECT, "well before the peer is found dead");
    core.handle_peer_msg(at(10), 7, beat(RoleName::Standby, None, false));
    core.handle_tick(at(10 + silence - 1));
    assert!(!effects(&mut core).contains(&ClusterEffect::DropIn { link: 7 }));
    assert!(core.next_wake_ms(at(11)) <= 10 + silence);
    core.handle_tick(at(10 + silence));
    let out = effects(&mut core);
    assert!(out.contains(&ClusterEffect::DropIn { link: 7 }), "{out:?}");
    assert!(out.contains(&ClusterEffect::DropOut { peer: 1 }), "{out:?}");
    assert!(
        out.contains(&ClusterEffect::Dial { peer: 1 }),
        "at once: {out:?}"
    );
    assert!(
        core.roles().is_live(1, 10 + silence),
        "not found dead by this"
    );
    // Found dead only after --detect from the beat due after the last
    // one heard, plus a period for the fresh dial: 1.25 x --detect.
    assert_eq!(silence_limit_ms(1000), 1250);
    assert!(core.roles().is_live(1, 10 + DETECT));
    assert!(!core.roles().is_live(1, 10 + silence_limit_ms(DETECT)));
}

#[test]
fn a_newer_link_from_the_same_peer_replaces_the_old_one() {
    let mut core = linked(0);
    core.handle_in_opened(at(2), 8);
    core.handle_in_authenticated(at(2), 8, 1);
    assert_eq!(effects(&mut core), vec![ClusterEffect::DropIn { link: 7 }]);
}

#[test]
fn a_dropped_incoming_link_probes_the_peer_at_once_and_refused_means_dead() {
    let mut core = linked(1);
    core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, true));
    effects(&mut core);
    core.handle_in_closed(at(3), 7, "closed");
    assert_eq!(effects(&mut core), vec![ClusterEffect::DropOut { peer: 0 }]);
    core.handle_tick(at(3));
    assert!(effects(&mut core).contains(&ClusterEffect::Dial { peer: 0 }));
    core.handle_link_down(at(4), 0, OutDown::Refused, "refused");
    let out = effects(&mut core);
    assert!(out.iter().any(|e| matches!(
        e,
        ClusterEffect::ToTable(ClusterToTable::BecomeActive { failover: true, .. })
    )));
}

#[test]
fn input_held_back_for_the_lock_owner_is_not_silence() {
    let mut core = linked(1);
    core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
    core.handle_tick(at(2));
    effects(&mut core);
    assert_eq!(core.roles().following(), Some(0));
    // Its link has input held back for three detection periods: it is
    // never dropped as silent, and its active never found dead.
    let mut t = 2;
    while t < 3 * DETECT {
        t += 5;
        core.handle_in_held(at(t), 7);
        core.handle_tick(at(t));
        let out = effects(&mut core);
        assert!(
            !out.iter().any(|e| matches!(
                e,
                ClusterEffect::DropIn { .. }
                    | ClusterEffect::ToTable(
                        ClusterToTable::BecomeActive { .. } | ClusterToTable::Follow { .. }
                    )
            )),
            "at {t}: {out:?}"
        );
        assert!(core.roles().is_live(0, t));
    }
    // Once nothing is held and nothing comes, silence counts again.
    core.handle_tick(at(t + core.silence_ms()));
    assert!(effects(&mut core).contains(&ClusterEffect::DropIn { link: 7 }));
    assert!(!core.roles().is_live(0, t + silence_limit_ms(DETECT)));
    // A link still in its handshake is not a peer's: held, it proves
    // nothing and is dropped at its deadline all the same.
    core.handle_in_opened(at(t), 9);
    core.handle_in_held(at(t + HANDSHAKE_MS), 9);
    core.handle_tick(at(t + HANDSHAKE_MS));
    assert!(effects(&mut core).contains(&ClusterEffect::DropIn { link: 9 }));
}
