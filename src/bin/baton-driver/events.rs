//! What the driver says without being asked, and how it waits for futures:
//! `lost` events of held grants ([`LostEvents`]), `state` events of watches
//! ([`WatchEvents`]), and [`block_on`] (and [`block_on_until`], which
//! gives a call up by dropping its future), the executor of the async
//! flavour.
//!
//! Owns: one thread (`driver-lost`) that polls every held grant's
//! [`Lost`] future, woken through a waker that names the grant; and per
//! watch a flag that, once set by `unwatch`, lets no more of its events
//! out (they are written under the same lock the flag is set under).
//!
//! Never does: decide that a grant is lost (the library's future says so)
//! or emit an event for a grant released or forgotten.

use std::collections::HashMap;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Instant;

use crossbeam_channel::Sender;
use parking_lot::Mutex;
use serde_json::{Value, json};

use baton::client::{Lost, WatchState};

use crate::Out;

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Poll `future` on this thread until it completes, parking in between:
/// the smallest executor, enough for one request's future.
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        thread::park();
    }
}

/// [`block_on`], but giving the future up (dropping it: the async API's
/// way to cancel a call) once `cancel` passes; None then.
pub fn block_on_until<F: Future>(future: F, cancel: Option<Instant>) -> Option<F::Output> {
    let mut future = pin!(future);
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return Some(output);
        }
        match cancel {
            None => thread::park(),
            Some(at) => {
                let left = at.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return None;
                }
                thread::park_timeout(left);
            }
        }
    }
}

enum Msg {
    Watch(String, Lost),
    Woke(String),
    Forget(String),
}

/// Sends a grant's id to the `driver-lost` thread when its future may be
/// ready.
struct Named {
    grant: String,
    tx: Sender<Msg>,
}

impl Wake for Named {
    fn wake(self: Arc<Self>) {
        let _ = self.tx.send(Msg::Woke(self.grant.clone()));
    }
}

/// The `lost` events of held grants.
pub struct LostEvents {
    tx: Sender<Msg>,
}

impl LostEvents {
    pub fn start(out: Arc<Out>) -> LostEvents {
        let (tx, rx) = crossbeam_channel::unbounded::<Msg>();
        let wakers = tx.clone();
        let spawned = thread::Builder::new()
            .name("driver-lost".into())
            .spawn(move || {
                let mut held: HashMap<String, Lost> = HashMap::new();
                for msg in rx {
                    let grant = match msg {
                        Msg::Watch(grant, lost) => {
                            held.insert(grant.clone(), lost);
                            grant
                        }
                        Msg::Woke(grant) => grant,
                        Msg::Forget(grant) => {
                            held.remove(&grant);
                            continue;
                        }
                    };
                    let Some(lost) = held.get_mut(&grant) else {
                        continue;
                    };
                    let waker = Waker::from(Arc::new(Named {
                        grant: grant.clone(),
                        tx: wakers.clone(),
                    }));
                    if Pin::new(lost)
                        .poll(&mut Context::from_waker(&waker))
                        .is_ready()
                    {
                        held.remove(&grant);
                        out.line(&json!({"event": "lost", "grant": grant}));
                    }
                }
            });
        if let Err(e) = spawned {
            eprintln!("baton-driver: cannot start the lost-event thread: {e}");
        }
        LostEvents { tx }
    }

    /// Say `{"event":"lost","grant":G}` once, when `lost` completes.
    pub fn watch(&self, grant: &str, lost: Lost) {
        let _ = self.tx.send(Msg::Watch(grant.to_string(), lost));
    }

    /// The grant was released: no event for it.
    pub fn forget(&self, grant: &str) {
        let _ = self.tx.send(Msg::Forget(grant.to_string()));
    }
}

/// One watch's events, and the flag `unwatch` sets.
pub struct WatchEvents {
    id: String,
    out: Arc<Out>,
    stopped: Mutex<bool>,
    /// The async flavour's task, woken when the flag is set.
    waker: Mutex<Option<Waker>>,
}

impl WatchEvents {
    pub fn new(id: String, out: Arc<Out>) -> WatchEvents {
        WatchEvents {
            id,
            out,
            stopped: Mutex::new(false),
            waker: Mutex::new(None),
        }
    }

    /// Write a state event, unless the watch was unwatched.
    pub fn state(&self, state: &WatchState) {
        let stopped = self.stopped.lock();
        if *stopped {
            return;
        }
        let mut event = state_json(state);
        event["event"] = json!("state");
        event["watch"] = json!(self.id);
        self.out.line(&event);
    }

    /// No event of this watch after this returns.
    pub fn stop(&self) {
        *self.stopped.lock() = true;
        if let Some(waker) = self.waker.lock().take() {
            waker.wake();
        }
    }

    pub fn is_stopped(&self) -> bool {
        *self.stopped.lock()
    }

    /// Ready once stopped; else the task is woken when it is.
    pub fn poll_stopped(&self, cx: &mut Context<'_>) -> Poll<()> {
        *self.waker.lock() = Some(cx.waker().clone());
        match self.is_stopped() {
            true => Poll::Ready(()),
            false => Poll::Pending,
        }
    }
}

/// A state as the driver protocol shows it (the answer to `leader`, and
/// the body of a `state` event).
pub fn state_json(state: &WatchState) -> Value {
    json!({
        "token": state.token.to_string(),
        "holders": state.holders,
        "waiting": state.waiting,
        "value": state.value.as_ref().map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
    })
}
