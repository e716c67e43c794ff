//! TLS tests: real `batond` processes started with `--tls-cert`/`--tls-key`
//! (and `--tls-client-ca`, `--tls-ca`), certificates made by rcgen at test
//! time (tests/common/pki.rs). Clients: the Rust client library, the `baton`
//! CLI, and a raw TLS line client. Attacks — plain text on the TLS port, a
//! handshake that never finishes, garbage as a ClientHello, a wrong CA, a
//! client certificate from another CA, a peer whose certificate names
//! another host — each get a test that they change nothing for others.
//! Waits are polls with a deadline.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use baton::client::{Client, Error, TlsConfig};
use common::nodes::start_node;
use common::pki::{Pki, TlsLine};
use common::{DEADLINE, LineClient, Node, free_port, info_field, wait_for};

const LEASE: Duration = Duration::from_secs(30);
/// Longer than the server's handshake deadline (5 s), with room for a
/// loaded machine.
const HANDSHAKE_BOUND: Duration = Duration::from_secs(20);

fn p(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temp path")
}

/// A TLS node on a free port, its certificate naming 127.0.0.1.
fn tls_node(pki: &Pki, extra: &[&str]) -> Node {
    let (cert, key) = pki.issue("node", &["127.0.0.1", "localhost"]);
    let mut args = vec!["--tls-cert", p(&cert), "--tls-key", p(&key)];
    args.extend_from_slice(extra);
    Node::start(&args)
}

fn server(node: &Node) -> String {
    node.addr.to_string()
}

fn tls_client(node: &Node, tls: TlsConfig) -> Client {
    Client::builder([server(node)])
        .connect_timeout(Duration::from_secs(2))
        .tls(tls)
        .connect()
        .expect("a client")
}

/// A raw TLS line client trusting `pki`, that must connect.
fn line(node: &Node, pki: &Pki) -> TlsLine {
    TlsLine::connect(node.addr, "127.0.0.1", pki.client_config(None)).expect("a TLS connection")
}

/// Everything the server sends on `stream` until it closes, within `wait`;
/// None if it is still open then.
fn read_until_closed(stream: &mut TcpStream, wait: Duration) -> Option<Vec<u8>> {
    let start = Instant::now();
    let mut got = Vec::new();
    stream
        .set_read_timeout(Some(Duration::from_millis(50)))
        .expect("timeout");
    loop {
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk) {
            Ok(0) => return Some(got),
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return Some(got),
        }
        if start.elapsed() > wait {
            return None;
        }
    }
}

/// The node still serves a TLS client.
fn still_serves(node: &Node, pki: &Pki) {
    let mut other = line(node, pki);
    let info = other.ask("I").expect("an answer");
    assert!(info.starts_with("I "), "{info}");
}

// ----- clients over TLS -----

#[test]
fn a_client_over_tls_acquires_keeps_and_releases() {
    let pki = Pki::new("basic");
    let node = tls_node(&pki, &[]);
    let client = tls_client(&node, TlsConfig::new().ca_file(&pki.ca_file));
    let mut grant = client.acquire("k", LEASE, None).expect("granted");
    assert!(grant.token() > 0);
    client.keep(&mut grant, LEASE).expect("kept");
    let status = client.query("k").expect("query");
    assert_eq!(status.token, Some(grant.token()));
    client.release(&grant).expect("released");
    // And the raw protocol, over TLS, by IP and by DNS name.
    let mut raw = line(&node, &pki);
    assert!(raw.ask("I").expect("I").starts_with("I "));
    let mut by_name =
        TlsLine::connect(node.addr, "localhost", pki.client_config(None)).expect("by name");
    assert_eq!(by_name.ask("Q k").expect("Q"), "Q k 0 0 0");
}

#[test]
fn with_auth_file_and_tls_the_secret_goes_inside_tls_and_a_wrong_one_is_refused() {
    let pki = Pki::new("auth");
    let secrets = std::env::temp_dir().join(format!("baton-tls-auth-{}", std::process::id()));
    std::fs::write(&secrets, "a-secret-for-tls-and-auth-0001\n").expect("secrets file");
    let node = tls_node(&pki, &["--auth-file", p(&secrets)]);
    let good = Client::builder([server(&node)])
        .connect_timeout(Duration::from_secs(2))
        .tls(TlsConfig::new().ca_file(&pki.ca_file))
        .auth("a-secret-for-tls-and-auth-0001")
        .connect()
        .expect("a client");
    let grant = good
        .acquire("k", LEASE, None)
        .expect("granted over TLS with U");
    good.release(&grant).expect("released");
    let bad = Client::builder([server(&node)])
        .connect_timeout(Duration::from_secs(2))
        .tls(TlsConfig::new().ca_file(&pki.ca_file))
        .auth("not-the-secret-of-this-node-000")
        .connect()
        .expect("a client");
    let err = bad.acquire("k", LEASE, None).expect_err("refused");
    assert!(matches!(err, Error::Auth(_)), "{err:?}");
    // A raw TLS connection that asks anything before U is refused.
    let mut raw = line(&node, &pki);
    assert_eq!(raw.ask("I").expect("an answer"), "E - - auth-required");
    let _ = std::fs::remove_file(&secrets);
}

#[test]
fn plain_text_on_a_tls_port_gets_no_lock_service_and_is_closed() {
    let pki = Pki::new("plain");
    let node = tls_node(&pki, &[]);
    for first in [
        "I\n",
        "A k 30 0\nQ k\n",
        "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    ] {
        let mut plain = LineClient::connect(node.addr);
        plain.send_raw(first.as_bytes());
        let got = read_until_closed(&mut plain.stream, DEADLINE)
            .unwrap_or_else(|| panic!("{first:?}: the connection stays open"));
        // At most a TLS alert record (content type 21), never an answer.
        assert!(
            got.is_empty() || got[0] == 21,
            "{first:?}: got {:?}",
            String::from_utf8_lossy(&got)
        );
        assert!(!String::from_utf8_lossy(&got).contains("I "), "{got:?}");
    }
    still_serves(&node, &pki);
    // Nothing was acquired by the plain `A`.
    assert_eq!(line(&node, &pki).ask("Q k").expect("Q"), "Q k 0 0 0");
}

#[test]
fn a_client_trusting_another_ca_fails_with_a_clear_error() {
    let pki = Pki::new("server-ca");
    let other = Pki::new("other-ca");
    let node = tls_node(&pki, &[]);
    let client = tls_client(&node, TlsConfig::new().ca_file(&other.ca_file));
    let result = client.acquire("k", LEASE, Some(Duration::from_millis(100)));
    let Err(Error::NoConnection(why)) = result else {
        panic!("expected NoConnection, got {result:?}");
    };
    assert!(
        why.contains("certificate") && why.contains("UnknownIssuer"),
        "unclear error: {why}"
    );
    // A name the certificate does not carry is refused too.
    let wrong_name = Client::builder([server(&node)])
        .tls(
            TlsConfig::new()
                .ca_file(&pki.ca_file)
                .server_name("elsewhere.example"),
        )
        .connect()
        .expect("a client");
    let result = wrong_name.acquire("k", LEASE, Some(Duration::from_millis(100)));
    let Err(Error::NoConnection(why)) = result else {
        panic!("expected NoConnection, got {result:?}");
    };
    assert!(why.contains("not valid for name"), "unclear error: {why}");
    still_serves(&node, &pki);
}

#[test]
fn a_missing_ca_file_fails_when_the_client_is_built() {
    let result = Client::builder(["127.0.0.1:1"])
        .tls(TlsConfig::new().ca_file("/nonexistent/ca.pem"))
        .connect();
    let Err(Error::InvalidArgument(why)) = result else {
        panic!("expected InvalidArgument");
    };
    assert!(why.contains("/nonexistent/ca.pem"), "{why}");
}

// ----- mutual TLS -----

#[test]
fn with_a_client_ca_only_clients_with_a_certificate_it_signed_are_served() {
    let pki = Pki::new("mtls-server");
    let client_ca = Pki::new("mtls-clients");
    let rogue_ca = Pki::new("mtls-rogue");
    let node = tls_node(&pki, &["--tls-client-ca", p(&client_ca.ca_file)]);

    // No certificate: the handshake or the first read fails.
    let refused = TlsLine::connect(node.addr, "127.0.0.1", pki.client_config(None))
        .and_then(|mut c| c.ask("I"));
    assert!(
        refused.is_err(),
        "served without a certificate: {refused:?}"
    );
    let no_cert = tls_client(&node, TlsConfig::new().ca_file(&pki.ca_file));
    let result = no_cert.acquire("k", LEASE, Some(Duration::from_millis(100)));
    assert!(matches!(result, Err(Error::NoConnection(_))), "{result:?}");

    // A certificate from another CA.
    let (rogue_cert, rogue_key) = rogue_ca.issue("rogue", &["client.example"]);
    let config = common::pki::client_config(&pki.ca_file, Some((&rogue_cert, &rogue_key)));
    let refused = TlsLine::connect(node.addr, "127.0.0.1", config).and_then(|mut c| c.ask("I"));
    assert!(refused.is_err(), "served a rogue certificate: {refused:?}");
    let rogue = tls_client(
        &node,
        TlsConfig::new()
            .ca_file(&pki.ca_file)
            .client_cert(&rogue_cert, &rogue_key),
    );
    let result = rogue.acquire("k", LEASE, Some(Duration::from_millis(100)));
    assert!(matches!(result, Err(Error::NoConnection(_))), "{result:?}");

    // A good certificate.
    let (cert, key) = client_ca.issue("client", &["client.example"]);
    let good = tls_client(
        &node,
        TlsConfig::new()
            .ca_file(&pki.ca_file)
            .client_cert(&cert, &key),
    );
    let grant = good.acquire("k", LEASE, None).expect("granted");
    good.release(&grant).expect("released");
}

// ----- hostile handshakes -----

#[test]
fn a_handshake_that_never_finishes_is_closed_and_holds_up_nobody() {
    let pki = Pki::new("slowloris");
    let node = tls_node(&pki, &[]);
    let mut loris = Vec::new();
    for _ in 0..20 {
        let mut sock = TcpStream::connect(node.addr).expect("connect");
        // A record header announcing a 512-byte handshake message, then
        // a few bytes of it, and nothing more.
        sock.write_all(&[22, 3, 1, 2, 0, 1, 0, 1, 252, 3])
            .expect("send a partial ClientHello");
        loris.push(sock);
    }
    // Meanwhile others are served at once.
    let client = tls_client(&node, TlsConfig::new().ca_file(&pki.ca_file));
    let grant = client.acquire("k", LEASE, None).expect("granted");
    client.release(&grant).expect("released");
    for sock in &mut loris {
        let got = read_until_closed(sock, HANDSHAKE_BOUND);
        assert!(got.is_some(), "a stalled handshake is still open");
    }
    still_serves(&node, &pki);
}

#[test]
fn garbage_as_a_client_hello_is_closed_and_harms_nobody() {
    let pki = Pki::new("garbage");
    let node = tls_node(&pki, &[]);
    let mut held = line(&node, &pki);
    let token = held.ask("A held 30 0").expect("granted");
    assert!(token.starts_with("A "), "{token}");
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut junk = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    };
    // A handshake record of random bytes, a huge announced length, a
    // ClientHello with a random body, an alert, and random bytes alone.
    let shapes: Vec<Vec<u8>> = vec![
        [&[22u8, 3, 3, 0, 200][..], &junk(200)].concat(),
        [&[22u8, 3, 3, 255, 255][..], &junk(16_000)].concat(),
        [&[22u8, 3, 1, 0, 100, 1, 0, 0, 96][..], &junk(96)].concat(),
        vec![21, 3, 3, 0, 2, 2, 40],
        junk(70_000),
    ];
    for shape in &shapes {
        let mut sock = TcpStream::connect(node.addr).expect("connect");
        let _ = sock.write_all(shape);
        let got = read_until_closed(&mut sock, HANDSHAKE_BOUND);
        assert!(got.is_some(), "garbage kept a connection open");
    }
    // The holder's connection and its key are untouched.
    assert!(held.ask("I").expect("I").starts_with("I "));
    let q = held.ask("Q held").expect("Q");
    assert!(
        q.starts_with(&format!("Q held {} ", &token[2..token.len() - 5])),
        "{q}"
    );
    still_serves(&node, &pki);
}

// ----- reconnects, reloads -----

#[test]
fn the_client_reconnects_with_a_new_handshake_after_its_connections_are_cut() {
    let pki = Pki::new("proxy");
    let node = tls_node(&pki, &[]);
    let proxy = common::faults::Proxy::start(node.addr);
    let client = Client::builder([proxy.server()])
        .tls(TlsConfig::new().ca_file(&pki.ca_file))
        .connect()
        .expect("a client");
    for round in 0..3 {
        let grant = client
            .acquire(format!("k{round}"), LEASE, None)
            .expect("granted");
        client.release(&grant).expect("released");
        let accepted = proxy.accepted();
        proxy.cut();
        // The client comes back on new connections (new handshakes).
        wait_for("the client to reconnect", DEADLINE, || {
            (proxy.accepted() > accepted && proxy.live() > 0).then_some(())
        });
    }
    let grant = client.acquire("last", LEASE, None).expect("granted");
    client.release(&grant).expect("released");
}

#[test]
fn sighup_reloads_the_certificate_and_a_bad_one_keeps_the_old() {
    let first = Pki::new("reload-first");
    let second = Pki::new("reload-second");
    let (cert, key) = first.issue("node", &["127.0.0.1"]);
    let node = Node::start(&["--tls-cert", p(&cert), "--tls-key", p(&key)]);
    still_serves(&node, &first);

    // A broken certificate file: SIGHUP logs why, the old one stays.
    std::fs::write(&cert, "not a certificate\n").expect("break the file");
    node.signal("HUP");
    wait_for("the reload error in the log", DEADLINE, || {
        node.log().contains("not reloaded").then_some(())
    });
    still_serves(&node, &first);

    // A new certificate from another CA, in place.
    let (new_cert, new_key) = second.issue("node2", &["127.0.0.1"]);
    std::fs::copy(&new_cert, &cert).expect("new certificate");
    std::fs::copy(&new_key, &key).expect("new key");
    node.signal("HUP");
    wait_for(
        "new connections to see the new certificate",
        DEADLINE,
        || {
            TlsLine::connect(node.addr, "127.0.0.1", second.client_config(None))
                .ok()
                .and_then(|mut c| c.ask("I").ok())
        },
    );
    let old = TlsLine::connect(node.addr, "127.0.0.1", first.client_config(None));
    assert!(old.is_err(), "the old certificate is still served");
}

#[test]
fn the_node_refuses_to_start_with_unusable_tls_files() {
    let pki = Pki::new("start");
    let (cert, key) = pki.issue("node", &["127.0.0.1"]);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--tls-cert", p(&cert)], "--tls-key"),
        (
            vec!["--tls-cert", p(&key), "--tls-key", p(&key)],
            "--tls-cert",
        ),
        (
            vec!["--tls-cert", p(&cert), "--tls-key", p(&cert)],
            "--tls-key",
        ),
        (
            vec![
                "--tls-cert",
                p(&cert),
                "--tls-key",
                p(&key),
                "--tls-client-ca",
                "/nonexistent",
            ],
            "--tls-client-ca",
        ),
        (vec!["--tls-ca", p(&pki.ca_file)], "--tls-cert"),
        // Not used without --peers, but checked all the same.
        (
            vec![
                "--tls-cert",
                p(&cert),
                "--tls-key",
                p(&key),
                "--tls-ca",
                "/nonexistent",
            ],
            "--tls-ca",
        ),
        (
            vec![
                "--tls-cert",
                p(&cert),
                "--tls-key",
                p(&key),
                "--tls-ca",
                p(&key),
            ],
            "--tls-ca",
        ),
    ];
    for (args, flag) in cases {
        let mut all = vec!["--bind", "127.0.0.1", "--port", "0"];
        all.extend(args.iter().copied());
        let done = common::run_to_exit(common::batond_path(), &all, DEADLINE);
        assert_eq!(done.code, Some(2), "{args:?}: {}", done.stderr);
        assert_eq!(done.stderr.lines().count(), 1, "{args:?}: {}", done.stderr);
        assert!(
            done.stderr.starts_with("batond: --") && done.stderr.contains(flag),
            "{args:?}: {}",
            done.stderr
        );
    }
}

/// A node without --peers does not use --tls-ca: it checks the file, then
/// starts and says so.
#[test]
fn a_usable_tls_ca_without_peers_is_warned_about_and_the_node_serves() {
    let pki = Pki::new("unused-ca");
    let node = tls_node(&pki, &["--tls-ca", p(&pki.ca_file)]);
    let log = wait_for("the warning", DEADLINE, || {
        let log = node.log();
        log.contains("--tls-ca is not used without --peers")
            .then_some(log)
    });
    assert!(!log.contains("--cluster-key-file"), "{log}");
    still_serves(&node, &pki);
}

// ----- the CLI -----

#[test]
fn the_cli_speaks_tls_with_tls_ca_or_baton_tls_ca() {
    let pki = Pki::new("cli");
    let node = tls_node(&pki, &[]);
    let servers = server(&node);
    let done = common::run_to_exit(
        common::baton_path(),
        &[
            "--servers",
            &servers,
            "--tls-ca",
            p(&pki.ca_file),
            "acquire",
            "cli-key",
        ],
        DEADLINE,
    );
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    let token = done.stdout.trim().to_string();
    assert!(token.parse::<u64>().is_ok(), "{token:?}");
    let done = std::process::Command::new(common::baton_path())
        .args(["--servers", &servers, "release", "cli-key", &token])
        .env("BATON_TLS_CA", p(&pki.ca_file))
        .output()
        .expect("run baton");
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    // Without TLS the CLI gets no service, and says so.
    let done = common::run_to_exit(
        common::baton_path(),
        &["--servers", &servers, "--timeout", "1", "status"],
        DEADLINE,
    );
    assert_ne!(done.code, Some(0), "{}", done.stdout);
    // With the wrong CA it says why.
    let other = Pki::new("cli-other");
    let done = common::run_to_exit(
        common::baton_path(),
        &[
            "--servers",
            &servers,
            "--tls-ca",
            p(&other.ca_file),
            "query",
            "x",
        ],
        DEADLINE,
    );
    assert_eq!(done.code, Some(1));
    assert!(done.stderr.contains("UnknownIssuer"), "{}", done.stderr);
}

// ----- peers over TLS -----

/// Two nodes over TLS with a cluster key, each with a certificate for
/// `names(i)`; returns the nodes' ports and args builder.
struct TlsCluster {
    ports: Vec<u16>,
    pki: Pki,
    certs: Vec<(std::path::PathBuf, std::path::PathBuf)>,
    nodes: Vec<Option<Node>>,
    /// `--tls-client-ca` (the cluster's CA) on every node, and the client
    /// certificate probes then present.
    mtls: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl TlsCluster {
    fn new(n: usize, names: impl Fn(usize) -> Vec<String>) -> TlsCluster {
        let mut ports: Vec<u16> = Vec::new();
        while ports.len() < n {
            let port = free_port();
            if !ports.contains(&port) {
                ports.push(port);
            }
        }
        let pki = Pki::new("cluster");
        let certs = (0..n)
            .map(|i| {
                let names = names(i);
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                pki.issue(&format!("node{i}"), &names)
            })
            .collect();
        TlsCluster {
            ports,
            pki,
            certs,
            nodes: (0..n).map(|_| None).collect(),
            mtls: None,
        }
    }

    /// Every node started with `--tls-client-ca` (the cluster's own CA).
    fn with_client_certs(mut self) -> TlsCluster {
        self.mtls = Some(self.pki.issue("probe", &["probe.example"]));
        self
    }

    fn client_config(&self) -> std::sync::Arc<rustls::ClientConfig> {
        let cert_key = self.mtls.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
        self.pki.client_config(cert_key)
    }

    fn name(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.ports[i])
    }

    fn addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports[i]))
    }

    fn start(&mut self, i: usize) {
        let peers: Vec<String> = (0..self.ports.len()).map(|i| self.name(i)).collect();
        let peers = peers.join(",");
        let (cert, key) = &self.certs[i];
        let mut flags = vec![
            "--cluster-key-file",
            common::cluster_key_file(),
            "--detect",
            "0.5",
            "--tls-cert",
            p(cert),
            "--tls-key",
            p(key),
            "--tls-ca",
            p(&self.pki.ca_file),
        ];
        if self.mtls.is_some() {
            flags.extend(["--tls-client-ca", p(&self.pki.ca_file)]);
        }
        self.nodes[i] = Some(start_node(self.ports[i], &peers, &flags, &[]));
    }

    fn kill(&mut self, i: usize) {
        self.nodes[i] = None;
    }

    /// `I` of node `i` over TLS; None if it does not answer.
    fn info(&self, i: usize) -> Option<String> {
        let mut c = TlsLine::connect(self.addr(i), "127.0.0.1", self.client_config()).ok()?;
        c.ask("I").ok()
    }

    fn field(&self, i: usize, name: &str) -> Option<String> {
        self.info(i).and_then(|info| info_field(&info, name))
    }

    fn wait_role(&self, i: usize, role: &str, active: Option<usize>) -> String {
        let active = active.map(|a| self.name(a));
        wait_for(&format!("node {i} to be {role}"), DEADLINE, || {
            let info = self.info(i)?;
            let ok = info_field(&info, "role").as_deref() == Some(role)
                && (active.is_none() || info_field(&info, "active") == active)
                && (role != "active" || info_field(&info, "state").as_deref() == Some("active"));
            ok.then_some(info)
        })
    }

    fn line(&self, i: usize) -> TlsLine {
        TlsLine::connect(self.addr(i), "127.0.0.1", self.client_config()).expect("a TLS connection")
    }

    fn logs(&self) -> String {
        let mut all = String::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if let Some(node) = node {
                all.push_str(&format!("----- node {i} -----\n{}", node.log()));
            }
        }
        all
    }
}

impl Drop for TlsCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
    }
}

#[test]
fn a_tls_cluster_replicates_fails_over_and_hands_back() {
    let mut cluster = TlsCluster::new(2, |_| vec!["127.0.0.1".to_string()]);
    cluster.start(0);
    cluster.start(1);
    cluster.wait_role(0, "active", Some(0));
    cluster.wait_role(1, "standby", Some(0));
    let mut c0 = cluster.line(0);
    let granted = c0.ask("A kept 30 0").expect("granted");
    assert!(granted.starts_with("A "), "{granted}");
    let token: u64 = granted[2..]
        .split(' ')
        .next()
        .unwrap_or("")
        .parse()
        .expect("token");
    wait_for("the standby to hold the key", DEADLINE, || {
        (cluster.field(1, "held").as_deref() == Some("1")).then_some(())
    });

    cluster.kill(0);
    cluster.wait_role(1, "active", Some(1));
    let mut c1 = cluster.line(1);
    assert!(
        c1.ask("Q kept")
            .expect("Q")
            .starts_with(&format!("Q kept {token} ")),
        "the replicated grant survives the failover"
    );
    let fresh = c1.ask("A fresh 30 0").expect("granted");
    let fresh_token: u64 = fresh[2..]
        .split(' ')
        .next()
        .unwrap_or("")
        .parse()
        .expect("token");
    assert!(fresh_token > token, "{fresh_token} <= {token}");

    // The first node comes back and takes over by handoff.
    cluster.start(0);
    cluster.wait_role(0, "active", Some(0));
    cluster.wait_role(1, "standby", Some(0));
    let mut c0 = cluster.line(0);
    assert!(
        c0.ask("Q kept")
            .expect("Q")
            .starts_with(&format!("Q kept {token} "))
    );
    assert!(
        c0.ask("Q fresh")
            .expect("Q")
            .starts_with(&format!("Q fresh {fresh_token} "))
    );
    // The Rust client follows the active over TLS.
    let client = Client::builder([cluster.name(1), cluster.name(0)])
        .tls(TlsConfig::new().ca_file(&cluster.pki.ca_file))
        .connect()
        .expect("a client");
    let grant = client.acquire("via-client", LEASE, None).expect("granted");
    client.release(&grant).expect("released");
}

#[test]
fn a_peer_whose_certificate_names_another_host_is_refused() {
    // Each node's certificate names a host that is not its --peers entry.
    let mut cluster = TlsCluster::new(2, |i| vec![format!("node{i}.wrong.example")]);
    cluster.start(0);
    cluster.start(1);
    // Neither ever follows the other: no link comes up.
    wait_for("node 0 to refuse its peer's certificate", DEADLINE, || {
        let log = cluster.nodes[0]
            .as_ref()
            .map(|n| n.log())
            .unwrap_or_default();
        log.contains("not valid for name").then_some(())
    });
    wait_for("node 1 to refuse its peer's certificate", DEADLINE, || {
        let log = cluster.nodes[1]
            .as_ref()
            .map(|n| n.log())
            .unwrap_or_default();
        log.contains("not valid for name").then_some(())
    });
    for i in 0..2 {
        // Each runs alone: it serves by itself and never follows the other.
        let info = wait_for(&format!("node {i} to serve alone"), DEADLINE, || {
            let config = common::pki::client_config(&cluster.pki.ca_file, None);
            let name = format!("node{i}.wrong.example");
            let mut c = TlsLine::connect(cluster.addr(i), &name, config).ok()?;
            let info = c.ask("I").ok()?;
            (info_field(&info, "role").as_deref() == Some("active")).then_some(info)
        });
        assert_eq!(info_field(&info, "active"), Some(cluster.name(i)), "{info}");
        assert_eq!(
            info_field(&info, "standbys").as_deref(),
            Some("0"),
            "{info}"
        );
    }
}

#[test]
fn a_peer_that_dials_with_a_certificate_for_another_host_is_refused_by_the_node_it_dials() {
    // Node 0's certificate is right; node 1's names another host. Node 1
    // can check node 0 and dial it, but node 0 refuses the link when node
    // 1's certificate does not name node 1's --peers entry.
    let mut cluster = TlsCluster::new(2, |i| {
        vec![if i == 0 {
            "127.0.0.1".to_string()
        } else {
            "node1.wrong.example".to_string()
        }]
    });
    cluster.start(0);
    cluster.start(1);
    wait_for("node 0 to refuse node 1's certificate", DEADLINE, || {
        let log = cluster.nodes[0]
            .as_ref()
            .map(|n| n.log())
            .unwrap_or_default();
        log.contains("the peer's certificate").then_some(())
    });
    let info = cluster.wait_role(0, "active", Some(0));
    assert_eq!(
        info_field(&info, "standbys").as_deref(),
        Some("0"),
        "{info}"
    );
    let config = common::pki::client_config(&cluster.pki.ca_file, None);
    let mut c = TlsLine::connect(cluster.addr(1), "node1.wrong.example", config).expect("node 1");
    let info = c.ask("I").expect("I");
    assert_ne!(
        info_field(&info, "active"),
        Some(cluster.name(0)),
        "node 1 follows node 0 over a link node 0 refused: {info}"
    );
}

#[test]
fn a_hardened_cluster_with_client_certificates_links_and_serves_only_certified_clients() {
    let mut cluster = TlsCluster::new(2, |_| vec!["127.0.0.1".to_string()]).with_client_certs();
    cluster.start(0);
    cluster.start(1);
    cluster.wait_role(0, "active", Some(0));
    cluster.wait_role(1, "standby", Some(0));
    let granted = cluster.line(0).ask("A hard 30 0").expect("granted");
    assert!(granted.starts_with("A "), "{granted}");
    wait_for("the standby to hold the key", DEADLINE, || {
        (cluster.field(1, "held").as_deref() == Some("1")).then_some(())
    });
    // A client without a certificate is refused, on either node.
    for i in 0..2 {
        let refused = TlsLine::connect(
            cluster.addr(i),
            "127.0.0.1",
            cluster.pki.client_config(None),
        )
        .and_then(|mut c| c.ask("I"));
        assert!(
            refused.is_err(),
            "node {i} served a client without a certificate"
        );
    }
}

#[test]
fn past_max_conns_a_tls_connection_is_closed_without_a_word_and_the_others_stay() {
    let pki = Pki::new("max-conns");
    let node = tls_node(&pki, &["--max-conns", "1"]);
    let mut first = line(&node, &pki);
    assert!(first.ask("I").expect("I").starts_with("I "));
    let mut extra = TcpStream::connect(node.addr).expect("connect");
    let got = read_until_closed(&mut extra, DEADLINE).expect("closed at once");
    // No plain-text line on a TLS port: not even the refusal.
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    assert!(first.ask("I").expect("still served").starts_with("I "));
}

// ----- closing -----

#[test]
fn a_fatal_line_over_tls_is_answered_after_every_answer_before_it_then_close_notify() {
    let pki = Pki::new("close-notify");
    let node = tls_node(&pki, &[]);
    // The error, then a clean end: rustls reads a close without
    // close_notify as an error, not as "closed".
    let mut client = line(&node, &pki);
    let long = "x".repeat(2000);
    assert_eq!(client.ask(&long).expect("an answer"), "E - - line-too-long");
    assert_eq!(client.recv(DEADLINE), Err("closed".to_string()));
    // Behind a burst of answers that the client reads only once it has
    // sent everything: each of them, the error, then the clean end.
    let mut client = line(&node, &pki);
    let mut burst = "I\n".repeat(PIPELINED_INFOS);
    burst.push_str(&long);
    burst.push('\n');
    client.send_raw(burst.as_bytes()).expect("send the burst");
    for i in 0..PIPELINED_INFOS {
        let answer = client.recv(DEADLINE).expect("an I answer");
        assert!(answer.starts_with("I "), "answer {i}: {answer:?}");
    }
    assert_eq!(
        client.recv(DEADLINE).expect("the error"),
        "E - - line-too-long"
    );
    assert_eq!(client.recv(DEADLINE), Err("closed".to_string()));
    still_serves(&node, &pki);
}

/// `I` requests pipelined ahead of the fatal line in the close test: some
/// 2 MB of answers, so the line comes while many are owed.
const PIPELINED_INFOS: usize = 8000;
