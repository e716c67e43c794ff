//! Tests of the protocol, with the helpers the test files share.

mod answers;
mod fuzz;
mod keys;
mod numbers;
mod ops;
mod requests;

use super::*;

/// The default --max-lease, 86400 s.
const MAX: u64 = 86_400_000;

fn key(text: &str) -> Key {
    Key::new(text.as_bytes()).expect("test key is valid")
}

/// Parses a buffer that must hold exactly one complete request line.
fn req_bytes(line: &[u8]) -> Result<Request, LineError> {
    match parse_request(line, MAX) {
        Parsed::Line { used, result } => {
            assert_eq!(used, line.len(), "used for {line:?}");
            result
        }
        Parsed::Incomplete => panic!("incomplete: {line:?}"),
    }
}

fn req(line: &str) -> Result<Request, LineError> {
    req_bytes(line.as_bytes())
}

/// Parses a buffer that must hold exactly one complete answer line.
fn ans_bytes(line: &[u8]) -> Result<Answer, LineError> {
    match parse_answer(line) {
        Parsed::Line { used, result } => {
            assert_eq!(used, line.len(), "used for {line:?}");
            result
        }
        Parsed::Incomplete => panic!("incomplete: {line:?}"),
    }
}

fn ans(line: &str) -> Result<Answer, LineError> {
    ans_bytes(line.as_bytes())
}

fn refused_with(op: Op, key_text: Option<&str>, reason: Reason) -> Result<Request, LineError> {
    Err(LineError::Refused {
        op,
        key: key_text.map(key),
        reason,
    })
}

fn fatal<T>(reason: Reason) -> Result<T, LineError> {
    Err(LineError::Fatal(reason))
}

fn request_text(request: &Request) -> Vec<u8> {
    let mut out = Vec::new();
    request.write_to(&mut out);
    out
}

fn answer_text(answer: &Answer) -> Vec<u8> {
    let mut out = Vec::new();
    answer.write_to(&mut out);
    out
}

fn seconds_text(ms: u64) -> String {
    let mut out = Vec::new();
    write_seconds(ms, &mut out);
    String::from_utf8(out).expect("seconds are ASCII")
}

fn acquire(key_text: &str, lease_ms: u64, wait_ms: u64) -> Result<Request, LineError> {
    Ok(Request::Acquire {
        key: key(key_text),
        lease_ms,
        wait_ms,
        limit: None,
        value: None,
    })
}

// --- the op table ------------------------------------------------------

/// A request line of `op` with `fields` fields, each after the letter
/// `1` (a valid key, lease, wait, token and secret alike).
fn line_of(op: Op, fields: usize) -> String {
    format!("{}{}\n", op.as_char(), " 1".repeat(fields - 1))
}

/// `A k <zeros>30 0\n`, padded with leading zeros to `total` bytes.
fn padded_acquire(total: usize, ending: &str) -> String {
    let fixed = "A k ".len() + "30 0".len() + ending.len();
    format!("A k {}30 0{ending}", "0".repeat(total - fixed))
}

/// Well-formed numbers of seconds far past any maximum, up to ones too
/// large for a u64 of milliseconds, or of seconds, and past a line.
const HUGE_SECONDS: [&str; 9] = [
    "18446744073709551",
    "18446744073709551.615",
    "18446744073709551.616",
    "18446744073709552",
    "18446744073709551616",
    "99999999999999999999",
    "99999999999999999999.999",
    "000000000000000000000000000000099999999999999999999",
    "340282366920938463463374607431768211456",
];

// --- answer formatting -------------------------------------------------

fn every_answer_with_text() -> Vec<(Answer, &'static str)> {
    vec![
        (
            Answer::Granted {
                token: 42,
                key: key("job"),
                slot: None,
            },
            "A 42 job\n",
        ),
        (Answer::Timeout { key: key("job") }, "T job\n"),
        (Answer::Released { key: key("job") }, "R job\n"),
        (Answer::NotHeld { key: key("job") }, "N job\n"),
        (Answer::Kept { key: key("job") }, "K job\n"),
        (
            Answer::Watched {
                key: key("job"),
                state: WatchState {
                    token: 42,
                    holders: 2,
                    waiting: 3,
                    value: Some(Value::new(b"10.0.0.7:80").expect("a value")),
                },
            },
            "W job 42 2 3 10.0.0.7:80\n",
        ),
        (
            Answer::Watched {
                key: key("job"),
                state: WatchState::default(),
            },
            "W job 0 0 0 -\n",
        ),
        (Answer::Unwatched { key: key("job") }, "X job\n"),
        (
            Answer::Error {
                op: Some(Op::Watch),
                key: Some(key("job")),
                reason: Reason::TooManyWatches,
            },
            "E W job too-many-watches\n",
        ),
        (
            Answer::Moved {
                active: Some("h:1".to_owned()),
                op: Op::Watch,
                key: Some(key("job")),
            },
            "M h:1 W job\n",
        ),
        (
            Answer::Queried {
                key: key("job"),
                token: 42,
                ms_left: 1_500,
                waiting: 3,
            },
            "Q job 42 1500 3\n",
        ),
        (
            Answer::Queried {
                key: key("job"),
                token: 0,
                ms_left: 0,
                waiting: 0,
            },
            "Q job 0 0 0\n",
        ),
        (
            Answer::Moved {
                active: Some("10.0.0.2:7373".to_owned()),
                op: Op::Acquire,
                key: Some(key("job")),
            },
            "M 10.0.0.2:7373 A job\n",
        ),
        (
            Answer::Moved {
                active: None,
                op: Op::Acquire,
                key: Some(key("key")),
            },
            "M - A key\n",
        ),
        (
            Answer::Moved {
                active: Some("h:1".to_owned()),
                op: Op::Info,
                key: None,
            },
            "M h:1 I -\n",
        ),
        (
            Answer::Error {
                op: Some(Op::Acquire),
                key: Some(key("job")),
                reason: Reason::LeaseTooLong,
            },
            "E A job lease-too-long\n",
        ),
        (
            Answer::Error {
                op: Some(Op::Keep),
                key: Some(key("job")),
                reason: Reason::NotHeld,
            },
            "E K job not-held\n",
        ),
        (
            Answer::Error {
                op: Some(Op::Acquire),
                key: None,
                reason: Reason::BadKey,
            },
            "E A - bad-key\n",
        ),
        (
            Answer::Error {
                op: None,
                key: None,
                reason: Reason::LineTooLong,
            },
            "E - - line-too-long\n",
        ),
        (
            Answer::Error {
                op: Some(Op::Info),
                key: None,
                reason: Reason::ExtraFields,
            },
            "E I - extra-fields\n",
        ),
        (Answer::AuthOk, "U ok\n"),
        (
            Answer::Error {
                op: Some(Op::Auth),
                key: None,
                reason: Reason::AuthDisabled,
            },
            "E U - auth-disabled\n",
        ),
        (
            Answer::Error {
                op: None,
                key: None,
                reason: Reason::BadAuth,
            },
            "E - - bad-auth\n",
        ),
        (
            Answer::Error {
                op: None,
                key: None,
                reason: Reason::AuthRequired,
            },
            "E - - auth-required\n",
        ),
        (
            Answer::Info(Info::from_pairs([
                ("role", "active"),
                ("node", "1.2.3.4:5"),
                ("active", "-"),
                ("token", "99"),
            ])),
            "I role=active node=1.2.3.4:5 active=- token=99\n",
        ),
        (Answer::Info(Info::default()), "I\n"),
    ]
}

// --- the fast paths agree with the plain definitions ----------------------

/// `A <key> <lease> <wait>` or `R <key> <token>` made of parts that are
/// mostly well formed (so that many survive `mutate`).
fn random_common_line(rng: &mut Rng) -> Vec<u8> {
    let number = |rng: &mut Rng| -> String {
        match rng.below(7) {
            0 => (rng.next() % 100_000).to_string(),
            1 => format!("{}.{}", rng.next() % 1000, rng.next() % 1000),
            2 => rng.next().to_string(),
            3 => "0".to_string(),
            // Near and far past what a u64 of milliseconds holds.
            4 => huge_number(rng),
            5 => format!("{}.{}", huge_number(rng), rng.next() % 1000),
            _ => (rng.next() % 100).to_string(),
        }
    };
    let key_len = 1 + rng.below(30);
    let key: String = (0..key_len)
        .map(|_| char::from(b'!' + rng.below(94) as u8))
        .collect();
    let line = if rng.below(2) == 0 {
        let mut line = format!("A {key} {} {}", number(rng), number(rng));
        // Now and then a limit, and a value after it.
        if rng.below(4) == 0 {
            line.push_str(&format!(" {}", number(rng)));
            if rng.below(2) == 0 {
                line.push_str(&format!(" {key}"));
            }
        }
        line
    } else {
        format!("R {key} {}", number(rng))
    };
    line.into_bytes()
}

/// 16 to 45 decimal digits: from below `u64::MAX / 1000` (seconds that
/// still fit in milliseconds) to far past `u64::MAX`.
fn huge_number(rng: &mut Rng) -> String {
    let len = 16 + rng.below(30);
    (0..len)
        .map(|i| {
            let digit = rng.below(10) as u8;
            // Mostly no leading zero, so the length is the magnitude.
            char::from(b'0' + if i == 0 { digit.max(1) } else { digit })
        })
        .collect()
}

// --- fuzz ----------------------------------------------------------------

/// A small deterministic xorshift64 generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn byte(&mut self) -> u8 {
        const INTERESTING: &[u8] = b"ARKQIETNM -=.:0123456789\r\n\x7f\x00\t";
        if self.next() & 1 == 0 {
            INTERESTING[self.below(INTERESTING.len())]
        } else {
            self.next() as u8
        }
    }
}

fn random_bytes(rng: &mut Rng) -> Vec<u8> {
    let len = match rng.below(4) {
        0 => rng.below(16),
        1 => rng.below(64),
        2 => rng.below(MAX_LINE - 16),
        _ => MAX_LINE - 8 + rng.below(32),
    };
    (0..len).map(|_| rng.byte()).collect()
}

fn mutate(rng: &mut Rng, line: &[u8]) -> Vec<u8> {
    let mut out = line.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(5) {
            0 if at < out.len() => out[at] = rng.byte(),
            1 => out.insert(at, rng.byte()),
            2 if at < out.len() => {
                out.remove(at);
            }
            3 => out.truncate(at),
            _ => {
                let copy = out[at..].to_vec();
                out.extend_from_slice(&copy);
            }
        }
    }
    out
}

fn valid_lines() -> Vec<Vec<u8>> {
    let mut lines: Vec<Vec<u8>> = [
        "A job 30 0\n",
        "A k 2.125 0.5\r\n",
        "R job 18446744073709551615\n",
        "K job 7 1.5\n",
        "Q job\n",
        "I\n",
    ]
    .iter()
    .map(|line| line.as_bytes().to_vec())
    .collect();
    lines.extend(
        every_answer_with_text()
            .iter()
            .map(|(answer, _)| answer_text(answer)),
    );
    lines
}

/// Parses `buf` line by line with both parsers, checking the invariants.
fn check_no_panic_and_progress(buf: &[u8]) {
    let mut rest = buf;
    while let Parsed::Line { used, result } = parse_request(rest, MAX) {
        assert!((1..=rest.len()).contains(&used), "{rest:?}");
        if let Ok(request) = result {
            assert_eq!(req_bytes(&request_text(&request)), Ok(request));
        }
        rest = &rest[used..];
    }
    let mut rest = buf;
    while let Parsed::Line { used, result } = parse_answer(rest) {
        assert!((1..=rest.len()).contains(&used), "{rest:?}");
        if let Ok(answer) = result {
            assert_eq!(ans_bytes(&answer_text(&answer)), Ok(answer));
        }
        rest = &rest[used..];
    }
}

// ---- limits and values -------------------------------------------------

fn acquire_with(limit: Option<u32>, value: Option<&str>) -> Result<Request, LineError> {
    Ok(Request::Acquire {
        key: key("job"),
        lease_ms: 30_000,
        wait_ms: 0,
        limit,
        value: value.map(|v| Value::new(v.as_bytes()).expect("a valid value")),
    })
}
