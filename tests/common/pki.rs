//! Test certificates, made with rcgen at test time (none is checked in):
//! a CA per [`Pki`], leaf certificates it signs for given names (DNS names
//! or IP addresses), written as PEM files in a temporary directory that is
//! removed when the `Pki` drops; and [`TlsLine`], a blocking line client
//! over TLS for raw protocol checks.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

/// A test CA and the directory its files go to.
pub struct Pki {
    pub dir: PathBuf,
    /// The CA certificate (PEM).
    pub ca_file: PathBuf,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    /// A new CA called `name`, in a fresh directory.
    pub fn new(name: &str) -> Pki {
        static SERIAL: AtomicUsize = AtomicUsize::new(0);
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "baton-tls-{name}-{}-{}",
            std::process::id(),
            SERIAL.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the certificate directory");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params
            .distinguished_name
            .push(DnType::CommonName, format!("baton test CA {name}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        let ca = CertifiedIssuer::self_signed(params, key).expect("self-signed CA");
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, ca.pem()).expect("write the CA");
        Pki { dir, ca_file, ca }
    }

    /// A certificate for `names` signed by this CA (for servers and clients
    /// alike), written as `<stem>.pem` and `<stem>.key`.
    pub fn issue(&self, stem: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, stem);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.ca).expect("sign the leaf");
        let cert_file = self.dir.join(format!("{stem}.pem"));
        let key_file = self.dir.join(format!("{stem}.key"));
        std::fs::write(&cert_file, cert.pem()).expect("write the certificate");
        std::fs::write(&key_file, key.serialize_pem()).expect("write the key");
        (cert_file, key_file)
    }

    /// A rustls client configuration trusting this CA, with the client
    /// certificate `cert_key` if given.
    pub fn client_config(&self, cert_key: Option<(&Path, &Path)>) -> Arc<ClientConfig> {
        client_config(&self.ca_file, cert_key)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A rustls client configuration trusting the CAs in `ca_file`.
pub fn client_config(ca_file: &Path, cert_key: Option<(&Path, &Path)>) -> Arc<ClientConfig> {
    let roots = baton::tls::roots_from_file(ca_file).expect("read the CA");
    let builder = ClientConfig::builder_with_provider(baton::tls::provider())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots);
    let config = match cert_key {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                baton::tls::load_certs(cert).expect("client certificate"),
                baton::tls::load_key(key).expect("client key"),
            )
            .expect("client certificate and key"),
        None => builder.with_no_client_auth(),
    };
    Arc::new(config)
}

/// A blocking line client over TLS, for raw protocol checks. Every failure
/// is an `Err` with rustls's reason, never a panic, so tests can assert on
/// refusals.
pub struct TlsLine {
    stream: StreamOwned<ClientConnection, TcpStream>,
    buf: Vec<u8>,
}

impl TlsLine {
    /// Connect to `addr` and finish the handshake, checking the server's
    /// certificate for `name`.
    pub fn connect(
        addr: SocketAddr,
        name: &str,
        config: Arc<ClientConfig>,
    ) -> Result<TlsLine, String> {
        let sock = TcpStream::connect_timeout(&addr, super::DEADLINE).map_err(|e| e.to_string())?;
        sock.set_nodelay(true).map_err(|e| e.to_string())?;
        sock.set_read_timeout(Some(super::DEADLINE))
            .map_err(|e| e.to_string())?;
        let name = ServerName::try_from(name.to_string()).map_err(|e| e.to_string())?;
        let conn = ClientConnection::new(config, name).map_err(|e| e.to_string())?;
        let mut stream = StreamOwned::new(conn, sock);
        while stream.conn.is_handshaking() {
            stream
                .conn
                .complete_io(&mut stream.sock)
                .map_err(|e| e.to_string())?;
        }
        Ok(TlsLine {
            stream,
            buf: Vec::new(),
        })
    }

    /// Send `line` and read the answer line. Under TLS 1.3 a refused client
    /// certificate is only reported here, on the first read.
    pub fn ask(&mut self, line: &str) -> Result<String, String> {
        self.stream
            .write_all(format!("{line}\n").as_bytes())
            .map_err(|e| e.to_string())?;
        self.stream.flush().map_err(|e| e.to_string())?;
        self.recv(super::DEADLINE)
    }

    /// Send `bytes` as they are.
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.stream.write_all(bytes).map_err(|e| e.to_string())?;
        self.stream.flush().map_err(|e| e.to_string())
    }

    /// The next line within `wait`. `Err("closed")` at a clean end (the
    /// server's `close_notify`); an end without it is rustls's error.
    pub fn recv(&mut self, wait: Duration) -> Result<String, String> {
        let start = Instant::now();
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=pos).collect();
                line.pop();
                return Ok(String::from_utf8_lossy(&line).into_owned());
            }
            if start.elapsed() > wait {
                return Err("no answer in time".into());
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err("closed".into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(e.to_string()),
            }
        }
    }
}
