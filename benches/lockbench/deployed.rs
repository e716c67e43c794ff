//! The "as deployed" rows: a single node against the active of a 2-node
//! cluster whose standby is attached and synced (both with default flags),
//! and Redis alone against a master with one replica, side by side in one
//! interleaved run, with the CPU time of every process per pair.
//!
//! Owns: the rows of this section (which workloads, which systems) and
//! their tables and targets. The CPU seconds come from engine.rs (read from
//! /proc over the measure window); the servers are started by
//! `scripts/bench.sh`.
//!
//! Never does: start servers, or judge anything but ratios inside one run.

use std::fmt::Write;

use crate::engine::Outcome;
use crate::report::{
    LOAD_GEN_BOUND, Results, Row, Section, System, fmt_ns, fmt_rate, notes, p99, rate, ratio,
};

/// The systems of a row, in interleaved order (reversed every other round).
pub fn systems(row: &Row, round: usize) -> Vec<System> {
    let mut systems = vec![
        System::Baton,
        System::Cluster,
        System::Redis,
        System::RedisRepl,
    ];
    if !is_contended(row) {
        systems.insert(2, System::Echo);
    }
    if round % 2 == 1 {
        systems.reverse();
    }
    systems
}

/// The rows: the closed loop and the pipelined load at C=50, and C=16
/// clients taking turns on one key (hold 0); then, on a machine of two
/// CPUs or more, the two uncontended rows again with the load generator on
/// a core of its own (placement.rs).
pub fn rows(depth: usize) -> Vec<Row> {
    let row = |conns, depth, keys, split| Row {
        section: Section::Deployed,
        conns,
        depth,
        hold_us: 0,
        keys,
        lease_ms: 10_000,
        split,
    };
    let mut rows = vec![
        row(50, 1, 0, false),
        row(50, depth, 0, false),
        row(16, 1, 1, false),
    ];
    if crate::placement::Split::of_this_machine().is_some() {
        rows.extend([row(50, 1, 0, true), row(50, depth, 0, true)]);
    }
    rows
}

/// One key shared by every client: the contended workload.
pub fn is_contended(row: &Row) -> bool {
    row.keys == 1
}

fn label(row: &Row) -> String {
    if is_contended(row) {
        format!("C={} one key, handoffs", row.conns)
    } else if row.split {
        format!("C={} depth {}, pairs, split cores", row.conns, row.depth)
    } else {
        format!("C={} depth {}, pairs", row.conns, row.depth)
    }
}

/// The most a server's CPU per pair may be against the echo's in an
/// uncontended row: 1.15 in the closed loop (the syscalls dominate both),
/// 1.3 pipelined (the lock table, the hop to the owner and back).
fn cpu_goal(row: &Row) -> f64 {
    if row.depth > 1 { 1.3 } else { 1.15 }
}

/// The server's CPU per pair against the echo's in the same row.
fn cpu_vs_echo(results: &Results, i: usize, system: System) -> Option<f64> {
    let row = &results.rows[i];
    let server = cpu_us(row, results.get(i, system)?, 0)?;
    let echo = cpu_us(row, results.get(i, System::Echo)?, 0)?;
    (echo > 0.0).then(|| server / echo)
}

/// Pairs done in the window (a handoff, on one key, is a pair too).
fn done(row: &Row, o: &Outcome) -> u64 {
    if is_contended(row) { o.grants } else { o.pairs }
}

/// CPU µs per pair of process `i` of the system (0: the server or active
/// or master; 1: the standby or replica; last: the load generator).
fn cpu_us(row: &Row, o: &Outcome, i: usize) -> Option<f64> {
    let secs = *o.cpu.get(i)?;
    let n = done(row, o);
    (n > 0).then(|| secs * 1e6 / n as f64)
}

/// CPU µs per pair of the replication thread of process `i` (baton only).
fn repl_us(row: &Row, o: &Outcome, i: usize) -> Option<f64> {
    let secs = *o.repl_cpu.get(i)?;
    let n = done(row, o);
    (n > 0).then(|| secs * 1e6 / n as f64)
}

/// Share of one core the load generator used over the window.
fn load_gen_busy(o: &Outcome) -> Option<f64> {
    let secs = *o.cpu.last()?;
    (o.secs > 0.0).then(|| secs / o.secs)
}

fn us(v: Option<f64>) -> String {
    v.map_or_else(String::new, |v| {
        if v < 10.0 {
            format!("{v:.2}")
        } else {
            format!("{v:.1}")
        }
    })
}

pub fn render(results: &Results, out: &mut String) {
    let rows: Vec<usize> = (0..results.rows.len())
        .filter(|&i| results.rows[i].section == Section::Deployed)
        .collect();
    if rows.is_empty() {
        return;
    }
    let name = |s: System| s.name(&results.default_threads);
    out.push_str(
        "\n### As deployed: a single node against the active of a 2-node cluster (standby \
         attached and synced), Redis alone against a master with a replica\n\n",
    );
    out.push_str(
        "| workload | system | per s | acq p99 | ×alone | ×echo | CPU µs/pair: server | \
         server CPU ×echo | standby / replica | standby ÷ server | of which replication threads \
         (active / standby) | load gen (share of a core) | notes |\n",
    );
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n");
    for &i in &rows {
        let row = &results.rows[i];
        for system in [
            System::Baton,
            System::Cluster,
            System::Echo,
            System::Redis,
            System::RedisRepl,
        ] {
            let Some(o) = results.get(i, system) else {
                continue;
            };
            let per_s = rate(done(row, o), o.secs);
            let alone = match system {
                System::Cluster => results.get(i, System::Baton),
                System::RedisRepl => results.get(i, System::Redis),
                _ => None,
            };
            let vs_alone =
                alone.map_or_else(String::new, |a| ratio(per_s, rate(done(row, a), a.secs)));
            let vs_echo = match (system, results.get(i, System::Echo)) {
                (System::Baton | System::Cluster, Some(e)) => {
                    ratio(per_s, rate(done(row, e), e.secs))
                }
                _ => String::new(),
            };
            let cpu_echo = match system {
                System::Baton | System::Cluster => {
                    cpu_vs_echo(results, i, system).map_or_else(String::new, |v| format!("{v:.2}"))
                }
                _ => String::new(),
            };
            let pair = matches!(system, System::Cluster | System::RedisRepl);
            let server = cpu_us(row, o, 0);
            let second = if pair { cpu_us(row, o, 1) } else { None };
            let second_ratio = match (server, second) {
                (Some(a), Some(b)) if a > 0.0 => format!("{:.2}", b / a),
                _ => String::new(),
            };
            let repl = if system == System::Cluster {
                match (repl_us(row, o, 0), repl_us(row, o, 1)) {
                    (Some(a), Some(b)) => format!("{a:.2} / {b:.2}"),
                    _ => String::new(),
                }
            } else {
                String::new()
            };
            let load_gen = load_gen_busy(o).map_or_else(String::new, |busy| {
                let bound = if busy >= LOAD_GEN_BOUND {
                    " **bound**"
                } else {
                    ""
                };
                format!("{:.0}%{bound}", busy * 100.0)
            });
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                label(row),
                name(system),
                fmt_rate(per_s),
                fmt_ns(o.acquire.value_at_quantile(0.99)),
                vs_alone,
                vs_echo,
                us(server),
                cpu_echo,
                us(second),
                second_ratio,
                repl,
                load_gen,
                notes(o),
            );
        }
    }
    let split = crate::placement::Split::of_this_machine()
        .map_or_else(|| "not run: one CPU".to_string(), |s| s.describe());
    out.push_str(
        &"\nCPU µs/pair = user + system CPU time of the process over the measure window \
         (/proc/PID/stat, all its threads) ÷ pairs (acquire + release; on one key, \
         handoffs) done in it; the replication threads' share is read from \
         /proc/PID/task (threads named baton-repl); server CPU ×echo = that figure over the \
         echo's in the same row. A load generator at ≥ 90% of a core is marked **bound**: \
         it, not the server, sets that row's rate, and the ratios of such a row say \
         little about the servers. The rows marked *split cores* run with the load generator \
         pinned to one CPU and the measured server process (all its threads) to the others \
         (SPLIT), as if the load came from another machine, and a standby or replica beside \
         the load generator, as if on a third; the other rows let the kernel place every \
         process.\n"
            .replace("SPLIT", &split),
    );
    render_targets(results, &rows, out);
}

fn render_targets(results: &Results, rows: &[usize], out: &mut String) {
    let mut lines = Vec::new();
    // `ok` None: a figure shown beside a target, not judged.
    let mut push = |name: String, goal: &str, v: Option<f64>, ok: Option<&dyn Fn(f64) -> bool>| {
        let cell = match (v, ok) {
            (None, _) => "n/a | ".to_string(),
            (Some(v), None) => format!("{v:.3} | shown"),
            (Some(v), Some(ok)) => format!("{v:.3} | {}", if ok(v) { "PASS" } else { "**MISS**" }),
        };
        lines.push(format!("| {name} | {goal} | {cell} |"));
    };
    let has_split = rows.iter().any(|&i| results.rows[i].split);
    for &i in rows {
        let row = &results.rows[i];
        let l = label(row);
        let single = results.get(i, System::Baton);
        let cluster = results.get(i, System::Cluster);
        let rate_ratio = match (single, cluster) {
            (Some(s), Some(c)) => Some(rate(done(row, c), c.secs) / rate(done(row, s), s.secs)),
            _ => None,
        };
        push(
            format!("{l}: active with a standby / single node, per s"),
            "≥ 0.9",
            rate_ratio,
            Some(&|v| v >= 0.9),
        );
        let cpu_ratio = match (single, cluster) {
            (Some(s), Some(c)) => match (cpu_us(row, c, 0), cpu_us(row, s, 0)) {
                (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                _ => None,
            },
            _ => None,
        };
        push(
            format!("{l}: active's CPU per pair / single node's"),
            "≤ 1.15",
            cpu_ratio,
            Some(&|v| v <= 1.15),
        );
        let standby = cluster.and_then(|c| Some(cpu_us(row, c, 1)? / cpu_us(row, c, 0)?));
        push(
            format!("{l}: standby's CPU per pair / active's"),
            "≤ 0.25",
            standby,
            Some(&|v| v <= 0.25),
        );
        if !is_contended(row) {
            // Which rows judge: placement.rs (docs/performance.md, "CPU
            // per request").
            let goal = cpu_goal(row);
            for (who, system) in [
                ("single node", System::Baton),
                ("active with a standby", System::Cluster),
            ] {
                let name = format!("{l}: {who}'s CPU per pair / echo's");
                let v = cpu_vs_echo(results, i, system);
                if crate::placement::judges_cpu_goals(row.split, has_split) {
                    push(name, &format!("≤ {goal}"), v, Some(&|v| v <= goal));
                } else {
                    // Shown beside the judged figure, not judged.
                    push(name, &format!("(≤ {goal}: judged split)"), v, None);
                }
            }
        }
        if is_contended(row) {
            let p = match (single, cluster) {
                (Some(s), Some(c)) => Some(p99(c) / p99(s)),
                _ => None,
            };
            push(
                format!("{l}: acquire p99, active with a standby / single node"),
                "(≤ 1.15)",
                p,
                Some(&|v| v <= 1.15),
            );
        } else if row.depth > 1 {
            let floor = match (single, results.get(i, System::Echo)) {
                (Some(s), Some(e)) => Some(rate(s.pairs, s.secs) / rate(e.pairs, e.secs)),
                _ => None,
            };
            push(
                format!("{l}: single node / echo floor, per s"),
                "≥ 0.9",
                floor,
                Some(&|v| v >= 0.9),
            );
        }
    }
    if lines.is_empty() {
        return;
    }
    let _ = write!(
        out,
        "\n#### Targets as deployed (ratios from this interleaved run, T={})\n\n\
         | target | goal | value | |\n|---|---|---:|---|\n",
        results.default_threads
    );
    for line in lines {
        let _ = writeln!(out, "{line}");
    }
}
