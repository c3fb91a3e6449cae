//! https:// trackers: the HTTP announce of [`crate::tracker`] over TLS (rustls with the
//! `ring` provider). The exchange is one short request and one reply every interval, so it
//! runs as plain blocking I/O on the runtime's blocking pool (`detach`), as name resolution
//! already does, rather than as a TLS state machine inside the event loop.
//!
//! Certificates are checked against Mozilla's root CAs (the `webpki-roots` crate, built in:
//! the same on every machine) or, with `--tracker-ca FILE`, against the CAs of a PEM file
//! only (a private tracker's own CA). The server's name (or IP address) must be in its
//! certificate.
//!
//! Limits: connect, handshake, request and reply within the caller's deadline (15 s for an
//! announce); a reply of at most 1 MiB.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

/// The largest tracker reply read.
pub const MAX_REPLY: usize = 1 << 20;

/// The trust settings of our TLS client: whose certificates it accepts.
#[derive(Clone)]
pub struct TlsClient(Arc<ClientConfig>);

impl fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TlsClient")
    }
}

/// Two clients are equal when they are the same configuration (not merely alike).
impl PartialEq for TlsClient {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for TlsClient {}

fn config(roots: RootCertStore) -> anyhow::Result<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

impl TlsClient {
    /// Accepts certificates issued under Mozilla's root CAs (one configuration per
    /// process, made on first use).
    pub fn mozilla_roots() -> TlsClient {
        static DEFAULT: OnceLock<Arc<ClientConfig>> = OnceLock::new();
        let c = DEFAULT.get_or_init(|| {
            let roots = RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            };
            // The provider and versions are fixed: this cannot fail at run time.
            Arc::new(config(roots).expect("rustls's ring provider supports TLS 1.2 and 1.3"))
        });
        TlsClient(c.clone())
    }

    /// Accepts only certificates issued under the CAs of the PEM file `path`.
    pub fn with_ca_file(path: &Path) -> anyhow::Result<TlsClient> {
        let mut roots = RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(path)
            .with_context(|| format!("reading the CA file {}", path.display()))?;
        for cert in certs {
            let cert = cert.with_context(|| format!("a certificate in {}", path.display()))?;
            roots
                .add(cert)
                .with_context(|| format!("a CA certificate in {}", path.display()))?;
        }
        if roots.is_empty() {
            anyhow::bail!("{} holds no PEM certificate", path.display());
        }
        Ok(TlsClient(Arc::new(config(roots)?)))
    }
}

fn time_left(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "timed out"));
    }
    Ok(left)
}

/// Sends `request` to `host:port` over TLS and returns everything the server sent until
/// it closed (at most [`MAX_REPLY`] bytes), all within `limit`. Blocking.
pub fn exchange(
    tls: &TlsClient,
    host: &str,
    port: u16,
    request: &[u8],
    limit: Duration,
) -> io::Result<Vec<u8>> {
    let deadline = Instant::now() + limit;
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{host:?}: {e}")))?;
    let addr = (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::other(format!("{host} has no address")))?;
    let sock = TcpStream::connect_timeout(&addr, time_left(deadline)?)?;
    sock.set_write_timeout(Some(time_left(deadline)?))?;
    let conn = ClientConnection::new(tls.0.clone(), name).map_err(io::Error::other)?;
    let mut stream = StreamOwned::new(conn, sock);
    stream.sock.set_read_timeout(Some(time_left(deadline)?))?;
    stream.write_all(request)?;
    stream.flush()?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        stream.sock.set_read_timeout(Some(time_left(deadline)?))?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            // A server that closes without close_notify after its reply (common, and the
            // reply's own length is checked by the bencode parser).
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && !reply.is_empty() => break,
            Err(e) => return Err(e),
        }
        if reply.len() > MAX_REPLY {
            return Err(io::Error::other("tracker reply over 1 MiB"));
        }
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_without_certificates_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("ca.pem");
        std::fs::write(&p, "not a certificate\n").unwrap();
        let e = TlsClient::with_ca_file(&p).unwrap_err();
        assert!(format!("{e:#}").contains("no PEM certificate"), "{e:#}");
        assert!(TlsClient::with_ca_file(&d.path().join("missing.pem")).is_err());
        assert_eq!(TlsClient::mozilla_roots(), TlsClient::mozilla_roots());
    }

    #[test]
    fn nothing_listening_is_an_error_within_the_limit() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let t = Instant::now();
        let r = exchange(
            &TlsClient::mozilla_roots(),
            "127.0.0.1",
            port,
            b"GET / HTTP/1.1\r\n\r\n",
            Duration::from_secs(5),
        );
        assert!(r.is_err());
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
