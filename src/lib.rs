//! baton: a lock server with strict FIFO queues and fencing tokens.
//!
//! A key is granted to one holder at a time, in the order the requests
//! came, for a lease the holder keeps alive or releases; each grant carries
//! a fencing token, greater than every token before it, for the protected
//! resource to check. A small cluster fails over to a standby without a
//! quorum. This crate is the node (`batond`), the command-line tool
//! (`baton`) and the Rust client library.
//!
//! Layout:
//! - [`protocol`]: the wire format, pure parsing and formatting;
//! - `server` (feature `server`): the node — I/O loops, the lock owner and
//!   its lock table and timing wheel, configuration;
//! - `client` (feature `client`): the Rust client library — persistent
//!   connections, pipelining, failover, redirects, grants and
//!   release-on-drop guards, held locks that keep themselves alive, and
//!   `async` versions of every call;
//! - `src/bin/batond.rs`: the server binary; `src/bin/baton.rs`: the CLI.
//!
//! Cargo features: `client` (the library alone), `server` (the node and
//! `batond`), `cli` (`baton`), `tls` (TLS in the client library; `server`
//! and `cli` turn it on); the default is all of them. The package is
//! published as `baton-lock`; its library is `baton`. A service that only
//! takes locks depends on the client alone:
//!
//! ```toml
//! [dependencies]
//! baton-lock = { version = "0.1", default-features = false, features = ["client"] }
//! ```
//!
//! and writes `use baton::client::Client;` (add `"tls"` to the features for
//! servers started with `--tls-cert`).
#![cfg_attr(
    feature = "client",
    doc = r#"
# Quick start

A lock around a job, against a `batond` on this machine (`cargo run
--release --bin batond`); the crate's `examples/` directory has whole
programs (`cargo run --release --example lock_job`):

```no_run
use std::time::Duration;
use baton::client::Client;

# fn main() -> Result<(), baton::client::Error> {
let client = Client::connect(["127.0.0.1:7373"])?;
// Wait up to 10 s in line; the grant lasts 30 s unless released or kept.
let guard = client.lock("nightly-report", Duration::from_secs(30), Some(Duration::from_secs(10)))?;
// Hand the fencing token to what the lock protects: it refuses any token
// smaller than the largest it has seen, so a holder whose lease ran out
// cannot overwrite the work of the next one.
println!("running with token {}", guard.token());
drop(guard); // released
# Ok(())
# }
```

See [`client`] for the calls, [`client::Client::hold`] for a lock whose
lease is kept alive in the background, and [`client::Client::acquire_async`]
for the `async` calls.
"#
)]
#![warn(missing_docs)]

#[cfg(feature = "client")]
pub mod client;
pub mod protocol;
#[cfg(feature = "server")]
#[allow(missing_docs)]
pub mod server;
#[cfg(feature = "tls")]
pub mod tls;

/// The Rust examples of docs/clients.md, compiled by `cargo test --doc` so
/// that what a user copies from the docs builds.
#[cfg(all(doctest, feature = "client"))]
#[doc = include_str!("../docs/clients.md")]
pub struct ClientsDocExamples;
