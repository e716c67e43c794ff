//! The mailbox a watched key's lines travel in: from a connection's reader
//! thread, which parses them, to the one [`Watch`](crate::client::Watch)
//! that subscribed, blocked on a condvar or waiting in an async task.
//!
//! Owns: one watch's undelivered [`Event`]s, tagged with the subscription
//! (an epoch the watch counts up each time it sends `W` again) they belong
//! to, so that a late line from a connection given up on never mixes with
//! the new one's; the condvar and the one waker of its consumer.
//!
//! Bounds: at most [`MAX_BUFFERED`] states wait; past it the oldest is
//! dropped, so a watch read slowly skips states but always ends on the
//! latest (as the server does for a slow connection). After an event that
//! ends a subscription (`Moved`, `Refused`, `Ended`) nothing more of it is
//! kept.
//!
//! Never does: block the reader thread (a push takes one short lock), or
//! I/O.

use std::collections::VecDeque;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::protocol::{Reason, WatchState};

/// States kept for a watch that is not read, at most.
pub const MAX_BUFFERED: usize = 1024;

/// What a connection tells a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A `W` line: the key's state (the first answers the `W`).
    State(WatchState),
    /// `M <active> W <key>`: this node does not serve the watch (a
    /// standby, or an active that stopped being one); None for `M -`.
    Moved(Option<String>),
    /// `E W <key> <reason>`.
    Refused(Reason),
    /// The connection ended.
    Ended,
}

impl Event {
    fn ends_subscription(&self) -> bool {
        !matches!(self, Event::State(_))
    }
}

/// One watch's mailbox.
#[derive(Default)]
pub struct Feed {
    state: Mutex<FeedState>,
    changed: Condvar,
}

#[derive(Default)]
struct FeedState {
    /// The subscription events are kept for (0: none).
    epoch: u64,
    events: VecDeque<Event>,
    /// An event ending the subscription has arrived.
    settled: bool,
    waker: Option<Waker>,
}

impl Feed {
    /// From now on, keep only events of subscription `epoch`; forget the rest.
    pub fn begin(&self, epoch: u64) {
        let mut st = self.state.lock();
        st.epoch = epoch;
        st.events.clear();
        st.settled = false;
    }

    /// An event of subscription `epoch` (from a connection's reader thread);
    /// dropped when that subscription is not the current one or has ended.
    pub fn push(&self, epoch: u64, event: Event) {
        let waker = {
            let mut st = self.state.lock();
            if st.epoch != epoch || st.settled {
                return;
            }
            st.settled = event.ends_subscription();
            if !st.settled && st.events.len() >= MAX_BUFFERED {
                st.events.pop_front();
            }
            st.events.push_back(event);
            st.waker.take()
        };
        self.changed.notify_all();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// The oldest event of subscription `epoch`, if one waits.
    pub fn take(&self, epoch: u64) -> Option<Event> {
        let mut st = self.state.lock();
        if st.epoch != epoch {
            return None;
        }
        st.events.pop_front()
    }

    /// Block until an event of `epoch` waits or `until` passes (None: no
    /// limit); true if one waits.
    pub fn wait(&self, epoch: u64, until: Option<Instant>) -> bool {
        let mut st = self.state.lock();
        loop {
            if st.epoch == epoch && !st.events.is_empty() {
                return true;
            }
            match until {
                Some(until) => {
                    if self.changed.wait_until(&mut st, until).timed_out() {
                        return st.epoch == epoch && !st.events.is_empty();
                    }
                }
                None => self.changed.wait(&mut st),
            }
        }
    }

    /// Ready when an event of `epoch` waits; else the task is woken by the
    /// next push.
    pub fn poll(&self, epoch: u64, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.state.lock();
        if st.epoch == epoch && !st.events.is_empty() {
            return Poll::Ready(());
        }
        match &st.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            _ => st.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn state(token: u64) -> Event {
        Event::State(WatchState {
            token,
            holders: u64::from(token != 0),
            waiting: 0,
            value: None,
        })
    }

    #[test]
    fn events_of_another_subscription_are_dropped() {
        let feed = Feed::default();
        feed.begin(1);
        feed.push(1, state(5));
        feed.push(2, state(6));
        assert_eq!(feed.take(1), Some(state(5)));
        assert_eq!(feed.take(1), None);
        feed.push(1, state(7));
        feed.begin(2);
        assert_eq!(feed.take(2), None, "the old subscription's events are gone");
        assert_eq!(feed.take(1), None);
    }

    #[test]
    fn nothing_follows_the_end_of_a_subscription() {
        let feed = Feed::default();
        feed.begin(3);
        feed.push(3, state(1));
        feed.push(3, Event::Moved(Some("h:1".into())));
        feed.push(3, state(2));
        feed.push(3, Event::Ended);
        assert_eq!(feed.take(3), Some(state(1)));
        assert_eq!(feed.take(3), Some(Event::Moved(Some("h:1".into()))));
        assert_eq!(feed.take(3), None);
    }

    #[test]
    fn a_watch_read_slowly_skips_the_oldest_states_and_ends_on_the_latest() {
        let feed = Feed::default();
        feed.begin(1);
        let pushed = MAX_BUFFERED as u64 + 10;
        for token in 1..=pushed {
            feed.push(1, state(token));
        }
        assert_eq!(feed.take(1), Some(state(11)));
        let mut last = None;
        while let Some(event) = feed.take(1) {
            last = Some(event);
        }
        assert_eq!(last, Some(state(pushed)));
    }

    #[test]
    fn a_waiter_sees_a_push_or_its_deadline() {
        let feed = std::sync::Arc::new(Feed::default());
        feed.begin(1);
        assert!(!feed.wait(1, Some(Instant::now() + Duration::from_millis(10))));
        let pusher = {
            let feed = feed.clone();
            std::thread::spawn(move || feed.push(1, state(9)))
        };
        assert!(feed.wait(1, Some(Instant::now() + Duration::from_secs(10))));
        pusher.join().expect("pusher");
        assert_eq!(feed.take(1), Some(state(9)));
    }
}
