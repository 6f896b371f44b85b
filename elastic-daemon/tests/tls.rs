//! TLS termination on an endpoint's listener, in-process against a real
//! local backend: HTTPS requests over HTTP/1.1 and HTTP/2 (ALPN) reach the
//! replica, a clear-text request or a client that never finishes its
//! handshake gets nothing, and a renewed certificate is served without a
//! restart.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use onepool_router::tls::{Tls, TlsFiles};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A self-signed certificate for `localhost` written as PEM into `dir`
/// (key mode 0600), returning the certificate's DER for clients to trust.
fn write_cert(dir: &Path, name: &str) -> (TlsFiles, CertificateDer<'static>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    let cert = params.self_signed(&key).unwrap();
    let files = TlsFiles { cert: dir.join(format!("{name}.crt")), key: dir.join(format!("{name}.key")) };
    std::fs::write(&files.cert, cert.pem()).unwrap();
    std::fs::write(&files.key, key.serialize_pem()).unwrap();
    std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o600)).unwrap();
    (files, cert.der().clone())
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("onepool-tls-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn connector(trusted: &CertificateDer<'static>, alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(trusted.clone()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// One HTTPS GET of `path`, over HTTP/2 when `h2`: status and body.
async fn https_get(
    addr: std::net::SocketAddr,
    trusted: &CertificateDer<'static>,
    h2: bool,
    path: &str,
) -> Result<(StatusCode, String), String> {
    let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let tls = connector(trusted, alpn)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(alpn[0]), "the listener agreed on the protocol asked for");
    let req = Request::get(format!("https://localhost{path}")).body(Full::new(Bytes::new())).unwrap();
    let resp = if h2 {
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await.unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.map_err(|e| e.to_string())?
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.unwrap();
        tokio::spawn(conn);
        send.send_request(req).await.map_err(|e| e.to_string())?
    };
    let status = resp.status();
    let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn with_tls(files: TlsFiles) -> onepool_elastic_daemon::config::EndpointConfig {
    let mut e = endpoint_config(8, 8, Duration::from_secs(5));
    e.proxy.conn.tls = Some(Arc::new(Tls::new(files).unwrap()));
    e.proxy.conn.header_read_timeout = Duration::from_millis(500);
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_over_http1_and_http2_reaches_the_replica_and_clear_text_does_not() {
    let dir = temp_dir("serve");
    let (files, der) = write_cert(&dir, "onepool-test");
    let a = backend(Mode::Normal).await;
    let h = Harness::new(with_tls(files), &[a.addr]).await;
    let addr = h.daemon.endpoint("chat").unwrap().listen.unwrap();
    for h2 in [false, true] {
        let (s, body) = https_get(addr, &der, h2, "/ok").await.unwrap();
        assert_eq!((s, body), (StatusCode::OK, a.addr.to_string()), "h2 {h2}");
    }
    assert_eq!(a.stats.served(), 2);

    // A clear-text request is not answered in HTTP: the listener speaks TLS.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain.write_all(b"GET /ok HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut buf)).await.unwrap();
    assert!(!buf.starts_with(b"HTTP/"), "clear text got an HTTP answer: {:?}", String::from_utf8_lossy(&buf));

    // A client that never sends its ClientHello is closed after the head's
    // time, and the connection no longer counts.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut one = [0u8; 1];
    let closed = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut one)).await;
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "the silent client was closed: {closed:?}");
    // A certificate nobody trusts is refused by the client, not served.
    let (_, stranger) = write_cert(&dir, "stranger");
    let err = https_get(addr, &stranger, false, "/ok").await.unwrap_err();
    assert!(err.contains("handshake"), "{err}");
    assert_eq!(a.stats.served(), 2, "nothing reached the replica without a handshake");
    h.daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_is_served_without_a_restart_and_a_broken_one_is_not() {
    let dir = temp_dir("renew");
    let (files, first) = write_cert(&dir, "first");
    let tls = Arc::new(Tls::new(files.clone()).unwrap());
    let a = backend(Mode::Normal).await;
    let mut e = endpoint_config(8, 8, Duration::from_secs(5));
    e.proxy.conn.tls = Some(tls.clone());
    let h = Harness::new(e, &[a.addr]).await;
    let addr = h.daemon.endpoint("chat").unwrap().listen.unwrap();
    assert_eq!(https_get(addr, &first, false, "/ok").await.unwrap().0, StatusCode::OK);
    assert!(!tls.reload_if_changed().unwrap(), "unchanged files are not read again");

    // The renewal lands in place (as certbot's deploy hook copies it).
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (renewed, second) = write_cert(&dir, "second");
    std::fs::rename(&renewed.cert, &files.cert).unwrap();
    std::fs::rename(&renewed.key, &files.key).unwrap();
    assert!(tls.reload_if_changed().unwrap());
    assert_eq!(https_get(addr, &second, false, "/ok").await.unwrap().0, StatusCode::OK);
    assert!(https_get(addr, &first, false, "/ok").await.is_err(), "the old certificate is no longer served");

    // A renewal that cannot be used keeps the one in use.
    tokio::time::sleep(Duration::from_millis(20)).await;
    std::fs::write(&files.cert, "not a certificate\n").unwrap();
    let err = tls.reload_if_changed().unwrap_err().to_string();
    assert!(err.contains("cert_file") && err.contains("CERTIFICATE"), "{err}");
    assert_eq!(https_get(addr, &second, false, "/ok").await.unwrap().0, StatusCode::OK);
    h.daemon.shutdown().await;
}
