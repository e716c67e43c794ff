//! The FIFO line of a key and its timeouts: waiters queued in arrival
//! order, the hand-off of a freed slot to the head of the line, a wait that
//! runs out (`T`), refusals, and the answers deferred behind an earlier
//! waiter of the same connection for the same key.

use super::*;

/// An answer owed to a connection after an earlier waiter's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Deferred {
    Timeout,
    Refused(Reason),
}

#[derive(Debug)]
pub(super) struct Waiter {
    pub(super) conn: ConnId,
    pub(super) key_idx: u32,
    pub(super) lease_ms: u64,
    /// When the request arrived (for the grant-wait histogram).
    pub(super) since_ms: u64,
    pub(super) wait_timer: Option<TimerId>,
    /// The request named a limit (its grant is answered with its slot).
    pub(super) named_limit: bool,
    pub(super) value: Option<Value>,
    // The key's FIFO queue.
    pub(super) prev: u32,
    pub(super) next: u32,
    // The connection's list of waiters (for disconnect).
    pub(super) conn_prev: u32,
    pub(super) conn_next: u32,
    // Earlier / later waiters of the same connection for the same key.
    pub(super) chain_prev: u32,
    pub(super) chain_next: u32,
    pub(super) deferred: Vec<Deferred>,
}

#[derive(Debug, Default)]
pub(super) struct ConnWaiting {
    pub(super) head: u32,
    pub(super) waiting: u32,
    pub(super) deferred: u32,
}

impl LockTable {
    pub(super) fn enqueue(
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
            // The line is FIFO: a waiter joins after the last one. Checked
            // in every build (O(1)).
            let tail = &mut self.waiters[prev as usize];
            assert_eq!(tail.next, NIL, "the line's tail is its last waiter");
            tail.next = w;
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
    pub(super) fn refuse_acquire(
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
    pub(super) fn hand_off(
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
        let mut waiter = self.remove_waiter(head);
        // The line is FIFO: the freed slot goes to the first in line.
        // Checked in every build (O(1)).
        assert_eq!(waiter.prev, NIL, "the line's head is its first waiter");
        self.metrics.granted(now_ms.saturating_sub(waiter.since_ms));
        let (old_token, _) = self.grant_token_expiry(idx, at);
        if old_token != 0 {
            self.metrics.handed_off(expired_at_ms);
        }
        let token = self.tokens.issue();
        self.recent.note(token, idx);
        // A token is not reused: the next holder's is above the last one's
        // (TokenSource::issue checks the same for every token). Checked in
        // every build (O(1)).
        assert!(token > old_token, "tokens never decrease");
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
                        sem.first_value = waiter.value.take();
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
                            let sem =
                                Sem::new(1, 0, waiter.value.take()).expect("a value needs a Sem");
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
                grant.value = waiter.value.take();
                grant.slot
            }
        };
        self.note_held(idx, None);
        self.holders_changed(idx);
        self.answer_granted(idx, &waiter, token, slot, out);
        self.fill(now_ms, idx, out);
    }

    /// Waiter `waiter` of key `idx` was granted `token` in `slot`: its `A`
    /// answer (with the slot if its request named a limit), then the
    /// answers held back behind it.
    #[inline]
    fn answer_granted(
        &mut self,
        idx: u32,
        waiter: &Waiter,
        token: u64,
        slot: u32,
        out: &mut Outbox,
    ) {
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

    /// Key `idx`'s free slots go to the front of its queue (there are free
    /// slots and waiters at once only when a promotion-grace placeholder of
    /// a semaphore has just run out).
    pub(super) fn fill(&mut self, now_ms: u64, idx: u32, out: &mut Outbox) {
        while self.keys[idx as usize].queue_head != NIL
            && self.holder_count(idx) < self.limit(idx) as usize
        {
            let mut waiter = self.remove_waiter(self.keys[idx as usize].queue_head);
            assert_eq!(waiter.prev, NIL, "the line's head is its first waiter");
            self.metrics.granted(now_ms.saturating_sub(waiter.since_ms));
            let value = waiter.value.take();
            let (token, slot) = self.add_grant(now_ms, idx, waiter.lease_ms, value);
            self.answer_granted(idx, &waiter, token, slot, out);
        }
    }

    /// Waiter `w` ran out of wait: it leaves the queue and gets `T`, unless
    /// an earlier waiter of its connection for the same key is still in
    /// line, in which case that one carries the `T` (and everything `w`
    /// carried) until it is answered.
    pub(super) fn time_out(&mut self, w: u32, out: &mut Outbox) {
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

    pub(super) fn emit_deferred(
        &mut self,
        conn: ConnId,
        key: &Key,
        deferred: &[Deferred],
        out: &mut Outbox,
    ) {
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
    pub(super) fn remove_waiter(&mut self, w: u32) -> Waiter {
        let waiter = self.waiters.remove(w as usize);
        if let Some(timer) = waiter.wait_timer {
            self.wheel.cancel(timer);
        }
        self.unlink_from_queue(&waiter);
        self.unlink_from_conn(w, &waiter);
        self.unlink_from_chain(w, &waiter);
        waiter
    }

    pub(super) fn unlink_from_queue(&mut self, waiter: &Waiter) {
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

    pub(super) fn unlink_from_conn(&mut self, w: u32, waiter: &Waiter) {
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

    pub(super) fn unlink_from_chain(&mut self, w: u32, waiter: &Waiter) {
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
}
