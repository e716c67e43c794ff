//! The figures the deciders keep, as plain values: what the lock table
//! counts where its events happen ([`TableMetrics`]), the latency
//! histograms ([`Latency`], exported as [`LatencySnapshot`] in the fixed
//! Prometheus buckets [`BUCKETS_US`]), and the [`Snapshot`] of every figure that the lock owner publishes for the
//! metrics thread (`server::stats` holds the thread-side counters and the
//! slot it is published in). Requests are counted by op and answers by
//! kind in the order of the protocol's op table (`protocol::OPS`,
//! `protocol::ANSWER_KINDS`), which also names their labels.
//!
//! Never does: allocate or lock per request, read a clock, or I/O.

use hdrhistogram::Histogram;

use crate::protocol::{AnswerKind, KNOWN_REASONS, Op, Reason};

/// The largest latency a histogram keeps apart (one hour); longer ones
/// count as this.
pub const MAX_RECORDED_US: u64 = 3_600_000_000;

/// The upper bounds (`le`) of the exported buckets, in microseconds, and
/// the same in seconds as written; `+Inf` follows them.
pub const BUCKETS_US: [(u64, &str); 20] = [
    (100, "0.0001"),
    (250, "0.00025"),
    (500, "0.0005"),
    (1_000, "0.001"),
    (2_500, "0.0025"),
    (5_000, "0.005"),
    (10_000, "0.01"),
    (25_000, "0.025"),
    (50_000, "0.05"),
    (100_000, "0.1"),
    (250_000, "0.25"),
    (500_000, "0.5"),
    (1_000_000, "1"),
    (2_500_000, "2.5"),
    (5_000_000, "5"),
    (10_000_000, "10"),
    (30_000_000, "30"),
    (60_000_000, "60"),
    (300_000_000, "300"),
    (3_600_000_000, "3600"),
];
pub const BUCKETS: usize = BUCKETS_US.len();

/// Reasons counted (every reason a server sends).
pub const REASONS: usize = KNOWN_REASONS.len();

/// The index of `reason` in `KNOWN_REASONS` (None for `Other`).
pub fn reason_index(reason: Reason) -> Option<usize> {
    KNOWN_REASONS.iter().position(|r| *r == reason)
}

/// A latency histogram: hdrhistogram counts (1 % precision) and an exact sum.
pub struct Latency {
    hist: Histogram<u64>,
    sum_us: u64,
}

impl Latency {
    pub fn new() -> Latency {
        Latency {
            hist: Histogram::new_with_bounds(1, MAX_RECORDED_US, 2)
                .expect("constant histogram bounds are valid"),
            sum_us: 0,
        }
    }

    /// Record one latency.
    pub fn record_us(&mut self, us: u64) {
        self.record_n_us(us, 1);
    }

    /// Record `n` latencies of `us` each.
    pub fn record_n_us(&mut self, us: u64, n: u64) {
        if n == 0 {
            return;
        }
        let us = us.min(MAX_RECORDED_US);
        self.hist.saturating_record_n(us, n);
        self.sum_us = self.sum_us.saturating_add(us.saturating_mul(n));
    }

    /// The counts in the exported buckets. A value counts as at most a
    /// bound when the lowest value of its hdrhistogram bucket is (so the
    /// bucket counts are exact to the histogram's 1 %).
    pub fn snapshot(&self) -> LatencySnapshot {
        let mut snap = LatencySnapshot {
            count: self.hist.len(),
            sum_us: self.sum_us,
            ..LatencySnapshot::default()
        };
        for value in self.hist.iter_recorded() {
            let low = self.hist.lowest_equivalent(value.value_iterated_to());
            let n = value.count_since_last_iteration();
            for (le, (bound, _)) in snap.le.iter_mut().zip(BUCKETS_US) {
                if low <= bound {
                    *le += n;
                }
            }
        }
        snap
    }
}

impl Default for Latency {
    fn default() -> Self {
        Latency::new()
    }
}

/// A histogram as exported: cumulative counts per bucket of [`BUCKETS_US`]
/// (`+Inf` is `count`), and the sum in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencySnapshot {
    pub le: [u64; BUCKETS],
    pub count: u64,
    pub sum_us: u64,
}

/// Handoffs of one round buffered for the shell (bounded; past it the
/// handoff counts as made by a release).
const MAX_ROUND_EXPIRED: usize = 65_536;

/// The lock table's figures (lock-owner thread only; plain fields).
#[derive(Default)]
pub struct TableMetrics {
    /// Grants made (at once or to a waiter).
    pub grants: u64,
    /// Grants to the next waiter after a release or an expiry.
    pub handoffs: u64,
    /// Leases that ran out.
    pub expiries: u64,
    /// Waits that ran out (`T`).
    pub timeouts: u64,
    /// Request to grant, in ms resolution (recorded in µs), for grants
    /// that waited; see [`TableMetrics::grant_wait`].
    grant_waited: Latency,
    /// Grants that did not wait: only counted here (the common case costs
    /// an addition), added to the histogram when it is read.
    grant_at_once: u64,
    /// A lease's deadline to the moment it was reclaimed.
    pub expiry_lateness: Latency,
    /// This round's handoffs after a release: their time is measured by
    /// the shell, from the round's start to its grants leaving.
    pub round_released: u64,
    /// This round's handoffs after an expiry: the lease deadlines (ms).
    pub round_expired: Vec<u64>,
}

impl TableMetrics {
    /// A new round: the shell has read the last one's handoffs.
    pub fn begin_round(&mut self) {
        self.round_released = 0;
        self.round_expired.clear();
    }

    /// A grant after a wait of `wait_ms`.
    pub fn granted(&mut self, wait_ms: u64) {
        self.grants += 1;
        if wait_ms == 0 {
            self.grant_at_once += 1;
        } else {
            self.grant_waited.record_us(wait_ms.saturating_mul(1000));
        }
    }

    /// The grant-wait histogram: request to grant, 0 for grants at once.
    pub fn grant_wait(&self) -> LatencySnapshot {
        let mut snap = self.grant_waited.snapshot();
        for le in &mut snap.le {
            *le += self.grant_at_once;
        }
        snap.count += self.grant_at_once;
        snap
    }

    /// A grant to the next waiter; `expired_at_ms` is the lease deadline
    /// when the last holder's lease ran out (None: it released the key).
    pub fn handed_off(&mut self, expired_at_ms: Option<u64>) {
        self.handoffs += 1;
        match expired_at_ms {
            Some(ms) if self.round_expired.len() < MAX_ROUND_EXPIRED => self.round_expired.push(ms),
            _ => self.round_released += 1,
        }
    }

    /// A lease with deadline `deadline_ms` reclaimed at `now_ms`.
    pub fn expired(&mut self, deadline_ms: u64, now_ms: u64) {
        self.expiries += 1;
        self.expiry_lateness
            .record_us(now_ms.saturating_sub(deadline_ms).saturating_mul(1000));
    }
}

/// Every figure of the lock owner, copied at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Active (serving, or handing the role over) rather than standby.
    pub active: bool,
    /// Handing the active role over to another node.
    pub handing_off: bool,
    /// Keys held now.
    pub held: u64,
    /// Grants held now (every holder of a semaphore counts).
    pub holders: u64,
    pub waiting: u64,
    pub last_token: u64,
    pub ceiling: u64,
    /// A standby: ms since it last heard from its active (0 when active).
    pub lag_ms: u64,
    /// Live standbys that hold this node's full state.
    pub standbys: u64,
    /// By op, at [`Op::index`].
    pub requests: [u64; Op::COUNT],
    /// By kind, at [`AnswerKind::index`].
    pub answers: [u64; AnswerKind::COUNT],
    pub refusals: [u64; REASONS],
    pub grants: u64,
    pub handoffs: u64,
    pub expiries: u64,
    pub timeouts: u64,
    pub role_changes: u64,
    /// Watched (connection, key) pairs now (the I/O loops' gauge).
    pub watches: u64,
    /// `W` lines written (answers and changes), and change lines skipped
    /// for slow watchers (replaced by a newer state before written).
    pub watch_lines: u64,
    pub watch_lines_skipped: u64,
    pub grant_wait: LatencySnapshot,
    pub handoff: LatencySnapshot,
    pub expiry_lateness: LatencySnapshot,
}
