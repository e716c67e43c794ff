//! The partition run of baton (`scripts/partition.sh`): real `batond`
//! processes, each in a network namespace of its own, joined by a bridge,
//! with packets dropped by `iptables` rules per direction while every
//! process keeps running — what a real network does, unlike the chaos run's
//! kills and pauses.
//!
//! Owns: the network it builds and always removes (namespaces named
//! `bp<pid>-*`, addresses in 10.213.0.0/24 that exist only inside them), the
//! nodes (started with `ip netns exec`, killed by PID, and killed by the
//! kernel too if this process dies), a monitor per node (a thread inside
//! that node's namespace asking `I` every few milliseconds), the chaos run's
//! workers and fenced resource (from `tests/chaos_harness/workers.rs`, in a
//! client namespace), a seeded fault schedule, and the checks:
//! - every token was granted once, and the fence refused every stale write;
//! - no client call took longer than its bound (no stuck client);
//! - after every heal the cluster came back to one active, node 0, within a
//!   bound; a split brain (two nodes answering `I` as active) ended within
//!   2 x `--detect` of the heal;
//! - a blip (a cut shorter than 0.9 x `--detect`) changed no node's role or
//!   the active it follows, during the blip or for 2 x `--detect` after;
//! - a bridge partition (3 nodes: the standbys cannot see each other, node
//!   0 sees both) changed no role.
//!
//! The faults: isolate the active, isolate a standby, cut one way from the
//! active to a standby or back, the bridge partition, and cut the clients
//! off the active; each as a blip or a partition of 1.5 to 8 x `--detect`.
//!
//! Needs root (namespaces, veth pairs, a bridge, iptables). Run time is
//! `--duration` plus about 20 s.
//!
//! Never does: use an address outside its namespaces, leave a namespace or a
//! process behind (Drop guards, also on panic), or wait without a bound.

#[allow(dead_code)]
#[path = "../tests/common/cluster_key.rs"]
mod cluster_key;
#[allow(dead_code, unused_imports)]
#[path = "../tests/chaos_harness/schedule.rs"]
mod schedule;
#[allow(dead_code)]
#[path = "../tests/chaos_harness/workers.rs"]
mod workers;

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use schedule::Rng;
use workers::{Resource, Resources, SemResource, WorkerLog, Workload};

/// The first three octets of every address of the run.
const SUBNET: &str = "10.213.0";
/// The clients' address.
const CLIENT_HOST: u8 = 100;
/// Every node's port (each has an address of its own).
const PORT: u16 = 7373;
/// Longest the cluster may take to come back to one active after a heal.
const CONVERGE_BOUND: Duration = Duration::from_secs(10);
/// How often each monitor asks its node for `I`.
const SAMPLE_EVERY: Duration = Duration::from_millis(5);
/// Allowance for the monitors' sampling on top of each time bound.
const SAMPLE_SLACK: Duration = Duration::from_millis(60);
/// A blip is shorter than this share of `--detect`.
const BLIP_SHARE: f64 = 0.9;

macro_rules! say {
    ($out:expr, $($arg:tt)*) => {{
        let line = format!($($arg)*);
        println!("{line}");
        $out.push_str(&line);
        $out.push('\n');
    }};
}

// ----- options -----

struct Options {
    nodes: usize,
    duration: Duration,
    seed: u64,
    detect: Duration,
    workers: usize,
}

const USAGE: &str = "\
partition: baton under network partitions (root; see scripts/partition.sh)
  --nodes N        2 or 3 (default 3)
  --duration SECS  length of the fault schedule (default 60)
  --seed N         the schedule's seed (default: from the clock, printed)
  --detect SECS    the nodes' --detect (default 0.5)
  --workers N      client workers (default 8)";

fn parse_options() -> Result<Options, String> {
    let mut o = Options {
        nodes: 3,
        duration: Duration::from_secs(60),
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs()),
        detect: Duration::from_millis(500),
        workers: 8,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--bench" {
            continue;
        }
        if arg == "-h" || arg == "--help" {
            return Err(USAGE.to_string());
        }
        let value = args.next().ok_or_else(|| format!("{arg} needs a value"))?;
        let secs = |v: &str| -> Result<Duration, String> {
            v.parse::<f64>()
                .ok()
                .filter(|s| *s > 0.0 && *s < 86_400.0)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| format!("{arg}: '{v}' is not a number of seconds"))
        };
        match arg.as_str() {
            "--nodes" => {
                o.nodes = value
                    .parse()
                    .ok()
                    .filter(|n| (2..=3).contains(n))
                    .ok_or("--nodes must be 2 or 3")?;
            }
            "--duration" => o.duration = secs(&value)?,
            "--detect" => o.detect = secs(&value)?,
            "--seed" => o.seed = value.parse().map_err(|_| "--seed must be a number")?,
            "--workers" => {
                o.workers = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=64).contains(n))
                    .ok_or("--workers must be 1 to 64")?;
            }
            _ => return Err(format!("unknown option {arg}\n{USAGE}")),
        }
    }
    Ok(o)
}

// ----- the network -----

/// The namespaces of one run: a bridge, a client namespace, one per node.
struct Net {
    prefix: String,
    nodes: usize,
    made: Vec<String>,
}

fn run_cmd(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Net {
    fn node_ns(&self, i: usize) -> String {
        format!("{}-n{i}", self.prefix)
    }
    fn client_ns(&self) -> String {
        format!("{}-cl", self.prefix)
    }
    fn bridge_ns(&self) -> String {
        format!("{}-br", self.prefix)
    }
    fn node_ip(i: usize) -> String {
        format!("{SUBNET}.{}", i + 1)
    }
    fn client_ip() -> String {
        format!("{SUBNET}.{CLIENT_HOST}")
    }

    /// Build the bridge, the client namespace and `nodes` node namespaces.
    fn create(nodes: usize) -> Result<Net, String> {
        let mut net = Net {
            prefix: format!("bp{}", std::process::id()),
            nodes,
            made: Vec::new(),
        };
        let br = net.bridge_ns();
        net.add_ns(&br)?;
        run_cmd("ip", &["-n", &br, "link", "add", "br0", "type", "bridge"])?;
        run_cmd("ip", &["-n", &br, "link", "set", "br0", "up"])?;
        let mut ends: Vec<(String, String)> = (0..nodes)
            .map(|i| (net.node_ns(i), Net::node_ip(i)))
            .collect();
        ends.push((net.client_ns(), Net::client_ip()));
        for (k, (ns, ip)) in ends.iter().enumerate() {
            net.add_ns(ns)?;
            let port = format!("b{k}");
            run_cmd(
                "ip",
                &[
                    "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", &port,
                    "netns", &br,
                ],
            )?;
            run_cmd("ip", &["-n", &br, "link", "set", &port, "master", "br0"])?;
            run_cmd("ip", &["-n", &br, "link", "set", &port, "up"])?;
            run_cmd(
                "ip",
                &["-n", ns, "addr", "add", &format!("{ip}/24"), "dev", "eth0"],
            )?;
            run_cmd("ip", &["-n", ns, "link", "set", "eth0", "up"])?;
        }
        // iptables must work in these namespaces before anything relies on it.
        net.heal()?;
        Ok(net)
    }

    fn add_ns(&mut self, ns: &str) -> Result<(), String> {
        run_cmd("ip", &["netns", "add", ns])?;
        self.made.push(ns.to_string());
        run_cmd("ip", &["-n", ns, "link", "set", "lo", "up"])
    }

    /// Packets from `from_ip` arriving in namespace `ns` are lost.
    fn drop_from(&self, ns: &str, from_ip: &str) -> Result<(), String> {
        run_cmd(
            "ip",
            &[
                "netns", "exec", ns, "iptables", "-I", "INPUT", "-s", from_ip, "-j", "DROP",
            ],
        )
    }

    /// Every rule removed: the network is whole again.
    fn heal(&self) -> Result<(), String> {
        let mut all: Vec<String> = (0..self.nodes).map(|i| self.node_ns(i)).collect();
        all.push(self.client_ns());
        for ns in all {
            run_cmd("ip", &["netns", "exec", &ns, "iptables", "-F", "INPUT"])?;
        }
        Ok(())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.made.iter().rev() {
            let _ = run_cmd("ip", &["netns", "del", ns]);
        }
    }
}

/// Move the calling thread into network namespace `ns` (threads it starts
/// afterwards are born there too).
fn enter_ns(ns: &str) -> Result<(), String> {
    let file = File::open(format!("/var/run/netns/{ns}")).map_err(|e| format!("{ns}: {e}"))?;
    // SAFETY: setns(2) on a namespace file we opened; it changes only this
    // thread's network namespace.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("setns {ns}: {}", std::io::Error::last_os_error()))
    }
}

// ----- the nodes -----

struct Nodes {
    children: Vec<Option<Child>>,
    dir: PathBuf,
}

impl Nodes {
    fn start(net: &Net, o: &Options, dir: &std::path::Path) -> Result<Nodes, String> {
        let peers: Vec<String> = (0..o.nodes)
            .map(|i| format!("{}:{PORT}", Net::node_ip(i)))
            .collect();
        let peers = peers.join(",");
        let detect = format!("{}", o.detect.as_secs_f64());
        let mut nodes = Nodes {
            children: Vec::new(),
            dir: dir.to_path_buf(),
        };
        for i in 0..o.nodes {
            let log = File::create(dir.join(format!("node{i}.log"))).map_err(|e| e.to_string())?;
            let mut command = Command::new("ip");
            // SAFETY: prctl(2) is async-signal-safe; if this process dies
            // without its Drop guards, the kernel kills the node too (the
            // setting survives `ip netns exec`'s exec of batond).
            unsafe {
                command.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
            let child = command
                .args([
                    "netns",
                    "exec",
                    &net.node_ns(i),
                    env!("CARGO_BIN_EXE_batond"),
                ])
                .args(["--bind", &Net::node_ip(i), "--port", &PORT.to_string()])
                .args(["--advertise", &format!("{}:{PORT}", Net::node_ip(i))])
                .args(["--peers", &peers, "--detect", &detect, "--threads", "1"])
                .args(["--cluster-key-file", cluster_key::cluster_key_file()])
                .env("RUST_LOG", "info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::from(log))
                .spawn()
                .map_err(|e| format!("start node {i}: {e}"))?;
            nodes.children.push(Some(child));
        }
        Ok(nodes)
    }

    /// Nodes that exited by themselves.
    fn exited(&mut self) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        for (i, child) in self.children.iter_mut().enumerate() {
            if let Some(c) = child
                && let Ok(Some(status)) = c.try_wait()
            {
                out.push((i, status.to_string()));
                *child = None;
            }
        }
        out
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for child in self.children.iter_mut().filter_map(Option::take) {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
        eprintln!("node logs: {}", self.dir.display());
    }
}

// ----- the monitors -----

/// What one node said of itself at one moment (`up` false: no answer).
#[derive(Clone, Debug)]
struct Sample {
    at: Instant,
    node: usize,
    up: bool,
    active: bool,
    /// The `active=` field: the node it follows (itself when active).
    follows: String,
}

impl Sample {
    /// The role as compared for "no role change".
    fn view(&self) -> (bool, bool, String) {
        (self.up, self.active, self.follows.clone())
    }
}

fn monitor(
    node: usize,
    ns: String,
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
) -> Result<(), String> {
    enter_ns(&ns)?;
    let addr: SocketAddr = format!("{}:{PORT}", Net::node_ip(node))
        .parse()
        .map_err(|e| format!("{e}"))?;
    let mut conn: Option<(TcpStream, BufReader<TcpStream>)> = None;
    while !stop.load(Ordering::Relaxed) {
        if conn.is_none() {
            conn = TcpStream::connect_timeout(&addr, Duration::from_millis(100))
                .ok()
                .and_then(|s| {
                    s.set_read_timeout(Some(Duration::from_millis(200))).ok()?;
                    s.set_nodelay(true).ok()?;
                    let r = BufReader::new(s.try_clone().ok()?);
                    Some((s, r))
                });
        }
        let mut sample = Sample {
            at: Instant::now(),
            node,
            up: false,
            active: false,
            follows: String::new(),
        };
        if let Some((w, r)) = conn.as_mut() {
            let mut line = String::new();
            let ok = w.write_all(b"I\n").is_ok() && r.read_line(&mut line).is_ok_and(|n| n > 0);
            if ok && line.starts_with("I ") {
                let field = |name: &str| {
                    line.split_whitespace()
                        .find_map(|f| f.strip_prefix(name))
                        .unwrap_or("")
                        .to_string()
                };
                sample.up = true;
                sample.active = field("role=") == "active";
                sample.follows = field("active=");
            } else {
                conn = None;
            }
        }
        samples.lock().push(sample);
        std::thread::sleep(SAMPLE_EVERY);
    }
    Ok(())
}

/// The latest sample of every node at each moment, replayed in time order.
struct Timeline {
    samples: Vec<Sample>,
}

impl Timeline {
    fn new(mut samples: Vec<Sample>) -> Timeline {
        samples.sort_by_key(|s| s.at);
        Timeline { samples }
    }

    /// Call `f(t, latest)` at every sample time in `[from, to]`, with each
    /// node's latest sample at or before `t`.
    fn walk(
        &self,
        nodes: usize,
        from: Instant,
        to: Instant,
        mut f: impl FnMut(Instant, &[Option<&Sample>]),
    ) {
        let mut latest: Vec<Option<&Sample>> = vec![None; nodes];
        for s in &self.samples {
            if s.at > to {
                break;
            }
            latest[s.node] = Some(s);
            if s.at >= from {
                f(s.at, &latest);
            }
        }
    }

    /// Each node's latest sample at or before `t`.
    fn state_at(&self, nodes: usize, t: Instant) -> Vec<Option<&Sample>> {
        let mut latest: Vec<Option<&Sample>> = vec![None; nodes];
        for s in &self.samples {
            if s.at > t {
                break;
            }
            latest[s.node] = Some(s);
        }
        latest
    }

    fn actives(latest: &[Option<&Sample>]) -> usize {
        latest.iter().flatten().filter(|s| s.up && s.active).count()
    }

    /// Periods with two or more nodes answering as active.
    fn dual_actives(&self, nodes: usize, from: Instant, to: Instant) -> Vec<(Instant, Duration)> {
        let mut periods = Vec::new();
        let mut since: Option<Instant> = None;
        self.walk(nodes, from, to, |t, latest| {
            let dual = Timeline::actives(latest) >= 2;
            match (dual, since) {
                (true, None) => since = Some(t),
                (false, Some(s)) => {
                    periods.push((s, t - s));
                    since = None;
                }
                _ => {}
            }
        });
        if let Some(s) = since {
            periods.push((s, to.saturating_duration_since(s)));
        }
        periods
    }
}

// ----- the schedule -----

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    IsolateActive,
    IsolateStandby,
    ActiveToStandby,
    StandbyToActive,
    /// The standbys cannot see each other; node 0 sees both (3 nodes).
    Bridge,
    ClientsFromActive,
}

impl Cut {
    fn name(self) -> &'static str {
        match self {
            Cut::IsolateActive => "isolate the active",
            Cut::IsolateStandby => "isolate a standby",
            Cut::ActiveToStandby => "cut active -> standby (one way)",
            Cut::StandbyToActive => "cut standby -> active (one way)",
            Cut::Bridge => "bridge (standbys cut from each other)",
            Cut::ClientsFromActive => "cut the clients off the active",
        }
    }

    fn draw(rng: &mut Rng, nodes: usize) -> Cut {
        let all = [
            Cut::IsolateActive,
            Cut::IsolateStandby,
            Cut::ActiveToStandby,
            Cut::StandbyToActive,
            Cut::Bridge,
            Cut::ClientsFromActive,
        ];
        loop {
            let cut = all[rng.below(all.len() as u64) as usize];
            if cut != Cut::Bridge || nodes == 3 {
                return cut;
            }
        }
    }
}

struct Episode {
    cut: Cut,
    hold: Duration,
    blip: bool,
    /// The nodes it named (the active, the standby), as resolved.
    active: usize,
    standby: usize,
    started: Instant,
    healed: Instant,
    converged: Option<Duration>,
}

/// Apply `cut` with node 0 as the active (the cluster has converged before
/// every episode) and `standby` as the standby it names.
fn apply(net: &Net, cut: Cut, active: usize, standby: usize, nodes: usize) -> Result<(), String> {
    let ip = Net::node_ip;
    let ns = |i: usize| net.node_ns(i);
    let others = |x: usize| (0..nodes).filter(move |&i| i != x);
    match cut {
        Cut::IsolateActive | Cut::IsolateStandby => {
            let x = if cut == Cut::IsolateActive {
                active
            } else {
                standby
            };
            for o in others(x) {
                net.drop_from(&ns(x), &ip(o))?;
                net.drop_from(&ns(o), &ip(x))?;
            }
        }
        Cut::ActiveToStandby => net.drop_from(&ns(standby), &ip(active))?,
        Cut::StandbyToActive => net.drop_from(&ns(active), &ip(standby))?,
        Cut::Bridge => {
            let (a, b) = (1, 2);
            net.drop_from(&ns(a), &ip(b))?;
            net.drop_from(&ns(b), &ip(a))?;
        }
        Cut::ClientsFromActive => {
            net.drop_from(&ns(active), &Net::client_ip())?;
            net.drop_from(&net.client_ns(), &ip(active))?;
        }
    }
    Ok(())
}

/// Wait until node 0 is the one active and every other node follows it.
fn wait_converged(
    samples: &Mutex<Vec<Sample>>,
    nodes: usize,
    since: Instant,
    bound: Duration,
) -> Option<Duration> {
    let node0 = format!("{}:{PORT}", Net::node_ip(0));
    let deadline = since + bound;
    loop {
        let now = Instant::now();
        {
            let samples = samples.lock();
            let mut latest: Vec<Option<&Sample>> = vec![None; nodes];
            for s in samples.iter().rev() {
                if latest[s.node].is_none() && s.at >= since {
                    latest[s.node] = Some(s);
                }
                if latest.iter().all(Option::is_some) {
                    break;
                }
            }
            let good = latest.iter().enumerate().all(|(i, s)| {
                s.is_some_and(|s| s.up && s.follows == node0 && s.active == (i == 0))
            });
            if good {
                return Some(now - since);
            }
        }
        if now >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ----- the run -----

fn main() -> ExitCode {
    let o = match parse_options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    // SAFETY: geteuid(2) has no side effects.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "partition: needs root (it creates network namespaces, veth pairs, a bridge \
             and iptables rules); run it as root, or use scripts/chaos.sh"
        );
        return ExitCode::from(2);
    }
    match run(&o) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("partition: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(o: &Options) -> Result<bool, String> {
    let mut out = String::new();
    let detect_ms = o.detect.as_millis() as u64;
    say!(
        out,
        "partition run: {} nodes, --detect {} s, {} s of faults, seed {}",
        o.nodes,
        o.detect.as_secs_f64(),
        o.duration.as_secs(),
        o.seed
    );
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("partition")
        .join(format!("nodes-{}-seed-{}", o.nodes, o.seed));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let net = Net::create(o.nodes)?;
    let mut nodes = Nodes::start(&net, o, &dir)?;
    let samples = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let monitors: Vec<_> = (0..o.nodes)
        .map(|i| {
            let (ns, samples, stop) = (net.node_ns(i), samples.clone(), stop.clone());
            std::thread::spawn(move || monitor(i, ns, samples, stop))
        })
        .collect();
    let started = Instant::now();
    let result = drive(o, &net, &mut nodes, &samples, &mut out, started);
    stop.store(true, Ordering::Relaxed);
    for m in monitors {
        if let Ok(Err(e)) = m.join() {
            say!(out, "monitor: {e}");
        }
    }
    let (episodes, logs, resource) = result?;
    let ok = check(
        o,
        detect_ms,
        &episodes,
        &logs,
        &resource.keys,
        samples,
        started,
        &mut nodes,
        &mut out,
    );
    let _ = std::fs::write(dir.join("report.txt"), &out);
    Ok(ok)
}

type Driven = (Vec<Episode>, Vec<WorkerLog>, Arc<Resources>);

fn drive(
    o: &Options,
    net: &Net,
    nodes: &mut Nodes,
    samples: &Arc<Mutex<Vec<Sample>>>,
    out: &mut String,
    started: Instant,
) -> Result<Driven, String> {
    let took = wait_converged(samples, o.nodes, started, Duration::from_secs(20))
        .ok_or("the cluster did not form within 20 s")?;
    say!(out, "cluster formed in {:.2} s", took.as_secs_f64());
    // Workers live in the client namespace (their clients' threads too).
    let workload = Workload {
        workers: o.workers,
        hot_keys: 3,
        cold_keys: 64,
        hot_share: 0.5,
        lease: Duration::from_secs(6),
        wait: Duration::from_millis(500),
        request_timeout: Duration::from_secs(1),
        max_work: Duration::from_millis(10),
        // Mutex keys only.
        sem_limit: 3,
        sem_share: 0.0,
    };
    let slack = slack(o.detect);
    let resource = Arc::new(Resources {
        keys: Resource::default(),
        sem: SemResource::new(workload.sem_limit),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let servers: Vec<String> = (0..o.nodes)
        .map(|i| format!("{}:{PORT}", Net::node_ip(i)))
        .collect();
    let client_ns = net.client_ns();
    let workers: Vec<_> = (0..o.workers)
        .map(|w| {
            let (servers, workload, resource, stop, ns) = (
                servers.clone(),
                workload.clone(),
                resource.clone(),
                stop.clone(),
                client_ns.clone(),
            );
            let seed = o.seed;
            std::thread::spawn(move || {
                enter_ns(&ns).map(|()| {
                    workers::run(w as u16, seed, servers, workload, slack, resource, stop)
                })
            })
        })
        .collect();
    let mut rng = Rng::new(o.seed);
    let mut episodes = Vec::new();
    let end = Instant::now() + o.duration;
    let mut failure = None;
    while Instant::now() < end && failure.is_none() {
        std::thread::sleep(rng.between(Duration::from_millis(500), Duration::from_millis(1500)));
        let cut = Cut::draw(&mut rng, o.nodes);
        let blip = rng.chance(0.4);
        let hold = if blip {
            o.detect.mul_f64(0.1 + rng.unit() * (BLIP_SHARE - 0.15))
        } else {
            o.detect.mul_f64(1.5 + rng.unit() * 6.5)
        };
        let standby = 1 + rng.below(o.nodes as u64 - 1) as usize;
        let started_at = Instant::now();
        apply(net, cut, 0, standby, o.nodes)?;
        std::thread::sleep(hold);
        net.heal()?;
        let healed = Instant::now();
        let converged = wait_converged(samples, o.nodes, healed, CONVERGE_BOUND);
        let ep = Episode {
            cut,
            hold,
            blip,
            active: 0,
            standby,
            started: started_at,
            healed,
            converged,
        };
        say!(
            out,
            "[{:7.2}s] {} {} for {:.3} s (active {}, standby {}): {}",
            (started_at - started).as_secs_f64(),
            if blip { "blip:" } else { "partition:" },
            cut.name(),
            hold.as_secs_f64(),
            ep.active,
            ep.standby,
            match converged {
                Some(d) => format!("one active {:.3} s after the heal", d.as_secs_f64()),
                None => format!("NOT converged within {CONVERGE_BOUND:?}"),
            }
        );
        if converged.is_none() {
            failure = Some(episodes.len());
        }
        episodes.push(ep);
        for (i, status) in nodes.exited() {
            say!(out, "node {i} exited by itself: {status}");
            failure = Some(episodes.len());
        }
    }
    // Let the workers run on the healed cluster a little, then stop them.
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let mut logs = Vec::new();
    for w in workers {
        match w.join() {
            Ok(Ok(log)) => logs.push(log),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err("a worker panicked".into()),
        }
    }
    Ok((episodes, logs, resource))
}

/// Added to every client call's bound: a call to an unreachable active
/// waits out its request timeout, then tries the other nodes.
fn slack(detect: Duration) -> Duration {
    Duration::from_secs(2) + 2 * detect
}

#[allow(clippy::too_many_arguments)]
fn check(
    o: &Options,
    detect_ms: u64,
    episodes: &[Episode],
    logs: &[WorkerLog],
    resource: &Resource,
    samples: Arc<Mutex<Vec<Sample>>>,
    started: Instant,
    nodes: &mut Nodes,
    out: &mut String,
) -> bool {
    let mut failures: Vec<String> = Vec::new();
    let timeline = Timeline::new(std::mem::take(&mut *samples.lock()));
    let two_detect = Duration::from_millis(2 * detect_ms) + SAMPLE_SLACK;
    let now = Instant::now();

    // Split brains: every period with two actives, and how each ended.
    let duals = timeline.dual_actives(o.nodes, started, now);
    let longest = duals.iter().map(|d| d.1).max().unwrap_or_default();
    let total: Duration = duals.iter().map(|d| d.1).sum();
    say!(
        out,
        "dual-active periods: {} (total {:.3} s, longest {:.3} s)",
        duals.len(),
        total.as_secs_f64(),
        longest.as_secs_f64()
    );
    let mut worst_end = Duration::ZERO;
    for (k, ep) in episodes.iter().enumerate() {
        // Up to the next episode: what follows it is that one's doing.
        let next = episodes.get(k + 1).map_or(now, |e| e.started);
        // A split brain that outlived the heal: when did it end?
        let at_heal = Timeline::actives(&timeline.state_at(o.nodes, ep.healed));
        let mut ended: Option<Instant> = None;
        let mut dual_after_heal = false;
        timeline.walk(
            o.nodes,
            ep.healed,
            (ep.healed + CONVERGE_BOUND).min(next),
            |t, latest| {
                if ended.is_none() {
                    if Timeline::actives(latest) >= 2 {
                        dual_after_heal = true;
                    } else if dual_after_heal || at_heal >= 2 {
                        ended = Some(t);
                    }
                }
            },
        );
        if let Some(end) = ended {
            let after = end - ep.healed;
            worst_end = worst_end.max(after);
            if after > two_detect {
                failures.push(format!(
                    "episode {k} ({}): the split brain ended {:.3} s after the heal (bound {:.3} s)",
                    ep.cut.name(),
                    after.as_secs_f64(),
                    two_detect.as_secs_f64()
                ));
            }
        }
        if ep.converged.is_none() {
            failures.push(format!("episode {k} ({}): no convergence", ep.cut.name()));
        }
        // Blips and the bridge change no role.
        if ep.blip || ep.cut == Cut::Bridge {
            let before: Vec<Option<(bool, bool, String)>> = timeline
                .state_at(o.nodes, ep.started)
                .iter()
                .map(|s| s.map(Sample::view))
                .collect();
            let mut changed = None;
            let until = (ep.healed + Duration::from_millis(2 * detect_ms)).min(next);
            timeline.walk(o.nodes, ep.started, until, |t, latest| {
                for (i, s) in latest.iter().enumerate() {
                    let view = s.map(Sample::view);
                    // A monitor that missed one answer is not a role change.
                    if view.as_ref().is_some_and(|v| v.0) && view != before[i] && changed.is_none()
                    {
                        changed = Some((i, t - ep.started, view));
                    }
                }
            });
            if let Some((i, at, view)) = changed {
                failures.push(format!(
                    "episode {k} ({} for {:.3} s): node {i} changed role {:.3} s in: {view:?} (was {:?})",
                    ep.cut.name(),
                    ep.hold.as_secs_f64(),
                    at.as_secs_f64(),
                    before[i]
                ));
            }
        }
    }
    let blips = episodes.iter().filter(|e| e.blip).count();
    let conv: Vec<Duration> = episodes.iter().filter_map(|e| e.converged).collect();
    say!(
        out,
        "episodes: {} ({} blips, {} partitions); split brain ended at most {:.3} s after a heal \
         (bound 2 x detect = {:.3} s); one active again at most {:.3} s after a heal",
        episodes.len(),
        blips,
        episodes.len() - blips,
        worst_end.as_secs_f64(),
        (2 * detect_ms) as f64 / 1000.0,
        conv.iter().max().copied().unwrap_or_default().as_secs_f64()
    );
    let mut by_kind: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for e in episodes {
        let entry = by_kind.entry(e.cut.name()).or_default();
        if e.blip {
            entry.0 += 1;
        } else {
            entry.1 += 1;
        }
    }
    for (name, (b, p)) in &by_kind {
        say!(out, "  {name}: {b} blips, {p} partitions");
    }

    // Tokens and the fence.
    let mut tokens = HashSet::new();
    let mut duplicates = 0;
    let mut cycles = 0;
    let mut timeouts = 0;
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    for log in logs {
        cycles += log.cycles;
        timeouts += log.acquire_timeouts;
        for s in &log.sections {
            if !tokens.insert(s.token) {
                duplicates += 1;
            }
        }
        for (k, v) in log.acquire_errors.iter().chain(&log.release_errors) {
            *errors.entry(k.clone()).or_default() += v;
        }
        for slow in &log.slow {
            failures.push(format!(
                "worker {} {} of key {} took {:.3} s ({})",
                slow.worker,
                slow.op,
                slow.key,
                slow.took.as_secs_f64(),
                slow.outcome
            ));
        }
    }
    let writes = resource.take_log();
    let refused = writes.iter().filter(|w| !w.accepted).count();
    say!(
        out,
        "workers: {cycles} lock cycles, {} grants, {duplicates} tokens granted twice, \
         {refused} stale writes refused by the fence, {timeouts} waits timed out, errors {errors:?}",
        tokens.len()
    );
    if duplicates > 0 {
        failures.push(format!("{duplicates} tokens were granted twice"));
    }
    if cycles == 0 {
        failures.push("no lock cycle completed".into());
    }
    for (i, status) in nodes.exited() {
        failures.push(format!("node {i} exited by itself: {status}"));
    }
    for f in &failures {
        say!(out, "FAILED: {f}");
    }
    say!(
        out,
        "{} passed, {} failed",
        usize::from(failures.is_empty()),
        usize::from(!failures.is_empty())
    );
    failures.is_empty()
}
