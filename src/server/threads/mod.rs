//! The node's threads, one file per kind: the I/O loops, the lock owner,
//! the replication thread and the metrics server. Each owns its sockets,
//! channels and clock readings and carries out what the deciders in
//! `core/` return; none decides about locks or roles itself.
//!
//! Rule: a thread file never imports another thread file (checked by
//! `tests/layers.rs`); what two threads share lives in the plumbing beside
//! this folder (`messages`, `shared`, `stats`, `busy_poll`, `clock`, and `rounds`, the
//! order of the owner's round and of replication's, shared with the
//! simulation).

pub mod io_loop;
pub mod metrics;
pub mod owner;
pub mod replication;
