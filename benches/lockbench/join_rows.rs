//! The join row of lockbench: what a standby joining costs the active. A
//! 2-node cluster's active is loaded with `--join-keys` held keys;
//! `--join-clients` clients then acquire and release keys of their own on
//! it, one pair at a time each, all through the run. `JOINS` times: the
//! standby is stopped (SIGSTOP) until the active counts it gone, `BEFORE`
//! is measured, and the standby is resumed (SIGCONT): it rejoins, as a
//! standby whose machine restarted does, and takes the whole table again.
//! The figures, the stretches before and during the joins pooled (so that
//! what else the machine does falls on both alike): the active's acquire
//! p99.9 and max, and its pairs per second, before the joins and during
//! them (from a resume to the first `I` of the active that counts the
//! standby as holding its state), their ratios against the goals (p99.9 at
//! most 2x, max at most 10 ms, rate at least 0.9x), and the time each
//! standby took to hold the state.
//!
//! Owns: the `--join`, `--join-pids`, `--join-keys` and `--join-clients`
//! options, the run (one per bench run: the keys stay held) and its table.
//!
//! Never does: start or end a server (scripts/bench.sh starts the cluster),
//! or leave the standby stopped (it is sent SIGCONT before any error is
//! returned).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::engine::cpu_ticks;

/// Held keys unless `--join-keys` says otherwise (the goal).
const DEFAULT_KEYS: usize = 1_000_000;
/// Clients unless `--join-clients` says otherwise.
const DEFAULT_CLIENTS: usize = 16;
/// Clients' pairs before the measured stretch (connections warm).
const WARMUP: Duration = Duration::from_secs(1);
/// The stretch measured before each join.
const BEFORE: Duration = Duration::from_secs(2);
/// Joins per run.
const JOINS: usize = 3;
/// The most the active may take to count the stopped standby gone, and the
/// standby to hold the state after its resume.
const BOUND: Duration = Duration::from_secs(120);
/// How often the active's `I` is read (before and during the join alike).
const POLL: Duration = Duration::from_millis(5);
/// Lease of the loaded keys (seconds): longer than any run.
const LOAD_LEASE_S: u64 = 3600;
/// Acquires in flight per loading connection, and loading connections.
const LOAD_BATCH: usize = 4096;
const LOADERS: usize = 2;

/// The goals of issue 44.
const GOAL_P999: f64 = 2.0;
const GOAL_MAX_MS: f64 = 10.0;
const GOAL_RATE: f64 = 0.9;
const GOAL_SYNC_S: f64 = 3.0;

/// The cluster of the row and its shape.
pub struct JoinOptions {
    pub nodes: Option<crate::flags::Pair>,
    pub keys: usize,
    pub clients: usize,
}

/// The join options (`--join` absent: no join row).
pub fn parse(args: &mut pico_args::Arguments) -> Result<JoinOptions, String> {
    let err = |e: pico_args::Error| e.to_string();
    let keys: Option<usize> = args.opt_value_from_str("--join-keys").map_err(err)?;
    if keys.is_some_and(|n| n == 0 || n > 100_000_000) {
        return Err("--join-keys must be 1 to 100000000".into());
    }
    let clients: Option<usize> = args.opt_value_from_str("--join-clients").map_err(err)?;
    if clients.is_some_and(|n| n == 0 || n > 1024) {
        return Err("--join-clients must be 1 to 1024".into());
    }
    let nodes = crate::flags::pair(args, "--join", "--join-pids")?;
    Ok(JoinOptions {
        nodes,
        keys: keys.unwrap_or(DEFAULT_KEYS),
        clients: clients.unwrap_or(DEFAULT_CLIENTS),
    })
}

/// What the clients measured in one stretch.
struct Stretch {
    acquire_us: Histogram<u64>,
    pairs: u64,
    time: Duration,
}

impl Stretch {
    fn p999_ms(&self) -> f64 {
        self.acquire_us.value_at_quantile(0.999) as f64 / 1000.0
    }
    fn max_ms(&self) -> f64 {
        self.acquire_us.max() as f64 / 1000.0
    }
    fn rate(&self) -> f64 {
        self.pairs as f64 / self.time.as_secs_f64().max(1e-9)
    }
}

/// The stretches the clients are in: warming up, before, during, done.
const WARM: u8 = 0;
const PRE: u8 = 1;
const DURING: u8 = 2;
const DONE: u8 = 3;

/// Run the join row; its Markdown section ("" without `--join`).
pub fn run(options: &JoinOptions) -> Result<String, String> {
    let Some(([active, _standby], [_, standby_pid])) = options.nodes else {
        return Ok(String::new());
    };
    let info = crate::info(active)?;
    if info.get("role").map(String::as_str) != Some("active") {
        return Err(format!("--join: {active} is not active: {info:?}"));
    }
    signal(standby_pid, libc::SIGSTOP);
    let result = measure(active, options);
    signal(standby_pid, libc::SIGCONT);
    result
}

/// The run, with the standby stopped at the start.
fn measure(active: SocketAddr, options: &JoinOptions) -> Result<String, String> {
    let standby_pid = options.nodes.map_or(0, |(_, [_, s])| s);
    wait_standbys(active, 0, "to count the stopped standby gone")?;
    eprintln!("join: loading {} keys on {active}", options.keys);
    let loaded = Instant::now();
    load(active, options.keys)?;
    eprintln!("join: loaded in {:.1} s", loaded.elapsed().as_secs_f64());
    let stretch = Arc::new(AtomicU8::new(WARM));
    let failed = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..options.clients)
        .map(|c| {
            let stretch = Arc::clone(&stretch);
            let failed = Arc::clone(&failed);
            std::thread::spawn(move || {
                let out = client(active, c, &stretch);
                if out.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                out
            })
        })
        .collect();
    let active_pid = options.nodes.map_or(0, |(_, [a, _])| a);
    let run = joins(active, [active_pid, standby_pid], &stretch, &failed);
    stretch.store(DONE, Ordering::Relaxed);
    let (before, synced, cpu) = run?;
    let mut pre = empty(before);
    let mut during = empty(synced.iter().sum());
    for handle in clients {
        let (p, d) = handle
            .join()
            .map_err(|_| "join: a client thread panicked".to_string())??;
        merge(&mut pre, p);
        merge(&mut during, d);
    }
    Ok(render(options, &pre, &during, &synced, &cpu))
}

/// CPU seconds the active and the standby used: before the joins (the
/// standby stopped) and during them, each summed over the joins.
#[derive(Default)]
struct Cpu {
    before: [f64; 2],
    during: [f64; 2],
}

/// CPU ticks of the two processes now.
fn ticks(pids: [u32; 2]) -> [Option<u64>; 2] {
    pids.map(|pid| cpu_ticks(&format!("/proc/{pid}/stat")))
}

/// Seconds between two readings, added to `into`.
fn add_cpu(into: &mut [f64; 2], from: [Option<u64>; 2], to: [Option<u64>; 2]) {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    for i in 0..2 {
        into[i] += match (from[i], to[i]) {
            (Some(a), Some(b)) => b.saturating_sub(a) as f64 / hz,
            _ => f64::NAN,
        };
    }
}

/// `JOINS` times: the standby stopped until gone, `BEFORE` measured, the
/// standby resumed and measured until it holds the state. The time
/// measured before, and each join's.
fn joins(
    active: SocketAddr,
    pids: [u32; 2],
    stretch: &AtomicU8,
    failed: &AtomicBool,
) -> Result<(Duration, Vec<Duration>, Cpu), String> {
    let standby_pid = pids[1];
    std::thread::sleep(WARMUP);
    let mut before = Duration::ZERO;
    let mut synced = Vec::new();
    let mut cpu = Cpu::default();
    for join in 0..JOINS {
        if join > 0 {
            stretch.store(WARM, Ordering::Relaxed);
            signal(standby_pid, libc::SIGSTOP);
            wait_standbys(active, 0, "to count the stopped standby gone")?;
        }
        stretch.store(PRE, Ordering::Relaxed);
        let started = Instant::now();
        let at_start = ticks(pids);
        while started.elapsed() < BEFORE && !failed.load(Ordering::Relaxed) {
            crate::info(active)?;
            std::thread::sleep(POLL);
        }
        before += started.elapsed();
        // Resume the standby: it rejoins and takes the table.
        stretch.store(DURING, Ordering::Relaxed);
        let resumed = Instant::now();
        let at_resume = ticks(pids);
        add_cpu(&mut cpu.before, at_start, at_resume);
        signal(standby_pid, libc::SIGCONT);
        loop {
            let info = crate::info(active)?;
            if info.get("standbys").map(String::as_str) == Some("1") {
                synced.push(resumed.elapsed());
                add_cpu(&mut cpu.during, at_resume, ticks(pids));
                break;
            }
            if resumed.elapsed() > BOUND || failed.load(Ordering::Relaxed) {
                return Err(format!(
                    "join: the standby does not hold the state {} s after its resume",
                    resumed.elapsed().as_secs()
                ));
            }
            std::thread::sleep(POLL);
        }
        eprintln!(
            "join {}: the standby held the state {:.2} s after its resume",
            join + 1,
            synced[join].as_secs_f64()
        );
    }
    Ok((before, synced, cpu))
}

fn empty(time: Duration) -> Stretch {
    Stretch {
        acquire_us: Histogram::new(3).expect("histogram"),
        pairs: 0,
        time,
    }
}

fn merge(into: &mut Stretch, from: Stretch) {
    into.acquire_us
        .add(&from.acquire_us)
        .expect("histograms of one shape");
    into.pairs += from.pairs;
}

/// Wait until the active counts `n` standbys holding its state.
fn wait_standbys(active: SocketAddr, n: u64, what: &str) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let info = crate::info(active)?;
        if info.get("standbys").and_then(|s| s.parse::<u64>().ok()) == Some(n) {
            return Ok(());
        }
        if start.elapsed() > BOUND {
            return Err(format!("join: {active} did not come {what}: {info:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Hold `keys` keys on `active`, acquired pipelined over `LOADERS`
/// connections.
fn load(active: SocketAddr, keys: usize) -> Result<(), String> {
    let loaders: Vec<_> = (0..LOADERS)
        .map(|l| {
            std::thread::spawn(move || -> Result<(), String> {
                let conn = TcpStream::connect(active).map_err(|e| e.to_string())?;
                conn.set_nodelay(true).map_err(|e| e.to_string())?;
                let mut reader = BufReader::new(conn.try_clone().map_err(|e| e.to_string())?);
                let mut conn = conn;
                let mine: Vec<usize> = (l..keys).step_by(LOADERS).collect();
                let mut line = String::new();
                for batch in mine.chunks(LOAD_BATCH) {
                    let mut out = Vec::with_capacity(batch.len() * 32);
                    for k in batch {
                        writeln!(out, "A join/{k} {LOAD_LEASE_S} 0").map_err(|e| e.to_string())?;
                    }
                    conn.write_all(&out).map_err(|e| e.to_string())?;
                    for _ in batch {
                        line.clear();
                        reader.read_line(&mut line).map_err(|e| e.to_string())?;
                        if !line.starts_with("A ") {
                            return Err(format!("join: loading: {}", line.trim_end()));
                        }
                    }
                }
                Ok(())
            })
        })
        .collect();
    for loader in loaders {
        loader
            .join()
            .map_err(|_| "join: a loader panicked".to_string())??;
    }
    Ok(())
}

/// One client: acquire and release its own keys, one pair at a time, until
/// the run is done; what it measured before the join and during it.
fn client(active: SocketAddr, c: usize, stretch: &AtomicU8) -> Result<(Stretch, Stretch), String> {
    let conn = TcpStream::connect(active).map_err(|e| e.to_string())?;
    conn.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(conn.try_clone().map_err(|e| e.to_string())?);
    let mut conn = conn;
    let mut pre = empty(Duration::ZERO);
    let mut during = empty(Duration::ZERO);
    let mut line = String::new();
    let mut n = 0u64;
    loop {
        let now = stretch.load(Ordering::Relaxed);
        if now == DONE {
            return Ok((pre, during));
        }
        let key = format!("client{c}/{}", n % 64);
        n += 1;
        let sent = Instant::now();
        conn.write_all(format!("A {key} 30 0\n").as_bytes())
            .map_err(|e| e.to_string())?;
        line.clear();
        reader.read_line(&mut line).map_err(|e| e.to_string())?;
        let took = sent.elapsed();
        let token = line
            .strip_prefix("A ")
            .and_then(|rest| rest.split(' ').next())
            .ok_or_else(|| format!("join: client {c}: {}", line.trim_end()))?
            .to_string();
        conn.write_all(format!("R {key} {token}\n").as_bytes())
            .map_err(|e| e.to_string())?;
        line.clear();
        reader.read_line(&mut line).map_err(|e| e.to_string())?;
        if !line.starts_with("R ") {
            return Err(format!("join: client {c}: {}", line.trim_end()));
        }
        // The stretch the acquire was sent in counts it.
        let into = match now {
            PRE => &mut pre,
            DURING => &mut during,
            _ => continue,
        };
        into.acquire_us
            .record((took.as_micros() as u64).max(1))
            .map_err(|e| e.to_string())?;
        into.pairs += 1;
    }
}

fn signal(pid: u32, sig: libc::c_int) {
    if pid == 0 {
        return;
    }
    // SAFETY: kill(2) reads no memory of ours.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

fn render(
    options: &JoinOptions,
    pre: &Stretch,
    during: &Stretch,
    synced: &[Duration],
    cpu: &Cpu,
) -> String {
    let p999 = during.p999_ms() / pre.p999_ms().max(1e-9);
    let rate = during.rate() / pre.rate().max(1e-9);
    let slowest = synced.iter().max().copied().unwrap_or_default();
    let met = |ok: bool| if ok { "met" } else { "missed" };
    let mut out = String::new();
    out.push_str(&format!(
        "\n## Joining a standby\n\n{} held keys on the active, {} clients acquiring and \
         releasing their own keys one pair at a time; {} times, the standby is stopped until \
         the active counts it gone, {:.0} s are measured (before), and the standby is \
         resumed: it rejoins and takes the whole table (during: until the active's `I` \
         counts it as holding the state). Before and during pooled over the joins.\n\n",
        options.keys,
        options.clients,
        synced.len(),
        BEFORE.as_secs_f64(),
    ));
    out.push_str("| measure | before | during | ratio | goal |\n|---|---|---|---|---|\n");
    out.push_str(&format!(
        "| acquire p99.9 | {:.3} ms | {:.3} ms | {p999:.2}x | at most {GOAL_P999}x: {} |\n",
        pre.p999_ms(),
        during.p999_ms(),
        met(p999 <= GOAL_P999)
    ));
    out.push_str(&format!(
        "| acquire max | {:.3} ms | {:.3} ms | | during at most {GOAL_MAX_MS} ms: {} |\n",
        pre.max_ms(),
        during.max_ms(),
        met(during.max_ms() <= GOAL_MAX_MS)
    ));
    out.push_str(&format!(
        "| pairs/s | {:.0} | {:.0} | {rate:.2}x | at least {GOAL_RATE}x: {} |\n",
        pre.rate(),
        during.rate(),
        met(rate >= GOAL_RATE)
    ));
    let each: Vec<String> = synced
        .iter()
        .map(|d| format!("{:.2}", d.as_secs_f64()))
        .collect();
    out.push_str(&format!(
        "| standby holds the state after | | {} s | | at most {GOAL_SYNC_S} s: {} |\n",
        each.join(", "),
        met(slowest.as_secs_f64() <= GOAL_SYNC_S)
    ));
    let per_s = |cpu: f64, time: Duration| cpu / time.as_secs_f64().max(1e-9);
    out.push_str(&format!(
        "\nCPU of the nodes, in cores busy (CPU seconds per second): the active {:.2} before, \
         {:.2} during; the standby {:.2} during. Each join cost the active {:.2} and the \
         standby {:.2} CPU seconds, on the same machine as the clients and each other.\n",
        per_s(cpu.before[0], pre.time),
        per_s(cpu.during[0], during.time),
        per_s(cpu.during[1], during.time),
        (cpu.during[0] - per_s(cpu.before[0], pre.time) * during.time.as_secs_f64())
            / synced.len().max(1) as f64,
        cpu.during[1] / synced.len().max(1) as f64,
    ));
    out
}
