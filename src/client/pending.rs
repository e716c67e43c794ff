//! Matching answers to requests on one connection (requests are
//! pipelined).
//!
//! Owns: the pure rules that tell which request an answer line belongs to —
//! [`route`] names the (op, key) an answer is for, and [`Pending`] keeps, per
//! (op, key), the requests still waiting for an answer in the order they were
//! sent. The server answers requests with the same (op, key) on one
//! connection in arrival order, so the oldest waiting request of that
//! (op, key) is the one an answer belongs to.
//!
//! It also tells who is held back: the server keeps a later acquire's
//! answer (even a `T` whose wait ran out) until the earlier acquire of the
//! same key on the same connection is answered, so only the oldest waiting
//! request of an (op, key) can be answered next. [`Pending::push`] says
//! whether a request went to the front of its line, [`Pending::take_then`]
//! hands the one that moves up to the front to its caller's mark, and
//! [`Pending::has`] lets the pool keep a key's acquires apart.
//!
//! Runs on whichever thread holds the connection's state lock (a caller
//! sending, or the connection's reader thread dispatching answers).
//!
//! Never does: I/O, locking, or guessing: an answer that matches no waiting
//! request is reported as such, and the connection treats it as broken.

use std::collections::{HashMap, VecDeque};

use crate::protocol::{Answer, Key, Op, Reason};

/// What an answer line means for the connection that received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// It answers the oldest waiting request with this (op, key).
    Reply(Op, Option<Key>),
    /// `E - - <reason>`: the server did not understand a line, or will not
    /// serve this connection; it closes the connection after sending this.
    Fatal(Reason),
}

/// The (op, key) of the request an answer belongs to, as the protocol's
/// [`Answer::request`] names it (`A` and `T` answer an `A` request, `R`
/// and `N` an `R` request, `M` and `E` name their op, ...); `E - -` is
/// about the connection.
pub fn route(answer: &Answer) -> Route {
    match (answer.request(), answer) {
        (Some((op, key)), _) => Route::Reply(op, key.cloned()),
        (None, Answer::Error { reason, .. }) => Route::Fatal(*reason),
        // `Answer::request` names a request for every other answer.
        (None, _) => Route::Fatal(Reason::Other),
    }
}

/// Requests waiting for their answer, per (op, key), oldest first. `T` is
/// whatever the caller needs to hand the answer over (a reply channel).
#[derive(Debug)]
pub struct Pending<T> {
    queues: HashMap<(Op, Option<Key>), VecDeque<T>>,
    len: usize,
}

impl<T> Default for Pending<T> {
    fn default() -> Self {
        Pending {
            queues: HashMap::new(),
            len: 0,
        }
    }
}

impl<T> Pending<T> {
    /// Remember a request just sent, behind those with the same (op, key);
    /// true when none was waiting (it is at the front of its line: its
    /// answer can come next).
    pub fn push(&mut self, op: Op, key: Option<Key>, slot: T) -> bool {
        let queue = self.queues.entry((op, key)).or_default();
        queue.push_back(slot);
        self.len += 1;
        queue.len() == 1
    }

    /// The oldest waiting request with this (op, key), removed; None when no
    /// request of that (op, key) waits.
    #[cfg(test)]
    pub fn take(&mut self, op: Op, key: Option<Key>) -> Option<T> {
        self.take_then(op, key, |_| {})
    }

    /// [`Pending::take`], and `now_front` on the request that moves up to
    /// the front of the line in its place (its answer can come now).
    pub fn take_then(
        &mut self,
        op: Op,
        key: Option<Key>,
        now_front: impl FnOnce(&mut T),
    ) -> Option<T> {
        let id = (op, key);
        let queue = self.queues.get_mut(&id)?;
        let slot = queue.pop_front();
        match queue.front_mut() {
            Some(next) => now_front(next),
            None => {
                self.queues.remove(&id);
            }
        }
        if slot.is_some() {
            self.len -= 1;
        }
        slot
    }

    /// True when a request with this (op, key) waits for its answer (one
    /// hash lookup).
    pub fn has(&self, id: &(Op, Option<Key>)) -> bool {
        self.queues.contains_key(id)
    }

    /// True when a request of `op` (any key) waits for its answer (a scan
    /// of the waiting lines: for closing, not for every call).
    pub fn has_op(&self, op: Op) -> bool {
        self.queues.keys().any(|(o, _)| *o == op)
    }

    /// How many requests wait for an answer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no request waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every waiting request, removed (the connection is gone).
    pub fn drain(&mut self) -> Vec<T> {
        self.len = 0;
        self.queues.drain().flat_map(|(_, queue)| queue).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> Key {
        Key::new(text.as_bytes()).expect("valid key")
    }

    #[test]
    fn grants_and_timeouts_answer_acquires() {
        let k = key("job");
        let a = Answer::Granted {
            token: 7,
            key: k.clone(),
            slot: None,
        };
        assert_eq!(route(&a), Route::Reply(Op::Acquire, Some(k.clone())));
        let t = Answer::Timeout { key: k.clone() };
        assert_eq!(route(&t), Route::Reply(Op::Acquire, Some(k)));
    }

    #[test]
    fn released_and_not_held_answer_releases() {
        let k = key("job");
        for answer in [
            Answer::Released { key: k.clone() },
            Answer::NotHeld { key: k.clone() },
        ] {
            assert_eq!(route(&answer), Route::Reply(Op::Release, Some(k.clone())));
        }
    }

    #[test]
    fn keep_query_and_info_answer_their_own_op() {
        let k = key("job");
        assert_eq!(
            route(&Answer::Kept { key: k.clone() }),
            Route::Reply(Op::Keep, Some(k.clone()))
        );
        let q = Answer::Queried {
            key: k.clone(),
            token: 0,
            ms_left: 0,
            waiting: 0,
        };
        assert_eq!(route(&q), Route::Reply(Op::Query, Some(k)));
        assert_eq!(
            route(&Answer::Info(Default::default())),
            Route::Reply(Op::Info, None)
        );
    }

    #[test]
    fn moved_and_refused_name_their_op_and_key() {
        let k = key("job");
        let m = Answer::Moved {
            active: Some("h:1".into()),
            op: Op::Keep,
            key: Some(k.clone()),
        };
        assert_eq!(route(&m), Route::Reply(Op::Keep, Some(k.clone())));
        let e = Answer::Error {
            op: Some(Op::Acquire),
            key: Some(k.clone()),
            reason: Reason::BadLease,
        };
        assert_eq!(route(&e), Route::Reply(Op::Acquire, Some(k)));
    }

    #[test]
    fn an_error_without_op_is_fatal_for_the_connection() {
        let e = Answer::Error {
            op: None,
            key: None,
            reason: Reason::TooManyConnections,
        };
        assert_eq!(route(&e), Route::Fatal(Reason::TooManyConnections));
    }

    #[test]
    fn answers_for_one_op_and_key_are_matched_in_send_order() {
        let mut pending = Pending::default();
        pending.push(Op::Acquire, Some(key("a")), 1);
        pending.push(Op::Acquire, Some(key("b")), 2);
        pending.push(Op::Acquire, Some(key("a")), 3);
        pending.push(Op::Release, Some(key("a")), 4);
        assert_eq!(pending.len(), 4);
        assert_eq!(pending.take(Op::Release, Some(key("a"))), Some(4));
        assert_eq!(pending.take(Op::Acquire, Some(key("a"))), Some(1));
        assert_eq!(pending.take(Op::Acquire, Some(key("a"))), Some(3));
        assert_eq!(pending.take(Op::Acquire, Some(key("a"))), None);
        assert_eq!(pending.take(Op::Acquire, Some(key("b"))), Some(2));
        assert!(pending.is_empty());
    }

    #[test]
    fn a_request_is_at_the_front_when_none_of_its_op_and_key_waits() {
        let mut pending = Pending::default();
        assert!(pending.push(Op::Acquire, Some(key("a")), 1));
        assert!(pending.push(Op::Acquire, Some(key("b")), 2));
        assert!(!pending.push(Op::Acquire, Some(key("a")), 3));
        assert!(!pending.push(Op::Acquire, Some(key("a")), 4));
        assert!(pending.has(&(Op::Acquire, Some(key("a")))));
        assert!(!pending.has(&(Op::Release, Some(key("a")))));
        let mut moved_up = Vec::new();
        let taken = pending.take_then(Op::Acquire, Some(key("a")), |n| moved_up.push(*n));
        assert_eq!((taken, moved_up.as_slice()), (Some(1), &[3][..]));
        let mut moved_up = Vec::new();
        let taken = pending.take_then(Op::Acquire, Some(key("b")), |n| moved_up.push(*n));
        assert_eq!((taken, moved_up.as_slice()), (Some(2), &[][..]));
        assert!(!pending.has(&(Op::Acquire, Some(key("b")))));
        assert_eq!(pending.take(Op::Acquire, Some(key("a"))), Some(3));
        assert_eq!(pending.take(Op::Acquire, Some(key("a"))), Some(4));
        assert!(!pending.has(&(Op::Acquire, Some(key("a")))));
        assert!(pending.push(Op::Acquire, Some(key("a")), 5));
    }

    #[test]
    fn an_answer_for_no_waiting_request_is_not_matched() {
        let mut pending = Pending::default();
        pending.push(Op::Query, Some(key("a")), ());
        assert_eq!(pending.take(Op::Query, Some(key("b"))), None);
        assert_eq!(pending.take(Op::Info, None), None);
        assert_eq!(pending.len(), 1);
    }

    #[test]
    fn drain_hands_back_every_waiting_request() {
        let mut pending = Pending::default();
        pending.push(Op::Query, Some(key("a")), 1);
        pending.push(Op::Info, None, 2);
        let mut all = pending.drain();
        all.sort_unstable();
        assert_eq!(all, vec![1, 2]);
        assert!(pending.is_empty());
    }
}
