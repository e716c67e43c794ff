//! Tests of the cluster core, with the helpers the test files share.

mod checks;
mod links;
mod stream;

use super::*;

use crate::protocol::Key;

use crate::server::core::roles::{Beat, RoleName};

const DETECT: u64 = 400;

fn at(ms: u64) -> Now {
    Now::at(ms, 1_700_000_000_000 + ms)
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("n{i}:1")).collect()
}

fn beat(role: RoleName, following: Option<usize>, synced: bool) -> PeerMsg {
    PeerMsg::Beat {
        beat: Beat {
            role,
            following,
            synced,
            has_state: synced,
        },
        last_token: 0,
        ceiling: 0,
    }
}

/// An active's heartbeat that holds the state, with its tokens.
fn active_beat(last_token: u64, ceiling: u64) -> PeerMsg {
    PeerMsg::Beat {
        beat: Beat {
            role: RoleName::Active,
            following: None,
            synced: false,
            has_state: true,
        },
        last_token,
        ceiling,
    }
}

fn effects(core: &mut ClusterCore) -> Vec<ClusterEffect> {
    core.poll_effects().collect()
}

fn key(k: &str) -> Key {
    Key::new(k.as_bytes()).expect("valid key")
}

/// Node `me` of 2 with its outgoing link to the other up and an
/// incoming link (id 7) from it that proved the key.
fn linked(me: usize) -> ClusterCore {
    linked_with(me, ClusterParams::with_detect(DETECT))
}

fn linked_with(me: usize, params: ClusterParams) -> ClusterCore {
    let other = 1 - me;
    let mut core = ClusterCore::new(me, names(2), params, at(0));
    core.handle_tick(at(0));
    assert!(effects(&mut core).contains(&ClusterEffect::Dial { peer: other }));
    core.handle_link_up(at(1), other);
    core.handle_in_opened(at(1), 7);
    core.handle_in_authenticated(at(1), 7, other);
    effects(&mut core);
    core
}

/// Tick `core` every ms from `from` until it dials `p`: the wait is
/// what the core chose. Returns that time.
fn next_dial(core: &mut ClusterCore, p: usize, from: u64) -> u64 {
    (from..from + 10 * RECONNECT_MAX_MS)
        .find(|&t| {
            core.handle_tick(at(t));
            effects(core).contains(&ClusterEffect::Dial { peer: p })
        })
        .expect("it dials")
}

/// The next dial to `p` from `from` on, reported up; returns its time.
fn dial_up(core: &mut ClusterCore, p: usize, from: u64) -> u64 {
    let t = next_dial(core, p, from);
    core.handle_link_up(at(t), p);
    t
}

/// Node `me` of 2, alone until `ms` (so active if `ms` is past the
/// detection time), then linked both ways with the other node.
fn linked_at(me: usize, ms: u64) -> ClusterCore {
    let other = 1 - me;
    let mut core = new_core(me, 2);
    core.handle_tick(at(ms));
    let t = dial_up(&mut core, other, ms);
    core.handle_in_opened(at(t), 7);
    core.handle_in_authenticated(at(t), 7, other);
    effects(&mut core);
    core
}

fn new_core(me: usize, nodes: usize) -> ClusterCore {
    ClusterCore::new(me, names(nodes), ClusterParams::with_detect(DETECT), at(0))
}

/// The cap of the backoff after links dropped over refused state:
/// `--detect`/2, jitter included.
fn redial_cap() -> u64 {
    DETECT / 2
}

/// Waits of a backoff that doubles from RECONNECT_MS to the cap (each
/// within its ±25% jitter, never above the cap), after a first redial
/// at once.
fn assert_backs_off(waits: &[u64]) {
    let cap = redial_cap();
    assert_eq!(waits[0], 0, "the first redial is at once: {waits:?}");
    assert!(
        (RECONNECT_MS * 3 / 4..=RECONNECT_MS * 5 / 4).contains(&waits[1]),
        "then as after a failed dial: {waits:?}"
    );
    assert!(waits[2] > waits[1], "doubling: {waits:?}");
    assert!(waits.iter().all(|&w| w <= cap), "{waits:?}");
    assert!(
        waits[waits.len() - 1] >= cap * 3 / 4,
        "reaches the cap: {waits:?}"
    );
}

/// Active `core` (node 0 of 2) hears node 1 follow it (not synced) on
/// incoming link `link`, and sends it a snapshot on its link at `t`.
fn snapshot_to_follower(core: &mut ClusterCore, link: LinkId, t: u64) {
    core.handle_peer_msg(at(t), link, beat(RoleName::Standby, Some(0), false));
    core.handle_tick(at(t));
    let wanted = 1;
    assert!(asked(&effects(core), wanted).is_some());
    let ask = core.outs[1].snap_ask;
    core.handle_table(at(t), whole(1, ask, 99));
    effects(core);
}

/// Node 0, active, with its follower node 1 linked both ways; the
/// incoming link is `link`.
fn active_with_follower(detect_ms: u64, link: LinkId) -> (ClusterCore, u64) {
    let mut core = ClusterCore::new(0, names(2), ClusterParams::with_detect(detect_ms), at(0));
    core.handle_tick(at(detect_ms + 1));
    let t = dial_up(&mut core, 1, detect_ms + 1);
    assert!(core.roles().role_name().is_active());
    core.handle_in_opened(at(t), link);
    core.handle_in_authenticated(at(t), link, 1);
    effects(&mut core);
    (core, t)
}

/// One round of a follower refusing the snapshot of active `core`:
/// both links come up (incoming `link`), the snapshot goes out, and the
/// follower drops both links 1 ms later, its incoming one seen first
/// or last. Returns when the round ends.
/// `rounds` rounds of the follower (node 1) dropping every link of
/// this active right after its snapshot, the first over incoming link
/// `link`, the incoming one seen first every other round: the wait
/// before each redial, and the time and incoming link after the last.
fn refused_rounds(
    core: &mut ClusterCore,
    mut now: u64,
    mut link: LinkId,
    rounds: usize,
) -> (Vec<u64>, u64, LinkId) {
    let mut waits = Vec::new();
    for round in 0..rounds {
        let down = refused_round(core, link, now, round % 2 == 0);
        now = dial_up(core, 1, down);
        waits.push(now - down);
        link = new_in_link(core, now, link, 1);
    }
    (waits, now, link)
}

/// Peer `from` opens a new incoming link (the one after `link`) at `t`
/// and proves the key; effects taken. The new link.
fn new_in_link(core: &mut ClusterCore, t: u64, link: LinkId, from: usize) -> LinkId {
    let link = link + 1;
    core.handle_in_opened(at(t), link);
    core.handle_in_authenticated(at(t), link, from);
    effects(core);
    link
}

fn refused_round(core: &mut ClusterCore, link: LinkId, t: u64, in_first: bool) -> u64 {
    snapshot_to_follower(core, link, t);
    if in_first {
        // This node drops its outgoing link with it (no report).
        core.handle_in_closed(at(t + 1), link, "eof");
    } else {
        core.handle_link_down(at(t + 1), 1, OutDown::Failed, "eof");
        core.handle_in_closed(at(t + 1), link, "eof");
    }
    t + 1
}

/// The deltas the core passed to the lock owner in these effects.
fn to_table_deltas(out: &[ClusterEffect]) -> Vec<Delta> {
    out.iter()
        .filter_map(|e| match e {
            ClusterEffect::ToTable(ClusterToTable::Deltas(d)) => Some(d.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

/// Ten minutes: far more than MAX_PEER_AHEAD_MS.
const BEHIND_MS: u64 = 600_000;

/// A heartbeat of a node whose clock is BEHIND_MS ahead of this node's
/// (as `at` reads it), with the tokens such a node has: its clock floor
/// and a ceiling just above.
fn beat_from_ahead(ms: u64, role: RoleName, following: Option<usize>) -> PeerMsg {
    let theirs = at(ms).unix_ms + BEHIND_MS;
    PeerMsg::Beat {
        beat: Beat {
            role,
            following,
            synced: false,
            has_state: true,
        },
        last_token: tokens::start_floor(theirs),
        ceiling: tokens::start_floor(theirs + tokens::LEAD_MS),
    }
}

/// A token of a node whose clock is BEHIND_MS ahead of this one's.
fn token_from_ahead(ms: u64) -> u64 {
    tokens::start_floor(at(ms).unix_ms + BEHIND_MS)
}

/// The values of every Observe in these effects.
fn observed(out: &[ClusterEffect]) -> Vec<u64> {
    out.iter()
        .filter_map(|e| match e {
            ClusterEffect::ToTable(ClusterToTable::Observe(t)) => Some(*t),
            _ => None,
        })
        .collect()
}

/// The `ask` of the snapshot `out` asks the lock owner for, for `peer`.
fn asked(out: &[ClusterEffect], peer: usize) -> Option<u64> {
    out.iter().find_map(|e| match e {
        ClusterEffect::ToTable(ClusterToTable::SnapshotWanted { peer: p, ask }) if *p == peer => {
            Some(*ask)
        }
        _ => None,
    })
}

/// A snapshot for `peer` in one piece (its first and its last).
fn whole(peer: usize, ask: u64, ceiling: u64) -> TableToCluster {
    TableToCluster::SnapshotChunk {
        peer,
        ask,
        ceiling: Some(ceiling),
        held: 0,
        entries: vec![],
        last: true,
    }
}

/// The lock owner's answer to the end of the snapshot just passed to it:
/// it took it whole.
fn took(core: &mut ClusterCore, now: Now) {
    let seq = core.snapshot_seq;
    core.handle_table(now, TableToCluster::SnapshotTaken { seq });
}
