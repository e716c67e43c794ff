//! The contention view's side of the lock table (`GET /keys`,
//! `GET /keys/<key>`): which keys are contended now, kept as it goes, and
//! the plain data a view is copied into for the metrics thread.
//!
//! Owns:
//! - [`Contended`], the set of contended keys (a key is contended while a
//!   request waits in its line), by their slot in the table: a key enters
//!   when its line goes from empty to one waiter and leaves when it empties
//!   again (granted, timed out, its connection closed, redirected), each in
//!   O(1); so a view costs time in the contended keys, never in all keys.
//!   A key's oldest waiter needs no bookkeeping of its own: its line is
//!   FIFO, so it is the head of the line.
//! - [`KeysAsk`] (what the metrics thread wants: how many keys by each
//!   order, which keys looked up) and [`KeysView`] / [`KeyEntry`] /
//!   [`HolderEntry`] (what the lock owner answers, copied between rounds,
//!   so that rendering it never touches the table).
//! - [`top`]: the N first of the contended keys by an order, in
//!   O(contended) (a partial selection, then a sort of N).
//!
//! Runs on the lock-owner thread (inside the lock table); the view types
//! travel to the metrics thread.
//!
//! Never does: I/O, clock reads, or a pass over every key.

use std::collections::HashMap;

use crate::protocol::{Key, Value};

/// The most keys a `/keys?top=N` lists (N is 1 to this).
pub const MAX_TOP: usize = 1000;
/// The most holders a key listed by `/keys?top=N` shows (the ones that
/// have held it longest); `/keys/<key>` shows all of them.
pub const MAX_LISTED_HOLDERS: usize = 100;
/// The most keys one ask may look up (one per metrics connection).
pub const MAX_LOOKUPS: usize = 64;

/// The contended keys, by their slot in the lock table. Entering and
/// leaving are O(1) (a vector and each member's place in it); iterating
/// is O(members), whatever the set held before.
#[derive(Debug, Default)]
pub struct Contended {
    members: Vec<u32>,
    place: HashMap<u32, u32>,
}

impl Contended {
    /// Key `idx`'s line has its first waiter.
    pub fn enter(&mut self, idx: u32) {
        let place = self.members.len() as u32;
        let before = self.place.insert(idx, place);
        debug_assert!(before.is_none(), "a key enters once");
        self.members.push(idx);
    }

    /// Key `idx`'s line is empty again.
    pub fn leave(&mut self, idx: u32) {
        let Some(place) = self.place.remove(&idx) else {
            debug_assert!(false, "only a member leaves");
            return;
        };
        self.members.swap_remove(place as usize);
        if let Some(&moved) = self.members.get(place as usize) {
            self.place.insert(moved, place);
        }
        // Room a burst of contention took is given back once it is over.
        if self.members.capacity() > 64 && self.members.capacity() > 4 * self.members.len() {
            self.members.shrink_to(2 * self.members.len());
            self.place.shrink_to(2 * self.members.len());
        }
    }

    /// How many keys are contended.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Whether key `idx` is contended.
    pub fn contains(&self, idx: u32) -> bool {
        self.place.contains_key(&idx)
    }

    /// The contended keys' slots, in no order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.members.iter().copied()
    }

    /// Nobody waits anywhere any more.
    pub fn clear(&mut self) {
        self.members.clear();
        self.place.clear();
    }
}

/// The orders `/keys` lists contended keys in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum By {
    /// Most requests waiting first (then the oldest waiter).
    Waiting,
    /// Oldest waiter first (then the most waiting).
    Age,
}

impl By {
    /// Its word in `by=` and in the JSON.
    pub fn word(self) -> &'static str {
        match self {
            By::Waiting => "waiting",
            By::Age => "age",
        }
    }
}

/// What the metrics thread asks the lock owner for: the first
/// `top_waiting` contended keys by [`By::Waiting`] and `top_age` by
/// [`By::Age`] (each at most [`MAX_TOP`]; 0 for none), and these keys
/// looked up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeysAsk {
    pub top_waiting: usize,
    pub top_age: usize,
    pub lookups: Vec<Key>,
}

impl KeysAsk {
    /// Whether a view taken for `self` answers `other` too.
    pub fn covers(&self, other: &KeysAsk) -> bool {
        self.top_waiting >= other.top_waiting
            && self.top_age >= other.top_age
            && other.lookups.iter().all(|k| self.lookups.contains(k))
    }

    /// One ask that covers both (lookups capped at [`MAX_LOOKUPS`]).
    pub fn merge(&mut self, other: &KeysAsk) {
        self.top_waiting = self.top_waiting.max(other.top_waiting).min(MAX_TOP);
        self.top_age = self.top_age.max(other.top_age).min(MAX_TOP);
        for key in &other.lookups {
            if self.lookups.len() < MAX_LOOKUPS && !self.lookups.contains(key) {
                self.lookups.push(key.clone());
            }
        }
    }
}

/// One live grant of a key, as the view shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderEntry {
    pub token: u64,
    pub slot: u32,
    pub value: Option<Value>,
    /// Since it was granted (read from its token: see
    /// [`held_ms`]).
    pub held_ms: u64,
    /// Until its lease runs out.
    pub ms_left: u64,
}

/// One key, as the view shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyEntry {
    pub key: Key,
    pub limit: u32,
    pub waiting: u32,
    /// How long the oldest request in line has waited (0: nobody waits).
    pub oldest_wait_ms: u64,
    /// Its holders, longest held first (in a list, at most
    /// [`MAX_LISTED_HOLDERS`]).
    pub holders: Vec<HolderEntry>,
    /// Holders left out of `holders` (only in a list, past
    /// [`MAX_LISTED_HOLDERS`]).
    pub more_holders: u32,
}

/// The view the lock owner copies for the metrics thread between two
/// rounds: the answer to a [`KeysAsk`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeysView {
    /// What it was taken for.
    pub ask: KeysAsk,
    /// `active` or `standby`.
    pub role: &'static str,
    /// The node's name (its client address, as `I` names it).
    pub node: String,
    /// How many keys are contended in all.
    pub contended: usize,
    /// The first `ask.top_waiting` contended keys by [`By::Waiting`].
    pub by_waiting: Vec<KeyEntry>,
    /// The first `ask.top_age` contended keys by [`By::Age`].
    pub by_age: Vec<KeyEntry>,
    /// Each key of `ask.lookups`, and its entry if it has a holder or a
    /// waiter.
    pub lookups: Vec<(Key, Option<KeyEntry>)>,
}

/// How long a grant of `token` has been held at `unix_ms`: a token carries
/// the wall-clock millisecond it was issued in (every token is above
/// `unix_ms × 2^20` of the round that issued it, and above it by much less
/// than 2^20 — `tokens::clock_floor`), so no time needs to be kept per
/// grant. Exact to the millisecond on the node that granted it; elsewhere
/// (a standby, a promoted node) within the nodes' clock skew, and short by
/// at most `tokens::LEAD_MS` for tokens issued just after a start or a
/// promotion (which begin a little ahead of the clock).
pub fn held_ms(token: u64, unix_ms: u64) -> u64 {
    unix_ms.saturating_sub(token >> 20)
}

/// One contended key as [`top`] orders it: its slot in the table, how many
/// wait, and when its oldest waiter came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rank {
    pub idx: u32,
    pub waiting: u32,
    pub oldest_since_ms: u64,
}

/// The first `n` of `ranks` by `by` (ties: the other order, then the slot,
/// so the result is the same whatever order `ranks` came in). O(len + n
/// log n).
pub fn top(mut ranks: Vec<Rank>, by: By, n: usize) -> Vec<Rank> {
    let order = |a: &Rank, b: &Rank| match by {
        By::Waiting => b
            .waiting
            .cmp(&a.waiting)
            .then(a.oldest_since_ms.cmp(&b.oldest_since_ms))
            .then(a.idx.cmp(&b.idx)),
        By::Age => a
            .oldest_since_ms
            .cmp(&b.oldest_since_ms)
            .then(b.waiting.cmp(&a.waiting))
            .then(a.idx.cmp(&b.idx)),
    };
    if n == 0 {
        return Vec::new();
    }
    if n < ranks.len() {
        ranks.select_nth_unstable_by(n - 1, order);
        ranks.truncate(n);
    }
    ranks.sort_unstable_by(order);
    ranks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_set_takes_keys_in_and_out_in_any_order() {
        let mut set = Contended::default();
        for idx in [5, 9, 2, 7] {
            set.enter(idx);
        }
        set.leave(9);
        set.leave(5);
        set.enter(11);
        let mut now: Vec<u32> = set.iter().collect();
        now.sort_unstable();
        assert_eq!(now, [2, 7, 11]);
        assert!(set.contains(7) && !set.contains(9));
        for idx in [7, 2, 11] {
            set.leave(idx);
        }
        assert!(set.is_empty());
        // A burst's room is given back.
        for idx in 0..10_000 {
            set.enter(idx);
        }
        for idx in 0..10_000 {
            set.leave(idx);
        }
        assert!(set.members.capacity() <= 128, "{}", set.members.capacity());
    }

    fn rank(idx: u32, waiting: u32, since: u64) -> Rank {
        Rank {
            idx,
            waiting,
            oldest_since_ms: since,
        }
    }

    #[test]
    fn top_orders_by_waiting_or_by_age_with_stable_ties() {
        let ranks = vec![
            rank(1, 3, 50),
            rank(2, 9, 70),
            rank(3, 3, 10),
            rank(4, 1, 5),
            rank(5, 9, 70),
        ];
        let idx = |r: Vec<Rank>| r.iter().map(|r| r.idx).collect::<Vec<_>>();
        assert_eq!(idx(top(ranks.clone(), By::Waiting, 10)), [2, 5, 3, 1, 4]);
        assert_eq!(idx(top(ranks.clone(), By::Waiting, 3)), [2, 5, 3]);
        assert_eq!(idx(top(ranks.clone(), By::Age, 2)), [4, 3]);
        assert_eq!(idx(top(ranks.clone(), By::Age, 5)), [4, 3, 1, 2, 5]);
        assert!(top(ranks, By::Age, 0).is_empty());
    }

    #[test]
    fn an_ask_covers_smaller_ones_and_merges_within_bounds() {
        let k = |s: &str| Key::new(s.as_bytes()).expect("key");
        let mut a = KeysAsk {
            top_waiting: 20,
            top_age: 0,
            lookups: vec![k("a")],
        };
        let b = KeysAsk {
            top_waiting: 5,
            top_age: 7,
            lookups: vec![k("b"), k("a")],
        };
        assert!(!a.covers(&b));
        a.merge(&b);
        assert_eq!((a.top_waiting, a.top_age), (20, 7));
        assert_eq!(a.lookups, [k("a"), k("b")]);
        assert!(a.covers(&b) && a.covers(&KeysAsk::default()));
    }

    #[test]
    fn held_time_is_read_from_the_token() {
        let token = (1_700_000_000_000u64 << 20) | (3 << 4) | 1;
        assert_eq!(held_ms(token, 1_700_000_000_000), 0);
        assert_eq!(held_ms(token, 1_700_000_004_250), 4_250);
        // A clock behind the token's (skew): never negative.
        assert_eq!(held_ms(token, 1_699_999_999_000), 0);
    }
}
