//! The load generator: a few threads, each driving many non-blocking
//! connections with one `mio::Poll`, the same code for every system.
//!
//! Owns: one run of one workload against one server — connecting, the
//! per-slot closed loops (acquire → maybe hold → release → again), timers
//! (holds, Redis retries) on a `timerfd` so that sub-millisecond holds are
//! kept, the warmup / measure / drain phases, and recording into
//! `hdrhistogram`. A connection carries `depth` slots; each slot has at most
//! one request in flight, so depth is the pipeline depth. Only the wire
//! format (wire.rs) differs between systems, plus the one thing a Redis lock
//! must do by itself: retry `SET NX` after a jittered ~1 ms until its wait
//! runs out, where baton queues the request.
//!
//! A contended run may also log every grant of its key for the watch rows
//! (`RunSpec::changes`: the change's id and the time the request that made
//! it was sent), and against Redis publish that id on the key's channel
//! before releasing, as a holder that tells its watchers would.
//!
//! Bounds: each run ends at warmup + measure, then drains for at most
//! `drain` (no new acquires; held keys are released), and never sends more
//! than `MAX_REQUESTS_PER_RUN` requests.
//!
//! Never does: block on a socket, or record anything outside the measure
//! window.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use baton::server::trust::tls::Stream;
use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use parking_lot::Mutex;

use crate::wire::{self, Kind, Op, Proto};

/// Requests one run may send, over all its threads (a bound, not a goal).
const MAX_REQUESTS_PER_RUN: u64 = 200_000_000;
/// Errors a run tolerates before it gives up.
const MAX_ERRORS: u64 = 1000;
/// Bytes read per `read` call.
const READ_CHUNK: usize = 64 * 1024;
/// The longest a poll sleeps, so phase changes are seen on time.
const POLL_TICK: Duration = Duration::from_millis(2);
/// A Redis lock retries `SET NX` after this much, ± half (jitter).
pub const RETRY_MS: f64 = 1.0;
/// Largest latency recorded (ns); longer values are recorded as this.
const HIST_MAX_NS: u64 = 100_000_000_000;
/// The timerfd's poll token.
const TIMER: Token = Token(usize::MAX - 1);

/// What the slots of a run do.
#[derive(Clone, Copy, Debug)]
pub enum Workload {
    /// Each slot acquires a new random key from a large keyspace and releases
    /// it at once; `depth` slots per connection.
    Uncontended { depth: usize },
    /// Every connection on one key: acquire (long wait) → hold → release.
    Contended { hold: Duration },
    /// `keys` keys with `conns / keys` connections on each; nobody releases,
    /// so every grant ends by lease expiry, and the holder queues again at
    /// once. Measures expiry lateness.
    Expiry { keys: usize },
    /// Acquire `keys` distinct keys and keep them; `depth` in flight per
    /// connection; starts at once and ends when every key is held.
    Fill { keys: u64, depth: usize },
}

/// One change of a watched key, as the holder that made it saw it.
#[derive(Clone, Copy, Debug)]
pub struct Change {
    /// baton: the grant's token; Redis: the id the holder published.
    pub id: u64,
    /// When the request that made the change was sent: the release a
    /// handoff followed, else the acquire (Redis: the `PUBLISH`).
    pub cause: Instant,
    /// `cause` is inside the run's measure window.
    pub in_window: bool,
    /// Nobody was in line when the release before this grant was sent
    /// (its acquire was sent after that release; or it is the run's first
    /// grant): the key was free between the two grants, so a watcher may
    /// have been told it was free (a `0` line) in between. With one load
    /// thread the sends reach the server in this order, so a free spell
    /// is never taken for a handoff.
    pub after_free: bool,
}

/// The grants of a contended run's key, in order, for the watch rows.
pub type ChangeLog = Arc<Mutex<VecDeque<Change>>>;

/// The key every client of a contended run shares.
pub fn contended_key(key_prefix: &str) -> String {
    format!("{key_prefix}c")
}

/// One run.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub addr: SocketAddr,
    pub proto: Proto,
    pub conns: usize,
    pub workload: Workload,
    pub lease_ms: u64,
    pub wait_ms: u64,
    pub warmup: Duration,
    pub measure: Duration,
    pub drain: Duration,
    /// Prefix of every key of the run, so runs never share keys.
    pub key_prefix: String,
    pub threads: usize,
    /// The release script's SHA1 (Redis lock only).
    pub sha: Vec<u8>,
    pub seed: u64,
    /// Speak TLS (trusting this configuration's CAs, the server named
    /// 127.0.0.1): the handshake is done before the run starts.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Server processes whose CPU time is read over the measure window
    /// (the load generator's own is read too, last): the server measured
    /// first, then its standby or replica, if any.
    pub cpu_pids: Vec<u32>,
    /// Pin the load generator and the first of `cpu_pids` to separate
    /// cores for the run, the rest (a standby, a replica) beside the load
    /// generator (placement.rs); None: wherever the kernel puts them.
    pub split: Option<crate::placement::Split>,
    /// A semaphore's limit, sent with every acquire (baton: the limit
    /// field; the Redis semaphore: its script's argument). `None`: a mutex,
    /// and baton's acquire has no limit field.
    pub limit: Option<u32>,
    /// Contended runs: log every grant here (and against Redis, publish it).
    pub changes: Option<ChangeLog>,
}

/// What a run measured. Latencies are in nanoseconds.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Length of the measure window (a fill: until the last grant).
    pub secs: f64,
    /// Measure windows merged into this outcome (rounds).
    pub windows: u64,
    /// Acquire/release pairs completed in the window.
    pub pairs: u64,
    /// Grants received in the window.
    pub grants: u64,
    pub requests: u64,
    /// CPU seconds (user + system) over the measure window(s): one per
    /// `RunSpec::cpu_pids` entry, then the load generator's; empty when
    /// no pids were given or /proc could not be read.
    pub cpu: Vec<f64>,
    /// Of `cpu`, per `RunSpec::cpu_pids` entry: the seconds of its threads
    /// named `baton-repl` (baton's replication thread; 0 for Redis).
    pub repl_cpu: Vec<f64>,
    /// Redis `SET NX` answered nil, so retried.
    pub retries: u64,
    pub timeouts: u64,
    /// Releases answered "not held" (should be none).
    pub not_held: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// A grant received while another client held the key (contended).
    pub overlaps: u64,
    /// baton tokens that did not grow on a key.
    pub token_regressions: u64,
    /// Slots still busy when the drain bound ran out.
    pub unfinished: u64,
    /// Acquire sent (first attempt) → grant received.
    pub acquire: Histogram<u64>,
    /// Release sent → the next holder's grant received (contended).
    pub handoff: Histogram<u64>,
    /// Lease deadline → the next holder's grant received (expiry); a grant
    /// before the deadline is recorded as 0 and counted in `early`.
    pub lateness: Histogram<u64>,
    /// Expiry: grants received before (previous grant received + lease), and
    /// the most early one (ns).
    pub early: u64,
    pub early_max_ns: u64,
    /// Grants in the window per connection.
    pub per_client: Vec<u64>,
}

/// Add `more` to `total`, entry by entry (or take it, if `total` is empty).
fn add_secs(total: &mut Vec<f64>, more: &[f64]) {
    if total.is_empty() {
        total.extend_from_slice(more);
    } else if total.len() == more.len() {
        for (t, m) in total.iter_mut().zip(more) {
            *t += m;
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_NS, 3).expect("valid histogram bounds")
}

impl Outcome {
    pub fn new(clients: usize) -> Outcome {
        Outcome {
            secs: 0.0,
            windows: 1,
            pairs: 0,
            grants: 0,
            requests: 0,
            cpu: Vec::new(),
            repl_cpu: Vec::new(),
            retries: 0,
            timeouts: 0,
            not_held: 0,
            errors: 0,
            first_error: None,
            overlaps: 0,
            token_regressions: 0,
            unfinished: 0,
            acquire: histogram(),
            handoff: histogram(),
            lateness: histogram(),
            early: 0,
            early_max_ns: 0,
            per_client: vec![0; clients],
        }
    }

    /// Add another thread's or round's outcome (windows add up: rates stay
    /// rates).
    pub fn merge(&mut self, other: &Outcome, same_window: bool) {
        if same_window {
            self.secs = self.secs.max(other.secs);
        } else {
            self.secs += other.secs;
            self.windows += other.windows;
        }
        self.pairs += other.pairs;
        self.grants += other.grants;
        self.requests += other.requests;
        if !same_window {
            // Rounds: CPU seconds add up like the windows do.
            add_secs(&mut self.cpu, &other.cpu);
            add_secs(&mut self.repl_cpu, &other.repl_cpu);
        }
        self.retries += other.retries;
        self.timeouts += other.timeouts;
        self.not_held += other.not_held;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
        self.overlaps += other.overlaps;
        self.token_regressions += other.token_regressions;
        self.unfinished += other.unfinished;
        self.acquire
            .add(&other.acquire)
            .expect("same histogram bounds");
        self.handoff
            .add(&other.handoff)
            .expect("same histogram bounds");
        self.lateness
            .add(&other.lateness)
            .expect("same histogram bounds");
        self.early += other.early;
        self.early_max_ns = self.early_max_ns.max(other.early_max_ns);
        if self.per_client.len() < other.per_client.len() {
            self.per_client.resize(other.per_client.len(), 0);
        }
        for (mine, theirs) in self.per_client.iter_mut().zip(&other.per_client) {
            *mine += theirs;
        }
    }
}

/// Run one workload against one server and return what it measured.
pub fn run(spec: &RunSpec) -> Result<Outcome, String> {
    let threads = spec.threads.clamp(1, spec.conns.max(1));
    let keys = match spec.workload {
        Workload::Contended { .. } => 1,
        Workload::Expiry { keys } => keys,
        _ => 0,
    };
    let shared = Arc::new(Mutex::new(vec![KeyShared::default(); keys]));
    // Pinned before the load threads start (they inherit it), let go when
    // the run returns.
    let _pinned = match &spec.split {
        Some(split) => Some(
            split
                .apply(
                    spec.cpu_pids.get(..1).unwrap_or_default(),
                    spec.cpu_pids.get(1..).unwrap_or_default(),
                )
                .map_err(|e| format!("cannot pin the run to {}: {e}", split.describe()))?,
        ),
        None => None,
    };
    let mut streams = Vec::with_capacity(spec.conns);
    for _ in 0..spec.conns {
        streams.push(connect(spec.addr, spec.tls.as_ref())?);
    }
    let total_slots = spec.conns * slots_per_conn(spec.workload);
    let mut workers = Vec::with_capacity(threads);
    let mut first_conn = 0;
    for t in 0..threads {
        let end = (t + 1) * spec.conns / threads;
        let mine: Vec<_> = streams.drain(..end - first_conn).collect();
        workers.push(Worker::new(
            spec,
            shared.clone(),
            first_conn,
            mine,
            total_slots,
            t as u64,
        )?);
        first_conn = end;
    }
    let t0 = Instant::now() + Duration::from_millis(5);
    // Every run reads the load generator's own CPU (is it what bounds the
    // row?); the deployed rows the servers' too.
    let sampler = (!matches!(spec.workload, Workload::Fill { .. })).then(|| {
        let pids = spec.cpu_pids.clone();
        let (from, to) = (t0 + spec.warmup, t0 + spec.warmup + spec.measure);
        std::thread::spawn(move || cpu_over(&pids, from, to))
    });
    let handles: Vec<_> = workers
        .into_iter()
        .map(|worker| std::thread::spawn(move || worker.run(t0)))
        .collect();
    let mut outcome = Outcome::new(spec.conns);
    let mut failure = None;
    for handle in handles {
        match handle.join() {
            Ok(Ok(part)) => outcome.merge(&part, true),
            Ok(Err(e)) => failure = Some(e),
            Err(_) => failure = Some("a load thread panicked".to_string()),
        }
    }
    if let Some(sampler) = sampler {
        (outcome.cpu, outcome.repl_cpu) = sampler.join().unwrap_or_default();
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(outcome),
    }
}

/// CPU seconds (user + system, all threads) each of `pids`, then this
/// process (the load generator), used between `from` and `to`; and of
/// each of `pids`, its replication thread's (`REPL_THREAD`). Empty if
/// /proc cannot be read.
fn cpu_over(pids: &[u32], from: Instant, to: Instant) -> (Vec<f64>, Vec<f64>) {
    let read = || -> Option<(Vec<u64>, Vec<u64>)> {
        let mut ticks = pids
            .iter()
            .map(|pid| cpu_ticks(&format!("/proc/{pid}/stat")))
            .collect::<Option<Vec<_>>>()?;
        ticks.push(cpu_ticks("/proc/self/stat")?);
        let repl = pids
            .iter()
            .map(|&pid| thread_ticks(pid, REPL_THREAD))
            .collect();
        Some((ticks, repl))
    };
    let sleep_until = |at: Instant| {
        if let Some(wait) = at.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    };
    sleep_until(from);
    let Some(before) = read() else {
        return (Vec::new(), Vec::new());
    };
    sleep_until(to);
    let Some(after) = read() else {
        return (Vec::new(), Vec::new());
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let secs = |b: &[u64], a: &[u64]| -> Vec<f64> {
        b.iter()
            .zip(a)
            .map(|(b, a)| a.saturating_sub(*b) as f64 / hz)
            .collect()
    };
    (secs(&before.0, &after.0), secs(&before.1, &after.1))
}

/// The name batond gives its replication thread.
const REPL_THREAD: &str = "baton-repl";

/// utime + stime of the threads of process `pid` named `name` (0 if none).
fn thread_ticks(pid: u32, name: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .filter_map(|task| cpu_ticks(&task.path().join("stat").to_string_lossy()))
        .sum()
}

/// utime + stime of a process, in clock ticks, from its /proc stat line.
pub(crate) fn cpu_ticks(path: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(path).ok()?;
    // The command name (field 2) may hold spaces: count from its ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state is field 3, so utime (14) and stime (15) are 11, 12.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn slots_per_conn(workload: Workload) -> usize {
    match workload {
        Workload::Uncontended { depth } | Workload::Fill { depth, .. } => depth.max(1),
        Workload::Contended { .. } | Workload::Expiry { .. } => 1,
    }
}

fn connect(addr: SocketAddr, tls: Option<&Arc<rustls::ClientConfig>>) -> Result<Stream, String> {
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    stream
        .set_nodelay(true)
        .map_err(|e| format!("{addr}: {e}"))?;
    // TLS: the whole handshake first, blocking, so that the run measures
    // requests only; then the same non-blocking loop drives the session.
    let session = match tls {
        Some(config) => {
            let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
            let mut conn = rustls::ClientConnection::new(config.clone(), name)
                .map_err(|e| format!("{addr}: tls: {e}"))?;
            stream
                .set_read_timeout(Some(Duration::from_secs(5)))
                .map_err(|e| format!("{addr}: {e}"))?;
            while conn.is_handshaking() {
                conn.complete_io(&mut stream)
                    .map_err(|e| format!("{addr}: tls handshake: {e}"))?;
            }
            Some(conn)
        }
        None => None,
    };
    stream
        .set_nonblocking(true)
        .map_err(|e| format!("{addr}: {e}"))?;
    let sock = TcpStream::from_std(stream);
    Ok(match session {
        Some(conn) => Stream::tls(sock, conn),
        None => Stream::Plain(sock),
    })
}

/// What every client knows about a shared key (contended and expiry runs).
#[derive(Clone, Debug, Default)]
struct KeyShared {
    /// Contended: grants received and not yet released.
    holders: u32,
    /// Contended: releases sent that no grant followed yet, oldest first
    /// (each grant after one is the handoff it made; FIFO, as the server's
    /// line is).
    releases: VecDeque<Instant>,
    granted_at: Option<Instant>,
    last_token: u64,
}

/// Releases remembered per key: far more than any limit the rows use.
const MAX_RELEASES: usize = 1024;

/// Ids of published changes (Redis watch rows), over every run.
static NEXT_CHANGE: AtomicU64 = AtomicU64::new(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Acquiring,
    /// Redis: waiting to retry `SET NX`.
    Backoff,
    Holding,
    Releasing,
    Done,
}

struct Slot {
    conn: u32,
    /// The connection's run-wide index (fairness is counted per client).
    client: u32,
    /// The shared key (contended, expiry).
    group: usize,
    key: Vec<u8>,
    state: State,
    token: u64,
    /// The token as sent back in a release (and, for Redis, in the `SET`).
    token_text: wire::TokenText,
    /// When the first attempt of the current acquire was sent.
    started: Instant,
    timer_at: Option<Instant>,
    /// Fill: the next key index, and the end of this slot's range.
    next_fill: u64,
    end_fill: u64,
}

struct Conn {
    stream: Stream,
    out: Vec<u8>,
    written: usize,
    /// An unfinished answer carried over to the next read.
    partial: Vec<u8>,
    /// Requests in flight, in the order sent: (slot, op).
    pending: VecDeque<(u32, Op)>,
    dirty: bool,
}

/// The run's phase boundaries.
#[derive(Clone, Copy)]
struct Phases {
    measure_start: Instant,
    measure_end: Instant,
    drain_end: Instant,
}

struct Worker {
    proto: Proto,
    workload: Workload,
    /// Grants a key may have at once (1 without a limit).
    limit: u32,
    limit_field: Option<u32>,
    changes: Option<ChangeLog>,
    lease_ms: u64,
    wait_ms: u64,
    warmup: Duration,
    measure: Duration,
    drain: Duration,
    prefix: Vec<u8>,
    sha: Vec<u8>,
    poll: Poll,
    timerfd: OwnedFd,
    armed: Option<Instant>,
    conns: Vec<Conn>,
    slots: Vec<Slot>,
    dirty: Vec<u32>,
    timers: BinaryHeap<Reverse<(Instant, u32)>>,
    shared: Arc<Mutex<Vec<KeyShared>>>,
    rng: u64,
    token_counter: u64,
    request_cap: u64,
    active: usize,
    draining: bool,
    phases: Phases,
    last_grant: Option<Instant>,
    scratch: Box<[u8]>,
    out: Outcome,
}

impl Worker {
    fn new(
        spec: &RunSpec,
        shared: Arc<Mutex<Vec<KeyShared>>>,
        first_conn: usize,
        streams: Vec<Stream>,
        total_slots: usize,
        thread: u64,
    ) -> Result<Worker, String> {
        let poll = Poll::new().map_err(|e| format!("poll: {e}"))?;
        let timerfd = timerfd().map_err(|e| format!("timerfd: {e}"))?;
        poll.registry()
            .register(
                &mut SourceFd(&timerfd.as_raw_fd()),
                TIMER,
                Interest::READABLE,
            )
            .map_err(|e| format!("register timerfd: {e}"))?;
        let per_conn = slots_per_conn(spec.workload);
        let now = Instant::now();
        let contended_key = contended_key(&spec.key_prefix);
        let mut conns = Vec::with_capacity(streams.len());
        let mut slots = Vec::with_capacity(streams.len() * per_conn);
        for (i, mut stream) in streams.into_iter().enumerate() {
            poll.registry()
                .register(
                    &mut stream,
                    Token(i),
                    Interest::READABLE | Interest::WRITABLE,
                )
                .map_err(|e| format!("register: {e}"))?;
            conns.push(Conn {
                stream,
                out: Vec::with_capacity(4096),
                written: 0,
                partial: Vec::new(),
                pending: VecDeque::with_capacity(2 * per_conn),
                dirty: false,
            });
            let client = first_conn + i;
            for d in 0..per_conn {
                let global = (client * per_conn + d) as u64;
                let (group, key, next_fill, end_fill) = match spec.workload {
                    Workload::Contended { .. } => (0, contended_key.clone(), 0, 0),
                    Workload::Expiry { keys } => {
                        let group = client % keys.max(1);
                        (group, format!("{}e{group}", spec.key_prefix), 0, 0)
                    }
                    Workload::Fill { keys, .. } => {
                        let total = total_slots as u64;
                        (
                            0,
                            String::new(),
                            global * keys / total,
                            (global + 1) * keys / total,
                        )
                    }
                    Workload::Uncontended { .. } => (0, String::new(), 0, 0),
                };
                slots.push(Slot {
                    conn: i as u32,
                    client: client as u32,
                    group,
                    key: key.into_bytes(),
                    state: State::Done,
                    token: 0,
                    token_text: wire::TokenText::default(),
                    started: now,
                    timer_at: None,
                    next_fill,
                    end_fill,
                });
            }
        }
        let active = slots.len();
        Ok(Worker {
            proto: spec.proto,
            workload: spec.workload,
            limit: spec.limit.unwrap_or(1).max(1),
            limit_field: spec.limit,
            changes: spec.changes.clone(),
            lease_ms: spec.lease_ms,
            wait_ms: spec.wait_ms,
            warmup: spec.warmup,
            measure: spec.measure,
            drain: spec.drain,
            prefix: spec.key_prefix.clone().into_bytes(),
            sha: spec.sha.clone(),
            poll,
            timerfd,
            armed: None,
            conns,
            slots,
            dirty: Vec::new(),
            timers: BinaryHeap::new(),
            shared,
            rng: (spec.seed ^ (thread + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1,
            token_counter: 0,
            request_cap: MAX_REQUESTS_PER_RUN / spec.threads.max(1) as u64,
            active,
            draining: false,
            phases: Phases {
                measure_start: now,
                measure_end: now,
                drain_end: now,
            },
            last_grant: None,
            scratch: vec![0; READ_CHUNK].into_boxed_slice(),
            out: Outcome::new(spec.conns),
        })
    }

    fn is_fill(&self) -> bool {
        matches!(self.workload, Workload::Fill { .. })
    }

    fn run(mut self, t0: Instant) -> Result<Outcome, String> {
        if let Some(wait) = t0.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let start = Instant::now();
        let warmup = if self.is_fill() {
            Duration::ZERO
        } else {
            self.warmup
        };
        self.phases = Phases {
            measure_start: start + warmup,
            measure_end: start + warmup + self.measure,
            drain_end: start + warmup + self.measure + self.drain,
        };
        for s in 0..self.slots.len() {
            self.slots[s].state = State::Acquiring;
            self.start_acquire(s, start);
        }
        let mut events = Events::with_capacity(1024);
        loop {
            let now = Instant::now();
            if !self.draining
                && (now >= self.phases.measure_end || self.out.requests >= self.request_cap)
            {
                if self.is_fill() {
                    return Err(format!(
                        "fill did not finish within {:?} ({} keys held)",
                        self.measure, self.out.grants
                    ));
                }
                self.start_drain(now);
            }
            if self.active == 0 || (self.draining && now >= self.phases.drain_end) {
                break;
            }
            self.fire_timers(now);
            self.flush_dirty()?;
            self.arm_timer(now)?;
            if let Err(e) = self.poll.poll(&mut events, Some(POLL_TICK))
                && e.kind() != io::ErrorKind::Interrupted
            {
                return Err(format!("poll: {e}"));
            }
            for event in events.iter() {
                match event.token() {
                    TIMER => self.clear_timer(),
                    Token(i) => {
                        if event.is_writable() {
                            self.mark_dirty(i as u32);
                        }
                        if event.is_readable() || event.is_read_closed() || event.is_error() {
                            self.read_conn(i)?;
                        }
                    }
                }
            }
            if self.out.errors > MAX_ERRORS {
                return Err(format!(
                    "too many errors; the first: {}",
                    self.out.first_error.as_deref().unwrap_or("?")
                ));
            }
        }
        self.out.unfinished = self.active as u64;
        self.out.secs = if self.is_fill() {
            self.last_grant.map_or(0.0, |t| {
                t.duration_since(self.phases.measure_start).as_secs_f64()
            })
        } else {
            self.measure.as_secs_f64()
        };
        Ok(self.out)
    }

    fn in_window(&self, now: Instant) -> bool {
        now >= self.phases.measure_start && now < self.phases.measure_end
    }

    /// Stop starting acquires; let what is in flight finish; release what is
    /// held.
    fn start_drain(&mut self, now: Instant) {
        self.draining = true;
        for s in 0..self.slots.len() {
            match (self.slots[s].state, self.workload) {
                (State::Done, _) => {}
                // Nothing held (expiry holders never release; leases end it).
                (_, Workload::Expiry { .. }) | (State::Backoff, _) => self.finish(s),
                (State::Holding, _) => {
                    self.slots[s].timer_at = None;
                    self.release(s, now);
                }
                (State::Acquiring | State::Releasing, _) => {}
            }
        }
    }

    fn finish(&mut self, s: usize) {
        let slot = &mut self.slots[s];
        if slot.state != State::Done {
            slot.state = State::Done;
            slot.timer_at = None;
            self.active -= 1;
        }
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A new acquire on the slot: pick its key, then send it.
    fn start_acquire(&mut self, s: usize, now: Instant) {
        match self.workload {
            Workload::Uncontended { .. } => {
                let r = self.next_random() % 1_000_000_000;
                let slot = &mut self.slots[s];
                slot.key.clear();
                slot.key.extend_from_slice(&self.prefix);
                let mut text = [0u8; 20];
                slot.key.extend_from_slice(wire::decimal(r, &mut text));
            }
            Workload::Fill { .. } => {
                let slot = &mut self.slots[s];
                if slot.next_fill >= slot.end_fill {
                    self.finish(s);
                    return;
                }
                slot.key.clear();
                slot.key.extend_from_slice(&self.prefix);
                let mut text = [0u8; 20];
                slot.key
                    .extend_from_slice(wire::decimal(slot.next_fill, &mut text));
                slot.next_fill += 1;
            }
            Workload::Contended { .. } | Workload::Expiry { .. } => {}
        }
        if !self.proto.server_tokens() {
            self.token_counter += 1;
            let token = (u64::from(self.slots[s].client) << 40) | self.token_counter;
            self.slots[s].token = token;
            // The echo's release carries the token its grant (an `Ack`)
            // stood for: 1, as it always has (so the floor stays the floor
            // it was); Redis's the token its `SET` stored.
            self.slots[s].token_text = if self.proto == Proto::Echo {
                wire::TokenText::of(1)
            } else {
                wire::TokenText::of(token)
            };
        }
        self.slots[s].started = now;
        self.send_acquire(s);
    }

    fn send_acquire(&mut self, s: usize) {
        let slot = &mut self.slots[s];
        let conn = &mut self.conns[slot.conn as usize];
        wire::write_acquire_limited(
            self.proto,
            &mut conn.out,
            &slot.key,
            &slot.token_text,
            self.lease_ms,
            self.wait_ms,
            self.limit_field,
            &self.sha,
        );
        conn.pending.push_back((s as u32, Op::Acquire));
        slot.state = State::Acquiring;
        self.out.requests += 1;
        let c = slot.conn;
        self.mark_dirty(c);
    }

    fn release(&mut self, s: usize, now: Instant) {
        let slot = &mut self.slots[s];
        let conn = &mut self.conns[slot.conn as usize];
        wire::write_release(
            self.proto,
            &mut conn.out,
            &slot.key,
            &slot.token_text,
            &self.sha,
        );
        conn.pending.push_back((s as u32, Op::Release));
        slot.state = State::Releasing;
        self.out.requests += 1;
        let (c, group) = (slot.conn, slot.group);
        if let Workload::Contended { .. } = self.workload {
            let mut keys = self.shared.lock();
            let key = &mut keys[group];
            key.holders = key.holders.saturating_sub(1);
            if key.releases.len() >= MAX_RELEASES {
                key.releases.pop_front();
            }
            key.releases.push_back(now);
        }
        self.mark_dirty(c);
    }

    fn on_granted(&mut self, s: usize, token: u64, now: Instant) {
        let in_window = self.in_window(now);
        self.last_grant = Some(now);
        let slot = &mut self.slots[s];
        slot.token = token;
        if in_window {
            self.out.grants += 1;
            self.out.per_client[slot.client as usize] += 1;
            let waited = now.duration_since(slot.started).as_nanos() as u64;
            self.out.acquire.saturating_record(waited.max(1));
        }
        let (group, started) = (slot.group, slot.started);
        match self.workload {
            Workload::Contended { hold } => {
                let handoff = self.note_shared_grant(group, token, started, now, in_window);
                if self.changes.is_some() {
                    self.log_change(s, token, handoff, started, now);
                }
                if hold.is_zero() || self.draining {
                    self.release(s, now);
                } else {
                    self.slots[s].state = State::Holding;
                    self.set_timer(s, now + hold);
                }
            }
            Workload::Expiry { .. } => {
                self.note_shared_grant(group, token, started, now, in_window);
                if self.draining {
                    self.finish(s);
                } else {
                    // Queue again at once: the next grant comes by expiry.
                    self.start_acquire(s, now);
                }
            }
            Workload::Uncontended { .. } => self.release(s, now),
            Workload::Fill { .. } => self.start_acquire(s, now),
        }
    }

    /// The watch rows: log the grant; against Redis, publish its id on the
    /// key's channel (before the release the caller sends next).
    /// `handoff`: the release this grant was the handoff of, if it was one
    /// (else the key was free and `started`, the acquire, made it).
    fn log_change(
        &mut self,
        s: usize,
        token: u64,
        handoff: Option<Instant>,
        started: Instant,
        now: Instant,
    ) {
        let Some(log) = self.changes.clone() else {
            return;
        };
        let cause = handoff.unwrap_or(started);
        let (id, cause) = if self.proto.server_tokens() {
            (token, cause)
        } else {
            let id = NEXT_CHANGE.fetch_add(1, Ordering::Relaxed);
            let slot = &self.slots[s];
            let conn = &mut self.conns[slot.conn as usize];
            wire::write_publish(&mut conn.out, &slot.key, id);
            conn.pending.push_back((s as u32, Op::Publish));
            self.out.requests += 1;
            let c = slot.conn;
            self.mark_dirty(c);
            (id, now)
        };
        let in_window = self.in_window(cause);
        log.lock().push_back(Change {
            id,
            cause,
            in_window,
            after_free: handoff.is_none(),
        });
    }

    /// Contended and expiry bookkeeping on the shared key. Contended: the
    /// release this grant was the handoff of (sent after the acquire), if
    /// it was one.
    fn note_shared_grant(
        &mut self,
        group: usize,
        token: u64,
        started: Instant,
        now: Instant,
        in_window: bool,
    ) -> Option<Instant> {
        let contended = matches!(self.workload, Workload::Contended { .. });
        let lease = Duration::from_millis(self.lease_ms);
        let mut keys = self.shared.lock();
        let key = &mut keys[group];
        let mut handoff = None;
        if contended {
            if key.holders >= self.limit {
                self.out.overlaps += 1;
            }
            key.holders += 1;
            // A handoff: this acquire was already waiting when the release
            // was sent.
            handoff = key.releases.pop_front().filter(|&sent| sent >= started);
        }
        if self.proto.server_tokens() {
            if token <= key.last_token {
                self.out.token_regressions += 1;
            }
            key.last_token = key.last_token.max(token);
        }
        if in_window {
            if contended {
                if let Some(sent) = handoff {
                    let ns = now.duration_since(sent).as_nanos() as u64;
                    self.out.handoff.saturating_record(ns.max(1));
                }
            } else if let Some(prev) = key.granted_at {
                let deadline = prev + lease;
                let late = now.saturating_duration_since(deadline).as_nanos() as u64;
                self.out.lateness.saturating_record(late.max(1));
                if now < deadline {
                    self.out.early += 1;
                    let early = deadline.duration_since(now).as_nanos() as u64;
                    self.out.early_max_ns = self.out.early_max_ns.max(early);
                }
            }
        }
        key.granted_at = Some(now);
        handoff
    }

    /// Redis: `SET NX` found the key held. Retry after a jittered ~1 ms while
    /// the wait lasts.
    fn on_busy(&mut self, s: usize, now: Instant) {
        self.out.retries += 1;
        if self.draining {
            self.finish(s);
            return;
        }
        let jitter = (self.next_random() % 1000) as f64 / 1000.0; // [0, 1)
        let delay = Duration::from_secs_f64(RETRY_MS * (0.5 + jitter) / 1000.0);
        let waited = now.duration_since(self.slots[s].started) + delay;
        if self.wait_ms != 0 && waited > Duration::from_millis(self.wait_ms) {
            self.out.timeouts += 1;
            self.start_acquire(s, now);
            return;
        }
        self.slots[s].state = State::Backoff;
        self.set_timer(s, now + delay);
    }

    fn on_released(&mut self, s: usize, now: Instant) {
        if self.in_window(now) {
            self.out.pairs += 1;
        }
        if self.draining {
            self.finish(s);
        } else {
            self.start_acquire(s, now);
        }
    }

    fn on_acquire_failed(&mut self, s: usize, now: Instant) {
        if self.draining || self.is_fill() && self.out.errors > 0 {
            self.finish(s);
        } else {
            self.start_acquire(s, now);
        }
    }

    fn note_error(&mut self, text: &[u8]) {
        self.out.errors += 1;
        if self.out.first_error.is_none() {
            self.out.first_error = Some(String::from_utf8_lossy(text).into_owned());
        }
    }

    fn handle_reply(
        &mut self,
        s: usize,
        op: Op,
        reply: &wire::Reply<'_>,
        now: Instant,
    ) -> Result<(), String> {
        let (kind, text) = (wire::in_answer_to(self.proto, op, reply.kind), reply.text);
        match (op, kind) {
            (Op::Acquire, Kind::Granted(token)) => {
                let token = if self.proto.server_tokens() {
                    self.slots[s].token_text = wire::TokenText::of_grant(text);
                    token
                } else {
                    self.slots[s].token
                };
                self.on_granted(s, token, now);
            }
            (Op::Acquire, Kind::Ack) => self.on_granted(s, 1, now),
            (Op::Acquire, Kind::Busy) => self.on_busy(s, now),
            (Op::Acquire, Kind::TimedOut) => {
                self.out.timeouts += 1;
                self.on_acquire_failed(s, now);
            }
            (Op::Release, Kind::Released | Kind::Ack) => self.on_released(s, now),
            (Op::Release, Kind::NotHeld) => {
                self.out.not_held += 1;
                self.on_released(s, now);
            }
            (Op::Acquire, Kind::Error) => {
                self.note_error(text);
                self.on_acquire_failed(s, now);
            }
            (Op::Release, Kind::Error) => {
                self.note_error(text);
                self.on_released(s, now);
            }
            // A `PUBLISH`'s count of receivers: nothing to do.
            (Op::Publish, Kind::Ack | Kind::Released | Kind::NotHeld) => {}
            (Op::Publish, Kind::Error) => self.note_error(text),
            (op, kind) => {
                return Err(format!(
                    "answer {kind:?} ({:?}) to {op:?}",
                    String::from_utf8_lossy(text)
                ));
            }
        }
        Ok(())
    }

    /// Which in-flight request an answer belongs to: the oldest one for
    /// in-order systems; for baton the oldest with the answer's (op, key).
    fn match_pending(
        &mut self,
        c: usize,
        op: Option<Op>,
        key: Option<&[u8]>,
        text: &[u8],
    ) -> Result<(usize, Op), String> {
        let conn = &mut self.conns[c];
        let index = if self.proto.in_order() {
            (!conn.pending.is_empty()).then_some(0)
        } else {
            let slots = &self.slots;
            conn.pending
                .iter()
                .position(|&(s, o)| Some(o) == op && Some(slots[s as usize].key.as_slice()) == key)
        };
        let Some(index) = index else {
            return Err(format!(
                "answer {:?} matches no request in flight",
                String::from_utf8_lossy(text)
            ));
        };
        let (s, sent_op) = conn.pending.remove(index).expect("index is in range");
        if op.is_some_and(|op| op != sent_op) {
            return Err(format!(
                "answer {:?} to a {sent_op:?}",
                String::from_utf8_lossy(text)
            ));
        }
        Ok((s as usize, sent_op))
    }

    /// Read everything the connection has and act on each whole answer.
    fn read_conn(&mut self, c: usize) -> Result<(), String> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let result = self.read_conn_into(c, &mut scratch);
        self.scratch = scratch;
        result
    }

    fn read_conn_into(&mut self, c: usize, scratch: &mut [u8]) -> Result<(), String> {
        loop {
            let n = match self.conns[c].stream.read(scratch) {
                Ok(0) => return Err("the server closed a connection".to_string()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("read: {e}")),
            };
            let now = Instant::now();
            let mut partial = std::mem::take(&mut self.conns[c].partial);
            if partial.is_empty() {
                let used = self.take_answers(c, &scratch[..n], now)?;
                partial.extend_from_slice(&scratch[used..n]);
            } else {
                partial.extend_from_slice(&scratch[..n]);
                let used = self.take_answers(c, &partial, now)?;
                partial.drain(..used);
            }
            self.conns[c].partial = partial;
            if n < scratch.len() && !self.conns[c].stream.is_tls() {
                // A short read drained the socket; new data raises a new
                // edge, so the extra read that would say WouldBlock is saved.
                return Ok(());
            }
        }
    }

    fn take_answers(&mut self, c: usize, input: &[u8], now: Instant) -> Result<usize, String> {
        let mut used = 0;
        while let Some(reply) =
            wire::parse_reply(self.proto, &input[used..]).map_err(|e| e.to_string())?
        {
            used += reply.used;
            if reply.kind == Kind::Error && reply.op.is_none() && !self.proto.in_order() {
                return Err(format!(
                    "server refused the connection: {}",
                    String::from_utf8_lossy(reply.text)
                ));
            }
            let (s, op) = self.match_pending(c, reply.op, reply.key, reply.text)?;
            self.handle_reply(s, op, &reply, now)?;
        }
        Ok(used)
    }

    fn mark_dirty(&mut self, c: u32) {
        let conn = &mut self.conns[c as usize];
        if !conn.dirty {
            conn.dirty = true;
            self.dirty.push(c);
        }
    }

    fn flush_dirty(&mut self) -> Result<(), String> {
        for c in std::mem::take(&mut self.dirty) {
            let conn = &mut self.conns[c as usize];
            conn.dirty = false;
            while conn.written < conn.out.len() {
                match conn.stream.write(&conn.out[conn.written..]) {
                    Ok(0) => return Err("write: connection closed".to_string()),
                    Ok(n) => conn.written += n,
                    // The WRITABLE event marks it dirty again.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(format!("write: {e}")),
                }
            }
            if conn.written == conn.out.len() {
                conn.out.clear();
                conn.written = 0;
            }
            // TLS records the socket did not take yet.
            conn.stream.push_tls().map_err(|e| format!("write: {e}"))?;
        }
        Ok(())
    }

    fn set_timer(&mut self, s: usize, at: Instant) {
        self.slots[s].timer_at = Some(at);
        self.timers.push(Reverse((at, s as u32)));
    }

    fn fire_timers(&mut self, now: Instant) {
        while let Some(&Reverse((at, s))) = self.timers.peek() {
            if at > now {
                return;
            }
            self.timers.pop();
            let s = s as usize;
            if self.slots[s].timer_at != Some(at) {
                continue;
            }
            self.slots[s].timer_at = None;
            match self.slots[s].state {
                State::Backoff => self.send_acquire(s),
                State::Holding => self.release(s, now),
                _ => {}
            }
        }
    }

    /// Point the timerfd at the earliest timer (one syscall, only when it
    /// changes).
    fn arm_timer(&mut self, now: Instant) -> Result<(), String> {
        let Some(&Reverse((at, _))) = self.timers.peek() else {
            return Ok(());
        };
        if self.armed.is_some_and(|armed| armed <= at) {
            return Ok(());
        }
        let delay = at
            .saturating_duration_since(now)
            .max(Duration::from_micros(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: delay.as_secs() as libc::time_t,
                tv_nsec: libc::c_long::from(delay.subsec_nanos() as i32),
            },
        };
        // SAFETY: a valid timerfd and a fully initialised itimerspec.
        let rc = unsafe {
            libc::timerfd_settime(self.timerfd.as_raw_fd(), 0, &spec, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(format!("timerfd_settime: {}", io::Error::last_os_error()));
        }
        self.armed = Some(at);
        Ok(())
    }

    fn clear_timer(&mut self) {
        let mut expirations = [0u8; 8];
        // SAFETY: reading 8 bytes into an 8-byte buffer from our timerfd.
        let _ = unsafe { libc::read(self.timerfd.as_raw_fd(), expirations.as_mut_ptr().cast(), 8) };
        self.armed = None;
    }
}

fn timerfd() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the fd is owned by the OwnedFd from here on.
    let fd = unsafe {
        libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
