//! Tests of keys and values.

use super::*;

#[test]
fn key_of_251_bytes_is_bad_key() {
    assert_eq!(Key::new(&[b'x'; MAX_KEY + 1]), Err(Reason::BadKey));
    let line = format!("Q {}\n", "x".repeat(251));
    assert_eq!(req(&line), refused_with(Op::Query, None, Reason::BadKey));
}

#[test]
fn key_with_0x7f_is_bad_key() {
    assert_eq!(Key::new(b"a\x7fb"), Err(Reason::BadKey));
    assert_eq!(
        req_bytes(b"Q a\x7fb\n"),
        refused_with(Op::Query, None, Reason::BadKey)
    );
}

#[test]
fn key_with_control_byte_is_bad_key() {
    for byte in [0x00u8, 0x01, 0x1B, 0x1F, b'\r'] {
        let line = [b"R a".as_slice(), &[byte], b"b 5\n"].concat();
        assert_eq!(
            req_bytes(&line),
            refused_with(Op::Release, None, Reason::BadKey),
            "byte {byte:#x}"
        );
    }
}

#[test]
fn every_byte_at_every_place_of_short_and_long_keys_is_judged_by_the_byte_rule() {
    // Short of a word, around words, at the inline bound, long.
    let lens = [1, 2, 7, 8, 9, 16, 17];
    let bounds = [INLINE_KEY, INLINE_KEY + 1, 40, MAX_KEY];
    for len in lens.into_iter().chain(bounds) {
        for at in [0, len / 2, len - 1] {
            for byte in 0..=u8::MAX {
                let mut bytes = vec![b'k'; len];
                bytes[at] = byte;
                let ok = byte >= 0x21 && byte != 0x7F;
                let key = Key::new(&bytes);
                assert_eq!(key.is_ok(), ok, "len {len} at {at} byte {byte:#x}");
                if let Ok(key) = key {
                    assert_eq!(key.as_bytes(), &bytes[..]);
                }
            }
        }
    }
}

#[test]
fn key_with_tab_is_bad_key() {
    assert_eq!(Key::new(b"a\tb"), Err(Reason::BadKey));
    assert_eq!(
        req("A a\tb 30 0\n"),
        refused_with(Op::Acquire, None, Reason::BadKey)
    );
}

#[test]
fn empty_key_from_double_space_is_bad_key() {
    assert_eq!(Key::new(b""), Err(Reason::BadKey));
    assert_eq!(
        req("A  30 0\n"),
        refused_with(Op::Acquire, None, Reason::BadKey)
    );
}

#[test]
fn utf8_key_is_valid() {
    let text = "clé-日本-🔒";
    assert_eq!(
        req(&format!("Q {text}\n")),
        Ok(Request::Query { key: key(text) })
    );
}

#[test]
fn key_display_is_lossy_utf8_and_debug_is_quoted() {
    assert_eq!(key("clé").to_string(), "clé");
    assert_eq!(format!("{:?}", key("clé")), "\"clé\"");
    let invalid = Key::new(b"a\xffb").expect("0xFF is allowed");
    assert_eq!(invalid.to_string(), "a\u{FFFD}b");
    assert_eq!(invalid.as_bytes(), b"a\xffb");
}

// --- watches -----------------------------------------------------------

#[test]
fn watch_and_unwatch_take_a_key_and_nothing_more() {
    assert_eq!(req("W job\n"), Ok(Request::Watch { key: key("job") }));
    assert_eq!(req("X job\n"), Ok(Request::Unwatch { key: key("job") }));
    assert_eq!(
        req("W job 1\n"),
        refused_with(Op::Watch, Some("job"), Reason::ExtraFields)
    );
    assert_eq!(
        req("X job x\n"),
        refused_with(Op::Unwatch, Some("job"), Reason::ExtraFields)
    );
    assert_eq!(
        req("W a\tb\n"),
        refused_with(Op::Watch, None, Reason::BadKey)
    );
    assert_eq!(req("W\n"), Err(LineError::Fatal(Reason::MissingFields)));
    assert_eq!(req("X\n"), Err(LineError::Fatal(Reason::MissingFields)));
    for request in [
        Request::Watch { key: key("k") },
        Request::Unwatch { key: key("k") },
    ] {
        let mut line = Vec::new();
        request.write_to(&mut line);
        assert_eq!(req_bytes(&line), Ok(request));
    }
}

#[test]
fn first_non_key_byte_finds_what_a_byte_loop_finds() {
    let mut rng = Rng(0xc0ffee);
    for _ in 0..50_000 {
        let len = rng.below(40);
        let mut bytes: Vec<u8> = (0..len).map(|_| 0x21 + rng.below(0x5e) as u8).collect();
        // A few bytes of any value, the interesting ones included.
        for _ in 0..rng.below(3) {
            if len > 0 {
                let at = rng.below(len);
                bytes[at] = if rng.below(2) == 0 {
                    rng.byte()
                } else {
                    rng.next() as u8
                };
            }
        }
        assert_eq!(
            first_non_key_byte(&bytes),
            bytes.iter().position(|&b| !is_key_byte(b)),
            "{bytes:?}"
        );
    }
    for b in 0..=255u8 {
        for at in 0..17 {
            let mut bytes = vec![b'k'; 17];
            bytes[at] = b;
            let expect = (!is_key_byte(b)).then_some(at);
            assert_eq!(first_non_key_byte(&bytes), expect, "{b} at {at}");
        }
    }
}

#[test]
fn a_key_copied_inline_is_the_key_at_every_length() {
    for len in 1..=MAX_KEY {
        let bytes: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
        let key = Key::new(&bytes).expect("a valid key");
        assert_eq!(key.as_bytes(), &bytes[..]);
        assert_eq!(Key::from_key_bytes(&bytes), Some(key));
    }
    assert_eq!(Key::from_key_bytes(b""), None);
    assert_eq!(Key::from_key_bytes(&[b'k'; MAX_KEY + 1]), None);
}

#[test]
fn parse_seconds_short_path_agrees_with_the_general_one() {
    let mut rng = Rng(0x5ec);
    for _ in 0..50_000 {
        let len = rng.below(11);
        let field: Vec<u8> = (0..len)
            .map(|_| match rng.below(4) {
                0 => rng.byte(),
                _ => b'0' + rng.below(10) as u8,
            })
            .collect();
        assert_eq!(
            parse_seconds(&field),
            parse_seconds_general(&field),
            "{field:?}"
        );
    }
}

#[test]
fn short_and_long_keys_compare_hash_and_order_by_their_bytes() {
    use std::collections::hash_map::DefaultHasher;
    use std::hash::{Hash, Hasher};
    let hash = |k: &Key| {
        let mut h = DefaultHasher::new();
        k.hash(&mut h);
        h.finish()
    };
    let short = Key::new(&[b'a'; INLINE_KEY]).expect("valid");
    let long = Key::new(&[b'a'; INLINE_KEY + 1]).expect("valid");
    assert_eq!(short.as_bytes().len(), INLINE_KEY);
    assert_eq!(long.as_bytes().len(), INLINE_KEY + 1);
    assert!(short < long, "a prefix sorts first, whatever the storage");
    assert_eq!(short.clone(), short);
    assert_eq!(
        hash(&short),
        hash(&Key::new(&[b'a'; INLINE_KEY]).expect("valid"))
    );
    assert_ne!(short, long);
    assert_eq!(std::mem::size_of::<Key>(), 24);
}
