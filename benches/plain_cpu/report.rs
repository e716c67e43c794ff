//! The plain-client CPU run's tables: what each system did at each depth
//! over every round, and the ratios of the node's server CPU per pair to
//! each echo's; and the reading of those ratio rows back from the text
//! (what the test checks, and what a script comparing runs would use).
//!
//! Owns: the arithmetic (totals over rounds: pairs ÷ seconds, CPU ÷
//! pairs; a ratio per round and of the totals) and the Markdown.
//!
//! Never does: judge: the goal is stated beside the ratio, and whether it
//! is met is for the reader of one run to say, since the machine is shared
//! and noisy.

use std::fmt::Write;

use crate::run::Sample;

/// What the report needs of each system.
pub struct SystemInfo {
    /// Its role: the node or an echo, and with which polling.
    pub label: String,
}

/// A ratio to print: the node's CPU per pair over the floor's.
pub struct RatioSpec {
    pub node: usize,
    pub floor: usize,
}

/// One ratio row read back from the report.
#[allow(dead_code)] // read by tests/plain_cpu_bench.rs
#[derive(Clone, Debug, PartialEq)]
pub struct RatioRow {
    pub workload: String,
    pub ratio: String,
    pub value: f64,
}

fn totals(samples: &[Sample], system: usize, depth: usize) -> Option<Total> {
    let mut t = Total::default();
    for s in samples
        .iter()
        .filter(|s| s.system == system && s.depth == depth)
    {
        let m = &s.measured;
        t.secs += m.secs;
        t.pairs += m.pairs;
        t.server += m.server_cpu;
        t.client += m.client_cpu;
        t.reads += m.reads;
        t.writes += m.writes;
        t.polls += m.polls;
        t.windows += 1;
    }
    (t.windows > 0 && t.pairs > 0).then_some(t)
}

#[derive(Default)]
struct Total {
    secs: f64,
    pairs: u64,
    server: f64,
    client: f64,
    reads: u64,
    writes: u64,
    polls: u64,
    windows: usize,
}

impl Total {
    fn us_per_pair(&self) -> f64 {
        1e6 * self.server / self.pairs as f64
    }
}

/// Server CPU per pair of one round's window, if it has pairs.
fn round_us(samples: &[Sample], system: usize, depth: usize, round: usize) -> Option<f64> {
    let s = samples
        .iter()
        .find(|s| s.system == system && s.depth == depth && s.round == round)?;
    (s.measured.pairs > 0).then(|| 1e6 * s.measured.server_cpu / s.measured.pairs as f64)
}

fn workload(conns: usize, depth: usize) -> String {
    format!("C={conns} depth {depth}")
}

fn rate(pairs_per_sec: f64) -> String {
    if pairs_per_sec >= 1e6 {
        format!("{:.2}M", pairs_per_sec / 1e6)
    } else {
        format!("{:.1}k", pairs_per_sec / 1e3)
    }
}

/// The tables, in Markdown.
pub fn render(
    systems: &[SystemInfo],
    ratios: &[RatioSpec],
    samples: &[Sample],
    conns: usize,
    depths: &[usize],
    rounds: usize,
) -> String {
    let mut out = String::new();
    out.push_str(
        "| workload | system | pairs/s | server CPU µs/pair | load gen CPU | \
         pairs per load-gen write | pairs per load-gen read | load-gen polls per pair |\n\
         |---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for &depth in depths {
        for (i, system) in systems.iter().enumerate() {
            let Some(t) = totals(samples, i, depth) else {
                continue;
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.2} | {:.0}% | {:.1} | {:.1} | {:.3} |",
                workload(conns, depth),
                system.label,
                rate(t.pairs as f64 / t.secs),
                t.us_per_pair(),
                100.0 * t.client / t.secs,
                t.pairs as f64 / t.writes.max(1) as f64,
                t.pairs as f64 / t.reads.max(1) as f64,
                t.polls as f64 / t.pairs as f64,
            );
        }
    }
    out.push_str(
        "\n| workload | server CPU per pair | all rounds | each round |\n|---|---|---:|---|\n",
    );
    for &depth in depths {
        for r in ratios {
            let (Some(node), Some(floor)) = (
                totals(samples, r.node, depth),
                totals(samples, r.floor, depth),
            ) else {
                continue;
            };
            let each: Vec<String> = (0..rounds)
                .filter_map(|round| {
                    let n = round_us(samples, r.node, depth, round)?;
                    let f = round_us(samples, r.floor, depth, round)?;
                    Some(format!("{:.2}", n / f))
                })
                .collect();
            let _ = writeln!(
                out,
                "| {} | {} ÷ {} | {:.2} | {} |",
                workload(conns, depth),
                systems[r.node].label,
                systems[r.floor].label,
                node.us_per_pair() / floor.us_per_pair(),
                each.join(", "),
            );
        }
    }
    out
}

/// The ratio rows of a report made by [`render`].
#[allow(dead_code)] // used by tests/plain_cpu_bench.rs
pub fn parse_ratios(report: &str) -> Vec<RatioRow> {
    report
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line
                .trim()
                .strip_prefix('|')?
                .strip_suffix('|')?
                .split('|')
                .map(str::trim)
                .collect();
            let [workload, ratio, value, _each] = cells.as_slice() else {
                return None;
            };
            if !ratio.contains(" ÷ ") {
                return None;
            }
            Some(RatioRow {
                workload: workload.to_string(),
                ratio: ratio.to_string(),
                value: value.parse().ok()?,
            })
        })
        .collect()
}
