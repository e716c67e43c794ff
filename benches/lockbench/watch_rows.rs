//! The watch rows of lockbench (section `watch`): what watchers cost the
//! key's owner, and how long a change takes to reach every watcher.
//!
//! Owns: the `--watch-baton`, `--watch-redis`, `--watchers` and
//! `--watch-clients` options; the fan-out reader (one thread, one
//! `mio::Poll` over every watcher connection, run next to the load
//! generator's threads); the schedule (a closed loop of a few clients on
//! one key; in every round each watcher count right after a run with none,
//! the baseline it is compared with; baton and Redis interleaved, the
//! order reversed every other round; each run starts once the server has
//! let go of the last one's connections); the rare-change rows (baton:
//! the same watchers of a key granted every `RARE_EVERY_MS`, while the
//! loop's clients keep it busy on other keys: how soon a leader change
//! reaches them); and the Markdown tables.
//!
//! A change is a grant of the key (baton: its token; Redis: the id the new
//! holder publishes). Its time is when the request that made it was sent
//! (the release a handoff followed, else the acquire; Redis: the
//! `PUBLISH`), taken by the load generator (engine.rs, `RunSpec::changes`).
//! The fan-out reader keeps, per watcher, the newest id it has seen; the
//! least of them over every watcher is the frontier, and a change has
//! reached the last watcher when the frontier reaches its id (a watcher
//! that skipped the change's own state but got a newer one counts: that is
//! what a baton watcher that reads slowly gets).
//!
//! A baton `0` line (nobody holds the key) names no grant, but it is newer
//! than the watcher's line before it (the server only ever sends a watcher
//! a newer state), so it is the free spell after some grant at or after
//! the one that line named. The load generator marks each grant that came
//! to a free key (`Change::after_free`: its acquire was sent after the
//! release before it), so the free spells are known: one after the grant
//! before each such grant, and one after the run's last grant (the drain
//! releases everything). A `0` line counts as the first free spell that
//! is newer than the watcher's line before it: never later than its true
//! one, so no change is taken for reached too early. When that spell is
//! not known yet (the grant after it not logged yet: at most about a
//! client's round trip), the watcher counts as at its line before until it
//! is, and the frontier moves when it is learned (a little late, never
//! early).
//!
//! Never does: start a server, write to a watcher after its `W` or
//! `SUBSCRIBE`, or leave TIME_WAIT sockets behind (watcher sockets close
//! with SO_LINGER 0: 10,000 of them per run would use up the ports).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::io::{self, Read, Write as _};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use parking_lot::Mutex;

use crate::engine::{self, Change, ChangeLog, Outcome, RunSpec, Workload};
use crate::report::{fmt_count, fmt_ns, fmt_rate, notes, rate, ratio};
use crate::tls_rows::Shape;
use crate::wire::{self, Proto, Watched};

/// Where the watch servers are and how many watchers.
pub struct WatchOptions {
    pub baton: Option<SocketAddr>,
    pub redis: Option<SocketAddr>,
    /// Watcher counts (a 0 row, the baseline, is run before each).
    pub watchers: Vec<usize>,
    /// Clients of the closed loop that changes the key.
    pub clients: usize,
}

/// Watchers connected between waits for their first answers.
const CONNECT_BATCH: usize = 256;
/// The most setting up (or tearing down) a run's watchers may take.
const SETUP_BOUND: Duration = Duration::from_secs(120);
/// After the owner's run, the most to wait for its last changes to reach
/// every watcher.
const GRACE: Duration = Duration::from_secs(2);
/// File descriptors kept free beyond the watchers.
const FD_SPARE: libc::rlim_t = 256;
const READ_CHUNK: usize = 64 * 1024;
const LEASE_MS: u64 = 10_000;
const WAIT_MS: u64 = 30_000;

/// The watch options (the caller falls back to the main `--baton` and
/// `--redis` where `--watch-baton` and `--watch-redis` are not given).
pub fn parse(args: &mut pico_args::Arguments) -> Result<WatchOptions, String> {
    let err = |e: pico_args::Error| e.to_string();
    let baton: Option<SocketAddr> = args.opt_value_from_str("--watch-baton").map_err(err)?;
    let redis: Option<SocketAddr> = args.opt_value_from_str("--watch-redis").map_err(err)?;
    let watchers = match args
        .opt_value_from_str::<_, String>("--watchers")
        .map_err(err)?
    {
        Some(list) => list
            .split(',')
            .map(|s| {
                s.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| (1..=100_000).contains(&n))
                    .ok_or_else(|| format!("--watchers: '{s}' is not 1 to 100000"))
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => vec![1000, 10_000],
    };
    let clients = args
        .opt_value_from_str("--watch-clients")
        .map_err(err)?
        .unwrap_or(4);
    if !(1..=64).contains(&clients) {
        return Err("--watch-clients must be 1 to 64".into());
    }
    Ok(WatchOptions {
        baton,
        redis,
        watchers,
        clients,
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Sys {
    Baton,
    Redis,
}

impl Sys {
    fn name(self) -> &'static str {
        match self {
            Sys::Baton => "baton (W)",
            Sys::Redis => "redis lock + PUBLISH / SUBSCRIBE",
        }
    }
}

/// What one run of the watch rows measured.
#[derive(Clone)]
struct WatchOutcome {
    owner: Outcome,
    /// Change (request sent) → the last watcher's line for it or a newer one.
    to_last: Histogram<u64>,
    /// Changes in the window that reached every watcher / that did not
    /// before the grace ran out.
    reached: u64,
    unreached: u64,
    /// States the key went through (the whole run: changes logged, and
    /// the free spells between them) and watcher lines read after each
    /// watcher's first (each a newer state), for the delivered share.
    states: u64,
    lines: u64,
    /// Watchers whose connection the server closed.
    dropped: u64,
}

impl WatchOutcome {
    fn merge(&mut self, other: &WatchOutcome) {
        self.owner.merge(&other.owner, false);
        self.to_last
            .add(&other.to_last)
            .expect("same histogram bounds");
        self.reached += other.reached;
        self.unreached += other.unreached;
        self.states += other.states;
        self.lines += other.lines;
        self.dropped += other.dropped;
    }
}

/// Run the watch rows; their Markdown section. `script_load` loads a Lua
/// script into a Redis and gives its SHA1.
pub fn run(
    options: &WatchOptions,
    shape: &Shape,
    script_load: fn(SocketAddr, &str) -> Result<Vec<u8>, String>,
) -> Result<String, String> {
    let mut systems = Vec::new();
    if let Some(addr) = options.baton {
        systems.push((Sys::Baton, addr, Vec::new()));
    }
    if let Some(addr) = options.redis {
        systems.push((Sys::Redis, addr, script_load(addr, wire::RELEASE_SCRIPT)?));
    }
    if systems.is_empty() {
        return Ok("\n### Watches\n\nLeft out: no --watch-baton (or --baton) given.\n".into());
    }
    let fd_limit = raise_fd_limit();
    let mut counts = vec![0];
    let mut notes_out = Vec::new();
    for &n in &options.watchers {
        if n as libc::rlim_t + FD_SPARE > fd_limit {
            notes_out.push(format!(
                "{} watchers left out: the open-file limit is {fd_limit} (ulimit -n).",
                fmt_count(n as u64)
            ));
        } else if !counts.contains(&n) {
            counts.push(n);
        }
    }
    let mut outcomes: Vec<Vec<Option<WatchOutcome>>> =
        vec![vec![None; systems.len()]; counts.len()];
    let mut run_no = 3_000_000u64;
    // Each count's runs come right after a run of the baseline, in every
    // round (0, 1000, 0, 10000, ...): the baseline drifts with the
    // machine, and is the noisiest row (a closed loop alone on the cores
    // lands on them differently from run to run), so it gets as many runs
    // as the other rows together, each next to the run it is compared with.
    let schedule: Vec<usize> = if counts.len() == 1 {
        vec![0]
    } else {
        (1..counts.len()).flat_map(|r| [0, r]).collect()
    };
    for round in 0..shape.rounds {
        for &r in &schedule {
            let n = counts[r];
            let mut order: Vec<usize> = (0..systems.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for i in order {
                let (sys, addr, sha) = &systems[i];
                run_no += 1;
                eprintln!(
                    "round {} watch {n} watchers, {} clients: {}",
                    round + 1,
                    options.clients,
                    sys.name()
                );
                let outcome = run_one(*sys, *addr, sha, n, options.clients, shape, run_no)
                    .map_err(|e| format!("watch {n} watchers {}: {e}", sys.name()))?;
                eprintln!(
                    "  {} handoffs/s",
                    fmt_rate(rate(outcome.owner.grants, outcome.owner.secs))
                );
                let slot = &mut outcomes[r][i];
                match slot {
                    Some(so_far) => so_far.merge(&outcome),
                    None => *slot = Some(outcome),
                }
            }
        }
    }
    let mut out = render(
        options,
        &systems.iter().map(|s| s.0).collect::<Vec<_>>(),
        &counts,
        &outcomes,
        &notes_out,
    );
    if let Some(addr) = options.baton {
        // 0 watchers first in every round: the other clients' rate with
        // no fan-out, next to the runs it is compared with.
        let mut rare: Vec<(usize, Option<RareOutcome>)> =
            counts.iter().map(|&n| (n, None)).collect();
        for _ in 0..shape.rounds {
            for (n, merged) in rare.iter_mut() {
                run_no += 1;
                eprintln!("watch: a change every {RARE_EVERY_MS} ms, {n} watchers, baton (W)");
                let one = run_rare(addr, *n, options.clients, shape, run_no)
                    .map_err(|e| format!("watch rare {n} watchers: {e}"))?;
                eprintln!(
                    "  other clients {}/s",
                    fmt_rate(rate(one.busy.pairs, one.busy.secs))
                );
                match merged {
                    Some(m) => m.merge(&one),
                    None => *merged = Some(one),
                }
            }
        }
        let rare: Vec<(usize, RareOutcome)> = rare
            .into_iter()
            .filter_map(|(n, m)| m.map(|m| (n, m)))
            .collect();
        out.push_str(&render_rare(options, &rare));
    }
    Ok(out)
}

/// How often the rare-change rows change the watched key.
const RARE_EVERY_MS: u64 = 1_000;
/// How long each of those grants is held.
const RARE_HOLD_MS: u64 = 500;

/// What one run of the rare-change rows measured.
struct RareOutcome {
    /// The other clients' closed loop, which keeps the loop serving.
    busy: Outcome,
    followed: Followed,
}

impl RareOutcome {
    fn merge(&mut self, other: &RareOutcome) {
        self.busy.merge(&other.busy, false);
        let (a, b) = (&mut self.followed, &other.followed);
        a.to_last.add(&b.to_last).expect("same histogram bounds");
        a.reached += b.reached;
        a.unreached += b.unreached;
        a.states += b.states;
        a.lines += b.lines;
        a.dropped += b.dropped;
    }
}

/// A key that changes now and then (a grant every `RARE_EVERY_MS`, held
/// `RARE_HOLD_MS`, as a leader key does) with `watchers` watchers, while
/// `clients` other clients acquire and release random keys as fast as
/// they can on the same node (so its loop is serving, and the fan-out
/// paced): change → last watcher for each grant.
fn run_rare(
    addr: SocketAddr,
    watchers: usize,
    clients: usize,
    shape: &Shape,
    run_no: u64,
) -> Result<RareOutcome, String> {
    let key = format!("w{run_no}:rare");
    let fan = FanOut::connect(addr, false, key.as_bytes(), watchers)?;
    let log: ChangeLog = Arc::new(Mutex::new(VecDeque::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let follower = {
        let (log, stop) = (log.clone(), stop.clone());
        std::thread::spawn(move || fan.follow(&log, &stop))
    };
    let busy_done = Arc::new(AtomicBool::new(false));
    let changer = {
        let (log, done, key) = (log.clone(), busy_done.clone(), key.clone());
        let warmup = shape.warmup;
        std::thread::spawn(move || change_now_and_then(addr, &key, &log, &done, warmup))
    };
    let spec = RunSpec {
        addr,
        proto: Proto::Baton,
        conns: clients,
        workload: Workload::Uncontended { depth: 1 },
        lease_ms: LEASE_MS,
        wait_ms: WAIT_MS,
        warmup: shape.warmup,
        measure: shape.measure,
        drain: Duration::from_secs(3),
        key_prefix: format!("w{run_no}:busy:"),
        threads: shape.threads,
        sha: Vec::new(),
        seed: shape.seed ^ run_no.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        tls: None,
        cpu_pids: Vec::new(),
        split: None,
        limit: None,
        changes: None,
    };
    let busy = engine::run(&spec);
    busy_done.store(true, Ordering::Release);
    let changed = changer
        .join()
        .map_err(|_| "the changer panicked".to_string());
    stop.store(true, Ordering::Release);
    let followed = follower
        .join()
        .map_err(|_| "the fan-out reader panicked".to_string())?;
    changed??;
    let busy = busy?;
    let followed = followed?;
    settle(Sys::Baton, addr)?;
    Ok(RareOutcome { busy, followed })
}

/// Grant `key` every `RARE_EVERY_MS` and release it `RARE_HOLD_MS` later,
/// logging each grant (the grants after the warm-up count), until `done`.
fn change_now_and_then(
    addr: SocketAddr,
    key: &str,
    log: &ChangeLog,
    done: &AtomicBool,
    warmup: Duration,
) -> Result<(), String> {
    let mut conn = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    conn.set_nodelay(true).map_err(|e| e.to_string())?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut reader = io::BufReader::new(conn.try_clone().map_err(|e| e.to_string())?);
    let start = Instant::now();
    let mut next = start;
    let mut line = String::new();
    while !done.load(Ordering::Acquire) {
        let now = Instant::now();
        if now < next {
            std::thread::sleep((next - now).min(Duration::from_millis(20)));
            continue;
        }
        next += Duration::from_millis(RARE_EVERY_MS);
        let cause = Instant::now();
        conn.write_all(format!("A {key} {LEASE_MS} 1000\n").as_bytes())
            .map_err(|e| e.to_string())?;
        line.clear();
        io::BufRead::read_line(&mut reader, &mut line).map_err(|e| e.to_string())?;
        let token: u64 = match line.split_whitespace().collect::<Vec<_>>()[..] {
            ["A", token, k] if k == key => token.parse().map_err(|_| format!("{line:?}"))?,
            _ => return Err(format!("the changer's acquire got {line:?}")),
        };
        log.lock().push_back(Change {
            id: token,
            cause,
            in_window: cause.duration_since(start) >= warmup,
            after_free: true,
        });
        std::thread::sleep(Duration::from_millis(RARE_HOLD_MS));
        conn.write_all(format!("R {key} {token}\n").as_bytes())
            .map_err(|e| e.to_string())?;
        line.clear();
        io::BufRead::read_line(&mut reader, &mut line).map_err(|e| e.to_string())?;
        if line.trim_end() != format!("R {key}") {
            return Err(format!("the changer's release got {line:?}"));
        }
    }
    Ok(())
}

/// The rare-change rows' Markdown.
fn render_rare(options: &WatchOptions, rows: &[(usize, RareOutcome)]) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "\n### Watches: a key changed every {RARE_EVERY_MS} ms (held {RARE_HOLD_MS} ms), \
         while {} other clients acquire and release random keys as fast as they can\n\n",
        options.clients
    );
    out.push_str(
        "| watchers | system | other clients' pairs/s | ×no watchers | changes measured | \
         change → last watcher p50 | p99 | max | not reached | watchers dropped |\n",
    );
    out.push_str("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    let busy = |o: &RareOutcome| rate(o.busy.pairs, o.busy.secs);
    let baseline = rows.iter().find(|(n, _)| *n == 0).map(|(_, o)| busy(o));
    for (n, o) in rows {
        let f = &o.followed;
        if *n == 0 {
            let _ = writeln!(
                out,
                "| 0 | baton (W) | {} |  |  |  |  |  |  |  |",
                fmt_rate(busy(o))
            );
            continue;
        }
        let _ = writeln!(
            out,
            "| {} | baton (W) | {} | {} | {} | {} | {} | {} | {} | {} |",
            fmt_count(*n as u64),
            fmt_rate(busy(o)),
            baseline.map_or_else(String::new, |b| ratio(busy(o), b)),
            f.reached,
            fmt_ns(f.to_last.value_at_quantile(0.5)),
            fmt_ns(f.to_last.value_at_quantile(0.99)),
            fmt_ns(f.to_last.max()),
            f.unreached,
            f.dropped,
        );
    }
    out
}

fn run_one(
    sys: Sys,
    addr: SocketAddr,
    sha: &[u8],
    watchers: usize,
    clients: usize,
    shape: &Shape,
    run_no: u64,
) -> Result<WatchOutcome, String> {
    let key_prefix = format!("w{run_no}:");
    let key = engine::contended_key(&key_prefix);
    let fan = FanOut::connect(addr, sys == Sys::Redis, key.as_bytes(), watchers)?;
    let log: ChangeLog = Arc::new(Mutex::new(VecDeque::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let follower = {
        let (log, stop) = (log.clone(), stop.clone());
        std::thread::spawn(move || fan.follow(&log, &stop))
    };
    let spec = RunSpec {
        addr,
        proto: match sys {
            Sys::Baton => Proto::Baton,
            Sys::Redis => Proto::RedisLock,
        },
        conns: clients,
        workload: Workload::Contended {
            hold: Duration::ZERO,
        },
        lease_ms: LEASE_MS,
        wait_ms: WAIT_MS,
        warmup: shape.warmup,
        measure: shape.measure,
        drain: Duration::from_secs(3),
        key_prefix,
        threads: shape.threads,
        sha: sha.to_vec(),
        seed: shape.seed ^ run_no.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        tls: None,
        cpu_pids: Vec::new(),
        split: None,
        limit: None,
        changes: Some(log),
    };
    let owner = engine::run(&spec);
    stop.store(true, Ordering::Release);
    let followed = follower
        .join()
        .map_err(|_| "the fan-out reader panicked".to_string())?;
    let owner = owner?;
    let f = followed?;
    settle(sys, addr)?;
    Ok(WatchOutcome {
        owner,
        to_last: f.to_last,
        reached: f.reached,
        unreached: f.unreached,
        states: f.states,
        lines: f.lines,
        dropped: f.dropped,
    })
}

/// The most connections a server may still have when the next run
/// starts (the probe's own among them).
const SETTLED_CONNS: u64 = 16;

/// Wait until the server has let go of a run's connections (baton's `I`
/// `conns=`, Redis's `INFO clients`): closing 10,000 watchers keeps a
/// server busy for a while after the sockets are gone here, and the next
/// run, of either system, is not to pay for it.
fn settle(sys: Sys, addr: SocketAddr) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let conns = server_conns(sys, addr)?;
        if conns <= SETTLED_CONNS {
            if start.elapsed() > Duration::from_millis(100) {
                eprintln!(
                    "  {} let go of the run's connections after {} ms",
                    sys.name(),
                    start.elapsed().as_millis()
                );
            }
            return Ok(());
        }
        if start.elapsed() > SETUP_BOUND {
            return Err(format!(
                "{} still has {conns} connections {}s after a run",
                sys.name(),
                SETUP_BOUND.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How many client connections the server has now (baton: `I`'s
/// `conns=`; Redis: `INFO clients`).
pub(crate) fn server_conns(sys: Sys, addr: SocketAddr) -> Result<u64, String> {
    if sys == Sys::Baton {
        let info = crate::info(addr)?;
        return info
            .get("conns")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("baton: no conns= in {info:?}"));
    }
    let mut conn = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let mut ask = Vec::new();
    wire::resp_command(&mut ask, &[b"INFO", b"clients"]);
    let field = "connected_clients:";
    conn.write_all(&ask).map_err(|e| e.to_string())?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let start = Instant::now();
    loop {
        let text = String::from_utf8_lossy(&got);
        if let Some(at) = text.find(field) {
            let digits: String = text[at + field.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            let rest = &text[at + field.len() + digits.len()..];
            if !rest.is_empty() {
                return digits
                    .parse()
                    .map_err(|_| format!("{}: no count in {text:?}", sys.name()));
            }
        }
        if got.len() > 64 * 1024 || start.elapsed() > Duration::from_secs(5) {
            return Err(format!("{}: no {field} in {text:?}", sys.name()));
        }
        let n = conn.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(format!("{}: closed before {field}", sys.name()));
        }
        got.extend_from_slice(&buf[..n]);
    }
}

/// What the fan-out reader measured.
struct Followed {
    to_last: Histogram<u64>,
    reached: u64,
    unreached: u64,
    states: u64,
    lines: u64,
    dropped: u64,
}

struct Watcher {
    stream: TcpStream,
    partial: Vec<u8>,
    /// Every change up to this id has reached the watcher: the id of its
    /// newest line, or of the grant its newest line's free spell followed
    /// (0 before the first grant).
    seen: u64,
    /// What its newest line was.
    at: Seen,
    /// The first answer (the state at `W`, or the subscription) came.
    live: bool,
    gone: bool,
}

/// What a watcher's newest line was (baton: a `0` line names no grant).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    /// A state naming its id (`seen`).
    Id,
    /// The key free, in the spell after grant `seen` (0: before any grant).
    Free,
    /// The key free, in a spell not known yet: the first one after a grant
    /// at or after this id. `seen` holds the id of the line before.
    FreeFrom(u64),
}

/// Every watcher connection of a run, on one poll.
struct FanOut {
    redis: bool,
    key: Vec<u8>,
    poll: Poll,
    watchers: Vec<Watcher>,
    /// How many live watchers have seen each id as their newest.
    at: BTreeMap<u64, u32>,
    /// The grants a free spell followed (baton), as far as logged.
    frees: BTreeSet<u64>,
    /// Watchers at a free spell not known yet, by the least grant it may
    /// follow (an entry is stale once the watcher has moved on or gone).
    unknown_free: BTreeMap<u64, Vec<usize>>,
    frontier: u64,
    /// (frontier, when it got there), oldest first.
    history: VecDeque<(u64, Instant)>,
    live: usize,
    lines: u64,
    dropped: u64,
    scratch: Box<[u8]>,
}

impl FanOut {
    /// Connect `n` watchers and watch `key` on each (baton `W key`; Redis
    /// `SUBSCRIBE key`); returns once each has its first answer.
    fn connect(addr: SocketAddr, redis: bool, key: &[u8], n: usize) -> Result<FanOut, String> {
        let mut fan = FanOut {
            redis,
            key: key.to_vec(),
            poll: Poll::new().map_err(|e| format!("poll: {e}"))?,
            watchers: Vec::with_capacity(n),
            at: BTreeMap::new(),
            frees: BTreeSet::new(),
            unknown_free: BTreeMap::new(),
            frontier: 0,
            history: VecDeque::new(),
            live: 0,
            lines: 0,
            dropped: 0,
            scratch: vec![0; READ_CHUNK].into_boxed_slice(),
        };
        let mut request = Vec::new();
        if redis {
            wire::resp_command(&mut request, &[b"SUBSCRIBE", key]);
        } else {
            request.extend_from_slice(b"W ");
            request.extend_from_slice(key);
            request.push(b'\n');
        }
        let deadline = Instant::now() + SETUP_BOUND;
        while fan.watchers.len() < n {
            let batch = CONNECT_BATCH.min(n - fan.watchers.len());
            for _ in 0..batch {
                let mut stream =
                    std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(
                        |e| format!("watcher {}: connect {addr}: {e}", fan.watchers.len()),
                    )?;
                stream.set_nodelay(true).map_err(|e| e.to_string())?;
                no_linger(&stream)?;
                stream
                    .write_all(&request)
                    .map_err(|e| format!("watcher {}: write: {e}", fan.watchers.len()))?;
                stream.set_nonblocking(true).map_err(|e| e.to_string())?;
                let mut stream = TcpStream::from_std(stream);
                fan.poll
                    .registry()
                    .register(&mut stream, Token(fan.watchers.len()), Interest::READABLE)
                    .map_err(|e| format!("register: {e}"))?;
                fan.watchers.push(Watcher {
                    stream,
                    partial: Vec::new(),
                    seen: 0,
                    at: Seen::Id,
                    live: false,
                    gone: false,
                });
            }
            let mut events = Events::with_capacity(1024);
            while fan.live < fan.watchers.len() {
                if Instant::now() >= deadline {
                    return Err(format!(
                        "{} of {} watchers answered within {SETUP_BOUND:?}",
                        fan.live,
                        fan.watchers.len()
                    ));
                }
                fan.pump(&mut events, Duration::from_millis(50), true)?;
            }
        }
        Ok(fan)
    }

    /// Wait up to `timeout` for input and read all of it. `setup`: a
    /// watcher the server closes is an error (else it is dropped).
    fn pump(&mut self, events: &mut Events, timeout: Duration, setup: bool) -> Result<(), String> {
        if let Err(e) = self.poll.poll(events, Some(timeout))
            && e.kind() != io::ErrorKind::Interrupted
        {
            return Err(format!("poll: {e}"));
        }
        let tokens: Vec<usize> = events.iter().map(|e| e.token().0).collect();
        for w in tokens {
            if w < self.watchers.len() && !self.watchers[w].gone {
                self.read(w, setup)?;
            }
        }
        self.advance();
        Ok(())
    }

    /// Note where the frontier is now, if it moved.
    fn advance(&mut self) {
        if let Some((&least, _)) = self.at.first_key_value()
            && least > self.frontier
        {
            self.frontier = least;
            self.history.push_back((least, Instant::now()));
        }
    }

    fn read(&mut self, w: usize, setup: bool) -> Result<(), String> {
        loop {
            let n = match self.watchers[w].stream.read(&mut self.scratch) {
                Ok(0) => {
                    if setup {
                        return Err(format!("the server closed watcher {w}"));
                    }
                    self.drop_watcher(w);
                    return Ok(());
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if !setup => {
                    let _ = e;
                    self.drop_watcher(w);
                    return Ok(());
                }
                Err(e) => return Err(format!("watcher {w}: read: {e}")),
            };
            let mut buf = std::mem::take(&mut self.watchers[w].partial);
            buf.extend_from_slice(&self.scratch[..n]);
            let mut used = 0;
            while let Some((message, len)) =
                wire::parse_watched(self.redis, &self.key, &buf[used..])
                    .map_err(|e| format!("watcher {w}: {e}"))?
            {
                used += len;
                self.on_message(w, message);
            }
            buf.drain(..used);
            self.watchers[w].partial = buf;
            if n < self.scratch.len() {
                return Ok(());
            }
        }
    }

    fn on_message(&mut self, w: usize, message: Watched) {
        let watcher = &mut self.watchers[w];
        if !watcher.live {
            watcher.live = true;
            (watcher.seen, watcher.at) = match message {
                // The state at `W`: before the run's first grant, so a `0`
                // is the free spell before any grant.
                Watched::State(0) => (0, Seen::Free),
                Watched::State(id) => (id, Seen::Id),
                Watched::Subscribed => (0, Seen::Id),
            };
            *self.at.entry(watcher.seen).or_default() += 1;
            self.live += 1;
            return;
        }
        let Watched::State(id) = message else {
            return;
        };
        // The server sends a watcher only states newer than its last one.
        self.lines += 1;
        if id != 0 {
            watcher.at = Seen::Id;
            if id > watcher.seen {
                let old = watcher.seen;
                watcher.seen = id;
                self.leave(old);
                *self.at.entry(id).or_default() += 1;
            }
            return;
        }
        // baton: the key is free, in a spell after the watcher's last
        // state: the first one after a grant at or after `from`.
        let from = match watcher.at {
            Seen::Id => watcher.seen,
            Seen::Free => watcher.seen + 1,
            // Two free spells in a row, the first not known yet: the
            // first one known from there is no later than this one.
            Seen::FreeFrom(from) => from,
        };
        match self.frees.range(from..).next() {
            Some(&after) => self.move_to_free(w, after),
            None => {
                watcher.at = Seen::FreeFrom(from);
                self.unknown_free.entry(from).or_default().push(w);
            }
        }
    }

    /// Watcher `w` is in the free spell after grant `after`.
    fn move_to_free(&mut self, w: usize, after: u64) {
        let watcher = &mut self.watchers[w];
        watcher.at = Seen::Free;
        if after > watcher.seen {
            let old = watcher.seen;
            watcher.seen = after;
            self.leave(old);
            *self.at.entry(after).or_default() += 1;
        }
    }

    /// The key was free after grant `after` (logged in order): the
    /// watchers waiting to know their spell that this one is the first for
    /// move to it.
    fn learn_free(&mut self, after: u64) {
        if !self.frees.insert(after) {
            return;
        }
        let later = self.unknown_free.split_off(&(after + 1));
        let known = std::mem::replace(&mut self.unknown_free, later);
        for (from, waiting) in known {
            for w in waiting {
                let watcher = &self.watchers[w];
                if !watcher.gone && watcher.at == Seen::FreeFrom(from) {
                    self.move_to_free(w, after);
                }
            }
        }
        self.advance();
    }

    fn leave(&mut self, id: u64) {
        if let Some(count) = self.at.get_mut(&id) {
            *count -= 1;
            if *count == 0 {
                self.at.remove(&id);
            }
        }
    }

    fn drop_watcher(&mut self, w: usize) {
        let watcher = &mut self.watchers[w];
        watcher.gone = true;
        let seen = watcher.seen;
        let _ = self.poll.registry().deregister(&mut watcher.stream);
        if watcher.live {
            self.live -= 1;
            self.leave(seen);
        }
        self.dropped += 1;
    }

    /// Read every watcher and match the logged changes to the frontier
    /// until `stop` is set and the window's changes have reached everyone
    /// (or `GRACE` ran out).
    fn follow(mut self, log: &ChangeLog, stop: &AtomicBool) -> Result<Followed, String> {
        let mut pending: VecDeque<Change> = VecDeque::new();
        let mut out = Followed {
            to_last: Histogram::new_with_bounds(1, 100_000_000_000, 3)
                .expect("valid histogram bounds"),
            reached: 0,
            unreached: 0,
            states: 0,
            lines: 0,
            dropped: 0,
        };
        let mut events = Events::with_capacity(1024);
        let mut stop_by: Option<Instant> = None;
        // The last change logged, and whether the free spell after it (the
        // run's end: the drain released everything) has been noted.
        let mut last: Option<u64> = None;
        let mut ended = false;
        loop {
            self.pump(&mut events, Duration::from_millis(2), false)?;
            // Read before the log: once set, every change is in the log.
            let stopped = stop.load(Ordering::Acquire);
            let logged: Vec<Change> = log.lock().drain(..).collect();
            out.states += logged.len() as u64;
            for change in &logged {
                if !self.redis
                    && change.after_free
                    && let Some(before) = last
                {
                    self.learn_free(before);
                }
                last = Some(change.id);
            }
            pending.extend(logged);
            if stopped
                && !ended
                && !self.redis
                && let Some(before) = last
            {
                ended = true;
                self.learn_free(before);
            }
            while let Some(change) = pending.front().copied() {
                if self.at.is_empty() {
                    // No watchers (the baseline, or all dropped): nothing
                    // to reach.
                    pending.pop_front();
                    continue;
                }
                while self.history.front().is_some_and(|&(f, _)| f < change.id) {
                    self.history.pop_front();
                }
                let Some(&(_, when)) = self.history.front() else {
                    break;
                };
                pending.pop_front();
                if change.in_window {
                    out.reached += 1;
                    let ns = when.saturating_duration_since(change.cause).as_nanos() as u64;
                    out.to_last.saturating_record(ns.max(1));
                }
            }
            if stopped {
                let now = Instant::now();
                let by = *stop_by.get_or_insert(now + GRACE);
                if now >= by || !pending.iter().any(|c| c.in_window) {
                    break;
                }
            }
        }
        out.states += self.frees.len() as u64;
        out.unreached = pending.iter().filter(|c| c.in_window).count() as u64;
        out.lines = self.lines;
        out.dropped = self.dropped;
        Ok(out)
    }
}

/// Close with a reset, not a FIN: no TIME_WAIT left on this side.
pub(crate) fn no_linger(stream: &std::net::TcpStream) -> Result<(), String> {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a fully initialised `linger` of the size
    // passed.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(format!("SO_LINGER: {}", io::Error::last_os_error()));
    }
    Ok(())
}

/// Raise the soft open-file limit to the hard one; the soft limit now.
pub(crate) fn raise_fd_limit() -> libc::rlim_t {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    limit.rlim_cur
}

/// A share in percent: one decimal, or three under 1% (a baton watcher of a
/// key changing 20,000 times a second gets a small share of its states).
fn percent(p: f64) -> String {
    if p < 1.0 {
        format!("{p:.3}%")
    } else {
        format!("{p:.1}%")
    }
}

fn render(
    options: &WatchOptions,
    systems: &[Sys],
    counts: &[usize],
    outcomes: &[Vec<Option<WatchOutcome>>],
    extra_notes: &[String],
) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "\n### Watches: watchers of one key that a closed loop of {} clients changes as fast \
         as it can (acquire → release, hold 0)\n\n",
        options.clients
    );
    out.push_str(
        "| watchers | system | handoffs/s | ×no watchers | change → last watcher p50 | p99 | max | \
         changes measured | not reached | states delivered | watchers dropped | notes |\n",
    );
    out.push_str("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    let handoffs = |o: &WatchOutcome| rate(o.owner.grants, o.owner.secs);
    let mut targets = Vec::new();
    for (r, &n) in counts.iter().enumerate() {
        for (i, &sys) in systems.iter().enumerate() {
            let Some(o) = &outcomes[r][i] else {
                continue;
            };
            let baseline = outcomes[0][i].as_ref();
            let vs = if n == 0 {
                String::new()
            } else {
                baseline.map_or_else(String::new, |b| ratio(handoffs(o), handoffs(b)))
            };
            let (p50, p99, max, delivered) = if n == 0 {
                (String::new(), String::new(), String::new(), String::new())
            } else {
                let want = o.states as f64 * n as f64;
                (
                    fmt_ns(o.to_last.value_at_quantile(0.5)),
                    fmt_ns(o.to_last.value_at_quantile(0.99)),
                    fmt_ns(o.to_last.max()),
                    if want > 0.0 {
                        percent(100.0 * o.lines as f64 / want)
                    } else {
                        String::new()
                    },
                )
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {vs} | {p50} | {p99} | {max} | {} | {} | {delivered} | {} | {} |",
                fmt_count(n as u64),
                sys.name(),
                fmt_rate(handoffs(o)),
                if n == 0 {
                    String::new()
                } else {
                    o.reached.to_string()
                },
                if n == 0 {
                    String::new()
                } else {
                    o.unreached.to_string()
                },
                if n == 0 {
                    String::new()
                } else {
                    o.dropped.to_string()
                },
                notes(&o.owner),
            );
            if n > 0 && sys == Sys::Baton {
                let v = baseline.map(|b| handoffs(o) / handoffs(b).max(1e-9));
                targets.push((n, v));
            }
        }
    }
    out.push_str(
        "\nA change is a grant of the key; its time is when the request that made it was \
         sent (the release a handoff followed, else the acquire; for Redis the new holder's \
         `PUBLISH` of the change's id, sent with its release). Change → last watcher: until \
         every watcher has read a line with that change's state or a newer one (a baton \
         watcher that reads slowly skips states and ends on the latest; a `0` line, the key \
         free, counts as the first free spell newer than the watcher's line before it, the \
         spells known from the grants that came to a free key and the run's end). states \
         delivered = watcher lines read after the first (each a newer state) ÷ (states the \
         key went through × watchers), the states being the changes and, for baton, the free \
         spells between them. The Redis rows are the \
         `SET NX` lock whose every new holder publishes on the key's channel to `SUBSCRIBE`d \
         connections; the same loop publishes to nobody in its 0 row. One thread reads every \
         watcher, next to the load generator's.\n",
    );
    for note in extra_notes {
        let _ = writeln!(out, "\n{note}");
    }
    out.push_str(
        "\n#### Targets, watches (ratios from this interleaved run)\n\n\
         | target | goal | value | |\n|---|---|---:|---|\n",
    );
    for (n, v) in targets {
        let cell = v.map_or_else(
            || "n/a | ".to_string(),
            |v| format!("{v:.3} | {}", if v >= 0.9 { "PASS" } else { "**MISS**" }),
        );
        let _ = writeln!(
            out,
            "| {} watchers: the owner's handoffs/s / with no watchers | ≥ 0.9 | {cell} |",
            fmt_count(n as u64)
        );
    }
    out
}
