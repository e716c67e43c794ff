//! The wire format of baton, protocol version 1 (docs/protocol.md).
//!
//! Owns: parsing request and answer lines from bytes, and formatting them back
//! into bytes. Used by the server's I/O loops (requests in, answers out) and by
//! the client library (requests out, answers in). Also the op table
//! ([`OPS`], [`ANSWER_KINDS`]): every op and kind of answer once, with its
//! letter, fields and metrics label, and which request an answer belongs
//! to ([`Answer::request`]); it says how to add an op.
//!
//! Never does: I/O, allocation per request beyond the key itself, or panics on
//! any input. Every rule here has a unit test at the bottom of this file.
//!
//! # Framing (requests and answers alike)
//!
//! - A line is the bytes up to and including the first `\n`, at most
//!   [`MAX_LINE`] bytes in all. One `\r` directly before the `\n` is dropped.
//! - No `\n` in the first [`MAX_LINE`] bytes of a buffer that holds at least
//!   [`MAX_LINE`] bytes: `Line { used: MAX_LINE, result: Err(Fatal(LineTooLong)) }`.
//!   Fewer bytes and no `\n`: [`Parsed::Incomplete`], read more.
//! - An empty line (`\n` or `\r\n` alone) is [`LineError::Blank`]: ignored.
//! - Fields are separated by single spaces: the line is split on every space,
//!   so two spaces make an empty field and a trailing space an empty last one.
//!
//! # Requests: the order of checks
//!
//! 1. The first field is exactly one of `A R K Q I U W X` (case-sensitive), else
//!    `Fatal(UnknownOp)`.
//! 2. Fewer fields than the op takes (A 4, R 3, K 4, Q 2, I 1, U 2, W 2, X 2):
//!    `Fatal(MissingFields)`.
//! 3. The key (second field) is 1 to [`MAX_KEY`] bytes, each `>= 0x21` and not
//!    `0x7F`, else `Refused { key: None, reason: BadKey }`.
//! 4. More fields than the op takes (`A` takes up to two more, a limit and
//!    a value): `Refused { reason: ExtraFields }` (with the key; `None` for
//!    `I`, which has no key).
//! 5. The numbers, left to right: a lease is [`parse_seconds`], above 0
//!    (`BadLease`) and at most the maximum (`LeaseTooLong`); a wait is
//!    [`parse_seconds`] (`BadWait`), 0 or at most the same maximum
//!    (`WaitTooLong`); a token is decimal digits only, fits a u64 and is not 0
//!    (`BadToken`). Leading zeros are accepted (`007`, `030.5`). A lease or
//!    wait that follows the grammar is too long, never bad, however many
//!    digits it has: one too large for a u64 of milliseconds counts as above
//!    any maximum ([`parse_seconds_saturating`]), so `bad-lease` and
//!    `bad-wait` mean text that is not a number of seconds. Then `A`'s
//!    optional limit: decimal digits, 1 to [`MAX_LIMIT`] (`BadLimit`), and
//!    its optional value: 1 to [`MAX_VALUE`] key bytes (`BadValue`).
//!
//! `U <secret>` (client authentication) has no key: its second field is
//! taken as the secret whatever its bytes, and more fields are
//! `Refused { op: Auth, key: None, reason: ExtraFields }` (the secret is
//! never echoed in an answer). Whether the secret is right is the server's
//! business, not the parser's; [`is_valid_secret`] is the rule for secrets
//! a server or client is configured with.
//!
//! # Answers
//!
//! [`parse_answer`] is the inverse of [`Answer::write_to`]; anything else is
//! `Fatal(Other)`, which the client treats as a broken connection. Decisions:
//!
//! - A `-` in the key field of `E` means "no key" when the op is `-`, `I` or
//!   `U`, or the reason is `bad-key`; otherwise it is the (valid) key `-`, so a
//!   client can still match answers about a key named `-`. In `M` it means "no
//!   key" only for ops `I` and `U`. [`Answer::write_to`] writes `None` as `-`.
//! - The `<host:port>` of `M` and the names and values of `I` must be UTF-8
//!   without spaces or control bytes; a name is not empty and ends at the
//!   first `=`. `I` with no pairs is valid. Callers of `write_to` must respect
//!   the same rule, or the line they write will not parse back.
//! - `I`'s pairs are an [`Info`]: the line's text after the `I`, behind an
//!   `Arc`, so that a server renders it once for many answers and a flood
//!   of `I` costs no allocation per answer.
//! - The token of `A` is never 0; the token of `Q` is 0 when the key is free.
//! - `W <key> <token> <holders> <waiting> <value>`: three decimal numbers
//!   (the token 0 when nobody holds the key) and a value, `-` for none
//!   ([`WatchState`]). `W` lines come in answer to a `W` request and,
//!   unasked, after every change of a watched key's holders; `X <key>`
//!   answers `X`.
//! - An unknown reason text in `E` parses as [`Reason::Other`].
//! - `U ok` is the only `U` answer.

use std::fmt;
use std::sync::Arc;

/// A line is at most this many bytes, its line ending (`\n` or `\r\n`) included.
pub const MAX_LINE: usize = 1024;
/// A key is 1 to this many bytes.
pub const MAX_KEY: usize = 250;
/// A holder's value (`A <key> <lease> <wait> <limit> <value>`) is 1 to
/// this many bytes, the bytes a key may have.
pub const MAX_VALUE: usize = 250;
/// A key's limit (the grants that may hold it at once) is 1 to this.
pub const MAX_LIMIT: u32 = 10_000;
/// A client secret (`U <secret>`, `--auth-file`) is at least this many bytes.
pub const MIN_SECRET: usize = 16;
/// A client secret is at most this many bytes.
pub const MAX_SECRET: usize = 128;

/// A lock key: 1 to 250 bytes, none of them a space, a control byte (< 0x21)
/// or 0x7F. Bytes >= 0x80 are allowed (UTF-8 is fine).
///
/// Keys of up to `INLINE_KEY` bytes are stored inline (no allocation: most
/// keys are short, and every request carries one); longer ones on the heap.
/// Equality, ordering and hashing are those of the bytes.
#[derive(Clone)]
pub struct Key(KeyRepr);

/// Bytes a key may have and still be stored inline.
pub const INLINE_KEY: usize = 22;

#[derive(Clone)]
enum KeyRepr {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<[u8]>),
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Key) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Key) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

/// A holder's value: 1 to [`MAX_VALUE`] bytes, the same bytes a key may
/// have (no space, control byte or 0x7F), but not `-` alone, which is how
/// a `W` line says "no value". Kept on the heap: most grants
/// carry none, and `Option<Value>` costs them one pointer's worth.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Value(Box<[u8]>);

impl Value {
    /// Validates: 1..=MAX_VALUE bytes, each a key byte, not `-` alone.
    /// Err(BadValue) otherwise.
    pub fn new(bytes: &[u8]) -> Result<Value, Reason> {
        if bytes.len() <= MAX_VALUE && is_printable_field(bytes) && bytes != b"-" {
            Ok(Value(Box::from(bytes)))
        } else {
            Err(Reason::BadValue)
        }
    }

    /// The value's bytes, as sent on the wire.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

/// Declares, from the table of the invocation below it, the [`Op`] and
/// [`AnswerKind`] enums, [`OPS`] and [`ANSWER_KINDS`], and the code that
/// follows from them by rote: the lookups by letter or tag,
/// [`Request::op`], [`Answer::kind`] and [`AnswerKind::op`]. Read the
/// invocation, not this.
macro_rules! protocol_tables {
    (
        $(#[$table_doc:meta])*
        ops {
            $(
                $(#[$op_doc:meta])*
                $op:ident {
                    letter: $letter:literal,
                    fields: $fields:literal,
                    optional: $optional:literal,
                    keyed: $keyed:literal,
                    label: $op_label:literal,
                    answers: [$($answer:ident),* $(,)?] $(,)?
                }
            ),* $(,)?
        }
        answers_naming_their_op: [$($naming:ident),* $(,)?];
        answers {
            $(
                $(#[$kind_doc:meta])*
                $kind:ident { tag: $tag:literal, label: $kind_label:literal $(,)? }
            ),* $(,)?
        }
    ) => {
        /// The request operations, in the order of [`OPS`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Op {
            $( $(#[$op_doc])* $op, )*
        }

        $(#[$table_doc])*
        pub const OPS: &[OpSpec] = &[
            $(
                OpSpec {
                    op: Op::$op,
                    letter: $letter,
                    fields: $fields,
                    optional: $optional,
                    keyed: $keyed,
                    label: $op_label,
                    answers: &[$(AnswerKind::$answer),*],
                },
            )*
        ];

        impl Op {
            /// The op named by a letter, case-sensitive.
            pub fn from_byte(b: u8) -> Option<Op> {
                match b {
                    $( $letter => Some(Op::$op), )*
                    _ => None,
                }
            }
        }

        impl Request {
            /// The request's op (each [`Request`] variant is named after its op).
            pub fn op(&self) -> Op {
                match self {
                    $( Request::$op { .. } => Op::$op, )*
                }
            }
        }

        /// The kinds of [`Answer`], one per variant and named after it, in
        /// the order of [`ANSWER_KINDS`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum AnswerKind {
            $( $(#[$kind_doc])* $kind, )*
        }

        /// Every answer kind's row, in the order of [`AnswerKind`]'s
        /// variants (the order the metrics list them in).
        pub const ANSWER_KINDS: &[AnswerSpec] = &[
            $( AnswerSpec { kind: AnswerKind::$kind, tag: $tag, label: $kind_label }, )*
        ];

        impl AnswerKind {
            /// The op of the request an answer of this kind belongs to:
            /// the op whose row lists it. None for the kinds that name
            /// their op in the answer (`M`, `E`). A kind in no row, or in
            /// two, does not compile.
            pub fn op(self) -> Option<Op> {
                match self {
                    $( $( AnswerKind::$answer => Some(Op::$op), )* )*
                    $( AnswerKind::$naming => None, )*
                }
            }

            /// The kind whose answers start with this tag.
            fn from_tag(b: u8) -> Option<AnswerKind> {
                match b {
                    $( $tag => Some(AnswerKind::$kind), )*
                    _ => None,
                }
            }
        }

        impl Answer {
            /// The answer's kind (each [`AnswerKind`] is named after its
            /// [`Answer`] variant).
            pub fn kind(&self) -> AnswerKind {
                match self {
                    $( Answer::$kind { .. } => AnswerKind::$kind, )*
                }
            }
        }
    };
}

protocol_tables! {
    /// THE OP TABLE. Every op of the protocol and every kind of answer, once.
    /// The parser, the formatter, the server's owed-answer budget, the client's
    /// matching of answers to requests, the metrics labels and the tests all
    /// read it; nothing else lists the ops or the answer kinds.
    ///
    /// An op's row: its letter on the wire; how many fields its request line
    /// has, the letter included, and how many optional ones may follow
    /// them; whether its second field is a key (for a
    /// keyless op, `-` in the key field of an `M` or `E` about it means "no
    /// key"); its `op` label in `baton_requests_total`; and the kinds of answer
    /// that belong to a request of this op (besides `M` and `E`, which can
    /// answer any op and name the op they answer). An answer kind's row: the
    /// tag its line starts with and its `kind` label in `baton_answers_total`.
    /// The metrics list ops and kinds in the order of their rows.
    ///
    /// # Adding a keyed op
    ///
    /// Say `W <key>`, answered `W <key> ...`. Write the four declarations;
    /// the compiler then points at every other edit but the feature's own
    /// two (the handler and the client call), and the table tests at the
    /// one test case that must be added.
    ///
    /// Declarations, in this file:
    /// 1. a row in `ops` below: letter, fields, optional, keyed, label, its
    ///    answers;
    /// 2. a row in `answers` below per new kind of answer: tag, label (the
    ///    metrics list it where its row is);
    /// 3. a [`Request`] variant named after the op;
    /// 4. an [`Answer`] variant per new kind, named after the kind.
    ///
    /// Pointed at by the compiler, in this file:
    /// 5. `keyed_request`: the fields after the key, checked left to right
    ///    (and `common_request` only if the op is common enough to deserve
    ///    the one-pass path);
    /// 6. `Request::write_to`; 7. `Request::key`;
    /// 8. `answer_from_line` (parse the answer); 9. `Answer::write_to`;
    /// 10. `Answer::request`: which field of the answer is the key.
    ///
    /// Pointed at by the compiler, elsewhere:
    /// 11. `src/server/threads/io_loop.rs`, `owed_for`: what a request of
    ///     the op may cost until answered (its longest answer);
    /// 12. `src/client/calls.rs`, `answer_budget`: how long its answer may
    ///     take;
    /// 13. `src/server/core/table_core.rs`, `TableCore::serve`: the
    ///     request's arm, calling its handler.
    ///
    /// The feature itself:
    /// 14. `src/server/core/lock_table/requests.rs`: the handler;
    /// 15. `src/client/calls.rs`: the call that sends it and reads its
    ///     answer (and its method in `src/client/mod.rs`).
    ///
    /// Tests: a case per new answer in `every_answer_with_text` below (the
    /// table tests fail without it), and the arms the compiler asks for in
    /// `tests/hostile.rs` (`arbitrary_request`, `arbitrary_answer`). Docs:
    /// `docs/protocol.md` and this module's doc.
    ///
    /// Nothing else: which request an answer belongs to is
    /// [`Answer::request`] for the I/O loop's budget, the client's matching
    /// and the tests alike, and the metrics take their arrays and labels
    /// from these rows.
    ops {
        /// `A <key> <lease> <wait> [<limit> [<value>]]`: take the key (one
        /// of its `<limit>` slots), waiting up to `<wait>`.
        Acquire { letter: b'A', fields: 4, optional: 2, keyed: true, label: "acquire", answers: [Granted, Timeout] },
        /// `R <key> <token>`: give the key back.
        Release { letter: b'R', fields: 3, optional: 0, keyed: true, label: "release", answers: [Released, NotHeld] },
        /// `K <key> <token> <lease>`: extend a lease.
        Keep { letter: b'K', fields: 4, optional: 0, keyed: true, label: "keep", answers: [Kept] },
        /// `Q <key>`: who holds the key, for how long, how many wait.
        Query { letter: b'Q', fields: 2, optional: 0, keyed: true, label: "query", answers: [Queried] },
        /// `I`: the node's figures.
        Info { letter: b'I', fields: 1, optional: 0, keyed: false, label: "info", answers: [Info] },
        /// `U <secret>`: client authentication, answered by the I/O loop itself.
        Auth { letter: b'U', fields: 2, optional: 0, keyed: false, label: "auth", answers: [AuthOk] },
        /// `W <key>`: the key's holders now, then after every change.
        Watch { letter: b'W', fields: 2, optional: 0, keyed: true, label: "watch", answers: [Watched] },
        /// `X <key>`: no more `W` lines for the key.
        Unwatch { letter: b'X', fields: 2, optional: 0, keyed: true, label: "unwatch", answers: [Unwatched] },
    }
    answers_naming_their_op: [Moved, Error];
    answers {
        /// `A <token> <key>`
        Granted { tag: b'A', label: "granted" },
        /// `T <key>`
        Timeout { tag: b'T', label: "timeout" },
        /// `R <key>`
        Released { tag: b'R', label: "released" },
        /// `N <key>`
        NotHeld { tag: b'N', label: "not_held" },
        /// `K <key>`
        Kept { tag: b'K', label: "kept" },
        /// `Q <key> <token> <ms_left> <waiting>`
        Queried { tag: b'Q', label: "queried" },
        /// `M <host:port> <op> <key>`
        Moved { tag: b'M', label: "moved" },
        /// `E <op> <key> <reason>`
        Error { tag: b'E', label: "error" },
        /// `I <name>=<value> ...`
        Info { tag: b'I', label: "info" },
        /// `U ok`
        AuthOk { tag: b'U', label: "auth_ok" },
        /// `W <key> <token> <holders> <waiting> <value>`
        Watched { tag: b'W', label: "watched" },
        /// `X <key>`
        Unwatched { tag: b'X', label: "unwatched" },
    }
}

/// One op of the protocol: its row of [`OPS`].
#[derive(Debug)]
pub struct OpSpec {
    /// The op this row describes.
    pub op: Op,
    /// Its letter on the wire (the request's first field).
    pub letter: u8,
    /// How many fields its request line has, the letter included.
    pub fields: usize,
    /// How many more fields it may have after those (`A`'s limit and value).
    pub optional: usize,
    /// Whether the request's second field is a key.
    pub keyed: bool,
    /// Its `op` label in the metrics.
    pub label: &'static str,
    /// The kinds of answer that belong to a request of this op, besides
    /// `M` and `E` (which name the op they answer).
    pub answers: &'static [AnswerKind],
}

/// One kind of answer: its row of [`ANSWER_KINDS`].
#[derive(Debug)]
pub struct AnswerSpec {
    /// The kind this row describes.
    pub kind: AnswerKind,
    /// The first byte of its line.
    pub tag: u8,
    /// Its `kind` label in the metrics.
    pub label: &'static str,
}

/// The secret of a `U` line. Its `Debug` never shows the bytes, so a
/// request can be logged without leaking it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Box<[u8]>);

impl Secret {
    /// Any bytes (the parser does not judge a secret; see [`is_valid_secret`]).
    pub fn new(bytes: &[u8]) -> Secret {
        Secret(Box::from(bytes))
    }

    /// The secret's bytes, as sent on the wire.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The lines of a secrets file (`--auth-file`, server and CLI alike) that
/// should hold a secret, with their numbers (from 1): each line trimmed of
/// surrounding whitespace; blank lines and lines starting with `#` left out.
/// Whether each is a valid secret is [`is_valid_secret`].
pub fn secret_lines(contents: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    contents
        .split(|&b| b == b'\n')
        .enumerate()
        .map(|(index, line)| (index + 1, line.trim_ascii()))
        .filter(|(_, line)| !line.is_empty() && !line.starts_with(b"#"))
}

/// The rule for a configured client secret: [`MIN_SECRET`] to
/// [`MAX_SECRET`] bytes of printable ASCII (0x21 to 0x7E: no space).
pub fn is_valid_secret(bytes: &[u8]) -> bool {
    (MIN_SECRET..=MAX_SECRET).contains(&bytes.len())
        && bytes.iter().all(|&b| (0x21..=0x7E).contains(&b))
}

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

/// Why a request was refused or a line not understood: the `<reason>` field of
/// an `E` answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The key is empty, too long, or has a forbidden byte.
    BadKey,
    /// The lease is not a decimal with at most 3 decimals, or is 0.
    BadLease,
    /// The lease is above the server's maximum.
    LeaseTooLong,
    /// The wait is not a decimal with at most 3 decimals.
    BadWait,
    /// The wait is above the server's maximum.
    WaitTooLong,
    /// The token is not a non-zero decimal u64.
    BadToken,
    /// More fields than the op takes.
    ExtraFields,
    /// Fewer fields than the op takes (closes the connection).
    MissingFields,
    /// The op is not one of the protocol's (closes the connection).
    UnknownOp,
    /// The line is longer than MAX_LINE bytes (closes the connection).
    LineTooLong,
    /// The connection would exceed --max-conns (closes the connection).
    TooManyConnections,
    /// The connection has too many requests waiting in line (--max-waiting).
    TooManyWaiting,
    /// The table is full (--max-keys).
    TooManyKeys,
    /// `K` with a token that does not hold the key.
    NotHeld,
    /// The server is shutting down.
    ShuttingDown,
    /// `U` with a secret the server does not know (closes the connection,
    /// after a delay).
    BadAuth,
    /// A request other than `U` first on a connection to a server that
    /// wants authentication (closes the connection).
    AuthRequired,
    /// `U` to a server without `--auth-file`.
    AuthDisabled,
    /// The limit of `A` is not a decimal from 1 to [`MAX_LIMIT`].
    BadLimit,
    /// The value of `A` is not 1 to [`MAX_VALUE`] key bytes.
    BadValue,
    /// `A` names another limit than the one the key is held or awaited with.
    LimitMismatch,
    /// The connection watches as many keys as it may (`--max-watches`).
    TooManyWatches,
    /// A client not on loopback, on a node in protected mode (no `--bind`,
    /// no client authentication, no cluster key: closes the connection).
    ProtectedMode,
    /// A reason this version does not know (only produced when parsing answers).
    Other,
}

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

/// What a `W` line tells of a key: the largest token holding it (0 when
/// none), its live grants, the requests in line, and the value of the
/// grant with the largest token (None when none, or it has no value:
/// `-` on the wire).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchState {
    /// The largest token holding the key; 0 when nobody holds it.
    pub token: u64,
    /// Live grants of the key.
    pub holders: u64,
    /// Requests waiting in line for the key.
    pub waiting: u64,
    /// The value of the grant with the largest token.
    pub value: Option<Value>,
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
    fn wire(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for Info {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.pairs()).finish()
    }
}

/// Why a line could not be taken as a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LineError {
    /// The line was understood enough to name its op (and maybe its key) but
    /// was refused: answer `E <op> <key or -> <reason>`, the connection stays.
    Refused {
        /// The op the line named.
        op: Op,
        /// Its key, when valid.
        key: Option<Key>,
        /// Why it was refused.
        reason: Reason,
    },
    /// The line was not understood: answer `E - - <reason>` and close.
    Fatal(Reason),
    /// An empty line (`\n` or `\r\n` alone): ignored, not answered.
    Blank,
}

/// What the parser made of the start of a buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed<T> {
    /// No complete line yet and fewer than MAX_LINE bytes: read more.
    Incomplete,
    /// One line: `used` bytes (line ending included) and what it says.
    /// A buffer of MAX_LINE bytes or more without a `\n` in its first
    /// MAX_LINE bytes gives `Line { used: MAX_LINE, result: Err(Fatal(LineTooLong)) }`.
    Line {
        /// Bytes of the buffer the line took, its line ending included.
        used: usize,
        /// What the line says, or why it could not be taken.
        result: Result<T, LineError>,
    },
}

/// The text written for "none" in the optional fields of `M` and `E`.
const DASH: &[u8] = b"-";

// ---------------------------------------------------------------------------
// Key, Op, Reason
// ---------------------------------------------------------------------------

impl Key {
    /// Validates: 1..=MAX_KEY bytes, every byte >= 0x21 and != 0x7F.
    /// Err(Reason::BadKey) otherwise.
    pub fn new(bytes: &[u8]) -> Result<Key, Reason> {
        if bytes.is_empty() || bytes.len() > MAX_KEY {
            return Err(Reason::BadKey);
        }
        if bytes.len() > INLINE_KEY {
            return if is_printable_field(bytes) {
                Ok(Key(KeyRepr::Heap(Box::from(bytes))))
            } else {
                Err(Reason::BadKey)
            };
        }
        // A short key is checked without a branch per byte (which the
        // compiler turns into a few vector compares).
        if !all_key_bytes(bytes) {
            return Err(Reason::BadKey);
        }
        Ok(Key::inline(bytes))
    }

    /// A key of bytes already known to be key bytes ([`first_non_key_byte`]
    /// found none): only its length is checked. None if it is empty or too
    /// long.
    fn from_key_bytes(bytes: &[u8]) -> Option<Key> {
        debug_assert!(all_key_bytes(bytes));
        let n = bytes.len();
        if n == 0 || n > MAX_KEY {
            None
        } else if n <= INLINE_KEY {
            Some(Key::inline(bytes))
        } else {
            Some(Key(KeyRepr::Heap(Box::from(bytes))))
        }
    }

    /// A short key (1 to `INLINE_KEY` bytes), copied in at most three
    /// fixed-size moves rather than a call to `memcpy`.
    fn inline(bytes: &[u8]) -> Key {
        let n = bytes.len();
        debug_assert!((1..=INLINE_KEY).contains(&n));
        let mut inline = [0u8; INLINE_KEY];
        if n >= 8 {
            // The first eight, the next eight if the key is longer than
            // sixteen, and the last eight (overlapping the others).
            inline[..8].copy_from_slice(&bytes[..8]);
            if n > 16 {
                inline[8..16].copy_from_slice(&bytes[8..16]);
            }
            inline[n - 8..n].copy_from_slice(&bytes[n - 8..]);
        } else {
            for (to, from) in inline.iter_mut().zip(bytes) {
                *to = *from;
            }
        }
        Key(KeyRepr::Inline {
            len: n as u8,
            bytes: inline,
        })
    }

    /// The key's bytes, as sent on the wire.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            KeyRepr::Inline { len, bytes } => &bytes[..usize::from(*len)],
            KeyRepr::Heap(bytes) => bytes,
        }
    }
}

/// Non-empty, and every byte allowed in a key (no space, control byte or 0x7F).
fn is_printable_field(bytes: &[u8]) -> bool {
    !bytes.is_empty() && all_key_bytes(bytes)
}

/// A byte a key may have: not a space, a control byte or 0x7F.
fn is_key_byte(b: u8) -> bool {
    b >= 0x21 && b != 0x7F
}

/// Where the first byte of `bytes` that may not be in a key is (a space, a
/// control byte or 0x7F: [`is_key_byte`]), eight bytes at a time; None if
/// there is none. One pass both finds where a key field ends and checks it.
fn first_non_key_byte(bytes: &[u8]) -> Option<usize> {
    const LOW: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let mut base = 0;
    let mut rest = bytes;
    while let Some((chunk, more)) = rest.split_first_chunk::<8>() {
        let word = u64::from_le_bytes(*chunk);
        // The lowest marked byte of each is a real one (a false mark only
        // ever lies above a real one): bytes below 0x21, and bytes 0x7F.
        let below = word.wrapping_sub(LOW * 0x21) & !word & HIGH;
        let del = word ^ (LOW * 0x7F);
        let del = del.wrapping_sub(LOW) & !del & HIGH;
        let marks = below | del;
        if marks != 0 {
            return Some(base + (marks.trailing_zeros() / 8) as usize);
        }
        base += 8;
        rest = more;
    }
    rest.iter()
        .position(|&b| !is_key_byte(b))
        .map(|at| base + at)
}

/// Every byte is a key byte ([`is_key_byte`]); no early exit, so that it
/// compiles to vector compares (a key is checked on every request).
fn all_key_bytes(bytes: &[u8]) -> bool {
    bytes.iter().fold(true, |ok, &b| ok & is_key_byte(b))
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.as_bytes()))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self.as_bytes()))
    }
}

impl Op {
    /// How many ops there are.
    pub const COUNT: usize = OPS.len();

    /// The op's row of [`OPS`].
    pub fn spec(self) -> &'static OpSpec {
        &OPS[self.index()]
    }

    /// The op's place in [`OPS`] (and in the metrics' per-op arrays).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The op's letter on the wire: 'A', 'R', 'K', 'Q', 'I' or 'U'.
    pub fn as_char(self) -> char {
        char::from(self.as_byte())
    }

    /// Whether the op's second field is a key.
    pub fn is_keyed(self) -> bool {
        self.spec().keyed
    }

    /// The op's `op` label in the metrics.
    pub fn label(self) -> &'static str {
        self.spec().label
    }

    fn as_byte(self) -> u8 {
        self.spec().letter
    }

    /// How many fields a request line of this op has, the op included.
    fn field_count(self) -> usize {
        self.spec().fields
    }

    /// How many fields a request line of this op may have, optional ones
    /// included (`A` may add a limit and a value).
    fn most_fields(self) -> usize {
        self.spec().fields + self.spec().optional
    }
}

impl AnswerKind {
    /// How many kinds of answer there are.
    pub const COUNT: usize = ANSWER_KINDS.len();

    /// The kind's row of [`ANSWER_KINDS`].
    pub fn spec(self) -> &'static AnswerSpec {
        &ANSWER_KINDS[self.index()]
    }

    /// The kind's place in [`ANSWER_KINDS`] (and in the metrics' arrays).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The kind's `kind` label in the metrics.
    pub fn label(self) -> &'static str {
        self.spec().label
    }

    /// The first byte of an answer line of this kind.
    fn tag(self) -> u8 {
        self.spec().tag
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.as_char())
    }
}

/// Every reason with a wire text of its own (all but `Other`).
pub const KNOWN_REASONS: [Reason; 23] = [
    Reason::BadKey,
    Reason::BadLease,
    Reason::LeaseTooLong,
    Reason::BadWait,
    Reason::WaitTooLong,
    Reason::BadToken,
    Reason::ExtraFields,
    Reason::MissingFields,
    Reason::UnknownOp,
    Reason::LineTooLong,
    Reason::TooManyConnections,
    Reason::TooManyWaiting,
    Reason::TooManyKeys,
    Reason::NotHeld,
    Reason::ShuttingDown,
    Reason::BadAuth,
    Reason::AuthRequired,
    Reason::AuthDisabled,
    Reason::BadLimit,
    Reason::BadValue,
    Reason::LimitMismatch,
    Reason::TooManyWatches,
    Reason::ProtectedMode,
];

impl Reason {
    /// The reason's kebab-case text on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::BadKey => "bad-key",
            Reason::BadLease => "bad-lease",
            Reason::LeaseTooLong => "lease-too-long",
            Reason::BadWait => "bad-wait",
            Reason::WaitTooLong => "wait-too-long",
            Reason::BadToken => "bad-token",
            Reason::ExtraFields => "extra-fields",
            Reason::MissingFields => "missing-fields",
            Reason::UnknownOp => "unknown-op",
            Reason::LineTooLong => "line-too-long",
            Reason::TooManyConnections => "too-many-connections",
            Reason::TooManyWaiting => "too-many-waiting",
            Reason::TooManyKeys => "too-many-keys",
            Reason::NotHeld => "not-held",
            Reason::ShuttingDown => "shutting-down",
            Reason::BadAuth => "bad-auth",
            Reason::AuthRequired => "auth-required",
            Reason::AuthDisabled => "auth-disabled",
            Reason::BadLimit => "bad-limit",
            Reason::BadValue => "bad-value",
            Reason::LimitMismatch => "limit-mismatch",
            Reason::TooManyWatches => "too-many-watches",
            Reason::ProtectedMode => "protected-mode",
            Reason::Other => "other",
        }
    }

    /// The reason named by a wire text; an unknown text is `Reason::Other`.
    pub fn from_bytes(b: &[u8]) -> Reason {
        KNOWN_REASONS
            .into_iter()
            .find(|reason| reason.as_str().as_bytes() == b)
            .unwrap_or(Reason::Other)
    }

    /// Whether the server closes the connection after sending this reason.
    pub fn closes_connection(self) -> bool {
        matches!(
            self,
            Reason::MissingFields
                | Reason::UnknownOp
                | Reason::LineTooLong
                | Reason::TooManyConnections
                | Reason::BadAuth
                | Reason::AuthRequired
                | Reason::ProtectedMode
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// ---------------------------------------------------------------------------
// Framing
// ---------------------------------------------------------------------------

/// Cuts the first line off `buf` and hands its body (without `\n` or `\r\n`,
/// never empty) to `parse`.
fn parse_line<T>(buf: &[u8], parse: impl FnOnce(&[u8]) -> Result<T, LineError>) -> Parsed<T> {
    let window = &buf[..buf.len().min(MAX_LINE)];
    let Some(end) = find_byte(window, b'\n') else {
        return if buf.len() >= MAX_LINE {
            Parsed::Line {
                used: MAX_LINE,
                result: Err(LineError::Fatal(Reason::LineTooLong)),
            }
        } else {
            Parsed::Incomplete
        };
    };
    let line = &window[..end];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let result = if line.is_empty() {
        Err(LineError::Blank)
    } else {
        parse(line)
    };
    Parsed::Line {
        used: end + 1,
        result,
    }
}

/// The index of the first `needle` in `hay`, reading eight bytes at a
/// time (request lines are short, but a byte loop was a third of the I/O
/// loop's own work per request).
fn find_byte(hay: &[u8], needle: u8) -> Option<usize> {
    const LOW: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let pattern = LOW.wrapping_mul(u64::from(needle));
    let mut chunks = hay.chunks_exact(8);
    let mut base = 0;
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word) ^ pattern;
        // A byte of `x` is zero where `needle` is; the lowest set bit of
        // this marks the first such byte (any false marks lie above it).
        let found = x.wrapping_sub(LOW) & !x & HIGH;
        if found != 0 {
            return Some(base + (found.trailing_zeros() / 8) as usize);
        }
        base += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| b == needle)
        .map(|at| base + at)
}

/// Splits a line on single spaces.
fn fields(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|&b| b == b' ')
}

/// Exactly `N` space-separated fields, or None.
fn exact<const N: usize>(line: &[u8]) -> Option<[&[u8]; N]> {
    let mut parts = fields(line);
    let mut out: [&[u8]; N] = [DASH; N];
    for slot in &mut out {
        *slot = parts.next()?;
    }
    parts.next().is_none().then_some(out)
}

/// An op field: exactly one of the letters of [`OPS`].
fn op_field(field: &[u8]) -> Option<Op> {
    match field {
        [b] => Op::from_byte(*b),
        _ => None,
    }
}

// ---------------------------------------------------------------------------
// Numbers
// ---------------------------------------------------------------------------

/// Decimal seconds with at most 3 decimals -> milliseconds. Grammar:
/// `DIGITS ( '.' DIGIT{1,3} )?`. No sign, no exponent, no leading or trailing
/// '.', no spaces. Overflow -> None.
pub fn parse_seconds(field: &[u8]) -> Option<u64> {
    // Whole seconds of up to eight digits (`30`, `0`: nearly every lease
    // and wait) in one pass; anything else (a point, more digits, a bad
    // byte) the general way below.
    if field.len() <= 8 {
        let mut acc = 0u64;
        let mut whole = true;
        for &b in field {
            let digit = b.wrapping_sub(b'0');
            whole &= digit <= 9;
            acc = acc * 10 + u64::from(digit);
        }
        if whole && !field.is_empty() {
            return Some(acc * 1000);
        }
    }
    parse_seconds_general(field)
}

/// [`parse_seconds`] for any field.
fn parse_seconds_general(field: &[u8]) -> Option<u64> {
    let (whole, fraction) = match field.iter().position(|&b| b == b'.') {
        Some(dot) => (&field[..dot], Some(&field[dot + 1..])),
        None => (field, None),
    };
    let millis = match fraction {
        Some(digits) => parse_millis(digits)?,
        None => 0,
    };
    parse_u64(whole)?.checked_mul(1000)?.checked_add(millis)
}

/// [`parse_seconds`] for a request's lease or wait: the same grammar, but a
/// well-formed number too large for a u64 of milliseconds is `u64::MAX`
/// instead of None, so that it is refused as too long (above any maximum)
/// rather than as malformed, however many digits it has. None only for
/// text that breaks the grammar. Never overflows.
pub fn parse_seconds_saturating(field: &[u8]) -> Option<u64> {
    let (whole, fraction) = match field.iter().position(|&b| b == b'.') {
        Some(dot) => (&field[..dot], Some(&field[dot + 1..])),
        None => (field, None),
    };
    let millis = match fraction {
        Some(digits) => parse_millis(digits)?,
        None => 0,
    };
    let whole = parse_u64_saturating(whole)?;
    Some(whole.saturating_mul(1000).saturating_add(millis))
}

/// Decimal digits only (at least one, no sign); a value past `u64::MAX` is
/// `u64::MAX`.
fn parse_u64_saturating(field: &[u8]) -> Option<u64> {
    if field.is_empty() {
        return None;
    }
    field.iter().try_fold(0u64, |acc, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d <= 9)?;
        Some(acc.saturating_mul(10).saturating_add(u64::from(digit)))
    })
}

/// The 1 to 3 digits after the point, as milliseconds.
fn parse_millis(digits: &[u8]) -> Option<u64> {
    let scale = match digits.len() {
        1 => 100,
        2 => 10,
        3 => 1,
        _ => return None,
    };
    Some(parse_u64(digits)? * scale)
}

/// Milliseconds -> shortest decimal seconds text: 30000 -> "30", 500 -> "0.5",
/// 2125 -> "2.125", 0 -> "0".
pub fn write_seconds(ms: u64, out: &mut Vec<u8>) {
    write_u64(ms / 1000, out);
    let millis = ms % 1000;
    if millis != 0 {
        let digits = [millis / 100, millis / 10 % 10, millis % 10].map(|d| b'0' + d as u8);
        let len = if digits[2] != b'0' {
            3
        } else if digits[1] != b'0' {
            2
        } else {
            1
        };
        out.push(b'.');
        out.extend_from_slice(&digits[..len]);
    }
}

/// Decimal digits only (at least one, no sign), fitting a u64.
pub(crate) fn parse_u64(field: &[u8]) -> Option<u64> {
    if field.is_empty() {
        return None;
    }
    // Up to 19 digits cannot overflow a u64: no checks on the way (tokens
    // have 19 digits, so this is the path of every `R` and `K`), and eight
    // digits are checked and added at a time.
    let (head, tail) = field.split_at(field.len().min(19));
    let mut acc = 0u64;
    let mut rest = head;
    while let Some((chunk, more)) = rest.split_first_chunk::<8>() {
        acc = acc * 100_000_000 + u64::from(eight_digits(u64::from_le_bytes(*chunk))?);
        rest = more;
    }
    for &b in rest {
        let digit = b.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        acc = acc * 10 + u64::from(digit);
    }
    tail.iter().try_fold(acc, |acc, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d <= 9)?;
        acc.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// Eight ASCII bytes (the first in the lowest byte of `word`) as the number
/// they write, or None if one is not a decimal digit. No branch per byte.
fn eight_digits(word: u64) -> Option<u32> {
    const ZEROS: u64 = u64::from_ne_bytes([b'0'; 8]);
    const HIGH_NIBBLES: u64 = u64::from_ne_bytes([0xF0; 8]);
    const SIXES: u64 = u64::from_ne_bytes([6; 8]);
    // A digit byte is 0x30-0x39: its high nibble is 3, and stays 3 with 6
    // added (no byte of such a word carries into the next).
    if word & HIGH_NIBBLES != ZEROS || word.wrapping_add(SIXES) & HIGH_NIBBLES != ZEROS {
        return None;
    }
    let digits = word - ZEROS;
    // Adjacent digits into pairs, pairs into fours, fours into eight.
    let pairs = (digits * 10 + (digits >> 8)) & 0x00FF_00FF_00FF_00FF;
    let fours = (pairs * 100 + (pairs >> 16)) & 0x0000_FFFF_0000_FFFF;
    Some(((fours * 10_000 + (fours >> 32)) & 0xFFFF_FFFF) as u32)
}

/// Writes `n` in decimal without allocating beyond growing `out`.
pub(crate) fn write_u64(n: u64, out: &mut Vec<u8>) {
    // A 19-digit token is written for every grant: its digits are made
    // eight at a time, without a loop or a table, as three words of eight
    // digits (the first has at most four), and the leading zeros skipped.
    const ZEROS: u64 = u64::from_ne_bytes([b'0'; 8]);
    let words = [
        eight_ascii((n / 10_000_000_000_000_000) as u32),
        eight_ascii((n / 100_000_000 % 100_000_000) as u32),
        eight_ascii((n % 100_000_000) as u32),
    ];
    let mut text = [0u8; 24];
    for (at, word) in words.iter().enumerate() {
        text[at * 8..at * 8 + 8].copy_from_slice(&word.to_le_bytes());
    }
    // The first word with a digit other than 0 (the last digit is always
    // written), and in it the first such digit (the lowest byte is first).
    let start = match words.iter().position(|&word| word != ZEROS) {
        Some(at) => at * 8 + ((words[at] ^ ZEROS).trailing_zeros() / 8) as usize,
        None => 23,
    };
    out.extend_from_slice(&text[start..]);
}

/// `n` (below 10^8) as eight ASCII digits, leading zeros included, the
/// first in the lowest byte.
fn eight_ascii(n: u32) -> u64 {
    debug_assert!(n < 100_000_000);
    // Two fours, each split into two pairs, each pair into two digits, in
    // lanes of one word; x / 100 is (x * 10486) >> 20 and x / 10 is
    // (x * 103) >> 10 for the values that occur.
    let fours = u64::from(n / 10_000) | u64::from(n % 10_000) << 32;
    let hundreds = ((fours * 10_486) >> 20) & 0x0000_007F_0000_007F;
    let pairs = hundreds | (fours - hundreds * 100) << 16;
    let tens = ((pairs * 103) >> 10) & 0x000F_000F_000F_000F;
    let digits = tens | (pairs - tens * 10) << 8;
    digits | u64::from_ne_bytes([b'0'; 8])
}

/// A lease: malformed or 0 is `BadLease`, well formed but above `max_ms`
/// (however many digits) is `LeaseTooLong`.
fn parse_lease(field: &[u8], max_ms: u64) -> Result<u64, Reason> {
    match parse_seconds(field) {
        Some(0) => Err(Reason::BadLease),
        Some(ms) if ms <= max_ms => Ok(ms),
        Some(_) => Err(Reason::LeaseTooLong),
        None if past_u64(field) => Err(Reason::LeaseTooLong),
        None => Err(Reason::BadLease),
    }
}

/// A wait: malformed is `BadWait`, well formed but above `max_ms` (however
/// many digits) is `WaitTooLong`.
fn parse_wait(field: &[u8], max_ms: u64) -> Result<u64, Reason> {
    match parse_seconds(field) {
        Some(ms) if ms <= max_ms => Ok(ms),
        Some(_) => Err(Reason::WaitTooLong),
        None if past_u64(field) => Err(Reason::WaitTooLong),
        None => Err(Reason::BadWait),
    }
}

/// A field [`parse_seconds`] refused that is nevertheless a well-formed
/// number of seconds, only too large for a u64 of milliseconds: above any
/// maximum, even `u64::MAX` ms. Asked only on that refusal's path.
fn past_u64(field: &[u8]) -> bool {
    parse_seconds_saturating(field).is_some()
}

/// An acquire's limit: decimal digits (leading zeros accepted), 1 to
/// [`MAX_LIMIT`], else `BadLimit`.
fn parse_limit(field: &[u8]) -> Result<u32, Reason> {
    match parse_u64(field) {
        Some(n) if (1..=u64::from(MAX_LIMIT)).contains(&n) => Ok(n as u32),
        _ => Err(Reason::BadLimit),
    }
}

fn parse_token(field: &[u8]) -> Result<u64, Reason> {
    match parse_u64(field) {
        None | Some(0) => Err(Reason::BadToken),
        Some(token) => Ok(token),
    }
}

// ---------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------

/// Parse one request line from the start of buf. lease above max_lease_ms ->
/// Refused LeaseTooLong, wait above max_lease_ms -> Refused WaitTooLong (docs/protocol.md:
/// a wait is 0 or up to the same maximum).
pub fn parse_request(buf: &[u8], max_lease_ms: u64) -> Parsed<Request> {
    parse_line(buf, |line| request_from_line(line, max_lease_ms))
}

/// The first fields of a request line (enough for any op) and how many
/// fields the line has in all.
struct RequestFields<'a> {
    first: [&'a [u8]; 6],
    count: usize,
}

impl<'a> RequestFields<'a> {
    fn split(line: &'a [u8]) -> Self {
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

fn request_from_line(line: &[u8], max_ms: u64) -> Result<Request, LineError> {
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
fn common_request(line: &[u8], max_ms: u64) -> Option<Request> {
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
fn keyed_request(
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
fn finish<T>(
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

fn refused(op: Op, key: Option<Key>, reason: Reason) -> LineError {
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

/// Appends a space and `field`.
fn push_field(out: &mut Vec<u8>, field: &[u8]) {
    out.push(b' ');
    out.extend_from_slice(field);
}

/// Appends a space and `n` in decimal.
fn push_u64(out: &mut Vec<u8>, n: u64) {
    out.push(b' ');
    write_u64(n, out);
}

/// Appends a space and `ms` as decimal seconds.
fn push_seconds(out: &mut Vec<u8>, ms: u64) {
    out.push(b' ');
    write_seconds(ms, out);
}

// ---------------------------------------------------------------------------
// Answers
// ---------------------------------------------------------------------------

/// Parse one answer line (for the client library). A malformed line is
/// `Err(LineError::Fatal(Reason::Other))`.
pub fn parse_answer(buf: &[u8]) -> Parsed<Answer> {
    parse_line(buf, |line| {
        answer_from_line(line).ok_or(LineError::Fatal(Reason::Other))
    })
}

fn answer_from_line(line: &[u8]) -> Option<Answer> {
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

fn watched_answer(rest: &[u8]) -> Option<Answer> {
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

fn single_key(rest: &[u8]) -> Option<Key> {
    let [key] = exact(rest)?;
    Key::new(key).ok()
}

fn granted_answer(rest: &[u8]) -> Option<Answer> {
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

fn queried_answer(rest: &[u8]) -> Option<Answer> {
    let [key, token, ms_left, waiting] = exact(rest)?;
    Some(Answer::Queried {
        key: Key::new(key).ok()?,
        token: parse_u64(token)?,
        ms_left: parse_u64(ms_left)?,
        waiting: parse_u64(waiting)?,
    })
}

fn moved_answer(rest: &[u8]) -> Option<Answer> {
    let [active, op, key] = exact(rest)?;
    let op = op_field(op)?;
    let active = match active {
        DASH => None,
        host => Some(text_field(host)?),
    };
    let key = optional_key(key, !op.is_keyed())?;
    Some(Answer::Moved { active, op, key })
}

fn error_answer(rest: &[u8]) -> Option<Answer> {
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
fn optional_key(field: &[u8], dash_is_none: bool) -> Option<Option<Key>> {
    if dash_is_none && field == DASH {
        Some(None)
    } else {
        Key::new(field).ok().map(Some)
    }
}

fn info_answer(rest: Option<&[u8]>) -> Option<Answer> {
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
fn is_info_pair(field: &[u8]) -> bool {
    let Some(eq) = field.iter().position(|&b| b == b'=') else {
        return false;
    };
    let (name, value) = (&field[..eq], &field[eq + 1..]);
    is_printable_field(name) && (value.is_empty() || is_printable_field(value))
}

/// A non-empty UTF-8 field without control bytes.
fn text_field(field: &[u8]) -> Option<String> {
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

/// The op letter as a one-byte slice.
fn op_text(op: Op) -> &'static [u8] {
    std::slice::from_ref(&op.spec().letter)
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
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

    /// `A k <zeros>30 0\n`, padded with leading zeros to `total` bytes.
    fn padded_acquire(total: usize, ending: &str) -> String {
        let fixed = "A k ".len() + "30 0".len() + ending.len();
        format!("A k {}30 0{ending}", "0".repeat(total - fixed))
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
            "2.1250", ".5", "5.", "-1", "+1", "1e3", "abc", "0", "0.000", "", "1.2.3", "1,5",
            "0x10",
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

    #[test]
    fn fuzz_random_bytes_and_mutated_lines() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let valid = valid_lines();
        for _ in 0..20_000 {
            check_no_panic_and_progress(&random_bytes(&mut rng));
            let line = &valid[rng.below(valid.len())];
            check_no_panic_and_progress(&mutate(&mut rng, line));
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
}
