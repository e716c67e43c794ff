//! The Rust client library of baton.
//!
//! Owns: the public API — [`Client`], [`ClientBuilder`], [`AcquireOptions`],
//! and what calls return ([`Grant`], [`LockGuard`], [`Held`], [`Watch`],
//! [`WatchState`], [`ReleaseOutcome`], [`KeyStatus`], [`NodeInfo`],
//! [`Error`]). Blocking calls run on the
//! caller's thread and block it until their deadline at most; connections
//! live on background threads.
//!
//! # Async
//!
//! [`Client::acquire_async`], [`Client::lock_async`],
//! [`Client::release_async`], [`Client::keep_async`],
//! [`Client::query_async`], [`Client::hold_async`] (and the `*_with_async`
//! forms, [`Client::campaign_async`], [`Client::leader_async`]) return `Send` futures
//! that work under any executor (tokio, async-std, smol, a hand-written
//! `block_on`): the library depends on no async runtime. They make the same
//! decisions as the blocking calls (failover, redirects, retries,
//! deadlines); only the waiting differs. An answer completes its future from
//! the connection's reader thread, through a one-shot cell that holds the
//! task's [`Waker`](std::task::Waker); a connection coming up wakes the
//! tasks waiting for one; deadlines and the short pauses between retries
//! are kept by one timer thread per client (`baton-timer`, started by the
//! first async call that needs it). Dropping a future cancels the call: a
//! grant that arrives for an acquire nobody awaits any more is released at
//! once by the reader thread.
//!
//! # Held locks
//!
//! [`Client::hold`] acquires a key and starts a watchdog thread that renews
//! its lease every third of it, and tells the owner at once when the key is
//! lost ([`Held::is_lost`], [`Held::wait_lost`], [`Held::lost`]); dropping
//! the [`Held`] releases the key from that thread, without blocking.
//!
//! # Closing
//!
//! [`Client::close`] ends the client and every clone of it: held keys are
//! released once, watches and calls under way end with [`Error::Closed`],
//! and every thread of the client has ended when it returns. Every later
//! call fails with [`Error::Closed`]; a call on a held key lost earlier
//! fails with [`Error::Lost`].
//!
//! # Semaphores, watches and elections
//!
//! [`Client::acquire_with`] (and `lock_with`, `hold_with`) takes
//! [`AcquireOptions`]: a limit makes the key a semaphore that up to that
//! many grants hold at once, each in its own [`Grant::slot`]; a value says
//! who holds it. [`Client::watch`] follows a key's holders: a [`Watch`] is
//! a blocking iterator and an async stream ([`Watch::next_async`],
//! [`Watch::poll_next`]) of [`WatchState`]s that watches again on the new
//! active node after a failover; it is fed by the connection's reader
//! thread through a mailbox that wakes a blocked thread or a task alike.
//! An election is a key of limit 1: [`Client::campaign`] holds it with the
//! candidate's value (a [`Held`] that says when leadership is lost),
//! [`Client::leader`] tells who leads now and [`Client::observe`] each
//! change of leader.
//!
//! Layout, one file per concern:
//! - `pending.rs`: matching answers to requests by (op, key), pure;
//! - `ctx.rs`: settings and phase-change signals shared by the
//!   connections and the callers;
//! - `oneshot.rs`: the one-shot completion an answer travels in;
//! - `timer.rs`: deadlines and pauses of async calls;
//! - `conn.rs`: one connection, its reader/manager and writer threads;
//! - `pool.rs`: the servers and connections, round-robin choice (a key's
//!   acquires kept on connections apart, since the server answers a later
//!   acquire of a key on a connection only after the earlier one), waiting
//!   for a connection to come up;
//! - `calls.rs`: attempts, redirects, release retries, deadlines, each
//!   call one body that the blocking and the async flavour both run;
//! - `block.rs`: the `block_on` that runs a call's body on the caller's
//!   thread for the blocking flavour;
//! - `grant.rs`: grants, the release-on-drop guard, plain results;
//! - `options.rs`: the limit and value of an acquire, checked;
//! - `hold.rs`: held locks and their watchdog;
//! - `feed.rs`: the mailbox a watched key's lines travel in;
//! - `watch.rs`: watches and their failover;
//! - `error.rs`: the error type;
//! - `tls.rs` (feature `tls`): TLS settings and the two halves of a TLS
//!   connection.
//!
//! Never does: speak the wire format itself (that is `protocol`), use an
//! async runtime, or block forever — except an acquire asked to wait
//! without limit, which waits as long as its connection lives.
//!
//! # Examples
//!
//! Each needs a `batond` listening on 127.0.0.1:7373 (`cargo run
//! --release --bin batond`); whole programs are in the crate's `examples/`
//! directory.
//!
//! A client, built once and shared (clones share its connections):
//!
//! ```no_run
//! use std::time::Duration;
//! use baton::client::Client;
//!
//! # fn main() -> Result<(), baton::client::Error> {
//! // Every node of the cluster, in any order: the client finds the active one.
//! let client = Client::builder(["10.0.0.1:7373", "10.0.0.2:7373"])
//!     .request_timeout(Duration::from_secs(3))
//!     .connect()?;
//! # Ok(())
//! # }
//! ```
//!
//! Acquire and release, handing the fencing token to the resource:
//!
//! ```no_run
//! use std::time::Duration;
//! use baton::client::Client;
//!
//! # fn main() -> Result<(), baton::client::Error> {
//! # let client = Client::connect(["127.0.0.1:7373"])?;
//! // Wait up to 10 s in line; the grant lasts 30 s unless released or kept.
//! let grant = client.acquire("nightly-report", Duration::from_secs(30), Some(Duration::from_secs(10)))?;
//! println!("got it, token {}", grant.token());
//! client.release(&grant)?;
//! # Ok(())
//! # }
//! ```
//!
//! A held lock, whose lease a background thread keeps alive until it is
//! dropped, and which says at once when it is lost:
//!
//! ```no_run
//! use std::time::Duration;
//! # fn main() -> Result<(), baton::client::Error> {
//! # let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
//! let held = client.hold("reindex", Duration::from_secs(10), None)?;
//! while !held.is_lost() {
//!     // ... one step of work, fenced with held.token() ...
//! #   break;
//! }
//! drop(held); // released in the background
//! # Ok(())
//! # }
//! ```
//!
//! A semaphore slot, and a watch of the key's holders:
//!
//! ```no_run
//! use std::time::Duration;
//! use baton::client::AcquireOptions;
//! # fn main() -> Result<(), baton::client::Error> {
//! # let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
//! let slot = client.hold_with("encoders", Duration::from_secs(10), None, &AcquireOptions::new().limit(4))?;
//! println!("encoder slot {}", slot.slot());
//! for state in client.watch("encoders")?.take(3) {
//!     println!("{} of 4 busy", state?.holders);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Who holds a key:
//!
//! ```no_run
//! # fn main() -> Result<(), baton::client::Error> {
//! # let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
//! let status = client.query("reindex")?;
//! println!("free: {}, {} waiting", status.is_free(), status.waiting);
//! # Ok(())
//! # }
//! ```
//!
//! The same under an async runtime (here tokio):
//!
//! ```no_run
//! use std::time::Duration;
//! use baton::client::Client;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), baton::client::Error> {
//! let client = Client::connect(["127.0.0.1:7373"])?;
//! let guard = client.lock_async("invoices", Duration::from_secs(30), None).await?;
//! println!("token {}", guard.token());
//! guard.release_async().await?;
//! # Ok(())
//! # }
//! ```
//!
//! A call that no server answers fails within its deadline, with an error
//! that says so ([`Error::is_unreachable`]: trying again later may
//! succeed). This one runs: nothing listens on the port it is given.
//!
//! ```
//! use baton::client::{Client, Error};
//!
//! # fn main() -> Result<(), Error> {
//! # let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port");
//! # let nobody = format!("127.0.0.1:{port}");
//! let client = Client::connect([nobody.as_str()])?; // connects in the background
//! match client.query("job") {
//!     Err(e) if e.is_unreachable() => eprintln!("no server answered: {e}"),
//!     other => panic!("nothing listens there: {other:?}"),
//! }
//! # Ok(())
//! # }
//! ```

mod block;
mod calls;
mod conn;
mod ctx;
mod error;
mod feed;
mod grant;
mod hold;
mod limits;
mod oneshot;
mod options;
mod pending;
mod pool;
mod timer;
#[cfg(feature = "tls")]
mod tls;
mod watch;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crossbeam_channel::Sender;
use parking_lot::Mutex;

pub use calls::{RELEASE_RETRY_INTERVAL, RELEASE_RETRY_WINDOW};
pub use conn::RECONNECT_INTERVAL;
pub use error::{AuthRefused, Error};
pub use grant::{ConnectionStatus, Grant, KeyStatus, LockGuard, NodeInfo, ReleaseOutcome};
pub use hold::{Held, KEEP_RETRY, Lost};
pub use options::AcquireOptions;
pub use watch::{MAX_PAUSE, Watch};

pub use crate::protocol::{Value, WatchState};
#[cfg(feature = "tls")]
pub use tls::TlsConfig;

use crate::protocol::{Key, MAX_SECRET, MIN_SECRET, Secret, is_valid_secret};
use pool::Pool;

/// Default time to establish a TCP connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default time a server has to answer a request that does not wait in line.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The port used when a server address has none.
pub const DEFAULT_PORT: u16 = 7373;

/// A connection to a baton service: one or more servers, each reached
/// through persistent connections kept up in the background.
///
/// Cheap to clone (clones share the connections) and safe to share between
/// threads: requests from many threads are pipelined on the same
/// connections. The connections close when the last clone is dropped.
///
/// Every call has a deadline: an acquire waits at most its `wait` plus the
/// request timeout (or without limit when `wait` is None); other calls wait
/// at most the request timeout, a release up to 5 s more while it retries.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    /// Dropped with the client, or taken by [`Client::close`]: wakes the
    /// connection threads to stop.
    stop: Mutex<Option<Sender<()>>>,
    /// Set by [`Client::close`]: every call fails with [`Error::Closed`].
    closed: AtomicBool,
    /// The held keys' watchdogs, stopped by [`Client::close`].
    holds: hold::Holds,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.pool.close();
    }
}

/// Settings for a [`Client`] beyond its servers.
///
/// ```no_run
/// use std::time::Duration;
/// # fn main() -> Result<(), baton::client::Error> {
/// let client = baton::client::Client::builder(["10.0.0.1:7373"])
///     .connect_timeout(Duration::from_secs(1))
///     .request_timeout(Duration::from_secs(3))
///     .connect()?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct ClientBuilder {
    servers: Vec<String>,
    connect_timeout: Duration,
    request_timeout: Duration,
    /// Never shown by Debug (see `Secret`).
    auth: Option<Secret>,
    #[cfg(feature = "tls")]
    tls: Option<TlsConfig>,
}

impl ClientBuilder {
    /// How long one TCP connection attempt may take (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.connect_timeout = timeout;
        self
    }

    /// How long a server has to answer a request that does not wait in line
    /// (default 5 s). A connection that leaves a request unanswered that
    /// long is closed and reconnected.
    pub fn request_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.request_timeout = timeout;
        self
    }

    /// Authenticate with this secret (the servers' `--auth-file`): every
    /// connection, and every reconnection, sends `U <secret>` first and
    /// carries requests only once the server has answered `U ok` (within
    /// the connect timeout). A server that refuses the secret makes calls
    /// fail with [`Error::Auth`]; the connection is tried again at the
    /// usual reconnect interval. A server without `--auth-file` answers
    /// `auth-disabled`, and the connection is used all the same. The secret
    /// must be 16 to 128 bytes of printable ASCII without spaces
    /// ([`ClientBuilder::connect`] refuses anything else); it never shows
    /// in `Debug` output or errors.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // The first line of the file the servers' --auth-file lists.
    /// let secret = std::fs::read_to_string("/etc/baton/client.secret")?;
    /// let client = baton::client::Client::builder(["127.0.0.1:7373"])
    ///     .auth(secret.trim())
    ///     .connect()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn auth(mut self, secret: impl AsRef<[u8]>) -> ClientBuilder {
        self.auth = Some(Secret::new(secret.as_ref()));
        self
    }

    /// Speak TLS to every server (feature `tls`): each connection, and each
    /// reconnection, does a full handshake within the connect timeout and
    /// checks the server's certificate (see [`TlsConfig`]). A failed
    /// handshake counts as a failed connection attempt; its reason (an
    /// unknown issuer, a name mismatch) is in the call's error.
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: TlsConfig) -> ClientBuilder {
        self.tls = Some(tls);
        self
    }

    /// Start the client. This does not wait for the connections: they are
    /// made in the background, and the first call waits for them (bounded
    /// by its deadline). Fails only on a malformed address list, a zero
    /// timeout, a malformed secret, or TLS files that cannot be read.
    pub fn connect(self) -> Result<Client, Error> {
        let servers = parse_servers(&self.servers)?;
        if let Some(secret) = &self.auth
            && !is_valid_secret(secret.as_bytes())
        {
            return Err(Error::InvalidArgument(format!(
                "the secret must be {MIN_SECRET} to {MAX_SECRET} bytes of printable \
                 ASCII without spaces"
            )));
        }
        for (name, value) in [
            ("connect timeout", self.connect_timeout),
            ("request timeout", self.request_timeout),
        ] {
            if value.is_zero() {
                return Err(Error::InvalidArgument(format!(
                    "the {name} must be above 0"
                )));
            }
        }
        #[cfg(feature = "tls")]
        let tls = match &self.tls {
            Some(tls) => Some(Arc::new(tls.build()?)),
            None => None,
        };
        #[cfg(not(feature = "tls"))]
        let tls = ();
        let (stop, stopped) = crossbeam_channel::bounded(0);
        let pool = Pool::start(
            &servers,
            self.connect_timeout,
            self.request_timeout,
            self.auth,
            tls,
            stopped,
        )?;
        Ok(Client {
            inner: Arc::new(Inner {
                pool,
                stop: Mutex::new(Some(stop)),
                closed: AtomicBool::new(false),
                holds: hold::Holds::default(),
            }),
        })
    }
}

/// Check and normalise server addresses: `host:port` (`host` alone gets
/// port 7373), trimmed, duplicates dropped, at least one. [`Client::connect`]
/// does this; it is public for tools that take an address list from a user
/// and want to check it early.
///
/// ```
/// use baton::client::parse_servers;
///
/// assert_eq!(
///     parse_servers(&["lock-1", " lock-2:7000", "lock-1:7373", "[::1]"]),
///     Ok(vec!["lock-1:7373".to_string(), "lock-2:7000".to_string(), "[::1]:7373".to_string()])
/// );
/// assert!(parse_servers(&["lock-1:http"]).is_err());
/// ```
pub fn parse_servers<S: AsRef<str>>(servers: &[S]) -> Result<Vec<String>, Error> {
    if servers.len() > pool::MAX_SERVERS {
        return Err(Error::InvalidArgument(format!(
            "{} servers given; at most {} are supported",
            servers.len(),
            pool::MAX_SERVERS
        )));
    }
    let mut out: Vec<String> = Vec::new();
    for server in servers {
        let server = server.as_ref().trim();
        let addr = normalise_server(server)?;
        if !out.contains(&addr) {
            out.push(addr);
        }
    }
    if out.is_empty() {
        return Err(Error::InvalidArgument("no server address given".into()));
    }
    Ok(out)
}

fn normalise_server(server: &str) -> Result<String, Error> {
    let bad = || Error::InvalidArgument(format!("'{server}' is not host:port"));
    if server.is_empty() || server.contains(char::is_whitespace) {
        return Err(bad());
    }
    let (host, port) = match server.strip_prefix('[') {
        Some(bracketed) => {
            let (host, after) = bracketed.split_once(']').ok_or_else(bad)?;
            let port = match after {
                "" => None,
                after => Some(after.strip_prefix(':').ok_or_else(bad)?),
            };
            (host, port)
        }
        None => match server.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (server, None),
        },
    };
    if host.is_empty() {
        return Err(bad());
    }
    match port {
        None => Ok(format!("{server}:{DEFAULT_PORT}")),
        Some(port) => {
            port.parse::<u16>().map_err(|_| bad())?;
            Ok(server.to_string())
        }
    }
}

fn check_key(key: &[u8]) -> Result<Key, Error> {
    Key::new(key).map_err(|_| {
        Error::InvalidArgument(format!(
            "bad key {:?}: 1 to 250 bytes, no spaces or control characters",
            String::from_utf8_lossy(key)
        ))
    })
}

fn check_lease(lease: Duration) -> Result<u64, Error> {
    match calls::millis_ceil(lease) {
        0 => Err(Error::InvalidArgument("the lease must be above 0".into())),
        ms => Ok(ms),
    }
}

impl Client {
    /// A client for these servers (`host:port` each; the port defaults to
    /// 7373), with the default timeouts. One connection per server; two
    /// when only one server is given.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), baton::client::Error> {
    /// let one = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// let cluster = baton::client::Client::connect("a:7373,b:7373".split(','))?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn connect<I, S>(servers: I) -> Result<Client, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Client::builder(servers).connect()
    }

    /// A builder, to set timeouts before connecting.
    pub fn builder<I, S>(servers: I) -> ClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        ClientBuilder {
            servers: servers
                .into_iter()
                .map(|s| s.as_ref().to_string())
                .collect(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            auth: None,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }

    fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// [`Error::Closed`] once [`Client::close`] was called.
    fn check_open(&self) -> Result<(), Error> {
        match self.is_closed() {
            true => Err(Error::Closed),
            false => Ok(()),
        }
    }

    /// True once [`Client::close`] was called (on this client or a clone).
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    /// Close the client, and every clone of it, for good: held keys
    /// ([`Client::hold`], [`Client::campaign`]) stop being kept and are
    /// released (one attempt each, best effort, bounded by the request
    /// timeout; they are not reported lost), a grant that comes to a call
    /// it ends (the key a held key's release hands to this client's own
    /// waiter, say) is taken in and released before the connections close
    /// (two `I` round trips on each connection with an acquire
    /// outstanding), an acquire whose grant came but is still being
    /// confirmed with `K` (see [`Client::acquire`]) releases it and fails
    /// with [`Error::Closed`] (close waits for it, up to the request
    /// timeout), watches end with
    /// [`Error::Closed`], the connections close, and calls under way fail
    /// with [`Error::Closed`]. Every thread of the client has ended when
    /// this returns (a connection attempt under way may hold it up to the
    /// connect timeout); every later call on the client, its grants, held
    /// keys and watches fails with [`Error::Closed`]. Dropping the last
    /// clone also closes the connections, without waiting for the threads
    /// and without releasing anything.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use baton::client::{Client, Error};
    /// # fn main() -> Result<(), Error> {
    /// let client = Client::connect(["127.0.0.1:7373"])?;
    /// let held = client.hold("reindex", Duration::from_secs(10), None)?;
    /// client.close(); // releases "reindex"
    /// assert_eq!(held.release(), Err(Error::Closed));
    /// assert_eq!(client.query("reindex").err(), Some(Error::Closed));
    /// # Ok(())
    /// # }
    /// ```
    pub fn close(&self) {
        // No acquire goes out from here on, and a grant that still comes
        // (say the key a held key's release hands to a waiter of this
        // client) is released, not handed over. (Before `closed`: once
        // `is_closed` says so, every call sees the client closing.)
        self.pool().begin_close();
        self.inner.closed.store(true, Ordering::Release);
        // Held keys first, while the connections can still carry their
        // releases; then the grants those releases (or anything else) made
        // to this client's own waiters are taken in and released; then the
        // connections and the timer.
        let letting_go = self.inner.holds.close(self);
        // An acquire confirming its grant with `K` releases it itself and
        // fails `Closed`: its `K` and `R` need the connections still open.
        self.pool().wait_grants_in_hand();
        self.pool().settle();
        drop(self.inner.stop.lock().take());
        self.pool().close();
        for watchdog in letting_go {
            watchdog.join();
        }
        self.pool().join();
    }

    /// Acquire `key` for `lease`, waiting in line up to `wait` (None: without
    /// limit; `Some(Duration::ZERO)`: only if it is free right now).
    ///
    /// The grant's lease is counted by the client's clock from when the
    /// request that started it was sent. A grant that waited in line for more
    /// than a third of its lease is confirmed with a keep (`K`) before it is
    /// returned, and its lease counted from that keep.
    ///
    /// Errors: [`Error::Timeout`] when the wait runs out (nothing is held),
    /// [`Error::Refused`] with the server's reason, [`Error::NoConnection`]
    /// when no connection could carry the request.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use baton::client::{Client, Error};
    /// # fn main() -> Result<(), Error> {
    /// let client = Client::connect(["127.0.0.1:7373"])?;
    /// match client.acquire("backup", Duration::from_secs(60), Some(Duration::ZERO)) {
    ///     Ok(grant) => {
    ///         // ... work, passing grant.token() to whatever is protected ...
    ///         client.release(&grant)?;
    ///     }
    ///     Err(Error::Timeout) => println!("someone else is running the backup"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
        wait: Option<Duration>,
    ) -> Result<Grant, Error> {
        self.acquire_with(key, lease, wait, &AcquireOptions::new())
    }

    /// Acquire like [`Client::acquire`], with a limit (the key is a
    /// semaphore: up to that many grants hold it at once) and a value (who
    /// holds it: watchers see it); see [`AcquireOptions`]. The grant's
    /// [`Grant::slot`] says which of the limit's slots it took.
    ///
    /// Errors as [`Client::acquire`], and [`Error::InvalidArgument`] for a
    /// limit or value out of range (before anything is sent);
    /// [`Error::Refused`] with
    /// [`Reason::LimitMismatch`](crate::protocol::Reason::LimitMismatch)
    /// when the key is held or awaited with another limit.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use baton::client::{AcquireOptions, Client};
    /// # fn main() -> Result<(), baton::client::Error> {
    /// let client = Client::connect(["127.0.0.1:7373"])?;
    /// // At most 4 encoders at once; this one says who it is.
    /// let options = AcquireOptions::new().limit(4).value("encoder-7");
    /// let grant = client.acquire_with("encoders", Duration::from_secs(30), None, &options)?;
    /// // Fence per (key, slot): the resource keeps the last token per slot.
    /// println!("slot {} token {}", grant.slot(), grant.token());
    /// client.release(&grant)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire_with(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
        wait: Option<Duration>,
        options: &AcquireOptions,
    ) -> Result<Grant, Error> {
        self.check_open()?;
        let key = check_key(key.as_ref())?;
        let lease_ms = check_lease(lease)?;
        let ask = options.check()?;
        let wait_ms = wait.map(|w| calls::millis_ceil(w).max(1));
        calls::acquire(self.pool(), key, lease_ms, wait_ms, &ask)
    }

    /// Acquire like [`Client::acquire`], as a guard that releases the key
    /// when dropped.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// let mut guard = client.lock("ledger", Duration::from_secs(10), Some(Duration::from_secs(5)))?;
    /// for batch in 0..100 {
    ///     // ... long work ...
    ///     if batch % 10 == 0 {
    ///         guard.keep(Duration::from_secs(10))?; // still ours, lease renewed
    ///     }
    /// }
    /// drop(guard); // released
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
        wait: Option<Duration>,
    ) -> Result<LockGuard, Error> {
        self.lock_with(key, lease, wait, &AcquireOptions::new())
    }

    /// [`Client::lock`] with a limit and a value (see
    /// [`Client::acquire_with`]).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use baton::client::AcquireOptions;
    /// # fn main() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// let guard = client.lock_with("pool", Duration::from_secs(10), None, &AcquireOptions::new().limit(2))?;
    /// println!("slot {}", guard.slot());
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock_with(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
        wait: Option<Duration>,
        options: &AcquireOptions,
    ) -> Result<LockGuard, Error> {
        let grant = self.acquire_with(key, lease, wait, options)?;
        Ok(LockGuard::new(self.clone(), grant))
    }

    /// Release a grant. Retried for 5 s at 200 ms intervals while no
    /// connection can carry it. [`ReleaseOutcome::NotHeld`] when the grant
    /// no longer held the key (its lease ran out, or it was released).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use baton::client::{Client, ReleaseOutcome};
    /// # fn main() -> Result<(), baton::client::Error> {
    /// let client = Client::connect(["127.0.0.1:7373"])?;
    /// let grant = client.acquire("job", Duration::from_secs(30), None)?;
    /// if client.release(&grant)? == ReleaseOutcome::NotHeld {
    ///     eprintln!("the lease ran out before the work was done");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn release(&self, grant: &Grant) -> Result<ReleaseOutcome, Error> {
        self.check_open()?;
        calls::release(self.pool(), grant.key().clone(), grant.token())
    }

    /// Release the grant that `token` names, as [`Client::release`] does
    /// (for a token that came from elsewhere, say another process).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// client.release_token("job", 1_745_000_000_000_000_001)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn release_token(
        &self,
        key: impl AsRef<[u8]>,
        token: u64,
    ) -> Result<ReleaseOutcome, Error> {
        self.check_open()?;
        let key = check_key(key.as_ref())?;
        if token == 0 {
            return Err(Error::InvalidArgument("a token is never 0".into()));
        }
        calls::release(self.pool(), key, token)
    }

    /// Extend `grant`'s lease to now + `lease`; the token stays the same.
    /// [`Error::NotHeld`] when the key was lost, [`Error::Expired`] when the
    /// lease ran out (by the client's clock) before a server answered.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// let mut grant = client.acquire("job", Duration::from_secs(30), None)?;
    /// client.keep(&mut grant, Duration::from_secs(30))?;
    /// assert!(grant.time_left() > Duration::from_secs(29));
    /// # Ok(())
    /// # }
    /// ```
    pub fn keep(&self, grant: &mut Grant, lease: Duration) -> Result<(), Error> {
        self.check_open()?;
        let lease_ms = check_lease(lease)?;
        calls::keep(self.pool(), grant, lease_ms)
    }

    /// Extend the lease of the grant that `token` names to now + `lease`,
    /// as [`Client::keep`] does, for a token that came from elsewhere (say
    /// the process that acquired it). Waits at most the request timeout.
    /// [`Error::NotHeld`] when the token no longer holds the key.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// client.keep_token("job", 1_745_000_000_000_000_001, Duration::from_secs(60))?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn keep_token(
        &self,
        key: impl AsRef<[u8]>,
        token: u64,
        lease: Duration,
    ) -> Result<(), Error> {
        self.check_open()?;
        let key = check_key(key.as_ref())?;
        if token == 0 {
            return Err(Error::InvalidArgument("a token is never 0".into()));
        }
        let lease_ms = check_lease(lease)?;
        let due = std::time::Instant::now() + self.pool().request_timeout();
        calls::keep_token(self.pool(), key, token, lease_ms, due).map(drop)
    }

    /// Who holds `key`, for how long, and how many wait for it.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// let status = client.query("job")?;
    /// match status.token {
    ///     Some(token) => println!("held by token {token}, {} waiting", status.waiting),
    ///     None => println!("free"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn query(&self, key: impl AsRef<[u8]>) -> Result<crate::client::KeyStatus, Error> {
        self.check_open()?;
        let key = check_key(key.as_ref())?;
        calls::query(self.pool(), key)
    }

    /// [`Client::acquire`] as a `Send` future, for async code under any
    /// executor. The future owns what it needs (it can be spawned); dropping
    /// it gives up the request, and a grant that still arrives is released.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use baton::client::{Client, Error};
    /// # async fn example() -> Result<(), Error> {
    /// let client = Client::connect(["127.0.0.1:7373"])?;
    /// let grant = client
    ///     .acquire_async("invoices", Duration::from_secs(30), Some(Duration::from_secs(10)))
    ///     .await?;
    /// println!("token {}", grant.token());
    /// client.release_async(&grant).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire_async<K: AsRef<[u8]>>(
        &self,
        key: K,
        lease: Duration,
        wait: Option<Duration>,
    ) -> impl Future<Output = Result<Grant, Error>> + Send + 'static + use<K> {
        self.acquire_with_async(key, lease, wait, &AcquireOptions::new())
    }

    /// [`Client::acquire_with`] as a `Send` future (the options are
    /// checked and copied when it is made).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use baton::client::AcquireOptions;
    /// # async fn example() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// let options = AcquireOptions::new().limit(8);
    /// let grant = client.acquire_with_async("uploads", Duration::from_secs(30), None, &options).await?;
    /// println!("slot {}", grant.slot());
    /// client.release_async(&grant).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire_with_async<K: AsRef<[u8]>>(
        &self,
        key: K,
        lease: Duration,
        wait: Option<Duration>,
        options: &AcquireOptions,
    ) -> impl Future<Output = Result<Grant, Error>> + Send + 'static + use<K> {
        let checked = self
            .check_open()
            .and_then(|()| check_key(key.as_ref()))
            .and_then(|key| Ok((key, check_lease(lease)?, options.check()?)));
        let wait_ms = wait.map(|w| calls::millis_ceil(w).max(1));
        let client = self.clone();
        async move {
            let (key, lease_ms, ask) = checked?;
            calls::acquire_async(client.pool(), key, lease_ms, wait_ms, &ask).await
        }
    }

    /// [`Client::lock`] as a `Send` future. The guard releases the key when
    /// dropped, from a short-lived background thread so that the drop never
    /// blocks the task; [`LockGuard::release_async`] awaits the outcome.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn example() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// let mut guard = client.lock_async("ledger", Duration::from_secs(10), None).await?;
    /// // ... work, passing guard.token() to the ledger ...
    /// guard.keep_async(Duration::from_secs(10)).await?;
    /// guard.release_async().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock_async<K: AsRef<[u8]>>(
        &self,
        key: K,
        lease: Duration,
        wait: Option<Duration>,
    ) -> impl Future<Output = Result<LockGuard, Error>> + Send + 'static + use<K> {
        self.lock_with_async(key, lease, wait, &AcquireOptions::new())
    }

    /// [`Client::lock_with`] as a `Send` future.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use baton::client::AcquireOptions;
    /// # async fn example() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// let options = AcquireOptions::new().limit(2).value("worker-1");
    /// let guard = client.lock_with_async("pool", Duration::from_secs(10), None, &options).await?;
    /// guard.release_async().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock_with_async<K: AsRef<[u8]>>(
        &self,
        key: K,
        lease: Duration,
        wait: Option<Duration>,
        options: &AcquireOptions,
    ) -> impl Future<Output = Result<LockGuard, Error>> + Send + 'static + use<K> {
        let acquire = self.acquire_with_async(key, lease, wait, options);
        let client = self.clone();
        async move { Ok(LockGuard::new_async(client, acquire.await?)) }
    }

    /// [`Client::release`] as a `Send` future (it owns a copy of the key and
    /// token, not a borrow of the grant).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use baton::client::ReleaseOutcome;
    /// # async fn example() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// let grant = client.acquire_async("job", Duration::from_secs(30), None).await?;
    /// if client.release_async(&grant).await? == ReleaseOutcome::NotHeld {
    ///     eprintln!("the lease ran out before the work was done");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn release_async(
        &self,
        grant: &Grant,
    ) -> impl Future<Output = Result<ReleaseOutcome, Error>> + Send + 'static + use<> {
        let (key, token) = (grant.key().clone(), grant.token());
        let client = self.clone();
        async move {
            client.check_open()?;
            calls::release_async(client.pool(), key, token).await
        }
    }

    /// [`Client::keep`] as a `Send` future; it borrows the grant it extends.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn example() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// let mut grant = client.acquire_async("job", Duration::from_secs(30), None).await?;
    /// client.keep_async(&mut grant, Duration::from_secs(30)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn keep_async<'a>(
        &'a self,
        grant: &'a mut Grant,
        lease: Duration,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a {
        let lease_ms = self.check_open().and_then(|()| check_lease(lease));
        async move { calls::keep_async(self.pool(), grant, lease_ms?).await }
    }

    /// [`Client::query`] as a `Send` future.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// let status = client.query_async("job").await?;
    /// println!("free: {}, waiting: {}", status.is_free(), status.waiting);
    /// # Ok(())
    /// # }
    /// ```
    pub fn query_async<K: AsRef<[u8]>>(
        &self,
        key: K,
    ) -> impl Future<Output = Result<KeyStatus, Error>> + Send + 'static + use<K> {
        let key = self.check_open().and_then(|()| check_key(key.as_ref()));
        let client = self.clone();
        async move { calls::query_async(client.pool(), key?).await }
    }

    /// Acquire `key` like [`Client::acquire`] and keep it: a watchdog
    /// thread renews the lease (`K` every third of `lease`, retried every
    /// 200 ms while no server answers) until the [`Held`] is dropped, which
    /// releases the key without blocking. If the key is lost anyway — a
    /// server says the token no longer holds it, or no server answers
    /// before the lease runs out — the watchdog stops and says so at once:
    /// [`Held::is_lost`], [`Held::wait_lost`] (blocking), [`Held::lost`]
    /// (a future).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn main() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// let held = client.hold("reindex", Duration::from_secs(10), None)?;
    /// for chunk in 0..1000 {
    ///     if held.is_lost() {
    ///         eprintln!("lost the key, stopping at chunk {chunk}");
    ///         break;
    ///     }
    ///     // ... work on the chunk, fenced with held.token() ...
    /// }
    /// drop(held); // released in the background
    /// # Ok(())
    /// # }
    /// ```
    pub fn hold(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
        wait: Option<Duration>,
    ) -> Result<Held, Error> {
        self.hold_with(key, lease, wait, &AcquireOptions::new())
    }

    /// [`Client::hold`] with a limit and a value (see
    /// [`Client::acquire_with`]): a held slot of a semaphore.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use baton::client::AcquireOptions;
    /// # fn main() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// let held = client.hold_with("crawlers", Duration::from_secs(10), None, &AcquireOptions::new().limit(3))?;
    /// println!("crawler slot {} (token {})", held.slot(), held.token());
    /// # Ok(())
    /// # }
    /// ```
    pub fn hold_with(
        &self,
        key: impl AsRef<[u8]>,
        lease: Duration,
        wait: Option<Duration>,
        options: &AcquireOptions,
    ) -> Result<Held, Error> {
        let grant = self.acquire_with(key, lease, wait, options)?;
        Held::start(self.clone(), grant)
    }

    /// [`Client::hold`] as a `Send` future. With [`Held::lost`], work can be
    /// raced against the loss of its key:
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn reindex() {}
    /// # async fn example() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// let held = client.hold_async("reindex", Duration::from_secs(10), None).await?;
    /// tokio::select! {
    ///     () = reindex() => {}
    ///     why = held.lost() => eprintln!("stopped: {why}"),
    /// }
    /// held.release_async().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn hold_async<K: AsRef<[u8]>>(
        &self,
        key: K,
        lease: Duration,
        wait: Option<Duration>,
    ) -> impl Future<Output = Result<Held, Error>> + Send + 'static + use<K> {
        self.hold_with_async(key, lease, wait, &AcquireOptions::new())
    }

    /// [`Client::hold_with`] as a `Send` future.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use baton::client::AcquireOptions;
    /// # async fn example() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// let options = AcquireOptions::new().limit(3);
    /// let held = client.hold_with_async("crawlers", Duration::from_secs(10), None, &options).await?;
    /// held.release_async().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn hold_with_async<K: AsRef<[u8]>>(
        &self,
        key: K,
        lease: Duration,
        wait: Option<Duration>,
        options: &AcquireOptions,
    ) -> impl Future<Output = Result<Held, Error>> + Send + 'static + use<K> {
        let acquire = self.acquire_with_async(key, lease, wait, options);
        let client = self.clone();
        async move { Held::start(client, acquire.await?) }
    }

    /// Watch `key`'s holders: a [`Watch`] whose first state is the key's
    /// state now, then one after every change of its holders (a grant, a
    /// release, an expiry): the largest token holding it (0 when none),
    /// the live grants, the requests in line, and the newest grant's value.
    /// A key need not be held to be watched.
    ///
    /// The watch survives failover: when its connection ends, or the node
    /// says it is not (or no longer) the active one, it watches again on
    /// the active node and yields that node's first state. It never gives
    /// up because no server answers; it ends only with a refusal
    /// ([`Reason::TooManyWatches`](crate::protocol::Reason::TooManyWatches))
    /// or a refused secret. A watch read slowly skips states, never the
    /// latest. Dropping it (or [`Watch::close`]) sends `X <key>`.
    ///
    /// `W <key>` is sent at once if a connection is up; this call never
    /// blocks, and fails only on a bad key.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["10.0.0.1:7373", "10.0.0.2:7373"])?;
    /// for state in client.watch("nightly-report")? {
    ///     let state = state?;
    ///     match state.token {
    ///         0 => println!("free, {} waiting", state.waiting),
    ///         token => println!("held by token {token} ({} holders)", state.holders),
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn watch(&self, key: impl AsRef<[u8]>) -> Result<Watch, Error> {
        self.check_open()?;
        let key = check_key(key.as_ref())?;
        Ok(Watch::new(self.clone(), key, false))
    }

    /// Stand for election on `key`: acquire it as a mutex with `value`
    /// (who this candidate is: an address, a host name) as its holder's
    /// value, waiting in line up to `wait` (None: until elected), and keep
    /// it (see [`Client::hold`]): the [`Held`] is the leadership. Its
    /// token is greater than every earlier leader's, so it fences what
    /// the leader does. [`Held::lost`] and [`Held::wait_lost`] tell when
    /// leadership is lost (its lease ran out, or a server says the token
    /// no longer holds the key); dropping the `Held`, or
    /// [`Held::release`], resigns, and the next candidate in line leads.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn serve_as_leader(_token: u64) {}
    /// # fn main() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["10.0.0.1:7373", "10.0.0.2:7373"])?;
    /// let leadership = client.campaign("scheduler", "10.0.0.7:8080", Duration::from_secs(10), None)?;
    /// println!("leading with token {}", leadership.token());
    /// serve_as_leader(leadership.token());
    /// leadership.release()?; // resign
    /// # Ok(())
    /// # }
    /// ```
    pub fn campaign(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        lease: Duration,
        wait: Option<Duration>,
    ) -> Result<Held, Error> {
        let options = AcquireOptions::new().limit(1).value(value);
        self.hold_with(key, lease, wait, &options)
    }

    /// [`Client::campaign`] as a `Send` future.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn lead() {}
    /// # async fn example() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// let leadership = client
    ///     .campaign_async("scheduler", "10.0.0.7:8080", Duration::from_secs(10), None)
    ///     .await?;
    /// tokio::select! {
    ///     () = lead() => {}
    ///     why = leadership.lost() => eprintln!("no longer the leader: {why}"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn campaign_async<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        key: K,
        value: V,
        lease: Duration,
        wait: Option<Duration>,
    ) -> impl Future<Output = Result<Held, Error>> + Send + 'static + use<K, V> {
        let options = AcquireOptions::new().limit(1).value(value);
        self.hold_with_async(key, lease, wait, &options)
    }

    /// Who leads the election on `key` now: its state, whose `token` is the
    /// leader's (0 when nobody leads) and whose `value` is the leader's
    /// value (see [`Client::campaign`]). Asks the active node (`W`, then
    /// `X`), following redirects; waits at most the connect timeout plus
    /// the request timeout.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// let now = client.leader("scheduler")?;
    /// match &now.value {
    ///     Some(who) if now.token != 0 => println!("{who:?} leads (token {})", now.token),
    ///     _ => println!("nobody leads"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn leader(&self, key: impl AsRef<[u8]>) -> Result<WatchState, Error> {
        let watch = self.watch(key)?;
        watch::first_state(watch, self.leader_budget())
    }

    /// [`Client::leader`] as a `Send` future.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// let now = client.leader_async("scheduler").await?;
    /// println!("leader token {}", now.token);
    /// # Ok(())
    /// # }
    /// ```
    pub fn leader_async<K: AsRef<[u8]>>(
        &self,
        key: K,
    ) -> impl Future<Output = Result<WatchState, Error>> + Send + 'static + use<K> {
        let watch = self.watch(key);
        let budget = self.leader_budget();
        async move { watch::first_state_async(watch?, budget).await }
    }

    /// The leaders of the election on `key` as they change: a [`Watch`]
    /// that yields the state now, then a state only when the leader
    /// changes (a new token, or 0 when nobody leads), not when only the
    /// line of candidates does. Like every watch it survives failover.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// for leader in client.observe("scheduler")? {
    ///     let leader = leader?;
    ///     let who = leader.value.as_ref().map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    ///     println!("leader now: token {} {who:?}", leader.token);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn observe(&self, key: impl AsRef<[u8]>) -> Result<Watch, Error> {
        self.check_open()?;
        let key = check_key(key.as_ref())?;
        Ok(Watch::new(self.clone(), key, true))
    }

    fn leader_budget(&self) -> Duration {
        self.pool().connect_timeout() + self.pool().request_timeout()
    }

    /// Ask one server about itself (`I`): role, active node, counts. The
    /// server is added to the client's list if it was not in it.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), baton::client::Error> {
    /// let client = baton::client::Client::connect(["127.0.0.1:7373"])?;
    /// let info = client.info("127.0.0.1:7373")?;
    /// println!("role {:?}, {:?} keys held", info.role(), info.get("held"));
    /// # Ok(())
    /// # }
    /// ```
    pub fn info(&self, server: &str) -> Result<NodeInfo, Error> {
        self.check_open()?;
        let addr = normalise_server(server.trim())?;
        let node = match self.pool().find(&addr) {
            Some(node) => node,
            None => self.pool().node_for(&addr)?,
        };
        calls::info(self.pool(), node)
    }

    /// The servers this client knows (those given, then those learned from
    /// redirects).
    pub fn servers(&self) -> Vec<String> {
        self.pool().servers()
    }

    /// Every connection and whether it is up.
    pub fn connections(&self) -> Vec<ConnectionStatus> {
        self.pool().statuses()
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("servers", &self.servers())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_addresses_are_checked_and_normalised() {
        assert_eq!(
            parse_servers(&[" a:1", "b", "a:1", "[::1]:9", "[::1]"]),
            Ok(vec![
                "a:1".to_string(),
                "b:7373".to_string(),
                "[::1]:9".to_string(),
                "[::1]:7373".to_string()
            ])
        );
        for bad in ["", "a:x", ":1", "a:70000", "a b:1", "::1"] {
            assert!(parse_servers(&[bad]).is_err(), "{bad:?}");
        }
        assert!(parse_servers::<&str>(&[]).is_err());
    }

    #[test]
    fn a_secret_is_checked_and_never_shown_by_the_builder() {
        let builder = Client::builder(["127.0.0.1:1"]).auth("hunter2-hunter2-hunter2");
        let shown = format!("{builder:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        let Err(Error::InvalidArgument(why)) =
            Client::builder(["127.0.0.1:1"]).auth("too short").connect()
        else {
            panic!("a short secret is refused");
        };
        assert!(
            why.contains("16 to 128") && !why.contains("too short"),
            "{why}"
        );
    }

    #[test]
    fn arguments_are_checked_before_anything_is_sent() {
        assert!(check_key(b"").is_err());
        assert!(check_key(b"a b").is_err());
        assert!(check_key(&[b'x'; 251]).is_err());
        assert!(check_key("日本".as_bytes()).is_ok());
        assert!(check_lease(Duration::ZERO).is_err());
        assert_eq!(check_lease(Duration::from_micros(1)), Ok(1));
    }
}
