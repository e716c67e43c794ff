//! The time the deciders take: one reading of the node's two clocks, the
//! monotonic milliseconds that timers run on and the wall clock that token
//! floors come from.
//!
//! Owns: [`Now`], a plain value. The threads read the real clocks
//! (`server::clock`) once per round and pass a `Now` into the cores; tests
//! and the simulation make one with [`Now::at`], at any time they like,
//! skewed or not.
//!
//! Never does: read a clock.

/// One reading of both clocks, as the cores take it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    /// Monotonic ms since the node started, rounded down: the time to fire
    /// timers at (a deadline fires once it has fully passed).
    pub ms: u64,
    /// The same, rounded up: the time requests are stamped with, so a
    /// deadline set from it (now + lease) is never before the moment the
    /// request really arrived + lease.
    pub ms_ceil: u64,
    /// Milliseconds since the Unix epoch, by the wall clock.
    pub unix_ms: u64,
}

impl Now {
    /// A reading where both monotonic roundings agree (tests, simulation).
    pub fn at(ms: u64, unix_ms: u64) -> Now {
        Now {
            ms,
            ms_ceil: ms,
            unix_ms,
        }
    }
}
