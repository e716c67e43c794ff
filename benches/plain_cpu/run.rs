//! The interleaved schedule of the plain-client CPU run, and the servers
//! it measures.
//!
//! Owns: starting each server on a free 127.0.0.1 port and learning its
//! address (`batond` from its `listening on` log line; the minimal echo
//! from the line it prints), stopping each by its PID when dropped, the
//! placement (the load generator's thread on the first CPU this process
//! may use, every thread of every server on the others), and the rounds:
//! every system at every depth, in order, the order reversed every other
//! round, so that a slow spell of the machine falls on all of them alike.
//!
//! Never does: leave a server running (each is killed and reaped when its
//! `Server` drops, and the minimal echo also ends when the pipe to its
//! standard input closes), or listen anywhere but loopback.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::client::{self, Measured};
use crate::procstat;

/// How long a server may take to say where it listens.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A server process under measure.
pub struct Server {
    /// The name its rows carry.
    pub name: String,
    /// It answers every line with itself.
    pub echo: bool,
    /// Driven with the other pacing (`client::Spec::after_poll`).
    pub after_poll: bool,
    pub addr: SocketAddr,
    child: Child,
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `batond --bind 127.0.0.1 --port 0 FLAGS...`; its log (stderr) is
    /// read for its address, then drained by a thread of its own.
    pub fn batond(name: &str, path: &str, flags: &[String]) -> Result<Server, String> {
        let mut child = Command::new(path)
            .args(["--bind", "127.0.0.1", "--port", "0"])
            .args(flags)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{path}: {e}"))?;
        let log = child.stderr.take().expect("stderr is piped");
        let echo = flags.iter().any(|f| f == "--echo");
        Server::listening(name, echo, child, log)
    }

    /// A process (the minimal echo) that prints `listening on ADDR` on its
    /// standard output and ends when its standard input closes.
    pub fn listed(name: &str, mut command: Command) -> Result<Server, String> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("{name}: {e}"))?;
        let out = child.stdout.take().expect("stdout is piped");
        Server::listening(name, true, child, out)
    }

    fn listening(
        name: &str,
        echo: bool,
        child: Child,
        output: impl std::io::Read + Send + 'static,
    ) -> Result<Server, String> {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(output).lines() {
                let Ok(line) = line else { break };
                if !sent && let Some(addr) = listening_addr(&line) {
                    let _ = tx.send(addr);
                    sent = true;
                }
            }
        });
        // Dropped (and so killed) if it never says where it listens.
        let mut server = Server {
            name: name.to_string(),
            echo,
            after_poll: false,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            child,
        };
        server.addr = rx
            .recv_timeout(START_TIMEOUT)
            .map_err(|_| format!("{name} did not say where it listens"))?;
        Ok(server)
    }
}

/// How long a server may take to end after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

impl Drop for Server {
    /// SIGTERM (so that a profiler wrapped around a server writes its
    /// figures), then SIGKILL if it has not ended within `STOP_TIMEOUT`.
    fn drop(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: a plain signal to our own child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let deadline = std::time::Instant::now() + STOP_TIMEOUT;
            while std::time::Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address in a `... listening on 127.0.0.1:PORT ...` line.
pub fn listening_addr(line: &str) -> Option<SocketAddr> {
    let rest = &line[line.find("listening on ")? + "listening on ".len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// The run's settings.
#[derive(Clone, Debug)]
pub struct Options {
    pub conns: usize,
    pub depths: Vec<usize>,
    pub rounds: usize,
    pub warmup: Duration,
    pub measure: Duration,
    /// Load generator and servers on separate CPUs.
    pub split: bool,
    pub seed: u64,
    /// Wait this long before the first window (to attach a profiler to
    /// the servers, whose PIDs are known by then).
    pub pause: Duration,
}

/// One measured window.
#[derive(Clone, Debug)]
pub struct Sample {
    pub round: usize,
    /// Index into the systems.
    pub system: usize,
    pub depth: usize,
    pub measured: Measured,
}

/// The load generator's CPUs and the servers'.
pub type Placement = (Vec<usize>, Vec<usize>);

/// Where a split run puts the load generator and the servers: None when
/// not split, or on a machine with one CPU for this process.
pub fn placement(split: bool) -> Result<Option<Placement>, String> {
    if !split {
        return Ok(None);
    }
    let cpus = procstat::allowed_cpus().map_err(|e| format!("sched_getaffinity: {e}"))?;
    match cpus.split_first() {
        Some((&first, rest)) if !rest.is_empty() => Ok(Some((vec![first], rest.to_vec()))),
        _ => Ok(None),
    }
}

/// Every system at every depth, `rounds` times, the order reversed every
/// other round; `progress` hears of each window as it ends.
pub fn measure(
    systems: &[Server],
    options: &Options,
    mut progress: impl FnMut(&str),
) -> Result<Vec<Sample>, String> {
    let place = placement(options.split)?;
    if let Some((load, _)) = &place {
        procstat::pin_this_thread(load).map_err(|e| format!("pin the load generator: {e}"))?;
    }
    let mut order: Vec<(usize, usize)> = Vec::new();
    for (s, _) in systems.iter().enumerate() {
        for &depth in &options.depths {
            order.push((s, depth));
        }
    }
    std::thread::sleep(options.pause);
    let mut samples = Vec::new();
    for round in 0..options.rounds {
        let this_round: Vec<_> = if round % 2 == 0 {
            order.clone()
        } else {
            order.iter().rev().copied().collect()
        };
        for (s, depth) in this_round {
            let server = &systems[s];
            if let Some((_, cpus)) = &place {
                procstat::pin_process(server.pid(), cpus)
                    .map_err(|e| format!("pin {}: {e}", server.name))?;
            }
            let spec = client::Spec {
                addr: server.addr,
                echo: server.echo,
                pid: server.pid(),
                conns: options.conns,
                depth,
                warmup: options.warmup,
                measure: options.measure,
                seed: options
                    .seed
                    .wrapping_add((round * 1000 + s * 100 + depth) as u64),
                after_poll: server.after_poll,
            };
            let measured = client::run(&spec).map_err(|e| format!("{}: {e}", server.name))?;
            progress(&format!(
                "round {} {} depth {depth}: {:.0} pairs/s, {:.2} us/pair ({} pairs in all)",
                round + 1,
                server.name,
                measured.pairs as f64 / measured.secs.max(1e-9),
                1e6 * measured.server_cpu / measured.pairs.max(1) as f64,
                measured.pairs_in_all,
            ));
            samples.push(Sample {
                round,
                system: s,
                depth,
                measured,
            });
        }
    }
    Ok(samples)
}
