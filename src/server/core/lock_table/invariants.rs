//! Every invariant of the module doc, checked in one pass over the table
//! ([`LockTable::check_invariants`]): O(size of the table), for tests and
//! debugging. Compiled into the unit tests and into builds with the
//! `test-hooks` feature (the package's tests turn it on: the simulation in
//! tests/simulation.rs calls it), never into what users build; the cheap
//! invariants are asserted where they could break, in every build.

use super::*;

impl LockTable {
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
