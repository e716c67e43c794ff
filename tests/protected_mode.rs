//! Protected mode (docs/security.md, "Safe by default"): a `batond` started
//! with no `--bind`, no client authentication and no cluster key listens on
//! 0.0.0.0 but serves only clients on loopback; a client from any other
//! address gets `E - - protected-mode` and is closed, and the node's log
//! says how to open it. `--bind`, `--auth-file` and `--peers` with a
//! cluster key each open it; peer links are never refused by it (a
//! cluster on `--insecure-peers` links from non-loopback addresses while
//! its clients stay on loopback).
//!
//! A client that is not on loopback needs an address that is not
//! 127.0.0.0/8, and these nodes must listen on 0.0.0.0 (the default under
//! test) without being reachable from the network: so the test runs in a
//! network namespace of its own. The outer test re-runs this test binary
//! under `unshare --net` (with `--map-root-user` when not root), where
//! loopback is brought up and 10.213.9.1/32 is added to it; the inner test
//! (`in_the_namespace`, which does nothing outside it) starts the nodes and
//! the clients there. The namespace ends with its last process: nothing is
//! left to clean up. Where `unshare` cannot make one (no util-linux, user
//! namespaces disabled), or there is no `ip` (iproute2), the test skips with a line on stderr, unless
//! `BATON_REQUIRE_NETNS=1` (set by `.ci/run`, which runs as root).

mod common;

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{
    DEADLINE, LineClient, Node, baton_path, cluster_key_file, free_port_run, info_field,
    run_to_exit, wait_for,
};

/// The address given to loopback in the namespace: local, but not
/// 127.0.0.0/8, so a client connecting to it comes from it.
const FAR: Ipv4Addr = Ipv4Addr::new(10, 213, 9, 1);
/// Set in the environment of the inner run.
const INNER: &str = "BATON_PROTECTED_MODE_NETNS";
const SECRET: &str = "protected-mode-secret-0123456789";

#[test]
fn a_far_client_is_refused_by_default_and_served_once_the_node_is_opened() {
    if std::env::var_os(INNER).is_some() {
        return; // the inner run runs `in_the_namespace` alone
    }
    let root = unsafe { libc::geteuid() } == 0;
    let exe = std::env::current_exe().expect("the test binary's path");
    let exe = exe.to_str().expect("a UTF-8 path");
    let mut args = vec!["--net"];
    if !root {
        args.push("--map-root-user");
    }
    // A namespace can be made at all? (`true` in it.)
    let probe = Command::new("unshare").args(&args).arg("true").output();
    let has_ip = common::on_path("ip").is_some();
    let usable = has_ip && probe.as_ref().is_ok_and(|out| out.status.success());
    if !usable {
        let why = match &probe {
            _ if !has_ip => "no `ip` (iproute2)".to_string(),
            Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_string(),
            Err(e) => format!("unshare: {e}"),
        };
        assert!(
            std::env::var_os("BATON_REQUIRE_NETNS").is_none(),
            "BATON_REQUIRE_NETNS is set and no network namespace can be made: {why}"
        );
        eprintln!("protected-mode test skipped: no network namespace ({why})");
        return;
    }
    let inner = format!("{INNER}=1");
    args.extend([
        "env",
        &inner,
        exe,
        "--exact",
        "in_the_namespace",
        "--nocapture",
        "--test-threads",
        "1",
    ]);
    let run = run_to_exit("unshare", &args, 4 * DEADLINE);
    assert_eq!(
        run.code,
        Some(0),
        "the run in the namespace failed:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    assert!(
        run.stdout.contains("1 passed"),
        "the inner test did not run:\n{}",
        run.stdout
    );
}

#[test]
fn in_the_namespace() {
    if std::env::var_os(INNER).is_none() {
        return; // run by the test above, inside its namespace
    }
    ip(&["link", "set", "lo", "up"]);
    ip(&["addr", "add", &format!("{FAR}/32"), "dev", "lo"]);

    // The default: 0.0.0.0, protected. Loopback is served, FAR refused.
    let node = Node::start_raw(&["--port", "0"], None);
    let port = node.addr.port();
    assert!(node.addr.ip().is_unspecified(), "listens on {}", node.addr);
    // The line comes right after the node listens, so poll for it.
    wait_for("a start-up line saying how to open it", DEADLINE, || {
        let log = node.log();
        (log.contains("protected mode: serving clients on loopback")
            && log.contains("--bind 0.0.0.0")
            && log.contains("--auth-file PATH"))
        .then_some(())
    });
    assert!(served(local(port)));
    assert_refused(far(port));
    wait_for("the refusal warning", DEADLINE, || {
        let log = node.log();
        (log.contains(&format!("({FAR}:")) && log.contains("refused (E - - protected-mode)"))
            .then_some(())
    });
    // A blank line is ignored, as everywhere; the first request ends it.
    let mut blank = LineClient::connect(far(port));
    blank.send("");
    assert_eq!(blank.ask("Q k"), "E - - protected-mode");
    // The CLI says what happened.
    let cli = run_to_exit(
        baton_path(),
        &["--servers", &far(port).to_string(), "status"],
        DEADLINE,
    );
    assert_ne!(cli.code, Some(0), "{}", cli.stdout);
    assert!(
        cli.stderr.contains("refused by the server: protected-mode")
            && cli.stderr.contains("--bind or --auth-file"),
        "the CLI does not say why:\n{}\n{}",
        cli.stdout,
        cli.stderr
    );
    drop(node);

    // Opened by --bind (0.0.0.0 given explicitly).
    let node = Node::start_raw(&["--bind", "0.0.0.0", "--port", "0"], None);
    assert!(served(far(node.addr.port())));
    assert!(!node.log().contains("protected mode"));
    drop(node);

    // Opened by --auth-file: a far client that sends the secret is served.
    let secrets = secrets_file();
    let node = Node::start_raw(
        &["--port", "0", "--auth-file", secrets.to_str().unwrap()],
        None,
    );
    let mut c = LineClient::connect(far(node.addr.port()));
    assert_eq!(c.ask(&format!("U {SECRET}")), "U ok");
    assert!(c.ask("I").starts_with("I role=active"));
    drop(c);
    drop(node);
    let _ = std::fs::remove_file(&secrets);

    // Opened by --peers with a cluster key: a cluster is meant to be
    // reached. Two nodes that reach each other at FAR.
    let base = free_port_run(2);
    let peers = format!("{FAR}:{base},{FAR}:{}", base + 1);
    let key = cluster_key_file();
    let nodes: Vec<Node> = (0..2)
        .map(|i| {
            let port = (base + i).to_string();
            let args = [
                "--port",
                &port,
                "--peers",
                &peers,
                "--cluster-key-file",
                key,
            ];
            Node::start_raw(&args, Some(base + i))
        })
        .collect();
    await_formed(base);
    assert!(served(far(base)) && served(far(base + 1)));
    drop(nodes);

    // --insecure-peers proves nothing, so its clients stay on loopback; but
    // its peer links, from FAR, are not refused: the cluster forms.
    let base = free_port_run(2);
    let peers = format!("{FAR}:{base},{FAR}:{}", base + 1);
    let nodes: Vec<Node> = (0..2)
        .map(|i| {
            let port = (base + i).to_string();
            let args = ["--port", &port, "--peers", &peers, "--insecure-peers"];
            Node::start_raw(&args, Some(base + i))
        })
        .collect();
    await_formed(base);
    assert_refused(far(base));
    assert!(served(local(base)));
    drop(nodes);
}

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("run ip");
    assert!(status.success(), "ip {args:?} failed");
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

fn far(port: u16) -> SocketAddr {
    SocketAddr::from((FAR, port))
}

/// Whether a client at `addr` gets an `I` answer.
fn served(addr: SocketAddr) -> bool {
    let mut c = LineClient::connect(addr);
    let answer = c.ask("I");
    assert!(
        answer.starts_with("I role="),
        "{addr}: expected an I answer, got {answer:?}"
    );
    true
}

/// A client at `addr` gets `E - - protected-mode` for its first request,
/// and then the end of the connection.
fn assert_refused(addr: SocketAddr) {
    let mut c = LineClient::connect(addr);
    assert_eq!(c.ask("I"), "E - - protected-mode", "{addr}");
    let mut stream: &TcpStream = &c.stream;
    stream
        .set_read_timeout(Some(DEADLINE))
        .expect("read timeout");
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{addr}: more after the refusal: {rest:?}");
}

/// Wait until node 0 of a two-node cluster at `base` is active with its
/// standby synced (both asked on loopback, which is always served).
fn await_formed(base: u16) {
    let start = Instant::now();
    wait_for("a formed cluster", DEADLINE, || {
        let ask = |port| {
            TcpStream::connect_timeout(&local(port), Duration::from_secs(1))
                .ok()
                .map(|_| LineClient::connect(local(port)).ask("I"))
        };
        let first = ask(base)?;
        let second = ask(base + 1)?;
        (info_field(&first, "role").as_deref() == Some("active")
            && info_field(&first, "standbys").as_deref() == Some("1")
            && info_field(&second, "role").as_deref() == Some("standby"))
        .then_some(())
    });
    assert!(start.elapsed() < DEADLINE);
}

fn secrets_file() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&dir).expect("target tmp dir");
    let path = dir.join(format!("baton-protected-mode-{}", std::process::id()));
    std::fs::write(&path, format!("{SECRET}\n")).expect("write the secrets");
    path
}
