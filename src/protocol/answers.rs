//! Answers: the [`Answer`] type, an `I` answer's pairs ([`Info`]), and
//! parsing and writing an answer line.

use super::*;

/// An answer, server to client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// `A <token> <key>`, or `A <token> <key> <slot>` when the acquire
    /// named a limit (`slot` is Some exactly then).
    Granted {
        /// The fencing token of the new grant.
        token: u64,
        /// The key granted.
        key: Key,
        /// The grant's slot, when the acquire named a limit.
        slot: Option<u32>,
    },
    /// `T <key>`
    Timeout {
        /// The key that was not granted within the wait.
        key: Key,
    },
    /// `R <key>`
    Released {
        /// The key released.
        key: Key,
    },
    /// `N <key>`
    NotHeld {
        /// The key the token did not hold.
        key: Key,
    },
    /// `K <key>`
    Kept {
        /// The key whose lease was extended.
        key: Key,
    },
    /// `Q <key> <token> <ms_left> <waiting>` (`token == 0` and `ms_left == 0` when free)
    Queried {
        /// The key asked about.
        key: Key,
        /// The holder's token; 0 when the key is free.
        token: u64,
        /// Milliseconds left on the holder's lease; 0 when free.
        ms_left: u64,
        /// Requests waiting in line for the key.
        waiting: u64,
    },
    /// `M <host:port> <op> <key>`, or `M - <op> <key>` when `active` is None.
    /// `key` None is written `-`.
    Moved {
        /// The active node's client address, when this node knows it.
        active: Option<String>,
        /// The op of the request that was not served here.
        op: Op,
        /// Its key (None for `I`).
        key: Option<Key>,
    },
    /// `E <op> <key> <reason>`; None is written `-`.
    Error {
        /// The op of the refused request, when the line named one.
        op: Option<Op>,
        /// Its key, when the line had a valid one.
        key: Option<Key>,
        /// Why.
        reason: Reason,
    },
    /// `I <name>=<value> ...`: the pairs in order.
    Info(Info),
    /// `U ok`: the secret was accepted.
    AuthOk,
    /// `W <key> <token> <holders> <waiting> <value>`: a watched key's
    /// holders, in answer to `W` and after every change of them.
    Watched {
        /// The key watched.
        key: Key,
        /// Its state.
        state: WatchState,
    },
    /// `X <key>`: no more `W` lines for the key follow.
    Unwatched {
        /// The key no longer watched.
        key: Key,
    },
}

/// The pairs of an `I` answer, held as the text that follows the `I` on
/// the wire (` name=value` for each pair) behind an `Arc`: a server renders
/// it once and shares it among every `I` answer it sends until a figure
/// changes, so an answer costs a reference count, not a string per pair.
/// Cloning is cheap; equality is that of the text.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Info(Arc<str>);

impl Info {
    /// The answer of these pairs, in order. Names and values must follow
    /// the rule of the module doc (UTF-8 without spaces or control bytes, a
    /// name not empty and without `=`), or the line will not parse back.
    pub fn from_pairs<N: AsRef<str>, V: AsRef<str>>(
        pairs: impl IntoIterator<Item = (N, V)>,
    ) -> Info {
        let mut text = String::new();
        for (name, value) in pairs {
            text.push(' ');
            text.push_str(name.as_ref());
            text.push('=');
            text.push_str(value.as_ref());
        }
        Info(text.into())
    }

    /// The pairs, in order.
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0
            .split(' ')
            .skip(1)
            .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
    }

    /// The value of the first pair called `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// No pairs (the answer is `I` alone).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Both are the same rendering (not merely equal text).
    #[cfg(test)]
    pub(crate) fn is_shared_with(&self, other: &Info) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The bytes of the answer line after the `I` (without the line ending).
    pub(super) fn wire(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for Info {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.pairs()).finish()
    }
}

/// Parse one answer line (for the client library). A malformed line is
/// `Err(LineError::Fatal(Reason::Other))`.
pub fn parse_answer(buf: &[u8]) -> Parsed<Answer> {
    parse_line(buf, |line| {
        answer_from_line(line).ok_or(LineError::Fatal(Reason::Other))
    })
}

pub(super) fn answer_from_line(line: &[u8]) -> Option<Answer> {
    let (tag, rest) = match line.iter().position(|&b| b == b' ') {
        Some(space) => (&line[..space], Some(&line[space + 1..])),
        None => (line, None),
    };
    let kind = match tag {
        [tag] => AnswerKind::from_tag(*tag)?,
        _ => return None,
    };
    // Every answer but `I` has fields after its tag.
    match kind {
        AnswerKind::Info => info_answer(rest),
        AnswerKind::Granted => granted_answer(rest?),
        AnswerKind::Timeout => Some(Answer::Timeout {
            key: single_key(rest?)?,
        }),
        AnswerKind::Released => Some(Answer::Released {
            key: single_key(rest?)?,
        }),
        AnswerKind::NotHeld => Some(Answer::NotHeld {
            key: single_key(rest?)?,
        }),
        AnswerKind::Kept => Some(Answer::Kept {
            key: single_key(rest?)?,
        }),
        AnswerKind::Queried => queried_answer(rest?),
        AnswerKind::Moved => moved_answer(rest?),
        AnswerKind::Error => error_answer(rest?),
        AnswerKind::AuthOk => (rest? == b"ok").then_some(Answer::AuthOk),
        AnswerKind::Watched => watched_answer(rest?),
        AnswerKind::Unwatched => Some(Answer::Unwatched {
            key: single_key(rest?)?,
        }),
    }
}

pub(super) fn watched_answer(rest: &[u8]) -> Option<Answer> {
    let [key, token, holders, waiting, value] = exact(rest)?;
    let value = match value {
        DASH => None,
        value => Some(Value::new(value).ok()?),
    };
    Some(Answer::Watched {
        key: Key::new(key).ok()?,
        state: WatchState {
            token: parse_u64(token)?,
            holders: parse_u64(holders)?,
            waiting: parse_u64(waiting)?,
            value,
        },
    })
}

pub(super) fn single_key(rest: &[u8]) -> Option<Key> {
    let [key] = exact(rest)?;
    Key::new(key).ok()
}

pub(super) fn granted_answer(rest: &[u8]) -> Option<Answer> {
    let (token, key, slot) = match exact(rest) {
        Some([token, key]) => (token, key, None),
        None => {
            let [token, key, slot] = exact(rest)?;
            let slot = parse_u64(slot).and_then(|s| u32::try_from(s).ok())?;
            (token, key, Some(slot))
        }
    };
    Some(Answer::Granted {
        token: parse_token(token).ok()?,
        key: Key::new(key).ok()?,
        slot,
    })
}

pub(super) fn queried_answer(rest: &[u8]) -> Option<Answer> {
    let [key, token, ms_left, waiting] = exact(rest)?;
    Some(Answer::Queried {
        key: Key::new(key).ok()?,
        token: parse_u64(token)?,
        ms_left: parse_u64(ms_left)?,
        waiting: parse_u64(waiting)?,
    })
}

pub(super) fn moved_answer(rest: &[u8]) -> Option<Answer> {
    let [active, op, key] = exact(rest)?;
    let op = op_field(op)?;
    let active = match active {
        DASH => None,
        host => Some(text_field(host)?),
    };
    let key = optional_key(key, !op.is_keyed())?;
    Some(Answer::Moved { active, op, key })
}

pub(super) fn error_answer(rest: &[u8]) -> Option<Answer> {
    let [op, key, reason] = exact(rest)?;
    let op = match op {
        DASH => None,
        letter => Some(op_field(letter)?),
    };
    if reason.is_empty() {
        return None;
    }
    let reason = Reason::from_bytes(reason);
    let dash_is_none = !op.is_some_and(Op::is_keyed) || reason == Reason::BadKey;
    let key = optional_key(key, dash_is_none)?;
    Some(Answer::Error { op, key, reason })
}

/// A key field that may be `-` for "no key" (when `dash_is_none`).
/// Outer None: malformed.
pub(super) fn optional_key(field: &[u8], dash_is_none: bool) -> Option<Option<Key>> {
    if dash_is_none && field == DASH {
        Some(None)
    } else {
        Key::new(field).ok().map(Some)
    }
}

pub(super) fn info_answer(rest: Option<&[u8]>) -> Option<Answer> {
    let Some(rest) = rest else {
        return Some(Answer::Info(Info::default()));
    };
    if !fields(rest).all(is_info_pair) {
        return None;
    }
    let text = std::str::from_utf8(rest).ok()?;
    let mut wire = String::with_capacity(1 + text.len());
    wire.push(' ');
    wire.push_str(text);
    Some(Answer::Info(Info(wire.into())))
}

/// `name=value`, split at the first '=': the name not empty, both without
/// control bytes (UTF-8 is checked on the whole line).
pub(super) fn is_info_pair(field: &[u8]) -> bool {
    let Some(eq) = field.iter().position(|&b| b == b'=') else {
        return false;
    };
    let (name, value) = (&field[..eq], &field[eq + 1..]);
    is_printable_field(name) && (value.is_empty() || is_printable_field(value))
}

/// A non-empty UTF-8 field without control bytes.
pub(super) fn text_field(field: &[u8]) -> Option<String> {
    if !is_printable_field(field) {
        return None;
    }
    std::str::from_utf8(field).ok().map(str::to_owned)
}

impl Answer {
    /// Appends the answer's line, `\n` included.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        out.push(self.kind().tag());
        match self {
            Answer::Granted { token, key, slot } => {
                push_u64(out, *token);
                push_field(out, key.as_bytes());
                if let Some(slot) = slot {
                    push_u64(out, u64::from(*slot));
                }
            }
            Answer::Timeout { key }
            | Answer::Released { key }
            | Answer::NotHeld { key }
            | Answer::Kept { key }
            | Answer::Unwatched { key } => push_field(out, key.as_bytes()),
            Answer::Watched { key, state } => {
                push_field(out, key.as_bytes());
                push_u64(out, state.token);
                push_u64(out, state.holders);
                push_u64(out, state.waiting);
                push_field(out, state.value.as_ref().map_or(DASH, Value::as_bytes));
            }
            Answer::Queried {
                key,
                token,
                ms_left,
                waiting,
            } => {
                push_field(out, key.as_bytes());
                push_u64(out, *token);
                push_u64(out, *ms_left);
                push_u64(out, *waiting);
            }
            Answer::Moved { active, op, key } => {
                push_field(out, active.as_deref().map_or(DASH, str::as_bytes));
                push_field(out, op_text(*op));
                push_field(out, key.as_ref().map_or(DASH, Key::as_bytes));
            }
            Answer::Error { op, key, reason } => {
                push_field(out, op.as_ref().map_or(DASH, |op| op_text(*op)));
                push_field(out, key.as_ref().map_or(DASH, Key::as_bytes));
                push_field(out, reason.as_str().as_bytes());
            }
            Answer::Info(info) => out.extend_from_slice(info.wire()),
            Answer::AuthOk => out.extend_from_slice(b" ok"),
        }
        out.push(b'\n');
    }

    /// The request this answer belongs to: its op, and its key (None for
    /// a keyless op, or a key the request did not have). The one mapping
    /// from an answer to its request: the I/O loop pays back what the
    /// request owed, the client hands the answer to the request waiting
    /// for it, the tests match answers to requests. The op comes from the
    /// op table ([`AnswerKind::op`]); `M` and `E` name theirs. None only
    /// for `E - - <reason>`, which is about the connection (it is closed
    /// after it), not a request.
    pub fn request(&self) -> Option<(Op, Option<&Key>)> {
        let key = match self {
            Answer::Granted { key, .. }
            | Answer::Timeout { key }
            | Answer::Released { key }
            | Answer::NotHeld { key }
            | Answer::Kept { key }
            | Answer::Queried { key, .. }
            | Answer::Watched { key, .. }
            | Answer::Unwatched { key } => Some(key),
            Answer::Info(_) | Answer::AuthOk => None,
            Answer::Moved { op, key, .. } => return Some((*op, key.as_ref())),
            Answer::Error { op, key, .. } => return op.map(|op| (op, key.as_ref())),
        };
        self.kind().op().map(|op| (op, key))
    }
}
