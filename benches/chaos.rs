//! The long chaos run of baton (`scripts/chaos.sh`): the harness of
//! `tests/chaos_harness` run for as long as asked, with the promotion grace
//! off, on, or both one after the other on the same seed, then a comparison.
//!
//! Owns: the command line only. Every process is killed by PID at the end of
//! each run (the harness's Drop guards). Exits 1 if any check failed.
//!
//! Run: `cargo bench --bench chaos -- [--duration SECS] [--seed N]
//! [--promotion-grace SECS] [--grace off|on|both]`.

// Cargo builds bench targets with `--cfg test` but without the test
// harness: the harness's unit tests compile here without their `#[test]`
// functions, leaving their helpers unused. The test build (`tests/chaos.rs`)
// still warns about real dead code.
#[allow(dead_code, unused_imports)]
#[path = "../tests/chaos_harness/mod.rs"]
mod chaos_harness;

use std::time::Duration;

use chaos_harness::{Options, Report, run};

const HELP: &str = "\
chaos [--duration SECS (default 120)] [--seed N (default: from the clock)]
      [--promotion-grace SECS (default 6, the workers' lease)]
      [--grace off|on|both (default both)] [--allow-unsynced]

--allow-unsynced: report, but do not fail on, episodes after which the
active did not count every other node as a synced standby again (the
known split-brain re-sync bug; see tests/chaos.rs).";

fn main() {
    let mut args = pico_args::Arguments::from_env();
    if args.contains(["-h", "--help"]) {
        println!("{HELP}");
        return;
    }
    let _ = args.contains("--bench");
    let allow_unsynced = args.contains("--allow-unsynced");
    let parsed = (|| -> Result<(f64, Option<u64>, f64, String), pico_args::Error> {
        Ok((
            args.opt_value_from_str("--duration")?.unwrap_or(120.0),
            args.opt_value_from_str("--seed")?,
            args.opt_value_from_str("--promotion-grace")?.unwrap_or(6.0),
            args.opt_value_from_str("--grace")?
                .unwrap_or_else(|| "both".to_string()),
        ))
    })();
    let (duration, seed, grace_secs, which) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("chaos: {e}\n{HELP}");
            std::process::exit(2);
        }
    };
    let seed = seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs())
    });
    let grace = Duration::from_secs_f64(grace_secs);
    let graces: Vec<Option<Duration>> = match which.as_str() {
        "off" => vec![None],
        "on" => vec![Some(grace)],
        "both" => vec![None, Some(grace)],
        other => {
            eprintln!("chaos: --grace is off, on or both, not {other:?}\n{HELP}");
            std::process::exit(2);
        }
    };
    let duration = Duration::from_secs_f64(duration);
    let reports: Vec<Report> = graces
        .iter()
        .map(|&g| {
            let mut options = Options::new(duration, seed, g);
            options.require_sync = !allow_unsynced;
            let report = run(&options);
            println!();
            report
        })
        .collect();
    println!(
        "----- summary: seed {seed}, {:.0}s per run -----",
        duration.as_secs_f64()
    );
    println!(
        "{:<8} {:>6} {:>7} {:>6} {:>9} {:>9} {:>8} {:>9} {:>7} {:>8} {:>9} {:>9} {:>9} {:>10} {:>9} {:>8}",
        "grace",
        "faults",
        "ops",
        "ops/s",
        "timeouts",
        "overlaps",
        "outside",
        "rejected",
        "sem-ops",
        "sem-rej",
        "sem-stale",
        "sem-over",
        "sem-slot2",
        "no-active",
        "unsynced",
        "checks"
    );
    for r in &reports {
        println!(
            "{:<8} {:>6} {:>7} {:>6.0} {:>9} {:>9} {:>8} {:>9} {:>7} {:>8} {:>9} {:>9} {:>9} {:>9.3}s {:>9} {:>8}",
            r.promotion_grace
                .map_or("off".to_string(), |g| format!("{}s", g.as_secs_f64())),
            r.faults.values().sum::<u64>(),
            r.cycles,
            r.cycles as f64 / r.ran_for.as_secs_f64().max(0.001),
            r.acquire_timeouts,
            r.overlaps,
            r.overlaps_outside,
            r.writes_rejected,
            r.sem.cycles,
            r.sem_rejected,
            r.sem_stale_accepted,
            format!("{}/{}", r.sem_over_limit, r.sem_over_limit_outside),
            format!("{}/{}", r.sem_slot_twice, r.sem_slot_twice_outside),
            r.longest_no_active.as_secs_f64(),
            r.unsynced,
            if r.failures.is_empty() {
                "passed"
            } else {
                "FAILED"
            }
        );
    }
    println!(
        "overlaps: critical sections of one key held by two workers at once (outside: not in a \
         fault window); rejected: fenced writes refused for a stale token; sem-: the semaphore \
         key (limit 3): operations, writes refused for a stale token of their slot, stale \
         tokens accepted (must be 0), moments over the limit and moments a slot was held twice \
         (each: in all/outside fault windows); no-active: longest time no node served; \
         unsynced: episodes after which redundancy did not come back"
    );
    if reports.iter().any(|r| !r.failures.is_empty()) {
        std::process::exit(1);
    }
}
