//! Roles: which node of the cluster is active, as a plain state machine.
//!
//! Owns: this node's role (discovering, standby, active, handing off), whom it
//! follows, and what it knows of each peer from their heartbeats. Runs inside
//! the replication thread, which feeds it heartbeats, link events and time,
//! and carries out the [`RoleEffect`]s it returns.
//!
//! The rules (docs/cluster.md, "What happens when"):
//! - Among the live nodes, the one highest in `--peers` is active. A peer is
//!   live while its heartbeats keep arriving (within `detect_ms`) and it has
//!   not been found dead (connection refused after its link dropped).
//! - A node that starts first discovers: it follows an active peer if there
//!   is one; otherwise, once every peer has been heard from or found dead (or
//!   the discovery wait ends), the election below runs.
//! - Election (no live active): among the live nodes that hold replicated
//!   state — or all live nodes when none does (a cold start) — the highest in
//!   priority becomes active. A peer known to be up but not heard yet (its
//!   link just proved it, its first heartbeat on the way) is waited for, up
//!   to `detect_ms`: it may rank higher, and electing past it would be a
//!   split brain.
//! - An active that sees a higher-priority active steps back and follows it
//!   (split brain never lasts). An active that sees a higher-priority standby
//!   that follows it and holds its full state hands over to it: it stops
//!   serving, sends `HANDOFF` after its last delta, and becomes its standby
//!   once the other confirms (`TOOK`). A handoff that gets no confirmation
//!   within `detect_ms` is abandoned and the node serves again.
//! - Graceful shutdown of an active hands over to the best live synced
//!   standby first (the same handoff), then exits.
//!
//! Never does: I/O, clock reads, or anything with lock state.

/// What a node says of itself in every heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Beat {
    pub role: RoleName,
    /// The active this node follows (standbys), if any.
    pub following: Option<usize>,
    /// It has applied the full state of the node it follows.
    pub synced: bool,
    /// It holds replicated state from some active (now or before).
    pub has_state: bool,
}

/// A role as named on the wire and in `I`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoleName {
    Discovering,
    Standby,
    Active,
    HandingOff,
}

impl RoleName {
    pub fn as_str(self) -> &'static str {
        match self {
            RoleName::Discovering => "discovering",
            RoleName::Standby => "standby",
            RoleName::Active => "active",
            RoleName::HandingOff => "handing-off",
        }
    }
    pub fn parse(s: &str) -> Option<RoleName> {
        Some(match s {
            "discovering" => RoleName::Discovering,
            "standby" => RoleName::Standby,
            "active" => RoleName::Active,
            "handing-off" => RoleName::HandingOff,
            _ => return None,
        })
    }
    /// Serving clients (or about to hand that over).
    pub fn is_active(self) -> bool {
        matches!(self, RoleName::Active | RoleName::HandingOff)
    }
}

/// What the replication thread must do after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoleEffect {
    /// Start serving clients with the state at hand.
    BecomeActive,
    /// Follow `active` (or nobody, `None`): answer clients `M`, and take the
    /// active's snapshot and deltas.
    Follow { active: Option<usize> },
    /// Stop serving, and send `HANDOFF` to `to` after the last delta.
    StartTransfer { to: usize },
    /// The handoff failed: serve again.
    AbortTransfer,
    /// `to` took over: redirect every client to it and follow it.
    FinishTransfer { to: usize },
    /// Tell `to` (the old active) that this node took over.
    SendTook { to: usize },
    /// Graceful shutdown can complete now.
    Exit,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Discovering { until_ms: u64 },
    Standby,
    Active,
    HandingOff { to: usize, since_ms: u64 },
}

#[derive(Clone, Copy, Debug, Default)]
struct Peer {
    last_heard_ms: Option<u64>,
    beat: Option<Beat>,
    /// Its link dropped and a new connection was refused: dead until it
    /// speaks again.
    dead: bool,
    /// When a link with it last proved it is up (it answered this node's
    /// dial with the cluster key): alive then, its heartbeat on the way.
    proved_ms: Option<u64>,
}

/// The role state machine of one node. See the module doc.
#[derive(Debug)]
pub struct Roles {
    me: usize,
    detect_ms: u64,
    role: Role,
    following: Option<usize>,
    synced: bool,
    has_state: bool,
    shutting_down: bool,
    peers: Vec<Peer>,
    /// The node that handed its role to this one, until a heartbeat of it
    /// says it no longer hands it over: its `handing-off` heartbeats sent
    /// before it heard `Took` are in flight behind the handoff, and must
    /// not make this node step back to it.
    handed_by: Option<usize>,
}

impl Roles {
    /// Node `me` of `nodes`, starting at `now_ms`: it discovers for at most
    /// `discovery_ms`. A node alone in its list knows everyone at once, so
    /// its first step elects it (and says so: [`RoleEffect::BecomeActive`]
    /// is what tells the lock owner to serve).
    pub fn new(me: usize, nodes: usize, detect_ms: u64, discovery_ms: u64, now_ms: u64) -> Roles {
        assert!(me < nodes, "a node is in its own peers list");
        let role = Role::Discovering {
            until_ms: now_ms + discovery_ms,
        };
        Roles {
            me,
            detect_ms,
            role,
            following: None,
            synced: false,
            has_state: false,
            shutting_down: false,
            peers: vec![Peer::default(); nodes],
            handed_by: None,
        }
    }

    /// This node's heartbeat.
    pub fn beat(&self) -> Beat {
        Beat {
            role: self.role_name(),
            following: self.following,
            synced: self.synced,
            // A node on its way out is never elected, so it must not count
            // as one holding the state: the others would wait for it.
            has_state: self.has_state && !self.shutting_down,
        }
    }

    pub fn role_name(&self) -> RoleName {
        match self.role {
            Role::Discovering { .. } => RoleName::Discovering,
            Role::Standby => RoleName::Standby,
            Role::Active => RoleName::Active,
            Role::HandingOff { .. } => RoleName::HandingOff,
        }
    }

    /// The active node as this node sees it (itself included).
    pub fn active(&self) -> Option<usize> {
        match self.role {
            Role::Active | Role::HandingOff { .. } => Some(self.me),
            _ => self.following,
        }
    }

    /// The node this one follows, if a standby.
    pub fn following(&self) -> Option<usize> {
        self.following
    }

    /// Is peer `p` live at `now_ms`?
    pub fn is_live(&self, p: usize, now_ms: u64) -> bool {
        if p == self.me {
            return true;
        }
        let peer = &self.peers[p];
        !peer.dead
            && peer
                .last_heard_ms
                .is_some_and(|t| now_ms.saturating_sub(t) < self.detect_ms)
    }

    /// What peer `p` last said of itself.
    pub fn peer_beat(&self, p: usize) -> Option<Beat> {
        self.peers.get(p).and_then(|peer| peer.beat)
    }

    /// A heartbeat from peer `from`.
    pub fn handle_beat(&mut self, now_ms: u64, from: usize, beat: Beat) -> Vec<RoleEffect> {
        if from == self.me || from >= self.peers.len() {
            return Vec::new();
        }
        let stale = self.handed_by == Some(from) && beat.role == RoleName::HandingOff;
        if self.handed_by == Some(from) && !stale {
            self.handed_by = None;
        }
        let peer = &mut self.peers[from];
        peer.last_heard_ms = Some(now_ms);
        if !stale {
            peer.beat = Some(beat);
        }
        peer.dead = false;
        self.decide(now_ms)
    }

    /// Peer `from` sent something this node has not read yet (its input is
    /// held back while the lock owner catches up): it was live as of now,
    /// whatever it says in it. Changes nothing else (a peer found dead
    /// stays dead until it speaks).
    pub fn handle_heard(&mut self, now_ms: u64, from: usize) {
        if let Some(peer) = self.peers.get_mut(from).filter(|_| from != self.me)
            && peer.beat.is_some()
        {
            peer.last_heard_ms = Some(peer.last_heard_ms.map_or(now_ms, |t| t.max(now_ms)));
        }
    }

    /// A link with peer `from` just proved it up (it answered this node's
    /// dial with the cluster key): it is alive, and until its first
    /// heartbeat arrives (or `detect_ms` passes) no election runs past it.
    /// Nothing else changes: a peer found dead stays dead until it speaks
    /// (what it last said is stale: a restarted node's old `active`
    /// heartbeat must not make this node follow it).
    /// Without this, a node whose active died in the round trip between a
    /// peer answering its dial and that peer's dial back (the link its
    /// heartbeats come on) would elect itself beside a higher peer.
    pub fn handle_link_proved(&mut self, now_ms: u64, from: usize) {
        if let Some(peer) = self.peers.get_mut(from).filter(|_| from != self.me) {
            peer.proved_ms = Some(now_ms);
        }
    }

    /// Peer `from`'s link dropped and reconnecting was refused: it is dead.
    pub fn handle_peer_dead(&mut self, now_ms: u64, from: usize) -> Vec<RoleEffect> {
        if let Some(peer) = self.peers.get_mut(from).filter(|_| from != self.me) {
            peer.dead = true;
            peer.proved_ms = None;
        }
        self.decide(now_ms)
    }

    /// The full state of `from` has been applied here.
    pub fn handle_synced(&mut self, now_ms: u64, from: usize) -> Vec<RoleEffect> {
        // A node shutting down never says it holds the state: its successor
        // would otherwise hand the role straight back to it (it ranks
        // higher) just before it exits.
        if self.following == Some(from) && matches!(self.role, Role::Standby) && !self.shutting_down
        {
            self.synced = true;
            self.has_state = true;
        }
        self.decide(now_ms)
    }

    /// Something `from` sent was lost (its link dropped) or left out (a
    /// token beyond this node's window): if it is the active this node
    /// follows, this node no longer holds its full state (it keeps what it
    /// has, and takes a fresh snapshot).
    pub fn handle_state_lost(&mut self, from: usize) {
        if self.following == Some(from) {
            self.synced = false;
        }
    }

    /// `from` began sending a snapshot: if it is the active this node
    /// follows, its table is emptied and filled piece by piece from now
    /// on, so until the snapshot ends it neither holds that state nor says
    /// it holds replicated state at all (an election prefers a node that
    /// holds the whole state to one with part of it).
    pub fn handle_snapshot_begun(&mut self, from: usize) {
        if self.following == Some(from) && matches!(self.role, Role::Standby) {
            self.synced = false;
            self.has_state = false;
        }
    }

    /// This node refused part of the state it replicates (a grant past its
    /// `--max-keys`, a lease above its `--max-lease`; the caller knows
    /// whose): unless it is active (serving what it has), it neither holds
    /// that state nor can take it, so it no longer says it holds
    /// replicated state at all (an election prefers a node that does) until
    /// a snapshot it can take — whomever it follows now, even no one (its
    /// active just found dead: it must not win the election over a node
    /// that holds the whole state).
    pub fn handle_state_refused(&mut self) {
        if !matches!(self.role, Role::Active | Role::HandingOff { .. }) {
            self.synced = false;
            self.has_state = false;
        }
    }

    /// `from`, the active this node follows, hands over to it.
    pub fn handle_handoff(&mut self, now_ms: u64, from: usize) -> Vec<RoleEffect> {
        if self.following != Some(from)
            || !self.synced
            || self.shutting_down
            || !matches!(self.role, Role::Standby)
        {
            return self.decide(now_ms);
        }
        self.role = Role::Active;
        self.following = None;
        self.synced = false;
        self.handed_by = Some(from);
        // The old active handed its role over: it is not active any more,
        // whatever its last heartbeat said (else a lower-priority successor,
        // on a graceful shutdown, would step back to it at once).
        self.peers[from].beat = Some(Beat {
            role: RoleName::Standby,
            following: Some(self.me),
            synced: false,
            has_state: true,
        });
        let mut effects = vec![RoleEffect::BecomeActive, RoleEffect::SendTook { to: from }];
        effects.extend(self.decide(now_ms));
        effects
    }

    /// `from` confirmed it took over from this node.
    pub fn handle_took(&mut self, now_ms: u64, from: usize) -> Vec<RoleEffect> {
        let Role::HandingOff { to, .. } = self.role else {
            return Vec::new();
        };
        if to != from {
            return Vec::new();
        }
        self.role = Role::Standby;
        self.following = Some(to);
        self.synced = false;
        // It is active now, whatever its last heartbeat said.
        let peer = &mut self.peers[to];
        peer.last_heard_ms = Some(now_ms);
        peer.dead = false;
        peer.beat = Some(Beat {
            role: RoleName::Active,
            following: None,
            synced: false,
            has_state: true,
        });
        let mut effects = vec![RoleEffect::FinishTransfer { to }];
        if self.shutting_down {
            effects.push(RoleEffect::Exit);
        } else {
            effects.extend(self.decide(now_ms));
        }
        effects
    }

    /// Graceful shutdown was asked for.
    pub fn handle_shutdown(&mut self, now_ms: u64) -> Vec<RoleEffect> {
        self.shutting_down = true;
        match self.role {
            Role::Active => match self.successor(now_ms) {
                Some(to) => self.start_handoff(now_ms, to),
                None => vec![RoleEffect::Exit],
            },
            Role::HandingOff { .. } => Vec::new(),
            _ => vec![RoleEffect::Exit],
        }
    }

    /// Time passed: discovery end, dead peers, handoff timeout.
    pub fn poll(&mut self, now_ms: u64) -> Vec<RoleEffect> {
        self.decide(now_ms)
    }

    /// The next time `poll` may change something.
    pub fn next_wake_ms(&self, now_ms: u64) -> u64 {
        let mut wake = now_ms + self.detect_ms;
        if let Role::Discovering { until_ms } = self.role {
            wake = wake.min(until_ms);
        }
        if let Role::HandingOff { since_ms, .. } = self.role {
            wake = wake.min(since_ms + self.detect_ms);
        }
        for peer in &self.peers {
            for t in [peer.last_heard_ms, peer.proved_ms].into_iter().flatten() {
                let expiry = t + self.detect_ms;
                if expiry > now_ms {
                    wake = wake.min(expiry);
                }
            }
        }
        wake
    }

    fn decide(&mut self, now_ms: u64) -> Vec<RoleEffect> {
        match self.role {
            Role::Discovering { until_ms } => {
                let everyone_known = (0..self.peers.len())
                    .all(|p| p == self.me || self.peers[p].dead || self.is_live(p, now_ms));
                let active_known = self.best_live_active(now_ms).is_some();
                if now_ms >= until_ms || everyone_known || active_known {
                    self.role = Role::Standby;
                    return self.decide_standby(now_ms, true);
                }
                Vec::new()
            }
            Role::Standby => self.decide_standby(now_ms, false),
            Role::Active => self.decide_active(now_ms),
            Role::HandingOff { to, since_ms } => {
                if let Some(higher) = self.higher_live_active(now_ms) {
                    return self.follow(higher);
                }
                if now_ms >= since_ms + self.detect_ms || !self.is_live(to, now_ms) {
                    self.role = Role::Active;
                    let mut effects = vec![RoleEffect::AbortTransfer];
                    if self.shutting_down {
                        // The successor failed; try the next one, or just go.
                        effects.extend(self.handle_shutdown(now_ms));
                    }
                    return effects;
                }
                Vec::new()
            }
        }
    }

    fn decide_standby(&mut self, now_ms: u64, announce: bool) -> Vec<RoleEffect> {
        if let Some(active) = self.best_live_active(now_ms) {
            if self.following != Some(active) || announce {
                return self.follow(active);
            }
            return Vec::new();
        }
        if self.elected(now_ms) {
            self.role = Role::Active;
            self.following = None;
            self.synced = false;
            return vec![RoleEffect::BecomeActive];
        }
        if self.following.is_some() || announce {
            self.following = None;
            self.synced = false;
            return vec![RoleEffect::Follow { active: None }];
        }
        Vec::new()
    }

    fn decide_active(&mut self, now_ms: u64) -> Vec<RoleEffect> {
        if let Some(higher) = self.higher_live_active(now_ms) {
            return self.follow(higher);
        }
        let successor = (0..self.me).find(|&p| {
            self.is_live(p, now_ms)
                && self.peers[p].beat.is_some_and(|b| {
                    b.role == RoleName::Standby && b.following == Some(self.me) && b.synced
                })
        });
        match successor {
            Some(to) => self.start_handoff(now_ms, to),
            None => Vec::new(),
        }
    }

    fn start_handoff(&mut self, now_ms: u64, to: usize) -> Vec<RoleEffect> {
        self.role = Role::HandingOff {
            to,
            since_ms: now_ms,
        };
        vec![RoleEffect::StartTransfer { to }]
    }

    fn follow(&mut self, active: usize) -> Vec<RoleEffect> {
        self.role = Role::Standby;
        self.following = Some(active);
        self.synced = false;
        vec![RoleEffect::Follow {
            active: Some(active),
        }]
    }

    /// The highest-priority live peer that says it is active.
    fn best_live_active(&self, now_ms: u64) -> Option<usize> {
        (0..self.peers.len()).find(|&p| {
            p != self.me
                && self.is_live(p, now_ms)
                && self.peers[p].beat.is_some_and(|b| b.role.is_active())
        })
    }

    fn higher_live_active(&self, now_ms: u64) -> Option<usize> {
        self.best_live_active(now_ms).filter(|&p| p < self.me)
    }

    /// The best live standby to hand over to on shutdown: synced to this
    /// node, highest in priority.
    fn successor(&self, now_ms: u64) -> Option<usize> {
        (0..self.peers.len()).find(|&p| {
            p != self.me
                && self.is_live(p, now_ms)
                && self.peers[p]
                    .beat
                    .is_some_and(|b| b.following == Some(self.me) && b.synced)
        })
    }

    /// Is peer `p` known to be up without having been heard since (its
    /// link proved it within `detect_ms`, no heartbeat and no refusal after
    /// that)?
    fn awaited(&self, p: usize, now_ms: u64) -> bool {
        let peer = &self.peers[p];
        p != self.me
            && !self.is_live(p, now_ms)
            && peer.proved_ms.is_some_and(|proved| {
                now_ms.saturating_sub(proved) < self.detect_ms
                    && peer.last_heard_ms.is_none_or(|heard| heard < proved)
            })
    }

    /// With no live active: is this node the highest-priority eligible one?
    /// Not while a peer known to be up has not been heard (it may rank
    /// higher or hold the state): [`Roles::handle_link_proved`].
    fn elected(&self, now_ms: u64) -> bool {
        if self.shutting_down || (0..self.peers.len()).any(|p| self.awaited(p, now_ms)) {
            return false;
        }
        let live: Vec<usize> = (0..self.peers.len())
            .filter(|&p| self.is_live(p, now_ms))
            .collect();
        let holds_state = |p: usize| {
            if p == self.me {
                self.has_state
            } else {
                self.peers[p].beat.is_some_and(|b| b.has_state)
            }
        };
        let any_state = live.iter().any(|&p| holds_state(p));
        let best = live.into_iter().find(|&p| !any_state || holds_state(p));
        best == Some(self.me)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DETECT: u64 = 1000;

    fn beat(role: RoleName, following: Option<usize>, synced: bool, has_state: bool) -> Beat {
        Beat {
            role,
            following,
            synced,
            has_state,
        }
    }
    fn active() -> Beat {
        beat(RoleName::Active, None, false, false)
    }
    fn standby_of(a: usize) -> Beat {
        beat(RoleName::Standby, Some(a), true, true)
    }
    fn discovering() -> Beat {
        beat(RoleName::Discovering, None, false, false)
    }

    #[test]
    fn a_single_node_is_elected_at_its_first_step_and_says_so() {
        let mut roles = Roles::new(0, 1, DETECT, 500, 0);
        assert_eq!(roles.poll(0), vec![RoleEffect::BecomeActive]);
        assert_eq!(roles.role_name(), RoleName::Active);
        assert_eq!(roles.active(), Some(0));
        assert!(roles.poll(1).is_empty());
    }

    #[test]
    fn a_node_alone_becomes_active_when_discovery_ends() {
        let mut roles = Roles::new(1, 2, DETECT, 500, 0);
        assert!(roles.poll(499).is_empty());
        assert_eq!(roles.role_name(), RoleName::Discovering);
        assert_eq!(roles.poll(500), vec![RoleEffect::BecomeActive]);
    }

    #[test]
    fn a_node_whose_peers_are_all_dead_does_not_wait_for_discovery() {
        let mut roles = Roles::new(1, 3, DETECT, 500, 0);
        assert!(roles.handle_peer_dead(1, 0).is_empty());
        assert_eq!(roles.handle_peer_dead(2, 2), vec![RoleEffect::BecomeActive]);
    }

    #[test]
    fn a_starting_node_follows_the_active_even_if_it_ranks_higher() {
        let mut roles = Roles::new(0, 2, DETECT, 500, 0);
        let effects = roles.handle_beat(10, 1, active());
        assert_eq!(effects, vec![RoleEffect::Follow { active: Some(1) }]);
        assert_eq!(roles.role_name(), RoleName::Standby);
        assert!(
            !roles.beat().synced,
            "it has no state yet: it must not serve"
        );
    }

    #[test]
    fn on_a_cold_start_the_highest_priority_node_wins() {
        let mut n0 = Roles::new(0, 3, DETECT, 500, 0);
        let mut n2 = Roles::new(2, 3, DETECT, 500, 0);
        n0.handle_beat(1, 1, discovering());
        assert_eq!(
            n0.handle_beat(2, 2, discovering()),
            vec![RoleEffect::BecomeActive]
        );
        n2.handle_beat(1, 1, discovering());
        assert_eq!(
            n2.handle_beat(2, 0, discovering()),
            vec![RoleEffect::Follow { active: None }]
        );
        assert_eq!(n2.role_name(), RoleName::Standby);
        assert_eq!(
            n2.handle_beat(3, 0, active()),
            vec![RoleEffect::Follow { active: Some(0) }]
        );
    }

    #[test]
    fn the_next_standby_in_priority_promotes_when_the_active_dies() {
        let mut n1 = Roles::new(1, 3, DETECT, 500, 0);
        let mut n2 = Roles::new(2, 3, DETECT, 500, 0);
        for (roles, me) in [(&mut n1, 1), (&mut n2, 2)] {
            roles.handle_beat(0, 0, active());
            roles.handle_synced(1, 0);
            let other = 3 - me;
            roles.handle_beat(2, other, standby_of(0));
        }
        // The active's heartbeats stop; n2 hears n1 still.
        n1.handle_beat(500, 2, standby_of(0));
        n2.handle_beat(500, 1, standby_of(0));
        assert!(n1.poll(999).is_empty(), "not before the detection time");
        assert_eq!(n1.poll(1000), vec![RoleEffect::BecomeActive]);
        assert_eq!(n2.poll(1000), vec![RoleEffect::Follow { active: None }]);
        assert_eq!(
            n2.handle_beat(1001, 1, active()),
            vec![RoleEffect::Follow { active: Some(1) }]
        );
    }

    #[test]
    fn a_killed_active_is_replaced_at_once_when_its_port_refuses() {
        let mut n1 = Roles::new(1, 2, DETECT, 500, 0);
        n1.handle_beat(0, 0, active());
        n1.handle_synced(1, 0);
        assert_eq!(n1.handle_peer_dead(50, 0), vec![RoleEffect::BecomeActive]);
    }

    #[test]
    fn a_node_without_state_never_wins_over_one_with_state() {
        // n0 restarted (no state) while n1 was a synced standby of a dead n2.
        let mut n0 = Roles::new(0, 3, DETECT, 500, 0);
        let mut n1 = Roles::new(1, 3, DETECT, 500, 0);
        n1.handle_beat(0, 2, active());
        n1.handle_synced(0, 2);
        n1.handle_beat(5, 0, beat(RoleName::Discovering, None, false, false));
        n0.handle_beat(10, 1, beat(RoleName::Standby, None, false, true));
        assert_eq!(
            n0.handle_peer_dead(11, 2),
            vec![RoleEffect::Follow { active: None }]
        );
        assert_ne!(n0.role_name(), RoleName::Active);
        assert_eq!(n1.handle_peer_dead(12, 2), vec![RoleEffect::BecomeActive]);
    }

    #[test]
    fn a_higher_priority_standby_takes_over_by_an_orderly_handoff() {
        let mut n1 = Roles::new(1, 2, DETECT, 500, 0);
        n1.handle_peer_dead(0, 0);
        assert_eq!(n1.role_name(), RoleName::Active);
        // n0 comes back: first it follows without state; nothing happens.
        assert!(
            n1.handle_beat(100, 0, beat(RoleName::Standby, Some(1), false, false))
                .is_empty()
        );
        // Once it has n1's whole state, n1 hands over.
        assert_eq!(
            n1.handle_beat(200, 0, standby_of(1)),
            vec![RoleEffect::StartTransfer { to: 0 }]
        );
        assert_eq!(n1.role_name(), RoleName::HandingOff);
        assert_eq!(
            n1.handle_took(210, 0),
            vec![RoleEffect::FinishTransfer { to: 0 }]
        );
        assert_eq!(n1.role_name(), RoleName::Standby);
        assert_eq!(n1.following(), Some(0));

        let mut n0 = Roles::new(0, 2, DETECT, 500, 0);
        n0.handle_beat(100, 1, active());
        n0.handle_synced(150, 1);
        assert_eq!(
            n0.handle_handoff(205, 1),
            vec![RoleEffect::BecomeActive, RoleEffect::SendTook { to: 1 }]
        );
        assert_eq!(n0.role_name(), RoleName::Active);
    }

    #[test]
    fn a_handoff_without_confirmation_is_abandoned() {
        let mut n1 = Roles::new(1, 2, DETECT, 500, 0);
        n1.handle_peer_dead(0, 0);
        n1.handle_beat(100, 0, standby_of(1));
        n1.handle_beat(900, 0, standby_of(1));
        assert_eq!(n1.poll(1100), vec![RoleEffect::AbortTransfer]);
        assert_eq!(n1.role_name(), RoleName::Active);
    }

    #[test]
    fn a_handoff_is_not_taken_by_a_node_without_the_state() {
        let mut n0 = Roles::new(0, 2, DETECT, 500, 0);
        n0.handle_beat(0, 1, active());
        assert!(n0.handle_handoff(1, 1).is_empty());
        assert_eq!(n0.role_name(), RoleName::Standby);
    }

    #[test]
    fn the_lower_priority_active_steps_back_when_both_are_active() {
        // n1 promoted while n0 was stopped; n0 comes back still active.
        let mut n1 = Roles::new(1, 2, DETECT, 500, 0);
        n1.handle_peer_dead(0, 0);
        assert_eq!(n1.role_name(), RoleName::Active);
        assert_eq!(
            n1.handle_beat(5000, 0, active()),
            vec![RoleEffect::Follow { active: Some(0) }]
        );
        let mut n0 = Roles::new(0, 2, DETECT, 500, 0);
        n0.handle_peer_dead(0, 1);
        assert!(
            n0.handle_beat(5000, 1, active()).is_empty(),
            "the higher one stays"
        );
        assert_eq!(n0.role_name(), RoleName::Active);
    }

    #[test]
    fn graceful_shutdown_hands_over_to_the_best_synced_standby_then_exits() {
        let mut n0 = Roles::new(0, 3, DETECT, 500, 0);
        n0.handle_peer_dead(0, 1);
        n0.handle_peer_dead(0, 2);
        assert_eq!(n0.role_name(), RoleName::Active);
        n0.handle_beat(10, 2, standby_of(0));
        n0.handle_beat(10, 1, beat(RoleName::Standby, Some(0), false, false));
        assert_eq!(
            n0.handle_shutdown(20),
            vec![RoleEffect::StartTransfer { to: 2 }]
        );
        assert_eq!(
            n0.handle_took(25, 2),
            vec![RoleEffect::FinishTransfer { to: 2 }, RoleEffect::Exit]
        );
    }

    #[test]
    fn a_standby_that_refused_its_actives_state_is_neither_handed_the_role_nor_preferred() {
        // Node 1 (ranked above node 2) follows node 0 and took its snapshot,
        // then refused part of its state (past its --max-keys, say).
        let mut n1 = Roles::new(1, 3, DETECT, 500, 0);
        n1.handle_beat(1, 0, beat(RoleName::Active, None, false, true));
        assert_eq!(n1.following(), Some(0));
        n1.handle_synced(2, 0);
        assert!(n1.beat().synced && n1.beat().has_state);
        n1.handle_state_refused();
        assert!(!n1.beat().synced, "not counted, not a successor");
        assert!(!n1.beat().has_state, "not preferred in an election");
        n1.handle_handoff(3, 0);
        assert_eq!(n1.role_name(), RoleName::Standby, "not handed the role");
        // Node 0 goes silent; node 2 holds its state: node 2 is elected,
        // not node 1.
        n1.handle_beat(4, 2, standby_of(0));
        let effects = n1.poll(2 + DETECT);
        assert!(!effects.contains(&RoleEffect::BecomeActive), "{effects:?}");
        // A snapshot it could take makes it a holder again.
        let mut n1 = Roles::new(1, 2, DETECT, 500, 0);
        n1.handle_beat(1, 0, beat(RoleName::Active, None, false, true));
        n1.handle_synced(2, 0);
        n1.handle_state_refused();
        n1.handle_synced(3, 0);
        assert!(n1.beat().synced && n1.beat().has_state);
        // Its active just found dead (it follows no one), then the refusal
        // comes through: it holds no state all the same.
        // Node 2, ranked below node 1 (which holds the state too), waits
        // for the election.
        let mut n2 = Roles::new(2, 3, DETECT, 500, 0);
        n2.handle_beat(1, 0, beat(RoleName::Active, None, false, true));
        n2.handle_synced(2, 0);
        n2.handle_beat(3, 1, standby_of(0));
        n2.handle_peer_dead(4, 0);
        assert_eq!(n2.following(), None);
        assert!(!n2.role_name().is_active());
        assert!(n2.beat().has_state);
        n2.handle_state_refused();
        assert!(!n2.beat().has_state, "not preferred in the election");
        // An active node keeps serving what it has.
        let mut n0 = Roles::new(0, 1, DETECT, 500, 0);
        assert_eq!(n0.poll(0), vec![RoleEffect::BecomeActive]);
        n0.handle_state_refused();
        assert_eq!(n0.role_name(), RoleName::Active);
    }

    #[test]
    fn a_standby_in_the_middle_of_a_snapshot_is_neither_handed_the_role_nor_preferred() {
        // Node 1 (ranked above node 2) follows node 0 and held its state;
        // node 0 sends it a fresh snapshot, in pieces.
        let mut n1 = Roles::new(1, 3, DETECT, 500, 0);
        n1.handle_beat(1, 0, beat(RoleName::Active, None, false, true));
        n1.handle_synced(2, 0);
        assert!(n1.beat().synced && n1.beat().has_state);
        // A snapshot from a node it does not follow changes nothing.
        n1.handle_snapshot_begun(2);
        assert!(n1.beat().synced && n1.beat().has_state);
        n1.handle_snapshot_begun(0);
        assert!(!n1.beat().synced, "not counted, not a successor");
        assert!(!n1.beat().has_state, "not preferred in an election");
        n1.handle_handoff(3, 0);
        assert_eq!(n1.role_name(), RoleName::Standby, "not handed the role");
        // Node 0 goes silent; node 2 holds its whole state: node 2 is
        // elected, not node 1 with its part of it.
        n1.handle_beat(4, 2, standby_of(0));
        let effects = n1.poll(2 + DETECT);
        assert!(!effects.contains(&RoleEffect::BecomeActive), "{effects:?}");
        // Alone, it is promoted with what it has.
        let mut n1 = Roles::new(1, 2, DETECT, 500, 0);
        n1.handle_beat(1, 0, beat(RoleName::Active, None, false, true));
        n1.handle_snapshot_begun(0);
        let effects = n1.handle_peer_dead(5, 0);
        assert!(effects.contains(&RoleEffect::BecomeActive), "{effects:?}");
    }

    #[test]
    fn a_node_that_handed_over_to_shut_down_is_never_handed_the_role_back() {
        // Node 0 hands over to node 1 and waits to exit; node 1, now
        // active, sends it a snapshot as to any follower.
        let mut n0 = Roles::new(0, 2, DETECT, 500, 0);
        n0.handle_peer_dead(0, 1);
        n0.handle_beat(10, 1, standby_of(0));
        assert_eq!(
            n0.handle_shutdown(20),
            vec![RoleEffect::StartTransfer { to: 1 }]
        );
        assert_eq!(
            n0.handle_took(25, 1),
            vec![RoleEffect::FinishTransfer { to: 1 }, RoleEffect::Exit]
        );
        n0.handle_synced(30, 1);
        assert!(!n0.beat().synced, "it must not look like a successor");
        assert!(!n0.beat().has_state, "nor like a node to elect");
        // Even handed the role, it does not take it; nor is it elected when
        // the new active goes silent.
        n0.handle_handoff(31, 1);
        assert_eq!(n0.role_name(), RoleName::Standby);
        assert!(
            !n0.poll(31 + 3 * DETECT).contains(&RoleEffect::BecomeActive),
            "a node on its way out is not elected"
        );
    }

    #[test]
    fn when_the_successor_dies_before_the_old_active_exits_the_next_node_is_elected() {
        // Node 0 handed over to node 1 and is on its way out (it says it
        // holds no state); node 1 dies; node 2, synced, must not wait for
        // node 0, which ranks higher but will never serve.
        // Node 0 restarted, followed node 1 and took the role back by
        // handoff: it holds the state.
        let mut n0 = Roles::new(0, 3, DETECT, 500, 0);
        n0.handle_beat(1, 1, active());
        n0.handle_synced(2, 1);
        n0.handle_handoff(3, 1);
        assert_eq!(n0.role_name(), RoleName::Active);
        n0.handle_beat(10, 1, standby_of(0));
        n0.handle_beat(10, 2, standby_of(0));
        assert_eq!(
            n0.handle_shutdown(20),
            vec![RoleEffect::StartTransfer { to: 1 }]
        );
        n0.handle_took(25, 1);
        let mut n2 = Roles::new(2, 3, DETECT, 500, 0);
        n2.handle_beat(30, 1, active());
        n2.handle_synced(31, 1);
        n2.handle_beat(32, 0, n0.beat());
        assert_eq!(n2.handle_peer_dead(40, 1), vec![RoleEffect::BecomeActive]);
    }

    #[test]
    fn a_lower_priority_successor_stays_active_after_taking_the_role_over() {
        // Node 1 follows node 0, synced; node 0 shuts down and hands over.
        let mut n1 = Roles::new(1, 2, DETECT, 500, 0);
        n1.handle_beat(1, 0, active());
        n1.handle_synced(2, 0);
        n1.handle_beat(3, 0, beat(RoleName::HandingOff, None, false, true));
        assert_eq!(
            n1.handle_handoff(4, 0),
            vec![RoleEffect::BecomeActive, RoleEffect::SendTook { to: 0 }]
        );
        assert_eq!(n1.role_name(), RoleName::Active);
        assert!(n1.poll(5).is_empty(), "it does not step back to node 0");
        // Node 0's heartbeats sent before it heard `Took` come after the
        // handoff on the same link: they say handing-off, and change
        // nothing.
        assert!(
            n1.handle_beat(6, 0, beat(RoleName::HandingOff, None, false, true))
                .is_empty()
        );
        assert_eq!(n1.role_name(), RoleName::Active);
        // Once node 0 says anything else, it counts again: an abandoned
        // transfer makes it active, and the higher node leads.
        n1.handle_beat(7, 0, beat(RoleName::Standby, Some(1), false, false));
        assert_eq!(n1.role_name(), RoleName::Active);
        n1.handle_beat(8, 0, active());
        assert_eq!(n1.role_name(), RoleName::Standby);
        assert_eq!(n1.following(), Some(0));
    }

    #[test]
    fn graceful_shutdown_without_a_standby_exits_at_once() {
        let mut n0 = Roles::new(0, 2, DETECT, 500, 0);
        n0.handle_peer_dead(0, 1);
        assert_eq!(n0.handle_shutdown(1), vec![RoleEffect::Exit]);
        let mut standby = Roles::new(1, 2, DETECT, 500, 0);
        standby.handle_beat(0, 0, active());
        assert_eq!(standby.handle_shutdown(1), vec![RoleEffect::Exit]);
    }

    #[test]
    fn a_standby_whose_active_vanishes_answers_no_active_until_one_is_elected() {
        let mut n2 = Roles::new(2, 3, DETECT, 500, 0);
        n2.handle_beat(0, 0, active());
        n2.handle_synced(0, 0);
        n2.handle_beat(0, 1, standby_of(0));
        n2.handle_beat(600, 1, standby_of(0));
        assert_eq!(n2.poll(1000), vec![RoleEffect::Follow { active: None }]);
        assert_eq!(n2.active(), None);
        assert!(n2.poll(1001).is_empty());
    }

    #[test]
    fn no_election_runs_past_a_peer_known_up_until_it_is_heard_or_detect_passes() {
        // Node 2 follows node 0, synced; node 1 answered node 2's dial at
        // `proved` (its link proved it up) but its own link, which carries
        // its heartbeats, is not up yet. Node 0 dies just after.
        let proved_then_active_dies = |heard_1: Option<u64>, proved: u64| {
            let mut n2 = Roles::new(2, 3, DETECT, 500, 0);
            n2.handle_beat(0, 0, active());
            n2.handle_synced(1, 0);
            if let Some(at) = heard_1 {
                n2.handle_beat(at, 1, standby_of(0));
                n2.handle_beat(proved - 10, 0, active());
            }
            n2.handle_link_proved(proved, 1);
            assert_eq!(
                n2.handle_peer_dead(proved + 1, 0),
                vec![RoleEffect::Follow { active: None }],
                "node 1 may rank higher and hold the state: no election yet"
            );
            n2
        };
        let mut n2 = proved_then_active_dies(None, 10);
        assert!(n2.poll(500).is_empty());
        assert!(n2.next_wake_ms(500) <= 10 + DETECT);
        // Its first heartbeat says it holds the state: it is elected, not
        // node 2.
        assert!(n2.handle_beat(600, 1, standby_of(0)).is_empty());
        assert_ne!(n2.role_name(), RoleName::Active);

        // Unheard for `detect_ms` after its link proved it: the election
        // goes on without it.
        let mut n2 = proved_then_active_dies(None, 10);
        assert!(n2.poll(10 + DETECT - 1).is_empty());
        assert_eq!(n2.poll(10 + DETECT), vec![RoleEffect::BecomeActive]);

        // A peer heard before its link proved it again is waited for too;
        // one found dead since is not.
        let mut n2 = proved_then_active_dies(Some(0), 2000);
        assert_ne!(n2.role_name(), RoleName::Active);
        assert_eq!(n2.handle_peer_dead(2002, 1), vec![RoleEffect::BecomeActive]);

        // An active whose higher peer died and restarted: the link proving
        // it up revives nothing of what it said before it died (it said
        // `active`; following that would hand the role to a node that just
        // started, and lose the grants made meanwhile).
        let mut n1 = Roles::new(1, 2, DETECT, 500, 0);
        n1.handle_beat(0, 0, active());
        n1.handle_synced(1, 0);
        assert_eq!(n1.handle_peer_dead(100, 0), vec![RoleEffect::BecomeActive]);
        n1.handle_link_proved(200, 0);
        assert!(n1.poll(201).is_empty());
        assert_eq!(n1.role_name(), RoleName::Active);
    }

    #[test]
    fn next_wake_is_never_past_a_peer_expiry() {
        let mut n1 = Roles::new(1, 2, DETECT, 500, 0);
        n1.handle_beat(100, 0, active());
        assert!(n1.next_wake_ms(200) <= 1100);
    }

    #[test]
    fn input_not_read_yet_keeps_a_heard_peer_live_but_revives_no_dead_one() {
        let mut n1 = Roles::new(1, 3, DETECT, 500, 0);
        n1.handle_beat(0, 0, active());
        n1.handle_heard(900, 0);
        assert!(n1.is_live(0, 1500), "live as of 900");
        assert!(n1.poll(1500).is_empty());
        // Never heard: held input does not make it a peer with a role.
        n1.handle_heard(900, 2);
        assert!(!n1.is_live(2, 900));
        // Found dead (its port refused): it stays dead until it speaks.
        n1.handle_peer_dead(1600, 0);
        n1.handle_heard(1601, 0);
        assert!(!n1.is_live(0, 1601));
    }
}
