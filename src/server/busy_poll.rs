//! Adaptive busy polling: how long an idle thread polls before it sleeps.
//!
//! Owns: one thread's polling window, a plain state machine with durations
//! passed in (no clock, no I/O), so its rules are tested deterministically.
//! Each I/O loop and the lock owner has one: the thread asks
//! [`BusyPoll::window`] when it runs out of work, polls its input without
//! blocking for that long (yielding the CPU to any other thread that wants
//! it), and reports with [`BusyPoll::idle_ended`] how long the idle stretch
//! lasted when input came.
//!
//! Why: waking a thread that sleeps in `epoll_wait` or on a channel costs
//! tens of microseconds on many machines (an idle core leaving its sleep
//! state, a virtual CPU being rescheduled), more than the lock server's own
//! work on a request. A thread still polling when the next request or
//! answer arrives takes it at once, and needs no wake-up call. The rules are
//! those of Linux's `haltpoll` idle governor: a stretch the window was too short for but `--busy-poll-us`
//! would have covered doubles the window; a stretch longer than
//! `--busy-poll-us` halves it, down to nothing. So a thread with traffic at
//! short, regular intervals polls through the gaps, and an idle or
//! sparsely used thread sleeps at once and costs no CPU.
//!
//! [`IdleStretch`] is the thin clock-reading part both threads share: when
//! the current idle stretch began, and so when its polling window closes.
//!
//! The lock owner's input comes only from the node's other threads (the
//! I/O loops, replication). Where it may run on one CPU only (the node
//! pinned to one core, `taskset` or a cpuset), the thread it waits for
//! cannot run while it polls: each look it takes only delays that thread
//! (under Linux's EEVDF scheduler a `sched_yield` hands the CPU over only
//! when the other thread is owed it), so there it sleeps at once and is
//! woken, as with `--busy-poll-us 0` ([`IdleStretch::poll_until_beside`];
//! [`OneCpu`] reads the thread's CPU set at most every 100 ms).
//!
//! Never does: block, or poll itself; only `IdleStretch` reads the clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The first window after a stretch that polling would have covered.
const GROW_START: Duration = Duration::from_micros(25);

/// One thread's polling window.
#[derive(Debug, Clone)]
pub struct BusyPoll {
    max: Duration,
    window: Duration,
}

impl BusyPoll {
    /// Windows of at most `max`; `Duration::ZERO` never polls.
    pub fn new(max: Duration) -> BusyPoll {
        BusyPoll {
            max,
            window: Duration::ZERO,
        }
    }

    /// How long to poll, from the start of an idle stretch, before sleeping.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The window of a thread whose input may or may not be latency
    /// sensitive: a lock owner polls only while it serves clients. A
    /// standby's owner gets its input from the replication thread, in
    /// batches no client waits on: it sleeps at once (so it leaves the CPU
    /// to the active when both share a machine).
    pub fn window_if(&self, serving: bool) -> Duration {
        if serving { self.window } else { Duration::ZERO }
    }

    /// An idle stretch ended (work arrived) after `idle`.
    pub fn idle_ended(&mut self, idle: Duration) {
        if idle <= self.window {
            // Polling caught it: keep the window.
        } else if idle <= self.max {
            // A longer window would have caught it.
            self.window = (self.window * 2).max(GROW_START).min(self.max);
        } else {
            // No window allowed would have: stop wasting the CPU.
            self.window /= 2;
            if self.window < GROW_START {
                self.window = Duration::ZERO;
            }
        }
    }
}

/// One thread's current idle stretch and its polling window.
#[derive(Debug)]
pub struct IdleStretch {
    pub(crate) window: BusyPoll,
    /// When the stretch began (None while the thread has work).
    pub(crate) since: Option<Instant>,
}

impl IdleStretch {
    pub fn new(max: Duration) -> IdleStretch {
        IdleStretch {
            window: BusyPoll::new(max),
            since: None,
        }
    }

    /// The thread is out of work: the stretch begins now unless it already
    /// has. When its polling window closes.
    pub fn poll_until(&mut self) -> Instant {
        self.poll_until_if(true)
    }

    /// As [`IdleStretch::poll_until`], for a thread that polls only while
    /// `serving` (see [`BusyPoll::window_if`]).
    pub fn poll_until_if(&mut self, serving: bool) -> Instant {
        *self.since.get_or_insert_with(Instant::now) + self.window.window_if(serving)
    }

    /// As [`IdleStretch::poll_until_if`], for a thread fed only by the
    /// node's other threads (the lock owner): it does not poll either
    /// while it may run on one CPU only (see the module doc).
    pub fn poll_until_beside(&mut self, serving: bool, one_cpu: &mut OneCpu) -> Instant {
        let since = *self.since.get_or_insert_with(Instant::now);
        let alone = serving && one_cpu.check(since, cpus_allowed_here);
        since + self.window.window_if(serving && !alone)
    }

    /// Work arrived from outside: the stretch is over and the window adapts
    /// to how long it lasted.
    pub fn end(&mut self) {
        if let Some(since) = self.since.take() {
            self.window.idle_ended(since.elapsed());
        }
    }

    /// The thread did work of its own: the next stretch begins when it next
    /// runs out of work, and the window stays as it is.
    pub fn restart(&mut self) {
        self.since = None;
    }
}

/// How often [`OneCpu`] reads the thread's CPU set again (a `taskset` or a
/// cpuset change takes effect within this).
const AFFINITY_RECHECK: Duration = Duration::from_millis(100);

/// Whether the calling thread may run on one CPU only, read from the
/// scheduler at most once per `AFFINITY_RECHECK` (time passed in, so the
/// rule is tested without a clock).
#[derive(Debug, Default)]
pub struct OneCpu {
    checked: Option<Instant>,
    one: bool,
}

impl OneCpu {
    /// One CPU only, as `read` (the number of CPUs allowed; None if it
    /// cannot tell, taken as more than one) said at most
    /// `AFFINITY_RECHECK` before `now`.
    pub fn check(&mut self, now: Instant, read: impl FnOnce() -> Option<usize>) -> bool {
        let due = self
            .checked
            .is_none_or(|at| now.saturating_duration_since(at) >= AFFINITY_RECHECK);
        if due {
            self.one = read() == Some(1);
            self.checked = Some(now);
        }
        self.one
    }
}

/// How many CPUs the calling thread may run on (None if the system does
/// not say).
pub fn cpus_allowed_here() -> Option<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; the size passed
        // is its own; pid 0 is the calling thread.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let rc =
            unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        // SAFETY: `set` was filled in by the kernel.
        (rc == 0).then(|| unsafe { libc::CPU_COUNT(&set) } as usize)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// How many of a node's threads may busy-poll at once: more pollers than
/// cores would take turns on the cores for nothing and starve everything
/// else on the machine.
#[derive(Debug)]
pub struct PollerSlots {
    used: AtomicUsize,
    max: usize,
}

impl PollerSlots {
    pub fn new(max: usize) -> PollerSlots {
        PollerSlots {
            used: AtomicUsize::new(0),
            max,
        }
    }

    /// Take a slot to poll with; false if all are taken (then sleep).
    pub fn try_take(&self) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used < self.max).then_some(used + 1)
            })
            .is_ok()
    }

    /// Give back a slot taken with [`PollerSlots::try_take`].
    pub fn give_back(&self) {
        let before = self.used.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(before > 0, "a slot given back was taken");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn a_fresh_loop_sleeps_at_once() {
        assert_eq!(BusyPoll::new(us(500)).window(), Duration::ZERO);
    }

    #[test]
    fn short_regular_gaps_grow_the_window_until_it_covers_them() {
        let mut poll = BusyPoll::new(us(500));
        let mut windows = Vec::new();
        for _ in 0..6 {
            poll.idle_ended(us(180));
            windows.push(poll.window().as_micros());
        }
        // 25, 50, 100, 200 (covers 180), then kept.
        assert_eq!(windows, [25, 50, 100, 200, 200, 200]);
    }

    #[test]
    fn the_window_never_passes_the_flag() {
        let mut poll = BusyPoll::new(us(60));
        for _ in 0..10 {
            poll.idle_ended(us(59));
        }
        assert_eq!(poll.window(), us(60));
    }

    #[test]
    fn long_gaps_shrink_the_window_to_nothing() {
        let mut poll = BusyPoll::new(us(400));
        for _ in 0..10 {
            poll.idle_ended(us(390));
        }
        assert_eq!(poll.window(), us(400));
        let mut windows = Vec::new();
        for _ in 0..5 {
            poll.idle_ended(Duration::from_millis(20));
            windows.push(poll.window().as_micros());
        }
        assert_eq!(windows, [200, 100, 50, 25, 0]);
    }

    #[test]
    fn a_gap_caught_by_polling_keeps_the_window() {
        let mut poll = BusyPoll::new(us(500));
        poll.idle_ended(us(100));
        poll.idle_ended(us(100));
        let window = poll.window();
        poll.idle_ended(us(1));
        poll.idle_ended(window);
        assert_eq!(poll.window(), window);
    }

    #[test]
    fn no_more_threads_poll_at_once_than_there_are_slots() {
        let slots = PollerSlots::new(2);
        assert!(slots.try_take());
        assert!(slots.try_take());
        assert!(!slots.try_take());
        slots.give_back();
        assert!(slots.try_take());
        assert!(!slots.try_take());
    }

    #[test]
    fn a_thread_that_does_not_serve_never_polls() {
        let mut poll = BusyPoll::new(us(500));
        for _ in 0..6 {
            poll.idle_ended(us(180));
        }
        assert_eq!(poll.window_if(true), us(200));
        assert_eq!(poll.window_if(false), Duration::ZERO);
        // The window it learnt is kept for when it serves again.
        assert_eq!(poll.window(), us(200));
    }

    #[test]
    fn the_cpu_set_is_read_once_then_again_when_the_recheck_is_due() {
        let mut one = OneCpu::default();
        let t0 = Instant::now();
        let mut reads = 0;
        let mut read = |n: Option<usize>| {
            reads += 1;
            move || n
        };
        let r = AFFINITY_RECHECK;
        assert!(one.check(t0, read(Some(1))));
        // Before the recheck is due: not read again, the answer kept.
        assert!(one.check(t0 + r - Duration::from_millis(1), || Some(4)));
        assert!(!one.check(t0 + r, read(Some(4))));
        assert!(!one.check(t0 + r + r / 2, || Some(1)));
        // A set that cannot be read counts as more than one CPU.
        assert!(!one.check(t0 + 3 * r, read(None)));
        assert_eq!(reads, 3);
    }

    #[test]
    fn an_owner_confined_to_one_cpu_does_not_poll() {
        let mut stretch = IdleStretch::new(us(500));
        for _ in 0..6 {
            stretch.window.idle_ended(us(180));
        }
        let since = *stretch.since.get_or_insert_with(Instant::now);
        // Checked at the stretch's start: not due again within it, so the
        // answers given here are the ones used.
        let mut one = OneCpu::default();
        one.check(since, || Some(1));
        assert_eq!(stretch.poll_until_beside(true, &mut one), since);
        let mut many = OneCpu::default();
        many.check(since, || Some(2));
        assert_eq!(stretch.poll_until_beside(true, &mut many), since + us(200));
        assert_eq!(stretch.poll_until_beside(false, &mut many), since);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_thread_pinned_to_one_cpu_counts_one() {
        let n = std::thread::spawn(|| {
            // Pin this thread to the first CPU it may use (CPU 0 may not
            // be one: a cpuset). SAFETY: zeroed cpu_set_t values are
            // valid empty sets, filled by the kernel or with indices
            // below CPU_SETSIZE; pid 0 is this thread.
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            let rc = unsafe {
                libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set)
            };
            assert_eq!(rc, 0);
            let first = (0..libc::CPU_SETSIZE as usize)
                .find(|&c| unsafe { libc::CPU_ISSET(c, &set) })
                .expect("a CPU");
            let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            unsafe { libc::CPU_SET(first, &mut one) };
            let rc =
                unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one) };
            assert_eq!(rc, 0);
            cpus_allowed_here()
        })
        .join()
        .expect("thread");
        assert_eq!(n, Some(1));
        assert!(cpus_allowed_here().is_some_and(|n| n >= 1));
    }

    #[test]
    fn zero_turns_polling_off() {
        let mut poll = BusyPoll::new(Duration::ZERO);
        for idle in [us(1), us(30), us(1000)] {
            poll.idle_ended(idle);
            assert_eq!(poll.window(), Duration::ZERO);
        }
    }
}
