//! What a client's connection threads and its callers share: settings, the
//! closing signal, and the [`Notifier`] of connection phase changes.
//!
//! Owns: [`Ctx`] (timeouts, "the client is closed", the count of grants in
//! hand that `Client::close` waits for), and [`Notifier`], a
//! counter bumped on every change of a connection's phase that blocking
//! callers wait on with a condvar and async callers with a stored waker.
//! Written by the connection threads (`conn.rs`), read by callers
//! choosing a connection (`pool.rs`).
//!
//! Never does: I/O or any decision about connections; it exists so that
//! `conn.rs` and `pool.rs` each depend on it and not on each other.

use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use crate::protocol::Secret;
use parking_lot::{Condvar, Mutex};

/// The client's TLS settings, built (None: plain TCP).
#[cfg(feature = "tls")]
pub type TlsSetting = Option<std::sync::Arc<crate::client::tls::Connector>>;
/// Without the `tls` feature there is nothing to set.
#[cfg(not(feature = "tls"))]
pub type TlsSetting = ();

/// Settings and signals shared by the pool and its connections' threads.
pub struct Ctx {
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    /// Sent as `U <secret>` first on every connection (its Debug hides it).
    pub auth: Option<Secret>,
    /// TLS for every connection, redone on every reconnection.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub tls: TlsSetting,
    pub notifier: Notifier,
    /// Never sent on: disconnects when the client is dropped.
    stop: Receiver<()>,
    /// `Client::close` began: no acquire is sent, no grant handed over.
    closing: AtomicBool,
    closed: AtomicBool,
    /// Acquire calls with a grant they have not returned yet (confirming
    /// it with `K`): `Client::close` waits for them before the sockets
    /// close, so that their `K` and their release travel on open
    /// connections.
    in_hand: Mutex<usize>,
    in_hand_left: Condvar,
}

impl Ctx {
    pub fn new(
        connect_timeout: Duration,
        request_timeout: Duration,
        auth: Option<Secret>,
        tls: TlsSetting,
        stop: Receiver<()>,
    ) -> Ctx {
        Ctx {
            connect_timeout,
            request_timeout,
            auth,
            tls,
            notifier: Notifier::default(),
            stop,
            closing: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            in_hand: Mutex::new(0),
            in_hand_left: Condvar::new(),
        }
    }

    /// Count a grant in hand until the guard drops (on every exit of the
    /// call, cancellation included). A call that takes the guard and then
    /// finds the client not closing is waited for by a close that begins
    /// later: close marks closing before it reads the count, and the count
    /// is read and written under one lock.
    pub fn grant_in_hand(&self) -> InHand<'_> {
        *self.in_hand.lock() += 1;
        InHand { ctx: self }
    }

    /// Wait until no call has a grant in hand, or `until` passes; true if
    /// none has.
    pub fn wait_no_grant_in_hand(&self, until: Instant) -> bool {
        let mut count = self.in_hand.lock();
        while *count > 0 {
            if self.in_hand_left.wait_until(&mut count, until).timed_out() {
                return *count == 0;
            }
        }
        true
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// `Client::close` began: held keys are being released, the
    /// connections close next.
    pub fn begin_close(&self) {
        self.closing.store(true, Ordering::Release);
    }

    /// Mark the client closed (its connections then stop).
    pub fn close(&self) {
        self.closing.store(true, Ordering::Release);
        self.closed.store(true, Ordering::Release);
        self.notifier.bump();
    }

    /// Sleep for `duration` or until the client closes; true if it closed.
    pub fn sleep(&self, duration: Duration) -> bool {
        !matches!(
            self.stop.recv_timeout(duration),
            Err(RecvTimeoutError::Timeout)
        ) || self.is_closed()
    }
}

/// One acquire call's grant in hand (see [`Ctx::grant_in_hand`]).
pub struct InHand<'a> {
    ctx: &'a Ctx,
}

impl Drop for InHand<'_> {
    fn drop(&mut self) {
        let mut count = self.ctx.in_hand.lock();
        *count -= 1;
        if *count == 0 {
            self.ctx.in_hand_left.notify_all();
        }
    }
}

/// A counter bumped on every change of a connection's phase, with a condvar
/// for blocking callers and wakers for async ones waiting for a change.
#[derive(Default)]
pub struct Notifier {
    state: Mutex<NotifierState>,
    changed: Condvar,
}

#[derive(Default)]
struct NotifierState {
    version: u64,
    wakers: Vec<Waker>,
}

impl Notifier {
    pub fn version(&self) -> u64 {
        self.state.lock().version
    }

    pub fn bump(&self) {
        let wakers = {
            let mut st = self.state.lock();
            st.version += 1;
            std::mem::take(&mut st.wakers)
        };
        self.changed.notify_all();
        for waker in wakers {
            waker.wake();
        }
    }

    /// Wait until the version differs from `seen` or `until` passes; true if
    /// it changed.
    pub fn wait_change(&self, seen: u64, until: Instant) -> bool {
        let mut st = self.state.lock();
        while st.version == seen {
            if self.changed.wait_until(&mut st, until).timed_out() {
                return st.version != seen;
            }
        }
        true
    }

    /// Ready once the version differs from `seen`; else the waker is woken
    /// at the next change.
    pub fn poll_change(&self, seen: u64, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.state.lock();
        if st.version != seen {
            return Poll::Ready(());
        }
        if !st.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            st.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn close_waits_for_every_grant_in_hand_until_its_guard_drops() {
        let (_never, stop) = crossbeam_channel::bounded(0);
        let ctx = Ctx::new(
            Duration::ZERO,
            Duration::ZERO,
            None,
            Default::default(),
            stop,
        );
        let now = Instant::now();
        assert!(ctx.wait_no_grant_in_hand(now));
        let first = ctx.grant_in_hand();
        let second = ctx.grant_in_hand();
        assert!(!ctx.wait_no_grant_in_hand(now));
        drop(first);
        assert!(!ctx.wait_no_grant_in_hand(now));
        drop(second);
        assert!(ctx.wait_no_grant_in_hand(now));
    }

    #[test]
    fn a_waiter_sees_a_change_or_its_deadline() {
        let notifier = Arc::new(Notifier::default());
        let seen = notifier.version();
        let soon = Instant::now() + Duration::from_millis(20);
        assert!(!notifier.wait_change(seen, soon));
        let bumper = notifier.clone();
        let thread = std::thread::spawn(move || bumper.bump());
        assert!(notifier.wait_change(seen, Instant::now() + Duration::from_secs(10)));
        thread.join().expect("bumper thread");
    }
}
