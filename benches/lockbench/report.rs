//! What the harness prints: the results of every row, as Markdown tables,
//! and each target of issue 6 as a ratio with PASS or MISS.
//!
//! Owns: the systems and rows of a benchmark (their names and what compares
//! with what), collecting outcomes, and formatting. Runs on the main thread
//! after the runs are done.
//!
//! Never does: measure anything, or talk to a server.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::engine::Outcome;
use crate::wire::Proto;

/// A server under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum System {
    /// batond with the default `--threads`.
    Baton,
    /// batond `--threads 1`.
    Baton1,
    /// A Redis lock (`SET NX PX` + compare-and-delete script).
    Redis,
    /// batond `--echo`, default threads: the floor of Baton.
    Echo,
    /// batond `--echo --threads 1`: the floor of Baton1.
    Echo1,
    /// Redis `PING` inline: the floor of Redis.
    Ping,
    /// The active of a 2-node baton cluster (default flags), its standby
    /// attached and synced.
    Cluster,
    /// A Redis master with one replica attached (`--replicaof`).
    RedisRepl,
}

impl System {
    pub fn proto(self) -> Proto {
        match self {
            System::Baton | System::Baton1 | System::Cluster => Proto::Baton,
            System::Echo | System::Echo1 => Proto::Echo,
            System::Redis | System::RedisRepl => Proto::RedisLock,
            System::Ping => Proto::RedisPing,
        }
    }

    pub fn name(self, default_threads: &str) -> String {
        match self {
            System::Baton => format!("baton T={default_threads}"),
            System::Baton1 => "baton T=1".into(),
            System::Redis => "redis".into(),
            System::Echo => format!("echo T={default_threads}"),
            System::Echo1 => "echo T=1".into(),
            System::Ping => "redis PING".into(),
            System::Cluster => format!("baton T={default_threads} active + standby"),
            System::RedisRepl => "redis master + replica".into(),
        }
    }

    /// The floor this system is compared with.
    fn floor(self) -> Option<System> {
        match self {
            System::Baton => Some(System::Echo),
            System::Baton1 => Some(System::Echo1),
            System::Redis => Some(System::Ping),
            _ => None,
        }
    }

    fn is_baton(self) -> bool {
        matches!(self, System::Baton | System::Baton1)
    }
}

/// The kinds of rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    /// Uncontended closed loop, depth 1 (the workers sweep).
    Sweep,
    /// Uncontended, pipelined.
    Pipelined,
    Contended,
    Expiry,
    /// As deployed: a single node against the active of a 2-node cluster
    /// (and Redis alone against a master with a replica), with CPU time.
    Deployed,
}

impl Section {
    pub fn name(self) -> &'static str {
        match self {
            Section::Sweep => "sweep",
            Section::Pipelined => "pipelined",
            Section::Contended => "contended",
            Section::Expiry => "expiry",
            Section::Deployed => "deployed",
        }
    }
}

/// One row of the benchmark: a workload shape, run against several systems.
#[derive(Clone, Debug)]
pub struct Row {
    pub section: Section,
    pub conns: usize,
    pub depth: usize,
    pub hold_us: u64,
    /// Expiry: keys (conns / keys clients on each) and lease.
    pub keys: usize,
    pub lease_ms: u64,
    /// Run with the load generator and the servers on separate cores
    /// (placement.rs); the other rows let the kernel place them.
    pub split: bool,
}

/// The memory rows.
#[derive(Clone, Debug, Default)]
pub struct Memory {
    /// (RSS before, RSS after, held keys reported, fill seconds) in bytes.
    pub baton_keys: Option<MemoryRow>,
    pub redis_keys: Option<MemoryRow>,
    pub baton_waiters: Option<MemoryRow>,
    pub keys: u64,
    pub waiters: u64,
}

#[derive(Clone, Debug)]
pub struct MemoryRow {
    pub rss_before: u64,
    pub rss_after: u64,
    /// What the server itself reports (`I held=` / `DBSIZE` / `I waiting=`).
    pub check: String,
    /// Seconds to load the keys or waiters.
    pub load_secs: f64,
}

/// Everything measured, and what to say about it.
pub struct Results {
    pub rows: Vec<Row>,
    pub outcomes: HashMap<(usize, System), Outcome>,
    pub memory: Memory,
    pub notes: Vec<String>,
    pub default_threads: String,
}

impl Results {
    pub fn add(&mut self, row: usize, system: System, outcome: Outcome) {
        match self.outcomes.get_mut(&(row, system)) {
            Some(total) => total.merge(&outcome, false),
            None => {
                self.outcomes.insert((row, system), outcome);
            }
        }
    }

    pub(crate) fn get(&self, row: usize, system: System) -> Option<&Outcome> {
        self.outcomes.get(&(row, system))
    }

    fn find(&self, section: Section, conns: usize, hold_us: u64) -> Option<usize> {
        self.rows
            .iter()
            .position(|r| r.section == section && r.conns == conns && r.hold_us == hold_us)
    }

    /// The whole report, Markdown.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_uncontended(&mut out);
        self.render_contended(&mut out);
        self.render_expiry(&mut out);
        self.render_memory(&mut out);
        self.render_targets(&mut out);
        self.render_deployed(&mut out);
        if !self.notes.is_empty() {
            out.push_str("\nNotes:\n");
            for note in &self.notes {
                let _ = writeln!(out, "- {note}");
            }
        }
        out
    }

    fn name(&self, system: System) -> String {
        system.name(&self.default_threads)
    }

    fn render_deployed(&self, out: &mut String) {
        crate::deployed::render(self, out);
    }

    fn render_uncontended(&self, out: &mut String) {
        let rows: Vec<usize> = (0..self.rows.len())
            .filter(|&i| matches!(self.rows[i].section, Section::Sweep | Section::Pipelined))
            .collect();
        if rows.is_empty() {
            return;
        }
        out.push_str("\n### Uncontended: acquire + release of a random key (acquire latency)\n\n");
        out.push_str("| C | depth | system | pairs/s | p50 | p99 | p99.9 | max | ×redis | ×floor | server CPU µs/pair | CPU ×floor | notes |\n");
        out.push_str("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
        let order = [
            System::Baton,
            System::Baton1,
            System::Redis,
            System::Echo,
            System::Echo1,
            System::Ping,
        ];
        for i in rows {
            let row = &self.rows[i];
            for system in order {
                let Some(o) = self.get(i, system) else {
                    continue;
                };
                let rate = rate(o.pairs, o.secs);
                let vs_redis = match self.get(i, System::Redis) {
                    Some(r) if system.is_baton() => ratio(rate, rate_of(r)),
                    _ => String::new(),
                };
                let floor = system.floor().and_then(|f| self.get(i, f));
                let vs_floor = match floor {
                    Some(f) => ratio(rate, rate_of(f)),
                    None => String::new(),
                };
                let cpu = server_cpu_us(o);
                let cpu_vs_floor = match (cpu, floor.and_then(server_cpu_us)) {
                    (Some(c), Some(f)) if f > 0.0 => format!("{:.2}", c / f),
                    _ => String::new(),
                };
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    row.conns,
                    row.depth,
                    self.name(system),
                    fmt_rate(rate),
                    fmt_ns(o.acquire.value_at_quantile(0.5)),
                    fmt_ns(o.acquire.value_at_quantile(0.99)),
                    fmt_ns(o.acquire.value_at_quantile(0.999)),
                    fmt_ns(o.acquire.max()),
                    vs_redis,
                    vs_floor,
                    cpu.map_or_else(String::new, |c| format!("{c:.2}")),
                    cpu_vs_floor,
                    notes(o),
                );
            }
        }
        out.push_str(
            "\nserver CPU µs/pair = the server process's user + system CPU time over the \
             measure window (/proc/PID/stat, all its threads) ÷ pairs done in it (blank where \
             its PID was not given); CPU ×floor = that against the row's floor (baton: the echo \
             at the same --threads; Redis: PING).\n",
        );
    }

    fn render_contended(&self, out: &mut String) {
        let rows: Vec<usize> = (0..self.rows.len())
            .filter(|&i| self.rows[i].section == Section::Contended)
            .collect();
        if rows.is_empty() {
            return;
        }
        out.push_str("\n### Contended: C clients on one key (acquire → hold → release)\n\n");
        out.push_str("| C | hold | system | handoffs/s | acq p50 | p99 | p99.9 | longest wait | grants/client min–max | spread | handoff p50 | handoff p99 | ×redis | notes |\n");
        out.push_str("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
        for i in rows {
            let row = &self.rows[i];
            for system in [System::Baton, System::Baton1, System::Redis] {
                let Some(o) = self.get(i, system) else {
                    continue;
                };
                let handoffs = rate(o.grants, o.secs);
                let vs_redis = match self.get(i, System::Redis) {
                    Some(r) if system.is_baton() => ratio(handoffs, rate(r.grants, r.secs)),
                    _ => String::new(),
                };
                let (min, max) = min_max(&o.per_client);
                let _ = writeln!(
                    out,
                    "| {} | {}µs | {} | {} | {} | {} | {} | {} | {min}–{max} | {} | {} | {} | {} | {} |",
                    row.conns,
                    row.hold_us,
                    self.name(system),
                    fmt_rate(handoffs),
                    fmt_ns(o.acquire.value_at_quantile(0.5)),
                    fmt_ns(o.acquire.value_at_quantile(0.99)),
                    fmt_ns(o.acquire.value_at_quantile(0.999)),
                    fmt_ns(o.acquire.max()),
                    format_args!("{:.1}%", 100.0 * spread(&o.per_client)),
                    fmt_ns(o.handoff.value_at_quantile(0.5)),
                    fmt_ns(o.handoff.value_at_quantile(0.99)),
                    vs_redis,
                    notes(o),
                );
            }
            for system in [System::Echo, System::Echo1] {
                let Some(o) = self.get(i, system) else {
                    continue;
                };
                let _ = writeln!(
                    out,
                    "| {} | {}µs | {}: 1 conn round trip | | {} | {} | {} | {} | | | | | | |",
                    row.conns,
                    row.hold_us,
                    self.name(system),
                    fmt_ns(o.acquire.value_at_quantile(0.5)),
                    fmt_ns(o.acquire.value_at_quantile(0.99)),
                    fmt_ns(o.acquire.value_at_quantile(0.999)),
                    fmt_ns(o.acquire.max()),
                );
            }
        }
        out.push_str(
            "\nspread = (max − min) / mean grants per client. Handoff = release sent → the next \
             holder's grant received, counted when the next holder was already waiting. The echo \
             rows are one connection's round trip through `batond --echo`, run next to the row: \
             the yardstick of the handoff target.\n",
        );
    }

    fn render_expiry(&self, out: &mut String) {
        let Some(i) = self.rows.iter().position(|r| r.section == Section::Expiry) else {
            return;
        };
        let row = &self.rows[i];
        let _ = write!(
            out,
            "\n### Expiry lateness: holders never release (lease {} ms, {} keys × {} clients)\n\n",
            row.lease_ms,
            row.keys,
            row.conns / row.keys.max(1)
        );
        out.push_str("| system | expiries | lateness p50 | p99 | max | notes |\n");
        out.push_str("|---|---:|---:|---:|---:|---|\n");
        for system in [System::Baton, System::Baton1, System::Redis] {
            let Some(o) = self.get(i, system) else {
                continue;
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} |",
                self.name(system),
                o.lateness.len(),
                fmt_ns(o.lateness.value_at_quantile(0.5)),
                fmt_ns(o.lateness.value_at_quantile(0.99)),
                fmt_ns(o.lateness.max()),
                notes(o),
            );
        }
        out.push_str(
            "\nlateness = the next holder's grant received − (the previous grant received + lease).\n",
        );
    }

    fn render_memory(&self, out: &mut String) {
        let m = &self.memory;
        let rows = [
            (
                format!("{} held keys", fmt_count(m.keys)),
                "baton",
                &m.baton_keys,
                m.keys,
            ),
            (
                format!("{} held keys", fmt_count(m.keys)),
                "redis",
                &m.redis_keys,
                m.keys,
            ),
            (
                format!("{} queued waiters", fmt_count(m.waiters)),
                "baton",
                &m.baton_waiters,
                m.waiters,
            ),
        ];
        if rows.iter().all(|r| r.2.is_none()) {
            return;
        }
        out.push_str("\n### Memory (VmRSS of the server process)\n\n");
        out.push_str("| what | system | RSS before | RSS after | growth per item | load time | server says |\n");
        out.push_str("|---|---|---:|---:|---:|---:|---|\n");
        for (what, system, row, items) in rows {
            let Some(r) = row else { continue };
            let _ = writeln!(
                out,
                "| {what} | {system} | {} | {} | {} B | {:.1}s | {} |",
                fmt_bytes(r.rss_before),
                fmt_bytes(r.rss_after),
                r.rss_after.saturating_sub(r.rss_before) / items.max(1),
                r.load_secs,
                r.check,
            );
        }
    }

    fn render_targets(&self, out: &mut String) {
        let mut targets = Vec::new();
        self.closed_loop_target(&mut targets);
        self.pipelined_targets(&mut targets);
        self.contended_targets(&mut targets);
        let memory = match (&self.memory.baton_keys, &self.memory.redis_keys) {
            (Some(b), Some(r)) => {
                let v = b.rss_after as f64 / r.rss_after as f64;
                Some((v, v <= 1.0))
            }
            _ => None,
        };
        if let Some(v) = memory {
            let name = format!(
                "memory, {} held keys: baton RSS / redis RSS",
                fmt_count(self.memory.keys)
            );
            targets.push(Target {
                name,
                goal: "≤ 1".into(),
                default: Some(v),
                single: None,
            });
        }
        if targets.is_empty() {
            return;
        }
        // Without a --threads 1 server (it is the default), one column.
        let single = self.outcomes.keys().any(|(_, s)| *s == System::Baton1);
        let _ = write!(
            out,
            "\n### Targets (ratios from this interleaved run)\n\n| target | goal | baton T={} | |{}\n|---|---|---:|---|{}\n",
            self.default_threads,
            if single { " baton T=1 | |" } else { "" },
            if single { "---:|---|" } else { "" },
        );
        for t in targets {
            let cell = |v: Verdict| match v {
                Some((v, ok)) => format!("{v:.3} | {}", if ok { "PASS" } else { "**MISS**" }),
                None => "n/a | ".to_string(),
            };
            let second = if single {
                format!(" {} |", cell(t.single))
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} |{second}",
                t.name,
                t.goal,
                cell(t.default),
            );
        }
    }

    /// A target over both thread settings: `value(baton system)`.
    fn both(&self, value: impl Fn(System) -> Verdict) -> (Verdict, Verdict) {
        (value(System::Baton), value(System::Baton1))
    }

    fn closed_loop_target(&self, targets: &mut Vec<Target>) {
        let Some(i) = self.find(Section::Sweep, 50, 0) else {
            return;
        };
        let (default, single) = self.both(|b| {
            let o = self.get(i, b)?;
            let floor = self.get(i, b.floor()?)?;
            let v = rate_of(o) / rate_of(floor);
            Some((v, v >= 0.85))
        });
        targets.push(Target {
            name: "closed loop C=50 depth 1: pairs/s / echo floor".into(),
            goal: "≥ 0.85".into(),
            default,
            single,
        });
    }

    fn pipelined_targets(&self, targets: &mut Vec<Target>) {
        let Some(i) = self
            .rows
            .iter()
            .position(|r| r.section == Section::Pipelined && r.conns == 50)
        else {
            return;
        };
        let depth = self.rows[i].depth;
        let Some(redis) = self.get(i, System::Redis) else {
            return;
        };
        let (default, single) = self.both(|b| {
            let v = rate_of(self.get(i, b)?) / rate_of(redis);
            Some((v, v >= 2.5))
        });
        targets.push(Target {
            name: format!("pipelined C=50 depth {depth}: pairs/s / redis"),
            goal: "≥ 2.5".into(),
            default,
            single,
        });
        let (default, single) = self.both(|b| {
            let v = p99(self.get(i, b)?) / p99(redis);
            Some((v, v <= 0.5))
        });
        targets.push(Target {
            name: format!("pipelined C=50 depth {depth}: acquire p99 / redis"),
            goal: "≤ 0.5".into(),
            default,
            single,
        });
    }

    fn contended_targets(&self, targets: &mut Vec<Target>) {
        // The echo round trip measured next to the row, else the sweep's C=1.
        let echo_rtt = |row: usize, b: System| {
            let floor = b.floor()?;
            let o = self.get(row, floor).or_else(|| {
                let i = self.find(Section::Sweep, 1, 0)?;
                self.get(i, floor)
            })?;
            Some(o.acquire.value_at_quantile(0.5) as f64)
        };
        for i in 0..self.rows.len() {
            let row = &self.rows[i];
            if row.section != Section::Contended {
                continue;
            }
            let label = format!("contended C={} hold {}µs", row.conns, row.hold_us);
            let redis = self.get(i, System::Redis);
            if let Some(redis) = redis {
                let goal = if row.hold_us == 0 { 1.5 } else { 1.3 };
                let (default, single) = self.both(|b| {
                    let o = self.get(i, b)?;
                    let v = rate(o.grants, o.secs) / rate(redis.grants, redis.secs);
                    Some((v, v >= goal))
                });
                targets.push(Target {
                    name: format!("{label}: handoffs/s / redis"),
                    goal: format!("≥ {goal}"),
                    default,
                    single,
                });
            }
            let (default, single) = self.both(|b| {
                let o = self.get(i, b)?;
                let (min, max) = min_max(&o.per_client);
                let mean = mean(&o.per_client);
                let v = spread(&o.per_client);
                // One grant of difference per measure window is the window's
                // edge (FIFO turns cut mid-cycle), not unfairness.
                let edge = o.windows as f64;
                Some((v, (max - min) as f64 <= (0.01 * mean).max(edge)))
            });
            targets.push(Target {
                name: format!("{label}: grants per client (max−min)/mean"),
                goal: "≤ 0.01 (or 1 grant per round)".into(),
                default,
                single,
            });
            if let Some(redis) = redis {
                let (default, single) = self.both(|b| {
                    let v = p99(self.get(i, b)?) / p99(redis);
                    Some((v, v <= 0.25))
                });
                targets.push(Target {
                    name: format!("{label}: acquire p99 / redis"),
                    goal: "≤ 0.25".into(),
                    default,
                    single,
                });
                let (default, single) = self.both(|b| {
                    let v =
                        self.get(i, b)?.acquire.max() as f64 / redis.acquire.max().max(1) as f64;
                    Some((v, v <= 0.25))
                });
                targets.push(Target {
                    name: format!("{label}: longest wait / redis"),
                    goal: "≤ 0.25".into(),
                    default,
                    single,
                });
            }
            let (default, single) = self.both(|b| {
                let o = self.get(i, b)?;
                if o.handoff.is_empty() {
                    return None;
                }
                let v = o.handoff.value_at_quantile(0.5) as f64 / echo_rtt(i, b)?;
                Some((v, v <= 2.0))
            });
            targets.push(Target {
                name: format!("{label}: handoff p50 / echo round trip p50"),
                goal: "≤ 2".into(),
                default,
                single,
            });
        }
    }
}

/// A target's measured ratio and whether it meets the goal (None: not measured).
type Verdict = Option<(f64, bool)>;

struct Target {
    name: String,
    goal: String,
    default: Verdict,
    single: Verdict,
}

pub(crate) fn rate(count: u64, secs: f64) -> f64 {
    if secs > 0.0 { count as f64 / secs } else { 0.0 }
}

/// The server's CPU µs per pair over the window, if its CPU was read.
fn server_cpu_us(o: &Outcome) -> Option<f64> {
    // `cpu` holds the server's seconds first, the load generator's last.
    (o.cpu.len() >= 2 && o.pairs > 0).then(|| o.cpu[0] * 1e6 / o.pairs as f64)
}

pub(crate) fn rate_of(o: &Outcome) -> f64 {
    rate(o.pairs, o.secs)
}

pub(crate) fn p99(o: &Outcome) -> f64 {
    o.acquire.value_at_quantile(0.99).max(1) as f64
}

pub(crate) fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}", a / b)
    } else {
        "–".into()
    }
}

fn min_max(v: &[u64]) -> (u64, u64) {
    (
        v.iter().copied().min().unwrap_or(0),
        v.iter().copied().max().unwrap_or(0),
    )
}

fn mean(v: &[u64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<u64>() as f64 / v.len() as f64
    }
}

fn spread(v: &[u64]) -> f64 {
    let (min, max) = min_max(v);
    let mean = mean(v);
    if mean > 0.0 {
        (max - min) as f64 / mean
    } else {
        0.0
    }
}

/// Past this share of a core (user + system, over the window), the load
/// generator is what bounds a row.
pub const LOAD_GEN_BOUND: f64 = 0.9;

/// Anything unusual about a run, for the notes column.
pub(crate) fn notes(o: &Outcome) -> String {
    let mut parts = Vec::new();
    if o.retries > 0 {
        parts.push(format!("{} SET retries", fmt_count(o.retries)));
    }
    if o.timeouts > 0 {
        parts.push(format!("{} timeouts", o.timeouts));
    }
    if o.not_held > 0 {
        parts.push(format!("{} not-held", o.not_held));
    }
    if o.errors > 0 {
        parts.push(format!(
            "{} errors (first: {})",
            o.errors,
            o.first_error.as_deref().unwrap_or("?")
        ));
    }
    if o.overlaps > 0 {
        parts.push(format!("**{} overlapping grants**", o.overlaps));
    }
    if o.token_regressions > 0 {
        parts.push(format!("**{} token regressions**", o.token_regressions));
    }
    if o.early > 0 {
        parts.push(format!(
            "{} grants before the deadline (up to {} early)",
            o.early,
            fmt_ns(o.early_max_ns)
        ));
    }
    if o.unfinished > 0 {
        parts.push(format!("{} slots unfinished at drain", o.unfinished));
    }
    if let Some(busy) = o.cpu.last().filter(|_| o.secs > 0.0).map(|c| c / o.secs)
        && busy >= LOAD_GEN_BOUND
    {
        parts.push(format!(
            "load generator at {:.0}% of a core: bound by it",
            busy * 100.0
        ));
    }
    parts.join("; ")
}

pub fn fmt_rate(per_sec: f64) -> String {
    if per_sec >= 1e6 {
        format!("{:.2}M", per_sec / 1e6)
    } else if per_sec >= 1e3 {
        format!("{:.1}k", per_sec / 1e3)
    } else {
        format!("{per_sec:.0}")
    }
}

pub fn fmt_count(n: u64) -> String {
    if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
        format!("{}M", n / 1_000_000)
    } else if n >= 10_000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

pub fn fmt_ns(ns: u64) -> String {
    let us = ns as f64 / 1e3;
    if ns == 0 {
        "–".into()
    } else if us < 10.0 {
        format!("{us:.1}µs")
    } else if us < 1000.0 {
        format!("{us:.0}µs")
    } else if us < 1e6 {
        format!("{:.2}ms", us / 1e3)
    } else {
        format!("{:.2}s", us / 1e6)
    }
}

pub fn fmt_bytes(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}
