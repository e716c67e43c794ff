//! THE OP TABLE: every op of the protocol and every kind of answer, once
//! ([`OPS`], [`ANSWER_KINDS`]), the enums and lookups that follow from it
//! by rote. The checklist for adding an op is ARCHITECTURE.md's "Adding
//! an op".

use super::*;

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
            pub(super) fn from_tag(b: u8) -> Option<AnswerKind> {
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
    /// Adding an op: the one checklist is ARCHITECTURE.md's "Adding an op"
    /// (every file an op touches, from this table to the clients and the
    /// replication files). A test (`the_module_doc_lists_every_op`) keeps
    /// the op list in the protocol's module doc in step with these rows.
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

    pub(super) fn as_byte(self) -> u8 {
        self.spec().letter
    }

    /// How many fields a request line of this op has, the op included.
    pub(super) fn field_count(self) -> usize {
        self.spec().fields
    }

    /// How many fields a request line of this op may have, optional ones
    /// included (`A` may add a limit and a value).
    pub(super) fn most_fields(self) -> usize {
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
    pub(super) fn tag(self) -> u8 {
        self.spec().tag
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.as_char())
    }
}

/// An op field: exactly one of the letters of [`OPS`].
pub(super) fn op_field(field: &[u8]) -> Option<Op> {
    match field {
        [b] => Op::from_byte(*b),
        _ => None,
    }
}

/// The op letter as a one-byte slice.
pub(super) fn op_text(op: Op) -> &'static [u8] {
    std::slice::from_ref(&op.spec().letter)
}
