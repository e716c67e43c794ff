//! The calls: how one request becomes one result, across dropped
//! connections, redirects and deadlines.
//!
//! Owns the policies:
//! - an attempt whose connection drops moves to the next connection; the
//!   call fails only after as many failed attempts as there are registered
//!   connections (an answer `E <op> <key> shutting-down` counts as failed);
//! - `M host:port`: prefer that node from now on (registering it if it is
//!   new) and send again; `M -`, or a redirect to a node that is down: wait
//!   [`NO_ACTIVE_RETRY`] and send again, for up to the request timeout; at
//!   most [`MAX_REDIRECTS`] redirects per call;
//! - a grant answered after more than a third of its lease (it waited in
//!   line) is confirmed at once with `K`, so that its lease, counted from a
//!   send time, does not look spent on arrival; while it does, the call
//!   counts its grant in hand, and if the client begins closing it releases
//!   the grant itself and fails `Closed` (close waits for it);
//! - a release is retried for [`RELEASE_RETRY_WINDOW`] at
//!   [`RELEASE_RETRY_INTERVAL`] while no connection can carry it; `N` after
//!   an attempt that may have reached the server counts as released;
//! - deadlines: a connection has the request timeout to answer (an acquire:
//!   its wait plus the request timeout; an acquire without a wait limit: no
//!   limit), else it is closed; the caller's own deadline may be earlier.
//!   That clock starts when the request reaches the front of its (op, key)
//!   line on its connection (the server holds back the answer to an acquire
//!   sent behind an earlier acquire of the same key there, even a `T`), and
//!   an acquire still held back at its caller's deadline ends in
//!   [`Error::Timeout`] (its wait ran out long before; a grant that comes
//!   later is released), never in a closed connection;
//!
//! Each call is written once, as an `async fn` generic over a [`Wait`]: the
//! three places a call waits (for a connection to come up, for an answer,
//! through a pause before sending again). The blocking flavour runs that one
//! body with [`Blocking`], whose waits block the caller's thread and are
//! ready when awaited, under a trivial `block_on` on the caller's thread (it
//! blocks it at most until the call's deadline); `*_async` runs it with
//! [`Async`], whose waits register the task's waker (an answer wakes it from
//! the connection's reader thread; a deadline or a pause from the client's
//! timer thread). So both make every decision in the same code: only the
//! waiting differs.
//!
//! Never does: touch sockets (that is `conn.rs`) or choose connections (that
//! is `pool.rs`).

use std::future::{Future, ready};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::client::Error;
use crate::client::block::block_on;
use crate::client::conn::{Conn, Outcome, Ticket};
use crate::client::grant::{Grant, KeyStatus, NodeInfo, ReleaseOutcome};
use crate::client::options::Ask;
use crate::client::pool::{Pool, Target};
use crate::protocol::{Answer, Key, Reason, Request};

/// How long a release keeps trying while no connection can carry it.
pub const RELEASE_RETRY_WINDOW: Duration = Duration::from_secs(5);
/// Time between two release attempts.
pub const RELEASE_RETRY_INTERVAL: Duration = Duration::from_millis(200);
/// Time before sending again after `M -` (no active node known right now).
pub const NO_ACTIVE_RETRY: Duration = Duration::from_millis(100);
/// Redirects to a named node one call follows, at most.
pub const MAX_REDIRECTS: u32 = 8;

/// How one attempt on one connection ended.
pub enum Attempt {
    Answered(Answer, Instant),
    /// The connection dropped; `sent` if the line may have gone out.
    Lost {
        sent: bool,
    },
    Overdue(String),
    /// An acquire's caller's deadline passed while the server held its
    /// answer back behind an earlier acquire of the same key on the
    /// connection (that answer is a `T`: its wait ran out long ago).
    HeldBack,
    Unreachable(Error),
}

/// A final answer (not `M`), with when its request was sent and whether an
/// earlier attempt of the same call may have reached the server.
pub struct Exchanged {
    pub answer: Answer,
    pub sent_at: Instant,
    pub earlier_maybe_delivered: bool,
}

/// A call that got no final answer.
pub struct Failure {
    pub error: Error,
    pub maybe_delivered: bool,
}

/// The time a connection has to answer `request` before it is deemed dead.
pub fn answer_budget(request: &Request, request_timeout: Duration) -> Option<Duration> {
    match request {
        Request::Acquire { wait_ms: 0, .. } => None,
        Request::Acquire { wait_ms, .. } => Some(Duration::from_millis(*wait_ms) + request_timeout),
        Request::Release { .. }
        | Request::Keep { .. }
        | Request::Query { .. }
        | Request::Info
        | Request::Auth { .. }
        | Request::Watch { .. }
        | Request::Unwatch { .. } => Some(request_timeout),
    }
}

/// Whole milliseconds in `d`, rounded up (so a short wait never becomes
/// 0, which would mean no limit), saturating.
pub fn millis_ceil(d: Duration) -> u64 {
    let whole = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    u64::try_from(whole).unwrap_or(u64::MAX)
}

/// Milliseconds from now until `end`, rounded up; 0 once it has passed.
fn millis_until(end: Instant) -> u64 {
    millis_ceil(end.saturating_duration_since(Instant::now()))
}

/// Where a call waits: the one difference between the blocking and the
/// async flavour of every call.
pub trait Wait: Sync {
    /// A connection that is up for `request` (see [`Pool::pick`]).
    fn pick(
        &self,
        pool: &Pool,
        target: Target,
        request: &Request,
        due: Option<Instant>,
    ) -> impl Future<Output = Result<Arc<Conn>, Error>> + Send;
    /// The answer to a request sent, or why none came (see [`Ticket::wait`]).
    fn answer(
        &self,
        pool: &Pool,
        ticket: Ticket,
        budget: Option<Duration>,
        due: Option<Instant>,
    ) -> impl Future<Output = Outcome> + Send;
    /// Nothing until `until`.
    fn pause(&self, pool: &Pool, until: Instant) -> impl Future<Output = ()> + Send;
}

/// Waits that block the caller's thread; each is ready when awaited, so a
/// call's body completes in one poll of [`block_on`].
pub struct Blocking;

impl Wait for Blocking {
    fn pick(
        &self,
        pool: &Pool,
        target: Target,
        request: &Request,
        due: Option<Instant>,
    ) -> impl Future<Output = Result<Arc<Conn>, Error>> + Send {
        ready(pool.pick(target, request, due))
    }

    fn answer(
        &self,
        _pool: &Pool,
        ticket: Ticket,
        budget: Option<Duration>,
        due: Option<Instant>,
    ) -> impl Future<Output = Outcome> + Send {
        ready(ticket.wait(budget, due))
    }

    fn pause(&self, _pool: &Pool, until: Instant) -> impl Future<Output = ()> + Send {
        thread::sleep(until.saturating_duration_since(Instant::now()));
        ready(())
    }
}

/// Waits that register the task's waker: with the connections' phase
/// changes, an answer's one-shot cell, or the client's timer.
pub struct Async;

impl Wait for Async {
    fn pick(
        &self,
        pool: &Pool,
        target: Target,
        request: &Request,
        due: Option<Instant>,
    ) -> impl Future<Output = Result<Arc<Conn>, Error>> + Send {
        pool.pick_async(target, request, due)
    }

    fn answer(
        &self,
        pool: &Pool,
        ticket: Ticket,
        budget: Option<Duration>,
        due: Option<Instant>,
    ) -> impl Future<Output = Outcome> + Send {
        ticket.wait_async(budget, due, pool.timer())
    }

    fn pause(&self, pool: &Pool, until: Instant) -> impl Future<Output = ()> + Send {
        pool.timer().sleep_until(until)
    }
}

async fn attempt<W: Wait>(
    wait: &W,
    pool: &Pool,
    target: Target,
    request: &Request,
    due: Option<Instant>,
) -> Attempt {
    let conn = match wait.pick(pool, target, request, due).await {
        Ok(conn) => conn,
        Err(e) => return Attempt::Unreachable(e),
    };
    let Some(ticket) = conn.send(request) else {
        return Attempt::Lost { sent: false };
    };
    let sent_at = ticket.sent_at;
    let budget = answer_budget(request, pool.request_timeout());
    let outcome = wait.answer(pool, ticket, budget, due).await;
    attempted(&conn, request, sent_at, outcome)
}

fn attempted(conn: &Conn, request: &Request, sent_at: Instant, outcome: Outcome) -> Attempt {
    match outcome {
        Outcome::Answer(answer) => Attempt::Answered(answer, sent_at),
        Outcome::Lost => Attempt::Lost { sent: true },
        Outcome::HeldBack if matches!(request, Request::Acquire { .. }) => Attempt::HeldBack,
        Outcome::Overdue | Outcome::HeldBack => Attempt::Overdue(format!(
            "{} did not answer within {:.1?}",
            conn.addr,
            sent_at.elapsed()
        )),
    }
}

/// Send the request `make` builds (again on each attempt) until a final
/// answer comes, following redirects and moving on from dropped connections.
pub async fn exchange<W: Wait>(
    wait: &W,
    pool: &Pool,
    target: Target,
    due: Option<Instant>,
    mut make: impl FnMut() -> Result<Request, Error> + Send,
) -> Result<Exchanged, Failure> {
    let mut call = Call::new(pool);
    loop {
        if pool.is_closed() {
            return Err(call.fail(Error::Closed));
        }
        let request = make().map_err(|e| call.fail(e))?;
        let outcome = attempt(wait, pool, target, &request, due).await;
        match call.handle(pool, target, due, outcome)? {
            Next::Done(done) => return Ok(done),
            Next::Again => {}
            Next::After(pause) => wait.pause(pool, Instant::now() + pause).await,
        }
    }
}

/// What to do after one attempt.
enum Next {
    /// The final answer.
    Done(Exchanged),
    /// Send again now.
    Again,
    /// Send again after this pause.
    After(Duration),
}

/// What one call has been through so far.
struct Call {
    failures: usize,
    delivered: bool,
    redirects: Redirects,
}

impl Call {
    fn new(pool: &Pool) -> Call {
        Call {
            failures: 0,
            delivered: false,
            redirects: Redirects::new(pool.request_timeout()),
        }
    }

    fn fail(&self, error: Error) -> Failure {
        Failure {
            error,
            maybe_delivered: self.delivered,
        }
    }

    /// The final answer, another attempt, or the call's failure.
    fn handle(
        &mut self,
        pool: &Pool,
        target: Target,
        due: Option<Instant>,
        outcome: Attempt,
    ) -> Result<Next, Failure> {
        if pool.is_closed() && !matches!(outcome, Attempt::Answered(..)) {
            // The connections were closed under this call.
            return Err(self.fail(Error::Closed));
        }
        match outcome {
            Attempt::Answered(Answer::Moved { active, .. }, _) => {
                let followed = self.redirects.follow(pool, active.as_deref(), due);
                return match followed {
                    Ok(None) => Ok(Next::Again),
                    Ok(Some(pause)) => Ok(Next::After(pause)),
                    Err(e) => Err(self.fail(e)),
                };
            }
            Attempt::Answered(answer, sent_at) if !is_shutting_down(&answer) => {
                return Ok(Next::Done(Exchanged {
                    answer,
                    sent_at,
                    earlier_maybe_delivered: self.delivered,
                }));
            }
            Attempt::Answered(..) => self.failures += 1,
            Attempt::Lost { sent } => {
                self.delivered |= sent;
                self.failures += 1;
            }
            Attempt::Overdue(why) => {
                self.delivered = true;
                return Err(self.fail(Error::NoAnswer(why)));
            }
            Attempt::HeldBack => {
                self.delivered = true;
                return Err(self.fail(Error::Timeout));
            }
            Attempt::Unreachable(e) => return Err(self.fail(e)),
        }
        if self.failures < pool.connection_count(target) {
            return Ok(Next::Again);
        }
        if let Some(refused) = pool.auth_error(target) {
            return Err(self.fail(refused));
        }
        let why = format!(
            "the connection failed on each of {} attempts: {}",
            self.failures,
            pool.describe(target)
        );
        Err(self.fail(Error::NoConnection(why)))
    }
}

/// `E <op> <key> shutting-down`: this node is going away; try another.
fn is_shutting_down(answer: &Answer) -> bool {
    matches!(
        answer,
        Answer::Error {
            reason: Reason::ShuttingDown,
            ..
        }
    )
}

/// Following `M` answers within one call.
struct Redirects {
    hops: u32,
    waiting_since: Option<Instant>,
    patience: Duration,
}

impl Redirects {
    fn new(patience: Duration) -> Redirects {
        Redirects {
            hops: 0,
            waiting_since: None,
            patience,
        }
    }

    /// Act on `M <active>`: prefer that node (None: send again now), or
    /// pause a little (Some) when no usable active node is named.
    fn follow(
        &mut self,
        pool: &Pool,
        active: Option<&str>,
        due: Option<Instant>,
    ) -> Result<Option<Duration>, Error> {
        if let Some(addr) = active {
            let node = pool.node_for(addr)?;
            if pool.is_reachable(node) {
                self.hops += 1;
                if self.hops > MAX_REDIRECTS {
                    return Err(Error::NoActive(format!(
                        "redirected {MAX_REDIRECTS} times without reaching the active node (last: {addr})"
                    )));
                }
                pool.prefer(node);
                self.waiting_since = None;
                return Ok(None);
            }
        }
        self.pause(active, due)
    }

    fn pause(
        &mut self,
        active: Option<&str>,
        due: Option<Instant>,
    ) -> Result<Option<Duration>, Error> {
        let since = *self.waiting_since.get_or_insert_with(Instant::now);
        let wake = Instant::now() + NO_ACTIVE_RETRY;
        if since.elapsed() >= self.patience || due.is_some_and(|due| wake >= due) {
            let why = match active {
                Some(addr) => format!("redirected to {addr}, which cannot be reached"),
                None => format!(
                    "the servers know no active node (waited {:.1?})",
                    since.elapsed()
                ),
            };
            return Err(Error::NoActive(why));
        }
        Ok(Some(NO_ACTIVE_RETRY))
    }
}

fn unexpected(answer: &Answer) -> Error {
    Error::Protocol(format!("unexpected answer {answer:?}"))
}

/// `A key lease wait [limit [value]]`; `wait_ms` None waits without limit.
/// A re-sent acquire asks only for the wait that is left.
///
/// A grant's lease is counted from when its acquire was sent; one that
/// waited in line may have spent most of its lease that way by this count,
/// though the server started it only at the hand-over. So a grant answered
/// after more than a third of its lease is confirmed at once with `K`, whose
/// send time becomes the lease start. A grant that ran out before it arrived
/// is asked for again (at most [`ACQUIRE_ROUNDS`] times).
pub fn acquire(
    pool: &Pool,
    key: Key,
    lease_ms: u64,
    wait_ms: Option<u64>,
    ask: &Ask,
) -> Result<Grant, Error> {
    block_on(acquire_in(&Blocking, pool, key, lease_ms, wait_ms, ask))
}

/// [`acquire`] for async callers.
pub async fn acquire_async(
    pool: &Pool,
    key: Key,
    lease_ms: u64,
    wait_ms: Option<u64>,
    ask: &Ask,
) -> Result<Grant, Error> {
    acquire_in(&Async, pool, key, lease_ms, wait_ms, ask).await
}

/// The one body of [`acquire`] and [`acquire_async`].
async fn acquire_in<W: Wait>(
    wait: &W,
    pool: &Pool,
    key: Key,
    lease_ms: u64,
    wait_ms: Option<u64>,
    ask: &Ask,
) -> Result<Grant, Error> {
    let wait_end = wait_ms.map(|ms| Instant::now() + Duration::from_millis(ms));
    for _ in 0..ACQUIRE_ROUNDS {
        let make = || match pool.is_closing() {
            true => Err(Error::Closed),
            false => acquire_request(&key, lease_ms, wait_end, ask),
        };
        let due = wait_end.map(|end| end + pool.request_timeout());
        let done = exchange(wait, pool, Target::Any, due, make)
            .await
            .map_err(|f| f.error)?;
        let grant = acquire_answer(done, lease_ms)?;
        if !needs_confirming(&grant) {
            return Ok(grant);
        }
        let (request, due) = confirm_request(pool, &grant);
        // The grant is ours from here on: if the caller drops an async
        // acquire while the `K` is out, nobody will ever release it; and
        // a close that begins meanwhile waits for this call (counted in
        // hand), which then releases the grant itself.
        let _in_hand = pool.grant_in_hand();
        let unwanted = ReleaseOnDrop::arm(pool, &grant);
        if pool.is_closing() {
            release_in_hand(wait, pool, &grant).await;
            unwanted.disarm();
            return Err(Error::Closed);
        }
        let confirmed = exchange(wait, pool, Target::Any, Some(due), || Ok(request.clone())).await;
        let confirmed = confirmed_grant(grant, confirmed);
        if pool.is_closing() {
            // A `K` answered not-held left nothing to release.
            if let Some(grant) = &confirmed {
                release_in_hand(wait, pool, grant).await;
            }
            unwanted.disarm();
            return Err(Error::Closed);
        }
        unwanted.disarm();
        match confirmed {
            Some(grant) => return Ok(grant),
            None => log::info!("a grant of {key} ran out before it arrived; asking again"),
        }
    }
    Err(Error::Expired)
}

/// The client began closing while an acquire had its grant in hand: the
/// call releases the grant itself (`R`, its answer awaited, bounded by the
/// request timeout) before it fails `Closed`, and close waits for it.
async fn release_in_hand<W: Wait>(wait: &W, pool: &Pool, grant: &Grant) {
    let (key, token) = (grant.key().clone(), grant.token());
    match release_once_in(wait, pool, key, token).await {
        Ok(_) => log::info!(
            "released {} (token {token}): the client closed before the grant was returned",
            grant.key()
        ),
        Err(e) => log::warn!(
            "could not release {} (token {token}) as the client closed: {e}; its lease will run out",
            grant.key()
        ),
    }
}

/// Releases a grant that arrived but was never handed to its caller: the
/// async acquire was dropped while the grant's confirming `K` was out (the
/// reader thread releases grants that arrive after their caller gave up;
/// this one had arrived already). A drop must not block, so the `R` is
/// queued on a connection that is up now, its answer unawaited; with none
/// up, the lease runs out on its own.
struct ReleaseOnDrop<'a> {
    pool: &'a Pool,
    grant: Option<(Key, u64)>,
}

impl<'a> ReleaseOnDrop<'a> {
    fn arm(pool: &'a Pool, grant: &Grant) -> ReleaseOnDrop<'a> {
        ReleaseOnDrop {
            pool,
            grant: Some((grant.key().clone(), grant.token())),
        }
    }

    /// The grant reached its caller (or was found lost): nothing to do.
    fn disarm(mut self) {
        self.grant = None;
    }
}

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        let Some((key, token)) = self.grant.take() else {
            return;
        };
        let release = Request::Release {
            key: key.clone(),
            token,
        };
        match self.pool.pick_now(Target::Any) {
            // The ticket is dropped unawaited: the answer is ignored.
            Some(conn) if conn.send(&release).is_some() => {
                log::info!("releasing {key} (token {token}): its caller gave up");
            }
            _ => log::warn!(
                "could not release {key} (token {token}), whose caller gave up: \
                 no connection is up; its lease will run out"
            ),
        }
    }
}

/// Grants that ran out before they arrived, asked for again, at most.
pub const ACQUIRE_ROUNDS: usize = 3;

/// The acquire to send now: the wait asked for is what is left of it.
fn acquire_request(
    key: &Key,
    lease_ms: u64,
    wait_end: Option<Instant>,
    ask: &Ask,
) -> Result<Request, Error> {
    let wait_left = match wait_end {
        None => 0,
        Some(end) => match millis_until(end) {
            0 => return Err(Error::Timeout),
            left => left,
        },
    };
    Ok(Request::Acquire {
        key: key.clone(),
        lease_ms,
        wait_ms: wait_left,
        limit: ask.limit,
        value: ask.value.clone(),
    })
}

fn acquire_answer(done: Exchanged, lease_ms: u64) -> Result<Grant, Error> {
    match done.answer {
        // A slot comes with every grant of an acquire that named a limit;
        // without one, the key is a mutex and its one slot is 0.
        Answer::Granted { token, key, slot } => Ok(Grant::new(
            key,
            token,
            slot.unwrap_or(0),
            lease_ms,
            done.sent_at,
        )),
        Answer::Timeout { .. } => Err(Error::Timeout),
        Answer::Error { reason, .. } => Err(Error::Refused(reason)),
        other => Err(unexpected(&other)),
    }
}

/// True when a grant came after more than a third of its lease (it waited
/// in line): its lease is restarted with `K` before the caller gets it.
fn needs_confirming(grant: &Grant) -> bool {
    grant.lease_start().elapsed() > grant.lease() / 3
}

/// The `K` that restarts a fresh grant's lease, and its deadline.
fn confirm_request(pool: &Pool, grant: &Grant) -> (Request, Instant) {
    let request = Request::Keep {
        key: grant.key().clone(),
        token: grant.token(),
        lease_ms: millis_ceil(grant.lease()),
    };
    (request, Instant::now() + pool.request_timeout())
}

/// The grant after its confirming `K`: None when it had already run out;
/// unchanged when no server could say.
fn confirmed_grant(mut grant: Grant, confirmed: Result<Exchanged, Failure>) -> Option<Grant> {
    match confirmed {
        Ok(done) => match done.answer {
            Answer::Kept { .. } => grant.renew(millis_ceil(grant.lease()), done.sent_at),
            Answer::Error {
                reason: Reason::NotHeld,
                ..
            } => return None,
            other => {
                let mut line = Vec::new();
                other.write_to(&mut line);
                let line = String::from_utf8_lossy(&line);
                log::warn!(
                    "confirming {}: unexpected answer {}",
                    grant.key(),
                    line.trim_end()
                );
            }
        },
        Err(failure) => log::warn!("confirming {}: {}", grant.key(), failure.error),
    }
    Some(grant)
}

/// `R key token`, retried while no connection can carry it.
pub fn release(pool: &Pool, key: Key, token: u64) -> Result<ReleaseOutcome, Error> {
    block_on(release_in(&Blocking, pool, key, token))
}

/// [`release`] for async callers.
pub async fn release_async(pool: &Pool, key: Key, token: u64) -> Result<ReleaseOutcome, Error> {
    release_in(&Async, pool, key, token).await
}

/// The one body of [`release`] and [`release_async`].
async fn release_in<W: Wait>(
    wait: &W,
    pool: &Pool,
    key: Key,
    token: u64,
) -> Result<ReleaseOutcome, Error> {
    let request = Request::Release { key, token };
    let mut retry = ReleaseRetry::new(pool);
    loop {
        let result = exchange(wait, pool, Target::Any, retry.due, || Ok(request.clone())).await;
        if let Some(outcome) = retry.after(result, token) {
            return outcome;
        }
        wait.pause(pool, Instant::now() + RELEASE_RETRY_INTERVAL)
            .await;
    }
}

/// `R key token`, one call and no retries after it fails: a held key's
/// release when its client closes (best effort, bounded by the request
/// timeout).
pub fn release_once(pool: &Pool, key: Key, token: u64) -> Result<ReleaseOutcome, Error> {
    block_on(release_once_in(&Blocking, pool, key, token))
}

/// The one body of [`release_once`] and of the release of a grant in hand
/// as the client closes: one attempt, bounded by the request timeout.
async fn release_once_in<W: Wait>(
    wait: &W,
    pool: &Pool,
    key: Key,
    token: u64,
) -> Result<ReleaseOutcome, Error> {
    let due = Some(Instant::now() + pool.request_timeout());
    let request = Request::Release { key, token };
    let exchanged = exchange(wait, pool, Target::Any, due, || Ok(request.clone())).await;
    release_outcome(exchanged.map_err(|f| f.error)?, false)
}

/// One release's retries: whether an attempt may have got through, and
/// until when to try.
struct ReleaseRetry {
    retry_end: Instant,
    due: Option<Instant>,
    delivered: bool,
}

impl ReleaseRetry {
    fn new(pool: &Pool) -> ReleaseRetry {
        let retry_end = Instant::now() + RELEASE_RETRY_WINDOW;
        ReleaseRetry {
            retry_end,
            due: Some(retry_end + pool.request_timeout()),
            delivered: false,
        }
    }

    /// The release's outcome, or None to try again after the interval.
    fn after(
        &mut self,
        result: Result<Exchanged, Failure>,
        token: u64,
    ) -> Option<Result<ReleaseOutcome, Error>> {
        match result {
            Ok(done) => Some(release_outcome(done, self.delivered)),
            Err(failure) => {
                self.delivered |= failure.maybe_delivered;
                let late = Instant::now() + RELEASE_RETRY_INTERVAL > self.retry_end;
                if late || !failure.error.is_unreachable() {
                    return Some(Err(failure.error));
                }
                log::debug!(
                    "release of token {token} failed, retrying: {}",
                    failure.error
                );
                None
            }
        }
    }
}

fn release_outcome(done: Exchanged, delivered: bool) -> Result<ReleaseOutcome, Error> {
    let maybe_delivered = delivered || done.earlier_maybe_delivered;
    match done.answer {
        Answer::Released { .. } => Ok(ReleaseOutcome::Released),
        Answer::NotHeld { .. } if maybe_delivered => Ok(ReleaseOutcome::Released),
        Answer::NotHeld { .. } => Ok(ReleaseOutcome::NotHeld),
        Answer::Error { reason, .. } => Err(Error::Refused(reason)),
        other => Err(unexpected(&other)),
    }
}

/// `K key token lease`: extend `grant` to now + lease. Waits at most until
/// the grant expires by the client's clock.
pub fn keep(pool: &Pool, grant: &mut Grant, lease_ms: u64) -> Result<(), Error> {
    block_on(keep_in(&Blocking, pool, grant, lease_ms))
}

/// [`keep`] for async callers.
pub async fn keep_async(pool: &Pool, grant: &mut Grant, lease_ms: u64) -> Result<(), Error> {
    keep_in(&Async, pool, grant, lease_ms).await
}

/// The one body of [`keep`] and [`keep_async`] (and of a held key's).
pub async fn keep_in<W: Wait>(
    wait: &W,
    pool: &Pool,
    grant: &mut Grant,
    lease_ms: u64,
) -> Result<(), Error> {
    if grant.is_expired() {
        return Err(Error::Expired);
    }
    let due = grant.expires_at();
    let key = grant.key().clone();
    let result = keep_token_in(wait, pool, key, grant.token(), lease_ms, due).await;
    match result {
        Ok(sent_at) => {
            grant.renew(lease_ms, sent_at);
            Ok(())
        }
        Err(e) if e.is_unreachable() && grant.is_expired() => Err(Error::Expired),
        Err(e) => Err(e),
    }
}

/// `K key token lease`, waiting for an answer until `due`; when the keep
/// that got through was sent.
pub fn keep_token(
    pool: &Pool,
    key: Key,
    token: u64,
    lease_ms: u64,
    due: Instant,
) -> Result<Instant, Error> {
    block_on(keep_token_in(&Blocking, pool, key, token, lease_ms, due))
}

async fn keep_token_in<W: Wait>(
    wait: &W,
    pool: &Pool,
    key: Key,
    token: u64,
    lease_ms: u64,
    due: Instant,
) -> Result<Instant, Error> {
    let request = keep_request(key, token, lease_ms);
    exchange(wait, pool, Target::Any, Some(due), || Ok(request.clone()))
        .await
        .map_err(|f| f.error)
        .and_then(keep_outcome)
}

fn keep_request(key: Key, token: u64, lease_ms: u64) -> Request {
    Request::Keep {
        key,
        token,
        lease_ms,
    }
}

fn keep_outcome(done: Exchanged) -> Result<Instant, Error> {
    match done.answer {
        Answer::Kept { .. } => Ok(done.sent_at),
        Answer::Error {
            reason: Reason::NotHeld,
            ..
        } => Err(Error::NotHeld),
        Answer::Error { reason, .. } => Err(Error::Refused(reason)),
        other => Err(unexpected(&other)),
    }
}

/// `Q key`.
pub fn query(pool: &Pool, key: Key) -> Result<KeyStatus, Error> {
    block_on(query_in(&Blocking, pool, key))
}

/// [`query`] for async callers.
pub async fn query_async(pool: &Pool, key: Key) -> Result<KeyStatus, Error> {
    query_in(&Async, pool, key).await
}

/// The one body of [`query`] and [`query_async`].
async fn query_in<W: Wait>(wait: &W, pool: &Pool, key: Key) -> Result<KeyStatus, Error> {
    let due = Some(Instant::now() + pool.request_timeout());
    let request = Request::Query { key };
    let done = exchange(wait, pool, Target::Any, due, || Ok(request.clone()))
        .await
        .map_err(|f| f.error)?;
    query_outcome(done)
}

fn query_outcome(done: Exchanged) -> Result<KeyStatus, Error> {
    match done.answer {
        Answer::Queried {
            token,
            ms_left,
            waiting,
            ..
        } => Ok(KeyStatus {
            token: (token != 0).then_some(token),
            time_left: Duration::from_millis(ms_left),
            waiting,
        }),
        Answer::Error { reason, .. } => Err(Error::Refused(reason)),
        other => Err(unexpected(&other)),
    }
}

/// `I`, asked of one node.
pub fn info(pool: &Pool, node: usize) -> Result<NodeInfo, Error> {
    let due = Some(Instant::now() + pool.connect_timeout() + pool.request_timeout());
    let exchanged = exchange(&Blocking, pool, Target::Node(node), due, || {
        Ok(Request::Info)
    });
    let done = block_on(exchanged).map_err(|f| f.error)?;
    match done.answer {
        Answer::Info(info) => Ok(NodeInfo {
            pairs: info
                .pairs()
                .map(|(name, value)| (name.to_owned(), value.to_owned()))
                .collect(),
        }),
        Answer::Error { reason, .. } => Err(Error::Refused(reason)),
        other => Err(unexpected(&other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::new(b"k").expect("valid key")
    }

    #[test]
    fn durations_round_up_to_whole_milliseconds() {
        assert_eq!(millis_ceil(Duration::ZERO), 0);
        assert_eq!(millis_ceil(Duration::from_nanos(1)), 1);
        assert_eq!(millis_ceil(Duration::from_millis(1500)), 1500);
        assert_eq!(millis_ceil(Duration::from_micros(1500)), 2);
        assert_eq!(millis_ceil(Duration::MAX), u64::MAX);
    }

    #[test]
    fn a_connection_has_the_wait_plus_the_request_timeout_to_answer_an_acquire() {
        let rt = Duration::from_secs(5);
        let forever = Request::Acquire {
            key: key(),
            lease_ms: 1000,
            wait_ms: 0,
            limit: None,
            value: None,
        };
        assert_eq!(answer_budget(&forever, rt), None);
        let bounded = Request::Acquire {
            key: key(),
            lease_ms: 1000,
            wait_ms: 2000,
            limit: None,
            value: None,
        };
        assert_eq!(answer_budget(&bounded, rt), Some(Duration::from_secs(7)));
        assert_eq!(answer_budget(&Request::Info, rt), Some(rt));
    }

    fn exchanged(answer: Answer, earlier: bool) -> Exchanged {
        Exchanged {
            answer,
            sent_at: Instant::now(),
            earlier_maybe_delivered: earlier,
        }
    }

    #[test]
    fn not_held_after_an_attempt_that_may_have_got_through_is_released() {
        let not_held = || Answer::NotHeld { key: key() };
        assert_eq!(
            release_outcome(exchanged(not_held(), false), false),
            Ok(ReleaseOutcome::NotHeld)
        );
        assert_eq!(
            release_outcome(exchanged(not_held(), true), false),
            Ok(ReleaseOutcome::Released)
        );
        assert_eq!(
            release_outcome(exchanged(not_held(), false), true),
            Ok(ReleaseOutcome::Released)
        );
        let released = Answer::Released { key: key() };
        assert_eq!(
            release_outcome(exchanged(released, false), false),
            Ok(ReleaseOutcome::Released)
        );
    }

    #[test]
    fn a_refused_release_is_an_error() {
        let refused = Answer::Error {
            op: Some(crate::protocol::Op::Release),
            key: Some(key()),
            reason: Reason::BadToken,
        };
        assert_eq!(
            release_outcome(exchanged(refused, false), false),
            Err(Error::Refused(Reason::BadToken))
        );
    }
}
