//! One I/O loop's side of the watches, written once for the threads and
//! the simulation: what the loop does with a parsed `W` or `X`, with the
//! owner's answers about watches and its entries for the loop's watchers,
//! with a connection that goes, and the sweep that gives watchers behind
//! their keys' newest lines ([`LoopWatches`], around `watchers.rs`'s
//! [`Fanout`] and [`WatchQueue`]).
//!
//! Owns: the loop's [`Fanout`] (per watched key its newest line and its
//! watching connections) and the loop's index (what it tells the owner in
//! `Inbound::Watching`). What it needs of the loop's connections (each
//! one's [`WatchQueue`], its output's room, a write, the batch for the
//! owner, the counts) is a trait, [`WatchConns`]: `threads/io_loop.rs`
//! implements it over its slab of sockets, the simulation
//! (`tests/simulation.rs`) over in-memory connections. So the simulation
//! runs the loop's watch glue, not a copy of it.
//!
//! Runs on an I/O loop's thread (or the simulation's).
//!
//! Never does: I/O, read a clock (the time of a change is passed in, for
//! the pace), or decide a watch's rules (`WatchQueue` does).

use crate::protocol::{Answer, Key, Op, Reason, Request};
use crate::server::core::events::ConnId;
use crate::server::core::events::Inbound;
use crate::server::core::watchers::{Delivery, Fanout, Swept, WATCH_ROOM, WatchQueue, WatchStep};

/// What the watch glue needs of its loop's connections, by slot.
pub trait WatchConns {
    /// Connection `slot`'s watches, if it has a queue.
    fn queue(&mut self, slot: usize) -> Option<&mut WatchQueue>;
    /// Connection `slot`'s watches, a queue made if it has none.
    fn queue_or_new(&mut self, slot: usize) -> &mut WatchQueue;
    /// Take connection `slot`'s queue away (it goes).
    fn take_queue(&mut self, slot: usize) -> Option<Box<WatchQueue>>;
    /// The slots of the connections that have a queue, in slot order.
    fn with_queues(&self) -> Vec<usize>;
    /// Connection `slot`'s unsent output, in bytes (`None`: no such
    /// connection).
    fn unsent(&self, slot: usize) -> Option<usize>;
    /// Write `line` (a whole change line) on connection `slot`.
    fn write_line(&mut self, slot: usize, line: &[u8]);
    /// Write `answer` on connection `slot` (an `M` that ends a watch).
    fn write_answer(&mut self, slot: usize, answer: &Answer);
    /// Put `inbound` in the loop's next batch for the owner, behind what
    /// is there.
    fn to_owner(&mut self, inbound: Inbound);
    /// A connection started (`true`) or stopped watching a key: the
    /// node's count of watches.
    fn counted_watch(&mut self, _on: bool) {}
    /// Change lines written to watchers, and the states they skipped.
    fn counted_lines(&mut self, _written: u64, _skipped: u64) {}
}

/// Whether `answer` is about a watch (`W`, `X`, or an `M` for either):
/// the answers [`LoopWatches::answer`] acts on. The loop (and the
/// simulation) ask this before handing an answer over, so an acquire's
/// answer costs one match.
#[inline]
pub fn about_watch(answer: &Answer) -> bool {
    matches!(
        answer,
        Answer::Watched { .. }
            | Answer::Unwatched { .. }
            | Answer::Moved {
                op: Op::Watch | Op::Unwatch,
                ..
            }
    )
}

/// One I/O loop's watches: its fan-out and the glue around it.
#[derive(Debug, Default)]
pub struct LoopWatches {
    fanout: Fanout,
    /// The loop's index (`Inbound::Watching`).
    worker: usize,
}

impl LoopWatches {
    /// The watches of I/O loop `worker`.
    pub fn new(worker: usize) -> LoopWatches {
        LoopWatches {
            fanout: Fanout::default(),
            worker,
        }
    }

    /// The loop's fan-out (what the pace and a draining connection read).
    pub fn fanout(&self) -> &Fanout {
        &self.fanout
    }

    /// `W <key>` parsed on connection `slot` (`id`): forwarded, the owner
    /// told first if the connection is the loop's first watcher of the
    /// key; or refused past `max` watches (`--max-watches`).
    pub fn parsed_watch(
        &mut self,
        conns: &mut impl WatchConns,
        slot: usize,
        id: ConnId,
        key: Key,
        max: usize,
    ) {
        match conns.queue_or_new(slot).watch(&key, max) {
            WatchStep::Forward { new_watcher } => {
                if new_watcher {
                    self.add_watcher(conns, slot, &key);
                }
                conns.to_owner(Inbound::Request(id, Request::Watch { key }));
            }
            WatchStep::TooMany | WatchStep::Unwatched { .. } => {
                let reason = Reason::TooManyWatches;
                conns.to_owner(Inbound::Refused(id, Op::Watch, Some(key), reason));
            }
        }
    }

    /// `X <key>` parsed on connection `slot` (`id`): no more change lines
    /// for it; the owner is told after the `X` if that was the loop's last
    /// watcher of the key.
    pub fn parsed_unwatch(
        &mut self,
        conns: &mut impl WatchConns,
        slot: usize,
        id: ConnId,
        key: Key,
    ) {
        let was_watcher = conns.queue(slot).is_some_and(|queue| {
            matches!(
                queue.unwatch(&key),
                WatchStep::Unwatched { was_watcher: true }
            )
        });
        conns.to_owner(Inbound::Request(id, Request::Unwatch { key: key.clone() }));
        if was_watcher {
            self.remove_watcher(conns, slot, &key);
        }
    }

    /// Connection `slot` goes (closing, forgotten, freed): its watches
    /// end, in key order.
    pub fn drop_watches(&mut self, conns: &mut impl WatchConns, slot: usize) {
        let Some(mut queue) = conns.take_queue(slot) else {
            return;
        };
        for key in queue.close() {
            self.remove_watcher(conns, slot, &key);
        }
    }

    /// An entry the owner addressed to this loop's watchers: a change of
    /// a watched key (its newest state, swept out by [`LoopWatches::sweep`];
    /// `now_us` is read only then, for the pace), or (`M <active> W -`)
    /// the end of every live watch as the node stops being active: each
    /// connection, in slot order, is written `M <active> W <key>` for each
    /// of its live watches, in key order.
    pub fn watchers_entry(
        &mut self,
        conns: &mut impl WatchConns,
        answer: &Answer,
        now_us: impl FnOnce() -> u64,
    ) {
        match answer {
            Answer::Watched { key, .. } => {
                self.fanout
                    .change(key, now_us(), |line| answer.write_to(line));
            }
            Answer::Moved { active, .. } => {
                for slot in conns.with_queues() {
                    let Some(queue) = conns.queue(slot) else {
                        continue;
                    };
                    for key in queue.end_live() {
                        let moved = Answer::Moved {
                            active: active.clone(),
                            op: Op::Watch,
                            key: Some(key.clone()),
                        };
                        conns.write_answer(slot, &moved);
                        self.remove_watcher(conns, slot, &key);
                    }
                }
            }
            _ => {}
        }
    }

    /// An answer on its way to connection `slot` (written after this):
    /// one about a watch ([`about_watch`]) moves its queue on; any other
    /// does nothing.
    pub fn answer(&mut self, conns: &mut impl WatchConns, slot: usize, answer: &Answer) {
        let Some(queue) = conns.queue(slot) else {
            return;
        };
        match answer {
            Answer::Watched { key, .. } => {
                queue.answered_watch(key, self.fanout.version(key));
                conns.counted_lines(1, 0);
            }
            // An `X` is answered `M` by a node that is not active (it
            // stepped back while the `X` was on its way): answered all the
            // same. Left in flight, it would keep a later `W` of the key
            // on this connection from ever going live (no change line, and
            // no `M` when the node next stops being active).
            Answer::Unwatched { key }
            | Answer::Moved {
                op: Op::Unwatch,
                key: Some(key),
                ..
            } => queue.answered_unwatch(key),
            Answer::Moved {
                op: Op::Watch,
                key: Some(key),
                ..
            } if queue.moved_watch(key) => self.remove_watcher(conns, slot, key),
            _ => {}
        }
    }

    /// Give watchers behind their key's newest line, at most `max_lines`
    /// lines and `max_looks` watchers looked at (see [`Fanout::sweep`]);
    /// a connection whose output holds [`WATCH_ROOM`] bytes or more is
    /// passed by (its watch is stalled: it gets the newest line once its
    /// output drains).
    pub fn sweep(
        &mut self,
        conns: &mut impl WatchConns,
        max_lines: usize,
        max_looks: usize,
    ) -> Swept {
        let mut skipped = 0;
        let swept = self
            .fanout
            .sweep(max_lines, max_looks, |slot, key, version, line| {
                let Some(unsent) = conns.unsent(slot) else {
                    return false;
                };
                let has_room = unsent < WATCH_ROOM;
                let Some(queue) = conns.queue(slot) else {
                    return false;
                };
                let Delivery::Write { skipped: s } = queue.offer(key, version, has_room) else {
                    return false;
                };
                skipped += s;
                conns.write_line(slot, line);
                true
            });
        if swept.lines > 0 || skipped > 0 {
            conns.counted_lines(swept.lines as u64, skipped);
        }
        swept
    }

    /// Connection `slot` watches `key` now.
    fn add_watcher(&mut self, conns: &mut impl WatchConns, slot: usize, key: &Key) {
        if self.fanout.add(key, slot) {
            conns.to_owner(Inbound::Watching {
                worker: self.worker,
                key: key.clone(),
                on: true,
            });
        }
        conns.counted_watch(true);
    }

    /// Connection `slot` no longer watches `key`.
    fn remove_watcher(&mut self, conns: &mut impl WatchConns, slot: usize, key: &Key) {
        let Some(last) = self.fanout.remove(key, slot) else {
            return;
        };
        conns.counted_watch(false);
        if last {
            conns.to_owner(Inbound::Watching {
                worker: self.worker,
                key: key.clone(),
                on: false,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::WatchState;
    use std::collections::BTreeMap;

    fn key(k: &str) -> Key {
        Key::new(k.as_bytes()).expect("valid key")
    }

    /// Connections in memory: their queues, what was written to each (as
    /// text), what went to the owner, the count of watches.
    #[derive(Default)]
    struct Conns {
        queues: BTreeMap<usize, Box<WatchQueue>>,
        written: BTreeMap<usize, String>,
        unsent: BTreeMap<usize, usize>,
        batch: Vec<Inbound>,
        watches: i64,
    }

    impl WatchConns for Conns {
        fn queue(&mut self, slot: usize) -> Option<&mut WatchQueue> {
            self.queues.get_mut(&slot).map(|q| &mut **q)
        }
        fn queue_or_new(&mut self, slot: usize) -> &mut WatchQueue {
            self.queues.entry(slot).or_default()
        }
        fn take_queue(&mut self, slot: usize) -> Option<Box<WatchQueue>> {
            self.queues.remove(&slot)
        }
        fn with_queues(&self) -> Vec<usize> {
            self.queues.keys().copied().collect()
        }
        fn unsent(&self, slot: usize) -> Option<usize> {
            Some(self.unsent.get(&slot).copied().unwrap_or(0))
        }
        fn write_line(&mut self, slot: usize, line: &[u8]) {
            let text = std::str::from_utf8(line).expect("text");
            self.written.entry(slot).or_default().push_str(text);
        }
        fn write_answer(&mut self, slot: usize, answer: &Answer) {
            let mut line = Vec::new();
            answer.write_to(&mut line);
            self.write_line(slot, &line);
        }
        fn to_owner(&mut self, inbound: Inbound) {
            self.batch.push(inbound);
        }
        fn counted_watch(&mut self, on: bool) {
            self.watches += if on { 1 } else { -1 };
        }
    }

    fn watched(k: &str, token: u64) -> Answer {
        Answer::Watched {
            key: key(k),
            state: WatchState {
                token,
                holders: u64::from(token > 0),
                ..WatchState::default()
            },
        }
    }

    /// Connection `slot` watches `keys` (in that order), each answered.
    fn watch(w: &mut LoopWatches, conns: &mut Conns, slot: usize, keys: &[&str]) {
        for k in keys {
            w.parsed_watch(conns, slot, ConnId::new(0, slot, 1), key(k), 64);
            w.answer(conns, slot, &watched(k, 0));
        }
    }

    /// Which keys the owner was told of, in order, with `on`.
    fn interest(batch: &[Inbound]) -> Vec<(String, bool)> {
        batch
            .iter()
            .filter_map(|i| match i {
                Inbound::Watching { key, on, .. } => Some((key.to_string(), *on)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn watches_ended_by_a_role_change_or_a_close_go_in_key_order_whatever_the_hash() {
        // The order of the `M` lines and of the interest messages follows
        // from what happened, never from a HashMap's seed: the same input
        // gives the same output, run after run (the simulation replays a
        // seed exactly on it). Keys enough that a hash order would differ.
        let names: Vec<String> = (0..32).rev().map(|i| format!("k{i:02}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        let mut w = LoopWatches::new(3);
        let mut conns = Conns::default();
        watch(&mut w, &mut conns, 5, &names);
        watch(&mut w, &mut conns, 2, &names[..2]);
        assert_eq!(conns.watches, 34);
        conns.batch.clear();
        let moved = Answer::Moved {
            active: Some("b:1".into()),
            op: Op::Watch,
            key: None,
        };
        w.watchers_entry(&mut conns, &moved, || 0);
        let lines = |k: &[&str]| -> String { k.iter().map(|k| format!("M b:1 W {k}\n")).collect() };
        assert_eq!(conns.written[&2], lines(&[names[1], names[0]]));
        assert_eq!(conns.written[&5], lines(&sorted));
        // Slot 2 first (slot order), each connection's keys in order; the
        // owner hears a key's last watcher leave (slot 5's, for k30, k31).
        let told: Vec<(String, bool)> = sorted.iter().map(|k| (k.to_string(), false)).collect();
        assert_eq!(interest(&conns.batch), told);
        assert_eq!(conns.watches, 0);
        // A close ends them in key order too.
        let mut conns = Conns::default();
        watch(&mut w, &mut conns, 7, &names);
        conns.batch.clear();
        w.drop_watches(&mut conns, 7);
        assert_eq!(interest(&conns.batch), told);
        assert!(conns.queues.is_empty() && !w.fanout().is_watching());
    }

    #[test]
    fn the_first_watcher_tells_the_owner_before_its_w_and_the_last_after_its_x() {
        let mut w = LoopWatches::new(1);
        let mut conns = Conns::default();
        let id = |slot| ConnId::new(1, slot, 1);
        w.parsed_watch(&mut conns, 4, id(4), key("k"), 1);
        w.parsed_watch(&mut conns, 6, id(6), key("k"), 1);
        // Past --max-watches (1): refused, through the owner.
        w.parsed_watch(&mut conns, 6, id(6), key("j"), 1);
        w.parsed_unwatch(&mut conns, 4, id(4), key("k"));
        w.parsed_unwatch(&mut conns, 6, id(6), key("k"));
        let k = key("k");
        let watching = |on| Inbound::Watching {
            worker: 1,
            key: k.clone(),
            on,
        };
        let w_req = |slot| Inbound::Request(id(slot), Request::Watch { key: k.clone() });
        let x_req = |slot| Inbound::Request(id(slot), Request::Unwatch { key: k.clone() });
        let want = [
            watching(true),
            w_req(4),
            w_req(6),
            Inbound::Refused(id(6), Op::Watch, Some(key("j")), Reason::TooManyWatches),
            x_req(4),
            x_req(6),
            watching(false),
        ];
        assert_eq!(format!("{:?}", conns.batch), format!("{want:?}"));
    }

    #[test]
    fn an_unwatch_answered_moved_leaves_a_later_watch_of_the_key_live() {
        // The connection watches k, unwatches it, and the node steps back
        // before the owner takes the `X`: it is answered `M`. Once the
        // node is active again, the connection watches k anew: that watch
        // gets change lines, and ends with an `M` when the node next
        // stops being active (the simulation found it did neither).
        let mut w = LoopWatches::new(0);
        let mut conns = Conns::default();
        let id = ConnId::new(0, 1, 1);
        watch(&mut w, &mut conns, 1, &["k"]);
        w.parsed_unwatch(&mut conns, 1, id, key("k"));
        let stepped_back = |op| Answer::Moved {
            active: Some("b:1".into()),
            op,
            key: None,
        };
        w.watchers_entry(&mut conns, &stepped_back(Op::Watch), || 0);
        let x_moved = Answer::Moved {
            active: Some("b:1".into()),
            op: Op::Unwatch,
            key: Some(key("k")),
        };
        assert!(about_watch(&x_moved), "the loop hands it over");
        w.answer(&mut conns, 1, &x_moved);
        watch(&mut w, &mut conns, 1, &["k"]);
        conns.written.clear();
        w.watchers_entry(&mut conns, &watched("k", 7), || 0);
        w.sweep(&mut conns, usize::MAX, usize::MAX);
        assert_eq!(conns.written[&1], "W k 7 1 0 -\n");
        w.watchers_entry(&mut conns, &stepped_back(Op::Watch), || 0);
        assert_eq!(conns.written[&1], "W k 7 1 0 -\nM b:1 W k\n");
        assert_eq!(conns.watches, 0);
    }

    #[test]
    fn a_sweep_gives_each_live_watcher_the_newest_line_and_passes_a_full_output_by() {
        let mut w = LoopWatches::new(0);
        let mut conns = Conns::default();
        watch(&mut w, &mut conns, 1, &["k"]);
        watch(&mut w, &mut conns, 2, &["k"]);
        conns.unsent.insert(2, WATCH_ROOM);
        w.watchers_entry(&mut conns, &watched("k", 7), || 0);
        w.watchers_entry(&mut conns, &watched("k", 9), || 1);
        let swept = w.sweep(&mut conns, usize::MAX, usize::MAX);
        assert_eq!(swept.lines, 1);
        assert_eq!(conns.written[&1], "W k 9 1 0 -\n");
        assert!(!conns.written.contains_key(&2), "its output is full");
        assert!(conns.queues[&2].has_stalled());
    }
}
