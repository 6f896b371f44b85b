//! The control socket's connector: every request goes to one unix socket
//! whatever its URI says (the URI's authority is only the Host header), so
//! the control client is the same pooled client as every other call.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixStream;

/// Connects to one unix socket for any URI.
#[derive(Debug, Clone)]
pub struct UnixConnector {
    path: Arc<PathBuf>,
}

impl UnixConnector {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        UnixConnector { path: Arc::new(path.into()) }
    }
}

impl tower_service::Service<Uri> for UnixConnector {
    type Response = TokioIo<UnixStream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let path = self.path.clone();
        Box::pin(async move { UnixStream::connect(&*path).await.map(TokioIo::new) })
    }
}

/// A client whose every request goes to the socket at `path`. Idle
/// connections are not kept: a control client asks once and exits, and
/// onepoold's control server would otherwise hold a task per idle peer.
pub fn unix_client(path: impl Into<PathBuf>) -> Client<UnixConnector, crate::FullBody> {
    Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build(UnixConnector::new(path))
}
