//! The set of servers and connections a client keeps, and the choice of a
//! connection for each request.
//!
//! Owns: the registered servers (nodes) and their connections (one per
//! address given, two when only one address is given, one for a node first
//! learned from an `M` redirect; at most [`MAX_SERVERS`] servers), the
//! round-robin turn and the node preferred after a redirect (the active
//! one); callers waiting for a connection to come up wait on the
//! [`Notifier`](crate::client::ctx::Notifier).
//!
//! Runs on the callers' threads ([`Pool::pick`]) or in their async tasks
//! ([`Pool::pick_async`]); the connections' own threads only report phase
//! changes through the notifier.
//!
//! Choice ([`choose`], pure): the preferred node's connections first, if one
//! is up; else any connection that is up, round-robin. An acquire of key K
//! goes to a connection with no acquire of K outstanding, when one of those
//! is up: the server answers a later acquire of K on a connection (even its
//! `T`) only after the earlier one, so a try-acquire sent behind the same
//! client's acquire of K waiting in line would wait for that one. When
//! every connection that is up has one and another is still connecting (a
//! new client's second), the acquire waits for that one (within the
//! connect timeout). When every such connection has one, it is sent anyway (the connection's
//! overdue clock for it starts only when the earlier one is answered: see
//! `conn.rs`). The check is one hash lookup per connection. A caller waits only
//! while some connection it could use is connecting — bounded by its own
//! deadline and by the connect timeout — and fails at once with
//! [`Error::NoConnection`] when every one is down.
//!
//! Never does: send, retry or interpret answers (that is `calls.rs`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use parking_lot::RwLock;

use crate::client::conn::{Conn, Phase};
use crate::client::ctx::{Ctx, InHand};
use crate::client::error::{AuthRefused, Error};
use crate::client::grant::ConnectionStatus;
use crate::client::timer::Timer;
use crate::protocol::{Key, Op, Request, Secret};

/// Connections kept to a server when it is the only one given.
pub const CONNECTIONS_FOR_ONE_SERVER: usize = 2;
/// Servers one client registers, at most (those given plus those learned
/// from redirects); a redirect to one more is refused.
pub const MAX_SERVERS: usize = 64;
/// Extra time a caller waits for a connection attempt past the connect
/// timeout (name resolution, thread start).
const CONNECT_SLACK: Duration = Duration::from_secs(1);
const NO_NODE: usize = usize::MAX;

/// Which connections a request may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Any: the preferred node's if one is up, else round-robin.
    Any,
    /// Only this node's (for `I`, which asks one particular server).
    Node(usize),
}

/// What [`choose`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// Use the connection at this index.
    Use(usize),
    /// None is up, but one is connecting: wait for it.
    Wait,
    /// None is up or connecting.
    Nothing,
}

/// Pick a connection from `(node, phase, busy)` triples, `busy` when a
/// request of the same (op, key) as this one's is outstanding on it (only
/// acquires say so). The preferred node's up connections come first, the
/// ones not busy first among them; while the preferred node is connecting
/// and none of it is up, wait for it rather than go to a node that would
/// redirect back. `turn` makes the choice round-robin.
pub fn choose(
    conns: &[(usize, Phase, bool)],
    target: Target,
    preferred: Option<usize>,
    turn: usize,
) -> Choice {
    let among = |node: Option<usize>| -> Choice {
        let fits = |n: usize| node.is_none_or(|want| want == n);
        let up: Vec<usize> = (0..conns.len())
            .filter(|&i| fits(conns[i].0) && conns[i].1 == Phase::Up)
            .collect();
        let free: Vec<usize> = up.iter().copied().filter(|&i| !conns[i].2).collect();
        if !free.is_empty() {
            return Choice::Use(free[turn % free.len()]);
        }
        let connecting = conns
            .iter()
            .any(|&(n, phase, _)| fits(n) && phase == Phase::Connecting);
        // Every connection that is up is busy with this key: one still
        // connecting (the second of a new client's two, say) will be free,
        // so wait for it rather than queue behind this client's own waiter.
        if !up.is_empty() && !connecting {
            return Choice::Use(up[turn % up.len()]);
        }
        if connecting {
            return Choice::Wait;
        }
        Choice::Nothing
    };
    match target {
        Target::Node(node) => among(Some(node)),
        Target::Any => match preferred.map(|node| among(Some(node))) {
            Some(choice @ (Choice::Use(_) | Choice::Wait)) => choice,
            _ => among(None),
        },
    }
}

/// The (op, key) whose outstanding requests `request` keeps away from:
/// an acquire's, whose answer the server would hold back behind theirs.
fn keep_apart(request: &Request) -> Option<(Op, Option<Key>)> {
    match request {
        Request::Acquire { key, .. } => Some((Op::Acquire, Some(key.clone()))),
        _ => None,
    }
}

struct Node {
    addr: String,
    conns: Vec<Arc<Conn>>,
}

/// The client's servers and connections.
pub struct Pool {
    ctx: Arc<Ctx>,
    /// Deadlines of async calls.
    timer: Timer,
    nodes: RwLock<Vec<Node>>,
    preferred: AtomicUsize,
    turn: AtomicUsize,
}

impl Pool {
    /// Register `servers` and start connecting to them in the background.
    /// `stop` disconnects when the client is dropped.
    pub fn start(
        servers: &[String],
        connect_timeout: Duration,
        request_timeout: Duration,
        auth: Option<Secret>,
        tls: crate::client::ctx::TlsSetting,
        stop: Receiver<()>,
    ) -> Result<Pool, Error> {
        let ctx = Arc::new(Ctx::new(connect_timeout, request_timeout, auth, tls, stop));
        let pool = Pool {
            ctx,
            timer: Timer::default(),
            nodes: RwLock::new(Vec::new()),
            preferred: AtomicUsize::new(NO_NODE),
            turn: AtomicUsize::new(0),
        };
        let per_node = if servers.len() == 1 {
            CONNECTIONS_FOR_ONE_SERVER
        } else {
            1
        };
        for addr in servers {
            pool.add_node(&mut pool.nodes.write(), addr, per_node)?;
        }
        Ok(pool)
    }

    pub fn request_timeout(&self) -> Duration {
        self.ctx.request_timeout
    }

    pub fn connect_timeout(&self) -> Duration {
        self.ctx.connect_timeout
    }

    /// The timer that wakes async calls at their deadlines.
    pub fn timer(&self) -> &Timer {
        &self.timer
    }

    fn add_node(&self, nodes: &mut Vec<Node>, addr: &str, count: usize) -> Result<usize, Error> {
        let index = nodes.len();
        let mut conns = Vec::with_capacity(count);
        for _ in 0..count {
            let conn = Arc::new(Conn::new(index, addr.to_string()));
            conn.spawn(self.ctx.clone())
                .map_err(|e| Error::NoConnection(format!("cannot start a thread: {e}")))?;
            conns.push(conn);
        }
        nodes.push(Node {
            addr: addr.to_string(),
            conns,
        });
        self.ctx.notifier.bump();
        Ok(index)
    }

    /// The node with this address, registered (with one connection) if it
    /// is new. Addresses are compared as text.
    pub fn node_for(&self, addr: &str) -> Result<usize, Error> {
        if let Some(index) = self.nodes.read().iter().position(|n| n.addr == addr) {
            return Ok(index);
        }
        let mut nodes = self.nodes.write();
        match nodes.iter().position(|n| n.addr == addr) {
            Some(index) => Ok(index),
            None if nodes.len() >= MAX_SERVERS => Err(Error::NoActive(format!(
                "redirected to {addr}, but this client already knows {MAX_SERVERS} servers"
            ))),
            None => {
                log::info!("learned of server {addr} from a redirect");
                self.add_node(&mut nodes, addr, 1)
            }
        }
    }

    /// The node index of a registered address.
    pub fn find(&self, addr: &str) -> Option<usize> {
        self.nodes.read().iter().position(|n| n.addr == addr)
    }

    /// Send requests to this node first from now on.
    pub fn prefer(&self, node: usize) {
        self.preferred.store(node, Ordering::Relaxed);
    }

    fn preferred(&self) -> Option<usize> {
        let node = self.preferred.load(Ordering::Relaxed);
        (node != NO_NODE).then_some(node)
    }

    /// True when one of the node's connections is up or connecting.
    pub fn is_reachable(&self, node: usize) -> bool {
        self.nodes
            .read()
            .get(node)
            .is_some_and(|n| n.conns.iter().any(|c| c.phase() != Phase::Down))
    }

    /// How many connections a request for `target` may use.
    pub fn connection_count(&self, target: Target) -> usize {
        let nodes = self.nodes.read();
        match target {
            Target::Any => nodes.iter().map(|n| n.conns.len()).sum(),
            Target::Node(node) => nodes.get(node).map_or(0, |n| n.conns.len()),
        }
    }

    /// A connection that is up for `request`, waiting (until `due` at the
    /// latest) while one is connecting; [`Error::NoConnection`] when none
    /// can be had.
    pub fn pick(
        &self,
        target: Target,
        request: &Request,
        due: Option<Instant>,
    ) -> Result<Arc<Conn>, Error> {
        let until = self.patience(due);
        let apart = keep_apart(request);
        loop {
            let seen = self.ctx.notifier.version();
            if let Some(conn) = self.choose_now(target, apart.as_ref())? {
                return Ok(conn);
            }
            if !self.ctx.notifier.wait_change(seen, until) {
                return self.busy_or_still_connecting(target);
            }
        }
    }

    /// [`Pool::pick`] for async callers: woken by the connection threads'
    /// phase changes, or by the timer at the deadline.
    pub async fn pick_async(
        &self,
        target: Target,
        request: &Request,
        due: Option<Instant>,
    ) -> Result<Arc<Conn>, Error> {
        let until = self.patience(due);
        let apart = keep_apart(request);
        loop {
            let seen = self.ctx.notifier.version();
            if let Some(conn) = self.choose_now(target, apart.as_ref())? {
                return Ok(conn);
            }
            let mut sleep = self.timer.sleep_until(until);
            let changed = std::future::poll_fn(|cx| {
                if self.ctx.notifier.poll_change(seen, cx).is_ready() {
                    return Poll::Ready(true);
                }
                match Pin::new(&mut sleep).poll(cx) {
                    Poll::Ready(()) => Poll::Ready(false),
                    Poll::Pending => Poll::Pending,
                }
            })
            .await;
            if !changed {
                return self.busy_or_still_connecting(target);
            }
        }
    }

    /// A connection that is up now (Some), None while one is connecting,
    /// or why none can be had; never waits (for a watch, which waits in
    /// its own way: [`Pool::wait_change`], [`Pool::poll_change`]).
    pub fn try_pick(&self, target: Target) -> Result<Option<Arc<Conn>>, Error> {
        self.choose_now(target, None)
    }

    /// The count of connection phase changes so far.
    pub fn phase_version(&self) -> u64 {
        self.ctx.notifier.version()
    }

    /// Block until a connection's phase changes after `seen`, or `until`.
    pub fn wait_change(&self, seen: u64, until: Instant) {
        self.ctx.notifier.wait_change(seen, until);
    }

    /// Ready once a connection's phase changed after `seen`.
    pub fn poll_change(&self, seen: u64, cx: &mut std::task::Context<'_>) -> Poll<()> {
        self.ctx.notifier.poll_change(seen, cx)
    }

    /// A connection that is up now, without waiting; None when none is
    /// (for a destructor, which must not block).
    pub fn pick_now(&self, target: Target) -> Option<Arc<Conn>> {
        self.choose_now(target, None).ok().flatten()
    }

    /// How long a caller waits for a connection to come up, at most.
    fn patience(&self, due: Option<Instant>) -> Instant {
        let patience = Instant::now() + self.ctx.connect_timeout + CONNECT_SLACK;
        due.map_or(patience, |due| due.min(patience))
    }

    fn still_connecting(&self, target: Target) -> Error {
        if let Some(refused) = self.auth_error(target) {
            return refused;
        }
        Error::NoConnection(format!("still connecting: {}", self.describe(target)))
    }

    /// [`Error::Auth`] when a server of `target` refused this client's
    /// secret on the last attempt (then no connection is to be had until
    /// that changes), with the first such server's reason.
    pub fn auth_error(&self, target: Target) -> Option<Error> {
        let reason = {
            let nodes = self.nodes.read();
            nodes
                .iter()
                .enumerate()
                .filter(|&(index, _)| target == Target::Any || target == Target::Node(index))
                .find_map(|(_, node)| node.conns.iter().find_map(|c| c.auth_refused()))
        }?;
        Some(Error::Auth(AuthRefused::new(reason, self.describe(target))))
    }

    /// A connection that is up now (Some), or None while one is connecting;
    /// one without a request of `apart`'s (op, key) outstanding if it can.
    fn choose_now(
        &self,
        target: Target,
        apart: Option<&(Op, Option<Key>)>,
    ) -> Result<Option<Arc<Conn>>, Error> {
        let conns = self.all_conns();
        let phases: Vec<(usize, Phase, bool)> = conns
            .iter()
            .map(|c| match apart {
                Some(id) => {
                    let (phase, busy) = c.phase_and_busy(id);
                    (c.node, phase, busy)
                }
                None => (c.node, c.phase(), false),
            })
            .collect();
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        match choose(&phases, target, self.preferred(), turn) {
            Choice::Use(i) => Ok(Some(conns[i].clone())),
            Choice::Nothing => Err(self
                .auth_error(target)
                .unwrap_or_else(|| Error::NoConnection(self.describe(target)))),
            Choice::Wait => Ok(None),
        }
    }

    /// The wait for a connection is over: one that is up but busy with
    /// this request's key (waited on for a free one still connecting)
    /// serves after all; else none came up.
    fn busy_or_still_connecting(&self, target: Target) -> Result<Arc<Conn>, Error> {
        match self.choose_now(target, None)? {
            Some(conn) => Ok(conn),
            None => Err(self.still_connecting(target)),
        }
    }

    fn all_conns(&self) -> Vec<Arc<Conn>> {
        self.nodes
            .read()
            .iter()
            .flat_map(|n| n.conns.iter().cloned())
            .collect()
    }

    /// "a:1 (connection refused); b:2 (not connected yet)": each server of
    /// `target` and why it cannot be used.
    pub fn describe(&self, target: Target) -> String {
        let nodes = self.nodes.read();
        let mut parts = Vec::new();
        for (index, node) in nodes.iter().enumerate() {
            if target != Target::Any && target != Target::Node(index) {
                continue;
            }
            let why = node
                .conns
                .iter()
                .find_map(|c| c.status().1)
                .unwrap_or_else(|| "not connected yet".into());
            parts.push(format!("{} ({why})", node.addr));
        }
        parts.join("; ")
    }

    /// Every connection's server, whether it is up, and its last error.
    pub fn statuses(&self) -> Vec<ConnectionStatus> {
        self.all_conns()
            .iter()
            .map(|c| {
                let (phase, last_error) = c.status();
                ConnectionStatus {
                    server: c.addr.clone(),
                    connected: phase == Phase::Up,
                    last_error,
                }
            })
            .collect()
    }

    /// The registered servers' addresses, in order.
    pub fn servers(&self) -> Vec<String> {
        self.nodes.read().iter().map(|n| n.addr.clone()).collect()
    }

    /// True once the client is closed: calls fail with [`Error::Closed`].
    pub fn is_closed(&self) -> bool {
        self.ctx.is_closed()
    }

    /// True once `Client::close` began: no acquire is to be sent.
    pub fn is_closing(&self) -> bool {
        self.ctx.is_closing()
    }

    /// `Client::close` began: acquires are no longer sent, and a grant
    /// that arrives is released rather than handed to its caller; other
    /// requests (the held keys' releases) still go out.
    pub fn begin_close(&self) {
        self.ctx.begin_close();
    }

    /// Count an acquire's grant in hand (not yet returned to its caller)
    /// until the guard drops; see [`Ctx::grant_in_hand`].
    pub fn grant_in_hand(&self) -> InHand<'_> {
        self.ctx.grant_in_hand()
    }

    /// The client is closing: wait until no acquire has a grant in hand
    /// (each releases its own and fails `Closed`), for at most the request
    /// timeout.
    pub fn wait_grants_in_hand(&self) {
        let until = Instant::now() + self.ctx.request_timeout;
        if !self.ctx.wait_no_grant_in_hand(until) {
            log::warn!("closing: an acquire still confirming its grant after the request timeout");
        }
    }

    /// The client is closing: every connection with an acquire outstanding
    /// takes in (and releases) the grants already made to it, for at most
    /// the request timeout in all (see [`Conn::settle`]).
    pub fn settle(&self) {
        let until = Instant::now() + self.ctx.request_timeout;
        for conn in self.all_conns() {
            conn.settle(until);
        }
    }

    /// Stop every connection and the timer (the client is closed, or
    /// dropped); their threads end soon after.
    pub fn close(&self) {
        self.ctx.close();
        self.timer.close();
        for conn in self.all_conns() {
            conn.close();
        }
    }

    /// Wait for the threads [`Pool::close`] stopped to end: each
    /// connection's (a connection attempt under way takes up to the
    /// connect timeout) and the timer's.
    pub fn join(&self) {
        for conn in self.all_conns() {
            conn.join();
        }
        self.timer.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Phase::{Connecting, Down, Up};

    #[test]
    fn up_connections_are_used_in_turn() {
        let conns = [(0, Up, false), (0, Up, false), (1, Up, false)];
        let picks: Vec<Choice> = (0..4)
            .map(|t| choose(&conns, Target::Any, None, t))
            .collect();
        assert_eq!(
            picks,
            [
                Choice::Use(0),
                Choice::Use(1),
                Choice::Use(2),
                Choice::Use(0)
            ]
        );
    }

    #[test]
    fn a_connection_that_is_down_is_left_out() {
        let conns = [(0, Down, false), (1, Up, false), (2, Connecting, false)];
        for turn in 0..5 {
            assert_eq!(choose(&conns, Target::Any, None, turn), Choice::Use(1));
        }
    }

    #[test]
    fn with_none_up_a_caller_waits_only_for_one_connecting() {
        assert_eq!(
            choose(
                &[(0, Down, false), (1, Connecting, false)],
                Target::Any,
                None,
                0
            ),
            Choice::Wait
        );
        assert_eq!(
            choose(&[(0, Down, false), (1, Down, false)], Target::Any, None, 0),
            Choice::Nothing
        );
        assert_eq!(choose(&[], Target::Any, None, 0), Choice::Nothing);
    }

    #[test]
    fn the_preferred_node_comes_first() {
        let conns = [(0, Up, false), (1, Up, false), (1, Up, false)];
        assert_eq!(choose(&conns, Target::Any, Some(1), 0), Choice::Use(1));
        assert_eq!(choose(&conns, Target::Any, Some(1), 1), Choice::Use(2));
    }

    #[test]
    fn a_connecting_preferred_node_is_waited_for() {
        let conns = [(0, Up, false), (1, Connecting, false)];
        assert_eq!(choose(&conns, Target::Any, Some(1), 0), Choice::Wait);
    }

    #[test]
    fn a_preferred_node_that_is_down_is_skipped() {
        let conns = [(0, Up, false), (1, Down, false)];
        assert_eq!(choose(&conns, Target::Any, Some(1), 0), Choice::Use(0));
    }

    #[test]
    fn an_acquire_goes_where_none_of_its_key_is_outstanding() {
        let conns = [(0, Up, true), (0, Up, false), (0, Down, false)];
        for turn in 0..4 {
            assert_eq!(choose(&conns, Target::Any, None, turn), Choice::Use(1));
        }
        let conns = [(0, Up, true), (1, Up, false), (1, Up, false)];
        assert_eq!(choose(&conns, Target::Any, None, 0), Choice::Use(1));
        assert_eq!(choose(&conns, Target::Any, None, 1), Choice::Use(2));
        // The only one up is busy and the other still connecting (a new
        // client's second): wait for it; with none connecting, the busy one.
        let conns = [(0, Up, true), (0, Connecting, false)];
        assert_eq!(choose(&conns, Target::Any, None, 0), Choice::Wait);
        let conns = [(0, Up, true), (0, Down, false)];
        assert_eq!(choose(&conns, Target::Any, None, 0), Choice::Use(0));
    }

    #[test]
    fn with_every_connection_busy_an_acquire_still_goes_round_robin() {
        let conns = [(0, Up, true), (0, Up, true)];
        assert_eq!(choose(&conns, Target::Any, None, 0), Choice::Use(0));
        assert_eq!(choose(&conns, Target::Any, None, 1), Choice::Use(1));
    }

    #[test]
    fn a_free_connection_elsewhere_does_not_beat_the_preferred_node() {
        // The other node would only redirect back to the preferred one.
        let conns = [(0, Up, false), (1, Up, true)];
        assert_eq!(choose(&conns, Target::Any, Some(1), 0), Choice::Use(1));
    }

    #[test]
    fn a_request_for_one_node_uses_only_that_node() {
        let conns = [(0, Up, false), (1, Down, false)];
        assert_eq!(choose(&conns, Target::Node(1), None, 0), Choice::Nothing);
        assert_eq!(choose(&conns, Target::Node(0), Some(1), 3), Choice::Use(0));
        let conns = [(0, Up, false), (1, Connecting, false)];
        assert_eq!(choose(&conns, Target::Node(1), None, 0), Choice::Wait);
    }
}
