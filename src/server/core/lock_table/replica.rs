//! The replica side of the table: the changes an active records for its
//! standbys and takes as a batch of [`Delta`]s, the snapshot of every live
//! grant, and a standby applying deltas and snapshots (refusing what would
//! break an invariant).

use super::*;

impl LockTable {
    /// Record changes for the standbys from now on (an active cluster
    /// node), or stop: then the changes not taken yet are dropped.
    pub fn set_replicating(&mut self, on: bool) {
        if !on {
            self.discard_changes();
        }
        self.replicate = on;
    }

    /// Changes are waiting to be taken by [`LockTable::take_deltas`].
    pub fn has_changes(&self) -> bool {
        !self.changes.is_empty()
    }

    /// What the changes recorded so far are worth: see [`Ready`].
    pub fn changes_ready(&self) -> Ready {
        Ready {
            urgent: self.urgent > 0,
            young: self.young,
            oldest_young_ms: self.first_young_ms,
            ceiling: self.ceilings > 0,
            settled: self.changes.len() > self.young + self.urgent + self.ceilings,
        }
    }

    /// The changes since the last call, as the deltas a standby applies to
    /// end in this table's state: one per key that changed (its state now),
    /// none for a key granted and freed in between that the standbys never
    /// held, and the ceilings raised, in the order of each key's first
    /// change. A grant's lease left is counted from `now_ms`, which must be
    /// the time requests are stamped with (`Now::ms_ceil`), so that it is
    /// never more than the lease granted.
    ///
    /// The grant of a key new to the standbys that is younger than
    /// `hold_young_ms` stays for the next call: most short locks are freed
    /// by then and never cost the standbys a line (0 takes everything).
    pub fn take_deltas(&mut self, now_ms: u64, hold_young_ms: u64) -> Vec<Delta> {
        let mut deltas = Vec::with_capacity(self.changes.len());
        let mut kept = std::mem::take(&mut self.kept);
        for (i, change) in self.changes.drain(..).enumerate() {
            match change {
                Change::Held {
                    slot,
                    new_since: Some(since),
                    ..
                } if now_ms.saturating_sub(since) < hold_young_ms => {
                    self.keys[slot as usize].pending = kept.len() as u32;
                    kept.push(change);
                }
                Change::Held { slot, .. } => {
                    let state = &mut self.keys[slot as usize];
                    debug_assert_eq!(state.pending as usize, i, "a held key's entry");
                    state.pending = NIL;
                    if state.sem == NIL {
                        deltas.push(Delta::grant(
                            state.key.clone(),
                            state.token,
                            state.expiry_ms.saturating_sub(now_ms),
                        ));
                    } else {
                        // Every live grant of the key, read now.
                        let view = KeyView {
                            state,
                            sem: Some(&self.sems[state.sem as usize]),
                        };
                        deltas.extend(view.deltas(now_ms));
                    }
                }
                Change::Freed { key, token, slot } => deltas.push(Delta::Free { key, token, slot }),
                Change::Gone => {}
                Change::Ceiling(ceiling) => deltas.push(Delta::Ceiling(ceiling)),
            }
        }
        // What stays is young grants only, oldest first.
        self.kept = std::mem::replace(&mut self.changes, kept);
        self.young = self.changes.len();
        self.urgent = 0;
        self.ceilings = 0;
        self.first_young_ms = match self.changes.first() {
            Some(Change::Held { new_since, .. }) => *new_since,
            _ => None,
        };
        deltas
    }

    /// Drop the changes not taken (the node stopped serving).
    pub(super) fn discard_changes(&mut self) {
        for change in self.changes.drain(..) {
            if let Change::Held { slot, .. } = change {
                self.keys[slot as usize].pending = NIL;
            }
        }
        self.young = 0;
        self.urgent = 0;
        self.ceilings = 0;
        self.first_young_ms = None;
    }

    /// A ceiling for the standbys (see `TableCore`).
    pub fn note_ceiling(&mut self, ceiling: u64) {
        if self.replicate {
            self.changes.push(Change::Ceiling(ceiling));
            self.ceilings += 1;
        }
    }

    /// Key `idx` was granted, handed over or extended: its entry in the
    /// batch says it is held (`new_at`: the key was not in the table before
    /// and came in at that time).
    ///
    /// One entry per key, whatever its limit: the batch reads all of the
    /// key's live grants when it is taken (a grant handed over in its slot
    /// replaces the slot's older one on the standbys); grants that ended
    /// with nobody waiting are entries of their own ([`Change::Freed`]).
    pub(super) fn note_held(&mut self, idx: u32, new_at: Option<u64>) {
        if !self.replicate {
            return;
        }
        let state = &mut self.keys[idx as usize];
        if state.pending == NIL {
            state.pending = self.changes.len() as u32;
            self.changes.push(Change::Held {
                slot: idx,
                new_since: new_at,
                hot: false,
            });
            match new_at {
                Some(since) => {
                    self.young += 1;
                    self.first_young_ms.get_or_insert(since);
                }
                None => self.urgent += 1,
            }
        } else if let Some(Change::Held {
            new_since: None,
            hot,
            ..
        }) = self.changes.get_mut(state.pending as usize)
            && !*hot
        {
            // Changed again within the batch: no longer urgent.
            *hot = true;
            self.urgent -= 1;
        }
    }

    /// A grant of key `idx`, `token` in `slot`, ended with nobody waiting
    /// and the key keeps other grants: the standbys free it, unless the
    /// key is new to them in this batch (they hold none of it).
    pub(super) fn note_grant_freed(&mut self, idx: u32, token: u64, slot: u32) {
        if !self.replicate {
            return;
        }
        let state = &self.keys[idx as usize];
        if let Some(Change::Held {
            new_since: Some(_), ..
        }) = self.changes.get(state.pending as usize)
        {
            return;
        }
        let key = state.key.clone();
        self.changes.push(Change::Freed { key, token, slot });
    }

    /// A key left the table, its last grant `token` in `slot` until then,
    /// with `pending` its entry in the batch (NIL: none).
    pub(super) fn note_freed(&mut self, key: Key, token: u64, slot: u32, pending: u32) {
        if !self.replicate {
            return;
        }
        match self.changes.get_mut(pending as usize) {
            Some(entry) => {
                *entry = match entry {
                    Change::Held {
                        new_since: Some(_), ..
                    } => {
                        self.young -= 1;
                        Change::Gone
                    }
                    Change::Held {
                        new_since: None,
                        hot: false,
                        ..
                    } => {
                        self.urgent -= 1;
                        Change::Freed { key, token, slot }
                    }
                    _ => Change::Freed { key, token, slot },
                };
            }
            // A promotion-grace placeholder (token 0) was never replicated.
            None if token == 0 => {}
            None => self.changes.push(Change::Freed { key, token, slot }),
        }
    }

    /// A piece of a standby's snapshot: every live grant of the keys in
    /// slots `from..` of the table, as `Delta::Grant`s into `out`, until at
    /// least `max_grants` are in it (a key's grants go in one piece) or
    /// `4 * max_grants` slots were looked at (a table emptied of many keys
    /// costs a piece no more). The slot to go on from, or None at the end.
    ///
    /// A key whose grant waits in the changes as a new key's
    /// (`Change::Held` with `new_since`: not sent to the standbys yet) is
    /// left out: the batch that takes it carries it, or nothing if it is
    /// freed first, so a standby never holds a key whose free no batch
    /// would carry. Every other key is as the standbys must hold it now;
    /// its later changes follow in the batches.
    pub fn snapshot_from(
        &self,
        now_ms: u64,
        from: u32,
        max_grants: usize,
        out: &mut Vec<Delta>,
    ) -> Option<u32> {
        let end = self.keys.capacity();
        let start = out.len();
        let mut idx = from as usize;
        let looks = max_grants.saturating_mul(4).max(1);
        let mut looked = 0;
        while idx < end {
            if out.len() - start >= max_grants || looked >= looks {
                return Some(idx as u32);
            }
            looked += 1;
            if let Some(state) = self.keys.get(idx)
                && !matches!(
                    self.changes.get(state.pending as usize),
                    Some(Change::Held {
                        new_since: Some(_),
                        ..
                    })
                )
            {
                let view = KeyView {
                    state,
                    sem: self.sem(idx as u32),
                };
                out.extend(
                    view.deltas(now_ms)
                        .filter(|d| matches!(d, Delta::Grant { ms_left, .. } if *ms_left > 0)),
                );
            }
            idx += 1;
        }
        None
    }

    /// Every live grant of every key as a `Delta::Grant` (its limit, slot
    /// and value with it), for a standby's snapshot.
    pub fn snapshot(&self, now_ms: u64) -> Vec<Delta> {
        let mut entries = Vec::with_capacity(self.grants);
        for (idx, state) in &self.keys {
            let view = KeyView {
                state,
                sem: self.sem(idx as u32),
            };
            entries.extend(
                view.deltas(now_ms)
                    .filter(|d| matches!(d, Delta::Grant { ms_left, .. } if *ms_left > 0)),
            );
        }
        entries
    }

    /// Apply a delta from the active (on a standby, which has no waiters).
    /// Tokens seen here lift this node's token counter. A grant never moves
    /// a slot's token down (an extension keeps it, a new grant raises it),
    /// never moves a grant to another slot, never names a limit outside
    /// 1..=[`MAX_LIMIT`](crate::protocol::MAX_LIMIT) or a slot at or above
    /// it, and never adds a grant past `max_keys`: such a delta is refused
    /// and changes nothing (Err says why).
    pub fn apply_delta(&mut self, now_ms: u64, delta: Delta) -> Result<(), &'static str> {
        self.apply(now_ms, delta, false)
    }

    /// `apply_delta`; `whole`: the delta is an entry of a snapshot (the
    /// whole table), so a key has one limit and each slot one grant.
    pub(super) fn apply(
        &mut self,
        now_ms: u64,
        delta: Delta,
        whole: bool,
    ) -> Result<(), &'static str> {
        match delta {
            Delta::Grant {
                key,
                token,
                ms_left,
                limit,
                slot,
                value,
            } => {
                grant_fields_sane(limit, slot, token)?;
                let expiry_ms = now_ms.saturating_add(ms_left);
                match self.key_for_grant(&key, limit, whole)? {
                    Ok(idx) => {
                        let at = self.place_for_grant(idx, token, slot, limit, whole)?;
                        if at.is_none() && self.grants >= self.limits.max_keys {
                            return Err("a grant past --max-keys");
                        }
                        self.tokens.observe_granted(token);
                        match at {
                            Some(at) => self.set_grant(idx, at, token, expiry_ms, value),
                            None => self.put_grant(idx, slot, token, expiry_ms, value),
                        }
                        self.holders_changed(idx);
                    }
                    Err(hash) => {
                        if self.grants >= self.limits.max_keys {
                            return Err("a grant past --max-keys");
                        }
                        self.tokens.observe_granted(token);
                        self.insert_key(key, hash, token, expiry_ms, limit, slot, value);
                    }
                }
            }
            Delta::Free { key, token, slot } => self.apply_free(key, token, slot, whole)?,
            Delta::Ceiling(ceiling) => self.tokens.observe(ceiling),
        }
        Ok(())
    }

    /// Where a replicated grant of `key` of `limit` goes: the key's index
    /// (Ok) or its hash for a new key (Err). A key held here with another
    /// limit (this node was active before, or the key was freed and
    /// registered afresh) is replaced by the active's, its watchers told
    /// while it is still there to be named; within a snapshot that is a
    /// refusal.
    fn key_for_grant(
        &mut self,
        key: &Key,
        limit: u32,
        whole: bool,
    ) -> Result<Result<u32, u32>, &'static str> {
        match self.index.find(&self.keys, key) {
            Ok(idx) if self.limit(idx) != limit => {
                if whole {
                    return Err("two limits for one key in a snapshot");
                }
                self.holders_changed(idx);
                self.drop_key(idx);
                Ok(self.index.find(&self.keys, key))
            }
            found => Ok(found),
        }
    }

    /// Where `token`'s grant goes in key `idx`'s `slot`: its own grant (an
    /// extension), an older grant there (a handover whose end was
    /// coalesced away), or nowhere yet (None: a new grant). A grant never
    /// moves to another slot or below the slot's current token; within a
    /// snapshot a slot holds one grant and a key at most `limit`.
    fn place_for_grant(
        &self,
        idx: u32,
        token: u64,
        slot: u32,
        limit: u32,
        whole: bool,
    ) -> Result<Option<At>, &'static str> {
        match self.find_grant(idx, token) {
            Some(at) if self.grant_slot(idx, at) != slot => Err("a grant moved to another slot"),
            Some(_) if whole => Err("two grants in one slot in a snapshot"),
            Some(at) => Ok(Some(at)),
            None if whole && self.holder_count(idx) >= limit as usize => {
                Err("more holders than the key's limit in a snapshot")
            }
            None => match self.grant_in_slot(idx, slot) {
                Some(_) if whole => Err("two grants in one slot in a snapshot"),
                Some(at) if token < self.grant_token_expiry(idx, at).0 => {
                    Err("a grant below the key's current token")
                }
                at => Ok(at),
            },
        }
    }

    /// A replicated free of `key`'s grant in `slot` by `token`: the grant
    /// there goes if it is this token or an older one (replication may send
    /// only a key's last state of a batch, so a handover's grant can be
    /// left out before its free) and nobody waits for the key.
    fn apply_free(
        &mut self,
        key: Key,
        token: u64,
        slot: u32,
        whole: bool,
    ) -> Result<(), &'static str> {
        if whole {
            return Err("a free inside a snapshot");
        }
        self.tokens.observe_granted(token);
        let Some(idx) = self.index.get(&self.keys, &key) else {
            return Ok(());
        };
        let Some(at) = self.grant_in_slot(idx, slot) else {
            return Ok(());
        };
        let (held, _) = self.grant_token_expiry(idx, at);
        if held <= token && self.keys[idx as usize].queue_len == 0 {
            self.wheel.cancel(self.grant_timer(idx, at));
            self.remove_grant(idx, at);
        }
        Ok(())
    }

    /// Replace the whole table by a snapshot from the active. Waiters, if
    /// any, must have been redirected first.
    /// Entries it refuses (see `apply_delta`; and, the snapshot being the
    /// whole table, two limits for one key or two grants in one slot) are
    /// left out; Err says why and how many.
    pub fn load_snapshot(
        &mut self,
        now_ms: u64,
        entries: Vec<Delta>,
    ) -> Result<(), (usize, &'static str)> {
        debug_assert!(
            self.waiters.is_empty(),
            "redirect waiters before a snapshot"
        );
        self.discard_changes();
        self.contended.clear();
        for state in self.keys.drain() {
            self.wheel.cancel(state.lease_timer);
        }
        for sem in self.sems.drain() {
            for grant in sem.more {
                self.wheel.cancel(grant.lease_timer);
            }
        }
        self.grants = 0;
        self.index.clear();
        let mut refused = (0, "");
        for entry in entries {
            if let Err(why) = self.apply(now_ms, entry, true) {
                refused = (refused.0 + 1, why);
            }
        }
        if refused.0 == 0 { Ok(()) } else { Err(refused) }
    }

    /// The token holding `key`, if any (tests).
    #[cfg(test)]
    pub(super) fn query_token(&self, key: &Key) -> Option<u64> {
        let idx = self.index.get(&self.keys, key)?;
        Some(self.keys[idx as usize].token)
    }

    /// Lift the token counter (a ceiling or a peer's token).
    pub fn observe_token(&mut self, token: u64) {
        self.tokens.observe(token);
    }
}

/// A replicated grant's own fields are sane: a limit within
/// 1..=[`MAX_LIMIT`](crate::protocol::MAX_LIMIT), a slot below it, a token
/// above 0.
fn grant_fields_sane(limit: u32, slot: u32, token: u64) -> Result<(), &'static str> {
    if !(1..=crate::protocol::MAX_LIMIT).contains(&limit) {
        return Err("a limit outside 1..=10000");
    }
    if slot >= limit {
        return Err("a slot at or above its key's limit");
    }
    if token == 0 {
        return Err("token 0");
    }
    Ok(())
}
