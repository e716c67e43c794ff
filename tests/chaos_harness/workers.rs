//! The workload of a chaos run: workers that acquire a key with the
//! official client, write to a fenced resource, and release; and the fenced
//! resource itself.
//!
//! Owns: [`Resource`] — per key, the largest token accepted; a write with a
//! token not above it is rejected; every write is logged, accepted or not,
//! in the order the resource saw them — and each worker's record of what it
//! did ([`WorkerLog`]): its critical sections (from the moment its acquire
//! returned to the moment it started the release), how long every acquire
//! and release took, and its errors. Each worker runs on its own thread
//! with its own [`Client`] connected to all three nodes.
//!
//! Never does: share a client between workers, or loop without bound: a
//! worker stops at its stop flag, and after `MAX_OPS` operations.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use baton::client::{Client, Error, ReleaseOutcome};
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
}

/// The key named by index `k` (hot keys first).
pub fn key_name(workload: &Workload, k: u32) -> String {
    if (k as usize) < workload.hot_keys {
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

/// Run worker `index` until `stop` is set.
pub fn run(
    index: u16,
    seed: u64,
    servers: Vec<String>,
    workload: Workload,
    slack: Duration,
    resource: Arc<Resource>,
    stop: Arc<AtomicBool>,
) -> WorkerLog {
    let mut log = WorkerLog::default();
    let mut rng = Rng::new(seed ^ (u64::from(index) + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
    let client = Client::builder(&servers)
        .connect_timeout(Duration::from_millis(500))
        .request_timeout(workload.request_timeout)
        .connect()
        .expect("client for the cluster");
    let acquire_limit = acquire_bound(&workload, slack);
    let release_limit = release_bound(&workload, slack);
    let keys = (workload.hot_keys + workload.cold_keys) as u64;
    for _ in 0..MAX_OPS {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let key = if rng.chance(workload.hot_share) {
            rng.below(workload.hot_keys as u64)
        } else {
            workload.hot_keys as u64 + rng.below(keys - workload.hot_keys as u64)
        } as u32;
        let name = key_name(&workload, key);
        let asked = Instant::now();
        let result = client.acquire(&name, workload.lease, Some(workload.wait));
        let start = Instant::now();
        let took = start - asked;
        log.longest_acquire = log.longest_acquire.max(took);
        if took > acquire_limit {
            log.slow.push(SlowCall {
                worker: index,
                op: "acquire",
                key,
                started: asked,
                took,
                outcome: match &result {
                    Ok(g) => format!("granted {}", g.token()),
                    Err(e) => e.to_string(),
                },
            });
        }
        let grant = match result {
            Ok(grant) => grant,
            Err(Error::Timeout) => {
                log.acquire_timeouts += 1;
                continue;
            }
            Err(e) => {
                *log.acquire_errors.entry(kind(&e)).or_default() += 1;
                // No server could answer: do not spin.
                std::thread::sleep(
                    rng.between(Duration::from_millis(10), Duration::from_millis(50)),
                );
                continue;
            }
        };
        resource.write(key, grant.token(), index);
        let work = rng.between(Duration::ZERO, workload.max_work + Duration::from_millis(1));
        if !work.is_zero() {
            std::thread::sleep(work);
        }
        let end = Instant::now();
        log.sections.push(Section {
            worker: index,
            key,
            token: grant.token(),
            start,
            end,
        });
        let released = client.release(&grant);
        let took = end.elapsed();
        log.longest_release = log.longest_release.max(took);
        if took > release_limit {
            log.slow.push(SlowCall {
                worker: index,
                op: "release",
                key,
                started: end,
                took,
                outcome: format!("{released:?}"),
            });
        }
        match released {
            Ok(ReleaseOutcome::Released) => {}
            Ok(ReleaseOutcome::NotHeld) => log.release_not_held += 1,
            Err(e) => *log.release_errors.entry(kind(&e)).or_default() += 1,
        }
        log.cycles += 1;
    }
    log
}
