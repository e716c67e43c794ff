//! What an acquire may ask for beyond its key, lease and wait: the key's
//! limit (a semaphore) and the holder's value, as [`AcquireOptions`].
//!
//! Owns: checking them before anything is sent (a limit of 1 to
//! [`MAX_LIMIT`], a value of 1 to [`MAX_VALUE`] key bytes), with an error
//! that says what is accepted, and what goes on the wire for them (a value
//! alone names limit 1, since the value is the field after the limit).
//! Used on the caller's thread.
//!
//! Never does: I/O, or decide anything the server decides (a limit that
//! differs from the key's is the server's `limit-mismatch`).

use crate::client::Error;
use crate::protocol::{MAX_LIMIT, MAX_VALUE, Value};

/// A key's limit and the holder's value, for [`Client::acquire_with`]
/// and the other `*_with` calls. The default asks for neither: a plain
/// mutex, as [`Client::acquire`] does.
///
/// - `limit(n)`: the key is a semaphore that up to `n` grants hold at once
///   (1 to 10000). Every acquire of the key names the same limit while it
///   has a holder or a waiter; another is refused
///   ([`Reason::LimitMismatch`](crate::protocol::Reason::LimitMismatch)).
///   The grant's [`slot`](crate::client::Grant::slot) is the lowest of
///   `0..n` that no other live grant of the key holds.
/// - `value(v)`: the holder's value (an address, a host name): 1 to 250
///   bytes, no spaces or control characters. Watchers of the key see the
///   value of its newest grant.
///
/// ```no_run
/// use std::time::Duration;
/// use baton::client::{AcquireOptions, Client};
/// # fn main() -> Result<(), baton::client::Error> {
/// let client = Client::connect(["127.0.0.1:7373"])?;
/// let options = AcquireOptions::new().limit(4).value("host-a");
/// let grant = client.acquire_with("gpu", Duration::from_secs(30), None, &options)?;
/// println!("slot {} of 4, token {}", grant.slot(), grant.token());
/// # Ok(())
/// # }
/// ```
///
/// [`Client::acquire_with`]: crate::client::Client::acquire_with
/// [`Client::acquire`]: crate::client::Client::acquire
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AcquireOptions {
    limit: Option<u32>,
    value: Option<Vec<u8>>,
}

impl AcquireOptions {
    /// Neither a limit nor a value (a plain mutex).
    pub fn new() -> AcquireOptions {
        AcquireOptions::default()
    }

    /// Up to `limit` grants may hold the key at once (1 to 10000; checked
    /// when the acquire is made).
    pub fn limit(mut self, limit: u32) -> AcquireOptions {
        self.limit = Some(limit);
        self
    }

    /// The holder's value (1 to 250 bytes, no spaces or control
    /// characters; checked when the acquire is made).
    pub fn value(mut self, value: impl AsRef<[u8]>) -> AcquireOptions {
        self.value = Some(value.as_ref().to_vec());
        self
    }

    /// The limit asked for, if any.
    pub fn get_limit(&self) -> Option<u32> {
        self.limit
    }

    /// The value asked for, if any.
    pub fn get_value(&self) -> Option<&[u8]> {
        self.value.as_deref()
    }

    /// Checked, as the wire carries them.
    pub(crate) fn check(&self) -> Result<Ask, Error> {
        if let Some(limit) = self.limit
            && !(1..=MAX_LIMIT).contains(&limit)
        {
            return Err(Error::InvalidArgument(format!(
                "bad limit {limit}: 1 to {MAX_LIMIT}"
            )));
        }
        let value = match &self.value {
            None => None,
            Some(bytes) => Some(Value::new(bytes).map_err(|_| {
                Error::InvalidArgument(format!(
                    "bad value {:?}: 1 to {MAX_VALUE} bytes, no spaces or control characters",
                    String::from_utf8_lossy(bytes)
                ))
            })?),
        };
        // The value is the field after the limit: a value alone names the
        // limit every plain acquire stands for.
        let limit = match (self.limit, &value) {
            (None, Some(_)) => Some(1),
            (limit, _) => limit,
        };
        Ok(Ask { limit, value })
    }
}

/// [`AcquireOptions`] checked: the optional fields of `A` as sent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Ask {
    pub limit: Option<u32>,
    pub value: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_asks_for_nothing() {
        assert_eq!(AcquireOptions::new().check(), Ok(Ask::default()));
    }

    #[test]
    fn a_limit_is_1_to_10000() {
        for good in [1, 2, MAX_LIMIT] {
            let ask = AcquireOptions::new().limit(good).check().expect("valid");
            assert_eq!(ask.limit, Some(good));
        }
        for bad in [0, MAX_LIMIT + 1, u32::MAX] {
            let Err(Error::InvalidArgument(why)) = AcquireOptions::new().limit(bad).check() else {
                panic!("{bad} is refused");
            };
            assert!(why.contains("1 to 10000"), "{why}");
        }
    }

    #[test]
    fn a_value_is_1_to_250_key_bytes_and_alone_names_limit_1() {
        let ask = AcquireOptions::new()
            .value("10.0.0.7:80")
            .check()
            .expect("valid");
        assert_eq!(ask.limit, Some(1));
        assert_eq!(
            ask.value.as_ref().map(Value::as_bytes),
            Some(&b"10.0.0.7:80"[..])
        );
        let ask = AcquireOptions::new()
            .limit(3)
            .value("a")
            .check()
            .expect("valid");
        assert_eq!(ask.limit, Some(3));
        assert!(AcquireOptions::new().value("v".repeat(250)).check().is_ok());
        for bad in [&b""[..], b"a b", b"a\nb", &[b'v'; 251]] {
            let Err(Error::InvalidArgument(why)) = AcquireOptions::new().value(bad).check() else {
                panic!("{bad:?} is refused");
            };
            assert!(why.contains("1 to 250 bytes"), "{why}");
        }
    }
}
