//! Where a key's grants live: the first in its `KeyState`, the others of
//! a semaphore in its `Sem` (limit, taken slots, values), and the
//! operations that add, find, move and remove a grant and its lease timer.

use super::*;

/// A grant of a key other than its first (which lives in [`KeyState`]).
#[derive(Debug)]
pub(super) struct Grant {
    pub(super) token: u64,
    pub(super) expiry_ms: u64,
    pub(super) lease_timer: TimerId,
    pub(super) slot: u32,
    pub(super) value: Option<Value>,
}

/// What a key that is more than a plain mutex without a value has.
#[derive(Debug)]
pub(super) struct Sem {
    pub(super) limit: u32,
    /// The slot and value of the key's first grant.
    pub(super) first_slot: u32,
    pub(super) first_value: Option<Value>,
    /// The key's other grants, in no order.
    pub(super) more: Vec<Grant>,
    /// The slots taken, a bit each, as far as the highest word with a slot
    /// taken (empty for limit 1: its slot is 0), so that a key of a large
    /// limit with few holders costs what its holders need, not its limit.
    pub(super) taken: Vec<u64>,
}

impl Sem {
    /// A key's Sem when it needs one (a limit above 1, or a value), its
    /// first grant in `slot` (below `limit`) carrying `value`. Inlined, so
    /// that a new plain key (the hot path) pays one test for it: left to
    /// itself, the compiler calls it (about 23 instructions a pair;
    /// docs/performance.md, "Asserts in release builds").
    #[inline]
    pub(super) fn new(limit: u32, slot: u32, value: Option<Value>) -> Option<Sem> {
        if limit <= 1 && value.is_none() {
            // A plain mutex: no Sem, and no slot to keep (its one grant's
            // is 0).
            return None;
        }
        // Holders <= limit: a grant's slot is below its key's limit.
        // Checked in every build (docs/performance.md, "Asserts in release
        // builds"): O(1), and past the plain mutex's return, so that the
        // hot path (a new plain key) pays nothing; replica.rs refuses a
        // peer's slot at or above the limit before it gets here.
        assert!(slot < limit, "a slot is below its key's limit");
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

    pub(super) fn take_slot(&mut self, slot: u32) {
        if self.limit <= 1 {
            return;
        }
        let word = slot as usize / 64;
        if word >= self.taken.len() {
            self.taken.resize(word + 1, 0);
        }
        // A slot is held once: checked in every build (O(1); a standby's
        // apply takes only a slot it found free).
        assert_eq!(
            self.taken[word] & (1 << (slot % 64)),
            0,
            "a slot is taken once"
        );
        self.taken[word] |= 1 << (slot % 64);
    }

    pub(super) fn free_slot(&mut self, slot: u32) {
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

    /// Whether `slot` is taken (for the invariants' check).
    #[cfg(any(test, feature = "test-hooks"))]
    pub(super) fn is_taken(&self, slot: u32) -> bool {
        self.taken
            .get(slot as usize / 64)
            .is_some_and(|word| word & (1 << (slot % 64)) != 0)
    }

    /// The lowest slot no grant holds (there must be one, below the limit).
    pub(super) fn lowest_free(&self) -> u32 {
        let slot = match self.taken.iter().position(|w| *w != u64::MAX) {
            Some(i) => i as u32 * 64 + self.taken[i].trailing_ones(),
            None => self.taken.len() as u32 * 64,
        };
        // Holders <= limit: a new holder finds a free slot below the
        // limit. Checked in every build (O(1)).
        assert!(slot < self.limit, "a free slot below the key's limit");
        slot
    }

    /// A grant of `more` left: give back room a key's many past holders
    /// took, so that `--max-keys` bounds memory by the grants held now.
    pub(super) fn shrink_more(&mut self) {
        if self.more.capacity() > 8 && self.more.capacity() > 4 * self.more.len() {
            self.more.shrink_to(2 * self.more.len());
        }
    }
}

/// Where a grant of a key is: its first, or one of its Sem's others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum At {
    First,
    More(usize),
}

impl LockTable {
    /// Key `idx`'s Sem, if it has one.
    pub(super) fn sem(&self, idx: u32) -> Option<&Sem> {
        let sem = self.keys[idx as usize].sem;
        (sem != NIL).then(|| &self.sems[sem as usize])
    }

    /// Key `idx`'s limit (1 for a plain mutex).
    pub(super) fn limit(&self, idx: u32) -> u32 {
        self.sem(idx).map_or(1, |sem| sem.limit)
    }

    /// Key `idx`'s holders (a placeholder counts).
    pub(super) fn holder_count(&self, idx: u32) -> usize {
        1 + self.sem(idx).map_or(0, |sem| sem.more.len())
    }

    /// The grant of key `idx` that `token` names.
    pub(super) fn find_grant(&self, idx: u32, token: u64) -> Option<At> {
        if self.keys[idx as usize].token == token {
            return Some(At::First);
        }
        let sem = self.sem(idx)?;
        sem.more.iter().position(|g| g.token == token).map(At::More)
    }

    pub(super) fn grant_timer(&self, idx: u32, at: At) -> TimerId {
        match at {
            At::First => self.keys[idx as usize].lease_timer,
            At::More(i) => self.sem(idx).expect("a key's other grant").more[i].lease_timer,
        }
    }

    pub(super) fn grant_token_expiry(&self, idx: u32, at: At) -> (u64, u64) {
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
    pub(super) fn find_timer(&self, idx: u32, id: TimerId) -> Option<At> {
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
    pub(super) fn first_lapsed(&self, idx: u32, now_ms: u64) -> Option<At> {
        if self.keys[idx as usize].expiry_ms <= now_ms {
            return Some(At::First);
        }
        let sem = self.sem(idx)?;
        sem.more
            .iter()
            .position(|g| g.expiry_ms <= now_ms)
            .map(At::More)
    }

    /// A new key in the table (whose hash is `hash`: from the lookup that
    /// missed it), of `limit`, held by `token` (in `slot`, carrying
    /// `value`) until `expiry_ms`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn insert_key(
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
    pub(super) fn drop_key(&mut self, idx: u32) -> KeyState {
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
    pub(super) fn add_grant(
        &mut self,
        now_ms: u64,
        idx: u32,
        lease_ms: u64,
        value: Option<Value>,
    ) -> (u64, u32) {
        let token = self.tokens.issue();
        self.recent.note(token, idx);
        let expiry_ms = now_ms.saturating_add(lease_ms);
        let sem = &self.sems[self.keys[idx as usize].sem as usize];
        // Holders <= limit, checked in every build (O(1)).
        assert!(
            sem.more.len() + 1 < sem.limit as usize,
            "a new holder only while the key has a free slot"
        );
        let slot = sem.lowest_free();
        self.put_grant(idx, slot, token, expiry_ms, value);
        self.note_held(idx, None);
        self.holders_changed(idx);
        (token, slot)
    }

    /// The grant of key `idx` at `at` is done (its timer gone) and nobody
    /// waits: it leaves, and the key with it if it was the last.
    pub(super) fn remove_grant(&mut self, idx: u32, at: At) {
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

    #[allow(clippy::too_many_arguments)]
    pub(super) fn grant_new(
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

    /// The slot of key `idx`'s grant at `at`.
    pub(super) fn grant_slot(&self, idx: u32, at: At) -> u32 {
        match (at, self.sem(idx)) {
            (_, None) => 0,
            (At::First, Some(sem)) => sem.first_slot,
            (At::More(i), Some(sem)) => sem.more[i].slot,
        }
    }

    /// Key `idx`'s grant in `slot`, if any.
    pub(super) fn grant_in_slot(&self, idx: u32, slot: u32) -> Option<At> {
        match self.sem(idx) {
            None => (slot == 0).then_some(At::First),
            Some(sem) if sem.first_slot == slot => Some(At::First),
            Some(sem) => sem.more.iter().position(|g| g.slot == slot).map(At::More),
        }
    }

    /// A standby applies its active's grant: key `idx`'s grant at `at`
    /// becomes `token` until `expiry_ms` (its lease timer re-armed),
    /// carrying `value`.
    pub(super) fn set_grant(
        &mut self,
        idx: u32,
        at: At,
        token: u64,
        expiry_ms: u64,
        value: Option<Value>,
    ) {
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

    /// A grant in a free `slot` of key `idx` (of a limit above 1, so it
    /// has a Sem): a new holder's, or a standby applying its active's.
    #[inline]
    pub(super) fn put_grant(
        &mut self,
        idx: u32,
        slot: u32,
        token: u64,
        expiry_ms: u64,
        value: Option<Value>,
    ) {
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
}
