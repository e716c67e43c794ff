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
//! Each link carries one direction only: node A's messages to node B travel
//! on A's outgoing link to B, so a link's order is TCP's order. A peer is
//! found dead by its heartbeats stopping for `--detect` ms, or at once when
//! its link drops and a new connection to it is refused (the process is
//! gone).
//!
//! Run by the replication thread (replication.rs, which only moves bytes)
//! and, for every simulated node, by the deterministic simulation.
//!
//! Never does: I/O, clock reads, lock state (that is the lock owner's core).

use std::collections::HashMap;

use crate::server::clock::Now;
use crate::server::lock_table::Delta;
use crate::server::messages::{ClusterToTable, TableToCluster};
use crate::server::peer_wire::PeerMsg;
use crate::server::roles::{RoleEffect, Roles};
use crate::server::tokens;

/// Wait between attempts to connect to a peer.
pub const RECONNECT_MS: u64 = 100;
/// Heartbeats per detection period.
pub const BEATS_PER_DETECT: u64 = 4;

/// An incoming link, as the shell names it.
pub type LinkId = usize;

/// Why an outgoing link went down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutDown {
    /// Nothing listens on the peer's port: the process is gone.
    Refused,
    /// Any other failure (reset, timeout, EOF, our output over its bound).
    Failed,
}

/// The verdict on one received peer message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Accept,
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
    Dialing,
    Up,
}

#[derive(Clone, Copy, Debug)]
struct OutLink {
    state: OutState,
    /// The peer has this node's snapshot on this link.
    snap_sent: bool,
    /// A snapshot was asked of the lock owner and has not come yet.
    snap_pending: bool,
    /// When the snapshot went out.
    snap_sent_ms: u64,
}

#[derive(Debug, Default)]
struct InLink {
    peer: Option<usize>,
    /// A snapshot is being received (entries so far).
    snapshot: Option<Vec<Delta>>,
}

/// The cluster core of one node. See the module doc.
pub struct ClusterCore {
    me: usize,
    names: Vec<String>,
    detect_ms: u64,
    roles: Roles,
    outs: Vec<OutLink>,
    ins: HashMap<LinkId, InLink>,
    next_beat_ms: u64,
    /// Deltas received and not yet passed to the lock owner.
    deltas_in: Vec<Delta>,
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
    effects: Vec<ClusterEffect>,
}

impl ClusterCore {
    /// Node `me` of the nodes named `names` (their `--peers` entries).
    pub fn new(me: usize, names: Vec<String>, detect_ms: u64, now: Now) -> ClusterCore {
        let roles = Roles::new(me, names.len(), detect_ms, detect_ms, now.ms);
        let outs = vec![
            OutLink {
                state: OutState::Down { retry_at_ms: 0 },
                snap_sent: false,
                snap_pending: false,
                snap_sent_ms: 0,
            };
            names.len()
        ];
        ClusterCore {
            me,
            names,
            detect_ms,
            roles,
            outs,
            ins: HashMap::new(),
            next_beat_ms: 0,
            deltas_in: Vec::new(),
            awaiting_redirect: false,
            exit_when_redirected: false,
            exited: false,
            last_issued: 0,
            ceiling: 0,
            heard_active_ms: 0,
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

    /// The lock owner's latest token figures, for heartbeats.
    pub fn set_tokens(&mut self, last_issued: u64, ceiling: u64) {
        self.last_issued = last_issued;
        self.ceiling = ceiling;
    }

    /// Live standbys that hold this node's full state.
    pub fn synced_standbys(&self, now: Now) -> usize {
        (0..self.names.len())
            .filter(|&p| {
                p != self.me
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
            if let OutState::Down { retry_at_ms } = out.state
                && p != self.me
            {
                wake = wake.min(retry_at_ms);
            }
        }
        wake.max(now.ms)
    }

    /// Time-driven work: roles, heartbeats, dialing, snapshots.
    pub fn handle_tick(&mut self, now: Now) {
        if self.exited {
            return;
        }
        self.flush_deltas_in();
        let effects = self.roles.poll(now.ms);
        self.apply_role_effects(now, effects);
        if now.ms >= self.next_beat_ms {
            self.send_beats();
            let period = (self.detect_ms / BEATS_PER_DETECT).max(1);
            self.next_beat_ms = now.ms.saturating_add(period);
        }
        for p in 0..self.outs.len() {
            if p != self.me {
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
        out.state = OutState::Dialing;
        self.effects.push(ClusterEffect::Dial { peer: p });
    }

    /// The outgoing link to `p` is connected.
    pub fn handle_link_up(&mut self, _now: Now, p: usize) {
        let Some(out) = self.outs.get_mut(p) else {
            return;
        };
        if out.state != OutState::Dialing {
            return;
        }
        log::info!("replication: link to {} is up", self.names[p]);
        out.state = OutState::Up;
        out.snap_sent = false;
        out.snap_pending = false;
        let nodes = self.names.len();
        self.send(
            p,
            PeerMsg::Hello {
                from: self.me,
                nodes,
            },
        );
        self.send_beats();
    }

    /// The outgoing link to `p` failed to connect, or dropped.
    pub fn handle_link_down(&mut self, now: Now, p: usize, why: OutDown, detail: &str) {
        let Some(out) = self.outs.get_mut(p) else {
            return;
        };
        let was_up = out.state == OutState::Up;
        out.snap_sent = false;
        out.snap_pending = false;
        // Reconnect at once after a drop (to tell a dead peer from a blip
        // quickly), then every RECONNECT_MS.
        let retry_at_ms = if was_up {
            now.ms
        } else {
            now.ms.saturating_add(RECONNECT_MS)
        };
        out.state = OutState::Down { retry_at_ms };
        if was_up {
            log::info!("replication: link to {} dropped: {detail}", self.names[p]);
        } else {
            log::debug!(
                "replication: connecting to {} failed: {detail}",
                self.names[p]
            );
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

    /// A peer connected to this node (adopted from an I/O loop).
    pub fn handle_in_opened(&mut self, link: LinkId) {
        self.ins.insert(link, InLink::default());
    }

    /// Incoming link `link` closed or failed (the shell has closed it).
    pub fn handle_in_closed(&mut self, _now: Now, link: LinkId, why: &str) {
        let Some(state) = self.ins.remove(&link) else {
            return;
        };
        if let Some(p) = state.peer {
            log::info!("replication: link from {} dropped: {why}", self.names[p]);
            // Probe the peer at once through our own link: refused means dead.
            if let Some(out) = self.outs.get_mut(p) {
                if matches!(out.state, OutState::Up | OutState::Dialing) {
                    self.effects.push(ClusterEffect::DropOut { peer: p });
                }
                out.state = OutState::Down { retry_at_ms: 0 };
                out.snap_sent = false;
                out.snap_pending = false;
            }
        }
    }

    /// A line on incoming link `link` that did not parse.
    pub fn handle_in_malformed(&mut self, now: Now, link: LinkId) {
        self.drop_in(now, link, "a line not understood");
    }

    fn drop_in(&mut self, now: Now, link: LinkId, why: &str) {
        if self.ins.contains_key(&link) {
            self.effects.push(ClusterEffect::DropIn { link });
            self.handle_in_closed(now, link, why);
        }
    }

    /// Is `msg`, received on incoming link `link`, acceptable? One place for
    /// every check of a peer's message, so that it can be tightened.
    pub fn check_peer_msg(&self, link: LinkId, msg: &PeerMsg) -> Verdict {
        let Some(state) = self.ins.get(&link) else {
            return Verdict::Refuse("an unknown link");
        };
        let nodes = self.names.len();
        match (state.peer, msg) {
            (None, PeerMsg::Hello { from, nodes: n }) => {
                if *n != nodes || *from >= nodes || *from == self.me {
                    Verdict::Refuse("a mismatched hello")
                } else {
                    Verdict::Accept
                }
            }
            (None, _) => Verdict::Refuse("no hello first"),
            (Some(_), PeerMsg::Hello { .. }) => Verdict::Refuse("a second hello"),
            (
                Some(_),
                PeerMsg::Beat {
                    beat,
                    last_token,
                    ceiling,
                },
            ) => {
                if beat.following.is_some_and(|f| f >= nodes) {
                    Verdict::Refuse("a heartbeat naming an unknown node")
                } else if *last_token > tokens::MAX_TOKEN || *ceiling > tokens::MAX_TOKEN {
                    Verdict::Refuse("a token beyond the limit")
                } else {
                    Verdict::Accept
                }
            }
            (
                Some(_),
                PeerMsg::Delta(Delta::Grant { token: 0, .. } | Delta::Free { token: 0, .. }),
            ) => Verdict::Refuse("token 0"),
            (
                Some(_),
                PeerMsg::Delta(
                    Delta::Grant { token, .. } | Delta::Free { token, .. } | Delta::Ceiling(token),
                ),
            ) if *token > tokens::MAX_TOKEN => Verdict::Refuse("a token beyond the limit"),
            (Some(_), _) => Verdict::Accept,
        }
    }

    /// One message on incoming link `link`.
    pub fn handle_peer_msg(&mut self, now: Now, link: LinkId, msg: PeerMsg) {
        if let Verdict::Refuse(why) = self.check_peer_msg(link, &msg) {
            if let PeerMsg::Hello { from, nodes } = msg {
                log::warn!(
                    "replication: a peer says it is node {from} of {nodes}; this node is {} of {}: \
                     are the --peers lists the same everywhere?",
                    self.me,
                    self.names.len()
                );
            }
            return self.drop_in(now, link, why);
        }
        let Some(p) = self.ins.get(&link).and_then(|l| l.peer) else {
            if let PeerMsg::Hello { from, .. } = msg {
                self.handle_hello(link, from);
            }
            return;
        };
        let from_my_active = self.roles.following() == Some(p);
        if from_my_active {
            self.heard_active_ms = now.ms;
        }
        match msg {
            PeerMsg::Hello { .. } => {}
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
                let i_am_active = self.roles.role_name().is_active();
                let mut floor = last_token;
                if !i_am_active || beat.role.is_active() {
                    floor = floor.max(ceiling);
                }
                self.tell_table(ClusterToTable::Observe(floor));
                let effects = self.roles.handle_beat(now.ms, p, beat);
                self.apply_role_effects(now, effects);
            }
            PeerMsg::SnapshotBegin if from_my_active => {
                if let Some(l) = self.ins.get_mut(&link) {
                    l.snapshot = Some(Vec::new());
                }
            }
            PeerMsg::Delta(delta) if from_my_active => {
                match self.ins.get_mut(&link).and_then(|l| l.snapshot.as_mut()) {
                    Some(entries) => entries.push(delta),
                    None => self.deltas_in.push(delta),
                }
            }
            PeerMsg::SnapshotEnd if from_my_active => {
                let entries = self.ins.get_mut(&link).and_then(|l| l.snapshot.take());
                if let Some(entries) = entries {
                    log::info!(
                        "replication: snapshot of {} entries from {}",
                        entries.len(),
                        self.names[p]
                    );
                    self.flush_deltas_in();
                    self.tell_table(ClusterToTable::Snapshot(entries));
                    let effects = self.roles.handle_synced(now.ms, p);
                    self.apply_role_effects(now, effects);
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

    fn handle_hello(&mut self, link: LinkId, from: usize) {
        // A newer link from the same peer replaces the old one.
        let stale: Vec<LinkId> = self
            .ins
            .iter()
            .filter(|(l, state)| **l != link && state.peer == Some(from))
            .map(|(l, _)| *l)
            .collect();
        for l in stale {
            self.ins.remove(&l);
            self.effects.push(ClusterEffect::DropIn { link: l });
        }
        log::info!("replication: link from {} is up", self.names[from]);
        if let Some(state) = self.ins.get_mut(&link) {
            state.peer = Some(from);
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
                log::info!(
                    "replication: transferring the active role to {}",
                    self.names[to]
                );
                self.send(to, PeerMsg::Handoff);
            }
            TableToCluster::Redirected => {
                self.awaiting_redirect = false;
                if self.exit_when_redirected {
                    self.finish_exit();
                }
            }
        }
    }

    fn send_snapshot(&mut self, now: Now, peer: usize, entries: Vec<Delta>, ceiling: u64) {
        let Some(out) = self.outs.get_mut(peer) else {
            return;
        };
        out.snap_pending = false;
        if out.state != OutState::Up || !self.roles.role_name().is_active() {
            return;
        }
        log::info!(
            "replication: sending a snapshot of {} keys to {}",
            entries.len(),
            self.names[peer]
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
        // A follower that still says it lacks the state a detection period
        // after its snapshot went out did not get it (it switched to this
        // node in between, say): send it again.
        let stale = beat.is_some_and(|b| !b.synced)
            && now.ms.saturating_sub(out.snap_sent_ms) > self.detect_ms;
        if out.snap_sent && stale {
            log::info!(
                "replication: {} still lacks the state; sending it again",
                self.names[p]
            );
            out.snap_sent = false;
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
    use crate::server::roles::{Beat, RoleName};

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

    fn effects(core: &mut ClusterCore) -> Vec<ClusterEffect> {
        core.poll_effects().collect()
    }

    /// Node `me` of 2 with its outgoing link to the other up and an
    /// incoming link (id 7) from it that said hello.
    fn linked(me: usize) -> ClusterCore {
        let other = 1 - me;
        let mut core = ClusterCore::new(me, names(2), DETECT, at(0));
        core.handle_tick(at(0));
        assert!(effects(&mut core).contains(&ClusterEffect::Dial { peer: other }));
        core.handle_link_up(at(1), other);
        core.handle_in_opened(7);
        core.handle_peer_msg(
            at(1),
            7,
            PeerMsg::Hello {
                from: other,
                nodes: 2,
            },
        );
        effects(&mut core);
        core
    }

    #[test]
    fn a_new_link_says_hello_then_beats() {
        let mut core = ClusterCore::new(1, names(2), DETECT, at(0));
        core.handle_tick(at(0));
        assert_eq!(effects(&mut core), vec![ClusterEffect::Dial { peer: 0 }]);
        core.handle_link_up(at(2), 0);
        let out = effects(&mut core);
        assert_eq!(
            out[0],
            ClusterEffect::Send {
                peer: 0,
                msg: PeerMsg::Hello { from: 1, nodes: 2 }
            }
        );
        assert!(matches!(
            out[1],
            ClusterEffect::Send {
                peer: 0,
                msg: PeerMsg::Beat { .. }
            }
        ));
    }

    #[test]
    fn a_failed_dial_is_retried_after_the_reconnect_wait() {
        let mut core = ClusterCore::new(1, names(2), DETECT, at(0));
        core.handle_tick(at(0));
        effects(&mut core);
        core.handle_link_down(at(1), 0, OutDown::Failed, "timed out");
        core.handle_tick(at(50));
        assert!(!effects(&mut core).contains(&ClusterEffect::Dial { peer: 0 }));
        assert!(core.next_wake_ms(at(50)) <= 1 + RECONNECT_MS);
        core.handle_tick(at(1 + RECONNECT_MS));
        assert!(effects(&mut core).contains(&ClusterEffect::Dial { peer: 0 }));
    }

    #[test]
    fn a_message_before_hello_or_a_mismatched_hello_drops_the_link() {
        let mut core = ClusterCore::new(0, names(2), DETECT, at(0));
        core.handle_in_opened(1);
        assert_eq!(
            core.check_peer_msg(1, &PeerMsg::Took),
            Verdict::Refuse("no hello first")
        );
        core.handle_peer_msg(at(1), 1, PeerMsg::Took);
        assert_eq!(effects(&mut core), vec![ClusterEffect::DropIn { link: 1 }]);
        core.handle_in_opened(2);
        core.handle_peer_msg(at(1), 2, PeerMsg::Hello { from: 1, nodes: 3 });
        assert_eq!(effects(&mut core), vec![ClusterEffect::DropIn { link: 2 }]);
        core.handle_in_opened(3);
        core.handle_peer_msg(at(1), 3, PeerMsg::Hello { from: 0, nodes: 2 });
        assert_eq!(effects(&mut core), vec![ClusterEffect::DropIn { link: 3 }]);
    }

    #[test]
    fn a_forged_token_zero_or_unknown_node_is_refused() {
        let core = linked(0);
        let zero = PeerMsg::Delta(Delta::Grant {
            key: Key::new(b"k").expect("key"),
            token: 0,
            ms_left: 1,
        });
        assert_eq!(core.check_peer_msg(7, &zero), Verdict::Refuse("token 0"));
        let stranger = beat(RoleName::Standby, Some(9), false);
        assert!(matches!(
            core.check_peer_msg(7, &stranger),
            Verdict::Refuse(_)
        ));
        assert_eq!(
            core.check_peer_msg(7, &PeerMsg::Hello { from: 1, nodes: 2 }),
            Verdict::Refuse("a second hello")
        );
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
        assert_eq!(
            core.check_peer_msg(7, &huge),
            Verdict::Refuse("a token beyond the limit")
        );
        let ceiling = PeerMsg::Delta(Delta::Ceiling(u64::MAX));
        assert_eq!(
            core.check_peer_msg(7, &ceiling),
            Verdict::Refuse("a token beyond the limit")
        );
    }

    #[test]
    fn a_newer_link_from_the_same_peer_replaces_the_old_one() {
        let mut core = linked(0);
        core.handle_in_opened(8);
        core.handle_peer_msg(at(2), 8, PeerMsg::Hello { from: 1, nodes: 2 });
        assert_eq!(effects(&mut core), vec![ClusterEffect::DropIn { link: 7 }]);
    }

    #[test]
    fn an_active_heartbeat_lifts_the_token_floor_by_its_ceiling() {
        let mut core = linked(1);
        core.handle_peer_msg(
            at(2),
            7,
            PeerMsg::Beat {
                beat: Beat {
                    role: RoleName::Active,
                    following: None,
                    synced: false,
                    has_state: true,
                },
                last_token: 10,
                ceiling: 500,
            },
        );
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
        let mut core = ClusterCore::new(0, names(2), DETECT, at(0));
        core.handle_tick(at(0));
        core.handle_tick(at(DETECT + 1));
        assert!(core.roles().role_name().is_active());
        core.handle_in_opened(7);
        core.handle_peer_msg(at(DETECT + 2), 7, PeerMsg::Hello { from: 1, nodes: 2 });
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
        let mut core = ClusterCore::new(0, names(2), DETECT, at(0));
        core.handle_tick(at(0));
        effects(&mut core);
        core.handle_tick(at(DETECT + 1));
        assert!(core.roles().role_name().is_active());
        effects(&mut core);
        core.handle_link_up(at(DETECT + 1), 1);
        core.handle_in_opened(7);
        core.handle_peer_msg(at(DETECT + 2), 7, PeerMsg::Hello { from: 1, nodes: 2 });
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
    fn a_standby_assembles_a_snapshot_and_says_it_is_synced() {
        let mut core = linked(1);
        core.handle_peer_msg(at(2), 7, beat(RoleName::Active, None, false));
        effects(&mut core);
        let grant = Delta::Grant {
            key: Key::new(b"k").expect("key"),
            token: 33,
            ms_left: 100,
        };
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotBegin);
        core.handle_peer_msg(at(3), 7, PeerMsg::Delta(grant.clone()));
        core.handle_peer_msg(at(3), 7, PeerMsg::SnapshotEnd);
        let out = effects(&mut core);
        assert_eq!(
            out[0],
            ClusterEffect::ToTable(ClusterToTable::Snapshot(vec![grant]))
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
        let mut core = ClusterCore::new(0, names(2), DETECT, at(0));
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
        let mut core = linked(1);
        // Node 1 alone became active; node 0 (higher) follows it, synced.
        core.handle_tick(at(DETECT + 2));
        effects(&mut core);
        assert!(core.roles().role_name().is_active());
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
    fn promotion_floor_comes_from_the_wall_clock_passed_in() {
        let mut core = ClusterCore::new(0, names(2), DETECT, at(0));
        core.handle_tick(Now::at(DETECT + 1, 5_000));
        let out = effects(&mut core);
        assert!(
            out.contains(&ClusterEffect::ToTable(ClusterToTable::BecomeActive {
                floor: tokens::start_floor(5_000),
                failover: true
            }))
        );
    }
}
