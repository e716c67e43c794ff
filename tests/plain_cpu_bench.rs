//! The plain-client CPU run (benches/plain_cpu.rs): the bench target has
//! no test harness, so this test crate includes its files. It runs the
//! whole interleaved schedule briefly against a real `batond`, `batond
//! --echo` and the minimal echo (a child process: this test binary started
//! again as the echo), and checks that every window counted pairs and that
//! the report's ratio rows read back; and the report's arithmetic, the
//! `/proc` parsing and the address parsing on inputs made here. No timing
//! thresholds: what the figures are is for the run's reader.

#![cfg(target_os = "linux")]

#[allow(dead_code)]
#[path = "../benches/plain_cpu/client.rs"]
mod client;
#[allow(dead_code)]
#[path = "../benches/plain_cpu/mini_echo.rs"]
mod mini_echo;
#[allow(dead_code)]
#[path = "../benches/plain_cpu/procstat.rs"]
mod procstat;
#[allow(dead_code)]
#[path = "../benches/plain_cpu/report.rs"]
mod report;
#[allow(dead_code)]
#[path = "../benches/plain_cpu/run.rs"]
mod run;

use std::process::Command;
use std::time::Duration;

use report::{RatioSpec, SystemInfo};

/// Set in the environment of the child that serves as the minimal echo.
const ECHO_CHILD: &str = "BATON_PLAIN_CPU_ECHO_CHILD";

/// Not a test: the body of the child process the run below starts as its
/// minimal echo (this binary, run again with `--exact --ignored` on this
/// name and `ECHO_CHILD` set). Without `ECHO_CHILD` it returns at once.
#[test]
#[ignore = "the minimal echo's process, started by the run test"]
fn echo_child_process() {
    if std::env::var_os(ECHO_CHILD).is_none() {
        return;
    }
    // The run holds our standard input: when it closes, we end.
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        std::process::exit(0);
    });
    let addr = "127.0.0.1:0".parse().expect("address");
    mini_echo::serve(addr, |bound| println!("listening on {bound}")).expect("serve");
}

#[test]
fn a_short_interleaved_run_measures_every_system_and_its_ratios_read_back() {
    let batond = env!("CARGO_BIN_EXE_batond");
    let mut echo_child = Command::new(std::env::current_exe().expect("current_exe"));
    echo_child
        .args(["--exact", "echo_child_process", "--ignored", "--nocapture"])
        .env(ECHO_CHILD, "1");
    let servers = vec![
        run::Server::batond("baton", batond, &[]).expect("batond"),
        run::Server::batond("echo", batond, &["--echo".to_string()]).expect("batond --echo"),
        run::Server::listed("mini", echo_child).expect("minimal echo"),
    ];
    assert!(!servers[0].echo && servers[1].echo && servers[2].echo);
    let options = run::Options {
        conns: 4,
        depths: vec![1, 4],
        rounds: 2,
        warmup: Duration::from_millis(100),
        measure: Duration::from_millis(400),
        split: true,
        seed: 7,
        pause: Duration::ZERO,
    };
    let samples = run::measure(&servers, &options, |_| {}).expect("run");
    assert_eq!(samples.len(), 3 * 2 * 2, "every system, depth and round");
    for s in &samples {
        let m = &s.measured;
        assert!(m.pairs > 0, "{}: no pairs in {s:?}", servers[s.system].name);
        assert!(m.writes > 0 && m.reads > 0, "{s:?}");
        assert!(m.secs > 0.0, "{s:?}");
    }
    // The second round ran the order backwards.
    let first: Vec<_> = samples[..6].iter().map(|s| (s.system, s.depth)).collect();
    let mut second: Vec<_> = samples[6..].iter().map(|s| (s.system, s.depth)).collect();
    second.reverse();
    assert_eq!(first, second);
    let infos: Vec<_> = ["batond", "batond --echo", "minimal mio echo"]
        .iter()
        .map(|l| SystemInfo {
            label: l.to_string(),
        })
        .collect();
    let ratios = [
        RatioSpec { node: 0, floor: 1 },
        RatioSpec { node: 0, floor: 2 },
    ];
    let text = report::render(&infos, &ratios, &samples, 4, &[1, 4], 2);
    let rows = report::parse_ratios(&text);
    let names: Vec<_> = rows
        .iter()
        .map(|r| (r.workload.as_str(), r.ratio.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("C=4 depth 1", "batond ÷ batond --echo"),
            ("C=4 depth 1", "batond ÷ minimal mio echo"),
            ("C=4 depth 4", "batond ÷ batond --echo"),
            ("C=4 depth 4", "batond ÷ minimal mio echo"),
        ],
        "{text}"
    );
    for pid in servers.iter().map(run::Server::pid) {
        assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    }
    drop(servers);
}

fn sample(system: usize, depth: usize, round: usize, pairs: u64, cpu: f64) -> run::Sample {
    run::Sample {
        round,
        system,
        depth,
        measured: client::Measured {
            secs: 2.0,
            pairs,
            server_cpu: cpu,
            client_cpu: 1.0,
            reads: pairs / 8,
            empty_reads: 0,
            writes: pairs / 8,
            polls: 10,
            pairs_in_all: pairs,
        },
    }
}

#[test]
fn the_report_divides_cpu_per_pair_over_all_rounds_and_in_each() {
    // Node: 2 µs then 3 µs per pair; floor: 1 µs each round. All rounds:
    // (2 + 3) s ÷ 2 M pairs = 2.5 µs against 1 µs.
    let samples = [
        sample(0, 16, 0, 1_000_000, 2.0),
        sample(1, 16, 0, 2_000_000, 2.0),
        sample(0, 16, 1, 1_000_000, 3.0),
        sample(1, 16, 1, 1_000_000, 1.0),
    ];
    let infos: Vec<_> = ["node", "echo"]
        .iter()
        .map(|l| SystemInfo {
            label: l.to_string(),
        })
        .collect();
    let text = report::render(
        &infos,
        &[RatioSpec { node: 0, floor: 1 }],
        &samples,
        50,
        &[16],
        2,
    );
    assert_eq!(
        report::parse_ratios(&text),
        [report::RatioRow {
            workload: "C=50 depth 16".to_string(),
            ratio: "node ÷ echo".to_string(),
            value: 2.5,
        }],
        "{text}"
    );
    assert!(text.contains("| 2.50 | 2.00, 3.00 |"), "{text}");
    // The node's row: 2 M pairs over 4 s, 2.5 µs each, 8 pairs a write.
    assert!(
        text.contains("| C=50 depth 16 | node | 500.0k | 2.50 | 50% | 8.0 | 8.0 |"),
        "{text}"
    );
}

#[test]
fn cpu_ticks_are_read_after_a_command_name_with_spaces_and_parentheses() {
    let dir = std::env::temp_dir().join(format!("plain-cpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("stat");
    // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
    // majflt cmajflt utime stime ...
    std::fs::write(
        &path,
        "42 (a (b) c) S 1 42 42 0 -1 4194304 10 0 0 0 123 45 0 0 20 0 3 0\n",
    )
    .expect("write");
    assert_eq!(procstat::ticks(path.to_str().unwrap()), Some(168));
    std::fs::write(&path, "42 (x) S 1 2\n").expect("write");
    assert_eq!(procstat::ticks(path.to_str().unwrap()), None, "too short");
    std::fs::remove_dir_all(&dir).expect("clean up");
    assert!(procstat::process_ticks(std::process::id()).is_some());
    assert!(procstat::this_thread_ticks().is_some());
}

#[test]
fn the_address_comes_from_a_listening_line() {
    assert_eq!(
        run::listening_addr(
            "[INFO baton::server::node] listening on 127.0.0.1:4567 as active with 1 I/O loops"
        ),
        Some("127.0.0.1:4567".parse().unwrap())
    );
    assert_eq!(
        run::listening_addr("listening on 127.0.0.1:80"),
        Some("127.0.0.1:80".parse().unwrap())
    );
    assert_eq!(run::listening_addr("listening soon"), None);
    assert_eq!(run::listening_addr("listening on nowhere"), None);
}
