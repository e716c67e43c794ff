//! The short chaos run, part of `cargo test --release`: a 3-node cluster on
//! loopback, 16 workers with the official client on mutex keys and, a
//! quarter of the time, on a semaphore key of limit 3, SIGKILL,
//! SIGSTOP/SIGCONT and SIGTERM of nodes on a schedule drawn from a seed,
//! then every check of `chaos_harness` (fencing, per slot for the
//! semaphore; overlaps, and more holders than the limit, only in fault
//! windows, for the semaphore only in those of a SIGKILL or a SIGSTOP;
//! semaphore holders kept across graceful handoffs; no hang; convergence).
//! About 30 s.
//!
//! The seed is fixed, or taken from `BATON_CHAOS_SEED`; the promotion grace
//! is off, or `BATON_CHAOS_GRACE` seconds. Long runs, with the grace off and
//! on: `scripts/chaos.sh --duration 600 [--seed N]`.

mod chaos_harness;

use std::time::Duration;

use chaos_harness::{Options, run};

/// The seed of the short run when `BATON_CHAOS_SEED` is not set.
const DEFAULT_SEED: u64 = 20_260_501;
/// The short run's length (the whole test takes a few seconds more).
const SHORT_RUN: Duration = Duration::from_secs(28);

#[test]
fn a_short_chaos_run_keeps_fencing_and_exclusion_outside_fault_windows_and_converges() {
    let seed = std::env::var("BATON_CHAOS_SEED")
        .ok()
        .map(|s| {
            s.trim()
                .parse::<u64>()
                .expect("BATON_CHAOS_SEED is a number")
        })
        .unwrap_or(DEFAULT_SEED);
    let grace = std::env::var("BATON_CHAOS_GRACE").ok().map(|s| {
        Duration::from_secs_f64(
            s.trim()
                .parse::<f64>()
                .expect("BATON_CHAOS_GRACE is seconds"),
        )
    });
    let options = Options::new(SHORT_RUN, seed, grace);
    let report = run(&options);
    assert!(
        report.failures.is_empty(),
        "chaos run with seed {seed}, --promotion-grace {:?} failed {} checks (see the report \
         above):\n{}",
        report.promotion_grace,
        report.failures.len(),
        report.failures.join("\n")
    );
    assert!(report.cycles > 0, "no operation completed");
    // The semaphore's hard invariant, whatever the faults: the resource,
    // fencing per slot, never let a stale token through (also among the
    // failures above; asserted on its own so it can never be waived).
    assert_eq!(
        report.sem_stale_accepted, 0,
        "the semaphore's resource accepted stale tokens"
    );
    // More holders than the limit, or a slot held twice, only in fault
    // windows, and never in one of graceful handoffs only; a holder lost
    // only where a SIGKILL or SIGSTOP could lose it (the failures above
    // list every one).
    assert_eq!(
        (report.sem_over_limit_outside, report.sem_slot_twice_outside),
        (0, 0),
        "semaphore over its limit outside fault windows"
    );
    assert_eq!(
        (
            report.sem_crowds_graceful,
            report.sem_lost_graceful,
            report.sem_lost_outside
        ),
        (0, 0, 0),
        "semaphore holders not kept across graceful handoffs (crowds, lost grants), or lost \
         with no fault"
    );
    assert!(report.sem.cycles > 0, "no semaphore operation completed");
    assert!(
        report.sem_most_in_flight > 1,
        "the semaphore never had two holders at once: its limit went unused"
    );
    assert!(report.episodes_run > 0, "no fault was injected");
}

/// Found by the chaos run (seeds 10 and 17 of the short run, about one long
/// SIGSTOP in ten): after a split brain, the node that was active during the
/// split steps back and follows the returning first node, but is never sent
/// a snapshot, so the active counts one synced standby of two for good.
///
/// Stop the active longer than `--detect` (node 1 takes over), resume it
/// (node 1 steps back), and check that within [`chaos_harness::SYNC_BOUND`]
/// node 0 counts both others as synced standbys again; repeat.
#[test]
fn after_a_split_brain_the_demoted_node_is_synced_again() {
    use chaos_harness::cluster::{Cluster, pick_ports};
    use chaos_harness::monitor::{self, Level, Observed};
    use chaos_harness::{CONVERGE_BOUND, SYNC_BOUND, wait_level};
    use parking_lot::Mutex;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    // About one round in ten hit it before the fix: 50 rounds (75 s) miss it
    // once in ~200 runs. The suite runs 8 (about 12 s);
    // BATON_SPLIT_ROUNDS=50 runs the full check.
    let rounds: usize = std::env::var("BATON_SPLIT_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let started = Instant::now();
    let dir =
        std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chaos/split-brain-resync");
    let _ = std::fs::remove_dir_all(&dir);
    let ports = pick_ports(0);
    let mut cluster = Cluster::new(ports, "0.5", None, &dir, started);
    let observed = Arc::new(Mutex::new(Observed::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (names, shared, observed, stop) = (
            cluster.names.clone(),
            cluster.shared.clone(),
            observed.clone(),
            stop.clone(),
        );
        std::thread::spawn(move || monitor::run(ports, names, shared, observed, stop))
    };
    for i in 0..3 {
        cluster.start(i, 0);
    }
    let mut outcome = Ok(0);
    for round in 1..=rounds {
        let epoch = cluster.shared.lock().epoch;
        if wait_level(&observed, epoch, Level::Synced, CONVERGE_BOUND).is_none() {
            outcome = Err(format!("round {round}: not synced before the stop"));
            break;
        }
        cluster.stop(0, round);
        std::thread::sleep(Duration::from_millis(1500));
        cluster.resume(0, round);
        let epoch = cluster.shared.lock().epoch;
        if wait_level(&observed, epoch, Level::Converged, CONVERGE_BOUND).is_none() {
            outcome = Err(format!("round {round}: no convergence after SIGCONT"));
            break;
        }
        if wait_level(&observed, epoch, Level::Synced, SYNC_BOUND).is_none() {
            outcome = Err(format!(
                "round {round}: node 0 is active and both others follow it, but it counts \
                 fewer than 2 synced standbys {SYNC_BOUND:?} after SIGCONT"
            ));
            break;
        }
        outcome = Ok(round);
    }
    stop.store(true, Ordering::Relaxed);
    let _ = monitor.join();
    drop(cluster);
    if let Err(why) = outcome {
        let samples = std::mem::take(&mut observed.lock().samples);
        let timeline: Vec<String> = monitor::timeline(&samples)
            .into_iter()
            .map(|(at, view)| format!("{:>9.3} {view}", at.duration_since(started).as_secs_f64()))
            .collect();
        let tail = &timeline[timeline.len().saturating_sub(15)..];
        panic!(
            "{why}\nlast views (node 0, 1, 2; A<n>: serving with n synced standbys, S<i>: \
             standby of node i):\n{}\nnode logs: {}",
            tail.join("\n"),
            dir.display()
        );
    }
}
