//! The lock owner's core: every decision of the lock-owner thread, with no
//! I/O and no clock reads.
//!
//! Owns: the node's [`LockTable`] and its serving mode (active, standby,
//! transferring the active role), the requests held back during a role
//! transfer, the replicated token ceiling, and the `I` answer — rendered
//! once and shared (an `Arc`) by every `I` answered until one of its
//! figures changes, so a flood of `I` costs no string per answer. Events come
//! in with the time passed in ([`Now`]): a client's request, refusal or
//! close ([`Inbound`]), a message from the cluster core
//! ([`ClusterToTable`]), and the start and end of a round (timers, the
//! clock's token floor, the ceiling). Effects go out in [`TableEffects`]:
//! answers per connection in the order they must leave, connections to
//! forget, and messages for the cluster core. [`TableCore::next_wake_ms`]
//! says when a timer is due next.
//!
//! Modes: an active node serves; a standby answers every request but `I`
//! with `M <active>` and applies what the active replicates; a node
//! transferring its role holds every request back (in order) until its
//! successor confirms, then redirects them. A standby that refuses part of
//! what its active replicates (a grant past its `--max-keys`, say) logs it
//! and tells the cluster core, once per snapshot and naming that snapshot
//! (so a refusal a newer one made stale is ignored), which drops the link
//! that carried it: it does not hold the active's state.
//!
//! A standby's snapshot goes in pieces, one per round at most and after the
//! round's own work (`SNAPSHOT_CHUNK` grants), in the same queue as the
//! deltas so that the standby applies both in the owner's order; the next
//! piece waits while the replication thread has not taken the last ones or
//! a peer link is backed up (`GaugeReadings`), so a join never stalls the
//! owner nor grows a buffer without bound.
//!
//! Run by the lock-owner thread (owner.rs, which only moves messages) and,
//! for every simulated node, by the deterministic simulation.
//!
//! Never does: I/O, clock reads, logging of internal types at info level.

use crate::protocol::{Answer, Info, Request};
use crate::server::core::cluster_core::{RateLimit, WARN_EVERY_MS, left_out};
use crate::server::core::contention::{KeysAsk, KeysView};
use crate::server::core::counters::Snapshot;

use crate::server::core::events::{ClusterToTable, ConnId, Delta, Inbound, TableToCluster};
use crate::server::core::lock_table::{Ask, LockTable, Outbox};
use crate::server::core::now::Now;
use crate::server::core::tokens;

/// Tokens reserved ahead of the last one issued: the ceiling replicated to
/// the standbys, so a promoted node starts above anything issued but not yet
/// replicated. Raised when half is used. Tokens follow the clock, so this is
/// `LEAD_MS` of clock: small, so that tokens never run far ahead of the
/// clock (a node restarting without memory starts `LEAD_MS` ahead).
pub const TOKEN_RESERVE: u64 = tokens::LEAD_MS << 20;
/// While changes stream, they go to the standbys at most once per this many
/// ms, as one batch holding each changed key's last state (see
/// [`LockTable::take_deltas`]): a short lock granted and released in
/// between costs the standbys nothing, and a key handed from client to
/// client costs one line. The first change after a quiet spell goes at
/// once. Replication is asynchronous either way; this adds at most this
/// much to a standby's lag, far inside the failure detection time.
pub const REPL_BATCH_MS: u64 = 2;
/// Batches that hold only changes that may wait go at most once per this
/// many ms: frees (a lost one only keeps a key held until its lease runs
/// out) and keys that changed more than once since the last batch — a key handed from
/// client to client many times a millisecond, whose copy on the standbys
/// is a past holder's however often batches go. Each batch wakes a thread
/// on both nodes; a hot key would otherwise cost that 500 times a second.
pub const REPL_SETTLED_MS: u64 = 10;
/// While new keys' grants stream (`REPL_YOUNG_MIN` or more waiting), each
/// goes in the first batch at least this many ms after it was made: a lock
/// held for less is never replicated (it is freed first, and the standbys
/// never needed it), which is what most locks under heavy load are. A grant
/// still held then reaches the standbys within `REPL_YOUNG_MS +
/// REPL_BATCH_MS` of being made; on a lightly used node, within
/// `REPL_BATCH_MS` (at once after a quiet spell).
pub const REPL_YOUNG_MS: u64 = 2;
pub const REPL_YOUNG_MIN: usize = 16;
/// Requests held back during a role transfer, at most; past it they are
/// redirected at once (`M -`). Closes are always held, so that a held
/// request of a closed connection is never served.
pub const MAX_HELD_BACK: usize = 100_000;
/// A standby's snapshot goes in pieces of at most this many grants, one
/// piece per round of the lock owner at most, after the round's own work,
/// so that a join never stalls the owner: the piece costs a round about as
/// much as a few hundred requests (docs/performance.md, "Joining a standby").
pub const SNAPSHOT_CHUNK: usize = 1024;
/// At most one piece per this many ms: a join spreads its cost (the
/// pieces' lines made, sent, read and applied, on both nodes) over about
/// two seconds per million held keys, rather than taking every cycle the
/// machine has for a third of that (docs/performance.md, "Joining a
/// standby": 1024 grants every 2 ms cost the active's clients less than
/// 1024 every 1 ms or every round, and sync 1M keys within 3 s).
pub const SNAPSHOT_PIECE_MS: u64 = 2;
/// Pieces handed to the replication thread and not yet taken by it, at
/// most (`GaugeReadings::chunks_taken`): the owner makes the next one only
/// once replication keeps up.
pub const CHUNKS_IN_FLIGHT: u64 = 2;
/// No piece is made while a peer link has this many bytes or more queued
/// and not yet written (`GaugeReadings::peer_output`): a standby slower to
/// take the stream than the owner to make it holds the stream back (TCP
/// pushes back on the active), instead of growing the active's buffers
/// toward `MAX_PEER_OUTPUT`, which drops the link.
pub const SNAPSHOT_OUTPUT_MAX: usize = 4 * 1024 * 1024;

/// Figures the core reports in `I` but does not decide: read by the shell
/// from the other threads' counters and passed in each round.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GaugeReadings {
    /// Open client connections.
    pub conns: usize,
    /// When a standby last heard from its active (monotonic ms).
    pub heard_active_ms: u64,
    /// Live standbys that hold this node's full state.
    pub synced_standbys: usize,
    /// Snapshot pieces the replication thread has taken, ever (by
    /// `rounds::take_inbox`): with the pieces made, what is in flight.
    pub chunks_taken: u64,
    /// The most bytes queued and not yet written on one outgoing peer link
    /// (by the replication thread, after it writes).
    pub peer_output: usize,
}

/// Where a standby's snapshot has got to: the next key slot of the table
/// (`LockTable::snapshot_from`) to put in a piece for `peer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cursor {
    peer: usize,
    ask: u64,
    next: u32,
    begun: bool,
}

/// What a round of the core asks its shell to do, in this order: send
/// `to_cluster`, deliver `answers` and `forgotten`, then (if set) tell the
/// cluster core `Redirected`.
#[derive(Debug, Default)]
pub struct TableEffects {
    /// Answers in the order they must be written (per connection).
    pub answers: Vec<(crate::server::core::events::ConnId, Answer)>,
    /// Connections to forget once their answers are written.
    pub forgotten: Vec<crate::server::core::events::ConnId>,
    /// Messages for the cluster core, in order.
    pub to_cluster: Vec<TableToCluster>,
    /// Clients were redirected this round (the role went elsewhere): tell
    /// the cluster core once the answers are out.
    pub redirected: bool,
}

impl TableEffects {
    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
            && self.forgotten.is_empty()
            && self.to_cluster.is_empty()
            && !self.redirected
    }
}

/// How this node treats client requests right now.
#[derive(Debug)]
enum Mode {
    Active,
    Standby { active: Option<String> },
    Transferring { held: Vec<Inbound> },
}

/// The lock owner's core. See the module doc.
pub struct TableCore {
    table: LockTable,
    mode: Mode,
    /// A cluster node (replicates while active) rather than a single node.
    clustered: bool,
    ceiling: u64,
    promotion_grace_ms: u64,
    node: String,
    gauges: GaugeReadings,
    outbox: Outbox,
    effects: TableEffects,
    /// When changes last went to the cluster core (clock ms).
    deltas_sent_ms: Option<u64>,
    /// Refused deltas and snapshot entries are logged at most once per
    /// `WARN_EVERY_MS` (a peer could otherwise flood the log).
    refusal_log: RateLimit,
    /// What this standby refused of its active's state since the last
    /// snapshot (the first reason), told to the cluster core
    /// (`StateRefused`): once is enough, the link goes and the next one
    /// starts with a snapshot.
    refused: Option<&'static str>,
    /// The `seq` of the last snapshot taken (0 before any): what a
    /// `StateRefused` is about.
    snapshot_seq: u64,
    /// The `I` answer last rendered, with the figures it shows; reused
    /// while they stay the same (forgotten when a cluster message may have
    /// changed the mode or the active's name).
    info: Option<(InfoFigures, Info)>,
    /// Snapshots being sent in pieces, one per standby that asked, in turn.
    cursors: Vec<Cursor>,
    /// Snapshot pieces made, ever (see `GaugeReadings::chunks_taken`).
    chunks_made: u64,
    /// Grants per piece (`SNAPSHOT_CHUNK`; smaller in the simulation), and
    /// the ms between pieces (`SNAPSHOT_PIECE_MS`).
    chunk_grants: usize,
    piece_ms: u64,
    /// When the last piece was made.
    last_piece_ms: Option<u64>,
    /// No piece is made while a peer link has this much output queued
    /// (`SNAPSHOT_OUTPUT_MAX`; smaller in the simulation).
    output_max: usize,
    /// Rounds a piece was due but held back for a backed-up peer link,
    /// ever.
    pieces_held: u64,
    /// The clock of the round running (for `next_wake_ms`).
    round_ms: u64,
}

/// The numbers an `I` answer shows, to tell whether a rendered one is
/// still right.
type InfoFigures = [u64; 7];

impl TableCore {
    /// A single node starts active; a cluster node starts as a standby that
    /// knows no active, until the cluster core decides.
    pub fn new(table: LockTable, clustered: bool, node: String, promotion_grace_ms: u64) -> Self {
        let mode = if clustered {
            Mode::Standby { active: None }
        } else {
            Mode::Active
        };
        TableCore {
            table,
            mode,
            clustered,
            ceiling: 0,
            promotion_grace_ms,
            node,
            gauges: GaugeReadings::default(),
            outbox: Outbox::default(),
            effects: TableEffects::default(),
            deltas_sent_ms: None,
            refusal_log: RateLimit::default(),
            refused: None,
            snapshot_seq: 0,
            info: None,
            cursors: Vec::new(),
            chunks_made: 0,
            chunk_grants: SNAPSHOT_CHUNK,
            piece_ms: SNAPSHOT_PIECE_MS,
            last_piece_ms: None,
            output_max: SNAPSHOT_OUTPUT_MAX,
            pieces_held: 0,
            round_ms: 0,
        }
    }

    /// Send snapshots in pieces of at most `grants` grants (at least one):
    /// the simulation makes them small, so that its tables stream over
    /// many rounds.
    pub fn with_chunk_grants(mut self, grants: usize) -> Self {
        self.chunk_grants = grants.max(1);
        self
    }

    /// Make at most one snapshot piece per `ms` (0: one per round).
    pub fn with_piece_ms(mut self, ms: u64) -> Self {
        self.piece_ms = ms;
        self
    }

    /// Make no snapshot piece while a peer link has `bytes` of output
    /// queued (`SNAPSHOT_OUTPUT_MAX`): the simulation's links hold little.
    pub fn with_output_max(mut self, bytes: usize) -> Self {
        self.output_max = bytes;
        self
    }

    /// Rounds a snapshot piece was due but held back because a peer link
    /// had `SNAPSHOT_OUTPUT_MAX` of output queued, ever.
    pub fn pieces_held(&self) -> u64 {
        self.pieces_held
    }

    /// A snapshot is being sent in pieces (to some standby).
    pub fn is_sending_snapshot(&self) -> bool {
        !self.cursors.is_empty()
    }

    /// The lock table (read only: invariants, stats).
    pub fn table(&self) -> &LockTable {
        &self.table
    }

    /// Serving clients now (active, not transferring the role).
    pub fn is_serving(&self) -> bool {
        matches!(self.mode, Mode::Active)
    }

    /// A standby (not active, not transferring the active role).
    pub fn is_standby(&self) -> bool {
        matches!(self.mode, Mode::Standby { .. })
    }

    /// Transferring the active role: requests are held back.
    pub fn is_transferring(&self) -> bool {
        matches!(self.mode, Mode::Transferring { .. })
    }

    /// The largest token this node issued itself (for heartbeats).
    pub fn last_issued(&self) -> u64 {
        self.table.stats().last_issued
    }

    /// The replicated token ceiling (0 before any).
    pub fn ceiling(&self) -> u64 {
        self.ceiling
    }

    /// The next time a timer is due, or a batch of changes for the
    /// standbys.
    pub fn next_wake_ms(&self) -> Option<u64> {
        let timer = self
            .table
            .next_wake_ms()
            .filter(|_| !self.is_transferring());
        let due = [self.deltas_due_ms(), self.chunk_due_ms()]
            .into_iter()
            .flatten()
            .min();
        match due {
            Some(due) => Some(timer.map_or(due, |t| t.min(due))),
            None => timer,
        }
    }

    /// When the next snapshot piece may go: its time (`piece_ms` after
    /// the last) if replication keeps up, else a millisecond on (the
    /// readings that hold it back are other threads' counters, which wake
    /// no one).
    fn chunk_due_ms(&self) -> Option<u64> {
        if self.cursors.is_empty() {
            return None;
        }
        Some(if self.chunk_room() {
            self.next_piece_ms()
        } else {
            self.round_ms.saturating_add(1).max(self.next_piece_ms())
        })
    }

    /// When the next piece may be made, replication keeping up.
    fn next_piece_ms(&self) -> u64 {
        self.last_piece_ms
            .map_or(0, |last| last.saturating_add(self.piece_ms))
            .max(self.round_ms)
    }

    /// Replication has taken the pieces made but `CHUNKS_IN_FLIGHT`, and no
    /// peer link's output is backed up.
    fn chunk_room(&self) -> bool {
        self.chunks_made.saturating_sub(self.gauges.chunks_taken) < CHUNKS_IN_FLIGHT
            && !self.output_backed_up()
    }

    /// A peer link has `output_max` or more queued and not yet written.
    fn output_backed_up(&self) -> bool {
        self.gauges.peer_output >= self.output_max
    }

    /// The next piece of the snapshot of the standby whose turn it is,
    /// after the round's own work (its deltas taken first): at most
    /// `chunk_grants` grants from where its cursor is. A key the cursor
    /// has passed is kept current on the standby by the deltas that follow
    /// in the same queue; a key granted after the snapshot began whose
    /// grant has not gone in a batch yet is left to that batch
    /// (`LockTable::snapshot_from`).
    fn send_chunk(&mut self, now: Now) {
        if self.cursors.is_empty() || !self.replicating() || now.ms < self.next_piece_ms() {
            return;
        }
        if !self.chunk_room() {
            if self.output_backed_up() {
                self.pieces_held = self.pieces_held.saturating_add(1);
            }
            return;
        }
        self.last_piece_ms = Some(now.ms);
        let mut cursor = self.cursors.remove(0);
        let mut entries = Vec::with_capacity(self.chunk_grants.min(self.table.stats().holders));
        let next =
            self.table
                .snapshot_from(now.ms_ceil, cursor.next, self.chunk_grants, &mut entries);
        let ceiling = (!cursor.begun).then_some(self.ceiling);
        cursor.begun = true;
        self.chunks_made = self.chunks_made.saturating_add(1);
        self.effects.to_cluster.push(TableToCluster::SnapshotChunk {
            peer: cursor.peer,
            ask: cursor.ask,
            ceiling,
            held: self.table.stats().holders,
            entries,
            last: next.is_none(),
        });
        if let Some(next) = next {
            cursor.next = next;
            self.cursors.push(cursor);
        }
    }

    /// When the changes recorded so far are to be sent, if there are any:
    /// an urgent one (a single handover or extension, or a new key's grant)
    /// at most `REPL_BATCH_MS` after the last batch — new grants, while
    /// `REPL_YOUNG_MIN` or more wait, once the oldest is `REPL_YOUNG_MS`
    /// old — and the others at most `REPL_SETTLED_MS` after it. A raised
    /// ceiling goes at once, with the round that raised it: the tokens
    /// answered from then on may be above the ceiling the standbys know
    /// (when the counter jumped: a peer's token, the wall clock), and a
    /// lock granted and freed within a batch, or a key handed over many
    /// times, puts its tokens in no delta. Ceilings are raised about once
    /// per `LEAD_MS / 2` of clock, so this costs a few batches a second.
    fn deltas_due_ms(&self) -> Option<u64> {
        let ready = self.table.changes_ready();
        let after = |ms: u64| {
            self.deltas_sent_ms
                .map_or(0, |sent| sent.saturating_add(ms))
        };
        let young = ready
            .oldest_young_ms
            .map(|oldest| oldest.saturating_add(Self::hold_young_ms(&ready)));
        let urgent = ready.urgent.then_some(0);
        let urgent = [urgent, young]
            .into_iter()
            .flatten()
            .min()
            .map(|at| at.max(after(REPL_BATCH_MS)));
        let settled = ready.settled.then(|| after(REPL_SETTLED_MS));
        let ceiling = ready.ceiling.then_some(0);
        [urgent, settled, ceiling].into_iter().flatten().min()
    }

    /// How long new keys' grants wait: `REPL_YOUNG_MS` while many stream,
    /// else not at all (holding a few saves nothing).
    fn hold_young_ms(ready: &crate::server::core::lock_table::Ready) -> u64 {
        if ready.young >= REPL_YOUNG_MIN {
            REPL_YOUNG_MS
        } else {
            0
        }
    }

    /// The start of a round: tokens go above the wall clock's floor (so a
    /// token issued later by any node, even one cut off from the others, is
    /// larger, clocks permitting), and due timers fire.
    pub fn begin_round(&mut self, now: Now, gauges: GaugeReadings) {
        self.gauges = gauges;
        self.round_ms = now.ms;
        self.table.metrics_mut().begin_round();
        self.table.observe_token(tokens::clock_floor(now.unix_ms));
        self.table.set_replicating(self.replicating());
        // Not while the role is being transferred: the successor has the
        // state as of HANDOFF and runs the same leases itself; a key this
        // node handed to a waiter now would be granted twice. Timers due
        // meanwhile fire once the transfer is abandoned (late by at most
        // its timeout), or never here when it succeeds.
        if !self.is_transferring() {
            self.table.poll_timers(now.ms, &mut self.outbox);
            self.table.take_watch_lines(&mut self.outbox);
        }
    }

    /// One event from a client connection.
    #[inline]
    pub fn handle_inbound(&mut self, now: Now, inbound: Inbound) {
        match inbound {
            // Nearly all traffic: a request to an active node, served at
            // once (what the general match below does with it, in one step).
            Inbound::Request(conn, request)
                if matches!(self.mode, Mode::Active) && !matches!(request, Request::Info) =>
            {
                self.serve(now, conn, request);
                self.table.take_watch_lines(&mut self.outbox);
            }
            inbound => self.handle_inbound_other(now, inbound),
        }
    }

    fn handle_inbound_other(&mut self, now: Now, inbound: Inbound) {
        match (&mut self.mode, inbound) {
            (_, Inbound::Request(conn, Request::Info)) => {
                let info = self.info(now);
                self.outbox.answers.push((conn, info));
            }
            // Bookkeeping of the loops' watchers, in every mode: it mirrors
            // what the loops hold (core/watchers.rs).
            (_, Inbound::Watching { worker, key, on }) => {
                self.table.watchers_mut().set(worker, key, on);
            }
            (Mode::Transferring { held }, inbound) => {
                if held.len() < MAX_HELD_BACK || matches!(inbound, Inbound::Closed(_)) {
                    held.push(inbound);
                } else if let Inbound::Request(conn, request) = &inbound {
                    self.outbox.answers.push((*conn, moved(None, request)));
                } else {
                    self.handle_now(now, inbound);
                }
            }
            (_, inbound) => self.handle_now(now, inbound),
        }
    }

    fn handle_now(&mut self, now: Now, inbound: Inbound) {
        match inbound {
            Inbound::Refused(conn, op, key, reason) => {
                self.table
                    .handle_refused(conn, op, key, reason, &mut self.outbox)
            }
            Inbound::Closed(conn) => {
                self.table.handle_disconnect(conn);
                self.outbox.closes.push(conn);
            }
            Inbound::Watching { worker, key, on } => {
                self.table.watchers_mut().set(worker, key, on);
            }
            Inbound::Request(conn, request) => match &self.mode {
                Mode::Standby { active } => {
                    let answer = moved(active.clone(), &request);
                    self.outbox.answers.push((conn, answer));
                }
                _ => self.serve(now, conn, request),
            },
        }
        // The change lines of what it changed, after its answers.
        self.table.take_watch_lines(&mut self.outbox);
    }

    #[inline]
    fn serve(&mut self, now: Now, conn: crate::server::core::events::ConnId, request: Request) {
        let out = &mut self.outbox;
        let now_ms = now.ms_ceil;
        match request {
            Request::Acquire {
                key,
                lease_ms,
                wait_ms,
                limit,
                value,
            } => self.table.handle_acquire(
                now_ms,
                conn,
                key,
                lease_ms,
                wait_ms,
                Ask { limit, value },
                out,
            ),
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
            Request::Watch { key } => self.table.handle_watch(now_ms, conn, key, out),
            Request::Unwatch { key } => out.answers.push((conn, Answer::Unwatched { key })),
            Request::Info => {}
            // The I/O loop answers `U` itself and never forwards it.
            Request::Auth { .. } => log::error!("lock owner: a U request reached the owner"),
        }
    }

    /// One message from the cluster core.
    pub fn handle_cluster(&mut self, now: Now, msg: ClusterToTable) {
        self.info = None;
        match msg {
            ClusterToTable::BecomeActive { floor, failover } => {
                self.become_active(now, floor, failover);
            }
            ClusterToTable::Follow { active } => {
                log::info!(
                    "lock owner: now a standby of {}",
                    active.as_deref().unwrap_or("no known active")
                );
                self.stop_serving(now, active);
            }
            ClusterToTable::StartTransfer { to } => self.start_transfer(now, to),
            ClusterToTable::AbortTransfer => {
                log::warn!("lock owner: role transfer abandoned; serving again");
                self.resume_serving(now);
            }
            ClusterToTable::FinishTransfer { to } => {
                log::info!("lock owner: {to} took the active role over; redirecting clients");
                self.stop_serving(now, Some(to));
                self.effects.redirected = true;
            }
            ClusterToTable::Retire => {
                log::info!("lock owner: no successor; answering waiters M -");
                self.stop_serving(now, None);
                self.effects.redirected = true;
            }
            ClusterToTable::Snapshot { seq, entries } => self.load_snapshot(now, seq, entries),
            ClusterToTable::Deltas(deltas) => self.apply_deltas(now, deltas),
            ClusterToTable::Observe(token) => self.table.observe_token(token),
            ClusterToTable::SnapshotWanted { peer, ask } => {
                // Pieces go from the end of this round on; the changes so
                // far go first (the first piece's ceiling is above them).
                self.flush_deltas(now);
                self.raise_ceiling();
                self.cursors.retain(|c| c.peer != peer);
                if self.replicating() {
                    self.cursors.push(Cursor {
                        peer,
                        ask,
                        next: 0,
                        begun: false,
                    });
                }
            }
            ClusterToTable::SnapshotStop { peer } => self.cursors.retain(|c| c.peer != peer),
            ClusterToTable::SnapshotEnd { seq } => {
                if seq == self.snapshot_seq && self.refused.is_none() {
                    self.effects
                        .to_cluster
                        .push(TableToCluster::SnapshotTaken { seq });
                }
            }
        }
    }

    /// The cluster core made this node the active: its tokens go above
    /// `floor`; after a `failover`, keys it does not know as held wait out
    /// the promotion grace; then it serves.
    fn become_active(&mut self, now: Now, floor: u64, failover: bool) {
        log::info!("lock owner: now active");
        if let Some(why) = self.refused.take() {
            // Handed the role (or elected) before the cluster core
            // heard of the refusal, or with no other node left.
            log::error!(
                "lock owner: this node serves without part of the old active's state: \
                 it refused {why}; those keys are not known as held here"
            );
        }
        self.table.observe_token(floor);
        if failover && self.promotion_grace_ms > 0 {
            log::info!(
                "lock owner: promotion grace: unknown keys wait {} ms",
                self.promotion_grace_ms
            );
            self.table
                .set_grace_until(now.ms.saturating_add(self.promotion_grace_ms));
        }
        self.ceiling = 0;
        self.resume_serving(now);
    }

    /// Hand the active role to `to`: requests are held back from now, and
    /// the successor is told it may take over once it has every change.
    fn start_transfer(&mut self, now: Now, to: usize) {
        log::info!("lock owner: transferring the active role; holding requests back");
        if matches!(self.mode, Mode::Active) {
            self.mode = Mode::Transferring { held: Vec::new() };
        }
        // After this round's deltas, so the successor has them all,
        // and a ceiling above every token answered so far (one
        // granted and freed within the batch is in no delta).
        self.raise_ceiling();
        self.flush_deltas(now);
        self.effects
            .to_cluster
            .push(TableToCluster::TransferReady { to });
    }

    /// A standby takes its active's snapshot (number `seq`) as its whole
    /// table: its waiters are redirected first, and entries it refuses are
    /// logged (rate-limited) and reported.
    fn load_snapshot(&mut self, now: Now, seq: u64, entries: Vec<Delta>) {
        self.snapshot_seq = seq;
        let active = match &self.mode {
            Mode::Standby { active } => active.clone(),
            _ => None,
        };
        self.table
            .redirect_waiters(active.as_deref(), &mut self.outbox);
        self.refused = None;
        if let Err((n, why)) = self.table.load_snapshot(now.ms, entries) {
            if let Some(more) = self.refusal_log.allow(now.ms, WARN_EVERY_MS) {
                log::error!(
                    "replication: refused {n} entries of the active's snapshot (the last: {why}){}",
                    left_out(more)
                );
            }
            self.tell_refused(why);
        }
    }

    /// A node that is not the active applies its active's deltas; one it
    /// refuses is logged (rate-limited) and reported.
    fn apply_deltas(&mut self, now: Now, deltas: Vec<Delta>) {
        if matches!(self.mode, Mode::Active) {
            return;
        }
        for delta in deltas {
            if let Err(why) = self.table.apply_delta(now.ms, delta) {
                if let Some(more) = self.refusal_log.allow(now.ms, WARN_EVERY_MS) {
                    log::error!(
                        "replication: refused a delta from the active: {why}{}",
                        left_out(more)
                    );
                }
                self.tell_refused(why);
            }
        }
    }

    /// This standby refused part of its active's state (`why`): tell the
    /// cluster core, once per snapshot, so that it drops the link and stops
    /// saying it holds that state.
    fn tell_refused(&mut self, why: &'static str) {
        if self.refused.is_none() {
            self.refused = Some(why);
            self.effects.to_cluster.push(TableToCluster::StateRefused {
                why,
                snapshot: self.snapshot_seq,
            });
        }
    }

    /// The end of a round: keep the ceiling ahead, send the changes if
    /// their batch is due (`REPL_BATCH_MS`); then hand the round's effects
    /// to the shell.
    pub fn end_round(&mut self, now: Now) -> &mut TableEffects {
        // Changes made outside a client's request (replicated state on a
        // standby, a role change) are told, or forgotten, by now.
        self.table.take_watch_lines(&mut self.outbox);
        self.raise_ceiling();
        if self.deltas_due_ms().is_some_and(|due| now.ms >= due) {
            self.send_deltas(now, REPL_YOUNG_MS);
        }
        self.send_chunk(now);
        // Usually the effects are empty: swap the vectors (each keeps its
        // capacity for the next round) instead of copying every answer.
        if self.effects.answers.is_empty() {
            std::mem::swap(&mut self.effects.answers, &mut self.outbox.answers);
        } else {
            self.effects.answers.append(&mut self.outbox.answers);
        }
        self.effects.forgotten.append(&mut self.outbox.closes);
        &mut self.effects
    }

    fn replicating(&self) -> bool {
        self.clustered && !matches!(self.mode, Mode::Standby { .. })
    }

    /// Serve again (promotion, or an abandoned transfer): requests held back
    /// are served in their order.
    fn resume_serving(&mut self, now: Now) {
        let previous = std::mem::replace(&mut self.mode, Mode::Active);
        self.table.set_replicating(self.clustered);
        self.raise_ceiling();
        if let Mode::Transferring { held } = previous {
            for inbound in held {
                self.handle_now(now, inbound);
            }
        }
    }

    /// A single node is stopping: no node is active from now on, and every
    /// waiter is told so (`M -`).
    pub fn retire(&mut self, now: Now) {
        log::info!("lock owner: stopping: waiters are told no node is active");
        self.stop_serving(now, None);
    }

    /// Stop serving: held-back requests and waiters are redirected.
    fn stop_serving(&mut self, now: Now, active: Option<String>) {
        let previous = std::mem::replace(
            &mut self.mode,
            Mode::Standby {
                active: active.clone(),
            },
        );
        let was_serving = !matches!(previous, Mode::Standby { .. });
        if let Mode::Transferring { held } = previous {
            for inbound in held {
                self.handle_now(now, inbound);
            }
        }
        self.table
            .redirect_waiters(active.as_deref(), &mut self.outbox);
        self.table.set_replicating(false);
        self.cursors.clear();
        if was_serving {
            self.end_watches(active);
        }
    }

    /// The node stopped being active: each I/O loop that has watches is
    /// told once (`M <active> W -` to its watchers), and ends every live
    /// watch with `M <active> W <key>` on its connection. The loops then
    /// tell which keys they no longer watch, as always.
    fn end_watches(&mut self, active: Option<String>) {
        let loops: Vec<usize> = self.table.watchers().loops_watching().collect();
        for worker in loops {
            self.outbox.answers.push((
                ConnId::watchers(worker),
                Answer::Moved {
                    active: active.clone(),
                    op: crate::protocol::Op::Watch,
                    key: None,
                },
            ));
        }
    }

    /// Keep the replicated ceiling TOKEN_RESERVE ahead of the last token.
    fn raise_ceiling(&mut self) {
        if !self.replicating() {
            return;
        }
        let last = self.table.stats().last_token;
        let Some(half) = last.checked_add(TOKEN_RESERVE / 2) else {
            return;
        };
        if half > self.ceiling
            && let Some(ceiling) = last.checked_add(TOKEN_RESERVE)
        {
            self.ceiling = ceiling;
            self.table.note_ceiling(ceiling);
        }
    }

    /// Send every change recorded so far, now.
    fn flush_deltas(&mut self, now: Now) {
        self.send_deltas(now, 0);
    }

    /// Send the changes recorded so far but new keys' grants younger than
    /// `hold_young_ms`.
    fn send_deltas(&mut self, now: Now, hold_young_ms: u64) {
        if !self.table.has_changes() {
            return;
        }
        let hold_young_ms = hold_young_ms.min(Self::hold_young_ms(&self.table.changes_ready()));
        let deltas = self.table.take_deltas(now.ms_ceil, hold_young_ms);
        if self.replicating() && !deltas.is_empty() {
            self.effects.to_cluster.push(TableToCluster::Deltas(deltas));
            self.deltas_sent_ms = Some(now.ms);
        }
    }

    /// A standby: ms since it last heard from its active (0 otherwise).
    fn lag_ms(&self, now: Now) -> u64 {
        match &self.mode {
            Mode::Standby { active: Some(_) } => now.ms.saturating_sub(self.gauges.heard_active_ms),
            _ => 0,
        }
    }

    /// Live standbys that hold this node's state (0 on a standby).
    fn standbys(&self) -> usize {
        match self.mode {
            Mode::Standby { .. } => 0,
            _ => self.gauges.synced_standbys,
        }
    }

    /// The figures of `I` for `--metrics`, into `snap`.
    pub fn fill_snapshot(&self, now: Now, snap: &mut Snapshot) {
        let stats = self.table.stats();
        snap.active = !matches!(self.mode, Mode::Standby { .. });
        snap.handing_off = self.is_transferring();
        snap.held = stats.held as u64;
        snap.holders = stats.holders as u64;
        snap.waiting = stats.waiting as u64;
        snap.last_token = stats.last_token;
        snap.ceiling = self.ceiling.max(stats.last_token);
        snap.lag_ms = self.lag_ms(now);
        snap.standbys = self.standbys() as u64;
    }

    /// The contention view `ask` wants (`GET /keys`), at `now`: taken
    /// between two rounds, in time proportional to the contended keys and
    /// what is asked, never to all keys. A standby shows its replicated
    /// holders (its table has no waiters).
    pub fn keys_view(&self, now: Now, ask: &KeysAsk) -> KeysView {
        // Requests are stamped with `ms_ceil` (leases and waits count from it).
        let mut view = self.table.contention_view(now.ms_ceil, now.unix_ms, ask);
        view.role = match self.mode {
            Mode::Standby { .. } => "standby",
            Mode::Active | Mode::Transferring { .. } => "active",
        };
        view.node = self.node.clone();
        view
    }

    /// The `I` answer: rendered once, and shared by every `I` answered
    /// while its figures stay the same (a flood of `I` then costs a
    /// reference count per answer).
    fn info(&mut self, now: Now) -> Answer {
        let stats = self.table.stats();
        let figures: InfoFigures = [
            stats.last_granted,
            stats.held as u64,
            stats.waiting as u64,
            self.gauges.conns as u64,
            self.ceiling.max(stats.last_token),
            self.lag_ms(now),
            self.standbys() as u64,
        ];
        if let Some((shown, info)) = &self.info
            && *shown == figures
        {
            return Answer::Info(info.clone());
        }
        let (role, state, active) = match &self.mode {
            Mode::Active => ("active", "active", Some(self.node.as_str())),
            Mode::Transferring { .. } => ("active", "handing-off", Some(self.node.as_str())),
            Mode::Standby { active } => ("standby", "standby", active.as_deref()),
        };
        let [token, held, waiting, conns, ceiling, lag_ms, standbys] =
            figures.map(|n| n.to_string());
        let info = Info::from_pairs([
            ("role", role),
            ("node", self.node.as_str()),
            ("active", active.unwrap_or("-")),
            ("token", &token),
            ("held", &held),
            ("waiting", &waiting),
            ("conns", &conns),
            ("state", state),
            ("ceiling", &ceiling),
            ("lag_ms", &lag_ms),
            ("standbys", &standbys),
        ]);
        self.info = Some((figures, info.clone()));
        Answer::Info(info)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Key, Op, Reason};
    use crate::server::core::events::{ConnId, Delta};
    use crate::server::core::lock_table::TableLimits;
    use crate::server::core::tokens::TokenSource;

    const UNIX: u64 = 1_700_000_000_000;

    fn core(clustered: bool) -> TableCore {
        let table = LockTable::new(0, TableLimits::default(), TokenSource::new(0, 0));
        TableCore::new(table, clustered, "n0:1".into(), 0)
    }

    /// A cluster node made active at 1 ms.
    fn active_core() -> TableCore {
        let mut core = core(true);
        cluster(
            &mut core,
            at(1),
            ClusterToTable::BecomeActive {
                floor: 5,
                failover: false,
            },
        );
        core
    }

    fn at(ms: u64) -> Now {
        Now::at(ms, UNIX + ms)
    }

    fn key(k: &str) -> Key {
        Key::new(k.as_bytes()).expect("valid key")
    }

    fn acquire(k: &str, wait_ms: u64) -> Request {
        Request::Acquire {
            key: key(k),
            lease_ms: 1000,
            wait_ms,
            limit: None,
            value: None,
        }
    }

    /// Readings of a node whose replication thread keeps up.
    fn keeping_up() -> GaugeReadings {
        GaugeReadings {
            chunks_taken: u64::MAX,
            ..GaugeReadings::default()
        }
    }

    /// One round with these client events; the answers it decided.
    fn round(core: &mut TableCore, now: Now, inbound: Vec<Inbound>) -> TableEffects {
        core.begin_round(now, keeping_up());
        for i in inbound {
            core.handle_inbound(now, i);
        }
        std::mem::take(core.end_round(now))
    }

    fn cluster(core: &mut TableCore, now: Now, msg: ClusterToTable) -> TableEffects {
        core.begin_round(now, keeping_up());
        core.handle_cluster(now, msg);
        std::mem::take(core.end_round(now))
    }

    const C: ConnId = ConnId(1);
    const D: ConnId = ConnId(2);

    /// The highest token or ceiling in the deltas among the first `upto`
    /// messages of `effects` to the cluster core.
    fn replicated_max(effects: &TableEffects, upto: usize) -> u64 {
        let mut max = 0;
        for msg in &effects.to_cluster[..upto] {
            if let TableToCluster::Deltas(deltas) = msg {
                for delta in deltas {
                    max = max.max(match delta {
                        Delta::Ceiling(c) => *c,
                        Delta::Grant { token, .. } | Delta::Free { token, .. } => *token,
                    });
                }
            }
        }
        max
    }

    fn release(k: &str, token: u64) -> Request {
        Request::Release { key: key(k), token }
    }

    #[test]
    fn a_grant_replicated_within_its_millisecond_says_no_more_than_its_lease() {
        // Mid-millisecond (ms 500, stamped 501): the lease left the standby
        // is told is the lease granted, never one more (a standby refuses a
        // lease above --max-lease, and would drop the link over it).
        let mut core = active_core();
        let now = Now {
            ms: 500,
            ms_ceil: 501,
            unix_ms: UNIX + 500,
        };
        let out = round(&mut core, now, vec![Inbound::Request(C, acquire("k", 0))]);
        let leases: Vec<u64> = out
            .to_cluster
            .iter()
            .filter_map(|m| match m {
                TableToCluster::Deltas(d) => Some(d),
                _ => None,
            })
            .flatten()
            .filter_map(|d| match d {
                Delta::Grant { ms_left, .. } => Some(*ms_left),
                _ => None,
            })
            .collect();
        assert_eq!(leases, vec![1000]);
        // A snapshot taken then says the same.
        let out = cluster(
            &mut core,
            now,
            ClusterToTable::SnapshotWanted { peer: 1, ask: 1 },
        );
        let snap = out.to_cluster.iter().find_map(|m| match m {
            TableToCluster::SnapshotChunk { entries, .. } => Some(entries.clone()),
            _ => None,
        });
        assert!(
            matches!(&snap.as_deref(), Some([Delta::Grant { ms_left: 1000, .. }])),
            "{snap:?}"
        );
    }

    #[test]
    fn a_raised_ceiling_leaves_in_the_round_that_raised_it() {
        let mut core = active_core();
        // A batch at 20 ms: the next may not go for a while.
        round(
            &mut core,
            at(20),
            vec![Inbound::Request(C, acquire("held", 0))],
        );
        let known = core.ceiling();
        // At 21 ms a peer's token lifts the counter past the ceiling the
        // standbys know, and the key is handed over twice (hot: its batch
        // may wait) and a short lock comes and goes (in no delta at all).
        core.begin_round(at(21), GaugeReadings::default());
        core.handle_cluster(at(21), ClusterToTable::Observe(known + 1000));
        core.handle_inbound(at(21), Inbound::Request(D, acquire("held", 1000)));
        let t0 = core.last_issued();
        core.handle_inbound(at(21), Inbound::Request(C, release("held", t0)));
        core.handle_inbound(at(21), Inbound::Request(C, acquire("held", 1000)));
        let t1 = core.last_issued();
        core.handle_inbound(at(21), Inbound::Request(D, release("held", t1)));
        core.handle_inbound(at(21), Inbound::Request(D, acquire("short", 0)));
        let t2 = core.last_issued();
        core.handle_inbound(at(21), Inbound::Request(D, release("short", t2)));
        let out = std::mem::take(core.end_round(at(21)));
        assert!(t2 > known, "the counter jumped past the ceiling");
        let sent = replicated_max(&out, out.to_cluster.len());
        assert!(
            sent > t2,
            "tokens up to {t2} answered, the standbys know up to {sent}"
        );
    }

    #[test]
    fn a_role_transfer_starts_after_a_ceiling_above_every_token_answered() {
        let mut core = active_core();
        round(&mut core, at(2), vec![]);
        let known = core.ceiling();
        // One round: the counter jumps past the ceiling, a lock comes and
        // goes (in no delta), and the transfer starts.
        core.begin_round(at(3), GaugeReadings::default());
        core.handle_cluster(at(3), ClusterToTable::Observe(known + 1000));
        core.handle_inbound(at(3), Inbound::Request(C, acquire("k", 0)));
        let t = core.last_issued();
        core.handle_inbound(at(3), Inbound::Request(C, release("k", t)));
        core.handle_cluster(at(3), ClusterToTable::StartTransfer { to: 1 });
        let out = std::mem::take(core.end_round(at(3)));
        let ready = out
            .to_cluster
            .iter()
            .position(|m| matches!(m, TableToCluster::TransferReady { .. }))
            .expect("the transfer is ready");
        let sent = replicated_max(&out, ready);
        assert!(
            sent > t,
            "token {t} answered, the successor knows up to {sent} before HANDOFF"
        );
    }

    #[test]
    fn a_refusal_leaves_after_the_answers_to_earlier_requests() {
        // `I\nI x\n`: the `I` answer first, then `E I - extra-fields`.
        let mut core = core(false);
        let out = round(
            &mut core,
            at(1),
            vec![
                Inbound::Request(C, Request::Info),
                Inbound::Refused(C, Op::Info, None, Reason::ExtraFields),
            ],
        );
        assert_eq!(out.answers.len(), 2);
        assert!(matches!(out.answers[0].1, Answer::Info(_)));
        assert!(matches!(
            out.answers[1].1,
            Answer::Error {
                op: Some(Op::Info),
                key: None,
                reason: Reason::ExtraFields
            }
        ));
    }

    /// A loop-2 connection watching, and what reached loop 2's watchers.
    fn watch_lines(out: &TableEffects, worker: usize) -> Vec<(u64, u64, u64)> {
        out.answers
            .iter()
            .filter(|(conn, _)| *conn == ConnId::watchers(worker))
            .filter_map(|(_, answer)| match answer {
                Answer::Watched { state, .. } => Some((state.token, state.holders, state.waiting)),
                _ => None,
            })
            .collect()
    }

    fn watching(worker: usize, k: &str, on: bool) -> Inbound {
        Inbound::Watching {
            worker,
            key: key(k),
            on,
        }
    }

    #[test]
    fn a_watch_is_answered_with_the_state_then_every_change_goes_once_to_each_watching_loop() {
        let mut core = core(false);
        let w = ConnId::new(2, 5, 1);
        let watch = Request::Watch { key: key("k") };
        let out = round(
            &mut core,
            at(1),
            vec![watching(2, "k", true), Inbound::Request(w, watch.clone())],
        );
        assert!(matches!(
            &out.answers[..],
            [(c, Answer::Watched { state, .. })] if *c == w && state.token == 0 && state.holders == 0
        ));
        // A grant, a waiter, a handoff (one change), a release.
        let out = round(&mut core, at(2), vec![Inbound::Request(C, acquire("k", 0))]);
        let token = match &out.answers[..] {
            [
                (_, Answer::Granted { token, .. }),
                (_, Answer::Watched { .. }),
            ] => *token,
            other => panic!("{other:?}"),
        };
        assert_eq!(watch_lines(&out, 2), [(token, 1, 0)]);
        let out = round(&mut core, at(3), vec![Inbound::Request(D, acquire("k", 0))]);
        assert!(
            watch_lines(&out, 2).is_empty(),
            "a waiter changes no holder"
        );
        let out = round(
            &mut core,
            at(4),
            vec![Inbound::Request(C, release("k", token))],
        );
        let lines = watch_lines(&out, 2);
        assert_eq!(lines.len(), 1, "a handoff is one change: {lines:?}");
        assert!(lines[0].0 > token && lines[0].1 == 1 && lines[0].2 == 0);
        // Another loop watches too; the answer of a second W shows the state.
        let out = round(
            &mut core,
            at(5),
            vec![
                watching(0, "k", true),
                Inbound::Request(ConnId::new(0, 1, 1), watch),
            ],
        );
        assert!(
            matches!(&out.answers[0].1, Answer::Watched { state, .. } if state.token == lines[0].0)
        );
        // An expiry, on time.
        let out = round(&mut core, at(4 + 1000), vec![]);
        assert_eq!(watch_lines(&out, 2), [(0, 0, 0)]);
        assert_eq!(watch_lines(&out, 0), [(0, 0, 0)]);
        // X, then no more lines to that loop.
        let out = round(
            &mut core,
            at(1100),
            vec![
                Inbound::Request(w, Request::Unwatch { key: key("k") }),
                watching(2, "k", false),
                Inbound::Request(C, acquire("k", 0)),
            ],
        );
        assert!(matches!(&out.answers[0], (c, Answer::Unwatched { .. }) if *c == w));
        assert!(watch_lines(&out, 2).is_empty());
        assert_eq!(watch_lines(&out, 0).len(), 1);
    }

    #[test]
    fn a_standby_redirects_a_watch_and_losing_the_role_ends_every_loops_watches() {
        let mut core = core(true);
        let w = ConnId::new(1, 5, 1);
        let out = round(
            &mut core,
            at(1),
            vec![
                watching(1, "k", true),
                Inbound::Request(w, Request::Watch { key: key("k") }),
            ],
        );
        assert!(matches!(
            &out.answers[..],
            [(c, Answer::Moved { op: Op::Watch, key: Some(_), .. })] if *c == w
        ));
        // The loop, told M, says it no longer watches; then the node is made active.
        round(&mut core, at(2), vec![watching(1, "k", false)]);
        cluster(
            &mut core,
            at(3),
            ClusterToTable::BecomeActive {
                floor: 5,
                failover: false,
            },
        );
        round(
            &mut core,
            at(4),
            vec![
                watching(1, "k", true),
                Inbound::Request(w, Request::Watch { key: key("k") }),
            ],
        );
        let out = cluster(
            &mut core,
            at(5),
            ClusterToTable::FinishTransfer { to: "n2:1".into() },
        );
        assert!(matches!(
            &out.answers[..],
            [(c, Answer::Moved { active: Some(a), op: Op::Watch, key: None })]
                if *c == ConnId::watchers(1) && a == "n2:1"
        ));
        // Already a standby: nothing more to end.
        let out = cluster(&mut core, at(6), ClusterToTable::Follow { active: None });
        assert!(out.answers.is_empty());
    }

    #[test]
    fn a_single_node_serves_at_once_and_replicates_nothing() {
        let mut core = core(false);
        let out = round(&mut core, at(1), vec![Inbound::Request(C, acquire("k", 0))]);
        assert!(matches!(out.answers[0].1, Answer::Granted { .. }));
        assert!(out.to_cluster.is_empty());
        assert!(core.last_issued() > tokens::clock_floor(UNIX));
    }

    #[test]
    fn a_cluster_node_redirects_until_it_is_made_active() {
        let mut core = core(true);
        let out = round(&mut core, at(1), vec![Inbound::Request(C, acquire("k", 0))]);
        assert!(matches!(
            &out.answers[0].1,
            Answer::Moved { active: None, .. }
        ));
        let out = cluster(
            &mut core,
            at(2),
            ClusterToTable::Follow {
                active: Some("n1:1".into()),
            },
        );
        assert!(out.answers.is_empty());
        let out = round(&mut core, at(3), vec![Inbound::Request(C, acquire("k", 0))]);
        assert!(matches!(&out.answers[0].1, Answer::Moved { active: Some(a), .. } if a == "n1:1"));
        cluster(
            &mut core,
            at(4),
            ClusterToTable::BecomeActive {
                floor: 5,
                failover: false,
            },
        );
        let out = round(&mut core, at(5), vec![Inbound::Request(C, acquire("k", 0))]);
        assert!(matches!(out.answers[0].1, Answer::Granted { .. }));
    }

    #[test]
    fn an_active_cluster_node_replicates_its_grants_and_keeps_a_ceiling_ahead() {
        let mut core = core(true);
        let out = cluster(
            &mut core,
            at(1),
            ClusterToTable::BecomeActive {
                floor: 5,
                failover: false,
            },
        );
        let ceiling = core.ceiling();
        assert!(ceiling >= core.table().stats().last_token + TOKEN_RESERVE / 2);
        assert_eq!(
            out.to_cluster,
            vec![TableToCluster::Deltas(vec![Delta::Ceiling(ceiling)])]
        );
        let out = round(&mut core, at(2), vec![Inbound::Request(C, acquire("k", 0))]);
        let Answer::Granted { token, .. } = out.answers[0].1 else {
            panic!("granted");
        };
        assert!(
            token < core.ceiling(),
            "every token stays below the ceiling"
        );
        // A batch went at 1 ms: this grant (a lone one, so it need not be
        // old) waits for the next, and the owner is told to wake for it.
        assert!(out.to_cluster.is_empty());
        let due = 1 + REPL_BATCH_MS;
        assert_eq!(core.next_wake_ms(), Some(due));
        let out = round(&mut core, at(due), vec![]);
        assert_eq!(
            out.to_cluster,
            vec![TableToCluster::Deltas(vec![Delta::grant(
                key("k"),
                token,
                1000 - (due - 2)
            )])]
        );
        assert_eq!(core.next_wake_ms(), core.table().next_wake_ms());
    }

    #[test]
    fn streaming_changes_go_one_batch_per_interval_each_grant_once_it_is_old_enough() {
        let mut core = active_core();
        // Every ms: one key taken and held, and 20 short locks taken and
        // released a ms later (so REPL_YOUNG_MIN or more grants wait).
        let shorts = 20;
        assert!(shorts >= REPL_YOUNG_MIN);
        let mut made = std::collections::HashMap::new();
        let mut batches = Vec::new();
        let mut last_shorts: Vec<(Key, u64)> = Vec::new();
        for ms in 100..140u64 {
            let k = format!("k{ms}");
            made.insert(key(&k), ms);
            let mut inbound = vec![Inbound::Request(C, acquire(&k, 0))];
            for i in 0..shorts {
                inbound.push(Inbound::Request(D, acquire(&format!("s{ms}-{i}"), 0)));
            }
            for (key, token) in last_shorts.drain(..) {
                inbound.push(Inbound::Request(D, Request::Release { key, token }));
            }
            let out = round(&mut core, at(ms), inbound);
            for (conn, answer) in &out.answers {
                if let (true, Answer::Granted { token, key, .. }) = (*conn == D, answer) {
                    last_shorts.push((key.clone(), *token));
                }
            }
            for msg in out.to_cluster {
                let TableToCluster::Deltas(deltas) = msg else {
                    panic!("only deltas");
                };
                batches.push((ms, deltas));
            }
        }
        assert!(!batches.is_empty());
        // Paced, but for a raised ceiling, which goes at once.
        let has_ceiling = |d: &Vec<Delta>| d.iter().any(|d| matches!(d, Delta::Ceiling(_)));
        for pair in batches.windows(2) {
            assert!(
                pair[1].0 >= pair[0].0 + REPL_BATCH_MS || has_ceiling(&pair[1].1),
                "paced: {batches:?}"
            );
        }
        for (ms, deltas) in &batches {
            for delta in deltas {
                match delta {
                    Delta::Grant { key, .. } if made.contains_key(key) => {
                        let at_ms = made[key];
                        assert!(
                            *ms >= at_ms + REPL_YOUNG_MS
                                && *ms <= at_ms + REPL_YOUNG_MS + REPL_BATCH_MS,
                            "{key:?} made at {at_ms} went at {ms}"
                        );
                    }
                    Delta::Ceiling(_) => {}
                    other => panic!("a lock freed within a ms is never sent: {other:?}"),
                }
            }
        }
        let sent: usize = batches.iter().map(|(_, d)| d.len()).sum();
        assert!(sent >= 40 - (REPL_YOUNG_MS + REPL_BATCH_MS) as usize);
    }

    #[test]
    fn a_lone_grant_on_a_quiet_node_is_replicated_at_once_and_the_next_one_in_the_next_batch() {
        let mut core = active_core();
        let out = round(
            &mut core,
            at(500),
            vec![Inbound::Request(C, acquire("a", 0))],
        );
        assert!(
            matches!(&out.to_cluster[..], [TableToCluster::Deltas(d)] if matches!(d[0], Delta::Grant { .. })),
            "{out:?}"
        );
        let out = round(
            &mut core,
            at(501),
            vec![Inbound::Request(C, acquire("b", 0))],
        );
        assert!(out.to_cluster.is_empty(), "one batch per REPL_BATCH_MS");
        assert_eq!(core.next_wake_ms(), Some(500 + REPL_BATCH_MS));
    }

    #[test]
    fn a_key_handed_over_again_and_again_goes_once_per_settled_interval() {
        let mut core = active_core();
        let grant = |out: &TableEffects| {
            out.answers.iter().find_map(|(c, a)| match a {
                Answer::Granted { token, .. } => Some((*c, *token)),
                _ => None,
            })
        };
        let mut holder = grant(&round(
            &mut core,
            at(10),
            vec![Inbound::Request(C, acquire("k", 0))],
        ))
        .expect("granted");
        round(
            &mut core,
            at(10),
            vec![Inbound::Request(D, acquire("k", 0))],
        );
        let mut batches = Vec::new();
        for ms in 20..120u64 {
            // Twice a ms: the holder releases (the key goes to the other
            // client) and asks again.
            for _ in 0..2 {
                let (conn, token) = holder;
                let release = Request::Release {
                    key: key("k"),
                    token,
                };
                let out = round(
                    &mut core,
                    at(ms),
                    vec![
                        Inbound::Request(conn, release),
                        Inbound::Request(conn, acquire("k", 0)),
                    ],
                );
                holder = grant(&out).expect("handed over");
                batches.extend(out.to_cluster.iter().map(|msg| {
                    let ceiling = matches!(msg, TableToCluster::Deltas(d)
                        if d.iter().any(|d| matches!(d, Delta::Ceiling(_))));
                    (ms, ceiling)
                }));
            }
        }
        // Paced, but for a raised ceiling (about every LEAD_MS / 2 of
        // clock here), which goes at once and takes the key's state along.
        for pair in batches.windows(2) {
            assert!(
                pair[1].0 - pair[0].0 >= REPL_SETTLED_MS || pair[1].1,
                "{batches:?}"
            );
        }
        let ceilings = batches.iter().filter(|b| b.1).count();
        assert!(
            ceilings <= 100 / (tokens::LEAD_MS as usize / 2) + 1,
            "{batches:?}"
        );
        assert!(
            batches.len() as u64 >= 100 / REPL_SETTLED_MS - 1,
            "{batches:?}"
        );
        // One handover after a quiet spell goes within REPL_BATCH_MS.
        let (conn, token) = holder;
        let release = Request::Release {
            key: key("k"),
            token,
        };
        let out = round(&mut core, at(200), vec![Inbound::Request(conn, release)]);
        assert_eq!(
            out.to_cluster.len(),
            1,
            "urgent, and the last batch is long past"
        );
    }

    #[test]
    fn a_transfer_sends_the_changes_not_yet_batched_before_it_is_ready() {
        let mut core = active_core();
        let out = round(&mut core, at(1), vec![Inbound::Request(C, acquire("k", 0))]);
        assert!(out.to_cluster.is_empty(), "a batch went at 1 ms already");
        let out = cluster(&mut core, at(1), ClusterToTable::StartTransfer { to: 1 });
        assert!(matches!(
            &out.to_cluster[..],
            [TableToCluster::Deltas(d), TableToCluster::TransferReady { to: 1 }]
                if matches!(d[..], [Delta::Grant { .. }])
        ));
    }

    #[test]
    fn a_ceiling_near_the_end_of_the_token_space_never_wraps() {
        let mut core = core(true);
        cluster(&mut core, at(1), ClusterToTable::Observe(u64::MAX));
        cluster(
            &mut core,
            at(1),
            ClusterToTable::Observe(tokens::MAX_TOKEN - 10),
        );
        cluster(
            &mut core,
            at(2),
            ClusterToTable::BecomeActive {
                floor: 0,
                failover: false,
            },
        );
        assert!(core.ceiling() > tokens::MAX_TOKEN);
        let out = round(&mut core, at(3), vec![Inbound::Request(C, acquire("k", 0))]);
        assert!(
            matches!(out.answers[0].1, Answer::Granted { token, .. } if token > tokens::MAX_TOKEN - 10)
        );
    }

    #[test]
    fn a_lease_that_runs_out_during_a_role_transfer_goes_to_no_waiter_until_it_is_abandoned() {
        let mut core = active_core();
        let short = Request::Acquire {
            key: key("k"),
            lease_ms: 10,
            wait_ms: 0,
            limit: None,
            value: None,
        };
        round(&mut core, at(2), vec![Inbound::Request(C, short)]);
        let out = round(
            &mut core,
            at(3),
            vec![Inbound::Request(D, acquire("k", 5_000))],
        );
        assert!(out.answers.is_empty(), "D waits");
        cluster(&mut core, at(4), ClusterToTable::StartTransfer { to: 1 });
        // The lease ends at 12 ms, in the transfer: the successor runs it
        // too, so this node must not hand the key to D (nor wake for it).
        assert_eq!(core.next_wake_ms(), None);
        let out = round(&mut core, at(20), vec![]);
        assert!(out.answers.is_empty(), "{out:?}");
        // The transfer is abandoned: serving again, the expiry fires.
        cluster(&mut core, at(30), ClusterToTable::AbortTransfer);
        let out = round(&mut core, at(31), vec![]);
        assert!(
            matches!(&out.answers[..], [(D, Answer::Granted { .. })]),
            "{out:?}"
        );
    }

    #[test]
    fn during_a_role_transfer_requests_wait_in_order_then_go_to_the_successor() {
        let mut core = active_core();
        let out = cluster(&mut core, at(2), ClusterToTable::StartTransfer { to: 1 });
        assert_eq!(
            out.to_cluster.last(),
            Some(&TableToCluster::TransferReady { to: 1 })
        );
        let out = round(
            &mut core,
            at(3),
            vec![
                Inbound::Request(C, acquire("k", 0)),
                Inbound::Refused(C, Op::Acquire, Some(key("k")), Reason::BadLease),
                Inbound::Request(D, Request::Info),
            ],
        );
        // Only `I` is answered at once.
        assert_eq!(out.answers.len(), 1);
        assert_eq!(out.answers[0].0, D);
        let out = cluster(
            &mut core,
            at(4),
            ClusterToTable::FinishTransfer { to: "n1:1".into() },
        );
        assert!(out.redirected);
        assert!(
            matches!(&out.answers[0], (C, Answer::Moved { active: Some(a), op: Op::Acquire, .. }) if a == "n1:1")
        );
        assert!(matches!(
            &out.answers[1],
            (
                C,
                Answer::Error {
                    reason: Reason::BadLease,
                    ..
                }
            )
        ));
    }

    #[test]
    fn a_connection_closed_during_a_transfer_is_never_served_when_it_fails() {
        let mut core = active_core();
        round(&mut core, at(2), vec![Inbound::Request(C, acquire("k", 0))]);
        cluster(&mut core, at(3), ClusterToTable::StartTransfer { to: 1 });
        // D asks for the held key, then closes, while requests are held.
        round(&mut core, at(4), vec![Inbound::Request(D, acquire("k", 0))]);
        let out = round(&mut core, at(5), vec![Inbound::Closed(D)]);
        assert!(out.forgotten.is_empty(), "the close waits its turn");
        let out = cluster(&mut core, at(6), ClusterToTable::AbortTransfer);
        assert!(out.answers.is_empty());
        assert_eq!(out.forgotten, vec![D]);
        assert_eq!(
            core.table().stats().waiting,
            0,
            "D's request left the queue"
        );
        core.table().check_invariants();
    }

    #[test]
    fn a_standby_applies_a_snapshot_and_deltas_and_redirects_its_waiters() {
        let mut core = core(true);
        cluster(
            &mut core,
            at(1),
            ClusterToTable::Follow {
                active: Some("n1:1".into()),
            },
        );
        let grant = Delta::grant(key("k"), 77, 500);
        cluster(
            &mut core,
            at(2),
            ClusterToTable::Snapshot {
                seq: 1,
                entries: vec![grant],
            },
        );
        assert_eq!(core.table().stats().held, 1);
        cluster(
            &mut core,
            at(3),
            ClusterToTable::Deltas(vec![Delta::free(key("k"), 77)]),
        );
        assert_eq!(core.table().stats().held, 0);
        core.table().check_invariants();
    }

    #[test]
    fn a_streamed_snapshot_past_max_keys_is_refused_and_its_end_not_confirmed() {
        // A hostile (or larger) active streams more grants than this
        // standby's --max-keys: it holds at most that many, refuses the
        // rest once, and does not say it took the snapshot.
        let limits = TableLimits {
            max_keys: 100,
            ..TableLimits::default()
        };
        let table = LockTable::new(0, limits, TokenSource::new(0, 0));
        let mut core = TableCore::new(table, true, "n1:1".into(), 0);
        let active = Some("n0:1".to_string());
        cluster(&mut core, at(1), ClusterToTable::Follow { active });
        let taken = |out: &TableEffects| {
            out.to_cluster
                .iter()
                .filter(|m| matches!(m, TableToCluster::SnapshotTaken { .. }))
                .count()
        };
        // One it can hold: taken.
        let begin = |seq| ClusterToTable::Snapshot {
            seq,
            entries: vec![],
        };
        cluster(&mut core, at(2), begin(1));
        let some: Vec<Delta> = (0..100)
            .map(|i| Delta::grant(key(&format!("k{i}")), 16 * (i + 1), 60_000))
            .collect();
        cluster(&mut core, at(2), ClusterToTable::Deltas(some));
        let out = cluster(&mut core, at(2), ClusterToTable::SnapshotEnd { seq: 1 });
        assert_eq!(taken(&out), 1);
        assert_eq!(core.table().stats().holders, 100);
        // An endless one: bounded, refused once, never taken.
        cluster(&mut core, at(3), begin(2));
        let mut refusals = 0;
        for batch in 0..50u64 {
            let flood: Vec<Delta> = (0..1000)
                .map(|i| {
                    let n = batch * 1000 + i;
                    Delta::grant(key(&format!("f{n}")), 16 * (n + 1), 60_000)
                })
                .collect();
            let out = cluster(&mut core, at(3), ClusterToTable::Deltas(flood));
            refusals += out
                .to_cluster
                .iter()
                .filter(|m| matches!(m, TableToCluster::StateRefused { snapshot: 2, .. }))
                .count();
            assert!(core.table().stats().holders <= 100);
        }
        assert_eq!(refusals, 1, "said once");
        let out = cluster(&mut core, at(4), ClusterToTable::SnapshotEnd { seq: 2 });
        assert_eq!(taken(&out), 0);
        // Nor is an end of another snapshot than the last confirmed.
        let out = cluster(&mut core, at(4), ClusterToTable::SnapshotEnd { seq: 1 });
        assert_eq!(taken(&out), 0);
        core.table().check_invariants();
    }

    #[test]
    fn a_standby_that_refuses_part_of_its_actives_state_tells_the_cluster_core_once_per_snapshot() {
        let limits = TableLimits {
            max_keys: 2,
            ..TableLimits::default()
        };
        let table = LockTable::new(0, limits, TokenSource::new(0, 0));
        let mut core = TableCore::new(table, true, "n1:1".into(), 0);
        let active = Some("n0:1".to_string());
        cluster(&mut core, at(1), ClusterToTable::Follow { active });
        let grant = |k: &str, token: u64| Delta::grant(key(k), token, 60_000);
        let refused = |out: &TableEffects| {
            out.to_cluster
                .iter()
                .filter(|m| matches!(m, TableToCluster::StateRefused { .. }))
                .count()
        };
        let out = cluster(
            &mut core,
            at(2),
            ClusterToTable::Snapshot {
                seq: 1,
                entries: vec![grant("a", 16)],
            },
        );
        assert_eq!(refused(&out), 0);
        let out = cluster(
            &mut core,
            at(3),
            ClusterToTable::Deltas(vec![grant("b", 32), grant("c", 48), grant("d", 64)]),
        );
        assert_eq!(core.table().stats().held, 2);
        assert_eq!(
            out.to_cluster,
            vec![TableToCluster::StateRefused {
                why: "a grant past --max-keys",
                snapshot: 1,
            }],
            "said once for the two refused, naming the snapshot they came after"
        );
        let out = cluster(
            &mut core,
            at(4),
            ClusterToTable::Deltas(vec![grant("e", 80)]),
        );
        assert_eq!(refused(&out), 0, "said already: the link is going");
        // The next link's snapshot: refused again while it cannot be held.
        let out = cluster(
            &mut core,
            at(5),
            ClusterToTable::Snapshot {
                seq: 2,
                entries: vec![grant("a", 16), grant("b", 32), grant("c", 48)],
            },
        );
        assert_eq!(
            out.to_cluster,
            vec![TableToCluster::StateRefused {
                why: "a grant past --max-keys",
                snapshot: 2,
            }]
        );
        let out = cluster(
            &mut core,
            at(6),
            ClusterToTable::Snapshot {
                seq: 3,
                entries: vec![grant("a", 16)],
            },
        );
        assert_eq!(refused(&out), 0, "one it can hold is taken whole");
        core.table().check_invariants();
    }

    /// The snapshot pieces among `out`'s messages for the cluster core.
    fn chunks(out: &TableEffects) -> Vec<(Option<u64>, usize, bool)> {
        out.to_cluster
            .iter()
            .filter_map(|m| match m {
                TableToCluster::SnapshotChunk {
                    peer: 1,
                    ask: 7,
                    ceiling,
                    entries,
                    last,
                    ..
                } => Some((*ceiling, entries.len(), *last)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_snapshot_goes_in_pieces_one_per_round_the_first_with_the_ceiling() {
        let mut core = active_core().with_chunk_grants(4).with_piece_ms(0);
        let requests = (0..10)
            .map(|i| Inbound::Request(ConnId::new(0, i, 1), acquire(&format!("k{i}"), 0)))
            .collect();
        round(&mut core, at(2), requests);
        let out = cluster(
            &mut core,
            at(3),
            ClusterToTable::SnapshotWanted { peer: 1, ask: 7 },
        );
        assert!(
            matches!(out.to_cluster.first(), Some(TableToCluster::Deltas(_))),
            "the changes so far go before the first piece: {:?}",
            out.to_cluster
        );
        assert_eq!(chunks(&out), [(Some(core.ceiling()), 4, false)]);
        assert!(core.is_sending_snapshot());
        assert_eq!(
            core.next_wake_ms(),
            Some(3),
            "the next piece is due at once"
        );
        let out = round(&mut core, at(3), vec![]);
        assert_eq!(chunks(&out), [(None, 4, false)]);
        let out = round(&mut core, at(4), vec![]);
        assert_eq!(chunks(&out), [(None, 2, true)]);
        assert!(!core.is_sending_snapshot());
        assert!(chunks(&round(&mut core, at(5), vec![])).is_empty());
        // A new ask starts again from the start; a stop ends it.
        cluster(
            &mut core,
            at(6),
            ClusterToTable::SnapshotWanted { peer: 1, ask: 7 },
        );
        assert!(core.is_sending_snapshot());
        cluster(&mut core, at(7), ClusterToTable::SnapshotStop { peer: 1 });
        assert!(!core.is_sending_snapshot());
        assert_eq!(core.next_wake_ms(), core.table().next_wake_ms());
    }

    #[test]
    fn pieces_wait_while_replication_has_not_taken_them_or_a_peer_link_is_backed_up() {
        let mut core = active_core().with_chunk_grants(1).with_piece_ms(0);
        let requests = (0..10)
            .map(|i| Inbound::Request(ConnId::new(0, i, 1), acquire(&format!("k{i}"), 0)))
            .collect();
        round(&mut core, at(2), requests);
        let mut made = 0;
        let mut step = |core: &mut TableCore, ms: u64, gauges: GaugeReadings| {
            core.begin_round(at(ms), gauges);
            let out = std::mem::take(core.end_round(at(ms)));
            made += chunks(&out).len();
            made
        };
        core.begin_round(at(3), GaugeReadings::default());
        core.handle_cluster(at(3), ClusterToTable::SnapshotWanted { peer: 1, ask: 7 });
        assert_eq!(chunks(&std::mem::take(core.end_round(at(3)))).len(), 1);
        // Replication has taken none: a second piece, then no more.
        assert_eq!(step(&mut core, 4, GaugeReadings::default()), 1);
        assert_eq!(step(&mut core, 5, GaugeReadings::default()), 1);
        assert_eq!(core.next_wake_ms(), Some(6), "looks again a millisecond on");
        let taken = |chunks_taken, peer_output| GaugeReadings {
            chunks_taken,
            peer_output,
            ..GaugeReadings::default()
        };
        assert_eq!(step(&mut core, 6, taken(1, 0)), 2);
        assert_eq!(core.pieces_held(), 0, "held for replication, not a link");
        // A peer link backed up holds the pieces back however many were taken.
        assert_eq!(step(&mut core, 7, taken(3, SNAPSHOT_OUTPUT_MAX)), 2);
        assert_eq!(core.pieces_held(), 1);
        assert_eq!(step(&mut core, 8, taken(3, SNAPSHOT_OUTPUT_MAX - 1)), 3);
        assert_eq!(core.pieces_held(), 1);
    }

    #[test]
    fn pieces_go_at_most_one_per_piece_ms() {
        let mut core = active_core().with_chunk_grants(1).with_piece_ms(3);
        let requests = (0..10)
            .map(|i| Inbound::Request(ConnId::new(0, i, 1), acquire(&format!("k{i}"), 0)))
            .collect();
        round(&mut core, at(2), requests);
        let out = cluster(
            &mut core,
            at(3),
            ClusterToTable::SnapshotWanted { peer: 1, ask: 7 },
        );
        assert_eq!(chunks(&out).len(), 1);
        assert_eq!(core.next_wake_ms(), Some(6), "the next piece's time");
        let made: Vec<usize> = (4..=12)
            .map(|ms| chunks(&round(&mut core, at(ms), vec![])).len())
            .collect();
        assert_eq!(made, [0, 0, 1, 0, 0, 1, 0, 0, 1]);
    }

    /// What a standby's table holds of `entries` and the deltas, applied in
    /// the order they left `core` for peer 1 (from its first piece on).
    fn apply_for_peer(standby: &mut LockTable, now_ms: u64, out: &TableEffects, begun: &mut bool) {
        for msg in &out.to_cluster {
            match msg {
                TableToCluster::SnapshotChunk {
                    ceiling, entries, ..
                } => {
                    if let Some(ceiling) = ceiling {
                        *begun = true;
                        standby.load_snapshot(now_ms, vec![]).expect("emptied");
                        standby.observe_token(*ceiling);
                    }
                    for e in entries {
                        standby
                            .apply_delta(now_ms, e.clone())
                            .expect("a piece applies");
                    }
                }
                TableToCluster::Deltas(deltas) if *begun => {
                    for d in deltas {
                        standby
                            .apply_delta(now_ms, d.clone())
                            .expect("a delta applies");
                    }
                }
                _ => {}
            }
        }
    }

    /// A little deterministic generator for the tests' draws.
    struct Draws(u64);

    impl Draws {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 33) % n
        }
    }

    /// One round of `n` requests at random on keys k0..k59 (mutexes and
    /// limit-3 semaphores): acquires, and releases and keeps of `held`,
    /// whose grants it notes.
    fn busy_round(
        core: &mut TableCore,
        draws: &mut Draws,
        held: &mut Vec<(Key, u64)>,
        ms: u64,
        n: u64,
    ) -> TableEffects {
        let mut inbound = Vec::new();
        for i in 0..n {
            let conn = ConnId::new(0, (ms * 8 + i) as usize % 64, 1);
            let k = key(&format!("k{}", draws.below(60)));
            let request = match draws.below(4) {
                0 | 1 => Request::Acquire {
                    key: k,
                    lease_ms: 5_000 + draws.below(1000),
                    wait_ms: 0,
                    limit: (draws.below(3) == 0).then_some(3),
                    value: None,
                },
                2 if !held.is_empty() => {
                    let (key, token) = held.swap_remove(draws.below(held.len() as u64) as usize);
                    Request::Release { key, token }
                }
                _ if !held.is_empty() => {
                    let (key, token) = held[draws.below(held.len() as u64) as usize].clone();
                    Request::Keep {
                        key,
                        token,
                        lease_ms: 6_000,
                    }
                }
                _ => continue,
            };
            inbound.push(Inbound::Request(conn, request));
        }
        let out = round(core, at(ms), inbound);
        for (_, answer) in &out.answers {
            if let Answer::Granted { key, token, .. } = answer {
                held.push((key.clone(), *token));
            }
        }
        out
    }

    #[test]
    fn a_snapshot_in_pieces_with_changes_all_the_while_ends_in_the_actives_table() {
        // Keys granted, handed over, extended, released and granted afresh
        // while the pieces go, on both sides of the cursor: the standby
        // ends with every key, token, lease, slot and value of the active.
        for seed in 1..=40u64 {
            let mut draws = Draws(seed);
            let chunk = 1 + draws.below(7) as usize;
            let mut core = active_core().with_chunk_grants(chunk);
            let mut standby = LockTable::new(0, TableLimits::default(), TokenSource::new(1, 0));
            let mut held = Vec::new();
            let mut begun = false;
            let mut ms = 2;
            for _ in 0..40 {
                busy_round(&mut core, &mut draws, &mut held, ms, 5);
                ms += 1;
            }
            let out = cluster(
                &mut core,
                at(ms),
                ClusterToTable::SnapshotWanted { peer: 1, ask: 7 },
            );
            apply_for_peer(&mut standby, ms, &out, &mut begun);
            assert!(begun);
            let mut rounds = 0;
            while core.is_sending_snapshot() {
                ms += draws.below(2);
                let n = draws.below(4);
                let out = busy_round(&mut core, &mut draws, &mut held, ms, n);
                apply_for_peer(&mut standby, ms, &out, &mut begun);
                rounds += 1;
            }
            assert!(
                rounds >= 1,
                "seed {seed}: in pieces of {chunk}, {} held",
                core.table().stats().holders
            );
            for _ in 0..5 {
                ms += 1;
                let n = draws.below(4);
                let out = busy_round(&mut core, &mut draws, &mut held, ms, n);
                apply_for_peer(&mut standby, ms, &out, &mut begun);
            }
            // Whatever is left goes in the next batch.
            ms += REPL_SETTLED_MS + REPL_YOUNG_MS;
            let out = round(&mut core, at(ms), vec![]);
            apply_for_peer(&mut standby, ms, &out, &mut begun);
            standby.check_invariants();
            let sorted = |mut v: Vec<Delta>| {
                v.sort_by_key(|d| format!("{d:?}"));
                v
            };
            let want = sorted(core.table().snapshot(ms));
            assert!(want.len() > 5, "seed {seed}: keys held");
            assert_eq!(sorted(standby.snapshot(ms)), want, "seed {seed}");
            assert!(standby.stats().last_token >= core.table().stats().last_token);
        }
    }

    #[test]
    fn info_reports_the_gauges_passed_in() {
        let mut core = core(true);
        cluster(
            &mut core,
            at(1),
            ClusterToTable::Follow {
                active: Some("n1:1".into()),
            },
        );
        let gauges = GaugeReadings {
            conns: 3,
            heard_active_ms: 90,
            synced_standbys: 2,
            ..GaugeReadings::default()
        };
        core.begin_round(at(100), gauges);
        core.handle_inbound(at(100), Inbound::Request(C, Request::Info));
        let out = std::mem::take(core.end_round(at(100)));
        let Answer::Info(info) = &out.answers[0].1 else {
            panic!("info");
        };
        let get = |n: &str| info.get(n);
        assert_eq!(get("role"), Some("standby"));
        assert_eq!(get("conns"), Some("3"));
        assert_eq!(get("lag_ms"), Some("10"));
        assert_eq!(get("standbys"), Some("0"));
    }

    #[test]
    fn one_rendered_info_is_shared_until_a_figure_changes() {
        let mut core = core(false);
        let info_of = |out: &TableEffects, i: usize| match &out.answers[i].1 {
            Answer::Info(info) => info.clone(),
            other => panic!("not an I answer: {other:?}"),
        };
        core.begin_round(at(100), GaugeReadings::default());
        core.handle_inbound(at(100), Inbound::Request(C, Request::Info));
        core.handle_inbound(at(100), Inbound::Request(D, Request::Info));
        core.handle_inbound(at(100), Inbound::Request(C, acquire("k", 0)));
        core.handle_inbound(at(100), Inbound::Request(D, Request::Info));
        let out = std::mem::take(core.end_round(at(100)));
        let (first, second, after) = (info_of(&out, 0), info_of(&out, 1), info_of(&out, 3));
        assert!(first.is_shared_with(&second), "{first:?} rendered twice");
        assert_eq!(first.get("held"), Some("0"));
        // The grant changed a figure: a new answer, right at once.
        assert_eq!(after.get("held"), Some("1"));
        // The next round, nothing changed (the clock neither, which lifts
        // the token floor): the same text again.
        core.begin_round(at(100), GaugeReadings::default());
        core.handle_inbound(at(100), Inbound::Request(C, Request::Info));
        let out = std::mem::take(core.end_round(at(100)));
        assert!(info_of(&out, 0).is_shared_with(&after));
        // A cluster message may change the mode: rendered anew.
        cluster(&mut core, at(100), ClusterToTable::Observe(1));
        core.begin_round(at(100), GaugeReadings::default());
        core.handle_inbound(at(100), Inbound::Request(C, Request::Info));
        let out = std::mem::take(core.end_round(at(100)));
        let fresh = info_of(&out, 0);
        assert!(!fresh.is_shared_with(&after));
        assert_eq!(fresh, after);
    }

    #[test]
    fn the_metrics_snapshot_says_what_info_says() {
        let mut core = core(true);
        let gauges = GaugeReadings {
            conns: 3,
            heard_active_ms: 90,
            synced_standbys: 2,
            ..GaugeReadings::default()
        };
        let follow = ClusterToTable::Follow {
            active: Some("n1:1".into()),
        };
        cluster(&mut core, at(1), follow);
        core.begin_round(at(100), gauges);
        let mut snap = Snapshot::default();
        core.fill_snapshot(at(100), &mut snap);
        assert!(!snap.active && core.is_standby());
        assert_eq!((snap.lag_ms, snap.standbys), (10, 0));
        let promote = ClusterToTable::BecomeActive {
            floor: 0,
            failover: true,
        };
        cluster(&mut core, at(110), promote);
        round(
            &mut core,
            at(120),
            vec![Inbound::Request(C, acquire("k", 0))],
        );
        core.begin_round(at(121), gauges);
        core.fill_snapshot(at(121), &mut snap);
        assert!(snap.active && !snap.handing_off && !core.is_standby());
        assert_eq!((snap.lag_ms, snap.standbys), (0, 2));
        assert_eq!((snap.held, snap.waiting), (1, 0));
        assert_eq!(snap.last_token, core.table().stats().last_token);
        assert!(snap.ceiling >= snap.last_token);
    }
}
