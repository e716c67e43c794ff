//! A held lock that keeps its own lease alive: [`Held`], made by
//! [`Client::hold`] and [`Client::hold_async`].
//!
//! Owns: one watchdog thread per held lock (`baton-hold <key>`). It renews
//! the lease with `K` every third of it; while no server answers it tries
//! again every [`KEEP_RETRY`] until the lease runs out by the client's
//! clock. The moment the key is lost — a server says the token no longer
//! holds it, or no server answered before the lease ran out — the watchdog
//! records why and wakes everyone waiting: [`Held::is_lost`] turns true,
//! [`Held::wait_lost`] returns and the future of [`Held::lost`] completes.
//! When the owner drops the [`Held`], the watchdog releases the key (with
//! the client's usual release retries) and exits, so a drop never blocks,
//! not even in an async task.
//!
//! Never does: tell the owner the key is lost after the owner let go of it,
//! or keep renewing after a loss (a lost key is not asked for again: the
//! owner decides).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::client::{Client, Error, Grant, ReleaseOutcome};
use crate::protocol::Key;

/// Time between two tries to renew a lease while no server answers.
pub const KEEP_RETRY: Duration = Duration::from_millis(200);

/// A key held by this client whose lease a background watchdog keeps
/// alive; released when dropped. See [`Client::hold`].
pub struct Held {
    client: Client,
    key: Key,
    token: u64,
    slot: u32,
    watch: Arc<Watchdog>,
}

struct Watchdog {
    state: Mutex<HoldState>,
    changed: Condvar,
}

struct HoldState {
    /// The grant as last renewed.
    grant: Grant,
    /// Why the key was lost, once it was.
    lost: Option<Error>,
    stop: Stop,
    /// Tasks waiting in [`Held::lost`].
    wakers: Vec<Waker>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// Keep renewing.
    Running,
    /// The owner dropped the [`Held`]: release the key and exit.
    Release,
    /// The owner releases the key itself: just exit.
    Quit,
}

impl Held {
    /// Start the watchdog for `grant`, renewed `lease` at a time.
    pub(crate) fn start(client: Client, grant: Grant, lease: Duration) -> Result<Held, Error> {
        let watch = Arc::new(Watchdog {
            state: Mutex::new(HoldState {
                grant: grant.clone(),
                lost: None,
                stop: Stop::Running,
                wakers: Vec::new(),
            }),
            changed: Condvar::new(),
        });
        let spawned = {
            let (client, watch) = (client.clone(), watch.clone());
            thread::Builder::new()
                .name(format!("baton-hold {}", grant.key()))
                .spawn(move || watchdog(&client, &watch, lease))
        };
        if let Err(e) = spawned {
            if let Err(release) = client.release(&grant) {
                log::warn!("could not release {}: {release}", grant.key());
            }
            return Err(Error::NoConnection(format!(
                "cannot start the watchdog thread: {e}"
            )));
        }
        Ok(Held {
            client,
            key: grant.key().clone(),
            token: grant.token(),
            slot: grant.slot(),
            watch,
        })
    }

    /// The key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The fencing token, to hand to the protected resource.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The grant's slot (see [`Grant::slot`]): 0 without a limit.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// When the lease runs out by the client's clock, as last renewed.
    pub fn expires_at(&self) -> Instant {
        self.watch.state.lock().grant.expires_at()
    }

    /// True once the key is lost: stop working on what it protects.
    pub fn is_lost(&self) -> bool {
        self.watch.state.lock().lost.is_some()
    }

    /// Block until the key is lost; why ([`Error::NotHeld`] when a server
    /// said the token no longer holds it, [`Error::Expired`] when no server
    /// answered before the lease ran out).
    pub fn wait_lost(&self) -> Error {
        let mut st = self.watch.state.lock();
        loop {
            if let Some(why) = &st.lost {
                return why.clone();
            }
            self.watch.changed.wait(&mut st);
        }
    }

    /// Like [`Held::wait_lost`], for at most `timeout`; None when the key
    /// is still held.
    pub fn wait_lost_timeout(&self, timeout: Duration) -> Option<Error> {
        let until = Instant::now() + timeout;
        let mut st = self.watch.state.lock();
        loop {
            if let Some(why) = &st.lost {
                return Some(why.clone());
            }
            if self.watch.changed.wait_until(&mut st, until).timed_out() {
                return st.lost.clone();
            }
        }
    }

    /// A future that completes, with why, when the key is lost: race it
    /// against the work the key protects. It does not borrow the `Held`.
    pub fn lost(&self) -> Lost {
        Lost {
            watch: self.watch.clone(),
        }
    }

    /// Stop renewing and release the key now, reporting the outcome.
    pub fn release(self) -> Result<ReleaseOutcome, Error> {
        let grant = self.quit();
        self.client.release(&grant)
    }

    /// [`Held::release`] for async callers.
    pub fn release_async(
        self,
    ) -> impl Future<Output = Result<ReleaseOutcome, Error>> + Send + 'static + use<> {
        let grant = self.quit();
        self.client.release_async(&grant)
    }

    /// Tell the watchdog to exit without releasing; the grant.
    fn quit(&self) -> Grant {
        let mut st = self.watch.state.lock();
        st.stop = Stop::Quit;
        self.watch.changed.notify_all();
        st.grant.clone()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut st = self.watch.state.lock();
        if st.stop == Stop::Running {
            st.stop = Stop::Release;
            self.watch.changed.notify_all();
        }
    }
}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Held")
            .field("key", &self.key)
            .field("token", &self.token)
            .field("slot", &self.slot)
            .field("lost", &self.watch.state.lock().lost)
            .finish()
    }
}

/// Completes when the key of a [`Held`] is lost; see [`Held::lost`].
pub struct Lost {
    watch: Arc<Watchdog>,
}

impl Future for Lost {
    type Output = Error;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Error> {
        let mut st = self.watch.state.lock();
        if let Some(why) = &st.lost {
            return Poll::Ready(why.clone());
        }
        if !st.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            st.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl fmt::Debug for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Lost")
    }
}

// --- the watchdog thread ------------------------------------------------------

fn watchdog(client: &Client, watch: &Watchdog, lease: Duration) {
    loop {
        let (mut grant, stop) = {
            let mut st = watch.state.lock();
            let renew_at = st.grant.lease_start() + lease / 3;
            while st.stop == Stop::Running && Instant::now() < renew_at {
                watch.changed.wait_until(&mut st, renew_at);
            }
            (st.grant.clone(), st.stop)
        };
        match stop {
            Stop::Running => {}
            Stop::Quit => return,
            Stop::Release => return release_dropped(client, &grant),
        }
        let renewed = renew(client, &mut grant, lease, watch);
        let mut st = watch.state.lock();
        match (st.stop, renewed) {
            (Stop::Running, Ok(())) => st.grant = grant,
            (Stop::Running, Err(why)) => {
                log::warn!("lost {} (token {}): {why}", grant.key(), grant.token());
                st.lost = Some(why);
                let wakers = std::mem::take(&mut st.wakers);
                watch.changed.notify_all();
                drop(st);
                for waker in wakers {
                    waker.wake();
                }
                return;
            }
            // The owner let go meanwhile: the loop handles it.
            (_, _) => {}
        }
    }
}

/// Extend the lease, retrying every [`KEEP_RETRY`] while no server answers
/// and the lease lasts. Ok also when the owner let go meanwhile.
fn renew(
    client: &Client,
    grant: &mut Grant,
    lease: Duration,
    watch: &Watchdog,
) -> Result<(), Error> {
    loop {
        match client.keep(grant, lease) {
            Ok(()) => return Ok(()),
            Err(e) if e.is_unreachable() => log::debug!("keep failed, retrying: {e}"),
            Err(e) => return Err(e),
        }
        let mut st = watch.state.lock();
        let retry_at = Instant::now() + KEEP_RETRY;
        while st.stop == Stop::Running && Instant::now() < retry_at {
            watch.changed.wait_until(&mut st, retry_at);
        }
        if st.stop != Stop::Running {
            return Ok(());
        }
        if grant.is_expired() {
            return Err(Error::Expired);
        }
    }
}

fn release_dropped(client: &Client, grant: &Grant) {
    match client.release(grant) {
        Ok(ReleaseOutcome::Released) => {}
        Ok(ReleaseOutcome::NotHeld) => log::debug!(
            "{} (token {}) was no longer held when it was dropped",
            grant.key(),
            grant.token()
        ),
        Err(e) => log::warn!(
            "could not release {} (token {}): {e}; its lease will run out",
            grant.key(),
            grant.token()
        ),
    }
}
