//! The baton node: starting its threads, and stopping them in one place.
//!
//! Owns: the thread layout (ARCHITECTURE.md) — `--threads` I/O loops
//! (`threads/io_loop.rs`) feeding one lock-owner thread (`threads/owner.rs`,
//! which runs the `TableCore` and `LockTable` of `core/`), in a cluster the
//! replication thread (`threads/replication.rs`), with `--metrics` the
//! metrics thread (`threads/metrics.rs`) — and the [`Settings`] and
//! [`Gauges`] they share. Both listening sockets are bound first (a port that
//! cannot be is a [`StartError::Flag`] naming its flag; the client port's
//! backlog is `os_limits.rs`'s), and every channel
//! and waker is built before any thread starts; [`Server::shutdown`] stops
//! them in a fixed order and logs each step.
//!
//! Never does: decide anything about locks (that is the lock table's job).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use mio::Waker;

use crate::server::Config;
use crate::server::clock::{Clock, unix_ms};
use crate::server::core::cluster_core::ClusterParams;
use crate::server::core::lock_table::{LockTable, TableLimits};
use crate::server::core::table_core::TableCore;
use crate::server::core::tokens::{self, TokenSource};
use crate::server::messages::{IoLoopLink, ReplLink, Retired, ToOwner, ToRepl, capacity};
use crate::server::os_limits;
use crate::server::shared::{Gauges, Settings};
use crate::server::stats::MetricsSlot;
use crate::server::supervise::Supervisor;
use crate::server::threads::io_loop::IoLoop;
use crate::server::threads::metrics::MetricsServer;
use crate::server::threads::owner::Owner;
use crate::server::threads::replication::{self, Replication};
use crate::server::trust::client_auth::ClientAuth;
use crate::server::trust::peer_auth::ClusterKey;
use crate::server::trust::tls::NodeTls;

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

/// The sockets a node listens on, bound before anything else starts.
struct Listeners {
    /// The client port, non-blocking, its backlog raised (os_limits.rs).
    client: std::net::TcpListener,
    local_addr: SocketAddr,
    backlog: usize,
    /// The metrics port (`--metrics`), if any.
    metrics: Option<std::net::TcpListener>,
}

impl Listeners {
    /// Bind the client port, then the metrics port: a port that cannot be
    /// listened on is a [`StartError::Flag`] naming the flag.
    fn bind(config: &Config) -> Result<Listeners, StartError> {
        let client = listen(SocketAddr::new(config.bind, config.port), |e| {
            match e.kind() {
                io::ErrorKind::AddrInUse | io::ErrorKind::PermissionDenied => "--port",
                _ => "--bind",
            }
        })?;
        let metrics = match config.metrics {
            Some(addr) => Some(listen(addr, |_| "--metrics")?),
            None => None,
        };
        // std listened with 128: a fleet reconnecting one after another
        // needs more (os_limits.rs).
        let backlog = os_limits::set_backlog(&client)?;
        client.set_nonblocking(true)?;
        let local_addr = client.local_addr()?;
        Ok(Listeners {
            client,
            local_addr,
            backlog,
            metrics,
        })
    }
}

/// The settings every thread shares: the node's name (a single node's is
/// the address it listens on, a cluster node's its `--peers` entry), the
/// flags', client authentication and TLS.
fn node_settings(
    config: &Config,
    local_addr: SocketAddr,
    client_auth: Option<ClientAuth>,
) -> Result<Settings, StartError> {
    let node = if config.peers.is_empty() {
        SocketAddr::new(config.bind, local_addr.port()).to_string()
    } else {
        config.node_name()
    };
    let mut settings = Settings::new(config, node);
    settings.auth = client_auth.map(Arc::new);
    settings.tls = NodeTls::load(config)
        .map_err(StartError::Flag)?
        .map(Arc::new);
    Ok(settings)
}

/// The lock owner's core: an empty table whose tokens start above the
/// clock's floor (`tokens::start_floor`), with the flags' limits.
fn table_core(
    config: &Config,
    node_index: usize,
    clock: &Clock,
    settings: &Settings,
    has_replication: bool,
) -> TableCore {
    let floor = tokens::start_floor(unix_ms());
    let limits = TableLimits {
        max_waiting_per_conn: config.max_waiting,
        max_keys: config.max_keys,
    };
    let table = LockTable::new(clock.now_ms(), limits, TokenSource::new(node_index, floor));
    TableCore::new(
        table,
        has_replication,
        settings.node.clone(),
        config.promotion_grace_ms,
    )
}

/// The `--threads` I/O loops, built (not started), with the owner's link
/// to each and their wakers.
struct IoLoops {
    loops: Vec<IoLoop>,
    links: Vec<IoLoopLink>,
    wakers: Vec<Arc<Waker>>,
}

impl IoLoops {
    fn new(
        config: &Config,
        listener: &std::net::TcpListener,
        to_owner: &crossbeam_channel::Sender<ToOwner>,
        handover: Option<&ReplLink>,
        settings: &Arc<Settings>,
        gauges: &Arc<Gauges>,
    ) -> io::Result<IoLoops> {
        let mut io = IoLoops {
            loops: Vec::with_capacity(config.threads),
            links: Vec::with_capacity(config.threads),
            wakers: Vec::with_capacity(config.threads),
        };
        for index in 0..config.threads {
            let (answers, from_owner) = crossbeam_channel::bounded(capacity::TO_IO_LOOP);
            let (io_loop, waker, awake) = IoLoop::new(
                index,
                listener,
                to_owner.clone(),
                from_owner,
                handover.map(|h| ReplLink {
                    tx: h.tx.clone(),
                    waker: h.waker.clone(),
                }),
                settings.clone(),
                gauges.clone(),
            )?;
            io.loops.push(io_loop);
            io.links.push(IoLoopLink {
                answers,
                waker: waker.clone(),
                awake,
            });
            io.wakers.push(waker);
        }
        Ok(io)
    }
}

/// A cluster node's replication thread, built before any thread starts:
/// its poll and waker, its inbox, and the line it signals its exit on.
struct ReplParts {
    poll: mio::Poll,
    waker: Arc<Waker>,
    tx: crossbeam_channel::Sender<ToRepl>,
    rx: crossbeam_channel::Receiver<ToRepl>,
    exit_tx: crossbeam_channel::Sender<()>,
    exit_rx: crossbeam_channel::Receiver<()>,
}

impl ReplParts {
    fn new() -> io::Result<ReplParts> {
        let poll = mio::Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), replication::REPL_WAKER)?);
        let (tx, rx) = crossbeam_channel::bounded(capacity::TO_REPL);
        let (exit_tx, exit_rx) = crossbeam_channel::bounded(capacity::EXIT_SIGNAL);
        Ok(ReplParts {
            poll,
            waker,
            tx,
            rx,
            exit_tx,
            exit_rx,
        })
    }

    /// A line to the replication thread (the owner's, or an I/O loop's
    /// for the connections it hands over).
    fn link(&self) -> ReplLink {
        ReplLink {
            tx: self.tx.clone(),
            waker: self.waker.clone(),
        }
    }

    /// Start the replication thread.
    #[allow(clippy::too_many_arguments)]
    fn start(
        self,
        supervisor: &Supervisor,
        config: &Config,
        node_index: usize,
        cluster_key: Option<ClusterKey>,
        clock: Clock,
        to_owner: crossbeam_channel::Sender<ToOwner>,
        settings: &Arc<Settings>,
        gauges: &Arc<Gauges>,
    ) -> io::Result<ReplHandle> {
        let params = ClusterParams {
            detect_ms: config.detect_ms,
            max_lease_ms: config.max_lease_ms,
            insecure: cluster_key.as_ref().is_none_or(ClusterKey::is_insecure),
            seed: 0,
        };
        let replication = Replication::new(
            node_index,
            config.peers.clone(),
            params,
            cluster_key.unwrap_or_else(ClusterKey::insecure),
            clock,
            self.poll,
            self.rx,
            to_owner,
            settings.clone(),
            gauges.clone(),
            self.exit_tx,
        );
        let thread = supervisor.spawn("baton-repl".into(), move || replication.run())?;
        Ok(ReplHandle {
            tx: self.tx,
            waker: self.waker,
            exit: self.exit_rx,
            thread,
        })
    }
}

/// A running node.
pub struct Server {
    local_addr: SocketAddr,
    settings: Arc<Settings>,
    gauges: Arc<Gauges>,
    wakers: Vec<Arc<Waker>>,
    io_threads: Vec<JoinHandle<()>>,
    owner_thread: Option<JoinHandle<()>>,
    repl: Option<ReplHandle>,
    /// A single node's own line to the lock owner, for the retire message
    /// at shutdown (dropped then, so the owner sees every sender gone).
    retire: Option<crossbeam_channel::Sender<ToOwner>>,
    metrics: Option<(Arc<MetricsSlot>, JoinHandle<()>)>,
    detect_ms: u64,
    /// Started every thread; told when the stop sequence begins.
    supervisor: Supervisor,
}

struct ReplHandle {
    tx: crossbeam_channel::Sender<ToRepl>,
    waker: Arc<Waker>,
    exit: crossbeam_channel::Receiver<()>,
    thread: JoinHandle<()>,
}

/// One thread per I/O loop, `baton-io-<index>`.
fn spawn_io_loops(
    supervisor: &Supervisor,
    loops: Vec<IoLoop>,
) -> Result<Vec<JoinHandle<()>>, StartError> {
    let mut threads = Vec::with_capacity(loops.len());
    for (index, io_loop) in loops.into_iter().enumerate() {
        threads.push(supervisor.spawn(format!("baton-io-{index}"), move || io_loop.run())?);
    }
    Ok(threads)
}

/// The metrics port's thread, `baton-metrics`.
fn spawn_metrics(
    supervisor: &Supervisor,
    server: MetricsServer,
) -> Result<JoinHandle<()>, StartError> {
    Ok(supervisor.spawn("baton-metrics".into(), move || server.run())?)
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
        let ports = Listeners::bind(config)?;
        let local_addr = ports.local_addr;
        let node_index = config.node_index().map_err(StartError::Flag)?;
        let settings = Arc::new(node_settings(config, local_addr, client_auth)?);
        let gauges = Arc::new(Gauges::new());
        let clock = Clock::new();
        let supervisor = Supervisor::new();

        // Every channel and waker first (each bounded; see messages::capacity).
        let (to_owner, inbound) = crossbeam_channel::bounded(capacity::TO_OWNER);
        let repl_parts = if config.peers.is_empty() {
            None
        } else {
            Some(ReplParts::new()?)
        };
        let handover = repl_parts.as_ref().map(ReplParts::link);
        let io = IoLoops::new(
            config,
            &ports.client,
            &to_owner,
            handover.as_ref(),
            &settings,
            &gauges,
        )?;
        let core = table_core(config, node_index, &clock, &settings, handover.is_some());
        let mut owner = Owner::new(
            core,
            clock,
            inbound,
            io.links,
            handover,
            &settings,
            gauges.clone(),
        );
        let metrics_server = match ports.metrics {
            Some(listener) => {
                let (server, slot) =
                    MetricsServer::new(listener, to_owner.clone(), gauges.clone())?;
                owner = owner.with_metrics(slot.clone());
                Some((server, slot))
            }
            None => None,
        };

        // Then the threads: owner, replication, I/O loops.
        let owner_thread = supervisor.spawn("baton-owner".into(), move || owner.run())?;
        let mut retire = None;
        let repl = match repl_parts {
            None => {
                retire = Some(to_owner);
                None
            }
            Some(parts) => Some(parts.start(
                &supervisor,
                config,
                node_index,
                cluster_key,
                clock,
                to_owner,
                &settings,
                &gauges,
            )?),
        };
        let io_threads = spawn_io_loops(&supervisor, io.loops)?;
        let metrics = match metrics_server {
            Some((server, slot)) => Some((slot, spawn_metrics(&supervisor, server)?)),
            None => None,
        };
        log::info!(
            "listening on {local_addr} as {} with {} I/O loops (backlog {})",
            settings.node,
            io_threads.len(),
            ports.backlog
        );
        Ok(Server {
            local_addr,
            settings,
            gauges,
            wakers: io.wakers,
            io_threads,
            owner_thread: Some(owner_thread),
            repl,
            retire,
            metrics,
            detect_ms: config.detect_ms,
            supervisor,
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
        let Some(auth) = &self.settings.auth else {
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
        match &self.settings.tls {
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
        self.supervisor.stopping();
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
            if to_owner
                .send_timeout(ToOwner::Retire(Retired::new(done)), bound)
                .is_ok()
                && retired.recv_timeout(bound).is_err()
            {
                log::warn!("shutdown: the lock owner did not answer its waiters in time");
            }
        }
        log::info!("shutdown: stopping the I/O loops");
        self.gauges.shutdown.store(true, Ordering::Release);
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
