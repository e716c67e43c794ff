//! One client connection's decisions, as a plain state machine: the
//! authentication gate, the peer-reserved slot, the budget of answers
//! owed, the farewell line and the lingering close, and the deadlines of
//! all of these.
//!
//! Owns: [`Connection`]. An I/O loop (`threads/io_loop.rs`) holds one per
//! socket beside the socket, its buffers and its TLS session, tells it
//! what happened (a line parsed and what kind, a request forwarded, an
//! answer written back, the owner's acknowledgement of a close, what a
//! flush left unsent, the end of input, the time) and carries out what it
//! answers (forward, write this line, close, hand the socket to
//! replication, half-close and linger, free the slot). Its deadlines go
//! into the loop's one queue (`deadlines.rs`) through
//! [`Connection::take_new_deadline`]; when one is due the loop calls
//! [`Connection::tick`].
//!
//! The rules it keeps:
//! - with `--auth-file` a connection starts [`Gate::Awaiting`] `U
//!   <secret>`: a right secret opens the gate (`U ok`); any other line
//!   first ends the connection with `E - - auth-required`; a wrong secret
//!   (or a `U` with extra fields) stops all reading and, no sooner than
//!   [`BAD_AUTH_DELAY_MS`] later, ends it with `E - - bad-auth`. One that
//!   has not authenticated [`AUTH_DEADLINE_MS`] after it was accepted
//!   ends with `E - - auth-required`. On an open connection a `U` is
//!   checked again the same way, but one with extra fields there is
//!   refused like any request (it offers no secret); without
//!   `--auth-file` a `U` gets `E U - auth-disabled`;
//! - in protected mode (no `--bind`, no client authentication, no cluster
//!   key: `Config::protected_mode`) a client not on loopback starts
//!   [`Gate::Protected`]: its first line but a blank one (a peer link's
//!   `P HELLO` goes to replication before any line is parsed) ends the
//!   connection with `E - - protected-mode`, and so does saying nothing
//!   for [`AUTH_DEADLINE_MS`];
//! - a connection admitted past `--max-conns` into a slot kept for peer
//!   links may only become one: its first line must be a peer's, within
//!   [`PEER_SLOT_MS`], or it is refused (`E - - too-many-connections`);
//! - requests forwarded and not answered yet are owed [`MAX_OWED`] bytes
//!   at most (the loop says what each costs): at the bound parsing stops
//!   (the rest of the input is held, parsed first when reading resumes),
//!   and reading resumes once half of it is answered and the unsent
//!   output is under half of [`PAUSE_OUTPUT`]; output unsent past
//!   [`MAX_OUTPUT`] cuts the client off;
//! - an `E - - <reason>` that ends a connection is its last line: written
//!   at once if nothing is owed, else once the owner has acknowledged the
//!   close (its answers come before that). Once everything is written the
//!   connection half-closes and lingers, its input read and dropped, until
//!   the client closes or [`LINGER_MS`] is up; one cut off or whose write
//!   failed is freed at once;
//! - under TLS, a handshake not done by its deadline drops the connection
//!   (the owner never heard of it).
//!
//! Time is passed in ([`Now`]); a deadline is set from the rounded-up
//! time and fires at the rounded-down one, so it never fires early.
//!
//! Never does: I/O, read a clock, parse, or count metrics (the loop counts
//! what the verdicts say).

use crate::protocol::{Answer, Reason};
use crate::server::core::now::Now;
use crate::server::core::peer_msg::is_peer_line;

/// Unsent answer bytes past which a connection is not read until it
/// drains to half of this.
pub const PAUSE_OUTPUT: usize = 256 * 1024;
/// What one connection may be owed, in bytes, by requests it has sent to
/// the owner and not had answered yet (its waiters included): past it,
/// parsing stops (mid-buffer: the rest waits in the connection's partial
/// buffer) and the connection is not read until half of it is answered.
/// With the output's own bound this keeps what a client that floods
/// requests and never reads can cost near `PAUSE_OUTPUT`, whatever its
/// requests are.
pub const MAX_OWED: u32 = 2 * PAUSE_OUTPUT as u32;
/// Unsent answer bytes past which a connection is cut off.
pub const MAX_OUTPUT: usize = 4 * 1024 * 1024;
/// A connection admitted past `--max-conns` into a slot reserved for peers
/// must show itself as a peer link within this, or it is closed.
pub const PEER_SLOT_MS: u64 = 1_000;
/// A wrong secret is answered and its connection closed this long after it
/// arrived, to slow down guessing.
pub const BAD_AUTH_DELAY_MS: u64 = 100;
/// With `--auth-file`, a connection must have authenticated this long after
/// it was accepted, or it is closed.
pub const AUTH_DEADLINE_MS: u64 = 10_000;
/// A connection the server ends, its answers all with the kernel, is
/// half-closed (FIN) and read, its input dropped, until the client closes
/// too or this long has passed. (Closing a socket with unread input makes
/// the kernel reset the connection, and a reset discards the answers the
/// client had not yet read.)
pub const LINGER_MS: u64 = 1_000;

/// Where a connection stands with client authentication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// No `--auth-file`, or the connection has authenticated.
    Open,
    /// `--auth-file`: the first request must be `U <secret>`.
    Awaiting,
    /// A wrong secret: nothing more is read; `E - - bad-auth` and the close
    /// come when its delay is up.
    Rejected,
    /// Protected mode, a client not on loopback: its first line is
    /// answered `E - - protected-mode` and the connection closed.
    Protected,
}

/// What a connection is, from its accept on.
#[derive(Clone, Copy, Debug, Default)]
pub struct Opening {
    /// `--auth-file`: the connection starts at the gate.
    pub gated: bool,
    /// Protected mode and a client not on loopback: refused at its first
    /// line (a peer link is not a line: it is handed over before).
    pub protected: bool,
    /// `--echo` (the benchmark floor): an open connection's lines are
    /// echoed, not forwarded.
    pub echo: bool,
    /// The node takes peer links (a cluster node): a first line that is a
    /// peer's hands the connection to replication.
    pub takes_peers: bool,
    /// Admitted past `--max-conns` into a slot kept for peer links.
    pub peer_only: bool,
    /// Under TLS: the ms its handshake must be done in.
    pub handshake_ms: Option<u64>,
}

/// A line as the loop parsed it: only what the rules look at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Line {
    Blank,
    /// A request for the owner, costing `cost` bytes against [`MAX_OWED`].
    Request {
        cost: u32,
    },
    /// A request refused as it was parsed (answered through the owner, so
    /// it leaves in order); `auth`: it was a `U` (with extra fields).
    Refused {
        cost: u32,
        auth: bool,
    },
    /// `U <secret>`, and what the node's secrets say of it.
    Auth(Secret),
    /// A line not understood: the connection ends with this reason.
    Fatal(Reason),
}

/// What the node's secrets say of a `U <secret>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Secret {
    /// No `--auth-file`.
    Disabled,
    Right,
    Wrong,
}

/// What to do with a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing (a blank line).
    Skip,
    /// Write the line back as it came (`--echo`).
    Echo,
    /// Send it to the owner (its cost is now owed).
    Forward,
    /// A right secret: the gate is open; write `U ok` (a `U` checked, and
    /// let in).
    LetIn,
    /// Write `E U - auth-disabled` (a `U` checked, and refused).
    AuthDisabled,
    /// A failed `U`: parse and read nothing more; the connection ends at
    /// its deadline (a `U` checked).
    Rejected,
    /// End the connection with `E - - <reason>` (a refusal to count);
    /// the rest of the input is dropped.
    End(Reason),
}

/// What to do with the input read so far, before its lines are parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// Parse its lines.
    Lines,
    /// A peer link: hand the socket and the input to replication.
    PeerLink,
    /// In a peer-reserved slot, and not a peer's line: refuse it.
    RefusePeerSlot,
    /// In a peer-reserved slot, too short to tell yet: read more.
    Wait,
}

/// The next step of reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadStep {
    /// Read from the socket.
    Read,
    /// Parse the input held back at the owed bound first.
    Held,
    /// Paused by the output or the owed budget: read nothing until a flush
    /// says [`Flushed::Resume`].
    Pause,
}

/// The end of a connection, decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ending {
    /// The farewell to write now (nothing owed before it); else it waits
    /// for the owner's acknowledgement.
    pub say_now: Option<Answer>,
    /// The connection was not closing yet: tell the owner.
    pub tell_owner: bool,
}

/// What a flush left the connection to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flushed {
    /// Nothing to do.
    Stay,
    /// Everything is written: half-close it and [`Connection::linger`].
    Linger,
    /// Done with, nothing more to wait for (cut off or failed): free it.
    Free,
    /// Its output is dropped (a failed write or unread past
    /// [`MAX_OUTPUT`]): close it (see [`Connection::end`]).
    CutOff,
    /// Paused and caught up: read it again.
    Resume,
}

/// What the end of a connection's input means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtEof {
    /// It was lingering: free it.
    Free,
    /// Closing now: tell the owner.
    TellOwner,
    /// Already closing: nothing.
    Nothing,
}

/// A deadline that came, with something to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// In a peer-reserved slot and no peer link in time: refuse it.
    RefusePeerSlot,
    /// A wrong secret's delay is up: end it with `E - - bad-auth`.
    BadAuth,
    /// Still in its TLS handshake: drop it, without a word.
    HandshakeLate,
    /// Not authenticated in time: end it with `E - - auth-required`.
    AuthRequired,
    /// Protected mode: a client not on loopback said nothing in time: end
    /// it with `E - - protected-mode`.
    ProtectedMode,
    /// Lingered its time: free it.
    LingerOver,
}

/// One connection's state, as the rules see it.
#[derive(Clone, Debug)]
pub struct Connection {
    gate: Gate,
    echo: bool,
    takes_peers: bool,
    peer_only: bool,
    /// No line has been parsed yet (a peer link announces itself on its
    /// first line).
    fresh: bool,
    /// No more reading: EOF, error, a fatal line, or the loop stopping.
    closing: bool,
    /// The owner has forgotten this connection: free it once flushed.
    forgotten: bool,
    /// Its unsent output is dropped, not waited for.
    cut_off: bool,
    /// The `E - - <reason>` of a close, to be written once the owner has
    /// answered everything before it.
    farewell: Option<Reason>,
    /// Forgotten, everything owed handed to the stream, and under TLS a
    /// `close_notify` asked for after it.
    said_end: bool,
    /// Half-closed: input is read and dropped until the client closes or
    /// the linger deadline.
    lingering: bool,
    /// Reading paused by the output or the owed budget.
    paused: bool,
    /// Parsing stopped at MAX_OWED: the partial buffer may hold complete
    /// lines, parsed before anything more is read.
    held_input: bool,
    /// Requests forwarded and not answered yet.
    inflight: u32,
    /// What they cost against MAX_OWED.
    owed: u32,
    peer_slot_due: Option<u64>,
    handshake_due: Option<u64>,
    auth_due: Option<u64>,
    bad_auth_due: Option<u64>,
    linger_due: Option<u64>,
    /// The deadline last handed to the loop's queue, not yet fired.
    armed: Option<u64>,
}

/// `E - - <reason>`: the answer before a close.
pub fn fatal_answer(reason: Reason) -> Answer {
    Answer::Error {
        op: None,
        key: None,
        reason,
    }
}

impl Connection {
    /// A connection accepted at `now`.
    pub fn new(now: Now, opening: Opening) -> Connection {
        let at = |ms: u64| now.ms_ceil.saturating_add(ms);
        Connection {
            gate: if opening.protected {
                Gate::Protected
            } else if opening.gated {
                Gate::Awaiting
            } else {
                Gate::Open
            },
            echo: opening.echo,
            takes_peers: opening.takes_peers,
            peer_only: opening.peer_only,
            fresh: true,
            closing: false,
            forgotten: false,
            cut_off: false,
            farewell: None,
            said_end: false,
            lingering: false,
            paused: false,
            held_input: false,
            inflight: 0,
            owed: 0,
            peer_slot_due: opening.peer_only.then(|| at(PEER_SLOT_MS)),
            handshake_due: opening.handshake_ms.map(at),
            auth_due: (opening.gated || opening.protected).then(|| at(AUTH_DEADLINE_MS)),
            bad_auth_due: None,
            linger_due: None,
            armed: None,
        }
    }

    pub fn gate(&self) -> Gate {
        self.gate
    }

    /// In a peer-reserved slot (counted there, not among the clients).
    pub fn peer_only(&self) -> bool {
        self.peer_only
    }

    pub fn is_closing(&self) -> bool {
        self.closing
    }

    pub fn is_forgotten(&self) -> bool {
        self.forgotten
    }

    pub fn is_lingering(&self) -> bool {
        self.lingering
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    pub fn holds_input(&self) -> bool {
        self.held_input
    }

    /// Its end (a `close_notify` under TLS) has been asked for.
    pub fn said_end(&self) -> bool {
        self.said_end
    }

    /// Requests forwarded and not answered yet.
    pub fn inflight(&self) -> u32 {
        self.inflight
    }

    /// What they cost against [`MAX_OWED`].
    pub fn owed(&self) -> u32 {
        self.owed
    }

    /// Input is read and parsed (not closing, forgotten or rejected).
    pub fn reads(&self) -> bool {
        !self.closing && !self.forgotten && self.gate != Gate::Rejected
    }

    /// The next step of reading, with `pending_output` bytes unsent.
    pub fn read_step(&mut self, pending_output: usize) -> ReadStep {
        if pending_output > PAUSE_OUTPUT || self.owed >= MAX_OWED {
            self.paused = true;
            ReadStep::Pause
        } else if self.held_input {
            self.held_input = false;
            ReadStep::Held
        } else {
            ReadStep::Read
        }
    }

    /// What to do with `input`, all of the input not yet parsed.
    pub fn on_input(&self, input: &[u8]) -> Input {
        if self.fresh && self.takes_peers && is_peer_line(input) {
            Input::PeerLink
        } else if !self.peer_only {
            Input::Lines
        } else if input.len() >= 2 || input.contains(&b'\n') {
            Input::RefusePeerSlot
        } else {
            Input::Wait
        }
    }

    /// Whether one more line may be parsed: not once [`MAX_OWED`] is owed
    /// (then reading pauses and the rest of the input is held).
    pub fn may_parse(&mut self) -> bool {
        if self.owed >= MAX_OWED {
            self.paused = true;
            self.held_input = true;
            return false;
        }
        true
    }

    /// A line parsed: what to do with it. `now` is asked for only when the
    /// line sets a deadline (a failed `U`), so that the loop reads no clock
    /// per line.
    pub fn line(&mut self, now: impl FnOnce() -> Now, line: Line) -> Verdict {
        self.fresh = false;
        match self.gate {
            Gate::Open => {}
            Gate::Rejected => return Verdict::Rejected,
            Gate::Protected => {
                return match line {
                    Line::Blank => Verdict::Skip,
                    _ => Verdict::End(Reason::ProtectedMode),
                };
            }
            Gate::Awaiting => {
                return match line {
                    Line::Blank => Verdict::Skip,
                    Line::Auth(secret) => self.check(now, secret),
                    // `U` with extra fields: a failed attempt like a wrong
                    // secret.
                    Line::Refused { auth: true, .. } => self.reject(now),
                    _ => Verdict::End(Reason::AuthRequired),
                };
            }
        }
        if self.echo {
            return Verdict::Echo;
        }
        match line {
            Line::Blank => Verdict::Skip,
            Line::Request { cost } | Line::Refused { cost, .. } => {
                self.inflight += 1;
                self.owed = self.owed.saturating_add(cost);
                Verdict::Forward
            }
            Line::Auth(secret) => self.check(now, secret),
            Line::Fatal(reason) => Verdict::End(reason),
        }
    }

    fn check(&mut self, now: impl FnOnce() -> Now, secret: Secret) -> Verdict {
        match secret {
            Secret::Disabled => Verdict::AuthDisabled,
            Secret::Right => {
                self.gate = Gate::Open;
                self.auth_due = None;
                Verdict::LetIn
            }
            Secret::Wrong => self.reject(now),
        }
    }

    fn reject(&mut self, now: impl FnOnce() -> Now) -> Verdict {
        self.gate = Gate::Rejected;
        self.bad_auth_due = Some(now().ms_ceil.saturating_add(BAD_AUTH_DELAY_MS));
        Verdict::Rejected
    }

    /// An answer written back, paying back `cost` (what its request cost).
    pub fn answered(&mut self, cost: u32) {
        self.inflight = self.inflight.saturating_sub(1);
        // With nothing left in flight nothing is owed, whatever the sums say.
        self.owed = match self.inflight {
            0 => 0,
            _ => self.owed.saturating_sub(cost),
        };
    }

    /// End the connection with `E - - <reason>`, its last line.
    pub fn end_with(&mut self, reason: Reason) -> Ending {
        let say_now = if self.inflight == 0 {
            Some(fatal_answer(reason))
        } else {
            self.farewell = Some(reason);
            None
        };
        Ending {
            say_now,
            tell_owner: self.end(),
        }
    }

    /// Stop reading; true if it was not closing yet (tell the owner).
    pub fn end(&mut self) -> bool {
        !std::mem::replace(&mut self.closing, true)
    }

    /// The loop is stopping: nothing more is parsed (the owner is not
    /// told; the connection is forgotten once nothing is owed).
    pub fn stop(&mut self) {
        self.closing = true;
    }

    /// The owner has forgotten the connection (acknowledged its close, or
    /// cut it off): the farewell to write now, after every answer.
    pub fn owner_forgot(&mut self) -> Option<Answer> {
        self.forgotten = true;
        self.closing = true;
        self.farewell.take().map(fatal_answer)
    }

    /// The end of input (or a failed read).
    pub fn input_ended(&mut self) -> AtEof {
        if self.lingering {
            AtEof::Free
        } else if self.end() {
            AtEof::TellOwner
        } else {
            AtEof::Nothing
        }
    }

    /// After a flush left `pending` bytes unsent (`failed`: a write
    /// failed): whether to say the end now (under TLS, a `close_notify`
    /// after the last answer). Asked once.
    pub fn end_to_say(&mut self, pending: usize, failed: bool) -> bool {
        let say = self.forgotten && pending == 0 && !failed && !self.cut_off && !self.said_end;
        if say {
            self.said_end = true;
        }
        say
    }

    /// After a flush: `pending` bytes unsent by the loop, `in_stream`:
    /// bytes still held below it (rustls), `failed`: a write failed.
    pub fn flushed(&mut self, pending: usize, in_stream: bool, failed: bool) -> Flushed {
        if self.lingering {
            return Flushed::Stay;
        }
        let all_out = pending == 0 && !in_stream;
        if self.forgotten && (all_out || failed || self.cut_off) {
            return if all_out && !failed && !self.cut_off {
                Flushed::Linger
            } else {
                Flushed::Free
            };
        }
        if failed || pending > MAX_OUTPUT {
            self.cut_off = true;
            return Flushed::CutOff;
        }
        if self.paused && pending <= PAUSE_OUTPUT / 2 && self.owed <= MAX_OWED / 2 {
            self.paused = false;
            return Flushed::Resume;
        }
        Flushed::Stay
    }

    /// Half-closed at `now`: lingers until the client closes or
    /// [`LINGER_MS`] is up.
    pub fn linger(&mut self, now: Now) {
        self.lingering = true;
        self.linger_due = Some(now.ms_ceil.saturating_add(LINGER_MS));
    }

    /// The earliest deadline that still matters.
    pub fn next_deadline(&self) -> Option<u64> {
        let live = !self.closing;
        [
            self.peer_slot_due.filter(|_| self.peer_only && live),
            self.bad_auth_due
                .filter(|_| self.gate == Gate::Rejected && !self.forgotten),
            self.handshake_due.filter(|_| live),
            self.auth_due
                .filter(|_| matches!(self.gate, Gate::Awaiting | Gate::Protected) && live),
            self.linger_due.filter(|_| self.lingering),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The next deadline, if the loop's queue does not already hold one
    /// as early (then it is marked as queued).
    pub fn take_new_deadline(&mut self) -> Option<u64> {
        let next = self.next_deadline()?;
        if self.armed.is_some_and(|armed| armed <= next) {
            return None;
        }
        self.armed = Some(next);
        Some(next)
    }

    /// Forget what was queued (the loop is rebuilding its queue) and
    /// return the next deadline to queue.
    pub fn rearm(&mut self) -> Option<u64> {
        self.armed = None;
        self.take_new_deadline()
    }

    /// A deadline of this connection came at `now` (`handshaking`: its TLS
    /// handshake is not done): the first thing due, if any. Deadlines past
    /// with nothing to do are dropped; call again (after the loop has done
    /// what is due) until it says `None`.
    pub fn tick(&mut self, now: Now, handshaking: bool) -> Option<Due> {
        if self.armed.is_some_and(|armed| armed <= now.ms) {
            self.armed = None;
        }
        let due = |at: &mut Option<u64>| match *at {
            Some(ms) if ms <= now.ms => {
                *at = None;
                true
            }
            _ => false,
        };
        if due(&mut self.peer_slot_due) && self.peer_only && !self.closing {
            return Some(Due::RefusePeerSlot);
        }
        if due(&mut self.bad_auth_due) && self.gate == Gate::Rejected && !self.forgotten {
            return Some(Due::BadAuth);
        }
        if due(&mut self.handshake_due) && handshaking && !self.closing {
            return Some(Due::HandshakeLate);
        }
        if due(&mut self.auth_due) && !self.closing {
            match self.gate {
                Gate::Awaiting => return Some(Due::AuthRequired),
                Gate::Protected => return Some(Due::ProtectedMode),
                Gate::Open | Gate::Rejected => {}
            }
        }
        if self.lingering && due(&mut self.linger_due) {
            return Some(Due::LingerOver);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::core::deadlines::Deadlines;

    /// A connection and the loop's queue of its deadlines, driven as the
    /// loop drives them.
    struct Driven {
        conn: Connection,
        queue: Deadlines<()>,
    }

    impl Driven {
        fn new(opening: Opening) -> Driven {
            Driven {
                conn: Connection::new(at(0), opening),
                queue: Deadlines::default(),
            }
        }

        /// Run the clock on to `until` ms: the first thing due, and when.
        fn advance(&mut self, until: u64, handshaking: bool) -> Option<(u64, Due)> {
            loop {
                if let Some(deadline) = self.conn.take_new_deadline() {
                    self.queue.push(deadline, ());
                }
                let next = self.queue.next().filter(|&next| next <= until)?;
                self.queue.pop_due(next);
                if let Some(due) = self.conn.tick(at(next), handshaking) {
                    return Some((next, due));
                }
            }
        }
    }

    fn at(ms: u64) -> Now {
        Now::at(ms, 0)
    }

    /// A reading between two milliseconds: `ms` rounded down.
    fn between(ms: u64) -> Now {
        Now {
            ms,
            ms_ceil: ms + 1,
            unix_ms: 0,
        }
    }

    fn gated() -> Opening {
        Opening {
            gated: true,
            ..Opening::default()
        }
    }

    #[test]
    fn a_wrong_secret_is_answered_and_closed_no_sooner_than_100_ms() {
        let mut c = Driven::new(gated());
        // Read at 5.x ms: the delay counts from 6.
        assert_eq!(
            c.conn.line(|| between(5), Line::Auth(Secret::Wrong)),
            Verdict::Rejected
        );
        assert_eq!(c.conn.gate(), Gate::Rejected);
        assert!(!c.conn.reads(), "a rejected connection reads nothing more");
        assert_eq!(c.conn.next_deadline(), Some(6 + BAD_AUTH_DELAY_MS));
        assert_eq!(c.advance(5 + BAD_AUTH_DELAY_MS, false), None);
        assert_eq!(
            c.advance(6 + BAD_AUTH_DELAY_MS, false),
            Some((6 + BAD_AUTH_DELAY_MS, Due::BadAuth))
        );
        let ending = c.conn.end_with(Reason::BadAuth);
        assert_eq!(ending.say_now, Some(fatal_answer(Reason::BadAuth)));
        assert!(ending.tell_owner);
        assert_eq!(c.advance(u64::MAX, false), None, "nothing else is due");
    }

    #[test]
    fn a_u_with_extra_fields_at_the_gate_is_a_failed_attempt_but_once_open_a_refusal() {
        let mut conn = Connection::new(at(0), gated());
        let extra = Line::Refused {
            cost: 64,
            auth: true,
        };
        assert_eq!(conn.line(|| at(1), extra), Verdict::Rejected);
        let mut conn = Connection::new(at(0), gated());
        assert_eq!(
            conn.line(|| at(1), Line::Auth(Secret::Right)),
            Verdict::LetIn
        );
        assert_eq!(conn.line(|| at(2), extra), Verdict::Forward);
        assert_eq!(conn.inflight(), 1);
    }

    #[test]
    fn protected_mode_ends_a_far_client_at_its_first_line_or_its_deadline() {
        let protected = Opening {
            protected: true,
            takes_peers: true,
            ..Opening::default()
        };
        // A peer link is handed over before any line is parsed.
        let conn = Connection::new(at(0), protected);
        assert_eq!(conn.on_input(b"P HELLO 0 2 x y\n"), Input::PeerLink);
        for first in [
            Line::Request { cost: 70 },
            Line::Auth(Secret::Disabled),
            Line::Fatal(Reason::UnknownOp),
        ] {
            let mut conn = Connection::new(at(0), protected);
            assert_eq!(conn.gate(), Gate::Protected);
            assert_eq!(conn.line(|| at(1), Line::Blank), Verdict::Skip);
            assert_eq!(
                conn.line(|| at(1), first),
                Verdict::End(Reason::ProtectedMode),
                "{first:?}"
            );
        }
        let mut c = Driven::new(protected);
        assert_eq!(
            c.advance(AUTH_DEADLINE_MS + 10, false),
            Some((AUTH_DEADLINE_MS, Due::ProtectedMode))
        );
        // Not protected (loopback, or the node is open): served as before.
        let mut open = Connection::new(at(0), Opening::default());
        assert_eq!(
            open.line(|| at(1), Line::Request { cost: 70 }),
            Verdict::Forward
        );
        assert_eq!(open.next_deadline(), None);
    }

    #[test]
    fn a_right_secret_opens_the_gate_and_any_other_first_line_ends_with_auth_required() {
        let mut conn = Connection::new(at(0), gated());
        assert_eq!(conn.line(|| at(1), Line::Blank), Verdict::Skip);
        assert_eq!(
            conn.line(|| at(1), Line::Auth(Secret::Right)),
            Verdict::LetIn
        );
        assert_eq!(conn.gate(), Gate::Open);
        assert_eq!(
            conn.line(|| at(2), Line::Request { cost: 70 }),
            Verdict::Forward
        );
        // Checked again on an open connection: a wrong one still rejects.
        assert_eq!(
            conn.line(|| at(3), Line::Auth(Secret::Right)),
            Verdict::LetIn
        );
        assert_eq!(
            conn.line(|| at(3), Line::Auth(Secret::Wrong)),
            Verdict::Rejected
        );
        for first in [
            Line::Request { cost: 70 },
            Line::Refused {
                cost: 70,
                auth: false,
            },
            Line::Fatal(Reason::UnknownOp),
        ] {
            let mut conn = Connection::new(at(0), gated());
            assert_eq!(
                conn.line(|| at(1), first),
                Verdict::End(Reason::AuthRequired)
            );
            assert_eq!(conn.inflight(), 0, "nothing reached the owner");
        }
    }

    #[test]
    fn without_an_auth_file_a_u_is_refused_as_auth_disabled() {
        let mut conn = Connection::new(at(0), Opening::default());
        assert_eq!(
            conn.line(|| at(1), Line::Auth(Secret::Disabled)),
            Verdict::AuthDisabled
        );
        assert_eq!(conn.next_deadline(), None, "no deadline without a gate");
    }

    #[test]
    fn a_connection_not_authenticated_by_its_deadline_ends_with_auth_required() {
        let mut c = Driven::new(gated());
        assert_eq!(c.advance(AUTH_DEADLINE_MS - 1, false), None);
        assert_eq!(
            c.advance(u64::MAX, false),
            Some((AUTH_DEADLINE_MS, Due::AuthRequired))
        );
        // One that authenticated in time is left alone.
        let mut c = Driven::new(gated());
        assert_eq!(
            c.conn.line(|| at(1), Line::Auth(Secret::Right)),
            Verdict::LetIn
        );
        assert_eq!(c.advance(u64::MAX, false), None);
    }

    #[test]
    fn a_fatal_line_closes_only_after_every_owed_answer_is_written() {
        let mut conn = Connection::new(at(0), Opening::default());
        for _ in 0..2 {
            assert_eq!(
                conn.line(|| at(1), Line::Request { cost: 70 }),
                Verdict::Forward
            );
        }
        let fatal = conn.line(|| at(1), Line::Fatal(Reason::LineTooLong));
        assert_eq!(fatal, Verdict::End(Reason::LineTooLong));
        // Two answers owed: the farewell waits, the owner is told (once).
        let ending = conn.end_with(Reason::LineTooLong);
        assert_eq!(
            ending,
            Ending {
                say_now: None,
                tell_owner: true
            }
        );
        assert!(!conn.reads());
        assert!(!conn.end(), "told once");
        conn.answered(70);
        conn.answered(70);
        // Not forgotten yet: it stays, whatever was written.
        assert_eq!(conn.flushed(0, false, false), Flushed::Stay);
        // The owner's acknowledgement comes after its answers: the
        // farewell now, then, once it is written, the linger.
        assert_eq!(conn.owner_forgot(), Some(fatal_answer(Reason::LineTooLong)));
        assert!(conn.end_to_say(0, false));
        assert!(!conn.end_to_say(0, false), "said once");
        assert_eq!(
            conn.flushed(0, true, false),
            Flushed::Stay,
            "rustls holds some"
        );
        assert_eq!(conn.flushed(0, false, false), Flushed::Linger);
        // With nothing owed, the farewell goes at once.
        let mut conn = Connection::new(at(0), Opening::default());
        assert_eq!(
            conn.end_with(Reason::UnknownOp).say_now,
            Some(fatal_answer(Reason::UnknownOp))
        );
        assert_eq!(conn.owner_forgot(), None, "said once only");
    }

    #[test]
    fn linger_ends_at_the_client_close_or_after_one_second() {
        for client_closes in [true, false] {
            let mut c = Driven::new(Opening::default());
            assert!(c.conn.end());
            assert_eq!(c.conn.owner_forgot(), None);
            assert_eq!(c.conn.flushed(0, false, false), Flushed::Linger);
            c.conn.linger(between(50));
            assert!(c.conn.is_lingering());
            assert_eq!(c.conn.flushed(0, false, false), Flushed::Stay);
            if client_closes {
                assert_eq!(c.conn.input_ended(), AtEof::Free);
            } else {
                assert_eq!(c.advance(50 + LINGER_MS, false), None);
                assert_eq!(
                    c.advance(u64::MAX, false),
                    Some((51 + LINGER_MS, Due::LingerOver))
                );
            }
        }
    }

    #[test]
    fn a_connection_cut_off_or_failing_a_write_is_freed_without_lingering() {
        let mut conn = Connection::new(at(0), Opening::default());
        assert_eq!(conn.flushed(MAX_OUTPUT, false, false), Flushed::Stay);
        assert_eq!(conn.flushed(MAX_OUTPUT + 1, false, false), Flushed::CutOff);
        assert!(conn.end());
        conn.owner_forgot();
        assert!(!conn.end_to_say(0, false), "no close_notify after a cut");
        assert_eq!(conn.flushed(0, false, false), Flushed::Free);
        let mut conn = Connection::new(at(0), Opening::default());
        conn.end();
        conn.owner_forgot();
        assert_eq!(conn.flushed(10, false, true), Flushed::Free);
    }

    fn peer_slot() -> Opening {
        Opening {
            takes_peers: true,
            peer_only: true,
            ..Opening::default()
        }
    }

    #[test]
    fn a_silent_connection_in_a_peer_slot_is_refused_after_the_peer_slot_time() {
        let mut c = Driven::new(peer_slot());
        assert!(c.conn.peer_only());
        assert_eq!(c.conn.on_input(b""), Input::Wait);
        assert_eq!(c.conn.on_input(b"P"), Input::Wait, "too short to tell");
        assert_eq!(c.advance(PEER_SLOT_MS - 1, false), None);
        assert_eq!(
            c.advance(u64::MAX, false),
            Some((PEER_SLOT_MS, Due::RefusePeerSlot))
        );
    }

    #[test]
    fn a_peer_slot_takes_a_peer_line_and_refuses_any_other() {
        let conn = Connection::new(at(0), peer_slot());
        assert_eq!(conn.on_input(b"P hello"), Input::PeerLink);
        assert_eq!(conn.on_input(b"A k"), Input::RefusePeerSlot);
        assert_eq!(conn.on_input(b"\n"), Input::RefusePeerSlot);
        // A client of a cluster node may become a peer link on its first
        // line only; a node that takes no peers parses every line.
        let mut client = Connection::new(
            at(0),
            Opening {
                takes_peers: true,
                ..Opening::default()
            },
        );
        assert_eq!(client.on_input(b"P hello"), Input::PeerLink);
        client.line(|| at(1), Line::Blank);
        assert_eq!(client.on_input(b"P hello"), Input::Lines);
        let single = Connection::new(at(0), Opening::default());
        assert_eq!(single.on_input(b"P hello"), Input::Lines);
    }

    #[test]
    fn parsing_stops_at_the_owed_budget_and_resumes_when_answers_are_written() {
        const COST: u32 = 1_000;
        let mut conn = Connection::new(at(0), Opening::default());
        let mut forwarded = 0;
        while conn.may_parse() {
            assert_eq!(
                conn.line(|| at(1), Line::Request { cost: COST }),
                Verdict::Forward
            );
            forwarded += 1;
        }
        assert_eq!(forwarded, MAX_OWED.div_ceil(COST));
        assert!(conn.is_paused() && conn.holds_input());
        assert_eq!(conn.read_step(0), ReadStep::Pause);
        // Answers come back: at half the budget (and little unsent) it
        // resumes, with the held input first.
        while conn.owed() > MAX_OWED / 2 {
            assert_eq!(conn.flushed(0, false, false), Flushed::Stay);
            conn.answered(COST);
        }
        assert_eq!(
            conn.flushed(PAUSE_OUTPUT / 2 + 1, false, false),
            Flushed::Stay
        );
        assert_eq!(
            conn.flushed(PAUSE_OUTPUT / 2, false, false),
            Flushed::Resume
        );
        assert!(!conn.is_paused());
        assert_eq!(conn.read_step(0), ReadStep::Held);
        assert_eq!(conn.read_step(0), ReadStep::Read);
        // Unsent output alone pauses it too.
        assert_eq!(conn.read_step(PAUSE_OUTPUT + 1), ReadStep::Pause);
        // Every answer pays back; with none in flight nothing is owed.
        while conn.inflight() > 0 {
            conn.answered(COST);
        }
        assert_eq!(conn.owed(), 0);
    }

    #[test]
    fn a_tls_handshake_not_done_by_its_deadline_drops_the_connection() {
        let tls = Opening {
            handshake_ms: Some(5_000),
            ..Opening::default()
        };
        let mut c = Driven::new(tls);
        assert_eq!(c.advance(4_999, true), None);
        assert_eq!(c.advance(u64::MAX, true), Some((5_000, Due::HandshakeLate)));
        // Done in time: its deadline passes with nothing to do.
        let mut c = Driven::new(tls);
        assert_eq!(c.advance(u64::MAX, false), None);
    }

    #[test]
    fn a_connection_queues_a_deadline_only_when_it_moves_earlier() {
        let mut conn = Connection::new(
            at(0),
            Opening {
                gated: true,
                handshake_ms: Some(5_000),
                ..Opening::default()
            },
        );
        assert_eq!(conn.take_new_deadline(), Some(5_000));
        assert_eq!(conn.take_new_deadline(), None, "already queued");
        conn.line(|| at(10), Line::Auth(Secret::Wrong));
        assert_eq!(conn.take_new_deadline(), Some(10 + BAD_AUTH_DELAY_MS));
        assert_eq!(conn.rearm(), Some(10 + BAD_AUTH_DELAY_MS));
        assert_eq!(
            conn.tick(at(10 + BAD_AUTH_DELAY_MS), true),
            Some(Due::BadAuth)
        );
        conn.end_with(Reason::BadAuth);
        // Closing: the handshake and authentication deadlines no longer
        // matter.
        assert_eq!(conn.next_deadline(), None);
    }
}
