//! Failover timing of a local baton cluster: how long clients go without an
//! active node.
//!
//! Owns: starting real `batond` clusters of 2 and 3 nodes on loopback,
//! killing and stopping their active node, and watching every node's `I`
//! answer once a millisecond. It reports, per cluster size:
//! - kill → new active: from SIGKILL of the active to another node answering
//!   `state=active`;
//! - graceful gap: from SIGTERM of the active to the first moment a node
//!   answers `state=active` again, minus nothing — i.e. the time with no node
//!   serving (the old one stops serving when it starts handing off);
//! - restart handoff gap: when the killed node comes back and takes over by
//!   handoff, the time with no node answering `state=active`.
//!
//! Run: `cargo bench --bench failover -- [--rounds N] [--detect SECS]`
//! (or `scripts/failover.sh`). Every process is killed by PID at the end.

#[path = "../tests/common/cluster_key.rs"]
mod cluster_key;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const POLL_EVERY: Duration = Duration::from_millis(1);
const BOUND: Duration = Duration::from_secs(20);

struct Node {
    port: u16,
    child: Option<Child>,
    conn: Option<BufReader<TcpStream>>,
}

impl Node {
    fn start(&mut self, peers: &str, detect: &str) {
        let child = Command::new(env!("CARGO_BIN_EXE_batond"))
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--peers", peers, "--detect", detect, "--threads", "1"])
            .args(["--cluster-key-file", cluster_key::cluster_key_file()])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn batond");
        self.child = Some(child);
        self.conn = None;
    }

    fn signal(&mut self, sig: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .arg(format!("-{sig}"))
                .arg(child.id().to_string())
                .stderr(Stdio::null())
                .status();
        }
    }

    fn reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.conn = None;
    }

    /// The node's `state=` from `I`, or None if it does not answer.
    fn state(&mut self) -> Option<String> {
        if self.conn.is_none() {
            let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
            let stream = TcpStream::connect_timeout(&addr, Duration::from_millis(50)).ok()?;
            stream
                .set_read_timeout(Some(Duration::from_millis(200)))
                .ok()?;
            stream.set_nodelay(true).ok()?;
            self.conn = Some(BufReader::new(stream));
        }
        let answer = self.ask_info();
        if answer.is_none() {
            self.conn = None;
        }
        answer
    }

    fn ask_info(&mut self) -> Option<String> {
        let conn = self.conn.as_mut()?;
        conn.get_mut().write_all(b"I\n").ok()?;
        let mut line = String::new();
        if conn.read_line(&mut line).ok()? == 0 {
            return None;
        }
        line.split(' ')
            .find_map(|kv| kv.trim().strip_prefix("state=").map(str::to_string))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.signal("CONT");
        self.reap();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Poll every node until `done` says so; the time it took.
fn watch(nodes: &mut [Node], mut done: impl FnMut(&[Option<String>]) -> bool) -> Duration {
    let start = Instant::now();
    loop {
        let states: Vec<Option<String>> = nodes.iter_mut().map(Node::state).collect();
        if done(&states) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < BOUND,
            "cluster did not settle: {states:?}"
        );
        std::thread::sleep(POLL_EVERY);
    }
}

fn active_index(states: &[Option<String>]) -> Option<usize> {
    let actives: Vec<usize> = (0..states.len())
        .filter(|&i| states[i].as_deref() == Some("active"))
        .collect();
    (actives.len() == 1).then(|| actives[0])
}

/// Every node answers and node `want` is the one active.
fn settled_on(states: &[Option<String>], want: usize) -> bool {
    states.iter().all(Option::is_some) && active_index(states) == Some(want)
}

struct Round {
    kill_to_active: Duration,
    restart_gap: Duration,
    graceful_gap: Duration,
}

fn one_round(n: usize, detect: &str) -> Round {
    let mut nodes: Vec<Node> = (0..n)
        .map(|_| Node {
            port: free_port(),
            child: None,
            conn: None,
        })
        .collect();
    let peers = nodes
        .iter()
        .map(|node| format!("127.0.0.1:{}", node.port))
        .collect::<Vec<_>>()
        .join(",");
    for node in &mut nodes {
        node.start(&peers, detect);
    }
    watch(&mut nodes, |s| settled_on(s, 0));

    // SIGKILL the active: time until node 1 serves.
    let killed_at = Instant::now();
    nodes[0].signal("KILL");
    nodes[0].reap();
    watch(&mut nodes[1..], |s| active_index(s) == Some(0));
    let kill_to_active = killed_at.elapsed();

    // Restart node 0: it takes over by handoff; measure the longest stretch
    // with no node answering state=active.
    nodes[0].start(&peers, detect);
    let mut gap = GapMeter::default();
    watch(&mut nodes, |s| {
        gap.observe(active_index(s).is_some());
        settled_on(s, 0)
    });
    let restart_gap = gap.longest;

    // SIGTERM the active: graceful handoff to node 1.
    let mut gap = GapMeter::default();
    nodes[0].signal("TERM");
    watch(&mut nodes[1..], |s| {
        gap.observe(active_index(s).is_some());
        active_index(s) == Some(0)
    });
    if let Some(child) = nodes[0].child.as_mut() {
        let _ = child.wait();
    }
    Round {
        kill_to_active,
        restart_gap: restart_gap.unwrap_or_default(),
        graceful_gap: gap.longest.unwrap_or_default(),
    }
}

/// The longest run of observations with no active node.
#[derive(Default)]
struct GapMeter {
    since: Option<Instant>,
    longest: Option<Duration>,
}

impl GapMeter {
    fn observe(&mut self, serving: bool) {
        match (serving, self.since) {
            (false, None) => self.since = Some(Instant::now()),
            (true, Some(since)) => {
                let gap = since.elapsed();
                self.longest = Some(self.longest.map_or(gap, |l| l.max(gap)));
                self.since = None;
            }
            _ => {}
        }
        if self.longest.is_none() && serving {
            self.longest = Some(Duration::ZERO);
        }
    }
}

fn summary(mut xs: Vec<Duration>) -> String {
    xs.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    format!(
        "{:>8.1} {:>8.1} {:>8.1}",
        ms(xs[0]),
        ms(xs[xs.len() / 2]),
        ms(xs[xs.len() - 1])
    )
}

fn main() {
    let mut args = pico_args::Arguments::from_env();
    if args.contains(["-h", "--help"]) {
        println!("failover [--rounds N (default 5)] [--detect SECS (default 1)]");
        return;
    }
    let _ = args.contains("--bench");
    let rounds: usize = args
        .opt_value_from_str("--rounds")
        .ok()
        .flatten()
        .unwrap_or(5);
    let detect: String = args
        .opt_value_from_str("--detect")
        .ok()
        .flatten()
        .unwrap_or_else(|| "1".to_string());
    println!(
        "baton failover, {rounds} rounds per size, --detect {detect}; times in ms (min / median / max)"
    );
    println!(
        "{:<6} {:<28} {:>8} {:>8} {:>8}",
        "nodes", "measure", "min", "median", "max"
    );
    for n in [2, 3] {
        let results: Vec<Round> = (0..rounds).map(|_| one_round(n, &detect)).collect();
        let pick = |f: fn(&Round) -> Duration| results.iter().map(f).collect::<Vec<_>>();
        println!(
            "{n:<6} {:<28} {}",
            "SIGKILL -> new active",
            summary(pick(|r| r.kill_to_active))
        );
        println!(
            "{n:<6} {:<28} {}",
            "restart handoff, no active",
            summary(pick(|r| r.restart_gap))
        );
        println!(
            "{n:<6} {:<28} {}",
            "SIGTERM handoff, no active",
            summary(pick(|r| r.graceful_gap))
        );
    }
}
