//! The cluster core: every decision of the replication thread, with no I/O
//! and no clock reads.
//!
//! Owns: the [`Roles`] state machine, what this node knows of each peer
//! link (which outgoing links are up, which peers have this node's
//! snapshot, which incoming link is which peer), the heartbeat schedule, the
//! token floor taken from peers' heartbeats, the snapshot resend rule, the
//! check of every received peer message ([`ClusterCore::check_peer_msg`]),
//! and the graceful-exit sequence.
//!
//! Events come in with the time passed in ([`Now`]): a tick, an outgoing
//! link up or failed, an incoming link opened, a message or a close on it,
//! a message from the lock owner's core, a shutdown request. Effects go out
//! as [`ClusterEffect`]s: dial, send or drop a link, tell the lock owner's
//! core something, exit. [`ClusterCore::next_wake_ms`] says when to tick.
//!
//! A link is known here only once the shell's handshake (peer_auth.rs)
//! has proved it knows the cluster key ([`ClusterCore::handle_in_authenticated`],
//! [`ClusterCore::handle_link_up`]); until then this core only bounds it:
//! at most [`MAX_PENDING_IN`] unproved incoming links, each dropped after
//! [`HANDSHAKE_MS`], and a dial that has not connected and proved itself
//! within [`ClusterCore::dial_timeout_ms`] (a heartbeat period) fails.
//! Even a proved peer's messages are checked
//! ([`ClusterCore::check_peer_msg`]): tokens and ceilings never 0, leases
//! within `--max-lease`, limits within 1..=10000 and slots below them;
//! anything else drops the link. So does state the lock owner refuses (a
//! replicated grant past its `--max-keys`, a snapshot's included:
//! `TableToCluster::StateRefused`). A snapshot streams through to the lock
//! owner in batches as it comes, the active's deltas between its pieces,
//! so nothing of it gathers here: `--max-keys`, on apply, is what bounds it. Either way a standby
//! that refused its active's state says it does not hold it (no
//! `standbys=` count, no role handed to it, an election prefers a node
//! that holds it), and the active's next link starts with a fresh snapshot.
//! Failed dials back off (with jitter) up to [`RECONNECT_MAX_MS`],
//! and their warnings are rate-limited. A dropped link is dialed again at
//! once (a blip, a silent link, a crash, however young the link), unless
//! links with that peer keep dropping over refused state (two nodes with
//! different limits, one of which refuses the other's state: this node
//! refused what the link carried, or its lock owner did, or the peer
//! dropped this active's link after its snapshot and before saying it
//! holds it): from the second such drop in a row on, the redial waits,
//! doubling from [`RECONNECT_MS`] but never above `--detect`/2 so that the
//! heartbeat each new link starts with keeps both nodes well within
//! `--detect` of each other, and the links' log lines go to debug, one
//! warning standing for them (`ClusterCore::redial_after_drop`).
//!
//! Clocks: no token or ceiling more than [`MAX_PEER_AHEAD_MS`] of clock
//! above this node's clock floor ([`ClusterCore::token_bound`]) is ever
//! taken from a peer, so no peer, not even one that holds the key, can push
//! the token counter toward the end of the token space. Such a value is
//! what a node whose clock is behind its peers' by more than that sees, so
//! it does not cost the link: the message still counts — a heartbeat for
//! liveness and the roles (the node follows the active it hears and steps
//! back from a higher one, so a clock behind never makes a split brain) —
//! and only what lies beyond the window is left out: the heartbeat's token
//! or ceiling is not observed, and the active's grants, frees and ceilings
//! beyond it are not applied. A standby that left anything of its active's
//! state out does not say it holds that state (no role is handed to it, the
//! active does not count it in `standbys=`, an election prefers a node that
//! holds the state), and the active sends it snapshots ever less often
//! (up to [`SNAPSHOT_RESEND_MAX_MS`] apart). It warns, rate-limited. If
//! it is promoted all the same (no other node is left), its tokens are
//! above everything it took and above its own clock floor, but may be below
//! the ones it left out: a fenced resource refuses them until its clock
//! catches up (docs/cluster.md, "Consistency caveats").
//!
//! Liveness does not wait for TCP: a proved incoming link that carries
//! nothing for two heartbeat periods (a quarter of `--detect`) is dropped,
//! and this node's own link to that peer with it, and both are dialed again
//! at once and then every heartbeat period (a fresh connection gets
//! through as soon as the network does; a kept one would wait for the
//! kernel's retransmission timer, which backs off to seconds). So a blip
//! shorter than `--detect` ends before any peer is found dead, and after a
//! longer partition the nodes hear each other again within a heartbeat
//! period (plus a round trip) of the heal, which ends a split brain. A peer
//! is found dead after [`silence_limit_ms`]: `--detect` of silence counted
//! from the heartbeat due after the last one heard, plus a period for that
//! fresh dial. Input the shell holds back unread while the lock owner
//! catches up is not silence ([`ClusterCore::handle_in_held`]).
//!
//! Each link carries one direction only: node A's messages to node B travel
//! on A's outgoing link to B, so a link's order is TCP's order. A peer is
//! found dead by its heartbeats stopping (see above), or at once when its
//! link drops and a new connection to it is refused (the process is gone).
//!
//! Run by the replication thread (replication.rs, which only moves bytes)
//! and, for every simulated node, by the deterministic simulation.
//!
//! Never does: I/O, clock reads, lock state (that is the lock owner's core).
//!
//! Files: this one holds the core's state, its clock-driven work and its
//! role changes; `links.rs` this node's outgoing links (dialing, handshake
//! deadlines, backoff); `incoming.rs` the links peers open to it;
//! `checks.rs` the checks every peer message passes; `stream.rs` the
//! replication stream (heartbeats, deltas, snapshots, handoff); `tests/`
//! the tests, by the same concerns.

use std::collections::BTreeMap;

use crate::protocol::MAX_LIMIT;
use crate::server::core::events::Delta;
use crate::server::core::events::{ClusterToTable, TableToCluster};
use crate::server::core::now::Now;
use crate::server::core::peer_msg::PeerMsg;
use crate::server::core::roles::{Beat, RoleEffect, Roles};
use crate::server::core::tokens;

mod checks;
mod incoming;
mod links;
mod stream;

use incoming::{InDrop, InLink};
use links::{OutLink, OutState};

pub use checks::Verdict;
pub use links::OutDown;

/// A standby passes the deltas it receives to its lock owner at most once
/// per this many ms (each pass wakes that thread), or once
/// `APPLY_BATCH_MAX` wait — and at once whenever its table must be
/// current: a heartbeat of its active (which makes the state current as of
/// then), a snapshot, a handoff, a role change. Its table lags the wire by
/// at most this much; nothing but `I` reads it in between.
pub const APPLY_BATCH_MS: u64 = 20;

pub const APPLY_BATCH_MAX: usize = 4096;

/// Wait before the second attempt to connect to a peer; it doubles with
/// every failure up to `RECONNECT_MAX_MS`.
pub const RECONNECT_MS: u64 = 100;

/// The longest wait between attempts to connect to a peer (lower with a
/// short `--detect`: half of it), so that a healed network is seen soon.
pub const RECONNECT_MAX_MS: u64 = 1_000;

/// An incoming link must prove the cluster key within this, and a dial
/// must connect and see the peer's proof within this.
pub const HANDSHAKE_MS: u64 = 1_000;

/// Incoming links that have not proved the key yet, at most; a newer one
/// pushes the oldest out (a real peer proves itself in one round trip).
pub const MAX_PENDING_IN: usize = 16;

/// How far above the clock floor (in ms of the wall clock) a peer's token or
/// ceiling may be: clock skew between nodes plus the tokens' lead
/// (tokens.rs). Anything above is not taken, but costs the message nothing
/// else (see the module doc).
pub const MAX_PEER_AHEAD_MS: u64 = 60_000;

/// A follower that still lacks the state a detection period after its
/// snapshot went out is sent another; each further one waits twice as long,
/// up to this (a standby whose clock is far behind takes none whole).
pub const SNAPSHOT_RESEND_MAX_MS: u64 = 32_000;

/// One warning per peer (and one for strangers) per this, at most; the
/// next one says how many were left out.
pub const WARN_EVERY_MS: u64 = 30_000;

/// How often `--insecure-peers` is warned about.
pub const INSECURE_WARN_MS: u64 = 60_000;

/// How long a peer may be silent before it is found dead: `--detect`,
/// counted from the heartbeat that was due after the last one heard, plus
/// one heartbeat period for the fresh dial that a silent link gets (see the
/// module doc). A network blip shorter than `--detect` then ends, and the
/// peers hear each other again, before this runs out.
pub fn silence_limit_ms(detect_ms: u64) -> u64 {
    let period = (detect_ms / BEATS_PER_DETECT).max(1);
    detect_ms.saturating_add(2 * period)
}

/// The limits a node's peers are held to, and the seed of its jitter.
#[derive(Clone, Copy, Debug)]
pub struct ClusterParams {
    pub detect_ms: u64,
    /// `--max-lease`: the longest lease a replicated grant may have.
    pub max_lease_ms: u64,
    /// Peers run without a cluster key (warned about every minute).
    pub insecure: bool,
    /// Seed of the reconnect jitter (random in the server, fixed in tests).
    pub seed: u64,
}

impl ClusterParams {
    /// Parameters for tests: the given detection time, generous limits.
    pub fn with_detect(detect_ms: u64) -> ClusterParams {
        ClusterParams {
            detect_ms,
            max_lease_ms: 86_400_000,
            insecure: false,
            seed: 1,
        }
    }
}

/// Allows one log line per interval and counts the ones left out.
#[derive(Clone, Copy, Debug, Default)]
pub struct RateLimit {
    next_ms: u64,
    suppressed: u64,
}

impl RateLimit {
    /// Some(lines left out since the last one) when a line may be logged now.
    pub fn allow(&mut self, now_ms: u64, every_ms: u64) -> Option<u64> {
        if now_ms < self.next_ms {
            self.suppressed += 1;
            return None;
        }
        self.next_ms = now_ms.saturating_add(every_ms);
        Some(std::mem::take(&mut self.suppressed))
    }
}

pub fn left_out(n: u64) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" ({n} more like it since the last warning)")
    }
}

/// Heartbeats per detection period.
pub const BEATS_PER_DETECT: u64 = 8;

/// An incoming link, as the shell names it.
pub type LinkId = usize;

/// What the shell must do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterEffect {
    /// Open an outgoing link to `peer` (report back with `handle_link_up`
    /// or `handle_link_down`).
    Dial { peer: usize },
    /// Write `msg` on the outgoing link to `peer` (only emitted while up).
    Send { peer: usize, msg: PeerMsg },
    /// Close the outgoing link to `peer` (no report back).
    DropOut { peer: usize },
    /// Close incoming link `link` (no report back).
    DropIn { link: LinkId },
    /// Tell the lock owner's core.
    ToTable(ClusterToTable),
    /// The graceful shutdown is complete: flush the links, then exit.
    Exit,
}

/// The cluster core of one node. See the module doc.
pub struct ClusterCore {
    me: usize,
    names: Vec<String>,
    detect_ms: u64,
    params: ClusterParams,
    /// The reconnect jitter's generator (SplitMix64).
    rng: u64,
    /// Warnings about incoming links that failed their handshake.
    stranger_warn: RateLimit,
    insecure_warn: RateLimit,
    /// Warnings about refused messages, per peer.
    refusal_warn: Vec<RateLimit>,
    /// Warnings about tokens beyond this node's window, per peer.
    clock_warn: Vec<RateLimit>,
    roles: Roles,
    outs: Vec<OutLink>,
    /// A few links at most: a B-tree finds one in a couple of compares,
    /// where hashing (SipHash) cost more per replicated change.
    ins: BTreeMap<LinkId, InLink>,
    next_beat_ms: u64,
    /// Deltas received and not yet passed to the lock owner, and when the
    /// first of them came.
    deltas_in: Vec<Delta>,
    deltas_in_since_ms: Option<u64>,
    /// The lock owner has been told to redirect its clients and has not
    /// confirmed yet.
    awaiting_redirect: bool,
    exit_when_redirected: bool,
    exited: bool,
    /// This node's token figures for its heartbeats (from the lock owner).
    last_issued: u64,
    ceiling: u64,
    /// When this node last heard from the active it follows.
    heard_active_ms: u64,
    /// The last snapshot passed to the lock owner: its `seq` (0 before
    /// any) and the node it came from. A `StateRefused` about an older one
    /// is stale: the lock owner's table has been replaced since.
    snapshot_seq: u64,
    snapshot_from: Option<usize>,
    /// The snapshot whose end was passed to the lock owner and that it has
    /// not yet said it took whole: the link it came on, from whom, its
    /// `seq`.
    snapshot_ending: Option<(LinkId, usize, u64)>,
    effects: Vec<ClusterEffect>,
}

impl ClusterCore {
    /// Node `me` of the nodes named `names` (their `--peers` entries).
    pub fn new(me: usize, names: Vec<String>, params: ClusterParams, now: Now) -> ClusterCore {
        let detect_ms = params.detect_ms;
        let roles = Roles::new(
            me,
            names.len(),
            silence_limit_ms(detect_ms),
            detect_ms,
            now.ms,
        );
        let outs = vec![
            OutLink {
                state: OutState::Down { retry_at_ms: 0 },
                failures: 0,
                warn: RateLimit::default(),
                up_since_ms: 0,
                flaps: 0,
                flap_warn: RateLimit::default(),
                snap_sent: false,
                snap_pending: false,
                snap_streaming: false,
                snap_ask: 0,
                snap_entries: 0,
                snap_pieces: 0,
                snap_sent_ms: 0,
                resends: 0,
            };
            names.len()
        ];
        ClusterCore {
            me,
            names,
            detect_ms,
            params,
            rng: params.seed,
            stranger_warn: RateLimit::default(),
            insecure_warn: RateLimit::default(),
            refusal_warn: vec![RateLimit::default(); outs.len()],
            clock_warn: vec![RateLimit::default(); outs.len()],
            roles,
            outs,
            ins: BTreeMap::new(),
            next_beat_ms: 0,
            deltas_in: Vec::new(),
            deltas_in_since_ms: None,
            awaiting_redirect: false,
            exit_when_redirected: false,
            exited: false,
            last_issued: 0,
            ceiling: 0,
            heard_active_ms: 0,
            snapshot_seq: 0,
            snapshot_from: None,
            snapshot_ending: None,
            effects: Vec::new(),
        }
    }

    /// The role state machine (read only).
    pub fn roles(&self) -> &Roles {
        &self.roles
    }

    /// The graceful exit has completed.
    pub fn exited(&self) -> bool {
        self.exited
    }

    /// When this node last heard from the active it follows.
    pub fn heard_active_ms(&self) -> u64 {
        self.heard_active_ms
    }

    /// The effects decided so far, in order; the caller carries them out.
    pub fn poll_effects(&mut self) -> std::vec::Drain<'_, ClusterEffect> {
        self.effects.drain(..)
    }

    /// This node's own link to `p` is up (dialed, and `p` proved the key).
    pub fn link_up(&self, p: usize) -> bool {
        self.outs
            .get(p)
            .is_some_and(|out| out.state == OutState::Up)
    }

    /// Incoming links still in their handshake.
    pub fn links_in_handshake(&self) -> usize {
        self.ins.values().filter(|l| l.peer.is_none()).count()
    }

    /// Incoming links that proved the key.
    pub fn links_proved(&self) -> usize {
        self.ins.values().filter(|l| l.peer.is_some()).count()
    }

    /// The lock owner's latest token figures, for heartbeats.
    pub fn set_tokens(&mut self, last_issued: u64, ceiling: u64) {
        self.last_issued = last_issued;
        self.ceiling = ceiling;
    }

    /// Live standbys that hold this node's full state, counted only while
    /// both links with them are up (a dropped link may have lost deltas)
    /// and the outgoing one has carried this node's snapshot.
    pub fn synced_standbys(&self, now: Now) -> usize {
        (0..self.names.len())
            .filter(|&p| {
                p != self.me
                    && self.outs[p].state == OutState::Up
                    && self.outs[p].snap_sent
                    && self.ins.values().any(|l| l.peer == Some(p))
                    && self.roles.is_live(p, now.ms)
                    && self
                        .roles
                        .peer_beat(p)
                        .is_some_and(|b| b.following == Some(self.me) && b.synced)
            })
            .count()
    }

    /// The next time `handle_tick` has work.
    pub fn next_wake_ms(&self, now: Now) -> u64 {
        let mut wake = self.next_beat_ms.min(self.roles.next_wake_ms(now.ms));
        for (p, out) in self.outs.iter().enumerate() {
            match out.state {
                OutState::Down { retry_at_ms } if p != self.me => wake = wake.min(retry_at_ms),
                OutState::Dialing { since_ms } => {
                    wake = wake.min(since_ms.saturating_add(self.dial_timeout_ms()));
                }
                _ => {}
            }
        }
        for link in self.ins.values() {
            if link.peer.is_none() {
                wake = wake.min(link.opened_ms.saturating_add(HANDSHAKE_MS));
            }
        }
        if self.params.insecure {
            wake = wake.min(self.insecure_warn.next_ms);
        }
        if let Some(since) = self.deltas_in_since_ms {
            wake = wake.min(since.saturating_add(APPLY_BATCH_MS));
        }
        let silence = self.silence_ms();
        for link in self.ins.values() {
            if link.peer.is_some() {
                wake = wake.min(link.heard_ms.saturating_add(silence));
            }
        }
        wake.max(now.ms)
    }

    /// Time-driven work: roles, heartbeats, dialing, snapshots.
    pub fn handle_tick(&mut self, now: Now) {
        if self.exited {
            return;
        }
        if self
            .deltas_in_since_ms
            .is_some_and(|since| now.ms >= since.saturating_add(APPLY_BATCH_MS))
        {
            self.flush_deltas_in();
        }
        if self.params.insecure && self.insecure_warn.allow(now.ms, INSECURE_WARN_MS).is_some() {
            log::warn!(
                "replication: --insecure-peers: peer links are not authenticated; anyone who \
                 can reach this port can pose as a peer (use --cluster-key-file)"
            );
        }
        self.expire_handshakes(now);
        let effects = self.roles.poll(now.ms);
        self.apply_role_effects(now, effects);
        if now.ms >= self.next_beat_ms {
            self.send_beats();
            let period = (self.detect_ms / BEATS_PER_DETECT).max(1);
            self.next_beat_ms = now.ms.saturating_add(period);
        }
        for p in 0..self.outs.len() {
            if p != self.me {
                self.maybe_healthy(p, now);
                self.maybe_dial(p, now);
                self.maybe_ask_snapshot(p, now);
            }
        }
    }

    // ----- outgoing links -----

    fn maybe_dial(&mut self, p: usize, now: Now) {
        let out = &mut self.outs[p];
        let OutState::Down { retry_at_ms } = out.state else {
            return;
        };
        if now.ms < retry_at_ms {
            return;
        }
        out.state = OutState::Dialing { since_ms: now.ms };
        self.effects.push(ClusterEffect::Dial { peer: p });
    }

    /// A link event with `p`, for the log: at info, but at debug while
    /// links with `p` keep dropping and are redialed with a backoff (the
    /// backoff's warning stands for those lines, so a flapping link cannot
    /// flood the log).
    fn log_link(&self, p: usize, line: std::fmt::Arguments<'_>) {
        if self.outs.get(p).is_some_and(|o| o.flaps > 1) {
            log::debug!("replication: {line}");
        } else {
            log::info!("replication: {line}");
        }
    }

    fn send(&mut self, p: usize, msg: PeerMsg) {
        if self.outs.get(p).is_some_and(|o| o.state == OutState::Up) {
            self.effects.push(ClusterEffect::Send { peer: p, msg });
        }
    }

    fn send_beats(&mut self) {
        let beat = PeerMsg::Beat {
            beat: self.roles.beat(),
            last_token: self.last_issued,
            ceiling: self.ceiling,
        };
        for p in 0..self.outs.len() {
            if p != self.me {
                self.send(p, beat.clone());
            }
        }
    }

    // ----- incoming links -----

    /// A connection that opened with a peer line was adopted from an I/O
    /// loop; its handshake starts. Past MAX_PENDING_IN unproved links the
    /// oldest is dropped.
    pub fn handle_in_opened(&mut self, now: Now, link: LinkId) {
        let pending: Vec<(u64, LinkId)> = self
            .ins
            .iter()
            .filter(|(_, l)| l.peer.is_none())
            .map(|(id, l)| (l.opened_ms, *id))
            .collect();
        if pending.len() >= MAX_PENDING_IN
            && let Some(&(_, oldest)) = pending.iter().min()
        {
            self.drop_in(
                now,
                oldest,
                "too many links still in their handshake",
                InDrop::Closed,
            );
        }
        self.ins.insert(
            link,
            InLink {
                opened_ms: now.ms,
                heard_ms: now.ms,
                ..InLink::default()
            },
        );
    }

    // ----- the lock owner's core -----

    /// One message from the lock owner's core.
    pub fn handle_table(&mut self, now: Now, msg: TableToCluster) {
        match msg {
            TableToCluster::Deltas(deltas) => {
                for p in 0..self.outs.len() {
                    let out = &self.outs[p];
                    if p == self.me || !(out.snap_sent || out.snap_streaming) {
                        continue;
                    }
                    for delta in &deltas {
                        self.send(p, PeerMsg::Delta(delta.clone()));
                    }
                }
            }
            TableToCluster::SnapshotChunk {
                peer,
                ask,
                ceiling,
                held,
                entries,
                last,
            } => self.send_chunk(now, peer, ask, ceiling, held, entries, last),
            TableToCluster::TransferReady { to } => {
                // Only over a link that carried the snapshot and every delta
                // since: else the successor would take the role without
                // them. Not sent, the transfer times out and is abandoned.
                if self.outs.get(to).is_some_and(|o| o.snap_sent) {
                    log::info!(
                        "replication: transferring the active role to {}",
                        self.names[to]
                    );
                    self.send(to, PeerMsg::Handoff);
                } else {
                    log::warn!(
                        "replication: not transferring the active role to {}: its link has \
                         not carried the state yet",
                        self.names[to]
                    );
                }
            }
            TableToCluster::Redirected => {
                self.awaiting_redirect = false;
                if self.exit_when_redirected {
                    self.finish_exit();
                }
            }
            TableToCluster::DeltasLost => {
                // No link has every change since its snapshot any more: each
                // is dropped, as one too far behind would be, so the standby
                // knows at once that it lacks the state (it is neither
                // counted as synced nor handed the role), and the redialed
                // link carries a fresh snapshot.
                for p in 0..self.outs.len() {
                    let out = &self.outs[p];
                    if p != self.me && (out.snap_sent || out.snap_streaming) {
                        log::warn!(
                            "replication: changes for {} were dropped while this thread was \
                             held up; re-syncing it from a fresh snapshot",
                            self.names[p]
                        );
                        self.effects.push(ClusterEffect::DropOut { peer: p });
                        self.handle_link_down(now, p, OutDown::Failed, "changes dropped");
                    }
                }
            }
            TableToCluster::StateRefused { why, snapshot } => {
                self.handle_state_refused(now, why, snapshot)
            }
            TableToCluster::SnapshotTaken { seq } => self.handle_snapshot_taken(now, seq),
        }
    }

    // ----- roles and exit -----

    /// Graceful shutdown was asked for.
    pub fn handle_shutdown(&mut self, now: Now) {
        log::info!("replication: graceful shutdown asked for");
        let effects = self.roles.handle_shutdown(now.ms);
        self.apply_role_effects(now, effects);
    }

    fn apply_role_effects(&mut self, now: Now, effects: Vec<RoleEffect>) {
        if effects.is_empty() {
            return;
        }
        // Deltas received so far belong to the old role: apply them first.
        self.flush_deltas_in();
        let transferred = effects
            .iter()
            .any(|e| matches!(e, RoleEffect::SendTook { .. }));
        for effect in effects {
            log::info!(
                "replication: {}; role now {}",
                self.describe(effect),
                self.roles.role_name().as_str()
            );
            match effect {
                RoleEffect::BecomeActive => {
                    // After a failover, start as far ahead of the clock as
                    // a fresh node does: an active that died before its
                    // first ceiling reached anyone issued at most that far
                    // ahead (clocks permitting).
                    let floor = if transferred {
                        tokens::clock_floor(now.unix_ms)
                    } else {
                        tokens::start_floor(now.unix_ms)
                    };
                    self.tell_table(ClusterToTable::BecomeActive {
                        floor,
                        failover: !transferred,
                    });
                    for p in 0..self.outs.len() {
                        self.reset_snapshot(p);
                    }
                }
                RoleEffect::Follow { active } => {
                    for link in self.ins.values_mut() {
                        link.snapshot = None;
                    }
                    let active = active.map(|a| self.names[a].clone());
                    self.tell_table(ClusterToTable::Follow { active });
                }
                RoleEffect::StartTransfer { to } => {
                    self.tell_table(ClusterToTable::StartTransfer { to });
                }
                RoleEffect::AbortTransfer => self.tell_table(ClusterToTable::AbortTransfer),
                RoleEffect::FinishTransfer { to } => {
                    self.awaiting_redirect = true;
                    let to = self.names[to].clone();
                    self.tell_table(ClusterToTable::FinishTransfer { to });
                }
                RoleEffect::SendTook { to } => self.send(to, PeerMsg::Took),
                RoleEffect::Exit => {
                    if !self.awaiting_redirect && self.roles.role_name().is_active() {
                        // No successor: waiters still get a clear answer.
                        self.awaiting_redirect = true;
                        self.tell_table(ClusterToTable::Retire);
                    }
                    if self.awaiting_redirect {
                        self.exit_when_redirected = true;
                    } else {
                        self.finish_exit();
                    }
                }
            }
        }
        self.send_beats();
    }

    /// A role effect in words, for the log.
    fn describe(&self, effect: RoleEffect) -> String {
        let name = |p: usize| self.names.get(p).cloned().unwrap_or_else(|| "?".into());
        match effect {
            RoleEffect::BecomeActive => "becoming active".into(),
            RoleEffect::Follow { active: Some(a) } => format!("following {}", name(a)),
            RoleEffect::Follow { active: None } => "following nobody (no active known)".into(),
            RoleEffect::StartTransfer { to } => {
                format!("starting to transfer the active role to {}", name(to))
            }
            RoleEffect::AbortTransfer => "role transfer abandoned".into(),
            RoleEffect::FinishTransfer { to } => format!("{} took the active role", name(to)),
            RoleEffect::SendTook { to } => format!("took the active role from {}", name(to)),
            RoleEffect::Exit => "ready to exit".into(),
        }
    }

    fn finish_exit(&mut self) {
        if !self.exited {
            self.exited = true;
            self.effects.push(ClusterEffect::Exit);
        }
    }

    fn tell_table(&mut self, msg: ClusterToTable) {
        self.effects.push(ClusterEffect::ToTable(msg));
    }
}

#[cfg(test)]
mod tests;
