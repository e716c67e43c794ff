//! Reading a node's `I` answer in the cluster tests: its fields, whether it
//! serves or follows, and asking a node without failing (it may be down,
//! stopped or restarting while a test polls it), on a fresh connection or on
//! one kept for fast polling.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use super::info_field;

/// Send `line` on a fresh connection and return the answer; None on any
/// failure (a node that is down, full or restarting), never a panic.
pub fn probe(addr: SocketAddr, line: &str) -> Option<String> {
    Probe::new(addr).ask(line)
}

/// A connection for polling a node that may be down, stopped or restarting,
/// kept from one ask to the next (a poll as fast as the node answers opens
/// no connection per ask): every failure is None (and the next ask
/// reconnects), never a panic. Connecting and each answer wait half a second
/// at most.
pub struct Probe {
    addr: SocketAddr,
    conn: Option<(TcpStream, BufReader<TcpStream>)>,
}

impl Probe {
    pub fn new(addr: SocketAddr) -> Probe {
        Probe { addr, conn: None }
    }

    fn connect(&self) -> Option<(TcpStream, BufReader<TcpStream>)> {
        let stream = TcpStream::connect_timeout(&self.addr, Duration::from_millis(500)).ok()?;
        stream.set_nodelay(true).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_millis(500)))
            .ok()?;
        let reader = BufReader::new(stream.try_clone().ok()?);
        Some((stream, reader))
    }

    /// Send `line`, return the answer; on the current connection if there is
    /// one that works, else on one new connection.
    pub fn ask(&mut self, line: &str) -> Option<String> {
        for _ in 0..2 {
            let reused = self.conn.is_some();
            if self.conn.is_none() {
                self.conn = self.connect();
            }
            let (stream, reader) = self.conn.as_mut()?;
            let answer = (|| {
                stream.write_all(format!("{line}\n").as_bytes()).ok()?;
                let mut answer = String::new();
                match reader.read_line(&mut answer) {
                    Ok(n) if n > 0 && answer.ends_with('\n') => Some(answer.trim_end().to_string()),
                    _ => None,
                }
            })();
            if answer.is_some() {
                return answer;
            }
            self.conn = None;
            if !reused {
                return None;
            }
        }
        None
    }
}

/// A field of an `I` answer ("" when missing).
pub fn field(info: &str, name: &str) -> String {
    info_field(info, name).unwrap_or_default()
}

/// A numeric field of an `I` answer, failing the test if it is not one.
pub fn num(info: &str, name: &str) -> u64 {
    field(info, name)
        .parse()
        .unwrap_or_else(|_| panic!("no number {name}= in {info:?}"))
}

/// This `I` answer says the node serves clients.
pub fn serving(info: &str) -> bool {
    field(info, "role") == "active" && field(info, "state") == "active"
}

/// This `I` answer says the node is a standby of `active` (its address).
pub fn standby_of(info: &str, active: &str) -> bool {
    field(info, "role") == "standby" && field(info, "active") == active
}
