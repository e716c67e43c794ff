//! The verdicts and the report of a chaos run, from what the driver
//! recorded: every check of `check.rs` applied, the figures summed, the
//! report printed and saved with the fault log, the fault windows, every
//! overlap, every crowd at the semaphore's resource and a timeline of the
//! cluster in the run's directory.
//!
//! Owns: turning a [`Recorded`] into a [`Report`]. Runs on the caller's
//! thread after every process and thread of the run is gone.
//!
//! Never does: touch the cluster, or read the clock.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use super::check::{self, Fencing, Overlap, SETUP, SemCheck, Window};
use super::driver::{Recorded, episode_name};
use super::monitor;
use super::schedule::Episode;
use super::workers::{self, Crowd, LostGrant, Section, SemGrant, SemWrite, SlowCall, WorkerLog};
use super::{CONVERGE_BOUND, Options, Report, secs};

/// Violations of one kind listed in full, at most.
const LISTED: usize = 20;

/// Check what was recorded; print the report after `out` and return it.
pub fn analyse(o: &Options, schedule: &[Episode], rec: Recorded, mut out: String) -> Report {
    let planned = schedule.len();
    let mut report = Report {
        promotion_grace: o.promotion_grace,
        ran_for: rec.t1 - rec.t0,
        episodes_run: rec.episodes_run,
        ..Report::default()
    };
    let (sections, sem_grants, sem_lost, slow) = tally(&mut report, rec.logs);
    for e in rec.events.iter().filter(|e| e.episode != SETUP) {
        if matches!(e.what, "SIGKILL" | "SIGSTOP" | "SIGTERM") {
            *report.faults.entry(e.what).or_default() += 1;
        }
    }
    let windows = check::windows(&rec.events, &rec.samples, rec.t1);
    report.windows_total = merged_length(&windows);
    report.slowest_convergence = windows
        .iter()
        .filter_map(|w| {
            let last = rec
                .events
                .iter()
                .filter(|e| e.episode == w.episode)
                .map(|e| e.at)
                .max()?;
            Some(w.converged?.saturating_duration_since(last))
        })
        .max()
        .unwrap_or_default();
    report.final_convergence = match (rec.last_action, rec.final_converged) {
        (Some(a), Some(c)) => Some(c.saturating_duration_since(a)),
        _ => None,
    };
    let tokens: Vec<u64> = sections
        .iter()
        .map(|s| s.token)
        .chain(sem_grants.iter().map(|g| g.token))
        .collect();
    let fencing = check::fencing(&rec.writes, &tokens, &windows);
    let sem = check::semaphore(
        &rec.sem,
        &sem_grants,
        &sem_lost,
        o.workload.sem_limit,
        &windows,
    );
    report.sem_accepted = sem.accepted;
    report.sem_rejected = sem.rejected;
    report.sem_rejected_by_slot = sem.rejected_by_slot.clone();
    report.sem_stale_accepted = sem.accepted_stale.len();
    report.sem_over_limit = sem.over_limit;
    report.sem_over_limit_outside = sem.over_limit_outside.len();
    report.sem_slot_twice = sem.slot_twice;
    report.sem_slot_twice_outside = sem.slot_twice_outside.len();
    report.sem_most_in_flight = sem.most_in_flight;
    report.sem_crowds_graceful = sem.crowds_graceful.len();
    report.sem_lost_outside = sem.lost_outside.len();
    report.sem_lost_graceful = sem.lost_graceful.len();
    report.writes_accepted = fencing.accepted;
    report.writes_rejected = fencing.rejected;
    let overlaps = check::overlaps(&sections);
    let outside = check::overlaps_outside(&overlaps, &windows);
    report.overlaps = overlaps.len();
    report.overlaps_outside = outside.len();
    report.longest_overlap = overlaps
        .iter()
        .map(Overlap::length)
        .max()
        .unwrap_or_default();
    let no_active = check::longest_no_active(&rec.samples);
    report.longest_no_active = no_active.map(|(d, _)| d).unwrap_or_default();

    let at = Timing {
        started: rec.started,
        windows: &windows,
    };
    let mut failures = rec.findings.failures;
    failures.extend(violations(o, &at, &fencing, &outside, &slow));
    failures.extend(sem_violations(o, &at, &sem));
    print_figures(
        o,
        planned,
        &report,
        &at,
        &fencing,
        slow.len(),
        no_active,
        &mut out,
    );
    print_sem(o, &report, &mut out);
    report.unsynced = rec.findings.unsynced.len();
    if o.require_sync {
        failures.extend(rec.findings.unsynced);
    } else {
        for f in &rec.findings.unsynced {
            say!(
                out,
                "NOT SYNCED (reported, not failed: require_sync is off): {f}"
            );
        }
    }
    if failures.is_empty() {
        say!(out, "verdict: every check passed");
    } else {
        say!(out, "verdict: {} FAILED checks:", failures.len());
        for f in &failures {
            say!(out, "  - {f}");
        }
    }
    let _ = writeln!(out, "seed {} reproduces this schedule", o.seed);
    save_files(o, &rec.events, &rec.samples, &at, &out);
    save_overlaps(o, schedule, &overlaps, &at);
    save_crowds(o, schedule, &rec.sem.crowds, &at);
    report.failures = failures;
    report.text = out;
    report
}

/// Sum the workers' logs into `report`; every section, every semaphore
/// grant and every slow call.
fn tally(report: &mut Report, logs: Vec<WorkerLog>) -> Tallied {
    let mut sections = Vec::new();
    let mut sem_grants = Vec::new();
    let mut sem_lost = Vec::new();
    let mut slow = Vec::new();
    for log in logs {
        sections.extend(log.sections);
        sem_grants.extend(log.sem_grants);
        sem_lost.extend(log.sem_lost);
        report.sem.add(log.sem);
        slow.extend(log.slow);
        report.cycles += log.cycles;
        report.acquire_timeouts += log.acquire_timeouts;
        for (k, n) in log.acquire_errors {
            *report.acquire_errors.entry(k).or_default() += n;
        }
        report.release_not_held += log.release_not_held;
        for (k, n) in log.release_errors {
            *report.release_errors.entry(k).or_default() += n;
        }
        report.longest_acquire = report.longest_acquire.max(log.longest_acquire);
        report.longest_release = report.longest_release.max(log.longest_release);
    }
    (sections, sem_grants, sem_lost, slow)
}

/// Every section, semaphore grant, lost semaphore grant and slow call.
type Tallied = (Vec<Section>, Vec<SemGrant>, Vec<LostGrant>, Vec<SlowCall>);

/// The time covered by at least one window.
fn merged_length(windows: &[Window]) -> Duration {
    let mut spans: Vec<(Instant, Instant)> = windows.iter().map(|w| (w.from, w.to)).collect();
    spans.sort();
    let mut merged: Vec<(Instant, Instant)> = Vec::new();
    for (from, to) in spans {
        match merged.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => merged.push((from, to)),
        }
    }
    merged.iter().map(|(a, b)| *b - *a).sum()
}

/// Printing times: time zero and the windows.
struct Timing<'a> {
    started: Instant,
    windows: &'a [Window],
}

impl Timing<'_> {
    fn s(&self, t: Instant) -> f64 {
        secs(self.started, t)
    }

    /// The window nearest to `t`, for a violation's message.
    fn nearest_window(&self, t: Instant) -> String {
        let distance = |w: &&Window| {
            if w.contains(t) {
                Duration::ZERO
            } else if t < w.from {
                w.from - t
            } else {
                t - w.to
            }
        };
        self.windows.iter().min_by_key(distance).map_or_else(
            || "no fault window at all".into(),
            |w| {
                format!(
                    "nearest window: episode #{} [{:.3}s, {:.3}s]",
                    w.episode,
                    self.s(w.from),
                    self.s(w.to)
                )
            },
        )
    }
}

/// One line per violation of the fencing, exclusion and hang checks (at
/// most [`LISTED`] of each kind, then a count).
fn violations(
    o: &Options,
    at: &Timing,
    fencing: &Fencing,
    outside: &[Overlap],
    slow: &[SlowCall],
) -> Vec<String> {
    let w = &o.workload;
    let mut lines = Vec::new();
    let mut list = |all: usize, what: &str, each: &mut dyn Iterator<Item = String>| {
        lines.extend(each.take(LISTED));
        if all > LISTED {
            lines.push(format!("... {all} {what} in all"));
        }
    };
    list(
        fencing.accepted_smaller.len(),
        "writes accepted below an earlier token",
        &mut fencing.accepted_smaller.iter().map(|x| {
            format!(
                "the resource accepted token {} for {} from worker {} at {:.3}s, not above the \
                 last token it accepted",
                x.token,
                workers::key_name(w, x.key),
                x.worker,
                at.s(x.at)
            )
        }),
    );
    list(
        fencing.rejected_outside.len(),
        "writes rejected outside fault windows",
        &mut fencing.rejected_outside.iter().map(|x| {
            format!(
                "worker {} wrote {} with token {} at {:.3}s, below a token already accepted, \
                 outside every fault window ({})",
                x.worker,
                workers::key_name(w, x.key),
                x.token,
                at.s(x.at),
                at.nearest_window(x.at)
            )
        }),
    );
    list(
        fencing.duplicate_tokens.len(),
        "tokens granted twice",
        &mut fencing
            .duplicate_tokens
            .iter()
            .map(|t| format!("token {t} was granted twice")),
    );
    list(
        outside.len(),
        "overlaps outside fault windows",
        &mut outside.iter().map(|ov| {
            format!(
                "overlap outside every fault window on {}: worker {} token {} [{:.3}s, {:.3}s] \
                 and worker {} token {} [{:.3}s, {:.3}s] ({})",
                workers::key_name(w, ov.first.key),
                ov.first.worker,
                ov.first.token,
                at.s(ov.first.start),
                at.s(ov.first.end),
                ov.second.worker,
                ov.second.token,
                at.s(ov.second.start),
                at.s(ov.second.end),
                at.nearest_window(ov.start())
            )
        }),
    );
    list(
        slow.len(),
        "calls over their bound",
        &mut slow.iter().map(|call| {
            let bound = if call.op == "acquire" {
                workers::acquire_bound(w, o.slack)
            } else {
                workers::release_bound(w, o.slack)
            };
            format!(
                "worker {}: {} of {} started at {:.3}s took {:.3}s (bound {:.3}s): {}",
                call.worker,
                call.op,
                workers::key_name(w, call.key),
                at.s(call.started),
                call.took.as_secs_f64(),
                bound.as_secs_f64(),
                call.outcome
            )
        }),
    );
    lines
}

/// One line per violation of the semaphore's fencing and exclusion checks
/// (at most [`LISTED`] of each kind, then a count).
fn sem_violations(o: &Options, at: &Timing, sem: &SemCheck) -> Vec<String> {
    let name = workers::SEM_NAME;
    let limit = o.workload.sem_limit;
    let mut lines = Vec::new();
    let mut list = |all: usize, what: &str, each: &mut dyn Iterator<Item = String>| {
        lines.extend(each.take(LISTED));
        if all > LISTED {
            lines.push(format!("... {all} {what} in all"));
        }
    };
    let write = |x: &SemWrite| {
        format!(
            "worker {} wrote {name} slot {} with token {} at {:.3}s",
            x.worker,
            x.slot,
            x.token,
            at.s(x.at)
        )
    };
    list(
        sem.accepted_stale.len(),
        "stale semaphore writes accepted",
        &mut sem.accepted_stale.iter().map(|x| {
            format!(
                "STALE TOKEN ACCEPTED: {}, not above the last token accepted for the slot",
                write(x)
            )
        }),
    );
    list(
        sem.rejected_fresh.len(),
        "current semaphore holders refused",
        &mut sem.rejected_fresh.iter().map(|x| {
            format!(
                "{}: refused though above the last token accepted for the slot",
                write(x)
            )
        }),
    );
    list(
        sem.rejected_outside.len(),
        "semaphore writes rejected outside fault windows",
        &mut sem.rejected_outside.iter().map(|x| {
            format!(
                "{}: below a token already accepted for the slot, outside every fault window ({})",
                write(x),
                at.nearest_window(x.at)
            )
        }),
    );
    list(
        sem.bad_slots.len(),
        "semaphore grants with a slot out of range",
        &mut sem.bad_slots.iter().map(|g| {
            format!(
                "worker {} was granted {name} (limit {limit}) in slot {} with token {} at {:.3}s",
                g.worker,
                g.slot,
                g.token,
                at.s(g.at)
            )
        }),
    );
    let crowd = |c: &Crowd, what: &str| {
        format!(
            "{what} outside every fault window: worker {} began writing {name} slot {} with token              {} at {:.3}s with {} writes in flight (limit {limit}), {} on its slot ({})",
            c.worker,
            c.slot,
            c.token,
            at.s(c.at),
            c.holders,
            c.slot_holders,
            at.nearest_window(c.at)
        )
    };
    let lost = |g: &LostGrant, what: &str| {
        format!(
            "semaphore grant lost {what}: worker {} held {name} slot {} with token {} from \
             {:.3}s; its release at {:.3}s was answered not held ({})",
            g.worker,
            g.slot,
            g.token,
            at.s(g.granted),
            at.s(g.released),
            at.nearest_window(g.granted)
        )
    };
    list(
        sem.lost_outside.len(),
        "semaphore grants lost outside fault windows",
        &mut sem
            .lost_outside
            .iter()
            .map(|g| lost(g, "with no fault window from its grant to its release")),
    );
    list(
        sem.lost_graceful.len(),
        "semaphore grants lost in graceful handoffs",
        &mut sem.lost_graceful.iter().map(|g| {
            lost(
                g,
                "in graceful handoffs only (SIGTERM, no SIGKILL or SIGSTOP from its grant to its \
                 release)",
            )
        }),
    );
    list(
        sem.crowds_graceful.len(),
        "semaphore crowds in graceful handoffs",
        &mut sem.crowds_graceful.iter().map(|c| {
            format!(
                "in graceful handoffs only (SIGTERM, no SIGKILL or SIGSTOP): worker {} began \
                 writing {name} slot {} with token {} at {:.3}s with {} writes in flight (limit \
                 {limit}), {} on its slot",
                c.worker,
                c.slot,
                c.token,
                at.s(c.at),
                c.holders,
                c.slot_holders
            )
        }),
    );
    list(
        sem.over_limit_outside.len(),
        "over-limit moments outside fault windows",
        &mut sem
            .over_limit_outside
            .iter()
            .map(|c| crowd(c, "more holders than the limit")),
    );
    list(
        sem.slot_twice_outside.len(),
        "slots held twice outside fault windows",
        &mut sem
            .slot_twice_outside
            .iter()
            .map(|c| crowd(c, "a slot held twice")),
    );
    lines
}

/// Print the semaphore key's figures.
fn print_sem(o: &Options, r: &Report, out: &mut String) {
    let s = &r.sem;
    say!(
        out,
        "semaphore {} (limit {}): operations {}; acquire timeouts {}; acquire errors {:?}; \
         releases not held {} (a grant the active did not know); release \
         errors {:?}",
        workers::SEM_NAME,
        o.workload.sem_limit,
        s.cycles,
        s.acquire_timeouts,
        s.acquire_errors,
        s.release_not_held,
        s.release_errors
    );
    say!(
        out,
        "semaphore fencing per slot: {} writes accepted, {} rejected (stale token for the slot; \
         by slot {:?}), {} stale tokens accepted",
        r.sem_accepted,
        r.sem_rejected,
        r.sem_rejected_by_slot,
        r.sem_stale_accepted
    );
    say!(
        out,
        "semaphore holders (writes in flight at the resource): at most {} at once; {} moments \
         over the limit ({} outside fault windows), {} moments a slot was held twice ({} \
         outside fault windows)",
        r.sem_most_in_flight,
        r.sem_over_limit,
        r.sem_over_limit_outside,
        r.sem_slot_twice,
        r.sem_slot_twice_outside
    );
    say!(
        out,
        "semaphore holders across handoffs: {} grants lost (release answered not held), {} \
         with no fault window from grant to release, {} in graceful handoffs only (SIGTERM, no \
         SIGKILL or SIGSTOP); {} crowds in graceful handoffs only",
        s.release_not_held,
        r.sem_lost_outside,
        r.sem_lost_graceful,
        r.sem_crowds_graceful
    );
}

/// Print the figures of the run.
#[allow(clippy::too_many_arguments)]
fn print_figures(
    o: &Options,
    planned: usize,
    r: &Report,
    at: &Timing,
    fencing: &Fencing,
    slow: usize,
    no_active: Option<(Duration, Instant)>,
    out: &mut String,
) {
    let w = &o.workload;
    let run_secs = r.ran_for.as_secs_f64().max(0.001);
    let grace = o.grace_flag();
    say!(
        out,
        "----- chaos report: seed {}, --promotion-grace {} -----",
        o.seed,
        grace.as_deref().unwrap_or("off")
    );
    let by_signal: Vec<String> = r.faults.iter().map(|(k, n)| format!("{k} {n}")).collect();
    say!(
        out,
        "ran {:.1}s; {} of {planned} planned episodes; faults injected: {} ({})",
        r.ran_for.as_secs_f64(),
        r.episodes_run,
        r.faults.values().sum::<u64>(),
        by_signal.join(", ")
    );
    say!(
        out,
        "operations (acquire, fenced write, release): {} ({:.0}/s); acquire timeouts {}; \
         acquire errors {:?}; releases not held {}; release errors {:?}",
        r.cycles,
        r.cycles as f64 / run_secs,
        r.acquire_timeouts,
        r.acquire_errors,
        r.release_not_held,
        r.release_errors
    );
    say!(
        out,
        "fault windows: from an episode's first action to the end of the first converged \
         monitor round after its last action, plus {:?}; {} windows, {:.1}s in all ({:.0}% of \
         the run)",
        check::WINDOW_MARGIN,
        at.windows.len(),
        r.windows_total.as_secs_f64(),
        100.0 * r.windows_total.as_secs_f64() / run_secs
    );
    say!(
        out,
        "fencing: {} writes accepted, {} rejected (stale token), {} rejected outside fault \
         windows, {} accepted below an earlier token, {} tokens granted twice",
        fencing.accepted,
        fencing.rejected,
        fencing.rejected_outside.len(),
        fencing.accepted_smaller.len(),
        fencing.duplicate_tokens.len()
    );
    say!(
        out,
        "overlapping critical sections: {} ({} outside fault windows), longest {:.1}ms",
        r.overlaps,
        r.overlaps_outside,
        r.longest_overlap.as_secs_f64() * 1000.0
    );
    say!(
        out,
        "calls: longest acquire {:.3}s (bound: wait + request timeout + {:?} = {:.3}s), longest \
         release {:.3}s (bound {:.3}s), {slow} over their bound",
        r.longest_acquire.as_secs_f64(),
        o.slack,
        workers::acquire_bound(w, o.slack).as_secs_f64(),
        r.longest_release.as_secs_f64(),
        workers::release_bound(w, o.slack).as_secs_f64(),
    );
    say!(
        out,
        "convergence: slowest after an episode {:.3}s; after the last fault {} (bound {:?})",
        r.slowest_convergence.as_secs_f64(),
        r.final_convergence
            .map_or("never".into(), |d| format!("{:.3}s", d.as_secs_f64())),
        CONVERGE_BOUND
    );
    say!(
        out,
        "longest time with no active (no node answering role=active state=active to I, polled \
         every {:?}): {:.3}s{}",
        monitor::POLL_EVERY,
        r.longest_no_active.as_secs_f64(),
        no_active.map_or(String::new(), |(_, t)| format!(" from {:.3}s", at.s(t)))
    );
}

/// Save the report, the fault log, the windows and the timeline in the
/// run's directory.
fn save_files(
    o: &Options,
    events: &[super::cluster::Event],
    samples: &[monitor::Sample],
    at: &Timing,
    out: &str,
) {
    let _ = std::fs::write(o.dir.join("report.txt"), out);
    let events_text: String = events
        .iter()
        .map(|e| {
            format!(
                "{:.3} episode {} node {} {} epoch {}\n",
                at.s(e.at),
                episode_name(e.episode),
                e.node,
                e.what,
                e.epoch
            )
        })
        .collect();
    let _ = std::fs::write(o.dir.join("events.log"), events_text);
    let windows_text: String = at
        .windows
        .iter()
        .map(|w| {
            let converged = w
                .converged
                .map_or("never".into(), |c| format!("{:.3}", at.s(c)));
            format!(
                "episode {} [{:.3}, {:.3}] converged {converged}\n",
                w.episode,
                at.s(w.from),
                at.s(w.to)
            )
        })
        .collect();
    let _ = std::fs::write(o.dir.join("windows.log"), windows_text);
    let mut timeline = monitor::timeline(samples);
    timeline.extend(events.iter().map(|e| {
        let line = format!(
            "---- node {} {} (episode {})",
            e.node,
            e.what,
            episode_name(e.episode)
        );
        (e.at, line)
    }));
    timeline.sort_by_key(|(t, _)| *t);
    let mut text = String::from(
        "# seconds, then what node 0, 1, 2 answered to I (A<n>: serving with n synced \
         standbys, H: handing off, S<i>: standby of node i, S-: standby of none, .: no \
         answer), then what the harness had done to each (Running, Stopped, Leaving, Down); \
         only rounds that differ from the one before, and the fault actions\n",
    );
    for (t, line) in &timeline {
        let _ = writeln!(text, "{:>9.3} {line}", at.s(*t));
    }
    let _ = std::fs::write(o.dir.join("timeline.log"), text);
}

/// The fault windows `t` falls in, as `#k (fault)`, or `NO fault window`.
fn windows_at(schedule: &[Episode], at: &Timing, t: Instant) -> String {
    let inside: Vec<String> = at
        .windows
        .iter()
        .filter(|w| w.contains(t))
        .map(|w| {
            let fault = schedule
                .get(w.episode)
                .map_or(String::new(), |e| e.fault.to_string());
            format!("#{} ({fault})", w.episode)
        })
        .collect();
    if inside.is_empty() {
        "NO fault window".to_string()
    } else {
        inside.join(", ")
    }
}

/// Save every moment the semaphore's resource had more writes in flight
/// than the limit, or a slot's twice, with the fault windows it began in,
/// as `sem-crowds.log` in the run's directory.
fn save_crowds(o: &Options, schedule: &[Episode], crowds: &[Crowd], at: &Timing) {
    let mut text = format!(
        "# seconds, the write that began (worker, slot, token), the writes then in flight \
         (limit {}) and on its slot, then the fault windows it began in\n",
        o.workload.sem_limit
    );
    for c in crowds {
        let _ = writeln!(
            text,
            "{:.3}: worker {} slot {} token {}: {} in flight, {} on the slot; in {}",
            at.s(c.at),
            c.worker,
            c.slot,
            c.token,
            c.holders,
            c.slot_holders,
            windows_at(schedule, at, c.at)
        );
    }
    let _ = std::fs::write(o.dir.join("sem-crowds.log"), text);
}

/// Save every overlap, with the fault windows it began in, as
/// `overlaps.log` in the run's directory.
fn save_overlaps(o: &Options, schedule: &[Episode], overlaps: &[Overlap], at: &Timing) {
    let mut text = String::from(
        "# key, then each worker's token and critical section [start, end] in seconds, then \
         the fault windows the overlap began in\n",
    );
    for ov in overlaps {
        let _ = writeln!(
            text,
            "{}: worker {} token {} [{:.3}, {:.3}], worker {} token {} [{:.3}, {:.3}]; in {}",
            workers::key_name(&o.workload, ov.first.key),
            ov.first.worker,
            ov.first.token,
            at.s(ov.first.start),
            at.s(ov.first.end),
            ov.second.worker,
            ov.second.token,
            at.s(ov.second.start),
            at.s(ov.second.end),
            windows_at(schedule, at, ov.start())
        );
    }
    let _ = std::fs::write(o.dir.join("overlaps.log"), text);
}
