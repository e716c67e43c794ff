//! TLS building blocks shared by the client library and the node: reading
//! PEM files, trust roots, the crypto provider (rustls with `ring`), and
//! the server name a `host:port` address stands for.
//!
//! Owns: nothing at run time; every function here is called when a
//! configuration is built (at start, on a reload, or when a client is
//! built), never per connection or per byte.
//!
//! Never does: I/O on a socket, or accept an empty file silently: a
//! certificate file without a certificate, a key file without a key or a
//! CA file without a CA is an error that names the file.

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// The crypto provider every TLS configuration of baton uses (`ring`).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in a PEM file (at least one).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let iter = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let certs = iter
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

/// The private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            format!("{} holds no PEM private key", path.display())
        }
        e => format!("cannot read {}: {e}", path.display()),
    })
}

/// The trust roots in a PEM file of CA certificates.
pub fn roots_from_file(path: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots
            .add(cert)
            .map_err(|e| format!("{}: not a usable CA certificate: {e}", path.display()))?;
    }
    Ok(roots)
}

/// The system's trust roots (as the platform's TLS stack finds them;
/// `SSL_CERT_FILE` and `SSL_CERT_DIR` are honoured).
pub fn system_roots() -> Result<RootCertStore, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .first()
            .map_or_else(|| "none found".to_string(), |e| e.to_string());
        return Err(format!("no system trust roots: {why}"));
    }
    Ok(roots)
}

/// The roots in `ca` if given, else the system's.
pub fn roots(ca: Option<&Path>) -> Result<RootCertStore, String> {
    match ca {
        Some(path) => roots_from_file(path),
        None => system_roots(),
    }
}

/// The name a certificate must carry for `addr` (`host:port`, `host`,
/// `[v6]:port`): a DNS name, or an IP address (checked against the IP SANs).
pub fn server_name_of(addr: &str) -> Result<ServerName<'static>, String> {
    let host = host_of(addr);
    ServerName::try_from(host.to_string())
        .map_err(|_| format!("{addr}: {host:?} is not a name a certificate can carry"))
}

/// The host part of `host:port`, `[v6]:port` or `host`.
pub fn host_of(addr: &str) -> &str {
    let addr = addr.trim();
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match addr.rsplit_once(':') {
        // A bare IPv6 address has more than one colon and no port.
        Some((host, _)) if !host.contains(':') => host,
        _ => addr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_part_of_an_address() {
        assert_eq!(host_of("node-a.example:7373"), "node-a.example");
        assert_eq!(host_of("127.0.0.1:7373"), "127.0.0.1");
        assert_eq!(host_of("[::1]:7373"), "::1");
        assert_eq!(host_of("::1"), "::1");
        assert_eq!(host_of("localhost"), "localhost");
    }

    #[test]
    fn names_and_addresses_become_server_names() {
        assert!(matches!(
            server_name_of("127.0.0.1:1"),
            Ok(ServerName::IpAddress(_))
        ));
        assert!(matches!(
            server_name_of("lock.example:1"),
            Ok(ServerName::DnsName(_))
        ));
        assert!(server_name_of("bad name!:1").is_err());
    }

    #[test]
    fn a_missing_or_empty_file_is_an_error_that_names_it() {
        let dir = std::env::temp_dir().join(format!("baton-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "nothing here\n").expect("write");
        let err = load_certs(&empty).expect_err("no certificate");
        assert!(err.contains("empty.pem"), "{err}");
        let err = load_key(&empty).expect_err("no key");
        assert!(err.contains("no PEM private key"), "{err}");
        let err = load_certs(&dir.join("missing.pem")).expect_err("missing");
        assert!(err.contains("missing.pem"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
