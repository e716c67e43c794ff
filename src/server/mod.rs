//! The baton node: starting its threads, and stopping them in one place.
//!
//! Owns: the thread layout (ARCHITECTURE.md) — `--threads` I/O loops
//! (`io_loop.rs`) feeding one lock-owner thread (`owner.rs`, which owns the
//! `LockTable` of `lock_table.rs` and its `TimingWheel` of `wheel.rs`), with
//! `--metrics` the metrics thread (`metrics.rs`) — and the [`Shared`] flags
//! the threads read. Both listening sockets are bound first (a port that
//! cannot be is a [`StartError::Flag`] naming its flag), and every channel
//! and waker is built before any thread starts; [`Server::shutdown`] stops
//! them in a fixed order and logs each step.
//!
//! Never does: decide anything about locks (that is the lock table's job).

pub mod busy_poll;
pub mod client_auth;
pub mod clock;
pub mod cluster_core;
pub mod config;
pub mod io_loop;
pub mod lock_table;
pub mod messages;
pub mod metrics;
pub mod metrics_http;
pub mod owner;
pub mod peer_auth;
pub mod peer_wire;
pub mod replication;
pub mod roles;
pub mod sched;
pub mod stats;
pub mod table_core;
pub mod tls;
pub mod tokens;
pub mod wheel;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;

use mio::Waker;

use client_auth::ClientAuth;
use clock::Clock;
use cluster_core::ClusterParams;
pub use config::Config;
use io_loop::IoLoop;
use lock_table::{LockTable, TableLimits};
use messages::{IoLoopLink, ReplLink, ToOwner, ToRepl, capacity};
use owner::Owner;
use peer_auth::ClusterKey;
use replication::Replication;
use table_core::TableCore;
use tokens::TokenSource;

/// Flags and counters every thread may read. Only atomics: no thread waits
/// on another through this.
#[derive(Debug)]
pub struct Shared {
    /// Open client connections, over all I/O loops.
    pub conns: AtomicUsize,
    /// Set once, to stop the I/O loops.
    pub shutdown: AtomicBool,
    pub max_conns: usize,
    pub max_lease_ms: u64,
    /// Benchmark floor mode (`--echo`): every line is echoed back.
    pub echo: bool,
    /// `--promotion-grace`, in ms.
    pub promotion_grace_ms: u64,
    /// `--busy-poll-us`: the longest an idle I/O loop or owner polls before sleeping.
    pub busy_poll: std::time::Duration,
    /// Threads that may busy-poll at once (one per core).
    pub pollers: busy_poll::PollerSlots,
    /// This node's name in `I` (its `--peers` entry, or bind:port).
    pub node: String,
    /// The largest token this node issued itself (written by the owner
    /// each round; sent in heartbeats).
    pub last_issued: AtomicU64,
    /// The replicated token ceiling (written by the owner).
    pub ceiling: AtomicU64,
    /// When a standby last heard from its active (clock ms; by replication).
    pub heard_active_ms: AtomicU64,
    /// Live standbys that hold this node's full state (by replication).
    pub synced_standbys: AtomicUsize,
    /// Entries of messages for the lock owner that the replication thread
    /// has queued and the owner has not applied yet.
    pub cluster_queued: Arc<messages::ClusterQueued>,
    /// Connections past `--max-conns` kept for peer links (0 on a single
    /// node), and how many are in use.
    pub peer_slots: usize,
    pub peer_slots_used: AtomicUsize,
    /// `--auth-file`: None when clients need not authenticate.
    pub auth: Option<Arc<client_auth::ClientAuth>>,
    /// What the I/O loops count for `--metrics` (relaxed atomics).
    pub io_counters: stats::IoCounters,
    /// TLS on every connection (`--tls-cert`), reloadable.
    pub tls: Option<Arc<tls::NodeTls>>,
}

impl Shared {
    /// The shared state of a node starting with `config`, called `node` in `I`.
    pub fn new(config: &Config, node: String) -> Shared {
        Shared {
            conns: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            max_conns: config.max_conns,
            max_lease_ms: config.max_lease_ms,
            echo: config.echo,
            promotion_grace_ms: config.promotion_grace_ms,
            busy_poll: std::time::Duration::from_micros(config.busy_poll_us),
            pollers: busy_poll::PollerSlots::new(
                std::thread::available_parallelism().map_or(1, |n| n.get()),
            ),
            node,
            last_issued: AtomicU64::new(0),
            ceiling: AtomicU64::new(0),
            heard_active_ms: AtomicU64::new(0),
            synced_standbys: AtomicUsize::new(0),
            cluster_queued: Arc::default(),
            peer_slots: PEER_SLOTS_PER_PEER * config.peers.len().saturating_sub(1),
            peer_slots_used: AtomicUsize::new(0),
            auth: None,
            io_counters: stats::IoCounters::default(),
            tls: None,
        }
    }
}

/// Connections past `--max-conns` reserved for each other node's peer
/// link (its link, a redial, and one stranger at a time).
const PEER_SLOTS_PER_PEER: usize = 4;

/// Why [`Server::start`] failed.
#[derive(Debug)]
pub enum StartError {
    /// A flag the node cannot use: a port in use, an address no interface
    /// has, a port it may not bind. One line that names the flag, what
    /// failed and why; `batond` exits 2.
    Flag(String),
    /// Anything else (threads, epoll, wakers); `batond` exits 1.
    Io(io::Error),
}

impl From<io::Error> for StartError {
    fn from(e: io::Error) -> StartError {
        StartError::Io(e)
    }
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Flag(line) => f.write_str(line),
            StartError::Io(e) => e.fmt(f),
        }
    }
}

/// Listen on `addr`, the address of the flag `flag(error)` names: an error
/// says which flag, where, and the operating system's reason, with a hint
/// for the common ones, on one line.
fn listen(
    addr: SocketAddr,
    flag: impl Fn(&io::Error) -> &'static str,
) -> Result<std::net::TcpListener, StartError> {
    std::net::TcpListener::bind(addr).map_err(|e| {
        let hint = match e.kind() {
            io::ErrorKind::AddrInUse => "; another process listens there",
            io::ErrorKind::AddrNotAvailable => "; no interface of this machine has that address",
            io::ErrorKind::PermissionDenied => "; a port below 1024 needs CAP_NET_BIND_SERVICE",
            _ => "",
        };
        StartError::Flag(format!("{}: cannot listen on {addr}: {e}{hint}", flag(&e)))
    })
}

/// A running node.
pub struct Server {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    wakers: Vec<Arc<Waker>>,
    io_threads: Vec<JoinHandle<()>>,
    owner_thread: Option<JoinHandle<()>>,
    repl: Option<ReplHandle>,
    /// A single node's own line to the lock owner, for the retire message
    /// at shutdown (dropped then, so the owner sees every sender gone).
    retire: Option<crossbeam_channel::Sender<ToOwner>>,
    metrics: Option<(Arc<stats::MetricsSlot>, JoinHandle<()>)>,
    detect_ms: u64,
}

struct ReplHandle {
    tx: crossbeam_channel::Sender<ToRepl>,
    waker: Arc<Waker>,
    exit: crossbeam_channel::Receiver<()>,
    thread: JoinHandle<()>,
}

impl Server {
    /// Bind (the client port, then the metrics port), build every channel
    /// and waker, then start the threads. `cluster_key` is what
    /// [`Config::read_cluster_key`] read (None for a single node; a cluster
    /// node without one runs as `--insecure-peers`), `client_auth` what
    /// [`Config::read_client_auth`] read. A port that cannot be listened on
    /// is a [`StartError::Flag`] naming the flag.
    pub fn start(
        config: &Config,
        cluster_key: Option<ClusterKey>,
        client_auth: Option<ClientAuth>,
    ) -> Result<Server, StartError> {
        let listener = listen(SocketAddr::new(config.bind, config.port), |e| {
            match e.kind() {
                io::ErrorKind::AddrInUse | io::ErrorKind::PermissionDenied => "--port",
                _ => "--bind",
            }
        })?;
        let metrics_listener = match config.metrics {
            Some(addr) => Some(listen(addr, |_| "--metrics")?),
            None => None,
        };
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        let node_index = config.node_index().map_err(StartError::Flag)?;
        let node = if config.peers.is_empty() {
            SocketAddr::new(config.bind, local_addr.port()).to_string()
        } else {
            config.node_name()
        };
        let mut shared = Shared::new(config, node);
        shared.auth = client_auth.map(Arc::new);
        shared.tls = tls::NodeTls::load(config)
            .map_err(StartError::Flag)?
            .map(Arc::new);
        let shared = Arc::new(shared);
        let clock = Clock::new();
        install_panic_hook();

        // Every channel and waker first (each bounded; see messages::capacity).
        let (to_owner, inbound) = crossbeam_channel::bounded(capacity::TO_OWNER);
        let repl_parts = if config.peers.is_empty() {
            None
        } else {
            let poll = mio::Poll::new()?;
            let waker = Arc::new(Waker::new(poll.registry(), replication::REPL_WAKER)?);
            let (tx, rx) = crossbeam_channel::bounded(capacity::TO_REPL);
            let (exit_tx, exit_rx) = crossbeam_channel::bounded(capacity::EXIT_SIGNAL);
            Some((poll, waker, tx, rx, exit_tx, exit_rx))
        };
        let handover = repl_parts.as_ref().map(|(_, waker, tx, ..)| ReplLink {
            tx: tx.clone(),
            waker: waker.clone(),
        });
        let mut loops = Vec::with_capacity(config.threads);
        let mut links = Vec::with_capacity(config.threads);
        let mut wakers = Vec::with_capacity(config.threads);
        for index in 0..config.threads {
            let (answers, from_owner) = crossbeam_channel::bounded(capacity::TO_IO_LOOP);
            let (io_loop, waker, awake) = IoLoop::new(
                index,
                &listener,
                to_owner.clone(),
                from_owner,
                handover.as_ref().map(|h| ReplLink {
                    tx: h.tx.clone(),
                    waker: h.waker.clone(),
                }),
                shared.clone(),
            )?;
            loops.push(io_loop);
            links.push(IoLoopLink {
                answers,
                waker: waker.clone(),
                awake,
            });
            wakers.push(waker);
        }

        let floor = tokens::start_floor(unix_ms());
        let limits = TableLimits {
            max_waiting_per_conn: config.max_waiting,
            max_keys: config.max_keys,
        };
        let table = LockTable::new(clock.now_ms(), limits, TokenSource::new(node_index, floor));
        let core = TableCore::new(
            table,
            handover.is_some(),
            shared.node.clone(),
            config.promotion_grace_ms,
        );
        let mut owner = Owner::new(core, clock, inbound, links, handover, shared.clone());
        let metrics_server = match metrics_listener {
            Some(listener) => {
                let (server, slot) =
                    metrics::MetricsServer::new(listener, to_owner.clone(), shared.clone())?;
                owner = owner.with_metrics(slot.clone());
                Some((server, slot))
            }
            None => None,
        };

        // Then the threads: owner, replication, I/O loops.
        let owner_thread = std::thread::Builder::new()
            .name("baton-owner".into())
            .spawn(move || owner.run())?;
        let mut retire = None;
        let repl = match repl_parts {
            None => {
                retire = Some(to_owner);
                None
            }
            Some((poll, waker, tx, rx, exit_tx, exit_rx)) => {
                let params = ClusterParams {
                    detect_ms: config.detect_ms,
                    max_lease_ms: config.max_lease_ms,
                    max_keys: config.max_keys,
                    insecure: cluster_key.as_ref().is_none_or(ClusterKey::is_insecure),
                    seed: 0,
                };
                let replication = Replication::new(
                    node_index,
                    config.peers.clone(),
                    params,
                    cluster_key.unwrap_or_else(ClusterKey::insecure),
                    clock,
                    poll,
                    rx,
                    to_owner,
                    shared.clone(),
                    exit_tx,
                );
                let thread = std::thread::Builder::new()
                    .name("baton-repl".into())
                    .spawn(move || replication.run())?;
                Some(ReplHandle {
                    tx,
                    waker,
                    exit: exit_rx,
                    thread,
                })
            }
        };
        let mut io_threads = Vec::with_capacity(loops.len());
        for (index, io_loop) in loops.into_iter().enumerate() {
            io_threads.push(
                std::thread::Builder::new()
                    .name(format!("baton-io-{index}"))
                    .spawn(move || io_loop.run())?,
            );
        }
        let metrics = match metrics_server {
            Some((server, slot)) => Some((
                slot,
                std::thread::Builder::new()
                    .name("baton-metrics".into())
                    .spawn(move || server.run())?,
            )),
            None => None,
        };
        log::info!(
            "listening on {local_addr} as {} with {} I/O loops",
            shared.node,
            io_threads.len()
        );
        Ok(Server {
            local_addr,
            shared,
            wakers,
            io_threads,
            owner_thread: Some(owner_thread),
            repl,
            retire,
            metrics,
            detect_ms: config.detect_ms,
        })
    }

    /// The address the node listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// SIGHUP: read again what may change without a restart. Each part
    /// logs what it did; a part that fails keeps what it had.
    pub fn reload(&self) {
        self.reload_client_auth();
        match self.reload_tls() {
            Ok(true) => log::info!("reload: TLS certificate and keys read again"),
            Ok(false) => {}
            Err(e) => log::error!("reload: TLS files not reloaded, the old ones stay: {e}"),
        }
    }

    /// `--auth-file`: the new secrets replace the old ones for connections
    /// made from now on; a bad file keeps the old ones.
    fn reload_client_auth(&self) {
        let Some(auth) = &self.shared.auth else {
            log::info!("reload: no --auth-file; nothing to read");
            return;
        };
        match auth.reload() {
            Ok(count) => log::info!("reload: --auth-file: {count} secrets in use"),
            Err(e) => log::warn!("reload: {e}; keeping the secrets in use"),
        }
    }

    /// Read the TLS files again (SIGHUP): new connections use them; those
    /// open keep theirs. Ok(false) without TLS. On an error the files in
    /// use stay, and the error says why.
    pub fn reload_tls(&self) -> Result<bool, String> {
        match &self.shared.tls {
            Some(tls) => tls.reload().map(|()| true),
            None => Ok(false),
        }
    }

    /// Stop in order: first, in a cluster, hand the active role over (the
    /// replication thread says when it is done, or gives up after a bound);
    /// then the I/O loops (they stop listening, write every answer the
    /// owner still makes for requests already read, and end every
    /// connection in order, within `io_loop::LINGER`); then the metrics thread; then replication; then the
    /// lock owner, which stops once every sender is gone.
    pub fn shutdown(mut self) {
        if let Some(repl) = &self.repl {
            log::info!("shutdown: handing over to a successor, if any");
            if repl.tx.send(ToRepl::Shutdown).is_ok() {
                let _ = repl.waker.wake();
                let bound = std::time::Duration::from_millis(3 * self.detect_ms + 1000);
                if repl.exit.recv_timeout(bound).is_err() {
                    log::warn!(
                        "shutdown: no handoff within {} ms; stopping anyway",
                        bound.as_millis()
                    );
                }
            }
        }
        if let Some(to_owner) = self.retire.take() {
            // A single node: its waiters hear `M -` (no node is active)
            // before their connections close, as with a cluster's last node.
            let bound = std::time::Duration::from_secs(1);
            let (done, retired) = crossbeam_channel::bounded(1);
            if to_owner.send_timeout(ToOwner::Retire(done), bound).is_ok()
                && retired.recv_timeout(bound).is_err()
            {
                log::warn!("shutdown: the lock owner did not answer its waiters in time");
            }
        }
        log::info!("shutdown: stopping the I/O loops");
        self.shared.shutdown.store(true, Ordering::Release);
        for waker in &self.wakers {
            let _ = waker.wake();
        }
        for thread in self.io_threads.drain(..) {
            let _ = thread.join();
        }
        if let Some((slot, thread)) = self.metrics.take() {
            log::info!("shutdown: stopping the metrics thread");
            slot.wake();
            let _ = thread.join();
        }
        if let Some(repl) = self.repl.take() {
            log::info!("shutdown: stopping replication");
            let _ = repl.tx.send(ToRepl::Stop);
            let _ = repl.waker.wake();
            let _ = repl.thread.join();
        }
        log::info!("shutdown: stopping the lock owner");
        if let Some(thread) = self.owner_thread.take() {
            let _ = thread.join();
        }
        log::info!("shutdown: done");
    }
}

pub use clock::unix_ms;

/// A panic in any of the node's threads (named `baton-…`) ends the process
/// with a log line and a non-zero exit: a node that keeps listening with no
/// lock owner or no replication would take requests it can never answer.
/// (Release builds also abort on panic; this covers every build, and panics
/// outside the node's threads — a test's, say — keep their usual course.)
fn install_panic_hook() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            let thread = std::thread::current();
            let name = thread.name().unwrap_or("");
            if name.starts_with("baton-") {
                log::error!("thread {name} panicked: {info}; stopping the node");
                std::process::exit(101);
            }
        }));
    });
}
