//! What calls hand back: a [`Grant`] and its [`LockGuard`], and the plain
//! results of release, query, info and connection status.
//!
//! Owns: the grant's view of its lease by the client's own clock — counted
//! from when the acquire (or the last keep) was sent, so it errs early, never
//! late. Used on the caller's thread.
//!
//! Never does: I/O itself; the guard's drop goes through the client.

use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::time::{Duration, Instant};

use crate::client::{Client, Error};
use crate::protocol::Key;

/// A key granted to this client: its key, its fencing token, and when its
/// lease runs out by the client's clock.
///
/// The lease is counted from when the request that started it (the acquire,
/// or the last successful [`Client::keep`]) was sent, so the grant expires
/// here a little before it does on the server. Pass [`Grant::token`] to the
/// resource you protect, which should refuse tokens smaller than the last it
/// accepted.
#[derive(Clone, PartialEq, Eq)]
pub struct Grant {
    key: Key,
    token: u64,
    slot: u32,
    lease: Duration,
    lease_start: Instant,
}

impl Grant {
    pub(crate) fn new(key: Key, token: u64, slot: u32, lease_ms: u64, sent_at: Instant) -> Grant {
        Grant {
            key,
            token,
            slot,
            lease: Duration::from_millis(lease_ms),
            lease_start: sent_at,
        }
    }

    /// A lease extended by a keep sent at `sent_at`.
    pub(crate) fn renew(&mut self, lease_ms: u64, sent_at: Instant) {
        self.lease = Duration::from_millis(lease_ms);
        self.lease_start = sent_at;
    }

    /// The key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The fencing token: greater than every token issued before it.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The grant's slot: for a key acquired with a limit `n`
    /// ([`AcquireOptions::limit`](crate::client::AcquireOptions::limit)),
    /// the lowest of `0..n` that no other live grant of the key held when
    /// this one was made; always 0 for a plain mutex. A resource shared by
    /// `n` holders fences per (key, slot): it keeps the last token it
    /// accepted for each slot and refuses smaller ones.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The length of the current lease.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// When the request that started the current lease was sent.
    pub fn lease_start(&self) -> Instant {
        self.lease_start
    }

    /// When the lease runs out by the client's clock.
    pub fn expires_at(&self) -> Instant {
        self.lease_start + self.lease
    }

    /// Time left on the lease (zero once it has run out).
    pub fn time_left(&self) -> Duration {
        self.expires_at().saturating_duration_since(Instant::now())
    }

    /// True once the lease has run out by the client's clock: the server may
    /// have given the key to someone else.
    pub fn is_expired(&self) -> bool {
        Instant::now() >= self.expires_at()
    }
}

impl fmt::Debug for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grant")
            .field("key", &self.key)
            .field("token", &self.token)
            .field("slot", &self.slot)
            .field("lease", &self.lease)
            .field("time_left", &self.time_left())
            .finish()
    }
}

/// What a release found on the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The grant held the key and now does not: the key went to the next in
    /// line or is free. Also the outcome when an earlier attempt of the same
    /// release got through but its answer was lost.
    Released,
    /// The token did not hold the key (released already, or its lease ran
    /// out); nothing changed.
    NotHeld,
}

/// Who holds a key and how many wait for it (`Q`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyStatus {
    /// The holder's token; None when the key is free.
    pub token: Option<u64>,
    /// Time left on the holder's lease, by the server's clock.
    pub time_left: Duration,
    /// Requests waiting in line.
    pub waiting: u64,
}

impl KeyStatus {
    /// True when nobody holds the key.
    pub fn is_free(&self) -> bool {
        self.token.is_none()
    }
}

/// A server's answer to `I`: `name=value` pairs, at least `role`, `node`,
/// `active`, `token`, `held`, `waiting`, `conns`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    /// The `name=value` pairs, in the server's order.
    pub pairs: Vec<(String, String)>,
}

impl NodeInfo {
    /// The value of `name`, if the server sent it.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// `active` or `standby`.
    pub fn role(&self) -> Option<&str> {
        self.get("role")
    }
}

/// One connection of the client, as [`Client::connections`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionStatus {
    /// The server's address.
    pub server: String,
    /// True while connected.
    pub connected: bool,
    /// Why the last attempt failed or the last connection ended.
    pub last_error: Option<String>,
}

/// A grant that releases itself when dropped. Made by [`Client::lock`].
///
/// Dropping the guard releases the key, retrying for up to 5 seconds if the
/// connection is down (the drop blocks that long at worst; a guard made by
/// [`Client::lock_async`] releases from a background thread instead, so
/// that its drop never blocks); a failure is logged, and the lease is then
/// the safety net. Call [`LockGuard::release`] (or
/// [`LockGuard::release_async`]) to see the outcome instead.
///
/// ```no_run
/// use std::time::Duration;
/// # fn main() -> Result<(), baton::client::Error> {
/// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
/// {
///     let guard = client.lock("invoices", Duration::from_secs(30), None)?;
///     println!("working with token {}", guard.token());
/// } // released here
/// # Ok(())
/// # }
/// ```
pub struct LockGuard {
    client: Client,
    grant: Option<Grant>,
    /// Made by `lock_async`: the drop releases from a background thread.
    release_in_background: bool,
}

impl LockGuard {
    pub(crate) fn new(client: Client, grant: Grant) -> LockGuard {
        LockGuard {
            client,
            grant: Some(grant),
            release_in_background: false,
        }
    }

    pub(crate) fn new_async(client: Client, grant: Grant) -> LockGuard {
        LockGuard {
            client,
            grant: Some(grant),
            release_in_background: true,
        }
    }

    /// The grant this guard holds.
    pub fn grant(&self) -> &Grant {
        self.grant
            .as_ref()
            .expect("a guard holds its grant until it is consumed")
    }

    /// Extend the lease to now + `lease` (see [`Client::keep`]).
    pub fn keep(&mut self, lease: Duration) -> Result<(), Error> {
        let grant = self
            .grant
            .as_mut()
            .expect("a guard holds its grant until it is consumed");
        self.client.keep(grant, lease)
    }

    /// [`LockGuard::keep`] as a `Send` future.
    pub fn keep_async(
        &mut self,
        lease: Duration,
    ) -> impl Future<Output = Result<(), Error>> + Send + '_ {
        let grant = self
            .grant
            .as_mut()
            .expect("a guard holds its grant until it is consumed");
        self.client.keep_async(grant, lease)
    }

    /// [`LockGuard::release`] as a `Send` future.
    pub fn release_async(
        mut self,
    ) -> impl Future<Output = Result<ReleaseOutcome, Error>> + Send + 'static + use<> {
        let grant = self
            .grant
            .take()
            .expect("a guard holds its grant until it is consumed");
        self.client.release_async(&grant)
    }

    /// Release now and report the outcome.
    pub fn release(mut self) -> Result<ReleaseOutcome, Error> {
        let grant = self
            .grant
            .take()
            .expect("a guard holds its grant until it is consumed");
        self.client.release(&grant)
    }

    /// Stop guarding: the caller now releases the grant itself.
    pub fn into_grant(mut self) -> Grant {
        self.grant
            .take()
            .expect("a guard holds its grant until it is consumed")
    }
}

impl Deref for LockGuard {
    type Target = Grant;

    fn deref(&self) -> &Grant {
        self.grant()
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LockGuard").field(&self.grant).finish()
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(grant) = self.grant.take() else {
            return;
        };
        if !self.release_in_background {
            return release_logged(&self.client, &grant);
        }
        let client = self.client.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("baton-release {}", grant.key()))
            .spawn(move || release_logged(&client, &grant));
        if let Err(e) = spawned {
            log::warn!("cannot start a thread to release a key: {e}; its lease will run out");
        }
    }
}

fn release_logged(client: &Client, grant: &Grant) {
    if let Err(e) = client.release(grant) {
        log::warn!(
            "could not release {} (token {}): {e}; its lease will run out",
            grant.key(),
            grant.token()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_expires_a_lease_after_its_request_was_sent() {
        let key = Key::new(b"k").expect("valid key");
        let sent = Instant::now() - Duration::from_millis(400);
        let mut grant = Grant::new(key, 9, 0, 1000, sent);
        assert_eq!(grant.expires_at(), sent + Duration::from_millis(1000));
        assert!(grant.time_left() <= Duration::from_millis(600));
        assert!(!grant.is_expired());
        let old = Instant::now() - Duration::from_secs(2);
        grant.renew(1000, old);
        assert!(grant.is_expired());
        assert_eq!(grant.time_left(), Duration::ZERO);
        assert_eq!((grant.token(), grant.slot()), (9, 0));
    }

    #[test]
    fn node_info_reads_its_pairs() {
        let info = NodeInfo {
            pairs: vec![
                ("role".into(), "active".into()),
                ("held".into(), "3".into()),
            ],
        };
        assert_eq!(info.role(), Some("active"));
        assert_eq!(info.get("held"), Some("3"));
        assert_eq!(info.get("nope"), None);
    }
}
