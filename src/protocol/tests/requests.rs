//! Tests of requests: parsing, checks in order, writing.

use super::*;
use crate::protocol::requests::*;

#[test]
fn a_watch_line_has_three_numbers_and_a_value_or_a_dash() {
    for bad in [
        "W job 1 1 0\n",
        "W job 1 1 0 v extra\n",
        "W job x 1 0 -\n",
        "W job 1 -1 0 -\n",
        "W job 1 1 0 \n",
        "W  1 1 0 -\n",
        "X\n",
        "X a b\n",
    ] {
        assert_eq!(
            parse_answer(bad.as_bytes()),
            Parsed::Line {
                used: bad.len(),
                result: Err(LineError::Fatal(Reason::Other))
            },
            "{bad:?}"
        );
    }
    let long = format!("W k 1 1 0 {}\n", "v".repeat(MAX_VALUE + 1));
    assert!(matches!(
        parse_answer(long.as_bytes()),
        Parsed::Line { result: Err(_), .. }
    ));
    assert_eq!(
        Answer::Watched {
            key: key("k"),
            state: WatchState::default()
        }
        .request(),
        Some((Op::Watch, Some(&key("k"))))
    );
    assert_eq!(
        Reason::from_bytes(b"too-many-watches"),
        Reason::TooManyWatches
    );
}

// --- ops and reasons ---------------------------------------------------

#[test]
fn op_letters_round_trip() {
    let ops = [
        Op::Acquire,
        Op::Release,
        Op::Keep,
        Op::Query,
        Op::Info,
        Op::Auth,
        Op::Watch,
        Op::Unwatch,
    ];
    let letters = ['A', 'R', 'K', 'Q', 'I', 'U', 'W', 'X'];
    for (op, letter) in ops.into_iter().zip(letters) {
        assert_eq!(op.as_char(), letter);
        assert_eq!(op.to_string(), letter.to_string());
        assert_eq!(Op::from_byte(letter as u8), Some(op));
        assert_eq!(op_text(op), [letter as u8]);
    }
    assert_eq!(Op::from_byte(b'a'), None);
    assert_eq!(Op::from_byte(b'E'), None);
}

#[test]
fn auth_without_a_secret_is_missing_fields() {
    assert_eq!(req("U\n"), fatal(Reason::MissingFields));
    assert_eq!(req("u secretsecretsecret\n"), fatal(Reason::UnknownOp));
}

#[test]
fn auth_with_extra_fields_is_refused_without_echoing_the_secret() {
    for line in ["U secretsecretsecret x\n", "U secretsecretsecret \n"] {
        assert_eq!(
            req(line),
            refused_with(Op::Auth, None, Reason::ExtraFields),
            "{line:?}"
        );
    }
}

#[test]
fn auth_is_written_with_its_secret_and_has_no_key() {
    let request = Request::Auth {
        secret: Secret::new(b"0123456789abcdef"),
    };
    assert_eq!(request_text(&request), b"U 0123456789abcdef\n");
    assert_eq!((request.op(), request.key()), (Op::Auth, None));
}

#[test]
fn a_secret_never_shows_in_debug_output() {
    let request = Request::Auth {
        secret: Secret::new(b"hunter2hunter2hunter2"),
    };
    let shown = format!("{request:?} {:?}", Secret::new(b"hunter2hunter2hunter2"));
    assert!(!shown.contains("hunter2"), "{shown}");
}

#[test]
fn a_configured_secret_is_16_to_128_printable_ascii_bytes() {
    assert!(is_valid_secret(&[b'a'; MIN_SECRET]));
    assert!(is_valid_secret(&[b'~'; MAX_SECRET]));
    assert!(is_valid_secret(b"!#$%&'()*+,-./09:;<=>?@AZ[]^_`az{|}"));
    assert!(!is_valid_secret(&[b'a'; MIN_SECRET - 1]));
    assert!(!is_valid_secret(&[b'a'; MAX_SECRET + 1]));
    for bad in [b' ', b'\t', 0x7F, 0x80, 0xC3, 0x00] {
        let mut secret = vec![b'a'; 20];
        secret[7] = bad;
        assert!(!is_valid_secret(&secret), "byte {bad:#x}");
    }
}

#[test]
fn secret_lines_skip_blanks_and_comments_and_keep_line_numbers() {
    let text = b"# comment\n\n  first-secret  \r\n\t# indented comment\nsecond";
    let lines: Vec<(usize, &[u8])> = secret_lines(text).collect();
    assert_eq!(lines, vec![(3, &b"first-secret"[..]), (5, &b"second"[..])]);
    assert_eq!(secret_lines(b"").count(), 0);
}

#[test]
fn parses_release() {
    assert_eq!(
        req("R job 42\n"),
        Ok(Request::Release {
            key: key("job"),
            token: 42
        })
    );
}

#[test]
fn parses_keep() {
    assert_eq!(
        req("K job 42 1.5\n"),
        Ok(Request::Keep {
            key: key("job"),
            token: 42,
            lease_ms: 1_500
        })
    );
}

#[test]
fn parses_query() {
    assert_eq!(req("Q job\n"), Ok(Request::Query { key: key("job") }));
}

#[test]
fn parses_info() {
    assert_eq!(req("I\n"), Ok(Request::Info));
}

#[test]
fn request_op_and_key() {
    let acquire = Request::Acquire {
        key: key("a"),
        lease_ms: 1,
        wait_ms: 0,
        limit: None,
        value: None,
    };
    assert_eq!(acquire.op(), Op::Acquire);
    assert_eq!(acquire.key(), Some(&key("a")));
    let release = Request::Release {
        key: key("r"),
        token: 1,
    };
    assert_eq!(
        (release.op(), release.key()),
        (Op::Release, Some(&key("r")))
    );
    let keep = Request::Keep {
        key: key("k"),
        token: 1,
        lease_ms: 1,
    };
    assert_eq!((keep.op(), keep.key()), (Op::Keep, Some(&key("k"))));
    let query = Request::Query { key: key("q") };
    assert_eq!((query.op(), query.key()), (Op::Query, Some(&key("q"))));
    assert_eq!((Request::Info.op(), Request::Info.key()), (Op::Info, None));
}

// --- framing -------------------------------------------------------------

#[test]
fn crlf_is_accepted() {
    assert_eq!(req("A job 30 0\r\n"), acquire("job", 30_000, 0));
    assert_eq!(req("I\r\n"), Ok(Request::Info));
}

#[test]
fn only_one_cr_is_stripped() {
    assert_eq!(req("I\r\r\n"), fatal(Reason::UnknownOp));
    assert_eq!(
        req("Q job\r\r\n"),
        refused_with(Op::Query, None, Reason::BadKey)
    );
}

#[test]
fn line_of_exactly_max_line_bytes_is_accepted() {
    for ending in ["\n", "\r\n"] {
        let line = padded_acquire(MAX_LINE, ending);
        assert_eq!(line.len(), MAX_LINE);
        assert_eq!(req(&line), acquire("k", 30_000, 0));
    }
    let spaces = format!("Q k{}\n", " ".repeat(MAX_LINE - 4));
    assert_eq!(spaces.len(), MAX_LINE);
    assert_eq!(
        req(&spaces),
        refused_with(Op::Query, Some("k"), Reason::ExtraFields)
    );
}

#[test]
fn line_of_max_line_plus_one_bytes_is_too_long() {
    let line = padded_acquire(MAX_LINE + 1, "\n");
    assert_eq!(
        parse_request(line.as_bytes(), MAX),
        Parsed::Line {
            used: MAX_LINE,
            result: fatal(Reason::LineTooLong)
        }
    );
    let crlf = padded_acquire(MAX_LINE + 1, "\r\n");
    assert_eq!(
        parse_request(crlf.as_bytes(), MAX),
        Parsed::Line {
            used: MAX_LINE,
            result: fatal(Reason::LineTooLong)
        }
    );
}

#[test]
fn max_line_bytes_without_newline_is_too_long() {
    let buf = vec![b'A'; MAX_LINE];
    let too_long = Parsed::Line {
        used: MAX_LINE,
        result: fatal(Reason::LineTooLong),
    };
    assert_eq!(parse_request(&buf, MAX), too_long);
    let more = vec![b'x'; 5000];
    assert_eq!(parse_request(&more, MAX), too_long);
}

#[test]
fn fewer_than_max_line_bytes_without_newline_is_incomplete() {
    let buf = vec![b'A'; MAX_LINE - 1];
    assert_eq!(parse_request(&buf, MAX), Parsed::Incomplete);
    assert_eq!(parse_request(b"", MAX), Parsed::Incomplete);
    assert_eq!(parse_request(b"A job 30", MAX), Parsed::Incomplete);
    assert_eq!(parse_request(b"I\r", MAX), Parsed::Incomplete);
}

#[test]
fn several_lines_in_one_buffer_parse_one_after_the_other() {
    let buf = b"A a 30 0\r\nR b 7\n\nQ c\nbad\nI\nK d 1 2";
    let expected = [
        acquire("a", 30_000, 0),
        Ok(Request::Release {
            key: key("b"),
            token: 7,
        }),
        Err(LineError::Blank),
        Ok(Request::Query { key: key("c") }),
        fatal(Reason::UnknownOp),
        Ok(Request::Info),
    ];
    let mut rest: &[u8] = buf;
    for want in expected {
        let Parsed::Line { used, result } = parse_request(rest, MAX) else {
            panic!("incomplete before {want:?}");
        };
        assert_eq!(result, want);
        rest = &rest[used..];
    }
    assert_eq!(rest, b"K d 1 2");
    assert_eq!(parse_request(rest, MAX), Parsed::Incomplete);
}

#[test]
fn blank_line_is_blank() {
    assert_eq!(req("\n"), Err(LineError::Blank));
    assert_eq!(req("\r\n"), Err(LineError::Blank));
}

// --- op and field count ------------------------------------------------

#[test]
fn unknown_op_is_fatal() {
    for line in ["Z job\n", "E - - bad-key\n", "AA job 30 0\n", " Q job\n"] {
        assert_eq!(req(line), fatal(Reason::UnknownOp), "{line:?}");
    }
}

#[test]
fn lowercase_op_is_unknown() {
    for line in ["a job 30 0\n", "r job 1\n", "k job 1 1\n", "q job\n", "i\n"] {
        assert_eq!(req(line), fatal(Reason::UnknownOp), "{line:?}");
    }
}

#[test]
fn junk_bytes_are_unknown_op() {
    for line in [
        b"\x00\x01\x02\n".as_slice(),
        b"\xff\xfe Q k\n",
        b"GET / HTTP/1.1\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\n",
    ] {
        assert_eq!(req_bytes(line), fatal(Reason::UnknownOp), "{line:?}");
    }
}

#[test]
fn missing_fields_are_fatal() {
    for line in [
        "A\n",
        "A job\n",
        "A job 30\n",
        "R\n",
        "R job\n",
        "K job\n",
        "K job 5\n",
        "Q\n",
    ] {
        assert_eq!(req(line), fatal(Reason::MissingFields), "{line:?}");
    }
}

#[test]
fn missing_fields_come_before_a_bad_key() {
    assert_eq!(req_bytes(b"A \x01 30\n"), fatal(Reason::MissingFields));
}

#[test]
fn extra_fields_are_refused_with_the_key() {
    let cases = [
        ("A job 30 0 1 v x\n", Op::Acquire),
        ("R job 5 x\n", Op::Release),
        ("K job 5 30 x\n", Op::Keep),
        ("Q job x\n", Op::Query),
    ];
    for (line, op) in cases {
        assert_eq!(
            req(line),
            refused_with(op, Some("job"), Reason::ExtraFields),
            "{line:?}"
        );
    }
    assert_eq!(
        req("I x\n"),
        refused_with(Op::Info, None, Reason::ExtraFields)
    );
}

#[test]
fn trailing_space_is_extra_fields() {
    assert_eq!(
        req("A job 30 0 2 v \n"),
        refused_with(Op::Acquire, Some("job"), Reason::ExtraFields)
    );
    assert_eq!(
        req("Q job \r\n"),
        refused_with(Op::Query, Some("job"), Reason::ExtraFields)
    );
    assert_eq!(
        req("I \n"),
        refused_with(Op::Info, None, Reason::ExtraFields)
    );
}

#[test]
fn bad_key_comes_before_extra_fields() {
    assert_eq!(
        req("Q a\x7f x\n"),
        refused_with(Op::Query, None, Reason::BadKey)
    );
}

#[test]
fn extra_fields_come_before_numbers() {
    assert_eq!(
        req("A job x y z u v\n"),
        refused_with(Op::Acquire, Some("job"), Reason::ExtraFields)
    );
}

#[test]
fn numbers_are_checked_left_to_right() {
    assert_eq!(
        req("A job x 999999999\n"),
        refused_with(Op::Acquire, Some("job"), Reason::BadLease)
    );
    assert_eq!(
        req("A job 999999999 x\n"),
        refused_with(Op::Acquire, Some("job"), Reason::LeaseTooLong)
    );
    assert_eq!(
        req("K job 0 0\n"),
        refused_with(Op::Keep, Some("job"), Reason::BadToken)
    );
}

// --- lease ---------------------------------------------------------------

#[test]
fn lease_accepts_decimal_seconds() {
    for (text, ms) in [("30", 30_000), ("0.5", 500), ("2.125", 2_125), ("0.001", 1)] {
        assert_eq!(
            req(&format!("A job {text} 0\n")),
            acquire("job", ms, 0),
            "{text}"
        );
    }
}

#[test]
fn lease_with_leading_zeros_is_accepted() {
    assert_eq!(req("A job 007.50 0\n"), acquire("job", 7_500, 0));
}

#[test]
fn malformed_or_zero_lease_is_bad_lease() {
    for text in [
        "2.1250", ".5", "5.", "-1", "+1", "1e3", "abc", "0", "0.000", "", "1.2.3", "1,5", "0x10",
    ] {
        assert_eq!(
            req(&format!("A job {text} 0\n")),
            refused_with(Op::Acquire, Some("job"), Reason::BadLease),
            "{text:?}"
        );
    }
}

#[test]
fn lease_over_max_is_lease_too_long() {
    assert_eq!(req("A job 86400 0\n"), acquire("job", MAX, 0));
    for text in ["86400.001", "86401", "99999999999999"] {
        assert_eq!(
            req(&format!("A job {text} 0\n")),
            refused_with(Op::Acquire, Some("job"), Reason::LeaseTooLong),
            "{text}"
        );
    }
    assert_eq!(
        parse_request(b"A job 11 0\n", 10_000),
        Parsed::Line {
            used: 11,
            result: refused_with(Op::Acquire, Some("job"), Reason::LeaseTooLong)
        }
    );
}

#[test]
fn lease_too_large_for_a_u64_is_still_lease_too_long() {
    for text in HUGE_SECONDS {
        assert_eq!(
            req(&format!("A job {text} 0\n")),
            refused_with(Op::Acquire, Some("job"), Reason::LeaseTooLong),
            "{text}"
        );
        assert_eq!(
            req(&format!("K job 5 {text}\n")),
            refused_with(Op::Keep, Some("job"), Reason::LeaseTooLong),
            "{text}"
        );
    }
    // Above any maximum, even the largest a u64 can hold.
    for (line, reason) in [
        ("A job 18446744073709552 0\n", Reason::LeaseTooLong),
        ("A job 1 18446744073709551.616\n", Reason::WaitTooLong),
        ("K job 5 99999999999999999999\n", Reason::LeaseTooLong),
    ] {
        let op = Op::from_byte(line.as_bytes()[0]).expect("op");
        assert_eq!(
            parse_request(line.as_bytes(), u64::MAX),
            Parsed::Line {
                used: line.len(),
                result: refused_with(op, Some("job"), reason)
            },
            "{line}"
        );
    }
    assert_eq!(
        parse_request(b"A job 18446744073709551.615 0\n", u64::MAX),
        Parsed::Line {
            used: 30,
            result: acquire("job", u64::MAX, 0)
        }
    );
    let digits = "9".repeat(1000);
    assert_eq!(
        req(&format!("A job {digits} 0\n")),
        refused_with(Op::Acquire, Some("job"), Reason::LeaseTooLong)
    );
    // Leading zeros make no number too long.
    let padded = format!("{}30", "0".repeat(900));
    assert_eq!(
        req(&format!("A job {padded} 0\n")),
        acquire("job", 30_000, 0)
    );
    // Malformed is malformed whatever its size.
    for text in ["18446744073709552x", "99999999999999999999.9999", "1e99"] {
        assert_eq!(
            req(&format!("A job {text} 0\n")),
            refused_with(Op::Acquire, Some("job"), Reason::BadLease),
            "{text}"
        );
    }
}

#[test]
fn keep_lease_is_checked_like_acquire_lease() {
    assert_eq!(
        req("K job 5 0\n"),
        refused_with(Op::Keep, Some("job"), Reason::BadLease)
    );
    assert_eq!(
        req("K job 5 86401\n"),
        refused_with(Op::Keep, Some("job"), Reason::LeaseTooLong)
    );
    assert_eq!(
        req("K job 5 x\n"),
        refused_with(Op::Keep, Some("job"), Reason::BadLease)
    );
}

// --- wait ----------------------------------------------------------------

#[test]
fn wait_zero_means_no_limit() {
    assert_eq!(req("A job 30 0\n"), acquire("job", 30_000, 0));
    assert_eq!(req("A job 30 0.000\n"), acquire("job", 30_000, 0));
    assert_eq!(req("A job 30 0.25\n"), acquire("job", 30_000, 250));
    assert_eq!(req("A job 30 86400\n"), acquire("job", 30_000, MAX));
}

#[test]
fn wait_over_max_is_wait_too_long() {
    assert_eq!(
        req("A job 30 86400.001\n"),
        refused_with(Op::Acquire, Some("job"), Reason::WaitTooLong)
    );
    for text in HUGE_SECONDS {
        assert_eq!(
            req(&format!("A job 30 {text}\n")),
            refused_with(Op::Acquire, Some("job"), Reason::WaitTooLong),
            "{text}"
        );
    }
}

#[test]
fn malformed_wait_is_bad_wait() {
    for text in [
        "-1",
        ".5",
        "5.",
        "1e3",
        "x",
        "",
        "0.0001",
        "18446744073709552.0001",
        "1.2.3",
    ] {
        assert_eq!(
            req(&format!("A job 30 {text}\n")),
            refused_with(Op::Acquire, Some("job"), Reason::BadWait),
            "{text:?}"
        );
    }
}

// --- token ---------------------------------------------------------------

#[test]
fn bad_tokens_are_bad_token() {
    for text in [
        "0",
        "-1",
        "+1",
        "18446744073709551616",
        "12a",
        "",
        "1.0",
        "000",
    ] {
        assert_eq!(
            req(&format!("R job {text}\n")),
            refused_with(Op::Release, Some("job"), Reason::BadToken),
            "{text:?}"
        );
        assert_eq!(
            req(&format!("K job {text} 30\n")),
            refused_with(Op::Keep, Some("job"), Reason::BadToken),
            "{text:?}"
        );
    }
}

#[test]
fn token_u64_max_is_accepted() {
    assert_eq!(
        req("R job 18446744073709551615\n"),
        Ok(Request::Release {
            key: key("job"),
            token: u64::MAX
        })
    );
}

#[test]
fn token_with_leading_zeros_is_accepted() {
    assert_eq!(
        req("R job 007\n"),
        Ok(Request::Release {
            key: key("job"),
            token: 7
        })
    );
}

// --- seconds -------------------------------------------------------------

#[test]
fn parse_seconds_grammar() {
    let cases: [(&str, Option<u64>); 16] = [
        ("0", Some(0)),
        ("30", Some(30_000)),
        ("0.5", Some(500)),
        ("0.50", Some(500)),
        ("0.500", Some(500)),
        ("2.125", Some(2_125)),
        ("1.05", Some(1_050)),
        ("2.1250", None),
        (".5", None),
        ("5.", None),
        ("-1", None),
        ("+1", None),
        ("1e3", None),
        (" 1", None),
        ("1 ", None),
        ("", None),
    ];
    for (text, want) in cases {
        assert_eq!(parse_seconds(text.as_bytes()), want, "{text:?}");
    }
}

#[test]
fn write_appends_to_existing_bytes() {
    let mut out = b"A x 1 0\n".to_vec();
    Request::Info.write_to(&mut out);
    Answer::Kept { key: key("k") }.write_to(&mut out);
    assert_eq!(out, b"A x 1 0\nI\nK k\n");
}

#[test]
fn requests_round_trip() {
    let keys = ["k", "-", "clé", &"z".repeat(MAX_KEY)];
    let values = [1, 2, 999, 1_000, 1_001, 30_000, 123_456, MAX - 1, MAX];
    for key_text in keys {
        let k = key(key_text);
        let mut requests = vec![Request::Query { key: k.clone() }, Request::Info];
        for (i, &a) in values.iter().enumerate() {
            let b = values[(i * 7 + 3) % values.len()];
            requests.push(Request::Acquire {
                key: k.clone(),
                lease_ms: a,
                wait_ms: if i % 3 == 0 { 0 } else { b },
                limit: None,
                value: None,
            });
            requests.push(Request::Release {
                key: k.clone(),
                token: a * 1_000_003,
            });
            requests.push(Request::Keep {
                key: k.clone(),
                token: u64::MAX - a,
                lease_ms: b,
            });
        }
        for request in requests {
            let text = request_text(&request);
            assert!(text.len() <= MAX_LINE);
            assert_eq!(req_bytes(&text), Ok(request));
        }
    }
}

#[test]
fn the_common_path_agrees_with_the_general_parser() {
    /// The general parser alone (what `request_from_line` did before
    /// the common path).
    fn general(line: &[u8], max_ms: u64) -> Result<Request, LineError> {
        let f = RequestFields::split(line);
        let op = op_field(f.first[0]).ok_or(LineError::Fatal(Reason::UnknownOp))?;
        if f.count < op.field_count() {
            return Err(LineError::Fatal(Reason::MissingFields));
        }
        if op == Op::Info || op == Op::Auth {
            return request_from_line(line, max_ms);
        }
        let key = Key::new(f.first[1]).map_err(|reason| refused(op, None, reason))?;
        if f.count > op.most_fields() {
            return Err(refused(op, Some(key), Reason::ExtraFields));
        }
        keyed_request(op, key, &f, max_ms)
    }
    let mut rng = Rng(0x5eed);
    let mut lines = valid_lines();
    for text in [
        "A k 0 0",
        "A k 86400 86400",
        "A k 86400.001 0",
        "A k 1 86400.001",
        "A  1 0",
        "A k 1 0 ",
        "A k 1  0",
        "A k 1",
        "R k 0",
        "R k 1 ",
        "R  1",
        "R k 01",
        "A k\x7f 1 0",
        "R k 18446744073709551616",
        "A k 1.0000 0",
        "A k .5 0",
        "AA k 1 0",
        "A\tk 1 0",
        "R k",
        "A k 1 0\r",
        "A k 1 0 3",
        "A k 1 0 10000 v",
        "A k 1 0 10001",
        "A k 1 0 0",
        "A k 1 0 3 ",
        "A k 1 0 3 v w",
        "A k 18446744073709551 0",
        "A k 18446744073709552 0",
        "A k 1 18446744073709552",
        "A k 18446744073709551.615 0",
        "A k 99999999999999999999999999999999999999999 0",
        "A k 1 99999999999999999999999999999999999999999.5",
        "A k 0000000000000000000000000001 00000000000000000000000000",
        "R k 99999999999999999999999999999999999999999",
    ] {
        lines.push(text.as_bytes().to_vec());
    }
    let mut taken = 0;
    for round in 0..60_000 {
        let line = if round % 2 == 0 {
            random_common_line(&mut rng)
        } else {
            lines[rng.below(lines.len())].clone()
        };
        let mut line = mutate(&mut rng, &line);
        while line.last().is_some_and(|&b| b == b'\n') {
            line.pop();
        }
        if line.is_empty() || line.contains(&b'\n') {
            continue;
        }
        for max_ms in [86_400_000, 1_000] {
            if let Some(fast) = common_request(&line, max_ms) {
                taken += 1;
                assert_eq!(
                    Ok(fast),
                    general(&line, max_ms),
                    "{:?}",
                    String::from_utf8_lossy(&line)
                );
            }
        }
    }
    // It took many of them, and the lines it is for.
    assert!(taken > 5_000, "the common path took only {taken} lines");
    // A lease or wait too large for a u64 of milliseconds is left to the
    // general parser, which calls it too long, as for any other size.
    for (line, reason) in [
        ("A k 18446744073709552 0", Reason::LeaseTooLong),
        ("A k 1 18446744073709552", Reason::WaitTooLong),
    ] {
        assert_eq!(common_request(line.as_bytes(), 86_400_000), None);
        assert_eq!(
            request_from_line(line.as_bytes(), 86_400_000),
            Err(refused(Op::Acquire, Some(key("k")), reason)),
            "{line}"
        );
    }
    assert!(common_request(b"A job 30 0", 86_400_000).is_some());
    assert!(common_request(b"R job 18446744073709551615", 86_400_000).is_some());
}

/// `parse_seconds_saturating` against a definition in u128: the grammar
/// (digits, then optionally a point and 1 to 3 digits), and the value
/// in milliseconds capped at `u64::MAX`. Where the value fits, it is
/// what `parse_seconds` says.
#[test]
fn saturating_seconds_follow_the_grammar_and_cap_the_value() {
    fn reference(text: &[u8]) -> Option<u64> {
        let (whole, fraction) = match text.iter().position(|&b| b == b'.') {
            Some(dot) => (&text[..dot], Some(&text[dot + 1..])),
            None => (text, None),
        };
        let digits = |d: &[u8]| !d.is_empty() && d.iter().all(u8::is_ascii_digit);
        if !digits(whole) || fraction.is_some_and(|f| !digits(f) || f.len() > 3) {
            return None;
        }
        let millis = fraction.map_or(0, |f| {
            let n = f.iter().fold(0u128, |n, &b| n * 10 + u128::from(b - b'0'));
            n * 10u128.pow(3 - f.len() as u32)
        });
        let significant = whole.iter().skip_while(|&&b| b == b'0').count();
        if significant > 30 {
            return Some(u64::MAX);
        }
        let whole = whole
            .iter()
            .fold(0u128, |n, &b| n * 10 + u128::from(b - b'0'));
        Some(u64::try_from(whole * 1000 + millis).unwrap_or(u64::MAX))
    }
    let mut rng = Rng(0x5ec5);
    let alphabet = b"0123456789999.x";
    for round in 0..50_000 {
        let text: Vec<u8> = match round % 3 {
            0 => (0..rng.below(46))
                .map(|_| alphabet[rng.below(alphabet.len())])
                .collect(),
            1 => huge_number(&mut rng).into_bytes(),
            _ => format!("{}.{}", huge_number(&mut rng), rng.below(1000)).into_bytes(),
        };
        let got = parse_seconds_saturating(&text);
        let shown = String::from_utf8_lossy(&text);
        assert_eq!(got, reference(&text), "{shown:?}");
        if let Some(exact) = parse_seconds(&text) {
            assert_eq!(got, Some(exact), "{shown:?}");
        } else if got.is_some() {
            assert_eq!(got, Some(u64::MAX), "{shown:?}");
        }
    }
    for text in HUGE_SECONDS {
        assert_eq!(
            parse_seconds_saturating(text.as_bytes()),
            reference(text.as_bytes())
        );
    }
    assert_eq!(
        parse_seconds_saturating(b"18446744073709551.615"),
        Some(u64::MAX)
    );
    assert_eq!(
        parse_seconds_saturating(b"18446744073709551.614"),
        Some(u64::MAX - 1)
    );
}

#[test]
fn an_acquire_may_name_a_limit_and_then_a_value() {
    assert_eq!(req("A job 30 0\n"), acquire_with(None, None));
    assert_eq!(req("A job 30 0 3\n"), acquire_with(Some(3), None));
    assert_eq!(req("A job 30 0 1\n"), acquire_with(Some(1), None));
    assert_eq!(req("A job 30 0 0003\r\n"), acquire_with(Some(3), None));
    assert_eq!(req("A job 30 0 10000\n"), acquire_with(Some(10_000), None));
    assert_eq!(
        req("A job 30 0 1 10.0.0.7:8080\n"),
        acquire_with(Some(1), Some("10.0.0.7:8080"))
    );
    // The fast path reads them the same way.
    for line in ["A job 30 0 3", "A job 30 0 1 10.0.0.7:8080"] {
        assert_eq!(
            common_request(line.as_bytes(), MAX).map(Ok),
            Some(req(&format!("{line}\n")))
        );
    }
}

#[test]
fn a_limit_outside_1_to_10000_is_bad_limit() {
    for limit in [
        "0",
        "10001",
        "x",
        "",
        "-1",
        "1.5",
        "+3",
        "99999999999999999999999",
    ] {
        assert_eq!(
            req(&format!("A job 30 0 {limit}\n")),
            refused_with(Op::Acquire, Some("job"), Reason::BadLimit),
            "{limit:?}"
        );
    }
}

#[test]
fn a_value_is_1_to_250_key_bytes_else_bad_value() {
    let longest = "v".repeat(MAX_VALUE);
    assert_eq!(
        req(&format!("A job 30 0 2 {longest}\n")),
        acquire_with(Some(2), Some(&longest))
    );
    let too_long = format!("A job 30 0 2 {longest}v\n");
    assert_eq!(
        req(&too_long),
        refused_with(Op::Acquire, Some("job"), Reason::BadValue)
    );
    for value in [&b""[..], b"a\x01b", b"\x7f", b"\x1f"] {
        let mut line = b"A job 30 0 2 ".to_vec();
        line.extend_from_slice(value);
        line.push(b'\n');
        assert_eq!(
            req_bytes(&line),
            refused_with(Op::Acquire, Some("job"), Reason::BadValue),
            "{value:?}"
        );
    }
    assert_eq!(
        req("A job 30 0 2 h\u{e9}te\n"),
        acquire_with(Some(2), Some("h\u{e9}te")),
        "UTF-8 is fine"
    );
    assert_eq!(Value::new(b"a b"), Err(Reason::BadValue));
    assert_eq!(
        Value::new(b"-"),
        Err(Reason::BadValue),
        "- is no value on a W line"
    );
    assert!(Value::new(b"--").is_ok());
}

#[test]
fn the_lease_and_wait_are_checked_before_the_limit_and_the_limit_before_the_value() {
    assert_eq!(
        req("A job x 0 0 \x01\n"),
        refused_with(Op::Acquire, Some("job"), Reason::BadLease)
    );
    assert_eq!(
        req("A job 30 x 0 \x01\n"),
        refused_with(Op::Acquire, Some("job"), Reason::BadWait)
    );
    assert_eq!(
        req("A job 30 0 0 \x01\n"),
        refused_with(Op::Acquire, Some("job"), Reason::BadLimit)
    );
    assert_eq!(
        req("A job 30 0 1 v x\n"),
        refused_with(Op::Acquire, Some("job"), Reason::ExtraFields),
        "extra fields first of all"
    );
}

#[test]
fn a_request_with_a_limit_and_a_value_is_written_as_it_is_read() {
    for (request, text) in [
        (acquire_with(Some(3), None), "A job 30 0 3\n"),
        (acquire_with(Some(1), Some("me")), "A job 30 0 1 me\n"),
        // A value needs a limit before it on the wire: 1, the default.
        (acquire_with(None, Some("me")), "A job 30 0 1 me\n"),
    ] {
        let request = request.expect("a request");
        assert_eq!(request_text(&request), text.as_bytes());
    }
    let named = acquire_with(Some(7), Some("x")).expect("a request");
    assert_eq!(req_bytes(&request_text(&named)), Ok(named));
}
