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
