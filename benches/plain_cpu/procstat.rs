//! CPU time and CPU placement of processes, read and set through /proc and
//! the scheduler's affinity calls, for the plain-client CPU run.
//!
//! Owns: a process's user + system time in clock ticks (`/proc/PID/stat`,
//! every thread of it, or one thread's from `/proc/PID/task/TID/stat`), the
//! CPUs this process may use, and pinning every thread of a process (or
//! the calling thread alone) to a set of CPUs.
//!
//! Why a file of its own, not lockbench's placement.rs: this run is an
//! independent reading of the server's CPU per pair, so it shares no code
//! with the project's harness; the arithmetic is the same textbook reading
//! of `/proc`.
//!
//! Never does: change a process it was not given; a thread that ended
//! while being pinned is not an error.

use std::io;

/// utime + stime of the process or thread whose `stat` file is `path`, in
/// clock ticks; None if it cannot be read.
pub fn ticks(path: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(path).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count
    // the fields after its last ')'. There, field 3 (state) is the first,
    // so utime (14) and stime (15) are the 12th and 13th.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    utime.checked_add(stime)
}

/// Every thread of process `pid` together, in clock ticks.
pub fn process_ticks(pid: u32) -> Option<u64> {
    ticks(&format!("/proc/{pid}/stat"))
}

/// The calling thread's own time, in clock ticks.
pub fn this_thread_ticks() -> Option<u64> {
    ticks("/proc/thread-self/stat")
}

/// Seconds per clock tick.
pub fn tick_secs() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    1.0 / hz.max(1) as f64
}

/// The CPUs the calling thread may run on, in order.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
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

fn cpu_set(cpus: &[usize]) -> libc::cpu_set_t {
    // SAFETY: as in `allowed_cpus`; indices come from `allowed_cpus`, so
    // they are below the set's capacity.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    set
}

fn set_affinity(tid: libc::pid_t, set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), set) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ESRCH) {
        Ok(())
    } else {
        Err(e)
    }
}

/// Pin the calling thread (only it) to `cpus`.
pub fn pin_this_thread(cpus: &[usize]) -> io::Result<()> {
    set_affinity(0, &cpu_set(cpus))
}

/// Pin every thread process `pid` has now to `cpus`.
pub fn pin_process(pid: u32, cpus: &[usize]) -> io::Result<()> {
    let set = cpu_set(cpus);
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let name = entry?.file_name();
        if let Some(tid) = name.to_str().and_then(|s| s.parse::<libc::pid_t>().ok()) {
            set_affinity(tid, &set)?;
        }
    }
    Ok(())
}
