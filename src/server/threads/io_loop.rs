//! An I/O loop: one `mio::Poll` thread owning a share of the client sockets.
//!
//! Owns: its connections (in a `Slab`), their sockets (plain or TLS), read
//! and write buffers, and its copy of the listening socket; its clock and
//! its one queue of connection deadlines (`core/deadlines.rs`). Accepts,
//! reads, parses lines into requests, forwards them to the lock owner in
//! one batch per round, and writes the answers the owner sends back,
//! coalesced into one write per connection per round. There are
//! `--threads` of these. A loop that runs out of work polls without
//! blocking for a while before it sleeps, when requests have been coming at
//! short intervals (busy_poll.rs, `--busy-poll-us`): a wake from
//! `epoll_wait` costs more than the lock server's own work.
//!
//! What becomes of one connection is decided by its state machine,
//! [`Connection`] (`core/connection.rs`, with time passed in): the
//! authentication gate (`U <secret>` first, a wrong one answered and
//! closed `BAD_AUTH_DELAY_MS` later, `AUTH_DEADLINE_MS` to authenticate),
//! the peer-reserved slot (`PEER_SLOT_MS` to show a peer line), the budget
//! of answers owed (`MAX_OWED`, `PAUSE_OUTPUT`, `MAX_OUTPUT`), the farewell
//! line and the lingering close (`LINGER_MS`), and the TLS handshake's
//! deadline. The loop tells it what happened (a line parsed and of what
//! kind, what a request costs, an answer written back, the owner's
//! acknowledgement, what a flush left, the end of input, a deadline come)
//! and carries out what it answers: forward, write, close, hand the socket
//! to replication, half-close, free. It keeps to itself what needs the
//! sockets or the node: the reads and writes, the poll, the slab, the TLS
//! sessions, the counts of connections and peer slots (`Gauges`), the
//! metrics counters, the check of a secret against `--auth-file`, what a
//! request costs (`owed_for`), and the one conversion of a deadline in ms
//! to an `Instant` (its `Clock`).
//!
//! Limits, each with its policy:
//! - `MAX_LINE` per line (`protocol`): past it, `E - - line-too-long` and close;
//! - `ACCEPT_BATCH` accepts per wake, `READ_BUDGET` bytes read per connection
//!   per wake, so one busy client cannot starve the others; accepting goes
//!   on in the next round until the listener's queue is empty, however
//!   long the loop was idle (a failed accept `ACCEPT_RETRY` later; out of
//!   open files, each connection is refused through a reserve file), and
//!   the queue holds what `os_limits.rs` asks for (4096 or more);
//! - `PAUSE_OUTPUT` bytes of unsent answers, or `MAX_OWED` bytes owed by
//!   requests sent to the owner and not answered yet (waiting acquires
//!   included; each costs its key's bytes plus `ANSWER_ALLOWANCE`, an `I`
//!   `INFO_COST`, its worst answer): stop reading that client until it
//!   catches up. The budget in bytes, not requests, is what bounds a client
//!   that floods requests and never reads, since its answers pile up in
//!   the channels before they reach its output: parsing stops mid-buffer
//!   at `MAX_OWED`, the rest (at most one read, `READ_CHUNK`, after an
//!   unfinished line) waits in the connection's partial buffer and is
//!   parsed before anything more is read, so one connection costs about
//!   `PAUSE_OUTPUT + MAX_OWED + READ_CHUNK` at most, whatever it sends. The
//!   count is kept with no allocation per request (two additions). A
//!   connection whose waiting acquires alone are owed `MAX_OWED` (4096
//!   of them with 64-byte keys, fewer with longer ones) is not read until
//!   one is answered; `MAX_OUTPUT`: a client whose unread answers still
//!   grow past it is cut off;
//! - `MAX_OWNER_BATCHES` answer batches taken in per round, so one flooded
//!   loop still gets back to its other clients;
//! - `FANOUT_LINES` change lines written to watchers per sweep, at most one
//!   sweep per round, after the round's answers, paced while clients are
//!   served (`Pace`, core/watchers.rs): a loop with watchers behind does
//!   not sleep past its next sweep, and one whose watchers behind all have
//!   full outputs waits for them to drain (a writable event) instead of
//!   sweeping;
//! - `--max-conns`: a connection past it gets `E - - too-many-connections` and
//!   is closed at once (under TLS it is closed without a word: it has no
//!   TLS session to carry one); on a cluster node a few slots past it are
//!   kept for peer links, and a client in one is refused (and counted) when
//!   its first line is no peer's or at `PEER_SLOT_MS`;
//! - `LINGER`: a connection the node ends is half-closed once every answer
//!   owed is written, and its input read and dropped until the client
//!   closes or this is up (never a reset that loses the client's last
//!   answers); a stopping loop ends all its connections so, within it;
//! - under TLS (`--tls-cert`), `tls::HANDSHAKE_MS` to finish the handshake,
//!   and `tls::TLS_BUFFER_LIMIT` bytes inside rustls per connection;
//! - `BAD_AUTH_DELAY_MS` before a wrong secret's answer and close: every
//!   `U` is checked, a right secret always opens the gate, a wrong one is
//!   always delayed. The delayed closes need no bound of their own: a
//!   rejected connection reads nothing more and holds its `--max-conns`
//!   slot until its delay is up; so guesses go at most `--max-conns` per
//!   `BAD_AUTH_DELAY_MS`, and no flood of them can keep out a client with
//!   the right secret (beyond filling `--max-conns`, as any connection
//!   flood can);
//! - `AUTH_DEADLINE_MS`: with `--auth-file`, a connection that has not
//!   authenticated by then gets `E - - auth-required` and is closed, so
//!   clients without a secret cannot hold `--max-conns` slots by saying
//!   nothing.
//!
//! The deadlines are one queue, earliest first, of (ms, connection): a
//! connection's next deadline is queued whenever it moves earlier, and
//! when one is due the loop asks the connection what is due. Entries of
//! connections gone wait for their time and do nothing; the queue is
//! rebuilt from the live connections when it holds more than twice as
//! many entries, so churn cannot grow it. A deadline counts from the
//! rounded-up millisecond and fires at the rounded-down one: never early,
//! at most a millisecond late.
//!
//! Client authentication (`--auth-file`) is checked here and nowhere else
//! (the lock owner never sees `U`): the loop checks the secret, the
//! connection's gate decides (see `core/connection.rs`). Peer links are
//! recognised before the gate: they prove the cluster key instead.
//!
//! TLS: a connection is plain or TLS from its accept on ([`Stream`]); the
//! loop reads and writes plaintext through it either way, and a TLS
//! connection is read until the socket would block (rustls may hold
//! plaintext beyond what one read returns). A TLS connection says nothing
//! to the owner until its handshake is done, so one that fails or stalls in
//! its handshake is dropped without the owner ever hearing of it.
//!
//! A connection is closed in one way only: the loop tells the owner
//! (`Inbound::Closed`), the owner drops the connection's waiters and
//! acknowledges, and only then is the slot freed — so no answer is ever
//! written to the wrong client, and a client that half-closes after sending
//! still gets every answer already decided. An `E - - <reason>` that ends
//! a connection (a line not understood, `auth-required`, `bad-auth`) is
//! its last line: with answers still owed, it waits for the owner's
//! acknowledgement, which comes after them. Under TLS a `close_notify`
//! follows the last answer, so its client can tell the end from a cut.
//! Once all that is written (under TLS, once rustls holds none of it
//! either: its records go out on writable events like the loop's own
//! output, never with a wait) the connection lingers (see `LINGER`) and
//! its slot is freed when the client closes too; at once if the client
//! was cut off or a write failed (then without `close_notify`).
//!
//! Never does: block, touch lock state, or panic on anything a client sends.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError, TrySendError};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use slab::Slab;

use crate::protocol::{self, Answer, LineError, Op, Parsed, Reason, Request};
use crate::server::busy_poll::IdleStretch;
use crate::server::clock::{Clock, Now};
use crate::server::core::connection::{
    AtEof, BAD_AUTH_DELAY_MS, Connection, Due, Flushed, Input, LINGER_MS, Line, MAX_OUTPUT,
    Opening, ReadStep, Secret as SecretCheck, Verdict, fatal_answer,
};
use crate::server::core::deadlines::Deadlines;
use crate::server::core::events::ConnId;
use crate::server::core::loop_watches::{LoopWatches, WatchConns, about_watch};
use crate::server::core::watchers::{Delivery, Fanout, Pace, WATCH_ROOM, WatchQueue};
use crate::server::messages::{
    Inbound, OwnerBatch, ReplLink, ToOwner, ToRepl, next_room, with_headroom,
};
use crate::server::shared::{Gauges, Settings};
use crate::server::trust::tls::{HANDSHAKE_MS, Stream};

const LISTENER: Token = Token(usize::MAX - 1);
/// The token of the loop's `mio::Waker`.
pub const WAKER: Token = Token(usize::MAX - 2);

/// Connections accepted per wake before the loop looks at its clients again
/// (it accepts on in the next round, with no wait: see `accept_some`).
const ACCEPT_BATCH: usize = 64;
/// How soon a loop whose accept failed (out of memory, say) tries again.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);
/// At most one warning of a failed accept per this long.
const ACCEPT_WARN_EVERY: Duration = Duration::from_secs(10);
/// Bytes read from one connection per wake before the others get a turn.
const READ_BUDGET: usize = 64 * 1024;
/// Size of the loop's read buffer.
const READ_CHUNK: usize = 16 * 1024;
/// What a request is owed beyond its key's bytes: the rest of the longest
/// answer it may get (`Q`'s three numbers, an `E`'s reason, an `M`'s
/// address) and its slots on the channels. A request costs its key plus
/// this, so 4096 waiting acquires of 64-byte keys fit in `MAX_OWED`.
const ANSWER_ALLOWANCE: u32 = 64;
/// What an `I` is owed: the longest answer line there is, whatever its
/// figures say.
const INFO_COST: u32 = protocol::MAX_LINE as u32;
/// An idle connection's write buffer is shrunk back to this capacity.
const IDLE_OUTPUT_CAPACITY: usize = 4 * 1024;
/// Events handled per `poll` call.
const EVENTS_CAPACITY: usize = 1024;
/// Answer batches from the owner taken in per round.
const MAX_OWNER_BATCHES: usize = 64;
/// Change lines written to watchers per sweep (`Fanout::sweep`), at most
/// one sweep a round, after the round's answers are flushed, and paced
/// (`Pace`) while clients are served: a change with thousands of watchers
/// goes out over many rounds, each still reading and answering every
/// client, and a watcher behind is given the newest state, skipping what
/// came in between. Small, since a request that comes during a sweep
/// waits for it.
const FANOUT_LINES: usize = 8;
/// Watchers looked at per round, those already up to date included.
const FANOUT_LOOKS: usize = 1024;
/// How long a connection the server ends lingers (`LINGER_MS`, see
/// core/connection.rs); also the most a stopping loop waits for its
/// connections to take their last answers.
pub const LINGER: Duration = Duration::from_millis(LINGER_MS);
/// How often a stopping loop looks for the owner's last answers.
const STOP_POLL: Duration = Duration::from_millis(5);

/// A connection: its socket and buffers here, its decisions in `state`.
struct Conn {
    stream: Stream,
    id: ConnId,
    /// Bytes of an unfinished line (at most MAX_LINE), or, when parsing
    /// stopped at the owed bound, the input held back.
    partial: Vec<u8>,
    output: Vec<u8>,
    written: usize,
    /// Queued for a flush this round.
    dirty: bool,
    /// Unread input may remain (budget ran out): read again next round.
    backlogged: bool,
    /// The gate, the peer slot, the owed budget, the close and its
    /// deadlines (core/connection.rs).
    state: Connection,
    /// Its watches (`W`), if it ever watched (core/watchers.rs).
    watches: Option<Box<WatchQueue>>,
}

impl Conn {
    fn pending_output(&self) -> usize {
        self.output.len() - self.written
    }

    /// Give the watches offered while the output was full their key's
    /// newest state, while the output has room; the lines written and the
    /// states they skipped.
    fn fill_stalled(&mut self, fanout: &Fanout) -> (u64, u64) {
        let (mut written, mut skipped) = (0, 0);
        let Some(queue) = self.watches.as_deref_mut() else {
            return (0, 0);
        };
        while self.output.len() - self.written < WATCH_ROOM {
            let Some(key) = queue.take_stalled() else {
                break;
            };
            let Some((version, line)) = fanout.latest(&key) else {
                continue;
            };
            if let Delivery::Write { skipped: s } = queue.offer(&key, version, true) {
                self.output.extend_from_slice(line);
                written += 1;
                skipped += s;
            }
        }
        (written, skipped)
    }
}

/// One I/O loop. Build with [`IoLoop::new`], then [`IoLoop::run`] on its own thread.
pub struct IoLoop {
    index: usize,
    poll: Poll,
    /// This loop's copy of the listening socket; closed (taken) when the
    /// loop stops, so that the node refuses new connections at once while
    /// its last ones end.
    listener: Option<TcpListener>,
    conns: Slab<Conn>,
    serial: u32,
    to_owner: Sender<ToOwner>,
    from_owner: Receiver<OwnerBatch>,
    /// Where peer links go (cluster nodes only).
    handover: Option<ReplLink>,
    settings: Arc<Settings>,
    gauges: Arc<Gauges>,
    /// False while the loop may be asleep in `poll`: the owner wakes it only then.
    awake: Arc<AtomicBool>,
    batch: Vec<Inbound>,
    /// Room the next batch is made with (see `next_room`).
    batch_room: usize,
    dirty: Vec<usize>,
    backlog: Vec<usize>,
    accept_pending: bool,
    /// When to accept again after an accept failed (see `accept_some`).
    accept_retry: Option<Instant>,
    /// When a failed accept was last warned about (at most one warning
    /// per `ACCEPT_WARN_EVERY`).
    accept_warned: Option<Instant>,
    /// One open file (`/dev/null`) kept to be closed when the process is
    /// out of them, to take a connection and refuse it
    /// (`refuse_with_reserve`).
    reserve: Option<std::fs::File>,
    answers_pending: bool,
    read_buf: Box<[u8]>,
    /// Since when the loop has been out of work, and its polling window; the
    /// stretch ends when an event or answers from the owner arrive.
    idle: IdleStretch,
    /// Holds one of the node's polling slots (`Gauges::pollers`).
    polling: bool,
    /// The loop's clock: the one place its deadlines meet `Instant`.
    clock: Clock,
    /// When to look at a connection again (its handshake, its gate, its
    /// peer slot, its linger: see `Connection::next_deadline`). An entry of
    /// a connection gone, or of a deadline that no longer matters, is
    /// popped in its time and does nothing; the queue is rebuilt from the
    /// live connections when it outgrows them (`arm`).
    deadlines: Deadlines<ConnId>,
    /// The loop is stopping (`end_all`): nothing more is parsed.
    stopping: bool,
    /// Per watched key, its newest state and this loop's connections that
    /// watch it, and what the loop does with watches
    /// (core/loop_watches.rs); the owner knows only that this loop does.
    watches: LoopWatches,
    /// When the next sweep of `fanout` may run.
    pace: Pace,
    /// When this loop last warned of a client refused by protected mode
    /// (at most one warning per `PROTECTED_WARN_EVERY`).
    protected_warned: Option<Instant>,
}

/// At most one warning of a client refused by protected mode this often,
/// per I/O loop: a scan of the port cannot flood the log.
const PROTECTED_WARN_EVERY: Duration = Duration::from_secs(30);

/// Whether a client's address is this machine's loopback (127.0.0.0/8,
/// ::1, or 127.x mapped into IPv6): the clients protected mode serves.
fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().to_canonical().is_loopback()
}

impl IoLoop {
    /// A loop with its own `Poll` and a clone of the listening socket. The
    /// returned waker is what the owner (and shutdown) use to wake it.
    pub fn new(
        index: usize,
        listener: &std::net::TcpListener,
        to_owner: Sender<ToOwner>,
        from_owner: Receiver<OwnerBatch>,
        handover: Option<ReplLink>,
        settings: Arc<Settings>,
        gauges: Arc<Gauges>,
    ) -> io::Result<(IoLoop, Arc<Waker>, Arc<AtomicBool>)> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let mut listener = TcpListener::from_std(listener.try_clone()?);
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let awake = Arc::new(AtomicBool::new(true));
        let busy_poll_max = settings.busy_poll;
        let io_loop = IoLoop {
            awake: awake.clone(),
            index,
            poll,
            listener: Some(listener),
            conns: Slab::new(),
            serial: 0,
            to_owner,
            from_owner,
            handover,
            settings,
            gauges,
            batch: Vec::new(),
            batch_room: 0,
            dirty: Vec::new(),
            backlog: Vec::new(),
            accept_pending: true,
            accept_retry: None,
            accept_warned: None,
            reserve: open_reserve(),
            answers_pending: false,
            read_buf: vec![0; READ_CHUNK].into_boxed_slice(),
            idle: IdleStretch::new(busy_poll_max),
            polling: false,
            clock: Clock::new(),
            deadlines: Deadlines::default(),
            stopping: false,
            watches: LoopWatches::new(index),
            pace: Pace::default(),
            protected_warned: None,
        };
        Ok((io_loop, waker, awake))
    }

    /// Serve until shutdown is flagged.
    pub fn run(mut self) {
        let mut events = Events::with_capacity(EVENTS_CAPACITY);
        while !self.gauges.shutdown.load(Ordering::Acquire) {
            let timeout = self.poll_timeout();
            let polled = self.poll.poll(&mut events, timeout);
            self.awake.store(true, Ordering::SeqCst);
            if let Err(e) = polled
                && e.kind() != io::ErrorKind::Interrupted
            {
                log::error!("I/O loop {}: poll failed: {e}", self.index);
                break;
            }
            if !events.is_empty() {
                self.idle.end();
            }
            self.handle_events(&events);
            self.round();
        }
        self.stop_polling();
        // Last answers (redirects after a handoff, say) go out before closing.
        self.take_answers();
        self.end_all(&mut events);
        for (_, conn) in self.conns.iter_mut() {
            if !conn.state.said_end() {
                // Best effort: the process is ending.
                let _ = conn.stream.close_notify();
            }
        }
        let open = self
            .conns
            .iter()
            .filter(|(_, c)| !c.state.peer_only())
            .count();
        self.gauges.conns.fetch_sub(open, Ordering::Relaxed);
        let reserved = self.conns.len() - open;
        self.gauges
            .peer_slots_used
            .fetch_sub(reserved, Ordering::Relaxed);
        log::info!(
            "I/O loop {}: stopped, dropping {open} connections",
            self.index
        );
    }

    /// The loop is stopping: every connection ends as one the owner forgot
    /// does, for at most `LINGER` in all, so that the last answers (a
    /// waiter's `M`, say) are not lost to a reset. Nothing more is parsed
    /// (what clients send is read and dropped, so none is stuck writing to
    /// a node that waits for it to read); the requests already parsed go to
    /// the owner, which still answers them (after a single node's retire,
    /// with `M -`); a connection is half-closed once every answer it is
    /// owed (and its `E`, if it was ending) is written, then lingers.
    fn end_all(&mut self, events: &mut Events) {
        let deadline = self.clock.instant_of(self.clock.now().ms_ceil + LINGER_MS);
        self.stopping = true;
        // No new connections: a client dialing now is refused and tries
        // another node instead of waiting on a node that is going.
        if let Some(mut listener) = self.listener.take() {
            let _ = self.poll.registry().deregister(&mut listener);
        }
        let slots: Vec<usize> = self.conns.iter().map(|(slot, _)| slot).collect();
        for &slot in &slots {
            let conn = &mut self.conns[slot];
            conn.state.stop();
            conn.partial = Vec::new();
            // Read (and drop) from now on.
            self.schedule_read(slot);
        }
        self.send_batch();
        loop {
            self.take_answers();
            self.forget_answered();
            self.flush_dirty();
            let backlog = std::mem::take(&mut self.backlog);
            for slot in backlog {
                if let Some(conn) = self.conns.get_mut(slot) {
                    conn.backlogged = false;
                    self.read_conn(slot, true);
                }
            }
            self.fire_deadlines();
            let now = Instant::now();
            if self.conns.is_empty() || now >= deadline {
                let unanswered: u64 = self
                    .conns
                    .iter()
                    .map(|(_, c)| u64::from(c.state.inflight()))
                    .sum();
                if unanswered > 0 {
                    log::warn!(
                        "I/O loop {}: stopped with {unanswered} requests unanswered",
                        self.index
                    );
                }
                return;
            }
            let busy = !self.backlog.is_empty() || !self.dirty.is_empty() || self.answers_pending;
            let owed = self.conns.iter().any(|(_, c)| c.state.inflight() > 0);
            // The owner does not wake a loop that is stopping: while answers
            // are owed, look for them often.
            let wait = if busy {
                Duration::ZERO
            } else if owed {
                STOP_POLL.min(deadline - now)
            } else {
                deadline - now
            };
            match self.poll.poll(events, Some(wait)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
            for event in events.iter() {
                if let Token(slot) = event.token()
                    && event.token() != LISTENER
                    && event.token() != WAKER
                {
                    self.handle_event(slot, event);
                }
            }
        }
    }

    /// While stopping: a connection with every answer written to it (and
    /// its `E`, if it was ending) is done with, as if the owner had
    /// forgotten it (it lingers once flushed).
    fn forget_answered(&mut self) {
        let done: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| !c.state.is_forgotten() && c.state.inflight() == 0)
            .map(|(slot, _)| slot)
            .collect();
        for slot in done {
            if let Some(farewell) = self.conns[slot].state.owner_forgot() {
                self.write_answer(slot, &farewell);
            }
            self.mark_dirty(slot);
        }
    }

    /// µs on the loop's clock (for the fan-out's pace).
    fn micros(&self) -> u64 {
        micros_on(&self.clock)
    }

    /// Send the round's requests to the owner. A full channel keeps them
    /// for the next round; a gone owner stops the node.
    fn send_batch(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        self.note_served();
        // The next batch starts with room for as many requests as the
        // recent rounds had (no step-by-step growth, and copies, every
        // round).
        self.batch_room = next_room(self.batch_room, self.batch.len());
        let batch = std::mem::replace(
            &mut self.batch,
            Vec::with_capacity(with_headroom(self.batch_room)),
        );
        match self.to_owner.try_send(ToOwner::Clients(batch)) {
            Ok(()) => {}
            // The owner's channel is full: keep the batch (it goes
            // first next round) and read no more until it has gone.
            Err(TrySendError::Full(ToOwner::Clients(batch))) => self.batch = batch,
            Err(_) => {
                log::error!("I/O loop {}: the lock owner is gone", self.index);
                self.gauges.shutdown.store(true, Ordering::Release);
            }
        }
    }

    /// Everything after the events: accept, read what is backlogged, send the
    /// batch, take in answers, flush.
    fn round(&mut self) {
        if self.accept_retry.is_some_and(|at| Instant::now() >= at) {
            self.accept_retry = None;
            self.accept_pending = true;
        }
        if self.accept_pending {
            self.accept_some();
        }
        if !self.deadlines.is_empty() {
            self.fire_deadlines();
        }
        let backlog = std::mem::take(&mut self.backlog);
        for &slot in &backlog {
            if let Some(conn) = self.conns.get_mut(slot) {
                conn.backlogged = false;
                self.read_conn(slot, true);
            }
        }
        self.backlog = reuse(backlog, &mut self.backlog);
        self.send_batch();
        self.take_answers();
        self.flush_dirty();
        if self.watches.fanout().has_work() && self.pace.ready(self.micros()) {
            // After the answers: watchers behind get the newest states,
            // a bounded share of the loop's time.
            let start = self.micros();
            let keeping_up = self.fan_out();
            self.flush_dirty();
            self.pace.swept(start, self.micros(), keeping_up);
        }
    }

    /// How long the next `poll` may block: not at all while there is work
    /// or while busy polling (see busy_poll.rs); else until an event.
    fn poll_timeout(&mut self) -> Option<Duration> {
        // A close decided while flushing (a failed write) leaves its
        // `Closed` in the batch after this round's send: send it next round.
        let busy = self.accept_pending
            || self.answers_pending
            || !self.backlog.is_empty()
            || !self.batch.is_empty()
            || (self.watches.fanout().has_work() && self.pace.ready(self.micros()));
        if busy {
            self.idle.restart();
            self.stop_polling();
            return Some(Duration::ZERO);
        }
        let window_closes = self.idle.poll_until();
        if Instant::now() < window_closes && (self.polling || self.gauges.pollers.try_take()) {
            // Stay awake (so the owner need not wake us), but let any other
            // thread that wants this CPU have it first.
            self.polling = true;
            std::thread::yield_now();
            return Some(Duration::ZERO);
        }
        self.stop_polling();
        let mut sleep = self.may_sleep();
        if self.watches.fanout().has_work() {
            // Watchers are behind: come back for them when the pace allows.
            let until = Duration::from_micros(self.pace.next_us().saturating_sub(self.micros()));
            sleep = Some(sleep.map_or(until, |s| s.min(until)));
        }
        if let Some(at) = self.accept_retry {
            // An accept failed: try again then (see `accept_some`).
            let until = at.saturating_duration_since(Instant::now());
            sleep = Some(sleep.map_or(until, |s| s.min(until)));
        }
        // Wake for the first deadline of a connection (see `deadlines`).
        match self.deadlines.next() {
            Some(deadline) => {
                let until = self
                    .clock
                    .instant_of(deadline)
                    .saturating_duration_since(Instant::now());
                Some(sleep.map_or(until, |s| s.min(until)))
            }
            None => sleep,
        }
    }

    /// Carry out what is due now on the connections whose deadlines have
    /// come, if any has.
    fn fire_deadlines(&mut self) {
        if self
            .deadlines
            .next()
            .is_some_and(|next| next <= self.clock.now_ms())
        {
            self.fire_deadlines_at(self.clock.now());
        }
    }

    /// Carry out what is due at `now` on the connections whose deadlines
    /// have come: a peer-reserved slot refused, a wrong secret answered
    /// and closed, a stalled TLS handshake dropped (the owner never heard
    /// of it), a connection that did not authenticate in time closed, a
    /// linger ended.
    fn fire_deadlines_at(&mut self, now: Now) {
        while let Some(id) = self.deadlines.pop_due(now.ms) {
            let Some(slot) = self.live_slot(id) else {
                continue;
            };
            let handshaking = self.conns[slot].stream.is_handshaking();
            let Some(due) = self.conns[slot].state.tick(now, handshaking) else {
                self.arm(slot);
                continue;
            };
            match due {
                Due::RefusePeerSlot => self.refuse_peer_slot(slot),
                Due::BadAuth => {
                    self.gauges.io_counters.refused(Reason::BadAuth);
                    self.close_with(slot, Reason::BadAuth, "wrong secret");
                }
                Due::HandshakeLate => {
                    let conn = self.unlist(slot);
                    log::debug!(
                        "{}: closed: no TLS handshake within {HANDSHAKE_MS} ms",
                        who(&conn)
                    );
                }
                Due::AuthRequired => {
                    self.gauges.io_counters.refused(Reason::AuthRequired);
                    self.close_with(slot, Reason::AuthRequired, "no U in time");
                }
                Due::ProtectedMode => {
                    self.warn_protected(slot);
                    self.gauges.io_counters.refused(Reason::ProtectedMode);
                    self.close_with(
                        slot,
                        Reason::ProtectedMode,
                        "protected mode: a client not on loopback, silent",
                    );
                }
                Due::LingerOver => self.free(slot),
            }
            // Still here: what else it waits for (at once, if that is due
            // too: it pops in this loop).
            if self.live_slot(id).is_some() {
                self.arm(slot);
            }
        }
    }

    /// Queue a connection's next deadline, if it moved earlier than the one
    /// queued. When the queue holds more entries than twice the
    /// connections (entries of connections gone, after churn), it is
    /// rebuilt from the live ones (amortised O(1)).
    fn arm(&mut self, slot: usize) {
        let conn = &mut self.conns[slot];
        let Some(deadline) = conn.state.take_new_deadline() else {
            return;
        };
        self.deadlines.push(deadline, conn.id);
        if self.deadlines.len() >= 2 * self.conns.len() + 64 {
            self.deadlines.clear();
            for (_, conn) in self.conns.iter_mut() {
                if let Some(deadline) = conn.state.rearm() {
                    self.deadlines.push(deadline, conn.id);
                }
            }
        }
    }

    /// A connection in a peer-reserved slot that is not (or not yet) a
    /// peer link: `E - - too-many-connections` and closed, at once. The
    /// owner never heard of it.
    fn refuse_peer_slot(&mut self, slot: usize) {
        let Some(conn) = self.conns.get(slot) else {
            return;
        };
        if !conn.state.peer_only() || conn.state.is_closing() {
            return;
        }
        let mut conn = self.conns.remove(slot);
        let _ = self.poll.registry().deregister(&mut conn.stream);
        self.gauges.peer_slots_used.fetch_sub(1, Ordering::Relaxed);
        // Counted as refused now that it is one (not when it took the slot).
        self.gauges.io_counters.refused(Reason::TooManyConnections);
        let _ = conn.stream.write(&too_many_connections());
        end_refused(conn.stream.tcp(), &mut self.read_buf);
        log::debug!(
            "{}: closed: a peer-reserved slot held no peer link",
            who(&conn)
        );
    }

    /// Give back the polling slot, if this loop has one.
    fn stop_polling(&mut self) {
        if std::mem::take(&mut self.polling) {
            self.gauges.pollers.give_back();
        }
    }

    /// Tell the owner whether this loop may be asleep in `poll` (then it
    /// must be woken) — and never sleep with answers waiting.
    fn may_sleep(&mut self) -> Option<Duration> {
        self.awake.store(false, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.from_owner.is_empty() {
            None
        } else {
            Some(Duration::ZERO)
        }
    }

    /// Note what one `poll` reported: accepts to make, connections to serve.
    fn handle_events(&mut self, events: &Events) {
        for event in events.iter() {
            match event.token() {
                LISTENER => self.accept_pending = true,
                WAKER => {}
                Token(slot) => self.handle_event(slot, event),
            }
        }
    }

    fn handle_event(&mut self, slot: usize, event: &mio::event::Event) {
        if !self.conns.contains(slot) {
            return;
        }
        if event.is_writable() {
            self.mark_dirty(slot);
        }
        if event.is_readable() || event.is_read_closed() || event.is_error() {
            // A short read drained the socket: the next arrival raises a new
            // edge, so stop there (saving a read that would block) unless
            // the peer closed, which raises no further edge.
            let until_blocked = event.is_read_closed() || event.is_error();
            self.read_conn(slot, until_blocked);
        }
    }

    /// Accept until the listener's queue is empty (`WouldBlock`), at most
    /// `ACCEPT_BATCH` before the loop's clients get a turn; a full batch
    /// leaves `accept_pending` set, so the next round (with no wait in
    /// `poll`) accepts on: the listener is edge-triggered, and nothing else
    /// would come back for connections left in the queue. An error of one
    /// connection (aborted before it was taken, say) skips it; out of open
    /// files, the connection is refused with `E - - too-many-connections`
    /// through the loop's reserve file (see `refuse_with_reserve`); any
    /// other failure is tried again `ACCEPT_RETRY` later, never left to the
    /// next arrival.
    fn accept_some(&mut self) {
        self.accept_pending = false;
        for _ in 0..ACCEPT_BATCH {
            let Some(listener) = &self.listener else {
                return;
            };
            match listener.accept() {
                Ok((stream, addr)) => self.admit(stream, addr),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if skip_accept_error(&e) => continue,
                Err(e) => {
                    let out_of_files =
                        matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE));
                    let now = Instant::now();
                    if self
                        .accept_warned
                        .is_none_or(|at| now >= at + ACCEPT_WARN_EVERY)
                    {
                        self.accept_warned = Some(now);
                        log::warn!(
                            "I/O loop {}: accept failed: {e}{}",
                            self.index,
                            if out_of_files {
                                "; refusing connections until some close (raise the \
                                 open-file limit to --max-conns + 256: docs/running.md)"
                            } else {
                                ""
                            }
                        );
                    }
                    if out_of_files && self.refuse_with_reserve() {
                        continue;
                    }
                    self.accept_retry = Some(now + ACCEPT_RETRY);
                    return;
                }
            }
        }
        self.accept_pending = true;
    }

    /// Out of open files: close the loop's reserve file, take the
    /// connection at the head of the queue with it, refuse it as
    /// `--max-conns` refuses (so the client hears at once instead of
    /// waiting in the queue, its SYNs dropped once the queue is full), and
    /// open the reserve again. False when there was no reserve to use or
    /// the accept failed even so.
    fn refuse_with_reserve(&mut self) -> bool {
        let Some(reserve) = self.reserve.take() else {
            return false;
        };
        drop(reserve);
        let taken = match &self.listener {
            Some(listener) => listener.accept(),
            None => return false,
        };
        let refused = match taken {
            Ok((stream, addr)) => {
                log::debug!("refusing {addr}: out of open files");
                self.gauges.io_counters.refused(Reason::TooManyConnections);
                if self.settings.tls.is_none() {
                    let _ = (&stream).write(&too_many_connections());
                }
                end_refused(&stream, &mut self.read_buf);
                true
            }
            // The queue is empty (the next accept says so) or the
            // connection was gone: carry on.
            Err(e) => e.kind() == io::ErrorKind::WouldBlock || skip_accept_error(&e),
        };
        self.reserve = open_reserve();
        refused
    }

    fn admit(&mut self, stream: TcpStream, addr: SocketAddr) {
        let count = self.gauges.conns.fetch_add(1, Ordering::Relaxed);
        let mut peer_only = false;
        if count >= self.settings.max_conns {
            self.gauges.conns.fetch_sub(1, Ordering::Relaxed);
            // Clients fill --max-conns; a few slots past it stay for peer
            // links, so that a full node can still be reached by its peers.
            let used = self.gauges.peer_slots_used.fetch_add(1, Ordering::Relaxed);
            if self.handover.is_none() || used >= self.settings.peer_slots {
                self.gauges.peer_slots_used.fetch_sub(1, Ordering::Relaxed);
                log::debug!("refusing {addr}: over --max-conns");
                self.gauges.io_counters.refused(Reason::TooManyConnections);
                if self.settings.tls.is_none() {
                    let _ = (&stream).write(&too_many_connections());
                }
                end_refused(&stream, &mut self.read_buf);
                return;
            }
            peer_only = true;
        }
        let release = |gauges: &Gauges| {
            if peer_only {
                gauges.peer_slots_used.fetch_sub(1, Ordering::Relaxed);
            } else {
                gauges.conns.fetch_sub(1, Ordering::Relaxed);
            }
        };
        if let Err(e) = stream.set_nodelay(true) {
            log::debug!("{addr}: set_nodelay failed: {e}");
        }
        // Plain or TLS, once for the connection's whole life.
        let mut stream = match &self.settings.tls {
            None => Stream::Plain(stream),
            Some(tls) => match tls.accept(stream) {
                Ok(stream) => stream,
                Err(e) => {
                    log::warn!("{addr}: cannot start TLS: {e}");
                    release(&self.gauges);
                    return;
                }
            },
        };
        let entry = self.conns.vacant_entry();
        let slot = entry.key();
        if slot >= 1 << 24 {
            release(&self.gauges);
            return;
        }
        self.serial = self.serial.wrapping_add(1);
        let id = ConnId::new(self.index, slot, self.serial);
        let interest = Interest::READABLE | Interest::WRITABLE;
        if let Err(e) = self
            .poll
            .registry()
            .register(&mut stream, Token(slot), interest)
        {
            log::warn!("{addr}: register failed: {e}");
            release(&self.gauges);
            return;
        }
        log::debug!("{id} ({addr}): connected");
        let opening = Opening {
            gated: self.settings.auth.is_some(),
            protected: self.settings.protected && !is_loopback(&addr),
            echo: self.settings.echo,
            takes_peers: self.handover.is_some(),
            peer_only,
            handshake_ms: self.settings.tls.as_ref().map(|_| HANDSHAKE_MS),
        };
        entry.insert(Conn {
            stream,
            id,
            partial: Vec::new(),
            output: Vec::new(),
            written: 0,
            dirty: false,
            backlogged: false,
            watches: None,
            state: Connection::new(self.clock.now(), opening),
        });
        self.arm(slot);
        // Data may already be waiting; the edge was before registration.
        self.schedule_read(slot);
    }

    fn schedule_read(&mut self, slot: usize) {
        let conn = &mut self.conns[slot];
        if !conn.backlogged {
            conn.backlogged = true;
            self.backlog.push(slot);
        }
    }

    /// Read and parse up to READ_BUDGET bytes from one connection.
    fn read_conn(&mut self, slot: usize, until_blocked: bool) {
        if self.conns[slot].state.is_lingering() {
            self.drain(slot);
            return;
        }
        if self.stopping {
            // Nothing more is parsed; an end of input changes nothing here.
            let _ = self.discard_input(slot);
            return;
        }
        let mut budget = READ_BUDGET;
        // A short read from TLS says nothing about the socket: read on.
        let until_blocked = until_blocked || self.conns[slot].stream.is_tls();
        loop {
            let conn = &mut self.conns[slot];
            if !conn.state.reads() {
                return;
            }
            if !self.batch.is_empty() && self.to_owner.is_full() {
                // Backpressure: the owner's channel is full.
                self.schedule_read(slot);
                return;
            }
            match conn.state.read_step(conn.pending_output()) {
                ReadStep::Pause => return,
                ReadStep::Held => {
                    // Lines left over when MAX_OWED stopped the parse go
                    // first: nothing more is read until they are taken.
                    if !self.take_input(slot, 0) {
                        return;
                    }
                    continue;
                }
                ReadStep::Read => {}
            }
            if budget == 0 {
                self.schedule_read(slot);
                return;
            }
            match conn.stream.read(&mut self.read_buf) {
                Ok(0) => {
                    self.start_close(slot, "closed by peer");
                    return;
                }
                Ok(n) => {
                    budget = budget.saturating_sub(n);
                    let drained = n < self.read_buf.len();
                    if !self.take_input(slot, n) || (drained && !until_blocked) {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.start_close(slot, &e.to_string());
                    return;
                }
            }
        }
    }

    /// Parse the `n` bytes just read (after any unfinished line). False if
    /// the connection turned out to be a peer link and was handed over.
    fn take_input(&mut self, slot: usize, n: usize) -> bool {
        let read_buf = std::mem::take(&mut self.read_buf);
        let mut partial = std::mem::take(&mut self.conns[slot].partial);
        let used = if partial.is_empty() {
            // The common case: whole lines, parsed straight from the read buffer.
            let used = self.parse_lines(slot, &read_buf[..n]);
            if let Some(used) = used {
                partial.extend_from_slice(&read_buf[used..n]);
            }
            used
        } else {
            partial.extend_from_slice(&read_buf[..n]);
            let used = self.parse_lines(slot, &partial);
            if let Some(used) = used {
                partial.drain(..used);
                // At most an unfinished line stays: give back the rest.
                partial.shrink_to(protocol::MAX_LINE);
            }
            used
        };
        self.read_buf = read_buf;
        match self.conns.get_mut(slot) {
            Some(conn) if used.is_some() => {
                if !conn.state.is_closing() {
                    conn.partial = partial;
                }
                true
            }
            _ => false,
        }
    }

    /// Parse every complete line of `input`; return the bytes used, or None
    /// if the connection turned out to be a peer link and was handed over
    /// (or refused its peer-reserved slot).
    fn parse_lines(&mut self, slot: usize, input: &[u8]) -> Option<usize> {
        let max_lease_ms = self.settings.max_lease_ms;
        let mut used = 0;
        match self.conns[slot].state.on_input(input) {
            Input::Lines => {}
            Input::PeerLink => {
                self.hand_over(slot, input);
                return None;
            }
            Input::RefusePeerSlot => {
                self.refuse_peer_slot(slot);
                return None;
            }
            Input::Wait => return Some(0),
        }
        let clock = self.clock;
        while used < input.len() {
            if !self.conns[slot].state.may_parse() {
                // Owed too much: the rest waits (in `partial`, at most one
                // read's worth) until answers come back.
                break;
            }
            let (n, result) = match protocol::parse_request(&input[used..], max_lease_ms) {
                Parsed::Incomplete => break,
                Parsed::Line { used: n, result } => (n, result),
            };
            used += n;
            let line = self.line_of(&result);
            let id = self.conns[slot].id;
            match self.conns[slot].state.line(|| clock.now(), line) {
                Verdict::Skip => {}
                Verdict::Echo => {
                    // Benchmark floor: the same read, parse and write path,
                    // answered with the line itself, without the lock owner.
                    self.conns[slot]
                        .output
                        .extend_from_slice(&input[used - n..used]);
                    self.mark_dirty(slot);
                }
                Verdict::Forward => self.forward(slot, id, result),
                Verdict::LetIn => self.let_in(slot),
                Verdict::AuthDisabled => self.refuse_auth_disabled(slot),
                Verdict::Rejected => {
                    self.reject_secret(slot);
                    // Nothing more is read: the rest of the input is dropped.
                    return Some(input.len());
                }
                Verdict::End(reason) => {
                    self.end_on_line(slot, reason, &result);
                    // Closing: the rest of the input is dropped.
                    return Some(input.len());
                }
            }
        }
        Some(used)
    }

    /// A line the connection rules let through: a request goes to the
    /// owner in this round's batch (a watch or unwatch to the watch glue),
    /// and so does a refusal, so that its answer leaves in request order.
    fn forward(&mut self, slot: usize, id: ConnId, result: Result<Request, LineError>) {
        match result {
            Ok(Request::Watch { key }) => {
                let max = self.settings.max_watches;
                let (watches, mut conns) = self.watch_parts();
                watches.parsed_watch(&mut conns, slot, id, key, max);
            }
            Ok(Request::Unwatch { key }) => {
                let (watches, mut conns) = self.watch_parts();
                watches.parsed_unwatch(&mut conns, slot, id, key);
            }
            Ok(request) => self.batch.push(Inbound::Request(id, request)),
            Err(LineError::Refused { op, key, reason }) => {
                log::debug!(
                    "{}: refused {} {}: {}",
                    who(&self.conns[slot]),
                    op.as_char(),
                    key.as_ref().map_or("-".to_string(), |k| k.to_string()),
                    reason.as_str()
                );
                // Through the owner like every answer, so it leaves
                // in request order.
                self.batch.push(Inbound::Refused(id, op, key, reason));
            }
            // Only requests and refusals are forwarded.
            Err(_) => {}
        }
    }

    /// `U` with the right secret: `U ok`, answered here.
    fn let_in(&mut self, slot: usize) {
        self.gauges.io_counters.auth_request();
        self.gauges.io_counters.auth_ok();
        self.write_answer(slot, &Answer::AuthOk);
    }

    /// `U` to a node without `--auth-file`: `E U - auth-disabled`.
    fn refuse_auth_disabled(&mut self, slot: usize) {
        self.gauges.io_counters.auth_request();
        self.gauges.io_counters.refused(Reason::AuthDisabled);
        let answer = Answer::Error {
            op: Some(Op::Auth),
            key: None,
            reason: Reason::AuthDisabled,
        };
        self.write_answer(slot, &answer);
    }

    /// `U` with a wrong secret: the connection is closed after
    /// `BAD_AUTH_DELAY_MS`, and nothing more of it is read.
    fn reject_secret(&mut self, slot: usize) {
        self.gauges.io_counters.auth_request();
        let conn = &mut self.conns[slot];
        log::debug!(
            "{}: wrong secret: closing in {BAD_AUTH_DELAY_MS} ms",
            who(conn)
        );
        conn.partial = Vec::new();
        self.arm(slot);
    }

    /// A line that ends the connection (`result`, refused for `reason`: a
    /// line not understood, a client not on loopback in protected mode, a
    /// request before `U`): counted, logged, and the connection closed
    /// with its error.
    fn end_on_line(&mut self, slot: usize, reason: Reason, result: &Result<Request, LineError>) {
        let why = match result {
            Err(LineError::Fatal(_)) => {
                log::debug!(
                    "{}: line not understood: {}",
                    who(&self.conns[slot]),
                    reason.as_str()
                );
                reason.as_str()
            }
            _ if reason == Reason::ProtectedMode => {
                self.warn_protected(slot);
                "protected mode: a client not on loopback"
            }
            _ => "a request before U",
        };
        self.gauges.io_counters.refused(reason);
        self.close_with(slot, reason, why);
    }

    /// What the connection rules look at in a parsed line: its kind, what
    /// it costs against the owed budget, and for a `U` whether its secret
    /// is right.
    fn line_of(&self, result: &Result<Request, LineError>) -> Line {
        match result {
            Err(LineError::Blank) => Line::Blank,
            Ok(Request::Auth { secret }) => Line::Auth(match &self.settings.auth {
                None => SecretCheck::Disabled,
                Some(auth) if auth.accepts(secret.as_bytes()) => SecretCheck::Right,
                Some(_) => SecretCheck::Wrong,
            }),
            Ok(request) => Line::Request {
                cost: owed_for(request.op(), request.key()),
            },
            Err(LineError::Refused { op, key, .. }) => Line::Refused {
                cost: owed_for(*op, key.as_ref()),
                auth: *op == Op::Auth,
            },
            Err(LineError::Fatal(reason)) => Line::Fatal(*reason),
        }
    }

    /// Tell the operator why a client was refused by protected mode, and
    /// how to serve it: at most once per `PROTECTED_WARN_EVERY` per loop
    /// (every refusal is counted in `baton_refusals_total`).
    fn warn_protected(&mut self, slot: usize) {
        let now = Instant::now();
        if self
            .protected_warned
            .is_some_and(|at| now.duration_since(at) < PROTECTED_WARN_EVERY)
        {
            return;
        }
        self.protected_warned = Some(now);
        log::warn!(
            "{}: refused (E - - protected-mode): this node serves only clients on loopback, \
             having neither --bind, --auth-file, --tls-client-ca nor --peers with \
             --cluster-key-file; to serve other machines, restart it with --auth-file PATH \
             (clients send a secret) or --bind 0.0.0.0 (any client that reaches the port)",
            who(&self.conns[slot])
        );
    }

    /// A peer link: the replication thread takes the socket and the bytes
    /// read so far. The owner never heard of this connection.
    fn hand_over(&mut self, slot: usize, input: &[u8]) {
        let conn = self.unlist(slot);
        if let Some(link) = &self.handover {
            // A full channel closes the connection (the peer redials).
            // Under TLS the rustls session goes along, with any plaintext
            // it holds beyond `input`.
            if link
                .tx
                .try_send(ToRepl::AdoptPeerLink(conn.stream, input.to_vec()))
                .is_ok()
            {
                let _ = link.waker.wake();
            }
        }
    }

    /// `E - - <reason>`, then the close. The line is the connection's
    /// last: written now if no answer is owed, else once the owner has
    /// answered everything sent before it (when it acknowledges the close;
    /// answers come back in order), so no answer follows it.
    fn close_with(&mut self, slot: usize, reason: Reason, why: &str) {
        let ending = self.conns[slot].state.end_with(reason);
        if let Some(farewell) = ending.say_now {
            self.write_answer(slot, &farewell);
        }
        if ending.tell_owner {
            self.told_closing(slot, why);
        }
    }

    /// Stop reading the connection and tell the owner; the slot is freed
    /// when the owner acknowledges and the output is flushed.
    fn start_close(&mut self, slot: usize, why: &str) {
        if self.conns[slot].state.end() {
            self.told_closing(slot, why);
        }
    }

    /// A connection that has just started closing: its unparsed input is
    /// dropped, and the owner told.
    fn told_closing(&mut self, slot: usize, why: &str) {
        let conn = &mut self.conns[slot];
        log::debug!("{}: closing: {why}", who(conn));
        conn.partial = Vec::new();
        self.drop_watches(slot);
        self.batch.push(Inbound::Closed(self.conns[slot].id));
    }

    /// The watch glue and the loop's connections as it sees them
    /// (`WatchConns`), borrowed apart.
    fn watch_parts(&mut self) -> (&mut LoopWatches, LoopConns<'_>) {
        let conns = LoopConns {
            conns: &mut self.conns,
            dirty: &mut self.dirty,
            batch: &mut self.batch,
            gauges: &self.gauges,
        };
        (&mut self.watches, conns)
    }

    /// The connection is going (closing, forgotten, freed): its watches end.
    fn drop_watches(&mut self, slot: usize) {
        let (watches, mut conns) = self.watch_parts();
        watches.drop_watches(&mut conns, slot);
    }

    /// An entry for this loop's watchers (`LoopWatches::watchers_entry`).
    /// `now_us`: the batch's time on the loop's clock, read once for all
    /// its entries, and only if one is a change.
    fn watchers_entry(&mut self, answer: &Answer, now_us: &mut Option<u64>) {
        let clock = self.clock;
        let (watches, mut conns) = self.watch_parts();
        watches.watchers_entry(&mut conns, answer, || {
            *now_us.get_or_insert_with(|| micros_on(&clock))
        });
    }

    /// Write the newest state of changed keys to watchers behind, at most
    /// `FANOUT_LINES` of them (see `LoopWatches::sweep`); whether every
    /// line was part of a pass (see `Swept`).
    fn fan_out(&mut self) -> bool {
        let (watches, mut conns) = self.watch_parts();
        watches
            .sweep(&mut conns, FANOUT_LINES, FANOUT_LOOKS)
            .keeping_up
    }

    fn take_answers(&mut self) {
        self.answers_pending = false;
        for _ in 0..MAX_OWNER_BATCHES {
            match self.from_owner.try_recv() {
                Ok(batch) => {
                    self.idle.end();
                    self.apply_owner_batch(batch);
                }
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => {
                    self.gauges.shutdown.store(true, Ordering::Release);
                    return;
                }
            }
        }
        // More may wait: come back after a look at the other clients.
        self.answers_pending = true;
    }

    /// Clients are served (requests sent on, answers taken in): while the
    /// loop has watchers, the fan-out is paced. Noted whether or not a
    /// sweep is due now, so that the first sweep after a change is paced
    /// too.
    fn note_served(&mut self) {
        if self.watches.fanout().is_watching() {
            self.pace.served(self.micros());
        }
    }

    fn apply_owner_batch(&mut self, batch: OwnerBatch) {
        let mut answered = false;
        let mut now_us = None;
        for (id, answer) in &batch.answers {
            if id.is_watchers() {
                self.watchers_entry(answer, &mut now_us);
            } else if let Some(slot) = self.live_slot(*id) {
                answered = true;
                self.conns[slot].state.answered(answer_owed(answer));
                if about_watch(answer) {
                    let (watches, mut conns) = self.watch_parts();
                    watches.answer(&mut conns, slot, answer);
                }
                self.write_answer(slot, answer);
            }
        }
        if answered {
            self.note_served();
        }
        for id in batch.forgotten {
            if let Some(slot) = self.live_slot(id) {
                self.drop_watches(slot);
                // Acknowledging a close, or cutting the connection off (a
                // limit): nothing more is read. Every answer owed is
                // written: the farewell, if one waits, is the last line.
                if let Some(farewell) = self.conns[slot].state.owner_forgot() {
                    self.write_answer(slot, &farewell);
                }
                self.mark_dirty(slot);
            }
        }
    }

    fn live_slot(&self, id: ConnId) -> Option<usize> {
        let slot = id.slot();
        self.conns
            .get(slot)
            .filter(|conn| conn.id == id)
            .map(|_| slot)
    }

    fn write_answer(&mut self, slot: usize, answer: &Answer) {
        let conn = &mut self.conns[slot];
        answer.write_to(&mut conn.output);
        self.mark_dirty(slot);
    }

    fn mark_dirty(&mut self, slot: usize) {
        let conn = &mut self.conns[slot];
        if !conn.dirty {
            conn.dirty = true;
            self.dirty.push(slot);
        }
    }

    fn flush_dirty(&mut self) {
        let dirty = std::mem::take(&mut self.dirty);
        for &slot in &dirty {
            if let Some(conn) = self.conns.get_mut(slot) {
                conn.dirty = false;
                self.flush(slot);
            }
        }
        self.dirty = reuse(dirty, &mut self.dirty);
    }

    /// Write what is pending on one connection; free it if it is done.
    fn flush(&mut self, slot: usize) {
        let conn = &mut self.conns[slot];
        let mut failed = false;
        let (mut watch_lines, mut skipped) = (0, 0);
        loop {
            // Watches offered while the output was full get their newest
            // state as it drains.
            let (written, s) = conn.fill_stalled(self.watches.fanout());
            watch_lines += written;
            skipped += s;
            let before = conn.written;
            while conn.pending_output() > 0 {
                match conn.stream.write(&conn.output[conn.written..]) {
                    Ok(0) => {
                        failed = true;
                        break;
                    }
                    Ok(n) => conn.written += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        failed = true;
                        break;
                    }
                }
            }
            let more = conn.watches.as_ref().is_some_and(|q| q.has_stalled());
            if failed || !more || conn.written == before {
                break;
            }
        }
        if watch_lines > 0 {
            self.gauges.io_counters.watch_lines(watch_lines);
        }
        if skipped > 0 {
            self.gauges.io_counters.watch_lines_skipped(skipped);
        }
        // TLS: records rustls still holds (a handshake, or what the socket
        // would not take) go out on the writable event too.
        if !failed && conn.stream.push_tls().is_err() {
            failed = true;
        }
        let pending = conn.pending_output();
        if conn.state.end_to_say(pending, failed) && conn.stream.close_notify().is_err() {
            // Everything owed is in rustls: under TLS the end is said after
            // it, and goes out with it.
            failed = true;
        }
        // Under TLS, what rustls took is written only once it reaches the
        // socket: a connection is flushed when rustls holds nothing either
        // (`flushed` below is told both).
        if pending == 0 {
            conn.output.clear();
            conn.written = 0;
            if conn.output.capacity() > IDLE_OUTPUT_CAPACITY {
                // An idle connection keeps little beyond its socket.
                conn.output.shrink_to(IDLE_OUTPUT_CAPACITY);
            }
        }
        match conn
            .state
            .flushed(pending, conn.stream.tls_backlog(), failed)
        {
            Flushed::Stay => {}
            Flushed::Linger => self.linger(slot),
            Flushed::Free => self.free(slot),
            Flushed::CutOff => {
                if pending > MAX_OUTPUT {
                    log::debug!("{}: cut off: {pending} bytes of answers unread", who(conn));
                }
                conn.output.clear();
                conn.written = 0;
                self.start_close(slot, "write failed or output over limit");
            }
            Flushed::Resume => self.schedule_read(slot),
        }
    }

    /// Take a connection out of the loop: its slot, its registration, and
    /// its count (of clients, or of peer-reserved slots).
    fn unlist(&mut self, slot: usize) -> Conn {
        self.drop_watches(slot);
        let mut conn = self.conns.remove(slot);
        let _ = self.poll.registry().deregister(&mut conn.stream);
        if conn.state.peer_only() {
            self.gauges.peer_slots_used.fetch_sub(1, Ordering::Relaxed);
        } else {
            self.gauges.conns.fetch_sub(1, Ordering::Relaxed);
        }
        conn
    }

    /// A forgotten connection's answers (and under TLS its `close_notify`)
    /// are all with the kernel: shut down the write side, so the client
    /// reads them and then the end, and read (and drop) what it still
    /// sends until it closes too or `LINGER` is up. Closing at once with
    /// its input unread would make the kernel reset the connection, and the
    /// client lose the answers it had not read yet.
    fn linger(&mut self, slot: usize) {
        let conn = &mut self.conns[slot];
        if conn
            .stream
            .tcp()
            .shutdown(std::net::Shutdown::Write)
            .is_err()
        {
            self.free(slot);
            return;
        }
        conn.state.linger(self.clock.now());
        // Input may be waiting already (its edge came before), or the
        // client may have closed already: then it goes now.
        if !self.drain(slot) {
            self.arm(slot);
        }
    }

    /// Read and drop a lingering connection's input; free it once the
    /// client has closed (then true).
    fn drain(&mut self, slot: usize) -> bool {
        if self.discard_input(slot) && self.conns[slot].state.input_ended() == AtEof::Free {
            self.free(slot);
            return true;
        }
        false
    }

    /// Read and drop what a connection sends, up to READ_BUDGET bytes a
    /// round (the rest next round); true once the client has closed its
    /// side (or the socket failed).
    fn discard_input(&mut self, slot: usize) -> bool {
        let mut budget = READ_BUDGET;
        loop {
            // Raw TCP even under TLS: nothing more is decrypted.
            let mut sock = self.conns[slot].stream.tcp();
            match sock.read(&mut self.read_buf) {
                Ok(0) => return true,
                Ok(n) if n >= budget => {
                    self.schedule_read(slot);
                    return false;
                }
                Ok(n) => budget -= n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return true,
            }
        }
    }

    /// Close a connection whose output is flushed (its `close_notify`
    /// included, under TLS), or given up on.
    fn free(&mut self, slot: usize) {
        let conn = self.unlist(slot);
        log::debug!("{}: closed", who(&conn));
    }
}

/// µs on `clock` (for the fan-out's pace).
fn micros_on(clock: &Clock) -> u64 {
    let origin = clock.instant_of(0);
    u64::try_from(Instant::now().saturating_duration_since(origin).as_micros()).unwrap_or(u64::MAX)
}

fn count_watch_lines(gauges: &Gauges, written: u64, skipped: u64) {
    let counters = &gauges.io_counters;
    if written > 0 {
        counters.watch_lines(written);
    }
    if skipped > 0 {
        counters.watch_lines_skipped(skipped);
    }
}

/// The loop's connections as the watch glue sees them
/// (`core/loop_watches.rs`): their queues, their output, the batch for the
/// owner, the node's counts.
struct LoopConns<'a> {
    conns: &'a mut Slab<Conn>,
    dirty: &'a mut Vec<usize>,
    batch: &'a mut Vec<Inbound>,
    gauges: &'a Gauges,
}

impl LoopConns<'_> {
    fn mark_dirty(&mut self, slot: usize) {
        if let Some(conn) = self.conns.get_mut(slot)
            && !conn.dirty
        {
            conn.dirty = true;
            self.dirty.push(slot);
        }
    }
}

impl WatchConns for LoopConns<'_> {
    fn queue(&mut self, slot: usize) -> Option<&mut WatchQueue> {
        self.conns.get_mut(slot)?.watches.as_deref_mut()
    }

    fn queue_or_new(&mut self, slot: usize) -> &mut WatchQueue {
        self.conns[slot].watches.get_or_insert_with(Box::default)
    }

    fn take_queue(&mut self, slot: usize) -> Option<Box<WatchQueue>> {
        self.conns.get_mut(slot)?.watches.take()
    }

    fn with_queues(&self) -> Vec<usize> {
        self.conns
            .iter()
            .filter(|(_, c)| c.watches.is_some())
            .map(|(slot, _)| slot)
            .collect()
    }

    fn unsent(&self, slot: usize) -> Option<usize> {
        self.conns.get(slot).map(Conn::pending_output)
    }

    fn write_line(&mut self, slot: usize, line: &[u8]) {
        if let Some(conn) = self.conns.get_mut(slot) {
            conn.output.extend_from_slice(line);
            self.mark_dirty(slot);
        }
    }

    fn write_answer(&mut self, slot: usize, answer: &Answer) {
        if let Some(conn) = self.conns.get_mut(slot) {
            answer.write_to(&mut conn.output);
            self.mark_dirty(slot);
        }
    }

    fn to_owner(&mut self, inbound: Inbound) {
        self.batch.push(inbound);
    }

    fn counted_watch(&mut self, on: bool) {
        if on {
            self.gauges.watches.fetch_add(1, Ordering::Relaxed);
        } else {
            self.gauges.watches.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn counted_lines(&mut self, written: u64, skipped: u64) {
        count_watch_lines(self.gauges, written, skipped);
    }
}

/// A worklist done with, emptied, holding what was added to `added` while
/// it was worked through: its capacity is kept for the next round.
fn reuse(mut done: Vec<usize>, added: &mut Vec<usize>) -> Vec<usize> {
    done.clear();
    done.append(added);
    done
}

/// What a request of `op` on `key` is owed against MAX_OWED until its
/// answer comes: its key's bytes and ANSWER_ALLOWANCE, or INFO_COST for an
/// `I`. The answer is taken off by [`answer_owed`], which names the same
/// op and key, so the two always match.
#[inline]
fn owed_for(op: Op, key: Option<&protocol::Key>) -> u32 {
    match op {
        Op::Info => INFO_COST,
        Op::Acquire | Op::Release | Op::Keep | Op::Query | Op::Auth | Op::Unwatch => {
            key.map_or(0, |key| key.as_bytes().len() as u32) + ANSWER_ALLOWANCE
        }
        // Its `W` line may carry a holder's value besides the numbers.
        Op::Watch => {
            key.map_or(0, |key| key.as_bytes().len() as u32)
                + ANSWER_ALLOWANCE
                + protocol::MAX_VALUE as u32
        }
    }
}

/// What an answer from the owner pays back: [`owed_for`] the request it
/// answers ([`Answer::request`] names its op and key). Nothing for
/// `E - -`, about the connection, not a request (it is being cut off).
/// (`U ok` never comes from the owner: a `U` is answered here, never owed.)
#[inline]
fn answer_owed(answer: &Answer) -> u32 {
    answer.request().map_or(0, |(op, key)| owed_for(op, key))
}

/// The line a connection over `--max-conns` gets before it is closed.
/// The end of a connection refused at once, which holds no slot to
/// linger in: the write side shut after its `E`, and what the client has
/// sent already (up to one buffer) read and dropped, so that closing it
/// does not reset the connection and lose the `E` (closing with unread
/// input makes the kernel reset it).
fn end_refused(stream: &TcpStream, buf: &mut [u8]) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut stream = stream;
    let _ = stream.read(buf);
}

/// An accept error that concerns only the connection it would have
/// returned (gone before it was taken; Linux passes on the network errors
/// of a pending connection, accept(2) says, to be treated as "try again"):
/// skip it and accept the next.
fn skip_accept_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
    ) || matches!(
        e.raw_os_error(),
        Some(
            libc::EPROTO
                | libc::ENETDOWN
                | libc::ENOPROTOOPT
                | libc::EHOSTDOWN
                | libc::ENONET
                | libc::EHOSTUNREACH
                | libc::EOPNOTSUPP
                | libc::ENETUNREACH
                | libc::EPERM
        )
    )
}

/// The loop's reserve file (see `IoLoop::reserve`); None if even that
/// cannot be opened (then an accept out of files is tried again later).
fn open_reserve() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

fn too_many_connections() -> Vec<u8> {
    let mut line = Vec::new();
    fatal_answer(Reason::TooManyConnections).write_to(&mut line);
    line
}

/// `conn 2-17 (10.0.0.5:41234)`, for a log line: the connection and the
/// client's address (asked of the socket only when the line is logged).
fn who(conn: &Conn) -> String {
    match conn.stream.peer_addr() {
        Ok(addr) => format!("{} ({addr})", conn.id),
        Err(_) => format!("{} (address gone)", conn.id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::server::Config;
    use crate::server::core::connection::{AUTH_DEADLINE_MS, Gate, MAX_OWED};

    /// What a deadline may come after its time: it counts from the
    /// rounded-up millisecond, so that it never fires early.
    const ROUNDING: Duration = Duration::from_millis(1);

    /// The loop's time `ms` from now (its deadlines take time passed in).
    fn later(io_loop: &IoLoop, ms: u64) -> Now {
        Now::at(io_loop.clock.now_ms() + ms, 0)
    }

    /// A loop with `settings` on a fresh loopback listener: the loop, the
    /// listener, and the owner's ends of its channels.
    fn loop_with(
        settings: Settings,
    ) -> (
        IoLoop,
        std::net::TcpListener,
        Receiver<ToOwner>,
        Sender<OwnerBatch>,
    ) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        listener.set_nonblocking(true).expect("non-blocking");
        let (to_owner, inbound) = crossbeam_channel::unbounded();
        let (answers, from_owner) = crossbeam_channel::unbounded();
        let (io_loop, _waker, _awake) = IoLoop::new(
            0,
            &listener,
            to_owner,
            from_owner,
            None,
            Arc::new(settings),
            Arc::default(),
        )
        .expect("a loop");
        (io_loop, listener, inbound, answers)
    }

    /// A loop on a fresh loopback listener, with the owner's ends of its
    /// channels; its first round is done (nothing to accept).
    fn idle_loop(busy_poll_us: u64) -> (IoLoop, Receiver<ToOwner>, Sender<OwnerBatch>) {
        let config = Config {
            busy_poll_us,
            ..Config::default()
        };
        let (mut io_loop, _listener, inbound, answers) =
            loop_with(Settings::new(&config, "test".into()));
        io_loop.round();
        (io_loop, inbound, answers)
    }

    /// A TLS loop on a fresh loopback listener, with the owner's ends of
    /// its channels, the listener, and the node's certificate (for a
    /// client's roots).
    fn tls_loop() -> (
        IoLoop,
        Receiver<ToOwner>,
        Sender<OwnerBatch>,
        std::net::TcpListener,
        rustls::pki_types::CertificateDer<'static>,
    ) {
        let dir = std::env::temp_dir().join(format!(
            "baton-io-loop-tls-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let rcgen::CertifiedKey { cert, signing_key } =
            rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).expect("cert");
        std::fs::write(dir.join("c.pem"), cert.pem()).expect("write");
        std::fs::write(dir.join("k.pem"), signing_key.serialize_pem()).expect("write");
        let config = Config {
            busy_poll_us: 0,
            tls_cert: Some(dir.join("c.pem")),
            tls_key: Some(dir.join("k.pem")),
            ..Config::default()
        };
        let tls = crate::server::trust::tls::NodeTls::load(&config).expect("tls");
        let _ = std::fs::remove_dir_all(&dir);
        let mut settings = Settings::new(&config, "test".into());
        settings.tls = tls.map(Arc::new);
        let (io_loop, listener, inbound, answers) = loop_with(settings);
        (io_loop, inbound, answers, listener, cert.der().clone())
    }

    #[test]
    fn a_tls_connection_that_does_not_finish_its_handshake_is_dropped_at_its_deadline() {
        let (mut io_loop, inbound, _answers, listener, _cert) = tls_loop();
        let _client =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let admitted = Instant::now();
        while io_loop.conns.is_empty() {
            assert!(
                admitted.elapsed() < Duration::from_secs(10),
                "never accepted"
            );
            io_loop.accept_pending = true;
            io_loop.round();
        }
        assert_eq!(io_loop.deadlines.len(), 1);
        assert_eq!(io_loop.gauges.conns.load(Ordering::Relaxed), 1);
        // Before the deadline it stays; after it, it is gone.
        io_loop.fire_deadlines_at(io_loop.clock.now());
        assert_eq!(io_loop.conns.len(), 1);
        io_loop.fire_deadlines_at(later(&io_loop, HANDSHAKE_MS + 1));
        assert!(io_loop.conns.is_empty() && io_loop.deadlines.is_empty());
        assert_eq!(io_loop.gauges.conns.load(Ordering::Relaxed), 0);
        // The owner never heard of it.
        assert!(inbound.try_recv().is_err());
    }

    /// Set an `int` socket option (`SO_SNDBUF`, `SO_RCVBUF`) on `fd`.
    fn set_buffer(fd: std::os::fd::RawFd, option: libc::c_int, bytes: libc::c_int) {
        // SAFETY: setsockopt only reads the int passed, of the size given.
        let set = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                option,
                (&bytes as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(set, 0, "setsockopt: {}", io::Error::last_os_error());
    }

    /// A loopback connection to `addr` whose receive buffer (so the window
    /// it offers) is `bytes`, set before it connects.
    fn small_window_connection(addr: SocketAddr, bytes: libc::c_int) -> std::net::TcpStream {
        use std::os::fd::FromRawFd;
        let SocketAddr::V4(v4) = addr else {
            panic!("IPv4 loopback only");
        };
        // SAFETY: a fresh descriptor, owned by the TcpStream at once (it
        // closes it on every path); connect only reads the address passed,
        // of the size given.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0, "socket: {}", io::Error::last_os_error());
            let stream = std::net::TcpStream::from_raw_fd(fd);
            set_buffer(fd, libc::SO_RCVBUF, bytes);
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            let connected = libc::connect(
                fd,
                (&sin as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            );
            assert_eq!(connected, 0, "connect: {}", io::Error::last_os_error());
            stream
        }
    }

    #[test]
    fn a_closing_tls_connection_goes_only_once_rustls_has_sent_everything_then_close_notify() {
        use std::os::fd::AsRawFd;
        let (mut io_loop, inbound, answers, listener, cert) = tls_loop();
        // Small socket buffers both ways (the node's, inherited from its
        // listener, and the client's window), and a client that reads only
        // once the close is decided: most of the answers then wait in the
        // node, rustls's buffer full, and as the client reads, the last of
        // the loop's output goes into rustls before rustls has sent it all.
        set_buffer(listener.as_raw_fd(), libc::SO_SNDBUF, 4096);
        let addr = listener.local_addr().expect("addr");
        // About 120 KiB of answers: under PAUSE_OUTPUT, so the node reads
        // the fatal line without the client reading anything.
        const INFOS: usize = 500;
        let (go, read_now) = std::sync::mpsc::channel::<()>();
        let client = std::thread::spawn(move || {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(cert).expect("a root");
            let config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
            let conn = rustls::ClientConnection::new(Arc::new(config), name).expect("client");
            let sock = small_window_connection(addr, 4096);
            sock.set_read_timeout(Some(Duration::from_secs(10)))
                .expect("timeout");
            let mut tls = rustls::StreamOwned::new(conn, sock);
            let mut requests = b"I\n".repeat(INFOS);
            requests.extend_from_slice(&[b'x'; 2000]);
            requests.push(b'\n');
            tls.write_all(&requests).expect("send");
            read_now.recv().expect("the signal to read");
            let mut got = Vec::new();
            // Ok only at a close_notify: an end without it is an error.
            let end = tls.read_to_end(&mut got).map_err(|e| e.to_string());
            (got, end)
        });
        // The owner's part: an I answer of some 250 bytes each, and the
        // acknowledgement of the close.
        let info = protocol::Info::from_pairs([("pad", "x".repeat(240))]);
        let start = Instant::now();
        let mut go = Some(go);
        while !client.is_finished() {
            assert!(start.elapsed() < Duration::from_secs(10), "stuck");
            io_loop.accept_pending = true;
            turn(&mut io_loop);
            if io_loop.conns.iter().any(|(_, c)| c.state.is_forgotten())
                && let Some(go) = go.take()
            {
                // The close is decided; with this much unread, the node
                // cannot have sent it all.
                let (_, conn) = io_loop.conns.iter().next().expect("the connection");
                assert!(conn.pending_output() > 0 && conn.stream.tls_backlog());
                go.send(()).expect("signal");
            }
            let mut batch = OwnerBatch::default();
            while let Ok(ToOwner::Clients(events)) = inbound.try_recv() {
                for event in events {
                    match event {
                        Inbound::Request(id, Request::Info) => {
                            batch.answers.push((id, Answer::Info(info.clone())))
                        }
                        Inbound::Closed(id) => batch.forgotten.push(id),
                        other => panic!("{other:?}"),
                    }
                }
            }
            if !batch.is_empty() {
                answers.send(batch).expect("send answers");
            }
        }
        let (got, end) = client.join().expect("the client");
        assert_eq!(end, Ok(got.len()), "not a clean end");
        let text = String::from_utf8_lossy(&got);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), INFOS + 1);
        assert!(lines[..INFOS].iter().all(|l| l.starts_with("I pad=")));
        assert_eq!(lines[INFOS], "E - - line-too-long");
        assert!(io_loop.conns.is_empty());
    }

    #[test]
    fn a_loop_with_nothing_to_do_sleeps_until_an_event() {
        let (mut io_loop, _inbound, _answers) = idle_loop(0);
        assert_eq!(io_loop.poll_timeout(), None);
        assert!(
            !io_loop.awake.load(Ordering::SeqCst),
            "the owner must wake it"
        );
    }

    #[test]
    fn a_loop_never_sleeps_with_a_close_still_to_send() {
        let (mut io_loop, inbound, _answers) = idle_loop(0);
        // As a write failing in the end-of-round flush leaves it.
        io_loop.batch.push(Inbound::Closed(ConnId::new(0, 1, 1)));
        assert_eq!(io_loop.poll_timeout(), Some(Duration::ZERO));
        io_loop.round();
        assert!(matches!(inbound.try_recv(), Ok(ToOwner::Clients(batch)) if batch.len() == 1));
        assert_eq!(io_loop.poll_timeout(), None);
    }

    #[test]
    fn a_loop_with_a_wrong_secret_wakes_for_its_delay_then_answers_and_closes() {
        let (mut io_loop, addr, _inbound) = gated_loop();
        let mut wrong =
            connect_and_send(&mut io_loop, addr, "U wrong-secret-0123456789\n", rejected);
        let timeout = io_loop
            .poll_timeout()
            .expect("a timeout, not an endless sleep");
        assert!(
            timeout > Duration::ZERO
                && timeout <= Duration::from_millis(BAD_AUTH_DELAY_MS) + ROUNDING,
            "{timeout:?}"
        );
        // Not due yet: nothing happens; once due, the answer and the close.
        io_loop.fire_deadlines_at(io_loop.clock.now());
        assert!(!closing(&io_loop));
        io_loop.fire_deadlines_at(later(&io_loop, BAD_AUTH_DELAY_MS + 1));
        assert!(closing(&io_loop));
        io_loop.round();
        assert_eq!(read_line(&mut wrong), "E - - bad-auth");
    }

    /// A loop whose node wants `SECRET`, and its address.
    fn gated_loop() -> (IoLoop, SocketAddr, Receiver<ToOwner>) {
        use crate::server::trust::client_auth::{ClientAuth, SecretSet};
        let mut settings = Settings::new(&Config::default(), "test".into());
        let secrets = SecretSet::from_file_contents(SECRET.as_bytes()).expect("a secret");
        settings.auth = Some(Arc::new(ClientAuth::new("/unused".into(), secrets)));
        let (io_loop, listener, inbound, _answers) = loop_with(settings);
        let addr = listener.local_addr().expect("addr");
        (io_loop, addr, inbound)
    }

    const SECRET: &str = "alpha-secret-0123456789";

    /// A loop with no gate on a fresh listener: its address, and the
    /// owner's ends of its channels.
    fn open_loop() -> (IoLoop, SocketAddr, Receiver<ToOwner>, Sender<OwnerBatch>) {
        let (io_loop, listener, inbound, answers) =
            loop_with(Settings::new(&Config::default(), "test".into()));
        let addr = listener.local_addr().expect("addr");
        (io_loop, addr, inbound, answers)
    }

    /// A connection the node ends (here for a line it does not understand)
    /// lingers once the owner has forgotten it and its `E` is written: the
    /// client reads the `E` and then the end, what it still sends is read
    /// and dropped, and its slot goes when it closes too, or when `LINGER`
    /// is up if it never does.
    #[test]
    fn an_ended_connection_lingers_until_the_client_closes_or_its_time_is_up() {
        let (mut io_loop, addr, inbound, answers) = open_loop();
        for client_closes in [true, false] {
            let mut client = connect_and_send(&mut io_loop, addr, "Z\n", closing);
            let closed = inbound
                .try_iter()
                .flat_map(|message| match message {
                    ToOwner::Clients(batch) => batch,
                    _ => Vec::new(),
                })
                .find_map(|inbound| match inbound {
                    Inbound::Closed(id) => Some(id),
                    _ => None,
                })
                .expect("the owner is told of the close");
            answers
                .send(OwnerBatch {
                    answers: Vec::new(),
                    forgotten: vec![closed],
                })
                .expect("the loop's channel");
            let start = Instant::now();
            while !io_loop.conns.iter().any(|(_, c)| c.state.is_lingering()) {
                assert!(start.elapsed() < Duration::from_secs(10), "no linger");
                turn(&mut io_loop);
            }
            assert_eq!(read_line(&mut client), "E - - unknown-op");
            let mut rest = [0u8; 16];
            assert_eq!(client.read(&mut rest).expect("the end"), 0, "then EOF");
            // What the client still sends is taken and dropped.
            client.write_all(&[b'Q'; 100_000]).expect("still read");
            if client_closes {
                drop(client);
                while !io_loop.conns.is_empty() {
                    assert!(start.elapsed() < Duration::from_secs(10), "not freed");
                    turn(&mut io_loop);
                }
            } else {
                turn(&mut io_loop);
                assert_eq!(io_loop.conns.len(), 1, "lingers while its time runs");
                let timeout = io_loop.poll_timeout().expect("a wake-up for the linger");
                assert!(timeout <= LINGER + ROUNDING, "{timeout:?}");
                io_loop.fire_deadlines_at(later(&io_loop, LINGER_MS + 1));
                assert!(io_loop.conns.is_empty(), "dropped when its time is up");
            }
            assert_eq!(io_loop.gauges.conns.load(Ordering::Relaxed), 0);
        }
    }

    /// Connect and send `line`; run the loop as `run` does (poll, events,
    /// round) until `done` says it has handled it (10 s at most).
    fn connect_and_send(
        io_loop: &mut IoLoop,
        addr: SocketAddr,
        line: &str,
        done: impl Fn(&IoLoop) -> bool,
    ) -> std::net::TcpStream {
        let mut client = std::net::TcpStream::connect(addr).expect("connect");
        client.write_all(line.as_bytes()).expect("send");
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let start = Instant::now();
        while !done(io_loop) {
            assert!(start.elapsed() < Duration::from_secs(10), "not handled");
            turn(io_loop);
        }
        client
    }

    fn opened(io_loop: &IoLoop) -> bool {
        io_loop
            .conns
            .iter()
            .any(|(_, c)| c.state.gate() == Gate::Open)
    }

    fn rejected(io_loop: &IoLoop) -> bool {
        io_loop
            .conns
            .iter()
            .any(|(_, c)| c.state.gate() == Gate::Rejected)
    }

    fn closing(io_loop: &IoLoop) -> bool {
        io_loop.conns.iter().any(|(_, c)| c.state.is_closing())
    }

    fn read_line(client: &mut std::net::TcpStream) -> String {
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while client.read(&mut byte).expect("an answer") == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        String::from_utf8_lossy(&line).into_owned()
    }

    #[test]
    fn a_wrong_secret_waits_for_its_timer_and_a_right_one_is_let_in() {
        let (mut io_loop, addr, _inbound) = gated_loop();
        let _wrong = connect_and_send(&mut io_loop, addr, "U wrong-secret-0123456789\n", rejected);
        assert!(!closing(&io_loop), "answered only when its delay is up");
        let mut right = connect_and_send(&mut io_loop, addr, &format!("U {SECRET}\n"), opened);
        assert_eq!(read_line(&mut right), "U ok");
    }

    #[test]
    fn a_connection_silent_past_the_auth_deadline_is_closed() {
        let (mut io_loop, addr, _inbound) = gated_loop();
        let mut silent = connect_and_send(&mut io_loop, addr, "", |l| !l.conns.is_empty());
        assert_eq!(io_loop.deadlines.len(), 1);
        let timeout = io_loop.poll_timeout().expect("a wake-up for the deadline");
        assert!(
            timeout <= Duration::from_millis(AUTH_DEADLINE_MS) + ROUNDING,
            "{timeout:?}"
        );
        // Not due yet: nothing happens.
        io_loop.round();
        assert!(!closing(&io_loop));
        // Due: answered and closed, without a line from the client.
        io_loop.fire_deadlines_at(later(&io_loop, AUTH_DEADLINE_MS + 1));
        assert!(closing(&io_loop));
        assert!(io_loop.deadlines.is_empty());
        io_loop.round();
        assert_eq!(read_line(&mut silent), "E - - auth-required");
        // One that authenticated in time is left alone when its deadline
        // comes.
        let (mut io_loop, addr, _inbound) = gated_loop();
        let mut right = connect_and_send(&mut io_loop, addr, &format!("U {SECRET}\n"), opened);
        assert_eq!(read_line(&mut right), "U ok");
        io_loop.fire_deadlines_at(later(&io_loop, AUTH_DEADLINE_MS + 1));
        assert!(io_loop.deadlines.is_empty());
        assert!(opened(&io_loop) && !closing(&io_loop));
    }

    #[test]
    fn deadlines_of_gone_connections_do_not_pile_up_or_keep_anyone_out() {
        let (mut io_loop, addr, _inbound) = gated_loop();
        // Entries of connections long gone (as after a storm of short
        // connections, or of wrong secrets), all due far off.
        let far = io_loop.clock.now_ms() + 3_600_000;
        for serial in 0..10_000u32 {
            io_loop.deadlines.push(far, ConnId::new(0, 1 << 20, serial));
        }
        let mut right = connect_and_send(&mut io_loop, addr, &format!("U {SECRET}\n"), opened);
        assert_eq!(read_line(&mut right), "U ok");
        let _wrong = connect_and_send(&mut io_loop, addr, "U wrong-secret-0123456789\n", rejected);
        // The stale entries are gone: what is left is the live
        // connections' few (an authentication deadline, a bad-auth delay).
        assert!(io_loop.deadlines.len() <= 4, "{}", io_loop.deadlines.len());
        assert!(io_loop.deadlines.next() < Some(far));
    }

    /// Run the loop as `run` does (poll, events, round) once.
    fn listener_addr(io_loop: &IoLoop) -> std::net::SocketAddr {
        io_loop
            .listener
            .as_ref()
            .expect("listening")
            .local_addr()
            .expect("addr")
    }

    fn turn(io_loop: &mut IoLoop) {
        let mut events = Events::with_capacity(16);
        io_loop
            .poll
            .poll(&mut events, Some(Duration::from_millis(10)))
            .expect("poll");
        io_loop.handle_events(&events);
        io_loop.round();
    }

    #[test]
    fn a_loop_with_watchers_notes_every_client_it_serves_even_with_no_sweep_due() {
        let (mut io_loop, inbound, answers) = idle_loop(0);
        let addr = listener_addr(&io_loop);
        let mut watcher = std::net::TcpStream::connect(addr).expect("connect");
        let mut client = std::net::TcpStream::connect(addr).expect("connect");
        watcher.write_all(b"W k\n").expect("send");
        let mut requests = Vec::new();
        let start = Instant::now();
        // The watcher's `W` reaches the owner (after the loop's `Watching`).
        while !requests
            .iter()
            .any(|(_, r)| matches!(r, Request::Watch { .. }))
        {
            assert!(start.elapsed() < Duration::from_secs(10), "no W");
            io_loop.accept_pending = true;
            turn(&mut io_loop);
            while let Ok(message) = inbound.try_recv() {
                if let ToOwner::Clients(batch) = message {
                    for event in batch {
                        if let Inbound::Request(id, request) = event {
                            requests.push((id, request));
                        }
                    }
                }
            }
        }
        let key = protocol::Key::new(b"k").expect("key");
        let (watch_id, _) = requests.pop().expect("the W");
        answers
            .send(OwnerBatch {
                answers: vec![(
                    watch_id,
                    Answer::Watched {
                        key: key.clone(),
                        state: protocol::WatchState::default(),
                    },
                )],
                forgotten: Vec::new(),
            })
            .expect("send");
        turn(&mut io_loop);
        assert!(io_loop.watches.fanout().is_watching() && !io_loop.watches.fanout().has_work());
        // No sweep is due, yet the loop is serving: the other client's
        // request counts, and then its answer.
        let before = io_loop.micros();
        client.write_all(b"A x 10 30\n").expect("send");
        let acquire = loop {
            assert!(start.elapsed() < Duration::from_secs(10), "no A");
            io_loop.accept_pending = true;
            turn(&mut io_loop);
            if let Ok(ToOwner::Clients(batch)) = inbound.try_recv()
                && let Some(Inbound::Request(id, _)) = batch.into_iter().next()
            {
                break id;
            }
        };
        let sent = io_loop
            .pace
            .served_us()
            .expect("sending a request is serving");
        assert!(sent >= before);
        answers
            .send(OwnerBatch {
                answers: vec![(
                    acquire,
                    Answer::Granted {
                        token: 7,
                        key: protocol::Key::new(b"x").expect("key"),
                        slot: None,
                    },
                )],
                forgotten: Vec::new(),
            })
            .expect("send");
        turn(&mut io_loop);
        assert!(io_loop.pace.served_us().expect("served") >= sent);
        // A change now: it goes out to the watcher, after its answer.
        answers
            .send(OwnerBatch {
                answers: vec![(
                    ConnId::watchers(io_loop.index),
                    Answer::Watched {
                        key,
                        state: protocol::WatchState {
                            token: 7,
                            holders: 1,
                            ..protocol::WatchState::default()
                        },
                    },
                )],
                forgotten: Vec::new(),
            })
            .expect("send");
        watcher
            .set_read_timeout(Some(Duration::from_millis(10)))
            .expect("timeout");
        let mut got = Vec::new();
        while !got.ends_with(b"W k 7 1 0 -\n") {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{:?}",
                String::from_utf8_lossy(&got)
            );
            turn(&mut io_loop);
            let mut buf = [0u8; 256];
            if let Ok(n) = watcher.read(&mut buf) {
                got.extend_from_slice(&buf[..n]);
            }
        }
        assert_eq!(got, b"W k 0 0 0 -\nW k 7 1 0 -\n");
        // A loop with no watchers reads no clock for the pace.
        let (mut bare, bare_inbound, _bare_answers) = idle_loop(0);
        let mut other = std::net::TcpStream::connect(listener_addr(&bare)).expect("connect");
        other.write_all(b"I\n").expect("send");
        let start = Instant::now();
        while bare_inbound.try_recv().is_err() {
            assert!(start.elapsed() < Duration::from_secs(10), "no I");
            bare.accept_pending = true;
            turn(&mut bare);
        }
        assert_eq!(bare.pace.served_us(), None);
    }

    #[test]
    fn a_connection_owed_max_owed_is_parsed_no_further_until_answers_come_back() {
        let (mut io_loop, inbound, answers) = idle_loop(0);
        let addr = listener_addr(&io_loop);
        let mut client = std::net::TcpStream::connect(addr).expect("connect");
        const SENT: usize = 4000;
        client.write_all(&b"I\n".repeat(SENT)).expect("send");
        let per_turn = (MAX_OWED / INFO_COST) as usize;
        let (mut taken, mut answered, mut stops) = (0, 0, 0);
        let start = Instant::now();
        while answered < SENT {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "stuck at {taken}"
            );
            turn(&mut io_loop);
            let mut ids = Vec::new();
            while let Ok(ToOwner::Clients(batch)) = inbound.try_recv() {
                for event in batch {
                    match event {
                        Inbound::Request(id, Request::Info) => ids.push(id),
                        other => panic!("{other:?}"),
                    }
                }
            }
            taken += ids.len();
            assert!(
                taken - answered <= per_turn,
                "{taken} taken, {answered} answered"
            );
            if let Some((_, conn)) = io_loop.conns.iter().next() {
                assert!(conn.partial.len() <= READ_CHUNK + protocol::MAX_LINE);
                if taken - answered == per_turn && taken < SENT {
                    // Stopped mid-buffer, the rest held.
                    assert!(
                        conn.state.is_paused()
                            && conn.state.holds_input()
                            && !conn.partial.is_empty()
                    );
                    assert_eq!(conn.state.owed(), MAX_OWED);
                    stops += 1;
                }
            }
            let batch = OwnerBatch {
                answers: ids
                    .iter()
                    .map(|id| (*id, Answer::Info(protocol::Info::default())))
                    .collect(),
                forgotten: Vec::new(),
            };
            answered += batch.answers.len();
            answers.send(batch).expect("send answers");
        }
        assert_eq!(taken, SENT);
        assert!(stops >= SENT / per_turn, "stopped {stops} times");
        // Every answer paid back what its request cost.
        turn(&mut io_loop);
        let (_, conn) = io_loop.conns.iter().next().expect("still open");
        assert_eq!((conn.state.inflight(), conn.state.owed()), (0, 0));
    }

    #[test]
    fn what_an_answer_pays_back_is_what_its_request_cost() {
        let key = protocol::Key::new(&[b'k'; 200]).expect("key");
        let parsed = |line: &str| match protocol::parse_request(line.as_bytes(), 60_000) {
            Parsed::Line { result, .. } => result,
            Parsed::Incomplete => panic!("incomplete"),
        };
        let k = key.to_string();
        for (line, answer) in [
            (
                format!("A {k} 30 0"),
                Answer::Granted {
                    token: 9,
                    key: key.clone(),
                    slot: None,
                },
            ),
            (format!("A {k} 30 1"), Answer::Timeout { key: key.clone() }),
            (format!("R {k} 9"), Answer::NotHeld { key: key.clone() }),
            (format!("K {k} 9 30"), Answer::Kept { key: key.clone() }),
            (
                format!("Q {k}"),
                Answer::Queried {
                    key: key.clone(),
                    token: 0,
                    ms_left: 0,
                    waiting: 0,
                },
            ),
            ("I".to_string(), Answer::Info(protocol::Info::default())),
            (
                format!("A {k} 30 0"),
                Answer::Moved {
                    active: None,
                    op: Op::Acquire,
                    key: Some(key.clone()),
                },
            ),
        ] {
            let Ok(request) = parsed(&format!("{line}\n")) else {
                panic!("{line}");
            };
            assert_eq!(
                owed_for(request.op(), request.key()),
                answer_owed(&answer),
                "{line}"
            );
        }
        // A refusal is answered with its op and key.
        let Err(LineError::Refused { op, key, reason }) = parsed(&format!("K {k} 0 30\n")) else {
            panic!("refused");
        };
        let answer = Answer::Error {
            op: Some(op),
            key: key.clone(),
            reason,
        };
        assert_eq!(owed_for(op, key.as_ref()), answer_owed(&answer));
    }

    #[test]
    fn a_loop_never_sleeps_with_answers_waiting() {
        let (mut io_loop, _inbound, answers) = idle_loop(0);
        answers.send(OwnerBatch::default()).expect("send");
        assert_eq!(io_loop.poll_timeout(), Some(Duration::ZERO));
    }

    #[test]
    fn a_polling_loop_holds_a_slot_and_gives_it_back_when_it_sleeps() {
        let (mut io_loop, _inbound, _answers) = idle_loop(10_000);
        while io_loop.idle.window.window() < Duration::from_millis(10) {
            io_loop.idle.window.idle_ended(Duration::from_millis(9));
        }
        assert_eq!(io_loop.poll_timeout(), Some(Duration::ZERO));
        assert!(io_loop.polling);
        assert!(
            io_loop.awake.load(Ordering::SeqCst),
            "a polling loop needs no wake"
        );
        // The idle stretch outlasts the window: sleep, slot given back.
        io_loop.idle.since = Some(Instant::now() - Duration::from_secs(1));
        assert_eq!(io_loop.poll_timeout(), None);
        assert!(!io_loop.polling);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        for _ in 0..cores {
            assert!(
                io_loop.gauges.pollers.try_take(),
                "every slot is free again"
            );
        }
    }

    /// The loop hands an `X` answered `M` to the connection's watch queue
    /// (`about_watch`), so a later `W` of the key goes live: the watcher
    /// gets the key's change lines (it got none once, when the node had
    /// stepped back while the `X` was on its way).
    #[test]
    fn an_unwatch_answered_moved_leaves_a_later_watch_live_in_the_loop() {
        use std::io::Read;
        let (mut io_loop, inbound, answers) = idle_loop(0);
        let addr = listener_addr(&io_loop);
        let mut watcher = std::net::TcpStream::connect(addr).expect("connect");
        let start = Instant::now();
        let mut request = |io_loop: &mut IoLoop, line: &[u8]| -> ConnId {
            watcher.write_all(line).expect("send");
            loop {
                assert!(start.elapsed() < Duration::from_secs(10), "no request");
                io_loop.accept_pending = true;
                turn(io_loop);
                while let Ok(message) = inbound.try_recv() {
                    if let ToOwner::Clients(batch) = message {
                        for event in batch {
                            if let Inbound::Request(id, _) = event {
                                return id;
                            }
                        }
                    }
                }
            }
        };
        let owner = |io_loop: &mut IoLoop, batch: Vec<(ConnId, Answer)>| {
            let batch = OwnerBatch {
                answers: batch,
                forgotten: Vec::new(),
            };
            answers.send(batch).expect("send");
            turn(io_loop);
        };
        let key = protocol::Key::new(b"k").expect("key");
        let state = |token| protocol::WatchState {
            token,
            holders: u64::from(token > 0),
            ..protocol::WatchState::default()
        };
        let watched = |token| Answer::Watched {
            key: key.clone(),
            state: state(token),
        };
        let moved = |op, key| Answer::Moved {
            active: Some("b:1".into()),
            op,
            key,
        };
        let id = request(&mut io_loop, b"W k\n");
        owner(&mut io_loop, vec![(id, watched(0))]);
        let id = request(&mut io_loop, b"X k\n");
        // The node steps back before the owner takes the `X`.
        owner(
            &mut io_loop,
            vec![
                (ConnId::watchers(0), moved(Op::Watch, None)),
                (id, moved(Op::Unwatch, Some(key.clone()))),
            ],
        );
        let id = request(&mut io_loop, b"W k\n");
        owner(&mut io_loop, vec![(id, watched(0))]);
        owner(&mut io_loop, vec![(ConnId::watchers(0), watched(7))]);
        let want = "W k 0 0 0 -\nM b:1 X k\nW k 0 0 0 -\nW k 7 1 0 -\n";
        watcher
            .set_nonblocking(true)
            .expect("a non-blocking socket");
        let mut got = Vec::new();
        while got.len() < want.len() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the second watch got no change line: {:?}",
                String::from_utf8_lossy(&got)
            );
            turn(&mut io_loop);
            let mut buf = [0u8; 256];
            match watcher.read(&mut buf) {
                Ok(0) => panic!("the loop closed the connection"),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("read: {e}"),
            }
        }
        assert_eq!(String::from_utf8_lossy(&got), want);
    }
}
