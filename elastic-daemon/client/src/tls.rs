//! HTTPS for onepool's client stack (issue #36: a hop that crosses a
//! network is encrypted): trust is exactly the certificates the caller
//! names, a site's CA or an endpoint's own self-signed certificate, never
//! the system's store, so a test or the demo cannot be satisfied by some
//! other certificate.

use hyper_util::client::legacy::connect::HttpConnector;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

pub type HttpsConnector = hyper_rustls::HttpsConnector<HttpConnector>;

#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("no certificate in the PEM given to trust")]
    NoCertificate,
    #[error("the PEM given to trust: {0}")]
    Pem(String),
    #[error("a certificate to trust: {0}")]
    Certificate(#[from] rustls::Error),
}

/// `tcp` wrapped in TLS that trusts the certificates of `ca_pem` alone
/// (TLS 1.3 and 1.2, ALPN http/1.1); `http://` URIs stay plain.
pub fn connector(mut tcp: HttpConnector, ca_pem: &[u8]) -> Result<HttpsConnector, TlsSetupError> {
    let mut roots = rustls::RootCertStore::empty();
    let mut n = 0;
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.map_err(|e| TlsSetupError::Pem(e.to_string()))?)?;
        n += 1;
    }
    if n == 0 {
        return Err(TlsSetupError::NoCertificate);
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // hyper_rustls takes over the scheme check from the plain connector.
    tcp.enforce_http(false);
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .wrap_connector(tcp))
}
