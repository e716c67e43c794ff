//! Where the processes of a run may run: anywhere (the kernel's choice, as
//! in every other row), or split — the load generator on CPU 0 and the
//! servers on the others — so that the load generator never takes a
//! server's core, as when it runs on a machine of its own.
//!
//! Owns: the CPU affinity of the load generator's threads and of the
//! measured server processes (every thread, from /proc/PID/task) for the
//! length of one run (a cluster's standby, or Redis's replica, is placed
//! beside the load generator: as deployed it has a machine of its own,
//! and on the measured server's cores it would take their turns);
//! [`Split::apply`] pins them, and the guard it returns gives every CPU
//! back when dropped. Also the rule [`judges_cpu_goals`]: which rows'
//! CPU per pair against the echo is judged.
//!
//! Why: on a machine where the load generator shares the cores with the
//! server, a server thread that busy-polls by yielding its CPU (as baton's
//! I/O loop and lock owner do, and the echo's loop) and lands on the load
//! generator's core waits behind it for a whole scheduler slice each time it
//! yields; the CPU time per request then measures the scheduler's slices as
//! much as the server. With the cores split, what a server costs per request
//! is its own work and its own threads' turns on the cores it has.
//!
//! Never does: change a process it was not given, or fail a run: a CPU set
//! that cannot be applied (one CPU, no /proc) leaves the run unpinned, and
//! the row says so.

use std::io;

/// Whether a row's CPU-per-pair goal against the echo is judged (PASS or
/// MISS) or only shown beside it: judged on the split rows, where the
/// load generator has a core of its own as when clients run on other
/// machines (sharing the server's cores, its scheduling is in the server's
/// figure, and that does not travel); on the shared rows only when the run
/// has no split rows (a machine with one CPU).
pub fn judges_cpu_goals(row_is_split: bool, run_has_split: bool) -> bool {
    row_is_split || !run_has_split
}

/// The CPUs of the load generator and of the servers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    pub load_gen: Vec<usize>,
    pub servers: Vec<usize>,
}

impl Split {
    /// CPU 0 for the load generator, the rest for the servers: None on a
    /// machine with fewer than two CPUs this process may use.
    pub fn of_this_machine() -> Option<Split> {
        let all = allowed_cpus().ok()?;
        let (&first, rest) = all.split_first()?;
        (!rest.is_empty()).then(|| Split {
            load_gen: vec![first],
            servers: rest.to_vec(),
        })
    }

    /// Pin this process's threads and every thread of `pids` apart, and
    /// every thread of `beside_load` (a standby, a replica: as deployed,
    /// on a machine of their own, not the measured server's) with this
    /// process; the guard lets them all run anywhere again (on every CPU
    /// this process could use before) when dropped. New threads of this
    /// process (the run's load threads) inherit its pinning from the
    /// thread that spawns them.
    pub fn apply(&self, pids: &[u32], beside_load: &[u32]) -> io::Result<Pinned> {
        let all = allowed_cpus()?;
        let guard = Pinned {
            pids: pids.iter().chain(beside_load).copied().collect(),
            all,
        };
        set_process(std::process::id(), &self.load_gen)?;
        for &pid in pids {
            set_process(pid, &self.servers)?;
        }
        for &pid in beside_load {
            set_process(pid, &self.load_gen)?;
        }
        Ok(guard)
    }

    /// "CPU 0 | CPU 1" or "CPU 0 | CPUs 1-3".
    pub fn describe(&self) -> String {
        format!("{} | {}", cpus(&self.load_gen), cpus(&self.servers))
    }
}

fn cpus(list: &[usize]) -> String {
    match list {
        [one] => format!("CPU {one}"),
        [first, .., last] => format!("CPUs {first}-{last}"),
        [] => "no CPU".to_string(),
    }
}

/// Gives every CPU back to the pinned processes when dropped.
#[derive(Debug)]
pub struct Pinned {
    pids: Vec<u32>,
    all: Vec<usize>,
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = set_process(std::process::id(), &self.all);
        for &pid in &self.pids {
            let _ = set_process(pid, &self.all);
        }
    }
}

/// The CPUs the calling thread may run on, in order.
fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the size passed is
    // its own.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: every index is below the set's capacity.
    Ok((0..max)
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// Pin every thread of process `pid` to `cpus`.
fn set_process(pid: u32, cpus: &[usize]) -> io::Result<()> {
    // SAFETY: as in `allowed_cpus`; CPU_SET is given indices below the
    // capacity (from `allowed_cpus`).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let Some(tid) = entry?
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        // SAFETY: `set` is a valid cpu_set_t of the size passed. A thread
        // that ended meanwhile gives ESRCH, which is not an error here.
        let rc =
            unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ESRCH) {
                return Err(e);
            }
        }
    }
    Ok(())
}
