//! client_speed: what the Rust client library costs, beside the raw
//! protocol (SPEC section 10, issue 38's client speed).
//!
//! Starts one `batond` (`BATON_BATOND`, else `target/release/batond`) on a
//! free loopback port and measures, against it, with 16 concurrent
//! holders:
//! - **pairs/s**: acquire + release pairs, each holder on keys of its own
//!   (a fresh key each pair, as the raw harness draws random keys);
//! - **handoffs/s**: all 16 on one key, each acquiring (waiting in line),
//!   then releasing at once: every grant is a handoff from the holder
//!   before.
//!
//! Rows: `raw`, the load harness's engine (`benches/lockbench/engine.rs`:
//! 16 connections, one request in flight on each, mio, lines written by
//! hand); `rust`, the blocking client (one `Client`, 16 threads);
//! `rust-async`, the async client (one `Client`, 16 tasks on a 2-worker
//! tokio runtime). The ratio is the client's rate over the raw rate. The
//! client pipelines its 16 callers over its two connections, which a
//! server serves with fewer reads and writes than 16 connections; so for
//! pairs a second raw column sends the same shape by hand (2 connections,
//! 8 in flight on each), the client's own cost alone. (A contended run of
//! the engine has one request in flight per connection, so handoffs have
//! no such column.) Rows are interleaved over the rounds, so drift hits
//! them alike.
//!
//! Never does: run under `cargo test` (it is a `harness = false` bench; no
//! timing thresholds in tests), or keep the server after it returns.
//!
//! ```text
//! cargo build --release --bin batond
//! cargo bench --bench client_speed -- [--measure SECS] [--rounds N]
//! ```

#[allow(dead_code)]
#[path = "lockbench/engine.rs"]
mod engine;
#[allow(dead_code)]
#[path = "lockbench/placement.rs"]
mod placement;
#[allow(dead_code)]
#[path = "lockbench/wire.rs"]
mod wire;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use baton::client::Client;
use engine::{RunSpec, Workload};
use wire::Proto;

/// Concurrent holders of every row.
const HOLDERS: usize = 16;
const LEASE: Duration = Duration::from_secs(10);
const WAIT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Shape {
    /// Distinct keys: pairs/s.
    Pairs,
    /// One key: handoffs/s.
    Handoffs,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Who {
    Raw,
    /// The raw protocol shaped as the client sends it: 2 connections (the
    /// client's two for one address), 8 requests in flight on each.
    RawPipelined,
    Blocking,
    Async,
}

struct Options {
    warmup: Duration,
    measure: Duration,
    rounds: usize,
}

fn main() -> ExitCode {
    let options = match parse_options() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("client_speed: {e}");
            return ExitCode::from(2);
        }
    };
    let (mut server, addr) = match start_batond() {
        Ok(started) => started,
        Err(e) => {
            eprintln!("client_speed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = measure_all(addr, &options);
    let _ = server.kill();
    let _ = server.wait();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("client_speed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        warmup: Duration::from_millis(500),
        measure: Duration::from_secs(3),
        rounds: 2,
    };
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--measure" => options.measure = secs(value()?)?,
            "--warmup" => options.warmup = secs(value()?)?,
            "--rounds" => {
                options.rounds = value()?.parse().map_err(|_| "--rounds: a number")?;
            }
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    Ok(options)
}

fn secs(text: &str) -> Result<Duration, String> {
    text.parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{text:?} is not a number of seconds"))
}

/// `batond --bind 127.0.0.1 --port 0`, and the address it says it
/// listens on.
fn start_batond() -> Result<(Child, SocketAddr), String> {
    let path = std::env::var("BATON_BATOND")
        .unwrap_or_else(|_| format!("{}/target/release/batond", env!("CARGO_MANIFEST_DIR")));
    let mut child = Command::new(&path)
        .args(["--bind", "127.0.0.1", "--port", "0"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {path}: {e} (cargo build --release --bin batond)"))?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let addr = loop {
        let Some(Ok(line)) = lines.next() else {
            let _ = child.kill();
            return Err("batond exited before it listened".into());
        };
        if let Some(rest) = line.split("listening on ").nth(1) {
            let addr = rest.split_whitespace().next().unwrap_or("");
            break addr
                .parse()
                .map_err(|_| format!("odd address in {line:?}"))?;
        }
    };
    // Keep reading its log, so that it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Ok((child, addr))
}

fn measure_all(addr: SocketAddr, options: &Options) -> Result<(), String> {
    println!(
        "client_speed: {HOLDERS} holders, {} rounds of {:.1} s, batond at {addr}",
        options.rounds,
        options.measure.as_secs_f64()
    );
    let mut rates: Vec<((Shape, Who), Vec<f64>)> = Vec::new();
    let mut run = 0u64;
    for round in 0..options.rounds {
        for shape in [Shape::Pairs, Shape::Handoffs] {
            let mut order = vec![Who::Raw, Who::RawPipelined, Who::Blocking, Who::Async];
            if shape == Shape::Handoffs {
                order.retain(|&who| who != Who::RawPipelined);
            }
            if round % 2 == 1 {
                order.reverse();
            }
            for who in order {
                run += 1;
                let prefix = format!("cs{run}-");
                let rate = match who {
                    Who::Raw => raw(addr, shape, HOLDERS, 1, &prefix, options)?,
                    Who::RawPipelined => raw(addr, shape, 2, HOLDERS / 2, &prefix, options)?,
                    Who::Blocking => blocking(addr, shape, &prefix, options)?,
                    Who::Async => asynchronous(addr, shape, &prefix, options)?,
                };
                match rates.iter_mut().find(|(k, _)| *k == (shape, who)) {
                    Some((_, all)) => all.push(rate),
                    None => rates.push(((shape, who), vec![rate])),
                }
            }
        }
    }
    let mean = |shape, who| -> Option<f64> {
        let all = &rates.iter().find(|(k, _)| *k == (shape, who))?.1;
        Some(all.iter().sum::<f64>() / all.len() as f64)
    };
    println!();
    println!(
        "| {HOLDERS} holders | raw: 16 conns × 1 | raw: 2 conns × 8 | rust | ×raw | ×raw 2×8 \
         | rust-async | ×raw | ×raw 2×8 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (shape, label) in [
        (Shape::Pairs, "acquire+release pairs/s, distinct keys"),
        (Shape::Handoffs, "handoffs/s, one key"),
    ] {
        let raw = mean(shape, Who::Raw).ok_or("no raw rate")?;
        let piped = mean(shape, Who::RawPipelined);
        let blocking = mean(shape, Who::Blocking).ok_or("no rust rate")?;
        let asynchronous = mean(shape, Who::Async).ok_or("no rust-async rate")?;
        let shown = |rate: Option<f64>, f: &dyn Fn(f64) -> String| rate.map_or("–".into(), f);
        println!(
            "| {label} | {raw:.0} | {} | {blocking:.0} | {:.2}x | {} | {asynchronous:.0} | {:.2}x | {} |",
            shown(piped, &|p| format!("{p:.0}")),
            blocking / raw,
            shown(piped, &|p| format!("{:.2}x", blocking / p)),
            asynchronous / raw,
            shown(piped, &|p| format!("{:.2}x", asynchronous / p)),
        );
    }
    Ok(())
}

/// The load harness's engine: `conns` connections, `depth` requests in
/// flight on each (a contended run: one).
fn raw(
    addr: SocketAddr,
    shape: Shape,
    conns: usize,
    depth: usize,
    prefix: &str,
    options: &Options,
) -> Result<f64, String> {
    let spec = RunSpec {
        addr,
        proto: Proto::Baton,
        conns,
        workload: match shape {
            Shape::Pairs => Workload::Uncontended { depth },
            Shape::Handoffs => Workload::Contended {
                hold: Duration::ZERO,
            },
        },
        lease_ms: millis(LEASE),
        wait_ms: millis(WAIT),
        warmup: options.warmup,
        measure: options.measure,
        drain: Duration::from_secs(3),
        key_prefix: prefix.to_string(),
        threads: 1,
        sha: Vec::new(),
        seed: 1,
        tls: None,
        cpu_pids: Vec::new(),
        split: None,
        limit: None,
        changes: None,
    };
    let outcome = engine::run(&spec)?;
    if outcome.errors > 0 {
        return Err(format!("raw run errors: {:?}", outcome.first_error));
    }
    Ok(outcome.pairs as f64 / outcome.secs)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The window's pairs, counted once the warmup is over and until the
/// window ends.
struct Window {
    counting: AtomicBool,
    done: AtomicBool,
    pairs: AtomicU64,
}

impl Window {
    fn new() -> Arc<Window> {
        Arc::new(Window {
            counting: AtomicBool::new(false),
            done: AtomicBool::new(false),
            pairs: AtomicU64::new(0),
        })
    }

    fn pair(&self) {
        if self.counting.load(Ordering::Relaxed) {
            self.pairs.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn done(&self) -> bool {
        self.done.load(Ordering::Relaxed)
    }

    /// Warm up, count for the measure window, stop; pairs per second.
    fn time(&self, options: &Options) -> f64 {
        std::thread::sleep(options.warmup);
        let start = Instant::now();
        self.counting.store(true, Ordering::Relaxed);
        std::thread::sleep(options.measure);
        self.counting.store(false, Ordering::Relaxed);
        let secs = start.elapsed().as_secs_f64();
        self.done.store(true, Ordering::Relaxed);
        self.pairs.load(Ordering::Relaxed) as f64 / secs
    }
}

fn key(prefix: &str, shape: Shape, holder: usize, n: u64) -> String {
    match shape {
        Shape::Pairs => format!("{prefix}{holder}-{n}"),
        Shape::Handoffs => format!("{prefix}one"),
    }
}

/// The blocking client: one `Client`, a thread per holder.
fn blocking(
    addr: SocketAddr,
    shape: Shape,
    prefix: &str,
    options: &Options,
) -> Result<f64, String> {
    let client = Client::connect([addr.to_string()]).map_err(|e| e.to_string())?;
    let window = Window::new();
    let holders: Vec<_> = (0..HOLDERS)
        .map(|holder| {
            let (client, window, prefix) = (client.clone(), window.clone(), prefix.to_string());
            std::thread::spawn(move || -> Result<(), String> {
                let mut n = 0;
                while !window.done() {
                    let key = key(&prefix, shape, holder, n);
                    n += 1;
                    let grant = client
                        .acquire(&key, LEASE, Some(WAIT))
                        .map_err(|e| e.to_string())?;
                    client.release(&grant).map_err(|e| e.to_string())?;
                    window.pair();
                }
                Ok(())
            })
        })
        .collect();
    let rate = window.time(options);
    for holder in holders {
        holder.join().map_err(|_| "a holder panicked")??;
    }
    client.close();
    Ok(rate)
}

/// The async client: one `Client`, a task per holder on a 2-worker tokio
/// runtime.
fn asynchronous(
    addr: SocketAddr,
    shape: Shape,
    prefix: &str,
    options: &Options,
) -> Result<f64, String> {
    let client = Client::connect([addr.to_string()]).map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .map_err(|e| e.to_string())?;
    let window = Window::new();
    let holders: Vec<_> = (0..HOLDERS)
        .map(|holder| {
            let (client, window, prefix) = (client.clone(), window.clone(), prefix.to_string());
            runtime.spawn(async move {
                let mut n = 0;
                while !window.done() {
                    let key = key(&prefix, shape, holder, n);
                    n += 1;
                    let grant = client
                        .acquire_async(key, LEASE, Some(WAIT))
                        .await
                        .map_err(|e| e.to_string())?;
                    client
                        .release_async(&grant)
                        .await
                        .map_err(|e| e.to_string())?;
                    window.pair();
                }
                Ok::<(), String>(())
            })
        })
        .collect();
    let rate = window.time(options);
    for holder in holders {
        runtime.block_on(holder).map_err(|e| e.to_string())??;
    }
    client.close();
    Ok(rate)
}
