//! The requests a client sends (`A`, `R`, `K`, `Q`), a refused request's
//! answer, a closed connection, and the lease timers: each takes the time
//! and pushes its answers into an [`Outbox`].

use super::*;

impl LockTable {
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
            // slot is taken), so it is granted at once. No barging past the
            // line: checked in every build (O(1)).
            assert_eq!(
                self.keys[idx as usize].queue_head, NIL,
                "a free slot while the key has waiters"
            );
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
        let found = self.live_grant(now_ms, &key, token, out);
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
        let found = self.live_grant(now_ms, &key, token, out);
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
    pub(super) fn lookup_live(
        &mut self,
        now_ms: u64,
        key: &Key,
        out: &mut Outbox,
    ) -> Result<u32, u32> {
        let idx = self.index.find(&self.keys, key)?;
        self.reclaim_lapsed(now_ms, idx, key, out)
    }

    /// The live grant `token` of `key` (its key's slot, and where it sits
    /// among the key's grants), as `R` and `K` name it; None when the key
    /// is not held under that token (lapsed grants reclaimed first).
    #[inline]
    fn live_grant(
        &mut self,
        now_ms: u64,
        key: &Key,
        token: u64,
        out: &mut Outbox,
    ) -> Option<(u32, At)> {
        let idx = self.lookup_live_by_token(now_ms, key, token, out).ok()?;
        Some((idx, self.find_grant(idx, token)?))
    }

    /// As [`LockTable::lookup_live`], for a request that names a grant's
    /// `token`: where that token was granted, if it is still the key's slot
    /// ([`RecentGrants`]), is looked at before the index.
    pub(super) fn lookup_live_by_token(
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
    pub(super) fn reclaim_lapsed(
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
    pub(super) fn expire(&mut self, idx: u32, at: At, now_ms: u64) -> Option<u64> {
        let (token, expiry_ms) = self.grant_token_expiry(idx, at);
        if token == 0 {
            return None;
        }
        self.metrics.expired(expiry_ms, now_ms);
        Some(expiry_ms)
    }

    /// The table cannot take a new grant: answer `too-many-keys`.
    pub(super) fn is_full(&self, conn: ConnId, key: &Key, out: &mut Outbox) -> bool {
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
}
