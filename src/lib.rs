//! baton: a lock server with strict FIFO queues and fencing tokens.
//!
//! Layout:
//! - [`protocol`]: the wire format, pure parsing and formatting;
//! - `server`: the node — I/O loops, the lock owner and its lock table and
//!   timing wheel, configuration;
//! - `client`: the Rust client library — persistent connections,
//!   pipelining, failover, redirects, grants and release-on-drop guards;
//! - `src/bin/batond.rs`: the server binary; `src/bin/baton.rs`: the CLI.
//!
//! Cargo features: `client` (the library alone), `server` (the node and
//! `batond`), `cli` (`baton`), `tls` (TLS in the client library; `server`
//! and `cli` turn it on); the default is all of them.

#[cfg(feature = "client")]
pub mod client;
pub mod protocol;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "tls")]
pub mod tls;
