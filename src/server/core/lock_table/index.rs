//! Finding a key: the index of slab slots by the key's keyed hash
//! (`KeyIndex`), and the hint of where a recent token was granted
//! (`RecentGrants`), so that the usual acquire-release pair hashes its key
//! once.

use super::*;

/// Key → slot of the table. It stores only slot numbers, hashed by the key
/// kept in the slot, so each key's bytes are stored once (memory per held
/// key is what a lock server is judged by). Hashing is keyed (SipHash with
/// a random key), so keys chosen by clients cannot force collisions.
///
/// A request hashes its key at most once (SipHash is the lock owner's
/// largest cost per request after the answer itself): a miss hands its
/// hash to the insert that follows ([`KeyIndex::find`]), and each key keeps
/// its hash ([`KeyState::hash`], 32 bits, in what was padding), so taking
/// it out, or moving it when the table grows, hashes nothing. A release or
/// keep names its grant's token, which usually finds the key with no hash
/// at all ([`RecentGrants`]).
pub(super) struct KeyIndex {
    pub(super) table: HashTable<u32>,
    pub(super) hasher: RandomState,
}

impl Default for KeyIndex {
    fn default() -> KeyIndex {
        KeyIndex {
            table: HashTable::new(),
            hasher: RandomState::new(),
        }
    }
}

/// The 32 bits of a key's hash that it keeps ([`KeyState::hash`]): one
/// `write` of the key's bytes (a slice's `Hash` would add a second, for its
/// length, which a single field does not need).
pub(super) fn key_hash(hasher: &RandomState, key: &Key) -> u32 {
    let mut state = hasher.build_hasher();
    state.write(key.as_bytes());
    state.finish() as u32
}

/// A kept hash as the index uses it: the same 32 bits in the low half
/// (where the table's bucket comes from) and the high half (where its tag
/// bits come from).
pub(super) fn spread(hash: u32) -> u64 {
    u64::from(hash) | u64::from(hash) << 32
}

impl KeyIndex {
    pub(super) fn hash(&self, key: &Key) -> u32 {
        key_hash(&self.hasher, key)
    }

    /// The key's slot, or, when it has none, its hash (for [`KeyIndex::insert`]).
    pub(super) fn find(&self, keys: &Slab<KeyState>, key: &Key) -> Result<u32, u32> {
        let hash = self.hash(key);
        match self
            .table
            .find(spread(hash), |&i| keys[i as usize].key == *key)
        {
            Some(&idx) => Ok(idx),
            None => Err(hash),
        }
    }

    pub(super) fn get(&self, keys: &Slab<KeyState>, key: &Key) -> Option<u32> {
        self.find(keys, key).ok()
    }

    /// Index slot `idx`, which must hold a key not indexed yet, with its
    /// kept hash.
    pub(super) fn insert(&mut self, keys: &Slab<KeyState>, idx: u32) {
        let hash = keys[idx as usize].hash;
        debug_assert_eq!(
            hash,
            self.hash(&keys[idx as usize].key),
            "the key's own hash"
        );
        self.table
            .insert_unique(spread(hash), idx, |&i| spread(keys[i as usize].hash));
    }

    /// Forget slot `idx`, whose key's kept hash is `hash` (the slot may be
    /// gone already).
    pub(super) fn remove(&mut self, hash: u32, idx: u32) {
        if let Ok(entry) = self.table.find_entry(spread(hash), |&i| i == idx) {
            entry.remove();
        }
    }

    /// Keys indexed (for the invariants' check).
    #[cfg(any(test, feature = "test-hooks"))]
    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    pub(super) fn clear(&mut self) {
        self.table.clear();
    }
}

/// Which slot of the table the recent grants were made in, by token, so
/// that a release or keep (which names its grant's token) finds its key
/// without hashing it. A hint, never trusted: it is used only when that
/// slot holds the very key the request names (then it is that key's slot,
/// since a key has one), and otherwise the index is asked. A grant's entry
/// lasts until a later grant lands on the same entry (`RECENT_GRANTS` of
/// them, spread by a multiplicative hash of the token), so a key held for
/// a long while on a busy node is found by its hash as before.
pub(super) struct RecentGrants {
    pub(super) slots: Box<[u32]>,
}

/// Entries of [`RecentGrants`] (a power of two): 16 KiB.
pub(super) const RECENT_GRANTS: usize = 4096;

impl RecentGrants {
    pub(super) fn new() -> RecentGrants {
        RecentGrants {
            slots: vec![NIL; RECENT_GRANTS].into_boxed_slice(),
        }
    }

    pub(super) fn entry(token: u64) -> usize {
        // Fibonacci hashing: consecutive tokens land far apart; the top
        // bits are the entry.
        (token.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - RECENT_GRANTS.trailing_zeros()))
            as usize
    }

    /// `token` was just granted in slot `idx`.
    pub(super) fn note(&mut self, token: u64, idx: u32) {
        self.slots[Self::entry(token)] = idx;
    }

    /// The slot `token` was last noted in, or NIL.
    pub(super) fn get(&self, token: u64) -> u32 {
        self.slots[Self::entry(token)]
    }
}
