//! A metrics port's HTTP, seen from a test: one request on a fresh
//! connection, read until the server closes it (or the deadline), and the
//! response taken apart strictly: a status line, a Content-Type, and a
//! body exactly as long as its Content-Length says.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use super::DEADLINE;

/// Send `request` to `addr`; the status code, the Content-Type (empty if
/// none) and the body, checked against Content-Length. None if the server
/// closed without a response.
pub fn try_exchange(addr: SocketAddr, request: &[u8]) -> Option<(u16, String, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, DEADLINE).expect("connect to metrics");
    stream.set_read_timeout(Some(DEADLINE)).expect("timeout");
    stream.write_all(request).expect("send request");
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    if response.is_empty() {
        return None;
    }
    let text = String::from_utf8(response).expect("a UTF-8 response");
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head: {text:?}"));
    let mut lines = head.split("\r\n");
    let status = lines.next().expect("status line");
    let code: u16 = status
        .strip_prefix("HTTP/1.1 ")
        .and_then(|s| s.get(..3))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status:?}"));
    let mut content_type = String::new();
    let mut length = None;
    for line in lines {
        if let Some(v) = line.strip_prefix("Content-Type: ") {
            content_type = v.to_string();
        }
        if let Some(v) = line.strip_prefix("Content-Length: ") {
            length = v.parse::<usize>().ok();
        }
    }
    let length = length.unwrap_or_else(|| panic!("no Content-Length: {head}"));
    assert_eq!(body.len(), length, "the body is Content-Length long");
    Some((code, content_type, body.to_string()))
}
