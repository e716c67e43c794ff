//! The load harness's etcd client (benches/lockbench/http.rs and etcd.rs):
//! the load generator is a bench target without a test harness, so this
//! test crate includes the files to test them.
//!
//! The HTTP and JSON readings are tested on canned answers (whole, split
//! into one-byte reads, chunked across messages, and bad ones). One test
//! runs the etcd side of the etcd rows (a short uncontended and contended
//! lock run, and a few election handoffs) against a real one-member etcd
//! on loopback ports, with its data in a temporary directory, killed by
//! PID (and the directory removed) when the test ends or fails. Without
//! `etcd` on PATH that test says it skips and passes, unless
//! `BATON_REQUIRE_ETCD=1`: then it fails. It is bounded (90 s); it checks
//! what the rows count, never how fast.

mod common;

#[allow(dead_code)]
#[path = "../benches/lockbench/http.rs"]
mod http;

#[allow(dead_code)]
#[path = "../benches/lockbench/etcd.rs"]
mod etcd;

use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::on_path;
use http::{Framing, Reader, Response};

/// A reader that gives out at most `step` bytes per read.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fn readers(data: &[u8]) -> Vec<Reader<Trickle<'_>>> {
    [1, 7, 1 << 20]
        .into_iter()
        .map(|step| Reader::new(Trickle { data, step }))
        .collect()
}

const LOCK_ANSWER: &str = "{\"header\":{\"cluster_id\":\"324952591200643719\",\
\"member_id\":\"3319814642761637952\",\"revision\":\"2\",\"raft_term\":\"2\"},\
\"key\":\"bXlsb2NrLzIwNDBhMjRhNzEwOTc5MDU=\"}";

#[test]
fn content_length_answers_read_one_after_another_on_a_connection() {
    let canned = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{LOCK_ANSWER}\
         HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{{}}",
        LOCK_ANSWER.len()
    );
    for mut reader in readers(canned.as_bytes()) {
        let first = reader.response().expect("first answer");
        assert_eq!(first.status, 200);
        let value = etcd::json_of(&first).expect("JSON");
        assert_eq!(
            etcd::bytes_field(&value, "key").expect("key"),
            b"mylock/2040a24a71097905"
        );
        let second = reader.response().expect("second answer");
        assert_eq!(second.body, b"{}");
        assert!(reader.response().is_err(), "the stream has ended");
    }
}

#[test]
fn chunked_answers_join_their_chunks_and_skip_extensions_and_trailers() {
    let canned = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
        5;ext=1\r\n{\"a\":\r\nA\r\n\"123456789\r\n1\r\n}\r\n0\r\nX-Trailer: y\r\n\r\n\
        HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n";
    for mut reader in readers(canned) {
        let answer = reader.response().expect("chunked answer");
        assert_eq!(
            answer,
            Response {
                status: 200,
                body: b"{\"a\":\"123456789}".to_vec()
            }
        );
        assert_eq!(reader.response().expect("next").status, 204);
    }
}

/// The gateway streams `observe` as newline-ended JSON messages in chunks
/// that need not match them.
#[test]
fn a_stream_gives_whole_messages_however_the_chunks_cut_them() {
    let one = "{\"result\":{\"header\":{\"revision\":\"3\"},\"kv\":{\"key\":\"ZWwvMQ==\",\
               \"create_revision\":\"3\",\"value\":\"QQ==\",\"lease\":\"7\"}}}";
    let two = "{\"result\":{\"kv\":{\"key\":\"ZWwvMg==\",\"value\":\"Yy0x\"}}}";
    let three = "{\"result\":{\"kv\":{\"key\":\"ZWwvMw==\"}}}";
    let body = format!("{one}\n{two}\n{three}\n");
    // Cut the body at two places that split messages.
    let (a, rest) = body.split_at(10);
    let (b, c) = rest.split_at(one.len() + 5);
    let mut canned = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_string();
    for piece in [a, b, c] {
        canned.push_str(&format!("{:x}\r\n{piece}\r\n", piece.len()));
    }
    canned.push_str("0\r\n\r\n");
    for mut reader in readers(canned.as_bytes()) {
        let head = reader.head().expect("head");
        assert_eq!(head.framing, Framing::Chunked);
        let got: Vec<Vec<u8>> = std::iter::from_fn(|| reader.message().expect("message"))
            .map(|m| etcd::observed_value(&m).expect("a leader"))
            .collect();
        assert_eq!(got, [b"A".to_vec(), b"c-1".to_vec(), Vec::new()]);
    }
}

#[test]
fn bad_heads_chunks_and_sizes_are_errors() {
    let bad: [&[u8]; 7] = [
        b"HTTP/2 200 OK\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
    ];
    for canned in bad {
        for mut reader in readers(canned) {
            assert!(
                reader.response().is_err(),
                "{:?} was read",
                String::from_utf8_lossy(canned)
            );
        }
    }
    // An endless head is cut at the bound, not buffered.
    let endless = vec![b'a'; http::MAX_HEAD + 10];
    assert!(Reader::new(&endless[..]).response().is_err());
    // Neither length nor chunks: refused (keep-alive could not go on).
    let no_length: &[u8] = b"HTTP/1.1 200 OK\r\n\r\n{}";
    assert!(Reader::new(no_length).response().is_err());
}

#[test]
fn base64_round_trips_and_refuses_other_bytes() {
    for (plain, coded) in [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("fooba", "Zm9vYmE="),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(etcd::b64(plain.as_bytes()), coded);
        assert_eq!(etcd::unb64(coded).expect("base64"), plain.as_bytes());
    }
    let all: Vec<u8> = (0..=255).collect();
    assert_eq!(etcd::unb64(&etcd::b64(&all)).expect("round trip"), all);
    for bad in ["Zm9v!", "Z", "Zm9vY", "é"] {
        assert!(etcd::unb64(bad).is_err(), "{bad:?} was read");
    }
}

#[test]
fn gateway_errors_and_numbers_are_read_as_the_gateway_writes_them() {
    let error = Response {
        status: 503,
        body: br#"{"error":"etcdserver: no leader","code":14,"message":"etcdserver: no leader"}"#
            .to_vec(),
    };
    let e = etcd::json_of(&error).expect_err("an error answer");
    assert!(e.contains("503") && e.contains("no leader"), "{e}");
    let in_200 = Response {
        status: 200,
        body: br#"{"error":"context canceled"}"#.to_vec(),
    };
    assert!(etcd::json_of(&in_200).is_err());
    let not_json = Response {
        status: 502,
        body: b"Bad Gateway".to_vec(),
    };
    assert!(etcd::json_of(&not_json).is_err());
    let status: serde_json::Value = serde_json::from_str(
        r#"{"header":{"cluster_id":"1","member_id":"3319814642761637952","revision":"3"},
            "version":"3.4.23","leader":"3319814642761637952","raftTerm":"2"}"#,
    )
    .expect("JSON");
    assert_eq!(
        etcd::parse_status(&status).expect("status"),
        (3319814642761637952, 3319814642761637952)
    );
    let number: serde_json::Value = serde_json::from_str(r#"{"ID": 42, "bad": "4x"}"#).unwrap();
    assert_eq!(etcd::int_field(&number, "ID"), Ok(42));
    assert!(etcd::int_field(&number, "bad").is_err());
    assert!(etcd::int_field(&number, "missing").is_err());
    assert!(etcd::observed_value(br#"{"error":{"grpc_code":1}}"#).is_err());
    assert!(etcd::observed_value(b"{not json").is_err());
}

// ---------------------------------------------------------------------------
// One etcd row against a real etcd
// ---------------------------------------------------------------------------

/// The whole live test, etcd's start included.
const TEST_BOUND: Duration = Duration::from_secs(90);

/// A one-member etcd, killed by PID and its directory removed on drop.
struct Etcd {
    child: Child,
    dir: PathBuf,
    client: SocketAddr,
}

impl Etcd {
    fn start(program: &PathBuf) -> Etcd {
        // Two free ports: bound together so they differ, let go just before
        // etcd binds them.
        let listeners: Vec<TcpListener> = (0..2)
            .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free port"))
            .collect();
        let ports: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().expect("bound").port())
            .collect();
        drop(listeners);
        let dir = std::env::temp_dir().join(format!(
            "baton-etcd-test-{}-{}",
            std::process::id(),
            ports[0]
        ));
        let client_url = format!("http://127.0.0.1:{}", ports[0]);
        let peer_url = format!("http://127.0.0.1:{}", ports[1]);
        let child = Command::new(program)
            .args(["--name", "t0", "--data-dir"])
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("t0={peer_url}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn etcd");
        Etcd {
            child,
            dir,
            client: SocketAddr::from(([127, 0, 0, 1], ports[0])),
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        // Only a child not reaped yet still owns its PID.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The etcd side of the etcd rows, run for a moment: every lock is
/// counted once, none fails, and each election handoff reaches the
/// observer.
#[test]
fn the_etcd_rows_run_against_a_real_etcd() {
    let Some(program) = on_path("etcd") else {
        assert!(
            std::env::var("BATON_REQUIRE_ETCD").as_deref() != Ok("1"),
            "BATON_REQUIRE_ETCD=1 but etcd is not on PATH"
        );
        println!(
            "skipping the live etcd test: etcd not on PATH (Debian: apt-get install etcd-server)"
        );
        return;
    };
    let started = Instant::now();
    let etcd = Etcd::start(&program);
    let addr = etcd.client;
    // Ready once it answers a status with a leader.
    loop {
        let ready = etcd::Client::connect(addr, Duration::from_secs(2))
            .and_then(|mut c| c.status())
            .is_ok_and(|(_, leader)| leader != 0);
        if ready {
            break;
        }
        assert!(
            started.elapsed() < TEST_BOUND / 2,
            "etcd did not answer within {:?}",
            TEST_BOUND / 2
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The rows in a thread, so that the test's bound holds even if etcd
    // stops answering (each call also has its own timeout).
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let window = Duration::from_millis(300);
        let rows = (|| {
            let uncontended =
                etcd::lock_run(addr, 2, etcd::LockLoad::Uncontended, window, window, "t:")?;
            let contended =
                etcd::lock_run(addr, 3, etcd::LockLoad::Contended, window, window, "t:")?;
            let election = etcd::election_run(addr, "t:el", 3)?;
            Ok::<_, String>((uncontended, contended, election))
        })();
        let _ = done_tx.send(rows);
    });
    let left = TEST_BOUND.saturating_sub(started.elapsed());
    let (uncontended, contended, election) = done_rx
        .recv_timeout(left)
        .unwrap_or_else(|_| panic!("the etcd rows did not end within {TEST_BOUND:?}"))
        .expect("the etcd rows ran");
    for (name, m) in [("uncontended", &uncontended), ("contended", &contended)] {
        assert_eq!(m.errors, 0, "{name}: {:?}", m.first_error);
        assert!(m.grants > 0 && m.pairs > 0, "{name}: nothing counted");
        assert_eq!(m.acquire.len(), m.grants, "{name}: a latency per grant");
        assert_eq!(m.per_client.iter().sum::<u64>(), m.grants, "{name}");
    }
    assert_eq!(uncontended.per_client.len(), 2);
    assert_eq!(contended.per_client.len(), 3);
    assert_eq!(election.len(), 3, "one time per handoff");
    drop(etcd);
}
