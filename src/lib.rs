//! baton: a lock server with strict FIFO queues and fencing tokens.
//!
//! Layout (see ARCHITECTURE.md):
//! - [`protocol`]: the wire format, pure parsing and formatting;
//! - [`server`]: the node — I/O loops, the lock owner and its lock table and
//!   timing wheel, configuration;
//! - [`client`]: the Rust client library — persistent connections,
//!   pipelining, failover, redirects, grants and release-on-drop guards;
//! - `src/bin/batond.rs`: the server binary; `src/bin/baton.rs`: the CLI.

pub mod client;
pub mod protocol;
pub mod server;
