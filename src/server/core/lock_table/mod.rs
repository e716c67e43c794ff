//! The lock table: every held key, its FIFO queue of waiters, its lease timer,
//! and the token counter. This is the state machine at the heart of baton.
//!
//! Owns: all lock state of a node. Runs on the lock-owner thread only (see
//! `owner.rs`), which is the single writer, so nothing here locks anything.
//!
//! Decides without I/O: every `handle_*` takes the current time (`now_ms`, a
//! monotonic millisecond clock of the caller's choosing) and pushes its effects
//! (answers to connections, connections to close) into an [`Outbox`]; the
//! caller sends them. [`LockTable::next_wake_ms`] tells when timers need
//! [`LockTable::poll_timers`] next. Tests drive it with a fake clock.
//!
//! Every key is a semaphore: up to its `limit` grants hold it at once, each
//! with its own token, lease and slot (the lowest of `0..limit` no other
//! live grant of the key holds) and an optional value. A plain mutex is
//! limit 1. The key's limit is set by the acquire that registers it and holds
//! while the key is in the table; an acquire naming another is refused
//! `limit-mismatch`.
//!
//! Layout (memory per held key is what a lock server is judged by): a
//! key's first grant lives in its `KeyState` (token, expiry, lease timer);
//! a key that is more than a plain mutex without a value (limit above 1, or
//! a value given) has a `Sem` in a side slab holding its limit, the first
//! grant's slot and value, its other grants and which slots are taken. A
//! plain mutex key pays 4 bytes for the link to it.
//!
//! Finding a key: an index of slot numbers by the key's keyed hash, hashed
//! once per request at most (`KeyIndex`; each key keeps its 32-bit hash in
//! what was padding); a release or keep first looks where its token was
//! granted (`RecentGrants`, a hint used only when that slot holds the very
//! key named), so the usual acquire-release pair hashes its key once.
//!
//! Invariants (checked whole by `LockTable::check_invariants`, `invariants.rs`,
//! in the tests; the cheap ones asserted where they could break, in every
//! build: holders <= limit, a slot held once, a token not reused, the FIFO
//! line, each O(1), docs/performance.md "Asserts in release builds"):
//! - a key in the table always has 1 to `limit` holders, in distinct slots
//!   below `limit`, each with its lease timer pending with the holder's
//!   expiry as deadline; a key with no holder and no waiter is removed from
//!   the table;
//! - a key has waiters only while all its slots are taken (no barging), or
//!   behind a promotion-grace placeholder (token 0);
//! - every waiter is in exactly one key queue, in its connection's list, and
//!   has a wait timer iff its wait is bounded;
//! - tokens strictly increase across all keys: no two grants share one;
//! - answers to one connection for the same (op, key) leave in arrival order:
//!   a waiter that times out (or is refused) while an earlier waiter of the
//!   same connection waits for the same key has its answer deferred until the
//!   earlier one is answered.
//!
//! Never does: I/O, clock reads, blocking, or trusting a request to be sane
//! beyond what `protocol` already checked.
//!
//! Files: this one holds the types and the table's constructor; `index.rs`
//! finds a key (the keyed-hash index and the recent-grant hint);
//! `slots.rs` where a key's grants live (its `KeyState`, a semaphore's
//! `Sem`); `requests.rs` the requests and the lease timers; `line.rs` the
//! FIFO line, its timeouts and deferred answers; `replica.rs` the deltas,
//! snapshots and their apply on a standby; `watch.rs` the watch hook;
//! `views.rs` the read-only views (`Q`, `/metrics`, `/keys`);
//! `invariants.rs` the check of every invariant above; `tests/` the
//! tests, by the same concerns.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher, RandomState};

use hashbrown::HashTable;

use slab::Slab;

use crate::protocol::{Answer, Key, Op, Reason, Value, WatchState};
use crate::server::core::contention::{
    By, Contended, HolderEntry, KeyEntry, KeysAsk, KeysView, MAX_LISTED_HOLDERS, Rank, held_ms, top,
};
use crate::server::core::counters::TableMetrics;
use crate::server::core::events::{ConnId, Delta};
use crate::server::core::tokens::TokenSource;
use crate::server::core::watchers::Watchers;
use crate::server::core::wheel::{TimerId, TimingWheel};

mod index;
#[cfg(any(test, feature = "test-hooks"))]
mod invariants;
mod line;
mod replica;
mod requests;
mod slots;
mod views;
mod watch;

use index::{KeyIndex, RecentGrants};
use line::{ConnWaiting, Waiter};
use slots::{At, Sem};

pub use views::{HolderView, KeyView};

/// Limits the table enforces; each has a flag in `batond`.
#[derive(Clone, Copy, Debug)]
pub struct TableLimits {
    /// Requests one connection may have waiting in line (`--max-waiting`).
    pub max_waiting_per_conn: u32,
    /// Keys the table may hold (`--max-keys`).
    pub max_keys: usize,
}

impl Default for TableLimits {
    fn default() -> Self {
        TableLimits {
            max_waiting_per_conn: 4096,
            max_keys: 10_000_000,
        }
    }
}

/// What an acquire asks beyond its lease and wait.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ask {
    /// The limit the request named; None: a plain `A` (limit 1, answered
    /// without a slot).
    pub limit: Option<u32>,
    /// The value the grant carries.
    pub value: Option<Value>,
}

impl Ask {
    /// A plain `A` (limit 1, no value).
    pub fn plain() -> Ask {
        Ask::default()
    }
}

/// Effects of a step, for the caller to carry out in order.
#[derive(Debug, Default)]
pub struct Outbox {
    /// Answers, in the order they must be sent (per connection).
    pub answers: Vec<(ConnId, Answer)>,
    /// Connections to close after their answers are written.
    pub closes: Vec<ConnId>,
}

impl Outbox {
    fn answer(&mut self, conn: ConnId, answer: Answer) {
        self.answers.push((conn, answer));
    }
}

/// What the changes recorded so far are (see [`LockTable::changes_ready`]);
/// `TableCore` decides from it when they go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ready {
    /// A handover or extension of a key the standbys hold, that key's one
    /// change since the last batch: it must not wait long.
    pub urgent: bool,
    /// New keys' grants waiting, and when the oldest of them was made.
    pub young: usize,
    pub oldest_young_ms: Option<u64>,
    /// A token ceiling was raised: it goes at once (the standbys' ceiling
    /// is what keeps a promoted node's tokens above every token answered).
    pub ceiling: bool,
    /// There are other changes (frees, keys that changed more than once
    /// since the last batch): they may wait longer.
    pub settled: bool,
}

/// One entry of the batch of changes the standbys have not been sent yet
/// (see [`LockTable::take_deltas`]): each key has at most one `Held`, its
/// last state, kept where the key's first change of the batch put it, and
/// a `Freed` for each of its grants that ended with nobody waiting (a
/// key's last grant ending turns the key's own entry into its `Freed`).
#[derive(Debug)]
enum Change {
    /// The key in this slot is held; its grants (token, lease left, slot,
    /// value: every live one of a semaphore) are read from the table when
    /// the batch is taken. `new_since`: the key was not
    /// in the table before this batch (so the standbys do not hold it), and
    /// came in at that time.
    /// `hot`: a key the standbys hold that changed more than once since
    /// the last batch (their copy is a past state however soon it goes).
    Held {
        slot: u32,
        new_since: Option<u64>,
        hot: bool,
    },
    /// The grant of the key in `slot`, `token`, ended with nobody waiting
    /// (the key left the table if it was its last).
    Freed { key: Key, token: u64, slot: u32 },
    /// Granted and freed within the batch, and unknown to the standbys
    /// before it: nothing to send.
    Gone,
    /// No token at or above this has been issued.
    Ceiling(u64),
}

const NIL: u32 = u32::MAX;

/// Counters for `I`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Keys held (each key once, whatever its number of holders).
    pub held: usize,
    /// Grants held (every holder of a semaphore counts; what `--max-keys`
    /// bounds).
    pub holders: usize,
    /// Changes of some key's set of holders so far (a grant, a release, an
    /// expiry): what a watch would be told of.
    pub holder_changes: u64,
    pub waiting: usize,
    pub last_token: u64,
    /// The largest token this node issued itself.
    pub last_issued: u64,
    /// The largest token known to have been granted, here or in the state
    /// replicated here (`TokenSource::last_granted`).
    pub last_granted: u64,
}

#[derive(Debug)]
struct KeyState {
    key: Key,
    /// The key's hash in the index (`KeyIndex`): kept so that taking the
    /// key out hashes nothing. (It fits in what was padding.)
    hash: u32,
    // The key's first grant (a key in the table always has one).
    token: u64,
    expiry_ms: u64,
    lease_timer: TimerId,
    queue_head: u32,
    queue_tail: u32,
    queue_len: u32,
    /// This key's entry in the batch of unsent changes, or NIL. (It fits in
    /// what was padding: a held key costs no more memory for it.)
    pending: u32,
    /// The key's [`Sem`] in `LockTable::sems`, or NIL: limit 1, and the
    /// grant has no value.
    sem: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    Lease(u32),
    Wait(u32),
}

/// The lock table of one node. See the module doc.
pub struct LockTable {
    limits: TableLimits,
    index: KeyIndex,
    /// Where recent grants were made, by token (a hint for `R` and `K`).
    recent: RecentGrants,
    keys: Slab<KeyState>,
    /// The Sems of keys that have one (see [`KeyState::sem`]).
    sems: Slab<Sem>,
    /// Grants held, every holder of every key (what `max_keys` bounds).
    grants: usize,
    holder_changes: u64,
    waiters: Slab<Waiter>,
    conns: HashMap<ConnId, ConnWaiting>,
    chain_tails: HashMap<(ConnId, u32), u32>,
    wheel: TimingWheel<Timer>,
    tokens: TokenSource,
    fired: Vec<(TimerId, Timer)>,
    /// Until then, keys not held wait instead of being granted at once.
    grace_until_ms: u64,
    metrics: TableMetrics,
    /// Changes are recorded for the standbys (an active cluster node).
    replicate: bool,
    /// The changes not sent to the standbys yet, one per key.
    changes: Vec<Change>,
    /// Entries of `changes` that are new keys' grants, and the time of the
    /// oldest (it may have been freed since: then it is a little early).
    young: usize,
    first_young_ms: Option<u64>,
    /// Entries that are the one change of a key the standbys hold (a
    /// handover or extension of a key that changed once since the batch).
    urgent: usize,
    /// Entries of `changes` that are ceilings.
    ceilings: usize,
    /// The spare buffer `take_deltas` swaps with `changes`.
    kept: Vec<Change>,
    /// Which I/O loops watch which keys (`core/watchers.rs`).
    watchers: Watchers,
    /// Watched keys whose holders changed, not yet told
    /// ([`LockTable::take_watch_lines`]).
    watch_changed: Vec<Key>,
    /// The keys a request waits for (`core/contention.rs`): entered and
    /// left where a line goes from empty to one waiter and back, so the
    /// contention view never looks at keys nobody waits for.
    contended: Contended,
}

impl LockTable {
    /// A table whose clock reads `now_ms` and whose tokens come from `tokens`.
    pub fn new(now_ms: u64, limits: TableLimits, tokens: TokenSource) -> LockTable {
        LockTable {
            limits,
            index: KeyIndex::default(),
            recent: RecentGrants::new(),
            keys: Slab::new(),
            sems: Slab::new(),
            grants: 0,
            holder_changes: 0,
            waiters: Slab::new(),
            conns: HashMap::new(),
            chain_tails: HashMap::new(),
            wheel: TimingWheel::new(now_ms),
            tokens,
            fired: Vec::new(),
            grace_until_ms: 0,
            metrics: TableMetrics::default(),
            replicate: false,
            changes: Vec::new(),
            young: 0,
            first_young_ms: None,
            urgent: 0,
            ceilings: 0,
            kept: Vec::new(),
            watchers: Watchers::default(),
            watch_changed: Vec::new(),
            contended: Contended::default(),
        }
    }

    /// Grants, handoffs, expiries, timeouts and their latencies so far.
    pub fn metrics(&self) -> &TableMetrics {
        &self.metrics
    }

    /// The same, to start a round (see [`TableMetrics::begin_round`]).
    pub fn metrics_mut(&mut self) -> &mut TableMetrics {
        &mut self.metrics
    }

    /// When `poll_timers` must run next, if any timer is pending.
    pub fn next_wake_ms(&self) -> Option<u64> {
        self.wheel.next_wake()
    }

    /// Grants of keys not known as held wait until `until_ms` (the
    /// `--promotion-grace` of a node promoted after a failure).
    pub fn set_grace_until(&mut self, until_ms: u64) {
        self.grace_until_ms = until_ms;
    }
}

#[cfg(test)]
mod tests;
