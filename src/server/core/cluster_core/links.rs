//! This node's outgoing links: dialing each peer, the handshake deadline,
//! the backoff after a failed dial or a dropped link (longer when the peer
//! keeps refusing this node's state), and a link going down.

use super::*;

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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OutState {
    Down { retry_at_ms: u64 },
    Dialing { since_ms: u64 },
    Up,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct OutLink {
    pub(super) state: OutState,
    /// Dials that failed in a row (the backoff's exponent).
    pub(super) failures: u32,
    pub(super) warn: RateLimit,
    /// When the link last came up.
    pub(super) up_since_ms: u64,
    /// Links with this peer dropped in a row over refused state, none of
    /// them up for `--detect` ([`ClusterCore::redial_after_drop`]).
    pub(super) flaps: u32,
    pub(super) flap_warn: RateLimit,
    /// The peer has this node's snapshot on this link (all of it).
    pub(super) snap_sent: bool,
    /// A snapshot was asked of the lock owner (`snap_ask`) and its first
    /// piece has not come yet.
    pub(super) snap_pending: bool,
    /// A snapshot is going out in pieces on this link: begun, not ended.
    /// The deltas go to the link meanwhile, in order with the pieces.
    pub(super) snap_streaming: bool,
    /// The last snapshot asked for this peer (pieces of an older one are
    /// stale), and the grants and pieces of the one going out.
    pub(super) snap_ask: u64,
    pub(super) snap_entries: usize,
    pub(super) snap_pieces: u32,
    /// When the snapshot went out.
    pub(super) snap_sent_ms: u64,
    /// Snapshots sent again in a row on this link without the peer saying
    /// it took one (the exponent of the resend wait).
    pub(super) resends: u32,
}

impl ClusterCore {
    /// A link to `p` after drops over refused state has now been up for
    /// `--detect`: it is healthy again (its next drop is redialed at once,
    /// and its lines go back to info).
    pub(super) fn maybe_healthy(&mut self, p: usize, now: Now) {
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
    pub(super) fn expire_handshakes(&mut self, now: Now) {
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
        out.resends = 0;
        self.reset_snapshot(p);
        // `p` answered: it is alive, its heartbeats (on its own link to
        // this node) on the way; no election runs past it meanwhile.
        self.roles.handle_link_proved(now.ms, p);
        self.send_beats();
    }

    /// The wait before the next dial after `failures` failures in a row:
    /// doubling from RECONNECT_MS, capped, with ±25% jitter so that nodes
    /// do not dial in lockstep.
    pub(super) fn backoff_ms(&mut self, failures: u32, why: OutDown) -> u64 {
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
    pub(super) fn flap_backoff_ms(&mut self, flaps: u32) -> u64 {
        let cap = self.detect_ms / 2;
        self.backoff_ms(flaps.saturating_sub(1), OutDown::Refused)
            .min(cap)
    }

    /// Did the peer refuse the state this node sent on its link to `p`?
    /// This node is active and sent its snapshot on that link, and `p` has
    /// not said it holds that state since: a drop now is `p` refusing it
    /// (a lower `--max-keys` or `--max-lease`), or a drop in the middle of
    /// a snapshot (counted the same: only the second in a row backs off).
    pub(super) fn peer_refusing(&self, p: usize) -> bool {
        self.outs
            .get(p)
            .is_some_and(|o| o.snap_sent || o.snap_streaming)
            && self.roles.role_name().is_active()
            && !self
                .roles
                .peer_beat(p)
                .is_some_and(|b| b.synced && b.following == Some(self.me))
    }

    /// Is the outgoing link to `p` up, and since less than `--detect`?
    pub(super) fn out_young(&self, p: usize, now: Now) -> bool {
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
    pub(super) fn redial_after_drop(&mut self, now: Now, p: usize, refused: bool) -> u64 {
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
        self.reset_snapshot(p);
        let out = &mut self.outs[p];
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
}
