//! The baton node: starting its threads, and stopping them in one place.
//!
//! Owns: the thread layout of ARCHITECTURE.md — `--threads` I/O loops
//! (`io_loop.rs`) feeding one lock-owner thread (`owner.rs`, which owns the
//! `LockTable` of `lock_table.rs` and its `TimingWheel` of `wheel.rs`) — and
//! the [`Shared`] flags the threads read. Every channel and waker is built
//! before any thread starts; [`Server::shutdown`] stops them in a fixed order
//! and logs each step.
//!
//! Never does: decide anything about locks (that is the lock table's job).

pub mod config;
pub mod io_loop;
pub mod lock_table;
pub mod owner;
pub mod roles;
pub mod tokens;
pub mod wheel;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;

use mio::Waker;

pub use config::Config;
use io_loop::IoLoop;
use lock_table::{LockTable, TableLimits};
use owner::{Clock, Owner, WorkerLink};
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
    /// This node's name in `I` (its `--peers` entry, or bind:port).
    pub node: String,
}

/// A running node.
pub struct Server {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    wakers: Vec<Arc<Waker>>,
    io_threads: Vec<JoinHandle<()>>,
    owner_thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Bind, build every channel and waker, then start the threads.
    pub fn start(config: &Config) -> io::Result<Server> {
        let listener = std::net::TcpListener::bind(SocketAddr::new(config.bind, config.port))?;
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        let node_index = config
            .node_index()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let shared = Arc::new(Shared {
            conns: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            max_conns: config.max_conns,
            max_lease_ms: config.max_lease_ms,
            node: if config.peers.is_empty() {
                SocketAddr::new(config.bind, local_addr.port()).to_string()
            } else {
                config.node_name()
            },
        });

        let (to_owner, inbound) = crossbeam_channel::unbounded();
        let mut loops = Vec::with_capacity(config.threads);
        let mut links = Vec::with_capacity(config.threads);
        let mut wakers = Vec::with_capacity(config.threads);
        for index in 0..config.threads {
            let (answers, from_owner) = crossbeam_channel::unbounded();
            let (io_loop, waker) = IoLoop::new(
                index,
                &listener,
                to_owner.clone(),
                from_owner,
                shared.clone(),
            )?;
            loops.push(io_loop);
            links.push(WorkerLink {
                answers,
                waker: waker.clone(),
            });
            wakers.push(waker);
        }
        drop(to_owner);

        let clock = Clock::new();
        let floor = tokens::clock_floor(unix_ms());
        let limits = TableLimits {
            max_waiting_per_conn: config.max_waiting,
            max_keys: config.max_keys,
        };
        let table = LockTable::new(clock.now_ms(), limits, TokenSource::new(node_index, floor));
        let owner = Owner::new(table, clock, inbound, links, shared.clone());

        let owner_thread = std::thread::Builder::new()
            .name("baton-owner".into())
            .spawn(move || owner.run())?;
        let mut io_threads = Vec::with_capacity(loops.len());
        for (index, io_loop) in loops.into_iter().enumerate() {
            io_threads.push(
                std::thread::Builder::new()
                    .name(format!("baton-io-{index}"))
                    .spawn(move || io_loop.run())?,
            );
        }
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
        })
    }

    /// The address the node listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stop in order: the I/O loops (no more input, connections closed), then
    /// the lock owner (which stops once every loop has dropped its sender).
    pub fn shutdown(mut self) {
        log::info!("shutdown: stopping the I/O loops");
        self.shared.shutdown.store(true, Ordering::Release);
        for waker in &self.wakers {
            let _ = waker.wake();
        }
        for thread in self.io_threads.drain(..) {
            let _ = thread.join();
        }
        log::info!("shutdown: stopping the lock owner");
        if let Some(thread) = self.owner_thread.take() {
            let _ = thread.join();
        }
        log::info!("shutdown: done");
    }
}

/// Milliseconds since the Unix epoch, by the wall clock.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
