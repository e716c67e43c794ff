//! A one-shot completion: one value handed from one thread to one waiter,
//! who may block on it (a condvar) or await it (a stored [`Waker`]).
//!
//! Owns: nothing but the value in flight. The sender is a connection's
//! reader thread (an answer) and the receiver a caller, blocking or async;
//! whichever side goes first, the other learns it: a receiver sees the
//! sender dropped without a value (the connection is gone), and a sender
//! sees the receiver gone (its caller gave up) and gets its value back.
//!
//! Never does: allocate more than one shared cell, or need any runtime: the
//! waker is woken on the sender's thread.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

struct Shared<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
}

struct State<T> {
    value: Option<T>,
    sender_gone: bool,
    receiver_gone: bool,
    waker: Option<Waker>,
}

/// The sending half; dropping it without sending tells the receiver.
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

/// The receiving half.
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

/// Why no value came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvError {
    /// The sender was dropped without sending.
    Closed,
    /// The deadline passed first.
    Timeout,
}

/// A new sender and receiver pair.
pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            value: None,
            sender_gone: false,
            receiver_gone: false,
            waker: None,
        }),
        ready: Condvar::new(),
    });
    (
        Sender {
            shared: shared.clone(),
        },
        Receiver { shared },
    )
}

impl<T> Sender<T> {
    /// Hand `value` over; `Err(value)` when the receiver is gone.
    pub fn send(self, value: T) -> Result<(), T> {
        let waker = {
            let mut st = self.shared.state.lock();
            if st.receiver_gone {
                return Err(value);
            }
            st.value = Some(value);
            st.waker.take()
        };
        self.shared.ready.notify_one();
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut st = self.shared.state.lock();
            st.sender_gone = true;
            st.waker.take()
        };
        self.shared.ready.notify_one();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Receiver<T> {
    /// Block until the value comes, the sender is dropped, or `due` passes
    /// (None: no limit).
    pub fn recv_deadline(&self, due: Option<Instant>) -> Result<T, RecvError> {
        let mut st = self.shared.state.lock();
        loop {
            if let Some(value) = st.value.take() {
                return Ok(value);
            }
            if st.sender_gone {
                return Err(RecvError::Closed);
            }
            match due {
                Some(due) => {
                    if self.shared.ready.wait_until(&mut st, due).timed_out() {
                        return st.value.take().ok_or(RecvError::Timeout);
                    }
                }
                None => self.shared.ready.wait(&mut st),
            }
        }
    }

    /// The value if it has come.
    pub fn try_recv(&self) -> Option<T> {
        self.shared.state.lock().value.take()
    }

    /// Ready with the value, or with [`RecvError::Closed`] once the sender
    /// is dropped; else the waker is woken when either happens.
    pub fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Result<T, RecvError>> {
        let mut st = self.shared.state.lock();
        if let Some(value) = st.value.take() {
            return Poll::Ready(Ok(value));
        }
        if st.sender_gone {
            return Poll::Ready(Err(RecvError::Closed));
        }
        match &st.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            _ => st.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl<T> Receiver<T> {
    /// Refuse values from now on: a later [`Sender::send`] gets its value
    /// back. A value sent before stays here for [`Receiver::try_recv`].
    pub fn close(&self) {
        let mut st = self.shared.state.lock();
        st.receiver_gone = true;
        st.waker = None;
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.close();
    }
}

impl<T> Future for Receiver<T> {
    type Output = Result<T, RecvError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;
    use std::time::Duration;

    struct CountWakes(AtomicUsize);

    impl Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting_waker() -> (Arc<CountWakes>, Waker) {
        let count = Arc::new(CountWakes(AtomicUsize::new(0)));
        (count.clone(), Waker::from(count))
    }

    #[test]
    fn a_value_sent_is_received_blocking_or_polled() {
        let (tx, rx) = channel();
        assert_eq!(tx.send(7), Ok(()));
        assert_eq!(rx.recv_deadline(None), Ok(7));

        let (tx, rx) = channel();
        let (wakes, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(rx.poll_recv(&mut cx).is_pending());
        assert_eq!(tx.send(8), Ok(()));
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "woken by the send");
        assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Ok(8)));
    }

    #[test]
    fn a_dropped_sender_closes_and_wakes_the_receiver() {
        let (tx, rx) = channel::<u8>();
        let (wakes, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(rx.poll_recv(&mut cx).is_pending());
        drop(tx);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
        assert_eq!(rx.poll_recv(&mut cx), Poll::Ready(Err(RecvError::Closed)));
        assert_eq!(rx.recv_deadline(None), Err(RecvError::Closed));
    }

    #[test]
    fn a_gone_receiver_hands_the_value_back() {
        let (tx, rx) = channel();
        drop(rx);
        assert_eq!(tx.send(9), Err(9));
        let (tx, rx) = channel();
        rx.close();
        assert_eq!(tx.send(10), Err(10));
    }

    #[test]
    fn a_value_sent_before_close_is_still_there() {
        let (tx, rx) = channel();
        assert_eq!(tx.send(11), Ok(()));
        rx.close();
        assert_eq!(rx.try_recv(), Some(11));
    }

    #[test]
    fn a_deadline_ends_a_blocking_wait() {
        let (_tx, rx) = channel::<u8>();
        let soon = Instant::now() + Duration::from_millis(10);
        assert_eq!(rx.recv_deadline(Some(soon)), Err(RecvError::Timeout));
        assert_eq!(rx.try_recv(), None);
    }

    #[test]
    fn a_blocked_receiver_is_woken_by_another_thread() {
        let (tx, rx) = channel();
        let sender = std::thread::spawn(move || tx.send(5));
        assert_eq!(rx.recv_deadline(None), Ok(5));
        assert_eq!(sender.join().expect("sender thread"), Ok(()));
    }
}
