//! Watching a key: [`Watch`], made by [`Client::watch`] and
//! [`Client::observe`], a blocking iterator and an async stream of the
//! key's states that survives failover.
//!
//! Owns: one watch's subscription — which connection its `W <key>` went
//! out on, the mailbox (`feed.rs`) its lines arrive in, and what to do
//! when that subscription ends:
//! - the connection ends, or the node answers `E W <key> shutting-down`:
//!   send `W` again on another connection (at once the first time, then
//!   after pauses that grow from [`NO_ACTIVE_RETRY`] to [`MAX_PAUSE`] while
//!   no state comes);
//! - `M <active> W <key>`: prefer that node and send `W` there (at most
//!   [`MAX_REDIRECTS`] hops in a row without a state, then pause); `M -`,
//!   or an active that cannot be reached: pause and send again;
//! - a first line that does not come within the request timeout: close
//!   that connection (it reconnects) and send again elsewhere;
//! - any other refusal (`too-many-watches`), or a secret the servers
//!   refuse: the watch ends with that error;
//! - the client is closed: the watch ends with [`Error::Closed`].
//!
//! The first line of every new subscription is yielded, even when it
//! repeats the last state seen. The decisions are made by one non-blocking
//! step ([`Watch::step`]) shared by the blocking calls (which then wait on
//! the mailbox's condvar, the pool's phase changes or a sleep, on the
//! caller's thread) and the async ones (which register the task's waker
//! with the same three, the sleep on the client's timer thread).
//!
//! Never does: block in a drop (giving a watch up queues `X <key>` and
//! returns), spawn a thread, or give up on a watch because no server
//! answers (it keeps trying; [`Watch::next_timeout`] bounds a wait).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::client::calls::{MAX_REDIRECTS, NO_ACTIVE_RETRY};
use crate::client::conn::Conn;
use crate::client::feed::{Event, Feed};
use crate::client::pool::Target;
use crate::client::timer::Sleep;
use crate::client::{Client, Error};
use crate::protocol::{Key, Reason, WatchState};

/// The longest pause between two tries to watch again while no server
/// serves the watch.
pub const MAX_PAUSE: Duration = Duration::from_secs(1);

/// A key's holders as they change: each item is the key's state after a
/// change (the first is its state now). See [`Client::watch`].
///
/// Blocking: an [`Iterator`] of `Result<WatchState, Error>` (an `Err` is
/// the last item), and [`Watch::next_timeout`]. Async: [`Watch::next_async`]
/// and [`Watch::poll_next`] (the shape of a `Stream`, for any executor).
/// Dropping it, or [`Watch::close`], stops the watch (`X <key>`).
pub struct Watch {
    client: Client,
    key: Key,
    feed: Arc<Feed>,
    /// Counts subscriptions; events carry the one they belong to.
    epoch: u64,
    sub: Option<Subscription>,
    /// Only changes of the leader (token) are yielded.
    leaders_only: bool,
    last_token: Option<u64>,
    /// Failed tries in a row since the last state.
    failures: u32,
    /// Redirects followed in a row since the last state.
    hops: u32,
    /// No new subscription before this.
    not_before: Option<Instant>,
    /// Why the last try failed (reported when a bounded wait runs out).
    trouble: Option<Error>,
    /// Why the watch ended, once it has.
    ended: Option<Error>,
    /// The end was yielded (as the error item).
    told: bool,
    /// The async waits' timer, and the instant it is set for.
    sleep: Option<(Instant, Sleep)>,
}

/// The `W` sent on one connection.
struct Subscription {
    conn: Arc<Conn>,
    generation: u64,
    sent_at: Instant,
    answered: bool,
}

/// What the watch does next.
enum Step {
    /// Yield this state.
    Item(WatchState),
    /// The watch ends now with this error (yielded once).
    Failed(Error),
    /// The watch has ended (with this error).
    Ended(Error),
    /// Wait for the mailbox, until this instant at most (None: no limit).
    WaitFeed(Option<Instant>),
    /// Wait for a connection's phase to change after this version.
    WaitConn(u64),
    /// Wait until this instant.
    Sleep(Instant),
}

impl Watch {
    pub(crate) fn new(client: Client, key: Key, leaders_only: bool) -> Watch {
        let mut watch = Watch {
            client,
            key,
            feed: Arc::new(Feed::default()),
            epoch: 0,
            sub: None,
            leaders_only,
            last_token: None,
            failures: 0,
            hops: 0,
            not_before: None,
            trouble: None,
            ended: None,
            told: false,
            sleep: None,
        };
        // Send `W` now if a connection is up, so that the first state is
        // on its way before the caller asks for it.
        if let Err(e) = watch.subscribe() {
            watch.ended = Some(e);
        }
        watch
    }

    /// The key watched.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The next state, waiting at most `timeout` (None: without limit).
    /// `Ok(None)` when none came in time; `Err` when the watch ended (then
    /// every later call returns the same error).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// let mut watch = client.watch("reindex")?;
    /// while let Some(state) = watch.next_timeout(Some(Duration::from_secs(1)))? {
    ///     println!("{} holders, {} waiting", state.holders, state.waiting);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn next_timeout(&mut self, timeout: Option<Duration>) -> Result<Option<WatchState>, Error> {
        let until = timeout.map(|t| Instant::now() + t);
        loop {
            let step = self.step();
            if let Step::Item(state) = step {
                return Ok(Some(state));
            }
            if let Step::Failed(e) | Step::Ended(e) = step {
                return Err(e);
            }
            if until.is_some_and(|until| Instant::now() >= until) {
                return Ok(None);
            }
            match step {
                Step::WaitFeed(due) => {
                    self.feed.wait(self.epoch, earliest(due, until));
                }
                Step::WaitConn(seen) => {
                    let far = Instant::now() + Duration::from_secs(3600);
                    self.client.pool().wait_change(seen, until.unwrap_or(far));
                }
                Step::Sleep(at) => {
                    let at = earliest(Some(at), until).unwrap_or(at);
                    std::thread::sleep(at.saturating_duration_since(Instant::now()));
                }
                Step::Item(_) | Step::Failed(_) | Step::Ended(_) => {}
            }
        }
    }

    /// The next state as a `Send` future (see [`Watch::poll_next`]).
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// let mut watch = client.watch("reindex")?;
    /// while let Some(state) = watch.next_async().await {
    ///     let state = state?;
    ///     println!("token {} ({} holders)", state.token, state.holders);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn next_async(
        &mut self,
    ) -> impl Future<Output = Option<Result<WatchState, Error>>> + Send + '_ {
        std::future::poll_fn(move |cx| self.poll_next(cx))
    }

    /// Poll for the next state, the way a `Stream` is polled:
    /// `Ready(Some(Ok(state)))` for each state, `Ready(Some(Err(e)))` once
    /// when the watch ends with an error, then `Ready(None)`. `Pending`
    /// registers the task's waker: a line arriving, a connection coming up,
    /// or the end of a pause wakes it.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<WatchState, Error>>> {
        loop {
            match self.step() {
                Step::Item(state) => return Poll::Ready(Some(Ok(state))),
                Step::Failed(e) => return Poll::Ready(Some(Err(e))),
                Step::Ended(_) => return Poll::Ready(None),
                Step::WaitFeed(due) => {
                    if self.feed.poll(self.epoch, cx).is_ready() {
                        continue;
                    }
                    if let Some(due) = due
                        && self.poll_sleep(due, cx).is_ready()
                    {
                        continue;
                    }
                    return Poll::Pending;
                }
                Step::WaitConn(seen) => {
                    if self.client.pool().poll_change(seen, cx).is_ready() {
                        continue;
                    }
                    return Poll::Pending;
                }
                Step::Sleep(at) => {
                    if self.poll_sleep(at, cx).is_ready() {
                        continue;
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    /// Stop watching (as dropping it does).
    pub fn close(self) {}

    /// Why the last try to watch failed, if it did and no state came since
    /// (the watch keeps trying).
    pub fn trouble(&self) -> Option<&Error> {
        self.trouble.as_ref()
    }

    fn poll_sleep(&mut self, at: Instant, cx: &mut Context<'_>) -> Poll<()> {
        let sleep = match &mut self.sleep {
            Some((set_for, sleep)) if *set_for == at => sleep,
            other => {
                &mut other
                    .insert((at, self.client.pool().timer().sleep_until(at)))
                    .1
            }
        };
        Pin::new(sleep).poll(cx)
    }

    /// Decide what comes next, without blocking.
    fn step(&mut self) -> Step {
        loop {
            if self.ended.is_none() && self.client.is_closed() {
                self.give_up_subscription();
                self.ended = Some(Error::Closed);
            }
            if let Some(e) = &self.ended {
                if self.told {
                    return Step::Ended(e.clone());
                }
                self.told = true;
                return Step::Failed(e.clone());
            }
            if self.sub.is_none() {
                match self.subscribe() {
                    Ok(None) => continue,
                    Ok(Some(step)) => return step,
                    Err(e) => return self.fail(e),
                }
            }
            let Some(sub) = self.sub.as_mut() else {
                continue;
            };
            match self.feed.take(self.epoch) {
                Some(Event::State(state)) => {
                    sub.answered = true;
                    self.failures = 0;
                    self.hops = 0;
                    self.trouble = None;
                    if self.leaders_only && self.last_token == Some(state.token) {
                        continue;
                    }
                    self.last_token = Some(state.token);
                    return Step::Item(state);
                }
                Some(Event::Moved(active)) => {
                    self.give_up_subscription();
                    self.moved(active.as_deref());
                }
                Some(Event::Refused(Reason::ShuttingDown)) => {
                    self.give_up_subscription();
                    self.failed_try(Error::NoActive("the node is shutting down".into()));
                }
                Some(Event::Refused(reason)) => {
                    self.give_up_subscription();
                    return self.fail(Error::Refused(reason));
                }
                Some(Event::Ended) => {
                    let addr = sub.conn.addr.clone();
                    self.give_up_subscription();
                    self.failed_try(Error::NoConnection(format!(
                        "the connection to {addr} ended"
                    )));
                }
                None if sub.answered => return Step::WaitFeed(None),
                None => {
                    let due = sub.sent_at + self.client.pool().request_timeout();
                    if Instant::now() < due {
                        return Step::WaitFeed(Some(due));
                    }
                    let why = format!(
                        "{} did not answer W {} within {:.1?}",
                        sub.conn.addr,
                        self.key,
                        sub.sent_at.elapsed()
                    );
                    sub.conn.kill(sub.generation, why.clone());
                    self.give_up_subscription();
                    self.failed_try(Error::NoAnswer(why));
                }
            }
        }
    }

    /// Send `W` on a connection that is up: Ok(None) when sent (or to be
    /// tried again at once), Ok(Some(wait)) when there is nothing to do
    /// but wait, Err when the watch cannot go on.
    fn subscribe(&mut self) -> Result<Option<Step>, Error> {
        if let Some(at) = self.not_before {
            if Instant::now() < at {
                return Ok(Some(Step::Sleep(at)));
            }
            self.not_before = None;
        }
        let pool = self.client.pool();
        let seen = pool.phase_version();
        let conn = match pool.try_pick(Target::Any) {
            Ok(Some(conn)) => conn,
            Ok(None) => return Ok(Some(Step::WaitConn(seen))),
            Err(e) if e.is_unreachable() => {
                self.failed_try(e);
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        self.epoch += 1;
        self.feed.begin(self.epoch);
        match conn.watch(&self.key, &self.feed, self.epoch) {
            Some(generation) => {
                self.sub = Some(Subscription {
                    conn,
                    generation,
                    sent_at: Instant::now(),
                    answered: false,
                });
            }
            None => self.failed_try(Error::NoConnection(format!("{} went down", conn.addr))),
        }
        Ok(None)
    }

    /// `M <active> W <key>`: go to that node, or pause when none is named
    /// or it cannot be reached.
    fn moved(&mut self, active: Option<&str>) {
        if let Some(addr) = active {
            let pool = self.client.pool();
            match pool.node_for(addr) {
                Ok(node) if pool.is_reachable(node) && self.hops < MAX_REDIRECTS => {
                    self.hops += 1;
                    pool.prefer(node);
                    return;
                }
                Ok(_) => self.failed_try(Error::NoActive(format!(
                    "redirected to {addr}, which cannot be reached"
                ))),
                Err(e) => self.failed_try(e),
            }
            return;
        }
        self.failed_try(Error::NoActive("the servers know no active node".into()));
    }

    /// A try that failed: try again after a pause that grows with the
    /// failures in a row (none after the first).
    fn failed_try(&mut self, why: Error) {
        log::debug!("watch of {}: {why}; watching again", self.key);
        self.trouble = Some(why);
        self.failures += 1;
        let pause = match self.failures {
            0 | 1 => Duration::ZERO,
            n => NO_ACTIVE_RETRY
                .saturating_mul(1 << (n - 2).min(8))
                .min(MAX_PAUSE),
        };
        self.not_before = Some(Instant::now() + pause);
    }

    fn fail(&mut self, e: Error) -> Step {
        self.give_up_subscription();
        self.ended = Some(e.clone());
        self.told = true;
        Step::Failed(e)
    }

    /// Give the current subscription up (`X` if it is the key's last watch
    /// on a connection still up).
    fn give_up_subscription(&mut self) {
        if let Some(sub) = self.sub.take() {
            sub.conn
                .unwatch(&self.key, sub.generation, &self.feed, self.epoch);
        }
        self.feed.begin(0);
    }
}

impl Iterator for Watch {
    type Item = Result<WatchState, Error>;

    /// The next state, waiting without limit; an error ends the watch (it
    /// is the last item).
    fn next(&mut self) -> Option<Self::Item> {
        if self.told {
            return None;
        }
        match self.next_timeout(None) {
            Ok(Some(state)) => Some(Ok(state)),
            // Without a timeout a wait ends only with a state or an error.
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.give_up_subscription();
    }
}

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch")
            .field("key", &self.key)
            .field(
                "subscribed",
                &self.sub.as_ref().map(|s| s.conn.addr.as_str()),
            )
            .field("ended", &self.ended)
            .finish()
    }
}

/// The earlier of two optional deadlines (None: no limit).
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The first state of `watch` within `budget`: for [`Client::leader`].
pub(crate) fn first_state(mut watch: Watch, budget: Duration) -> Result<WatchState, Error> {
    match watch.next_timeout(Some(budget))? {
        Some(state) => Ok(state),
        None => Err(no_state(&watch, budget)),
    }
}

/// [`first_state`] for async callers.
pub(crate) async fn first_state_async(
    mut watch: Watch,
    budget: Duration,
) -> Result<WatchState, Error> {
    let mut deadline = watch
        .client
        .pool()
        .timer()
        .sleep_until(Instant::now() + budget);
    let got = std::future::poll_fn(|cx| {
        if let Poll::Ready(item) = watch.poll_next(cx) {
            return Poll::Ready(item);
        }
        match Pin::new(&mut deadline).poll(cx) {
            Poll::Ready(()) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    })
    .await;
    match got {
        Some(state) => state,
        None => match &watch.ended {
            Some(e) => Err(e.clone()),
            None => Err(no_state(&watch, budget)),
        },
    }
}

fn no_state(watch: &Watch, budget: Duration) -> Error {
    match &watch.trouble {
        Some(e) => e.clone(),
        None => Error::NoAnswer(format!("no state of {} within {budget:.1?}", watch.key)),
    }
}
