//! An I/O loop: one `mio::Poll` thread owning a share of the client sockets.
//!
//! Owns: its connections (in a `Slab`), their read and write buffers, and its
//! copy of the listening socket. Accepts, reads, parses lines into requests,
//! forwards them to the lock owner in one batch per round, and writes the
//! answers the owner sends back, coalesced into one write per connection per
//! round. There are `--threads` of these. A loop that runs out of work
//! polls without blocking for a while before it sleeps, when requests have
//! been coming at short intervals (busy_poll.rs, `--busy-poll-us`): a wake
//! from `epoll_wait` costs more than the lock server's own work.
//!
//! Limits, each with its policy:
//! - `MAX_LINE` per line (protocol.rs): past it, `E - - line-too-long` and close;
//! - `ACCEPT_BATCH` accepts per wake, `READ_BUDGET` bytes read per connection
//!   per wake, so one busy client cannot starve the others;
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
//! - `--max-conns`: a connection past it gets `E - - too-many-connections` and
//!   is closed at once (under TLS it is closed without a word: it has no
//!   TLS session to carry one); on a cluster node a few slots past it are
//!   kept for peer links, and a client in one is refused (and counted) when
//!   its first line is no peer's or at `PEER_SLOT_MS`;
//! - `LINGER`: a connection the node ends is half-closed once every answer
//!   owed is written, and its input read and dropped until the client
//!   closes or this is up (never a reset that loses the client's last
//!   answers); a stopping loop ends all its connections so, within it;
//! - under TLS (`--tls-cert`), `tls::HANDSHAKE_MS` to finish the handshake
//!   (the deadlines are a queue in their order, looked at only when the
//!   first is due), and `tls::TLS_BUFFER_LIMIT` bytes inside rustls per
//!   connection;
//! - `BAD_AUTH_DELAY` before a wrong secret's answer and close: every `U`
//!   is checked, a right secret always opens the gate, a wrong one is
//!   always delayed. The delayed closes need no bound of their own: a
//!   rejected connection reads nothing more, so it has one entry, and
//!   holds its `--max-conns` slot until its delay is up; so guesses go at
//!   most `--max-conns` per `BAD_AUTH_DELAY`, and no flood of them can
//!   keep out a client with the right secret (beyond filling
//!   `--max-conns`, as any connection flood can);
//! - `AUTH_DEADLINE`: with `--auth-file`, a connection that has not
//!   authenticated by then gets `E - - auth-required` and is closed, so
//!   clients without a secret cannot hold `--max-conns` slots by saying
//!   nothing.
//!
//! Client authentication (`--auth-file`) is a gate per connection, checked
//! here and nowhere else (the lock owner never sees `U`): a connection
//! starts `Gate::Awaiting` its `U <secret>`; a right secret opens it
//! (`U ok`); any other line first gets `E - - auth-required` and the
//! connection is closed; a wrong secret (or a `U` with extra fields) stops
//! all reading and, `BAD_AUTH_DELAY` later, by a timer of this loop (it
//! never sleeps), `E - - bad-auth` and the close. A `U` on an open
//! connection is checked again the same way (`U ok`, or bad-auth and
//! close), but one with extra fields there is refused like any request
//! (`E U - extra-fields`: it offers no secret to check); without
//! `--auth-file` a `U` gets `E U - auth-disabled`. Peer links
//! are recognised before the gate: they prove the cluster key instead.
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

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError, TrySendError};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use slab::Slab;

use crate::protocol::{self, Answer, LineError, Op, Parsed, Reason, Request, Secret};
use crate::server::busy_poll::IdleStretch;
use crate::server::core::lock_table::ConnId;
use crate::server::core::peer_msg::is_peer_line;
use crate::server::messages::{Inbound, OwnerBatch, ReplLink, ToOwner, ToRepl, next_room};
use crate::server::shared::{Gauges, Settings};
use crate::server::trust::tls::{HANDSHAKE_MS, Stream};

const LISTENER: Token = Token(usize::MAX - 1);
/// The token of the loop's `mio::Waker`.
pub const WAKER: Token = Token(usize::MAX - 2);

/// Connections accepted per wake before the loop looks at its clients again.
const ACCEPT_BATCH: usize = 64;
/// Bytes read from one connection per wake before the others get a turn.
const READ_BUDGET: usize = 64 * 1024;
/// Size of the loop's read buffer.
const READ_CHUNK: usize = 16 * 1024;
/// Unsent answer bytes past which a connection is not read until it drains.
const PAUSE_OUTPUT: usize = 256 * 1024;
/// What one connection may be owed, in bytes, by requests it has sent to
/// the owner and not had answered yet (its waiters included): past it,
/// parsing stops (mid-buffer: the rest waits in the connection's partial
/// buffer) and the connection is not read until half of it is answered.
/// With the output's own bound this keeps what a client that floods
/// requests and never reads can cost near `PAUSE_OUTPUT`, whatever its
/// requests are.
const MAX_OWED: u32 = 2 * PAUSE_OUTPUT as u32;
/// What a request is owed beyond its key's bytes: the rest of the longest
/// answer it may get (`Q`'s three numbers, an `E`'s reason, an `M`'s
/// address) and its slots on the channels. A request costs its key plus
/// this, so 4096 waiting acquires of 64-byte keys fit in `MAX_OWED`.
const ANSWER_ALLOWANCE: u32 = 64;
/// What an `I` is owed: the longest answer line there is, whatever its
/// figures say.
const INFO_COST: u32 = protocol::MAX_LINE as u32;
/// Unsent answer bytes past which a connection is cut off.
const MAX_OUTPUT: usize = 4 * 1024 * 1024;
/// An idle connection's write buffer is shrunk back to this capacity.
const IDLE_OUTPUT_CAPACITY: usize = 4 * 1024;
/// Events handled per `poll` call.
const EVENTS_CAPACITY: usize = 1024;
/// Answer batches from the owner taken in per round.
const MAX_OWNER_BATCHES: usize = 64;
/// A connection admitted past `--max-conns` into a slot reserved for peers
/// must show itself as a peer link within this, or it is closed.
pub const PEER_SLOT_MS: u64 = 1_000;
/// A wrong secret is answered and its connection closed this long after it
/// arrived, to slow down guessing.
pub const BAD_AUTH_DELAY: Duration = Duration::from_millis(100);
/// With `--auth-file`, a connection must have authenticated this long after
/// it was accepted, or it is closed.
pub const AUTH_DEADLINE: Duration = Duration::from_secs(10);
/// A connection the server ends, its answers all with the kernel, is
/// half-closed (FIN) and read, its input dropped, until the client closes
/// too or this long has passed; also the most a stopping loop waits for
/// its connections to take their last answers. (Closing a socket with
/// unread input makes the kernel reset the connection, and a reset
/// discards the answers the client had not yet read.)
pub const LINGER: Duration = Duration::from_secs(1);
/// How often a stopping loop looks for the owner's last answers.
const STOP_POLL: Duration = Duration::from_millis(5);

/// Where a connection stands with client authentication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gate {
    /// No `--auth-file`, or the connection has authenticated.
    Open,
    /// `--auth-file`: the first request must be `U <secret>`.
    Awaiting,
    /// A wrong secret: nothing more is read; `E - - bad-auth` and the close
    /// come when its delay is up.
    Rejected,
}

struct Conn {
    stream: Stream,
    id: ConnId,
    /// Bytes of an unfinished line (at most MAX_LINE).
    partial: Vec<u8>,
    output: Vec<u8>,
    written: usize,
    /// No more reading: EOF, error, or a fatal line. The owner has been told.
    closing: bool,
    /// The owner has forgotten this connection: free it once flushed.
    forgotten: bool,
    /// Cut off for not reading (MAX_OUTPUT) or a failed write: its unsent
    /// output is dropped, not waited for.
    cut_off: bool,
    /// The `E - - <reason>` of a close, to be written once the owner has
    /// answered everything before it (see `close_with`).
    farewell: Option<Reason>,
    /// Closing, everything owed handed to the stream, and under TLS a
    /// `close_notify` queued after it.
    said_end: bool,
    /// Everything is written and the write side shut down: input is read
    /// and dropped until the client closes or `LINGER` is up.
    lingering: bool,
    /// Queued for a flush this round.
    dirty: bool,
    /// Reading is paused by PAUSE_OUTPUT or MAX_OWED.
    paused: bool,
    /// Requests sent to the owner and not answered yet.
    inflight: u32,
    /// What those requests cost against MAX_OWED (see [`owed_for`]).
    owed: u32,
    /// Parsing stopped at MAX_OWED: `partial` may hold complete lines,
    /// parsed before anything more is read.
    held_input: bool,
    /// Unread input may remain (budget ran out): read again next round.
    backlogged: bool,
    /// No line has been read yet (a peer link announces itself on its first line).
    fresh: bool,
    /// Admitted past `--max-conns` into a slot reserved for peer links: it
    /// may only become one (within PEER_SLOT_MS).
    peer_only: bool,
    /// Client authentication: checked once per line.
    gate: Gate,
}

impl Conn {
    fn pending_output(&self) -> usize {
        self.output.len() - self.written
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
    answers_pending: bool,
    read_buf: Box<[u8]>,
    /// Since when the loop has been out of work, and its polling window; the
    /// stretch ends when an event or answers from the owner arrive.
    idle: IdleStretch,
    /// Holds one of the node's polling slots (`Gauges::pollers`).
    polling: bool,
    /// Connections in peer-reserved slots, with the time they must have
    /// shown a peer line by.
    peer_only: Vec<(usize, ConnId, Instant)>,
    /// Connections rejected for a wrong secret, with the time they get
    /// their answer and close (in that order: the delay is fixed). One
    /// entry per rejected connection, which reads nothing more and keeps
    /// its slot until then: bounded by the connections.
    delayed_closes: VecDeque<(usize, ConnId, Instant)>,
    /// TLS connections whose handshake is not done, with its deadline.
    /// (In that order: the time allowed is fixed. Entries of handshakes
    /// done or connections gone wait for their deadline, or are pruned in
    /// `admit`.)
    handshakes: VecDeque<(usize, ConnId, Instant)>,
    /// With `--auth-file`: connections with the time they must have
    /// authenticated by (in that order: the deadline is fixed).
    auth_deadlines: VecDeque<(usize, ConnId, Instant)>,
    /// Lingering connections with the time they are dropped by (in that
    /// order: `LINGER` is fixed). One entry per connection that lingers
    /// (one whose client had already closed goes at once, with none):
    /// bounded by the connections ended in `LINGER`.
    lingers: VecDeque<(usize, ConnId, Instant)>,
    /// The loop is stopping (`end_all`): nothing more is parsed.
    stopping: bool,
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
            answers_pending: false,
            read_buf: vec![0; READ_CHUNK].into_boxed_slice(),
            idle: IdleStretch::new(busy_poll_max),
            polling: false,
            peer_only: Vec::new(),
            delayed_closes: VecDeque::new(),
            handshakes: VecDeque::new(),
            auth_deadlines: VecDeque::new(),
            lingers: VecDeque::new(),
            stopping: false,
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
            if !conn.said_end {
                // Best effort: the process is ending.
                let _ = conn.stream.close_notify();
            }
        }
        let open = self.conns.iter().filter(|(_, c)| !c.peer_only).count();
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
        let deadline = Instant::now() + LINGER;
        self.stopping = true;
        // No new connections: a client dialing now is refused and tries
        // another node instead of waiting on a node that is going.
        if let Some(mut listener) = self.listener.take() {
            let _ = self.poll.registry().deregister(&mut listener);
        }
        let slots: Vec<usize> = self.conns.iter().map(|(slot, _)| slot).collect();
        for &slot in &slots {
            let conn = &mut self.conns[slot];
            conn.closing = true;
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
            self.expire_lingers();
            let now = Instant::now();
            if self.conns.is_empty() || now >= deadline {
                let unanswered: u64 = self.conns.iter().map(|(_, c)| u64::from(c.inflight)).sum();
                if unanswered > 0 {
                    log::warn!(
                        "I/O loop {}: stopped with {unanswered} requests unanswered",
                        self.index
                    );
                }
                return;
            }
            let busy = !self.backlog.is_empty() || !self.dirty.is_empty() || self.answers_pending;
            let owed = self.conns.iter().any(|(_, c)| c.inflight > 0);
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
            .filter(|(_, c)| !c.forgotten && c.inflight == 0)
            .map(|(slot, _)| slot)
            .collect();
        for slot in done {
            if let Some(reason) = self.conns[slot].farewell.take() {
                self.write_answer(slot, &fatal_answer(reason));
            }
            self.conns[slot].forgotten = true;
            self.mark_dirty(slot);
        }
    }

    /// Send the round's requests to the owner. A full channel keeps them
    /// for the next round; a gone owner stops the node.
    fn send_batch(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        // The next batch starts with room for as many requests as the
        // recent rounds had (no step-by-step growth, and copies, every
        // round).
        self.batch_room = next_room(self.batch_room, self.batch.len());
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(self.batch_room));
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
        if self.accept_pending {
            self.accept_some();
        }
        if !self.peer_only.is_empty() {
            self.expire_peer_slots();
        }
        if !self.delayed_closes.is_empty() {
            self.answer_delayed_closes();
        }
        if self.handshakes.front().is_some() {
            let now = Instant::now();
            if self
                .handshakes
                .front()
                .is_some_and(|&(_, _, due)| due <= now)
            {
                self.expire_handshakes(now);
            }
        }
        if !self.auth_deadlines.is_empty() {
            self.expire_auth_deadlines();
        }
        if !self.lingers.is_empty() {
            self.expire_lingers();
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
    }

    /// How long the next `poll` may block: not at all while there is work
    /// or while busy polling (see busy_poll.rs); else until an event.
    fn poll_timeout(&mut self) -> Option<Duration> {
        // A close decided while flushing (a failed write) leaves its
        // `Closed` in the batch after this round's send: send it next round.
        let busy = self.accept_pending
            || self.answers_pending
            || !self.backlog.is_empty()
            || !self.batch.is_empty();
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
        let sleep = self.may_sleep();
        // Wake for the deadline of a connection in a peer-reserved slot, of
        // the first TLS handshake, the first delayed close, the first
        // authentication deadline, or the first lingering connection's.
        let firsts = [
            self.handshakes.front(),
            self.delayed_closes.front(),
            self.auth_deadlines.front(),
            self.lingers.front(),
        ];
        match self
            .peer_only
            .iter()
            .chain(firsts.into_iter().flatten())
            .map(|(_, _, d)| *d)
            .min()
        {
            Some(deadline) => {
                let until = deadline.saturating_duration_since(Instant::now());
                Some(sleep.map_or(until, |s| s.min(until)))
            }
            None => sleep,
        }
    }

    /// Close the connections in peer-reserved slots whose time to show a
    /// peer line is up.
    fn expire_peer_slots(&mut self) {
        let now = Instant::now();
        let late: Vec<usize> = self
            .peer_only
            .iter()
            .filter(|(slot, id, deadline)| {
                *deadline <= now || self.conns.get(*slot).is_none_or(|c| c.id != *id)
            })
            .map(|(slot, _, _)| *slot)
            .collect();
        for slot in late {
            self.refuse_peer_slot(slot);
        }
    }

    /// Take off the handshake deadlines due at `now` (the first ones),
    /// closing the TLS connections still in their handshake then. The
    /// owner never heard of these.
    fn expire_handshakes(&mut self, now: Instant) {
        while let Some((slot, id)) = pop_due(&mut self.handshakes, now) {
            let late = self
                .live_slot(id)
                .is_some_and(|slot| self.conns[slot].stream.is_handshaking());
            if late && !self.conns[slot].closing {
                let conn = self.unlist(slot);
                log::debug!(
                    "{}: closed: no TLS handshake within {HANDSHAKE_MS} ms",
                    who(&conn)
                );
            }
        }
    }

    /// A connection in a peer-reserved slot that is not (or not yet) a
    /// peer link: `E - - too-many-connections` and closed, at once. The
    /// owner never heard of it.
    fn refuse_peer_slot(&mut self, slot: usize) {
        self.peer_only.retain(|(s, _, _)| *s != slot);
        let Some(conn) = self.conns.get(slot) else {
            return;
        };
        if !conn.peer_only || conn.closing {
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

    fn accept_some(&mut self) {
        self.accept_pending = false;
        for _ in 0..ACCEPT_BATCH {
            let Some(listener) = &self.listener else {
                return;
            };
            match listener.accept() {
                Ok((stream, addr)) => self.admit(stream, addr),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of file descriptors and the like: try again next round.
                    log::warn!(
                        "I/O loop {}: accept failed: {e}{}",
                        self.index,
                        if e.raw_os_error() == Some(libc::EMFILE) {
                            " (out of file descriptors: raise the open-file limit to --max-conns + 256)"
                        } else {
                            ""
                        }
                    );
                    return;
                }
            }
        }
        self.accept_pending = true;
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
        entry.insert(Conn {
            stream,
            id,
            partial: Vec::new(),
            output: Vec::new(),
            written: 0,
            closing: false,
            forgotten: false,
            cut_off: false,
            farewell: None,
            said_end: false,
            lingering: false,
            dirty: false,
            paused: false,
            inflight: 0,
            owed: 0,
            held_input: false,
            backlogged: false,
            fresh: true,
            peer_only,
            gate: if self.settings.auth.is_some() {
                Gate::Awaiting
            } else {
                Gate::Open
            },
        });
        if peer_only {
            let deadline = Instant::now() + Duration::from_millis(PEER_SLOT_MS);
            self.peer_only.push((slot, id, deadline));
        }
        if self.settings.tls.is_some() {
            // As for the authentication deadlines below: entries of
            // handshakes done or connections gone are dropped when they
            // outnumber the open connections (amortised O(1)).
            if self.handshakes.len() >= 2 * self.conns.len() + 64 {
                let conns = &self.conns;
                self.handshakes.retain(|&(slot, id, _)| {
                    conns
                        .get(slot)
                        .is_some_and(|c| c.id == id && c.stream.is_handshaking())
                });
            }
            let deadline = Instant::now() + Duration::from_millis(HANDSHAKE_MS);
            self.handshakes.push_back((slot, id, deadline));
        }
        if self.settings.auth.is_some() {
            // Entries of connections gone or through the gate wait for
            // their deadline; drop them when they outnumber the open
            // connections, so churn cannot grow the queue (amortised O(1)).
            if self.auth_deadlines.len() >= 2 * self.conns.len() + 64 {
                let conns = &self.conns;
                self.auth_deadlines.retain(|&(slot, id, _)| {
                    conns
                        .get(slot)
                        .is_some_and(|c| c.id == id && c.gate == Gate::Awaiting)
                });
            }
            let deadline = Instant::now() + AUTH_DEADLINE;
            self.auth_deadlines.push_back((slot, id, deadline));
        }
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
        if self.conns[slot].lingering {
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
            if conn.closing || conn.forgotten || conn.gate == Gate::Rejected {
                return;
            }
            if !self.batch.is_empty() && self.to_owner.is_full() {
                // Backpressure: the owner's channel is full.
                self.schedule_read(slot);
                return;
            }
            if conn.pending_output() > PAUSE_OUTPUT || conn.owed >= MAX_OWED {
                conn.paused = true;
                return;
            }
            if conn.held_input {
                // Lines left over when MAX_OWED stopped the parse go first:
                // nothing more is read until they are taken.
                conn.held_input = false;
                if !self.take_input(slot, 0) {
                    return;
                }
                continue;
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
                if !conn.closing {
                    conn.partial = partial;
                }
                true
            }
            _ => false,
        }
    }

    /// Parse every complete line of `input`; return the bytes used, or None
    /// if the connection turned out to be a peer link and was handed over.
    fn parse_lines(&mut self, slot: usize, input: &[u8]) -> Option<usize> {
        let max_lease_ms = self.settings.max_lease_ms;
        let mut used = 0;
        if self.conns[slot].fresh && self.handover.is_some() && is_peer_line(input) {
            self.hand_over(slot, input);
            return None;
        }
        if self.conns[slot].peer_only {
            // Not a peer line (or not yet two bytes of one).
            if input.len() >= 2 || input.contains(&b'\n') {
                self.refuse_peer_slot(slot);
                return None;
            }
            return Some(0);
        }
        while used < input.len() {
            let conn = &mut self.conns[slot];
            if conn.owed >= MAX_OWED {
                // Owed too much: the rest waits (in `partial`, at most one
                // read's worth) until answers come back.
                conn.paused = true;
                conn.held_input = true;
                break;
            }
            let (n, result) = match protocol::parse_request(&input[used..], max_lease_ms) {
                Parsed::Incomplete => break,
                Parsed::Line { used: n, result } => (n, result),
            };
            used += n;
            self.conns[slot].fresh = false;
            if self.conns[slot].gate != Gate::Open {
                if !self.pass_gate(slot, result) {
                    // Closing, or rejected: the rest of the input is dropped.
                    return Some(input.len());
                }
                continue;
            }
            if self.settings.echo {
                // Benchmark floor: the same read, parse and write path,
                // answered with the line itself, without the lock owner.
                self.conns[slot]
                    .output
                    .extend_from_slice(&input[used - n..used]);
                self.mark_dirty(slot);
                continue;
            }
            let id = self.conns[slot].id;
            match result {
                Ok(Request::Auth { secret }) => {
                    if !self.handle_auth(slot, &secret) {
                        return Some(input.len());
                    }
                }
                Ok(request) => {
                    let conn = &mut self.conns[slot];
                    conn.inflight += 1;
                    conn.owed += owed_for(request.op(), request.key());
                    self.batch.push(Inbound::Request(id, request));
                }
                Err(LineError::Blank) => {}
                Err(LineError::Refused { op, key, reason }) => {
                    log::debug!(
                        "{}: refused {} {}: {}",
                        who(&self.conns[slot]),
                        op.as_char(),
                        key.as_ref().map_or("-".to_string(), |k| k.to_string()),
                        reason.as_str()
                    );
                    // Through the owner like every answer, so it leaves in
                    // request order.
                    let conn = &mut self.conns[slot];
                    conn.inflight += 1;
                    conn.owed += owed_for(op, key.as_ref());
                    self.batch.push(Inbound::Refused(id, op, key, reason));
                }
                Err(LineError::Fatal(reason)) => {
                    log::debug!(
                        "{}: line not understood: {}",
                        who(&self.conns[slot]),
                        reason.as_str()
                    );
                    self.gauges.io_counters.refused(reason);
                    self.close_with(slot, reason, reason.as_str());
                    break;
                }
            }
        }
        Some(used)
    }

    /// One line of a connection that has not authenticated: `U` with the
    /// right secret opens the gate; anything else closes the connection
    /// (at once, or after the delay for a wrong secret). False when nothing
    /// more is to be parsed.
    fn pass_gate(&mut self, slot: usize, result: Result<Request, LineError>) -> bool {
        match result {
            Err(LineError::Blank) => true,
            Ok(Request::Auth { secret }) => self.handle_auth(slot, &secret),
            Err(LineError::Refused { op: Op::Auth, .. }) => {
                // `U` with extra fields: a failed attempt like a wrong secret.
                self.gauges.io_counters.auth_request();
                self.reject(slot);
                false
            }
            Ok(_) | Err(_) => {
                self.gauges.io_counters.refused(Reason::AuthRequired);
                self.close_with(slot, Reason::AuthRequired, "a request before U");
                false
            }
        }
    }

    /// `U <secret>`: `U ok`, `E U - auth-disabled` without `--auth-file`, or
    /// a wrong secret rejected. False when nothing more is to be parsed.
    fn handle_auth(&mut self, slot: usize, secret: &Secret) -> bool {
        self.gauges.io_counters.auth_request();
        let Some(auth) = self.settings.auth.as_ref() else {
            self.gauges.io_counters.refused(Reason::AuthDisabled);
            let answer = Answer::Error {
                op: Some(Op::Auth),
                key: None,
                reason: Reason::AuthDisabled,
            };
            self.write_answer(slot, &answer);
            return true;
        };
        if auth.accepts(secret.as_bytes()) {
            self.conns[slot].gate = Gate::Open;
            self.gauges.io_counters.auth_ok();
            self.write_answer(slot, &Answer::AuthOk);
            return true;
        }
        self.reject(slot);
        false
    }

    /// A failed authentication: read nothing more; answer and close when
    /// the delay is up.
    fn reject(&mut self, slot: usize) {
        let conn = &mut self.conns[slot];
        log::debug!(
            "{}: wrong secret: closing in {} ms",
            who(conn),
            BAD_AUTH_DELAY.as_millis()
        );
        conn.gate = Gate::Rejected;
        conn.partial = Vec::new();
        let due = Instant::now() + BAD_AUTH_DELAY;
        self.delayed_closes.push_back((slot, conn.id, due));
    }

    /// Answer `E - - bad-auth` and close every rejected connection whose
    /// delay is up.
    fn answer_delayed_closes(&mut self) {
        let now = Instant::now();
        while let Some((slot, id)) = pop_due(&mut self.delayed_closes, now) {
            if self.live_slot(id).is_some() {
                self.gauges.io_counters.refused(Reason::BadAuth);
                self.close_with(slot, Reason::BadAuth, "wrong secret");
            }
        }
    }

    /// Close, with `E - - auth-required`, every connection whose time to
    /// authenticate is up and that has not (those that did, were rejected,
    /// closed or became peer links are just taken off).
    fn expire_auth_deadlines(&mut self) {
        let now = Instant::now();
        while let Some((slot, id)) = pop_due(&mut self.auth_deadlines, now) {
            let awaiting = self
                .live_slot(id)
                .is_some_and(|slot| self.conns[slot].gate == Gate::Awaiting);
            if awaiting && !self.conns[slot].closing {
                self.gauges.io_counters.refused(Reason::AuthRequired);
                self.close_with(slot, Reason::AuthRequired, "no U in time");
            }
        }
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
        if self.conns[slot].inflight == 0 {
            self.write_answer(slot, &fatal_answer(reason));
        } else {
            self.conns[slot].farewell = Some(reason);
        }
        self.start_close(slot, why);
    }

    /// Stop reading the connection and tell the owner; the slot is freed
    /// when the owner acknowledges and the output is flushed.
    fn start_close(&mut self, slot: usize, why: &str) {
        let conn = &mut self.conns[slot];
        if conn.closing {
            return;
        }
        log::debug!("{}: closing: {why}", who(conn));
        conn.closing = true;
        conn.partial = Vec::new();
        self.batch.push(Inbound::Closed(conn.id));
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

    fn apply_owner_batch(&mut self, batch: OwnerBatch) {
        for (id, answer) in &batch.answers {
            if let Some(slot) = self.live_slot(*id) {
                let conn = &mut self.conns[slot];
                conn.inflight = conn.inflight.saturating_sub(1);
                // With nothing left in flight nothing is owed, whatever the
                // sums say.
                conn.owed = match conn.inflight {
                    0 => 0,
                    _ => conn.owed.saturating_sub(answer_owed(answer)),
                };
                self.write_answer(slot, answer);
            }
        }
        for id in batch.forgotten {
            if let Some(slot) = self.live_slot(id) {
                if let Some(reason) = self.conns[slot].farewell.take() {
                    // Every answer owed is written: the last line now.
                    self.write_answer(slot, &fatal_answer(reason));
                }
                let conn = &mut self.conns[slot];
                conn.forgotten = true;
                if !conn.closing {
                    // Cut off by the owner (a limit): nothing more is read.
                    conn.closing = true;
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
        // TLS: records rustls still holds (a handshake, or what the socket
        // would not take) go out on the writable event too.
        if !failed && conn.stream.push_tls().is_err() {
            failed = true;
        }
        let pending = conn.pending_output();
        if conn.forgotten && pending == 0 && !failed && !conn.cut_off && !conn.said_end {
            // Everything owed is in rustls: under TLS the end is said after
            // it, and goes out with it.
            conn.said_end = true;
            if conn.stream.close_notify().is_err() {
                failed = true;
            }
        }
        // Under TLS, what rustls took is written only once it reaches the
        // socket: a connection is flushed when rustls holds nothing either.
        let flushed = pending == 0 && !conn.stream.tls_backlog();
        if pending == 0 {
            conn.output.clear();
            conn.written = 0;
            if conn.output.capacity() > IDLE_OUTPUT_CAPACITY {
                // An idle connection keeps little beyond its socket.
                conn.output.shrink_to(IDLE_OUTPUT_CAPACITY);
            }
        }
        if conn.lingering {
            return;
        }
        if conn.forgotten && (flushed || failed || conn.cut_off) {
            if flushed && !failed && !conn.cut_off {
                self.linger(slot);
            } else {
                self.free(slot);
            }
            return;
        }
        if failed || pending > MAX_OUTPUT {
            let conn = &mut self.conns[slot];
            if pending > MAX_OUTPUT {
                log::debug!("{}: cut off: {pending} bytes of answers unread", who(conn));
            }
            conn.cut_off = true;
            conn.output.clear();
            conn.written = 0;
            self.start_close(slot, "write failed or output over limit");
            return;
        }
        let conn = &mut self.conns[slot];
        let caught_up = conn.owed <= MAX_OWED / 2;
        if conn.paused && pending <= PAUSE_OUTPUT / 2 && caught_up {
            conn.paused = false;
            self.schedule_read(slot);
        }
    }

    /// Take a connection out of the loop: its slot, its registration, and
    /// its count (of clients, or of peer-reserved slots).
    fn unlist(&mut self, slot: usize) -> Conn {
        let mut conn = self.conns.remove(slot);
        let _ = self.poll.registry().deregister(&mut conn.stream);
        if conn.peer_only {
            self.peer_only.retain(|(s, _, _)| *s != slot);
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
        conn.lingering = true;
        let id = conn.id;
        // Input may be waiting already (its edge came before), or the
        // client may have closed already: then it goes now.
        if self.discard_input(slot) {
            self.free(slot);
            return;
        }
        self.lingers.push_back((slot, id, Instant::now() + LINGER));
    }

    /// Read and drop a lingering connection's input; free it once the
    /// client has closed.
    fn drain(&mut self, slot: usize) {
        if self.discard_input(slot) {
            self.free(slot);
        }
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

    /// Drop the lingering connections whose time is up (the client has not
    /// closed its side).
    fn expire_lingers(&mut self) {
        let now = Instant::now();
        while let Some((slot, id)) = pop_due(&mut self.lingers, now) {
            if self.live_slot(id).is_some() && self.conns[slot].lingering {
                self.free(slot);
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

/// The first entry of a deadline queue (kept in deadline order), taken
/// off if it is due at `now`.
fn pop_due(
    queue: &mut VecDeque<(usize, ConnId, Instant)>,
    now: Instant,
) -> Option<(usize, ConnId)> {
    let &(slot, id, due) = queue.front()?;
    if due > now {
        return None;
    }
    queue.pop_front();
    Some((slot, id))
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
        Op::Acquire | Op::Release | Op::Keep | Op::Query | Op::Auth => {
            key.map_or(0, |key| key.as_bytes().len() as u32) + ANSWER_ALLOWANCE
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

fn too_many_connections() -> Vec<u8> {
    let mut line = Vec::new();
    fatal_answer(Reason::TooManyConnections).write_to(&mut line);
    line
}

/// `E - - <reason>`: the answer before a close.
fn fatal_answer(reason: Reason) -> Answer {
    Answer::Error {
        op: None,
        key: None,
        reason,
    }
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

    /// A loop on a fresh loopback listener, with the owner's ends of its
    /// channels; its first round is done (nothing to accept).
    fn idle_loop(busy_poll_us: u64) -> (IoLoop, Receiver<ToOwner>, Sender<OwnerBatch>) {
        let config = Config {
            busy_poll_us,
            ..Config::default()
        };
        let settings = Arc::new(Settings::new(&config, "test".into()));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        listener.set_nonblocking(true).expect("non-blocking");
        let (to_owner, inbound) = crossbeam_channel::unbounded();
        let (answers, from_owner) = crossbeam_channel::unbounded();
        let (mut io_loop, _waker, _awake) = IoLoop::new(
            0,
            &listener,
            to_owner,
            from_owner,
            None,
            settings,
            Arc::default(),
        )
        .expect("a loop");
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
        assert_eq!(io_loop.handshakes.len(), 1);
        assert_eq!(io_loop.gauges.conns.load(Ordering::Relaxed), 1);
        // Before the deadline it stays; after it, it is gone.
        io_loop.expire_handshakes(admitted);
        assert_eq!(io_loop.conns.len(), 1);
        let late = Instant::now() + Duration::from_millis(HANDSHAKE_MS + 1);
        io_loop.expire_handshakes(late);
        assert!(io_loop.conns.is_empty() && io_loop.handshakes.is_empty());
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
            if io_loop.conns.iter().any(|(_, c)| c.forgotten)
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
    fn a_loop_with_a_delayed_close_wakes_for_it_and_not_before() {
        let (mut io_loop, _inbound, _answers) = idle_loop(0);
        let due = Instant::now() + BAD_AUTH_DELAY;
        io_loop
            .delayed_closes
            .push_back((0, ConnId::new(0, 0, 1), due));
        let timeout = io_loop
            .poll_timeout()
            .expect("a timeout, not an endless sleep");
        assert!(
            timeout > Duration::ZERO && timeout <= BAD_AUTH_DELAY,
            "{timeout:?}"
        );
        // Not due yet: the round leaves it; once due (the slot is long
        // gone here), it is taken off.
        io_loop.round();
        assert_eq!(io_loop.delayed_closes.len(), 1);
        io_loop.delayed_closes[0].2 = Instant::now();
        io_loop.round();
        assert!(io_loop.delayed_closes.is_empty());
        assert_eq!(io_loop.poll_timeout(), None);
    }

    /// A loop whose node wants `SECRET`, and its address.
    fn gated_loop() -> (IoLoop, SocketAddr, Receiver<ToOwner>) {
        use crate::server::trust::client_auth::{ClientAuth, SecretSet};
        let mut settings = Settings::new(&Config::default(), "test".into());
        let secrets = SecretSet::from_file_contents(SECRET.as_bytes()).expect("a secret");
        settings.auth = Some(Arc::new(ClientAuth::new("/unused".into(), secrets)));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        listener.set_nonblocking(true).expect("non-blocking");
        let addr = listener.local_addr().expect("addr");
        let (to_owner, inbound) = crossbeam_channel::unbounded();
        let (_answers, from_owner) = crossbeam_channel::unbounded();
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
        (io_loop, addr, inbound)
    }

    const SECRET: &str = "alpha-secret-0123456789";

    /// A loop with no gate on a fresh listener: its address, and the
    /// owner's ends of its channels.
    fn open_loop() -> (IoLoop, SocketAddr, Receiver<ToOwner>, Sender<OwnerBatch>) {
        let settings = Arc::new(Settings::new(&Config::default(), "test".into()));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        listener.set_nonblocking(true).expect("non-blocking");
        let addr = listener.local_addr().expect("addr");
        let (to_owner, inbound) = crossbeam_channel::unbounded();
        let (answers, from_owner) = crossbeam_channel::unbounded();
        let (io_loop, _waker, _awake) = IoLoop::new(
            0,
            &listener,
            to_owner,
            from_owner,
            None,
            settings,
            Arc::default(),
        )
        .expect("a loop");
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
            let mut client = connect_and_send(&mut io_loop, addr, "X\n", closing);
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
            while !io_loop.conns.iter().any(|(_, c)| c.lingering) {
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
                assert!(timeout <= LINGER, "{timeout:?}");
                io_loop.lingers[0].2 = Instant::now();
                io_loop.round();
                assert!(io_loop.conns.is_empty(), "dropped when its time is up");
            }
            io_loop.lingers.clear();
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
        io_loop.conns.iter().any(|(_, c)| c.gate == Gate::Open)
    }

    fn closing(io_loop: &IoLoop) -> bool {
        io_loop.conns.iter().any(|(_, c)| c.closing)
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
        let _wrong = connect_and_send(&mut io_loop, addr, "U wrong-secret-0123456789\n", |l| {
            !l.delayed_closes.is_empty()
        });
        assert_eq!(io_loop.delayed_closes.len(), 1);
        let (slot, _, _) = io_loop.delayed_closes[0];
        assert_eq!(io_loop.conns[slot].gate, Gate::Rejected);
        let mut right = connect_and_send(&mut io_loop, addr, &format!("U {SECRET}\n"), opened);
        assert_eq!(read_line(&mut right), "U ok");
    }

    #[test]
    fn however_many_wrong_secrets_wait_out_their_delay_a_right_one_is_let_in() {
        let (mut io_loop, addr, _inbound) = gated_loop();
        let later = Instant::now() + Duration::from_secs(3600);
        for serial in 0..10_000u32 {
            let id = ConnId::new(0, 1 << 20, serial);
            io_loop.delayed_closes.push_back((1 << 20, id, later));
        }
        let mut client = connect_and_send(&mut io_loop, addr, &format!("U {SECRET}\n"), opened);
        assert_eq!(read_line(&mut client), "U ok");
        // And a wrong one still waits its turn, behind the others.
        let _wrong = connect_and_send(&mut io_loop, addr, "U wrong-secret-0123456789\n", |l| {
            l.delayed_closes.len() > 10_000
        });
        assert!(io_loop.conns.iter().any(|(_, c)| c.gate == Gate::Rejected));
    }

    #[test]
    fn a_connection_silent_past_the_auth_deadline_is_closed() {
        let (mut io_loop, addr, _inbound) = gated_loop();
        let mut silent = connect_and_send(&mut io_loop, addr, "", |l| !l.conns.is_empty());
        assert_eq!(io_loop.auth_deadlines.len(), 1);
        let timeout = io_loop.poll_timeout().expect("a wake-up for the deadline");
        assert!(timeout <= AUTH_DEADLINE, "{timeout:?}");
        // Not due yet: nothing happens.
        io_loop.round();
        assert!(!closing(&io_loop));
        // Due: answered and closed, without a line from the client.
        io_loop.auth_deadlines[0].2 = Instant::now();
        io_loop.round();
        assert!(closing(&io_loop));
        assert!(io_loop.auth_deadlines.is_empty());
        assert_eq!(read_line(&mut silent), "E - - auth-required");
        // One that authenticated in time is left alone when its deadline
        // comes.
        let (mut io_loop, addr, _inbound) = gated_loop();
        let mut right = connect_and_send(&mut io_loop, addr, &format!("U {SECRET}\n"), opened);
        assert_eq!(read_line(&mut right), "U ok");
        io_loop.auth_deadlines[0].2 = Instant::now();
        io_loop.round();
        assert!(io_loop.auth_deadlines.is_empty());
        assert!(opened(&io_loop) && !closing(&io_loop));
    }

    #[test]
    fn auth_deadlines_of_gone_connections_do_not_pile_up() {
        let (mut io_loop, addr, _inbound) = gated_loop();
        // Entries of connections long gone (as after a storm of short
        // connections), all due far off.
        let later = Instant::now() + Duration::from_secs(3600);
        for serial in 0..10_000u32 {
            let id = ConnId::new(0, 1 << 20, serial);
            io_loop.auth_deadlines.push_back((1 << 20, id, later));
        }
        let _client = connect_and_send(&mut io_loop, addr, "", |l| !l.conns.is_empty());
        // Only the live, waiting connection's entry is left.
        assert_eq!(io_loop.auth_deadlines.len(), 1);
    }

    /// Run the loop as `run` does (poll, events, round) once.
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
    fn a_connection_owed_max_owed_is_parsed_no_further_until_answers_come_back() {
        let (mut io_loop, inbound, answers) = idle_loop(0);
        let addr = io_loop
            .listener
            .as_ref()
            .expect("listening")
            .local_addr()
            .expect("addr");
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
                    assert!(conn.paused && conn.held_input && !conn.partial.is_empty());
                    assert_eq!(conn.owed, MAX_OWED);
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
        assert_eq!((conn.inflight, conn.owed), (0, 0));
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
}
