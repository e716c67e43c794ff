//! The driver of a chaos run: it starts the cluster, the monitor and the
//! workers, plays the fault schedule on the nodes, waits for the cluster to
//! converge after each episode, and hands back everything recorded.
//!
//! Owns: the run's timeline on the caller's thread, and the threads it
//! starts (the monitor and the workers, all scoped: they are joined before
//! [`drive`] returns, and a guard sets their stop flag if anything panics).
//! "The active" and "a standby" of an episode are resolved here, from the
//! monitor's last round.
//!
//! Never does: judge the run (that is `check.rs` and `report.rs`), or wait
//! without a bound: every wait is a poll with a deadline.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::check::{CRASH, SETUP};
use super::cluster::{Cluster, Event, NODES, Status};
use super::monitor::{self, Level, Observed, Sample};
use super::schedule::{self, Episode, Fault, Gap};
use super::workers::{self, Resource, Resources, SemRecord, SemResource, WorkerLog, Write};
use super::{CONVERGE_BOUND, EXIT_BOUND, FINAL_QUIET, Options, SYNC_BOUND, TAIL, secs};

/// Everything a run recorded, for the checks.
pub struct Recorded {
    /// Time zero of every printed time.
    pub started: Instant,
    /// When the workers started and were told to stop.
    pub t0: Instant,
    pub t1: Instant,
    pub episodes_run: usize,
    /// The last fault action (a restart or SIGCONT), and when the cluster
    /// converged after it.
    pub last_action: Option<Instant>,
    pub final_converged: Option<Instant>,
    pub events: Vec<Event>,
    pub samples: Vec<Sample>,
    pub writes: Vec<Write>,
    pub sem: SemRecord,
    pub logs: Vec<WorkerLog>,
    pub findings: Findings,
}

/// Stops the workers and the monitor when dropped (also on panic).
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Wait until the monitor has seen a round at `level` (converged, or also
/// synced) that started at or after `epoch`; when that round ended.
pub fn wait_level(
    observed: &Mutex<Observed>,
    epoch: u64,
    level: Level,
    bound: Duration,
) -> Option<Instant> {
    let start = Instant::now();
    while start.elapsed() < bound {
        let seen = {
            let observed = observed.lock();
            match level {
                Level::Synced => observed.last_synced,
                _ => observed.last_converged,
            }
        };
        if let Some((e, at)) = seen
            && e >= epoch
        {
            return Some(at);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// The node the monitor last saw serving among the running ones (the
/// highest priority if several), else the first running node.
fn current_active(observed: &Mutex<Observed>, status: &[Status; NODES]) -> Option<usize> {
    let last = observed.lock().samples.last().copied();
    let running = |i: &usize| status[*i] == Status::Running;
    last.and_then(|s| (0..NODES).filter(running).find(|&i| s.nodes[i].serving))
        .or_else(|| (0..NODES).find(running))
}

/// The `which`-th running node other than `active`.
fn a_standby(status: &[Status; NODES], active: usize, which: u8) -> Option<usize> {
    let others: Vec<usize> = (0..NODES)
        .filter(|&i| i != active && status[i] == Status::Running)
        .collect();
    (!others.is_empty()).then(|| others[usize::from(which) % others.len()])
}

/// Play one episode's fault on the cluster; a line saying what was done.
fn play(
    cluster: &mut Cluster,
    observed: &Mutex<Observed>,
    k: usize,
    fault: Fault,
    failures: &mut Vec<String>,
) -> String {
    let status = cluster.status();
    let Some(active) = current_active(observed, &status) else {
        return "skipped: no node running".into();
    };
    let standby = |which| a_standby(&status, active, which);
    let mut terminate = |cluster: &mut Cluster, node: usize| -> String {
        match cluster.terminate(node, k, EXIT_BOUND) {
            Some((took, Some(0))) => format!("exited 0 after {:.3}s", took.as_secs_f64()),
            Some((took, code)) => {
                failures.push(format!(
                    "episode {k}: node {node} exited with {code:?} after SIGTERM ({:.3}s)",
                    took.as_secs_f64()
                ));
                format!("exited {code:?} after {:.3}s", took.as_secs_f64())
            }
            None => {
                failures.push(format!(
                    "episode {k}: node {node} did not exit within {EXIT_BOUND:?} of SIGTERM (killed)"
                ));
                "did not exit: killed".into()
            }
        }
    };
    match fault {
        Fault::KillActive { down } => {
            cluster.kill(active, k);
            std::thread::sleep(down);
            cluster.start(active, k);
            format!("SIGKILL node {active} (active), restarted")
        }
        Fault::KillStandby { which, down } => {
            let Some(node) = standby(which) else {
                return "skipped: no standby running".into();
            };
            cluster.kill(node, k);
            std::thread::sleep(down);
            cluster.start(node, k);
            format!("SIGKILL node {node} (standby), restarted")
        }
        Fault::KillTwo { which, down } => {
            let other = standby(which);
            cluster.kill(active, k);
            if let Some(node) = other {
                cluster.kill(node, k);
            }
            std::thread::sleep(down);
            cluster.start(active, k);
            if let Some(node) = other {
                cluster.start(node, k);
            }
            match other {
                Some(node) => {
                    format!("SIGKILL node {active} (active) and node {node} (standby), restarted")
                }
                None => format!("SIGKILL node {active} (active; no standby running), restarted"),
            }
        }
        Fault::StopActive { stopped } => {
            cluster.stop(active, k);
            std::thread::sleep(stopped);
            cluster.resume(active, k);
            format!("SIGSTOP node {active} (active), SIGCONT")
        }
        Fault::TermActive { down } => {
            let how = terminate(cluster, active);
            std::thread::sleep(down);
            cluster.start(active, k);
            format!("SIGTERM node {active} (active): {how}; restarted")
        }
        Fault::TermStandby { which, down } => {
            let Some(node) = standby(which) else {
                return "skipped: no standby running".into();
            };
            let how = terminate(cluster, node);
            std::thread::sleep(down);
            cluster.start(node, k);
            format!("SIGTERM node {node} (standby): {how}; restarted")
        }
    }
}

/// What did not come back after an episode.
#[derive(Default)]
pub struct Findings {
    /// Failed checks.
    pub failures: Vec<String>,
    /// Converged, but redundancy did not come back (see
    /// [`Options::require_sync`]).
    pub unsynced: Vec<String>,
}

/// Wait for convergence, then for redundancy, after the actions up to
/// `epoch`, the last of which was at `from`; append how long each took to
/// `line` and record what did not come. When the cluster converged.
fn settle(
    observed: &Mutex<Observed>,
    epoch: u64,
    from: Instant,
    what: &str,
    line: &mut String,
    findings: &mut Findings,
) -> Option<Instant> {
    let Some(converged) = wait_level(observed, epoch, Level::Converged, CONVERGE_BOUND) else {
        findings.failures.push(format!(
            "{what}: no convergence (one active, the first running node, the others \
             following it) within {CONVERGE_BOUND:?} of the last recovery action"
        ));
        let _ = write!(line, "NO convergence within {CONVERGE_BOUND:?}");
        return None;
    };
    let took = secs(from, converged);
    match wait_level(observed, epoch, Level::Synced, SYNC_BOUND) {
        Some(synced) => {
            let _ = write!(
                line,
                "converged {took:.3}s later, synced {:.3}s later",
                secs(from, synced)
            );
        }
        None => {
            let view = observed
                .lock()
                .samples
                .last()
                .map_or(String::new(), Sample::view);
            findings.unsynced.push(format!(
                "{what}: converged, but the active did not count every other running node \
                 as a synced standby within {SYNC_BOUND:?} more (last view: {view})"
            ));
            let _ = write!(line, "converged {took:.3}s later, NOT synced");
        }
    }
    Some(converged)
}

/// An episode index as printed.
pub fn episode_name(k: usize) -> String {
    match k {
        SETUP => "setup".into(),
        CRASH => "none: a crash".into(),
        k => k.to_string(),
    }
}

/// Record every node that exited without being told to (a crash).
fn note_crashes(cluster: &mut Cluster, findings: &mut Findings, out: &mut String) {
    for (node, status) in cluster.reap_crashed() {
        let what = format!(
            "node {node} exited by itself ({status}); see {}",
            cluster.log_path(node).display()
        );
        say!(out, "CRASH: {what}");
        findings.failures.push(what);
    }
}

/// Run the cluster, the workers and the schedule; print progress to `out`.
pub fn drive(o: &Options, schedule: &[Episode], out: &mut String) -> Recorded {
    let detect = format!("{:.3}", o.detect.as_secs_f64());
    let grace = o.grace_flag();
    let started = Instant::now();
    let ports = super::cluster::pick_ports(o.seed);
    let _ = std::fs::remove_dir_all(&o.dir);
    let mut cluster = Cluster::new(ports, &detect, grace.as_deref(), &o.dir, started);
    let stop = Arc::new(AtomicBool::new(false));
    let observed = Arc::new(Mutex::new(Observed::default()));
    let resources = Arc::new(Resources {
        keys: Resource::default(),
        sem: SemResource::new(o.workload.sem_limit),
    });
    let mut findings = Findings::default();

    let (logs, played) = std::thread::scope(|scope| {
        let _stop_guard = StopOnDrop(stop.clone());
        let (names, shared, seen, halt) = (
            cluster.names.clone(),
            cluster.shared.clone(),
            observed.clone(),
            stop.clone(),
        );
        std::thread::Builder::new()
            .name("chaos-monitor".into())
            .spawn_scoped(scope, move || {
                monitor::run(ports, names, shared, seen, halt)
            })
            .expect("spawn the monitor");
        start_cluster(&mut cluster, &observed, started, &mut findings, out);

        let t0 = Instant::now();
        let handles: Vec<_> = (0..o.workload.workers)
            .map(|i| {
                let (servers, workload, resources, halt) = (
                    cluster.names.clone(),
                    o.workload.clone(),
                    resources.clone(),
                    stop.clone(),
                );
                let (seed, slack) = (o.seed, o.slack);
                std::thread::Builder::new()
                    .name(format!("chaos-worker-{i}"))
                    .spawn_scoped(scope, move || {
                        workers::run(i as u16, seed, servers, workload, slack, resources, halt)
                    })
                    .expect("spawn a worker")
            })
            .collect();

        let mut played =
            play_schedule(o, schedule, &mut cluster, &observed, t0, &mut findings, out);
        let quiet_until = played.final_converged.unwrap_or_else(Instant::now) + FINAL_QUIET;
        let end = (t0 + o.duration).max(quiet_until);
        std::thread::sleep(end.saturating_duration_since(Instant::now()));
        note_crashes(&mut cluster, &mut findings, out);
        stop.store(true, Ordering::Relaxed);
        played.t0 = t0;
        played.t1 = Instant::now();
        let logs: Vec<WorkerLog> = handles
            .into_iter()
            .map(|h| h.join().expect("a worker panicked"))
            .collect();
        (logs, played)
    });
    let events = cluster.shared.lock().events.clone();
    drop(cluster);
    let samples = std::mem::take(&mut observed.lock().samples);
    Recorded {
        started,
        t0: played.t0,
        t1: played.t1,
        episodes_run: played.episodes_run,
        last_action: played.last_action,
        final_converged: played.final_converged,
        events,
        samples,
        writes: resources.keys.take_log(),
        sem: resources.sem.take(),
        logs,
        findings,
    }
}

/// Start every node and wait until they converge, synced.
fn start_cluster(
    cluster: &mut Cluster,
    observed: &Mutex<Observed>,
    started: Instant,
    findings: &mut Findings,
    out: &mut String,
) {
    for i in 0..NODES {
        cluster.start(i, SETUP);
    }
    let epoch = cluster.shared.lock().epoch;
    match wait_level(observed, epoch, Level::Synced, CONVERGE_BOUND) {
        Some(at) => say!(
            out,
            "[{:>8.3}s] cluster up: node 0 active, 1 and 2 its synced standbys",
            secs(started, at)
        ),
        None => {
            findings.failures.push(format!(
                "the cluster did not converge within {CONVERGE_BOUND:?} of its start"
            ));
            say!(
                out,
                "the cluster did not converge at start; see the node logs"
            );
        }
    }
}

/// How playing the schedule went.
struct Played {
    t0: Instant,
    t1: Instant,
    episodes_run: usize,
    last_action: Option<Instant>,
    final_converged: Option<Instant>,
}

/// Play the episodes that fit before the tail of the run, then wait for
/// the final convergence.
fn play_schedule(
    o: &Options,
    schedule: &[Episode],
    cluster: &mut Cluster,
    observed: &Mutex<Observed>,
    t0: Instant,
    findings: &mut Findings,
    out: &mut String,
) -> Played {
    let started = cluster.started;
    let fault_end = o.duration.saturating_sub(TAIL);
    std::thread::sleep(schedule::WARMUP);
    let mut ran = 0;
    for (k, episode) in schedule.iter().enumerate() {
        let Episode { gap, fault, .. } = *episode;
        let (Gap::Quiet(gap) | Gap::Chained(gap)) = gap;
        if t0.elapsed() + gap + fault.hold() > fault_end {
            say!(
                out,
                "[{:>8.3}s] out of time: episodes #{k}.. not run",
                secs(started, Instant::now())
            );
            break;
        }
        std::thread::sleep(gap);
        let at = Instant::now();
        let mut line = format!("[{:>8.3}s] #{k:<3} ", secs(started, at));
        line.push_str(&play(cluster, observed, k, fault, &mut findings.failures));
        ran += 1;
        let next_chained =
            matches!(schedule.get(k + 1), Some(e) if matches!(e.gap, Gap::Chained(_)));
        if next_chained {
            line.push_str("; next is chained");
        } else {
            line.push_str("; ");
            let (epoch, last) = last_action(cluster);
            let what = format!("episode {k} ({fault})");
            settle(observed, epoch, last, &what, &mut line, findings);
        }
        say!(out, "{line}");
        note_crashes(cluster, findings, out);
    }

    // After the last fault: one active, the first node, within a bound.
    if cluster.status().iter().any(|&s| s != Status::Running) {
        findings.failures.push(format!(
            "not every node was running at the end: {:?}",
            cluster.status()
        ));
    }
    let (epoch, last) = last_action(cluster);
    let mut line = format!(
        "[{:>8.3}s] after the last fault (at {:.3}s): ",
        secs(started, Instant::now()),
        secs(started, last)
    );
    let converged = settle(
        observed,
        epoch,
        last,
        "after the last fault",
        &mut line,
        findings,
    );
    say!(out, "{line}");
    Played {
        t0,
        t1: t0,
        episodes_run: ran,
        last_action: Some(last),
        final_converged: converged,
    }
}

/// The epoch and time of the last fault action.
fn last_action(cluster: &Cluster) -> (u64, Instant) {
    let shared = cluster.shared.lock();
    let at = shared.events.last().map_or(cluster.started, |e| e.at);
    (shared.epoch, at)
}
