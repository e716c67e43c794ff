//! The lock-owner thread: the shell around the lock owner's core.
//!
//! Owns: the thread's channels — batches of parsed requests from the I/O
//! loops and messages from the replication thread come in on one bounded
//! channel; each I/O loop gets one batch of answers per round (one send,
//! one wake); the core's messages for the cluster go to the replication
//! thread. Every decision (serving mode, held-back requests, timers, token
//! floor and ceiling, the `I` answer) is [`TableCore`]'s: this file reads the
//! clock once per round, feeds the core, and carries out its effects.
//!
//! Sleeps only until the next timer is due (or input arrives), after
//! polling its input for an adaptive window as the I/O loops do
//! (busy_poll.rs: waking a sleeping thread costs more than a round of work
//! when requests come at short intervals) — but only while it serves
//! clients: a standby's owner sleeps at once between replicated batches. Exits when every sender (I/O
//! loops, replication) is gone, which is the shutdown signal.
//!
//! A full outgoing channel never blocks it: the batch stays here, in order,
//! and is retried a millisecond later (see `messages::capacity`). Each
//! message from the replication thread it has applied it takes off
//! `Shared::cluster_queued`, which bounds how far that thread reads its
//! peers ahead of it (`capacity::CLUSTER_ENTRIES`).
//!
//! Counts requests, answers and handoff times as plain fields (stats.rs)
//! and, when the metrics thread asks (`ToOwner::Scrape`), leaves a snapshot
//! in its slot if the slot is free at that instant; else it tries again
//! next round.
//!
//! Never does: socket I/O, lock decisions, or blocking on anything but its
//! own input channel.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError, TrySendError};

use crate::server::Shared;
use crate::server::busy_poll::IdleStretch;
use crate::server::clock::Clock;
use crate::server::io_loop::next_room;
use crate::server::messages::{IoLoopLink, OwnerBatch, ReplLink, TableToCluster, ToOwner, ToRepl};
use crate::server::stats::{MetricsSlot, OwnerStats, Snapshot};
use crate::server::table_core::{Gauges, TableCore};

/// Most inbound messages drained per round before answers go out, so a
/// flood from the I/O loops cannot delay every answer indefinitely.
const MAX_MESSAGES_PER_ROUND: usize = 64;
/// How soon the owner retries a send into a full channel.
const RETRY_FULL: Duration = Duration::from_millis(1);

/// The lock-owner thread's state.
pub struct Owner {
    core: TableCore,
    clock: Clock,
    inbound: Receiver<ToOwner>,
    io_loops: Vec<IoLoopLink>,
    repl: Option<ReplLink>,
    shared: Arc<Shared>,
    /// Answers per I/O loop not sent yet (the loop's channel was full).
    rounds: Vec<OwnerBatch>,
    /// Room each loop's next batch is made with (`io_loop::next_room`).
    rooms: Vec<usize>,
    /// Messages for replication not sent yet (its channel was full).
    to_repl: VecDeque<TableToCluster>,
    /// Since when no message has come and no client was answered, and the
    /// polling window.
    idle: IdleStretch,
    stats: OwnerStats,
    /// Where snapshots go for `--metrics` (None without it).
    metrics: Option<Arc<MetricsSlot>>,
    /// When the round started (for handoff times).
    round_start: Instant,
}

impl Owner {
    pub fn new(
        core: TableCore,
        clock: Clock,
        inbound: Receiver<ToOwner>,
        io_loops: Vec<IoLoopLink>,
        repl: Option<ReplLink>,
        shared: Arc<Shared>,
    ) -> Owner {
        let rounds: Vec<_> = io_loops.iter().map(|_| OwnerBatch::default()).collect();
        let busy_poll_max = shared.busy_poll;
        let stats = OwnerStats::new(core.is_serving());
        Owner {
            core,
            clock,
            inbound,
            io_loops,
            repl,
            shared,
            rooms: vec![0; rounds.len()],
            rounds,
            to_repl: VecDeque::new(),
            idle: IdleStretch::new(busy_poll_max),
            stats,
            metrics: None,
            round_start: Instant::now(),
        }
    }

    /// Publish snapshots into `slot` when asked (`--metrics`).
    pub fn with_metrics(mut self, slot: Arc<MetricsSlot>) -> Owner {
        self.metrics = Some(slot);
        self
    }

    /// Run until every sender is gone.
    pub fn run(mut self) {
        let mut messages: Vec<ToOwner> = Vec::new();
        loop {
            if !self.wait_for_input(&mut messages) {
                break;
            }
            let now = self.clock.now();
            self.round_start = Instant::now();
            let gauges = Gauges {
                conns: self.shared.conns.load(Ordering::Relaxed),
                heard_active_ms: self.shared.heard_active_ms.load(Ordering::Relaxed),
                synced_standbys: self.shared.synced_standbys.load(Ordering::Relaxed),
            };
            self.core.begin_round(now, gauges);
            for message in messages.drain(..) {
                match message {
                    ToOwner::Clients(batch) => {
                        for inbound in batch {
                            self.stats.count_inbound(&inbound);
                            self.core.handle_inbound(now, inbound);
                        }
                    }
                    ToOwner::Cluster(msg) => {
                        let weight = msg.weight();
                        self.core.handle_cluster(now, msg);
                        // The replication thread may read its peers for
                        // that much more (messages::capacity).
                        self.shared.cluster_queued.applied(weight);
                    }
                    ToOwner::Scrape => self.stats.scrape_wanted = true,
                }
            }
            self.end_round(now);
            self.end_round_metrics(now);
        }
        log::info!("lock owner: every sender is gone, stopping");
    }

    /// Carry out the round's effects: messages for replication, then the
    /// answers, then (after a role transfer) `Redirected`.
    fn end_round(&mut self, now: crate::server::clock::Now) {
        let effects = self.core.end_round(now);
        let answered = !effects.answers.is_empty();
        let redirected = std::mem::take(&mut effects.redirected);
        self.to_repl.extend(effects.to_cluster.drain(..));
        for (conn, answer) in effects.answers.drain(..) {
            self.stats.count_answer(&answer);
            if let Some(round) = self.rounds.get_mut(conn.worker()) {
                round.answers.push((conn, answer));
            }
        }
        for conn in effects.forgotten.drain(..) {
            if let Some(round) = self.rounds.get_mut(conn.worker()) {
                round.forgotten.push(conn);
            }
        }
        if answered {
            // Clients were answered (by a timer's grant, say): a request
            // often follows, so a new idle stretch starts now.
            self.idle.restart();
        }
        self.shared
            .last_issued
            .store(self.core.last_issued(), Ordering::Relaxed);
        self.shared
            .ceiling
            .store(self.core.ceiling(), Ordering::Relaxed);
        self.send_to_repl();
        self.send_round();
        if redirected {
            self.to_repl.push_back(TableToCluster::Redirected);
            self.send_to_repl();
        }
    }

    /// After the round's answers left: count its handoffs and role, and
    /// publish a snapshot if one was asked for.
    fn end_round_metrics(&mut self, now: crate::server::clock::Now) {
        let done = Instant::now();
        let round_us = done.duration_since(self.round_start).as_micros() as u64;
        let clock = self.clock;
        self.stats.end_round(
            !self.core.is_standby(),
            self.core.table().metrics(),
            round_us,
            |deadline_ms| {
                done.duration_since(clock.instant_of(deadline_ms))
                    .as_micros() as u64
            },
        );
        if !self.stats.scrape_wanted {
            return;
        }
        let Some(slot) = &self.metrics else {
            self.stats.scrape_wanted = false;
            return;
        };
        let mut snap = Snapshot::default();
        self.core.fill_snapshot(now, &mut snap);
        self.stats.fill(self.core.table().metrics(), &mut snap);
        if slot.try_publish(&snap) {
            self.stats.scrape_wanted = false;
        }
    }

    /// Something is waiting for room in a full channel.
    fn backed_up(&self) -> bool {
        !self.to_repl.is_empty() || self.rounds.iter().any(|r| !r.is_empty())
    }

    /// Block until input arrives or the next timer is due; collect what has
    /// arrived. False when every sender is gone.
    fn wait_for_input(&mut self, messages: &mut Vec<ToOwner>) -> bool {
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
    fn wait_first(&mut self) -> Result<Option<ToOwner>, ()> {
        // Only while serving: a standby's input is replication batches.
        let window_closes = self.idle.poll_until_if(self.core.is_serving());
        let mut wake_at = self.core.next_wake_ms().map(|ms| self.clock.instant_of(ms));
        if self.backed_up() {
            let retry = Instant::now() + RETRY_FULL;
            wake_at = Some(wake_at.map_or(retry, |at| at.min(retry)));
        }
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
    ) -> Result<Option<ToOwner>, ()> {
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
    fn take_more(&mut self, messages: &mut Vec<ToOwner>) -> bool {
        while messages.len() < MAX_MESSAGES_PER_ROUND {
            match self.inbound.try_recv() {
                Ok(message) => messages.push(message),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return !messages.is_empty(),
            }
        }
        true
    }

    /// Send what is queued for replication, in order, as far as its channel
    /// has room; wake it once.
    fn send_to_repl(&mut self) {
        let Some(repl) = &self.repl else {
            self.to_repl.clear();
            return;
        };
        let mut sent = false;
        while let Some(msg) = self.to_repl.pop_front() {
            match repl.tx.try_send(ToRepl::Table(msg)) {
                Ok(()) => sent = true,
                Err(TrySendError::Full(ToRepl::Table(msg))) => {
                    self.to_repl.push_front(msg);
                    break;
                }
                Err(_) => {
                    self.to_repl.clear();
                    break;
                }
            }
        }
        // The core sends deltas at most once per `REPL_BATCH_MS` while
        // they stream: each message is worth a wake.
        if sent {
            let _ = repl.waker.wake();
        }
    }

    /// Deal this round's answers out to their I/O loops: one send and one
    /// wake per loop that has anything. A loop whose channel is full keeps
    /// its batch here (later answers join it, in order) until the next round.
    fn send_round(&mut self) {
        let rooms = self.rooms.iter_mut();
        for ((round, link), room) in self.rounds.iter_mut().zip(&self.io_loops).zip(rooms) {
            if round.is_empty() {
                continue;
            }
            // The next round starts with room for as many answers as the
            // recent rounds had, so the batch is not grown (and copied)
            // step by step every round.
            *room = next_room(*room, round.answers.len());
            let batch = std::mem::replace(
                round,
                OwnerBatch {
                    answers: Vec::with_capacity(*room),
                    forgotten: Vec::new(),
                },
            );
            match link.answers.try_send(batch) {
                Ok(()) => {}
                Err(TrySendError::Full(batch)) => {
                    *round = batch;
                    continue;
                }
                Err(TrySendError::Disconnected(_)) => continue,
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
