//! The table's side of watches: which keys changed holders since the last
//! step, and the `W <key> …` lines their watchers are sent.

use super::*;

impl LockTable {
    /// Which I/O loops watch which keys.
    pub fn watchers(&self) -> &Watchers {
        &self.watchers
    }

    /// Which I/O loops watch which keys, to change.
    pub fn watchers_mut(&mut self) -> &mut Watchers {
        &mut self.watchers
    }

    /// What a `W` line shows of `key` now: the largest token holding it
    /// (0 when none), its live grants, the requests in line, and the value
    /// of the grant with the largest token.
    pub fn watch_state(&self, key: &Key) -> WatchState {
        let Some(view) = self.key_view(key) else {
            return WatchState::default();
        };
        let newest = view.newest();
        WatchState {
            token: newest.as_ref().map_or(0, |h| h.token),
            holders: view.holders().count() as u64,
            waiting: u64::from(view.waiting()),
            value: newest.and_then(|h| h.value.cloned()),
        }
    }

    /// The watched keys whose holders changed since the last call, each
    /// once with its state now, as entries for each watching loop's
    /// watchers (`ConnId::watchers`) in the ordered answers. The table
    /// core calls it after every step that may change holders, so the
    /// lines follow the answers of the step that made the change.
    #[inline]
    pub fn take_watch_lines(&mut self, out: &mut Outbox) {
        // Called after every request: the common case (nothing watched
        // changed) is one check at the call, no call.
        if !self.watch_changed.is_empty() {
            self.write_watch_lines(out);
        }
    }

    pub(super) fn write_watch_lines(&mut self, out: &mut Outbox) {
        let mut changed = std::mem::take(&mut self.watch_changed);
        for (i, key) in changed.iter().enumerate() {
            if changed[..i].contains(key) {
                continue;
            }
            let Some(loops) = self.watchers.loops(key) else {
                continue;
            };
            let state = self.watch_state(key);
            for worker in loops.iter() {
                out.answer(
                    ConnId::watchers(worker),
                    Answer::Watched {
                        key: key.clone(),
                        state: state.clone(),
                    },
                );
            }
        }
        changed.clear();
        self.watch_changed = changed;
    }

    /// `W key`: the key's state now (a lease run out is reclaimed first,
    /// and that change's line goes before this answer).
    pub fn handle_watch(&mut self, now_ms: u64, conn: ConnId, key: Key, out: &mut Outbox) {
        let _ = self.lookup_live(now_ms, &key, out);
        self.take_watch_lines(out);
        let state = self.watch_state(&key);
        out.answer(conn, Answer::Watched { key, state });
    }

    /// Some key's set of holders changed (a grant, a release, an expiry):
    /// the point where watches of the key are to be told. Called while key
    /// `idx` is still in the table. If an I/O loop watches the key, it is
    /// noted for [`LockTable::take_watch_lines`]; nothing watched costs one
    /// check.
    #[inline]
    pub(super) fn holders_changed(&mut self, idx: u32) {
        self.holder_changes += 1;
        if !self.watchers.is_empty() {
            self.note_watched_change(idx);
        }
    }

    pub(super) fn note_watched_change(&mut self, idx: u32) {
        let key = &self.keys[idx as usize].key;
        if self.watchers.loops(key).is_some() {
            self.watch_changed.push(key.clone());
        }
    }
}
