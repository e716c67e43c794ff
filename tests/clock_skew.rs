//! Clock skew between cluster nodes, with real processes: one node of a
//! two-node cluster on loopback runs under libfaketime with its wall clock
//! 120 s behind the other's (docs/cluster.md, "Keep the nodes' clocks in sync
//! (NTP)"; `cluster_core`, `MAX_PEER_AHEAD_MS`). The unit and simulation
//! tests drive the cores with skewed times; these check the same contract
//! end to end: the node behind follows the active, never makes a second
//! active, warns, is not counted in the active's `standbys=`, is handed no
//! role, and, promoted when the active dies, issues tokens above all it took.
//!
//! The skewed node gets `LD_PRELOAD=libfaketimeMT.so.1`, `FAKETIME=-120s`
//! and `FAKETIME_DONT_FAKE_MONOTONIC=1`. Without the last, libfaketime
//! (0.9.10) moves CLOCK_MONOTONIC too, onto the faked wall clock, and the
//! standard library's timed waits (`Condvar::wait_timeout`,
//! `recv_timeout`) hand the kernel's futex an absolute monotonic deadline
//! computed from that fake reading, which the kernel's real clock will not
//! reach for decades: a 300 ms wait never returns. With it, only the wall
//! clock (`SystemTime`, which token floors come from) is behind, and
//! `Instant` (timers, failure detection) is the real one. Each test checks
//! that the skew is in force, by the time stamps of the skewed node's log.
//!
//! Without libfaketime (Debian package `faketime`) each test says so on
//! stderr and passes, unless `BATON_REQUIRE_FAKETIME=1` (set by `.ci/run`
//! once it has installed it), which makes the absence a failure.
//!
//! Waits are polls with a deadline; the only intervals spent on purpose are
//! the observation windows that show a second active never appears. Every
//! node is killed by its PID when its handle drops, and every node's log is
//! printed if a test fails.

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::info::{field, num, serving, standby_of};
use common::nodes::{Nodes, deref_to_nodes};
use common::{DEADLINE, LineClient, token_of, wait_for};

/// `--detect` for every node (seconds), and the same in milliseconds.
const DETECT: &str = "0.5";
const DETECT_MS: u64 = 500;
/// How far behind the skewed node's wall clock runs (libfaketime's syntax),
/// and the same in milliseconds: twice the 60 s window.
const SKEW: &str = "-120s";
const SKEW_MS: u64 = 120_000;
/// How far a measured skew may be from SKEW_MS (start-up, the tokens' lead).
const SKEW_SLACK_MS: u64 = 10_000;
/// How long roles are watched for a second active or a handover: six
/// `--detect` (a node with a good clock takes the role back within one).
const WATCH: Duration = Duration::from_secs(6 * DETECT_MS / 1000);
/// The pace of the samples while watching.
const SAMPLE_EVERY: Duration = Duration::from_millis(10);

// ----- libfaketime -----

/// Where libfaketimeMT.so.1 is, if installed: Debian's multiarch directory
/// (`/usr/lib/<triplet>/faketime/`), or a plain `lib/faketime/`.
fn faketime_lib() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("faketime"))
        .collect();
    dirs.sort();
    dirs.push(PathBuf::from("/usr/lib/faketime"));
    dirs.push(PathBuf::from("/usr/local/lib/faketime"));
    dirs.into_iter()
        .map(|dir| dir.join("libfaketimeMT.so.1"))
        .find(|lib| lib.is_file())
}

/// libfaketime for test `test`; None (the test then passes, having said
/// why on stderr) if it is not installed, unless BATON_REQUIRE_FAKETIME=1.
fn faketime_or_skip(test: &str) -> Option<PathBuf> {
    if let Some(lib) = faketime_lib() {
        return Some(lib);
    }
    let why = "libfaketimeMT.so.1 is not installed (Debian package `faketime`)";
    assert!(
        std::env::var("BATON_REQUIRE_FAKETIME").as_deref() != Ok("1"),
        "{test}: {why}, and BATON_REQUIRE_FAKETIME=1 requires it"
    );
    // Straight to stderr, past the test harness's capture, so that a run
    // shows that this test checked nothing.
    let _ = writeln!(std::io::stderr(), "{test}: SKIPPED: {why}");
    None
}

/// The wall clock of this test process (not skewed), in Unix ms.
fn real_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_millis() as u64
}

/// The Unix time (seconds) of a log line stamped `[YYYY-MM-DDTHH:MM:SSZ`
/// (env_logger's default), if it is.
fn log_unix_s(line: &str) -> Option<u64> {
    let stamp = line.strip_prefix('[')?.get(..20)?;
    let (date, time) = stamp.strip_suffix('Z')?.split_once('T')?;
    let nums = |text: &str, sep: char| -> Option<Vec<i64>> {
        text.split(sep).map(|n| n.parse().ok()).collect()
    };
    let (d, t) = (nums(date, '-')?, nums(time, ':')?);
    let ([y, m, d], [hh, mm, ss]) = (<[i64; 3]>::try_from(d).ok()?, <[i64; 3]>::try_from(t).ok()?);
    // Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
    // days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss).ok()
}

/// The wall-clock ms a token stands for (tokens.rs: `unix_ms << 20`).
fn token_ms(token: u64) -> u64 {
    token >> 20
}

// ----- two nodes, one of them behind -----

/// Two `batond` processes with one `--peers` list (node 0 first), node
/// `skewed` with its wall clock SKEW behind. Killed by PID when dropped; if
/// the test fails, both logs are printed.
struct Pair {
    nodes: Nodes,
    skewed: usize,
    lib: PathBuf,
    /// This process's wall clock (Unix ms) when each node was last found
    /// listening.
    started_ms: [u64; 2],
}

deref_to_nodes!(Pair);

impl Pair {
    fn new(skewed: usize, lib: PathBuf) -> Pair {
        Pair {
            nodes: Nodes::on_free_ports(2),
            skewed,
            lib,
            started_ms: [0, 0],
        }
    }

    /// Start node `i` (under libfaketime if it is the skewed one); returns
    /// once it listens.
    fn start(&mut self, i: usize) {
        let flags = [
            "--cluster-key-file",
            common::cluster_key_file(),
            "--detect",
            DETECT,
        ];
        let lib = self.lib.to_string_lossy().into_owned();
        let env: &[(&str, &str)] = if i == self.skewed {
            &[
                ("LD_PRELOAD", lib.as_str()),
                ("FAKETIME", SKEW),
                ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
            ]
        } else {
            &[]
        };
        self.nodes.start_with(i, &flags, env);
        self.started_ms[i] = real_unix_ms();
    }

    /// Wait until node `i`'s log has a line containing every one of
    /// `parts`; that line.
    fn wait_log_line(&self, i: usize, parts: &[&str]) -> String {
        wait_for(
            &format!("a line with {parts:?} in node {i}'s log"),
            DEADLINE,
            || {
                self.node(i)
                    .log()
                    .lines()
                    .find(|line| parts.iter().all(|p| line.contains(p)))
                    .map(str::to_string)
            },
        )
    }

    /// The skewed node's wall clock is SKEW behind this process's: the
    /// time stamp of its "listening on" log line (env_logger's, from the
    /// wall clock) against this process's clock when that line was read.
    /// From the log, not from `token=`, so that it holds whatever the node
    /// took from its peer.
    fn check_skew_in_force(&self) {
        let i = self.skewed;
        let log = self.node(i).log();
        let line = log
            .lines()
            .find(|line| line.contains("listening on "))
            .unwrap_or_else(|| panic!("no \"listening on\" line in node {i}'s log:\n{log}"));
        let stamped_ms = 1000
            * log_unix_s(line)
                .unwrap_or_else(|| panic!("no [YYYY-MM-DDTHH:MM:SSZ time stamp in {line:?}"));
        let behind = self.started_ms[i].saturating_sub(stamped_ms);
        println!("node {i} (skewed): clock about {behind} ms behind, by its log");
        assert!(
            behind.abs_diff(SKEW_MS) < SKEW_SLACK_MS,
            "node {i} runs under libfaketime with FAKETIME={SKEW}, but its log says its \
             clock is {behind} ms behind: {line}"
        );
    }

    /// The skewed node's warning about node `peer` (docs/cluster.md: `sent a token N
    /// s ahead of this node's clock`), with N about SKEW; the line.
    fn wait_skew_warning(&self, peer: usize) -> String {
        let name = self.name(peer);
        let line = self.wait_log_line(
            self.skewed,
            &[&name, "sent a token", "ahead of this node's clock"],
        );
        let ahead_s: u64 = line
            .split("sent a token ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no number of seconds in {line:?}"));
        assert!(
            (ahead_s * 1000).abs_diff(SKEW_MS) < SKEW_SLACK_MS,
            "the warning should say about {} s: {line}",
            SKEW_MS / 1000
        );
        line
    }

    /// For WATCH: node `active` serves and does not count the skewed node
    /// as a synced standby, node `standby` follows it and holds none of its
    /// keys; never two actives. `each` runs between samples (clients).
    /// The number of samples taken.
    fn watch_roles(&self, active: usize, standby: usize, mut each: impl FnMut()) -> usize {
        let active_name = self.name(active);
        let start = Instant::now();
        let mut samples = 0;
        while start.elapsed() < WATCH {
            let a = self.must_info(active);
            let s = self.must_info(standby);
            let actives = [&a, &s]
                .iter()
                .filter(|info| field(info, "role") == "active")
                .count();
            assert!(actives <= 1, "two actives (split brain):\n{a}\n{s}");
            assert!(serving(&a), "node {active} should serve: {a}");
            assert!(
                standby_of(&s, &active_name),
                "node {standby} should follow node {active}: {s}"
            );
            assert_eq!(
                num(&a, "standbys"),
                0,
                "the active counts the node behind as a synced standby: {a}"
            );
            assert_eq!(
                num(&s, "held"),
                0,
                "the node behind took the active's grants: {s}"
            );
            samples += 1;
            each();
            // Pace the samples (a few hundred in all) on a shared machine.
            std::thread::sleep(SAMPLE_EVERY);
        }
        samples
    }
}

// ----- reading answers -----

/// Acquire `key` for `lease` seconds on `client`, which must grant at once;
/// the token, which must be above every token in `tokens` (then added).
fn grant(client: &mut LineClient, key: &str, lease: &str, tokens: &mut Vec<u64>) -> u64 {
    let answer = client.ask(&format!("A {key} {lease} 0"));
    assert!(
        answer.ends_with(&format!(" {key}")),
        "expected a grant of {key}, got {answer:?}"
    );
    let token = token_of(&answer);
    if let Some(&last) = tokens.last() {
        assert!(token > last, "tokens do not grow: {last} then {token}");
    }
    tokens.push(token);
    token
}

// ----- the scenarios -----

/// The second node, 120 s behind, follows the first: one active throughout,
/// the skew warned about, the node behind not counted in `standbys=` and
/// holding none of the active's keys, clients served by the active with
/// growing tokens and sent to it by the node behind.
#[test]
fn a_node_120_s_behind_follows_the_active_without_holding_its_state() {
    let Some(lib) =
        faketime_or_skip("a_node_120_s_behind_follows_the_active_without_holding_its_state")
    else {
        return;
    };
    let mut pair = Pair::new(1, lib);
    pair.start(0);
    pair.wait_serving(0);
    pair.start(1);
    let standby = pair.wait_standby_of(1, 0);
    println!("node 1: {standby}");
    pair.check_skew_in_force();

    let mut active = pair.client(0);
    let mut behind = pair.client(1);
    let active_name = pair.name(0);
    let mut tokens = Vec::new();
    let samples = pair.watch_roles(0, 1, || {
        let key = format!("job{}", tokens.len());
        grant(&mut active, &key, "30", &mut tokens);
        assert_eq!(
            behind.ask(&format!("A {key} 30 0")),
            format!("M {active_name} A {key}"),
            "the node behind sends clients to the active"
        );
        assert_eq!(
            behind.ask(&format!("Q {key}")),
            format!("M {active_name} Q {key}")
        );
    });
    println!(
        "{samples} samples over {WATCH:?}, {} grants on node 0, tokens {}..={}",
        tokens.len(),
        tokens[0],
        tokens[tokens.len() - 1]
    );
    assert!(samples >= 50, "too few samples to show anything: {samples}");
    let info = pair.must_info(0);
    assert_eq!(num(&info, "held"), tokens.len() as u64, "{info}");
    let warning = pair.wait_skew_warning(0);
    println!("node 1 warned: {warning}");
    // The active hears the node behind (its heartbeats say it follows) and
    // knows it lacks the state: it sends the snapshot again, ever less often.
    let resend = pair.wait_log_line(0, &[&pair.name(1), "still lacks the state"]);
    println!("node 0: {resend}");
}

/// The first node of `--peers`, 120 s behind, starts after the second is
/// active: it follows the second and never takes the role back (a node
/// with a good clock would: the active hands over to a higher-priority
/// standby once it holds the state).
#[test]
fn a_first_node_120_s_behind_never_takes_the_role_back() {
    let Some(lib) = faketime_or_skip("a_first_node_120_s_behind_never_takes_the_role_back") else {
        return;
    };
    let mut pair = Pair::new(0, lib);
    pair.start(1);
    pair.wait_serving(1);
    let mut active = pair.client(1);
    let mut tokens = Vec::new();
    grant(&mut active, "held-before", "60", &mut tokens);
    pair.start(0);
    // It follows node 1, or (the failure this test is for) has taken the
    // role over by the time it is asked.
    let active_name = pair.name(1);
    let joined = wait_for("node 0 to follow node 1 (or take over)", DEADLINE, || {
        pair.info(0)
            .filter(|info| standby_of(info, &active_name) || field(info, "role") == "active")
    });
    println!("node 0: {joined}");
    assert!(
        standby_of(&joined, &active_name),
        "the first node, behind, took the role: {joined}"
    );
    pair.check_skew_in_force();

    let mut first = pair.client(0);
    let samples = pair.watch_roles(1, 0, || {
        let key = format!("job{}", tokens.len());
        grant(&mut active, &key, "30", &mut tokens);
        assert_eq!(
            first.ask(&format!("R {key} 1")),
            format!("M {active_name} R {key}"),
            "the first node, behind, sends clients to the active"
        );
    });
    println!(
        "{samples} samples over {WATCH:?}: node 1 active throughout, {} grants",
        tokens.len()
    );
    assert!(samples >= 50, "too few samples to show anything: {samples}");
    let log = pair.node(1).log();
    assert!(
        !log.contains("transfer the active role"),
        "the active tried to hand its role to the node behind:\n{log}"
    );
    let warning = pair.wait_skew_warning(1);
    println!("node 0 warned: {warning}");
}

/// The active dies and the node 120 s behind, the only one left, is
/// promoted: its tokens are above every token it took and above its own
/// clock floor, and (as docs/cluster.md says) below the old active's, which a
/// fenced resource would hold against them until its clock catches up.
#[test]
fn the_node_behind_promoted_issues_tokens_above_all_it_took() {
    let Some(lib) = faketime_or_skip("the_node_behind_promoted_issues_tokens_above_all_it_took")
    else {
        return;
    };
    let mut pair = Pair::new(1, lib);
    pair.start(0);
    pair.wait_serving(0);
    pair.start(1);
    pair.wait_standby_of(1, 0);
    pair.check_skew_in_force();
    let mut active = pair.client(0);
    let mut old_tokens = Vec::new();
    for i in 0..5 {
        grant(&mut active, &format!("old{i}"), "60", &mut old_tokens);
    }
    // What the node behind took, just before the active goes: its token
    // counter and ceiling (each only grows with what it takes).
    let took = pair.must_info(1);
    let took_max = num(&took, "token").max(num(&took, "ceiling"));
    println!("node 1 before the failover: {took}");

    drop(active);
    pair.kill(0);
    let killed = Instant::now();
    let promoted = pair.wait_serving(1);
    println!(
        "node 1 serves {:?} after node 0 was killed: {promoted}",
        killed.elapsed()
    );
    let mut client = pair.client(1);
    let mut new_tokens = Vec::new();
    for i in 0..5 {
        let floor_ms = real_unix_ms() - SKEW_MS - SKEW_SLACK_MS;
        let token = grant(&mut client, &format!("new{i}"), "60", &mut new_tokens);
        assert!(
            token > took_max,
            "token {token} of the promoted node is not above {took_max}, which it took"
        );
        assert!(
            token_ms(token) >= floor_ms,
            "token {token} of the promoted node is below its own clock floor"
        );
    }
    // It knows only the keys it could take: none of the old active's.
    for i in 0..5 {
        assert_eq!(client.ask(&format!("Q old{i}")), format!("Q old{i} 0 0 0"));
    }
    let old_max = old_tokens[old_tokens.len() - 1];
    let new_min = new_tokens[0];
    assert!(
        new_min < old_max,
        "docs/cluster.md says the promoted node's tokens are below the old active's \
         (its clock is 120 s behind): {new_min} >= {old_max}"
    );
    println!(
        "old active's tokens up to {old_max}; the promoted node's from {new_min}, \
         {} s of clock below",
        token_ms(old_max).abs_diff(token_ms(new_min)) / 1000
    );
    pair.wait_skew_warning(0);
}
