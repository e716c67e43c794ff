//! Requests: the [`Request`] type, and parsing and writing a request line
//! (a fast path for the common ops, checked against the general parser).

use super::*;

/// A request, client to server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// `A <key> <lease> <wait> [<limit> [<value>]]`; `wait_ms == 0` waits
    /// without limit. `limit` None: the line named none (limit 1, and the
    /// grant is answered without its slot). A `value` is written after a
    /// limit, `1` when `limit` is None.
    Acquire {
        /// The key asked for.
        key: Key,
        /// How long the grant lasts unless kept or released, in ms.
        lease_ms: u64,
        /// How long to wait in line, in ms (0: without limit).
        wait_ms: u64,
        /// The limit named (1 to [`MAX_LIMIT`]); None: none named.
        limit: Option<u32>,
        /// The value the grant is to carry.
        value: Option<Value>,
    },
    /// `R <key> <token>`
    Release {
        /// The key to release.
        key: Key,
        /// The token of the grant being released.
        token: u64,
    },
    /// `K <key> <token> <lease>`
    Keep {
        /// The key held.
        key: Key,
        /// The token of the grant being kept.
        token: u64,
        /// The new lease, from now, in ms.
        lease_ms: u64,
    },
    /// `Q <key>`
    Query {
        /// The key asked about.
        key: Key,
    },
    /// `I`
    Info,
    /// `U <secret>`: never forwarded to the lock owner.
    Auth {
        /// The secret offered.
        secret: Secret,
    },
    /// `W <key>`
    Watch {
        /// The key to watch.
        key: Key,
    },
    /// `X <key>`
    Unwatch {
        /// The key to stop watching.
        key: Key,
    },
}

/// Parse one request line from the start of buf. lease above max_lease_ms ->
/// Refused LeaseTooLong, wait above max_lease_ms -> Refused WaitTooLong (docs/protocol.md:
/// a wait is 0 or up to the same maximum).
pub fn parse_request(buf: &[u8], max_lease_ms: u64) -> Parsed<Request> {
    parse_line(buf, |line| request_from_line(line, max_lease_ms))
}

/// The first fields of a request line (enough for any op) and how many
/// fields the line has in all.
pub(super) struct RequestFields<'a> {
    pub(super) first: [&'a [u8]; 6],
    pub(super) count: usize,
}

impl<'a> RequestFields<'a> {
    pub(super) fn split(line: &'a [u8]) -> Self {
        let mut first: [&[u8]; 6] = [DASH; 6];
        let mut count = 0;
        let mut rest = line;
        // The same fields as `fields(line)`, found a word at a time.
        loop {
            let (field, next) = match find_byte(rest, b' ') {
                Some(at) => (&rest[..at], Some(&rest[at + 1..])),
                None => (rest, None),
            };
            if let Some(slot) = first.get_mut(count) {
                *slot = field;
            }
            count += 1;
            match next {
                Some(next) => rest = next,
                None => break,
            }
        }
        RequestFields { first, count }
    }
}

pub(super) fn request_from_line(line: &[u8], max_ms: u64) -> Result<Request, LineError> {
    if let Some(request) = common_request(line, max_ms) {
        return Ok(request);
    }
    let f = RequestFields::split(line);
    let op = op_field(f.first[0]).ok_or(LineError::Fatal(Reason::UnknownOp))?;
    let need = op.field_count();
    if f.count < need {
        return Err(LineError::Fatal(Reason::MissingFields));
    }
    if !op.is_keyed() {
        // No key: the extra fields are refused without naming any.
        return if f.count > need {
            Err(refused(op, None, Reason::ExtraFields))
        } else if op == Op::Auth {
            Ok(Request::Auth {
                secret: Secret::new(f.first[1]),
            })
        } else {
            Ok(Request::Info)
        };
    }
    let key = Key::new(f.first[1]).map_err(|reason| refused(op, None, reason))?;
    if f.count > op.most_fields() {
        return Err(refused(op, Some(key), Reason::ExtraFields));
    }
    keyed_request(op, key, &f, max_ms)
}

/// The two lines that make up nearly all traffic, `A <key> <lease> <wait>`
/// and `R <key> <token>`, when they are well formed, read in one pass
/// without the general parser's field table; None for anything else (a
/// refusal included), which the general parser then reads and answers as
/// always. It accepts only lines the general parser accepts, with the same
/// result (`the_common_path_agrees_with_the_general_parser`).
pub(super) fn common_request(line: &[u8], max_ms: u64) -> Option<Request> {
    let (&op, rest) = line.split_first()?;
    let rest = rest.strip_prefix(b" ")?;
    // The key ends at its first byte that may not be in a key, which must
    // be the space before the next field.
    let key_end = first_non_key_byte(rest).filter(|&at| rest[at] == b' ')?;
    let (key, rest) = (&rest[..key_end], &rest[key_end + 1..]);
    match op {
        b'A' => {
            let lease_end = find_byte(rest, b' ')?;
            let lease_ms = parse_seconds(&rest[..lease_end])?;
            let rest = &rest[lease_end + 1..];
            let (wait, more) = match find_byte(rest, b' ') {
                Some(at) => (&rest[..at], Some(&rest[at + 1..])),
                None => (rest, None),
            };
            let wait_ms = parse_seconds(wait)?;
            if lease_ms == 0 || lease_ms > max_ms || wait_ms > max_ms {
                return None;
            }
            // A limit, and a value after it: a space left in the value
            // fails it (extra fields): None.
            let (limit, value) = match more {
                None => (None, None),
                Some(more) => match find_byte(more, b' ') {
                    None => (Some(parse_limit(more).ok()?), None),
                    Some(at) => (
                        Some(parse_limit(&more[..at]).ok()?),
                        Some(Value::new(&more[at + 1..]).ok()?),
                    ),
                },
            };
            let key = Key::from_key_bytes(key)?;
            Some(Request::Acquire {
                key,
                lease_ms,
                wait_ms,
                limit,
                value,
            })
        }
        b'R' => {
            let token = parse_u64(rest).filter(|&token| token != 0)?;
            let key = Key::from_key_bytes(key)?;
            Some(Request::Release { key, token })
        }
        _ => None,
    }
}

/// The numbers of a request with a valid key and the right field count.
pub(super) fn keyed_request(
    op: Op,
    key: Key,
    f: &RequestFields<'_>,
    max_ms: u64,
) -> Result<Request, LineError> {
    let [_, _, third, fourth, fifth, sixth] = f.first;
    match op {
        Op::Acquire => {
            let numbers = parse_lease(third, max_ms).and_then(|lease_ms| {
                let wait_ms = parse_wait(fourth, max_ms)?;
                let limit = (f.count > 4).then(|| parse_limit(fifth)).transpose()?;
                let value = (f.count > 5).then(|| Value::new(sixth)).transpose()?;
                Ok((lease_ms, wait_ms, limit, value))
            });
            finish(
                op,
                key,
                numbers,
                |key, (lease_ms, wait_ms, limit, value)| Request::Acquire {
                    key,
                    lease_ms,
                    wait_ms,
                    limit,
                    value,
                },
            )
        }
        Op::Release => finish(op, key, parse_token(third), |key, token| Request::Release {
            key,
            token,
        }),
        Op::Keep => {
            let numbers =
                parse_token(third).and_then(|token| Ok((token, parse_lease(fourth, max_ms)?)));
            finish(op, key, numbers, |key, (token, lease_ms)| Request::Keep {
                key,
                token,
                lease_ms,
            })
        }
        Op::Query => Ok(Request::Query { key }),
        Op::Watch => Ok(Request::Watch { key }),
        Op::Unwatch => Ok(Request::Unwatch { key }),
        // Keyless ops are finished by the caller; never reached.
        Op::Info | Op::Auth => Ok(Request::Info),
    }
}

/// Builds the request from its numbers, or refuses it naming the key.
pub(super) fn finish<T>(
    op: Op,
    key: Key,
    numbers: Result<T, Reason>,
    build: impl FnOnce(Key, T) -> Request,
) -> Result<Request, LineError> {
    match numbers {
        Ok(numbers) => Ok(build(key, numbers)),
        Err(reason) => Err(refused(op, Some(key), reason)),
    }
}

pub(super) fn refused(op: Op, key: Option<Key>, reason: Reason) -> LineError {
    LineError::Refused { op, key, reason }
}

impl Request {
    /// Appends the request's line, `\n` included.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        out.push(self.op().as_byte());
        match self {
            Request::Acquire {
                key,
                lease_ms,
                wait_ms,
                limit,
                value,
            } => {
                push_field(out, key.as_bytes());
                push_seconds(out, *lease_ms);
                push_seconds(out, *wait_ms);
                if limit.is_some() || value.is_some() {
                    push_u64(out, u64::from(limit.unwrap_or(1)));
                }
                if let Some(value) = value {
                    push_field(out, value.as_bytes());
                }
            }
            Request::Release { key, token } => {
                push_field(out, key.as_bytes());
                push_u64(out, *token);
            }
            Request::Keep {
                key,
                token,
                lease_ms,
            } => {
                push_field(out, key.as_bytes());
                push_u64(out, *token);
                push_seconds(out, *lease_ms);
            }
            Request::Query { key } | Request::Watch { key } | Request::Unwatch { key } => {
                push_field(out, key.as_bytes())
            }
            Request::Info => {}
            Request::Auth { secret } => push_field(out, secret.as_bytes()),
        }
        out.push(b'\n');
    }

    /// The request's key; None for `I` and `U`.
    pub fn key(&self) -> Option<&Key> {
        match self {
            Request::Acquire { key, .. }
            | Request::Release { key, .. }
            | Request::Keep { key, .. }
            | Request::Query { key }
            | Request::Watch { key }
            | Request::Unwatch { key } => Some(key),
            Request::Info | Request::Auth { .. } => None,
        }
    }
}
