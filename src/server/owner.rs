//! The lock-owner thread: the one thread that touches lock state.
//!
//! Owns: the node's [`LockTable`]. Receives batches of parsed requests from
//! the I/O loops over one crossbeam channel, applies them in arrival order,
//! fires lease expiries and wait deadlines on time, and sends each I/O loop
//! one batch of answers per round, waking it once.
//!
//! Sleeps only until the next timer is due (or a batch arrives). Exits when
//! every I/O loop has dropped its sender, which is the shutdown signal.
//!
//! Never does: socket I/O, formatting, or blocking on anything but its own
//! input channel.

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use mio::Waker;

use crate::protocol::{Answer, Key, Op, Reason, Request};
use crate::server::Shared;
use crate::server::lock_table::{ConnId, LockTable, Outbox};

/// Most inbound batches drained per round before answers go out, so a flood
/// from the I/O loops cannot delay every answer indefinitely.
const MAX_BATCHES_PER_ROUND: usize = 64;

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
}

/// A monotonic millisecond clock shared by the owner's decisions.
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
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
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

/// The lock-owner thread's state.
pub struct Owner {
    table: LockTable,
    clock: Clock,
    inbound: Receiver<Vec<Inbound>>,
    workers: Vec<WorkerLink>,
    shared: Arc<Shared>,
    outbox: Outbox,
    rounds: Vec<OwnerBatch>,
}

impl Owner {
    pub fn new(
        table: LockTable,
        clock: Clock,
        inbound: Receiver<Vec<Inbound>>,
        workers: Vec<WorkerLink>,
        shared: Arc<Shared>,
    ) -> Owner {
        let rounds = workers.iter().map(|_| OwnerBatch::default()).collect();
        Owner {
            table,
            clock,
            inbound,
            workers,
            shared,
            outbox: Outbox::default(),
            rounds,
        }
    }

    /// Run until every I/O loop is gone.
    pub fn run(mut self) {
        let mut batches: Vec<Vec<Inbound>> = Vec::new();
        loop {
            if !self.wait_for_input(&mut batches) {
                break;
            }
            let now_ms = self.clock.now_ms();
            self.table.poll_timers(now_ms, &mut self.outbox);
            for batch in batches.drain(..) {
                for inbound in batch {
                    self.handle_inbound(now_ms, inbound);
                }
            }
            self.send_round();
        }
        log::info!("lock owner: every I/O loop is gone, stopping");
    }

    /// Block until input arrives or the next timer is due; collect what has
    /// arrived. False when the I/O loops are gone.
    fn wait_for_input(&mut self, batches: &mut Vec<Vec<Inbound>>) -> bool {
        let first = match self.table.next_wake_ms() {
            Some(wake_ms) => match self.inbound.recv_deadline(self.clock.instant_of(wake_ms)) {
                Ok(batch) => Some(batch),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return false,
            },
            None => match self.inbound.recv() {
                Ok(batch) => Some(batch),
                Err(_) => return false,
            },
        };
        batches.extend(first);
        while batches.len() < MAX_BATCHES_PER_ROUND {
            match self.inbound.try_recv() {
                Ok(batch) => batches.push(batch),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return !batches.is_empty(),
            }
        }
        true
    }

    fn handle_inbound(&mut self, now_ms: u64, inbound: Inbound) {
        let out = &mut self.outbox;
        match inbound {
            Inbound::Request(conn, request) => match request {
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
                Request::Info => out.answers.push((conn, info(&self.table, &self.shared))),
            },
            Inbound::Refused(conn, op, key, reason) => {
                self.table.handle_refused(conn, op, key, reason, out)
            }
            Inbound::Closed(conn) => {
                self.table.handle_disconnect(conn);
                out.closes.push(conn);
            }
        }
    }
}

/// The `I` answer of an active node.
fn info(table: &LockTable, shared: &Shared) -> Answer {
    let stats = table.stats();
    let node = shared.node.clone();
    let pairs = vec![
        ("role".to_string(), "active".to_string()),
        ("node".to_string(), node.clone()),
        ("active".to_string(), node),
        ("token".to_string(), stats.last_token.to_string()),
        ("held".to_string(), stats.held.to_string()),
        ("waiting".to_string(), stats.waiting.to_string()),
        (
            "conns".to_string(),
            shared
                .conns
                .load(std::sync::atomic::Ordering::Relaxed)
                .to_string(),
        ),
    ];
    Answer::Info(pairs)
}

impl Owner {
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
            if link.answers.send(batch).is_ok() {
                if let Err(e) = link.waker.wake() {
                    log::warn!("lock owner: waking an I/O loop failed: {e}");
                }
            }
        }
    }
}
