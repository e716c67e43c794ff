//! Reading a node's `I` answer in the cluster tests: its fields, whether it
//! serves or follows, and asking on a fresh connection without failing
//! (a node may be down, stopped or restarting while a test polls it).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use super::info_field;

/// Send `line` on a fresh connection and return the answer; None on any
/// failure (a node that is down, full or restarting), never a panic.
pub fn probe(addr: SocketAddr, line: &str) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    stream.set_nodelay(true).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    stream.write_all(format!("{line}\n").as_bytes()).ok()?;
    let mut answer = String::new();
    match BufReader::new(stream).read_line(&mut answer) {
        Ok(n) if n > 0 && answer.ends_with('\n') => Some(answer.trim_end().to_string()),
        _ => None,
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
