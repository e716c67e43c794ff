//! TLS on the node's sockets, a layer over the mio sockets that the threads
//! poll.
//!
//! Owns: [`NodeTls`], the node's TLS configurations built from
//! `--tls-cert`, `--tls-key`, `--tls-client-ca` and `--tls-ca` (the server
//! side every accepted connection speaks, the client side peer links are
//! dialed with), swapped whole on a reload; and [`Stream`], a socket that is
//! either plain TCP or TLS, which the I/O loops and the replication thread
//! read and write like a socket. A TLS stream drives its rustls connection
//! by hand (`read_tls`, `process_new_packets`, `reader`, `writer`,
//! `write_tls`) and never blocks: what the socket will not take waits in
//! rustls, bounded by [`TLS_BUFFER_LIMIT`], until the next writable event
//! ([`Stream::tls_backlog`] says whether any does). A connection's end is
//! said with a `close_notify` ([`Stream::close_notify`]), queued by the I/O
//! loop after the last answer and sent like any record.
//!
//! Runs on: the I/O loop threads (accepted connections) and the replication
//! thread (peer links); [`NodeTls::reload`] runs on the signal thread and
//! only swaps an `Arc`, so a reload never stalls a connection.
//!
//! Never does: let the lock owner see TLS, trust anything a handshake has
//! not proved, panic on bytes from the network, or choose plain or TLS per
//! byte: a connection is one or the other from its accept (or dial) on.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use mio::net::TcpStream;
use parking_lot::RwLock;
use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::ServerName;
use rustls::pki_types::UnixTime;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ClientConnection, Connection, ServerConfig, ServerConnection};

use crate::server::config::Config;

/// Bytes of outgoing data (plaintext not yet encrypted plus records not yet
/// written) one TLS connection may hold inside rustls. The I/O loop's own
/// output limits apply on top; past this, writes wait for the socket.
pub const TLS_BUFFER_LIMIT: usize = 64 * 1024;
/// An accepted TLS connection must finish its handshake within this, or it
/// is closed.
pub const HANDSHAKE_MS: u64 = 5_000;

/// Where the node's TLS files are.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Paths {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
    ca: Option<PathBuf>,
    /// Peer links are dialed (a cluster node): build the dialing side.
    dials: bool,
}

/// One generation of the node's TLS configuration.
struct Configs {
    server: Arc<ServerConfig>,
    /// For dialing peers (cluster nodes only).
    dialer: Option<Arc<ClientConfig>>,
    /// Checks a peer's certificate (chain to `--tls-ca`, and its name) on
    /// links peers dial to this node (cluster nodes only).
    peer_check: Option<Arc<WebPkiServerVerifier>>,
}

/// The node's TLS settings: the files, and the configuration last built
/// from them.
pub struct NodeTls {
    paths: Paths,
    current: RwLock<Configs>,
}

impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeTls")
            .field("paths", &self.paths)
            .finish()
    }
}

impl NodeTls {
    /// The node's TLS, if `--tls-cert` is given; an error (naming the flag
    /// and file) if a file cannot be read or does not fit. A `--tls-ca`
    /// given to a node without `--peers` is not used, but it is read and
    /// checked here all the same (at start only: a reload builds from the
    /// files in use and skips it), so that a wrong path fails at start.
    pub fn load(config: &Config) -> Result<Option<NodeTls>, String> {
        let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) else {
            return Ok(None);
        };
        if config.peers.is_empty()
            && let Some(ca) = &config.tls_ca
        {
            crate::tls::roots_from_file(ca).map_err(|e| format!("--tls-ca: {e}"))?;
        }
        let paths = Paths {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: config.tls_client_ca.clone(),
            ca: config.tls_ca.clone(),
            dials: !config.peers.is_empty(),
        };
        let current = RwLock::new(build(&paths)?);
        Ok(Some(NodeTls { paths, current }))
    }

    /// Read the files again and use them for new connections from now on.
    /// On an error the configuration in use stays.
    pub fn reload(&self) -> Result<(), String> {
        let configs = build(&self.paths)?;
        *self.current.write() = configs;
        Ok(())
    }

    /// The server side of a newly accepted connection.
    pub fn accept(&self, sock: TcpStream) -> Result<Stream, String> {
        let config = self.current.read().server.clone();
        let mut conn = ServerConnection::new(config).map_err(|e| e.to_string())?;
        conn.set_buffer_limit(Some(TLS_BUFFER_LIMIT));
        Ok(Stream::tls(sock, conn))
    }

    /// Check the certificate a peer presented on a link it dialed to this
    /// node: it must chain to `--tls-ca` and name the host of `peer`, its
    /// `--peers` entry. Ok for a plain stream (no TLS, nothing to check).
    pub fn check_peer(&self, stream: &Stream, peer: &str) -> Result<(), String> {
        let Stream::Tls(tls) = stream else {
            return Ok(());
        };
        let Some(check) = self.current.read().peer_check.clone() else {
            return Err("no TLS configuration for peer links".into());
        };
        let Some((end_entity, intermediates)) = tls
            .conn
            .peer_certificates()
            .and_then(|chain| chain.split_first())
        else {
            return Err("the peer presented no certificate".into());
        };
        let name = crate::tls::server_name_of(peer)?;
        check
            .verify_server_cert(end_entity, intermediates, &name, &[], UnixTime::now())
            .map(|_| ())
            .map_err(|e| format!("the peer's certificate: {e}"))
    }

    /// The client side of a peer link dialed to `peer` (its `--peers`
    /// entry, whose host part the peer's certificate must name).
    pub fn dial(&self, sock: TcpStream, peer: &str) -> Result<Stream, String> {
        let Some(config) = self.current.read().dialer.clone() else {
            return Err("no TLS configuration for peer links".into());
        };
        let name: ServerName<'static> = crate::tls::server_name_of(peer)?;
        let mut conn = ClientConnection::new(config, name).map_err(|e| e.to_string())?;
        conn.set_buffer_limit(Some(TLS_BUFFER_LIMIT));
        Ok(Stream::tls(sock, conn))
    }
}

/// Build every configuration from the files; errors name the flag.
///
/// Client certificates: with `--tls-client-ca` every client must present
/// one signed by it. A cluster node also asks every connection for a
/// certificate (optional without `--tls-client-ca`), trusting the peer CAs
/// too (`--tls-ca`, else the system's when no client CA is given), so that
/// a peer's certificate can be checked when its link is adopted.
fn build(paths: &Paths) -> Result<Configs, String> {
    let provider = crate::tls::provider();
    let certs = crate::tls::load_certs(&paths.cert).map_err(|e| format!("--tls-cert: {e}"))?;
    let key = crate::tls::load_key(&paths.key).map_err(|e| format!("--tls-key: {e}"))?;
    let client_roots = match &paths.client_ca {
        Some(path) => {
            Some(crate::tls::roots_from_file(path).map_err(|e| format!("--tls-client-ca: {e}"))?)
        }
        None => None,
    };
    let peer_roots = if paths.dials {
        Some(crate::tls::roots(paths.ca.as_deref()).map_err(|e| format!("--tls-ca: {e}"))?)
    } else {
        None
    };
    // The CAs client certificates are checked against in the handshake.
    let mut asked = RootCertStore::empty();
    if let Some(roots) = &client_roots {
        asked.roots.extend(roots.roots.iter().cloned());
    }
    if let Some(roots) = &peer_roots
        && (paths.ca.is_some() || client_roots.is_none())
    {
        asked.roots.extend(roots.roots.iter().cloned());
    }
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = if asked.is_empty() {
        builder.with_no_client_auth()
    } else {
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(asked), provider.clone());
        let verifier = if client_roots.is_some() {
            verifier
        } else {
            verifier.allow_unauthenticated()
        };
        let verifier = verifier
            .build()
            .map_err(|e| format!("--tls-client-ca/--tls-ca: {e}"))?;
        builder.with_client_cert_verifier(verifier)
    };
    let server = builder
        .with_single_cert(certs.clone(), key.clone_key())
        .map_err(|e| format!("--tls-cert/--tls-key: {e}"))?;
    let (dialer, peer_check) = match peer_roots {
        Some(roots) => {
            let roots = Arc::new(roots);
            let peer_check =
                WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
                    .build()
                    .map_err(|e| format!("--tls-ca: {e}"))?;
            let builder = ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(roots);
            // A node presents its own certificate when it dials: the peer
            // checks its name as this node checks the peer's.
            let config = builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| format!("--tls-cert/--tls-key: {e}"))?;
            (Some(Arc::new(config)), Some(peer_check))
        }
        None => (None, None),
    };
    Ok(Configs {
        server: Arc::new(server),
        dialer,
        peer_check,
    })
}

/// A socket of the node: plain TCP, or TLS over TCP.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream>),
}

/// A TCP socket and the rustls connection that runs over it.
pub struct TlsStream {
    sock: TcpStream,
    conn: Connection,
}

impl Stream {
    /// A TLS stream over `sock` driven by `conn` (a rustls server or client
    /// connection, its handshake done or not).
    pub fn tls(sock: TcpStream, conn: impl Into<Connection>) -> Stream {
        Stream::Tls(Box::new(TlsStream {
            sock,
            conn: conn.into(),
        }))
    }

    /// The TCP socket underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(sock) => sock,
            Stream::Tls(tls) => &tls.sock,
        }
    }

    fn tcp_mut(&mut self) -> &mut TcpStream {
        match self {
            Stream::Plain(sock) => sock,
            Stream::Tls(tls) => &mut tls.sock,
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }

    /// A TLS stream whose handshake is not done yet.
    pub fn is_handshaking(&self) -> bool {
        match self {
            Stream::Plain(_) => false,
            Stream::Tls(tls) => tls.conn.is_handshaking(),
        }
    }

    /// Write what rustls holds for the socket, as far as the socket takes
    /// it (nothing for a plain socket).
    pub fn push_tls(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(_) => Ok(()),
            Stream::Tls(tls) => tls.push(),
        }
    }

    /// rustls holds records the socket has not taken yet (never for a
    /// plain socket): what was written is not all on its way.
    pub fn tls_backlog(&self) -> bool {
        match self {
            Stream::Plain(_) => false,
            Stream::Tls(tls) => tls.conn.wants_write(),
        }
    }

    /// The end of the connection, said under TLS: a `close_notify` alert
    /// queued after everything written, and what rustls holds written as
    /// far as the socket takes it now (it never waits: the rest goes with
    /// [`Stream::push_tls`], and [`Stream::tls_backlog`] says whether any
    /// is left). Nothing for a plain socket, or a TLS one still in its
    /// handshake. Call it once.
    pub fn close_notify(&mut self) -> io::Result<()> {
        match self {
            Stream::Tls(tls) if !tls.conn.is_handshaking() => {
                tls.conn.send_close_notify();
                tls.push()
            }
            _ => Ok(()),
        }
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.tcp().peer_addr()
    }

    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.tcp().set_nodelay(on)
    }

    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        self.tcp().take_error()
    }
}

impl TlsStream {
    fn push(&mut self) -> io::Result<()> {
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut self.sock) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// A TLS error: send rustls's alert if the socket takes it, and report.
    fn fail(&mut self, e: rustls::Error) -> io::Error {
        let _ = self.push();
        io::Error::new(io::ErrorKind::InvalidData, format!("tls: {e}"))
    }

    /// The plaintext already decrypted; Ok(0) at a clean or unclean end.
    fn take_plain(&mut self, buf: &mut [u8]) -> Option<io::Result<usize>> {
        match self.conn.reader().read(buf) {
            Ok(n) => Some(Ok(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Some(Ok(0)),
            Err(e) => Some(Err(e)),
        }
    }
}

impl Read for TlsStream {
    /// Plaintext, driving the handshake as records arrive. WouldBlock once
    /// neither rustls nor the socket has anything more.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if let Some(result) = self.take_plain(buf) {
                return result;
            }
            match self.conn.read_tls(&mut self.sock) {
                Ok(0) => {
                    // The peer closed: whatever was decrypted, then the end.
                    if let Err(e) = self.conn.process_new_packets() {
                        return Err(self.fail(e));
                    }
                    return self.take_plain(buf).unwrap_or(Ok(0));
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.push()?;
                    return Err(e);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            if let Err(e) = self.conn.process_new_packets() {
                return Err(self.fail(e));
            }
            // Handshake answers, alerts, tickets.
            self.push()?;
        }
    }
}

impl Write for TlsStream {
    /// Plaintext in, as much as rustls's buffer takes; WouldBlock when it
    /// takes nothing and the socket takes nothing either.
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        let mut n = self.conn.writer().write(data)?;
        self.push()?;
        if n == 0 {
            // The buffer was full; the push may have made room.
            n = self.conn.writer().write(data)?;
            self.push()?;
            if n == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.push()
    }
}

impl Read for Stream {
    #[inline]
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(sock) => sock.read(buf),
            Stream::Tls(tls) => tls.read(buf),
        }
    }
}

impl Write for Stream {
    #[inline]
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(sock) => sock.write(data),
            Stream::Tls(tls) => tls.write(data),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(sock) => sock.flush(),
            Stream::Tls(tls) => tls.flush(),
        }
    }
}

impl mio::event::Source for Stream {
    fn register(
        &mut self,
        registry: &mio::Registry,
        token: mio::Token,
        interests: mio::Interest,
    ) -> io::Result<()> {
        self.tcp_mut().register(registry, token, interests)
    }

    fn reregister(
        &mut self,
        registry: &mio::Registry,
        token: mio::Token,
        interests: mio::Interest,
    ) -> io::Result<()> {
        self.tcp_mut().reregister(registry, token, interests)
    }

    fn deregister(&mut self, registry: &mio::Registry) -> io::Result<()> {
        self.tcp_mut().deregister(registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A server `Stream` over a loopback socket, and the raw peer socket.
    fn pair() -> (Stream, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let peer =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (sock, _) = listener.accept().expect("accept");
        sock.set_nonblocking(true).expect("non-blocking");
        let rcgen::CertifiedKey { cert, signing_key } =
            rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).expect("cert");
        let key =
            rustls::pki_types::PrivateKeyDer::try_from(signing_key.serialize_der()).expect("key");
        let config = ServerConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .expect("config");
        let conn = ServerConnection::new(Arc::new(config)).expect("server connection");
        (Stream::tls(TcpStream::from_std(sock), conn), peer)
    }

    /// Read until something other than WouldBlock, or give up.
    fn read_some(stream: &mut Stream, buf: &mut [u8]) -> io::Result<usize> {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            match stream.read(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                other => return other,
            }
        }
    }

    #[test]
    fn nothing_to_read_is_would_block_and_a_handshake_is_pending() {
        let (mut stream, _peer) = pair();
        let mut buf = [0u8; 64];
        let e = stream.read(&mut buf).expect_err("nothing yet");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert!(stream.is_tls() && stream.is_handshaking());
    }

    #[test]
    fn plain_text_is_an_error_not_a_line() {
        let (mut stream, mut peer) = pair();
        peer.write_all(b"I\n").expect("send");
        let mut buf = [0u8; 64];
        let e = read_some(&mut stream, &mut buf).expect_err("refused");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }

    #[test]
    fn garbage_after_a_record_header_is_an_error() {
        let (mut stream, mut peer) = pair();
        let mut bytes = vec![22u8, 3, 3, 0, 64];
        bytes.extend((0..64u8).map(|i| i.wrapping_mul(37)));
        peer.write_all(&bytes).expect("send");
        let mut buf = [0u8; 64];
        let e = read_some(&mut stream, &mut buf).expect_err("refused");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }

    #[test]
    fn an_end_before_the_handshake_reads_as_the_end() {
        let (mut stream, peer) = pair();
        drop(peer);
        let mut buf = [0u8; 64];
        assert_eq!(read_some(&mut stream, &mut buf).expect("an end"), 0);
    }

    #[test]
    fn writes_stop_at_the_buffer_limit_while_the_handshake_is_pending() {
        let (mut stream, _peer) = pair();
        let chunk = [b'x'; 4096];
        let mut taken = 0;
        loop {
            match stream.write(&chunk) {
                Ok(n) => taken += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
            assert!(taken <= 2 * TLS_BUFFER_LIMIT, "unbounded: {taken}");
        }
        assert!(taken <= TLS_BUFFER_LIMIT, "{taken}");
    }
}
