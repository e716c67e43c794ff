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
//! within `--max-lease`, limits within 1..=10000 and slots below them,
//! snapshots within `--max-keys` (a line, so a count, per holder);
//! anything else drops
//! the link. So does state the lock owner refuses (a replicated grant past
//! its `--max-keys`: `TableToCluster::StateRefused`). Either way a standby
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

use std::collections::BTreeMap;

use crate::protocol::MAX_LIMIT;
use crate::server::core::events::Delta;
use crate::server::core::events::{ClusterToTable, TableToCluster};
use crate::server::core::now::Now;
use crate::server::core::peer_msg::PeerMsg;
use crate::server::core::roles::{RoleEffect, Roles};
use crate::server::core::tokens;

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
    /// `--max-keys`: the most entries a snapshot may have.
    pub max_keys: usize,
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
            max_keys: 1_000_000,
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

/// Why an outgoing link went down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutDown {
    /// Nothing listens on the peer's port: the process is gone.
    Refused,
    /// Any other failure (reset, timeout, EOF, our output over its bound).
    Failed,
    /// It connected but failed the handshake (another key, another
    /// `--peers` list, not a peer at all).
    Rejected,
}

/// Why an incoming link goes, as far as redialing its peer goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum InDrop {
    /// It closed or failed (the shell's report), or took too long to prove
    /// the key.
    Closed,
    /// It carried nothing for two heartbeat periods (a partition, a blip).
    Silent,
    /// This node refused what came on it, or its lock owner refused the
    /// state it carried.
    Refused,
}

/// The verdict on one received peer message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Accept,
    /// Well-formed, but a token or ceiling in it is above
    /// [`ClusterCore::token_bound`] (this node's clock is behind the
    /// sender's, or the sender is hostile): the message counts, and what is
    /// beyond the window is left out (see the module doc).
    BeyondWindow,
    /// Refused: the link is dropped, for this reason (in words).
    Refuse(&'static str),
}

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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OutState {
    Down { retry_at_ms: u64 },
    Dialing { since_ms: u64 },
    Up,
}

#[derive(Clone, Copy, Debug)]
struct OutLink {
    state: OutState,
    /// Dials that failed in a row (the backoff's exponent).
    failures: u32,
    warn: RateLimit,
    /// When the link last came up.
    up_since_ms: u64,
    /// Links with this peer dropped in a row over refused state, none of
    /// them up for `--detect` ([`ClusterCore::redial_after_drop`]).
    flaps: u32,
    flap_warn: RateLimit,
    /// The peer has this node's snapshot on this link.
    snap_sent: bool,
    /// A snapshot was asked of the lock owner and has not come yet.
    snap_pending: bool,
    /// When the snapshot went out.
    snap_sent_ms: u64,
    /// Snapshots sent again in a row on this link without the peer saying
    /// it took one (the exponent of the resend wait).
    resends: u32,
}

#[derive(Debug, Default)]
struct InLink {
    /// The peer it proved to be; None while the handshake runs.
    peer: Option<usize>,
    opened_ms: u64,
    /// When it last carried a message (its handshake, at first).
    heard_ms: u64,
    /// A snapshot is being received (entries so far).
    snapshot: Option<Vec<Delta>>,
    /// Entries of that snapshot left out: their tokens are beyond this
    /// node's window.
    left_out: usize,
    /// The `seq` of the snapshot it carried to the lock owner, if any
    /// (what a `StateRefused` names).
    snapshot_seq: Option<u64>,
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

    /// A link to `p` after drops over refused state has now been up for
    /// `--detect`: it is healthy again (its next drop is redialed at once,
    /// and its lines go back to info).
    fn maybe_healthy(&mut self, p: usize, now: Now) {
        let out = &self.outs[p];
        if out.flaps > 0 && out.state == OutState::Up && !self.out_young(p, now) {
            if out.flaps > 1 {
                log::info!(
                    "replication: link to {} has stayed up for {} ms: no longer backing off",
                    self.names[p],
                    self.detect_ms
                );
            }
            self.outs[p].flaps = 0;
        }
    }

    /// How long a dial may take to connect and see the peer's proof: one
    /// heartbeat period (25 ms to HANDSHAKE_MS). A dial that times out is
    /// tried again at once, so across a partition a new SYN goes out every
    /// period and one gets through within a period of the heal (the
    /// kernel's own SYN retry waits a second, then longer).
    pub fn dial_timeout_ms(&self) -> u64 {
        (self.detect_ms / BEATS_PER_DETECT).clamp(25, HANDSHAKE_MS)
    }

    /// Silence on a proved incoming link after which it is dropped and the
    /// peer dialed afresh: two missed heartbeats.
    pub fn silence_ms(&self) -> u64 {
        (2 * self.detect_ms / BEATS_PER_DETECT).max(2)
    }

    /// Drop the dials and incoming links whose handshake took too long, and
    /// the proved links that went silent.
    fn expire_handshakes(&mut self, now: Now) {
        let silence = self.silence_ms();
        let silent: Vec<(LinkId, usize)> = self
            .ins
            .iter()
            .filter_map(|(id, l)| Some((*id, l.peer?, l.heard_ms)))
            .filter(|(_, _, heard)| now.ms >= heard.saturating_add(silence))
            .map(|(id, p, _)| (id, p))
            .collect();
        for (link, p) in silent {
            log::info!(
                "replication: nothing from {} for {silence} ms; dialing it afresh",
                self.names[p]
            );
            self.drop_in(now, link, "silent", InDrop::Silent);
        }
        let timeout = self.dial_timeout_ms();
        for p in 0..self.outs.len() {
            if let OutState::Dialing { since_ms } = self.outs[p].state
                && now.ms >= since_ms.saturating_add(timeout)
            {
                self.effects.push(ClusterEffect::DropOut { peer: p });
                self.handle_link_down(now, p, OutDown::Failed, "no handshake within its time");
                // The wait was the timeout itself: dial again at once.
                self.outs[p].state = OutState::Down {
                    retry_at_ms: now.ms,
                };
            }
        }
        let late: Vec<LinkId> = self
            .ins
            .iter()
            .filter(|(_, l)| l.peer.is_none() && now.ms >= l.opened_ms.saturating_add(HANDSHAKE_MS))
            .map(|(id, _)| *id)
            .collect();
        for link in late {
            log::debug!("replication: an incoming link did not prove the cluster key in time");
            self.drop_in(now, link, "no handshake within its time", InDrop::Closed);
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

    /// The outgoing link to `p` is connected and the peer proved the key
    /// (the shell has sent its own proof).
    pub fn handle_link_up(&mut self, now: Now, p: usize) {
        let Some(out) = self.outs.get(p) else {
            return;
        };
        if !matches!(out.state, OutState::Dialing { .. }) {
            return;
        }
        self.log_link(p, format_args!("link to {} is up", self.names[p]));
        let out = &mut self.outs[p];
        out.state = OutState::Up;
        out.up_since_ms = now.ms;
        // Dials succeed again; whether links with `p` keep dropping
        // (`flaps`) is told when this one has lasted or dropped.
        out.failures = 0;
        out.snap_sent = false;
        out.snap_pending = false;
        out.resends = 0;
        self.send_beats();
    }

    /// The wait before the next dial after `failures` failures in a row:
    /// doubling from RECONNECT_MS, capped, with ±25% jitter so that nodes
    /// do not dial in lockstep.
    fn backoff_ms(&mut self, failures: u32, why: OutDown) -> u64 {
        // A dial that timed out or failed (a partition, say) is tried again
        // soon; a refused or rejected one (nothing there, or not a peer)
        // backs off further.
        let cap = match why {
            OutDown::Failed => self.dial_timeout_ms(),
            OutDown::Refused | OutDown::Rejected => {
                (self.detect_ms / 2).clamp(RECONNECT_MS, RECONNECT_MAX_MS)
            }
        };
        let base = RECONNECT_MS
            .saturating_mul(1u64 << failures.saturating_sub(1).min(16))
            .min(cap);
        // SplitMix64.
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let spread = base / 2;
        base - base / 4 + if spread == 0 { 0 } else { z % (spread + 1) }
    }

    /// The wait before the next dial after the `flaps`-th link in a row
    /// with `p` dropped over refused state (`flaps` ≥ 2): doubling from
    /// RECONNECT_MS, with jitter, and never above `--detect`/2 (no floor:
    /// with `--detect 0.02` that is 10 ms).
    ///
    /// Why that bound: each node's heartbeats travel only on its own
    /// outgoing link, and the first thing on every new link is one
    /// ([`ClusterCore::handle_link_up`] sends a heartbeat at once). In a
    /// refusal loop both nodes wait at most `--detect`/2, then dial (a
    /// connect and a handshake: a couple of round trips) and send a
    /// heartbeat on the new link; so each hears the other at least every
    /// `--detect`/2 plus those round trips, below `--detect` and below
    /// [`silence_limit_ms`] (`--detect` + two heartbeat periods) by more
    /// than half of `--detect`. Neither finds the other dead, nor does the
    /// standby promote itself over a live active, however small
    /// `--detect` is (a network slower than that margin would fail
    /// `--detect` without any backoff). Within a round the active's
    /// heartbeat comes before its snapshot, so the refusing standby hears
    /// it too.
    fn flap_backoff_ms(&mut self, flaps: u32) -> u64 {
        let cap = self.detect_ms / 2;
        self.backoff_ms(flaps.saturating_sub(1), OutDown::Refused)
            .min(cap)
    }

    /// Did the peer refuse the state this node sent on its link to `p`?
    /// This node is active and sent its snapshot on that link, and `p` has
    /// not said it holds that state since: a drop now is `p` refusing it
    /// (a lower `--max-keys` or `--max-lease`), or a drop in the middle of
    /// a snapshot (counted the same: only the second in a row backs off).
    fn peer_refusing(&self, p: usize) -> bool {
        self.outs.get(p).is_some_and(|o| o.snap_sent)
            && self.roles.role_name().is_active()
            && !self
                .roles
                .peer_beat(p)
                .is_some_and(|b| b.synced && b.following == Some(self.me))
    }

    /// Is the outgoing link to `p` up, and since less than `--detect`?
    fn out_young(&self, p: usize, now: Now) -> bool {
        self.outs.get(p).is_some_and(|o| {
            o.state == OutState::Up && now.ms.saturating_sub(o.up_since_ms) < self.detect_ms
        })
    }

    /// The links with `p` dropped (either one: the other goes with it),
    /// over state refused (`refused`: this node refused something the link
    /// carried, or its lock owner refused the state, or `p` is refusing
    /// this node's snapshot: [`ClusterCore::peer_refusing`]) or not: when
    /// to dial `p` again. Any other drop (a blip, a silent link, a crash,
    /// however young the link) is redialed at once, as is the first
    /// refused one (to tell a dead peer from a blip quickly: the dial is
    /// refused). Each further refused drop in a row backs off
    /// ([`ClusterCore::flap_backoff_ms`], at most `--detect`/2), so two
    /// nodes one of which refuses the other's state (different
    /// `--max-keys`, say) do not relink in a tight loop, and still hear
    /// each other well within `--detect`; that is warned about once per
    /// WARN_EVERY_MS, and the links' own lines go to debug meanwhile
    /// ([`ClusterCore::log_link`]).
    fn redial_after_drop(&mut self, now: Now, p: usize, refused: bool) -> u64 {
        let out = &mut self.outs[p];
        if !refused {
            out.flaps = 0;
            out.failures = 0;
            return now.ms;
        }
        out.flaps = out.flaps.saturating_add(1);
        out.failures = 0;
        if out.flaps == 1 {
            return now.ms;
        }
        let flaps = out.flaps;
        let wait = self.flap_backoff_ms(flaps);
        if let Some(n) = self.outs[p].flap_warn.allow(now.ms, WARN_EVERY_MS) {
            log::warn!(
                "replication: links with {} keep dropping over state one node refuses ({flaps} \
                 in a row): dialing it again in {wait} ms, and backing off while they do. The \
                 node that refuses the other's state says why in its log: give every node the \
                 same --max-keys and --max-lease{}",
                self.names[p],
                left_out(n)
            );
        }
        now.ms.saturating_add(wait)
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

    /// The outgoing link to `p` failed to connect, or dropped.
    pub fn handle_link_down(&mut self, now: Now, p: usize, why: OutDown, detail: &str) {
        let Some(out) = self.outs.get(p) else {
            return;
        };
        let was_up = out.state == OutState::Up;
        let retry_at_ms = if was_up {
            self.log_link(
                p,
                format_args!("link to {} dropped: {detail}", self.names[p]),
            );
            let refused = self.peer_refusing(p);
            self.redial_after_drop(now, p, refused)
        } else {
            // A dial that failed: back off.
            let failures = out.failures.saturating_add(1);
            self.outs[p].failures = failures;
            let wait = self.backoff_ms(failures, why);
            now.ms.saturating_add(wait)
        };
        let out = &mut self.outs[p];
        out.snap_sent = false;
        out.snap_pending = false;
        out.state = OutState::Down { retry_at_ms };
        let name = &self.names[p];
        if was_up {
            // Logged above.
        } else if why == OutDown::Rejected {
            if let Some(n) = out.warn.allow(now.ms, WARN_EVERY_MS) {
                log::warn!(
                    "replication: {name} is not accepted as a peer: {detail}; retrying{}",
                    left_out(n)
                );
            }
        } else {
            log::debug!("replication: connecting to {name} failed: {detail}");
        }
        // Nothing listens on its port: the process is gone (a live node
        // does not refuse; an overloaded one drops the SYN instead).
        if why == OutDown::Refused {
            let effects = self.roles.handle_peer_dead(now.ms, p);
            self.apply_role_effects(now, effects);
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

    /// Incoming link `link` proved it is node `from` (the shell checked its
    /// handshake; `from` is a valid index other than this node's). A newer
    /// link from the same peer replaces the old one.
    pub fn handle_in_authenticated(&mut self, now: Now, link: LinkId, from: usize) {
        if from >= self.names.len() || from == self.me || !self.ins.contains_key(&link) {
            self.effects.push(ClusterEffect::DropIn { link });
            self.ins.remove(&link);
            return;
        }
        let stale: Vec<LinkId> = self
            .ins
            .iter()
            .filter(|(l, state)| **l != link && state.peer == Some(from))
            .map(|(l, _)| *l)
            .collect();
        for l in stale {
            // What the old link still had unread is lost with it: this node
            // no longer holds the full state of `from` (if it followed it)
            // until the snapshot `from` sends on its new link.
            if let Some(old) = self.ins.remove(&l)
                && old.peer == Some(from)
            {
                self.roles.handle_state_lost(from);
            }
            self.effects.push(ClusterEffect::DropIn { link: l });
        }
        self.log_link(from, format_args!("link from {} is up", self.names[from]));
        if let Some(state) = self.ins.get_mut(&link) {
            state.peer = Some(from);
            state.heard_ms = now.ms;
        }
    }

    /// Incoming link `link` (from the address `from`, when the shell knows
    /// it) failed its handshake (`why`, in words): it is dropped, and the
    /// failure logged at most once per WARN_EVERY_MS.
    pub fn handle_in_rejected(
        &mut self,
        now: Now,
        link: LinkId,
        from: Option<&dyn std::fmt::Display>,
        why: &str,
    ) {
        if let Some(n) = self.stranger_warn.allow(now.ms, WARN_EVERY_MS) {
            let who = from.map_or_else(|| "a connection".to_string(), |a| a.to_string());
            log::warn!(
                "replication: refused a peer link from {who}: {why}{}",
                left_out(n)
            );
        }
        self.drop_in(now, link, why, InDrop::Closed);
    }

    /// Incoming link `link` has input the shell holds back unread until the
    /// lock owner catches up (replication.rs): neither the link nor its peer
    /// is silent, whatever that input says. A node does not judge its peers
    /// by what it has not read (a dead peer is found so once the input is
    /// read, late by the time it was held).
    pub fn handle_in_held(&mut self, now: Now, link: LinkId) {
        let Some(state) = self.ins.get_mut(&link) else {
            return;
        };
        let Some(p) = state.peer else {
            return;
        };
        state.heard_ms = state.heard_ms.max(now.ms);
        self.roles.handle_heard(now.ms, p);
    }

    /// Incoming link `link` closed or failed (the shell has closed it).
    pub fn handle_in_closed(&mut self, now: Now, link: LinkId, why: &str) {
        self.in_closed(now, link, why, InDrop::Closed);
    }

    /// Incoming link `link` is gone (`why`, in words; `cause` for the
    /// redial): this node's own link to its peer goes with it, and is
    /// dialed again at once — a refused dial means the peer is dead — unless
    /// links with that peer keep dropping over refused state
    /// ([`ClusterCore::redial_after_drop`]).
    fn in_closed(&mut self, now: Now, link: LinkId, why: &str, cause: InDrop) {
        let Some(state) = self.ins.remove(&link) else {
            return;
        };
        let Some(p) = state.peer else {
            return;
        };
        if p >= self.outs.len() {
            return;
        }
        self.log_link(
            p,
            format_args!("link from {} dropped: {why}", self.names[p]),
        );
        self.roles.handle_state_lost(p);
        let refused = match cause {
            InDrop::Refused => true,
            // A partition or a blip: dial again at once, then every
            // heartbeat period, however young the link was.
            InDrop::Silent => false,
            InDrop::Closed => self.peer_refusing(p),
        };
        let out = &self.outs[p];
        let was_live = matches!(out.state, OutState::Up | OutState::Dialing { .. });
        if was_live {
            self.effects.push(ClusterEffect::DropOut { peer: p });
        }
        // An outgoing link already down and backing off after a refused
        // drop (the same drop seen from that side, usually) keeps its
        // backoff: both links going count once, and the wait is short
        // (at most `--detect`/2).
        if was_live || out.flaps == 0 {
            let retry_at_ms = self.redial_after_drop(now, p, refused);
            self.outs[p].state = OutState::Down { retry_at_ms };
        }
        let out = &mut self.outs[p];
        out.snap_sent = false;
        out.snap_pending = false;
    }

    /// A line on incoming link `link` that did not parse.
    pub fn handle_in_malformed(&mut self, now: Now, link: LinkId) {
        self.drop_in(now, link, "a line not understood", InDrop::Refused);
    }

    fn drop_in(&mut self, now: Now, link: LinkId, why: &str, cause: InDrop) {
        if self.ins.contains_key(&link) {
            self.effects.push(ClusterEffect::DropIn { link });
            self.in_closed(now, link, why, cause);
        }
    }

    /// The largest token or ceiling taken from a peer at `now`: this node's
    /// window (see the module doc).
    pub fn token_bound(now: Now) -> u64 {
        tokens::clock_floor(now.unix_ms.saturating_add(MAX_PEER_AHEAD_MS)).min(tokens::MAX_TOKEN)
    }

    /// Is `msg`, received on incoming link `link`, acceptable, and is all
    /// of it within this node's window? One place for every check of a
    /// peer's message, so that it can be tightened.
    pub fn check_peer_msg(&self, now: Now, link: LinkId, msg: &PeerMsg) -> Verdict {
        let Some(state) = self.ins.get(&link) else {
            return Verdict::Refuse("an unknown link");
        };
        if state.peer.is_none() {
            return Verdict::Refuse("a message before the handshake");
        }
        let nodes = self.names.len();
        let bound = Self::token_bound(now);
        let too_far = |t: u64| t > bound;
        match msg {
            PeerMsg::Beat {
                beat,
                last_token,
                ceiling,
            } => {
                if beat.following.is_some_and(|f| f >= nodes) {
                    Verdict::Refuse("a heartbeat naming an unknown node")
                } else if too_far(*last_token) || too_far(*ceiling) {
                    Verdict::BeyondWindow
                } else {
                    Verdict::Accept
                }
            }
            PeerMsg::Delta(Delta::Grant {
                token,
                ms_left,
                limit,
                slot,
                ..
            }) => {
                if !(1..=MAX_LIMIT).contains(limit) {
                    Verdict::Refuse("a limit outside 1..=10000")
                } else if slot >= limit {
                    Verdict::Refuse("a slot at or above its key's limit")
                } else if *token == 0 {
                    Verdict::Refuse("token 0")
                } else if *ms_left > self.params.max_lease_ms {
                    Verdict::Refuse("a lease above --max-lease")
                } else if state
                    .snapshot
                    .as_ref()
                    .is_some_and(|s| s.len() >= self.params.max_keys)
                {
                    Verdict::Refuse("a snapshot above --max-keys")
                } else if too_far(*token) {
                    Verdict::BeyondWindow
                } else {
                    Verdict::Accept
                }
            }
            PeerMsg::Delta(Delta::Free { .. }) if state.snapshot.is_some() => {
                Verdict::Refuse("a free inside a snapshot")
            }
            PeerMsg::Delta(Delta::Free { slot, .. }) if *slot >= MAX_LIMIT => {
                Verdict::Refuse("a slot at or above its key's limit")
            }
            PeerMsg::Delta(Delta::Free { token, .. } | Delta::Ceiling(token)) => {
                // A snapshot is at most --max-keys grants and its ceiling:
                // ceilings beyond that are refused like grants beyond it.
                if state
                    .snapshot
                    .as_ref()
                    .is_some_and(|s| s.len() > self.params.max_keys)
                {
                    Verdict::Refuse("a snapshot above --max-keys")
                } else if *token == 0 {
                    Verdict::Refuse("token 0")
                } else if too_far(*token) {
                    Verdict::BeyondWindow
                } else {
                    Verdict::Accept
                }
            }
            PeerMsg::SnapshotBegin | PeerMsg::SnapshotEnd | PeerMsg::Handoff | PeerMsg::Took => {
                Verdict::Accept
            }
        }
    }

    /// `msg` from `p` carries a token or ceiling beyond this node's window:
    /// say so, at most once per WARN_EVERY_MS per peer.
    fn warn_beyond_window(&mut self, now: Now, p: usize, msg: &PeerMsg) {
        let token = match msg {
            PeerMsg::Beat {
                last_token,
                ceiling,
                ..
            } => (*last_token).max(*ceiling),
            PeerMsg::Delta(
                Delta::Grant { token, .. } | Delta::Free { token, .. } | Delta::Ceiling(token),
            ) => *token,
            _ => return,
        };
        let Some(n) = self.clock_warn[p].allow(now.ms, WARN_EVERY_MS) else {
            return;
        };
        let ahead_s = (token.saturating_sub(tokens::clock_floor(now.unix_ms)) >> 20) / 1000;
        log::warn!(
            "replication: {} sent a token {ahead_s} s ahead of this node's clock (at most {} s \
             are taken from a peer): not taken, nor any state that carries such tokens; this \
             node still follows the roles it hears but cannot hold the active's state. Is this \
             node's clock behind, or that node's ahead? Keep the nodes' clocks in sync (NTP){}",
            self.names[p],
            MAX_PEER_AHEAD_MS / 1000,
            left_out(n)
        );
    }

    /// One message on incoming link `link`.
    pub fn handle_peer_msg(&mut self, now: Now, link: LinkId, msg: PeerMsg) {
        let verdict = self.check_peer_msg(now, link, &msg);
        if let Verdict::Refuse(why) = verdict {
            let peer = self.ins.get(&link).and_then(|l| l.peer);
            let limit = match peer {
                Some(p) => &mut self.refusal_warn[p],
                None => &mut self.stranger_warn,
            };
            if let Some(n) = limit.allow(now.ms, WARN_EVERY_MS) {
                let who = peer.map_or("a link in its handshake", |p| self.names[p].as_str());
                log::warn!(
                    "replication: refused {why} from {who}; dropping the link{}",
                    left_out(n)
                );
            }
            if let Some(p) = peer
                && (self.roles.following() == Some(p) || self.snapshot_from == Some(p))
            {
                // This node does not hold (and cannot take) its active's
                // state from what it refused.
                self.roles.handle_state_refused();
            }
            return self.drop_in(now, link, why, InDrop::Refused);
        }
        let Some(state) = self.ins.get_mut(&link) else {
            return;
        };
        state.heard_ms = now.ms;
        let Some(p) = state.peer else {
            return;
        };
        let beyond = verdict == Verdict::BeyondWindow;
        if beyond {
            self.warn_beyond_window(now, p, &msg);
        }
        let from_my_active = self.roles.following() == Some(p);
        match msg {
            PeerMsg::Beat {
                beat,
                last_token,
                ceiling,
            } => {
                if beat.following != Some(self.me) {
                    // Whatever it had from this node is stale now (it may
                    // follow this node again by its very next heartbeat).
                    self.outs[p].snap_sent = false;
                }
                // Stay above every token any peer issued itself (one that
                // was active during a split included), and above the ceiling
                // of any active; an active never takes a standby's ceiling
                // (an echo of its own, which would only inflate tokens).
                // Nothing beyond this node's window is taken; the beat
                // counts all the same.
                let bound = Self::token_bound(now);
                let i_am_active = self.roles.role_name().is_active();
                let mut floor = if last_token <= bound { last_token } else { 0 };
                if (!i_am_active || beat.role.is_active()) && ceiling <= bound {
                    floor = floor.max(ceiling);
                }
                if floor > 0 {
                    self.tell_table(ClusterToTable::Observe(floor));
                }
                let effects = self.roles.handle_beat(now.ms, p, beat);
                self.apply_role_effects(now, effects);
                // Everything the active sent before this beat is applied
                // (same link, in order): the state is current as of now.
                if from_my_active && self.roles.following() == Some(p) && self.roles.beat().synced {
                    self.flush_deltas_in();
                    self.heard_active_ms = now.ms;
                }
            }
            PeerMsg::SnapshotBegin if from_my_active => {
                if let Some(l) = self.ins.get_mut(&link) {
                    l.snapshot = Some(Vec::new());
                    l.left_out = 0;
                }
            }
            PeerMsg::Delta(_) if from_my_active && beyond => {
                // Not applied: this node cannot take its token. It no
                // longer holds (or will not hold) the active's whole state.
                match self.ins.get_mut(&link) {
                    Some(l) if l.snapshot.is_some() => l.left_out += 1,
                    _ => self.roles.handle_state_lost(p),
                }
            }
            PeerMsg::Delta(delta) if from_my_active => {
                match self.ins.get_mut(&link).and_then(|l| l.snapshot.as_mut()) {
                    Some(entries) => entries.push(delta),
                    None => {
                        self.deltas_in_since_ms.get_or_insert(now.ms);
                        self.deltas_in.push(delta);
                        if self.deltas_in.len() >= APPLY_BATCH_MAX {
                            self.flush_deltas_in();
                        }
                    }
                }
            }
            PeerMsg::SnapshotEnd if from_my_active => {
                let Some(l) = self.ins.get_mut(&link) else {
                    return;
                };
                let left = std::mem::take(&mut l.left_out);
                if let Some(entries) = l.snapshot.take() {
                    self.flush_deltas_in();
                    if left > 0 {
                        // What it could take replaces the table (closer to
                        // the active's than what it had), but it does not
                        // hold the active's state.
                        log::warn!(
                            "replication: snapshot of {} entries from {}, {left} more left out \
                             (tokens beyond this node's clock window): this node does not hold \
                             its state",
                            entries.len(),
                            self.names[p]
                        );
                        self.pass_snapshot(link, p, entries);
                        self.roles.handle_state_lost(p);
                        return;
                    }
                    log::info!(
                        "replication: snapshot of {} entries from {}",
                        entries.len(),
                        self.names[p]
                    );
                    self.pass_snapshot(link, p, entries);
                    let effects = self.roles.handle_synced(now.ms, p);
                    self.apply_role_effects(now, effects);
                    self.heard_active_ms = now.ms;
                    // Tell every peer at once that this node now holds the
                    // state: the active may transfer its role to it, and it
                    // must win an election from now on.
                    self.send_beats();
                }
            }
            PeerMsg::Handoff => {
                self.flush_deltas_in();
                let effects = self.roles.handle_handoff(now.ms, p);
                self.apply_role_effects(now, effects);
            }
            PeerMsg::Took => {
                let effects = self.roles.handle_took(now.ms, p);
                self.apply_role_effects(now, effects);
            }
            PeerMsg::SnapshotBegin | PeerMsg::Delta(_) | PeerMsg::SnapshotEnd => {
                // From a node this one does not follow: stale, ignore.
            }
        }
    }

    // ----- the lock owner's core -----

    /// One message from the lock owner's core.
    pub fn handle_table(&mut self, now: Now, msg: TableToCluster) {
        match msg {
            TableToCluster::Deltas(deltas) => {
                for p in 0..self.outs.len() {
                    if p == self.me || !self.outs[p].snap_sent {
                        continue;
                    }
                    for delta in &deltas {
                        self.send(p, PeerMsg::Delta(delta.clone()));
                    }
                }
            }
            TableToCluster::Snapshot {
                peer,
                entries,
                ceiling,
            } => self.send_snapshot(now, peer, entries, ceiling),
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
                    if p != self.me && self.outs[p].snap_sent {
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
        }
    }

    /// The lock owner refused part of the state its active sent (`why`),
    /// after the snapshot numbered `snapshot` (0: before any): this node
    /// cannot hold that state (its `--max-keys` is below what the active
    /// holds, say). A refusal about an older snapshot than the last one
    /// passed on is stale (the table has been replaced since) and changes
    /// nothing. Otherwise, as for a message refused here: unless this node
    /// is active by now, it says it does not hold replicated state (it is
    /// not counted in `standbys=`, no role is handed to it, an election
    /// prefers a node that holds the state) — whomever it follows now, even
    /// no one (its active just found dead); and the link that carried that
    /// snapshot goes, if it is still up (no other: a newer link starts with
    /// its own snapshot, judged on its own), so the active's next link
    /// starts with a fresh snapshot — refused again while this node cannot
    /// hold it, and redialed with a backoff meanwhile.
    fn handle_state_refused(&mut self, now: Now, why: &str, snapshot: u64) {
        if snapshot != self.snapshot_seq {
            log::debug!(
                "replication: the lock owner refused state of an older snapshot ({why}); a newer \
                 one replaced it"
            );
            return;
        }
        let from = self.snapshot_from;
        let name = from.map_or("its active", |p| self.names[p].as_str());
        if self.roles.role_name().is_active() {
            // It took the active role meanwhile (before this came through).
            log::warn!(
                "replication: the lock owner refused part of the state of {name}, which this \
                 node followed ({why}), and this node took the active role since: it serves \
                 without that part"
            );
            return;
        }
        self.roles.handle_state_refused();
        let limit = match from {
            Some(p) => &mut self.refusal_warn[p],
            None => &mut self.stranger_warn,
        };
        if let Some(n) = limit.allow(now.ms, WARN_EVERY_MS) {
            log::warn!(
                "replication: this node cannot hold the state of {name}, its active ({why}): \
                 dropping the link; it does not count as holding that state until it can take a \
                 snapshot of it. Give every node the same --max-keys and --max-lease{}",
                left_out(n)
            );
        }
        let links: Vec<LinkId> = self
            .ins
            .iter()
            .filter(|(_, l)| from.is_some() && l.peer == from && l.snapshot_seq == Some(snapshot))
            .map(|(id, _)| *id)
            .collect();
        for link in links {
            self.drop_in(now, link, why, InDrop::Refused);
        }
        // Say so at once on any link still up.
        self.send_beats();
    }

    /// Pass the snapshot that incoming link `link` from `p` carried to the
    /// lock owner, numbered for a `StateRefused` about it.
    fn pass_snapshot(&mut self, link: LinkId, p: usize, entries: Vec<Delta>) {
        self.snapshot_seq = self.snapshot_seq.saturating_add(1);
        self.snapshot_from = Some(p);
        if let Some(l) = self.ins.get_mut(&link) {
            l.snapshot_seq = Some(self.snapshot_seq);
        }
        self.tell_table(ClusterToTable::Snapshot {
            seq: self.snapshot_seq,
            entries,
        });
    }

    fn send_snapshot(&mut self, now: Now, peer: usize, entries: Vec<Delta>, ceiling: u64) {
        let Some(out) = self.outs.get_mut(peer) else {
            return;
        };
        out.snap_pending = false;
        if out.state != OutState::Up || !self.roles.role_name().is_active() {
            return;
        }
        self.log_link(
            peer,
            format_args!(
                "sending a snapshot of {} keys to {}",
                entries.len(),
                self.names[peer]
            ),
        );
        self.send(peer, PeerMsg::SnapshotBegin);
        for entry in entries {
            self.send(peer, PeerMsg::Delta(entry));
        }
        self.send(peer, PeerMsg::Delta(Delta::Ceiling(ceiling)));
        self.send(peer, PeerMsg::SnapshotEnd);
        self.outs[peer].snap_sent = true;
        self.outs[peer].snap_sent_ms = now.ms;
    }

    /// Ask the lock owner for a snapshot for `p` when `p` follows this
    /// active node and has none on its current link.
    fn maybe_ask_snapshot(&mut self, p: usize, now: Now) {
        let beat = self.roles.peer_beat(p);
        let follows_me = beat.is_some_and(|b| b.following == Some(self.me));
        let active = self.roles.role_name().is_active();
        let out = &mut self.outs[p];
        if !follows_me || !active {
            out.snap_sent = false;
            return;
        }
        if beat.is_some_and(|b| b.synced) {
            out.resends = 0;
        }
        // A follower that still says it lacks the state a detection period
        // after its snapshot went out did not get it (it switched to this
        // node in between, say): send it again. One that keeps saying so
        // (its clock is far behind, say) gets it ever less often.
        let wait = self
            .detect_ms
            .saturating_mul(1 << out.resends.min(16))
            .min(SNAPSHOT_RESEND_MAX_MS.max(self.detect_ms));
        let stale =
            beat.is_some_and(|b| !b.synced) && now.ms.saturating_sub(out.snap_sent_ms) > wait;
        if out.snap_sent && stale {
            log::info!(
                "replication: {} still lacks the state; sending it again",
                self.names[p]
            );
            out.snap_sent = false;
            out.resends = out.resends.saturating_add(1);
        }
        if out.snap_sent || out.snap_pending || out.state != OutState::Up {
            return;
        }
        out.snap_pending = true;
        self.tell_table(ClusterToTable::SnapshotWanted { peer: p });
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
                    for out in &mut self.outs {
                        out.snap_sent = false;
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

    fn flush_deltas_in(&mut self) {
        self.deltas_in_since_ms = None;
        if !self.deltas_in.is_empty() {
            let deltas = std::mem::take(&mut self.deltas_in);
            self.tell_table(ClusterToTable::Deltas(deltas));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Key;
    use crate::server::core::roles::{Beat, RoleName};

    const DETECT: u64 = 400;

    fn at(ms: u64) -> Now {
        Now::at(ms, 1_700_000_000_000 + ms)
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("n{i}:1")).collect()
    }

    fn beat(role: RoleName, following: Option<usize>, synced: bool) -> PeerMsg {
        PeerMsg::Beat {
            beat: Beat {
                role,
                following,
                synced,
                has_state: synced,
            },
            last_token: 0,
            ceiling: 0,
        }
    }

    /// An active's heartbeat that holds the state, with its tokens.
    fn active_beat(last_token: u64, ceiling: u64) -> PeerMsg {
        PeerMsg::Beat {
            beat: Beat {
                role: RoleName::Active,
                following: None,
                synced: false,
                has_state: true,
            },
            last_token,
            ceiling,
        }
    }

    fn effects(core: &mut ClusterCore) -> Vec<ClusterEffect> {
        core.poll_effects().collect()
    }

    fn key(k: &str) -> Key {
        Key::new(k.as_bytes()).expect("valid key")
    }

    /// Node `me` of 2 with its outgoing link to the other up and an
    /// incoming link (id 7) from it that proved the key.
    fn linked(me: usize) -> ClusterCore {
        linked_with(me, ClusterParams::with_detect(DETECT))
    }

    fn linked_with(me: usize, params: ClusterParams) -> ClusterCore {
        let other = 1 - me;
        let mut core = ClusterCore::new(me, names(2), params, at(0));
        core.handle_tick(at(0));
        assert!(effects(&mut core).contains(&ClusterEffect::Dial { peer: other }));
        core.handle_link_up(at(1), other);
        core.handle_in_opened(at(1), 7);
        core.handle_in_authenticated(at(1), 7, other);
        effects(&mut core);
        core
    }

    /// Tick `core` every ms from `from` until it dials `p`: the wait is
    /// what the core chose. Returns that time.
    fn next_dial(core: &mut ClusterCore, p: usize, from: u64) -> u64 {
        (from..from + 10 * RECONNECT_MAX_MS)
            .find(|&t| {
                core.handle_tick(at(t));
                effects(core).contains(&ClusterEffect::Dial { peer: p })
            })
            .expect("it dials")
    }

    /// The next dial to `p` from `from` on, reported up; returns its time.
    fn dial_up(core: &mut ClusterCore, p: usize, from: u64) -> u64 {
        let t = next_dial(core, p, from);
        core.handle_link_up(at(t), p);
        t
    }

    /// Node `me` of 2, alone until `ms` (so active if `ms` is past the
    /// detection time), then linked both ways with the other node.
    fn linked_at(me: usize, ms: u64) -> ClusterCore {
        let other = 1 - me;
        let mut core = new_core(me, 2);
        core.handle_tick(at(ms));
        let t = dial_up(&mut core, other, ms);
        core.handle_in_opened(at(t), 7);
        core.handle_in_authenticated(at(t), 7, other);
        effects(&mut core);
        core
    }

    fn new_core(me: usize, nodes: usize) -> ClusterCore {
        ClusterCore::new(me, names(nodes), ClusterParams::with_detect(DETECT), at(0))
    }

    #[test]
    fn a_link_that_proved_the_key_starts_with_beats() {
        let mut core = new_core(1, 2);
        core.handle_tick(at(0));
        assert_eq!(effects(&mut core), vec![ClusterEffect::Dial { peer: 0 }]);
        core.handle_link_up(at(2), 0);
        let out = effects(&mut core);
        assert!(matches!(
            out[0],
            ClusterEffect::Send {
                peer: 0,
                msg: PeerMsg::Beat { .. }
            }
        ));
    }

    #[test]
    fn failed_dials_back_off_with_jitter_up_to_the_cap_and_reset_once_up() {
        let mut core = new_core(1, 2);
        core.handle_tick(at(0));
        effects(&mut core);
        let mut now = 1;
        let mut waits = Vec::new();
        for _ in 0..8 {
            core.handle_link_down(at(now), 0, OutDown::Refused, "refused");
            let retry = next_dial(&mut core, 0, now + 1);
            waits.push(retry - now);
            now = retry;
        }
        let cap = (DETECT / 2).clamp(RECONNECT_MS, RECONNECT_MAX_MS);
        assert!(
            waits[0] >= RECONNECT_MS * 3 / 4 && waits[0] <= RECONNECT_MS * 5 / 4,
            "{waits:?}"
        );
        assert!(waits[1] > waits[0] || waits[1] >= cap * 3 / 4, "{waits:?}");
        assert!(waits.iter().all(|&w| w <= cap * 5 / 4), "{waits:?}");
        assert!(waits[7] >= cap * 3 / 4, "reaches the cap: {waits:?}");
        // Dials that time out (a partition) are tried again within the
        // dial timeout: one gets through soon after the network heals.
        for _ in 0..8 {
            core.handle_link_down(at(now), 0, OutDown::Failed, "timed out");
            let retry = next_dial(&mut core, 0, now + 1);
            assert!(
                retry - now <= core.dial_timeout_ms() * 5 / 4,
                "{}",
                retry - now
            );
            now = retry;
        }
        // Up, then dropped: redial at once.
        core.handle_link_up(at(now), 0);
        effects(&mut core);
        core.handle_link_down(at(now + 5), 0, OutDown::Failed, "reset");
        core.handle_tick(at(now + 5));
        assert!(effects(&mut core).contains(&ClusterEffect::Dial { peer: 0 }));
    }

    #[test]
    fn a_dial_that_does_not_connect_and_prove_itself_in_time_fails() {
        let mut core = new_core(1, 2);
        core.handle_tick(at(0));
        assert_eq!(effects(&mut core), vec![ClusterEffect::Dial { peer: 0 }]);
        let timeout = core.dial_timeout_ms();
        assert_eq!(timeout, DETECT / BEATS_PER_DETECT);
        core.handle_tick(at(timeout - 1));
        assert!(!effects(&mut core).contains(&ClusterEffect::DropOut { peer: 0 }));
        assert!(core.next_wake_ms(at(10)) <= timeout);
        core.handle_tick(at(timeout));
        let out = effects(&mut core);
        let drop = out
            .iter()
            .position(|e| *e == ClusterEffect::DropOut { peer: 0 });
        let dial = out
            .iter()
            .position(|e| *e == ClusterEffect::Dial { peer: 0 });
        assert!(
            matches!((drop, dial), (Some(d), Some(n)) if d < n),
            "dropped, then dialed again at once: {out:?}"
        );
    }

    #[test]
    fn messages_on_a_link_before_its_handshake_are_refused() {
        let mut core = new_core(0, 2);
        core.handle_in_opened(at(0), 1);
        assert_eq!(
            core.check_peer_msg(at(1), 1, &PeerMsg::Took),
            Verdict::Refuse("a message before the handshake")
        );
        core.handle_peer_msg(at(1), 1, PeerMsg::Took);
        assert_eq!(effects(&mut core), vec![ClusterEffect::DropIn { link: 1 }]);
        // An index that cannot be a peer is refused even when proved.
        core.handle_in_opened(at(1), 3);
        core.handle_in_authenticated(at(1), 3, 0);
        assert_eq!(effects(&mut core), vec![ClusterEffect::DropIn { link: 3 }]);
        // A failed handshake drops the link.
        core.handle_in_opened(at(1), 4);
        core.handle_in_rejected(at(1), 4, None, "bad proof");
        assert_eq!(effects(&mut core), vec![ClusterEffect::DropIn { link: 4 }]);
        assert_eq!(core.roles().role_name(), RoleName::Discovering);
    }

    #[test]
    fn links_that_never_finish_their_handshake_are_dropped_and_bounded() {
        let mut core = new_core(0, 2);
        for link in 0..(MAX_PENDING_IN + 4) {
            core.handle_in_opened(at(link as u64), link);
        }
        // The oldest ones made room for the newest.
        let dropped: Vec<ClusterEffect> = effects(&mut core);
        assert_eq!(
            dropped,
            (0..4)
                .map(|link| ClusterEffect::DropIn { link })
                .collect::<Vec<_>>()
        );
        assert!(core.next_wake_ms(at(30)) <= 4 + HANDSHAKE_MS);
        core.handle_tick(at(HANDSHAKE_MS + MAX_PENDING_IN as u64 + 4));
        let late: Vec<ClusterEffect> = effects(&mut core)
            .into_iter()
            .filter(|e| matches!(e, ClusterEffect::DropIn { .. }))
            .collect();
        assert_eq!(late.len(), MAX_PENDING_IN, "every unproved link timed out");
    }

    #[test]
    fn forged_tokens_ceilings_and_leases_are_refused_or_left_out_even_from_a_proved_peer() {
        let params = ClusterParams {
            max_lease_ms: 60_000,
            ..ClusterParams::with_detect(DETECT)
        };
        let core = linked_with(0, params);
        let now = at(2);
        let grant = |token: u64, ms_left: u64| {
            PeerMsg::Delta(Delta::grant(Key::new(b"k").expect("key"), token, ms_left))
        };
        let check = |msg: &PeerMsg| core.check_peer_msg(now, 7, msg);
        let bound = ClusterCore::token_bound(now);
        assert_eq!(check(&grant(0, 1)), Verdict::Refuse("token 0"));
        assert_eq!(check(&grant(bound, 60_000)), Verdict::Accept);
        // Beyond the window: left out (the link stays), never taken.
        assert_eq!(check(&grant(bound + 1, 1)), Verdict::BeyondWindow);
        assert_eq!(check(&grant(u64::MAX - 47, 1)), Verdict::BeyondWindow);
        assert_eq!(
            check(&grant(u64::MAX - 47, 60_001)),
            Verdict::Refuse("a lease above --max-lease"),
            "a malformed message is refused whatever its token"
        );
        assert_eq!(
            check(&grant(16, 60_001)),
            Verdict::Refuse("a lease above --max-lease")
        );
        let free0 = PeerMsg::Delta(Delta::free(Key::new(b"k").expect("key"), 0));
        assert_eq!(check(&free0), Verdict::Refuse("token 0"));
        assert_eq!(
            check(&PeerMsg::Delta(Delta::Ceiling(0))),
            Verdict::Refuse("token 0")
        );
        assert_eq!(
            check(&PeerMsg::Delta(Delta::Ceiling(u64::MAX))),
            Verdict::BeyondWindow
        );
        let stranger = beat(RoleName::Standby, Some(9), false);
        assert!(matches!(check(&stranger), Verdict::Refuse(_)));
        let huge = PeerMsg::Beat {
            beat: Beat {
                role: RoleName::Active,
                following: None,
                synced: true,
                has_state: true,
            },
            last_token: u64::MAX,
            ceiling: 1,
        };
        assert_eq!(check(&huge), Verdict::BeyondWindow);
        // A token near the clock is fine (a real peer's).
        let real = PeerMsg::Beat {
            beat: Beat {
                role: RoleName::Active,
                following: None,
                synced: true,
                has_state: true,
            },
            last_token: tokens::start_floor(now.unix_ms),
            ceiling: tokens::start_floor(now.unix_ms + 1000),
        };
        assert_eq!(check(&real), Verdict::Accept);
    }

    #[test]
    fn a_snapshot_above_max_keys_is_refused_and_nothing_of_it_applied() {
        let params = ClusterParams {
            max_keys: 3,
            ..ClusterParams::with_detect(DETECT)
        };
        let mut core = linked_with(1, params);
        core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
        core.handle_tick(at(2));
        assert_eq!(core.roles().following(), Some(0));
        effects(&mut core);
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotBegin);
        for i in 0..4u64 {
            core.handle_peer_msg(
                at(3),
                7,
                PeerMsg::Delta(Delta::grant(
                    Key::new(format!("k{i}").as_bytes()).expect("key"),
                    16 * (i + 1),
                    1000,
                )),
            );
        }
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotEnd);
        let out = effects(&mut core);
        assert!(out.contains(&ClusterEffect::DropIn { link: 7 }), "{out:?}");
        assert!(
            !out.iter()
                .any(|e| matches!(e, ClusterEffect::ToTable(ClusterToTable::Snapshot { .. }))),
            "{out:?}"
        );
        assert!(!core.roles().beat().synced);
    }

    #[test]
    fn a_semaphore_grant_with_a_limit_or_slot_out_of_range_is_refused_even_from_a_proved_peer() {
        let params = ClusterParams {
            max_lease_ms: 60_000,
            ..ClusterParams::with_detect(DETECT)
        };
        let core = linked_with(0, params);
        let now = at(2);
        let grant = |token: u64, ms_left: u64, limit: u32, slot: u32| {
            PeerMsg::Delta(Delta::Grant {
                key: Key::new(b"k").expect("key"),
                token,
                ms_left,
                limit,
                slot,
                value: Some(crate::protocol::Value::new(b"v").expect("value")),
            })
        };
        let check = |msg: &PeerMsg| core.check_peer_msg(now, 7, msg);
        assert_eq!(check(&grant(16, 1000, 3, 2)), Verdict::Accept);
        assert_eq!(
            check(&grant(16, 1000, MAX_LIMIT, MAX_LIMIT - 1)),
            Verdict::Accept
        );
        for limit in [0, MAX_LIMIT + 1, u32::MAX] {
            assert_eq!(
                check(&grant(16, 1000, limit, 0)),
                Verdict::Refuse("a limit outside 1..=10000"),
                "limit {limit}"
            );
        }
        for (limit, slot) in [(1, 1), (3, 3), (3, u32::MAX)] {
            assert_eq!(
                check(&grant(16, 1000, limit, slot)),
                Verdict::Refuse("a slot at or above its key's limit"),
                "limit {limit}, slot {slot}"
            );
        }
        assert_eq!(check(&grant(0, 1000, 3, 1)), Verdict::Refuse("token 0"));
        assert_eq!(
            check(&grant(16, 60_001, 3, 1)),
            Verdict::Refuse("a lease above --max-lease")
        );
        let free = |slot: u32| {
            PeerMsg::Delta(Delta::Free {
                key: Key::new(b"k").expect("key"),
                token: 16,
                slot,
            })
        };
        assert_eq!(check(&free(MAX_LIMIT - 1)), Verdict::Accept);
        assert_eq!(
            check(&free(MAX_LIMIT)),
            Verdict::Refuse("a slot at or above its key's limit")
        );
    }

    #[test]
    fn a_snapshot_counts_every_holder_of_a_semaphore_against_max_keys() {
        let params = ClusterParams {
            max_keys: 3,
            ..ClusterParams::with_detect(DETECT)
        };
        let mut core = linked_with(1, params);
        core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
        core.handle_tick(at(2));
        assert_eq!(core.roles().following(), Some(0));
        effects(&mut core);
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotBegin);
        // One key, four holders: four entries.
        for slot in 0..4u32 {
            core.handle_peer_msg(
                at(3),
                7,
                PeerMsg::Delta(Delta::Grant {
                    key: Key::new(b"pool").expect("key"),
                    token: 16 * (u64::from(slot) + 1),
                    ms_left: 1000,
                    limit: 4,
                    slot,
                    value: None,
                }),
            );
        }
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotEnd);
        let out = effects(&mut core);
        assert!(out.contains(&ClusterEffect::DropIn { link: 7 }), "{out:?}");
        assert!(
            !out.iter()
                .any(|e| matches!(e, ClusterEffect::ToTable(ClusterToTable::Snapshot { .. }))),
            "{out:?}"
        );
        assert!(!core.roles().beat().synced);
    }

    /// The cap of the backoff after links dropped over refused state:
    /// `--detect`/2, jitter included.
    fn redial_cap() -> u64 {
        DETECT / 2
    }

    /// Waits of a backoff that doubles from RECONNECT_MS to the cap (each
    /// within its ±25% jitter, never above the cap), after a first redial
    /// at once.
    fn assert_backs_off(waits: &[u64]) {
        let cap = redial_cap();
        assert_eq!(waits[0], 0, "the first redial is at once: {waits:?}");
        assert!(
            (RECONNECT_MS * 3 / 4..=RECONNECT_MS * 5 / 4).contains(&waits[1]),
            "then as after a failed dial: {waits:?}"
        );
        assert!(waits[2] > waits[1], "doubling: {waits:?}");
        assert!(waits.iter().all(|&w| w <= cap), "{waits:?}");
        assert!(
            waits[waits.len() - 1] >= cap * 3 / 4,
            "reaches the cap: {waits:?}"
        );
    }

    /// Active `core` (node 0 of 2) hears node 1 follow it (not synced) on
    /// incoming link `link`, and sends it a snapshot on its link at `t`.
    fn snapshot_to_follower(core: &mut ClusterCore, link: LinkId, t: u64) {
        core.handle_peer_msg(at(t), link, beat(RoleName::Standby, Some(0), false));
        core.handle_tick(at(t));
        let wanted = ClusterEffect::ToTable(ClusterToTable::SnapshotWanted { peer: 1 });
        assert!(effects(core).contains(&wanted));
        core.handle_table(
            at(t),
            TableToCluster::Snapshot {
                peer: 1,
                entries: vec![],
                ceiling: 99,
            },
        );
        effects(core);
    }

    /// Node 0, active, with its follower node 1 linked both ways; the
    /// incoming link is `link`.
    fn active_with_follower(detect_ms: u64, link: LinkId) -> (ClusterCore, u64) {
        let mut core = ClusterCore::new(0, names(2), ClusterParams::with_detect(detect_ms), at(0));
        core.handle_tick(at(detect_ms + 1));
        let t = dial_up(&mut core, 1, detect_ms + 1);
        assert!(core.roles().role_name().is_active());
        core.handle_in_opened(at(t), link);
        core.handle_in_authenticated(at(t), link, 1);
        effects(&mut core);
        (core, t)
    }

    /// One round of a follower refusing the snapshot of active `core`:
    /// both links come up (incoming `link`), the snapshot goes out, and the
    /// follower drops both links 1 ms later, its incoming one seen first
    /// or last. Returns when the round ends.
    /// `rounds` rounds of the follower (node 1) dropping every link of
    /// this active right after its snapshot, the first over incoming link
    /// `link`, the incoming one seen first every other round: the wait
    /// before each redial, and the time and incoming link after the last.
    fn refused_rounds(
        core: &mut ClusterCore,
        mut now: u64,
        mut link: LinkId,
        rounds: usize,
    ) -> (Vec<u64>, u64, LinkId) {
        let mut waits = Vec::new();
        for round in 0..rounds {
            let down = refused_round(core, link, now, round % 2 == 0);
            now = dial_up(core, 1, down);
            waits.push(now - down);
            link = new_in_link(core, now, link, 1);
        }
        (waits, now, link)
    }

    /// Peer `from` opens a new incoming link (the one after `link`) at `t`
    /// and proves the key; effects taken. The new link.
    fn new_in_link(core: &mut ClusterCore, t: u64, link: LinkId, from: usize) -> LinkId {
        let link = link + 1;
        core.handle_in_opened(at(t), link);
        core.handle_in_authenticated(at(t), link, from);
        effects(core);
        link
    }

    fn refused_round(core: &mut ClusterCore, link: LinkId, t: u64, in_first: bool) -> u64 {
        snapshot_to_follower(core, link, t);
        if in_first {
            // This node drops its outgoing link with it (no report).
            core.handle_in_closed(at(t + 1), link, "eof");
        } else {
            core.handle_link_down(at(t + 1), 1, OutDown::Failed, "eof");
            core.handle_in_closed(at(t + 1), link, "eof");
        }
        t + 1
    }

    #[test]
    fn links_a_follower_keeps_dropping_after_this_nodes_snapshot_are_redialed_ever_later() {
        // Node 1 drops every link of this active node right after its
        // snapshot (it refuses it: another --max-keys, say), the incoming
        // one seen first or last: the backoff grows by one step per round,
        // not two.
        let (mut core, now) = active_with_follower(DETECT, 7);
        let (waits, now, link) = refused_rounds(&mut core, now, 7, 8);
        assert_backs_off(&waits);
        // A link that stays up for --detect is healthy: the next refused
        // drop is redialed at once.
        let down = refused_round(&mut core, link, now + DETECT, true);
        assert_eq!(
            dial_up(&mut core, 1, down),
            down,
            "at once after a healthy link"
        );
    }

    #[test]
    fn young_links_that_drop_over_nothing_refused_are_always_redialed_at_once() {
        // A blip, a crash, a peer dropping a silent link: however young the
        // link and however often, no backoff (a backoff here would keep
        // this node's heartbeats from a peer that is counting the silence).
        // Standby side: the active drops the links a few ms after they
        // come up.
        let mut core = linked(1);
        let mut now = 1;
        let mut link = 7;
        for round in 0..8 {
            let t = now + 5;
            if round % 2 == 0 {
                core.handle_in_closed(at(t), link, "eof");
            } else {
                core.handle_link_down(at(t), 0, OutDown::Failed, "eof");
                core.handle_in_closed(at(t), link, "eof");
            }
            now = dial_up(&mut core, 0, t);
            assert_eq!(now, t, "round {round}: at once");
            link = new_in_link(&mut core, now, link, 0);
        }
        // Active side: links that carried no snapshot yet, or whose
        // follower said it holds the state, drop young: at once too.
        let (mut core, mut now) = active_with_follower(DETECT, 7);
        let mut link = 7;
        for round in 0..8 {
            if round % 2 == 1 {
                snapshot_to_follower(&mut core, link, now);
                core.handle_peer_msg(at(now), link, beat(RoleName::Standby, Some(0), true));
            }
            core.handle_link_down(at(now + 2), 1, OutDown::Failed, "reset");
            core.handle_in_closed(at(now + 2), link, "eof");
            let t = dial_up(&mut core, 1, now + 2);
            assert_eq!(t, now + 2, "round {round}: at once");
            now = t;
            link = new_in_link(&mut core, now, link, 1);
        }
    }

    #[test]
    fn the_backoff_over_refused_state_never_waits_more_than_half_of_detect() {
        // With a small --detect a wait of RECONNECT_MS or more would outlast
        // the silence limit: every wait stays within --detect/2, jitter
        // included, so each new link's first heartbeat keeps both nodes
        // live (see ClusterCore::flap_backoff_ms).
        for detect in [20, 100, 1000] {
            let (mut core, now) = active_with_follower(detect, 7);
            let (waits, _, _) = refused_rounds(&mut core, now, 7, 12);
            assert_eq!(waits[0], 0, "detect {detect}: {waits:?}");
            assert!(waits[1] > 0, "detect {detect}: backs off: {waits:?}");
            assert!(
                waits.iter().all(|&w| w <= detect / 2),
                "detect {detect}: {waits:?}"
            );
            assert!(
                waits[11] >= (detect / 2).min(RECONNECT_MAX_MS) * 3 / 4,
                "detect {detect}: reaches the cap: {waits:?}"
            );
            // The standby's side: it refuses what the active sends.
            let params = ClusterParams {
                max_lease_ms: 60_000,
                ..ClusterParams::with_detect(detect)
            };
            let mut core = linked_with(1, params);
            let bad = PeerMsg::Delta(Delta::grant(key("k"), 16, 60_001));
            let mut now = 2;
            let mut link = 7;
            let mut waits = Vec::new();
            for _ in 0..12 {
                core.handle_peer_msg(at(now), link, bad.clone());
                let t = dial_up(&mut core, 0, now);
                waits.push(t - now);
                link = new_in_link(&mut core, t, link, 0);
                now = t + 1;
            }
            assert!(waits[1] > 0, "detect {detect}: backs off: {waits:?}");
            assert!(
                waits.iter().all(|&w| w <= detect / 2),
                "detect {detect}: {waits:?}"
            );
        }
    }

    #[test]
    fn a_refusal_counts_even_on_an_old_link() {
        // A link up for long that carries something refused (a lease above
        // --max-lease) is redialed at once; the next refusals back off.
        let params = ClusterParams {
            max_lease_ms: 60_000,
            ..ClusterParams::with_detect(DETECT)
        };
        let mut core = linked_with(1, params);
        let bad = PeerMsg::Delta(Delta::grant(key("k"), 16, 60_001));
        let mut now = 3 * DETECT;
        let mut link = 7;
        let mut waits = Vec::new();
        for _ in 0..6 {
            core.handle_peer_msg(at(now), link, bad.clone());
            let out = effects(&mut core);
            assert!(out.contains(&ClusterEffect::DropIn { link }), "{out:?}");
            assert!(out.contains(&ClusterEffect::DropOut { peer: 0 }), "{out:?}");
            let t = dial_up(&mut core, 0, now);
            waits.push(t - now);
            link = new_in_link(&mut core, t, link, 0);
            now = t + 3;
        }
        assert_backs_off(&waits);
    }

    #[test]
    fn a_young_link_that_goes_silent_is_still_redialed_at_once() {
        // A blip, not a refusal: dial again at once, however young the link
        // and however often (such dials then time out every period).
        let mut core = linked(0);
        let silence = core.silence_ms();
        assert!(silence < DETECT);
        let mut link = 7;
        let mut t = 1;
        for _ in 0..4 {
            core.handle_tick(at(t + silence));
            let out = effects(&mut core);
            assert!(out.contains(&ClusterEffect::DropIn { link }), "{out:?}");
            assert!(out.contains(&ClusterEffect::DropOut { peer: 1 }), "{out:?}");
            assert!(
                out.contains(&ClusterEffect::Dial { peer: 1 }),
                "at once: {out:?}"
            );
            t += silence;
            core.handle_link_up(at(t), 1);
            link = new_in_link(&mut core, t, link, 1);
        }
    }

    #[test]
    fn a_standby_whose_lock_owner_refuses_the_actives_state_drops_the_link_and_holds_none() {
        let mut core = linked(1);
        core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
        core.handle_tick(at(2));
        assert_eq!(core.roles().following(), Some(0));
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotBegin);
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotEnd);
        assert!(core.roles().beat().synced);
        effects(&mut core);
        // Its lock owner refused a grant past --max-keys.
        core.handle_table(
            at(4),
            TableToCluster::StateRefused {
                why: "a grant past --max-keys",
                snapshot: 1,
            },
        );
        let out = effects(&mut core);
        assert!(out.contains(&ClusterEffect::DropIn { link: 7 }), "{out:?}");
        assert!(out.contains(&ClusterEffect::DropOut { peer: 0 }), "{out:?}");
        let beat_now = core.roles().beat();
        assert!(!beat_now.synced, "not counted in the active's standbys=");
        assert!(!beat_now.has_state, "not preferred in an election");
        // Redialed, it is handed no role before a snapshot it can take.
        let t = dial_up(&mut core, 0, 4);
        core.handle_in_opened(at(t), 8);
        core.handle_in_authenticated(at(t), 8, 0);
        core.handle_peer_msg(at(t), 8, beat(RoleName::Active, None, false));
        core.handle_peer_msg(at(t), 8, PeerMsg::Handoff);
        assert_eq!(core.roles().role_name(), RoleName::Standby);
        let out = effects(&mut core);
        assert!(
            !out.iter().any(|e| matches!(
                e,
                ClusterEffect::ToTable(ClusterToTable::BecomeActive { .. })
            )),
            "{out:?}"
        );
        core.handle_peer_msg(at(t + 1), 8, PeerMsg::SnapshotBegin);
        core.handle_peer_msg(at(t + 1), 8, PeerMsg::SnapshotEnd);
        assert!(core.roles().beat().synced && core.roles().beat().has_state);
        // Told after it took the active role: the link to its old active
        // is no business of it any more.
        core.handle_peer_msg(at(t + 2), 8, PeerMsg::Handoff);
        assert_eq!(core.roles().role_name(), RoleName::Active);
        effects(&mut core);
        core.handle_table(
            at(t + 3),
            TableToCluster::StateRefused {
                why: "a grant past --max-keys",
                snapshot: 2,
            },
        );
        assert!(
            !effects(&mut core)
                .iter()
                .any(|e| matches!(e, ClusterEffect::DropIn { .. })),
        );
    }

    #[test]
    fn a_state_refusal_is_matched_to_the_snapshot_it_came_after() {
        let refused = |snapshot| TableToCluster::StateRefused {
            why: "a grant past --max-keys",
            snapshot,
        };
        let mut core = linked(1);
        core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
        core.handle_tick(at(2));
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotBegin);
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotEnd);
        // Link 7 drops (a blip); link 8 from node 0 carries snapshot 2,
        // which the lock owner takes.
        core.handle_in_closed(at(4), 7, "eof");
        let t = dial_up(&mut core, 0, 4);
        core.handle_in_opened(at(t), 8);
        core.handle_in_authenticated(at(t), 8, 0);
        core.handle_peer_msg(at(t), 8, beat(RoleName::Active, None, false));
        core.handle_peer_msg(at(t), 8, PeerMsg::SnapshotBegin);
        core.handle_peer_msg(at(t), 8, PeerMsg::SnapshotEnd);
        assert!(core.roles().beat().synced);
        effects(&mut core);
        // A refusal of snapshot 1 comes through late: stale, the table was
        // replaced since. The good link stays, and so does the state.
        core.handle_table(at(t + 1), refused(1));
        let out = effects(&mut core);
        assert!(
            !out.iter()
                .any(|e| matches!(e, ClusterEffect::DropIn { .. })),
            "{out:?}"
        );
        assert!(core.roles().beat().synced && core.roles().beat().has_state);
        // Node 0 replaces link 8 with link 9 (no snapshot on it yet), then
        // the refusal of snapshot 2 comes: no state held, and link 9 stays
        // (its own snapshot will be judged on its own).
        core.handle_in_opened(at(t + 2), 9);
        core.handle_in_authenticated(at(t + 2), 9, 0);
        effects(&mut core);
        core.handle_table(at(t + 3), refused(2));
        let out = effects(&mut core);
        assert!(!out.contains(&ClusterEffect::DropIn { link: 9 }), "{out:?}");
        assert!(!core.roles().beat().has_state);
        // A refusal of the snapshot a link still carries drops that link.
        core.handle_peer_msg(at(t + 4), 9, PeerMsg::SnapshotBegin);
        core.handle_peer_msg(at(t + 4), 9, PeerMsg::SnapshotEnd);
        effects(&mut core);
        core.handle_table(at(t + 5), refused(3));
        let out = effects(&mut core);
        assert!(out.contains(&ClusterEffect::DropIn { link: 9 }), "{out:?}");
    }

    #[test]
    fn a_state_refusal_after_the_active_is_found_dead_still_means_no_state_held() {
        // Node 2 of 3 follows node 0 and took its snapshot; node 1 (ranked
        // above it) is a standby too. Node 0 is found dead, then node 2's
        // lock owner's refusal comes through: node 2 follows no one, yet
        // must not say it holds the state (node 1 does, and must win).
        let mut core = new_core(2, 3);
        core.handle_tick(at(0));
        core.handle_link_up(at(1), 0);
        core.handle_link_up(at(1), 1);
        core.handle_in_opened(at(1), 7);
        core.handle_in_authenticated(at(1), 7, 0);
        core.handle_in_opened(at(1), 8);
        core.handle_in_authenticated(at(1), 8, 1);
        core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
        core.handle_peer_msg(at(2), 8, beat(RoleName::Standby, Some(0), true));
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotBegin);
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotEnd);
        assert!(core.roles().beat().has_state);
        core.handle_in_closed(at(4), 7, "eof");
        core.handle_link_down(at(4), 0, OutDown::Refused, "refused");
        assert_eq!(core.roles().following(), None);
        assert!(!core.roles().role_name().is_active());
        effects(&mut core);
        core.handle_table(
            at(5),
            TableToCluster::StateRefused {
                why: "a grant past --max-keys",
                snapshot: 1,
            },
        );
        assert!(
            !core.roles().beat().has_state,
            "not preferred in the election"
        );
        let out = effects(&mut core);
        assert!(
            !out.contains(&ClusterEffect::DropIn { link: 8 }),
            "node 1's link stays: {out:?}"
        );
    }

    #[test]
    fn a_silent_link_is_dropped_and_the_peer_dialed_afresh_before_it_is_found_dead() {
        let mut core = linked(0);
        let silence = core.silence_ms();
        assert!(silence < DETECT, "well before the peer is found dead");
        core.handle_peer_msg(at(10), 7, beat(RoleName::Standby, None, false));
        core.handle_tick(at(10 + silence - 1));
        assert!(!effects(&mut core).contains(&ClusterEffect::DropIn { link: 7 }));
        assert!(core.next_wake_ms(at(11)) <= 10 + silence);
        core.handle_tick(at(10 + silence));
        let out = effects(&mut core);
        assert!(out.contains(&ClusterEffect::DropIn { link: 7 }), "{out:?}");
        assert!(out.contains(&ClusterEffect::DropOut { peer: 1 }), "{out:?}");
        assert!(
            out.contains(&ClusterEffect::Dial { peer: 1 }),
            "at once: {out:?}"
        );
        assert!(
            core.roles().is_live(1, 10 + silence),
            "not found dead by this"
        );
        // Found dead only after --detect from the beat due after the last
        // one heard, plus a period for the fresh dial: 1.25 x --detect.
        assert_eq!(silence_limit_ms(1000), 1250);
        assert!(core.roles().is_live(1, 10 + DETECT));
        assert!(!core.roles().is_live(1, 10 + silence_limit_ms(DETECT)));
    }

    #[test]
    fn a_newer_link_from_the_same_peer_replaces_the_old_one() {
        let mut core = linked(0);
        core.handle_in_opened(at(2), 8);
        core.handle_in_authenticated(at(2), 8, 1);
        assert_eq!(effects(&mut core), vec![ClusterEffect::DropIn { link: 7 }]);
    }

    #[test]
    fn standbys_count_only_while_both_links_are_up_and_carried_the_snapshot() {
        let mut core = linked(0);
        core.handle_tick(at(2));
        core.handle_peer_msg(at(3), 7, beat(RoleName::Standby, None, false));
        core.handle_tick(at(3));
        assert!(core.roles().role_name().is_active() || core.roles().active().is_none());
        // It says it holds this node's state, but this link has not carried
        // the snapshot yet (the claim is from an earlier link, say).
        core.handle_peer_msg(at(4), 7, beat(RoleName::Standby, Some(0), true));
        assert_eq!(core.synced_standbys(at(4)), 0);
        effects(&mut core);
        core.handle_tick(at(4));
        let out = effects(&mut core);
        assert!(
            out.contains(&ClusterEffect::ToTable(ClusterToTable::SnapshotWanted {
                peer: 1
            })),
            "{out:?}"
        );
        core.handle_table(
            at(4),
            TableToCluster::Snapshot {
                peer: 1,
                entries: Vec::new(),
                ceiling: 16,
            },
        );
        assert_eq!(core.synced_standbys(at(5)), 1);
        core.handle_in_closed(at(6), 7, "reset");
        assert_eq!(core.synced_standbys(at(6)), 0, "a dropped link resets it");
    }

    #[test]
    fn a_standby_whose_link_from_the_active_drops_is_no_longer_synced() {
        let mut core = linked(1);
        core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
        core.handle_tick(at(2));
        assert_eq!(core.roles().following(), Some(0));
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotBegin);
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotEnd);
        assert!(core.roles().beat().synced);
        assert_eq!(core.heard_active_ms(), 3);
        // A flood of deltas does not move lag; a beat after them does.
        core.handle_peer_msg(at(50), 7, PeerMsg::Delta(Delta::Ceiling(16)));
        assert_eq!(core.heard_active_ms(), 3);
        core.handle_peer_msg(at(60), 7, beat(RoleName::Active, None, false));
        assert_eq!(core.heard_active_ms(), 60);
        core.handle_in_closed(at(70), 7, "reset");
        assert!(!core.roles().beat().synced, "deltas may be lost");
        assert!(core.roles().beat().has_state, "it keeps what it has");
    }

    #[test]
    fn a_standby_whose_link_from_the_active_is_replaced_holds_its_state_no_more() {
        let mut core = linked(1);
        core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
        core.handle_tick(at(2));
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotBegin);
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotEnd);
        assert!(core.roles().beat().synced);
        // A new link from the active replaces the old one: the old one's
        // unread tail (and what the active cleared from its writer) is lost.
        core.handle_in_opened(at(4), 8);
        core.handle_in_authenticated(at(4), 8, 0);
        let out = effects(&mut core);
        assert!(out.contains(&ClusterEffect::DropIn { link: 7 }));
        assert!(!core.roles().beat().synced, "deltas may have been lost");
        assert!(core.roles().beat().has_state, "it keeps what it has");
        // So it refuses a handoff until a snapshot came on the new link.
        core.handle_peer_msg(at(5), 8, PeerMsg::Handoff);
        assert_eq!(core.roles().role_name(), RoleName::Standby);
        core.handle_peer_msg(at(6), 8, PeerMsg::SnapshotBegin);
        core.handle_peer_msg(at(6), 8, PeerMsg::SnapshotEnd);
        assert!(core.roles().beat().synced);
    }

    #[test]
    fn a_snapshot_holds_at_most_max_keys_grants_and_its_ceiling() {
        let params = ClusterParams {
            max_keys: 3,
            ..ClusterParams::with_detect(DETECT)
        };
        // Endless ceilings, or any free, inside a snapshot: refused.
        for flood in [Delta::Ceiling(16), Delta::free(key("k"), 16)] {
            let mut core = linked_with(1, params);
            core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
            core.handle_tick(at(2));
            effects(&mut core);
            core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotBegin);
            for _ in 0..10 {
                core.handle_peer_msg(at(3), 7, PeerMsg::Delta(flood.clone()));
            }
            let out = effects(&mut core);
            assert!(
                out.contains(&ClusterEffect::DropIn { link: 7 }),
                "{flood:?}"
            );
            assert!(!core.ins.contains_key(&7));
        }
        // The most a snapshot may be: max_keys grants and a ceiling.
        let mut core = linked_with(1, params);
        core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
        core.handle_tick(at(2));
        effects(&mut core);
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotBegin);
        for k in ["a", "b", "c"] {
            let grant = Delta::grant(key(k), 16, 1000);
            core.handle_peer_msg(at(3), 7, PeerMsg::Delta(grant));
        }
        core.handle_peer_msg(at(3), 7, PeerMsg::Delta(Delta::Ceiling(32)));
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotEnd);
        let out = effects(&mut core);
        assert!(!out.contains(&ClusterEffect::DropIn { link: 7 }), "{out:?}");
        assert!(core.roles().beat().synced);
    }

    #[test]
    fn an_active_heartbeat_lifts_the_token_floor_by_its_ceiling() {
        let mut core = linked(1);
        core.handle_peer_msg(at(2), 7, active_beat(10, 500));
        let out = effects(&mut core);
        assert_eq!(out[0], ClusterEffect::ToTable(ClusterToTable::Observe(500)));
        assert!(
            out.contains(&ClusterEffect::ToTable(ClusterToTable::Follow {
                active: Some("n0:1".into())
            }))
        );
    }

    #[test]
    fn an_active_never_takes_a_standbys_ceiling() {
        let mut core = new_core(0, 2);
        core.handle_tick(at(0));
        core.handle_tick(at(DETECT + 1));
        assert!(core.roles().role_name().is_active());
        core.handle_in_opened(at(0), 7);
        core.handle_in_authenticated(at(DETECT + 2), 7, 1);
        effects(&mut core);
        core.handle_peer_msg(
            at(DETECT + 3),
            7,
            PeerMsg::Beat {
                beat: Beat {
                    role: RoleName::Standby,
                    following: Some(0),
                    synced: true,
                    has_state: true,
                },
                last_token: 10,
                ceiling: 500,
            },
        );
        assert_eq!(
            effects(&mut core)[0],
            ClusterEffect::ToTable(ClusterToTable::Observe(10))
        );
    }

    #[test]
    fn an_active_asks_for_a_snapshot_for_a_new_follower_and_resends_a_stale_one() {
        let mut core = linked_at(0, DETECT + 1);
        assert!(core.roles().role_name().is_active());
        core.handle_peer_msg(at(DETECT + 3), 7, beat(RoleName::Standby, Some(0), false));
        effects(&mut core);
        core.handle_tick(at(DETECT + 4));
        let wanted = ClusterEffect::ToTable(ClusterToTable::SnapshotWanted { peer: 1 });
        assert!(effects(&mut core).contains(&wanted));
        core.handle_tick(at(DETECT + 5));
        assert!(!effects(&mut core).contains(&wanted), "asked once");
        core.handle_table(
            at(DETECT + 6),
            TableToCluster::Snapshot {
                peer: 1,
                entries: vec![],
                ceiling: 99,
            },
        );
        let sent = effects(&mut core);
        assert_eq!(
            sent.first(),
            Some(&ClusterEffect::Send {
                peer: 1,
                msg: PeerMsg::SnapshotBegin
            })
        );
        core.handle_table(
            at(DETECT + 7),
            TableToCluster::Deltas(vec![Delta::Ceiling(5)]),
        );
        assert!(effects(&mut core).contains(&ClusterEffect::Send {
            peer: 1,
            msg: PeerMsg::Delta(Delta::Ceiling(5))
        }));
        // Still not synced a detection period later: sent again.
        let later = 2 * DETECT + 10;
        core.handle_peer_msg(at(later), 7, beat(RoleName::Standby, Some(0), false));
        core.handle_tick(at(later));
        assert!(effects(&mut core).contains(&wanted));
    }

    #[test]
    fn deltas_the_owner_dropped_cost_each_standby_a_fresh_snapshot_and_nothing_is_sent_before() {
        let mut core = linked_at(0, DETECT + 1);
        core.handle_peer_msg(at(DETECT + 3), 7, beat(RoleName::Standby, Some(0), true));
        core.handle_tick(at(DETECT + 4));
        let wanted = ClusterEffect::ToTable(ClusterToTable::SnapshotWanted { peer: 1 });
        assert!(effects(&mut core).contains(&wanted));
        let snapshot = TableToCluster::Snapshot {
            peer: 1,
            entries: vec![],
            ceiling: 99,
        };
        core.handle_table(at(DETECT + 5), snapshot.clone());
        effects(&mut core);
        core.handle_tick(at(DETECT + 6));
        assert!(
            !effects(&mut core).contains(&wanted),
            "synced: no new snapshot"
        );
        core.handle_table(at(DETECT + 7), TableToCluster::DeltasLost);
        // The link is dropped, as one too far behind would be: the standby
        // sees it close and stops saying it is synced.
        assert!(effects(&mut core).contains(&ClusterEffect::DropOut { peer: 1 }));
        // Neither later deltas nor a role transfer go to it now: it lacks
        // the dropped ones.
        core.handle_table(
            at(DETECT + 8),
            TableToCluster::Deltas(vec![Delta::Ceiling(5)]),
        );
        core.handle_table(at(DETECT + 8), TableToCluster::TransferReady { to: 1 });
        let sent = effects(&mut core);
        assert!(
            !sent
                .iter()
                .any(|e| matches!(e, ClusterEffect::Send { peer: 1, .. })),
            "{sent:?}"
        );
        // Redialed at once; the new link carries a fresh snapshot.
        let t = dial_up(&mut core, 1, DETECT + 8);
        core.handle_peer_msg(at(t), 7, beat(RoleName::Standby, Some(0), false));
        core.handle_tick(at(t));
        assert!(effects(&mut core).contains(&wanted));
        core.handle_table(at(t + 1), snapshot);
        assert_eq!(
            effects(&mut core).first(),
            Some(&ClusterEffect::Send {
                peer: 1,
                msg: PeerMsg::SnapshotBegin
            })
        );
    }

    #[test]
    fn a_standby_assembles_a_snapshot_and_says_it_is_synced() {
        let mut core = linked(1);
        core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
        effects(&mut core);
        let grant = Delta::grant(Key::new(b"k").expect("key"), 33, 100);
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotBegin);
        core.handle_peer_msg(at(3), 7, PeerMsg::Delta(grant.clone()));
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotEnd);
        let out = effects(&mut core);
        assert_eq!(
            out[0],
            ClusterEffect::ToTable(ClusterToTable::Snapshot {
                seq: 1,
                entries: vec![grant]
            })
        );
        assert!(core.roles().beat().synced);
        assert!(out.iter().any(|e| matches!(
            e,
            ClusterEffect::Send {
                msg: PeerMsg::Beat { beat, .. },
                ..
            } if beat.synced
        )));
        assert_eq!(core.heard_active_ms(), 3);
    }

    /// The deltas the core passed to the lock owner in these effects.
    fn to_table_deltas(out: &[ClusterEffect]) -> Vec<Delta> {
        out.iter()
            .filter_map(|e| match e {
                ClusterEffect::ToTable(ClusterToTable::Deltas(d)) => Some(d.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    #[test]
    fn a_standby_passes_deltas_to_its_owner_in_batches_and_at_once_on_a_heartbeat() {
        let mut core = linked(1);
        core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
        core.handle_peer_msg(at(2), 7, PeerMsg::SnapshotBegin);
        core.handle_peer_msg(at(2), 7, PeerMsg::SnapshotEnd);
        effects(&mut core);
        let ceiling = |c: u64| PeerMsg::Delta(Delta::Ceiling(c));
        core.handle_peer_msg(at(10), 7, ceiling(1));
        core.handle_peer_msg(at(11), 7, ceiling(2));
        // Ticks before the batch is due pass nothing, and the core asks to
        // be woken when it is.
        core.handle_tick(at(10 + APPLY_BATCH_MS - 1));
        assert!(to_table_deltas(&effects(&mut core)).is_empty());
        assert!(core.next_wake_ms(at(12)) <= 10 + APPLY_BATCH_MS);
        core.handle_tick(at(10 + APPLY_BATCH_MS));
        assert_eq!(
            to_table_deltas(&effects(&mut core)),
            vec![Delta::Ceiling(1), Delta::Ceiling(2)]
        );
        // The active's heartbeat makes the state current at once.
        core.handle_peer_msg(at(40), 7, ceiling(3));
        core.handle_peer_msg(at(41), 7, beat(RoleName::Active, None, true));
        assert_eq!(
            to_table_deltas(&effects(&mut core)),
            vec![Delta::Ceiling(3)]
        );
        // So does a full batch.
        for c in 0..APPLY_BATCH_MAX as u64 {
            core.handle_peer_msg(at(42), 7, ceiling(10 + c));
        }
        assert_eq!(to_table_deltas(&effects(&mut core)).len(), APPLY_BATCH_MAX);
        // And a role change: the deltas of the old role are applied first.
        core.handle_peer_msg(at(43), 7, ceiling(99_999));
        core.handle_peer_msg(at(44), 7, PeerMsg::Handoff);
        let out = effects(&mut core);
        let first_deltas = out
            .iter()
            .position(|e| matches!(e, ClusterEffect::ToTable(ClusterToTable::Deltas(_))));
        let became_active = out.iter().position(|e| {
            matches!(
                e,
                ClusterEffect::ToTable(ClusterToTable::BecomeActive { .. })
            )
        });
        assert!(
            first_deltas.is_some() && first_deltas < became_active,
            "{out:?}"
        );
    }

    #[test]
    fn deltas_from_a_node_this_one_does_not_follow_are_ignored() {
        let mut core = linked(1);
        core.handle_peer_msg(at(2), 7, PeerMsg::Delta(Delta::Ceiling(5)));
        core.handle_tick(at(3));
        assert!(
            !effects(&mut core)
                .iter()
                .any(|e| matches!(e, ClusterEffect::ToTable(ClusterToTable::Deltas(_))))
        );
    }

    #[test]
    fn a_dropped_incoming_link_probes_the_peer_at_once_and_refused_means_dead() {
        let mut core = linked(1);
        core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, true));
        effects(&mut core);
        core.handle_in_closed(at(3), 7, "closed");
        assert_eq!(effects(&mut core), vec![ClusterEffect::DropOut { peer: 0 }]);
        core.handle_tick(at(3));
        assert!(effects(&mut core).contains(&ClusterEffect::Dial { peer: 0 }));
        core.handle_link_down(at(4), 0, OutDown::Refused, "refused");
        let out = effects(&mut core);
        assert!(out.iter().any(|e| matches!(
            e,
            ClusterEffect::ToTable(ClusterToTable::BecomeActive { failover: true, .. })
        )));
    }

    #[test]
    fn a_graceful_shutdown_without_a_successor_retires_then_exits_after_redirecting() {
        let mut core = new_core(0, 2);
        core.handle_tick(at(DETECT + 1));
        effects(&mut core);
        assert!(core.roles().role_name().is_active());
        core.handle_shutdown(at(DETECT + 2));
        assert!(effects(&mut core).contains(&ClusterEffect::ToTable(ClusterToTable::Retire)));
        assert!(!core.exited());
        core.handle_table(at(DETECT + 3), TableToCluster::Redirected);
        assert_eq!(effects(&mut core), vec![ClusterEffect::Exit]);
        assert!(core.exited());
    }

    #[test]
    fn a_transfer_of_the_active_role_sends_handoff_after_the_last_delta() {
        // Node 1 alone became active; node 0 (higher) follows it, synced.
        let mut core = linked_at(1, DETECT + 2);
        assert!(core.roles().role_name().is_active());
        core.handle_peer_msg(at(DETECT + 3), 7, beat(RoleName::Standby, Some(1), false));
        core.handle_tick(at(DETECT + 3));
        let out = effects(&mut core);
        assert!(
            out.contains(&ClusterEffect::ToTable(ClusterToTable::SnapshotWanted {
                peer: 0
            }))
        );
        core.handle_table(
            at(DETECT + 3),
            TableToCluster::Snapshot {
                peer: 0,
                entries: Vec::new(),
                ceiling: 16,
            },
        );
        effects(&mut core);
        core.handle_peer_msg(at(DETECT + 3), 7, beat(RoleName::Standby, Some(1), true));
        let out = effects(&mut core);
        assert!(
            out.contains(&ClusterEffect::ToTable(ClusterToTable::StartTransfer {
                to: 0
            }))
        );
        core.handle_table(at(DETECT + 4), TableToCluster::TransferReady { to: 0 });
        assert_eq!(
            effects(&mut core),
            vec![ClusterEffect::Send {
                peer: 0,
                msg: PeerMsg::Handoff
            }]
        );
        core.handle_peer_msg(at(DETECT + 5), 7, PeerMsg::Took);
        assert!(effects(&mut core).contains(&ClusterEffect::ToTable(
            ClusterToTable::FinishTransfer { to: "n0:1".into() }
        )));
    }

    #[test]
    fn no_handoff_goes_over_a_link_that_has_not_carried_the_state() {
        // Node 0 says it is synced, but this node's link to it has carried
        // no snapshot (it came up again since): the handoff is not sent.
        let mut core = linked_at(1, DETECT + 2);
        core.handle_peer_msg(at(DETECT + 3), 7, beat(RoleName::Standby, Some(1), true));
        assert!(effects(&mut core).contains(&ClusterEffect::ToTable(
            ClusterToTable::StartTransfer { to: 0 }
        )));
        core.handle_table(at(DETECT + 4), TableToCluster::TransferReady { to: 0 });
        assert!(
            !effects(&mut core).contains(&ClusterEffect::Send {
                peer: 0,
                msg: PeerMsg::Handoff
            }),
            "a successor without the state must not be handed the role"
        );
    }

    #[test]
    fn promotion_floor_comes_from_the_wall_clock_passed_in() {
        let mut core = new_core(0, 2);
        core.handle_tick(Now::at(DETECT + 1, 5_000));
        let out = effects(&mut core);
        assert!(
            out.contains(&ClusterEffect::ToTable(ClusterToTable::BecomeActive {
                floor: tokens::start_floor(5_000),
                failover: true
            }))
        );
    }

    /// Ten minutes: far more than MAX_PEER_AHEAD_MS.
    const BEHIND_MS: u64 = 600_000;

    /// A heartbeat of a node whose clock is BEHIND_MS ahead of this node's
    /// (as `at` reads it), with the tokens such a node has: its clock floor
    /// and a ceiling just above.
    fn beat_from_ahead(ms: u64, role: RoleName, following: Option<usize>) -> PeerMsg {
        let theirs = at(ms).unix_ms + BEHIND_MS;
        PeerMsg::Beat {
            beat: Beat {
                role,
                following,
                synced: false,
                has_state: true,
            },
            last_token: tokens::start_floor(theirs),
            ceiling: tokens::start_floor(theirs + tokens::LEAD_MS),
        }
    }

    /// A token of a node whose clock is BEHIND_MS ahead of this one's.
    fn token_from_ahead(ms: u64) -> u64 {
        tokens::start_floor(at(ms).unix_ms + BEHIND_MS)
    }

    /// The values of every Observe in these effects.
    fn observed(out: &[ClusterEffect]) -> Vec<u64> {
        out.iter()
            .filter_map(|e| match e {
                ClusterEffect::ToTable(ClusterToTable::Observe(t)) => Some(*t),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_standby_whose_clock_is_ten_minutes_behind_still_hears_its_active_and_stays_standby() {
        let mut core = linked(1);
        core.handle_peer_msg(at(2), 7, beat_from_ahead(2, RoleName::Active, None));
        let out = effects(&mut core);
        assert!(!out.contains(&ClusterEffect::DropIn { link: 7 }), "{out:?}");
        assert!(
            observed(&out).is_empty(),
            "nothing beyond the window: {out:?}"
        );
        assert!(
            out.contains(&ClusterEffect::ToTable(ClusterToTable::Follow {
                active: Some("n0:1".into())
            })),
            "{out:?}"
        );
        // The active keeps beating: for many detection periods it is live,
        // and this node never elects itself.
        let period = DETECT / BEATS_PER_DETECT;
        let mut t = 2;
        while t < 10 * DETECT {
            t += period;
            core.handle_peer_msg(at(t), 7, beat_from_ahead(t, RoleName::Active, None));
            core.handle_tick(at(t));
            let out = effects(&mut core);
            assert!(
                !out.iter().any(|e| matches!(
                    e,
                    ClusterEffect::DropIn { .. }
                        | ClusterEffect::ToTable(ClusterToTable::BecomeActive { .. })
                )),
                "at {t}: {out:?}"
            );
            assert!(observed(&out).is_empty(), "at {t}: {out:?}");
            assert!(core.roles().is_live(0, t));
            assert_eq!(core.roles().role_name(), RoleName::Standby);
            assert_eq!(core.roles().following(), Some(0));
        }
        // Its snapshot: what is beyond the window is left out, what is
        // within is applied, and this node does not say it holds the state.
        let near = Delta::grant(key("near"), tokens::start_floor(at(t).unix_ms), 1000);
        core.handle_peer_msg(at(t), 7, PeerMsg::SnapshotBegin);
        core.handle_peer_msg(at(t), 7, PeerMsg::Delta(near.clone()));
        let far = Delta::grant(key("far"), token_from_ahead(t), 1000);
        core.handle_peer_msg(at(t), 7, PeerMsg::Delta(far));
        let far_ceiling = Delta::Ceiling(token_from_ahead(t) + 1);
        core.handle_peer_msg(at(t), 7, PeerMsg::Delta(far_ceiling.clone()));
        core.handle_peer_msg(at(t), 7, PeerMsg::SnapshotEnd);
        let out = effects(&mut core);
        assert!(!out.contains(&ClusterEffect::DropIn { link: 7 }), "{out:?}");
        assert!(
            out.contains(&ClusterEffect::ToTable(ClusterToTable::Snapshot {
                seq: 1,
                entries: vec![near]
            })),
            "{out:?}"
        );
        assert!(!core.roles().beat().synced, "it left part of the state out");
        // Nor do deltas beyond the window reach its table.
        core.handle_peer_msg(at(t + 1), 7, PeerMsg::Delta(far_ceiling));
        core.handle_peer_msg(at(t + 1), 7, beat_from_ahead(t + 1, RoleName::Active, None));
        core.handle_tick(at(t + 1 + APPLY_BATCH_MS));
        let out = effects(&mut core);
        assert!(to_table_deltas(&out).is_empty(), "{out:?}");
        assert!(!out.contains(&ClusterEffect::DropIn { link: 7 }), "{out:?}");
        // So it refuses a handoff: a node with a clock far behind never
        // takes the role from a live active.
        core.handle_peer_msg(at(t + 2), 7, PeerMsg::Handoff);
        assert_eq!(core.roles().role_name(), RoleName::Standby);
    }

    #[test]
    fn a_synced_standby_that_is_sent_a_token_beyond_its_window_no_longer_says_it_holds_the_state() {
        let mut core = linked(1);
        core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotBegin);
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotEnd);
        assert!(core.roles().beat().synced);
        effects(&mut core);
        let far = Delta::free(key("k"), token_from_ahead(4));
        core.handle_peer_msg(at(4), 7, PeerMsg::Delta(far));
        core.handle_tick(at(4 + APPLY_BATCH_MS));
        let out = effects(&mut core);
        assert!(to_table_deltas(&out).is_empty(), "{out:?}");
        assert!(!out.contains(&ClusterEffect::DropIn { link: 7 }), "{out:?}");
        assert!(!core.roles().beat().synced);
        assert_eq!(core.roles().following(), Some(0), "it still follows");
    }

    #[test]
    fn an_active_whose_clock_is_ten_minutes_behind_steps_back_to_a_higher_active() {
        // Node 1 was alone long enough to be active; node 0, whose clock is
        // ten minutes ahead, is active too (a partition healed, say).
        let mut core = linked_at(1, DETECT + 2);
        assert!(core.roles().role_name().is_active());
        let t = DETECT + 3;
        core.handle_peer_msg(at(t), 7, beat_from_ahead(t, RoleName::Active, None));
        let out = effects(&mut core);
        assert!(!out.contains(&ClusterEffect::DropIn { link: 7 }), "{out:?}");
        assert!(observed(&out).is_empty(), "{out:?}");
        assert!(
            out.contains(&ClusterEffect::ToTable(ClusterToTable::Follow {
                active: Some("n0:1".into())
            })),
            "{out:?}"
        );
        assert_eq!(core.roles().role_name(), RoleName::Standby);
        assert_eq!(core.roles().following(), Some(0));
    }

    #[test]
    fn of_a_heartbeat_only_the_values_within_the_window_are_observed() {
        let mut core = linked(1);
        let near = tokens::start_floor(at(2).unix_ms + 1000);
        core.handle_peer_msg(at(2), 7, active_beat(near, token_from_ahead(2)));
        let out = effects(&mut core);
        assert_eq!(observed(&out), vec![near], "{out:?}");
        // A promotion later starts above it (the lock owner keeps every
        // token above what it observed) and above the clock, never from
        // anything beyond the window.
        core.handle_link_down(at(3), 0, OutDown::Refused, "refused");
        let out = effects(&mut core);
        assert!(
            out.contains(&ClusterEffect::ToTable(ClusterToTable::BecomeActive {
                floor: tokens::start_floor(at(3).unix_ms),
                failover: true
            })),
            "{out:?}"
        );
        assert!(
            observed(&out)
                .iter()
                .all(|&t| t <= ClusterCore::token_bound(at(3)))
        );
    }

    #[test]
    fn a_follower_that_never_takes_its_snapshot_is_sent_one_ever_less_often() {
        let mut core = linked_at(0, DETECT + 1);
        assert!(core.roles().role_name().is_active());
        let wanted = ClusterEffect::ToTable(ClusterToTable::SnapshotWanted { peer: 1 });
        let mut asked = Vec::new();
        let period = DETECT / BEATS_PER_DETECT;
        let mut t = DETECT + 2;
        while t < DETECT + 2 + 4 * SNAPSHOT_RESEND_MAX_MS {
            core.handle_peer_msg(at(t), 7, beat(RoleName::Standby, Some(0), false));
            core.handle_tick(at(t));
            if effects(&mut core).contains(&wanted) {
                asked.push(t);
                core.handle_table(
                    at(t),
                    TableToCluster::Snapshot {
                        peer: 1,
                        entries: Vec::new(),
                        ceiling: 16,
                    },
                );
                effects(&mut core);
            }
            t += period;
        }
        let gaps: Vec<u64> = asked.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.len() >= 5, "{gaps:?}");
        assert!(gaps[0] <= DETECT + period, "the first resend: {gaps:?}");
        assert!(gaps.windows(2).all(|g| g[1] >= g[0]), "{gaps:?}");
        assert!(
            gaps.iter()
                .all(|&g| g <= SNAPSHOT_RESEND_MAX_MS + period + 1),
            "{gaps:?}"
        );
        assert!(
            gaps.last().is_some_and(|&g| g >= SNAPSHOT_RESEND_MAX_MS),
            "{gaps:?}"
        );
        // Once it says it holds the state, the wait starts over.
        core.handle_peer_msg(at(t), 7, beat(RoleName::Standby, Some(0), true));
        core.handle_tick(at(t));
        effects(&mut core);
        let synced_at = t;
        let again = loop {
            t += period;
            core.handle_peer_msg(at(t), 7, beat(RoleName::Standby, Some(0), false));
            core.handle_tick(at(t));
            if effects(&mut core).contains(&wanted) {
                break t;
            }
        };
        assert!(
            again - synced_at <= DETECT + 2 * period,
            "{}",
            again - synced_at
        );
    }

    #[test]
    fn input_held_back_for_the_lock_owner_is_not_silence() {
        let mut core = linked(1);
        core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
        core.handle_tick(at(2));
        effects(&mut core);
        assert_eq!(core.roles().following(), Some(0));
        // Its link has input held back for three detection periods: it is
        // never dropped as silent, and its active never found dead.
        let mut t = 2;
        while t < 3 * DETECT {
            t += 5;
            core.handle_in_held(at(t), 7);
            core.handle_tick(at(t));
            let out = effects(&mut core);
            assert!(
                !out.iter().any(|e| matches!(
                    e,
                    ClusterEffect::DropIn { .. }
                        | ClusterEffect::ToTable(
                            ClusterToTable::BecomeActive { .. } | ClusterToTable::Follow { .. }
                        )
                )),
                "at {t}: {out:?}"
            );
            assert!(core.roles().is_live(0, t));
        }
        // Once nothing is held and nothing comes, silence counts again.
        core.handle_tick(at(t + core.silence_ms()));
        assert!(effects(&mut core).contains(&ClusterEffect::DropIn { link: 7 }));
        assert!(!core.roles().is_live(0, t + silence_limit_ms(DETECT)));
        // A link still in its handshake is not a peer's: held, it proves
        // nothing and is dropped at its deadline all the same.
        core.handle_in_opened(at(t), 9);
        core.handle_in_held(at(t + HANDSHAKE_MS), 9);
        core.handle_tick(at(t + HANDSHAKE_MS));
        assert!(effects(&mut core).contains(&ClusterEffect::DropIn { link: 9 }));
    }
}
