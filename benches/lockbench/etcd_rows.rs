//! The etcd rows of lockbench (section `etcd`): baton beside the services
//! users would pick instead, etcd (its lock and election APIs through the
//! JSON gateway) and Redis, in one interleaved run.
//!
//! Owns: the `--etcd*`, `--kill-baton*` and `--election-handoffs` options;
//! the schedule (every row against every system given, the order reversed
//! every other round); the rows:
//! - uncontended lock → unlock, closed loop, C=1 and C=16, random names:
//!   pairs/s and acquire p50/p99;
//! - contended, C=16 on one name, hold 0: handoffs/s, acquire p99 and the
//!   fairness of the main tables ((max−min)/mean of grants per client);
//! - election: from the leader's release to an observer knowing the next
//!   leader (baton: `R` → the watcher's `W` line naming the waiting
//!   candidate; etcd: `resign` → the `observe` message; Redis: the
//!   compare-and-delete release → the `SUBSCRIBE`d message the next holder
//!   `PUBLISH`es once its retried `SET NX` wins, as the watch rows do);
//! - failover (last: it kills): a client doing lock → unlock pairs against
//!   a cluster's leader (baton: the active of 2 and of 3 nodes; etcd: the
//!   raft leader of 3 members), the leader SIGKILLed (a crash) or, on a
//!   second cluster, SIGSTOPped (a machine gone silent), the client
//!   following to another node; the time from the signal to the first
//!   grant of a lock sent after it.
//!
//! The baton and Redis load is engine.rs (as in the main tables); the etcd
//! load is etcd.rs; the baton and Redis election and failover clients are
//! here (blocking sockets: they time one request at a time).
//!
//! Never does: start a server, or end one but the failover rows' leaders
//! (one kill each per bench run: the killed node is not brought back).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use parking_lot::Mutex;

use crate::engine::{self, Outcome, RunSpec, Workload};
use crate::etcd::{self, LockLoad, Measured};
use crate::report::{fmt_ns, fmt_rate, rate, ratio};
use crate::tls_rows::Shape;
use crate::wire::{self, Proto};

/// Clients of the uncontended rows and of the contended row.
const UNCONTENDED: [usize; 2] = [1, 16];
const CONTENDED: usize = 16;
const LEASE_MS: u64 = 10_000;
const WAIT_MS: u64 = 30_000;
/// The most a failover may take (kill → first grant) before it is an error.
const FAILOVER_BOUND: Duration = Duration::from_secs(30);
/// A failover client's connect and answer timeout: far above either
/// system's slowest answer here, and the most a call to a frozen leader
/// holds the client up before it tries the next node.
const FAILOVER_TIMEOUT: Duration = Duration::from_millis(100);

/// The etcd rows' servers.
#[derive(Default)]
pub struct EtcdOptions {
    /// One etcd member, data on disk (fsync on, etcd's default).
    pub etcd: Option<SocketAddr>,
    /// One etcd member, data on tmpfs.
    pub etcd_tmpfs: Option<SocketAddr>,
    /// Three etcd members (client URLs) and their PIDs, in the same order:
    /// the lock rows' `etcd, 3 members`, its leader killed last.
    pub etcd3: Option<(Vec<SocketAddr>, Vec<u32>)>,
    /// The failover rows' clusters, in the order they are run.
    pub failovers: Vec<Target>,
    /// How etcd was run (or why not), printed under the tables.
    pub note: Option<String>,
    pub handoffs: usize,
}

/// One failover row's cluster.
pub struct Target {
    pub label: &'static str,
    pub etcd: bool,
    /// SIGSTOP (a leader that goes silent, as a hung or unplugged machine)
    /// rather than SIGKILL (a crashed process, whose port then refuses).
    pub freeze: bool,
    pub addrs: Vec<SocketAddr>,
    pub pids: Vec<u32>,
}

/// Take the etcd rows' options out of `args`.
pub fn parse(args: &mut pico_args::Arguments) -> Result<EtcdOptions, String> {
    let err = |e: pico_args::Error| e.to_string();
    let mut options = EtcdOptions {
        etcd: args.opt_value_from_str("--etcd").map_err(err)?,
        etcd_tmpfs: args.opt_value_from_str("--etcd-tmpfs").map_err(err)?,
        note: args.opt_value_from_str("--etcd-note").map_err(err)?,
        handoffs: args
            .opt_value_from_str("--election-handoffs")
            .map_err(err)?
            .unwrap_or(100),
        ..EtcdOptions::default()
    };
    if options.handoffs == 0 || options.handoffs > 100_000 {
        return Err("--election-handoffs must be 1 to 100000".into());
    }
    // (flag, its PIDs' flag, members, label, etcd, freeze): the failover
    // rows in order.
    for (flag, pid_flag, n, label, etcd, freeze) in [
        (
            "--kill-baton2",
            "--kill-baton2-pids",
            2,
            "baton, 2 nodes",
            false,
            false,
        ),
        (
            "--kill-baton3",
            "--kill-baton3-pids",
            3,
            "baton, 3 nodes",
            false,
            false,
        ),
        (
            "--etcd-cluster",
            "--etcd-cluster-pids",
            3,
            "etcd, 3 members",
            true,
            false,
        ),
        (
            "--freeze-baton2",
            "--freeze-baton2-pids",
            2,
            "baton, 2 nodes",
            false,
            true,
        ),
        (
            "--freeze-baton3",
            "--freeze-baton3-pids",
            3,
            "baton, 3 nodes",
            false,
            true,
        ),
        (
            "--freeze-etcd3",
            "--freeze-etcd3-pids",
            3,
            "etcd, 3 members",
            true,
            true,
        ),
    ] {
        let Some((addrs, pids)) = crate::flags::cluster(args, flag, pid_flag, n)? else {
            continue;
        };
        if flag == "--etcd-cluster" {
            options.etcd3 = Some((addrs.clone(), pids.clone()));
        }
        options.failovers.push(Target {
            label,
            etcd,
            freeze,
            addrs,
            pids,
        });
    }
    Ok(options)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Sys {
    Baton,
    BatonCluster,
    Redis,
    Etcd,
    Etcd3,
    EtcdTmpfs,
}

impl Sys {
    fn name(self) -> &'static str {
        match self {
            Sys::Baton => "baton",
            Sys::BatonCluster => "baton, 2 nodes",
            Sys::Redis => "redis (SET NX)",
            Sys::Etcd => "etcd",
            Sys::Etcd3 => "etcd, 3 members",
            Sys::EtcdTmpfs => "etcd on tmpfs",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum RowKind {
    Uncontended(usize),
    Contended,
    Election,
}

impl RowKind {
    fn label(self) -> String {
        match self {
            RowKind::Uncontended(c) => format!("uncontended C={c}"),
            RowKind::Contended => format!("contended C={CONTENDED} one key"),
            RowKind::Election => "election handoff".into(),
        }
    }
}

/// What a row measured of one system, over its rounds.
struct Got {
    lock: Option<Measured>,
    election: Option<Histogram<u64>>,
}

fn measured_of(o: &Outcome) -> Measured {
    Measured {
        secs: o.secs,
        pairs: o.pairs,
        grants: o.grants,
        errors: o.errors + o.timeouts + o.not_held + o.overlaps,
        first_error: o.first_error.clone(),
        acquire: o.acquire.clone(),
        per_client: o.per_client.clone(),
    }
}

fn merge(total: &mut Measured, more: Measured) -> Result<(), String> {
    total.secs += more.secs;
    total.pairs += more.pairs;
    total.grants += more.grants;
    total.errors += more.errors;
    if total.first_error.is_none() {
        total.first_error = more.first_error;
    }
    total
        .acquire
        .add(&more.acquire)
        .map_err(|e| e.to_string())?;
    for (a, b) in total.per_client.iter_mut().zip(&more.per_client) {
        *a += b;
    }
    Ok(())
}

/// The servers of the rows that are not etcd's own.
pub struct Others {
    pub baton: Option<SocketAddr>,
    pub cluster: Option<SocketAddr>,
    pub redis: Option<SocketAddr>,
}

/// Run the etcd rows; their Markdown section. `script_load` loads a Lua
/// script into a Redis and gives its SHA1.
pub fn run(
    options: &EtcdOptions,
    shape: &Shape,
    others: &Others,
    script_load: fn(SocketAddr, &str) -> Result<Vec<u8>, String>,
) -> Result<String, String> {
    // etcd 3 members: its clients start on the raft leader.
    let etcd3_leader = match &options.etcd3 {
        Some((addrs, _)) => Some(etcd_leader(addrs)?.0),
        None => None,
    };
    let mut servers: Vec<(Sys, SocketAddr)> = Vec::new();
    for (sys, addr) in [
        (Sys::Baton, others.baton),
        (Sys::Etcd, options.etcd),
        (Sys::Redis, others.redis),
        (Sys::BatonCluster, others.cluster),
        (Sys::Etcd3, etcd3_leader),
        (Sys::EtcdTmpfs, options.etcd_tmpfs),
    ] {
        if let Some(addr) = addr {
            servers.push((sys, addr));
        }
    }
    let sha = match others.redis {
        Some(addr) => script_load(addr, wire::RELEASE_SCRIPT)?,
        None => Vec::new(),
    };
    let mut rows: Vec<RowKind> = UNCONTENDED
        .iter()
        .map(|&c| RowKind::Uncontended(c))
        .collect();
    rows.push(RowKind::Contended);
    rows.push(RowKind::Election);
    let mut got: HashMap<(RowKind, Sys), Got> = HashMap::new();
    let mut run_no = 3_000_000u64;
    for round in 0..shape.rounds {
        for &row in &rows {
            let mut order = servers.clone();
            if round % 2 == 1 {
                order.reverse();
            }
            for (sys, addr) in order {
                run_no += 1;
                let prefix = format!("e{run_no}:");
                eprintln!("round {} etcd {}: {}", round + 1, row.label(), sys.name());
                let what = |e: String| format!("etcd rows {} {}: {e}", row.label(), sys.name());
                let entry = got.entry((row, sys)).or_insert(Got {
                    lock: None,
                    election: None,
                });
                if row == RowKind::Election {
                    let times = match sys {
                        Sys::Baton | Sys::BatonCluster => {
                            baton_election(addr, &format!("{prefix}el"), options.handoffs)
                        }
                        Sys::Redis => redis_election(
                            addr,
                            &format!("{prefix}el"),
                            options.handoffs,
                            shape.seed ^ run_no,
                        ),
                        _ => etcd::election_run(addr, &format!("{prefix}el"), options.handoffs),
                    }
                    .map_err(what)?;
                    match entry.election.as_mut() {
                        Some(total) => total.add(&times).map_err(|e| e.to_string())?,
                        None => entry.election = Some(times),
                    }
                    continue;
                }
                let (conns, load) = match row {
                    RowKind::Uncontended(c) => (c, LockLoad::Uncontended),
                    _ => (CONTENDED, LockLoad::Contended),
                };
                let measured = match sys {
                    Sys::Etcd | Sys::Etcd3 | Sys::EtcdTmpfs => {
                        etcd::lock_run(addr, conns, load, shape.warmup, shape.measure, &prefix)
                    }
                    _ => {
                        let (proto, sha) = if sys == Sys::Redis {
                            (Proto::RedisLock, sha.clone())
                        } else {
                            (Proto::Baton, Vec::new())
                        };
                        let spec = RunSpec {
                            addr,
                            proto,
                            conns,
                            workload: match load {
                                LockLoad::Uncontended => Workload::Uncontended { depth: 1 },
                                LockLoad::Contended => Workload::Contended {
                                    hold: Duration::ZERO,
                                },
                            },
                            lease_ms: LEASE_MS,
                            wait_ms: WAIT_MS,
                            warmup: shape.warmup,
                            measure: shape.measure,
                            drain: Duration::from_secs(3),
                            key_prefix: prefix.clone(),
                            threads: shape.threads,
                            sha,
                            seed: shape.seed ^ run_no.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                            tls: None,
                            cpu_pids: Vec::new(),
                            split: None,
                            limit: None,
                            changes: None,
                        };
                        engine::run(&spec).map(|o| measured_of(&o))
                    }
                }
                .map_err(what)?;
                match entry.lock.as_mut() {
                    Some(total) => merge(total, measured)?,
                    None => entry.lock = Some(measured),
                }
            }
        }
    }
    // Last: the failover rows kill their clusters' leaders.
    let mut failovers: Vec<(&Target, Result<Failover, String>)> = Vec::new();
    for target in &options.failovers {
        eprintln!(
            "etcd rows: failover of {}, leader {}",
            target.label,
            if target.freeze { "frozen" } else { "killed" }
        );
        let result = if target.etcd {
            etcd_failover(target)
        } else {
            baton_failover(target)
        };
        failovers.push((target, result));
    }
    Ok(render(options, &rows, &servers, &got, &failovers, shape))
}

// ---------------------------------------------------------------------------
// Elections: baton and Redis
// ---------------------------------------------------------------------------

fn line_conn(addr: SocketAddr, timeout: Duration) -> Result<BufReader<TcpStream>, String> {
    let stream =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect {addr}: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    Ok(BufReader::new(stream))
}

fn send_line(conn: &mut BufReader<TcpStream>, line: &str) -> Result<(), String> {
    conn.get_mut()
        .write_all(format!("{line}\n").as_bytes())
        .map_err(|e| format!("write: {e}"))
}

fn read_line(conn: &mut BufReader<TcpStream>) -> Result<String, String> {
    let mut line = String::new();
    let n = (&mut *conn)
        .take(2048)
        .read_line(&mut line)
        .map_err(|e| format!("read: {e}"))?;
    if n == 0 {
        return Err("connection closed".into());
    }
    Ok(line.trim_end().to_string())
}

/// baton: two candidates take turns at key `name` (limit 1, their value
/// naming the turn); an observer watches it (`W`).
fn baton_election(addr: SocketAddr, name: &str, handoffs: usize) -> Result<Histogram<u64>, String> {
    let timeout = etcd::CALL_TIMEOUT;
    let mut candidates = [line_conn(addr, timeout)?, line_conn(addr, timeout)?];
    let mut observer = line_conn(addr, timeout)?;
    let mut control = line_conn(addr, timeout)?;
    let grant = |conn: &mut BufReader<TcpStream>| -> Result<String, String> {
        let line = read_line(conn)?;
        let fields: Vec<&str> = line.split(' ').collect();
        match fields.as_slice() {
            ["A", token, key, ..] if *key == name => Ok(token.to_string()),
            _ => Err(format!("campaign answered {line:?}")),
        }
    };
    send_line(&mut candidates[0], &format!("A {name} 60 0 1 c0-0"))?;
    let mut token = grant(&mut candidates[0])?;
    send_line(&mut observer, &format!("W {name}"))?;
    let first = read_line(&mut observer)?;
    if first.split(' ').nth(5) != Some("c0-0") {
        return Err(format!("watch answered {first:?}"));
    }
    let mut times = etcd::histogram();
    let mut current = 0;
    for i in 1..=handoffs {
        let next = 1 - current;
        let value = format!("c{next}-{i}");
        send_line(&mut candidates[next], &format!("A {name} 60 0 1 {value}"))?;
        etcd::poll_until(timeout, "the campaign in line", || {
            send_line(&mut control, &format!("Q {name}"))?;
            let line = read_line(&mut control)?;
            let waiting = line.split(' ').nth(4).and_then(|w| w.parse::<u64>().ok());
            Ok(waiting.is_some_and(|w| w >= 1))
        })?;
        let released = Instant::now();
        send_line(&mut candidates[current], &format!("R {name} {token}"))?;
        loop {
            let line = read_line(&mut observer)?;
            if !line.starts_with("W ") {
                return Err(format!("watch sent {line:?}"));
            }
            if line.split(' ').nth(5) == Some(value.as_str()) {
                break;
            }
        }
        times
            .record(released.elapsed().as_nanos() as u64)
            .map_err(|e| e.to_string())?;
        let released_line = read_line(&mut candidates[current])?;
        if released_line != format!("R {name}") {
            return Err(format!("release answered {released_line:?}"));
        }
        token = grant(&mut candidates[next])?;
        current = next;
    }
    send_line(&mut candidates[current], &format!("R {name} {token}"))?;
    read_line(&mut candidates[current])?;
    Ok(times)
}

/// A RESP answer, as far as the Redis election reads them.
#[derive(Debug, PartialEq)]
enum Resp {
    Simple(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Resp>),
}

fn read_resp(conn: &mut BufReader<TcpStream>, depth: usize) -> Result<Resp, String> {
    let line = read_line(conn)?;
    let (kind, rest) = line.split_at(line.len().min(1));
    let n = || {
        rest.parse::<i64>()
            .map_err(|_| format!("bad RESP {line:?}"))
    };
    match kind {
        "+" => Ok(Resp::Simple(rest.to_string())),
        "-" => Err(format!("redis: {rest}")),
        ":" => Ok(Resp::Int(n()?)),
        "$" if n()? < 0 => Ok(Resp::Bulk(None)),
        "$" => {
            let len = n()? as usize;
            if len > 1 << 20 {
                return Err(format!("bulk of {len} bytes"));
            }
            let mut data = vec![0; len + 2];
            conn.read_exact(&mut data)
                .map_err(|e| format!("read: {e}"))?;
            data.truncate(len);
            Ok(Resp::Bulk(Some(data)))
        }
        "*" if depth < 4 => {
            let len = n()?.clamp(0, 16) as usize;
            (0..len)
                .map(|_| read_resp(conn, depth + 1))
                .collect::<Result<Vec<_>, _>>()
                .map(Resp::Array)
        }
        _ => Err(format!("unexpected RESP {line:?}")),
    }
}

fn redis_call(conn: &mut BufReader<TcpStream>, args: &[&[u8]]) -> Result<Resp, String> {
    let mut command = Vec::new();
    wire::resp_command(&mut command, args);
    conn.get_mut()
        .write_all(&command)
        .map_err(|e| format!("write: {e}"))?;
    read_resp(conn, 0)
}

/// Redis: two candidates take turns at key `name` (`SET NX PX`, retried
/// after a jittered ~1 ms like the Redis lock; the winner `PUBLISH`es its
/// value); an observer `SUBSCRIBE`s.
fn redis_election(
    addr: SocketAddr,
    name: &str,
    handoffs: usize,
    seed: u64,
) -> Result<Histogram<u64>, String> {
    let timeout = etcd::CALL_TIMEOUT;
    let mut candidates = [
        Some(line_conn(addr, timeout)?),
        Some(line_conn(addr, timeout)?),
    ];
    let mut observer = line_conn(addr, timeout)?;
    let channel = format!("{name}:leader");
    let set = |conn: &mut BufReader<TcpStream>, value: &str| -> Result<bool, String> {
        match redis_call(
            conn,
            &[
                b"SET",
                name.as_bytes(),
                value.as_bytes(),
                b"NX",
                b"PX",
                b"60000",
            ],
        )? {
            Resp::Simple(s) if s == "OK" => Ok(true),
            Resp::Bulk(None) => Ok(false),
            other => Err(format!("SET answered {other:?}")),
        }
    };
    let first = candidates[0].as_mut().expect("just made");
    if !set(first, "c0-0")? {
        return Err(format!("{name} is already held"));
    }
    redis_call(&mut observer, &[b"SUBSCRIBE", channel.as_bytes()])?;
    let mut times = etcd::histogram();
    let mut current = 0;
    let mut current_value = "c0-0".to_string();
    let mut rng = seed | 1;
    for i in 1..=handoffs {
        let next = 1 - current;
        let value = format!("c{next}-{i}");
        let mut conn = candidates[next].take().expect("each candidate's own");
        let (queued_tx, queued_rx) = std::sync::mpsc::channel();
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let mut jitter = rng;
        let (key, channel, value_c) = (name.to_string(), channel.clone(), value.clone());
        let candidate = std::thread::spawn(move || {
            let mut tries = 0u32;
            loop {
                let won = match redis_call(
                    &mut conn,
                    &[
                        b"SET",
                        key.as_bytes(),
                        value_c.as_bytes(),
                        b"NX",
                        b"PX",
                        b"60000",
                    ],
                )? {
                    Resp::Simple(s) if s == "OK" => true,
                    Resp::Bulk(None) => false,
                    other => return Err(format!("SET answered {other:?}")),
                };
                if won {
                    redis_call(
                        &mut conn,
                        &[b"PUBLISH", channel.as_bytes(), value_c.as_bytes()],
                    )?;
                    return Ok(conn);
                }
                if tries == 0 {
                    let _ = queued_tx.send(());
                }
                tries += 1;
                if tries > 200_000 {
                    return Err("SET NX never won".into());
                }
                jitter ^= jitter << 13;
                jitter ^= jitter >> 7;
                jitter ^= jitter << 17;
                let us = engine::RETRY_MS * 1000.0 * (0.5 + (jitter % 1000) as f64 / 1000.0);
                std::thread::sleep(Duration::from_micros(us as u64));
            }
        });
        queued_rx
            .recv_timeout(timeout)
            .map_err(|_| "the candidate's first SET NX did not come back".to_string())?;
        let released = Instant::now();
        let release = redis_call(
            candidates[current].as_mut().expect("the leader's"),
            &[
                b"EVAL",
                wire::RELEASE_SCRIPT.as_bytes(),
                b"1",
                name.as_bytes(),
                current_value.as_bytes(),
            ],
        )?;
        if release != Resp::Int(1) {
            return Err(format!("release answered {release:?}"));
        }
        loop {
            match read_resp(&mut observer, 0)? {
                Resp::Array(parts) if parts.len() == 3 => {
                    if parts[2] == Resp::Bulk(Some(value.as_bytes().to_vec())) {
                        break;
                    }
                }
                other => return Err(format!("SUBSCRIBE sent {other:?}")),
            }
        }
        times
            .record(released.elapsed().as_nanos() as u64)
            .map_err(|e| e.to_string())?;
        let conn = candidate
            .join()
            .map_err(|_| "a candidate thread panicked".to_string())??;
        candidates[next] = Some(conn);
        current = next;
        current_value = value;
    }
    redis_call(
        candidates[current].as_mut().expect("the leader's"),
        &[b"DEL", name.as_bytes()],
    )?;
    Ok(times)
}

// ---------------------------------------------------------------------------
// Failover
// ---------------------------------------------------------------------------

/// What a failover row measured.
struct Failover {
    /// SIGKILL → the first grant of a lock sent after it.
    kill_to_grant: Duration,
    /// The last grant before the kill → that grant.
    longest_gap: Duration,
    /// Failed attempts in between (connects refused, redirects, errors).
    failed: u64,
}

/// A client that follows its cluster: one lock → unlock pair per call,
/// giving (lock sent, lock granted).
trait Follower: Send + 'static {
    fn pair(&mut self) -> Result<(Instant, Instant), String>;
}

struct BatonFollower {
    addrs: Vec<SocketAddr>,
    at: usize,
    conn: Option<BufReader<TcpStream>>,
    i: u64,
}

impl Follower for BatonFollower {
    fn pair(&mut self) -> Result<(Instant, Instant), String> {
        self.i += 1;
        let key = format!("fo:{}", self.i);
        let result = self.try_pair(&key);
        if result.is_err() {
            std::thread::sleep(Duration::from_millis(1));
        }
        result
    }
}

impl BatonFollower {
    fn try_pair(&mut self, key: &str) -> Result<(Instant, Instant), String> {
        let conn = match self.conn.as_mut() {
            Some(conn) => conn,
            None => match line_conn(self.addrs[self.at], FAILOVER_TIMEOUT) {
                Ok(conn) => self.conn.insert(conn),
                Err(e) => {
                    self.at = (self.at + 1) % self.addrs.len();
                    return Err(e);
                }
            },
        };
        let sent = Instant::now();
        let answer = send_line(conn, &format!("A {key} 10 2")).and_then(|()| read_line(conn));
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                self.conn = None;
                self.at = (self.at + 1) % self.addrs.len();
                return Err(e);
            }
        };
        let fields: Vec<&str> = answer.split(' ').collect();
        match fields.as_slice() {
            ["A", token, _] => {
                let granted = Instant::now();
                send_line(conn, &format!("R {key} {token}"))?;
                let released = read_line(conn)?;
                if released != format!("R {key}") {
                    return Err(format!("release answered {released:?}"));
                }
                Ok((sent, granted))
            }
            ["M", "-", ..] => Err("no active known".into()),
            ["M", to, ..] => {
                let to: SocketAddr = to.parse().map_err(|_| format!("bad redirect {answer:?}"))?;
                self.at = match self.addrs.iter().position(|&a| a == to) {
                    Some(at) => at,
                    None => {
                        self.addrs.push(to);
                        self.addrs.len() - 1
                    }
                };
                self.conn = None;
                Err(format!("moved to {to}"))
            }
            _ => Err(format!("acquire answered {answer:?}")),
        }
    }
}

struct EtcdFollower {
    addrs: Vec<SocketAddr>,
    at: usize,
    client: Option<etcd::Client>,
    lease: Option<u64>,
    i: u64,
}

impl Follower for EtcdFollower {
    fn pair(&mut self) -> Result<(Instant, Instant), String> {
        self.i += 1;
        let result = self.try_pair();
        if result.is_err() {
            self.client = None;
            self.at = (self.at + 1) % self.addrs.len();
            std::thread::sleep(Duration::from_millis(1));
        }
        result
    }
}

impl EtcdFollower {
    fn try_pair(&mut self) -> Result<(Instant, Instant), String> {
        let client = match self.client.as_mut() {
            Some(client) => client,
            None => self.client.insert(etcd::Client::connect(
                self.addrs[self.at],
                FAILOVER_TIMEOUT,
            )?),
        };
        let lease = match self.lease {
            Some(lease) => lease,
            None => *self.lease.insert(client.lease_grant(etcd::LEASE_TTL_S)?),
        };
        let sent = Instant::now();
        let key = client.lock(format!("fo:{}", self.i).as_bytes(), lease)?;
        let granted = Instant::now();
        client.unlock(&key)?;
        Ok((sent, granted))
    }
}

/// Run `client` in a thread; once it has granted a while, SIGKILL `pid`
/// (or SIGSTOP it, then SIGKILL it once measured) and wait for a grant of
/// a lock sent after the signal.
fn failover_run(mut client: impl Follower, pid: u32, freeze: bool) -> Result<Failover, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let grants: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let failed = Arc::new(Mutex::new((0u64, None::<String>)));
    let worker = {
        let (stop, grants, failed) = (stop.clone(), grants.clone(), failed.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match client.pair() {
                    Ok(times) => grants.lock().push(times),
                    Err(e) => {
                        let mut failed = failed.lock();
                        failed.0 += 1;
                        failed.1.get_or_insert(e);
                    }
                }
            }
        })
    };
    let result = (|| {
        etcd::poll_until(Duration::from_secs(10), "grants before the kill", || {
            Ok(grants.lock().len() >= 50)
        })?;
        let failed_before = failed.lock().0;
        std::thread::sleep(Duration::from_millis(200));
        let killed = Instant::now();
        let signal = if freeze { libc::SIGSTOP } else { libc::SIGKILL };
        // SAFETY: kill(2) reads no memory of ours.
        if unsafe { libc::kill(pid as libc::pid_t, signal) } != 0 {
            return Err(format!("kill {pid}: {}", std::io::Error::last_os_error()));
        }
        let mut after = None;
        etcd::poll_until(FAILOVER_BOUND, "a grant after the kill", || {
            after = grants
                .lock()
                .iter()
                .find(|(sent, _)| *sent >= killed)
                .map(|&(_, granted)| granted);
            Ok(after.is_some())
        })
        .map_err(|e| {
            let failed = failed.lock();
            format!(
                "{e} ({} failed attempts, the first: {:?})",
                failed.0, failed.1
            )
        })?;
        let after = after.expect("polled for");
        let before = grants
            .lock()
            .iter()
            .map(|&(_, granted)| granted)
            .filter(|&g| g < killed)
            .max()
            .unwrap_or(killed);
        Ok(Failover {
            kill_to_grant: after - killed,
            longest_gap: after - before,
            failed: failed.lock().0 - failed_before,
        })
    })();
    if freeze {
        // Measured: a stopped node would only hold up the script's cleanup.
        // SAFETY: kill(2) reads no memory of ours.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    }
    stop.store(true, Ordering::Relaxed);
    let _ = worker.join();
    result
}

/// The active of a baton cluster (the first of `addrs` that says so).
fn baton_active(addrs: &[SocketAddr]) -> Result<usize, String> {
    for (i, &addr) in addrs.iter().enumerate() {
        let Ok(mut conn) = line_conn(addr, FAILOVER_TIMEOUT) else {
            continue;
        };
        send_line(&mut conn, "I")?;
        if read_line(&mut conn)?.contains("role=active") {
            return Ok(i);
        }
    }
    Err(format!("no active among {addrs:?}"))
}

fn baton_failover(target: &Target) -> Result<Failover, String> {
    let active = baton_active(&target.addrs)?;
    let client = BatonFollower {
        addrs: target.addrs.clone(),
        at: active,
        conn: None,
        i: 0,
    };
    failover_run(client, target.pids[active], target.freeze)
}

/// The raft leader of an etcd cluster: its client address and index.
fn etcd_leader(addrs: &[SocketAddr]) -> Result<(SocketAddr, usize), String> {
    let mut ids = Vec::new();
    let mut leader = None;
    for &addr in addrs {
        let (me, lead) = etcd::Client::connect(addr, FAILOVER_TIMEOUT)?.status()?;
        ids.push(me);
        leader = leader.or((lead != 0).then_some(lead));
    }
    let at = leader
        .and_then(|lead| ids.iter().position(|&id| id == lead))
        .ok_or_else(|| format!("no leader among {addrs:?}"))?;
    Ok((addrs[at], at))
}

fn etcd_failover(target: &Target) -> Result<Failover, String> {
    let (_, leader) = etcd_leader(&target.addrs)?;
    let client = EtcdFollower {
        addrs: target.addrs.clone(),
        at: leader,
        client: None,
        lease: None,
        i: 0,
    };
    failover_run(client, target.pids[leader], target.freeze)
}

// ---------------------------------------------------------------------------
// Tables
// ---------------------------------------------------------------------------

/// (max − min) / mean of grants per client: the main tables' fairness.
fn spread(per_client: &[u64]) -> f64 {
    let min = per_client.iter().copied().min().unwrap_or(0);
    let max = per_client.iter().copied().max().unwrap_or(0);
    let mean = per_client.iter().sum::<u64>() as f64 / per_client.len().max(1) as f64;
    if mean > 0.0 {
        (max - min) as f64 / mean
    } else {
        0.0
    }
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn render(
    options: &EtcdOptions,
    rows: &[RowKind],
    servers: &[(Sys, SocketAddr)],
    got: &HashMap<(RowKind, Sys), Got>,
    failovers: &[(&Target, Result<Failover, String>)],
    shape: &Shape,
) -> String {
    let mut out = String::new();
    let lock = |row: RowKind, sys: Sys| got.get(&(row, sys)).and_then(|g| g.lock.as_ref());
    let election = |sys: Sys| {
        got.get(&(RowKind::Election, sys))
            .and_then(|g| g.election.as_ref())
    };
    let etcd_ref = |row: RowKind| lock(row, Sys::Etcd);
    out.push_str("\n### Against etcd: locks\n\n");
    out.push_str(
        "| row | system | pairs/s | handoffs/s | acq p50 | acq p99 | grants/client \
         (max−min)/mean | rate ÷ etcd | etcd p99 ÷ this p99 | errors |\n",
    );
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for &row in rows {
        if row == RowKind::Election {
            continue;
        }
        for &(sys, _) in servers {
            let Some(m) = lock(row, sys) else { continue };
            let contended = row == RowKind::Contended;
            let this_rate = if contended {
                rate(m.grants, m.secs)
            } else {
                rate(m.pairs, m.secs)
            };
            let (vs_rate, vs_p99) = match etcd_ref(row) {
                Some(e) => {
                    let e_rate = if contended {
                        rate(e.grants, e.secs)
                    } else {
                        rate(e.pairs, e.secs)
                    };
                    (
                        ratio(this_rate, e_rate),
                        ratio(
                            e.acquire.value_at_quantile(0.99) as f64,
                            m.acquire.value_at_quantile(0.99) as f64,
                        ),
                    )
                }
                None => ("–".into(), "–".into()),
            };
            let errors = match (m.errors, &m.first_error) {
                (0, _) => String::new(),
                (n, Some(e)) => format!("{n}, the first: {e}"),
                (n, None) => n.to_string(),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {vs_rate} | {vs_p99} | {errors} |",
                row.label(),
                sys.name(),
                if contended {
                    "–".into()
                } else {
                    fmt_rate(rate(m.pairs, m.secs))
                },
                if contended {
                    fmt_rate(rate(m.grants, m.secs))
                } else {
                    "–".into()
                },
                fmt_ns(m.acquire.value_at_quantile(0.5)),
                fmt_ns(m.acquire.value_at_quantile(0.99)),
                if contended {
                    format!("{:.3}", spread(&m.per_client))
                } else {
                    "–".into()
                },
            );
        }
    }
    out.push_str(
        "\nClosed loop: each client locks, then unlocks at once (hold 0). baton and Redis \
         are driven by the main tables' load generator (one thread, all connections); etcd \
         by one thread per client with one lease each (as etcd's `concurrency.Session`), \
         `POST /v3/lock/lock` {name, lease} then `/v3/lock/unlock` {key} over keep-alive \
         HTTP/1.1 to the gateway. Acquire: lock sent → its answer. rate ÷ etcd: this \
         system's pairs/s (contended: handoffs/s) ÷ one etcd member's on disk, same row, \
         same run.\n",
    );
    out.push_str(
        "\n### Against etcd: a leader's release → the next leader known to an observer\n\n",
    );
    out.push_str("| system | handoffs | p50 | p99 | max | etcd p50 ÷ this p50 |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|\n");
    for &(sys, _) in servers {
        let Some(h) = election(sys) else { continue };
        let vs = election(Sys::Etcd).map_or_else(
            || "–".into(),
            |e| {
                ratio(
                    e.value_at_quantile(0.5) as f64,
                    h.value_at_quantile(0.5) as f64,
                )
            },
        );
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {vs} |",
            sys.name(),
            h.len(),
            fmt_ns(h.value_at_quantile(0.5)),
            fmt_ns(h.value_at_quantile(0.99)),
            fmt_ns(h.max()),
        );
    }
    let _ = write!(
        out,
        "\nTwo candidates take turns, {} handoffs per round: once the waiting candidate is \
         in line (baton: `Q` shows it waiting; etcd: its campaign's key is written; \
         Redis: its first `SET NX` was refused), the leader releases, timed to the \
         observer's message naming the waiting candidate. baton: `A key 60 0 1 <value>`, \
         `R`, the observer's `W` line; etcd: `/v3/election/campaign`, `resign`, the \
         `observe` stream; Redis: `SET NX PX` retried every ~{} ms (jittered), the \
         compare-and-delete release, the winner's `PUBLISH` to a `SUBSCRIBE`d observer.\n",
        options.handoffs,
        engine::RETRY_MS
    );
    out.push_str("\n### Against etcd: time without a lock service across a lost leader\n\n");
    out.push_str(
        "| cluster | leader | signal → first grant | last grant before → first after | \
         failed attempts |\n",
    );
    out.push_str("|---|---|---:|---:|---:|\n");
    for (target, result) in failovers {
        let how = if target.freeze {
            "frozen (SIGSTOP)"
        } else {
            "killed (SIGKILL)"
        };
        match result {
            Ok(f) => {
                let _ = writeln!(
                    out,
                    "| {} | {how} | {} | {} | {} |",
                    target.label,
                    ms(f.kill_to_grant),
                    ms(f.longest_gap),
                    f.failed
                );
            }
            Err(e) => {
                let _ = writeln!(out, "| {} | {how} | failed: {e} | | |", target.label);
            }
        }
    }
    out.push_str(
        "\nOne client doing lock → unlock pairs against the leader (baton: the active; etcd: \
         the raft leader), the leader SIGKILLed (a crashed process: its port refuses at \
         once) or SIGSTOPped (a hung or unplugged machine: it goes silent); the client \
         moves on a refused connection, an error or a timeout (100 ms) to the next node \
         (baton: also where `M` points), 1 ms after a failure. signal → first grant: to the \
         grant of the first lock sent after the signal (up to about the 100 ms timeout \
         more than the true gap when the leader is frozen). One fresh cluster per row per \
         run, default flags (baton `--detect 1`: a silent peer is dead after 1.25 s, a \
         refused port at once; etcd: heartbeat 100 ms, election timeout 1000 ms, \
         randomized up to 2×). Redis has no failover without Sentinel: n/a.\n",
    );
    // Ratios.
    let ratio_of = |num: Option<f64>, den: Option<f64>| match (num, den) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "n/a".into(),
    };
    let per_sec = |row: RowKind, sys: Sys| {
        lock(row, sys).map(|m| {
            if row == RowKind::Contended {
                rate(m.grants, m.secs)
            } else {
                rate(m.pairs, m.secs)
            }
        })
    };
    let p99 =
        |row: RowKind, sys: Sys| lock(row, sys).map(|m| m.acquire.value_at_quantile(0.99) as f64);
    let el50 = |sys: Sys| election(sys).map(|h| h.value_at_quantile(0.5) as f64);
    let fo = |label: &str, freeze: bool| {
        failovers
            .iter()
            .find(|(t, _)| t.label == label && t.freeze == freeze)
            .and_then(|(_, r)| r.as_ref().ok())
            .map(|f| f.kill_to_grant.as_secs_f64())
    };
    out.push_str("\n#### Ratios, this run (baton ÷ etcd: above 1 is baton ahead)\n\n");
    out.push_str("| measure | baton ÷ etcd (1 member, disk) | baton 2 nodes ÷ etcd 3 members | baton ÷ redis |\n");
    out.push_str("|---|---:|---:|---:|\n");
    for &row in rows {
        if row == RowKind::Election {
            continue;
        }
        let what = if row == RowKind::Contended {
            "handoffs/s"
        } else {
            "pairs/s"
        };
        let _ = writeln!(
            out,
            "| {} {what} | {} | {} | {} |",
            row.label(),
            ratio_of(per_sec(row, Sys::Baton), per_sec(row, Sys::Etcd)),
            ratio_of(per_sec(row, Sys::BatonCluster), per_sec(row, Sys::Etcd3)),
            ratio_of(per_sec(row, Sys::Baton), per_sec(row, Sys::Redis)),
        );
        let _ = writeln!(
            out,
            "| {} acquire p99 (other's ÷ baton's) | {} | {} | {} |",
            row.label(),
            ratio_of(p99(row, Sys::Etcd), p99(row, Sys::Baton)),
            ratio_of(p99(row, Sys::Etcd3), p99(row, Sys::BatonCluster)),
            ratio_of(p99(row, Sys::Redis), p99(row, Sys::Baton)),
        );
    }
    let _ = writeln!(
        out,
        "| election handoff p50 (other's ÷ baton's) | {} | {} | {} |",
        ratio_of(el50(Sys::Etcd), el50(Sys::Baton)),
        ratio_of(el50(Sys::Etcd3), el50(Sys::BatonCluster)),
        ratio_of(el50(Sys::Redis), el50(Sys::Baton)),
    );
    for (freeze, what) in [(false, "killed"), (true, "frozen")] {
        let _ = writeln!(
            out,
            "| time without a lock service, leader {what} (etcd 3 members ÷ baton) | n/a | \
             {} (baton 3 nodes: {}) | n/a |",
            ratio_of(fo("etcd, 3 members", freeze), fo("baton, 2 nodes", freeze)),
            ratio_of(fo("etcd, 3 members", freeze), fo("baton, 3 nodes", freeze)),
        );
    }
    let _ = write!(
        out,
        "\n{} round(s) of {:.1}s warmup + {:.1}s measured per (row, system), interleaved. {}\n",
        shape.rounds,
        shape.warmup.as_secs_f64(),
        shape.measure.as_secs_f64(),
        options.note.as_deref().unwrap_or(""),
    );
    if servers
        .iter()
        .all(|(s, _)| !matches!(s, Sys::Etcd | Sys::Etcd3 | Sys::EtcdTmpfs))
    {
        out.push_str("\nNo etcd given: its rows are left out.\n");
    }
    out
}
