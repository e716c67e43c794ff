//! The driver's requests: each `cmd` of SPEC section 10 as one call (or a
//! few) of the library's public API, in the flavour the driver runs.
//!
//! Owns: the tables of clients, grants and watches by id. A grant from
//! `acquire` is the library's [`Grant`] (a value: releasing it twice is
//! known here, by the id, and answered `closed`); one from `hold` or
//! `campaign` is a [`Held`], consumed by its release. A watch is read by a
//! thread of its own (`driver-watch`) until `unwatch`, the client's close,
//! or its end.
//!
//! Never does: retry a call, or answer for the library (every error is the
//! library's, mapped by [`crate::failure`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};

use baton::client::{AcquireOptions, Client, Error, Grant, Held, ReleaseOutcome, TlsConfig, Watch};

use crate::events::{LostEvents, WatchEvents, block_on, block_on_until, state_json};
use crate::{Failure, Flavour, Out};

/// A grant the driver handed out.
enum Granted {
    /// From `acquire`.
    Plain {
        client: Client,
        grant: Mutex<Slot<Grant>>,
    },
    /// From `hold` or `campaign`.
    Held(Mutex<Slot<Held>>),
}

/// Where a grant stands, as far as the driver's requests took it.
enum Slot<G> {
    Live(G),
    /// Released: later calls on it answer `closed`.
    Released,
    /// Its release found it lost: later calls on it answer `lost`.
    Lost,
}

impl<G> Slot<G> {
    /// The grant, or the failure a call on it gets.
    fn live(&mut self) -> Result<&mut G, Failure> {
        match self {
            Slot::Live(grant) => Ok(grant),
            Slot::Released => Err(Failure::closed("released already")),
            Slot::Lost => Err(Failure::lost("lost already")),
        }
    }

    /// Take the grant out (to release it), or the failure.
    fn take(&mut self) -> Result<G, Failure> {
        self.live()?;
        match std::mem::replace(self, Slot::Released) {
            Slot::Live(grant) => Ok(grant),
            Slot::Released | Slot::Lost => unreachable!("checked live above"),
        }
    }
}

/// The driver's state, shared by every request's thread.
pub struct Driver {
    flavour: Flavour,
    out: Arc<Out>,
    clients: Mutex<HashMap<String, Client>>,
    grants: Mutex<HashMap<String, Arc<Granted>>>,
    watches: Mutex<HashMap<String, Arc<WatchEvents>>>,
    lost: LostEvents,
    next: AtomicU64,
}

type Answer = Result<Value, Failure>;

impl Driver {
    pub fn new(flavour: Flavour, out: Arc<Out>) -> Driver {
        Driver {
            flavour,
            lost: LostEvents::start(out.clone()),
            out,
            clients: Mutex::new(HashMap::new()),
            grants: Mutex::new(HashMap::new()),
            watches: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        }
    }

    /// Every client made so far (to close them at exit).
    pub fn clients(&self) -> Vec<Client> {
        self.clients.lock().values().cloned().collect()
    }

    fn id(&self, prefix: &str) -> String {
        format!("{prefix}{}", self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// Run one request and write its answer (`id`).
    pub fn serve(self: &Arc<Self>, id: &Value, request: &Value) {
        let cmd = request.get("cmd").and_then(Value::as_str).unwrap_or("");
        let answer = match cmd {
            // Its answer goes out before any of its events.
            "watch" => match self.watch(id, request) {
                Ok(()) => return,
                Err(failure) => Err(failure),
            },
            "connect" => self.connect(request),
            "acquire" => self.acquire(request),
            "hold" => self.hold(request, false),
            "campaign" => self.hold(request, true),
            "release" => self.release(request),
            "keep" => self.keep(request),
            "query" => self.query(request),
            "leader" => self.leader(request),
            "unwatch" => self.unwatch(request),
            "close" => self.close(request),
            other => Err(Failure::bad_argument(format!("unknown cmd {other:?}"))),
        };
        self.out.answer(id, answer);
    }

    fn connect(&self, request: &Value) -> Answer {
        let addrs: Vec<&str> = field(request, "addrs")?
            .as_array()
            .ok_or_else(|| Failure::bad_argument("addrs: a list of host:port"))?
            .iter()
            .map(|a| {
                a.as_str()
                    .ok_or_else(|| Failure::bad_argument("addrs: strings"))
            })
            .collect::<Result<_, _>>()?;
        let mut builder = Client::builder(addrs);
        if let Some(secret) = optional_str(request, "auth")? {
            builder = builder.auth(secret);
        }
        if let Some(tls) = request.get("tls") {
            let mut config = TlsConfig::new();
            if let Some(ca) = optional_str(tls, "ca")? {
                config = config.ca_file(ca);
            }
            match (optional_str(tls, "cert")?, optional_str(tls, "key")?) {
                (Some(cert), Some(key)) => config = config.client_cert(cert, key),
                (None, None) => {}
                _ => return Err(Failure::bad_argument("tls: cert and key go together")),
            }
            builder = builder.tls(config);
        }
        let client = builder.connect()?;
        let id = self.id("c");
        self.clients.lock().insert(id.clone(), client);
        Ok(json!({"client": id}))
    }

    fn client(&self, request: &Value) -> Result<Client, Failure> {
        let id = string(request, "client")?;
        self.clients
            .lock()
            .get(id)
            .cloned()
            .ok_or_else(|| Failure::bad_argument(format!("no client {id:?}")))
    }

    fn acquire(&self, request: &Value) -> Answer {
        let client = self.client(request)?;
        let (key, lease, wait, options) = acquire_fields(request)?;
        let grant = match self.flavour {
            Flavour::Blocking => client.acquire_with(key, lease, wait, &options)?,
            Flavour::Async => {
                let acquire = client.acquire_with_async(key, lease, wait, &options);
                cancellable(acquire, request)??
            }
        };
        let (token, slot) = (grant.token(), grant.slot());
        let id = self.id("g");
        let granted = Granted::Plain {
            client,
            grant: Mutex::new(Slot::Live(grant)),
        };
        self.grants.lock().insert(id.clone(), Arc::new(granted));
        Ok(json!({"grant": id, "token": token.to_string(), "slot": slot}))
    }

    fn hold(&self, request: &Value, campaign: bool) -> Answer {
        let client = self.client(request)?;
        let held = if campaign {
            let key = string(request, "key")?;
            let value = string(request, "value")?;
            let lease = millis(request, "lease_ms")?
                .ok_or_else(|| Failure::bad_argument("lease_ms is required"))?;
            let wait = millis(request, "wait_ms")?;
            match self.flavour {
                Flavour::Blocking => client.campaign(key, value, lease, wait)?,
                Flavour::Async => {
                    cancellable(client.campaign_async(key, value, lease, wait), request)??
                }
            }
        } else {
            let (key, lease, wait, options) = acquire_fields(request)?;
            match self.flavour {
                Flavour::Blocking => client.hold_with(key, lease, wait, &options)?,
                Flavour::Async => {
                    let hold = client.hold_with_async(key, lease, wait, &options);
                    cancellable(hold, request)??
                }
            }
        };
        let (token, slot) = (held.token(), held.slot());
        let id = self.id("g");
        self.lost.watch(&id, held.lost());
        let granted = Granted::Held(Mutex::new(Slot::Live(held)));
        self.grants.lock().insert(id.clone(), Arc::new(granted));
        Ok(json!({"grant": id, "token": token.to_string(), "slot": slot}))
    }

    fn granted(&self, request: &Value) -> Result<(String, Arc<Granted>), Failure> {
        let id = string(request, "grant")?;
        let granted = self.grants.lock().get(id).cloned();
        let granted = granted.ok_or_else(|| Failure::bad_argument(format!("no grant {id:?}")))?;
        Ok((id.to_string(), granted))
    }

    fn release(&self, request: &Value) -> Answer {
        let (id, granted) = self.granted(request)?;
        let outcome = match &*granted {
            Granted::Plain { client, grant } => {
                let mut slot = grant.lock();
                let outcome = {
                    let grant = slot.live()?;
                    match self.flavour {
                        Flavour::Blocking => client.release(grant),
                        Flavour::Async => block_on(client.release_async(grant)),
                    }
                };
                match &outcome {
                    // No server answered: it may be released again.
                    Err(e) if e.is_unreachable() => {}
                    Ok(ReleaseOutcome::NotHeld) | Err(Error::NotHeld | Error::Lost) => {
                        *slot = Slot::Lost;
                    }
                    _ => *slot = Slot::Released,
                }
                outcome
            }
            Granted::Held(slot) => {
                let mut slot = slot.lock();
                let held = slot.take()?;
                self.lost.forget(&id);
                let outcome = match self.flavour {
                    Flavour::Blocking => held.release(),
                    Flavour::Async => block_on(held.release_async()),
                };
                if matches!(outcome, Ok(ReleaseOutcome::NotHeld) | Err(Error::Lost)) {
                    *slot = Slot::Lost;
                }
                outcome
            }
        };
        match outcome? {
            ReleaseOutcome::Released => Ok(json!({})),
            ReleaseOutcome::NotHeld => Err(Failure::lost("the token no longer held the key")),
        }
    }

    fn keep(&self, request: &Value) -> Answer {
        let (_, granted) = self.granted(request)?;
        let lease = millis(request, "lease_ms")?
            .ok_or_else(|| Failure::bad_argument("lease_ms is required"))?;
        match &*granted {
            Granted::Plain { client, grant } => {
                let mut slot = grant.lock();
                let grant = slot.live()?;
                match self.flavour {
                    Flavour::Blocking => client.keep(grant, lease)?,
                    Flavour::Async => block_on(client.keep_async(grant, lease))?,
                }
            }
            Granted::Held(slot) => {
                let mut slot = slot.lock();
                let held = slot.live()?;
                match self.flavour {
                    Flavour::Blocking => held.keep(lease)?,
                    Flavour::Async => block_on(held.keep_async(lease))?,
                }
            }
        }
        Ok(json!({}))
    }

    fn query(&self, request: &Value) -> Answer {
        let client = self.client(request)?;
        let key = string(request, "key")?;
        let status = match self.flavour {
            Flavour::Blocking => client.query(key)?,
            Flavour::Async => block_on(client.query_async(key))?,
        };
        let ms_left = u64::try_from(status.time_left.as_millis()).unwrap_or(u64::MAX);
        Ok(json!({
            "token": status.token.unwrap_or(0).to_string(),
            "ms_left": ms_left,
            "waiting": status.waiting,
        }))
    }

    fn leader(&self, request: &Value) -> Answer {
        let client = self.client(request)?;
        let key = string(request, "key")?;
        let state = match self.flavour {
            Flavour::Blocking => client.leader(key)?,
            Flavour::Async => block_on(client.leader_async(key))?,
        };
        Ok(state_json(&state))
    }

    /// Answer `{"watch": W}`, then follow the watch on a thread.
    fn watch(&self, id: &Value, request: &Value) -> Result<(), Failure> {
        let client = self.client(request)?;
        let key = string(request, "key")?;
        let watch = client.watch(key)?;
        let watch_id = self.id("w");
        let events = Arc::new(WatchEvents::new(watch_id.clone(), self.out.clone()));
        self.watches.lock().insert(watch_id.clone(), events.clone());
        // The answer goes out before the thread that writes events starts.
        self.out.answer(id, Ok(json!({"watch": watch_id})));
        let flavour = self.flavour;
        let spawned = std::thread::Builder::new()
            .name("driver-watch".into())
            .spawn(move || follow(flavour, watch, &events));
        if let Err(e) = spawned {
            eprintln!("baton-driver: cannot start a watch thread: {e}");
        }
        Ok(())
    }

    fn unwatch(&self, request: &Value) -> Answer {
        let id = string(request, "watch")?;
        let events = self.watches.lock().get(id).cloned();
        let events = events.ok_or_else(|| Failure::bad_argument(format!("no watch {id:?}")))?;
        events.stop();
        Ok(json!({}))
    }

    fn close(&self, request: &Value) -> Answer {
        let client = self.client(request)?;
        client.close();
        Ok(json!({}))
    }
}

/// Run an async call to its end, or give it up (drop its future) once the
/// request's `cancel_after_ms` has passed.
fn cancellable<F: std::future::Future>(call: F, request: &Value) -> Result<F::Output, Failure> {
    let after = millis(request, "cancel_after_ms")?;
    let cancel = after.map(|after| std::time::Instant::now() + after);
    block_on_until(call, cancel).ok_or_else(|| Failure::given_up(after.unwrap_or_default()))
}

/// Read a watch until it is unwatched or ends, writing each state.
fn follow(flavour: Flavour, mut watch: Watch, events: &WatchEvents) {
    let ended = match flavour {
        // The blocking API waits a bounded time, so that an unwatch is seen.
        Flavour::Blocking => loop {
            if events.is_stopped() {
                break None;
            }
            match watch.next_timeout(Some(Duration::from_millis(100))) {
                Ok(Some(state)) => events.state(&state),
                Ok(None) => {}
                Err(e) => break Some(e),
            }
        },
        Flavour::Async => loop {
            let next = block_on(std::future::poll_fn(|cx| {
                if events.poll_stopped(cx).is_ready() {
                    return std::task::Poll::Ready(None);
                }
                watch.poll_next(cx).map(Some)
            }));
            match next {
                None | Some(None) => break None,
                Some(Some(Ok(state))) => events.state(&state),
                Some(Some(Err(e))) => break Some(e),
            }
        },
    };
    if let Some(e) = ended {
        eprintln!("baton-driver: a watch of {} ended: {e}", watch.key());
    }
}

/// The fields of `acquire` and `hold`.
fn acquire_fields(
    request: &Value,
) -> Result<(&str, Duration, Option<Duration>, AcquireOptions), Failure> {
    let key = string(request, "key")?;
    let lease = millis(request, "lease_ms")?
        .ok_or_else(|| Failure::bad_argument("lease_ms is required"))?;
    let wait = millis(request, "wait_ms")?;
    let mut options = AcquireOptions::new();
    if let Some(limit) = request.get("limit") {
        let limit = limit
            .as_u64()
            .and_then(|l| u32::try_from(l).ok())
            .ok_or_else(|| Failure::bad_argument("limit: a whole number"))?;
        options = options.limit(limit);
    }
    if let Some(value) = optional_str(request, "value")? {
        options = options.value(value);
    }
    Ok((key, lease, wait, options))
}

fn field<'a>(request: &'a Value, name: &str) -> Result<&'a Value, Failure> {
    request
        .get(name)
        .ok_or_else(|| Failure::bad_argument(format!("{name} is required")))
}

fn string<'a>(request: &'a Value, name: &str) -> Result<&'a str, Failure> {
    field(request, name)?
        .as_str()
        .ok_or_else(|| Failure::bad_argument(format!("{name}: a string")))
}

fn optional_str<'a>(request: &'a Value, name: &str) -> Result<Option<&'a str>, Failure> {
    match request.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_str()
            .map(Some)
            .ok_or_else(|| Failure::bad_argument(format!("{name}: a string"))),
    }
}

/// A whole number of milliseconds, if present.
fn millis(request: &Value, name: &str) -> Result<Option<Duration>, Failure> {
    match request.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_u64()
            .map(|ms| Some(Duration::from_millis(ms)))
            .ok_or_else(|| Failure::bad_argument(format!("{name}: whole milliseconds"))),
    }
}
