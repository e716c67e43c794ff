//! Tests of answers and reasons.

use super::*;

#[test]
fn unknown_reason_text_is_other() {
    assert_eq!(Reason::from_bytes(b"no-such-reason"), Reason::Other);
    assert_eq!(Reason::from_bytes(b"BAD-KEY"), Reason::Other);
    assert_eq!(Reason::from_bytes(b""), Reason::Other);
}

#[test]
fn only_not_understood_lines_close_the_connection() {
    let closing = [
        Reason::MissingFields,
        Reason::UnknownOp,
        Reason::LineTooLong,
        Reason::TooManyConnections,
        Reason::BadAuth,
        Reason::AuthRequired,
        Reason::ProtectedMode,
    ];
    for reason in KNOWN_REASONS.into_iter().chain([Reason::Other]) {
        assert_eq!(
            reason.closes_connection(),
            closing.contains(&reason),
            "{reason}"
        );
    }
}

// --- every request op ----------------------------------------------------

#[test]
fn parses_auth_with_any_secret_bytes() {
    let secret = "s3cret-0123456789";
    assert_eq!(
        req(&format!("U {secret}\n")),
        Ok(Request::Auth {
            secret: Secret::new(secret.as_bytes())
        })
    );
    // The parser does not judge the secret: short, odd bytes, empty.
    for line in [&b"U x\n"[..], b"U \xff\x01\n", b"U \n"] {
        let Ok(Request::Auth { secret }) = req_bytes(line) else {
            panic!("not U: {line:?}");
        };
        assert_eq!(secret.as_bytes(), &line[2..line.len() - 1]);
    }
}

#[test]
fn auth_answers_parse_and_only_bad_auth_and_auth_required_close() {
    assert_eq!(ans("U ok\n"), Ok(Answer::AuthOk));
    for bad in ["U\n", "U no\n", "U ok x\n", "U OK\n"] {
        assert_eq!(ans(bad), fatal(Reason::Other), "{bad:?}");
    }
    assert!(Reason::BadAuth.closes_connection());
    assert!(Reason::AuthRequired.closes_connection());
    assert!(!Reason::AuthDisabled.closes_connection());
    // `-` after U is no key, as after I.
    assert_eq!(
        ans("E U - auth-disabled\n"),
        Ok(Answer::Error {
            op: Some(Op::Auth),
            key: None,
            reason: Reason::AuthDisabled
        })
    );
}

#[test]
fn parses_acquire() {
    assert_eq!(req("A job 30 5\n"), acquire("job", 30_000, 5_000));
}

#[test]
fn answer_format_is_exact() {
    for (answer, text) in every_answer_with_text() {
        assert_eq!(
            String::from_utf8(answer_text(&answer)).as_deref(),
            Ok(text),
            "{answer:?}"
        );
    }
}

#[test]
fn every_answer_parses_back() {
    for (answer, text) in every_answer_with_text() {
        assert_eq!(ans(text), Ok(answer), "{text:?}");
    }
}

#[test]
fn answer_accepts_crlf() {
    assert_eq!(ans("T job\r\n"), Ok(Answer::Timeout { key: key("job") }));
}

#[test]
fn dash_key_in_error_is_none_only_when_the_key_cannot_be_named() {
    let cases = [
        ("E - - too-many-connections\n", None, None),
        ("E A - bad-key\n", Some(Op::Acquire), None),
        ("E I - extra-fields\n", Some(Op::Info), None),
        ("E A - lease-too-long\n", Some(Op::Acquire), Some(key("-"))),
        ("E R - too-many-keys\n", Some(Op::Release), Some(key("-"))),
    ];
    for (text, op, want) in cases {
        let Ok(Answer::Error {
            op: got_op, key, ..
        }) = ans(text)
        else {
            panic!("not an error answer: {text:?}");
        };
        assert_eq!((got_op, key), (op, want), "{text:?}");
    }
}

#[test]
fn dash_key_in_moved_is_none_only_for_info() {
    assert_eq!(
        ans("M h:1 Q -\n"),
        Ok(Answer::Moved {
            active: Some("h:1".to_owned()),
            op: Op::Query,
            key: Some(key("-"))
        })
    );
    assert_eq!(
        ans("M - I -\n"),
        Ok(Answer::Moved {
            active: None,
            op: Op::Info,
            key: None
        })
    );
}

#[test]
fn unknown_reason_in_error_answer_is_other() {
    assert_eq!(
        ans("E A job some-new-reason\n"),
        Ok(Answer::Error {
            op: Some(Op::Acquire),
            key: Some(key("job")),
            reason: Reason::Other
        })
    );
}

#[test]
fn info_from_pairs_gives_them_back_in_order() {
    let pairs = [("role", "active"), ("empty", ""), ("a", "b=c")];
    let info = Info::from_pairs(pairs);
    assert_eq!(info.pairs().collect::<Vec<_>>(), pairs);
    assert_eq!((info.get("a"), info.get("x")), (Some("b=c"), None));
    assert!(!info.is_empty());
    assert!(Info::default().is_empty() && Info::default().pairs().next().is_none());
    assert_eq!(
        format!("{info:?}"),
        r#"[("role", "active"), ("empty", ""), ("a", "b=c")]"#
    );
}

#[test]
fn info_pairs_split_at_the_first_equals() {
    assert_eq!(
        ans("I a=b=c empty=\n"),
        Ok(Answer::Info(Info::from_pairs([
            ("a", "b=c"),
            ("empty", "")
        ])))
    );
}

#[test]
fn malformed_answers_are_fatal_other() {
    let lines: [&[u8]; 33] = [
        b"Z job\n",
        b"a 1 job\n",
        b"A\n",
        b"A 1\n",
        b"A 0 job\n",
        b"A x job\n",
        b"A 1 job extra\n",
        b"A 18446744073709551616 job\n",
        b"T\n",
        b"T \n",
        b"T job extra\n",
        b"R a\x7f\n",
        b"N  job\n",
        b"K job \n",
        b"Q job 1 2\n",
        b"Q job 1 2 3 4\n",
        b"Q job -1 2 3\n",
        b"Q job 1 2.5 3\n",
        b"M h:1 A\n",
        b"M h:1 Z job\n",
        b"M  A job\n",
        b"M h\x01:1 A job\n",
        b"M h:1 A -x -\n",
        b"E A job\n",
        b"E A job \n",
        b"E Z job bad-key\n",
        b"E - - bad-key extra\n",
        b"I role\n",
        b"I role=active  node=x\n",
        b"I =x\n",
        b"I role=active \n",
        b"I role=\xff\n",
        b"\x00\x01\n",
    ];
    for line in lines {
        assert_eq!(ans_bytes(line), fatal(Reason::Other), "{line:?}");
    }
}

#[test]
fn blank_answer_line_is_blank() {
    assert_eq!(ans("\n"), Err(LineError::Blank));
    assert_eq!(ans("\r\n"), Err(LineError::Blank));
}

#[test]
fn answer_lines_use_the_max_line_rule() {
    let too_long = vec![b'I'; MAX_LINE];
    assert_eq!(
        parse_answer(&too_long),
        Parsed::Line {
            used: MAX_LINE,
            result: fatal(Reason::LineTooLong)
        }
    );
    assert_eq!(parse_answer(&too_long[1..]), Parsed::Incomplete);
    let value = "v".repeat(MAX_LINE - "I a=\n".len());
    let exact_line = format!("I a={value}\n");
    assert_eq!(exact_line.len(), MAX_LINE);
    assert_eq!(
        ans(&exact_line),
        Ok(Answer::Info(Info::from_pairs([("a", value)])))
    );
}

#[test]
fn several_answers_in_one_buffer_parse_one_after_the_other() {
    let buf = b"A 1 a\nT b\r\nE - - unknown-op\nR c";
    let mut rest: &[u8] = buf;
    let mut seen = Vec::new();
    while let Parsed::Line { used, result } = parse_answer(rest) {
        seen.push(result);
        rest = &rest[used..];
    }
    assert_eq!(seen.len(), 3);
    assert_eq!(rest, b"R c");
    assert_eq!(seen[1], Ok(Answer::Timeout { key: key("b") }));
}

#[test]
fn answers_round_trip() {
    let numbers = [0, 1, 9, 10, 999, 1_000, 86_400_000, u64::MAX - 1, u64::MAX];
    let ops = [Op::Acquire, Op::Release, Op::Keep, Op::Query];
    for key_text in ["k", "-", "日本", &"y".repeat(MAX_KEY)] {
        let k = key(key_text);
        let mut answers = vec![
            Answer::Timeout { key: k.clone() },
            Answer::Released { key: k.clone() },
            Answer::NotHeld { key: k.clone() },
            Answer::Kept { key: k.clone() },
        ];
        for (i, &n) in numbers.iter().enumerate() {
            let m = numbers[(i * 5 + 2) % numbers.len()];
            answers.push(Answer::Queried {
                key: k.clone(),
                token: n,
                ms_left: m,
                waiting: n ^ m,
            });
            answers.push(Answer::Granted {
                token: n.max(1),
                key: k.clone(),
                slot: None,
            });
        }
        for (i, op) in ops.into_iter().enumerate() {
            let active = (i % 2 == 0).then(|| format!("host{i}:7373"));
            answers.push(Answer::Moved {
                active,
                op,
                key: Some(k.clone()),
            });
            for reason in KNOWN_REASONS.into_iter().chain([Reason::Other]) {
                if reason != Reason::BadKey {
                    answers.push(Answer::Error {
                        op: Some(op),
                        key: Some(k.clone()),
                        reason,
                    });
                }
            }
        }
        for answer in answers {
            assert_eq!(ans_bytes(&answer_text(&answer)), Ok(answer));
        }
    }
}

#[test]
fn a_grant_carries_its_slot_when_the_acquire_named_a_limit() {
    let with_slot = Answer::Granted {
        token: 42,
        key: key("job"),
        slot: Some(3),
    };
    assert_eq!(answer_text(&with_slot), b"A 42 job 3\n");
    assert_eq!(ans("A 42 job 3\n"), Ok(with_slot));
    assert_eq!(
        ans("A 42 job\n"),
        Ok(Answer::Granted {
            token: 42,
            key: key("job"),
            slot: None
        })
    );
    for bad in [
        "A 42 job x\n",
        "A 42 job -1\n",
        "A 42 job 3 4\n",
        "A 42 job 4294967296\n",
    ] {
        assert_eq!(ans(bad), fatal(Reason::Other), "{bad:?}");
    }
}

#[test]
fn the_semaphore_and_watch_reasons_have_their_wire_text() {
    for (reason, text) in [
        (Reason::BadLimit, "bad-limit"),
        (Reason::BadValue, "bad-value"),
        (Reason::LimitMismatch, "limit-mismatch"),
        (Reason::TooManyWatches, "too-many-watches"),
    ] {
        assert_eq!(reason.as_str(), text);
        assert_eq!(Reason::from_bytes(text.as_bytes()), reason);
        assert!(KNOWN_REASONS.contains(&reason));
        assert!(!reason.closes_connection());
    }
}
