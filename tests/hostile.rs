//! Hostile-client reliability tests (docs/protocol.md: bad input never
//! crashes the server or affects other connections; a slow or silent client
//! holds nothing but its own socket; limits answer with a clear `E`, never
//! with unbounded memory).
//!
//! - a storm of random bytes and almost-valid lines from several
//!   connections, while a well-behaved client's latency is measured;
//! - property tests of the wire parser (round trips, no panics, framing that
//!   stays in step whatever came before);
//! - thousands of idle connections up to `--max-conns`, a clear refusal
//!   past it, and what an idle connection keeps after a burst;
//! - connections flooding `I` without reading: the node's memory stays
//!   bounded and another client is still answered;
//! - slowloris clients, finishing their lines a byte at a time (up to and
//!   past the longest line allowed) or never;
//! - a million held keys and a hundred thousand waiters, with the memory
//!   they take measured.
//!
//! The randomised tests print their seed (`BATON_TEST_SEED=<seed>` replays
//! one). Tests that start a node take [`one_node_test_at_a_time`] so that
//! their measurements do not disturb each other. To see the numbers:
//! `cargo test --release --test hostile -- --nocapture`.

mod common;

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use baton::protocol::{
    self, ANSWER_KINDS, Answer, AnswerKind, Info, KNOWN_REASONS, Key, LineError, MAX_KEY, MAX_LINE,
    OPS, Op, Parsed, Reason, Request, Secret, Value, WatchState,
};
use common::rng::Rng;
use common::{
    DEADLINE, Latencies, LineClient, Node, Query, info_field, raise_fd_limit, test_seed, token_of,
    wait_for,
};

/// A generous bound on a well-behaved client's p99 round trip under hostile
/// load: the machine is shared and noisy, so this only catches a server
/// that stalls its good clients, not one that is merely slower.
const LOOSE_P99: Duration = Duration::from_millis(500);

/// A well-behaved client's pause between two acquire/release cycles, so
/// that its round trips sample a whole period evenly, not mostly the
/// moments when the node happens to be quick.
const CLIENT_PACE: Duration = Duration::from_millis(2);

static NODE_TESTS: Mutex<()> = Mutex::new(());

/// Held by every test that starts a node, so that one test's load does not
/// show up in another's latency or memory numbers.
fn one_node_test_at_a_time() -> MutexGuard<'static, ()> {
    NODE_TESTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Acquire and release `key` on `client`, each round trip timed into `lat`.
fn acquire_release(client: &mut LineClient, key: &str, lease: &str, lat: &mut Latencies) {
    let answer = lat.time(|| client.ask(&format!("A {key} {lease} 0")));
    let token = token_of(&answer);
    assert_eq!(answer, format!("A {token} {key}"), "grant names the key");
    let answer = lat.time(|| client.ask(&format!("R {key} {token}")));
    assert_eq!(answer, format!("R {key}"), "release of {key} {token}");
}

/// A number from an `I` answer.
fn info_number(info: &str, name: &str) -> u64 {
    info_field(info, name)
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no number {name}= in {info:?}"))
}

/// Poll `I` on `client` until `name=` is `want` for every pair; the last `I`.
fn wait_for_info(client: &mut LineClient, want: &[(&str, u64)]) -> String {
    let what = format!("I to show {want:?}");
    wait_for(&what, DEADLINE, || {
        let info = client.info();
        want.iter()
            .all(|&(name, value)| info_number(&info, name) == value)
            .then_some(info)
    })
}

fn assert_p99_loose(what: &str, lat: &Latencies) {
    assert!(
        lat.percentile(99.0) < LOOSE_P99,
        "{what}: p99 round trip {:?} is over {LOOSE_P99:?} ({})",
        lat.percentile(99.0),
        lat.summary()
    );
}

// ---------------------------------------------------------------------------
// Almost-valid lines: a valid request with one mutation
// ---------------------------------------------------------------------------

/// Numbers that are out of range or not numbers at all, for any of lease,
/// wait and token (the storm node runs with `--max-lease 2`).
const BAD_NUMBERS: &[&str] = &[
    "0",
    "2.001",
    "3",
    "86401",
    "18446744073709551616",
    "99999999999999999999999",
    "-1",
    "+1",
    "1e3",
    "1.0001",
    ".5",
    "5.",
    "0x10",
    "1,5",
    "\u{0661}",
    "",
];

/// Join fields with single spaces.
fn join_fields(fields: &[Vec<u8>]) -> Vec<u8> {
    fields.join(&b' ')
}

/// Mutations that never make a line the server cannot understand (the
/// connection stays open): a field duplicated, a number out of range, a key
/// too long, a forbidden byte in the key.
const GENTLE_MUTATIONS: [u64; 4] = [2, 3, 4, 9];

/// The line of `fields` (valid request fields, op first, no line ending)
/// with exactly one random mutation, ending in `\n` unless the mutation is
/// to drop it. Many mutations give lines the server refuses (`E op key
/// reason`, connection kept), some give lines it does not understand (`E - -
/// reason`, connection closed), and a few happen to stay valid.
fn mutate(rng: &mut Rng, fields: Vec<Vec<u8>>) -> Vec<u8> {
    let kind = rng.below(13);
    mutate_with(rng, kind, fields)
}

/// Like [`mutate`], with one of the [`GENTLE_MUTATIONS`].
fn mutate_gently(rng: &mut Rng, fields: Vec<Vec<u8>>) -> Vec<u8> {
    let kind = *rng.pick(&GENTLE_MUTATIONS);
    mutate_with(rng, kind, fields)
}

/// Mutation number `kind` (0 to 12) of the line of `fields`.
fn mutate_with(rng: &mut Rng, kind: u64, mut fields: Vec<Vec<u8>>) -> Vec<u8> {
    let mut newline = true;
    let line = match kind {
        // A byte flipped to any other value.
        0 => {
            let mut line = join_fields(&fields);
            let at = rng.index(line.len());
            line[at] ^= rng.between(1, 255) as u8;
            line
        }
        // A field dropped (the op included).
        1 => {
            let at = rng.index(fields.len());
            fields.remove(at);
            join_fields(&fields)
        }
        // A field duplicated.
        2 => {
            let at = rng.index(fields.len());
            let copy = fields[at].clone();
            fields.insert(at, copy);
            join_fields(&fields)
        }
        // A number out of range, or not a number.
        3 => {
            let bad = rng.pick(BAD_NUMBERS).as_bytes().to_vec();
            if fields.len() > 2 {
                let at = rng.between(2, fields.len() as u64 - 1) as usize;
                fields[at] = bad;
            } else {
                fields.push(bad);
            }
            join_fields(&fields)
        }
        // A key too long (the line still fits).
        4 => {
            let long = vec![b'k'; rng.between(MAX_KEY as u64 + 1, 600) as usize];
            match fields.get_mut(1) {
                Some(key) => *key = long,
                None => fields.push(long),
            }
            join_fields(&fields)
        }
        // A line too long.
        5 => {
            let long = vec![b'L'; MAX_LINE + rng.index(200)];
            fields.insert(1.min(fields.len()), long);
            join_fields(&fields)
        }
        // A \r in the middle.
        6 => {
            let mut line = join_fields(&fields);
            let at = rng.index(line.len() + 1);
            line.insert(at, b'\r');
            line
        }
        // A separator changed: two spaces, a tab, a leading or trailing space.
        7 => {
            let line = join_fields(&fields);
            let spaces: Vec<usize> = (0..line.len()).filter(|&i| line[i] == b' ').collect();
            match rng.below(4) {
                0 if !spaces.is_empty() => {
                    let mut line = line;
                    line.insert(*rng.pick(&spaces), b' ');
                    line
                }
                1 if !spaces.is_empty() => {
                    let mut line = line;
                    line[*rng.pick(&spaces)] = b'\t';
                    line
                }
                2 => [b" ".as_slice(), &line].concat(),
                _ => [line.as_slice(), b" "].concat(),
            }
        }
        // The op changed: lowercase, another letter, doubled, empty.
        8 => {
            let op = fields[0][0];
            fields[0] = match rng.below(4) {
                0 => vec![op.to_ascii_lowercase()],
                1 => vec![*rng.pick(b"BCEMNTXZ")],
                2 => vec![op, op],
                _ => Vec::new(),
            };
            join_fields(&fields)
        }
        // A forbidden byte in the key (or 0xFF, which is allowed).
        9 => {
            let byte = *rng.pick(&[0x00, 0x01, 0x1F, 0x7F, b'\t', 0xFF]);
            match fields.get_mut(1) {
                Some(key) => {
                    let at = rng.index(key.len() + 1);
                    key.insert(at, byte);
                }
                None => fields.push(vec![byte]),
            }
            join_fields(&fields)
        }
        // The newline dropped: the line runs into the next one.
        10 => {
            newline = false;
            join_fields(&fields)
        }
        // A newline in the middle: the line is cut in two.
        11 => {
            let mut line = join_fields(&fields);
            let at = rng.index(line.len() + 1);
            line.insert(at, b'\n');
            line
        }
        // Cut short.
        _ => {
            let mut line = join_fields(&fields);
            line.truncate(rng.index(line.len() + 1));
            line
        }
    };
    let mut line = line;
    if newline {
        line.push(b'\n');
    }
    line
}

/// The fields of a request as `Request::write_to` writes it.
fn request_fields(request: &Request) -> Vec<Vec<u8>> {
    let mut line = Vec::new();
    request.write_to(&mut line);
    line.pop();
    line.split(|&b| b == b' ').map(<[u8]>::to_vec).collect()
}

// ---------------------------------------------------------------------------
// 1. A storm of random bytes and almost-valid lines
// ---------------------------------------------------------------------------

/// The storm node's `--max-lease`: short, so that whatever the storm manages
/// to acquire runs out soon after it ends.
const STORM_MAX_LEASE: &str = "2";
const STORM_CLIENTS: u64 = 6;
const STORM_TIME: Duration = Duration::from_secs(2);
/// How long a storm client reads answers after a burst before sending more.
const STORM_READ_PAUSE: Duration = Duration::from_millis(2);

#[derive(Debug, Default)]
struct StormStats {
    connections: u64,
    connect_failures: u64,
    bytes: u64,
    closed_by_server: u64,
    answers: u64,
    refusals: u64,
    /// Answer lines that do not parse as an answer (should be none).
    malformed: Vec<String>,
}

impl StormStats {
    fn add(&mut self, other: StormStats) {
        self.connections += other.connections;
        self.connect_failures += other.connect_failures;
        self.bytes += other.bytes;
        self.closed_by_server += other.closed_by_server;
        self.answers += other.answers;
        self.refusals += other.refusals;
        self.malformed.extend(other.malformed);
    }
}

/// A valid request on the storm's keys, as fields.
fn storm_request(rng: &mut Rng) -> Vec<Vec<u8>> {
    let key = format!("s{}", rng.below(32));
    let token = match rng.below(3) {
        0 => rng.between(1, 1000),
        _ => rng.between(1, u64::MAX),
    }
    .to_string();
    let lease = *rng.pick(&["0.25", "0.5", "1", "1.5", "2"]);
    let wait = *rng.pick(&["0", "0.05", "0.5", "2"]);
    let fields: Vec<&str> = match rng.below(6) {
        0 | 1 => vec!["A", key.as_str(), lease, wait],
        2 => vec!["R", key.as_str(), token.as_str()],
        3 => vec!["K", key.as_str(), token.as_str(), lease],
        4 => vec!["Q", key.as_str()],
        _ => vec!["I"],
    };
    fields.iter().map(|f| f.as_bytes().to_vec()).collect()
}

/// Bytes of noise: random bytes, bytes from the protocol's alphabet, and
/// now and then a valid line so that the noise gets past the first check.
fn storm_noise(rng: &mut Rng) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ARKQIETNM -=.:0123456789\r\n\x7f\x00\t\xff";
    let mut out = Vec::new();
    let len = rng.between(1, 4096) as usize;
    while out.len() < len {
        match rng.below(3) {
            0 => {
                let len = rng.between(1, 64) as usize;
                out.extend(rng.bytes(len));
            }
            1 => {
                for _ in 0..rng.between(1, 64) {
                    out.push(*rng.pick(ALPHABET));
                }
            }
            _ => {
                out.extend(join_fields(&storm_request(rng)));
                out.push(b'\n');
            }
        }
    }
    out
}

/// Read what the server has sent within `STORM_READ_PAUSE`, checking that
/// every complete line is a well-formed answer. False once the server has
/// closed the connection (or reset it).
fn storm_drain(stream: &mut TcpStream, pending: &mut Vec<u8>, stats: &mut StormStats) -> bool {
    let mut chunk = [0u8; 16 * 1024];
    let open = loop {
        match stream.read(&mut chunk) {
            Ok(0) => break false,
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                break true;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break false,
        }
    };
    let mut rest = pending.as_slice();
    while let Some(end) = rest.iter().position(|&b| b == b'\n') {
        let line = &rest[..=end];
        stats.answers += 1;
        match protocol::parse_answer(line) {
            Parsed::Line {
                result: Ok(Answer::Error { .. }),
                ..
            } => stats.refusals += 1,
            Parsed::Line { result: Ok(_), .. } => {}
            _ => {
                if stats.malformed.len() < 10 {
                    stats
                        .malformed
                        .push(String::from_utf8_lossy(line).into_owned());
                }
            }
        }
        rest = &rest[end + 1..];
    }
    let used = pending.len() - rest.len();
    pending.drain(..used);
    open
}

/// One hostile client: connects again and again until `until`, each time
/// sending a few bursts and reading what comes back, then hanging up
/// (sometimes in the middle of a line). A `gentle` one sends long bursts of
/// almost-valid lines that the server only refuses, so it parses many lines
/// per connection; the others send noise or lines with any mutation, which
/// the server soon hangs up on, so they connect many times.
fn storm_client(addr: SocketAddr, seed: u64, gentle: bool, until: Instant) -> StormStats {
    let mut rng = Rng::new(seed);
    let mut stats = StormStats::default();
    while Instant::now() < until {
        let mut stream = match TcpStream::connect_timeout(&addr, DEADLINE) {
            Ok(stream) => stream,
            Err(_) => {
                stats.connect_failures += 1;
                continue;
            }
        };
        stats.connections += 1;
        let _ = stream.set_nodelay(true);
        let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
        let _ = stream.set_read_timeout(Some(STORM_READ_PAUSE));
        let noisy = !gentle && rng.chance(1, 2);
        let mut pending = Vec::new();
        let mut open = true;
        for _ in 0..rng.between(1, 8) {
            let burst = if noisy {
                storm_noise(&mut rng)
            } else {
                let mut burst = Vec::new();
                for _ in 0..rng.between(1, if gentle { 256 } else { 64 }) {
                    let request = storm_request(&mut rng);
                    burst.extend(if gentle {
                        mutate_gently(&mut rng, request)
                    } else {
                        mutate(&mut rng, request)
                    });
                }
                burst
            };
            if stream.write_all(&burst).is_err() {
                open = false;
                break;
            }
            stats.bytes += burst.len() as u64;
            open = storm_drain(&mut stream, &mut pending, &mut stats);
            if !open {
                break;
            }
        }
        if !open {
            stats.closed_by_server += 1;
        } else if rng.chance(1, 4) {
            let _ = stream.write_all(b"A s1 1");
        }
    }
    stats
}

#[test]
fn a_storm_of_random_and_almost_valid_lines_does_not_disturb_a_well_behaved_client() {
    let _one = one_node_test_at_a_time();
    let seed = test_seed("storm");
    let mut node = Node::start(&["--max-lease", STORM_MAX_LEASE]);
    let mut probe = node.client();

    let mut before = Latencies::new();
    for _ in 0..250 {
        acquire_release(&mut probe, "probe", STORM_MAX_LEASE, &mut before);
        std::thread::sleep(CLIENT_PACE);
    }

    let until = Instant::now() + STORM_TIME;
    let storm: Vec<JoinHandle<StormStats>> = (0..STORM_CLIENTS)
        .map(|i| {
            let addr = node.addr;
            let seed = seed.wrapping_add(i);
            let gentle = i % 2 == 1;
            std::thread::spawn(move || storm_client(addr, seed, gentle, until))
        })
        .collect();
    let mut during = Latencies::new();
    while Instant::now() < until {
        acquire_release(&mut probe, "probe", STORM_MAX_LEASE, &mut during);
        std::thread::sleep(CLIENT_PACE);
    }
    let mut stats = StormStats::default();
    for client in storm {
        stats.add(client.join().expect("storm client"));
    }

    println!(
        "storm: {STORM_CLIENTS} clients for {STORM_TIME:?}: {} connections ({} closed by the \
         server, {} connects failed), {} KiB sent, {} answer lines read ({} refusals)",
        stats.connections,
        stats.closed_by_server,
        stats.connect_failures,
        stats.bytes / 1024,
        stats.answers,
        stats.refusals
    );
    println!(
        "well-behaved client, per request, before the storm: {}",
        before.summary()
    );
    println!(
        "well-behaved client, per request, during the storm: {}",
        during.summary()
    );

    assert!(
        node.child.try_wait().expect("try_wait").is_none(),
        "batond died in the storm:\n{}",
        node.log()
    );
    assert!(
        stats.malformed.is_empty(),
        "the server sent lines that are not answers: {:?}",
        stats.malformed
    );
    assert!(
        stats.connections > STORM_CLIENTS && stats.refusals > 0,
        "the storm hardly happened: {stats:?}"
    );
    assert_p99_loose("during the storm", &during);

    // Afterwards: the storm's connections are gone, its waiters with them,
    // and every key it got has run out (leases are at most 2 s).
    let info = wait_for_info(&mut probe, &[("conns", 1), ("waiting", 0), ("held", 0)]);
    println!("after the storm: {info}");
    let mut after = Latencies::new();
    acquire_release(&mut probe, "probe", STORM_MAX_LEASE, &mut after);
    assert_eq!(probe.query("probe"), Query::FREE);
}

// ---------------------------------------------------------------------------
// 2. Property tests of the wire parser
// ---------------------------------------------------------------------------

/// Random cases per property.
const CASES: usize = 20_000;

/// Any op of the protocol's table.
fn arbitrary_op(rng: &mut Rng) -> Op {
    rng.pick(OPS).op
}

/// A `--max-lease` in milliseconds: the default, tiny ones, random ones and
/// the largest the parser can take.
fn arbitrary_max_ms(rng: &mut Rng) -> u64 {
    match rng.below(5) {
        0 => 86_400_000,
        1 => rng.between(1, 1000),
        2 => rng.between(1, 10_u64.pow(12)),
        3 => rng.between(1, u64::MAX),
        _ => u64::MAX,
    }
}

/// A valid key: 1 byte, 250 bytes or in between; printable ASCII, `-`
/// alone, or bytes >= 0x80 (which need not be UTF-8).
fn arbitrary_key(rng: &mut Rng) -> Key {
    if rng.chance(1, 20) {
        return Key::new(b"-").expect("- is a key");
    }
    let len = match rng.below(4) {
        0 => 1,
        1 => MAX_KEY,
        _ => rng.between(1, MAX_KEY as u64) as usize,
    };
    let bytes: Vec<u8> = (0..len)
        .map(|_| match rng.below(3) {
            0 => rng.between(0x80, 0xFF) as u8,
            _ => rng.between(0x21, 0x7E) as u8,
        })
        .collect();
    Key::new(&bytes).expect("generated keys are valid")
}

/// A token: never 0; edges (1, u64::MAX, powers of ten) and random values.
fn arbitrary_token(rng: &mut Rng) -> u64 {
    match rng.below(6) {
        0 => 1,
        1 => u64::MAX,
        2 => u64::MAX - rng.below(3),
        3 => 10_u64.pow(rng.below(20) as u32) - rng.below(2),
        4 => rng.between(1, 1000),
        _ => rng.between(1, u64::MAX),
    }
    .max(1)
}

/// Any u64, edges first.
fn arbitrary_u64(rng: &mut Rng) -> u64 {
    match rng.below(4) {
        0 => 0,
        1 => u64::MAX,
        _ => rng.next_u64() >> rng.below(64),
    }
}

/// A lease in `1..=max_ms`: the edges, whole seconds, and any millisecond.
fn arbitrary_lease_ms(rng: &mut Rng, max_ms: u64) -> u64 {
    let ms = match rng.below(6) {
        0 => 1,
        1 => max_ms,
        2 => max_ms - rng.below(max_ms.min(2)),
        3 => rng.between(1, 3) * 1000 + rng.below(3) - 1,
        4 => rng.between(1, max_ms / 1000 + 1).saturating_mul(1000),
        _ => rng.between(1, max_ms),
    };
    ms.clamp(1, max_ms)
}

/// A wait in `0..=max_ms`.
fn arbitrary_wait_ms(rng: &mut Rng, max_ms: u64) -> u64 {
    match rng.below(3) {
        0 => 0,
        _ => arbitrary_lease_ms(rng, max_ms),
    }
}

fn arbitrary_request(rng: &mut Rng, max_ms: u64) -> Request {
    match arbitrary_op(rng) {
        Op::Acquire => Request::Acquire {
            key: arbitrary_key(rng),
            lease_ms: arbitrary_lease_ms(rng, max_ms),
            wait_ms: arbitrary_wait_ms(rng, max_ms),
            limit: None,
            value: None,
        },
        Op::Release => Request::Release {
            key: arbitrary_key(rng),
            token: arbitrary_token(rng),
        },
        Op::Keep => Request::Keep {
            key: arbitrary_key(rng),
            token: arbitrary_token(rng),
            lease_ms: arbitrary_lease_ms(rng, max_ms),
        },
        Op::Query => Request::Query {
            key: arbitrary_key(rng),
        },
        Op::Info => Request::Info,
        Op::Watch => Request::Watch {
            key: arbitrary_key(rng),
        },
        Op::Unwatch => Request::Unwatch {
            key: arbitrary_key(rng),
        },
        Op::Auth => {
            let len = rng.between(1, 128) as usize;
            Request::Auth {
                secret: Secret::new(arbitrary_text(rng, len, ' ').as_bytes()),
            }
        }
    }
}

/// Printable UTF-8 without spaces or `exclude`, `len` chars (>= 1).
fn arbitrary_text(rng: &mut Rng, len: usize, exclude: char) -> String {
    const WIDE: &[char] = &['é', 'ß', 'Ж', '名', '→', '🔒'];
    let mut text = String::new();
    while text.chars().count() < len {
        let c = if rng.chance(1, 5) {
            *rng.pick(WIDE)
        } else {
            char::from(rng.between(0x21, 0x7E) as u8)
        };
        if c != exclude {
            text.push(c);
        }
    }
    text
}

/// An answer as the server may send it (the ambiguous `-` key is only
/// written for "no key", as the protocol module documents).
fn arbitrary_answer(rng: &mut Rng) -> Answer {
    match rng.pick(ANSWER_KINDS).kind {
        AnswerKind::Granted => Answer::Granted {
            token: arbitrary_token(rng),
            key: arbitrary_key(rng),
            slot: (rng.below(2) == 0).then(|| rng.below(10_000) as u32),
        },
        AnswerKind::Timeout => Answer::Timeout {
            key: arbitrary_key(rng),
        },
        AnswerKind::Released => Answer::Released {
            key: arbitrary_key(rng),
        },
        AnswerKind::NotHeld => Answer::NotHeld {
            key: arbitrary_key(rng),
        },
        AnswerKind::Kept => Answer::Kept {
            key: arbitrary_key(rng),
        },
        AnswerKind::Queried => Answer::Queried {
            key: arbitrary_key(rng),
            token: arbitrary_u64(rng),
            ms_left: arbitrary_u64(rng),
            waiting: arbitrary_u64(rng),
        },
        AnswerKind::Moved => {
            let op = arbitrary_op(rng);
            let active = match rng.below(3) {
                0 => None,
                1 => Some(format!("127.0.0.1:{}", rng.between(1, 65535))),
                _ => {
                    let len = rng.between(1, 64) as usize;
                    Some(arbitrary_text(rng, len, ' ')).filter(|host| host != "-")
                }
            };
            let key = op.is_keyed().then(|| arbitrary_key(rng));
            Answer::Moved { active, op, key }
        }
        AnswerKind::Error => {
            let op = if rng.chance(1, 3) {
                None
            } else {
                Some(arbitrary_op(rng))
            };
            // Every reason, `Other` included, equally likely.
            let reason = if rng.chance(1, 16) {
                Reason::Other
            } else {
                *rng.pick(&KNOWN_REASONS)
            };
            let no_key = !op.is_some_and(Op::is_keyed) || reason == Reason::BadKey;
            let key = (!no_key).then(|| arbitrary_key(rng));
            Answer::Error { op, key, reason }
        }
        AnswerKind::Info => {
            let mut pairs = Vec::new();
            for _ in 0..rng.below(13) {
                let len = rng.between(1, 12) as usize;
                let name = arbitrary_text(rng, len, '=');
                let len = rng.between(1, 20) as usize;
                let value = match rng.below(4) {
                    0 => String::new(),
                    _ => arbitrary_text(rng, len, ' '),
                };
                pairs.push((name, value));
            }
            // Keep the line within MAX_LINE.
            while answer_text(&Answer::Info(Info::from_pairs(pairs.clone()))).len() > MAX_LINE {
                pairs.pop();
            }
            Answer::Info(Info::from_pairs(pairs))
        }
        AnswerKind::AuthOk => Answer::AuthOk,
        AnswerKind::Watched => {
            // A value of `-` is written for none (the protocol module).
            let len = rng.between(1, 250) as usize;
            let value = Some(arbitrary_text(rng, len, ' '))
                .filter(|value| value != "-" && value.len() <= 250 && rng.chance(1, 2))
                .map(|value| Value::new(value.as_bytes()).expect("a value's bytes"));
            Answer::Watched {
                key: arbitrary_key(rng),
                state: WatchState {
                    token: arbitrary_u64(rng),
                    holders: arbitrary_u64(rng),
                    waiting: arbitrary_u64(rng),
                    value,
                },
            }
        }
        AnswerKind::Unwatched => Answer::Unwatched {
            key: arbitrary_key(rng),
        },
    }
}

fn request_text(request: &Request) -> Vec<u8> {
    let mut line = Vec::new();
    request.write_to(&mut line);
    line
}

fn answer_text(answer: &Answer) -> Vec<u8> {
    let mut line = Vec::new();
    answer.write_to(&mut line);
    line
}

/// `line` with `\r\n` for its `\n`.
fn with_crlf(line: &[u8]) -> Vec<u8> {
    let mut crlf = line.to_vec();
    crlf.insert(crlf.len() - 1, b'\r');
    crlf
}

/// Bytes of every kind: random, from the protocol's alphabet, and of every
/// length around MAX_LINE.
fn arbitrary_bytes(rng: &mut Rng) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ARKQIETNM -=.:0123456789\r\n\x7f\x00\t\xff";
    let len = match rng.below(4) {
        0 => rng.below(16),
        1 => rng.below(MAX_LINE as u64),
        2 => rng.between(MAX_LINE as u64 - 2, MAX_LINE as u64 + 2),
        _ => rng.below(3 * MAX_LINE as u64),
    } as usize;
    match rng.below(3) {
        0 => rng.bytes(len),
        1 => (0..len).map(|_| *rng.pick(ALPHABET)).collect(),
        _ => (0..len)
            .map(|_| {
                if rng.chance(1, 2) {
                    *rng.pick(ALPHABET)
                } else {
                    rng.next_u64() as u8
                }
            })
            .collect(),
    }
}

/// Parse `buf` line by line as requests, checking every invariant of one
/// step; the results, with the bytes each used.
fn parse_requests_checked(buf: &[u8], max_ms: u64) -> Vec<(usize, Result<Request, LineError>)> {
    let mut steps = Vec::new();
    let mut rest = buf;
    loop {
        match protocol::parse_request(rest, max_ms) {
            Parsed::Incomplete => {
                assert!(
                    rest.len() < MAX_LINE && !rest.contains(&b'\n'),
                    "Incomplete on {} bytes with a line in them: {rest:?}",
                    rest.len()
                );
                return steps;
            }
            Parsed::Line { used, result } => {
                assert!(
                    (1..=rest.len().min(MAX_LINE)).contains(&used),
                    "used {used} of {} bytes: {rest:?}",
                    rest.len()
                );
                let line = &rest[..used];
                check_request_result(line, &result, max_ms);
                steps.push((used, result));
                rest = &rest[used..];
            }
        }
    }
}

/// The one line whose request does not format back to itself: a `U`
/// secret ending in CR (see `check_request_result`).
#[test]
fn a_secret_ending_in_cr_is_read_as_sent_and_written_back_without_it() {
    let max_ms = 60_000;
    let line = b"U 0123456789abcdef\r\r\n";
    let Parsed::Line { used, result } = protocol::parse_request(line, max_ms) else {
        panic!("a whole line");
    };
    assert_eq!(used, line.len());
    let Ok(Request::Auth { secret }) = &result else {
        panic!("{result:?}");
    };
    assert_eq!(secret.as_bytes(), b"0123456789abcdef\r");
    check_request_result(line, &result, max_ms);
}

/// What one parsed line may say, whatever its bytes.
fn check_request_result(line: &[u8], result: &Result<Request, LineError>, max_ms: u64) {
    match result {
        Ok(request) => {
            // What was understood formats to a line that parses the same.
            // But for one case: a `U` secret is any bytes to the parser
            // (only a configured one, printable ASCII, ever matches), and one
            // that ends in CR, written back, gives that CR to the line's
            // CRLF ending.
            let text = request_text(request);
            let same = match request {
                Request::Auth { secret } if secret.as_bytes().ends_with(b"\r") => {
                    let bytes = secret.as_bytes();
                    Request::Auth {
                        secret: Secret::new(&bytes[..bytes.len() - 1]),
                    }
                }
                request => request.clone(),
            };
            assert_eq!(
                protocol::parse_request(&text, max_ms),
                Parsed::Line {
                    used: text.len(),
                    result: Ok(same)
                },
                "{line:?} parsed as {request:?}"
            );
        }
        Err(LineError::Blank) => {
            assert!(line == b"\n" || line == b"\r\n", "blank: {line:?}");
        }
        Err(LineError::Fatal(reason)) => {
            assert!(
                matches!(
                    reason,
                    Reason::UnknownOp | Reason::MissingFields | Reason::LineTooLong
                ),
                "fatal {reason:?} for {line:?}"
            );
            assert!(reason.closes_connection());
            assert_eq!(
                *reason == Reason::LineTooLong,
                line.len() == MAX_LINE && !line.contains(&b'\n'),
                "line-too-long iff {} bytes without a newline: {line:?}",
                MAX_LINE
            );
        }
        Err(LineError::Refused { op, key, reason }) => {
            assert!(!reason.closes_connection(), "refused with {reason:?}");
            assert_eq!(line.first(), Some(&(op.as_char() as u8)), "{line:?}");
            if *reason == Reason::BadKey || !op.is_keyed() {
                assert_eq!(key, &None, "{reason:?} for {line:?} names no key");
            } else {
                assert!(key.is_some(), "{reason:?} for {line:?} names its key");
            }
        }
    }
}

/// Parse `buf` line by line as answers, checking every invariant of one step.
fn parse_answers_checked(buf: &[u8]) -> Vec<(usize, Result<Answer, LineError>)> {
    let mut steps = Vec::new();
    let mut rest = buf;
    loop {
        match protocol::parse_answer(rest) {
            Parsed::Incomplete => {
                assert!(rest.len() < MAX_LINE && !rest.contains(&b'\n'));
                return steps;
            }
            Parsed::Line { used, result } => {
                assert!(
                    (1..=rest.len().min(MAX_LINE)).contains(&used),
                    "used {used} of {} bytes: {rest:?}",
                    rest.len()
                );
                let line = &rest[..used];
                match &result {
                    Ok(answer) => {
                        let text = answer_text(answer);
                        assert_eq!(
                            protocol::parse_answer(&text),
                            Parsed::Line {
                                used: text.len(),
                                result: Ok(answer.clone())
                            },
                            "{line:?} parsed as {answer:?}"
                        );
                    }
                    Err(LineError::Blank) => assert!(line == b"\n" || line == b"\r\n"),
                    Err(LineError::Fatal(Reason::Other | Reason::LineTooLong)) => {}
                    Err(other) => panic!("answer parser gave {other:?} for {line:?}"),
                }
                steps.push((used, result));
                rest = &rest[used..];
            }
        }
    }
}

#[test]
fn every_valid_request_formats_and_parses_back_exactly_and_each_prefix_is_incomplete() {
    let mut rng = Rng::new(test_seed("request round trip"));
    let mut longest = 0;
    for _ in 0..CASES {
        let max_ms = arbitrary_max_ms(&mut rng);
        let request = arbitrary_request(&mut rng, max_ms);
        let line = request_text(&request);
        longest = longest.max(line.len());
        assert!(
            line.len() <= MAX_LINE,
            "{request:?} is {} bytes",
            line.len()
        );
        for text in [line.clone(), with_crlf(&line)] {
            assert_eq!(
                protocol::parse_request(&text, max_ms),
                Parsed::Line {
                    used: text.len(),
                    result: Ok(request.clone())
                },
                "{text:?} with max {max_ms} ms"
            );
            // Followed by anything, the line is still read alone.
            let mut more = text.clone();
            more.extend(arbitrary_bytes(&mut rng));
            assert_eq!(
                parse_requests_checked(&more, max_ms).first(),
                Some(&(text.len(), Ok(request.clone())))
            );
        }
        for end in 0..line.len() {
            assert_eq!(
                protocol::parse_request(&line[..end], max_ms),
                Parsed::Incomplete,
                "prefix of {end} bytes of {line:?}"
            );
        }
    }
    println!("{CASES} requests round-tripped; longest line {longest} bytes");
}

#[test]
fn every_valid_answer_formats_and_parses_back_exactly_and_each_prefix_is_incomplete() {
    let mut rng = Rng::new(test_seed("answer round trip"));
    for _ in 0..CASES {
        let answer = arbitrary_answer(&mut rng);
        let line = answer_text(&answer);
        assert!(line.len() <= MAX_LINE, "{answer:?} is {} bytes", line.len());
        for text in [line.clone(), with_crlf(&line)] {
            if text.len() > MAX_LINE {
                continue;
            }
            assert_eq!(
                protocol::parse_answer(&text),
                Parsed::Line {
                    used: text.len(),
                    result: Ok(answer.clone())
                },
                "{text:?}"
            );
        }
        for end in 0..line.len() {
            assert_eq!(
                protocol::parse_answer(&line[..end]),
                Parsed::Incomplete,
                "prefix of {end} bytes of {line:?}"
            );
        }
    }
}

#[test]
fn parsing_arbitrary_bytes_never_panics_and_always_moves_forward() {
    let mut rng = Rng::new(test_seed("arbitrary bytes"));
    let mut lines = 0;
    for _ in 0..CASES {
        let bytes = arbitrary_bytes(&mut rng);
        let max_ms = arbitrary_max_ms(&mut rng);
        lines += parse_requests_checked(&bytes, max_ms).len();
        parse_answers_checked(&bytes);
    }
    println!("{CASES} buffers, {lines} request lines parsed");
}

#[test]
fn parsing_almost_valid_requests_never_panics_and_always_moves_forward() {
    let mut rng = Rng::new(test_seed("almost-valid requests"));
    let (mut accepted, mut refused, mut fatal) = (0, 0, 0);
    for _ in 0..CASES {
        let max_ms = arbitrary_max_ms(&mut rng);
        let request = arbitrary_request(&mut rng, max_ms);
        let line = mutate(&mut rng, request_fields(&request));
        for (_, result) in parse_requests_checked(&line, max_ms) {
            match result {
                Ok(_) => accepted += 1,
                Err(LineError::Refused { .. }) => refused += 1,
                Err(LineError::Fatal(_)) => fatal += 1,
                Err(LineError::Blank) => {}
            }
        }
        parse_answers_checked(&line);
        // The gentle ones (half the storm's lines) never close a connection.
        let line = mutate_gently(&mut rng, request_fields(&request));
        for (_, result) in parse_requests_checked(&line, max_ms) {
            assert!(
                !matches!(result, Err(LineError::Fatal(_))),
                "{line:?} is not understood: {result:?}"
            );
        }
    }
    println!("{CASES} mutated lines: {accepted} still valid, {refused} refused, {fatal} fatal");
    assert!(accepted > 0 && refused > 0 && fatal > 0);
}

#[test]
fn concatenated_valid_and_invalid_lines_parse_as_each_line_would_alone() {
    let mut rng = Rng::new(test_seed("concatenations"));
    for _ in 0..CASES / 10 {
        let max_ms = arbitrary_max_ms(&mut rng);
        let mut buf = Vec::new();
        for _ in 0..rng.between(2, 24) {
            match rng.below(4) {
                0 | 1 => buf.extend(request_text(&arbitrary_request(&mut rng, max_ms))),
                2 => {
                    let request = arbitrary_request(&mut rng, max_ms);
                    buf.extend(mutate(&mut rng, request_fields(&request)));
                }
                _ => {
                    let mut junk = arbitrary_bytes(&mut rng);
                    junk.truncate(rng.index(MAX_LINE));
                    buf.extend(junk);
                    buf.push(b'\n');
                }
            }
        }
        // Each line of the buffer (cut at every '\n') is read as it would be
        // alone, up to the first one too long (where the server hangs up).
        let steps = parse_requests_checked(&buf, max_ms);
        let mut rest = buf.as_slice();
        for (used, result) in steps {
            let end = rest.iter().position(|&b| b == b'\n');
            match end {
                Some(end) if end < MAX_LINE => {
                    let alone = &rest[..=end];
                    assert_eq!(used, alone.len(), "line {alone:?}");
                    assert_eq!(
                        protocol::parse_request(alone, max_ms),
                        Parsed::Line {
                            used,
                            result: result.clone()
                        }
                    );
                }
                _ => {
                    assert_eq!(used, MAX_LINE);
                    assert_eq!(result, Err(LineError::Fatal(Reason::LineTooLong)));
                    break;
                }
            }
            rest = &rest[used..];
        }
        // The same for a stream of answers with junk between them.
        let mut answers = Vec::new();
        let mut expected = Vec::new();
        for _ in 0..rng.between(2, 24) {
            if rng.chance(2, 3) {
                let answer = arbitrary_answer(&mut rng);
                answers.extend(answer_text(&answer));
                expected.push(Some(answer));
            } else {
                let mut junk: Vec<u8> = arbitrary_bytes(&mut rng)
                    .into_iter()
                    .filter(|&b| b != b'\n')
                    .collect();
                junk.truncate(rng.index(MAX_LINE));
                answers.extend(junk);
                answers.push(b'\n');
                expected.push(None);
            }
        }
        let steps = parse_answers_checked(&answers);
        assert_eq!(steps.len(), expected.len(), "one step per line");
        for ((_, result), expected) in steps.into_iter().zip(expected) {
            if let Some(answer) = expected {
                assert_eq!(result, Ok(answer));
            }
        }
    }
}

// ---------------------------------------------------------------------------
// 3. Thousands of idle connections
// ---------------------------------------------------------------------------

/// Idle connections opened in the max-conns test (and its --max-conns).
const IDLE_CONNS: usize = 3000;
/// Connections opened (and checked with `I`) at a time.
const OPEN_BATCH: usize = 200;

fn assert_refused_as_too_many(node: &Node) {
    let mut over = node.client();
    assert_eq!(over.recv(), "E - - too-many-connections");
    assert!(
        over.closed_within(DEADLINE),
        "a refused connection is closed"
    );
}

#[test]
fn thousands_of_idle_connections_are_admitted_up_to_max_conns_and_the_next_is_refused() {
    let _one = one_node_test_at_a_time();
    // This process holds one socket per connection, and batond (which
    // inherits the limit) one more; leave room for their other files. The
    // hard limit here is 20000; scale down on a machine where it is lower.
    let soft = raise_fd_limit();
    let max_conns = IDLE_CONNS.min(soft.saturating_sub(256) as usize);
    if max_conns < IDLE_CONNS {
        println!("RLIMIT_NOFILE is {soft}: scaled down to {max_conns} connections");
    }
    assert!(
        max_conns >= 100,
        "RLIMIT_NOFILE {soft} is too low for this test"
    );
    let node = Node::start(&["--max-conns", &max_conns.to_string()]);

    // Open them in batches, each connection answering `I`: every one is admitted.
    let start = Instant::now();
    let mut idle: Vec<LineClient> = Vec::with_capacity(max_conns);
    while idle.len() < max_conns {
        let mut batch: Vec<LineClient> = (0..OPEN_BATCH.min(max_conns - idle.len()))
            .map(|_| node.client())
            .collect();
        for client in &mut batch {
            client.send("I");
        }
        for mut client in batch {
            let answer = client.recv();
            assert!(
                answer.starts_with("I "),
                "connection {} of {max_conns}: {answer:?}",
                idle.len() + 1
            );
            idle.push(client);
        }
    }
    println!("{max_conns} connections admitted in {:?}", start.elapsed());
    let info = idle[0].info();
    assert_eq!(info_number(&info, "conns"), max_conns as u64, "{info}");

    // One more is refused, clearly, and closed.
    assert_refused_as_too_many(&node);

    // With thousands idle the node serves as usual, and every one of them
    // is still served.
    let mut lat = Latencies::new();
    for _ in 0..200 {
        acquire_release(&mut idle[max_conns / 2], "busy", "30", &mut lat);
    }
    println!(
        "with {max_conns} idle connections, per request: {}",
        lat.summary()
    );
    assert_p99_loose("with thousands of idle connections", &lat);
    for client in &mut idle {
        client.send("Q busy");
    }
    for client in &mut idle {
        assert_eq!(client.recv(), "Q busy 0 0 0");
    }

    // Closing some lets as many new ones in, and no more.
    let closed = 10;
    idle.truncate(max_conns - closed);
    for _ in 0..closed {
        idle.push(wait_for(
            "a new connection to be admitted",
            DEADLINE,
            || node.admitted(),
        ));
    }
    assert_refused_as_too_many(&node);
    let info = idle[0].info();
    assert_eq!(info_number(&info, "conns"), max_conns as u64, "{info}");
}

/// Connections that each had one burst of answers, then went idle.
const BURST_CONNS: usize = 300;
/// `I` requests in each burst: about 2 KiB in, some 170 KiB of answers out.
const BURST_INFOS: usize = 1000;
/// What an idle connection may keep after its burst, on average. Generous:
/// io_loop.rs means to shrink an idle connection's write buffer to 4 KiB.
const IDLE_KEEP_KIB: u64 = 32;

#[test]
fn an_idle_connection_does_not_keep_the_write_buffer_of_its_last_burst() {
    let _one = one_node_test_at_a_time();
    let node = Node::start(&[]);
    let mut probe = node.client();
    probe.info();
    let base_kib = node.rss_kib();
    // One connection at a time: a burst of pipelined `I`, every answer read,
    // then idle. A node that lets go of a burst's buffers reuses the same
    // memory for the next connection's burst.
    let burst = "I\n".repeat(BURST_INFOS);
    let mut idle = Vec::with_capacity(BURST_CONNS);
    for _ in 0..BURST_CONNS {
        let mut client = node.client();
        client.send_raw(burst.as_bytes());
        for _ in 0..BURST_INFOS {
            let answer = client.recv();
            assert!(answer.starts_with("I "), "{answer:?}");
        }
        idle.push(client);
    }
    let idle_kib = node.rss_kib();
    let per_conn_kib = idle_kib.saturating_sub(base_kib) / BURST_CONNS as u64;
    println!(
        "{BURST_CONNS} idle connections after a burst of {BURST_INFOS} answers each: RSS \
         {base_kib} KiB -> {idle_kib} KiB, {per_conn_kib} KiB per connection"
    );
    assert!(
        per_conn_kib < IDLE_KEEP_KIB,
        "each idle connection keeps {per_conn_kib} KiB after its burst"
    );
    wait_for_info(&mut probe, &[("conns", BURST_CONNS as u64 + 1)]);
}

/// Connections that send `I` as fast as they can and read nothing until
/// the end, and the `I` lines each sends (16 KiB: one write, taken by the
/// socket whether the node reads or not).
const INFO_FLOOD_CONNS: usize = 100;
const INFO_FLOOD_LINES: usize = 8191;
/// A bound on the node's peak memory during the flood, with headroom:
/// io_loop.rs bounds what one connection is owed and keeps as output to
/// under 1 MiB, about 100 MiB for the flood; a node that kept every answer
/// owed (some 1.2 KiB each once) would need about 1 GiB.
const INFO_FLOOD_RSS_KIB: u64 = 200 * 1024;

#[test]
fn clients_flooding_i_without_reading_get_bounded_memory_and_others_are_still_served() {
    let _one = one_node_test_at_a_time();
    raise_fd_limit();
    let node = Node::start(&["--max-conns", "1000"]);
    let mut probe = node.client();
    probe.info();
    let base_kib = node.rss_kib();
    let flood_bytes = "I\n".repeat(INFO_FLOOD_LINES);
    let mut flood: Vec<TcpStream> = (0..INFO_FLOOD_CONNS)
        .map(|_| {
            let mut stream = TcpStream::connect_timeout(&node.addr, DEADLINE).expect("connect");
            stream.set_write_timeout(Some(DEADLINE)).expect("timeout");
            stream
                .write_all(flood_bytes.as_bytes())
                .expect("send the flood");
            stream
        })
        .collect();
    // While the node works through the flood, another client is served
    // (each answer within the default 10 s deadline of `ask`).
    let started = Instant::now();
    assert_eq!(probe.query("victim"), common::Query::FREE);
    let token = probe.acquire_now("victim", "30");
    assert_eq!(probe.ask(&format!("R victim {token}")), "R victim");
    println!(
        "with {INFO_FLOOD_CONNS} connections flooding I: Q, A and R answered in {:?}",
        started.elapsed()
    );
    // Every flood connection gets every answer once it reads; only then
    // is the flood over, and the peak memory it caused known.
    for stream in &mut flood {
        stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
        let mut reader = BufReader::new(&*stream);
        let mut line = String::new();
        for i in 0..INFO_FLOOD_LINES {
            line.clear();
            let n = reader.read_line(&mut line).expect("an I answer");
            assert!(n > 0 && line.starts_with("I "), "answer {i}: {line:?}");
        }
    }
    let peak_kib = node.peak_rss_kib();
    println!(
        "{INFO_FLOOD_CONNS} connections x {INFO_FLOOD_LINES} I, unread until the end: RSS \
         {base_kib} KiB before, peak {peak_kib} KiB, now {} KiB",
        node.rss_kib()
    );
    assert!(
        peak_kib < INFO_FLOOD_RSS_KIB,
        "the flood took the node to {peak_kib} KiB"
    );
    // The node still serves, and the flood's connections are all there.
    let info = wait_for_info(&mut probe, &[("conns", INFO_FLOOD_CONNS as u64 + 1)]);
    assert!(info.contains("role=active"), "{info}");
    drop(flood);
    wait_for_info(&mut probe, &[("conns", 1)]);
    let token = probe.acquire_now("after-flood", "30");
    assert_eq!(
        probe.ask(&format!("R after-flood {token}")),
        "R after-flood"
    );
}

// ---------------------------------------------------------------------------
// 4. Slowloris
// ---------------------------------------------------------------------------

const SLOWLORIS: usize = 50;
/// The pause between two bytes of a slowloris client.
const DRIBBLE_PAUSE: Duration = Duration::from_millis(20);

/// Send `lines[i][from..to]` on `clients[i]`, one byte per client per round,
/// pausing between rounds.
fn dribble(
    clients: &mut [LineClient],
    lines: &[Vec<u8>],
    from: usize,
    to: impl Fn(usize) -> usize,
) {
    let rounds = (0..lines.len()).map(&to).max().unwrap_or(0);
    for at in from..rounds {
        for (i, client) in clients.iter_mut().enumerate() {
            if at < to(i) {
                client.send_raw(&lines[i][at..=at]);
            }
        }
        std::thread::sleep(DRIBBLE_PAUSE);
    }
}

#[test]
fn slowloris_clients_sending_a_byte_at_a_time_are_answered_and_do_not_hold_up_others() {
    let _one = one_node_test_at_a_time();
    let node = Node::start(&[]);
    let mut normal = node.client();
    let lines: Vec<Vec<u8>> = (0..SLOWLORIS)
        .map(|i| {
            let ending = if i % 2 == 0 { "\n" } else { "\r\n" };
            format!("A slowloris-{i:02} 30 0{ending}").into_bytes()
        })
        .collect();
    let mut slow: Vec<LineClient> = (0..SLOWLORIS).map(|_| node.client()).collect();

    // Every line but its last byte, a byte at a time, while the normal
    // client goes about its business.
    let dribbler = std::thread::spawn(move || {
        dribble(&mut slow, &lines, 0, |i| lines[i].len() - 1);
        (slow, lines)
    });
    let mut lat = Latencies::new();
    while !dribbler.is_finished() {
        acquire_release(&mut normal, "normal", "30", &mut lat);
        std::thread::sleep(CLIENT_PACE);
    }
    let (mut slow, lines) = dribbler.join().expect("dribbler");
    println!(
        "normal client while {SLOWLORIS} clients dribbled, per request: {}",
        lat.summary()
    );
    assert!(
        lat.len() >= 20,
        "the normal client was answered only {} times while slow clients dribbled",
        lat.len()
    );
    assert_p99_loose("while slow clients dribbled", &lat);

    // Half-sent lines hold nothing, and nothing has been answered to them.
    let info = normal.info();
    assert_eq!(info_number(&info, "held"), 0, "{info}");
    assert_eq!(info_number(&info, "waiting"), 0, "{info}");
    assert_eq!(info_number(&info, "conns"), SLOWLORIS as u64 + 1, "{info}");
    assert_eq!(normal.query("slowloris-00"), Query::FREE);
    slow[0].assert_silent_for(Duration::from_millis(50));

    // The last byte completes each line: each slow client gets its key.
    for (client, line) in slow.iter_mut().zip(&lines) {
        client.send_raw(&line[line.len() - 1..]);
    }
    let mut tokens = Vec::new();
    for (i, client) in slow.iter_mut().enumerate() {
        let answer = client.recv();
        let token = token_of(&answer);
        assert_eq!(answer, format!("A {token} slowloris-{i:02}"));
        tokens.push(token);
    }
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), SLOWLORIS, "every grant has its own token");
    let info = normal.info();
    assert_eq!(info_number(&info, "held"), SLOWLORIS as u64, "{info}");
}

#[test]
fn a_slowloris_that_never_finishes_its_line_holds_nothing_but_its_socket() {
    let _one = one_node_test_at_a_time();
    let node = Node::start(&[]);
    let mut normal = node.client();
    // Unfinished lines, each naming a key; the last is one byte short of
    // the longest line allowed (a 250-byte key, then a wait with leading
    // zeros), so it is not too long yet either.
    let mut lines: Vec<Vec<u8>> = (0..SLOWLORIS)
        .map(|i| format!("A hang-{i:02} 30 0").into_bytes())
        .collect();
    let long_key = "h".repeat(MAX_KEY);
    let mut long = format!("A {long_key} 30 ").into_bytes();
    long.resize(MAX_LINE - 1, b'0');
    lines.push(long);
    let mut hangers: Vec<LineClient> = lines.iter().map(|_| node.client()).collect();
    // A few bytes a byte at a time, then the rest of each line but its end.
    dribble(&mut hangers, &lines, 0, |_| 5);
    for (client, line) in hangers.iter_mut().zip(&lines) {
        client.send_raw(&line[5..]);
    }

    // Once the node has read them (it counts the connections and the
    // normal client's own request comes after them), nothing is held or
    // waited for: every key named is free and granted at once to another
    // client.
    let info = wait_for_info(&mut normal, &[("conns", lines.len() as u64 + 1)]);
    assert_eq!(info_number(&info, "held"), 0, "{info}");
    assert_eq!(info_number(&info, "waiting"), 0, "{info}");
    let mut lat = Latencies::new();
    for i in 0..SLOWLORIS {
        acquire_release(&mut normal, &format!("hang-{i:02}"), "30", &mut lat);
    }
    acquire_release(&mut normal, &long_key, "30", &mut lat);
    println!(
        "normal client with {} unfinished lines open, per request: {}",
        lines.len(),
        lat.summary()
    );
    assert_p99_loose("with unfinished lines open", &lat);
    for hanger in &mut hangers {
        hanger.assert_silent_for(Duration::from_millis(5));
    }

    // Hanging up frees the sockets, which is all they held.
    drop(hangers);
    wait_for_info(&mut normal, &[("conns", 1), ("held", 0), ("waiting", 0)]);
}

#[test]
fn a_line_dribbled_a_byte_at_a_time_is_read_at_exactly_max_line_and_refused_one_byte_past_it() {
    let _one = one_node_test_at_a_time();
    let node = Node::start(&[]);
    // Exactly MAX_LINE bytes, newline included: a 250-byte key and a wait
    // padded with leading zeros.
    let key = "x".repeat(MAX_KEY);
    let mut line = format!("A {key} 30 ").into_bytes();
    line.resize(MAX_LINE - 1, b'0');
    line.push(b'\n');
    let mut exact = node.client();
    for byte in &line {
        exact.send_raw(std::slice::from_ref(byte));
    }
    let answer = exact.recv();
    assert_eq!(answer, format!("A {} {key}", token_of(&answer)));

    // One byte more, and the line is too long: refused once MAX_LINE bytes
    // have come without a newline, and the connection closed.
    let mut over = node.client();
    let mut too_long = line.clone();
    too_long.insert(MAX_LINE - 2, b'0');
    for byte in &too_long[..MAX_LINE] {
        over.send_raw(std::slice::from_ref(byte));
    }
    assert_eq!(over.recv(), "E - - line-too-long");
    assert!(over.closed_within(DEADLINE), "closed after line-too-long");
    assert_eq!(exact.ask("Q other"), "Q other 0 0 0");
}

// ---------------------------------------------------------------------------
// 5. A million held keys and a hundred thousand waiters
// ---------------------------------------------------------------------------

const HELD_KEYS: usize = 1_000_000;
/// Connections the held keys are acquired over, pipelined.
const FEED_CONNS: usize = 4;
/// Bytes of requests written at a time by a feeding connection.
const FEED_CHUNK: usize = 64 * 1024;
const WAITED_KEYS: usize = 1_000;
const WAITERS_PER_KEY: usize = 100;
/// Connections the waiters are spread over: 2,000 each, within the default
/// --max-waiting of 4096.
const WAITER_CONNS: usize = 50;
/// A very generous sanity bound on the node's memory in this test.
const RSS_SANITY_KIB: u64 = 2 * 1024 * 1024;

/// Acquire `m<i>` for every i in `range` over one pipelined connection (a
/// writer thread, answers read here); checks each answer is the grant of a
/// key of the range, each key once.
fn acquire_range(addr: SocketAddr, range: Range<usize>) -> usize {
    let stream = TcpStream::connect_timeout(&addr, DEADLINE).expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let reading = stream.try_clone().expect("clone stream");
    reading.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let to_send = range.clone();
    let writer = std::thread::spawn(move || {
        let mut stream = stream;
        let mut chunk = Vec::with_capacity(FEED_CHUNK + 64);
        for i in to_send {
            writeln!(chunk, "A m{i} 86400 0").expect("format");
            if chunk.len() >= FEED_CHUNK {
                stream.write_all(&chunk).expect("send acquires");
                chunk.clear();
            }
        }
        stream.write_all(&chunk).expect("send acquires");
        stream
    });
    let mut reader = BufReader::with_capacity(FEED_CHUNK, reading);
    let mut seen = vec![false; range.len()];
    let mut line = String::new();
    for _ in range.clone() {
        line.clear();
        let n = reader.read_line(&mut line).expect("read a grant");
        assert!(n > 0, "connection closed while acquiring");
        let mut fields = line.trim_end().split(' ');
        let (tag, token, key) = (fields.next(), fields.next(), fields.next());
        let index = key
            .and_then(|k| k.strip_prefix('m'))
            .and_then(|k| k.parse::<usize>().ok());
        match (tag, token.map(str::parse::<u64>), index) {
            (Some("A"), Some(Ok(_)), Some(i)) if range.contains(&i) && !seen[i - range.start] => {
                seen[i - range.start] = true;
            }
            _ => panic!("expected a grant of a new key m{range:?}, got {line:?}"),
        }
    }
    drop(writer.join().expect("writer"));
    range.len()
}

fn per_item_bytes(from_kib: u64, to_kib: u64, items: usize) -> f64 {
    (to_kib as f64 - from_kib as f64) * 1024.0 / items as f64
}

#[test]
fn a_million_held_keys_and_a_hundred_thousand_waiters_are_measured_and_drain_on_close() {
    let _one = one_node_test_at_a_time();
    let node = Node::start(&[]);
    let mut probe = node.client();
    probe.info();
    let base_kib = node.rss_kib();

    // A million keys held for a day, acquired over a few pipelined connections.
    let start = Instant::now();
    let per_conn = HELD_KEYS / FEED_CONNS;
    let feeders: Vec<JoinHandle<usize>> = (0..FEED_CONNS)
        .map(|c| {
            let addr = node.addr;
            let range = c * per_conn..if c + 1 == FEED_CONNS {
                HELD_KEYS
            } else {
                (c + 1) * per_conn
            };
            std::thread::spawn(move || acquire_range(addr, range))
        })
        .collect();
    let granted: usize = feeders.into_iter().map(|f| f.join().expect("feeder")).sum();
    let fill_time = start.elapsed();
    assert_eq!(granted, HELD_KEYS);
    let info = wait_for_info(&mut probe, &[("held", HELD_KEYS as u64)]);
    let held_kib = node.rss_kib();
    println!(
        "{HELD_KEYS} keys acquired in {fill_time:?} ({:.0}/s); RSS {base_kib} KiB -> {held_kib} \
         KiB: {:.0} bytes per held key",
        HELD_KEYS as f64 / fill_time.as_secs_f64(),
        per_item_bytes(base_kib, held_kib, HELD_KEYS)
    );
    println!("  {info}");
    assert!(held_kib < RSS_SANITY_KIB, "RSS {held_kib} KiB");

    // A hundred thousand waiters: a hundred on each of a thousand held keys.
    let start = Instant::now();
    let mut waiters: Vec<LineClient> = (0..WAITER_CONNS).map(|_| node.client()).collect();
    let per_conn_per_key = WAITERS_PER_KEY / WAITER_CONNS;
    for client in &mut waiters {
        let mut requests = Vec::new();
        for k in 0..WAITED_KEYS {
            for _ in 0..per_conn_per_key {
                writeln!(requests, "A m{k} 86400 0").expect("format");
            }
        }
        client.send_raw(&requests);
    }
    let total_waiters = (WAITED_KEYS * WAITERS_PER_KEY) as u64;
    let info = wait_for_info(&mut probe, &[("waiting", total_waiters)]);
    let queue_time = start.elapsed();
    let waiters_kib = node.rss_kib();
    println!(
        "{total_waiters} waiters queued in {queue_time:?} over {WAITER_CONNS} connections; RSS \
         {held_kib} KiB -> {waiters_kib} KiB: {:.0} bytes per waiter",
        per_item_bytes(held_kib, waiters_kib, total_waiters as usize)
    );
    println!("  {info}");
    assert!(waiters_kib < RSS_SANITY_KIB, "RSS {waiters_kib} KiB");
    let m0 = probe.query("m0");
    assert_eq!(m0.waiting, WAITERS_PER_KEY as u64, "{m0:?}");
    for client in &mut waiters {
        client.assert_silent_for(Duration::from_millis(1));
    }

    // Closing the waiters' connections drops every waiter, and nothing else.
    let start = Instant::now();
    drop(waiters);
    let info = wait_for_info(
        &mut probe,
        &[("waiting", 0), ("conns", 1), ("held", HELD_KEYS as u64)],
    );
    println!(
        "waiters gone {:?} after their connections closed; RSS now {} KiB",
        start.elapsed(),
        node.rss_kib()
    );
    println!("  {info}");
    assert_eq!(probe.query("m0").waiting, 0);
    let mut lat = Latencies::new();
    for _ in 0..100 {
        acquire_release(&mut probe, "after", "30", &mut lat);
    }
    println!("with a million keys held, per request: {}", lat.summary());
    assert_p99_loose("with a million keys held", &lat);
}
