//! The hashed timing wheel used by the lock-owner thread.
//!
//! It owns every pending timer of the lock owner: lease expiries and wait
//! deadlines. Only the lock-owner thread runs it; it is a plain data
//! structure with no interior mutability and no sharing.
//!
//! It never does I/O and never reads a clock of its own: time is always passed
//! in as milliseconds on the caller's monotonic clock (any origin). Once the
//! arena and the fired-batch buffer have grown to the working-set size,
//! `insert`, `cancel` and `poll` do not allocate (only the caller's `out`
//! vector may grow).
//!
//! Layout: one tick is one millisecond; the wheel has [`SLOTS`] slots and a
//! deadline hashes to slot `deadline_ms % SLOTS`. Each slot is an intrusive
//! doubly-linked list of entries stored in an arena `Vec` with a free list, so
//! insert and cancel are O(1). A deadline more than one rotation away stays in
//! its slot and is skipped (the entry keeps its absolute deadline) until its
//! round comes. An occupancy bitmap (one bit per slot) lets
//! [`TimingWheel::next_wake`] find the next occupied slot in at most
//! [`WORDS`] word reads.
//!
//! Invariants (checked by `check_invariants()` in the tests, cheaper parts
//! by `debug_assert!` inline):
//! - `len` equals the number of entries linked into slot lists, and every
//!   arena entry is either linked (holds a value) or on the free list.
//! - The bitmap bit of a slot is set iff that slot's list is non-empty.
//! - An entry with `deadline_ms > current_ms` sits in `slot_of(deadline_ms)`;
//!   an overdue entry (`deadline_ms <= current_ms`, inserted since the last
//!   poll) sits in `slot_of(current_ms)`, and `overdue_count` counts them.
//! - After `poll(now_ms)`, no pending entry has `deadline_ms <= now_ms`.

/// Number of slots (ticks per rotation).
pub const SLOTS: usize = 1 << 16;
/// Number of `u64` words in the occupancy bitmap.
pub const WORDS: usize = SLOTS / 64;
const SLOT_MASK: u64 = SLOTS as u64 - 1;
/// "No entry" marker for list links and the free list.
const NIL: u32 = u32::MAX;

/// Handle of a scheduled timer; stale handles (already fired or cancelled) are detected by a generation counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerId {
    index: u32,
    generation: u32,
}

/// One arena cell: a pending timer (value is `Some`) or a free cell.
struct Entry<T> {
    value: Option<T>,
    deadline_ms: u64,
    /// Insertion sequence, orders timers with equal deadlines.
    seq: u64,
    /// Bumped every time the cell is freed, so old `TimerId`s go stale.
    generation: u32,
    slot: u32,
    prev: u32,
    /// Next entry in the slot list, or next free cell when free.
    next: u32,
}

/// A timer unlinked by `poll`, waiting to be sorted and handed out.
#[derive(Clone, Copy)]
struct Due {
    deadline_ms: u64,
    seq: u64,
    index: u32,
}

pub struct TimingWheel<T> {
    entries: Vec<Entry<T>>,
    free_head: u32,
    /// Head entry of each slot's list.
    heads: Box<[u32]>,
    /// Bit `s` set iff slot `s` is non-empty.
    occupied: Box<[u64]>,
    /// The wheel's time: every deadline <= this that existed at the last poll has fired.
    current_ms: u64,
    len: usize,
    next_seq: u64,
    /// Pending entries inserted with a deadline <= `current_ms` (they sit in the current slot).
    overdue_count: usize,
    /// At or below the smallest overdue deadline; `u64::MAX` when `overdue_count == 0`.
    overdue_min_ms: u64,
    /// Reused buffer for one poll's fired batch.
    due: Vec<Due>,
}

fn slot_of(time_ms: u64) -> usize {
    (time_ms & SLOT_MASK) as usize
}

impl<T> TimingWheel<T> {
    /// `now_ms` is the current time in milliseconds on the caller's monotonic clock (any origin).
    pub fn new(now_ms: u64) -> Self {
        TimingWheel {
            entries: Vec::new(),
            free_head: NIL,
            heads: vec![NIL; SLOTS].into_boxed_slice(),
            occupied: vec![0; WORDS].into_boxed_slice(),
            current_ms: now_ms,
            len: 0,
            next_seq: 0,
            overdue_count: 0,
            overdue_min_ms: u64::MAX,
            due: Vec::new(),
        }
    }

    /// Schedule `value` to fire at `deadline_ms` (a deadline <= the wheel's current time fires at the next poll).
    pub fn insert(&mut self, deadline_ms: u64, value: T) -> TimerId {
        let slot = if deadline_ms <= self.current_ms {
            self.overdue_count += 1;
            self.overdue_min_ms = self.overdue_min_ms.min(deadline_ms);
            slot_of(self.current_ms)
        } else {
            slot_of(deadline_ms)
        };
        let index = self.allocate(deadline_ms, value);
        self.link(slot, index);
        self.len += 1;
        TimerId {
            index,
            generation: self.entries[index as usize].generation,
        }
    }

    /// O(1). Returns the value if the timer was still pending; None for a stale id.
    pub fn cancel(&mut self, id: TimerId) -> Option<T> {
        let index = self.live_index(id)?;
        if self.entries[index as usize].deadline_ms <= self.current_ms {
            self.forget_one_overdue();
        }
        self.unlink(index);
        Some(self.release(index).1)
    }

    /// The deadline of a pending timer, None if stale.
    pub fn deadline(&self, id: TimerId) -> Option<u64> {
        let index = self.live_index(id)?;
        Some(self.entries[index as usize].deadline_ms)
    }

    /// Advance to `now_ms` and push every timer whose deadline <= now_ms into `out`, in deadline order
    /// (ties in insertion order). Time never goes backwards: a now_ms below the current time is treated as the current time.
    pub fn poll(&mut self, now_ms: u64, out: &mut Vec<(TimerId, T)>) {
        let now_ms = now_ms.max(self.current_ms);
        if self.len > 0 {
            self.collect_due(now_ms);
        }
        // Every overdue entry sat in slot_of(current_ms), which was visited.
        debug_assert!(self.due.len() >= self.overdue_count);
        self.current_ms = now_ms;
        self.overdue_count = 0;
        self.overdue_min_ms = u64::MAX;
        self.emit_due(out);
    }

    /// A time at or before the earliest pending deadline at which the caller should call poll next
    /// (it may be earlier than the true earliest deadline — a spurious wake-up is fine — but never later);
    /// None when no timer is pending. Must be cheap: do not scan every entry.
    pub fn next_wake(&self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        if self.overdue_count > 0 {
            return Some(self.overdue_min_ms);
        }
        // No overdue entry: the current slot only holds later rounds, so
        // start at the next tick and reach the current slot last.
        let first_ms = self.current_ms.saturating_add(1);
        let distance = self
            .next_occupied_distance(slot_of(first_ms))
            .expect("a pending timer implies an occupied slot");
        Some(first_ms.saturating_add(distance))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Index of the arena cell `id` refers to, if the timer is still pending.
    fn live_index(&self, id: TimerId) -> Option<u32> {
        let entry = self.entries.get(id.index as usize)?;
        (entry.generation == id.generation && entry.value.is_some()).then_some(id.index)
    }

    /// Take a free cell (or grow the arena) and fill it; the cell is not linked yet.
    fn allocate(&mut self, deadline_ms: u64, value: T) -> u32 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.free_head != NIL {
            let index = self.free_head;
            let entry = &mut self.entries[index as usize];
            debug_assert!(entry.value.is_none());
            self.free_head = entry.next;
            entry.value = Some(value);
            entry.deadline_ms = deadline_ms;
            entry.seq = seq;
            return index;
        }
        let index = u32::try_from(self.entries.len())
            .ok()
            .filter(|&index| index != NIL)
            .expect("timer arena exceeds u32 indices");
        self.entries.push(Entry {
            value: Some(value),
            deadline_ms,
            seq,
            generation: 0,
            slot: 0,
            prev: NIL,
            next: NIL,
        });
        index
    }

    /// Empty a cell, bump its generation and put it on the free list.
    fn release(&mut self, index: u32) -> (TimerId, T) {
        debug_assert!(self.len > 0);
        let entry = &mut self.entries[index as usize];
        let id = TimerId {
            index,
            generation: entry.generation,
        };
        let value = entry.value.take().expect("released a free arena cell");
        entry.generation = entry.generation.wrapping_add(1);
        entry.next = self.free_head;
        self.free_head = index;
        self.len -= 1;
        (id, value)
    }

    /// Push `index` at the front of `slot`'s list.
    fn link(&mut self, slot: usize, index: u32) {
        let head = self.heads[slot];
        let entry = &mut self.entries[index as usize];
        debug_assert!(entry.value.is_some());
        entry.slot = slot as u32;
        entry.prev = NIL;
        entry.next = head;
        if head == NIL {
            self.set_occupied(slot, true);
        } else {
            self.entries[head as usize].prev = index;
        }
        self.heads[slot] = index;
        debug_assert!(self.is_marked(slot));
    }

    /// Remove `index` from its slot's list.
    fn unlink(&mut self, index: u32) {
        let entry = &mut self.entries[index as usize];
        let (slot, prev, next) = (entry.slot as usize, entry.prev, entry.next);
        entry.prev = NIL;
        entry.next = NIL;
        if prev == NIL {
            debug_assert_eq!(self.heads[slot], index);
            self.heads[slot] = next;
        } else {
            self.entries[prev as usize].next = next;
        }
        if next != NIL {
            self.entries[next as usize].prev = prev;
        }
        if self.heads[slot] == NIL {
            self.set_occupied(slot, false);
        }
        debug_assert_eq!(self.is_marked(slot), self.heads[slot] != NIL);
    }

    fn forget_one_overdue(&mut self) {
        debug_assert!(self.overdue_count > 0);
        self.overdue_count -= 1;
        if self.overdue_count == 0 {
            self.overdue_min_ms = u64::MAX;
        }
    }

    fn is_marked(&self, slot: usize) -> bool {
        self.occupied[slot / 64] >> (slot % 64) & 1 == 1
    }

    fn set_occupied(&mut self, slot: usize, occupied: bool) {
        let bit = 1u64 << (slot % 64);
        if occupied {
            self.occupied[slot / 64] |= bit;
        } else {
            self.occupied[slot / 64] &= !bit;
        }
    }

    /// Unlink every entry due at `now_ms` into `self.due`. Visits the slots
    /// of ticks `current_ms..=now_ms` (the current slot again, for overdue
    /// entries), or every slot once when that range covers a rotation.
    fn collect_due(&mut self, now_ms: u64) {
        let ticks = now_ms - self.current_ms;
        if ticks >= SLOT_MASK {
            self.collect_slots(0, SLOTS, now_ms);
        } else {
            self.collect_slots(slot_of(self.current_ms), ticks as usize + 1, now_ms);
        }
    }

    /// Collect from the occupied slots among `slot_count` consecutive slots
    /// from `start_slot` (wrapping), one bitmap word at a time.
    fn collect_slots(&mut self, start_slot: usize, slot_count: usize, now_ms: u64) {
        let mut offset = 0;
        while offset < slot_count {
            let slot = (start_slot + offset) % SLOTS;
            let (word_index, first_bit) = (slot / 64, slot % 64);
            let span = (64 - first_bit).min(slot_count - offset);
            let mask = (u64::MAX >> (64 - span)) << first_bit;
            // Unlinking only clears bits of the slot being visited, so a
            // snapshot of the word stays valid for its other slots.
            let mut bits = self.occupied[word_index] & mask;
            while bits != 0 {
                let occupied_slot = word_index * 64 + bits.trailing_zeros() as usize;
                self.collect_slot(occupied_slot, now_ms);
                bits &= bits - 1;
            }
            offset += span;
        }
    }

    fn collect_slot(&mut self, slot: usize, now_ms: u64) {
        let mut index = self.heads[slot];
        while index != NIL {
            let entry = &self.entries[index as usize];
            let next = entry.next;
            if entry.deadline_ms <= now_ms {
                self.due.push(Due {
                    deadline_ms: entry.deadline_ms,
                    seq: entry.seq,
                    index,
                });
                self.unlink(index);
            }
            index = next;
        }
    }

    /// Sort the collected batch by (deadline, insertion) and hand it out.
    fn emit_due(&mut self, out: &mut Vec<(TimerId, T)>) {
        let mut due = std::mem::take(&mut self.due);
        if due.len() > 1 {
            due.sort_unstable_by_key(|d| (d.deadline_ms, d.seq));
        }
        out.reserve(due.len());
        for d in due.drain(..) {
            out.push(self.release(d.index));
        }
        self.due = due;
    }

    /// Distance from `start_slot` to the first occupied slot at or after it,
    /// wrapping around; reads each bitmap word once (at most [`WORDS`] reads).
    fn next_occupied_distance(&self, start_slot: usize) -> Option<u64> {
        let start_word = start_slot / 64;
        let high_mask = u64::MAX << (start_slot % 64);
        let first = self.occupied[start_word];
        let found = if first & high_mask != 0 {
            Some(start_word * 64 + (first & high_mask).trailing_zeros() as usize)
        } else {
            (1..WORDS)
                .find_map(|step| {
                    let word_index = (start_word + step) % WORDS;
                    let word = self.occupied[word_index];
                    (word != 0).then(|| word_index * 64 + word.trailing_zeros() as usize)
                })
                .or_else(|| {
                    let low = first & !high_mask;
                    (low != 0).then(|| start_word * 64 + low.trailing_zeros() as usize)
                })
        };
        found.map(|slot| (slot.wrapping_sub(start_slot) & SLOT_MASK as usize) as u64)
    }

    /// Check every invariant of the module doc; panics on a violation.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let mut linked = 0;
        let mut overdue = 0;
        const EMPTY_WORD: [u32; 64] = [NIL; 64];
        for (word_index, &word) in self.occupied.iter().enumerate() {
            let heads = &self.heads[word_index * 64..][..64];
            if word == 0 {
                assert!(
                    heads == EMPTY_WORD,
                    "a clear bit in word {word_index} hides a list"
                );
                continue;
            }
            for (bit, &head) in heads.iter().enumerate() {
                let slot = word_index * 64 + bit;
                assert_eq!(
                    word >> bit & 1 == 1,
                    head != NIL,
                    "bitmap bit of slot {slot}"
                );
                linked += self.check_slot(slot, &mut overdue);
            }
        }
        assert_eq!(linked, self.len, "len matches linked entries");
        assert_eq!(overdue, self.overdue_count, "overdue count");
        let mut free = 0;
        let mut index = self.free_head;
        while index != NIL {
            assert!(
                self.entries[index as usize].value.is_none(),
                "free cell holds a value"
            );
            free += 1;
            assert!(free <= self.entries.len(), "free list has a cycle");
            index = self.entries[index as usize].next;
        }
        assert_eq!(
            free + self.len,
            self.entries.len(),
            "every cell linked or free"
        );
    }

    /// Check one slot's list; returns its length and counts overdue entries.
    #[cfg(test)]
    fn check_slot(&self, slot: usize, overdue: &mut usize) -> usize {
        let mut count = 0;
        let mut prev = NIL;
        let mut index = self.heads[slot];
        while index != NIL {
            let entry = &self.entries[index as usize];
            assert!(entry.value.is_some(), "linked cell is free");
            assert_eq!(entry.prev, prev, "back link");
            assert_eq!(entry.slot as usize, slot, "slot field");
            assert!(entry.seq < self.next_seq);
            if entry.deadline_ms <= self.current_ms {
                *overdue += 1;
                assert_eq!(slot, slot_of(self.current_ms), "overdue entry slot");
                assert!(self.overdue_min_ms <= entry.deadline_ms, "overdue min");
            } else {
                assert_eq!(slot, slot_of(entry.deadline_ms), "entry slot");
            }
            count += 1;
            assert!(count <= self.entries.len(), "slot list has a cycle");
            prev = index;
            index = entry.next;
        }
        count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const ROTATION_MS: u64 = SLOTS as u64;

    fn poll_values<T>(wheel: &mut TimingWheel<T>, now_ms: u64) -> Vec<T> {
        let mut out = Vec::new();
        wheel.poll(now_ms, &mut out);
        wheel.check_invariants();
        out.into_iter().map(|(_, value)| value).collect()
    }

    /// xorshift64* — small, seeded, deterministic.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        fn below(&mut self, bound: u64) -> u64 {
            self.next() % bound
        }
    }

    #[test]
    fn fires_exactly_at_its_deadline_and_not_one_ms_before() {
        let mut wheel = TimingWheel::new(1_000);
        wheel.insert(1_250, "lease");
        assert!(poll_values(&mut wheel, 1_249).is_empty());
        assert_eq!(wheel.len(), 1);
        assert_eq!(poll_values(&mut wheel, 1_250), vec!["lease"]);
        assert!(wheel.is_empty());
    }

    #[test]
    fn many_timers_in_one_slot_across_different_rounds_fire_in_the_right_rounds() {
        let start_ms = 5_000_000;
        let d = start_ms + 100;
        let mut wheel = TimingWheel::new(start_ms);
        wheel.insert(d + ROTATION_MS, "round 1");
        wheel.insert(d, "round 0 a");
        wheel.insert(d + 2 * ROTATION_MS, "round 2");
        wheel.insert(d, "round 0 b");
        wheel.check_invariants();
        assert!(wheel.next_wake().unwrap() <= d);
        assert!(poll_values(&mut wheel, d - 1).is_empty());
        assert_eq!(poll_values(&mut wheel, d), vec!["round 0 a", "round 0 b"]);
        assert!(wheel.next_wake().unwrap() <= d + ROTATION_MS);
        assert!(poll_values(&mut wheel, d + ROTATION_MS - 1).is_empty());
        assert_eq!(poll_values(&mut wheel, d + ROTATION_MS), vec!["round 1"]);
        assert!(poll_values(&mut wheel, d + 2 * ROTATION_MS - 1).is_empty());
        assert_eq!(
            poll_values(&mut wheel, d + 2 * ROTATION_MS),
            vec!["round 2"]
        );
        assert_eq!(wheel.next_wake(), None);
    }

    #[test]
    fn cancel_before_fire_returns_the_value_and_it_never_fires() {
        let mut wheel = TimingWheel::new(0);
        let id = wheel.insert(10, 7);
        wheel.insert(10, 8);
        assert_eq!(wheel.deadline(id), Some(10));
        assert_eq!(wheel.cancel(id), Some(7));
        wheel.check_invariants();
        assert_eq!(wheel.deadline(id), None);
        assert_eq!(poll_values(&mut wheel, 100), vec![8]);
        assert_eq!(wheel.cancel(id), None);
    }

    #[test]
    fn cancel_of_a_stale_id_returns_none_and_does_not_disturb_a_new_timer_reusing_the_arena_slot() {
        let mut wheel = TimingWheel::new(0);
        let old = wheel.insert(10, "old");
        assert_eq!(wheel.cancel(old), Some("old"));
        let new = wheel.insert(20, "new");
        assert_eq!(new.index, old.index, "the arena cell is reused");
        assert_ne!(new, old);
        assert_eq!(wheel.cancel(old), None);
        assert_eq!(wheel.deadline(old), None);
        assert_eq!(wheel.deadline(new), Some(20));
        wheel.check_invariants();
        let mut fired = Vec::new();
        wheel.poll(20, &mut fired);
        assert_eq!(fired, vec![(new, "new")]);
        assert_eq!(wheel.cancel(new), None, "a fired id is stale too");
    }

    #[test]
    fn deadline_in_the_past_fires_at_next_poll() {
        let mut wheel = TimingWheel::new(1_000);
        wheel.insert(1_000, "now");
        wheel.insert(400, "past");
        wheel.check_invariants();
        assert!(wheel.next_wake().unwrap() <= 400);
        assert_eq!(poll_values(&mut wheel, 1_000), vec!["past", "now"]);
        assert_eq!(wheel.next_wake(), None);
        // Also with a poll whose clock reads earlier than the wheel's time.
        wheel.insert(3, "early");
        assert_eq!(poll_values(&mut wheel, 10), vec!["early"]);
    }

    #[test]
    fn a_poll_jumping_far_ahead_fires_everything_due_in_deadline_order() {
        let start_ms = 42;
        let mut wheel = TimingWheel::new(start_ms);
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut expected = Vec::new();
        for seq in 0..2_000u64 {
            let deadline_ms = start_ms + 1 + rng.below(10 * ROTATION_MS);
            wheel.insert(deadline_ms, (deadline_ms, seq));
            expected.push((deadline_ms, seq));
        }
        wheel.insert(start_ms + 500, (start_ms + 500, 2_000)); // a tie, inserted last
        expected.push((start_ms + 500, 2_000));
        wheel.insert(start_ms + 20 * ROTATION_MS, (u64::MAX, 0)); // not due
        expected.sort();
        let now_ms = start_ms + 10 * ROTATION_MS; // a ten-minute jump
        assert_eq!(poll_values(&mut wheel, now_ms), expected);
        assert_eq!(wheel.len(), 1);
        assert!(wheel.next_wake().unwrap() <= start_ms + 20 * ROTATION_MS);
    }

    #[test]
    fn next_wake_does_not_point_at_now_for_a_later_round_in_the_current_slot() {
        let mut wheel = TimingWheel::new(100);
        wheel.insert(100 + ROTATION_MS, ());
        assert!(poll_values(&mut wheel, 100).is_empty());
        assert_eq!(wheel.next_wake(), Some(100 + ROTATION_MS));
    }

    #[test]
    fn next_wake_is_none_when_empty() {
        let mut wheel = TimingWheel::new(7);
        assert_eq!(wheel.next_wake(), None);
        let id = wheel.insert(9, ());
        assert_eq!(wheel.next_wake(), Some(9));
        wheel.cancel(id);
        assert_eq!(wheel.next_wake(), None);
        let id = wheel.insert(2, ());
        assert_eq!(wheel.next_wake(), Some(2));
        wheel.cancel(id);
        assert_eq!(wheel.next_wake(), None);
    }

    /// Brute-force reference: pending timers keyed by (deadline, insertion).
    struct Model {
        pending: BTreeMap<(u64, u64), (TimerId, u64)>,
        now_ms: u64,
    }

    impl Model {
        fn fire(&mut self, now_ms: u64) -> Vec<(TimerId, u64)> {
            self.now_ms = self.now_ms.max(now_ms);
            let later = self.pending.split_off(&(self.now_ms + 1, 0));
            std::mem::replace(&mut self.pending, later)
                .into_values()
                .collect()
        }

        fn remove(&mut self, id: TimerId) -> Option<u64> {
            let key = *self.pending.iter().find(|(_, (i, _))| *i == id)?.0;
            self.pending.remove(&key).map(|(_, value)| value)
        }
    }

    fn random_deadline(rng: &mut Rng, now_ms: u64) -> u64 {
        match rng.below(6) {
            0 => now_ms.saturating_sub(rng.below(50)),
            1 => now_ms + rng.below(10),
            2 => now_ms + rng.below(1_000),
            3 => now_ms + rng.below(4 * ROTATION_MS),
            4 => now_ms + ROTATION_MS * (1 + rng.below(3)) + rng.below(3),
            _ => now_ms + rng.below(100),
        }
    }

    fn random_step_ms(rng: &mut Rng) -> u64 {
        match rng.below(8) {
            0 => 0,
            1 => 1,
            2 => rng.below(5_000),
            3 => ROTATION_MS - 1 + rng.below(3),
            4 => rng.below(3 * ROTATION_MS),
            _ => rng.below(20),
        }
    }

    fn check_next_wake(wheel: &TimingWheel<u64>, model: &Model) {
        let Some((&(earliest_ms, _), _)) = model.pending.first_key_value() else {
            assert_eq!(wheel.next_wake(), None);
            return;
        };
        let wake_ms = wheel.next_wake().expect("pending timers need a wake-up");
        assert!(
            wake_ms <= earliest_ms,
            "wake {wake_ms} after deadline {earliest_ms}"
        );
        if earliest_ms > model.now_ms {
            assert!(
                wake_ms > model.now_ms,
                "wake {wake_ms} would spin at {}",
                model.now_ms
            );
        }
    }

    fn run_against_model(seed: u64, start_ms: u64, steps: usize) {
        let mut rng = Rng(seed);
        let mut wheel = TimingWheel::new(start_ms);
        let mut model = Model {
            pending: BTreeMap::new(),
            now_ms: start_ms,
        };
        let mut ids = Vec::new();
        let mut seq = 0;
        for _ in 0..steps {
            match rng.below(10) {
                0..=4 => {
                    let deadline_ms = random_deadline(&mut rng, model.now_ms);
                    let id = wheel.insert(deadline_ms, seq);
                    assert_eq!(wheel.deadline(id), Some(deadline_ms));
                    model.pending.insert((deadline_ms, seq), (id, seq));
                    ids.push(id);
                    seq += 1;
                }
                5..=6 if !ids.is_empty() => {
                    let id = ids.swap_remove(rng.below(ids.len() as u64) as usize);
                    assert_eq!(wheel.cancel(id), model.remove(id));
                    assert_eq!(wheel.cancel(id), None);
                }
                _ => {
                    let now_ms = if rng.below(10) == 0 {
                        model.now_ms.saturating_sub(rng.below(100))
                    } else {
                        model.now_ms + random_step_ms(&mut rng)
                    };
                    let mut fired = Vec::new();
                    wheel.poll(now_ms, &mut fired);
                    assert_eq!(fired, model.fire(now_ms), "seed {seed:#x}");
                }
            }
            wheel.check_invariants();
            assert_eq!(wheel.len(), model.pending.len());
            check_next_wake(&wheel, &model);
        }
    }

    #[test]
    fn next_wake_is_never_later_than_the_earliest_deadline() {
        run_against_model(0x5EED_0001, 0, 3_000);
        run_against_model(0xDEAD_BEEF_CAFE, 1_700_000_000_000, 3_000);
        run_against_model(0x0123_4567_89AB, ROTATION_MS - 3, 3_000);
    }

    #[test]
    fn many_timers_inserted_and_cancelled_leave_len_zero_and_the_arena_reused() {
        let mut wheel = TimingWheel::new(0);
        let mut ids = Vec::with_capacity(100_000);
        let mut arena_cells = 0;
        for round in 0..2 {
            for i in 0..100_000u64 {
                ids.push(wheel.insert(1 + i * 7 % (3 * ROTATION_MS), i));
            }
            assert_eq!(wheel.len(), 100_000);
            for (i, id) in ids.drain(..).enumerate() {
                assert_eq!(wheel.cancel(id), Some(i as u64));
            }
            assert_eq!(wheel.len(), 0);
            assert_eq!(wheel.next_wake(), None);
            wheel.check_invariants();
            if round == 0 {
                arena_cells = wheel.entries.len();
            } else {
                assert_eq!(
                    wheel.entries.len(),
                    arena_cells,
                    "no growth on a second round"
                );
            }
        }
        assert_eq!(arena_cells, 100_000);
    }
}
