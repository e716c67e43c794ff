//! The links peers open to this node: opened, authenticated (which peer it
//! is), rejected, held back while the lock owner is behind, closed.

use super::*;

/// Why an incoming link goes, as far as redialing its peer goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum InDrop {
    /// It closed or failed (the shell's report), or took too long to prove
    /// the key.
    Closed,
    /// It carried nothing for two heartbeat periods (a partition, a blip).
    Silent,
    /// This node refused what came on it, or its lock owner refused the
    /// state it carried.
    Refused,
}

#[derive(Debug, Default)]
pub(super) struct InLink {
    /// The peer it proved to be; None while the handshake runs.
    pub(super) peer: Option<usize>,
    pub(super) opened_ms: u64,
    /// When it last carried a message (its handshake, at first).
    pub(super) heard_ms: u64,
    /// A snapshot is being received (its entries so far: they go to the
    /// lock owner as they come, with the deltas between them).
    pub(super) snapshot: Option<usize>,
    /// Entries of that snapshot left out: their tokens are beyond this
    /// node's window.
    pub(super) left_out: usize,
    /// The `seq` of the snapshot it carried to the lock owner, if any
    /// (what a `StateRefused` names).
    pub(super) snapshot_seq: Option<u64>,
}

impl ClusterCore {
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
        self.dial_back_now(now, from);
    }

    /// `p` just dialed this node, so it is up and listening: this node's
    /// own link to it, if down and backing off after failed dials (`p`
    /// started after this node, say), is dialed now instead of after the
    /// backoff (up to `--detect`/2). Until it is up, `p` hears no
    /// heartbeat of this node, and counts it as dead: were `p`'s active to
    /// die then, `p` would elect itself over this node, a split brain in a
    /// cluster's first second. A link dropping over refused state
    /// (`flaps`) keeps its backoff: that is what bounds a refusal loop.
    fn dial_back_now(&mut self, now: Now, p: usize) {
        let Some(out) = self.outs.get_mut(p) else {
            return;
        };
        if let OutState::Down { retry_at_ms } = out.state
            && retry_at_ms > now.ms
            && out.flaps == 0
        {
            out.state = OutState::Down {
                retry_at_ms: now.ms,
            };
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
    pub(super) fn in_closed(&mut self, now: Now, link: LinkId, why: &str, cause: InDrop) {
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
        self.reset_snapshot(p);
    }

    /// A line on incoming link `link` that did not parse.
    pub fn handle_in_malformed(&mut self, now: Now, link: LinkId) {
        self.drop_in(now, link, "a line not understood", InDrop::Refused);
    }

    pub(super) fn drop_in(&mut self, now: Now, link: LinkId, why: &str, cause: InDrop) {
        if self.ins.contains_key(&link) {
            self.effects.push(ClusterEffect::DropIn { link });
            self.in_closed(now, link, why, cause);
        }
    }
}
