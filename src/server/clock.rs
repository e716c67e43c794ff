//! The node's clocks, in one place: the monotonic millisecond clock that
//! timers run on, and the wall clock that token floors come from.
//!
//! Owns: every clock read of the server. The shells (owner.rs,
//! replication.rs) read the time here once per round and pass it, as a
//! [`Now`], into the cores, which never read a clock themselves — so tests
//! and the simulation drive them with any time they like, skewed or not.
//!
//! Never does: sleep, or decide anything.

use std::time::{Duration, Instant};

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

/// A monotonic millisecond clock shared by the node's threads.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    pub fn new() -> Clock {
        Clock {
            start: Instant::now(),
        }
    }

    /// Both clocks, read now.
    pub fn now(&self) -> Now {
        let elapsed = self.start.elapsed();
        let ms = elapsed.as_millis() as u64;
        let ms_ceil = if elapsed.subsec_nanos().is_multiple_of(1_000_000) {
            ms
        } else {
            ms + 1
        };
        Now {
            ms,
            ms_ceil,
            unix_ms: unix_ms(),
        }
    }

    /// Monotonic ms since the clock started, rounded down.
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// The instant at monotonic ms `ms`.
    pub fn instant_of(&self, ms: u64) -> Instant {
        self.start + Duration::from_millis(ms)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// Milliseconds since the Unix epoch, by the wall clock.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
