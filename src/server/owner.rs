//! The lock-owner thread: the one thread that touches lock state.
//!
//! Owns: the node's [`LockTable`] and the node's serving mode (active,
//! standby, handing off). Receives batches of parsed requests from the I/O
//! loops and role changes, snapshots and deltas from the replication thread
//! over one crossbeam channel; applies them in arrival order; fires lease
//! expiries and wait deadlines on time; sends each I/O loop one batch of
//! answers per round, waking it once; and, when active in a cluster, sends
//! the round's deltas to the replication thread.
//!
//! Modes: an active node serves; a standby answers every request but `I`
//! with `M <active>` and applies what the active replicates; a node handing
//! off holds requests back until its successor confirms, then redirects them.
//!
//! Sleeps only until the next timer is due (or input arrives), after
//! polling its input for an adaptive window as the I/O loops do
//! (busy_poll.rs: waking a sleeping thread costs more than a round of work
//! when requests come at short intervals). Exits when
//! every sender (I/O loops, replication) is gone, which is the shutdown
//! signal.
//!
//! Never does: socket I/O, formatting, or blocking on anything but its own
//! input channel.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use mio::Waker;

use crate::protocol::{Answer, Key, Op, Reason, Request};
use crate::server::busy_poll::IdleStretch;
use crate::server::lock_table::{ConnId, Delta, LockTable, Outbox};
use crate::server::replication::{OwnerToRepl, ReplToOwner, ToRepl};
use crate::server::{Shared, tokens};

/// Most inbound messages drained per round before answers go out, so a
/// flood from the I/O loops cannot delay every answer indefinitely.
const MAX_MESSAGES_PER_ROUND: usize = 64;
/// Tokens reserved ahead of the last one issued: the ceiling replicated to
/// the standbys, so a promoted node starts above anything issued but not yet
/// replicated. Raised when half is used. Tokens follow the clock, so this is
/// `LEAD_MS` of clock: small, so that tokens never run far ahead of the
/// clock (a node restarting without memory starts `LEAD_MS` ahead).
const TOKEN_RESERVE: u64 = tokens::LEAD_MS << 20;
/// Requests held back during a handoff, at most; past it they are
/// redirected at once.
const MAX_HELD_BACK: usize = 100_000;

/// What an I/O loop tells the owner about one connection.
#[derive(Debug)]
pub enum Inbound {
    /// A well-formed request.
    Request(ConnId, Request),
    /// A request the parser refused, routed here so its `E` keeps its place
    /// among the connection's answers for the same (op, key).
    Refused(ConnId, Op, Option<Key>, Reason),
    /// The connection is closing: drop its waiters and acknowledge, after
    /// which no more answers for it will come.
    Closed(ConnId),
}

/// Everything the owner receives.
#[derive(Debug)]
pub enum OwnerMsg {
    Clients(Vec<Inbound>),
    Repl(ReplToOwner),
}

/// What the owner sends one I/O loop per round.
#[derive(Debug, Default)]
pub struct OwnerBatch {
    /// Answers in the order they must be written.
    pub answers: Vec<(ConnId, Answer)>,
    /// Connections the owner has forgotten (acknowledged closes, or cut off
    /// by the owner): flush what is pending, then close.
    pub forgotten: Vec<ConnId>,
}

/// The owner's link to one I/O loop.
pub struct WorkerLink {
    pub answers: Sender<OwnerBatch>,
    pub waker: Arc<Waker>,
    /// False while the loop may be asleep in `poll`.
    pub awake: Arc<std::sync::atomic::AtomicBool>,
}

/// The owner's link to the replication thread (cluster nodes only).
pub struct ReplLink {
    pub tx: Sender<ToRepl>,
    pub waker: Arc<Waker>,
}

/// A monotonic millisecond clock shared by the node's threads.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    pub fn new() -> Clock {
        Clock {
            start: Instant::now(),
        }
    }
    /// Milliseconds since the clock started, rounded down: the time to fire
    /// timers at (a deadline fires once it has fully passed).
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Milliseconds since the clock started, rounded up: the time requests
    /// are stamped with, so a deadline set from it (now + lease) is never
    /// before the moment the request really arrived + lease.
    pub fn now_ms_ceil(&self) -> u64 {
        let elapsed = self.start.elapsed();
        let ms = elapsed.as_millis() as u64;
        if elapsed.subsec_nanos().is_multiple_of(1_000_000) {
            ms
        } else {
            ms + 1
        }
    }
    pub fn instant_of(&self, ms: u64) -> Instant {
        self.start + std::time::Duration::from_millis(ms)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// How this node treats client requests right now.
#[derive(Debug)]
enum Mode {
    Active,
    Standby { active: Option<String> },
    HandingOff { held: Vec<Inbound> },
}

/// The lock-owner thread's state.
pub struct Owner {
    table: LockTable,
    clock: Clock,
    inbound: Receiver<OwnerMsg>,
    workers: Vec<WorkerLink>,
    repl: Option<ReplLink>,
    shared: Arc<Shared>,
    mode: Mode,
    ceiling: u64,
    /// A handoff finished this round: tell replication once answers are out.
    redirected_pending: bool,
    /// `--promotion-grace`.
    promotion_grace_ms: u64,
    outbox: Outbox,
    rounds: Vec<OwnerBatch>,
    /// Since when no message has come and no client was answered, and the
    /// polling window.
    idle: IdleStretch,
}

impl Owner {
    /// A single node (`repl` None) starts active; a cluster node starts as a
    /// standby that knows no active, until the replication thread decides.
    pub fn new(
        table: LockTable,
        clock: Clock,
        inbound: Receiver<OwnerMsg>,
        workers: Vec<WorkerLink>,
        repl: Option<ReplLink>,
        shared: Arc<Shared>,
    ) -> Owner {
        let rounds = workers.iter().map(|_| OwnerBatch::default()).collect();
        let promotion_grace_ms = shared.promotion_grace_ms;
        let busy_poll_max = shared.busy_poll;
        let mode = match repl {
            None => Mode::Active,
            Some(_) => Mode::Standby { active: None },
        };
        Owner {
            table,
            clock,
            inbound,
            workers,
            repl,
            shared,
            mode,
            ceiling: 0,
            redirected_pending: false,
            promotion_grace_ms,
            outbox: Outbox::default(),
            rounds,
            idle: IdleStretch::new(busy_poll_max),
        }
    }

    /// Run until every sender is gone.
    pub fn run(mut self) {
        let mut messages: Vec<OwnerMsg> = Vec::new();
        loop {
            if !self.wait_for_input(&mut messages) {
                break;
            }
            let now_ms = self.clock.now_ms_ceil();
            // Tokens follow the wall clock (unix ms × 2^20 at least), so a
            // token issued later by any node — even one cut off from the
            // others, or freshly promoted — is larger, clocks permitting.
            self.table
                .observe_token(tokens::clock_floor(crate::server::unix_ms()));
            self.outbox.replicate =
                self.repl.is_some() && !matches!(self.mode, Mode::Standby { .. });
            self.table
                .poll_timers(self.clock.now_ms(), &mut self.outbox);
            for message in messages.drain(..) {
                match message {
                    OwnerMsg::Clients(batch) => {
                        for inbound in batch {
                            self.handle_inbound(now_ms, inbound);
                        }
                    }
                    OwnerMsg::Repl(msg) => self.handle_repl(now_ms, msg),
                }
            }
            self.end_round();
        }
        log::info!("lock owner: every sender is gone, stopping");
    }

    /// Block until input arrives or the next timer is due; collect what has
    /// arrived. False when every sender is gone.
    fn wait_for_input(&mut self, messages: &mut Vec<OwnerMsg>) -> bool {
        let Ok(first) = self.wait_first() else {
            return false;
        };
        messages.extend(first);
        let more = self.take_more(messages);
        if !messages.is_empty() {
            // Also when the wait timed out and messages came just after.
            self.idle.end();
        }
        more
    }

    /// Block until input arrives or the next timer is due: busy-poll for
    /// the adaptive window first (busy_poll.rs), then sleep. The idle
    /// stretch runs from the last message to the next one, across any timer
    /// rounds between: so after the last request the owner polls one
    /// window in all, however many leases run out after it.
    fn wait_first(&mut self) -> Result<Option<OwnerMsg>, ()> {
        let window_closes = self.idle.poll_until();
        let wake_at = self
            .table
            .next_wake_ms()
            .map(|ms| self.clock.instant_of(ms));
        let message = match self.poll_first(window_closes, wake_at)? {
            Some(message) => Some(message),
            None => match wake_at {
                Some(at) => match self.inbound.recv_deadline(at) {
                    Ok(message) => Some(message),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return Err(()),
                },
                None => Some(self.inbound.recv().map_err(|_| ())?),
            },
        };
        Ok(message)
    }

    /// Poll the input without blocking until the polling window closes or
    /// a timer is due, yielding the CPU to any other thread that wants it
    /// between looks.
    fn poll_first(
        &mut self,
        window_closes: Instant,
        wake_at: Option<Instant>,
    ) -> Result<Option<OwnerMsg>, ()> {
        let mut until = window_closes;
        if let Some(at) = wake_at {
            until = until.min(at);
        }
        if Instant::now() >= until || !self.shared.pollers.try_take() {
            return Ok(None);
        }
        let polled = loop {
            match self.inbound.try_recv() {
                Ok(message) => break Ok(Some(message)),
                Err(TryRecvError::Disconnected) => break Err(()),
                Err(TryRecvError::Empty) if Instant::now() >= until => break Ok(None),
                Err(TryRecvError::Empty) => std::thread::yield_now(),
            }
        };
        self.shared.pollers.give_back();
        polled
    }

    /// Add what else has arrived, up to the round's limit.
    fn take_more(&mut self, messages: &mut Vec<OwnerMsg>) -> bool {
        while messages.len() < MAX_MESSAGES_PER_ROUND {
            match self.inbound.try_recv() {
                Ok(message) => messages.push(message),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return !messages.is_empty(),
            }
        }
        true
    }

    fn handle_inbound(&mut self, now_ms: u64, inbound: Inbound) {
        match (&mut self.mode, inbound) {
            (_, Inbound::Refused(conn, op, key, reason)) => {
                self.table
                    .handle_refused(conn, op, key, reason, &mut self.outbox)
            }
            (_, Inbound::Closed(conn)) => {
                self.table.handle_disconnect(conn);
                self.outbox.closes.push(conn);
            }
            (_, Inbound::Request(conn, Request::Info)) => {
                let info = self.info(now_ms);
                self.outbox.answers.push((conn, info));
            }
            (Mode::Active, Inbound::Request(conn, request)) => self.serve(now_ms, conn, request),
            (Mode::Standby { active }, Inbound::Request(conn, request)) => {
                let answer = moved(active.clone(), &request);
                self.outbox.answers.push((conn, answer));
            }
            (Mode::HandingOff { held }, inbound) => {
                if held.len() < MAX_HELD_BACK {
                    held.push(inbound);
                } else if let Inbound::Request(conn, request) = inbound {
                    self.outbox.answers.push((conn, moved(None, &request)));
                }
            }
        }
    }

    fn serve(&mut self, now_ms: u64, conn: ConnId, request: Request) {
        let out = &mut self.outbox;
        match request {
            Request::Acquire {
                key,
                lease_ms,
                wait_ms,
            } => self
                .table
                .handle_acquire(now_ms, conn, key, lease_ms, wait_ms, out),
            Request::Release { key, token } => {
                self.table.handle_release(now_ms, conn, key, token, out)
            }
            Request::Keep {
                key,
                token,
                lease_ms,
            } => self
                .table
                .handle_keep(now_ms, conn, key, token, lease_ms, out),
            Request::Query { key } => self.table.handle_query(now_ms, conn, key, out),
            Request::Info => {}
        }
    }

    fn handle_repl(&mut self, now_ms: u64, msg: ReplToOwner) {
        match msg {
            ReplToOwner::BecomeActive { floor, failover } => {
                log::info!("lock owner: now active");
                self.table.observe_token(floor);
                if failover && self.promotion_grace_ms > 0 {
                    log::info!(
                        "lock owner: promotion grace: unknown keys wait {} ms",
                        self.promotion_grace_ms
                    );
                    self.table
                        .set_grace_until(now_ms.saturating_add(self.promotion_grace_ms));
                }
                self.ceiling = 0;
                self.resume_serving(now_ms);
            }
            ReplToOwner::Follow { active } => {
                log::info!(
                    "lock owner: now a standby of {}",
                    active.as_deref().unwrap_or("-")
                );
                self.stop_serving(active);
            }
            ReplToOwner::StartHandoff { to } => {
                log::info!("lock owner: handing off; holding requests back");
                if matches!(self.mode, Mode::Active) {
                    self.mode = Mode::HandingOff { held: Vec::new() };
                }
                // After this round's deltas, so the successor has them all.
                self.flush_deltas();
                self.tell_repl(OwnerToRepl::HandoffReady { to });
            }
            ReplToOwner::AbortHandoff => {
                log::warn!("lock owner: handoff abandoned; serving again");
                self.resume_serving(now_ms);
            }
            ReplToOwner::FinishHandoff { to } => {
                log::info!("lock owner: {to} took over; redirecting clients");
                self.stop_serving(Some(to));
                // Redirected goes out after this round's answers are sent.
                self.redirected_pending = true;
            }
            ReplToOwner::Retire => {
                log::info!("lock owner: no successor; answering waiters M -");
                self.stop_serving(None);
                self.redirected_pending = true;
            }
            ReplToOwner::Snapshot(entries) => {
                self.stop_serving_waiters();
                self.table.load_snapshot(now_ms, entries);
            }
            ReplToOwner::Deltas(deltas) => {
                if !matches!(self.mode, Mode::Active) {
                    for delta in deltas {
                        self.table.apply_delta(now_ms, delta);
                    }
                }
            }
            ReplToOwner::Observe(token) => self.table.observe_token(token),
            ReplToOwner::SnapshotWanted { peer } => {
                self.flush_deltas();
                self.raise_ceiling();
                let entries = self.table.snapshot(now_ms);
                let ceiling = self.ceiling;
                self.tell_repl(OwnerToRepl::Snapshot {
                    peer,
                    entries,
                    ceiling,
                });
            }
        }
    }

    /// Serve again (promotion, or an abandoned handoff): requests held back
    /// are served in their order.
    fn resume_serving(&mut self, now_ms: u64) {
        let previous = std::mem::replace(&mut self.mode, Mode::Active);
        self.outbox.replicate = self.repl.is_some();
        self.raise_ceiling();
        if let Mode::HandingOff { held } = previous {
            for inbound in held {
                self.handle_inbound(now_ms, inbound);
            }
        }
    }

    /// Stop serving: held-back requests and waiters are redirected.
    fn stop_serving(&mut self, active: Option<String>) {
        let previous = std::mem::replace(
            &mut self.mode,
            Mode::Standby {
                active: active.clone(),
            },
        );
        if let Mode::HandingOff { held } = previous {
            for inbound in held {
                match inbound {
                    Inbound::Request(conn, request) => {
                        let answer = moved(active.clone(), &request);
                        self.outbox.answers.push((conn, answer));
                    }
                    other => self.handle_inbound(0, other),
                }
            }
        }
        self.table
            .redirect_waiters(active.as_deref(), &mut self.outbox);
        self.outbox.deltas.clear();
        self.outbox.replicate = false;
    }

    fn stop_serving_waiters(&mut self) {
        let active = match &self.mode {
            Mode::Standby { active } => active.clone(),
            _ => None,
        };
        self.table
            .redirect_waiters(active.as_deref(), &mut self.outbox);
    }

    /// Keep the replicated ceiling TOKEN_RESERVE ahead of the last token.
    fn raise_ceiling(&mut self) {
        if self.repl.is_none() || !matches!(self.mode, Mode::Active | Mode::HandingOff { .. }) {
            return;
        }
        let last = self.table.stats().last_token;
        if last.saturating_add(TOKEN_RESERVE / 2) > self.ceiling {
            self.ceiling = last.saturating_add(TOKEN_RESERVE);
            self.outbox.deltas.push(Delta::Ceiling(self.ceiling));
            self.shared.ceiling.store(self.ceiling, Ordering::Relaxed);
        }
    }

    fn flush_deltas(&mut self) {
        if self.outbox.deltas.is_empty() {
            return;
        }
        let deltas = std::mem::take(&mut self.outbox.deltas);
        if matches!(self.mode, Mode::Active | Mode::HandingOff { .. }) {
            self.tell_repl(OwnerToRepl::Deltas(deltas));
        }
    }

    fn tell_repl(&self, msg: OwnerToRepl) {
        if let Some(repl) = &self.repl
            && repl.tx.send(ToRepl::Owner(msg)).is_ok()
        {
            let _ = repl.waker.wake();
        }
    }

    fn end_round(&mut self) {
        if !self.outbox.answers.is_empty() {
            // Clients were answered (by a timer's grant, say): a request
            // often follows, so a new idle stretch starts now.
            self.idle.restart();
        }
        self.raise_ceiling();
        self.flush_deltas();
        self.shared
            .last_issued
            .store(self.table.stats().last_issued, Ordering::Relaxed);
        self.send_round();
        if std::mem::take(&mut self.redirected_pending) {
            self.tell_repl(OwnerToRepl::Redirected);
        }
    }

    /// The `I` answer.
    fn info(&self, now_ms: u64) -> Answer {
        let stats = self.table.stats();
        let (role, state, active) = match &self.mode {
            Mode::Active => ("active", "active", Some(self.shared.node.clone())),
            Mode::HandingOff { .. } => ("active", "handing-off", Some(self.shared.node.clone())),
            Mode::Standby { active } => ("standby", "standby", active.clone()),
        };
        let lag_ms = match &self.mode {
            Mode::Standby { active: Some(_) } => {
                now_ms.saturating_sub(self.shared.heard_active_ms.load(Ordering::Relaxed))
            }
            _ => 0,
        };
        let pairs = [
            ("role", role.to_string()),
            ("node", self.shared.node.clone()),
            ("active", active.unwrap_or_else(|| "-".to_string())),
            ("token", stats.last_token.to_string()),
            ("held", stats.held.to_string()),
            ("waiting", stats.waiting.to_string()),
            (
                "conns",
                self.shared.conns.load(Ordering::Relaxed).to_string(),
            ),
            ("state", state.to_string()),
            ("ceiling", self.ceiling.max(stats.last_token).to_string()),
            ("lag_ms", lag_ms.to_string()),
            (
                "standbys",
                match self.mode {
                    Mode::Standby { .. } => 0,
                    _ => self.shared.synced_standbys.load(Ordering::Relaxed),
                }
                .to_string(),
            ),
        ];
        Answer::Info(
            pairs
                .into_iter()
                .map(|(name, value)| (name.to_string(), value))
                .collect(),
        )
    }

    /// Deal this round's answers out to their I/O loops: one send and one
    /// wake per loop that has anything.
    fn send_round(&mut self) {
        for (conn, answer) in self.outbox.answers.drain(..) {
            if let Some(round) = self.rounds.get_mut(conn.worker()) {
                round.answers.push((conn, answer));
            }
        }
        for conn in self.outbox.closes.drain(..) {
            if let Some(round) = self.rounds.get_mut(conn.worker()) {
                round.forgotten.push(conn);
            }
        }
        for (round, link) in self.rounds.iter_mut().zip(&self.workers) {
            if round.answers.is_empty() && round.forgotten.is_empty() {
                continue;
            }
            let batch = std::mem::take(round);
            if link.answers.send(batch).is_err() {
                continue;
            }
            // Wake the loop only if it may be asleep (a syscall saved per
            // round when it is busy or waiting for these answers).
            std::sync::atomic::fence(Ordering::SeqCst);
            if !link.awake.load(Ordering::SeqCst)
                && let Err(e) = link.waker.wake()
            {
                log::warn!("lock owner: waking an I/O loop failed: {e}");
            }
        }
    }
}

/// `M <active> <op> <key>` for a request this node does not serve.
fn moved(active: Option<String>, request: &Request) -> Answer {
    Answer::Moved {
        active,
        op: request.op(),
        key: request.key().cloned(),
    }
}
