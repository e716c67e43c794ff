//! Tests of the number formats.

use super::*;

#[test]
fn write_seconds_is_shortest() {
    let cases = [
        (30_000, "30"),
        (500, "0.5"),
        (2_125, "2.125"),
        (0, "0"),
        (1, "0.001"),
        (10, "0.01"),
        (1_050, "1.05"),
        (86_400_000, "86400"),
        (u64::MAX, "18446744073709551.615"),
    ];
    for (ms, text) in cases {
        assert_eq!(seconds_text(ms), text, "{ms}");
    }
}

#[test]
fn seconds_round_trip() {
    let large = [
        86_400_000,
        86_400_001,
        1_000_000_000_000,
        u64::MAX / 1000 * 1000,
        u64::MAX - 1,
        u64::MAX,
    ];
    for ms in (0..=5000).chain(large) {
        assert_eq!(parse_seconds(seconds_text(ms).as_bytes()), Some(ms), "{ms}");
    }
}

#[test]
fn parse_seconds_overflow_is_none() {
    for text in [
        "18446744073709552",
        "18446744073709551.616",
        "18446744073709551616",
        "99999999999999999999999999999999999999",
    ] {
        assert_eq!(parse_seconds(text.as_bytes()), None, "{text}");
    }
    assert_eq!(parse_seconds(b"18446744073709551.615"), Some(u64::MAX));
}

// --- request formatting ------------------------------------------------

#[test]
fn request_format_is_exact() {
    let cases = [
        (
            Request::Acquire {
                key: key("job"),
                lease_ms: 30_000,
                wait_ms: 0,
                limit: None,
                value: None,
            },
            "A job 30 0\n",
        ),
        (
            Request::Acquire {
                key: key("job"),
                lease_ms: 2_125,
                wait_ms: 500,
                limit: None,
                value: None,
            },
            "A job 2.125 0.5\n",
        ),
        (
            Request::Release {
                key: key("job"),
                token: 42,
            },
            "R job 42\n",
        ),
        (
            Request::Keep {
                key: key("job"),
                token: 42,
                lease_ms: 1_500,
            },
            "K job 42 1.5\n",
        ),
        (Request::Query { key: key("job") }, "Q job\n"),
        (Request::Info, "I\n"),
    ];
    for (request, text) in cases {
        assert_eq!(request_text(&request), text.as_bytes(), "{request:?}");
    }
}

#[test]
fn find_byte_finds_what_a_byte_loop_finds() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..20_000 {
        let len = rng.below(40);
        let hay: Vec<u8> = (0..len).map(|_| rng.byte()).collect();
        for needle in [b' ', b'\n', 0x00, 0x80, 0xff] {
            assert_eq!(
                find_byte(&hay, needle),
                hay.iter().position(|&b| b == needle),
                "{hay:?} {needle}"
            );
        }
    }
}

#[test]
fn parse_u64_agrees_with_checked_arithmetic_at_every_length() {
    fn reference(field: &[u8]) -> Option<u64> {
        if field.is_empty() {
            return None;
        }
        field.iter().try_fold(0u64, |acc, &b| {
            let digit = b.checked_sub(b'0').filter(|d| *d <= 9)?;
            acc.checked_mul(10)?.checked_add(u64::from(digit))
        })
    }
    let mut rng = Rng(7);
    for _ in 0..50_000 {
        let len = 1 + rng.below(22);
        let mut field: Vec<u8> = (0..len).map(|_| b'0' + rng.below(10) as u8).collect();
        if rng.below(8) == 0 {
            let at = rng.below(len);
            field[at] = rng.byte();
        }
        assert_eq!(parse_u64(&field), reference(&field), "{field:?}");
    }
    for text in [
        "9999999999999999999",
        "18446744073709551615",
        "18446744073709551616",
        "99999999999999999999",
        "00000000000000000000001",
    ] {
        assert_eq!(
            parse_u64(text.as_bytes()),
            reference(text.as_bytes()),
            "{text}"
        );
    }
}

#[test]
fn eight_digits_refuses_every_non_digit_byte_at_every_place() {
    let base = *b"31415926";
    for at in 0..8 {
        for b in 0..=255u8 {
            let mut text = base;
            text[at] = b;
            let expect = std::str::from_utf8(&text)
                .ok()
                .filter(|t| t.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|t| t.parse::<u32>().ok());
            assert_eq!(eight_digits(u64::from_le_bytes(text)), expect, "{text:?}");
        }
    }
    assert_eq!(
        eight_digits(u64::from_le_bytes(*b"99999999")),
        Some(99_999_999)
    );
    assert_eq!(eight_digits(u64::from_le_bytes(*b"00000000")), Some(0));
}

#[test]
fn eight_ascii_writes_eight_digits_with_leading_zeros() {
    let mut rng = Rng(5);
    let edges = [0, 1, 9, 10, 99, 100, 9_999, 10_000, 99_999_999];
    for n in edges
        .into_iter()
        .chain((0..20_000).map(|_| rng.below(100_000_000) as u32))
    {
        assert_eq!(eight_ascii(n).to_le_bytes(), *format!("{n:08}").as_bytes());
    }
}

#[test]
fn write_u64_writes_what_display_writes() {
    let mut rng = Rng(11);
    let mut out = Vec::new();
    let edges = [
        0,
        9,
        10,
        99,
        100,
        101,
        999,
        1000,
        // The eight-digit chunks' edges.
        99_999_999,
        100_000_000,
        100_000_001,
        9_999_999_999_999_999,
        10_000_000_000_000_000,
        10_000_000_000_000_001,
        u64::MAX / 10,
        u64::MAX - 1,
        u64::MAX,
    ];
    for n in edges
        .into_iter()
        .chain((0..20_000).map(|_| rng.next() >> rng.below(64)))
    {
        out.clear();
        write_u64(n, &mut out);
        assert_eq!(out, n.to_string().as_bytes());
    }
}
