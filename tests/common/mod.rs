//! Test support shared by the integration tests: real `batond` processes on
//! loopback ports, a line-oriented TCP client, and deadline-bounded polling;
//! `faults` adds a proxy that cuts, stalls or refuses connections and a fake
//! standby that answers `M`, for the client tests; `http` one request to
//! a metrics port and its response; `info` reads the `I`
//! answers the cluster tests poll, and `nodes` holds a test cluster's nodes
//! and puts together their command lines.
//!
//! Every process started here is killed (by its PID) when its handle drops,
//! so a failing test leaves nothing running. Nothing here sleeps to
//! synchronise: waits are polls with a deadline.

#![allow(dead_code)]

pub mod cluster_key;
pub mod faults;
pub mod http;
pub mod info;
pub mod nodes;
pub mod pki;
pub mod rng;

#[allow(unused_imports)]
pub use cluster_key::cluster_key_file;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long any single wait in a test may take before it fails.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// Path of the built `batond` binary.
pub fn batond_path() -> &'static str {
    env!("CARGO_BIN_EXE_batond")
}

/// Path of the built `baton` binary.
pub fn baton_path() -> &'static str {
    env!("CARGO_BIN_EXE_baton")
}

/// A free loopback port, for a node that must know its port before it
/// starts (a cluster's `--peers`). See [`free_port_run`].
pub fn free_port() -> u16 {
    free_port_run(1)
}

/// The first of `n` consecutive free loopback ports. They are taken below
/// the kernel's ephemeral range (32768 and up by default), so no outgoing
/// connection of another test can take one between this check and the
/// node's bind; each test process walks its own stretch of the range (from
/// its PID), one run at a time, so two tests of a process never get the
/// same port; and each port is checked to bind.
pub fn free_port_run(n: u16) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let n = u32::from(n.max(1));
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(1_031) % SPAN,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..SPAN {
        let offset = NEXT.fetch_add(n, Ordering::Relaxed) % SPAN;
        if offset + n > SPAN {
            continue;
        }
        let base = FIRST + offset;
        if (base..base + n).all(|p| TcpListener::bind(("127.0.0.1", p as u16)).is_ok()) {
            return base as u16;
        }
    }
    panic!("no {n} consecutive free ports in {FIRST}..{}", FIRST + SPAN);
}

/// Poll `f` until it returns Some or the deadline passes.
pub fn wait_for<T>(what: &str, deadline: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A running `batond`, killed when dropped.
pub struct Node {
    pub child: Child,
    pub addr: SocketAddr,
    pub log: Arc<Mutex<String>>,
}

impl Node {
    /// The single node of the protocol tests (tests/server.rs,
    /// tests/server_bad_input.rs, tests/semaphore.rs): `--max-lease 60`,
    /// so that a lease or wait of 61 s is refused `*-too-long` while the
    /// tests' 30 s leases pass, then `args`; waits until it listens.
    pub fn start_protocol(args: &[&str]) -> Node {
        let mut all = vec!["--max-lease", "60"];
        all.extend_from_slice(args);
        Node::start(&all)
    }

    /// Start `batond --bind 127.0.0.1 --port 0 <args>` and wait until it listens.
    pub fn start(args: &[&str]) -> Node {
        let mut all = vec!["--bind", "127.0.0.1", "--port", "0"];
        all.extend_from_slice(args);
        Node::start_raw(&all, None)
    }

    /// Start `batond <args>` as given; `port` is where it will listen if known
    /// (else it is read from the "listening on" log line).
    pub fn start_raw(args: &[&str], port: Option<u16>) -> Node {
        Node::start_raw_with_env(args, port, &[])
    }

    /// [`Node::start_raw`] with more environment variables for the process
    /// (on top of the test's own, which it inherits as always): a node under
    /// `LD_PRELOAD`, say.
    pub fn start_raw_with_env(args: &[&str], port: Option<u16>, env: &[(&str, &str)]) -> Node {
        let level = std::env::var("BATON_TEST_LOG").unwrap_or_else(|_| "info".into());
        Node::spawn(args, port, &level, env)
    }

    /// Start `batond --bind 127.0.0.1 --port 0 <args>` logging at debug
    /// level (for tests of what the log says), and wait until it listens.
    pub fn start_debug(args: &[&str]) -> Node {
        let mut all = vec!["--bind", "127.0.0.1", "--port", "0"];
        all.extend_from_slice(args);
        Node::spawn(&all, None, "debug", &[])
    }

    fn spawn(args: &[&str], port: Option<u16>, log_level: &str, env: &[(&str, &str)]) -> Node {
        let mut command = Command::new(batond_path());
        command
            .args(args)
            .env("RUST_LOG", log_level)
            .envs(env.iter().copied());
        Node::from_command(command, port)
    }

    /// Spawn `command`, a batond (or a shell that execs one: its PID must
    /// be batond's, killed on drop) with its stderr piped, and wait until it
    /// listens; `port` overrides the address it says it listens on.
    pub fn from_command(mut command: Command, port: Option<u16>) -> Node {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn batond");
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                let mut tx = Some(tx);
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    // Into the log first: a test that reads the log once
                    // `from_command` returns finds the listening line there.
                    {
                        let mut log = log.lock().unwrap();
                        log.push_str(&line);
                        log.push('\n');
                    }
                    if let Some(rest) = line.split("listening on ").nth(1)
                        && let Some(tx) = tx.take()
                    {
                        let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                        let _ = tx.send(addr);
                    }
                }
            });
        }
        let addr = match rx.recv_timeout(DEADLINE) {
            Ok(addr) => addr.parse().expect("listening address parses"),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("batond did not start: {}", log.lock().unwrap());
            }
        };
        let addr: SocketAddr = match port {
            Some(port) => SocketAddr::from(([127, 0, 0, 1], port)),
            None => addr,
        };
        Node { child, addr, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send a signal by PID (`kill -<sig> <pid>`).
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{sig} failed");
    }

    /// Wait for the process to exit; its exit code.
    pub fn wait_exit(&mut self, deadline: Duration) -> Option<i32> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            assert!(start.elapsed() < deadline, "batond did not exit in time");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A field of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`...). Linux only.
    pub fn proc_status_kib(&self, field: &str) -> u64 {
        let path = format!("/proc/{}/status", self.pid());
        let status = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
        status
            .lines()
            .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {field} in {path}"))
    }

    /// CPU time (user + system) the node has used so far, in clock ticks
    /// (10 ms). Linux only.
    pub fn cpu_ticks(&self) -> u64 {
        let path = format!("/proc/{}/stat", self.pid());
        let stat = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
        // Fields after the command name (which is in parentheses): utime is
        // the 12th and stime the 13th of those.
        let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        num(11) + num(12)
    }

    /// The most memory the node has had resident so far, in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        self.proc_status_kib("VmHWM")
    }

    /// The memory the node has resident now, in KiB.
    pub fn rss_kib(&self) -> u64 {
        self.proc_status_kib("VmRSS")
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// A new line client connected to this node.
    pub fn client(&self) -> LineClient {
        LineClient::connect(self.addr)
    }

    /// A new connection that the node admits (its `I` is answered), or
    /// None if it refuses it (`E - - too-many-connections`, or nothing).
    pub fn admitted(&self) -> Option<LineClient> {
        let mut client = self.client();
        client.send("I");
        match client.next_event(DEADLINE) {
            Received::Line(line) if line.starts_with("I ") => Some(client),
            Received::Line(line) => {
                assert_eq!(line, "E - - too-many-connections");
                None
            }
            _ => None,
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Only a child not reaped yet still owns its PID: signal nothing else.
        if let Ok(None) = self.child.try_wait() {
            // SIGCONT first, in case a test left it stopped, then SIGKILL.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(self.pid().to_string())
                .stderr(Stdio::null())
                .status();
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// A raw protocol client: send lines, read answer lines, with deadlines.
pub struct LineClient {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl LineClient {
    pub fn connect(addr: SocketAddr) -> LineClient {
        let stream = TcpStream::connect_timeout(&addr, DEADLINE).expect("connect to batond");
        stream.set_nodelay(true).expect("nodelay");
        LineClient {
            stream,
            buf: Vec::new(),
        }
    }

    /// Send raw bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    /// Send one line (the `\n` is added).
    pub fn send(&mut self, line: &str) {
        self.send_raw(format!("{line}\n").as_bytes());
    }

    /// The next answer line (without `\n`), failing the test after `deadline`.
    pub fn recv_within(&mut self, deadline: Duration) -> String {
        self.try_recv(deadline)
            .unwrap_or_else(|| panic!("no answer within {deadline:?}"))
    }

    /// The next answer line within the default deadline.
    pub fn recv(&mut self) -> String {
        self.recv_within(DEADLINE)
    }

    /// The next line, or None if nothing complete arrives within `wait`
    /// (or the connection is closed).
    pub fn try_recv(&mut self, wait: Duration) -> Option<String> {
        match self.next_event(wait) {
            Received::Line(line) => Some(line),
            Received::Nothing | Received::Closed => None,
        }
    }

    /// What happens next within `wait`: a complete line, nothing, or the
    /// server closing the connection (EOF or reset) with no complete line
    /// left to read.
    pub fn next_event(&mut self, wait: Duration) -> Received {
        match self.next_line_bytes(wait) {
            Ok(line) => Received::Line(String::from_utf8_lossy(&line).into_owned()),
            Err(event) => event,
        }
    }

    /// The next answer line as raw bytes (without `\n`), for answers that
    /// are not UTF-8; fails the test after the default deadline.
    pub fn recv_bytes(&mut self) -> Vec<u8> {
        self.next_line_bytes(DEADLINE)
            .unwrap_or_else(|event| panic!("no answer within {DEADLINE:?}: {event:?}"))
    }

    /// The next complete line's bytes, or why there is none within `wait`.
    fn next_line_bytes(&mut self, wait: Duration) -> Result<Vec<u8>, Received> {
        let start = Instant::now();
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=pos).collect();
                line.pop();
                return Ok(line);
            }
            let Some(left) = wait.checked_sub(start.elapsed()) else {
                return Err(Received::Nothing);
            };
            self.stream
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .expect("set timeout");
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(Received::Closed),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Err(Received::Closed),
            }
        }
    }

    /// Assert that no answer arrives and the connection stays open for
    /// `wait`. This is the one place a test spends time on purpose: to show
    /// that something does NOT happen during an interval, so keep it short.
    pub fn assert_silent_for(&mut self, wait: Duration) {
        match self.next_event(wait) {
            Received::Nothing => {}
            Received::Line(line) => panic!("expected no answer within {wait:?}, got {line:?}"),
            Received::Closed => panic!("expected the connection to stay open for {wait:?}"),
        }
    }

    /// The next `n` answer lines, each within the default deadline.
    pub fn recv_n(&mut self, n: usize) -> Vec<String> {
        (0..n).map(|_| self.recv()).collect()
    }

    /// Send several lines in one write (each gets its `\n`).
    pub fn send_lines(&mut self, lines: &[&str]) {
        let mut bytes = Vec::new();
        for line in lines {
            bytes.extend_from_slice(line.as_bytes());
            bytes.push(b'\n');
        }
        self.send_raw(&bytes);
    }

    /// `Q key`, parsed; fails the test if the answer is not a `Q` for `key`.
    pub fn query(&mut self, key: &str) -> Query {
        let answer = self.ask(&format!("Q {key}"));
        Query::parse(&answer, key)
    }

    /// `I`, the whole answer line; fails the test if it is not an `I`.
    pub fn info(&mut self) -> String {
        let answer = self.ask("I");
        assert!(
            answer == "I" || answer.starts_with("I "),
            "expected an I answer, got {answer:?}"
        );
        answer
    }

    /// Poll `I` on this connection until `conns=` is `n` (the node counts
    /// this connection too).
    pub fn wait_for_conns(&mut self, n: usize) {
        let want = n.to_string();
        wait_for(&format!("conns={n}"), DEADLINE, || {
            let info = self.info();
            (info_field(&info, "conns").as_deref() == Some(want.as_str())).then_some(())
        });
    }

    /// `A key lease wait` on a key that is expected to be granted at once;
    /// returns the token.
    pub fn acquire_now(&mut self, key: &str, lease: &str) -> u64 {
        let answer = self.ask(&format!("A {key} {lease} 0"));
        let token = token_of(&answer);
        assert_eq!(answer, format!("A {token} {key}"), "grant names the key");
        token
    }

    /// Close our sending side only (the server sees EOF; we can still read).
    pub fn shutdown_write(&mut self) {
        self.stream
            .shutdown(std::net::Shutdown::Write)
            .expect("shutdown write");
    }

    /// Send a line and return the next answer.
    pub fn ask(&mut self, line: &str) -> String {
        self.send(line);
        self.recv()
    }

    /// Every line left until the server closes the connection, and how it
    /// closed: an orderly end, or a reset (which discards what the client
    /// had not read yet); `Ending::StillOpen` if it is open after `wait`.
    pub fn rest_until_closed(&mut self, wait: Duration) -> (Vec<String>, Ending) {
        let start = Instant::now();
        let ending = loop {
            let Some(left) = wait.checked_sub(start.elapsed()) else {
                break Ending::StillOpen;
            };
            self.stream
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .expect("set timeout");
            let mut chunk = [0u8; 65536];
            match self.stream.read(&mut chunk) {
                Ok(0) => break Ending::Eof,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut
                        || e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Ending::Reset(e.to_string()),
            }
        };
        let text = String::from_utf8_lossy(&self.buf).into_owned();
        self.buf.clear();
        let lines = text.lines().map(str::to_string).collect();
        (lines, ending)
    }

    /// True once the server has closed the connection (EOF or reset) within `wait`.
    pub fn closed_within(&mut self, wait: Duration) -> bool {
        let start = Instant::now();
        loop {
            self.stream
                .set_read_timeout(Some(Duration::from_millis(20)))
                .expect("set timeout");
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => return true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => return true,
            }
            if start.elapsed() > wait {
                return false;
            }
        }
    }
}

/// How a connection ended (see [`LineClient::rest_until_closed`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Ending {
    /// The server closed it in order: everything it sent was read.
    Eof,
    /// Reset: what the client had not read yet was lost.
    Reset(String),
    StillOpen,
}

/// What [`LineClient::next_event`] saw.
#[derive(Debug, PartialEq, Eq)]
pub enum Received {
    Line(String),
    Nothing,
    Closed,
}

/// A parsed `Q <key> <token> <ms_left> <waiting>` answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Query {
    pub token: u64,
    pub ms_left: u64,
    pub waiting: u64,
}

impl Query {
    /// A free key: `Q <key> 0 0 0`.
    pub const FREE: Query = Query {
        token: 0,
        ms_left: 0,
        waiting: 0,
    };

    /// Parse a `Q` answer about `key`, failing the test otherwise.
    pub fn parse(answer: &str, key: &str) -> Query {
        let fields: Vec<&str> = answer.split(' ').collect();
        let number = |i: usize| -> u64 {
            fields[i]
                .parse()
                .unwrap_or_else(|_| panic!("field {i} of {answer:?} is not a number"))
        };
        assert!(
            fields.len() == 5 && fields[0] == "Q" && fields[1] == key,
            "expected `Q {key} <token> <ms_left> <waiting>`, got {answer:?}"
        );
        Query {
            token: number(2),
            ms_left: number(3),
            waiting: number(4),
        }
    }
}

/// A finished process: its exit code (None if killed by a signal) and output.
#[derive(Debug)]
pub struct Finished {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Run `program args` to completion with a deadline; it is killed by PID
/// (and the test fails) if it has not exited by then.
pub fn run_to_exit(program: &str, args: &[&str], deadline: Duration) -> Finished {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {program}: {e}"));
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            let _ = pipe.read_to_end(&mut text);
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("stdout is piped")));
    let stderr = drain(Box::new(child.stderr.take().expect("stderr is piped")));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{program} {args:?} did not exit within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Finished {
        code: status.code(),
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}

/// Parse `A <token> <key>` into the token, failing the test otherwise.
pub fn token_of(answer: &str) -> u64 {
    let mut parts = answer.split(' ');
    assert_eq!(parts.next(), Some("A"), "expected a grant, got {answer:?}");
    parts
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no token in {answer:?}"))
}

/// The value of `name=` in an `I` answer.
pub fn info_field(info: &str, name: &str) -> Option<String> {
    info.split(' ')
        .skip(1)
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")).map(str::to_string))
}

/// `program` on PATH, if it is there (a file with an execute bit): for
/// the tests of a program the machine may lack (etcd, Prometheus, zsh,
/// `ip`), which skip or fail as the CI run asks when it is missing.
pub fn on_path(program: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// A multi-threaded tokio runtime with two workers and timers, for the
/// tests of the client's async calls under the most common runtime.
pub fn tokio_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("a tokio runtime")
}

/// Raise this process's soft limit on open files to its hard limit (children
/// started afterwards inherit it); the soft limit now in force.
pub fn raise_fd_limit() -> libc::rlim_t {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        assert_eq!(
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit),
            0,
            "getrlimit(RLIMIT_NOFILE)"
        );
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

/// The seed of a randomised test: `$BATON_TEST_SEED` if set, else one from
/// the clock. Printed (captured output shows it when the test fails) so
/// that a failure can be replayed.
pub fn test_seed(test: &str) -> u64 {
    let seed = match std::env::var("BATON_TEST_SEED") {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("BATON_TEST_SEED={text:?} is not a u64")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
    };
    println!("{test}: seed {seed} (replay with BATON_TEST_SEED={seed})");
    seed
}

/// Round-trip times collected by a test, summarised as percentiles.
#[derive(Clone, Debug, Default)]
pub struct Latencies(Vec<Duration>);

impl Latencies {
    pub fn new() -> Latencies {
        Latencies(Vec::new())
    }

    pub fn record(&mut self, sample: Duration) {
        self.0.push(sample);
    }

    /// Time `f` and record it; its result.
    pub fn time<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let result = f();
        self.record(start.elapsed());
        result
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The `p`-th percentile (0 to 100, nearest rank); zero when empty.
    pub fn percentile(&self, p: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        let mut sorted = self.0.clone();
        sorted.sort_unstable();
        let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
        sorted[rank.clamp(1, sorted.len()) - 1]
    }

    pub fn max(&self) -> Duration {
        self.0.iter().copied().max().unwrap_or_default()
    }

    /// `n=… p50=… p99=… max=…`, for printing.
    pub fn summary(&self) -> String {
        format!(
            "n={} p50={:?} p99={:?} max={:?}",
            self.len(),
            self.percentile(50.0),
            self.percentile(99.0),
            self.max()
        )
    }
}

/// The smallest executor, for tests that show an async call needs no
/// runtime: poll, park the thread until woken.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let mut future = std::pin::pin!(future);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::park();
    }
}
