//! lockbench: the load harness that compares baton with a Redis lock.
//!
//! Owns: the options, the schedule of runs (every row runs against every
//! system given, interleaved: baton, redis, echo, baton T=1, PING, echo T=1,
//! the order reversed every other round), the memory rows (VmRSS of a fresh
//! server holding a million keys, or a hundred thousand queued waiters), and
//! the small blocking helpers that ask servers things (`SCRIPT LOAD`, `I`,
//! `DBSIZE`). The load itself is engine.rs, the wire formats wire.rs, the
//! tables report.rs; the TLS, semaphore, watch, connection-storm, etcd,
//! join and fleet rows are their own files (tls_rows.rs, semaphore_rows.rs,
//! watch_rows.rs, storm_rows.rs, etcd_rows.rs with etcd.rs and http.rs,
//! join_rows.rs, fleet_rows.rs), run after the main rows.
//! `scripts/bench.sh` starts the servers and runs this.
//!
//! Never does: start a server, or end one but the fleet row's active and
//! the etcd rows' cluster leaders (the
//! script starts them; the storm rows pause one, SIGSTOP then SIGCONT, for
//! 50 ms, and the join row a standby until it rejoins), or run under
//! `cargo test` (it is a `harness = false` bench; there are no timing
//! thresholds in tests).

#[path = "lockbench/deployed.rs"]
mod deployed;
#[path = "lockbench/engine.rs"]
mod engine;
#[path = "lockbench/etcd.rs"]
mod etcd;
#[path = "lockbench/etcd_rows.rs"]
mod etcd_rows;
#[path = "lockbench/flags.rs"]
mod flags;
#[path = "lockbench/fleet_rows.rs"]
mod fleet_rows;
#[path = "lockbench/http.rs"]
mod http;
#[path = "lockbench/join_rows.rs"]
mod join_rows;
#[path = "lockbench/placement.rs"]
mod placement;
#[path = "lockbench/report.rs"]
mod report;
#[path = "lockbench/semaphore_rows.rs"]
mod semaphore_rows;
#[path = "lockbench/storm_rows.rs"]
mod storm_rows;
#[path = "lockbench/tls_rows.rs"]
mod tls_rows;
#[path = "lockbench/watch_rows.rs"]
mod watch_rows;
#[path = "lockbench/wire.rs"]
mod wire;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use engine::{RunSpec, Workload};
use report::{Memory, MemoryRow, Results, Row, Section, System};
use wire::Proto;

const HELP: &str = "\
lockbench: baton against a Redis lock, side by side (scripts/bench.sh runs it)

USAGE:
  cargo bench --bench lockbench -- [OPTIONS]

SERVERS (each optional; rows of a server not given are left out):
  --baton ADDR           batond with the default --threads
  --baton1 ADDR          batond --threads 1
  --echo ADDR            batond --echo (the floor of --baton)
  --echo1 ADDR           batond --echo --threads 1 (the floor of --baton1)
  --redis ADDR           redis-server: the Redis lock, and PING as its floor
  --mem-baton ADDR --mem-baton-pid PID
                         a fresh batond for the held-keys memory row
  --mem-waiters ADDR --mem-waiters-pid PID
                         a fresh batond for the queued-waiters memory row
  --mem-redis ADDR --mem-redis-pid PID
                         a fresh redis-server for the held-keys memory row
  --cluster ADDR --cluster-pids ACTIVE,STANDBY
                         the active of a 2-node batond cluster (default flags,
                         standby attached): the deployed rows
  --redis-repl ADDR --redis-repl-pids MASTER,REPLICA
                         a redis-server master with one replica attached
  --baton-pid PID, --baton1-pid PID, --echo-pid PID, --echo1-pid PID,
  --redis-pid PID        the processes of --baton, --baton1, --echo, --echo1,
                         --redis, for the CPU time per pair of the
                         uncontended and deployed rows
  --default-threads N    batond's default --threads here (for the labels)
  --redis-note TEXT      why there is no --redis (printed under the tables)
  --baton-tls ADDR --tls-ca PATH
                         batond with --tls-cert: the TLS rows (section tls),
                         against --baton and --redis as the plain baselines
  --redis-tls ADDR --redis-tls-plain ADDR
                         redis-server's TLS port, and its plain port
  --tls-note TEXT        printed under the TLS table (why no Redis TLS, say)
  --watch-baton ADDR     batond for the watch rows, with --max-conns above the
                         most watchers (default: --baton)
  --watch-redis ADDR     redis-server for the watch rows, with --maxclients
                         above the most watchers (default: --redis)
  --storm-baton ADDR --storm-baton-pid PID
  --storm-redis ADDR --storm-redis-pid PID
                         fresh servers for the connection-storm rows, with
                         a connection limit above --storm-conns (the PID:
                         the stalled row stops the server with SIGSTOP)
  --join ACTIVE,STANDBY --join-pids PID,PID
                         a 2-node cluster, standby synced, for the join row
                         (its standby is stopped, then rejoins; the keys it
                         loads stay held: one join run per bench run)
  --failover ACTIVE,STANDBY --failover-pids PID,PID
                         a 2-node cluster, standby synced, for the fleet row
                         (its active is killed: one fleet run per bench run)

SHAPE:
  --quick                short windows, one round (about a minute in all)
  --warmup SECS          per run, not recorded (default 0.5; quick 0.2)
  --measure SECS         per run, recorded (default 2.5; quick 1)
  --rounds N             runs per (row, system), interleaved (default 2; quick 1)
  --client-threads N     load-generator threads (default 1)
  --only LIST            sections to run: sweep,pipelined,contended,expiry,
                         memory,deployed,tls,semaphore,watch,storm,etcd,join,
                         fleet
                         (default: all)
  --sweep LIST           connections of the closed-loop sweep
                         (default 1,10,50,100,200,500)
  --depth N              pipeline depth of the pipelined row (default 16)
  --mem-keys N           keys of the held-keys memory row (default 1000000)
  --waiter-keys N        held keys of the waiters row (default 1000)
  --waiters-per-key N    waiters on each (default 100)
  --watchers LIST        watcher counts of the watch rows, each run with a
                         0-watcher baseline (default 1000,10000)
  --watch-clients N      clients of the loop that changes the watched key
                         (default 4)
  --storm-conns N        sequential idle connects per storm run (default
                         10000)
  --join-keys N          keys the join row's active holds (default 1000000)
  --join-clients N       clients acquiring and releasing during the join
                         (default 16)
  --fleet N              clients of the fleet row, two connections each
                         (default 10000, scaled to the open-file limits)
  --fleet-threads N      threads that connect the fleet (default: one per
                         CPU of the load generator, which runs on CPU 0 and
                         the new active on the others)
  --etcd ADDR            an etcd member's client URL (host:port), data on
                         disk: the etcd rows (section etcd)
  --etcd-tmpfs ADDR      an etcd member whose data is on tmpfs
  --etcd-cluster A,B,C --etcd-cluster-pids P,P,P
                         3 etcd members (its raft leader is killed last)
  --kill-baton2 A,B --kill-baton2-pids P,P
  --kill-baton3 A,B,C --kill-baton3-pids P,P,P
                         baton clusters of 2 and 3 nodes whose active the
                         etcd rows kill (time without a lock service)
  --etcd-note TEXT       how etcd was run (or why not), under the tables
  --election-handoffs N  leader changes per election run (default 100)
  --seed N               random keys and jitter (default: from the clock)

HELPERS:
  --free-ports N         print N free loopback TCP ports and exit
  --make-certs DIR       write a test CA and a certificate for 127.0.0.1
                         (ca.pem, node.pem, node.key) into DIR and exit
  -h, --help             print this help

Workloads: uncontended acquire+release of random keys (closed loop and
pipelined); contended (C clients on one key, hold H µs); expiry lateness
(holders never release, lease 50 ms); the same client code against
`batond --echo` and Redis PING for the floor. A Redis lock is SET key token
NX PX lease, retried after a jittered ~1 ms while the wait lasts, released
by the compare-and-delete script through EVALSHA.

Semaphore rows: C=16 on one key with limit 4 against a mutex (baton; Redis:
a sorted-set semaphore in one Lua script against the SET NX lock), and
pipelined acquires with a limit field (`A k lease wait 1`) against
without. Watch rows: N watchers of one key (baton `W`; Redis SUBSCRIBE,
the new holder PUBLISHing each change) that a closed loop of a few clients
changes; the owner's rate against no watchers, and change → last watcher.
Storm rows: --storm-conns clients connecting one after another, each left
idle (baton and Redis interleaved): connections that waited for a
retransmitted SYN, and the time it took; then the same with the server
stopped for its first 50 ms. Join row: --join-keys held keys on a
cluster's active and --join-clients clients busy on it; its standby,
stopped, rejoins: the acquire p99.9, max and rate during the join against
before, and the time until the standby holds the state. Fleet row: a cluster's active killed, and
--fleet clients following the failover, two connections each, their first
requests answered within how long of the promotion. Etcd rows: etcd's
lock and election (JSON gateway) beside baton and Redis: uncontended and
contended lock rates, a leader's release to an observer knowing the next,
and a killed leader's gap (etcd 3 members, baton 2 and 3 nodes).
";

/// Lease and wait of the throughput rows: long, a safety net only.
const LEASE_MS: u64 = 10_000;
const WAIT_MS: u64 = 30_000;
/// Expiry rows: short leases, keys × clients.
const EXPIRY_LEASE_MS: u64 = 50;
const EXPIRY_KEYS: usize = 8;
const EXPIRY_CLIENTS_PER_KEY: usize = 2;
/// The most a run may take to drain after its window.
const DRAIN: Duration = Duration::from_secs(3);
/// The most loading memory rows may take.
const MEMORY_BOUND: Duration = Duration::from_secs(120);

struct Options {
    servers: HashMap<System, SocketAddr>,
    /// The processes of each system, for its CPU time (deployed rows).
    pids: HashMap<System, Vec<u32>>,
    mem_baton: Option<(SocketAddr, u32)>,
    mem_waiters: Option<(SocketAddr, u32)>,
    mem_redis: Option<(SocketAddr, u32)>,
    default_threads: String,
    redis_note: Option<String>,
    warmup: Duration,
    measure: Duration,
    rounds: usize,
    client_threads: usize,
    only: Vec<String>,
    sweep: Vec<usize>,
    depth: usize,
    mem_keys: u64,
    waiter_keys: u64,
    waiters_per_key: u64,
    seed: u64,
}

fn main() -> ExitCode {
    // `cargo bench` appends `--bench`; it means nothing here.
    let args: Vec<_> = std::env::args_os()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mut args = pico_args::Arguments::from_vec(args);
    if args.contains(["-h", "--help"]) {
        print!("{HELP}");
        return ExitCode::SUCCESS;
    }
    match args.opt_value_from_str::<_, usize>("--free-ports") {
        Ok(Some(n)) => return print_free_ports(n),
        Ok(None) => {}
        Err(e) => return usage_error(&e.to_string()),
    }
    match args.opt_value_from_os_str("--make-certs", |s| {
        Ok::<_, std::convert::Infallible>(std::path::PathBuf::from(s))
    }) {
        Ok(Some(dir)) => {
            return match tls_rows::make_certs(&dir) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => usage_error(&e),
            };
        }
        Ok(None) => {}
        Err(e) => return usage_error(&e.to_string()),
    }
    let tls = match tls_rows::parse(&mut args) {
        Ok(tls) => tls,
        Err(e) => return usage_error(&e),
    };
    let storm = match storm_rows::parse(&mut args) {
        Ok(storm) => storm,
        Err(e) => return usage_error(&e),
    };
    let join = match join_rows::parse(&mut args) {
        Ok(join) => join,
        Err(e) => return usage_error(&e),
    };
    let fleet = match fleet_rows::parse(&mut args) {
        Ok(fleet) => fleet,
        Err(e) => return usage_error(&e),
    };
    let etcd = match etcd_rows::parse(&mut args) {
        Ok(etcd) => etcd,
        Err(e) => return usage_error(&e),
    };
    let watch = match watch_rows::parse(&mut args) {
        Ok(watch) => watch,
        Err(e) => return usage_error(&e),
    };
    let options = match parse_options(args) {
        Ok(options) => options,
        Err(e) => return usage_error(&e),
    };
    let watch = watch_rows::WatchOptions {
        baton: watch.baton.or(options.servers.get(&System::Baton).copied()),
        redis: watch.redis.or(options.servers.get(&System::Redis).copied()),
        ..watch
    };
    match run_all(&options) {
        Ok(results) => {
            print!("{}", results.render());
            let shape = tls_rows::Shape {
                warmup: options.warmup,
                measure: options.measure,
                rounds: options.rounds,
                threads: options.client_threads,
                seed: options.seed,
            };
            let baton = options.servers.get(&System::Baton).copied();
            let redis = options.servers.get(&System::Redis).copied();
            let mut more = Vec::new();
            if let Some(tls) = tls.filter(|_| options.wants("tls")) {
                more.push(tls_rows::run(&tls, &shape, baton, redis, script_load));
            }
            if options.wants("semaphore") {
                more.push(semaphore_rows::run(
                    &shape,
                    options.depth,
                    baton,
                    redis,
                    script_load_text,
                ));
            }
            if options.wants("watch") {
                more.push(watch_rows::run(&watch, &shape, script_load_text));
            }
            if options.wants("storm") {
                more.push(storm_rows::run(&storm, &shape));
            }
            if options.wants("etcd") {
                let others = etcd_rows::Others {
                    baton,
                    cluster: options.servers.get(&System::Cluster).copied(),
                    redis,
                };
                more.push(etcd_rows::run(&etcd, &shape, &others, script_load_text));
            }
            if options.wants("join") {
                more.push(join_rows::run(&join));
            }
            if options.wants("fleet") {
                // Last: it kills the cluster's active.
                more.push(fleet_rows::run(&fleet));
            }
            for section in more {
                match section {
                    Ok(text) => print!("{text}"),
                    Err(e) => {
                        eprintln!("lockbench: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("lockbench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage_error(e: &str) -> ExitCode {
    eprintln!("lockbench: {e} (see --help)");
    ExitCode::from(2)
}

fn parse_options(mut args: pico_args::Arguments) -> Result<Options, String> {
    let err = |e: pico_args::Error| e.to_string();
    let quick = args.contains("--quick");
    let mut servers = HashMap::new();
    for (flag, system) in [
        ("--baton", System::Baton),
        ("--baton1", System::Baton1),
        ("--echo", System::Echo),
        ("--echo1", System::Echo1),
        ("--redis", System::Redis),
    ] {
        if let Some(addr) = args
            .opt_value_from_str::<_, SocketAddr>(flag)
            .map_err(err)?
        {
            servers.insert(system, addr);
            if system == System::Redis {
                servers.insert(System::Ping, addr);
            }
        }
    }
    let mut pids = HashMap::new();
    for (flag, pid_flag, system, want) in [
        ("--cluster", "--cluster-pids", System::Cluster, 2),
        ("--redis-repl", "--redis-repl-pids", System::RedisRepl, 2),
    ] {
        let addr = args
            .opt_value_from_str::<_, SocketAddr>(flag)
            .map_err(err)?;
        let list: Option<String> = args.opt_value_from_str(pid_flag).map_err(err)?;
        match (addr, list) {
            (Some(addr), Some(list)) => {
                let list = flags::list::<u32>(pid_flag, &list, want)?;
                servers.insert(system, addr);
                pids.insert(system, list);
            }
            (None, None) => {}
            _ => return Err(format!("{flag} and {pid_flag} go together")),
        }
    }
    for (flag, system) in [
        ("--baton-pid", System::Baton),
        ("--baton1-pid", System::Baton1),
        ("--echo-pid", System::Echo),
        ("--echo1-pid", System::Echo1),
        ("--redis-pid", System::Redis),
    ] {
        if let Some(pid) = args.opt_value_from_str::<_, u32>(flag).map_err(err)? {
            pids.insert(system, vec![pid]);
        }
    }
    let mut mem = |flag: &'static str, pid_flag: &'static str| -> Result<_, String> {
        let addr = args
            .opt_value_from_str::<_, SocketAddr>(flag)
            .map_err(err)?;
        let pid = args.opt_value_from_str::<_, u32>(pid_flag).map_err(err)?;
        match (addr, pid) {
            (Some(addr), Some(pid)) => Ok(Some((addr, pid))),
            (None, None) => Ok(None),
            _ => Err(format!("{flag} and {pid_flag} go together")),
        }
    };
    let mem_baton = mem("--mem-baton", "--mem-baton-pid")?;
    let mem_waiters = mem("--mem-waiters", "--mem-waiters-pid")?;
    let mem_redis = mem("--mem-redis", "--mem-redis-pid")?;
    let secs = |v: Option<f64>, default: f64| {
        Duration::from_secs_f64(v.unwrap_or(default).clamp(0.0, 3600.0))
    };
    let warmup = secs(
        args.opt_value_from_str("--warmup").map_err(err)?,
        if quick { 0.2 } else { 0.5 },
    );
    let measure = secs(
        args.opt_value_from_str("--measure").map_err(err)?,
        if quick { 1.0 } else { 2.5 },
    );
    let list = |v: Option<String>| {
        v.map(|s| {
            s.split(',')
                .map(|x| x.trim().to_string())
                .collect::<Vec<_>>()
        })
    };
    let only = list(args.opt_value_from_str("--only").map_err(err)?).unwrap_or_default();
    let sweep = match list(args.opt_value_from_str("--sweep").map_err(err)?) {
        Some(items) => items
            .iter()
            .map(|s| {
                s.parse::<usize>()
                    .map_err(|_| format!("--sweep: '{s}' is not a number"))
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => vec![1, 10, 50, 100, 200, 500],
    };
    let seed = args
        .opt_value_from_str("--seed")
        .map_err(err)?
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    let options = Options {
        servers,
        pids,
        mem_baton,
        mem_waiters,
        mem_redis,
        default_threads: args
            .opt_value_from_str("--default-threads")
            .map_err(err)?
            .unwrap_or_else(|| "default".to_string()),
        redis_note: args.opt_value_from_str("--redis-note").map_err(err)?,
        warmup,
        measure: measure.max(Duration::from_millis(100)),
        rounds: args
            .opt_value_from_str("--rounds")
            .map_err(err)?
            .unwrap_or(if quick { 1 } else { 2 }),
        client_threads: args
            .opt_value_from_str("--client-threads")
            .map_err(err)?
            .unwrap_or(1),
        only,
        sweep,
        depth: args
            .opt_value_from_str("--depth")
            .map_err(err)?
            .unwrap_or(16),
        mem_keys: args
            .opt_value_from_str("--mem-keys")
            .map_err(err)?
            .unwrap_or(1_000_000),
        waiter_keys: args
            .opt_value_from_str("--waiter-keys")
            .map_err(err)?
            .unwrap_or(1000),
        waiters_per_key: args
            .opt_value_from_str("--waiters-per-key")
            .map_err(err)?
            .unwrap_or(100),
        seed,
    };
    let rest = args.finish();
    if !rest.is_empty() {
        return Err(format!("unexpected argument {:?}", rest[0]));
    }
    if options.rounds == 0 || options.rounds > 20 {
        return Err("--rounds must be 1 to 20".into());
    }
    if options.client_threads == 0 || options.client_threads > 16 {
        return Err("--client-threads must be 1 to 16".into());
    }
    if options.sweep.iter().any(|&c| c == 0 || c > 5000)
        || options.depth == 0
        || options.depth > 4096
    {
        return Err("--sweep connections must be 1 to 5000, --depth 1 to 4096".into());
    }
    Ok(options)
}

fn print_free_ports(n: usize) -> ExitCode {
    // Bind them all before closing any, so they are distinct.
    let listeners: Vec<_> = (0..n.min(64))
        .filter_map(|_| std::net::TcpListener::bind("127.0.0.1:0").ok())
        .collect();
    for listener in &listeners {
        if let Ok(addr) = listener.local_addr() {
            println!("{}", addr.port());
        }
    }
    ExitCode::SUCCESS
}

impl Options {
    fn wants(&self, section: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|s| s == section)
    }
}

/// The rows to run, in order.
fn plan_rows(options: &Options) -> Vec<Row> {
    let mut rows = Vec::new();
    let row = |section, conns, depth, hold_us| Row {
        section,
        conns,
        depth,
        hold_us,
        keys: 0,
        lease_ms: LEASE_MS,
        split: false,
    };
    if options.wants("sweep") {
        for &c in &options.sweep {
            rows.push(row(Section::Sweep, c, 1, 0));
        }
    }
    if options.wants("pipelined") {
        rows.push(row(Section::Pipelined, 50, options.depth, 0));
    }
    if options.wants("contended") {
        for c in [16, 64] {
            for hold_us in [0, 100] {
                rows.push(row(Section::Contended, c, 1, hold_us));
            }
        }
    }
    if options.wants("deployed") {
        rows.extend(deployed::rows(options.depth));
    }
    if options.wants("expiry") {
        rows.push(Row {
            section: Section::Expiry,
            conns: EXPIRY_KEYS * EXPIRY_CLIENTS_PER_KEY,
            depth: 1,
            hold_us: 0,
            keys: EXPIRY_KEYS,
            lease_ms: EXPIRY_LEASE_MS,
            split: false,
        });
    }
    rows
}

/// The systems a row runs against, in interleaved order.
fn systems_of(row: &Row, round: usize) -> Vec<System> {
    let mut systems = match row.section {
        Section::Sweep | Section::Pipelined => vec![
            System::Baton,
            System::Redis,
            System::Echo,
            System::Baton1,
            System::Ping,
            System::Echo1,
        ],
        // The echo floors here are one connection's round trip, measured
        // next to the row: the yardstick of its handoff latency.
        Section::Contended => vec![
            System::Baton,
            System::Echo,
            System::Redis,
            System::Baton1,
            System::Echo1,
        ],
        Section::Expiry => vec![System::Baton, System::Redis, System::Baton1],
        Section::Deployed => return deployed::systems(row, round),
    };
    if round % 2 == 1 {
        systems.reverse();
    }
    systems
}

fn run_all(options: &Options) -> Result<Results, String> {
    let have_redis = options.servers.contains_key(&System::Redis);
    let mut results = Results {
        rows: plan_rows(options),
        outcomes: HashMap::new(),
        memory: Memory::default(),
        notes: Vec::new(),
        default_threads: options.default_threads.clone(),
    };
    if !have_redis {
        let why = options.redis_note.as_deref().unwrap_or("no --redis given");
        results.notes.push(format!(
            "{why}: the Redis rows and every ratio to Redis are left out."
        ));
    }
    let sha = match options.servers.get(&System::Redis) {
        Some(&addr) => script_load(addr)?,
        None => Vec::new(),
    };
    // The same script, so the same SHA1, on the master with a replica.
    let sha = match options.servers.get(&System::RedisRepl) {
        Some(&addr) => script_load(addr)?,
        None => sha,
    };
    let started = Instant::now();
    let mut run_no = 0u64;
    for round in 0..options.rounds {
        for i in 0..results.rows.len() {
            let row = results.rows[i].clone();
            for system in systems_of(&row, round) {
                let Some(&addr) = options.servers.get(&system) else {
                    continue;
                };
                run_no += 1;
                let spec = run_spec(options, &row, system, addr, &sha, run_no);
                eprintln!(
                    "[{:>5.1}s] round {} {} C={} depth={} hold={}µs: {}",
                    started.elapsed().as_secs_f64(),
                    round + 1,
                    row.section.name(),
                    row.conns,
                    row.depth,
                    row.hold_us,
                    system.name(&options.default_threads)
                );
                let outcome = engine::run(&spec).map_err(|e| {
                    format!(
                        "{} {} against {addr}: {e}",
                        row.section.name(),
                        system.name("")
                    )
                })?;
                results.add(i, system, outcome);
            }
        }
    }
    if options.wants("memory") {
        results.memory = run_memory(options, &sha)?;
    }
    results.notes.push(format!(
        "{} round(s) of {:.1}s warmup + {:.1}s measured per (row, system), {} load thread(s), seed {}.",
        options.rounds,
        options.warmup.as_secs_f64(),
        options.measure.as_secs_f64(),
        options.client_threads,
        options.seed
    ));
    Ok(results)
}

fn run_spec(
    options: &Options,
    row: &Row,
    system: System,
    addr: SocketAddr,
    sha: &[u8],
    run_no: u64,
) -> RunSpec {
    let mut conns = row.conns;
    let mut measure = options.measure;
    let workload = match (row.section, system) {
        (Section::Sweep | Section::Pipelined, _) => Workload::Uncontended { depth: row.depth },
        (Section::Contended, System::Echo | System::Echo1) => {
            // One connection's round trip through the same I/O loops.
            conns = 1;
            measure = (measure / 2).max(Duration::from_millis(500));
            Workload::Uncontended { depth: 1 }
        }
        (Section::Contended, _) => Workload::Contended {
            hold: Duration::from_micros(row.hold_us),
        },
        (Section::Expiry, _) => Workload::Expiry { keys: row.keys },
        (Section::Deployed, _) if deployed::is_contended(row) => Workload::Contended {
            hold: Duration::ZERO,
        },
        (Section::Deployed, _) => Workload::Uncontended { depth: row.depth },
    };
    // The server's CPU time per pair: the deployed rows and every
    // uncontended row (PING's server is the Redis of the lock rows).
    let cpu_pids = match row.section {
        Section::Deployed | Section::Sweep | Section::Pipelined => {
            let of = if system == System::Ping {
                System::Redis
            } else {
                system
            };
            options.pids.get(&of).cloned().unwrap_or_default()
        }
        _ => Vec::new(),
    };
    RunSpec {
        addr,
        proto: system.proto(),
        conns,
        workload,
        lease_ms: row.lease_ms,
        wait_ms: WAIT_MS,
        warmup: options.warmup,
        measure,
        drain: DRAIN,
        key_prefix: format!("r{run_no}:"),
        threads: options.client_threads,
        sha: sha.to_vec(),
        seed: options.seed ^ run_no.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        tls: None,
        split: if row.split {
            placement::Split::of_this_machine()
        } else {
            None
        },
        cpu_pids,
        limit: None,
        changes: None,
    }
}

// ---------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------

fn run_memory(options: &Options, sha: &[u8]) -> Result<Memory, String> {
    let mut memory = Memory {
        keys: options.mem_keys,
        waiters: options.waiter_keys * options.waiters_per_key,
        ..Memory::default()
    };
    if let Some((addr, pid)) = options.mem_baton {
        eprintln!("memory: {} held keys in batond", options.mem_keys);
        memory.baton_keys = Some(fill_keys(options, Proto::Baton, addr, pid, sha)?);
    }
    if let Some((addr, pid)) = options.mem_redis {
        eprintln!("memory: {} held keys in redis", options.mem_keys);
        let sha = script_load(addr)?;
        memory.redis_keys = Some(fill_keys(options, Proto::RedisLock, addr, pid, &sha)?);
    }
    if let Some((addr, pid)) = options.mem_waiters {
        eprintln!("memory: {} queued waiters in batond", memory.waiters);
        memory.baton_waiters = Some(queue_waiters(options, addr, pid)?);
    }
    Ok(memory)
}

/// Acquire `mem_keys` distinct keys with a long lease, pipelined, through
/// the same engine, and measure the server's RSS before and after.
fn fill_keys(
    options: &Options,
    proto: Proto,
    addr: SocketAddr,
    pid: u32,
    sha: &[u8],
) -> Result<MemoryRow, String> {
    let rss_before = vm_rss(pid)?;
    let spec = RunSpec {
        addr,
        proto,
        conns: 8,
        workload: Workload::Fill {
            keys: options.mem_keys,
            depth: 128,
        },
        lease_ms: 3_600_000,
        wait_ms: WAIT_MS,
        warmup: Duration::ZERO,
        measure: MEMORY_BOUND,
        drain: Duration::ZERO,
        key_prefix: "mem:".into(),
        threads: 1,
        sha: sha.to_vec(),
        seed: options.seed,
        tls: None,
        cpu_pids: Vec::new(),
        split: None,
        limit: None,
        changes: None,
    };
    let outcome = engine::run(&spec)?;
    if outcome.errors > 0 {
        return Err(format!(
            "filling keys: {} errors, the first: {}",
            outcome.errors,
            outcome.first_error.unwrap_or_default()
        ));
    }
    std::thread::sleep(Duration::from_millis(300));
    let rss_after = vm_rss(pid)?;
    let check = match proto {
        Proto::Baton => {
            let info = info(addr)?;
            format!("held={}", info.get("held").map_or("?", String::as_str))
        }
        _ => format!("dbsize={}", redis_dbsize(addr)?),
    };
    Ok(MemoryRow {
        rss_before,
        rss_after,
        check,
        load_secs: outcome.secs,
    })
}

/// Hold `waiter_keys` keys, then queue `waiters_per_key` waiters on each,
/// one connection per waiter rank (so each connection queues one request
/// per key: well under --max-waiting), and measure the RSS once the server
/// reports them all waiting.
fn queue_waiters(options: &Options, addr: SocketAddr, pid: u32) -> Result<MemoryRow, String> {
    let rss_before = vm_rss(pid)?;
    let started = Instant::now();
    let mut holder = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    let mut batch = Vec::new();
    for k in 0..options.waiter_keys {
        let key = format!("w:{k}");
        let no_token = wire::TokenText::default();
        wire::write_acquire(
            Proto::Baton,
            &mut batch,
            key.as_bytes(),
            &no_token,
            3_600_000,
            1000,
        );
    }
    holder
        .write_all(&batch)
        .map_err(|e| format!("write: {e}"))?;
    let mut reader = BufReader::new(holder.try_clone().map_err(|e| e.to_string())?);
    holder
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    for _ in 0..options.waiter_keys {
        line.clear();
        reader
            .read_line(&mut line)
            .map_err(|e| format!("reading grants: {e}"))?;
        if !line.starts_with("A ") {
            return Err(format!("holding waiter keys: answer {line:?}"));
        }
    }
    let mut waiters = Vec::new();
    for _ in 0..options.waiters_per_key {
        let mut conn = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        conn.write_all(&waiting_batch(options.waiter_keys))
            .map_err(|e| format!("write: {e}"))?;
        waiters.push(conn);
    }
    let want = options.waiter_keys * options.waiters_per_key;
    let deadline = Instant::now() + MEMORY_BOUND;
    let waiting = loop {
        let info = info(addr)?;
        let waiting: u64 = info
            .get("waiting")
            .and_then(|w| w.parse().ok())
            .unwrap_or(0);
        if waiting >= want || Instant::now() >= deadline {
            break waiting;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let load_secs = started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(300));
    let rss_after = vm_rss(pid)?;
    drop(waiters);
    Ok(MemoryRow {
        rss_before,
        rss_after,
        check: format!("waiting={waiting}"),
        load_secs,
    })
}

fn waiting_batch(keys: u64) -> Vec<u8> {
    let mut batch = Vec::new();
    for k in 0..keys {
        let key = format!("w:{k}");
        wire::write_acquire(
            Proto::Baton,
            &mut batch,
            key.as_bytes(),
            &wire::TokenText::default(),
            60_000,
            3_600_000,
        );
    }
    batch
}

/// VmRSS of a process, in bytes.
fn vm_rss(pid: u32) -> Result<u64, String> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| format!("{path}: no VmRSS"))
}

// ---------------------------------------------------------------------------
// Blocking one-off requests
// ---------------------------------------------------------------------------

fn blocking_conn(addr: SocketAddr) -> Result<(TcpStream, BufReader<TcpStream>), String> {
    let conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let reader = BufReader::new(conn.try_clone().map_err(|e| e.to_string())?);
    Ok((conn, reader))
}

/// baton's `I`, as name → value.
fn info(addr: SocketAddr) -> Result<HashMap<String, String>, String> {
    let (mut conn, mut reader) = blocking_conn(addr)?;
    conn.write_all(b"I\n").map_err(|e| e.to_string())?;
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|e| format!("I: {e}"))?;
    Ok(line
        .split_whitespace()
        .skip(1)
        .filter_map(|field| field.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

/// `SCRIPT LOAD` the release script; its SHA1.
fn script_load(addr: SocketAddr) -> Result<Vec<u8>, String> {
    script_load_text(addr, wire::RELEASE_SCRIPT)
}

/// `SCRIPT LOAD` a script; its SHA1.
fn script_load_text(addr: SocketAddr, script: &str) -> Result<Vec<u8>, String> {
    let (mut conn, mut reader) = blocking_conn(addr)?;
    let mut command = Vec::new();
    wire::resp_command(&mut command, &[b"SCRIPT", b"LOAD", script.as_bytes()]);
    conn.write_all(&command).map_err(|e| e.to_string())?;
    let mut header = String::new();
    let mut sha = String::new();
    reader
        .read_line(&mut header)
        .map_err(|e| format!("SCRIPT LOAD: {e}"))?;
    reader
        .read_line(&mut sha)
        .map_err(|e| format!("SCRIPT LOAD: {e}"))?;
    let sha = sha.trim();
    if header.trim() != "$40" || sha.len() != 40 {
        return Err(format!("SCRIPT LOAD answered {header:?} {sha:?}"));
    }
    Ok(sha.as_bytes().to_vec())
}

fn redis_dbsize(addr: SocketAddr) -> Result<u64, String> {
    let (mut conn, mut reader) = blocking_conn(addr)?;
    let mut command = Vec::new();
    wire::resp_command(&mut command, &[b"DBSIZE"]);
    conn.write_all(&command).map_err(|e| e.to_string())?;
    let mut line = String::new();
    reader
        .read_line(&mut line)
        .map_err(|e| format!("DBSIZE: {e}"))?;
    line.trim()
        .strip_prefix(':')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("DBSIZE answered {line:?}"))
}
