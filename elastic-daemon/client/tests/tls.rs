//! The client's HTTPS trusts exactly the certificates it is given.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A TLS server on 127.0.0.1 with a fresh self-signed certificate for that
/// address, answering every request "ok"; returns its port and the PEM.
async fn server() -> (u16, String) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names.push(rcgen::SanType::IpAddress([127, 0, 0, 1].into()));
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()))
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut s) = acceptor.accept(tcp).await else { return };
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok").await;
                let _ = s.shutdown().await;
            });
        }
    });
    (port, cert.pem())
}

#[tokio::test]
async fn https_reaches_a_server_whose_certificate_it_was_given_and_no_other() {
    let (port, pem) = server().await;
    let (_, other) = server().await;
    let settings = onepool_client::Settings::default();
    let trusting = onepool_client::pooled_tls(settings, pem.as_bytes()).unwrap();
    let caller = onepool_client::Caller::new(trusting, Duration::from_secs(5));
    let answer = caller.get(&format!("https://127.0.0.1:{port}/"), 1024).await.unwrap();
    assert_eq!((answer.status.as_u16(), answer.text()), (200, "ok".to_string()));
    // Another certificate, however well-formed, is not this server's.
    let stranger = onepool_client::pooled_tls(settings, other.as_bytes()).unwrap();
    let caller = onepool_client::Caller::new(stranger, Duration::from_secs(5));
    assert!(caller.get(&format!("https://127.0.0.1:{port}/"), 1024).await.is_err());
}

#[test]
fn a_pem_without_a_certificate_is_refused() {
    let settings = onepool_client::Settings::default();
    let e = onepool_client::pooled_tls::<onepool_client::FullBody>(settings, b"no pem here").unwrap_err();
    assert!(matches!(e, onepool_client::tls::TlsSetupError::NoCertificate), "{e}");
}
