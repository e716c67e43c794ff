//! Scheduling hints for the node's background threads.
//!
//! Owns: [`run_in_background`], which the replication thread calls once at
//! its start. On Linux it moves the calling thread to `SCHED_BATCH`: still
//! the normal fair scheduler with the same share of CPU, but a wake-up of
//! the thread never preempts the thread running on that CPU. That matters
//! on small machines, where the I/O loop and the lock owner busy-poll on
//! every core under load (busy_poll.rs): a replication wake every few
//! milliseconds would otherwise cut into a poller in the middle of a
//! round, on some client's path. The pollers give the CPU away on every
//! idle look (`sched_yield`), so the thread still runs within microseconds,
//! and under full load it keeps its fair share, so heartbeats (every
//! `--detect`/8) are never starved. Any thread may lower its own policy
//! this way without privileges.
//!
//! Never does: raise a priority, or fail the node (a refusal is logged).

/// Mark the calling thread as background work (see the module doc).
pub fn run_in_background(thread: &str) {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: pid 0 is the calling thread; `param` is a valid pointer
        // for the duration of the call.
        let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
        if rc != 0 {
            log::debug!(
                "{thread}: SCHED_BATCH refused ({}); keeping the default policy",
                std::io::Error::last_os_error()
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = thread;
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(target_os = "linux")]
    fn a_thread_marked_as_background_runs_under_sched_batch_and_others_do_not() {
        let policy = std::thread::spawn(|| {
            super::run_in_background("test");
            // SAFETY: pid 0 is the calling thread.
            unsafe { libc::sched_getscheduler(0) }
        })
        .join()
        .expect("thread");
        assert_eq!(policy, libc::SCHED_BATCH);
        // SAFETY: as above.
        assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_OTHER);
    }
}
