//! The metrics thread: a small mio loop that serves `GET /metrics` on the
//! `--metrics` address, in the Prometheus text format, and the contention
//! view (`GET /keys?top=N&by=waiting|age`, `GET /keys/<key>`) in JSON.
//!
//! Owns: the metrics listener and its connections — at most
//! [`MAX_CONNS`] at once (more are closed at accept), each with one
//! deadline for the whole exchange ([`REQUEST_DEADLINE`]: a slow or silent
//! client is cut off), a request head of at most `MAX_REQUEST_BYTES`, and a
//! response written without blocking. One request per connection; the
//! connection closes after the response. The bytes are judged by
//! metrics_http.rs.
//!
//! Figures: the lock owner's come from the snapshot it leaves in the
//! [`MetricsSlot`] when asked (`ToOwner::Scrape`, sent with `try_send`);
//! the I/O loops' counters and the connection count are read here from
//! [`Gauges`]. If no fresh snapshot comes within [`SNAPSHOT_WAIT`] (the
//! owner is busy, or its channel full), the last one is served (503 before
//! the first).
//!
//! The contention view comes the same way: a request for it asks the
//! owner (`ToOwner::Keys`, with `try_send`) for the keys every waiting
//! request wants (the most keys of each order, the keys looked up), at
//! most once per [`SNAPSHOT_INTERVAL`]; the owner builds the view between
//! two rounds and leaves it in the slot (`try_lock` again), and the JSON is
//! rendered here (keys_json.rs). A request is answered from a view asked
//! for after it arrived; if none comes within [`SNAPSHOT_WAIT`], from the
//! last view if that one covers it, else `503`.
//!
//! Runs on its own thread (`baton-metrics`), started only with `--metrics`.
//!
//! Never does: block (on a socket, a channel, or the owner), or touch lock
//! state.

use std::io::{self, Read, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use slab::Slab;

use crate::protocol::Key;
use crate::server::core::contention::{By, KeysAsk, KeysView};
use crate::server::keys_json::{render_error, render_key, render_list, render_not_found};
use crate::server::messages::ToOwner;
use crate::server::metrics_http::{
    MAX_REQUEST_BYTES, Parsed, Route, Status, error_body, json_response, parse_request, render,
    response,
};
use crate::server::shared::Gauges;
use crate::server::stats::MetricsSlot;

/// Metrics connections open at once; past it, new ones are closed at once.
pub const MAX_CONNS: usize = 16;
/// From accept to the last byte of the response.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(3);
/// How long a scrape waits for a fresh snapshot from the lock owner.
pub const SNAPSHOT_WAIT: Duration = Duration::from_millis(500);
/// How often the owner is asked again while a scrape waits.
const SNAPSHOT_RETRY: Duration = Duration::from_millis(50);
/// The lock owner is asked for a snapshot at most once per this interval: a
/// scrape that comes sooner after the last snapshot waits out the rest of
/// it, then gets a snapshot taken after it arrived (never an older one).
/// So scrapes in a tight loop cost the owner at most ten snapshots a second.
pub const SNAPSHOT_INTERVAL: Duration = Duration::from_millis(100);
/// After the response, how long what the client still sends is read and
/// dropped before the close (closing with unread input would reset the
/// connection, and could lose the response on the way).
const LINGER: Duration = Duration::from_millis(500);
/// The most bytes read and dropped while lingering.
const MAX_LINGER_BYTES: usize = 64 * 1024;
/// The longest the loop sleeps without looking at the shutdown flag.
const MAX_SLEEP: Duration = Duration::from_secs(1);

const LISTENER: Token = Token(usize::MAX - 1);
const WAKER: Token = Token(usize::MAX);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Reading the request head.
    Reading,
    /// A good request: waiting for the owner's snapshot.
    Waiting,
    /// Writing the response.
    Writing,
    /// Response sent, write side shut: dropping input until EOF.
    Lingering,
}

/// What a waiting request wants from the lock owner.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Want {
    Metrics,
    Keys { top: usize, by: By },
    Key(Key),
}

impl Want {
    /// The contention view it needs (None: the metrics snapshot).
    fn ask(&self) -> Option<KeysAsk> {
        match self {
            Want::Metrics => None,
            Want::Keys { top, by } => Some(KeysAsk {
                top_waiting: if *by == By::Waiting { *top } else { 0 },
                top_age: if *by == By::Age { *top } else { 0 },
                lookups: Vec::new(),
            }),
            Want::Key(key) => Some(KeysAsk {
                lookups: vec![key.clone()],
                ..KeysAsk::default()
            }),
        }
    }

    /// Its response from `view`, if the view covers it.
    fn answer(&self, view: &KeysView) -> Option<Vec<u8>> {
        if !view.ask.covers(&self.ask()?) {
            return None;
        }
        match self {
            Want::Metrics => None,
            Want::Keys { top, by } => {
                Some(json_response(Status::Ok, &render_list(view, *by, *top)))
            }
            Want::Key(key) => {
                let (_, entry) = view.lookups.iter().find(|(k, _)| k == key)?;
                Some(match entry {
                    Some(entry) => json_response(Status::Ok, &render_key(entry)),
                    None => json_response(Status::NotFound, &render_not_found(key.as_bytes())),
                })
            }
        }
    }
}

struct Conn {
    stream: TcpStream,
    state: State,
    /// What it waits for, and since when (in `State::Waiting`).
    want: Want,
    since: Instant,
    input: Vec<u8>,
    output: Vec<u8>,
    written: usize,
    dropped: usize,
    deadline: Instant,
}

/// The metrics thread. Build with [`MetricsServer::new`], run with
/// [`MetricsServer::run`].
pub struct MetricsServer {
    poll: Poll,
    listener: TcpListener,
    conns: Slab<Conn>,
    slot: Arc<MetricsSlot>,
    to_owner: Sender<ToOwner>,
    gauges: Arc<Gauges>,
    /// An outstanding ask: the slot's serial then, when first and last asked.
    asked: Option<(u64, Instant, Instant)>,
    /// The owner is not asked again before this (`SNAPSHOT_INTERVAL` after
    /// the last snapshot it wrote).
    next_ask: Option<Instant>,
    /// An outstanding ask for a contention view: the slot's view serial
    /// then, when it was made, whether it reached the owner's channel.
    keys_asked: Option<(u64, Instant, bool, KeysAsk)>,
    /// The owner is not asked for a view again before this.
    keys_next_ask: Option<Instant>,
}

impl MetricsServer {
    /// Serve on `std_listener` (bound to the `--metrics` address by the
    /// node's start, which names the flag if it cannot be); the slot the
    /// lock owner publishes into comes with it.
    pub fn new(
        std_listener: std::net::TcpListener,
        to_owner: Sender<ToOwner>,
        gauges: Arc<Gauges>,
    ) -> io::Result<(MetricsServer, Arc<MetricsSlot>)> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let slot = Arc::new(MetricsSlot::new(waker));
        std_listener.set_nonblocking(true)?;
        let mut listener = TcpListener::from_std(std_listener);
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        log::info!(
            "serving metrics on http://{}/metrics",
            listener.local_addr()?
        );
        let server = MetricsServer {
            poll,
            listener,
            conns: Slab::with_capacity(MAX_CONNS),
            slot: slot.clone(),
            to_owner,
            gauges,
            asked: None,
            next_ask: None,
            keys_asked: None,
            keys_next_ask: None,
        };
        Ok((server, slot))
    }

    /// Serve until the node's shutdown flag is set (and the slot's waker
    /// rung, or a second passes).
    pub fn run(mut self) {
        let mut events = Events::with_capacity(64);
        while !self.gauges.shutdown.load(Ordering::Acquire) {
            let timeout = self.poll_timeout();
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                log::error!("metrics: poll failed: {e}; no more metrics");
                break;
            }
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.accept(),
                    WAKER => {}
                    Token(slot) => self.handle(slot),
                }
            }
            self.serve_waiting();
            self.serve_waiting_keys();
            self.expire();
        }
        log::info!("metrics: stopped");
    }

    fn poll_timeout(&self) -> Duration {
        let now = Instant::now();
        let mut until = now + MAX_SLEEP;
        for (_, conn) in &self.conns {
            until = until.min(conn.deadline);
        }
        if let Some((_, first, last)) = self.asked {
            until = until.min(last + SNAPSHOT_RETRY).min(first + SNAPSHOT_WAIT);
        }
        for (_, conn) in &self.conns {
            if conn.state == State::Waiting && conn.want != Want::Metrics {
                until = until.min(conn.since + SNAPSHOT_WAIT);
                match self.keys_asked {
                    Some((_, at, false, _)) => until = until.min(at + SNAPSHOT_RETRY),
                    Some(_) => {}
                    None => until = until.min(self.keys_next_ask.unwrap_or(now)),
                }
            }
        }
        until.saturating_duration_since(now)
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, addr)) => {
                    if self.conns.len() >= MAX_CONNS {
                        log::debug!("metrics: refusing {addr}: {MAX_CONNS} connections open");
                        continue;
                    }
                    let entry = self.conns.vacant_entry();
                    let interest = Interest::READABLE | Interest::WRITABLE;
                    if let Err(e) =
                        self.poll
                            .registry()
                            .register(&mut stream, Token(entry.key()), interest)
                    {
                        log::warn!("metrics: cannot register {addr}: {e}");
                        continue;
                    }
                    entry.insert(Conn {
                        stream,
                        state: State::Reading,
                        want: Want::Metrics,
                        since: Instant::now(),
                        input: Vec::new(),
                        output: Vec::new(),
                        written: 0,
                        dropped: 0,
                        deadline: Instant::now() + REQUEST_DEADLINE,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    log::warn!("metrics: accept failed: {e}");
                    return;
                }
            }
        }
    }

    fn handle(&mut self, slot: usize) {
        let Some(conn) = self.conns.get(slot) else {
            return;
        };
        match conn.state {
            State::Reading => self.read_request(slot),
            State::Waiting => {}
            State::Writing => self.flush(slot),
            State::Lingering => self.linger(slot),
        }
    }

    fn read_request(&mut self, slot: usize) {
        let mut chunk = [0u8; 1024];
        loop {
            let conn = &mut self.conns[slot];
            match conn.stream.read(&mut chunk) {
                Ok(0) => return self.close(slot),
                Ok(n) => {
                    let room = MAX_REQUEST_BYTES - conn.input.len();
                    conn.input.extend_from_slice(&chunk[..n.min(room)]);
                    match parse_request(&conn.input) {
                        Parsed::Incomplete => {}
                        Parsed::Get(Route::Metrics) => return self.wait_for_snapshot(slot),
                        Parsed::Get(Route::Keys { top, by }) => {
                            return self.wait_for_keys(slot, Want::Keys { top, by });
                        }
                        Parsed::Get(Route::Key(key)) => {
                            return self.wait_for_keys(slot, Want::Key(key));
                        }
                        Parsed::Reject(status) => {
                            log::debug!("metrics: refused a request: {status:?}");
                            return self.respond(slot, response(status, &error_body(status)));
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.close(slot),
            }
        }
    }

    fn wait_for_snapshot(&mut self, slot: usize) {
        self.conns[slot].state = State::Waiting;
        self.conns[slot].input = Vec::new();
        if self.asked.is_none() {
            let now = Instant::now();
            match self.next_ask.filter(|&at| now < at) {
                // Too soon: ask when the interval is over (the retry in
                // `serve_waiting` does, SNAPSHOT_RETRY after `last`).
                Some(at) => {
                    let last = at.checked_sub(SNAPSHOT_RETRY).unwrap_or(now);
                    self.asked = Some((self.slot.serial(), now, last));
                }
                None => {
                    self.asked = Some((self.slot.serial(), now, now));
                    self.ask_owner();
                }
            }
        }
    }

    fn wait_for_keys(&mut self, slot: usize, want: Want) {
        let conn = &mut self.conns[slot];
        conn.state = State::Waiting;
        conn.input = Vec::new();
        conn.want = want;
        conn.since = Instant::now();
        self.ask_for_keys();
    }

    /// Ask the lock owner for the view every waiting request wants, unless
    /// an ask is out or the last view is younger than `SNAPSHOT_INTERVAL`.
    fn ask_for_keys(&mut self) {
        let now = Instant::now();
        if self.keys_asked.is_some() || self.keys_next_ask.is_some_and(|at| now < at) {
            return;
        }
        let mut ask: Option<KeysAsk> = None;
        for (_, conn) in &self.conns {
            if conn.state != State::Waiting {
                continue;
            }
            if let Some(wanted) = conn.want.ask() {
                match &mut ask {
                    Some(ask) => ask.merge(&wanted),
                    None => ask = Some(wanted),
                }
            }
        }
        let Some(ask) = ask else {
            return;
        };
        let serial = self.slot.keys_serial();
        let sent = self.to_owner.try_send(ToOwner::Keys(ask.clone())).is_ok();
        self.keys_asked = Some((serial, now, sent, ask));
    }

    /// Answer the requests waiting for a contention view: from a fresh
    /// view, those that arrived before it was asked for; past
    /// `SNAPSHOT_WAIT`, from the last view if it covers them, else `503`.
    /// Then ask again for those left.
    fn serve_waiting_keys(&mut self) {
        let now = Instant::now();
        let mut fresh = None;
        if let Some((serial, at, sent, ask)) = &mut self.keys_asked {
            if self.slot.keys_serial() != *serial {
                fresh = self.slot.read_keys().map(|view| (view, *at));
                self.keys_asked = None;
                self.keys_next_ask = Some(now + SNAPSHOT_INTERVAL);
            } else if !*sent && now >= *at + SNAPSHOT_RETRY {
                *sent = self.to_owner.try_send(ToOwner::Keys(ask.clone())).is_ok();
                *at = now;
            }
        }
        let waiting: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| c.state == State::Waiting && c.want != Want::Metrics)
            .map(|(slot, _)| slot)
            .collect();
        let mut last = None;
        for slot in waiting {
            let conn = &self.conns[slot];
            if let Some((view, asked_at)) = &fresh
                && conn.since <= *asked_at
                && let Some(output) = conn.want.answer(view)
            {
                self.respond(slot, output);
                continue;
            }
            if now < conn.since + SNAPSHOT_WAIT {
                continue;
            }
            let view = last.get_or_insert_with(|| self.slot.read_keys());
            let output = view.as_ref().and_then(|view| conn.want.answer(view));
            if output.is_some() {
                log::warn!("metrics: no fresh view from the lock owner; serving the last");
            }
            let output = output.unwrap_or_else(|| {
                json_response(
                    Status::Unavailable,
                    &render_error("the lock owner gave no view in time"),
                )
            });
            self.respond(slot, output);
        }
        self.ask_for_keys();
    }

    /// Ask the lock owner for a snapshot; if its channel is full, the next
    /// retry asks again.
    fn ask_owner(&self) {
        let _ = self.to_owner.try_send(ToOwner::Scrape);
    }

    /// Answer the waiting scrapes once a fresh snapshot is there, or with
    /// the last one when the wait is over; ask again meanwhile.
    fn serve_waiting(&mut self) {
        let Some((serial, first, last)) = self.asked else {
            return;
        };
        let now = Instant::now();
        let fresh = self.slot.serial() != serial;
        if !fresh && now < first + SNAPSHOT_WAIT {
            if now >= last + SNAPSHOT_RETRY {
                self.asked = Some((serial, first, now));
                self.ask_owner();
            }
            return;
        }
        self.asked = None;
        if fresh {
            self.next_ask = Some(now + SNAPSHOT_INTERVAL);
        }
        let body = match self.slot.read() {
            Some(mut snap) => {
                self.gauges.io_counters.add_auth_to(&mut snap);
                self.gauges.io_counters.add_watch_lines_to(&mut snap);
                snap.watches = self.gauges.watches.load(Ordering::Relaxed) as u64;
                if !fresh {
                    log::warn!("metrics: no fresh figures from the lock owner; serving the last");
                }
                let io = self.gauges.io_counters.refusals();
                let conns = self.gauges.conns.load(Ordering::Relaxed) as u64;
                response(Status::Ok, &render(&snap, &io, conns))
            }
            None => response(Status::Unavailable, &error_body(Status::Unavailable)),
        };
        let waiting: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| c.state == State::Waiting && c.want == Want::Metrics)
            .map(|(slot, _)| slot)
            .collect();
        for slot in waiting {
            self.respond(slot, body.clone());
        }
    }

    fn respond(&mut self, slot: usize, output: Vec<u8>) {
        let conn = &mut self.conns[slot];
        conn.state = State::Writing;
        conn.output = output;
        conn.written = 0;
        self.flush(slot);
    }

    fn flush(&mut self, slot: usize) {
        let conn = &mut self.conns[slot];
        while conn.written < conn.output.len() {
            match conn.stream.write(&conn.output[conn.written..]) {
                Ok(0) => return self.close(slot),
                Ok(n) => conn.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.close(slot),
            }
        }
        conn.state = State::Lingering;
        conn.output = Vec::new();
        conn.deadline = conn.deadline.min(Instant::now() + LINGER);
        let _ = conn.stream.shutdown(std::net::Shutdown::Write);
        self.linger(slot);
    }

    fn linger(&mut self, slot: usize) {
        let mut chunk = [0u8; 1024];
        loop {
            let conn = &mut self.conns[slot];
            match conn.stream.read(&mut chunk) {
                Ok(0) => return self.close(slot),
                Ok(n) => {
                    conn.dropped += n;
                    if conn.dropped > MAX_LINGER_BYTES {
                        return self.close(slot);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.close(slot),
            }
        }
    }

    /// Close every connection past its deadline.
    fn expire(&mut self) {
        let now = Instant::now();
        let late: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline <= now)
            .map(|(slot, _)| slot)
            .collect();
        for slot in late {
            if self.conns[slot].state != State::Lingering {
                log::debug!("metrics: a connection ran past its deadline; closing it");
            }
            self.close(slot);
        }
    }

    fn close(&mut self, slot: usize) {
        if let Some(mut conn) = self.conns.try_remove(slot) {
            let _ = self.poll.registry().deregister(&mut conn.stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};

    /// `GET path` on a fresh connection; the status line and the body.
    fn get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
        let mut stream = std::net::TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(REQUEST_DEADLINE * 2))
            .expect("timeout");
        write!(stream, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").expect("send");
        let mut reader = BufReader::new(stream);
        let mut status = String::new();
        reader.read_line(&mut status).expect("status line");
        let mut rest = String::new();
        reader.read_to_string(&mut rest).expect("the rest");
        let body = rest.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        (status.trim_end().to_string(), body.to_string())
    }

    #[test]
    fn an_owner_that_never_answers_gets_503_for_keys_and_metrics_and_the_thread_stops() {
        // The lock owner's channel is there but nobody serves it: the
        // owner is stuck (or too slow) from the start, so there is no view
        // or snapshot to fall back on.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (to_owner, stuck_owner) = crossbeam_channel::bounded(4);
        let gauges = Arc::new(Gauges::new());
        let (server, slot) = MetricsServer::new(listener, to_owner, gauges.clone()).expect("new");
        let thread = std::thread::spawn(move || server.run());

        let (status, body) = get(addr, "/keys?top=5");
        assert_eq!(status, "HTTP/1.1 503 Service Unavailable", "{body}");
        assert!(
            body.contains("the lock owner gave no view in time"),
            "{body}"
        );
        let (status, _) = get(addr, "/keys/some-key");
        assert_eq!(status, "HTTP/1.1 503 Service Unavailable");
        let (status, _) = get(addr, "/metrics");
        assert_eq!(status, "HTTP/1.1 503 Service Unavailable");
        // It asked the owner, without blocking on it.
        let asked: Vec<ToOwner> = stuck_owner.try_iter().collect();
        assert!(
            asked.iter().any(|m| matches!(m, ToOwner::Keys(_))),
            "{asked:?}"
        );

        gauges.shutdown.store(true, Ordering::Release);
        slot.wake();
        thread.join().expect("the metrics thread stops");
    }
}
