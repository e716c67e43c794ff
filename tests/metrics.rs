//! `batond --metrics`: real processes scraped over raw TCP. Every scrape is
//! checked strictly against the Prometheus text format (0.0.4); the values
//! must move with what the test did; hostile HTTP is refused or cut off
//! without touching the lock port; without the flag no port but the client
//! port is open; a two-node cluster shows its roles, standbys and lag.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::nodes::{start_node, two_nodes_with_metrics};
use common::{DEADLINE, LineClient, Node, free_port, token_of, wait_for};

/// One parsed scrape: sample (name with its labels, as written) → value.
#[derive(Debug, Default)]
struct Scrape {
    samples: BTreeMap<String, f64>,
    /// The same values as written (integers stay exact: tokens pass 2^53).
    raw: BTreeMap<String, String>,
}

impl Scrape {
    fn get(&self, sample: &str) -> f64 {
        *self
            .samples
            .get(sample)
            .unwrap_or_else(|| panic!("no sample {sample}"))
    }

    fn get_u64(&self, sample: &str) -> u64 {
        let raw = self
            .raw
            .get(sample)
            .unwrap_or_else(|| panic!("no sample {sample}"));
        raw.parse()
            .unwrap_or_else(|_| panic!("{sample} {raw} is not an integer"))
    }
}

/// A metric name of the text format.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `{a="x",b="y"}` → pairs; panics on anything else.
fn parse_labels(text: &str, line: &str) -> Vec<(String, String)> {
    let inner = text
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .unwrap_or_else(|| panic!("labels not in braces: {line}"));
    let mut labels = Vec::new();
    let mut rest = inner;
    while !rest.is_empty() {
        let (name, after) = rest
            .split_once("=\"")
            .unwrap_or_else(|| panic!("label without =\": {line}"));
        assert!(
            valid_name(name) && !name.contains(':'),
            "label name {name:?}: {line}"
        );
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    other => panic!("bad escape {other:?}: {line}"),
                },
                Some((_, c)) => value.push(c),
                None => panic!("unterminated label value: {line}"),
            }
        };
        labels.push((name.to_string(), value));
        rest = &after[end + 1..];
        if let Some(more) = rest.strip_prefix(',') {
            rest = more;
            assert!(!rest.is_empty(), "trailing comma: {line}");
        } else {
            assert!(rest.is_empty(), "junk after a label: {line}");
        }
    }
    labels
}

fn parse_value(text: &str, line: &str) -> f64 {
    match text {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        _ => text
            .parse::<f64>()
            .unwrap_or_else(|_| panic!("value {text:?} is not a float: {line}")),
    }
}

/// One histogram family's samples, for the bucket checks.
#[derive(Default)]
struct Histogram {
    buckets: Vec<(f64, f64)>,
    sum: Option<f64>,
    count: Option<f64>,
}

/// Parse a whole exposition, strictly: every line a `# HELP`, a `# TYPE`
/// or a sample; every family HELP then TYPE, once, before its samples;
/// every name `baton_`-prefixed; samples of a family only right after it;
/// histograms with cumulative, monotone buckets ending in `+Inf == _count`.
fn parse_exposition(text: &str) -> Scrape {
    assert!(text.ends_with('\n'), "the exposition ends with a newline");
    let mut scrape = Scrape::default();
    let mut families = HashSet::new();
    let mut help: Option<String> = None;
    let mut family: Option<(String, String)> = None;
    let mut histograms: BTreeMap<String, Histogram> = BTreeMap::new();
    for line in text.lines() {
        assert!(!line.is_empty(), "no blank lines");
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, doc) = rest.split_once(' ').expect("HELP name text");
            assert!(valid_name(name) && name.starts_with("baton_"), "{line}");
            assert!(!doc.trim().is_empty(), "HELP has a text: {line}");
            assert!(families.insert(name.to_string()), "family twice: {line}");
            help = Some(name.to_string());
            family = None;
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name type");
            assert_eq!(
                help.as_deref(),
                Some(name),
                "TYPE right after its HELP: {line}"
            );
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            family = Some((name.to_string(), kind.to_string()));
            help = None;
            continue;
        }
        assert!(
            !line.starts_with('#'),
            "only HELP and TYPE comments: {line}"
        );
        let (fam, kind) = family
            .clone()
            .unwrap_or_else(|| panic!("a sample before its HELP and TYPE: {line}"));
        let (series, value) = line.rsplit_once(' ').expect("sample: series value");
        scrape.raw.insert(series.to_string(), value.to_string());
        let value = parse_value(value, line);
        let (name, labels) = match series.find('{') {
            Some(i) => (&series[..i], parse_labels(&series[i..], line)),
            None => (series, Vec::new()),
        };
        assert!(valid_name(name) && name.starts_with("baton_"), "{line}");
        if kind == "histogram" {
            let h = histograms.entry(fam.clone()).or_default();
            if name == format!("{fam}_bucket") {
                assert_eq!(labels.len(), 1, "a bucket has only le: {line}");
                assert_eq!(labels[0].0, "le", "{line}");
                let le = parse_value(&labels[0].1, line);
                h.buckets.push((le, value));
            } else if name == format!("{fam}_sum") {
                h.sum = Some(value);
            } else if name == format!("{fam}_count") {
                h.count = Some(value);
            } else {
                panic!("{name} is not part of histogram {fam}: {line}");
            }
        } else {
            assert_eq!(name, fam, "a sample of another family: {line}");
            assert!(value >= 0.0 && value.is_finite(), "{line}");
        }
        assert!(
            scrape.samples.insert(series.to_string(), value).is_none(),
            "series twice: {line}"
        );
    }
    for (name, h) in &histograms {
        assert!(!h.buckets.is_empty(), "{name} has buckets");
        for w in h.buckets.windows(2) {
            assert!(w[0].0 < w[1].0, "{name}: le increases");
            assert!(w[0].1 <= w[1].1, "{name}: buckets are cumulative");
        }
        let (last_le, last) = *h.buckets.last().expect("buckets");
        assert!(last_le.is_infinite(), "{name}: the last bucket is +Inf");
        assert_eq!(Some(last), h.count, "{name}: +Inf == _count");
        let sum = h.sum.unwrap_or_else(|| panic!("{name} has a _sum"));
        assert!(sum >= 0.0, "{name}: _sum");
    }
    scrape
}

const GET: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n";

/// Send `request`, read until the server closes (or the deadline); the
/// status code and the body, checked against Content-Length.
fn exchange(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    try_exchange(addr, request).expect("an HTTP response")
}

/// The same; None if the server closed without a response. A scrape
/// (200) is in the Prometheus text format's Content-Type.
fn try_exchange(addr: SocketAddr, request: &[u8]) -> Option<(u16, String)> {
    let (code, content_type, body) = common::http::try_exchange(addr, request)?;
    if code == 200 {
        assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    }
    Some((code, body))
}

fn scrape(addr: SocketAddr) -> Scrape {
    let (code, body) = exchange(addr, GET);
    assert_eq!(code, 200, "{body}");
    parse_exposition(&body)
}

fn metrics_node(args: &[&str]) -> (Node, SocketAddr) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut all = vec!["--metrics", listen.as_str()];
    all.extend_from_slice(args);
    let node = Node::start(&all);
    (node, listen.parse().expect("addr"))
}

#[test]
fn back_to_back_scrapes_each_see_every_grant_made_before_them() {
    // The owner is asked at most once per 100 ms, but a scrape still waits
    // for a snapshot taken after it arrived: never an older one.
    let (node, metrics) = metrics_node(&[]);
    let mut client = node.client();
    let base = scrape(metrics).get("baton_grants_total");
    for i in 1..=8 {
        client.acquire_now(&format!("fresh{i}"), "30");
        let now = scrape(metrics);
        assert_eq!(
            now.get("baton_grants_total") - base,
            f64::from(i),
            "scrape {i}"
        );
    }
}

#[test]
fn a_scrape_counts_grants_handoffs_expiries_timeouts_and_refusals() {
    let (node, metrics) = metrics_node(&["--threads", "1"]);
    let before = scrape(metrics);
    assert_eq!(before.get("baton_role{role=\"active\"}"), 1.0);
    assert_eq!(before.get("baton_role{role=\"standby\"}"), 0.0);
    assert_eq!(before.get("baton_grants_total"), 0.0);
    assert_eq!(before.get("baton_grant_wait_seconds_count"), 0.0);

    // A grant, a waiter, and a handoff by release.
    let mut a = node.client();
    let mut b = node.client();
    let t1 = a.acquire_now("k1", "30");
    b.send("A k1 30 0");
    wait_for("b to wait", DEADLINE, || {
        (a.query("k1").waiting == 1).then_some(())
    });
    assert_eq!(a.ask(&format!("R k1 {t1}")), "R k1");
    let t2 = token_of(&b.recv());
    // A handoff by expiry.
    let mut c = node.client();
    let mut d = node.client();
    c.acquire_now("k2", "0.05");
    let t3 = token_of(&d.ask("A k2 30 0"));
    // A wait that runs out.
    let mut e = node.client();
    assert_eq!(e.ask("A k1 30 0.05"), "T k1");
    // Refusals: one the owner answers, one an I/O loop answers (and closes).
    assert_eq!(e.ask("A k3 0 0"), "E A k3 bad-lease");
    assert_eq!(e.ask(&format!("K k1 {t1} 5")), "E K k1 not-held");
    let mut f = node.client();
    assert_eq!(f.ask("Z"), "E - - unknown-op");
    assert!(f.closed_within(DEADLINE));
    let info = e.info();

    let after = scrape(metrics);
    let moved = |name: &str| after.get(name) - before.get(name);
    assert_eq!(moved("baton_grants_total"), 4.0);
    assert_eq!(moved("baton_handoffs_total"), 2.0);
    assert_eq!(moved("baton_lease_expiries_total"), 1.0);
    assert_eq!(moved("baton_wait_timeouts_total"), 1.0);
    assert_eq!(moved("baton_requests_total{op=\"acquire\"}"), 6.0);
    assert_eq!(moved("baton_requests_total{op=\"release\"}"), 1.0);
    assert_eq!(moved("baton_requests_total{op=\"keep\"}"), 1.0);
    assert!(moved("baton_requests_total{op=\"query\"}") >= 1.0);
    assert_eq!(moved("baton_requests_total{op=\"info\"}"), 1.0);
    assert_eq!(moved("baton_answers_total{kind=\"granted\"}"), 4.0);
    assert_eq!(moved("baton_answers_total{kind=\"timeout\"}"), 1.0);
    assert_eq!(moved("baton_answers_total{kind=\"released\"}"), 1.0);
    assert_eq!(moved("baton_answers_total{kind=\"error\"}"), 3.0);
    assert_eq!(moved("baton_refusals_total{reason=\"bad-lease\"}"), 1.0);
    assert_eq!(moved("baton_refusals_total{reason=\"not-held\"}"), 1.0);
    assert_eq!(moved("baton_refusals_total{reason=\"unknown-op\"}"), 1.0);
    assert_eq!(moved("baton_refusals_total{reason=\"bad-key\"}"), 0.0);
    assert_eq!(after.get("baton_held_keys"), 2.0);
    assert_eq!(after.get("baton_waiting_requests"), 0.0);
    // f ended, but the node keeps its socket (and counts it) until f
    // closes its side too: then it is a b c d e.
    drop(f);
    wait_for("f's connection to go", DEADLINE, || {
        (scrape(metrics).get("baton_connections") == 5.0).then_some(())
    });
    // Tokens follow the clock, so the last one known only grows.
    let last = after.get_u64("baton_last_token");
    let in_info: u64 = info
        .split(' ')
        .find_map(|f| f.strip_prefix("token="))
        .and_then(|t| t.parse().ok())
        .expect("token= in I");
    assert!(last >= in_info && in_info >= t2.max(t3), "{last} {info}");
    assert!(after.get_u64("baton_token_ceiling") >= last);
    assert_eq!(after.get("baton_grant_wait_seconds_count"), 4.0);
    assert_eq!(after.get("baton_handoff_seconds_count"), 2.0);
    assert_eq!(after.get("baton_expiry_lateness_seconds_count"), 1.0);
    // d waited for the 50 ms lease, b for a's release: the two waits are in
    // the sum, which is therefore at least d's.
    assert!(after.get("baton_grant_wait_seconds_sum") >= 0.04);
    assert_eq!(after.get("baton_role_changes_total"), 0.0);
    assert_eq!(after.get("baton_replication_lag_seconds"), 0.0);
    assert_eq!(after.get("baton_standbys"), 0.0);
}

#[test]
fn a_scrape_counts_semaphore_holders_and_the_semaphore_refusals() {
    let (node, metrics) = metrics_node(&["--threads", "1"]);
    let before = scrape(metrics);
    let mut a = node.client();
    assert!(a.ask("A sem 30 0 3").starts_with("A "));
    assert!(a.ask("A sem 30 0 3 me").starts_with("A "));
    a.acquire_now("mutex", "30");
    assert_eq!(a.ask("A sem 30 0 2"), "E A sem limit-mismatch");
    assert_eq!(a.ask("A other 30 0 0"), "E A other bad-limit");
    assert_eq!(a.ask("A other 30 0 1 a\x7fb"), "E A other bad-value");
    let after = scrape(metrics);
    let moved = |name: &str| after.get(name) - before.get(name);
    assert_eq!(after.get("baton_held_keys"), 2.0, "two keys");
    assert_eq!(after.get("baton_holders"), 3.0, "three grants");
    assert_eq!(
        moved("baton_refusals_total{reason=\"limit-mismatch\"}"),
        1.0
    );
    assert_eq!(moved("baton_refusals_total{reason=\"bad-limit\"}"), 1.0);
    assert_eq!(moved("baton_refusals_total{reason=\"bad-value\"}"), 1.0);
    assert_eq!(
        moved("baton_refusals_total{reason=\"too-many-watches\"}"),
        0.0
    );
}

/// Read until the server closes the connection (EOF or reset), failing
/// the test if it does not within the deadline; what it sent.
fn status_then_close(stream: &mut TcpStream) -> String {
    stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let mut got = Vec::new();
    let start = Instant::now();
    let mut chunk = [0u8; 1024];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
        }
        assert!(start.elapsed() < DEADLINE, "the server never closed");
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[test]
fn bad_http_is_refused_or_cut_off_and_the_lock_port_does_not_notice() {
    let (node, metrics) = metrics_node(&[]);
    let mut client = node.client();
    let token = client.acquire_now("held", "60");

    let cases: [(&[u8], u16); 8] = [
        (b"hello there\r\n\r\n", 400),
        (b"\x00\x01\x02\xff\r\n", 400),
        (
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi",
            405,
        ),
        (b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 405),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 404),
        (b"GET /metrics/../etc HTTP/1.1\r\nHost: x\r\n\r\n", 404),
        (b"GET /metrics HTTP/1.1\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", 400),
    ];
    for (request, want) in cases {
        let (code, _) = exchange(metrics, request);
        assert_eq!(code, want, "{:?}", String::from_utf8_lossy(request));
    }
    // A head past the limit.
    let long = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Long: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    assert_eq!(exchange(metrics, long.as_bytes()).0, 431);

    // Slowloris: a head that never ends, trickled in, is cut off.
    let mut slow = TcpStream::connect(metrics).expect("connect");
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .expect("write");
    slow.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let start = Instant::now();
    let mut chunk = [0u8; 256];
    loop {
        assert!(
            start.elapsed() < DEADLINE,
            "a slow client was never cut off"
        );
        if slow.write_all(b"X-Slow: 1\r\n").is_err() {
            break;
        }
        match slow.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => panic!("a slow client got an answer: {:?}", &chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    // A client that connects and says nothing is cut off too.
    let mut silent = TcpStream::connect(metrics).expect("connect");
    assert_eq!(status_then_close(&mut silent), "");
    // The lock port did not notice any of it.
    assert_eq!(client.query("held").token, token);

    // Connections at once are bounded: of 20 opened before any speaks, at
    // most 16 are served; the rest are closed without an answer.
    let mut many: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(metrics).expect("connect"))
        .collect();
    let mut served = 0;
    for stream in &mut many {
        let _ = stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    for stream in &mut many {
        let said = status_then_close(stream);
        if said.starts_with("HTTP/1.1 200 OK\r\n") {
            served += 1;
        } else {
            assert_eq!(said, "", "refused connections get no answer");
        }
    }
    assert!((1..=16).contains(&served), "{served} of 20 served");
    drop(many);

    // Afterwards everything still works, on both ports (once the server
    // has seen the 20 go).
    let after = wait_for("a scrape to be served again", DEADLINE, || {
        let (code, body) = try_exchange(metrics, GET)?;
        (code == 200).then(|| parse_exposition(&body))
    });
    assert_eq!(after.get("baton_held_keys"), 1.0);
    assert_eq!(client.ask(&format!("R held {token}")), "R held");
    let mut other = LineClient::connect(node.addr);
    other.acquire_now("held", "1");
}

/// The TCP ports process `pid` listens on (its sockets in LISTEN state).
fn listening_ports(pid: u32) -> Vec<u16> {
    let mut inodes = HashSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).expect("read fds") {
        let Ok(fd) = fd else { continue };
        if let Ok(target) = std::fs::read_link(fd.path()) {
            let target = target.to_string_lossy().into_owned();
            if let Some(inode) = target
                .strip_prefix("socket:[")
                .and_then(|t| t.strip_suffix(']'))
            {
                inodes.insert(inode.to_string());
            }
        }
    }
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address, st (0A: LISTEN), inode.
            if f.len() > 9 && f[3] == "0A" && inodes.contains(f[9]) {
                let port = f[1].rsplit(':').next().expect("port");
                ports.push(u16::from_str_radix(port, 16).expect("hex port"));
            }
        }
    }
    ports.sort_unstable();
    ports
}

#[test]
fn without_the_flag_only_the_client_port_listens() {
    let plain = Node::start(&[]);
    assert_eq!(listening_ports(plain.pid()), vec![plain.addr.port()]);
    let (with, metrics) = metrics_node(&[]);
    let mut want = vec![with.addr.port(), metrics.port()];
    want.sort_unstable();
    assert_eq!(listening_ports(with.pid()), want);
}

#[test]
fn a_two_node_cluster_shows_roles_standbys_lag_and_a_failover() {
    let (first, second, [m0, m1]) = two_nodes_with_metrics(&["--detect", "0.3"]);

    let active = wait_for("node 0 active with a synced standby", DEADLINE, || {
        let s = scrape(m0);
        (s.get("baton_role{role=\"active\"}") == 1.0 && s.get("baton_standbys") == 1.0).then_some(s)
    });
    assert_eq!(active.get("baton_role{role=\"standby\"}"), 0.0);
    assert_eq!(active.get("baton_replication_lag_seconds"), 0.0);
    let standby = wait_for("node 1 a standby", DEADLINE, || {
        let s = scrape(m1);
        (s.get("baton_role{role=\"standby\"}") == 1.0).then_some(s)
    });
    assert_eq!(standby.get("baton_role{role=\"active\"}"), 0.0);
    assert_eq!(standby.get("baton_standbys"), 0.0);
    assert!(standby.get("baton_replication_lag_seconds") >= 0.0);

    // A grant on the active is replicated: the standby's table holds it.
    let mut client = first.client();
    let token = client.acquire_now("k", "60");
    wait_for("the standby to hold the key", DEADLINE, || {
        let s = scrape(m1);
        (s.get("baton_held_keys") == 1.0 && s.get_u64("baton_last_token") >= token).then_some(())
    });
    // The active goes; the standby takes over.
    drop(first);
    let promoted = wait_for("node 1 to take over", DEADLINE, || {
        let s = scrape(m1);
        (s.get("baton_role{role=\"active\"}") == 1.0).then_some(s)
    });
    // At least this promotion (a loaded machine may add a blip at start).
    assert!(promoted.get("baton_role_changes_total") >= 1.0);
    assert_eq!(promoted.get("baton_replication_lag_seconds"), 0.0);
    assert_eq!(promoted.get("baton_standbys"), 0.0);
    drop(second);
}

#[test]
fn u_lines_their_answers_and_auth_refusals_are_counted() {
    // U is answered by the I/O loops, never by the lock owner: its
    // requests, `U ok` answers and refusals must still reach the scrape.
    const SECRET: &str = "metrics-secret-0123456789";
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("metrics-auth-{}", std::process::id()));
    std::fs::write(&path, format!("{SECRET}\n")).expect("write the secrets");
    let auth_file = path.to_str().expect("a UTF-8 temp path");
    let (node, metrics) = metrics_node(&["--auth-file", auth_file]);
    let before = scrape(metrics);
    let mut good = LineClient::connect(node.addr);
    assert_eq!(good.ask(&format!("U {SECRET}")), "U ok");
    let mut bad = LineClient::connect(node.addr);
    assert_eq!(bad.ask("U wrong-secret-0123456789"), "E - - bad-auth");
    assert!(bad.closed_within(DEADLINE));
    let after = scrape(metrics);
    let moved = |name: &str| after.get(name) - before.get(name);
    assert_eq!(moved("baton_requests_total{op=\"auth\"}"), 2.0);
    assert_eq!(moved("baton_answers_total{kind=\"auth_ok\"}"), 1.0);
    assert_eq!(moved("baton_refusals_total{reason=\"bad-auth\"}"), 1.0);
    assert_eq!(moved("baton_answers_total{kind=\"error\"}"), 1.0);
    drop(node);
    let _ = std::fs::remove_file(&path);

    let (node, metrics) = metrics_node(&[]);
    let before = scrape(metrics);
    let mut open = node.client();
    assert_eq!(open.ask(&format!("U {SECRET}")), "E U - auth-disabled");
    let after = scrape(metrics);
    let moved = |name: &str| after.get(name) - before.get(name);
    assert_eq!(moved("baton_requests_total{op=\"auth\"}"), 1.0);
    assert_eq!(moved("baton_refusals_total{reason=\"auth-disabled\"}"), 1.0);
    assert_eq!(moved("baton_answers_total{kind=\"error\"}"), 1.0);
}

/// A cluster node keeps a few slots past `--max-conns` for its peers: a
/// client that lands in one is refused with `E - - too-many-connections`
/// at once if it speaks (its line is no peer's), or when the slot's time
/// to show a peer line is up if it does not. Both refusals are counted.
#[test]
fn refusals_past_max_conns_on_a_cluster_node_are_counted() {
    let ports = [free_port(), free_port()];
    let peers = format!("127.0.0.1:{},127.0.0.1:{}", ports[0], ports[1]);
    let metrics_port = free_port();
    let metrics: SocketAddr = format!("127.0.0.1:{metrics_port}").parse().expect("addr");
    let listen = metrics.to_string();
    // Alone (its peer never starts): active once discovery ends.
    let flags = [
        "--cluster-key-file",
        common::cluster_key_file(),
        "--detect",
        "0.3",
        "--max-conns",
        "2",
        "--metrics",
        listen.as_str(),
    ];
    let node = start_node(ports[0], &peers, &flags, &[]);
    let mut first = node.client();
    wait_for("the node to serve", DEADLINE, || {
        first.info().contains("role=active").then_some(())
    });
    let mut second = node.client();
    assert!(second.info().contains("role=active"));
    let before = scrape(metrics);
    let mut speaks = node.client();
    assert_eq!(speaks.ask("I"), "E - - too-many-connections");
    assert!(speaks.closed_within(DEADLINE));
    let mut silent = node.client();
    assert_eq!(silent.recv(), "E - - too-many-connections");
    assert!(silent.closed_within(DEADLINE));
    let after = scrape(metrics);
    let moved = |name: &str| after.get(name) - before.get(name);
    assert_eq!(
        moved("baton_refusals_total{reason=\"too-many-connections\"}"),
        2.0
    );
    // The two clients in --max-conns are still served.
    assert!(first.info().contains("role=active"));
    assert!(second.info().contains("role=active"));
}

#[test]
fn watches_are_counted_with_their_lines_and_refusals() {
    let (node, metrics) = metrics_node(&["--max-watches", "1"]);
    let before = scrape(metrics);
    assert_eq!(before.get("baton_watches"), 0.0);
    let mut w = node.client();
    assert_eq!(w.ask("W k"), "W k 0 0 0 -");
    assert_eq!(w.ask("W j"), "E W j too-many-watches");
    let token = node.client().acquire_now("k", "30");
    assert_eq!(w.recv(), format!("W k {token} 1 0 -"));
    let after = scrape(metrics);
    let moved = |name: &str| after.get(name) - before.get(name);
    assert_eq!(after.get("baton_watches"), 1.0);
    assert_eq!(
        moved("baton_watch_lines_total"),
        2.0,
        "an answer and a change"
    );
    assert_eq!(moved("baton_watch_lines_skipped_total"), 0.0);
    assert_eq!(moved("baton_requests_total{op=\"watch\"}"), 2.0);
    assert_eq!(moved("baton_answers_total{kind=\"watched\"}"), 1.0);
    assert_eq!(
        moved("baton_refusals_total{reason=\"too-many-watches\"}"),
        1.0
    );
    assert_eq!(w.ask("X k"), "X k");
    wait_for("the watch to go", DEADLINE, || {
        (scrape(metrics).get("baton_watches") == 0.0).then_some(())
    });
}
