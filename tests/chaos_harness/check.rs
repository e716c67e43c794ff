//! The checks of a chaos run, done after it from what was recorded: the
//! fenced resources' write logs (the semaphore's with the moments it had
//! too many writes in flight), the workers' critical sections, grants and
//! slow calls, the fault actions and the monitor's samples.
//!
//! Owns: the fault windows and every verdict. A fault window, precisely:
//! from the first action of an episode (the SIGKILL, SIGSTOP or SIGTERM) to
//! the end of the first converged monitor round that started after the
//! episode's last action (its restart or SIGCONT), plus [`WINDOW_MARGIN`];
//! a chained episode's window therefore runs to the convergence after the
//! chain. An episode whose cluster never converged keeps its window open to
//! the end of the run (and fails the convergence check). A window is
//! *lossy* when its episode SIGKILLed or SIGSTOPped a node: replication is
//! asynchronous, so such an episode may lose the latest grants; an episode
//! of SIGTERMs only (graceful handoffs) loses nothing that is replicated.
//!
//! Pure: no threads, no I/O, no clock — everything is passed in.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use super::cluster::Event;
use super::monitor::{Level, Sample};
use super::workers::{Crowd, LostGrant, Section, SemGrant, SemRecord, SemWrite, Write};

/// Added to the end of every fault window: a critical section that started
/// just before the cluster converged may still be running, and the worker
/// whose section overlaps it takes its timestamps a little after the grant.
/// Critical sections last at most the workload's `max_work` (10 ms) plus
/// scheduling, so a margin of 1 s is generous.
pub const WINDOW_MARGIN: Duration = Duration::from_secs(1);

/// One fault window.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub episode: usize,
    pub from: Instant,
    /// The converged round's end, without the margin; None if never.
    pub converged: Option<Instant>,
    pub to: Instant,
    /// The episode SIGKILLed or SIGSTOPped a node.
    pub lossy: bool,
}

impl Window {
    pub fn contains(&self, t: Instant) -> bool {
        self.from <= t && t <= self.to
    }
}

/// Windows of every episode that ran, from its actions and the samples.
pub fn windows(events: &[Event], samples: &[Sample], run_end: Instant) -> Vec<Window> {
    let mut by_episode: Vec<(usize, Instant, u64, bool)> = Vec::new();
    for event in events
        .iter()
        .filter(|e| e.episode != SETUP && e.episode != CRASH)
    {
        let lossy = matches!(event.what, "SIGKILL" | "SIGSTOP");
        match by_episode.last_mut() {
            Some(last) if last.0 == event.episode => {
                last.2 = event.epoch;
                last.3 |= lossy;
            }
            _ => by_episode.push((event.episode, event.at, event.epoch, lossy)),
        }
    }
    by_episode
        .into_iter()
        .map(|(episode, from, last_epoch, lossy)| {
            let converged = first_converged_after(samples, last_epoch);
            Window {
                episode,
                from,
                converged,
                to: converged.map_or(run_end, |t| t + WINDOW_MARGIN),
                lossy,
            }
        })
        .collect()
}

/// The episode index of the cluster's first start.
pub const SETUP: usize = usize::MAX;
/// The episode index of a node found to have exited by itself.
pub const CRASH: usize = usize::MAX - 1;

/// The end of the first converged round that started at or after `epoch`.
pub fn first_converged_after(samples: &[Sample], epoch: u64) -> Option<Instant> {
    samples
        .iter()
        .find(|s| s.level >= Level::Converged && s.epoch >= epoch)
        .map(|s| s.at)
}

fn in_any(windows: &[Window], t: Instant) -> bool {
    windows.iter().any(|w| w.contains(t))
}

fn in_lossy(windows: &[Window], t: Instant) -> bool {
    windows.iter().any(|w| w.lossy && w.contains(t))
}

/// Some lossy window meets `[from, to]`.
fn meets_lossy(windows: &[Window], from: Instant, to: Instant) -> bool {
    windows
        .iter()
        .any(|w| w.lossy && w.from <= to && from <= w.to)
}

/// Some window meets `[from, to]`.
fn meets_any(windows: &[Window], from: Instant, to: Instant) -> bool {
    windows.iter().any(|w| w.from <= to && from <= w.to)
}

/// Two workers in one key's critical section at once.
#[derive(Clone, Copy, Debug)]
pub struct Overlap {
    pub first: Section,
    pub second: Section,
}

impl Overlap {
    /// When the overlap began: the later section's start.
    pub fn start(&self) -> Instant {
        self.second.start
    }

    pub fn length(&self) -> Duration {
        self.first.end.min(self.second.end) - self.second.start
    }
}

/// Every pair of sections of one key by different workers that intersect.
pub fn overlaps(sections: &[Section]) -> Vec<Overlap> {
    let mut by_key: HashMap<u32, Vec<Section>> = HashMap::new();
    for s in sections {
        by_key.entry(s.key).or_default().push(*s);
    }
    let mut found = Vec::new();
    for (_, mut list) in by_key {
        list.sort_by_key(|s| s.start);
        // Sections still open at the current start, by end.
        let mut open: Vec<Section> = Vec::new();
        for s in list {
            open.retain(|o| o.end > s.start);
            for o in &open {
                if o.worker != s.worker {
                    found.push(Overlap {
                        first: *o,
                        second: s,
                    });
                }
            }
            open.push(s);
        }
    }
    found.sort_by_key(|o| o.start());
    found
}

/// The fencing verdicts.
#[derive(Debug, Default)]
pub struct Fencing {
    pub accepted: u64,
    pub rejected: u64,
    /// Rejected writes outside every fault window (a token smaller than one
    /// accepted before, with no fault to explain it).
    pub rejected_outside: Vec<Write>,
    /// Accepted writes whose token was not above the last accepted for the
    /// key (the resource itself misbehaving: must never happen).
    pub accepted_smaller: Vec<Write>,
    /// Tokens granted twice (to two sections).
    pub duplicate_tokens: Vec<u64>,
}

/// Check the resource's log, and that no token of `tokens` (every grant's,
/// of every key) came twice.
pub fn fencing(log: &[Write], tokens: &[u64], windows: &[Window]) -> Fencing {
    let mut out = Fencing::default();
    let mut last: HashMap<u32, u64> = HashMap::new();
    for w in log {
        let prev = last.get(&w.key).copied().unwrap_or(0);
        if w.accepted {
            out.accepted += 1;
            if w.token <= prev {
                out.accepted_smaller.push(*w);
            }
            last.insert(w.key, w.token.max(prev));
        } else {
            out.rejected += 1;
            if !in_any(windows, w.at) {
                out.rejected_outside.push(*w);
            }
        }
    }
    let mut seen = HashSet::new();
    for &t in tokens {
        if !seen.insert(t) {
            out.duplicate_tokens.push(t);
        }
    }
    out
}

/// The semaphore key's verdicts: fencing per slot (hard: never a stale
/// token accepted), and the holders the resource had at once (more than the
/// limit, or a slot twice, only in a fault window).
#[derive(Debug, Default)]
pub struct SemCheck {
    pub accepted: u64,
    pub rejected: u64,
    /// Rejected writes by slot.
    pub rejected_by_slot: BTreeMap<u32, u64>,
    /// Rejected writes outside every fault window (the slot's tokens out of
    /// order with no fault to explain it).
    pub rejected_outside: Vec<SemWrite>,
    /// Accepted writes whose token was not above the last accepted for the
    /// slot: a stale token let through. Must never happen.
    pub accepted_stale: Vec<SemWrite>,
    /// Rejected writes whose token was above the slot's last: the fence
    /// refusing a current holder. Must never happen.
    pub rejected_fresh: Vec<SemWrite>,
    /// Grants with a slot not below the limit.
    pub bad_slots: Vec<SemGrant>,
    /// Moments a write began with more than the limit in flight.
    pub over_limit: usize,
    pub over_limit_outside: Vec<Crowd>,
    /// Moments a write began on a slot already in flight.
    pub slot_twice: usize,
    pub slot_twice_outside: Vec<Crowd>,
    /// The most writes in flight at once.
    pub most_in_flight: u32,
    /// Crowds (over the limit, or a slot twice) that began in a fault
    /// window, but in no lossy one: a graceful handoff keeps the holders,
    /// so these must not happen.
    pub crowds_graceful: Vec<Crowd>,
    /// Releases answered "not held": the active did not know the grant.
    pub lost: usize,
    /// Of them, those whose grant-to-release span met no fault window: a
    /// holder lost with no fault at all.
    pub lost_outside: Vec<LostGrant>,
    /// Those whose span met a fault window but no lossy one: lost in a
    /// graceful handoff, which keeps every holder: must not happen.
    pub lost_graceful: Vec<LostGrant>,
}

/// Check the semaphore's resource record, its grants, and the grants its
/// releases found lost.
pub fn semaphore(
    record: &SemRecord,
    grants: &[SemGrant],
    lost: &[LostGrant],
    limit: u32,
    windows: &[Window],
) -> SemCheck {
    let mut out = SemCheck {
        most_in_flight: record.most_in_flight,
        ..SemCheck::default()
    };
    let mut last: HashMap<u32, u64> = HashMap::new();
    for w in &record.log {
        let prev = last.get(&w.slot).copied().unwrap_or(0);
        if w.accepted {
            out.accepted += 1;
            if w.token <= prev {
                out.accepted_stale.push(*w);
            }
            last.insert(w.slot, w.token.max(prev));
        } else {
            out.rejected += 1;
            *out.rejected_by_slot.entry(w.slot).or_default() += 1;
            if w.token > prev {
                out.rejected_fresh.push(*w);
            }
            if !in_any(windows, w.at) {
                out.rejected_outside.push(*w);
            }
        }
    }
    out.bad_slots = grants.iter().filter(|g| g.slot >= limit).copied().collect();
    out.lost = lost.len();
    for g in lost {
        if !meets_any(windows, g.granted, g.released) {
            out.lost_outside.push(*g);
        } else if !meets_lossy(windows, g.granted, g.released) {
            out.lost_graceful.push(*g);
        }
    }
    for c in &record.crowds {
        let outside = !in_any(windows, c.at);
        if !outside && !in_lossy(windows, c.at) {
            out.crowds_graceful.push(*c);
        }
        if c.holders > limit {
            out.over_limit += 1;
            if outside {
                out.over_limit_outside.push(*c);
            }
        }
        if c.slot_holders > 1 {
            out.slot_twice += 1;
            if outside {
                out.slot_twice_outside.push(*c);
            }
        }
    }
    out
}

/// Overlaps split by whether they began in a fault window.
pub fn overlaps_outside(overlaps: &[Overlap], windows: &[Window]) -> Vec<Overlap> {
    overlaps
        .iter()
        .filter(|o| !in_any(windows, o.start()))
        .copied()
        .collect()
}

/// The longest stretch with no node serving: the longest interval between
/// two monitor rounds that saw a node answer `role=active state=active`,
/// with only rounds that saw none in between. Returns (length, when it
/// began).
pub fn longest_no_active(samples: &[Sample]) -> Option<(Duration, Instant)> {
    let mut last_serving: Option<Instant> = None;
    let mut gap_open = false;
    let mut longest: Option<(Duration, Instant)> = None;
    for s in samples {
        if s.serving() {
            if let (true, Some(since)) = (gap_open, last_serving) {
                let gap = s.at - since;
                if longest.is_none_or(|(l, _)| gap > l) {
                    longest = Some((gap, since));
                }
            }
            last_serving = Some(s.at);
            gap_open = false;
        } else {
            gap_open = true;
        }
    }
    longest
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(
        worker: u16,
        key: u32,
        token: u64,
        t0: Instant,
        from_ms: u64,
        to_ms: u64,
    ) -> Section {
        Section {
            worker,
            key,
            token,
            start: t0 + Duration::from_millis(from_ms),
            end: t0 + Duration::from_millis(to_ms),
        }
    }

    #[test]
    fn intersecting_sections_of_one_key_by_two_workers_overlap() {
        let t0 = Instant::now();
        let sections = [
            section(0, 1, 10, t0, 0, 10),
            section(1, 1, 11, t0, 10, 20), // touches, does not overlap
            section(2, 1, 12, t0, 15, 30), // overlaps worker 1
            section(3, 2, 13, t0, 0, 100), // another key
            section(2, 1, 14, t0, 31, 40),
        ];
        let found = overlaps(&sections);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].first.worker, found[0].second.worker), (1, 2));
        assert_eq!(found[0].length(), Duration::from_millis(5));
    }

    #[test]
    fn a_rejected_write_outside_every_window_is_reported() {
        let t0 = Instant::now();
        let w = |ms: u64, token: u64, accepted: bool| Write {
            at: t0 + Duration::from_millis(ms),
            key: 0,
            token,
            worker: 0,
            accepted,
        };
        let log = [
            w(0, 5, true),
            w(10, 4, false),
            w(200, 3, false),
            w(300, 6, true),
        ];
        let windows = [Window {
            episode: 0,
            from: t0 + Duration::from_millis(5),
            converged: None,
            to: t0 + Duration::from_millis(50),
            lossy: true,
        }];
        let f = fencing(&log, &[7, 8, 7], &windows);
        assert_eq!((f.accepted, f.rejected), (2, 2));
        assert_eq!(f.rejected_outside.len(), 1);
        assert_eq!(f.rejected_outside[0].token, 3);
        assert!(f.accepted_smaller.is_empty());
        assert_eq!(f.duplicate_tokens, [7]);
    }

    #[test]
    fn the_semaphore_check_fences_per_slot_and_counts_crowds_outside_windows() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let w = |ms: u64, slot: u32, token: u64, accepted: bool| SemWrite {
            at: at(ms),
            slot,
            token,
            worker: 0,
            accepted,
        };
        let crowd = |ms: u64, holders: u32, slot_holders: u32| Crowd {
            at: at(ms),
            slot: 0,
            token: 1,
            worker: 0,
            holders,
            slot_holders,
        };
        let record = SemRecord {
            log: vec![
                w(0, 0, 10, true),
                w(1, 1, 5, true), // below slot 0's last, but another slot
                w(2, 0, 9, false),
                w(300, 1, 4, false),  // outside the window
                w(301, 1, 3, true),   // a stale token let through
                w(302, 2, 20, false), // a current holder refused
            ],
            crowds: vec![
                crowd(10, 4, 1),
                crowd(20, 2, 2),
                crowd(400, 4, 2),
                crowd(1010, 4, 1), // in the graceful window
            ],
            most_in_flight: 4,
        };
        let grants = [SemGrant {
            worker: 0,
            token: 30,
            slot: 3,
            at: at(0),
        }];
        let windows = [
            Window {
                episode: 0,
                from: at(0),
                converged: None,
                to: at(50),
                lossy: true,
            },
            Window {
                episode: 1,
                from: at(1000),
                converged: None,
                to: at(1100),
                lossy: false,
            },
        ];
        let lost = |from: u64, to: u64| LostGrant {
            worker: 0,
            token: 1,
            slot: 0,
            granted: at(from),
            released: at(to),
        };
        let lost = [
            lost(40, 60),     // meets the lossy window
            lost(500, 510),   // no window
            lost(990, 1001),  // the graceful window only
            lost(1200, 1300), // no window
        ];
        let c = semaphore(&record, &grants, &lost, 3, &windows);
        assert_eq!((c.accepted, c.rejected), (3, 3));
        assert_eq!(c.rejected_by_slot, BTreeMap::from([(0, 1), (1, 1), (2, 1)]));
        let tokens = |ws: &[SemWrite]| ws.iter().map(|w| w.token).collect::<Vec<_>>();
        assert_eq!(tokens(&c.rejected_outside), [4, 20]);
        assert_eq!(tokens(&c.accepted_stale), [3]);
        assert_eq!(tokens(&c.rejected_fresh), [20]);
        assert_eq!(c.bad_slots.len(), 1);
        assert_eq!((c.over_limit, c.over_limit_outside.len()), (3, 1));
        assert_eq!((c.slot_twice, c.slot_twice_outside.len()), (2, 1));
        assert_eq!(c.crowds_graceful.len(), 1);
        assert_eq!(c.crowds_graceful[0].at, at(1010));
        assert_eq!(c.lost, 4);
        let granted = |gs: &[LostGrant]| gs.iter().map(|g| g.granted).collect::<Vec<_>>();
        assert_eq!(granted(&c.lost_outside), [at(500), at(1200)]);
        assert_eq!(granted(&c.lost_graceful), [at(990)]);
        assert_eq!(c.most_in_flight, 4);
    }
}
