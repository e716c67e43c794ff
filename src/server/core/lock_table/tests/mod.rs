//! Tests of the lock table: a harness that checks every invariant after
//! each step, and the helpers the test files share.

mod index;
mod line;
mod replica;
mod slots;
mod views;

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
    fn release(&mut self, now: u64, conn: ConnId, k: &str, token: u64) -> Vec<(ConnId, Answer)> {
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

fn sem_grant(k: &str, token: u64, ms_left: u64, limit: u32, slot: u32, v: Option<&str>) -> Delta {
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
