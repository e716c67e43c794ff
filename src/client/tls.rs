//! TLS for the client's connections (feature `tls`).
//!
//! Owns: [`TlsConfig`], what a user gives [`ClientBuilder::tls`]
//! (trust roots, an optional client certificate for servers that ask for
//! one, an optional server name), and the two halves of one TLS
//! connection: [`TlsReader`] for the connection's manager thread and
//! [`TlsWriter`] for its writer thread. The handshake is done in full,
//! bounded by the connect timeout, before the halves exist
//! ([`handshake`]), on every (re)connection.
//!
//! The halves share the rustls `ClientConnection` behind one mutex that
//! neither holds across a socket call: the reader reads ciphertext off the
//! socket unlocked, then decrypts under the lock; the writer encrypts under
//! the lock, then writes unlocked. Only the writer ever writes to the
//! socket (anything rustls wants to send after the handshake goes out with
//! the next request), so TLS records leave in the order they were made.
//!
//! Never does: trust a certificate its roots do not vouch for, unwrap
//! anything read off the network, or hold the lock while blocked on I/O.
//!
//! [`ClientBuilder::tls`]: crate::client::ClientBuilder::tls

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rustls::ClientConnection;
use rustls::pki_types::ServerName;

use crate::client::Error;

/// How the client speaks TLS to the servers.
///
/// ```no_run
/// # fn main() -> Result<(), baton::client::Error> {
/// use baton::client::{Client, TlsConfig};
/// let tls = TlsConfig::new()
///     .ca_file("/etc/baton/ca.pem")
///     // Only for servers started with --tls-client-ca:
///     .client_cert("/etc/baton/client.pem", "/etc/baton/client.key");
/// let client = Client::builder(["lock-1.internal:7373"]).tls(tls).connect()?;
/// # Ok(())
/// # }
/// ```
///
/// Without [`TlsConfig::ca_file`], the system's trust roots are used. The
/// name checked against the server's certificate is the host part of each
/// server address (a DNS name or an IP address), unless
/// [`TlsConfig::server_name`] gives one for every server.
#[derive(Clone, Debug, Default)]
pub struct TlsConfig {
    ca: Option<PathBuf>,
    cert_key: Option<(PathBuf, PathBuf)>,
    server_name: Option<String>,
}

impl TlsConfig {
    /// TLS with the system's trust roots and no client certificate.
    pub fn new() -> TlsConfig {
        TlsConfig::default()
    }

    /// Trust only the CA certificates in this PEM file.
    pub fn ca_file(mut self, path: impl AsRef<Path>) -> TlsConfig {
        self.ca = Some(path.as_ref().to_path_buf());
        self
    }

    /// Present this certificate chain and key (PEM files) to servers that
    /// ask for one (`batond --tls-client-ca`).
    pub fn client_cert(mut self, cert: impl AsRef<Path>, key: impl AsRef<Path>) -> TlsConfig {
        self.cert_key = Some((cert.as_ref().to_path_buf(), key.as_ref().to_path_buf()));
        self
    }

    /// Check every server's certificate for this name instead of the host
    /// part of its address.
    pub fn server_name(mut self, name: impl Into<String>) -> TlsConfig {
        self.server_name = Some(name.into());
        self
    }

    /// Read the files and build the rustls configuration.
    pub(crate) fn build(&self) -> Result<Connector, Error> {
        let bad = |e: String| Error::InvalidArgument(format!("tls: {e}"));
        let roots = crate::tls::roots(self.ca.as_deref()).map_err(bad)?;
        let builder = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(e.to_string()))?
            .with_root_certificates(roots);
        let config = match &self.cert_key {
            Some((cert, key)) => {
                let certs = crate::tls::load_certs(cert).map_err(bad)?;
                let key = crate::tls::load_key(key).map_err(bad)?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| bad(format!("the client certificate or key: {e}")))?
            }
            None => builder.with_no_client_auth(),
        };
        let server_name = match &self.server_name {
            Some(name) => Some(
                ServerName::try_from(name.clone())
                    .map_err(|_| bad(format!("{name:?} is not a valid server name")))?,
            ),
            None => None,
        };
        Ok(Connector {
            config: Arc::new(config),
            server_name,
        })
    }
}

/// A built [`TlsConfig`]: what each connection's handshake starts from.
#[derive(Debug)]
pub struct Connector {
    config: Arc<rustls::ClientConfig>,
    server_name: Option<ServerName<'static>>,
}

/// Ciphertext read off the socket at once.
const RAW_CHUNK: usize = 16 * 1024;

/// Do the TLS handshake on a freshly connected `stream` for server `addr`,
/// within `timeout`. On success the socket's timeouts are cleared (the
/// connection's threads set their own).
pub fn handshake(
    connector: &Connector,
    addr: &str,
    stream: &TcpStream,
    timeout: Duration,
) -> Result<(TlsReader, TlsWriter), String> {
    let name = match &connector.server_name {
        Some(name) => name.clone(),
        None => crate::tls::server_name_of(addr)?,
    };
    let mut conn = ClientConnection::new(connector.config.clone(), name)
        .map_err(|e| format!("tls: cannot start: {e}"))?;
    let set = |t: Option<Duration>| {
        stream
            .set_read_timeout(t)
            .and_then(|()| stream.set_write_timeout(t))
    };
    set(Some(timeout)).map_err(|e| format!("tls: {e}"))?;
    let mut sock = stream;
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut sock) {
            return Err(match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    format!("tls handshake: no answer within {timeout:?}")
                }
                io::ErrorKind::UnexpectedEof => {
                    "tls handshake: the server closed the connection (does it speak TLS, \
                     and does it want a client certificate?)"
                        .to_string()
                }
                _ => format!("tls handshake failed: {e}"),
            });
        }
    }
    set(None).map_err(|e| format!("tls: {e}"))?;
    let read_sock = stream.try_clone().map_err(|e| format!("tls: {e}"))?;
    let write_sock = stream.try_clone().map_err(|e| format!("tls: {e}"))?;
    let conn = Arc::new(Mutex::new(conn));
    Ok((
        TlsReader {
            conn: conn.clone(),
            sock: read_sock,
            raw: vec![0; RAW_CHUNK].into_boxed_slice(),
            start: 0,
            end: 0,
            eof: false,
        },
        TlsWriter {
            conn,
            sock: write_sock,
            out: Vec::new(),
        },
    ))
}

/// The reading half: plaintext from the server.
pub struct TlsReader {
    conn: Arc<Mutex<ClientConnection>>,
    sock: TcpStream,
    /// Ciphertext read and not yet given to rustls: `raw[start..end]`.
    raw: Box<[u8]>,
    start: usize,
    end: usize,
    eof: bool,
}

impl Read for TlsReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            {
                let mut conn = self.conn.lock();
                match conn.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    // Closed without a close_notify: an end all the same.
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                    Err(e) => return Err(e),
                }
                if self.start < self.end {
                    let mut pending = &self.raw[self.start..self.end];
                    self.start += conn.read_tls(&mut pending)?;
                    if let Err(e) = conn.process_new_packets() {
                        return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                    }
                    continue;
                }
                if self.eof {
                    // Tell rustls the stream ended, then take what is left.
                    conn.read_tls(&mut &[][..])?;
                    if let Err(e) = conn.process_new_packets() {
                        return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                    }
                    return match conn.reader().read(buf) {
                        Ok(n) => Ok(n),
                        Err(e)
                            if matches!(
                                e.kind(),
                                io::ErrorKind::WouldBlock | io::ErrorKind::UnexpectedEof
                            ) =>
                        {
                            Ok(0)
                        }
                        Err(e) => Err(e),
                    };
                }
            }
            // Nothing buffered: wait for the socket, without the lock.
            // (A read timeout passes through to the caller as it is.)
            let n = self.sock.read(&mut self.raw)?;
            self.start = 0;
            self.end = n;
            if n == 0 {
                self.eof = true;
            }
        }
    }
}

/// The writing half: requests to the server.
pub struct TlsWriter {
    conn: Arc<Mutex<ClientConnection>>,
    sock: TcpStream,
    /// Ciphertext made under the lock, written after it.
    out: Vec<u8>,
}

impl TlsWriter {
    /// The socket under the connection.
    pub fn socket(&self) -> &TcpStream {
        &self.sock
    }

    /// Encrypt and send all of `data`.
    pub fn send_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.out.clear();
        {
            let mut conn = self.conn.lock();
            conn.writer().write_all(data)?;
            while conn.wants_write() {
                conn.write_tls(&mut self.out)?;
            }
        }
        let result = self.sock.write_all(&self.out);
        if self.out.capacity() > 2 * crate::client::limits::WRITE_BATCH {
            self.out = Vec::new();
        }
        result
    }
}
