//! The order of the lock owner's round and of the replication thread's
//! work, written once, for the threads and the deterministic simulation
//! (`tests/simulation.rs`) alike.
//!
//! Owns: the sequence in which the cores are fed and their effects carried
//! out — [`OwnerRound`] (take the owner's input up to the round's limits,
//! feed the table core in arrival order, deal its effects out, publish the
//! token gauges), and for replication [`take_inbox`] (consecutive deltas
//! merged into one batch), [`tick`] (the gauges, the tokens through them,
//! the core's tick) and [`carry_out`]. What is fed in and where effects go
//! is a trait: [`OwnerPorts`] and [`ReplShell`]. The threads implement
//! them with channels, wakers, sockets and the real clock
//! (threads/owner.rs, threads/replication.rs); the simulation with
//! in-memory queues, a simulated network and a simulated clock. So the
//! simulation runs the node's rounds, not a copy of them.
//!
//! Runs on the lock-owner thread ([`OwnerRound`]) and the replication
//! thread (the rest), or on the simulation's one thread.
//!
//! Never does: decide anything (the cores do), read a clock (the shell
//! passes the time in, or says it through [`ReplShell::now`]), block, or
//! touch a socket or channel itself.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use crossbeam_channel::Sender;

use crate::protocol::Answer;
use crate::server::core::cluster_core::{ClusterCore, ClusterEffect, LinkId};
use crate::server::core::events::{ConnId, Delta};
use crate::server::core::now::Now;
use crate::server::core::peer_msg::PeerMsg;
use crate::server::core::table_core::{GaugeReadings, TableCore};
use crate::server::messages::{ClusterToTable, TableToCluster, ToOwner, ToRepl};
use crate::server::shared::Gauges;
use crate::server::stats::OwnerStats;
use crate::server::trust::tls::Stream;

/// Most inbound messages taken per round before answers go out, so a
/// flood from the I/O loops cannot delay every answer indefinitely.
pub const MAX_MESSAGES_PER_ROUND: usize = 64;
/// Most client events (requests, refusals, closes; a cluster message
/// counts one) handled per round, whatever the batches they came in: a
/// batch is split if need be and its rest handled first next round. So the
/// answers decided so far go out after at most this much work, however
/// many requests a flood has queued.
pub const MAX_REQUESTS_PER_ROUND: usize = 4096;

/// Every sender of a channel is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gone;

/// Where the lock owner's input comes from and where its outputs go.
pub trait OwnerPorts {
    /// The next message on the owner's input, without waiting: `Ok(None)`
    /// when there is none now, `Err(Gone)` when every sender is gone.
    fn try_recv(&mut self) -> Result<Option<ToOwner>, Gone>;
    /// Queue a message for replication, behind the others.
    fn queue_for_repl(&mut self, msg: TableToCluster);
    /// Queue an answer for its connection's I/O loop.
    fn answer(&mut self, conn: ConnId, answer: Answer);
    /// Queue every answer of `answers`, in order, leaving it empty. A shell
    /// may take the vector whole (one loop: no answer copied).
    fn answers(&mut self, answers: &mut Vec<(ConnId, Answer)>) {
        for (conn, answer) in answers.drain(..) {
            self.answer(conn, answer);
        }
    }
    /// Queue word that a connection is forgotten, behind its answers.
    fn forget(&mut self, conn: ConnId);
    /// Clients were answered this round.
    fn answered(&mut self) {}
    /// A `ToOwner::Retire` was handled: tell `done` once its answers left.
    fn retiring(&mut self, done: Sender<()>);
    /// Send what is queued for replication, as far as there is room.
    fn send_to_repl(&mut self);
    /// Send the queued answers to the I/O loops, as far as there is room.
    fn send_answers(&mut self);
}

/// What the lock owner's round works on besides its ports: the core, the
/// messages taken in and not handled yet (in arrival order), the counts.
pub struct OwnerRound {
    pub core: TableCore,
    /// Messages taken in and not handled yet; the rest of a round past
    /// `MAX_REQUESTS_PER_ROUND` waits here, first in line for the next.
    pub queue: VecDeque<ToOwner>,
    pub stats: OwnerStats,
}

impl OwnerRound {
    pub fn new(core: TableCore) -> OwnerRound {
        let stats = OwnerStats::new(core.is_serving());
        OwnerRound {
            core,
            queue: VecDeque::new(),
            stats,
        }
    }

    /// Add what else has arrived, in order, up to the round's limits (of
    /// messages, and of client events). False when every sender is gone
    /// and nothing is left to handle.
    pub fn take_more(&mut self, ports: &mut impl OwnerPorts) -> bool {
        let mut events: usize = self.queue.iter().map(events_in).sum();
        while self.queue.len() < MAX_MESSAGES_PER_ROUND && events < MAX_REQUESTS_PER_ROUND {
            match ports.try_recv() {
                Ok(Some(message)) => {
                    events += events_in(&message);
                    self.queue.push_back(message);
                }
                Ok(None) => break,
                Err(Gone) => return !self.queue.is_empty(),
            }
        }
        true
    }

    /// One round at `now`: the gauges read, the queued messages handled in
    /// arrival order (client batches and cluster messages as they came, up
    /// to `MAX_REQUESTS_PER_ROUND` events), then the effects carried out:
    /// messages for replication, then the answers, the token gauges
    /// stored, everything sent, then (after a role transfer)
    /// `Redirected`.
    pub fn round(&mut self, now: Now, gauges: &Gauges, ports: &mut impl OwnerPorts) {
        let readings = GaugeReadings {
            conns: gauges.conns.load(Ordering::Relaxed),
            heard_active_ms: gauges.heard_active_ms.load(Ordering::Relaxed),
            synced_standbys: gauges.synced_standbys.load(Ordering::Relaxed),
        };
        self.core.begin_round(now, readings);
        let mut budget = MAX_REQUESTS_PER_ROUND;
        while budget > 0
            && let Some(message) = self.queue.pop_front()
        {
            match message {
                ToOwner::Clients(mut batch) => {
                    if batch.len() > budget {
                        // The rest goes first next round, in order.
                        let rest = batch.split_off(budget);
                        self.queue.push_front(ToOwner::Clients(rest));
                    }
                    budget -= batch.len();
                    for inbound in batch {
                        self.stats.count_inbound(&inbound);
                        self.core.handle_inbound(now, inbound);
                    }
                }
                ToOwner::Cluster(msg) => {
                    budget -= 1;
                    let weight = msg.weight();
                    self.core.handle_cluster(now, msg);
                    // The replication thread may read its peers for that
                    // much more (messages::capacity).
                    gauges.cluster_queued.applied(weight);
                }
                ToOwner::Scrape => {
                    budget -= 1;
                    self.stats.scrape_wanted = true;
                }
                ToOwner::Keys(ask) => {
                    budget -= 1;
                    match &mut self.stats.keys_wanted {
                        Some(wanted) => wanted.merge(&ask),
                        None => self.stats.keys_wanted = Some(ask),
                    }
                }
                ToOwner::Retire(done) => {
                    budget -= 1;
                    self.core.retire(now);
                    ports.retiring(done);
                }
            }
        }
        self.end_round(now, gauges, ports);
    }

    fn end_round(&mut self, now: Now, gauges: &Gauges, ports: &mut impl OwnerPorts) {
        let effects = self.core.end_round(now);
        let answered = !effects.answers.is_empty();
        let redirected = std::mem::take(&mut effects.redirected);
        // (Most rounds have no message and no close: no drain for them.)
        if !effects.to_cluster.is_empty() {
            for msg in effects.to_cluster.drain(..) {
                ports.queue_for_repl(msg);
            }
        }
        if answered {
            for (conn, answer) in &effects.answers {
                // A loop's watchers' entry (change lines, the end of the
                // watches) answers no request: the loop counts its lines.
                if !conn.is_watchers() {
                    self.stats.count_answer(answer);
                }
            }
            ports.answers(&mut effects.answers);
        }
        if !effects.forgotten.is_empty() {
            for conn in effects.forgotten.drain(..) {
                ports.forget(conn);
            }
        }
        if answered {
            ports.answered();
        }
        // What replication's heartbeats carry (`tick`).
        gauges
            .last_issued
            .store(self.core.last_issued(), Ordering::Relaxed);
        gauges.ceiling.store(self.core.ceiling(), Ordering::Relaxed);
        ports.send_to_repl();
        ports.send_answers();
        if redirected {
            ports.queue_for_repl(TableToCluster::Redirected);
            ports.send_to_repl();
        }
    }
}

/// What a message counts against `MAX_REQUESTS_PER_ROUND`.
fn events_in(message: &ToOwner) -> usize {
    match message {
        ToOwner::Clients(batch) => batch.len(),
        ToOwner::Cluster(_) | ToOwner::Scrape | ToOwner::Keys(_) | ToOwner::Retire(_) => 1,
    }
}

/// The replication thread's shell as the shared functions see it: its
/// clock, its core, its inbox, and where the core's effects go.
pub trait ReplShell {
    /// The clock, read now.
    fn now(&self) -> Now;
    fn core(&mut self) -> &mut ClusterCore;
    fn gauges(&self) -> &Gauges;
    /// The next message in the inbox, without waiting: `Ok(None)` when it
    /// is empty, `Err(Gone)` when every sender is gone.
    fn next_inbox(&mut self) -> Result<Option<ToRepl>, Gone>;
    /// The thread is to stop (asked to, or its inbox is gone).
    fn stop(&mut self);
    /// It has stopped or is stopping: take nothing more from the inbox.
    fn stopped(&self) -> bool;
    /// Take over a peer link an I/O loop adopted for this thread.
    fn adopt(&mut self, stream: Stream, bytes: Vec<u8>);
    /// Open an outgoing link to `peer`.
    fn dial(&mut self, peer: usize);
    /// Queue `msg` on the outgoing link to `peer`.
    fn send(&mut self, peer: usize, msg: PeerMsg);
    fn drop_out(&mut self, peer: usize);
    fn drop_in(&mut self, link: LinkId);
    /// Queue a message for the lock owner, behind the others.
    fn to_owner(&mut self, msg: ClusterToTable);
    /// Send what is queued for the lock owner, as far as there is room.
    fn send_to_owner(&mut self);
    /// Write what is queued on every outgoing link.
    fn flush_peers(&mut self);
    /// The core's exit: everything queued has been sent and flushed.
    fn exit(&mut self);
}

/// Carry out the core's effects, including those that carrying them out
/// causes (a dial refused at once, say).
pub fn carry_out<S: ReplShell>(shell: &mut S) {
    loop {
        let effects: Vec<ClusterEffect> = shell.core().poll_effects().collect();
        if effects.is_empty() {
            return;
        }
        for effect in effects {
            match effect {
                ClusterEffect::Dial { peer } => shell.dial(peer),
                ClusterEffect::Send { peer, msg } => shell.send(peer, msg),
                ClusterEffect::DropOut { peer } => shell.drop_out(peer),
                ClusterEffect::DropIn { link } => shell.drop_in(link),
                ClusterEffect::ToTable(msg) => shell.to_owner(msg),
                ClusterEffect::Exit => {
                    shell.send_to_owner();
                    shell.flush_peers();
                    shell.exit();
                }
            }
        }
    }
}

/// Time-driven work after the events: the gauges the owner reads, the
/// tokens the owner stored (for the heartbeats), the core's tick; then
/// everything sent and flushed.
pub fn tick<S: ReplShell>(shell: &mut S) {
    let now = shell.now();
    let synced = shell.core().synced_standbys(now);
    shell
        .gauges()
        .synced_standbys
        .store(synced, Ordering::Relaxed);
    let (last_issued, ceiling) = {
        let gauges = shell.gauges();
        (
            gauges.last_issued.load(Ordering::Relaxed),
            gauges.ceiling.load(Ordering::Relaxed),
        )
    };
    shell.core().set_tokens(last_issued, ceiling);
    shell.core().handle_tick(now);
    carry_out(shell);
    let heard = shell.core().heard_active_ms();
    shell
        .gauges()
        .heard_active_ms
        .store(heard, Ordering::Relaxed);
    shell.send_to_owner();
    shell.flush_peers();
}

/// Take everything in the inbox. Deltas of consecutive messages go to the
/// core as one batch (each message is already one batch of the lock
/// owner's, with each key's last change: `LockTable::take_deltas`).
pub fn take_inbox<S: ReplShell>(shell: &mut S) {
    let mut deltas: Vec<Delta> = Vec::new();
    loop {
        match shell.next_inbox() {
            Ok(Some(ToRepl::Table(TableToCluster::Deltas(more)))) => {
                if deltas.is_empty() {
                    deltas = more;
                } else {
                    deltas.extend(more);
                }
            }
            Ok(Some(other)) => {
                // In order: the deltas before it go first.
                hand_deltas(shell, &mut deltas);
                take_one(shell, other);
                if shell.stopped() {
                    return;
                }
            }
            Err(Gone) => {
                hand_deltas(shell, &mut deltas);
                shell.stop();
                return;
            }
            Ok(None) => return hand_deltas(shell, &mut deltas),
        }
    }
}

/// The deltas gathered so far, to the core, before anything else.
fn hand_deltas<S: ReplShell>(shell: &mut S, deltas: &mut Vec<Delta>) {
    if deltas.is_empty() {
        return;
    }
    let batch = std::mem::take(deltas);
    let now = shell.now();
    shell
        .core()
        .handle_table(now, TableToCluster::Deltas(batch));
    carry_out(shell);
}

/// One message other than deltas.
fn take_one<S: ReplShell>(shell: &mut S, msg: ToRepl) {
    let now = shell.now();
    match msg {
        ToRepl::Table(msg) => shell.core().handle_table(now, msg),
        ToRepl::AdoptPeerLink(stream, bytes) => shell.adopt(stream, bytes),
        ToRepl::Shutdown => shell.core().handle_shutdown(now),
        ToRepl::Stop => return shell.stop(),
    }
    carry_out(shell);
}
