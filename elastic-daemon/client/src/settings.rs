//! The one place the pooled client is built, so every caller's
//! connections behave alike (connect bound, Nagle off, idle connections
//! closed before a replica's server does).

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// hyper's pooled client over plain TCP.
pub type Pooled<B = crate::FullBody> = Client<HttpConnector, B>;

/// How a pooled client connects and keeps connections.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// A replica that does not accept within this is as good as down; the
    /// OS's own bound is minutes.
    pub connect_timeout: Duration,
    /// Idle connections are closed after this, sooner than llama-server or
    /// a launcher drops them, so a request rarely meets a connection the
    /// other side is closing.
    pub idle_timeout: Duration,
    /// Idle connections kept per replica; 0 when each request should have
    /// its own (the launcher: its model server counts connections as
    /// clients).
    pub max_idle_per_host: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            connect_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            max_idle_per_host: usize::MAX,
        }
    }
}

impl Settings {
    pub fn with_connect_timeout(connect_timeout: Duration) -> Self {
        Settings { connect_timeout, ..Settings::default() }
    }
}

/// A pooled client with `settings`, for any request body type (the
/// launcher forwards its clients' bodies as they arrive).
pub fn pooled<B>(settings: Settings) -> Pooled<B>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
{
    builder(settings).build(tcp(settings))
}

fn tcp(settings: Settings) -> HttpConnector {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(settings.connect_timeout));
    connector.set_nodelay(true);
    connector
}

fn builder(settings: Settings) -> hyper_util::client::legacy::Builder {
    let mut b = Client::builder(TokioExecutor::new());
    b.pool_idle_timeout(settings.idle_timeout).pool_max_idle_per_host(settings.max_idle_per_host);
    b
}

/// hyper's pooled client over TLS (and plain TCP for `http://`).
pub type PooledTls<B = crate::FullBody> = Client<crate::tls::HttpsConnector, B>;

/// [`pooled`] over TLS to servers whose certificate `ca_pem` vouches for
/// (a site's CA, or an endpoint's own self-signed certificate): what a
/// client of onepoold's TLS front uses (`[endpoint.tls]`).
pub fn pooled_tls<B>(settings: Settings, ca_pem: &[u8]) -> Result<PooledTls<B>, crate::tls::TlsSetupError>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
{
    let connector = crate::tls::connector(tcp(settings), ca_pem)?;
    Ok(builder(settings).build(connector))
}
