//! The lock-owner thread: the shell around the lock owner's core.
//!
//! Owns: the thread's channels — batches of parsed requests from the I/O
//! loops and messages from the replication thread come in on one bounded
//! channel; each I/O loop gets one batch of answers per round (one send,
//! one wake); the core's messages for the cluster go to the replication
//! thread. Every decision (serving mode, held-back requests, timers, token
//! floor and ceiling, the `I` answer) is [`TableCore`]'s, and the order of a
//! round (what is fed to the core in which order, where its effects go) is
//! `rounds::OwnerRound`'s, which the simulation runs too: this file reads
//! the clock once per round, waits for input, and implements the round's
//! ports (`rounds::OwnerPorts`) with channels and wakers.
//!
//! Sleeps only until the next timer is due (or input arrives), after
//! polling its input for an adaptive window as the I/O loops do
//! (busy_poll.rs: waking a sleeping thread costs more than a round of work
//! when requests come at short intervals) — but only while it serves
//! clients: a standby's owner sleeps at once between replicated batches. Exits when every sender (I/O
//! loops, replication) is gone, which is the shutdown signal.
//!
//! A full outgoing channel never blocks it: the batch stays here, in order,
//! and is retried a millisecond later (see `messages::capacity`). What
//! waits for replication so is bounded (`capacity::OWNER_DELTAS`): past it
//! the queued deltas are dropped and the standbys re-synced from snapshots
//! (`rounds::ReplBacklog` decides, for the simulation too). Each
//! message from the replication thread it has applied it takes off
//! `Gauges::cluster_queued`, which bounds how far that thread reads its
//! peers ahead of it (`capacity::CLUSTER_ENTRIES`).
//!
//! Limits per round: `MAX_MESSAGES_PER_ROUND` messages taken off the
//! channel, and `MAX_REQUESTS_PER_ROUND` client events handled (requests,
//! refusals, closes, whatever batches they came in; a batch is split if
//! need be and the rest waits, in order, for the next round, which then
//! does not wait for input). So the answers decided so far go out after a
//! bounded amount of work, however many requests a flood has queued
//! (what each connection can have queued is the I/O loops' bound, `MAX_OWED`).
//!
//! Counts requests, answers and handoff times as plain fields (stats.rs)
//! and, when the metrics thread asks (`ToOwner::Scrape`), leaves a snapshot
//! in its slot if the slot is free at that instant; else it tries again
//! next round. A contention view (`ToOwner::Keys`, for `GET /keys`) is
//! built and left the same way, between two rounds.
//!
//! Never does: socket I/O, lock decisions, or blocking on anything but its
//! own input channel.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError, TrySendError};

use crate::protocol::Answer;
use crate::server::busy_poll::{IdleStretch, OneCpu};
use crate::server::clock::Clock;
use crate::server::shared::{Gauges, Settings};

use crate::server::core::counters::Snapshot;
use crate::server::core::events::ConnId;
use crate::server::core::table_core::TableCore;
use crate::server::messages::{
    IoLoopLink, OwnerBatch, ReplLink, Retired, TableToCluster, ToOwner, ToRepl, next_room,
    with_headroom,
};
use crate::server::rounds::{Gone, Offer, OwnerPorts, OwnerRound};
use crate::server::stats::MetricsSlot;

/// How soon the owner retries a send into a full channel.
const RETRY_FULL: Duration = Duration::from_millis(1);

/// The lock-owner thread's state.
pub struct Owner {
    /// The core, what waits to be handled, the counts (rounds.rs runs the
    /// round on them).
    round: OwnerRound,
    links: Links,
    clock: Clock,
    gauges: Arc<Gauges>,
    /// Where snapshots go for `--metrics` (None without it).
    metrics: Option<Arc<MetricsSlot>>,
    /// When the round started (for handoff times).
    round_start: Instant,
    /// Whether this thread may run on one CPU only (then it never polls:
    /// busy_poll.rs).
    one_cpu: OneCpu,
}

/// The owner's channels, as the round sees them ([`OwnerPorts`]).
struct Links {
    inbound: Receiver<ToOwner>,
    io_loops: Vec<IoLoopLink>,
    repl: Option<ReplLink>,
    /// Answers per I/O loop not sent yet (the loop's channel was full).
    rounds: Vec<OwnerBatch>,
    /// Room each loop's next batch is made with (`messages::next_room`).
    rooms: Vec<usize>,
    /// Since when no message has come and no client was answered, and the
    /// polling window.
    idle: IdleStretch,
    /// Whom to tell once the answers of a `ToOwner::Retire` have all gone
    /// to the I/O loops.
    retired: Vec<Retired>,
}

impl Owner {
    pub fn new(
        core: TableCore,
        clock: Clock,
        inbound: Receiver<ToOwner>,
        io_loops: Vec<IoLoopLink>,
        repl: Option<ReplLink>,
        settings: &Settings,
        gauges: Arc<Gauges>,
    ) -> Owner {
        let rounds: Vec<_> = io_loops.iter().map(|_| OwnerBatch::default()).collect();
        let busy_poll_max = settings.busy_poll;
        Owner {
            round: OwnerRound::new(core),
            links: Links {
                inbound,
                io_loops,
                repl,
                rooms: vec![0; rounds.len()],
                rounds,
                idle: IdleStretch::new(busy_poll_max),
                retired: Vec::new(),
            },
            clock,
            gauges,
            metrics: None,
            round_start: Instant::now(),
            one_cpu: OneCpu::default(),
        }
    }

    /// Publish snapshots into `slot` when asked (`--metrics`).
    pub fn with_metrics(mut self, slot: Arc<MetricsSlot>) -> Owner {
        self.metrics = Some(slot);
        self
    }

    /// Run until every sender is gone.
    pub fn run(mut self) {
        loop {
            if !self.wait_for_input() {
                break;
            }
            let now = self.clock.now();
            self.round_start = Instant::now();
            self.round.round(now, &self.gauges, &mut self.links);
            let links = &mut self.links;
            if !links.retired.is_empty() && links.rounds.iter().all(OwnerBatch::is_empty) {
                // The redirects are in the I/O loops' channels now (a full
                // channel keeps them here; the next round, within
                // `RETRY_FULL`, tries again).
                for done in links.retired.drain(..) {
                    done.signal();
                }
            }
            self.end_round_metrics(now);
        }
        log::info!("lock owner: every sender is gone, stopping");
    }

    /// After the round's answers left: count its handoffs and role, and
    /// publish a snapshot, or a contention view, if one was asked for.
    fn end_round_metrics(&mut self, now: crate::server::clock::Now) {
        let done = Instant::now();
        let round_us = done.duration_since(self.round_start).as_micros() as u64;
        let clock = self.clock;
        let OwnerRound { core, stats, .. } = &mut self.round;
        stats.end_round(
            !core.is_standby(),
            core.table().metrics(),
            round_us,
            |deadline_ms| {
                done.duration_since(clock.instant_of(deadline_ms))
                    .as_micros() as u64
            },
        );
        if let Some(ask) = &stats.keys_wanted {
            match &self.metrics {
                Some(slot) => {
                    let view = Arc::new(core.keys_view(now, ask));
                    if slot.try_publish_keys(view).is_ok() {
                        stats.keys_wanted = None;
                    }
                }
                None => stats.keys_wanted = None,
            }
        }
        if !stats.scrape_wanted {
            return;
        }
        let Some(slot) = &self.metrics else {
            stats.scrape_wanted = false;
            return;
        };
        let mut snap = Snapshot::default();
        core.fill_snapshot(now, &mut snap);
        stats.fill(core.table().metrics(), &mut snap);
        if slot.try_publish(&snap) {
            stats.scrape_wanted = false;
        }
    }

    /// Unless messages wait from the last round, block until input
    /// arrives or the next timer is due; collect what has arrived. False
    /// when every sender is gone.
    fn wait_for_input(&mut self) -> bool {
        if self.round.queue.is_empty() {
            let Ok(first) = self.wait_first() else {
                return false;
            };
            self.round.queue.extend(first);
        }
        let more = self.round.take_more(&mut self.links);
        if !self.round.queue.is_empty() {
            // Also when the wait timed out and messages came just after.
            self.links.idle.end();
        }
        more
    }

    /// Block until input arrives or the next timer is due: busy-poll for
    /// the adaptive window first (busy_poll.rs), then sleep. The idle
    /// stretch runs from the last message to the next one, across any timer
    /// rounds between: so after the last request the owner polls one
    /// window in all, however many leases run out after it.
    fn wait_first(&mut self) -> Result<Option<ToOwner>, ()> {
        let core = &self.round.core;
        // Only while serving: a standby's input is replication batches.
        let window_closes = self
            .links
            .idle
            .poll_until_beside(core.is_serving(), &mut self.one_cpu);
        let mut wake_at = core.next_wake_ms().map(|ms| self.clock.instant_of(ms));
        if self.links.backed_up() || !self.round.to_repl.is_empty() {
            let retry = Instant::now() + RETRY_FULL;
            wake_at = Some(wake_at.map_or(retry, |at| at.min(retry)));
        }
        let message = match self.poll_first(window_closes, wake_at)? {
            Some(message) => Some(message),
            None => match wake_at {
                Some(at) => match self.links.inbound.recv_deadline(at) {
                    Ok(message) => Some(message),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return Err(()),
                },
                None => Some(self.links.inbound.recv().map_err(|_| ())?),
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
        if Instant::now() >= until || !self.gauges.pollers.try_take() {
            return Ok(None);
        }
        let polled = loop {
            match self.links.inbound.try_recv() {
                Ok(message) => break Ok(Some(message)),
                Err(TryRecvError::Disconnected) => break Err(()),
                Err(TryRecvError::Empty) if Instant::now() >= until => break Ok(None),
                Err(TryRecvError::Empty) => std::thread::yield_now(),
            }
        };
        self.gauges.pollers.give_back();
        polled
    }
}

impl Links {
    /// Answers are waiting for room in a full channel (what waits for
    /// replication is the round's: `OwnerRound::to_repl`).
    fn backed_up(&self) -> bool {
        self.rounds.iter().any(|r| !r.is_empty())
    }
}

impl OwnerPorts for Links {
    fn try_recv(&mut self) -> Result<Option<ToOwner>, Gone> {
        match self.inbound.try_recv() {
            Ok(message) => Ok(Some(message)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(Gone),
        }
    }

    fn offer_to_repl(&mut self, msg: TableToCluster) -> Offer<TableToCluster> {
        let Some(repl) = &self.repl else {
            return Offer::Gone;
        };
        match repl.tx.try_send(ToRepl::Table(msg)) {
            Ok(()) => Offer::Taken,
            Err(TrySendError::Full(ToRepl::Table(msg))) => Offer::Full(msg),
            Err(_) => Offer::Gone,
        }
    }

    /// The core sends deltas at most once per `REPL_BATCH_MS` while they
    /// stream: each round that sent is worth a wake.
    fn sent_to_repl(&mut self) {
        if let Some(repl) = &self.repl {
            let _ = repl.waker.wake();
        }
    }

    fn answer(&mut self, conn: ConnId, answer: Answer) {
        if let Some(round) = self.rounds.get_mut(conn.worker()) {
            round.answers.push((conn, answer));
        }
    }

    fn answers(&mut self, answers: &mut Vec<(ConnId, Answer)>) {
        // One I/O loop whose batch is empty (the usual case under load):
        // the round's answers become its batch as they are, no copy.
        if let [round] = self.rounds.as_mut_slice()
            && round.answers.is_empty()
            && answers.iter().all(|(conn, _)| conn.worker() == 0)
        {
            std::mem::swap(&mut round.answers, answers);
            return;
        }
        for (conn, answer) in answers.drain(..) {
            self.answer(conn, answer);
        }
    }

    fn forget(&mut self, conn: ConnId) {
        if let Some(round) = self.rounds.get_mut(conn.worker()) {
            round.forgotten.push(conn);
        }
    }

    fn answered(&mut self) {
        // Clients were answered (by a timer's grant, say): a request often
        // follows, so a new idle stretch starts now.
        self.idle.restart();
    }

    fn retiring(&mut self, done: Retired) {
        self.retired.push(done);
    }

    /// Deal this round's answers out to their I/O loops: one send and one
    /// wake per loop that has anything. A loop whose channel is full keeps
    /// its batch here (later answers join it, in order) until the next round.
    fn send_answers(&mut self) {
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
                    answers: Vec::with_capacity(with_headroom(*room)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Key, Request};
    use crate::server::Config;
    use crate::server::core::events::Delta;
    use crate::server::core::lock_table::{LockTable, TableLimits};
    use crate::server::core::tokens::TokenSource;
    use crate::server::messages::{Inbound, capacity};
    use crate::server::rounds::MAX_REQUESTS_PER_ROUND;

    /// An owner's clock, core (in a cluster or not) and shared state.
    fn parts(clustered: bool) -> (Clock, TableCore, Arc<Settings>) {
        let settings = Arc::new(Settings::new(&Config::default(), "test".into()));
        let clock = Clock::new();
        let table = LockTable::new(
            clock.now_ms(),
            TableLimits::default(),
            TokenSource::new(0, 0),
        );
        let core = TableCore::new(table, clustered, "test".into(), 0);
        (clock, core, settings)
    }

    fn grants(n: usize) -> TableToCluster {
        let key = Key::new(b"k").expect("key");
        let grant = Delta::grant(key, 7, 1000);
        TableToCluster::Deltas(vec![grant; n])
    }

    #[test]
    fn a_full_replication_channel_bounds_what_the_owner_keeps_and_marks_the_loss() {
        let (clock, core, settings) = parts(true);
        let (_to_owner, inbound) = crossbeam_channel::bounded(4);
        let (tx, full) = crossbeam_channel::bounded(1);
        let poll = mio::Poll::new().expect("poll");
        let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).expect("waker"));
        let repl = ReplLink { tx, waker };
        let mut owner = Owner::new(
            core,
            clock,
            inbound,
            vec![],
            Some(repl),
            &settings,
            Arc::default(),
        );
        // Replication takes the first message, then nothing.
        let step = capacity::OWNER_DELTAS / 2;
        for _ in 0..3 {
            owner.round.to_repl.push(grants(step));
            owner.round.send_to_repl(&mut owner.links);
        }
        let waiting = owner.round.to_repl.iter().count();
        assert_eq!(waiting, 2, "one sent, two kept: at the bound");
        owner.round.to_repl.push(grants(1));
        owner.round.send_to_repl(&mut owner.links);
        assert_eq!(
            owner.round.to_repl.iter().cloned().collect::<Vec<_>>(),
            [TableToCluster::DeltasLost]
        );
        assert_eq!(owner.round.to_repl.deltas(), 0);
        // Once replication takes again, the marker follows what it had.
        assert!(
            matches!(full.try_recv(), Ok(ToRepl::Table(TableToCluster::Deltas(d))) if d.len() == step)
        );
        owner.round.send_to_repl(&mut owner.links);
        assert!(matches!(
            full.try_recv(),
            Ok(ToRepl::Table(TableToCluster::DeltasLost))
        ));
        assert!(owner.round.to_repl.is_empty());
    }

    #[test]
    fn a_batch_larger_than_a_round_is_split_and_its_answers_go_out_between() {
        let (clock, core, settings) = parts(false);
        let poll = mio::Poll::new().expect("poll");
        let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).expect("waker"));
        let (to_owner, inbound) = crossbeam_channel::bounded(4);
        let (answers, from_owner) = crossbeam_channel::unbounded();
        let link = IoLoopLink {
            answers,
            waker,
            awake: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        };
        let owner = Owner::new(
            core,
            clock,
            inbound,
            vec![link],
            None,
            &settings,
            Arc::default(),
        );
        // One flooding batch, then a request of another connection.
        let flood = 2 * MAX_REQUESTS_PER_ROUND + 10;
        let key = Key::new(b"k").expect("key");
        let query =
            |conn| Inbound::Request(ConnId::new(0, conn, 1), Request::Query { key: key.clone() });
        let batch = (0..flood).map(|_| query(1)).collect();
        to_owner.send(ToOwner::Clients(batch)).expect("send");
        to_owner
            .send(ToOwner::Clients(vec![query(2)]))
            .expect("send");
        drop(to_owner);
        // Every sender gone: it handles what it has, then returns.
        owner.run();
        let rounds: Vec<OwnerBatch> = from_owner.try_iter().collect();
        let sizes: Vec<usize> = rounds.iter().map(|r| r.answers.len()).collect();
        assert_eq!(
            sizes,
            [MAX_REQUESTS_PER_ROUND, MAX_REQUESTS_PER_ROUND, 11],
            "answers per round"
        );
        // In order: the other connection's answer comes last.
        let last = rounds[2].answers.last().expect("an answer");
        assert_eq!(last.0, ConnId::new(0, 2, 1));
        assert!(matches!(last.1, Answer::Queried { .. }));
    }
}
