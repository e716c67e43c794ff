//! Watches in the cluster simulation: a node's I/O loop's side of them
//! ([`LoopSide`]: the node's own watch glue, `core/loop_watches.rs`, which
//! `threads/io_loop.rs` runs too, over in-memory connections whose output
//! is bounded by [`ROOM`] and drains only when the watcher reads), and the
//! rule a watcher's lines must keep ([`WatchCheck`]). Runs on the simulation's
//! thread; decides nothing the node decides.
//!
//! The rule, for one watcher of one key. A *session* is the lines one node
//! sends on one connection from its `W` answer until the watch ends (an
//! `M <active> W <key>`, an `X`, the connection's end); the watcher then
//! watches again, on the node active now, as the client library does.
//!
//! - **Within a session** (what one serving node promises, always, a split
//!   brain included): the line's token is 0 exactly when it shows no
//!   holder, and its holders are at most the key's limit. A line shows the
//!   largest token holding the key (its *top*) and how many hold it. A
//!   node grants only new tokens, above every token it holds, and a grant
//!   that left never comes back; so a grant holding now whose token is at
//!   most the largest an earlier line had shown (that line's *max*) held
//!   at that line too. Hence for each earlier line whose max is at least
//!   this line's top: the top held then (it is at most that line's top),
//!   and the holders now, all at or below it, are at most that line's
//!   holders, one fewer if that line's top has left since (it is above
//!   this one). A top above every earlier max is a new grant. For a mutex
//!   that is: each new holder's token is above every earlier one, the same
//!   grant may be shown again (a second `W`), and a grant once replaced or
//!   freed never comes back. It holds however many states the watcher
//!   skips (a loop gives a slow watcher only the newest, as the
//!   simulation's slow watchers are given; one step of the node is one
//!   line however many grants it made), so it asks no more than the node
//!   promises.
//! - **Across sessions** (a re-watch after a failover or a hand-over): the
//!   new active's first line may show an older holder than the old
//!   active's last line, or none, when a grant or a release was lost (made
//!   just before the failover and never replicated, docs/cluster.md). What
//!   still holds is the fencing order: *no line shows a token below one the
//!   watcher was shown before and granted after it*. So a watcher that saw
//!   a lost grant sees only higher tokens from the next grant on. The
//!   simulation knows the order in which every token was granted, which
//!   tells an older holder (allowed) from a newer, lower one (a fencing
//!   failure); a token never granted at all is refused too.
//! - **The scope of the second rule**: it is promised while one node at a
//!   time serves. While two do (a partition, or an active paused long
//!   enough to be replaced, then resumed), each grants from its own
//!   counter: a watcher of each side sees that side's holders, and after
//!   the heal the survivor's holders granted during the split may be below
//!   the tokens the other side showed, granted later (the survivor goes
//!   above them only from the heartbeat in which it hears that side). So
//!   the order across sessions is forgotten at a split brain: a line shown
//!   while two nodes serve, or before, is not compared with later ones, and
//!   the rule starts afresh from the next line shown while one node serves
//!   (the caller says which lines those are: [`WatchCheck::line`]'s
//!   `epoch`). The first rule still applies to every session.

use std::collections::{BTreeMap, VecDeque};

use baton::protocol::{Answer, Parsed, WatchState, parse_answer};
use baton::server::core::loop_watches::{LoopWatches, WatchConns};
use baton::server::core::watchers::WatchQueue;
use baton::server::messages::Inbound;

/// `--max-watches` of the simulated loops (the default).
pub const MAX_WATCHES: usize = 1024;

/// Unsent bytes at which a simulated watcher's output is full (the
/// server's is `WATCH_ROOM`, 64 KiB): a few lines, so that a watcher that
/// does not read for a while fills it and its watches stall.
pub const ROOM: usize = 128;

/// One node's I/O loop as far as watches go: the node's own watch glue
/// (`LoopWatches`, core/loop_watches.rs, which `threads/io_loop.rs` runs)
/// and, by connection id (the simulation's ids are small: a connection's
/// id is its slot), the queues of its connections that watch and what it
/// wrote on each that the watcher has not read (its unsent output).
pub struct LoopSide {
    pub watches: LoopWatches,
    queues: BTreeMap<usize, Box<WatchQueue>>,
    outputs: BTreeMap<usize, Output>,
}

/// What the loop wrote on one connection that its watcher has not read:
/// the lines, in order, and their bytes.
#[derive(Default)]
struct Output {
    lines: VecDeque<Answer>,
    bytes: usize,
}

impl Default for LoopSide {
    fn default() -> LoopSide {
        LoopSide {
            watches: LoopWatches::new(0).with_room(ROOM),
            queues: BTreeMap::new(),
            outputs: BTreeMap::new(),
        }
    }
}

impl LoopSide {
    /// Connection `conn` has a queue (its watch answers are looked at).
    pub fn has(&self, conn: u64) -> bool {
        self.queues.contains_key(&slot(conn))
    }

    /// The glue and the connections as it sees them: `batch`, the loop's
    /// next batch for the owner.
    pub fn parts<'a>(
        &'a mut self,
        batch: &'a mut Vec<Inbound>,
    ) -> (&'a mut LoopWatches, SimConns<'a>) {
        let conns = SimConns {
            queues: &mut self.queues,
            outputs: &mut self.outputs,
            batch,
        };
        (&mut self.watches, conns)
    }

    /// The loop writes `answer` on connection `conn` (an answer about a
    /// watch, as io_loop.rs `apply_owner_batch` does after
    /// `LoopWatches::answer`).
    pub fn write(&mut self, batch: &mut Vec<Inbound>, conn: u64, answer: &Answer) {
        let (_, mut conns) = self.parts(batch);
        conns.write_answer(slot(conn), answer);
    }

    /// The sweep, as the loop runs it (whole here: the simulation does not
    /// pace it); how many connections' watches it stalled (none were
    /// before: their outputs were full).
    pub fn sweep(&mut self, batch: &mut Vec<Inbound>) -> u64 {
        let stalled_before = self.stalled();
        let (watches, mut conns) = self.parts(batch);
        watches.sweep(&mut conns, usize::MAX, usize::MAX);
        let stalled = self.stalled();
        stalled
            .iter()
            .filter(|s| !stalled_before.contains(s))
            .count() as u64
    }

    /// The connections with a stalled watch, in slot order.
    fn stalled(&self) -> Vec<usize> {
        let stalled = self.queues.iter().filter(|(_, q)| q.has_stalled());
        stalled.map(|(&slot, _)| slot).collect()
    }

    /// The watcher of connection `conn` reads everything written on it.
    /// As its output drains, the loop gives its stalled watches their keys'
    /// newest lines (`LoopWatches::drained`, as io_loop.rs does in a
    /// flush), and the watcher reads those too, until none is left. The
    /// lines read, in order, and how many of them the drains wrote.
    pub fn read(&mut self, batch: &mut Vec<Inbound>, conn: u64) -> (Vec<Answer>, u64) {
        let at = slot(conn);
        let mut lines = Vec::new();
        if let Some(output) = self.outputs.remove(&at) {
            lines.extend(output.lines);
        }
        let mut drained = 0;
        while self.queues.get(&at).is_some_and(|q| q.has_stalled()) {
            let (watches, mut conns) = self.parts(batch);
            watches.drained(&mut conns, at);
            let Some(output) = self.outputs.remove(&at) else {
                break;
            };
            drained += output.lines.len() as u64;
            lines.extend(output.lines);
        }
        (lines, drained)
    }

    /// Connection `conn` is gone: what it had not read goes with it.
    pub fn forget(&mut self, conn: u64) {
        self.outputs.remove(&slot(conn));
    }
}

/// A connection's id as the loop's slot.
pub fn slot(conn: u64) -> usize {
    conn as usize
}

/// The simulated loop's connections (`WatchConns`): their queues, their
/// unsent outputs (the bytes written on each that its watcher has not
/// read: [`LoopSide::read`]), the batch for the owner.
pub struct SimConns<'a> {
    queues: &'a mut BTreeMap<usize, Box<WatchQueue>>,
    outputs: &'a mut BTreeMap<usize, Output>,
    batch: &'a mut Vec<Inbound>,
}

impl SimConns<'_> {
    fn push(&mut self, slot: usize, answer: Answer, bytes: usize) {
        let output = self.outputs.entry(slot).or_default();
        output.lines.push_back(answer);
        output.bytes += bytes;
    }
}

impl WatchConns for SimConns<'_> {
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
        let bytes = self.outputs.get(&slot).map_or(0, |o| o.bytes);
        self.queues.contains_key(&slot).then_some(bytes)
    }

    fn write_line(&mut self, slot: usize, line: &[u8]) {
        match parse_answer(line) {
            Parsed::Line {
                used,
                result: Ok(answer),
            } if used == line.len() => self.push(slot, answer, line.len()),
            other => panic!("a change line that does not parse back: {other:?}"),
        }
    }

    fn write_answer(&mut self, slot: usize, answer: &Answer) {
        let mut line = Vec::new();
        answer.write_to(&mut line);
        self.push(slot, answer.clone(), line.len());
    }

    fn to_owner(&mut self, inbound: Inbound) {
        self.batch.push(inbound);
    }
}

/// One line of a session: its top, its holders, and the largest token
/// shown up to it (its max).
#[derive(Clone, Copy, Debug)]
struct Line {
    top: u64,
    holders: u64,
    max: u64,
}

/// The lines one node has sent since the watch's `W` answer.
#[derive(Debug)]
struct Session {
    node: usize,
    /// The lines that still bound the next: a line whose max is at least a
    /// later line's top is implied by that later line and dropped, so
    /// each line's top is above the max of the one before it.
    lines: Vec<Line>,
    /// The largest token shown in the session.
    max: u64,
    last: WatchState,
}

/// What one watcher has been shown of one key, and the rules its next line
/// must keep (see the module doc).
#[derive(Debug)]
pub struct WatchCheck {
    limit: u64,
    session: Option<Session>,
    /// The largest token shown since the order across sessions was last
    /// forgotten: the token, its place in the order of grants, the node
    /// whose line showed it.
    top: Option<(u64, u64, usize)>,
    /// The split-brain epoch `top` was shown in (`None`: while two nodes
    /// served, so the next line starts afresh).
    epoch: Option<u64>,
    /// Lines compared with a token shown by another node.
    pub compared_across: u64,
    /// Of those, lines whose token was below it: an older holder or none
    /// after a move (a lost grant or release; granted before it, allowed).
    pub lower_after_move: u64,
}

impl WatchCheck {
    /// A watcher of a key of this limit (1: a mutex).
    pub fn new(limit: u32) -> WatchCheck {
        WatchCheck {
            limit: u64::from(limit),
            session: None,
            top: None,
            epoch: None,
            compared_across: 0,
            lower_after_move: 0,
        }
    }

    /// The watch ended (its node's `M`, an `X`, the connection's end).
    pub fn end(&mut self) {
        self.session = None;
    }

    /// The live session's node and the last state it showed.
    pub fn last(&self) -> Option<(usize, &WatchState)> {
        self.session.as_ref().map(|s| (s.node, &s.last))
    }

    /// A line from `node` (the first one of a session is its `W` answer):
    /// `granted`, where its token stands in the order of grants (`None`:
    /// never granted); `epoch`, the split-brain epoch now (`None` while two
    /// nodes serve, or have in this step). Err says which rule it broke.
    pub fn line(
        &mut self,
        node: usize,
        state: &WatchState,
        granted: Option<u64>,
        epoch: Option<u64>,
    ) -> Result<(), String> {
        let (t, h) = (state.token, state.holders);
        if (t == 0) != (h == 0) || h > self.limit {
            return Err(format!("token {t} with {h} holders (limit {})", self.limit));
        }
        let session = self.session.get_or_insert_with(|| Session {
            node,
            lines: Vec::new(),
            max: 0,
            last: WatchState::default(),
        });
        if session.node != node {
            return Err(format!(
                "a line from node {node} in a session of node {}",
                session.node
            ));
        }
        session_rule(session, t, h).map_err(|why| format!("within the session: {why}"))?;
        session.last = state.clone();
        self.fencing_rule(node, t, granted, epoch)
            .map_err(|why| format!("across sessions: {why}"))
    }

    fn fencing_rule(
        &mut self,
        node: usize,
        t: u64,
        granted: Option<u64>,
        epoch: Option<u64>,
    ) -> Result<(), String> {
        if epoch.is_none() || epoch != self.epoch {
            self.top = None;
        }
        self.epoch = epoch;
        if let Some((top, _, top_node)) = self.top
            && top_node != node
        {
            self.compared_across += 1;
            if t < top {
                self.lower_after_move += 1;
            }
        }
        if t == 0 {
            return Ok(());
        }
        let Some(order) = granted else {
            return Err(format!("token {t} was never granted"));
        };
        match self.top {
            Some((top, top_order, top_node)) if t < top && order > top_order => Err(format!(
                "token {t} was granted after {top} (shown by node {top_node}) and is below it"
            )),
            Some((top, ..)) if t <= top => Ok(()),
            _ => {
                self.top = Some((t, order, node));
                Ok(())
            }
        }
    }
}

/// The rule within a session (module doc): top `t` with `h` holders,
/// against each earlier line whose max is at least `t` (the last ones).
fn session_rule(session: &mut Session, t: u64, h: u64) -> Result<(), String> {
    while let Some(&then) = session.lines.last()
        && then.max >= t
    {
        if t > then.top {
            return Err(format!(
                "top {t} did not hold at a line of top {} though tokens up to {} were granted",
                then.top, then.max
            ));
        }
        let left = u64::from(t < then.top);
        if h + left > then.holders {
            return Err(format!(
                "{h} holders at top {t}, after a line of {} holders at top {}",
                then.holders, then.top
            ));
        }
        session.lines.pop();
    }
    session.max = session.max.max(t);
    session.lines.push(Line {
        top: t,
        holders: h,
        max: session.max,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(token: u64, holders: u64) -> WatchState {
        WatchState {
            token,
            holders,
            ..WatchState::default()
        }
    }

    /// Lines of one session of node 0, each token granted in the order of
    /// its value (as one node grants them), outside any split brain.
    fn session(limit: u32, lines: &[(u64, u64)]) -> Result<(), String> {
        let mut check = WatchCheck::new(limit);
        lines
            .iter()
            .try_for_each(|&(t, h)| check.line(0, &st(t, h), Some(t), Some(0)))
    }

    #[test]
    fn a_mutex_session_takes_new_holders_above_and_the_same_grant_again() {
        session(
            1,
            &[(0, 0), (10, 1), (10, 1), (0, 0), (20, 1), (30, 1), (0, 0)],
        )
        .expect("valid");
    }

    #[test]
    fn a_mutex_session_refuses_a_lower_holder_and_a_freed_one_back() {
        for bad in [
            vec![(10, 1), (8, 1)],
            vec![(10, 1), (0, 0), (10, 1)],
            vec![(10, 1), (20, 1), (10, 1)],
            vec![(10, 1), (20, 1), (0, 0), (15, 1)],
            vec![(10, 2)],
            vec![(10, 0)],
            vec![(0, 1)],
        ] {
            assert!(session(1, &bad).is_err(), "{bad:?} passed");
        }
    }

    #[test]
    fn a_semaphore_session_shows_older_holders_as_the_newer_ones_leave() {
        // 5 and 8 hold (5 never the top shown); 8 leaves: 5 shows; 12
        // comes and goes; 5 leaves.
        session(3, &[(8, 2), (5, 1), (12, 2), (5, 1), (0, 0)]).expect("valid");
        // Older holders one by one as the newer leave, then a new grant.
        session(3, &[(8, 3), (5, 2), (3, 1), (9, 2)]).expect("valid");
        // 9 was granted and 5 left in states skipped between the lines: 9
        // and 12 held, then 12 left.
        session(3, &[(5, 1), (12, 2), (9, 1)]).expect("valid");
    }

    #[test]
    fn a_semaphore_session_refuses_a_grant_back_and_holders_that_do_not_shrink() {
        for bad in [
            // The top left, yet as many hold.
            vec![(8, 2), (5, 2)],
            // 8 left (5 showed): it cannot come back.
            vec![(8, 2), (5, 1), (8, 2)],
            // 10 did not hold when 9 alone did, and had been granted.
            vec![(5, 1), (12, 2), (9, 1), (10, 1)],
            // The same top with more holders: a new grant would be the top.
            vec![(8, 1), (8, 2)],
            // Seen free: nothing older comes back.
            vec![(8, 2), (0, 0), (5, 1)],
            // 12 alone holds: 5 left, it cannot come back.
            vec![(5, 1), (12, 2), (12, 1), (5, 1)],
            // 4 held alone below 10 and 12: once they left, nothing else.
            vec![(4, 1), (10, 3), (12, 3), (4, 1), (3, 1)],
            vec![(10, 4)],
        ] {
            assert!(session(3, &bad).is_err(), "{bad:?} passed");
        }
    }

    #[test]
    fn after_a_move_an_older_holder_or_none_is_allowed_and_a_newer_lower_token_is_not() {
        // Node 0 showed 10 (granted 2nd); node 1's state lost it: its first
        // line shows 8 (granted 1st) or none, then a grant above.
        for first in [(8, 1), (0, 0)] {
            let mut check = WatchCheck::new(1);
            check.line(0, &st(10, 1), Some(2), Some(0)).expect("first");
            check.end();
            let granted = (first.0 == 8).then_some(1);
            check
                .line(1, &st(first.0, first.1), granted, Some(0))
                .expect("an older holder or none");
            check.line(1, &st(0, 0), None, Some(0)).expect("freed");
            check.line(1, &st(30, 1), Some(3), Some(0)).expect("above");
            // Its first two lines were below 10 (shown by node 0).
            assert_eq!((check.compared_across, check.lower_after_move), (3, 2));
        }
        // Node 1 shows 8 granted after node 0's 10: the fencing order broke.
        let mut check = WatchCheck::new(1);
        check.line(0, &st(10, 1), Some(2), Some(0)).expect("first");
        check.end();
        let err = check.line(1, &st(8, 1), Some(3), Some(0)).unwrap_err();
        assert!(err.contains("granted after 10"), "{err}");
        // And a token nobody granted.
        let mut check = WatchCheck::new(1);
        assert!(check.line(0, &st(8, 1), None, Some(0)).is_err());
    }

    #[test]
    fn a_split_brain_forgets_the_order_across_sessions_but_not_within_one() {
        // 20 shown while two nodes served (epoch None): a later, lower
        // token on another node is not compared with it.
        let mut check = WatchCheck::new(1);
        check.line(1, &st(20, 1), Some(1), None).expect("split");
        check.end();
        check
            .line(0, &st(8, 1), Some(2), Some(3))
            .expect("forgotten");
        // Nor across an epoch: 30 was shown before the split (epoch 3),
        // the next line is in epoch 4.
        check.line(0, &st(30, 1), Some(3), Some(3)).expect("above");
        check.end();
        check
            .line(1, &st(25, 1), Some(4), Some(4))
            .expect("a new epoch");
        // Within one session the rule holds, split or not.
        assert!(check.line(1, &st(24, 1), Some(5), None).is_err());
    }
}
