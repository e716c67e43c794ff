//! Hostile peers: someone who can reach a cluster node's client port, but
//! does not know the cluster key, replays every peer-link attack that worked
//! before peer links were authenticated, against real `batond` processes on
//! loopback ports, and nothing changes.
//!
//! Before peer authentication anyone could say `P HELLO <index> <nodes>` and
//! be trusted as a peer: forged heartbeats with tokens near 2^64 wrapped the
//! token counter, a forged snapshot replaced a standby's table, forged
//! heartbeats made the active flap or a standby promote itself, repeated
//! hellos cut the real link, half-open `P ` connections never timed out and
//! escaped `--max-conns`, an endless `P S` grew memory without bound, and a
//! node whose `--peers` named a standalone batond redialed in a tight loop
//! that logged tens of thousands of lines a second.
//!
//! Then insiders: a process that holds the cluster key proves itself as a
//! peer and floods its link; the node's heartbeats, memory and answers stay
//! as they were.
//!
//! The last tests are trusted peers that cannot hold each other's state: a
//! standby with a lower `--max-keys` or `--max-lease` than the active's
//! state needs. It refuses a replicated grant or a snapshot and drops the
//! link; the active does not count it in `standbys=` nor hand it the role,
//! and the two relink with a growing backoff, quietly, not in a tight loop
//! that logged thousands of lines a second.
//!
//! Then semaphore state from a proved peer: a limit outside 1..=10000, a
//! slot at or above it, a value of bad bytes or too long, token 0, a lease
//! above `--max-lease` (each line refused, the link dropped, nothing else
//! moved), and snapshots from a proved "active" with more holders than a
//! key's limit, two grants in one slot, two limits for one key, or more
//! holders than `--max-keys` (refused; the standby goes back to its real
//! active and, promoted, serves that active's keys and none of these).
//!
//! Most tests start a 2-node cluster with the shared test key (node 0 active,
//! node 1 its synced standby), acquire a few keys, attack, and check that
//! nothing moved: roles, the keys and their tokens, the next token (not
//! poisoned: only the clock's advance above the last one), the ceiling,
//! `standbys=1`, the standby's lag, and the node's memory.
//!
//! Every wait is a poll with a deadline; the few sleeps are short, fixed
//! observation windows that show something does NOT happen, and say so.
//! Processes are killed by PID when their handles drop.

mod common;

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use baton::server::core::cluster_core::HANDSHAKE_MS;
use baton::server::trust::peer_auth::{
    ClusterKey, Dialer, LinkIds, NONCE_LEN, Sealer, peers_fingerprint,
};
use common::info::{field, num, probe, serving};
use common::nodes::{Nodes, deref_to_nodes, start_node};
use common::{DEADLINE, LineClient, Node, Query, Received, free_port, wait_for};
use ring::rand::{SecureRandom, SystemRandom};

/// `--detect` of every cluster here: a short one, for quick failovers.
const DETECT: &str = "0.5";
/// Lease of the keys held across an attack: longer than any test.
const LEASE: &str = "60";
/// Tokens follow the wall clock at 2^20 per millisecond: a token more than
/// 120 s of clock above the last one was pushed up by someone.
const MAX_TOKEN_JUMP: u64 = (1 << 20) * 120_000;
/// How much a node's memory may grow during an attack.
const RSS_SLACK_KIB: u64 = 64 * 1024;
/// A live standby hears its active every detect/4; far above that is a cut.
const MAX_LAG_MS: u64 = 2_000;
/// Slack on top of HANDSHAKE_MS for a node to drop a silent handshake.
const HANDSHAKE_SLACK: Duration = Duration::from_secs(5);

// ----- a cluster of real processes -----

/// N `batond` processes on loopback ports with one `--peers` list, each with
/// its own flags (by default: the shared test cluster key). If the test
/// fails, every node's log is printed.
struct Cluster {
    nodes: Nodes,
    /// Flags of node i besides --bind, --port, --peers and --detect.
    args: Vec<Vec<String>>,
}

deref_to_nodes!(Cluster);

impl Cluster {
    fn new(n: usize) -> Cluster {
        let key = vec![
            "--cluster-key-file".to_string(),
            common::cluster_key_file().to_string(),
        ];
        Cluster {
            nodes: Nodes::on_free_ports(n),
            args: vec![key; n],
        }
    }

    /// Replace node `i`'s own flags (the key flags included).
    fn set_args(&mut self, i: usize, args: &[&str]) {
        self.args[i] = args.iter().map(|a| a.to_string()).collect();
    }

    /// Add to node `i`'s own flags.
    fn add_args(&mut self, i: usize, args: &[&str]) {
        self.args[i].extend(args.iter().map(|a| a.to_string()));
    }

    /// Start (or restart) node `i`; returns once it listens.
    fn start(&mut self, i: usize) {
        self.start_env(i, &[]);
    }

    /// Start (or restart) node `i` with `env` on top (`RUST_LOG`, say).
    fn start_env(&mut self, i: usize, env: &[(&str, &str)]) {
        let mut flags = vec!["--detect", DETECT];
        flags.extend(self.args[i].iter().map(String::as_str));
        self.nodes.start_with(i, &flags, env);
    }

    fn start_all(&mut self) {
        for i in 0..self.len() {
            self.start(i);
        }
    }

    /// Start both nodes of a 2-node cluster and wait until node 0 is active
    /// with node 1 as its synced standby.
    fn formed(mut self) -> Cluster {
        self.start_all();
        self.wait_formed();
        self
    }

    fn wait_formed(&self) {
        self.wait_serving(0);
        self.wait_standby_of(1, 0);
        self.wait_synced_standbys(0, 1);
    }
}

/// Open file descriptors of process `pid`. Linux only.
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| dir.count())
        .unwrap_or_else(|e| panic!("read /proc/{pid}/fd: {e}"))
}

/// Lines of `log` that contain `what`.
fn lines_with(log: &str, what: &str) -> usize {
    log.lines().filter(|line| line.contains(what)).count()
}

// ----- what the attacker can say -----

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `n` random bytes in hex.
fn random_hex(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    SystemRandom::new().fill(&mut bytes).expect("random bytes");
    hex(&bytes)
}

/// A hello in the current format, claiming to be node `from`, with the
/// right node count and `--peers` fingerprint (both public: anyone who knows
/// the node addresses can compute them) and a random nonce; so it gets as
/// far as the challenge.
fn hello(cluster: &Cluster, from: usize) -> String {
    let fp = hex(&peers_fingerprint(&cluster.names()));
    format!(
        "P HELLO {from} {} {fp} {}",
        cluster.len(),
        random_hex(NONCE_LEN)
    )
}

/// Read a `P CHAL <nonce> <proof>` line: (nonce, proof).
fn read_challenge(client: &mut LineClient) -> (String, String) {
    let line = client.recv();
    let fields: Vec<&str> = line.split(' ').collect();
    match fields.as_slice() {
        ["P", "CHAL", nonce, proof] if nonce.len() == 64 && proof.len() == 64 => {
            (nonce.to_string(), proof.to_string())
        }
        _ => panic!("expected `P CHAL <nonce> <proof>`, got {line:?}"),
    }
}

fn assert_closed(client: &mut LineClient, what: &str) {
    assert!(
        client.closed_within(DEADLINE),
        "the node did not close the connection after {what}"
    );
}

/// The connection is closed with no challenge: at most one `P NO <reason>`
/// line said back (a reason a misconfigured real peer can act on, which
/// tells an attacker nothing about the key).
fn assert_refused_without_challenge(client: &mut LineClient, what: &str) {
    match client.next_event(DEADLINE) {
        Received::Closed => {}
        Received::Line(line) if line.starts_with("P NO ") => {
            assert!(
                client.closed_within(DEADLINE),
                "after {what}: not closed after {line:?}"
            );
        }
        other => panic!("after {what}: expected a refusal and a close, got {other:?}"),
    }
}

// ----- what must not change -----

/// The state of a formed 2-node cluster before an attack.
struct Baseline {
    /// Keys held on node 0 and their tokens.
    keys: Vec<(String, u64)>,
    /// The largest token seen so far.
    last_token: u64,
    rss_kib: [u64; 2],
    /// How long each node's log was (to look at what came after).
    log_len: [usize; 2],
    probes: u32,
}

impl Baseline {
    /// Acquire a few keys on node 0, wait until the standby has them.
    fn take(cluster: &Cluster) -> Baseline {
        let mut client = cluster.client(0);
        let keys: Vec<(String, u64)> = (0..4)
            .map(|i| {
                let key = format!("held{i}");
                let token = client.acquire_now(&key, LEASE);
                (key, token)
            })
            .collect();
        cluster.wait_held(1, keys.len() as u64);
        let last_token = keys.iter().map(|&(_, t)| t).max().unwrap_or(0);
        let info = cluster.must_info(0);
        assert!(num(&info, "ceiling") >= last_token, "{info}");
        Baseline {
            keys,
            last_token,
            rss_kib: [cluster.node(0).rss_kib(), cluster.node(1).rss_kib()],
            log_len: [cluster.node(0).log().len(), cluster.node(1).log().len()],
            probes: 0,
        }
    }

    /// The roles, the standby's link and the ceilings, as they must be.
    fn assert_roles(&self, cluster: &Cluster, after: &str) {
        let active = cluster.must_info(0);
        assert!(
            serving(&active),
            "after {after}: node 0 no longer serves: {active}"
        );
        assert_eq!(
            field(&active, "active"),
            cluster.name(0),
            "after {after}: {active}"
        );
        assert_eq!(num(&active, "standbys"), 1, "after {after}: {active}");
        assert_eq!(
            num(&active, "held"),
            self.keys.len() as u64,
            "after {after}: {active}"
        );
        let ceiling = num(&active, "ceiling");
        assert!(
            ceiling < self.last_token.saturating_add(MAX_TOKEN_JUMP) && ceiling < u64::MAX / 2,
            "after {after}: node 0's ceiling jumped from near {} to {ceiling}",
            self.last_token
        );
        let standby = cluster.must_info(1);
        assert_eq!(
            field(&standby, "role"),
            "standby",
            "after {after}: {standby}"
        );
        assert_eq!(
            field(&standby, "active"),
            cluster.name(0),
            "after {after}: {standby}"
        );
        assert!(
            num(&standby, "lag_ms") < MAX_LAG_MS,
            "after {after}: {standby}"
        );
        assert_eq!(
            num(&standby, "held"),
            self.keys.len() as u64,
            "after {after}: {standby}"
        );
        let ceiling = num(&standby, "ceiling");
        assert!(
            ceiling < self.last_token.saturating_add(MAX_TOKEN_JUMP) && ceiling < u64::MAX / 2,
            "after {after}: node 1's ceiling jumped from near {} to {ceiling}",
            self.last_token
        );
    }

    /// Nothing an attack could move has moved: roles, the standby's link,
    /// the held keys and their tokens, the next token, the ceilings, memory.
    fn assert_unchanged(&mut self, cluster: &Cluster, after: &str) {
        self.assert_roles(cluster, after);
        let mut client = cluster.client(0);
        for (key, token) in &self.keys {
            let q = client.query(key);
            assert_eq!(q.token, *token, "after {after}: {key} changed: {q:?}");
            assert!(
                q.ms_left > 0,
                "after {after}: {key} is no longer held: {q:?}"
            );
        }
        // A client acquire is served here (no `M` redirect), with a token
        // only the clock's advance above the last one.
        self.probes += 1;
        let key = format!("probe{}", self.probes);
        let answer = client.ask(&format!("A {key} {LEASE} 0"));
        assert!(
            answer.starts_with("A "),
            "after {after}: node 0 did not grant {key}: {answer:?}"
        );
        let token = common::token_of(&answer);
        assert!(
            token > self.last_token,
            "after {after}: token {token} is not above {}",
            self.last_token
        );
        assert!(
            token < self.last_token.saturating_add(MAX_TOKEN_JUMP) && token < u64::MAX / 2,
            "after {after}: the next token {token} is far above {}: poisoned",
            self.last_token
        );
        self.last_token = token;
        assert_eq!(client.ask(&format!("R {key} {token}")), format!("R {key}"));
        for i in 0..2 {
            let rss = cluster.node(i).rss_kib();
            assert!(
                rss < self.rss_kib[i] + RSS_SLACK_KIB,
                "after {after}: node {i}'s RSS grew from {} KiB to {rss} KiB",
                self.rss_kib[i]
            );
        }
    }

    /// What node `i` logged since the baseline.
    fn log_since(&self, cluster: &Cluster, i: usize) -> String {
        cluster.node(i).log()[self.log_len[i]..].to_string()
    }

    /// Neither node's real link dropped since the baseline.
    fn assert_links_never_dropped(&self, cluster: &Cluster, after: &str) {
        for i in 0..2 {
            let log = self.log_since(cluster, i);
            for line in log.lines() {
                assert!(
                    !(line.contains("link from") || line.contains("link to"))
                        || !line.contains("dropped"),
                    "after {after}: node {i} lost a real peer link: {line}"
                );
            }
        }
    }
}

// ----- 1. the old attacks: a forged link in the old format -----

#[test]
fn a_forged_hello_with_a_huge_heartbeat_or_a_planted_snapshot_changes_nothing() {
    let mut cluster = Cluster::new(2).formed();
    let mut base = Baseline::take(&cluster);

    // A heartbeat as an active with tokens near 2^64, to node 0.
    let mut forged = cluster.client(0);
    forged.send_raw(b"P HELLO 1 2\nP B active - 1 1 18446744073709551567 18446744073709551567\n");
    assert_closed(&mut forged, "an old-style forged hello and heartbeat");
    // A snapshot from "node 0" with a key of its own, to the standby.
    let mut forged = cluster.client(1);
    forged.send_raw(b"P HELLO 0 2\nP S\nP G planted 16 86400000\nP E\n");
    assert_closed(&mut forged, "an old-style forged snapshot");
    // The same, with a hello in the current format but no proof.
    let mut forged = cluster.client(1);
    forged.send_raw(
        format!(
            "{}\nP S\nP G planted 16 86400000\nP E\nP B active - 1 1 \
             18446744073709551567 18446744073709551567\n",
            hello(&cluster, 0)
        )
        .as_bytes(),
    );
    assert_closed(&mut forged, "a current hello followed by a forged snapshot");

    base.assert_unchanged(&cluster, "forged links");
    assert_eq!(cluster.client(0).query("planted"), Query::FREE);
    base.assert_links_never_dropped(&cluster, "forged links");

    // The standby's table is the real one: it takes over with the real keys
    // and their tokens, and without `planted`.
    cluster.kill(0);
    let info = cluster.wait_serving(1);
    assert_eq!(field(&info, "active"), cluster.name(1), "{info}");
    let mut client = cluster.client(1);
    for (key, token) in &base.keys {
        let q = client.query(key);
        assert_eq!(q.token, *token, "{key} on the new active: {q:?}");
        assert!(q.ms_left > 0, "{key} is still held: {q:?}");
    }
    assert_eq!(client.query("planted"), Query::FREE);
    let token = client.acquire_now("after-failover", LEASE);
    assert!(
        token > base.last_token && token < base.last_token.saturating_add(MAX_TOKEN_JUMP),
        "new active's token {token} vs last {}",
        base.last_token
    );
}

// ----- 2. the handshake without the key -----

#[test]
fn a_handshake_with_a_wrong_proof_is_closed_and_every_hello_gets_a_fresh_challenge() {
    let cluster = Cluster::new(2).formed();
    let mut base = Baseline::take(&cluster);

    // Garbage for a proof.
    let mut attacker = cluster.client(0);
    attacker.send(&hello(&cluster, 1));
    let _ = read_challenge(&mut attacker);
    attacker.send(&format!("P AUTH {}", random_hex(32)));
    assert_closed(&mut attacker, "a garbage proof");

    // The node's own proof reflected back (the labels differ).
    let mut attacker = cluster.client(1);
    attacker.send(&hello(&cluster, 0));
    let (_, proof) = read_challenge(&mut attacker);
    attacker.send(&format!("P AUTH {proof}"));
    assert_closed(&mut attacker, "the node's own proof reflected");

    // Forged messages instead of a proof.
    let mut attacker = cluster.client(0);
    attacker.send(&hello(&cluster, 1));
    let _ = read_challenge(&mut attacker);
    attacker.send("P B active - 1 1 18446744073709551567 18446744073709551567");
    assert_closed(&mut attacker, "a heartbeat instead of a proof");

    // Hellos that cannot be a peer's are refused before any challenge: the
    // node's own index, an index past the list, another list.
    let fp = hex(&peers_fingerprint(&cluster.names()));
    let nonce = random_hex(NONCE_LEN);
    for line in [
        format!("P HELLO 0 2 {fp} {nonce}"),
        format!("P HELLO 7 2 {fp} {nonce}"),
        format!("P HELLO 1 3 {fp} {nonce}"),
        format!("P HELLO 1 2 0000000000000000 {nonce}"),
    ] {
        let mut attacker = cluster.client(0);
        attacker.send(&line);
        assert_refused_without_challenge(&mut attacker, &line);
    }

    // A recorded hello replayed gets a new challenge every time, so a
    // recorded proof never fits: the same hello twice, two nonces.
    let line = hello(&cluster, 1);
    let mut first = cluster.client(0);
    first.send(&line);
    let (nonce1, proof1) = read_challenge(&mut first);
    let mut second = cluster.client(0);
    second.send(&line);
    let (nonce2, proof2) = read_challenge(&mut second);
    assert_ne!(
        nonce1, nonce2,
        "the same hello got the same challenge nonce"
    );
    assert_ne!(proof1, proof2);
    // A proof of one challenge does not answer another.
    second.send(&format!("P AUTH {proof1}"));
    assert_closed(&mut second, "another link's proof");
    drop(first);

    base.assert_unchanged(&cluster, "handshakes without the key");
    base.assert_links_never_dropped(&cluster, "handshakes without the key");
}

// ----- 3. half-open peer connections -----

/// A connection of the flood: what it sent, when, and when the node closed it.
struct HalfOpen {
    stream: TcpStream,
    sent: Instant,
    closed: Option<Instant>,
}

impl HalfOpen {
    fn open(addr: SocketAddr, bytes: &[u8]) -> HalfOpen {
        let mut stream = TcpStream::connect_timeout(&addr, DEADLINE).expect("connect");
        stream.write_all(bytes).expect("send");
        let sent = Instant::now();
        stream.set_nonblocking(true).expect("nonblocking");
        HalfOpen {
            stream,
            sent,
            closed: None,
        }
    }

    /// Read what there is; note when the node closed the connection.
    fn poll(&mut self) {
        if self.closed.is_some() {
            return;
        }
        let mut chunk = [0u8; 1024];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.closed = Some(Instant::now());
    }
}

#[test]
fn a_flood_of_half_open_peer_connections_is_closed_and_the_cluster_stays_intact() {
    common::raise_fd_limit();
    let cluster = Cluster::new(2).formed();
    let mut base = Baseline::take(&cluster);
    let pid = cluster.node(0).pid();
    let fds_before = fd_count(pid);
    let mut client = cluster.client(0);
    let fds_before = fds_before.max(fd_count(pid));

    // Three kinds, then silence: only `P `; a hello that gets a challenge
    // and is never answered; a hello with a wrong fingerprint (refused at
    // once).
    let addr = cluster.addr(0);
    let mut flood: Vec<HalfOpen> = Vec::new();
    for round in 0..2 {
        for i in 0..100 {
            let bytes = match i % 3 {
                0 => "P ".to_string(),
                1 => format!("{}\n", hello(&cluster, 1)),
                _ => format!("P HELLO 1 2 0000000000000000 {}\n", random_hex(32)),
            };
            flood.push(HalfOpen::open(addr, bytes.as_bytes()));
        }
        // During the flood the cluster serves and stays linked.
        let key = format!("during-flood{round}");
        let token = client.acquire_now(&key, LEASE);
        assert!(token > base.last_token && token < base.last_token + MAX_TOKEN_JUMP);
        base.last_token = token;
        assert_eq!(client.ask(&format!("R {key} {token}")), format!("R {key}"));
        let info = cluster.must_info(0);
        assert!(serving(&info), "during the flood: {info}");
        assert_eq!(num(&info, "standbys"), 1, "during the flood: {info}");
    }

    // Each is closed within the handshake time (plus slack).
    let bound = Duration::from_millis(HANDSHAKE_MS) + HANDSHAKE_SLACK;
    let last_sent = flood.iter().map(|h| h.sent).max().expect("a flood");
    while flood.iter().any(|h| h.closed.is_none()) && last_sent.elapsed() < bound {
        for h in &mut flood {
            h.poll();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let open = flood.iter().filter(|h| h.closed.is_none()).count();
    assert_eq!(
        open,
        0,
        "{open} of {} silent peer connections still open after {bound:?}",
        flood.len()
    );
    let slowest = flood
        .iter()
        .filter_map(|h| h.closed.map(|c| c - h.sent))
        .max()
        .unwrap_or_default();
    println!("flood: slowest close {slowest:?}");
    assert!(
        slowest <= bound,
        "a silent peer connection lived {slowest:?}"
    );
    drop(flood);

    // Its file descriptors are back to where they were.
    wait_for("node 0's fds to come back", DEADLINE, || {
        (fd_count(pid) <= fds_before + 2).then_some(())
    });
    drop(client);
    base.assert_unchanged(&cluster, "a flood of half-open peer connections");
    base.assert_links_never_dropped(&cluster, "a flood of half-open peer connections");
}

// ----- 4. endless peer input without a handshake -----

/// Connect to `addr`, send `first`, then `filler` over and over, up to
/// `max` bytes or until the node stops taking them; the bytes sent. The
/// connection must be closed by then.
fn stream_until_closed(addr: SocketAddr, first: &[u8], filler: &[u8], max: usize) -> usize {
    let mut client = LineClient::connect(addr);
    client
        .stream
        .set_write_timeout(Some(Duration::from_secs(2)))
        .expect("write timeout");
    let mut sent = 0;
    let mut chunk = Vec::with_capacity(64 * 1024 + filler.len());
    while chunk.len() < 64 * 1024 {
        chunk.extend_from_slice(filler);
    }
    if client.stream.write_all(first).is_ok() {
        sent += first.len();
        while sent < max {
            match client.stream.write(&chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => sent += n,
            }
        }
    }
    assert!(
        client.closed_within(DEADLINE),
        "the node kept a connection open that sent {first:?} and then {sent} bytes"
    );
    sent
}

#[test]
fn an_endless_peer_stream_without_a_handshake_is_closed_with_bounded_memory() {
    let cluster = Cluster::new(2).formed();
    let mut base = Baseline::take(&cluster);
    // RSS now, not the peak so far: the bound below is on the peak.
    let peak_before = [cluster.node(0).rss_kib(), cluster.node(1).rss_kib()];
    let max = 32 << 20;
    let hello0 = format!("{}\n", hello(&cluster, 1));
    let hello1 = format!("{}\n", hello(&cluster, 0));
    let cases: [(usize, &[u8], &[u8]); 5] = [
        // A snapshot that never ends, with no hello at all.
        (0, b"P S\n", b"P G k 1 1\n"),
        (1, b"P S\n", b"P G k 1 1\n"),
        // A hello that gets its challenge, then the snapshot.
        (1, hello1.as_bytes(), b"P G k 1 1\n"),
        // A hello, then one line that never ends.
        (0, hello0.as_bytes(), b"xxxxxxxxxxxxxxxx"),
        // `P ` and then no end of line.
        (0, b"P ", b"yyyyyyyyyyyyyyyy"),
    ];
    for (i, first, filler) in cases {
        let sent = stream_until_closed(cluster.addr(i), first, filler, max);
        println!("endless stream to node {i}: {sent} bytes taken before the close");
    }
    for (i, before) in peak_before.iter().enumerate() {
        let peak = cluster.node(i).peak_rss_kib();
        assert!(
            peak < before + RSS_SLACK_KIB,
            "node {i}'s peak RSS grew from {before} KiB to {peak} KiB"
        );
    }
    base.assert_unchanged(&cluster, "endless peer streams");
    base.assert_links_never_dropped(&cluster, "endless peer streams");
}

// ----- 5. repeated hellos -----

#[test]
fn repeated_forged_hellos_do_not_cut_the_real_link() {
    let cluster = Cluster::new(2).formed();
    let mut base = Baseline::take(&cluster);
    let mut pending = Vec::new();
    for i in 0..50 {
        match i % 4 {
            0 => {
                let mut c = cluster.client(0);
                c.send("P HELLO 1 2");
                pending.push(c);
            }
            1 => {
                let mut c = cluster.client(0);
                c.send(&hello(&cluster, 1));
                let _ = read_challenge(&mut c);
                c.send(&format!("P AUTH {}", random_hex(32)));
                pending.push(c);
            }
            2 => {
                // Left in its handshake: it must not replace the real link.
                let mut c = cluster.client(0);
                c.send(&hello(&cluster, 1));
                pending.push(c);
            }
            _ => {
                let mut c = cluster.client(1);
                c.send(&hello(&cluster, 0));
                pending.push(c);
            }
        }
        let active = cluster.must_info(0);
        assert!(serving(&active), "after hello {i}: {active}");
        assert_eq!(num(&active, "standbys"), 1, "after hello {i}: {active}");
        let standby = cluster.must_info(1);
        assert_eq!(
            field(&standby, "role"),
            "standby",
            "after hello {i}: {standby}"
        );
        assert_eq!(
            field(&standby, "active"),
            cluster.name(0),
            "after hello {i}: {standby}"
        );
        assert!(
            num(&standby, "lag_ms") < MAX_LAG_MS,
            "after hello {i}: {standby}"
        );
    }
    drop(pending);
    base.assert_unchanged(&cluster, "50 forged hellos");
    base.assert_links_never_dropped(&cluster, "50 forged hellos");
    // The refusals are logged, rate-limited (one warning per 30 s).
    for i in 0..2 {
        let log = cluster.node(i).log();
        let warned = lines_with(&log, "refused a peer link");
        assert!(warned <= 2, "node {i} warned {warned} times:\n{log}");
    }
}

// ----- 6. --max-conns does not lock peers out -----

#[test]
fn a_restarted_standby_gets_back_in_when_the_active_is_full_of_clients() {
    let mut cluster = Cluster::new(2);
    cluster.add_args(0, &["--max-conns", "4"]);
    let mut cluster = cluster.formed();
    // Fill node 0's client slots; the first connection also asks the
    // questions below.
    // (A slot is freed a moment after its connection closes: the probes of
    // `formed` may still hold some, so each connection retries until it
    // gets one.)
    let mut clients: Vec<LineClient> = (0..4)
        .map(|i| {
            wait_for(&format!("client slot {i} on node 0"), DEADLINE, || {
                let mut c = cluster.client(0);
                c.send("I");
                let answer = c.try_recv(DEADLINE)?;
                answer.starts_with("I ").then_some(c)
            })
        })
        .collect();
    let mut extra = cluster.client(0);
    let answer = extra.recv();
    assert!(answer.starts_with("E "), "a fifth client got {answer:?}");

    cluster.kill(1);
    wait_for("node 0 to lose its standby", DEADLINE, || {
        let info = clients[0].info();
        (num(&info, "standbys") == 0).then_some(())
    });
    cluster.start(1);
    let info = wait_for(
        "node 1 to be node 0's synced standby again",
        DEADLINE,
        || {
            let info = clients[0].info();
            (num(&info, "standbys") == 1).then_some(info)
        },
    );
    assert!(serving(&info), "{info}");
    cluster.wait_standby_of(1, 0);
}

// ----- 7. --peers naming a standalone node -----

#[test]
fn a_node_whose_peers_name_a_standalone_node_backs_off_quietly_and_serves() {
    let standalone = Node::start(&[]);
    let a = standalone.addr.to_string();
    let port = free_port();
    let b = format!("127.0.0.1:{port}");
    let peers = format!("{b},{a}");
    let started = Instant::now();
    let node = start_node(
        port,
        &peers,
        &[
            "--cluster-key-file",
            common::cluster_key_file(),
            "--detect",
            DETECT,
        ],
        &[],
    );
    let info = wait_for("node B to serve", DEADLINE, || {
        probe(node.addr, "I").filter(|info| serving(info))
    });
    assert_eq!(field(&info, "active"), b, "{info}");
    let token = node.client().acquire_now("job", LEASE);
    assert!(token > 0);
    // Observation window: three seconds of B redialing A.
    if let Some(left) = Duration::from_secs(3).checked_sub(started.elapsed()) {
        std::thread::sleep(left);
    }
    let log = node.log();
    let about_a = lines_with(&log, &a);
    println!("B logged {about_a} lines about A in 3 s");
    assert!(about_a < 50, "B logged {about_a} lines about A:\n{log}");
    assert!(log.lines().count() < 100, "B's log:\n{log}");
    let info = probe(node.addr, "I").expect("B answers I");
    assert!(serving(&info), "{info}");
    // A is unharmed.
    assert!(standalone.client().acquire_now("job", LEASE) > 0);
    assert!(
        standalone.log().lines().count() < 50,
        "{}",
        standalone.log()
    );
}

// ----- 8. a node with another key -----

#[test]
fn nodes_with_different_keys_never_link_and_warn_about_the_key_rate_limited() {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("baton-hostile-other-{}.key", std::process::id()));
    std::fs::write(&path, "another-cluster-key-not-the-shared-one-98765\n").expect("write key");
    let other = path.to_string_lossy().into_owned();
    let mut cluster = Cluster::new(2);
    cluster.set_args(1, &["--cluster-key-file", &other]);
    cluster.start_all();
    cluster.wait_serving(0);
    // Node 1 cannot authenticate node 0: it stays active on its own.
    cluster.wait_serving(1);
    // Observation window: for two seconds neither links to the other.
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let a = cluster.must_info(0);
        assert!(serving(&a), "{a}");
        assert_eq!(num(&a, "standbys"), 0, "{a}");
        let b = cluster.must_info(1);
        assert!(serving(&b), "node 1 followed a node with another key: {b}");
        std::thread::sleep(Duration::from_millis(100));
    }
    for i in 0..2 {
        let log = wait_for(&format!("node {i} to warn about the key"), DEADLINE, || {
            let log = cluster.node(i).log();
            log.lines()
                .any(|l| l.contains("WARN") && l.contains("cluster key"))
                .then_some(log)
        });
        let lines = log.lines().count();
        assert!(lines < 40, "node {i} logged {lines} lines:\n{log}");
        let warned = lines_with(&log, "cluster key");
        assert!(warned <= 4, "node {i} warned {warned} times:\n{log}");
    }
    let _ = std::fs::remove_file(&path);
}

// ----- 9. --insecure-peers -----

#[test]
fn an_insecure_cluster_forms_fails_over_and_warns_at_start() {
    let mut cluster = Cluster::new(2);
    cluster.set_args(0, &["--insecure-peers"]);
    cluster.set_args(1, &["--insecure-peers"]);
    let mut cluster = cluster.formed();
    for i in 0..2 {
        wait_for(
            &format!("node {i} to warn about --insecure-peers"),
            DEADLINE,
            || {
                let log = cluster.node(i).log();
                log.lines()
                    .any(|l| l.contains("WARN") && l.contains("--insecure-peers"))
                    .then_some(())
            },
        );
    }
    let token = cluster.client(0).acquire_now("job", LEASE);
    cluster.wait_held(1, 1);
    cluster.kill(0);
    let info = cluster.wait_serving(1);
    assert_eq!(field(&info, "active"), cluster.name(1), "{info}");
    assert_eq!(cluster.client(1).query("job").token, token);
}

// 10. A cluster node started with neither a key nor --insecure-peers exits
// 2 with one line naming --cluster-key-file: tests/server_process.rs
// (a_cluster_node_without_a_cluster_key_refuses_to_start_with_exit_2).

// ----- an insider's flood -----

/// An insider: dial node `to` as node `from` with the shared test key and
/// prove it. The link, authenticated, and its sealer.
/// A thread that writes sealed batches (each filled by `fill`) to `stream`
/// until `stop` is set or a write fails; it returns the bytes sent.
fn spawn_flooder(
    mut stream: TcpStream,
    mut sealer: Sealer,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    mut fill: impl FnMut(&mut Sealer, &mut Vec<u8>) + Send + 'static,
) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut sent = 0usize;
        let mut batch = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            batch.clear();
            fill(&mut sealer, &mut batch);
            sealer.seal(&mut batch);
            if stream.write_all(&batch).is_err() {
                break;
            }
            sent += batch.len();
        }
        sent
    })
}

fn prove_as(cluster: &Cluster, from: usize, to: usize) -> (TcpStream, Sealer) {
    let secret = std::fs::read(common::cluster_key_file()).expect("read the key");
    let key = ClusterKey::from_file_contents(&secret).expect("a valid key");
    let ids = LinkIds {
        from,
        to,
        nodes: cluster.len(),
        fp: peers_fingerprint(&cluster.names()),
    };
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new().fill(&mut nonce).expect("random");
    let dialer = Dialer::new(key, ids, nonce);
    let mut stream = TcpStream::connect(cluster.addr(to)).expect("connect");
    stream.write_all(&dialer.hello_line()).expect("hello");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut challenge = String::new();
    reader.read_line(&mut challenge).expect("challenge");
    let (auth, sealer) = dialer
        .handle_challenge(challenge.as_bytes())
        .expect("the node proves the key");
    stream.write_all(&auth).expect("auth");
    (stream, sealer)
}

#[test]
fn a_proved_peer_flooding_its_link_does_not_starve_the_heartbeats() {
    // An insider: a process that holds the cluster key poses as node 2 (in
    // --peers, never started), proves the key, and floods node 1 with valid,
    // sealed, harmless lines (ceilings far below the real one) as fast as it
    // can write. Node 1 reads each link only so much per round, so its
    // heartbeats, its link from the active and its lag are unaffected.
    let mut cluster = Cluster::new(3);
    cluster.start(0);
    cluster.start(1);
    cluster.wait_formed();
    let mut base = Baseline::take(&cluster);
    let (stream, sealer) = prove_as(&cluster, 2, 1);
    // A write that blocks this long ends the flood (the join stays bounded).
    stream
        .set_write_timeout(Some(Duration::from_secs(2)))
        .expect("write timeout");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooder = spawn_flooder(stream, sealer, stop.clone(), |sealer, batch| {
        for _ in 0..2000 {
            sealer.push_line(b"P C 16\n", batch);
        }
    });
    // A fixed window of flooding, checked all along.
    let window = Instant::now();
    while window.elapsed() < Duration::from_secs(3) {
        base.assert_roles(&cluster, "a flood of sealed lines, during it");
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = flooder.join().expect("the flooder");
    assert!(sent > 1 << 20, "the flood was a flood: {sent} bytes");
    base.assert_unchanged(&cluster, "a flood of sealed lines");
}

#[test]
fn an_insider_posing_as_the_active_and_flooding_deltas_leaves_the_standby_bounded_and_answering() {
    // Nodes 1 and 2 of three run (node 1 active, node 2 its standby); node
    // 0's port is held by this test, which never answers there, so node 0
    // is silent, not refused. An insider that holds the cluster key proves
    // itself as node 0 to node 2 and says it is active: node 2 ranks it
    // above node 1 and follows it. Then it streams valid grants (in range,
    // 1000 keys over and over) as fast as it can write. Whatever the lock
    // owner of node 2 cannot apply at once waits in the kernel, not in node
    // 2: its memory stays bounded, it answers I at once throughout, and
    // node 1 keeps serving. When the insider stops, node 2 goes back to
    // node 1.
    let mut cluster = Cluster::new(3);
    let _node0_port = std::net::TcpListener::bind(cluster.addr(0)).expect("hold node 0's port");
    cluster.start(1);
    cluster.start(2);
    cluster.wait_serving(1);
    cluster.wait_standby_of(2, 1);
    cluster.wait_synced_standbys(1, 1);
    let before = cluster.node(2).rss_kib();

    let (mut stream, mut sealer) = prove_as(&cluster, 0, 2);
    let beat = b"P B active - 0 1 0 0\n";
    let mut batch = Vec::new();
    sealer.push_line(beat, &mut batch);
    sealer.seal(&mut batch);
    stream.write_all(&batch).expect("the first heartbeat");
    cluster.wait_standby_of(2, 0);
    // A write that blocks this long ends the flood (the join stays bounded).
    stream
        .set_write_timeout(Some(Duration::from_secs(5)))
        .expect("write timeout");
    let unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let first_token = unix_ms << 20;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut n = 0u64;
    let flooder = spawn_flooder(stream, sealer, stop.clone(), move |sealer, batch| {
        // A heartbeat per batch keeps "node 0" live.
        sealer.push_line(beat, batch);
        for _ in 0..2000 {
            n += 1;
            let line = format!("P G key{} {} 60000\n", n % 1000, first_token + 16 * n);
            sealer.push_line(line.as_bytes(), batch);
        }
    });
    // A fixed window of flooding, checked all along.
    let window = Instant::now();
    let mut client = cluster.client(1);
    let mut probes = 0;
    while window.elapsed() < Duration::from_secs(4) {
        let standby = cluster.must_info(2);
        assert_eq!(
            field(&standby, "active"),
            cluster.name(0),
            "node 2 follows the insider: {standby}"
        );
        probes += 1;
        let key = format!("probe{probes}");
        let token = client.acquire_now(&key, LEASE);
        assert_eq!(client.ask(&format!("R {key} {token}")), format!("R {key}"));
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = flooder.join().expect("the flooder");
    println!("the insider sent {} MiB of sealed grants", sent >> 20);
    assert!(sent > 8 << 20, "the flood was a flood: {sent} bytes");
    let peak = cluster.node(2).peak_rss_kib();
    println!("node 2: RSS {before} KiB before, peak {peak} KiB");
    assert!(
        peak < before + RSS_SLACK_KIB,
        "node 2's peak RSS grew from {before} KiB to {peak} KiB"
    );
    // The grants were applied, not ignored: node 2 holds the insider's keys.
    cluster.wait_held(2, 1000);
    let held_back = lines_with(&cluster.node(2).log(), "read only as fast as it applies");
    println!("node 2 held peer input back (warnings): {held_back}");
    // The insider goes silent: node 2 finds "node 0" dead and goes back
    // to node 1, which counts it as its synced standby again.
    drop(client);
    cluster.wait_standby_of(2, 1);
    cluster.wait_synced_standbys(1, 1);
}

// ----- 11. a standby whose limits cannot hold the active's state -----

/// Node 0 (`--max-keys 10`) serves and holds `LEASE`-long grants of k0..k7.
fn grant_eight(cluster: &Cluster) {
    let mut client = cluster.client(0);
    for i in 0..8 {
        assert!(client.acquire_now(&format!("k{i}"), LEASE) > 0);
    }
}

#[test]
fn a_standby_that_refuses_a_replicated_grant_drops_the_link_and_is_neither_counted_nor_handed_the_role()
 {
    // Node 1 can hold 5 keys, node 0 10. Node 1 takes node 0's (empty)
    // snapshot and is its synced standby; then node 0 grants 8 keys. Node 1
    // refuses the grants past its --max-keys: it must drop the link and
    // stop saying it holds node 0's state, so node 0 counts no standby and
    // does not hand it the role on a graceful stop (a failover there would
    // lose the grants it refused).
    let mut cluster = Cluster::new(2);
    cluster.add_args(0, &["--max-keys", "10"]);
    cluster.add_args(1, &["--max-keys", "5"]);
    let mut cluster = cluster.formed();
    grant_eight(&cluster);
    let info = cluster.wait_info(0, "to count no standby holding its 8 keys", |info| {
        serving(info) && num(info, "held") == 8 && num(info, "standbys") == 0
    });
    println!("node 0: {info}");
    let log = wait_for("node 1 to log the refusal", DEADLINE, || {
        let log = cluster.node(1).log();
        log.contains("--max-keys").then_some(log)
    });
    assert!(
        log.contains("refused a delta from the active: a grant past --max-keys"),
        "{log}"
    );
    // It does not hold node 0's state: its lag grows (it is current as of
    // no heartbeat of node 0), and node 0 goes on counting it out.
    let standby = cluster.wait_info(1, "to lag behind node 0", |info| {
        num(info, "lag_ms") > MAX_LAG_MS
    });
    assert_eq!(field(&standby, "active"), cluster.name(0), "{standby}");
    let info = cluster.must_info(0);
    assert_eq!(num(&info, "standbys"), 0, "{info}");
    // A graceful stop of node 0 hands the role to no one.
    assert_eq!(cluster.terminate(0), Some(0));
    let (_, log) = cluster.old_logs().last().expect("node 0's log");
    assert!(!log.contains("transferring the active role"), "{log}");
    assert!(log.contains("no successor"), "{log}");
}

/// Node 0 holds 8 keys; node 1 joins with `limits`, under which it refuses
/// them (its log says `refusal`). Over a 3 s window of the two relinking,
/// node 0 sends few snapshots and brings the link up few times, and
/// neither node floods its log. Both log at debug: while links back off,
/// their "is up" and "sending a snapshot" lines go to debug, and these are
/// what a tight loop would multiply (thousands a second), so they are
/// counted at every level; the info-and-above lines are bounded apart.
fn a_standby_that_cannot_hold_the_state_is_redialed_with_backoff(limits: &[&str], refusal: &str) {
    let debug = [("RUST_LOG", "debug")];
    let mut cluster = Cluster::new(2);
    cluster.add_args(0, &["--max-keys", "10"]);
    cluster.add_args(1, limits);
    cluster.start_env(0, &debug);
    cluster.wait_serving(0);
    grant_eight(&cluster);
    cluster.start_env(1, &debug);
    cluster.wait_standby_of(1, 0);
    wait_for("node 1 to refuse node 0's state", DEADLINE, || {
        cluster.node(1).log().contains(refusal).then_some(())
    });
    let count = |i: usize| {
        let log = cluster.node(i).log();
        (
            lines_with(&log, "sending a snapshot"),
            lines_with(&log, "is up"),
            log.lines().filter(|l| !l.contains(" DEBUG ")).count(),
        )
    };
    let before = [count(0), count(1)];
    // Observation window: three seconds of node 0 redialing node 1.
    std::thread::sleep(Duration::from_secs(3));
    let after = [count(0), count(1)];
    for i in 0..2 {
        let (snapshots, ups, lines) = (
            after[i].0 - before[i].0,
            after[i].1 - before[i].1,
            after[i].2 - before[i].2,
        );
        println!(
            "node {i} in 3 s: {snapshots} snapshot lines, {ups} link-up lines, {lines} lines above \
             debug"
        );
        let log = cluster.node(i).log();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        // The backoff waits up to --detect/2 (250 ms) between rounds: about
        // a dozen rounds in 3 s, each one snapshot and two link-up lines
        // (the link to the peer and the link from it) per node.
        assert!(
            snapshots <= 30,
            "node {i}: {snapshots} snapshots: {tail:#?}"
        );
        assert!(ups <= 60, "node {i}: {ups} link-ups: {tail:#?}");
        assert!(lines <= 30, "node {i}: {lines} lines: {tail:#?}");
    }
    let info = cluster.must_info(0);
    assert!(serving(&info), "{info}");
    assert_eq!(num(&info, "standbys"), 0, "{info}");
    assert_eq!(num(&info, "held"), 8, "{info}");
    let standby = cluster.must_info(1);
    assert_eq!(field(&standby, "active"), cluster.name(0), "{standby}");
}

#[test]
fn a_standby_with_a_lower_max_keys_is_redialed_with_backoff_not_in_a_tight_loop() {
    a_standby_that_cannot_hold_the_state_is_redialed_with_backoff(
        &["--max-keys", "5"],
        "a grant past --max-keys",
    );
}

#[test]
fn a_standby_with_a_lower_max_lease_is_redialed_with_backoff_not_in_a_tight_loop() {
    a_standby_that_cannot_hold_the_state_is_redialed_with_backoff(
        &["--max-lease", "30"],
        "a lease above --max-lease",
    );
}

// ----- 12. semaphore state from a proved peer, checked -----

/// `stream` (a proved link) is closed by the node within DEADLINE.
fn assert_link_closed(stream: &mut TcpStream, what: &str) {
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .expect("read timeout");
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    while start.elapsed() < DEADLINE {
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
    panic!("the node did not drop the link after {what}");
}

/// Send `lines`, sealed, on a proved link.
fn send_sealed(stream: &mut TcpStream, sealer: &mut Sealer, lines: &[Vec<u8>]) {
    let mut batch = Vec::new();
    for line in lines {
        sealer.push_line(line, &mut batch);
    }
    sealer.seal(&mut batch);
    stream.write_all(&batch).expect("send sealed lines");
}

/// A process that holds the cluster key proves itself as node 2 (in
/// --peers, never started) to node 1, the standby of a formed cluster
/// (every node `--max-lease 60`), and sends `line`: node 1 refuses it,
/// logs `why` and drops the link; nothing else moves.
fn a_proved_peers_semaphore_line_is_refused(line: &[u8], why: &str) {
    let mut cluster = Cluster::new(3);
    for i in 0..3 {
        cluster.add_args(i, &["--max-lease", "60"]);
    }
    cluster.start(0);
    cluster.start(1);
    cluster.wait_formed();
    let mut base = Baseline::take(&cluster);
    let (mut stream, mut sealer) = prove_as(&cluster, 2, 1);
    send_sealed(&mut stream, &mut sealer, &[line.to_vec()]);
    assert_link_closed(&mut stream, why);
    let expected = format!("link from {} dropped: {why}", cluster.name(2));
    wait_for(&format!("node 1 to log {expected:?}"), DEADLINE, || {
        base.log_since(&cluster, 1)
            .contains(&expected)
            .then_some(())
    });
    base.assert_unchanged(&cluster, why);
    assert_eq!(cluster.client(0).query("pool"), Query::FREE);
    // The real link between nodes 0 and 1 stayed up.
    let insider = cluster.name(2);
    for i in 0..2 {
        for line in base.log_since(&cluster, i).lines() {
            assert!(
                line.contains(&insider)
                    || !(line.contains("link from") || line.contains("link to"))
                    || !line.contains("dropped"),
                "after {why}: node {i} lost a real peer link: {line}"
            );
        }
    }
}

#[test]
fn a_proved_peers_grant_with_limit_0_is_refused() {
    a_proved_peers_semaphore_line_is_refused(
        b"P G pool 16 1000 0 0\n",
        "a limit outside 1..=10000",
    );
}

#[test]
fn a_proved_peers_grant_with_a_limit_above_10000_is_refused() {
    a_proved_peers_semaphore_line_is_refused(
        b"P G pool 16 1000 10001 0\n",
        "a limit outside 1..=10000",
    );
}

#[test]
fn a_proved_peers_grant_in_a_slot_at_its_limit_is_refused() {
    a_proved_peers_semaphore_line_is_refused(
        b"P G pool 16 1000 3 3\n",
        "a slot at or above its key's limit",
    );
}

#[test]
fn a_proved_peers_free_of_a_slot_above_any_limit_is_refused() {
    a_proved_peers_semaphore_line_is_refused(
        b"P F pool 16 10000\n",
        "a slot at or above its key's limit",
    );
}

#[test]
fn a_proved_peers_grant_with_a_value_of_bad_bytes_is_refused() {
    a_proved_peers_semaphore_line_is_refused(
        b"P G pool 16 1000 3 0 bad\x7fvalue\n",
        "a line not understood",
    );
}

#[test]
fn a_proved_peers_grant_with_a_value_too_long_is_refused() {
    let line = format!("P G pool 16 1000 3 0 {}\n", "v".repeat(251));
    a_proved_peers_semaphore_line_is_refused(line.as_bytes(), "a line not understood");
}

#[test]
fn a_proved_peers_semaphore_grant_with_token_0_is_refused() {
    a_proved_peers_semaphore_line_is_refused(b"P G pool 0 1000 3 1 host\n", "token 0");
}

#[test]
fn a_proved_peers_semaphore_grant_with_a_lease_above_max_lease_is_refused() {
    a_proved_peers_semaphore_line_is_refused(
        b"P G pool 16 60001 3 1 host\n",
        "a lease above --max-lease",
    );
}

/// Nodes 1 and 2 of three run (node 1 active, node 2 its standby, node 2
/// with `node2_args`); node 0's port is held by this test and silent. An
/// insider proves itself as node 0 to node 2, says it is active (node 2
/// ranks it above node 1 and follows it), and sends a snapshot of
/// `grants` (`P G` lines of sealed text): with `why`, node 2 refuses it,
/// logs `why`, drops the link and does not say it holds that state;
/// without, it applies the lines in order as the same deltas would be (a
/// snapshot streams, with the active's changes between its pieces). When the
/// insider goes silent, node 2 goes back to node 1, and when node 1 is
/// killed node 2 serves node 1's keys with their tokens, and none of the
/// insider's.
fn a_proved_actives_semaphore_snapshot(node2_args: &[&str], grants: &[String], why: Option<&str>) {
    let mut cluster = Cluster::new(3);
    cluster.add_args(2, node2_args);
    let _node0_port = std::net::TcpListener::bind(cluster.addr(0)).expect("hold node 0's port");
    cluster.start(1);
    cluster.start(2);
    cluster.wait_serving(1);
    cluster.wait_standby_of(2, 1);
    cluster.wait_synced_standbys(1, 1);
    let mut client = cluster.client(1);
    let keys: Vec<(String, u64)> = (0..3)
        .map(|i| {
            let key = format!("held{i}");
            let token = client.acquire_now(&key, LEASE);
            (key, token)
        })
        .collect();
    cluster.wait_held(2, keys.len() as u64);
    let log_len = cluster.node(2).log().len();

    let (mut stream, mut sealer) = prove_as(&cluster, 0, 2);
    send_sealed(
        &mut stream,
        &mut sealer,
        &[b"P B active - 0 1 0 0\n".to_vec()],
    );
    cluster.wait_standby_of(2, 0);
    let mut lines = vec![b"P S\n".to_vec()];
    lines.extend(grants.iter().map(|g| format!("{g}\n").into_bytes()));
    lines.push(b"P C 16\n".to_vec());
    lines.push(b"P E\n".to_vec());
    send_sealed(&mut stream, &mut sealer, &lines);
    match why {
        Some(why) => {
            assert_link_closed(&mut stream, why);
            wait_for(&format!("node 2 to log {why:?}"), DEADLINE, || {
                cluster.node(2).log()[log_len..].contains(why).then_some(())
            });
        }
        None => {
            // A snapshot streams: its lines are applied in order, as the
            // same deltas after one would be (a grant in a taken slot with
            // a newer token is a handover, a key with another limit the
            // active's again), and the table keeps one grant per slot and
            // no more than the key's limit. Node 2 holds the pool alone.
            cluster.wait_held(2, 1);
            let log = cluster.node(2).log();
            assert!(!log[log_len..].contains("refused"), "{log}");
        }
    }
    drop(stream);
    cluster.wait_standby_of(2, 1);
    let info = cluster.wait_synced_standbys(1, 1);
    assert_eq!(num(&info, "held"), keys.len() as u64, "{info}");
    cluster.kill(1);
    cluster.wait_serving(2);
    let mut client = cluster.client(2);
    for (key, token) in &keys {
        let q = client.query(key);
        assert_eq!(q.token, *token, "{key} on the new active: {q:?}");
    }
    assert_eq!(client.query("pool"), Query::FREE);
}

fn pool_grants(unix_token: u64, slots: &[(u32, u32)]) -> Vec<String> {
    slots
        .iter()
        .enumerate()
        .map(|(i, (limit, slot))| {
            format!(
                "P G pool {} 60000 {limit} {slot} host{i}",
                unix_token + 16 * (i as u64 + 1)
            )
        })
        .collect()
}

fn a_token_near_the_clock() -> u64 {
    let unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    unix_ms << 20
}

#[test]
fn a_proved_actives_snapshot_handing_a_slot_over_within_it_is_applied_as_deltas_are() {
    let grants = pool_grants(a_token_near_the_clock(), &[(2, 0), (2, 1), (2, 1)]);
    a_proved_actives_semaphore_snapshot(&[], &grants, None);
}

#[test]
fn a_proved_actives_snapshot_with_two_grants_in_one_slot_keeps_the_newer() {
    let grants = pool_grants(a_token_near_the_clock(), &[(3, 1), (3, 1)]);
    a_proved_actives_semaphore_snapshot(&[], &grants, None);
}

#[test]
fn a_proved_actives_snapshot_that_registers_a_key_again_with_another_limit_keeps_the_newer() {
    let grants = pool_grants(a_token_near_the_clock(), &[(3, 0), (2, 1)]);
    a_proved_actives_semaphore_snapshot(&[], &grants, None);
}

#[test]
fn a_proved_actives_snapshot_above_max_keys_counting_holders_is_refused() {
    // One key, seven holders: seven grants against node 2's --max-keys 6.
    let slots: Vec<(u32, u32)> = (0..7).map(|slot| (10, slot)).collect();
    let grants = pool_grants(a_token_near_the_clock(), &slots);
    a_proved_actives_semaphore_snapshot(
        &["--max-keys", "6"],
        &grants,
        Some("a grant past --max-keys"),
    );
}
