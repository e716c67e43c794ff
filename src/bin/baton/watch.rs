//! `baton watch KEY [--once]`: print a key's state now and after every
//! change of its holders, one line each: `TOKEN HOLDERS WAITING VALUE`
//! (`0` and `-` when nobody holds it or the holder has no value).
//!
//! Owns: the lines on stdout, and the process's end: SIGINT or SIGTERM
//! exit 0 at once (a handler that only calls `_exit`, async-signal-safe;
//! every line is written whole before the next wait, so none is cut);
//! `--once` exits 0 after the first line. Runs on the main thread; the
//! library's watch does the failover (it watches again on the new active
//! node and its first line is printed like any other).
//!
//! Never does: give up while no server answers — it says so once on
//! stderr when the first line is late (and, with `--once`, exits 1 after
//! the connect and request timeouts); only a refusal ends it, exit 1.

use std::io::{self, Write};
use std::time::Duration;

use baton::client::{Client, DEFAULT_CONNECT_TIMEOUT, DEFAULT_REQUEST_TIMEOUT, WatchState};

use crate::EXIT_ERROR;

/// Watch `key`; the exit code.
/// `timeout` is `--timeout` (the time a server has to answer).
pub fn watch(client: &Client, key: &[u8], once: bool, timeout: Option<Duration>) -> u8 {
    let name = String::from_utf8_lossy(key).into_owned();
    if let Err(e) = exit_on_signals() {
        eprintln!("baton: cannot handle signals: {e}");
        return EXIT_ERROR;
    }
    let mut watch = match client.watch(key) {
        Ok(watch) => watch,
        Err(e) => return crate::report(&format!("cannot watch {name}: {e}"), &e),
    };
    // The first line is late after this: say so (once), keep trying.
    let timeout = timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT);
    let patience = timeout.min(DEFAULT_CONNECT_TIMEOUT) + timeout;
    let mut first = true;
    let mut stdout = io::stdout().lock();
    loop {
        let state = match watch.next_timeout(first.then_some(patience)) {
            Ok(Some(state)) => state,
            Ok(None) => {
                let why = watch
                    .trouble()
                    .map_or_else(|| "no server answered".to_string(), ToString::to_string);
                if once {
                    eprintln!("baton: cannot watch {name}: {why}");
                    return EXIT_ERROR;
                }
                eprintln!("baton: no state of {name} yet ({why}); still trying");
                first = false;
                continue;
            }
            Err(e) => return crate::report(&format!("cannot watch {name}: {e}"), &e),
        };
        first = false;
        // A closed stdout (`| head -1`) ends the watch as asked.
        if writeln!(stdout, "{}", line(&state))
            .and_then(|()| stdout.flush())
            .is_err()
        {
            return 0;
        }
        if once {
            return 0;
        }
    }
}

/// `TOKEN HOLDERS WAITING VALUE`.
pub fn line(state: &WatchState) -> String {
    let value = state.value.as_ref().map_or_else(
        || "-".to_string(),
        |v| String::from_utf8_lossy(v.as_bytes()).into_owned(),
    );
    format!(
        "{} {} {} {value}",
        state.token, state.holders, state.waiting
    )
}

/// SIGINT and SIGTERM end the process at once, exit code 0.
fn exit_on_signals() -> io::Result<()> {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is valid; the handler only calls
        // _exit, which is async-signal-safe.
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = exit_now as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

extern "C" fn exit_now(_signal: libc::c_int) {
    // SAFETY: _exit(2) is async-signal-safe.
    unsafe { libc::_exit(0) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton::client::Value;

    #[test]
    fn a_line_is_token_holders_waiting_and_value_or_a_dash() {
        let held = WatchState {
            token: 42,
            holders: 2,
            waiting: 3,
            value: Some(Value::new(b"10.0.0.7:80").expect("a value")),
        };
        assert_eq!(line(&held), "42 2 3 10.0.0.7:80");
        assert_eq!(line(&WatchState::default()), "0 0 0 -");
    }
}
