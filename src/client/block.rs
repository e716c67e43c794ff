//! Running a future to completion on the current thread, parking it in
//! between: how the blocking API and the tests drive an async call without
//! an async runtime.
//!
//! Owns: nothing but the parked thread's waker. Runs on the caller's thread.
//!
//! Never does: spawn, or poll more than the one future it is given.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

thread_local! {
    /// This thread's waker, made once.
    static UNPARK: Waker = Waker::from(Arc::new(Unpark(thread::current())));
}

/// Poll `future` until it completes, parking the thread while it waits.
/// A blocking call's body (whose waits are all ready when awaited)
/// completes on the first poll.
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let waker = UNPARK.with(Waker::clone);
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        thread::park();
    }
}
