//! The load generator's wire readings (benches/lockbench/wire.rs): the
//! load generator is a bench target without a test harness, so this test
//! crate includes the file to test them.

#[allow(dead_code)]
#[path = "../benches/lockbench/wire.rs"]
mod wire;

#[path = "common/rng.rs"]
mod rng;

use rng::Rng;
use wire::{Kind, Reply, common_baton_answer, general_baton_answer};

fn same(a: &Reply<'_>, b: &Reply<'_>) -> bool {
    (a.kind, a.op, a.key, a.text, a.used) == (b.kind, b.op, b.key, b.text, b.used)
}

/// The one-pass reading of grants and releases gives what the general
/// reading gives, on answers near the common ones: zero, long and
/// overflowing tokens, extra and missing fields, stray bytes.
#[test]
fn common_answers_read_as_the_general_reading_does() {
    let mut rng = Rng::new(0x6c67_7769_7265);
    let pieces: [&[u8]; 14] = [
        b"A",
        b"R",
        b" ",
        b"0",
        b"7",
        b"9999999999999999999",
        b"18446744073709551615",
        b"18446744073709551616",
        b"123456789012345678901",
        b"k1",
        b"key-42",
        b"x",
        b"-",
        b"\r",
    ];
    let mut line = Vec::new();
    let mut common = 0;
    for _ in 0..200_000 {
        line.clear();
        let heads: [&[u8]; 5] = [b"A ", b"R ", b"A", b"R", b"T "];
        let head: &[u8] = heads[rng.index(heads.len())];
        line.extend_from_slice(head);
        for _ in 0..rng.below(5) {
            let piece: &[u8] = pieces[rng.index(pieces.len())];
            line.extend_from_slice(piece);
        }
        let used = line.len() + 1;
        let general = general_baton_answer(&line, used);
        if let Some(fast) = common_baton_answer(&line, used) {
            common += 1;
            assert!(
                same(&fast, &general),
                "{:?}: {fast:?} against {general:?}",
                String::from_utf8_lossy(&line)
            );
        }
    }
    assert!(
        common > 10_000,
        "the one-pass path read only {common} lines"
    );
    for (line, token) in [
        (&b"A 1 k"[..], 1),
        (b"A 9999999999999999999 k", 9_999_999_999_999_999_999),
    ] {
        let reply = common_baton_answer(line, 6).expect("a grant");
        assert_eq!(
            (reply.kind, reply.key),
            (Kind::Granted(token), Some(&b"k"[..]))
        );
    }
    let reply = common_baton_answer(b"R key-42", 9).expect("a release");
    assert_eq!(
        (reply.kind, reply.key),
        (Kind::Released, Some(&b"key-42"[..]))
    );
    for line in [
        &b"A 0 k"[..],
        b"A 18446744073709551615 k",
        b"A 1",
        b"R a b",
        b"T k",
    ] {
        assert!(
            common_baton_answer(line, 1).is_none(),
            "{:?}",
            String::from_utf8_lossy(line)
        );
    }
}

/// A grant of an acquire that named a limit, `A <token> <key> <slot>`,
/// reads as the same grant (token and key) both ways.
#[test]
fn a_grant_with_a_slot_reads_as_a_grant_of_its_key() {
    for line in [&b"A 17 sem 3"[..], b"A 17 sem 0"] {
        let used = line.len() + 1;
        let fast = common_baton_answer(line, used).expect("the one-pass path reads it");
        let general = general_baton_answer(line, used);
        assert!(same(&fast, &general), "{fast:?} against {general:?}");
        assert_eq!(
            (fast.kind, fast.op, fast.key),
            (
                Kind::Granted(17),
                Some(wire::Op::Acquire),
                Some(&b"sem"[..])
            )
        );
    }
}

/// The limit field is written only when asked for; the Redis semaphore's
/// acquire carries its script, token, limit and lease, and its release is
/// a ZREM.
#[test]
fn acquires_with_a_limit_are_written_as_the_protocols_say() {
    use wire::{Proto, TokenText, write_acquire, write_acquire_limited, write_release};
    let mut out = Vec::new();
    write_acquire(
        Proto::Baton,
        &mut out,
        b"k",
        &TokenText::default(),
        30_000,
        0,
    );
    assert_eq!(out, b"A k 30 0\n");
    out.clear();
    let no_sha: &[u8] = &[];
    write_acquire_limited(
        Proto::Baton,
        &mut out,
        b"k",
        &TokenText::default(),
        30_000,
        1500,
        Some(4),
        no_sha,
    );
    assert_eq!(out, b"A k 30 1.5 4\n");
    out.clear();
    write_acquire_limited(
        Proto::RedisSemaphore,
        &mut out,
        b"k",
        &TokenText::of(42),
        10_000,
        0,
        Some(4),
        b"abc",
    );
    assert_eq!(
        out,
        b"*7\r\n$7\r\nEVALSHA\r\n$3\r\nabc\r\n$1\r\n1\r\n$1\r\nk\r\n$2\r\n42\r\n$1\r\n4\r\n$5\r\n10000\r\n"
    );
    out.clear();
    write_release(
        Proto::RedisSemaphore,
        &mut out,
        b"k",
        &TokenText::of(42),
        b"abc",
    );
    assert_eq!(out, b"*3\r\n$4\r\nZREM\r\n$1\r\nk\r\n$2\r\n42\r\n");
}

/// The Redis semaphore's acquire answers 1 or 0, read as granted or full;
/// a release's 1 and 0 keep their meaning, and a PUBLISH's count of
/// receivers is an acknowledgement, not a broken stream.
#[test]
fn integer_answers_mean_what_their_request_asked() {
    use wire::{Op, Proto, in_answer_to, parse_reply};
    let read = |text: &[u8]| {
        parse_reply(Proto::RedisSemaphore, text)
            .expect("a RESP answer")
            .expect("a whole answer")
            .kind
    };
    let acquire = |text: &[u8]| in_answer_to(Proto::RedisSemaphore, Op::Acquire, read(text));
    let release = |text: &[u8]| in_answer_to(Proto::RedisSemaphore, Op::Release, read(text));
    assert_eq!(acquire(b":1\r\n"), Kind::Granted(0));
    assert_eq!(acquire(b":0\r\n"), Kind::Busy);
    assert_eq!(release(b":1\r\n"), Kind::Released);
    assert_eq!(release(b":0\r\n"), Kind::NotHeld);
    assert_eq!(read(b":10000\r\n"), Kind::Ack);
    assert_eq!(
        in_answer_to(Proto::RedisLock, Op::Acquire, Kind::Released),
        Kind::Released,
        "only the semaphore's acquire is read anew"
    );
    assert!(parse_reply(Proto::RedisLock, b":x\r\n").is_err());
}

/// Watch streams: baton's W lines and Redis pub/sub pushes, whole or cut
/// anywhere (an unfinished message is waited for, never misread), and
/// anything else is refused.
#[test]
fn watch_streams_read_whole_and_cut_anywhere() {
    use wire::{Watched, parse_watched};
    let baton: &[u8] = b"W key 0 0 0 -\nW key 42 1 3 10.0.0.1:80\r\n";
    let redis: &[u8] = b"*3\r\n$9\r\nsubscribe\r\n$3\r\nkey\r\n:1\r\n\
        *3\r\n$7\r\nmessage\r\n$3\r\nkey\r\n$2\r\n42\r\n";
    for (is_redis, stream, want) in [
        (false, baton, [Watched::State(0), Watched::State(42)]),
        (true, redis, [Watched::Subscribed, Watched::State(42)]),
    ] {
        let mut at = 0;
        let mut got = Vec::new();
        while let Some((message, used)) =
            parse_watched(is_redis, b"key", &stream[at..]).expect("a good stream")
        {
            got.push(message);
            at += used;
        }
        assert_eq!((got.as_slice(), at), (&want[..], stream.len()));
        let first_end = if is_redis { 32 } else { 14 };
        for cut in 0..first_end {
            assert_eq!(
                parse_watched(is_redis, b"key", &stream[..cut]).expect("a good prefix"),
                None,
                "cut at {cut}"
            );
        }
        assert_eq!(
            parse_watched(is_redis, b"key", &stream[..first_end])
                .expect("a good stream")
                .map(|m| m.1),
            Some(first_end)
        );
    }
    for line in [
        &b"W other 1 1 0 -\n"[..],
        b"W key x 1 0 -\n",
        b"W key 1 1 0\n",
        b"W key 1 1 0 - extra\n",
        b"E W key too-many-watches\n",
        b"M 127.0.0.1:1 W key\n",
    ] {
        assert!(
            parse_watched(false, b"key", line).is_err(),
            "{:?}",
            String::from_utf8_lossy(line)
        );
    }
    for push in [
        &b"-ERR max number of clients reached\r\n"[..],
        b"*3\r\n$7\r\nmessage\r\n$5\r\nother\r\n$1\r\n1\r\n",
        b"*3\r\n$7\r\nmessage\r\n$3\r\nkey\r\n$1\r\nx\r\n",
    ] {
        assert!(
            parse_watched(true, b"key", push).is_err(),
            "{:?}",
            String::from_utf8_lossy(push)
        );
    }
}
