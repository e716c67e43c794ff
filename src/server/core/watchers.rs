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
//! fans out to its watchers ([`Fanout`]). Unwatched traffic pays one
//! `is_empty` check per change.
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
//!   [`ConnId::watchers`](crate::server::core::events::ConnId::watchers) of that loop), so a `W` answer and the changes
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
//! - **The fan-out in a loop** ([`Fanout`]) costs O(1) per change,
//!   whatever the watchers: the loop keeps, per watched key, its newest
//!   change line (encoded once) and a version (changes seen since the key
//!   was first watched in the loop), and each watch the version it was
//!   last given (its `W` answer takes the key's version when it is
//!   written, so no line older than the answer follows it). The lines go
//!   out in sweeps, after the round's answers, of a bounded number of lines
//!   each: keys in turn, each key's watchers in turn, each watcher behind
//!   given the newest line, whatever came in between (a watcher's version
//!   jumping by more than one counts the states it skipped). While the loop
//!   serves clients the sweeps are paced ([`Pace`]) to a bounded share of
//!   its time. A key that changes again before its watchers have all been
//!   looked at, or within 10 ms, is outrunning its fan-out: its sweeps
//!   get 5% (with a burst of 10 ms after a quiet spell), so 10,000
//!   watchers of a key the clients change as fast as they can cost the
//!   clients little, and the watchers get fewer, newer states. A change that comes after the
//!   key's last pass ended, and at least 10 ms after its last change (a
//!   leader elected, a lock taken now and then), is news its watchers
//!   wait for, and its pass, which ends, may take a quarter of the loop.
//!   An idle loop sweeps back to back.
//! - **Slow watchers.** The loop never waits on a watcher and never grows
//!   memory for one: a line is written into the connection's output only
//!   while that output holds less than [`WATCH_ROOM`] bytes unsent;
//!   otherwise the watch is marked stalled (once), the sweep passes it by,
//!   and when the output drains the connection is given each stalled
//!   key's newest line. A `W` answer supersedes a stalled state. So a
//!   connection costs one mark per watched key beyond `WATCH_ROOM`, and a
//!   slow reader skips intermediate states but always ends on the latest.
//! - **Roles.** A standby answers `W` like every keyed request (`M <active>
//!   W <key>`); the loop then drops the watch it had marked. When the node
//!   stops being active (failover, hand-over, retire), the owner tells each
//!   loop that has watches once (an `M <active|-> W -` entry addressed to
//!   [`ConnId::watchers`](crate::server::core::events::ConnId::watchers)); the loop ends every live watch with `M
//!   <active|-> W <key>` on its connection and drops it (and tells the
//!   owner its interest is gone, as always). A watch whose `W` is still
//!   unanswered then gets its own answer instead. Watches are not
//!   replicated.
//!
//! Run by the lock-owner thread (`Watchers`, inside the lock table) and
//! by the I/O loops (`Fanout` and `Pace`, one each per loop; `WatchQueue`,
//! one per connection that watches).
//!
//! Never does: I/O, clock reads (the pace is told the time), or keep
//! more than one state per watched key in a loop, whatever its watchers.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use crate::protocol::Key;

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
    /// The version of the key's state the connection has last been given
    /// (its `W` answer or a change line), in its loop's [`Fanout`].
    delivered: u64,
    /// A newer state was offered while the output was full: it is given
    /// (the newest then) once the output drains.
    stalled: bool,
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

/// What to do with a key's newest state for one connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery {
    /// The connection does not take it (not live).
    Dropped,
    /// It has that state already (or a newer answer).
    Current,
    /// Write it now; `skipped`: states it never got between its last one
    /// and this.
    Write {
        /// Intermediate states replaced before delivery.
        skipped: u64,
    },
    /// The output is full: it is given the newest state once it drains
    /// ([`WatchQueue::take_stalled`]).
    Stalled,
}

/// A connection's watches, in its I/O loop: the rule of what change lines
/// it gets, with no I/O. See the module doc.
#[derive(Debug, Default)]
pub struct WatchQueue {
    watches: HashMap<Key, Watch>,
    /// Watches that are subscribed (counted against `--max-watches`).
    subscribed: usize,
    /// Keys offered while the output was full, in no particular order
    /// (each once).
    stalled: Vec<Key>,
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
        watch.stalled = false;
        watch.x_in_flight += 1;
        WatchStep::Unwatched { was_watcher }
    }

    /// The owner's `W` answer for `key` is being written, when the loop's
    /// state of the key is at `version`: the watch is live from here on
    /// (unless an `X` sent after that `W` is in flight), and has that
    /// version (the answer is as new), so no older line follows it.
    pub fn answered_watch(&mut self, key: &Key, version: u64) {
        let Some(watch) = self.watches.get_mut(key) else {
            return;
        };
        watch.w_in_flight = watch.w_in_flight.saturating_sub(1);
        watch.delivered = version;
        watch.stalled = false;
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
    /// answer will come. The keys are in order, so what the loop writes
    /// and tells the owner follows from what happened, not from a hash
    /// seed (the simulation replays a seed exactly; a sort of at most
    /// `--max-watches` keys, once per connection per role change).
    pub fn end_live(&mut self) -> Vec<Key> {
        let mut ended = Vec::new();
        for (key, watch) in &mut self.watches {
            if watch.live && watch.w_in_flight == 0 {
                watch.live = false;
                watch.subscribed = false;
                watch.stalled = false;
                ended.push(key.clone());
            } else if watch.live {
                // Its answer (an `M`, or a `W` if the role came back) is
                // coming: no line until then.
                watch.live = false;
                watch.stalled = false;
            }
        }
        self.subscribed -= ended.len();
        for key in &ended {
            self.forget_if_done(key);
        }
        self.stalled.clear();
        ended.sort_unstable();
        ended
    }

    /// The connection closes: the keys it was subscribed to (the loop has
    /// one watcher fewer of each), in order (as [`WatchQueue::end_live`]'s).
    pub fn close(&mut self) -> Vec<Key> {
        let mut keys: Vec<Key> = self
            .watches
            .drain()
            .filter(|(_, watch)| watch.subscribed)
            .map(|(key, _)| key)
            .collect();
        self.subscribed = 0;
        self.stalled.clear();
        keys.sort_unstable();
        keys
    }

    /// The newest state of `key` is at `version`; `has_room`: the
    /// connection's output is below [`WATCH_ROOM`]. A watch offered its
    /// key while the output was full is named by
    /// [`WatchQueue::take_stalled`] once it has room, to be offered again.
    pub fn offer(&mut self, key: &Key, version: u64, has_room: bool) -> Delivery {
        let Some(watch) = self.watches.get_mut(key) else {
            return Delivery::Dropped;
        };
        if !watch.live {
            return Delivery::Dropped;
        }
        if watch.delivered >= version {
            return Delivery::Current;
        }
        if !has_room {
            if !watch.stalled {
                watch.stalled = true;
                self.stalled.push(key.clone());
            }
            return Delivery::Stalled;
        }
        let skipped = version - watch.delivered - 1;
        watch.delivered = version;
        Delivery::Write { skipped }
    }

    /// Some watch waits for room.
    pub fn has_stalled(&self) -> bool {
        !self.stalled.is_empty()
    }

    /// The next key whose newest state waits for room (the output has
    /// room again): offer it again.
    pub fn take_stalled(&mut self) -> Option<Key> {
        while let Some(key) = self.stalled.pop() {
            if let Some(watch) = self.watches.get_mut(&key)
                && std::mem::take(&mut watch.stalled)
            {
                return Some(key);
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

/// One watched key in one loop: its newest state and the loop's
/// connections that watch it.
#[derive(Debug, Default)]
struct Feed {
    /// Changes of the key seen by the loop since the feed began.
    version: u64,
    /// The newest change line, encoded once for every watcher.
    line: Vec<u8>,
    /// The watching connections (loop slots), in the sweep's order.
    members: Vec<usize>,
    /// Where each member is in `members`.
    at: HashMap<usize, usize>,
    /// The next member the sweep looks at.
    cursor: usize,
    /// Members the sweep still has to look at since the last change: the
    /// key is up to date for every watcher with room when this is 0.
    remaining: usize,
    /// The key is in the loop's round-robin of keys to sweep.
    queued: bool,
    /// The key's last change was no news: it came before its watchers had
    /// all been looked at since the change before, or less than
    /// [`NEWS_GAP_US`] after it. Such a key changes faster than its
    /// watchers need to hear of each change, so its sweeps are held to the
    /// share of a key that keeps changing ([`FANOUT_SHARE_DIV`]) instead of
    /// a pass's ([`PASS_SHARE_DIV`]).
    outrun: bool,
    /// When the key last changed (µs on the loop's clock), if it has.
    changed_us: Option<u64>,
}

/// A change that comes less than this many µs after the key's last one is
/// no news, even if that one's pass has ended: a key with a few watchers,
/// whose passes end in microseconds, changed as fast as its clients can,
/// is held to the hammered key's share. A leader elected, a lock taken now
/// and then, change far less often than this.
pub const NEWS_GAP_US: u64 = 10_000;

/// What one [`Fanout::sweep`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Lines written.
    pub lines: usize,
    /// Every line written was of a key not outrunning its fan-out (its
    /// last change came after its last pass ended, and not soon after
    /// the change before): the sweep is paced as part of a pass.
    pub keeping_up: bool,
}

/// A loop's side of the fan-out: per watched key, the newest state (one
/// line and a version) and its watchers, and the keys whose watchers are
/// behind. A change costs O(1) ([`Fanout::change`]); the lines go out in
/// bounded sweeps ([`Fanout::sweep`]), each watcher given the newest
/// state, whatever it skipped. See the module doc.
#[derive(Debug, Default)]
pub struct Fanout {
    feeds: HashMap<Key, Feed>,
    /// Keys with members still to look at, in round-robin order (an entry
    /// of a key no longer watched is dropped when it comes up).
    sweeping: std::collections::VecDeque<Key>,
}

impl Fanout {
    /// Connection `slot` watches `key`; true if it is the loop's first
    /// watcher of it (the owner is to be told).
    pub fn add(&mut self, key: &Key, slot: usize) -> bool {
        let feed = self.feeds.entry(key.clone()).or_default();
        let first = feed.members.is_empty();
        if let Entry::Vacant(entry) = feed.at.entry(slot) {
            entry.insert(feed.members.len());
            feed.members.push(slot);
        }
        first
    }

    /// Connection `slot` no longer watches `key`: `None` if it did not,
    /// else whether it was the loop's last watcher of it (the owner is to
    /// be told).
    pub fn remove(&mut self, key: &Key, slot: usize) -> Option<bool> {
        let feed = self.feeds.get_mut(key)?;
        let i = feed.at.remove(&slot)?;
        feed.members.swap_remove(i);
        if let Some(&moved) = feed.members.get(i) {
            feed.at.insert(moved, i);
        }
        if feed.members.is_empty() {
            self.feeds.remove(key);
            return Some(true);
        }
        if feed.cursor >= feed.members.len() {
            feed.cursor = 0;
        }
        if feed.remaining > 0 {
            // The swap may have moved a member not yet looked at behind
            // the cursor: look at every one again (those up to date cost
            // a comparison).
            feed.remaining = feed.members.len();
        }
        Some(false)
    }

    /// A change of `key` at `now_us`: `write` encodes its line. Nothing if
    /// the loop has no watcher of it. O(1), whatever the watchers.
    pub fn change(&mut self, key: &Key, now_us: u64, write: impl FnOnce(&mut Vec<u8>)) {
        let Some(feed) = self.feeds.get_mut(key) else {
            return;
        };
        feed.version += 1;
        feed.line.clear();
        write(&mut feed.line);
        let soon = feed
            .changed_us
            .is_some_and(|at| now_us.saturating_sub(at) < NEWS_GAP_US);
        feed.outrun = feed.remaining > 0 || soon;
        feed.changed_us = Some(now_us);
        feed.remaining = feed.members.len();
        if !feed.queued {
            feed.queued = true;
            self.sweeping.push_back(key.clone());
        }
    }

    /// The version of `key`'s newest state here (0 before any change).
    pub fn version(&self, key: &Key) -> u64 {
        self.feeds.get(key).map_or(0, |feed| feed.version)
    }

    /// `key`'s newest change line and its version, if it is watched and
    /// has changed.
    pub fn latest(&self, key: &Key) -> Option<(u64, &[u8])> {
        self.feeds
            .get(key)
            .filter(|feed| feed.version > 0)
            .map(|feed| (feed.version, &feed.line[..]))
    }

    /// The loop has watchers of some key.
    pub fn is_watching(&self) -> bool {
        !self.feeds.is_empty()
    }

    /// Some watcher may be behind: the loop must sweep again (and not
    /// sleep).
    pub fn has_work(&self) -> bool {
        !self.sweeping.is_empty()
    }

    /// The loop's watchers of `key`.
    pub fn watchers(&self, key: &Key) -> usize {
        self.feeds.get(key).map_or(0, |feed| feed.members.len())
    }

    /// Look at watchers behind, key by key in turn and each key's
    /// watchers in turn, until `max_lines` lines are written or
    /// `max_looks` watchers looked at. `offer(slot, key, version, line)`
    /// writes the line if the connection takes it (true). A key whose
    /// every watcher has been looked at since its last change leaves the
    /// round-robin; a watcher whose output was full is not looked at
    /// again (its connection offers it the newest when it drains). The
    /// lines written, and whether all were of keys keeping up.
    pub fn sweep(
        &mut self,
        max_lines: usize,
        max_looks: usize,
        mut offer: impl FnMut(usize, &Key, u64, &[u8]) -> bool,
    ) -> Swept {
        let (mut lines, mut looks, mut keeping_up) = (0, 0, true);
        while lines < max_lines && looks < max_looks {
            let Some(key) = self.sweeping.pop_front() else {
                break;
            };
            let Some(feed) = self.feeds.get_mut(&key) else {
                continue;
            };
            while feed.remaining > 0 && lines < max_lines && looks < max_looks {
                let slot = feed.members[feed.cursor];
                feed.cursor = (feed.cursor + 1) % feed.members.len();
                feed.remaining -= 1;
                looks += 1;
                if offer(slot, &key, feed.version, &feed.line) {
                    lines += 1;
                    keeping_up &= !feed.outrun;
                }
            }
            if feed.remaining > 0 {
                self.sweeping.push_back(key);
            } else {
                feed.queued = false;
            }
        }
        Swept { lines, keeping_up }
    }
}

/// A loop serving clients gives the fan-out of keys that keep changing
/// (each change before the last one had reached every watcher: a key its
/// clients change as fast as they can) at most one part in this of its
/// time, over any stretch longer than a burst: in the long run, after a
/// sweep that took `t`, the next waits `t × (this − 1)`. 5%: such a key
/// costs its clients about that much with 1,000 or 10,000 watchers (at
/// 10% the owner's rate fell to 0.8–1.0 of its rate with none, run to
/// run, on a 2-core machine with the clients on it); its watchers get
/// fewer, newer states.
pub const FANOUT_SHARE_DIV: u64 = 20;
/// The share of a pass: the sweeps of a key whose watchers had all caught
/// up before it changed (a leader elected, a lock taken now and then).
/// Such a change is news every watcher waits for, and its pass ends: it
/// may take a quarter of a serving loop's time (at 5%, a pass over 10,000
/// watchers, ~100 ms of writing on a small VM, took 2 s or more while
/// other clients kept the loop busy). A key that changes again before its
/// pass is done, or within [`NEWS_GAP_US`] of its last change, is
/// outrunning it, and is held to [`FANOUT_SHARE_DIV`].
pub const PASS_SHARE_DIV: u64 = 4;
/// The sweep time a serving loop may spend at once, beyond its share,
/// after a spell in which it used less than the share, for a key that
/// keeps changing (a pass may spend `FANOUT_SHARE_DIV / PASS_SHARE_DIV`
/// times as much): so the first changes in a while go out at the loop's
/// full speed for that long (about a thousand lines on a small VM, where
/// a line costs ~10 µs). Earned back at the share's rate.
pub const FANOUT_BURST_US: u64 = 10_000;
/// A loop that served a client within this many µs is serving: its
/// fan-out is paced. One that has not sweeps back to back. Longer than
/// the gaps a busy loop's clients leave when the machine is loaded (a
/// millisecond was not: sweeps then ran back to back in the middle of a
/// closed loop), short beside a sweep of thousands of watchers.
pub const SERVING_US: u64 = 5_000;

/// How far the debt clock may run ahead of now and still let a sweep
/// start: the burst, in wall time at the share's rate.
const BURST_AHEAD_US: u64 = FANOUT_BURST_US * FANOUT_SHARE_DIV;

/// When a loop may sweep its watchers next ([`Fanout::sweep`]), so that
/// the fan-out never holds up the clients: while they are served, the
/// sweeps of keys that keep changing take at most `1 / FANOUT_SHARE_DIV`
/// of the loop's time in the long run, and a pass (the sweeps of a key
/// its watchers had caught up with) at most `1 / PASS_SHARE_DIV`, with a
/// burst beyond that after a quiet spell (each sweep is bounded, so a
/// request waits at most one); when the loop has nothing else to do, they
/// run back to back. A token bucket kept as one debt clock (the generic
/// cell rate algorithm): each sweep of `t` pushes the clock `t × share
/// divisor` on from where it was (or from now, if it was behind), and a
/// sweep may start while the clock is less than `BURST_AHEAD_US` ahead
/// of now. Times are µs on the loop's clock, passed in.
#[derive(Debug, Default)]
pub struct Pace {
    /// The fan-out's debt clock: sweeps so far, each counted at its share
    /// divisor times its length.
    owed_until_us: u64,
    /// When the loop last served a client.
    served_us: Option<u64>,
}

impl Pace {
    /// The loop served a client (sent requests on, wrote answers) at `now_us`.
    pub fn served(&mut self, now_us: u64) {
        self.served_us = Some(now_us);
    }

    /// A sweep may run at `now_us`: at once while no client is served,
    /// else once the debt clock allows.
    pub fn ready(&self, now_us: u64) -> bool {
        !self.serving(now_us) || now_us >= self.next_us()
    }

    /// A client was served less than `SERVING_US` before `now_us`.
    fn serving(&self, now_us: u64) -> bool {
        self.served_us
            .is_some_and(|served| now_us.saturating_sub(served) < SERVING_US)
    }

    /// When the loop last served a client, if it has.
    pub fn served_us(&self) -> Option<u64> {
        self.served_us
    }

    /// When the next sweep may run while clients are served (at once if
    /// none is).
    pub fn next_us(&self) -> u64 {
        self.owed_until_us.saturating_sub(BURST_AHEAD_US)
    }

    /// A sweep ran from `start_us` to `end_us`, part of a pass
    /// (`keeping_up`, see [`Swept`]) or not. One while no client was
    /// served held nobody up and is not charged; nor does it pay off what
    /// is owed, so a loop that goes idle for a moment does not come back
    /// with a fresh burst.
    pub fn swept(&mut self, start_us: u64, end_us: u64, keeping_up: bool) {
        if self.serving(end_us) {
            let spent = end_us.saturating_sub(start_us);
            let div = if keeping_up {
                PASS_SHARE_DIV
            } else {
                FANOUT_SHARE_DIV
            };
            self.owed_until_us = self
                .owed_until_us
                .max(start_us)
                .saturating_add(spent.saturating_mul(div));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> Key {
        Key::new(k.as_bytes()).expect("valid key")
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

    const W: Delivery = Delivery::Write { skipped: 0 };

    #[test]
    fn a_watch_is_live_from_its_answer_until_its_x_is_parsed() {
        let mut q = WatchQueue::default();
        let k = key("k");
        assert_eq!(q.watch(&k, 8), WatchStep::Forward { new_watcher: true });
        // Before the answer: dropped (the answer is newer).
        assert_eq!(q.offer(&k, 1, true), Delivery::Dropped);
        q.answered_watch(&k, 1);
        assert_eq!(
            q.offer(&k, 1, true),
            Delivery::Current,
            "the answer is as new"
        );
        assert_eq!(q.offer(&k, 2, true), W);
        assert_eq!(q.offer(&k, 2, true), Delivery::Current, "given once");
        assert_eq!(q.unwatch(&k), WatchStep::Unwatched { was_watcher: true });
        assert_eq!(q.offer(&k, 3, true), Delivery::Dropped);
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
        q.answered_watch(&k, 0);
        assert_eq!(q.offer(&k, 1, true), Delivery::Dropped);
        q.answered_unwatch(&k);
        assert_eq!(q.offer(&k, 2, true), Delivery::Dropped);
        q.answered_watch(&k, 2);
        assert_eq!(q.offer(&k, 3, true), W);
    }

    #[test]
    fn a_second_w_subscribes_nothing_more_and_lines_keep_flowing() {
        let mut q = WatchQueue::default();
        let k = key("k");
        q.watch(&k, 1);
        q.answered_watch(&k, 0);
        assert_eq!(q.watch(&k, 1), WatchStep::Forward { new_watcher: false });
        assert_eq!(q.watching(), 1);
        assert_eq!(q.offer(&k, 1, true), W);
        q.answered_watch(&k, 1);
        assert_eq!(q.offer(&k, 2, true), W);
        assert_eq!(q.watch(&key("j"), 1), WatchStep::TooMany);
        q.unwatch(&k);
        assert_eq!(
            q.watch(&key("j"), 1),
            WatchStep::Forward { new_watcher: true }
        );
    }

    #[test]
    fn a_slow_watcher_waits_once_per_key_and_gets_the_newest_counting_the_skipped() {
        let mut q = WatchQueue::default();
        let (k, j) = (key("k"), key("j"));
        for key in [&k, &j] {
            q.watch(key, 8);
            q.answered_watch(key, 0);
        }
        assert_eq!(q.offer(&k, 1, true), W);
        for version in 2..1000 {
            assert_eq!(q.offer(&k, version, false), Delivery::Stalled);
        }
        assert_eq!(q.offer(&j, 7, false), Delivery::Stalled);
        let mut stalled = Vec::new();
        while let Some(key) = q.take_stalled() {
            stalled.push(key);
        }
        stalled.sort();
        assert_eq!(stalled, [j.clone(), k.clone()], "each key once");
        assert!(!q.has_stalled());
        // Offered again when it drains: the newest then, once.
        assert_eq!(q.offer(&k, 1000, true), Delivery::Write { skipped: 998 });
        assert_eq!(q.offer(&j, 7, true), Delivery::Write { skipped: 6 });
        assert_eq!(q.offer(&k, 1000, true), Delivery::Current);
        assert_eq!(q.offer(&k, 1001, true), W);
    }

    #[test]
    fn a_w_answer_supersedes_the_state_waiting_for_room() {
        let mut q = WatchQueue::default();
        let k = key("k");
        q.watch(&k, 8);
        q.answered_watch(&k, 0);
        assert_eq!(q.offer(&k, 1, false), Delivery::Stalled);
        q.watch(&k, 8);
        q.answered_watch(&k, 1);
        assert_eq!(q.take_stalled(), None);
        assert_eq!(q.offer(&k, 1, true), Delivery::Current);
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
        q.answered_watch(&k, 0);
        q.watch(&j, 8);
        assert_eq!(q.offer(&k, 1, false), Delivery::Stalled);
        assert_eq!(q.end_live(), std::slice::from_ref(&k));
        assert!(!q.has_stalled());
        assert_eq!(q.watching(), 1);
        assert!(q.moved_watch(&j));
        assert!(q.is_empty());
        // A live watch with a second W in flight waits for that answer.
        q.watch(&k, 8);
        q.answered_watch(&k, 0);
        q.watch(&k, 8);
        assert!(q.end_live().is_empty());
        assert_eq!(q.offer(&k, 2, true), Delivery::Dropped);
        assert!(q.moved_watch(&k));
        assert!(q.is_empty());
    }

    /// A loop's fan-out with `n` connections that watch `k`, each with
    /// its queue answered at version 0 and an output that has room unless
    /// its slot is in `full`.
    struct Loop {
        fanout: Fanout,
        queues: Vec<WatchQueue>,
        full: Vec<bool>,
        /// What each connection was written, in order.
        out: Vec<Vec<Vec<u8>>>,
        /// The time of the last change.
        now_us: u64,
    }

    impl Loop {
        fn new(n: usize, k: &Key) -> Loop {
            let mut l = Loop {
                fanout: Fanout::default(),
                queues: (0..n).map(|_| WatchQueue::default()).collect(),
                full: vec![false; n],
                out: vec![Vec::new(); n],
                now_us: 0,
            };
            for slot in 0..n {
                l.queues[slot].watch(k, 8);
                assert_eq!(l.fanout.add(k, slot), slot == 0);
                l.queues[slot].answered_watch(k, l.fanout.version(k));
            }
            l
        }

        /// A change, `NEWS_GAP_US` after the one before.
        fn change(&mut self, k: &Key, token: u64) {
            self.now_us += NEWS_GAP_US;
            self.change_at(k, token, self.now_us);
        }

        fn change_at(&mut self, k: &Key, token: u64, now_us: u64) {
            self.now_us = now_us;
            self.fanout.change(k, now_us, |line| {
                line.extend_from_slice(token.to_string().as_bytes())
            });
        }

        /// One sweep; the lines written and the states skipped.
        fn sweep(&mut self, max_lines: usize, max_looks: usize) -> (usize, u64) {
            let (swept, skipped) = self.sweep_all(max_lines, max_looks);
            (swept.lines, skipped)
        }

        /// One sweep; what it did and the states skipped.
        fn sweep_all(&mut self, max_lines: usize, max_looks: usize) -> (Swept, u64) {
            let mut skipped = 0;
            let (queues, full, out) = (&mut self.queues, &self.full, &mut self.out);
            let swept =
                self.fanout.sweep(
                    max_lines,
                    max_looks,
                    |slot, key, version, line| match queues[slot].offer(key, version, !full[slot]) {
                        Delivery::Write { skipped: s } => {
                            skipped += s;
                            out[slot].push(line.to_vec());
                            true
                        }
                        _ => false,
                    },
                );
            (swept, skipped)
        }

        /// A connection drained: its stalled watches get the newest.
        fn drain(&mut self, slot: usize) {
            self.full[slot] = false;
            while let Some(key) = self.queues[slot].take_stalled() {
                let (version, line) = self.fanout.latest(&key).expect("changed");
                if let Delivery::Write { .. } = self.queues[slot].offer(&key, version, true) {
                    self.out[slot].push(line.to_vec());
                }
            }
        }
    }

    #[test]
    fn a_change_costs_nothing_per_watcher_and_sweeps_go_round_robin_in_bounded_steps() {
        let k = key("k");
        let mut l = Loop::new(10, &k);
        l.change(&k, 1);
        assert!(l.fanout.has_work());
        assert_eq!(l.sweep(4, 100), (4, 0));
        assert_eq!(l.sweep(4, 100), (4, 0));
        // A newer change before the sweep is done: every watcher gets
        // the newest, the first eight skipping nothing they had not
        // been given, the last two skipping state 1.
        l.change(&k, 2);
        assert_eq!(l.sweep(100, 100), (10, 2));
        assert!(!l.fanout.has_work(), "every watcher is up to date");
        assert_eq!(l.sweep(100, 100), (0, 0));
        for (slot, out) in l.out.iter().enumerate() {
            let want: &[&[u8]] = if slot < 8 { &[b"1", b"2"] } else { &[b"2"] };
            assert_eq!(out, want, "slot {slot}");
        }
        // Looks are bounded too (here every look finds work to do).
        l.change(&k, 3);
        assert_eq!(l.sweep(100, 3), (3, 0));
        assert_eq!(l.sweep(100, 100), (7, 0));
    }

    #[test]
    fn a_key_that_changes_before_its_pass_ends_is_outrunning_it_until_a_pass_ends() {
        let (k, j) = (key("k"), key("j"));
        let mut l = Loop::new(10, &k);
        let kept = |lines| Swept {
            lines,
            keeping_up: true,
        };
        let outrun = |lines| Swept {
            lines,
            keeping_up: false,
        };
        // The first change: a pass, however many sweeps it takes.
        l.change_at(&k, 1, 0);
        assert_eq!(l.sweep_all(4, 100), (kept(4), 0));
        // A change before the pass is done: outrun (the next three never
        // got state 1), however long after the one before.
        l.change_at(&k, 2, 5 * NEWS_GAP_US);
        assert_eq!(l.sweep_all(3, 100), (outrun(3), 3));
        // Still outrun while the key keeps changing before every watcher
        // has been looked at...
        l.change(&k, 3);
        assert_eq!(l.sweep_all(100, 100).0, outrun(10));
        assert!(!l.fanout.has_work());
        // ...and a pass again once one ended before the next change, that
        // came a while after the last...
        l.change(&k, 4);
        assert_eq!(l.sweep_all(100, 100).0, kept(10));
        // ...but not if it came soon after it: a key whose passes end at
        // once (few watchers) changed as fast as its clients can.
        let soon = l.now_us + NEWS_GAP_US - 1;
        l.change_at(&k, 5, soon);
        assert_eq!(l.sweep_all(100, 100).0, outrun(10));
        l.change_at(&k, 6, soon + NEWS_GAP_US);
        assert_eq!(l.sweep_all(100, 100).0, kept(10));
        // A sweep over an outrun key and a key keeping up is not a pass.
        for slot in 0..10 {
            l.queues[slot].watch(&j, 8);
            l.fanout.add(&j, slot);
            l.queues[slot].answered_watch(&j, l.fanout.version(&j));
        }
        l.change(&k, 7);
        assert_eq!(l.sweep_all(2, 100).0, kept(2));
        l.change(&k, 8);
        let now = l.now_us;
        l.fanout
            .change(&j, now, |line| line.extend_from_slice(b"j1"));
        assert_eq!(l.sweep_all(100, 100).0, outrun(20));
        // A sweep that writes nothing is no sweep of an outrun key.
        assert_eq!(l.sweep_all(100, 100).0, kept(0));
    }

    #[test]
    fn a_watcher_with_a_full_output_is_not_looked_at_again_and_gets_the_newest_when_it_drains() {
        let k = key("k");
        let mut l = Loop::new(3, &k);
        l.full[1] = true;
        for token in 1..=50 {
            l.change(&k, token);
            l.sweep(100, 100);
        }
        assert!(!l.fanout.has_work(), "a blocked watcher is no work");
        assert!(l.out[1].is_empty());
        assert_eq!(l.out[0].len(), 50);
        l.drain(1);
        assert_eq!(l.out[1], [b"50".to_vec()], "only the newest");
        l.change(&k, 51);
        assert_eq!(l.sweep(100, 100), (3, 0));
    }

    #[test]
    fn watchers_leaving_mid_sweep_leave_no_one_behind() {
        let k = key("k");
        let mut l = Loop::new(6, &k);
        l.change(&k, 1);
        assert_eq!(l.sweep(2, 100), (2, 0));
        // The first one leaves: the last takes its place in the order.
        assert_eq!(l.fanout.remove(&k, 0), Some(false));
        assert_eq!(l.fanout.remove(&k, 0), None);
        assert_eq!(l.sweep(100, 100), (4, 0));
        assert!(l.out[1..].iter().all(|out| out == &[b"1".to_vec()]));
        for slot in 1..5 {
            assert_eq!(l.fanout.remove(&k, slot), Some(false));
        }
        assert_eq!(l.fanout.remove(&k, 5), Some(true), "the last one");
        assert_eq!(l.fanout.watchers(&k), 0);
        assert_eq!(l.fanout.version(&k), 0);
        // A stale round-robin entry does nothing; an unwatched change is
        // nothing.
        l.change(&k, 2);
        assert_eq!(l.sweep(100, 100), (0, 0));
        assert!(!l.fanout.has_work());
    }

    /// A serving loop that sweeps a key that keeps changing, `sweep` µs
    /// each, whenever the pace lets it, from `from` to `to`: the sweep
    /// time it spent.
    fn sweep_whenever_ready(pace: &mut Pace, from: u64, to: u64, sweep: u64) -> u64 {
        sweep_whenever_ready_as(pace, from, to, sweep, false)
    }

    /// The same, the sweeps part of a pass (`keeping_up`) or not.
    fn sweep_whenever_ready_as(
        pace: &mut Pace,
        from: u64,
        to: u64,
        sweep: u64,
        keeping_up: bool,
    ) -> u64 {
        let (mut now, mut spent) = (from, 0);
        while now < to {
            pace.served(now);
            if pace.ready(now) {
                pace.swept(now, now + sweep, keeping_up);
                spent += sweep;
                now += sweep;
            } else {
                // The clients' round, then a look again.
                now += 7;
            }
        }
        spent
    }

    #[test]
    fn sweeps_take_a_bounded_share_of_a_serving_loop_and_run_back_to_back_when_it_is_idle() {
        let mut pace = Pace::default();
        assert!(pace.ready(0));
        // Idle: back to back.
        pace.swept(100, 150, false);
        assert!(pace.ready(150));
        // Serving from a standstill: a burst back to back, then each sweep
        // of 50 µs followed by 50 × (share − 1) µs for the clients.
        let start = 1_000;
        let mut now = start;
        pace.served(now);
        while pace.ready(now) {
            pace.served(now);
            pace.swept(now, now + 50, false);
            now += 50;
        }
        let burst = now - start;
        assert!(
            (FANOUT_BURST_US..=FANOUT_BURST_US + FANOUT_BURST_US / FANOUT_SHARE_DIV + 50)
                .contains(&burst),
            "{burst}"
        );
        let at = pace.next_us();
        assert!(at > now && at <= now + 50 * (FANOUT_SHARE_DIV - 1), "{at}");
        pace.served(at);
        pace.swept(at, at + 50, false);
        assert_eq!(pace.next_us(), at + 50 * FANOUT_SHARE_DIV);
        assert!(!pace.ready(at + 50 * FANOUT_SHARE_DIV - 1));
        // No client for SERVING_US: idle, back to back, and not charged.
        let late = at + 50 + SERVING_US;
        let owed = pace.next_us();
        assert!(pace.ready(late));
        pace.swept(late, late + 50, false);
        assert!(pace.ready(late + 50));
        assert_eq!(pace.next_us(), owed);
        // A client again: what was owed still holds, no fresh burst.
        pace.served(late + 60);
        assert_eq!(pace.ready(late + 60), late + 60 >= owed);
    }

    #[test]
    fn a_loop_idle_for_moments_gets_no_fresh_burst_each_time() {
        let mut pace = Pace::default();
        // A key that keeps changing, its clients pausing SERVING_US every
        // 50 ms: the share still holds, with one burst in all.
        let (mut now, mut spent) = (0, 0);
        while now < 2_000_000 {
            let until = now + 50_000;
            spent += sweep_whenever_ready(&mut pace, now, until, 50);
            // The pause: nobody served, so the loop sweeps back to back.
            now = until + SERVING_US;
            let mut idle = now;
            while idle < now + 1_000 {
                assert!(pace.ready(idle));
                pace.swept(idle, idle + 50, false);
                idle += 50;
            }
            now = idle;
        }
        // The sweeps while serving, over the wall time, pauses included.
        let most = now / FANOUT_SHARE_DIV + FANOUT_BURST_US + 50;
        assert!(spent <= most, "{spent} > {most}");
    }

    #[test]
    fn a_loop_that_keeps_serving_gives_its_sweeps_the_share_and_one_burst_and_no_more() {
        for sweep in [5, 50, 400] {
            let mut pace = Pace::default();
            let run = 2_000_000;
            let spent = sweep_whenever_ready(&mut pace, 0, run, sweep);
            let most = run / FANOUT_SHARE_DIV + FANOUT_BURST_US + sweep;
            assert!(spent <= most, "{sweep}: {spent} > {most}");
            assert!(
                spent >= run / FANOUT_SHARE_DIV,
                "{sweep}: {spent} too little"
            );
        }
    }

    #[test]
    fn after_a_quiet_spell_the_burst_is_earned_back_at_the_shares_rate() {
        let mut pace = Pace::default();
        // A key that keeps changing: the burst is spent, the share holds.
        sweep_whenever_ready(&mut pace, 0, 500_000, 50);
        let quiet_from = pace.next_us();
        // Quiet (clients served, no change) for half a burst's worth of
        // wall time: half a burst back.
        let half = quiet_from + BURST_AHEAD_US / 2;
        pace.served(half);
        let back = sweep_whenever_ready(&mut pace, half, half + FANOUT_BURST_US, 50);
        assert!(
            (FANOUT_BURST_US / 2..=FANOUT_BURST_US / 2 + FANOUT_BURST_US / FANOUT_SHARE_DIV + 100)
                .contains(&back),
            "{back}"
        );
        // Quiet for much longer: no more than one burst.
        let long = pace.next_us() + 100 * BURST_AHEAD_US;
        let back = sweep_whenever_ready(&mut pace, long, long + 2 * FANOUT_BURST_US, 50);
        assert!(
            back <= FANOUT_BURST_US + 2 * FANOUT_BURST_US / FANOUT_SHARE_DIV + 50,
            "{back}"
        );
    }

    #[test]
    fn a_pass_may_take_a_quarter_of_a_serving_loop_and_shares_the_debt_with_the_rest() {
        for sweep in [5, 50, 400] {
            let mut pace = Pace::default();
            let run = 2_000_000;
            let spent = sweep_whenever_ready_as(&mut pace, 0, run, sweep, true);
            let most = run / PASS_SHARE_DIV + BURST_AHEAD_US / PASS_SHARE_DIV + sweep;
            assert!(spent <= most, "{sweep}: {spent} > {most}");
            assert!(spent >= run / PASS_SHARE_DIV, "{sweep}: {spent} too little");
            // A key that keeps changing right after: no burst of its own,
            // the pass spent it, and it is held to its share from there.
            let then = sweep_whenever_ready(&mut pace, run, 2 * run, sweep);
            let most = run / FANOUT_SHARE_DIV + sweep;
            assert!(then <= most, "{sweep}: {then} > {most}");
            assert!(
                then >= run / FANOUT_SHARE_DIV - BURST_AHEAD_US / FANOUT_SHARE_DIV,
                "{sweep}: {then} too little"
            );
        }
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
