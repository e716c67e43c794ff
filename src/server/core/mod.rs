//! The node's deciders: plain state machines with time passed in and
//! effects returned, run by the threads in `threads/` and, unchanged, by the
//! deterministic simulation in `tests/simulation.rs`.
//!
//! Rule: a file here imports nothing of the crate but `crate::protocol` and
//! `crate::server::core`, and never names `mio`, `crossbeam`, `std::net`,
//! `std::thread`, `Instant::now` or `SystemTime` (checked by
//! `tests/layers.rs`). So every decision can be tested without sockets,
//! threads or sleeps.

pub mod cluster_core;
pub mod connection;
pub mod contention;
pub mod counters;
pub mod deadlines;
pub mod events;
pub mod lock_table;
pub mod loop_watches;
pub mod now;
pub mod peer_msg;
pub mod roles;
pub mod table_core;
pub mod tokens;
pub mod watchers;
pub mod wheel;
