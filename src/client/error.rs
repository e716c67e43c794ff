//! The client's error type: what can go wrong with a call, typed so callers
//! can tell "the server said no" from "no server could be asked".
//!
//! Owns: [`Error`] (and [`AuthRefused`], the reason of a refused secret)
//! and their one-line messages. Used on the caller's thread.
//!
//! Never does: carry I/O handles or anything that is not `Clone + Send`.

use std::fmt;

use crate::protocol::Reason;

/// Why a call failed.
///
/// The first group of variants is a clear answer from the server; the
/// second means no server gave one, so the outcome on the server may be
/// unknown (a grant made just before a connection dropped stays held until
/// its lease runs out).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The server answered `T`: the key was not granted within the `wait`.
    /// Nothing was granted, nothing is held.
    Timeout,
    /// The server refused the request (`E <op> <key> <reason>`), for
    /// example [`Reason::LeaseTooLong`] or [`Reason::TooManyWaiting`].
    Refused(Reason),
    /// `keep`: the token no longer holds the key (released, or its lease ran
    /// out and the key may have gone to someone else).
    NotHeld,
    /// `keep`: the grant's lease has run out by the client's clock, or ran
    /// out before a server answered.
    Expired,
    /// No connection could carry the request: every server is unreachable,
    /// or the connection dropped on each attempt. The text says which
    /// servers were tried and why they failed.
    NoConnection(String),
    /// A server took the request but did not answer in time; the client
    /// closed that connection.
    NoAnswer(String),
    /// The servers reached are standbys that know no active node (`M -`)
    /// for too long, or redirect in a loop.
    NoActive(String),
    /// An argument was refused before anything was sent (bad key, zero
    /// lease, bad address).
    InvalidArgument(String),
    /// The server answered something that makes no sense for the request.
    Protocol(String),
    /// A server refused this client's secret (`bad-auth`), or wants one and
    /// none was set (`auth-required`): see `ClientBuilder::auth`.
    /// [`AuthRefused::reason`] is the server's reason; its text says which
    /// servers refused, and never holds the secret.
    Auth(AuthRefused),
    /// The client was closed (`Client::close`): every call on it, or on its
    /// grants, held keys and watches, fails with this from then on.
    Closed,
    /// A call on a held key (`Held`) that was lost earlier: its lease ran
    /// out, or a server said the token no longer holds it (`Held::wait_lost`
    /// says which). A lost key is never acquired again silently: every
    /// later call on it fails with this.
    Lost,
}

/// Why a server refused this client's secret: [`Error::Auth`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthRefused {
    reason: Reason,
    servers: String,
}

impl AuthRefused {
    /// `reason` (`bad-auth` or `auth-required`), from the servers that
    /// `servers` describes.
    pub(crate) fn new(reason: Reason, servers: String) -> AuthRefused {
        AuthRefused { reason, servers }
    }

    /// The server's reason: [`Reason::BadAuth`] (the secret is wrong) or
    /// [`Reason::AuthRequired`] (the server wants one and none was set).
    pub fn reason(&self) -> Reason {
        self.reason
    }

    /// Which servers refused, and why: "a:1 (the server refused the
    /// secret: bad-auth)".
    pub fn servers(&self) -> &str {
        &self.servers
    }
}

impl fmt::Display for AuthRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.servers)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Timeout => f.write_str("timed out: the key was not granted within the wait"),
            Error::Refused(reason) => write!(f, "refused by the server: {reason}"),
            Error::NotHeld => f.write_str("the key is no longer held by this token"),
            Error::Expired => f.write_str("the lease ran out"),
            Error::NoConnection(why) => write!(f, "no connection: {why}"),
            Error::NoAnswer(why) => write!(f, "no answer: {why}"),
            Error::NoActive(why) => write!(f, "no active node: {why}"),
            Error::InvalidArgument(why) => write!(f, "invalid argument: {why}"),
            Error::Protocol(why) => write!(f, "protocol error: {why}"),
            Error::Auth(why) => write!(f, "authentication failed: {why}"),
            Error::Closed => f.write_str("the client is closed"),
            Error::Lost => f.write_str("the held key was lost earlier"),
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    /// True when no server gave a clear answer (no connection, no answer, no
    /// active node): trying again later may succeed.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            Error::NoConnection(_) | Error::NoAnswer(_) | Error::NoActive(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_is_one_line() {
        let errors = [
            Error::Timeout,
            Error::Refused(Reason::LeaseTooLong),
            Error::NotHeld,
            Error::Expired,
            Error::NoConnection("a:1 (connection refused)".into()),
            Error::NoAnswer("a:1 did not answer within 5s".into()),
            Error::NoActive("every node answered M -".into()),
            Error::InvalidArgument("lease must be above 0".into()),
            Error::Protocol("odd".into()),
            Error::Auth(AuthRefused::new(
                Reason::BadAuth,
                "a:1 (the server refused the secret: bad-auth)".into(),
            )),
            Error::Closed,
            Error::Lost,
        ];
        for error in errors {
            let text = error.to_string();
            assert!(!text.is_empty() && !text.contains('\n'), "{text:?}");
        }
        assert_eq!(
            Error::Refused(Reason::LeaseTooLong).to_string(),
            "refused by the server: lease-too-long"
        );
    }

    #[test]
    fn only_missing_answers_count_as_unreachable() {
        assert!(Error::NoConnection(String::new()).is_unreachable());
        assert!(Error::NoAnswer(String::new()).is_unreachable());
        assert!(Error::NoActive(String::new()).is_unreachable());
        assert!(!Error::Timeout.is_unreachable());
        assert!(!Error::NotHeld.is_unreachable());
        assert!(!Error::Auth(AuthRefused::new(Reason::BadAuth, String::new())).is_unreachable());
        assert!(!Error::Closed.is_unreachable());
        assert!(!Error::Lost.is_unreachable());
    }
}
