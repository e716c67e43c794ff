//! What the operating system must allow a node: the listen backlog and the
//! open-file limit that `--max-conns` needs.
//!
//! Owns: the sizes of both (named below), the one `listen(2)` that gives
//! the client port its backlog, and the start-up warnings, each naming
//! what to raise and how (docs/running.md, "What the operating system must
//! allow").
//!
//! - The listen backlog: `std`'s bind listens with 128, which a fleet
//!   reconnecting one client after another overflows whenever the node is
//!   off the CPU for a few milliseconds; every connection past it loses its
//!   SYN and waits a whole second for the retransmission. The node asks for
//!   what the kernel allows (`net.core.somaxconn`, [`SOMAXCONN`], as Go's
//!   runtime does), at least [`LISTEN_BACKLOG`] and at most
//!   [`LISTEN_BACKLOG_MAX`], whatever `--max-conns` is: a connection the
//!   node refuses (`too-many-connections`) passes through the same queue,
//!   so a full node needs it as much as an empty one. The node warns at
//!   start when `somaxconn` caps it below [`LISTEN_BACKLOG`].
//! - The open files: `--max-conns` plus [`FD_HEADROOM`] for the node's own
//!   (the listeners, epoll and its wakers, peer links and the slots kept
//!   for them, metrics, logs). `batond` raises its soft limit toward that,
//!   up to the hard limit, itself (as Redis and nginx do), and warns when
//!   even the hard limit is lower.
//!
//! The decisions are plain functions of the figures read (unit-tested
//! here); the reads and the system calls are thin wrappers around them.
//!
//! Never does: change a system-wide setting (sysctl), or fail the start:
//! a node with less than it asked for runs, and says so.

use std::io;

/// The least backlog the client port asks for (more when `somaxconn`
/// allows more): a fleet of this many clients connecting at once (or one
/// after another while the node is off the CPU) waits in the queue instead
/// of losing SYNs. It costs nothing until connections fill it. (Linux's
/// default `net.core.somaxconn` since 5.4.)
pub const LISTEN_BACKLOG: usize = 4096;
/// The most backlog the client port asks for, however high `somaxconn`
/// is: what a node stuck for a while can have queued in the kernel, a
/// socket each, stays bounded.
pub const LISTEN_BACKLOG_MAX: usize = 65_535;
/// Where Linux says the cap on every listen backlog.
pub const SOMAXCONN: &str = "/proc/sys/net/core/somaxconn";
/// Open files the node needs beyond `--max-conns` for its own: the
/// listeners, epoll and its wakers, the peer links and the slots past
/// `--max-conns` kept for them, metrics connections, logs.
pub const FD_HEADROOM: u64 = 256;

/// Listen on `listener` (bound and listening already, as `std` leaves it)
/// with [`backlog_for`] the system's `somaxconn`; on Linux a second
/// `listen` updates the backlog of a listening socket. A warning is logged
/// when `somaxconn` caps it below [`LISTEN_BACKLOG`]. The backlog in
/// force: the one asked for, or the cap.
pub fn set_backlog(listener: &std::net::TcpListener) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let cap = std::fs::read_to_string(SOMAXCONN)
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok());
    let wanted = backlog_for(cap);
    let n = libc::c_int::try_from(wanted).unwrap_or(libc::c_int::MAX);
    // SAFETY: listen(2) on a file descriptor the listener owns and keeps
    // open for the call; it reads no memory of ours.
    if unsafe { libc::listen(listener.as_raw_fd(), n) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let Some(cap) = cap else {
        return Ok(wanted);
    };
    if let Some(warning) = somaxconn_warning(cap) {
        log::warn!("{warning}");
    }
    Ok(wanted.min(cap))
}

/// The backlog to ask for under `somaxconn` (`cap`, if known): all it
/// allows, between [`LISTEN_BACKLOG`] and [`LISTEN_BACKLOG_MAX`].
pub fn backlog_for(cap: Option<usize>) -> usize {
    cap.unwrap_or(LISTEN_BACKLOG)
        .clamp(LISTEN_BACKLOG, LISTEN_BACKLOG_MAX)
}

/// The warning when `net.core.somaxconn` (`cap`) keeps the backlog below
/// [`LISTEN_BACKLOG`], if it does.
pub fn somaxconn_warning(cap: usize) -> Option<String> {
    (cap < LISTEN_BACKLOG).then(|| {
        format!(
            "net.core.somaxconn ({cap}) caps the listen backlog below {LISTEN_BACKLOG}: \
             clients connecting faster than the node accepts, as a fleet does after a \
             restart or a failover, lose SYNs and wait a second each; raise it: \
             sysctl -w net.core.somaxconn={LISTEN_BACKLOG} (and \
             net.ipv4.tcp_max_syn_backlog, see docs/running.md)"
        )
    })
}

/// What to do about the open-file limit: the soft limit to set, if it
/// should change, and the warning to give, if even that is short.
#[derive(Debug, PartialEq, Eq)]
pub struct FilePlan {
    /// Raise the soft limit to this (never above the hard limit).
    pub raise_to: Option<u64>,
    /// The open files `--max-conns` needs: `--max-conns` + [`FD_HEADROOM`].
    pub needed: u64,
}

/// The plan for a node with `max_conns` (`--max-conns`) under the limits
/// `soft` and `hard` (`RLIMIT_NOFILE`): the soft limit goes up to what is
/// needed, as far as the hard limit allows.
pub fn file_plan(max_conns: usize, soft: u64, hard: u64) -> FilePlan {
    let needed = (max_conns as u64).saturating_add(FD_HEADROOM);
    let raise_to = (soft < needed && soft < hard).then(|| needed.min(hard));
    FilePlan { raise_to, needed }
}

/// The warning when the soft limit in force, `soft` (after any raise),
/// holds fewer than `needed` files, if it does.
pub fn files_warning(max_conns: usize, soft: u64, hard: u64, needed: u64) -> Option<String> {
    (soft < needed).then(|| {
        format!(
            "the open-file limit is {soft} (hard limit {hard}), below the {needed} that \
             --max-conns {max_conns} needs (--max-conns + {FD_HEADROOM} for the node's own \
             files): connections past it are refused (too-many-connections); raise it \
             where batond starts: `ulimit -n {needed}` in its shell (a hard limit that low \
             is raised by root, e.g. in /etc/security/limits.conf), or LimitNOFILE={needed} \
             in its systemd unit; or lower --max-conns"
        )
    })
}

/// Raise this process's soft limit on open files toward what `max_conns`
/// needs, up to the hard limit, and warn when that is still short.
pub fn raise_open_files(max_conns: usize) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        log::warn!(
            "cannot read the open-file limit: {}",
            io::Error::last_os_error()
        );
        return;
    }
    // rlim_t is u64 on Linux, not on every system.
    #[allow(clippy::unnecessary_cast)]
    let (mut soft, hard) = (limit.rlim_cur as u64, limit.rlim_max as u64);
    let plan = file_plan(max_conns, soft, hard);
    if let Some(to) = plan.raise_to {
        let raised = libc::rlimit {
            rlim_cur: to as libc::rlim_t,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit only reads the struct we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            log::info!("raised the open-file limit from {soft} to {to}");
            soft = to;
        } else {
            log::warn!(
                "cannot raise the open-file limit from {soft} to {to}: {}",
                io::Error::last_os_error()
            );
        }
    }
    if let Some(warning) = files_warning(max_conns, soft, hard, plan.needed) {
        log::warn!("{warning}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backlog_is_what_somaxconn_allows_within_its_bounds() {
        assert_eq!(backlog_for(None), LISTEN_BACKLOG);
        assert_eq!(backlog_for(Some(128)), LISTEN_BACKLOG);
        assert_eq!(backlog_for(Some(8192)), 8192);
        assert_eq!(backlog_for(Some(1 << 30)), LISTEN_BACKLOG_MAX);
    }

    #[test]
    fn somaxconn_below_the_backlog_is_warned_about_with_the_fix() {
        assert_eq!(somaxconn_warning(LISTEN_BACKLOG), None);
        assert_eq!(somaxconn_warning(65_535), None);
        let warning = somaxconn_warning(128).expect("warned");
        assert!(warning.contains("(128)"), "{warning}");
        assert!(
            warning.contains("sysctl -w net.core.somaxconn=4096"),
            "{warning}"
        );
    }

    #[test]
    fn the_soft_file_limit_is_raised_to_what_max_conns_needs_within_the_hard_one() {
        let needed = 10_000 + FD_HEADROOM;
        // Enough already: nothing changes.
        assert_eq!(file_plan(10_000, 20_000, 20_000).raise_to, None);
        // The hard limit allows it: raised to what is needed, no more.
        let plan = file_plan(10_000, 1024, 1_048_576);
        assert_eq!((plan.raise_to, plan.needed), (Some(needed), needed));
        assert_eq!(files_warning(10_000, needed, 1_048_576, needed), None);
        // The hard limit is short: raised to it, and warned about.
        let plan = file_plan(10_000, 1024, 4096);
        assert_eq!(plan.raise_to, Some(4096));
        let warning = files_warning(10_000, 4096, 4096, plan.needed).expect("warned");
        for says in [
            "is 4096 (hard limit 4096)",
            "ulimit -n 10256",
            "LimitNOFILE=10256",
        ] {
            assert!(warning.contains(says), "{says:?} in {warning}");
        }
        // Soft already at the hard limit: nothing to raise, still warned.
        assert_eq!(file_plan(10_000, 256, 256).raise_to, None);
    }
}
