//! The replication stream: heartbeats, deltas and snapshots from the
//! active applied in order, this node's snapshots and deltas sent to its
//! followers, state refusals, and the handoff of the active role.

use super::*;

impl ClusterCore {
    /// One message on incoming link `link`.
    pub fn handle_peer_msg(&mut self, now: Now, link: LinkId, msg: PeerMsg) {
        let verdict = self.check_peer_msg(now, link, &msg);
        if let Verdict::Refuse(why) = verdict {
            return self.refuse_peer_msg(now, link, why);
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
            } => self.beat_in(now, p, beat, last_token, ceiling, from_my_active),
            PeerMsg::SnapshotBegin if from_my_active => self.snapshot_begun(link, p),
            PeerMsg::Delta(_) if from_my_active && beyond => {
                // Not applied: this node cannot take its token. It no
                // longer holds (or will not hold) the active's whole state.
                match self.ins.get_mut(&link) {
                    Some(l) if l.snapshot.is_some() => l.left_out += 1,
                    _ => self.roles.handle_state_lost(p),
                }
            }
            PeerMsg::Delta(delta) if from_my_active => self.delta_in(now, link, delta),
            PeerMsg::SnapshotEnd if from_my_active => self.snapshot_ended(link, p),
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

    /// A message the checks refused: warn (rate-limited), give up the
    /// active's state if it came from the node this one follows or takes a
    /// snapshot from, and drop the link.
    fn refuse_peer_msg(&mut self, now: Now, link: LinkId, why: &'static str) {
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
        self.drop_in(now, link, why, InDrop::Refused);
    }

    /// A heartbeat of peer `p`: the token floor it tells, its role for the
    /// roles, and (from the active this node follows) the mark up to which
    /// the state is current.
    fn beat_in(
        &mut self,
        now: Now,
        p: usize,
        beat: Beat,
        last_token: u64,
        ceiling: u64,
        from_my_active: bool,
    ) {
        if beat.following != Some(self.me) {
            // Whatever it had from this node is stale now (it may
            // follow this node again by its very next heartbeat).
            self.reset_snapshot(p);
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

    /// The active this node follows starts a snapshot on `link`.
    fn snapshot_begun(&mut self, link: LinkId, p: usize) {
        self.snapshot_ending = None;
        // The table is emptied now and filled as the pieces and the
        // deltas between them come: until the end this node holds
        // part of its active's state, and says so.
        self.flush_deltas_in();
        self.roles.handle_snapshot_begun(p);
        log::debug!("replication: taking a snapshot from {}", self.names[p]);
        self.pass_snapshot(link, p, Vec::new());
        if let Some(l) = self.ins.get_mut(&link) {
            l.snapshot = Some(0);
            l.left_out = 0;
        }
    }

    /// A delta (or a snapshot's grant) from the active: batched for the
    /// lock owner.
    fn delta_in(&mut self, now: Now, link: LinkId, delta: Delta) {
        if let Some(entries) = self.ins.get_mut(&link).and_then(|l| l.snapshot.as_mut()) {
            *entries = entries.saturating_add(1);
        }
        self.deltas_in_since_ms.get_or_insert(now.ms);
        self.deltas_in.push(delta);
        if self.deltas_in.len() >= APPLY_BATCH_MAX {
            self.flush_deltas_in();
        }
    }

    /// The active's snapshot on `link` ended: the lock owner is asked to
    /// confirm it applied it all, unless grants were left out.
    fn snapshot_ended(&mut self, link: LinkId, p: usize) {
        let Some(l) = self.ins.get_mut(&link) else {
            return;
        };
        let left = std::mem::take(&mut l.left_out);
        let Some(entries) = l.snapshot.take() else {
            return;
        };
        self.flush_deltas_in();
        if left > 0 {
            // What it could take replaced the table (closer to
            // the active's than what it had), but it does not
            // hold the active's state.
            log::warn!(
                "replication: snapshot of {entries} entries from {}, {left} more left \
                 out (tokens beyond this node's clock window): this node does not \
                 hold its state",
                self.names[p]
            );
            self.roles.handle_state_lost(p);
            return;
        }
        log::info!(
            "replication: snapshot of {entries} entries from {}",
            self.names[p]
        );
        // The lock owner has applied it all (`SnapshotTaken`)
        // or refused part of it (`StateRefused`) once it reaches
        // this mark: only the first makes this node hold the
        // state.
        self.snapshot_ending = Some((link, p, self.snapshot_seq));
        self.tell_table(ClusterToTable::SnapshotEnd {
            seq: self.snapshot_seq,
        });
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
    pub(super) fn handle_state_refused(&mut self, now: Now, why: &str, snapshot: u64) {
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
    pub(super) fn pass_snapshot(&mut self, link: LinkId, p: usize, entries: Vec<Delta>) {
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

    /// The lock owner applied the whole snapshot numbered `seq` with
    /// nothing refused: if it is the one this node's active last sent, on
    /// a link still up, this node holds its state.
    pub(super) fn handle_snapshot_taken(&mut self, now: Now, seq: u64) {
        let Some((link, p, ending)) = self.snapshot_ending.take() else {
            return;
        };
        if ending != seq
            || self.roles.following() != Some(p)
            || self.ins.get(&link).is_none_or(|l| l.peer != Some(p))
        {
            return;
        }
        let effects = self.roles.handle_synced(now.ms, p);
        self.apply_role_effects(now, effects);
        self.heard_active_ms = now.ms;
        // Tell every peer at once that this node now holds the state: the
        // active may transfer its role to it, and it must win an election
        // from now on.
        self.send_beats();
    }

    /// A piece of the snapshot asked for `peer` (`ask`): the first
    /// (`ceiling`) begins it on the link, after the deltas that went
    /// before (which the standby's emptied table forgets), the last ends
    /// it; from the first on, the deltas go to the link too, in the lock
    /// owner's order with the pieces. A piece of an older ask, or for a
    /// link that is down or no longer waits for it, is dropped (the link's
    /// next snapshot starts afresh).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn send_chunk(
        &mut self,
        now: Now,
        peer: usize,
        ask: u64,
        ceiling: Option<u64>,
        held: usize,
        entries: Vec<Delta>,
        last: bool,
    ) {
        let active = self.roles.role_name().is_active();
        let Some(out) = self.outs.get_mut(peer) else {
            return;
        };
        if out.state != OutState::Up || !active || out.snap_ask != ask {
            return;
        }
        match ceiling {
            Some(ceiling) if out.snap_pending => {
                out.snap_pending = false;
                out.snap_streaming = true;
                out.snap_entries = 0;
                out.snap_pieces = 0;
                self.log_link(
                    peer,
                    format_args!(
                        "sending a snapshot of {held} keys to {}, in pieces",
                        self.names[peer]
                    ),
                );
                self.send(peer, PeerMsg::SnapshotBegin);
                self.send(peer, PeerMsg::Delta(Delta::Ceiling(ceiling)));
            }
            None if out.snap_streaming => {}
            _ => return,
        }
        let out = &mut self.outs[peer];
        out.snap_entries = out.snap_entries.saturating_add(entries.len());
        out.snap_pieces = out.snap_pieces.saturating_add(1);
        for entry in entries {
            self.send(peer, PeerMsg::Delta(entry));
        }
        if last {
            self.send(peer, PeerMsg::SnapshotEnd);
            let out = &mut self.outs[peer];
            out.snap_streaming = false;
            out.snap_sent = true;
            out.snap_sent_ms = now.ms;
            let (entries, pieces) = (out.snap_entries, out.snap_pieces);
            self.log_link(
                peer,
                format_args!(
                    "sent a snapshot of {entries} grants to {} in {pieces} pieces",
                    self.names[peer]
                ),
            );
        }
    }

    /// `p`'s link no longer carries this node's state (it went, or `p`
    /// follows another node, or this node no longer leads): what it had
    /// is stale, and a snapshot asked or going out for it stops.
    pub(super) fn reset_snapshot(&mut self, p: usize) {
        let Some(out) = self.outs.get_mut(p) else {
            return;
        };
        let stop = out.snap_pending || out.snap_streaming;
        out.snap_sent = false;
        out.snap_pending = false;
        out.snap_streaming = false;
        if stop {
            self.tell_table(ClusterToTable::SnapshotStop { peer: p });
        }
    }

    /// Ask the lock owner for a snapshot for `p` when `p` follows this
    /// active node and has none on its current link.
    pub(super) fn maybe_ask_snapshot(&mut self, p: usize, now: Now) {
        let beat = self.roles.peer_beat(p);
        let follows_me = beat.is_some_and(|b| b.following == Some(self.me));
        let active = self.roles.role_name().is_active();
        if !follows_me || !active {
            self.reset_snapshot(p);
            return;
        }
        let out = &mut self.outs[p];
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
        if out.snap_sent || out.snap_pending || out.snap_streaming || out.state != OutState::Up {
            return;
        }
        out.snap_pending = true;
        out.snap_ask = out.snap_ask.wrapping_add(1);
        let ask = out.snap_ask;
        self.tell_table(ClusterToTable::SnapshotWanted { peer: p, ask });
    }

    pub(super) fn flush_deltas_in(&mut self) {
        self.deltas_in_since_ms = None;
        if !self.deltas_in.is_empty() {
            let deltas = std::mem::take(&mut self.deltas_in);
            self.tell_table(ClusterToTable::Deltas(deltas));
        }
    }
}
