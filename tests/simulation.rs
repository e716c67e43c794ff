//! Deterministic simulation of a baton cluster: the real role state machine
//! (`Roles`) and lock table (`LockTable`, with its token counter and timing
//! wheel) of 2 or 3 nodes, driven by a simulated millisecond clock, simulated
//! clients (acquires with and without waits, releases, connections closing)
//! and a simulated network (per-link FIFO with random delay, partitions,
//! node crashes and restarts), from a seed.
//!
//! The glue between them mirrors `replication.rs` and `owner.rs`:
//! heartbeats every detect/4, a snapshot of the table to each follower that
//! is not synced, the table's deltas to synced followers, a replicated token
//! ceiling, a handoff after the last delta, waiters redirected when a node
//! stops serving, a crashed node found dead at once when not partitioned
//! (its port refuses), observations of ceilings as the replication thread
//! makes them.
//!
//! Checked after every step: every live node's table invariants
//! (`check_invariants`: one holder per key, queues, timers, tokens); every
//! grant's token was never issued before and is above the same node's
//! previous ones. Checked after every run of every seed:
//! - once faults stop and the network heals, the cluster converges within a
//!   bound to exactly one active node: the highest-priority live one;
//! - the first token issued after convergence is above every token issued
//!   before, by any node (split brain never leaves a smaller token behind).
//!
//! A failure prints its seed; `BATON_SIM_SEED=<seed>` replays exactly it
//! (add `BATON_SIM_TRACE=1` to see every role change and state transfer);
//! `BATON_SIM_SEEDS=<n>` runs seeds 1..=n (default 1000).

#[path = "common/rng.rs"]
mod rng;

use std::collections::{BTreeMap, HashSet, VecDeque};

use baton::protocol::{Answer, Key};
use baton::server::lock_table::{ConnId, Delta, LockTable, Outbox, TableLimits};
use baton::server::roles::{Beat, RoleEffect, RoleName, Roles};
use baton::server::tokens::TokenSource;
use rng::Rng;

const DETECT_MS: u64 = 400;
const RESERVE: u64 = baton::server::tokens::LEAD_MS << 20;
/// A crashed node stays down at least this long (a real restart takes
/// longer than the tokens' lead over the clock, see tokens.rs).
const MIN_DOWN_MS: u64 = 4 * baton::server::tokens::LEAD_MS;

#[derive(Clone, Debug)]
enum Msg {
    Beat {
        beat: Beat,
        last_token: u64,
        ceiling: u64,
    },
    Snapshot {
        entries: Vec<Delta>,
        ceiling: u64,
    },
    Delta(Delta),
    Handoff,
    Took,
}

struct Node {
    alive: bool,
    down_since: u64,
    roles: Roles,
    table: LockTable,
    ceiling: u64,
    /// Followers that have this node's snapshot (while it is active).
    snap_sent: Vec<bool>,
    /// When each follower's snapshot went out.
    snap_sent_ms: Vec<u64>,
    issued: Vec<u64>,
}

struct Sim {
    now: u64,
    rng: Rng,
    nodes: Vec<Node>,
    /// Per ordered pair (from, to): messages in flight with delivery times.
    links: BTreeMap<(usize, usize), VecDeque<(u64, Msg)>>,
    cut: HashSet<(usize, usize)>,
    all_tokens: HashSet<u64>,
    max_token: u64,
    next_beat: u64,
    /// Recent grants per node, for clients to release.
    held: BTreeMap<usize, Vec<(Key, u64)>>,
}

impl Sim {
    fn new(seed: u64, n: usize) -> Sim {
        let mut sim = Sim {
            now: 0,
            rng: Rng::new(seed),
            nodes: Vec::new(),
            links: BTreeMap::new(),
            cut: HashSet::new(),
            all_tokens: HashSet::new(),
            max_token: 0,
            next_beat: 0,
            held: BTreeMap::new(),
        };
        for me in 0..n {
            let node = sim.fresh_node(me, n);
            sim.nodes.push(node);
        }
        sim
    }

    fn fresh_node(&self, me: usize, n: usize) -> Node {
        Node {
            alive: true,
            down_since: 0,
            roles: Roles::new(me, n, DETECT_MS, DETECT_MS, self.now),
            // The clock floor: simulated unix ms × 2^20.
            table: LockTable::new(
                self.now,
                TableLimits::default(),
                TokenSource::new(me, baton::server::tokens::start_floor(1_000_000 + self.now)),
            ),
            ceiling: 0,
            snap_sent: vec![false; n],
            snap_sent_ms: vec![0; n],
            issued: Vec::new(),
        }
    }

    fn send(&mut self, from: usize, to: usize, msg: Msg) {
        if from == to || !self.nodes[from].alive {
            return;
        }
        let delay = 1 + self.rng.below(8);
        let queue = self.links.entry((from, to)).or_default();
        // FIFO per link: never deliver before the message ahead.
        let at = queue.back().map_or(0, |(t, _)| *t).max(self.now + delay);
        queue.push_back((at, msg));
    }

    fn broadcast_beat(&mut self, from: usize) {
        let node = &self.nodes[from];
        let msg = Msg::Beat {
            beat: node.roles.beat(),
            last_token: node.table.stats().last_issued,
            ceiling: node.ceiling,
        };
        for to in 0..self.nodes.len() {
            self.send(from, to, msg.clone());
        }
    }

    fn apply(&mut self, me: usize, effects: Vec<RoleEffect>) {
        let changed = !effects.is_empty();
        if changed && std::env::var("BATON_SIM_TRACE").is_ok() {
            eprintln!(
                "{:>6} node {me}: {effects:?} last_issued {} last {}",
                self.now,
                self.nodes[me].table.stats().last_issued,
                self.nodes[me].table.stats().last_token
            );
        }
        for effect in effects {
            match effect {
                RoleEffect::BecomeActive => {
                    let floor = (1_000_000 + self.now) << 20;
                    let node = &mut self.nodes[me];
                    node.table.observe_token(floor);
                    node.snap_sent.iter_mut().for_each(|s| *s = false);
                    node.ceiling = node.table.stats().last_token + RESERVE;
                }
                RoleEffect::Follow { .. } | RoleEffect::FinishTransfer { .. } => {
                    // Not serving any more: waiters are answered M.
                    let mut out = Outbox::default();
                    self.nodes[me].table.redirect_waiters(None, &mut out);
                    self.check_answers(me, out);
                }
                RoleEffect::StartTransfer { to } => self.send(me, to, Msg::Handoff),
                RoleEffect::AbortTransfer => {}
                RoleEffect::SendTook { to } => self.send(me, to, Msg::Took),
                RoleEffect::Exit => {}
            }
        }
        if changed {
            self.broadcast_beat(me);
        }
    }

    fn deliver(&mut self, from: usize, to: usize, msg: Msg) {
        if std::env::var("BATON_SIM_TRACE").is_ok()
            && !matches!(msg, Msg::Beat { .. } | Msg::Delta(_))
        {
            eprintln!(
                "{:>6} {from} -> {to}: {msg:?} (alive {}, cut {})",
                self.now,
                self.nodes[to].alive,
                self.cut.contains(&(from, to))
            );
        }
        if !self.nodes[to].alive || self.cut.contains(&(from, to)) {
            // The link is broken: the active sends a snapshot again on the
            // next one (as replication.rs does after a reconnect).
            self.nodes[from].snap_sent[to] = false;
            return;
        }
        let now = self.now;
        let node = &mut self.nodes[to];
        let effects = match msg {
            Msg::Beat {
                beat,
                last_token,
                ceiling,
            } => {
                let active = node.roles.role_name().is_active();
                let mut floor = last_token;
                if !active || beat.role.is_active() {
                    floor = floor.max(ceiling);
                }
                node.table.observe_token(floor);
                if beat.following != Some(to) {
                    // As replication.rs: a peer that follows another node
                    // needs a fresh snapshot when it follows this one again.
                    node.snap_sent[from] = false;
                }
                node.roles.handle_beat(now, from, beat)
            }
            Msg::Snapshot { entries, ceiling } => {
                if node.roles.following() != Some(from) {
                    return;
                }
                node.table.load_snapshot(now, entries);
                node.table.observe_token(ceiling);
                node.roles.handle_synced(now, from)
            }
            Msg::Delta(delta) => {
                if node.roles.following() == Some(from) {
                    node.table.apply_delta(now, delta);
                }
                return;
            }
            Msg::Handoff => node.roles.handle_handoff(now, from),
            Msg::Took => node.roles.handle_took(now, from),
        };
        self.apply(to, effects);
    }

    /// The active side of replication: snapshots to unsynced followers.
    fn replicate(&mut self, me: usize) {
        if !self.nodes[me].roles.role_name().is_active() {
            return;
        }
        for p in 0..self.nodes.len() {
            let beat = self.nodes[me].roles.peer_beat(p);
            let follows = beat.is_some_and(|b| b.following == Some(me));
            // As replication.rs: a follower that still lacks the state a
            // detection period after its snapshot went out did not get it
            // (it followed this node only after the snapshot came), so it
            // is sent again.
            let stale = beat.is_some_and(|b| !b.synced)
                && self.now.saturating_sub(self.nodes[me].snap_sent_ms[p]) > DETECT_MS;
            if !follows {
                self.nodes[me].snap_sent[p] = false;
            } else if !self.nodes[me].snap_sent[p] || stale {
                self.nodes[me].snap_sent[p] = true;
                self.nodes[me].snap_sent_ms[p] = self.now;
                let node = &self.nodes[me];
                let msg = Msg::Snapshot {
                    entries: node.table.snapshot(self.now),
                    ceiling: node.ceiling,
                };
                self.send(me, p, msg);
            }
        }
    }

    /// One client request on node `me` if it serves: an acquire (waiting or
    /// not), a release of a grant it made, or a connection closing.
    fn client_op(&mut self, me: usize) {
        if self.nodes[me].roles.role_name() != RoleName::Active {
            return;
        }
        let now = self.now;
        let r = self.rng.next_u64();
        let conn = ConnId(1 + (r >> 8) % 6);
        let key = Key::new(format!("k{}", r % 5).as_bytes()).expect("valid key");
        let mut out = Outbox {
            replicate: true,
            ..Outbox::default()
        };
        let node = &mut self.nodes[me];
        // The lock owner lifts its counter to the clock floor every round.
        node.table.observe_token((1_000_000 + now) << 20);
        match (r >> 16) % 8 {
            0..=3 => {
                let lease = 20 + (r >> 24) % 300;
                let wait = (r >> 40) % 200;
                node.table
                    .handle_acquire(now, conn, key, lease, wait, &mut out);
            }
            4..=6 => {
                if let Some((key, token)) = self
                    .held
                    .get(&me)
                    .and_then(|held| held.get((r >> 24) as usize % held.len().max(1)))
                {
                    let (key, token) = (key.clone(), *token);
                    node.table.handle_release(now, conn, key, token, &mut out);
                }
            }
            _ => node.table.handle_disconnect(conn),
        }
        self.finish_round(me, out);
    }

    /// What a round of node `me` produced: grants are checked, deltas go to
    /// its synced followers, the ceiling is kept ahead.
    fn finish_round(&mut self, me: usize, out: Outbox) {
        let deltas = out.deltas.clone();
        self.check_answers(me, out);
        let node = &mut self.nodes[me];
        let mut deltas = deltas;
        let last = node.table.stats().last_token;
        if last + RESERVE / 2 > node.ceiling {
            node.ceiling = last + RESERVE;
            deltas.push(Delta::Ceiling(node.ceiling));
        }
        let synced: Vec<usize> = (0..self.nodes.len())
            .filter(|&p| self.nodes[me].snap_sent[p])
            .collect();
        for p in synced {
            for delta in &deltas {
                self.send(me, p, Msg::Delta(delta.clone()));
            }
        }
    }

    /// An acquire of a key nobody holds, on node `me` if it serves.
    fn grant_fresh(&mut self, me: usize) {
        if self.nodes[me].roles.role_name() != RoleName::Active {
            return;
        }
        let now = self.now;
        let key = Key::new(format!("fresh-{now}").as_bytes()).expect("valid key");
        let mut out = Outbox {
            replicate: true,
            ..Outbox::default()
        };
        let node = &mut self.nodes[me];
        node.table.observe_token((1_000_000 + now) << 20);
        node.table
            .handle_acquire(now, ConnId(99), key, 100, 0, &mut out);
        self.finish_round(me, out);
    }

    /// Every grant's token is new, and above the node's previous ones.
    fn check_answers(&mut self, me: usize, out: Outbox) {
        for (_, answer) in out.answers {
            if let Answer::Granted { token, key } = answer {
                let node = &mut self.nodes[me];
                if let Some(&last) = node.issued.last() {
                    assert!(token > last, "node {me}: tokens strictly grow");
                }
                node.issued.push(token);
                assert!(self.all_tokens.insert(token), "token {token} issued twice");
                self.max_token = self.max_token.max(token);
                self.held.entry(me).or_default().push((key, token));
            }
        }
        if let Some(held) = self.held.get_mut(&me)
            && held.len() > 64
        {
            held.drain(..32);
        }
    }

    fn step(&mut self) {
        self.now += 1;
        let due: Vec<(usize, usize)> = self
            .links
            .iter()
            .filter(|(_, q)| q.front().is_some_and(|(t, _)| *t <= self.now))
            .map(|(k, _)| *k)
            .collect();
        for (from, to) in due {
            while let Some((t, _)) = self.links[&(from, to)].front() {
                if *t > self.now {
                    break;
                }
                let (_, msg) = self
                    .links
                    .get_mut(&(from, to))
                    .and_then(VecDeque::pop_front)
                    .expect("front exists");
                self.deliver(from, to, msg);
            }
        }
        for me in 0..self.nodes.len() {
            if !self.nodes[me].alive {
                continue;
            }
            let now = self.now;
            let effects = self.nodes[me].roles.poll(now);
            self.apply(me, effects);
            self.replicate(me);
            // Lease expiries and wait deadlines, on every node.
            let mut out = Outbox {
                replicate: self.nodes[me].roles.role_name().is_active(),
                ..Outbox::default()
            };
            self.nodes[me].table.poll_timers(now, &mut out);
            self.finish_round(me, out);
            if self.rng.chance(300_000, 1_000_000) {
                self.client_op(me);
            }
            self.nodes[me].table.check_invariants();
        }
        if self.now >= self.next_beat {
            for me in 0..self.nodes.len() {
                if self.nodes[me].alive {
                    self.broadcast_beat(me);
                }
            }
            self.next_beat = self.now + DETECT_MS / 4;
        }
    }

    fn crash(&mut self, victim: usize) {
        if std::env::var("BATON_SIM_TRACE").is_ok() {
            eprintln!("{:>6} node {victim}: crash", self.now);
        }
        self.nodes[victim].alive = false;
        self.nodes[victim].down_since = self.now;
        self.break_links(victim, None);
        // Peers that can reach its port find it refusing at once.
        for p in 0..self.nodes.len() {
            if p != victim && self.nodes[p].alive && !self.cut.contains(&(p, victim)) {
                let now = self.now;
                let effects = self.nodes[p].roles.handle_peer_dead(now, victim);
                self.apply(p, effects);
            }
        }
    }

    /// TCP links between `a` and `b` (or every peer) break: what was in
    /// flight is lost, and a snapshot must be sent again on the next link.
    fn break_links(&mut self, a: usize, b: Option<usize>) {
        for p in 0..self.nodes.len() {
            if p == a || b.is_some_and(|b| b != p) {
                continue;
            }
            self.nodes[p].snap_sent[a] = false;
            self.nodes[a].snap_sent[p] = false;
            for key in [(a, p), (p, a)] {
                if let Some(queue) = self.links.get_mut(&key) {
                    queue.clear();
                }
            }
        }
    }

    fn restart(&mut self, victim: usize) {
        if std::env::var("BATON_SIM_TRACE").is_ok() {
            eprintln!("{:>6} node {victim}: restart", self.now);
        }
        let n = self.nodes.len();
        self.nodes[victim] = self.fresh_node(victim, n);
    }

    fn random_fault(&mut self) {
        let n = self.nodes.len();
        let victim = self.rng.below(n as u64) as usize;
        match self.rng.below(4) {
            0 if self.nodes.iter().filter(|x| x.alive).count() > 1 && self.nodes[victim].alive => {
                self.crash(victim)
            }
            1 if !self.nodes[victim].alive
                && self.now >= self.nodes[victim].down_since + MIN_DOWN_MS =>
            {
                self.restart(victim)
            }
            2 => {
                // Cut both ways between two nodes (a partition, or a stopped process).
                let other = (victim + 1 + self.rng.below(n as u64 - 1) as usize) % n;
                self.cut.insert((victim, other));
                self.cut.insert((other, victim));
                self.break_links(victim, Some(other));
            }
            _ => self.cut.clear(),
        }
    }

    fn actives(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].alive && self.nodes[i].roles.role_name().is_active())
            .collect()
    }
}

fn run(seed: u64, n: usize) {
    let mut sim = Sim::new(seed, n);
    let fault_until = 4_000 + sim.rng.below(4_000);
    while sim.now < fault_until {
        if sim.rng.chance(2_000, 1_000_000) {
            sim.random_fault();
        }
        sim.step();
    }
    // Heal: no more faults, every crashed node restarted.
    sim.cut.clear();
    for _ in 0..MIN_DOWN_MS {
        sim.step();
    }
    for i in 0..n {
        if !sim.nodes[i].alive {
            sim.restart(i);
        }
    }
    let bound = sim.now + 10 * DETECT_MS;
    while sim.actives() != vec![0] || (0..n).any(|i| sim.nodes[i].roles.active() != Some(0)) {
        assert!(
            sim.now < bound,
            "seed {seed}, {n} nodes: no convergence to node 0 by {} ms: actives {:?}, roles {:?}",
            sim.now,
            sim.actives(),
            (0..n)
                .map(|i| sim.nodes[i].roles.role_name())
                .collect::<Vec<_>>()
        );
        sim.step();
    }
    // Tokens issued from one heartbeat round after convergence on (the
    // demoted node's last heartbeat has reached the active by then).
    let before = sim.max_token;
    for _ in 0..DETECT_MS / 2 {
        sim.step();
    }
    let count = sim.nodes[0].issued.len();
    for _ in 0..100 {
        sim.grant_fresh(0);
        if sim.nodes[0].issued.len() > count {
            break;
        }
        sim.step();
    }
    assert!(
        sim.all_tokens.len() >= 20,
        "seed {seed}: the clients got only {} grants: the run exercised too little",
        sim.all_tokens.len()
    );
    let first = sim.nodes[0].issued.get(count).copied();
    let first =
        first.unwrap_or_else(|| panic!("seed {seed}: the converged active granted nothing"));
    assert!(
        first > before,
        "seed {seed}: token {first} after convergence is not above {before}"
    );
}

#[test]
fn random_faults_never_repeat_a_token_and_the_cluster_converges_to_the_first_node() {
    if let Ok(seed) = std::env::var("BATON_SIM_SEED") {
        let seed: u64 = seed.parse().expect("BATON_SIM_SEED is a number");
        run(seed, 2);
        run(seed, 3);
        return;
    }
    let seeds: u64 = std::env::var("BATON_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    for seed in 1..=seeds {
        for n in [2, 3] {
            let result = std::panic::catch_unwind(|| run(seed, n));
            if result.is_err() {
                panic!("simulation failed: replay with BATON_SIM_SEED={seed} ({n} nodes)");
            }
        }
    }
}
