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
//! is a trait: [`OwnerPorts`] and [`ReplShell`], which name no thread type
//! (no channel, no socket).
//!
//! Also the backpressure decisions, for the same reason: what the owner
//! keeps for replication while its channel is full, and when it drops the
//! deltas for a `DeltasLost` ([`ReplBacklog`]); what replication keeps for
//! the owner, and when it stops reading peer links for it, which the core
//! counts as heard ([`OwnerQueue`], [`may_read_peer`]); when a peer's
//! unsent output drops its link ([`MAX_PEER_OUTPUT`], in [`carry_out`]).
//! The shells say how big their ports are; the simulation's are small, so
//! that they fill. The threads implement
//! them with channels, wakers, sockets and the real clock
//! (threads/owner.rs, threads/replication.rs); the simulation with
//! in-memory queues, a simulated network and a simulated clock. So the
//! simulation runs the node's rounds, not a copy of them.
//!
//! Runs on the lock-owner thread ([`OwnerRound`]) and the replication
//! thread (the rest), or on the simulation's one thread.
//!
//! Never does: decide anything about locks or roles (the cores do), read a
//! clock (the shell passes the time in, or says it through
//! [`ReplShell::now`]), block, or touch a socket or channel itself.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::protocol::Answer;
use crate::server::core::cluster_core::{ClusterCore, ClusterEffect, LinkId, OutDown};
use crate::server::core::events::{ConnId, Delta};
use crate::server::core::now::Now;
use crate::server::core::peer_msg::PeerMsg;
use crate::server::core::table_core::{GaugeReadings, TableCore};
use crate::server::messages::{
    ClusterQueued, ClusterToTable, Retired, TableToCluster, ToOwner, capacity,
};
use crate::server::shared::Gauges;
use crate::server::stats::OwnerStats;

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

/// What became of a message offered to a bounded channel.
#[derive(Debug, PartialEq, Eq)]
pub enum Offer<T> {
    /// It is in the channel.
    Taken,
    /// The channel is full: the message comes back.
    Full(T),
    /// Nobody takes from the channel any more.
    Gone,
}

/// What the lock owner keeps for replication while replication's channel
/// is full, in order, and the bound on it: past `limit` deltas
/// (`capacity::OWNER_DELTAS` in the thread; replication has taken nothing
/// for seconds) every queued delta message is dropped, each run of them
/// replaced by one `DeltasLost` where it stood, so a snapshot or role
/// transfer queued after it knows the deltas before it are missing (the
/// cluster core then re-syncs every standby from a fresh snapshot). Token
/// ceilings dropped so still reach the standbys: every heartbeat carries
/// this node's ceiling (`Gauges::ceiling`, stored each round), and the
/// fresh snapshot too. A message alone in the queue is kept (it goes out
/// next; one round's deltas, however many leases ran out in it, are
/// bounded by --max-keys).
#[derive(Debug)]
pub struct ReplBacklog {
    queue: VecDeque<TableToCluster>,
    /// The deltas `queue` carries (a snapshot is bounded by `--max-keys`
    /// instead and counts nothing).
    deltas: usize,
    limit: usize,
    /// How often queued deltas were dropped.
    lost: u64,
}

impl ReplBacklog {
    /// A backlog bounded at `limit` deltas.
    pub fn new(limit: usize) -> ReplBacklog {
        ReplBacklog {
            queue: VecDeque::new(),
            deltas: 0,
            limit,
            lost: 0,
        }
    }

    /// Queue `msg` behind the others.
    pub fn push(&mut self, msg: TableToCluster) {
        self.deltas += deltas_in(&msg);
        self.queue.push_back(msg);
    }

    /// Nothing waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The deltas waiting.
    pub fn deltas(&self) -> usize {
        self.deltas
    }

    /// How often queued deltas were dropped (each time, every standby is
    /// re-synced from a snapshot).
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// The messages waiting, in order.
    pub fn iter(&self) -> impl Iterator<Item = &TableToCluster> {
        self.queue.iter()
    }

    /// Offer what waits to the channel, in order, while it takes; a full
    /// channel keeps the rest here, bounded; one that nobody takes from
    /// drops everything. True when anything was taken.
    pub fn send(&mut self, mut offer: impl FnMut(TableToCluster) -> Offer<TableToCluster>) -> bool {
        let mut sent = false;
        while let Some(msg) = self.queue.pop_front() {
            let deltas = deltas_in(&msg);
            match offer(msg) {
                Offer::Taken => {
                    sent = true;
                    self.deltas -= deltas;
                }
                Offer::Full(msg) => {
                    self.queue.push_front(msg);
                    self.bound();
                    break;
                }
                Offer::Gone => {
                    self.queue.clear();
                    self.deltas = 0;
                    break;
                }
            }
        }
        sent
    }

    /// Past the bound, with more than one message waiting: the deltas are
    /// dropped, their places marked.
    fn bound(&mut self) {
        if self.queue.len() <= 1 || self.deltas <= self.limit {
            return;
        }
        log::warn!(
            "lock owner: replication has taken no change for too long ({} waiting); dropping \
             them, the standbys get fresh snapshots",
            self.deltas
        );
        let mut kept = VecDeque::with_capacity(self.queue.len());
        for msg in self.queue.drain(..) {
            match msg {
                TableToCluster::Deltas(_) => {
                    if !matches!(kept.back(), Some(TableToCluster::DeltasLost)) {
                        kept.push_back(TableToCluster::DeltasLost);
                    }
                }
                other => kept.push_back(other),
            }
        }
        self.queue = kept;
        self.deltas = 0;
        self.lost += 1;
    }
}

/// The deltas a message for replication carries (what [`ReplBacklog`]
/// counts; a snapshot piece counts nothing: the pieces in flight are
/// bounded by `table_core::CHUNKS_IN_FLIGHT`).
fn deltas_in(msg: &TableToCluster) -> usize {
    match msg {
        TableToCluster::Deltas(deltas) => deltas.len(),
        _ => 0,
    }
}

/// Where the lock owner's input comes from and where its outputs go.
pub trait OwnerPorts {
    /// The next message on the owner's input, without waiting: `Ok(None)`
    /// when there is none now, `Err(Gone)` when every sender is gone.
    fn try_recv(&mut self) -> Result<Option<ToOwner>, Gone>;
    /// Offer a message to replication's channel, without waiting.
    fn offer_to_repl(&mut self, msg: TableToCluster) -> Offer<TableToCluster>;
    /// Messages went into replication's channel this round (a shell may
    /// wake the thread).
    fn sent_to_repl(&mut self) {}
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
    /// A `ToOwner::Retire` was handled: signal `done` once its answers left.
    /// `Retired` is opaque here (the round only hands it on; what it wraps
    /// is the shell's business). Only a node without peers retires, so the
    /// cluster simulation never sends one.
    fn retiring(&mut self, done: Retired);
    /// Send the queued answers to the I/O loops, as far as there is room.
    fn send_answers(&mut self);
}

/// What the lock owner's round works on besides its ports: the core, the
/// messages taken in and not handled yet (in arrival order), what waits
/// for replication, the counts.
pub struct OwnerRound {
    pub core: TableCore,
    /// Messages taken in and not handled yet; the rest of a round past
    /// `MAX_REQUESTS_PER_ROUND` waits here, first in line for the next.
    pub queue: VecDeque<ToOwner>,
    /// Messages for replication its channel had no room for, bounded.
    pub to_repl: ReplBacklog,
    pub stats: OwnerStats,
}

impl OwnerRound {
    /// The round of `core`, what waits for replication bounded at
    /// `capacity::OWNER_DELTAS` deltas.
    pub fn new(core: TableCore) -> OwnerRound {
        OwnerRound::with_repl_limit(core, capacity::OWNER_DELTAS)
    }

    /// The same, bounded at `limit` deltas (the simulation's ports are
    /// small, so that they fill).
    pub fn with_repl_limit(core: TableCore, limit: usize) -> OwnerRound {
        let stats = OwnerStats::new(core.is_serving());
        OwnerRound {
            core,
            queue: VecDeque::new(),
            to_repl: ReplBacklog::new(limit),
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
            chunks_taken: gauges.chunks_taken.load(Ordering::Relaxed),
            peer_output: gauges.peer_output.load(Ordering::Relaxed),
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
                self.to_repl.push(msg);
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
        self.send_to_repl(ports);
        ports.send_answers();
        if redirected {
            self.to_repl.push(TableToCluster::Redirected);
            self.send_to_repl(ports);
        }
    }

    /// Send what waits for replication, in order, as far as its channel
    /// has room (the rest waits, bounded: [`ReplBacklog`]). A round that
    /// ran nothing but a retry after a full channel sends here too.
    pub fn send_to_repl(&mut self, ports: &mut impl OwnerPorts) {
        if self.to_repl.send(|msg| ports.offer_to_repl(msg)) {
            ports.sent_to_repl();
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

/// Unsent bytes to one peer past which its link is dropped (the thread's
/// bound; [`ReplShell::peer_output_limit`]): a slow or dead standby only
/// grows its own bounded output, never the active's answers, and is
/// re-synced from a fresh snapshot once it dials back.
pub const MAX_PEER_OUTPUT: usize = 64 * 1024 * 1024;

/// What the replication thread's round takes from its inbox: the lock
/// owner's messages and the node's stop words. A peer link an I/O loop
/// hands over is the shell's business (a socket): it adopts it as it takes
/// it from its channel.
#[derive(Debug)]
pub enum ReplInput {
    Table(TableToCluster),
    Shutdown,
    Stop,
}

/// The messages for the lock owner, in order, and the bound on them.
///
/// `queued` counts the entries of every message pushed here and not yet
/// applied by the owner, which takes each off once it has applied it
/// ([`OwnerRound::round`]): this backlog plus the owner's channel. While it
/// is at `limit` (`capacity::CLUSTER_ENTRIES` in the thread) or more,
/// [`OwnerQueue::takes_peer_input`] says no and no incoming peer link is
/// read ([`may_read_peer`]). Messages for the owner come from peer input,
/// or from a tick or the owner's own messages (a handful each), so the
/// bound holds to within one read's worth.
#[derive(Debug)]
pub struct OwnerQueue {
    backlog: VecDeque<ClusterToTable>,
    queued: Arc<ClusterQueued>,
    limit: usize,
}

impl OwnerQueue {
    pub fn new(queued: Arc<ClusterQueued>, limit: usize) -> OwnerQueue {
        OwnerQueue {
            backlog: VecDeque::new(),
            queued,
            limit,
        }
    }

    /// Queue `msg` behind the others.
    pub fn push(&mut self, msg: ClusterToTable) {
        self.queued.add(msg.weight());
        self.backlog.push_back(msg);
    }

    /// Offer what is queued to the owner's channel, in order, while it
    /// takes. A channel whose owner is gone drops everything.
    pub fn send(&mut self, mut offer: impl FnMut(ClusterToTable) -> Offer<ClusterToTable>) {
        while let Some(msg) = self.backlog.pop_front() {
            let weight = msg.weight();
            match offer(msg) {
                Offer::Taken => {}
                Offer::Full(msg) => {
                    self.backlog.push_front(msg);
                    return;
                }
                Offer::Gone => {
                    // The owner is gone (the node stops): none of it will
                    // ever be applied.
                    let rest: usize = self.backlog.iter().map(ClusterToTable::weight).sum();
                    self.backlog.clear();
                    self.queued.applied(weight.saturating_add(rest));
                    return;
                }
            }
        }
    }

    /// Messages wait here for room in the owner's channel.
    pub fn is_waiting(&self) -> bool {
        !self.backlog.is_empty()
    }

    /// Entries queued here or in the owner's channel, not yet applied.
    pub fn queued(&self) -> usize {
        self.queued.get()
    }

    /// May incoming peer links be read now? Not while what waits for the
    /// owner is at its bound.
    pub fn takes_peer_input(&self) -> bool {
        self.queued() < self.limit
    }
}

/// Before incoming link `link` is read: false while what waits for the
/// lock owner is at its bound ([`OwnerQueue`]). The link is then held:
/// what its peer sends waits in the kernel's socket buffers (TCP pushes
/// back on the sender), and the core counts it as heard, not silent
/// (`handle_in_held`): a busy owner costs no link and makes no failover.
pub fn may_read_peer<S: ReplShell>(shell: &mut S, link: LinkId) -> bool {
    if shell.owner_queue().takes_peer_input() {
        return true;
    }
    let now = shell.now();
    shell.core().handle_in_held(now, link);
    carry_out(shell);
    false
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
    fn next_inbox(&mut self) -> Result<Option<ReplInput>, Gone>;
    /// The thread is to stop (asked to, or its inbox is gone).
    fn stop(&mut self);
    /// It has stopped or is stopping: take nothing more from the inbox.
    fn stopped(&self) -> bool;
    /// Open an outgoing link to `peer`.
    fn dial(&mut self, peer: usize);
    /// Queue `msg` on the outgoing link to `peer`: the bytes to `peer` not
    /// written yet, with it.
    fn send(&mut self, peer: usize, msg: PeerMsg) -> usize;
    /// The most bytes not yet written on one outgoing link.
    fn most_unsent(&self) -> usize;
    /// Unsent bytes to one peer past which its link is dropped.
    fn peer_output_limit(&self) -> usize {
        MAX_PEER_OUTPUT
    }
    /// The link to `peer` is about to be dropped: its unsent output passed
    /// [`ReplShell::peer_output_limit`] (a shell may say so).
    fn too_far_behind(&mut self, _peer: usize) {}
    fn drop_out(&mut self, peer: usize);
    fn drop_in(&mut self, link: LinkId);
    /// Queue a message for the lock owner, behind the others.
    fn to_owner(&mut self, msg: ClusterToTable);
    /// What waits for the lock owner ([`may_read_peer`] reads its bound).
    fn owner_queue(&self) -> &OwnerQueue;
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
                ClusterEffect::Send { peer, msg } => {
                    if shell.send(peer, msg) > shell.peer_output_limit() {
                        // A slow or dead standby: its link goes (the core
                        // re-syncs it from a fresh snapshot once it is
                        // back), never the active's memory.
                        shell.too_far_behind(peer);
                        shell.drop_out(peer);
                        let now = shell.now();
                        let why = "output over limit";
                        shell
                            .core()
                            .handle_link_down(now, peer, OutDown::Failed, why);
                    }
                }
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

/// The end of one turn of the replication thread, after its socket
/// events: the inbox ([`take_inbox`]), the time-driven work ([`tick`]),
/// and the most output queued on one peer link told to the lock owner,
/// which makes no snapshot piece while a link is backed up
/// (`table_core::SNAPSHOT_OUTPUT_MAX`). Nothing after the inbox once the
/// thread stops.
pub fn end_turn<S: ReplShell>(shell: &mut S) {
    take_inbox(shell);
    if shell.stopped() {
        return;
    }
    tick(shell);
    let most = shell.most_unsent();
    shell.gauges().peer_output.store(most, Ordering::Relaxed);
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
            Ok(Some(ReplInput::Table(TableToCluster::Deltas(more)))) => {
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
fn take_one<S: ReplShell>(shell: &mut S, msg: ReplInput) {
    let now = shell.now();
    match msg {
        ReplInput::Table(msg) => {
            if matches!(msg, TableToCluster::SnapshotChunk { .. }) {
                // The owner makes the next piece once this one is taken.
                shell.gauges().chunks_taken.fetch_add(1, Ordering::Relaxed);
            }
            shell.core().handle_table(now, msg)
        }
        ReplInput::Shutdown => shell.core().handle_shutdown(now),
        ReplInput::Stop => return shell.stop(),
    }
    carry_out(shell);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Key;

    fn grants(n: usize) -> TableToCluster {
        let key = Key::new(b"k").expect("key");
        TableToCluster::Deltas(vec![Delta::grant(key, 7, 1000); n])
    }

    /// A channel that is full.
    fn full(msg: TableToCluster) -> Offer<TableToCluster> {
        Offer::Full(msg)
    }

    #[test]
    fn deltas_waiting_for_replication_are_bounded_and_their_loss_marked_in_place() {
        const LIMIT: usize = 400;
        let mut backlog = ReplBacklog::new(LIMIT);
        let step = LIMIT / 4;
        // Alone, even a message over the bound is kept: it goes out next.
        backlog.push(grants(LIMIT + 1));
        assert!(!backlog.send(full));
        assert_eq!((backlog.iter().count(), backlog.deltas()), (1, LIMIT + 1));
        let mut backlog = ReplBacklog::new(LIMIT);
        let snapshot = TableToCluster::SnapshotChunk {
            peer: 1,
            ask: 1,
            ceiling: Some(9),
            held: 0,
            entries: vec![],
            last: true,
        };
        backlog.push(grants(step));
        backlog.push(snapshot.clone());
        backlog.push(grants(step));
        backlog.push(grants(step));
        backlog.push(TableToCluster::TransferReady { to: 1 });
        backlog.push(grants(step));
        backlog.send(full);
        assert_eq!((backlog.iter().count(), backlog.deltas()), (6, 4 * step));
        assert_eq!(backlog.lost(), 0, "at the bound: kept");
        backlog.push(grants(1));
        backlog.send(full);
        let kept: Vec<_> = backlog.iter().cloned().collect();
        assert_eq!(
            kept,
            [
                TableToCluster::DeltasLost,
                snapshot,
                TableToCluster::DeltasLost,
                TableToCluster::TransferReady { to: 1 },
                TableToCluster::DeltasLost,
            ]
        );
        assert_eq!((backlog.deltas(), backlog.lost()), (0, 1));
        // And the count follows what is queued.
        backlog.push(grants(3));
        assert_eq!(backlog.deltas(), 3);
        // A channel that takes gets everything, in order; one gone drops it.
        let mut got = Vec::new();
        assert!(backlog.send(|msg| {
            got.push(msg);
            Offer::Taken
        }));
        assert_eq!(got.len(), 6);
        assert!(backlog.is_empty() && backlog.deltas() == 0);
        backlog.push(grants(3));
        assert!(!backlog.send(|_| Offer::Gone));
        assert!(backlog.is_empty() && backlog.deltas() == 0);
    }

    fn deltas(n: u64) -> ClusterToTable {
        ClusterToTable::Deltas((1..=n).map(|c| Delta::Ceiling(c * 16)).collect())
    }

    /// The owner's channel, bounded, in memory.
    struct Chan {
        queue: VecDeque<ClusterToTable>,
        cap: usize,
        gone: bool,
    }

    impl Chan {
        fn new(cap: usize) -> Chan {
            Chan {
                queue: VecDeque::new(),
                cap,
                gone: false,
            }
        }

        fn offer(&mut self, msg: ClusterToTable) -> Offer<ClusterToTable> {
            if self.gone {
                Offer::Gone
            } else if self.queue.len() >= self.cap {
                Offer::Full(msg)
            } else {
                self.queue.push_back(msg);
                Offer::Taken
            }
        }

        /// What the lock owner does with one message (the round): apply
        /// it, then take its entries off what waits.
        fn owner_applies(&mut self, queued: &ClusterQueued) -> Option<ClusterToTable> {
            let msg = self.queue.pop_front()?;
            queued.applied(msg.weight());
            Some(msg)
        }
    }

    #[test]
    fn peer_input_stops_at_the_bound_and_resumes_once_the_owner_catches_up() {
        let queued = Arc::new(ClusterQueued::default());
        let mut q = OwnerQueue::new(Arc::clone(&queued), 100);
        let mut chan = Chan::new(2);
        assert!(q.takes_peer_input());
        q.push(ClusterToTable::Observe(5));
        q.push(deltas(49));
        q.send(|msg| chan.offer(msg));
        assert!(!q.is_waiting(), "both went into the channel");
        assert_eq!(q.queued(), 51, "counted while in the channel too");
        assert!(q.takes_peer_input());
        q.push(deltas(48));
        q.send(|msg| chan.offer(msg));
        assert!(q.is_waiting(), "the channel is full: it waits here");
        assert_eq!(q.queued(), 100);
        assert!(!q.takes_peer_input(), "at the bound: no peer link is read");
        // The owner applies one: under the bound again, and the rest goes
        // on in order.
        assert_eq!(
            chan.owner_applies(&queued),
            Some(ClusterToTable::Observe(5))
        );
        assert!(q.takes_peer_input());
        q.send(|msg| chan.offer(msg));
        assert!(!q.is_waiting());
        assert_eq!(chan.owner_applies(&queued), Some(deltas(49)));
        assert_eq!(chan.owner_applies(&queued), Some(deltas(48)));
        assert_eq!(q.queued(), 0);
    }

    #[test]
    fn a_flood_faster_than_the_owner_stays_within_the_bound_and_loses_nothing() {
        // A reader that queues a batch whenever peer input is taken, eight
        // times a round, and an owner that applies one message a round: what
        // waits never passes the bound by more than one batch, and every
        // batch arrives, in order.
        const LIMIT: usize = 10_000;
        let queued = Arc::new(ClusterQueued::default());
        let mut q = OwnerQueue::new(Arc::clone(&queued), LIMIT);
        let mut chan = Chan::new(4);
        let (mut pushed, mut applied, mut most) = (0u64, 0u64, 0usize);
        for _ in 0..5_000 {
            for _ in 0..8 {
                if q.takes_peer_input() {
                    pushed += 1;
                    q.push(ClusterToTable::Observe(pushed));
                    q.push(deltas(999));
                }
            }
            most = most.max(q.queued());
            q.send(|msg| chan.offer(msg));
            if let Some(ClusterToTable::Observe(n)) = chan.owner_applies(&queued) {
                applied += 1;
                assert_eq!(n, applied, "in order");
            }
            chan.owner_applies(&queued);
        }
        assert!(
            pushed > 1000,
            "the reader was throttled, not stopped: {pushed}"
        );
        assert!(most <= LIMIT + 1001, "{most} entries waited");
        assert!(applied + 10 >= pushed, "{applied} of {pushed}");
    }

    #[test]
    fn a_snapshot_counts_whole_and_an_owner_gone_leaves_nothing_counted() {
        let queued = Arc::new(ClusterQueued::default());
        let mut q = OwnerQueue::new(Arc::clone(&queued), 100);
        q.push(ClusterToTable::Snapshot {
            seq: 1,
            entries: (1..=500).map(|c| Delta::Ceiling(c * 16)).collect(),
        });
        assert_eq!(q.queued(), 501);
        assert!(!q.takes_peer_input());
        let mut chan = Chan::new(1);
        q.send(|msg| chan.offer(msg));
        q.push(deltas(10));
        q.send(|msg| chan.offer(msg));
        assert!(q.is_waiting());
        chan.gone = true;
        q.send(|msg| chan.offer(msg));
        assert!(!q.is_waiting());
        assert_eq!(q.queued(), 501, "the one in the channel is the owner's");
        queued.applied(501);
        assert_eq!(q.queued(), 0);
        queued.applied(7);
        assert_eq!(q.queued(), 0, "never below zero");
    }
}
