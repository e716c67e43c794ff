//! The reasons of an `E` answer and their wire texts.

use super::*;

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
