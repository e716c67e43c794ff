//! The semaphore rows of lockbench (section `semaphore`): what a limit
//! costs.
//!
//! Owns: two sets of rows, each run interleaved against its own baseline
//! (the order reversed every other round), and their Markdown tables and
//! targets, printed after the main tables:
//! - C=16 clients on one key with limit 4 (acquire → hold → release)
//!   against the same clients on a mutex, on baton and, when Redis is
//!   given, on Redis (a sorted-set semaphore in one Lua script against the
//!   `SET NX` lock);
//! - uncontended pipelined acquire + release whose acquire carries a limit
//!   field (`A key lease wait 1`, answered with a slot) against the same
//!   acquire without one.
//!
//! The load is engine.rs (the contended and uncontended workloads, with
//! `RunSpec::limit`), the wire formats wire.rs.
//!
//! Never does: start a server, or judge anything but ratios inside one run.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use crate::engine::{self, Outcome, RunSpec, Workload};
use crate::report::{fmt_ns, fmt_rate, notes, rate, ratio};
use crate::tls_rows::Shape;
use crate::wire::{self, Proto};

/// Clients and limit of the contended rows.
const CLIENTS: usize = 16;
const LIMIT: u32 = 4;
/// Holds of the contended rows (µs): the target is on hold 0.
const HOLDS_US: [u64; 2] = [0, 100];
/// Connections of the limit-field row (its depth is `--depth`).
const PIPELINED_CONNS: usize = 50;
const LEASE_MS: u64 = 10_000;
const WAIT_MS: u64 = 30_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Sys {
    /// baton, plain `A` (a mutex).
    BatonMutex,
    /// baton, `A ... 4`.
    BatonSemaphore,
    /// The Redis `SET NX` lock.
    RedisLock,
    /// The Redis sorted-set semaphore, limit 4.
    RedisSemaphore,
    /// baton, uncontended, plain `A`.
    Plain,
    /// baton, uncontended, `A ... 1`.
    LimitField,
}

impl Sys {
    fn name(self) -> &'static str {
        match self {
            Sys::BatonMutex => "baton mutex",
            Sys::BatonSemaphore => "baton limit 4",
            Sys::RedisLock => "redis lock (SET NX)",
            Sys::RedisSemaphore => "redis sorted-set semaphore, limit 4",
            Sys::Plain => "`A k lease wait`",
            Sys::LimitField => "`A k lease wait 1`",
        }
    }

    fn is_redis(self) -> bool {
        matches!(self, Sys::RedisLock | Sys::RedisSemaphore)
    }

    /// What it is compared with in the ×mutex / ×without column.
    fn baseline(self) -> Option<Sys> {
        match self {
            Sys::BatonSemaphore => Some(Sys::BatonMutex),
            Sys::RedisSemaphore => Some(Sys::RedisLock),
            Sys::LimitField => Some(Sys::Plain),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum RowKind {
    Contended { hold_us: u64 },
    Pipelined,
}

impl RowKind {
    fn label(self, depth: usize) -> String {
        match self {
            RowKind::Contended { hold_us } => {
                format!("C={CLIENTS} one key hold={hold_us}µs")
            }
            RowKind::Pipelined => format!("C={PIPELINED_CONNS} depth={depth}"),
        }
    }
}

/// Run the semaphore rows; their Markdown section. `script_load` loads a
/// Lua script into a Redis and gives its SHA1.
pub fn run(
    shape: &Shape,
    depth: usize,
    baton: Option<SocketAddr>,
    redis: Option<SocketAddr>,
    script_load: fn(SocketAddr, &str) -> Result<Vec<u8>, String>,
) -> Result<String, String> {
    let Some(baton) = baton else {
        return Ok("\n### Semaphores\n\nLeft out: no --baton given.\n".into());
    };
    let shas = match redis {
        Some(addr) => Some((
            script_load(addr, wire::RELEASE_SCRIPT)?,
            script_load(addr, wire::SEMAPHORE_SCRIPT)?,
        )),
        None => None,
    };
    let mut rows: Vec<(RowKind, Vec<Sys>)> = HOLDS_US
        .iter()
        .map(|&hold_us| {
            let mut systems = vec![Sys::BatonMutex, Sys::BatonSemaphore];
            if redis.is_some() {
                systems.extend([Sys::RedisLock, Sys::RedisSemaphore]);
            }
            (RowKind::Contended { hold_us }, systems)
        })
        .collect();
    rows.push((RowKind::Pipelined, vec![Sys::Plain, Sys::LimitField]));
    let mut outcomes: HashMap<(RowKind, Sys), Outcome> = HashMap::new();
    let mut run_no = 2_000_000u64;
    for round in 0..shape.rounds {
        for (row, systems) in &rows {
            let mut order = systems.clone();
            if round % 2 == 1 {
                order.reverse();
            }
            for sys in order {
                run_no += 1;
                let (addr, proto, sha) = match (sys.is_redis(), redis, &shas) {
                    (true, Some(addr), Some((release, semaphore))) => {
                        if sys == Sys::RedisLock {
                            (addr, Proto::RedisLock, release.clone())
                        } else {
                            (addr, Proto::RedisSemaphore, semaphore.clone())
                        }
                    }
                    _ => (baton, Proto::Baton, Vec::new()),
                };
                let (conns, workload) = match *row {
                    RowKind::Contended { hold_us } => (
                        CLIENTS,
                        Workload::Contended {
                            hold: Duration::from_micros(hold_us),
                        },
                    ),
                    RowKind::Pipelined => (PIPELINED_CONNS, Workload::Uncontended { depth }),
                };
                let limit = match sys {
                    Sys::BatonSemaphore | Sys::RedisSemaphore => Some(LIMIT),
                    Sys::LimitField => Some(1),
                    _ => None,
                };
                eprintln!(
                    "round {} semaphore {}: {}",
                    round + 1,
                    row.label(depth),
                    sys.name()
                );
                let spec = RunSpec {
                    addr,
                    proto,
                    conns,
                    workload,
                    lease_ms: LEASE_MS,
                    wait_ms: WAIT_MS,
                    warmup: shape.warmup,
                    measure: shape.measure,
                    drain: Duration::from_secs(3),
                    key_prefix: format!("s{run_no}:"),
                    threads: shape.threads,
                    sha,
                    seed: shape.seed ^ run_no.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                    tls: None,
                    cpu_pids: Vec::new(),
                    split: None,
                    limit,
                    changes: None,
                };
                let outcome = engine::run(&spec)
                    .map_err(|e| format!("semaphore {} {}: {e}", row.label(depth), sys.name()))?;
                match outcomes.get_mut(&(*row, sys)) {
                    Some(so_far) => so_far.merge(&outcome, false),
                    None => {
                        outcomes.insert((*row, sys), outcome);
                    }
                }
            }
        }
    }
    Ok(render(&rows, &outcomes, depth, redis.is_some()))
}

fn render(
    rows: &[(RowKind, Vec<Sys>)],
    outcomes: &HashMap<(RowKind, Sys), Outcome>,
    depth: usize,
    have_redis: bool,
) -> String {
    let mut out = String::new();
    let handoffs = |o: &Outcome| rate(o.grants, o.secs);
    let _ = write!(
        out,
        "\n### Semaphores: C={CLIENTS} clients on one key, limit {LIMIT}, against a mutex \
         (acquire → hold → release)\n\n"
    );
    out.push_str(
        "| C | hold | system | handoffs/s | acq p50 | p99 | handoff p50 | handoff p99 | \
         grants/client min–max | ×mutex | ×redis | notes |\n",
    );
    out.push_str("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (row, systems) in rows {
        let RowKind::Contended { hold_us } = *row else {
            continue;
        };
        for &sys in systems {
            let Some(o) = outcomes.get(&(*row, sys)) else {
                continue;
            };
            let vs = |other: Option<Sys>| {
                other
                    .and_then(|b| outcomes.get(&(*row, b)))
                    .map_or_else(String::new, |b| ratio(handoffs(o), handoffs(b)))
            };
            let redis_twin = match sys {
                Sys::BatonMutex => Some(Sys::RedisLock),
                Sys::BatonSemaphore => Some(Sys::RedisSemaphore),
                _ => None,
            };
            let min = o.per_client.iter().copied().min().unwrap_or(0);
            let max = o.per_client.iter().copied().max().unwrap_or(0);
            let _ = writeln!(
                out,
                "| {CLIENTS} | {hold_us}µs | {} | {} | {} | {} | {} | {} | {min}–{max} | {} | {} | {} |",
                sys.name(),
                fmt_rate(handoffs(o)),
                fmt_ns(o.acquire.value_at_quantile(0.5)),
                fmt_ns(o.acquire.value_at_quantile(0.99)),
                fmt_ns(o.handoff.value_at_quantile(0.5)),
                fmt_ns(o.handoff.value_at_quantile(0.99)),
                vs(sys.baseline()),
                vs(redis_twin),
                notes(o),
            );
        }
    }
    out.push_str(
        "\nhandoffs/s = grants per second. Handoff = a release sent → the grant it made \
         received (the releases of the key matched to the grants after them first-in \
         first-out, counted when the grant's acquire was already waiting). ×mutex: the \
         semaphore's handoffs/s ÷ the mutex's, same system, same run. The Redis semaphore \
         is one Lua script (`ZREMRANGEBYSCORE` the expired by the server's `TIME`, `ZCARD`, \
         `ZADD` when under the limit), retried after a jittered ~1 ms while the wait lasts \
         like the Redis lock, released by `ZREM`; it has no line and no fencing per slot.\n",
    );
    if !have_redis {
        out.push_str("\nNo Redis: its rows are left out.\n");
    }
    let _ = write!(
        out,
        "\n### Limit field: uncontended pipelined acquire + release (C={PIPELINED_CONNS} \
         depth {depth}, random keys)\n\n"
    );
    out.push_str("| acquire | pairs/s | acq p50 | p99 | p99.9 | ×without | notes |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|---|\n");
    for sys in [Sys::Plain, Sys::LimitField] {
        let Some(o) = outcomes.get(&(RowKind::Pipelined, sys)) else {
            continue;
        };
        let vs = sys
            .baseline()
            .and_then(|b| outcomes.get(&(RowKind::Pipelined, b)))
            .map_or_else(String::new, |b| {
                ratio(rate(o.pairs, o.secs), rate(b.pairs, b.secs))
            });
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {vs} | {} |",
            sys.name(),
            fmt_rate(rate(o.pairs, o.secs)),
            fmt_ns(o.acquire.value_at_quantile(0.5)),
            fmt_ns(o.acquire.value_at_quantile(0.99)),
            fmt_ns(o.acquire.value_at_quantile(0.999)),
            notes(o),
        );
    }
    out.push_str("\nWith the limit field every grant is answered `A <token> <key> <slot>`.\n");
    // Targets.
    let mut lines = Vec::new();
    let mut target = |name: String, goal: f64, v: Option<f64>| {
        let cell = v.map_or_else(
            || "n/a | ".to_string(),
            |v| format!("{v:.3} | {}", if v >= goal { "PASS" } else { "**MISS**" }),
        );
        lines.push(format!("| {name} | ≥ {goal} | {cell} |"));
    };
    let both = |row: RowKind, a: Sys, b: Sys, per: fn(&Outcome) -> f64| {
        Some(per(outcomes.get(&(row, a))?) / per(outcomes.get(&(row, b))?))
    };
    target(
        format!("C={CLIENTS} hold 0: limit-{LIMIT} semaphore handoffs/s / mutex's"),
        0.95,
        both(
            RowKind::Contended { hold_us: 0 },
            Sys::BatonSemaphore,
            Sys::BatonMutex,
            |o| rate(o.grants, o.secs),
        ),
    );
    target(
        format!(
            "pipelined C={PIPELINED_CONNS} depth {depth}: pairs/s with a limit field / without"
        ),
        0.95,
        both(RowKind::Pipelined, Sys::LimitField, Sys::Plain, |o| {
            rate(o.pairs, o.secs)
        }),
    );
    out.push_str(
        "\n#### Targets, semaphores (ratios from this interleaved run)\n\n\
         | target | goal | value | |\n|---|---|---:|---|\n",
    );
    for line in lines {
        let _ = writeln!(out, "{line}");
    }
    out
}
