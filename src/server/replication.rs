//! The replication thread: peer links, heartbeats, roles, state transfer.
//!
//! Owns: one outgoing TCP link to every other node (to send this node's
//! heartbeats and, when active, its snapshot and deltas), the incoming links
//! handed over by the I/O loops (a connection whose first line is `P HELLO`),
//! and the [`Roles`] state machine. It tells the lock owner which role to
//! play, forwards the active's deltas to the standbys, and feeds a standby's
//! lock owner the snapshot and deltas it receives.
//!
//! Each link carries one direction only: node A's messages to node B travel
//! on A's outgoing link to B, so a link's order is TCP's order. A peer is
//! found dead by its heartbeats stopping for `--detect` seconds, or at once
//! when its link drops and a new connection to it is refused (the process is
//! gone).
//!
//! Never does: touch lock state, or block: a slow or dead standby only grows
//! its own bounded output buffer (past `MAX_PEER_OUTPUT` the link is dropped
//! and later re-synced from a fresh snapshot), never the active's answers.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use crate::server::Shared;
use crate::server::lock_table::Delta;
use crate::server::owner::{Clock, OwnerMsg};
use crate::server::peer_wire::{PeerMsg, PeerParsed, parse_peer};
use crate::server::roles::{RoleEffect, Roles};

/// Token of the replication thread's waker.
pub const REPL_WAKER: Token = Token(usize::MAX - 1);
/// Incoming links use tokens from here on (outgoing links use 0..nodes).
const IN_BASE: usize = 1 << 20;
/// Unsent bytes to one peer past which its link is dropped.
const MAX_PEER_OUTPUT: usize = 64 * 1024 * 1024;
/// Unparsed bytes from one peer past which its link is dropped (a line is
/// at most MAX_LINE; this only bounds a broken peer).
const MAX_PEER_INPUT: usize = 1024 * 1024;
/// Wait between attempts to connect to a peer.
const RECONNECT_MS: u64 = 100;
/// Heartbeats per detection period.
const BEATS_PER_DETECT: u64 = 4;

/// What the replication thread is told.
pub enum ToRepl {
    /// From the lock owner.
    Owner(OwnerToRepl),
    /// From an I/O loop: a connection that opened with a peer line, and the
    /// bytes already read from it.
    Incoming(std::net::TcpStream, Vec<u8>),
    /// Graceful shutdown asked for (SIGINT/SIGTERM).
    Shutdown,
    /// Stop now (the last step of shutdown).
    Stop,
}

/// What the lock owner tells the replication thread.
#[derive(Debug)]
pub enum OwnerToRepl {
    /// State changes while active, in order.
    Deltas(Vec<Delta>),
    /// The whole table, for a standby that asked.
    Snapshot {
        peer: usize,
        entries: Vec<Delta>,
        ceiling: u64,
    },
    /// Every delta before this one has been sent: `HANDOFF` may go to `to`.
    HandoffReady { to: usize },
    /// Clients have been redirected after a finished handoff.
    Redirected,
}

/// What the replication thread tells the lock owner.
#[derive(Debug)]
pub enum ReplToOwner {
    /// Serve, with tokens above `floor`; `failover` when promoted by an
    /// election (state may be missing), not by an orderly handoff.
    BecomeActive { floor: u64, failover: bool },
    /// Do not serve; redirect clients to `active` (its address), or `M -`.
    Follow { active: Option<String> },
    /// Stop serving (hold requests back) and answer `HandoffReady`.
    StartHandoff { to: usize },
    /// The handoff failed: serve again.
    AbortHandoff,
    /// `to` took over: redirect every held request and waiter to it.
    FinishHandoff { to: String },
    /// Shutting down with no successor: answer every waiter `M -`, then
    /// answer `Redirected`.
    Retire,
    /// Replace the table with the active's.
    Snapshot(Vec<Delta>),
    /// Apply the active's deltas.
    Deltas(Vec<Delta>),
    /// Lift the token counter above this.
    Observe(u64),
    /// Send a snapshot for `peer`.
    SnapshotWanted { peer: usize },
}

enum OutState {
    Idle { retry_at_ms: u64 },
    Connecting,
    Connected,
}

struct OutLink {
    addr: Option<SocketAddr>,
    stream: Option<TcpStream>,
    state: OutState,
    output: Vec<u8>,
    written: usize,
    /// The peer has this node's snapshot on this link.
    snap_sent: bool,
    snap_pending: bool,
    /// When the snapshot went out (clock ms).
    snap_sent_ms: u64,
}

struct InLink {
    stream: TcpStream,
    peer: Option<usize>,
    input: Vec<u8>,
    /// A snapshot is being received (entries so far).
    snapshot: Option<Vec<Delta>>,
}

/// The replication thread's state.
pub struct Replication {
    me: usize,
    peers: Vec<String>,
    detect_ms: u64,
    roles: Roles,
    clock: Clock,
    poll: Poll,
    outs: Vec<OutLink>,
    ins: Slab<InLink>,
    inbox: Receiver<ToRepl>,
    to_owner: Sender<OwnerMsg>,
    shared: Arc<Shared>,
    exit: Sender<()>,
    next_beat_ms: u64,
    deltas_in: Vec<Delta>,
    awaiting_redirect: bool,
    exit_when_redirected: bool,
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
        to_owner: Sender<OwnerMsg>,
        shared: Arc<Shared>,
        exit: Sender<()>,
    ) -> Replication {
        let now_ms = clock.now_ms();
        let roles = Roles::new(me, peers.len(), detect_ms, detect_ms, now_ms);
        let outs = peers
            .iter()
            .map(|peer| OutLink {
                addr: resolve(peer),
                stream: None,
                state: OutState::Idle { retry_at_ms: 0 },
                output: Vec::new(),
                written: 0,
                snap_sent: false,
                snap_pending: false,
                snap_sent_ms: 0,
            })
            .collect();
        Replication {
            me,
            peers,
            detect_ms,
            roles,
            clock,
            poll,
            outs,
            ins: Slab::new(),
            inbox,
            to_owner,
            shared,
            exit,
            next_beat_ms: 0,
            deltas_in: Vec::new(),
            awaiting_redirect: false,
            exit_when_redirected: false,
            done: false,
        }
    }

    /// Run until the node exits.
    pub fn run(mut self) {
        let mut events = Events::with_capacity(256);
        log::info!(
            "replication: node {} of {:?}, detection {} ms",
            self.peers[self.me],
            self.peers,
            self.detect_ms
        );
        while !self.done {
            let now_ms = self.clock.now_ms();
            let wake_ms = self.next_wake_ms(now_ms);
            let timeout = Duration::from_millis(wake_ms.saturating_sub(now_ms));
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

    fn next_wake_ms(&self, now_ms: u64) -> u64 {
        let mut wake = self.next_beat_ms.min(self.roles.next_wake_ms(now_ms));
        for (p, out) in self.outs.iter().enumerate() {
            // This node has no link to itself (its entry stays idle).
            if let OutState::Idle { retry_at_ms } = out.state
                && p != self.me
            {
                wake = wake.min(retry_at_ms);
            }
        }
        wake.max(now_ms)
    }

    /// Time-driven work after the events: roles, heartbeats, reconnects,
    /// snapshots, flushing.
    fn round(&mut self) {
        let now_ms = self.clock.now_ms();
        let synced = (0..self.peers.len())
            .filter(|&p| {
                p != self.me
                    && self.roles.is_live(p, now_ms)
                    && self
                        .roles
                        .peer_beat(p)
                        .is_some_and(|b| b.following == Some(self.me) && b.synced)
            })
            .count();
        self.shared.synced_standbys.store(synced, Ordering::Relaxed);
        self.flush_deltas_in();
        let effects = self.roles.poll(now_ms);
        self.apply_effects(effects);
        if now_ms >= self.next_beat_ms {
            self.send_beats();
            self.next_beat_ms = now_ms + (self.detect_ms / BEATS_PER_DETECT).max(1);
        }
        for p in 0..self.outs.len() {
            if p != self.me {
                self.maybe_connect(p, now_ms);
                self.maybe_ask_snapshot(p);
                self.flush_out(p);
            }
        }
    }

    // ----- the inbox: owner, I/O loops, shutdown -----

    fn take_inbox(&mut self) {
        loop {
            match self.inbox.try_recv() {
                Ok(ToRepl::Owner(msg)) => self.handle_owner(msg),
                Ok(ToRepl::Incoming(stream, bytes)) => self.adopt_incoming(stream, bytes),
                Ok(ToRepl::Shutdown) => {
                    log::info!("replication: graceful shutdown asked for");
                    let effects = self.roles.handle_shutdown(self.clock.now_ms());
                    self.apply_effects(effects);
                }
                Ok(ToRepl::Stop) | Err(TryRecvError::Disconnected) => {
                    self.done = true;
                    return;
                }
                Err(TryRecvError::Empty) => return,
            }
        }
    }

    fn handle_owner(&mut self, msg: OwnerToRepl) {
        match msg {
            OwnerToRepl::Deltas(deltas) => {
                for p in 0..self.outs.len() {
                    if p == self.me || !self.outs[p].snap_sent {
                        continue;
                    }
                    for delta in &deltas {
                        self.send(p, &PeerMsg::Delta(delta.clone()));
                    }
                }
            }
            OwnerToRepl::Snapshot {
                peer,
                entries,
                ceiling,
            } => self.send_snapshot(peer, entries, ceiling),
            OwnerToRepl::HandoffReady { to } => {
                log::info!("replication: handing over to {}", self.peers[to]);
                self.send(to, &PeerMsg::Handoff);
                self.flush_out(to);
            }
            OwnerToRepl::Redirected => {
                self.awaiting_redirect = false;
                if self.exit_when_redirected {
                    self.finish_exit();
                }
            }
        }
    }

    fn send_snapshot(&mut self, peer: usize, entries: Vec<Delta>, ceiling: u64) {
        let out = &mut self.outs[peer];
        out.snap_pending = false;
        if !matches!(out.state, OutState::Connected) || !self.roles.role_name().is_active() {
            return;
        }
        log::info!(
            "replication: sending a snapshot of {} keys to {}",
            entries.len(),
            self.peers[peer]
        );
        self.send(peer, &PeerMsg::SnapshotBegin);
        for entry in entries {
            self.send(peer, &PeerMsg::Delta(entry));
        }
        self.send(peer, &PeerMsg::Delta(Delta::Ceiling(ceiling)));
        self.send(peer, &PeerMsg::SnapshotEnd);
        self.outs[peer].snap_sent = true;
        self.outs[peer].snap_sent_ms = self.clock.now_ms();
    }

    /// Ask the owner for a snapshot for `p` when `p` follows this active
    /// node and has none on its current link.
    fn maybe_ask_snapshot(&mut self, p: usize) {
        let beat = self.roles.peer_beat(p);
        let follows_me = beat.is_some_and(|b| b.following == Some(self.me));
        let active = self.roles.role_name().is_active();
        let now_ms = self.clock.now_ms();
        let out = &mut self.outs[p];
        if !follows_me || !active {
            out.snap_sent = false;
            return;
        }
        // A follower that still says it lacks the state a detection period
        // after its snapshot went out did not get it (it switched to this
        // node in between, say): send it again.
        let stale = beat.is_some_and(|b| !b.synced)
            && now_ms.saturating_sub(out.snap_sent_ms) > self.detect_ms;
        if out.snap_sent && stale {
            log::info!(
                "replication: {} still lacks the state; sending it again",
                self.peers[p]
            );
            out.snap_sent = false;
        }
        if out.snap_sent || out.snap_pending || !matches!(out.state, OutState::Connected) {
            return;
        }
        out.snap_pending = true;
        self.tell_owner(ReplToOwner::SnapshotWanted { peer: p });
    }

    // ----- roles -----

    fn apply_effects(&mut self, effects: Vec<RoleEffect>) {
        if !effects.is_empty() {
            // Deltas received so far belong to the old role: apply them first.
            self.flush_deltas_in();
        }
        let mut changed = false;
        let handoff = effects
            .iter()
            .any(|e| matches!(e, RoleEffect::SendTook { .. }));
        for effect in effects {
            log::info!(
                "replication: {:?} (role now {:?})",
                effect,
                self.roles.role_name()
            );
            changed = true;
            match effect {
                RoleEffect::BecomeActive => {
                    let floor = crate::server::tokens::clock_floor(crate::server::unix_ms());
                    self.tell_owner(ReplToOwner::BecomeActive {
                        floor,
                        failover: !handoff,
                    });
                    for out in &mut self.outs {
                        out.snap_sent = false;
                    }
                }
                RoleEffect::Follow { active } => {
                    for link in self.ins.iter_mut() {
                        link.1.snapshot = None;
                    }
                    let active = active.map(|a| self.peers[a].clone());
                    self.tell_owner(ReplToOwner::Follow { active });
                }
                RoleEffect::StartHandoff { to } => {
                    self.tell_owner(ReplToOwner::StartHandoff { to });
                }
                RoleEffect::AbortHandoff => self.tell_owner(ReplToOwner::AbortHandoff),
                RoleEffect::FinishHandoff { to } => {
                    self.awaiting_redirect = true;
                    let to = self.peers[to].clone();
                    self.tell_owner(ReplToOwner::FinishHandoff { to });
                }
                RoleEffect::SendTook { to } => {
                    self.send(to, &PeerMsg::Took);
                    self.flush_out(to);
                }
                RoleEffect::Exit => {
                    if !self.awaiting_redirect && self.roles.role_name().is_active() {
                        // No successor: waiters still get a clear answer.
                        self.awaiting_redirect = true;
                        self.tell_owner(ReplToOwner::Retire);
                    }
                    if self.awaiting_redirect {
                        self.exit_when_redirected = true;
                    } else {
                        self.finish_exit();
                    }
                }
            }
        }
        if changed {
            self.send_beats();
        }
    }

    fn finish_exit(&mut self) {
        for p in 0..self.outs.len() {
            if p != self.me {
                self.flush_out(p);
            }
        }
        let _ = self.exit.send(());
        self.done = true;
    }

    fn tell_owner(&self, msg: ReplToOwner) {
        let _ = self.to_owner.send(OwnerMsg::Repl(msg));
    }

    fn send_beats(&mut self) {
        let beat = PeerMsg::Beat {
            beat: self.roles.beat(),
            last_token: self.shared.last_issued.load(Ordering::Relaxed),
            ceiling: self.shared.ceiling.load(Ordering::Relaxed),
        };
        for p in 0..self.outs.len() {
            if p != self.me && matches!(self.outs[p].state, OutState::Connected) {
                self.send(p, &beat);
                self.flush_out(p);
            }
        }
    }

    // ----- outgoing links -----

    fn maybe_connect(&mut self, p: usize, now_ms: u64) {
        let out = &mut self.outs[p];
        let OutState::Idle { retry_at_ms } = out.state else {
            return;
        };
        if now_ms < retry_at_ms {
            return;
        }
        out.state = OutState::Idle {
            retry_at_ms: now_ms + RECONNECT_MS,
        };
        if out.addr.is_none() {
            out.addr = resolve(&self.peers[p]);
        }
        let Some(addr) = out.addr else {
            return;
        };
        match TcpStream::connect(addr) {
            Ok(mut stream) => {
                let interest = Interest::READABLE | Interest::WRITABLE;
                if self
                    .poll
                    .registry()
                    .register(&mut stream, Token(p), interest)
                    .is_ok()
                {
                    out.stream = Some(stream);
                    out.state = OutState::Connecting;
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
        if matches!(out.state, OutState::Connecting) {
            match stream.take_error() {
                Ok(Some(e)) | Err(e) => return self.out_failed(p, &e),
                Ok(None) => {}
            }
            match stream.peer_addr() {
                Ok(_) => self.out_connected(p),
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

    fn out_connected(&mut self, p: usize) {
        log::info!("replication: link to {} is up", self.peers[p]);
        let out = &mut self.outs[p];
        out.state = OutState::Connected;
        out.output.clear();
        out.written = 0;
        out.snap_sent = false;
        out.snap_pending = false;
        let nodes = self.peers.len();
        self.send(
            p,
            &PeerMsg::Hello {
                from: self.me,
                nodes,
            },
        );
        self.send_beats();
    }

    fn out_failed(&mut self, p: usize, e: &io::Error) {
        let now_ms = self.clock.now_ms();
        let out = &mut self.outs[p];
        let was_connected = matches!(out.state, OutState::Connected);
        if let Some(mut stream) = out.stream.take() {
            let _ = self.poll.registry().deregister(&mut stream);
        }
        out.output.clear();
        out.written = 0;
        out.snap_sent = false;
        out.snap_pending = false;
        // Reconnect at once after a drop (to tell a dead peer from a blip
        // quickly), then every RECONNECT_MS.
        let retry_at_ms = if was_connected {
            now_ms
        } else {
            now_ms + RECONNECT_MS
        };
        out.state = OutState::Idle { retry_at_ms };
        if was_connected {
            log::info!("replication: link to {} dropped: {e}", self.peers[p]);
        } else {
            log::debug!("replication: connecting to {} failed: {e}", self.peers[p]);
        }
        // Nothing listens on its port: the process is gone (a live node
        // does not refuse; an overloaded one drops the SYN instead).
        if e.kind() == io::ErrorKind::ConnectionRefused {
            let effects = self.roles.handle_peer_dead(now_ms, p);
            self.apply_effects(effects);
        }
    }

    fn send(&mut self, p: usize, msg: &PeerMsg) {
        let out = &mut self.outs[p];
        if !matches!(out.state, OutState::Connected) {
            return;
        }
        msg.write_to(&mut out.output);
        if out.output.len() - out.written > MAX_PEER_OUTPUT {
            log::warn!(
                "replication: {} is too far behind; dropping its link",
                self.peers[p]
            );
            let e = io::Error::other("output over limit");
            self.out_failed(p, &e);
        }
    }

    fn flush_out(&mut self, p: usize) {
        let out = &mut self.outs[p];
        let Some(stream) = out.stream.as_mut() else {
            return;
        };
        if !matches!(out.state, OutState::Connected) {
            return;
        }
        while out.written < out.output.len() {
            match stream.write(&out.output[out.written..]) {
                Ok(0) => break,
                Ok(n) => out.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.out_failed(p, &e),
            }
        }
        if out.written == out.output.len() {
            out.output.clear();
            out.written = 0;
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
        let slot = entry.key();
        entry.insert(InLink {
            stream,
            peer: None,
            input: bytes,
            snapshot: None,
        });
        self.parse_in(slot);
        // Bytes may have arrived between the handover and registration.
        self.read_in(slot);
    }

    fn read_in(&mut self, slot: usize) {
        let mut scratch = [0u8; 16 * 1024];
        loop {
            let Some(link) = self.ins.get_mut(slot) else {
                return;
            };
            match link.stream.read(&mut scratch) {
                Ok(0) => return self.drop_in(slot, "closed"),
                Ok(n) => {
                    link.input.extend_from_slice(&scratch[..n]);
                    if link.input.len() > MAX_PEER_INPUT {
                        return self.drop_in(slot, "input over limit");
                    }
                    self.parse_in(slot);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.drop_in(slot, &e.to_string()),
            }
        }
    }

    fn parse_in(&mut self, slot: usize) {
        let mut used = 0;
        loop {
            let Some(link) = self.ins.get(slot) else {
                return;
            };
            let (n, msg) = match parse_peer(&link.input[used..]) {
                PeerParsed::Incomplete => break,
                PeerParsed::Line { used: n, msg } => (n, msg),
            };
            used += n;
            match msg {
                Some(msg) => self.handle_peer_msg(slot, msg),
                None => return self.drop_in(slot, "a line not understood"),
            }
        }
        if let Some(link) = self.ins.get_mut(slot) {
            link.input.drain(..used);
        }
    }

    fn drop_in(&mut self, slot: usize, why: &str) {
        let mut link = self.ins.remove(slot);
        let _ = self.poll.registry().deregister(&mut link.stream);
        if let Some(p) = link.peer {
            log::info!("replication: link from {} dropped: {why}", self.peers[p]);
            // Probe the peer at once through our own link: refused means dead.
            if let Some(out) = self.outs.get_mut(p) {
                if let Some(mut stream) = out.stream.take() {
                    let _ = self.poll.registry().deregister(&mut stream);
                }
                out.state = OutState::Idle { retry_at_ms: 0 };
                out.snap_sent = false;
                out.snap_pending = false;
            }
        }
    }

    fn handle_peer_msg(&mut self, slot: usize, msg: PeerMsg) {
        let now_ms = self.clock.now_ms();
        let link = &mut self.ins[slot];
        let Some(p) = link.peer else {
            return self.handle_hello(slot, msg);
        };
        let from_my_active = self.roles.following() == Some(p);
        if from_my_active {
            self.shared.heard_active_ms.store(now_ms, Ordering::Relaxed);
        }
        match msg {
            PeerMsg::Hello { .. } => self.drop_in(slot, "a second hello"),
            PeerMsg::Beat {
                beat,
                last_token,
                ceiling,
            } => {
                if beat.following != Some(self.me) {
                    // Whatever it had from this node is stale now (it may
                    // follow this node again by its very next heartbeat).
                    self.outs[p].snap_sent = false;
                }
                // Stay above every token any peer issued itself (one that
                // was active during a split included), and above the ceiling
                // of any active; an active never takes a standby's ceiling
                // (an echo of its own, which would only inflate tokens).
                let i_am_active = self.roles.role_name().is_active();
                let mut floor = last_token;
                if !i_am_active || beat.role.is_active() {
                    floor = floor.max(ceiling);
                }
                self.tell_owner(ReplToOwner::Observe(floor));
                let effects = self.roles.handle_beat(now_ms, p, beat);
                self.apply_effects(effects);
            }
            PeerMsg::SnapshotBegin if from_my_active => link.snapshot = Some(Vec::new()),
            PeerMsg::Delta(delta) if from_my_active => match link.snapshot.as_mut() {
                Some(entries) => entries.push(delta),
                None => self.deltas_in.push(delta),
            },
            PeerMsg::SnapshotEnd if from_my_active => {
                if let Some(entries) = link.snapshot.take() {
                    log::info!(
                        "replication: snapshot of {} entries from {}",
                        entries.len(),
                        self.peers[p]
                    );
                    self.flush_deltas_in();
                    self.tell_owner(ReplToOwner::Snapshot(entries));
                    let effects = self.roles.handle_synced(now_ms, p);
                    self.apply_effects(effects);
                    // Tell every peer at once that this node now holds the
                    // state: the active may hand over to it, and it must
                    // win an election from now on.
                    self.send_beats();
                }
            }
            PeerMsg::Handoff => {
                self.flush_deltas_in();
                let effects = self.roles.handle_handoff(now_ms, p);
                self.apply_effects(effects);
            }
            PeerMsg::Took => {
                let effects = self.roles.handle_took(now_ms, p);
                self.apply_effects(effects);
            }
            PeerMsg::SnapshotBegin | PeerMsg::Delta(_) | PeerMsg::SnapshotEnd => {
                // From a node this one does not follow: stale, ignore.
            }
        }
    }

    fn handle_hello(&mut self, slot: usize, msg: PeerMsg) {
        let PeerMsg::Hello { from, nodes } = msg else {
            return self.drop_in(slot, "no hello first");
        };
        if nodes != self.peers.len() || from >= nodes || from == self.me {
            log::warn!(
                "replication: a peer says it is node {from} of {nodes}; this node is {} of {}: \
                 are the --peers lists the same everywhere?",
                self.me,
                self.peers.len()
            );
            return self.drop_in(slot, "a mismatched hello");
        }
        // A newer link from the same peer replaces the old one.
        let stale: Vec<usize> = self
            .ins
            .iter()
            .filter(|(s, link)| *s != slot && link.peer == Some(from))
            .map(|(s, _)| s)
            .collect();
        for s in stale {
            let mut link = self.ins.remove(s);
            let _ = self.poll.registry().deregister(&mut link.stream);
        }
        log::info!("replication: link from {} is up", self.peers[from]);
        self.ins[slot].peer = Some(from);
    }

    fn flush_deltas_in(&mut self) {
        if !self.deltas_in.is_empty() {
            let deltas = std::mem::take(&mut self.deltas_in);
            self.tell_owner(ReplToOwner::Deltas(deltas));
        }
    }
}

fn resolve(peer: &str) -> Option<SocketAddr> {
    peer.to_socket_addrs().ok()?.next()
}
