//! The node's real clocks: the monotonic millisecond clock that timers run
//! on, and the wall clock that token floors come from.
//!
//! Owns: [`Clock`], which the lock owner and the replication thread read
//! once per round and pass, as a [`Now`], into the cores (which never read a
//! clock themselves), and [`unix_ms`]. Each I/O loop keeps a `Clock` of
//! its own for its connections' deadlines (passed in as a `Now`), and the
//! busy-poll windows read `Instant::now` directly; no decision about locks
//! or roles depends on those readings.
//!
//! Never does: sleep, or decide anything.

use std::time::{Duration, Instant};

pub use crate::server::core::now::Now;

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
