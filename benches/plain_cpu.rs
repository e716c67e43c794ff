//! plain_cpu: the node's server CPU per pipelined pair read by a load
//! generator that is not the project's harness, against `batond --echo`
//! and a minimal mio echo, in one interleaved run.
//!
//! Owns: the options, starting the servers (`batond`, `batond --echo`,
//! each also with `--busy-poll-us 0`, and this same program as the minimal
//! echo, `--mini-echo`), the run (run.rs), and printing its tables
//! (report.rs). The load generator is client.rs: a plain mio client,
//! sharing nothing with benches/lockbench but the wire format, written out
//! by hand. `scripts/cpu_per_pair.sh` builds and runs it.
//!
//! Never does: run under `cargo test` (a `harness = false` bench; the test
//! tests/plain_cpu_bench.rs includes its files and runs it briefly, with no
//! timing threshold), or leave a server it started running.

#[path = "plain_cpu/client.rs"]
mod client;
#[path = "plain_cpu/mini_echo.rs"]
mod mini_echo;
#[path = "plain_cpu/procstat.rs"]
mod procstat;
#[path = "plain_cpu/report.rs"]
mod report;
#[path = "plain_cpu/run.rs"]
mod run;

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, ExitCode};
use std::time::Duration;

use report::{RatioSpec, SystemInfo};
use run::{Options, Server};

const HELP: &str = "\
plain_cpu: server CPU per acquire + release pair, read by a plain mio client
(not the project's harness), batond against batond --echo and a minimal mio
echo, in one interleaved run (scripts/cpu_per_pair.sh runs it)

USAGE:
  cargo bench --bench plain_cpu -- [OPTIONS]

OPTIONS:
  --batond PATH        the batond to measure (default: $BATOND, else
                       target/release/batond)
  --batond-b PATH      another batond build, for the systems baton-b and
                       baton-b-nopoll (to compare two builds in one run)
  --batond-flag FLAG   one more flag for every batond started (repeat it;
                       also $BATOND_FLAGS, split at spaces)
  --systems LIST       of: baton, echo, mini, baton-nopoll, echo-nopoll,
                       baton-after-poll, echo-after-poll (default: the
                       first five; -nopoll is --busy-poll-us 0; -after-poll
                       drives the server with the other pacing: writes
                       once all of a poll's connections are read)
  --conns N            connections (default 50)
  --depths LIST        pairs in flight per connection (default 1,16)
  --rounds N           rounds, the order reversed every other (default 3)
  --warmup SECS        before each window (default 0.5)
  --measure SECS       each window (default 2)
  --no-split           leave placement to the kernel (default: the load
                       generator on the first CPU, the servers on the rest)
  --seed N             key seed (default 1)
  --pause SECS         wait this long once the servers are up, before the
                       first window (to attach a profiler; default 0)
  --quick              1 round of 1 s windows, 0.3 s warmup
  --mini-echo ADDR     serve as the minimal echo on ADDR (how the run starts
                       its echo; prints `listening on ADDR`)
";

struct Args {
    batond: String,
    batond_b: Option<String>,
    flags: Vec<String>,
    systems: Vec<String>,
    options: Options,
}

fn parse(mut args: pico_args::Arguments) -> Result<Args, String> {
    let err = |e: pico_args::Error| e.to_string();
    let secs = |s: &str| -> Result<Duration, String> {
        let v: f64 = s.parse().map_err(|_| format!("not seconds: {s}"))?;
        Duration::try_from_secs_f64(v).map_err(|_| format!("not seconds: {s}"))
    };
    let list = |s: &str| -> Vec<String> {
        s.split(',')
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect()
    };
    let quick = args.contains("--quick");
    let mut flags: Vec<String> = std::env::var("BATOND_FLAGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    flags.extend(
        args.values_from_str::<_, String>("--batond-flag")
            .map_err(err)?,
    );
    let batond = args
        .opt_value_from_str("--batond")
        .map_err(err)?
        .or_else(|| std::env::var("BATOND").ok())
        .unwrap_or_else(|| "target/release/batond".to_string());
    let batond_b = args.opt_value_from_str("--batond-b").map_err(err)?;
    let systems = args
        .opt_value_from_str::<_, String>("--systems")
        .map_err(err)?
        .map_or_else(
            || {
                ["baton", "echo", "mini", "baton-nopoll", "echo-nopoll"]
                    .map(str::to_string)
                    .to_vec()
            },
            |s| list(&s),
        );
    for s in &systems {
        if label(s) == "?" {
            return Err(format!("unknown system {s}"));
        }
    }
    let depths = match args
        .opt_value_from_str::<_, String>("--depths")
        .map_err(err)?
    {
        Some(s) => list(&s)
            .iter()
            .map(|d| d.parse().map_err(|_| format!("not a depth: {d}")))
            .collect::<Result<Vec<usize>, _>>()?,
        None => vec![1, 16],
    };
    let opt_secs = |args: &mut pico_args::Arguments, name: &'static str, default: f64| match args
        .opt_value_from_str::<_, String>(name)
        .map_err(err)?
    {
        Some(s) => secs(&s),
        None => Ok(Duration::from_secs_f64(default)),
    };
    let options = Options {
        conns: args
            .opt_value_from_str("--conns")
            .map_err(err)?
            .unwrap_or(50),
        depths,
        rounds: args
            .opt_value_from_str("--rounds")
            .map_err(err)?
            .unwrap_or(if quick { 1 } else { 3 }),
        warmup: opt_secs(&mut args, "--warmup", if quick { 0.3 } else { 0.5 })?,
        measure: opt_secs(&mut args, "--measure", if quick { 1.0 } else { 2.0 })?,
        split: !args.contains("--no-split"),
        seed: args.opt_value_from_str("--seed").map_err(err)?.unwrap_or(1),
        pause: opt_secs(&mut args, "--pause", 0.0)?,
    };
    // `cargo bench` passes --bench.
    let _ = args.contains("--bench");
    let rest = args.finish();
    if !rest.is_empty() {
        return Err(format!("unknown arguments: {rest:?}"));
    }
    if options.conns == 0 || options.rounds == 0 || options.depths.is_empty() {
        return Err("--conns, --rounds and --depths need at least 1".to_string());
    }
    Ok(Args {
        batond,
        batond_b,
        flags,
        systems,
        options,
    })
}

/// Start the named system.
fn start(
    name: &str,
    batond: &str,
    batond_b: Option<&str>,
    flags: &[String],
) -> Result<Server, String> {
    let with = |extra: &[&str]| -> Vec<String> {
        extra
            .iter()
            .map(|s| s.to_string())
            .chain(flags.iter().cloned())
            .collect()
    };
    match name {
        "baton" => Server::batond(name, batond, &with(&[])),
        "echo" => Server::batond(name, batond, &with(&["--echo"])),
        "baton-nopoll" => Server::batond(name, batond, &with(&["--busy-poll-us", "0"])),
        "echo-nopoll" => Server::batond(name, batond, &with(&["--echo", "--busy-poll-us", "0"])),
        "baton-after-poll" | "echo-after-poll" => {
            let echo = name == "echo-after-poll";
            let flags = with(if echo { &["--echo"] } else { &[] });
            let mut server = Server::batond(name, batond, &flags)?;
            server.after_poll = true;
            Ok(server)
        }
        "baton-b" | "baton-b-nopoll" => {
            let path = batond_b.ok_or("baton-b needs --batond-b PATH")?;
            let extra: &[&str] = if name == "baton-b" {
                &[]
            } else {
                &["--busy-poll-us", "0"]
            };
            Server::batond(name, path, &with(extra))
        }
        "mini" => {
            let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
            let mut command = Command::new(exe);
            command.args(["--mini-echo", "127.0.0.1:0"]);
            Server::listed(name, command)
        }
        other => Err(format!("unknown system {other}")),
    }
}

/// The label of a system in the tables.
fn label(name: &str) -> &'static str {
    match name {
        "baton" => "batond",
        "echo" => "batond --echo",
        "mini" => "minimal mio echo",
        "baton-nopoll" => "batond, polling off",
        "echo-nopoll" => "batond --echo, polling off",
        "baton-after-poll" => "batond, paced after the poll",
        "echo-after-poll" => "batond --echo, paced after the poll",
        "baton-b" => "batond (build b)",
        "baton-b-nopoll" => "batond (build b), polling off",
        _ => "?",
    }
}

/// The ratios printed: each node against each echo of its polling, and
/// against the minimal echo (which never polls).
fn ratios(systems: &[String]) -> Vec<RatioSpec> {
    let at = |n: &str| systems.iter().position(|s| s == n);
    [
        ("baton", "echo"),
        ("baton", "mini"),
        ("baton-nopoll", "echo-nopoll"),
        ("baton-nopoll", "mini"),
        ("echo", "mini"),
        ("baton-after-poll", "echo-after-poll"),
        ("baton-after-poll", "baton"),
        ("baton-b", "echo"),
        ("baton-b", "baton"),
        ("baton-b-nopoll", "echo-nopoll"),
        ("baton-b-nopoll", "baton-nopoll"),
    ]
    .iter()
    .filter_map(|(node, floor)| {
        Some(RatioSpec {
            node: at(node)?,
            floor: at(floor)?,
        })
    })
    .collect()
}

/// The minimal echo's own process: serve until standard input closes.
fn mini_echo(addr: &str) -> ExitCode {
    let addr: SocketAddr = match addr.parse() {
        Ok(a) => a,
        Err(_) => {
            eprintln!("plain_cpu: not an address: {addr}");
            return ExitCode::from(2);
        }
    };
    // The run holds the other end of standard input: when it ends, so
    // does this process.
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        std::process::exit(0);
    });
    let served = mini_echo::serve(addr, |bound| {
        let mut out = std::io::stdout();
        let _ = writeln!(out, "listening on {bound}");
        let _ = out.flush();
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plain_cpu: minimal echo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let mut raw = pico_args::Arguments::from_env();
    if raw.contains(["-h", "--help"]) {
        print!("{HELP}");
        return ExitCode::SUCCESS;
    }
    match raw.opt_value_from_str::<_, String>("--mini-echo") {
        Ok(Some(addr)) => return mini_echo(&addr),
        Ok(None) => {}
        Err(e) => {
            eprintln!("plain_cpu: {e}");
            return ExitCode::from(2);
        }
    }
    let args = match parse(raw) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("plain_cpu: {e} (see --help)");
            return ExitCode::from(2);
        }
    };
    let mut servers = Vec::new();
    for name in &args.systems {
        match start(name, &args.batond, args.batond_b.as_deref(), &args.flags) {
            Ok(s) => {
                eprintln!("plain_cpu: {name} on {} (pid {})", s.addr, s.pid());
                servers.push(s);
            }
            Err(e) => {
                eprintln!("plain_cpu: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let o = &args.options;
    let place = match run::placement(o.split) {
        Ok(Some((load, servers))) => {
            format!("load generator on CPU {load:?}, servers on {servers:?}")
        }
        Ok(None) => "placement left to the kernel".to_string(),
        Err(e) => {
            eprintln!("plain_cpu: {e}");
            return ExitCode::FAILURE;
        }
    };
    let samples = match run::measure(&servers, o, |line| eprintln!("plain_cpu: {line}")) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("plain_cpu: {e}");
            return ExitCode::FAILURE;
        }
    };
    let infos: Vec<SystemInfo> = args
        .systems
        .iter()
        .map(|n| SystemInfo {
            label: label(n).to_string(),
        })
        .collect();
    println!(
        "plain_cpu: C={}, {} rounds of {:.1} s windows (warm-up {:.1} s), {place}; \
         batond flags: {:?}; load average after the run: {}\n",
        o.conns,
        o.rounds,
        o.measure.as_secs_f64(),
        o.warmup.as_secs_f64(),
        args.flags,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim(),
    );
    print!(
        "{}",
        report::render(
            &infos,
            &ratios(&args.systems),
            &samples,
            o.conns,
            &o.depths,
            o.rounds
        )
    );
    drop(servers);
    ExitCode::SUCCESS
}
