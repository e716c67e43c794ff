//! Deadlines for async calls, without an async runtime: one timer thread per
//! client wakes the futures whose deadline has passed.
//!
//! Owns: the client's pending deadlines (a [`BTreeMap`] from (instant, id)
//! to the waker of the future waiting for it) and the `baton-timer` thread,
//! started by the first [`Sleep`] that has to wait, stopped when the
//! client closes and joined by `Client::close`. Blocking calls never use it: they wait on condvars with a
//! deadline. Async calls use it only where a blocking call would sleep or
//! time out (a pause before a retry, a caller's or a connection's deadline);
//! answers themselves wake their futures from the connection threads.
//!
//! Never does: run user code (it only calls [`Waker::wake`]), or keep an
//! entry for a dropped [`Sleep`].

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

/// The client's timer; cheap to clone.
#[derive(Clone, Default)]
pub struct Timer {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    entries: BTreeMap<(Instant, u64), Waker>,
    next_id: u64,
    running: bool,
    closed: bool,
    /// The thread, once started; joined when the client is closed.
    thread: Option<JoinHandle<()>>,
}

impl Timer {
    /// A future that completes at `at` (at once if it has passed, or once
    /// the timer is closed).
    pub fn sleep_until(&self, at: Instant) -> Sleep {
        Sleep {
            shared: self.shared.clone(),
            at,
            id: None,
        }
    }

    /// Stop the thread and complete every pending sleep (the client is
    /// closing).
    pub fn close(&self) {
        let wakers = {
            let mut st = self.shared.state.lock();
            st.closed = true;
            std::mem::take(&mut st.entries)
        };
        self.shared.changed.notify_all();
        for waker in wakers.into_values() {
            waker.wake();
        }
    }

    /// Wait for the thread to end, after [`Timer::close`].
    pub fn join(&self) {
        let handle = self.shared.state.lock().thread.take();
        if let Some(handle) = handle
            && handle.thread().id() != thread::current().id()
        {
            let _ = handle.join();
        }
    }
}

/// Completes at its instant. Dropping it cancels it.
pub struct Sleep {
    shared: Arc<Shared>,
    at: Instant,
    id: Option<u64>,
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if Instant::now() >= this.at {
            return Poll::Ready(());
        }
        let at = this.at;
        let mut st = this.shared.state.lock();
        if st.closed {
            return Poll::Ready(());
        }
        let id = match this.id {
            Some(id) => id,
            None => {
                let id = st.next_id;
                st.next_id = st.next_id.wrapping_add(1);
                id
            }
        };
        this.id = Some(id);
        let earliest = st
            .entries
            .keys()
            .next()
            .is_none_or(|&(first, _)| at < first);
        st.entries.insert((at, id), cx.waker().clone());
        if !st.running {
            st.running = true;
            let shared = this.shared.clone();
            let spawned = thread::Builder::new()
                .name("baton-timer".into())
                .spawn(move || run(&shared));
            match spawned {
                Ok(handle) => st.thread = Some(handle),
                Err(e) => {
                    // Without the thread nothing would wake this future:
                    // wake it now, so it polls again (a busy wait, but
                    // never a hang).
                    st.running = false;
                    log::warn!("cannot start the timer thread: {e}");
                    cx.waker().wake_by_ref();
                }
            }
        } else if earliest {
            this.shared.changed.notify_all();
        }
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.shared.state.lock().entries.remove(&(self.at, id));
        }
    }
}

/// The timer thread: wake what is due, sleep until the next deadline.
fn run(shared: &Shared) {
    let mut st = shared.state.lock();
    loop {
        if st.closed {
            st.running = false;
            return;
        }
        let now = Instant::now();
        while let Some(entry) = st.entries.first_entry() {
            if entry.key().0 > now {
                break;
            }
            entry.remove().wake();
        }
        match st.entries.keys().next() {
            Some(&(next, _)) => {
                shared.changed.wait_until(&mut st, next);
            }
            None => shared.changed.wait(&mut st),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_sleep_completes_at_its_instant_and_not_before() {
        let timer = Timer::default();
        let start = Instant::now();
        let at = start + Duration::from_millis(20);
        crate::client::block::block_on(timer.sleep_until(at));
        assert!(Instant::now() >= at);
        // One that has passed completes at once, without the thread.
        crate::client::block::block_on(timer.sleep_until(start));
        timer.close();
    }

    #[test]
    fn a_dropped_sleep_leaves_no_entry_and_close_ends_the_rest() {
        let timer = Timer::default();
        let far = Instant::now() + Duration::from_secs(3600);
        let mut first = Box::pin(timer.sleep_until(far));
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(first.as_mut().poll(&mut cx).is_pending());
        assert_eq!(timer.shared.state.lock().entries.len(), 1);
        drop(first);
        assert!(timer.shared.state.lock().entries.is_empty());
        let second = timer.sleep_until(far);
        let closer = timer.clone();
        let thread = std::thread::spawn(move || closer.close());
        crate::client::block::block_on(second);
        thread.join().expect("closer thread");
    }
}
