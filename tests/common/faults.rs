//! Faults between a client and a server, for the client tests.
//!
//! - [`Proxy`]: a TCP proxy on a loopback port in front of a server that can
//!   cut every connection, stall either direction, or refuse new connections
//!   (its port closed, so connecting fails with "connection refused"). It
//!   records every line it forwards to the server.
//! - [`FakeServer`]: a line server that answers each request with whatever a
//!   closure says, for example `M <addr> <op> <key>` to test redirects;
//!   [`FakeServer::confirm_gated`] holds the answer to a late grant's
//!   confirming `K` until a [`Gate`] opens.
//!
//! Every thread here stops when its handle drops; nothing sleeps to
//! synchronise (the pumps poll their sockets with short timeouts).

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::DEADLINE;

/// How often the proxy's threads look at their flags.
const TICK: Duration = Duration::from_millis(5);

#[derive(Default)]
struct ProxyState {
    stop: AtomicBool,
    refuse: AtomicBool,
    /// Client to server held back.
    stall_up: AtomicBool,
    /// Server to client held back.
    stall_down: AtomicBool,
    accepted: AtomicUsize,
    links: Mutex<Vec<Link>>,
    /// Every byte forwarded client to server.
    forwarded: Mutex<Vec<u8>>,
}

struct Link {
    client: TcpStream,
    server: TcpStream,
    alive: Arc<AtomicBool>,
}

impl Link {
    fn cut(&self) {
        self.alive.store(false, Ordering::SeqCst);
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.server.shutdown(Shutdown::Both);
    }
}

/// A TCP proxy to one server that can cut, stall or refuse connections.
pub struct Proxy {
    pub addr: SocketAddr,
    target: SocketAddr,
    state: Arc<ProxyState>,
    acceptor: Option<JoinHandle<()>>,
}

impl Proxy {
    /// A proxy on a free loopback port, forwarding to `target`.
    pub fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let state = Arc::new(ProxyState::default());
        let acceptor = {
            let state = state.clone();
            thread::spawn(move || accept_loop(listener, addr, target, &state))
        };
        Proxy {
            addr,
            target,
            state,
            acceptor: Some(acceptor),
        }
    }

    /// The proxy's address as a `host:port` string.
    pub fn server(&self) -> String {
        self.addr.to_string()
    }

    /// Close every connection now (both sides).
    pub fn cut(&self) {
        for link in self.state.links.lock().unwrap().drain(..) {
            link.cut();
        }
    }

    /// Refuse (close the port) or accept new connections again.
    pub fn refuse(&self, refuse: bool) {
        self.state.refuse.store(refuse, Ordering::SeqCst);
    }

    /// Hold back (or let through again) everything client to server.
    pub fn stall_up(&self, stall: bool) {
        self.state.stall_up.store(stall, Ordering::SeqCst);
    }

    /// Hold back (or let through again) everything server to client.
    pub fn stall_down(&self, stall: bool) {
        self.state.stall_down.store(stall, Ordering::SeqCst);
    }

    /// Wait until `count` connections are open through the proxy (a client
    /// counts as connected before the proxy has accepted it).
    pub fn wait_live(&self, count: usize) {
        super::wait_for("connections through the proxy", DEADLINE, || {
            (self.live() == count).then_some(())
        });
    }

    /// Connections open through the proxy now.
    pub fn live(&self) -> usize {
        let mut links = self.state.links.lock().unwrap();
        links.retain(|l| l.alive.load(Ordering::SeqCst));
        links.len()
    }

    /// Connections accepted since the start.
    pub fn accepted(&self) -> usize {
        self.state.accepted.load(Ordering::SeqCst)
    }

    /// Every line forwarded to the server so far.
    pub fn lines(&self) -> Vec<String> {
        let bytes = self.state.forwarded.lock().unwrap();
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// How many forwarded lines start with `prefix`.
    pub fn count(&self, prefix: &str) -> usize {
        self.lines()
            .iter()
            .filter(|l| l.starts_with(prefix))
            .count()
    }

    pub fn target(&self) -> SocketAddr {
        self.target
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        self.cut();
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

/// Accept (or refuse, by closing the port) until stopped.
fn accept_loop(
    listener: TcpListener,
    addr: SocketAddr,
    target: SocketAddr,
    state: &Arc<ProxyState>,
) {
    let mut listener = Some(listener);
    while !state.stop.load(Ordering::SeqCst) {
        let refuse = state.refuse.load(Ordering::SeqCst);
        if refuse {
            listener = None;
        } else if listener.is_none() {
            listener = rebind(addr);
        }
        match &listener {
            Some(l) => accept_one(l, target, state),
            None => thread::sleep(TICK),
        }
    }
}

/// Bind the proxy's port again, retrying while the old socket lingers.
fn rebind(addr: SocketAddr) -> Option<TcpListener> {
    let start = Instant::now();
    while start.elapsed() < DEADLINE {
        if let Ok(listener) = TcpListener::bind(addr) {
            listener
                .set_nonblocking(true)
                .expect("nonblocking listener");
            return Some(listener);
        }
        thread::sleep(TICK);
    }
    panic!("the proxy could not bind {addr} again");
}

fn accept_one(listener: &TcpListener, target: SocketAddr, state: &Arc<ProxyState>) {
    listener
        .set_nonblocking(true)
        .expect("nonblocking listener");
    let client = match listener.accept() {
        Ok((client, _)) => client,
        Err(e) if e.kind() == ErrorKind::WouldBlock => {
            thread::sleep(TICK);
            return;
        }
        Err(_) => return,
    };
    state.accepted.fetch_add(1, Ordering::SeqCst);
    let Ok(server) = TcpStream::connect_timeout(&target, DEADLINE) else {
        return; // the server is gone: the client sees its connection close
    };
    client.set_nonblocking(false).expect("blocking socket");
    let alive = Arc::new(AtomicBool::new(true));
    let link = Link {
        client: client.try_clone().expect("clone"),
        server: server.try_clone().expect("clone"),
        alive: alive.clone(),
    };
    state.links.lock().unwrap().push(link);
    for (from, to, up) in [
        (
            client.try_clone().expect("clone"),
            server.try_clone().expect("clone"),
            true,
        ),
        (server, client, false),
    ] {
        let (state, alive) = (state.clone(), alive.clone());
        thread::spawn(move || pump(from, to, up, &state, &alive));
    }
}

/// Copy bytes one way until either side closes or the link is cut.
fn pump(mut from: TcpStream, mut to: TcpStream, up: bool, state: &ProxyState, alive: &AtomicBool) {
    from.set_read_timeout(Some(TICK * 4)).expect("read timeout");
    let stalled = if up {
        &state.stall_up
    } else {
        &state.stall_down
    };
    let mut buf = [0u8; 8192];
    while alive.load(Ordering::SeqCst) && !state.stop.load(Ordering::SeqCst) {
        if stalled.load(Ordering::SeqCst) {
            thread::sleep(TICK);
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                // A stall that began during the read holds these bytes too.
                while stalled.load(Ordering::SeqCst) && alive.load(Ordering::SeqCst) {
                    thread::sleep(TICK);
                }
                if up {
                    state.forwarded.lock().unwrap().extend_from_slice(&buf[..n]);
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    alive.store(false, Ordering::SeqCst);
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// A gate a fake server's answer waits at until the test opens it.
#[derive(Default)]
pub struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    pub fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }

    /// Until the gate opens, or [`DEADLINE`] passes (a test gone wrong).
    pub fn wait(&self) {
        let open = self.open.lock().unwrap();
        let (open, _) = self
            .opened
            .wait_timeout_while(open, DEADLINE, |open| !*open)
            .unwrap();
        drop(open);
    }
}

/// Answers a request line (given its index among all requests received), or
/// None to say nothing.
pub type Answerer = dyn Fn(&str, usize) -> Option<String> + Send + Sync;

/// A line server answering with a closure.
pub struct FakeServer {
    pub addr: SocketAddr,
    requests: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl FakeServer {
    pub fn start(
        answer: impl Fn(&str, usize) -> Option<String> + Send + Sync + 'static,
    ) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fake server");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("address");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let answer: Arc<Answerer> = Arc::new(answer);
        let acceptor = {
            let (requests, stop) = (requests.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let (requests, stop, answer) =
                                (requests.clone(), stop.clone(), answer.clone());
                            thread::spawn(move || serve_fake(stream, &requests, &stop, &*answer));
                        }
                        Err(_) => thread::sleep(TICK),
                    }
                }
            })
        };
        FakeServer {
            addr,
            requests,
            stop,
            acceptor: Some(acceptor),
        }
    }

    /// A fake standby: answers every request with `M <active> <op> <key>`
    /// after answering the first `dashes` with `M - <op> <key>`; `I` with
    /// role=standby.
    pub fn standby(active: String, dashes: usize) -> FakeServer {
        FakeServer::start(move |line, index| {
            let fields: Vec<&str> = line.split(' ').collect();
            if fields[0] == "I" {
                return Some(format!("I role=standby node=fake active={active}"));
            }
            let target = if index < dashes { "-" } else { active.as_str() };
            Some(format!(
                "M {target} {} {}",
                fields[0],
                fields.get(1).unwrap_or(&"-")
            ))
        })
    }

    /// A fake node whose grant of `job` (`A 5 job`) comes 200 ms after the
    /// acquire, more than a third of a 300 ms lease, so that the client
    /// confirms it with `K`; the `K`'s answer waits until `gate` opens (at
    /// most [`DEADLINE`]). Answers `R job 5` and `I` too (a closing
    /// client's settle).
    pub fn confirm_gated(gate: Arc<Gate>) -> FakeServer {
        FakeServer::start(move |line, _| {
            if line.starts_with("A job ") {
                // Not a synchronisation: the grant must come late.
                thread::sleep(Duration::from_millis(200));
                Some("A 5 job".into())
            } else if line.starts_with("K job 5 ") {
                gate.wait();
                Some("K job".into())
            } else if line == "R job 5" {
                Some("R job".into())
            } else if line == "I" {
                Some("I role=active node=fake".into())
            } else {
                None
            }
        })
    }

    pub fn server(&self) -> String {
        self.addr.to_string()
    }

    /// Every request line received so far.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn serve_fake(
    stream: TcpStream,
    requests: &Mutex<Vec<String>>,
    stop: &AtomicBool,
    answer: &Answerer,
) {
    stream
        .set_read_timeout(Some(TICK * 4))
        .expect("read timeout");
    let mut writer = stream.try_clone().expect("clone");
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    while !stop.load(Ordering::SeqCst) {
        match reader.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) if line.ends_with('\n') => {
                let request = line.trim_end().to_string();
                line.clear();
                let index = {
                    let mut all = requests.lock().unwrap();
                    all.push(request.clone());
                    all.len() - 1
                };
                if let Some(reply) = answer(&request, index)
                    && writer.write_all(format!("{reply}\n").as_bytes()).is_err()
                {
                    return;
                }
            }
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}
