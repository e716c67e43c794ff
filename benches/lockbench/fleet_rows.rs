//! The fleet-after-a-failover row of lockbench: a 2-node cluster's active
//! is killed, and once its standby says it is active, a fleet of clients
//! follows it there (as through an address that moved to the new active):
//! each client opens its two connections and sends its first request on
//! each, an acquire of a key of its own. The figure: from the promotion
//! (the first `I` of the new active that says `role=active`) to the last
//! first answer read, against the 2 s goal.
//!
//! Owns: the `--failover`, `--failover-pids` and `--fleet` options, the run
//! (one per bench run: the killed node is not brought back) and its table.
//!
//! Never does: start a server (scripts/bench.sh starts the cluster); it
//! ends one, the active, with SIGKILL, which is the point of the row.
//!
//! The fleet is as large as both open-file limits allow (this process's
//! and the new active's, read from `/proc/PID/limits`): two sockets a
//! client, `FD_SPARE` kept free on each side; the table says when that
//! scaled it down.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::engine::cpu_ticks;
use crate::placement::Split;
use crate::watch_rows;

/// Clients of the fleet unless `--fleet` says otherwise.
const DEFAULT_FLEET: usize = 10_000;
/// Connections per client (the client library's, with one address).
const CONNS_PER_CLIENT: usize = 2;
/// Threads that connect the fleet (each a share of the clients) unless
/// `--fleet-threads` says otherwise: one per CPU the load generator has.
/// More than that take the node's CPU on a machine it shares with the
/// load generator (a real fleet runs elsewhere), and its listen queue then
/// overflows because the node is off the CPU, not because it is slow;
/// hence also the split (placement.rs): the load generator on CPU 0, the
/// new active on the others, as when the fleet runs on machines of its own.
fn fleet_threads(split: Option<&Split>) -> usize {
    match split {
        Some(split) => split.load_gen.len(),
        None => std::thread::available_parallelism().map_or(2, |n| n.get()),
    }
}
/// Open files kept free on each side.
const FD_SPARE: usize = 256;
/// The most the standby may take to say it is active after the kill.
const PROMOTION_BOUND: Duration = Duration::from_secs(30);
/// The most one connect or answer may take before the run fails.
const IO_BOUND: Duration = Duration::from_secs(30);
/// A connect this long waited for a retransmitted SYN.
const SYN_RETRANSMIT: Duration = Duration::from_secs(1);
/// The goal: every first request answered this soon after the promotion.
const GOAL: Duration = Duration::from_secs(2);
/// Lease of the fleet's acquires.
const LEASE_SECS: u64 = 60;

/// The cluster of the row: the active and the standby, with their PIDs.
pub struct FleetOptions {
    pub nodes: Option<crate::flags::Pair>,
    pub fleet: Option<usize>,
    pub threads: Option<usize>,
}

/// The fleet options (`--failover` absent: no fleet row).
pub fn parse(args: &mut pico_args::Arguments) -> Result<FleetOptions, String> {
    let err = |e: pico_args::Error| e.to_string();
    let fleet: Option<usize> = args.opt_value_from_str("--fleet").map_err(err)?;
    if fleet.is_some_and(|n| n == 0 || n > 100_000) {
        return Err("--fleet must be 1 to 100000".into());
    }
    let threads: Option<usize> = args.opt_value_from_str("--fleet-threads").map_err(err)?;
    if threads.is_some_and(|n| n == 0 || n > 64) {
        return Err("--fleet-threads must be 1 to 64".into());
    }
    let nodes = crate::flags::pair(args, "--failover", "--failover-pids")?;
    Ok(FleetOptions {
        nodes,
        fleet,
        threads,
    })
}

/// What the fleet's run measured.
struct FleetRun {
    clients: usize,
    threads: usize,
    /// Kill → the standby's first `I` that says it is active.
    promotion: Duration,
    /// Promotion → the last first answer read.
    all_served: Duration,
    /// Per connection, promotion → its first answer read (ns).
    served_ns: Vec<u64>,
    /// Connects that took `SYN_RETRANSMIT` or more.
    waited: usize,
    /// First answers that were not a grant.
    refused: usize,
    /// CPU seconds over the fleet's run: the new active's, this process's.
    cpu_node: f64,
    cpu_fleet: f64,
    /// Where the load generator and the new active ran.
    placement: String,
}

/// Run the fleet row; its Markdown section ("" without `--failover`).
pub fn run(options: &FleetOptions) -> Result<String, String> {
    let Some(([active, standby], [active_pid, standby_pid])) = options.nodes else {
        return Ok(String::new());
    };
    let soft = watch_rows::raise_fd_limit() as usize;
    let server_soft = open_file_limit(standby_pid).unwrap_or(soft);
    let wanted = options.fleet.unwrap_or(DEFAULT_FLEET);
    let fits = soft.min(server_soft).saturating_sub(FD_SPARE) / CONNS_PER_CLIENT;
    let clients = wanted.min(fits).max(1);
    let note = if clients < wanted {
        format!(
            " (scaled down from {wanted}: open-file limits {soft} here, {server_soft} on the node)"
        )
    } else {
        String::new()
    };
    let info = crate::info(active)?;
    if info.get("role").map(String::as_str) != Some("active") {
        return Err(format!("--failover: {active} is not active: {info:?}"));
    }
    // The load generator on CPU 0, the new active on the others (until
    // the guard drops, after the run).
    let split = Split::of_this_machine();
    let pinned = split
        .as_ref()
        .and_then(|split| split.apply(&[standby_pid], &[]).ok());
    let placement = match (&split, &pinned) {
        (Some(split), Some(_)) => format!("load generator | new active: {}", split.describe()),
        _ => "unpinned".to_string(),
    };
    let n = options
        .threads
        .unwrap_or_else(|| fleet_threads(split.as_ref().filter(|_| pinned.is_some())));
    eprintln!("fleet: killing the active {active} (pid {active_pid}); {clients} clients follow");
    let killed = Instant::now();
    // SAFETY: kill(2) reads no memory of ours.
    unsafe {
        libc::kill(active_pid as libc::pid_t, libc::SIGKILL);
    }
    let promoted = loop {
        if let Ok(info) = crate::info(standby)
            && info.get("role").map(String::as_str) == Some("active")
        {
            break Instant::now();
        }
        if killed.elapsed() > PROMOTION_BOUND {
            return Err(format!(
                "fleet: {standby} not active {} s after the kill",
                PROMOTION_BOUND.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let node_stat = format!("/proc/{standby_pid}/stat");
    let cpu_before = (cpu_ticks(&node_stat), cpu_ticks("/proc/self/stat"));
    let shares: Vec<std::ops::Range<usize>> = (0..n)
        .map(|t| t * clients / n..(t + 1) * clients / n)
        .collect();
    let threads: Vec<_> = shares
        .into_iter()
        .map(|share| std::thread::spawn(move || follow(standby, share, promoted)))
        .collect();
    let mut out = FleetRun {
        clients,
        threads: n,
        promotion: promoted - killed,
        all_served: Duration::ZERO,
        served_ns: Vec::with_capacity(clients * CONNS_PER_CLIENT),
        waited: 0,
        refused: 0,
        cpu_node: 0.0,
        cpu_fleet: 0.0,
        placement: String::new(),
    };
    for thread in threads {
        let part = thread.join().map_err(|_| "fleet: a thread panicked")??;
        out.served_ns.extend(part.served_ns);
        out.waited += part.waited;
        out.refused += part.refused;
    }
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let spent = |before: Option<u64>, after: Option<u64>| match (before, after) {
        (Some(b), Some(a)) => a.saturating_sub(b) as f64 / hz,
        _ => f64::NAN,
    };
    out.cpu_node = spent(cpu_before.0, cpu_ticks(&node_stat));
    out.cpu_fleet = spent(cpu_before.1, cpu_ticks("/proc/self/stat"));
    drop(pinned);
    out.placement = placement;
    out.served_ns.sort_unstable();
    out.all_served = Duration::from_nanos(out.served_ns.last().copied().unwrap_or(0));
    Ok(render(&out, &note))
}

/// One thread's share of the fleet: for each client, connect its two
/// connections and send an acquire on each as soon as it is up; then read
/// every first answer.
fn follow(
    addr: SocketAddr,
    share: std::ops::Range<usize>,
    promoted: Instant,
) -> Result<FleetRun, String> {
    let mut conns = Vec::with_capacity(share.len() * CONNS_PER_CLIENT);
    let mut waited = 0;
    for client in share {
        for c in 0..CONNS_PER_CLIENT {
            let start = Instant::now();
            let mut stream = connect_from(source_of(client), addr)
                .map_err(|e| format!("fleet: client {client} connect: {e}"))?;
            if start.elapsed() >= SYN_RETRANSMIT {
                waited += 1;
            }
            stream.set_nodelay(true).map_err(|e| e.to_string())?;
            let line = format!("A fleet:{client}:{c} {LEASE_SECS} 0\n");
            stream
                .write_all(line.as_bytes())
                .map_err(|e| format!("fleet: client {client} send: {e}"))?;
            conns.push(stream);
        }
    }
    let mut served_ns = Vec::with_capacity(conns.len());
    let mut refused = 0;
    for stream in &conns {
        stream
            .set_read_timeout(Some(IO_BOUND))
            .map_err(|e| e.to_string())?;
        let mut line = String::new();
        BufReader::new(stream)
            .read_line(&mut line)
            .map_err(|e| format!("fleet: first answer: {e}"))?;
        served_ns.push(promoted.elapsed().as_nanos() as u64);
        if !line.starts_with("A ") {
            refused += 1;
        }
    }
    for stream in &conns {
        let _ = watch_rows::no_linger(stream);
    }
    Ok(FleetRun {
        clients: 0,
        threads: 1,
        promotion: Duration::ZERO,
        all_served: Duration::ZERO,
        served_ns,
        waited,
        refused,
        cpu_node: 0.0,
        cpu_fleet: 0.0,
        placement: String::new(),
    })
}

/// The loopback address a client connects from: a fleet comes from many
/// machines, and 20,000 connections from one address to one port make the
/// kernel's search for a free source port this process's main cost (a
/// client's two connections share its address).
fn source_of(client: usize) -> std::net::Ipv4Addr {
    let n = (client % SOURCES) as u32;
    std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(127, 0, 1, 0)) + n)
}

/// Loopback source addresses the fleet is spread over.
const SOURCES: usize = 250;

/// A blocking connect to `to` from `from` (port left to the kernel, chosen
/// at connect: `IP_BIND_ADDRESS_NO_PORT`), bounded by `IO_BOUND`.
fn connect_from(from: std::net::Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(to) = to else {
        return TcpStream::connect_timeout(&to, IO_BOUND);
    };
    let sockaddr = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let check = |rc: libc::c_int| {
        if rc < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(rc)
        }
    };
    // SAFETY: a new socket, owned by the TcpStream from here on (closed
    // on every error path by its drop); every pointer passed is to a live
    // value of the size given.
    unsafe {
        let fd = check(libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
        ))?;
        let stream = TcpStream::from_raw_fd(fd);
        let one: libc::c_int = 1;
        check(libc::setsockopt(
            fd,
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ))?;
        let local = sockaddr(from, 0);
        check(libc::bind(
            fd,
            (&local as *const libc::sockaddr_in).cast(),
            len,
        ))?;
        // A blocking connect gives up at SO_SNDTIMEO.
        stream.set_write_timeout(Some(IO_BOUND))?;
        let remote = sockaddr(*to.ip(), to.port());
        check(libc::connect(
            fd,
            (&remote as *const libc::sockaddr_in).cast(),
            len,
        ))?;
        stream.set_write_timeout(None)?;
        Ok(stream)
    }
}

/// The soft open-file limit of a process (`/proc/PID/limits`).
fn open_file_limit(pid: u32) -> Option<usize> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

fn render(run: &FleetRun, note: &str) -> String {
    let q = |p: f64| {
        let v = &run.served_ns;
        if v.is_empty() {
            return 0.0;
        }
        v[((v.len() - 1) as f64 * p).round() as usize] as f64 / 1e6
    };
    let mut out = String::new();
    out.push_str(&format!(
        "\n### A fleet following a failover: {} clients × {CONNS_PER_CLIENT} connections to the new active, \
         from {} load thread(s) ({}){note}\n\n",
        run.clients, run.threads, run.placement
    ));
    out.push_str(
        "| kill → promotion ms | promotion → all first requests answered ms | goal | \
         per connection: p50 ms | p99 ms | connects ≥ 1 s | not granted | \
         CPU s: new active | load generator |\n",
    );
    out.push_str("|---:|---:|---|---:|---:|---:|---:|---:|---:|\n");
    out.push_str(&format!(
        "| {:.0} | {:.0} | {} ms: {} | {:.0} | {:.0} | {} | {} | {:.2} | {:.2} |\n",
        run.promotion.as_secs_f64() * 1e3,
        run.all_served.as_secs_f64() * 1e3,
        GOAL.as_millis(),
        if run.all_served <= GOAL {
            "met"
        } else {
            "missed"
        },
        q(0.5),
        q(0.99),
        run.waited,
        run.refused,
        run.cpu_node,
        run.cpu_fleet,
    ));
    out.push_str(
        "\nThe answers are read after every connection of a thread is up, so a \
         connection's time is an upper bound; the promotion is when the standby's \
         `I` first said `role=active` (polled every 5 ms).\n",
    );
    out
}
