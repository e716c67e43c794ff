//! Client authentication (`--auth-file`, docs/security.md, "Client authentication"):
//! real `batond` processes on loopback ports, spoken to over TCP by raw
//! line clients, the Rust client library and the `baton` CLI.
//!
//! Every rule has a test: `U ok`; a wrong secret answered `bad-auth` and
//! closed no sooner than 100 ms later; any other first request answered
//! `auth-required` and closed; `auth-disabled` without the flag; several
//! secrets; SIGHUP reload (and a bad file on reload); no secret in a debug
//! log; floods of wrong secrets (past a thousand at once, a right secret
//! still gets in); what an unauthenticated client cannot do
//! (release, read `I`, pose as a peer); a cluster with authentication. Waits
//! are polls with a deadline.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use baton::client::{Client, Error};
use common::nodes::start_node;
use common::{
    DEADLINE, LineClient, Node, Received, baton_path, batond_path, free_port, info_field,
    run_to_exit, token_of, wait_for,
};

const ALPHA: &str = "alpha-secret-0123456789";
const BRAVO: &str = "bravo-secret-0123456789";
const CHARLIE: &str = "charlie-secret-0123456789";
const WRONG: &str = "wrong-guess-secret-0123456789";

/// A secrets file of its own for each test, replaced atomically (so a
/// reload never reads half a file), removed when dropped.
struct Secrets {
    path: PathBuf,
}

impl Secrets {
    fn new(test: &str, text: &str) -> Secrets {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        std::fs::create_dir_all(&dir).expect("target tmp dir");
        let secrets = Secrets {
            path: dir.join(format!("baton-auth-{test}-{}", std::process::id())),
        };
        secrets.write(text);
        secrets
    }

    fn write(&self, text: &str) {
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, text).expect("write the secrets");
        std::fs::rename(&tmp, &self.path).expect("put the secrets in place");
    }

    fn path(&self) -> &str {
        self.path.to_str().expect("a UTF-8 temp path")
    }
}

impl Drop for Secrets {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A node with `--auth-file`.
fn node_with(secrets: &Secrets, more: &[&str]) -> Node {
    let mut args = vec!["--auth-file", secrets.path()];
    args.extend_from_slice(more);
    Node::start(&args)
}

/// A line client that has sent `U <secret>` and got `U ok`.
fn authed(addr: SocketAddr, secret: &str) -> LineClient {
    let mut client = LineClient::connect(addr);
    assert_eq!(client.ask(&format!("U {secret}")), "U ok");
    client
}

/// The answer to a first line, and whether the connection then closed.
fn first_line_answer(addr: SocketAddr, line: &[u8]) -> (String, bool) {
    let mut client = LineClient::connect(addr);
    client.send_raw(line);
    let answer = client.recv();
    (answer, client.closed_within(DEADLINE))
}

// ----- the wire rules -----

#[test]
fn a_right_secret_gets_u_ok_and_the_connection_then_serves_requests() {
    let secrets = Secrets::new("right", &format!("# ours\n{ALPHA}\n"));
    let node = node_with(&secrets, &[]);
    let mut client = authed(node.addr, ALPHA);
    let token = client.acquire_now("job", "30");
    assert_eq!(client.ask(&format!("R job {token}")), "R job");
    assert!(client.info().contains("role=active"));
    // `U` pipelined with requests in one write: they are served after it.
    let mut pipelined = LineClient::connect(node.addr);
    pipelined.send_lines(&[&format!("U {ALPHA}"), "A piped 30 0", "Q piped"]);
    assert_eq!(pipelined.recv(), "U ok");
    let grant = pipelined.recv();
    assert_eq!(grant, format!("A {} piped", token_of(&grant)));
    assert!(pipelined.recv().starts_with("Q piped "));
}

#[test]
fn a_wrong_secret_gets_bad_auth_and_a_close_no_sooner_than_100_ms_later() {
    let secrets = Secrets::new("wrong", &format!("{ALPHA}\n"));
    let node = node_with(&secrets, &[]);
    for line in [
        format!("U {WRONG}\nA stolen 30 0\n"),
        // `U` with extra fields is a failed attempt too; the secret is not
        // echoed.
        format!("U {ALPHA} extra\n"),
        "U short\n".to_string(),
    ] {
        let mut client = LineClient::connect(node.addr);
        let sent = Instant::now();
        client.send_raw(line.as_bytes());
        assert_eq!(client.recv(), "E - - bad-auth", "after {line:?}");
        assert!(client.closed_within(DEADLINE), "closed after {line:?}");
        let took = sent.elapsed();
        assert!(
            took >= Duration::from_millis(100),
            "closed after {took:?}: {line:?}"
        );
    }
    // The request pipelined behind the wrong secret was never served.
    let mut good = authed(node.addr, ALPHA);
    assert!(good.query("stolen").token == 0);
}

#[test]
fn any_other_first_request_gets_auth_required_and_a_close() {
    let secrets = Secrets::new("required", &format!("{ALPHA}\n"));
    let node = node_with(&secrets, &[]);
    let mut holder = authed(node.addr, ALPHA);
    let token = holder.acquire_now("held", "60");
    let long = vec![b'x'; 2000];
    let firsts: Vec<Vec<u8>> = vec![
        b"A job 30 0\n".to_vec(),
        b"Q held\n".to_vec(),
        b"I\n".to_vec(),
        format!("R held {token}\n").into_bytes(),
        format!("K held {token} 600\n").into_bytes(),
        b"hello there\n".to_vec(),
        b"U\n".to_vec(),
        b"P HELLO 0 2\n".to_vec(),
        long,
    ];
    for first in firsts {
        let (answer, closed) = first_line_answer(node.addr, &first);
        let shown = String::from_utf8_lossy(&first[..first.len().min(20)]).into_owned();
        assert_eq!(answer, "E - - auth-required", "after {shown:?}");
        assert!(closed, "closed after {shown:?}");
    }
    // Blank lines before `U` are no request.
    let mut client = LineClient::connect(node.addr);
    client.send_raw(format!("\n\r\nU {ALPHA}\n").as_bytes());
    assert_eq!(client.recv(), "U ok");
    // Nothing the unauthenticated clients sent changed the lock.
    let q = holder.query("held");
    assert_eq!(q.token, token);
    assert!(q.ms_left > 60_000 - 10_000, "not kept to 600 s: {q:?}");
}

#[test]
fn without_an_auth_file_u_gets_auth_disabled_and_the_connection_stays_open() {
    let node = Node::start(&[]);
    let mut client = node.client();
    assert_eq!(client.ask(&format!("U {ALPHA}")), "E U - auth-disabled");
    assert_eq!(client.ask("U anything at all"), "E U - extra-fields");
    client.acquire_now("open", "30");
    assert!(client.info().contains("role=active"));
}

#[test]
fn a_second_u_is_checked_again_and_a_wrong_one_closes() {
    let secrets = Secrets::new("second", &format!("{ALPHA}\n{BRAVO}\n"));
    let node = node_with(&secrets, &[]);
    let mut client = authed(node.addr, ALPHA);
    assert_eq!(client.ask(&format!("U {BRAVO}")), "U ok");
    client.acquire_now("still-mine", "30");
    assert_eq!(
        client.ask(&format!("U {ALPHA} extra")),
        "E U - extra-fields",
        "on an open connection, a malformed U is refused like any request"
    );
    client.send(&format!("U {WRONG}"));
    assert_eq!(client.recv(), "E - - bad-auth");
    assert!(client.closed_within(DEADLINE));
}

// ----- secrets: several, reload, never shown -----

#[test]
fn with_two_secrets_both_work() {
    let secrets = Secrets::new("two", &format!("{ALPHA}\n\n# next\n{BRAVO}\n"));
    let node = node_with(&secrets, &[]);
    authed(node.addr, ALPHA).acquire_now("a", "30");
    authed(node.addr, BRAVO).acquire_now("b", "30");
    let (answer, closed) = first_line_answer(node.addr, format!("U {CHARLIE}\n").as_bytes());
    assert_eq!((answer.as_str(), closed), ("E - - bad-auth", true));
}

/// Whether `secret` opens a new connection to `addr` now.
fn accepted(addr: SocketAddr, secret: &str) -> bool {
    let mut client = LineClient::connect(addr);
    client.send(&format!("U {secret}"));
    match client.next_event(DEADLINE) {
        Received::Line(line) if line == "U ok" => true,
        Received::Line(line) if line == "E - - bad-auth" => false,
        other => panic!("unexpected answer to U: {other:?}"),
    }
}

#[test]
fn sighup_reloads_the_file_adding_a_new_secret_and_removing_an_old_one() {
    let secrets = Secrets::new("reload", &format!("{ALPHA}\n{BRAVO}\n"));
    let node = node_with(&secrets, &[]);
    let mut before = authed(node.addr, ALPHA);
    assert!(!accepted(node.addr, CHARLIE));
    secrets.write(&format!("{BRAVO}\n{CHARLIE}\n"));
    node.signal("HUP");
    wait_for("the new secret to work", DEADLINE, || {
        accepted(node.addr, CHARLIE).then_some(())
    });
    assert!(
        !accepted(node.addr, ALPHA),
        "the removed secret still works"
    );
    assert!(accepted(node.addr, BRAVO));
    // A connection authenticated before the reload stays open.
    before.acquire_now("before-reload", "30");
    assert!(node.log().contains("reload: --auth-file: 2 secrets in use"));
}

#[test]
fn a_bad_file_on_sighup_keeps_the_old_secrets_and_says_why() {
    let secrets = Secrets::new("bad-reload", &format!("{ALPHA}\n"));
    let node = node_with(&secrets, &[]);
    let leaked = "leaky short"; // not a valid secret: it has a space
    secrets.write(&format!("{BRAVO}\n{leaked}\n"));
    node.signal("HUP");
    wait_for("the reload to be refused", DEADLINE, || {
        node.log()
            .contains("keeping the secrets in use")
            .then_some(())
    });
    let log = node.log();
    assert!(
        log.contains("line 2: a secret must be 16 to 128 bytes"),
        "{log}"
    );
    assert!(!log.contains(leaked) && !log.contains(BRAVO), "{log}");
    assert!(accepted(node.addr, ALPHA));
    assert!(!accepted(node.addr, BRAVO), "half a bad file was taken");
    // The node is still up and still reloads a good file.
    secrets.write(&format!("{BRAVO}\n"));
    node.signal("HUP");
    wait_for("the good file", DEADLINE, || {
        accepted(node.addr, BRAVO).then_some(())
    });
}

#[test]
fn a_bad_auth_file_at_start_exits_2_naming_the_flag_and_the_rule_but_not_the_secret() {
    let secrets = Secrets::new("bad-start", &format!("# ok\n{ALPHA}\nshort-one\n"));
    let done = run_to_exit(
        batond_path(),
        &[
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
            "--auth-file",
            secrets.path(),
        ],
        DEADLINE,
    );
    assert_eq!(done.code, Some(2), "{}", done.stderr);
    let line = done.stderr.trim();
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(
        line.contains("--auth-file") && line.contains("line 3"),
        "{line}"
    );
    assert!(
        line.contains("16 to 128 bytes of printable ASCII"),
        "{line}"
    );
    assert!(
        !line.contains("short-one") && !line.contains(ALPHA),
        "{line}"
    );
    for text in ["", "# only a comment\n"] {
        secrets.write(text);
        let done = run_to_exit(
            batond_path(),
            &[
                "--bind",
                "127.0.0.1",
                "--port",
                "0",
                "--auth-file",
                secrets.path(),
            ],
            DEADLINE,
        );
        assert_eq!(done.code, Some(2), "{}", done.stderr);
        assert!(done.stderr.contains("holds no secret"), "{}", done.stderr);
    }
}

#[test]
fn no_secret_ever_appears_in_a_debug_log() {
    let secrets = Secrets::new("log", &format!("{ALPHA}\n{BRAVO}\n"));
    let node = Node::start_debug(&["--auth-file", secrets.path()]);
    let mut good = authed(node.addr, ALPHA);
    assert_eq!(good.ask(&format!("U {BRAVO}")), "U ok");
    assert_eq!(
        good.ask(&format!("U {ALPHA} {BRAVO}")),
        "E U - extra-fields"
    );
    good.acquire_now("logged", "30");
    for line in [
        format!("U {WRONG}\n"),
        format!("U {WRONG} {CHARLIE}\n"),
        format!("A {WRONG} 30 0\n"),
    ] {
        let mut client = LineClient::connect(node.addr);
        client.send_raw(line.as_bytes());
        client.recv();
        assert!(client.closed_within(DEADLINE));
    }
    // A reload with a bad file, then a good one.
    let next = Secrets::new("log-next", "");
    std::fs::copy(&secrets.path, &next.path).expect("copy");
    secrets.write(&format!("{CHARLIE}\nnot valid {WRONG}\n"));
    node.signal("HUP");
    wait_for("the refused reload", DEADLINE, || {
        node.log()
            .contains("keeping the secrets in use")
            .then_some(())
    });
    secrets.write(&format!("{CHARLIE}\n"));
    node.signal("HUP");
    wait_for("the reload", DEADLINE, || {
        accepted(node.addr, CHARLIE).then_some(())
    });
    let text = node.log();
    assert!(text.contains("DEBUG"), "not a debug log: {text}");
    assert!(text.contains("wrong secret"), "{text}");
    for secret in [ALPHA, BRAVO, CHARLIE, WRONG] {
        assert!(!text.contains(secret), "{secret} is in the log:\n{text}");
    }
    // In words, like every other connection line: no debug values.
    for line in text.lines().filter(|l| l.contains("wrong secret")) {
        assert!(
            line.contains("conn ") && !line.contains("ConnId("),
            "{line}"
        );
    }
}

// ----- attacks -----

#[test]
fn a_flood_of_wrong_secrets_holds_up_no_one_and_leaves_nothing_behind() {
    let secrets = Secrets::new("flood", &format!("{ALPHA}\n"));
    let node = node_with(&secrets, &["--threads", "1"]);
    let mut good = authed(node.addr, ALPHA);
    const FLOOD: usize = 300;
    let mut flood: Vec<LineClient> = (0..FLOOD)
        .map(|i| {
            let mut client = LineClient::connect(node.addr);
            client.send(&format!("U {WRONG}-{i}"));
            client
        })
        .collect();
    // While they wait out their delay, the authenticated client is served
    // (in the same I/O loop).
    for i in 0..20 {
        let key = format!("busy-{i}");
        let token = good.acquire_now(&key, "30");
        assert_eq!(good.ask(&format!("R {key} {token}")), format!("R {key}"));
    }
    for client in &mut flood {
        match client.next_event(DEADLINE) {
            Received::Line(line) => assert_eq!(line, "E - - bad-auth"),
            other => panic!("no answer to a wrong secret: {other:?}"),
        }
        assert!(client.closed_within(DEADLINE));
    }
    // Every flooding connection is gone from the node.
    wait_for("the flood's connections to be freed", DEADLINE, || {
        let info = good.info();
        (info_field(&info, "conns").as_deref() == Some("1")).then_some(())
    });
}

#[test]
fn past_a_thousand_wrong_secrets_at_once_a_right_secret_still_gets_in() {
    // More wrong secrets than there once was room for (1024 per I/O loop,
    // past which every U, right or not, got too-many-connections): all
    // sent at once, on connections opened beforehand, into one I/O loop.
    const FLOOD: usize = 1200;
    common::raise_fd_limit();
    let secrets = Secrets::new("lockout", &format!("{ALPHA}\n"));
    let node = node_with(&secrets, &["--threads", "1", "--max-conns", "5000"]);
    let mut flood: Vec<LineClient> = (0..FLOOD).map(|_| LineClient::connect(node.addr)).collect();
    for (i, client) in flood.iter_mut().enumerate() {
        client.send(&format!("U {WRONG}-{i}"));
    }
    // While they wait out their delay, a right secret on a fresh connection
    // is let in and served.
    let mut good = authed(node.addr, ALPHA);
    let token = good.acquire_now("after-the-flood", "30");
    assert_eq!(
        good.ask(&format!("R after-the-flood {token}")),
        "R after-the-flood"
    );
    // Each wrong one got bad-auth (none went unchecked) and its close.
    for client in &mut flood {
        assert_eq!(client.recv(), "E - - bad-auth");
        assert!(client.closed_within(DEADLINE));
    }
    wait_for("the flood's connections to be freed", DEADLINE, || {
        let info = good.info();
        (info_field(&info, "conns").as_deref() == Some("1")).then_some(())
    });
}

#[test]
fn an_unauthenticated_client_cannot_release_or_keep_a_lock_or_read_info() {
    let secrets = Secrets::new("no-effect", &format!("{ALPHA}\n"));
    let node = node_with(&secrets, &[]);
    let mut owner = authed(node.addr, ALPHA);
    let token = owner.acquire_now("precious", "60");
    for attempt in [
        format!("R precious {token}\n"),
        format!("I\nR precious {token}\n"),
        format!("U {WRONG}\nR precious {token}\nI\n"),
        format!("U {WRONG} x\nR precious {token}\n"),
    ] {
        let mut thief = LineClient::connect(node.addr);
        thief.send_raw(attempt.as_bytes());
        let mut seen = Vec::new();
        while let Received::Line(line) = thief.next_event(DEADLINE) {
            seen.push(line);
        }
        assert_eq!(seen.len(), 1, "{attempt:?}: {seen:?}");
        assert!(seen[0].starts_with("E - - "), "{attempt:?}: {seen:?}");
    }
    let q = owner.query("precious");
    assert_eq!(q.token, token, "the lock changed hands: {q:?}");
    assert_eq!(owner.ask(&format!("R precious {token}")), "R precious");
}

// ----- a cluster with authentication -----

/// Two nodes with `--auth-file`, a cluster key and a short `--detect`.
struct Pair {
    ports: [u16; 2],
    nodes: [Option<Node>; 2],
}

impl Pair {
    fn start(secrets: &Secrets) -> Pair {
        let mut ports = [free_port(), free_port()];
        while ports[1] == ports[0] {
            ports[1] = free_port();
        }
        let mut pair = Pair {
            ports,
            nodes: [None, None],
        };
        for i in 0..2 {
            pair.start_node(i, secrets);
        }
        pair
    }

    fn start_node(&mut self, i: usize, secrets: &Secrets) {
        let peers = format!("127.0.0.1:{},127.0.0.1:{}", self.ports[0], self.ports[1]);
        let flags = [
            "--cluster-key-file",
            common::cluster_key_file(),
            "--detect",
            "0.5",
            "--auth-file",
            secrets.path(),
        ];
        self.nodes[i] = Some(start_node(self.ports[i], &peers, &flags, &[]));
    }

    fn addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports[i]))
    }

    fn name(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.ports[i])
    }

    /// `I` of node `i`, with authentication.
    fn info(&self, i: usize) -> String {
        authed(self.addr(i), ALPHA).info()
    }

    /// Node `i` is active and serves clients.
    fn serving(&self, i: usize) -> bool {
        let info = self.info(i);
        info_field(&info, "role").as_deref() == Some("active")
            && info_field(&info, "state").as_deref() == Some("active")
    }
}

#[test]
fn a_cluster_with_authentication_links_replicates_fails_over_and_clients_follow_redirects() {
    let secrets = Secrets::new("cluster", &format!("{ALPHA}\n"));
    let mut pair = Pair::start(&secrets);
    // The peer link is made (P HELLO first on a node with --auth-file).
    wait_for("node 1 to sync with node 0", DEADLINE, || {
        let info = pair.info(1);
        (info_field(&info, "role").as_deref() == Some("standby")
            && info_field(&info, "active") == Some(pair.name(0))
            && pair.serving(0))
        .then_some(())
    });
    // A library client given only the standby follows its `M` to the active.
    let client = Client::builder([pair.name(1)])
        .auth(ALPHA)
        .connect()
        .expect("a client");
    let grant = client
        .acquire("replicated", Duration::from_secs(60), Some(DEADLINE))
        .expect("granted through the redirect");
    wait_for("the grant on the standby", DEADLINE, || {
        (info_field(&pair.info(1), "held").as_deref() == Some("1")).then_some(())
    });
    // A stranger's peer line, without the cluster key, changes nothing.
    let mut stranger = LineClient::connect(pair.addr(1));
    stranger.send_raw(b"P HELLO 0 2\nP S\nP G planted 16 86400000\nP E\n");
    assert!(stranger.closed_within(DEADLINE));
    assert_eq!(
        info_field(&pair.info(1), "role").as_deref(),
        Some("standby")
    );

    // Failover: node 1 serves the key with its token, to the same client.
    drop(pair.nodes[0].take());
    wait_for("node 1 to take over", DEADLINE, || {
        pair.serving(1).then_some(())
    });
    let status = wait_for("the client on the new active", DEADLINE, || {
        client.query("replicated").ok()
    });
    assert_eq!(status.token, Some(grant.token()));
    assert!(
        client
            .query("planted")
            .expect("query on the new active")
            .token
            .is_none()
    );
    // Node 0 comes back, takes over by handoff; the client follows again.
    pair.start_node(0, &secrets);
    wait_for("node 0 to be active again", DEADLINE, || {
        pair.serving(0).then_some(())
    });
    wait_for(
        "the client to release through the cluster",
        DEADLINE,
        || client.release(&grant).ok(),
    );
}

// ----- the Rust client library -----

#[test]
fn the_client_library_authenticates_and_a_wrong_or_missing_secret_is_an_auth_error() {
    let secrets = Secrets::new("library", &format!("{ALPHA}\n"));
    let node = node_with(&secrets, &[]);
    let servers = [node.addr.to_string()];
    let good = Client::builder(servers.clone())
        .auth(ALPHA)
        .connect()
        .expect("a client");
    let grant = good
        .acquire("lib", Duration::from_secs(30), Some(Duration::ZERO))
        .expect("granted");
    good.release(&grant).expect("released");
    assert!(!format!("{good:?}").contains(ALPHA));

    let wrong = Client::builder(servers.clone())
        .auth(WRONG)
        .connect()
        .expect("a client");
    let err = wrong
        .acquire("lib", Duration::from_secs(30), Some(Duration::ZERO))
        .expect_err("refused");
    assert!(matches!(err, Error::Auth(_)), "{err:?}");
    let text = err.to_string();
    assert!(text.starts_with("authentication failed"), "{text}");
    assert!(!text.contains(WRONG), "{text}");

    let none = Client::connect(servers).expect("a client");
    let err = none.query("lib").expect_err("refused");
    assert!(matches!(err, Error::Auth(_)), "{err:?}");
}

#[test]
fn a_refused_client_library_retries_at_the_reconnect_interval_not_faster() {
    let secrets = Secrets::new("no-spin", &format!("{ALPHA}\n"));
    let node = Node::start_debug(&["--auth-file", secrets.path()]);
    let wrong = Client::builder([node.addr.to_string()])
        .auth(WRONG)
        .connect()
        .expect("a client");
    let start = Instant::now();
    let mut calls = 0;
    while start.elapsed() < Duration::from_secs(1) {
        let err = wrong.query("k").expect_err("refused");
        assert!(matches!(err, Error::Auth(_)), "{err:?}");
        calls += 1;
    }
    let elapsed = start.elapsed();
    // Two connections (one server), each tried once per 3 s at most.
    let attempts = node.log().matches("wrong secret: closing").count();
    let bound = 2 * (1 + elapsed.as_secs() as usize / 3 + 1);
    assert!(
        attempts <= bound,
        "{attempts} attempts in {elapsed:?} over {calls} calls (at most {bound})"
    );
    assert!(calls > attempts, "calls wait for no reconnection");
}

#[test]
fn the_client_library_with_a_secret_works_with_a_node_without_auth() {
    let node = Node::start(&[]);
    let client = Client::builder([node.addr.to_string()])
        .auth(ALPHA)
        .connect()
        .expect("a client");
    let grant = client
        .acquire("open", Duration::from_secs(30), Some(Duration::ZERO))
        .expect("granted");
    client.release(&grant).expect("released");
}

#[test]
fn the_client_library_authenticates_again_when_it_reconnects_to_a_restarted_node() {
    let secrets = Secrets::new("reconnect", &format!("{ALPHA}\n"));
    let port = free_port();
    let port_text = port.to_string();
    let args = [
        "--bind",
        "127.0.0.1",
        "--port",
        &port_text,
        "--auth-file",
        secrets.path(),
    ];
    let node = Node::start_raw(&args, Some(port));
    let client = Client::builder([node.addr.to_string()])
        .auth(ALPHA)
        .connect()
        .expect("a client");
    assert!(client.query("k").expect("query").token.is_none());
    drop(node);
    let node = Node::start_raw(&args, Some(port));
    let grant = wait_for("the client to come back", DEADLINE, || {
        client
            .acquire("k", Duration::from_secs(30), Some(Duration::ZERO))
            .ok()
    });
    client.release(&grant).expect("released");
    // Each connection authenticated: none was refused.
    assert!(!node.log().contains("auth-required"));
}

// ----- the CLI -----

#[test]
fn the_cli_authenticates_with_auth_file_or_baton_auth_file() {
    let secrets = Secrets::new("cli", &format!("# ours\n\n{ALPHA}\n{BRAVO}\n"));
    let node = node_with(&secrets, &[]);
    let servers = node.addr.to_string();
    let done = run_to_exit(
        baton_path(),
        &[
            "--servers",
            &servers,
            "--auth-file",
            secrets.path(),
            "status",
        ],
        DEADLINE,
    );
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    assert!(done.stdout.contains("role=active"), "{}", done.stdout);

    let with_env = |file: &str, args: &[&str]| {
        Command::new(baton_path())
            .args(["--servers", &servers, "--timeout", "2"])
            .args(args)
            .env("BATON_AUTH_FILE", file)
            .stdin(Stdio::null())
            .output()
            .expect("run baton")
    };
    let out = with_env(secrets.path(), &["acquire", "cli-key", "--lease", "30"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let out = with_env(secrets.path(), &["release", "cli-key", &token]);
    assert!(out.status.success());

    // A wrong secret: one clear line, exit 1, no secret shown.
    let wrong = Secrets::new("cli-wrong", &format!("{WRONG}\n"));
    let out = with_env(wrong.path(), &["status"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("authentication failed"), "{stderr}");
    assert!(!stderr.contains(WRONG), "{stderr}");
    // A bad file: a usage error naming the line, not the secret.
    let bad = Secrets::new("cli-bad", "tiny-one\n");
    let out = with_env(bad.path(), &["status"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("line 1") && !stderr.contains("tiny-one"),
        "{stderr}"
    );
}

#[test]
fn a_client_that_never_authenticates_is_closed_and_gives_its_slot_back() {
    // --max-conns 2: two silent clients would otherwise hold the node for
    // ever. Past the 10 s gate deadline each gets auth-required and the
    // close, and a client with the secret gets in.
    let secrets = Secrets::new("silent", &format!("{ALPHA}\n"));
    let node = node_with(&secrets, &["--max-conns", "2"]);
    let mut silent = LineClient::connect(node.addr);
    let mut dribbling = LineClient::connect(node.addr);
    dribbling.send_raw(b"U alp");
    let late = Duration::from_secs(30);
    assert_eq!(silent.recv_within(late), "E - - auth-required");
    assert!(silent.closed_within(DEADLINE));
    assert_eq!(dribbling.recv_within(late), "E - - auth-required");
    assert!(dribbling.closed_within(DEADLINE));
    wait_for("a slot for a client with the secret", DEADLINE, || {
        let mut client = LineClient::connect(node.addr);
        client.send(&format!("U {ALPHA}"));
        (client.recv() == "U ok").then_some(())
    });
}
