//! The minimal mio echo: the second floor of the plain-client CPU run.
//!
//! Owns: one thread, one `mio::Poll`, a listener on 127.0.0.1 and every
//! connection it accepts; each readable connection is read until the
//! socket is empty and every byte is written back (what the socket does
//! not take waits for the next writable event). No lines are parsed, no
//! polling: the thread sleeps in `epoll_wait` whenever it has nothing to
//! do, so its CPU time is only the work of moving the bytes.
//!
//! Why: `batond --echo` is the node's own I/O loop answering every line
//! with itself (it parses lines, keeps batches, busy-polls while idle); a
//! plain echo shows what the kernel's TCP work alone costs per pair.
//!
//! Never does: grow a connection's unsent bytes past `MAX_PENDING` (a
//! client that does not read is closed), or listen anywhere but the
//! address it is given.

use std::io::{self, Read, Write};
use std::net::SocketAddr;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

const LISTENER: Token = Token(usize::MAX);
/// Bytes read per call.
const CHUNK: usize = 64 * 1024;
/// Unsent bytes a connection may have before it is closed.
const MAX_PENDING: usize = 4 << 20;

struct Conn {
    stream: TcpStream,
    unsent: Vec<u8>,
}

/// Listen on `addr`, call `ready` with the bound address, and serve until
/// the process ends.
pub fn serve(addr: SocketAddr, ready: impl FnOnce(SocketAddr)) -> io::Result<()> {
    let mut poll = Poll::new()?;
    let mut listener = TcpListener::bind(addr)?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    ready(listener.local_addr()?);
    let mut conns: slab::Slab<Conn> = slab::Slab::new();
    let mut events = Events::with_capacity(1024);
    let mut buf = vec![0u8; CHUNK];
    loop {
        match poll.poll(&mut events, None) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        for event in events.iter() {
            if event.token() == LISTENER {
                accept_all(&poll, &mut listener, &mut conns)?;
                continue;
            }
            let id = event.token().0;
            let Some(conn) = conns.get_mut(id) else {
                continue;
            };
            let open = if event.is_readable() || event.is_read_closed() {
                echo(conn, &mut buf)
            } else {
                flush(conn)
            };
            if !open {
                let mut conn = conns.remove(id);
                let _ = poll.registry().deregister(&mut conn.stream);
            }
        }
    }
}

fn accept_all(
    poll: &Poll,
    listener: &mut TcpListener,
    conns: &mut slab::Slab<Conn>,
) -> io::Result<()> {
    loop {
        match listener.accept() {
            Ok((mut stream, _)) => {
                let _ = stream.set_nodelay(true);
                let entry = conns.vacant_entry();
                poll.registry().register(
                    &mut stream,
                    Token(entry.key()),
                    Interest::READABLE | Interest::WRITABLE,
                )?;
                entry.insert(Conn {
                    stream,
                    unsent: Vec::new(),
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // Out of descriptors and the like: try again at the next event.
            Err(_) => return Ok(()),
        }
    }
}

/// Read until the socket is empty, writing each chunk back. False: close.
fn echo(conn: &mut Conn, buf: &mut [u8]) -> bool {
    loop {
        match conn.stream.read(buf) {
            Ok(0) => return false,
            Ok(n) => {
                if conn.unsent.is_empty() {
                    match write_some(&mut conn.stream, &buf[..n]) {
                        Some(done) => conn.unsent.extend_from_slice(&buf[done..n]),
                        None => return false,
                    }
                } else {
                    conn.unsent.extend_from_slice(&buf[..n]);
                    if !flush(conn) {
                        return false;
                    }
                }
                if conn.unsent.len() > MAX_PENDING {
                    return false;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// Write what is unsent. False: close.
fn flush(conn: &mut Conn) -> bool {
    if conn.unsent.is_empty() {
        return true;
    }
    match write_some(&mut conn.stream, &conn.unsent) {
        Some(done) => {
            conn.unsent.drain(..done);
            true
        }
        None => false,
    }
}

/// Write as much of `bytes` as the socket takes now: how much, or None on
/// an error.
fn write_some(stream: &mut TcpStream, bytes: &[u8]) -> Option<usize> {
    let mut done = 0;
    while done < bytes.len() {
        match stream.write(&bytes[done..]) {
            Ok(0) => return None,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(done)
}
