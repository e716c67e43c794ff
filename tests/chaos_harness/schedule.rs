//! The fault schedule of a chaos run: a pure function of the seed (and of
//! the run's length and `--detect`), printed before the run starts.
//!
//! Owns: the seeded random generator every part of the harness draws from
//! ([`Rng`], SplitMix64), the fault vocabulary ([`Fault`]) and the list of
//! episodes ([`Episode`]). Runs on the driver's thread before anything
//! starts.
//!
//! Never does: look at the clock, the cluster or the environment — the same
//! inputs always give the same schedule. Which node "the active" or "a
//! standby" is gets resolved when the episode runs (it is the first node
//! after a convergence, but a chained episode may hit a cluster in motion).

use std::fmt;
use std::time::Duration;

#[path = "../common/rng.rs"]
mod splitmix;

/// The schedule's generator: the tests' SplitMix64, with draws of its own
/// (modulo, unit floats), so that a seed names the same schedule as the
/// runs quoted in docs/reliability.md.
#[derive(Clone, Debug)]
pub struct Rng(splitmix::Rng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(splitmix::Rng::new(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// A duration uniform in `[lo, hi)`, rounded to the millisecond.
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let lo_ms = lo.as_millis() as u64;
        let hi_ms = (hi.as_millis() as u64).max(lo_ms + 1);
        Duration::from_millis(lo_ms + self.below(hi_ms - lo_ms))
    }
}

/// One fault, and how it is undone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL the active; start it again after `down`.
    KillActive { down: Duration },
    /// SIGKILL a standby (the `which`-th live non-active node, modulo their
    /// number); start it again after `down`.
    KillStandby { which: u8, down: Duration },
    /// SIGKILL the active and a standby together (one node left); start
    /// both again after `down`.
    KillTwo { which: u8, down: Duration },
    /// SIGSTOP the active, SIGCONT it after `stopped`: to its peers it is a
    /// partition. `stopped` is below `--detect` (no failover should happen)
    /// or above it (a failover, then a split brain when it resumes).
    StopActive { stopped: Duration },
    /// SIGTERM the active (graceful handoff), wait for it to exit, start it
    /// again after `down`.
    TermActive { down: Duration },
    /// SIGTERM a standby, wait for it to exit, start it again after `down`.
    TermStandby { which: u8, down: Duration },
}

impl Fault {
    /// How long the fault lasts before it is undone.
    pub fn hold(&self) -> Duration {
        match *self {
            Fault::KillActive { down }
            | Fault::KillStandby { down, .. }
            | Fault::KillTwo { down, .. }
            | Fault::TermActive { down }
            | Fault::TermStandby { down, .. } => down,
            Fault::StopActive { stopped } => stopped,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = |d: Duration| d.as_secs_f64();
        match *self {
            Fault::KillActive { down } => {
                write!(f, "SIGKILL the active, restart it after {:.3}s", s(down))
            }
            Fault::KillStandby { which, down } => write!(
                f,
                "SIGKILL standby #{which}, restart it after {:.3}s",
                s(down)
            ),
            Fault::KillTwo { which, down } => write!(
                f,
                "SIGKILL the active and standby #{which}, restart both after {:.3}s",
                s(down)
            ),
            Fault::StopActive { stopped } => {
                write!(f, "SIGSTOP the active, SIGCONT it after {:.3}s", s(stopped))
            }
            Fault::TermActive { down } => write!(
                f,
                "SIGTERM the active (graceful), restart it {:.3}s after it exits",
                s(down)
            ),
            Fault::TermStandby { which, down } => write!(
                f,
                "SIGTERM standby #{which}, restart it {:.3}s after it exits",
                s(down)
            ),
        }
    }
}

/// When an episode starts, relative to the one before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gap {
    /// This long after the previous episode's cluster converged again.
    Quiet(Duration),
    /// This long after the previous episode's last recovery action, without
    /// waiting for the cluster to converge (a fault during a failover or a
    /// handoff).
    Chained(Duration),
}

/// One step of the schedule: wait `gap`, inject `fault`, undo it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Episode {
    pub gap: Gap,
    pub fault: Fault,
    /// Planned start, from the start of the run, if every convergence took
    /// [`CONVERGENCE_ALLOWANCE`]; only a guide, printed with the schedule.
    pub planned_at: Duration,
}

impl fmt::Display for Episode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gap = match self.gap {
            Gap::Quiet(d) => format!("{:.3}s after convergence", d.as_secs_f64()),
            Gap::Chained(d) => format!("{:.3}s after the last recovery (chained)", d.as_secs_f64()),
        };
        write!(
            f,
            "~{:>7.3}s  {gap:<40} {}",
            self.planned_at.as_secs_f64(),
            self.fault
        )
    }
}

/// Time allowed in the plan for a cluster to converge after an episode.
pub const CONVERGENCE_ALLOWANCE: Duration = Duration::from_millis(300);
/// Quiet time at the start of a run, before the first fault.
pub const WARMUP: Duration = Duration::from_secs(2);

/// The schedule for a run of `duration` whose last `tail` has no fault,
/// with nodes detecting failures in `detect`: a pure function of `seed`.
pub fn plan(seed: u64, duration: Duration, tail: Duration, detect: Duration) -> Vec<Episode> {
    let mut rng = Rng::new(seed);
    let mut episodes = Vec::new();
    let mut at = WARMUP;
    let end = duration.saturating_sub(tail);
    let ms = Duration::from_millis;
    // Bounded by count as well as by time.
    for _ in 0..10_000 {
        let gap = if rng.chance(0.2) {
            Gap::Chained(rng.between(ms(0), ms(300)))
        } else {
            Gap::Quiet(rng.between(ms(300), ms(2000)))
        };
        let down = rng.between(ms(200), ms(2500));
        let which = rng.below(2) as u8;
        let fault = match rng.below(100) {
            0..=24 => Fault::KillActive { down },
            25..=39 => Fault::KillStandby { which, down },
            40..=44 => Fault::KillTwo { which, down },
            45..=54 => Fault::StopActive {
                // Shorter than --detect: no failover should happen.
                stopped: rng.between(detect / 10, detect * 8 / 10),
            },
            55..=69 => Fault::StopActive {
                // Longer: a failover, then a split brain on SIGCONT.
                stopped: rng.between(detect * 3 / 2, detect * 5),
            },
            70..=89 => Fault::TermActive { down },
            _ => Fault::TermStandby { which, down },
        };
        let start = at
            + match gap {
                Gap::Quiet(d) => d,
                Gap::Chained(d) => d.saturating_sub(CONVERGENCE_ALLOWANCE),
            };
        let finish = start + fault.hold() + CONVERGENCE_ALLOWANCE;
        if finish > end {
            break;
        }
        episodes.push(Episode {
            gap,
            fault,
            planned_at: start,
        });
        at = finish;
    }
    episodes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_another_seed_another() {
        let d = Duration::from_secs(600);
        let tail = Duration::from_secs(5);
        let detect = Duration::from_millis(500);
        let a = plan(42, d, tail, detect);
        assert_eq!(a, plan(42, d, tail, detect));
        assert_ne!(a, plan(43, d, tail, detect));
        assert!(a.len() > 50, "a long run has many faults: {}", a.len());
        assert!(a.iter().all(|e| e.planned_at + e.fault.hold() < d - tail));
    }

    #[test]
    fn stops_are_sometimes_shorter_and_sometimes_longer_than_the_detection_time() {
        let detect = Duration::from_millis(500);
        let stops: Vec<Duration> = plan(7, Duration::from_secs(600), Duration::ZERO, detect)
            .iter()
            .filter_map(|e| match e.fault {
                Fault::StopActive { stopped } => Some(stopped),
                _ => None,
            })
            .collect();
        assert!(stops.iter().any(|&s| s < detect));
        assert!(stops.iter().any(|&s| s > detect));
    }
}
