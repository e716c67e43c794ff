//! The node's figures for `--metrics`, thread side: what the lock owner and
//! the I/O loops count, and the slot a snapshot is published in. (The
//! figures the lock table keeps itself, the histograms and the
//! [`Snapshot`] type are `core::counters`'s.)
//!
//! Owns:
//! - [`OwnerStats`], the lock owner's own counts (requests by op, answers by
//!   kind, refusals by reason, role changes, handoff time);
//! - [`IoCounters`], what the I/O loops count themselves (lines refused
//!   before the owner sees them), as relaxed atomics;
//! - [`MetricsSlot`]: where a plain copy of every figure ([`Snapshot`]) is
//!   left for the metrics thread; the owner writes into the slot only when the metrics thread asks and
//!   only if the slot is free (`try_lock`), so a scrape never blocks it.
//!
//! Runs on the lock-owner thread (everything but [`IoCounters`] and the
//! reading side of [`MetricsSlot`]).
//!
//! Never does: allocate or lock per request, I/O, or wait for the reader.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::protocol::{Answer, AnswerKind, Op, Reason};
use crate::server::core::contention::{KeysAsk, KeysView};
use crate::server::core::counters::{Latency, REASONS, Snapshot, TableMetrics, reason_index};
use crate::server::core::events::Inbound;

/// What the I/O loops count themselves: lines refused without reaching the
/// lock owner (not understood, or over `--max-conns`), and `U` lines with
/// their `U ok` answers (the owner never sees `U`). Relaxed atomics.
#[derive(Debug, Default)]
pub struct IoCounters {
    refusals: [AtomicU64; REASONS],
    auth_requests: AtomicU64,
    auth_oks: AtomicU64,
    watch_lines: AtomicU64,
    watch_lines_skipped: AtomicU64,
}

impl IoCounters {
    /// An `E - - reason` an I/O loop answered on its own.
    pub fn refused(&self, reason: Reason) {
        if let Some(i) = reason_index(reason) {
            self.refusals[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counts by reason.
    pub fn refusals(&self) -> [u64; REASONS] {
        std::array::from_fn(|i| self.refusals[i].load(Ordering::Relaxed))
    }

    /// A `U` line an I/O loop handled (right, wrong or malformed).
    pub fn auth_request(&self) {
        self.auth_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// A `U ok` an I/O loop answered.
    pub fn auth_ok(&self) {
        self.auth_oks.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` `W` lines written (answers and changes).
    pub fn watch_lines(&self, n: u64) {
        self.watch_lines.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` states of a watched key a watcher never got: it was given a
    /// newer one instead.
    pub fn watch_lines_skipped(&self, n: u64) {
        self.watch_lines_skipped.fetch_add(n, Ordering::Relaxed);
    }

    /// Add the `W` lines counted here to the owner's snapshot.
    pub fn add_watch_lines_to(&self, snap: &mut Snapshot) {
        snap.watch_lines = self.watch_lines.load(Ordering::Relaxed);
        snap.watch_lines_skipped = self.watch_lines_skipped.load(Ordering::Relaxed);
    }

    /// Add the `U` requests and `U ok` answers counted here to the owner's
    /// snapshot, under op `auth` and kind `auth_ok`.
    pub fn add_auth_to(&self, snap: &mut Snapshot) {
        let op = Op::Auth.index();
        let requests = self.auth_requests.load(Ordering::Relaxed);
        snap.requests[op] = snap.requests[op].saturating_add(requests);
        let kind = AnswerKind::AuthOk.index();
        let oks = self.auth_oks.load(Ordering::Relaxed);
        snap.answers[kind] = snap.answers[kind].saturating_add(oks);
    }
}

/// The lock owner's own counts (lock-owner thread only; plain fields).
pub struct OwnerStats {
    requests: [u64; Op::COUNT],
    answers: [u64; AnswerKind::COUNT],
    refusals: [u64; REASONS],
    role_changes: u64,
    was_active: bool,
    /// Release or expiry to the next grant leaving the owner.
    handoff: Latency,
    /// The metrics thread asked for a snapshot not published yet.
    pub scrape_wanted: bool,
    /// The metrics thread asked for this contention view (`GET /keys`),
    /// not published yet.
    pub keys_wanted: Option<KeysAsk>,
}

impl OwnerStats {
    pub fn new(active: bool) -> OwnerStats {
        OwnerStats {
            requests: [0; Op::COUNT],
            answers: [0; AnswerKind::COUNT],
            refusals: [0; REASONS],
            role_changes: 0,
            was_active: active,
            handoff: Latency::new(),
            scrape_wanted: false,
            keys_wanted: None,
        }
    }

    /// A request (well-formed or refused by the parser) reached the owner.
    pub fn count_inbound(&mut self, inbound: &Inbound) {
        let op = match inbound {
            Inbound::Request(_, request) => request.op(),
            Inbound::Refused(_, op, _, _) => *op,
            Inbound::Closed(_) | Inbound::Watching { .. } => return,
        };
        self.requests[op.index()] += 1;
    }

    /// An answer leaves the owner.
    pub fn count_answer(&mut self, answer: &Answer) {
        self.answers[answer.kind().index()] += 1;
        if let Answer::Error { reason, .. } = answer
            && let Some(i) = reason_index(*reason)
        {
            self.refusals[i] += 1;
        }
    }

    /// The end of a round: the role now, and this round's handoffs, whose
    /// grants have just left (`round_us`: since the round started;
    /// `since_deadline_us`: since a lease deadline in ms).
    pub fn end_round(
        &mut self,
        active: bool,
        table: &TableMetrics,
        round_us: u64,
        since_deadline_us: impl Fn(u64) -> u64,
    ) {
        if active != self.was_active {
            self.role_changes += 1;
            self.was_active = active;
        }
        self.handoff.record_n_us(round_us, table.round_released);
        for &deadline_ms in &table.round_expired {
            self.handoff.record_us(since_deadline_us(deadline_ms));
        }
    }

    /// Fill in the owner's own figures of `snap`.
    pub fn fill(&self, table: &TableMetrics, snap: &mut Snapshot) {
        snap.requests = self.requests;
        snap.answers = self.answers;
        snap.refusals = self.refusals;
        snap.role_changes = self.role_changes;
        snap.grants = table.grants;
        snap.handoffs = table.handoffs;
        snap.expiries = table.expiries;
        snap.timeouts = table.timeouts;
        snap.grant_wait = table.grant_wait();
        snap.handoff = self.handoff.snapshot();
        snap.expiry_lateness = table.expiry_lateness.snapshot();
    }
}

/// Where the lock owner leaves a [`Snapshot`] for the metrics thread, and
/// the contention view (`GET /keys`) it asked for.
pub struct MetricsSlot {
    snapshot: parking_lot::Mutex<Option<Snapshot>>,
    serial: AtomicU64,
    keys: parking_lot::Mutex<Option<Arc<KeysView>>>,
    keys_serial: AtomicU64,
    /// Wakes the metrics thread when a snapshot is published.
    waker: mio::Waker,
}

impl MetricsSlot {
    pub fn new(waker: mio::Waker) -> MetricsSlot {
        MetricsSlot {
            snapshot: parking_lot::Mutex::new(None),
            serial: AtomicU64::new(0),
            keys: parking_lot::Mutex::new(None),
            keys_serial: AtomicU64::new(0),
            waker,
        }
    }

    /// Lock owner: publish `snap` unless the reader holds the slot at this
    /// instant (then false: try again next round). Never waits.
    pub fn try_publish(&self, snap: &Snapshot) -> bool {
        let Some(mut slot) = self.snapshot.try_lock() else {
            return false;
        };
        *slot = Some(*snap);
        drop(slot);
        self.serial.fetch_add(1, Ordering::Release);
        let _ = self.waker.wake();
        true
    }

    /// Lock owner: publish a contention view unless the reader holds the
    /// slot at this instant (then the view is handed back: try again next
    /// round). Never waits; the reader only clones the `Arc` under the lock.
    pub fn try_publish_keys(&self, view: Arc<KeysView>) -> Result<(), Arc<KeysView>> {
        let Some(mut slot) = self.keys.try_lock() else {
            return Err(view);
        };
        *slot = Some(view);
        drop(slot);
        self.keys_serial.fetch_add(1, Ordering::Release);
        let _ = self.waker.wake();
        Ok(())
    }

    /// How many contention views were published so far.
    pub fn keys_serial(&self) -> u64 {
        self.keys_serial.load(Ordering::Acquire)
    }

    /// The last contention view published (None before the first).
    pub fn read_keys(&self) -> Option<Arc<KeysView>> {
        self.keys.lock().clone()
    }

    /// Wake the metrics thread (to see the shutdown flag).
    pub fn wake(&self) {
        let _ = self.waker.wake();
    }

    /// How many snapshots were published so far.
    pub fn serial(&self) -> u64 {
        self.serial.load(Ordering::Acquire)
    }

    /// The last snapshot published (None before the first).
    pub fn read(&self) -> Option<Snapshot> {
        *self.snapshot.lock()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::core::counters::{BUCKETS, MAX_RECORDED_US};

    #[test]
    fn latency_buckets_are_cumulative_and_exact_on_their_bounds() {
        let mut l = Latency::new();
        l.record_us(0);
        l.record_us(100);
        l.record_us(101);
        l.record_n_us(1_000, 3);
        l.record_us(7_200_000_000); // past the range: counted as an hour
        let s = l.snapshot();
        assert_eq!(s.count, 7);
        assert_eq!(s.le[0], 2, "0 and 100 are <= 100 us");
        assert_eq!(s.le[1], 3, "101 <= 250 us");
        assert_eq!(s.le[3], 6, "1000 is <= 0.001 s, on the bound");
        assert_eq!(s.le[BUCKETS - 2], 6, "nothing else below 300 s");
        assert_eq!(s.le[BUCKETS - 1], 7, "the clamped one is <= 3600 s");
        assert_eq!(s.sum_us, 100 + 101 + 3_000 + MAX_RECORDED_US);
        assert!(s.le.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn table_metrics_keep_a_rounds_handoffs_apart_until_the_next_round() {
        let mut t = TableMetrics::default();
        t.granted(0);
        t.granted(2);
        t.handed_off(None);
        t.handed_off(Some(40));
        t.expired(40, 41);
        assert_eq!((t.grants, t.handoffs, t.expiries), (2, 2, 1));
        assert_eq!(
            (t.round_released, t.round_expired.as_slice()),
            (1, &[40][..])
        );
        let mut owner = OwnerStats::new(true);
        owner.end_round(false, &t, 7, |deadline| (45 - deadline) * 1000);
        let mut snap = Snapshot::default();
        owner.fill(&t, &mut snap);
        assert_eq!(snap.handoff.count, 2);
        assert_eq!(snap.handoff.sum_us, 7 + 5_000);
        assert_eq!(snap.role_changes, 1);
        assert_eq!(snap.expiry_lateness.sum_us, 1_000);
        assert_eq!(snap.grant_wait.sum_us, 2_000);
        assert_eq!(snap.grant_wait.count, 2, "one at once, one after 2 ms");
        assert_eq!((snap.grant_wait.le[0], snap.grant_wait.le[4]), (1, 2));
        t.begin_round();
        assert_eq!((t.round_released, t.round_expired.len()), (0, 0));
    }

    #[test]
    fn publishing_never_waits_for_a_reader_and_wakes_it_when_done() {
        let mut poll = mio::Poll::new().expect("poll");
        let waker = mio::Waker::new(poll.registry(), mio::Token(7)).expect("waker");
        let slot = MetricsSlot::new(waker);
        assert_eq!(slot.read(), None, "nothing before the first publish");
        let snap = Snapshot {
            held: 5,
            ..Snapshot::default()
        };
        {
            let _reader = slot.snapshot.lock();
            assert!(
                !slot.try_publish(&snap),
                "a held slot is skipped, not waited for"
            );
            assert_eq!(slot.serial(), 0);
        }
        assert!(slot.try_publish(&snap));
        assert_eq!(slot.serial(), 1);
        assert_eq!(slot.read().map(|s| s.held), Some(5));
        let mut events = mio::Events::with_capacity(4);
        poll.poll(&mut events, Some(std::time::Duration::ZERO))
            .expect("poll");
        assert!(events.iter().any(|e| e.token() == mio::Token(7)), "woken");
    }

    #[test]
    fn answers_and_refusals_are_counted_by_kind_and_reason() {
        let mut owner = OwnerStats::new(true);
        owner.count_answer(&Answer::Error {
            op: None,
            key: None,
            reason: Reason::TooManyKeys,
        });
        owner.count_answer(&Answer::Error {
            op: None,
            key: None,
            reason: Reason::Other,
        });
        let mut snap = Snapshot::default();
        owner.fill(&TableMetrics::default(), &mut snap);
        assert_eq!(snap.answers[AnswerKind::Error.index()], 2);
        let i = reason_index(Reason::TooManyKeys).expect("known");
        assert_eq!(snap.refusals[i], 1);
        assert_eq!(snap.refusals.iter().sum::<u64>(), 1);
    }
}
