//! TLS termination on a listener (`[endpoint.tls]` / `[listener.tls]`):
//! the certificate chain and key come from PEM files, are checked
//! completely when the configuration is read, and are read again when the
//! files change (a renewal by certbot or a secrets manager needs no
//! restart; a renewal that cannot be read keeps the certificate in use and
//! says why in the log).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use rustls::crypto::ring::sign::any_supported_type;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// What went wrong with a listener's certificate or key.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {path:?}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} {path:?} holds no PEM {expected}")]
    Empty { what: &'static str, path: PathBuf, expected: &'static str },
    #[error("{what} {path:?} is not valid PEM: {detail}")]
    Pem { what: &'static str, path: PathBuf, detail: String },
    #[error("key_file {path:?}: {detail}")]
    Key { path: PathBuf, detail: String },
    #[error("key_file {key:?} is not the key of the first certificate in cert_file {cert:?}")]
    Mismatch { cert: PathBuf, key: PathBuf },
    #[error("key_file {path:?} is readable or writable by others (mode {mode:o}): chmod 600 it and make onepoold's user its owner")]
    KeyMode { path: PathBuf, mode: u32 },
}

/// The certificate files of one listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The chain, leaf first (PEM).
    pub cert: PathBuf,
    /// The leaf's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

impl TlsFiles {
    /// Reads and checks both files: the key is private to its owner and
    /// belongs to the chain's first certificate.
    pub fn load(&self) -> Result<CertifiedKey, TlsError> {
        let certs = read_certs(&self.cert)?;
        let key = read_key(&self.key)?;
        let signer =
            any_supported_type(&key).map_err(|e| TlsError::Key { path: self.key.clone(), detail: e.to_string() })?;
        let ck = CertifiedKey::new(certs, signer);
        match ck.keys_match() {
            Ok(()) => Ok(ck),
            Err(rustls::Error::InconsistentKeys(_)) => {
                Err(TlsError::Mismatch { cert: self.cert.clone(), key: self.key.clone() })
            }
            // Keys whose public half rustls cannot extract: accepted as
            // before the check existed.
            Err(_) => Ok(ck),
        }
    }

    fn stamp(&self) -> Option<(SystemTime, SystemTime)> {
        let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        Some((m(&self.cert)?, m(&self.key)?))
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    const WHAT: &str = "cert_file";
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read { what: WHAT, path: path.into(), source })?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem { what: WHAT, path: path.into(), detail: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::Empty { what: WHAT, path: path.into(), expected: "CERTIFICATE" });
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    use std::os::unix::fs::PermissionsExt;
    const WHAT: &str = "key_file";
    let read = |source| TlsError::Read { what: WHAT, path: path.into(), source };
    let mode = std::fs::metadata(path).map_err(read)?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(TlsError::KeyMode { path: path.into(), mode });
    }
    let bytes = std::fs::read(path).map_err(read)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => {
            TlsError::Empty { what: WHAT, path: path.into(), expected: "PRIVATE KEY" }
        }
        e => TlsError::Pem { what: WHAT, path: path.into(), detail: e.to_string() },
    })
}

/// A listener's TLS: the rustls configuration the acceptor uses, and the
/// certificate behind it, replaced in place when its files change.
pub struct Tls {
    files: TlsFiles,
    current: Arc<Current>,
    config: Arc<ServerConfig>,
}

/// Two listeners' TLS are the same when they read the same files.
impl PartialEq for Tls {
    fn eq(&self, other: &Self) -> bool {
        self.files == other.files
    }
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls").field("files", &self.files).finish_non_exhaustive()
    }
}

struct Current {
    key: RwLock<Arc<CertifiedKey>>,
    stamp: RwLock<Option<(SystemTime, SystemTime)>>,
}

impl fmt::Debug for Current {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Current")
    }
}

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.key.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

impl Tls {
    /// Loads the files (every error says which file and what is wrong).
    /// Clients may speak HTTP/2 or HTTP/1.1 (ALPN).
    pub fn new(files: TlsFiles) -> Result<Self, TlsError> {
        let stamp = files.stamp();
        let key = Arc::new(files.load()?);
        let current = Arc::new(Current { key: RwLock::new(key), stamp: RwLock::new(stamp) });
        let mut config = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Key { path: files.key.clone(), detail: e.to_string() })?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Tls { files, current, config: Arc::new(config) })
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.clone())
    }

    /// Reads the files again if either changed since the last read: Ok(true)
    /// when the new certificate is in use, Ok(false) when nothing changed;
    /// on an error the certificate in use stays (blocking: file reads).
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let stamp = self.files.stamp();
        if stamp.is_some() && stamp == *self.current.stamp.read().unwrap_or_else(|e| e.into_inner()) {
            return Ok(false);
        }
        let loaded = self.files.load();
        // A failed read is not retried until the files change again.
        *self.current.stamp.write().unwrap_or_else(|e| e.into_inner()) = stamp;
        *self.current.key.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(loaded?);
        Ok(true)
    }
}

/// How often a listener's certificate files are looked at for a renewal.
pub const RELOAD_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// Re-reads the certificate files whenever they change, until `shutdown`.
pub async fn keep_fresh(tls: Arc<Tls>, every: std::time::Duration, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = crate::shutdown::stopped(&mut shutdown) => return,
        }
        let t = tls.clone();
        match tokio::task::spawn_blocking(move || t.reload_if_changed()).await {
            Ok(Ok(true)) => tracing::info!(cert = %tls.files.cert.display(), "TLS certificate reloaded"),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => tracing::error!("TLS certificate not reloaded; the one in use stays: {e}"),
            Err(e) => tracing::error!("TLS certificate reload failed: {e}"),
        }
    }
}
