//! Read-only views of the table: a key's holders and line ([`KeyView`]),
//! the counts for `/metrics`, and the contention view (`/keys`).

use super::*;

/// One live grant of a key, as [`LockTable::key_view`] shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HolderView<'a> {
    pub token: u64,
    pub slot: u32,
    /// When its lease runs out (the table's clock).
    pub expiry_ms: u64,
    pub value: Option<&'a Value>,
}

/// A key's state now, for watches and replication: its limit, how many
/// wait, and its holders.
#[derive(Clone, Copy, Debug)]
pub struct KeyView<'a> {
    pub(super) state: &'a KeyState,
    pub(super) sem: Option<&'a Sem>,
}

impl<'a> KeyView<'a> {
    /// The key's limit (1 for a plain mutex).
    pub fn limit(&self) -> u32 {
        self.sem.map_or(1, |sem| sem.limit)
    }

    /// Requests in line for the key.
    pub fn waiting(&self) -> u32 {
        self.state.queue_len
    }

    /// The key's live grants, in no particular order (a promotion-grace
    /// placeholder, token 0, is not a grant and is left out).
    pub fn holders(&self) -> impl Iterator<Item = HolderView<'a>> + use<'a> {
        let state = self.state;
        let first = HolderView {
            token: state.token,
            slot: self.sem.map_or(0, |sem| sem.first_slot),
            expiry_ms: state.expiry_ms,
            value: self.sem.and_then(|sem| sem.first_value.as_ref()),
        };
        let more = self.sem.into_iter().flat_map(|sem| {
            sem.more.iter().map(|g| HolderView {
                token: g.token,
                slot: g.slot,
                expiry_ms: g.expiry_ms,
                value: g.value.as_ref(),
            })
        });
        std::iter::once(first).chain(more).filter(|h| h.token != 0)
    }

    /// The newest live grant (the largest token), if any.
    pub fn newest(&self) -> Option<HolderView<'a>> {
        self.holders().max_by_key(|h| h.token)
    }

    /// A `Delta::Grant` for each holder, its lease left counted from
    /// `now_ms`.
    pub(super) fn deltas(self, now_ms: u64) -> impl Iterator<Item = Delta> + 'a {
        let state: &'a KeyState = self.state;
        let key = &state.key;
        let limit = self.limit();
        self.holders().map(move |h| Delta::Grant {
            key: key.clone(),
            token: h.token,
            ms_left: h.expiry_ms.saturating_sub(now_ms),
            limit,
            slot: h.slot,
            value: h.value.cloned(),
        })
    }
}

impl LockTable {
    pub fn stats(&self) -> TableStats {
        TableStats {
            held: self.keys.len(),
            holders: self.grants,
            holder_changes: self.holder_changes,
            waiting: self.waiters.len(),
            last_token: self.tokens.last(),
            last_issued: self.tokens.last_issued(),
            last_granted: self.tokens.last_granted(),
        }
    }

    /// The key's state now (None: not in the table), for watches and
    /// replication.
    pub fn key_view(&self, key: &Key) -> Option<KeyView<'_>> {
        let idx = self.index.get(&self.keys, key)?;
        Some(KeyView {
            state: &self.keys[idx as usize],
            sem: self.sem(idx),
        })
    }

    /// How many keys a request waits for.
    pub fn contended(&self) -> usize {
        self.contended.len()
    }

    /// The contention view `ask` wants, at `now_ms` (monotonic) and
    /// `unix_ms` (the wall clock, which held times are read against:
    /// [`held_ms`]): the first keys by each order and the keys looked
    /// up. Costs time in the contended keys and what is asked for, never
    /// in all keys. (`role` and `node` are the caller's.)
    pub fn contention_view(&self, now_ms: u64, unix_ms: u64, ask: &KeysAsk) -> KeysView {
        let ranks: Vec<Rank> = if ask.top_waiting > 0 || ask.top_age > 0 {
            self.contended
                .iter()
                .map(|idx| {
                    let state = &self.keys[idx as usize];
                    Rank {
                        idx,
                        waiting: state.queue_len,
                        oldest_since_ms: self.waiters[state.queue_head as usize].since_ms,
                    }
                })
                .collect()
        } else {
            Vec::new()
        };
        let list = |by: By, n: usize| -> Vec<KeyEntry> {
            top(ranks.clone(), by, n)
                .iter()
                .map(|r| self.key_entry(r.idx, now_ms, unix_ms, MAX_LISTED_HOLDERS))
                .collect()
        };
        let lookups = ask
            .lookups
            .iter()
            .map(|key| {
                let entry = self
                    .index
                    .get(&self.keys, key)
                    .map(|idx| self.key_entry(idx, now_ms, unix_ms, usize::MAX));
                (key.clone(), entry)
            })
            .collect();
        KeysView {
            ask: ask.clone(),
            role: "",
            node: String::new(),
            contended: self.contended.len(),
            by_waiting: list(By::Waiting, ask.top_waiting),
            by_age: list(By::Age, ask.top_age),
            lookups,
        }
    }

    /// Key `idx` as the view shows it, with at most `max_holders` of its
    /// holders (those that have held it longest).
    pub(super) fn key_entry(
        &self,
        idx: u32,
        now_ms: u64,
        unix_ms: u64,
        max_holders: usize,
    ) -> KeyEntry {
        let state = &self.keys[idx as usize];
        let view = KeyView {
            state,
            sem: self.sem(idx),
        };
        let mut holders: Vec<_> = view.holders().collect();
        // The smallest token was granted first.
        holders.sort_unstable_by_key(|h| h.token);
        let more = holders.len().saturating_sub(max_holders);
        holders.truncate(max_holders);
        let oldest_wait_ms = match state.queue_head {
            NIL => 0,
            head => now_ms.saturating_sub(self.waiters[head as usize].since_ms),
        };
        KeyEntry {
            key: state.key.clone(),
            limit: view.limit(),
            waiting: state.queue_len,
            oldest_wait_ms,
            holders: holders
                .into_iter()
                .map(|h| HolderEntry {
                    token: h.token,
                    slot: h.slot,
                    value: h.value.cloned(),
                    held_ms: held_ms(h.token, unix_ms),
                    ms_left: h.expiry_ms.saturating_sub(now_ms),
                })
                .collect(),
            more_holders: more as u32,
        }
    }
}
