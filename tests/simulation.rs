//! Deterministic simulation of a baton cluster: the real role state machine
//! (`Roles`) and token counters (`TokenSource`) of 2 or 3 nodes, driven by a
//! simulated millisecond clock and a simulated network (per-link FIFO with
//! random delay, partitions, node crashes and restarts), from a seed.
//!
//! The glue between them mirrors `replication.rs`: heartbeats every
//! detect/4, a snapshot to each follower that is not synced, deltas (here:
//! the tokens granted) to synced followers, a handoff after the last delta,
//! a crashed node found dead at once when not partitioned (its port
//! refuses), observations of ceilings as the replication thread makes them.
//!
//! Checked after every run of every seed:
//! - no token is ever issued twice, and each node's tokens strictly grow;
//! - once faults stop and the network heals, the cluster converges within a
//!   bound to exactly one active node: the highest-priority live one;
//! - the first token issued after convergence is above every token issued
//!   before, by any node (split brain never leaves a smaller token behind).
//!
//! A failure prints its seed; `BATON_SIM_SEED=<seed>` replays exactly it
//! (add `BATON_SIM_TRACE=1` to see every role change and state transfer);
//! `BATON_SIM_SEEDS=<n>` runs seeds 1..=n (default 1000).

use std::collections::{BTreeMap, HashSet, VecDeque};

use baton::server::roles::{Beat, RoleEffect, RoleName, Roles};
use baton::server::tokens::TokenSource;

const DETECT_MS: u64 = 400;
const RESERVE: u64 = baton::server::tokens::LEAD_MS << 20;
/// A crashed node stays down at least this long (a real restart takes
/// longer than the tokens' lead over the clock, see tokens.rs).
const MIN_DOWN_MS: u64 = 4 * baton::server::tokens::LEAD_MS;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, per_million: u64) -> bool {
        self.below(1_000_000) < per_million
    }
}

#[derive(Clone, Debug)]
enum Msg {
    Beat {
        beat: Beat,
        last_token: u64,
        ceiling: u64,
    },
    Snapshot {
        last_token: u64,
        ceiling: u64,
    },
    Delta(u64),
    Handoff,
    Took,
}

struct Node {
    alive: bool,
    down_since: u64,
    roles: Roles,
    tokens: TokenSource,
    ceiling: u64,
    /// Followers that have this node's snapshot (while it is active).
    snap_sent: Vec<bool>,
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
}

impl Sim {
    fn new(seed: u64, n: usize) -> Sim {
        let mut sim = Sim {
            now: 0,
            rng: Rng(seed | 1),
            nodes: Vec::new(),
            links: BTreeMap::new(),
            cut: HashSet::new(),
            all_tokens: HashSet::new(),
            max_token: 0,
            next_beat: 0,
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
            tokens: TokenSource::new(me, baton::server::tokens::start_floor(1_000_000 + self.now)),
            ceiling: 0,
            snap_sent: vec![false; n],
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
            last_token: node.tokens.last_issued(),
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
                self.nodes[me].tokens.last_issued(),
                self.nodes[me].tokens.last()
            );
        }
        for effect in effects {
            match effect {
                RoleEffect::BecomeActive => {
                    let floor = (1_000_000 + self.now) << 20;
                    let node = &mut self.nodes[me];
                    node.tokens.observe(floor);
                    node.snap_sent.iter_mut().for_each(|s| *s = false);
                    node.ceiling = node.tokens.last() + RESERVE;
                }
                RoleEffect::Follow { .. } => {}
                RoleEffect::StartHandoff { to } => self.send(me, to, Msg::Handoff),
                RoleEffect::AbortHandoff => {}
                RoleEffect::FinishHandoff { .. } => {}
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
                node.tokens.observe(floor);
                node.roles.handle_beat(now, from, beat)
            }
            Msg::Snapshot {
                last_token,
                ceiling,
            } => {
                if node.roles.following() != Some(from) {
                    return;
                }
                node.tokens.observe(last_token.max(ceiling));
                node.roles.handle_synced(now, from)
            }
            Msg::Delta(token) => {
                if node.roles.following() == Some(from) {
                    node.tokens.observe(token);
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
            let follows = self.nodes[me]
                .roles
                .peer_beat(p)
                .is_some_and(|b| b.following == Some(me));
            if !follows {
                self.nodes[me].snap_sent[p] = false;
            } else if !self.nodes[me].snap_sent[p] {
                self.nodes[me].snap_sent[p] = true;
                let node = &self.nodes[me];
                let msg = Msg::Snapshot {
                    last_token: node.tokens.last(),
                    ceiling: node.ceiling,
                };
                self.send(me, p, msg);
            }
        }
    }

    fn grant(&mut self, me: usize) {
        let node = &mut self.nodes[me];
        if node.roles.role_name() != RoleName::Active {
            return;
        }
        // The lock owner lifts its counter to the clock floor every round.
        node.tokens.observe((1_000_000 + self.now) << 20);
        let token = node.tokens.issue();
        if let Some(&last) = node.issued.last() {
            assert!(token > last, "node {me}: tokens strictly grow");
        }
        node.issued.push(token);
        if node.tokens.last() + RESERVE / 2 > node.ceiling {
            node.ceiling = node.tokens.last() + RESERVE;
        }
        node.ceiling = node.ceiling.max(node.tokens.last());
        assert!(self.all_tokens.insert(token), "token {token} issued twice");
        self.max_token = self.max_token.max(token);
        let synced: Vec<usize> = (0..self.nodes.len())
            .filter(|&p| self.nodes[me].snap_sent[p])
            .collect();
        for p in synced {
            self.send(me, p, Msg::Delta(token));
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
            if self.rng.chance(200_000) {
                self.grant(me);
            }
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
        if sim.rng.chance(2_000) {
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
        sim.grant(0);
        if sim.nodes[0].issued.len() > count {
            break;
        }
        sim.step();
    }
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
