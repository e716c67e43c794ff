//! A minimal HTTP/1.1 client for the etcd rows of lockbench: keep-alive
//! `POST`s of a JSON body, answers read by `Content-Length` or chunked, and
//! a chunked answer read as a stream of newline-delimited messages (etcd's
//! gateway streams `observe` that way).
//!
//! Owns: writing a request, reading the status line and headers, the body,
//! and the stream's messages, each with a bound (headers, body, message),
//! so a bad or endless answer is an error, not unbounded memory.
//!
//! Never does: redirects, TLS, compression, `Expect`, pipelining more than
//! one request before its answer is read (the etcd rows send one at a time
//! on a connection, or keep a connection for one stream).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The most the status line and headers may take.
pub const MAX_HEAD: usize = 16 * 1024;
/// The most a body (or one streamed message) may take.
pub const MAX_BODY: usize = 4 * 1024 * 1024;

/// An answer: its status code and body.
#[derive(Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

/// How the body after a head is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Length(usize),
    Chunked,
    /// Neither header: the body runs to the end of the connection.
    ToClose,
}

/// A status line and headers.
#[derive(Debug, PartialEq, Eq)]
pub struct Head {
    pub status: u16,
    pub framing: Framing,
    /// `Connection: close` was sent: no further request on this one.
    pub close: bool,
}

/// Read a head from `head` (the bytes up to and including the blank line).
pub fn parse_head(head: &[u8]) -> Result<Head, String> {
    let text = std::str::from_utf8(head).map_err(|_| "HTTP head is not UTF-8".to_string())?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(format!("not an HTTP/1.x status line: {status_line:?}"));
    }
    let status = parts
        .next()
        .and_then(|s| (s.len() == 3).then_some(s))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line: {status_line:?}"))?;
    let mut framing = Framing::ToClose;
    let mut close = version == "HTTP/1.0";
    for line in lines {
        if line.is_empty() {
            continue;
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| format!("bad header line: {line:?}"))?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let n = value
                .parse::<usize>()
                .map_err(|_| format!("bad Content-Length: {value:?}"))?;
            if framing != Framing::Chunked {
                framing = Framing::Length(n);
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            if value.eq_ignore_ascii_case("chunked") {
                framing = Framing::Chunked;
            } else {
                return Err(format!("unsupported Transfer-Encoding: {value:?}"));
            }
        } else if name.eq_ignore_ascii_case("connection") {
            close = value.eq_ignore_ascii_case("close");
        }
    }
    if let Framing::Length(n) = framing
        && n > MAX_BODY
    {
        return Err(format!("body of {n} bytes is over {MAX_BODY}"));
    }
    Ok(Head {
        status,
        framing,
        close,
    })
}

/// A buffered reader of HTTP answers over any byte stream.
pub struct Reader<R> {
    inner: R,
    buf: Vec<u8>,
    /// Bytes of `buf` already consumed.
    pos: usize,
    /// The stream's bytes read but not yet given out as a message.
    pending: Vec<u8>,
    /// A chunked stream's last chunk was read.
    stream_done: bool,
}

impl<R: Read> Reader<R> {
    pub fn new(inner: R) -> Reader<R> {
        Reader {
            inner,
            buf: Vec::new(),
            pos: 0,
            pending: Vec::new(),
            stream_done: false,
        }
    }

    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// Read more bytes into the buffer; an error at end of stream.
    fn fill(&mut self) -> Result<(), String> {
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos > 64 * 1024 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match self.inner.read(&mut chunk) {
                Ok(0) => return Err("connection closed".into()),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("read: {e}")),
            }
        }
    }

    /// Up to and including the next `\r\n` (the `\r\n` left out), at most
    /// `bound` bytes.
    fn line(&mut self, bound: usize) -> Result<Vec<u8>, String> {
        loop {
            if let Some(at) = self.buf[self.pos..].windows(2).position(|w| w == b"\r\n") {
                let line = self.buf[self.pos..self.pos + at].to_vec();
                self.pos += at + 2;
                return Ok(line);
            }
            if self.buf.len() - self.pos > bound {
                return Err(format!("line over {bound} bytes"));
            }
            self.fill()?;
        }
    }

    fn exact(&mut self, n: usize) -> Result<Vec<u8>, String> {
        while self.buf.len() - self.pos < n {
            self.fill()?;
        }
        let out = self.buf[self.pos..self.pos + n].to_vec();
        self.pos += n;
        Ok(out)
    }

    /// The status line and headers.
    pub fn head(&mut self) -> Result<Head, String> {
        let mut head = Vec::new();
        loop {
            let line = self.line(MAX_HEAD)?;
            if line.is_empty() {
                if head.is_empty() {
                    continue; // a stray CRLF before the status line
                }
                break;
            }
            head.extend_from_slice(&line);
            head.extend_from_slice(b"\r\n");
            if head.len() > MAX_HEAD {
                return Err(format!("HTTP head over {MAX_HEAD} bytes"));
            }
        }
        self.stream_done = false;
        self.pending.clear();
        parse_head(&head)
    }

    /// One chunk's data (empty: the last chunk, trailers read).
    fn chunk(&mut self) -> Result<Vec<u8>, String> {
        let size_line = self.line(1024)?;
        let size_text = std::str::from_utf8(&size_line).map_err(|_| "bad chunk size")?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("bad chunk size {size_text:?}"))?;
        if size > MAX_BODY {
            return Err(format!("chunk of {size} bytes is over {MAX_BODY}"));
        }
        if size == 0 {
            // Trailers, up to the blank line.
            while !self.line(MAX_HEAD)?.is_empty() {}
            return Ok(Vec::new());
        }
        let data = self.exact(size)?;
        if self.exact(2)? != b"\r\n" {
            return Err("chunk not followed by CRLF".into());
        }
        Ok(data)
    }

    /// A whole answer: head and body.
    pub fn response(&mut self) -> Result<Response, String> {
        let head = self.head()?;
        let body = match head.framing {
            Framing::Length(n) => self.exact(n)?,
            Framing::Chunked => {
                let mut body = Vec::new();
                loop {
                    let data = self.chunk()?;
                    if data.is_empty() {
                        break;
                    }
                    body.extend_from_slice(&data);
                    if body.len() > MAX_BODY {
                        return Err(format!("body over {MAX_BODY} bytes"));
                    }
                }
                body
            }
            Framing::ToClose => return Err("answer with neither length nor chunks".into()),
        };
        Ok(Response {
            status: head.status,
            body,
        })
    }

    /// The next newline-delimited message of a chunked body whose head was
    /// read; `None` once the last chunk came.
    pub fn message(&mut self) -> Result<Option<Vec<u8>>, String> {
        loop {
            if let Some(at) = self.pending.iter().position(|&b| b == b'\n') {
                let mut message: Vec<u8> = self.pending.drain(..=at).collect();
                message.pop();
                if message.last() == Some(&b'\r') {
                    message.pop();
                }
                if message.is_empty() {
                    continue;
                }
                return Ok(Some(message));
            }
            if self.pending.len() > MAX_BODY {
                return Err(format!("streamed message over {MAX_BODY} bytes"));
            }
            if self.stream_done {
                if self.pending.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(std::mem::take(&mut self.pending)));
            }
            let data = self.chunk()?;
            if data.is_empty() {
                self.stream_done = true;
            }
            self.pending.extend_from_slice(&data);
        }
    }
}

/// The bytes of `POST path` with a JSON body.
pub fn post_request(host: &str, path: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// A keep-alive connection to one server.
pub struct Conn {
    pub addr: SocketAddr,
    host: String,
    reader: Reader<TcpStream>,
}

impl Conn {
    /// Connect, with `timeout` for the connect and for every read.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<Conn, String> {
        let stream = TcpStream::connect_timeout(&addr, timeout)
            .map_err(|e| format!("connect {addr}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        stream
            .set_write_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        Ok(Conn {
            addr,
            host: addr.to_string(),
            reader: Reader::new(stream),
        })
    }

    /// Send `POST path` without reading its answer.
    pub fn send(&mut self, path: &str, body: &[u8]) -> Result<(), String> {
        let request = post_request(&self.host, path, body);
        self.reader
            .get_mut()
            .write_all(&request)
            .map_err(|e| format!("write to {}: {e}", self.addr))
    }

    /// Read the next whole answer.
    pub fn response(&mut self) -> Result<Response, String> {
        self.reader.response()
    }

    /// `POST path` and its answer.
    pub fn post(&mut self, path: &str, body: &[u8]) -> Result<Response, String> {
        self.send(path, body)?;
        self.response()
    }

    /// Read the head of a streamed answer; then `message` gives its
    /// messages.
    pub fn stream_head(&mut self) -> Result<Head, String> {
        self.reader.head()
    }

    pub fn message(&mut self) -> Result<Option<Vec<u8>>, String> {
        self.reader.message()
    }
}
