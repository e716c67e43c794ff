//! `baton-driver`: the conformance driver of the Rust client library (SPEC
//! section 10), a thin adapter that lets `conformance/run.py` drive the
//! library through JSON lines on stdin and stdout.
//!
//! One binary, two clients: `rust` (the blocking calls, each request on a
//! thread of its own) and, with `--async`, `rust-async` (the `*_async`
//! calls, each request's future driven to completion by a minimal
//! `block_on` on a thread of its own: the library depends on no runtime,
//! so the driver brings the smallest executor there is). Only `rust-async`
//! takes `cancel_after_ms`, giving the call up by dropping its future; a
//! blocking call has no way to be given up by its caller but its own wait,
//! so `rust` says `"cancel": false` in its ready line.
//!
//! Owns: reading requests (one JSON object a line), the tables of clients,
//! grants and watches by the ids it hands out (`c1`, `g1`, `w1`), and
//! writing one JSON object a line, flushed, from every thread through one
//! lock. The library decides everything else: what a call sends, when it
//! fails, what a loss or a close does. The driver only maps its typed
//! errors to the protocol's kinds ([`failure`]) and its notifications to
//! events (`events.rs`).
//!
//! Never does: retry, work around the library, or exit on bad input (a
//! request that does not fit gets `bad-argument`). At the end of stdin, or
//! on `exit`, it closes every client (best effort, at most
//! [`EXIT_GRACE`]) and exits 0.

mod events;
mod requests;

use std::io::{self, BufRead, Write};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};

use baton::client::Error;

use requests::Driver;

/// How long the driver waits for its clients to close before it exits.
const EXIT_GRACE: Duration = Duration::from_millis(1500);

/// Which of the library's two flavours runs the requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    /// The blocking calls: `rust`.
    Blocking,
    /// The `*_async` calls: `rust-async`.
    Async,
}

/// Where every line goes: stdout, one object a line, flushed each time.
pub struct Out {
    stdout: Mutex<io::Stdout>,
}

impl Out {
    pub fn line(&self, value: &Value) {
        let mut out = self.stdout.lock();
        // A driver whose reader went away has nobody to tell.
        let _ = writeln!(out, "{value}").and_then(|()| out.flush());
    }

    /// The answer to request `id`: ok or a failure.
    pub fn answer(&self, id: &Value, result: Result<Value, Failure>) {
        let line = match result {
            Ok(ok) => json!({"id": id, "ok": ok}),
            Err(Failure { kind, detail }) => {
                json!({"id": id, "error": {"kind": kind, "detail": detail}})
            }
        };
        self.line(&line);
    }
}

/// A request's failure: its kind and detail, as the driver protocol says.
#[derive(Debug)]
pub struct Failure {
    kind: &'static str,
    detail: String,
}

impl Failure {
    pub fn bad_argument(detail: impl Into<String>) -> Failure {
        Failure {
            kind: "bad-argument",
            detail: detail.into(),
        }
    }

    pub fn lost(detail: impl Into<String>) -> Failure {
        Failure {
            kind: "lost",
            detail: detail.into(),
        }
    }

    /// The caller gave the call up (`cancel_after_ms`).
    pub fn given_up(after: std::time::Duration) -> Failure {
        Failure {
            kind: "timeout",
            detail: format!("given up by the caller after {after:?}"),
        }
    }

    pub fn closed(detail: impl Into<String>) -> Failure {
        Failure {
            kind: "closed",
            detail: detail.into(),
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        failure(&e)
    }
}

/// The driver protocol's kind for each of the library's errors.
pub fn failure(e: &Error) -> Failure {
    let (kind, detail) = match e {
        Error::Timeout => ("timeout", e.to_string()),
        Error::Refused(reason) => ("refused", reason.to_string()),
        Error::Auth(refused) => ("refused", refused.reason().to_string()),
        Error::NotHeld | Error::Expired | Error::Lost => ("lost", e.to_string()),
        Error::Closed => ("closed", e.to_string()),
        Error::InvalidArgument(_) => ("bad-argument", e.to_string()),
        // NoConnection, NoAnswer, NoActive, Protocol, and whatever a later
        // version adds: no node gave a usable answer.
        _ => ("unavailable", e.to_string()),
    };
    Failure { kind, detail }
}

fn main() {
    let flavour = match std::env::args().nth(1).as_deref() {
        None => Flavour::Blocking,
        Some("--async") => Flavour::Async,
        Some(other) => {
            eprintln!("baton-driver: unknown argument {other:?} (only --async)");
            std::process::exit(2);
        }
    };
    let out = Arc::new(Out {
        stdout: Mutex::new(io::stdout()),
    });
    let client = match flavour {
        Flavour::Blocking => "rust",
        Flavour::Async => "rust-async",
    };
    let mut ready = json!({"ready": true, "client": client, "version": env!("CARGO_PKG_VERSION")});
    if flavour == Flavour::Blocking {
        // A blocking call cannot be given up by its caller, but by its own
        // wait: no `cancel_after_ms`.
        ready["cancel"] = json!(false);
    }
    out.line(&ready);
    let driver = Arc::new(Driver::new(flavour, out.clone()));
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let request: Value = match serde_json::from_str(&line) {
            Ok(request) => request,
            Err(e) => {
                out.answer(
                    &Value::Null,
                    Err(Failure::bad_argument(format!("not JSON: {e}"))),
                );
                continue;
            }
        };
        let id = request.get("id").cloned().unwrap_or(Value::Null);
        if request.get("cmd").and_then(Value::as_str) == Some("exit") {
            out.answer(&id, Ok(json!({})));
            break;
        }
        let driver = driver.clone();
        let spawned = std::thread::Builder::new()
            .name("driver-request".into())
            .spawn(move || driver.serve(&id, &request));
        if let Err(e) = spawned {
            eprintln!("baton-driver: cannot start a thread: {e}");
        }
    }
    exit(&driver);
}

/// Close every client (each on a thread, so that one slow to close does
/// not hold up the rest), for at most [`EXIT_GRACE`], then exit 0.
fn exit(driver: &Arc<Driver>) -> ! {
    let (done, finished) = crossbeam_channel::bounded::<()>(0);
    for client in driver.clients() {
        let done = done.clone();
        let _ = std::thread::Builder::new()
            .name("driver-close".into())
            .spawn(move || {
                client.close();
                drop(done);
            });
    }
    drop(done);
    // Disconnected once every close returned, or the grace runs out.
    let _ = finished.recv_timeout(EXIT_GRACE);
    let _ = io::stdout().lock().flush();
    std::process::exit(0);
}
