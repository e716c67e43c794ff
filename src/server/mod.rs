//! The baton node, in layers you can see from the folders.
//!
//! - [`core`]: the I/O-free deciders — the lock table, its timing wheel and
//!   token source, the table and cluster cores, the roles, the peer
//!   messages, the time value they take. They import nothing of the crate
//!   but [`crate::protocol`] and each other, never a socket, a channel, a
//!   thread or a clock (`tests/layers.rs` fails the build's tests if one
//!   does). Time comes in as an argument; effects go out as values.
//! - [`threads`]: one file per kind of thread — the I/O loops, the lock
//!   owner, replication, the metrics server. They own the sockets, channels
//!   and clocks, and carry out what the cores decide. A thread file never
//!   imports another thread file.
//! - [`trust`]: TLS and the peer and client authentication, layers
//!   that the threads drive.
//! - The plumbing between them, at this level: [`node`] starts and stops the
//!   threads, through [`supervise`], which ends the process if one of them
//!   ends; [`shared`] holds the
//!   settings every thread reads and the few gauges that cross threads;
//!   [`messages`] the channel messages; [`rounds`] the order of the lock
//!   owner's round and of replication's work (the threads and the
//!   simulation run the same functions); [`config`] the flags; [`stats`],
//!   [`metrics_http`] and [`keys_json`] the figures and the contention view; [`clock`] the real clocks; [`peer_wire`]
//!   the framing of a peer link; [`busy_poll`] and [`sched`] CPU policy.
//!   [`os_limits`]: what the operating system must allow a node (the listen
//!   backlog, the open files).
//!
//! Never does: anything itself; this file only names the parts.

pub mod busy_poll;
pub mod clock;
pub mod config;
pub mod core;
pub mod keys_json;
pub mod messages;
pub mod metrics_http;
pub mod node;
pub mod os_limits;
pub mod peer_wire;
pub mod rounds;
pub mod sched;
pub mod shared;
pub mod stats;
pub mod supervise;
pub mod threads;
pub mod trust;

pub use clock::unix_ms;
pub use config::Config;
pub use node::{Server, StartError};
