//! The workload of a chaos run: workers that acquire a key with the
//! official client, write to a fenced resource, and release; workers that
//! acquire the semaphore key (a limit of several holders) and write to a
//! resource fenced per slot; and the fenced resources themselves.
//!
//! Owns: [`Resource`] — per key, the largest token accepted; a write with a
//! token not above it is rejected; every write is logged, accepted or not,
//! in the order the resource saw them — [`SemResource`] — the same per
//! (semaphore key, slot), and it counts the writes in flight (accepted and
//! not yet done) per slot and in all, logging every moment a write began
//! with more than the limit in flight or its slot already in flight — and
//! each worker's record of what it did ([`WorkerLog`]): its critical
//! sections (from the moment its acquire returned to the moment it started
//! the release), how long every acquire and release took, and its errors.
//! Each worker runs on its own thread with its own [`Client`] connected to
//! all three nodes, for every key.
//!
//! Never does: share a client between workers, or loop without bound: a
//! worker stops at its stop flag, and after `MAX_OPS` operations.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use baton::client::{AcquireOptions, Client, Error, ReleaseOutcome};
use parking_lot::Mutex;

use super::schedule::Rng;

/// Operations one worker does at most.
const MAX_OPS: usize = 10_000_000;

/// The workload's shape.
#[derive(Clone, Debug)]
pub struct Workload {
    pub workers: usize,
    pub hot_keys: usize,
    pub cold_keys: usize,
    /// Probability that an operation picks a hot key.
    pub hot_share: f64,
    pub lease: Duration,
    pub wait: Duration,
    pub request_timeout: Duration,
    /// Work inside a critical section: uniform in `0..=max_work`.
    pub max_work: Duration,
    /// The semaphore key's limit (holders at once).
    pub sem_limit: u32,
    /// Probability that an operation is on the semaphore key.
    pub sem_share: f64,
}

/// The index of the semaphore key (the mutex keys are `0..hot+cold`).
pub const SEM_KEY: u32 = u32::MAX;
/// The semaphore key's name.
pub const SEM_NAME: &str = "sem";

/// The key named by index `k` (hot keys first).
pub fn key_name(workload: &Workload, k: u32) -> String {
    if k == SEM_KEY {
        SEM_NAME.to_string()
    } else if (k as usize) < workload.hot_keys {
        format!("hot-{k}")
    } else {
        format!("cold-{}", k as usize - workload.hot_keys)
    }
}

/// One write the resource saw.
#[derive(Clone, Copy, Debug)]
pub struct Write {
    pub at: Instant,
    pub key: u32,
    pub token: u64,
    pub worker: u16,
    pub accepted: bool,
}

/// A shared in-memory store that fences writes by token.
#[derive(Default)]
pub struct Resource {
    inner: Mutex<ResourceInner>,
}

#[derive(Default)]
struct ResourceInner {
    last: HashMap<u32, u64>,
    log: Vec<Write>,
}

impl Resource {
    /// Write to `key` with `token`: accepted only if the token is above the
    /// last one accepted for that key.
    pub fn write(&self, key: u32, token: u64, worker: u16) -> bool {
        let mut inner = self.inner.lock();
        let last = inner.last.get(&key).copied().unwrap_or(0);
        let accepted = token > last;
        if accepted {
            inner.last.insert(key, token);
        }
        inner.log.push(Write {
            at: Instant::now(),
            key,
            token,
            worker,
            accepted,
        });
        accepted
    }

    pub fn take_log(&self) -> Vec<Write> {
        std::mem::take(&mut self.inner.lock().log)
    }
}

/// One write the semaphore's resource saw.
#[derive(Clone, Copy, Debug)]
pub struct SemWrite {
    pub at: Instant,
    pub slot: u32,
    pub token: u64,
    pub worker: u16,
    pub accepted: bool,
}

/// A write that began while more than the limit were in flight, or while
/// its slot was: the holders the resource then had.
#[derive(Clone, Copy, Debug)]
pub struct Crowd {
    pub at: Instant,
    pub slot: u32,
    pub token: u64,
    pub worker: u16,
    /// Writes in flight, this one included.
    pub holders: u32,
    /// Writes in flight on this slot, this one included.
    pub slot_holders: u32,
}

/// What the semaphore's resource recorded.
#[derive(Debug, Default)]
pub struct SemRecord {
    pub log: Vec<SemWrite>,
    pub crowds: Vec<Crowd>,
    /// The most writes in flight at once.
    pub most_in_flight: u32,
}

/// A shared in-memory store for the semaphore key, fenced per slot: a
/// write is accepted only if its token is above the last one accepted for
/// its slot; an accepted write is in flight until [`SemResource::done`].
pub struct SemResource {
    limit: u32,
    inner: Mutex<SemInner>,
}

#[derive(Default)]
struct SemInner {
    last: HashMap<u32, u64>,
    in_flight: HashMap<u32, u32>,
    total: u32,
    record: SemRecord,
}

impl SemResource {
    pub fn new(limit: u32) -> SemResource {
        SemResource {
            limit,
            inner: Mutex::default(),
        }
    }

    /// Begin a write to `slot` with `token`: accepted (and in flight until
    /// [`SemResource::done`]) only if the token is above the slot's last.
    pub fn begin(&self, slot: u32, token: u64, worker: u16) -> bool {
        let mut inner = self.inner.lock();
        let at = Instant::now();
        let last = inner.last.get(&slot).copied().unwrap_or(0);
        let accepted = token > last;
        if accepted {
            inner.last.insert(slot, token);
            inner.total += 1;
            let holders = inner.total;
            let slot_holders = {
                let n = inner.in_flight.entry(slot).or_default();
                *n += 1;
                *n
            };
            let record = &mut inner.record;
            record.most_in_flight = record.most_in_flight.max(holders);
            if holders > self.limit || slot_holders > 1 {
                record.crowds.push(Crowd {
                    at,
                    slot,
                    token,
                    worker,
                    holders,
                    slot_holders,
                });
            }
        }
        inner.record.log.push(SemWrite {
            at,
            slot,
            token,
            worker,
            accepted,
        });
        accepted
    }

    /// An accepted write to `slot` is done.
    pub fn done(&self, slot: u32) {
        let mut inner = self.inner.lock();
        inner.total = inner.total.saturating_sub(1);
        if let Some(n) = inner.in_flight.get_mut(&slot) {
            *n = n.saturating_sub(1);
        }
    }

    pub fn take(&self) -> SemRecord {
        std::mem::take(&mut self.inner.lock().record)
    }
}

/// A grant of the semaphore key, as the worker got it.
#[derive(Clone, Copy, Debug)]
pub struct SemGrant {
    pub worker: u16,
    pub token: u64,
    pub slot: u32,
    pub at: Instant,
}

/// A grant of the semaphore key whose release was answered "not held":
/// the active did not know it.
#[derive(Clone, Copy, Debug)]
pub struct LostGrant {
    pub worker: u16,
    pub token: u64,
    pub slot: u32,
    /// When the acquire returned it.
    pub granted: Instant,
    /// When the release was answered.
    pub released: Instant,
}

/// The semaphore key's calls of one worker (or of all).
#[derive(Debug, Default)]
pub struct SemTally {
    pub cycles: u64,
    pub acquire_timeouts: u64,
    pub acquire_errors: BTreeMap<String, u64>,
    pub release_not_held: u64,
    pub release_errors: BTreeMap<String, u64>,
}

impl SemTally {
    pub fn add(&mut self, other: SemTally) {
        self.cycles += other.cycles;
        self.acquire_timeouts += other.acquire_timeouts;
        for (k, n) in other.acquire_errors {
            *self.acquire_errors.entry(k).or_default() += n;
        }
        self.release_not_held += other.release_not_held;
        for (k, n) in other.release_errors {
            *self.release_errors.entry(k).or_default() += n;
        }
    }
}

/// A critical section, by the worker's own clock.
#[derive(Clone, Copy, Debug)]
pub struct Section {
    pub worker: u16,
    pub key: u32,
    pub token: u64,
    /// When the acquire returned the grant.
    pub start: Instant,
    /// When the worker was done and about to release.
    pub end: Instant,
}

/// One call that took longer than its bound.
#[derive(Clone, Debug)]
pub struct SlowCall {
    pub worker: u16,
    pub op: &'static str,
    pub key: u32,
    pub started: Instant,
    pub took: Duration,
    pub outcome: String,
}

/// What one worker did.
#[derive(Default)]
pub struct WorkerLog {
    pub sections: Vec<Section>,
    pub cycles: u64,
    pub acquire_timeouts: u64,
    pub acquire_errors: BTreeMap<String, u64>,
    pub release_not_held: u64,
    pub release_errors: BTreeMap<String, u64>,
    pub longest_acquire: Duration,
    pub longest_release: Duration,
    pub slow: Vec<SlowCall>,
    pub sem_grants: Vec<SemGrant>,
    pub sem_lost: Vec<LostGrant>,
    pub sem: SemTally,
}

/// A short name for an error kind.
fn kind(e: &Error) -> String {
    let s = match e {
        Error::Timeout => "timeout",
        Error::Refused(_) => return format!("refused({e})"),
        Error::NotHeld => "not-held",
        Error::Expired => "expired",
        Error::NoConnection(_) => "no-connection",
        Error::NoAnswer(_) => "no-answer",
        Error::NoActive(_) => "no-active",
        Error::InvalidArgument(_) => "invalid-argument",
        Error::Protocol(_) => "protocol",
        _ => "other",
    };
    s.to_string()
}

/// The bound on one acquire: its wait plus the request timeout plus slack.
pub fn acquire_bound(workload: &Workload, slack: Duration) -> Duration {
    workload.wait + workload.request_timeout + slack
}

/// The bound on one release: the retry window plus the request timeout
/// plus slack.
pub fn release_bound(workload: &Workload, slack: Duration) -> Duration {
    baton::client::RELEASE_RETRY_WINDOW + workload.request_timeout + slack
}

/// The resources every worker writes to.
pub struct Resources {
    /// The mutex keys'.
    pub keys: Resource,
    /// The semaphore key's.
    pub sem: SemResource,
}

/// One worker's bounds, clients and record.
struct Worker {
    index: u16,
    workload: Workload,
    rng: Rng,
    acquire_limit: Duration,
    release_limit: Duration,
    log: WorkerLog,
}

impl Worker {
    /// Note how long a call took; a slow call if over its bound.
    fn timed(
        &mut self,
        op: &'static str,
        key: u32,
        started: Instant,
        outcome: impl FnOnce() -> String,
    ) {
        let took = started.elapsed();
        let bound = if op == "acquire" {
            self.log.longest_acquire = self.log.longest_acquire.max(took);
            self.acquire_limit
        } else {
            self.log.longest_release = self.log.longest_release.max(took);
            self.release_limit
        };
        if took > bound {
            self.log.slow.push(SlowCall {
                worker: self.index,
                op,
                key,
                started,
                took,
                outcome: outcome(),
            });
        }
    }

    /// Work in a critical section: 0..=max_work.
    fn work(&mut self) {
        let work = self.rng.between(
            Duration::ZERO,
            self.workload.max_work + Duration::from_millis(1),
        );
        if !work.is_zero() {
            std::thread::sleep(work);
        }
    }

    /// No server could answer: do not spin.
    fn back_off(&mut self) {
        std::thread::sleep(
            self.rng
                .between(Duration::from_millis(10), Duration::from_millis(50)),
        );
    }

    /// Acquire a mutex key, write, work, release.
    fn mutex_op(&mut self, client: &Client, resource: &Resource, key: u32) {
        let w = self.workload.clone();
        let name = key_name(&w, key);
        let asked = Instant::now();
        let result = client.acquire(&name, w.lease, Some(w.wait));
        let start = Instant::now();
        self.timed("acquire", key, asked, || match &result {
            Ok(g) => format!("granted {}", g.token()),
            Err(e) => e.to_string(),
        });
        let grant = match result {
            Ok(grant) => grant,
            Err(Error::Timeout) => {
                self.log.acquire_timeouts += 1;
                return;
            }
            Err(e) => {
                *self.log.acquire_errors.entry(kind(&e)).or_default() += 1;
                self.back_off();
                return;
            }
        };
        resource.write(key, grant.token(), self.index);
        self.work();
        let end = Instant::now();
        self.log.sections.push(Section {
            worker: self.index,
            key,
            token: grant.token(),
            start,
            end,
        });
        let released = client.release(&grant);
        self.timed("release", key, end, || format!("{released:?}"));
        match released {
            Ok(ReleaseOutcome::Released) => {}
            Ok(ReleaseOutcome::NotHeld) => self.log.release_not_held += 1,
            Err(e) => *self.log.release_errors.entry(kind(&e)).or_default() += 1,
        }
        self.log.cycles += 1;
    }

    /// Acquire the semaphore key with its limit, write to its slot, work,
    /// release.
    fn sem_op(&mut self, client: &Client, resource: &SemResource, options: &AcquireOptions) {
        let w = self.workload.clone();
        let asked = Instant::now();
        let result = client.acquire_with(SEM_NAME, w.lease, Some(w.wait), options);
        let at = Instant::now();
        self.timed("acquire", SEM_KEY, asked, || match &result {
            Ok(g) => format!("granted {} slot {}", g.token(), g.slot()),
            Err(e) => e.to_string(),
        });
        let grant = match result {
            Ok(grant) => grant,
            Err(Error::Timeout) => {
                self.log.sem.acquire_timeouts += 1;
                return;
            }
            Err(e) => {
                *self.log.sem.acquire_errors.entry(kind(&e)).or_default() += 1;
                self.back_off();
                return;
            }
        };
        let (token, slot) = (grant.token(), grant.slot());
        self.log.sem_grants.push(SemGrant {
            worker: self.index,
            token,
            slot,
            at,
        });
        if resource.begin(slot, token, self.index) {
            self.work();
            resource.done(slot);
        }
        let end = Instant::now();
        let released = client.release(&grant);
        self.timed("release", SEM_KEY, end, || format!("{released:?}"));
        match released {
            Ok(ReleaseOutcome::Released) => {}
            Ok(ReleaseOutcome::NotHeld) => {
                self.log.sem.release_not_held += 1;
                self.log.sem_lost.push(LostGrant {
                    worker: self.index,
                    token,
                    slot,
                    granted: at,
                    released: Instant::now(),
                });
            }
            Err(e) => *self.log.sem.release_errors.entry(kind(&e)).or_default() += 1,
        }
        self.log.sem.cycles += 1;
    }
}

/// Run worker `index` until `stop` is set.
pub fn run(
    index: u16,
    seed: u64,
    servers: Vec<String>,
    workload: Workload,
    slack: Duration,
    resources: Arc<Resources>,
    stop: Arc<AtomicBool>,
) -> WorkerLog {
    let client = Client::builder(&servers)
        .connect_timeout(Duration::from_millis(500))
        .request_timeout(workload.request_timeout)
        .connect()
        .expect("client for the cluster");
    let sem_options = AcquireOptions::new().limit(workload.sem_limit);
    let mut worker = Worker {
        index,
        rng: Rng::new(seed ^ (u64::from(index) + 1).wrapping_mul(0x2545_F491_4F6C_DD1D)),
        acquire_limit: acquire_bound(&workload, slack),
        release_limit: release_bound(&workload, slack),
        log: WorkerLog::default(),
        workload,
    };
    let hot = worker.workload.hot_keys as u64;
    let keys = hot + worker.workload.cold_keys as u64;
    for _ in 0..MAX_OPS {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if worker.rng.chance(worker.workload.sem_share) {
            worker.sem_op(&client, &resources.sem, &sem_options);
            continue;
        }
        let key = if worker.rng.chance(worker.workload.hot_share) {
            worker.rng.below(hot)
        } else {
            hot + worker.rng.below(keys - hot)
        } as u32;
        worker.mutex_op(&client, &resources.keys, key);
    }
    worker.log
}
