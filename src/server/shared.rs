//! What the node's threads share: the [`Settings`] every thread reads and
//! nobody changes after start, and the few [`Gauges`] that cross threads.
//!
//! Owns: both types. Settings come from the flags (and the files they name,
//! which reload themselves inside `ClientAuth` and `NodeTls`); gauges are
//! atomics, each with the one thread (or kind of thread) that writes it
//! named on its field. No thread waits on another through either.
//!
//! Never does: decide anything, or lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::time::Duration;

use crate::server::busy_poll::PollerSlots;
use crate::server::config::Config;
use crate::server::messages::ClusterQueued;
use crate::server::stats::IoCounters;
use crate::server::trust::client_auth::ClientAuth;
use crate::server::trust::tls::NodeTls;

/// Connections past `--max-conns` reserved for each other node's peer
/// link (its link, a redial, and one stranger at a time).
const PEER_SLOTS_PER_PEER: usize = 4;

/// What every thread reads and nobody writes once the node has started.
#[derive(Debug)]
pub struct Settings {
    /// This node's name in `I` (its `--peers` entry, or bind:port).
    pub node: String,
    pub max_conns: usize,
    pub max_lease_ms: u64,
    /// `--max-watches`: keys one connection may watch at once.
    pub max_watches: usize,
    /// Benchmark floor mode (`--echo`): every line is echoed back.
    pub echo: bool,
    /// `--promotion-grace`, in ms.
    pub promotion_grace_ms: u64,
    /// `--busy-poll-us`: the longest an idle I/O loop or owner polls before sleeping.
    pub busy_poll: Duration,
    /// Connections past `--max-conns` kept for peer links (0 on a single node).
    pub peer_slots: usize,
    /// `--auth-file`: None when clients need not authenticate.
    pub auth: Option<Arc<ClientAuth>>,
    /// TLS on every connection (`--tls-cert`), reloadable.
    pub tls: Option<Arc<NodeTls>>,
    /// Protected mode ([`Config::protected_mode`]): clients not on
    /// loopback are refused (`E - - protected-mode`).
    pub protected: bool,
}

impl Settings {
    /// The settings of a node starting with `config`, called `node` in `I`,
    /// without client auth or TLS (the caller adds what it loaded).
    pub fn new(config: &Config, node: String) -> Settings {
        Settings {
            node,
            max_conns: config.max_conns,
            max_lease_ms: config.max_lease_ms,
            max_watches: config.max_watches,
            echo: config.echo,
            promotion_grace_ms: config.promotion_grace_ms,
            busy_poll: Duration::from_micros(config.busy_poll_us),
            peer_slots: PEER_SLOTS_PER_PEER * config.peers.len().saturating_sub(1),
            auth: None,
            tls: None,
            protected: config.protected_mode(),
        }
    }
}

/// The flags and counters that cross threads. Relaxed atomics unless a
/// field says otherwise.
#[derive(Debug)]
pub struct Gauges {
    /// Open client connections, over all I/O loops (by the I/O loops).
    pub conns: AtomicUsize,
    /// Peer-reserved connection slots in use (by the I/O loops).
    pub peer_slots_used: AtomicUsize,
    /// Set once, by the node's stop sequence, to stop the I/O loops and the
    /// metrics thread (Release/Acquire).
    pub shutdown: AtomicBool,
    /// Threads that may busy-poll at once (one per core).
    pub pollers: PollerSlots,
    /// The largest token this node issued itself (by the owner each round;
    /// read by replication for heartbeats).
    pub last_issued: AtomicU64,
    /// The replicated token ceiling (by the owner; read by replication).
    pub ceiling: AtomicU64,
    /// When a standby last heard from its active (clock ms; by replication,
    /// read by the owner for `lag_ms`).
    pub heard_active_ms: AtomicU64,
    /// Live standbys that hold this node's full state (by replication).
    pub synced_standbys: AtomicUsize,
    /// Entries of messages for the lock owner that the replication thread
    /// has queued and the owner has not applied yet.
    pub cluster_queued: Arc<ClusterQueued>,
    /// Snapshot pieces the replication thread has taken from the owner,
    /// ever (by `rounds::take_inbox`; read by the owner, which makes the
    /// next piece only once replication keeps up).
    pub chunks_taken: AtomicU64,
    /// The most bytes queued and not yet written on one outgoing peer link
    /// (by replication at the end of each turn, `rounds::end_turn`; read
    /// by the owner, which makes no snapshot piece while a link is backed
    /// up).
    pub peer_output: AtomicUsize,
    /// What the I/O loops count for `--metrics`.
    pub io_counters: IoCounters,
    /// Watched (connection, key) pairs now, over all I/O loops (by the
    /// I/O loops).
    pub watches: AtomicUsize,
}

impl Gauges {
    /// Every gauge at zero, with one busy-poll slot per core.
    pub fn new() -> Gauges {
        Gauges::with_pollers(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// Every gauge at zero, with `pollers` busy-poll slots (the simulation
    /// makes thousands of nodes, and asks the system for no core count).
    pub fn with_pollers(pollers: usize) -> Gauges {
        Gauges {
            conns: AtomicUsize::new(0),
            peer_slots_used: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            pollers: PollerSlots::new(pollers),
            last_issued: AtomicU64::new(0),
            ceiling: AtomicU64::new(0),
            heard_active_ms: AtomicU64::new(0),
            synced_standbys: AtomicUsize::new(0),
            cluster_queued: Arc::default(),
            chunks_taken: AtomicU64::new(0),
            peer_output: AtomicUsize::new(0),
            io_counters: IoCounters::default(),
            watches: AtomicUsize::new(0),
        }
    }
}

impl Default for Gauges {
    fn default() -> Self {
        Gauges::new()
    }
}
