//! The replication thread: the shell around the cluster core.
//!
//! Owns: the sockets of the peer links — one outgoing TCP link to every
//! other node, and the incoming links adopted from the I/O loops (a
//! connection whose first line is a peer's) — with their framing
//! (`peer_wire::PeerReader`/`PeerWriter`, the seam an authentication layer
//! wraps), and the thread's channels. Every decision (roles, heartbeats,
//! snapshots, which link to open or drop, the exit sequence, whether a peer
//! message is acceptable) is [`ClusterCore`]'s: this file reads the clock,
//! moves bytes, feeds the core, and carries out its effects.
//!
//! Never does: touch lock state, decide anything, or block: a slow or dead
//! standby only grows its own bounded output buffer (past `MAX_PEER_OUTPUT`
//! the link is dropped and later re-synced from a fresh snapshot), never the
//! active's answers; a full channel to the lock owner keeps the messages
//! here, in order, until it has room.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TryRecvError, TrySendError};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use crate::server::Shared;
use crate::server::clock::Clock;
use crate::server::cluster_core::{ClusterCore, ClusterEffect, LinkId, OutDown};
use crate::server::messages::{ClusterToTable, ToOwner, ToRepl};
use crate::server::peer_wire::{PeerReader, PeerWriter};

/// Token of the replication thread's waker.
pub const REPL_WAKER: Token = Token(usize::MAX - 1);
/// Incoming links use tokens from here on (outgoing links use 0..nodes).
const IN_BASE: usize = 1 << 20;
/// Unsent bytes to one peer past which its link is dropped.
const MAX_PEER_OUTPUT: usize = 64 * 1024 * 1024;
/// How soon a full channel to the lock owner is tried again.
const RETRY_FULL_MS: u64 = 1;

struct OutLink {
    addr: Option<SocketAddr>,
    stream: Option<TcpStream>,
    connecting: bool,
    writer: PeerWriter,
}

struct InLink {
    stream: TcpStream,
    reader: PeerReader,
}

/// The replication thread's state.
pub struct Replication {
    core: ClusterCore,
    peers: Vec<String>,
    me: usize,
    detect_ms: u64,
    clock: Clock,
    poll: Poll,
    outs: Vec<OutLink>,
    ins: Slab<InLink>,
    inbox: Receiver<ToRepl>,
    to_owner: Sender<ToOwner>,
    /// Messages for the lock owner not sent yet (its channel was full).
    owner_backlog: VecDeque<ClusterToTable>,
    shared: Arc<Shared>,
    exit: Sender<()>,
    done: bool,
}

impl Replication {
    /// Build the thread's state; `poll` must be the one `waker` belongs to.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        me: usize,
        peers: Vec<String>,
        detect_ms: u64,
        clock: Clock,
        poll: Poll,
        inbox: Receiver<ToRepl>,
        to_owner: Sender<ToOwner>,
        shared: Arc<Shared>,
        exit: Sender<()>,
    ) -> Replication {
        let core = ClusterCore::new(me, peers.clone(), detect_ms, clock.now());
        let outs = peers
            .iter()
            .map(|peer| OutLink {
                addr: resolve(peer),
                stream: None,
                connecting: false,
                writer: PeerWriter::default(),
            })
            .collect();
        Replication {
            core,
            peers,
            me,
            detect_ms,
            clock,
            poll,
            outs,
            ins: Slab::new(),
            inbox,
            to_owner,
            owner_backlog: VecDeque::new(),
            shared,
            exit,
            done: false,
        }
    }

    /// Run until the node exits.
    pub fn run(mut self) {
        let mut events = Events::with_capacity(256);
        log::info!(
            "replication: node {} of {}, detection {} ms",
            self.peers[self.me],
            self.peers.join(","),
            self.detect_ms
        );
        while !self.done {
            let now = self.clock.now();
            let mut wake_ms = self.core.next_wake_ms(now);
            if !self.owner_backlog.is_empty() {
                wake_ms = wake_ms.min(now.ms + RETRY_FULL_MS);
            }
            let timeout = Duration::from_millis(wake_ms.saturating_sub(now.ms));
            if let Err(e) = self.poll.poll(&mut events, Some(timeout))
                && e.kind() != io::ErrorKind::Interrupted
            {
                log::error!("replication: poll failed: {e}");
                break;
            }
            for event in events.iter() {
                match event.token() {
                    REPL_WAKER => {}
                    Token(t) if t >= IN_BASE => self.read_in(t - IN_BASE),
                    Token(p) => self.handle_out_event(p, event),
                }
            }
            self.take_inbox();
            self.round();
        }
        log::info!("replication: stopped");
    }

    /// Time-driven work after the events, then everything flushed.
    fn round(&mut self) {
        let now = self.clock.now();
        self.shared
            .synced_standbys
            .store(self.core.synced_standbys(now), Ordering::Relaxed);
        self.core.set_tokens(
            self.shared.last_issued.load(Ordering::Relaxed),
            self.shared.ceiling.load(Ordering::Relaxed),
        );
        self.core.handle_tick(now);
        self.carry_out();
        self.shared
            .heard_active_ms
            .store(self.core.heard_active_ms(), Ordering::Relaxed);
        self.send_to_owner();
        for p in 0..self.outs.len() {
            self.flush_out(p);
        }
    }

    /// Carry out the core's effects, including those that carrying them out
    /// causes (a dial refused at once, say).
    fn carry_out(&mut self) {
        loop {
            let effects: Vec<ClusterEffect> = self.core.poll_effects().collect();
            if effects.is_empty() {
                return;
            }
            for effect in effects {
                match effect {
                    ClusterEffect::Dial { peer } => self.dial(peer),
                    ClusterEffect::Send { peer, msg } => {
                        let Some(out) = self.outs.get_mut(peer) else {
                            continue;
                        };
                        out.writer.push(&msg);
                        if out.writer.pending().len() > MAX_PEER_OUTPUT {
                            log::warn!(
                                "replication: {} is too far behind; dropping its link",
                                self.peers[peer]
                            );
                            self.out_failed(peer, &io::Error::other("output over limit"));
                        }
                    }
                    ClusterEffect::DropOut { peer } => self.close_out(peer),
                    ClusterEffect::DropIn { link } => {
                        if self.ins.contains(link) {
                            let mut link = self.ins.remove(link);
                            let _ = self.poll.registry().deregister(&mut link.stream);
                        }
                    }
                    ClusterEffect::ToTable(msg) => self.owner_backlog.push_back(msg),
                    ClusterEffect::Exit => {
                        self.send_to_owner();
                        for p in 0..self.outs.len() {
                            self.flush_out(p);
                        }
                        let _ = self.exit.try_send(());
                        self.done = true;
                    }
                }
            }
        }
    }

    /// Send what is queued for the lock owner, in order, as far as its
    /// channel has room.
    fn send_to_owner(&mut self) {
        while let Some(msg) = self.owner_backlog.pop_front() {
            match self.to_owner.try_send(ToOwner::Cluster(msg)) {
                Ok(()) => {}
                Err(TrySendError::Full(ToOwner::Cluster(msg))) => {
                    self.owner_backlog.push_front(msg);
                    return;
                }
                Err(_) => {
                    self.owner_backlog.clear();
                    return;
                }
            }
        }
    }

    // ----- the inbox: owner, I/O loops, shutdown -----

    fn take_inbox(&mut self) {
        loop {
            let now = self.clock.now();
            match self.inbox.try_recv() {
                Ok(ToRepl::Table(msg)) => self.core.handle_table(now, msg),
                Ok(ToRepl::AdoptPeerLink(stream, bytes)) => self.adopt_incoming(stream, bytes),
                Ok(ToRepl::Shutdown) => self.core.handle_shutdown(now),
                Ok(ToRepl::Stop) | Err(TryRecvError::Disconnected) => {
                    self.done = true;
                    return;
                }
                Err(TryRecvError::Empty) => return,
            }
            self.carry_out();
        }
    }

    // ----- outgoing links -----

    fn dial(&mut self, p: usize) {
        let out = &mut self.outs[p];
        if out.addr.is_none() {
            out.addr = resolve(&self.peers[p]);
        }
        let Some(addr) = out.addr else {
            let e = io::Error::new(io::ErrorKind::NotFound, "address does not resolve");
            return self.out_failed(p, &e);
        };
        match TcpStream::connect(addr) {
            Ok(mut stream) => {
                let interest = Interest::READABLE | Interest::WRITABLE;
                match self
                    .poll
                    .registry()
                    .register(&mut stream, Token(p), interest)
                {
                    Ok(()) => {
                        out.stream = Some(stream);
                        out.connecting = true;
                    }
                    Err(e) => self.out_failed(p, &e),
                }
            }
            Err(e) => self.out_failed(p, &e),
        }
    }

    fn handle_out_event(&mut self, p: usize, event: &mio::event::Event) {
        let Some(out) = self.outs.get_mut(p) else {
            return;
        };
        let Some(stream) = out.stream.as_mut() else {
            return;
        };
        if out.connecting {
            match stream.take_error() {
                Ok(Some(e)) | Err(e) => return self.out_failed(p, &e),
                Ok(None) => {}
            }
            match stream.peer_addr() {
                Ok(_) => {
                    out.connecting = false;
                    out.writer.clear();
                    self.core.handle_link_up(self.clock.now(), p);
                    self.carry_out();
                }
                Err(e) if e.kind() == io::ErrorKind::NotConnected => {
                    if event.is_error() || event.is_write_closed() {
                        let e = io::Error::from(io::ErrorKind::ConnectionRefused);
                        self.out_failed(p, &e);
                    }
                }
                Err(e) => self.out_failed(p, &e),
            }
            return;
        }
        // A connected link only writes; readable means EOF or an error.
        if event.is_readable() || event.is_error() || event.is_read_closed() {
            let mut scratch = [0u8; 512];
            loop {
                match stream.read(&mut scratch) {
                    Ok(0) => {
                        let e = io::Error::from(io::ErrorKind::UnexpectedEof);
                        return self.out_failed(p, &e);
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return self.out_failed(p, &e),
                }
            }
        }
        if event.is_writable() {
            self.flush_out(p);
        }
    }

    fn close_out(&mut self, p: usize) {
        let out = &mut self.outs[p];
        if let Some(mut stream) = out.stream.take() {
            let _ = self.poll.registry().deregister(&mut stream);
        }
        out.connecting = false;
        out.writer.clear();
    }

    fn out_failed(&mut self, p: usize, e: &io::Error) {
        self.close_out(p);
        let why = if e.kind() == io::ErrorKind::ConnectionRefused {
            OutDown::Refused
        } else {
            OutDown::Failed
        };
        self.core
            .handle_link_down(self.clock.now(), p, why, &e.to_string());
        self.carry_out();
    }

    fn flush_out(&mut self, p: usize) {
        let out = &mut self.outs[p];
        if out.connecting {
            return;
        }
        let Some(stream) = out.stream.as_mut() else {
            return;
        };
        while !out.writer.pending().is_empty() {
            match stream.write(out.writer.pending()) {
                Ok(0) => break,
                Ok(n) => out.writer.consume(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.out_failed(p, &e),
            }
        }
    }

    // ----- incoming links -----

    fn adopt_incoming(&mut self, stream: std::net::TcpStream, bytes: Vec<u8>) {
        let mut stream = TcpStream::from_std(stream);
        let entry = self.ins.vacant_entry();
        let token = Token(IN_BASE + entry.key());
        if let Err(e) = self
            .poll
            .registry()
            .register(&mut stream, token, Interest::READABLE)
        {
            log::warn!("replication: cannot register a peer link: {e}");
            return;
        }
        let link = entry.key();
        entry.insert(InLink {
            stream,
            reader: PeerReader::with_bytes(bytes),
        });
        self.core.handle_in_opened(link);
        self.parse_in(link);
        // Bytes may have arrived between the adoption and registration.
        self.read_in(link);
    }

    fn read_in(&mut self, link: LinkId) {
        let mut scratch = [0u8; 16 * 1024];
        loop {
            let Some(state) = self.ins.get_mut(link) else {
                return;
            };
            match state.stream.read(&mut scratch) {
                Ok(0) => return self.close_in(link, "closed"),
                Ok(n) => {
                    if let Err(why) = state.reader.push(&scratch[..n]) {
                        return self.close_in(link, why);
                    }
                    self.parse_in(link);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.close_in(link, &e.to_string()),
            }
        }
    }

    fn parse_in(&mut self, link: LinkId) {
        loop {
            let Some(state) = self.ins.get_mut(link) else {
                return;
            };
            let Some(parsed) = state.reader.next_msg() else {
                return;
            };
            let now = self.clock.now();
            match parsed {
                Ok(msg) => self.core.handle_peer_msg(now, link, msg),
                Err(()) => self.core.handle_in_malformed(now, link),
            }
            self.carry_out();
        }
    }

    fn close_in(&mut self, link: LinkId, why: &str) {
        if self.ins.contains(link) {
            let mut state = self.ins.remove(link);
            let _ = self.poll.registry().deregister(&mut state.stream);
        }
        self.core.handle_in_closed(self.clock.now(), link, why);
        self.carry_out();
    }
}

fn resolve(peer: &str) -> Option<SocketAddr> {
    peer.to_socket_addrs().ok()?.next()
}
