//! The I/O loop's one deadline queue: the earliest-first list of the times
//! its connections must be looked at again (a TLS handshake's end, a
//! wrong secret's answer, an authentication deadline, a peer-reserved
//! slot's, a linger's end; see `connection.rs`).
//!
//! Owns: [`Deadlines`], a min-heap of `(deadline ms, key)`. An I/O loop
//! owns one and keys it by connection; it pushes a connection's next
//! deadline whenever that moves earlier and, when an entry is due, asks
//! the connection itself what (if anything) is due. So an entry never has
//! to be taken out: one whose connection is gone, or whose deadline no
//! longer matters, is popped in its time and does nothing. (The loop
//! rebuilds the queue from its live connections when such entries come to
//! outnumber them, so churn cannot grow it.)
//!
//! Never does: read a clock (time is passed in as ms on the caller's
//! monotonic clock), or decide what a deadline means.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Deadlines in ms, earliest first, each with the key it is for.
#[derive(Debug)]
pub struct Deadlines<K: Ord> {
    heap: BinaryHeap<Reverse<(u64, K)>>,
}

impl<K: Ord> Default for Deadlines<K> {
    fn default() -> Self {
        Deadlines {
            heap: BinaryHeap::new(),
        }
    }
}

impl<K: Ord> Deadlines<K> {
    /// Look at `key` again at `at_ms`.
    pub fn push(&mut self, at_ms: u64, key: K) {
        self.heap.push(Reverse((at_ms, key)));
    }

    /// The earliest deadline, if any: when the loop must wake.
    pub fn next(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((at, _))| *at)
    }

    /// The first key whose deadline is at or before `now_ms`, taken off.
    pub fn pop_due(&mut self, now_ms: u64) -> Option<K> {
        if self.next()? > now_ms {
            return None;
        }
        self.heap.pop().map(|Reverse((_, key))| key)
    }

    /// Entries queued (stale ones included).
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Drop every entry (before a rebuild from the live keys).
    pub fn clear(&mut self) {
        self.heap.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_come_out_earliest_first_and_only_once_due() {
        let mut queue = Deadlines::default();
        queue.push(300, 'c');
        queue.push(100, 'a');
        queue.push(200, 'b');
        assert_eq!(queue.next(), Some(100));
        assert_eq!(queue.pop_due(99), None);
        assert_eq!(queue.pop_due(100), Some('a'));
        assert_eq!(queue.pop_due(250), Some('b'));
        assert_eq!(queue.pop_due(250), None);
        assert_eq!((queue.len(), queue.next()), (1, Some(300)));
        queue.clear();
        assert!(queue.is_empty() && queue.next().is_none());
    }
}
