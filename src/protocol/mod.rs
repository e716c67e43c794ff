//! The wire format of baton, protocol version 1 (docs/protocol.md).
//!
//! Owns: parsing request and answer lines from bytes, and formatting them back
//! into bytes. Used by the server's I/O loops (requests in, answers out) and by
//! the client library (requests out, answers in). Also the op table
//! ([`OPS`], [`ANSWER_KINDS`]): every op and kind of answer once, with its
//! letter, fields and metrics label, and which request an answer belongs
//! to ([`Answer::request`]).
//!
//! Never does: I/O, allocation per request beyond the key itself, or panics on
//! any input. Every rule here has a unit test in `tests/`.
//!
//! Files: this one holds the limits and the shared types; `ops.rs` the op
//! table; `keys.rs` keys and values; `lines.rs` framing and fields;
//! `numbers.rs` the number formats; `requests.rs` and `answers.rs` parsing
//! and writing each; `reasons.rs` the `E` reasons; `secret.rs` client
//! secrets; `tests/` the tests, by the same concerns. Adding an op: the
//! checklist is ARCHITECTURE.md's "Adding an op".
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

mod answers;
mod keys;
mod lines;
mod numbers;
mod ops;
mod reasons;
mod requests;
mod secret;

use keys::*;
use lines::*;
use numbers::*;
use ops::*;

pub use answers::{Answer, Info, parse_answer};
pub use keys::{INLINE_KEY, Key, Value};
pub(crate) use numbers::parse_u64;
pub use numbers::{parse_seconds, parse_seconds_saturating, write_seconds};
// The peer wire's (the server's) only: a client-alone build has no use for it.
#[cfg(feature = "server")]
pub(crate) use numbers::write_u64;
pub use ops::{ANSWER_KINDS, AnswerKind, AnswerSpec, OPS, Op, OpSpec};
pub use reasons::{KNOWN_REASONS, Reason};
pub use requests::{Request, parse_request};
pub use secret::{Secret, is_valid_secret, secret_lines};

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

#[cfg(test)]
mod tests;
