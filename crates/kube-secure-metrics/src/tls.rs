//! TLS for the metrics listener: the certificate in a directory (`tls.crt`
//! and `tls.key`, as a `kubernetes.io/tls` Secret — cert-manager's, say — is
//! mounted), read again whenever the file changes so a renewed certificate
//! is served without a restart; or, without a directory, one made at start
//! and signed by itself (as kubebuilder's scaffold does). HTTP/2 is offered
//! only when asked for (`http2`): kubebuilder turns it off by
//! default since the HTTP/2 rapid-reset attacks (CVE-2023-44487).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use tokio_rustls::rustls::crypto::ring::{default_provider, sign::any_supported_type};
use tokio_rustls::rustls::pki_types::pem::{self, PemObject};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{self, InconsistentKeys, ServerConfig};
use tracing::{debug, info, warn};

/// Why the metrics listener has no certificate; every cause kept.
#[derive(Debug, thiserror::Error)]
#[allow(missing_docs)] // the fields: each variant's message names them
#[non_exhaustive]
pub enum TlsError {
    /// A file of the directory could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file is not PEM.
    #[error("{file} in {}: {source}", dir.display())]
    Pem {
        file: &'static str,
        dir: PathBuf,
        #[source]
        source: pem::Error,
    },
    /// A file holds no certificate, or no key.
    #[error("{file} in {} holds no {what}", dir.display())]
    Empty { file: &'static str, dir: PathBuf, what: &'static str },
    /// Without a directory: the certificate could not be made.
    #[error("cannot make a self-signed certificate: {0}")]
    SelfSigned(#[from] rcgen::Error),
    /// Without a directory: its key could not be used.
    #[error("the self-signed key: {0}")]
    SelfSignedKey(&'static str),
    /// The key is not the certificate's (one file renewed, not the other).
    #[error("{KEY_FILE} in {} is not the key of {CERT_FILE}'s certificate", dir.display())]
    KeyMismatch { dir: PathBuf },
    /// rustls refused the certificate or the key.
    #[error(transparent)]
    Rustls(#[from] rustls::Error),
}

type Result<T> = std::result::Result<T, TlsError>;

/// The certificate's file in the directory given (a `kubernetes.io/tls`
/// Secret's key).
pub const CERT_FILE: &str = "tls.crt";
/// The private key's file in the directory given.
pub const KEY_FILE: &str = "tls.key";

/// The server configuration: certificate from `cert_dir` or self-signed;
/// ALPN offers `h2` only if `http2`.
pub fn server_config(cert_dir: Option<&Path>, http2: bool) -> Result<Arc<ServerConfig>> {
    let certs = match cert_dir {
        Some(dir) => Certificates::from_dir(dir)?,
        None => Certificates::self_signed()?,
    };
    let mut config = ServerConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(certs));
    config.alpn_protocols = if http2 { vec![b"h2".to_vec(), b"http/1.1".to_vec()] } else { vec![b"http/1.1".to_vec()] };
    Ok(Arc::new(config))
}

/// The certificate served, and where it came from.
#[derive(Debug)]
struct Certificates {
    dir: Option<PathBuf>,
    current: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    key: Arc<CertifiedKey>,
    /// When the two files were last changed, as of reading them.
    modified: Modified,
    /// The last failed read of files changed since: when, and of which
    /// change (so that it is logged once, and retried at most every
    /// [`RELOAD_RETRY`], not at every handshake).
    failed: Option<(Instant, Modified)>,
}

/// The change times of the certificate's and the key's files.
type Modified = [Option<SystemTime>; 2];

/// How often files that changed but cannot be used are read again.
const RELOAD_RETRY: Duration = Duration::from_secs(5);

impl Certificates {
    fn from_dir(dir: &Path) -> Result<Self> {
        let loaded = load(dir)?;
        info!(dir = %dir.display(), "serving metrics with the certificate in the directory");
        Ok(Certificates { dir: Some(dir.to_owned()), current: Mutex::new(loaded) })
    }

    fn self_signed() -> Result<Self> {
        let host = std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "localhost".into());
        let names = vec![host, "localhost".into()];
        let made = rcgen::generate_simple_self_signed(names)?;
        let key = PrivateKeyDer::try_from(made.signing_key.serialize_der()).map_err(TlsError::SelfSignedKey)?;
        let key = certified(vec![made.cert.der().clone()], &key)?;
        info!("serving metrics with a self-signed certificate made at start (--metrics-cert-dir gives one)");
        Ok(Certificates { dir: None, current: Mutex::new(Loaded { key, modified: [None; 2], failed: None }) })
    }

    /// The certificate to serve now: read again if either file changed.
    /// Files that cannot be used (a Secret being rewritten, a certificate
    /// renewed without its key) keep the last pair.
    fn current(&self) -> Arc<CertifiedKey> {
        let mut current = self.current.lock();
        let Some(dir) = &self.dir else { return current.key.clone() };
        let now = modified(dir);
        let retry = match current.failed {
            Some((at, of)) => of != now || at.elapsed() >= RELOAD_RETRY,
            None => true,
        };
        if now != current.modified && retry {
            match load(dir) {
                Ok(loaded) => {
                    info!(dir = %dir.display(), "metrics certificate changed; serving the new one");
                    *current = loaded;
                }
                Err(e) => {
                    if current.failed.is_none_or(|(_, of)| of != now) {
                        warn!(error = %e, "cannot use the changed metrics certificate; serving the last one");
                    } else {
                        debug!(error = %e, "still cannot use the changed metrics certificate");
                    }
                    current.failed = Some((Instant::now(), now));
                }
            }
        }
        current.key.clone()
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn modified(dir: &Path) -> Modified {
    [CERT_FILE, KEY_FILE].map(|file| std::fs::metadata(dir.join(file)).and_then(|m| m.modified()).ok())
}

fn load(dir: &Path) -> Result<Loaded> {
    let read = |file: &str| {
        let path = dir.join(file);
        std::fs::read(&path).map_err(|source| TlsError::Read { path, source })
    };
    let modified = modified(dir);
    let (cert_pem, key_pem) = (read(CERT_FILE)?, read(KEY_FILE)?);
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<std::result::Result<_, _>>()
        .map_err(|source| TlsError::Pem { file: CERT_FILE, dir: dir.to_owned(), source })?;
    if certs.is_empty() {
        return Err(TlsError::Empty { file: CERT_FILE, dir: dir.to_owned(), what: "certificate" });
    }
    let key = match PrivateKeyDer::from_pem_slice(&key_pem) {
        Ok(key) => key,
        Err(pem::Error::NoItemsFound) => {
            return Err(TlsError::Empty { file: KEY_FILE, dir: dir.to_owned(), what: "private key" });
        }
        Err(source) => return Err(TlsError::Pem { file: KEY_FILE, dir: dir.to_owned(), source }),
    };
    let key = certified(certs, &key)?;
    // rustls serves a mismatched pair, and every handshake then fails.
    match key.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => {}
        Err(_) => return Err(TlsError::KeyMismatch { dir: dir.to_owned() }),
    }
    Ok(Loaded { key, modified, failed: None })
}

fn certified(certs: Vec<CertificateDer<'static>>, key: &PrivateKeyDer<'_>) -> Result<Arc<CertifiedKey>> {
    let signing = any_supported_type(key)?;
    Ok(Arc::new(CertifiedKey::new(certs, signing)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate for `name` and its key, as PEM.
    fn pair(name: &str) -> (String, String) {
        let made = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
        (made.cert.pem(), made.signing_key.serialize_pem())
    }

    /// Write `pem` into `dir`'s `file`, stamped `modified` (set, not waited
    /// for: file systems keep mtimes at coarse grains).
    fn write(dir: &Path, file: &str, pem: &str, modified: SystemTime) {
        std::fs::write(dir.join(file), pem).unwrap();
        std::fs::File::options().write(true).open(dir.join(file)).unwrap().set_modified(modified).unwrap();
    }

    /// Write a certificate for `name` and its key into `dir`, stamped `modified`.
    fn write_pair(dir: &Path, name: &str, modified: SystemTime) {
        let (cert, key) = pair(name);
        write(dir, CERT_FILE, &cert, modified);
        write(dir, KEY_FILE, &key, modified);
    }

    #[test]
    fn a_renewed_certificate_is_served_without_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let start = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        write_pair(dir.path(), "first.example", start);
        let certs = Certificates::from_dir(dir.path()).unwrap();
        let first = certs.current().cert[0].clone();
        assert_eq!(certs.current().cert[0], first, "unchanged file, same certificate");
        write_pair(dir.path(), "second.example", start + std::time::Duration::from_secs(60));
        assert_ne!(certs.current().cert[0], first, "the renewed one");
    }

    #[test]
    fn a_certificate_renewed_before_its_key_is_served_only_once_the_key_follows() {
        let dir = tempfile::tempdir().unwrap();
        let start = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        write_pair(dir.path(), "first.example", start);
        let certs = Certificates::from_dir(dir.path()).unwrap();
        let first = certs.current().cert[0].clone();
        let (cert, key) = pair("second.example");
        write(dir.path(), CERT_FILE, &cert, start + std::time::Duration::from_secs(60));
        assert_eq!(certs.current().cert[0], first, "the new certificate with the old key is not served");
        assert!(certs.current.lock().failed.is_some(), "the failure is remembered, not retried at each handshake");
        // Only the key's file changes now: its change time is watched too.
        write(dir.path(), KEY_FILE, &key, start + std::time::Duration::from_secs(61));
        assert_ne!(certs.current().cert[0], first, "the renewed pair");
        assert!(certs.current.lock().failed.is_none());
    }

    #[test]
    fn a_mismatched_pair_is_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, _) = pair("a.example");
        let (_, key) = pair("b.example");
        let start = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        write(dir.path(), CERT_FILE, &cert, start);
        write(dir.path(), KEY_FILE, &key, start);
        let err = server_config(Some(dir.path()), false).unwrap_err();
        assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");
    }

    #[test]
    fn a_directory_without_a_certificate_is_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let err = server_config(Some(dir.path()), false).unwrap_err();
        assert!(matches!(&err, TlsError::Read { path, .. } if path.ends_with(CERT_FILE)), "{err}");
        assert!(std::error::Error::source(&err).is_some(), "the io error is kept");
        std::fs::write(dir.path().join(CERT_FILE), "not a certificate").unwrap();
        std::fs::write(dir.path().join(KEY_FILE), "").unwrap();
        let err = server_config(Some(dir.path()), false).unwrap_err().to_string();
        assert!(err.contains("holds no certificate"), "{err}");
    }

    #[test]
    fn http2_is_offered_only_when_enabled() {
        assert_eq!(server_config(None, false).unwrap().alpn_protocols, [b"http/1.1".to_vec()]);
        assert_eq!(server_config(None, true).unwrap().alpn_protocols, [b"h2".to_vec(), b"http/1.1".to_vec()]);
    }
}
