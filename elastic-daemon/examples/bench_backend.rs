//! A small, fast HTTP/1.1 backend for `bench/router.sh`: answers every
//! request with a fixed 13-byte body, keep-alive, on one thread. With
//! `--tls` it serves TLS as `onepool replica --tls` does (a certificate
//! made at start, [`onepool_launcher::hop_tls`]) and prints the
//! certificate's fingerprint on standard output, for onepoold to pin: the
//! router benchmark's TLS hop.
//!
//!     cargo run --release -p onepool-elastic-daemon --example bench_backend -- 127.0.0.1:18080 [--tls]

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

const BODY: &[u8] = b"hello, world\n";

fn main() {
    let addr: SocketAddr = match std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:18080".into()).parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("usage: bench_backend [IP:PORT]: {e}");
            std::process::exit(2);
        }
    };
    let tls = std::env::args().nth(2).is_some_and(|a| a == "--tls").then(|| {
        let identity = onepool_launcher::hop_tls::Identity::generate().unwrap_or_else(|e| panic!("{e}"));
        println!("{}", identity.fingerprint);
        tokio_rustls::TlsAcceptor::from(identity.config)
    });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    rt.block_on(async move {
        let listener = TcpListener::bind(addr).await.unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        eprintln!("bench_backend: listening on {addr}{}", if tls.is_some() { " (TLS)" } else { "" });
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let _ = stream.set_nodelay(true);
            let tls = tls.clone();
            tokio::spawn(async move {
                match tls {
                    None => serve(stream).await,
                    Some(acceptor) => {
                        if let Ok(stream) = acceptor.accept(stream).await {
                            serve(stream).await
                        }
                    }
                }
            });
        }
    });
}

async fn serve<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(stream: S) {
    let svc = service_fn(|_req: Request<Incoming>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(BODY))))
    });
    let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
}
