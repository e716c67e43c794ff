//! One persistent connection to one server, kept up in the background.
//!
//! Owns: the socket of one registered connection, its state (connecting, up,
//! down), the requests sent on it that wait for their answer (a
//! [`Pending`] table behind one mutex), and two threads:
//!
//! - the **manager** thread (`baton-conn <addr>`), for the client's whole
//!   life: connects (bounded by the connect timeout), does the TLS
//!   handshake when the client uses TLS, authenticates when the client has a
//!   secret (`U <secret>` inside TLS, then `U ok` awaited within the same
//!   timeout, before the connection counts as up), reads and dispatches
//!   answers while the connection is up, and after a failed attempt or a drop
//!   waits [`RECONNECT_INTERVAL`] before the next attempt;
//! - a **writer** thread (`baton-write <addr>`) per connection lifetime, fed
//!   by a channel, so that a caller never blocks on a socket write.
//!
//! Callers ([`Conn::send`]) register the request in the pending table and
//! queue its line for the writer under the same lock, so answers are matched
//! in the order the lines go out. An answer goes to its caller through a
//! one-shot completion (`oneshot.rs`), which wakes a blocked thread or an
//! async task alike; when the connection drops, every waiting request's
//! completion is closed and its caller moves on.
//!
//! Watches ([`Conn::watch`]): a `W <key>` is not a pending request but a
//! subscription, kept per key until it is given up ([`Conn::unwatch`],
//! which sends `X <key>` once the key's last watch on this connection
//! goes). Every `W` line for the key goes to the mailboxes (`feed.rs`) of
//! the watches subscribed to it; `E W <key>` to the oldest one still
//! awaiting its first line; `M <active> W <key>` ends the key's watches on
//! this connection (each is told where to go), and so does the end of the
//! connection. `W` lines for a key no longer watched (unwatched, its `X`
//! not yet answered) are dropped.
//!
//! Held-back answers: the server answers one (op, key) on a connection in
//! the order the requests came, so a request sent behind an earlier one of
//! the same (op, key) (an acquire behind an acquire of the same key still
//! waiting in line) cannot be answered before it, even when its own wait
//! has run out. Its overdue clock ([`Ticket::wait`]) starts only when it
//! reaches the front of that line: the connection is never closed for an
//! answer the server is entitled to hold back. The pool avoids the case
//! where it can ([`Conn::phase_and_busy`]: a key's acquires go to a
//! connection with none of that key outstanding, when one is up).
//!
//! Liveness: when the connection has requests waiting or watches, and the
//! server has said nothing for the request timeout, the reader sends an
//! `I` probe; no answer to it within another request timeout closes the
//! connection. A caller whose request is overdue also closes it
//! ([`Conn::kill`]).
//!
//! Limits: [`MAX_IN_FLIGHT`] requests waiting per connection (past it the
//! connection takes no more and callers use another); [`WRITE_BATCH`] bytes
//! per socket write; lines from the server are at most `MAX_LINE` bytes
//! (`protocol`), a longer one closes the connection.
//!
//! Never does: retry, redirect or decide anything about a call (that is
//! `calls.rs`), block a caller on I/O, or unwrap anything read off the
//! network: a line that does not parse, or an answer that matches no
//! request, means the connection is out of step and it is closed.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

use crate::client::ctx::Ctx;
use crate::client::feed::{Event, Feed};
use crate::client::limits::WRITE_BATCH;
use crate::client::oneshot::{self, RecvError};
use crate::client::pending::{Pending, Route, route};
use crate::client::timer::Timer;
use crate::protocol::{self, Answer, Key, LineError, Op, Parsed, Reason, Request, Secret};

/// Time between two connection attempts to a server that is down.
pub const RECONNECT_INTERVAL: Duration = Duration::from_secs(3);
/// Requests waiting for an answer on one connection, at most.
pub const MAX_IN_FLIGHT: usize = 65_536;
/// Bytes read from the socket at once.
const READ_CHUNK: usize = 8 * 1024;

/// Where a connection stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// An attempt to connect is under way.
    Connecting,
    /// Connected: requests may be sent.
    Up,
    /// Not connected; the next attempt comes within [`RECONNECT_INTERVAL`].
    Down,
}

/// Set to when a request held back behind an earlier one of its (op, key)
/// reached the front of that line.
type FrontMark = Arc<Mutex<Option<Instant>>>;

/// Who waits for an answer: a caller, or nobody (a probe, or the release of
/// a grant nobody waited for); and, for a caller's request sent behind an
/// earlier one of the same (op, key), the mark set when it reaches the
/// front.
struct Slot {
    tx: Option<oneshot::Sender<Answer>>,
    front: Option<FrontMark>,
}

/// One registered connection.
pub struct Conn {
    /// Index of the server (node) in the pool.
    pub node: usize,
    /// The server's address as given (`host:port`).
    pub addr: String,
    state: Mutex<State>,
    /// The manager thread, joined when the client is closed.
    manager: Mutex<Option<JoinHandle<()>>>,
}

struct State {
    phase: Phase,
    /// Counts connections made; a ticket names the one it was sent on.
    generation: u64,
    /// Lines for the writer thread; Some while up.
    writer: Option<Sender<Vec<u8>>>,
    /// A clone of the socket, to shut it down from any thread.
    stream: Option<TcpStream>,
    pending: Pending<Slot>,
    /// The watches subscribed on this connection, per key.
    watches: HashMap<Key, Watchers>,
    /// Why the last attempt failed or the last connection ended.
    last_error: Option<String>,
    /// Why a caller closed the connection (reported instead of the EOF).
    kill_reason: Option<String>,
    /// The last attempt failed because the server refused the secret, and
    /// why (`bad-auth`, `auth-required`).
    auth_refused: Option<Reason>,
}

/// One watch's subscription on a connection: its mailbox and the epoch
/// its events carry.
#[derive(Clone)]
struct Sub {
    feed: Arc<Feed>,
    epoch: u64,
}

impl Sub {
    fn is(&self, feed: &Arc<Feed>, epoch: u64) -> bool {
        self.epoch == epoch && Arc::ptr_eq(&self.feed, feed)
    }
}

/// The watches of one key on one connection.
#[derive(Default)]
struct Watchers {
    /// Those whose `W` awaits its first line, in the order the `W`s went
    /// out; None for one given up on meanwhile (its answer still comes).
    awaiting: VecDeque<Option<Sub>>,
    /// Those whose `W` was answered.
    live: Vec<Sub>,
}

impl Watchers {
    /// True when no watch is left (given-up ones may still await answers).
    fn none_left(&self) -> bool {
        self.live.is_empty() && self.awaiting.iter().all(Option::is_none)
    }

    fn every(&self) -> impl Iterator<Item = &Sub> {
        self.awaiting.iter().flatten().chain(&self.live)
    }
}

/// A request sent on a connection, waiting for its answer.
pub struct Ticket {
    conn: Arc<Conn>,
    generation: u64,
    rx: oneshot::Receiver<Answer>,
    /// True once the answer was taken or the connection dropped: nothing
    /// can arrive for this ticket any more.
    settled: bool,
    /// When the line was queued for sending.
    pub sent_at: Instant,
    /// None when the request was sent at the front of its (op, key) line
    /// on the connection; else set when it gets there.
    front: Option<FrontMark>,
}

/// How waiting for an answer ended.
pub enum Outcome {
    Answer(Answer),
    /// The connection dropped before the answer came.
    Lost,
    /// The deadline passed first.
    Overdue,
    /// The caller's deadline passed while the server was entitled to hold
    /// the answer back (an earlier request of the same (op, key) on the
    /// connection is still unanswered).
    HeldBack,
}

impl Conn {
    pub fn new(node: usize, addr: String) -> Conn {
        Conn {
            node,
            addr,
            state: Mutex::new(State {
                phase: Phase::Connecting,
                generation: 0,
                writer: None,
                stream: None,
                pending: Pending::default(),
                watches: HashMap::new(),
                last_error: None,
                kill_reason: None,
                auth_refused: None,
            }),
            manager: Mutex::new(None),
        }
    }

    /// Start the manager thread.
    pub fn spawn(self: &Arc<Self>, ctx: Arc<Ctx>) -> io::Result<()> {
        let conn = self.clone();
        let handle = thread::Builder::new()
            .name(format!("baton-conn {}", self.addr))
            .spawn(move || conn.run(&ctx))?;
        *self.manager.lock() = Some(handle);
        Ok(())
    }

    /// Wait for the manager thread (and so the writer, which it joins) to
    /// end, once the client is closed. Not from the manager thread itself.
    pub fn join(&self) {
        let handle = self.manager.lock().take();
        if let Some(handle) = handle
            && handle.thread().id() != thread::current().id()
        {
            let _ = handle.join();
        }
    }

    /// The phase alone, for choosing (no copy of the last error).
    pub fn phase(&self) -> Phase {
        self.state.lock().phase
    }

    /// The phase and the last error, for choosing and reporting.
    pub fn status(&self) -> (Phase, Option<String>) {
        let st = self.state.lock();
        (st.phase, st.last_error.clone())
    }

    /// Why the last attempt failed, if the server refused the client's
    /// secret (`bad-auth`) or wanted one and got none (`auth-required`).
    pub fn auth_refused(&self) -> Option<Reason> {
        self.state.lock().auth_refused
    }

    /// The phase, and whether a request with this (op, key) waits for its
    /// answer here (a later one would be answered only after it): one
    /// lock, one hash lookup.
    pub fn phase_and_busy(&self, id: &(Op, Option<Key>)) -> (Phase, bool) {
        let st = self.state.lock();
        (st.phase, st.pending.has(id))
    }

    /// Queue `request` and register for its answer; None when the
    /// connection is not up (or full).
    pub fn send(self: &Arc<Self>, request: &Request) -> Option<Ticket> {
        let (tx, rx) = oneshot::channel();
        let mut st = self.state.lock();
        let front = send_locked(&mut st, request, Some(tx))?;
        Some(Ticket {
            conn: self.clone(),
            generation: st.generation,
            rx,
            settled: false,
            sent_at: Instant::now(),
            front,
        })
    }

    /// Subscribe `feed` to `key`'s states: send `W <key>`; the lines come to
    /// `feed` tagged `epoch`. The connection's generation, to give the
    /// watch up by; None when the connection is not up.
    pub fn watch(&self, key: &Key, feed: &Arc<Feed>, epoch: u64) -> Option<u64> {
        let mut st = self.state.lock();
        let writer = st.writer.as_ref()?;
        let mut line = Vec::with_capacity(key.as_bytes().len() + 3);
        Request::Watch { key: key.clone() }.write_to(&mut line);
        writer.send(line).ok()?;
        let sub = Sub {
            feed: feed.clone(),
            epoch,
        };
        st.watches
            .entry(key.clone())
            .or_default()
            .awaiting
            .push_back(Some(sub));
        Some(st.generation)
    }

    /// Give up the watch of `feed` (`epoch`) on `key`, subscribed in
    /// `generation`; the key's last watch here sends `X <key>`, unanswered.
    /// Nothing to do when that connection is gone, or the watch ended.
    pub fn unwatch(&self, key: &Key, generation: u64, feed: &Arc<Feed>, epoch: u64) {
        let mut st = self.state.lock();
        if st.generation != generation || st.phase != Phase::Up {
            return;
        }
        let Some(watchers) = st.watches.get_mut(key) else {
            return;
        };
        for waiting in &mut watchers.awaiting {
            if waiting.as_ref().is_some_and(|sub| sub.is(feed, epoch)) {
                *waiting = None;
            }
        }
        watchers.live.retain(|sub| !sub.is(feed, epoch));
        if !watchers.none_left() {
            return;
        }
        if watchers.awaiting.is_empty() {
            st.watches.remove(key);
        }
        send_locked(&mut st, &Request::Unwatch { key: key.clone() }, None);
    }

    /// Close the connection made in `generation` (if it is still the current
    /// one) because a request on it is overdue; it reconnects later.
    pub fn kill(&self, generation: u64, why: String) {
        let mut st = self.state.lock();
        if st.generation != generation || st.phase != Phase::Up {
            return;
        }
        log::warn!("{}: {why}; closing the connection", self.addr);
        if let Some(stream) = &st.stream {
            let _ = stream.shutdown(Shutdown::Both);
        }
        st.kill_reason = Some(why);
    }

    /// The client is closing, and a grant reaches no caller any more (each
    /// is released as it comes: `dispatch`): make sure that every grant the
    /// server made to this connection so far has come, and its release has
    /// reached the server, so that closing the socket leaves no key held
    /// (the release of a key this client held hands it to this client's
    /// own waiter here, say). Two `I` round trips, when an acquire is
    /// outstanding (or the release of a grant that came): the server writes a connection's answers in the order
    /// of its rounds, so the first `I`'s answer comes after every grant
    /// made before the `I` was read, and the second's after the releases
    /// of those grants. Bounded by `until`.
    pub fn settle(self: &Arc<Self>, until: Instant) {
        let outstanding = {
            let st = self.state.lock();
            st.pending.has_op(Op::Acquire) || st.pending.has_op(Op::Release)
        };
        if !outstanding {
            return;
        }
        for _ in 0..2 {
            let Some(ticket) = self.send(&Request::Info) else {
                return;
            };
            if !matches!(ticket.wait(None, Some(until)), Outcome::Answer(_)) {
                return;
            }
        }
    }

    /// Shut the socket down (the client is closing).
    pub fn close(&self) {
        if let Some(stream) = &self.state.lock().stream {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    // --- manager thread -----------------------------------------------------

    fn run(self: Arc<Self>, ctx: &Ctx) {
        while !ctx.is_closed() {
            self.set_phase(Phase::Connecting, None, ctx);
            match open(&self.addr, ctx.connect_timeout) {
                Ok(stream) => self.serve(stream, ctx),
                Err(why) => self.set_phase(Phase::Down, Some(why), ctx),
            }
            if ctx.sleep(RECONNECT_INTERVAL) {
                break;
            }
        }
        self.set_phase(Phase::Down, Some("the client is closed".into()), ctx);
    }

    fn set_phase(&self, phase: Phase, error: Option<String>, ctx: &Ctx) {
        {
            let mut st = self.state.lock();
            st.phase = phase;
            if let Some(error) = error {
                log::debug!("{}: {error}", self.addr);
                st.last_error = Some(error);
            }
        }
        ctx.notifier.bump();
    }

    /// One connection's life: the TLS handshake if the client uses TLS,
    /// then start the writer, read until it ends, clean up.
    fn serve(&self, stream: TcpStream, ctx: &Ctx) {
        #[cfg(feature = "tls")]
        if let Some(connector) = &ctx.tls {
            match crate::client::tls::handshake(connector, &self.addr, &stream, ctx.connect_timeout)
            {
                Ok((reader, writer)) => return self.serve_on(&stream, reader, writer, ctx),
                Err(why) => {
                    let _ = stream.shutdown(Shutdown::Both);
                    self.set_phase(Phase::Down, Some(why), ctx);
                    return;
                }
            }
        }
        match (stream.try_clone(), stream.try_clone()) {
            (Ok(reader), Ok(writer)) => self.serve_on(&stream, reader, writer, ctx),
            (Err(e), _) | (_, Err(e)) => {
                self.set_phase(Phase::Down, Some(format!("cannot start: {e}")), ctx);
            }
        }
    }

    /// Serve one connection through its two halves (plain or TLS) over
    /// `stream`, the socket they share.
    /// First, with a secret, `U` and its answer (inside TLS, if any).
    fn serve_on<R: Read, W: Sink>(
        &self,
        stream: &TcpStream,
        mut reader: R,
        mut writer: W,
        ctx: &Ctx,
    ) {
        if let Some(secret) = &ctx.auth
            && let Err(refused) = authenticate(
                stream,
                &mut reader,
                &mut writer,
                secret,
                ctx.connect_timeout,
            )
        {
            self.state.lock().auth_refused = refused.by_server;
            writer.shut();
            self.set_phase(Phase::Down, Some(refused.why), ctx);
            return;
        }
        let writer = match self.start_writer(stream, writer, ctx) {
            Ok(writer) => writer,
            Err(e) => {
                self.set_phase(Phase::Down, Some(format!("cannot start: {e}")), ctx);
                return;
            }
        };
        if ctx.is_closed() {
            // The client closed while this connection was being made.
            let _ = stream.shutdown(Shutdown::Both);
        }
        let why = self.read_loop(stream, reader, ctx);
        self.go_down(why, ctx);
        let _ = writer.join();
    }

    fn start_writer<W: Sink>(
        &self,
        stream: &TcpStream,
        out: W,
        ctx: &Ctx,
    ) -> io::Result<JoinHandle<()>> {
        let killer = stream.try_clone()?;
        // The socket's timeouts hold for every handle on it.
        stream.set_write_timeout(Some(ctx.request_timeout))?;
        // Bounded in fact though not in type: every queued line has a
        // pending entry until it is answered, and `send_locked` refuses a
        // line past MAX_IN_FLIGHT of them (the caller then moves to another
        // connection). A bounded channel would allocate all its slots up
        // front, on every connection.
        let (tx, rx) = crossbeam_channel::unbounded();
        let writer = thread::Builder::new()
            .name(format!("baton-write {}", self.addr))
            .spawn(move || write_loop(rx, out))?;
        {
            let mut st = self.state.lock();
            st.phase = Phase::Up;
            st.generation += 1;
            st.writer = Some(tx);
            st.stream = Some(killer);
            st.last_error = None;
            st.kill_reason = None;
            st.auth_refused = None;
        }
        log::debug!("{}: connected", self.addr);
        ctx.notifier.bump();
        Ok(writer)
    }

    /// The connection ended: every waiting request's caller is told (its
    /// channel closes), the writer stops once its channel is closed.
    fn go_down(&self, why: String, ctx: &Ctx) {
        let waiting = {
            let mut st = self.state.lock();
            st.phase = Phase::Down;
            st.writer = None;
            if let Some(stream) = st.stream.take() {
                let _ = stream.shutdown(Shutdown::Both);
            }
            let why = st.kill_reason.take().unwrap_or(why);
            log::info!("{}: connection lost: {why}", self.addr);
            st.last_error = Some(why);
            for sub in std::mem::take(&mut st.watches)
                .values()
                .flat_map(Watchers::every)
            {
                sub.feed.push(sub.epoch, Event::Ended);
            }
            st.pending.drain()
        };
        drop(waiting);
        ctx.notifier.bump();
    }

    /// Read and dispatch answers until the connection ends; why it ended.
    fn read_loop<R: Read>(&self, stream: &TcpStream, mut reader: R, ctx: &Ctx) -> String {
        if let Err(e) = stream.set_read_timeout(Some(ctx.request_timeout)) {
            return format!("cannot set a read timeout: {e}");
        }
        let mut input = Vec::with_capacity(READ_CHUNK);
        let mut chunk = [0u8; READ_CHUNK];
        let mut probing = false;
        loop {
            match reader.read(&mut chunk) {
                Ok(0) => return "closed by the server".into(),
                Ok(n) => {
                    probing = false;
                    input.extend_from_slice(&chunk[..n]);
                    if let Err(why) = self.take_answers(&mut input, ctx) {
                        return why;
                    }
                }
                Err(e) if is_timeout(&e) => {
                    if let Err(why) = self.on_silence(&mut probing, ctx) {
                        return why;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return plain(&e),
            }
        }
    }

    /// The server said nothing for a request timeout: probe it if requests
    /// wait; give up on it if an earlier probe got no answer.
    fn on_silence(&self, probing: &mut bool, ctx: &Ctx) -> Result<(), String> {
        if ctx.is_closed() {
            return Err("the client is closed".into());
        }
        if *probing {
            return Err(format!(
                "no answer to a probe within {:?}",
                ctx.request_timeout
            ));
        }
        let mut st = self.state.lock();
        if !st.pending.is_empty() || !st.watches.is_empty() {
            *probing = send_locked(&mut st, &Request::Info, None).is_some();
        }
        Ok(())
    }

    /// Dispatch every complete answer line in `input` and drop it from there.
    fn take_answers(&self, input: &mut Vec<u8>, ctx: &Ctx) -> Result<(), String> {
        let mut used = 0;
        let result = loop {
            match protocol::parse_answer(&input[used..]) {
                Parsed::Incomplete => break Ok(()),
                Parsed::Line { used: n, result } => {
                    used += n;
                    match result {
                        Ok(answer) => {
                            if let Err(why) = self.dispatch(answer, ctx.is_closing()) {
                                break Err(why);
                            }
                        }
                        Err(LineError::Blank) => {}
                        Err(_) => break Err("the server sent a line that does not parse".into()),
                    }
                }
            }
        };
        input.drain(..used);
        result
    }

    /// Hand one answer to the request (or the watches) it belongs to. While
    /// the client is closing, a grant goes to nobody: it is released at
    /// once, and its caller's call ends (with `Closed`).
    fn dispatch(&self, answer: Answer, closing: bool) -> Result<(), String> {
        let answer = match self.dispatch_watch(answer) {
            None => return Ok(()),
            Some(answer) => answer,
        };
        let (op, key) = match route(&answer) {
            Route::Reply(op, key) => (op, key),
            Route::Fatal(reason @ (Reason::BadAuth | Reason::AuthRequired)) => {
                // A server that wants a secret this client lacks (or that
                // changed its secrets since this connection was made).
                self.state.lock().auth_refused = Some(reason);
                return Err(format!("the server refused the secret: {reason}"));
            }
            Route::Fatal(reason) => return Err(refused_by_server(reason)),
        };
        let mut st = self.state.lock();
        let moved_up = |next: &mut Slot| {
            if let Some(mark) = &next.front {
                *mark.lock() = Some(Instant::now());
            }
        };
        let Some(slot) = st.pending.take_then(op, key, moved_up) else {
            return Err(format!(
                "the server sent an answer for no request: {answer:?}"
            ));
        };
        match slot.tx {
            Some(tx) if closing && matches!(answer, Answer::Granted { .. }) => {
                drop(tx);
                release_orphan(&mut st, answer, &self.addr);
            }
            Some(tx) => {
                if let Err(unwanted) = tx.send(answer) {
                    release_orphan(&mut st, unwanted, &self.addr);
                }
            }
            None => {}
        }
        Ok(())
    }
}

impl Conn {
    /// Hand a `W` line, or an `M` or `E` about a `W`, to the watches of
    /// its key; any other answer is handed back.
    fn dispatch_watch(&self, answer: Answer) -> Option<Answer> {
        let mut st = self.state.lock();
        match answer {
            Answer::Watched { key, state } => {
                let Some(watchers) = st.watches.get_mut(&key) else {
                    log::debug!("{}: a W line for {key}, no longer watched", self.addr);
                    return None;
                };
                if let Some(first) = watchers.awaiting.pop_front() {
                    watchers.live.extend(first);
                }
                for sub in &watchers.live {
                    sub.feed.push(sub.epoch, Event::State(state.clone()));
                }
                if watchers.awaiting.is_empty() && watchers.live.is_empty() {
                    st.watches.remove(&key);
                }
                None
            }
            Answer::Moved {
                op: Op::Watch,
                key: Some(key),
                active,
            } => {
                for sub in st.watches.remove(&key).iter().flat_map(Watchers::every) {
                    sub.feed.push(sub.epoch, Event::Moved(active.clone()));
                }
                None
            }
            Answer::Error {
                op: Some(Op::Watch),
                key: Some(key),
                reason,
            } => {
                let watchers = st.watches.get_mut(&key)?;
                if let Some(Some(sub)) = watchers.awaiting.pop_front() {
                    sub.feed.push(sub.epoch, Event::Refused(reason));
                }
                if watchers.awaiting.is_empty() && watchers.live.is_empty() {
                    st.watches.remove(&key);
                }
                None
            }
            other => Some(other),
        }
    }
}

/// Queue a request line and its slot, under the state lock so that lines go
/// out in the order their slots were registered. None when not up or full;
/// else, for a caller's request sent behind an earlier one of the same
/// (op, key), the mark set when it reaches the front of that line.
fn send_locked(
    st: &mut State,
    request: &Request,
    tx: Option<oneshot::Sender<Answer>>,
) -> Option<Option<FrontMark>> {
    let writer = st.writer.as_ref()?;
    if st.pending.len() >= MAX_IN_FLIGHT {
        return None;
    }
    let mut line = Vec::with_capacity(64);
    request.write_to(&mut line);
    writer.send(line).ok()?;
    let id = (request.op(), request.key().cloned());
    let front = (tx.is_some() && st.pending.has(&id)).then(FrontMark::default);
    let slot = Slot {
        tx,
        front: front.clone(),
    };
    st.pending.push(id.0, id.1, slot);
    Some(front)
}

/// A grant arrived for a caller that had given up: release it at once, so
/// that the key does not stay blocked until its lease runs out.
fn release_orphan(st: &mut State, answer: Answer, addr: &str) {
    if let Answer::Granted { token, key, .. } = answer {
        log::info!("{addr}: releasing {key} (token {token}): its caller gave up");
        let release = Request::Release { key, token };
        send_locked(st, &release, None);
    }
}

/// Resolve and connect, trying each address of the name in turn.
fn open(addr: &str, timeout: Duration) -> Result<TcpStream, String> {
    let candidates = addr
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve: {}", plain(&e)))?;
    let mut last = "the name resolves to no address".to_string();
    for candidate in candidates {
        match TcpStream::connect_timeout(&candidate, timeout) {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err(e) => last = plain(&e),
        }
    }
    Err(last)
}

/// Why authentication did not let a connection through.
#[derive(Debug, PartialEq, Eq)]
struct AuthFailure {
    /// The server refused the secret (`bad-auth`, `auth-required`), as
    /// opposed to the connection failing: its reason.
    by_server: Option<Reason>,
    why: String,
}

/// Send `U <secret>` through `writer` and wait, until `timeout` from now,
/// for the answer from `reader` (the two halves of the connection over
/// `stream`, plain or TLS).
fn authenticate(
    stream: &TcpStream,
    reader: &mut impl Read,
    writer: &mut impl Sink,
    secret: &Secret,
    timeout: Duration,
) -> Result<(), AuthFailure> {
    let failed = |why: String| AuthFailure {
        by_server: None,
        why,
    };
    let deadline = Instant::now() + timeout;
    let mut line = Vec::with_capacity(protocol::MAX_SECRET + 4);
    Request::Auth {
        secret: secret.clone(),
    }
    .write_to(&mut line);
    stream
        .set_write_timeout(Some(timeout))
        .and_then(|()| writer.send_all(&line))
        .map_err(|e| failed(format!("authenticating: {}", plain(&e))))?;
    let mut input = Vec::with_capacity(64);
    let mut chunk = [0u8; 256];
    loop {
        if let Parsed::Line { result, .. } = protocol::parse_answer(&input) {
            return auth_answer(result);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(failed(format!("no answer to U within {timeout:?}")));
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| failed(plain(&e)))?;
        match reader.read(&mut chunk) {
            Ok(0) => return Err(failed("closed by the server while authenticating".into())),
            Ok(n) => input.extend_from_slice(&chunk[..n]),
            Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(failed(format!("authenticating: {}", plain(&e)))),
        }
    }
}

/// What the answer to `U` means: `U ok` (or `auth-disabled`: the server
/// needs no secret) lets the connection through.
fn auth_answer(answer: Result<Answer, LineError>) -> Result<(), AuthFailure> {
    let refused = |by_server, why: String| Err(AuthFailure { by_server, why });
    match answer {
        Ok(Answer::AuthOk) => Ok(()),
        Ok(Answer::Error {
            op: Some(Op::Auth),
            reason: Reason::AuthDisabled,
            ..
        }) => {
            log::debug!("the server needs no secret (auth-disabled); going on without");
            Ok(())
        }
        Ok(Answer::Error {
            op: None,
            reason: reason @ (Reason::BadAuth | Reason::AuthRequired),
            ..
        }) => refused(
            Some(reason),
            format!("the server refused the secret: {reason}"),
        ),
        Ok(Answer::Error {
            op: None, reason, ..
        }) => refused(None, refused_by_server(reason)),
        Ok(_) | Err(_) => refused(None, "the server's answer to U makes no sense".into()),
    }
}

/// Why the server closed the connection, from its `E - - <reason>`; a
/// protected-mode refusal says what it means, since the fix is on the
/// server's side.
fn refused_by_server(reason: Reason) -> String {
    match reason {
        Reason::ProtectedMode => format!(
            "refused by the server: {reason} (it serves clients on its own machine only \
             until it is started with --bind or --auth-file)"
        ),
        reason => format!("refused by the server: {reason}"),
    }
}

/// An I/O error as a short lowercase phrase: "connection refused".
fn plain(e: &io::Error) -> String {
    let text = e.to_string();
    let text = text.split(" (os error").next().unwrap_or_default();
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => format!("{:?}", e.kind()),
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// The writer thread: coalesce queued lines and write them; on a failed
/// write, shut the socket so the reader notices.
fn write_loop<W: Sink>(lines: Receiver<Vec<u8>>, mut stream: W) {
    let mut batch = Vec::with_capacity(4096);
    while let Ok(first) = lines.recv() {
        batch.clear();
        batch.extend_from_slice(&first);
        while batch.len() < WRITE_BATCH {
            match lines.try_recv() {
                Ok(more) => batch.extend_from_slice(&more),
                Err(_) => break,
            }
        }
        if let Err(e) = stream.send_all(&batch) {
            log::debug!("write failed: {e}");
            stream.shut();
            return;
        }
    }
}

/// Where the writer thread puts its batches: a plain socket, or the
/// writing half of a TLS connection.
pub trait Sink: Send + 'static {
    fn send_all(&mut self, data: &[u8]) -> io::Result<()>;
    /// Shut the socket down, so that the reader notices.
    fn shut(&mut self);
}

impl Sink for TcpStream {
    fn send_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.write_all(data)
    }

    fn shut(&mut self) {
        let _ = self.shutdown(Shutdown::Both);
    }
}

#[cfg(feature = "tls")]
impl Sink for crate::client::tls::TlsWriter {
    fn send_all(&mut self, data: &[u8]) -> io::Result<()> {
        crate::client::tls::TlsWriter::send_all(self, data)
    }

    fn shut(&mut self) {
        let _ = self.socket().shutdown(Shutdown::Both);
    }
}

impl Ticket {
    /// Wait for the answer until the caller's own deadline (`caller_due`),
    /// or until the connection is deemed dead and closed: `budget` (None:
    /// no limit) after the request reached the front of its (op, key) line
    /// on the connection, since the server answers nothing behind an
    /// earlier request of the same (op, key) before it. A request held back
    /// that long is looked at again every `budget` until it gets there.
    pub fn wait(mut self, budget: Option<Duration>, caller_due: Option<Instant>) -> Outcome {
        loop {
            let wake = earliest(self.conn_check(budget), caller_due);
            let received = self.rx.recv_deadline(wake);
            if let Some(outcome) = self.outcome(received, budget, caller_due) {
                return outcome;
            }
        }
    }

    /// [`Ticket::wait`] for async callers: the answer wakes the future from
    /// the reader thread, a deadline from the client's timer thread.
    pub async fn wait_async(
        mut self,
        budget: Option<Duration>,
        caller_due: Option<Instant>,
        timer: &Timer,
    ) -> Outcome {
        loop {
            let wake = earliest(self.conn_check(budget), caller_due);
            let mut sleep = wake.map(|due| timer.sleep_until(due));
            let received = std::future::poll_fn(|cx| {
                if let Poll::Ready(received) = self.rx.poll_recv(cx) {
                    return Poll::Ready(received);
                }
                if let Some(sleep) = sleep.as_mut()
                    && Pin::new(sleep).poll(cx).is_ready()
                {
                    return Poll::Ready(Err(RecvError::Timeout));
                }
                Poll::Pending
            })
            .await;
            if let Some(outcome) = self.outcome(received, budget, caller_due) {
                return outcome;
            }
        }
    }

    /// When the request reached the front of its (op, key) line on the
    /// connection (its answer can come from then on); None while it is
    /// held back behind an earlier one.
    fn front_at(&self) -> Option<Instant> {
        match &self.front {
            None => Some(self.sent_at),
            Some(mark) => *mark.lock(),
        }
    }

    /// When to look at the connection next: its deadline for the answer,
    /// or while the request is held back, `budget` from now.
    fn conn_check(&self, budget: Option<Duration>) -> Option<Instant> {
        let budget = budget?;
        Some(self.front_at().unwrap_or_else(Instant::now) + budget)
    }

    /// How the wait ended; None to wait on (a deadline came but neither
    /// the caller's nor the connection's has passed).
    fn outcome(
        &mut self,
        received: Result<Answer, RecvError>,
        budget: Option<Duration>,
        caller_due: Option<Instant>,
    ) -> Option<Outcome> {
        match received {
            Ok(answer) => {
                self.settled = true;
                Some(Outcome::Answer(answer))
            }
            Err(RecvError::Closed) => {
                self.settled = true;
                Some(Outcome::Lost)
            }
            Err(RecvError::Timeout) => self.on_deadline(budget, caller_due),
        }
    }

    fn on_deadline(
        &mut self,
        budget: Option<Duration>,
        caller_due: Option<Instant>,
    ) -> Option<Outcome> {
        let front_at = {
            // Under the state lock: the answer, or the request's move to
            // the front, is either seen here or not yet made.
            let _st = self.conn.state.lock();
            if let Some(answer) = self.rx.try_recv() {
                self.settled = true;
                return Some(Outcome::Answer(answer));
            }
            self.front_at()
        };
        let verdict = past_deadline(Instant::now(), budget, front_at, caller_due);
        if verdict == Some(Verdict::ConnOverdue) {
            let waited = self.sent_at.elapsed();
            self.conn
                .kill(self.generation, format!("no answer within {waited:.1?}"));
        }
        verdict.map(|verdict| match verdict {
            Verdict::ConnOverdue | Verdict::CallerOverdue => Outcome::Overdue,
            Verdict::HeldBack => Outcome::HeldBack,
        })
    }
}

/// Which deadline of a request still unanswered has passed at `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// The connection's: `budget` since the request reached the front of
    /// its (op, key) line; the connection is deemed dead.
    ConnOverdue,
    /// The caller's, with the request at the front of its line.
    CallerOverdue,
    /// The caller's, with the request still held back behind an earlier one
    /// of its (op, key): the server was entitled not to answer yet.
    HeldBack,
}

/// [`Verdict`] at `now` for a request that reached the front of its line
/// at `front_at` (None: not yet), with the connection's `budget` (None: no
/// limit) and the caller's deadline; None when neither has passed.
fn past_deadline(
    now: Instant,
    budget: Option<Duration>,
    front_at: Option<Instant>,
    caller_due: Option<Instant>,
) -> Option<Verdict> {
    let conn_due = budget.zip(front_at).map(|(budget, front)| front + budget);
    if conn_due.is_some_and(|due| now >= due) {
        return Some(Verdict::ConnOverdue);
    }
    if caller_due.is_some_and(|due| now >= due) {
        return Some(match front_at {
            None => Verdict::HeldBack,
            Some(_) => Verdict::CallerOverdue,
        });
    }
    None
}

impl Drop for Ticket {
    /// A caller that stops waiting (a deadline, or a dropped async call)
    /// leaves its slot in place, since answers must still be matched in
    /// order: closed under the state lock, so that an answer the reader is
    /// dispatching either finds the receiver gone (and the reader releases
    /// a grant nobody wants) or was delivered already and is released here.
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut st = self.conn.state.lock();
        self.rx.close();
        if let Some(answer) = self.rx.try_recv() {
            release_orphan(&mut st, answer, &self.conn.addr);
        }
    }
}

/// The earlier of two optional deadlines (None: no limit).
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(line: &str) -> Result<Answer, LineError> {
        match protocol::parse_answer(format!("{line}\n").as_bytes()) {
            Parsed::Line { result, .. } => result,
            Parsed::Incomplete => panic!("incomplete"),
        }
    }

    #[test]
    fn a_request_held_back_never_makes_its_connection_overdue() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let budget = Some(s(5));
        // Held back long past its budget: only the caller's deadline counts.
        assert_eq!(past_deadline(t0 + s(60), budget, None, None), None);
        assert_eq!(
            past_deadline(t0 + s(6), budget, None, Some(t0 + s(5))),
            Some(Verdict::HeldBack)
        );
        // At the front since t0 + 10 s: its budget runs from then.
        let front = Some(t0 + s(10));
        assert_eq!(past_deadline(t0 + s(14), budget, front, None), None);
        assert_eq!(
            past_deadline(t0 + s(15), budget, front, None),
            Some(Verdict::ConnOverdue)
        );
        assert_eq!(
            past_deadline(t0 + s(14), budget, front, Some(t0 + s(12))),
            Some(Verdict::CallerOverdue)
        );
        // No budget (an acquire without a wait limit): never overdue.
        assert_eq!(past_deadline(t0 + s(99), None, Some(t0), None), None);
    }

    #[test]
    fn u_ok_and_auth_disabled_let_the_connection_through() {
        assert_eq!(auth_answer(answer("U ok")), Ok(()));
        assert_eq!(auth_answer(answer("E U - auth-disabled")), Ok(()));
    }

    #[test]
    fn bad_auth_and_auth_required_are_refusals_by_the_server() {
        for line in ["E - - bad-auth", "E - - auth-required"] {
            let failure = auth_answer(answer(line)).expect_err(line);
            assert!(failure.by_server.is_some(), "{line}");
            assert!(failure.why.contains("refused the secret"), "{failure:?}");
        }
    }

    #[test]
    fn other_answers_to_u_are_connection_failures() {
        for line in ["E - - too-many-connections", "I role=active", "U nope"] {
            let failure = auth_answer(answer(line)).expect_err(line);
            assert_eq!(failure.by_server, None, "{line}");
        }
    }
}
