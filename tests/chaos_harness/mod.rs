//! The chaos run of baton: a 3-node cluster on loopback, 16 workers using
//! the official client on a few hot keys and many cold ones, and on a
//! semaphore key of limit 3, a fault schedule drawn from a printed seed,
//! and checks at the end.
//!
//! Owns: [`run`], the driver — it starts the cluster, the monitor
//! (`monitor.rs`) and the workers (`workers.rs`), plays the schedule
//! (`schedule.rs`) on the nodes (`cluster.rs`), then hands what was
//! recorded to the checks (`check.rs`) and prints a [`Report`]. It is used
//! by the short run in `tests/chaos.rs` (part of `cargo test --release`) and
//! by the long runs of `benches/chaos.rs` (`scripts/chaos.sh`).
//!
//! What is checked (each one a failure in [`Report::failures`]):
//! - fencing: per key, the resource accepted only tokens above the last it
//!   accepted; every write it rejected (a token smaller than one it had
//!   accepted: tokens not increasing in the order the resource saw them)
//!   fell in a fault window; no token was granted twice;
//! - the semaphore's fencing, per (key, slot): the resource never accepted
//!   a token not above the last it accepted for the slot (a stale token let
//!   through: the hard invariant, whatever the faults) nor refused one above
//!   it; every write it rejected fell in a fault window; no grant had a
//!   slot outside 0..limit;
//! - the semaphore's exclusion: every moment the resource had more than the
//!   limit of writes in flight, or one slot's twice, began in a window of an
//!   episode that SIGKILLed or SIGSTOPped a node (replication is
//!   asynchronous: a grant made just before may be lost, and a split brain
//!   grants on both sides), never in one of graceful handoffs only;
//! - the semaphore's holders kept: a grant whose release was answered not
//!   held (the active did not know it) was lost in such a window too, never
//!   with no fault or in graceful handoffs only (a handoff gives its
//!   successor every holder);
//! - mutual exclusion: every overlap of two workers' critical sections on
//!   one key began in a fault window (see `check.rs` for the definition);
//! - no hang: every acquire returned within wait + request timeout + slack,
//!   every release within its retry window + request timeout + slack (the
//!   lease is long enough that the client never confirms a grant with `K`);
//! - convergence: after each episode, and after the last, the cluster came
//!   back to one active — the highest-priority running node, with every
//!   other node its synced standby — within a bound; a SIGTERMed node exited
//!   0 within a bound.
//!
//! Never does: leave a process behind (the cluster's Drop kills every node
//! by PID, also on panic; a Drop guard stops the workers and the monitor), or
//! wait without a bound.

/// Print a line and keep it for the report.
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {{
        let line = format!($($arg)*);
        println!("{line}");
        $out.push_str(&line);
        $out.push('\n');
    }};
}

pub mod check;
pub mod cluster;
pub mod driver;
pub mod monitor;
pub mod report;
pub mod schedule;
pub mod workers;

#[path = "../common/cluster_key.rs"]
mod cluster_key;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use driver::wait_level;
use workers::Workload;

/// Longest the cluster may take to converge after an episode (and at the
/// start, and after the last fault).
pub const CONVERGE_BOUND: Duration = Duration::from_secs(10);
/// Longest a SIGTERMed node may take to hand off and exit.
pub const EXIT_BOUND: Duration = Duration::from_secs(10);
/// Longest the active may take, once converged, to count every other
/// running node as a synced standby.
pub const SYNC_BOUND: Duration = Duration::from_secs(5);
/// The workload keeps running this long after the final convergence.
pub const FINAL_QUIET: Duration = Duration::from_secs(2);
/// The end of a run with no fault: final convergence and quiet.
pub const TAIL: Duration = Duration::from_secs(4);

/// How to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// From the workers' start to their stop (about).
    pub duration: Duration,
    pub seed: u64,
    /// `--promotion-grace` of every node; None: off.
    pub promotion_grace: Option<Duration>,
    /// `--detect` of every node.
    pub detect: Duration,
    pub workload: Workload,
    /// Added to every call's bound.
    pub slack: Duration,
    /// Where node logs and the report go.
    pub dir: PathBuf,
    /// Fail the run when, after an episode, the cluster converged but the
    /// active did not count every other running node as a synced standby
    /// within [`SYNC_BOUND`] (redundancy not restored). On by default;
    /// when off, such episodes are printed, and counted in
    /// [`Report::unsynced`], but not failed.
    pub require_sync: bool,
}

impl Options {
    /// The standard run: `--detect 0.5`, 16 workers, 3 hot keys and 256
    /// cold ones, a quarter of the operations on a semaphore key of limit
    /// 3, a 6 s lease, a 0.5 s wait, a 1 s request timeout.
    pub fn new(duration: Duration, seed: u64, promotion_grace: Option<Duration>) -> Options {
        let grace_name =
            promotion_grace.map_or("off".to_string(), |g| format!("{}", g.as_secs_f64()));
        Options {
            duration,
            seed,
            promotion_grace,
            detect: Duration::from_millis(500),
            workload: Workload {
                workers: 16,
                hot_keys: 3,
                cold_keys: 256,
                hot_share: 0.5,
                lease: Duration::from_secs(6),
                wait: Duration::from_millis(500),
                request_timeout: Duration::from_secs(1),
                max_work: Duration::from_millis(10),
                sem_limit: 3,
                sem_share: 0.25,
            },
            slack: Duration::from_millis(500),
            require_sync: true,
            dir: PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
                .join("chaos")
                .join(format!("seed-{seed}-grace-{grace_name}")),
        }
    }

    fn grace_flag(&self) -> Option<String> {
        self.promotion_grace
            .map(|g| format!("{:.3}", g.as_secs_f64()))
    }
}

/// The outcome of a run.
#[derive(Debug, Default)]
pub struct Report {
    pub promotion_grace: Option<Duration>,
    /// Workers' running time.
    pub ran_for: Duration,
    pub episodes_run: usize,
    /// Fault actions by signal (SIGKILL, SIGSTOP, SIGTERM).
    pub faults: BTreeMap<&'static str, u64>,
    pub cycles: u64,
    pub acquire_timeouts: u64,
    pub acquire_errors: BTreeMap<String, u64>,
    pub release_not_held: u64,
    pub release_errors: BTreeMap<String, u64>,
    pub writes_accepted: u64,
    pub writes_rejected: u64,
    pub overlaps: usize,
    pub overlaps_outside: usize,
    /// The semaphore key's calls.
    pub sem: workers::SemTally,
    pub sem_accepted: u64,
    pub sem_rejected: u64,
    /// Rejected semaphore writes by slot.
    pub sem_rejected_by_slot: BTreeMap<u32, u64>,
    /// Semaphore writes accepted with a stale token (must be 0).
    pub sem_stale_accepted: usize,
    /// Moments more than the limit held the semaphore's resource at once,
    /// and how many of them were outside fault windows.
    pub sem_over_limit: usize,
    pub sem_over_limit_outside: usize,
    /// Moments one slot was held twice at once, and outside fault windows.
    pub sem_slot_twice: usize,
    pub sem_slot_twice_outside: usize,
    pub sem_most_in_flight: u32,
    /// Crowds (over the limit or a slot twice) in graceful windows only.
    pub sem_crowds_graceful: usize,
    /// Semaphore grants lost (release answered not held) with no fault
    /// window from grant to release, and in graceful windows only.
    pub sem_lost_outside: usize,
    pub sem_lost_graceful: usize,
    pub longest_overlap: Duration,
    pub windows_total: Duration,
    pub longest_acquire: Duration,
    pub longest_release: Duration,
    pub longest_no_active: Duration,
    pub slowest_convergence: Duration,
    pub final_convergence: Option<Duration>,
    /// Episodes after which redundancy did not come back.
    pub unsynced: usize,
    pub failures: Vec<String>,
    /// Everything printed, also saved as `report.txt` in the run directory.
    pub text: String,
}

/// Seconds from `t0` to `t`, for printing.
pub fn secs(t0: Instant, t: Instant) -> f64 {
    t.saturating_duration_since(t0).as_secs_f64()
}

/// Run the chaos run described by `options`; print and return its report.
pub fn run(options: &Options) -> Report {
    let mut out = String::new();
    let o = options;
    let w = &o.workload;
    let detect = format!("{:.3}", o.detect.as_secs_f64());
    let grace = o.grace_flag();
    let schedule = schedule::plan(o.seed, o.duration, TAIL, o.detect);
    say!(
        out,
        "chaos: seed {} (BATON_CHAOS_SEED / --seed), duration {:.0}s, 3 nodes, --detect {detect}, \
         --promotion-grace {}",
        o.seed,
        o.duration.as_secs_f64(),
        grace.as_deref().unwrap_or("off")
    );
    say!(
        out,
        "workload: {} workers, {} hot keys ({:.0}% of operations) and {} cold ones, the \
         semaphore key {} of limit {} ({:.0}%), lease {:?}, wait {:?}, request timeout {:?}, \
         work in a critical section 0..={:?}",
        w.workers,
        w.hot_keys,
        (1.0 - w.sem_share) * w.hot_share * 100.0,
        w.cold_keys,
        workers::SEM_NAME,
        w.sem_limit,
        w.sem_share * 100.0,
        w.lease,
        w.wait,
        w.request_timeout,
        w.max_work
    );
    say!(out, "node logs: {}", o.dir.display());
    say!(
        out,
        "fault schedule ({} episodes; times are planned, each gap is from the previous episode):",
        schedule.len()
    );
    for (k, episode) in schedule.iter().enumerate() {
        say!(out, "  #{k:<3} {episode}");
    }

    let recorded = driver::drive(o, &schedule, &mut out);
    report::analyse(o, &schedule, recorded, out)
}
