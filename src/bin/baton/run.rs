//! `baton run KEY -- COMMAND`: hold a key (or, with `--limit`, one slot of
//! a semaphore) while a command runs; the command gets `BATON_KEY`,
//! `BATON_TOKEN` and `BATON_SLOT` (0 without a limit).
//!
//! Owns: the command's process, the thread that stops it when the key is
//! lost, and the forwarding of SIGINT, SIGTERM, SIGHUP and SIGQUIT to the
//! command. The key is held with [`Client::hold_with`], whose watchdog
//! extends the lease (`K` every third of it, retried every
//! [`KEEP_RETRY`](baton::client::KEEP_RETRY) while no server answers) and
//! says at once when the key is lost ([`Held::lost`]): the library's one
//! keeper, not a copy of it. The main thread acquires, starts the command,
//! waits for it, then releases the key and returns the command's exit
//! code.
//!
//! Signals: baton and the command share the terminal's process group, so a
//! Ctrl+C typed in the terminal already reaches the command; baton forwards
//! only signals sent to it by a process (`kill`), so the command gets each
//! signal once. The handler does nothing but `kill(2)` (async-signal-safe).
//!
//! Losing the key (the server answers not-held, or no server answers before
//! the lease runs out by the client's clock): one line on stderr, SIGTERM to
//! the command, SIGKILL [`KILL_GRACE`] later if it is still running, and a
//! non-zero exit.
//!
//! Never does: exit before the command has exited, signal a process that is
//! not (or no longer) the command, or let the command run on without its key.

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::pin::Pin;
use std::process::{Child, Command, ExitStatus};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::{Duration, Instant};

use baton::client::{AcquireOptions, Client, Error, Held, Lost, ReleaseOutcome};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::EXIT_ERROR;
/// Time a command has to exit after SIGTERM, once its key is lost, before
/// it gets SIGKILL.
pub const KILL_GRACE: Duration = Duration::from_secs(10);
/// Signals forwarded to the command.
const FORWARDED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// The command's PID while it may be signalled; 0 before it starts and once
/// it has exited (set before it is reaped, so the PID is never reused while
/// it is here).
static CHILD_PID: AtomicI32 = AtomicI32::new(0);

/// The key to hold and the command to run.
pub struct Job<'a> {
    pub key: &'a [u8],
    pub lease: Duration,
    pub wait: Option<Duration>,
    /// `--limit` and `--value`.
    pub options: &'a AcquireOptions,
    pub command: &'a [OsString],
    /// `-q`: no message when the key is busy.
    pub quiet: bool,
}

/// Run the job; the process's exit code.
pub fn run(client: &Client, job: &Job<'_>) -> u8 {
    let name = String::from_utf8_lossy(job.key).into_owned();
    let held = match client.hold_with(job.key, job.lease, job.wait, job.options) {
        Ok(held) => held,
        Err(e) => return crate::acquire_failed(&name, job.wait, &e, job.quiet),
    };
    if Instant::now() >= held.expires_at() {
        eprintln!(
            "baton: lost {name} before the command could start: no server confirmed the grant"
        );
        release_quietly(held);
        return EXIT_ERROR;
    }
    if let Err(e) = install_forwarding() {
        eprintln!("baton: cannot handle signals: {e}");
        release_quietly(held);
        return EXIT_ERROR;
    }
    let child = match spawn(job.command, &name, &held) {
        Ok(child) => Arc::new(Supervised::new(child)),
        Err(e) => return cannot_start(held, job.command, &e),
    };
    let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
    let keeper = {
        let (lost, child) = (held.lost(), child.clone());
        let (key, token) = (name.clone(), held.token());
        thread::spawn(move || stop_if_lost(lost, &stopped, &child, &key, token))
    };
    let status = child.wait();
    drop(stop);
    let lost = keeper.join().unwrap_or(true);
    finish(held, &name, lost, status)
}

/// One line for a failed acquire.
pub fn acquire_failure(key: &str, wait: Option<Duration>, e: &Error) -> String {
    match (e, wait) {
        (Error::Timeout, Some(wait)) if wait <= crate::args::NONBLOCK_WAIT => {
            format!("busy: {key} is held by someone else")
        }
        (Error::Timeout, Some(wait)) => {
            format!(
                "timed out: {key} was not granted within {:.3}s",
                wait.as_secs_f64()
            )
        }
        _ => format!("cannot acquire {key}: {e}"),
    }
}

fn cannot_start(held: Held, command: &[OsString], e: &io::Error) -> u8 {
    let program = command
        .first()
        .map_or_else(String::new, |p| p.to_string_lossy().into_owned());
    eprintln!("baton: cannot run {program}: {e}");
    release_quietly(held);
    if e.kind() == io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}

fn spawn(command: &[OsString], key: &str, grant: &Held) -> io::Result<Child> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no command"))?;
    let child = Command::new(program)
        .args(args)
        .env("BATON_KEY", key)
        .env("BATON_TOKEN", grant.token().to_string())
        .env("BATON_SLOT", grant.slot().to_string())
        .spawn()?;
    let pid = libc::pid_t::try_from(child.id())
        .map_err(|_| io::Error::other("the command's PID does not fit a pid_t"))?;
    CHILD_PID.store(pid, Ordering::SeqCst);
    Ok(child)
}

/// Release after the command exited; the exit code.
fn finish(held: Held, key: &str, lost: bool, status: io::Result<ExitStatus>) -> u8 {
    let code = match status {
        Ok(status) => exit_code(status),
        Err(e) => {
            eprintln!("baton: lost track of the command: {e}");
            EXIT_ERROR
        }
    };
    if lost {
        return EXIT_ERROR;
    }
    match held.release() {
        Ok(ReleaseOutcome::Released) => code,
        // Lost after the command exited, before this release.
        Ok(ReleaseOutcome::NotHeld) | Err(Error::Lost) => {
            eprintln!(
                "baton: {key} was no longer held when the command finished (its lease ran out)"
            );
            EXIT_ERROR
        }
        Err(e) => {
            eprintln!("baton: could not release {key}: {e}; it is freed when its lease runs out");
            code
        }
    }
}

fn release_quietly(held: Held) {
    let key = held.key().clone();
    if let Err(e) = held.release() {
        log::warn!("could not release {key}: {e}");
    }
}

/// The shell's convention: the code, or 128 + the signal that killed it.
pub fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xFF).unwrap_or(EXIT_ERROR),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(EXIT_ERROR),
        (None, None) => EXIT_ERROR,
    }
}

// --- the thread that stops the command when the key is lost ----------------

/// Wait until the key is lost or `stopped` closes (the command exited);
/// true if the key was lost, in which case the command has been told to
/// stop.
fn stop_if_lost(
    lost: Lost,
    stopped: &Receiver<()>,
    child: &Supervised,
    key: &str,
    token: u64,
) -> bool {
    let Some(why) = lost_or_stopped(lost, stopped) else {
        return false;
    };
    let why = match why {
        Error::NotHeld => "the server says it is no longer held".to_string(),
        Error::Expired => "no server answered before its lease ran out".to_string(),
        e => format!("the lease could not be extended: {e}"),
    };
    eprintln!("baton: lost {key} (token {token}): {why}; stopping the command");
    child.signal(libc::SIGTERM);
    if !sleep_or_stopped(stopped, Instant::now() + KILL_GRACE) {
        eprintln!(
            "baton: the command is still running {} s after SIGTERM; killing it",
            KILL_GRACE.as_secs()
        );
        child.signal(libc::SIGKILL);
    }
    true
}

/// Wakes [`lost_or_stopped`] when the key may be lost.
struct Nudge(Sender<()>);

impl Wake for Nudge {
    fn wake(self: Arc<Self>) {
        let _ = self.0.try_send(());
    }
}

/// Why the key was lost (the [`Lost`] future of the held key, polled on
/// this thread), or None when `stopped` closes first.
fn lost_or_stopped(mut lost: Lost, stopped: &Receiver<()>) -> Option<Error> {
    let (nudge, nudged) = crossbeam_channel::bounded::<()>(1);
    let waker = Waker::from(Arc::new(Nudge(nudge)));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(why) = Pin::new(&mut lost).poll(&mut cx) {
            return Some(why);
        }
        crossbeam_channel::select! {
            recv(stopped) -> _ => return None,
            recv(nudged) -> _ => {}
        }
    }
}

/// Sleep until `until`; true if the command exited meanwhile.
fn sleep_or_stopped(stopped: &Receiver<()>, until: Instant) -> bool {
    !matches!(stopped.recv_deadline(until), Err(RecvTimeoutError::Timeout))
}

// --- the command's process -----------------------------------------------------

/// The running command.
struct Supervised {
    pid: libc::pid_t,
    child: Mutex<Child>,
}

impl Supervised {
    fn new(child: Child) -> Supervised {
        Supervised {
            pid: CHILD_PID.load(Ordering::SeqCst),
            child: Mutex::new(child),
        }
    }

    /// Signal the command unless it has already exited.
    fn signal(&self, signal: libc::c_int) {
        let _child = self.child.lock();
        if CHILD_PID.load(Ordering::SeqCst) == self.pid && self.pid > 0 {
            // SAFETY: kill(2) with a PID that is ours and not yet reaped.
            unsafe { libc::kill(self.pid, signal) };
        }
    }

    /// Wait for the command to exit, forget its PID, then reap it.
    fn wait(&self) -> io::Result<ExitStatus> {
        wait_exited(self.pid)?;
        let mut child = self.child.lock();
        CHILD_PID.store(0, Ordering::SeqCst);
        child.wait()
    }
}

/// Block until the process has exited, without reaping it.
fn wait_exited(pid: libc::pid_t) -> io::Result<()> {
    let id = libc::id_t::try_from(pid).map_err(|_| io::Error::other("bad PID"))?;
    loop {
        // SAFETY: waitid only writes the siginfo_t we pass; zeroed is a valid value.
        let rc = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(libc::P_PID, id, &mut info, libc::WEXITED | libc::WNOWAIT)
        };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Install the forwarding handler for [`FORWARDED`] signals.
fn install_forwarding() -> io::Result<()> {
    for signal in FORWARDED {
        // SAFETY: a zeroed sigaction is valid; the handler only calls
        // async-signal-safe functions (atomics, kill).
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = forward as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The signal handler: pass a signal sent by a process on to the command.
/// A signal from the kernel (the terminal's Ctrl+C, Ctrl+\) reached the
/// command already, since it shares baton's process group.
extern "C" fn forward(signal: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo_t.
    let from_kernel = !info.is_null() && unsafe { (*info).si_code } == libc::SI_KERNEL;
    let pid = CHILD_PID.load(Ordering::SeqCst);
    if pid > 0 && !from_kernel {
        // SAFETY: kill(2) is async-signal-safe.
        unsafe { libc::kill(pid, signal) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell() {
        assert_eq!(exit_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGTERM)), 128 + 15);
    }

    #[test]
    fn a_timeout_names_the_key_and_the_wait() {
        let line = acquire_failure("job", Some(Duration::from_millis(250)), &Error::Timeout);
        assert_eq!(line, "timed out: job was not granted within 0.250s");
        let line = acquire_failure("job", Some(Duration::from_millis(1)), &Error::Timeout);
        assert_eq!(line, "busy: job is held by someone else");
        let line = acquire_failure("job", None, &Error::NoConnection("a:1 (refused)".into()));
        assert_eq!(line, "cannot acquire job: no connection: a:1 (refused)");
    }
}
