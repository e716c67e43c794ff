//! The plain load generator: one thread, C non-blocking mio connections,
//! D acquire + release pairs in flight on each, random keys; nothing shared
//! with the project's harness (benches/lockbench) but the wire format,
//! written out here by hand.
//!
//! Owns: one run against one server: connect, warm up, measure (the
//! server's CPU time from `/proc/PID/stat` and this thread's own, read by
//! this thread at the window's two edges, so that the pairs counted and the
//! CPU read cover the same stretch), drain, and the counts of what the
//! client did (pairs, its read and write calls).
//!
//! How it paces, as a client written without the harness in mind would:
//! each connection has D slots; a slot sends `A <key> 30 1`, and on the
//! grant `R <key> <token>`, and on the release a new acquire of a new
//! random key. Whenever a connection is readable it is read until the
//! socket is empty, every whole answer is acted on, and what that made is
//! written at once, in one `write` for the connection (`Spec::after_poll`
//! instead writes every connection's once all of a poll's events are
//! read, as the project's harness does: the other pacing, to compare).
//! The slot is named by the key's last two digits, so an answer finds its
//! slot without a search.
//!
//! Against an echo (`Spec::echo`) an echoed acquire stands for the grant
//! and an echoed release for the release; the release carries a 19-digit
//! token, as long as a node's, so that both send the same bytes.
//!
//! Bounds: a run ends at warmup + measure, then drains (no new acquires,
//! grants released) for at most `DRAIN`; an answer longer than
//! `MAX_LINE`, an error answer, or a closed connection ends the run with
//! an error.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use crate::procstat;

const CHUNK: usize = 64 * 1024;
const MAX_LINE: usize = 1024;
const DRAIN: Duration = Duration::from_secs(2);
/// The longest poll sleeps, so a window's edges are seen on time.
const TICK: Duration = Duration::from_millis(1);
/// The token an echo's release carries (the echo issues none).
const ECHO_TOKEN: &[u8] = b"1000000000000000001";
/// Lease and wait of every acquire.
const LEASE_WAIT: &[u8] = b" 30 1\n";

/// One run.
#[derive(Clone, Debug)]
pub struct Spec {
    pub addr: SocketAddr,
    /// The server answers every line with itself.
    pub echo: bool,
    /// The server process whose CPU time is read.
    pub pid: u32,
    pub conns: usize,
    /// Pairs in flight per connection, 1..=100.
    pub depth: usize,
    pub warmup: Duration,
    pub measure: Duration,
    pub seed: u64,
    /// Write what a poll's answers made only once every connection it
    /// reported has been read (as the project's harness does), instead of
    /// each connection's right after reading it: a pacing to compare.
    pub after_poll: bool,
}

/// What a run measured over its window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Measured {
    /// The window's length.
    pub secs: f64,
    /// Pairs whose release was answered in the window.
    pub pairs: u64,
    /// The server's CPU (user + system, every thread), seconds.
    pub server_cpu: f64,
    /// This thread's CPU, seconds.
    pub client_cpu: f64,
    /// `read` calls that returned bytes, in the window.
    pub reads: u64,
    /// `read` calls that found the socket empty, in the window.
    pub empty_reads: u64,
    /// `write` calls, in the window.
    pub writes: u64,
    /// `epoll_wait` calls (mio polls), in the window.
    pub polls: u64,
    /// Pairs over the whole run, warm-up and drain included (to divide
    /// what a profiler attached for the whole run counted).
    pub pairs_in_all: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Acquiring,
    Releasing,
    Done,
}

struct Slot {
    /// `p` + 10 random digits + the slot's 2 digits.
    key: [u8; 13],
    token: [u8; 20],
    token_len: usize,
    state: State,
}

struct Conn {
    stream: TcpStream,
    out: Vec<u8>,
    /// An answer not yet whole.
    partial: Vec<u8>,
    slots: Vec<Slot>,
}

#[derive(Clone, Copy)]
struct Counts {
    pairs: u64,
    reads: u64,
    empty_reads: u64,
    writes: u64,
    polls: u64,
}

/// Run `spec` and return what it measured.
pub fn run(spec: &Spec) -> Result<Measured, String> {
    if !(1..=100).contains(&spec.depth) {
        return Err(format!("depth {} is not 1..=100", spec.depth));
    }
    let mut poll = Poll::new().map_err(|e| format!("poll: {e}"))?;
    let mut rng = spec.seed | 1;
    let mut conns = Vec::with_capacity(spec.conns);
    for i in 0..spec.conns {
        let std = std::net::TcpStream::connect_timeout(&spec.addr, Duration::from_secs(5))
            .map_err(|e| format!("connect {}: {e}", spec.addr))?;
        std.set_nodelay(true).map_err(|e| e.to_string())?;
        std.set_nonblocking(true).map_err(|e| e.to_string())?;
        let mut stream = TcpStream::from_std(std);
        poll.registry()
            .register(
                &mut stream,
                Token(i),
                Interest::READABLE | Interest::WRITABLE,
            )
            .map_err(|e| format!("register: {e}"))?;
        let slots = (0..spec.depth)
            .map(|d| {
                Slot {
                    key: *b"p0000000000dd",
                    token: [0; 20],
                    token_len: 0,
                    state: State::Done,
                }
                .with_index(d)
            })
            .collect();
        conns.push(Conn {
            stream,
            out: Vec::with_capacity(4096),
            partial: Vec::new(),
            slots,
        });
    }
    let mut counts = Counts {
        pairs: 0,
        reads: 0,
        empty_reads: 0,
        writes: 0,
        polls: 0,
    };
    for conn in &mut conns {
        for d in 0..spec.depth {
            conn.slots[d].state = State::Acquiring;
            push_acquire(&mut conn.out, &mut conn.slots[d], &mut rng);
        }
        write_out(conn, &mut counts)?;
    }
    let start = Instant::now();
    let window_start = start + spec.warmup;
    let window_end = window_start + spec.measure;
    let mut before: Option<(Counts, u64, u64, Instant)> = None;
    let mut result = None;
    let mut draining = false;
    let mut busy = spec.conns * spec.depth;
    let mut events = Events::with_capacity(1024);
    let mut buf = vec![0u8; CHUNK];
    loop {
        let now = Instant::now();
        if before.is_none() && now >= window_start {
            before = Some((counts, server_ticks(spec.pid)?, self_ticks()?, now));
        }
        if result.is_none() && now >= window_end {
            let (b, server0, self0, t0) = before.take().ok_or("no window start")?;
            let tick = procstat::tick_secs();
            let server1 = server_ticks(spec.pid)?;
            let self1 = self_ticks()?;
            result = Some(Measured {
                secs: now.duration_since(t0).as_secs_f64(),
                pairs: counts.pairs - b.pairs,
                server_cpu: server1.saturating_sub(server0) as f64 * tick,
                client_cpu: self1.saturating_sub(self0) as f64 * tick,
                reads: counts.reads - b.reads,
                empty_reads: counts.empty_reads - b.empty_reads,
                writes: counts.writes - b.writes,
                polls: counts.polls - b.polls,
                pairs_in_all: 0,
            });
            draining = true;
        }
        if draining && (busy == 0 || now >= window_end + DRAIN) {
            break;
        }
        match poll.poll(&mut events, Some(TICK)) {
            Ok(()) => counts.polls += 1,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("poll: {e}")),
        }
        for event in events.iter() {
            let conn = &mut conns[event.token().0];
            if event.is_readable() || event.is_read_closed() || event.is_error() {
                read_answers(
                    conn,
                    &mut buf,
                    spec.echo,
                    draining,
                    &mut rng,
                    &mut busy,
                    &mut counts,
                )?;
            }
            if !spec.after_poll {
                write_out(conn, &mut counts)?;
            }
        }
        if spec.after_poll {
            for event in events.iter() {
                write_out(&mut conns[event.token().0], &mut counts)?;
            }
        }
    }
    let mut result = result.ok_or("the run ended before its window did")?;
    result.pairs_in_all = counts.pairs;
    Ok(result)
}

fn server_ticks(pid: u32) -> Result<u64, String> {
    procstat::process_ticks(pid).ok_or_else(|| format!("cannot read /proc/{pid}/stat"))
}

fn self_ticks() -> Result<u64, String> {
    procstat::this_thread_ticks().ok_or_else(|| "cannot read /proc/thread-self/stat".to_string())
}

impl Slot {
    fn with_index(mut self, d: usize) -> Slot {
        self.key[11] = b'0' + (d / 10) as u8;
        self.key[12] = b'0' + (d % 10) as u8;
        self
    }
}

fn next_random(rng: &mut u64) -> u64 {
    // xorshift64*
    *rng ^= *rng >> 12;
    *rng ^= *rng << 25;
    *rng ^= *rng >> 27;
    rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// A new random key for the slot, and its acquire.
fn push_acquire(out: &mut Vec<u8>, slot: &mut Slot, rng: &mut u64) {
    let mut r = next_random(rng) % 10_000_000_000;
    for i in (1..11).rev() {
        slot.key[i] = b'0' + (r % 10) as u8;
        r /= 10;
    }
    out.extend_from_slice(b"A ");
    out.extend_from_slice(&slot.key);
    out.extend_from_slice(LEASE_WAIT);
}

fn push_release(out: &mut Vec<u8>, slot: &Slot) {
    out.extend_from_slice(b"R ");
    out.extend_from_slice(&slot.key);
    out.push(b' ');
    out.extend_from_slice(&slot.token[..slot.token_len]);
    out.push(b'\n');
}

/// Read until the socket is empty and act on every whole answer.
fn read_answers(
    conn: &mut Conn,
    buf: &mut [u8],
    echo: bool,
    draining: bool,
    rng: &mut u64,
    busy: &mut usize,
    counts: &mut Counts,
) -> Result<(), String> {
    loop {
        let n = match conn.stream.read(buf) {
            Ok(0) => return Err("the server closed a connection".to_string()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                counts.empty_reads += 1;
                return Ok(());
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("read: {e}")),
        };
        counts.reads += 1;
        let mut partial = std::mem::take(&mut conn.partial);
        if partial.is_empty() {
            let used = answers(conn, &buf[..n], echo, draining, rng, busy, counts)?;
            partial.extend_from_slice(&buf[used..n]);
        } else {
            partial.extend_from_slice(&buf[..n]);
            let used = answers(conn, &partial, echo, draining, rng, busy, counts)?;
            partial.drain(..used);
        }
        if partial.len() > MAX_LINE {
            return Err("an answer longer than a line may be".to_string());
        }
        conn.partial = partial;
    }
}

/// Act on every whole line of `input`; how many bytes they took.
fn answers(
    conn: &mut Conn,
    input: &[u8],
    echo: bool,
    draining: bool,
    rng: &mut u64,
    busy: &mut usize,
    counts: &mut Counts,
) -> Result<usize, String> {
    let mut used = 0;
    while let Some(end) = input[used..].iter().position(|&b| b == b'\n') {
        let line = &input[used..used + end];
        used += end + 1;
        answer(conn, line, echo, draining, rng, busy, counts)?;
    }
    Ok(used)
}

fn answer(
    conn: &mut Conn,
    line: &[u8],
    echo: bool,
    draining: bool,
    rng: &mut u64,
    busy: &mut usize,
    counts: &mut Counts,
) -> Result<(), String> {
    let bad = || format!("unexpected answer {:?}", String::from_utf8_lossy(line));
    let mut fields = line.split(|&b| b == b' ');
    let op = fields.next().ok_or_else(bad)?;
    // Node: `A <token> <key>`, `R <key>`. Echo: `A <key> 30 1`,
    // `R <key> <token>`.
    let (granted, token, key) = match (op, echo) {
        (b"A", false) => {
            let token = fields.next().ok_or_else(bad)?;
            (true, token, fields.next().ok_or_else(bad)?)
        }
        (b"A", true) => (true, ECHO_TOKEN, fields.next().ok_or_else(bad)?),
        (b"R", _) => (false, &b""[..], fields.next().ok_or_else(bad)?),
        _ => return Err(bad()),
    };
    let [.., tens, ones] = key else {
        return Err(bad());
    };
    let d = usize::from(tens.wrapping_sub(b'0')) * 10 + usize::from(ones.wrapping_sub(b'0'));
    let slot = conn.slots.get_mut(d).ok_or_else(bad)?;
    if slot.key[..] != *key || token.len() > slot.token.len() {
        return Err(bad());
    }
    match (granted, slot.state) {
        (true, State::Acquiring) => {
            slot.token[..token.len()].copy_from_slice(token);
            slot.token_len = token.len();
            slot.state = State::Releasing;
            push_release(&mut conn.out, slot);
        }
        (false, State::Releasing) => {
            counts.pairs += 1;
            if draining {
                slot.state = State::Done;
                *busy -= 1;
            } else {
                slot.state = State::Acquiring;
                push_acquire(&mut conn.out, slot, rng);
            }
        }
        _ => return Err(bad()),
    }
    Ok(())
}

/// Write what the connection has to send, in one call when the socket
/// takes it all.
fn write_out(conn: &mut Conn, counts: &mut Counts) -> Result<(), String> {
    let mut done = 0;
    while done < conn.out.len() {
        match conn.stream.write(&conn.out[done..]) {
            Ok(0) => return Err("write: connection closed".to_string()),
            Ok(n) => {
                counts.writes += 1;
                done += n;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("write: {e}")),
        }
    }
    conn.out.drain(..done);
    Ok(())
}
