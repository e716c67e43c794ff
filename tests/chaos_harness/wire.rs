//! A minimal blocking line client for the semaphore key of a chaos run:
//! `A <key> <lease> <wait> <limit>` (answered `A <token> <key> <slot>`) and
//! `R <key> <token>`, over the protocol's own request writer and answer
//! parser, following `M` redirects and moving to the next node when a
//! connection fails, the way the official client does.
//!
//! Owns: one connection at a time (to the node last found active), used by
//! one worker thread; one request in flight on it, so the next answer line
//! is the answer to it. A connection whose answer did not come in time is
//! dropped, so a late answer can never be taken for the next request's.
//! It stands in for the official client's acquire with a limit until that
//! client has one.
//!
//! Never does: wait past the caller's deadline (every connect and read is
//! bounded by it), or retry an acquire whose answer did not come (it may
//! have been granted; its lease is the safety net).

use std::io::{ErrorKind, Read, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use baton::protocol::{Answer, Key, LineError, Parsed, Reason, Request, parse_answer};

/// Redirects followed in one call at most (as the official client).
const MAX_REDIRECTS: u32 = 8;
/// The pause before asking again while no node is active (as the official
/// client).
const NO_ACTIVE_RETRY: Duration = Duration::from_millis(100);

/// Why a call gave up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WireError {
    /// No node accepted a connection (each was tried once).
    NoConnection(String),
    /// The node did not answer in time; the request may have been served.
    NoAnswer(String),
    /// No active node was found before the deadline.
    NoActive(String),
    /// `E <op> <key> <reason>`.
    Refused(Reason),
    /// An answer that does not fit the request.
    Protocol(String),
}

impl WireError {
    /// A short name, as the report counts errors.
    pub fn kind(&self) -> String {
        match self {
            WireError::NoConnection(_) => "no-connection".into(),
            WireError::NoAnswer(_) => "no-answer".into(),
            WireError::NoActive(_) => "no-active".into(),
            WireError::Refused(r) => format!("refused({})", r.as_str()),
            WireError::Protocol(_) => "protocol".into(),
        }
    }
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::NoConnection(w)
            | WireError::NoAnswer(w)
            | WireError::NoActive(w)
            | WireError::Protocol(w) => write!(f, "{}: {w}", self.kind()),
            WireError::Refused(_) => write!(f, "{}", self.kind()),
        }
    }
}

/// What an acquire with a limit came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquired {
    Granted {
        token: u64,
        slot: u32,
    },
    /// `T <key>`: the wait ran out.
    Timeout,
}

/// What a release came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    Released,
    /// `N <key>`: the token did not hold the key (any more).
    NotHeld,
}

struct Conn {
    node: usize,
    stream: TcpStream,
    buf: Vec<u8>,
}

/// One worker's line client for a cluster.
pub struct WireClient {
    servers: Vec<String>,
    preferred: usize,
    conn: Option<Conn>,
    connect_timeout: Duration,
    request_timeout: Duration,
}

/// How one attempt went.
enum Attempt {
    Answer(Answer),
    /// The connection failed (connect, write, or closed before the answer).
    Lost(String),
    /// No answer within the budget.
    Overdue(String),
}

impl WireClient {
    pub fn new(
        servers: Vec<String>,
        connect_timeout: Duration,
        request_timeout: Duration,
    ) -> WireClient {
        WireClient {
            servers,
            preferred: 0,
            conn: None,
            connect_timeout,
            request_timeout,
        }
    }

    /// `A key lease wait limit`: granted with a token and a slot, or the
    /// wait ran out; within wait + request timeout (plus one connect).
    pub fn acquire(
        &mut self,
        key: &Key,
        lease: Duration,
        wait: Duration,
        limit: u32,
    ) -> Result<Acquired, WireError> {
        let wait_end = Instant::now() + wait;
        let due = wait_end + self.request_timeout;
        let lease_ms = millis_ceil(lease);
        let make = || Request::Acquire {
            key: key.clone(),
            lease_ms,
            // What is left of the wait; at least 1 ms (0 would wait forever).
            wait_ms: millis_ceil(wait_end.saturating_duration_since(Instant::now())).max(1),
            limit: Some(limit),
            value: None,
        };
        let budget = wait + self.request_timeout;
        match self.call(make, budget, due, false)? {
            Answer::Granted {
                token,
                slot: Some(slot),
                ..
            } => Ok(Acquired::Granted { token, slot }),
            Answer::Timeout { .. } => Ok(Acquired::Timeout),
            other => Err(WireError::Protocol(format!(
                "unexpected answer to A: {other:?}"
            ))),
        }
    }

    /// `R key token`, sent again while its answer does not come, for up to
    /// `window`.
    pub fn release(
        &mut self,
        key: &Key,
        token: u64,
        window: Duration,
    ) -> Result<Released, WireError> {
        let due = Instant::now() + window;
        let make = || Request::Release {
            key: key.clone(),
            token,
        };
        match self.call(make, self.request_timeout, due, true)? {
            Answer::Released { .. } => Ok(Released::Released),
            Answer::NotHeld { .. } => Ok(Released::NotHeld),
            other => Err(WireError::Protocol(format!(
                "unexpected answer to R: {other:?}"
            ))),
        }
    }

    /// Send the request `make` builds until a final answer, following `M`;
    /// `resend`: also after a connection was lost or an answer was late
    /// (safe for a release: `N` then means an earlier one got through).
    fn call(
        &mut self,
        make: impl Fn() -> Request,
        budget: Duration,
        due: Instant,
        resend: bool,
    ) -> Result<Answer, WireError> {
        let mut failures = 0;
        let mut hops = 0;
        loop {
            let answer = match self.attempt(&make(), budget, due) {
                Attempt::Answer(answer) => answer,
                Attempt::Lost(why) | Attempt::Overdue(why) if resend => {
                    self.next_node();
                    if Instant::now() + NO_ACTIVE_RETRY >= due {
                        return Err(WireError::NoAnswer(why));
                    }
                    continue;
                }
                Attempt::Lost(why) => {
                    failures += 1;
                    self.next_node();
                    if failures >= self.servers.len() || Instant::now() >= due {
                        return Err(WireError::NoConnection(why));
                    }
                    continue;
                }
                Attempt::Overdue(why) => return Err(WireError::NoAnswer(why)),
            };
            match answer {
                Answer::Moved {
                    active: Some(addr), ..
                } if self.node_for(&addr).is_some() => {
                    hops += 1;
                    if hops > MAX_REDIRECTS {
                        return Err(WireError::NoActive(format!(
                            "redirected {MAX_REDIRECTS} times (last: {addr})"
                        )));
                    }
                    let node = self.node_for(&addr).unwrap_or(self.preferred);
                    if node != self.preferred {
                        self.preferred = node;
                        self.conn = None;
                    }
                }
                Answer::Moved { .. } => {
                    if Instant::now() + NO_ACTIVE_RETRY >= due {
                        return Err(WireError::NoActive("no active node known".into()));
                    }
                    std::thread::sleep(NO_ACTIVE_RETRY);
                }
                Answer::Error {
                    reason: Reason::ShuttingDown,
                    ..
                } => {
                    failures += 1;
                    self.next_node();
                    if failures >= self.servers.len() || Instant::now() >= due {
                        return Err(WireError::NoConnection(
                            "every node is shutting down".into(),
                        ));
                    }
                }
                Answer::Error { reason, .. } => return Err(WireError::Refused(reason)),
                answer => return Ok(answer),
            }
        }
    }

    fn node_for(&self, addr: &str) -> Option<usize> {
        self.servers.iter().position(|s| s == addr)
    }

    fn next_node(&mut self) {
        self.conn = None;
        self.preferred = (self.preferred + 1) % self.servers.len();
    }

    /// One request on the preferred node's connection (made if needed).
    fn attempt(&mut self, request: &Request, budget: Duration, due: Instant) -> Attempt {
        let Some(left) = due
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
        else {
            return Attempt::Overdue("the deadline passed".into());
        };
        if self.conn.is_none() {
            let addr = &self.servers[self.preferred];
            let Ok(sock) = addr.parse::<SocketAddr>() else {
                return Attempt::Lost(format!("{addr} is not an address"));
            };
            match TcpStream::connect_timeout(&sock, self.connect_timeout.min(left)) {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    self.conn = Some(Conn {
                        node: self.preferred,
                        stream,
                        buf: Vec::new(),
                    });
                }
                Err(e) => return Attempt::Lost(format!("connect to {addr}: {e}")),
            }
        }
        let Some(conn) = self.conn.as_mut() else {
            return Attempt::Lost("no connection".into());
        };
        let addr = self.servers[conn.node].clone();
        let mut line = Vec::new();
        request.write_to(&mut line);
        if let Err(e) = conn.stream.write_all(&line) {
            self.conn = None;
            return Attempt::Lost(format!("write to {addr}: {e}"));
        }
        let answer_due = Instant::now() + budget.min(left);
        let outcome = read_answer(conn, answer_due, &addr);
        if !matches!(outcome, Attempt::Answer(_)) {
            self.conn = None;
        }
        outcome
    }
}

/// Read one answer line from `conn` by `due`.
fn read_answer(conn: &mut Conn, due: Instant, addr: &str) -> Attempt {
    let mut chunk = [0u8; 512];
    loop {
        match parse_answer(&conn.buf) {
            Parsed::Line { used, result } => {
                conn.buf.drain(..used);
                match result {
                    Ok(answer) => return Attempt::Answer(answer),
                    Err(LineError::Blank) => continue,
                    Err(e) => return Attempt::Lost(format!("{addr} sent a bad line: {e:?}")),
                }
            }
            Parsed::Incomplete => {}
        }
        let Some(left) = due
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
        else {
            return Attempt::Overdue(format!("{addr} did not answer in time"));
        };
        if let Err(e) = conn.stream.set_read_timeout(Some(left)) {
            return Attempt::Lost(format!("{addr}: {e}"));
        }
        match conn.stream.read(&mut chunk) {
            Ok(0) => return Attempt::Lost(format!("{addr} closed the connection")),
            Ok(n) => conn.buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Attempt::Lost(format!("read from {addr}: {e}")),
        }
    }
}

/// Whole milliseconds, rounded up.
fn millis_ceil(d: Duration) -> u64 {
    let whole = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    u64::try_from(whole).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::net::TcpListener;

    /// A one-connection server on loopback that answers each line it reads
    /// with the next of `answers`; it returns the lines it read.
    fn serve(answers: Vec<String>) -> (String, std::thread::JoinHandle<Vec<String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let handle = std::thread::spawn(move || {
            let (stream, _) = listener.accept().expect("accept");
            stream
                .set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut writer = stream;
            let mut seen = Vec::new();
            for answer in answers {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                seen.push(line.trim_end().to_string());
                writer.write_all(answer.as_bytes()).expect("write");
            }
            seen
        });
        (addr, handle)
    }

    #[test]
    fn an_acquire_with_a_limit_follows_a_redirect_and_reads_the_slot() {
        let (second, second_seen) = serve(vec!["A 42 sem 2\n".into(), "N sem\n".into()]);
        let (first, first_seen) = serve(vec![format!("M {second} A sem\n")]);
        let mut client = WireClient::new(
            vec![first, second],
            Duration::from_secs(1),
            Duration::from_secs(1),
        );
        let key = Key::new(b"sem").expect("key");
        let got = client.acquire(&key, Duration::from_secs(6), Duration::from_millis(500), 3);
        assert_eq!(got, Ok(Acquired::Granted { token: 42, slot: 2 }));
        let released = client.release(&key, 42, Duration::from_secs(1));
        assert_eq!(released, Ok(Released::NotHeld));
        // The wait sent is what is left of 0.5 s (the first one, all of it
        // unless a whole millisecond passed first).
        let sent_acquire = |line: &str| {
            let fields: Vec<&str> = line.split(' ').collect();
            let wait: f64 = fields.get(3).and_then(|w| w.parse().ok()).unwrap_or(-1.0);
            fields.len() == 5
                && fields[..3] == ["A", "sem", "6"]
                && fields[4] == "3"
                && (0.001..=0.5).contains(&wait)
        };
        let first = first_seen.join().expect("first");
        assert!(first.len() == 1 && sent_acquire(&first[0]), "{first:?}");
        let second = second_seen.join().expect("second");
        assert_eq!(second.len(), 2, "{second:?}");
        assert!(sent_acquire(&second[0]), "{second:?}");
        assert_eq!(second[1], "R sem 42");
    }

    #[test]
    fn a_node_that_does_not_answer_an_acquire_in_time_is_no_answer_not_a_retry() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let mut client = WireClient::new(
            vec![addr],
            Duration::from_secs(1),
            Duration::from_millis(100),
        );
        let key = Key::new(b"sem").expect("key");
        let got = client.acquire(&key, Duration::from_secs(6), Duration::from_millis(100), 3);
        assert!(matches!(got, Err(WireError::NoAnswer(_))), "{got:?}");
        drop(listener);
    }
}
