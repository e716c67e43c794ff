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
//! Invariants (checked by [`LockTable::check_invariants`] in tests and asserted
//! where cheap):
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
//! beyond what `protocol.rs` already checked.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher, RandomState};

use hashbrown::HashTable;

use slab::Slab;

use crate::protocol::{Answer, Key, Op, Reason, Value, WatchState};
use crate::server::core::contention::{
    By, Contended, HolderEntry, KeyEntry, KeysAsk, KeysView, MAX_LISTED_HOLDERS, Rank, held_ms, top,
};
use crate::server::core::counters::TableMetrics;
use crate::server::core::tokens::TokenSource;
use crate::server::core::watchers::Watchers;
use crate::server::core::wheel::{TimerId, TimingWheel};

/// A client connection, named by the I/O loop that owns it: loop index in the
/// top 8 bits, slab slot in the next 24, a serial in the low 32 so that an
/// answer for a closed connection never reaches a new one in the same slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// The slab slot no connection has: [`ConnId::watchers`] names it.
const WATCHERS_SLOT: usize = (1 << 24) - 1;

impl ConnId {
    pub fn new(worker: usize, slot: usize, serial: u32) -> ConnId {
        debug_assert!(worker < 256 && slot < WATCHERS_SLOT);
        ConnId(((worker as u64) << 56) | ((slot as u64) << 32) | serial as u64)
    }
    /// Not a connection: the watchers of I/O loop `worker`. An answer
    /// addressed so is a change line for every connection of that loop
    /// that watches its key (`core/watchers.rs`), kept in order with the
    /// loop's answers.
    pub fn watchers(worker: usize) -> ConnId {
        ConnId(((worker as u64) << 56) | ((WATCHERS_SLOT as u64) << 32))
    }
    /// This names a loop's watchers ([`ConnId::watchers`]), no connection.
    pub fn is_watchers(self) -> bool {
        self.slot() == WATCHERS_SLOT
    }
    pub fn worker(self) -> usize {
        (self.0 >> 56) as usize
    }
    pub fn slot(self) -> usize {
        ((self.0 >> 32) & 0xFF_FFFF) as usize
    }
    pub fn serial(self) -> u32 {
        self.0 as u32
    }
}

/// `conn 2-17`: the I/O loop, then that loop's connection serial, for logs
/// (the slab slot is an internal detail and is left out).
impl std::fmt::Display for ConnId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "conn {}-{}", self.worker(), self.serial())
    }
}

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

/// One live grant of a key, as [`LockTable::key_view`] shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HolderView<'a> {
    pub token: u64,
    pub slot: u32,
    /// When its lease runs out (the table's clock).
    pub expiry_ms: u64,
    pub value: Option<&'a Value>,
}

/// A key's state now, for watches and replication: its limit, how many
/// wait, and its holders.
#[derive(Clone, Copy, Debug)]
pub struct KeyView<'a> {
    state: &'a KeyState,
    sem: Option<&'a Sem>,
}

impl<'a> KeyView<'a> {
    /// The key's limit (1 for a plain mutex).
    pub fn limit(&self) -> u32 {
        self.sem.map_or(1, |sem| sem.limit)
    }

    /// Requests in line for the key.
    pub fn waiting(&self) -> u32 {
        self.state.queue_len
    }

    /// The key's live grants, in no particular order (a promotion-grace
    /// placeholder, token 0, is not a grant and is left out).
    pub fn holders(&self) -> impl Iterator<Item = HolderView<'a>> + use<'a> {
        let state = self.state;
        let first = HolderView {
            token: state.token,
            slot: self.sem.map_or(0, |sem| sem.first_slot),
            expiry_ms: state.expiry_ms,
            value: self.sem.and_then(|sem| sem.first_value.as_ref()),
        };
        let more = self.sem.into_iter().flat_map(|sem| {
            sem.more.iter().map(|g| HolderView {
                token: g.token,
                slot: g.slot,
                expiry_ms: g.expiry_ms,
                value: g.value.as_ref(),
            })
        });
        std::iter::once(first).chain(more).filter(|h| h.token != 0)
    }

    /// The newest live grant (the largest token), if any.
    pub fn newest(&self) -> Option<HolderView<'a>> {
        self.holders().max_by_key(|h| h.token)
    }

    /// A `Delta::Grant` for each holder, its lease left counted from
    /// `now_ms`.
    fn deltas(self, now_ms: u64) -> impl Iterator<Item = Delta> + 'a {
        let state: &'a KeyState = self.state;
        let key = &state.key;
        let limit = self.limit();
        self.holders().map(move |h| Delta::Grant {
            key: key.clone(),
            token: h.token,
            ms_left: h.expiry_ms.saturating_sub(now_ms),
            limit,
            slot: h.slot,
            value: h.value.cloned(),
        })
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

/// A change of lock state, as replicated from the active to its standbys.
/// One grant each: a semaphore's holders are a `Grant` per slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delta {
    /// `key`, of `limit`, is held in `slot` by `token` for `ms_left` more
    /// milliseconds, carrying `value` (a new grant, a handover, or an
    /// extension). A standby puts it in that slot: its grant with the same
    /// token is extended; an older grant in the slot was handed over (its
    /// end coalesced away) and is replaced; a key held there with another
    /// limit is the active's no more, and goes first.
    Grant {
        key: Key,
        token: u64,
        ms_left: u64,
        limit: u32,
        slot: u32,
        value: Option<Value>,
    },
    /// The grant of `key` in `slot`, held by `token`, ended (released or
    /// expired, nobody waiting). A standby frees the key's grant in that
    /// slot if it is this token or an older one (the grants between may
    /// have been coalesced away); the key goes with its last grant.
    Free { key: Key, token: u64, slot: u32 },
    /// No token at or above this has been issued: a promoted node starts above it.
    Ceiling(u64),
}

impl Delta {
    /// A plain mutex's grant: limit 1, slot 0, no value.
    pub fn grant(key: Key, token: u64, ms_left: u64) -> Delta {
        Delta::Grant {
            key,
            token,
            ms_left,
            limit: 1,
            slot: 0,
            value: None,
        }
    }

    /// The end of a plain mutex's grant (slot 0).
    pub fn free(key: Key, token: u64) -> Delta {
        Delta::Free {
            key,
            token,
            slot: 0,
        }
    }
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

/// Key → slot of the table. It stores only slot numbers, hashed by the key
/// kept in the slot, so each key's bytes are stored once (memory per held
/// key is what a lock server is judged by). Hashing is keyed (SipHash with
/// a random key), so keys chosen by clients cannot force collisions.
///
/// A request hashes its key at most once (SipHash is the lock owner's
/// largest cost per request after the answer itself): a miss hands its
/// hash to the insert that follows ([`KeyIndex::find`]), and each key keeps
/// its hash ([`KeyState::hash`], 32 bits, in what was padding), so taking
/// it out, or moving it when the table grows, hashes nothing. A release or
/// keep names its grant's token, which usually finds the key with no hash
/// at all ([`RecentGrants`]).
struct KeyIndex {
    table: HashTable<u32>,
    hasher: RandomState,
}

impl Default for KeyIndex {
    fn default() -> KeyIndex {
        KeyIndex {
            table: HashTable::new(),
            hasher: RandomState::new(),
        }
    }
}

/// The 32 bits of a key's hash that it keeps ([`KeyState::hash`]): one
/// `write` of the key's bytes (a slice's `Hash` would add a second, for its
/// length, which a single field does not need).
fn key_hash(hasher: &RandomState, key: &Key) -> u32 {
    let mut state = hasher.build_hasher();
    state.write(key.as_bytes());
    state.finish() as u32
}

/// A kept hash as the index uses it: the same 32 bits in the low half
/// (where the table's bucket comes from) and the high half (where its tag
/// bits come from).
fn spread(hash: u32) -> u64 {
    u64::from(hash) | u64::from(hash) << 32
}

impl KeyIndex {
    fn hash(&self, key: &Key) -> u32 {
        key_hash(&self.hasher, key)
    }

    /// The key's slot, or, when it has none, its hash (for [`KeyIndex::insert`]).
    fn find(&self, keys: &Slab<KeyState>, key: &Key) -> Result<u32, u32> {
        let hash = self.hash(key);
        match self
            .table
            .find(spread(hash), |&i| keys[i as usize].key == *key)
        {
            Some(&idx) => Ok(idx),
            None => Err(hash),
        }
    }

    fn get(&self, keys: &Slab<KeyState>, key: &Key) -> Option<u32> {
        self.find(keys, key).ok()
    }

    /// Index slot `idx`, which must hold a key not indexed yet, with its
    /// kept hash.
    fn insert(&mut self, keys: &Slab<KeyState>, idx: u32) {
        let hash = keys[idx as usize].hash;
        debug_assert_eq!(
            hash,
            self.hash(&keys[idx as usize].key),
            "the key's own hash"
        );
        self.table
            .insert_unique(spread(hash), idx, |&i| spread(keys[i as usize].hash));
    }

    /// Forget slot `idx`, whose key's kept hash is `hash` (the slot may be
    /// gone already).
    fn remove(&mut self, hash: u32, idx: u32) {
        if let Ok(entry) = self.table.find_entry(spread(hash), |&i| i == idx) {
            entry.remove();
        }
    }

    fn len(&self) -> usize {
        self.table.len()
    }

    fn clear(&mut self) {
        self.table.clear();
    }
}

/// Which slot of the table the recent grants were made in, by token, so
/// that a release or keep (which names its grant's token) finds its key
/// without hashing it. A hint, never trusted: it is used only when that
/// slot holds the very key the request names (then it is that key's slot,
/// since a key has one), and otherwise the index is asked. A grant's entry
/// lasts until a later grant lands on the same entry (`RECENT_GRANTS` of
/// them, spread by a multiplicative hash of the token), so a key held for
/// a long while on a busy node is found by its hash as before.
struct RecentGrants {
    slots: Box<[u32]>,
}

/// Entries of [`RecentGrants`] (a power of two): 16 KiB.
const RECENT_GRANTS: usize = 4096;

impl RecentGrants {
    fn new() -> RecentGrants {
        RecentGrants {
            slots: vec![NIL; RECENT_GRANTS].into_boxed_slice(),
        }
    }

    fn entry(token: u64) -> usize {
        // Fibonacci hashing: consecutive tokens land far apart; the top
        // bits are the entry.
        (token.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - RECENT_GRANTS.trailing_zeros()))
            as usize
    }

    /// `token` was just granted in slot `idx`.
    fn note(&mut self, token: u64, idx: u32) {
        self.slots[Self::entry(token)] = idx;
    }

    /// The slot `token` was last noted in, or NIL.
    fn get(&self, token: u64) -> u32 {
        self.slots[Self::entry(token)]
    }
}

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

/// A grant of a key other than its first (which lives in [`KeyState`]).
#[derive(Debug)]
struct Grant {
    token: u64,
    expiry_ms: u64,
    lease_timer: TimerId,
    slot: u32,
    value: Option<Value>,
}

/// What a key that is more than a plain mutex without a value has.
#[derive(Debug)]
struct Sem {
    limit: u32,
    /// The slot and value of the key's first grant.
    first_slot: u32,
    first_value: Option<Value>,
    /// The key's other grants, in no order.
    more: Vec<Grant>,
    /// The slots taken, a bit each, as far as the highest word with a slot
    /// taken (empty for limit 1: its slot is 0), so that a key of a large
    /// limit with few holders costs what its holders need, not its limit.
    taken: Vec<u64>,
}

impl Sem {
    /// A key's Sem when it needs one (a limit above 1, or a value), its
    /// first grant in `slot` (below `limit`) carrying `value`.
    fn new(limit: u32, slot: u32, value: Option<Value>) -> Option<Sem> {
        debug_assert!(slot < limit);
        if limit <= 1 && value.is_none() {
            return None;
        }
        let mut sem = Sem {
            limit,
            first_slot: slot,
            first_value: value,
            more: Vec::new(),
            taken: Vec::new(),
        };
        sem.take_slot(slot);
        Some(sem)
    }

    fn take_slot(&mut self, slot: u32) {
        if self.limit <= 1 {
            return;
        }
        let word = slot as usize / 64;
        if word >= self.taken.len() {
            self.taken.resize(word + 1, 0);
        }
        debug_assert_eq!(
            self.taken[word] & (1 << (slot % 64)),
            0,
            "a slot is taken once"
        );
        self.taken[word] |= 1 << (slot % 64);
    }

    fn free_slot(&mut self, slot: u32) {
        if let Some(word) = self.taken.get_mut(slot as usize / 64) {
            *word &= !(1 << (slot % 64));
        }
        while self.taken.last() == Some(&0) {
            self.taken.pop();
        }
        if self.taken.capacity() > 4 * self.taken.len().max(1) {
            self.taken.shrink_to_fit();
        }
    }

    /// Whether `slot` is taken.
    fn is_taken(&self, slot: u32) -> bool {
        self.taken
            .get(slot as usize / 64)
            .is_some_and(|word| word & (1 << (slot % 64)) != 0)
    }

    /// The lowest slot no grant holds (there must be one, below the limit).
    fn lowest_free(&self) -> u32 {
        let slot = match self.taken.iter().position(|w| *w != u64::MAX) {
            Some(i) => i as u32 * 64 + self.taken[i].trailing_ones(),
            None => self.taken.len() as u32 * 64,
        };
        debug_assert!(slot < self.limit);
        slot
    }

    /// A grant of `more` left: give back room a key's many past holders
    /// took, so that `--max-keys` bounds memory by the grants held now.
    fn shrink_more(&mut self) {
        if self.more.capacity() > 8 && self.more.capacity() > 4 * self.more.len() {
            self.more.shrink_to(2 * self.more.len());
        }
    }
}

/// Where a grant of a key is: its first, or one of its Sem's others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    First,
    More(usize),
}

/// An answer owed to a connection after an earlier waiter's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Deferred {
    Timeout,
    Refused(Reason),
}

#[derive(Debug)]
struct Waiter {
    conn: ConnId,
    key_idx: u32,
    lease_ms: u64,
    /// When the request arrived (for the grant-wait histogram).
    since_ms: u64,
    wait_timer: Option<TimerId>,
    /// The request named a limit (its grant is answered with its slot).
    named_limit: bool,
    value: Option<Value>,
    // The key's FIFO queue.
    prev: u32,
    next: u32,
    // The connection's list of waiters (for disconnect).
    conn_prev: u32,
    conn_next: u32,
    // Earlier / later waiters of the same connection for the same key.
    chain_prev: u32,
    chain_next: u32,
    deferred: Vec<Deferred>,
}

#[derive(Debug, Default)]
struct ConnWaiting {
    head: u32,
    waiting: u32,
    deferred: u32,
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

    /// Which I/O loops watch which keys.
    pub fn watchers(&self) -> &Watchers {
        &self.watchers
    }

    /// Which I/O loops watch which keys, to change.
    pub fn watchers_mut(&mut self) -> &mut Watchers {
        &mut self.watchers
    }

    /// What a `W` line shows of `key` now: the largest token holding it
    /// (0 when none), its live grants, the requests in line, and the value
    /// of the grant with the largest token.
    pub fn watch_state(&self, key: &Key) -> WatchState {
        let Some(view) = self.key_view(key) else {
            return WatchState::default();
        };
        let newest = view.newest();
        WatchState {
            token: newest.as_ref().map_or(0, |h| h.token),
            holders: view.holders().count() as u64,
            waiting: u64::from(view.waiting()),
            value: newest.and_then(|h| h.value.cloned()),
        }
    }

    /// The watched keys whose holders changed since the last call, each
    /// once with its state now, as entries for each watching loop's
    /// watchers (`ConnId::watchers`) in the ordered answers. The table
    /// core calls it after every step that may change holders, so the
    /// lines follow the answers of the step that made the change.
    #[inline]
    pub fn take_watch_lines(&mut self, out: &mut Outbox) {
        // Called after every request: the common case (nothing watched
        // changed) is one check at the call, no call.
        if !self.watch_changed.is_empty() {
            self.write_watch_lines(out);
        }
    }

    fn write_watch_lines(&mut self, out: &mut Outbox) {
        let mut changed = std::mem::take(&mut self.watch_changed);
        for (i, key) in changed.iter().enumerate() {
            if changed[..i].contains(key) {
                continue;
            }
            let Some(loops) = self.watchers.loops(key) else {
                continue;
            };
            let state = self.watch_state(key);
            for worker in loops.iter() {
                out.answer(
                    ConnId::watchers(worker),
                    Answer::Watched {
                        key: key.clone(),
                        state: state.clone(),
                    },
                );
            }
        }
        changed.clear();
        self.watch_changed = changed;
    }

    /// `W key`: the key's state now (a lease run out is reclaimed first,
    /// and that change's line goes before this answer).
    pub fn handle_watch(&mut self, now_ms: u64, conn: ConnId, key: Key, out: &mut Outbox) {
        let _ = self.lookup_live(now_ms, &key, out);
        self.take_watch_lines(out);
        let state = self.watch_state(&key);
        out.answer(conn, Answer::Watched { key, state });
    }

    /// Record changes for the standbys from now on (an active cluster
    /// node), or stop: then the changes not taken yet are dropped.
    pub fn set_replicating(&mut self, on: bool) {
        if !on {
            self.discard_changes();
        }
        self.replicate = on;
    }

    /// Changes are waiting to be taken by [`LockTable::take_deltas`].
    pub fn has_changes(&self) -> bool {
        !self.changes.is_empty()
    }

    /// What the changes recorded so far are worth: see [`Ready`].
    pub fn changes_ready(&self) -> Ready {
        Ready {
            urgent: self.urgent > 0,
            young: self.young,
            oldest_young_ms: self.first_young_ms,
            ceiling: self.ceilings > 0,
            settled: self.changes.len() > self.young + self.urgent + self.ceilings,
        }
    }

    /// The changes since the last call, as the deltas a standby applies to
    /// end in this table's state: one per key that changed (its state now),
    /// none for a key granted and freed in between that the standbys never
    /// held, and the ceilings raised, in the order of each key's first
    /// change. A grant's lease left is counted from `now_ms`, which must be
    /// the time requests are stamped with (`Now::ms_ceil`), so that it is
    /// never more than the lease granted.
    ///
    /// The grant of a key new to the standbys that is younger than
    /// `hold_young_ms` stays for the next call: most short locks are freed
    /// by then and never cost the standbys a line (0 takes everything).
    pub fn take_deltas(&mut self, now_ms: u64, hold_young_ms: u64) -> Vec<Delta> {
        let mut deltas = Vec::with_capacity(self.changes.len());
        let mut kept = std::mem::take(&mut self.kept);
        for (i, change) in self.changes.drain(..).enumerate() {
            match change {
                Change::Held {
                    slot,
                    new_since: Some(since),
                    ..
                } if now_ms.saturating_sub(since) < hold_young_ms => {
                    self.keys[slot as usize].pending = kept.len() as u32;
                    kept.push(change);
                }
                Change::Held { slot, .. } => {
                    let state = &mut self.keys[slot as usize];
                    debug_assert_eq!(state.pending as usize, i, "a held key's entry");
                    state.pending = NIL;
                    if state.sem == NIL {
                        deltas.push(Delta::grant(
                            state.key.clone(),
                            state.token,
                            state.expiry_ms.saturating_sub(now_ms),
                        ));
                    } else {
                        // Every live grant of the key, read now.
                        let view = KeyView {
                            state,
                            sem: Some(&self.sems[state.sem as usize]),
                        };
                        deltas.extend(view.deltas(now_ms));
                    }
                }
                Change::Freed { key, token, slot } => deltas.push(Delta::Free { key, token, slot }),
                Change::Gone => {}
                Change::Ceiling(ceiling) => deltas.push(Delta::Ceiling(ceiling)),
            }
        }
        // What stays is young grants only, oldest first.
        self.kept = std::mem::replace(&mut self.changes, kept);
        self.young = self.changes.len();
        self.urgent = 0;
        self.ceilings = 0;
        self.first_young_ms = match self.changes.first() {
            Some(Change::Held { new_since, .. }) => *new_since,
            _ => None,
        };
        deltas
    }

    /// Drop the changes not taken (the node stopped serving).
    fn discard_changes(&mut self) {
        for change in self.changes.drain(..) {
            if let Change::Held { slot, .. } = change {
                self.keys[slot as usize].pending = NIL;
            }
        }
        self.young = 0;
        self.urgent = 0;
        self.ceilings = 0;
        self.first_young_ms = None;
    }

    /// A ceiling for the standbys (see `TableCore`).
    pub fn note_ceiling(&mut self, ceiling: u64) {
        if self.replicate {
            self.changes.push(Change::Ceiling(ceiling));
            self.ceilings += 1;
        }
    }

    /// Key `idx` was granted, handed over or extended: its entry in the
    /// batch says it is held (`new_at`: the key was not in the table before
    /// and came in at that time).
    ///
    /// One entry per key, whatever its limit: the batch reads all of the
    /// key's live grants when it is taken (a grant handed over in its slot
    /// replaces the slot's older one on the standbys); grants that ended
    /// with nobody waiting are entries of their own ([`Change::Freed`]).
    fn note_held(&mut self, idx: u32, new_at: Option<u64>) {
        if !self.replicate {
            return;
        }
        let state = &mut self.keys[idx as usize];
        if state.pending == NIL {
            state.pending = self.changes.len() as u32;
            self.changes.push(Change::Held {
                slot: idx,
                new_since: new_at,
                hot: false,
            });
            match new_at {
                Some(since) => {
                    self.young += 1;
                    self.first_young_ms.get_or_insert(since);
                }
                None => self.urgent += 1,
            }
        } else if let Some(Change::Held {
            new_since: None,
            hot,
            ..
        }) = self.changes.get_mut(state.pending as usize)
            && !*hot
        {
            // Changed again within the batch: no longer urgent.
            *hot = true;
            self.urgent -= 1;
        }
    }

    /// A grant of key `idx`, `token` in `slot`, ended with nobody waiting
    /// and the key keeps other grants: the standbys free it, unless the
    /// key is new to them in this batch (they hold none of it).
    fn note_grant_freed(&mut self, idx: u32, token: u64, slot: u32) {
        if !self.replicate {
            return;
        }
        let state = &self.keys[idx as usize];
        if let Some(Change::Held {
            new_since: Some(_), ..
        }) = self.changes.get(state.pending as usize)
        {
            return;
        }
        let key = state.key.clone();
        self.changes.push(Change::Freed { key, token, slot });
    }

    /// A key left the table, its last grant `token` in `slot` until then,
    /// with `pending` its entry in the batch (NIL: none).
    fn note_freed(&mut self, key: Key, token: u64, slot: u32, pending: u32) {
        if !self.replicate {
            return;
        }
        match self.changes.get_mut(pending as usize) {
            Some(entry) => {
                *entry = match entry {
                    Change::Held {
                        new_since: Some(_), ..
                    } => {
                        self.young -= 1;
                        Change::Gone
                    }
                    Change::Held {
                        new_since: None,
                        hot: false,
                        ..
                    } => {
                        self.urgent -= 1;
                        Change::Freed { key, token, slot }
                    }
                    _ => Change::Freed { key, token, slot },
                };
            }
            // A promotion-grace placeholder (token 0) was never replicated.
            None if token == 0 => {}
            None => self.changes.push(Change::Freed { key, token, slot }),
        }
    }

    pub fn stats(&self) -> TableStats {
        TableStats {
            held: self.keys.len(),
            holders: self.grants,
            holder_changes: self.holder_changes,
            waiting: self.waiters.len(),
            last_token: self.tokens.last(),
            last_issued: self.tokens.last_issued(),
            last_granted: self.tokens.last_granted(),
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

    /// `A key lease wait [limit [value]]`.
    #[allow(clippy::too_many_arguments)]
    pub fn handle_acquire(
        &mut self,
        now_ms: u64,
        conn: ConnId,
        key: Key,
        lease_ms: u64,
        wait_ms: u64,
        ask: Ask,
        out: &mut Outbox,
    ) {
        let limit = ask.limit.unwrap_or(1);
        let idx = match self.lookup_live(now_ms, &key, out) {
            Ok(idx) => idx,
            Err(hash) if now_ms < self.grace_until_ms => {
                // Promotion grace: a key this node does not know as held may
                // still be held by a grant the old active never replicated.
                // The request waits behind a placeholder (token 0) that runs
                // out when the grace ends.
                if self.is_full(conn, &key, out) {
                    return;
                }
                self.insert_key(key.clone(), hash, 0, self.grace_until_ms, limit, 0, None)
            }
            Err(hash) => {
                if !self.is_full(conn, &key, out) {
                    self.grant_new(now_ms, conn, key, hash, lease_ms, ask, out);
                }
                return;
            }
        };
        if self.limit(idx) != limit {
            self.refuse_acquire(conn, Some(idx), key, Reason::LimitMismatch, out);
            return;
        }
        let placeholder = self.keys[idx as usize].token == 0;
        if !placeholder && self.holder_count(idx) < limit as usize {
            // A free slot: nobody waits (a key has waiters only while every
            // slot is taken), so it is granted at once.
            debug_assert_eq!(self.keys[idx as usize].queue_head, NIL);
            if !self.is_full(conn, &key, out) {
                let (token, slot) = self.add_grant(now_ms, idx, lease_ms, ask.value);
                self.metrics.granted(0);
                let slot = ask.limit.map(|_| slot);
                out.answer(conn, Answer::Granted { token, key, slot });
            }
            return;
        }
        let state = self.conns.get(&conn);
        if state.is_some_and(|c| c.waiting >= self.limits.max_waiting_per_conn) {
            self.refuse_acquire(conn, Some(idx), key, Reason::TooManyWaiting, out);
            return;
        }
        self.enqueue(now_ms, conn, idx, lease_ms, wait_ms, ask);
    }

    /// `R key token`.
    pub fn handle_release(
        &mut self,
        now_ms: u64,
        conn: ConnId,
        key: Key,
        token: u64,
        out: &mut Outbox,
    ) {
        let found = self
            .lookup_live_by_token(now_ms, &key, token, out)
            .ok()
            .and_then(|idx| Some((idx, self.find_grant(idx, token)?)));
        match found {
            Some((idx, at)) => {
                let timer = self.grant_timer(idx, at);
                let cancelled = self.wheel.cancel(timer);
                debug_assert!(cancelled.is_some(), "a holder always has a lease timer");
                let head = self.keys[idx as usize].queue_head;
                if head != NIL && self.waiters[head as usize].conn != conn {
                    // The next holder's grant is what everyone waits for:
                    // it goes first in the outbox, so that when both
                    // connections are on one I/O loop (and the releaser's
                    // has no earlier answer this round) it is written first.
                    self.hand_off(now_ms, idx, at, None, out);
                    out.answer(conn, Answer::Released { key });
                } else {
                    out.answer(conn, Answer::Released { key });
                    self.hand_off(now_ms, idx, at, None, out);
                }
            }
            None => out.answer(conn, Answer::NotHeld { key }),
        }
    }

    /// `K key token lease`.
    pub fn handle_keep(
        &mut self,
        now_ms: u64,
        conn: ConnId,
        key: Key,
        token: u64,
        lease_ms: u64,
        out: &mut Outbox,
    ) {
        let found = self
            .lookup_live_by_token(now_ms, &key, token, out)
            .ok()
            .and_then(|idx| Some((idx, self.find_grant(idx, token)?)));
        match found {
            Some((idx, at)) => {
                let expiry_ms = now_ms.saturating_add(lease_ms);
                self.wheel.cancel(self.grant_timer(idx, at));
                let lease_timer = self.wheel.insert(expiry_ms, Timer::Lease(idx));
                let state = &mut self.keys[idx as usize];
                match at {
                    At::First => {
                        state.expiry_ms = expiry_ms;
                        state.lease_timer = lease_timer;
                    }
                    At::More(i) => {
                        let grant = &mut self.sems[state.sem as usize].more[i];
                        grant.expiry_ms = expiry_ms;
                        grant.lease_timer = lease_timer;
                    }
                }
                self.note_held(idx, None);
                out.answer(conn, Answer::Kept { key });
            }
            None => out.answer(
                conn,
                Answer::Error {
                    op: Some(Op::Keep),
                    key: Some(key),
                    reason: Reason::NotHeld,
                },
            ),
        }
    }

    /// `Q key`: the newest grant (the largest token) and how many wait.
    pub fn handle_query(&mut self, now_ms: u64, conn: ConnId, key: Key, out: &mut Outbox) {
        let answer = match self.lookup_live(now_ms, &key, out) {
            Ok(idx) => {
                let state = &self.keys[idx as usize];
                let (token, expiry_ms) = match self.sem(idx) {
                    Some(sem) => sem
                        .more
                        .iter()
                        .map(|g| (g.token, g.expiry_ms))
                        .fold((state.token, state.expiry_ms), |a, b| a.max(b)),
                    None => (state.token, state.expiry_ms),
                };
                Answer::Queried {
                    token,
                    ms_left: expiry_ms.saturating_sub(now_ms),
                    waiting: u64::from(state.queue_len),
                    key,
                }
            }
            Err(_) => Answer::Queried {
                key,
                token: 0,
                ms_left: 0,
                waiting: 0,
            },
        };
        out.answer(conn, answer);
    }

    /// The key's state now (None: not in the table), for watches and
    /// replication.
    pub fn key_view(&self, key: &Key) -> Option<KeyView<'_>> {
        let idx = self.index.get(&self.keys, key)?;
        Some(KeyView {
            state: &self.keys[idx as usize],
            sem: self.sem(idx),
        })
    }

    /// Key `idx`'s Sem, if it has one.
    fn sem(&self, idx: u32) -> Option<&Sem> {
        let sem = self.keys[idx as usize].sem;
        (sem != NIL).then(|| &self.sems[sem as usize])
    }

    /// Key `idx`'s limit (1 for a plain mutex).
    fn limit(&self, idx: u32) -> u32 {
        self.sem(idx).map_or(1, |sem| sem.limit)
    }

    /// Key `idx`'s holders (a placeholder counts).
    fn holder_count(&self, idx: u32) -> usize {
        1 + self.sem(idx).map_or(0, |sem| sem.more.len())
    }

    /// The grant of key `idx` that `token` names.
    fn find_grant(&self, idx: u32, token: u64) -> Option<At> {
        if self.keys[idx as usize].token == token {
            return Some(At::First);
        }
        let sem = self.sem(idx)?;
        sem.more.iter().position(|g| g.token == token).map(At::More)
    }

    fn grant_timer(&self, idx: u32, at: At) -> TimerId {
        match at {
            At::First => self.keys[idx as usize].lease_timer,
            At::More(i) => self.sem(idx).expect("a key's other grant").more[i].lease_timer,
        }
    }

    fn grant_token_expiry(&self, idx: u32, at: At) -> (u64, u64) {
        match at {
            At::First => {
                let state = &self.keys[idx as usize];
                (state.token, state.expiry_ms)
            }
            At::More(i) => {
                let g = &self.sem(idx).expect("a key's other grant").more[i];
                (g.token, g.expiry_ms)
            }
        }
    }

    /// The grant of key `idx` whose lease timer is `id`.
    fn find_timer(&self, idx: u32, id: TimerId) -> Option<At> {
        if self.keys[idx as usize].lease_timer == id {
            return Some(At::First);
        }
        let sem = self.sem(idx)?;
        sem.more
            .iter()
            .position(|g| g.lease_timer == id)
            .map(At::More)
    }

    /// A grant of key `idx` whose lease ran out by `now_ms`.
    fn first_lapsed(&self, idx: u32, now_ms: u64) -> Option<At> {
        if self.keys[idx as usize].expiry_ms <= now_ms {
            return Some(At::First);
        }
        let sem = self.sem(idx)?;
        sem.more
            .iter()
            .position(|g| g.expiry_ms <= now_ms)
            .map(At::More)
    }

    /// Some key's set of holders changed (a grant, a release, an expiry):
    /// the point where watches of the key are to be told. Called while key
    /// `idx` is still in the table. If an I/O loop watches the key, it is
    /// noted for [`LockTable::take_watch_lines`]; nothing watched costs one
    /// check.
    #[inline]
    fn holders_changed(&mut self, idx: u32) {
        self.holder_changes += 1;
        if !self.watchers.is_empty() {
            self.note_watched_change(idx);
        }
    }

    fn note_watched_change(&mut self, idx: u32) {
        let key = &self.keys[idx as usize].key;
        if self.watchers.loops(key).is_some() {
            self.watch_changed.push(key.clone());
        }
    }
    /// A request the parser refused, routed here so that its `E` keeps its
    /// place among the connection's answers for the same (op, key).
    pub fn handle_refused(
        &mut self,
        conn: ConnId,
        op: Op,
        key: Option<Key>,
        reason: Reason,
        out: &mut Outbox,
    ) {
        match (op, key) {
            (Op::Acquire, Some(key)) => {
                let idx = self.index.get(&self.keys, &key);
                self.refuse_acquire(conn, idx, key, reason, out);
            }
            (op, key) => out.answer(
                conn,
                Answer::Error {
                    op: Some(op),
                    key,
                    reason,
                },
            ),
        }
    }

    /// The connection closed: its waiters leave their queues. Grants it
    /// holds stay (a grant is not tied to its connection).
    pub fn handle_disconnect(&mut self, conn: ConnId) {
        let Some(state) = self.conns.remove(&conn) else {
            return;
        };
        let mut w = state.head;
        while w != NIL {
            let waiter = self.waiters.remove(w as usize);
            if let Some(timer) = waiter.wait_timer {
                self.wheel.cancel(timer);
            }
            self.unlink_from_queue(&waiter);
            self.chain_tails.remove(&(conn, waiter.key_idx));
            w = waiter.conn_next;
        }
    }

    /// Fire every lease expiry and wait deadline due at `now_ms`.
    pub fn poll_timers(&mut self, now_ms: u64, out: &mut Outbox) {
        let mut fired = std::mem::take(&mut self.fired);
        self.wheel.poll(now_ms, &mut fired);
        for (id, timer) in fired.drain(..) {
            // A timer fired in this batch may have been made moot by an
            // earlier one (a lease expiry that granted a waiter whose wait
            // ran out in the same tick): act only on timers still current.
            match timer {
                Timer::Lease(idx) => {
                    let current = self
                        .keys
                        .get(idx as usize)
                        .and_then(|_| self.find_timer(idx, id));
                    if let Some(at) = current {
                        let deadline = self.expire(idx, at, now_ms);
                        self.hand_off(now_ms, idx, at, deadline, out);
                    }
                }
                Timer::Wait(w) => {
                    let current = self
                        .waiters
                        .get(w as usize)
                        .is_some_and(|w| w.wait_timer == Some(id));
                    if current {
                        self.waiters[w as usize].wait_timer = None;
                        self.time_out(w, out);
                    }
                }
            }
        }
        self.fired = fired;
    }

    /// The key's slot if it is held by a live lease. A lease that ran out but
    /// whose timer has not fired yet is expired here first (every such
    /// grant of the key), so the answer is the same whenever the timer
    /// happens to run.
    fn lookup_live(&mut self, now_ms: u64, key: &Key, out: &mut Outbox) -> Result<u32, u32> {
        let idx = self.index.find(&self.keys, key)?;
        self.reclaim_lapsed(now_ms, idx, key, out)
    }

    /// As [`LockTable::lookup_live`], for a request that names a grant's
    /// `token`: where that token was granted, if it is still the key's slot
    /// ([`RecentGrants`]), is looked at before the index.
    fn lookup_live_by_token(
        &mut self,
        now_ms: u64,
        key: &Key,
        token: u64,
        out: &mut Outbox,
    ) -> Result<u32, u32> {
        let hint = self.recent.get(token);
        let idx = match self.keys.get(hint as usize) {
            Some(state) if state.key == *key => hint,
            _ => self.index.find(&self.keys, key)?,
        };
        self.reclaim_lapsed(now_ms, idx, key, out)
    }

    /// Key `idx` (which is `key`'s slot) as [`LockTable::lookup_live`]
    /// answers it: every grant of it whose lease ran out by `now_ms` is
    /// reclaimed first.
    fn reclaim_lapsed(
        &mut self,
        now_ms: u64,
        idx: u32,
        key: &Key,
        out: &mut Outbox,
    ) -> Result<u32, u32> {
        while let Some(at) = self.first_lapsed(idx, now_ms) {
            self.wheel.cancel(self.grant_timer(idx, at));
            let deadline = self.expire(idx, at, now_ms);
            self.hand_off(now_ms, idx, at, deadline, out);
            if !self.keys.contains(idx as usize) {
                // Freed (hand_off never adds a key): find gives the hash.
                return self.index.find(&self.keys, key);
            }
        }
        Ok(idx)
    }

    /// A grant of key `idx` ran out and is reclaimed at `now_ms`: counted
    /// (unless it was a promotion-grace placeholder); its deadline.
    fn expire(&mut self, idx: u32, at: At, now_ms: u64) -> Option<u64> {
        let (token, expiry_ms) = self.grant_token_expiry(idx, at);
        if token == 0 {
            return None;
        }
        self.metrics.expired(expiry_ms, now_ms);
        Some(expiry_ms)
    }

    /// The table cannot take a new grant: answer `too-many-keys`.
    fn is_full(&self, conn: ConnId, key: &Key, out: &mut Outbox) -> bool {
        if self.grants < self.limits.max_keys {
            return false;
        }
        out.answer(
            conn,
            Answer::Error {
                op: Some(Op::Acquire),
                key: Some(key.clone()),
                reason: Reason::TooManyKeys,
            },
        );
        true
    }

    /// A new key in the table (whose hash is `hash`: from the lookup that
    /// missed it), of `limit`, held by `token` (in `slot`, carrying
    /// `value`) until `expiry_ms`.
    #[allow(clippy::too_many_arguments)]
    fn insert_key(
        &mut self,
        key: Key,
        hash: u32,
        token: u64,
        expiry_ms: u64,
        limit: u32,
        slot: u32,
        value: Option<Value>,
    ) -> u32 {
        let sem = match Sem::new(limit, slot, value) {
            Some(sem) => self.sems.insert(sem) as u32,
            None => NIL,
        };
        let entry = self.keys.vacant_entry();
        let idx = entry.key() as u32;
        let lease_timer = self.wheel.insert(expiry_ms, Timer::Lease(idx));
        entry.insert(KeyState {
            key,
            hash,
            token,
            expiry_ms,
            lease_timer,
            queue_head: NIL,
            queue_tail: NIL,
            queue_len: 0,
            pending: NIL,
            sem,
        });
        self.index.insert(&self.keys, idx);
        self.grants += 1;
        if token != 0 {
            self.holders_changed(idx);
        }
        idx
    }

    /// Take key `idx` out of the table with all its grants (their timers
    /// cancelled) and its Sem; the caller records what replication needs.
    fn drop_key(&mut self, idx: u32) -> KeyState {
        let state = self.keys.remove(idx as usize);
        self.index.remove(state.hash, idx);
        self.wheel.cancel(state.lease_timer);
        self.grants -= 1;
        if state.sem != NIL {
            let sem = self.sems.remove(state.sem as usize);
            for grant in sem.more {
                self.wheel.cancel(grant.lease_timer);
                self.grants -= 1;
            }
        }
        state
    }

    /// A grant of key `idx` (which has a free slot) in the lowest free
    /// slot: its token and slot.
    fn add_grant(
        &mut self,
        now_ms: u64,
        idx: u32,
        lease_ms: u64,
        value: Option<Value>,
    ) -> (u64, u32) {
        let token = self.tokens.issue();
        self.recent.note(token, idx);
        let expiry_ms = now_ms.saturating_add(lease_ms);
        let lease_timer = self.wheel.insert(expiry_ms, Timer::Lease(idx));
        let sem = self.keys[idx as usize].sem;
        let sem = &mut self.sems[sem as usize];
        let slot = sem.lowest_free();
        sem.take_slot(slot);
        sem.more.push(Grant {
            token,
            expiry_ms,
            lease_timer,
            slot,
            value,
        });
        self.grants += 1;
        self.note_held(idx, None);
        self.holders_changed(idx);
        (token, slot)
    }

    /// The grant of key `idx` at `at` is done (its timer gone) and nobody
    /// waits: it leaves, and the key with it if it was the last.
    fn remove_grant(&mut self, idx: u32, at: At) {
        let sem_idx = self.keys[idx as usize].sem;
        let others = self.sem(idx).map_or(0, |sem| sem.more.len());
        if others == 0 {
            debug_assert_eq!(at, At::First);
            let slot = self.sem(idx).map_or(0, |sem| sem.first_slot);
            // While the key is still there to be named.
            self.holders_changed(idx);
            let state = self.drop_key(idx);
            self.note_freed(state.key, state.token, slot, state.pending);
            return;
        }
        let (token, _) = self.grant_token_expiry(idx, at);
        let sem = &mut self.sems[sem_idx as usize];
        let slot = match at {
            At::More(i) => {
                let grant = sem.more.swap_remove(i);
                sem.free_slot(grant.slot);
                grant.slot
            }
            At::First => {
                // Another grant of the key becomes its first.
                let grant = sem.more.pop().expect("another grant");
                let slot = sem.first_slot;
                sem.free_slot(slot);
                sem.first_slot = grant.slot;
                sem.first_value = grant.value;
                let state = &mut self.keys[idx as usize];
                state.token = grant.token;
                state.expiry_ms = grant.expiry_ms;
                state.lease_timer = grant.lease_timer;
                slot
            }
        };
        self.sems[sem_idx as usize].shrink_more();
        self.grants -= 1;
        self.note_grant_freed(idx, token, slot);
        self.holders_changed(idx);
    }

    /// Grants of keys not known as held wait until `until_ms` (the
    /// `--promotion-grace` of a node promoted after a failure).
    pub fn set_grace_until(&mut self, until_ms: u64) {
        self.grace_until_ms = until_ms;
    }

    #[allow(clippy::too_many_arguments)]
    fn grant_new(
        &mut self,
        now_ms: u64,
        conn: ConnId,
        key: Key,
        hash: u32,
        lease_ms: u64,
        ask: Ask,
        out: &mut Outbox,
    ) {
        let token = self.tokens.issue();
        let expiry_ms = now_ms.saturating_add(lease_ms);
        let limit = ask.limit.unwrap_or(1);
        let idx = self.insert_key(key.clone(), hash, token, expiry_ms, limit, 0, ask.value);
        self.recent.note(token, idx);
        self.metrics.granted(0);
        self.note_held(idx, Some(now_ms));
        let slot = ask.limit.map(|_| 0);
        out.answer(conn, Answer::Granted { token, key, slot });
    }

    fn enqueue(
        &mut self,
        now_ms: u64,
        conn: ConnId,
        idx: u32,
        lease_ms: u64,
        wait_ms: u64,
        ask: Ask,
    ) {
        let entry = self.waiters.vacant_entry();
        let w = entry.key() as u32;
        let wait_timer = (wait_ms > 0).then(|| {
            self.wheel
                .insert(now_ms.saturating_add(wait_ms), Timer::Wait(w))
        });
        let key_state = &mut self.keys[idx as usize];
        let prev = key_state.queue_tail;
        key_state.queue_tail = w;
        if prev == NIL {
            key_state.queue_head = w;
            self.contended.enter(idx);
        }
        key_state.queue_len += 1;
        let conn_state = self.conns.entry(conn).or_insert(ConnWaiting {
            head: NIL,
            waiting: 0,
            deferred: 0,
        });
        let conn_next = conn_state.head;
        conn_state.head = w;
        conn_state.waiting += 1;
        let chain_prev = self.chain_tails.insert((conn, idx), w).unwrap_or(NIL);
        entry.insert(Waiter {
            conn,
            key_idx: idx,
            lease_ms,
            since_ms: now_ms,
            wait_timer,
            named_limit: ask.limit.is_some(),
            value: ask.value,
            prev,
            next: NIL,
            conn_prev: NIL,
            conn_next,
            chain_prev,
            chain_next: NIL,
            deferred: Vec::new(),
        });
        if prev != NIL {
            self.waiters[prev as usize].next = w;
        }
        if conn_next != NIL {
            self.waiters[conn_next as usize].conn_prev = w;
        }
        if chain_prev != NIL {
            self.waiters[chain_prev as usize].chain_next = w;
        }
    }

    /// Answer `E A key reason` now, or after the connection's earlier waiter
    /// for the same key is answered, so it does not overtake that answer.
    fn refuse_acquire(
        &mut self,
        conn: ConnId,
        idx: Option<u32>,
        key: Key,
        reason: Reason,
        out: &mut Outbox,
    ) {
        let tail = idx.and_then(|idx| self.chain_tails.get(&(conn, idx)).copied());
        let Some(tail) = tail else {
            out.answer(
                conn,
                Answer::Error {
                    op: Some(Op::Acquire),
                    key: Some(key),
                    reason,
                },
            );
            return;
        };
        self.waiters[tail as usize]
            .deferred
            .push(Deferred::Refused(reason));
        let state = self
            .conns
            .get_mut(&conn)
            .expect("a waiter's connection is tracked");
        state.deferred += 1;
        if state.deferred > self.limits.max_waiting_per_conn {
            // Deferred refusals are bounded too: past the limit the
            // connection is cut off with a clear error.
            out.answer(
                conn,
                Answer::Error {
                    op: None,
                    key: None,
                    reason: Reason::TooManyWaiting,
                },
            );
            out.closes.push(conn);
            self.handle_disconnect(conn);
        }
    }

    /// The grant of key `idx` at `at` is done (released, or its lease ran
    /// out at `expired_at_ms`; its timer already gone): its slot goes to
    /// the front of the key's queue with a new token and a fresh lease, or
    /// the grant leaves (and the key, if it was the last) if nobody waits.
    fn hand_off(
        &mut self,
        now_ms: u64,
        idx: u32,
        at: At,
        expired_at_ms: Option<u64>,
        out: &mut Outbox,
    ) {
        let head = self.keys[idx as usize].queue_head;
        if head == NIL {
            self.remove_grant(idx, at);
            return;
        }
        let waiter = self.remove_waiter(head);
        self.metrics.granted(now_ms.saturating_sub(waiter.since_ms));
        let (old_token, _) = self.grant_token_expiry(idx, at);
        if old_token != 0 {
            self.metrics.handed_off(expired_at_ms);
        }
        let token = self.tokens.issue();
        self.recent.note(token, idx);
        debug_assert!(token > old_token, "tokens never decrease");
        let expiry_ms = now_ms.saturating_add(waiter.lease_ms);
        let lease_timer = self.wheel.insert(expiry_ms, Timer::Lease(idx));
        let state = &mut self.keys[idx as usize];
        let sem_idx = state.sem;
        let slot = match at {
            At::First => {
                state.token = token;
                state.expiry_ms = expiry_ms;
                state.lease_timer = lease_timer;
                match self.sems.get_mut(sem_idx as usize) {
                    Some(sem) if sem_idx != NIL => {
                        sem.first_value = waiter.value;
                        let slot = sem.first_slot;
                        if sem.limit == 1 && sem.first_value.is_none() {
                            // A plain mutex again: no Sem needed.
                            self.sems.remove(sem_idx as usize);
                            self.keys[idx as usize].sem = NIL;
                        }
                        slot
                    }
                    _ => {
                        if waiter.value.is_some() {
                            let sem = Sem::new(1, 0, waiter.value).expect("a value needs a Sem");
                            self.keys[idx as usize].sem = self.sems.insert(sem) as u32;
                        }
                        0
                    }
                }
            }
            At::More(i) => {
                let grant = &mut self.sems[sem_idx as usize].more[i];
                grant.token = token;
                grant.expiry_ms = expiry_ms;
                grant.lease_timer = lease_timer;
                grant.value = waiter.value;
                grant.slot
            }
        };
        let key = self.keys[idx as usize].key.clone();
        self.note_held(idx, None);
        self.holders_changed(idx);
        out.answer(
            waiter.conn,
            Answer::Granted {
                token,
                key: key.clone(),
                slot: waiter.named_limit.then_some(slot),
            },
        );
        self.emit_deferred(waiter.conn, &key, &waiter.deferred, out);
        self.fill(now_ms, idx, out);
    }

    /// Key `idx`'s free slots go to the front of its queue (there are free
    /// slots and waiters at once only when a promotion-grace placeholder of
    /// a semaphore has just run out).
    fn fill(&mut self, now_ms: u64, idx: u32, out: &mut Outbox) {
        while self.keys[idx as usize].queue_head != NIL
            && self.holder_count(idx) < self.limit(idx) as usize
        {
            let waiter = self.remove_waiter(self.keys[idx as usize].queue_head);
            self.metrics.granted(now_ms.saturating_sub(waiter.since_ms));
            let (token, slot) = self.add_grant(now_ms, idx, waiter.lease_ms, waiter.value);
            let key = self.keys[idx as usize].key.clone();
            out.answer(
                waiter.conn,
                Answer::Granted {
                    token,
                    key: key.clone(),
                    slot: waiter.named_limit.then_some(slot),
                },
            );
            self.emit_deferred(waiter.conn, &key, &waiter.deferred, out);
        }
    }

    /// Waiter `w` ran out of wait: it leaves the queue and gets `T`, unless
    /// an earlier waiter of its connection for the same key is still in
    /// line, in which case that one carries the `T` (and everything `w`
    /// carried) until it is answered.
    fn time_out(&mut self, w: u32, out: &mut Outbox) {
        let mut waiter = self.remove_waiter(w);
        self.metrics.timeouts += 1;
        if waiter.chain_prev != NIL {
            let carrier = &mut self.waiters[waiter.chain_prev as usize];
            carrier.deferred.push(Deferred::Timeout);
            carrier.deferred.append(&mut waiter.deferred);
            if let Some(state) = self.conns.get_mut(&waiter.conn) {
                state.deferred += 1;
            }
            return;
        }
        let key = self.keys[waiter.key_idx as usize].key.clone();
        out.answer(waiter.conn, Answer::Timeout { key: key.clone() });
        self.emit_deferred(waiter.conn, &key, &waiter.deferred, out);
    }

    fn emit_deferred(&mut self, conn: ConnId, key: &Key, deferred: &[Deferred], out: &mut Outbox) {
        if deferred.is_empty() {
            return;
        }
        if let Some(state) = self.conns.get_mut(&conn) {
            state.deferred = state.deferred.saturating_sub(deferred.len() as u32);
        }
        for d in deferred {
            let answer = match *d {
                Deferred::Timeout => Answer::Timeout { key: key.clone() },
                Deferred::Refused(reason) => Answer::Error {
                    op: Some(Op::Acquire),
                    key: Some(key.clone()),
                    reason,
                },
            };
            out.answer(conn, answer);
        }
    }

    /// Unlink waiter `w` from its key queue, its connection and its chain,
    /// cancel its wait timer, and return it.
    fn remove_waiter(&mut self, w: u32) -> Waiter {
        let waiter = self.waiters.remove(w as usize);
        if let Some(timer) = waiter.wait_timer {
            self.wheel.cancel(timer);
        }
        self.unlink_from_queue(&waiter);
        self.unlink_from_conn(w, &waiter);
        self.unlink_from_chain(w, &waiter);
        waiter
    }

    fn unlink_from_queue(&mut self, waiter: &Waiter) {
        if waiter.prev != NIL {
            self.waiters[waiter.prev as usize].next = waiter.next;
        }
        if waiter.next != NIL {
            self.waiters[waiter.next as usize].prev = waiter.prev;
        }
        let state = &mut self.keys[waiter.key_idx as usize];
        if waiter.prev == NIL {
            state.queue_head = waiter.next;
        }
        if waiter.next == NIL {
            state.queue_tail = waiter.prev;
        }
        state.queue_len -= 1;
        if state.queue_len == 0 {
            self.contended.leave(waiter.key_idx);
        }
    }

    fn unlink_from_conn(&mut self, w: u32, waiter: &Waiter) {
        if waiter.conn_prev != NIL {
            self.waiters[waiter.conn_prev as usize].conn_next = waiter.conn_next;
        }
        if waiter.conn_next != NIL {
            self.waiters[waiter.conn_next as usize].conn_prev = waiter.conn_prev;
        }
        let state = self
            .conns
            .get_mut(&waiter.conn)
            .expect("a waiter's connection is tracked");
        if state.head == w {
            state.head = waiter.conn_next;
        }
        state.waiting -= 1;
        if state.waiting == 0 {
            debug_assert_eq!(state.head, NIL);
            self.conns.remove(&waiter.conn);
        }
    }

    fn unlink_from_chain(&mut self, w: u32, waiter: &Waiter) {
        if waiter.chain_prev != NIL {
            self.waiters[waiter.chain_prev as usize].chain_next = waiter.chain_next;
        }
        if waiter.chain_next != NIL {
            self.waiters[waiter.chain_next as usize].chain_prev = waiter.chain_prev;
        }
        let slot = (waiter.conn, waiter.key_idx);
        if self.chain_tails.get(&slot) == Some(&w) {
            if waiter.chain_prev == NIL {
                self.chain_tails.remove(&slot);
            } else {
                self.chain_tails.insert(slot, waiter.chain_prev);
            }
        }
    }

    /// How many keys a request waits for.
    pub fn contended(&self) -> usize {
        self.contended.len()
    }

    /// The contention view `ask` wants, at `now_ms` (monotonic) and
    /// `unix_ms` (the wall clock, which held times are read against:
    /// [`held_ms`]): the first keys by each order and the keys looked
    /// up. Costs time in the contended keys and what is asked for, never
    /// in all keys. (`role` and `node` are the caller's.)
    pub fn contention_view(&self, now_ms: u64, unix_ms: u64, ask: &KeysAsk) -> KeysView {
        let ranks: Vec<Rank> = if ask.top_waiting > 0 || ask.top_age > 0 {
            self.contended
                .iter()
                .map(|idx| {
                    let state = &self.keys[idx as usize];
                    Rank {
                        idx,
                        waiting: state.queue_len,
                        oldest_since_ms: self.waiters[state.queue_head as usize].since_ms,
                    }
                })
                .collect()
        } else {
            Vec::new()
        };
        let list = |by: By, n: usize| -> Vec<KeyEntry> {
            top(ranks.clone(), by, n)
                .iter()
                .map(|r| self.key_entry(r.idx, now_ms, unix_ms, MAX_LISTED_HOLDERS))
                .collect()
        };
        let lookups = ask
            .lookups
            .iter()
            .map(|key| {
                let entry = self
                    .index
                    .get(&self.keys, key)
                    .map(|idx| self.key_entry(idx, now_ms, unix_ms, usize::MAX));
                (key.clone(), entry)
            })
            .collect();
        KeysView {
            ask: ask.clone(),
            role: "",
            node: String::new(),
            contended: self.contended.len(),
            by_waiting: list(By::Waiting, ask.top_waiting),
            by_age: list(By::Age, ask.top_age),
            lookups,
        }
    }

    /// Key `idx` as the view shows it, with at most `max_holders` of its
    /// holders (those that have held it longest).
    fn key_entry(&self, idx: u32, now_ms: u64, unix_ms: u64, max_holders: usize) -> KeyEntry {
        let state = &self.keys[idx as usize];
        let view = KeyView {
            state,
            sem: self.sem(idx),
        };
        let mut holders: Vec<_> = view.holders().collect();
        // The smallest token was granted first.
        holders.sort_unstable_by_key(|h| h.token);
        let more = holders.len().saturating_sub(max_holders);
        holders.truncate(max_holders);
        let oldest_wait_ms = match state.queue_head {
            NIL => 0,
            head => now_ms.saturating_sub(self.waiters[head as usize].since_ms),
        };
        KeyEntry {
            key: state.key.clone(),
            limit: view.limit(),
            waiting: state.queue_len,
            oldest_wait_ms,
            holders: holders
                .into_iter()
                .map(|h| HolderEntry {
                    token: h.token,
                    slot: h.slot,
                    value: h.value.cloned(),
                    held_ms: held_ms(h.token, unix_ms),
                    ms_left: h.expiry_ms.saturating_sub(now_ms),
                })
                .collect(),
            more_holders: more as u32,
        }
    }

    /// Every live grant of every key as a `Delta::Grant` (its limit, slot
    /// and value with it), for a standby's snapshot.
    pub fn snapshot(&self, now_ms: u64) -> Vec<Delta> {
        let mut entries = Vec::with_capacity(self.grants);
        for (idx, state) in &self.keys {
            let view = KeyView {
                state,
                sem: self.sem(idx as u32),
            };
            entries.extend(
                view.deltas(now_ms)
                    .filter(|d| matches!(d, Delta::Grant { ms_left, .. } if *ms_left > 0)),
            );
        }
        entries
    }

    /// Apply a delta from the active (on a standby, which has no waiters).
    /// Tokens seen here lift this node's token counter. A grant never moves
    /// a slot's token down (an extension keeps it, a new grant raises it),
    /// never moves a grant to another slot, never names a limit outside
    /// 1..=[`MAX_LIMIT`](crate::protocol::MAX_LIMIT) or a slot at or above
    /// it, and never adds a grant past `max_keys`: such a delta is refused
    /// and changes nothing (Err says why).
    pub fn apply_delta(&mut self, now_ms: u64, delta: Delta) -> Result<(), &'static str> {
        self.apply(now_ms, delta, false)
    }

    /// `apply_delta`; `whole`: the delta is an entry of a snapshot (the
    /// whole table), so a key has one limit and each slot one grant.
    fn apply(&mut self, now_ms: u64, delta: Delta, whole: bool) -> Result<(), &'static str> {
        match delta {
            Delta::Grant {
                key,
                token,
                ms_left,
                limit,
                slot,
                value,
            } => {
                if !(1..=crate::protocol::MAX_LIMIT).contains(&limit) {
                    return Err("a limit outside 1..=10000");
                }
                if slot >= limit {
                    return Err("a slot at or above its key's limit");
                }
                if token == 0 {
                    return Err("token 0");
                }
                let expiry_ms = now_ms.saturating_add(ms_left);
                let found = match self.index.find(&self.keys, &key) {
                    Ok(idx) if self.limit(idx) != limit => {
                        if whole {
                            return Err("two limits for one key in a snapshot");
                        }
                        // The key held here with another limit (this node
                        // was active before, or the key was freed and
                        // registered afresh): the active's replaces it.
                        // Watchers are told while the key is still
                        // there to be named.
                        self.holders_changed(idx);
                        self.drop_key(idx);
                        self.index.find(&self.keys, &key)
                    }
                    found => found,
                };
                match found {
                    Ok(idx) => {
                        let at = match self.find_grant(idx, token) {
                            Some(at) if self.grant_slot(idx, at) != slot => {
                                return Err("a grant moved to another slot");
                            }
                            Some(_) if whole => return Err("two grants in one slot in a snapshot"),
                            Some(at) => Some(at),
                            None if whole && self.holder_count(idx) >= limit as usize => {
                                return Err("more holders than the key's limit in a snapshot");
                            }
                            None => match self.grant_in_slot(idx, slot) {
                                Some(_) if whole => {
                                    return Err("two grants in one slot in a snapshot");
                                }
                                Some(at) if token < self.grant_token_expiry(idx, at).0 => {
                                    return Err("a grant below the key's current token");
                                }
                                at => at,
                            },
                        };
                        if at.is_none() && self.grants >= self.limits.max_keys {
                            return Err("a grant past --max-keys");
                        }
                        self.tokens.observe_granted(token);
                        match at {
                            Some(at) => self.set_grant(idx, at, token, expiry_ms, value),
                            None => self.put_grant(idx, slot, token, expiry_ms, value),
                        }
                        self.holders_changed(idx);
                    }
                    Err(hash) => {
                        if self.grants >= self.limits.max_keys {
                            return Err("a grant past --max-keys");
                        }
                        self.tokens.observe_granted(token);
                        self.insert_key(key, hash, token, expiry_ms, limit, slot, value);
                    }
                }
            }
            Delta::Free { key, token, slot } => {
                if whole {
                    return Err("a free inside a snapshot");
                }
                self.tokens.observe_granted(token);
                let Some(idx) = self.index.get(&self.keys, &key) else {
                    return Ok(());
                };
                let Some(at) = self.grant_in_slot(idx, slot) else {
                    return Ok(());
                };
                // Held by this token or an older one: replication may send
                // only a key's last state of a batch, so a handover's grant
                // can be left out before its free.
                let (held, _) = self.grant_token_expiry(idx, at);
                if held <= token && self.keys[idx as usize].queue_len == 0 {
                    self.wheel.cancel(self.grant_timer(idx, at));
                    self.remove_grant(idx, at);
                }
            }
            Delta::Ceiling(ceiling) => self.tokens.observe(ceiling),
        }
        Ok(())
    }

    /// The slot of key `idx`'s grant at `at`.
    fn grant_slot(&self, idx: u32, at: At) -> u32 {
        match (at, self.sem(idx)) {
            (_, None) => 0,
            (At::First, Some(sem)) => sem.first_slot,
            (At::More(i), Some(sem)) => sem.more[i].slot,
        }
    }

    /// Key `idx`'s grant in `slot`, if any.
    fn grant_in_slot(&self, idx: u32, slot: u32) -> Option<At> {
        match self.sem(idx) {
            None => (slot == 0).then_some(At::First),
            Some(sem) if sem.first_slot == slot => Some(At::First),
            Some(sem) => sem.more.iter().position(|g| g.slot == slot).map(At::More),
        }
    }

    /// A standby applies its active's grant: key `idx`'s grant at `at`
    /// becomes `token` until `expiry_ms` (its lease timer re-armed),
    /// carrying `value`.
    fn set_grant(&mut self, idx: u32, at: At, token: u64, expiry_ms: u64, value: Option<Value>) {
        self.wheel.cancel(self.grant_timer(idx, at));
        let lease_timer = self.wheel.insert(expiry_ms, Timer::Lease(idx));
        let state = &mut self.keys[idx as usize];
        let sem_idx = state.sem;
        match at {
            At::First => {
                state.token = token;
                state.expiry_ms = expiry_ms;
                state.lease_timer = lease_timer;
                if sem_idx == NIL {
                    // A plain mutex that now carries a value needs a Sem.
                    if let Some(sem) = Sem::new(1, 0, value) {
                        state.sem = self.sems.insert(sem) as u32;
                    }
                } else {
                    let sem = &mut self.sems[sem_idx as usize];
                    sem.first_value = value;
                    if sem.limit == 1 && sem.first_value.is_none() {
                        // A plain mutex again: no Sem needed.
                        self.sems.remove(sem_idx as usize);
                        state.sem = NIL;
                    }
                }
            }
            At::More(i) => {
                let grant = &mut self.sems[sem_idx as usize].more[i];
                grant.token = token;
                grant.expiry_ms = expiry_ms;
                grant.lease_timer = lease_timer;
                grant.value = value;
            }
        }
    }

    /// A standby applies its active's grant in a free `slot` of key `idx`
    /// (of a limit above 1, so it has a Sem).
    fn put_grant(&mut self, idx: u32, slot: u32, token: u64, expiry_ms: u64, value: Option<Value>) {
        let lease_timer = self.wheel.insert(expiry_ms, Timer::Lease(idx));
        let sem = self.keys[idx as usize].sem;
        let sem = &mut self.sems[sem as usize];
        sem.take_slot(slot);
        sem.more.push(Grant {
            token,
            expiry_ms,
            lease_timer,
            slot,
            value,
        });
        self.grants += 1;
    }

    /// Replace the whole table by a snapshot from the active. Waiters, if
    /// any, must have been redirected first.
    /// Entries it refuses (see `apply_delta`; and, the snapshot being the
    /// whole table, two limits for one key or two grants in one slot) are
    /// left out; Err says why and how many.
    pub fn load_snapshot(
        &mut self,
        now_ms: u64,
        entries: Vec<Delta>,
    ) -> Result<(), (usize, &'static str)> {
        debug_assert!(
            self.waiters.is_empty(),
            "redirect waiters before a snapshot"
        );
        self.discard_changes();
        self.contended.clear();
        for state in self.keys.drain() {
            self.wheel.cancel(state.lease_timer);
        }
        for sem in self.sems.drain() {
            for grant in sem.more {
                self.wheel.cancel(grant.lease_timer);
            }
        }
        self.grants = 0;
        self.index.clear();
        let mut refused = (0, "");
        for entry in entries {
            if let Err(why) = self.apply(now_ms, entry, true) {
                refused = (refused.0 + 1, why);
            }
        }
        if refused.0 == 0 { Ok(()) } else { Err(refused) }
    }

    /// The token holding `key`, if any (tests).
    #[cfg(test)]
    fn query_token(&self, key: &Key) -> Option<u64> {
        let idx = self.index.get(&self.keys, key)?;
        Some(self.keys[idx as usize].token)
    }

    /// Lift the token counter (a ceiling or a peer's token).
    pub fn observe_token(&mut self, token: u64) {
        self.tokens.observe(token);
    }

    /// This node no longer serves: every waiter is answered `M <active> A
    /// <key>` (then whatever answers it carried), and leaves its queue.
    pub fn redirect_waiters(&mut self, active: Option<&str>, out: &mut Outbox) {
        let heads: Vec<u32> = self
            .keys
            .iter()
            .map(|(_, state)| state.queue_head)
            .collect();
        for mut w in heads {
            while w != NIL {
                let next = self.waiters[w as usize].next;
                let waiter = self.remove_waiter(w);
                let key = self.keys[waiter.key_idx as usize].key.clone();
                out.answer(
                    waiter.conn,
                    Answer::Moved {
                        active: active.map(str::to_string),
                        op: Op::Acquire,
                        key: Some(key.clone()),
                    },
                );
                self.emit_deferred(waiter.conn, &key, &waiter.deferred, out);
                w = next;
            }
        }
        debug_assert!(self.waiters.is_empty() && self.conns.is_empty());
    }

    /// Check every invariant of the module doc; panics on a broken one.
    /// O(size of the table): for tests and debugging.
    pub fn check_invariants(&self) {
        assert_eq!(self.index.len(), self.keys.len(), "index and table agree");
        let young = self
            .changes
            .iter()
            .filter(|c| {
                matches!(
                    c,
                    Change::Held {
                        new_since: Some(_),
                        ..
                    }
                )
            })
            .count();
        assert_eq!(young, self.young, "new keys' grants are counted");
        let urgent = self
            .changes
            .iter()
            .filter(|c| {
                matches!(
                    c,
                    Change::Held {
                        new_since: None,
                        hot: false,
                        ..
                    }
                )
            })
            .count();
        assert_eq!(
            urgent, self.urgent,
            "single changes of held keys are counted"
        );
        let ceilings = self
            .changes
            .iter()
            .filter(|c| matches!(c, Change::Ceiling(_)))
            .count();
        assert_eq!(ceilings, self.ceilings, "ceilings are counted");
        for (i, change) in self.changes.iter().enumerate() {
            if let Change::Held { slot, .. } = change {
                assert_eq!(
                    self.keys.get(*slot as usize).map(|k| k.pending),
                    Some(i as u32),
                    "a held entry of the batch names a key that points back at it"
                );
            }
        }
        for (idx, state) in &self.keys {
            if state.pending != NIL {
                assert!(
                    matches!(self.changes.get(state.pending as usize),
                        Some(Change::Held { slot, .. }) if *slot as usize == idx),
                    "a key's batch entry says it is held"
                );
            }
        }
        let mut queued = 0usize;
        let mut grants = 0usize;
        let mut sems = 0usize;
        for (idx, state) in &self.keys {
            assert_eq!(self.index.get(&self.keys, &state.key), Some(idx as u32));
            assert_eq!(
                state.hash,
                self.index.hash(&state.key),
                "a key keeps its hash"
            );
            let limit = self.limit(idx as u32);
            assert!((1..=crate::protocol::MAX_LIMIT).contains(&limit));
            let sem = self.sem(idx as u32);
            if let Some(sem) = sem {
                sems += 1;
                assert!(
                    sem.limit > 1 || sem.first_value.is_some(),
                    "a plain mutex without a value has no Sem"
                );
            }
            let mut holders = vec![(
                state.token,
                state.expiry_ms,
                state.lease_timer,
                sem.map_or(0, |s| s.first_slot),
            )];
            if let Some(sem) = sem {
                holders.extend(
                    sem.more
                        .iter()
                        .map(|g| (g.token, g.expiry_ms, g.lease_timer, g.slot)),
                );
            }
            assert!(holders.len() <= limit as usize, "holders <= limit");
            let mut slots: Vec<u32> = holders.iter().map(|h| h.3).collect();
            slots.sort_unstable();
            slots.dedup();
            assert_eq!(slots.len(), holders.len(), "slots are distinct");
            assert!(
                slots.iter().all(|&s| s < limit),
                "slots are below the limit"
            );
            if let Some(sem) = sem.filter(|s| s.limit > 1) {
                for slot in 0..limit {
                    let taken = sem.is_taken(slot);
                    assert_eq!(taken, slots.contains(&slot), "the slot map is exact");
                }
            }
            // Tokens are unique within a key (and across keys as the token
            // source issues them; a standby holds what it is told).
            let mut tokens: Vec<u64> = holders.iter().map(|h| h.0).collect();
            tokens.sort_unstable();
            tokens.dedup();
            assert_eq!(tokens.len(), holders.len(), "a key's tokens are unique");
            for &(token, expiry_ms, timer, _) in &holders {
                assert_eq!(
                    self.wheel.deadline(timer),
                    Some(expiry_ms),
                    "holder has its lease timer"
                );
                assert!(token <= self.tokens.last());
                assert!(
                    token != 0 || holders.len() == 1,
                    "a placeholder is its key's only holder"
                );
            }
            if state.queue_head != NIL && state.token != 0 {
                assert_eq!(
                    holders.len(),
                    limit as usize,
                    "no barging: a key has waiters only while every slot is taken"
                );
            }
            grants += holders.len();
            let mut w = state.queue_head;
            let mut prev = NIL;
            let mut len = 0;
            while w != NIL {
                let waiter = &self.waiters[w as usize];
                assert_eq!(waiter.key_idx, idx as u32);
                assert_eq!(waiter.prev, prev);
                prev = w;
                w = waiter.next;
                len += 1;
            }
            assert_eq!(state.queue_tail, prev);
            assert_eq!(state.queue_len, len);
            assert_eq!(
                self.contended.contains(idx as u32),
                len > 0,
                "a key is in the contended set iff a request waits for it"
            );
            queued += len as usize;
        }
        assert_eq!(
            queued,
            self.waiters.len(),
            "every waiter is in exactly one queue"
        );
        assert!(
            self.contended
                .iter()
                .all(|idx| self.keys.contains(idx as usize)),
            "the contended set names keys in the table"
        );
        assert_eq!(grants, self.grants, "grants are counted");
        assert_eq!(sems, self.sems.len(), "every Sem belongs to a key");
        let mut in_conns = 0usize;
        for (conn, state) in &self.conns {
            let mut w = state.head;
            let mut n = 0;
            while w != NIL {
                let waiter = &self.waiters[w as usize];
                assert_eq!(waiter.conn, *conn);
                if let Some(timer) = waiter.wait_timer {
                    assert!(
                        self.wheel.deadline(timer).is_some(),
                        "a bounded wait has its timer"
                    );
                }
                w = waiter.conn_next;
                n += 1;
            }
            assert_eq!(state.waiting, n);
            assert!(n > 0, "a connection with no waiter is not tracked");
            in_conns += n as usize;
        }
        assert_eq!(
            in_conns,
            self.waiters.len(),
            "every waiter is in its connection's list"
        );
        for (&(conn, idx), &tail) in &self.chain_tails {
            let waiter = &self.waiters[tail as usize];
            assert_eq!((waiter.conn, waiter.key_idx), (conn, idx));
            assert_eq!(waiter.chain_next, NIL, "a chain tail is last");
        }
        let timers = self.grants
            + self
                .waiters
                .iter()
                .filter(|(_, w)| w.wait_timer.is_some())
                .count();
        assert_eq!(self.wheel.len(), timers, "no timer outlives what it times");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C1: ConnId = ConnId(1);
    const C2: ConnId = ConnId(2);
    const C3: ConnId = ConnId(3);

    fn key(s: &str) -> Key {
        Key::new(s.as_bytes()).expect("test keys are valid")
    }

    /// A table plus the answers of the last step, with invariants checked
    /// after every step.
    struct Harness {
        table: LockTable,
        out: Outbox,
    }

    impl Harness {
        fn new() -> Harness {
            Harness::with_limits(TableLimits::default())
        }
        /// A table that records changes for the standbys (an active).
        fn replicating() -> Harness {
            let mut h = Harness::new();
            h.table.set_replicating(true);
            h
        }
        fn with_limits(limits: TableLimits) -> Harness {
            Harness {
                table: LockTable::new(0, limits, TokenSource::new(0, 1000)),
                out: Outbox::default(),
            }
        }
        fn step(&mut self, f: impl FnOnce(&mut LockTable, &mut Outbox)) -> Vec<(ConnId, Answer)> {
            f(&mut self.table, &mut self.out);
            self.table.check_invariants();
            std::mem::take(&mut self.out.answers)
        }
        fn acquire(
            &mut self,
            now: u64,
            conn: ConnId,
            k: &str,
            lease: u64,
            wait: u64,
        ) -> Vec<(ConnId, Answer)> {
            self.step(|t, o| t.handle_acquire(now, conn, key(k), lease, wait, Ask::plain(), o))
        }
        fn release(
            &mut self,
            now: u64,
            conn: ConnId,
            k: &str,
            token: u64,
        ) -> Vec<(ConnId, Answer)> {
            self.step(|t, o| t.handle_release(now, conn, key(k), token, o))
        }
        fn keep(
            &mut self,
            now: u64,
            conn: ConnId,
            k: &str,
            token: u64,
            lease: u64,
        ) -> Vec<(ConnId, Answer)> {
            self.step(|t, o| t.handle_keep(now, conn, key(k), token, lease, o))
        }
        fn query(&mut self, now: u64, conn: ConnId, k: &str) -> Vec<(ConnId, Answer)> {
            self.step(|t, o| t.handle_query(now, conn, key(k), o))
        }
        fn tick(&mut self, now: u64) -> Vec<(ConnId, Answer)> {
            self.step(|t, o| t.poll_timers(now, o))
        }
        /// Acquire that must be granted at once; returns the token.
        fn grant(&mut self, now: u64, conn: ConnId, k: &str, lease: u64) -> u64 {
            match self.acquire(now, conn, k, lease, 0).as_slice() {
                [
                    (
                        c,
                        Answer::Granted {
                            token,
                            key: got,
                            slot: None,
                        },
                    ),
                ] if *c == conn && *got == key(k) => *token,
                other => panic!("expected an immediate grant, got {other:?}"),
            }
        }
    }

    fn granted(answers: &[(ConnId, Answer)]) -> Vec<(ConnId, u64)> {
        answers
            .iter()
            .filter_map(|(c, a)| match a {
                Answer::Granted { token, .. } => Some((*c, *token)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn grants_handoffs_expiries_and_timeouts_are_counted_with_their_latencies() {
        let mut h = Harness::new();
        let t1 = h.grant(0, C1, "a", 1000);
        h.acquire(10, C2, "a", 100, 0); // waits for a release
        h.acquire(20, C3, "a", 100, 50); // waits, then times out
        assert_eq!(h.tick(70).len(), 1, "C3 timed out");
        let to = |answers: Vec<(ConnId, Answer)>| {
            granted(&answers).iter().map(|g| g.0).collect::<Vec<_>>()
        };
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

    #[test]
    fn a_key_granted_and_freed_within_one_batch_costs_the_standbys_nothing() {
        let mut h = Harness::replicating();
        let t1 = h.grant(0, C1, "short", 1000);
        h.release(1, C1, "short", t1);
        // Handed from holder to holder and freed: still nothing.
        let t2 = h.grant(1, C1, "passed", 1000);
        h.acquire(1, C2, "passed", 1000, 0);
        let t3 = granted(&h.release(2, C1, "passed", t2))[0].1;
        h.release(2, C2, "passed", t3);
        // A lease that runs out within the batch: nothing either.
        h.grant(2, C3, "expired", 5);
        h.tick(8);
        let t4 = h.grant(8, C1, "kept", 1000);
        assert_eq!(
            h.table.take_deltas(9, 0),
            vec![Delta::grant(key("kept"), t4, 999)]
        );
        // Freed, taken again and freed again in the next batch: the standbys
        // hold the first grant until the free, and never see the second.
        h.release(10, C1, "kept", t4);
        let t5 = h.grant(10, C2, "kept", 1000);
        h.release(11, C2, "kept", t5);
        assert_eq!(
            h.table.take_deltas(12, 0),
            vec![Delta::free(key("kept"), t4)]
        );
    }

    #[test]
    fn a_free_and_a_new_grant_of_one_key_leave_in_that_order() {
        let mut h = Harness::replicating();
        let t1 = h.grant(0, C1, "k", 1000);
        let other = h.grant(0, C1, "other", 1000);
        h.table.take_deltas(0, 0);
        h.release(1, C1, "k", t1);
        h.keep(1, C1, "other", other, 1000);
        let t2 = h.grant(2, C2, "k", 1000);
        assert_eq!(
            h.table.take_deltas(3, 0),
            vec![
                Delta::free(key("k"), t1),
                Delta::grant(key("other"), other, 998),
                Delta::grant(key("k"), t2, 999),
            ]
        );
    }

    #[test]
    fn a_node_that_stops_replicating_drops_its_batch_and_records_nothing() {
        let mut h = Harness::replicating();
        let t1 = h.grant(0, C1, "a", 1000);
        h.table.set_replicating(false);
        assert!(!h.table.has_changes());
        h.release(1, C1, "a", t1);
        h.grant(1, C1, "b", 1000);
        assert!(!h.table.has_changes());
        // Replicating again: a key held from before starts a fresh entry.
        h.table.set_replicating(true);
        let t3 = h.grant(2, C2, "c", 1000);
        assert_eq!(
            h.table.take_deltas(2, 0),
            vec![Delta::grant(key("c"), t3, 1000)]
        );
    }

    #[test]
    fn a_promotion_grace_placeholder_is_never_replicated() {
        let mut h = Harness::replicating();
        h.table.set_grace_until(100);
        // The request waits behind a placeholder, then gives up.
        assert!(h.acquire(0, C1, "k", 1000, 50).is_empty());
        h.tick(50);
        // The placeholder runs out with nobody waiting: no free of token 0.
        h.tick(100);
        assert_eq!(h.table.stats().held, 0);
        assert_eq!(h.table.take_deltas(100, 0), vec![]);
    }

    #[test]
    fn a_new_keys_grant_waits_until_it_is_old_enough_and_is_never_sent_if_freed_first() {
        let mut h = Harness::replicating();
        let short = h.grant(10, C1, "short", 1000);
        h.grant(10, C1, "long", 1000);
        let ready = |h: &Harness| h.table.changes_ready();
        let r = ready(&h);
        assert_eq!(
            (r.urgent, r.young, r.oldest_young_ms, r.settled),
            (false, 2, Some(10), false)
        );
        // Too young at 11: nothing goes, both stay for the next batch.
        assert_eq!(h.table.take_deltas(11, 2), vec![]);
        assert_eq!(ready(&h).oldest_young_ms, Some(10));
        h.release(11, C1, "short", short);
        // A free of a key the standbys hold may wait; the young grant waits
        // until it comes of age.
        let old = h.grant(11, C2, "old", 1000);
        h.table.take_deltas(14, 0);
        h.release(15, C2, "old", old);
        let r = ready(&h);
        assert_eq!((r.urgent, r.young, r.settled), (false, 0, true));
        assert_eq!(
            h.table.take_deltas(15, 2),
            vec![Delta::free(key("old"), old)]
        );
        let young = h.grant(16, C3, "young", 1000);
        assert_eq!(h.table.take_deltas(17, 2), vec![]);
        assert_eq!(
            h.table.take_deltas(18, 2),
            vec![Delta::grant(key("young"), young, 998)]
        );
        let r = ready(&h);
        assert_eq!((r.urgent, r.young, r.settled), (false, 0, false));
    }

    #[test]
    fn one_handover_of_a_held_key_is_urgent_and_a_key_that_keeps_changing_is_not() {
        let mut h = Harness::replicating();
        let t1 = h.grant(0, C1, "k", 1000);
        h.acquire(0, C2, "k", 1000, 0);
        h.acquire(0, C3, "k", 1000, 0);
        h.table.take_deltas(5, 0);
        // One handover: the standbys must hear of it soon.
        let t2 = granted(&h.release(6, C1, "k", t1))[0].1;
        assert!(h.table.changes_ready().urgent);
        // A second change of the same key in the batch: it is hot, and its
        // batch may wait (the standbys' copy is a past state either way).
        h.release(7, C2, "k", t2);
        let r = h.table.changes_ready();
        assert_eq!((r.urgent, r.settled), (false, true));
        let taken = h.table.take_deltas(8, 2);
        assert!(matches!(&taken[..], [Delta::Grant { token, .. }] if *token > t2));
    }

    /// xorshift64*: a small seeded generator for the property test below.
    struct TestRng(u64);
    impl TestRng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
        }
    }

    #[test]
    fn a_standby_fed_the_batches_holds_what_the_active_holds_at_every_take() {
        for seed in 1..=40u64 {
            let mut rng = TestRng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mut active = Harness::new();
            active.table.set_replicating(true);
            let mut standby = LockTable::new(0, TableLimits::default(), TokenSource::new(1, 1));
            let keys = ["a", "b", "c", "d", "e"];
            let conns = [C1, C2, C3];
            let mut held: Vec<(usize, u64)> = Vec::new();
            for now in 0..2_000u64 {
                for _ in 0..rng.below(4) {
                    let k = rng.below(keys.len() as u64) as usize;
                    let conn = conns[rng.below(3) as usize];
                    let answers = match rng.below(4) {
                        0 | 1 => {
                            let lease = 1 + rng.below(40);
                            active.acquire(now, conn, keys[k], lease, rng.below(30))
                        }
                        2 => match held.iter().position(|(hk, _)| *hk == k) {
                            Some(i) => active.release(now, conn, keys[k], held[i].1),
                            None => Vec::new(),
                        },
                        _ => match held.iter().position(|(hk, _)| *hk == k) {
                            Some(i) => {
                                active.keep(now, conn, keys[k], held[i].1, 1 + rng.below(40))
                            }
                            None => Vec::new(),
                        },
                    };
                    for (_, answer) in answers {
                        if let Answer::Granted {
                            token, key: got, ..
                        } = answer
                        {
                            let k = keys.iter().position(|k| key(k) == got).expect("a test key");
                            held.retain(|(hk, _)| *hk != k);
                            held.push((k, token));
                        }
                    }
                }
                for (_, answer) in active.tick(now) {
                    if let Answer::Granted {
                        token, key: got, ..
                    } = answer
                    {
                        let k = keys.iter().position(|k| key(k) == got).expect("a test key");
                        held.retain(|(hk, _)| *hk != k);
                        held.push((k, token));
                    }
                }
                if rng.below(3) == 0 {
                    let hold_young = if seed % 2 == 0 { 0 } else { rng.below(4) };
                    for delta in active.table.take_deltas(now, hold_young) {
                        standby
                            .apply_delta(now, delta)
                            .expect("the active's own deltas apply");
                    }
                    standby.check_invariants();
                    for k in keys {
                        let on_standby = standby.query_token(&key(k));
                        let on_active = active.table.query_token(&key(k));
                        if hold_young == 0 {
                            assert_eq!(on_standby, on_active, "seed {seed}, key {k} at {now} ms");
                        } else {
                            // A young grant may not have gone yet: the
                            // standby holds nothing then, never a wrong token.
                            assert!(
                                on_standby.is_none() || on_standby == on_active,
                                "seed {seed}, key {k} at {now} ms"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_standby_frees_a_key_held_by_the_token_or_an_older_one_only() {
        let mut standby = Harness::new();
        let grant = |k: &str, token: u64| Delta::grant(key(k), token, 1000);
        let free = |k: &str, token: u64| Delta::free(key(k), token);
        for k in ["older", "same", "newer"] {
            standby.step(|t, _| t.apply_delta(0, grant(k, 500)).expect("applied"));
        }
        // A handover to 600 was coalesced away: its free still frees.
        standby.step(|t, _| t.apply_delta(0, free("older", 600)).expect("applied"));
        standby.step(|t, _| t.apply_delta(0, free("same", 500)).expect("applied"));
        // A free of an older token is stale: the key stays held.
        standby.step(|t, _| t.apply_delta(0, free("newer", 400)).expect("applied"));
        // A free of a key not held is nothing.
        standby.step(|t, _| t.apply_delta(0, free("absent", 700)).expect("applied"));
        assert_eq!(standby.table.query_token(&key("older")), None);
        assert_eq!(standby.table.query_token(&key("same")), None);
        assert_eq!(standby.table.query_token(&key("newer")), Some(500));
        assert_eq!(standby.table.stats().held, 1);
    }

    #[test]
    fn a_standby_refuses_a_grant_that_moves_a_token_down_or_passes_max_keys() {
        let mut standby = Harness::new();
        let grant = |k: &str, token: u64| Delta::grant(key(k), token, 1000);
        standby.step(|t, _| t.apply_delta(0, grant("a", 500)).expect("new key"));
        standby.step(|t, _| t.apply_delta(0, grant("a", 500)).expect("an extension"));
        standby.step(|t, _| t.apply_delta(0, grant("a", 600)).expect("a new grant"));
        standby.step(|t, _| {
            assert_eq!(
                t.apply_delta(0, grant("a", 550)),
                Err("a grant below the key's current token")
            );
        });
        assert_eq!(standby.table.query_token(&key("a")), Some(600));
        let limits = TableLimits {
            max_waiting_per_conn: 8,
            max_keys: 1,
        };
        let mut small = LockTable::new(0, limits, TokenSource::new(0, 1));
        assert_eq!(small.apply_delta(0, grant("a", 16)), Ok(()));
        assert_eq!(
            small.apply_delta(0, grant("b", 32)),
            Err("a grant past --max-keys")
        );
        assert_eq!(small.stats().held, 1);
        assert_eq!(
            small.load_snapshot(0, vec![grant("x", 48), grant("y", 64)]),
            Err((1, "a grant past --max-keys"))
        );
        assert_eq!(small.stats().held, 1);
    }

    #[test]
    fn a_standby_table_follows_snapshot_and_deltas_and_issues_tokens_above_them() {
        let mut active = Harness::new();
        let t1 = active.grant(0, C1, "a", 1000);
        active.grant(0, C1, "b", 1000);
        let mut standby = Harness::new();
        let snapshot = active.table.snapshot(100);
        standby.step(|t, _| t.load_snapshot(100, snapshot).expect("all applied"));
        assert_eq!(standby.table.stats().held, 2);
        standby.step(|t, _| {
            t.apply_delta(100, Delta::free(key("a"), t1))
                .expect("applied")
        });
        standby.step(|t, _| {
            t.apply_delta(100, Delta::Ceiling(t1 + 1_000_000))
                .expect("applied")
        });
        assert_eq!(standby.table.stats().held, 1);
        // Promoted: the held key is still held, new tokens are above the ceiling.
        assert!(standby.acquire(150, C2, "b", 1000, 0).is_empty());
        assert!(standby.grant(150, C2, "a", 1000) > t1 + 1_000_000);
        // A replicated lease runs out on the standby too.
        standby.tick(1100);
        assert_eq!(
            standby.table.stats().held,
            2,
            "b expired and went to its waiter"
        );
        assert_eq!(standby.table.stats().waiting, 0);
    }

    #[test]
    fn redirecting_waiters_answers_each_with_m_in_arrival_order() {
        let mut h = Harness::new();
        h.grant(0, C1, "k", 1000);
        h.acquire(0, C2, "k", 1000, 0);
        h.acquire(0, C2, "k", 1000, 50);
        h.tick(50);
        let answers = h.step(|t, o| t.redirect_waiters(Some("h:1"), o));
        let moved = Answer::Moved {
            active: Some("h:1".into()),
            op: Op::Acquire,
            key: Some(key("k")),
        };
        assert_eq!(
            answers,
            vec![(C2, moved), (C2, Answer::Timeout { key: key("k") })]
        );
        assert_eq!(h.table.stats().waiting, 0);
    }

    #[test]
    fn tokens_strictly_increase_across_keys_handoffs_and_expiries() {
        let mut h = Harness::new();
        let mut seen = vec![h.table.stats().last_token];
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let conns = [C1, C2, C3];
        let mut held: Vec<(String, u64)> = Vec::new();
        for now in 0..3000u64 {
            let r = next();
            let k = format!("k{}", r % 5);
            let conn = conns[(r >> 8) as usize % 3];
            let answers = match (r >> 16) % 6 {
                0 | 1 => h.acquire(now, conn, &k, 1 + (r >> 24) % 50, (r >> 32) % 40),
                2 if !held.is_empty() => {
                    let (k, token) = held.swap_remove((r >> 24) as usize % held.len());
                    h.release(now, conn, &k, token)
                }
                3 => h.step(|t, _| t.handle_disconnect(conn)),
                4 if !held.is_empty() => {
                    let (k, token) = held[(r >> 24) as usize % held.len()].clone();
                    h.keep(now, conn, &k, token, 30)
                }
                _ => h.tick(now),
            };
            for (_, answer) in answers {
                if let Answer::Granted { token, key, .. } = answer {
                    assert!(token > *seen.last().unwrap_or(&0));
                    seen.push(token);
                    held.push((key.to_string(), token));
                }
            }
        }
        assert!(seen.len() > 100, "the run granted enough to mean something");
    }

    // ---- semaphores ------------------------------------------------------

    fn value(v: &str) -> Value {
        Value::new(v.as_bytes()).expect("test values are valid")
    }

    fn ask(limit: u32) -> Ask {
        Ask {
            limit: Some(limit),
            value: None,
        }
    }

    impl Harness {
        fn acquire_with(
            &mut self,
            now: u64,
            conn: ConnId,
            k: &str,
            lease: u64,
            wait: u64,
            ask: Ask,
        ) -> Vec<(ConnId, Answer)> {
            self.step(|t, o| t.handle_acquire(now, conn, key(k), lease, wait, ask, o))
        }
        /// Acquire naming `limit` that must be granted at once: (token, slot).
        fn grant_slot(&mut self, now: u64, conn: ConnId, k: &str, limit: u32) -> (u64, u32) {
            match self
                .acquire_with(now, conn, k, 1000, 0, ask(limit))
                .as_slice()
            {
                [
                    (
                        c,
                        Answer::Granted {
                            token,
                            key: got,
                            slot: Some(slot),
                        },
                    ),
                ] if *c == conn && *got == key(k) => (*token, *slot),
                other => panic!("expected an immediate grant with a slot, got {other:?}"),
            }
        }
        /// The key's live holders as (token, slot, value), by slot.
        fn holders(&self, k: &str) -> Vec<(u64, u32, Option<String>)> {
            let Some(view) = self.table.key_view(&key(k)) else {
                return Vec::new();
            };
            let mut holders: Vec<_> = view
                .holders()
                .map(|h| {
                    let v = h
                        .value
                        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
                    (h.token, h.slot, v)
                })
                .collect();
            holders.sort_by_key(|h| h.1);
            holders
        }
    }

    fn refused_reason(answers: &[(ConnId, Answer)]) -> Option<Reason> {
        match answers {
            [(_, Answer::Error { reason, .. })] => Some(*reason),
            _ => None,
        }
    }

    fn released(k: &str) -> Answer {
        Answer::Released { key: key(k) }
    }

    fn not_held(k: &str) -> Answer {
        Answer::NotHeld { key: key(k) }
    }

    fn kept(k: &str) -> Answer {
        Answer::Kept { key: key(k) }
    }

    fn not_held_keep(k: &str) -> Answer {
        Answer::Error {
            op: Some(Op::Keep),
            key: Some(key(k)),
            reason: Reason::NotHeld,
        }
    }

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

    #[test]
    fn a_limit_of_three_grants_three_at_once_in_slots_0_1_2_with_increasing_tokens() {
        let mut h = Harness::new();
        let (t0, s0) = h.grant_slot(0, C1, "s", 3);
        let (t1, s1) = h.grant_slot(1, C2, "s", 3);
        let (t2, s2) = h.grant_slot(2, C3, "s", 3);
        assert_eq!((s0, s1, s2), (0, 1, 2));
        assert!(t0 < t1 && t1 < t2);
        assert!(
            h.acquire_with(3, C1, "s", 1000, 0, ask(3)).is_empty(),
            "a fourth waits"
        );
        assert_eq!(h.table.stats().held, 1, "one key");
        assert_eq!(h.table.stats().holders, 3, "three grants");
        assert_eq!(h.table.stats().waiting, 1);
    }

    #[test]
    fn a_freed_slot_goes_to_the_head_of_the_line_with_a_new_token() {
        let mut h = Harness::new();
        let (_, _) = h.grant_slot(0, C1, "s", 2);
        let (t1, s1) = h.grant_slot(0, C1, "s", 2);
        assert!(h.acquire_with(1, C2, "s", 500, 0, ask(2)).is_empty());
        assert!(h.acquire_with(2, C3, "s", 500, 0, ask(2)).is_empty());
        let answers = h.release(10, C1, "s", t1);
        match answers.as_slice() {
            [
                (
                    C2,
                    Answer::Granted {
                        token,
                        slot: Some(slot),
                        ..
                    },
                ),
                (C1, Answer::Released { .. }),
            ] => {
                assert!(*token > t1, "a new token, above every earlier one");
                assert_eq!(*slot, s1, "the slot just freed");
            }
            other => panic!("{other:?}"),
        }
        // The new holder's lease is fresh from the handover.
        let newest = h
            .table
            .key_view(&key("s"))
            .expect("held")
            .newest()
            .expect("a holder");
        assert_eq!(newest.expiry_ms, 510);
        assert_eq!(h.table.stats().waiting, 1, "C3 still waits: no barging");
        assert_eq!(
            refused_reason(&h.acquire_with(11, C1, "s", 500, 0, ask(2))),
            None,
            "a newcomer queues behind C3"
        );
        assert_eq!(h.table.stats().waiting, 2);
    }

    #[test]
    fn an_acquire_naming_another_limit_is_refused_and_changes_nothing() {
        let mut h = Harness::new();
        let (t0, _) = h.grant_slot(0, C1, "s", 3);
        let before = (h.holders("s"), h.table.stats());
        assert_eq!(
            refused_reason(&h.acquire_with(1, C2, "s", 1000, 0, ask(2))),
            Some(Reason::LimitMismatch)
        );
        assert_eq!(
            refused_reason(&h.acquire(1, C2, "s", 1000, 0)),
            Some(Reason::LimitMismatch),
            "a plain A names limit 1"
        );
        assert_eq!((h.holders("s"), h.table.stats()), before, "nothing changed");
        // A mutex refuses a limit too.
        h.grant(2, C1, "m", 1000);
        assert_eq!(
            refused_reason(&h.acquire_with(3, C2, "m", 1000, 0, ask(4))),
            Some(Reason::LimitMismatch)
        );
        // Once the key has neither holder nor waiter, any limit registers it.
        assert_eq!(h.release(4, C1, "s", t0).len(), 1);
        let (first, _) = h.grant_slot(5, C2, "s", 2);
        h.grant_slot(6, C2, "s", 2);
        // A refusal keeps its place behind the connection's earlier waiter
        // for the key: C3 hears of the mismatch after its grant.
        assert!(h.acquire_with(7, C3, "s", 1000, 0, ask(2)).is_empty());
        assert!(h.acquire_with(8, C3, "s", 1000, 0, ask(3)).is_empty());
        match h.release(9, C2, "s", first).as_slice() {
            [
                (C3, Answer::Granted { slot: Some(0), .. }),
                (
                    C3,
                    Answer::Error {
                        reason: Reason::LimitMismatch,
                        ..
                    },
                ),
                (C2, Answer::Released { .. }),
            ] => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_lowest_free_slot_is_taken() {
        let mut h = Harness::new();
        let grants: Vec<(u64, u32)> = (0..4).map(|i| h.grant_slot(i, C1, "s", 4)).collect();
        assert_eq!(grants.iter().map(|g| g.1).collect::<Vec<_>>(), [0, 1, 2, 3]);
        h.release(10, C1, "s", grants[2].0);
        h.release(11, C1, "s", grants[0].0);
        assert_eq!(h.grant_slot(12, C2, "s", 4).1, 0, "the lowest of 0 and 2");
        assert_eq!(h.grant_slot(13, C2, "s", 4).1, 2);
        let slots: Vec<u32> = h.holders("s").iter().map(|h| h.1).collect();
        assert_eq!(slots, [0, 1, 2, 3]);
    }

    #[test]
    fn max_keys_counts_every_holder() {
        let mut h = Harness::with_limits(TableLimits {
            max_waiting_per_conn: 10,
            max_keys: 3,
        });
        h.grant_slot(0, C1, "s", 5);
        h.grant_slot(0, C1, "s", 5);
        h.grant(0, C1, "m", 1000);
        assert_eq!(h.table.stats().holders, 3);
        assert_eq!(
            refused_reason(&h.acquire_with(1, C2, "s", 1000, 0, ask(5))),
            Some(Reason::TooManyKeys),
            "a free slot, but the table holds max-keys grants"
        );
        assert_eq!(
            refused_reason(&h.acquire(1, C2, "other", 1000, 0)),
            Some(Reason::TooManyKeys)
        );
        assert!(
            h.acquire(1, C2, "m", 1000, 0).is_empty(),
            "a held mutex still queues"
        );
    }

    #[test]
    fn an_expired_holder_frees_its_slot_on_time_for_the_next_waiter() {
        let mut h = Harness::new();
        let (_, _) = h.grant_slot(0, C1, "s", 2);
        let short = match h.acquire_with(0, C1, "s", 100, 0, ask(2)).as_slice() {
            [
                (
                    _,
                    Answer::Granted {
                        token,
                        slot: Some(1),
                        ..
                    },
                ),
            ] => *token,
            other => panic!("{other:?}"),
        };
        assert!(h.acquire_with(5, C2, "s", 300, 0, ask(2)).is_empty());
        assert!(h.tick(99).is_empty(), "not before its lease runs out");
        match h.tick(100).as_slice() {
            [
                (
                    C2,
                    Answer::Granted {
                        token,
                        slot: Some(1),
                        ..
                    },
                ),
            ] => assert!(*token > short),
            other => panic!("expected C2 granted slot 1 at 100 ms, got {other:?}"),
        }
        assert_eq!(h.table.metrics().expiries, 1);
        // The expired holder's token no longer holds the key.
        assert_eq!(
            h.release(101, C1, "s", short),
            vec![(C1, Answer::NotHeld { key: key("s") })]
        );
    }

    #[test]
    fn a_plain_acquire_is_answered_without_a_slot_and_one_naming_a_limit_with_it() {
        let mut h = Harness::new();
        assert!(matches!(
            h.acquire(0, C1, "a", 1000, 0).as_slice(),
            [(_, Answer::Granted { slot: None, .. })]
        ));
        assert_eq!(h.grant_slot(0, C1, "b", 1).1, 0, "limit 1 names slot 0");
        // A waiter is answered the way it asked, whatever the holder did.
        assert!(h.acquire(1, C2, "b", 1000, 0).is_empty());
        let token = h.holders("b")[0].0;
        assert!(matches!(
            h.release(2, C1, "b", token).as_slice(),
            [(C2, Answer::Granted { slot: None, .. }), _]
        ));
    }

    #[test]
    fn a_value_is_kept_with_its_grant_and_handed_on_only_with_the_next_holders_own() {
        let mut h = Harness::new();
        let with_value = |limit, v: &str| Ask {
            limit: Some(limit),
            value: Some(value(v)),
        };
        let answers = h.acquire_with(0, C1, "lead", 1000, 0, with_value(1, "10.0.0.1:80"));
        let Some((_, Answer::Granted { token, .. })) = answers.first() else {
            panic!("{answers:?}")
        };
        assert_eq!(h.holders("lead"), [(*token, 0, Some("10.0.0.1:80".into()))]);
        // A waiter without a value: the next holder has none.
        assert!(h.acquire_with(1, C2, "lead", 1000, 0, ask(1)).is_empty());
        let next = granted(&h.release(2, C1, "lead", *token))[0].1;
        assert_eq!(h.holders("lead"), [(next, 0, None)]);
        // ... and one with a value: its own.
        assert!(
            h.acquire_with(3, C3, "lead", 1000, 0, with_value(1, "b"))
                .is_empty()
        );
        let third = granted(&h.release(4, C2, "lead", next))[0].1;
        assert_eq!(h.holders("lead"), [(third, 0, Some("b".into()))]);
        // Semaphore holders each carry their own.
        let t = granted(&h.acquire_with(5, C1, "s", 1000, 0, with_value(3, "x")))[0].1;
        let u = granted(&h.acquire_with(5, C2, "s", 1000, 0, with_value(3, "y")))[0].1;
        assert_eq!(
            h.holders("s"),
            [(t, 0, Some("x".into())), (u, 1, Some("y".into()))]
        );
        // The first grant leaving moves another into its place: values stay
        // with their grants.
        h.release(6, C1, "s", t);
        assert_eq!(h.holders("s"), [(u, 1, Some("y".into()))]);
    }

    #[test]
    fn query_shows_the_newest_grant_of_a_semaphore() {
        let mut h = Harness::new();
        h.acquire_with(0, C1, "s", 5000, 0, ask(3));
        h.acquire_with(10, C1, "s", 300, 0, ask(3));
        let newest = granted(&h.acquire_with(20, C2, "s", 1000, 0, ask(3)))[0].1;
        assert!(h.acquire_with(30, C3, "s", 1000, 0, ask(3)).is_empty());
        match h.query(40, C1, "s").as_slice() {
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
                assert_eq!(*token, newest, "the largest token");
                assert_eq!(*ms_left, 980, "the newest grant's lease left");
                assert_eq!(*waiting, 1);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn release_and_keep_name_any_holder_by_its_token() {
        let mut h = Harness::new();
        let grants: Vec<(u64, u32)> = (0..3).map(|_| h.grant_slot(0, C1, "s", 3)).collect();
        assert_eq!(
            h.keep(10, C2, "s", grants[1].0, 5000),
            vec![(C2, Answer::Kept { key: key("s") })]
        );
        assert_eq!(h.keep(10, C2, "s", 12345, 5000).len(), 1);
        assert!(matches!(
            h.keep(10, C2, "s", 12345, 5000).as_slice(),
            [(
                _,
                Answer::Error {
                    reason: Reason::NotHeld,
                    ..
                }
            )]
        ));
        // Only the kept grant survives the others' leases.
        assert!(h.tick(1000).is_empty());
        assert_eq!(h.holders("s"), [(grants[1].0, 1, None)]);
        assert_eq!(
            h.release(1001, C3, "s", grants[1].0),
            vec![(C3, Answer::Released { key: key("s") })]
        );
        assert!(
            h.table.key_view(&key("s")).is_none(),
            "a key with no holder is gone"
        );
    }

    /// Every key's limit and holders as (token, slot, expiry, value), by
    /// key and slot: what a standby must hold of its active.
    type Holders = Vec<(u64, u32, u64, Option<Value>)>;
    fn table_state(table: &LockTable) -> Vec<(Key, u32, Holders)> {
        let mut keys: Vec<(Key, u32, Holders)> = table
            .keys
            .iter()
            .filter_map(|(_, state)| {
                let view = table.key_view(&state.key)?;
                let mut holders: Holders = view
                    .holders()
                    .map(|h| (h.token, h.slot, h.expiry_ms, h.value.cloned()))
                    .collect();
                holders.sort_by_key(|h| h.1);
                Some((state.key.clone(), view.limit(), holders))
            })
            .collect();
        keys.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        keys
    }

    fn sem_grant(
        k: &str,
        token: u64,
        ms_left: u64,
        limit: u32,
        slot: u32,
        v: Option<&str>,
    ) -> Delta {
        Delta::Grant {
            key: key(k),
            token,
            ms_left,
            limit,
            slot,
            value: v.map(value),
        }
    }

    fn with_value(limit: Option<u32>, v: &str) -> Ask {
        Ask {
            limit,
            value: Some(value(v)),
        }
    }

    #[test]
    fn a_semaphores_grants_replicate_with_their_limit_slots_values_and_leases() {
        let mut h = Harness::replicating();
        let mut standby = Harness::new();
        let mut tokens = Vec::new();
        for (i, conn) in [C1, C2, C3].into_iter().enumerate() {
            let answers = h.acquire_with(
                0,
                conn,
                "s",
                1000 + i as u64,
                0,
                with_value(Some(3), &format!("v{i}")),
            );
            tokens.push(granted(&answers)[0].1);
        }
        let t = h.grant(0, C1, "m", 1000);
        let deltas = h.table.take_deltas(10, 0);
        assert_eq!(
            deltas,
            [
                sem_grant("s", tokens[0], 990, 3, 0, Some("v0")),
                sem_grant("s", tokens[1], 991, 3, 1, Some("v1")),
                sem_grant("s", tokens[2], 992, 3, 2, Some("v2")),
                Delta::grant(key("m"), t, 990),
            ]
        );
        let apply = |standby: &mut Harness, now: u64, deltas: Vec<Delta>| {
            for delta in deltas {
                standby.step(|table, _| table.apply_delta(now, delta).expect("applied"));
            }
        };
        apply(&mut standby, 10, deltas);
        assert_eq!(table_state(&standby.table), table_state(&h.table));
        // A release with nobody waiting: the free of that slot only.
        h.release(20, C1, "s", tokens[1]);
        let deltas = h.table.take_deltas(20, 0);
        assert_eq!(
            deltas,
            [Delta::Free {
                key: key("s"),
                token: tokens[1],
                slot: 1
            }]
        );
        apply(&mut standby, 20, deltas);
        assert_eq!(table_state(&standby.table), table_state(&h.table));
        // A new grant takes the freed slot; then a full key queues, and a
        // release hands slot 0 to the waiter: grants of the key, read when
        // the batch is taken (the handover replaces slot 0 on the standby).
        let (t3, slot) = h.grant_slot(30, C2, "s", 3);
        assert_eq!(slot, 1);
        assert!(
            h.acquire_with(30, C3, "s", 500, 0, with_value(Some(3), "next"))
                .is_empty()
        );
        let answers = h.release(31, C1, "s", tokens[0]);
        let t4 = granted(&answers)[0].1;
        assert!(h.keep(32, C3, "s", tokens[2], 5000).len() == 1);
        let mut deltas = h.table.take_deltas(40, 0);
        // A key's grants come in no particular order.
        deltas.sort_by_key(|d| match d {
            Delta::Grant { slot, .. } => *slot,
            _ => u32::MAX,
        });
        assert_eq!(
            deltas,
            [
                sem_grant("s", t4, 491, 3, 0, Some("next")),
                sem_grant("s", t3, 990, 3, 1, None),
                sem_grant("s", tokens[2], 4992, 3, 2, Some("v2")),
            ]
        );
        apply(&mut standby, 40, deltas);
        assert_eq!(table_state(&standby.table), table_state(&h.table));
        // The standby's leases run out when the active's do.
        standby.tick(530);
        assert_eq!(standby.holders("s").len(), 3);
        standby.tick(531);
        assert_eq!(standby.holders("s").len(), 2);
        // A plain mutex that gets a value (a handover to an acquire with
        // one) and loses it again is replicated both ways.
        assert!(
            h.acquire_with(40, C2, "m", 100, 0, with_value(None, "who"))
                .is_empty()
        );
        let t5 = granted(&h.release(41, C1, "m", t))[0].1;
        let deltas = h.table.take_deltas(41, 0);
        assert_eq!(deltas, [sem_grant("m", t5, 100, 1, 0, Some("who"))]);
        apply(&mut standby, 41, deltas);
        assert_eq!(standby.holders("m"), [(t5, 0, Some("who".to_string()))]);
        assert!(h.acquire(42, C3, "m", 100, 0).is_empty());
        let t6 = granted(&h.release(43, C2, "m", t5))[0].1;
        let deltas = h.table.take_deltas(43, 0);
        assert_eq!(deltas, [Delta::grant(key("m"), t6, 100)]);
        apply(&mut standby, 43, deltas);
        assert_eq!(standby.holders("m"), [(t6, 0, None)]);
        assert_eq!(standby.table.sems.len(), 1, "the mutex has no Sem again");
    }

    #[test]
    fn a_semaphore_with_values_round_trips_through_a_snapshot_with_its_leases() {
        let mut h = Harness::new();
        for (i, conn) in [C1, C2, C3].into_iter().enumerate() {
            h.acquire_with(
                0,
                conn,
                "s",
                100 * (i as u64 + 1),
                0,
                with_value(Some(4), &format!("host-{i}")),
            );
        }
        let (t1, _) = h.grant_slot(0, C1, "s", 4);
        h.release(1, C1, "s", h.holders("s")[1].0);
        h.acquire_with(0, C2, "elect", 1000, 0, with_value(Some(1), "leader"));
        h.grant(0, C3, "plain", 50);
        let snapshot = h.table.snapshot(10);
        assert_eq!(snapshot.len(), 5, "a grant per holder: {snapshot:?}");
        let mut standby = Harness::new();
        standby.step(|t, _| t.load_snapshot(10, snapshot).expect("loaded"));
        assert_eq!(table_state(&standby.table), table_state(&h.table));
        assert_eq!(
            standby.holders("s").iter().map(|h| h.1).collect::<Vec<_>>(),
            [0, 2, 3],
            "slot 1 was released"
        );
        // The leases run out on the standby when they do on the active
        // (slot 0: 100 ms from 0).
        standby.tick(99);
        assert_eq!(standby.holders("s").len(), 3);
        standby.tick(100);
        assert_eq!(standby.holders("s").len(), 2);
        assert_eq!(
            standby.table.key_view(&key("plain")).map(|v| v.limit()),
            None
        );
        // A promoted standby serves the same slots: the lowest free is 0.
        standby.table.observe_token(t1);
        assert_eq!(standby.grant_slot(101, C1, "s", 4).1, 0);
        assert_eq!(standby.grant_slot(101, C1, "s", 4).1, 1);
        assert_eq!(
            refused_reason(&standby.acquire_with(101, C1, "s", 10, 0, ask(3))),
            Some(Reason::LimitMismatch)
        );
        assert!(
            standby.acquire_with(101, C1, "s", 10, 0, ask(4)).is_empty(),
            "full: it waits"
        );
    }

    #[test]
    fn a_standby_refuses_a_semaphore_grant_out_of_range_moved_or_past_max_keys() {
        let mut standby = Harness::with_limits(TableLimits {
            max_keys: 4,
            ..TableLimits::default()
        });
        let apply = |standby: &mut Harness, d: Delta| {
            let before = table_state(&standby.table);
            let got = standby.table.apply_delta(0, d);
            standby.table.check_invariants();
            if got.is_err() {
                assert_eq!(
                    table_state(&standby.table),
                    before,
                    "a refusal changes nothing"
                );
            }
            got
        };
        assert_eq!(
            apply(&mut standby, sem_grant("s", 16, 10, 0, 0, None)),
            Err("a limit outside 1..=10000")
        );
        assert_eq!(
            apply(&mut standby, sem_grant("s", 16, 10, 10_001, 0, None)),
            Err("a limit outside 1..=10000")
        );
        assert_eq!(
            apply(&mut standby, sem_grant("s", 16, 10, 3, 3, None)),
            Err("a slot at or above its key's limit")
        );
        assert_eq!(
            apply(&mut standby, sem_grant("s", 0, 10, 3, 0, None)),
            Err("token 0")
        );
        assert_eq!(
            apply(&mut standby, sem_grant("s", 16, 10, 3, 1, Some("a"))),
            Ok(())
        );
        assert_eq!(
            apply(&mut standby, sem_grant("s", 16, 10, 3, 2, None)),
            Err("a grant moved to another slot")
        );
        assert_eq!(
            apply(&mut standby, sem_grant("s", 32, 10, 3, 2, None)),
            Ok(())
        );
        assert_eq!(
            apply(&mut standby, sem_grant("s", 17, 10, 3, 2, None)),
            Err("a grant below the key's current token")
        );
        assert_eq!(
            apply(&mut standby, sem_grant("s", 48, 10, 3, 0, None)),
            Ok(())
        );
        assert_eq!(
            apply(&mut standby, sem_grant("m", 64, 10, 1, 0, None)),
            Ok(())
        );
        // Four grants held: a fifth is past --max-keys, a handover is not.
        assert_eq!(
            apply(&mut standby, sem_grant("n", 80, 10, 1, 0, None)),
            Err("a grant past --max-keys")
        );
        assert_eq!(
            apply(&mut standby, sem_grant("s", 96, 10, 3, 2, Some("b"))),
            Ok(())
        );
        // A free of an older token leaves a slot's newer grant; the free of
        // the slot's token (or a newer one) frees it.
        assert_eq!(
            apply(
                &mut standby,
                Delta::Free {
                    key: key("s"),
                    token: 32,
                    slot: 2
                }
            ),
            Ok(())
        );
        assert_eq!(standby.holders("s").len(), 3);
        assert_eq!(
            apply(
                &mut standby,
                Delta::Free {
                    key: key("s"),
                    token: 100,
                    slot: 2
                }
            ),
            Ok(())
        );
        assert_eq!(
            standby.holders("s"),
            [(48, 0, None), (16, 1, Some("a".to_string()))]
        );
        // The key with another limit: the active's replaces it.
        assert_eq!(
            apply(&mut standby, sem_grant("s", 112, 10, 2, 1, None)),
            Ok(())
        );
        assert_eq!(standby.holders("s"), [(112, 1, None)]);
        assert_eq!(standby.table.stats().holders, 2);
    }

    #[test]
    fn a_watched_key_replaced_by_the_actives_limit_tells_its_watchers_and_lives() {
        // A standby whose loop watches `s` (a W on its way to its `M`) is
        // told by its active that `s` has another limit: the key it held
        // is replaced, and the watchers hear of it while it is still there
        // to be named (before, the lookup of the removed key panicked).
        let mut standby = Harness::new();
        standby.table.watchers_mut().set(0, key("s"), true);
        assert_eq!(
            standby
                .table
                .apply_delta(0, sem_grant("s", 16, 10, 2, 1, None)),
            Ok(())
        );
        assert_eq!(
            standby
                .table
                .apply_delta(0, sem_grant("s", 32, 10, 3, 0, Some("a"))),
            Ok(())
        );
        standby.table.check_invariants();
        assert_eq!(standby.holders("s"), [(32, 0, Some("a".to_string()))]);
        let mut out = Outbox::default();
        standby.table.take_watch_lines(&mut out);
        assert!(
            !out.answers.is_empty(),
            "the watching loop is told of the change"
        );
    }

    #[test]
    fn a_semaphores_room_follows_its_holders_not_its_past_or_its_limit() {
        // Many holders of a key of limit 10000 come and go; one stays. The
        // key then costs what one holder needs: --max-keys bounds memory by
        // the grants held now.
        let mut h = Harness::new();
        let mut tokens = Vec::new();
        for i in 0..2000u64 {
            let answers = h.acquire_with(
                0,
                C1,
                "big",
                100_000 + i,
                0,
                Ask {
                    limit: Some(10_000),
                    value: None,
                },
            );
            tokens.push(granted(&answers)[0].1);
        }
        for &t in &tokens[1..] {
            h.release(1, C1, "big", t);
        }
        h.table.check_invariants();
        let view = h.table.key_view(&key("big")).expect("held");
        assert_eq!(view.holders().count(), 1);
        let idx = h
            .table
            .index
            .get(&h.table.keys, &key("big"))
            .expect("indexed");
        let sem = h.table.sem(idx).expect("a semaphore");
        assert!(
            sem.more.capacity() <= 8,
            "room for {} grants kept",
            sem.more.capacity()
        );
        assert!(sem.taken.len() <= 1, "{} slot words kept", sem.taken.len());
    }

    #[test]
    fn a_snapshot_with_two_grants_in_one_slot_or_two_limits_for_a_key_is_refused() {
        for (entries, why) in [
            (
                vec![
                    sem_grant("s", 16, 10, 2, 0, None),
                    sem_grant("s", 32, 10, 2, 0, None),
                ],
                "two grants in one slot in a snapshot",
            ),
            (
                vec![
                    sem_grant("s", 16, 10, 2, 0, None),
                    sem_grant("s", 16, 10, 2, 0, None),
                ],
                "two grants in one slot in a snapshot",
            ),
            (
                vec![
                    sem_grant("s", 16, 10, 2, 0, None),
                    sem_grant("s", 32, 10, 3, 1, None),
                ],
                "two limits for one key in a snapshot",
            ),
            (
                vec![
                    sem_grant("s", 16, 10, 1, 0, None),
                    sem_grant("s", 32, 10, 1, 0, None),
                ],
                "more holders than the key's limit in a snapshot",
            ),
            (
                vec![
                    sem_grant("s", 16, 10, 2, 0, None),
                    Delta::free(key("s"), 16),
                ],
                "a free inside a snapshot",
            ),
        ] {
            let mut standby = Harness::new();
            let got = standby.table.load_snapshot(0, entries);
            standby.table.check_invariants();
            assert_eq!(got, Err((1, why)));
            assert_eq!(
                standby.holders("s"),
                [(16, 0, None)],
                "{why}: the first stays"
            );
        }
    }

    #[test]
    fn a_standby_fed_the_batches_holds_every_semaphores_holders_at_every_take() {
        // Random traffic on keys of limits 1 to 3 with and without values,
        // a limit sometimes changed (refused while held, taken once free):
        // after every take the standby holds the active's holders exactly
        // (tokens, slots, values, expiries), and so does a table loaded
        // from a snapshot.
        for seed in 1..=40u64 {
            let mut rng = TestRng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mut active = Harness::replicating();
            let mut standby = LockTable::new(0, TableLimits::default(), TokenSource::new(1, 1));
            let keys = ["a", "b", "c", "d"];
            let conns = [C1, C2, C3];
            let mut held: Vec<(usize, u64)> = Vec::new();
            for now in 0..1_500u64 {
                for _ in 0..rng.below(4) {
                    let k = rng.below(keys.len() as u64) as usize;
                    let conn = conns[rng.below(3) as usize];
                    let mine: Vec<usize> = (0..held.len()).filter(|&i| held[i].0 == k).collect();
                    let pick = (!mine.is_empty())
                        .then(|| held[mine[rng.below(mine.len() as u64) as usize]].1);
                    let answers = match (rng.below(5), pick) {
                        (0..=2, _) => {
                            let limit = if rng.below(20) == 0 {
                                1 + rng.below(3)
                            } else {
                                1 + k as u64 % 3
                            };
                            let ask = Ask {
                                limit: Some(limit as u32),
                                value: (rng.below(2) == 0)
                                    .then(|| value(&format!("v{}", rng.below(9)))),
                            };
                            let lease = 1 + rng.below(40);
                            active.acquire_with(now, conn, keys[k], lease, rng.below(30), ask)
                        }
                        (3, Some(token)) => active.release(now, conn, keys[k], token),
                        (_, Some(token)) => {
                            active.keep(now, conn, keys[k], token, 1 + rng.below(40))
                        }
                        _ => Vec::new(),
                    };
                    for (_, answer) in answers.into_iter().chain(Vec::new()) {
                        if let Answer::Granted {
                            token, key: got, ..
                        } = answer
                        {
                            let k = keys.iter().position(|k| key(k) == got).expect("a test key");
                            held.push((k, token));
                        }
                    }
                }
                for (_, answer) in active.tick(now) {
                    if let Answer::Granted {
                        token, key: got, ..
                    } = answer
                    {
                        let k = keys.iter().position(|k| key(k) == got).expect("a test key");
                        held.push((k, token));
                    }
                }
                held.retain(|&(k, token)| active.holders(keys[k]).iter().any(|h| h.0 == token));
                if rng.below(3) == 0 {
                    let hold_young = if seed % 2 == 0 { 0 } else { rng.below(4) };
                    for delta in active.table.take_deltas(now, hold_young) {
                        standby
                            .apply_delta(now, delta)
                            .expect("the active's own deltas apply");
                    }
                    standby.check_invariants();
                    let on_active = table_state(&active.table);
                    let on_standby = table_state(&standby);
                    if hold_young == 0 {
                        assert_eq!(on_standby, on_active, "seed {seed} at {now} ms");
                    } else {
                        // A young key may not have gone yet: the standby
                        // holds nothing of it then, never a wrong state.
                        for entry in &on_standby {
                            assert!(
                                on_active.contains(entry),
                                "seed {seed} at {now} ms: {entry:?}"
                            );
                        }
                    }
                }
                if rng.below(50) == 0 {
                    let mut fresh =
                        LockTable::new(0, TableLimits::default(), TokenSource::new(2, 1));
                    fresh
                        .load_snapshot(now, active.table.snapshot(now))
                        .expect("a snapshot loads");
                    fresh.check_invariants();
                    assert_eq!(
                        table_state(&fresh),
                        table_state(&active.table),
                        "seed {seed} at {now} ms"
                    );
                }
            }
        }
    }

    #[test]
    fn a_semaphores_grant_and_release_within_a_batch_of_a_new_key_costs_nothing() {
        let mut h = Harness::replicating();
        let (a, _) = h.grant_slot(0, C1, "new", 3);
        let (b, _) = h.grant_slot(0, C2, "new", 3);
        h.release(1, C1, "new", a);
        h.release(1, C2, "new", b);
        assert_eq!(h.table.take_deltas(2, 0), []);
        // A key the standbys hold: each grant that ended is freed by slot.
        let (a, _) = h.grant_slot(3, C1, "k", 3);
        let (b, _) = h.grant_slot(3, C1, "k", 3);
        assert_eq!(h.table.take_deltas(3, 0).len(), 2);
        h.release(4, C1, "k", b);
        h.release(4, C1, "k", a);
        assert_eq!(
            h.table.take_deltas(5, 0),
            [
                Delta::Free {
                    key: key("k"),
                    token: b,
                    slot: 1
                },
                Delta::Free {
                    key: key("k"),
                    token: a,
                    slot: 0
                },
            ]
        );
    }

    #[test]
    fn a_promotion_grace_placeholder_of_a_semaphore_lets_every_slot_go_when_it_ends() {
        let mut h = Harness::new();
        h.table.set_grace_until(1000);
        for conn in [C1, C2, C3] {
            assert!(h.acquire_with(10, conn, "s", 500, 0, ask(2)).is_empty());
        }
        let answers = h.tick(1000);
        let slots: Vec<(ConnId, Option<u32>)> = answers
            .iter()
            .map(|(c, a)| match a {
                Answer::Granted { slot, .. } => (*c, *slot),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            slots,
            [(C1, Some(0)), (C2, Some(1))],
            "both slots, in line order"
        );
        assert_eq!(h.table.stats().waiting, 1);
    }

    #[test]
    fn every_change_of_a_keys_holders_is_a_notification_point() {
        let mut h = Harness::new();
        let changes = |h: &Harness| h.table.stats().holder_changes;
        let (t, _) = h.grant_slot(0, C1, "s", 2);
        assert_eq!(changes(&h), 1, "a grant");
        h.acquire_with(0, C1, "s", 100, 0, ask(2));
        assert_eq!(changes(&h), 2, "a second grant");
        h.acquire_with(0, C2, "s", 100, 0, ask(2));
        assert_eq!(changes(&h), 2, "a waiter changes no holder");
        h.release(1, C1, "s", t);
        assert_eq!(changes(&h), 3, "a handover");
        h.keep(2, C1, "s", 12345, 10);
        h.query(2, C1, "s");
        assert_eq!(changes(&h), 3, "a refused keep and a query change nothing");
        h.tick(101);
        assert_eq!(changes(&h), 5, "two expiries");
    }

    /// Acquires, releases (right and wrong tokens), keeps, expiries, wait
    /// timeouts, limit mismatches and disconnects on a few keys of limits
    /// 1 to 4, with every invariant checked after every step (the
    /// harness), and what the answers say checked against the table.
    #[test]
    fn random_semaphore_traffic_keeps_every_invariant() {
        let base = std::env::var("BATON_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::UNIX_EPOCH
                    .elapsed()
                    .map_or(1, |d| d.as_nanos() as u64)
            });
        println!("random_semaphore_traffic_keeps_every_invariant: BATON_TEST_SEED={base}");
        for round in 0..20u64 {
            let seed = base.wrapping_add(round);
            let mut rng = TestRng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mut h = Harness::with_limits(TableLimits {
                max_waiting_per_conn: 6,
                max_keys: 9,
            });
            let keys = ["a", "b", "c"];
            let limits: Vec<u32> = keys.iter().map(|_| 1 + rng.below(4) as u32).collect();
            let conns = [C1, C2, C3, ConnId(4)];
            let mut issued: Vec<(usize, u64)> = Vec::new();
            let mut last_token = 0;
            let mut grants = 0;
            let mut now = 0;
            for _ in 0..3000 {
                now += rng.below(8);
                let k = rng.below(keys.len() as u64) as usize;
                let conn = conns[rng.below(conns.len() as u64) as usize];
                let answers = match rng.below(10) {
                    0..=3 => {
                        let limit = if rng.below(12) == 0 {
                            1 + rng.below(4) as u32
                        } else {
                            limits[k]
                        };
                        let ask = Ask {
                            limit: (limit > 1 || rng.below(2) == 0).then_some(limit),
                            value: (rng.below(3) == 0).then(|| value("v")),
                        };
                        h.acquire_with(now, conn, keys[k], 1 + rng.below(60), rng.below(40), ask)
                    }
                    4 | 5 => {
                        let token = match issued.iter().rfind(|g| g.0 == k) {
                            Some(g) if rng.below(5) > 0 => g.1,
                            _ => 1 + rng.below(last_token.max(1)),
                        };
                        h.release(now, conn, keys[k], token)
                    }
                    6 => {
                        let token = issued.get(rng.below(issued.len().max(1) as u64) as usize);
                        let token = token.map_or(7, |g| g.1);
                        h.keep(now, conn, keys[k], token, 1 + rng.below(60))
                    }
                    7 => h.query(now, conn, keys[k]),
                    8 => h.step(|t, _| t.handle_disconnect(conn)),
                    _ => h.tick(now),
                };
                for (_, answer) in &answers {
                    if let Answer::Granted {
                        token,
                        key: got,
                        slot,
                    } = answer
                    {
                        grants += 1;
                        assert!(*token > last_token, "seed {seed}: tokens increase");
                        last_token = *token;
                        let k = keys
                            .iter()
                            .position(|k| key(k) == *got)
                            .expect("a test key");
                        let view = h.table.key_view(got).expect("a granted key is held");
                        let mine = view
                            .holders()
                            .find(|h| h.token == *token)
                            .expect("seed {seed}: the grant holds the key");
                        assert!(mine.slot < view.limit(), "seed {seed}");
                        if let Some(slot) = slot {
                            assert_eq!(*slot, mine.slot, "seed {seed}: the slot answered");
                        }
                        issued.push((k, *token));
                    }
                }
                if issued.len() > 64 {
                    issued.drain(..32);
                }
            }
            assert!(
                grants > 200,
                "seed {seed}: the run granted enough to mean something"
            );
        }
    }

    // The contention view (`core/contention.rs`): the contended set and
    // each key's oldest waiter, kept as the table goes.

    /// The view of every contended key by `by` (at most 1000), as
    /// (key, waiting, oldest wait) at `now`.
    fn contended_by(h: &Harness, now: u64, by: By) -> Vec<(String, u32, u64)> {
        let ask = KeysAsk {
            top_waiting: if by == By::Waiting { 1000 } else { 0 },
            top_age: if by == By::Age { 1000 } else { 0 },
            lookups: vec![],
        };
        let view = h.table.contention_view(now, 0, &ask);
        assert_eq!(view.contended, h.table.contended());
        let list = if by == By::Waiting {
            view.by_waiting
        } else {
            view.by_age
        };
        list.into_iter()
            .map(|e| (e.key.to_string(), e.waiting, e.oldest_wait_ms))
            .collect()
    }

    fn owned(rows: &[(&str, u32, u64)]) -> Vec<(String, u32, u64)> {
        rows.iter()
            .map(|(k, n, w)| (k.to_string(), *n, *w))
            .collect()
    }

    #[test]
    fn a_key_is_contended_from_its_first_waiter_until_its_line_empties() {
        let mut h = Harness::new();
        let t = h.grant(0, C1, "a", 1000);
        h.grant(0, C1, "b", 1000);
        assert_eq!(h.table.contended(), 0, "held is not contended");
        h.acquire(10, C2, "a", 100, 0);
        h.acquire(30, C3, "a", 100, 0);
        assert_eq!(contended_by(&h, 50, By::Waiting), owned(&[("a", 2, 40)]));
        // The first waiter is granted: the second is the oldest now.
        h.release(60, C1, "a", t);
        assert_eq!(contended_by(&h, 70, By::Waiting), owned(&[("a", 1, 40)]));
        // Its connection closes: the line is empty, the key is held only.
        h.step(|t, _| t.handle_disconnect(C3));
        assert_eq!(h.table.contended(), 0);
        assert!(contended_by(&h, 80, By::Age).is_empty());
    }

    #[test]
    fn the_oldest_waiter_follows_timeouts_expiries_and_disconnects() {
        let mut h = Harness::new();
        h.grant(0, C1, "k", 1000);
        h.acquire(100, C2, "k", 500, 50); // times out at 150
        h.acquire(110, C3, "k", 500, 0);
        h.acquire(120, C2, "k", 500, 0);
        assert_eq!(contended_by(&h, 140, By::Age), owned(&[("k", 3, 40)]));
        h.tick(151);
        assert_eq!(contended_by(&h, 160, By::Age), owned(&[("k", 2, 50)]));
        // The lease runs out at 1000: C3 is handed the key, C2 waits on.
        let handed = h.tick(1001);
        assert_eq!(
            granted(&handed).iter().map(|g| g.0).collect::<Vec<_>>(),
            [C3]
        );
        assert_eq!(contended_by(&h, 1010, By::Age), owned(&[("k", 1, 890)]));
        h.step(|t, _| t.handle_disconnect(C2));
        assert!(contended_by(&h, 1020, By::Age).is_empty());
        assert_eq!(h.table.contended(), 0);
    }

    #[test]
    fn the_view_orders_keys_and_shows_holders_values_and_times() {
        let mut h = Harness::new();
        // Tokens carry the wall clock: a round at unix 1_000_000 ms.
        h.table
            .observe_token(crate::server::core::tokens::clock_floor(1_000_000));
        h.grant(0, C1, "one", 5000);
        let (t0, _) = h.grant_slot(0, C1, "sem", 2);
        h.acquire_with(
            0,
            C2,
            "sem",
            300,
            0,
            Ask {
                limit: Some(2),
                value: Some(value("web-2")),
            },
        );
        h.acquire(5, C2, "one", 100, 0);
        h.acquire_with(10, C3, "sem", 100, 0, ask(2));
        h.acquire(20, C3, "one", 100, 0);
        h.acquire(30, C1, "one", 100, 0);
        assert_eq!(
            contended_by(&h, 100, By::Waiting),
            owned(&[("one", 3, 95), ("sem", 1, 90)])
        );
        // "one"'s oldest waiter came at 5, "sem"'s at 10.
        assert_eq!(
            contended_by(&h, 100, By::Age),
            owned(&[("one", 3, 95), ("sem", 1, 90)])
        );
        let ask = KeysAsk {
            top_waiting: 1,
            top_age: 0,
            lookups: vec![key("sem"), key("nobody")],
        };
        let view = h.table.contention_view(100, 1_000_250, &ask);
        assert_eq!(view.contended, 2);
        assert_eq!(view.by_waiting.len(), 1);
        assert!(view.by_age.is_empty());
        let (k, sem) = &view.lookups[0];
        assert_eq!(*k, key("sem"));
        let sem = sem.as_ref().expect("held");
        assert_eq!((sem.limit, sem.waiting, sem.oldest_wait_ms), (2, 1, 90));
        let holders: Vec<_> = sem
            .holders
            .iter()
            .map(|h| (h.slot, h.value.clone(), h.held_ms, h.ms_left))
            .collect();
        assert_eq!(
            holders,
            [(0, None, 250, 900), (1, Some(value("web-2")), 250, 200)]
        );
        assert_eq!(sem.holders[0].token, t0, "longest held first");
        assert_eq!(view.lookups[1], (key("nobody"), None));
    }

    #[test]
    fn a_listed_key_shows_its_longest_held_holders_and_counts_the_rest() {
        let mut h = Harness::new();
        let limit = (MAX_LISTED_HOLDERS + 5) as u32;
        let mut tokens = Vec::new();
        for _ in 0..limit {
            tokens.push(h.grant_slot(0, C1, "many", limit).0);
        }
        h.acquire_with(1, C2, "many", 100, 0, ask(limit));
        let ask = KeysAsk {
            top_waiting: 5,
            top_age: 5,
            lookups: vec![key("many")],
        };
        let view = h.table.contention_view(2, 0, &ask);
        let listed = &view.by_age[0];
        assert_eq!(listed.holders.len(), MAX_LISTED_HOLDERS);
        assert_eq!(listed.more_holders, 5);
        assert_eq!(listed.holders[0].token, tokens[0]);
        let looked_up = view.lookups[0].1.as_ref().expect("held");
        assert_eq!(
            (looked_up.holders.len(), looked_up.more_holders),
            (limit as usize, 0)
        );
    }

    #[test]
    fn a_standby_views_its_replicated_holders_and_redirected_waiters_leave_the_set() {
        let mut h = Harness::new();
        h.grant(0, C1, "a", 1000);
        h.acquire(1, C2, "a", 100, 0);
        h.acquire(1, C3, "b", 100, 0); // granted at once
        h.acquire(2, C1, "b", 100, 0);
        assert_eq!(h.table.contended(), 2);
        h.step(|t, o| t.redirect_waiters(Some("elsewhere:1"), o));
        assert_eq!(h.table.contended(), 0);
        // A standby's table: a snapshot, then deltas; held, nobody waits.
        let mut standby = Harness::new();
        let grant = Delta::grant(key("r"), 77 << 20, 500);
        standby.step(|t, _| t.load_snapshot(0, vec![grant]).expect("loads"));
        let view = standby.table.contention_view(
            10,
            90,
            &KeysAsk {
                top_waiting: 20,
                top_age: 20,
                lookups: vec![key("r")],
            },
        );
        assert_eq!(view.contended, 0);
        let entry = view.lookups[0].1.as_ref().expect("replicated");
        assert_eq!((entry.waiting, entry.oldest_wait_ms), (0, 0));
        assert_eq!(entry.holders.len(), 1);
        assert_eq!(
            (entry.holders[0].held_ms, entry.holders[0].ms_left),
            (13, 490)
        );
    }
}
