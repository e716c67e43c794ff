//! Connection storms (docs/running.md, "What the operating system must
//! allow"): a fleet that connects one client after another, as one does
//! after a restart or a failover, is admitted without a SYN lost, and a
//! node that is full says so at once instead of leaving SYNs in its queue.
//!
//! - 10,000 sequential idle connects to one node, the first 2,000 while
//!   it is stopped (SIGSTOP, as if off the CPU): every one admitted, none
//!   of them waited for a retransmitted SYN, and every one answers `I`;
//! - `--max-conns` reached: each connection past it, however many come,
//!   is answered `E - - too-many-connections` and closed, with no SYN
//!   retransmitted, even when they pile up while the node is stopped;
//! - the open-file limit: too low to raise, `batond` warns at start and
//!   says what to raise; a soft limit below a high enough hard limit is
//!   raised by `batond` itself; out of open files, a connection is refused
//!   as `--max-conns` refuses it, not left in the queue.
//!
//! A retransmitted SYN is read from the client's socket (`TCP_INFO`:
//! `tcpi_total_retrans`, which counts the SYNs sent again), and from the
//! one-second signature it leaves (a connect that took a second or more):
//! no other timing is judged. The machine-wide counters of listen-queue
//! overflows (`/proc/net/netstat`) are printed, not judged: other
//! processes on the machine move them too. The tests need the hard limit
//! on open files that `.ci/run` gives them (`ulimit -n "$(ulimit -Hn)"`);
//! where it is lower, the storm is scaled down and says so. Run with
//! `cargo test --release --test storm -- --nocapture` to see the figures.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{DEADLINE, Ending, LineClient, Node, batond_path, info_field, raise_fd_limit};

/// Connections of the sequential storm.
const STORM: usize = 10_000;
/// What a retransmitted SYN costs a client: its first retransmission
/// timeout (Linux's `TCP_TIMEOUT_INIT`). A connect that takes this long
/// waited for one.
const SYN_RETRANSMIT: Duration = Duration::from_secs(1);
/// Files this process needs beyond its storm's sockets.
const OWN_FILES: usize = 200;
/// Connections of the storm made while the node is stopped (SIGSTOP), as
/// if it were off the CPU: fewer than the listen backlog (4096), they wait
/// in the queue, with room left for the connections that keep coming while
/// the node, woken once, takes them. (With `std`'s backlog of 128, the
/// 129th lost its SYN.)
const STALLED: usize = 2000;
/// --max-conns of the refusal test, and the connections sent past it.
const FULL_AT: usize = 100;
const PAST_FULL: usize = 300;

static NODE_TESTS: Mutex<()> = Mutex::new(());

/// Held by every test here: one storm at a time.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    NODE_TESTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How one connect went.
struct Connected {
    client: LineClient,
    /// SYNs sent again before the handshake finished (and any other
    /// retransmission so far).
    retransmits: u32,
    took: Duration,
}

/// Connect to `addr`, timing it and reading the socket's retransmissions.
fn connect(addr: SocketAddr) -> Connected {
    let start = Instant::now();
    let client = LineClient::connect(addr);
    let took = start.elapsed();
    let retransmits = total_retrans(&client.stream);
    Connected {
        client,
        retransmits,
        took,
    }
}

/// `tcpi_total_retrans` of a connected socket (`TCP_INFO`): a SYN sent
/// again counts.
fn total_retrans(stream: &TcpStream) -> u32 {
    // SAFETY: tcp_info is plain data; getsockopt writes at most `len` bytes
    // of it and says how many.
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
    assert_eq!(rc, 0, "getsockopt(TCP_INFO)");
    info.tcpi_total_retrans
}

/// The machine's `TcpExt` counters named (from `/proc/net/netstat`).
fn tcp_ext(names: &[&str]) -> Vec<u64> {
    let text = std::fs::read_to_string("/proc/net/netstat").unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let mut values = vec![0; names.len()];
    for pair in lines.chunks(2) {
        let [keys, nums] = pair else { continue };
        if !keys.starts_with("TcpExt:") {
            continue;
        }
        for (k, v) in keys.split_whitespace().zip(nums.split_whitespace()) {
            if let Some(i) = names.iter().position(|n| *n == k) {
                values[i] = v.parse().unwrap_or(0);
            }
        }
    }
    values
}

const OVERFLOW_COUNTERS: [&str; 3] = ["ListenOverflows", "ListenDrops", "TCPSynRetrans"];

/// A number from an `I` answer.
fn info_number(info: &str, name: &str) -> u64 {
    info_field(info, name)
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no number {name}= in {info:?}"))
}

/// `batond --bind 127.0.0.1 --port 0 <args>` started through
/// `sh -c 'ulimit <limit>; exec batond ...'`, as an operator's shell would
/// start it under a low open-file limit.
fn node_under_ulimit(limit: &str, args: &[&str]) -> Node {
    let script = format!("ulimit {limit} && exec \"$0\" \"$@\"");
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(script)
        .arg(batond_path())
        .args(["--bind", "127.0.0.1", "--port", "0"])
        .args(args)
        .env("RUST_LOG", "info");
    // `exec`: the child's PID is batond's, killed when the Node drops.
    Node::from_command(command, None)
}

#[test]
fn ten_thousand_sequential_idle_connects_are_all_admitted_without_a_retransmitted_syn() {
    let _one = one_at_a_time();
    let soft = raise_fd_limit() as usize;
    let storm = STORM.min(soft.saturating_sub(OWN_FILES));
    if storm < STORM {
        println!("RLIMIT_NOFILE is {soft}: the storm is scaled down to {storm} connections");
    }
    assert!(
        storm >= 1000,
        "RLIMIT_NOFILE {soft} is too low for this test"
    );
    let max_conns = (storm + OWN_FILES).to_string();
    let node = Node::start(&["--max-conns", &max_conns]);
    // The queue holds at least 4096 (more if net.core.somaxconn allows).
    let log = node.log();
    let backlog: usize = log
        .split("(backlog ")
        .nth(1)
        .and_then(|rest| rest.split(')').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no backlog in the listening line:\n{log}"));
    assert!(
        backlog >= 4096,
        "the client port listens with a backlog of {backlog}, below 4096: net.core.somaxconn \
         caps it (docs/running.md says how to raise it):\n{log}"
    );

    // One client after another, each left idle, as a pool opens its
    // connections before its first request.
    let before = tcp_ext(&OVERFLOW_COUNTERS);
    let start = Instant::now();
    let mut clients = Vec::with_capacity(storm);
    let (mut retransmitted, mut slow) = (Vec::new(), Vec::new());
    for i in 0..storm {
        // The first STALLED while the node is off the CPU (stopped): they
        // wait in the listen queue, and the node, woken once, takes them all.
        if i == 0 {
            node.signal("STOP");
        } else if i == STALLED.min(storm / 2) {
            node.signal("CONT");
        }
        let c = connect(node.addr);
        if c.retransmits > 0 {
            retransmitted.push((i, c.retransmits, c.took));
        }
        if c.took >= SYN_RETRANSMIT {
            slow.push((i, c.took));
        }
        clients.push(c.client);
    }
    let took = start.elapsed();
    let after = tcp_ext(&OVERFLOW_COUNTERS);
    let deltas: Vec<String> = OVERFLOW_COUNTERS
        .iter()
        .zip(before.iter().zip(&after))
        .map(|(name, (b, a))| format!("{name} +{}", a.saturating_sub(*b)))
        .collect();
    println!(
        "{storm} sequential connects (backlog {backlog}) in {took:?}: {} retransmitted a SYN, {} took {SYN_RETRANSMIT:?} \
         or more (machine-wide: {})",
        retransmitted.len(),
        slow.len(),
        deltas.join(", ")
    );
    assert!(
        retransmitted.is_empty() && slow.is_empty(),
        "connections that lost a SYN (index, retransmissions, connect time): {retransmitted:?}; \
         connects of {SYN_RETRANSMIT:?} or more: {slow:?}"
    );

    // Every one admitted: the node counts them all, and each answers `I`.
    let last = clients.last_mut().expect("connections");
    let info = common::wait_for("every connection counted", DEADLINE, || {
        let info = last.info();
        (info_number(&info, "conns") == storm as u64).then_some(info)
    });
    assert_eq!(info_number(&info, "conns"), storm as u64, "{info}");
    for client in clients.iter_mut() {
        client.send("I");
    }
    for (i, client) in clients.iter_mut().enumerate() {
        let answer = client.recv();
        assert!(answer.starts_with("I "), "connection {i}: {answer:?}");
    }
}

#[test]
fn connections_past_max_conns_are_refused_at_once_with_no_syn_left_waiting() {
    let _one = one_at_a_time();
    raise_fd_limit();
    let node = Node::start(&["--max-conns", &FULL_AT.to_string()]);
    let mut admitted: Vec<LineClient> = (0..FULL_AT).map(|_| connect(node.addr).client).collect();
    let last = admitted.last_mut().expect("connections");
    let info = common::wait_for("the node full", DEADLINE, || {
        let info = last.info();
        (info_number(&info, "conns") == FULL_AT as u64).then_some(info)
    });
    assert_eq!(info_number(&info, "conns"), FULL_AT as u64, "{info}");

    // More than std's backlog of 128, one after another, none read until
    // all have connected: each is taken off the queue and refused, so none
    // waits for a SYN again.
    // The node is stopped meanwhile (as if off the CPU): they wait in the
    // queue, and are refused once it runs again.
    node.signal("STOP");
    let refused: Vec<Connected> = (0..PAST_FULL).map(|_| connect(node.addr)).collect();
    node.signal("CONT");
    for (i, mut c) in refused.into_iter().enumerate() {
        assert_eq!(
            c.retransmits, 0,
            "connection {i} past --max-conns lost a SYN"
        );
        assert!(
            c.took < SYN_RETRANSMIT,
            "connection {i} past --max-conns took {:?} to connect",
            c.took
        );
        let (lines, ending) = c.client.rest_until_closed(DEADLINE);
        assert_eq!(
            (lines, ending),
            (vec!["E - - too-many-connections".to_string()], Ending::Eof),
            "connection {i} past --max-conns"
        );
    }
    // The admitted ones are still served.
    for client in admitted.iter_mut() {
        assert!(client.info().starts_with("I "));
    }
}

#[test]
fn an_open_file_limit_too_low_for_max_conns_is_warned_about_at_start_with_the_fix() {
    let _one = one_at_a_time();
    // Soft and hard limit both 256: nothing batond can raise.
    let node = node_under_ulimit("-n 256", &[]);
    let log = node.log();
    for says in [
        "the open-file limit is 256 (hard limit 256)",
        "--max-conns 10000",
        "ulimit -n 10256",
        "LimitNOFILE=10256",
    ] {
        assert!(log.contains(says), "{says:?} in the start-up log:\n{log}");
    }
}

#[test]
fn a_soft_open_file_limit_below_the_hard_one_is_raised_by_batond_itself() {
    let _one = one_at_a_time();
    let hard = {
        raise_fd_limit();
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit only writes the struct we pass.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        limit.rlim_max
    };
    if hard < 1256 {
        println!("hard RLIMIT_NOFILE {hard} is below 1256: nothing to show");
        return;
    }
    let node = node_under_ulimit("-Sn 256", &["--max-conns", "1000"]);
    let log = node.log();
    assert!(
        log.contains("raised the open-file limit from 256 to 1256"),
        "{log}"
    );
    assert!(!log.contains("WARN"), "{log}");
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", node.pid())).unwrap();
    let open_files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_default();
    assert_eq!(
        open_files.split_whitespace().nth(3),
        Some("1256"),
        "{open_files}"
    );
}

#[test]
fn out_of_open_files_a_connection_is_refused_at_once_not_left_in_the_queue() {
    let _one = one_at_a_time();
    // 64 files for --max-conns 1000: the node runs out of files first.
    let node = node_under_ulimit("-n 64", &["--max-conns", "1000"]);
    let mut admitted = Vec::new();
    let mut refused = 0;
    for i in 0..100 {
        let mut c = connect(node.addr);
        assert_eq!(c.retransmits, 0, "connection {i} lost a SYN");
        c.client.send("I");
        let answer = c.client.recv();
        if answer.starts_with("I ") {
            assert_eq!(refused, 0, "connection {i} admitted after one was refused");
            admitted.push(c.client);
        } else {
            assert_eq!(answer, "E - - too-many-connections", "connection {i}");
            assert!(c.client.closed_within(DEADLINE), "connection {i} closed");
            refused += 1;
        }
    }
    assert!(
        !admitted.is_empty() && refused > 0,
        "{} admitted, {refused} refused",
        admitted.len()
    );
    assert!(node.log().contains("Too many open files"), "{}", node.log());
    // A file freed is a connection admitted again.
    drop(admitted.pop());
    let mut again = common::wait_for("a connection admitted again", DEADLINE, || {
        let mut client = connect(node.addr).client;
        client.send("I");
        client.recv().starts_with("I ").then_some(client)
    });
    assert!(again.info().starts_with("I "));
}
