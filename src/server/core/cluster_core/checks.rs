//! The checks every peer message passes before anything of it is used:
//! tokens and ceilings within the clock window, leases within
//! `--max-lease`, semaphore limits and slots in range; a [`Verdict`] each.
//! (What a snapshot may grow to, `--max-keys`, is the lock owner's bound,
//! on apply: nothing of it gathers here.)

use super::*;

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

impl ClusterCore {
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
                } else if too_far(*token) {
                    Verdict::BeyondWindow
                } else {
                    Verdict::Accept
                }
            }
            PeerMsg::Delta(Delta::Free { slot, .. }) if *slot >= MAX_LIMIT => {
                Verdict::Refuse("a slot at or above its key's limit")
            }
            PeerMsg::Delta(Delta::Free { token, .. } | Delta::Ceiling(token)) => {
                // Inside a snapshot too: its pieces and the active's deltas
                // between them come in the active's order. What a snapshot
                // may grow to is the lock owner's bound (`--max-keys`, on
                // apply): nothing of it is gathered here.
                if *token == 0 {
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
    pub(super) fn warn_beyond_window(&mut self, now: Now, p: usize, msg: &PeerMsg) {
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
}
