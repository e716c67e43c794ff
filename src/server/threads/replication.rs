//! The replication thread: the shell around the cluster core.
//!
//! Owns: the sockets of the peer links — one outgoing TCP link to every
//! other node, and the incoming links adopted from the I/O loops (a
//! connection whose first line is a peer's) — with their framing
//! (`peer_wire::PeerReader`/`PeerWriter`), their handshake and seals
//! (peer_auth.rs, with the cluster key and fresh random nonces), and the
//! thread's channels. Every decision (roles, heartbeats, snapshots, which
//! link to open or drop, handshake deadlines, the exit sequence, whether a
//! peer message is acceptable) is [`ClusterCore`]'s, and the order in which
//! the inbox and the tick feed it and its effects are carried out is
//! rounds.rs's (`take_inbox`, `tick`, `end_turn`, `carry_out`, which the simulation runs
//! too): this file reads the clock, moves bytes, runs the handshake's
//! crypto, feeds the core socket events, and implements `rounds::ReplShell`. No incoming link gets more than
//! [`READ_BUDGET`] bytes read per round, so a flood on one link never
//! starves the heartbeats. What waits for the lock owner is bounded
//! (`rounds::OwnerQueue`, `messages::capacity::CLUSTER_ENTRIES`): at the
//! bound no incoming link is read until the owner catches up
//! (`rounds::may_read_peer` decides), so what peers send waits in the
//! kernel's socket buffers (TCP pushes back on the sender), not in this
//! node's memory; a link held back so is not silent to the core, nor is
//! its peer dead ([`ClusterCore::handle_in_held`]).
//!
//! TLS (`--tls-cert`): every link is a [`Stream`]. An outgoing link is
//! dialed as a TLS client that checks the peer's certificate against
//! `--tls-ca` and the host of the peer's `--peers` entry, and presents this
//! node's certificate; an incoming link arrives from an I/O loop with its
//! TLS session already up, and the certificate its peer presented must
//! chain to `--tls-ca` and name the `--peers` entry of the node it proves
//! to be (checked with the proof, before the link is acted on). The
//! cluster-key handshake and the seals run inside TLS unchanged.
//!
//! Never does: touch lock state, decide anything (the core and rounds.rs
//! do, its backpressure included), or block: a slow or dead standby only
//! grows its own bounded output buffer (past `rounds::MAX_PEER_OUTPUT`,
//! rounds.rs drops the link, later re-synced from a fresh snapshot), never
//! the active's answers; a full channel to the lock owner keeps the
//! messages here, in order, until it has room — and never more than the
//! bound above.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TryRecvError, TrySendError};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use crate::server::clock::Clock;
use crate::server::shared::{Gauges, Settings};
use ring::rand::{SecureRandom, SystemRandom};

use crate::server::core::cluster_core::{
    ClusterCore, ClusterParams, LinkId, OutDown, RateLimit, WARN_EVERY_MS,
};
use crate::server::core::now::Now;
use crate::server::core::peer_msg::{PeerMsg, PeerParsed, parse_peer};
use crate::server::messages::{ClusterToTable, ToOwner, ToRepl, capacity};
use crate::server::peer_wire::{PeerReader, PeerWriter};
use crate::server::rounds::{self, Gone, Offer, OwnerQueue, ReplInput, ReplShell};
use crate::server::trust::peer_auth::{
    Acceptor, ClusterKey, Dialer, LinkIds, NONCE_LEN, Opener, peers_fingerprint,
};
use crate::server::trust::tls::Stream;

/// Token of the replication thread's waker.
pub const REPL_WAKER: Token = Token(usize::MAX - 1);
/// Incoming links use tokens from here on (outgoing links use 0..nodes).
const IN_BASE: usize = 1 << 20;
/// How soon a full channel to the lock owner is tried again.
const RETRY_FULL_MS: u64 = 1;
/// Bytes read from one incoming link per round, at most; the rest waits for
/// the next round (which comes at once).
pub const READ_BUDGET: usize = 64 * 1024;

/// Where an outgoing link is in its life.
enum OutPhase {
    Idle,
    /// TCP connect in progress.
    Connecting(Dialer),
    /// Hello sent; waiting for the peer's challenge and proof.
    AwaitChallenge(Dialer),
    /// Authenticated: writes sealed messages, reads only EOF.
    Up,
}

struct OutLink {
    addr: Option<SocketAddr>,
    stream: Option<Stream>,
    phase: OutPhase,
    writer: PeerWriter,
    reader: PeerReader,
}

/// Where an incoming link is in its handshake.
enum InPhase {
    AwaitHello,
    AwaitAuth(Acceptor),
    Open(Opener),
    /// Failed; the core has been told (and will drop it).
    Done,
}

struct InLink {
    stream: Stream,
    addr: Option<SocketAddr>,
    reader: PeerReader,
    phase: InPhase,
    /// The challenge, until written.
    writer: PeerWriter,
}

/// The replication thread's state.
pub struct Replication {
    core: ClusterCore,
    peers: Vec<String>,
    me: usize,
    detect_ms: u64,
    key: ClusterKey,
    fingerprint: [u8; 8],
    rng: SystemRandom,
    /// Incoming links whose read budget ran out with data left.
    unread: Vec<LinkId>,
    clock: Clock,
    poll: Poll,
    outs: Vec<OutLink>,
    ins: Slab<InLink>,
    inbox: Receiver<ToRepl>,
    to_owner: Sender<ToOwner>,
    /// Messages for the lock owner not sent yet (its channel was full),
    /// and the bound on what waits for it.
    owner_backlog: OwnerQueue,
    /// Warnings that the owner is behind and peers are read no faster.
    behind_warn: RateLimit,
    settings: Arc<Settings>,
    gauges: Arc<Gauges>,
    exit: Sender<()>,
    done: bool,
}

impl Replication {
    /// Build the thread's state; `poll` must be the one `waker` belongs to.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        me: usize,
        peers: Vec<String>,
        params: ClusterParams,
        key: ClusterKey,
        clock: Clock,
        poll: Poll,
        inbox: Receiver<ToRepl>,
        to_owner: Sender<ToOwner>,
        settings: Arc<Settings>,
        gauges: Arc<Gauges>,
        exit: Sender<()>,
    ) -> Replication {
        let rng = SystemRandom::new();
        let mut params = params;
        let mut seed = [0u8; 8];
        if rng.fill(&mut seed).is_ok() {
            params.seed = u64::from_le_bytes(seed);
        }
        let core = ClusterCore::new(me, peers.clone(), params, clock.now());
        let outs = peers
            .iter()
            .map(|peer| OutLink {
                addr: resolve(peer),
                stream: None,
                phase: OutPhase::Idle,
                writer: PeerWriter::default(),
                reader: PeerReader::default(),
            })
            .collect();
        Replication {
            core,
            fingerprint: peers_fingerprint(&peers),
            peers,
            me,
            detect_ms: params.detect_ms,
            key,
            rng,
            unread: Vec::new(),
            clock,
            poll,
            outs,
            ins: Slab::new(),
            inbox,
            to_owner,
            owner_backlog: OwnerQueue::new(
                Arc::clone(&gauges.cluster_queued),
                capacity::CLUSTER_ENTRIES,
            ),
            behind_warn: RateLimit::default(),
            settings,
            gauges,
            exit,
            done: false,
        }
    }

    /// Run until the node exits.
    pub fn run(mut self) {
        crate::server::sched::run_in_background("replication");
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
            let reading = self.owner_backlog.takes_peer_input();
            if self.owner_backlog.is_waiting() || !reading {
                // Retry the full channel; see whether the owner caught up.
                wake_ms = wake_ms.min(now.ms + RETRY_FULL_MS);
            }
            if !self.unread.is_empty() && reading {
                wake_ms = now.ms;
            }
            let timeout = Duration::from_millis(wake_ms.saturating_sub(now.ms));
            if let Err(e) = self.poll.poll(&mut events, Some(timeout))
                && e.kind() != io::ErrorKind::Interrupted
            {
                log::error!("replication: poll failed: {e}");
                break;
            }
            for link in std::mem::take(&mut self.unread) {
                self.read_in(link);
            }
            for event in events.iter() {
                match event.token() {
                    REPL_WAKER => {}
                    Token(t) if t >= IN_BASE => {
                        let link = t - IN_BASE;
                        if event.is_writable() {
                            self.flush_in(link);
                        }
                        if !self.unread.contains(&link) {
                            self.read_in(link);
                        }
                    }
                    Token(p) => self.handle_out_event(p, event),
                }
            }
            // The lock owner's messages and the other threads', then the
            // time-driven work (rounds.rs).
            rounds::end_turn(&mut self);
        }
        log::info!("replication: stopped");
    }

    /// Carry out the core's effects (rounds.rs), including those that
    /// carrying them out causes (a dial refused at once, say).
    fn carry_out(&mut self) {
        rounds::carry_out(self);
    }

    /// Send what is queued for the lock owner, in order, as far as its
    /// channel has room.
    fn send_to_owner(&mut self) {
        let to_owner = &self.to_owner;
        self.owner_backlog
            .send(|msg| match to_owner.try_send(ToOwner::Cluster(msg)) {
                Ok(()) => Offer::Taken,
                Err(TrySendError::Full(ToOwner::Cluster(msg))) => Offer::Full(msg),
                Err(_) => Offer::Gone,
            });
    }

    fn flush_outs(&mut self) {
        for p in 0..self.outs.len() {
            self.flush_out(p);
        }
    }

    // ----- the inbox: owner, I/O loops, shutdown -----

    // ----- outgoing links -----

    fn nonce(&self) -> Option<[u8; NONCE_LEN]> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        Some(nonce)
    }

    fn dial(&mut self, p: usize) {
        let Some(nonce) = self.nonce() else {
            return self.out_failed(p, &io::Error::other("no random nonce"));
        };
        let ids = LinkIds {
            from: self.me,
            to: p,
            nodes: self.peers.len(),
            fp: self.fingerprint,
        };
        let dialer = Dialer::new(self.key.clone(), ids, nonce);
        let out = &mut self.outs[p];
        if out.addr.is_none() {
            out.addr = resolve(&self.peers[p]);
        }
        let Some(addr) = out.addr else {
            let e = io::Error::new(io::ErrorKind::NotFound, "address does not resolve");
            return self.out_failed(p, &e);
        };
        let connected = TcpStream::connect(addr).and_then(|sock| match &self.settings.tls {
            None => Ok(Stream::Plain(sock)),
            Some(tls) => tls
                .dial(sock, &self.peers[p])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e)),
        });
        let out = &mut self.outs[p];
        match connected {
            Ok(mut stream) => {
                let interest = Interest::READABLE | Interest::WRITABLE;
                match self
                    .poll
                    .registry()
                    .register(&mut stream, Token(p), interest)
                {
                    Ok(()) => {
                        out.stream = Some(stream);
                        out.phase = OutPhase::Connecting(dialer);
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
        if matches!(out.phase, OutPhase::Connecting(_)) {
            match stream.take_error() {
                Ok(Some(e)) | Err(e) => return self.out_failed(p, &e),
                Ok(None) => {}
            }
            match stream.peer_addr() {
                Ok(_) => {
                    let _ = stream.set_nodelay(true);
                    let OutPhase::Connecting(dialer) =
                        std::mem::replace(&mut out.phase, OutPhase::Idle)
                    else {
                        return;
                    };
                    out.writer.clear();
                    out.reader = PeerReader::default();
                    out.writer.push_raw(&dialer.hello_line());
                    out.phase = OutPhase::AwaitChallenge(dialer);
                    self.flush_out(p);
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
        // A link reads the peer's challenge (after the TLS handshake, if
        // any), then only EOF or an error;
        // anything else the peer sends after the handshake is discarded.
        if event.is_readable() || event.is_error() || event.is_read_closed() {
            let mut scratch = [0u8; 4096];
            let mut budget = READ_BUDGET;
            while budget > 0 {
                match stream.read(&mut scratch) {
                    Ok(0) => {
                        let e = io::Error::from(io::ErrorKind::UnexpectedEof);
                        return self.out_failed(p, &e);
                    }
                    Ok(n) => {
                        budget = budget.saturating_sub(n);
                        if matches!(out.phase, OutPhase::AwaitChallenge(_)) {
                            if let Err(why) = out.reader.push(&scratch[..n]) {
                                return self.out_failed(p, &io::Error::other(why));
                            }
                            self.take_challenge(p);
                            return self.flush_out(p);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    // A TLS failure: a certificate that does not check,
                    // say. The peer is there but is not to be trusted.
                    Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                        return self.out_rejected(p, &e.to_string());
                    }
                    Err(e) => return self.out_failed(p, &e),
                }
            }
        }
        if event.is_writable() {
            self.flush_out(p);
        }
    }

    /// The peer's challenge, if a whole line of it has arrived: check its
    /// proof, answer with ours, and the link is up.
    fn take_challenge(&mut self, p: usize) {
        let out = &mut self.outs[p];
        let line = match out.reader.next_line() {
            None => return,
            Some(Ok(line)) => line.to_vec(),
            Some(Err(())) => {
                return self.out_rejected(p, "an over-long line instead of a challenge");
            }
        };
        let OutPhase::AwaitChallenge(dialer) = std::mem::replace(&mut out.phase, OutPhase::Idle)
        else {
            return;
        };
        match dialer.handle_challenge(&line) {
            Ok((auth, sealer)) => {
                out.writer.push_raw(&auth);
                out.writer.set_sealer(sealer);
                out.phase = OutPhase::Up;
                self.core.handle_link_up(self.clock.now(), p);
                self.carry_out();
            }
            Err(e) => self.out_rejected(p, &e.to_string()),
        }
    }

    fn out_rejected(&mut self, p: usize, why: &str) {
        self.close_out(p);
        self.core
            .handle_link_down(self.clock.now(), p, OutDown::Rejected, why);
        self.carry_out();
    }

    fn close_out(&mut self, p: usize) {
        let out = &mut self.outs[p];
        if let Some(mut stream) = out.stream.take() {
            let _ = self.poll.registry().deregister(&mut stream);
        }
        out.phase = OutPhase::Idle;
        out.writer.clear();
        out.reader = PeerReader::default();
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
        if matches!(out.phase, OutPhase::Connecting(_) | OutPhase::Idle) {
            return;
        }
        out.writer.seal();
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
        if let Err(e) = stream.push_tls() {
            self.out_failed(p, &e);
        }
    }

    // ----- incoming links -----

    fn adopt_incoming(&mut self, mut stream: Stream, bytes: Vec<u8>) {
        let addr = stream.peer_addr().ok();
        let entry = self.ins.vacant_entry();
        let token = Token(IN_BASE + entry.key());
        if let Err(e) = self.poll.registry().register(
            &mut stream,
            token,
            Interest::READABLE | Interest::WRITABLE,
        ) {
            log::warn!(
                "replication: cannot register a peer link from {}: {e}",
                addr.map_or_else(|| "an unknown address".to_string(), |a| a.to_string())
            );
            return;
        }
        let link = entry.key();
        entry.insert(InLink {
            stream,
            addr,
            reader: PeerReader::with_bytes(bytes),
            phase: InPhase::AwaitHello,
            writer: PeerWriter::default(),
        });
        self.core.handle_in_opened(self.clock.now(), link);
        self.carry_out();
        self.parse_in(link);
        // Bytes may have arrived between the adoption and registration.
        self.read_in(link);
    }

    /// Read what the budget allows from incoming link `link`, unless the
    /// lock owner is too far behind (then it is read once it catches up).
    fn read_in(&mut self, link: LinkId) {
        let mut scratch = [0u8; 16 * 1024];
        let mut budget = READ_BUDGET;
        loop {
            if !self.ins.contains(link) {
                return;
            }
            // Held back while the owner is behind (rounds.rs decides): not
            // silence, else a busy owner would cost the links, and a
            // standby would find its active dead.
            if budget == 0 || !rounds::may_read_peer(self, link) {
                if budget > 0 {
                    self.warn_owner_behind();
                }
                if !self.unread.contains(&link) {
                    self.unread.push(link);
                }
                return;
            }
            let Some(state) = self.ins.get_mut(link) else {
                return;
            };
            let want = budget.min(scratch.len());
            match state.stream.read(&mut scratch[..want]) {
                Ok(0) => return self.close_in(link, "closed"),
                Ok(n) => {
                    budget -= n;
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

    /// Peer links wait for the lock owner: say so, at most once per
    /// WARN_EVERY_MS.
    fn warn_owner_behind(&mut self) {
        let now = self.clock.now_ms();
        if self.behind_warn.allow(now, WARN_EVERY_MS).is_some() {
            log::warn!(
                "replication: the lock owner has {} entries from peers still to apply; peer \
                 links are read only as fast as it applies them",
                self.owner_backlog.queued()
            );
        }
    }

    /// Every whole line read so far: the handshake, then sealed messages.
    fn parse_in(&mut self, link: LinkId) {
        loop {
            let Some(state) = self.ins.get_mut(link) else {
                return;
            };
            let line = match state.reader.next_line() {
                None => return,
                Some(Ok(line)) => line,
                Some(Err(())) => return self.reject_in(link, "an over-long line"),
            };
            match &mut state.phase {
                InPhase::Done => return,
                InPhase::Open(opener) => match opener.take_line(line) {
                    Ok(None) => {}
                    Ok(Some(batch)) => self.handle_batch(link, &batch),
                    Err(e) => return self.reject_in(link, e.as_str()),
                },
                InPhase::AwaitHello => {
                    let line = line.to_vec();
                    self.take_hello(link, &line);
                }
                InPhase::AwaitAuth(_) => {
                    let line = line.to_vec();
                    self.take_auth(link, &line);
                }
            }
        }
    }

    fn take_hello(&mut self, link: LinkId, line: &[u8]) {
        let Some(nonce) = self.nonce() else {
            return self.reject_in(link, "no random nonce");
        };
        let nodes = self.peers.len();
        let hello = Acceptor::handle_hello(
            self.key.clone(),
            self.me,
            nodes,
            self.fingerprint,
            line,
            nonce,
        );
        match hello {
            Ok((acceptor, challenge)) => {
                let Some(state) = self.ins.get_mut(link) else {
                    return;
                };
                state.writer.push_raw(&challenge);
                state.phase = InPhase::AwaitAuth(acceptor);
                self.flush_in(link);
            }
            Err(e) => {
                if let Some(line) = crate::server::trust::peer_auth::refusal_line(&e)
                    && let Some(state) = self.ins.get_mut(link)
                {
                    state.writer.push_raw(line);
                    self.flush_in(link);
                }
                self.reject_in(link, &e.to_string())
            }
        }
    }

    fn take_auth(&mut self, link: LinkId, line: &[u8]) {
        let Some(state) = self.ins.get_mut(link) else {
            return;
        };
        let InPhase::AwaitAuth(acceptor) = std::mem::replace(&mut state.phase, InPhase::Done)
        else {
            return;
        };
        let from = acceptor.from();
        // Under TLS the peer's certificate must name its --peers entry too.
        if let Some(tls) = &self.settings.tls
            && let Some(peer) = self.peers.get(from)
            && let Err(why) = tls.check_peer(&state.stream, peer)
        {
            return self.reject_in(link, &why);
        }
        match acceptor.handle_auth(line) {
            Ok(opener) => {
                state.phase = InPhase::Open(opener);
                self.core
                    .handle_in_authenticated(self.clock.now(), link, from);
                self.carry_out();
            }
            Err(e) => self.reject_in(link, &e.to_string()),
        }
    }

    /// The lines of a batch whose seal checked: each to the core. They
    /// arrived together: one clock reading serves them all.
    fn handle_batch(&mut self, link: LinkId, batch: &[u8]) {
        let now = self.clock.now();
        let mut rest = batch;
        while !rest.is_empty() {
            let PeerParsed::Line { used, msg } = parse_peer(rest) else {
                // A sealed batch holds whole lines only.
                self.core.handle_in_malformed(now, link);
                return self.carry_out();
            };
            rest = &rest[used..];
            match msg {
                Some(msg) => self.core.handle_peer_msg(now, link, msg),
                None => self.core.handle_in_malformed(now, link),
            }
            self.carry_out();
            if !self.ins.contains(link) {
                return;
            }
        }
    }

    fn reject_in(&mut self, link: LinkId, why: &str) {
        let Some(state) = self.ins.get_mut(link) else {
            return;
        };
        state.phase = InPhase::Done;
        let addr = state.addr;
        let from = addr.as_ref().map(|a| a as &dyn std::fmt::Display);
        self.core
            .handle_in_rejected(self.clock.now(), link, from, why);
        self.carry_out();
    }

    /// Write the challenge of an incoming link's handshake.
    fn flush_in(&mut self, link: LinkId) {
        let Some(state) = self.ins.get_mut(link) else {
            return;
        };
        while !state.writer.pending().is_empty() {
            match state.stream.write(state.writer.pending()) {
                Ok(0) => break,
                Ok(n) => state.writer.consume(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.close_in(link, &e.to_string()),
            }
        }
        if let Err(e) = state.stream.push_tls() {
            self.close_in(link, &e.to_string());
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

/// The replication thread as rounds.rs sees it: its clock, its channels
/// and the sockets the core's effects go to.
impl ReplShell for Replication {
    fn now(&self) -> Now {
        self.clock.now()
    }

    fn core(&mut self) -> &mut ClusterCore {
        &mut self.core
    }

    fn gauges(&self) -> &Gauges {
        &self.gauges
    }

    /// A peer link an I/O loop hands over is adopted here, as it is taken
    /// (a socket: none of the round's business).
    fn next_inbox(&mut self) -> Result<Option<ReplInput>, Gone> {
        loop {
            return match self.inbox.try_recv() {
                Ok(ToRepl::Table(msg)) => Ok(Some(ReplInput::Table(msg))),
                Ok(ToRepl::AdoptPeerLink(stream, bytes)) => {
                    self.adopt_incoming(stream, bytes);
                    continue;
                }
                Ok(ToRepl::Shutdown) => Ok(Some(ReplInput::Shutdown)),
                Ok(ToRepl::Stop) => Ok(Some(ReplInput::Stop)),
                Err(TryRecvError::Empty) => Ok(None),
                Err(TryRecvError::Disconnected) => Err(Gone),
            };
        }
    }

    fn stop(&mut self) {
        self.done = true;
    }

    fn stopped(&self) -> bool {
        self.done
    }

    fn most_unsent(&self) -> usize {
        let pending = self.outs.iter().map(|out| out.writer.pending().len());
        pending.max().unwrap_or(0)
    }

    fn dial(&mut self, peer: usize) {
        Replication::dial(self, peer);
    }

    fn send(&mut self, peer: usize, msg: PeerMsg) -> usize {
        let Some(out) = self.outs.get_mut(peer) else {
            return 0;
        };
        out.writer.push(&msg);
        out.writer.pending().len()
    }

    fn too_far_behind(&mut self, peer: usize) {
        log::warn!(
            "replication: {} is too far behind; dropping its link",
            self.peers[peer]
        );
    }

    fn drop_out(&mut self, peer: usize) {
        self.close_out(peer);
    }

    fn drop_in(&mut self, link: LinkId) {
        if self.ins.contains(link) {
            let mut link = self.ins.remove(link);
            let _ = self.poll.registry().deregister(&mut link.stream);
        }
    }

    fn to_owner(&mut self, msg: ClusterToTable) {
        self.owner_backlog.push(msg);
    }

    fn owner_queue(&self) -> &OwnerQueue {
        &self.owner_backlog
    }

    fn send_to_owner(&mut self) {
        Replication::send_to_owner(self);
    }

    fn flush_peers(&mut self) {
        self.flush_outs();
    }

    fn exit(&mut self) {
        let _ = self.exit.try_send(());
        self.done = true;
    }
}

fn resolve(peer: &str) -> Option<SocketAddr> {
    peer.to_socket_addrs().ok()?.next()
}
