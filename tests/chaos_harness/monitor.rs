//! The monitor of a chaos run: one thread asks every node `I` every few
//! milliseconds and keeps what it saw as [`Sample`]s.
//!
//! Owns: one plain TCP connection per node (at most one `I` in flight on
//! each, so a stopped node's late answer is never confused with a fresh
//! one), the samples, and the convergence test ([`converged`]).
//!
//! Converged, precisely: every node the harness has running (started, not
//! stopped, not told to leave) answered an `I` sent in this round; the only
//! node that says `role=active` is the lowest-numbered running node, and it
//! says `state=active`; every other running node says `role=standby` and
//! names it as `active=`; and no fault action happened during the round.
//! Synced, in addition: the active counts every other running node as a
//! standby that holds its full state (`standbys=`), i.e. redundancy is back.
//!
//! Never does: block longer than one round ([`ROUND_BUDGET`]) on a silent
//! node, or run past its stop flag; every loop is bounded by count too.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::cluster::{NODES, Shared, Status};

/// Time between the starts of two rounds.
pub const POLL_EVERY: Duration = Duration::from_millis(5);
/// Longest a round waits for answers.
pub const ROUND_BUDGET: Duration = Duration::from_millis(25);
/// An `I` left unanswered this long: the connection is dropped.
const GIVE_UP: Duration = Duration::from_secs(2);
/// Rounds at most (a 600 s run at 5 ms needs 120,000).
const MAX_ROUNDS: usize = 2_000_000;

/// What one node said in one round.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// It answered, to an `I` sent in this round.
    pub fresh: bool,
    /// It answered at all in this round (maybe to an older `I`).
    pub answered: bool,
    /// `role=active`.
    pub active_role: bool,
    /// `role=active state=active`: it serves clients.
    pub serving: bool,
    /// `role=standby`.
    pub standby: bool,
    /// The node named by `active=` (index), if any.
    pub follows: Option<u8>,
    /// `standbys=`.
    pub standbys: u8,
}

/// One round of polling.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// When the round ended (every answer was read before this).
    pub at: Instant,
    /// The fault epoch at the end of the round.
    pub epoch: u64,
    pub nodes: [Seen; NODES],
    pub status: [Status; NODES],
    pub level: Level,
}

/// How far a round's view has converged (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    NotConverged,
    /// One active, the first running node; the others follow it.
    Converged,
    /// And it counts every other running node as a synced standby.
    Synced,
}

impl Sample {
    pub fn serving(&self) -> bool {
        self.nodes.iter().any(|n| n.serving)
    }

    /// A compact view of the round, for timelines: per node `A2` (serving,
    /// 2 synced standbys), `H` (handing off), `S0` (standby of node 0), `S-`
    /// (standby of no known active), `?` (some other answer) or `.` (no
    /// answer this round); then what the harness has done to each node
    /// (`R`unning, `S`topped, `L`eaving, `D`own).
    pub fn view(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| match *n {
                Seen {
                    answered: false, ..
                } => ".".to_string(),
                Seen {
                    serving: true,
                    standbys,
                    ..
                } => format!("A{standbys}"),
                Seen {
                    active_role: true, ..
                } => "H".to_string(),
                Seen {
                    standby: true,
                    follows,
                    ..
                } => {
                    format!("S{}", follows.map_or("-".to_string(), |f| f.to_string()))
                }
                _ => "?".to_string(),
            })
            .collect();
        let status: String = self
            .status
            .iter()
            .map(|s| match s {
                Status::Running => 'R',
                Status::Stopped => 'S',
                Status::Leaving => 'L',
                Status::Down => 'D',
            })
            .collect();
        let level = match self.level {
            Level::NotConverged => "",
            Level::Converged => " converged",
            Level::Synced => " converged+synced",
        };
        format!("{:<12} {status}{level}", nodes.join(" "))
    }
}

/// The rounds whose view differs from the round before: (end, view).
pub fn timeline(samples: &[Sample]) -> Vec<(Instant, String)> {
    let mut lines = Vec::new();
    let mut last = String::new();
    for s in samples {
        let view = s.view();
        if view != last {
            lines.push((s.at, view.clone()));
            last = view;
        }
    }
    lines
}

/// How far a round's view has converged (see the module doc).
pub fn converged(nodes: &[Seen; NODES], status: &[Status; NODES], quiet: bool) -> Level {
    let running: Vec<usize> = (0..NODES)
        .filter(|&i| status[i] == Status::Running)
        .collect();
    let Some(&first) = running.first() else {
        return Level::NotConverged;
    };
    if !quiet || running.iter().any(|&i| !nodes[i].fresh) {
        return Level::NotConverged;
    }
    let leader = &nodes[first];
    let others_follow = running[1..].iter().all(|&i| {
        let n = &nodes[i];
        n.standby && !n.active_role && n.follows == Some(first as u8)
    });
    let no_other_active = (0..NODES).all(|i| i == first || !nodes[i].active_role);
    if !(leader.serving && others_follow && no_other_active) {
        Level::NotConverged
    } else if usize::from(leader.standbys) == running.len() - 1 {
        Level::Synced
    } else {
        Level::Converged
    }
}

/// What the monitor has seen so far.
#[derive(Default)]
pub struct Observed {
    pub samples: Vec<Sample>,
    /// The latest converged round's (epoch, end), and the latest synced one's.
    pub last_converged: Option<(u64, Instant)>,
    pub last_synced: Option<(u64, Instant)>,
}

struct Link {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    /// When the `I` in flight was sent.
    in_flight: Option<Instant>,
    buf: Vec<u8>,
    last_try: Option<Instant>,
}

impl Link {
    fn ensure_connected(&mut self) {
        if self.stream.is_some() {
            return;
        }
        if self
            .last_try
            .is_some_and(|t| t.elapsed() < Duration::from_millis(20))
        {
            return;
        }
        self.last_try = Some(Instant::now());
        if let Ok(stream) = TcpStream::connect_timeout(&self.addr, Duration::from_millis(20)) {
            let _ = stream.set_nodelay(true);
            self.stream = Some(stream);
            self.in_flight = None;
            self.buf.clear();
        }
    }

    fn drop_connection(&mut self) {
        self.stream = None;
        self.in_flight = None;
        self.buf.clear();
    }

    /// Send `I` if none is in flight; true if one was sent now.
    fn ask(&mut self) -> bool {
        if self.in_flight.is_some() {
            if self.in_flight.is_some_and(|t| t.elapsed() > GIVE_UP) {
                self.drop_connection();
            }
            return false;
        }
        let Some(stream) = self.stream.as_mut() else {
            return false;
        };
        if stream.write_all(b"I\n").is_err() {
            self.drop_connection();
            return false;
        }
        self.in_flight = Some(Instant::now());
        true
    }

    /// Read an answer line until `deadline`.
    fn read(&mut self, deadline: Instant) -> Option<String> {
        self.in_flight?;
        for _ in 0..64 {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                self.in_flight = None;
                return Some(String::from_utf8_lossy(&line).trim_end().to_string());
            }
            let stream = self.stream.as_mut()?;
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_micros(200));
            let _ = stream.set_read_timeout(Some(left));
            let mut chunk = [0u8; 1024];
            match stream.read(&mut chunk) {
                Ok(0) => {
                    self.drop_connection();
                    return None;
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return None;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    self.drop_connection();
                    return None;
                }
            }
            if Instant::now() >= deadline && !self.buf.contains(&b'\n') {
                return None;
            }
        }
        None
    }
}

/// Parse an `I` answer.
fn parse_info(line: &str, names: &[String]) -> Option<Seen> {
    let rest = line.strip_prefix("I ")?;
    let mut seen = Seen {
        answered: true,
        ..Seen::default()
    };
    let mut role = "";
    let mut state = "";
    for kv in rest.split(' ') {
        let Some((name, value)) = kv.split_once('=') else {
            continue;
        };
        match name {
            "role" => role = value,
            "state" => state = value,
            "active" => seen.follows = names.iter().position(|n| n == value).map(|i| i as u8),
            "standbys" => seen.standbys = value.parse().unwrap_or(0),
            _ => {}
        }
    }
    seen.active_role = role == "active";
    seen.serving = role == "active" && state == "active";
    seen.standby = role == "standby";
    Some(seen)
}

/// Poll every node until `stop` is set; publish samples into `observed`.
pub fn run(
    ports: [u16; NODES],
    names: Vec<String>,
    shared: Arc<Mutex<Shared>>,
    observed: Arc<Mutex<Observed>>,
    stop: Arc<AtomicBool>,
) {
    let mut links: Vec<Link> = ports
        .iter()
        .map(|&port| Link {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            stream: None,
            in_flight: None,
            buf: Vec::new(),
            last_try: None,
        })
        .collect();
    for _ in 0..MAX_ROUNDS {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let started = Instant::now();
        let epoch_before = shared.lock().epoch;
        let mut nodes = [Seen::default(); NODES];
        let mut sent_now = [false; NODES];
        for (i, link) in links.iter_mut().enumerate() {
            link.ensure_connected();
            sent_now[i] = link.ask();
        }
        let deadline = started + ROUND_BUDGET;
        for (i, link) in links.iter_mut().enumerate() {
            if let Some(line) = link.read(deadline)
                && let Some(mut seen) = parse_info(&line, &names)
            {
                seen.fresh = sent_now[i];
                nodes[i] = seen;
            }
        }
        let at = Instant::now();
        let (epoch, status) = {
            let shared = shared.lock();
            (shared.epoch, shared.status)
        };
        let quiet = epoch == epoch_before;
        let sample = Sample {
            at,
            epoch,
            nodes,
            status,
            level: converged(&nodes, &status, quiet),
        };
        {
            let mut observed = observed.lock();
            if sample.level >= Level::Converged {
                observed.last_converged = Some((epoch, at));
            }
            if sample.level == Level::Synced {
                observed.last_synced = Some((epoch, at));
            }
            observed.samples.push(sample);
        }
        let next = started + POLL_EVERY;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["a:1".into(), "b:2".into(), "c:3".into()]
    }

    fn seen(line: &str) -> Seen {
        let mut s = parse_info(line, &names()).expect("an I answer");
        s.fresh = true;
        s
    }

    #[test]
    fn one_active_first_node_with_synced_followers_is_converged() {
        let run = [Status::Running; NODES];
        let nodes = [
            seen("I role=active node=a:1 active=a:1 state=active standbys=2"),
            seen("I role=standby node=b:2 active=a:1 state=standby standbys=0"),
            seen("I role=standby node=c:3 active=a:1 state=standby standbys=0"),
        ];
        assert_eq!(converged(&nodes, &run, true), Level::Synced);
        assert_eq!(
            converged(&nodes, &run, false),
            Level::NotConverged,
            "a fault during the round"
        );
        let mut unsynced = nodes;
        unsynced[0].standbys = 1;
        assert_eq!(converged(&unsynced, &run, true), Level::Converged);
        let mut stale = nodes;
        stale[2].fresh = false;
        assert_eq!(converged(&stale, &run, true), Level::NotConverged);
    }

    #[test]
    fn a_lower_node_serving_while_the_first_is_back_is_not_converged() {
        let run = [Status::Running; NODES];
        let nodes = [
            seen("I role=standby node=a:1 active=b:2 state=standby standbys=0"),
            seen("I role=active node=b:2 active=b:2 state=active standbys=2"),
            seen("I role=standby node=c:3 active=b:2 state=standby standbys=0"),
        ];
        assert_eq!(converged(&nodes, &run, true), Level::NotConverged);
        let first_down = [Status::Down, Status::Running, Status::Running];
        let mut two = nodes;
        two[0] = Seen::default();
        two[1].standbys = 1;
        assert_eq!(converged(&two, &first_down, true), Level::Synced);
        let mut split = two;
        split[0] = seen("I role=active node=a:1 active=a:1 state=active standbys=0");
        split[0].fresh = false;
        assert_eq!(
            converged(&split, &first_down, true),
            Level::NotConverged,
            "two actives"
        );
    }
}
