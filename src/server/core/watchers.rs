//! Watches (`W <key>`, `X <key>`): the lock owner's side, and the
//! per-connection rule the I/O loops follow ([`WatchQueue`]).
//!
//! # The design
//!
//! A change of a key's holders (a grant, at once or to a waiter; a
//! release; an expiry; a handoff from one holder to the next is one
//! change) is told to everyone watching the key, and 10,000 watchers of one
//! key must not cost the lock owner 10,000 answers. So the watcher lists
//! live in the I/O loops: each loop keeps, per key, its connections that
//! watch it, and per connection its watched keys (a [`WatchQueue`], at most
//! `--max-watches` of them). The owner keeps only, per watched key, which
//! loops watch it ([`Watchers`], a 256-bit set per key: loops are at most
//! 256), and sends each of those loops one line per change, which the loop
//! copies to its watchers. Unwatched traffic pays one `is_empty` check per
//! change.
//!
//! - **Interest.** A loop tells the owner when its count of connections
//!   watching a key goes from 0 to 1 (before the `W` that did it) and from
//!   1 to 0 (after the `X` that did it, or when a watching connection
//!   closes, or its watch ends by an `M`). The owner's sets mirror those
//!   counts and nothing else: the loops own the truth, so no message in
//!   flight can leave the two disagreeing.
//! - **W and X go through the owner**, in order with the connection's other
//!   requests. The owner answers `W` with the key's state at the point it
//!   handles it (a lease run out but not yet reclaimed is reclaimed first),
//!   and `X` with `X <key>`. The change lines for a loop are entries of the
//!   same ordered answer list as the answers (addressed to
//!   [`ConnId::watchers`](crate::server::core::lock_table::ConnId::watchers) of that loop), so a `W` answer and the changes
//!   after it keep their order. The lock table notes each watched key
//!   whose holders change (its one hook, `holders_changed`) and the table
//!   core takes the lines after every step (a request, a round's timers):
//!   one line per changed key with its state then, after that step's
//!   answers. A key changed twice in one step (a lease found run out by
//!   the acquire that then takes the key) is told once, in its newest
//!   state. The state is the largest token holding the key, its value,
//!   the live grants and the requests in line.
//! - **What a connection gets** is decided by its [`WatchQueue`]: a watch
//!   is *live* (change lines are copied to it) from its `W` answer on,
//!   until its `X` is parsed (nothing follows `X <key>`). Before its first
//!   answer a change is dropped: the answer, computed later, is newer. A
//!   second `W` for a key already watched answers its state again and
//!   subscribes nothing more; `X` of a key not watched is answered all the
//!   same.
//! - **Slow watchers.** The loop never waits on a watcher and never grows
//!   memory for one: a change line is written into the connection's output
//!   only while that output holds less than [`WATCH_ROOM`] bytes unsent;
//!   otherwise it is kept as the (connection, key)'s one pending state,
//!   replaced by any newer one (each replacement counted as a skipped
//!   line), and written once the output drains. A `W` answer supersedes
//!   the key's pending line. So a connection costs at most one pending line
//!   per watched key beyond `WATCH_ROOM`, and a slow reader skips
//!   intermediate states but always ends on the latest.
//! - **Roles.** A standby answers `W` like every keyed request (`M <active>
//!   W <key>`); the loop then drops the watch it had marked. When the node
//!   stops being active (failover, hand-over, retire), the owner tells each
//!   loop that has watches once (an `M <active|-> W -` entry addressed to
//!   [`ConnId::watchers`](crate::server::core::lock_table::ConnId::watchers)); the loop ends every live watch with `M
//!   <active|-> W <key>` on its connection and drops it (and tells the
//!   owner its interest is gone, as always). A watch whose `W` is still
//!   unanswered then gets its own answer instead. Watches are not
//!   replicated.
//!
//! Run by the lock-owner thread (`Watchers`, inside the lock table) and
//! by the I/O loops (`WatchQueue`, one per connection that watches).
//!
//! Never does: I/O, clock reads, or keep more than one undelivered line
//! per (connection, key).

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use crate::protocol::{Key, WatchState};

/// The most I/O loops a node has (`ConnId` names a loop in 8 bits).
pub const MAX_LOOPS: usize = 256;

/// Unsent bytes in a connection's output below which a change line is
/// written into it; at or above, the line waits as the watch's one pending
/// state.
pub const WATCH_ROOM: usize = 64 * 1024;

/// A set of I/O loops.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoopSet([u64; MAX_LOOPS / 64]);

impl LoopSet {
    fn set(&mut self, worker: usize, on: bool) {
        let (word, bit) = (worker / 64, 1u64 << (worker % 64));
        if on {
            self.0[word] |= bit;
        } else {
            self.0[word] &= !bit;
        }
    }

    /// Whether `worker` is in the set.
    pub fn contains(&self, worker: usize) -> bool {
        worker < MAX_LOOPS && self.0[worker / 64] & (1 << (worker % 64)) != 0
    }

    /// No loop is in the set.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&word| word == 0)
    }

    /// The loops in the set, lowest first.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..MAX_LOOPS).filter(|&worker| self.contains(worker))
    }
}

/// The owner's side: per watched key, which loops watch it. See the
/// module doc.
#[derive(Debug, Default)]
pub struct Watchers {
    keys: HashMap<Key, LoopSet>,
    /// Keys each loop watches (for the end of the active role).
    per_loop: Vec<u32>,
}

impl Watchers {
    /// Nothing is watched: changes cost nothing more.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Loop `worker` watches `key` from now on (`on`), or no longer.
    pub fn set(&mut self, worker: usize, key: Key, on: bool) {
        if worker >= MAX_LOOPS {
            return;
        }
        if self.per_loop.len() <= worker {
            self.per_loop.resize(worker + 1, 0);
        }
        match self.keys.entry(key) {
            Entry::Occupied(mut entry) => {
                let was = entry.get().contains(worker);
                entry.get_mut().set(worker, on);
                if entry.get().is_empty() {
                    entry.remove();
                }
                match (was, on) {
                    (false, true) => self.per_loop[worker] += 1,
                    (true, false) => self.per_loop[worker] -= 1,
                    _ => {}
                }
            }
            Entry::Vacant(entry) if on => {
                let mut set = LoopSet::default();
                set.set(worker, true);
                entry.insert(set);
                self.per_loop[worker] += 1;
            }
            Entry::Vacant(_) => {}
        }
    }

    /// The loops watching `key`, if any does.
    #[inline]
    pub fn loops(&self, key: &Key) -> Option<&LoopSet> {
        if self.keys.is_empty() {
            return None;
        }
        self.keys.get(key)
    }

    /// The loops that watch some key.
    pub fn loops_watching(&self) -> impl Iterator<Item = usize> + '_ {
        self.per_loop
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(worker, _)| worker)
    }

    /// Watched keys (for tests and figures).
    pub fn len(&self) -> usize {
        self.keys.len()
    }
}

/// One watched key of one connection, in its I/O loop.
#[derive(Debug, Default)]
struct Watch {
    /// `W` requests for the key sent to the owner and not answered yet.
    w_in_flight: u32,
    /// `X` requests for the key sent and not answered yet.
    x_in_flight: u32,
    /// The connection wants the key watched (its last `W` or `X` parsed
    /// was a `W`, and no `M` ended it).
    subscribed: bool,
    /// Change lines are copied to the connection.
    live: bool,
    /// The newest state not written yet (the output was full).
    pending: Option<WatchState>,
}

/// What the loop must do after a request line was parsed.
#[derive(Debug, PartialEq, Eq)]
pub enum WatchStep {
    /// Forward the request; first tell the owner the loop now watches the
    /// key (`interest`: the loop's first watcher of it, for the loop to
    /// judge: this queue only says the connection is new to it).
    Forward {
        /// The connection did not watch the key before.
        new_watcher: bool,
    },
    /// Refuse it `E W <key> too-many-watches` (through the owner).
    TooMany,
    /// Forward the `X`; then, if the connection watched the key, the loop
    /// has one watcher fewer of it.
    Unwatched {
        /// The connection watched the key until now.
        was_watcher: bool,
    },
}

/// What became of a change line for one connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery {
    /// The connection does not take it (not live).
    Dropped,
    /// Write it now.
    Write,
    /// Kept as the watch's pending state (the output is full).
    Kept,
    /// Replaced the pending state kept before (a skipped line).
    Replaced,
}

/// A connection's watches, in its I/O loop: the rule of what change lines
/// it gets, with no I/O. See the module doc.
#[derive(Debug, Default)]
pub struct WatchQueue {
    watches: HashMap<Key, Watch>,
    /// Watches that are subscribed (counted against `--max-watches`).
    subscribed: usize,
    /// Keys with a pending line, in no particular order (each once).
    pending: Vec<Key>,
}

impl WatchQueue {
    /// No watch at all (the queue may be dropped).
    pub fn is_empty(&self) -> bool {
        self.watches.is_empty()
    }

    /// Keys the connection watches now (subscribed ones).
    pub fn watching(&self) -> usize {
        self.subscribed
    }

    /// Whether the connection is subscribed to `key`.
    pub fn is_watching(&self, key: &Key) -> bool {
        self.watches.get(key).is_some_and(|w| w.subscribed)
    }

    /// A `W <key>` was parsed; at most `max` keys may be watched.
    pub fn watch(&mut self, key: &Key, max: usize) -> WatchStep {
        if let Some(watch) = self.watches.get_mut(key) {
            let new_watcher = !watch.subscribed;
            if new_watcher && self.subscribed >= max {
                return WatchStep::TooMany;
            }
            watch.w_in_flight += 1;
            if new_watcher {
                watch.subscribed = true;
                self.subscribed += 1;
            }
            return WatchStep::Forward { new_watcher };
        }
        if self.subscribed >= max {
            return WatchStep::TooMany;
        }
        self.watches.insert(
            key.clone(),
            Watch {
                w_in_flight: 1,
                subscribed: true,
                ..Watch::default()
            },
        );
        self.subscribed += 1;
        WatchStep::Forward { new_watcher: true }
    }

    /// An `X <key>` was parsed: from now on no change line for the key.
    pub fn unwatch(&mut self, key: &Key) -> WatchStep {
        let Some(watch) = self.watches.get_mut(key) else {
            return WatchStep::Unwatched { was_watcher: false };
        };
        let was_watcher = watch.subscribed;
        if was_watcher {
            self.subscribed -= 1;
        }
        watch.subscribed = false;
        watch.live = false;
        watch.pending = None;
        watch.x_in_flight += 1;
        WatchStep::Unwatched { was_watcher }
    }

    /// The owner's `W` answer for `key` is being written: the watch is
    /// live from here on (unless an `X` sent after that `W` is in
    /// flight), and its pending line, older than the answer, goes.
    pub fn answered_watch(&mut self, key: &Key) {
        let Some(watch) = self.watches.get_mut(key) else {
            return;
        };
        watch.w_in_flight = watch.w_in_flight.saturating_sub(1);
        watch.pending = None;
        watch.live = watch.subscribed && watch.x_in_flight == 0;
        self.forget_if_done(key);
    }

    /// The owner's `X` answer for `key` is being written.
    pub fn answered_unwatch(&mut self, key: &Key) {
        if let Some(watch) = self.watches.get_mut(key) {
            watch.x_in_flight = watch.x_in_flight.saturating_sub(1);
            self.forget_if_done(key);
        }
    }

    /// The owner answered a `W` for `key` with `M` (a standby, a
    /// role transfer): that `W` watches nothing. True when the connection
    /// stops watching the key by it (the loop has one watcher fewer).
    pub fn moved_watch(&mut self, key: &Key) -> bool {
        let Some(watch) = self.watches.get_mut(key) else {
            return false;
        };
        watch.w_in_flight = watch.w_in_flight.saturating_sub(1);
        let ended = watch.subscribed && !watch.live && watch.w_in_flight == 0;
        if ended {
            watch.subscribed = false;
            self.subscribed -= 1;
        }
        self.forget_if_done(key);
        ended
    }

    /// The node stopped being active: every live watch ends (the loop
    /// writes `M <active> W <key>` for each key returned, and has one
    /// watcher fewer of it). A watch whose `W` is unanswered stays: its
    /// answer will come.
    pub fn end_live(&mut self) -> Vec<Key> {
        let mut ended = Vec::new();
        for (key, watch) in &mut self.watches {
            if watch.live && watch.w_in_flight == 0 {
                watch.live = false;
                watch.subscribed = false;
                watch.pending = None;
                ended.push(key.clone());
            } else if watch.live {
                // Its answer (an `M`, or a `W` if the role came back) is
                // coming: no line until then.
                watch.live = false;
                watch.pending = None;
            }
        }
        self.subscribed -= ended.len();
        for key in &ended {
            self.forget_if_done(key);
        }
        self.pending.retain(|key| {
            self.watches
                .get(key)
                .is_some_and(|watch| watch.pending.is_some())
        });
        ended
    }

    /// The connection closes: the keys it was subscribed to (the loop has
    /// one watcher fewer of each).
    pub fn close(&mut self) -> Vec<Key> {
        let keys = self
            .watches
            .drain()
            .filter(|(_, watch)| watch.subscribed)
            .map(|(key, _)| key)
            .collect();
        self.subscribed = 0;
        self.pending.clear();
        keys
    }

    /// A change of `key` to `state`; `has_room`: the connection's output
    /// is below [`WATCH_ROOM`]. A line kept pending is written by
    /// [`WatchQueue::take_pending`] when the output has room.
    pub fn change(&mut self, key: &Key, state: &WatchState, has_room: bool) -> Delivery {
        let Some(watch) = self.watches.get_mut(key) else {
            return Delivery::Dropped;
        };
        if !watch.live {
            return Delivery::Dropped;
        }
        match &mut watch.pending {
            Some(pending) => {
                *pending = state.clone();
                Delivery::Replaced
            }
            None if has_room => Delivery::Write,
            None => {
                watch.pending = Some(state.clone());
                self.pending.push(key.clone());
                Delivery::Kept
            }
        }
    }

    /// Some line waits for room.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The next pending line to write (the output has room again).
    pub fn take_pending(&mut self) -> Option<(Key, WatchState)> {
        while let Some(key) = self.pending.pop() {
            if let Some(state) = self.watches.get_mut(&key).and_then(|w| w.pending.take()) {
                return Some((key, state));
            }
        }
        None
    }

    /// Drop the entry of `key` once nothing is left to know about it.
    fn forget_if_done(&mut self, key: &Key) {
        if let Some(watch) = self.watches.get(key)
            && !watch.subscribed
            && watch.w_in_flight == 0
            && watch.x_in_flight == 0
        {
            self.watches.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> Key {
        Key::new(k.as_bytes()).expect("valid key")
    }

    fn state(token: u64) -> WatchState {
        WatchState {
            token,
            holders: u64::from(token != 0),
            waiting: 0,
            value: None,
        }
    }

    #[test]
    fn the_owner_knows_which_loops_watch_a_key_and_forgets_it_when_none_does() {
        let mut w = Watchers::default();
        assert!(w.is_empty());
        assert!(w.loops(&key("k")).is_none());
        w.set(3, key("k"), true);
        w.set(200, key("k"), true);
        w.set(3, key("k"), true);
        w.set(3, key("j"), true);
        let loops: Vec<usize> = w.loops(&key("k")).expect("watched").iter().collect();
        assert_eq!(loops, [3, 200]);
        assert_eq!(w.loops_watching().collect::<Vec<_>>(), [3, 200]);
        w.set(3, key("k"), false);
        w.set(3, key("k"), false);
        assert_eq!(
            w.loops(&key("k"))
                .expect("watched")
                .iter()
                .collect::<Vec<_>>(),
            [200]
        );
        w.set(200, key("k"), false);
        assert!(w.loops(&key("k")).is_none());
        assert_eq!(w.len(), 1);
        w.set(3, key("j"), false);
        assert!(w.is_empty());
        assert_eq!(w.loops_watching().count(), 0);
        // Unknown keys and loops out of range change nothing.
        w.set(5, key("z"), false);
        w.set(MAX_LOOPS, key("z"), true);
        assert!(w.is_empty());
    }

    #[test]
    fn a_watch_is_live_from_its_answer_until_its_x_is_parsed() {
        let mut q = WatchQueue::default();
        let k = key("k");
        assert_eq!(q.watch(&k, 8), WatchStep::Forward { new_watcher: true });
        // Before the answer: dropped (the answer is newer).
        assert_eq!(q.change(&k, &state(1), true), Delivery::Dropped);
        q.answered_watch(&k);
        assert_eq!(q.change(&k, &state(2), true), Delivery::Write);
        assert_eq!(q.unwatch(&k), WatchStep::Unwatched { was_watcher: true });
        assert_eq!(q.change(&k, &state(3), true), Delivery::Dropped);
        q.answered_unwatch(&k);
        assert!(q.is_empty());
        // X of a key not watched.
        assert_eq!(q.unwatch(&k), WatchStep::Unwatched { was_watcher: false });
        q.answered_unwatch(&k);
        assert!(q.is_empty());
    }

    #[test]
    fn a_w_answered_before_a_later_x_does_not_bring_the_lines_back() {
        let mut q = WatchQueue::default();
        let k = key("k");
        q.watch(&k, 8);
        q.unwatch(&k);
        // W, X, W pipelined: the first W's answer comes while the X is in flight.
        assert_eq!(q.watch(&k, 8), WatchStep::Forward { new_watcher: true });
        q.answered_watch(&k);
        assert_eq!(q.change(&k, &state(1), true), Delivery::Dropped);
        q.answered_unwatch(&k);
        assert_eq!(q.change(&k, &state(2), true), Delivery::Dropped);
        q.answered_watch(&k);
        assert_eq!(q.change(&k, &state(3), true), Delivery::Write);
    }

    #[test]
    fn a_second_w_subscribes_nothing_more_and_lines_keep_flowing() {
        let mut q = WatchQueue::default();
        let k = key("k");
        q.watch(&k, 1);
        q.answered_watch(&k);
        assert_eq!(q.watch(&k, 1), WatchStep::Forward { new_watcher: false });
        assert_eq!(q.watching(), 1);
        assert_eq!(q.change(&k, &state(1), true), Delivery::Write);
        q.answered_watch(&k);
        assert_eq!(q.change(&k, &state(2), true), Delivery::Write);
        assert_eq!(q.watch(&key("j"), 1), WatchStep::TooMany);
        q.unwatch(&k);
        assert_eq!(
            q.watch(&key("j"), 1),
            WatchStep::Forward { new_watcher: true }
        );
    }

    #[test]
    fn a_slow_watcher_keeps_one_pending_line_per_key_the_newest() {
        let mut q = WatchQueue::default();
        let (k, j) = (key("k"), key("j"));
        for key in [&k, &j] {
            q.watch(key, 8);
            q.answered_watch(key);
        }
        assert_eq!(q.change(&k, &state(1), false), Delivery::Kept);
        for token in 2..1000 {
            assert_eq!(q.change(&k, &state(token), false), Delivery::Replaced);
        }
        // Room again, but a line waits: the new one replaces it, never
        // overtakes it.
        assert_eq!(q.change(&k, &state(1000), true), Delivery::Replaced);
        assert_eq!(q.change(&j, &state(7), false), Delivery::Kept);
        let mut taken = Vec::new();
        while let Some(line) = q.take_pending() {
            taken.push(line);
        }
        taken.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(taken, [(j.clone(), state(7)), (k.clone(), state(1000))]);
        assert!(!q.has_pending());
        assert_eq!(q.change(&k, &state(1001), true), Delivery::Write);
    }

    #[test]
    fn a_w_answer_supersedes_the_pending_line() {
        let mut q = WatchQueue::default();
        let k = key("k");
        q.watch(&k, 8);
        q.answered_watch(&k);
        assert_eq!(q.change(&k, &state(1), false), Delivery::Kept);
        q.watch(&k, 8);
        q.answered_watch(&k);
        assert_eq!(q.take_pending(), None);
    }

    #[test]
    fn a_moved_w_watches_nothing_and_the_end_of_the_role_ends_live_watches() {
        let mut q = WatchQueue::default();
        let (k, j) = (key("k"), key("j"));
        q.watch(&k, 8);
        assert!(q.moved_watch(&k), "an M to the only W ends the watch");
        assert!(q.is_empty());
        // A live watch, and one whose W is unanswered.
        q.watch(&k, 8);
        q.answered_watch(&k);
        q.watch(&j, 8);
        assert_eq!(q.change(&k, &state(1), false), Delivery::Kept);
        assert_eq!(q.end_live(), std::slice::from_ref(&k));
        assert!(!q.has_pending());
        assert_eq!(q.watching(), 1);
        assert!(q.moved_watch(&j));
        assert!(q.is_empty());
        // A live watch with a second W in flight waits for that answer.
        q.watch(&k, 8);
        q.answered_watch(&k);
        q.watch(&k, 8);
        assert!(q.end_live().is_empty());
        assert_eq!(q.change(&k, &state(2), true), Delivery::Dropped);
        assert!(q.moved_watch(&k));
        assert!(q.is_empty());
    }

    #[test]
    fn closing_returns_the_keys_watched() {
        let mut q = WatchQueue::default();
        q.watch(&key("k"), 8);
        q.watch(&key("j"), 8);
        q.unwatch(&key("j"));
        assert_eq!(q.close(), [key("k")]);
        assert!(q.is_empty());
    }
}
