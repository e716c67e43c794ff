//! Tests of finding a key: the recent-grant hint and the key state's size.

use super::*;
use crate::server::core::lock_table::index::RECENT_GRANTS;

#[test]
fn a_release_whose_token_was_granted_in_a_slot_now_holding_another_key_is_not_held() {
    let mut h = Harness::new();
    let t_a = h.grant(0, C1, "a", 1000);
    assert_eq!(h.release(0, C1, "a", t_a), vec![(C1, released("a"))]);
    // "b" takes the slot "a" had: the hint of `t_a` points at "b" now.
    let t_b = h.grant(0, C2, "b", 1000);
    let hint = h.table.recent.get(t_a) as usize;
    assert_eq!(
        h.table.keys[hint].key,
        key("b"),
        "the scenario: a stale hint"
    );
    assert_eq!(h.release(0, C1, "a", t_a), vec![(C1, not_held("a"))]);
    assert_eq!(h.release(0, C1, "b", t_a), vec![(C1, not_held("b"))]);
    assert_eq!(h.keep(0, C1, "b", t_a, 500), vec![(C1, not_held_keep("b"))]);
    assert_eq!(h.release(0, C2, "b", t_b), vec![(C2, released("b"))]);
}

#[test]
fn a_grant_whose_hint_was_overwritten_by_later_grants_is_still_found() {
    let mut h = Harness::new();
    let t_old = h.grant(0, C1, "old", 100_000);
    // More grants than the hint has entries: every entry is rewritten.
    for i in 0..2 * RECENT_GRANTS {
        let k = format!("k{i}");
        let t = h.grant(0, C2, &k, 1000);
        assert_eq!(h.release(0, C2, &k, t), vec![(C2, released(&k))]);
    }
    assert_eq!(
        h.keep(1, C1, "old", t_old, 100_000),
        vec![(C1, kept("old"))]
    );
    assert_eq!(h.release(1, C1, "old", t_old), vec![(C1, released("old"))]);
}

#[test]
fn a_token_not_granted_here_finds_nothing_whatever_its_hint_holds() {
    let mut h = Harness::new();
    let t = h.grant(0, C1, "a", 1000);
    for forged in [1, t - 1, t + 1, u64::MAX, t ^ (1 << 40)] {
        assert_eq!(h.release(0, C2, "a", forged), vec![(C2, not_held("a"))]);
    }
    assert_eq!(h.release(0, C1, "a", t), vec![(C1, released("a"))]);
}

#[test]
fn a_key_state_stays_small_for_a_plain_mutex() {
    // A plain mutex pays only the link to a Sem: 4 bytes, in what
    // rounds up to one more word.
    assert!(std::mem::size_of::<KeyState>() <= 72);
}
