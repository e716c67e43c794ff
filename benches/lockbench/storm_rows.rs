//! The connection-storm rows of lockbench: a fleet connecting one client
//! after another, each connection left idle (as a client pool opens its
//! connections before its first request, after a restart or following a
//! failover), baton against redis-server in one interleaved run.
//!
//! Owns: the `--storm-baton`, `--storm-redis` (each with its `-pid`) and
//! `--storm-conns` options, the schedule (each row against each system,
//! the order reversed every other round) and the Markdown table. Rows:
//! - sequential: `--storm-conns` connects, one after another;
//! - stalled: the same, with the server stopped (SIGSTOP) for the first
//!   `STALL` of them, as if it were off the CPU that long (a busy
//!   machine's scheduler, a pause): what its listen backlog holds meanwhile
//!   is what decides.
//!
//! Per run: connections that waited for a retransmitted SYN (the socket's
//! `TCP_INFO` `tcpi_total_retrans`, and a connect of `SYN_RETRANSMIT` or
//! more: the first retransmission timeout), the total time, and the
//! connect time's p50, p99 and max. Between runs every connection is
//! closed with a reset (no TIME_WAIT left here) and the server is waited
//! for until it has let them go.
//!
//! Never does: start a server (scripts/bench.sh does), or leave a server
//! stopped (it is sent SIGCONT before any error is returned).

use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::tls_rows::Shape;
use crate::watch_rows::{self, Sys};

/// Connects per run unless `--storm-conns` says otherwise.
const DEFAULT_CONNS: usize = 10_000;
/// How long the stalled row keeps the server stopped.
const STALL: Duration = Duration::from_millis(50);
/// The first retransmission timeout of a SYN (Linux's `TCP_TIMEOUT_INIT`):
/// a connect this long waited for one.
const SYN_RETRANSMIT: Duration = Duration::from_secs(1);
/// The most one connect may take before the run fails.
const CONNECT_BOUND: Duration = Duration::from_secs(30);
/// The most a server may take to let go of a run's connections.
const SETTLE_BOUND: Duration = Duration::from_secs(60);
/// Connections a settled server may still have (the probe's own among them).
const SETTLED_CONNS: u64 = 16;
/// Files this process keeps beyond a run's sockets.
const FD_SPARE: usize = 256;

/// Where the storm servers are: each a fresh server whose connection limit
/// is above `conns`, with its PID (for the stalled row).
pub struct StormOptions {
    pub baton: Option<(SocketAddr, u32)>,
    pub redis: Option<(SocketAddr, u32)>,
    pub conns: Option<usize>,
}

/// The storm options (none given: no storm rows).
pub fn parse(args: &mut pico_args::Arguments) -> Result<StormOptions, String> {
    let err = |e: pico_args::Error| e.to_string();
    let mut pair =
        |flag: &'static str, pid_flag: &'static str| -> Result<Option<(SocketAddr, u32)>, String> {
            let addr = args.opt_value_from_str(flag).map_err(err)?;
            let pid = args.opt_value_from_str(pid_flag).map_err(err)?;
            match (addr, pid) {
                (Some(addr), Some(pid)) => Ok(Some((addr, pid))),
                (None, None) => Ok(None),
                _ => Err(format!("{flag} and {pid_flag} go together")),
            }
        };
    let baton = pair("--storm-baton", "--storm-baton-pid")?;
    let redis = pair("--storm-redis", "--storm-redis-pid")?;
    let conns = args.opt_value_from_str("--storm-conns").map_err(err)?;
    if conns.is_some_and(|n: usize| n == 0 || n > 100_000) {
        return Err("--storm-conns must be 1 to 100000".into());
    }
    Ok(StormOptions {
        baton,
        redis,
        conns,
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Row {
    Sequential,
    Stalled,
}

impl Row {
    fn name(self) -> String {
        match self {
            Row::Sequential => "sequential".into(),
            Row::Stalled => format!("stalled {} ms at the start", STALL.as_millis()),
        }
    }
}

const ROWS: [Row; 2] = [Row::Sequential, Row::Stalled];

/// What one run measured (summed over rounds).
#[derive(Default, Clone)]
struct Storm {
    runs: usize,
    conns: usize,
    /// Connections whose socket retransmitted (a SYN sent again).
    retransmitted: usize,
    /// Connects that took `SYN_RETRANSMIT` or more.
    waited: usize,
    /// Wall time of all the connects.
    total: Duration,
    connect_ns: Vec<u64>,
}

/// Run the storm rows; their Markdown section ("" without servers).
pub fn run(storm: &StormOptions, shape: &Shape) -> Result<String, String> {
    let mut systems: Vec<(Sys, SocketAddr, u32)> = Vec::new();
    if let Some((addr, pid)) = storm.baton {
        systems.push((Sys::Baton, addr, pid));
    }
    if let Some((addr, pid)) = storm.redis {
        systems.push((Sys::Redis, addr, pid));
    }
    if systems.is_empty() {
        return Ok(String::new());
    }
    let soft = watch_rows::raise_fd_limit() as usize;
    let mut conns = storm.conns.unwrap_or(DEFAULT_CONNS);
    let mut note = String::new();
    if conns + FD_SPARE > soft {
        conns = soft.saturating_sub(FD_SPARE).max(1);
        note = format!(" (scaled down: the open-file limit is {soft})");
    }
    let mut results = vec![vec![Storm::default(); systems.len()]; ROWS.len()];
    for round in 0..shape.rounds {
        for (r, &row) in ROWS.iter().enumerate() {
            let mut order: Vec<usize> = (0..systems.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for i in order {
                let (sys, addr, pid) = systems[i];
                eprintln!(
                    "round {} storm {} × {conns}: {}",
                    round + 1,
                    row.name(),
                    label(sys)
                );
                settle(sys, addr)?;
                let stall = (row == Row::Stalled).then_some(pid);
                let one = storm_once(addr, conns, stall)
                    .map_err(|e| format!("storm {} {}: {e}", row.name(), label(sys)))?;
                let so_far = &mut results[r][i];
                so_far.runs += 1;
                so_far.conns += one.conns;
                so_far.retransmitted += one.retransmitted;
                so_far.waited += one.waited;
                so_far.total += one.total;
                so_far.connect_ns.extend(one.connect_ns);
            }
        }
    }
    for &(sys, addr, _) in &systems {
        settle(sys, addr)?;
    }
    Ok(render(conns, &note, &systems, &results))
}

fn label(sys: Sys) -> &'static str {
    match sys {
        Sys::Baton => "baton",
        Sys::Redis => "redis",
    }
}

/// `conns` connects to `addr`, one after another, each left open; with
/// `stall`, that process is stopped for `STALL` from the first connect.
fn storm_once(addr: SocketAddr, conns: usize, stall: Option<u32>) -> Result<Storm, String> {
    let mut open: Vec<TcpStream> = Vec::with_capacity(conns);
    let mut out = Storm {
        conns,
        ..Storm::default()
    };
    let resume = stall.map(|pid| {
        signal(pid, libc::SIGSTOP);
        // Resumed from another thread: a connect may be blocked meanwhile
        // (a SYN lost to a full queue is retried only a second later).
        std::thread::spawn(move || {
            std::thread::sleep(STALL);
            signal(pid, libc::SIGCONT);
        })
    });
    let start = Instant::now();
    let mut failed = None;
    for i in 0..conns {
        let t = Instant::now();
        match TcpStream::connect_timeout(&addr, CONNECT_BOUND) {
            Ok(stream) => {
                let took = t.elapsed();
                out.connect_ns.push(took.as_nanos() as u64);
                if took >= SYN_RETRANSMIT {
                    out.waited += 1;
                }
                if total_retrans(&stream) > 0 {
                    out.retransmitted += 1;
                }
                open.push(stream);
            }
            Err(e) => {
                failed = Some(format!("connect {} of {conns}: {e}", i + 1));
                break;
            }
        }
    }
    out.total = start.elapsed();
    if let Some(resume) = resume {
        let _ = resume.join();
    }
    for stream in &open {
        let _ = watch_rows::no_linger(stream);
    }
    drop(open);
    match failed {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Send `sig` to `pid` (a server this run was given).
fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) reads no memory of ours.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// `tcpi_total_retrans` of a connected socket: a SYN sent again counts.
fn total_retrans(stream: &TcpStream) -> u32 {
    // SAFETY: tcp_info is plain data; getsockopt writes at most `len`
    // bytes of it.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if rc == 0 { info.tcpi_total_retrans } else { 0 }
}

/// Wait until the server has let go of the last run's connections.
fn settle(sys: Sys, addr: SocketAddr) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let conns = watch_rows::server_conns(sys, addr)?;
        if conns <= SETTLED_CONNS {
            return Ok(());
        }
        if start.elapsed() > SETTLE_BOUND {
            return Err(format!(
                "{} still has {conns} connections {} s after a storm",
                label(sys),
                SETTLE_BOUND.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn quantile_ms(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i] as f64 / 1e6
}

fn render(
    conns: usize,
    note: &str,
    systems: &[(Sys, SocketAddr, u32)],
    results: &[Vec<Storm>],
) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "\n### Connection storms: {conns} sequential idle connects{note}\n\n"
    ));
    out.push_str(
        "| row | system | runs | waited for a retransmitted SYN (connect ≥ 1 s) | \
         sockets that retransmitted | total s (per run) | connect p50 ms | p99 ms | max ms |\n",
    );
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (r, row) in ROWS.iter().enumerate() {
        for (i, (sys, _, _)) in systems.iter().enumerate() {
            let s = &results[r][i];
            if s.runs == 0 {
                continue;
            }
            let mut sorted = s.connect_ns.clone();
            sorted.sort_unstable();
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {:.2} | {:.3} | {:.3} | {:.0} |\n",
                row.name(),
                label(*sys),
                s.runs,
                s.waited,
                s.retransmitted,
                s.total.as_secs_f64() / s.runs as f64,
                quantile_ms(&sorted, 0.5),
                quantile_ms(&sorted, 0.99),
                quantile_ms(&sorted, 1.0),
            ));
        }
    }
    let find = |r: usize, want: Sys| {
        systems
            .iter()
            .position(|(s, _, _)| *s == want)
            .map(|i| &results[r][i])
            .filter(|s| s.runs > 0)
    };
    if systems.len() == 2 {
        out.push_str("\nbaton ÷ redis, total time of the storm (same run):\n\n");
        out.push_str("| row | total time | waited for a retransmitted SYN |\n|---|---:|---:|\n");
        for (r, row) in ROWS.iter().enumerate() {
            if let (Some(b), Some(x)) = (find(r, Sys::Baton), find(r, Sys::Redis)) {
                out.push_str(&format!(
                    "| {} | {:.2}× | {} vs {} |\n",
                    row.name(),
                    b.total.as_secs_f64() / x.total.as_secs_f64().max(1e-9),
                    b.waited,
                    x.waited
                ));
            }
        }
    }
    out
}
