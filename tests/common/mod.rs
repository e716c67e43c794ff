//! Test support shared by the integration tests: real `batond` processes on
//! loopback ports, a line-oriented TCP client, and deadline-bounded polling;
//! `faults` adds a proxy that cuts, stalls or refuses connections and a fake
//! standby that answers `M`, for the client tests.
//!
//! Every process started here is killed (by its PID) when its handle drops,
//! so a failing test leaves nothing running. Nothing here sleeps to
//! synchronise: waits are polls with a deadline.

#![allow(dead_code)]

pub mod faults;

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

/// A free loopback port (bound and released; good enough for tests).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
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
    /// Start `batond --bind 127.0.0.1 --port 0 <args>` and wait until it listens.
    pub fn start(args: &[&str]) -> Node {
        let mut all = vec!["--bind", "127.0.0.1", "--port", "0"];
        all.extend_from_slice(args);
        Node::start_raw(&all, None)
    }

    /// Start `batond <args>` as given; `port` is where it will listen if known
    /// (else it is read from the "listening on" log line).
    pub fn start_raw(args: &[&str], port: Option<u16>) -> Node {
        let mut child = Command::new(batond_path())
            .args(args)
            .env(
                "RUST_LOG",
                std::env::var("BATON_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
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
                    if let Some(rest) = line.split("listening on ").nth(1) {
                        if let Some(tx) = tx.take() {
                            let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                            let _ = tx.send(addr);
                        }
                    }
                    let mut log = log.lock().unwrap();
                    log.push_str(&line);
                    log.push('\n');
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

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// A new line client connected to this node.
    pub fn client(&self) -> LineClient {
        LineClient::connect(self.addr)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // SIGCONT first, in case a test left it stopped, then SIGKILL.
        let _ = Command::new("kill")
            .arg("-CONT")
            .arg(self.pid().to_string())
            .status();
        let _ = self.child.kill();
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
        let start = Instant::now();
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return Some(String::from_utf8_lossy(&line[..line.len() - 1]).into_owned());
            }
            let left = wait.checked_sub(start.elapsed())?;
            self.stream
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .expect("set timeout");
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => return None,
            }
        }
    }

    /// Send a line and return the next answer.
    pub fn ask(&mut self, line: &str) -> String {
        self.send(line);
        self.recv()
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
