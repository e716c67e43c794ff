//! The nodes of a chaos run: three `batond` processes on loopback, started,
//! signalled and restarted by PID, and the log of every fault action.
//!
//! Owns: the child processes (each node's log goes to a file in the run's
//! directory, one file per node, every incarnation appended), what the
//! harness believes of each node ([`Status`]) and the event log
//! ([`Event`]): each action is recorded, under one lock with the status
//! change and an epoch bump, just before its signal is sent — so the monitor
//! can tell which of its samples were taken wholly after an action.
//! Used from the driver's thread; the monitor only reads the shared state.
//!
//! Never does: signal a process it did not start or one already reaped
//! (every signal goes to a PID whose child has not been waited for). Every
//! node still running is sent SIGCONT then SIGKILL, and reaped, when the
//! [`Cluster`] drops — also when a check panics.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Nodes in a chaos cluster.
pub const NODES: usize = 3;

/// What the harness has done to a node, as far as it knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Started and not signalled since: it should take part.
    Running,
    /// SIGSTOPped: silent to everyone.
    Stopped,
    /// SIGTERM sent: handing off and exiting; no longer expected to serve.
    Leaving,
    /// Killed or exited.
    Down,
}

/// One action of the fault driver.
#[derive(Clone, Debug)]
pub struct Event {
    pub at: Instant,
    /// The epoch after this action (each action bumps it).
    pub epoch: u64,
    pub node: usize,
    pub what: &'static str,
    /// Index of the schedule's episode it belongs to.
    pub episode: usize,
}

/// The shared view of the cluster: read by the monitor, written by the
/// driver.
pub struct Shared {
    pub status: [Status; NODES],
    pub epoch: u64,
    pub events: Vec<Event>,
}

/// The three processes and where their logs go.
pub struct Cluster {
    pub ports: [u16; NODES],
    pub names: Vec<String>,
    args: Vec<String>,
    children: [Option<Child>; NODES],
    incarnations: [u32; NODES],
    pub dir: PathBuf,
    pub shared: Arc<Mutex<Shared>>,
    /// Time zero of the run, for the node logs.
    pub started: Instant,
}

/// Loopback ports for the nodes, below the kernel's ephemeral range: a
/// client's outgoing connection can then never take (or self-connect to) the
/// port of a node that is down, and a restart always finds its port free.
pub fn pick_ports(seed: u64) -> [u16; NODES] {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let (from, to) = if low > 12_000 {
        (10_000u32, low - 1)
    } else {
        (61_000, 65_000)
    };
    let mut rng = super::schedule::Rng::new(seed ^ std::process::id() as u64 ^ nanos());
    let mut ports = [0u16; NODES];
    let mut found = 0;
    for _ in 0..10_000 {
        if found == NODES {
            break;
        }
        let port = (from + rng.below(u64::from(to - from)) as u32) as u16;
        if ports[..found].contains(&port) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports[found] = port;
            found += 1;
        }
    }
    assert_eq!(found, NODES, "no free loopback ports in {from}..{to}");
    ports
}

fn nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64)
}

impl Cluster {
    /// A cluster on `ports`, not started; node logs go to `dir`.
    pub fn new(
        ports: [u16; NODES],
        detect: &str,
        promotion_grace: Option<&str>,
        dir: &Path,
        started: Instant,
    ) -> Cluster {
        let names: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let mut args: Vec<String> = [
            "--bind",
            "127.0.0.1",
            "--peers",
            &names.join(","),
            "--detect",
            detect,
            "--threads",
            "1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(grace) = promotion_grace {
            args.extend(["--promotion-grace".to_string(), grace.to_string()]);
        }
        args.extend([
            "--cluster-key-file".to_string(),
            super::cluster_key::cluster_key_file().to_string(),
        ]);
        std::fs::create_dir_all(dir).expect("create the run directory");
        Cluster {
            ports,
            names,
            args,
            children: [None, None, None],
            incarnations: [0; NODES],
            dir: dir.to_path_buf(),
            shared: Arc::new(Mutex::new(Shared {
                status: [Status::Down; NODES],
                epoch: 0,
                events: Vec::new(),
            })),
            started,
        }
    }

    pub fn log_path(&self, i: usize) -> PathBuf {
        self.dir.join(format!("node{i}.log"))
    }

    fn since_start(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Record an action and the status it leaves the node in; returns the
    /// event. Called just before the signal goes out.
    fn record(&self, node: usize, status: Status, what: &'static str, episode: usize) -> Event {
        let mut shared = self.shared.lock();
        shared.status[node] = status;
        shared.epoch += 1;
        let event = Event {
            at: Instant::now(),
            epoch: shared.epoch,
            node,
            what,
            episode,
        };
        shared.events.push(event.clone());
        event
    }

    /// Start (or restart) node `i`. Does not wait for it to listen: the
    /// monitor sees when it answers.
    pub fn start(&mut self, i: usize, episode: usize) {
        assert!(self.children[i].is_none(), "node {i} is already running");
        self.incarnations[i] += 1;
        let mut log: File = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(i))
            .expect("open the node's log");
        let _ = writeln!(
            log,
            "===== chaos: node {i} incarnation {} started at +{:.3}s =====",
            self.incarnations[i],
            self.since_start()
        );
        let port = self.ports[i].to_string();
        self.record(i, Status::Running, "start", episode);
        let mut command = Command::new(env!("CARGO_BIN_EXE_batond"));
        // SAFETY: prctl(2) is async-signal-safe. If the harness dies without
        // running its Drop guards (SIGKILL, Ctrl+C of the script), the
        // kernel kills the node too.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = command
            .args(&self.args)
            .args(["--port", &port])
            .env(
                "RUST_LOG",
                std::env::var("BATON_CHAOS_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn batond");
        self.children[i] = Some(child);
    }

    /// Send `sig` to node `i`, a child not reaped yet.
    fn signal(&mut self, i: usize, sig: libc::c_int) {
        let child = self.children[i].as_mut().expect("node is running");
        if let Ok(None) = child.try_wait() {
            // SAFETY: kill(2) on the PID of our own child, which has not been
            // waited for, so the PID cannot have been reused.
            unsafe {
                libc::kill(child.id() as libc::pid_t, sig);
            }
        }
    }

    /// SIGKILL node `i` and reap it.
    pub fn kill(&mut self, i: usize, episode: usize) {
        self.record(i, Status::Down, "SIGKILL", episode);
        let mut child = self.children[i].take().expect("node is running");
        let _ = child.kill();
        let _ = child.wait();
    }

    pub fn stop(&mut self, i: usize, episode: usize) {
        self.record(i, Status::Stopped, "SIGSTOP", episode);
        self.signal(i, libc::SIGSTOP);
    }

    pub fn resume(&mut self, i: usize, episode: usize) {
        self.record(i, Status::Running, "SIGCONT", episode);
        self.signal(i, libc::SIGCONT);
    }

    /// SIGTERM node `i` and wait up to `bound` for it to exit. Returns how
    /// long it took and its exit code, or None if it had not exited by then
    /// (it is then SIGKILLed).
    pub fn terminate(
        &mut self,
        i: usize,
        episode: usize,
        bound: Duration,
    ) -> Option<(Duration, Option<i32>)> {
        self.record(i, Status::Leaving, "SIGTERM", episode);
        let sent = Instant::now();
        self.signal(i, libc::SIGTERM);
        let mut child = self.children[i].take().expect("node is running");
        let mut exited = None;
        while sent.elapsed() < bound {
            if let Ok(Some(status)) = child.try_wait() {
                exited = Some((sent.elapsed(), status.code()));
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        self.record(i, Status::Down, "exited", episode);
        if exited.is_none() {
            let _ = child.kill();
        }
        let _ = child.wait();
        exited
    }

    /// Nodes that exited by themselves (a crash: the harness had neither
    /// killed nor terminated them), with how they exited; they are reaped
    /// and marked down.
    pub fn reap_crashed(&mut self) -> Vec<(usize, std::process::ExitStatus)> {
        let mut crashed = Vec::new();
        for i in 0..NODES {
            let exited = match self.children[i].as_mut() {
                Some(child) => child.try_wait().ok().flatten(),
                None => None,
            };
            if let Some(status) = exited {
                self.children[i] = None;
                self.record(i, Status::Down, "crashed", super::check::CRASH);
                crashed.push((i, status));
            }
        }
        crashed
    }

    /// Statuses now.
    pub fn status(&self) -> [Status; NODES] {
        self.shared.lock().status
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.children.iter_mut().filter_map(Option::take) {
            let mut child = child;
            if let Ok(None) = child.try_wait() {
                // SAFETY: as in `signal`: our own child, not reaped yet.
                unsafe {
                    libc::kill(child.id() as libc::pid_t, libc::SIGCONT);
                }
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}
