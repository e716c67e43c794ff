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
//! not even in an async task. When the client is closed, each watchdog
//! releases its key once (best effort) and exits, and `Client::close`
//! waits for it ([`Holds`], the client's list of watchdogs).
//!
//! After a loss every call on the [`Held`] fails with [`Error::Lost`]; after
//! the client closed, with [`Error::Closed`]. A keep of the owner's own
//! ([`Held::keep`]) renews the same grant the watchdog keeps, and its lease
//! becomes the one the watchdog renews with.
//!
//! Never does: tell the owner the key is lost after the owner let go of it
//! or closed the client, or keep renewing after a loss (a lost key is not
//! asked for again: the owner decides).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::client::block::block_on;
use crate::client::calls::{self, Async, Blocking, Wait};
use crate::client::{Client, Error, Grant, ReleaseOutcome, check_lease};
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
    /// The watchdog thread, joined by `Client::close`.
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// A client's held keys' watchdogs, so that closing the client stops them.
#[derive(Default)]
pub(crate) struct Holds {
    list: Mutex<HoldList>,
}

#[derive(Default)]
struct HoldList {
    watchdogs: Vec<Weak<Watchdog>>,
    closed: bool,
}

/// A watchdog told to let go by `Client::close`, to be waited for.
pub(crate) struct LettingGo(Arc<Watchdog>);

impl LettingGo {
    /// Wait for the watchdog thread to end.
    pub(crate) fn join(self) {
        let handle = self.0.thread.lock().take();
        if let Some(handle) = handle
            && handle.thread().id() != thread::current().id()
        {
            let _ = handle.join();
        }
    }
}

impl Holds {
    /// Add a watchdog; false when the client is closed already.
    fn register(&self, watchdog: &Arc<Watchdog>) -> bool {
        let mut list = self.list.lock();
        if list.closed {
            return false;
        }
        list.watchdogs.retain(|w| w.strong_count() > 0);
        list.watchdogs.push(Arc::downgrade(watchdog));
        true
    }

    /// The client is closing: each running watchdog releases its key once
    /// and exits. Waits for those releases (while the connections are still
    /// up); the watchdogs returned (every one) are joined once the
    /// connections are closed, since one releasing a dropped [`Held`] with
    /// the usual retries ends only then.
    pub(crate) fn close(&self, _client: &Client) -> Vec<LettingGo> {
        let watchdogs = {
            let mut list = self.list.lock();
            list.closed = true;
            std::mem::take(&mut list.watchdogs)
        };
        let watchdogs: Vec<Arc<Watchdog>> = watchdogs.iter().filter_map(Weak::upgrade).collect();
        let mut closing = Vec::new();
        for watchdog in &watchdogs {
            let mut st = watchdog.state.lock();
            if st.stop == Stop::Running && st.lost.is_none() {
                st.stop = Stop::Close;
                watchdog.changed.notify_all();
                closing.push(watchdog.clone());
            }
        }
        for watchdog in closing {
            LettingGo(watchdog).join();
        }
        watchdogs.into_iter().map(LettingGo).collect()
    }
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
    /// The client is closing: release the key once, best effort, and exit.
    Close,
}

impl Held {
    /// Start the watchdog for `grant`, renewed a lease as long as its own
    /// at a time.
    pub(crate) fn start(client: Client, grant: Grant) -> Result<Held, Error> {
        let watch = Arc::new(Watchdog {
            state: Mutex::new(HoldState {
                grant: grant.clone(),
                lost: None,
                stop: Stop::Running,
                wakers: Vec::new(),
            }),
            changed: Condvar::new(),
            thread: Mutex::new(None),
        });
        if !client.inner.holds.register(&watch) {
            // The client closed while the key was being acquired.
            if let Err(e) = calls::release_once(client.pool(), grant.key().clone(), grant.token()) {
                log::debug!("could not release {}: {e}", grant.key());
            }
            return Err(Error::Closed);
        }
        let spawned = {
            let (client, watch) = (client.clone(), watch.clone());
            thread::Builder::new()
                .name(format!("baton-hold {}", grant.key()))
                .spawn(move || watchdog(&client, &watch))
        };
        match spawned {
            Ok(handle) => *watch.thread.lock() = Some(handle),
            Err(e) => {
                if let Err(release) = client.release(&grant) {
                    log::warn!("could not release {}: {release}", grant.key());
                }
                return Err(Error::NoConnection(format!(
                    "cannot start the watchdog thread: {e}"
                )));
            }
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
    /// [`Error::Lost`] when the key was lost already (nothing is sent),
    /// [`Error::Closed`] when the client was closed (it released the key).
    pub fn release(self) -> Result<ReleaseOutcome, Error> {
        let grant = self.quit()?;
        self.client.release(&grant)
    }

    /// [`Held::release`] for async callers.
    pub fn release_async(
        self,
    ) -> impl Future<Output = Result<ReleaseOutcome, Error>> + Send + 'static + use<> {
        let quit = self.quit();
        let client = self.client.clone();
        async move { client.release_async(&quit?).await }
    }

    /// Extend the lease now to now + `lease`, as the watchdog does every
    /// third of it; the watchdog renews with `lease` from then on.
    /// [`Error::Lost`] when the key was lost already, or when this keep
    /// finds it lost (a server says the token no longer holds it, or the
    /// lease ran out first): then the key is lost for the watchdog too,
    /// which says so ([`Held::lost`]). [`Error::Closed`] after
    /// `Client::close`. Other errors (no server answered) leave the key
    /// held: the watchdog keeps trying.
    pub fn keep(&self, lease: Duration) -> Result<(), Error> {
        block_on(self.keep_in(&Blocking, lease))
    }

    /// [`Held::keep`] as a `Send` future.
    pub fn keep_async(
        &self,
        lease: Duration,
    ) -> impl Future<Output = Result<(), Error>> + Send + '_ {
        self.keep_in(&Async, lease)
    }

    /// The one body of [`Held::keep`] and [`Held::keep_async`].
    async fn keep_in<W: Wait>(&self, wait: &W, lease: Duration) -> Result<(), Error> {
        self.client.check_open()?;
        let lease_ms = check_lease(lease)?;
        let mut grant = {
            let st = self.watch.state.lock();
            if st.lost.is_some() {
                return Err(Error::Lost);
            }
            st.grant.clone()
        };
        match calls::keep_in(wait, self.client.pool(), &mut grant, lease_ms).await {
            Ok(()) => {
                let mut st = self.watch.state.lock();
                if st.lost.is_some() {
                    return Err(Error::Lost);
                }
                if grant.lease_start() > st.grant.lease_start() {
                    st.grant = grant;
                    self.watch.changed.notify_all();
                }
                Ok(())
            }
            Err(why @ (Error::NotHeld | Error::Expired)) => {
                self.watch.lose(&grant, why);
                Err(Error::Lost)
            }
            Err(e) => Err(e),
        }
    }

    /// Tell the watchdog to exit without releasing; the grant, unless it
    /// was lost or the client closed.
    fn quit(&self) -> Result<Grant, Error> {
        self.client.check_open()?;
        let mut st = self.watch.state.lock();
        st.stop = Stop::Quit;
        self.watch.changed.notify_all();
        match st.lost {
            Some(_) => Err(Error::Lost),
            None => Ok(st.grant.clone()),
        }
    }
}

impl Watchdog {
    /// The key is lost: say why, once, to everyone waiting; nothing when
    /// the owner let go of it meanwhile.
    fn lose(&self, grant: &Grant, why: Error) {
        let mut st = self.state.lock();
        if st.lost.is_some() || st.stop != Stop::Running {
            return;
        }
        log::warn!("lost {} (token {}): {why}", grant.key(), grant.token());
        st.lost = Some(why);
        let wakers = std::mem::take(&mut st.wakers);
        self.changed.notify_all();
        drop(st);
        for waker in wakers {
            waker.wake();
        }
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

fn watchdog(client: &Client, watch: &Watchdog) {
    loop {
        let (mut grant, stop) = {
            let mut st = watch.state.lock();
            loop {
                let renew_at = st.grant.lease_start() + st.grant.lease() / 3;
                if st.stop != Stop::Running || st.lost.is_some() || Instant::now() >= renew_at {
                    break;
                }
                watch.changed.wait_until(&mut st, renew_at);
            }
            if st.lost.is_some() {
                return;
            }
            (st.grant.clone(), st.stop)
        };
        match stop {
            Stop::Running => {}
            Stop::Quit => return,
            Stop::Release => return release_dropped(client, &grant),
            Stop::Close => return release_closing(client, &grant),
        }
        match renew(client, &mut grant, watch) {
            Ok(()) => {
                let mut st = watch.state.lock();
                if st.stop == Stop::Running && grant.lease_start() > st.grant.lease_start() {
                    st.grant = grant;
                }
            }
            Err(why) => {
                watch.lose(&grant, why);
                return;
            }
        }
    }
}

/// Extend the lease, retrying every [`KEEP_RETRY`] while no server answers
/// and the lease lasts. Ok also when the owner let go meanwhile, or the
/// key was found lost by the owner's own keep.
fn renew(client: &Client, grant: &mut Grant, watch: &Watchdog) -> Result<(), Error> {
    loop {
        // Not `Client::keep`: a client closing refuses the owner's calls
        // at once, but its watchdogs run until told to let go.
        let lease_ms = calls::millis_ceil(grant.lease());
        match calls::keep(client.pool(), grant, lease_ms) {
            Ok(()) => return Ok(()),
            Err(e) if e.is_unreachable() => log::debug!("keep failed, retrying: {e}"),
            Err(e) => return Err(e),
        }
        let mut st = watch.state.lock();
        // Lost at once when the lease runs out, not at the next retry.
        let retry_at = (Instant::now() + KEEP_RETRY).min(grant.expires_at());
        while st.stop == Stop::Running && st.lost.is_none() && Instant::now() < retry_at {
            watch.changed.wait_until(&mut st, retry_at);
        }
        if st.stop != Stop::Running || st.lost.is_some() {
            return Ok(());
        }
        if grant.is_expired() {
            return Err(Error::Expired);
        }
    }
}

/// The client is closing: one release, best effort.
fn release_closing(client: &Client, grant: &Grant) {
    match calls::release_once(client.pool(), grant.key().clone(), grant.token()) {
        Ok(_) => log::debug!(
            "released {} (token {}): the client closed",
            grant.key(),
            grant.token()
        ),
        Err(e) => log::warn!(
            "could not release {} (token {}) as the client closed: {e}; its lease will run out",
            grant.key(),
            grant.token()
        ),
    }
}

fn release_dropped(client: &Client, grant: &Grant) {
    match calls::release(client.pool(), grant.key().clone(), grant.token()) {
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
