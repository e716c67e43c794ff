//! Tests of the op table.

use super::*;

#[test]
fn every_op_has_its_row_in_order_and_its_letter_parses_to_it() {
    assert_eq!(OPS.len(), Op::COUNT);
    for (i, spec) in OPS.iter().enumerate() {
        let op = spec.op;
        assert_eq!(op.index(), i, "{op:?}");
        // Its own row (rows are consts: compared by what they say,
        // not by address, which the compiler may duplicate).
        assert_eq!((op.spec().op, op.spec().letter), (spec.op, spec.letter));
        assert_eq!(Op::from_byte(spec.letter), Some(op));
        assert_eq!(op_field(&[spec.letter]), Some(op));
        assert_eq!(op.as_char(), char::from(spec.letter));
        assert_eq!((op.is_keyed(), op.label()), (spec.keyed, spec.label));
        // Its field count and keyedness are what the parser does.
        let Ok(request) = req(&line_of(op, spec.fields)) else {
            panic!("{op:?}: {:?}", req(&line_of(op, spec.fields)));
        };
        assert_eq!(request.op(), op);
        assert_eq!(request.key().is_some(), spec.keyed, "{op:?}");
        if spec.fields > 1 {
            assert_eq!(
                req(&line_of(op, spec.fields - 1)),
                fatal(Reason::MissingFields),
                "{op:?}"
            );
        }
        let most = spec.fields + spec.optional;
        assert_eq!(req(&line_of(op, most)).map(|r| r.op()), Ok(op), "{op:?}");
        let extra = spec.keyed.then_some("1");
        assert_eq!(
            req(&line_of(op, most + 1)),
            refused_with(op, extra, Reason::ExtraFields),
            "{op:?}"
        );
        if spec.keyed {
            let bad_key = format!("{} a\x7f{}\n", op.as_char(), " 1".repeat(spec.fields - 2));
            assert_eq!(req(&bad_key), refused_with(op, None, Reason::BadKey));
        }
    }
    for b in 0..=u8::MAX {
        let listed = OPS.iter().any(|spec| spec.letter == b);
        assert_eq!(Op::from_byte(b).is_some(), listed, "{b:#x}");
    }
}

#[test]
fn every_answer_belongs_to_an_op_whose_row_lists_it() {
    assert_eq!(ANSWER_KINDS.len(), AnswerKind::COUNT);
    for (i, spec) in ANSWER_KINDS.iter().enumerate() {
        let kind = spec.kind;
        assert_eq!(kind.index(), i, "{kind:?}");
        assert_eq!((kind.spec().kind, kind.spec().tag), (spec.kind, spec.tag));
        assert_eq!(AnswerKind::from_tag(spec.tag), Some(kind));
        // In the row of the op it names, and in no other; in none if
        // it names its op in the answer.
        let rows: Vec<Op> = OPS
            .iter()
            .filter(|row| row.answers.contains(&kind))
            .map(|row| row.op)
            .collect();
        assert_eq!(rows, Vec::from_iter(kind.op()), "{kind:?}");
    }
    let mut seen = Vec::new();
    for (answer, text) in every_answer_with_text() {
        let kind = answer.kind();
        seen.push(kind);
        assert_eq!(text.as_bytes()[0], kind.spec().tag, "{text:?}");
        match answer.request() {
            Some((op, key)) => {
                let listed = op.spec().answers.contains(&kind);
                assert!(listed || kind.op().is_none(), "{text:?} names {op:?}");
                if let Some(own) = kind.op() {
                    assert_eq!(own, op, "{text:?}");
                    // An op's own answers carry its key, if it has one.
                    assert_eq!(key.is_some(), op.is_keyed(), "{text:?}");
                }
                if !op.is_keyed() {
                    assert_eq!(key, None, "{text:?}");
                }
            }
            None => assert!(
                matches!(answer, Answer::Error { op: None, .. }),
                "{text:?} belongs to no request"
            ),
        }
    }
    // Every kind was seen above.
    for spec in ANSWER_KINDS {
        assert!(
            seen.contains(&spec.kind),
            "no {:?} answer tested",
            spec.kind
        );
    }
}

#[test]
fn an_answer_names_the_op_and_key_of_its_request() {
    let job = key("job");
    let cases = [
        (ans("A 7 job\n"), Some((Op::Acquire, Some(&job)))),
        (ans("T job\n"), Some((Op::Acquire, Some(&job)))),
        (ans("R job\n"), Some((Op::Release, Some(&job)))),
        (ans("N job\n"), Some((Op::Release, Some(&job)))),
        (ans("K job\n"), Some((Op::Keep, Some(&job)))),
        (ans("Q job 0 0 0\n"), Some((Op::Query, Some(&job)))),
        (ans("I\n"), Some((Op::Info, None))),
        (ans("U ok\n"), Some((Op::Auth, None))),
        (ans("M h:1 K job\n"), Some((Op::Keep, Some(&job)))),
        (ans("M - I -\n"), Some((Op::Info, None))),
        (ans("E A job bad-lease\n"), Some((Op::Acquire, Some(&job)))),
        (ans("E Q - bad-key\n"), Some((Op::Query, None))),
        (ans("E U - auth-disabled\n"), Some((Op::Auth, None))),
        (ans("E - - too-many-connections\n"), None),
    ];
    for (answer, request) in cases {
        let answer = answer.expect("valid answer");
        assert_eq!(answer.request(), request, "{answer:?}");
    }
}

#[test]
fn labels_letters_and_tags_are_unique() {
    fn unique<T: PartialEq + fmt::Debug>(items: impl IntoIterator<Item = T>) {
        let items: Vec<T> = items.into_iter().collect();
        for (i, item) in items.iter().enumerate() {
            assert!(!items[..i].contains(item), "{item:?} twice");
        }
    }
    unique(OPS.iter().map(|spec| spec.letter));
    unique(OPS.iter().map(|spec| spec.label));
    unique(ANSWER_KINDS.iter().map(|spec| spec.tag));
    unique(ANSWER_KINDS.iter().map(|spec| spec.label));
    // Labels are Prometheus label values written without escaping.
    for label in OPS
        .iter()
        .map(|spec| spec.label)
        .chain(ANSWER_KINDS.iter().map(|spec| spec.label))
    {
        assert!(
            !label.is_empty() && label.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
            "{label:?}"
        );
    }
}

// --- keys --------------------------------------------------------------

#[test]
fn key_of_1_to_250_bytes_is_valid() {
    assert!(Key::new(b"k").is_ok());
    let long = vec![b'x'; MAX_KEY];
    assert_eq!(Key::new(&long).map(|k| k.as_bytes().len()), Ok(MAX_KEY));
    let line = format!("Q {}\n", "x".repeat(250));
    assert!(req(&line).is_ok());
}

#[test]
fn reason_wire_texts() {
    let expected = [
        (Reason::BadKey, "bad-key"),
        (Reason::BadLease, "bad-lease"),
        (Reason::LeaseTooLong, "lease-too-long"),
        (Reason::BadWait, "bad-wait"),
        (Reason::WaitTooLong, "wait-too-long"),
        (Reason::BadToken, "bad-token"),
        (Reason::ExtraFields, "extra-fields"),
        (Reason::MissingFields, "missing-fields"),
        (Reason::UnknownOp, "unknown-op"),
        (Reason::LineTooLong, "line-too-long"),
        (Reason::TooManyConnections, "too-many-connections"),
        (Reason::TooManyWaiting, "too-many-waiting"),
        (Reason::TooManyKeys, "too-many-keys"),
        (Reason::NotHeld, "not-held"),
        (Reason::ShuttingDown, "shutting-down"),
        (Reason::BadAuth, "bad-auth"),
        (Reason::AuthRequired, "auth-required"),
        (Reason::AuthDisabled, "auth-disabled"),
        (Reason::TooManyWatches, "too-many-watches"),
        (Reason::ProtectedMode, "protected-mode"),
        (Reason::Other, "other"),
    ];
    for (reason, text) in expected {
        assert_eq!(reason.as_str(), text);
        assert_eq!(reason.to_string(), text);
        assert_eq!(Reason::from_bytes(text.as_bytes()), reason);
    }
}

/// The module doc names the ops twice (the letters the parser knows and
/// each op's field count): both follow `OPS`, in its order.
#[test]
fn the_module_doc_lists_every_op() {
    let doc: String = include_str!("../mod.rs")
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ");
    let letters: Vec<String> = OPS
        .iter()
        .map(|op| char::from(op.letter).to_string())
        .collect();
    let known = format!("exactly one of `{}`", letters.join(" "));
    assert!(doc.contains(&known), "the module doc says {known:?}");
    let counts: Vec<String> = OPS
        .iter()
        .map(|op| format!("{} {}", char::from(op.letter), op.fields))
        .collect();
    let takes = format!("({})", counts.join(", "));
    assert!(doc.contains(&takes), "the module doc says {takes:?}");
}
