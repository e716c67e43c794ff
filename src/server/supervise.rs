//! A thread of the node that ends, ends the node.
//!
//! Owns: [`Supervisor`], through which `node.rs` starts every thread of the
//! node (the I/O loops, the lock owner, replication, the metrics server).
//! Each such thread is marked as the node's (a thread-local flag, so a
//! client library thread or a test's thread that happens to share a name
//! prefix is never taken for one). If a marked thread returns before the
//! node's stop sequence began, or panics at any time, the process logs one
//! line naming the thread and exits non-zero: a node that kept listening
//! without its lock owner would take requests it can never answer, and one
//! without its replication thread would stop sending heartbeats and let a
//! standby promote itself beside it.
//!
//! Exit codes: 70 for a thread that returned (EX_SOFTWARE), 101 for a panic
//! (Rust's own code for one).
//!
//! Test hook: `BATON_TEST_THREAD_FAULT=<thread>:<return|panic>` (for example
//! `baton-owner:panic`) makes that thread return or panic, in place of its
//! work, 200 ms after the node starts it. It exists so that the process
//! tests can make each thread end (tests/supervision.rs), and is compiled
//! only into builds with the `test-hooks` feature (which the package's
//! tests turn on; Cargo.toml says how): a `batond` users build ignores the
//! variable.
//!
//! Never does: restart a thread (a node in an unknown state must not carry
//! on), or decide anything about locks.

use std::cell::Cell;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

/// The exit code of a node whose thread returned while it was serving.
pub const EXIT_THREAD_ENDED: i32 = 70;
/// The exit code of a node whose thread panicked.
pub const EXIT_THREAD_PANICKED: i32 = 101;

thread_local! {
    /// Set on the node's own threads, at their start.
    static NODE_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Starts the node's threads and watches them end.
#[derive(Clone, Debug, Default)]
pub struct Supervisor {
    /// Set when the node's stop sequence begins: from then on a thread
    /// that returns is doing what it was asked to.
    stopping: Arc<AtomicBool>,
}

impl Supervisor {
    /// A supervisor, with the panic hook installed (once per process).
    pub fn new() -> Supervisor {
        install_panic_hook();
        Supervisor::default()
    }

    /// Start `body` on a thread of the node called `name`.
    pub fn spawn(
        &self,
        name: String,
        body: impl FnOnce() + Send + 'static,
    ) -> io::Result<JoinHandle<()>> {
        let stopping = self.stopping.clone();
        #[cfg(any(test, feature = "test-hooks"))]
        let body = fault::planned_or(&name, body);
        std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                NODE_THREAD.with(|flag| flag.set(true));
                body();
                if !stopping.load(Ordering::Acquire) {
                    log::error!(
                        "thread {name} ended while the node was serving; stopping the node"
                    );
                    std::process::exit(EXIT_THREAD_ENDED);
                }
            })
    }

    /// The node's stop sequence has begun: threads may end now.
    pub fn stopping(&self) {
        self.stopping.store(true, Ordering::Release);
    }
}

/// The test hook of the module doc, in builds with the `test-hooks`
/// feature (and the unit tests) only.
#[cfg(any(test, feature = "test-hooks"))]
mod fault {
    use std::time::Duration;

    /// The environment variable of the test hook.
    const FAULT_VAR: &str = "BATON_TEST_THREAD_FAULT";
    /// How long after its start a thread named by the test hook ends.
    const FAULT_AFTER: Duration = Duration::from_millis(200);

    /// What the test hook asks of a thread.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(super) enum Fault {
        Return,
        Panic,
    }

    /// `body`, or in its place the fault the test hook plans for the
    /// thread called `name`.
    pub(super) fn planned_or(
        name: &str,
        body: impl FnOnce() + Send + 'static,
    ) -> Box<dyn FnOnce() + Send> {
        let planned = std::env::var(FAULT_VAR)
            .ok()
            .and_then(|value| parse_fault(&value, name));
        match planned {
            None => Box::new(body),
            Some(fault) => Box::new(move || {
                // Held, not run, until the thread ends: what it owns (the
                // channels to the other threads) goes when the thread
                // does, as it would with the work done.
                let _unrun = body;
                std::thread::sleep(FAULT_AFTER);
                if fault == Fault::Panic {
                    panic!("{FAULT_VAR} asked this thread to panic");
                }
            }),
        }
    }

    /// `thread:return` or `thread:panic`, for the thread called `name`.
    pub(super) fn parse_fault(value: &str, name: &str) -> Option<Fault> {
        let (thread, what) = value.rsplit_once(':')?;
        if thread != name {
            return None;
        }
        match what {
            "return" => Some(Fault::Return),
            "panic" => Some(Fault::Panic),
            _ => None,
        }
    }
}

/// A panic on one of the node's threads ends the process with a log line
/// and a non-zero exit. (Release builds also abort on panic; this covers
/// every build, and panics outside the node's threads — a test's, or a
/// client library's thread in the same process — keep their usual course.)
fn install_panic_hook() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            if NODE_THREAD.with(Cell::get) {
                let thread = std::thread::current();
                let name = thread.name().unwrap_or("a node thread");
                log::error!("thread {name} panicked: {info}; stopping the node");
                std::process::exit(EXIT_THREAD_PANICKED);
            }
        }));
    });
}

#[cfg(test)]
mod tests {
    use super::fault::{Fault, parse_fault};
    use super::*;

    #[test]
    fn the_test_hook_names_one_thread_and_one_fault() {
        assert_eq!(
            parse_fault("baton-owner:panic", "baton-owner"),
            Some(Fault::Panic)
        );
        assert_eq!(
            parse_fault("baton-io-0:return", "baton-io-0"),
            Some(Fault::Return)
        );
        assert_eq!(parse_fault("baton-io-0:return", "baton-io-1"), None);
        assert_eq!(parse_fault("baton-owner:stop", "baton-owner"), None);
        assert_eq!(parse_fault("baton-owner", "baton-owner"), None);
    }

    #[test]
    fn a_thread_that_is_not_the_nodes_panics_as_usual() {
        let _supervisor = Supervisor::new();
        let outcome = std::thread::Builder::new()
            .name("baton-lookalike".into())
            .spawn(|| panic!("an ordinary panic"))
            .expect("spawn")
            .join();
        assert!(
            outcome.is_err(),
            "the panic reached join, the process lives"
        );
    }

    #[test]
    fn a_node_thread_that_returns_after_the_stop_began_ends_quietly() {
        let supervisor = Supervisor::new();
        supervisor.stopping();
        let thread = supervisor
            .spawn("baton-test-quiet".into(), || {})
            .expect("spawn");
        thread
            .join()
            .expect("the thread returned; the process lives");
    }
}
